//! GPU benchmarks on the `cuda` backend: `cargo bench --bench gpu_replay` on
//! a machine with an NVIDIA GPU (it prints why it skipped on one without).
//!
//! 1. Host time per replay of the same one-kernel graph: a plain
//!    `cuGraphLaunch` of the exec, against `Replayable::replay` fenced across
//!    two streams (wait + launch + record), on one stream (wait elided), and
//!    with packed placement over four runners on two streams.
//! 2. Overlap: a pipeline of runners, each a short compute kernel then a long
//!    reduce-scatter-like tail (few blocks, so several fit side by side), on
//!    pools of 2 and 3 streams, with G = 1, 2, 3, packed G = 2, and no fence
//!    at all (the unsafe reference). GPU throughput relative to unfenced.
//! 3. One launch per step: 16 runners on a pool of two streams, each with a
//!    consumer on a third, as per-runner fenced `replay` + `consume`, as
//!    unfenced launches (the unsafe reference), and as one `StepGraph`
//!    launch: host time and wall time per step; then the same with runners whose
//!    graphs allocate a temporary (their step copies moved into the step graph).
//! 4. The cost of a trace (`Replayable::start_trace_with_capacity`): host
//!    time per replay and per consumer with and without a trace running (two
//!    timing events recorded per slice, created before the batch), and per
//!    slice at `start_trace_with_capacity` (creating them) and at
//!    `finish_trace` (reading them); then a step graph's launch (16 runners
//!    and their consumers) with and without a trace running: a traced
//!    launch composes and instantiates a copy of the step graph with a
//!    timing node after each node, so that the trace shows every runner
//!    and consumer inside the launch; an untraced one launches the step
//!    graph as it was built.
//!
//! 5. Capture cost: host time to plan, allocate, capture, seal and build
//!    step graphs for a ladder of buckets x layers (up to 64 x 32), against
//!    cudarc capturing and instantiating the same kernels by hand, and
//!    composing the same step graphs by hand (one chain, and the crate's
//!    own edges: two chains), the builds of all three interleaved round by
//!    round; then where a step build's time goes (the driver's composition,
//!    timed on a backend that wraps `cuda::Device`, and the rest).
//!
//! 6. Ready points of allocating runners: a chain whose runners allocate
//!    temporaries and mark a handoff ready early, per runner against step
//!    graphs whose step copies are cut at the ready point, and against
//!    readers that wait for whole graphs.
//!
//! Arguments after `--` pick sections by name (`host`, `overlap`, `step`,
//! `trace`, `buckets`, `capture`, `ready`): `cargo bench --bench gpu_replay -- trace`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use replay_arena::backend::Streams;
use replay_arena::cuda;
use replay_arena::cuda::cudarc::driver::{
    sys, CudaFunction, CudaGraph, DevicePtr, LaunchConfig, PushKernelArg,
};
use replay_arena::cuda::cudarc::nvrtc::compile_ptx;
use replay_arena::cuda::probe;
use replay_arena::{
    DType, Discovering, Domain, PlacedPolicy, PlanConfig, Policy, Replayable, Request, RunnerId,
};

const SOURCE: &str = r#"
extern "C" __global__ void touch(float* w) {
    if (threadIdx.x == 0) w[0] += 1.0f;
}
extern "C" __global__ void read(const float* w, float* out) {
    if (threadIdx.x == 0) out[0] += w[0];
}
extern "C" __global__ void spin(float* w, unsigned int n, long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
    for (unsigned int i = threadIdx.x; i < n; i += blockDim.x) w[i] += 1.0f;
}
"#;

type R<T> = Result<T, Box<dyn std::error::Error>>;

/// The median of a mode's samples (sorted in place).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

struct Kernels {
    touch: CudaFunction,
    read: CudaFunction,
    spin: CudaFunction,
}

fn kernels(b: &cuda::Device) -> R<Kernels> {
    let ptx = compile_ptx(SOURCE).map_err(|e| format!("nvrtc: {e:?}"))?;
    let m = b.context().load_module(ptx).map_err(|e| format!("{e:?}"))?;
    let f = |n: &str| m.load_function(n).map_err(|e| format!("{e:?}"));
    Ok(Kernels {
        touch: f("touch")?,
        read: f("read")?,
        spin: f("spin")?,
    })
}

fn one_block() -> LaunchConfig {
    LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn touch(k: &Kernels, s: &cuda::Stream, w: u64) -> Result<(), String> {
    let mut l = s.cudarc().launch_builder(&k.touch);
    l.arg(&w);
    unsafe { l.launch(one_block()) }
        .map(drop)
        .map_err(|e| format!("{e:?}"))
}

/// `out[0] += w[0]`: a consumer that reads its runner's view.
fn read(k: &Kernels, s: &cuda::Stream, w: u64, out: u64) -> Result<(), String> {
    let mut l = s.cudarc().launch_builder(&k.read);
    l.arg(&w).arg(&out);
    unsafe { l.launch(one_block()) }
        .map(drop)
        .map_err(|e| format!("{e:?}"))
}

fn spin(k: &Kernels, s: &cuda::Stream, w: u64, n: u32, cycles: i64) -> Result<(), String> {
    let mut l = s.cudarc().launch_builder(&k.spin);
    l.arg(&w).arg(&n).arg(&cycles);
    unsafe { l.launch(one_block()) }
        .map(drop)
        .map_err(|e| format!("{e:?}"))
}

/// Plans `runners` runners of one 64 KiB f32 request each, and captures
/// `body(view)` as each runner's graph.
fn build(
    b: &cuda::Device,
    capture_on: &cuda::Stream,
    runners: usize,
    strategy: PlacedPolicy,
    body: &dyn Fn(&cuda::Stream, u64) -> Result<(), String>,
) -> R<Replayable<cuda::Device>> {
    let req = Request::new(Domain::Device, DType::F32, 16384);
    let mut d = Discovering::new(PlanConfig::new());
    for r in 0..runners {
        d.arm(RunnerId(r as u32))?.record(req)?;
    }
    let mut capturing = d.plan(strategy)?.allocate(b.clone())?;
    for r in 0..runners {
        let cap = capturing.capture(RunnerId(r as u32))?;
        let v = cap.take(req)?;
        // Twice when the body allocates: the runner's graph and its step
        // copy (once otherwise).
        cap.step_copies(2); // enough for overlapping step graphs
        cap.stream_capture_repeatable(capture_on, |s| body(s, v.device_address()))?;
        cap.finish()?;
    }
    Ok(capturing.seal()?)
}

const BATCH: usize = 1000;
const BATCHES: usize = 30;

/// The host-cost modes, measured interleaved batch by batch so that clock
/// and cache drift hit every mode alike.
const MODES: [&str; 8] = [
    "plain cuGraphLaunch (raw exec, no crate)",
    "raw cuStreamWaitEvent + cuGraphLaunch + cuEventRecord, alternating two streams (no crate)",
    "replay_unfenced (the crate's launch, no fence)",
    "replay, one stream (waits implied by stream order)",
    "replay, alternating two streams (record + wait + launch)",
    "replay, round-robin G=2, 4 runners, two streams",
    "replay, packed G=2, 4 runners, two streams",
    "replay, round-robin G=2, 4 runners, stream k % 2 (steady state of a pool)",
];

fn host_cost(b: &cuda::Device, k: &Kernels) -> R<()> {
    let a = b.new_stream()?;
    let s2 = b.new_stream()?;
    let streams = [&a, &s2];
    let tiny = |s: &cuda::Stream, w: u64| touch(k, s, w);
    let one = || build(b, &a, 1, Policy::Generations(1).into(), &tiny);
    let (mut unfenced, mut same, mut cross) = (one()?, one()?, one()?);
    let mut rr4 = build(b, &a, 4, Policy::Generations(2).into(), &tiny)?;
    let mut pool4 = build(b, &a, 4, Policy::Generations(2).into(), &tiny)?;
    let mut packed = build(b, &a, 4, Policy::Generations(2).packed(), &tiny)?;
    // A plain launch of the very exec the plan launches in `unfenced`.
    let exec = unfenced
        .graph(RunnerId(0))
        .ok_or("runner 0 has no graph")?
        .cu_graph_exec();
    let event = b.create_event()?;
    let raw = |codes: &[sys::CUresult]| -> R<()> {
        match codes.iter().find(|&&c| c != sys::CUresult::CUDA_SUCCESS) {
            None => Ok(()),
            Some(c) => Err(format!("driver call: {c:?}").into()),
        }
    };

    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); MODES.len()];
    for round in 0..=BATCHES {
        for (m, sample) in samples.iter_mut().enumerate() {
            b.synchronize()?;
            let t = Instant::now();
            for i in 0..BATCH {
                let s = streams[i % 2];
                let r4 = RunnerId((i % 4) as u32);
                match m {
                    0 => raw(&[unsafe { sys::cuGraphLaunch(exec, a.cu_stream()) }])?,
                    1 => raw(&unsafe {
                        [
                            sys::cuStreamWaitEvent(s.cu_stream(), event.cu_event(), 0),
                            sys::cuGraphLaunch(exec, s.cu_stream()),
                            sys::cuEventRecord(event.cu_event(), s.cu_stream()),
                        ]
                    })?,
                    // SAFETY: one runner on one stream: stream order serializes it.
                    2 => unsafe { unfenced.replay_unfenced(RunnerId(0), &a)? },
                    3 => same.replay(RunnerId(0), &a)?,
                    4 => cross.replay(RunnerId(0), s)?,
                    5 => rr4.replay(r4, streams[(i / 4) % 2])?,
                    6 => packed.replay(r4, streams[(i / 4) % 2])?,
                    _ => pool4.replay(r4, s)?,
                }
            }
            if round > 0 {
                sample.push(t.elapsed().as_nanos() as f64 / BATCH as f64);
            }
        }
    }
    b.synchronize()?;
    let medians: Vec<f64> = samples.iter_mut().map(|v| median(v)).collect();
    let plain = medians[0];
    println!("## host time per replay (median of {BATCHES} batches of {BATCH}, modes interleaved)");
    println!("| mode | ns/replay | minus plain cuGraphLaunch | ratio |");
    println!("|---|---:|---:|---:|");
    for (name, ns) in MODES.iter().zip(&medians) {
        println!(
            "| {name} | {ns:.0} | {:+.0} | {:.2}x |",
            ns - plain,
            ns / plain
        );
    }
    for (name, r) in [
        ("one stream", &same),
        ("alternating", &cross),
        ("pool", &pool4),
        ("packed", &packed),
    ] {
        let st = r.fence_stats();
        println!(
            "{name}: {} replays, {} waits, {} skipped, {} event records",
            st.replays, st.waits, st.waits_skipped, st.event_records
        );
    }
    println!(
        "packed plan: longest wait list {}",
        packed.plan().report().longest_wait_list
    );
    Ok(())
}

/// Runs `rounds` rounds of the pipeline and returns GPU-bound wall seconds.
fn pipeline_secs(
    b: &cuda::Device,
    r: &mut Replayable<cuda::Device>,
    pool: &[cuda::Stream],
    runners: usize,
    rounds: usize,
    fenced: bool,
) -> R<f64> {
    b.synchronize()?;
    let t = Instant::now();
    let mut k = 0;
    for _ in 0..rounds {
        for runner in 0..runners {
            let s = &pool[k % pool.len()];
            k += 1;
            if fenced {
                r.replay(RunnerId(runner as u32), s)?;
            } else {
                // SAFETY: the unfenced reference: runners may overwrite each
                // other's arena, which only changes values nobody reads.
                unsafe { r.replay_unfenced(RunnerId(runner as u32), s)? };
            }
        }
    }
    b.synchronize()?;
    Ok(t.elapsed().as_secs_f64())
}

fn overlap(b: &cuda::Device, k: &Kernels) -> R<()> {
    const RUNNERS: usize = 12;
    const ROUNDS: usize = 20;
    // ~10 us of compute, then a ~40 us tail, one block each.
    let body = |s: &cuda::Stream, w: u64| -> Result<(), String> {
        spin(k, s, w, 4096, 20_000)?;
        spin(k, s, w, 4096, 80_000)
    };
    let capture_on = b.new_stream()?;
    println!("\n## overlap: {RUNNERS} runners x {ROUNDS} rounds, compute + long tail per graph");
    println!("| streams | placement | G | GPU time (ms) | throughput vs unfenced | waits/replay |");
    println!("|---:|---|---:|---:|---:|---:|");
    for streams in [2usize, 3] {
        let pool: Vec<cuda::Stream> = (0..streams)
            .map(|_| b.new_stream())
            .collect::<Result<_, _>>()?;
        let mut reference = build(
            b,
            &capture_on,
            RUNNERS,
            Policy::Generations(RUNNERS).into(),
            &body,
        )?;
        pipeline_secs(b, &mut reference, &pool, RUNNERS, 2, false)?;
        let unfenced = pipeline_secs(b, &mut reference, &pool, RUNNERS, ROUNDS, false)?;
        println!(
            "| {streams} | none (unfenced) | - | {:.2} | 1.000 | 0 |",
            unfenced * 1e3
        );
        let configs: [(&str, PlacedPolicy); 4] = [
            ("round-robin", Policy::Generations(1).into()),
            ("round-robin", Policy::Generations(2).into()),
            ("round-robin", Policy::Generations(3).into()),
            ("packed", Policy::Generations(2).packed()),
        ];
        for (name, strategy) in configs {
            let mut r = build(b, &capture_on, RUNNERS, strategy, &body)?;
            pipeline_secs(b, &mut r, &pool, RUNNERS, 2, true)?;
            let before = r.fence_stats();
            let secs = pipeline_secs(b, &mut r, &pool, RUNNERS, ROUNDS, true)?;
            let after = r.fence_stats();
            println!(
                "| {streams} | {name} | {} | {:.2} | {:.3} | {:.2} |",
                r.plan().generations(),
                secs * 1e3,
                unfenced / secs,
                (after.waits - before.waits) as f64 / (after.replays - before.replays) as f64
            );
        }
    }
    Ok(())
}

/// Host and wall time per step of 16 runners with consumers: per runner,
/// unfenced, and as one step graph. With `allocating`, each runner's work
/// allocates a 64 KiB temporary and frees it (a framework op's output):
/// the step graph moves in the runners' step copies.
fn step_cost(b: &cuda::Device, k: &Kernels, allocating: bool) -> R<()> {
    const RUNNERS: usize = 16;
    const STEPS: usize = 100;
    const ROUNDS: usize = 20;
    let capture_on = b.new_stream()?;
    let pool = [b.new_stream()?, b.new_stream()?];
    let (side, launch) = (b.new_stream()?, b.new_stream()?);
    let launch2 = b.new_stream()?;
    let body = |s: &cuda::Stream, w: u64| {
        if allocating {
            use replay_arena::cuda::cudarc::driver::DevicePtr;
            let t = s
                .cudarc()
                .alloc_zeros::<f32>(16384)
                .map_err(|e| format!("{e:?}"))?;
            let tmp = t.device_ptr(s.cudarc()).0;
            spin(k, s, tmp, 4096, 1_000)?;
            drop(t);
            spin(k, s, w, 4096, 1_000)
        } else {
            spin(k, s, w, 4096, 2_000)
        }
    };
    let strategy: PlacedPolicy = Policy::OverlapDepth(2).into();
    let mut fenced = build(b, &capture_on, RUNNERS, strategy, &body)?;
    let mut unfenced = build(b, &capture_on, RUNNERS, strategy, &body)?;
    let mut stepped = build(b, &capture_on, RUNNERS, strategy, &body)?;
    let mut overlapped = build(b, &capture_on, RUNNERS, strategy, &body)?;
    let out = side.cudarc().alloc_zeros::<f32>(RUNNERS)?;
    side.synchronize()?;
    let out_ptr = |r: usize| {
        use replay_arena::cuda::cudarc::driver::DevicePtr;
        out.device_ptr(side.cudarc()).0 + 4 * r as u64
    };
    let views: Vec<u64> = (0..RUNNERS)
        .map(|r| Ok(unfenced.views(RunnerId(r as u32))?[0].device_address()))
        .collect::<R<_>>()?;
    let mut step = stepped.step();
    for r in 0..RUNNERS {
        step.replay(RunnerId(r as u32), &pool[r % 2])?;
        step.consume(RunnerId(r as u32), &side, |s, v| {
            read(k, s, v[0].device_address(), out_ptr(r))
        })?;
    }
    let mut graph = step.build()?;
    let mut step = overlapped.step();
    for r in 0..RUNNERS {
        step.replay(RunnerId(r as u32), &pool[r % 2])?;
        step.consume(RunnerId(r as u32), &side, |s, v| {
            read(k, s, v[0].device_address(), out_ptr(r))
        })?;
    }
    let mut graphs2 = step.build_overlapping()?;
    let mut turn = 0usize;
    let done = b.create_event()?;
    let modes = [
        "per runner: replay + consume, fenced",
        "per runner: replay_unfenced + consumer after its graph (unsafe reference)",
        "step graph: one launch",
        "overlapping step graphs: one launch, two graphs in turn on two streams",
    ];
    let mut host: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
    let mut wall: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
    for round in 0..=ROUNDS {
        for m in 0..modes.len() {
            b.synchronize()?;
            let t = Instant::now();
            for _ in 0..STEPS {
                match m {
                    0 => {
                        for r in 0..RUNNERS {
                            let runner = RunnerId(r as u32);
                            fenced.replay(runner, &pool[r % 2])?;
                            fenced.consume(runner, &side, |s, v| {
                                read(k, s, v[0].device_address(), out_ptr(r))
                            })?;
                        }
                    }
                    1 => {
                        for (r, &w) in views.iter().enumerate() {
                            let s = &pool[r % 2];
                            // SAFETY: the unsafe reference: consumers may read
                            // bytes a later replay overwrites (values nobody
                            // checks).
                            unsafe { unfenced.replay_unfenced(RunnerId(r as u32), s)? };
                            b.record_event(s, &done)?;
                            b.wait_event(&side, &done)?;
                            read(k, &side, w, out_ptr(r))?;
                        }
                    }
                    2 => graph.launch(&launch)?,
                    _ => {
                        turn += 1;
                        graphs2.launch(if turn % 2 == 0 { &launch } else { &launch2 })?
                    }
                }
            }
            let enqueued = t.elapsed();
            b.synchronize()?;
            if round > 0 {
                host[m].push(enqueued.as_nanos() as f64 / STEPS as f64 / 1e3);
                wall[m].push(t.elapsed().as_nanos() as f64 / STEPS as f64 / 1e3);
            }
        }
    }
    let kind = if allocating {
        ", each allocating and freeing a 64 KiB temporary inside its graph (step copies moved in)"
    } else {
        ""
    };
    println!(
        "\n## one launch per step: {RUNNERS} runners (~1.5 us of GPU work each{kind}) on 2 streams, a consumer of each on a third; median of {ROUNDS} rounds of {STEPS} steps, modes interleaved"
    );
    println!("step graph: {graph:?}");
    println!("| mode | host us/step | wall us/step | host vs step graph |");
    println!("|---|---:|---:|---:|");
    let graph_host = median(&mut host[2].clone());
    for (m, name) in modes.iter().enumerate() {
        let h = median(&mut host[m]);
        let w = median(&mut wall[m]);
        println!("| {name} | {h:.1} | {w:.1} | {:.1}x |", h / graph_host);
    }
    Ok(())
}

/// The trace's modes, measured interleaved batch by batch.
const TRACE_MODES: [&str; 4] = [
    "replay, one stream, no trace",
    "replay, one stream, traced",
    "replay + consume on a second stream, no trace",
    "replay + consume on a second stream, traced",
];

fn trace_cost(b: &cuda::Device, k: &Kernels) -> R<()> {
    let a = b.new_stream()?;
    let side = b.new_stream()?;
    let tiny = |s: &cuda::Stream, w: u64| touch(k, s, w);
    let mut plans = Vec::new();
    for _ in TRACE_MODES {
        plans.push(build(b, &a, 1, Policy::Generations(1).into(), &tiny)?);
    }
    let out = side.cudarc().alloc_zeros::<f32>(1)?;
    let out_ptr = {
        use replay_arena::cuda::cudarc::driver::DevicePtr;
        out.device_ptr(side.cudarc()).0
    };
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); TRACE_MODES.len()];
    let mut finish: Vec<f64> = Vec::new();
    let mut start: Vec<f64> = Vec::new();
    for round in 0..=BATCHES {
        for (m, (sample, r)) in samples.iter_mut().zip(&mut plans).enumerate() {
            b.synchronize()?;
            let traced = m % 2 == 1;
            if traced {
                let slices = if m >= 2 { 2 * BATCH } else { BATCH };
                let t = Instant::now();
                r.start_trace_with_capacity(slices)?;
                if round > 0 {
                    start.push(t.elapsed().as_nanos() as f64 / slices as f64);
                }
            }
            let t = Instant::now();
            for _ in 0..BATCH {
                r.replay(RunnerId(0), &a)?;
                if m >= 2 {
                    r.consume(RunnerId(0), &side, |s, v| {
                        read(k, s, v[0].device_address(), out_ptr)
                    })?;
                }
            }
            let elapsed = t.elapsed();
            if traced {
                let t = Instant::now();
                let trace = r.finish_trace()?;
                let per_slice = t.elapsed().as_nanos() as f64 / trace.uses().len() as f64;
                if round > 0 {
                    finish.push(per_slice);
                }
            }
            if round > 0 {
                sample.push(elapsed.as_nanos() as f64 / BATCH as f64);
            }
        }
    }
    b.synchronize()?;
    let medians: Vec<f64> = samples.iter_mut().map(|v| median(v)).collect();
    println!(
        "\n## trace cost: host time per iteration (median of {BATCHES} batches of {BATCH}, modes interleaved)"
    );
    println!("| mode | ns/iteration | traced minus untraced |");
    println!("|---|---:|---:|");
    for (m, (name, ns)) in TRACE_MODES.iter().zip(&medians).enumerate() {
        let extra = match m % 2 {
            1 => format!("{:+.0}", ns - medians[m - 1]),
            _ => String::new(),
        };
        println!("| {name} | {ns:.0} | {extra} |");
    }
    println!(
        "start_trace_with_capacity: {:.0} ns per slice (median; creates two timing events each)",
        median(&mut start)
    );
    println!(
        "finish_trace: {:.0} ns per slice (median; reads two timing events each, and frees them)",
        median(&mut finish)
    );
    Ok(())
}

/// A step graph's launch with and without a trace running: host time per
/// launch (enqueueing it), wall time per launch (to the end of the batch's
/// GPU work), and the traced batch's `finish_trace` per launch.
fn step_trace_cost(b: &cuda::Device, k: &Kernels) -> R<()> {
    const RUNNERS: usize = 16;
    const LAUNCHES: usize = 50;
    const ROUNDS: usize = 10;
    const MODES: [&str; 2] = ["step graph launch, no trace", "step graph launch, traced"];
    let capture_on = b.new_stream()?;
    let pool = [b.new_stream()?, b.new_stream()?];
    let (side, on) = (b.new_stream()?, b.new_stream()?);
    let body = |s: &cuda::Stream, w: u64| spin(k, s, w, 16384, 2_000);
    let mut r = build(
        b,
        &capture_on,
        RUNNERS,
        Policy::Generations(2).into(),
        &body,
    )?;
    let out = side.cudarc().alloc_zeros::<f32>(1)?;
    let out_ptr = out.device_ptr(side.cudarc()).0;
    let mut step = r.step();
    for n in 0..RUNNERS {
        step.replay(RunnerId(n as u32), &pool[n % 2])?;
        step.consume(RunnerId(n as u32), &side, |s, v| {
            read(k, s, v[0].device_address(), out_ptr)
        })?;
    }
    let graph = step.build()?;
    let nodes = graph.nodes();
    let mut kept = graph.keep();
    let mut host: Vec<Vec<f64>> = vec![Vec::new(); MODES.len()];
    let mut wall: Vec<Vec<f64>> = vec![Vec::new(); MODES.len()];
    let mut finish: Vec<f64> = Vec::new();
    for round in 0..=ROUNDS {
        for m in 0..MODES.len() {
            b.synchronize()?;
            if m == 1 {
                r.start_trace_with_capacity(2 * LAUNCHES)?;
            }
            let t = Instant::now();
            for _ in 0..LAUNCHES {
                r.launch_kept(&mut kept, &on)?;
            }
            let enqueued = t.elapsed();
            b.synchronize()?;
            let done = t.elapsed();
            if m == 1 {
                let t = Instant::now();
                let trace = r.finish_trace()?;
                if round > 0 {
                    finish.push(t.elapsed().as_nanos() as f64 / 1e3 / LAUNCHES as f64);
                }
                assert_eq!(trace.step_nodes().len(), LAUNCHES * nodes);
            }
            if round > 0 {
                host[m].push(enqueued.as_nanos() as f64 / 1e3 / LAUNCHES as f64);
                wall[m].push(done.as_nanos() as f64 / 1e3 / LAUNCHES as f64);
            }
        }
    }
    drop(kept);
    println!(
        "\n## step graph trace cost: {RUNNERS} runners and their consumers ({nodes} nodes), median of {ROUNDS} rounds of {LAUNCHES} launches, modes interleaved"
    );
    println!("| mode | host us/launch | wall us/launch |");
    println!("|---|---:|---:|");
    for (m, name) in MODES.iter().enumerate() {
        let (h, w) = (median(&mut host[m]), median(&mut wall[m]));
        println!("| {name} | {h:.1} | {w:.1} |");
    }
    println!(
        "finish_trace: {:.1} us per traced launch (median; reads one timing event per node and two per launch)",
        median(&mut finish)
    );
    Ok(())
}

/// Shape buckets: three buckets (64 KiB, 256 KiB, 1 MiB per runner, 4
/// runners each) in one plan, on a pool of two streams, a consumer of each
/// runner on a third. A steady bucket (the largest, every step) against a
/// switch every step (bucket `step % 3`): host and wall time per step.
fn bucket_cost(b: &cuda::Device, k: &Kernels) -> R<()> {
    const PER_BUCKET: usize = 4;
    const SIZES: [u64; 3] = [16384, 65536, 262144];
    const STEPS: usize = 100;
    const ROUNDS: usize = 20;
    let mut d = Discovering::new(PlanConfig::new());
    for (bucket, &n) in SIZES.iter().enumerate() {
        d.bucket(format!("n={n}"))?;
        for r in 0..PER_BUCKET {
            let id = RunnerId((bucket * PER_BUCKET + r) as u32);
            d.arm(id)?
                .record(Request::new(Domain::Device, DType::F32, n))?;
        }
    }
    let planned = d.plan(Policy::OverlapDepth(2))?;
    let (shared, separate) = (planned.total_bytes(), planned.separate_bytes());
    let capture_on = b.new_stream()?;
    let mut capturing = planned.allocate(b.clone())?;
    for (bucket, &n) in SIZES.iter().enumerate() {
        for r in 0..PER_BUCKET {
            let id = RunnerId((bucket * PER_BUCKET + r) as u32);
            let cap = capturing.capture(id)?;
            let v = cap.take(Request::new(Domain::Device, DType::F32, n))?;
            cap.stream_capture(&capture_on, |s| {
                spin(k, s, v.device_address(), n as u32, 2_000)
            })?;
            cap.finish()?;
        }
    }
    let mut replayable = capturing.seal()?;
    let pool = [b.new_stream()?, b.new_stream()?];
    let side = b.new_stream()?;
    let out = side.cudarc().alloc_zeros::<f32>(1)?;
    side.synchronize()?;
    let out_ptr = {
        use replay_arena::cuda::cudarc::driver::DevicePtr;
        out.device_ptr(side.cudarc()).0
    };
    let modes = [
        "steady: bucket 0 (64 KiB runners) every step",
        "steady: bucket 1 (256 KiB) every step",
        "steady: bucket 2 (1 MiB) every step",
        "switching: bucket step % 3",
    ];
    let mut host: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
    let mut wall: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
    let mut waits = [0u64; 4];
    for round in 0..=ROUNDS {
        for (m, w) in waits.iter_mut().enumerate() {
            b.synchronize()?;
            let before = replayable.fence_stats().waits;
            let t = Instant::now();
            for step in 0..STEPS {
                let bucket = if m < 3 { m } else { step % 3 };
                for r in 0..PER_BUCKET {
                    let id = RunnerId((bucket * PER_BUCKET + r) as u32);
                    replayable.replay(id, &pool[r % 2])?;
                    replayable
                        .consume(id, &side, |s, v| read(k, s, v[0].device_address(), out_ptr))?;
                }
            }
            let enqueued = t.elapsed();
            b.synchronize()?;
            if round > 0 {
                host[m].push(enqueued.as_nanos() as f64 / STEPS as f64 / 1e3);
                wall[m].push(t.elapsed().as_nanos() as f64 / STEPS as f64 / 1e3);
                *w += replayable.fence_stats().waits - before;
            }
        }
    }
    println!(
        "\n## shape buckets: 3 buckets x {PER_BUCKET} runners (64 KiB, 256 KiB, 1 MiB each) on 2 streams, a consumer of each on a third; plan {shared} B shared against {separate} B as separate plans; median of {ROUNDS} rounds of {STEPS} steps, modes interleaved"
    );
    println!("| mode | host us/step | wall us/step | fence waits/step |");
    println!("|---|---:|---:|---:|");
    let mut walls = Vec::new();
    for (m, name) in modes.iter().enumerate() {
        let (h, w) = (median(&mut host[m]), median(&mut wall[m]));
        walls.push(w);
        let per_step = waits[m] as f64 / (ROUNDS * STEPS) as f64;
        println!("| {name} | {h:.1} | {w:.1} | {per_step:.2} |");
    }
    let steady = (walls[0] + walls[1] + walls[2]) / 3.0;
    println!(
        "switching every step against the mean of the steady buckets: {:.3}x wall time",
        walls[3] / steady
    );
    Ok(())
}

/// The host times of one side of a capture ladder's capture, in seconds:
/// discovery, plan and allocation (the crate only), then capture and
/// instantiation (seal for the crate).
#[derive(Clone, Copy)]
struct Captured {
    planned: f64,
    captured: f64,
}

impl Captured {
    /// The better of two runs, per phase.
    fn min(self, other: Captured) -> Captured {
        Captured {
            planned: self.planned.min(other.planned),
            captured: self.captured.min(other.captured),
        }
    }
}

/// With `allocating`, each runner's work also allocates and frees a
/// temporary inside its graph: the crate captures it twice (its graph and
/// the step copy a step graph moves in), and so does the hand-made capture
/// (the driver clones no graph with memory nodes).
fn temporary(k: &Kernels, s: &cuda::Stream, allocating: bool) -> Result<(), String> {
    if allocating {
        let t = s
            .cudarc()
            .alloc_zeros::<f32>(16384)
            .map_err(|e| format!("{e:?}"))?;
        touch(k, s, t.device_ptr(s.cudarc()).0)?;
    }
    Ok(())
}

/// The plan of a capture ladder: `buckets` buckets of `layers` runners,
/// one `req` each, in two generations.
fn ladder_plan((buckets, layers): (usize, usize), req: Request) -> R<replay_arena::Planned> {
    let mut d = Discovering::new(PlanConfig::new());
    for bucket in 0..buckets {
        d.bucket(format!("b{bucket}"))?;
        for l in 0..layers {
            d.arm(RunnerId((bucket * layers + l) as u32))?.record(req)?;
        }
    }
    Ok(d.plan(Policy::OverlapDepth(2))?)
}

/// The crate's side of a capture ladder after its capture: the sealed plan
/// and the two lanes its step graphs alternate.
struct CrateLadder {
    replayable: Replayable<cuda::Device>,
    lanes: [cuda::Stream; 2],
    capture_on: cuda::Stream,
}

/// The crate's side of a capture ladder: discovery, plan, allocation (timed
/// apart), then capture and seal.
fn crate_ladder(
    b: &cuda::Device,
    k: &Kernels,
    (buckets, layers): (usize, usize),
    allocating: bool,
) -> R<(Captured, CrateLadder)> {
    let req = Request::new(Domain::Device, DType::F32, 16384);
    let n = buckets * layers;
    let (capture_on, x, y) = (b.new_stream()?, b.new_stream()?, b.new_stream()?);
    let t_plan = Instant::now();
    let mut capturing = ladder_plan((buckets, layers), req)?.allocate(b.clone())?;
    let planned = t_plan.elapsed().as_secs_f64();
    let t0 = Instant::now();
    for r in 0..n {
        let cap = capturing.capture(RunnerId(r as u32))?;
        let v = cap.take(req)?;
        cap.stream_capture_repeatable(&capture_on, |s| {
            temporary(k, s, allocating)?;
            touch(k, s, v.device_address())
        })?;
        cap.finish()?;
    }
    let replayable = capturing.seal()?;
    let captured = t0.elapsed().as_secs_f64();
    let side = CrateLadder {
        replayable,
        lanes: [x, y],
        capture_on,
    };
    Ok((Captured { planned, captured }, side))
}

/// One round of the crate's step builds of `replayable`'s ladder: every
/// bucket's step graph built (and kept), its layers alternating the two
/// `lanes`, then dropped; seconds.
fn crate_round<B: replay_arena::backend::Compose + Clone>(
    replayable: &mut Replayable<B>,
    (buckets, layers): (usize, usize),
    lanes: [&B::Stream; 2],
    allocating: bool,
) -> R<f64> {
    let t = Instant::now();
    let kept = (0..buckets)
        .map(|bucket| {
            let mut step = replayable.step();
            for l in 0..layers {
                step.replay(RunnerId((bucket * layers + l) as u32), lanes[l % 2])?;
            }
            let graph = step.build()?;
            // The graph the hand-made side composes as two chains.
            let two_chains = (layers, layers.saturating_sub(2));
            if !allocating && (graph.nodes(), graph.edges()) != two_chains {
                return Err(format!(
                    "a step graph of {} nodes and {} edges, not two chains",
                    graph.nodes(),
                    graph.edges()
                )
                .into());
            }
            Ok(graph.keep())
        })
        .collect::<R<Vec<_>>>()?;
    let built = t.elapsed().as_secs_f64();
    drop(kept);
    Ok(built)
}

/// Rounds of step-graph builds per ladder: every bucket's step graph is
/// built (and kept) each round, then dropped, and a side's figure is the
/// median round; at least 384 builds a side (six rounds at 64 buckets),
/// so one bucket's 0.1 ms build is not one sample, and a side's rounds
/// spread over some 40 ms of the host at one bucket (a slow stretch of
/// the host falls on every side alike).
fn build_rounds(buckets: usize, allocating: bool) -> usize {
    match allocating {
        // One step copy per runner: one build.
        true => 1,
        false => (384 / buckets).max(6),
    }
}

/// The crate's step builds of the same ladder on `sim`, on this host: the
/// crate's own work (and `sim`'s stand-in for the driver's composition,
/// which is counted too), no driver at all. Median round, seconds.
fn sim_builds((buckets, layers): (usize, usize)) -> R<f64> {
    use replay_arena::sim;
    let sim = sim::Device::new();
    let req = Request::new(Domain::Device, DType::F32, 16384);
    let mut capturing = ladder_plan((buckets, layers), req)?.allocate(sim.clone())?;
    let on = sim.new_stream();
    for r in 0..buckets * layers {
        let cap = capturing.capture(RunnerId(r as u32))?;
        let v = cap.take(req)?;
        cap.stream_capture(&on, |s| sim.launch(s, sim::Kernel::fill(&v, 1.0), 0))?;
        cap.finish()?;
    }
    let mut replayable = capturing.seal()?;
    let (x, y) = (sim.new_stream(), sim.new_stream());
    let rounds = (0..build_rounds(buckets, false))
        .map(|_| crate_round(&mut replayable, (buckets, layers), [&x, &y], false))
        .collect::<R<Vec<f64>>>()?;
    Ok(median(&mut { rounds }))
}

/// The hand-made side of a capture ladder after its capture: every
/// runner's graph, instantiated.
struct HandLadder {
    graphs: Vec<CudaGraph>,
    capture_on: cuda::Stream,
}

/// The hand-made side: the same kernels captured and instantiated with
/// cudarc (uploaded when the crate's device uploads); seconds to capture.
fn hand_ladder(
    b: &cuda::Device,
    k: &Kernels,
    (buckets, layers): (usize, usize),
    allocating: bool,
) -> R<(Captured, HandLadder)> {
    let n = buckets * layers;
    let capture_on = b.new_stream()?;
    let bufs: Vec<_> = (0..n)
        .map(|_| capture_on.cudarc().alloc_zeros::<f32>(16384))
        .collect::<Result<_, _>>()?;
    capture_on.synchronize()?;
    let t2 = Instant::now();
    let mut graphs = Vec::with_capacity(n);
    let mut copies = Vec::new();
    for buf in &bufs {
        let s = capture_on.cudarc();
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        s.begin_capture(mode)?;
        let (addr, _sync) = buf.device_ptr(s);
        temporary(k, &capture_on, allocating)?;
        touch(k, &capture_on, addr)?;
        let graph = s.end_capture(sys::CUgraphInstantiate_flags(0))?;
        let graph = graph.ok_or("no graph")?;
        // Uploaded as the crate does when its upload is on.
        if b.graph_upload() {
            graph.upload()?;
        }
        graphs.push(graph);
        if allocating {
            // The copy for a step graph: captured, not instantiated.
            s.begin_capture(mode)?;
            temporary(k, &capture_on, allocating)?;
            touch(k, &capture_on, addr)?;
            let mut copy = std::ptr::null_mut();
            let code = unsafe { sys::cuStreamEndCapture(s.cu_stream(), &mut copy) };
            assert_eq!(code, sys::CUresult::CUDA_SUCCESS);
            copies.push(copy);
        }
    }
    let captured = t2.elapsed().as_secs_f64();
    for copy in copies {
        unsafe { sys::cuGraphDestroy(copy) };
    }
    capture_on.synchronize()?;
    let planned = 0.0;
    Ok((
        Captured { planned, captured },
        HandLadder { graphs, capture_on },
    ))
}

/// One round of composing a ladder's step graphs by hand: a parent graph
/// of child graph nodes per bucket, each layer after the one `stride`
/// before it (1: one chain; 2: two, the crate's edges), instantiated, not
/// uploaded (the crate uploads
/// runner graphs, not step graphs: their first launch does); then
/// destroyed. Seconds (runners that allocate are not composed by hand: a
/// graph with memory nodes goes into a parent only moved,
/// `cuGraphAddNode_v2`).
fn hand_round(graphs: &[CudaGraph], (buckets, layers): (usize, usize), stride: usize) -> f64 {
    let t3 = Instant::now();
    let mut execs = Vec::with_capacity(buckets);
    for bucket in 0..buckets {
        unsafe {
            let mut parent = std::ptr::null_mut();
            assert_eq!(
                sys::cuGraphCreate(&mut parent, 0),
                sys::CUresult::CUDA_SUCCESS
            );
            let mut added: Vec<sys::CUgraphNode> = Vec::with_capacity(layers);
            for (l, g) in graphs[bucket * layers..(bucket + 1) * layers]
                .iter()
                .enumerate()
            {
                let mut node = std::ptr::null_mut();
                let deps: &[sys::CUgraphNode] = match l.checked_sub(stride) {
                    Some(before) => std::slice::from_ref(&added[before]),
                    None => &[],
                };
                let code = sys::cuGraphAddChildGraphNode(
                    &mut node,
                    parent,
                    deps.as_ptr(),
                    deps.len(),
                    g.cu_graph(),
                );
                assert_eq!(code, sys::CUresult::CUDA_SUCCESS);
                added.push(node);
            }
            let mut exec = std::ptr::null_mut();
            assert_eq!(
                sys::cuGraphInstantiateWithFlags(&mut exec, parent, 0),
                sys::CUresult::CUDA_SUCCESS
            );
            execs.push((exec, parent));
        }
    }
    let built = t3.elapsed().as_secs_f64();
    for (exec, parent) in execs {
        unsafe {
            sys::cuGraphExecDestroy(exec);
            sys::cuGraphDestroy(parent);
        }
    }
    built
}

/// The step builds of one ladder row, medians in seconds: the crate's, and
/// by hand one chain and two chains (the crate's edges); NaN by hand for
/// allocating runners.
struct Builds {
    crate_side: f64,
    one_chain: f64,
    two_chains: f64,
}

/// Rounds of step builds, the crate's and the hand-made ones (one chain,
/// two chains) interleaved round by round, their order rotating from one
/// round to the next (each goes first, second and third equally often:
/// a round that follows the teardown of another's graphs may pay for it),
/// so that a slow stretch of the host falls on all three; medians.
fn interleaved_builds(
    c: &mut CrateLadder,
    h: &HandLadder,
    shape: (usize, usize),
    allocating: bool,
) -> R<Builds> {
    let mut rounds: [Vec<f64>; 3] = Default::default();
    let [x, y] = &c.lanes;
    for round in 0..build_rounds(shape.0, allocating) {
        for turn in 0..3 {
            let side = (round + turn) % 3;
            let t = match side {
                0 => crate_round(&mut c.replayable, shape, [x, y], allocating)?,
                _ if allocating => continue,
                stride => hand_round(&h.graphs, shape, stride),
            };
            rounds[side].push(t);
        }
    }
    let [mut mine, mut one, mut two] = rounds;
    let mid = |v: &mut Vec<f64>| if v.is_empty() { f64::NAN } else { median(v) };
    Ok(Builds {
        crate_side: mid(&mut mine),
        one_chain: mid(&mut one),
        two_chains: mid(&mut two),
    })
}

/// Host time to capture, seal and build step graphs, against cudarc
/// capturing and instantiating the same work by hand: a ladder of
/// `buckets` x `layers` runners (one kernel each), every bucket's runners
/// then composed into one step graph (by hand: a parent graph of child
/// graph nodes in a chain, instantiated); beside them, the crate's builds
/// of the same ladder on `sim` ([`sim_builds`]).
///
/// One row of the capture ladder. Each side captures three times, in the
/// order crate, hand, hand, crate, crate, hand, and keeps its best run:
/// whichever goes first after the other grows the driver's own pools
/// (device memory for uploaded executables) and the second reuses them,
/// so a fixed order charges that growth to one side. Then, on the last
/// capture of each side, [`build_rounds`] rounds of step builds, the two
/// sides interleaved round by round ([`interleaved_builds`]; runners that
/// allocate: one build, one step copy each).
fn capture_ladder(
    b: &cuda::Device,
    k: &Kernels,
    shape: (usize, usize),
    allocating: bool,
    print: bool,
) -> R<()> {
    let (c1, side) = crate_ladder(b, k, shape, allocating)?;
    drop(side);
    let (h1, side) = hand_ladder(b, k, shape, allocating)?;
    drop(side);
    let (h2, side) = hand_ladder(b, k, shape, allocating)?;
    drop(side);
    let (c2, side) = crate_ladder(b, k, shape, allocating)?;
    drop(side);
    let (c3, mut crate_side) = crate_ladder(b, k, shape, allocating)?;
    let (h3, hand_side) = hand_ladder(b, k, shape, allocating)?;
    let built = interleaved_builds(&mut crate_side, &hand_side, shape, allocating)?;
    crate_side.capture_on.synchronize()?;
    hand_side.capture_on.synchronize()?;
    drop((crate_side, hand_side));
    let (c, h) = (c1.min(c2).min(c3), h1.min(h2).min(h3));
    if !print {
        return Ok(());
    }
    let (buckets, layers) = shape;
    let n = (buckets * layers) as f64;
    let us = |t: f64| t * 1e6 / n;
    // By hand, no parent graph for allocating runners: no reference.
    let (hand, ratio, two, ratio_two) = if allocating {
        let none = || "—".to_string();
        (none(), none(), none(), none())
    } else {
        (
            format!("{:.3}", built.one_chain * 1e3),
            format!("{:.2}x", built.crate_side / built.one_chain),
            format!("{:.3}", built.two_chains * 1e3),
            format!("{:.2}x", built.crate_side / built.two_chains),
        )
    };
    // The crate's own work in those builds, on this host's CPU (`sim`).
    let on_sim = if allocating {
        "—".to_string()
    } else {
        format!("{:.3}", sim_builds(shape)? * 1e3)
    };
    println!(
        "| {buckets} x {layers}{} | {} | {:.2} | {:.2} | {:.2} | {:.2}x | {:.3} | {hand} | {ratio} | {two} | {ratio_two} | {on_sim} | {:.2}x / {:.2}x |",
        if allocating { ", allocating" } else { "" },
        if b.graph_upload() { "on" } else { "off" },
        us(c.planned),
        us(c.captured),
        us(h.captured),
        c.captured / h.captured,
        built.crate_side * 1e3,
        c1.captured / h1.captured,
        c2.captured / h2.captured,
    );
    Ok(())
}

/// `cuda::Device` with its step compositions timed: what a step build
/// spends in the driver's composition and instantiation
/// (`Compose::compose`), apart from the crate's own work around it.
/// Every other call goes to the device as it is.
#[derive(Clone)]
struct Timed(cuda::Device, Arc<AtomicU64>);

mod timed {
    use super::*;
    use replay_arena::backend::{
        Allocate, ArenaDesc, Backend, BackendError, Capture, Compose, GraphMemory, GraphRejection,
        Launch, StepEnd, StepNode, Temporaries,
    };
    use replay_arena::Cut;
    type Res<T> = Result<T, BackendError>;

    impl Streams for Timed {
        type Event = cuda::Event;
        type Stream = cuda::Stream;
        fn create_event(&self) -> Res<cuda::Event> {
            self.0.create_event()
        }
        fn stream_id(&self, stream: &cuda::Stream) -> u64 {
            self.0.stream_id(stream)
        }
        fn wait_event(&self, stream: &cuda::Stream, event: &cuda::Event) -> Res<()> {
            self.0.wait_event(stream, event)
        }
        fn record_event(&self, stream: &cuda::Stream, event: &cuda::Event) -> Res<()> {
            self.0.record_event(stream, event)
        }
        fn synchronize_event(&self, event: &cuda::Event) -> Res<()> {
            self.0.synchronize_event(event)
        }
        fn event_done(&self, event: &cuda::Event) -> Res<bool> {
            self.0.event_done(event)
        }
        fn is_capturing(&self, stream: &cuda::Stream) -> Res<bool> {
            self.0.is_capturing(stream)
        }
        fn synchronize(&self) -> Res<()> {
            Streams::synchronize(&self.0)
        }
    }

    impl Allocate for Timed {
        type Arena = cuda::Arena;
        fn allocate_arena(&self, desc: &ArenaDesc) -> Res<cuda::Arena> {
            self.0.allocate_arena(desc)
        }
    }

    impl Capture for Timed {
        type Graph = cuda::Graph;
        fn begin_capture(&self, stream: &cuda::Stream) -> Res<()> {
            self.0.begin_capture(stream)
        }
        unsafe fn end_capture(&self, stream: &cuda::Stream) -> Res<cuda::Graph> {
            // SAFETY: the caller's contract, passed on.
            unsafe { self.0.end_capture(stream) }
        }
        unsafe fn end_capture_part(&self, stream: &cuda::Stream) -> Res<cuda::Graph> {
            // SAFETY: the caller's contract, passed on.
            unsafe { self.0.end_capture_part(stream) }
        }
        unsafe fn abort_capture(&self, stream: &cuda::Stream) {
            // SAFETY: the caller's contract, passed on.
            unsafe { self.0.abort_capture(stream) }
        }
        fn record_event_node(&self, stream: &cuda::Stream, event: &cuda::Event) -> Res<()> {
            self.0.record_event_node(stream, event)
        }
        fn cuts_at(&self, graph: &cuda::Graph, event: &cuda::Event) -> Res<Cut> {
            self.0.cuts_at(graph, event)
        }
        unsafe fn cut_capture(&self, stream: &cuda::Stream) -> Res<cuda::Graph> {
            // SAFETY: the caller's contract, passed on.
            unsafe { self.0.cut_capture(stream) }
        }
        fn validate_parts(&self, parts: &[&cuda::Graph]) -> Result<(), GraphRejection> {
            self.0.validate_parts(parts)
        }
        fn validate_graph(&self, graph: &cuda::Graph) -> Result<(), GraphRejection> {
            self.0.validate_graph(graph)
        }
        fn graph_temporaries(&self, graph: &cuda::Graph) -> Res<Temporaries> {
            self.0.graph_temporaries(graph)
        }
    }

    impl Launch for Timed {
        unsafe fn launch(&self, graph: &cuda::Graph, stream: &cuda::Stream) -> Res<()> {
            // SAFETY: the caller's contract, passed on.
            unsafe { self.0.launch(graph, stream) }
        }
    }

    impl Backend for Timed {
        fn name(&self) -> &'static str {
            "cuda, compositions timed"
        }
        fn graph_memory_in_use(&self) -> Res<Option<GraphMemory>> {
            Backend::graph_memory_in_use(&self.0)
        }
        fn trim_graph_memory(&self) -> Res<()> {
            Backend::trim_graph_memory(&self.0)
        }
        fn graph_memory_granule(&self) -> u64 {
            Backend::graph_memory_granule(&self.0)
        }
    }

    impl Compose for Timed {
        fn split_graph(
            &self,
            graph: &cuda::Graph,
            events: &[&cuda::Event],
        ) -> Res<(cuda::Graph, cuda::Graph, usize)> {
            self.0.split_graph(graph, events)
        }
        fn compose(
            &self,
            nodes: Vec<StepNode<'_, cuda::Graph, cuda::Event>>,
            end: Option<StepEnd<'_, cuda::Event>>,
        ) -> Res<cuda::Graph> {
            let t = Instant::now();
            let composed = self.0.compose(nodes, end);
            self.1
                .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
            composed
        }
        fn retarget_records(&self, graph: &mut cuda::Graph, events: &[&cuda::Event]) -> Res<()> {
            self.0.retarget_records(graph, events)
        }
    }
}

/// Where a step build's time goes: the crate's builds of a ladder on a
/// backend that times its compositions ([`Timed`]), interleaved round by
/// round with the same graphs composed by hand (two chains); medians of
/// the whole build, of its time in the driver's composition and
/// instantiation, and of the rest (the crate's own work, and stating the
/// schedule).
fn build_split(b: &cuda::Device, k: &Kernels, shape: (usize, usize)) -> R<()> {
    let (buckets, layers) = shape;
    let req = Request::new(Domain::Device, DType::F32, 16384);
    let timed = Timed(b.clone(), Arc::new(AtomicU64::new(0)));
    let capture_on = b.new_stream()?;
    let mut capturing = ladder_plan(shape, req)?.allocate(timed.clone())?;
    for r in 0..buckets * layers {
        let cap = capturing.capture(RunnerId(r as u32))?;
        let v = cap.take(req)?;
        cap.stream_capture(&capture_on, |s| touch(k, s, v.device_address()))?;
        cap.finish()?;
    }
    let mut replayable = capturing.seal()?;
    let (_, hand) = hand_ladder(b, k, shape, false)?;
    let (x, y) = (b.new_stream()?, b.new_stream()?);
    let (mut whole, mut inside, mut outside, mut by_hand) = (vec![], vec![], vec![], vec![]);
    for round in 0..build_rounds(buckets, false) {
        let mut hand_round_now = || by_hand.push(hand_round(&hand.graphs, shape, 2));
        if round % 2 == 1 {
            hand_round_now();
        }
        timed.1.store(0, Ordering::Relaxed);
        let t = crate_round(&mut replayable, shape, [&x, &y], false)?;
        let composing = timed.1.load(Ordering::Relaxed) as f64 * 1e-9;
        whole.push(t);
        inside.push(composing);
        outside.push(t - composing);
        if round % 2 == 0 {
            hand_round_now();
        }
    }
    capture_on.synchronize()?;
    let ms = |v: &mut Vec<f64>| median(v) * 1e3;
    println!(
        "| {buckets} x {layers} | {} | {:.3} | {:.3} | {:.3} | {:.3} |",
        if b.graph_upload() { "on" } else { "off" },
        ms(&mut whole),
        ms(&mut inside),
        ms(&mut outside),
        ms(&mut by_hand),
    );
    Ok(())
}

/// Capture cost as runners grow (`capture_ladder`).
fn capture_cost(b: &cuda::Device, k: &Kernels) -> R<()> {
    println!("## host time to capture, seal and build step graphs, against cudarc by hand");
    println!(
        "| buckets x layers | upload | crate plan + allocate µs/runner | crate capture + seal \
         µs/runner | by hand capture + instantiate µs/runner | ratio | crate step graphs ms | \
         by hand ms (one chain) | ratio | by hand ms (the step's edges: two chains) | ratio | \
         crate step graphs on sim ms | capture ratio, crate first / crate last |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    // The first ladder warms the driver and the module up (not printed).
    capture_ladder(b, k, (1, 16), false, false)?;
    let no_upload = b.clone().with_graph_upload(false);
    // Up to 64 buckets: step graph builds cost in proportion to their
    // bucket, so the crate's builds stay in step with composing by hand.
    for (buckets, layers) in [(1, 16), (1, 32), (1, 64), (4, 32), (16, 32), (64, 32)] {
        capture_ladder(b, k, (buckets, layers), false, true)?;
        capture_ladder(&no_upload, k, (buckets, layers), false, true)?;
    }
    // Runners that allocate: captured twice by the crate and by hand.
    for (buckets, layers) in [(1, 64), (4, 32)] {
        capture_ladder(b, k, (buckets, layers), true, true)?;
        capture_ladder(&no_upload, k, (buckets, layers), true, true)?;
    }
    println!(
        "\n## where a step build's time goes: the crate's builds on a backend that times its compositions, interleaved with the same graphs composed by hand (two chains); medians, ms"
    );
    println!("| buckets x layers | upload | crate's build | in the driver's composition and instantiation | the rest | by hand |");
    println!("|---|---|---:|---:|---:|---:|");
    for shape in [(1, 32), (4, 32), (16, 32)] {
        build_split(b, k, shape)?;
        build_split(&no_upload, k, shape)?;
    }
    // The one driver object a step build makes that composing by hand
    // does not: its completion event.
    let (mut made, mut plain) = (Vec::new(), Vec::new());
    for _ in 0..20 {
        let t = Instant::now();
        let events = (0..100)
            .map(|_| b.create_event())
            .collect::<Result<Vec<_>, _>>()?;
        made.push(t.elapsed().as_secs_f64() * 1e7);
        drop(events);
        let t = Instant::now();
        let events = (0..100)
            .map(|_| {
                b.context()
                    .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
            })
            .collect::<Result<Vec<_>, _>>()?;
        plain.push(t.elapsed().as_secs_f64() * 1e7);
        drop(events);
    }
    println!(
        "\nan event as a step build makes it (created, recorded once): {:.0} ns; created only: {:.0} ns (medians of 20 x 100)",
        median(&mut made),
        median(&mut plain)
    );
    Ok(())
}

/// A chain of runners whose graphs allocate (a framework's ops), each
/// writing a handoff early, marking it ready, then running a long tail on a
/// temporary; the next runner, on the other stream of the pool, reads the
/// handoff first. With `ready`, each writer marks its ready point; without,
/// readers wait for the writer's whole graph. With `across`, the tail runs
/// on the temporary the head allocated, freed after the ready point (the
/// step copies stay whole there: a cut would pass the temporary from part
/// to part); without, the head frees its temporary before the ready point
/// and the tail allocates its own (the copies are cut there). With
/// `cut_across` too, the copies are cut across the temporary as chosen
/// (`RunnerCapture::cut_across_temporaries`).
fn ready_chain(
    b: &cuda::Device,
    capture_on: &cuda::Stream,
    k: &Kernels,
    ready: bool,
    (across, cut_across): (bool, bool),
) -> R<Replayable<cuda::Device>> {
    use replay_arena::HandoffId;
    const LAYERS: usize = 8;
    let req = Request::new(Domain::Device, DType::F32, 16384);
    let mut d = Discovering::new(PlanConfig::new());
    let mut hs: Vec<HandoffId> = Vec::new();
    for l in 0..LAYERS {
        let mut armed = d.arm(RunnerId(l as u32))?;
        armed.record(req)?;
        if l > 0 {
            armed.receive(hs[l - 1])?;
        }
        if l + 1 < LAYERS {
            hs.push(armed.hand_off(req)?);
        }
    }
    let mut capturing = d.plan(Policy::OverlapDepth(2))?.allocate(b.clone())?;
    for l in 0..LAYERS {
        let cap = capturing.capture(RunnerId(l as u32))?;
        let own = cap.take(req)?.device_address();
        let input = if l > 0 {
            Some(cap.receive(hs[l - 1])?.device_address())
        } else {
            None
        };
        let output = if l + 1 < LAYERS {
            Some((hs[l], cap.hand_off(hs[l])?.device_address()))
        } else {
            None
        };
        if cut_across {
            cap.cut_across_temporaries();
        }
        cap.stream_capture_repeatable(capture_on, |s| {
            let t = s
                .cudarc()
                .alloc_zeros::<f32>(16384)
                .map_err(|e| format!("{e:?}"))?;
            let tmp = t.device_ptr(s.cudarc()).0;
            if let Some(input) = input {
                read(k, s, input, tmp)?;
            }
            spin(k, s, tmp, 4096, READY_HEAD)?; // the input gradient
            if let Some((_, out)) = output {
                read(k, s, tmp, out)?;
            }
            let t = if across {
                Some(t)
            } else {
                drop(t); // freed before the ready point
                None
            };
            if let (Some((h, _)), true) = (output, ready) {
                cap.ready(h, s).map_err(|e| e.to_string())?;
            }
            let (t, tmp) = match t {
                Some(t) => (t, tmp),
                None => {
                    // The tail's own temporary, allocated after the ready point.
                    let t = s
                        .cudarc()
                        .alloc_zeros::<f32>(16384)
                        .map_err(|e| format!("{e:?}"))?;
                    let tmp = t.device_ptr(s.cudarc()).0;
                    read(k, s, own, tmp)?;
                    (t, tmp)
                }
            };
            spin(k, s, tmp, 4096, READY_TAIL)?; // the weight gradient
            read(k, s, tmp, own)?;
            drop(t);
            Ok::<(), String>(())
        })?;
        cap.finish()?;
    }
    Ok(capturing.seal()?)
}

const READY_HEAD: i64 = 20_000;
const READY_TAIL: i64 = 60_000;

fn ready_cost(b: &cuda::Device, k: &Kernels) -> R<()> {
    const STEPS: usize = 50;
    const ROUNDS: usize = 15;
    let capture_on = b.new_stream()?;
    let pool = [b.new_stream()?, b.new_stream()?];
    let launch = b.new_stream()?;
    let mut per_runner = ready_chain(b, &capture_on, k, true, (false, false))?;
    let mut cut = ready_chain(b, &capture_on, k, true, (false, false))?;
    let mut across = ready_chain(b, &capture_on, k, true, (true, false))?;
    let mut whole = ready_chain(b, &capture_on, k, false, (false, false))?;
    let mut chosen = ready_chain(b, &capture_on, k, true, (true, true))?;
    let layers = per_runner.plan().runners().count();
    let schedule = |r: &mut Replayable<cuda::Device>| -> R<_> {
        let mut step = r.step();
        for l in 0..layers {
            step.replay(RunnerId(l as u32), &pool[l % 2])?;
        }
        Ok(step.build()?.keep())
    };
    // What the driver reserves as each step graph is built and launched
    // once (the graphs share the pool: each figure is the total so far).
    let mut reserved = Vec::new();
    let mut first =
        |r: &mut Replayable<cuda::Device>, s: &mut replay_arena::KeptStep<cuda::Device>| -> R<()> {
            r.launch_kept(s, &launch)?;
            b.synchronize()?;
            reserved.push(b.graph_memory_in_use()?.reserved);
            Ok(())
        };
    for l in 0..layers {
        per_runner.replay(RunnerId(l as u32), &pool[l % 2])?;
    }
    b.synchronize()?;
    let per_runner_reserved = b.graph_memory_in_use()?.reserved;
    let mut cut_step = schedule(&mut cut)?;
    first(&mut cut, &mut cut_step)?;
    let mut across_step = schedule(&mut across)?;
    first(&mut across, &mut across_step)?;
    let mut whole_step = schedule(&mut whole)?;
    first(&mut whole, &mut whole_step)?;
    let mut chosen_step = schedule(&mut chosen)?;
    first(&mut chosen, &mut chosen_step)?;
    let modes = [
        "per runner: fenced replays, ready points kept",
        "step graph: copies cut at their ready point (no temporary across it)",
        "step graph: a temporary across the ready point (copies kept whole there)",
        "step graph: no ready point (readers wait for whole graphs)",
        "step graph: a temporary across the ready point, cut there as chosen (`cut_across_temporaries`)",
    ];
    let mut wall: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
    for round in 0..=ROUNDS {
        for (m, times) in wall.iter_mut().enumerate() {
            b.synchronize()?;
            let t = Instant::now();
            for _ in 0..STEPS {
                match m {
                    0 => {
                        for l in 0..layers {
                            per_runner.replay(RunnerId(l as u32), &pool[l % 2])?;
                        }
                    }
                    1 => cut.launch_kept(&mut cut_step, &launch)?,
                    2 => across.launch_kept(&mut across_step, &launch)?,
                    3 => whole.launch_kept(&mut whole_step, &launch)?,
                    _ => chosen.launch_kept(&mut chosen_step, &launch)?,
                }
            }
            b.synchronize()?;
            if round > 0 {
                times.push(t.elapsed().as_nanos() as f64 / STEPS as f64 / 1e3);
            }
        }
    }
    println!(
        "\n## ready points of allocating runners in a step graph: {layers} runners on 2 streams, each allocating a temporary, writing a handoff, marking it ready, then a tail ~3x the head on a temporary; median of {ROUNDS} rounds of {STEPS} steps, modes interleaved"
    );
    println!(
        "cut step graph: {} nodes; temporary across: {} nodes; whole: {} nodes; cut across as chosen: {} nodes",
        cut_step.nodes(),
        across_step.nodes(),
        whole_step.nodes(),
        chosen_step.nodes()
    );
    println!(
        "graph memory reserved: per-runner graphs {} KiB; after each step graph's first launch {:?} KiB",
        per_runner_reserved >> 10,
        reserved.iter().map(|r| r >> 10).collect::<Vec<_>>()
    );
    println!("| mode | wall us/step | vs per runner |");
    println!("|---|---:|---:|");
    let base = median(&mut wall[0].clone());
    for (m, name) in modes.iter().enumerate() {
        let w = median(&mut wall[m]);
        println!("| {name} | {w:.1} | {:.2}x |", w / base);
    }
    drop(cut_step);
    drop(whole_step);
    drop(chosen_step);
    Ok(())
}

fn main() -> R<()> {
    if let Err(e) = probe() {
        println!("gpu_replay: skipped, no usable GPU: {e}");
        return Ok(());
    }
    let b = cuda::Device::new(0)?;
    println!("gpu_replay on {}", b.info());
    let k = kernels(&b)?;
    let picked: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let run = |name: &str| picked.is_empty() || picked.iter().any(|p| p == name);
    if run("host") {
        host_cost(&b, &k)?;
    }
    if run("overlap") {
        overlap(&b, &k)?;
    }
    if run("step") {
        step_cost(&b, &k, false)?;
        step_cost(&b, &k, true)?;
    }
    if run("trace") {
        trace_cost(&b, &k)?;
        step_trace_cost(&b, &k)?;
    }
    if run("buckets") {
        bucket_cost(&b, &k)?;
    }
    if run("capture") {
        capture_cost(&b, &k)?;
    }
    if run("ready") {
        ready_cost(&b, &k)?;
    }
    Ok(())
}
