//! A backend call that really fails mid-schedule, on the GPU: runner
//! a step graph that moved in the step copies of runners whose graphs
//! allocate temporaries (graph memory nodes, as a framework's ops allocate
//! them), launched while the program holds nearly all device memory. The
//! driver refuses the launch (`CUDA_ERROR_OUT_OF_MEMORY`); the refused
//! launch leaves the fence as it was (nothing counts), and once the memory
//! is back the same step graph, then per-runner replays and consumers,
//! are exact (run under compute-sanitizer's memcheck and racecheck). The
//! same with lazy instantiation, where the refused launch is the step
//! graph's first: the one that instantiates it (and keeps its executable
//! graph for the launches after).
#![cfg(feature = "cuda")]

mod support;

use replay_arena::cuda::cudarc::driver::{sys, CudaSlice};
use replay_arena::cuda::{self, ViewExt};
use replay_arena::{BackendError, DType, Domain, Policy, Request, RunnerId};
use support::gpu::{allocate, gpu};

const N: usize = 1 << 16;
const REQ: Request = Request::new(Domain::Device, DType::F32, N as u64);
/// Each runner's temporary: 2 GiB of f32.
const TEMP: usize = 1 << 29;
/// What the hog leaves free: less than one temporary.
const LEFT: u64 = 1 << 29;

/// Device memory the program holds, from `cuMemAlloc` (outside every
/// pool).
struct Hog(sys::CUdeviceptr);

impl Hog {
    fn take(bytes: u64) -> Hog {
        let mut ptr = 0;
        let code = unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes as usize) };
        assert_eq!(code, sys::CUresult::CUDA_SUCCESS, "the hog: {bytes} bytes");
        Hog(ptr)
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        unsafe { sys::cuMemFree_v2(self.0) };
    }
}

fn oom(e: &dyn std::fmt::Display) -> bool {
    let text = e.to_string();
    text.contains("OUT_OF_MEMORY") || text.contains("out of memory")
}

/// One hog at a time: the tests of this file take nearly all device
/// memory, each in turn.
static HOG: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
#[ignore = "needs a CUDA GPU"]
fn refused_graph_memory_launches_leave_the_fence() {
    refused_launches(false);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_lazy_step_graphs_refused_first_launch_leaves_the_fence_and_keeps_its_instantiation() {
    refused_launches(true);
}

/// The scenario, its graphs instantiated at capture and build, or
/// (`lazy`) at their first launch.
fn refused_launches(lazy: bool) {
    let _one = HOG.lock().unwrap_or_else(|p| p.into_inner());
    let g = gpu();
    let lazily = g.backend.clone().with_lazy_instantiation(lazy);
    let b = &lazily;
    let (pool, side, launch) = (
        b.new_stream().unwrap(),
        b.new_stream().unwrap(),
        b.new_stream().unwrap(),
    );
    let inputs: Vec<CudaSlice<f32>> = (0..2)
        .map(|r| {
            let host = vec![r as f32 + 1.5; N];
            pool.cudarc().clone_htod(&host).unwrap()
        })
        .collect();
    let mut mains: Vec<CudaSlice<f32>> = (0..2).map(|_| g.zeros(N)).collect();
    pool.synchronize().unwrap();
    // Two runners sharing one generation's bytes (G = 1).
    let rs = (0..2).map(|r| (RunnerId(r), [REQ]));
    let mut capturing = allocate(b, rs, Policy::Generations(1));
    for r in 0..2 {
        let cap = capturing.capture(RunnerId(r)).unwrap();
        let view = cap.take(REQ).unwrap();
        let input = &inputs[r as usize];
        cap.step_copies(1);
        cap.stream_capture_repeatable(&pool, |s: &cuda::Stream| {
            // A framework op's big temporary, then the result.
            let mut t: CudaSlice<f32> = s.cudarc().alloc_zeros(TEMP)?;
            s.cudarc().memcpy_dtod(input, &mut t.slice_mut(0..N))?;
            let mut out = view.as_cuda::<f32>(s)?;
            s.cudarc().memcpy_dtod(&t.slice(0..N), &mut out)?;
            drop(t);
            Ok::<(), BackendError>(())
        })
        .unwrap();
        cap.finish().unwrap();
    }
    let mut replayable = capturing.seal().unwrap();
    eprintln!("gpu_failures: sealed");
    let consume = |replayable: &mut replay_arena::Replayable<cuda::Device>,
                   r: usize,
                   main: &mut CudaSlice<f32>| {
        replayable
            .consume(RunnerId(r as u32), &side, |s, views| {
                let v = views[0].as_cuda::<f32>(s)?;
                s.cudarc().memcpy_dtod(&v, main)?;
                Ok::<(), BackendError>(())
            })
            .unwrap();
    };

    // The program takes nearly all device memory (no trim: the
    // driver 580.159.04 crashes in cuGraphLaunch, SIGSEGV, when a graph
    // whose memory was trimmed away cannot map it again).
    let (free, _) = b.mem_info().unwrap();
    let left = std::env::var("GPU_FAILURES_LEFT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(LEFT);
    let hog = Hog::take(free - left);
    eprintln!("gpu_failures: hog taken");

    // The runners' own graphs still replay: the driver mapped their
    // temporaries when it uploaded them at capture. (Lazily, they are not
    // instantiated yet: they are first replayed after the hog, below.)
    if !lazy {
        for r in 0..2 {
            replayable.replay(RunnerId(r), &pool).unwrap();
        }
        eprintln!("gpu_failures: replayed once");
    }

    // A step graph that moved the runners' step copies in: its launch
    // needs memory for their temporaries, and the driver refuses it.
    {
        let mut step = replayable.step();
        for r in 0..2 {
            // On two lanes: the step's copies need their memory together.
            step.replay(RunnerId(r), if r == 0 { &pool } else { &launch })
                .unwrap();
            let main = &mut mains[r as usize];
            step.consume(RunnerId(r), &side, |s, views| {
                let v = views[0].as_cuda::<f32>(s)?;
                s.cudarc().memcpy_dtod(&v, main)?;
                Ok::<(), BackendError>(())
            })
            .unwrap();
        }
        let mut graph = step.build().unwrap();
        // Lazily, the build composed it and instantiated nothing.
        assert_eq!(graph.graphs()[0].is_instantiated(), !lazy);
        let before = graph.replayable().fence_stats();
        let refused = graph.launch(&launch).unwrap_err();
        eprintln!(
            "gpu_failures: step launch refused (lazy: {lazy}, instantiated after it: {}): {refused}",
            graph.graphs()[0].is_instantiated()
        );
        assert!(oom(&refused), "{refused}");
        assert_eq!(graph.launches(), 0);
        assert_eq!(graph.replayable().fence_stats(), before);
        // Lazily, the refused launch instantiated the step graph (the
        // driver refuses its launch, not its instantiation: on an H200,
        // driver 580.159.04), and the step graph keeps that executable.
        assert!(graph.graphs()[0].is_instantiated());

        // The memory comes back: the same step graph launches, exactly.
        drop(hog);
        for _ in 0..10 {
            graph.launch(&launch).unwrap();
        }
        assert!(graph.graphs()[0].is_instantiated());
    }
    replayable.wait_all(&launch).unwrap();
    launch.synchronize().unwrap();
    for (r, main) in mains.iter().enumerate() {
        assert!(
            g.read(main).iter().all(|&x| x == r as f32 + 1.5),
            "step, runner {r}"
        );
    }
    // Per-runner replays of the runners' own graphs after it, exactly.
    let mut fresh: Vec<CudaSlice<f32>> = (0..2).map(|_| g.zeros(N)).collect();
    for _ in 0..10 {
        for (r, main) in fresh.iter_mut().enumerate() {
            replayable.replay(RunnerId(r as u32), &pool).unwrap();
            consume(&mut replayable, r, main);
        }
    }
    replayable.synchronize().unwrap();
    for (r, main) in fresh.iter().enumerate() {
        assert!(
            g.read(main).iter().all(|&x| x == r as f32 + 1.5),
            "replay, runner {r}"
        );
    }
    assert_eq!(replayable.fence_stats().step_launches, 10);
    let before_the_hog = if lazy { 0 } else { 2 };
    assert_eq!(replayable.fence_stats().replays, 20 + before_the_hog);
}
