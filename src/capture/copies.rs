//! Step copies: a runner whose graph allocates is captured a second time
//! for a step graph to move in ([`RunnerCapture::stream_capture_repeatable`]),
//! in parts cut at its ready points where the work allows it.

use std::fmt;

use super::{CaptureError, CaptureFailure, RunnerCapture, StreamCaptureError};
use crate::backend::{Backend, Cut};
use crate::failure::Operation;
use crate::vocab::HandoffId;

/// A step copy: a second capture of an allocating runner's work, for one
/// step graph to move in. Captured in parts, cut at each ready point where
/// the work allows it (nothing of it runs beside that ready point and no
/// temporary lives across it, [`Capture::cuts_at`]), so that in a step graph the readers of each such
/// handoff start at its ready point, as they do when the runner is
/// replayed on its own.
pub(crate) struct StepCopy<G> {
    /// The parts, in order: one more than `cuts`.
    pub(crate) parts: Vec<G>,
    /// The handoffs whose ready points end the parts but the last.
    pub(crate) cuts: Vec<HandoffId>,
}

impl<B: Backend> RunnerCapture<'_, B> {
    /// [`RunnerCapture::stream_capture`] for work that can run twice, so
    /// that a step graph can hold the runner even when its graph allocates
    /// temporaries (a framework's ops allocating their outputs inside the
    /// capture: graph memory nodes). The driver copies no such graph into
    /// another, and a graph moved into a step graph is the step graph's for
    /// good, so the crate captures `work` a second time, on the same
    /// stream with the same views, into a *step copy* that the first
    /// [`StepBuilder::build`](crate::StepBuilder::build) scheduling this
    /// runner moves in. The runner's own graph stays for per-runner replays
    /// before and after that step graph. Work whose graph allocates nothing
    /// runs once: step graphs copy such a graph in.
    ///
    /// The second run must do what the first did: the same views (it can
    /// use no others), the same ready points ([`RunnerCapture::ready`]).
    ///
    /// When the work marks handoffs ready, the step copy is captured in
    /// parts, cut at each ready point (the capture on `stream` is ended
    /// there and a new one begun, inside [`RunnerCapture::ready`]), so that
    /// in a step graph the readers of each handoff start at its ready
    /// point, as between per-runner replays. The crate cuts at a ready point
    /// only when the first run's graph shows nothing of the work beside it
    /// (no other stream of the capture has work across it) and no
    /// temporary living across it (allocated before, freed after:
    /// [`Capture::cuts_at`](crate::backend::Capture::cuts_at)). A temporary passed
    /// from one part to the next made the driver reserve 5 to 7 times the
    /// graph memory of whole copies on an H200, so such a copy stays whole
    /// there: free the temporary before the ready point to let readers
    /// start at it. [`Replayable::ready_points`](crate::Replayable::ready_points)
    /// says what was decided at each ready point, and why. Readers of a
    /// handoff not cut at start after the whole copy. The second run must
    /// mark its ready points in the first run's order.
    ///
    /// ```
    /// use replay_arena::{Discovering, PlanConfig, Policy, Request, Domain, DType, RunnerId};
    /// use replay_arena::sim;
    ///
    /// let req = Request::new(Domain::Device, DType::F32, 64);
    /// let planned = Discovering::from_runners(PlanConfig::new(), [(RunnerId(0), [req])])?
    ///     .plan(Policy::Generations(1))?;
    /// let sim = sim::Device::new();
    /// let stream = sim.new_stream();
    /// let mut capturing = planned.allocate(sim.clone())?;
    /// let cap = capturing.capture(RunnerId(0))?;
    /// let out = cap.take(req)?;
    /// let mut runs = 0;
    /// cap.stream_capture_repeatable(&stream, |s| {
    ///     runs += 1;
    ///     let tmp = sim.alloc_async(s, 64)?; // a temporary: an allocation node
    ///     sim.launch(s, sim::Kernel::fill(&tmp, 2.0), 5)?;
    ///     sim.launch(s, sim::Kernel::copy(&tmp, &out), 5)?;
    ///     sim.free_async(s, &tmp)
    /// })?;
    /// cap.finish()?;
    /// assert_eq!(runs, 2); // its graph and its step copy
    ///
    /// let mut replayable = capturing.seal()?;
    /// replayable.replay(RunnerId(0), &stream)?; // the runner's own graph
    /// let mut step = replayable.step();
    /// step.replay(RunnerId(0), &stream)?;
    /// let mut graph = step.build()?; // the step copy moves in
    /// graph.launch(&stream)?;
    /// drop(graph);
    /// replayable.replay(RunnerId(0), &stream)?; // still there
    /// assert_eq!(sim.read_f32(&replayable.views(RunnerId(0))?[0])?[0], 2.0);
    /// # Ok::<(), replay_arena::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`RunnerCapture::stream_capture`], for either run;
    /// [`CaptureError::RepeatDiffers`] when the second run marked other
    /// ready points. Either failure fails the runner.
    pub fn stream_capture_repeatable<E: fmt::Display>(
        &self,
        stream: &B::Stream,
        mut work: impl FnMut(&B::Stream) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), StreamCaptureError<E>> {
        let runner = self.runner();
        self.may_capture()?;
        self.ready_order.borrow_mut().clear();
        let graph = self.capture_graph((stream, false), &mut work)?;
        let order = std::mem::take(&mut *self.ready_order.borrow_mut());
        let checked = self.backend().graph_temporaries(&graph).and_then(|t| {
            if t.is_empty() {
                return Ok(None);
            }
            // Cut the copies at each ready point nothing of the work runs
            // beside and no temporary lives across.
            let mut decided = Vec::new();
            for h in order {
                if let Some(e) = self.handoff_event(h) {
                    decided.push((h, self.backend().cuts_at(&graph, e)?));
                }
            }
            Ok(Some(decided))
        });
        let cut: Vec<HandoffId> = match checked {
            Ok(Some(mut decided)) => {
                if self.cut_across.get() {
                    for (_, c) in &mut decided {
                        if let Cut::TemporariesAcross { bytes } = *c {
                            *c = Cut::Across { bytes };
                        }
                    }
                }
                let cuts = decided.iter().filter(|(_, c)| c.is_cut()).map(|&(h, _)| h);
                let cuts = cuts.collect();
                *self.ready_points.borrow_mut() = decided;
                cuts
            }
            Ok(None) => {
                *self.graph.borrow_mut() = Some(graph);
                return Ok(());
            }
            Err(error) => {
                let error = CaptureError::Backend(Operation::Capture(runner).failed(error));
                *self.failure.borrow_mut() = Some(CaptureFailure::Check(Box::new(error.clone())));
                return Err(error.into());
            }
        };
        *self.graph.borrow_mut() = Some(graph);
        for _ in 0..self.copies_wanted.get() {
            *self.cuts.borrow_mut() = cut.clone();
            let copy = self.capture_copy(stream, &mut work);
            self.cuts.borrow_mut().clear();
            self.parts.borrow_mut().clear();
            copy?;
        }
        Ok(())
    }

    /// The event of handoff `h`'s ready point.
    fn handoff_event(&self, h: HandoffId) -> Option<&B::Event> {
        self.owner
            .res
            .events
            .get(self.owner.plan.runners.len() + h.0 as usize)
            .and_then(Option::as_ref)
    }

    /// How many step copies [`RunnerCapture::stream_capture_repeatable`]
    /// captures when the runner's graph allocates (1 unless set): one per
    /// replay of the runner in one step graph, two per replay in an
    /// overlapping one ([`StepBuilder::build_overlapping`](crate::StepBuilder::build_overlapping)).
    /// Each copy holds its own temporaries until a step graph moves it in.
    pub fn step_copies(&self, copies: usize) -> &Self {
        self.copies_wanted.set(copies);
        self
    }

    /// Cuts the step copies at ready points that temporaries live across
    /// too ([`Cut::Across`], where they are kept whole unless chosen:
    /// [`Cut::TemporariesAcross`]), for speed at the cost of graph memory.
    /// Readers of the handoff then start at its ready point in a step
    /// graph, as with a clean cut, but the driver no longer shares the
    /// temporaries' memory along the step: on an H200 (driver 580.159.04)
    /// five such layers reserved 5 to 7 times the graph memory of whole
    /// copies (`tests/gpu/step/graph_memory.rs`), which
    /// [`StepGraph::graph_memory`](crate::StepGraph::graph_memory) does not
    /// estimate. [`Replayable::ready_points`](crate::Replayable::ready_points)
    /// says which were cut so. Set before `stream_capture_repeatable`.
    pub fn cut_across_temporaries(&self) -> &Self {
        self.cut_across.set(true);
        self
    }

    /// One more run of the work, into a step copy.
    fn capture_copy<E: fmt::Display>(
        &self,
        stream: &B::Stream,
        work: &mut impl FnMut(&B::Stream) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), StreamCaptureError<E>> {
        let runner = self.runner();
        // The run marks its ready points again, into the copy.
        let first: Vec<(HandoffId, bool)> = self.handoffs.borrow().clone();
        for entry in self.handoffs.borrow_mut().iter_mut() {
            entry.1 = false;
        }
        self.parts.borrow_mut().clear();
        self.ready_order.borrow_mut().clear();
        // A step copy is only ever moved into a step graph.
        let copy = match self.capture_graph((stream, true), work) {
            Ok(copy) => copy,
            Err(e) => {
                // A capture that never began fails the runner too: it has
                // a graph, and no copy.
                let unset = self.failure.borrow().is_none();
                if let (StreamCaptureError::Capture(error), true) = (&e, unset) {
                    let failure = CaptureFailure::Check(Box::new(error.clone()));
                    *self.failure.borrow_mut() = Some(failure);
                }
                return Err(e);
            }
        };
        if *self.handoffs.borrow() != first {
            let error = CaptureError::RepeatDiffers {
                runner,
                reason: "marked other ready points (or took other handoffs)",
            };
            *self.failure.borrow_mut() = Some(CaptureFailure::Check(Box::new(error.clone())));
            return Err(error.into());
        }
        let mut parts = std::mem::take(&mut *self.parts.borrow_mut());
        let cuts = self.cuts.borrow().clone();
        if parts.len() != cuts.len() {
            let error = CaptureError::RepeatDiffers {
                runner,
                reason: "did not mark its ready points in the order the first run did",
            };
            *self.failure.borrow_mut() = Some(CaptureFailure::Check(Box::new(error.clone())));
            return Err(error.into());
        }
        parts.push(copy);
        self.copies.borrow_mut().push(StepCopy { parts, cuts });
        Ok(())
    }
}
