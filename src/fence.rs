//! The replay engine: who last used which bytes, where each runner's
//! latest replay or consumer completes, each handoff's writes and reads,
//! and the events that make other streams wait. [`Fence`] owns all of it
//! and does every replay and consumer of a plan ([`Fence::replay`],
//! [`Fence::consume`]), for `Replayable` and for the dry run a step graph
//! is compiled on alike; `replay.rs` and `step.rs` are the public API over
//! it.
//!
//! Every buffer-using runner claims byte ranges (the whole of its generation
//! under round-robin placement; its slices under packed placement) and owns
//! one completion event. Before runner `r`'s graph is launched on stream
//! `S` ([`Fence::admit`]): for each runner `u` that last used a byte `r`
//! claims (each `u` once), if `u` completes on `S`, stream order already
//! implies the wait and nothing is issued; otherwise `S` waits on `u`'s
//! event (recorded first on `u`'s stream if it has not been yet). After the
//! launch ([`Fence::complete`]), `r` becomes the latest user of the bytes it
//! claims and completes on `S`.
//!
//! Each latest user waited for the one before it, so waiting for the latest
//! user of a byte waits for every earlier one: no arena byte is overwritten
//! while a replay that uses it is in flight. A consumer
//! ([`Fence::consume`]) reads a runner's bytes outside its graph: it waits
//! for the runner's replay only, and becomes a
//! *reader* of the runner (one per consumer stream, with its own event,
//! recorded right after the consumer's work): consumers on different
//! streams run at once, and every later claimer of those bytes waits for
//! the replay and every reader. A consumer on the stream the replay
//! completes on adds no reader: the replay's own record covers it.
//!
//! Handoffs are fence slots of their own, after the runners': the writer's
//! replay claims their bytes, a reader's replay waits for the latest write
//! and becomes a reader of the slot.
//!
//! Events are recorded only where someone waits on them. A runner's event is
//! recorded right after its graph if, the last time, another
//! stream waited for it; otherwise the record is deferred until another
//! stream first has to wait, and issued then on the runner's stream. A
//! deferred record covers everything enqueued on that stream so far (the
//! runner's graph and possibly later work), so the wait is correct and at
//! worst conservative; the runner then records at once from its next replay
//! on, so a steady schedule waits exactly. A replay whose waits are all
//! implied by stream order costs one graph launch.

mod error;
mod state;
mod entry;
mod slots;

pub(crate) use entry::{enter, enter_replay, enter_scope, refused_by_capture};
pub(crate) use error::Refused;
pub use error::{
    BackendFailure, ConsumeError, FenceStats, Operation, ReplayError, StreamCapturing, TraceError,
    UnknownRunner, WaitError,
};

use crate::backend::{BackendError, Streams};
use crate::painter::{Claim, Painter};
use crate::plan::Planned;
use crate::scope::StreamClaim;
use crate::trace::{Observer, UseKind, NO_USER};
use crate::vocab::{HandoffId, Purpose, RunnerId};
pub(crate) use slots::sort_dedup;
use slots::Slots;
use state::{Completion, Journal, Runner};
use std::sync::Arc;

type Result<T> = std::result::Result<T, ReplayError>;

/// A stream, with the identity the backend issued for it (what the fence
/// compares: never the raw handle of a stream that may be gone).
pub(crate) struct On<'a, S> {
    pub(crate) stream: &'a S,
    pub(crate) id: u64,
}

impl<S> Clone for On<'_, S> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<S> Copy for On<'_, S> {}

/// What the fence knows besides events and completions: who last used
/// which bytes, and each handoff's writes and reads. It does not depend on
/// the backend, so a step graph's dry run hands its state to the plan's
/// fence ([`Ledger::take_part`]). A plan's fence holds the whole of it; a
/// dry run only the part its step can meet ([`Ledger::part`]).
#[derive(Clone, Debug)]
pub(crate) struct Ledger {
    painter: Painter,
    /// By handoff.
    handoffs: Slots<HandoffState>,
    /// Runner slot -> its staged inputs' latest write failed (its closure
    /// returned an error or unwound): they are not staged, whoever owns
    /// the bytes, until a write succeeds.
    unstaged: Slots<bool>,
    /// A part's: the bytes it holds (ascending, each once); `None` for
    /// the whole ledger.
    bytes: Option<Vec<Claim>>,
}

impl Ledger {
    /// The part of this (whole) ledger that holds the bytes of `claims`,
    /// the handoffs `handoffs` and the staging flags of the runner slots
    /// `runners` (each list ascending, each once): what a step's dry run
    /// whose every claim and read lies within them can meet.
    fn part(&self, claims: Vec<Claim>, handoffs: &[usize], runners: &[usize]) -> Ledger {
        Ledger {
            painter: self.painter.restricted(&claims),
            handoffs: Slots::sparse_part(&self.handoffs, handoffs),
            unstaged: Slots::sparse_part(&self.unstaged, runners),
            bytes: Some(claims),
        }
    }

    /// Takes what `part` holds (all of it, for a whole ledger): the bytes
    /// it holds are painted as it has them, its handoffs and staging flags
    /// replace these; everything else stays.
    pub(crate) fn take_part(&mut self, part: &Ledger) {
        let Some(bytes) = &part.bytes else {
            *self = part.clone();
            return;
        };
        self.painter.overlay(&part.painter, bytes);
        for (h, state) in part.handoffs.pairs() {
            self.handoffs[h] = state.clone();
        }
        for (r, &unstaged) in part.unstaged.pairs() {
            self.unstaged[r] = unstaged;
        }
    }

    /// Entries it holds: painted intervals, handoffs and staging flags.
    fn entries(&self) -> usize {
        self.painter.intervals() + self.handoffs.held() + self.unstaged.held()
    }
}

/// What a fence holds: fence slots, and ledger entries (painted intervals,
/// handoffs, staging flags). A step graph's dry run holds what its step
/// can meet, in proportion to the step, not to the plan.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Held {
    pub(crate) slots: usize,
    pub(crate) ledger: usize,
}

/// One handoff's writes and reads, to refuse a reader that would read a
/// write it already read (replayed before its writer).
#[derive(Clone, Debug)]
struct HandoffState {
    /// Its writer's graph records its event at a ready point.
    ready: bool,
    /// Writer replays so far.
    written: u64,
    /// Per reader (in the plan's order): `written` when it last read.
    read: Vec<u64>,
}

/// The runner behind fence slot `slot`: a runner's, or a handoff's writer
/// (handoff slots follow the runners').
fn slot_owner(plan: &Planned, slot: usize) -> RunnerId {
    match slot.checked_sub(plan.runners.len()) {
        Some(h) => plan.runners[plan.handoffs[h].record.writer].id(),
        None => plan.runners[slot].id(),
    }
}

/// Fixed at seal: where handoff slots start, the bytes each runner's replay
/// overwrites, and each reader's place among its handoffs' readers. Shared
/// (never copied) by the dry runs of step graphs; a run-time bucket that
/// joins copies it once, if a step graph still holds it.
#[derive(Clone, Debug)]
struct Layout {
    /// Fence slots: runners, then handoffs.
    slots: usize,
    /// Fence slot of handoff 0 (handoff `h` is slot `handoff_base + h`).
    handoff_base: usize,
    /// Runner slot -> every byte its replay overwrites: its own claims and
    /// those of the handoffs it writes.
    admit_claims: Vec<Vec<Claim>>,
    /// Runner slot -> for each handoff it reads (in `record.reads` order),
    /// its place among that handoff's readers.
    read_at: Vec<Vec<usize>>,
    /// Runner slot -> it has requests the program stages (`Purpose::Input`).
    stages: Vec<bool>,
}

impl Layout {
    fn of(plan: &Planned) -> Layout {
        let admit_claims = plan
            .runners
            .iter()
            .map(|r| {
                let mut claims = r.claims.clone();
                claims.extend(
                    r.record
                        .writes
                        .iter()
                        .map(|h| plan.handoffs[h.0 as usize].claim),
                );
                claims
            })
            .collect();
        let read_at = plan
            .runners
            .iter()
            .enumerate()
            .map(|(slot, r)| {
                r.record
                    .reads
                    .iter()
                    .map(|h| {
                        let readers = &plan.handoffs[h.0 as usize].record.readers;
                        readers.iter().position(|&x| x == slot).unwrap_or(0)
                    })
                    .collect()
            })
            .collect();
        let stages = plan
            .runners
            .iter()
            .map(|r| {
                let inputs = r.record.requests.iter();
                !r.claims.is_empty() && inputs.into_iter().any(|q| q.purpose == Purpose::Input)
            })
            .collect();
        Layout {
            slots: plan.runners.len() + plan.handoffs.len(),
            handoff_base: plan.runners.len(),
            admit_claims,
            read_at,
            stages,
        }
    }
}

/// Why a consumer may not read a runner's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NotOwner {
    /// The runner was never replayed.
    NeverReplayed,
    /// Another runner (this slot) claimed some of its bytes since.
    OverwrittenBy(usize),
}

/// The replay engine of one plan: per fence slot (runners, then handoffs)
/// its event and latest completion, the ledger of who used which bytes,
/// and the plan's fixed layout.
pub(crate) struct Fence<B: Streams> {
    runners: Slots<Runner<B>>,
    ledger: Ledger,
    layout: Arc<Layout>,
    /// Streams are claimed for the fence's own event records (see
    /// `record_pending`): a real backend's fence, not a dry run's.
    claims: bool,
    /// Every completion is recorded at once where it ends (a dry run's:
    /// its records cost nothing, and each wait on one becomes an edge to
    /// exactly the node that used the bytes, never to a later node of its
    /// stream; [`Fence::start_from`]).
    exact: bool,
    scratch: Vec<u32>,
    stats: FenceStats,
    /// The open transaction (`state.rs`).
    journal: Journal<B::Stream>,
    /// Moves on with every committed transaction: whatever changes the
    /// fence's state commits one first. Never a statistic.
    epoch: u64,
    /// The trace the program started, told of every use of the plan.
    observer: Option<Box<dyn Observer<B>>>,
    /// The trace's id of the use in progress (`NO_USER`: none, or no trace).
    user: u32,
    /// The trace's id of the latest step graph launch.
    step_user: u32,
    /// Step graphs built on this fence so far: the next one's number.
    steps_built: u64,
    /// The latest replay, when it can be repeated as it is (see
    /// [`Fence::repeats`]).
    repeat: Option<Repeat>,
    /// Every replay takes the whole transaction (the unit tests' reference
    /// for the repeated replay).
    #[cfg(test)]
    never_repeat: bool,
}

/// A replay of runner slot `slot` that left the fence at `epoch`: the
/// slot's bytes were all painted by it last, and it has no handoffs, staged
/// inputs or readers.
#[derive(Clone, Copy)]
struct Repeat {
    slot: usize,
    epoch: u64,
}

/// How the latest replay is repeated ([`Fence::repeats`]).
#[derive(Clone, Copy)]
enum Again {
    /// On the stream it completes on: stream order orders it.
    OnItsStream,
    /// On another stream, its event recorded at once where it completes:
    /// wait for that record, launch, record again at once.
    Across,
}

impl<B: Streams> Fence<B> {
    /// The fence of `plan`, with one entry per fence slot (its event, if it
    /// uses buffers; runners, then handoffs); `ready[h]` says whether
    /// handoff `h`'s writer records its event at a ready point.
    pub(crate) fn new(events: Vec<Option<B::Event>>, plan: &Planned, ready: &[bool]) -> Fence<B> {
        let handoffs = plan
            .handoffs
            .iter()
            .zip(ready)
            .map(|(h, &ready)| HandoffState {
                ready,
                written: 0,
                read: vec![0; h.record.readers.len()],
            })
            .collect();
        let ledger = Ledger {
            painter: Painter::new(plan.fence_regions),
            handoffs: Slots::dense(handoffs),
            unstaged: Slots::dense(vec![false; plan.runners.len()]),
            bytes: None,
        };
        let runners = Slots::dense(events.into_iter().map(Runner::new).collect());
        Fence::assemble(runners, ledger, Arc::new(Layout::of(plan)), true)
    }

    /// A fence of `runners` (slots) over `ledger` and `layout`, nothing
    /// done yet; `claims`: a real backend's (see `record_pending`).
    fn assemble(
        runners: Slots<Runner<B>>,
        ledger: Ledger,
        layout: Arc<Layout>,
        claims: bool,
    ) -> Fence<B> {
        Fence {
            runners,
            ledger,
            layout,
            claims,
            exact: !claims,
            scratch: Vec::new(),
            stats: FenceStats::default(),
            journal: Journal::default(),
            epoch: 0,
            observer: None,
            user: NO_USER,
            step_user: NO_USER,
            steps_built: 0,
            repeat: None,
            #[cfg(test)]
            never_repeat: false,
        }
    }

    /// A fence that starts where the plan's fence `other` stands, for a
    /// step that replays the runner slots `replays` and runs consumers of
    /// those in `consumes` (each list ascending, each once; its ledger;
    /// every slot `other` used counts as
    /// used, complete before anything this fence orders), with one event
    /// per fenced slot it holds from `event`: the fence a step schedule is
    /// traced on. It holds only what such a step can meet, so it costs in
    /// proportion to the step, not to the plan: those runner slots, the
    /// handoffs the replays write and read, the latest users of every byte
    /// they claim or read, and the ledger's part of those bytes, handoffs
    /// and runners. The layout is shared. Whoever runs it drops it at its
    /// first failed operation: its transactions keep nothing aside.
    pub(crate) fn start_from<C: Streams>(
        other: &Fence<C>,
        plan: &Planned,
        (replays, consumes): (&[usize], &[usize]),
        mut event: impl FnMut(usize) -> B::Event,
    ) -> Fence<B> {
        let layout = &other.layout;
        let ascending = |v: &[usize]| v.windows(2).all(|w| w[0] < w[1]);
        debug_assert!(ascending(replays) && ascending(consumes));
        let mut runners = merge(replays, consumes);
        // Every byte a replay or a consumer (a staging one takes its
        // runner's bytes as a replay does) claims or reads, and the
        // handoffs the replays write and read.
        // Room for them counted (the lists are not grown): most runners
        // claim one range (a generation, or a slice of it), and the bytes
        // of each handoff they write.
        let (mut writes, mut reads) = (0, 0);
        for &slot in replays {
            let record = &plan.runners[slot].record;
            (writes, reads) = (writes + record.writes.len(), reads + record.reads.len());
        }
        let mut claims: Vec<Claim> = Vec::with_capacity(runners.len() + writes + reads);
        for &slot in &runners {
            claims.extend_from_slice(&layout.admit_claims[slot]);
        }
        let mut handoffs: Vec<usize> = Vec::with_capacity(writes + reads);
        // None, mostly: a bucket's runners hand nothing off.
        if writes + reads > 0 {
            for &slot in replays {
                let record = &plan.runners[slot].record;
                handoffs.extend(
                    record
                        .writes
                        .iter()
                        .chain(&record.reads)
                        .map(|h| h.0 as usize),
                );
                let read = record.reads.iter();
                claims.extend(read.map(|h| plan.handoffs[h.0 as usize].claim));
            }
            sort_dedup(&mut handoffs);
        }
        distinct_claims(&mut claims);
        // The slots: those, and whoever last used those bytes (about one
        // each).
        // Runner slots come before handoff slots: both lists in order, one
        // after the other, are in order.
        let mut slots = Vec::with_capacity(runners.len() + handoffs.len() + claims.len());
        slots.extend_from_slice(&runners);
        slots.extend(handoffs.iter().map(|h| layout.handoff_base + h));
        debug_assert!(slots.is_sorted());
        // The latest users not among them (mostly none: a bucket's runners
        // last used their own bytes), merged in.
        let (mut users, mut extra) = (Vec::new(), Vec::new());
        for &claim in &claims {
            users.clear();
            other.ledger.painter.users(claim, &mut users);
            let known = |u: usize| slots.binary_search(&u).is_ok();
            extra.extend(users.iter().map(|&u| u as usize).filter(|&u| !known(u)));
        }
        if !extra.is_empty() {
            sort_dedup(&mut extra);
            slots = merge(&slots, &extra);
        }
        let values = (slots.iter())
            .map(|&i| {
                let o = other.runners.get(i);
                let fenced = o.is_some_and(|o| o.event.is_some());
                let mut runner = Runner::new(fenced.then(|| event(i)));
                if fenced && o.is_some_and(|o| o.completion.is_some()) {
                    // Before the step: ordered by launch order, no record.
                    runner.completion = Some(Completion::Recorded { id: u64::MAX });
                }
                runner
            })
            .collect();
        // Staging flags are read and written for runners that stage only.
        runners.retain(|&slot| layout.stages[slot]);
        let ledger = other.ledger.part(claims, &handoffs, &runners);
        let held = Slots::sparse_of(slots, values);
        let mut fence = Fence::assemble(held, ledger, Arc::clone(layout), false);
        // A failed operation fails the step's build (or its launch) with
        // it, and this fence is dropped: nothing to put back.
        fence.journal = Journal::discarded_on_failure();
        fence
    }

    /// What the fence holds (a dry run's: what its step can meet).
    pub(crate) fn held(&self) -> Held {
        Held {
            slots: self.runners.held(),
            ledger: self.ledger.entries(),
        }
    }

    pub(crate) fn stats(&self) -> FenceStats {
        self.stats
    }

    /// Numbers a step graph built on this fence: 0 for the first, then 1,
    /// ... (its name in a trace).
    pub(crate) fn number_step(&mut self) -> u64 {
        self.steps_built += 1;
        self.steps_built - 1
    }

    /// Moves on with every committed transaction, and with nothing else
    /// (a failed operation rolls back and leaves it): a step graph that
    /// sees the same epoch as after its own latest launch knows that the
    /// fence is as that launch left it.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Replaces the trace told of every use of the plan (`None`: no
    /// trace) and returns the one before.
    pub(crate) fn observe(
        &mut self,
        observer: Option<Box<dyn Observer<B>>>,
    ) -> Option<Box<dyn Observer<B>>> {
        self.user = NO_USER;
        self.step_user = NO_USER;
        std::mem::replace(&mut self.observer, observer)
    }

    /// The trace the program started, if one runs.
    pub(crate) fn observer(&mut self) -> Option<&mut (dyn Observer<B> + 'static)> {
        self.observer.as_deref_mut()
    }

    /// A use of the plan begins on `on`, before its waits: the trace (if
    /// one runs) gives it an id, which every completion it leaves carries.
    pub(crate) fn begin_use(&mut self, kind: impl FnOnce() -> UseKind, on: On<'_, B::Stream>) {
        self.user = match &mut self.observer {
            Some(observer) => observer.begin(kind(), on.id),
            None => NO_USER,
        };
    }

    /// Runs `work` (the use's launch, or what a consumer enqueues) between
    /// two marks of the trace on `on`.
    pub(crate) fn timed<T>(
        &mut self,
        backend: &B,
        on: On<'_, B::Stream>,
        work: impl FnOnce() -> T,
    ) -> T {
        if let Some(observer) = &mut self.observer {
            observer.mark(backend, on.stream);
        }
        let out = work();
        if let Some(observer) = &mut self.observer {
            observer.mark(backend, on.stream);
        }
        out
    }

    /// The use in progress is enqueued: the trace keeps it. (A use that
    /// failed before it enqueued anything never ends; the trace drops it.)
    pub(crate) fn end_use(&mut self) {
        if let Some(observer) = &mut self.observer {
            observer.end();
        }
    }

    /// The use in progress waited for (or, `skipped`, was ordered by
    /// stream order after) the use with trace id `from`.
    fn note_wait(&mut self, from: u32, skipped: bool) {
        if let Some(observer) = &mut self.observer {
            observer.wait(from, skipped);
        }
    }

    /// The fence slot of handoff `h`.
    pub(crate) fn handoff_slot(&self, h: HandoffId) -> usize {
        self.layout.handoff_base + h.0 as usize
    }

    /// The event of `slot`, if it is fenced.
    pub(crate) fn event(&self, slot: usize) -> Option<&B::Event> {
        self.runners.get(slot).and_then(|r| r.event.as_ref())
    }

    /// Whether runner slot `slot` reads inputs the program stages, in
    /// bytes of its own.
    pub(crate) fn stages(&self, slot: usize) -> bool {
        self.layout.stages[slot]
    }

    /// Whether handoff `h`'s writer records its event at a ready point.
    pub(crate) fn is_ready(&self, h: HandoffId) -> bool {
        self.ledger.handoffs[h.0 as usize].ready
    }

    /// Who last used which bytes, and the handoffs' writes and reads, the
    /// fence given up for it (a dry run's, once its step is compiled).
    pub(crate) fn into_ledger(self) -> Ledger {
        self.ledger
    }

    /// Whether the slot is fenced (uses buffers).
    pub(crate) fn is_fenced(&self, slot: usize) -> bool {
        self.runners[slot].event.is_some()
    }

    /// Replays runner slot `slot` on `on` (entered through [`enter`]): the
    /// handoff checks, then one transaction of the waits and `launch`,
    /// then the bookkeeping. Nothing is enqueued when a check fails; when
    /// a wait or the launch fails, the transaction rolls back and the
    /// fence is as it was. Once `launch` succeeded, every piece of
    /// bookkeeping happens (each sets its state before it tries a record,
    /// so nothing launched goes untracked) and the first error is
    /// returned. The latest replay again, with nothing between, makes the
    /// transaction's calls and leaves its state without running it
    /// ([`Fence::repeats`]).
    #[inline]
    pub(crate) fn replay(
        &mut self,
        backend: &B,
        plan: &Planned,
        slot: usize,
        on: On<'_, B::Stream>,
        launch: impl FnOnce() -> std::result::Result<(), BackendError>,
    ) -> Result<()> {
        match self.repeats(slot, on.id) {
            Some(again) => self.replay_again(backend, plan, slot, on, again, launch),
            None => self.replay_whole(backend, plan, slot, on, launch),
        }
    }

    /// [`Fence::replay`]'s whole transaction.
    #[inline(never)]
    fn replay_whole(
        &mut self,
        backend: &B,
        plan: &Planned,
        slot: usize,
        on: On<'_, B::Stream>,
        launch: impl FnOnce() -> std::result::Result<(), BackendError>,
    ) -> Result<()> {
        let r = &plan.runners[slot];
        let runner = r.id();
        let record = &r.record;
        let base = self.layout.handoff_base;
        self.check_reads(plan, slot)?;
        if self.layout.stages[slot] {
            self.staged_check(plan, slot)?;
        }
        let failed = |error| ReplayError::from(Operation::Replay(runner).failed(error));
        self.begin_use(|| UseKind::Replay { runner }, on);
        self.begin();
        let launched = self.admit(backend, slot, on).and_then(|()| {
            for &h in &record.reads {
                let i = base + h.0 as usize;
                // Its latest write (ready point or graph), not its other
                // readers.
                self.wait_replay(backend, i, on)?;
                // Nothing may fail between the launch and tracking its
                // reads.
                self.reserve_reader(backend, i, on.id)?;
            }
            self.timed(backend, on, launch)
        });
        if let Err(error) = launched {
            self.rollback();
            return Err(failed(error));
        }
        self.commit();
        self.stats.replays += 1;
        let fenced = self.is_fenced(slot);
        let tracked = self.track_replay(backend, plan, slot, fenced, on);
        self.end_use();
        let plain =
            record.reads.is_empty() && record.writes.is_empty() && !self.layout.stages[slot];
        self.repeat = (tracked.is_ok() && plain && fenced).then_some(Repeat {
            slot,
            epoch: self.epoch,
        });
        tracked.map_err(failed)
    }

    /// A replay's handoff checks, before anything is enqueued: each handoff
    /// the runner reads is written, not overwritten since, and not read by
    /// it already.
    #[inline]
    fn check_reads(&mut self, plan: &Planned, slot: usize) -> Result<()> {
        let runner = plan.runners[slot].id();
        let base = self.layout.handoff_base;
        for (k, &h) in plan.runners[slot].record.reads.iter().enumerate() {
            let (i, at) = (h.0 as usize, self.layout.read_at[slot][k]);
            let state = &self.ledger.handoffs[i];
            let writer = plan.runners[plan.handoffs[i].record.writer].id();
            if state.written == 0 {
                return Err(ReplayError::HandoffNotWritten {
                    reader: runner,
                    handoff: h,
                    writer,
                });
            }
            let already = state.read[at] == state.written;
            if let Err(NotOwner::OverwrittenBy(other)) =
                self.owner_check(base + i, &[plan.handoffs[i].claim])
            {
                let by = match other.checked_sub(base) {
                    Some(g) => plan.runners[plan.handoffs[g].record.writer].id(),
                    None => plan.runners[other].id(),
                };
                return Err(ReplayError::HandoffOverwritten {
                    reader: runner,
                    handoff: h,
                    writer,
                    by,
                });
            }
            if already {
                return Err(ReplayError::HandoffAlreadyRead {
                    reader: runner,
                    handoff: h,
                    writer,
                });
            }
        }
        Ok(())
    }

    /// A launched replay's bookkeeping: its own claims (`fenced`: it has
    /// any), the handoffs it wrote and read. Every piece happens (each sets
    /// its state before it tries a record, so nothing launched goes
    /// untracked); the first error is returned.
    #[inline]
    fn track_replay(
        &mut self,
        backend: &B,
        plan: &Planned,
        slot: usize,
        fenced: bool,
        on: On<'_, B::Stream>,
    ) -> std::result::Result<(), BackendError> {
        let r = &plan.runners[slot];
        let record = &r.record;
        let base = self.layout.handoff_base;
        let mut tracked = if fenced {
            self.settle_use(backend, slot, &r.claims, on)
        } else {
            Ok(())
        };
        for &h in &record.writes {
            let i = h.0 as usize;
            let state = &mut self.ledger.handoffs[i];
            state.written += 1;
            let in_graph = state.ready;
            let claim = plan.handoffs[i].claim;
            tracked = tracked.and(if in_graph {
                self.written_at_ready_point(base + i, claim, on);
                Ok(())
            } else {
                self.settle_use(backend, base + i, &[claim], on)
            });
        }
        for (k, &h) in record.reads.iter().enumerate() {
            let (i, at) = (h.0 as usize, self.layout.read_at[slot][k]);
            let state = &mut self.ledger.handoffs[i];
            state.read[at] = state.written;
            // Recorded at once, right after the graph: the next writer
            // always waits for it, and a record deferred to that wait would
            // also cover whatever the reader's stream ran since (the next
            // step's work, in steady state).
            tracked = tracked.and(
                self.add_reader(backend, base + i, on)
                    .and_then(|()| self.end_read(backend, base + i, on)),
            );
        }
        tracked
    }

    /// Whether a replay of `slot` on the stream with id `stream` is the
    /// latest replay again with nothing between, and how: the same slot, no
    /// operation committed since (the ledger changes only with one, so the
    /// slot is still the latest user of every byte it claims), no reader
    /// since, and no trace. Then its one latest user is itself, and the
    /// whole transaction would do one of two things:
    ///
    /// - [`Again::OnItsStream`]: its completion is still pending at the tail
    ///   of `stream`, with no record owed at once. It would wait for nobody
    ///   (stream order), launch, and leave every state as it was.
    /// - [`Again::Across`]: its event is recorded at once on another stream,
    ///   and `stream` has not waited for that record. It would wait for the
    ///   record, launch, and record the event at once on `stream`.
    #[inline]
    fn repeats(&self, slot: usize, stream: u64) -> Option<Again> {
        #[cfg(test)]
        if self.never_repeat {
            return None;
        }
        let repeat = self.repeat?;
        if repeat.slot != slot || repeat.epoch != self.epoch || self.observer.is_some() {
            return None;
        }
        let runner = &self.runners[slot];
        if runner.event.is_none() || runner.readers.iter().any(|r| r.completion.is_some()) {
            return None;
        }
        match runner.completion {
            Some(Completion::Pending { id, .. }) if id == stream && !runner.record_at_once => {
                Some(Again::OnItsStream)
            }
            Some(Completion::Recorded { id })
                if id != stream && runner.record_at_once && runner.waited_by != Some(stream) =>
            {
                Some(Again::Across)
            }
            _ => None,
        }
    }

    /// [`Fence::replay`] when it [`repeats`](Fence::repeats): the calls
    /// the whole transaction would make, and on success the state and
    /// counts it would leave (one replay; its wait for itself skipped, or
    /// made and its event recorded again) and a new epoch. A failed wait or
    /// launch changes nothing; a record that fails after the launch leaves
    /// the completion pending on `on`, as the whole transaction does.
    #[inline]
    fn replay_again(
        &mut self,
        backend: &B,
        plan: &Planned,
        slot: usize,
        on: On<'_, B::Stream>,
        again: Again,
        launch: impl FnOnce() -> std::result::Result<(), BackendError>,
    ) -> Result<()> {
        let failed =
            |error| ReplayError::from(Operation::Replay(plan.runners[slot].id()).failed(error));
        let Again::Across = again else {
            launch().map_err(failed)?;
            self.replayed_again(slot);
            self.stats.waits_skipped += 1;
            return Ok(());
        };
        let Some(event) = &self.runners[slot].event else {
            return Ok(());
        };
        backend.wait_event(on.stream, event).map_err(failed)?;
        launch().map_err(failed)?;
        let recorded = backend.record_event(on.stream, event);
        self.replayed_again(slot);
        self.stats.waits += 1;
        let r = &mut self.runners[slot];
        r.waited_on = false;
        r.waited_by = None;
        match recorded {
            Ok(()) => {
                self.stats.event_records += 1;
                r.completion = Some(Completion::Recorded { id: on.id });
                Ok(())
            }
            Err(error) => {
                // Waited for, not recorded: it completes at the tail of
                // `on`, and the next waiter records it there.
                r.waited_on = true;
                r.completion = Some(Completion::Pending {
                    stream: on.stream.clone(),
                    id: on.id,
                });
                self.repeat = None;
                Err(failed(error))
            }
        }
    }

    /// A repeated replay of `slot` went out: one replay more, a new epoch,
    /// and the repeat stands at it.
    #[inline]
    fn replayed_again(&mut self, slot: usize) {
        self.epoch += 1;
        self.stats.replays += 1;
        self.user = NO_USER;
        self.runners[slot].by = NO_USER;
        self.repeat = Some(Repeat {
            slot,
            epoch: self.epoch,
        });
    }

    /// Makes `on` wait for every user of the bytes runner slot `slot`'s
    /// replay overwrites (its claims and the handoffs it writes).
    fn admit(
        &mut self,
        backend: &B,
        slot: usize,
        on: On<'_, B::Stream>,
    ) -> std::result::Result<(), BackendError> {
        // Most replays claim one range of a region one runner painted last
        // (a round-robin generation): at most one user, no list.
        if let [claim] = self.layout.admit_claims[slot][..] {
            if let Some(user) = self.ledger.painter.sole_user(claim) {
                return user.map_or(Ok(()), |u| self.wait_for(backend, u as usize, on));
            }
        }
        let mut users = std::mem::take(&mut self.scratch);
        users.clear();
        for &claim in &self.layout.admit_claims[slot] {
            self.ledger.painter.users(claim, &mut users);
        }
        let admitted = users
            .iter()
            .try_for_each(|&u| self.wait_for(backend, u as usize, on));
        self.scratch = users;
        admitted
    }

    /// [`ReplayError::InputNotStaged`] unless the staged runner `slot` owns
    /// its bytes (it was staged, or replayed, and nothing took them since)
    /// and its latest staging write succeeded.
    fn staged_check(&mut self, plan: &Planned, slot: usize) -> Result<()> {
        let runner = plan.runners[slot].id();
        match self.owner_check(slot, &plan.runners[slot].claims) {
            Ok(()) if self.ledger.unstaged[slot] => {
                Err(ReplayError::InputNotStaged { runner, by: None })
            }
            Ok(()) => Ok(()),
            Err(NotOwner::NeverReplayed) => Err(ReplayError::InputNotStaged { runner, by: None }),
            Err(NotOwner::OverwrittenBy(other)) => Err(ReplayError::InputNotStaged {
                runner,
                by: Some(slot_owner(plan, other)),
            }),
        }
    }

    /// Checks that a consumer of the runners in `slots` may read their
    /// bytes: each (fenced) runner still owns what its latest replay wrote.
    /// Nothing is enqueued.
    pub(crate) fn check_consumable(
        &mut self,
        plan: &Planned,
        slots: &[usize],
    ) -> std::result::Result<(), ConsumeError> {
        for &slot in slots {
            if !self.is_fenced(slot) {
                // A runner without buffers has nothing to fence.
                continue;
            }
            let runner = plan.runners[slot].id();
            match self.owner_check(slot, &plan.runners[slot].claims) {
                Ok(()) => {}
                Err(NotOwner::NeverReplayed) => return Err(ConsumeError::NotReplayed { runner }),
                Err(NotOwner::OverwrittenBy(other)) => {
                    return Err(ConsumeError::Overwritten {
                        runner,
                        by: slot_owner(plan, other),
                    });
                }
            }
        }
        Ok(())
    }

    /// Runs a consumer of the runners in `slots` on `on` (entered through
    /// [`enter_scope`]) after checking that it may read their bytes (each
    /// fenced runner still owns what its latest replay wrote).
    ///
    /// One transaction waits for each runner's latest replay (or rolls
    /// back when a wait fails: nothing was enqueued); it commits *before*
    /// `work` enqueues anything, and the consumer becomes a reader that
    /// every later claimer of the bytes waits for, so whatever `work`
    /// enqueues is fenced even if it fails or unwinds (a later waiter
    /// records the reader's event on the stream). After `work`, the
    /// readers' events are recorded (even when `work` failed: it may have
    /// enqueued). `work` says whether it succeeded: only then does the
    /// consumer count, and only then are staged inputs staged.
    ///
    /// An `exclusive` consumer (one that writes the bytes) waits for the
    /// replay and every reader instead, and the runner then completes where
    /// it does: every later user waits for it. An exclusive consumer of one
    /// runner with inputs the program stages writes them: unless the
    /// runner owns its bytes, `on` first waits for every user of them (the
    /// replays and consumers still reading the old contents, of any
    /// bucket), and the runner becomes their owner, completing at the tail
    /// of `on`; its inputs count as staged once `work` succeeded.
    pub(crate) fn consume<T>(
        &mut self,
        backend: &B,
        plan: &Planned,
        slots: &[usize],
        on: On<'_, B::Stream>,
        exclusive: bool,
        work: impl FnOnce() -> (T, bool),
    ) -> std::result::Result<T, ConsumeError> {
        let staging = match slots {
            [slot] if exclusive && self.layout.stages[*slot] => Some(*slot),
            _ => None,
        };
        let takes = match staging {
            Some(slot) => self.owner_check(slot, &plan.runners[slot].claims).is_err(),
            None => {
                self.check_consumable(plan, slots)?;
                false
            }
        };
        let failed = |slot: usize| consume_failed(plan, slot);
        let runners = || slots.iter().map(|&s| plan.runners[s].id()).collect();
        self.begin_use(
            || UseKind::Consume {
                runners: runners(),
                writes: exclusive,
            },
            on,
        );
        self.consume_waits(backend, plan, slots, on, takes, exclusive)?;
        // The consumer's work is fenced before it is enqueued.
        if let (Some(slot), true) = (staging, takes) {
            for &claim in &plan.runners[slot].claims {
                self.ledger.painter.paint(claim, slot as u32);
            }
        }
        if let Some(slot) = staging {
            self.ledger.unstaged[slot] = true;
        }
        let mut begun = Ok(());
        for &slot in slots {
            if !self.is_fenced(slot) {
                continue;
            }
            if exclusive {
                self.forget_unused_record(slot);
                self.settle(slot, on);
                self.readers_waited(slot);
            } else {
                begun = begun.and(self.add_reader(backend, slot, on).map_err(failed(slot)));
            }
        }
        begun?;
        let (out, succeeded) = self.timed(backend, on, work);
        let mut recorded = Ok(());
        for &slot in slots {
            if !self.is_fenced(slot) {
                continue;
            }
            let ended = if exclusive {
                self.record_if_expected(backend, slot, on)
            } else {
                self.end_read(backend, slot, on)
            };
            recorded = recorded.and(ended.map_err(failed(slot)));
        }
        if succeeded {
            // One per consumer whose work ran, whatever its runners (with
            // buffers or not, one or many), as replays count every launch.
            self.stats.consumers += 1;
            if let Some(slot) = staging {
                self.ledger.unstaged[slot] = false;
            }
        }
        self.end_use();
        recorded.map(|()| out)
    }

    /// A consumer's waits, one transaction: for each runner with buffers,
    /// its latest replay (and, for a reader, a reserved reader record), or
    /// every user of its bytes where the consumer writes them or takes
    /// them for staging. When a wait fails, the fence is as it was.
    #[inline]
    fn consume_waits(
        &mut self,
        backend: &B,
        plan: &Planned,
        slots: &[usize],
        on: On<'_, B::Stream>,
        takes: bool,
        exclusive: bool,
    ) -> std::result::Result<(), ConsumeError> {
        self.begin();
        let waited = slots.iter().try_for_each(|&slot| {
            if !self.is_fenced(slot) {
                // A runner without buffers has nothing to fence.
                return Ok(());
            }
            let waited = match (takes, exclusive) {
                (true, _) => self.admit(backend, slot, on),
                (false, true) => self.wait_for(backend, slot, on),
                (false, false) => self
                    .wait_replay(backend, slot, on)
                    .and_then(|()| self.reserve_reader(backend, slot, on.id)),
            };
            waited.map_err(consume_failed(plan, slot))
        });
        if let Err(e) = waited {
            self.rollback();
            return Err(e);
        }
        self.commit();
        Ok(())
    }

    /// Makes `on` wait for runner slot `slot`'s latest replay and every
    /// consumer of it since, and for the latest reads of every handoff it
    /// reads (every reader's: a reader without bytes of its own has no
    /// completion of its own). One transaction: when a wait fails, the
    /// fence is as it was.
    pub(crate) fn wait_for_runner(
        &mut self,
        backend: &B,
        plan: &Planned,
        slot: usize,
        on: On<'_, B::Stream>,
    ) -> std::result::Result<(), BackendError> {
        let runner = plan.runners[slot].id();
        self.begin_use(
            || UseKind::Wait {
                runner: Some(runner),
            },
            on,
        );
        self.begin();
        let waited = self.wait_for(backend, slot, on).and_then(|()| {
            plan.runners[slot].record.reads.iter().try_for_each(|&h| {
                let i = self.handoff_slot(h);
                self.wait_for(backend, i, on)
            })
        });
        self.settle_transaction(waited)?;
        self.timed(backend, on, || ());
        self.end_use();
        Ok(())
    }

    /// Makes `on` wait for every slot's latest completion. One
    /// transaction: when a wait fails, the fence is as it was.
    pub(crate) fn wait_all(
        &mut self,
        backend: &B,
        on: On<'_, B::Stream>,
    ) -> std::result::Result<(), BackendError> {
        self.begin_use(|| UseKind::Wait { runner: None }, on);
        self.begin();
        let waited = self.wait_everything(backend, on);
        self.settle_transaction(waited)?;
        self.timed(backend, on, || ());
        self.end_use();
        Ok(())
    }

    /// Commits the open transaction when `result` is `Ok`, rolls it back
    /// otherwise.
    fn settle_transaction<T, E>(
        &mut self,
        result: std::result::Result<T, E>,
    ) -> std::result::Result<T, E> {
        match &result {
            Ok(_) => self.commit(),
            Err(_) => self.rollback(),
        }
        result
    }

    /// Inside an open transaction: makes `on` wait for every slot's latest
    /// completion.
    fn wait_everything(
        &mut self,
        backend: &B,
        on: On<'_, B::Stream>,
    ) -> std::result::Result<(), BackendError> {
        (0..self.runners.held()).try_for_each(|k| {
            let u = self.runners.slot_at(k);
            self.wait_for(backend, u, on)
        })
    }

    /// Launches a step graph on `on` in one transaction: `before` (the
    /// step's own waits on `on`; with `everything`, after a wait for every
    /// slot's latest completion), then `launch`. When a call fails, the
    /// fence is as it was. Once the launch went out: `ledger` is what the
    /// fence knows once it ran, and (with `moved`: the step's latest launch
    /// was on another stream, or the fence changed since) every slot that
    /// was used, or that the step touches, completes at the tail of `on`
    /// (the step graph joins all its work there, after everything the
    /// fence knew of); readers are covered by that too. All of it happens
    /// before this returns, so nothing rests on what becomes of the step
    /// graph (a forgotten one included).
    #[allow(clippy::too_many_arguments)] // one transaction's parts
    pub(crate) fn launch_step(
        &mut self,
        backend: &B,
        on: On<'_, B::Stream>,
        everything: bool,
        before: impl FnOnce() -> std::result::Result<(), BackendError>,
        launch: impl FnOnce() -> std::result::Result<(), BackendError>,
        moved: Option<(&Ledger, &[usize])>,
        kind: UseKind,
    ) -> std::result::Result<(), BackendError> {
        self.begin();
        let waited = match everything {
            // A slice of its own in a trace.
            true => {
                self.begin_use(|| UseKind::Wait { runner: None }, on);
                let waited = self.wait_everything(backend, on);
                if waited.is_ok() {
                    self.timed(backend, on, || ());
                    self.end_use();
                }
                waited
            }
            false => Ok(()),
        };
        self.begin_use(|| kind, on);
        let launched = waited
            .and_then(|()| before())
            .and_then(|()| self.timed(backend, on, launch));
        self.settle_transaction(launched)?;
        if let Some((ledger, touched)) = moved {
            self.absorb_step(ledger, touched, on);
        }
        self.count_step_launch();
        Ok(())
    }

    /// After a launch of a step graph on `on`: the fence takes `ledger`,
    /// what it knows of the step's part once it ran, and every slot that
    /// was used, or that the step touches (`touched`, ascending),
    /// completes at the tail of `on`.
    fn absorb_step(&mut self, ledger: &Ledger, touched: &[usize], on: On<'_, B::Stream>) {
        let user = self.user;
        for (i, runner) in self.runners.pairs_mut() {
            debug_assert!(
                !self.journal.in_open(),
                "a step is absorbed after its launch"
            );
            if runner.event.is_none() {
                continue;
            }
            if runner.completion.is_some() || touched.binary_search(&i).is_ok() {
                runner.completion = Some(Completion::Pending {
                    stream: on.stream.clone(),
                    id: on.id,
                });
                runner.by = user;
                runner.record_at_once = false;
                runner.waited_on = false;
                runner.waited_by = None;
            }
            for reader in &mut runner.readers {
                reader.completion = None;
            }
        }
        self.ledger.take_part(ledger);
    }

    /// Counts one launch of a step graph of the plan (enqueued: the use
    /// the launch began ends).
    fn count_step_launch(&mut self) {
        self.stats.step_launches += 1;
        // A launch on the stream of the one before leaves the state that
        // one left (no `absorb_step`): what ended with it ends with this one.
        if self.observer.is_some() {
            let (before, now) = (self.step_user, self.user);
            for runner in &mut self.runners {
                if runner.by == before && before != NO_USER {
                    runner.by = now;
                }
            }
            self.step_user = now;
        }
        self.end_use();
    }

    /// A handoff's writer recorded its event at the graph's ready point:
    /// handoff slot `slot` is the latest user of `claim`, its event recorded
    /// on `on` (inside the graph).
    fn written_at_ready_point(&mut self, slot: usize, claim: Claim, on: On<'_, B::Stream>) {
        self.paint(claim, slot);
        self.readers_waited(slot);
        self.save(slot);
        let runner = &mut self.runners[slot];
        runner.completion = Some(Completion::Recorded { id: on.id });
        runner.by = self.user;
        runner.record_at_once = false;
        runner.waited_on = false;
        runner.waited_by = None;
    }

    /// `slot` is the latest user of `claims` and completes at the tail of
    /// `on` (recorded there at once if another stream waits for it).
    fn settle_use(
        &mut self,
        backend: &B,
        slot: usize,
        claims: &[Claim],
        on: On<'_, B::Stream>,
    ) -> std::result::Result<(), BackendError> {
        for &claim in claims {
            self.paint(claim, slot);
        }
        // Outside a transaction (the ledger changes only outside one): nothing
        // is kept aside, so the slot's state changes in place, found once.
        debug_assert!(!self.in_transaction(), "a use settles once it went out");
        let (user, exact) = (self.user, self.exact);
        let runner = &mut self.runners[slot];
        runner.by = user;
        // The replay waited for every reader of the runner's bytes (it is
        // their claimer): the new replay has none yet.
        for reader in &mut runner.readers {
            reader.completion = None;
        }
        runner.forget_unused_record();
        // The runner completes at the tail of `on` from now on, whether or
        // not a record succeeds: a failed record (the stream began
        // capturing on another thread since the launch, say) leaves a
        // pending completion that a later waiter records, never an older
        // one that would let it skip the wait.
        if !runner.record_at_once && !exact {
            runner.settle(on, user);
            return Ok(());
        }
        // Recorded at once where another stream is expected to wait for
        // it (always, on a fence with exact records).
        let Some(event) = &runner.event else {
            return Ok(());
        };
        match backend.record_event(on.stream, event) {
            Ok(()) => {
                self.stats.event_records += 1;
                runner.recorded_on(on.id);
                Ok(())
            }
            Err(error) => {
                runner.settle(on, user);
                Err(error)
            }
        }
    }

    /// Every reader of `slot` was waited for: forget them (their events are
    /// kept for the next readers).
    #[inline(always)]
    fn readers_waited(&mut self, slot: usize) {
        for at in 0..self.runners[slot].readers.len() {
            self.save_reader(slot, at);
            self.runners[slot].readers[at].completion = None;
        }
    }

    /// `slot` is the latest user of `claim`'s bytes. Only once the use
    /// went out: the ledger changes outside transactions.
    fn paint(&mut self, claim: Claim, slot: usize) {
        debug_assert!(
            !self.in_transaction(),
            "the ledger changed in a transaction"
        );
        self.ledger.painter.paint(claim, slot as u32);
    }

    /// Nobody waited for the last record made at once: defer again.
    #[inline(always)]
    fn forget_unused_record(&mut self, i: usize) {
        if self.runners[i].record_at_once && !self.runners[i].waited_on {
            self.save(i);
            self.runners[i].forget_unused_record();
        }
    }

    /// Whether `slot` is still the latest user of every byte it claims.
    fn owner_check(&mut self, slot: usize, claims: &[Claim]) -> std::result::Result<(), NotOwner> {
        if self.runners[slot].completion.is_none() {
            return Err(NotOwner::NeverReplayed);
        }
        let mut users = std::mem::take(&mut self.scratch);
        users.clear();
        for &claim in claims {
            self.ledger.painter.users(claim, &mut users);
        }
        let result = match users.iter().find(|&&u| u as usize != slot) {
            Some(&other) => Err(NotOwner::OverwrittenBy(other as usize)),
            None if users.is_empty() => Err(NotOwner::NeverReplayed),
            None => Ok(()),
        };
        self.scratch = users;
        result
    }

    /// Makes sure a reader of `slot` on the stream with id `sid` can be
    /// added later without creating an event (called before a launch whose
    /// reads are tracked after it: nothing can fail between the launch and
    /// the tracking).
    /// Inlined, as [`Fence::add_reader`] and [`Fence::end_read`]: every
    /// replay that reads a handoff runs them.
    #[inline(always)]
    fn reserve_reader(
        &mut self,
        backend: &B,
        slot: usize,
        sid: u64,
    ) -> std::result::Result<(), BackendError> {
        let runner = &self.runners[slot];
        let has = runner.readers.iter().any(|r| {
            r.completion.is_none() || r.completion.as_ref().is_some_and(|c| c.stream_id() == sid)
        });
        if !has {
            let event = backend.create_event()?;
            self.push_reader(slot, event);
        }
        Ok(())
    }

    /// Makes the work at the tail of `on` from now on a reader of `slot`:
    /// the next claimer of its bytes waits for it.
    #[inline(always)]
    fn add_reader(
        &mut self,
        backend: &B,
        slot: usize,
        on: On<'_, B::Stream>,
    ) -> std::result::Result<(), BackendError> {
        let user = self.user;
        if let Some(Completion::Pending { id, .. }) = &self.runners[slot].completion {
            if *id == on.id {
                // The runner's own pending record will cover the consumer
                // (a later waiter waits for what ends with the consumer).
                self.save(slot);
                self.runners[slot].by = user;
                return Ok(());
            }
        }
        let readers = &self.runners[slot].readers;
        let same = readers.iter().position(|r| {
            r.completion
                .as_ref()
                .is_some_and(|c| c.stream_id() == on.id)
        });
        let free = || readers.iter().position(|r| r.completion.is_none());
        let at = match same.or_else(free) {
            Some(at) => {
                self.save_reader(slot, at);
                at
            }
            None => {
                let event = backend.create_event()?;
                self.push_reader(slot, event)
            }
        };
        let reader = &mut self.runners[slot].readers[at];
        reader.completion = Some(Completion::Pending {
            stream: on.stream.clone(),
            id: on.id,
        });
        reader.by = user;
        Ok(())
    }

    /// Ends a read of `slot` on `on`: records its reader's event at once
    /// (the next claimer of the bytes waits for exactly the reader's work).
    #[inline(always)]
    fn end_read(
        &mut self,
        backend: &B,
        slot: usize,
        on: On<'_, B::Stream>,
    ) -> std::result::Result<(), BackendError> {
        let reader = self.runners[slot].readers.iter().position(
            |r| matches!(r.completion, Some(Completion::Pending { id, .. }) if id == on.id),
        );
        if let Some(at) = reader {
            backend.record_event(on.stream, &self.runners[slot].readers[at].event)?;
            self.stats.event_records += 1;
            self.save_reader(slot, at);
            self.runners[slot].readers[at].completion = Some(Completion::Recorded { id: on.id });
        }
        Ok(())
    }

    /// Makes `on` wait for slot `u`'s latest replay and every reader of it
    /// since (for the program's waits, and a claimer's). Inlined, with
    /// [`Fence::wait_replay`], [`Fence::settle`] and
    /// [`Fence::record_if_expected`]: every replay runs them (a step's dry
    /// run, once per scheduled replay), mostly to find nothing to do.
    #[inline(always)]
    fn wait_for(
        &mut self,
        backend: &B,
        u: usize,
        on: On<'_, B::Stream>,
    ) -> std::result::Result<(), BackendError> {
        // (Found once: a wait adds no reader.)
        let readers = self.runners[u].readers.len();
        self.wait_replay(backend, u, on)?;
        for at in 0..readers {
            let reader = &self.runners[u].readers[at];
            let by = reader.by;
            let Some(completion) = &reader.completion else {
                continue;
            };
            if completion.stream_id() == on.id {
                self.stats.waits_skipped += 1;
                self.note_wait(by, true);
                continue;
            }
            self.save_reader(u, at);
            let reader = &mut self.runners[u].readers[at];
            if record_pending(backend, &reader.event, &mut reader.completion, self.claims)? {
                self.stats.event_records += 1;
            }
            backend.wait_event(on.stream, &self.runners[u].readers[at].event)?;
            self.stats.waits += 1;
            self.note_wait(by, false);
        }
        Ok(())
    }

    /// Makes `on` wait for slot `u`'s latest replay (or, where a consumer
    /// moved it, its latest completion).
    #[inline(always)]
    fn wait_replay(
        &mut self,
        backend: &B,
        u: usize,
        on: On<'_, B::Stream>,
    ) -> std::result::Result<(), BackendError> {
        let runner = &self.runners[u];
        let by = runner.by;
        let (Some(_), Some(completion)) = (&runner.event, &runner.completion) else {
            return Ok(());
        };
        let already =
            matches!(completion, Completion::Recorded { .. }) && runner.waited_by == Some(on.id);
        if completion.stream_id() == on.id || already {
            self.stats.waits_skipped += 1;
            self.note_wait(by, true);
            return Ok(());
        }
        self.save(u);
        let runner = &mut self.runners[u];
        let Some(event) = &runner.event else {
            return Ok(());
        };
        if record_pending(backend, event, &mut runner.completion, self.claims)? {
            self.stats.event_records += 1;
            runner.record_at_once = true;
        }
        backend.wait_event(on.stream, event)?;
        runner.waited_on = true;
        runner.waited_by = Some(on.id);
        self.stats.waits += 1;
        self.note_wait(by, false);
        Ok(())
    }

    /// Slot `i` now completes at the tail of `on`, its event not yet
    /// recorded there.
    #[inline(always)]
    fn settle(&mut self, i: usize, on: On<'_, B::Stream>) {
        self.save(i);
        let user = self.user;
        self.runners[i].settle(on, user);
    }

    /// Records slot `i`'s event on `on` now if another stream is expected
    /// to wait for it (always, on a fence with exact records).
    #[inline(always)]
    fn record_if_expected(
        &mut self,
        backend: &B,
        i: usize,
        on: On<'_, B::Stream>,
    ) -> std::result::Result<(), BackendError> {
        let exact = self.exact;
        let runner = &mut self.runners[i];
        let Some(event) = &runner.event else {
            return Ok(());
        };
        if runner.record_at_once || exact {
            backend.record_event(on.stream, event)?;
            self.stats.event_records += 1;
            self.save(i);
            self.runners[i].recorded_on(on.id);
        }
        Ok(())
    }

    /// Blocks until every replay and consumer the fence ordered is done:
    /// records deferred events, then waits for every runner's latest
    /// completion (each waited for the earlier users of its bytes), and
    /// forgets what it waited for. Does not wait for unrelated work. When a
    /// record or a wait fails, it falls back to waiting for the whole
    /// backend. `Ok` means nothing the fence ordered still runs; on `Err`
    /// the caller keeps (leaks) whatever that work may use.
    pub(crate) fn quiesce(&mut self, backend: &B) -> std::result::Result<(), BackendError> {
        let claims = self.claims;
        let mut all = Ok(());
        for runner in &mut self.runners {
            if let Some(event) = &runner.event {
                all = all.and(drain(backend, event, &mut runner.completion, claims));
            }
            for reader in &mut runner.readers {
                all = all.and(drain(
                    backend,
                    &reader.event,
                    &mut reader.completion,
                    claims,
                ));
            }
        }
        if all.is_err() {
            // A record or a wait failed (a stream captures now, say): wait
            // for the whole backend instead; if that fails too, the caller
            // must not free what the work may still use.
            backend.synchronize()?;
            for runner in &mut self.runners {
                runner.completion = None;
                for reader in &mut runner.readers {
                    reader.completion = None;
                }
            }
        }
        Ok(())
    }
}

/// Run-time buckets (`buckets.rs`): runners that join the sealed plan, and
/// whether a bucket's work is still in flight.
impl<B: Streams> Fence<B> {
    /// Runner slots `plan.runners.len() - events.len()..` joined the plan
    /// (a plan without handoffs: no handoff slot follows the runners), with
    /// these events (fenced runners only). They are used by nothing yet.
    /// The epoch moves on: a kept step graph's next launch starts from the
    /// fence's state now.
    pub(crate) fn add_runners(&mut self, plan: &Planned, events: Vec<Option<B::Event>>) {
        debug_assert!(plan.handoffs.is_empty() && !self.in_transaction());
        let start = plan.runners.len() - events.len();
        // Step graphs' dry runs that share the layout keep theirs.
        let layout = Arc::make_mut(&mut self.layout);
        for (r, event) in plan.runners[start..].iter().zip(events) {
            self.runners.push(Runner::new(event));
            layout.admit_claims.push(r.claims.clone());
            layout.read_at.push(Vec::new());
            let inputs = r.record.requests.iter();
            let stages =
                !r.claims.is_empty() && inputs.into_iter().any(|q| q.purpose == Purpose::Input);
            layout.stages.push(stages);
            self.ledger.unstaged.push(false);
        }
        layout.handoff_base = plan.runners.len();
        // Runners, then handoffs (none in a plan runners join): what a
        // step graph's dry run reserves events for.
        layout.slots = plan.runners.len() + plan.handoffs.len();
        self.epoch += 1;
    }

    /// Whether any work the fence ordered on runner slots `slots` (their
    /// latest replays and consumers) may still run: records the deferred
    /// events (at the tail of their streams) and asks the backend of each,
    /// without blocking. One transaction: on an error the fence is as it
    /// was; once records went out, the epoch moves on.
    pub(crate) fn in_flight(
        &mut self,
        backend: &B,
        slots: &[usize],
    ) -> std::result::Result<bool, BackendError> {
        self.begin();
        let claims = self.claims;
        let mut busy = false;
        let asked = slots
            .iter()
            .try_for_each(|&slot| -> std::result::Result<(), BackendError> {
                if self.runners[slot].event.is_none() {
                    return Ok(());
                }
                self.save(slot);
                for at in 0..self.runners[slot].readers.len() {
                    self.save_reader(slot, at);
                }
                let runner = &mut self.runners[slot];
                let mut done =
                    |event: &B::Event, completion: &mut Option<Completion<B::Stream>>| {
                        if completion.is_none() || busy {
                            return Ok(());
                        }
                        record_pending(backend, event, completion, claims)?;
                        busy |= !backend.event_done(event)?;
                        Ok::<(), BackendError>(())
                    };
                if let Some(event) = &runner.event {
                    done(event, &mut runner.completion)?;
                }
                for reader in &mut runner.readers {
                    done(&reader.event, &mut reader.completion)?;
                }
                Ok(())
            });
        self.settle_transaction(asked)?;
        Ok(busy)
    }
}

/// Records `event` where `completion` is still pending (on that stream) and
/// marks it recorded; `Ok(true)` when a record was issued. With `claims`
/// (a real backend's fence), the stream is claimed for the record: a
/// capture of any thread that holds it, or a capture of the program's own,
/// would take the record into its graph, so that is refused instead.
fn record_pending<B: Streams>(
    backend: &B,
    event: &B::Event,
    completion: &mut Option<Completion<B::Stream>>,
    claims: bool,
) -> std::result::Result<bool, BackendError> {
    let Some(Completion::Pending { stream, id }) = completion else {
        return Ok(false);
    };
    let refused = || BackendError::Refused {
        call: "the fence's event record",
        reason: "the stream the work completes on is capturing, so the record would go into \
                 that graph; end the capture first"
            .into(),
    };
    let _claim = match claims {
        true => Some(StreamClaim::enter(*id).map_err(|_| refused())?),
        false => None,
    };
    if claims && backend.is_capturing(stream)? {
        return Err(refused());
    }
    backend.record_event(stream, event)?;
    *completion = Some(Completion::Recorded { id: *id });
    Ok(true)
}

/// Records `completion`'s event if it is still pending, waits for it, and
/// forgets it once waited for (so a second quiesce waits for nothing).
fn drain<B: Streams>(
    backend: &B,
    event: &B::Event,
    completion: &mut Option<Completion<B::Stream>>,
    claims: bool,
) -> std::result::Result<(), BackendError> {
    if completion.is_none() {
        return Ok(());
    }
    record_pending(backend, event, completion, claims)?;
    backend.synchronize_event(event)?;
    *completion = None;
    Ok(())
}

/// A consumer's backend failure at runner slot `slot`, as its error.
fn consume_failed(plan: &Planned, slot: usize) -> impl Fn(BackendError) -> ConsumeError {
    let runner = plan.runners[slot].id();
    move |error| {
        ConsumeError::from(BackendFailure::of(
            Operation::Consume(runner),
            runner,
            error,
        ))
    }
}

/// Sorts `claims` by region and range and drops repeats. A schedule's
/// runners share few distinct ranges (a bucket's runners claim their
/// generations' bytes), so the distinct ones are kept first, then sorted;
/// past a few, all are sorted.
fn distinct_claims(claims: &mut Vec<Claim>) {
    const FEW: usize = 16;
    let key = |c: &Claim| (c.region, c.lo, c.hi);
    let mut distinct = 0;
    for i in 0..claims.len() {
        let c = claims[i];
        if claims[..distinct].contains(&c) {
            continue;
        }
        if distinct == FEW {
            // Many: those kept and those after, sorted (what lies between
            // repeats a kept one).
            claims.sort_unstable_by_key(key);
            claims.dedup();
            return;
        }
        claims[distinct] = c;
        distinct += 1;
    }
    claims.truncate(distinct);
    claims.sort_unstable_by_key(key);
}

/// The union of two ascending lists with no repeats, ascending.
fn merge(a: &[usize], b: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => {
                out.push(a[i]);
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                out.push(b[j]);
                j += 1;
            }
            std::cmp::Ordering::Equal => {
                out.push(a[i]);
                (i, j) = (i + 1, j + 1);
            }
        }
    }
    out.extend_from_slice(&a[i..]);
    out.extend_from_slice(&b[j..]);
    out
}

#[cfg(test)]
mod tests;
