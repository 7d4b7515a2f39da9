//! Phase 4: [`Replayable`]. The public API over the fence (`fence.rs`):
//! replay, consume, views, teardown.

use std::fmt;

use crate::backend::{Arena, Backend, BackendError, Cut, Temporaries, Timing};
use crate::capture::{CaptureError, Captured, Capturing, Slot, StepCopy};
use crate::discover::Discovering;
use crate::failed::Failed;
use crate::fence::{
    enter, enter_replay, enter_scope, refused_by_capture, Fence, FenceStats, Operation,
};
pub use crate::fence::{
    BackendFailure, ConsumeError, ReplayError, StreamCapturing, TraceError, UnknownRunner,
    WaitError,
};
use crate::plan::Planned;
use crate::report::GraphMemoryEstimate;
use crate::scope::{new_scope_id, ScopeKind};
use crate::trace::{Recorder, Trace};
use crate::view::{Access, ReadOnly, ReadWrite, View};
use crate::vocab::{HandoffId, RunnerId};

/// A failed [`Capturing::seal`]: the reason, and the `Capturing` itself, so
/// the caller can still [`Capturing::replan`] (or capture what is missing and
/// seal again).
///
/// It is `Send + Sync + 'static` on every backend whose `Capturing` is
/// `Send` (`sim`, `cuda`), so `capturing.seal()?` works in a function
/// returning `anyhow::Result` (the `Capturing` travels inside the error and
/// comes back with `downcast::<SealError<B>>()` and
/// [`into_capturing`](Self::into_capturing)). Into `replay_arena::Result`,
/// and through [`from_errors!`](crate::from_errors) into the program's own
/// error type, `?` works on every backend (the `Capturing` is dropped,
/// freeing its arenas). To drop the `Capturing` before the error goes on,
/// `.map_err(SealError::into_error)?`: that is how a failed seal goes into
/// `anyhow` on the `nccl` backend, whose `Capturing` holds NCCL
/// communicators and so stays on its thread (not `Send`).
///
/// ```
/// use replay_arena::{CaptureError, Discovering, PlanConfig, Policy, Request, Domain, DType, RunnerId, SealError};
/// use replay_arena::sim;
///
/// let req = Request::new(Domain::Device, DType::F32, 64);
/// let planned = Discovering::from_runners(PlanConfig::new(), [(RunnerId(0), [req])])?
///     .plan(Policy::Generations(1))?;
/// let capturing = planned.allocate(sim::Device::new())?;
/// let mut failed = capturing.seal().unwrap_err(); // runner 0 was never captured
/// assert!(matches!(failed.error(), CaptureError::Unfinished { .. }));
/// let capturing = failed.into_capturing();         // capture it, or replan
/// let discovery = capturing.replan();
/// # drop(discovery);
/// # Ok::<(), replay_arena::Error>(())
/// ```
pub type SealError<B> = Failed<CaptureError, Capturing<B>>;

impl<E, B: Backend> Failed<E, Capturing<B>> {
    /// The `Capturing` in place, to capture what is missing before taking
    /// it back.
    pub fn capturing_mut(&mut self) -> &mut Capturing<B> {
        self.input_mut()
    }

    /// The `Capturing`, to capture what is missing and seal again, or to
    /// [`Capturing::replan`].
    pub fn into_capturing(self) -> Capturing<B> {
        self.into_input()
    }
}

impl<T> From<Failed<CaptureError, T>> for CaptureError {
    /// Keeps the reason; the input is dropped (a `Capturing` frees its
    /// arenas).
    fn from(e: Failed<CaptureError, T>) -> CaptureError {
        e.into_error()
    }
}

pub(crate) mod live;

type Result<T, E = ReplayError> = std::result::Result<T, E>;

impl<B: Backend> Capturing<B> {
    /// [`CaptureError::Unfinished`] naming each buffer-using runner that
    /// was never captured or failed, if any.
    pub(crate) fn unfinished(&self) -> Option<CaptureError> {
        let runners: Vec<_> = (self.plan.runners.iter())
            .zip(&self.slots)
            .filter(|(r, _)| r.needs_graph())
            .filter_map(|(r, s)| match s {
                Slot::Captured(_) => None,
                Slot::Pending => Some((r.id(), None)),
                Slot::Failed(f) => Some((r.id(), Some(f.clone()))),
            })
            .collect();
        (!runners.is_empty()).then_some(CaptureError::Unfinished { runners })
    }

    /// Ends capture: succeeds only when every buffer-using runner's capture
    /// finished (a runner that uses no buffers may stay uncaptured, or fail).
    ///
    /// # Errors
    ///
    /// [`SealError`] with [`CaptureError::Unfinished`] naming each
    /// buffer-using runner that was never captured or failed, and the
    /// `Capturing` back.
    #[doc(alias = "finalize")]
    pub fn seal(self) -> std::result::Result<Replayable<B>, SealError<B>> {
        if let Some(unfinished) = self.unfinished() {
            return Err(Failed::new(unfinished, self));
        }
        let Capturing {
            slots,
            ready,
            plan,
            res,
        } = self;
        let mut views = Vec::new();
        let runners = slots
            .into_iter()
            .enumerate()
            .map(|(slot, s)| {
                let start = views.len();
                views.extend(views_of(&plan, &res.arenas, slot));
                let views = start..views.len();
                match s {
                    Slot::Captured(c) => RunnerGraph::of(Some(c), views),
                    Slot::Pending | Slot::Failed(_) => RunnerGraph::of(None, views),
                }
            })
            .collect();
        Ok(Replayable {
            runners,
            buckets: live::Live::new(plan.bucket_count()),
            id: new_scope_id(),
            fence: Fence::new(res.events, &plan, &ready),
            plan,
            views,
            _arenas: res.arenas,
            // Sealed, the plan's teardown trims after its graphs are gone.
            backend: res.backend.into_inner(),
            schedule_hint: 0,
        })
    }
}

/// What the plan holds for one runner, and what a step graph asks of it.
pub(crate) struct RunnerGraph<G> {
    /// Its graph (`None`: a runner without buffers that was not captured).
    pub(crate) graph: Option<G>,
    /// Step copies of a graph with temporaries not moved into a step graph
    /// yet ([`RunnerCapture::stream_capture_repeatable`](crate::RunnerCapture::stream_capture_repeatable)).
    pub(crate) step_copies: Vec<StepCopy<G>>,
    /// Step copies its capture made.
    pub(crate) copies_made: usize,
    /// What its graph's allocation nodes allocate.
    pub(crate) temporaries: Temporaries,
    /// The ready points of its step copies, and whether they are cut there.
    pub(crate) ready_points: Vec<(HandoffId, Cut)>,
    /// Its views in [`Replayable`]'s list of every runner's views.
    pub(crate) views: std::ops::Range<usize>,
    /// The fence epoch of its latest replay: its bucket's recency
    /// (`buckets.rs`).
    pub(crate) used: u64,
}

impl<G> RunnerGraph<G> {
    /// The graph of a finished capture (`None`: an empty runner not
    /// captured), with its views.
    pub(crate) fn of(captured: Option<Captured<G>>, views: std::ops::Range<usize>) -> Self {
        match captured {
            Some(c) => RunnerGraph {
                graph: Some(c.graph),
                copies_made: c.copies.len(),
                step_copies: c.copies,
                temporaries: c.temporaries,
                ready_points: c.ready_points,
                views,
                used: 0,
            },
            None => RunnerGraph {
                graph: None,
                copies_made: 0,
                step_copies: Vec::new(),
                temporaries: Temporaries::default(),
                ready_points: Vec::new(),
                views,
                used: 0,
            },
        }
    }
}

impl<G> RunnerGraph<G> {
    /// Whether its graph allocates temporaries: a step graph moves in one
    /// of its step copies, whole, instead of copying its graph.
    pub(crate) fn moves(&self) -> bool {
        !self.temporaries.is_empty()
    }

    /// The handoffs at whose ready points its step copies were cut (all
    /// alike), in order.
    pub(crate) fn cuts(&self) -> &[HandoffId] {
        self.step_copies.last().map_or(&[], |c| c.cuts.as_slice())
    }
}

/// Phase 4 of 5: every buffer-using runner is captured; graphs replay behind
/// event fences.
///
/// Runners may be replayed in any order, on any streams: each replay waits
/// for the latest users of the bytes it overwrites (unless stream order
/// already implies it). Dropping it waits for every replay and consumer the
/// fence ordered (not for unrelated work), then frees graphs, events and
/// arenas.
///
/// ```
/// use replay_arena::{Discovering, PlanConfig, Policy, Request, Domain, DType, RunnerId};
/// use replay_arena::sim;
///
/// let req = Request::new(Domain::Device, DType::F32, 256);
/// let mut discovery = Discovering::new(PlanConfig::new());
/// discovery.arm(RunnerId(0))?.record(req)?;
/// let sim = sim::Device::new();
/// let stream = sim.new_stream();
/// let mut capturing = discovery.plan(Policy::Generations(2))?.allocate(sim.clone())?;
/// {
///     let cap = capturing.capture(RunnerId(0))?;
///     let view = cap.take(req)?;
///     cap.stream_capture(&stream, |s| sim.launch(s, sim::Kernel::fill(&view, 1.5), 10))?;
///     cap.finish()?;
/// }
/// let mut replayable = capturing.seal()?;
/// replayable.replay(RunnerId(0), &stream)?;
/// let view = replayable.views(RunnerId(0))?[0];
/// assert_eq!(sim.read_f32(&view)?[255], 1.5);
/// # Ok::<(), replay_arena::Error>(())
/// ```
///
/// A replay is only possible once sealed:
///
/// ```compile_fail
/// use replay_arena::{Discovering, PlanConfig, Policy, RunnerId, sim};
/// let sim = sim::Device::new();
/// let stream = sim.new_stream();
/// let planned = Discovering::new(PlanConfig::new()).plan(Policy::Generations(1)).unwrap();
/// let mut capturing = planned.allocate(sim).unwrap();
/// capturing.replay(RunnerId(0), &stream); // no method `replay` on `Capturing`
/// ```
pub struct Replayable<B: Backend> {
    /// Runner slot -> its graph, its step copies, its temporaries and its
    /// views. Field order is drop order: graphs, then events, then arenas.
    pub(crate) runners: Vec<RunnerGraph<B::Graph>>,
    /// Each bucket's state at run time, and the budget (`buckets.rs`).
    pub(crate) buckets: live::Live,
    /// Unique in the process: which plan a kept step graph belongs to.
    pub(crate) id: u64,
    pub(crate) fence: Fence<B>,
    pub(crate) plan: Planned,
    /// Every runner's views, runner after runner, made once at seal: a
    /// consumer or `views` hands out a slice, no allocation. Their scope is
    /// set while a consumer of theirs runs, 0 otherwise.
    pub(crate) views: Vec<View<'static>>,
    /// Held for their drop (after graphs and events): views point into them.
    pub(crate) _arenas: Vec<B::Arena>,
    pub(crate) backend: B,
    /// The length of the latest step schedule compiled: the next one's
    /// room (one bucket's step after another's, mostly alike).
    pub(crate) schedule_hint: usize,
}

impl<B: Backend> fmt::Debug for Replayable<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Replayable")
            .field("backend", &self.backend.name())
            .field("runners", &self.plan.runners.len())
            .field("stats", &self.fence.stats())
            .finish_non_exhaustive()
    }
}

impl<B: Backend> Drop for Replayable<B> {
    fn drop(&mut self) {
        if self.quiesce().is_ok() {
            // Nothing of the plan can run: its graphs go, and the memory
            // the driver keeps for their temporaries goes back to the
            // device (best effort).
            for runner in &mut self.runners {
                runner.graph = None;
                runner.step_copies.clear();
            }
            let _ = self.backend.trim_graph_memory();
        }
    }
}

impl<B: Backend> Replayable<B> {
    /// The plan.
    pub fn plan(&self) -> &Planned {
        &self.plan
    }

    /// The backend, to submit other work.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The graph captured for `runner`, owned by the plan (`None` for an
    /// empty runner that was not captured, or an unknown runner).
    pub fn graph(&self, runner: RunnerId) -> Option<&B::Graph> {
        self.runners[self.plan.slot(runner)?].graph.as_ref()
    }

    /// The plan's report, with what the backend holds for the graphs'
    /// temporaries beside the plan's bytes
    /// ([`PlanReport::graph_memory`](crate::PlanReport::graph_memory): on
    /// CUDA the device's whole graph pool, every plan's and program's).
    ///
    /// # Errors
    ///
    /// [`BackendFailure`] ([`Operation::Report`](crate::Operation::Report))
    /// when the backend cannot tell.
    pub fn report(&self) -> Result<crate::report::PlanReport, BackendFailure> {
        let mut report = self.plan.report();
        let estimate = self.graph_memory(1)?;
        report.graph_memory = estimate.driver;
        report.graph_memory_estimate = Some(estimate);
        for (r, g) in report.runners.iter_mut().zip(&self.runners) {
            r.temporaries = Some(g.temporaries);
        }
        for (b, (state, bytes)) in report.buckets.iter_mut().zip(self.bucket_figures()) {
            b.state = Some(state);
            b.temporaries = Some(bytes);
        }
        let mut sizes: Vec<u64> = self.runners.iter().map(|g| g.temporaries.bytes).collect();
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        let mut step_copies = 0u64;
        let parts = self
            .runners
            .iter()
            .flat_map(|g| &g.step_copies)
            .flat_map(|c| &c.parts);
        for part in parts {
            let t = self
                .backend
                .graph_temporaries(part)
                .map_err(|e| Operation::Report.failed(e))?;
            step_copies = step_copies.saturating_add(t.bytes);
        }
        report.temporaries = Some(crate::report::GraphTemporaries {
            runners: self.runners.iter().filter(|g| g.moves()).count(),
            total: sizes.iter().fold(0, |a, &b| a.saturating_add(b)),
            largest: sizes.first().copied().unwrap_or(0),
            in_flight: sizes
                .iter()
                .take(self.plan.generations().max(1))
                .fold(0, |a, &b| a.saturating_add(b)),
            step_copies,
        });
        Ok(report)
    }

    /// What the driver holds for this plan's graph memory, estimated from
    /// its graphs' layout ([`GraphMemoryEstimate`]): the largest share one
    /// runner graph's temporaries take (its [`Temporaries::span`] rounded up
    /// to [`Backend::graph_memory_granule`]), times `concurrent`, the graphs
    /// with temporaries the program runs at once (the streams its replays
    /// overlap on; 0 is taken as 1), beside the driver's reservation now.
    ///
    /// # Errors
    ///
    /// [`BackendFailure`] ([`Operation::Report`](crate::Operation::Report))
    /// when the backend cannot tell its reservation.
    pub fn graph_memory(&self, concurrent: usize) -> Result<GraphMemoryEstimate, BackendFailure> {
        let granule = self.backend.graph_memory_granule();
        let largest = (self.plan.runners.iter().zip(&self.runners))
            .map(|(r, g)| {
                (
                    GraphMemoryEstimate::share(g.temporaries.span, granule),
                    r.id(),
                )
            })
            .filter(|&(share, _)| share > 0)
            .max_by_key(|&(share, id)| (share, std::cmp::Reverse(id)));
        let concurrent = concurrent.max(1);
        let per_stream = largest.map_or(0, |(share, _)| share);
        Ok(GraphMemoryEstimate {
            granule,
            largest_runner: largest.map(|(_, id)| id),
            per_stream,
            concurrent,
            bytes: per_stream.saturating_mul(concurrent as u64),
            driver: self
                .backend
                .graph_memory_in_use()
                .map_err(|e| Operation::Report.failed(e))?,
        })
    }

    /// What `runner`'s graph allocates as temporaries (its graph memory
    /// nodes' sizes), and how many step copies of it are left for step
    /// graphs to move in ([`RunnerCapture::stream_capture_repeatable`](crate::RunnerCapture::stream_capture_repeatable)).
    ///
    /// # Errors
    ///
    /// [`UnknownRunner`].
    pub fn temporaries(&self, runner: RunnerId) -> Result<(Temporaries, usize), UnknownRunner> {
        let slot = self.slot(runner)?;
        let g = &self.runners[slot];
        Ok((g.temporaries, g.step_copies.len()))
    }

    /// The ready points of runner `runner`'s step copies
    /// ([`RunnerCapture::stream_capture_repeatable`](crate::RunnerCapture::stream_capture_repeatable)),
    /// in the order its work marks them, and whether the copies are cut
    /// there ([`Cut::Clean`]: a step graph's readers of that handoff start
    /// at its ready point) or kept whole, and why (readers start after the
    /// whole copy). Empty for a runner without step copies: a graph with no
    /// temporaries is split at its ready points when a step graph is built.
    ///
    /// A copy is kept whole where a temporary lives across the ready point
    /// ([`Cut::TemporariesAcross`]): cut there, the driver reserved 5 to 7
    /// times the graph memory of whole copies on an H200.
    ///
    /// # Errors
    ///
    /// [`UnknownRunner`].
    pub fn ready_points(&self, runner: RunnerId) -> Result<&[(HandoffId, Cut)], UnknownRunner> {
        let slot = self.slot(runner)?;
        Ok(&self.runners[slot].ready_points)
    }

    /// Gives the memory the backend keeps for graph allocations, and no
    /// live graph uses, back to the device ([`Backend::trim_graph_memory`]:
    /// on CUDA `cuDeviceGraphMemTrim`, for the whole device). Teardown and
    /// [`Replayable::replan`] do it once none of the plan's graphs can run;
    /// call it after dropping a step graph whose moved graphs had
    /// temporaries, say.
    ///
    /// # Errors
    ///
    /// [`BackendFailure`] ([`Operation::TrimGraphMemory`](crate::Operation::TrimGraphMemory)).
    pub fn trim_graph_memory(&self) -> Result<(), BackendFailure> {
        self.backend
            .trim_graph_memory()
            .map_err(|e| Operation::TrimGraphMemory.failed(e))
    }

    /// What the fence has done so far.
    #[doc(alias = "stats")]
    pub fn fence_stats(&self) -> FenceStats {
        self.fence.stats()
    }

    pub(crate) fn slot(&self, runner: RunnerId) -> Result<usize, UnknownRunner> {
        self.plan.slot(runner).ok_or(UnknownRunner { runner })
    }

    /// Replays `runner`'s graph on `stream`: waits for the latest users of
    /// the bytes it overwrites (unless stream order implies it), launches,
    /// and makes `runner` the latest user of its bytes.
    ///
    /// # Errors
    ///
    /// [`ReplayError::UnknownRunner`], [`ReplayError::NoGraph`], a handoff
    /// or staged-input check ([`ReplayError::HandoffNotWritten`], ...),
    /// [`ReplayError::StreamCapturing`], or [`ReplayError::Backend`].
    #[doc(alias = "cuGraphLaunch")]
    #[doc(alias = "launch")]
    pub fn replay(&mut self, runner: RunnerId, stream: &B::Stream) -> Result<()> {
        let slot = self.slot(runner)?;
        let Some(graph) = &self.runners[slot].graph else {
            return Err(self.no_graph(slot, runner));
        };
        let backend = &self.backend;
        let op = Operation::Replay(runner);
        // No capture of the crate's may begin on `stream` until the launch
        // and its records are done (they would go into its graph); one the
        // program began refuses the launch.
        let entered = enter_replay(backend, stream, op)?;
        // Every transaction that commits moves the epoch on: a failure
        // with the epoch unmoved launched nothing.
        let epoch = self.fence.epoch();
        let replayed = self
            .fence
            .replay(backend, &self.plan, slot, entered.on, || {
                // SAFETY: the fence made `stream` wait for every earlier
                // user of the bytes this graph claims (the handoffs it
                // writes included) and for the latest write of every
                // handoff it reads; after the launch, it makes the runner
                // the latest user of its bytes and a reader of those
                // handoffs.
                unsafe { backend.launch(graph, stream) }
            });
        // Its bucket's recency: one store per replay.
        self.runners[slot].used = self.fence.epoch();
        match replayed {
            Ok(()) => Ok(()),
            // Refused before anything ran: the stream may be capturing by
            // the program's means. (A record that fails after the launch
            // went out stays that failure: the replay ran.)
            Err(ReplayError::Backend(failure)) if self.fence.epoch() == epoch => {
                Err(refused_by_capture(backend, stream, op)
                    .map_or(ReplayError::Backend(failure), ReplayError::StreamCapturing))
            }
            done => done,
        }
    }

    /// Why runner slot `slot` has no graph: its bucket was released, or it
    /// never had one.
    #[cold]
    fn no_graph(&self, slot: usize, runner: RunnerId) -> ReplayError {
        let bucket = self.plan.runners[slot].record.bucket;
        match self.bucket_state(bucket) {
            Ok(crate::vocab::BucketState::Released) => ReplayError::Released { runner, bucket },
            _ => ReplayError::NoGraph { runner },
        }
    }

    /// Launches `runner`'s graph with no fence for the bytes it
    /// overwrites. Data still flows: `stream` waits for the latest write of
    /// every handoff the runner reads (the event its writer's graph records
    /// at its ready point, or records after an unfenced launch of a writer
    /// with none), as a program ordering its layers by hand would.
    ///
    /// # Safety
    ///
    /// The caller guarantees that no replay or consumer in flight uses any
    /// byte this runner's graph writes (its arenas and the handoffs it
    /// writes), and that no later fenced replay relies on this one being
    /// tracked: the fence does not know about it (synchronize before the
    /// next fenced replay). Meant for unfenced reference measurements and
    /// for tests that show the fence is needed.
    ///
    /// # Errors
    ///
    /// As [`Replayable::replay`].
    pub unsafe fn replay_unfenced(&mut self, runner: RunnerId, stream: &B::Stream) -> Result<()> {
        let slot = self.slot(runner)?;
        let Some(graph) = self.runners[slot].graph.as_ref() else {
            return Err(self.no_graph(slot, runner));
        };
        let op = Operation::Replay(runner);
        let _entered = enter_replay(&self.backend, stream, op)?;
        // Before the launch went out, a failure may be a program's capture
        // of the stream; after it, it is the failure (the graph ran).
        let refused = |error| match refused_by_capture(&self.backend, stream, op) {
            Some(capturing) => ReplayError::StreamCapturing(capturing),
            None => ReplayError::from(op.failed(error)),
        };
        let failed = |error| ReplayError::from(op.failed(error));
        let record = &self.plan.runners[slot].record;
        // The handoffs' own events, whatever recorded them last: nothing is
        // tracked.
        let event = |h: &HandoffId| self.fence.event(self.fence.handoff_slot(*h));
        for e in record.reads.iter().filter_map(event) {
            self.backend.wait_event(stream, e).map_err(refused)?;
        }
        // SAFETY: the caller's contract above.
        unsafe { self.backend.launch(graph, stream) }.map_err(refused)?;
        let unready = record.writes.iter().filter(|&&h| !self.fence.is_ready(h));
        for e in unready.filter_map(event) {
            self.backend.record_event(stream, e).map_err(failed)?;
        }
        Ok(())
    }

    /// Runs asynchronous work that reads `runner`'s views outside its graph
    /// (a reduce-scatter on another stream, say) inside the runner's fence:
    /// `stream` first waits for the runner's latest replay, `work` enqueues
    /// the work, and every later replay that overwrites those bytes waits
    /// for it, even when `work` fails or panics after enqueuing.
    ///
    /// # Errors
    ///
    /// [`ConsumeError::NotReplayed`] before the runner's first replay,
    /// [`ConsumeError::Overwritten`] naming the runner that claimed its
    /// bytes since its latest replay (`work` is not called then);
    /// [`ConsumeError::Work`] with the closure's own error.
    ///
    /// ```
    /// use replay_arena::{Discovering, PlanConfig, Policy, Request, Domain, DType, RunnerId};
    /// use replay_arena::ConsumeError;
    /// use replay_arena::sim;
    ///
    /// let req = Request::new(Domain::Device, DType::F32, 64);
    /// let runners = (0..2).map(|r| (RunnerId(r), [req]));
    /// let planned = Discovering::from_runners(PlanConfig::new(), runners)?
    ///     .plan(Policy::Generations(1))?; // both runners share one arena
    /// let sim = sim::Device::new();
    /// let (pool, side) = (sim.new_stream(), sim.new_stream());
    /// let mut capturing = planned.allocate(sim.clone())?;
    /// for r in 0..2 {
    ///     let cap = capturing.capture(RunnerId(r))?;
    ///     let view = cap.take(req)?;
    ///     cap.stream_capture(&pool, |s| sim.launch(s, sim::Kernel::fill(&view, r as f32), 5))?;
    ///     cap.finish()?;
    /// }
    /// let mut replayable = capturing.seal()?;
    /// let main_grad = sim.alloc_f32(64)?;
    ///
    /// replayable.replay(RunnerId(0), &pool)?;
    /// replayable.consume(RunnerId(0), &side, |s, views| {
    ///     sim.launch(s, sim::Kernel::add(&views[0], &main_grad), 20) // waits for the replay
    /// })?;
    /// replayable.replay(RunnerId(1), &pool)?; // waits for the consumer
    ///
    /// // Runner 0's bytes now hold runner 1's gradient: too late to consume.
    /// let late = replayable.consume(RunnerId(0), &side, |_, _| Ok::<(), String>(()));
    /// assert!(matches!(
    ///     late,
    ///     Err(ConsumeError::Overwritten { by: RunnerId(1), .. })
    /// ));
    /// # Ok::<(), replay_arena::Error>(())
    /// ```
    pub fn consume<E>(
        &mut self,
        runner: RunnerId,
        stream: &B::Stream,
        work: impl FnOnce(&B::Stream, &[View<'_, ReadOnly>]) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), ConsumeError<E>> {
        let slot = self.slot(runner)?;
        self.consume_slots(&[slot], stream, ScopeKind::Read, |s, views| {
            work(s, views[0])
        })
    }

    /// [`Replayable::consume`] for a consumer that also *writes* the
    /// runner's views (a reduce-scatter into a plan output view, say). It
    /// waits for the runner's replay and for every consumer of it since,
    /// and every later user of the bytes (consumers included) waits for it.
    /// A plain `consume` may only read: writing its views is refused
    /// ([`ConsumeError::ViewOutOfScope`]), since consumers on other streams
    /// read them at the same time.
    ///
    /// For a runner with inputs the program stages
    /// ([`Purpose::Input`](crate::Purpose::Input)), this is how they are
    /// written, also before the runner's first replay and after another
    /// runner (of its bucket or another) took its bytes: `stream` then
    /// first waits for every user of those bytes, and the runner owns them
    /// from the write on (its next replay waits for the write; a replay of
    /// it while another runner owns them is
    /// [`ReplayError::InputNotStaged`]).
    ///
    /// # Errors
    ///
    /// As [`Replayable::consume`].
    pub fn consume_mut<E>(
        &mut self,
        runner: RunnerId,
        stream: &B::Stream,
        work: impl FnOnce(&B::Stream, &[View<'_, ReadWrite>]) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), ConsumeError<E>> {
        let slot = self.slot(runner)?;
        self.consume_slots(&[slot], stream, ScopeKind::Write, |s, views| {
            work(s, views[0])
        })
    }

    /// [`Replayable::consume`] over several runners at once: one consumer
    /// (a bucketed reduce-scatter over the wgrads of several layers, say)
    /// reads the views of every runner in `runners`; `work` gets them in
    /// that order, one slice per runner. The stream waits for each runner's
    /// latest replay, and every later claimer of any of those bytes waits
    /// for the consumer.
    ///
    /// # Errors
    ///
    /// As [`Replayable::consume`], for the first runner that fails a check
    /// (nothing is enqueued then).
    ///
    /// ```
    /// use replay_arena::{Discovering, PlanConfig, Policy, Request, Domain, DType, RunnerId};
    /// use replay_arena::sim;
    ///
    /// let req = Request::new(Domain::Device, DType::F32, 64);
    /// let rs = (0..3).map(|r| (RunnerId(r), [req]));
    /// let planned = Discovering::from_runners(PlanConfig::new(), rs)?.plan(Policy::Generations(3))?;
    /// let sim = sim::Device::new();
    /// let (pool, side) = (sim.new_stream(), sim.new_stream());
    /// let mut capturing = planned.allocate(sim.clone())?;
    /// for r in 0..3 {
    ///     let cap = capturing.capture(RunnerId(r))?;
    ///     let v = cap.take(req)?;
    ///     cap.stream_capture(&pool, |s| sim.launch(s, sim::Kernel::fill(&v, 1.0 + r as f32), 5))?;
    ///     cap.finish()?;
    /// }
    /// let mut replayable = capturing.seal()?;
    /// for r in 0..3 {
    ///     replayable.replay(RunnerId(r), &pool)?;
    /// }
    /// let bucket = sim.alloc_f32(64)?;
    /// replayable.consume_many(&[RunnerId(0), RunnerId(2)], &side, |s, runners| {
    ///     for views in runners {
    ///         sim.launch(s, sim::Kernel::add(&views[0], &bucket), 10)?;
    ///     }
    ///     Ok::<(), replay_arena::BackendError>(())
    /// })?;
    /// assert_eq!(sim.read_f32(&bucket)?[0], 4.0);
    /// # Ok::<(), replay_arena::Error>(())
    /// ```
    pub fn consume_many<E>(
        &mut self,
        runners: &[RunnerId],
        stream: &B::Stream,
        work: impl FnOnce(&B::Stream, &[&[View<'_, ReadOnly>]]) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), ConsumeError<E>> {
        let slots = runners
            .iter()
            .map(|&r| self.slot(r))
            .collect::<Result<Vec<_>, _>>()?;
        self.consume_slots(&slots, stream, ScopeKind::Read, work)
    }

    /// The first runner of a consumer of `slots`, all of one bucket.
    pub(crate) fn consumer_of(&self, slots: &[usize]) -> Result<RunnerId, ConsumeError> {
        let &head = slots.first().ok_or(ConsumeError::NoRunners)?;
        let runner = self.plan.runners[head].id();
        let bucket = self.plan.runners[head].record.bucket;
        let stray = slots.iter().map(|&s| &self.plan.runners[s].record);
        if let Some(other) = stray.into_iter().find(|r| r.bucket != bucket) {
            return Err(ConsumeError::CrossBucket {
                runner,
                bucket,
                other: other.id,
                other_bucket: other.bucket,
            });
        }
        Ok(runner)
    }

    /// A consumer of the runners in `slots` (see `consume`); `kind` says
    /// whether it may write their views.
    fn consume_slots<A: Access, E>(
        &mut self,
        slots: &[usize],
        stream: &B::Stream,
        kind: ScopeKind,
        work: impl FnOnce(&B::Stream, &[&[View<'_, A>]]) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), ConsumeError<E>> {
        let first = self.consumer_of(slots).map_err(ConsumeError::with_work)?;
        let plan = &self.plan;
        // The views work on the device only inside `work`, on `stream`; no
        // capture of any thread may record `stream` meanwhile.
        let entered = enter_scope(&self.backend, stream, Operation::Consume(first), kind)?;
        let Some((scope, open)) = entered.scope() else {
            return Err(StreamCapturing {
                op: Operation::Consume(first),
            }
            .into());
        };
        for &slot in slots {
            for v in &mut self.views[self.runners[slot].views.clone()] {
                v.scope = scope;
            }
        }
        let (views, runners) = (&self.views, &self.runners);
        let consumed = self.fence.consume(
            &self.backend,
            plan,
            slots,
            entered.on,
            kind == ScopeKind::Write,
            || {
                let one;
                let many: Vec<&[View<'_, A>]>;
                let lists: &[&[View<'_, A>]] = if let [slot] = slots {
                    one = [View::slice_with_access(
                        &views[runners[*slot].views.clone()],
                    )];
                    &one
                } else {
                    many = slots
                        .iter()
                        .map(|&slot| View::slice_with_access(&views[runners[slot].views.clone()]))
                        .collect();
                    &many
                };
                let out = work(stream, lists);
                let misuse = open.scope().take_misuse();
                entered.close_views();
                let succeeded = out.is_ok() && misuse.is_none();
                ((out, misuse), succeeded)
            },
        );
        drop(entered);
        for &slot in slots {
            for v in &mut self.views[self.runners[slot].views.clone()] {
                v.scope = 0;
            }
        }
        let (out, misuse) = consumed.map_err(ConsumeError::with_work)?;
        if let Some(reason) = misuse {
            return Err(ConsumeError::ViewOutOfScope {
                runner: first,
                reason,
            });
        }
        out.map_err(ConsumeError::Work)
    }

    /// Makes `stream` wait for `runner`'s latest replay and every consumer
    /// of it since (the reduce-scatter a consumer enqueued, say), without
    /// blocking the host: the program's own work on `stream` then sees what
    /// they wrote. For a runner that reads handoffs, also for the latest
    /// reads of those handoffs (every reader's). Nothing is issued when
    /// stream order already implies it; a runner never replayed (or with
    /// no bytes and no handoffs) has nothing to wait for.
    ///
    /// # Errors
    ///
    /// [`WaitError::UnknownRunner`], [`WaitError::StreamCapturing`], or
    /// [`WaitError::Backend`].
    ///
    /// ```
    /// use replay_arena::{Discovering, PlanConfig, Policy, Request, Domain, DType, RunnerId};
    /// use replay_arena::sim;
    ///
    /// let req = Request::new(Domain::Device, DType::F32, 64);
    /// let planned = Discovering::from_runners(PlanConfig::new(), [(RunnerId(0), [req])])?
    ///     .plan(Policy::Generations(1))?;
    /// let sim = sim::Device::new();
    /// let (pool, side, optimizer) = (sim.new_stream(), sim.new_stream(), sim.new_stream());
    /// let mut capturing = planned.allocate(sim.clone())?;
    /// let cap = capturing.capture(RunnerId(0))?;
    /// let view = cap.take(req)?;
    /// cap.stream_capture(&pool, |s| sim.launch(s, sim::Kernel::fill(&view, 2.0), 5))?;
    /// cap.finish()?;
    /// let mut replayable = capturing.seal()?;
    /// let main_grad = sim.alloc_f32(64)?;
    /// replayable.replay(RunnerId(0), &pool)?;
    /// replayable.consume(RunnerId(0), &side, |s, v| sim.launch(s, sim::Kernel::add(&v[0], &main_grad), 50))?;
    /// replayable.wait_for(RunnerId(0), &optimizer)?; // after the consumer's add
    /// sim.launch(&optimizer, sim::Kernel::scale(&main_grad, 0.5), 1)?;
    /// assert!(sim.hazards().is_empty());
    /// # Ok::<(), replay_arena::Error>(())
    /// ```
    #[doc(alias = "cuStreamWaitEvent")]
    pub fn wait_for(&mut self, runner: RunnerId, stream: &B::Stream) -> Result<(), WaitError> {
        let slot = self.slot(runner)?;
        let entered = enter(&self.backend, stream, Operation::WaitFor(runner))?;
        self.fence
            .wait_for_runner(&self.backend, &self.plan, slot, entered.on)
            .map_err(|error| Operation::WaitFor(runner).failed(error).into())
    }

    /// Makes `stream` wait for everything replayed and consumed so far:
    /// every runner's latest replay and its consumers (the optimizer step
    /// after every reduce-scatter). Does not block the host.
    ///
    /// # Errors
    ///
    /// [`WaitError::StreamCapturing`], or [`WaitError::Backend`].
    #[doc(alias = "cuStreamWaitEvent")]
    pub fn wait_all(&mut self, stream: &B::Stream) -> Result<(), WaitError> {
        let entered = enter(&self.backend, stream, Operation::WaitAll)?;
        self.fence
            .wait_all(&self.backend, entered.on)
            .map_err(|error| Operation::WaitAll.failed(error).into())
    }

    /// The views `runner`'s capture handed out, in request order (same
    /// addresses), for work outside the graph.
    ///
    /// # Errors
    ///
    /// [`UnknownRunner`].
    pub fn views(&self, runner: RunnerId) -> Result<&[View<'_>], UnknownRunner> {
        let slot = self.slot(runner)?;
        Ok(&self.views[self.runners[slot].views.clone()])
    }

    /// Waits for all submitted work on the backend (not only the plan's).
    ///
    /// # Errors
    ///
    /// [`BackendFailure`] ([`Operation::Synchronize`](crate::Operation::Synchronize)).
    pub fn synchronize(&self) -> Result<(), BackendFailure> {
        self.backend
            .synchronize()
            .map_err(|e| Operation::Synchronize.failed(e))
    }

    /// Waits for every replay and consumer the fence ordered. When it
    /// cannot (a stream it must record on captures now and the backend
    /// cannot be waited for as a whole either, or a sticky device error),
    /// the graphs and arenas are leaked, not freed: nothing may be freed
    /// while work that uses it may still run.
    fn quiesce(&mut self) -> std::result::Result<(), BackendError> {
        let waited = self.fence.quiesce(&self.backend);
        if waited.is_err() {
            std::mem::forget(std::mem::take(&mut self.runners));
            std::mem::forget(std::mem::take(&mut self._arenas));
        }
        waited
    }

    /// After a shape change: waits for every replay and consumer the fence
    /// ordered, frees graphs, events and arenas, and returns a fresh
    /// discovery with the same config.
    ///
    /// # Errors
    ///
    /// [`BackendFailure`] ([`Operation::Replan`](crate::Operation::Replan))
    /// when waiting failed; then the graphs and
    /// arenas are leaked, since work that uses them may still run.
    #[doc(alias = "reset")]
    #[doc(alias = "teardown")]
    pub fn replan(mut self) -> Result<Discovering, BackendFailure> {
        let waited = self.quiesce();
        let config = self.plan.config.clone();
        drop(self);
        waited.map_err(|e| Operation::Replan.failed(e))?;
        Ok(Discovering::new(config))
    }
}

/// Traces: the fence's schedule as a timeline (`docs/trace.md`).
impl<B: Backend + Timing + 'static> Replayable<B> {
    /// The most uses [`Replayable::start_trace_with_capacity`] creates
    /// marks for up front (a trace creates more as it goes).
    pub const MAX_TRACE_CAPACITY: usize = 1 << 20;

    /// Starts a trace of everything the fence does from now on: each
    /// replay, consumer, step graph launch and program wait as a slice on
    /// its stream, bracketed by two timing marks ([`Timing`]: the sim's
    /// clock; on CUDA, timing events, which cost host time per launch), and
    /// each wait the fence makes or skips. A step graph launched while the
    /// trace runs also shows each of its replays and consumers inside the
    /// launch ([`Trace::step_nodes`]; such a launch runs a traced copy of
    /// the step graph: `docs/trace.md`, "Inside a step graph"). A trace already running starts
    /// over. The marks of 256 uses are created now (see
    /// [`Replayable::start_trace_with_capacity`]).
    ///
    /// # Errors
    ///
    /// [`TraceError::Backend`] when the backend cannot take the origin
    /// mark.
    ///
    /// ```
    /// use replay_arena::{Discovering, PlanConfig, Policy, Request, Domain, DType, RunnerId};
    /// use replay_arena::{sim, UseKind};
    ///
    /// let req = Request::new(Domain::Device, DType::F32, 64);
    /// let rs = (0..2).map(|r| (RunnerId(r), [req]));
    /// let planned = Discovering::from_runners(PlanConfig::new(), rs)?.plan(Policy::Generations(1))?;
    /// let sim = sim::Device::new();
    /// let (pool, side) = (sim.new_stream(), sim.new_stream());
    /// let mut capturing = planned.allocate(sim.clone())?;
    /// for r in 0..2 {
    ///     let cap = capturing.capture(RunnerId(r))?;
    ///     let v = cap.take(req)?;
    ///     cap.stream_capture(&pool, |s| sim.launch(s, sim::Kernel::fill(&v, 1.0), 10))?;
    ///     cap.finish()?;
    /// }
    /// let mut replayable = capturing.seal()?;
    /// let main = sim.alloc_f32(64)?;
    ///
    /// replayable.start_trace()?;
    /// replayable.replay(RunnerId(0), &pool)?;
    /// replayable.consume(RunnerId(0), &side, |s, v| sim.launch(s, sim::Kernel::add(&v[0], &main), 4))?;
    /// replayable.replay(RunnerId(1), &pool)?; // waits for the consumer on `side`
    /// let trace = replayable.finish_trace()?;
    ///
    /// let [replay0, consumer, replay1] = trace.uses() else { panic!() };
    /// assert_eq!(consumer.kind, UseKind::Consume { runners: vec![RunnerId(0)], writes: false });
    /// assert_eq!((consumer.start_us, consumer.end_us), (10.0, 14.0)); // sim ticks
    /// assert_eq!(replay1.waits[1].from, Some(1)); // the arrow from the consumer
    /// assert!(replay1.waits[0].skipped);           // runner 0: same stream
    /// # let _ = replay0;
    /// let json = trace.to_chrome_json();          // for ui.perfetto.dev
    /// assert!(json.contains(r#""name":"consume runner 0""#));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "profile")]
    #[doc(alias = "timeline")]
    pub fn start_trace(&mut self) -> Result<(), TraceError> {
        self.start_trace_with_capacity(256)
    }

    /// [`Replayable::start_trace`] with the marks of `uses` uses
    /// created now, before the work to trace (on CUDA, two timing events
    /// per slice; a trace that outgrows them creates more as it goes, at
    /// the cost of an event creation per mark in the traced work).
    /// `start_trace` creates them for 256 uses; at most
    /// [`Replayable::MAX_TRACE_CAPACITY`] are created up front.
    ///
    /// # Errors
    ///
    /// [`TraceError::CapacityTooLarge`] above that; otherwise as
    /// [`Replayable::start_trace`].
    pub fn start_trace_with_capacity(&mut self, uses: usize) -> Result<(), TraceError> {
        if uses > Self::MAX_TRACE_CAPACITY {
            return Err(TraceError::CapacityTooLarge {
                uses,
                max: Self::MAX_TRACE_CAPACITY,
            });
        }
        let name = self.backend.name();
        let recorder =
            Recorder::new(&self.backend, name, uses).map_err(|e| Operation::TraceMark.failed(e))?;
        self.fence.observe(Some(Box::new(recorder)));
        Ok(())
    }

    /// Ends the trace and returns it, each mark's time read (this waits for
    /// the traced work to complete).
    ///
    /// # Errors
    ///
    /// [`TraceError::NoTrace`] when none was started;
    /// [`TraceError::Backend`] when a mark failed (the traced work was
    /// not affected).
    #[doc(alias = "export_chrome_trace")]
    pub fn finish_trace(&mut self) -> Result<Trace, TraceError> {
        let observer = self.fence.observe(None).ok_or(TraceError::NoTrace)?;
        observer
            .finish(&self.backend)
            .map_err(|e| Operation::TraceMark.failed(e).into())
    }
}

/// The views of runner slot `slot`, in request order, in no scope.
pub(crate) fn views_of<'p, 'v, A: Arena>(
    plan: &'p Planned,
    arenas: &'p [A],
    slot: usize,
) -> impl Iterator<Item = View<'v>> + use<'p, 'v, A> {
    let r = &plan.runners[slot];
    // Discovery gives every request an offset and every key a slice, so
    // every request has a place: no view is skipped.
    r.record
        .requests
        .iter()
        .enumerate()
        .filter_map(move |(i, &request)| {
            let place = plan.place(slot, i)?;
            Some(View::new(
                arenas.get(place.arena)?.base() + place.offset,
                place.arena,
                place.offset,
                request,
                r.id(),
                0,
                None,
            ))
        })
}
