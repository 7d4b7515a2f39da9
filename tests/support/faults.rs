//! The fixtures of the attack tests (`suite/regression/`), on the `sim`
//! model: small plans, the sweep that puts a fault at each backend call
//! of an operation ([`at_each_call`]), and the checks that a device is
//! left clean. Two larger plan shapes have modules of their own: a chain
//! of runners handing off, captured with cut step copies ([`chain`]), and
//! a writer of several handoffs split at its ready points ([`fan`]).

pub mod chain;
pub mod fan;

use super::seal_each;
use super::steps::allocate_discovered;

use std::cell::Cell;
use std::fmt;

use replay_arena::backend::Backend;
use replay_arena::backend::GraphMemory;
use replay_arena::sim::{self, FaultLog, Faults};
use replay_arena::{
    ConsumeError, DType, Discovering, Domain, HandoffId, PlanConfig, Policy, Replayable, Request,
    RunnerId, StepBuilder, StepError, StepGraph, Trace,
};

/// What a captured closure returns.
pub type R = replay_arena::Result<()>;

pub const N: usize = 64;

pub const Q: Request = Request::new(Domain::Device, DType::F32, N as u64);

/// `runners` runners with one `request` each.
pub fn one_each(runners: u32, request: Request) -> Discovering {
    Discovering::from_runners(PlanConfig::new(), (0..runners).map(|i| (r(i), [request]))).unwrap()
}

/// Runner 0 records `own` and hands off `k` requests `grad`: the writer of
/// a fan.
pub fn writer_of(d: &mut Discovering, k: usize, own: Request, grad: Request) -> Vec<HandoffId> {
    let mut a = d.arm(r(0)).unwrap();
    a.record(own).unwrap();
    (0..k).map(|_| a.hand_off(grad).unwrap()).collect()
}

/// `layers` runners, each recording `own`, runner `l` handing `grad` off
/// to runner `l + 1`: a chain.
pub fn chain_of(layers: usize, own: Request, grad: Request) -> (Discovering, Vec<HandoffId>) {
    let mut d = Discovering::new(PlanConfig::new());
    let mut handoffs: Vec<HandoffId> = Vec::new();
    for l in 0..layers {
        let mut armed = d.arm(r(l as u32)).unwrap();
        armed.record(own).unwrap();
        if let Some(&h) = handoffs.last() {
            armed.receive(h).unwrap();
        }
        if l + 1 < layers {
            handoffs.push(armed.hand_off(grad).unwrap());
        }
    }
    (d, handoffs)
}

pub fn r(i: u32) -> RunnerId {
    RunnerId(i)
}

/// `runners` runners with one `Q` each under `Policy::Generations(g)`;
/// runner `i`'s graph fills its view with `i + 1` for 20 ticks.
pub fn fill_plan(sim: &sim::Device, runners: u32, g: usize) -> Replayable<sim::Device> {
    let capturing = allocate_discovered(sim, one_each(runners, Q), Policy::Generations(g));
    seal_each(capturing, runners, Q, &sim.new_stream(), |i, s, view| {
        sim.launch(s, sim::Kernel::fill(view, (i + 1) as f32), 20)
    })
}

/// A consumer that copies `runner`'s view into `sink` (30 ticks).
pub fn copy_out(
    rp: &mut Replayable<sim::Device>,
    sim: &sim::Device,
    runner: RunnerId,
    s: &sim::Stream,
    sink: &sim::HostBuffer,
) -> Result<(), ConsumeError<replay_arena::BackendError>> {
    rp.consume(runner, s, |s, v| {
        sim.launch(s, sim::Kernel::copy(&v[0], sink), 30)
    })
}

pub fn read0(sim: &sim::Device, b: &impl sim::AsSpan) -> f32 {
    sim.read_f32(b).unwrap()[0]
}

/// What each of `buffers` holds, then what each of `views` holds.
pub fn read_back<'b, 'v>(
    sim: &sim::Device,
    buffers: impl IntoIterator<Item = &'b sim::HostBuffer>,
    views: impl IntoIterator<Item = replay_arena::View<'v>>,
) -> Vec<Vec<f32>> {
    let buffers = buffers.into_iter().map(|b| sim.read_f32(b).unwrap());
    let views = views.into_iter().map(|v| sim.read_f32(&v).unwrap());
    buffers.chain(views).collect()
}

pub fn graph_memory(sim: &sim::Device) -> GraphMemory {
    sim.graph_memory_in_use().unwrap().unwrap()
}

/// How many backend calls `f` makes with no fault.
pub fn calls_of(sim: &sim::Device, f: impl FnOnce()) -> u64 {
    sim.inject(Faults::none());
    f();
    sim.fault_log().calls
}

/// A step of two runners sharing bytes (G = 1), each replayed on `a` and
/// consumed on `b` into `sink` (adds): 3 per launch.
pub fn two_step<'r>(
    rp: &'r mut Replayable<sim::Device>,
    sim: &sim::Device,
    a: &sim::Stream,
    b: &sim::Stream,
    sink: &sim::HostBuffer,
) -> replay_arena::StepBuilder<'r, sim::Device> {
    let mut step = rp.step();
    for i in 0..2 {
        step.replay(r(i), a).unwrap();
        step.consume(r(i), b, |s, v| {
            sim.launch(s, sim::Kernel::add(&v[0], sink), 10)
        })
        .unwrap();
    }
    step
}

/// `step.build_overlapping()` when `overlapping`, else `step.build()`.
pub fn build<'r>(
    step: StepBuilder<'r, sim::Device>,
    overlapping: bool,
) -> Result<StepGraph<'r, sim::Device>, StepError> {
    if overlapping {
        step.build_overlapping()
    } else {
        step.build()
    }
}

/// Every node of a traced step graph sits inside its launch.
pub fn assert_nodes_inside_launches(t: &Trace) {
    for node in t.step_nodes() {
        let p = &t.uses()[node.parent.expect("node without parent")];
        assert!(node.start_us >= p.start_us && node.end_us <= p.end_us);
    }
}

/// The error a test's closure fails with on purpose: a typed refusal that
/// names `reason`.
pub fn refused(reason: &str) -> replay_arena::Error {
    replay_arena::Error::Backend(replay_arena::BackendError::Refused {
        call: "test",
        reason: reason.into(),
    })
}

/// No hazard on `sim`.
#[track_caller]
pub fn assert_hazard_free(sim: &sim::Device) {
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
}

/// `capturing` sealed: the plan, or the one whose seal failed back (the
/// failure noted in `errors`).
pub fn seal_or_note(
    capturing: replay_arena::Capturing<sim::Device>,
    errors: &mut Vec<String>,
) -> (
    Option<Replayable<sim::Device>>,
    Option<replay_arena::Capturing<sim::Device>>,
) {
    match capturing.seal() {
        Ok(r) => (Some(r), None),
        Err(e) => {
            errors.push(format!("seal: {e}"));
            (None, Some(e.into_capturing()))
        }
    }
}

/// Drops a fixture's plan: the sealed one, or the one whose seal failed,
/// given up the documented way (`replan`).
pub fn drop_plan(
    sealed: Option<Replayable<sim::Device>>,
    failed: Option<replay_arena::Capturing<sim::Device>>,
) {
    drop(sealed);
    if let Some(c) = failed {
        drop(c.replan());
    }
}

/// Every graph gone and the pool trimmed: no graph memory used or
/// reserved.
pub fn assert_no_graph_memory(sim: &sim::Device, what: impl fmt::Display) {
    let p = graph_memory(sim);
    assert_eq!(
        (p.used, p.reserved),
        (0, 0),
        "{what}: graph memory left: {p:?}"
    );
}

/// After teardown: no hazard, no event, and only the program's own
/// `allocations` (sinks, inputs) live.
pub fn assert_clean(sim: &sim::Device, allocations: usize, what: impl fmt::Display) {
    assert_eq!(sim.hazards(), [], "{what}");
    assert_eq!(sim.live_events(), 0, "{what}: events leaked");
    assert_eq!(sim.live_allocations(), allocations, "{what}: allocations");
}

/// Runs `f` with `faults` injected into `sim`, and takes them out after.
pub fn under<T>(sim: &sim::Device, faults: Faults, f: impl FnOnce() -> T) -> T {
    sim.inject(faults);
    let out = f();
    sim.inject(Faults::none());
    out
}

/// One run of an [`at_each_call`] sweep: no fault (the run that counts
/// the calls), or a fault at one call of the operation under attack.
pub struct Attack {
    fault: Option<u64>,
    calls: Cell<Option<u64>>,
    log: Cell<Option<FaultLog>>,
}

impl Attack {
    fn new(fault: Option<u64>) -> Attack {
        Attack {
            fault,
            calls: Cell::new(None),
            log: Cell::new(None),
        }
    }

    /// Runs the operation under attack, `f`, with this run's fault
    /// injected into `sim` (none on the counting run), and the faults
    /// taken out again after it.
    pub fn on<T>(&self, sim: &sim::Device, f: impl FnOnce() -> T) -> T {
        under(
            sim,
            self.fault.map_or_else(Faults::none, Faults::at),
            || {
                let out = f();
                let log = sim.fault_log();
                self.calls.set(Some(log.calls));
                self.log.set(Some(log));
                out
            },
        )
    }

    /// [`Attack::on`] for an operation that must succeed when no fault is
    /// injected (the counting run).
    pub fn on_ok<T, E: fmt::Debug>(
        &self,
        sim: &sim::Device,
        f: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        let out = self.on(sim, f);
        if let (None, Err(e)) = (self.fault, &out) {
            panic!("failed with no fault injected: {e:?}");
        }
        out
    }

    /// The call that fails in this run; `None` on the counting run.
    pub fn fault(&self) -> Option<u64> {
        self.fault
    }

    /// What fault injection saw during [`Attack::on`].
    pub fn log(&self) -> FaultLog {
        let log = self.log.take().expect("Attack::on ran");
        self.log.set(Some(log.clone()));
        log
    }
}

impl fmt::Display for Attack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.fault {
            Some(k) => write!(f, "fault at {k}"),
            None => write!(f, "no fault"),
        }
    }
}

/// The sweep of `docs/safety.md`'s transaction rule: `run` builds its
/// program on a fresh device and makes the calls under attack inside
/// [`Attack::on`]. It runs once with no fault, to count those calls, and
/// then once with a fault at each of them; every run checks what the
/// test guards. Returns how many calls were attacked.
pub fn at_each_call(mut run: impl FnMut(&Attack)) -> u64 {
    let count = Attack::new(None);
    run(&count);
    let n = count.calls.get().expect("the run calls Attack::on");
    for k in 0..n {
        run(&Attack::new(Some(k)));
    }
    n
}
