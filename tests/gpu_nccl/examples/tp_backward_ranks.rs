//! The tensor-parallel backward example's model (`examples/tp_backward`) on
//! every GPU of the machine, one rank per GPU on its own thread: a short
//! graphed backward (round-robin plan, fingerprint checked across the ranks,
//! wgrads reduce-scattered on NCCL symmetric windows inside the graphs)
//! against the eager run of the same ranks, and against a one-rank run of
//! the whole batch. Skips with a message on a machine with one GPU.
#![cfg(all(feature = "cuda", feature = "nccl"))]

use std::sync::Barrier;

use crate::support::gpu::tp::model::{
    self, graphed_step, Comparison, Model, Reduce, Shape, Tolerance,
};
use crate::support::gpu::tp::{Eager, SHAPE};
use replay_arena::backend::Streams;
use replay_arena::cuda;
use replay_arena::cuda::cudarc::driver::CudaContext;
use replay_arena::nccl::{self, Communicator, UniqueId};
use replay_arena::{PlacedPolicy, Policy};

const STEPS: usize = 12;

/// What one rank found: graphed against eager, eager against one rank of
/// the whole batch.
struct Found {
    graphed: Comparison,
    reference: Comparison,
}

fn rank_run(rank: usize, ranks: usize, id: UniqueId, barrier: &Barrier) -> Found {
    let cuda = cuda::Device::new(rank)
        .unwrap_or_else(|e| panic!("rank {rank}: this test needs a CUDA GPU per rank: {e}"));
    let comm = Communicator::new(&cuda, model::TP_GROUP, &id, rank, ranks).unwrap();
    let mut model = Model::new(&cuda, SHAPE, Reduce::Nccl(comm.clone())).unwrap();
    let Eager {
        stream: eager_stream,
        pool,
        side,
        main: eager,
        graphed,
        discovery,
    } = Eager::run(&cuda, &mut model, STEPS);
    let planned = discovery
        .plan(PlacedPolicy::from(Policy::OverlapDepth(2)))
        .unwrap();
    comm.check_fingerprint(planned.fingerprint()).unwrap();
    let backend = nccl::Device::new(cuda.clone())
        .with_group(comm.clone())
        .unwrap();
    let mut capturing = planned.allocate(backend).unwrap();
    model
        .capture(&mut capturing, &cuda.new_stream().unwrap())
        .unwrap();
    let mut replayable = capturing.seal().unwrap();
    barrier.wait();
    for _ in 0..STEPS {
        graphed_step(&model, &mut replayable, &graphed, &pool, &side).unwrap();
    }
    replayable.synchronize().unwrap();
    assert_eq!(
        replayable.fence_stats().replays,
        (STEPS * model.modules.len()) as u64
    );
    // Bitwise when both reduce-scatters sum the ranks in the same order;
    // else one bf16 ulp of the element plus one of the tensor's largest
    // value.
    let vs_eager = Tolerance {
        rtol: 1.0 / 128.0,
        atol: 1e-4 * STEPS as f32,
        of_max: 1.0 / 256.0,
    };
    let graphed_c = model.compare(&eager, &graphed, vs_eager).unwrap();
    drop(replayable);

    let whole = Shape {
        tokens: SHAPE.tokens * ranks,
        ..SHAPE
    };
    let mut reference = Model::new(&cuda, whole, Reduce::StandIn).unwrap();
    let whole_main = reference.main_grads().unwrap();
    for _ in 0..STEPS {
        reference.eager_step(&whole_main, &eager_stream).unwrap();
    }
    cuda.synchronize().unwrap();
    // Three bf16 roundings (each rank's partial, their sum) where one rank
    // rounds once: one bf16 ulp of the element plus two of the tensor's
    // largest value.
    let vs_one_rank = Tolerance {
        rtol: 1.0 / 128.0,
        atol: 0.0,
        of_max: 1.0 / 64.0,
    };
    let reference_c = model
        .compare_to_reference(&eager, &reference, &whole_main, vs_one_rank)
        .unwrap();
    barrier.wait();
    Found {
        graphed: graphed_c,
        reference: reference_c,
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn two_rank_graphed_backward_equals_eager_and_one_rank() {
    replay_arena::cuda::probe()
        .unwrap_or_else(|e| panic!("this test needs a CUDA GPU (run it on the GPU machine): {e}"));
    let ranks = CudaContext::device_count().unwrap() as usize;
    if ranks < 2 {
        println!("skipped: this multi-rank test needs at least 2 GPUs, this machine has {ranks}");
        return;
    }
    // NVLink multicast stays off on shared hosts.
    if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
        std::env::set_var("NCCL_NVLS_ENABLE", "0");
    }
    let id = UniqueId::new().unwrap();
    let barrier = Barrier::new(ranks);
    let found: Vec<Found> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..ranks)
            .map(|rank| {
                let barrier = &barrier;
                s.spawn(move || rank_run(rank, ranks, id, barrier))
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for (rank, f) in found.iter().enumerate() {
        println!(
            "rank {rank} of {ranks}: graphed vs eager: {}; eager vs one rank of the whole batch: {}",
            f.graphed, f.reference
        );
        assert!(f.graphed.max_abs > 0.0, "rank {rank}: main grads all zero");
        assert_eq!(
            f.graphed.past_tolerance, 0,
            "rank {rank}: graphed main grads differ from eager: {}",
            f.graphed
        );
        assert_eq!(
            f.reference.past_tolerance, 0,
            "rank {rank}: main grads differ from one rank of the whole batch: {}",
            f.reference
        );
    }
}
