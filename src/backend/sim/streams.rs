//! Streams and events on the deterministic clock: submission, the pending
//! ops applied in the order they end, event records and waits, and the
//! full synchronize.

use std::cmp::Ordering;
use std::sync::{Arc, Mutex, Weak};

use super::clock::{merge, Access};
use super::hazards::Hazard;
use super::ops::{Kernel, Node};
use super::{lock, Result, SimState};

/// A simulated stream. Cheap to clone; clones are the same stream. It knows
/// its backend: another `Device` refuses it.
#[derive(Clone, Debug)]
pub struct Stream {
    pub(super) id: usize,
    pub(super) owner: Weak<Mutex<SimState>>,
    /// Its backend's serial: stream ids are unique in the process.
    pub(super) serial: u64,
}

impl PartialEq for Stream {
    fn eq(&self, other: &Stream) -> bool {
        self.id == other.id && Weak::ptr_eq(&self.owner, &other.owner)
    }
}

impl Eq for Stream {}

impl Stream {
    /// Index of the stream in its backend.
    pub fn index(&self) -> usize {
        self.id
    }
}

/// A simulated completion event; dropping it frees its state.
#[derive(Debug)]
pub struct Event {
    pub(super) state: Arc<Mutex<SimState>>,
    pub(super) id: usize,
}

impl Drop for Event {
    fn drop(&mut self) {
        lock(&self.state).events.remove(self.id);
    }
}

/// What a capturing stream has recorded so far.
#[derive(Default)]
pub(super) struct Capture {
    pub(super) ops: Vec<(Node, u64)>,
    pub(super) records: Vec<(usize, usize)>,
    /// Allocations its allocation nodes made.
    pub(super) temps: Vec<u64>,
    /// Allocations of the parts cut off before it ([`Capture::cut_capture`](crate::backend::Capture::cut_capture)):
    /// its work may use and free them.
    pub(super) inherited: Vec<u64>,
    /// Temporaries its free nodes (or those of the parts before it) freed:
    /// CUDA may hand their memory to a later allocation of the same graph,
    /// so no later op of the capture may use them.
    pub(super) freed: Vec<u64>,
}

pub(super) struct StreamState {
    pub(super) tail: u64,
    pub(super) clock: Vec<u64>,
    pub(super) capturing: Option<Capture>,
}

#[derive(Clone, Debug, Default)]
pub(super) struct EventState {
    pub(super) time: u64,
    pub(super) clock: Vec<u64>,
}

/// Live events by id; ids of dropped events are reused.
#[derive(Default)]
pub(super) struct EventSlab {
    pub(super) slots: Vec<Option<EventState>>,
    free: Vec<usize>,
}

impl EventSlab {
    pub(super) fn insert(&mut self, event: EventState) -> usize {
        match self.free.pop() {
            Some(id) => {
                self.slots[id] = Some(event);
                id
            }
            None => {
                self.slots.push(Some(event));
                self.slots.len() - 1
            }
        }
    }

    fn remove(&mut self, id: usize) {
        if let Some(slot) = self.slots.get_mut(id) {
            if slot.take().is_some() {
                self.free.push(id);
            }
        }
    }

    pub(super) fn get(&self, id: usize) -> Option<&EventState> {
        self.slots.get(id).and_then(Option::as_ref)
    }

    pub(super) fn get_mut(&mut self, id: usize) -> Option<&mut EventState> {
        self.slots.get_mut(id).and_then(Option::as_mut)
    }

    pub(super) fn live(&self) -> usize {
        self.slots.len() - self.free.len()
    }
}

/// Pending ops past which settled ones are applied at submission.
const APPLY_AT: usize = 256;

/// An op submitted but not yet applied; the heap pops the earliest end
/// first, ties in submission order.
pub(super) struct Pending {
    end: u64,
    order: u64,
    op: Node,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Pending) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Pending {}

impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Pending) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Pending {
    fn cmp(&self, other: &Pending) -> Ordering {
        (other.end, other.order).cmp(&(self.end, self.order))
    }
}

impl SimState {
    /// Submits one op to a stream that is not capturing.
    pub(super) fn submit(&mut self, s: usize, op: Kernel, duration: u64) -> Result<()> {
        let op = Node::Kernel(op);
        let ranges = self.ranges(&op)?;
        self.submit_checked(s, op, ranges, duration);
        Ok(())
    }

    /// Submits an op whose ranges were checked.
    pub(super) fn submit_checked(
        &mut self,
        s: usize,
        op: Node,
        ranges: Vec<((u64, u64), bool)>,
        duration: u64,
    ) {
        let stream = &mut self.streams[s];
        let end = stream.tail.saturating_add(duration);
        stream.tail = end;
        if stream.clock.len() <= s {
            stream.clock.resize(s + 1, 0);
        }
        stream.clock[s] += 1;
        let access = Access {
            stream: s,
            seq: stream.clock[s],
        };
        let clock = stream.clock.clone();
        let mut conflicts = Vec::new();
        for (range, write) in ranges {
            self.shadow
                .access(range, write, access, &clock, &mut conflicts);
            self.hazards
                .extend(conflicts.drain(..).map(|(earlier, wrote, addr)| Hazard {
                    first_stream: earlier.stream,
                    first_writes: wrote,
                    second_stream: s,
                    second_writes: write,
                    addr,
                }));
        }
        self.shadow
            .maybe_prune(self.streams.iter().map(|s| s.clock.as_slice()));
        self.pending.push(Pending {
            end,
            order: self.submitted,
            op,
        });
        self.submitted += 1;
        if self.pending.len() >= APPLY_AT {
            self.apply_settled();
        }
    }

    /// Applies the pending ops that end no later than every stream's tail
    /// (called once [`APPLY_AT`] ops are pending, so a short burst between
    /// synchronizations applies nothing early):
    /// every op submitted from now on ends at or after its stream's tail, and
    /// later in submission order, so these come first in any case.
    fn apply_settled(&mut self) {
        let now = self.streams.iter().map(|s| s.tail).min().unwrap_or(0);
        while self.pending.peek().is_some_and(|p| p.end <= now) {
            if let Some(p) = self.pending.pop() {
                self.apply(p.op);
            }
        }
    }

    /// Stream `s`'s tail: its time and clock.
    pub(super) fn tail_of(&self, s: usize) -> EventState {
        let st = &self.streams[s];
        EventState {
            time: st.tail,
            clock: st.clock.clone(),
        }
    }

    /// Stream `s` goes on after `after`.
    pub(super) fn wait_for(&mut self, s: usize, after: &EventState) {
        let st = &mut self.streams[s];
        st.tail = st.tail.max(after.time);
        merge(&mut st.clock, &after.clock);
    }

    /// Records event `event` at the tail of stream `s` (a graph's event
    /// record node); an event dropped since is skipped.
    pub(super) fn record(&mut self, s: usize, event: usize) {
        let recorded = self.tail_of(s);
        if let Some(e) = self.events.get_mut(event) {
            *e = recorded;
        }
    }

    pub(super) fn synchronize(&mut self) {
        while let Some(p) = self.pending.pop() {
            self.apply(p.op);
        }
        let now = self.streams.iter().map(|s| s.tail).max().unwrap_or(0);
        self.host_time = self.host_time.max(now);
        let mut all = Vec::new();
        for s in &self.streams {
            merge(&mut all, &s.clock);
        }
        for s in &mut self.streams {
            s.tail = now;
            merge(&mut s.clock, &all);
        }
        self.shadow.clear();
    }
}
