//! The whole lifecycle as a random state machine on `sim`, against a model.
//!
//! Each case runs up to three rounds. A round discovers a random workload
//! (with rejected requests and runners armed twice mixed in), plans it under
//! a random policy and placement (sometimes an invalid one), allocates with
//! injected allocation failures, captures every runner right or wrong
//! (mismatched, extra and missing requests, failing and panicking closures,
//! no graph, dropped captures, a second capture, a nested `stream_capture`),
//! seals, then replays and consumes on three streams with synchronizations
//! in between (consumers fail or panic too, or try to use a second live
//! plan's views and their own on another stream), replaces streams with new
//! ones, replays on a stream the backend refuses (a failed launch), and ends by
//! re-planning into the next round or by dropping everything.
//!
//! Invariants: no panic escapes the crate (the only panics are the
//! closures' own, caught); every error is the one the model predicts; a
//! view used outside its closure, on another stream or from the other plan
//! is refused; a failed launch enqueues nothing; the sim sees no hazard; every value read (consumer copies, and the views of
//! runners that still own their bytes) is the one the model predicts; and
//! nothing stays allocated once a round is dropped.
//!
//! `cargo test` runs a quick count of cases; `LIFECYCLE_FUZZ_CASES` (or
//! `PROPTEST_CASES`) raises it, see `docs/fuzzing.md`.

use crate::support::capture_view;
use crate::support::steps::allocate_runners;
use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Once;

use proptest::prelude::*;
use replay_arena::sim;
use replay_arena::{
    BackendError, CaptureError, CaptureFailure, Capturing, ConsumeError, DType, Discovering,
    DiscoveryError, Domain, GroupId, PlacedPolicy, Placement, PlanConfig, PlanError, Policy,
    ReplayError, Replayable, Request, RunnerId, StepError, StreamCaptureError,
};

/// Cases `cargo test` runs when no count is set.
const QUICK_CASES: u32 = 256;

fn cases() -> u32 {
    ["LIFECYCLE_FUZZ_CASES", "PROPTEST_CASES"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.parse().ok())
        .unwrap_or(QUICK_CASES)
}

const GTP: GroupId = GroupId(3);
const STREAMS: usize = 3;
const MAX_RUNNERS: usize = 6;

/// The payload of the closures' own panics.
struct Deliberate;

fn deliberate() -> ! {
    std::panic::panic_any(Deliberate)
}

/// Keeps deliberate panics quiet; any other panic is reported as usual.
fn quiet_deliberate_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<Deliberate>().is_none() {
                default(info);
            }
        }));
    });
}

fn is_deliberate(payload: &(dyn Any + Send)) -> bool {
    payload.downcast_ref::<Deliberate>().is_some()
}

fn config() -> PlanConfig {
    PlanConfig::new().with_group(GTP, "gtp").unwrap()
}

// ---- the generated case -----------------------------------------------------

/// A request-shaped mistake made during discovery.
#[derive(Clone, Copy, Debug)]
enum DiscoveryFault {
    ZeroElements,
    UnknownGroup,
    ArmTwice,
}

#[derive(Clone, Debug)]
struct RunnerSpec {
    requests: Vec<Request>,
    named: bool,
    /// A mistake before the request at this index (`ArmTwice`: after the
    /// runner's requests).
    fault: Option<(usize, DiscoveryFault)>,
}

/// How a runner's capture goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CaptureMode {
    /// Every request in order, one graph, finish.
    Right,
    /// A mismatched request first (refused), then as `Right`.
    MismatchThenRight,
    /// As `Right`, plus one request too many (refused) before finishing.
    ExtraThenRight,
    /// The last request is never taken: finish fails.
    TooFew,
    /// The work closure fails.
    WorkFails,
    /// The work closure panics after launching.
    Panics,
    /// Finish without capturing a graph.
    NoGraph,
    /// The capture is dropped unfinished.
    Dropped,
    /// The capture is never opened.
    Skipped,
    /// As `Right`, then a second capture of the runner is refused.
    Twice,
    /// As `Right`, with a `stream_capture` from inside the work closure
    /// (refused; the outer capture goes on).
    Nested,
    /// The graph is captured, then the capture is forgotten
    /// (`mem::forget`) instead of finished: the runner stays uncaptured
    /// and its graph can never be launched.
    Forgotten,
}

#[derive(Clone, Copy, Debug)]
enum ConsumerMode {
    Copies,
    Fails,
    PanicsAfterCopying,
    /// Copies, after trying the other plan's views, its own views on
    /// another stream, and its own views from inside the other plan's
    /// consumer (all refused).
    Trespasses,
}

#[derive(Clone, Copy, Debug)]
enum Step {
    Replay {
        runner: usize,
        stream: usize,
    },
    Consume {
        runner: usize,
        stream: usize,
        duration: u64,
        mode: ConsumerMode,
    },
    ReplayUnknown,
    Synchronize,
    /// The stream is replaced by a new one (the old handle dropped).
    NewStream {
        stream: usize,
    },
    /// A replay on a stream of another backend: refused, enqueueing
    /// nothing, and the fence goes on as if it never happened.
    ReplayRefused {
        runner: usize,
    },
    /// Every captured runner, in capture order on its capture stream, as a
    /// step graph launched `launches` times on `stream`, then dropped or
    /// forgotten (`mem::forget`): the fence goes on after it either way.
    LaunchStepGraph {
        launches: usize,
        stream: usize,
        forget: bool,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    Replan,
    Drop,
    /// `mem::forget` of the `Replayable` with work in flight: its arenas
    /// and events leak, and the next round's plan on the same backend
    /// never touches them.
    Forget,
}

#[derive(Clone, Debug)]
struct Round {
    runners: Vec<RunnerSpec>,
    generations: usize,
    packed: bool,
    /// Allocations that succeed before the injected failures.
    allocations_before_failure: Option<usize>,
    captures: Vec<CaptureMode>,
    durations: Vec<u64>,
    steps: Vec<Step>,
    end: End,
    /// A failed plan, allocation or seal is forgotten instead of handed
    /// back (the round ends there; what it holds leaks).
    forget_failures: bool,
}

fn request() -> impl Strategy<Value = Request> {
    crate::support::f32_request(GTP, 1..300)
}

fn runner_spec() -> impl Strategy<Value = RunnerSpec> {
    let fault = prop_oneof![
        Just(DiscoveryFault::ZeroElements),
        Just(DiscoveryFault::UnknownGroup),
        Just(DiscoveryFault::ArmTwice),
    ];
    (
        prop::collection::vec(request(), 0..4),
        any::<bool>(),
        prop::option::weighted(0.2, (0usize..4, fault)),
    )
        .prop_map(|(requests, named, fault)| RunnerSpec {
            requests,
            named,
            fault,
        })
}

fn capture_mode() -> impl Strategy<Value = CaptureMode> {
    prop_oneof![
        24 => Just(CaptureMode::Right),
        2 => Just(CaptureMode::MismatchThenRight),
        2 => Just(CaptureMode::ExtraThenRight),
        2 => Just(CaptureMode::Twice),
        1 => Just(CaptureMode::TooFew),
        1 => Just(CaptureMode::WorkFails),
        1 => Just(CaptureMode::Panics),
        1 => Just(CaptureMode::NoGraph),
        1 => Just(CaptureMode::Dropped),
        1 => Just(CaptureMode::Skipped),
        2 => Just(CaptureMode::Nested),
        1 => Just(CaptureMode::Forgotten),
    ]
}

fn step(runners: usize) -> impl Strategy<Value = Step> {
    let mode = prop_oneof![
        8 => Just(ConsumerMode::Copies),
        1 => Just(ConsumerMode::Fails),
        1 => Just(ConsumerMode::PanicsAfterCopying),
        2 => Just(ConsumerMode::Trespasses),
    ];
    prop_oneof![
        10 => (0..runners, 0..STREAMS).prop_map(|(runner, stream)| Step::Replay { runner, stream }),
        6 => (0..runners, 0..STREAMS, 1u64..40, mode).prop_map(|(runner, stream, duration, mode)| {
            Step::Consume { runner, stream, duration, mode }
        }),
        1 => Just(Step::ReplayUnknown),
        2 => Just(Step::Synchronize),
        1 => (0..STREAMS).prop_map(|stream| Step::NewStream { stream }),
        1 => (0..runners).prop_map(|runner| Step::ReplayRefused { runner }),
        2 => (0usize..4, 0..STREAMS, any::<bool>())
            .prop_map(|(launches, stream, forget)| Step::LaunchStepGraph { launches, stream, forget }),
    ]
}

fn round() -> impl Strategy<Value = Round> {
    prop::collection::vec(runner_spec(), 1..=MAX_RUNNERS).prop_flat_map(|runners| {
        let n = runners.len();
        (
            Just(runners),
            prop_oneof![1 => Just(0usize), 12 => 1usize..5],
            any::<bool>(),
            prop::option::weighted(0.15, 0usize..6),
            prop::collection::vec(capture_mode(), n),
            prop::collection::vec(0u64..30, n),
            prop::collection::vec(step(n), 0..40),
            prop_oneof![3 => Just(End::Replan), 3 => Just(End::Drop), 1 => Just(End::Forget)],
            prop::bool::weighted(0.3),
        )
            .prop_map(|t| Round {
                runners: t.0,
                generations: t.1,
                packed: t.2,
                allocations_before_failure: t.3,
                captures: t.4,
                durations: t.5,
                steps: t.6,
                end: t.7,
                forget_failures: t.8,
            })
    })
}

// ---- the model ----------------------------------------------------------------

/// A fence claim as the model sees it: a byte range of a region (the
/// generation under round-robin, the arena under packed placement).
#[derive(Clone, Copy, Debug)]
struct Claim {
    region: usize,
    lo: u64,
    hi: u64,
}

fn overlap(a: &[Claim], b: &[Claim]) -> bool {
    a.iter().any(|x| {
        b.iter()
            .any(|y| x.region == y.region && x.lo < y.hi && y.lo < x.hi)
    })
}

/// Which runner last replayed over which bytes, as the fence must see it.
struct Ownership {
    claims: Vec<Vec<Claim>>,
    /// Replays in order: (runner).
    paints: Vec<usize>,
    /// Index into `paints` of each runner's latest replay.
    latest: Vec<Option<usize>>,
}

impl Ownership {
    fn replayed(&mut self, r: usize) {
        if !self.claims[r].is_empty() {
            self.latest[r] = Some(self.paints.len());
            self.paints.push(r);
        }
    }

    /// Runners that replayed over some of `r`'s bytes since `r`'s latest
    /// replay (since the start if it never replayed).
    fn overwriters(&self, r: usize) -> Vec<usize> {
        let since = self.latest[r].map_or(0, |i| i + 1);
        self.paints[since..]
            .iter()
            .copied()
            .filter(|&s| s != r && overlap(&self.claims[s], &self.claims[r]))
            .collect()
    }
}

/// The value runner `r`'s graph writes on its `k`-th replay of round
/// `round`: its counter starts at the base and each replay adds one.
fn base(round: usize, r: usize) -> f32 {
    (10_000 * round + 1_000 * (r + 1)) as f32
}

// ---- running a case -------------------------------------------------------------

/// Everything a case checks fails the test through `prop_assert!`; the
/// runner returns `Err` for those.
type Check = Result<(), TestCaseError>;

struct Rig {
    sim: sim::Device,
    streams: std::cell::RefCell<Vec<sim::Stream>>,
    /// A stream of another backend, which `sim` refuses.
    foreign: sim::Stream,
    /// Events that forgotten values leaked (leaking is allowed).
    leaked_events: std::cell::Cell<usize>,
}

impl Rig {
    /// The current stream in slot `i`.
    fn stream(&self, i: usize) -> sim::Stream {
        self.streams.borrow()[i].clone()
    }
}

fn run_case(rounds: &[Round]) -> Check {
    quiet_deliberate_panics();
    let sim = sim::Device::new();
    let rig = Rig {
        streams: std::cell::RefCell::new((0..STREAMS).map(|_| sim.new_stream()).collect()),
        foreign: sim::Device::new().new_stream(),
        sim,
        leaked_events: std::cell::Cell::new(0),
    };
    // Arenas that forgotten values leaked.
    let mut leaked_arenas = 0;
    let mut discovery = Discovering::new(config());
    for (i, round) in rounds.iter().enumerate() {
        let before = rig.sim.live_allocations();
        match run_round(&rig, i, round, discovery)? {
            Some(next) => discovery = next,
            None => discovery = Discovering::new(config()),
        }
        leaked_arenas += rig.sim.live_allocations() - before;
        prop_assert_eq!(rig.sim.hazards(), vec![], "round {}", i);
    }
    drop(discovery);
    prop_assert_eq!(rig.sim.live_allocations(), leaked_arenas);
    prop_assert_eq!(rig.sim.live_events(), rig.leaked_events.get());
    Ok(())
}

/// Discovers a round's workload; returns the requests each runner really
/// recorded.
fn discover(d: &mut Discovering, round: &Round) -> Result<Vec<Vec<Request>>, TestCaseError> {
    let mut recorded = Vec::new();
    for (r, spec) in round.runners.iter().enumerate() {
        let id = RunnerId(r as u32);
        let name = format!("layer{r}.bwd");
        let mut kept = Vec::new();
        {
            let mut armed = if spec.named {
                d.arm_named(id, name.clone())
            } else {
                d.arm(id)
            }
            .map_err(|e| TestCaseError::fail(format!("arming {id}: {e}")))?;
            for (i, &q) in spec.requests.iter().enumerate() {
                // A rejected request before the i-th one leaves no trace.
                match spec.fault {
                    Some((at, DiscoveryFault::ZeroElements)) if at == i => {
                        let e = armed
                            .record(Request::new(Domain::Device, DType::F32, 0))
                            .unwrap_err();
                        prop_assert!(
                            matches!(e, DiscoveryError::ZeroElements { runner, .. } if runner == id),
                            "{:?}",
                            e
                        );
                    }
                    Some((at, DiscoveryFault::UnknownGroup)) if at == i => {
                        let e = armed
                            .record(Request::new(Domain::Symmetric(GroupId(99)), DType::F32, 8))
                            .unwrap_err();
                        prop_assert!(
                            matches!(e, DiscoveryError::UnknownGroup { runner, group, .. } if runner == id && group == GroupId(99)),
                            "{:?}",
                            e
                        );
                    }
                    _ => {}
                }
                armed
                    .record(q)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                kept.push(q);
            }
        }
        if matches!(spec.fault, Some((_, DiscoveryFault::ArmTwice))) {
            let e = d.arm(id).unwrap_err();
            prop_assert_eq!(e, DiscoveryError::RunnerArmedTwice { runner: id });
        }
        prop_assert_eq!(d.requests(id), Some(kept.as_slice()));
        prop_assert_eq!(d.runner_name(id), spec.named.then_some(name.as_str()));
        recorded.push(kept);
    }
    Ok(recorded)
}

fn run_round(
    rig: &Rig,
    index: usize,
    round: &Round,
    mut discovery: Discovering,
) -> Result<Option<Discovering>, TestCaseError> {
    let requests = discover(&mut discovery, round)?;
    let policy = Policy::Generations(round.generations);
    let strategy: PlacedPolicy = if round.packed {
        policy.packed()
    } else {
        policy.into()
    };
    let planned = match discovery.plan(strategy) {
        Ok(p) => p,
        Err(e) => {
            prop_assert_eq!(round.generations, 0);
            prop_assert_eq!(e.error(), &PlanError::ZeroGenerations { policy });
            if round.forget_failures {
                // It holds host data only: forgetting it leaks that.
                std::mem::forget(e);
                return Ok(None);
            }
            // The discovery comes back: plan it again, no second backward.
            let again = Policy::Generations(1);
            let again = if round.packed {
                again.packed()
            } else {
                again.into()
            };
            e.into_discovering().plan(again).unwrap()
        }
    };
    let report = planned.report();
    for (r, spec) in round.runners.iter().enumerate() {
        let named = report.runners[r].name.is_some();
        prop_assert_eq!(named, spec.named);
    }
    let n = round.runners.len();
    let claims: Vec<Vec<Claim>> = (0..n)
        .map(|r| {
            let id = RunnerId(r as u32);
            match planned.placed_policy().placement {
                Placement::RoundRobin => planned
                    .generation_of(id)
                    .map(|g| Claim {
                        region: g,
                        lo: 0,
                        hi: 1,
                    })
                    .into_iter()
                    .collect(),
                Placement::Packed => planned
                    .extents_of(id)
                    .unwrap_or(&[])
                    .iter()
                    .map(|s| Claim {
                        region: s.arena,
                        lo: s.offset,
                        hi: s.offset + s.bytes,
                    })
                    .collect(),
            }
        })
        .collect();
    let arenas = planned.arenas().len();

    // Allocation, with failures injected.
    let live_before = rig.sim.live_allocations();
    rig.sim
        .fail_allocations_after(round.allocations_before_failure);
    let allocated = planned.allocate(rig.sim.clone());
    rig.sim.fail_allocations_after(None);
    let mut capturing = match allocated {
        Ok(c) => {
            prop_assert!(round.allocations_before_failure.is_none_or(|k| k >= arenas));
            c
        }
        Err(e) => {
            prop_assert!(round.allocations_before_failure.is_some_and(|k| k < arenas));
            prop_assert!(
                matches!(&e.error().error, BackendError::Allocation { .. }),
                "{:?}",
                e
            );
            prop_assert_eq!(rig.sim.live_allocations(), live_before);
            prop_assert_eq!(rig.sim.live_events(), rig.leaked_events.get());
            if round.forget_failures {
                // What it allocated was freed before it was returned.
                std::mem::forget(e);
                prop_assert_eq!(rig.sim.live_allocations(), live_before);
                return Ok(None);
            }
            // The plan comes back: allocate it again, no second planning.
            e.into_planned().allocate(rig.sim.clone()).unwrap()
        }
    };
    prop_assert_eq!(rig.sim.live_allocations(), live_before + arenas);

    // Per-runner counters: each replay adds one and copies the counter into
    // every view of the runner.
    let longest = requests
        .iter()
        .flatten()
        .map(|q| q.elements as usize)
        .max()
        .unwrap_or(1);
    let mut live = Live {
        rig,
        round,
        index,
        ones: (0..n)
            .map(|_| rig.sim.alloc_f32(longest).unwrap())
            .collect(),
        counters: (0..n)
            .map(|_| rig.sim.alloc_f32(longest).unwrap())
            .collect(),
        other_plan: other_plan(&rig.sim, &rig.stream(0)),
        requests,
        ownership: Ownership {
            claims,
            paints: Vec::new(),
            latest: vec![None; n],
        },
        replays: vec![0; n],
        outputs: Vec::new(),
    };
    for r in 0..n {
        rig.sim
            .write_f32(&live.ones[r], &vec![1.0; longest])
            .unwrap();
        rig.sim
            .write_f32(&live.counters[r], &vec![base(index, r); longest])
            .unwrap();
    }

    // Whether each runner's capture finished (it has a graph to replay).
    let mut captured = Vec::with_capacity(n);
    let mut unfinished: Vec<(RunnerId, Option<FailureKind>)> = Vec::new();
    for r in 0..n {
        let outcome = capture(&live, &mut capturing, r)?;
        captured.push(outcome.is_none());
        if let Some(kind) = outcome {
            if !live.requests[r].is_empty() {
                unfinished.push((RunnerId(r as u32), kind));
            }
        }
    }
    let unknown = capturing.capture(RunnerId(77)).map(drop);
    prop_assert_eq!(
        unknown,
        Err(CaptureError::UnknownRunner {
            runner: RunnerId(77)
        })
    );

    let mut replayable = match capturing.seal() {
        Ok(rep) => {
            prop_assert!(
                unfinished.is_empty(),
                "sealed with {:?} unfinished",
                unfinished
            );
            rep
        }
        Err(e) => {
            match e.error() {
                CaptureError::Unfinished { runners } => {
                    let got: Vec<(RunnerId, Option<FailureKind>)> = runners
                        .iter()
                        .map(|(r, f)| (*r, f.as_ref().map(kind_of)))
                        .collect();
                    prop_assert_eq!(got, unfinished);
                }
                other => prop_assert!(false, "seal failed with {:?}", other),
            }
            if round.forget_failures {
                // Its arenas and events leak; nothing of it ever ran.
                std::mem::forget(e);
                drop(live);
                prop_assert_eq!(rig.sim.live_allocations(), live_before + arenas);
                rig.leaked_events.set(rig.sim.live_events());
                return Ok(None);
            }
            let next = e.into_capturing().replan();
            drop(live);
            prop_assert_eq!(rig.sim.live_allocations(), live_before);
            prop_assert_eq!(rig.sim.live_events(), rig.leaked_events.get());
            return Ok(Some(next));
        }
    };

    for &s in &round.steps {
        match s {
            Step::Replay { runner, stream } => {
                let id = RunnerId(runner as u32);
                let result = replayable.replay(id, &rig.stream(stream));
                if captured[runner] {
                    prop_assert!(result.is_ok(), "{:?}", result);
                    if !live.requests[runner].is_empty() {
                        live.replays[runner] += 1;
                    }
                    live.ownership.replayed(runner);
                } else {
                    prop_assert_eq!(result, Err(ReplayError::NoGraph { runner: id }));
                }
            }
            Step::ReplayUnknown => {
                let result = replayable.replay(RunnerId(999), &rig.stream(0));
                prop_assert_eq!(
                    result,
                    Err(ReplayError::UnknownRunner {
                        runner: RunnerId(999)
                    })
                );
            }
            Step::Consume {
                runner,
                stream,
                duration,
                mode,
            } => consume(&mut live, &mut replayable, (runner, stream, duration, mode))?,
            Step::Synchronize => {
                replayable.synchronize().unwrap();
                check(&mut live, &replayable)?;
            }
            Step::NewStream { stream } => {
                let fresh = rig.sim.new_stream();
                rig.streams.borrow_mut()[stream] = fresh;
            }
            Step::LaunchStepGraph {
                launches,
                stream,
                forget,
            } => {
                let order: Vec<usize> = (0..n).filter(|&r| captured[r]).collect();
                let mut step = replayable.step();
                for &r in &order {
                    step.replay(RunnerId(r as u32), &rig.stream(r % STREAMS))
                        .unwrap();
                }
                match step.build() {
                    Err(e) => {
                        prop_assert!(order.is_empty() && matches!(e, StepError::Empty), "{:?}", e)
                    }
                    Ok(mut graph) => {
                        prop_assert!(!order.is_empty());
                        for _ in 0..launches {
                            graph.launch(&rig.stream(stream)).unwrap();
                            for &r in &order {
                                if !live.requests[r].is_empty() {
                                    live.replays[r] += 1;
                                }
                                live.ownership.replayed(r);
                            }
                        }
                        if forget {
                            // It leaks its graph and completion event; the
                            // fence already orders everything after it.
                            std::mem::forget(graph);
                            rig.leaked_events.set(rig.leaked_events.get() + 1);
                        }
                    }
                }
            }
            Step::ReplayRefused { runner } => {
                let id = RunnerId(runner as u32);
                let result = replayable.replay(id, &rig.foreign);
                if captured[runner] {
                    let refused = matches!(result, Err(ReplayError::Backend(replay_arena::BackendFailure { runner: Some(r), .. })) if r == id);
                    prop_assert!(refused, "{:?}", result);
                } else {
                    prop_assert_eq!(result, Err(ReplayError::NoGraph { runner: id }));
                }
            }
        }
        prop_assert_eq!(rig.sim.hazards(), vec![]);
    }
    replayable.synchronize().unwrap();
    check(&mut live, &replayable)?;

    let next = match round.end {
        End::Replan => Some(replayable.replan().unwrap()),
        End::Drop => {
            drop(replayable);
            None
        }
        End::Forget => {
            // Leaked with replays in flight: the arenas stay allocated
            // under them, and the next round's plan gets other memory.
            for r in (0..n).filter(|&r| captured[r]) {
                replayable
                    .replay(RunnerId(r as u32), &rig.stream(r % STREAMS))
                    .unwrap();
            }
            std::mem::forget(replayable);
            drop(live);
            prop_assert_eq!(rig.sim.live_allocations(), live_before + arenas);
            rig.leaked_events.set(rig.sim.live_events());
            return Ok(None);
        }
    };
    drop(live);
    prop_assert_eq!(rig.sim.live_allocations(), live_before);
    prop_assert_eq!(rig.sim.live_events(), rig.leaked_events.get());
    Ok(next)
}

/// Why a capture failed, without the details.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FailureKind {
    TakenMismatch,
    NoGraph,
    Work,
    Panicked,
    Dropped,
}

fn kind_of(f: &CaptureFailure) -> FailureKind {
    match f {
        CaptureFailure::Check(e) => match **e {
            CaptureError::TakenMismatch { .. } => FailureKind::TakenMismatch,
            CaptureError::NoGraphCaptured { .. } => FailureKind::NoGraph,
            _ => FailureKind::Work,
        },
        CaptureFailure::Work(_) => FailureKind::Work,
        CaptureFailure::Panicked => FailureKind::Panicked,
        CaptureFailure::Dropped => FailureKind::Dropped,
        _ => FailureKind::Work,
    }
}

/// Captures runner `r` as its mode says. `Ok(None)` when it finished;
/// `Ok(Some(kind))` with what `seal` must then report (`None` inside for a
/// runner never captured).
fn capture(
    live: &Live<'_>,
    capturing: &mut Capturing<sim::Device>,
    r: usize,
) -> Result<Option<Option<FailureKind>>, TestCaseError> {
    let id = RunnerId(r as u32);
    let sim = &live.rig.sim;
    let stream = &live.rig.stream(r % STREAMS);
    let other = &live.rig.stream((r + 1) % STREAMS);
    let requests = live.requests[r].as_slice();
    let (one, counter) = (&live.ones[r], &live.counters[r]);
    let duration = live.round.durations[r];
    let mut mode = live.round.captures[r];
    if requests.is_empty() && matches!(mode, CaptureMode::TooFew | CaptureMode::MismatchThenRight) {
        mode = CaptureMode::Right;
    }
    if mode == CaptureMode::Skipped {
        return Ok(Some(None));
    }
    let cap = capturing
        .capture(id)
        .map_err(|e| TestCaseError::fail(format!("opening {id}: {e}")))?;
    if mode == CaptureMode::MismatchThenRight {
        let q = requests[0];
        let wrong = Request::new(q.domain, q.dtype, q.elements + 1);
        let e = cap.take(wrong).unwrap_err();
        prop_assert!(
            matches!(e, CaptureError::RequestMismatch { runner, index: 0, expected, .. } if runner == id && expected == q),
            "{:?}",
            e
        );
    }
    let take = if mode == CaptureMode::TooFew {
        requests.len() - 1
    } else {
        requests.len()
    };
    let views: Vec<_> = requests[..take]
        .iter()
        .map(|&q| cap.take(q).unwrap())
        .collect();
    if mode == CaptureMode::ExtraThenRight {
        let extra = Request::new(Domain::Device, DType::F32, 4);
        let e = cap.take(extra).unwrap_err();
        prop_assert!(
            matches!(e, CaptureError::CapacityExceeded { runner, index, .. } if runner == id && index == requests.len()),
            "{:?}",
            e
        );
    }
    let graph = |s: &sim::Stream| runner_graph(sim, s, one, counter, &views, duration);
    match mode {
        CaptureMode::Dropped => {
            drop(views);
            drop(cap);
            return Ok(Some(Some(FailureKind::Dropped)));
        }
        CaptureMode::NoGraph => {
            drop(views);
            let e = cap.finish().unwrap_err();
            prop_assert_eq!(e, CaptureError::NoGraphCaptured { runner: id });
            return Ok(Some(Some(FailureKind::NoGraph)));
        }
        CaptureMode::WorkFails => {
            let e = cap
                .stream_capture(stream, |s| {
                    graph(s)?;
                    Err("the work failed".to_string())
                })
                .unwrap_err();
            prop_assert!(matches!(e, StreamCaptureError::Work(ref w) if w == "the work failed"));
            drop(views);
            let finished = cap.finish();
            let failed = matches!(&finished, Err(CaptureError::Failed { runner, failure: CaptureFailure::Work(_) }) if *runner == id);
            prop_assert!(failed, "{:?}", finished);
            return Ok(Some(Some(FailureKind::Work)));
        }
        CaptureMode::Panics => {
            let caught = catch_unwind(AssertUnwindSafe(|| {
                cap.stream_capture(stream, |s| -> Result<(), String> {
                    graph(s)?;
                    deliberate()
                })
            }));
            match caught {
                Err(payload) => {
                    prop_assert!(is_deliberate(payload.as_ref()), "a panic escaped the crate")
                }
                Ok(result) => prop_assert!(
                    false,
                    "the closure's panic was swallowed: {:?}",
                    result.err()
                ),
            }
            drop(views);
            let finished = cap.finish();
            let failed = matches!(&finished, Err(CaptureError::Failed { runner, failure: CaptureFailure::Panicked }) if *runner == id);
            prop_assert!(failed, "{:?}", finished);
            return Ok(Some(Some(FailureKind::Panicked)));
        }
        _ => {}
    }
    let mut nested = None;
    cap.stream_capture(stream, |s| {
        if mode == CaptureMode::Nested {
            nested = Some(cap.stream_capture(other, |o| graph(o)));
        }
        graph(s)
    })
    .map_err(|e| TestCaseError::fail(format!("capturing {id}: {e}")))?;
    if let Some(nested) = nested {
        prop_assert!(
            matches!(nested, Err(StreamCaptureError::Capture(CaptureError::NestedCapture { runner })) if runner == id),
            "{:?}",
            nested
        );
    }
    drop(views);
    if mode == CaptureMode::Forgotten {
        // No safety rests on its destructor: the runner stays uncaptured,
        // its graph leaks and can never be launched, and it can be
        // captured again.
        std::mem::forget(cap);
        let again = capturing
            .capture(id)
            .map_err(|e| TestCaseError::fail(format!("capturing {id} again: {e}")))?;
        let views: Vec<_> = requests.iter().map(|&q| again.take(q).unwrap()).collect();
        again
            .stream_capture(stream, |s| {
                runner_graph(sim, s, one, counter, &views, duration)
            })
            .map_err(|e| TestCaseError::fail(format!("capturing {id} again: {e}")))?;
        drop(views);
        again
            .finish()
            .map_err(|e| TestCaseError::fail(format!("finishing {id} again: {e}")))?;
        return Ok(None);
    }
    if mode == CaptureMode::TooFew {
        let e = cap.finish().unwrap_err();
        prop_assert!(
            matches!(e, CaptureError::TakenMismatch { runner, .. } if runner == id),
            "{:?}",
            e
        );
        return Ok(Some(Some(FailureKind::TakenMismatch)));
    }
    cap.finish()
        .map_err(|e| TestCaseError::fail(format!("finishing {id}: {e}")))?;
    if mode == CaptureMode::Twice {
        let e = capturing.capture(id).map(drop).unwrap_err();
        prop_assert_eq!(
            e,
            CaptureError::AlreadyCaptured {
                runner: id,
                failure: None
            }
        );
    }
    Ok(None)
}

/// A runner's graph: add one to its counter, copy the counter into each
/// of its views. A runner without buffers is never fenced: its graph
/// touches nothing.
fn runner_graph<A: replay_arena::Access>(
    sim: &sim::Device,
    s: &sim::Stream,
    one: &sim::HostBuffer,
    counter: &sim::HostBuffer,
    views: &[replay_arena::View<'_, A>],
    duration: u64,
) -> Result<(), String> {
    if views.is_empty() {
        return Ok(());
    }
    sim.launch(s, sim::Kernel::add(one, counter), duration)
        .map_err(|e| e.to_string())?;
    for v in views {
        sim.launch(s, sim::Kernel::copy(counter, v), duration)
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// One round from allocation on: the rig, the workload as recorded, and
/// the model.
struct Live<'a> {
    rig: &'a Rig,
    round: &'a Round,
    index: usize,
    requests: Vec<Vec<Request>>,
    /// Per runner, a buffer of ones and the counter its graph adds them to
    /// before copying it into each of its views.
    ones: Vec<sim::HostBuffer>,
    counters: Vec<sim::HostBuffer>,
    /// A second plan alive beside this one: one runner filling its view.
    other_plan: Replayable<sim::Device>,
    ownership: Ownership,
    /// Replays per runner with buffers.
    replays: Vec<u32>,
    /// Consumer outputs to check at the next synchronize, with their value.
    outputs: Vec<(sim::HostBuffer, f32)>,
}

impl Live<'_> {
    /// What runner `r`'s views hold after its latest replay.
    fn latest(&self, r: usize) -> f32 {
        base(self.index, r) + self.replays[r] as f32
    }
}

/// Runs a consumer of `runner` and checks its outcome against the model.
fn consume(
    live: &mut Live<'_>,
    replayable: &mut Replayable<sim::Device>,
    step: (usize, usize, u64, ConsumerMode),
) -> Check {
    let (runner, stream, duration, mode) = step;
    let id = RunnerId(runner as u32);
    let rig = live.rig;
    let value = live.latest(runner);
    let sim = rig.sim.clone();
    let mut copies: Vec<sim::HostBuffer> = Vec::new();
    let elsewhere = rig.stream((stream + 1) % STREAMS);
    let other_plan = &mut live.other_plan;
    let mut trespassed = Ok(());
    let mut work = |s: &sim::Stream, views: &[replay_arena::View<'_, _>]| -> Result<(), String> {
        if matches!(mode, ConsumerMode::Trespasses) {
            trespassed = trespass(&sim, other_plan, s, &elsewhere, views);
        }
        for v in views {
            let out = sim.alloc_f32(v.len()).map_err(|e| e.to_string())?;
            sim.launch(s, sim::Kernel::copy(v, &out), duration)
                .map_err(|e| e.to_string())?;
            copies.push(out);
        }
        match mode {
            ConsumerMode::Copies | ConsumerMode::Trespasses => Ok(()),
            ConsumerMode::Fails => Err("the consumer failed".into()),
            ConsumerMode::PanicsAfterCopying => deliberate(),
        }
    };
    let caught = catch_unwind(AssertUnwindSafe(|| {
        replayable.consume(id, &rig.stream(stream), &mut work)
    }));
    let fenced = !live.requests[runner].is_empty();
    let overwriters = live.ownership.overwriters(runner);
    let never_replayed = live.ownership.latest[runner].is_none();
    // What the fence must refuse, for a runner with buffers: consumers of a
    // runner never replayed (`NotReplayed`, whatever other runners did), and
    // of one whose bytes another runner claimed since its latest replay
    // (`Overwritten`).
    let refused = fenced && (never_replayed || !overwriters.is_empty());
    match caught {
        Err(payload) => {
            prop_assert!(is_deliberate(payload.as_ref()), "a panic escaped the crate");
            prop_assert!(!refused && matches!(mode, ConsumerMode::PanicsAfterCopying));
        }
        Ok(Err(ConsumeError::Work(w))) => {
            prop_assert!(!refused);
            prop_assert!(matches!(mode, ConsumerMode::Fails), "{}", w);
        }
        Ok(Err(e)) => {
            prop_assert!(refused, "{} refused: {:?}", id, e);
            match e {
                ConsumeError::NotReplayed { runner: r } => {
                    prop_assert_eq!(r, id);
                    prop_assert!(never_replayed);
                }
                ConsumeError::Overwritten { runner: r, by } => {
                    prop_assert_eq!(r, id);
                    prop_assert!(!never_replayed, "{} was never replayed", id);
                    prop_assert!(
                        overwriters.contains(&(by.0 as usize)),
                        "{} overwritten by {} but the model has {:?}",
                        id,
                        by,
                        overwriters
                    );
                }
                other => prop_assert!(false, "unexpected {:?}", other),
            }
            prop_assert!(copies.is_empty(), "a refused consumer ran");
        }
        Ok(Ok(())) => {
            prop_assert!(!refused, "{} consumed, but the model refuses", id);
            prop_assert!(matches!(
                mode,
                ConsumerMode::Copies | ConsumerMode::Trespasses
            ));
        }
    }
    trespassed.map_err(TestCaseError::fail)?;
    // Whatever the consumer enqueued, even when it failed or panicked, is
    // fenced and reads the runner's latest replay.
    live.outputs.extend(copies.into_iter().map(|b| (b, value)));
    Ok(())
}

/// A second plan of one runner whose graph fills its 64 f32s with 7,
/// replayed once.
fn other_plan(sim: &sim::Device, stream: &sim::Stream) -> Replayable<sim::Device> {
    let q = Request::new(Domain::Device, DType::F32, 64);
    let mut capturing = allocate_runners(sim, [(RunnerId(0), [q])], Policy::Generations(1));
    capture_view(&mut capturing, RunnerId(0), q, stream, |s, view| {
        sim.launch(s, sim::Kernel::fill(&view, 7.0), 3)
    });
    let mut replayable = capturing.seal().unwrap();
    replayable.replay(RunnerId(0), stream).unwrap();
    replayable
}

/// Inside a consumer on `s` with `views`: the other plan's views, these
/// views on `elsewhere`, and these views inside the other plan's consumer
/// must all be refused.
fn trespass<A: replay_arena::Access>(
    sim: &sim::Device,
    other_plan: &mut Replayable<sim::Device>,
    s: &sim::Stream,
    elsewhere: &sim::Stream,
    views: &[replay_arena::View<'_, A>],
) -> Result<(), String> {
    let scratch = sim.alloc_f32(64).map_err(|e| e.to_string())?;
    let refused = |what: &str, r: Result<(), BackendError>| match r {
        Err(BackendError::InvalidView {
            reason:
                replay_arena::Misuse::OutsideClosure { .. }
                | replay_arena::Misuse::OtherStream { .. }
                | replay_arena::Misuse::NoScope { .. },
        }) => Ok(()),
        other => Err(format!("{what} was not refused: {other:?}")),
    };
    let theirs = other_plan.views(RunnerId(0)).map_err(|e| e.to_string())?[0];
    refused(
        "the other plan's view",
        sim.launch(s, sim::Kernel::copy(&theirs, &scratch), 1),
    )?;
    if let Some(v) = views.first() {
        refused(
            "a view on another stream",
            sim.launch(elsewhere, sim::Kernel::fill(v, 0.0), 1),
        )?;
        let inner = other_plan.consume(RunnerId(0), elsewhere, |o, _| {
            refused(
                "a view inside another plan's consumer",
                sim.launch(o, sim::Kernel::fill(v, 0.0), 1),
            )
        });
        inner.map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// After a synchronize: every consumer copy holds the value the model
/// predicted when it ran, and every runner that still owns its bytes holds
/// its latest value.
fn check(live: &mut Live<'_>, replayable: &Replayable<sim::Device>) -> Check {
    let sim = &live.rig.sim;
    for (buffer, value) in live.outputs.drain(..) {
        let got = unless_all(sim, &buffer, value);
        prop_assert!(got.is_none(), "consumer read {:?}, expected {}", got, value);
    }
    for (r, requests) in live.requests.iter().enumerate() {
        let owns = live.ownership.latest[r].is_some() && live.ownership.overwriters(r).is_empty();
        if requests.is_empty() || !owns {
            continue;
        }
        let value = live.latest(r);
        for v in replayable.views(RunnerId(r as u32)).unwrap() {
            let got = unless_all(sim, v, value);
            prop_assert!(
                got.is_none(),
                "runner {} holds {:?}, expected {}",
                r,
                got,
                value
            );
        }
    }
    Ok(())
}

/// Unless `span` holds `value` everywhere: its first four values.
fn unless_all(sim: &sim::Device, span: &impl sim::AsSpan, value: f32) -> Option<Vec<f32>> {
    let got = sim.read_f32(span).unwrap();
    (!got.iter().all(|&x| x == value)).then(|| got[..got.len().min(4)].to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        max_shrink_iters: 2_000,
        ..ProptestConfig::default()
    })]

    /// Random lifecycles keep every invariant of the module docs.
    #[test]
    fn random_lifecycles_match_the_model(rounds in prop::collection::vec(round(), 1..=3)) {
        run_case(&rounds)?;
    }
}
