//! A compiled step: [`StepGraph`] launched through the plan it borrows,
//! and [`KeptStep`], launched through [`Replayable::launch_kept`].

use std::fmt;

use super::dry_run::{dry_fence, dry_pass, DryRun, Use};
use super::traced::{Events, Order, TracedCopy, Tracing};
use super::{ScheduleError, StepLaunchError};
use crate::backend::{Backend, Compose, Temporaries};
use crate::fence::{enter, BackendFailure, Held, Ledger, Operation};
use crate::fence::{ReplayError, WaitError};
use crate::replay::Replayable;
use crate::report::StepGraphMemory;
use crate::trace::UseKind;
use crate::vocab::RunnerId;

/// Phase 5 of 5: one step of a plan, compiled into one graph
/// ([`Replayable::step`]). Each [`StepGraph::launch`] runs the whole step:
/// every replay and consumer of the schedule, ordered by exactly the waits
/// the fence makes for that schedule in steady state, after the previous
/// launch. It borrows the plan; each launch brings the plan's fence to
/// what the step leaves before it launches, so nothing rests on its drop
/// (which waits for its last launch and frees it). [`StepGraph::keep`]
/// makes it a [`KeptStep`] that borrows nothing, for a step graph per
/// shape bucket launched whichever the next batch needs.
pub struct StepGraph<'r, B: Compose> {
    pub(super) core: StepCore<B>,
    pub(super) replayable: &'r mut Replayable<B>,
}

/// A step graph apart from the plan: its graphs, events and what it
/// leaves the fence.
pub(super) struct StepCore<B: Backend> {
    /// One graph, or two launched in turn ([`StepBuilder::build_overlapping`](super::StepBuilder::build_overlapping)).
    /// Dropped before the events their nodes wait for and record.
    pub(super) graphs: Vec<B::Graph>,
    /// What a launch made while a trace runs composes its traced copy
    /// from, the copies launched (dropped before the events), and the
    /// order between compositions.
    pub(super) tracing: Tracing<B>,
    /// The overlapping graphs' events, held for their nodes (dropped after
    /// the graphs).
    pub(super) events: Events<B>,
    /// Overlapping: recorded where the first launch's stream has waited
    /// for everything the fence knew of, for the second launch to wait for
    /// (it waits for the first launch node by node).
    pub(super) start: Option<B::Event>,
    /// Recorded after a launch for `wait_all` and drop.
    pub(super) done: B::Event,
    /// Who last used which bytes after a step: the part of the ledger the
    /// step can meet.
    pub(super) ledger: Ledger,
    /// What the latest dry run of the schedule held (the build's, or a
    /// launch's after the fence changed): in proportion to the step.
    pub(super) held: Held,
    /// Fence slots the step uses, ascending.
    pub(super) touched: Vec<usize>,
    /// The stream of the latest launch.
    pub(super) launched: Option<(B::Stream, u64)>,
    pub(super) launches: u64,
    /// Launches since the fence last changed under the step graph: at 0,
    /// the next launch waits for everything the fence knows of.
    pub(super) since: u64,
    /// Launches in turn: which of two overlapping graphs is next.
    pub(super) turn: u64,
    /// The plan's fence epoch when the step graph last changed it (or was
    /// built): anything else the fence did since resets `since`.
    pub(super) epoch: u64,
    /// The schedule, to bring the ledger to the fence's state after a reset.
    pub(super) uses: Vec<Use>,
    pub(super) lanes: usize,
    /// What one launch holds of the driver's graph memory, estimated.
    pub(super) graph_memory: u64,
    pub(super) nodes: usize,
    pub(super) edges: usize,
    /// Staged runners whose bytes the step's own replays take, with the
    /// runner that takes them: the program stages them (`consume_mut`)
    /// between launches, so a launch right after the step's own is refused
    /// (`ReplayError::InputNotStaged`).
    pub(super) restaged: Vec<(RunnerId, RunnerId)>,
    /// Step graphs built from the plan before this one: its name in a
    /// trace (`step graph 1 launch 4`).
    pub(super) number: u64,
}

impl<B: Compose> fmt::Debug for StepGraph<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.core.debug("StepGraph", f)
    }
}

impl<B: Backend> StepCore<B> {
    fn held(&self) -> (usize, usize) {
        (self.held.slots, self.held.ledger)
    }

    /// What its graphs allocate as temporaries, summed over the graphs,
    /// and what that holds of the driver's graph memory ([`StepGraphMemory`]).
    fn graph_memory(&self, backend: &B) -> Result<StepGraphMemory, BackendFailure> {
        let temporaries = (self.graphs.iter())
            .try_fold(Temporaries::default(), |sum, g| {
                backend.graph_temporaries(g).map(|t| sum.and(t))
            })
            .map_err(|e| Operation::Report.failed(e))?;
        let granule = backend.graph_memory_granule();
        Ok(StepGraphMemory {
            temporaries,
            lanes: self.lanes,
            granule,
            bytes: self.graph_memory.saturating_mul(self.graphs.len() as u64),
        })
    }

    fn debug(&self, name: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(name)
            .field("graphs", &self.graphs.len())
            .field("events", &self.events.len())
            .field("nodes", &self.nodes)
            .field("edges", &self.edges)
            .field("launches", &self.launches)
            .finish_non_exhaustive()
    }

    /// The part of the ledger the step leaves when launched from the
    /// fence's state now: one pass of its schedule from there (every byte
    /// the step uses goes to its users; the rest stays as the fence has
    /// it), and what that dry run held.
    fn ledger_from(&self, r: &Replayable<B>) -> Result<(Ledger, Held), ScheduleError> {
        let dry = DryRun::new(self.lanes, self.nodes, false);
        let mut fence = dry_fence(&r.fence, &dry, &r.plan, &self.uses);
        dry.begin_pass(0, 0..self.lanes);
        dry_pass(&mut fence, &dry, &r.plan, &self.uses, 0)?;
        let held = fence.held();
        Ok((fence.into_ledger(), held))
    }
}

impl<B: Compose> StepCore<B> {
    fn launch(&mut self, r: &mut Replayable<B>, stream: &B::Stream) -> Result<(), StepLaunchError> {
        // No capture of any thread may begin on `stream` until the launch
        // is enqueued (it would go into its graph).
        let entered = enter(&r.backend, stream, Operation::StepLaunch)?;
        let on = entered.on;
        // Anything else the fence did since this step graph's latest launch
        // (or its build): the next launch is a first one again, from the
        // fence's state now.
        let reset = r.fence.epoch() != self.epoch;
        self.check_fence(r, reset)?;
        // While a trace runs: a traced copy of the step graph, launched in
        // place of its own composition, and ordered after the launch before
        // as another executable graph must be (`traced.rs`).
        let x = (self.turn % self.graphs.len() as u64) as usize;
        let traced = self.tracing.prepare(r, &self.uses, &self.events, x);
        let order = self.tracing.order(x, traced.is_some());
        let since = if reset || order == Order::Everything {
            0
        } else {
            self.since
        };
        // The first launch waits for everything the fence knew of; the
        // second (of overlapping graphs) for the same, recorded then, or
        // for that and the whole first launch.
        let everything =
            since == 0 || (since == 1 && self.start.is_none() && self.graphs.len() > 1);
        let (start, backend) = (&self.start, &r.backend);
        let after = self.tracing.after(x, order);
        let before = || {
            match (since, start) {
                (0, Some(start)) => backend.record_event(stream, start),
                (1, Some(start)) => backend.wait_event(stream, start),
                _ => Ok(()),
            }?;
            after.map_or(Ok(()), |after| backend.wait_event(stream, after))
        };
        let kind = UseKind::StepLaunch {
            step: self.number,
            launch: self.launches,
            graph: x,
        };
        // A later launch on the same stream with nothing in between leaves
        // the state the one before left: nothing to absorb.
        let moved = reset || self.launched.as_ref().map(|(_, id)| *id) != Some(on.id);
        let graph = match &traced {
            Some((copy, _)) => copy,
            None => &self.graphs[x],
        };
        // SAFETY: the step graph's edges are the fence's waits for its
        // schedule; its first launch (and the first after anything else the
        // fence did) waited for everything the fence knew of, and each later
        // one runs after the one before (launches of one executable graph
        // are serialized), or, for two graphs in turn, waits node by node
        // for what the fence makes it wait for in the other's launch before
        // it and completes only after that launch completed (its end), the
        // same graph's launch before that being serialized; once it went
        // out, the fence orders every later user of the plan's bytes after
        // it before this returns; nothing else uses the plan meanwhile
        // (`&mut`). A launch that follows a launch of another composition
        // (a traced copy, or the step graph's own after one) waited for it
        // whole in `before`, or for everything the fence knew of.
        let launch = || unsafe { backend.launch(graph, stream) };
        let launched = r.fence.launch_step(
            backend,
            on,
            everything,
            before,
            launch,
            moved.then_some((&self.ledger, self.touched.as_slice())),
            kind,
        );
        if let Err(error) = launched {
            // A reused traced copy may still run its launch before.
            if let Some((copy, _)) = traced {
                self.tracing.hold(copy);
            }
            return Err(Operation::StepLaunch.failed(error).into());
        }
        self.launched_on(r, traced, x, (stream, on.id), since);
        Ok(())
    }

    /// Before a launch: after a reset (`reset`: the fence changed since
    /// the step's latest launch or build), the ledger the step leaves is
    /// what one pass of its schedule from the fence's state now gives
    /// (kept even if the launch fails: the fence's epoch does not move
    /// then, so the next launch resets again). Otherwise, after a launch
    /// of its own, the step is refused if it took staged runners' bytes
    /// (they were not staged since).
    fn check_fence(&mut self, r: &Replayable<B>, reset: bool) -> Result<(), StepLaunchError> {
        if reset {
            (self.ledger, self.held) = self.ledger_from(r)?;
        } else if self.launches > 0 {
            // The fence is as this step's own latest launch left it.
            if let Some(&(runner, by)) = self.restaged.first() {
                let error = ReplayError::InputNotStaged {
                    runner,
                    by: Some(by),
                };
                return Err(ScheduleError::Replay(error).into());
            }
        }
        Ok(())
    }

    /// After graph `x` (or its traced copy, `traced`) went out on
    /// `stream` (with its id), `since` launches after the fence last
    /// changed under the step graph: the trace learns the traced copy's
    /// nodes, and the step graph its latest launch.
    fn launched_on(
        &mut self,
        r: &mut Replayable<B>,
        traced: Option<TracedCopy<B>>,
        x: usize,
        (stream, id): (&B::Stream, u64),
        since: u64,
    ) {
        match traced {
            Some((copy, nodes)) => {
                if let Some(observer) = r.fence.observer() {
                    observer.step_nodes(nodes);
                }
                self.tracing.launched_traced(&r.backend, x, copy, stream);
            }
            None => self.tracing.launched_own(x),
        }
        self.launched = Some((stream.clone(), id));
        self.launches += 1;
        self.since = since + 1;
        self.turn += 1;
        self.epoch = r.fence.epoch();
    }

    fn wait_all(&self, b: &B, stream: &B::Stream) -> Result<(), WaitError> {
        let Some((last, _)) = &self.launched else {
            return Ok(());
        };
        // No capture may take the record or the wait into its graph.
        let _last = enter(b, last, Operation::StepWait)?;
        let _on = enter(b, stream, Operation::StepWait)?;
        b.record_event(last, &self.done)
            .and_then(|()| b.wait_event(stream, &self.done))
            .map_err(|error| Operation::StepWait.failed(error).into())
    }

    /// Waits for the latest launch before the graphs are freed.
    fn wait_last(&mut self, b: &B) {
        let Some((stream, _)) = self.launched.take() else {
            return;
        };
        // The record goes on the launch's stream, entered as any wait: a
        // capture there refuses it (the host then waits for everything).
        let waited = enter(b, &stream, Operation::StepWait)
            .map_err(|_| ())
            .and_then(|_entered| {
                b.record_event(&stream, &self.done)
                    .and_then(|()| b.synchronize_event(&self.done))
                    .map_err(|_| ())
            });
        if waited.is_err() {
            let _ = b.synchronize();
        }
    }
}

impl<'r, B: Compose> StepGraph<'r, B> {
    /// Launches the whole step on `stream`: after what `stream` holds and
    /// after the previous launch; the first launch also waits for every
    /// replay and consumer the fence knew of.
    ///
    /// The plan's fence learns what the launch leaves *before* the launch
    /// (every byte the step uses completes at the tail of `stream`), so
    /// every later replay, consumer, `replan` and teardown is ordered after
    /// it, even if this step graph is never dropped (`mem::forget`).
    ///
    /// # Errors
    ///
    /// [`StepLaunchError::StreamCapturing`] when `stream` is capturing
    /// (inside a `stream_capture` closure, or the program's own capture);
    /// [`StepLaunchError::Backend`] with the backend's error (nothing of
    /// the step was enqueued).
    pub fn launch(&mut self, stream: &B::Stream) -> Result<(), StepLaunchError> {
        self.core.launch(self.replayable, stream)
    }

    /// Makes `stream` wait for the latest launch (the optimizer step after
    /// every replay and consumer of the step), without blocking the host.
    ///
    /// # Errors
    ///
    /// [`WaitError::StreamCapturing`], or [`WaitError::Backend`] with the
    /// backend's error.
    pub fn wait_all(&self, stream: &B::Stream) -> Result<(), WaitError> {
        self.core.wait_all(&self.replayable.backend, stream)
    }

    /// The backend's composed graphs, to inspect (one, or two launched in
    /// turn: [`StepBuilder::build_overlapping`](crate::StepBuilder::build_overlapping)),
    /// as [`Replayable::graph`] gives a runner's: with CUDA, whether one
    /// has its executable graph yet
    /// (`cuda::Graph::is_instantiated`, false until the first launch with
    /// lazy instantiation).
    pub fn graphs(&self) -> &[B::Graph] {
        &self.core.graphs
    }

    /// Graphs in the step graph: one per replay (two for a writer split at
    /// its ready point) and one per consumer.
    pub fn nodes(&self) -> usize {
        self.core.nodes
    }

    /// Dependency edges between them (the fence's waits, and stream order),
    /// with those on the step before for overlapping step graphs.
    pub fn edges(&self) -> usize {
        self.core.edges
    }

    /// What the step graph allocates as temporaries (the moved-in graphs'
    /// memory nodes, now its own: [`Capture::graph_temporaries`](crate::backend::Capture::graph_temporaries)),
    /// and what it holds of the driver's graph memory, estimated
    /// ([`StepGraphMemory`]). The device holds the larger of this and the
    /// plan's per-runner graphs' share ([`Replayable::graph_memory`]), not
    /// their sum: graphs that do not run at once share physical memory.
    ///
    /// # Errors
    ///
    /// [`BackendFailure`] ([`Operation::Report`]) when the backend cannot
    /// inspect the graph.
    pub fn graph_memory(&self) -> Result<StepGraphMemory, BackendFailure> {
        self.core.graph_memory(&self.replayable.backend)
    }

    /// Whether two graphs launch in turn ([`StepBuilder::build_overlapping`](super::StepBuilder::build_overlapping)).
    pub fn is_overlapping(&self) -> bool {
        self.core.graphs.len() > 1
    }

    /// Launches so far.
    pub fn launches(&self) -> u64 {
        self.core.launches
    }

    /// What the latest dry run of the schedule held (its build's, or that
    /// of a launch after the plan's fence changed): (fence slots, ledger
    /// entries). In proportion to the step, not to the plan: what pins
    /// the cost of building a step graph per bucket.
    #[doc(hidden)]
    pub fn dry_run_held(&self) -> (usize, usize) {
        self.core.held()
    }

    /// Step graphs built from the plan before this one (the first is 0):
    /// its launches' name in a trace, `step graph {number} launch {k}`
    /// ([`UseKind::StepLaunch`]), kept when it is kept.
    pub fn number(&self) -> u64 {
        self.core.number
    }

    /// The plan (read-only while the step graph lives).
    pub fn replayable(&self) -> &Replayable<B> {
        self.replayable
    }

    /// Gives the plan back and keeps the step graph as a [`KeptStep`],
    /// launched with [`Replayable::launch_kept`]: several of them (one per
    /// shape bucket, say) live beside per-runner replays and consumers, and
    /// a program launches whichever the next batch needs. The first launch
    /// after anything else used the plan waits for everything the fence
    /// knows of (a bucket switch), later ones only for the launch before.
    pub fn keep(self) -> KeptStep<B>
    where
        B: Clone,
    {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is never dropped; each field is read out once.
        let (core, replayable) =
            unsafe { (std::ptr::read(&this.core), std::ptr::read(&this.replayable)) };
        // The buckets of the runners it uses, each with the capture it
        // was built from (`buckets.rs`).
        let plan = &replayable.plan;
        let buckets = (core.touched.iter())
            .filter_map(|&slot| plan.runners.get(slot).map(|r| r.record.bucket));
        KeptStep {
            captures: replayable.buckets.captures(buckets),
            core,
            plan: replayable.id,
            backend: replayable.backend.clone(),
        }
    }
}

impl<B: Compose> Drop for StepGraph<'_, B> {
    fn drop(&mut self) {
        // The fence already orders everything after the launches (see
        // `launch`); the step graph is freed now, so wait for its last
        // launch first. Skipping this (`mem::forget`) leaks the graph and
        // nothing else.
        self.core.wait_last(&self.replayable.backend);
    }
}

/// A step graph its plan no longer lends itself to ([`StepGraph::keep`]):
/// launched with [`Replayable::launch_kept`], which checks that it is that
/// plan's, while per-runner replays, consumers and other kept step graphs
/// of the plan go on. Dropping it waits for its latest launch and frees
/// its graphs; forgetting it leaks them and its own events, nothing of the
/// plan (the plan's fence orders every later use after its launches).
pub struct KeptStep<B: Compose + Clone> {
    core: StepCore<B>,
    /// The `Replayable` it was built for.
    plan: u64,
    /// The buckets it uses, with the capture of each it was built from.
    captures: Vec<(crate::vocab::BucketId, u64)>,
    backend: B,
}

impl<B: Compose + Clone> fmt::Debug for KeptStep<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.core.debug("KeptStep", f)
    }
}

impl<B: Compose + Clone> KeptStep<B> {
    /// Launches so far.
    pub fn launches(&self) -> u64 {
        self.core.launches
    }

    /// Its number among the plan's step graphs ([`StepGraph::number`]):
    /// kept step graphs of different buckets have names of their own in a
    /// trace (`step graph 0 launch 3`, `step graph 1 launch 3`).
    pub fn number(&self) -> u64 {
        self.core.number
    }

    /// The backend's composed graphs ([`StepGraph::graphs`]).
    pub fn graphs(&self) -> &[B::Graph] {
        &self.core.graphs
    }

    /// Graphs in the step graph ([`StepGraph::nodes`]).
    pub fn nodes(&self) -> usize {
        self.core.nodes
    }

    /// As [`StepGraph::graph_memory`].
    ///
    /// # Errors
    ///
    /// As [`StepGraph::graph_memory`].
    pub fn graph_memory(&self) -> Result<StepGraphMemory, BackendFailure> {
        self.core.graph_memory(&self.backend)
    }

    /// As [`StepGraph::dry_run_held`].
    #[doc(hidden)]
    pub fn dry_run_held(&self) -> (usize, usize) {
        self.core.held()
    }
}

impl<B: Compose + Clone> Drop for KeptStep<B> {
    fn drop(&mut self) {
        self.core.wait_last(&self.backend);
        // It may outlive its plan, whose teardown gave back the graph
        // memory no graph of the plan held then: the step copies moved in
        // here held theirs until now. Freed now, so given back now (best
        // effort, as at teardown).
        self.core.graphs.clear();
        self.core.tracing.free();
        let _ = self.backend.trim_graph_memory();
    }
}

impl<B: Compose + Clone> Replayable<B> {
    /// Launches a kept step graph of this plan on `stream`, as
    /// [`StepGraph::launch`] does. When anything else used the plan since
    /// its latest launch (a per-runner replay, a consumer, another step
    /// graph), it first waits on `stream` for everything the fence knows of
    /// and takes the fence's state from there; otherwise it runs after its
    /// own launch before.
    ///
    /// # Errors
    ///
    /// [`StepLaunchError::ForeignStep`] for a step graph of another plan;
    /// as [`StepGraph::launch`]; [`StepLaunchError::Schedule`] for a check
    /// the fence makes on the schedule from its state now (a consumer of a
    /// runner another bucket's replay overwrote since, say:
    /// [`ConsumeError::Overwritten`](crate::ConsumeError::Overwritten)).
    pub fn launch_kept(
        &mut self,
        step: &mut KeptStep<B>,
        stream: &B::Stream,
    ) -> Result<(), StepLaunchError> {
        if step.plan != self.id {
            return Err(StepLaunchError::ForeignStep);
        }
        if let Some(bucket) = self.buckets.released_of(&step.captures) {
            return Err(StepLaunchError::Released { bucket });
        }
        step.core.launch(self, stream)?;
        self.buckets.stepped(&step.captures, self.fence.epoch());
        Ok(())
    }

    /// Makes `stream` wait for the latest launch of a kept step graph.
    ///
    /// # Errors
    ///
    /// [`WaitError::ForeignStep`] for a step graph of another plan; as
    /// [`StepGraph::wait_all`].
    pub fn wait_kept(&self, step: &KeptStep<B>, stream: &B::Stream) -> Result<(), WaitError> {
        if step.plan != self.id {
            return Err(WaitError::ForeignStep);
        }
        step.core.wait_all(&self.backend, stream)
    }
}
