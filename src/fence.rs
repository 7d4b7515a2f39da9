//! The replay engine: who last used which bytes, where each runner's
//! latest replay or consumer completes, each handoff's writes and reads,
//! and the events that make other streams wait. [`Fence`] owns all of it
//! and does every replay and consumer of a plan ([`Fence::replay`],
//! [`Fence::consume`]), for `Replayable` and for the tracer a step graph
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

use crate::backend::{BackendError, Streams};
use crate::painter::{Claim, Painter};
use crate::plan::Planned;
use crate::scope::StreamClaim;
use crate::trace::{Observer, SliceKind, NO_USER};
use crate::view::Misuse;
use crate::vocab::{HandoffId, Purpose, RunnerId};

/// A failed check or backend call while replaying.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// The runner was never discovered.
    #[error("{runner} was not discovered, so the plan has no graph for it")]
    UnknownRunner {
        /// The runner.
        runner: RunnerId,
    },
    /// The runner has no captured graph (a runner that uses no buffers and
    /// was not captured).
    #[error("{runner} has no captured graph to replay")]
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
    /// A kept step graph was launched on (or waited for through) another
    /// plan than the one it was built for.
    #[error("this kept step graph belongs to another plan: launch it with the Replayable it was built from")]
    ForeignStep,
    /// A consumer asked for a runner's bytes before the runner was replayed.
    #[error("{runner} was never replayed, so its views hold nothing to consume")]
    NotReplayed {
        /// The runner.
        runner: RunnerId,
    },
    /// A consumer asked for a runner's bytes after another runner claimed
    /// some of them.
    #[error("{runner}'s bytes were overwritten by {by}, replayed since; consume a runner's views before the next runner that shares its arena replays")]
    Overwritten {
        /// The runner whose views were asked for.
        runner: RunnerId,
        /// The runner that claimed its bytes since.
        by: RunnerId,
    },
    /// The backend failed while replaying or consuming a runner.
    #[error("{runner}: {error}")]
    Backend {
        /// The runner.
        runner: RunnerId,
        /// The backend's error.
        error: BackendError,
    },
    /// A consumer used a view where the fence cannot order it (another
    /// stream than the consumer's, say); the use was refused.
    #[error("the consumer of {runner} used a view out of its scope: {reason}")]
    ViewOutOfScope {
        /// The runner.
        runner: RunnerId,
        /// Which view, and where it was used.
        reason: Misuse,
    },
    /// A replay or a consumer was asked for on a stream that is capturing
    /// (inside a `stream_capture` closure of this or another plan, or the
    /// program's own capture): its work would be recorded into that graph
    /// instead of running, outside the fence. Nothing was enqueued.
    #[error("{runner}: the stream is capturing; replay and consume on a stream that is not")]
    StreamCapturing {
        /// The runner.
        runner: RunnerId,
    },
    /// A step graph was launched on a stream that is capturing: the launch
    /// would be recorded into that graph instead of running, outside the
    /// fence. Nothing was enqueued.
    #[error("the step graph was launched on a stream that is capturing; launch it on a stream that is not")]
    StepOnCapturingStream,
    /// A runner that reads a handoff was replayed before the handoff's
    /// writer was ever replayed.
    #[error("{reader} reads {handoff}, which {writer} writes, and {writer} was never replayed; replay runners in the order discovery armed them")]
    HandoffNotWritten {
        /// The reading runner.
        reader: RunnerId,
        /// The handoff.
        handoff: HandoffId,
        /// Its writer.
        writer: RunnerId,
    },
    /// A runner that reads a handoff was replayed after another handoff
    /// that shares its bytes (their lifetimes do not meet in capture order,
    /// so the plan let them share) was written since: the data is gone.
    #[error("{reader} reads {handoff}, but {by} wrote bytes of another handoff over it since {writer} wrote it; replay runners in the order discovery armed them")]
    HandoffOverwritten {
        /// The reading runner.
        reader: RunnerId,
        /// The handoff.
        handoff: HandoffId,
        /// Its writer.
        writer: RunnerId,
        /// The runner whose handoff took the bytes since.
        by: RunnerId,
    },
    /// A runner that reads a handoff was replayed again before the
    /// handoff's writer was: it would read the write it already read (its
    /// writer comes first in the order the plan assumed).
    #[error("{reader} already read {handoff}'s latest write; replay its writer {writer} first (runners replay in the order discovery armed them)")]
    HandoffAlreadyRead {
        /// The reading runner.
        reader: RunnerId,
        /// The handoff.
        handoff: HandoffId,
        /// Its writer.
        writer: RunnerId,
    },
    /// A runner with staged inputs ([`Purpose::Input`](crate::Purpose::Input))
    /// was replayed while its bytes were not its own: never staged, or
    /// another runner (or bucket) took them since it was staged or last
    /// replayed, so its graph would read that runner's bytes as its input.
    #[error("{runner} reads inputs the program stages, and {}; stage them with consume_mut before this replay", match .by { Some(by) => format!("{by} overwrote its bytes since"), None => "they were never staged".to_string() })]
    InputNotStaged {
        /// The runner.
        runner: RunnerId,
        /// Who took its bytes (`None`: never staged nor replayed).
        by: Option<RunnerId>,
    },
    /// `consume_many` was given no runner.
    #[error("consume_many was given no runner: a consumer reads at least one runner's views")]
    NoRunners,
    /// `consume_many` was given runners of different shape buckets: their
    /// bytes may be the same bytes, so no replay leaves both to read.
    #[error("consume_many was given {runner} of {bucket} and {other} of {other_bucket}; one consumer reads the runners of one bucket")]
    CrossBucket {
        /// The first runner given.
        runner: RunnerId,
        /// Its bucket.
        bucket: crate::vocab::BucketId,
        /// The first runner given of another bucket.
        other: RunnerId,
        /// That runner's bucket.
        other_bucket: crate::vocab::BucketId,
    },
    /// Waiting for fenced work (synchronize, teardown) failed.
    #[error("waiting for the plan's work failed: {0}")]
    Wait(BackendError),
    /// [`Replayable::finish_trace`](crate::Replayable::finish_trace) was
    /// called with no trace started.
    #[error("no trace was started: call start_trace before the work to trace")]
    NoTrace,
    /// A timing mark of the trace failed (taking it, or reading its time);
    /// the fenced work itself was not affected.
    #[error("a timing mark of the trace failed: {0}")]
    TraceMark(BackendError),
}

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

impl<'a, S> On<'a, S> {
    /// `stream` with its identity on `backend`.
    pub(crate) fn new<B: Streams<Stream = S>>(backend: &B, stream: &'a S) -> On<'a, S> {
        On {
            stream,
            id: backend.stream_id(stream),
        }
    }
}

/// What the fence knows besides events and completions: who last used
/// which bytes, and each handoff's writes and reads. It does not depend on
/// the backend, so a step graph's tracer hands its state to the plan's
/// fence whole.
#[derive(Clone, Debug)]
pub(crate) struct Ledger {
    painter: Painter,
    handoffs: Vec<HandoffState>,
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
/// overwrites, and each reader's place among its handoffs' readers.
#[derive(Clone, Debug)]
struct Layout {
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
            handoff_base: plan.runners.len(),
            admit_claims,
            read_at,
            stages,
        }
    }
}

/// Counters of the fence's work since sealing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
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

impl std::fmt::Display for FenceStats {
    /// One line a person reads: `1000 replays, 800 consumers, 2001 waits
    /// on another stream (403 skipped: stream order implied them), 2100
    /// event records, 200 step graph launches`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} replays, {} consumers, {} waits on another stream ({} skipped: stream order \
             implied them), {} event records, {} step graph launches",
            self.replays,
            self.consumers,
            self.waits,
            self.waits_skipped,
            self.event_records,
            self.step_launches
        )
    }
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
struct Runner<B: Streams> {
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
    /// The trace's id of the use that `completion` ends with (`NO_USER`
    /// when no trace saw it).
    by: u32,
}

impl<B: Streams> Runner<B> {
    fn new(event: Option<B::Event>) -> Runner<B> {
        Runner {
            event,
            completion: None,
            record_at_once: false,
            waited_on: false,
            waited_by: None,
            readers: Vec::new(),
            by: NO_USER,
        }
    }
}

/// One consumer stream's latest read of a runner's bytes.
struct Reader<B: Streams> {
    event: B::Event,
    /// `None` once a replay of the runner waited for it.
    completion: Option<Completion<B::Stream>>,
    /// The trace's id of the consumer it ends with.
    by: u32,
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
    runners: Vec<Runner<B>>,
    ledger: Ledger,
    layout: Layout,
    /// Streams are claimed for the fence's own event records (see
    /// `record_pending`): a real backend's fence, not a tracer's.
    claims: bool,
    scratch: Vec<u32>,
    stats: FenceStats,
    /// The trace the program started, told of every use of the plan.
    observer: Option<Box<dyn Observer<B>>>,
    /// The trace's id of the use in progress (`NO_USER`: none, or no trace).
    user: u32,
    /// The trace's id of the latest step graph launch.
    step_user: u32,
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
        Fence {
            runners: events.into_iter().map(Runner::new).collect(),
            ledger: Ledger {
                painter: Painter::new(plan.fence_regions),
                handoffs,
            },
            layout: Layout::of(plan),
            claims: true,
            scratch: Vec::new(),
            stats: FenceStats::default(),
            observer: None,
            user: NO_USER,
            step_user: NO_USER,
        }
    }

    /// A fence that starts where `other` stands (its ledger; every slot
    /// `other` used counts as used, complete before anything this fence
    /// orders), with one event per fenced slot of `other` from `event`:
    /// the fence a step schedule is traced on.
    pub(crate) fn start_from<C: Streams>(
        other: &Fence<C>,
        mut event: impl FnMut(usize) -> B::Event,
    ) -> Fence<B> {
        let runners = other
            .runners
            .iter()
            .enumerate()
            .map(|(i, o)| {
                let mut runner = Runner::new(o.event.as_ref().map(|_| event(i)));
                if o.event.is_some() && o.completion.is_some() {
                    // Before the step: ordered by launch order, no record.
                    runner.completion = Some(Completion::Recorded { id: u64::MAX });
                }
                runner
            })
            .collect();
        Fence {
            runners,
            ledger: other.ledger.clone(),
            layout: other.layout.clone(),
            claims: false,
            scratch: Vec::new(),
            stats: FenceStats::default(),
            observer: None,
            user: NO_USER,
            step_user: NO_USER,
        }
    }

    pub(crate) fn stats(&self) -> FenceStats {
        self.stats
    }

    /// Grows with every replay, consumer, step launch and event record
    /// (a wait that records a pending completion changes what later users
    /// wait for): a step graph that sees the same epoch as after its own
    /// latest launch knows that the fence is as that launch left it.
    pub(crate) fn epoch(&self) -> u64 {
        self.stats.replays
            + self.stats.consumers
            + self.stats.step_launches
            + self.stats.event_records
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

    /// A use of the plan begins on `on`, before its waits: the trace (if
    /// one runs) gives it an id, which every completion it leaves carries.
    pub(crate) fn begin_use(&mut self, kind: impl FnOnce() -> SliceKind, on: On<'_, B::Stream>) {
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

    /// Fence slots: runners, then handoffs.
    pub(crate) fn slots(&self) -> usize {
        self.runners.len()
    }

    /// The fence slot of handoff `h`.
    pub(crate) fn handoff_slot(&self, h: HandoffId) -> usize {
        self.layout.handoff_base + h.0 as usize
    }

    /// The event of `slot`, if it is fenced.
    pub(crate) fn event(&self, slot: usize) -> Option<&B::Event> {
        self.runners.get(slot).and_then(|r| r.event.as_ref())
    }

    /// Whether handoff `h`'s writer records its event at a ready point.
    pub(crate) fn is_ready(&self, h: HandoffId) -> bool {
        self.ledger.handoffs[h.0 as usize].ready
    }

    /// Who last used which bytes, and the handoffs' writes and reads.
    pub(crate) fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// Whether the slot is fenced (uses buffers).
    pub(crate) fn is_fenced(&self, slot: usize) -> bool {
        self.runners[slot].event.is_some()
    }

    /// Replays runner slot `slot` on `on`: the handoff checks, the waits,
    /// `launch`, then the bookkeeping. Nothing is enqueued when a check
    /// fails; once `launch` succeeded, every piece of bookkeeping happens
    /// (each sets its state before it tries a record, so nothing launched
    /// goes untracked) and the first error is returned.
    pub(crate) fn replay(
        &mut self,
        backend: &B,
        plan: &Planned,
        slot: usize,
        on: On<'_, B::Stream>,
        launch: impl FnOnce() -> std::result::Result<(), BackendError>,
    ) -> Result<()> {
        let r = &plan.runners[slot];
        let runner = r.id();
        refuse_capturing(backend, on.stream, runner)?;
        let record = &r.record;
        let base = self.layout.handoff_base;
        for (k, &h) in record.reads.iter().enumerate() {
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
        if self.layout.stages[slot] {
            self.staged_check(plan, slot)?;
        }
        let failed = |error| ReplayError::Backend { runner, error };
        self.begin_use(|| SliceKind::Replay { runner }, on);
        let mut users = std::mem::take(&mut self.scratch);
        users.clear();
        for &claim in &self.layout.admit_claims[slot] {
            self.ledger.painter.users(claim, &mut users);
        }
        let admitted = users
            .iter()
            .try_for_each(|&u| self.wait_for(backend, u as usize, on));
        self.scratch = users;
        admitted.map_err(failed)?;
        for &h in &record.reads {
            let i = base + h.0 as usize;
            // Its latest write (ready point or graph), not its other readers.
            self.wait_replay(backend, i, on).map_err(failed)?;
            // Nothing may fail between the launch and tracking its reads.
            self.reserve_reader(backend, i, on.id).map_err(failed)?;
        }
        self.timed(backend, on, launch).map_err(failed)?;
        self.stats.replays += 1;
        let mut tracked = if self.is_fenced(slot) {
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
        self.end_use();
        tracked.map_err(failed)
    }

    /// Whether runner slot `slot` has inputs the program stages.
    pub(crate) fn stages_inputs(&self, slot: usize) -> bool {
        self.layout.stages.get(slot).copied().unwrap_or(false)
    }

    /// [`ReplayError::InputNotStaged`] unless the staged runner `slot` owns
    /// its bytes (it was staged, or replayed, and nothing took them since).
    fn staged_check(&mut self, plan: &Planned, slot: usize) -> Result<()> {
        let runner = plan.runners[slot].id();
        match self.owner_check(slot, &plan.runners[slot].claims) {
            Ok(()) => Ok(()),
            Err(NotOwner::NeverReplayed) => Err(ReplayError::InputNotStaged { runner, by: None }),
            Err(NotOwner::OverwrittenBy(other)) => Err(ReplayError::InputNotStaged {
                runner,
                by: Some(slot_owner(plan, other)),
            }),
        }
    }

    /// Before a write of the staged runner `slot`'s inputs on `on`: unless
    /// it owns its bytes already, `on` waits for every user of them (the
    /// replays and consumers still reading the old contents, of any
    /// bucket), and the runner becomes their owner, completing at the tail
    /// of `on` (where the write is enqueued next: every later user waits
    /// for it, its own replay too). As a replay of an empty graph.
    pub(crate) fn stage(
        &mut self,
        backend: &B,
        plan: &Planned,
        slot: usize,
        on: On<'_, B::Stream>,
    ) -> Result<()> {
        let r = &plan.runners[slot];
        if self.owner_check(slot, &r.claims).is_ok() {
            return Ok(());
        }
        let runner = r.id();
        let failed = |error| ReplayError::Backend { runner, error };
        let mut users = std::mem::take(&mut self.scratch);
        users.clear();
        for &claim in &r.claims {
            self.ledger.painter.users(claim, &mut users);
        }
        let waited = users
            .iter()
            .try_for_each(|&u| self.wait_for(backend, u as usize, on));
        self.scratch = users;
        waited.map_err(failed)?;
        self.settle_use(backend, slot, &r.claims, on)
            .map_err(failed)
    }

    /// Checks that a consumer of the runners in `slots` may read their
    /// bytes: each (fenced) runner still owns what its latest replay wrote.
    /// Nothing is enqueued.
    pub(crate) fn check_consumable(&mut self, plan: &Planned, slots: &[usize]) -> Result<()> {
        for &slot in slots {
            if !self.is_fenced(slot) {
                // A runner without buffers has nothing to fence.
                continue;
            }
            let runner = plan.runners[slot].id();
            match self.owner_check(slot, &plan.runners[slot].claims) {
                Ok(()) => {}
                Err(NotOwner::NeverReplayed) => return Err(ReplayError::NotReplayed { runner }),
                Err(NotOwner::OverwrittenBy(other)) => {
                    // Handoff slots follow the runners': a handoff that took
                    // the bytes was claimed by its writer's replay.
                    let by = match other.checked_sub(plan.runners.len()) {
                        Some(h) => plan.runners[plan.handoffs[h].record.writer].id(),
                        None => plan.runners[other].id(),
                    };
                    return Err(ReplayError::Overwritten { runner, by });
                }
            }
        }
        Ok(())
    }

    /// Runs a consumer of the runners in `slots` on `on` (checked with
    /// [`Fence::check_consumable`]): waits for each runner's latest replay
    /// and makes the consumer a reader that every later claimer of the
    /// bytes waits for, *before* `work` enqueues anything (so whatever it
    /// enqueues is fenced even if it fails or unwinds: a later waiter
    /// records the reader's event on the stream); after `work`, records
    /// the readers' events (even when `work` failed: it may have enqueued).
    ///
    /// An `exclusive` consumer (one that writes the bytes) waits for the
    /// replay and every reader instead, and the runner then completes where
    /// it does: every later user waits for it.
    pub(crate) fn consume<T>(
        &mut self,
        backend: &B,
        plan: &Planned,
        slots: &[usize],
        on: On<'_, B::Stream>,
        exclusive: bool,
        work: impl FnOnce() -> T,
    ) -> Result<T> {
        let failed = |slot: usize| {
            let runner = plan.runners[slot].id();
            move |error| ReplayError::Backend { runner, error }
        };
        let runners = || slots.iter().map(|&s| plan.runners[s].id()).collect();
        self.begin_use(
            || SliceKind::Consume {
                runners: runners(),
                writes: exclusive,
            },
            on,
        );
        for &slot in slots {
            if self.is_fenced(slot) {
                self.stats.consumers += 1;
                self.begin_read(backend, slot, on, exclusive)
                    .map_err(failed(slot))?;
            }
        }
        let out = self.timed(backend, on, work);
        let mut recorded = Ok(());
        for &slot in slots {
            if self.is_fenced(slot) {
                let ended = if exclusive {
                    self.record_if_expected(backend, slot, on)
                } else {
                    self.end_read(backend, slot, on)
                };
                recorded = recorded.and(ended.map_err(failed(slot)));
            }
        }
        self.end_use();
        recorded.map(|()| out)
    }

    /// Makes `on` wait for runner slot `slot`'s latest replay and every
    /// consumer of it since, and for the latest reads of every handoff it
    /// reads (every reader's: a reader without bytes of its own has no
    /// completion of its own).
    pub(crate) fn wait_for_runner(
        &mut self,
        backend: &B,
        plan: &Planned,
        slot: usize,
        on: On<'_, B::Stream>,
    ) -> std::result::Result<(), BackendError> {
        let runner = plan.runners[slot].id();
        self.begin_use(
            || SliceKind::Wait {
                runner: Some(runner),
            },
            on,
        );
        self.wait_for(backend, slot, on)?;
        for &h in &plan.runners[slot].record.reads {
            let i = self.handoff_slot(h);
            self.wait_for(backend, i, on)?;
        }
        self.timed(backend, on, || ());
        self.end_use();
        Ok(())
    }

    /// Makes `on` wait for every slot's latest completion.
    pub(crate) fn wait_all(
        &mut self,
        backend: &B,
        on: On<'_, B::Stream>,
    ) -> std::result::Result<(), BackendError> {
        self.begin_use(|| SliceKind::Wait { runner: None }, on);
        (0..self.runners.len()).try_for_each(|u| self.wait_for(backend, u, on))?;
        self.timed(backend, on, || ());
        self.end_use();
        Ok(())
    }

    /// Before a launch of a step graph on `on`: `ledger` is what the fence
    /// knows once it ran, and every slot that was used, or that the step
    /// touches, completes at the tail of `on` (the step graph joins all its
    /// work there, after everything the fence knew of); readers are covered
    /// by that too. Called *before* the launch, so the fence orders every
    /// later user after it whatever happens to the step graph (a forgotten
    /// one included). Returns the ledger it replaced, for a launch that
    /// fails ([`Fence::unabsorb_step`]).
    pub(crate) fn absorb_step(
        &mut self,
        ledger: Ledger,
        touched: &[bool],
        on: On<'_, B::Stream>,
    ) -> Ledger {
        let user = self.user;
        for (i, runner) in self.runners.iter_mut().enumerate() {
            if runner.event.is_none() {
                continue;
            }
            if runner.completion.is_some() || touched.get(i).copied().unwrap_or(false) {
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
        std::mem::replace(&mut self.ledger, ledger)
    }

    /// A launch of a step graph that failed before the step ran: the
    /// ledger is `ledger` again. The completions stay at the launch
    /// stream's tail (after everything the fence knew of: at worst a
    /// conservative wait).
    pub(crate) fn unabsorb_step(&mut self, ledger: Ledger) {
        self.ledger = ledger;
    }

    /// Counts one launch of a step graph of the plan (enqueued: the use
    /// the launch began ends).
    pub(crate) fn count_step_launch(&mut self) {
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
        self.ledger.painter.paint(claim, slot as u32);
        self.readers_waited(slot);
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
            self.ledger.painter.paint(claim, slot as u32);
        }
        self.runners[slot].by = self.user;
        // The replay waited for every reader of the runner's bytes (it is
        // their claimer): the new replay has none yet.
        self.readers_waited(slot);
        self.forget_unused_record(slot);
        // The runner completes at the tail of `on` from now on, whether or
        // not a record succeeds: a failed record (the stream began
        // capturing on another thread since the launch, say) leaves a
        // pending completion that a later waiter records, never an older
        // one that would let it skip the wait.
        if !self.runners[slot].record_at_once {
            self.settle(slot, on);
            return Ok(());
        }
        self.record_if_expected(backend, slot, on)
            .inspect_err(|_| self.settle(slot, on))
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

    /// A consumer of `slot` starts on `on` (see [`Fence::consume`]).
    fn begin_read(
        &mut self,
        backend: &B,
        slot: usize,
        on: On<'_, B::Stream>,
        exclusive: bool,
    ) -> std::result::Result<(), BackendError> {
        if exclusive {
            self.wait_for(backend, slot, on)?;
            self.forget_unused_record(slot);
            self.settle(slot, on);
            self.readers_waited(slot);
            return Ok(());
        }
        self.wait_replay(backend, slot, on)?;
        self.add_reader(backend, slot, on)
    }

    /// Makes sure a reader of `slot` on the stream with id `sid` can be
    /// added later without creating an event (called before a launch whose
    /// reads are tracked after it: nothing can fail between the launch and
    /// the tracking).
    fn reserve_reader(
        &mut self,
        backend: &B,
        slot: usize,
        sid: u64,
    ) -> std::result::Result<(), BackendError> {
        let runner = &mut self.runners[slot];
        let has = runner.readers.iter().any(|r| {
            r.completion.is_none() || r.completion.as_ref().is_some_and(|c| c.stream_id() == sid)
        });
        if !has {
            runner.readers.push(Reader {
                event: backend.create_event()?,
                completion: None,
                by: NO_USER,
            });
        }
        Ok(())
    }

    /// Makes the work at the tail of `on` from now on a reader of `slot`:
    /// the next claimer of its bytes waits for it.
    fn add_reader(
        &mut self,
        backend: &B,
        slot: usize,
        on: On<'_, B::Stream>,
    ) -> std::result::Result<(), BackendError> {
        let user = self.user;
        let runner = &mut self.runners[slot];
        if let Some(Completion::Pending { id, .. }) = &runner.completion {
            if *id == on.id {
                // The runner's own pending record will cover the consumer
                // (a later waiter waits for what ends with the consumer).
                runner.by = user;
                return Ok(());
            }
        }
        let pending = Completion::Pending {
            stream: on.stream.clone(),
            id: on.id,
        };
        let same = runner.readers.iter().position(|r| {
            r.completion
                .as_ref()
                .is_some_and(|c| c.stream_id() == on.id)
        });
        let free = || runner.readers.iter().position(|r| r.completion.is_none());
        match same.or_else(free) {
            Some(i) => {
                runner.readers[i].completion = Some(pending);
                runner.readers[i].by = user;
            }
            None => runner.readers.push(Reader {
                event: backend.create_event()?,
                completion: Some(pending),
                by: user,
            }),
        }
        Ok(())
    }

    /// Ends a read of `slot` on `on`: records its reader's event at once
    /// (the next claimer of the bytes waits for exactly the reader's work).
    fn end_read(
        &mut self,
        backend: &B,
        slot: usize,
        on: On<'_, B::Stream>,
    ) -> std::result::Result<(), BackendError> {
        let runner = &mut self.runners[slot];
        let reader = runner
            .readers
            .iter_mut()
            .find(|r| matches!(r.completion, Some(Completion::Pending { id, .. }) if id == on.id));
        if let Some(reader) = reader {
            backend.record_event(on.stream, &reader.event)?;
            self.stats.event_records += 1;
            reader.completion = Some(Completion::Recorded { id: on.id });
        }
        Ok(())
    }

    /// Makes `on` wait for slot `u`'s latest replay and every reader of it
    /// since (for the program's waits, and a claimer's).
    fn wait_for(
        &mut self,
        backend: &B,
        u: usize,
        on: On<'_, B::Stream>,
    ) -> std::result::Result<(), BackendError> {
        self.wait_replay(backend, u, on)?;
        let mut readers = std::mem::take(&mut self.runners[u].readers);
        let waited = readers.iter_mut().try_for_each(|reader| {
            let Some(completion) = &reader.completion else {
                return Ok(());
            };
            if completion.stream_id() == on.id {
                self.stats.waits_skipped += 1;
                self.note_wait(reader.by, true);
                return Ok(());
            }
            if record_pending(backend, &reader.event, &mut reader.completion, self.claims)? {
                self.stats.event_records += 1;
            }
            backend.wait_event(on.stream, &reader.event)?;
            self.stats.waits += 1;
            self.note_wait(reader.by, false);
            Ok(())
        });
        self.runners[u].readers = readers;
        waited
    }

    /// Makes `on` wait for slot `u`'s latest replay (or, where a consumer
    /// moved it, its latest completion).
    fn wait_replay(
        &mut self,
        backend: &B,
        u: usize,
        on: On<'_, B::Stream>,
    ) -> std::result::Result<(), BackendError> {
        let runner = &mut self.runners[u];
        let by = runner.by;
        let (Some(event), Some(completion)) = (&runner.event, &runner.completion) else {
            return Ok(());
        };
        let already =
            matches!(completion, Completion::Recorded { .. }) && runner.waited_by == Some(on.id);
        if completion.stream_id() == on.id || already {
            self.stats.waits_skipped += 1;
            self.note_wait(by, true);
            return Ok(());
        }
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
    fn settle(&mut self, i: usize, on: On<'_, B::Stream>) {
        let runner = &mut self.runners[i];
        runner.by = self.user;
        match &runner.completion {
            Some(Completion::Pending { id, .. }) if *id == on.id => {}
            _ => {
                runner.completion = Some(Completion::Pending {
                    stream: on.stream.clone(),
                    id: on.id,
                });
                runner.waited_by = None;
            }
        }
    }

    /// Records slot `i`'s event on `on` now if another stream is expected
    /// to wait for it.
    fn record_if_expected(
        &mut self,
        backend: &B,
        i: usize,
        on: On<'_, B::Stream>,
    ) -> std::result::Result<(), BackendError> {
        let runner = &mut self.runners[i];
        let Some(event) = &runner.event else {
            return Ok(());
        };
        if runner.record_at_once {
            backend.record_event(on.stream, event)?;
            self.stats.event_records += 1;
            runner.completion = Some(Completion::Recorded { id: on.id });
            runner.waited_on = false;
            runner.waited_by = None;
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

/// [`ReplayError::StreamCapturing`] when `stream` is capturing: a launch
/// there would be recorded into that graph instead of running.
pub(crate) fn refuse_capturing<B: Streams>(
    backend: &B,
    stream: &B::Stream,
    runner: RunnerId,
) -> Result<()> {
    let capturing = backend
        .is_capturing(stream)
        .map_err(|error| ReplayError::Backend { runner, error })?;
    if capturing {
        return Err(ReplayError::StreamCapturing { runner });
    }
    Ok(())
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
        op: "the fence's event record",
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

/// The fix [`ReplayError::NoStepCopy`] names.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim;
    use crate::discover::{Discovering, PlanConfig};
    use crate::plan::Policy;
    use crate::vocab::{DType, Domain, Request};

    /// `n` runners of one request each at G = 1: they all claim the one
    /// generation's region.
    fn plan(n: u32) -> Planned {
        let q = Request::new(Domain::Device, DType::F32, 64);
        Discovering::from_runners(PlanConfig::new(), (0..n).map(|r| (RunnerId(r), [q])))
            .unwrap()
            .plan(Policy::Generations(1))
            .unwrap()
    }

    /// The fence of `plan`, with an event per runner.
    fn fence(sim: &sim::Device, plan: &Planned) -> Fence<sim::Device> {
        let n = plan.runners.len();
        let events = (0..n).map(|_| Some(sim.create_event().unwrap())).collect();
        Fence::new(events, plan, &[])
    }

    /// A replay of slot `i` on `stream` (an empty launch).
    fn replay(
        f: &mut Fence<sim::Device>,
        sim: &sim::Device,
        p: &Planned,
        i: usize,
        stream: &sim::Stream,
    ) {
        f.replay(sim, p, i, On::new(sim, stream), || Ok(()))
            .unwrap();
    }

    /// A reading consumer of slot `i` on `stream` that enqueues nothing.
    fn consume(
        f: &mut Fence<sim::Device>,
        sim: &sim::Device,
        p: &Planned,
        i: usize,
        stream: &sim::Stream,
    ) {
        f.check_consumable(p, &[i]).unwrap();
        f.consume(sim, p, &[i], On::new(sim, stream), false, || ())
            .unwrap();
    }

    #[test]
    fn fence_stats_print_as_one_readable_line() {
        let stats = FenceStats {
            replays: 3,
            consumers: 2,
            waits: 1,
            waits_skipped: 4,
            event_records: 5,
            step_launches: 6,
        };
        assert_eq!(
            stats.to_string(),
            "3 replays, 2 consumers, 1 waits on another stream (4 skipped: stream order implied \
             them), 5 event records, 6 step graph launches"
        );
    }

    #[test]
    fn a_first_replay_waits_for_nothing() {
        let sim = sim::Device::new();
        let p = plan(2);
        let mut f = fence(&sim, &p);
        replay(&mut f, &sim, &p, 0, &sim.stream());
        let s = f.stats();
        assert_eq!(
            (s.replays, s.waits, s.waits_skipped, s.event_records),
            (1, 0, 0, 0)
        );
    }

    #[test]
    fn a_claimer_on_the_same_stream_skips_the_wait() {
        let sim = sim::Device::new();
        let p = plan(2);
        let mut f = fence(&sim, &p);
        let a = sim.stream();
        replay(&mut f, &sim, &p, 0, &a);
        replay(&mut f, &sim, &p, 1, &a);
        assert_eq!(f.stats().waits_skipped, 1);
        assert_eq!(f.stats().waits, 0);
    }

    #[test]
    fn a_claimer_on_another_stream_records_the_deferred_event_then_waits() {
        let sim = sim::Device::new();
        let p = plan(2);
        let mut f = fence(&sim, &p);
        let (a, b) = (sim.stream(), sim.stream());
        replay(&mut f, &sim, &p, 0, &a);
        replay(&mut f, &sim, &p, 1, &b);
        assert_eq!((f.stats().event_records, f.stats().waits), (1, 1));
        // Runner 0 was waited on, so from now on it records at once.
        replay(&mut f, &sim, &p, 0, &a);
        assert_eq!(
            f.stats().event_records,
            3,
            "runner 1 deferred, then 0 at once"
        );
    }

    #[test]
    fn ownership_is_lost_to_the_next_claimer_and_missing_before_any_replay() {
        let sim = sim::Device::new();
        let p = plan(2);
        let mut f = fence(&sim, &p);
        let a = sim.stream();
        let all = p.runners[0].claims.clone();
        assert_eq!(f.owner_check(0, &all), Err(NotOwner::NeverReplayed));
        replay(&mut f, &sim, &p, 0, &a);
        assert_eq!(f.owner_check(0, &all), Ok(()));
        replay(&mut f, &sim, &p, 1, &a);
        assert_eq!(f.owner_check(0, &all), Err(NotOwner::OverwrittenBy(1)));
    }

    #[test]
    fn a_consumer_waits_for_the_replay_and_a_later_claimer_on_its_stream_waits_no_more() {
        let sim = sim::Device::new();
        let p = plan(2);
        let mut f = fence(&sim, &p);
        let (a, x) = (sim.stream(), sim.stream());
        replay(&mut f, &sim, &p, 0, &a);
        consume(&mut f, &sim, &p, 0, &x);
        assert_eq!((f.stats().consumers, f.stats().waits), (1, 1));
        // The next claimer on `x` is ordered after the consumer by stream
        // order, and waits for the replay on `a` only.
        replay(&mut f, &sim, &p, 1, &x);
        assert_eq!(f.stats().waits, 1);
    }

    #[test]
    fn quiesce_records_deferred_completions_and_leaves_nothing_pending() {
        let sim = sim::Device::new();
        let p = plan(2);
        let mut f = fence(&sim, &p);
        let (a, b) = (sim.stream(), sim.stream());
        replay(&mut f, &sim, &p, 0, &a);
        replay(&mut f, &sim, &p, 1, &b); // different claim owners: 1 now owns it
        f.quiesce(&sim).unwrap();
        assert!(f
            .runners
            .iter()
            .all(|r| matches!(r.completion, None | Some(Completion::Recorded { .. }))));
    }
}
