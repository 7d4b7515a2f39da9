//! CPU benchmarks of the planner and of the per-request and per-replay
//! bookkeeping (`cargo bench --bench planner`; about four minutes).
//!
//! - `plan/{round_robin,packed}/G3/{model,random}/{100,1000,10000}`:
//!   `Discovering::plan` with `Policy::Generations(3)` for that many runners
//!   of 8 requests each (4 keys, in a period-3 experts/router/attention
//!   pattern), with model-like repeating sizes or pseudo-random ones (see
//!   [`Sizes`]). Target: 10,000 runners in under 10 ms.
//! - `scale/*`: 100,000 runners at G = 2, 64 and 100,000, and 100,000
//!   symmetric groups (see [`bench_scale`]). Target: under 1 s each.
//! - `take/per_request`: one `RunnerCapture::take` on `sim` (the capture is
//!   opened outside the timed region). Target: under 50 ns.
//! - `replay/*`: one replay of a graph of one zero-duration fill of 64 `f32`s
//!   on `sim`: fenced on one stream (waits elided), fenced over two streams
//!   (real waits), and `unsafe replay_unfenced`. The fenced minus unfenced
//!   time is the fence's bookkeeping; both include the `sim` backend's own
//!   cost (its stream model and hazard detector).
//! - `buckets/{round_robin,packed}/{decode9x32,train4x16}`: planning nine
//!   decode buckets (batch 1 to 256, 32 layers each) or four training ones
//!   (sequence lengths 1k to 8k of the `tp_backward` mid shapes) in shared
//!   arenas; prints the shared bytes against separate plans (see
//!   [`bench_buckets`]).
//! - `review/{fragmented_handoffs,buckets,readers}/{round_robin,packed}/{10000,100000,1000000}`:
//!   the three workloads the sixth hostile review found growing in square
//!   time, discovered and planned (see [`bench_review`]). Target: under
//!   0.5 s at 100,000, and within 2.5x per 10x step up to 1,000,000.
//! - `step_builds/{capture_seal,build}/{1,4,16,64,128}x32`: on `sim`, a
//!   ladder of buckets of 32 layers (one fill each): capturing, finishing
//!   and sealing every runner, and building (and keeping) one step graph
//!   per bucket, its layers on two streams in turn (see
//!   [`bench_step_builds`]). Per runner (criterion's throughput, in
//!   runners): both flat in the number of buckets.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion};
use replay_arena::sim;
use replay_arena::{
    Capturing, DType, Discovering, Domain, GroupId, HandoffId, PlacedPolicy, PlanConfig, Policy,
    Purpose, Replayable, Request, RunnerId,
};

const GTP: GroupId = GroupId(0);
const EXPERT_GTP: GroupId = GroupId(1);

fn config() -> PlanConfig {
    PlanConfig::new()
        .with_group(GTP, "gtp")
        .and_then(|c| c.with_group(EXPERT_GTP, "expert-gtp"))
        .expect("two distinct groups")
}

/// xorshift64*: deterministic sizes without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform-ish in `lo..hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo)
    }
}

/// How request sizes vary between runners.
#[derive(Clone, Copy, Debug)]
enum Sizes {
    /// Like a model: every layer has the same shapes, so capacities repeat
    /// with the period-3 experts/router/attention pattern.
    Model,
    /// Pseudo-random sizes on top of the same pattern: every capacity
    /// differs, the hardest case for packed placement and its fences.
    Random,
}

/// The 8 requests of runner `k`: two wgrad reduce-scatter inputs (dense or,
/// every third runner, expert group), their RS outputs, their FP32
/// accumulation scratch, one FP32 RS scratch and one other buffer.
fn requests(k: usize, sizes: Sizes, rng: &mut Rng) -> [Request; 8] {
    let (group, scale) = match k % 3 {
        0 => (EXPERT_GTP, 8),
        1 => (GTP, 1),
        _ => (GTP, 3),
    };
    let mut size = |lo: u64, hi: u64| match sizes {
        Sizes::Model => (lo + hi) / 2,
        Sizes::Random => rng.range(lo, hi),
    };
    let a = size(1 << 16, 1 << 20) * scale;
    let b = size(1 << 17, 1 << 20) * scale;
    let scratch = size(1024, 65536);
    let other = size(1024, 1 << 18);
    let wgrad =
        |e| Request::new(Domain::Symmetric(group), DType::BF16, e).purpose(Purpose::WgradRsInput);
    let out = |e: u64| Request::new(Domain::Device, DType::BF16, e / 8).purpose(Purpose::RsOutput);
    let acc =
        |e: u64| Request::new(Domain::Device, DType::F32, e / 8).purpose(Purpose::Fp32AccumScratch);
    [
        wgrad(a),
        out(a),
        acc(a),
        wgrad(b),
        out(b),
        acc(b),
        Request::new(Domain::Device, DType::F32, scratch).purpose(Purpose::Fp32RsScratch),
        Request::new(Domain::Device, DType::BF16, other),
    ]
}

fn discovery(runners: usize, sizes: Sizes) -> Discovering {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut d = Discovering::new(config());
    for k in 0..runners {
        let mut armed = d.arm(RunnerId(k as u32)).expect("fresh runner");
        for r in requests(k, sizes, &mut rng) {
            armed.record(r).expect("valid request");
        }
    }
    d
}

fn bench_plan(c: &mut Criterion) {
    let mut group = c.benchmark_group("plan");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    let policy = Policy::Generations(3);
    let strategies: [(&str, PlacedPolicy); 2] =
        [("round_robin", policy.into()), ("packed", policy.packed())];
    for sizes in [Sizes::Model, Sizes::Random] {
        for n in [100, 1_000, 10_000] {
            let d = discovery(n, sizes);
            for (name, strategy) in strategies {
                let id = format!("{name}/G3/{}", format!("{sizes:?}").to_lowercase());
                group.bench_with_input(BenchmarkId::new(id, n), &strategy, |b, &strategy| {
                    b.iter_custom(|iters| {
                        let mut total = Duration::ZERO;
                        for _ in 0..iters {
                            let input = d.clone();
                            let start = Instant::now();
                            let planned = black_box(input.plan(strategy).expect("plannable"));
                            total += start.elapsed();
                            drop(planned);
                        }
                        total
                    })
                });
            }
        }
    }
    group.finish();
}

/// Requests per captured runner in the `take` benchmark: enough that the
/// clock reads around each batch cost nothing per request.
const TAKES: usize = 1024;

fn take_workload() -> (Vec<Request>, Discovering) {
    let keys = [
        (Domain::Symmetric(GTP), DType::BF16),
        (Domain::Device, DType::BF16),
        (Domain::Device, DType::F32),
        (Domain::Symmetric(EXPERT_GTP), DType::BF16),
    ];
    let reqs: Vec<Request> = (0..TAKES)
        .map(|i| {
            let (domain, dtype) = keys[i % keys.len()];
            Request::new(domain, dtype, 64 + (i as u64 % 7))
        })
        .collect();
    let mut d = Discovering::new(config());
    for r in 0..4u32 {
        let mut armed = d.arm(RunnerId(r)).expect("fresh runner");
        for &q in &reqs {
            armed.record(q).expect("valid request");
        }
    }
    (reqs, d)
}

fn bench_take(c: &mut Criterion) {
    let (reqs, d) = take_workload();
    let planned = d.plan(Policy::Generations(2)).expect("plannable");
    let mut group = c.benchmark_group("take");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    group.bench_function("per_request", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters as usize;
            while left > 0 {
                let mut capturing: Capturing<sim::Device> = planned
                    .clone()
                    .allocate(sim::Device::new())
                    .expect("sim allocates");
                for r in 0..4u32 {
                    if left == 0 {
                        break;
                    }
                    let cap = capturing.capture(RunnerId(r)).expect("first capture");
                    let n = left.min(TAKES);
                    let start = Instant::now();
                    for &q in &reqs[..n] {
                        black_box(cap.take(black_box(q)).expect("as discovered"));
                    }
                    total += start.elapsed();
                    left -= n;
                }
            }
            total
        })
    });
    group.finish();
}

/// Runners in the replay benchmark (G = 2).
const REPLAY_RUNNERS: u32 = 8;
/// Replays between two (untimed) synchronizations, which keep the sim's
/// pending-op and access lists short.
const REPLAY_BATCH: u64 = 16;

fn replayable(sim: &sim::Device) -> Replayable<sim::Device> {
    let req = Request::new(Domain::Device, DType::F32, 64);
    let mut d = Discovering::new(PlanConfig::new());
    for r in 0..REPLAY_RUNNERS {
        d.arm(RunnerId(r))
            .and_then(|mut a| a.record(req))
            .expect("fresh runner");
    }
    let stream = sim.new_stream();
    let mut capturing = d
        .plan(Policy::Generations(2))
        .expect("a valid policy")
        .allocate(sim.clone())
        .expect("sim allocates");
    for r in 0..REPLAY_RUNNERS {
        let cap = capturing.capture(RunnerId(r)).expect("first capture");
        let view = cap.take(req).expect("as discovered");
        cap.stream_capture(&stream, |s| {
            sim.launch(s, sim::Kernel::fill(&view, r as f32), 0)
        })
        .expect("sim captures");
        cap.finish().expect("exact consumption");
    }
    capturing.seal().expect("every runner captured")
}

#[derive(Clone, Copy)]
enum Replay {
    FencedOneStream,
    FencedTwoStreams,
    Unfenced,
}

fn bench_replay(c: &mut Criterion) {
    let mut group = c.benchmark_group("replay");
    group
        .sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    let cases = [
        ("fenced/one_stream", Replay::FencedOneStream),
        ("fenced/two_streams", Replay::FencedTwoStreams),
        ("unfenced/one_stream", Replay::Unfenced),
    ];
    for (name, case) in cases {
        let sim = sim::Device::new();
        let mut replayable = replayable(&sim);
        let streams = [sim.new_stream(), sim.new_stream()];
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut done = 0u64;
                while done < iters {
                    let n = (iters - done).min(REPLAY_BATCH);
                    let start = Instant::now();
                    for i in done..done + n {
                        let runner = RunnerId((i % u64::from(REPLAY_RUNNERS)) as u32);
                        match case {
                            Replay::FencedOneStream => replayable.replay(runner, &streams[0]),
                            Replay::FencedTwoStreams => {
                                replayable.replay(runner, &streams[(i % 2) as usize])
                            }
                            // SAFETY: one stream, so every earlier replay is
                            // ordered before this one; nothing else runs.
                            Replay::Unfenced => unsafe {
                                replayable.replay_unfenced(runner, &streams[0])
                            },
                        }
                        .expect("sim replays");
                    }
                    total += start.elapsed();
                    replayable.synchronize().expect("sim synchronizes");
                    done += n;
                }
                total
            })
        });
        assert!(sim.hazards().is_empty(), "{name}: {:?}", sim.hazards());
    }
    group.finish();
}

/// The crate's host cost of a consumer (its closure does nothing) and of
/// reading a runner's views, on `sim`: the same code runs against earlier
/// releases, whose `views` returned a `Vec`.
fn bench_consume(c: &mut Criterion) {
    let mut group = c.benchmark_group("consume");
    group
        .sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    let sim = sim::Device::new();
    let mut replayable = replayable(&sim);
    let stream = sim.new_stream();
    for r in 0..REPLAY_RUNNERS {
        replayable
            .replay(RunnerId(r), &stream)
            .expect("sim replays");
    }
    let last = RunnerId(REPLAY_RUNNERS - 1);
    group.bench_function("consume/empty_closure", |b| {
        b.iter(|| {
            replayable
                .consume(last, &stream, |_, views| {
                    std::hint::black_box(views.len());
                    Ok::<(), String>(())
                })
                .expect("the runner owns its bytes")
        })
    });
    group.bench_function("views", |b| {
        b.iter(|| std::hint::black_box(replayable.views(last).expect("known").len()))
    });
    group.finish();
}

/// Opening, filling and finishing every runner's capture, as runners grow:
/// the runner lookup must stay logarithmic (a linear scan made 100k runners
/// take 15 s).
fn bench_capture(c: &mut Criterion) {
    let mut group = c.benchmark_group("capture_all");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_secs(2));
    let req = Request::new(Domain::Device, DType::F32, 64);
    for runners in [1_000u32, 10_000, 100_000] {
        let mut d = Discovering::new(PlanConfig::new());
        for r in 0..runners {
            d.arm(RunnerId(r))
                .and_then(|mut a| a.record(req))
                .expect("fresh runner");
        }
        let planned = d.plan(Policy::Generations(2)).expect("a valid policy");
        let sim = sim::Device::new();
        let stream = sim.new_stream();
        group.bench_function(BenchmarkId::from_parameter(runners), |b| {
            b.iter_batched(
                || {
                    planned
                        .clone()
                        .allocate(sim.clone())
                        .expect("sim allocates")
                },
                |mut capturing| {
                    for r in 0..runners {
                        let cap = capturing.capture(RunnerId(r)).expect("first capture");
                        let view = cap.take(req).expect("as discovered");
                        cap.stream_capture(&stream, |s| {
                            sim.launch(s, sim::Kernel::fill(&view, 1.0), 0)
                        })
                        .expect("sim captures");
                        cap.finish().expect("took exactly its capacity");
                    }
                    capturing
                },
                BatchSize::PerIteration,
            )
        });
    }
    group.finish();
}

/// Buffer-using runners, and symmetric groups, in the scale benchmarks.
const SCALE: u32 = 100_000;

/// Planning and reporting at any `G`, and many groups: no cliff.
///
/// - `scale/plan_report/{round_robin,packed}/G{2,64,all}/100000`:
///   `Discovering::plan` then `Planned::report` for 100,000 runners of the
///   `plan` benchmarks' random workload (8 requests, 4 keys each) at G = 2,
///   64 and G = the number of runners. The report of a round-robin plan
///   also searches the packed layout. Target: under 1 s.
/// - `scale/groups/{round_robin,packed}/G{2,all}/100000`: 100,000
///   symmetric groups registered with `PlanConfig::with_group`, one runner
///   per group recording one request of its group, planned at G = 2 and
///   G = the number of runners. Target: under 1 s.
fn bench_scale(c: &mut Criterion) {
    let mut group = c.benchmark_group("scale");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_secs(4));
    let n = SCALE as usize;
    let d = discovery(n, Sizes::Random);
    for (gs, g) in [("G2", 2), ("G64", 64), ("Gall", n)] {
        let policy = Policy::Generations(g);
        for (name, strategy) in [("round_robin", policy.into()), ("packed", policy.packed())] {
            let id = format!("plan_report/{name}/{gs}");
            group.bench_function(BenchmarkId::new(id, n), |b| {
                b.iter_batched(
                    || d.clone(),
                    |d: Discovering| {
                        let planned = d.plan(strategy).expect("plannable");
                        (planned.report(), planned)
                    },
                    BatchSize::PerIteration,
                )
            });
        }
    }
    let names: Vec<String> = (0..SCALE).map(|i| format!("group{i}")).collect();
    for (gs, g) in [("G2", 2), ("Gall", n)] {
        let policy = Policy::Generations(g);
        for (name, strategy) in [("round_robin", policy.into()), ("packed", policy.packed())] {
            let id = format!("groups/{name}/{gs}");
            group.bench_function(BenchmarkId::new(id, n), |b| {
                b.iter(|| {
                    let mut config = PlanConfig::new();
                    for (i, name) in names.iter().enumerate() {
                        config = config
                            .with_group(GroupId(i as u32), name.as_str())
                            .expect("distinct groups");
                    }
                    let mut d = Discovering::new(config);
                    for i in 0..SCALE {
                        let request =
                            Request::new(Domain::Symmetric(GroupId(i)), DType::BF16, 4096);
                        d.arm(RunnerId(i))
                            .and_then(|mut a| a.record(request))
                            .expect("a registered group");
                    }
                    d.plan(strategy).expect("plannable")
                })
            });
        }
    }
    group.finish();
}

/// A decode-shaped bucket list: batch sizes 1, 2, 4, ..., 256, each bucket
/// `LAYERS` runners (one per layer) with a per-layer workspace, the first
/// with its static input (token ids, staged), the last with its output.
fn decode_buckets(layers: u32) -> Discovering {
    const HIDDEN: u64 = 4096;
    let mut d = Discovering::new(PlanConfig::new());
    for (b, batch) in (0..9).map(|i| 1u64 << i).enumerate() {
        d.bucket(format!("bs={batch}")).expect("distinct names");
        for layer in 0..layers {
            let id = RunnerId(b as u32 * layers + layer);
            let mut armed = d.arm(id).expect("armed once");
            let ws = Request::new(Domain::Device, DType::BF16, 4 * HIDDEN * batch);
            armed.record(ws).expect("valid");
            if layer == 0 {
                let ids = Request::new(Domain::Device, DType::I32, batch).purpose(Purpose::Input);
                armed.record(ids).expect("valid");
            }
            if layer + 1 == layers {
                let out = Request::new(Domain::Device, DType::BF16, HIDDEN * batch);
                armed.record(out).expect("valid");
            }
        }
    }
    d
}

/// A training-shaped bucket list: sequence lengths 1k, 2k, 4k and 8k
/// tokens of the `tp_backward` mid layer shapes (hidden 4096, ffn 16384,
/// 8 layers, per module backward a 32 MiB workspace and per linear its
/// wgrad reduce-scatter input and output in symmetric memory; each
/// module's input gradient, tokens x hidden, a handoff to the next).
fn train_buckets() -> Discovering {
    const HIDDEN: u64 = 4096;
    const FFN: u64 = 16384;
    let mut d = Discovering::new(config());
    let sym = |n| Request::new(Domain::Symmetric(GTP), DType::BF16, n);
    let mut id = 0;
    for tokens in [1024u64, 2048, 4096, 8192] {
        d.bucket(format!("seq={tokens}")).expect("distinct names");
        let mut grad = None;
        for layer in (0..8).rev() {
            for linears in [&[HIDDEN * FFN, HIDDEN * FFN][..], &[HIDDEN * HIDDEN][..]] {
                let mut armed = d
                    .arm_named(
                        RunnerId(id),
                        format!("seq{tokens}.layer{layer}.{}", linears.len()),
                    )
                    .expect("armed once");
                id += 1;
                armed
                    .record(Request::new(Domain::Device, DType::U8, 32 << 20))
                    .expect("valid");
                for &w in linears {
                    armed
                        .record(sym(w).purpose(Purpose::WgradRsInput))
                        .expect("valid");
                    armed
                        .record(sym(w).purpose(Purpose::RsOutput))
                        .expect("valid");
                }
                if let Some(h) = grad.take() {
                    armed.receive(h).expect("declared");
                }
                let dx = Request::new(Domain::Device, DType::BF16, tokens * HIDDEN);
                grad = Some(armed.hand_off(dx).expect("valid"));
            }
        }
    }
    d
}

/// `buckets/{round_robin,packed}/decode9x32`: planning nine decode buckets
/// of 32 layers in shared arenas (each bucket placed alone, then laid over
/// the others). Prints the shared bytes against the sum of separate plans
/// and the largest bucket's bound once.
fn bench_buckets(c: &mut Criterion) {
    let mut group = c.benchmark_group("buckets");
    for (list, d) in [
        ("decode9x32", decode_buckets(32)),
        ("train4x16", train_buckets()),
    ] {
        for (id, strategy) in [
            ("round_robin", Policy::Generations(2).round_robin()),
            ("packed", Policy::Generations(2).packed()),
        ] {
            let report = d.clone().plan(strategy).expect("plans").report();
            println!(
            "buckets/{id}/{list}: shared {} B, separate plans {} B ({:.3}x), largest bound {} B",
            report.plan_bytes,
            report.separate_bytes,
            report.separate_bytes as f64 / report.plan_bytes as f64,
            report.lower_bound
        );
            group.bench_with_input(BenchmarkId::new(id, list), &strategy, |b, &strategy| {
                b.iter_batched(
                    || d.clone(),
                    |d| black_box(d.plan(strategy).expect("plans").total_bytes()),
                    BatchSize::SmallInput,
                )
            });
        }
    }
    group.finish();
}

fn small() -> Request {
    Request::new(Domain::Device, DType::F32, 64)
}

/// `n` runners, each with a small buffer of its own and a handoff of 512
/// bytes that the last runner reads, so every handoff is live at once;
/// runner 0 also hands off 256 bytes that runner 1 reads, which leaves a
/// gap at the bottom of the arena that no later handoff fits in.
fn fragmented_handoffs(n: u32) -> Discovering {
    let mut d = Discovering::new(PlanConfig::new());
    let long = Request::new(Domain::Device, DType::BF16, 256);
    let short = Request::new(Domain::Device, DType::BF16, 128);
    let mut held: Vec<HandoffId> = Vec::with_capacity(n as usize);
    let mut brief = None;
    for r in 0..n {
        let mut armed = d.arm(RunnerId(r)).expect("fresh runner");
        armed.record(small()).expect("valid");
        if r == 0 {
            brief = Some(armed.hand_off(short).expect("valid"));
        }
        if let (1, Some(h)) = (r, brief) {
            armed.receive(h).expect("declared");
        }
        if r + 1 < n {
            held.push(armed.hand_off(long).expect("valid"));
        } else {
            for &h in &held {
                armed.receive(h).expect("declared");
            }
        }
    }
    d
}

/// `n` shape buckets of one runner each, every name distinct.
fn many_buckets(n: u32) -> Discovering {
    let mut d = Discovering::new(PlanConfig::new());
    for r in 0..n {
        d.bucket(format!("bucket{r}")).expect("distinct names");
        d.arm(RunnerId(r))
            .and_then(|mut a| a.record(small()))
            .expect("fresh runner");
    }
    d
}

/// One handoff that runner 0 writes and the `n` runners after it read.
fn many_readers(n: u32) -> Discovering {
    let mut d = Discovering::new(PlanConfig::new());
    let grad = Request::new(Domain::Device, DType::BF16, 4096);
    let h = {
        let mut armed = d.arm(RunnerId(0)).expect("fresh runner");
        armed.record(small()).expect("valid");
        armed.hand_off(grad).expect("valid")
    };
    for r in 1..=n {
        let mut armed = d.arm(RunnerId(r)).expect("fresh runner");
        armed.record(small()).expect("valid");
        armed.receive(h).expect("declared");
    }
    d
}

/// Builds one review workload of `n` entries.
type Build = fn(u32) -> Discovering;

/// The review's three workloads at 10,000, 100,000 and 1,000,000 entries,
/// each discovered and planned with `Generations(2)` in the timed region
/// (the plan is dropped outside it): `fragmented_handoffs` (every handoff
/// live at once above a gap low in the arena), `buckets` (one runner per
/// shape bucket) and `readers` (one handoff read by every runner).
fn bench_review(c: &mut Criterion) {
    let mut group = c.benchmark_group("review");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(100))
        .measurement_time(Duration::from_secs(2));
    let workloads: [(&str, Build); 3] = [
        ("fragmented_handoffs", fragmented_handoffs),
        ("buckets", many_buckets),
        ("readers", many_readers),
    ];
    let policy = Policy::Generations(2);
    for (name, build) in workloads {
        for n in [10_000u32, 100_000, 1_000_000] {
            for (placement, strategy) in [
                ("round_robin", policy.round_robin()),
                ("packed", policy.packed()),
            ] {
                let id = format!("{name}/{placement}");
                group.bench_with_input(BenchmarkId::new(id, n), &n, |b, &n| {
                    b.iter_custom(|iters| {
                        let mut total = Duration::ZERO;
                        for _ in 0..iters {
                            let start = Instant::now();
                            let planned = black_box(build(n).plan(strategy).expect("plannable"));
                            total += start.elapsed();
                            drop(planned);
                        }
                        total
                    })
                });
            }
        }
    }
    group.finish();
}

/// Layers per bucket in the `step_builds` ladder.
const LADDER_LAYERS: u32 = 32;

/// A ladder of `buckets` x [`LADDER_LAYERS`] runners on `sim`, one
/// request each, planned and allocated (the capture is the benchmark's).
fn ladder(sim: &sim::Device, buckets: u32) -> (Capturing<sim::Device>, Request) {
    let req = Request::new(Domain::Device, DType::F32, 16384);
    let mut d = Discovering::new(PlanConfig::new());
    for bucket in 0..buckets {
        d.bucket(format!("b{bucket}")).expect("distinct names");
        for l in 0..LADDER_LAYERS {
            d.arm(RunnerId(bucket * LADDER_LAYERS + l))
                .and_then(|mut a| a.record(req))
                .expect("fresh runner");
        }
    }
    let capturing = d
        .plan(Policy::OverlapDepth(2))
        .expect("a valid policy")
        .allocate(sim.clone())
        .expect("sim allocates");
    (capturing, req)
}

/// Captures, finishes and seals the ladder's `runners`.
fn capture_ladder(
    sim: &sim::Device,
    (mut capturing, req): (Capturing<sim::Device>, Request),
    runners: u32,
    stream: &sim::Stream,
) -> Replayable<sim::Device> {
    for r in 0..runners {
        let cap = capturing.capture(RunnerId(r)).expect("first capture");
        let view = cap.take(req).expect("as discovered");
        cap.stream_capture(stream, |s| sim.launch(s, sim::Kernel::fill(&view, 1.0), 0))
            .expect("sim captures");
        cap.finish().expect("took exactly its capacity");
    }
    capturing.seal().expect("every runner captured")
}

/// Host cost per runner, on `sim`, of what a program does once per model
/// as buckets grow (`buckets` x 32 layers, 1 to 128 buckets): capturing,
/// finishing and sealing every runner; then building one step graph per
/// bucket (its 32 replays, on two streams in turn) and keeping it. A step
/// build costs in proportion to its bucket, not to the plan: both stay
/// flat per runner.
fn bench_step_builds(c: &mut Criterion) {
    let mut group = c.benchmark_group("step_builds");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_secs(2));
    for buckets in [1u32, 4, 16, 64, 128] {
        let runners = buckets * LADDER_LAYERS;
        group.throughput(criterion::Throughput::Elements(u64::from(runners)));
        let sim = sim::Device::new();
        let stream = sim.new_stream();
        let id = format!("{buckets}x{LADDER_LAYERS}");
        group.bench_function(BenchmarkId::new("capture_seal", &id), |b| {
            b.iter_batched(
                || ladder(&sim, buckets),
                |ladder| capture_ladder(&sim, ladder, runners, &stream),
                BatchSize::PerIteration,
            )
        });
        group.bench_function(BenchmarkId::new("build", &id), |b| {
            // A fresh `sim` each time: it keeps every stream a composition
            // made (two per step graph here), which the next ones pay for.
            b.iter_batched(
                || {
                    let sim = sim::Device::new();
                    let stream = sim.new_stream();
                    let replayable = capture_ladder(&sim, ladder(&sim, buckets), runners, &stream);
                    let lanes = [sim.new_stream(), sim.new_stream()];
                    (replayable, lanes)
                },
                |(mut replayable, lanes)| {
                    let mut kept = Vec::with_capacity(buckets as usize);
                    for bucket in 0..buckets {
                        let mut step = replayable.step();
                        for l in 0..LADDER_LAYERS {
                            let r = RunnerId(bucket * LADDER_LAYERS + l);
                            step.replay(r, &lanes[(l % 2) as usize])
                                .expect("a captured runner");
                        }
                        kept.push(step.build().expect("sim composes").keep());
                    }
                    (kept, replayable)
                },
                BatchSize::PerIteration,
            )
        });
    }
    group.finish();
}

criterion_group!(
    benches,
    bench_plan,
    bench_take,
    bench_replay,
    bench_consume,
    bench_capture,
    bench_scale,
    bench_buckets,
    bench_review,
    bench_step_builds
);
criterion_main!(benches);
