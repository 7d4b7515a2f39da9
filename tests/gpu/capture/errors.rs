//! Runtime checks on real captures on the H200: exact consumption, request
//! mismatch and capacity errors; graphs with memory nodes rejected by
//! `finish`; a failed capture followed by a re-plan and a good capture; the
//! default stream refused for capture; symmetric domains refused without
//! NCCL windows; and no device memory left behind by any of it.
#![cfg(feature = "cuda")]

use crate::support;

use replay_arena::cuda;
use replay_arena::cuda::cudarc::driver::{sys, CudaSlice};
use replay_arena::{
    BackendError, CaptureError, CaptureFailure, Capturing, DType, Discovering, Domain, Error,
    GroupId, Key, PlanConfig, Policy, Request, RunnerId, SealError, StreamCaptureError, View,
};
use support::gpu::{allocate, gpu, host_outputs, mismatches, Gpu, Spec, State};

const R0: RunnerId = RunnerId(0);
const R1: RunnerId = RunnerId(1);
const R2: RunnerId = RunnerId(2);
const R3: RunnerId = RunnerId(3);
const F32: Key = Key {
    domain: Domain::Device,
    dtype: DType::F32,
};

fn f32s(n: u64) -> Request {
    Request::new(Domain::Device, DType::F32, n)
}

fn i32s(n: u64) -> Request {
    Request::new(Domain::Device, DType::I32, n)
}

/// A stream, and a zeroed step counter (to keep) with its address.
fn stream_and_step(g: &Gpu) -> (cuda::Stream, CudaSlice<u32>, u64) {
    let s = g.backend.new_stream().unwrap();
    let counter: CudaSlice<u32> = g.zeros(1);
    let step = g.ptr(&counter);
    (s, counter, step)
}

/// Runner `r` of `runners` records `runners[r]`; planned in two
/// generations, allocated.
fn allocated(g: &Gpu, runners: &[&[Request]]) -> Capturing<cuda::Device> {
    let runners = runners
        .iter()
        .enumerate()
        .map(|(r, requests)| (RunnerId(r as u32), requests.iter().copied()));
    allocate(&g.backend, runners, Policy::Generations(2))
}

/// Captures one wgrad kernel into `view` (a real graph).
fn capture_wgrad(
    g: &Gpu,
    capturing: &mut Capturing<replay_arena::cuda::Device>,
    runner: RunnerId,
    stream: &cuda::Stream,
    step: u64,
    n: u64,
) -> Result<(), Error> {
    let cap = capturing.capture(runner)?;
    let view = cap.take(f32s(n))?;
    cap.stream_capture(stream, |s| {
        g.wgrad(s, view.device_address(), n as u32, step, runner.0, 0, 0)
    })?;
    Ok(cap.finish()?)
}

/// Allocates (and, with `free`, frees) stream-ordered memory inside the
/// capture, as a careless caller would.
fn capture_with_memory_nodes(
    g: &Gpu,
    capturing: &mut Capturing<replay_arena::cuda::Device>,
    runner: RunnerId,
    stream: &cuda::Stream,
    step: u64,
    (n, free): (u64, bool),
) -> Result<(), CaptureError> {
    let cap = capturing.capture(runner).unwrap();
    let view = cap.take(f32s(n)).unwrap();
    cap.stream_capture(stream, |s| {
        g.backend
            .context()
            .bind_to_thread()
            .map_err(|e| format!("{e:?}"))?;
        let mut tmp: sys::CUdeviceptr = 0;
        let code = unsafe { sys::cuMemAllocAsync(&mut tmp, 1 << 20, s.cu_stream()) };
        if code != sys::CUresult::CUDA_SUCCESS {
            return Err(format!("cuMemAllocAsync: {code:?}"));
        }
        g.wgrad(s, tmp, 1024, step, 7, 0, 0)?;
        g.wgrad(s, view.device_address(), 1024, step, 7, 0, 0)?;
        if free {
            let code = unsafe { sys::cuMemFreeAsync(tmp, s.cu_stream()) };
            if code != sys::CUresult::CUDA_SUCCESS {
                return Err(format!("cuMemFreeAsync: {code:?}"));
            }
        }
        Ok(())
    })
    .expect("stream-ordered allocation is legal during capture");
    cap.finish()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn consumption_mismatch_and_capacity_errors_on_real_captures() {
    let g = gpu();
    let (s, _counter, step) = stream_and_step(&g);
    let mut capturing = allocated(
        &g,
        &[
            &[f32s(1000), f32s(500)],
            &[f32s(2000)],
            &[i32s(300)],
            &[f32s(64)],
        ],
    );

    // Runner 0 captures a real kernel but takes only its first request.
    let e = capture_wgrad(&g, &mut capturing, R0, &s, step, 1000).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Capture(CaptureError::TakenMismatch {
                runner: R0,
                key: F32,
                taken: 4096,
                capacity: 6144,
            })
        ),
        "{e:?}"
    );
    assert!(
        e.to_string()
            .starts_with("runner 0 took 4096/6144 bytes of f32 in device"),
        "{e}"
    );

    // Runner 1 asks for one element more than discovery recorded.
    {
        let cap = capturing.capture(R1).unwrap();
        let view = cap.take(f32s(2000)).unwrap();
        let e = cap.take(f32s(1)).unwrap_err();
        assert!(
            matches!(
                e,
                CaptureError::CapacityExceeded {
                    runner: R1,
                    key: F32,
                    index: 1,
                    requested: 256,
                    taken: 8192,
                    capacity: 8192,
                    ..
                }
            ),
            "{e:?}"
        );
        cap.stream_capture(&s, |s| {
            g.wgrad(s, view.device_address(), 2000, step, 1, 0, 0)
        })
        .unwrap();
        cap.finish().unwrap();
    }

    // Runner 2 asks for a different size, then a key it never used.
    {
        let cap = capturing.capture(R2).unwrap();
        let e = cap.take(i32s(301)).unwrap_err();
        assert!(
            matches!(
                e,
                CaptureError::RequestMismatch {
                    runner: R2,
                    index: 0,
                    requested: 1280,
                    taken: 0,
                    capacity: 1280,
                    ..
                }
            ),
            "{e:?}"
        );
        let e = cap.take(f32s(300)).unwrap_err();
        assert!(
            matches!(
                e,
                CaptureError::RequestMismatch {
                    runner: R2,
                    capacity: 0,
                    ..
                }
            ),
            "{e:?}"
        );
    } // dropped unfinished

    capture_wgrad(&g, &mut capturing, R3, &s, step, 64).unwrap();
    let e = capturing.seal().unwrap_err();
    match e.into_error() {
        CaptureError::Unfinished { runners } => {
            let ids: Vec<RunnerId> = runners.iter().map(|(r, _)| *r).collect();
            assert_eq!(ids, vec![R0, R2], "{runners:?}");
            let why = |i: usize| runners[i].1.as_ref().map(|f| f.to_string());
            assert!(why(0).unwrap().contains("took 4096/6144"), "{runners:?}");
            assert!(
                why(1).unwrap().contains("dropped before finish"),
                "{runners:?}"
            );
        }
        other => panic!("expected Unfinished, got {other:?}"),
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_graph_allocation_that_escapes_is_rejected_and_a_balanced_temporary_accepted() {
    let g = gpu();
    let (s, _counter, step) = stream_and_step(&g);
    let mut capturing = allocated(&g, &[&[f32s(1024)], &[f32s(1024)], &[f32s(1024)]]);

    let e = capture_with_memory_nodes(&g, &mut capturing, R0, &s, step, (1024, false)).unwrap_err();
    match &e {
        CaptureError::GraphRejected { runner, reason } => {
            assert_eq!(*runner, R0);
            assert!(
                matches!(
                    reason,
                    replay_arena::backend::GraphRejection::MemoryNodes {
                        unfreed: 1,
                        unfreed_bytes: 1_048_576,
                        ..
                    }
                ) && reason.to_string().contains("never freed"),
                "{reason}"
            );
        }
        other => panic!("expected GraphRejected, got {other:?}"),
    }
    println!("{e}");
    // Allocated and freed inside the graph: a legal temporary.
    capture_with_memory_nodes(&g, &mut capturing, R1, &s, step, (1024, true)).unwrap();
    // The stream and the plan stay usable: a clean runner captures fine.
    capture_wgrad(&g, &mut capturing, R2, &s, step, 1024).unwrap();
    assert!(matches!(
        capturing.seal().map_err(SealError::into_error),
        Err(CaptureError::Unfinished { runners }) if runners.len() == 1
    ));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_failed_capture_then_a_replan_and_a_successful_capture() {
    let g = gpu();
    let s = g.backend.new_stream().unwrap();
    let specs = [
        Spec::new(31, &[5000], Some(128)),
        Spec::new(32, &[3000], None),
    ];
    let discover_specs = || {
        let mut d = Discovering::new(PlanConfig::new());
        for (r, spec) in specs.iter().enumerate() {
            let mut armed = d.arm(RunnerId(r as u32)).unwrap();
            for q in spec.requests() {
                armed.record(q).unwrap();
            }
        }
        d
    };
    let states: Vec<State> = specs.iter().map(|spec| State::new(&g, spec)).collect();

    let mut capturing = discover_specs()
        .plan(Policy::Generations(2))
        .unwrap()
        .allocate(g.backend.clone())
        .unwrap();
    {
        let spec = &specs[0];
        let cap = capturing.capture(R0).unwrap();
        let views = spec.take(&cap);
        let (x, w) = spec.split(&views);
        let step = g.ptr(&states[0].step);
        let e = cap
            .stream_capture(&s, |s| {
                spec.submit(&g, s, step, x, &w)?;
                Err::<(), String>("injected failure after the launches".into())
            })
            .unwrap_err();
        assert!(
            matches!(&e, StreamCaptureError::Work(w) if w == "injected failure after the launches"),
            "{e:?}"
        );
        drop(cap);
        assert!(matches!(
            capturing.capture(R0).unwrap_err(),
            CaptureError::AlreadyCaptured {
                runner: R0,
                failure: Some(CaptureFailure::Work(_))
            }
        ));
    }
    // The capture was ended and discarded: the stream is not capturing and
    // runs eager work.
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE;
    let code = unsafe { sys::cuStreamIsCapturing(s.cu_stream(), &mut status) };
    assert_eq!(code, sys::CUresult::CUDA_SUCCESS);
    assert_eq!(
        status,
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
    );
    let scratch: CudaSlice<f32> = g.zeros(16);
    g.wgrad(&s, g.ptr(&scratch), 16, g.ptr(&states[1].step), 1, 0, 0)
        .unwrap();
    s.synchronize().unwrap();
    assert_eq!(g.read(&states[0].step), vec![0], "nothing captured ran");

    // Re-plan from scratch and capture everything properly.
    let discovery = capturing.replan();
    drop(discovery);
    let mut capturing = discover_specs()
        .plan(Policy::Generations(2))
        .unwrap()
        .allocate(g.backend.clone())
        .unwrap();
    for (r, spec) in specs.iter().enumerate() {
        let cap = capturing.capture(RunnerId(r as u32)).unwrap();
        spec.capture(&g, cap, g.ptr(&states[r].step), &s);
    }
    let mut replayable = capturing.seal().unwrap();
    let consumer = g.backend.new_stream().unwrap();
    let torn: CudaSlice<u32> = g.zeros(1);
    let steps = 200;
    for _ in 0..steps {
        for (r, spec) in specs.iter().enumerate() {
            replayable.replay(RunnerId(r as u32), &s).unwrap();
            let state = &states[r];
            replayable
                .consume(RunnerId(r as u32), &consumer, |c, views| {
                    state.fold(&g, spec, c, views, &torn, 0, None)
                })
                .unwrap();
        }
    }
    replayable.synchronize().unwrap();
    let got: Vec<Vec<Vec<u32>>> = states.iter().map(|st| st.read_outs(&g)).collect();
    let expected: Vec<Vec<Vec<u32>>> = specs.iter().map(|sp| host_outputs(sp, steps)).collect();
    assert_eq!(mismatches(&got, &expected), 0);
    assert_eq!(g.read(&torn), vec![0]);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_default_stream_cannot_be_captured() {
    let g = gpu();
    // The legacy NULL stream is refused when wrapped, before any capture.
    let e = g
        .backend
        .wrap_stream(g.backend.context().default_stream())
        .unwrap_err();
    assert!(
        matches!(e, replay_arena::BackendError::LegacyStream { .. }),
        "{e:?}"
    );
    assert!(e.to_string().contains("(NULL) stream"), "{e}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn symmetric_domains_without_nccl_windows_are_a_typed_error() {
    let g = gpu();
    let group = GroupId(1);
    let config = PlanConfig::new().with_group(group, "dense gtp").unwrap();
    let mut discovery = Discovering::new(config);
    discovery
        .arm(R0)
        .unwrap()
        .record(Request::new(Domain::Symmetric(group), DType::BF16, 4096))
        .unwrap();
    let planned = discovery.plan(Policy::Generations(1)).unwrap();
    let e = match planned
        .allocate(g.backend.clone())
        .map_err(|f| f.into_error().error)
    {
        Ok(_) => panic!("the cuda backend has no NCCL windows to allocate from"),
        Err(e) => e,
    };
    if cfg!(feature = "nccl") {
        assert_eq!(e, BackendError::NoCommunicator { group });
    } else {
        assert!(
            matches!(&e, BackendError::Allocation { key, reason, .. }
                if key.domain == Domain::Symmetric(group) && reason.contains("nccl")),
            "{e:?}"
        );
    }
}

/// One round of everything above with large arenas; returns the bytes the
/// allocated plan took off the device.
fn round(g: &Gpu) -> u64 {
    const BIG: u64 = 8 << 20; // elements: 32 MiB of f32
    let (s, _counter, step) = stream_and_step(g);
    let runners: [&[Request]; 4] = [
        &[f32s(BIG)],
        &[f32s(BIG), i32s(BIG / 4)],
        &[f32s(BIG / 2)],
        &[f32s(BIG)],
    ];
    let free_before = g.free_memory();

    // Failures: an escaping graph allocation, a failing closure, an unsealed plan.
    let mut capturing = allocated(g, &runners);
    let taken = free_before.saturating_sub(g.free_memory());
    let e = capture_with_memory_nodes(g, &mut capturing, R0, &s, step, (BIG, false));
    assert!(
        matches!(e, Err(CaptureError::GraphRejected { .. })),
        "{e:?}"
    );
    {
        let cap = capturing.capture(R1).unwrap();
        let views = (
            cap.take(f32s(BIG)).unwrap(),
            cap.take(i32s(BIG / 4)).unwrap(),
        );
        let e = cap
            .stream_capture(&s, |s| {
                g.wgrad(s, views.0.device_address(), 1024, step, 1, 0, 0)?;
                Err::<(), String>("injected".into())
            })
            .unwrap_err();
        assert!(matches!(e, StreamCaptureError::Work(_)));
    }
    drop(capturing);

    // A full lifecycle: capture, seal, replay, re-plan.
    let mut capturing = allocated(g, &runners);
    for (r, requests) in runners.iter().enumerate() {
        let cap = capturing.capture(RunnerId(r as u32)).unwrap();
        let views: Vec<View<'_>> = requests.iter().map(|&q| cap.take(q).unwrap()).collect();
        cap.stream_capture(&s, |s| {
            g.wgrad(s, views[0].device_address(), 1 << 16, step, r as u32, 0, 0)
        })
        .unwrap();
        cap.finish().unwrap();
    }
    let mut replayable = capturing.seal().unwrap();
    for _ in 0..10 {
        for r in 0..runners.len() as u32 {
            replayable.replay(RunnerId(r), &s).unwrap();
        }
    }
    let discovery = replayable.replan().unwrap();
    drop(discovery);
    taken
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn no_device_memory_is_left_behind() {
    const MIB: f64 = (1u64 << 20) as f64;
    const SLACK: u64 = 8 << 20;
    let g = gpu();
    let initial = g.free_memory();
    round(&g); // first-use costs of the driver (graph machinery, module)
    let before = g.free_memory();
    let mut taken = Vec::new();
    for _ in 0..3 {
        taken.push(round(&g));
    }
    let after = g.free_memory();
    println!(
        "free device memory: {:.1} MiB initially, {:.1} MiB after a warm-up round, {:.1} MiB after 3 more rounds (a plan took {:?} MiB while allocated)",
        initial as f64 / MIB,
        before as f64 / MIB,
        after as f64 / MIB,
        taken.iter().map(|&t| t as f64 / MIB).collect::<Vec<_>>()
    );
    // The measurement sees the arenas (2 generations x 32 MiB of f32 plus
    // 8 MiB of i32): at least one 32 MiB arena shows, so the check below is
    // not vacuous. Arenas come from the device's stream-ordered pool, which
    // may serve part of a round from memory the previous round released.
    assert!(taken.iter().all(|&t| t >= 32 << 20), "{taken:?}");
    assert!(
        after + SLACK >= before,
        "{:.1} MiB of device memory were left behind",
        (before - after) as f64 / MIB
    );
}
