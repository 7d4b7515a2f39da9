//! The soundness holes a hostile user found, closed, on the H200: typed views
//! work only inside their own capture or consumer closure, on its stream;
//! teardown waits for every piece of work the crate's safe APIs let onto a
//! view; a destroyed stream's recycled `CUstream` does not fool the fence.
//! Each test uses safe code only, except the test kernels' launches.
#![cfg(feature = "cuda")]

use crate::support::capture_view;
use crate::support::gpu::{allocate, device};
use replay_arena::backend::Streams;
use replay_arena::cuda;
use replay_arena::cuda::cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};
use replay_arena::cuda::cudarc::nvrtc::compile_ptx;
use replay_arena::cuda::ViewExt;
use replay_arena::{BackendError, DType, Domain, Misuse, Policy, Replayable, Request, RunnerId};

const N: usize = 1 << 18; // 1 MiB of f32
const REQ: Request = Request::new(Domain::Device, DType::F32, N as u64);
/// About 100 ms of spinning on an H200 (1.98 GHz).
const SLOW: i64 = 200_000_000;

const SOURCE: &str = r#"
extern "C" __global__ void spin_fill(float* x, unsigned int n, float v, long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        x[i] = v;
    }
}
"#;

struct Dev {
    backend: cuda::Device,
    spin_fill: CudaFunction,
}

/// Device 0 with the test kernel, and `K` new streams.
fn dev<const K: usize>() -> (Dev, [cuda::Stream; K]) {
    let backend = device();
    let ptx = compile_ptx(SOURCE).unwrap_or_else(|e| panic!("nvrtc: {e:?}"));
    let module = backend.context().load_module(ptx).unwrap();
    let streams = std::array::from_fn(|_| backend.new_stream().unwrap());
    let d = Dev {
        spin_fill: module.load_function("spin_fill").unwrap(),
        backend,
    };
    (d, streams)
}

impl Dev {
    /// After `cycles` of spinning, `x[i] = v` for `i < n` (n = 0: spin only).
    fn spin_fill(
        &self,
        s: &cuda::Stream,
        x: u64,
        n: u32,
        v: f32,
        cycles: i64,
    ) -> Result<(), String> {
        let mut b = s.cudarc().launch_builder(&self.spin_fill);
        b.arg(&x).arg(&n).arg(&v).arg(&cycles);
        let cfg = LaunchConfig {
            grid_dim: (64, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: `x` holds `n` f32s (a view of this closure, or n = 0).
        unsafe { b.launch(cfg) }
            .map(drop)
            .map_err(|e| format!("{e:?}"))
    }

    /// A plan of `runners` runners of one 1 MiB view each, in `g`
    /// generations; runner r's graph fills its view with `fill(r)` after
    /// `cycles(r)` of spinning.
    fn sealed(
        &self,
        runners: u32,
        g: usize,
        stream: &cuda::Stream,
        fill: impl Fn(u32) -> f32,
        cycles: impl Fn(u32) -> i64,
    ) -> Replayable<cuda::Device> {
        let rs = (0..runners).map(|r| (RunnerId(r), [REQ]));
        let mut capturing = allocate(&self.backend, rs, Policy::Generations(g));
        for r in 0..runners {
            capture_view(&mut capturing, RunnerId(r), REQ, stream, |s, view| {
                self.spin_fill(s, view.device_address(), N as u32, fill(r), cycles(r))
            });
        }
        capturing.seal().unwrap()
    }

    /// A plan of one runner filling its view with `v`, replayed once on
    /// `stream`; and the view's address.
    fn replayed(&self, v: f32, stream: &cuda::Stream) -> (Replayable<cuda::Device>, u64) {
        let mut replayable = self.sealed(1, 1, stream, |_| v, |_| 0);
        replayable.replay(RunnerId(0), stream).unwrap();
        let addr = replayable.views(RunnerId(0)).unwrap()[0].device_address();
        (replayable, addr)
    }

    /// `cycles` of spinning on `s`, writing nothing (a launch error as the
    /// crate's).
    fn spin(&self, s: &cuda::Stream, cycles: i64) -> Result<(), BackendError> {
        self.spin_fill(s, 0, 0, 0.0, cycles).map_err(refused)
    }

    /// The first and last element at a raw address, after a full wait.
    fn ends(&self, addr: u64) -> (f32, f32) {
        let host = self.read(addr);
        (host[0], host[N - 1])
    }

    /// The `N` f32s at a raw address, after a full wait.
    fn read(&self, addr: u64) -> Vec<f32> {
        self.backend.synchronize().unwrap();
        let io = self.backend.new_stream().unwrap();
        let mut host = vec![0f32; N];
        // A read of the program's own: the plan is idle (synchronized).
        let view = unsafe { io.cudarc().upgrade_device_ptr::<f32>(addr, N) };
        io.cudarc().memcpy_dtoh(&view, &mut host).unwrap();
        io.synchronize().unwrap();
        view.leak();
        host
    }
}

/// A test kernel's launch error, as the crate's.
fn refused(reason: String) -> BackendError {
    BackendError::Refused {
        call: "test",
        reason,
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_typed_view_works_only_on_its_closures_stream_while_the_closure_runs() {
    let (d, [pool, other]) = dev();
    let (mut replayable, addr) = d.replayed(1.0, &pool);
    // A view read from the plan is for addresses: no typed view of it.
    let view = replayable.views(RunnerId(0)).unwrap()[0];
    let err = view.as_cuda::<f32>(&other).unwrap_err();
    assert!(
        matches!(
            err,
            BackendError::InvalidView {
                reason: Misuse::NoScope {
                    runner: RunnerId(0),
                    ..
                }
            }
        ),
        "{err}"
    );
    // Inside the consumer: another stream is refused at conversion, and a
    // typed view handed to cudarc on another stream gets a null address
    // (cudarc's copy fails) and the consumer reports it. (The consumer's
    // views are read-only: writing them does not compile, so the copy
    // reads.)
    let mut back = vec![0f32; N];
    let result = replayable.consume(RunnerId(0), &pool, |s, views| {
        let refused = views[0].as_cuda::<f32>(&other).unwrap_err();
        assert!(
            matches!(
                refused,
                BackendError::InvalidView {
                    reason: Misuse::OtherStream {
                        runner: RunnerId(0),
                        capture: false,
                        ..
                    }
                }
            ),
            "{refused}"
        );
        let typed = views[0].as_cuda::<f32>(s)?;
        let copy = other.cudarc().memcpy_dtoh(&typed, &mut back);
        assert!(
            copy.is_err(),
            "cudarc was given the arena on another stream"
        );
        Ok::<(), BackendError>(())
    });
    assert!(
        matches!(
            result,
            Err(replay_arena::ConsumeError::ViewOutOfScope {
                runner: RunnerId(0),
                ..
            })
        ),
        "{result:?}"
    );
    assert_eq!(d.ends(addr), (1.0, 1.0), "nothing was written");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_typed_view_kept_past_its_capture_reaches_no_memory() {
    let (d, [stream]) = dev();
    let mut capturing = allocate(&d.backend, [(RunnerId(0), [REQ])], Policy::Generations(1));
    let cap = capturing.capture(RunnerId(0)).unwrap();
    let view = cap.take(REQ).unwrap();
    let mut kept = None;
    cap.stream_capture(&stream, |s| {
        kept = Some(view.as_cuda::<f32>(s)?);
        d.spin_fill(s, view.device_address(), N as u32, 3.0, 0)
            .map_err(refused)
    })
    .unwrap();
    let mut kept = kept.unwrap();
    // After the closure: cudarc gets address 0 and fails; the arena is not
    // touched outside the graph.
    let ones = vec![1f32; N];
    assert!(stream.cudarc().memcpy_htod(&ones, &mut kept).is_err());
    cap.finish().unwrap();
    let mut replayable = capturing.seal().unwrap();
    replayable.replay(RunnerId(0), &stream).unwrap();
    let addr = replayable.views(RunnerId(0)).unwrap()[0].device_address();
    assert_eq!(d.ends(addr), (3.0, 3.0));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn dropping_a_plan_waits_for_consumer_work_on_its_views_before_the_next_plan_gets_the_bytes() {
    let (d, [pool, side]) = dev();
    let (mut first, old) = d.replayed(1.0, &pool);
    // The issue's recipe, outside any consumer: refused before anything is
    // enqueued.
    let outside = first.views(RunnerId(0)).unwrap()[0].as_cuda::<f32>(&side);
    assert!(outside.is_err());
    // The same copy inside a consumer, behind ~100 ms of spinning: fenced.
    let sevens = vec![7f32; N];
    first
        .consume_mut(RunnerId(0), &side, |s, views| {
            d.spin(s, SLOW)?;
            let mut typed = views[0].as_cuda::<f32>(s)?;
            s.cudarc()
                .memcpy_htod(&sevens, &mut typed)
                .map_err(|e| BackendError::Refused {
                    call: "memcpy",
                    reason: format!("{e:?}"),
                })
        })
        .unwrap();
    drop(first); // must wait for the copy before freeing the arena
    let (_second, new) = d.replayed(2.0, &pool);
    println!("first plan's arena at {old:#x}, second's at {new:#x}");
    assert_eq!(d.ends(new), (2.0, 2.0), "the next plan's arena was written");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_forgotten_step_graph_is_waited_for_before_the_next_plan_gets_the_bytes() {
    let (d, [pool, launch]) = dev();
    // Each launch spins ~100 ms, then fills the arena with 1.0.
    let mut first = d.sealed(1, 1, &pool, |_| 1.0, |_| SLOW);
    let old = first.views(RunnerId(0)).unwrap()[0].device_address();
    {
        let mut step = first.step();
        step.replay(RunnerId(0), &pool).unwrap();
        let mut graph = step.build().unwrap();
        for _ in 0..3 {
            graph.launch(&launch).unwrap();
        }
        // Safe, and skips the step graph's destructor.
        std::mem::forget(graph);
    }
    drop(first); // must wait for the three queued launches
    let (_second, new) = d.replayed(2.0, &pool);
    println!("first plan's arena at {old:#x}, second's at {new:#x}");
    let changed = d.read(new).iter().filter(|&&x| x != 2.0).count();
    assert_eq!(
        changed, 0,
        "bytes of the next plan's arena were overwritten"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_recycled_stream_handle_does_not_skip_the_wait() {
    let (d, [setup]) = dev();
    // Two runners sharing one generation: runner 0 writes 5.0 after ~100 ms,
    // runner 1 writes 9.0 at once.
    let mut replayable = d.sealed(
        2,
        1,
        &setup,
        |r| if r == 0 { 5.0 } else { 9.0 },
        |r| {
            if r == 0 {
                SLOW
            } else {
                0
            }
        },
    );
    let addr = replayable.views(RunnerId(0)).unwrap()[0].device_address();
    let third = d.backend.new_stream().unwrap();
    let first = d.backend.new_stream().unwrap();
    // Runner 1 on another stream waits for runner 0: from then on runner 0
    // records its event at once, and the fence keeps only its stream's id.
    replayable.replay(RunnerId(0), &first).unwrap();
    replayable.replay(RunnerId(1), &third).unwrap();
    replayable.replay(RunnerId(0), &first).unwrap();
    let raw = first.cu_stream() as usize;
    drop(first); // the program destroys the stream; runner 0 still spins
    let second = d.backend.new_stream().unwrap();
    println!(
        "destroyed stream {raw:#x}, new stream {:#x} (recycled: {})",
        second.cu_stream() as usize,
        second.cu_stream() as usize == raw
    );
    let waits = replayable.fence_stats().waits;
    replayable.replay(RunnerId(1), &second).unwrap();
    assert_eq!(
        replayable.fence_stats().waits,
        waits + 1,
        "runner 1 must wait"
    );
    assert_eq!(d.ends(addr), (9.0, 9.0), "runner 0 overwrote runner 1");
}

/// One stream has one identity, however many handles the program makes of
/// it: the claims that keep a capture off a stream a consumer (or the
/// fence) works on compare identities, so with two identities a capture
/// could begin on the real stream under an open consumer, and record the
/// consumer's work and the fence's event record into its graph.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_stream_wrapped_again_has_the_same_identity_and_the_same_claims() {
    let (d, [stream, other]) = dev();
    let again = d.backend.wrap_stream(stream.cudarc().clone()).unwrap();
    let twice = d.backend.wrap_stream(again.cudarc().clone()).unwrap();
    let id = d.backend.stream_id(&stream);
    assert_eq!(d.backend.stream_id(&again), id, "a wrap of a new stream");
    assert_eq!(d.backend.stream_id(&twice), id, "a wrap of a wrap");
    assert_ne!(d.backend.stream_id(&other), id, "another stream");
    // The per-thread default stream: one identity per thread.
    let ctx = d.backend.context().clone();
    let mine = d.backend.wrap_stream(ctx.per_thread_stream()).unwrap();
    let mine_again = d.backend.wrap_stream(ctx.per_thread_stream()).unwrap();
    assert_eq!(d.backend.stream_id(&mine), d.backend.stream_id(&mine_again));
    let theirs = std::thread::scope(|t| {
        t.spawn(|| {
            let s = d.backend.wrap_stream(ctx.per_thread_stream()).unwrap();
            d.backend.stream_id(&s)
        })
        .join()
        .unwrap()
    });
    assert_ne!(
        theirs,
        d.backend.stream_id(&mine),
        "another thread's stream"
    );

    // A consumer on one handle: a capture on the other handle of the same
    // stream is refused, as on the consumer's own handle.
    let (mut consumed, _) = d.replayed(1.0, &other);
    let mut capturing = allocate(&d.backend, [(RunnerId(0), [REQ])], Policy::Generations(1));
    consumed
        .consume(RunnerId(0), &again, |_, _| -> Result<(), String> {
            let cap = capturing.capture(RunnerId(0)).map_err(|e| e.to_string())?;
            let view = cap.take(REQ).map_err(|e| e.to_string())?;
            let refused = cap.stream_capture(&stream, |s| {
                d.spin_fill(s, view.device_address(), N as u32, 2.0, 0)
            });
            assert!(
                matches!(
                    refused,
                    Err(replay_arena::StreamCaptureError::Capture(
                        replay_arena::CaptureError::StreamInUse {
                            runner: RunnerId(0)
                        }
                    ))
                ),
                "{refused:?}"
            );
            Ok(())
        })
        .unwrap();
    assert!(!d.backend.is_capturing(&stream).unwrap());
}

#[cfg(feature = "nccl")]
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_reduce_scatter_works_on_a_view_only_inside_its_consumer_and_teardown_waits_for_it() {
    use crate::support::gpu::reduce_scatter_plan;
    use replay_arena::nccl::{Communicator, UniqueId};
    use replay_arena::GroupId;
    let (d, [pool, side]) = dev();
    let comm = Communicator::new(&d.backend, GroupId(0), &UniqueId::new().unwrap(), 0, 1).unwrap();
    let (mut capturing, sym) = reduce_scatter_plan(&d.backend, &comm, REQ);
    let cap = capturing.capture(RunnerId(0)).unwrap();
    let (send, recv) = (cap.take(sym).unwrap(), cap.take(REQ).unwrap());
    cap.stream_capture(&pool, |s| {
        d.spin_fill(s, send.device_address(), N as u32, 4.0, 0)
            .and_then(|()| d.spin_fill(s, recv.device_address(), N as u32, 0.0, 0))
            .map_err(refused)
    })
    .unwrap();
    cap.finish().unwrap();
    let mut replayable = capturing.seal().unwrap();
    replayable.replay(RunnerId(0), &pool).unwrap();
    let views = replayable.views(RunnerId(0)).unwrap();
    let recv_addr = views[1].device_address();
    let outside = comm.reduce_scatter(&views[0], &views[1], &side);
    assert!(
        matches!(
            outside,
            Err(BackendError::InvalidView {
                reason: Misuse::NoScope { .. }
            })
        ),
        "{outside:?}"
    );
    replayable
        .consume_mut(RunnerId(0), &side, |s, views| {
            d.spin(s, SLOW)?;
            comm.reduce_scatter(&views[0], &views[1], s)
        })
        .unwrap();
    drop(replayable);
    // The plan waited for the collective before freeing: a new plan's arena
    // of the same size is not written by it.
    let (_next, new) = d.replayed(2.0, &pool);
    println!("recv view was at {recv_addr:#x}; the next plan's arena is at {new:#x}");
    assert_eq!(d.ends(new), (2.0, 2.0));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_typed_view_gets_no_address_in_a_capture_the_program_starts_inside_a_consumer() {
    use replay_arena::cuda::cudarc::driver::sys;
    let (d, [pool]) = dev();
    let (mut replayable, addr) = d.replayed(1.0, &pool);
    let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    let mut stolen = None;
    // `consume_mut`: a consumer that may write (a read-only consumer's typed
    // view has no `DevicePtrMut`, so its memset would not compile).
    let result = replayable.consume_mut(RunnerId(0), &pool, |s, views| {
        let mut typed = views[0].as_cuda::<f32>(s)?;
        s.cudarc().begin_capture(mode).unwrap();
        // cudarc's own (safe) capture: the typed view hands cudarc address
        // 0 here, so the capture records a memset of address 0, which the
        // driver refuses to instantiate: the program gets no graph.
        let _ = s.cudarc().memset_zeros(&mut typed);
        let ended = s.cudarc().end_capture(sys::CUgraphInstantiate_flags(0));
        stolen = ended.ok().flatten();
        Ok::<(), BackendError>(())
    });
    assert!(
        matches!(
            result,
            Err(replay_arena::ConsumeError::ViewOutOfScope { .. })
        ),
        "{result:?}"
    );
    assert!(
        stolen.is_none(),
        "the program got a graph of the consumer's view"
    );
    drop(replayable);
    let _ = addr;
}

/// A replay on a stream the program captures by its own means, in each
/// capture mode: refused with `StreamCapturing`, nothing launched outside
/// the program's capture, and the fence as before (the next replay on the
/// stream, once the program ended its capture, runs and is fenced). Also
/// prints what the driver answers the three calls of a fenced replay on a
/// capturing stream (the refusal's evidence in docs/safety.md).
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_replay_on_a_stream_the_program_captures_is_refused_in_every_mode() {
    use replay_arena::cuda::cudarc::driver::sys;
    use replay_arena::ReplayError;
    let (d, [pool]) = dev();
    let mut replayable = d.sealed(2, 1, &pool, |r| r as f32 + 1.0, |_| 0);
    replayable.replay(RunnerId(0), &pool).unwrap();
    let addr = replayable.views(RunnerId(0)).unwrap()[0].device_address();
    let exec = replayable.graph(RunnerId(1)).unwrap().cu_graph_exec();
    let outside = d.backend.create_event().unwrap();
    d.backend.record_event(&pool, &outside).unwrap();
    d.backend.synchronize().unwrap();
    let modes = [
        sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
        sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
    ];
    for mode in modes {
        // The driver's own answers, one fresh capture per call.
        for call in ["cuStreamWaitEvent", "cuGraphLaunch", "cuEventRecord"] {
            let s = d.backend.new_stream().unwrap();
            s.cudarc().begin_capture(mode).unwrap();
            let raw = s.cu_stream();
            // SAFETY: live handles of this context; the capture is ended below.
            let code = unsafe {
                match call {
                    "cuStreamWaitEvent" => sys::cuStreamWaitEvent(raw, outside.cu_event(), 0),
                    "cuGraphLaunch" => sys::cuGraphLaunch(exec, raw),
                    _ => sys::cuEventRecord(outside.cu_event(), raw),
                }
            };
            let mut graph = std::ptr::null_mut();
            // SAFETY: the capture begun above, on this thread.
            let end = unsafe { sys::cuStreamEndCapture(raw, &mut graph) };
            if !graph.is_null() {
                // SAFETY: the graph the capture returned, destroyed once.
                unsafe { sys::cuGraphDestroy(graph) };
            }
            println!("{mode:?}: {call} on a capturing stream -> {code:?} (end capture {end:?})");
        }
        // The crate's replay: refused, typed.
        let s = d.backend.new_stream().unwrap();
        s.cudarc().begin_capture(mode).unwrap();
        let refused = replayable.replay(RunnerId(1), &s);
        let mut graph = std::ptr::null_mut();
        // SAFETY: the capture begun above, on this thread.
        unsafe { sys::cuStreamEndCapture(s.cu_stream(), &mut graph) };
        if !graph.is_null() {
            // SAFETY: the graph the capture returned, destroyed once.
            unsafe { sys::cuGraphDestroy(graph) };
        }
        assert!(
            matches!(refused, Err(ReplayError::StreamCapturing(_))),
            "{mode:?}: {refused:?}"
        );
        // Runner 1 never ran (runner 0's values are still there), and the
        // fence goes on: runner 1 on the same stream, then runner 0 again.
        d.backend.synchronize().unwrap();
        assert_eq!(d.ends(addr), (1.0, 1.0), "{mode:?}");
        replayable.replay(RunnerId(1), &s).unwrap();
        assert_eq!(d.ends(addr), (2.0, 2.0), "{mode:?}");
        replayable.replay(RunnerId(0), &pool).unwrap();
        assert_eq!(d.ends(addr), (1.0, 1.0), "{mode:?}");
    }
}
