//! Communication first, on the GPU: a stream at the greatest priority the
//! context supports, work captured on it keeping that priority in its
//! graph's kernel nodes (which step graphs, instantiated to run nodes at
//! their own priority, keep), and a step graph whose consumers run on it,
//! exact against per-runner replays.
#![cfg(feature = "cuda")]

use crate::support;

use replay_arena::cuda::cudarc::driver::sys;
use replay_arena::{DType, Domain, Policy, Request, RunnerId};
use support::gpu::{allocate, gpu};

const N: u64 = 1 << 12;

/// The priority of every kernel node of `graph`, child graphs included.
fn kernel_priorities(graph: sys::CUgraph) -> Vec<i32> {
    let mut n = 0usize;
    let mut out = Vec::new();
    unsafe {
        assert_eq!(
            sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut n),
            sys::CUresult::CUDA_SUCCESS
        );
        let mut nodes = vec![std::ptr::null_mut(); n];
        assert_eq!(
            sys::cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut n),
            sys::CUresult::CUDA_SUCCESS
        );
        for node in nodes {
            let mut kind = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
            assert_eq!(
                sys::cuGraphNodeGetType(node, &mut kind),
                sys::CUresult::CUDA_SUCCESS
            );
            if kind == sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL {
                let mut value: sys::CUkernelNodeAttrValue = std::mem::zeroed();
                let attr = sys::CUkernelNodeAttrID::CU_LAUNCH_ATTRIBUTE_PRIORITY;
                assert_eq!(
                    sys::cuGraphKernelNodeGetAttribute(node, attr, &mut value),
                    sys::CUresult::CUDA_SUCCESS
                );
                out.push(value.priority);
            }
        }
    }
    out
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn work_captured_on_a_high_priority_stream_keeps_its_priority() {
    let g = gpu();
    let b = &g.backend;
    let range = b.stream_priorities().unwrap();
    println!("stream priorities: {range:?}");
    assert!(range.greatest < range.least, "{range:?}");
    let (low, high) = (
        b.new_stream().unwrap(),
        b.new_high_priority_stream().unwrap(),
    );
    assert_eq!(high.priority().unwrap(), range.greatest);
    assert_eq!(low.priority().unwrap(), range.least);

    // Runner 0 captured on the high-priority stream, runner 1 on the other.
    let req = Request::new(Domain::Device, DType::F32, N);
    let rs = (0..2).map(|r| (RunnerId(r), [req]));
    let mut capturing = allocate(b, rs, Policy::Generations(2));
    let counters: Vec<_> = (0..2).map(|_| g.zeros::<u32>(1)).collect();
    for (r, stream) in [(0, &high), (1, &low)] {
        let cap = capturing.capture(RunnerId(r)).unwrap();
        let _view = cap.take(req).unwrap();
        let counter = g.ptr(&counters[r as usize]);
        cap.stream_capture(stream, |s| g.bump(s, counter)).unwrap();
        cap.finish().unwrap();
    }
    let mut replayable = capturing.seal().unwrap();
    let high_graph = replayable.graph(RunnerId(0)).unwrap().cu_graph();
    let low_graph = replayable.graph(RunnerId(1)).unwrap().cu_graph();
    assert_eq!(kernel_priorities(high_graph), [range.greatest]);
    assert_eq!(kernel_priorities(low_graph), [0]);

    // Per-runner replays, then a step graph of both on the low stream
    // (its nodes run at their own priority): each counter counts every
    // launch.
    for _ in 0..5 {
        replayable.replay(RunnerId(0), &low).unwrap();
        replayable.replay(RunnerId(1), &low).unwrap();
    }
    {
        let mut step = replayable.step();
        step.replay(RunnerId(0), &high).unwrap();
        step.replay(RunnerId(1), &low).unwrap();
        let mut graph = step.build().unwrap();
        for _ in 0..5 {
            graph.launch(&low).unwrap();
        }
    }
    replayable.synchronize().unwrap();
    for c in &counters {
        assert_eq!(g.read(c), [10]);
    }
}
