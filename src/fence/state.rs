//! The fence's state per slot, and the transaction every operation changes
//! it in.
//!
//! An operation opens a transaction ([`Fence::begin`]) before its first
//! backend call. Until it commits, every change to a slot's state goes
//! through [`Fence::save`] or [`Fence::save_reader`], which keep the
//! state as it was before the transaction aside (once per slot and
//! transaction), and the statistics are kept aside whole. When a backend
//! call fails, [`Fence::rollback`] puts every slot back exactly as it was:
//! the waits and records that did go out stay on the device, where they
//! only order more than the fence knows of. When the calls succeeded,
//! [`Fence::commit`] drops what was kept and moves the fence's epoch on.
//! The ledger (who last used which bytes) changes only after a commit,
//! when the launch it describes went out. A step's dry run keeps nothing
//! aside: whoever runs it drops its fence with the first failure
//! ([`Journal::discarded_on_failure`]).

use super::{Fence, FenceStats, On};
use crate::backend::Streams;
use crate::trace::NO_USER;

/// Where a runner's latest replay (or consumer) completes.
pub(super) enum Completion<S> {
    /// At the tail of this stream; its event is not recorded there yet.
    Pending { stream: S, id: u64 },
    /// Its event is recorded on the stream with this id.
    Recorded { id: u64 },
}

impl<S: Clone> Clone for Completion<S> {
    fn clone(&self) -> Self {
        match self {
            Completion::Pending { stream, id } => Completion::Pending {
                stream: stream.clone(),
                id: *id,
            },
            Completion::Recorded { id } => Completion::Recorded { id: *id },
        }
    }
}

impl<S> Completion<S> {
    pub(super) fn stream_id(&self) -> u64 {
        match self {
            Completion::Pending { id, .. } | Completion::Recorded { id } => *id,
        }
    }
}

/// The fence's view of one runner slot.
pub(super) struct Runner<B: Streams> {
    /// `None` for a runner that uses no buffers: it is never fenced.
    pub(super) event: Option<B::Event>,
    pub(super) completion: Option<Completion<B::Stream>>,
    /// Record right after each replay: another stream waited for the
    /// runner's last record.
    pub(super) record_at_once: bool,
    /// A wait used the latest record made at once.
    pub(super) waited_on: bool,
    /// The stream that last waited on the latest record: it need not wait
    /// again (stream order).
    pub(super) waited_by: Option<u64>,
    /// Consumers of the latest replay on streams other than the one it
    /// completes on: each is waited for by the next claimer of the bytes,
    /// none by another consumer. Their events are reused across replays.
    pub(super) readers: Vec<Reader<B>>,
    /// The trace's id of the use that `completion` ends with (`NO_USER`
    /// when no trace saw it).
    pub(super) by: u32,
    /// The transaction that saved this state last.
    saved: u64,
}

impl<B: Streams> Runner<B> {
    pub(super) fn new(event: Option<B::Event>) -> Runner<B> {
        Runner {
            event,
            completion: None,
            record_at_once: false,
            waited_on: false,
            waited_by: None,
            readers: Vec::new(),
            by: NO_USER,
            saved: 0,
        }
    }
}

/// A slot's state changes, in place: the fence keeps it aside first
/// ([`Fence::save`]) inside a transaction; outside one (once a use went
/// out) nothing is kept, and a change finds the slot once.
impl<B: Streams> Runner<B> {
    /// It now completes at the tail of `on`, its event not yet recorded
    /// there, ending with the use `by`.
    #[inline(always)]
    pub(super) fn settle(&mut self, on: On<'_, B::Stream>, by: u32) {
        self.by = by;
        match &self.completion {
            Some(Completion::Pending { id, .. }) if *id == on.id => {}
            _ => {
                self.completion = Some(Completion::Pending {
                    stream: on.stream.clone(),
                    id: on.id,
                });
                self.waited_by = None;
            }
        }
    }

    /// Its event was recorded just now on the stream with id `id`, where
    /// it completes: nobody waited for that record yet.
    #[inline(always)]
    pub(super) fn recorded_on(&mut self, id: u64) {
        self.completion = Some(Completion::Recorded { id });
        self.waited_on = false;
        self.waited_by = None;
    }

    /// Nobody waited for the last record made at once: defer again.
    #[inline(always)]
    pub(super) fn forget_unused_record(&mut self) {
        if self.record_at_once && !self.waited_on {
            self.record_at_once = false;
        }
    }
}

/// One consumer stream's latest read of a runner's bytes.
pub(super) struct Reader<B: Streams> {
    pub(super) event: B::Event,
    /// `None` once a replay of the runner waited for it.
    pub(super) completion: Option<Completion<B::Stream>>,
    /// The trace's id of the consumer it ends with.
    pub(super) by: u32,
    /// The transaction that saved this state last.
    saved: u64,
}

impl<B: Streams> Reader<B> {
    /// A reader with `event`, reading nothing yet.
    pub(super) fn new(event: B::Event) -> Reader<B> {
        Reader {
            event,
            completion: None,
            by: NO_USER,
            saved: 0,
        }
    }
}

/// A slot's state as it was before the open transaction changed it.
enum Undo<S> {
    Runner {
        slot: usize,
        completion: Option<Completion<S>>,
        record_at_once: bool,
        waited_on: bool,
        waited_by: Option<u64>,
        by: u32,
    },
    Reader {
        slot: usize,
        at: usize,
        completion: Option<Completion<S>>,
        by: u32,
    },
}

/// The open transaction: what it changed, as it was before.
pub(super) struct Journal<S> {
    /// The open transaction's number (0: none open yet).
    serial: u64,
    open: bool,
    /// Whether slots' states are kept aside: not for a fence that is
    /// thrown away whole when any of its operations fails (a step's dry
    /// run, [`Journal::discarded_on_failure`]).
    keeps: bool,
    undo: Vec<Undo<S>>,
    stats: FenceStats,
}

impl<S> Journal<S> {
    /// Whether a transaction is open.
    pub(super) fn in_open(&self) -> bool {
        self.open
    }

    /// The journal of a fence that nobody uses after an operation of it
    /// failed (a step's dry run: its build, or its launch's check, fails
    /// with it and drops it): a rollback has no state to put back, so no
    /// change keeps the state before it aside. Transactions still open and
    /// commit (the epoch moves on as on any fence).
    pub(super) fn discarded_on_failure() -> Journal<S> {
        Journal {
            keeps: false,
            ..Journal::default()
        }
    }
}

impl<S> Default for Journal<S> {
    fn default() -> Self {
        Journal {
            serial: 0,
            open: false,
            keeps: true,
            undo: Vec::new(),
            stats: FenceStats::default(),
        }
    }
}

impl<B: Streams> Fence<B> {
    /// Opens a transaction: until [`Fence::commit`] or
    /// [`Fence::rollback`], the state each change replaces is kept aside.
    pub(super) fn begin(&mut self) {
        let journal = &mut self.journal;
        journal.serial += 1;
        journal.open = true;
        journal.undo.clear();
        journal.stats = self.stats;
    }

    /// The operation's backend calls succeeded: its changes stand, and the
    /// fence's epoch moves on.
    pub(super) fn commit(&mut self) {
        self.journal.open = false;
        self.journal.undo.clear();
        self.epoch += 1;
    }

    /// A backend call of the operation failed: every slot and statistic is
    /// as it was at [`Fence::begin`].
    pub(super) fn rollback(&mut self) {
        let journal = &mut self.journal;
        journal.open = false;
        self.stats = journal.stats;
        for undo in journal.undo.drain(..).rev() {
            match undo {
                Undo::Runner {
                    slot,
                    completion,
                    record_at_once,
                    waited_on,
                    waited_by,
                    by,
                } => {
                    let r = &mut self.runners[slot];
                    r.completion = completion;
                    r.record_at_once = record_at_once;
                    r.waited_on = waited_on;
                    r.waited_by = waited_by;
                    r.by = by;
                }
                Undo::Reader {
                    slot,
                    at,
                    completion,
                    by,
                } => {
                    let r = &mut self.runners[slot].readers[at];
                    r.completion = completion;
                    r.by = by;
                }
            }
        }
    }

    /// Whether a transaction is open.
    pub(super) fn in_transaction(&self) -> bool {
        self.journal.in_open()
    }

    /// Before a change to slot `slot`'s completion or record state: keeps
    /// it aside for the open transaction (once per transaction). The check
    /// is inlined at every change (most find nothing to keep: no
    /// transaction keeps state, or it kept this slot's already).
    #[inline(always)]
    pub(super) fn save(&mut self, slot: usize) {
        let journal = &self.journal;
        if journal.open && journal.keeps && self.runners[slot].saved != journal.serial {
            self.keep_runner(slot);
        }
    }

    /// [`Fence::save`]'s keeping.
    #[inline(never)]
    fn keep_runner(&mut self, slot: usize) {
        let journal = &mut self.journal;
        let r = &mut self.runners[slot];
        r.saved = journal.serial;
        journal.undo.push(Undo::Runner {
            slot,
            completion: r.completion.clone(),
            record_at_once: r.record_at_once,
            waited_on: r.waited_on,
            waited_by: r.waited_by,
            by: r.by,
        });
    }

    /// Before a change to reader `at` of slot `slot`: keeps it aside for
    /// the open transaction (once per transaction).
    #[inline(always)]
    pub(super) fn save_reader(&mut self, slot: usize, at: usize) {
        let journal = &self.journal;
        if journal.open && journal.keeps && self.runners[slot].readers[at].saved != journal.serial {
            self.keep_reader(slot, at);
        }
    }

    /// [`Fence::save_reader`]'s keeping.
    #[inline(never)]
    fn keep_reader(&mut self, slot: usize, at: usize) {
        let journal = &mut self.journal;
        let r = &mut self.runners[slot].readers[at];
        r.saved = journal.serial;
        journal.undo.push(Undo::Reader {
            slot,
            at,
            completion: r.completion.clone(),
            by: r.by,
        });
    }

    /// Adds a reader to slot `slot` (its event lives as long as the fence,
    /// whether or not the transaction commits); returns its index.
    pub(super) fn push_reader(&mut self, slot: usize, event: B::Event) -> usize {
        let readers = &mut self.runners[slot].readers;
        readers.push(Reader::new(event));
        let at = readers.len() - 1;
        self.save_reader(slot, at);
        at
    }
}

#[cfg(test)]
impl<B: Streams> Fence<B> {
    /// What a step launch takes from this fence's ledger (a dry run's: a
    /// part), as relations: two equal digests are the same for every later
    /// check and wait, whatever the counters' values. Per byte range it
    /// holds, its latest users (adjacent pieces of one user merged); per
    /// handoff it holds, whether its writer marks it ready, whether it was
    /// written, and per reader whether it read the latest write.
    pub(crate) fn ledger_digest(&self, plan: &crate::plan::Planned) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        for &claim in self.ledger.bytes.as_deref().unwrap_or_default() {
            let mut pieces: Vec<(u64, u64, u32)> = (self.ledger.painter.pieces(claim))
                .map(|(c, runner)| (c.lo, c.hi, runner))
                .collect();
            pieces.sort_unstable();
            let mut merged: Vec<(u64, u64, u32)> = Vec::new();
            for (lo, hi, runner) in pieces {
                match merged.last_mut() {
                    Some(last) if last.1 == lo && last.2 == runner => last.1 = hi,
                    _ => merged.push((lo, hi, runner)),
                }
            }
            let _ = write!(out, "{}:{merged:?} ", claim.region);
        }
        for h in 0..plan.handoffs.len() {
            if let Some(state) = self.ledger.handoffs.get(h) {
                let read: Vec<bool> = state.read.iter().map(|&r| r == state.written).collect();
                let _ = write!(out, "h{h}:{} {} {read:?} ", state.ready, state.written > 0);
            }
        }
        out
    }

    /// Everything an operation may change, printed (streams by identity):
    /// two equal digests are the same fence state.
    pub(crate) fn digest(&self) -> String {
        use std::fmt::Write;
        let completion = |c: &Option<Completion<B::Stream>>| match c {
            None => "-".to_string(),
            Some(Completion::Pending { id, .. }) => format!("pending@{id:x}"),
            Some(Completion::Recorded { id }) => format!("recorded@{id:x}"),
        };
        let mut out = format!("{:?} {:?} {} ", self.stats, self.ledger, self.epoch);
        for (i, r) in self.runners.iter().enumerate() {
            let _ = write!(
                out,
                "[{i}: {} {} {} {:?}",
                completion(&r.completion),
                r.record_at_once,
                r.waited_on,
                r.waited_by
            );
            for reader in &r.readers {
                let _ = write!(out, " r{}", completion(&reader.completion));
            }
            out.push(']');
        }
        out
    }
}
