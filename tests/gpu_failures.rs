//! A backend call that really fails mid-schedule, on the GPU: runner
//! graphs whose temporaries (graph memory nodes, as a framework's ops
//! allocate them) cannot be mapped because the program holds nearly all
//! device memory. The driver refuses the launch
//! (`CUDA_ERROR_OUT_OF_MEMORY`), for a per-runner replay and for a step
//! graph that moved the runners' step copies in. Each refused launch
//! leaves the fence as it was: nothing counts, the runners stay
//! unreplayed, and once the memory is back every replay, consumer and step
//! launch is exact (run under compute-sanitizer's memcheck and racecheck).
#![cfg(feature = "cuda")]

mod support;

use replay_arena::cuda::cudarc::driver::CudaSlice;
use replay_arena::cuda::{self, ViewExt};
use replay_arena::{
    BackendError, DType, Discovering, Domain, PlanConfig, Policy, ReplayError, Request, RunnerId,
};
use support::gpu::gpu;

const N: usize = 1 << 16;
const REQ: Request = Request::new(Domain::Device, DType::F32, N as u64);
/// Each runner's temporary: 2 GiB of f32.
const TEMP: usize = 1 << 29;
/// What the hog leaves free: less than one temporary.
const LEFT: u64 = 1 << 29;

fn oom(e: &ReplayError) -> bool {
    let text = e.to_string();
    text.contains("OUT_OF_MEMORY") || text.contains("out of memory")
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn launches_the_driver_refuses_for_graph_memory_leave_the_fence_as_it_was() {
    let g = gpu();
    let b = &g.backend;
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
    let planned = Discovering::from_runners(PlanConfig::new(), rs)
        .unwrap()
        .plan(Policy::Generations(1))
        .unwrap();
    let mut capturing = planned.allocate(b.clone()).unwrap();
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

    // The program takes nearly all device memory.
    let free = g.free_memory();
    let hog: CudaSlice<u8> = pool
        .cudarc()
        .alloc_zeros((free - LEFT) as usize)
        .expect("the hog");
    pool.synchronize().unwrap();

    // A replay the driver refuses: nothing counts, runner 0 stays
    // unreplayed (its consumer is refused).
    let before = replayable.fence_stats();
    let refused = replayable.replay(RunnerId(0), &pool).unwrap_err();
    assert!(oom(&refused), "{refused}");
    assert_eq!(replayable.fence_stats(), before);
    assert!(matches!(
        replayable.consume(RunnerId(0), &side, |_, _| Ok::<(), BackendError>(())),
        Err(replay_arena::ConsumeError::Replay(
            ReplayError::NotReplayed { .. }
        ))
    ));

    // A step graph with both step copies moved in, refused too.
    {
        let mut step = replayable.step();
        for r in 0..2 {
            step.replay(RunnerId(r), &pool).unwrap();
            let main = &mut mains[r as usize];
            step.consume(RunnerId(r), &side, |s, views| {
                let v = views[0].as_cuda::<f32>(s)?;
                s.cudarc().memcpy_dtod(&v, main)?;
                Ok::<(), BackendError>(())
            })
            .unwrap();
        }
        let mut graph = step.build().unwrap();
        let refused = graph.launch(&launch).unwrap_err();
        assert!(oom(&refused), "{refused}");
        assert_eq!(graph.launches(), 0);
        assert_eq!(graph.replayable().fence_stats(), before);

        // The memory comes back: the same step graph launches, exactly.
        drop(hog);
        pool.synchronize().unwrap();
        for _ in 0..10 {
            graph.launch(&launch).unwrap();
        }
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
    assert_eq!(replayable.fence_stats().replays, 20);
}
