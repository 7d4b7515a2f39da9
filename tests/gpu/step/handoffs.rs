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
use replay_arena::cuda::cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use replay_arena::cuda::ViewExt;
use replay_arena::{
    CaptureError, DType, Discovering, Domain, HandoffId, PlacedPolicy, PlanConfig, Policy, Request,
    RunnerId, StepError,
};
use support::ops::{Framework, Layers, OpResult};

const N: usize = 1 << 18;
const LAYERS: usize = 6;
const STEPS: usize = 30;
/// Per-layer steps before and after a step graph's launches.
const AROUND: usize = 3;
const SPIN: i64 = 20_000;
const WGRAD: Request = Request::new(Domain::Device, DType::I32, N as u64);
const GRAD: Request = Request::new(Domain::Device, DType::I32, N as u64);

struct Model {
    fw: Framework,
    layers: Layers,
}

impl Model {
    fn new() -> Model {
        let fw = Framework::new();
        let layers = Layers::new(&fw, LAYERS, N, true);
        Model { fw, layers }
    }

    /// Layer `l`'s backward, as a framework writes it: every op allocates
    /// its output; the input gradient goes into `dx_out` (the next layer's
    /// input), then `ready` is called, then the wgrad is computed into
    /// `wgrad`.
    #[allow(clippy::too_many_arguments)]
    fn layer<O: DevicePtrMut<i32>>(
        &self,
        s: &cuda::Stream,
        l: usize,
        g_in: &impl DevicePtr<i32>,
        dx_out: Option<&mut O>,
        wgrad: &mut impl DevicePtrMut<i32>,
        ready: impl FnOnce(&cuda::Stream) -> OpResult<()>,
    ) -> OpResult<()> {
        let (w, x) = (&self.layers.weights[l], &self.layers.inputs[l]);
        let t1 = self.fw.ops.mix2(s, g_in, w, 1)?;
        let dx = self.fw.ops.mix2(s, &t1, w, 2)?;
        drop(t1);
        if let Some(out) = dx_out {
            self.fw.ops.copy_into(s, &dx, out)?;
        }
        ready(s)?;
        // Freed after the ready point: in a step copy cut there, the
        // allocation is in the first part and the free in the second.
        drop(dx);
        let t3 = self.fw.ops.mix2(s, g_in, x, 3)?;
        self.fw.ops.mix2_into(s, wgrad, &t3, x, 4)?;
        drop(t3);
        Ok(())
    }

    fn accumulators(&self) -> Vec<CudaSlice<i32>> {
        let acc = (0..LAYERS)
            .map(|_| self.fw.io.cudarc().alloc_zeros(N).unwrap())
            .collect();
        self.fw.io.synchronize().unwrap();
        acc
    }

    /// `steps` eager steps on one stream.
    fn eager(&self, steps: usize) -> Vec<Vec<i32>> {
        let s = &self.fw.io;
        let mut acc = self.accumulators();
        let mut grads: Vec<CudaSlice<i32>> = (0..LAYERS)
            .map(|_| s.cudarc().alloc_zeros(N).unwrap())
            .collect();
        for _ in 0..steps {
            for (l, acc) in acc.iter_mut().enumerate() {
                let mut wgrad: CudaSlice<i32> = s.cudarc().alloc_zeros(N).unwrap();
                let (before, rest) = grads.split_at_mut(l);
                let out = (l + 1 < LAYERS).then_some(&mut rest[0]);
                let ok = |_: &cuda::Stream| Ok(());
                match before.last() {
                    None => self.layer(s, l, &self.layers.loss, out, &mut wgrad, ok),
                    Some(g_in) => self.layer(s, l, g_in, out, &mut wgrad, ok),
                }
                .unwrap();
                self.fw.ops.fold(s, acc, &wgrad, 0).unwrap();
            }
        }
        acc.iter()
            .map(|a| s.cudarc().clone_dtoh(a).unwrap())
            .collect()
    }
}

/// Discovery: each layer records its wgrad, receives the gradient the layer
/// before handed off, and hands its own off to the next.
fn discover() -> (Discovering, Vec<HandoffId>) {
    let mut d = Discovering::new(PlanConfig::new());
    let mut handoffs = Vec::new();
    for l in 0..LAYERS {
        let mut armed = d
            .arm_named(RunnerId(l as u32), format!("layer{l}.bwd"))
            .unwrap();
        armed.record(WGRAD).unwrap();
        if l > 0 {
            armed.receive(handoffs[l - 1]).unwrap();
        }
        if l + 1 < LAYERS {
            handoffs.push(armed.hand_off(GRAD).unwrap());
        }
    }
    (d, handoffs)
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
    let mut capturing = planned.allocate(b.clone()).unwrap();
    let capture_stream = b.new_stream().unwrap();
    for l in 0..LAYERS {
        let cap = capturing.capture(RunnerId(l as u32)).unwrap();
        let wgrad = cap.take(WGRAD).unwrap();
        let input = (l > 0).then(|| cap.receive(handoffs[l - 1]).unwrap());
        let output = (l + 1 < LAYERS).then(|| (handoffs[l], cap.hand_off(handoffs[l]).unwrap()));
        // Captured twice: the layer's graph, and its step copy for a step
        // graph to move in (its graph allocates).
        cap.step_copies(copies);
        cap.stream_capture_repeatable(&capture_stream, |s| {
            let mut wgrad = wgrad.as_cuda::<i32>(s).map_err(|e| e.to_string())?;
            let mut out = output
                .map(|(_, v)| v.as_cuda::<i32>(s))
                .transpose()
                .map_err(|e| e.to_string())?;
            let ready = |s: &cuda::Stream| match output {
                Some((h, _)) => cap.ready(h, s).map_err(|e| e.to_string()),
                None => Ok(()),
            };
            match input {
                None => model.layer(s, l, &model.layers.loss, out.as_mut(), &mut wgrad, ready),
                Some(v) => {
                    let g_in = v.as_cuda::<i32>(s).map_err(|e| e.to_string())?;
                    model.layer(s, l, &g_in, out.as_mut(), &mut wgrad, ready)
                }
            }
        })
        .unwrap();
        cap.finish().unwrap();
    }
    let mut replayable = capturing.seal().unwrap();
    let pool = [b.new_stream().unwrap(), b.new_stream().unwrap()];
    let (side, optimizer) = (b.new_stream().unwrap(), b.new_stream().unwrap());
    let mut acc = model.accumulators();
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
    let model = Model::new();
    let eager = model.eager(STEPS);
    for strategy in [
        Policy::OverlapDepth(2).round_robin(),
        Policy::OverlapDepth(2).packed(),
    ] {
        let got = graphed(&model, strategy, STEPS, None).unwrap();
        let differ: usize = got
            .iter()
            .zip(&eager)
            .map(|(a, b)| a.iter().zip(b).filter(|(x, y)| x != y).count())
            .sum();
        assert_eq!(
            differ, 0,
            "{strategy:?}: {differ} elements differ from eager"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_framework_backward_as_one_step_graph_is_exact() {
    let model = Model::new();
    let eager = model.eager(STEPS + 2 * AROUND);
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
    let model = Model::new();
    let b = &model.fw.backend;
    b.trim_graph_memory().unwrap();
    let start = b.graph_memory_in_use().unwrap();
    let reserved_while_alive;
    {
        let (d, handoffs) = discover();
        let mut capturing = d
            .plan(Policy::OverlapDepth(2))
            .unwrap()
            .allocate(b.clone())
            .unwrap();
        let s = b.new_stream().unwrap();
        for l in 0..LAYERS {
            let cap = capturing.capture(RunnerId(l as u32)).unwrap();
            let wgrad = cap.take(WGRAD).unwrap();
            let input = (l > 0).then(|| cap.receive(handoffs[l - 1]).unwrap());
            let output = (l + 1 < LAYERS).then(|| cap.hand_off(handoffs[l]).unwrap());
            cap.stream_capture(&s, |s| {
                let mut w = wgrad.as_cuda::<i32>(s).map_err(|e| e.to_string())?;
                let mut out = output
                    .map(|v| v.as_cuda::<i32>(s))
                    .transpose()
                    .map_err(|e| e.to_string())?;
                let ok = |_: &cuda::Stream| Ok(());
                match input {
                    None => model.layer(s, l, &model.layers.loss, out.as_mut(), &mut w, ok),
                    Some(v) => {
                        let g = v.as_cuda::<i32>(s).map_err(|e| e.to_string())?;
                        model.layer(s, l, &g, out.as_mut(), &mut w, ok)
                    }
                }
            })
            .unwrap();
            cap.finish().unwrap();
        }
        let mut replayable = capturing.seal().unwrap();
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
    let model = Model::new();
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
    let source = include_str!("handoffs.rs");
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
