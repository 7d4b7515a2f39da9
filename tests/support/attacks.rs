//! Fixtures several attack files of `suite/regression/` share, on `sim`:
//!
//! - run-time buckets: [`BucketBench`] (a device, its streams and sinks,
//!   for `buckets::sealed` plans), [`with_buckets`], and buckets declared
//!   and captured with a graph that doubles its input
//!   ([`bucket_discovery`], [`capture_doubling`]);
//! - chains of cut step copies and fans of split writers: a chain checked
//!   against its per-runner replays ([`replayed_values`]), a fan's
//!   [`chained`] spec and step [`replays`];
//! - kept-step fuzzers: two worlds driven alike ([`kept_or_items`]), kept
//!   launches counted ([`fuzz_kept_launches`]);
//! - small plans and the checks after them: two runners sharing bytes
//!   ([`two_runners`], [`assert_summed`]), a sealed plan replayed on its
//!   first stream ([`replayed_on_first`]), a repeatable capture's runs
//!   ([`counted_runs`]), launches in turn, hazards, refused captures.

use std::borrow::Borrow;
use std::fmt;

use replay_arena::sim::{self, AsSpan};
use replay_arena::{
    CaptureError, Discovering, Joined, KeptStep, PlanConfig, Policy, Replayable, RunnerCapture,
    RunnerId, StepGraph, StreamCaptureError, View,
};

use super::buckets::{self, TEMPORARIES};
use super::faults::chain::{chain_with, Chain, Ctx};
use super::faults::fan::{Item, Spec};
use super::faults::{self, assert_no_graph_memory, R};
use super::steps::{fence, kept, overlap};

/// A device with three streams (`stage`, `pool`, `side`) and program
/// sinks, for [`buckets::sealed`] plans of buckets 64 and 256.
pub struct BucketBench {
    pub sim: sim::Device,
    pub stage: sim::Stream,
    pub pool: sim::Stream,
    pub side: sim::Stream,
    /// One sink per length asked for, allocated before any plan.
    pub sinks: Vec<sim::HostBuffer>,
}

impl BucketBench {
    /// A new device, its three streams, and a sink of each of `sinks`
    /// elements.
    pub fn new(sinks: &[usize]) -> BucketBench {
        let sim = sim::Device::new();
        let (stage, pool, side) = (sim.new_stream(), sim.new_stream(), sim.new_stream());
        let sinks = sinks.iter().map(|&n| sim.alloc_f32(n).unwrap()).collect();
        BucketBench {
            sim,
            stage,
            pool,
            side,
            sinks,
        }
    }

    /// Buckets of 64 and 256 elements (runners 0 and 1), captured on
    /// `pool` and sealed.
    pub fn sealed(&self) -> Replayable<sim::Device> {
        buckets::sealed(&self.sim, &self.pool, &[64, 256])
    }

    /// [`buckets::run`] of `runner` on the three streams.
    pub fn run(
        &self,
        r: &mut Replayable<sim::Device>,
        runner: u32,
        value: f32,
        sink: &impl AsSpan,
    ) -> replay_arena::Result<()> {
        let streams = (&self.stage, &self.pool, &self.side);
        buckets::run(r, &self.sim, streams, RunnerId(runner), value, sink)
    }

    /// [`buckets::join`] of bucket `bs={n}` with `runner`, captured on
    /// `pool`.
    pub fn join(
        &self,
        r: &mut Replayable<sim::Device>,
        runner: u32,
        n: u64,
    ) -> replay_arena::Result<Joined> {
        buckets::join(r, &self.sim, &self.pool, RunnerId(runner), n)
    }

    /// After teardown: no hazard, no event, and only the sinks live.
    pub fn assert_clean(&self) {
        let sim = &self.sim;
        assert_eq!(sim.hazards(), [], "hazards");
        assert_eq!(sim.live_events(), 0, "events leaked");
        assert_eq!(
            sim.live_allocations(),
            self.sinks.len(),
            "allocations leaked"
        );
    }
}

/// A [`BucketBench`] with `sinks`, its graphs allocating a temporary or
/// not (`temporaries`): `body` runs on its sealed plan, and after the
/// plan's drop the device holds only the sinks.
pub fn with_buckets(
    temporaries: bool,
    sinks: &[usize],
    body: impl FnOnce(&BucketBench, &mut Replayable<sim::Device>),
) {
    TEMPORARIES.with(|t| t.set(temporaries));
    let bench = BucketBench::new(sinks);
    {
        let mut r = bench.sealed();
        body(&bench, &mut r);
    }
    TEMPORARIES.with(|t| t.set(true));
    bench.assert_clean();
}

/// Buckets `bs={n}` of each of `sizes`, each of `runners` runners
/// (numbered on from bucket to bucket) recording an input and an output
/// of `n` f32s.
pub fn bucket_discovery(sizes: &[u64], runners: u32) -> Discovering {
    let mut d = Discovering::new(PlanConfig::new());
    let mut ids = (0..).map(RunnerId);
    for &n in sizes {
        d.bucket(format!("bs={n}")).unwrap();
        for runner in ids.by_ref().take(runners as usize) {
            let mut armed = d.arm(runner).unwrap();
            for q in [buckets::input(n), buckets::output(n)] {
                armed.record(q).unwrap();
            }
        }
    }
    d
}

/// Captures `cap`, a runner of [`bucket_discovery`] with `n` elements, on
/// `stream`: its output is its input copied (in `ticks.0`), then doubled
/// (in `ticks.1`).
pub fn capture_doubling(
    cap: RunnerCapture<'_, sim::Device>,
    sim: &sim::Device,
    stream: &sim::Stream,
    n: u64,
    ticks: (u64, u64),
) {
    let i = cap.take(buckets::input(n)).unwrap();
    let o = cap.take(buckets::output(n)).unwrap();
    record_and_finish!(cap, stream, |s| {
        sim.launch(s, sim::Kernel::copy(&i, &o), ticks.0)?;
        sim.launch(s, sim::Kernel::scale(&o, 2.0), ticks.1)
    });
}

/// A [`chain_with`] chain whose every runner captured.
pub fn captured_chain(
    layers: usize,
    g: usize,
    copies: usize,
    work: &mut dyn FnMut(&Ctx, &sim::Stream) -> R,
) -> Chain {
    let c = chain_with(layers, g, copies, work);
    assert!(c.capture_errors.is_empty(), "{:?}", c.capture_errors);
    c
}

/// The values of a [`chain_with`] chain after `replays` per-runner
/// replays: what the same chain's step graphs must give.
pub fn replayed_values(
    layers: usize,
    g: usize,
    copies: usize,
    work: &mut dyn FnMut(&Ctx, &sim::Stream) -> R,
    replays: usize,
) -> Vec<Vec<f32>> {
    let mut reference = chain_with(layers, g, copies, work);
    reference.per_runner(replays);
    reference.values()
}

/// `c` is hazard-free and holds `expected`; then it tears down clean.
pub fn assert_values_then_teardown(c: Chain, expected: &[Vec<f32>], what: impl fmt::Display) {
    c.hazard_free();
    assert_eq!(c.values(), expected, "{what}");
    c.teardown();
}

/// `c` is hazard-free; then it tears down clean.
pub fn assert_hazard_free_then_teardown(c: Chain) {
    c.hazard_free();
    c.teardown();
}

/// After the launches of a `two_handoffs` plan `r`: once synchronized,
/// no hazard, and both readers (runners 1 and 2) hold `value`; then the
/// plan is dropped and its graph memory is gone.
pub fn assert_readers_hold(
    sim: &sim::Device,
    r: Replayable<sim::Device>,
    value: f32,
    what: impl fmt::Display,
) {
    r.synchronize().unwrap();
    assert_hazard_free(sim, &what);
    for i in 1..3u32 {
        let v = sim.read_f32(&r.views(RunnerId(i)).unwrap()[0]).unwrap();
        assert_eq!(v[0], value, "reader {i} {what}");
    }
    drop(r);
    assert_no_graph_memory(sim, "after the drop");
}

/// A [`Spec`] of a writer of `k` handoffs with `copies` step copies,
/// reader 0 handing on to a collector.
pub fn chained(k: usize, copies: usize) -> Spec {
    let mut spec = Spec::new(k);
    spec.copies = copies;
    spec.chain = true;
    spec
}

/// A fan's step items: a replay of each `(runner, stream)`, in order.
pub fn replays(items: &[(u32, usize)]) -> Vec<Item> {
    items.iter().map(|&(r, s)| Item::Replay(r, s)).collect()
}

/// A [`kept::world`] of `n` runners at `g` generations, each replayed
/// once on lane 0 (a consumer needs a replay first).
pub fn replayed_world(n: u32, g: usize, durs: &[u64]) -> kept::World {
    let mut w = kept::world(n, g, durs);
    for r in 0..n {
        kept::run_item(&mut w, kept::It::R(r, 0)).unwrap();
    }
    w
}

/// The `schedules` that build into kept steps of `w` (overlapping where
/// the flag says so), each kept step with its schedule.
pub fn kept_schedules(
    w: &mut kept::World,
    schedules: Vec<(Vec<kept::It>, bool)>,
) -> Vec<(KeptStep<sim::Device>, Vec<kept::It>)> {
    schedules
        .into_iter()
        .filter_map(|(s, o)| kept::build_kept(w, &s, o).map(|k| (k, s)))
        .collect()
}

/// A random item of a kept-step fuzzer over `runners` runners (drawn with
/// `next(m)`, below `m`): a replay or a consumer on one of lanes 0..3,
/// each consumer adding into an accumulator of its own.
pub fn random_item(next: &mut dyn FnMut(u64) -> u64, runners: u32) -> kept::It {
    let r = next(runners as u64) as u32;
    let l = next(3) as usize;
    if next(2) == 0 {
        kept::It::R(r, l)
    } else {
        kept::It::C(r, l, 7 + 3 * r as usize + l)
    }
}

/// How many kept launches a fuzzer made, and how many the fence let
/// through.
#[derive(Default)]
pub struct KeptLaunches {
    ok: usize,
    all: usize,
}

impl KeptLaunches {
    /// One launch more, `ok` or refused.
    pub fn count(&mut self, ok: bool) {
        self.ok += ok as usize;
        self.all += 1;
    }
}

/// `fuzz(seed, launches)` for seeds `0..seeds`: more than a quarter of
/// the kept launches must go through (a fuzzer of launches, not of
/// refusals).
pub fn fuzz_kept_launches(what: &str, seeds: u64, mut fuzz: impl FnMut(u64, &mut KeptLaunches)) {
    let mut launches = KeptLaunches::default();
    for seed in 0..seeds {
        fuzz(seed, &mut launches);
    }
    let KeptLaunches { ok, all } = launches;
    eprintln!("{what} ok {ok} of {all}");
    assert!(ok * 4 > all, "{ok} of {all}");
}

/// A fuzzer's step on two worlds: `it` run on both (`run`) succeeds on
/// both or fails on both.
pub fn run_on_both<W, I: fmt::Debug + Copy>(
    (a, b): (&mut W, &mut W),
    it: I,
    run: impl Fn(&mut W, I) -> Result<(), String>,
    seed: u64,
    log: &mut Vec<String>,
) {
    let (x, y) = (run(a, it), run(b, it));
    log.push(format!("{it:?}:{x:?}"));
    assert_eq!(
        x.is_ok(),
        y.is_ok(),
        "seed {seed}: {it:?}: {x:?} vs {y:?}; {log:?}"
    );
}

/// A fuzzer's kept launch: one of `kept` (kept steps of world `a`, each
/// with its schedule), drawn with `next`, launched on lane 3 or 4 of `a`
/// (drawn too); where it went through, its schedule must go through per
/// runner (`run`) on world `b`. Whether it went through.
pub fn launch_kept_on_both<W, I: fmt::Debug + Copy>(
    next: &mut dyn FnMut(u64) -> u64,
    (rep, lanes): (&mut Replayable<sim::Device>, &[sim::Stream]),
    kept: &mut [(KeptStep<sim::Device>, Vec<I>)],
    (b, run): (&mut W, impl Fn(&mut W, I) -> Result<(), String>),
    seed: u64,
    log: &mut Vec<String>,
) -> bool {
    let k = next(kept.len() as u64) as usize;
    let l = 3 + next(2) as usize;
    let (step, schedule) = &mut kept[k];
    let got = rep.launch_kept(step, &lanes[l]);
    log.push(format!("K{k}@{l}:{got:?}"));
    if got.is_ok() {
        for &it in schedule.iter() {
            if let Err(e) = run(b, it) {
                panic!("seed {seed}: kept ok, per-runner {it:?}: {e}; {log:?}");
            }
        }
    }
    got.is_ok()
}

/// A world of a kept-step fuzzer: its plan and its lanes.
pub trait FuzzWorld {
    fn plan_and_lanes(&mut self) -> (&mut Replayable<sim::Device>, &[sim::Stream]);
}

impl FuzzWorld for kept::World {
    fn plan_and_lanes(&mut self) -> (&mut Replayable<sim::Device>, &[sim::Stream]) {
        (&mut self.rep, &self.lanes)
    }
}

/// What a kept-step fuzzer of one seed carries along: the seed, its
/// random numbers (`next(m)`, below `m`), the kept launches counted, and
/// the log of what it did.
pub struct Fuzzing<'f> {
    pub seed: u64,
    pub next: &'f mut dyn FnMut(u64) -> u64,
    pub launches: &'f mut KeptLaunches,
    pub log: Vec<String>,
}

impl<'f> Fuzzing<'f> {
    pub fn new(
        seed: u64,
        next: &'f mut dyn FnMut(u64) -> u64,
        launches: &'f mut KeptLaunches,
    ) -> Fuzzing<'f> {
        Fuzzing {
            seed,
            next,
            launches,
            log: Vec::new(),
        }
    }
}

/// 40 steps of a fuzzer on worlds `a` and `b`, built alike: where a coin
/// says so and a step is kept, a kept launch ([`launch_kept_on_both`]),
/// counted; else an item drawn by `item` and run on both (`run`,
/// [`run_on_both`]).
pub fn kept_or_items<W: FuzzWorld, I: fmt::Debug + Copy>(
    f: &mut Fuzzing<'_>,
    (a, b): (&mut W, &mut W),
    kept: &mut [(KeptStep<sim::Device>, Vec<I>)],
    (run, item): (
        impl Fn(&mut W, I) -> Result<(), String>,
        impl Fn(&mut dyn FnMut(u64) -> u64) -> I,
    ),
) {
    let (seed, log) = (f.seed, &mut f.log);
    for _ in 0..40 {
        if (f.next)(2) == 0 && !kept.is_empty() {
            let on_b = (&mut *b, &run);
            let ok = launch_kept_on_both(f.next, a.plan_and_lanes(), kept, on_b, seed, log);
            f.launches.count(ok);
        } else {
            let it = item(f.next);
            run_on_both((&mut *a, &mut *b), it, &run, seed, log);
        }
    }
}

/// A new device with `K` streams and a sink, then two runners sharing
/// bytes on it (`fill_plan`, G = 1).
pub fn two_runners<const K: usize>() -> (
    sim::Device,
    [sim::Stream; K],
    sim::HostBuffer,
    Replayable<sim::Device>,
) {
    let sim = sim::Device::new();
    let s = super::streams::<K>(&sim);
    let sink = sim.alloc_f32(faults::N).unwrap();
    let rp = faults::fill_plan(&sim, 2, 1);
    (sim, s, sink, rp)
}

/// Once `rp` is synchronized: no hazard, and `sink` holds `sum`.
pub fn assert_summed(
    (rp, sim): (&Replayable<sim::Device>, &sim::Device),
    sink: &sim::HostBuffer,
    sum: f32,
    what: &str,
) {
    rp.synchronize().unwrap();
    assert_eq!(sim.hazards(), [], "{what}");
    assert_eq!(faults::read0(sim, sink), sum, "{what}");
}

/// [`assert_summed`]; then, once `rp` is dropped, no hazard, no event,
/// and only the program's own `allocations` live.
pub fn assert_summed_then_clean(
    (rp, sim): (Replayable<sim::Device>, &sim::Device),
    sink: &sim::HostBuffer,
    (sum, allocations): (f32, usize),
    what: &str,
) {
    assert_summed((&rp, sim), sink, sum, what);
    drop(rp);
    faults::assert_clean(sim, allocations, what);
}

/// `fence::sealed` runners `0..n` (one generation, 5 ticks each) with
/// `K` new streams of their device, runner 0 replayed on the first.
pub fn replayed_on_first<const K: usize>(
    n: u32,
) -> (sim::Device, [sim::Stream; K], Replayable<sim::Device>) {
    let (sim, mut replayable) = fence::sealed(n, Policy::Generations(1), 5);
    let streams = super::streams::<K>(&sim);
    replayable.replay(RunnerId(0), &streams[0]).unwrap();
    (sim, streams, replayable)
}

/// Runner 0 of `c` captured repeatably on its stream with `copies` step
/// copies, `work(cap, stream, view, run)` each run: how many runs it made.
pub fn counted_runs(
    c: &mut overlap::Cap1,
    copies: usize,
    mut work: impl FnMut(
        &RunnerCapture<'_, sim::Device>,
        &sim::Stream,
        &View<'_>,
        usize,
    ) -> replay_arena::Result<()>,
) -> usize {
    let s = c.s.clone();
    let cap = c.capturing.capture(RunnerId(0)).unwrap();
    let v = cap.take(overlap::OWN).unwrap();
    cap.step_copies(copies);
    let mut runs = 0;
    cap.stream_capture_repeatable(&s, |st| {
        runs += 1;
        work(&cap, st, &v, runs)
    })
    .unwrap();
    cap.finish().unwrap();
    runs
}

/// Launches `g` `times` times, on `streams` in turn.
pub fn launch_in_turn<S: Borrow<sim::Stream>>(
    g: &mut StepGraph<'_, sim::Device>,
    streams: &[S],
    times: usize,
) {
    for k in 0..times {
        g.launch(streams[k % streams.len()].borrow()).unwrap();
    }
}

/// No hazard on `sim`.
pub fn assert_hazard_free(sim: &sim::Device, what: impl fmt::Display) {
    assert!(sim.hazards().is_empty(), "{what}: {:?}", sim.hazards());
}

/// `got` is a stream capture the crate refused with `expected`.
pub fn assert_capture_refused<T: fmt::Debug, E: fmt::Debug>(
    got: Result<T, StreamCaptureError<E>>,
    expected: CaptureError,
) {
    match &got {
        Err(StreamCaptureError::Capture(e)) if *e == expected => {}
        _ => panic!("{got:?}: not refused with {expected:?}"),
    }
}
