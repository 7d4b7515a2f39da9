//! The fence's trace on the H200, from timing events: slices of replays
//! and consumers that spin for a known number of clock cycles have a
//! length, every arrow comes from a slice that ended (to the timing
//! events' resolution) before the waiting slice started, and the JSON
//! parses with one lane per stream. A step graph launched while a trace
//! runs shows each replay and consumer inside its launch, on its lane,
//! with the overlap of the two generations' runners.
#![cfg(feature = "cuda")]

use crate::support;
use crate::support::capture_view;

use std::sync::OnceLock;

use replay_arena::cuda;
use replay_arena::cuda::cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};
use replay_arena::{DType, Domain, Policy, Replayable, Request, RunnerId, UseKind};
use support::gpu::{allocate, err, gpu, load_kernels, Gpu, K};

const SOURCE: &str = r#"
extern "C" __global__ void spin(float* w, unsigned int n, long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
    for (unsigned int i = threadIdx.x; i < n; i += blockDim.x) w[i] += 1.0f;
}
extern "C" __global__ void spin_read(const float* w, float* out, unsigned int n, long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
    for (unsigned int i = threadIdx.x; i < n; i += blockDim.x) out[i] += w[i];
}
"#;

const N: u32 = 4096;
/// About 20 µs at the H200's clock.
const CYCLES: i64 = 40_000;

/// cuEventElapsedTime resolves about half a microsecond.
const RESOLUTION_US: f64 = 1.0;

/// One block of 256 threads.
fn one_block() -> LaunchConfig {
    LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The `spin` kernel over the `N` f32s at `w`.
fn spin(kernel: &CudaFunction, s: &cuda::Stream, w: u64) -> K {
    let mut l = s.cudarc().launch_builder(kernel);
    l.arg(&w).arg(&N).arg(&CYCLES);
    // SAFETY: `w` is a view of N f32s the closure was handed.
    unsafe { l.launch(one_block()) }.map(drop).map_err(err)
}

/// Four runners of one view of `N` f32s in two generations, each captured
/// on `on` as one `spin` over its view.
fn sealed(g: &Gpu, kernel: &CudaFunction, on: &cuda::Stream) -> Replayable<cuda::Device> {
    let req = Request::new(Domain::Device, DType::F32, u64::from(N));
    let runners = (0..4).map(|r| (RunnerId(r), [req]));
    let mut capturing = allocate(&g.backend, runners, Policy::Generations(2));
    for r in 0..4 {
        capture_view(&mut capturing, RunnerId(r), req, on, |s, v| {
            spin(kernel, s, v.device_address())
        });
    }
    capturing.seal().unwrap()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_cuda_trace_times_each_slice_and_arrows_follow_the_gpus_order() {
    let g = gpu();
    static PTX: OnceLock<String> = OnceLock::new();
    let [kernel] = load_kernels(&g.backend, &PTX, SOURCE, ["spin"]);
    let pool = [
        g.backend.new_stream().unwrap(),
        g.backend.new_stream().unwrap(),
    ];
    let side = g.backend.new_stream().unwrap();
    let mut replayable = sealed(&g, &kernel, &pool[0]);

    replayable.start_trace().unwrap();
    for _step in 0..3 {
        for r in 0..4 {
            replayable
                .replay(RunnerId(r), &pool[r as usize % 2])
                .unwrap();
            replayable
                .consume(RunnerId(r), &side, |s, v| {
                    spin(&kernel, s, v[0].device_address())
                })
                .unwrap();
        }
    }
    let trace = replayable.finish_trace().unwrap();
    let stats = replayable.fence_stats();
    println!("{stats}");
    let slices = trace.uses();
    assert_eq!(slices.len(), 24);
    assert_eq!(trace.streams().len(), 3);
    assert_eq!(trace.backend(), "cuda");
    let mut arrows = 0;
    for (i, s) in slices.iter().enumerate() {
        println!(
            "{i:2} {:<20} lane {} {:9.1} .. {:9.1} us  waits {:?}",
            s.kind.name(),
            s.lane,
            s.start_us,
            s.end_us,
            s.waits
        );
        assert!(
            s.end_us - s.start_us >= 5.0,
            "slice {i} ({}) spins ~20 us but lasted {} us",
            s.kind.name(),
            s.end_us - s.start_us
        );
        for w in s.waits.iter().filter(|w| !w.skipped) {
            let from = w.from.expect("everything waited for was traced");
            assert!(from < i);
            assert!(
                slices[from].end_us <= s.start_us + RESOLUTION_US,
                "slice {i} started at {} us, before slice {from}, which it waited for, ended ({} us)",
                s.start_us,
                slices[from].end_us
            );
            arrows += 1;
        }
    }
    assert_eq!(arrows, stats.waits);
    assert!(matches!(slices[1].kind, UseKind::Consume { .. }));
    let doc: serde_json::Value = serde_json::from_str(&trace.to_chrome_json()).unwrap();
    let events = doc["traceEvents"].as_array().unwrap();
    let count = |ph: &str| events.iter().filter(|e| e["ph"] == ph).count();
    assert_eq!(count("X"), 24);
    assert_eq!(count("s") as u64, stats.waits);
    assert_eq!(count("f") as u64, stats.waits);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_cuda_traced_step_graph_shows_each_node_inside_its_launch_on_its_lane() {
    let g = gpu();
    static PTX: OnceLock<String> = OnceLock::new();
    let [kernel, spin_read] = load_kernels(&g.backend, &PTX, SOURCE, ["spin", "spin_read"]);
    let pool = [
        g.backend.new_stream().unwrap(),
        g.backend.new_stream().unwrap(),
    ];
    let (side, on) = (
        g.backend.new_stream().unwrap(),
        g.backend.new_stream().unwrap(),
    );
    let mut replayable = sealed(&g, &kernel, &pool[0]);
    let out = g.zeros::<f32>(N as usize);
    let out_addr = g.ptr(&out);
    const LAUNCHES: usize = 3;
    replayable.start_trace().unwrap();
    {
        let mut step = replayable.step();
        for r in 0..4u32 {
            step.replay(RunnerId(r), &pool[r as usize % 2]).unwrap();
            step.consume(RunnerId(r), &side, |s, v| {
                let w = v[0].device_address();
                let mut l = s.cudarc().launch_builder(&spin_read);
                l.arg(&w).arg(&out_addr).arg(&N).arg(&CYCLES);
                // SAFETY: `w` is a view of N f32s; `out` holds N f32s.
                unsafe { l.launch(one_block()) }.map(drop).map_err(err)
            })
            .unwrap();
        }
        let mut graph = step.build().unwrap();
        for _ in 0..LAUNCHES {
            graph.launch(&on).unwrap();
        }
    }
    let trace = replayable.finish_trace().unwrap();
    let steps: Vec<usize> = (0..trace.uses().len())
        .filter(|&i| matches!(trace.uses()[i].kind, UseKind::StepLaunch { .. }))
        .collect();
    assert_eq!(steps.len(), LAUNCHES);
    assert_eq!(
        trace.step_nodes().len(),
        LAUNCHES * 8,
        "every node of every launch"
    );
    for &k in &steps {
        let launch = &trace.uses()[k];
        let nodes: Vec<_> = trace
            .step_nodes()
            .iter()
            .filter(|n| n.parent == Some(k))
            .collect();
        println!(
            "{:<22} lane {} {:9.1} .. {:9.1} us",
            launch.kind.name(),
            launch.lane,
            launch.start_us,
            launch.end_us
        );
        for n in &nodes {
            println!(
                "  {:<20} lane {} {:9.1} .. {:9.1} us",
                n.kind.name(),
                n.lane,
                n.start_us,
                n.end_us
            );
            assert!(
                n.end_us - n.start_us >= 5.0,
                "{} spins ~20 us",
                n.kind.name()
            );
            assert!(n.start_us + RESOLUTION_US >= launch.start_us);
            assert!(n.end_us <= launch.end_us + RESOLUTION_US);
            assert_ne!(n.lane, launch.lane);
        }
        for r in 0..4 {
            let (replay, consume) = (nodes[2 * r], nodes[2 * r + 1]);
            assert_eq!(
                replay.kind,
                UseKind::Replay {
                    runner: RunnerId(r as u32)
                }
            );
            assert!(consume.start_us + RESOLUTION_US >= replay.end_us);
            assert_eq!(replay.lane, nodes[2 * (r % 2)].lane);
        }
        // The two generations' first runners overlap on the GPU.
        assert!(
            nodes[2].start_us < nodes[0].end_us,
            "runner 1 ({} us) should start before runner 0 ends ({} us)",
            nodes[2].start_us,
            nodes[0].end_us
        );
    }
    let doc: serde_json::Value = serde_json::from_str(&trace.to_chrome_json()).unwrap();
    let events = doc["traceEvents"].as_array().unwrap();
    let nodes = events.iter().filter(|e| e["cat"] == "step.node").count();
    assert_eq!(nodes, LAUNCHES * 8);
    // Untraced launches go on after the trace.
    let mut step = replayable.step();
    for r in 0..4u32 {
        step.replay(RunnerId(r), &pool[r as usize % 2]).unwrap();
    }
    let mut graph = step.build().unwrap();
    graph.launch(&on).unwrap();
    drop(graph);
    replayable.synchronize().unwrap();
}
