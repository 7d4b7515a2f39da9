//! Phase 5: [`StepGraph`]. One step's fixed schedule (which runner replays
//! on which stream, which consumers run where, in what order) compiled into
//! one graph and launched with one call.
//!
//! The schedule is run through the same fence code a per-runner replay
//! uses, on a *dry* backend whose streams are the schedule's streams and
//! whose graphs are the step graph's nodes: the dry fence records every
//! completion at once, marking the node that ends it, and every wait it
//! issues becomes a dependency of the next node on the waiting stream.
//! The steady state's waits, with stream order, are the step graph's
//! edges. A schedule that reads only what it wrote (each handoff a replay
//! reads written by an earlier replay of it, each runner a consumer reads
//! replayed earlier in it, no staged inputs) is in its steady state from
//! its first pass; any other schedule takes a second pass, which also
//! checks that it can be launched again (one that reads a handoff it never
//! writes is refused there). Waits on the step before are implied:
//! launches of one executable graph run one after another.
//!
//! A writer that marks handoffs ready ([`RunnerCapture::ready`]) is split
//! at each of those points into one node per part, so a reader starts at
//! its handoff's ready point, as it does when replayed per runner: its
//! graph is split, or, for a runner whose graph allocates, its step copy
//! comes in the parts its capture was cut in.
//!
//! [`RunnerCapture::ready`]: crate::RunnerCapture::ready

use std::fmt;

use crate::backend::{BackendError, Compose};
use crate::capture::{capture_work, Uncaptured};
use crate::fence::{
    BackendFailure, ConsumeError, Operation, Refused, ReplayError, StreamCapturing, UnknownRunner,
};
use crate::replay::Replayable;
use crate::scope::{new_scope_id, ScopeKind, StreamBusy};
use crate::view::{Access, ReadOnly, ReadWrite, View};
use crate::vocab::RunnerId;

mod dry_run;
mod traced;
mod graph;
mod compile;

pub use graph::{KeptStep, StepGraph};

/// What building a step schedule returns on failure:
/// [`StepBuilder::replay`], [`StepBuilder::build`] and
/// [`StepBuilder::build_overlapping`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StepError {
    /// The schedule has no replay and no consumer.
    #[error("the step schedules nothing: replay a runner or run a consumer first")]
    Empty,
    /// The runner was never discovered.
    #[error("{runner} was not discovered, so the plan has no graph for it")]
    UnknownRunner {
        /// The runner.
        runner: RunnerId,
    },
    /// The runner has no captured graph (a runner that uses no buffers and
    /// was not captured).
    #[error("{runner} has no captured graph to schedule")]
    NoGraph {
        /// The runner.
        runner: RunnerId,
    },
    /// A step schedule replays a runner whose graph allocates temporaries
    /// (graph memory nodes): the driver copies no such graph into a step
    /// graph, so a step graph moves in a *step copy* of it instead, and
    /// none is left.
    #[error("{runner}'s graph allocates temporaries ({allocations} allocation node(s)), which the driver does not copy into a step graph, and {}", no_copy_hint(*.captured))]
    NoStepCopy {
        /// The runner.
        runner: RunnerId,
        /// Its graph's allocation nodes.
        allocations: usize,
        /// Step copies its capture made (0: it was captured with
        /// `stream_capture`, not `stream_capture_repeatable`).
        captured: usize,
    },
    /// The schedule fails a check the fence makes on every step (a
    /// consumer of a runner whose bytes another runner of the step claimed
    /// since, a reader before its handoff's writer, ...).
    #[error("the step's schedule fails the fence's checks: {0}")]
    Schedule(ScheduleError),
    /// The backend could not build the step graph
    /// ([`Operation::StepBuild`](crate::Operation::StepBuild)); `runner`
    /// names the runner whose node (its replay, or its consumer) it refused,
    /// `None` the step as a whole.
    #[error(transparent)]
    Backend(#[from] BackendFailure),
}

// Not `#[from]`: that would also make the schedule's error the `source()`
// of a message that already shows it (printed twice in an error chain).
impl From<ScheduleError> for StepError {
    fn from(e: ScheduleError) -> StepError {
        StepError::Schedule(e)
    }
}

impl From<UnknownRunner> for StepError {
    fn from(UnknownRunner { runner }: UnknownRunner) -> StepError {
        StepError::UnknownRunner { runner }
    }
}

/// A check the fence makes on a step's schedule that failed: the error a
/// scheduled replay or consumer would get from
/// [`Replayable::replay`] or [`Replayable::consume`] at that point of the
/// schedule ([`StepError::Schedule`], [`StepLaunchError::Schedule`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScheduleError {
    /// A scheduled replay fails a check (a reader before its handoff's
    /// writer, a runner whose staged inputs another runner took, ...).
    #[error(transparent)]
    Replay(#[from] ReplayError),
    /// A scheduled consumer fails a check (a runner whose bytes another
    /// runner of the step claimed since, ...).
    #[error(transparent)]
    Consume(#[from] ConsumeError),
}

/// What launching a step graph returns on failure:
/// [`StepGraph::launch`] and [`Replayable::launch_kept`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StepLaunchError {
    /// A kept step graph was launched on (or waited for through) another
    /// plan than the one it was built for.
    #[error("this kept step graph belongs to another plan: launch it with the Replayable it was built from")]
    ForeignStep,
    /// A kept step graph of a bucket whose graphs were released since it
    /// was built (a capture of the bucket since does not bring it back:
    /// build the step again).
    #[error("this kept step graph was built from {bucket}, whose graphs were released since; build it again after capturing the bucket again")]
    Released {
        /// The bucket.
        bucket: crate::vocab::BucketId,
    },
    /// The schedule fails a check the fence makes from its state now (a
    /// kept step graph launched after a per-runner replay that overwrote a
    /// runner its consumer reads, say).
    #[error("the step's schedule fails the fence's checks: {0}")]
    Schedule(ScheduleError),
    /// The stream is capturing; nothing of the step was enqueued.
    #[error(transparent)]
    StreamCapturing(#[from] StreamCapturing),
    /// A backend call failed (nothing of the step was enqueued).
    #[error(transparent)]
    Backend(#[from] BackendFailure),
}

impl From<ScheduleError> for StepLaunchError {
    fn from(e: ScheduleError) -> StepLaunchError {
        StepLaunchError::Schedule(e)
    }
}

impl From<Refused> for StepLaunchError {
    fn from(refused: Refused) -> StepLaunchError {
        match refused {
            Refused::Capturing(c) => c.into(),
            Refused::Failed(f) => f.into(),
        }
    }
}

/// The fix [`StepError::NoStepCopy`] names.
fn no_copy_hint(captured: usize) -> &'static str {
    if captured == 0 {
        "its capture kept no step copy to move in: capture it with \
         RunnerCapture::stream_capture_repeatable (and step_copies of at least 1), which runs its \
         work again into copies"
    } else {
        "its step copies are used up (each serves one replay in one step graph, two in \
         overlapping ones; this schedule or an earlier step graph took them): replan to capture \
         new ones, with more step_copies"
    }
}

/// One scheduled item.
enum Item<B: Compose> {
    Replay {
        slot: usize,
        lane: usize,
    },
    Consume {
        slots: Vec<usize>,
        lane: usize,
        exclusive: bool,
        /// Taken when it is moved into the step graph (it allocates).
        /// Boxed: a schedule is mostly replays, whose items stay small.
        graph: Option<Box<B::Graph>>,
    },
}

impl<B: Compose> Replayable<B> {
    /// Starts a step schedule: state, in order, the replays and consumers of
    /// one step, then [`StepBuilder::build`] compiles them into one graph
    /// whose edges are the waits the fence makes for that schedule in
    /// steady state. While the builder or its [`StepGraph`] lives, the
    /// per-runner API of this plan cannot be used (both borrow it
    /// mutably); once the step graph is gone (dropped or forgotten), the
    /// plan goes on, its fence up to date with every launch.
    ///
    /// ```
    /// use replay_arena::{Discovering, PlanConfig, Policy, Request, Domain, DType, RunnerId};
    /// use replay_arena::sim;
    ///
    /// let req = Request::new(Domain::Device, DType::F32, 64);
    /// let rs = (0..4).map(|r| (RunnerId(r), [req]));
    /// let planned = Discovering::from_runners(PlanConfig::new(), rs)?.plan(Policy::Generations(2))?;
    /// let sim = sim::Device::new();
    /// let (pool, side, launch) = ([sim.new_stream(), sim.new_stream()], sim.new_stream(), sim.new_stream());
    /// let mut capturing = planned.allocate(sim.clone())?;
    /// for r in 0..4 {
    ///     let cap = capturing.capture(RunnerId(r))?;
    ///     let v = cap.take(req)?;
    ///     cap.stream_capture(&pool[0], |s| sim.launch(s, sim::Kernel::fill(&v, r as f32), 10))?;
    ///     cap.finish()?;
    /// }
    /// let mut replayable = capturing.seal()?;
    /// let main = sim.alloc_f32(64)?;
    ///
    /// let mut step = replayable.step();
    /// for r in 0..4 {
    ///     step.replay(RunnerId(r), &pool[r as usize % 2])?;
    ///     step.consume(RunnerId(r), &side, |s, v| sim.launch(s, sim::Kernel::add(&v[0], &main), 5))?;
    /// }
    /// let mut graph = step.build()?;
    /// for _ in 0..10 {
    ///     graph.launch(&launch)?; // one launch per step
    /// }
    /// drop(graph); // the plan is replayable per runner again
    /// assert_eq!(sim.read_f32(&main)?[0], 10.0 * (0.0 + 1.0 + 2.0 + 3.0));
    /// assert!(sim.hazards().is_empty());
    /// replayable.replay(RunnerId(0), &pool[0])?;
    /// # Ok::<(), replay_arena::Error>(())
    /// ```
    #[doc(alias = "step_graph")]
    #[doc(alias = "graph_of_graphs")]
    pub fn step(&mut self) -> StepBuilder<'_, B> {
        StepBuilder {
            items: Vec::with_capacity(self.schedule_hint),
            lanes: Vec::with_capacity(2),
            replayable: self,
        }
    }
}

/// A step schedule being stated ([`Replayable::step`]).
pub struct StepBuilder<'r, B: Compose> {
    replayable: &'r mut Replayable<B>,
    items: Vec<Item<B>>,
    /// The schedule's streams, by first use: (id, stream).
    lanes: Vec<(u64, B::Stream)>,
}

impl<B: Compose> fmt::Debug for StepBuilder<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StepBuilder")
            .field("items", &self.items.len())
            .field("streams", &self.lanes.len())
            .finish_non_exhaustive()
    }
}

impl<'r, B: Compose> StepBuilder<'r, B> {
    fn lane(&mut self, stream: &B::Stream) -> usize {
        let sid = self.replayable.backend.stream_id(stream);
        match self.lanes.iter().position(|(id, _)| *id == sid) {
            Some(l) => l,
            None => {
                self.lanes.push((sid, stream.clone()));
                self.lanes.len() - 1
            }
        }
    }

    fn slot(&self, runner: RunnerId) -> Result<usize, UnknownRunner> {
        self.replayable.slot(runner)
    }

    /// Schedules a replay of `runner` on `stream` (as
    /// [`Replayable::replay`] would make it, waits included).
    ///
    /// A runner whose graph allocates temporaries goes into the step graph
    /// as its step copy ([`RunnerCapture::stream_capture_repeatable`]),
    /// which [`StepBuilder::build`] moves in: one per replay in one step
    /// graph. Readers of a handoff it marks ready start at that ready point
    /// when its copies were cut there (see
    /// [`RunnerCapture::stream_capture_repeatable`]), after the whole copy
    /// otherwise.
    ///
    /// A runner that requests nothing is not fenced (it has no bytes): the
    /// step graph runs a copy of its graph, which nothing orders against
    /// the runner's per-runner replays or other step graphs' copies on
    /// other streams (per-runner replays of one graph are serialized by
    /// the driver, as launches of one executable graph are). Order its
    /// work on the program's own memory yourself, or give it a request.
    ///
    /// # Errors
    ///
    /// [`StepError::UnknownRunner`], [`StepError::NoGraph`];
    /// [`StepError::NoStepCopy`] for a runner with temporaries and no step
    /// copy left.
    ///
    /// [`RunnerCapture::stream_capture_repeatable`]: crate::RunnerCapture::stream_capture_repeatable
    #[inline]
    pub fn replay(&mut self, runner: RunnerId, stream: &B::Stream) -> Result<&mut Self, StepError> {
        let slot = self.slot(runner)?;
        let g = &self.replayable.runners[slot];
        if g.graph.is_none() || g.moves() {
            self.copy_left(runner, slot)?;
        }
        let lane = self.lane(stream);
        self.items.push(Item::Replay { slot, lane });
        Ok(self)
    }

    /// [`StepBuilder::replay`]'s checks of a runner with no graph, or whose
    /// graph allocates: a step copy is left for one more replay of it.
    /// Apart: most runners have a graph that allocates nothing.
    #[cold]
    #[inline(never)]
    fn copy_left(&self, runner: RunnerId, slot: usize) -> Result<(), StepError> {
        let g = &self.replayable.runners[slot];
        if g.graph.is_none() {
            return Err(StepError::NoGraph { runner });
        }
        let scheduled = (self.items.iter())
            .filter(|i| matches!(i, Item::Replay { slot: s, .. } if *s == slot))
            .count();
        if g.moves() && g.step_copies.len() <= scheduled {
            return Err(StepError::NoStepCopy {
                runner,
                allocations: g.temporaries.allocations,
                captured: g.copies_made,
            });
        }
        Ok(())
    }

    /// Schedules a consumer of `runner`'s views on `stream`, as
    /// [`Replayable::consume`]: `work` is called now, and what it enqueues
    /// on `stream` is captured into the step graph (so it must be work a
    /// stream capture takes: kernels, copies, collectives; no host
    /// synchronization). Its views may only be read.
    ///
    /// # Errors
    ///
    /// As [`Replayable::consume`]; a consumer whose work cannot be captured
    /// is [`ConsumeError::Backend`] naming the runner, or
    /// [`ConsumeError::Work`] with the closure's error.
    pub fn consume<E>(
        &mut self,
        runner: RunnerId,
        stream: &B::Stream,
        work: impl FnOnce(&B::Stream, &[View<'_, ReadOnly>]) -> Result<(), E>,
    ) -> Result<&mut Self, ConsumeError<E>> {
        let slot = self.slot(runner)?;
        self.consume_slots(vec![slot], stream, ScopeKind::Read, |s, v| work(s, v[0]))
    }

    /// [`StepBuilder::consume`] for a consumer that also writes the views
    /// (as [`Replayable::consume_mut`]).
    ///
    /// # Errors
    ///
    /// As [`StepBuilder::consume`].
    pub fn consume_mut<E>(
        &mut self,
        runner: RunnerId,
        stream: &B::Stream,
        work: impl FnOnce(&B::Stream, &[View<'_, ReadWrite>]) -> Result<(), E>,
    ) -> Result<&mut Self, ConsumeError<E>> {
        let slot = self.slot(runner)?;
        self.consume_slots(vec![slot], stream, ScopeKind::Write, |s, v| work(s, v[0]))
    }

    /// [`StepBuilder::consume`] over several runners (as
    /// [`Replayable::consume_many`]).
    ///
    /// # Errors
    ///
    /// As [`StepBuilder::consume`]; [`ConsumeError::NoRunners`] for none.
    pub fn consume_many<E>(
        &mut self,
        runners: &[RunnerId],
        stream: &B::Stream,
        work: impl FnOnce(&B::Stream, &[&[View<'_, ReadOnly>]]) -> Result<(), E>,
    ) -> Result<&mut Self, ConsumeError<E>> {
        let slots = runners
            .iter()
            .map(|&r| self.slot(r))
            .collect::<Result<Vec<_>, _>>()?;
        self.consume_slots(slots, stream, ScopeKind::Read, work)
    }

    /// Captures a consumer of `slots` on `stream` into a graph of its own.
    fn consume_slots<A: Access, E>(
        &mut self,
        slots: Vec<usize>,
        stream: &B::Stream,
        kind: ScopeKind,
        work: impl FnOnce(&B::Stream, &[&[View<'_, A>]]) -> Result<(), E>,
    ) -> Result<&mut Self, ConsumeError<E>> {
        let r = &mut *self.replayable;
        let runner = r.consumer_of(&slots).map_err(ConsumeError::with_work)?;
        let failed = |error| Operation::Consume(runner).failed(error);
        // Captured like a runner's graph: the views work inside `work`, on
        // `stream`, while it captures; a reader's views are read-only.
        let sid = r.backend.stream_id(stream);
        let scope = new_scope_id();
        // Copies of the views, in the consumer's scope (read-only for a
        // reader): the plan's own views stay as they are, whatever `work`
        // does (fails, panics).
        let copies: Vec<Vec<View<'_, A>>> = slots
            .iter()
            .map(|&slot| {
                r.views[r.runners[slot].views.clone()]
                    .iter()
                    .map(|&v| v.in_scope(scope))
                    .collect()
            })
            .collect();
        let lists: Vec<&[View<'_, A>]> = copies.iter().map(Vec::as_slice).collect();
        // Only ever composed into the step graph.
        let graph = match capture_work(
            &r.backend,
            (stream, true),
            (sid, scope, runner),
            || {},
            || work(stream, &lists),
        ) {
            Ok(((), graph)) => graph,
            Err(Uncaptured::Busy(StreamBusy::Capturing | StreamBusy::InUse)) => {
                return Err(StreamCapturing {
                    op: Operation::Consume(runner),
                }
                .into())
            }
            Err(Uncaptured::Begin(error) | Uncaptured::End(error)) => {
                return Err(failed(error).into())
            }
            Err(Uncaptured::Work(e)) => return Err(ConsumeError::Work(e)),
            Err(Uncaptured::Misuse(reason)) => {
                return Err(ConsumeError::ViewOutOfScope { runner, reason })
            }
        };
        if let Err(rejection) = r.backend.validate_graph(&graph) {
            return Err(failed(BackendError::GraphRejected {
                call: "capture of a step's consumer",
                rejection,
            })
            .into());
        }
        let lane = self.lane(stream);
        self.items.push(Item::Consume {
            slots,
            lane,
            exclusive: kind == ScopeKind::Write,
            graph: Some(Box::new(graph)),
        });
        Ok(self)
    }

    /// Compiles the schedule into one graph.
    ///
    /// # Errors
    ///
    /// [`StepError::Empty`]; [`StepError::Schedule`] when the schedule
    /// fails a check the fence makes on every step; [`StepError::Backend`]
    /// naming the node the backend could not put in the graph. Every
    /// check is made before a step copy is moved in; a driver error while
    /// composing loses the copies moved in so far (the driver keeps no
    /// moved graph).
    pub fn build(self) -> Result<StepGraph<'r, B>, StepError> {
        self.compile(false)
    }

    /// Compiles the schedule into *two* graphs that [`StepGraph::launch`]
    /// launches in turn, so that a step overlaps its neighbours as
    /// per-runner replays do: step `k + 1`'s first runners start while step
    /// `k`'s last consumers and collectives still run. One graph's launches
    /// run one after another, so a single step graph waits for the whole
    /// step before; here each node waits, through event wait nodes, for
    /// exactly the nodes of the step before that the fence makes it wait
    /// for, and each launch completes only after the launch before it
    /// (so the fence's view of the plan stays right). Consecutive launches
    /// overlap when they are made on different streams
    /// (`graph.launch(&streams[k % 2])`); on one stream they run in turn.
    ///
    /// A runner with temporaries needs two step copies per replay
    /// ([`RunnerCapture::step_copies`](crate::RunnerCapture::step_copies)).
    ///
    /// # Errors
    ///
    /// As [`StepBuilder::build`]; [`StepError::NoStepCopy`] for a runner
    /// with temporaries and fewer than two copies per replay.
    pub fn build_overlapping(self) -> Result<StepGraph<'r, B>, StepError> {
        self.compile(true)
    }

    fn compile(self, overlapping: bool) -> Result<StepGraph<'r, B>, StepError> {
        let StepBuilder {
            replayable,
            items,
            lanes,
        } = self;
        let lanes = lanes.iter().map(|(id, _)| *id).collect();
        // Room for the next schedule (not past a bucket's worth of a large
        // plan: it is only a hint).
        replayable.schedule_hint = items.len().min(1 << 12);
        compile::compile(replayable, items, lanes, overlapping)
    }
}
