//! The `sim` backend: real host arenas with stable addresses, simulated
//! streams and events on a deterministic clock, graphs as recorded op lists.
//!
//! It is a reference model of the CUDA stream semantics the fence relies on:
//!
//! - each op on a stream starts when the stream's previous op ended and every
//!   event the stream waited on completed, and runs for its `duration` ticks;
//! - ops take effect in the order they *end* on the simulated clock, so two
//!   unordered replays that touch the same bytes really corrupt each other's
//!   data, as they would on a GPU;
//! - a vector-clock detector records a [`Hazard`] whenever an op touches bytes
//!   that an op not ordered before it (by stream order, event waits or
//!   [`Device::synchronize`]) wrote, or writes bytes such an op read,
//!   whatever the timing;
//! - streams, events and memory belong to one `Device` (clones share
//!   it): another refuses them with [`BackendError::Refused`], as it refuses
//!   a span outside every live allocation or too long to address.
//!
//! Once a few hundred ops are pending, each op is applied as soon as no later
//! submission can end before it (every stream's tail is past its end), so
//! few ops stay pending on streams that keep moving; [`Backend::synchronize_event`] is a full synchronize, which
//! keeps the model deterministic. Events are freed when dropped.
//!
//! The detector keeps shadow memory, not a list of accesses: per byte
//! interval, the last write and the reads since it (the latest per stream).
//! An access is unordered with an earlier one of the same bytes exactly when
//! it is unordered with that write or one of those reads (whatever happened
//! before the last write was ordered before it, or is itself a hazard), so
//! the first hazard of any schedule is found as with the whole history, and
//! the detector holds at most a few intervals per span in use, however long
//! streams go without waiting for each other.
//!
//! Kernels are [`Op`]s on `f32` data: fill, copy, add, scale.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use crate::backend::{check_memory_nodes, Arena, ArenaDesc, Backend, BackendError, StepNode};
use crate::scope::{capture_on, check_use};
use crate::view::{View, ViewTag};
use crate::vocab::{DType, Domain, Request};

type Result<T> = std::result::Result<T, BackendError>;

/// A range of `f32` elements in simulated memory.
///
/// A span of a [`View`] remembers the view, and is usable only where the
/// view is (inside its capture's or consumer's closure, on its stream); a
/// span made from a raw address ([`Span::new`]) may not touch a plan's
/// arenas at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    addr: u64,
    len: usize,
    /// The view it was made from (its address and length cannot change).
    view: Option<ViewTag>,
}

impl Span {
    /// `len` `f32`s at `addr` (host memory of this backend's buffers).
    pub fn new(addr: u64, len: usize) -> Span {
        Span {
            addr,
            len,
            view: None,
        }
    }

    /// Address of the first element.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Number of `f32` elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// One past the last byte; `None` when that overflows the address space
    /// (such a span lies outside every allocation).
    fn end(&self) -> Option<u64> {
        u64::try_from(self.len)
            .ok()?
            .checked_mul(4)?
            .checked_add(self.addr)
    }
}

/// Anything that names simulated `f32` memory.
pub trait AsSpan {
    /// The span.
    fn span(&self) -> Span;
}

impl AsSpan for Span {
    fn span(&self) -> Span {
        *self
    }
}

impl<T: AsSpan + ?Sized> AsSpan for &T {
    fn span(&self) -> Span {
        (**self).span()
    }
}

impl AsSpan for View<'_> {
    /// The view's bytes read as `f32` elements.
    fn span(&self) -> Span {
        Span {
            addr: self.device_address(),
            len: (self.bytes() / 4) as usize,
            view: Some(self.tag()),
        }
    }
}

impl AsSpan for HostBuffer {
    fn span(&self) -> Span {
        Span::new(self.base, self.len)
    }
}

/// One simulated kernel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    /// `dst[i] = value`.
    Fill {
        /// Written.
        dst: Span,
        /// The value.
        value: f32,
    },
    /// `dst[i] = src[i]`.
    Copy {
        /// Read.
        src: Span,
        /// Written.
        dst: Span,
    },
    /// `dst[i] += src[i]`.
    Add {
        /// Read.
        src: Span,
        /// Read and written.
        dst: Span,
    },
    /// `dst[i] *= factor`.
    Scale {
        /// Read and written.
        dst: Span,
        /// The factor.
        factor: f32,
    },
    /// A graph memory allocation node, as stream-ordered allocation during
    /// capture creates in CUDA ([`Device::alloc_async`]). Its address
    /// is fixed for the graph's life; a plan accepts the graph only when
    /// the graph also frees it.
    AllocNode {
        /// The address it hands out.
        addr: u64,
        /// Bytes it allocates.
        bytes: u64,
    },
    /// A graph memory free node ([`Device::free_async`]); a plan accepts
    /// it only for memory the same graph allocated.
    FreeNode {
        /// The address it frees.
        addr: u64,
    },
}

impl Op {
    /// `dst[i] = value`.
    pub fn fill(dst: &impl AsSpan, value: f32) -> Op {
        Op::Fill {
            dst: dst.span(),
            value,
        }
    }

    /// `dst[i] = src[i]` (over the shorter of the two).
    pub fn copy(src: &impl AsSpan, dst: &impl AsSpan) -> Op {
        Op::Copy {
            src: src.span(),
            dst: dst.span(),
        }
    }

    /// `dst[i] += src[i]` (over the shorter of the two).
    pub fn add(src: &impl AsSpan, dst: &impl AsSpan) -> Op {
        Op::Add {
            src: src.span(),
            dst: dst.span(),
        }
    }

    /// `dst[i] *= factor`.
    pub fn scale(dst: &impl AsSpan, factor: f32) -> Op {
        Op::Scale {
            dst: dst.span(),
            factor,
        }
    }

    /// (span, written?) for every span the op touches.
    fn accesses(&self) -> Vec<(Span, bool)> {
        match *self {
            Op::Fill { dst, .. } | Op::Scale { dst, .. } => vec![(dst, true)],
            Op::Copy { src, dst } => vec![(src, false), (dst, true)],
            Op::Add { src, dst } => vec![(src, false), (dst, true)],
            Op::AllocNode { .. } | Op::FreeNode { .. } => Vec::new(),
        }
    }
}

/// Two unordered accesses to the same bytes, at least one a write.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Hazard {
    /// Stream of the earlier-submitted access.
    pub first_stream: usize,
    /// Whether it wrote.
    pub first_writes: bool,
    /// Stream of the later-submitted access.
    pub second_stream: usize,
    /// Whether it wrote.
    pub second_writes: bool,
    /// First overlapping byte address.
    pub addr: u64,
}

impl fmt::Display for Hazard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rw = |w| if w { "write" } else { "read" };
        write!(
            f,
            "{} on stream {} and {} on stream {} touch {:#x} unordered",
            rw(self.first_writes),
            self.first_stream,
            rw(self.second_writes),
            self.second_stream,
            self.addr
        )
    }
}

/// A simulated stream. Cheap to clone; clones are the same stream. It knows
/// its backend: another `Device` refuses it.
#[derive(Clone, Debug)]
pub struct Stream {
    id: usize,
    owner: Weak<Mutex<SimState>>,
    /// Its backend's serial: stream ids are unique in the process.
    serial: u64,
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
    state: Arc<Mutex<SimState>>,
    id: usize,
}

impl Drop for Event {
    fn drop(&mut self) {
        lock(&self.state).events.remove(self.id);
    }
}

/// A captured op list, and the memory its allocation nodes hand out (kept
/// for the graph's life, as CUDA keeps a graph's allocations at fixed
/// addresses).
#[derive(Clone, Debug, Default)]
pub struct Graph {
    ops: Vec<(Op, u64)>,
    /// Event record nodes: (index of the op they precede, event id).
    records: Vec<(usize, usize)>,
    /// Held for their drop: frees the allocation nodes' memory with the
    /// graph (a composed graph holds its parts').
    memory: Vec<Arc<GraphMemory>>,
    /// A composed graph ([`Backend::compose`]): its nodes, run on lanes.
    step: Option<Arc<SimStep>>,
    /// Where the latest launch ended: launches of one graph run one after
    /// another, as launches of one CUDA executable graph do.
    last: Arc<Mutex<Option<EventState>>>,
}

/// The byte ranges one op touches: ((start, end), written?).
type OpRanges = Vec<((u64, u64), bool)>;

/// A graph of graphs: each node runs on its lane (an internal stream)
/// after the nodes it depends on.
#[derive(Debug)]
struct SimStep {
    nodes: Vec<SimStepNode>,
    /// Lane -> the internal stream it runs on.
    lanes: Vec<usize>,
}

#[derive(Debug)]
struct SimStepNode {
    ops: Vec<(Op, u64)>,
    records: Vec<(usize, usize)>,
    deps: Vec<usize>,
    lane: usize,
}

impl PartialEq for Graph {
    fn eq(&self, other: &Graph) -> bool {
        self.ops == other.ops
    }
}

/// Host memory behind a graph's allocation nodes; freed with the graph.
#[derive(Debug)]
struct GraphMemory {
    state: Arc<Mutex<SimState>>,
    bases: Vec<u64>,
}

impl Drop for GraphMemory {
    fn drop(&mut self) {
        let mut s = lock(&self.state);
        s.synchronize();
        for &base in &self.bases {
            s.free_graph_memory(base);
        }
    }
}

/// What a capturing stream has recorded so far.
#[derive(Default)]
struct Capture {
    ops: Vec<(Op, u64)>,
    records: Vec<(usize, usize)>,
    /// Allocations its allocation nodes made.
    temps: Vec<u64>,
}

impl Graph {
    /// The captured ops with their durations.
    pub fn ops(&self) -> &[(Op, u64)] {
        &self.ops
    }
}

/// A simulated arena; dropping it frees its host memory.
#[derive(Debug)]
pub struct Memory {
    state: Arc<Mutex<SimState>>,
    base: u64,
    bytes: u64,
}

impl Arena for Memory {
    fn base(&self) -> u64 {
        self.base
    }

    fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        // As a stream-ordered free: pending ops on it end first.
        let mut s = lock(&self.state);
        s.synchronize();
        s.free(self.base);
    }
}

/// A host buffer of `f32`s outside the plan (consumer outputs, say).
#[derive(Debug)]
pub struct HostBuffer {
    state: Arc<Mutex<SimState>>,
    base: u64,
    len: usize,
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        // As a stream-ordered free: pending ops on it end first, so freed
        // memory is never written.
        let mut s = lock(&self.state);
        s.synchronize();
        s.free(self.base);
    }
}

struct Allocation {
    data: Vec<u8>,
    pad: usize,
    bytes: u64,
    /// A plan's arena (only views may touch it), not a buffer.
    arena: bool,
}

struct StreamState {
    tail: u64,
    clock: Vec<u64>,
    capturing: Option<Capture>,
}

#[derive(Clone, Debug, Default)]
struct EventState {
    time: u64,
    clock: Vec<u64>,
}

/// Live events by id; ids of dropped events are reused.
#[derive(Default)]
struct EventSlab {
    slots: Vec<Option<EventState>>,
    free: Vec<usize>,
}

impl EventSlab {
    fn insert(&mut self, event: EventState) -> usize {
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

    fn get_mut(&mut self, id: usize) -> Option<&mut EventState> {
        self.slots.get_mut(id).and_then(Option::as_mut)
    }

    fn live(&self) -> usize {
        self.slots.len() - self.free.len()
    }
}

/// One access: its stream and that stream's sequence number for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Access {
    stream: usize,
    seq: u64,
}

impl Access {
    /// Whether an op with vector clock `clock` is ordered after this access.
    fn ordered_before(&self, clock: &[u64]) -> bool {
        clock_at(clock, self.stream) >= self.seq
    }
}

/// Shadow state of one byte interval `[start, end)`.
#[derive(Clone, Debug, Default)]
struct Cell {
    end: u64,
    /// The last write.
    writer: Option<Access>,
    /// Reads since the last write: the latest per stream (an op unordered
    /// with an earlier read of a stream is unordered with its later ones).
    readers: Vec<Access>,
}

impl Cell {
    fn is_empty(&self) -> bool {
        self.writer.is_none() && self.readers.is_empty()
    }

    /// Checks an access starting at byte `start` of this cell against the
    /// cell's write (and, for a write, its reads), noting each unordered one
    /// in `conflicts` once per (stream, whether it wrote); a read joins the
    /// cell's reads.
    fn visit(
        &mut self,
        start: u64,
        write: bool,
        access: Access,
        clock: &[u64],
        conflicts: &mut Vec<(Access, bool, u64)>,
    ) {
        let mut note = |earlier: Access, wrote: bool| {
            let seen = conflicts
                .iter()
                .any(|(a, w, _)| a.stream == earlier.stream && *w == wrote);
            if !seen {
                conflicts.push((earlier, wrote, start));
            }
        };
        if let Some(w) = self.writer {
            if !w.ordered_before(clock) {
                note(w, true);
            }
        }
        if write {
            for &r in &self.readers {
                if !r.ordered_before(clock) {
                    note(r, false);
                }
            }
        } else {
            match self.readers.iter_mut().find(|r| r.stream == access.stream) {
                Some(r) => r.seq = access.seq,
                None => self.readers.push(access),
            }
        }
    }
}

/// Disjoint byte intervals `start -> cell`, covering every byte accessed
/// since the last synchronize (less what pruning proved ordered).
#[derive(Default)]
struct Shadow {
    cells: BTreeMap<u64, Cell>,
    /// Prune when the map grows past this (doubles with the live size, so
    /// pruning costs amortized `O(1)` per access).
    prune_at: usize,
}

/// Pending ops past which settled ones are applied at submission.
const APPLY_AT: usize = 256;

/// The least size at which the shadow is pruned.
const PRUNE_AT_LEAST: usize = 4096;

impl Shadow {
    /// Splits the cell that straddles `at`, if any.
    fn split(&mut self, at: u64) {
        let Some((_, cell)) = self.cells.range_mut(..at).next_back() else {
            return;
        };
        if cell.end > at {
            let upper = cell.clone();
            cell.end = at;
            self.cells.insert(at, upper);
        }
    }

    /// Records an access of `[lo, hi)` by `access` (whose stream's vector
    /// clock is `clock`) and adds to `conflicts` the earlier accesses it is
    /// unordered with, once per (stream, whether it wrote), with the first
    /// byte each touches.
    fn access(
        &mut self,
        (lo, hi): (u64, u64),
        write: bool,
        access: Access,
        clock: &[u64],
        conflicts: &mut Vec<(Access, bool, u64)>,
    ) {
        if lo >= hi {
            // An empty span touches no byte.
            return;
        }
        // Fast path: the bytes are one cell already (a graph replayed over
        // the same views).
        if let Some(cell) = self.cells.get_mut(&lo).filter(|c| c.end == hi) {
            cell.visit(lo, write, access, clock, conflicts);
            if write {
                cell.writer = Some(access);
                cell.readers.clear();
            }
            return;
        }
        self.split(lo);
        self.split(hi);
        // Fill the gaps so that [lo, hi) is covered by cells.
        let mut gaps = Vec::new();
        let mut cursor = lo;
        for (&start, cell) in self.cells.range(lo..hi) {
            if start > cursor {
                gaps.push((cursor, start));
            }
            cursor = cell.end;
        }
        if cursor < hi {
            gaps.push((cursor, hi));
        }
        for (start, end) in gaps {
            self.cells.insert(
                start,
                Cell {
                    end,
                    ..Cell::default()
                },
            );
        }
        for (&start, cell) in self.cells.range_mut(lo..hi) {
            cell.visit(start, write, access, clock, conflicts);
        }
        if write {
            let inside: Vec<u64> = self.cells.range(lo..hi).map(|(&s, _)| s).collect();
            for start in inside {
                self.cells.remove(&start);
            }
            self.cells.insert(
                lo,
                Cell {
                    end: hi,
                    writer: Some(access),
                    readers: Vec::new(),
                },
            );
        }
    }

    /// Forgets accesses every stream is ordered after (no later op of these
    /// streams can be unordered with them) once the map has grown enough.
    fn maybe_prune(&mut self, streams: &[StreamState]) {
        if self.cells.len() < self.prune_at.max(PRUNE_AT_LEAST) {
            return;
        }
        let stale = |a: &Access| streams.iter().all(|t| a.ordered_before(&t.clock));
        self.cells.retain(|_, cell| {
            if cell.writer.as_ref().is_some_and(stale) {
                cell.writer = None;
            }
            cell.readers.retain(|r| !stale(r));
            !cell.is_empty()
        });
        self.prune_at = 2 * self.cells.len();
    }

    fn clear(&mut self) {
        self.cells.clear();
    }
}

/// An op submitted but not yet applied; the heap pops the earliest end
/// first, ties in submission order.
struct Pending {
    end: u64,
    order: u64,
    op: Op,
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

#[derive(Default)]
struct SimState {
    allocs: BTreeMap<u64, Allocation>,
    streams: Vec<StreamState>,
    events: EventSlab,
    pending: BinaryHeap<Pending>,
    shadow: Shadow,
    hazards: Vec<Hazard>,
    submitted: u64,
    allocations_left: Option<usize>,
    /// Fault injection: host waits fail (a sticky device error, say).
    waits_fail: bool,
    allocations: u64,
    frees: u64,
    /// Bytes held by live graphs' allocation nodes.
    graph_bytes: u64,
}

fn lock(state: &Mutex<SimState>) -> MutexGuard<'_, SimState> {
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn clock_at(clock: &[u64], stream: usize) -> u64 {
    clock.get(stream).copied().unwrap_or(0)
}

fn merge(into: &mut Vec<u64>, from: &[u64]) {
    if into.len() < from.len() {
        into.resize(from.len(), 0);
    }
    for (a, b) in into.iter_mut().zip(from) {
        *a = (*a).max(*b);
    }
}

fn sim_error(op: &'static str, reason: impl Into<String>) -> BackendError {
    BackendError::Refused {
        op,
        reason: reason.into(),
    }
}

const FOREIGN_STREAM: &str = "stream belongs to another sim::Device";

const FOREIGN_EVENT: &str = "event belongs to another sim::Device";

impl SimState {
    fn alloc(&mut self, bytes: u64, align: u64, arena: bool) -> std::result::Result<u64, String> {
        if let Some(left) = self.allocations_left.as_mut() {
            if *left == 0 {
                return Err("injected allocation failure".into());
            }
            *left -= 1;
        }
        let len = usize::try_from(bytes.checked_add(align).ok_or("size overflows")?)
            .map_err(|_| "size exceeds the address space")?;
        // Fallible: an arena the host cannot hold is an error, not a panic
        // (`vec!` panics past `isize::MAX` and aborts when the allocator fails).
        let mut data = Vec::new();
        data.try_reserve_exact(len).map_err(|e| e.to_string())?;
        data.resize(len, 0u8);
        let ptr = data.as_ptr() as u64;
        let pad = ((align - ptr % align) % align) as usize;
        let base = ptr + pad as u64;
        self.allocs.insert(
            base,
            Allocation {
                data,
                pad,
                bytes,
                arena,
            },
        );
        self.allocations += 1;
        Ok(base)
    }

    /// Frees a graph allocation node's memory.
    fn free_graph_memory(&mut self, base: u64) {
        if let Some(a) = self.allocs.get(&base) {
            self.graph_bytes = self.graph_bytes.saturating_sub(a.bytes);
        }
        self.free(base);
    }

    fn free(&mut self, base: u64) {
        if self.allocs.remove(&base).is_some() {
            self.frees += 1;
        }
    }

    /// The allocation holding the whole span, as (base, allocation).
    fn find(&self, span: &Span) -> Option<(u64, &Allocation)> {
        let end = span.end()?;
        let (&base, a) = self.allocs.range(..=span.addr).next_back()?;
        (end <= base + a.bytes).then_some((base, a))
    }

    /// The bytes of a span inside its allocation's buffer.
    fn range(&self, span: &Span) -> Option<(u64, std::ops::Range<usize>)> {
        let (base, a) = self.find(span)?;
        let start = a.pad + usize::try_from(span.addr - base).ok()?;
        // `find` checked that the span ends inside the allocation.
        Some((base, start..start + 4 * span.len))
    }

    fn read(&self, span: &Span) -> Option<Vec<f32>> {
        let (base, range) = self.range(span)?;
        let a = self.allocs.get(&base)?;
        Some(
            a.data[range]
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        )
    }

    fn write(&mut self, span: &Span, values: &[f32]) -> Option<()> {
        let (base, range) = self.range(span)?;
        let a = self.allocs.get_mut(&base)?;
        for (chunk, v) in a.data[range].chunks_exact_mut(4).zip(values) {
            chunk.copy_from_slice(&v.to_le_bytes());
        }
        Some(())
    }

    /// The byte ranges (start, end, written?) an op touches, each inside a
    /// live allocation.
    fn ranges(&self, op: &Op) -> Result<Vec<((u64, u64), bool)>> {
        let accesses = op.accesses();
        let mut ranges = Vec::with_capacity(accesses.len());
        for (span, write) in &accesses {
            match (self.find(span), span.end()) {
                (Some(_), Some(end)) => ranges.push(((span.addr, end), *write)),
                _ => {
                    return Err(sim_error(
                        "sim launch",
                        format!(
                            "{} f32 at {:#x} lie outside every live allocation",
                            span.len, span.addr
                        ),
                    ))
                }
            }
        }
        Ok(ranges)
    }

    /// Refuses an op that touches a plan's arena where the fence cannot
    /// order it: through a view outside its closure or on another stream,
    /// or through a raw span.
    fn check_scope(&self, sid: u64, op: &Op) -> Result<()> {
        for (span, write) in op.accesses() {
            match &span.view {
                Some(tag) => {
                    check_use(tag, sid, write).map_err(|reason| sim_error("sim launch", reason))?;
                }
                None => self.check_raw(&span)?,
            }
        }
        Ok(())
    }

    /// Refuses a raw span that lies in a plan's arena.
    fn check_raw(&self, span: &Span) -> Result<()> {
        if span.view.is_none() && self.find(span).is_some_and(|(_, a)| a.arena) {
            return Err(sim_error(
                "sim launch",
                format!(
                    "{} f32 at {:#x} lie in a plan's arena: reach arena memory through the \
                     views a capture or consumer hands out",
                    span.len, span.addr
                ),
            ));
        }
        Ok(())
    }

    /// Submits one op to a stream that is not capturing.
    fn submit(&mut self, s: usize, op: Op, duration: u64) -> Result<()> {
        let ranges = self.ranges(&op)?;
        self.submit_checked(s, op, ranges, duration);
        Ok(())
    }

    /// Submits an op whose ranges were checked.
    fn submit_checked(&mut self, s: usize, op: Op, ranges: Vec<((u64, u64), bool)>, duration: u64) {
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
        self.shadow.maybe_prune(&self.streams);
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

    fn apply(&mut self, op: Op) {
        match op {
            Op::Fill { dst, value } => self.binary(dst, dst, |_, _| value),
            Op::Copy { src, dst } => self.binary(src, dst, |_, s| s),
            Op::Add { src, dst } => self.binary(src, dst, |d, s| d + s),
            Op::Scale { dst, factor } => self.binary(dst, dst, |d, _| d * factor),
            Op::AllocNode { .. } | Op::FreeNode { .. } => {}
        }
    }

    /// `dst[i] = f(dst[i], src[i])` over the shorter of the two.
    fn binary(&mut self, src: Span, dst: Span, f: impl Fn(f32, f32) -> f32) {
        let n = src.len.min(dst.len);
        let src = Span { len: n, ..src };
        let dst = Span { len: n, ..dst };
        if let (Some(s), Some(d)) = (self.read(&src), self.read(&dst)) {
            let out: Vec<f32> = d.iter().zip(&s).map(|(&d, &s)| f(d, s)).collect();
            self.write(&dst, &out);
        }
    }

    /// Stream `s`'s tail: its time and clock.
    fn tail_of(&self, s: usize) -> EventState {
        let st = &self.streams[s];
        EventState {
            time: st.tail,
            clock: st.clock.clone(),
        }
    }

    /// Stream `s` goes on after `after`.
    fn wait_for(&mut self, s: usize, after: &EventState) {
        let st = &mut self.streams[s];
        st.tail = st.tail.max(after.time);
        merge(&mut st.clock, &after.clock);
    }

    /// Checks a graph's ops before any is submitted (all or nothing): a raw
    /// span captured into a program buffer that was freed since may now
    /// name a plan's arena.
    fn graph_ranges(&self, ops: &[(Op, u64)]) -> Result<Vec<OpRanges>> {
        ops.iter()
            .map(|(op, _)| {
                op.accesses()
                    .iter()
                    .try_for_each(|(span, _)| self.check_raw(span))?;
                self.ranges(op)
            })
            .collect()
    }

    /// Submits checked ops to stream `s`, with the event records between
    /// them.
    fn run_ops(
        &mut self,
        s: usize,
        ops: &[(Op, u64)],
        records: &[(usize, usize)],
        ranges: Vec<OpRanges>,
    ) {
        let mut records = records.iter().peekable();
        for (i, (&(op, duration), ranges)) in ops.iter().zip(ranges).enumerate() {
            while let Some(&(_, event)) = records.next_if(|(at, _)| *at == i) {
                self.record(s, event);
            }
            self.submit_checked(s, op, ranges, duration);
        }
        for &(_, event) in records {
            self.record(s, event);
        }
    }

    /// Launches `graph` on stream `s`, after its previous launch (on
    /// whatever stream it ran), as launches of one CUDA executable graph
    /// run. A composed graph runs each node on its lane (an internal
    /// stream) after its dependencies, every lane starting after what `s`
    /// holds, and `s` goes on after every node. All or nothing.
    fn launch_graph(&mut self, s: usize, graph: &Graph) -> Result<()> {
        let nodes: Vec<&[(Op, u64)]> = match &graph.step {
            Some(step) => step.nodes.iter().map(|n| n.ops.as_slice()).collect(),
            None => vec![graph.ops.as_slice()],
        };
        let ranges = nodes
            .iter()
            .map(|ops| self.graph_ranges(ops))
            .collect::<Result<Vec<_>>>()?;
        let mut last = graph.last.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(prev) = last.as_ref() {
            self.wait_for(s, prev);
        }
        match &graph.step {
            None => {
                let ranges = ranges.into_iter().next().unwrap_or_default();
                self.run_ops(s, &graph.ops, &graph.records, ranges);
            }
            Some(step) => {
                let start = self.tail_of(s);
                for &lane in &step.lanes {
                    self.wait_for(lane, &start);
                }
                let mut ends: Vec<EventState> = Vec::with_capacity(step.nodes.len());
                for (node, ranges) in step.nodes.iter().zip(ranges) {
                    let lane = step.lanes[node.lane];
                    for &d in &node.deps {
                        let after = ends[d].clone();
                        self.wait_for(lane, &after);
                    }
                    self.run_ops(lane, &node.ops, &node.records, ranges);
                    ends.push(self.tail_of(lane));
                }
                for &lane in &step.lanes {
                    let end = self.tail_of(lane);
                    self.wait_for(s, &end);
                }
            }
        }
        *last = Some(self.tail_of(s));
        Ok(())
    }

    /// Records event `event` at the tail of stream `s` (a graph's event
    /// record node); an event dropped since is skipped.
    fn record(&mut self, s: usize, event: usize) {
        let recorded = self.tail_of(s);
        if let Some(e) = self.events.get_mut(event) {
            *e = recorded;
        }
    }

    fn synchronize(&mut self) {
        while let Some(p) = self.pending.pop() {
            self.apply(p.op);
        }
        let now = self.streams.iter().map(|s| s.tail).max().unwrap_or(0);
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

/// The `sim` backend. A cheap handle: clones share one simulated device.
#[derive(Clone)]
pub struct Device {
    state: Arc<Mutex<SimState>>,
    /// Unique in the process: stream ids are `serial << 32 | index`, so no
    /// two backends' streams share an id.
    serial: u64,
}

impl Default for Device {
    fn default() -> Device {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Device {
            state: Arc::default(),
            serial: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }
    }
}

impl fmt::Debug for SimState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimState")
            .field("streams", &self.streams.len())
            .field("live_allocations", &self.allocs.len())
            .field("live_events", &self.events.live())
            .field("hazards", &self.hazards.len())
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Device").field(&*self.state()).finish()
    }
}

impl Device {
    /// A fresh simulated device with no streams.
    pub fn new() -> Device {
        Device::default()
    }

    fn state(&self) -> MutexGuard<'_, SimState> {
        lock(&self.state)
    }

    /// The index of `stream` if this backend created it.
    fn own(&self, stream: &Stream, op: &'static str) -> Result<usize> {
        if std::ptr::eq(stream.owner.as_ptr(), Arc::as_ptr(&self.state)) {
            Ok(stream.id)
        } else {
            Err(sim_error(op, FOREIGN_STREAM))
        }
    }

    /// The id of `event` if this backend created it.
    fn own_event(&self, event: &Event, op: &'static str) -> Result<usize> {
        if Arc::ptr_eq(&event.state, &self.state) {
            Ok(event.id)
        } else {
            Err(sim_error(op, FOREIGN_EVENT))
        }
    }

    /// A new stream (every stream can be captured).
    pub fn stream(&self) -> Stream {
        let mut s = self.state();
        let id = s.streams.len();
        let tail = s.streams.iter().map(|t| t.tail).max().unwrap_or(0);
        s.streams.push(StreamState {
            tail,
            clock: vec![0; id + 1],
            capturing: None,
        });
        Stream {
            id,
            owner: Arc::downgrade(&self.state),
            serial: self.serial,
        }
    }

    /// Allocates a zeroed host buffer of `len` `f32`s outside any plan.
    pub fn alloc_f32(&self, len: usize) -> Result<HostBuffer> {
        let bytes = (len as u64).saturating_mul(4);
        let base = self
            .state()
            .alloc(bytes, 256, false)
            .map_err(|reason| sim_error("sim alloc", reason))?;
        Ok(HostBuffer {
            state: self.state.clone(),
            base,
            len,
        })
    }

    /// Submits one op of `duration` ticks to `stream` (captured instead when
    /// the stream is capturing).
    ///
    /// # Errors
    ///
    /// [`BackendError::Refused`] for a stream of another `Device`; for a
    /// view used outside the closure of the capture or consumer that handed
    /// it out, or on another stream than that closure's; for a raw span
    /// into a plan's arena; and, when not capturing, for a span outside
    /// every live allocation (or too long to address).
    pub fn launch(&self, stream: &Stream, op: Op, duration: u64) -> Result<()> {
        let id = self.own(stream, "sim launch")?;
        let mut s = self.state();
        s.check_scope(self.stream_id(stream), &op)?;
        if let Some(capture) = s.streams[id].capturing.as_mut() {
            capture.ops.push((op, duration));
            return Ok(());
        }
        s.submit(id, op, duration)
    }

    /// [`Device::launch`] without the view checks: the op may touch any
    /// live memory, a plan's arenas included, on any stream. For reference
    /// runs that show what the fence prevents.
    ///
    /// # Safety
    ///
    /// The caller orders the op against every replay and consumer that uses
    /// the bytes it touches (the sim itself stays memory-safe: the contract
    /// is the one a CUDA kernel on raw addresses would have).
    ///
    /// # Errors
    ///
    /// As [`Device::launch`], but for the view checks.
    pub unsafe fn launch_unscoped(&self, stream: &Stream, op: Op, duration: u64) -> Result<()> {
        let id = self.own(stream, "sim launch")?;
        let mut s = self.state();
        if let Some(capture) = s.streams[id].capturing.as_mut() {
            capture.ops.push((op, duration));
            return Ok(());
        }
        s.submit(id, op, duration)
    }

    /// Allocates `len` `f32`s inside a runner's
    /// [`stream_capture`](crate::RunnerCapture::stream_capture) closure, as
    /// `cuMemAllocAsync` does in CUDA: the graph gets an allocation node, and
    /// the memory, at a fixed address, lives as long as the graph. The span
    /// works like the runner's views: inside that closure, on its stream
    /// (no other graph, no op outside it). A plan accepts the graph only
    /// when it also frees the memory ([`Device::free_async`]).
    ///
    /// # Errors
    ///
    /// [`BackendError::Refused`] when `stream` is not capturing (use
    /// [`Device::alloc_f32`]) or belongs to another backend; the
    /// allocation's own failure.
    pub fn alloc_async(&self, stream: &Stream, len: usize) -> Result<Span> {
        let id = self.own(stream, "sim alloc async")?;
        // A temporary belongs to the runner's capture: it works, as its
        // views do, only inside that capture's closure, on its stream.
        let Some((scope, runner)) = capture_on(self.stream_id(stream)) else {
            return Err(sim_error(
                "sim alloc async",
                "temporaries are allocated inside a runner's `stream_capture` closure, on its \
                 stream (alloc_f32 allocates outside captures)",
            ));
        };
        let mut s = self.state();
        if s.streams[id].capturing.is_none() {
            return Err(sim_error("sim alloc async", "the stream is not capturing"));
        }
        let bytes = (len as u64).saturating_mul(4);
        // Marked like an arena: no raw span may reach it.
        let base = s
            .alloc(bytes, 256, true)
            .map_err(|reason| sim_error("sim alloc async", reason))?;
        s.graph_bytes += bytes;
        if let Some(capture) = s.streams[id].capturing.as_mut() {
            capture.temps.push(base);
            capture.ops.push((Op::AllocNode { addr: base, bytes }, 0));
        }
        Ok(Span {
            addr: base,
            len,
            view: Some(ViewTag {
                scope,
                request: Request::new(Domain::Device, DType::F32, len as u64),
                runner,
                read_only: false,
                handoff: None,
            }),
        })
    }

    /// Frees memory while `stream` captures, as `cuMemFreeAsync` does: the
    /// graph gets a free node.
    ///
    /// # Errors
    ///
    /// [`BackendError::Refused`] when `stream` is not capturing or belongs to
    /// another backend.
    pub fn free_async(&self, stream: &Stream, span: &Span) -> Result<()> {
        let id = self.own(stream, "sim free async")?;
        let mut s = self.state();
        match s.streams[id].capturing.as_mut() {
            Some(capture) => {
                capture.ops.push((Op::FreeNode { addr: span.addr }, 0));
                Ok(())
            }
            None => Err(sim_error("sim free async", "the stream is not capturing")),
        }
    }

    /// Waits for everything, then reads `f32`s.
    ///
    /// # Errors
    ///
    /// [`BackendError::Refused`] for a span outside every live allocation.
    pub fn read_f32(&self, span: &impl AsSpan) -> Result<Vec<f32>> {
        let span = span.span();
        let mut s = self.state();
        s.synchronize();
        s.read(&span).ok_or_else(|| {
            sim_error(
                "sim read",
                format!(
                    "{} f32 at {:#x} lie outside every live allocation",
                    span.len, span.addr
                ),
            )
        })
    }

    /// Waits for everything, then writes `f32`s.
    ///
    /// # Errors
    ///
    /// [`BackendError::Refused`] for a span outside every live allocation.
    pub fn write_f32(&self, span: &impl AsSpan, values: &[f32]) -> Result<()> {
        let span = span.span();
        let mut s = self.state();
        s.synchronize();
        s.write(&span, values).ok_or_else(|| {
            sim_error(
                "sim write",
                format!(
                    "{} f32 at {:#x} lie outside every live allocation",
                    span.len, span.addr
                ),
            )
        })
    }

    /// Every hazard seen so far.
    pub fn hazards(&self) -> Vec<Hazard> {
        self.state().hazards.clone()
    }

    /// The simulated time at which `stream`'s last op ends (0 for a stream
    /// of another backend).
    pub fn stream_time(&self, stream: &Stream) -> u64 {
        self.own(stream, "sim stream time")
            .map_or(0, |id| self.state().streams[id].tail)
    }

    /// The simulated time at which the last op of any stream ends.
    pub fn makespan(&self) -> u64 {
        self.state()
            .streams
            .iter()
            .map(|s| s.tail)
            .max()
            .unwrap_or(0)
    }

    /// Live allocations (arenas and buffers).
    pub fn live_allocations(&self) -> usize {
        self.state().allocs.len()
    }

    /// Live events (created and not dropped).
    pub fn live_events(&self) -> usize {
        self.state().events.live()
    }

    /// (allocations made, allocations freed) so far.
    pub fn allocation_counts(&self) -> (u64, u64) {
        let s = self.state();
        (s.allocations, s.frees)
    }

    /// Fault injection: the next `n` allocations succeed, every later one
    /// fails. `None` turns injection off.
    pub fn fail_allocations_after(&self, n: Option<usize>) {
        self.state().allocations_left = n;
    }

    /// Fault injection: while `fail` is set, the host waits of the
    /// `Backend` trait (`synchronize`, `synchronize_event`) fail as they
    /// would after a sticky device error, and wait for nothing.
    pub fn fail_waits(&self, fail: bool) {
        self.state().waits_fail = fail;
    }

    /// Sizes of the model's internal bookkeeping, for tests that bound it:
    /// (shadow intervals of the hazard detector, ops submitted and not yet
    /// applied, event slots including free ones).
    #[doc(hidden)]
    pub fn bookkeeping(&self) -> (usize, usize, usize) {
        let s = self.state();
        (s.shadow.cells.len(), s.pending.len(), s.events.slots.len())
    }
}

impl Backend for Device {
    type Arena = Memory;
    type Event = Event;
    type Stream = Stream;
    type Graph = Graph;

    fn name(&self) -> &'static str {
        "sim"
    }

    fn allocate_arena(&self, desc: &ArenaDesc) -> Result<Memory> {
        let base = self
            .state()
            .alloc(desc.bytes, desc.alignment, true)
            .map_err(|reason| BackendError::Allocation {
                key: desc.key,
                bytes: desc.bytes,
                reason,
            })?;
        Ok(Memory {
            state: self.state.clone(),
            base,
            bytes: desc.bytes,
        })
    }

    fn create_event(&self) -> Result<Event> {
        let id = self.state().events.insert(EventState::default());
        Ok(Event {
            state: self.state.clone(),
            id,
        })
    }

    /// The stream's own backend's serial and its index: a stream of
    /// another backend never shares an id with one of this backend.
    fn stream_id(&self, stream: &Stream) -> u64 {
        (stream.serial << 32) | stream.id as u64
    }

    fn wait_event(&self, stream: &Stream, event: &Event) -> Result<()> {
        let sid = self.own(stream, "sim wait")?;
        let eid = self.own_event(event, "sim wait")?;
        let mut s = self.state();
        let e = s
            .events
            .get_mut(eid)
            .cloned()
            .ok_or_else(|| sim_error("sim wait", FOREIGN_EVENT))?;
        let st = &mut s.streams[sid];
        if st.capturing.is_some() {
            return Err(sim_error(
                "sim wait",
                "the sim does not capture event waits",
            ));
        }
        st.tail = st.tail.max(e.time);
        merge(&mut st.clock, &e.clock);
        Ok(())
    }

    fn record_event_node(&self, stream: &Stream, event: &Event) -> Result<()> {
        let sid = self.own(stream, "sim record node")?;
        let eid = self.own_event(event, "sim record node")?;
        let mut s = self.state();
        match s.streams[sid].capturing.as_mut() {
            Some(capture) => {
                capture.records.push((capture.ops.len(), eid));
                Ok(())
            }
            None => Err(sim_error(
                "sim record node",
                "an event record node is made inside a capture; the stream is not capturing",
            )),
        }
    }

    fn record_event(&self, stream: &Stream, event: &Event) -> Result<()> {
        let sid = self.own(stream, "sim record")?;
        let eid = self.own_event(event, "sim record")?;
        let mut s = self.state();
        let st = &s.streams[sid];
        if st.capturing.is_some() {
            return Err(sim_error(
                "sim record",
                "the sim does not capture event records",
            ));
        }
        let recorded = EventState {
            time: st.tail,
            clock: st.clock.clone(),
        };
        *s.events
            .get_mut(eid)
            .ok_or_else(|| sim_error("sim record", FOREIGN_EVENT))? = recorded;
        Ok(())
    }

    /// A full synchronize (deterministic, and never less than the event
    /// needs).
    fn synchronize_event(&self, event: &Event) -> Result<()> {
        self.own_event(event, "sim event synchronize")?;
        let mut s = self.state();
        if s.waits_fail {
            return Err(sim_error("sim event synchronize", "waits fail (injected)"));
        }
        s.synchronize();
        Ok(())
    }

    /// All or nothing, as `cuGraphLaunch`: every op is checked before the
    /// first is submitted.
    unsafe fn launch(&self, graph: &Graph, stream: &Stream) -> Result<()> {
        let id = self.own(stream, "sim graph launch")?;
        let mut s = self.state();
        if s.streams[id].capturing.is_some() {
            return Err(sim_error("sim graph launch", "the stream is capturing"));
        }
        s.launch_graph(id, graph)
    }

    fn begin_capture(&self, stream: &Stream) -> Result<()> {
        let id = self.own(stream, "sim begin capture")?;
        let mut s = self.state();
        let st = &mut s.streams[id];
        if st.capturing.is_some() {
            return Err(sim_error(
                "sim begin capture",
                "the stream is already capturing",
            ));
        }
        st.capturing = Some(Capture::default());
        Ok(())
    }

    fn is_capturing(&self, stream: &Stream) -> Result<bool> {
        let id = self.own(stream, "sim capture status")?;
        Ok(self.state().streams[id].capturing.is_some())
    }

    unsafe fn end_capture(&self, stream: &Stream) -> Result<Graph> {
        let id = self.own(stream, "sim end capture")?;
        let capture = self.state().streams[id]
            .capturing
            .take()
            .ok_or_else(|| sim_error("sim end capture", "the stream is not capturing"))?;
        let memory = (!capture.temps.is_empty())
            .then(|| {
                Arc::new(GraphMemory {
                    state: self.state.clone(),
                    bases: capture.temps,
                })
            })
            .into_iter()
            .collect();
        Ok(Graph {
            ops: capture.ops,
            records: capture.records,
            memory,
            step: None,
            last: Arc::default(),
        })
    }

    unsafe fn abort_capture(&self, stream: &Stream) {
        if let Ok(id) = self.own(stream, "sim abort capture") {
            let mut s = self.state();
            if let Some(capture) = s.streams[id].capturing.take() {
                for base in capture.temps {
                    s.free_graph_memory(base);
                }
            }
        }
    }

    /// The bytes of every live graph's allocation nodes (the sim reserves
    /// exactly what it uses).
    fn graph_memory_in_use(&self) -> Result<Option<crate::backend::GraphMemory>> {
        let bytes = self.state().graph_bytes;
        Ok(Some(crate::backend::GraphMemory::new(bytes, bytes)))
    }

    fn split_graph(&self, graph: &Graph, events: &[&Event]) -> Result<(Graph, Graph, usize)> {
        let ids = events
            .iter()
            .map(|e| self.own_event(e, "sim split graph"))
            .collect::<Result<Vec<_>>>()?;
        let Some((at, which)) = graph
            .records
            .iter()
            .find_map(|&(at, e)| Some((at, ids.iter().position(|&i| i == e)?)))
        else {
            return Err(sim_error(
                "sim split graph",
                "the graph records none of the events",
            ));
        };
        let split_at = ids[which];
        let part = |range: std::ops::Range<usize>, last: bool| Graph {
            ops: graph.ops[range.clone()].to_vec(),
            // The split record goes; the others stay where they were (a
            // record at the very end belongs to the second part).
            records: graph
                .records
                .iter()
                .filter(|&&(p, e)| {
                    e != split_at && (range.contains(&p) || (last && p == range.end))
                })
                .map(|&(p, e)| (p - range.start, e))
                .collect(),
            memory: graph.memory.clone(),
            step: None,
            last: Arc::default(),
        };
        Ok((part(0..at, false), part(at..graph.ops.len(), true), which))
    }

    fn compose(&self, nodes: &[StepNode<'_, Device>]) -> Result<Graph> {
        if nodes.iter().any(|n| n.graph.step.is_some()) {
            return Err(sim_error(
                "sim compose",
                "a composed graph cannot be a node",
            ));
        }
        // As CUDA: a graph with memory nodes cannot be cloned into a child
        // graph node.
        let memory_nodes = |g: &Graph| {
            g.ops
                .iter()
                .any(|(op, _)| matches!(op, Op::AllocNode { .. } | Op::FreeNode { .. }))
        };
        if nodes.iter().any(|n| memory_nodes(n.graph)) {
            return Err(sim_error(
                "sim compose",
                "a graph with memory nodes cannot be a child graph (CUDA refuses to clone it)",
            ));
        }
        if let Some((i, _)) = nodes
            .iter()
            .enumerate()
            .find(|(i, n)| n.deps.iter().any(|d| d >= i))
        {
            return Err(sim_error(
                "sim compose",
                format!("node {i} depends on a node that is not before it"),
            ));
        }
        let lanes = nodes.iter().map(|n| n.lane + 1).max().unwrap_or(0);
        let lanes = (0..lanes).map(|_| self.stream().id).collect();
        Ok(Graph {
            ops: Vec::new(),
            records: Vec::new(),
            last: Arc::default(),
            memory: nodes
                .iter()
                .flat_map(|n| n.graph.memory.iter().cloned())
                .collect(),
            step: Some(Arc::new(SimStep {
                nodes: nodes
                    .iter()
                    .map(|n| SimStepNode {
                        ops: n.graph.ops.clone(),
                        records: n.graph.records.clone(),
                        deps: n.deps.clone(),
                        lane: n.lane,
                    })
                    .collect(),
                lanes,
            })),
        })
    }

    fn validate_graph(&self, graph: &Graph) -> std::result::Result<(), String> {
        let mut allocs = Vec::new();
        let mut frees = Vec::new();
        for (op, _) in &graph.ops {
            match *op {
                Op::AllocNode { addr, bytes } => allocs.push((addr, bytes)),
                Op::FreeNode { addr } => frees.push(addr),
                _ => {}
            }
        }
        check_memory_nodes(&allocs, &frees)
    }

    fn synchronize(&self) -> Result<()> {
        let mut s = self.state();
        if s.waits_fail {
            return Err(sim_error("sim synchronize", "waits fail (injected)"));
        }
        s.synchronize();
        Ok(())
    }
}
