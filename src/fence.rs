//! The replay fence: who last used which bytes, where each runner's latest
//! replay or consumer completes, and the events that make other streams
//! wait for it. [`Fence`] owns all of it; `replay.rs` is the public API
//! over it.
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
//! ([`Fence::consume_begin`], [`Fence::consume_end`]) reads a runner's bytes
//! outside its graph: it waits for the runner's replay only, and becomes a
//! *reader* of the runner (one per consumer stream, with its own event,
//! recorded right after the consumer's work): consumers on different
//! streams run at once, and every later claimer of those bytes waits for
//! the replay and every reader. A consumer on the stream the replay
//! completes on adds no reader: the replay's own record covers it.
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

use crate::backend::{Backend, BackendError};
use crate::painter::{Claim, Painter};

/// Counters of the fence's work since sealing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FenceStats {
    /// Graph launches through [`Replayable::replay`](crate::Replayable::replay).
    pub replays: u64,
    /// Consumers run through [`Replayable::consume`](crate::Replayable::consume).
    pub consumers: u64,
    /// Event waits issued (a stream waited for another stream).
    pub waits: u64,
    /// Waits not issued because stream order already implied them (the
    /// runner waited for completes on the same stream): free ordering.
    pub waits_skipped: u64,
    /// Event records issued (only for waits on another stream).
    pub event_records: u64,
    /// Launches of step graphs of the plan ([`StepGraph`](crate::StepGraph)),
    /// counted at each launch.
    pub step_launches: u64,
}

/// Where a runner's latest replay (or consumer) completes.
enum Completion<S> {
    /// At the tail of this stream; its event is not recorded there yet.
    Pending { stream: S, id: u64 },
    /// Its event is recorded on the stream with this id.
    Recorded { id: u64 },
}

impl<S> Completion<S> {
    fn stream_id(&self) -> u64 {
        match self {
            Completion::Pending { id, .. } | Completion::Recorded { id } => *id,
        }
    }
}

/// The fence's view of one runner slot.
struct Runner<B: Backend> {
    /// `None` for a runner that uses no buffers: it is never fenced.
    event: Option<B::Event>,
    completion: Option<Completion<B::Stream>>,
    /// Record right after each replay: another stream waited for the
    /// runner's last record.
    record_at_once: bool,
    /// A wait used the latest record made at once.
    waited_on: bool,
    /// The stream that last waited on the latest record: it need not wait
    /// again (stream order).
    waited_by: Option<u64>,
    /// Consumers of the latest replay on streams other than the one it
    /// completes on: each is waited for by the next claimer of the bytes,
    /// none by another consumer. Their events are reused across replays.
    readers: Vec<Reader<B>>,
}

/// One consumer stream's latest read of a runner's bytes.
struct Reader<B: Backend> {
    event: B::Event,
    /// `None` once a replay of the runner waited for it.
    completion: Option<Completion<B::Stream>>,
}

/// Why a consumer may not read a runner's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NotOwner {
    /// The runner was never replayed.
    NeverReplayed,
    /// Another runner (this slot) claimed some of its bytes since.
    OverwrittenBy(usize),
}

/// Events, completions and the byte painter of one plan.
pub(crate) struct Fence<B: Backend> {
    runners: Vec<Runner<B>>,
    painter: Painter,
    scratch: Vec<u32>,
    stats: FenceStats,
}

impl<B: Backend> Fence<B> {
    /// A fence over `regions` fence regions, with one entry per runner slot
    /// (its event, if it uses buffers).
    pub(crate) fn new(events: Vec<Option<B::Event>>, regions: usize) -> Fence<B> {
        Fence {
            runners: events
                .into_iter()
                .map(|event| Runner {
                    event,
                    completion: None,
                    record_at_once: false,
                    waited_on: false,
                    waited_by: None,
                    readers: Vec::new(),
                })
                .collect(),
            painter: Painter::new(regions),
            scratch: Vec::new(),
            stats: FenceStats::default(),
        }
    }

    pub(crate) fn stats(&self) -> FenceStats {
        self.stats
    }

    /// Fence slots: runners, then handoffs.
    pub(crate) fn slots(&self) -> usize {
        self.runners.len()
    }

    /// The event of `slot`, if it is fenced.
    pub(crate) fn event(&self, slot: usize) -> Option<&B::Event> {
        self.runners.get(slot).and_then(|r| r.event.as_ref())
    }

    /// Who last used which bytes.
    pub(crate) fn painter(&self) -> &Painter {
        &self.painter
    }

    /// Starts from another fence's record of who last used which bytes, and
    /// of which slots were ever used (`used`): a tracer of a step schedule
    /// starts where the real fence stands, so its ownership checks see
    /// what happened before the step.
    pub(crate) fn start_from(&mut self, painter: Painter, used: &[bool]) {
        self.painter = painter;
        for (runner, &used) in self.runners.iter_mut().zip(used) {
            if used && runner.event.is_some() && runner.completion.is_none() {
                // Before the step: ordered by launch order, no record here.
                runner.completion = Some(Completion::Recorded { id: u64::MAX });
            }
        }
    }

    /// Whether `slot` was ever used (replayed, written, consumed).
    pub(crate) fn was_used(&self, slot: usize) -> bool {
        self.runners
            .get(slot)
            .is_some_and(|r| r.completion.is_some())
    }

    /// Before a launch of a step graph on `stream`: `painter` is who last
    /// uses which bytes once it ran, and every slot that was used, or that
    /// the step touches, completes at the tail of `stream` (the step graph
    /// joins all its work there, after everything the fence knew of);
    /// readers are covered by that too. Called *before* the launch, so the
    /// fence orders every later user after it whatever happens to the step
    /// graph (a forgotten one included). Returns the painter it replaced,
    /// for a launch that fails.
    pub(crate) fn absorb_step(
        &mut self,
        painter: Painter,
        touched: &[bool],
        stream: &B::Stream,
        sid: u64,
    ) -> Painter {
        for (i, runner) in self.runners.iter_mut().enumerate() {
            if runner.event.is_none() {
                continue;
            }
            if runner.completion.is_some() || touched.get(i).copied().unwrap_or(false) {
                runner.completion = Some(Completion::Pending {
                    stream: stream.clone(),
                    id: sid,
                });
                runner.record_at_once = false;
                runner.waited_on = false;
                runner.waited_by = None;
            }
            for reader in &mut runner.readers {
                reader.completion = None;
            }
        }
        std::mem::replace(&mut self.painter, painter)
    }

    /// A launch of a step graph that failed before the step ran: who last
    /// used which bytes is `painter` again. The completions stay at the
    /// launch stream's tail (after everything the fence knew of: at worst
    /// a conservative wait).
    pub(crate) fn unabsorb_step(&mut self, painter: Painter) {
        self.painter = painter;
    }

    /// Counts one launch of a step graph of the plan.
    pub(crate) fn count_step_launch(&mut self) {
        self.stats.step_launches += 1;
    }

    /// Whether the slot is fenced (uses buffers).
    pub(crate) fn is_fenced(&self, slot: usize) -> bool {
        self.runners[slot].event.is_some()
    }

    /// Makes `stream` wait for the latest users of every byte of `claims`.
    pub(crate) fn admit(
        &mut self,
        backend: &B,
        claims: &[Claim],
        stream: &B::Stream,
        sid: u64,
    ) -> Result<(), BackendError> {
        let mut users = std::mem::take(&mut self.scratch);
        users.clear();
        for &claim in claims {
            self.painter.users(claim, &mut users);
        }
        let waited = users
            .iter()
            .try_for_each(|&u| self.wait_for(backend, u as usize, stream, sid));
        self.scratch = users;
        waited
    }

    /// After `slot`'s graph was launched on `stream`: it is the latest user
    /// of `claims` and completes on `stream`.
    pub(crate) fn complete(
        &mut self,
        backend: &B,
        slot: usize,
        claims: &[Claim],
        stream: &B::Stream,
        sid: u64,
    ) -> Result<(), BackendError> {
        self.stats.replays += 1;
        if !self.is_fenced(slot) {
            return Ok(());
        }
        self.settle_use(backend, slot, claims, stream, sid)
    }

    /// After a writer's graph was launched on `stream`: handoff slot `slot`
    /// is the latest user of `claim`. With `in_graph`, the graph recorded
    /// the handoff's event at its ready point; otherwise it completes with
    /// the graph.
    pub(crate) fn complete_handoff(
        &mut self,
        backend: &B,
        slot: usize,
        claim: Claim,
        stream: &B::Stream,
        sid: u64,
        in_graph: bool,
    ) -> Result<(), BackendError> {
        if !in_graph {
            return self.settle_use(backend, slot, &[claim], stream, sid);
        }
        self.painter.paint(claim, slot as u32);
        self.readers_waited(slot);
        let runner = &mut self.runners[slot];
        runner.completion = Some(Completion::Recorded { id: sid });
        runner.record_at_once = false;
        runner.waited_on = false;
        runner.waited_by = None;
        Ok(())
    }

    /// After a reader's graph was launched on `stream`: it read handoff
    /// slot `slot`, and the next writer of the handoff's bytes waits for
    /// it. Its event is recorded at once, right after the graph: the next
    /// writer always waits for it, and a record deferred to that wait would
    /// also cover whatever the reader's stream ran since (the next step's
    /// work, in steady state).
    pub(crate) fn read_handoff(
        &mut self,
        backend: &B,
        slot: usize,
        stream: &B::Stream,
        sid: u64,
    ) -> Result<(), BackendError> {
        self.add_reader(backend, slot, stream, sid)?;
        self.consume_end(backend, slot, stream, sid, false)
    }

    /// `slot` is the latest user of `claims` and completes at the tail of
    /// `stream` (recorded there at once if another stream waits for it).
    fn settle_use(
        &mut self,
        backend: &B,
        slot: usize,
        claims: &[Claim],
        stream: &B::Stream,
        sid: u64,
    ) -> Result<(), BackendError> {
        for &claim in claims {
            self.painter.paint(claim, slot as u32);
        }
        // The replay waited for every reader of the runner's bytes (it is
        // their claimer): the new replay has none yet.
        self.readers_waited(slot);
        self.forget_unused_record(slot);
        // The runner completes at the tail of `stream` from now on, whether
        // or not a record succeeds: a failed record (the stream began
        // capturing on another thread since the launch, say) leaves a
        // pending completion that a later waiter records, never an older
        // one that would let it skip the wait.
        if !self.runners[slot].record_at_once {
            self.settle(slot, stream, sid);
            return Ok(());
        }
        self.record_if_expected(backend, slot, stream, sid)
            .inspect_err(|_| self.settle(slot, stream, sid))
    }

    /// Every reader of `slot` was waited for: forget them (their events are
    /// kept for the next readers).
    fn readers_waited(&mut self, slot: usize) {
        for reader in &mut self.runners[slot].readers {
            reader.completion = None;
        }
    }

    /// Nobody waited for the last record made at once: defer again.
    fn forget_unused_record(&mut self, i: usize) {
        let runner = &mut self.runners[i];
        if runner.record_at_once && !runner.waited_on {
            runner.record_at_once = false;
        }
    }

    /// Whether `slot` is still the latest user of every byte it claims.
    pub(crate) fn owner_check(&mut self, slot: usize, claims: &[Claim]) -> Result<(), NotOwner> {
        if self.runners[slot].completion.is_none() {
            return Err(NotOwner::NeverReplayed);
        }
        let mut users = std::mem::take(&mut self.scratch);
        users.clear();
        for &claim in claims {
            self.painter.users(claim, &mut users);
        }
        let result = match users.iter().find(|&&u| u as usize != slot) {
            Some(&other) => Err(NotOwner::OverwrittenBy(other as usize)),
            None if users.is_empty() => Err(NotOwner::NeverReplayed),
            None => Ok(()),
        };
        self.scratch = users;
        result
    }

    /// Starts a consumer of `slot`'s bytes on `stream`: waits for the slot's
    /// latest replay (not for its other consumers: consumers on different
    /// streams run at once), and makes the consumer a reader that every
    /// later claimer of the bytes waits for, *before* the consumer's work
    /// is enqueued (so whatever it enqueues is fenced even if it fails or
    /// unwinds: a later waiter records the reader's event on `stream`).
    ///
    /// An `exclusive` consumer (one that writes the bytes) waits for the
    /// replay and every reader instead, and the runner then completes where
    /// it does: every later user waits for it.
    pub(crate) fn consume_begin(
        &mut self,
        backend: &B,
        slot: usize,
        stream: &B::Stream,
        sid: u64,
        exclusive: bool,
    ) -> Result<(), BackendError> {
        self.stats.consumers += 1;
        if exclusive {
            self.wait_for(backend, slot, stream, sid)?;
            self.forget_unused_record(slot);
            self.settle(slot, stream, sid);
            self.readers_waited(slot);
            return Ok(());
        }
        self.wait_replay(backend, slot, stream, sid)?;
        self.add_reader(backend, slot, stream, sid)
    }

    /// Makes sure a reader of `slot` on `stream` can be added later without
    /// creating an event (called before a launch whose reads are tracked
    /// after it: nothing can fail between the launch and the tracking).
    pub(crate) fn reserve_reader(
        &mut self,
        backend: &B,
        slot: usize,
        sid: u64,
    ) -> Result<(), BackendError> {
        let runner = &mut self.runners[slot];
        let has = runner.readers.iter().any(|r| {
            r.completion.is_none() || r.completion.as_ref().is_some_and(|c| c.stream_id() == sid)
        });
        if !has {
            runner.readers.push(Reader {
                event: backend.create_event()?,
                completion: None,
            });
        }
        Ok(())
    }

    /// Makes the work at the tail of `stream` from now on a reader of
    /// `slot`: the next claimer of its bytes waits for it.
    fn add_reader(
        &mut self,
        backend: &B,
        slot: usize,
        stream: &B::Stream,
        sid: u64,
    ) -> Result<(), BackendError> {
        let runner = &mut self.runners[slot];
        if let Some(Completion::Pending { id, .. }) = &runner.completion {
            if *id == sid {
                // The runner's own pending record will cover the consumer.
                return Ok(());
            }
        }
        let pending = Completion::Pending {
            stream: stream.clone(),
            id: sid,
        };
        let same = runner
            .readers
            .iter()
            .position(|r| r.completion.as_ref().is_some_and(|c| c.stream_id() == sid));
        let free = || runner.readers.iter().position(|r| r.completion.is_none());
        match same.or_else(free) {
            Some(i) => runner.readers[i].completion = Some(pending),
            None => runner.readers.push(Reader {
                event: backend.create_event()?,
                completion: Some(pending),
            }),
        }
        Ok(())
    }

    /// Ends a consumer started with [`Fence::consume_begin`]: records its
    /// reader's event at once (the next claimer of the bytes waits for
    /// exactly the consumer's work).
    pub(crate) fn consume_end(
        &mut self,
        backend: &B,
        slot: usize,
        stream: &B::Stream,
        sid: u64,
        exclusive: bool,
    ) -> Result<(), BackendError> {
        if exclusive {
            return self.record_if_expected(backend, slot, stream, sid);
        }
        let runner = &mut self.runners[slot];
        let reader = runner
            .readers
            .iter_mut()
            .find(|r| matches!(r.completion, Some(Completion::Pending { id, .. }) if id == sid));
        if let Some(reader) = reader {
            backend.record_event(stream, &reader.event)?;
            self.stats.event_records += 1;
            reader.completion = Some(Completion::Recorded { id: sid });
        }
        Ok(())
    }

    /// Makes `stream` wait for every runner's latest completion.
    pub(crate) fn wait_all(
        &mut self,
        backend: &B,
        stream: &B::Stream,
        sid: u64,
    ) -> Result<(), BackendError> {
        (0..self.runners.len()).try_for_each(|u| self.wait_for(backend, u, stream, sid))
    }

    /// Makes `stream` wait for slot `u`'s latest replay and every reader of
    /// it since (for the program's waits, and a claimer's).
    pub(crate) fn wait_for(
        &mut self,
        backend: &B,
        u: usize,
        stream: &B::Stream,
        sid: u64,
    ) -> Result<(), BackendError> {
        self.wait_replay(backend, u, stream, sid)?;
        let mut readers = std::mem::take(&mut self.runners[u].readers);
        let waited = readers.iter_mut().try_for_each(|reader| {
            let Some(completion) = &reader.completion else {
                return Ok(());
            };
            if completion.stream_id() == sid {
                self.stats.waits_skipped += 1;
                return Ok(());
            }
            if record_pending(backend, &reader.event, &mut reader.completion)? {
                self.stats.event_records += 1;
            }
            backend.wait_event(stream, &reader.event)?;
            self.stats.waits += 1;
            Ok(())
        });
        self.runners[u].readers = readers;
        waited
    }

    /// Makes `stream` wait for slot `u`'s latest replay (or, where a
    /// consumer moved it, its latest completion).
    pub(crate) fn wait_replay(
        &mut self,
        backend: &B,
        u: usize,
        stream: &B::Stream,
        sid: u64,
    ) -> Result<(), BackendError> {
        let runner = &mut self.runners[u];
        let (Some(event), Some(completion)) = (&runner.event, &runner.completion) else {
            return Ok(());
        };
        let already =
            matches!(completion, Completion::Recorded { .. }) && runner.waited_by == Some(sid);
        if completion.stream_id() == sid || already {
            self.stats.waits_skipped += 1;
            return Ok(());
        }
        if record_pending(backend, event, &mut runner.completion)? {
            self.stats.event_records += 1;
            runner.record_at_once = true;
        }
        backend.wait_event(stream, event)?;
        self.stats.waits += 1;
        runner.waited_on = true;
        runner.waited_by = Some(sid);
        Ok(())
    }

    /// Slot `i` now completes at the tail of `stream`, its event not yet
    /// recorded there.
    fn settle(&mut self, i: usize, stream: &B::Stream, sid: u64) {
        let runner = &mut self.runners[i];
        match &runner.completion {
            Some(Completion::Pending { id, .. }) if *id == sid => {}
            _ => {
                runner.completion = Some(Completion::Pending {
                    stream: stream.clone(),
                    id: sid,
                });
                runner.waited_by = None;
            }
        }
    }

    /// Records slot `i`'s event on `stream` now if another stream is
    /// expected to wait for it.
    fn record_if_expected(
        &mut self,
        backend: &B,
        i: usize,
        stream: &B::Stream,
        sid: u64,
    ) -> Result<(), BackendError> {
        let runner = &mut self.runners[i];
        let Some(event) = &runner.event else {
            return Ok(());
        };
        if runner.record_at_once {
            backend.record_event(stream, event)?;
            self.stats.event_records += 1;
            runner.completion = Some(Completion::Recorded { id: sid });
            runner.waited_on = false;
            runner.waited_by = None;
        }
        Ok(())
    }

    /// Blocks until every replay and consumer the fence ordered is done:
    /// records deferred events, then waits for every runner's latest
    /// completion (each waited for the earlier users of its bytes), and
    /// forgets what it waited for. Does not wait for unrelated work. Keeps going after an error and returns the
    /// first one. When a deferred record cannot be made, it falls back to
    /// waiting for the whole backend, so nothing is freed under work in
    /// flight.
    pub(crate) fn quiesce(&mut self, backend: &B) -> Result<(), BackendError> {
        let mut first = Ok(());
        let mut unrecorded = false;
        for runner in &mut self.runners {
            if let Some(event) = &runner.event {
                first = first.and(drain(
                    backend,
                    event,
                    &mut runner.completion,
                    &mut unrecorded,
                ));
            }
            for reader in &mut runner.readers {
                first = first.and(drain(
                    backend,
                    &reader.event,
                    &mut reader.completion,
                    &mut unrecorded,
                ));
            }
        }
        if unrecorded {
            first = first.and(backend.synchronize());
        }
        first
    }
}

/// Records `event` where `completion` is still pending (on that stream) and
/// marks it recorded; `Ok(true)` when a record was issued.
fn record_pending<B: Backend>(
    backend: &B,
    event: &B::Event,
    completion: &mut Option<Completion<B::Stream>>,
) -> Result<bool, BackendError> {
    let Some(Completion::Pending { stream, id }) = completion else {
        return Ok(false);
    };
    backend.record_event(stream, event)?;
    *completion = Some(Completion::Recorded { id: *id });
    Ok(true)
}

/// Records `completion`'s event if it is still pending, waits for it, and
/// forgets it once waited for (so a second quiesce waits for nothing).
/// Sets `unrecorded` when a pending record could not be made.
fn drain<B: Backend>(
    backend: &B,
    event: &B::Event,
    completion: &mut Option<Completion<B::Stream>>,
    unrecorded: &mut bool,
) -> Result<(), BackendError> {
    if completion.is_none() {
        return Ok(());
    }
    let recorded = record_pending(backend, event, completion);
    *unrecorded |= recorded.is_err();
    let waited = recorded.and_then(|_| backend.synchronize_event(event));
    if waited.is_ok() {
        *completion = None;
    }
    waited
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::{SimBackend, SimStream};

    /// A fence over one region with `n` fenced runner slots.
    fn fence(sim: &SimBackend, n: usize) -> Fence<SimBackend> {
        let events = (0..n).map(|_| Some(sim.create_event().unwrap())).collect();
        Fence::new(events, 1)
    }

    const ALL: [Claim; 1] = [Claim {
        region: 0,
        lo: 0,
        hi: 1,
    }];

    /// Admits and completes slot `i` on `stream`, as a replay does.
    fn replay(f: &mut Fence<SimBackend>, sim: &SimBackend, i: usize, stream: &SimStream) {
        let sid = sim.stream_id(stream);
        f.admit(sim, &ALL, stream, sid).unwrap();
        f.complete(sim, i, &ALL, stream, sid).unwrap();
    }

    #[test]
    fn a_first_replay_waits_for_nothing() {
        let sim = SimBackend::new();
        let mut f = fence(&sim, 2);
        replay(&mut f, &sim, 0, &sim.stream());
        let s = f.stats();
        assert_eq!(
            (s.replays, s.waits, s.waits_skipped, s.event_records),
            (1, 0, 0, 0)
        );
    }

    #[test]
    fn a_claimer_on_the_same_stream_skips_the_wait() {
        let sim = SimBackend::new();
        let mut f = fence(&sim, 2);
        let a = sim.stream();
        replay(&mut f, &sim, 0, &a);
        replay(&mut f, &sim, 1, &a);
        assert_eq!(f.stats().waits_skipped, 1);
        assert_eq!(f.stats().waits, 0);
    }

    #[test]
    fn a_claimer_on_another_stream_records_the_deferred_event_then_waits() {
        let sim = SimBackend::new();
        let mut f = fence(&sim, 2);
        let (a, b) = (sim.stream(), sim.stream());
        replay(&mut f, &sim, 0, &a);
        replay(&mut f, &sim, 1, &b);
        assert_eq!((f.stats().event_records, f.stats().waits), (1, 1));
        // Runner 0 was waited on, so from now on it records at once.
        replay(&mut f, &sim, 0, &a);
        assert_eq!(
            f.stats().event_records,
            3,
            "runner 1 deferred, then 0 at once"
        );
    }

    #[test]
    fn ownership_is_lost_to_the_next_claimer_and_missing_before_any_replay() {
        let sim = SimBackend::new();
        let mut f = fence(&sim, 2);
        let a = sim.stream();
        assert_eq!(f.owner_check(0, &ALL), Err(NotOwner::NeverReplayed));
        replay(&mut f, &sim, 0, &a);
        assert_eq!(f.owner_check(0, &ALL), Ok(()));
        replay(&mut f, &sim, 1, &a);
        assert_eq!(f.owner_check(0, &ALL), Err(NotOwner::OverwrittenBy(1)));
    }

    #[test]
    fn a_consumer_waits_for_the_replay_and_a_later_claimer_on_its_stream_waits_no_more() {
        let sim = SimBackend::new();
        let mut f = fence(&sim, 2);
        let (a, x) = (sim.stream(), sim.stream());
        replay(&mut f, &sim, 0, &a);
        let xid = sim.stream_id(&x);
        f.consume_begin(&sim, 0, &x, xid, false).unwrap();
        f.consume_end(&sim, 0, &x, xid, false).unwrap();
        assert_eq!((f.stats().consumers, f.stats().waits), (1, 1));
        // The next claimer on `x` is ordered after the consumer by stream
        // order, and waits for the replay on `a` only.
        replay(&mut f, &sim, 1, &x);
        assert_eq!(f.stats().waits, 1);
    }

    #[test]
    fn quiesce_records_deferred_completions_and_leaves_nothing_pending() {
        let sim = SimBackend::new();
        let mut f = fence(&sim, 2);
        let (a, b) = (sim.stream(), sim.stream());
        replay(&mut f, &sim, 0, &a);
        replay(&mut f, &sim, 1, &b); // different claim owners: 1 now owns it
        f.quiesce(&sim).unwrap();
        assert!(f
            .runners
            .iter()
            .all(|r| matches!(r.completion, None | Some(Completion::Recorded { .. }))));
    }
}
