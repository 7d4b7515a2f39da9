//! The fault explorer: a deterministic, seeded simulation test in the shape
//! of FoundationDB's simulation testing and TigerBeetle's VOPR (issue 39,
//! items 3 and 4).
//!
//! Each seed makes one random *program* that drives the whole public
//! surface on the `sim` backend: discovery (handoffs, staged inputs
//! `Purpose::Input`, shape buckets, a forgotten armed runner), a plan
//! (round-robin or packed), allocation, captures (`stream_capture` and
//! `stream_capture_repeatable` with temporaries, forgotten and failing
//! captures), seal, replays on 2-3 streams, consumers (`consume`,
//! `consume_mut`, `consume_many`) whose closures succeed, fail or panic,
//! `wait_for`, `wait_all`, borrowed step graphs (`build`,
//! `build_overlapping`), kept step graphs (`keep`, `launch_kept`,
//! `wait_kept`), traces, `mem::forget` of every guard, replan and
//! teardown.
//!
//! Each program runs once with no fault to count its backend calls `N`
//! (`FaultLog::calls`), then once with a fault at each call position
//! `Faults::at(k)` (sampled when `N` is large), then under seeded schedules
//! (`Faults::seeded`). After each run it checks:
//!
//! - no panic escapes the crate (the closures' own panics are caught);
//! - `sim` saw no hazard;
//! - every value read back (consumer copies, probes after waits, step
//!   consumers, the runners' replay counters) lies in what a reference model
//!   computes, for the work that ran (an operation that failed after a fault
//!   may or may not have run: the model keeps both outcomes);
//! - the program can carry on: once the faults stop, every runner replays
//!   and is consumed again, exactly;
//! - teardown leaks nothing (arenas, events, graph memory) unless the
//!   program forgot a guard.
//!
//! `FAULT_EXPLORER_PROGRAMS` sets how many programs `explore` runs,
//! `FAULT_EXPLORER_SEED` runs one program (the seed a failure prints),
//! `FAULT_EXPLORER_FAULT` one fault of it (`none`, `at:K`,
//! `seeded:S:ONE_IN` or `teardown:K`), `FAULT_EXPLORER_POSITIONS` how many positions are
//! tried per program (all when there are fewer). See docs/fuzzing.md.

// As the crate: errors are structured. `ArmedRunner` has no destructor,
// so forgetting it is dropping it: the explorer forgets it all the same.
#![allow(clippy::result_large_err, clippy::forget_non_drop)]

use crate::support::capture_view;
use crate::support::steps::copy_into;
use crate::support::steps::fence::allocated;
use crate::support::steps::kept::{self, kept_all, Setup, REQ};
use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::panic::{catch_unwind, AssertUnwindSafe};

use replay_arena::backend::{Backend, Streams};
use replay_arena::sim::{self, Call, Faults};
use replay_arena::{
    ConsumeError, DType, Discovering, Domain, KeptStep, PlanConfig, Policy, Purpose, ReplayError,
    Replayable, Request, RunnerId, View,
};

// ---------------------------------------------------------------------
// Requests: told apart by their lengths inside consumers.

const OUT: usize = 16;
const INPUT: usize = 12;
const HAND: usize = 8;

const fn out_req() -> Request {
    Request::new(Domain::Device, DType::F32, OUT as u64)
}

const fn in_req() -> Request {
    Request::new(Domain::Device, DType::F32, INPUT as u64).purpose(Purpose::Input)
}

const fn hand_req() -> Request {
    Request::new(Domain::Device, DType::F32, HAND as u64)
}

fn out_of<'a, 'v, A: replay_arena::Access>(views: &'a [View<'v, A>]) -> &'a View<'v, A> {
    views
        .iter()
        .find(|v| v.len() == OUT)
        .expect("an output view")
}

fn in_of<'a, 'v>(views: &'a [View<'v>]) -> &'a View<'v> {
    views
        .iter()
        .find(|v| v.len() == INPUT)
        .expect("an input view")
}

// ---------------------------------------------------------------------
// Deterministic randomness and deliberate panics.

#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5DEE_CE66_D1CE_4E5B)
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
}

/// The payload of the closures' own panics.
struct Deliberate;

fn quiet_deliberate_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<Deliberate>().is_none() {
                previous(info);
            }
        }));
    });
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

// ---------------------------------------------------------------------
// Programs.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fail {
    No,
    /// Returns an error after enqueuing its work.
    Err,
    /// Returns an error before enqueuing anything.
    ErrEarly,
    /// Panics after enqueuing its work.
    Panic,
}

#[derive(Clone, Debug)]
enum SItem {
    Replay(usize, usize),
    /// Runner, lane, step sink.
    Consume(usize, usize, usize, Fail),
}

#[derive(Clone, Copy, Debug)]
enum Fate {
    Drop,
    Forget,
    Keep,
}

#[derive(Clone, Debug)]
enum Step {
    Replay(usize, usize),
    Consume(usize, usize, usize, Fail),
    /// Runner, stream, value, fail.
    ConsumeMut(usize, usize, f32, Fail),
    /// Runners, stream, first sink (one sink per runner), fail.
    ConsumeMany(Vec<usize>, usize, usize, Fail),
    /// Runner, stream, probe.
    WaitFor(usize, usize, usize),
    WaitAll(usize, usize),
    Graph {
        items: Vec<SItem>,
        overlapping: bool,
        launches: Vec<usize>,
        wait: Option<usize>,
        fate: Fate,
    },
    LaunchKept(usize, usize),
    WaitKept(usize, usize),
    DropKept(usize),
    ForgetKept(usize),
    StartTrace,
    FinishTrace,
    /// `report`, `temporaries`, `trim_graph_memory`, `synchronize`.
    Report,
    Checkpoint,
}

#[derive(Clone, Copy, Debug)]
enum End {
    Drop,
    Replan,
    Forget,
}

#[derive(Clone, Debug)]
struct Program {
    seed: u64,
    generations: usize,
    packed: bool,
    /// Runners of the first bucket (ids 0..), then staged ones (ids 10..).
    n_a: usize,
    staged: usize,
    handoff: bool,
    ready: bool,
    temps: Vec<bool>,
    copies: usize,
    durs: Vec<u64>,
    streams: usize,
    forget_armed: bool,
    forget_capture: Option<usize>,
    capture_fail: Option<(usize, Fail)>,
    steps: Vec<Step>,
    end: End,
    sinks: usize,
    step_sinks: usize,
    probes: usize,
}

impl Program {
    fn runners(&self) -> usize {
        self.n_a + self.staged
    }
    fn id(&self, i: usize) -> RunnerId {
        if i < self.n_a {
            RunnerId(i as u32)
        } else {
            RunnerId(10 + (i - self.n_a) as u32)
        }
    }
    fn is_staged(&self, i: usize) -> bool {
        i >= self.n_a
    }
    fn is_writer(&self, i: usize) -> bool {
        self.handoff && i == 0
    }
    fn is_reader(&self, i: usize) -> bool {
        self.handoff && i == 1
    }
    fn forgets(&self) -> bool {
        self.forget_armed
            || self.forget_capture.is_some()
            || matches!(self.end, End::Forget)
            || self.steps.iter().any(|s| {
                matches!(
                    s,
                    Step::ForgetKept(_)
                        | Step::Graph {
                            fate: Fate::Forget,
                            ..
                        }
                )
            })
    }

    fn generate(seed: u64) -> Program {
        let p = Program::generate_all(seed);
        if avoid_known() {
            p.avoiding_known()
        } else {
            p
        }
    }

    /// The program without the two shapes of issue 39's known bugs, to
    /// look for others while they stand: staging closures that fail, and
    /// a step graph launched on more than one stream.
    fn avoiding_known(mut self) -> Program {
        for step in &mut self.steps {
            match step {
                Step::ConsumeMut(i, _, _, f) if *i >= self.n_a => *f = Fail::No,
                Step::Graph { launches, .. } => {
                    for l in launches.iter_mut() {
                        *l = 0;
                    }
                }
                Step::LaunchKept(_, s) => *s = 0,
                _ => {}
            }
        }
        self
    }

    fn generate_all(seed: u64) -> Program {
        let mut rng = Rng::new(seed);
        let n_a = 2 + rng.below(3);
        let staged = [0, 1, 2][rng.below(3)];
        let handoff = rng.chance(50);
        let mut p = Program {
            seed,
            generations: 1 + rng.below(3),
            packed: rng.chance(40),
            n_a,
            staged,
            handoff,
            ready: handoff && rng.chance(50),
            temps: (0..n_a).map(|_| rng.chance(25)).collect(),
            copies: 1 + rng.below(2),
            durs: (0..n_a + staged)
                .map(|_| 1 + rng.below(60) as u64)
                .collect(),
            streams: 2 + rng.below(2),
            forget_armed: rng.chance(4),
            forget_capture: rng.chance(4).then(|| rng.below(n_a)),
            capture_fail: None,
            steps: Vec::new(),
            end: [End::Drop, End::Drop, End::Replan, End::Forget][rng.below(4)],
            sinks: 0,
            step_sinks: 0,
            probes: 0,
        };
        if rng.chance(4) {
            let f = [Fail::Err, Fail::Panic][rng.below(2)];
            p.capture_fail = Some((rng.below(p.runners()), f));
        }
        let n = p.runners();
        let fail = |rng: &mut Rng| match rng.below(10) {
            0 => Fail::Err,
            1 => Fail::ErrEarly,
            2 => Fail::Panic,
            _ => Fail::No,
        };
        // Mostly capture order first, so that consumers and readers find
        // what they need.
        for i in 0..n {
            if p.is_staged(i) {
                p.steps
                    .push(Step::ConsumeMut(i, 0, 100.0 + i as f32, Fail::No));
            }
            p.steps.push(Step::Replay(i, rng.below(p.streams)));
        }
        let mut kept = 0usize;
        let len = 8 + rng.below(16);
        for _ in 0..len {
            let r = rng.below(n);
            let s = rng.below(p.streams);
            let step = match rng.below(20) {
                0..=4 => Step::Replay(r, s),
                5..=7 => {
                    p.sinks += 1;
                    Step::Consume(r, s, p.sinks - 1, fail(&mut rng))
                }
                8..=9 => Step::ConsumeMut(r, s, 1000.0 + rng.below(1000) as f32, fail(&mut rng)),
                10 => {
                    let other = rng.below(n);
                    let rs = if other == r { vec![r] } else { vec![r, other] };
                    p.sinks += rs.len();
                    Step::ConsumeMany(rs.clone(), s, p.sinks - rs.len(), fail(&mut rng))
                }
                11 => {
                    p.probes += 1;
                    Step::WaitFor(r, s, p.probes - 1)
                }
                12 => {
                    p.probes += 1;
                    Step::WaitAll(s, p.probes - 1)
                }
                13..=15 => {
                    let count = 1 + rng.below(5);
                    let items = (0..count)
                        .map(|_| {
                            let (r, l) = (rng.below(n), rng.below(p.streams));
                            if rng.chance(35) {
                                p.step_sinks += 1;
                                SItem::Consume(r, l, p.step_sinks - 1, fail(&mut rng))
                            } else {
                                SItem::Replay(r, l)
                            }
                        })
                        .collect();
                    let fate = [Fate::Drop, Fate::Keep, Fate::Keep, Fate::Forget][rng.below(4)];
                    if matches!(fate, Fate::Keep) {
                        kept += 1;
                    }
                    Step::Graph {
                        items,
                        overlapping: rng.chance(30),
                        launches: (0..rng.below(4)).map(|_| rng.below(p.streams)).collect(),
                        wait: rng.chance(30).then(|| rng.below(p.streams)),
                        fate,
                    }
                }
                16 if kept > 0 => Step::LaunchKept(rng.below(kept), s),
                16 => Step::Checkpoint,
                17 if kept > 0 => match rng.below(8) {
                    0 => Step::DropKept(rng.below(kept)),
                    1 => Step::ForgetKept(rng.below(kept)),
                    2 | 3 => Step::WaitKept(rng.below(kept), s),
                    _ => Step::LaunchKept(rng.below(kept), s),
                },
                17 => Step::Replay(r, s),
                18 => [Step::StartTrace, Step::FinishTrace, Step::Report][rng.below(3)].clone(),
                _ => Step::Checkpoint,
            };
            p.steps.push(step);
        }
        p
    }
}

/// `FAULT_EXPLORER_AVOID_KNOWN`: programs avoid the shapes of the bugs
/// known when the explorer was written (see `Program::avoiding_known`).
fn avoid_known() -> bool {
    std::env::var("FAULT_EXPLORER_AVOID_KNOWN").is_ok()
}

/// How a run injects faults.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Plan {
    None,
    At(u64),
    Seeded(u64, u64),
    /// The `k`-th call of the teardown (dropping the kept steps and the
    /// plan, or `replan`) fails.
    Teardown(u64),
}

impl Plan {
    fn faults(&self) -> Faults {
        match *self {
            Plan::None => Faults::none(),
            Plan::At(k) => Faults::at(k),
            Plan::Seeded(s, one_in) => Faults::seeded(s, one_in),
            Plan::Teardown(_) => Faults::none(),
        }
    }
    fn spell(&self) -> String {
        match self {
            Plan::None => "none".into(),
            Plan::At(k) => format!("at:{k}"),
            Plan::Seeded(s, o) => format!("seeded:{s}:{o}"),
            Plan::Teardown(k) => format!("teardown:{k}"),
        }
    }
    fn parse(text: &str) -> Option<Plan> {
        let parts: Vec<&str> = text.trim().split(':').collect();
        match parts.as_slice() {
            ["none"] => Some(Plan::None),
            ["at", k] => Some(Plan::At(k.parse().ok()?)),
            ["seeded", s, o] => Some(Plan::Seeded(s.parse().ok()?, o.parse().ok()?)),
            ["teardown", k] => Some(Plan::Teardown(k.parse().ok()?)),
            _ => None,
        }
    }
}

// ---------------------------------------------------------------------
// The reference model: what each buffer may hold. A value is an interval
// (an operation that failed after a fault may or may not have run);
// `None` is unknown.

type Iv = Option<(f64, f64)>;

fn exact(v: f64) -> Iv {
    Some((v, v))
}

fn sum(a: Iv, b: Iv) -> Iv {
    Some((a?.0 + b?.0, a?.1 + b?.1))
}

fn hull(a: Iv, b: Iv) -> Iv {
    Some((a?.0.min(b?.0), a?.1.max(b?.1)))
}

fn holds(iv: Iv, x: f32) -> bool {
    match iv {
        None => true,
        Some((lo, hi)) => (x as f64) >= lo - 1e-3 && (x as f64) <= hi + 1e-3,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ran {
    Yes,
    Maybe,
    No,
}

#[derive(Clone, Debug)]
struct Model {
    count: Vec<(u64, u64)>,
    out: Vec<Iv>,
    input: Vec<Iv>,
    /// A staged input whose writer failed: no replay may read it.
    poisoned: Vec<bool>,
    hand: Iv,
    sinks: Vec<Iv>,
    step_sinks: Vec<Iv>,
    probes: Vec<Iv>,
    /// Per runner: the latest sink a consumer of it wrote.
    last_sink: Vec<Option<usize>>,
}

impl Model {
    fn new(p: &Program) -> Model {
        let n = p.runners();
        Model {
            count: vec![(0, 0); n],
            out: vec![None; n],
            input: vec![None; n],
            poisoned: vec![false; n],
            hand: None,
            sinks: vec![exact(0.0); p.sinks],
            step_sinks: vec![exact(0.0); p.step_sinks],
            probes: vec![exact(0.0); p.probes],
            last_sink: vec![None; n],
        }
    }

    /// One run of runner `i`'s graph, which ran `ran`.
    fn exec(&mut self, p: &Program, i: usize, ran: Ran) {
        if ran == Ran::No {
            return;
        }
        let (lo, hi) = self.count[i];
        let mut v = Some(((lo + 1) as f64, (hi + 1) as f64));
        if p.is_staged(i) {
            v = sum(v, self.input[i]);
        }
        if p.is_reader(i) {
            v = sum(v, self.hand);
        }
        if ran == Ran::Yes {
            self.count[i] = (lo + 1, hi + 1);
            self.out[i] = v;
            if p.is_writer(i) {
                self.hand = v;
            }
        } else {
            self.count[i] = (lo, hi + 1);
            self.out[i] = hull(self.out[i], v);
            if p.is_writer(i) {
                self.hand = hull(self.hand, v);
            }
        }
    }
}

// ---------------------------------------------------------------------
// A run: the world and its checks.

/// Program buffers of one kind, `OUT` f32s each.
type Buffers = Vec<sim::HostBuffer>;

struct Bufs {
    one: sim::HostBuffer,
    counts: Buffers,
    sinks: Buffers,
    step_sinks: Buffers,
    probes: Buffers,
    checks: Buffers,
}

struct World<'p> {
    p: &'p Program,
    sim: sim::Device,
    s: Vec<sim::Stream>,
    b: Bufs,
    m: Model,
    kept: Vec<Option<(KeptStep<sim::Device>, Vec<SItem>)>>,
    kept_slots: usize,
    /// Kept step graphs were dropped after their plan.
    kept_outlived: bool,
    /// Failures of this run: (class, detail).
    failures: Vec<(String, String)>,
    /// Notes: faults an operation swallowed (it returned Ok).
    swallowed: BTreeSet<String>,
    log: Vec<String>,
    /// The latest step's result, for the log.
    last: Option<String>,
    injected_before: usize,
}

/// What one run saw, for the totals.
#[derive(Default)]
struct Outcome {
    calls: u64,
    injected: usize,
    sites: BTreeSet<(Call, String)>,
    failures: Vec<(String, String)>,
    swallowed: BTreeSet<String>,
    /// The calls made to fail: `kind at file:line`, each once.
    faults: Vec<String>,
    /// Calls the teardown made.
    teardown_calls: u64,
}

impl World<'_> {
    fn fail(&mut self, class: &str, detail: String) {
        self.failures.push((class.to_string(), detail));
    }

    fn injected_now(&self) -> usize {
        self.sim.fault_log().injected.len()
    }

    /// Was a fault injected since the operation began?
    fn faulted(&self) -> bool {
        self.injected_now() > self.injected_before
    }

    fn ran_of<T, E>(&self, r: &Result<T, E>) -> Ran {
        match r {
            Ok(_) => Ran::Yes,
            Err(_) if self.faulted() => Ran::Maybe,
            Err(_) => Ran::No,
        }
    }

    fn check_hazards(&mut self, at: &str) {
        let h = self.sim.hazards();
        if !h.is_empty() && !self.failures.iter().any(|(c, _)| c == "hazard") {
            self.fail("hazard", format!("after {at}: {:?}", h[0]));
        }
    }
}

fn setup(
    p: &Program,
    sim: &sim::Device,
    s0: &sim::Stream,
    b: &Bufs,
    clean: bool,
) -> Result<Replayable<sim::Device>, String> {
    let dbg = |e: &dyn std::fmt::Debug| format!("{e:?}");
    let mut d = Discovering::new(PlanConfig::new());
    if p.staged > 0 {
        d.bucket("a").map_err(|e| dbg(&e))?;
    }
    let mut h = None;
    for i in 0..p.n_a {
        let mut armed = d.arm(p.id(i)).map_err(|e| dbg(&e))?;
        armed.record(out_req()).map_err(|e| dbg(&e))?;
        if p.is_writer(i) {
            h = Some(armed.hand_off(hand_req()).map_err(|e| dbg(&e))?);
        }
        if p.is_reader(i) {
            armed
                .receive(h.expect("writer first"))
                .map_err(|e| dbg(&e))?;
        }
        if p.forget_armed && !clean && i + 1 == p.n_a {
            std::mem::forget(armed);
        }
    }
    if p.staged > 0 {
        d.bucket("b").map_err(|e| dbg(&e))?;
        for i in p.n_a..p.runners() {
            let mut armed = d.arm(p.id(i)).map_err(|e| dbg(&e))?;
            armed.record(in_req()).map_err(|e| dbg(&e))?;
            armed.record(out_req()).map_err(|e| dbg(&e))?;
        }
    }
    let policy = if p.packed {
        Policy::OverlapDepth(p.generations).packed()
    } else {
        Policy::Generations(p.generations).round_robin()
    };
    let planned = d.plan(policy).map_err(|e| dbg(&e))?;
    let mut capturing = planned.allocate(sim.clone()).map_err(|e| dbg(&e))?;
    for i in 0..p.runners() {
        let attempts = if p.forget_capture == Some(i) && !clean {
            2
        } else {
            1
        };
        for attempt in 0..attempts {
            let cap = capturing.capture(p.id(i)).map_err(|e| dbg(&e))?;
            let input = if p.is_staged(i) {
                Some(cap.take(in_req()).map_err(|e| dbg(&e))?)
            } else {
                None
            };
            let w = cap.take(out_req()).map_err(|e| dbg(&e))?;
            let dx = if p.is_writer(i) {
                Some(cap.hand_off(h.unwrap()).map_err(|e| dbg(&e))?)
            } else {
                None
            };
            let dy = if p.is_reader(i) {
                Some(cap.receive(h.unwrap()).map_err(|e| dbg(&e))?)
            } else {
                None
            };
            let temps = i < p.n_a && p.temps[i];
            let failing = match p.capture_fail {
                Some((f, how)) if f == i && !clean => how,
                _ => Fail::No,
            };
            let (one, count, dur) = (&b.one, &b.counts[i], p.durs[i]);
            let body = |st: &sim::Stream| -> Result<(), replay_arena::Error> {
                sim.launch(st, sim::Kernel::add(one, count), 1)?;
                copy_into(sim, st, (count, &w), OUT, dur, temps)?;
                if let Some(x) = &input {
                    sim.launch(st, sim::Kernel::add(x, &w), 1)?;
                }
                if let Some(y) = &dy {
                    sim.launch(st, sim::Kernel::add(y, &w), 1)?;
                }
                if let Some(x) = &dx {
                    sim.launch(st, sim::Kernel::copy(&w, x), 1)?;
                    if p.ready {
                        cap.ready(h.unwrap(), st)?;
                        sim.launch(st, sim::Kernel::scale(&w, 1.0), dur)?;
                    }
                }
                match failing {
                    Fail::Err | Fail::ErrEarly => {
                        Err(replay_arena::Error::Work("deliberate".into()))
                    }
                    Fail::Panic => std::panic::panic_any(Deliberate),
                    Fail::No => Ok(()),
                }
            };
            let captured = if temps {
                cap.step_copies(p.copies);
                catch_unwind(AssertUnwindSafe(|| cap.stream_capture_repeatable(s0, body)))
            } else {
                catch_unwind(AssertUnwindSafe(|| cap.stream_capture(s0, body)))
            };
            match captured {
                Ok(r) => r.map_err(|e| dbg(&e))?,
                Err(payload) if payload.downcast_ref::<Deliberate>().is_some() => {
                    return Err("capture closure panicked (deliberately)".into())
                }
                Err(payload) => std::panic::resume_unwind(payload),
            }
            if attempts == 2 && attempt == 0 {
                std::mem::forget(cap);
            } else {
                cap.finish().map_err(|e| dbg(&e))?;
            }
        }
    }
    capturing.seal().map_err(|e| dbg(&e))
}

/// Runs `p` under `plan`; returns what it saw.
fn run(p: &Program, plan: &Plan) -> Outcome {
    let sim = sim::Device::new();
    let s: Vec<sim::Stream> = (0..p.streams).map(|_| sim.new_stream()).collect();
    let alloc = |n: usize| {
        (0..n)
            .map(|_| sim.alloc_f32(OUT).unwrap())
            .collect::<Vec<_>>()
    };
    let b = Bufs {
        one: sim.alloc_f32(OUT).unwrap(),
        counts: alloc(p.runners()),
        sinks: alloc(p.sinks),
        step_sinks: alloc(p.step_sinks),
        probes: alloc(p.probes),
        checks: alloc(p.runners()),
    };
    sim.write_f32(&b.one, &[1.0; OUT]).unwrap();
    let base_allocs = sim.live_allocations();
    let base_events = sim.live_events();
    let mut w = World {
        p,
        sim: sim.clone(),
        s: s.clone(),
        b,
        m: Model::new(p),
        kept: Vec::new(),
        kept_slots: 0,
        kept_outlived: false,
        failures: Vec::new(),
        swallowed: BTreeSet::new(),
        log: Vec::new(),
        last: None,
        injected_before: 0,
    };
    sim.inject(plan.faults());
    let mut out = Outcome::default();
    let mut forgot = p.forgets();

    let built = catch_unwind(AssertUnwindSafe(|| setup(p, &sim, &s[0], &w.b, false)));
    let rep = match built {
        Ok(Ok(rep)) => Some(rep),
        Ok(Err(e)) => {
            w.log.push(format!("setup: {e}"));
            if *plan == Plan::None && p.capture_fail.is_none() {
                w.fail("setup fails without a fault", e);
            }
            None
        }
        Err(payload) => {
            w.fail("panic escaped", format!("setup: {}", panic_text(&*payload)));
            None
        }
    };
    let log = sim.fault_log();
    out.calls = log.calls;
    out.injected = log.injected.len();
    out.sites.extend(log.sites.iter().cloned());
    note_faults(&mut out, &log);
    w.check_hazards("setup");

    let mut rep = match rep {
        Some(rep) => rep,
        None => {
            // Carry on: the device still works. Everything of the failed
            // setup is gone (unless a guard was forgotten).
            sim.inject(Faults::none());
            let (allocs, events) = (sim.live_allocations(), sim.live_events());
            if !forgot && (allocs, events) != (base_allocs, base_events) {
                w.fail(
                    "leak after a failed setup",
                    format!("allocations {allocs} (baseline {base_allocs}), events {events} (baseline {base_events}); {}", w.log.join("; ")),
                );
            }
            match setup(p, &sim, &s[0], &w.b, true) {
                Ok(rep) => {
                    // A fresh model: the counters went on.
                    let mut rep = rep;
                    w.m = Model::new(p);
                    for i in 0..p.runners() {
                        let c = sim.read_f32(&w.b.counts[i]).unwrap()[0] as u64;
                        w.m.count[i] = (c, c);
                    }
                    recover(&mut w, &mut rep);
                    let h = sim.hazards();
                    if !h.is_empty() {
                        w.fail("hazard", format!("after the clean setup: {:?}", h[0]));
                    }
                    drop(rep);
                }
                Err(e) => w.fail("cannot carry on after a failed setup", e),
            }
            forgot |= p.forget_armed || p.forget_capture.is_some();
            teardown_check(&mut w, forgot, base_allocs, base_events);
            out.failures = w.failures;
            out.swallowed = w.swallowed;
            return out;
        }
    };

    for (k, step) in p.steps.iter().enumerate() {
        w.injected_before = w.injected_now();
        let done = catch_unwind(AssertUnwindSafe(|| do_step(&mut w, &mut rep, step)));
        let deliberate = match &done {
            Err(payload) if payload.downcast_ref::<Deliberate>().is_some() => true,
            Err(payload) => {
                let text = panic_text(&**payload);
                w.fail("panic escaped", format!("step {k} {step:?}: {text}"));
                false
            }
            Ok(()) => false,
        };
        let _ = deliberate;
        let injected = w.injected_now() - w.injected_before;
        w.log.push(format!(
            "{k}:{step:?} faults+{injected} {}",
            w.last.take().unwrap_or_default()
        ));
        w.check_hazards(&format!("step {k} {step:?}"));
    }
    let log = sim.fault_log();
    out.calls = log.calls;
    out.injected = log.injected.len();
    out.sites.extend(log.sites.iter().cloned());
    note_faults(&mut out, &log);

    // The faults stop; the program carries on.
    sim.inject(Faults::none());
    w.injected_before = 0;
    checkpoint(&mut w);
    if matches!(p.end, End::Forget) {
        // Forgotten with work in flight: leaks allowed, hazards not.
        std::mem::forget(rep);
        w.kept.clear();
        forgot = true;
        let _ = sim.synchronize();
        w.check_hazards("forgetting the plan");
    } else {
        recover(&mut w, &mut rep);
        // Teardown under its own fault (`Plan::Teardown`): it may leak what
        // it could not wait for, never race.
        if let Plan::Teardown(k) = plan {
            sim.inject(Faults::at(*k));
        } else {
            sim.inject(Faults::none());
        }
        // Teardown: kept steps first (or after the plan, every other run).
        let kept: Vec<_> = w.kept.drain(..).flatten().collect();
        let kept_first = p.seed % 2 == 0 || avoid_known();
        w.kept_outlived = !kept_first && !kept.is_empty();
        let mut kept = Some(kept);
        if kept_first {
            drop(kept.take());
        }
        match p.end {
            End::Replan => {
                if let (Err(e), false) = (rep.replan(), matches!(plan, Plan::Teardown(_))) {
                    w.fail("replan fails with no fault", format!("{e:?}"));
                }
            }
            _ => drop(rep),
        }
        drop(kept);
        w.check_hazards("teardown");
        let log = sim.fault_log();
        out.teardown_calls = log.calls;
        out.injected += log.injected.len();
        out.sites.extend(log.sites.iter().cloned());
        note_faults(&mut out, &log);
        if !log.injected.is_empty() {
            forgot = true; // a teardown that could not wait leaks by design
        }
        sim.inject(Faults::none());
    }
    teardown_check(&mut w, forgot, base_allocs, base_events);
    if VERBOSE.load(std::sync::atomic::Ordering::Relaxed) {
        println!("injected: {:?}", log.injected);
        for l in &w.log {
            println!("  {l}");
        }
        println!("failures: {:#?}", w.failures);
    }
    out.failures = w.failures;
    out.swallowed = w.swallowed;
    out
}

/// Prints each run's steps (one program, one fault: `FAULT_EXPLORER_FAULT`).
static VERBOSE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn note_faults(out: &mut Outcome, log: &sim::FaultLog) {
    for (_, call, _) in &log.injected {
        let f = call.to_string();
        if !out.faults.contains(&f) {
            out.faults.push(f);
        }
    }
    out.faults.sort();
}

fn teardown_check(w: &mut World, forgot: bool, base_allocs: usize, base_events: usize) {
    let sim = w.sim.clone();
    let _ = sim.synchronize();
    let h = sim.hazards();
    if !h.is_empty() && !w.failures.iter().any(|(c, _)| c == "hazard") {
        w.fail("hazard", format!("at teardown: {:?}", h[0]));
    }
    if forgot {
        return;
    }
    let (allocs, events) = (sim.live_allocations(), sim.live_events());
    if allocs != base_allocs || events != base_events {
        w.fail(
            "leak",
            format!("allocations {allocs} (baseline {base_allocs}), events {events} (baseline {base_events})"),
        );
    }
    match sim.graph_memory_in_use() {
        Ok(Some(g)) if g.used != 0 || g.reserved != 0 => w.fail(
            if w.kept_outlived {
                "graph memory left reserved after a kept step outlived its plan"
            } else {
                "graph memory leak"
            },
            format!("used {} reserved {}", g.used, g.reserved),
        ),
        Ok(_) => {}
        Err(e) => w.fail("graph memory query fails with no fault", format!("{e:?}")),
    }
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic".into()
    }
}

/// Reads every buffer the model knows and checks it; the replay counters
/// bring the model back to exact counts.
fn checkpoint(w: &mut World) {
    let sim = w.sim.clone();
    for i in 0..w.p.runners() {
        let Ok(v) = sim.read_f32(&w.b.counts[i]) else {
            continue;
        };
        let (lo, hi) = w.m.count[i];
        let c = v[0] as u64;
        if c < lo || c > hi {
            w.fail(
                "wrong value",
                format!("runner {i} ran {c} times; the model says {lo}..={hi}"),
            );
        }
        w.m.count[i] = (c, c);
    }
    let groups = [
        ("sink", w.m.sinks.clone(), &w.b.sinks),
        ("step sink", w.m.step_sinks.clone(), &w.b.step_sinks),
        ("probe", w.m.probes.clone(), &w.b.probes),
    ];
    let mut bad = Vec::new();
    for (name, ivs, bufs) in groups {
        for (k, iv) in ivs.iter().enumerate() {
            let Ok(v) = sim.read_f32(&bufs[k]) else {
                continue;
            };
            if !holds(*iv, v[0]) {
                bad.push(format!("{name} {k} holds {}; the model says {iv:?}", v[0]));
            }
        }
    }
    for b in bad {
        w.fail("wrong value", b);
    }
}

/// With faults off: every runner replays (inputs staged first) and is
/// consumed, and every value is exact.
fn recover(w: &mut World, rep: &mut Replayable<sim::Device>) {
    let p = w.p;
    checkpoint(w);
    let sim = w.sim.clone();
    let mut expect = Vec::new();
    for i in 0..p.runners() {
        let s = &w.s[i % w.s.len()];
        let r = p.id(i);
        if p.is_staged(i) {
            let v = 500.0 + i as f32;
            let staged = rep.consume_mut(r, s, |st, views| {
                sim.launch(st, sim::Kernel::fill(in_of(views), v), 1)
            });
            if let Err(e) = staged {
                w.fail("cannot carry on", format!("staging runner {i}: {e:?}"));
                return;
            }
            w.m.input[i] = exact(v as f64);
            w.m.poisoned[i] = false;
        }
        if let Err(e) = rep.replay(r, s) {
            w.fail("cannot carry on", format!("replay of runner {i}: {e:?}"));
            return;
        }
        w.m.exec(p, i, Ran::Yes);
        let check = &w.b.checks[i];
        let consumed = rep.consume(r, &w.s[(i + 1) % w.s.len()], |st, views| {
            sim.launch(st, sim::Kernel::copy(out_of(views), check), 1)
        });
        if let Err(e) = consumed {
            w.fail("cannot carry on", format!("consumer of runner {i}: {e:?}"));
            return;
        }
        expect.push((i, w.m.out[i]));
    }
    for (i, iv) in expect {
        let got = sim.read_f32(&w.b.checks[i]).unwrap()[0];
        let (lo, hi) = w.m.count[i];
        if !holds(iv, got) || iv.is_none() && lo == hi && !p.is_reader(i) && !p.is_staged(i) {
            w.fail(
                "wrong value after recovery",
                format!("runner {i}: {got}, the model says {iv:?}"),
            );
        }
    }
    w.check_hazards("recovery");
}

fn closure_out<E>(f: Fail, enqueue: impl FnOnce() -> Result<(), E>) -> Result<(), String>
where
    E: std::fmt::Debug,
{
    if f == Fail::ErrEarly {
        return Err("deliberate (early)".into());
    }
    enqueue().map_err(|e| format!("{e:?}"))?;
    match f {
        Fail::Err => Err("deliberate".into()),
        Fail::Panic => std::panic::panic_any(Deliberate),
        _ => Ok(()),
    }
}

fn do_step(w: &mut World, rep: &mut Replayable<sim::Device>, step: &Step) {
    let p = w.p;
    let sim = w.sim.clone();
    match step {
        &Step::Replay(i, s) => {
            let got = rep.replay(p.id(i), &w.s[s]);
            w.last = Some(format!("{got:?}"));
            let ran = w.ran_of(&got);
            if p.is_staged(i) && w.m.poisoned[i] && ran == Ran::Yes {
                if !avoid_known() {
                    w.fail(
                        "replay reads an input whose writer failed",
                        format!("runner {i} replayed ({got:?}) after its staging closure failed"),
                    );
                }
                w.m.input[i] = None;
            }
            if p.is_staged(i) && w.m.poisoned[i] && ran != Ran::No {
                w.m.input[i] = None;
            }
            w.m.exec(p, i, ran);
        }
        &Step::Consume(i, s, sink, f) => {
            let entered = Cell::new(false);
            let enqueued = Cell::new(false);
            let dst = &w.b.sinks[sink];
            let got = catch_unwind(AssertUnwindSafe(|| {
                rep.consume(p.id(i), &w.s[s], |st, views| {
                    entered.set(true);
                    closure_out(f, || {
                        let r = sim.launch(st, sim::Kernel::copy(out_of(views), dst), 2);
                        enqueued.set(r.is_ok());
                        r
                    })
                })
            }));
            if enqueued.get() {
                w.m.sinks[sink] = w.m.out[i];
                w.m.last_sink[i] = Some(sink);
            }
            w.last = Some(format!("{got:?}"));
            settle_panic(got);
        }
        Step::ConsumeMany(rs, s, first, f) => {
            let enqueued = Cell::new(0usize);
            let ids: Vec<RunnerId> = rs.iter().map(|&i| p.id(i)).collect();
            let dsts = &w.b.sinks[*first..first + rs.len()];
            let got = catch_unwind(AssertUnwindSafe(|| {
                rep.consume_many(&ids, &w.s[*s], |st, lists| {
                    closure_out(*f, || {
                        for (views, dst) in lists.iter().zip(dsts) {
                            sim.launch(st, sim::Kernel::copy(out_of(views), dst), 2)?;
                            enqueued.set(enqueued.get() + 1);
                        }
                        Ok::<(), replay_arena::BackendError>(())
                    })
                })
            }));
            {
                for (k, &i) in rs.iter().enumerate().take(enqueued.get()) {
                    w.m.sinks[first + k] = w.m.out[i];
                    w.m.last_sink[i] = Some(first + k);
                }
            }
            w.last = Some(format!("{got:?}"));
            settle_panic(got);
        }
        &Step::ConsumeMut(i, s, v, f) => {
            let entered = Cell::new(false);
            let enqueued = Cell::new(false);
            let staged = p.is_staged(i);
            let got = catch_unwind(AssertUnwindSafe(|| {
                rep.consume_mut(p.id(i), &w.s[s], |st, views| {
                    entered.set(true);
                    closure_out(f, || {
                        let dst = if staged { in_of(views) } else { out_of(views) };
                        let r = sim.launch(st, sim::Kernel::fill(dst, v), 1);
                        enqueued.set(r.is_ok());
                        r
                    })
                })
            }));
            let closure_failed = f != Fail::No || (entered.get() && !enqueued.get());
            if staged {
                if enqueued.get() {
                    w.m.input[i] = exact(v as f64);
                }
                if entered.get() {
                    // Staged again: the runner owns its bytes, whose output
                    // part may hold another runner's (a consumer before its
                    // next replay reads that).
                    w.m.out[i] = None;
                }
                if entered.get() {
                    w.m.poisoned[i] = closure_failed;
                    if closure_failed && !enqueued.get() {
                        // The old input stays, but may be another runner's
                        // bytes: poisoned covers it.
                    }
                }
            } else if enqueued.get() {
                w.m.out[i] = exact(v as f64);
            }
            w.last = Some(format!("{got:?}"));
            settle_panic(got);
        }
        &Step::WaitFor(i, s, probe) => {
            let got = rep.wait_for(p.id(i), &w.s[s]);
            w.last = Some(format!("{got:?}"));
            if got.is_ok() {
                if let Some(sink) = w.m.last_sink[i] {
                    let r = sim.launch(
                        &w.s[s],
                        sim::Kernel::copy(&w.b.sinks[sink], &w.b.probes[probe]),
                        1,
                    );
                    if r.is_ok() {
                        w.m.probes[probe] = w.m.sinks[sink];
                    }
                }
            }
        }
        &Step::WaitAll(s, probe) => {
            let got = rep.wait_all(&w.s[s]);
            w.last = Some(format!("{got:?}"));
            if got.is_ok() {
                let latest = w.m.last_sink.iter().flatten().max().copied();
                if let Some(sink) = latest {
                    let r = sim.launch(
                        &w.s[s],
                        sim::Kernel::copy(&w.b.sinks[sink], &w.b.probes[probe]),
                        1,
                    );
                    if r.is_ok() {
                        w.m.probes[probe] = w.m.sinks[sink];
                    }
                }
            }
        }
        Step::Graph {
            items,
            overlapping,
            launches,
            wait,
            fate,
        } => step_graph(w, rep, items, *overlapping, launches, *wait, *fate),
        &Step::LaunchKept(k, s) => {
            let Some(Some((mut kept, items))) = w.kept.get_mut(k).map(Option::take) else {
                return;
            };
            let got = rep.launch_kept(&mut kept, &w.s[s]);
            w.last = Some(format!("{got:?}"));
            let ran = w.ran_of(&got);
            apply_schedule(w, &items, ran);
            w.kept[k] = Some((kept, items));
        }
        &Step::WaitKept(k, s) => {
            if let Some(Some((kept, _))) = w.kept.get(k) {
                let _ = rep.wait_kept(kept, &w.s[s]);
            }
        }
        &Step::DropKept(k) => {
            if let Some(slot) = w.kept.get_mut(k) {
                drop(slot.take());
            }
        }
        &Step::ForgetKept(k) => {
            if let Some(slot) = w.kept.get_mut(k) {
                if let Some(x) = slot.take() {
                    std::mem::forget(x);
                }
            }
        }
        Step::StartTrace => {
            let _ = rep.start_trace();
        }
        Step::FinishTrace => {
            let _ = rep.finish_trace();
        }
        Step::Report => {
            let _ = rep.report();
            let _ = rep.temporaries(p.id(0));
            let _ = rep.trim_graph_memory();
            let _ = rep.synchronize();
        }
        Step::Checkpoint => checkpoint(w),
    }
}

/// Re-raises a panic that is not a closure's own.
fn settle_panic<T>(got: std::thread::Result<T>) {
    if let Err(payload) = got {
        if payload.downcast_ref::<Deliberate>().is_none() {
            std::panic::resume_unwind(payload);
        }
    }
}

/// One launch of a step schedule, which ran `ran`.
fn apply_schedule(w: &mut World, items: &[SItem], ran: Ran) {
    let p = w.p;
    for item in items {
        match *item {
            SItem::Replay(i, _) => {
                if p.is_staged(i) && w.m.poisoned[i] && ran == Ran::Yes {
                    if !avoid_known() {
                        w.fail(
                            "replay reads an input whose writer failed",
                            format!(
                                "a step graph replayed runner {i} after its staging closure failed"
                            ),
                        );
                    }
                    w.m.input[i] = None;
                }
                if p.is_staged(i) && w.m.poisoned[i] && ran != Ran::No {
                    w.m.input[i] = None;
                }
                w.m.exec(p, i, ran);
            }
            SItem::Consume(i, _, sink, _) => match ran {
                Ran::Yes => w.m.step_sinks[sink] = w.m.out[i],
                Ran::Maybe => w.m.step_sinks[sink] = hull(w.m.step_sinks[sink], w.m.out[i]),
                Ran::No => {}
            },
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn step_graph(
    w: &mut World,
    rep: &mut Replayable<sim::Device>,
    items: &[SItem],
    overlapping: bool,
    launches: &[usize],
    wait: Option<usize>,
    fate: Fate,
) {
    let p = w.p;
    let sim = w.sim.clone();
    let streams = w.s.clone();
    let sinks = &w.b.step_sinks;
    let mut scheduled = Vec::new();
    let mut builder = rep.step();
    for item in items {
        match *item {
            SItem::Replay(i, l) => {
                if builder.replay(p.id(i), &streams[l]).is_ok() {
                    scheduled.push(item.clone());
                }
            }
            SItem::Consume(i, l, sink, f) => {
                let dst = &sinks[sink];
                let got = catch_unwind(AssertUnwindSafe(|| {
                    builder
                        .consume(p.id(i), &streams[l], |st, views| {
                            closure_out(f, || {
                                sim.launch(st, sim::Kernel::copy(out_of(views), dst), 2)
                            })
                        })
                        .is_ok()
                }));
                match got {
                    Ok(true) => scheduled.push(item.clone()),
                    Ok(false) => {}
                    Err(payload) => settle_panic::<()>(Err(payload)),
                }
            }
        }
    }
    let graph = if overlapping {
        builder.build_overlapping()
    } else {
        builder.build()
    };
    w.log.push(format!(
        "   built {} of {} items: {:?}",
        scheduled.len(),
        items.len(),
        graph.as_ref().map(|_| ()).map_err(|e| format!("{e:?}"))
    ));
    let Ok(mut graph) = graph else {
        return;
    };
    for &l in launches {
        w.injected_before = w.injected_now();
        let got = graph.launch(&streams[l]);
        w.log.push(format!("   launch on {l}: {got:?}"));
        let ran = w.ran_of(&got);
        apply_schedule(w, &scheduled, ran);
    }
    if let Some(l) = wait {
        let _ = graph.wait_all(&streams[l]);
    }
    match fate {
        Fate::Drop => drop(graph),
        Fate::Forget => std::mem::forget(graph),
        Fate::Keep => {
            w.kept.push(Some((graph.keep(), scheduled)));
            w.kept_slots += 1;
        }
    }
}

// ---------------------------------------------------------------------
// The explorer.

#[derive(Default)]
struct Totals {
    programs: u64,
    runs: u64,
    fault_runs: u64,
    injected: u64,
    sites: BTreeSet<(Call, String)>,
    swallowed: BTreeMap<String, u64>,
    /// Per failure class: how many runs, and the first (seed, plan, detail).
    failures: BTreeMap<String, (u64, u64, String, String)>,
}

impl Totals {
    fn add(&mut self, seed: u64, plan: &Plan, o: Outcome) {
        self.runs += 1;
        if *plan != Plan::None {
            self.fault_runs += 1;
        }
        self.injected += o.injected as u64;
        self.sites.extend(o.sites);
        for s in o.swallowed {
            *self.swallowed.entry(s).or_default() += 1;
        }
        let mut seen = BTreeSet::new();
        for (class, detail) in o.failures {
            // Attributed to the calls that failed (a hazard after a failed
            // step launch is another bug than one after a failed wait).
            let class = match plan {
                // Not the fault's doing: the closure's.
                _ if class.starts_with("replay reads an input") || class.contains("outlived") => {
                    class
                }
                Plan::None => format!("{class} (no fault)"),
                Plan::At(_) => format!("{class} after a failed {}", o.faults.join(", ")),
                Plan::Seeded(..) => format!("{class} under seeded faults"),
                Plan::Teardown(_) => {
                    format!("{class} after a failed {} in teardown", o.faults.join(", "))
                }
            };
            if !seen.insert(class.clone()) {
                continue;
            }
            let e = self
                .failures
                .entry(class)
                .or_insert((0, seed, plan.spell(), detail));
            e.0 += 1;
        }
    }
}

/// The fault plans for one program: none, each position (or a sample),
/// and seeded schedules.
fn plans_of(seed: u64, calls: u64, positions: u64) -> Vec<Plan> {
    let mut plans = Vec::new();
    if calls <= positions {
        plans.extend((0..calls).map(Plan::At));
    } else {
        let mut rng = Rng::new(seed ^ 0xFA17);
        let mut picked = BTreeSet::new();
        // Evenly spread, plus random ones.
        for k in 0..positions / 2 {
            picked.insert(k * calls / (positions / 2).max(1));
        }
        while (picked.len() as u64) < positions {
            picked.insert(rng.next() % calls);
        }
        plans.extend(picked.into_iter().map(Plan::At));
    }
    for k in 0..3u64 {
        plans.push(Plan::Seeded(
            seed.wrapping_mul(31).wrapping_add(k),
            (calls / 3).max(2),
        ));
    }
    plans
}

fn explore_program(seed: u64, positions: u64, only: Option<&Plan>, t: &mut Totals) {
    let p = Program::generate(seed);
    t.programs += 1;
    if let Some(plan) = only {
        VERBOSE.store(true, std::sync::atomic::Ordering::Relaxed);
        let o = run(&p, plan);
        t.add(seed, plan, o);
        return;
    }
    let clean = run(&p, &Plan::None);
    let (calls, teardown) = (clean.calls, clean.teardown_calls);
    t.add(seed, &Plan::None, clean);
    let teardown = (0..teardown.min(positions / 2)).map(Plan::Teardown);
    for plan in plans_of(seed, calls, positions).into_iter().chain(teardown) {
        let o = run(&p, &plan);
        t.add(seed, &plan, o);
    }
}

/// The call sites of backend calls in src/ (outside the backends' own
/// modules), found by a textual search: each line that calls a method of
/// a backend role (`Streams`, `Allocate`, `Capture`, `Launch`, `Backend`,
/// `Compose`: `.launch(`,
/// `.record_event(`, ...), outside comments and the `#[cfg(test)]`
/// modules at the end of files.
fn backend_call_sites() -> BTreeSet<String> {
    const CALLS: [&str; 17] = [
        ".create_event(",
        ".record_event(",
        ".wait_event(",
        ".synchronize_event(",
        ".synchronize(",
        ".is_capturing(",
        ".allocate_arena(",
        ".record_event_node(",
        ".launch(",
        ".begin_capture(",
        ".end_capture(",
        ".split_graph(",
        ".compose(",
        ".trim_graph_memory(",
        ".graph_memory_in_use(",
        ".graph_temporaries(",
        ".abort_capture(",
    ];
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    let mut dirs = vec![root.join("src")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let path = e.path();
            if path.is_dir() {
                if !path.ends_with("backend") {
                    dirs.push(path);
                }
            } else if path.extension().is_some_and(|x| x == "rs") {
                files.push(path);
            }
        }
    }
    let texts: Vec<String> = files
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap())
        .collect();
    let mut sites = BTreeSet::new();
    for (f, text) in files.iter().zip(&texts) {
        // A module compiled for tests only (`#[cfg(test)] mod name;`).
        let stem = f.file_stem().unwrap().to_string_lossy();
        let test_only = format!("#[cfg(test)]\nmod {stem};");
        if texts.iter().any(|t| t.contains(&test_only)) {
            continue;
        }
        let rel = f.strip_prefix(root).unwrap().display().to_string();
        let text = text.as_str();
        for (n, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if code.starts_with("#[cfg(test)]") {
                break;
            }
            if code.starts_with("//") {
                continue;
            }
            if CALLS.iter().any(|c| code.contains(c)) {
                sites.insert(format!("{rel}:{}", n + 1));
            }
        }
    }
    sites
}

fn report(t: &Totals, seconds: f64) {
    let in_src: BTreeSet<&String> = t
        .sites
        .iter()
        .filter(|(_, at)| at.starts_with("src/"))
        .map(|(_, at)| at)
        .collect();
    let pairs = t
        .sites
        .iter()
        .filter(|(_, at)| at.starts_with("src/"))
        .count();
    let grep = backend_call_sites();
    let reached_grep = grep.iter().filter(|s| in_src.contains(s)).count();
    println!(
        "fault explorer: {} programs, {} runs ({} with faults, {} faults injected) in {:.1} s ({:.0} runs/s)",
        t.programs,
        t.runs,
        t.fault_runs,
        t.injected,
        seconds,
        t.runs as f64 / seconds.max(1e-9)
    );
    println!(
        "failure sites reached: {} (call, file:line) pairs in src/ at {} lines; backend call sites in src/ (grep): {}, of which reached: {}",
        pairs,
        in_src.len(),
        grep.len(),
        reached_grep
    );
    if std::env::var("FAULT_EXPLORER_SITES").is_ok() {
        for (c, at) in t.sites.iter().filter(|(_, at)| at.starts_with("src/")) {
            println!("  reached {c:?} at {at}");
        }
        for s in grep.iter().filter(|s| !in_src.contains(s)) {
            println!("  not reached: {s}");
        }
    }
    for (s, n) in &t.swallowed {
        println!("  note: {n} runs: {s}");
    }
    for (class, (n, seed, plan, detail)) in &t.failures {
        println!(
            "FAILURE [{class}] in {n} runs; first: FAULT_EXPLORER_SEED={seed} FAULT_EXPLORER_FAULT={plan}: {detail}"
        );
    }
}

#[test]
fn explore() {
    quiet_deliberate_panics();
    let programs = env_u64("FAULT_EXPLORER_PROGRAMS").unwrap_or(100);
    let positions = env_u64("FAULT_EXPLORER_POSITIONS").unwrap_or(24);
    let only = std::env::var("FAULT_EXPLORER_FAULT")
        .ok()
        .map(|s| Plan::parse(&s).expect("FAULT_EXPLORER_FAULT: none, at:K or seeded:S:ONE_IN"));
    let start = std::time::Instant::now(); // printed only; nothing depends on it
    let mut t = Totals::default();
    match env_u64("FAULT_EXPLORER_SEED") {
        Some(seed) => {
            let p = Program::generate(seed);
            println!("{p:#?}");
            explore_program(seed, positions, only.as_ref(), &mut t);
        }
        None => {
            for seed in 0..programs {
                explore_program(seed, positions, None, &mut t);
            }
        }
    }
    report(&t, start.elapsed().as_secs_f64());
    assert!(
        t.failures.is_empty(),
        "{} failure classes (seeds printed above)",
        t.failures.len()
    );
}

/// The number of backend call sites in src/ (the denominator of the
/// explorer's "sites reached"), by the textual search above.
#[test]
fn backend_call_sites_in_src() {
    let sites = backend_call_sites();
    println!("backend call sites in src/: {}", sites.len());
    for s in &sites {
        println!("  {s}");
    }
    assert!(sites.len() > 20);
}

// ---------------------------------------------------------------------
// Named regression tests (issue 39).

/// `n` runners in one generation (they share their bytes); each fills its
/// view with r + 1 for `dur` ticks.
fn two(n: u32, dur: u64) -> Setup {
    kept::setup(n, 1, dur)
}

/// Replays runner 0 on `stream`, waits for everything: `sim` saw no hazard.
fn replay_without_hazards(x: &mut Setup, stream: &sim::Stream) {
    x.replayable.replay(RunnerId(0), stream).unwrap();
    x.sim.synchronize().unwrap();
    let h = x.sim.hazards();
    assert!(h.is_empty(), "hazards: {h:?}");
}

/// Issue 39: a kept step graph launched on A, launched again on B (nothing
/// in between) where the backend launch fails, launched again on A (good),
/// then a runner sharing the step's bytes replayed on B: no hazard.
#[test]
fn failed_kept_launch_on_another_stream_leaves_the_fence_right() {
    let mut x = two(2, 100);
    let mut kept = kept_all(&mut x, 1);
    let (a, b) = (x.s[2].clone(), x.s[3].clone());
    x.replayable.launch_kept(&mut kept, &a).unwrap();
    x.sim.inject(Faults::nth(Call::Launch, 0));
    let failed = x.replayable.launch_kept(&mut kept, &b);
    assert!(failed.is_err(), "the injected launch failure is reported");
    x.sim.inject(Faults::none());
    x.replayable.launch_kept(&mut kept, &a).unwrap();
    replay_without_hazards(&mut x, &b);
    let view = x.replayable.views(RunnerId(0)).unwrap()[0];
    assert_eq!(x.sim.read_f32(&view).unwrap()[0], 1.0);
    drop(kept);
}

/// A borrowed step graph of both runners launched on A, on B where the
/// backend launch fails, and on A again; then forgotten or dropped, and
/// runner 0 replayed on B: no hazard.
fn failed_borrowed_launch_on_another_stream(forget: bool) {
    let mut x = two(2, 100);
    let (a, b) = (x.s[2].clone(), x.s[3].clone());
    {
        let mut step = x.replayable.step();
        step.replay(RunnerId(0), &x.s[1]).unwrap();
        step.replay(RunnerId(1), &x.s[1]).unwrap();
        let mut graph = step.build().unwrap();
        graph.launch(&a).unwrap();
        x.sim.inject(Faults::nth(Call::Launch, 0));
        assert!(graph.launch(&b).is_err());
        x.sim.inject(Faults::none());
        graph.launch(&a).unwrap();
        if forget {
            std::mem::forget(graph);
        }
    }
    replay_without_hazards(&mut x, &b);
}

/// The same with a borrowed `StepGraph`, forgotten before the replay (a
/// drop would wait for its launches and hide the race).
#[test]
fn failed_borrowed_launch_on_another_stream_leaves_the_fence_right() {
    failed_borrowed_launch_on_another_stream(true);
}

/// The same, the borrowed step graph dropped before the replay.
#[test]
fn failed_borrowed_launch_then_drop_leaves_the_fence_right() {
    failed_borrowed_launch_on_another_stream(false);
}

/// A bucketed plan: runner 0 (bucket a) and runner 10 (bucket b, a staged
/// input) share their bytes. Runner 10's input is staged on stream 1 and
/// replayed on stream 0, then runner 0 replayed there takes the bytes.
fn staged_world() -> (sim::Device, Replayable<sim::Device>, Vec<sim::Stream>) {
    let input = Request::new(Domain::Device, DType::F32, 64).purpose(Purpose::Input);
    let mut d = Discovering::new(PlanConfig::new());
    d.bucket("a").unwrap();
    d.arm(RunnerId(0)).unwrap().record(REQ).unwrap();
    d.bucket("b").unwrap();
    d.arm(RunnerId(10)).unwrap().record(input).unwrap();
    let planned = d.plan(Policy::Generations(1)).unwrap();
    let sim = sim::Device::new();
    let s: Vec<sim::Stream> = (0..3).map(|_| sim.new_stream()).collect();
    let mut capturing = planned.allocate(sim.clone()).unwrap();
    {
        capture_view(&mut capturing, RunnerId(0), REQ, &s[0], |st, v| {
            sim.launch(st, sim::Kernel::fill(&v, 7.0), 10)
        });
    }
    {
        capture_view(&mut capturing, RunnerId(10), input, &s[0], |st, v| {
            sim.launch(st, sim::Kernel::scale(&v, 2.0), 10)
        });
    }
    let mut rep = capturing.seal().unwrap();
    rep.consume_mut(RunnerId(10), &s[1], |st, v| {
        sim.launch(st, sim::Kernel::fill(&v[0], 1.0), 1)
    })
    .unwrap();
    rep.replay(RunnerId(10), &s[0]).unwrap();
    rep.replay(RunnerId(0), &s[0]).unwrap(); // takes the bytes
    (sim.clone(), rep, s)
}

/// A staged input whose writer closure failed is not staged: the next
/// replay is `InputNotStaged` (for a closure that fails after enqueuing,
/// one that fails before, and one that panics).
#[test]
fn staged_input_whose_writer_failed_is_not_staged() {
    quiet_deliberate_panics();
    for how in [Fail::Err, Fail::ErrEarly, Fail::Panic] {
        let (sim, mut rep, s) = staged_world();
        let staged = catch_unwind(AssertUnwindSafe(|| {
            rep.consume_mut(RunnerId(10), &s[1], |st, v| {
                closure_out(how, || sim.launch(st, sim::Kernel::fill(&v[0], 3.0), 1))
            })
        }));
        assert!(!matches!(staged, Ok(Ok(()))));
        let next = rep.replay(RunnerId(10), &s[0]);
        assert!(
            matches!(next, Err(ReplayError::InputNotStaged { .. })),
            "{how:?}: the writer failed, yet the replay gave {next:?}"
        );
        rep.synchronize().unwrap();
        assert!(sim.hazards().is_empty());
    }
}

/// `fence_stats` counts no replay, consumer or step launch whose backend
/// launch (or wait) failed: that work never ran.
#[test]
fn fence_stats_do_not_count_work_that_never_ran() {
    let mut x = two(2, 10);
    let (a, b) = (x.s[1].clone(), x.s[2].clone());
    x.replayable.replay(RunnerId(0), &a).unwrap();
    let before = x.replayable.fence_stats();
    x.sim.inject(Faults::nth(Call::Launch, 0));
    assert!(x.replayable.replay(RunnerId(1), &a).is_err());
    x.sim.inject(Faults::none());
    assert_eq!(
        x.replayable.fence_stats().replays,
        before.replays,
        "a failed replay"
    );

    // A consumer on another stream must wait; the wait fails, so its work
    // never runs.
    x.replayable.replay(RunnerId(1), &a).unwrap();
    let before = x.replayable.fence_stats();
    let sim = x.sim.clone();
    let out = sim.alloc_f32(64).unwrap();
    let entered = Cell::new(false);
    x.sim.inject(Faults::nth(Call::WaitEvent, 0));
    let got = x.replayable.consume(RunnerId(1), &b, |st, v| {
        entered.set(true);
        sim.launch(st, sim::Kernel::copy(&v[0], &out), 1)
    });
    x.sim.inject(Faults::none());
    assert!(got.is_err() && !entered.get(), "{got:?}");
    assert_eq!(
        x.replayable.fence_stats().consumers,
        before.consumers,
        "a consumer that never ran"
    );

    // A step launch whose backend launch fails.
    let mut kept = {
        let mut step = x.replayable.step();
        step.replay(RunnerId(0), &a).unwrap();
        step.build().unwrap().keep()
    };
    let before = x.replayable.fence_stats();
    x.sim.inject(Faults::nth(Call::Launch, 0));
    assert!(x.replayable.launch_kept(&mut kept, &b).is_err());
    x.sim.inject(Faults::none());
    assert_eq!(
        x.replayable.fence_stats().step_launches,
        before.step_launches,
        "a failed kept launch"
    );
    x.replayable.launch_kept(&mut kept, &b).unwrap();
    drop(kept);
    x.sim.synchronize().unwrap();
    assert!(x.sim.hazards().is_empty());
}

/// A consumer whose closure fails before enqueuing anything ran no work
/// either: the consumer counter does not move.
#[test]
fn fence_stats_do_not_count_a_consumer_whose_closure_enqueued_nothing() {
    let mut x = two(1, 10);
    let a = x.s[1].clone();
    x.replayable.replay(RunnerId(0), &a).unwrap();
    let before = x.replayable.fence_stats();
    let got = x
        .replayable
        .consume(RunnerId(0), &a, |_, _| Err::<(), _>("nothing done"));
    assert!(matches!(got, Err(ConsumeError::Work(_))));
    assert_eq!(x.replayable.fence_stats().consumers, before.consumers);
}

/// A kept step graph that moved in a step copy with temporaries and
/// outlived its plan: once both are gone, the driver's graph memory pool
/// holds nothing for them (the plan's drop trimmed while the kept step
/// still held its copy; nothing trims after).
#[test]
fn kept_step_outliving_its_plan_gives_graph_memory_back() {
    let (sim, s, mut capturing) = allocated(&[&[REQ]], Policy::Generations(1));
    {
        let cap = capturing.capture(RunnerId(0)).unwrap();
        let out = cap.take(REQ).unwrap();
        cap.stream_capture_repeatable(&s, |st| {
            let t = sim.alloc_async(st, 64)?;
            sim.launch(st, sim::Kernel::fill(&t, 2.0), 5)?;
            sim.launch(st, sim::Kernel::copy(&t, &out), 5)?;
            sim.free_async(st, &t)
        })
        .unwrap();
        cap.finish().unwrap();
    }
    let mut rep = capturing.seal().unwrap();
    let mut kept = {
        let mut step = rep.step();
        step.replay(RunnerId(0), &s).unwrap();
        step.build().unwrap().keep()
    };
    rep.launch_kept(&mut kept, &s).unwrap();
    drop(rep);
    drop(kept);
    let g = sim.graph_memory_in_use().unwrap().unwrap();
    assert_eq!((g.used, g.reserved), (0, 0), "graph memory after teardown");
    assert_eq!(sim.live_allocations(), 0);
}

/// `consume_mut` of a staged runner stages it (the runner takes its bytes
/// back) before its consumer's own capture-status check; when that check
/// fails, nothing was written, yet the runner owns bytes holding another
/// runner's data. Its next replay must be `InputNotStaged`.
#[test]
fn staging_whose_later_check_failed_is_not_staged() {
    for call in [Call::CaptureStatus, Call::WaitEvent, Call::RecordEvent] {
        for n in 0..4 {
            let (sim, mut rep, s) = staged_world();
            sim.inject(Faults::nth(call, n));
            let entered = Cell::new(false);
            let staged = rep.consume_mut(RunnerId(10), &s[1], |st, v| {
                entered.set(true);
                sim.launch(st, sim::Kernel::fill(&v[0], 3.0), 1)
            });
            let injected = sim.fault_log().injected;
            sim.inject(Faults::none());
            if staged.is_ok() || entered.get() || injected.is_empty() {
                continue;
            }
            let next = rep.replay(RunnerId(10), &s[0]);
            assert!(
                matches!(next, Err(ReplayError::InputNotStaged { .. })),
                "the write never ran (a failed {injected:?}), yet the replay gave {next:?}"
            );
        }
    }
}
