//! The tensor-parallel backward example's model (`examples/tp_backward`) on a
//! small configuration: after N graphed steps, replayed on a pool of two
//! streams with the consumer on a side stream, every main grad equals the
//! eager run's (within one bf16 ulp per wgrad element, and the output says
//! whether bit for bit: the same shapes and workspace size let cuBLAS pick
//! the same algorithms), for round-robin and packed plans, with the
//! reduce-scatter standing in as a copy and (feature `nccl`) on NCCL
//! symmetric windows. Consecutive runners never share a cuBLAS workspace.
#![cfg(feature = "cuda")]

use crate::support::gpu::device;
use crate::support::gpu::tp::model::{
    self, graphed_step, step_graph, workspace_range, Model, Reduce, Shape, Split, Tolerance,
    TpError,
};
use crate::support::gpu::tp::{Eager, SHAPE};
use replay_arena::backend::Compose;
use replay_arena::cuda;
use replay_arena::{BackendError, PlacedPolicy, Policy, RunnerId};

const STEPS: usize = 20;

fn graphed_equals_eager<B: Compose<Stream = cuda::Stream, Graph = cuda::Graph>>(
    cuda: &cuda::Device,
    make: &dyn Fn() -> Result<B, BackendError>,
    reduce: Reduce,
    strategy: PlacedPolicy,
) {
    let mut model = Model::new(cuda, SHAPE, reduce).unwrap();
    // The discovery step is the eager run's first step.
    let Eager {
        stream: _eager_stream,
        pool,
        side,
        main: eager,
        graphed,
        discovery,
    } = Eager::run(cuda, &mut model, STEPS);
    let planned = discovery.plan(strategy).unwrap();
    println!("{}", planned.report());
    let mut capturing = planned.allocate(make().unwrap()).unwrap();
    model
        .capture(&mut capturing, &cuda.new_stream().unwrap())
        .unwrap();
    let mut replayable = capturing.seal().unwrap();

    let n = model.modules.len();
    let ranges: Vec<(u64, u64)> = (0..n)
        .map(|m| workspace_range(replayable.views(RunnerId(m as u32)).unwrap()).unwrap())
        .collect();
    for w in ranges.windows(2) {
        let ((a, x), (b, y)) = (w[0], w[1]);
        assert!(
            a + x <= b || b + y <= a,
            "consecutive runners share cuBLAS workspace bytes"
        );
    }

    for _ in 0..STEPS {
        graphed_step(&model, &mut replayable, &graphed, &pool, &side).unwrap();
    }
    replayable.synchronize().unwrap();
    let stats = replayable.fence_stats();
    // One bf16 ulp per wgrad element if cuBLAS picked another algorithm
    // under capture, accumulated identically STEPS times.
    let tol = Tolerance {
        rtol: 1.0 / 128.0,
        atol: 1e-4 * STEPS as f32,
        of_max: 0.0,
    };
    let c = model.compare(&eager, &graphed, tol).unwrap();
    println!(
        "{strategy:?}, {}: {c}; {} replays, {} waits, {} skipped",
        model.reduce.describe(),
        stats.replays,
        stats.waits,
        stats.waits_skipped
    );
    assert_eq!(stats.replays, (STEPS * n) as u64);
    assert!(stats.waits > 0, "replays on two streams must wait");
    assert!(c.max_abs > 0.0, "the main grads are all zero");
    assert_eq!(
        c.past_tolerance, 0,
        "graphed main grads differ from eager: {c}"
    );
    println!(
        "{}",
        if c.bitwise() {
            "bitwise: the same cuBLAS algorithms ran eager and captured"
        } else {
            "within the bf16 tolerance, not bitwise: cuBLAS picked other algorithms under capture"
        }
    );

    // The same schedule compiled into one step graph, launched STEPS times
    // on one stream: bit for bit what the per-runner replays gave.
    let stepped = model.main_grads().unwrap();
    let launch = cuda.new_stream().unwrap();
    {
        let mut step = step_graph(&model, &mut replayable, &stepped, &pool, &side, false).unwrap();
        for _ in 0..STEPS {
            step.launch(&launch).unwrap();
        }
        println!("step graph: {step:?}");
    }
    replayable.synchronize().unwrap();
    let exact = Tolerance {
        rtol: 0.0,
        atol: 0.0,
        of_max: 0.0,
    };
    let s = model.compare(&graphed, &stepped, exact).unwrap();
    assert!(
        s.bitwise(),
        "the step graph differs from per-runner replays: {s}"
    );
    assert_eq!(replayable.fence_stats().step_launches, STEPS as u64);

    // Two step graphs launched in turn on two streams, each step under the
    // one before: bit for bit the same.
    let overlapped = model.main_grads().unwrap();
    let launch2 = cuda.new_stream().unwrap();
    {
        let mut step =
            step_graph(&model, &mut replayable, &overlapped, &pool, &side, true).unwrap();
        assert!(step.is_overlapping());
        for k in 0..STEPS {
            step.launch(if k % 2 == 0 { &launch } else { &launch2 })
                .unwrap();
        }
        println!("overlapping step graphs: {step:?}");
    }
    replayable.synchronize().unwrap();
    let o = model.compare(&graphed, &overlapped, exact).unwrap();
    assert!(
        o.bitwise(),
        "the overlapping step graphs differ from per-runner replays: {o}"
    );
    replayable.replan().unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn round_robin_copy_stand_in_equals_eager() {
    let cuda = device();
    graphed_equals_eager(
        &cuda,
        &|| Ok(cuda.clone()),
        Reduce::StandIn,
        Policy::OverlapDepth(2).into(),
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn packed_copy_stand_in_equals_eager() {
    let cuda = device();
    graphed_equals_eager(
        &cuda,
        &|| Ok(cuda.clone()),
        Reduce::StandIn,
        Policy::OverlapDepth(2).packed(),
    );
}

#[cfg(feature = "nccl")]
#[test]
#[ignore = "needs a CUDA GPU"]
fn round_robin_nccl_symmetric_equals_eager() {
    use replay_arena::nccl::{self, Communicator, UniqueId};
    let cuda = device();
    let comm = Communicator::new(&cuda, model::TP_GROUP, &UniqueId::new().unwrap(), 0, 1).unwrap();
    graphed_equals_eager(
        &cuda,
        &|| nccl::Device::new(cuda.clone()).with_group(comm.clone()),
        Reduce::Nccl(comm.clone()),
        Policy::OverlapDepth(2).into(),
    );
}

#[test]
fn modules_run_from_the_last_layer_mlp_first() {
    let modules = Shape::SMALL.modules();
    let names: Vec<&str> = modules.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names.len(), 16);
    assert_eq!(
        names[..4],
        [
            "layer7.mlp",
            "layer7.attn_proj",
            "layer6.mlp",
            "layer6.attn_proj"
        ]
    );
    let mlp: Vec<(usize, usize)> = modules[0]
        .linears
        .iter()
        .map(|l| (l.inputs, l.outputs))
        .collect();
    assert_eq!(
        mlp,
        [(512, 2048), (2048, 512)],
        "fc1 then fc2, forward order"
    );
    assert_eq!(modules[1].linears[0].inputs, 512);
}

#[test]
fn a_step_is_two_gemms_per_linear() {
    let s = Shape::SMALL;
    let per_layer = (s.hidden * s.hidden + 2 * s.hidden * s.ffn) as f64;
    assert_eq!(
        s.flops(),
        4.0 * s.tokens as f64 * per_layer * s.layers as f64
    );
}

#[test]
fn a_matrix_past_cublas_sizes_is_a_typed_error() {
    let shape = Shape {
        ffn: 1 << 20,
        tokens: 4096,
        ..Shape::SMALL
    };
    assert!(matches!(shape.check(), Err(TpError::Shape(_))));
    let empty = Shape {
        layers: 0,
        ..Shape::SMALL
    };
    assert!(matches!(empty.check(), Err(TpError::Shape(_))));
    assert!(Shape::MID.check().is_ok());
}

#[test]
fn fc1_is_column_parallel_fc2_and_the_projection_row_parallel() {
    let modules = Shape::SMALL.modules();
    let splits: Vec<(&str, Split)> = modules[..2]
        .iter()
        .flat_map(|m| m.linears.iter().map(|l| (l.name, l.split)))
        .collect();
    assert_eq!(
        splits,
        [
            ("fc1", Split::Column),
            ("fc2", Split::Row),
            ("proj", Split::Row)
        ]
    );
}
