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
use replay_arena::cuda::ViewExt;
use replay_arena::{DType, Domain, Policy, Replayable, Request, RunnerId};
use support::gpu::allocate;
use support::gpu::backward::{self, Capture, Free, Model};

const LAYERS: usize = 5;
const MIB: u64 = 1 << 20;

#[derive(Clone, Copy, Debug)]
struct Shape {
    n: usize,
    free: Free,
    handoffs: bool,
    streams: usize,
    /// Copies cut across the temporaries (`cut_across_temporaries`).
    cut_across: bool,
}

fn model(n: usize) -> Model {
    Model::new(LAYERS, n, false)
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
    let io = &model.fw.io;
    let mut out = Vec::new();
    model.eager(1, shape.handoffs, shape.free, |_, wgrad| {
        out.push(io.cudarc().clone_dtoh(wgrad).unwrap())
    });
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
    let mut capturing = allocate(b, [(RunnerId(0), [req])], Policy::Generations(1));
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
fn sealed(model: &Model, shape: Shape) -> Replayable<cuda::Device> {
    let req = Request::new(Domain::Device, DType::I32, shape.n as u64);
    let grad = shape.handoffs.then_some(req);
    let (d, handoffs) = backward::discover(LAYERS, req, grad, None);
    let planned = d.plan(Policy::Generations(LAYERS)).unwrap();
    let how = Capture::Repeatable {
        step_copies: 1,
        cut_across: shape.cut_across,
    };
    model.sealed(planned, req, &handoffs, shape.free, how)
}

/// Each layer's wgrad, read through a consumer on `io`.
fn wgrads(model: &Model, rp: &mut Replayable<cuda::Device>) -> Vec<Vec<i32>> {
    let io = &model.fw.io;
    (0..LAYERS)
        .map(|l| {
            let mut host = io.cudarc().alloc_zeros::<i32>(model.n).unwrap();
            rp.consume(RunnerId(l as u32), io, |s, views| {
                let w = views[0].as_cuda::<i32>(s).map_err(|e| e.to_string())?;
                model.fw.ops.copy_into(s, &w, &mut host)
            })
            .unwrap();
            io.synchronize().unwrap();
            io.cudarc().clone_dtoh(&host).unwrap()
        })
        .collect()
}

/// One shape's graph memory, bytes, each as (what the driver reserved,
/// what the crate estimated): the per-layer graphs launched once each on
/// the shape's streams, then the step graph built and launched once too
/// (the device holds the larger share, so the estimate is the larger of
/// the plan's and the step graph's), and the step graph alone in a fresh
/// plan; the step graph's node count; each layer's wgrad after the step.
struct Measured {
    per_layer: (u64, u64),
    both: (u64, u64),
    alone: (u64, u64),
    nodes: usize,
    wgrads: Vec<Vec<i32>>,
}

fn measure(model: &Model, shape: Shape) -> Measured {
    let b = &model.fw.backend;
    let run = |per_layer_first: bool| {
        b.synchronize().unwrap();
        b.trim_graph_memory().unwrap();
        let base = b.graph_memory_in_use().unwrap().reserved;
        let mut rp = sealed(model, shape);
        let pool: Vec<cuda::Stream> = (0..shape.streams)
            .map(|_| b.new_stream().unwrap())
            .collect();
        let plan_estimate = rp.graph_memory(shape.streams).unwrap().bytes;
        let mut per_layer = (0, plan_estimate);
        if per_layer_first {
            for l in 0..LAYERS {
                rp.replay(RunnerId(l as u32), &pool[l % shape.streams])
                    .unwrap();
            }
            rp.wait_all(&model.fw.io).unwrap();
            model.fw.io.synchronize().unwrap();
            per_layer.0 = reserved_above(b, base);
        }
        let mut step = rp.step();
        for l in 0..LAYERS {
            step.replay(RunnerId(l as u32), &pool[l % shape.streams])
                .unwrap();
        }
        let mut graph = step.build().unwrap();
        let nodes = graph.nodes();
        let step_estimate = graph.graph_memory().unwrap().bytes;
        graph.launch(&pool[0]).unwrap();
        drop(graph);
        rp.wait_all(&model.fw.io).unwrap();
        model.fw.io.synchronize().unwrap();
        let after = reserved_above(b, base);
        let estimate = match per_layer_first {
            true => step_estimate.max(plan_estimate),
            false => step_estimate,
        };
        let wgrads = wgrads(model, &mut rp);
        drop(rp);
        b.synchronize().unwrap();
        (per_layer, (after, estimate), nodes, wgrads)
    };
    let (per_layer, both, nodes, _) = run(true);
    let (_, alone, _, wgrads) = run(false);
    Measured {
        per_layer,
        both,
        alone,
        nodes,
        wgrads,
    }
}

/// Every shape at both sizes, measured, each checked bitwise against
/// eager; and the granule the driver's pool grows by, per size.
fn sweep() -> (Vec<u64>, Vec<(Shape, Measured)>) {
    let (mut granules, mut rows) = (Vec::new(), Vec::new());
    for n in [1usize << 22, 1 << 24] {
        let model = model(n);
        granules.push(granule(&model));
        for handoffs in [false, true] {
            for free in [Free::BeforeReady, Free::AfterReady] {
                for streams in [1, 2] {
                    let shape = Shape {
                        n,
                        free,
                        handoffs,
                        streams,
                        cut_across: false,
                    };
                    let m = measure(&model, shape);
                    assert_eq!(
                        m.wgrads,
                        eager(&model, shape),
                        "{shape:?}: differs from eager"
                    );
                    rows.push((shape, m));
                }
            }
        }
    }
    (granules, rows)
}

/// A row of the tables: the shape, then `figures` in MiB.
fn row(shape: Shape, figures: &[String]) -> String {
    format!(
        "| {} MiB | {} | {:?} | {} | {} |",
        4 * shape.n as u64 / MIB,
        if shape.handoffs { "cut" } else { "whole" },
        shape.free,
        shape.streams,
        figures.join(" | "),
    )
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
        cut_across: false,
    };
    let model = model(shape.n);
    let b = &model.fw.backend;
    let s = b.new_stream().unwrap();
    let replayed = |rp: &mut Replayable<cuda::Device>| -> Vec<Vec<i32>> {
        for l in 0..LAYERS {
            rp.replay(RunnerId(l as u32), &s).unwrap();
        }
        wgrads(&model, rp)
    };
    let mut kept = sealed(&model, shape);
    let before = replayed(&mut kept);
    assert_eq!(before, eager(&model, shape));
    for _ in 0..3 {
        let mut other = sealed(&model, shape);
        replayed(&mut other);
        drop(other); // waits, frees its graphs, trims the device
        b.trim_graph_memory().unwrap();
        assert_eq!(
            replayed(&mut kept),
            before,
            "after another plan's teardown trim"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_step_graph_holds_no_more_graph_memory_than_its_per_layer_graphs() {
    let (granules, measured) = sweep();
    let granule = granules[0];
    println!("the driver's graph pool grows by {} MiB", granule / MIB);
    let mut over = Vec::new();
    println!(
        "| temporary | copies | dx freed | streams | step nodes | per-layer graphs MiB | \
         + step graph MiB | step graph alone MiB |"
    );
    println!("|---|---|---|---:|---:|---:|---:|---:|");
    for (shape, m) in measured {
        // A writer is cut at its ready point only where no temporary lives
        // across it.
        let cut = shape.handoffs && shape.free == Free::BeforeReady;
        let writers = if cut { LAYERS - 1 } else { 0 };
        assert_eq!(m.nodes, LAYERS + writers, "{shape:?}");
        // At most the per-layer graphs' memory and one granule per stream
        // the step runs on.
        let (per, both, alone) = (m.per_layer.0, m.both.0, m.alone.0);
        if both > per + granule * shape.streams as u64 || alone > both {
            over.push(format!("{shape:?}: {per} -> {both} (alone {alone})"));
        }
        let figures = [m.nodes as u64, per / MIB, both / MIB, alone / MIB];
        println!("{}", row(shape, &figures.map(|f| f.to_string())));
    }
    assert!(
        over.is_empty(),
        "step graphs over their per-layer graphs' memory: {over:#?}"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn graph_memory_estimates_are_within_a_tenth_of_the_drivers_reservation() {
    let (granules, measured) = sweep();
    let b = cuda::Device::new(0).unwrap();
    for g in granules {
        assert_eq!(
            g,
            b.graph_memory_granule(),
            "this driver's graph pool grows by another granule \
             (`cuda::Device::with_graph_memory_granule` sets it)"
        );
    }
    let mut off = Vec::new();
    println!(
        "| temporary | copies | dx freed | streams | per-layer graphs MiB, driver / estimate | \
         + step graph | step graph alone |"
    );
    println!("|---|---|---|---:|---:|---:|---:|");
    for (shape, m) in measured {
        let figures = [
            ("per-layer graphs", m.per_layer),
            ("+ step", m.both),
            ("alone", m.alone),
        ];
        for (what, (driver, estimate)) in figures {
            if estimate.abs_diff(driver) * 10 > driver {
                off.push(format!(
                    "{shape:?}: {what}: driver {driver}, estimate {estimate}"
                ));
            }
        }
        let mib = |(d, e): (u64, u64)| format!("{} / {}", d / MIB, e / MIB);
        println!("{}", row(shape, &figures.map(|(_, f)| mib(f))));
    }
    assert!(
        off.is_empty(),
        "estimates off by more than a tenth: {off:#?}"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn copies_cut_across_their_temporaries_match_eager_for_their_graph_memory() {
    // Chosen speed over graph memory: every writer cut at its ready point
    // though `dx` lives across it. The step graph equals eager, and the
    // driver's reservation shows the price against whole copies.
    println!("| temporary | streams | whole copies: step graph alone MiB | cut across MiB |");
    println!("|---|---:|---:|---:|");
    for n in [1usize << 22, 1 << 24] {
        let model = model(n);
        for streams in [1, 2] {
            let shape = |cut_across| Shape {
                n,
                free: Free::AfterReady,
                handoffs: true,
                streams,
                cut_across,
            };
            let whole = measure(&model, shape(false));
            let cut = measure(&model, shape(true));
            assert_eq!(cut.wgrads, eager(&model, shape(true)), "{:?}", shape(true));
            assert_eq!(whole.nodes, LAYERS);
            assert_eq!(cut.nodes, 2 * LAYERS - 1, "every writer in two parts");
            println!(
                "| {} MiB | {streams} | {} | {} |",
                4 * n as u64 / MIB,
                whole.alone.0 / MIB,
                cut.alone.0 / MIB
            );
        }
    }
}
