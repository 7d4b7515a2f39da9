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
//!   [`SimBackend::synchronize`]) wrote, or writes bytes such an op read,
//!   whatever the timing.
//!
//! Kernels are [`SimOp`]s on `f32` data: fill, copy, add, scale.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::backend::{Arena, ArenaDesc, Backend, BackendError};
use crate::view::View;

type Result<T> = std::result::Result<T, BackendError>;

/// A range of `f32` elements in simulated memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// Address of the first element.
    pub addr: u64,
    /// Number of `f32` elements.
    pub len: usize,
}

impl Span {
    fn end(&self) -> u64 {
        self.addr + 4 * self.len as u64
    }

    fn overlaps(&self, other: &Span) -> bool {
        self.addr < other.end() && other.addr < self.end()
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

impl AsSpan for View<'_> {
    /// The view's bytes read as `f32` elements.
    fn span(&self) -> Span {
        Span {
            addr: self.device_ptr(),
            len: (self.bytes() / 4) as usize,
        }
    }
}

impl AsSpan for SimBuffer {
    fn span(&self) -> Span {
        Span {
            addr: self.base,
            len: self.len,
        }
    }
}

/// One simulated kernel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SimOp {
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
    /// capture creates in CUDA. Graphs containing one are rejected.
    AllocNode {
        /// Bytes the node would allocate.
        bytes: u64,
    },
}

impl SimOp {
    /// `dst[i] = value`.
    pub fn fill(dst: &impl AsSpan, value: f32) -> SimOp {
        SimOp::Fill {
            dst: dst.span(),
            value,
        }
    }

    /// `dst[i] = src[i]` (over the shorter of the two).
    pub fn copy(src: &impl AsSpan, dst: &impl AsSpan) -> SimOp {
        SimOp::Copy {
            src: src.span(),
            dst: dst.span(),
        }
    }

    /// `dst[i] += src[i]` (over the shorter of the two).
    pub fn add(src: &impl AsSpan, dst: &impl AsSpan) -> SimOp {
        SimOp::Add {
            src: src.span(),
            dst: dst.span(),
        }
    }

    /// `dst[i] *= factor`.
    pub fn scale(dst: &impl AsSpan, factor: f32) -> SimOp {
        SimOp::Scale {
            dst: dst.span(),
            factor,
        }
    }

    /// (span, written?) for every span the op touches.
    fn accesses(&self) -> Vec<(Span, bool)> {
        match *self {
            SimOp::Fill { dst, .. } | SimOp::Scale { dst, .. } => vec![(dst, true)],
            SimOp::Copy { src, dst } => vec![(src, false), (dst, true)],
            SimOp::Add { src, dst } => vec![(src, false), (dst, true)],
            SimOp::AllocNode { .. } => Vec::new(),
        }
    }
}

/// Two unordered accesses to the same bytes, at least one a write.
#[derive(Clone, Debug, PartialEq, Eq)]
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

/// A simulated stream. Cheap to clone; clones are the same stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimStream {
    id: usize,
}

impl SimStream {
    /// Index of the stream in its backend.
    pub fn index(&self) -> usize {
        self.id
    }
}

/// A simulated completion event.
#[derive(Debug)]
pub struct SimEvent {
    id: usize,
}

/// A captured op list.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SimGraph {
    ops: Vec<(SimOp, u64)>,
}

impl SimGraph {
    /// The captured ops with their durations.
    pub fn ops(&self) -> &[(SimOp, u64)] {
        &self.ops
    }
}

/// A simulated arena; dropping it frees its host memory.
#[derive(Debug)]
pub struct SimArena {
    state: Arc<Mutex<SimState>>,
    base: u64,
    bytes: u64,
}

impl Arena for SimArena {
    fn base(&self) -> u64 {
        self.base
    }

    fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for SimArena {
    fn drop(&mut self) {
        lock(&self.state).free(self.base);
    }
}

/// A host buffer of `f32`s outside the plan (consumer outputs, say).
#[derive(Debug)]
pub struct SimBuffer {
    state: Arc<Mutex<SimState>>,
    base: u64,
    len: usize,
}

impl Drop for SimBuffer {
    fn drop(&mut self) {
        lock(&self.state).free(self.base);
    }
}

struct Allocation {
    data: Vec<u8>,
    pad: usize,
    bytes: u64,
}

struct StreamState {
    tail: u64,
    clock: Vec<u64>,
    capturing: Option<Vec<(SimOp, u64)>>,
}

#[derive(Clone, Default)]
struct EventState {
    time: u64,
    clock: Vec<u64>,
}

struct Access {
    span: Span,
    write: bool,
    stream: usize,
    seq: u64,
}

#[derive(Default)]
struct SimState {
    allocs: BTreeMap<u64, Allocation>,
    streams: Vec<StreamState>,
    events: Vec<EventState>,
    /// Ops submitted but not yet applied: (end time, submission order, op).
    pending: Vec<(u64, u64, SimOp)>,
    accesses: Vec<Access>,
    hazards: Vec<Hazard>,
    submitted: u64,
    allocations_left: Option<usize>,
    allocations: u64,
    frees: u64,
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

impl SimState {
    fn alloc(&mut self, bytes: u64, align: u64) -> std::result::Result<u64, String> {
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
        self.allocs.insert(base, Allocation { data, pad, bytes });
        self.allocations += 1;
        Ok(base)
    }

    fn free(&mut self, base: u64) {
        if self.allocs.remove(&base).is_some() {
            self.frees += 1;
        }
    }

    /// The allocation holding the whole span, as (base, allocation).
    fn find(&self, span: &Span) -> Option<(u64, &Allocation)> {
        let (&base, a) = self.allocs.range(..=span.addr).next_back()?;
        (span.end() <= base + a.bytes).then_some((base, a))
    }

    fn read(&self, span: &Span) -> Option<Vec<f32>> {
        let (base, a) = self.find(span)?;
        let start = a.pad + (span.addr - base) as usize;
        Some(
            a.data[start..start + 4 * span.len]
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        )
    }

    fn write(&mut self, span: &Span, values: &[f32]) -> Option<()> {
        let (base, _) = self.find(span)?;
        let a = self.allocs.get_mut(&base)?;
        let start = a.pad + (span.addr - base) as usize;
        for (i, v) in values.iter().take(span.len).enumerate() {
            a.data[start + 4 * i..start + 4 * i + 4].copy_from_slice(&v.to_le_bytes());
        }
        Some(())
    }

    fn stream(&mut self, stream: &SimStream) -> Result<&mut StreamState> {
        self.streams
            .get_mut(stream.id)
            .ok_or_else(|| sim_error("sim stream", "stream belongs to another SimBackend"))
    }

    /// Submits one op to a stream that is not capturing.
    fn submit(&mut self, s: usize, op: SimOp, duration: u64) -> Result<()> {
        let accesses = op.accesses();
        for (span, _) in &accesses {
            if self.find(span).is_none() {
                return Err(sim_error(
                    "sim launch",
                    format!(
                        "{} f32 at {:#x} lie outside every live allocation",
                        span.len, span.addr
                    ),
                ));
            }
        }
        let stream = &mut self.streams[s];
        let end = stream.tail + duration;
        stream.tail = end;
        if stream.clock.len() <= s {
            stream.clock.resize(s + 1, 0);
        }
        stream.clock[s] += 1;
        let seq = stream.clock[s];
        let clock = stream.clock.clone();
        for (span, write) in accesses {
            for a in &self.accesses {
                let ordered = clock_at(&clock, a.stream) >= a.seq;
                if !ordered && (a.write || write) && a.span.overlaps(&span) {
                    self.hazards.push(Hazard {
                        first_stream: a.stream,
                        first_writes: a.write,
                        second_stream: s,
                        second_writes: write,
                        addr: a.span.addr.max(span.addr),
                    });
                }
            }
            self.accesses.push(Access {
                span,
                write,
                stream: s,
                seq,
            });
        }
        self.pending.push((end, self.submitted, op));
        self.submitted += 1;
        if self.accesses.len() > 4096 {
            self.prune();
        }
        Ok(())
    }

    /// Forgets accesses every stream is already ordered after.
    fn prune(&mut self) {
        let streams = &self.streams;
        self.accesses
            .retain(|a| streams.iter().any(|t| clock_at(&t.clock, a.stream) < a.seq));
    }

    fn apply(&mut self, op: SimOp) {
        match op {
            SimOp::Fill { dst, value } => self.binary(dst, dst, |_, _| value),
            SimOp::Copy { src, dst } => self.binary(src, dst, |_, s| s),
            SimOp::Add { src, dst } => self.binary(src, dst, |d, s| d + s),
            SimOp::Scale { dst, factor } => self.binary(dst, dst, |d, _| d * factor),
            SimOp::AllocNode { .. } => {}
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

    fn synchronize(&mut self) {
        let mut pending = std::mem::take(&mut self.pending);
        pending.sort_by_key(|&(end, order, _)| (end, order));
        for (_, _, op) in pending {
            self.apply(op);
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
        self.accesses.clear();
    }
}

/// The `sim` backend. A cheap handle: clones share one simulated device.
#[derive(Clone, Default)]
pub struct SimBackend {
    state: Arc<Mutex<SimState>>,
}

impl fmt::Debug for SimState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimState")
            .field("streams", &self.streams.len())
            .field("live_allocations", &self.allocs.len())
            .field("hazards", &self.hazards.len())
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for SimBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("SimBackend").field(&*self.state()).finish()
    }
}

impl SimBackend {
    /// A fresh simulated device with no streams.
    pub fn new() -> SimBackend {
        SimBackend::default()
    }

    fn state(&self) -> MutexGuard<'_, SimState> {
        lock(&self.state)
    }

    /// A new stream (every stream can be captured).
    pub fn stream(&self) -> SimStream {
        let mut s = self.state();
        let id = s.streams.len();
        let tail = s.streams.iter().map(|t| t.tail).max().unwrap_or(0);
        s.streams.push(StreamState {
            tail,
            clock: vec![0; id + 1],
            capturing: None,
        });
        SimStream { id }
    }

    /// Allocates a zeroed host buffer of `len` `f32`s outside any plan.
    pub fn alloc_f32(&self, len: usize) -> Result<SimBuffer> {
        let bytes = (len as u64).saturating_mul(4);
        let base = self
            .state()
            .alloc(bytes, 256)
            .map_err(|reason| sim_error("sim alloc", reason))?;
        Ok(SimBuffer {
            state: self.state.clone(),
            base,
            len,
        })
    }

    /// Submits one op of `duration` ticks to `stream` (captured instead when
    /// the stream is capturing).
    pub fn launch(&self, stream: &SimStream, op: SimOp, duration: u64) -> Result<()> {
        let mut s = self.state();
        if let Some(capture) = s.stream(stream)?.capturing.as_mut() {
            capture.push((op, duration));
            return Ok(());
        }
        s.submit(stream.id, op, duration)
    }

    /// Waits for everything, then reads `f32`s.
    pub fn read_f32(&self, span: &impl AsSpan) -> Result<Vec<f32>> {
        let span = span.span();
        let mut s = self.state();
        s.synchronize();
        s.read(&span).ok_or_else(|| {
            sim_error(
                "sim read",
                format!("{:#x} lies outside every live allocation", span.addr),
            )
        })
    }

    /// Waits for everything, then writes `f32`s.
    pub fn write_f32(&self, span: &impl AsSpan, values: &[f32]) -> Result<()> {
        let span = span.span();
        let mut s = self.state();
        s.synchronize();
        s.write(&span, values).ok_or_else(|| {
            sim_error(
                "sim write",
                format!("{:#x} lies outside every live allocation", span.addr),
            )
        })
    }

    /// Every hazard seen so far.
    pub fn hazards(&self) -> Vec<Hazard> {
        self.state().hazards.clone()
    }

    /// The simulated time at which `stream`'s last op ends.
    pub fn stream_time(&self, stream: &SimStream) -> u64 {
        self.state().streams.get(stream.id).map_or(0, |s| s.tail)
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
}

impl Backend for SimBackend {
    type Arena = SimArena;
    type Event = SimEvent;
    type Stream = SimStream;
    type Graph = SimGraph;

    fn name(&self) -> &'static str {
        "sim"
    }

    fn allocate_arena(&self, desc: &ArenaDesc) -> Result<SimArena> {
        let base = self
            .state()
            .alloc(desc.bytes, desc.alignment)
            .map_err(|reason| BackendError::Allocation {
                key: desc.key,
                bytes: desc.bytes,
                reason,
            })?;
        Ok(SimArena {
            state: self.state.clone(),
            base,
            bytes: desc.bytes,
        })
    }

    fn create_event(&self) -> Result<SimEvent> {
        let mut s = self.state();
        let id = s.events.len();
        s.events.push(EventState::default());
        Ok(SimEvent { id })
    }

    fn stream_id(&self, stream: &SimStream) -> u64 {
        stream.id as u64
    }

    fn wait_event(&self, stream: &SimStream, event: &SimEvent) -> Result<()> {
        let mut s = self.state();
        let e = s
            .events
            .get(event.id)
            .cloned()
            .ok_or_else(|| sim_error("sim wait", "event belongs to another SimBackend"))?;
        let st = s.stream(stream)?;
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

    fn record_event(&self, stream: &SimStream, event: &SimEvent) -> Result<()> {
        let mut s = self.state();
        let st = s.stream(stream)?;
        if st.capturing.is_some() {
            return Err(sim_error(
                "sim record",
                "the sim does not capture event records",
            ));
        }
        let e = EventState {
            time: st.tail,
            clock: st.clock.clone(),
        };
        *s.events
            .get_mut(event.id)
            .ok_or_else(|| sim_error("sim record", "event belongs to another SimBackend"))? = e;
        Ok(())
    }

    fn synchronize_event(&self, event: &SimEvent) -> Result<()> {
        let mut s = self.state();
        if event.id >= s.events.len() {
            return Err(sim_error(
                "sim event synchronize",
                "event belongs to another SimBackend",
            ));
        }
        s.synchronize();
        Ok(())
    }

    fn launch(&self, graph: &SimGraph, stream: &SimStream) -> Result<()> {
        let mut s = self.state();
        if s.stream(stream)?.capturing.is_some() {
            return Err(sim_error("sim graph launch", "the stream is capturing"));
        }
        for &(op, duration) in &graph.ops {
            s.submit(stream.id, op, duration)?;
        }
        Ok(())
    }

    fn begin_capture(&self, stream: &SimStream) -> Result<()> {
        let mut s = self.state();
        let st = s.stream(stream)?;
        if st.capturing.is_some() {
            return Err(sim_error(
                "sim begin capture",
                "the stream is already capturing",
            ));
        }
        st.capturing = Some(Vec::new());
        Ok(())
    }

    fn end_capture(&self, stream: &SimStream) -> Result<SimGraph> {
        let mut s = self.state();
        let ops = s
            .stream(stream)?
            .capturing
            .take()
            .ok_or_else(|| sim_error("sim end capture", "the stream is not capturing"))?;
        Ok(SimGraph { ops })
    }

    fn abort_capture(&self, stream: &SimStream) {
        if let Ok(st) = self.state().stream(stream) {
            st.capturing = None;
        }
    }

    fn validate_graph(&self, graph: &SimGraph) -> std::result::Result<(), String> {
        let allocs = graph
            .ops
            .iter()
            .filter(|(op, _)| matches!(op, SimOp::AllocNode { .. }))
            .count();
        if allocs == 0 {
            Ok(())
        } else {
            Err(format!(
                "it contains {allocs} memory allocation node(s); allocate every buffer a graph uses before capture"
            ))
        }
    }

    fn synchronize(&self) -> Result<()> {
        self.state().synchronize();
        Ok(())
    }
}
