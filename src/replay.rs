//! Phase 4: [`Replayable`]. What happens at replay: fence, launch, and completion tracking.
//!
//! Every buffer-using runner claims byte ranges (the whole of its generation
//! under round-robin placement; its slices under packed placement, see
//! `fence.rs`) and owns one completion event. Replaying runner `r` on stream
//! `S`:
//!
//! 1. for each runner `u` that last used a byte `r` claims (each `u` once):
//!    if `u` completes on `S`, stream order already implies the wait
//!    and nothing is issued; otherwise, `S` waits on `u`'s event (recorded
//!    first on `u`'s stream if it has not been yet, see below);
//! 2. `r`'s graph is launched on `S`;
//! 3. `r` becomes the latest user of the bytes it claims and completes on
//!    `S`.
//!
//! Each latest user waited for the one before it, so waiting for the latest
//! user of a byte waits for every earlier one: no arena byte is overwritten
//! while a replay that uses it is in flight.
//!
//! Events are recorded only where someone waits on them. A runner's event is
//! recorded right after its graph (or consumer) if, the last time, another
//! stream waited for it; otherwise the record is deferred until another
//! stream first has to wait, and issued then on the runner's stream. A
//! deferred record covers everything enqueued on that stream so far — the
//! runner's graph and possibly later work — so the wait is correct and at
//! worst conservative; the runner then records eagerly from its next replay
//! on, so a steady schedule waits exactly. A replay whose waits are all
//! implied by stream order costs one graph launch.

use std::fmt;

use crate::backend::{Arena, Backend};
use crate::capture::{Resources, View};
use crate::discover::Discovering;
use crate::error::{Error, Result};
use crate::fence::Painter;
use crate::plan::Planned;
use crate::vocab::RunnerId;

/// Counters of the fence's work since sealing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FenceStats {
    /// Graph launches through [`Replayable::replay`].
    pub replays: u64,
    /// Event waits issued.
    pub waits: u64,
    /// Waits skipped because stream order already implied them.
    pub elided: u64,
    /// Event records issued (lazily, only for waits on another stream).
    pub records: u64,
}

/// Where a runner's latest replay (or consumer) completes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Completion {
    /// At the tail of this stream; its event is not recorded there yet.
    Pending(u64),
    /// Its event is recorded on this stream.
    Recorded(u64),
}

impl Completion {
    fn stream(self) -> u64 {
        match self {
            Completion::Pending(s) | Completion::Recorded(s) => s,
        }
    }
}

/// Phase 4 of 4: every buffer-using runner is captured; graphs replay behind
/// event fences.
///
/// ```
/// use replay_arena::{Discovering, PlanConfig, Policy, Request, Domain, DType, RunnerId};
/// use replay_arena::sim::{SimBackend, SimOp};
///
/// let req = Request::new(Domain::Device, DType::F32, 256);
/// let mut discovery = Discovering::new(PlanConfig::new());
/// discovery.arm(RunnerId(0))?.record(req)?;
/// let sim = SimBackend::new();
/// let stream = sim.stream();
/// let mut capturing = discovery.plan(Policy::Generations(2))?.allocate(sim.clone())?;
/// {
///     let cap = capturing.capture(RunnerId(0))?;
///     let view = cap.take(req)?;
///     let graph = cap.record(&stream, |s| sim.launch(s, SimOp::fill(&view, 1.5), 10))?;
///     cap.finish(graph)?;
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
/// use replay_arena::{Discovering, PlanConfig, Policy, RunnerId, sim::SimBackend};
/// let sim = SimBackend::new();
/// let stream = sim.stream();
/// let planned = Discovering::new(PlanConfig::new()).plan(Policy::Generations(1)).unwrap();
/// let mut capturing = planned.allocate(sim).unwrap();
/// capturing.replay(RunnerId(0), &stream); // no method `replay` on `Capturing`
/// ```
pub struct Replayable<B: Backend> {
    plan: Planned,
    /// (runner, index in capture order), sorted by runner.
    index: Vec<(RunnerId, usize)>,
    /// Runner index -> its event index (buffer-using runners only).
    event_of: Vec<Option<usize>>,
    /// Which runner last used which bytes.
    painter: Painter,
    /// Runner index -> where its latest replay or consumer completes.
    completion: Vec<Option<Completion>>,
    /// Runner index -> the stream its pending completion is on (kept here so
    /// a deferred record can be issued on it).
    pending_on: Vec<Option<B::Stream>>,
    /// Runner index -> record right after each replay (another stream waited
    /// for the runner last time).
    eager: Vec<bool>,
    /// Runner index -> a wait used its latest eager record.
    used: Vec<bool>,
    waited: Vec<u32>,
    stats: FenceStats,
    res: Resources<B>,
}

impl<B: Backend> fmt::Debug for Replayable<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Replayable")
            .field("backend", &self.res.backend.name())
            .field("runners", &self.plan.runners.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<B: Backend> Replayable<B> {
    pub(crate) fn new(plan: Planned, res: Resources<B>) -> Replayable<B> {
        let mut next_event = 0;
        let event_of = plan
            .runners
            .iter()
            .map(|r| {
                r.position.map(|_| {
                    next_event += 1;
                    next_event - 1
                })
            })
            .collect();
        Replayable {
            index: {
                let mut index: Vec<(RunnerId, usize)> = plan
                    .runners
                    .iter()
                    .enumerate()
                    .map(|(i, r)| (r.id(), i))
                    .collect();
                index.sort_unstable();
                index
            },
            event_of,
            painter: Painter::new(plan.fence_regions),
            completion: vec![None; plan.runners.len()],
            pending_on: plan.runners.iter().map(|_| None).collect(),
            eager: vec![false; plan.runners.len()],
            used: vec![false; plan.runners.len()],
            waited: Vec::new(),
            stats: FenceStats::default(),
            plan,
            res,
        }
    }

    /// The plan.
    pub fn plan(&self) -> &Planned {
        &self.plan
    }

    /// The backend, to submit other work.
    pub fn backend(&self) -> &B {
        &self.res.backend
    }

    /// The graph captured for `runner`, owned by the plan (`None` for an
    /// empty runner that was not captured, or an unknown runner).
    pub fn graph(&self, runner: RunnerId) -> Option<&B::Graph> {
        let i = self.index_of(runner).ok()?;
        self.res.graphs[i].as_ref()
    }

    /// What the fence has done so far.
    pub fn fence_stats(&self) -> FenceStats {
        self.stats
    }

    fn index_of(&self, runner: RunnerId) -> Result<usize> {
        self.index
            .binary_search_by_key(&runner, |&(r, _)| r)
            .map(|k| self.index[k].1)
            .map_err(|_| Error::UnknownRunner { runner })
    }

    /// Replays `runner`'s graph on `stream`: waits for the latest users of
    /// the bytes it overwrites (unless stream order implies it), launches,
    /// and makes `runner` the latest user of its bytes.
    pub fn replay(&mut self, runner: RunnerId, stream: &B::Stream) -> Result<()> {
        let i = self.index_of(runner)?;
        if self.res.graphs[i].is_none() {
            return Err(Error::NoGraph { runner });
        }
        let sid = self.res.backend.stream_id(stream);
        let mut users = std::mem::take(&mut self.waited);
        users.clear();
        for &claim in &self.plan.runners[i].claims {
            self.painter.users(claim, &mut users);
        }
        let waited = users
            .iter()
            .try_for_each(|&u| self.wait_for(u as usize, stream, sid));
        self.waited = users;
        waited?;
        let graph = self.res.graphs[i]
            .as_ref()
            .ok_or(Error::NoGraph { runner })?;
        self.res.backend.launch(graph, stream)?;
        self.stats.replays += 1;
        if self.event_of[i].is_some() {
            self.complete_on(i, stream, sid)?;
            for &claim in &self.plan.runners[i].claims {
                self.painter.paint(claim, i as u32);
            }
        }
        Ok(())
    }

    /// Makes `stream` wait for runner `u`'s latest completion.
    fn wait_for(&mut self, u: usize, stream: &B::Stream, sid: u64) -> Result<()> {
        let Some(completion) = self.completion[u] else {
            return Ok(());
        };
        if completion.stream() == sid {
            self.stats.elided += 1;
            return Ok(());
        }
        let event = &self.res.events[self.event_of[u].expect("users own events")];
        if let Completion::Pending(_) = completion {
            let on = self.pending_on[u].as_ref().expect("pending has a stream");
            self.res.backend.record_event(on, event)?;
            self.stats.records += 1;
            self.completion[u] = Some(Completion::Recorded(completion.stream()));
            self.pending_on[u] = None;
            self.eager[u] = true;
        }
        self.res.backend.wait_event(stream, event)?;
        self.stats.waits += 1;
        self.used[u] = true;
        Ok(())
    }

    /// Runner `i` now completes at the tail of `stream`: record its event
    /// there now if another stream is expected to wait for it, else later.
    fn complete_on(&mut self, i: usize, stream: &B::Stream, sid: u64) -> Result<()> {
        if self.eager[i] && !self.used[i] {
            // Nobody waited for the last eager record: defer from now on.
            self.eager[i] = false;
        }
        if self.eager[i] {
            let event = &self.res.events[self.event_of[i].expect("users own events")];
            self.res.backend.record_event(stream, event)?;
            self.stats.records += 1;
            self.completion[i] = Some(Completion::Recorded(sid));
            self.pending_on[i] = None;
            self.used[i] = false;
            return Ok(());
        }
        if self.completion[i] != Some(Completion::Pending(sid)) {
            self.pending_on[i] = Some(stream.clone());
        }
        self.completion[i] = Some(Completion::Pending(sid));
        Ok(())
    }

    /// Launches `runner`'s graph with no fence at all.
    ///
    /// # Safety
    ///
    /// The caller guarantees that no replay in flight uses any byte of this
    /// runner's arenas, and that no later fenced replay relies on this one
    /// being tracked: the fence does not know about it. Meant for unfenced
    /// reference measurements and for tests that show the fence is needed.
    pub unsafe fn replay_unfenced(&mut self, runner: RunnerId, stream: &B::Stream) -> Result<()> {
        let i = self.index_of(runner)?;
        let graph = self.res.graphs[i]
            .as_ref()
            .ok_or(Error::NoGraph { runner })?;
        self.res.backend.launch(graph, stream)
    }

    /// Runs asynchronous work that reads `runner`'s views outside its graph
    /// (a reduce-scatter on another stream, say) inside the runner's fence:
    /// `stream` first waits for the runner's latest replay, `submit` enqueues
    /// the work, then the runner's event is recorded on `stream`, so no later
    /// replay overwrites the views before that work is done.
    pub fn consume<E: fmt::Display>(
        &mut self,
        runner: RunnerId,
        stream: &B::Stream,
        submit: impl FnOnce(&B::Stream, &[View<'_>]) -> std::result::Result<(), E>,
    ) -> Result<()> {
        let i = self.index_of(runner)?;
        let sid = self.res.backend.stream_id(stream);
        let fenced = self.event_of[i].is_some();
        if fenced {
            self.wait_for(i, stream, sid)?;
        }
        let views = self.views(runner)?;
        let submitted = submit(stream, &views);
        if fenced {
            // Whatever was enqueued, even by a failing `submit`, is fenced.
            self.complete_on(i, stream, sid)?;
        }
        submitted.map_err(|e| Error::ConsumerFailed {
            runner,
            reason: e.to_string(),
        })
    }

    /// The views `runner`'s capture handed out, in request order (same
    /// addresses), for work outside the graph.
    pub fn views(&self, runner: RunnerId) -> Result<Vec<View<'_>>> {
        let i = self.index_of(runner)?;
        let plan = &self.plan.runners[i];
        let mut consumed = vec![0u64; plan.slices.len()];
        let mut views = Vec::with_capacity(plan.record.requests.len());
        for &request in &plan.record.requests {
            let k = plan
                .slices
                .iter()
                .position(|s| s.key == request.key())
                .expect("every recorded key has a slice");
            let slice = plan.slices[k];
            let offset = slice.offset + consumed[k];
            consumed[k] += request.aligned_bytes().expect("checked at discovery");
            views.push(View {
                addr: self.res.arenas[slice.arena].base() + offset,
                arena: slice.arena,
                offset,
                request,
                runner,
                _capture: std::marker::PhantomData,
            });
        }
        Ok(views)
    }

    /// Waits for all submitted work.
    pub fn synchronize(&self) -> Result<()> {
        self.res.backend.synchronize()
    }

    /// After a shape change: synchronizes, frees graphs, events and arenas,
    /// and returns a fresh discovery with the same config.
    pub fn replan(self) -> Result<Discovering> {
        let Replayable { plan, res, .. } = self;
        res.release(plan)
    }
}
