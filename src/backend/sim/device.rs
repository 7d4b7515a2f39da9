//! The simulated device's handle ([`Device`]) and its own API: streams,
//! buffers, ops, host reads and writes, and what the model observed.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use super::arena::HostBuffer;
use super::faults::{Call, FaultLog, Faults};
use super::hazards::Hazard;
use super::ops::{AsSpan, Kernel, Node, Span};
use super::streams::{Event, Stream, StreamState};
use super::{lock, sim_error, Result, SimState, FOREIGN_EVENT, FOREIGN_STREAM};
use crate::backend::Streams;
use crate::scope::capture_on;
use crate::view::ViewTag;
use crate::vocab::{DType, Domain, Request};

/// The `sim` backend. A cheap handle: clones share one simulated device.
#[derive(Clone)]
pub struct Device {
    pub(super) state: Arc<Mutex<SimState>>,
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

    pub(super) fn state(&self) -> MutexGuard<'_, SimState> {
        lock(&self.state)
    }

    /// Counts a call of `call` made where the caller was called from, and
    /// fails it when the installed [`Faults`] say so.
    #[track_caller]
    pub(super) fn fault(&self, call: Call) -> Result<()> {
        let at = std::panic::Location::caller();
        self.state().faults.check(call, at)
    }

    /// Installs `faults` (replacing those before) and starts a new
    /// [`FaultLog`]. Clones of this device share them.
    pub fn inject(&self, faults: Faults) {
        self.state().faults.install(faults);
    }

    /// What fault injection saw since [`Device::inject`] (every call is
    /// counted, also with no faults installed).
    pub fn fault_log(&self) -> FaultLog {
        self.state().faults.log()
    }

    /// The index of `stream` if this backend created it.
    pub(super) fn own(&self, stream: &Stream, op: &'static str) -> Result<usize> {
        if std::ptr::eq(stream.owner.as_ptr(), Arc::as_ptr(&self.state)) {
            Ok(stream.id)
        } else {
            Err(sim_error(op, FOREIGN_STREAM))
        }
    }

    /// The id of `event` if this backend created it.
    pub(super) fn own_event(&self, event: &Event, op: &'static str) -> Result<usize> {
        if Arc::ptr_eq(&event.state, &self.state) {
            Ok(event.id)
        } else {
            Err(sim_error(op, FOREIGN_EVENT))
        }
    }

    /// A new stream (every stream can be captured).
    pub fn new_stream(&self) -> Stream {
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
    #[track_caller]
    pub fn alloc_f32(&self, len: usize) -> Result<HostBuffer> {
        self.fault(Call::Alloc)?;
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
    /// [`BackendError::InvalidView`](crate::BackendError::InvalidView) for a
    /// view used outside the closure of the capture or consumer that handed
    /// it out, or on another stream than that closure's, or written where
    /// it may only be read (its [`Misuse`](crate::Misuse) says which);
    /// [`BackendError::Refused`](crate::BackendError::Refused) for a stream
    /// of another `Device`, for a raw span into a plan's arena, and, when
    /// not capturing, for a span outside every live allocation (or too long
    /// to address).
    #[track_caller]
    pub fn launch(&self, stream: &Stream, op: Kernel, duration: u64) -> Result<()> {
        self.fault(Call::Kernel)?;
        let id = self.own(stream, "sim launch")?;
        let mut s = self.state();
        s.check_scope(self.stream_id(stream), &op)?;
        if let Some(capture) = s.streams[id].capturing.as_ref() {
            // A temporary lives inside the graph whose capture allocated it
            // (CUDA maps it only while that graph runs): another capture
            // of the same closure (a step copy) may not use it; nor may the
            // graph once it freed it (CUDA may give its memory to a later
            // allocation of the graph).
            for (span, _) in op.accesses() {
                let Some(base) = s.temporary_of(&span) else {
                    continue;
                };
                let why = if capture.freed.contains(&base) {
                    "a temporary this graph freed (free_async) before: CUDA may give its \
                     memory to a later allocation of the graph"
                } else if !capture.temps.contains(&base) && !capture.inherited.contains(&base) {
                    "a temporary of another graph: a temporary works only inside the capture \
                     that allocated it"
                } else {
                    continue;
                };
                return Err(sim_error(
                    "sim launch",
                    format!("{} f32 at {:#x} are {why}", span.len, span.addr),
                ));
            }
        }
        if let Some(capture) = s.streams[id].capturing.as_mut() {
            capture.ops.push((Node::Kernel(op), duration));
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
    #[track_caller]
    pub unsafe fn launch_unscoped(&self, stream: &Stream, op: Kernel, duration: u64) -> Result<()> {
        self.fault(Call::Kernel)?;
        let id = self.own(stream, "sim launch")?;
        let mut s = self.state();
        if let Some(capture) = s.streams[id].capturing.as_mut() {
            capture.ops.push((Node::Kernel(op), duration));
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
    /// [`BackendError::Refused`](crate::BackendError::Refused) when `stream` is not capturing (use
    /// [`Device::alloc_f32`]) or belongs to another backend; the
    /// allocation's own failure.
    #[track_caller]
    pub fn alloc_async(&self, stream: &Stream, len: usize) -> Result<Span> {
        self.fault(Call::GraphAlloc)?;
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
        s.mark_temporary(base);
        s.graph_bytes += bytes;
        s.graph_reserved = s.graph_reserved.max(s.graph_bytes);
        if let Some(capture) = s.streams[id].capturing.as_mut() {
            capture.temps.push(base);
            capture.ops.push((Node::Alloc { addr: base, bytes }, 0));
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
    /// [`BackendError::Refused`](crate::BackendError::Refused) when `stream` is not capturing or belongs to
    /// another backend.
    #[track_caller]
    pub fn free_async(&self, stream: &Stream, span: &Span) -> Result<()> {
        self.fault(Call::GraphFree)?;
        let id = self.own(stream, "sim free async")?;
        let mut s = self.state();
        let base = s.temporary_of(span).unwrap_or(span.addr);
        match s.streams[id].capturing.as_mut() {
            Some(capture) => {
                capture.ops.push((Node::Free { addr: span.addr }, 0));
                capture.freed.push(base);
                Ok(())
            }
            None => Err(sim_error("sim free async", "the stream is not capturing")),
        }
    }

    /// Waits for everything, then reads `f32`s.
    ///
    /// # Errors
    ///
    /// [`BackendError::Refused`](crate::BackendError::Refused) for a span outside every live allocation.
    #[track_caller]
    pub fn read_f32(&self, span: &impl AsSpan) -> Result<Vec<f32>> {
        self.fault(Call::Copy)?;
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
    /// [`BackendError::Refused`](crate::BackendError::Refused) for a span outside every live allocation.
    #[track_caller]
    pub fn write_f32(&self, span: &impl AsSpan, values: &[f32]) -> Result<()> {
        self.fault(Call::Copy)?;
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
