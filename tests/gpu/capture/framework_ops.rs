//! A framework's own ops inside runner graphs, on the GPU: outputs
//! allocated inside the capture (`alloc_zeros`, i.e. `cuMemAllocAsync`) and
//! intermediates dropped there (`cuMemFreeAsync`) are accepted, replay
//! exactly and keep their addresses; an output that escapes the graph is a
//! typed error naming the runner and the bytes; the program's optimizer
//! stream waits for every consumer through the crate.
#![cfg(feature = "cuda")]

use crate::support::capture_view;
use crate::support::gpu::{allocate, device};
use replay_arena::cuda::cudarc::driver::CudaSlice;
use replay_arena::cuda::{self, ViewExt};
use replay_arena::{
    BackendError, CaptureError, Capturing, DType, Domain, Policy, Request, RunnerId,
};

const N: usize = 1 << 16;
const REQ: Request = Request::new(Domain::Device, DType::F32, N as u64);

/// Device 0, a stream, and a plan of `runner` alone (one view of `REQ`),
/// allocated.
fn one_runner(runner: RunnerId) -> (cuda::Device, cuda::Stream, Capturing<cuda::Device>) {
    let b = device();
    let pool = b.new_stream().unwrap();
    let capturing = allocate(&b, [(runner, [REQ])], Policy::Generations(1));
    (b, pool, capturing)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn temporaries_inside_a_runner_graph_replay_exactly() {
    let b = device();
    let (pool, side, optimizer) = (
        b.new_stream().unwrap(),
        b.new_stream().unwrap(),
        b.new_stream().unwrap(),
    );
    let input: CudaSlice<f32> = pool.cudarc().clone_htod(&vec![2.5f32; N]).unwrap();
    pool.synchronize().unwrap();
    let rs = (0..2).map(|r| (RunnerId(r), [REQ]));
    let mut capturing = allocate(&b, rs, Policy::Generations(2));
    for r in 0..2 {
        capture_view(&mut capturing, RunnerId(r), REQ, &pool, |s, view| {
            // An op's output and an intermediate, as candle allocates them.
            let mut t1: CudaSlice<f32> = s.cudarc().alloc_zeros(N)?;
            s.cudarc().memcpy_dtod(&input, &mut t1)?;
            let mut t2: CudaSlice<f32> = s.cudarc().alloc_zeros(N)?;
            s.cudarc().memcpy_dtod(&t1, &mut t2)?;
            drop(t1);
            let mut out = view.as_cuda::<f32>(s)?;
            s.cudarc().memcpy_dtod(&t2, &mut out)?;
            drop(t2);
            Ok::<(), BackendError>(())
        });
    }
    let mut replayable = capturing.seal().unwrap();
    let mut main: CudaSlice<f32> = side.cudarc().alloc_zeros(N).unwrap();
    side.synchronize().unwrap();
    for _ in 0..50 {
        for r in 0..2 {
            replayable.replay(RunnerId(r), &pool).unwrap();
            replayable
                .consume(RunnerId(r), &side, |s, views| {
                    let v = views[0].as_cuda::<f32>(s)?;
                    // main = v (an exact copy: any torn or stale input shows)
                    s.cudarc().memcpy_dtod(&v, &mut main)?;
                    Ok::<(), BackendError>(())
                })
                .unwrap();
        }
    }
    replayable.wait_all(&optimizer).unwrap();
    let host = optimizer.cudarc().clone_dtoh(&main).unwrap();
    optimizer.synchronize().unwrap();
    assert!(host.iter().all(|&x| x == 2.5));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn an_output_that_escapes_its_graph_is_a_typed_error() {
    let (_b, pool, mut capturing) = one_runner(RunnerId(3));
    let cap = capturing.capture(RunnerId(3)).unwrap();
    let view = cap.take(REQ).unwrap();
    let mut kept: Option<CudaSlice<f32>> = None;
    cap.stream_capture(&pool, |s| {
        let mut out: CudaSlice<f32> = s.cudarc().alloc_zeros(N)?;
        let v = view.as_cuda::<f32>(s)?;
        s.cudarc().memcpy_dtod(&v, &mut out)?;
        kept = Some(out); // the output outlives the graph
        Ok::<(), BackendError>(())
    })
    .unwrap();
    let err = cap.finish().unwrap_err();
    assert!(
        matches!(&err, CaptureError::GraphRejected { runner: RunnerId(3), reason }
            if reason.to_string().contains(&format!("of {} bytes", N * 4))
                && reason.to_string().contains("never freed")),
        "{err}"
    );
    // The rejected graph was destroyed without a launch, so its allocation
    // never got memory: there is nothing for the slice to free.
    std::mem::forget(kept);
    assert!(capturing.seal().is_err());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_graph_the_program_captured_with_cudarc_is_adopted_and_replays() {
    use replay_arena::cuda::cudarc::driver::sys;
    let (b, pool, mut capturing) = one_runner(RunnerId(0));
    let cap = capturing.capture(RunnerId(0)).unwrap();
    let addr = cap.take(REQ).unwrap().device_address();
    let ones = vec![1.25f32; N];
    let source: CudaSlice<f32> = pool.cudarc().clone_htod(&ones).unwrap();
    pool.synchronize().unwrap();
    // The program's own capture, on its own raw pointer to the view.
    let s = pool.cudarc();
    s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .unwrap();
    // SAFETY: `addr` is the view's N f32s; the slice is leaked, never freed.
    let mut dst = unsafe { s.upgrade_device_ptr::<f32>(addr, N) };
    s.memcpy_dtod(&source, &mut dst).unwrap();
    dst.leak();
    let graph = s
        .end_capture(sys::CUgraphInstantiate_flags(0))
        .unwrap()
        .expect("a graph");
    let adopted = b.adopt_graph(&graph).unwrap();
    drop(graph); // the program's graph is its own; the plan owns the clone
                 // SAFETY: the graph writes only this capture's view, and reads a slice
                 // that outlives the plan.
    unsafe { cap.finish_with_graph(adopted) }.unwrap();
    let mut replayable = capturing.seal().unwrap();
    replayable.replay(RunnerId(0), &pool).unwrap();
    replayable.synchronize().unwrap();
    let mut host = vec![0f32; N];
    // SAFETY: the plan is idle; a read of the view's bytes.
    let view = unsafe { pool.cudarc().upgrade_device_ptr::<f32>(addr, N) };
    pool.cudarc().memcpy_dtoh(&view, &mut host).unwrap();
    pool.synchronize().unwrap();
    view.leak();
    assert!(host.iter().all(|&x| x == 1.25));
    let reserved = b.graph_memory_in_use().unwrap().reserved;
    println!("graph memory reserved on the device: {reserved} bytes");
}

#[cfg(feature = "nccl")]
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_communicator_the_program_created_is_adopted_and_left_alive() {
    use crate::support::gpu::reduce_scatter_plan;
    use replay_arena::cuda::cudarc::nccl::sys as nc;
    use replay_arena::nccl::{Communicator, UniqueId};
    use replay_arena::GroupId;
    let b = device();
    let id = UniqueId::new().unwrap();
    let mut raw: nc::ncclComm_t = std::ptr::null_mut();
    let unique = nc::ncclUniqueId {
        internal: id.as_bytes().map(|x| x as _),
    };
    b.context().bind_to_thread().unwrap();
    // SAFETY: a 1-rank communicator of the program's own.
    let code = unsafe { nc::ncclCommInitRank(&mut raw, 1, unique, 0) };
    assert_eq!(code, nc::ncclResult_t::ncclSuccess);
    let group = GroupId(0);
    {
        // SAFETY: `raw` outlives everything made from it in this block.
        let comm = unsafe { Communicator::adopt(&b, group, raw) }.unwrap();
        assert_eq!((comm.rank(), comm.size()), (0, 1));
        let (mut capturing, sym) = reduce_scatter_plan(&b, &comm, REQ);
        let pool = b.new_stream().unwrap();
        let cap = capturing.capture(RunnerId(0)).unwrap();
        let (send, recv) = (cap.take(sym).unwrap(), cap.take(REQ).unwrap());
        cap.stream_capture(&pool, |s| comm.reduce_scatter(&send, &recv, s))
            .unwrap();
        cap.finish().unwrap();
        let mut replayable = capturing.seal().unwrap();
        replayable.replay(RunnerId(0), &pool).unwrap();
        replayable.synchronize().unwrap();
    }
    // The program still owns its communicator: destroying it now is valid.
    // SAFETY: nothing uses it any more.
    let code = unsafe { nc::ncclCommDestroy(raw) };
    assert_eq!(code, nc::ncclResult_t::ncclSuccess);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_bucket_of_sub_views_is_reduced_by_one_consumer_over_several_runners() {
    // Three runners, each writing a flat bucket of two "parameters" through
    // sub-views; one consumer sums all three buckets, many steps, exactly.
    let b = device();
    let (pool, side) = (b.new_stream().unwrap(), b.new_stream().unwrap());
    let (p1, p2) = (3000usize, 5000usize);
    let bucket = Request::new(Domain::Device, DType::F32, (p1 + p2) as u64);
    let rs = (0..3).map(|r| (RunnerId(r), [bucket]));
    let mut capturing = allocate(&b, rs, Policy::Generations(3));
    let values: Vec<[CudaSlice<f32>; 2]> = (0..3)
        .map(|r| {
            [
                pool.cudarc().clone_htod(&vec![r as f32 + 1.0; p1]).unwrap(),
                pool.cudarc()
                    .clone_htod(&vec![10.0 * (r as f32 + 1.0); p2])
                    .unwrap(),
            ]
        })
        .collect();
    pool.synchronize().unwrap();
    for r in 0..3u32 {
        let cap = capturing.capture(RunnerId(r)).unwrap();
        let view = cap.take(bucket).unwrap();
        let (first, second) = view.split_at(p1).unwrap();
        cap.stream_capture(&pool, |s| {
            let mut a = first.as_cuda::<f32>(s)?;
            let mut c = second.as_cuda::<f32>(s)?;
            s.cudarc().memcpy_dtod(&values[r as usize][0], &mut a)?;
            s.cudarc().memcpy_dtod(&values[r as usize][1], &mut c)?;
            Ok::<(), BackendError>(())
        })
        .unwrap();
        cap.finish().unwrap();
    }
    let mut replayable = capturing.seal().unwrap();
    let mut sums: [CudaSlice<f32>; 3] =
        std::array::from_fn(|_| side.cudarc().alloc_zeros(p1 + p2).unwrap());
    for _ in 0..20 {
        for r in 0..3 {
            replayable.replay(RunnerId(r), &pool).unwrap();
        }
        let runners = [RunnerId(0), RunnerId(1), RunnerId(2)];
        replayable
            .consume_many(&runners, &side, |s, all| {
                // Copy each runner's bucket out (an exact check of what the
                // consumer saw, per runner).
                for (views, sum) in all.iter().zip(sums.iter_mut()) {
                    let v = views[0].as_cuda::<f32>(s)?;
                    s.cudarc().memcpy_dtod(&v, sum)?;
                }
                Ok::<(), BackendError>(())
            })
            .unwrap();
    }
    replayable.wait_all(&side).unwrap();
    for (r, sum) in sums.iter().enumerate() {
        let host = side.cudarc().clone_dtoh(sum).unwrap();
        side.synchronize().unwrap();
        assert!(
            host[..p1].iter().all(|&x| x == r as f32 + 1.0),
            "runner {r}"
        );
        assert!(
            host[p1..].iter().all(|&x| x == 10.0 * (r as f32 + 1.0)),
            "runner {r}"
        );
    }
}
