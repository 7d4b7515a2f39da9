//! What the driver reserves for a plan's graphs (`cuDeviceGetGraphMemAttribute`,
//! reserved, after trimming what no graph uses): the per-layer graphs of a
//! framework-shaped backward whose ops allocate their outputs inside the
//! capture, against one step graph of their step copies, in every shape
//! that decides it: where a layer frees the temporary that spans its ready
//! point (before or after it), whether the layers hand off at all (cut
//! copies or whole ones), and whether the step runs on one stream or two.
//!
//! Measured on an H200 (driver 580.159.04), five layers, reserved MiB
//! (per-layer graphs launched once each / then the step graph too / the
//! step graph alone), before the crate kept copies whole where a temporary
//! lives across a ready point:
//!
//! | temporary | copies | dx freed | streams | per-layer | + step | alone |
//! |---|---|---|---:|---:|---:|---:|
//! | 16 MiB | whole | any | 1 | 32 | 64 | 64 |
//! | 16 MiB | whole | any | 2 | 64 | 128 | 128 |
//! | 16 MiB | cut | before ready | 1 or 2 | 32, 64 | 64, 128 | 64, 128 |
//! | 16 MiB | cut | after ready | 1 or 2 | 32, 64 | **320** | **320** |
//! | 64 MiB | whole | any | 1 | 128 | 160 | 160 |
//! | 64 MiB | whole | any | 2 | 256 | 320 | 320 |
//! | 64 MiB | cut | after ready | 1 or 2 | 128, 256 | **928** | **928** |
//!
//! So a temporary passed from one cut part to the next is what multiplies
//! the step graph's graph memory (by 5 to 7); cut parts that pass none, and
//! whole copies, cost the per-layer graphs' memory plus one granule of the
//! driver's graph pool per stream the step runs on. The step graph and the
//! per-layer graphs share physical memory (launched both, the driver
//! reserves what the larger needs).
#![cfg(feature = "cuda")]

use crate::support;
use crate::support::capture_view;

use replay_arena::backend::Streams;
use replay_arena::cuda;
use replay_arena::cuda::cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use replay_arena::cuda::ViewExt;
use replay_arena::{DType, Discovering, Domain, HandoffId, PlanConfig, Policy, Request, RunnerId};
use support::ops::{Framework, Layers, OpResult};

const LAYERS: usize = 5;
const MIB: u64 = 1 << 20;

/// Where a layer frees the op output it hands off (`dx`).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Free {
    /// Before its ready point: no temporary spans a cut.
    BeforeReady,
    /// After it, as a framework's autograd does: the temporary spans the cut.
    AfterReady,
}

#[derive(Clone, Copy, Debug)]
struct Shape {
    n: usize,
    free: Free,
    handoffs: bool,
    streams: usize,
}

struct Model {
    fw: Framework,
    layers: Layers,
}

impl Model {
    fn new(n: usize) -> Model {
        let fw = Framework::new();
        let layers = Layers::new(&fw, LAYERS, n, false);
        Model { fw, layers }
    }

    /// One layer: three op outputs allocated in the capture (`t1`, `dx`,
    /// `t3`), `dx` copied into the handoff, the ready point, the wgrad.
    #[allow(clippy::too_many_arguments)]
    fn layer<O: DevicePtrMut<i32>>(
        &self,
        s: &cuda::Stream,
        l: usize,
        g_in: &impl DevicePtr<i32>,
        dx_out: Option<&mut O>,
        wgrad: &mut impl DevicePtrMut<i32>,
        free: Free,
        ready: impl FnOnce(&cuda::Stream) -> OpResult<()>,
    ) -> OpResult<()> {
        let w = &self.layers.weights[l];
        let t1 = self.fw.ops.mix2(s, g_in, w, 1)?;
        let dx = self.fw.ops.mix2(s, &t1, w, 2)?;
        drop(t1);
        if let Some(out) = dx_out {
            self.fw.ops.copy_into(s, &dx, out)?;
        }
        let dx = match free {
            Free::BeforeReady => {
                drop(dx);
                None
            }
            Free::AfterReady => Some(dx),
        };
        ready(s)?;
        drop(dx);
        let t3 = self.fw.ops.mix2(s, g_in, w, 3)?;
        self.fw.ops.mix2_into(s, wgrad, &t3, w, 4)?;
        drop(t3);
        Ok(())
    }
}

fn discover(shape: Shape) -> (Discovering, Vec<HandoffId>) {
    let req = Request::new(Domain::Device, DType::I32, shape.n as u64);
    let mut d = Discovering::new(PlanConfig::new());
    let mut handoffs = Vec::new();
    for l in 0..LAYERS {
        let mut armed = d.arm(RunnerId(l as u32)).unwrap();
        armed.record(req).unwrap();
        if shape.handoffs && l > 0 {
            armed.receive(handoffs[l - 1]).unwrap();
        }
        if shape.handoffs && l + 1 < LAYERS {
            handoffs.push(armed.hand_off(req).unwrap());
        }
    }
    (d, handoffs)
}

/// The driver's reserved graph memory above `base`, in bytes.
fn reserved_above(b: &cuda::Device, base: u64) -> u64 {
    b.graph_memory_in_use()
        .unwrap()
        .reserved
        .saturating_sub(base)
}

/// Each layer's wgrad after one eager backward (on one stream, the ops
/// allocating and freeing as they go).
fn eager(model: &Model, shape: Shape) -> Vec<Vec<i32>> {
    let s = &model.fw.io;
    let mut grads: Vec<CudaSlice<i32>> = (0..LAYERS)
        .map(|_| s.cudarc().alloc_zeros(shape.n).unwrap())
        .collect();
    let mut out = Vec::new();
    for l in 0..LAYERS {
        let mut wgrad: CudaSlice<i32> = s.cudarc().alloc_zeros(shape.n).unwrap();
        let (before, rest) = grads.split_at_mut(l);
        let dx = (shape.handoffs && l + 1 < LAYERS).then_some(&mut rest[0]);
        let ok = |_: &cuda::Stream| Ok(());
        match before.last().filter(|_| shape.handoffs) {
            None => model.layer(s, l, &model.layers.loss, dx, &mut wgrad, shape.free, ok),
            Some(g_in) => model.layer(s, l, g_in, dx, &mut wgrad, shape.free, ok),
        }
        .unwrap();
        out.push(s.cudarc().clone_dtoh(&wgrad).unwrap());
    }
    out
}

/// What one plan of a single runner with one small temporary reserves: the
/// granule the driver's graph pool grows by.
fn granule(model: &Model) -> u64 {
    let b = &model.fw.backend;
    let req = Request::new(Domain::Device, DType::I32, 256);
    b.synchronize().unwrap();
    b.trim_graph_memory().unwrap();
    let base = b.graph_memory_in_use().unwrap().reserved;
    let planned = Discovering::from_runners(PlanConfig::new(), [(RunnerId(0), [req])])
        .unwrap()
        .plan(Policy::Generations(1))
        .unwrap();
    let mut capturing = planned.allocate(b.clone()).unwrap();
    let s = b.new_stream().unwrap();
    capture_view(&mut capturing, RunnerId(0), req, &s, |s, out| {
        let mut out = out.as_cuda::<i32>(s).map_err(|e| e.to_string())?;
        let t = s
            .cudarc()
            .alloc_zeros::<i32>(256)
            .map_err(|e| format!("{e:?}"))?;
        model.fw.ops.copy_into(s, &t, &mut out)
    });
    let mut rp = capturing.seal().unwrap();
    rp.replay(RunnerId(0), &s).unwrap();
    rp.synchronize().unwrap();
    let granule = reserved_above(b, base);
    drop(rp);
    granule
}

/// The five layers of `shape`, discovered, planned (a generation per
/// layer: every layer's wgrad stays readable after a step; the arenas are
/// not graph memory), captured with a step copy each, and sealed.
fn sealed(model: &Model, shape: Shape) -> replay_arena::Replayable<cuda::Device> {
    let b = &model.fw.backend;
    let req = Request::new(Domain::Device, DType::I32, shape.n as u64);
    let (d, handoffs) = discover(shape);
    let planned = d.plan(Policy::Generations(LAYERS)).unwrap();
    let mut capturing = planned.allocate(b.clone()).unwrap();
    let capture_stream = b.new_stream().unwrap();
    for l in 0..LAYERS {
        let cap = capturing.capture(RunnerId(l as u32)).unwrap();
        let wgrad = cap.take(req).unwrap();
        let has_in = shape.handoffs && l > 0;
        let has_out = shape.handoffs && l + 1 < LAYERS;
        let input = has_in.then(|| cap.receive(handoffs[l - 1]).unwrap());
        let output = has_out.then(|| (handoffs[l], cap.hand_off(handoffs[l]).unwrap()));
        cap.step_copies(1);
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
                None => model.layer(
                    s,
                    l,
                    &model.layers.loss,
                    out.as_mut(),
                    &mut wgrad,
                    shape.free,
                    ready,
                ),
                Some(v) => {
                    let g_in = v.as_cuda::<i32>(s).map_err(|e| e.to_string())?;
                    model.layer(s, l, &g_in, out.as_mut(), &mut wgrad, shape.free, ready)
                }
            }
        })
        .unwrap();
        cap.finish().unwrap();
    }
    capturing.seal().unwrap()
}

/// (per-layer graphs launched once each, then the step graph built and
/// launched once too, the step graph alone in a fresh plan): reserved
/// bytes; the step graph's node count; each layer's wgrad after the step.
fn measure(model: &Model, shape: Shape) -> (u64, u64, u64, usize, Vec<Vec<i32>>) {
    let b = &model.fw.backend;
    let run = |per_layer_first: bool| {
        b.synchronize().unwrap();
        b.trim_graph_memory().unwrap();
        let base = b.graph_memory_in_use().unwrap().reserved;
        let mut rp = sealed(model, shape);
        let pool: Vec<cuda::Stream> = (0..shape.streams)
            .map(|_| b.new_stream().unwrap())
            .collect();
        let mut per_layer = 0;
        if per_layer_first {
            for l in 0..LAYERS {
                rp.replay(RunnerId(l as u32), &pool[l % shape.streams])
                    .unwrap();
            }
            rp.wait_all(&model.fw.io).unwrap();
            model.fw.io.synchronize().unwrap();
            per_layer = reserved_above(b, base);
        }
        let mut step = rp.step();
        for l in 0..LAYERS {
            step.replay(RunnerId(l as u32), &pool[l % shape.streams])
                .unwrap();
        }
        let mut graph = step.build().unwrap();
        let nodes = graph.nodes();
        graph.launch(&pool[0]).unwrap();
        drop(graph);
        rp.wait_all(&model.fw.io).unwrap();
        model.fw.io.synchronize().unwrap();
        let after = reserved_above(b, base);
        let wgrads = (0..LAYERS)
            .map(|l| {
                let mut host = model.fw.io.cudarc().alloc_zeros::<i32>(shape.n).unwrap();
                rp.consume(RunnerId(l as u32), &model.fw.io, |s, views| {
                    let w = views[0].as_cuda::<i32>(s).map_err(|e| e.to_string())?;
                    model.fw.ops.copy_into(s, &w, &mut host)
                })
                .unwrap();
                model.fw.io.synchronize().unwrap();
                model.fw.io.cudarc().clone_dtoh(&host).unwrap()
            })
            .collect();
        drop(rp);
        b.synchronize().unwrap();
        (per_layer, after, nodes, wgrads)
    };
    let (per_layer, both, nodes, _) = run(true);
    let (_, step_alone, _, wgrads) = run(false);
    (per_layer, both, step_alone, nodes, wgrads)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_plans_teardown_trim_leaves_another_plans_idle_graphs_with_temporaries_working() {
    // The trim at a plan's teardown (`cuDeviceGraphMemTrim`) is for the whole
    // device: another plan's idle graphs, whose temporaries' memory it may
    // take back, must map it again at their next launch and run exactly.
    let shape = Shape {
        n: 1 << 20,
        free: Free::AfterReady,
        handoffs: true,
        streams: 2,
    };
    let model = Model::new(shape.n);
    let b = &model.fw.backend;
    let s = b.new_stream().unwrap();
    let wgrads = |rp: &mut replay_arena::Replayable<cuda::Device>| -> Vec<Vec<i32>> {
        for l in 0..LAYERS {
            rp.replay(RunnerId(l as u32), &s).unwrap();
        }
        (0..LAYERS)
            .map(|l| {
                let mut host = model.fw.io.cudarc().alloc_zeros::<i32>(shape.n).unwrap();
                rp.consume(RunnerId(l as u32), &model.fw.io, |s, views| {
                    let w = views[0].as_cuda::<i32>(s).map_err(|e| e.to_string())?;
                    model.fw.ops.copy_into(s, &w, &mut host)
                })
                .unwrap();
                model.fw.io.synchronize().unwrap();
                model.fw.io.cudarc().clone_dtoh(&host).unwrap()
            })
            .collect()
    };
    let mut kept = sealed(&model, shape);
    let before = wgrads(&mut kept);
    assert_eq!(before, eager(&model, shape));
    for _ in 0..3 {
        let mut other = sealed(&model, shape);
        wgrads(&mut other);
        drop(other); // waits, frees its graphs, trims the device
        b.trim_graph_memory().unwrap();
        assert_eq!(
            wgrads(&mut kept),
            before,
            "after another plan's teardown trim"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_step_graph_holds_no_more_graph_memory_than_its_per_layer_graphs() {
    let mut rows = Vec::new();
    let mut over = Vec::new();
    for n in [1usize << 22, 1 << 24] {
        let model = Model::new(n);
        let granule = granule(&model);
        println!("the driver's graph pool grows by {} MiB", granule / MIB);
        for handoffs in [false, true] {
            for free in [Free::BeforeReady, Free::AfterReady] {
                for streams in [1, 2] {
                    let shape = Shape {
                        n,
                        free,
                        handoffs,
                        streams,
                    };
                    let (per, both, alone, nodes, wgrads) = measure(&model, shape);
                    assert_eq!(
                        wgrads,
                        eager(&model, shape),
                        "{shape:?}: differs from eager"
                    );
                    // A writer is cut at its ready point only where no
                    // temporary lives across it.
                    let cut = shape.handoffs && shape.free == Free::BeforeReady;
                    let writers = if cut { LAYERS - 1 } else { 0 };
                    assert_eq!(nodes, LAYERS + writers, "{shape:?}");
                    // At most the per-layer graphs' memory and one granule
                    // per stream the step runs on.
                    if both > per + granule * shape.streams as u64 || alone > both {
                        over.push(format!("{shape:?}: {per} -> {both} (alone {alone})"));
                    }
                    rows.push(format!(
                        "| {} MiB | {} | {:?} | {} | {} | {} | {} | {} |",
                        4 * n as u64 / MIB,
                        if handoffs { "cut" } else { "whole" },
                        free,
                        streams,
                        nodes,
                        per / MIB,
                        both / MIB,
                        alone / MIB,
                    ));
                }
            }
        }
    }
    println!(
        "| temporary | copies | dx freed | streams | step nodes | per-layer graphs MiB | \
         + step graph MiB | step graph alone MiB |"
    );
    println!("|---|---|---|---:|---:|---:|---:|---:|");
    for r in rows {
        println!("{r}");
    }
    assert!(
        over.is_empty(),
        "step graphs over their per-layer graphs' memory: {over:#?}"
    );
}
