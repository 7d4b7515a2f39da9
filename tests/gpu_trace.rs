//! The fence's trace on the H200, from timing events: slices of replays
//! and consumers that spin for a known number of clock cycles have a
//! length, every arrow comes from a slice that ended (to the timing
//! events' resolution) before the waiting slice started, and the JSON
//! parses with one lane per stream.
#![cfg(feature = "cuda")]

mod support;

use std::sync::OnceLock;

use replay_arena::cuda;
use replay_arena::cuda::cudarc::driver::{LaunchConfig, PushKernelArg};
use replay_arena::{DType, Discovering, Domain, PlanConfig, Policy, Request, RunnerId, SliceKind};
use support::gpu::{err, gpu, load_kernels};

const SOURCE: &str = r#"
extern "C" __global__ void spin(float* w, unsigned int n, long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
    for (unsigned int i = threadIdx.x; i < n; i += blockDim.x) w[i] += 1.0f;
}
"#;

const N: u32 = 4096;
/// About 20 µs at the H200's clock.
const CYCLES: i64 = 40_000;

/// cuEventElapsedTime resolves about half a microsecond.
const RESOLUTION_US: f64 = 1.0;

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_cuda_trace_times_each_slice_and_arrows_follow_the_gpus_order() {
    let g = gpu();
    static PTX: OnceLock<String> = OnceLock::new();
    let [spin] = load_kernels(&g.backend, &PTX, SOURCE, ["spin"]);
    let launch = |s: &cuda::Stream, w: u64| {
        let mut l = s.cudarc().launch_builder(&spin);
        l.arg(&w).arg(&N).arg(&CYCLES);
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: `w` is a view of N f32s the closure was handed.
        unsafe { l.launch(cfg) }.map(drop).map_err(err)
    };
    let req = Request::new(Domain::Device, DType::F32, u64::from(N));
    let runners = (0..4).map(|r| (RunnerId(r), [req]));
    let planned = Discovering::from_runners(PlanConfig::new(), runners)
        .unwrap()
        .plan(Policy::Generations(2))
        .unwrap();
    let pool = [
        g.backend.new_stream().unwrap(),
        g.backend.new_stream().unwrap(),
    ];
    let side = g.backend.new_stream().unwrap();
    let mut capturing = planned.allocate(g.backend.clone()).unwrap();
    for r in 0..4 {
        let cap = capturing.capture(RunnerId(r)).unwrap();
        let v = cap.take(req).unwrap();
        cap.stream_capture(&pool[0], |s| launch(s, v.device_address()))
            .unwrap();
        cap.finish().unwrap();
    }
    let mut replayable = capturing.seal().unwrap();

    replayable.start_trace().unwrap();
    for _step in 0..3 {
        for r in 0..4 {
            replayable
                .replay(RunnerId(r), &pool[r as usize % 2])
                .unwrap();
            replayable
                .consume(RunnerId(r), &side, |s, v| launch(s, v[0].device_address()))
                .unwrap();
        }
    }
    let trace = replayable.finish_trace().unwrap();
    let stats = replayable.fence_stats();
    println!("{stats}");
    let slices = trace.slices();
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
    assert!(matches!(slices[1].kind, SliceKind::Consume { .. }));
    let doc: serde_json::Value = serde_json::from_str(&trace.to_chrome_json()).unwrap();
    let events = doc["traceEvents"].as_array().unwrap();
    let count = |ph: &str| events.iter().filter(|e| e["ph"] == ph).count();
    assert_eq!(count("X"), 24);
    assert_eq!(count("s") as u64, stats.waits);
    assert_eq!(count("f") as u64, stats.waits);
}
