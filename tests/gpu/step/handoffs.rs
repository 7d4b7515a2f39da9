//! A framework-shaped backward on the GPU: per-layer graphs of ops that
//! allocate their outputs and drop their intermediates inside the capture
//! (graph memory nodes), passing each layer's input gradient to the next
//! layer's graph through a handoff marked ready right after the dgrad, and
//! replayed on two pool streams with consumers (a slow fold of each layer's
//! wgrad into an accumulator) on a third. Many steps, bit for bit equal to
//! the eager run, per layer and as one step graph (the layers' step copies
//! moved in) between per-layer steps before and after; the program waits
//! for everything through the crate, with no raw event call. Dropping the
//! plan gives the driver's graph memory back.
#![cfg(feature = "cuda")]

use crate::support;

use replay_arena::cuda;
use replay_arena::cuda::cudarc::driver::CudaSlice;
use replay_arena::cuda::ViewExt;
use replay_arena::{
    CaptureError, DType, Domain, PlacedPolicy, Policy, Request, RunnerId, StepError,
};
use support::gpu::backward::{self, Capture, Free, Model};

const N: usize = 1 << 18;
const LAYERS: usize = 6;
const STEPS: usize = 30;
/// Per-layer steps before and after a step graph's launches.
const AROUND: usize = 3;
const SPIN: i64 = 20_000;
const WGRAD: Request = Request::new(Domain::Device, DType::I32, N as u64);
const GRAD: Request = Request::new(Domain::Device, DType::I32, N as u64);

fn model() -> Model {
    Model::new(LAYERS, N, true)
}

/// `steps` eager steps on one stream: each layer's wgrads folded into its
/// accumulator.
fn eager(model: &Model, steps: usize) -> Vec<Vec<i32>> {
    let (s, ops) = (&model.fw.io, &model.fw.ops);
    let mut acc = model.zeros(LAYERS);
    model.eager(steps, true, Free::AfterReady, |l, wgrad| {
        ops.fold(s, &mut acc[l], wgrad, 0).unwrap()
    });
    model.read(&acc)
}

/// Discovery: each layer records its wgrad, receives the gradient the layer
/// before handed off, and hands its own off to the next.
fn discover() -> (replay_arena::Discovering, Vec<replay_arena::HandoffId>) {
    backward::discover(LAYERS, WGRAD, Some(GRAD), None)
}

/// One step graph, or two launched in turn on two streams.
#[derive(Clone, Copy, Debug)]
enum Overlap {
    No,
    Yes,
}

/// Per-layer graphs replayed per runner, or (`stepped`) compiled into one
/// step graph (or two overlapping) launched once per step.
fn graphed(
    model: &Model,
    strategy: PlacedPolicy,
    steps: usize,
    stepped: Option<Overlap>,
) -> Result<Vec<Vec<i32>>, StepError> {
    let copies = match stepped {
        Some(Overlap::Yes) => 2,
        _ => 1,
    };
    let b = &model.fw.backend;
    let (d, handoffs) = discover();
    let planned = d.plan(strategy).unwrap();
    // Captured twice: the layer's graph, and its step copy for a step
    // graph to move in (its graph allocates).
    let how = Capture::Repeatable {
        step_copies: copies,
        cut_across: false,
    };
    let mut replayable = model.sealed(planned, WGRAD, &handoffs, Free::AfterReady, how);
    let pool = [b.new_stream().unwrap(), b.new_stream().unwrap()];
    let (side, optimizer) = (b.new_stream().unwrap(), b.new_stream().unwrap());
    let mut acc = model.zeros(LAYERS);
    let per_layer = |replayable: &mut replay_arena::Replayable<cuda::Device>,
                     acc: &mut [CudaSlice<i32>],
                     steps: usize| {
        for _ in 0..steps {
            for (l, acc) in acc.iter_mut().enumerate() {
                let runner = RunnerId(l as u32);
                replayable.replay(runner, &pool[l % 2]).unwrap();
                replayable
                    .consume(runner, &side, |s, views| {
                        let w = views[0].as_cuda::<i32>(s).map_err(|e| e.to_string())?;
                        model.fw.ops.fold(s, acc, &w, SPIN)
                    })
                    .unwrap();
            }
        }
    };
    if let Some(overlap) = stepped {
        // Per layer before and after the step graph's life: the layers'
        // own graphs stay the plan's.
        per_layer(&mut replayable, &mut acc, AROUND);
        for l in 0..LAYERS {
            let (t, n) = replayable.temporaries(RunnerId(l as u32)).unwrap();
            assert!(
                t.allocations > 0 && n == copies,
                "layer {l}: {t:?}, {n} copies"
            );
        }
        // The handed-off op output is freed after the ready point: the
        // copies stay whole there (see below).
        for (l, &handoff) in handoffs.iter().enumerate() {
            let points = replayable.ready_points(RunnerId(l as u32)).unwrap();
            assert!(
                matches!(points, [(h, replay_arena::Cut::TemporariesAcross { bytes })]
                    if *h == handoff && *bytes == 4 * N as u64),
                "layer {l}: {points:?}"
            );
        }
        let mut step = replayable.step();
        for (l, acc) in acc.iter_mut().enumerate() {
            let runner = RunnerId(l as u32);
            step.replay(runner, &pool[l % 2]).unwrap();
            step.consume(runner, &side, |s, views| {
                let w = views[0].as_cuda::<i32>(s).map_err(|e| e.to_string())?;
                model.fw.ops.fold(s, acc, &w, SPIN)
            })
            .unwrap();
        }
        let mut graph = match overlap {
            Overlap::No => step.build()?,
            Overlap::Yes => step.build_overlapping()?,
        };
        // The op output handed off is freed after the ready point: a cut
        // there would pass it from one part to the next (several times the
        // graph memory, tests/gpu/step/graph_memory.rs), so each writer's
        // step copy stays whole, and says why.
        assert_eq!(graph.nodes(), LAYERS + LAYERS);
        for k in 0..steps {
            let launch = match overlap {
                Overlap::No => &pool[0],
                Overlap::Yes => &pool[k % 2],
            };
            graph.launch(launch).unwrap();
        }
        drop(graph);
        // The copies went into that step graph: a second one is refused.
        let mut again = replayable.step();
        let refused = again.replay(RunnerId(0), &pool[0]).unwrap_err();
        assert!(
            matches!(refused, replay_arena::StepError::NoStepCopy { captured, .. } if captured == copies),
            "{refused}"
        );
        drop(again);
        per_layer(&mut replayable, &mut acc, AROUND);
    } else {
        per_layer(&mut replayable, &mut acc, steps);
    }
    // The optimizer step: after every layer and every consumer.
    replayable.wait_all(&optimizer).unwrap();
    let out = acc
        .iter()
        .map(|a| optimizer.cudarc().clone_dtoh(a).unwrap())
        .collect();
    let report = replayable.report().unwrap();
    let memory = report.graph_memory.unwrap();
    assert!(
        memory.used > 0,
        "the graphs' temporaries live in the graph pool"
    );
    // Each layer allocates three N-element op outputs inside its graph.
    let temporaries = report.temporaries.unwrap();
    assert_eq!(temporaries.runners, LAYERS);
    assert_eq!(temporaries.largest, 3 * 4 * N as u64);
    assert_eq!(temporaries.total, LAYERS as u64 * 3 * 4 * N as u64);
    assert_eq!(temporaries.in_flight, 2 * 3 * 4 * N as u64);
    let left = if stepped.is_some() { 0 } else { copies as u64 };
    assert_eq!(temporaries.step_copies, left * temporaries.total);
    assert_eq!(report.handoffs, LAYERS - 1);
    let stats = replayable.fence_stats();
    if stepped.is_none() {
        assert_eq!(stats.replays, (steps * LAYERS) as u64);
    }
    println!("{strategy:?}: {stats:?}\n{report}");
    Ok(out)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn per_layer_graphs_with_handoffs_and_temporaries_equal_eager_over_many_steps() {
    let model = model();
    let eager = eager(&model, STEPS);
    for strategy in [
        Policy::OverlapDepth(2).round_robin(),
        Policy::OverlapDepth(2).packed(),
    ] {
        let got = graphed(&model, strategy, STEPS, None).unwrap();
        let differ = backward::differing(&got, &eager);
        assert_eq!(
            differ, 0,
            "{strategy:?}: {differ} elements differ from eager"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_framework_backward_as_one_step_graph_is_exact() {
    let model = model();
    let eager = eager(&model, STEPS + 2 * AROUND);
    for (strategy, overlap) in [
        (Policy::OverlapDepth(2).round_robin(), Overlap::No),
        (Policy::OverlapDepth(2).packed(), Overlap::No),
        (Policy::OverlapDepth(2).round_robin(), Overlap::Yes),
        (Policy::OverlapDepth(2).packed(), Overlap::Yes),
    ] {
        match graphed(&model, strategy, STEPS, Some(overlap)) {
            Ok(got) => assert_eq!(
                got, eager,
                "{strategy:?}, {overlap:?}: the step graph differs from eager"
            ),
            // Only a driver older than CUDA 12.9 may refuse to move a graph
            // with temporaries in, and the error says so.
            Err(StepError::Backend(failure)) if model.fw.backend.info().driver_version < 12090 => {
                assert!(failure.error.to_string().contains("CUDA 12.9"), "{failure}");
            }
            Err(e) => panic!("{strategy:?}: {e}"),
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn dropping_a_plan_with_temporaries_gives_the_graph_memory_back() {
    let model = model();
    let b = &model.fw.backend;
    b.trim_graph_memory().unwrap();
    let start = b.graph_memory_in_use().unwrap();
    let reserved_while_alive;
    {
        let (d, handoffs) = discover();
        let planned = d.plan(Policy::OverlapDepth(2)).unwrap();
        let mut replayable =
            model.sealed(planned, WGRAD, &handoffs, Free::AfterReady, Capture::Once);
        let pool = [b.new_stream().unwrap(), b.new_stream().unwrap()];
        for _ in 0..3 {
            for l in 0..LAYERS {
                replayable.replay(RunnerId(l as u32), &pool[l % 2]).unwrap();
            }
        }
        replayable.synchronize().unwrap();
        reserved_while_alive = b.graph_memory_in_use().unwrap().reserved;
        assert!(
            reserved_while_alive >= start.reserved + 3 * 4 * N as u64,
            "{start:?} -> {reserved_while_alive}"
        );
    } // dropped: waits, frees the graphs, trims
    let after = b.graph_memory_in_use().unwrap();
    println!(
        "graph memory reserved: {} before the plan, {} while it replayed, {} after its drop",
        start.reserved, reserved_while_alive, after.reserved
    );
    assert!(
        after.reserved < reserved_while_alive && after.reserved <= start.reserved,
        "the driver still reserves {after:?} after the plan's drop ({reserved_while_alive} while alive)"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_layer_whose_op_output_escapes_its_graph_is_a_typed_error() {
    let model = model();
    let (d, handoffs) = discover();
    let mut capturing = d
        .plan(Policy::OverlapDepth(2))
        .unwrap()
        .allocate(model.fw.backend.clone())
        .unwrap();
    let s = model.fw.backend.new_stream().unwrap();
    let cap = capturing.capture(RunnerId(0)).unwrap();
    let wgrad = cap.take(WGRAD).unwrap();
    let _out = cap.hand_off(handoffs[0]).unwrap();
    let mut kept = None;
    cap.stream_capture(&s, |s| {
        let mut w = wgrad.as_cuda::<i32>(s).map_err(|e| e.to_string())?;
        // The framework keeps an op's output past the graph (a cached
        // activation, say): the allocation escapes.
        let t = model
            .fw
            .ops
            .mix2(s, &model.layers.loss, &model.layers.weights[0], 9)?;
        model.fw.ops.copy_into(s, &t, &mut w)?;
        kept = Some(t);
        Ok::<(), String>(())
    })
    .unwrap();
    let err = cap.finish().unwrap_err();
    assert!(
        matches!(&err, CaptureError::GraphRejected { runner: RunnerId(0), reason }
            if reason.to_string().contains(&format!("of {} bytes", N * 4))),
        "{err}"
    );
    // Destroyed without a launch: the allocation never got memory.
    std::mem::forget(kept);
}

/// The framework-shaped backward of this file is written through the
/// public API alone: no `unsafe` in it (the op library it calls is the
/// framework's own code).
#[test]
fn this_file_has_no_unsafe_code() {
    // This file and the backward it runs.
    let source = [
        include_str!("handoffs.rs"),
        include_str!("../../support/gpu/backward.rs"),
    ]
    .concat();
    // `unsafe` as a keyword: a block, fn, impl or trait (spelled in
    // pieces so that this test does not find itself).
    let keyword = ["un", "safe"].concat();
    let needles: Vec<String> = [" {", " fn", " impl", " trait", " extern"]
        .iter()
        .map(|after| format!("{keyword}{after}"))
        .collect();
    let hits: Vec<&str> = source
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .filter(|l| needles.iter().any(|n| l.contains(n.as_str())))
        .collect();
    assert!(hits.is_empty(), "{hits:?}");
}
