//! Phase 3: [`Capturing`]. Arenas exist; each runner's capture hands out
//! fixed-address views in the order discovery recorded them, captures its
//! graph, and must take exactly what discovery recorded.

use std::cell::{Cell, RefCell};
use std::fmt;

use crate::backend::{Arena, ArenaDesc, Backend, BackendError, Cut, GraphRejection, Temporaries};
use crate::discover::Discovering;
use crate::failed::Failed;
use crate::failure::{BackendFailure, Operation};
use crate::plan::{Planned, RunnerPlan};
use crate::scope::{close_scope, new_scope_id, retire};
use crate::view::{Access, Misuse, NotSend, ReadOnly, View};
use crate::vocab::{HandoffId, Key, Request, RunnerId};

/// A failed check while capturing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CaptureError {
    /// A capture was opened for a runner the plan does not know.
    #[error("{runner} was not discovered, so the plan has no storage for it")]
    UnknownRunner {
        /// The runner.
        runner: RunnerId,
    },
    /// A capture was opened for a runner whose capture already closed.
    #[error("{runner} was already captured ({}); re-plan to capture it again", describe(.failure.as_ref()))]
    AlreadyCaptured {
        /// The runner.
        runner: RunnerId,
        /// Why its capture failed, or `None` when it succeeded.
        failure: Option<CaptureFailure>,
    },
    /// A capture-time request would go past the runner's discovered capacity
    /// (discovery recorded fewer requests).
    #[error("{runner} requested {requested} bytes of {key} with {taken} of {capacity} bytes already taken (request #{index}: {request}); discovery recorded only {index} request(s)")]
    CapacityExceeded {
        /// The runner.
        runner: RunnerId,
        /// The key.
        key: Key,
        /// Position of the request in the runner's capture.
        index: usize,
        /// The request.
        request: Request,
        /// Aligned bytes requested.
        requested: u64,
        /// Bytes of this key taken before this request.
        taken: u64,
        /// The runner's capacity for this key (0 when discovery never saw it).
        capacity: u64,
    },
    /// A capture-time request differs from the one discovery recorded at the
    /// same position.
    #[error("{runner} request #{index} is {request} but discovery recorded {expected} ({}: requested {requested} bytes, taken {taken} of {capacity})", .request.key())]
    RequestMismatch {
        /// The runner.
        runner: RunnerId,
        /// Position of the request.
        index: usize,
        /// What capture asked for (its key is the one sizes refer to).
        request: Request,
        /// What discovery recorded at this position.
        expected: Request,
        /// Aligned bytes requested.
        requested: u64,
        /// Bytes of the requested key taken before this request.
        taken: u64,
        /// The runner's capacity for the requested key (0 when discovery
        /// never saw that key).
        capacity: u64,
    },
    /// Closing a capture found that the runner did not take exactly its
    /// discovered capacity.
    #[error("{runner} took {taken}/{capacity} bytes of {key}; a capture must take exactly what discovery recorded")]
    TakenMismatch {
        /// The runner.
        runner: RunnerId,
        /// The key.
        key: Key,
        /// Bytes taken during capture.
        taken: u64,
        /// Bytes discovered.
        capacity: u64,
    },
    /// `finish` was called on a capture that captured no graph.
    #[error("{runner} captured no graph: call stream_capture before finish")]
    NoGraphCaptured {
        /// The runner.
        runner: RunnerId,
    },
    /// `stream_capture` was called a second time on one capture.
    #[error("{runner} already captured its graph; one capture holds one graph")]
    GraphAlreadyCaptured {
        /// The runner.
        runner: RunnerId,
    },
    /// `stream_capture` was called from inside its own work closure.
    #[error("{runner}: stream_capture was called from inside its own work closure; one capture records one graph")]
    NestedCapture {
        /// The runner.
        runner: RunnerId,
    },
    /// `stream_capture` was called on a stream that an open consumer (or
    /// capture), of any thread, works on.
    #[error("{runner}: stream_capture on a stream that an open consumer or capture works on; capture on another stream")]
    StreamInUse {
        /// The runner.
        runner: RunnerId,
    },
    /// The work closure used a view where the fence cannot order it (another
    /// plan's or runner's view, another stream); the graph was discarded.
    #[error("capture of {runner} used a view out of its scope: {reason}")]
    ViewOutOfScope {
        /// The runner.
        runner: RunnerId,
        /// Which view, and where it was used.
        reason: Misuse,
    },
    /// A graph was rejected: it allocates memory it does not free (the
    /// allocation escapes the graph, and the next launch would fail), or
    /// frees memory it did not allocate. Temporaries allocated and freed
    /// inside the graph are accepted.
    #[error("the graph captured for {runner} was rejected: {reason}")]
    GraphRejected {
        /// The runner.
        runner: RunnerId,
        /// Why.
        reason: GraphRejection,
    },
    /// An earlier failure of this capture (the work closure failed or
    /// panicked, or the stream capture failed) makes it unusable.
    #[error("capture of {runner} failed earlier and was discarded: {failure}")]
    Failed {
        /// The runner.
        runner: RunnerId,
        /// The earlier failure.
        failure: CaptureFailure,
    },
    /// A capture asked for a handoff that discovery did not declare for
    /// this runner in that role.
    #[error("{runner} asked for {handoff} as its {role}, but discovery declared no such handoff for it (declare it with ArmedRunner::hand_off or ArmedRunner::receive)")]
    HandoffNotDeclared {
        /// The runner.
        runner: RunnerId,
        /// The handoff.
        handoff: HandoffId,
        /// "writer" or "reader".
        role: &'static str,
    },
    /// Closing a capture found a handoff the runner writes or reads that
    /// it never took.
    #[error("{runner} never took {handoff}, which discovery declared for it as its {role}; a capture takes exactly what discovery recorded")]
    HandoffNotTaken {
        /// The runner.
        runner: RunnerId,
        /// The handoff.
        handoff: HandoffId,
        /// "writer" or "reader".
        role: &'static str,
    },
    /// [`RunnerCapture::ready`] was called where it cannot mark a point of
    /// this runner's graph.
    #[error("{runner} cannot mark {handoff} ready: {reason}")]
    ReadyMisplaced {
        /// The runner.
        runner: RunnerId,
        /// The handoff.
        handoff: HandoffId,
        /// Why.
        reason: &'static str,
    },
    /// The second run of a [`RunnerCapture::stream_capture_repeatable`]
    /// closure (the step copy) did not do what the first did.
    #[error("{runner}'s work closure ran a second time for its step copy and {reason}; the work must repeat itself exactly")]
    RepeatDiffers {
        /// The runner.
        runner: RunnerId,
        /// What differed.
        reason: &'static str,
    },
    /// `seal` found buffer-using runners whose capture did not finish.
    #[error("cannot seal: {}", describe_unfinished(.runners))]
    Unfinished {
        /// Each buffer-using runner that did not finish: `None` when it was
        /// never captured, else why its capture failed.
        runners: Vec<(RunnerId, Option<CaptureFailure>)>,
    },
    /// A backend call of the capture failed: its operation is
    /// [`Operation::Capture`] of the runner.
    #[error(transparent)]
    Backend(#[from] BackendFailure),
}

/// Why a runner's capture failed, kept in the plan and shown by
/// [`CaptureError::AlreadyCaptured`] and [`SealError`](crate::SealError).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CaptureFailure {
    /// A check failed.
    #[error("{0}")]
    Check(Box<CaptureError>),
    /// The work closure returned an error (formatted here; the caller got
    /// the error itself).
    #[error("the work closure failed: {0}")]
    Work(String),
    /// The work closure panicked; the stream capture was ended during
    /// unwinding.
    #[error("the work closure panicked; the stream capture was ended")]
    Panicked,
    /// The capture was dropped before `finish`.
    #[error("the capture was dropped before finish")]
    Dropped,
}

fn describe_unfinished(runners: &[(RunnerId, Option<CaptureFailure>)]) -> String {
    runners
        .iter()
        .map(|(r, f)| match f {
            None => format!("{r} was never captured"),
            Some(f) => format!("{r} failed: {f}"),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn describe(failure: Option<&CaptureFailure>) -> String {
    match failure {
        None => "it finished".into(),
        Some(f) => format!("it failed: {f}"),
    }
}

/// What [`RunnerCapture::stream_capture`] returns on failure: the crate's
/// check, or the work closure's own error, unchanged.
#[derive(Debug, thiserror::Error)]
pub enum StreamCaptureError<E> {
    /// A check or backend call of this crate failed.
    #[error(transparent)]
    Capture(#[from] CaptureError),
    /// The work closure failed; the stream capture was ended and discarded.
    #[error("the work closure failed: {0}")]
    Work(E),
}

mod copies;
mod work;

pub(crate) use copies::StepCopy;
pub(crate) use work::{capture_work, Uncaptured};

type Result<T> = std::result::Result<T, CaptureError>;

/// A runner's finished capture.
pub(crate) struct Captured<G> {
    pub(crate) graph: G,
    /// Second graphs of the same work, for step graphs to move in (only
    /// for a graph with temporaries: [`RunnerCapture::stream_capture_repeatable`]).
    pub(crate) copies: Vec<StepCopy<G>>,
    /// What `graph`'s allocation nodes allocate.
    pub(crate) temporaries: Temporaries,
    /// The ready points of its step copies, and whether they are cut there.
    pub(crate) ready_points: Vec<(HandoffId, Cut)>,
}

/// Where a runner's capture stands.
pub(crate) enum Slot<G> {
    /// Not captured yet.
    Pending,
    /// Captured and checked; the plan owns the graph.
    Captured(Captured<G>),
    /// The capture failed for good.
    Failed(CaptureFailure),
}

/// What a plan owns on a backend besides graphs: per buffer-using runner
/// slot its completion event, and every arena. Field order is drop order.
pub(crate) struct Resources<B: Backend> {
    /// Runner slot -> its event (fenced runners only), then one event per
    /// handoff.
    pub(crate) events: Vec<Option<B::Event>>,
    pub(crate) arenas: Vec<B::Arena>,
    pub(crate) backend: Trimmed<B>,
}

/// The backend of a `Capturing`: when dropped (after the plan's graphs, a
/// `Capturing` dropped unsealed: a panicking closure, a failed seal passed
/// on with `?`), it gives the graphs' memory back to the device
/// ([`Backend::trim_graph_memory`], best effort: nothing rests on it but
/// memory). A sealed plan takes the backend out ([`Trimmed::into_inner`]);
/// its teardown trims by itself.
pub(crate) struct Trimmed<B: Backend> {
    backend: std::mem::ManuallyDrop<B>,
    trim: bool,
}

impl<B: Backend> Trimmed<B> {
    pub(crate) fn new(backend: B) -> Self {
        Trimmed {
            backend: std::mem::ManuallyDrop::new(backend),
            trim: false,
        }
    }

    /// The backend, not trimmed.
    pub(crate) fn into_inner(self) -> B {
        let mut this = std::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is never dropped, so its backend is taken once
        // and dropped by its new owner only.
        unsafe { std::mem::ManuallyDrop::take(&mut this.backend) }
    }
}

impl<B: Backend> std::ops::Deref for Trimmed<B> {
    type Target = B;

    fn deref(&self) -> &B {
        &self.backend
    }
}

impl<B: Backend> Drop for Trimmed<B> {
    fn drop(&mut self) {
        if self.trim {
            let _ = self.backend.trim_graph_memory();
        }
        // SAFETY: dropped once, here; `into_inner` skips this drop.
        unsafe { std::mem::ManuallyDrop::drop(&mut self.backend) }
    }
}

/// A failed [`Planned::allocate`]: the backend's failure (its operation
/// [`Operation::Allocate`]), and the plan back
/// (whatever was allocated is freed), to allocate again (after freeing
/// memory, or on another device) without planning again.
pub type AllocateFailed = Failed<BackendFailure, Planned>;

impl<E> Failed<E, Planned> {
    /// The plan, as it was, to allocate again.
    pub fn into_planned(self) -> Planned {
        self.into_input()
    }
}

impl Planned {
    /// Allocates every arena once, outside graph memory pools, and one
    /// completion event per buffer-using runner; nothing is captured yet.
    ///
    /// # Errors
    ///
    /// [`AllocateFailed`] with the backend's failure (its `error`
    /// [`BackendError::Allocation`] when an arena cannot be had) and the
    /// plan back ([`AllocateFailed::into_planned`]); whatever was allocated
    /// is freed.
    pub fn allocate<B: Backend>(
        self,
        backend: B,
    ) -> std::result::Result<Capturing<B>, AllocateFailed> {
        match allocate_resources(&self, backend) {
            Ok(res) => Ok(Capturing {
                slots: self.runners.iter().map(|_| Slot::Pending).collect(),
                ready: vec![false; self.handoffs.len()],
                plan: self,
                res,
            }),
            Err(error) => Err(Failed::new(Operation::Allocate.failed(error), self)),
        }
    }
}

/// Every arena and event of `plan` on `backend`; on error, what was
/// allocated is freed.
fn allocate_resources<B: Backend>(
    plan: &Planned,
    backend: B,
) -> std::result::Result<Resources<B>, BackendError> {
    let mut res = Resources {
        events: Vec::with_capacity(plan.runners.len()),
        arenas: Vec::with_capacity(plan.arenas.len()),
        // Nothing captured yet: no graph memory to give back on failure.
        backend: Trimmed::new(backend),
    };
    // On any error below, `res` drops and frees what was allocated.
    for a in &plan.arenas {
        let desc = ArenaDesc {
            key: a.key,
            bytes: a.bytes,
            alignment: a.key.domain.alignment(),
        };
        res.arenas.push(res.backend.allocate_arena(&desc)?);
    }
    for r in &plan.runners {
        res.events.push(match r.is_fenced() {
            true => Some(res.backend.create_event()?),
            false => None,
        });
    }
    for _ in &plan.handoffs {
        res.events.push(Some(res.backend.create_event()?));
    }
    res.backend.trim = true;
    Ok(res)
}

/// Phase 3 of 5: arenas are allocated; runners are captured one at a time.
///
/// Only one [`RunnerCapture`] can be open at once (it borrows the
/// `Capturing` mutably), and [`Capturing::seal`] cannot be called while one
/// is open:
///
/// ```compile_fail
/// use replay_arena::{Discovering, PlanConfig, Policy, RunnerId, sim};
/// let planned = Discovering::new(PlanConfig::new()).plan(Policy::Generations(1)).unwrap();
/// let mut capturing = planned.allocate(sim::Device::new()).unwrap();
/// let cap = capturing.capture(RunnerId(0)).unwrap();
/// let replayable = capturing.seal(); // `capturing` is still borrowed by `cap`
/// drop(cap);
/// ```
pub struct Capturing<B: Backend> {
    /// Runner slot -> its capture state and graph. Dropped before `res`.
    pub(crate) slots: Vec<Slot<B::Graph>>,
    /// Handoff -> its writer's graph records its event at a ready point
    /// ([`RunnerCapture::ready`]).
    pub(crate) ready: Vec<bool>,
    pub(crate) plan: Planned,
    pub(crate) res: Resources<B>,
}

impl<B: Backend> fmt::Debug for Capturing<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Capturing")
            .field("backend", &self.res.backend.name())
            .field("runners", &self.plan.runners.len())
            .field(
                "captured",
                &self
                    .slots
                    .iter()
                    .filter(|s| matches!(s, Slot::Captured(_)))
                    .count(),
            )
            .finish_non_exhaustive()
    }
}

impl<B: Backend> Capturing<B> {
    /// The plan.
    pub fn plan(&self) -> &Planned {
        &self.plan
    }

    /// The backend, to submit work while capturing.
    pub fn backend(&self) -> &B {
        &self.res.backend
    }

    /// Opens `runner`'s capture. Each runner is captured once.
    ///
    /// # Errors
    ///
    /// [`CaptureError::UnknownRunner`] for a runner discovery never armed,
    /// [`CaptureError::AlreadyCaptured`] for one whose capture closed.
    ///
    /// ```
    /// use replay_arena::{Discovering, PlanConfig, Policy, Request, Domain, DType, RunnerId};
    /// use replay_arena::{CaptureError, Purpose};
    /// use replay_arena::sim;
    ///
    /// let wgrad = Request::new(Domain::Device, DType::BF16, 4096).purpose(Purpose::WgradRsInput);
    /// let scratch = Request::new(Domain::Device, DType::F32, 512);
    /// let mut discovery = Discovering::new(PlanConfig::new());
    /// {
    ///     let mut armed = discovery.arm_named(RunnerId(0), "layer0.mlp.bwd")?;
    ///     armed.record(wgrad)?;
    ///     armed.record(scratch)?;
    /// }
    /// let sim = sim::Device::new();
    /// let stream = sim.new_stream();
    /// let mut capturing = discovery.plan(Policy::OverlapDepth(2))?.allocate(sim.clone())?;
    ///
    /// let cap = capturing.capture(RunnerId(0))?;
    /// let w = cap.take(wgrad)?;            // same order as discovery
    /// let x = cap.take(scratch)?;
    /// assert_eq!(w.device_address() % 256, 0); // aligned, fixed for the plan's life
    /// cap.stream_capture(&stream, |s| sim.launch(s, sim::Kernel::fill(&x, 1.0), 3))?;
    /// cap.finish()?;                        // took exactly what was recorded
    ///
    /// let again = capturing.capture(RunnerId(0)).unwrap_err();
    /// assert!(matches!(again, CaptureError::AlreadyCaptured { failure: None, .. }));
    /// # Ok::<(), replay_arena::Error>(())
    /// ```
    pub fn capture(&mut self, runner: RunnerId) -> Result<RunnerCapture<'_, B>> {
        let slot = self
            .plan
            .slot(runner)
            .ok_or(CaptureError::UnknownRunner { runner })?;
        match &self.slots[slot] {
            Slot::Pending => {}
            Slot::Captured(_) => {
                return Err(CaptureError::AlreadyCaptured {
                    runner,
                    failure: None,
                })
            }
            Slot::Failed(f) => {
                return Err(CaptureError::AlreadyCaptured {
                    runner,
                    failure: Some(f.clone()),
                })
            }
        }
        Ok(RunnerCapture {
            owner: self,
            slot,
            scope: new_scope_id(),
            next: Cell::new(0),
            graph: RefCell::new(None),
            copies: RefCell::new(Vec::new()),
            copies_wanted: Cell::new(1),
            cut_across: Cell::new(false),
            ready_order: RefCell::new(Vec::new()),
            cuts: RefCell::new(Vec::new()),
            ready_points: RefCell::new(Vec::new()),
            parts: RefCell::new(Vec::new()),
            failure: RefCell::new(None),
            in_closure: Cell::new(false),
            stream: Cell::new(None),
            handoffs: RefCell::new(Vec::new()),
            closed: false,
            _not_send: NotSend::default(),
        })
    }

    /// Gives up on this plan (after a failed capture, say): frees graphs,
    /// events and arenas (nothing was replayed, so nothing is in flight),
    /// gives the graphs' memory back to the device
    /// ([`Backend::trim_graph_memory`]), and returns a fresh discovery with
    /// the same config.
    pub fn replan(self) -> Discovering {
        let Capturing {
            slots, plan, res, ..
        } = self;
        drop(slots);
        // Best effort: the plan's graphs are gone, nothing is lost if not.
        let _ = res.backend.trim_graph_memory();
        drop(res);
        Discovering::new(plan.config)
    }
}

/// One runner's open capture. Views borrow it, so they cannot outlive it;
/// [`RunnerCapture::stream_capture`] captures the runner's graph and keeps
/// it; [`RunnerCapture::finish`] checks that it took exactly its capacity and
/// hands the graph
/// to the plan. Dropping it unfinished marks the runner failed.
///
/// A view cannot be used after its capture closed:
///
/// ```compile_fail
/// use replay_arena::{Discovering, PlanConfig, Policy, Request, Domain, DType, RunnerId, sim};
/// let mut d = Discovering::new(PlanConfig::new());
/// d.arm(RunnerId(0)).unwrap().record(Request::new(Domain::Device, DType::F32, 64)).unwrap();
/// let sim = sim::Device::new();
/// let stream = sim.new_stream();
/// let mut capturing = d.plan(Policy::Generations(1)).unwrap().allocate(sim).unwrap();
/// let cap = capturing.capture(RunnerId(0)).unwrap();
/// let view = cap.take(Request::new(Domain::Device, DType::F32, 64)).unwrap();
/// cap.stream_capture(&stream, |_| Ok::<(), replay_arena::Error>(())).unwrap();
/// cap.finish().unwrap();
/// println!("{:x}", view.device_address()); // `cap` was moved while borrowed
/// ```
pub struct RunnerCapture<'c, B: Backend> {
    owner: &'c mut Capturing<B>,
    slot: usize,
    /// The scope of the views it hands out: open while the work closure
    /// of `stream_capture` runs.
    scope: u64,
    /// Index of the next request.
    next: Cell<usize>,
    /// The graph `stream_capture` captured.
    graph: RefCell<Option<B::Graph>>,
    /// Its step copies (`stream_capture_repeatable`), and how many to make.
    copies: RefCell<Vec<StepCopy<B::Graph>>>,
    copies_wanted: Cell<usize>,
    /// Whether the copies are cut where temporaries live across a ready
    /// point too (`cut_across_temporaries`).
    cut_across: Cell<bool>,
    /// The handoffs the running work marked ready, in order.
    ready_order: RefCell<Vec<HandoffId>>,
    /// While a step copy is captured: the handoffs whose ready points cut
    /// it (in the first run's order), and the parts cut off so far.
    cuts: RefCell<Vec<HandoffId>>,
    /// Each ready point of the step copies, and whether they are cut there.
    ready_points: RefCell<Vec<(HandoffId, Cut)>>,
    parts: RefCell<Vec<B::Graph>>,
    failure: RefCell<Option<CaptureFailure>>,
    /// `stream_capture`'s work closure is running.
    in_closure: Cell<bool>,
    /// The id of the stream `stream_capture` captures on, while it does.
    stream: Cell<Option<u64>>,
    /// Handoffs taken so far, with whether a ready point was marked.
    handoffs: RefCell<Vec<(HandoffId, bool)>>,
    closed: bool,
    _not_send: NotSend,
}

impl<B: Backend> fmt::Debug for RunnerCapture<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunnerCapture")
            .field("runner", &self.runner())
            .field("next_request", &self.next.get())
            .field("graph_captured", &self.graph.borrow().is_some())
            .finish_non_exhaustive()
    }
}

impl<B: Backend> RunnerCapture<'_, B> {
    fn plan(&self) -> &RunnerPlan {
        &self.owner.plan.runners[self.slot]
    }

    /// The runner being captured.
    pub fn runner(&self) -> RunnerId {
        self.plan().id()
    }

    /// The backend, to submit work while capturing.
    pub fn backend(&self) -> &B {
        &self.owner.res.backend
    }

    /// The first handoff this runner writes (in declaration order) that
    /// this capture has not taken yet, with its position and request, and
    /// how many it writes:
    /// [`BufferSource::hand_off`](crate::BufferSource::hand_off)'s order.
    pub(crate) fn next_write(&self) -> (Option<(usize, HandoffId, Request)>, usize) {
        let writes = &self.plan().record.writes;
        let taken = self.handoffs.borrow();
        let next = writes
            .iter()
            .enumerate()
            .find(|(_, w)| !taken.iter().any(|(t, _)| t == *w))
            .and_then(|(i, &w)| {
                let h = self.owner.plan.handoffs.get(w.0 as usize)?;
                Some((i, w, h.record.request))
            });
        (next, writes.len())
    }

    /// Bytes of `key` taken by the first `count` requests.
    fn taken(&self, key: Key, count: usize) -> u64 {
        self.plan().record.requests[..count]
            .iter()
            .filter(|r| r.key() == key)
            .filter_map(Request::aligned_bytes)
            .sum()
    }

    /// Hands out the next fixed-address view. Requests must come in the same
    /// order, with the same domain, dtype, element count and purpose, as in
    /// discovery.
    ///
    /// # Errors
    ///
    /// [`CaptureError::RequestMismatch`] naming what discovery recorded at
    /// this position, [`CaptureError::CapacityExceeded`] past the last
    /// recorded request.
    pub fn take(&self, request: Request) -> Result<View<'_>> {
        let plan = self.plan();
        let runner = plan.id();
        let key = request.key();
        let index = self.next.get();
        let expected = plan.record.requests.get(index).copied();
        if expected != Some(request) {
            // Sizes for the error only: the happy path compares one request.
            let requested = request.aligned_bytes().unwrap_or(u64::MAX);
            let taken = self.taken(key, index.min(plan.record.requests.len()));
            let capacity = plan.extent(key).map_or(0, |s| s.bytes);
            return Err(match expected {
                None => CaptureError::CapacityExceeded {
                    runner,
                    key,
                    index,
                    request,
                    requested,
                    taken,
                    capacity,
                },
                Some(expected) => CaptureError::RequestMismatch {
                    runner,
                    index,
                    request,
                    expected,
                    requested,
                    taken,
                    capacity,
                },
            });
        }
        let Some(place) = self.owner.plan.place(self.slot, index) else {
            // Discovery gives every recorded key a slice: never reached.
            return Err(CaptureError::CapacityExceeded {
                runner,
                key,
                index,
                request,
                requested: request.aligned_bytes().unwrap_or(u64::MAX),
                taken: self.taken(key, index),
                capacity: 0,
            });
        };
        self.next.set(index + 1);
        Ok(View::new(
            self.owner.res.arenas[place.arena].base() + place.offset,
            place.arena,
            place.offset,
            request,
            runner,
            self.scope,
            None,
        ))
    }

    /// The view of `handoff`, which this runner writes (declared with
    /// [`ArmedRunner::hand_off`](crate::ArmedRunner::hand_off)): fixed for
    /// the plan's life, in bytes nothing live with it uses. Mark where the
    /// graph has finished writing it with [`RunnerCapture::ready`], so
    /// readers start there instead of at the end of this graph.
    ///
    /// # Errors
    ///
    /// [`CaptureError::HandoffNotDeclared`] when this runner does not write
    /// `handoff`.
    pub fn hand_off(&self, handoff: HandoffId) -> Result<View<'_>> {
        self.handoff_view(handoff, true)
    }

    /// The read-only view of `handoff` (a [`ReadOnly`] view: its typed
    /// cudarc form cannot be written), written by an earlier runner
    /// (declared with [`ArmedRunner::receive`](crate::ArmedRunner::receive)).
    /// Each replay of this runner waits for the writer's latest write (its
    /// ready point, or the end of its graph), and the writer's next replay
    /// waits for this runner's.
    ///
    /// # Errors
    ///
    /// [`CaptureError::HandoffNotDeclared`] when this runner does not read
    /// `handoff`.
    pub fn receive(&self, handoff: HandoffId) -> Result<View<'_, ReadOnly>> {
        self.handoff_view(handoff, false)
    }

    fn handoff_view<A: Access>(&self, handoff: HandoffId, write: bool) -> Result<View<'_, A>> {
        let plan = self.plan();
        let runner = plan.id();
        let list = if write {
            &plan.record.writes
        } else {
            &plan.record.reads
        };
        let h = self.owner.plan.handoffs.get(handoff.0 as usize);
        let (Some(h), true) = (h, list.contains(&handoff)) else {
            return Err(CaptureError::HandoffNotDeclared {
                runner,
                handoff,
                role: role(write),
            });
        };
        let mut taken = self.handoffs.borrow_mut();
        if !taken.iter().any(|(t, _)| *t == handoff) {
            taken.push((handoff, false));
        }
        Ok(View::new(
            self.owner.res.arenas[h.place.arena].base() + h.place.offset,
            h.place.arena,
            h.place.offset,
            h.record.request,
            runner,
            self.scope,
            Some(handoff.0),
        ))
    }

    /// Marks the point of this runner's graph after which it no longer
    /// touches `handoff`: the graph records the handoff's event there (an
    /// event record node), and readers' replays wait for that point instead
    /// of the end of the graph (module `m`'s dgrad starts while `m + 1`'s
    /// wgrad still runs). Call it inside the work closure of
    /// [`RunnerCapture::stream_capture`], on its stream, after the last
    /// work that writes or reads the handoff. Work after it must leave the
    /// handoff alone: readers and the next writer may use it from there.
    ///
    /// # Errors
    ///
    /// [`CaptureError::ReadyMisplaced`] outside the work closure, on
    /// another stream, for a handoff this capture did not take with
    /// [`RunnerCapture::hand_off`], or marked twice; the backend's error.
    pub fn ready(&self, handoff: HandoffId, stream: &B::Stream) -> Result<()> {
        let runner = self.runner();
        let misplaced = |reason| CaptureError::ReadyMisplaced {
            runner,
            handoff,
            reason,
        };
        let backend: &B = &self.owner.res.backend;
        if !self.in_closure.get() || self.stream.get() != Some(backend.stream_id(stream)) {
            return Err(misplaced(
                "call it inside the work closure of this runner's stream_capture, on its stream",
            ));
        }
        let mut taken = self.handoffs.borrow_mut();
        let Some(entry) = taken.iter_mut().find(|(t, _)| *t == handoff) else {
            return Err(misplaced(
                "take it with hand_off first (only its writer marks it ready)",
            ));
        };
        if !self.plan().record.writes.contains(&handoff) {
            return Err(misplaced("only its writer marks it ready"));
        }
        if entry.1 {
            return Err(misplaced("it was marked ready already"));
        }
        let event = self
            .owner
            .res
            .events
            .get(self.owner.plan.runners.len() + handoff.0 as usize)
            .and_then(Option::as_ref)
            .ok_or_else(|| misplaced("the plan has no event for it"))?;
        backend
            .record_event_node(stream, event)
            .map_err(|error| CaptureError::Backend(Operation::Capture(runner).failed(error)))?;
        if !retire(self.scope, handoff.0) {
            return Err(misplaced("the capture's scope is not open on this thread"));
        }
        entry.1 = true;
        drop(taken);
        self.ready_order.borrow_mut().push(handoff);
        // The next cut planned is at this ready point.
        let cut_here = self.cuts.borrow().get(self.parts.borrow().len()) == Some(&handoff);
        if cut_here {
            // SAFETY: the capture this runner's `capture_graph` began on
            // `stream` (checked above: the closure runs, on that stream),
            // whose work `cuts_at` found nothing beside this ready point in.
            match unsafe { backend.cut_capture(stream) } {
                Ok(part) => self.parts.borrow_mut().push(part),
                Err(error) => {
                    // The stream may have left capture: its views stop
                    // working now, and the copy fails (a part is missing).
                    close_scope(self.scope);
                    return Err(CaptureError::Backend(
                        Operation::Capture(runner).failed(error),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Captures the work `work` puts on `stream` into this runner's graph,
    /// which the capture keeps until [`RunnerCapture::finish`]. If `work`
    /// fails or panics, the stream capture is ended and discarded (during
    /// unwinding, for a panic) and the runner is marked failed.
    ///
    /// # Errors
    ///
    /// [`StreamCaptureError::Work`] with the closure's own error;
    /// [`StreamCaptureError::Capture`] when the backend cannot begin or end
    /// the capture, when a graph was already captured, or after an earlier
    /// failure.
    #[doc(alias = "cuStreamBeginCapture")]
    #[doc(alias = "begin_capture")]
    pub fn stream_capture<E: fmt::Display>(
        &self,
        stream: &B::Stream,
        work: impl FnOnce(&B::Stream) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), StreamCaptureError<E>> {
        self.may_capture()?;
        let graph = self.capture_graph((stream, false), work)?;
        *self.graph.borrow_mut() = Some(graph);
        Ok(())
    }

    /// Refuses a stream capture from inside the work closure, after a
    /// failure, or after the graph was captured.
    fn may_capture(&self) -> Result<()> {
        let runner = self.runner();
        if self.in_closure.get() {
            // Refused without touching the outer capture, which goes on.
            return Err(CaptureError::NestedCapture { runner });
        }
        if let Some(failure) = self.failure.borrow().clone() {
            return Err(CaptureError::Failed { runner, failure });
        }
        if self.graph.borrow().is_some() {
            return Err(CaptureError::GraphAlreadyCaptured { runner });
        }
        Ok(())
    }

    /// One stream capture of `work` into a graph (a `part` only ever
    /// composed into a step graph); a failure fails the runner.
    fn capture_graph<E: fmt::Display>(
        &self,
        (stream, part): (&B::Stream, bool),
        work: impl FnOnce(&B::Stream) -> std::result::Result<(), E>,
    ) -> std::result::Result<B::Graph, StreamCaptureError<E>> {
        let runner = self.runner();
        let backend: &B = &self.owner.res.backend;
        let fail = |failure: CaptureFailure| {
            *self.failure.borrow_mut() = Some(failure);
        };
        let sid = backend.stream_id(stream);
        // The views of this capture work on the device only while the
        // closure runs, on `stream`; and no consumer or capture of any
        // thread may work on `stream` until the capture ended (its work
        // would be recorded into this graph).
        let captured = capture_work(
            backend,
            (stream, part),
            (sid, self.scope, runner),
            || {
                self.in_closure.set(false);
                self.stream.set(None);
                if let Ok(mut f) = self.failure.try_borrow_mut() {
                    *f = Some(CaptureFailure::Panicked);
                }
            },
            || {
                self.in_closure.set(true);
                self.stream.set(Some(sid));
                let out = work(stream);
                self.in_closure.set(false);
                self.stream.set(None);
                out
            },
        );
        match captured {
            Ok(((), graph)) => Ok(graph),
            // Nothing was begun: nothing is lost.
            Err(Uncaptured::Busy(_)) => Err(CaptureError::StreamInUse { runner }.into()),
            Err(Uncaptured::Begin(error)) => {
                Err(CaptureError::Backend(Operation::Capture(runner).failed(error)).into())
            }
            Err(Uncaptured::Work(e)) => {
                fail(CaptureFailure::Work(e.to_string()));
                Err(StreamCaptureError::Work(e))
            }
            Err(Uncaptured::Misuse(reason)) => {
                let error = CaptureError::ViewOutOfScope { runner, reason };
                fail(CaptureFailure::Check(Box::new(error.clone())));
                Err(error.into())
            }
            Err(Uncaptured::End(error)) => {
                let error = CaptureError::Backend(Operation::Capture(runner).failed(error));
                fail(CaptureFailure::Check(Box::new(error.clone())));
                Err(error.into())
            }
        }
    }

    /// Closes the capture: checks that every key's capacity was taken
    /// exactly and that the graph's memory nodes are balanced (every
    /// allocation freed inside the graph, no free of foreign memory), then
    /// hands the graph to the plan to own.
    ///
    /// # Errors
    ///
    /// [`CaptureError::TakenMismatch`], [`CaptureError::NoGraphCaptured`],
    /// [`CaptureError::GraphRejected`], or [`CaptureError::Failed`] after a
    /// failed [`RunnerCapture::stream_capture`]. The runner is then failed
    /// for good (re-plan to capture it again).
    pub fn finish(self) -> Result<()> {
        let graph = self.graph.borrow_mut().take();
        match graph {
            Some(graph) => self.close(graph),
            None => {
                let runner = self.runner();
                let failure = self.failure.borrow().clone();
                let error = match failure {
                    Some(failure) => CaptureError::Failed { runner, failure },
                    None => CaptureError::NoGraphCaptured { runner },
                };
                self.close_failed(error)
            }
        }
    }

    /// Closes the capture with a graph the program captured by its own
    /// means, instead of one from [`RunnerCapture::stream_capture`]: on
    /// `cuda`, a graph from cudarc's own `begin_capture` / `end_capture`,
    /// made into the crate's graph by `cuda::Device::adopt_graph`. That
    /// capture runs outside the crate's closures, so its kernels take the
    /// views' raw addresses ([`View::device_address`](crate::View::device_address)):
    /// typed views work only inside `stream_capture` and `consume`. The
    /// same checks as [`RunnerCapture::finish`] apply.
    ///
    /// # Safety
    ///
    /// The fence orders this runner's replays by the bytes *this runner*
    /// claims. The caller guarantees that `graph` writes and reads plan
    /// memory only through views taken from this capture (never another
    /// runner's views or arenas), that it was captured on this backend's
    /// device, and that everything else it touches stays alive and is
    /// ordered by the caller for as long as the plan may replay it.
    ///
    /// # Errors
    ///
    /// As [`RunnerCapture::finish`]; also when `stream_capture` already
    /// captured a graph ([`CaptureError::GraphAlreadyCaptured`]).
    pub unsafe fn finish_with_graph(self, graph: B::Graph) -> Result<()> {
        let runner = self.runner();
        if self.graph.borrow().is_some() {
            return self.close_failed(CaptureError::GraphAlreadyCaptured { runner });
        }
        let failure = self.failure.borrow().clone();
        if let Some(failure) = failure {
            return self.close_failed(CaptureError::Failed { runner, failure });
        }
        self.close(graph)
    }

    fn close(self, graph: B::Graph) -> Result<()> {
        let plan = self.plan();
        let runner = plan.id();
        let next = self.next.get();
        let failure = self.failure.borrow().clone();
        if let Some(failure) = failure {
            return self.close_failed(CaptureError::Failed { runner, failure });
        }
        if let Some(first_left) = plan.record.requests.get(next) {
            let key = first_left.key();
            let taken = self.taken(key, next);
            let capacity = plan.extent(key).map_or(0, |s| s.bytes);
            return self.close_failed(CaptureError::TakenMismatch {
                runner,
                key,
                taken,
                capacity,
            });
        }
        let taken = self.handoffs.borrow().clone();
        let missing = [(&plan.record.writes, true), (&plan.record.reads, false)]
            .into_iter()
            .find_map(|(list, write)| {
                let h = list.iter().find(|h| !taken.iter().any(|(t, _)| t == *h))?;
                Some((*h, write))
            });
        {
            if let Some((handoff, write)) = missing {
                return self.close_failed(CaptureError::HandoffNotTaken {
                    runner,
                    handoff,
                    role: role(write),
                });
            }
        }
        let backend: &B = &self.owner.res.backend;
        let copies = std::mem::take(&mut *self.copies.borrow_mut());
        if let Some(reason) = backend.validate_graph(&graph).err().or_else(|| {
            copies.iter().find_map(|c| {
                let parts: Vec<&B::Graph> = c.parts.iter().collect();
                backend.validate_parts(&parts).err()
            })
        }) {
            return self.close_failed(CaptureError::GraphRejected { runner, reason });
        }
        let temporaries = match backend.graph_temporaries(&graph) {
            Ok(t) => t,
            Err(error) => {
                return self.close_failed(CaptureError::Backend(
                    Operation::Capture(runner).failed(error),
                ))
            }
        };
        let mut this = self;
        this.closed = true;
        for (handoff, ready) in taken {
            if ready {
                this.owner.ready[handoff.0 as usize] = true;
            }
        }
        let ready_points = this.ready_points.take();
        this.owner.slots[this.slot] = Slot::Captured(Captured {
            graph,
            copies,
            temporaries,
            ready_points,
        });
        Ok(())
    }

    fn close_failed(mut self, error: CaptureError) -> Result<()> {
        self.closed = true;
        let failure = match &error {
            CaptureError::Failed { failure, .. } => failure.clone(),
            other => CaptureFailure::Check(Box::new(other.clone())),
        };
        self.owner.slots[self.slot] = Slot::Failed(failure);
        Err(error)
    }
}

fn role(write: bool) -> &'static str {
    if write {
        "writer"
    } else {
        "reader"
    }
}

impl<B: Backend> Drop for RunnerCapture<'_, B> {
    fn drop(&mut self) {
        if !self.closed {
            let failure = self
                .failure
                .borrow_mut()
                .take()
                .unwrap_or(CaptureFailure::Dropped);
            self.owner.slots[self.slot] = Slot::Failed(failure);
        }
    }
}
