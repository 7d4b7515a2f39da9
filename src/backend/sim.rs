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
//!   [`Device::synchronize`](crate::backend::Streams::synchronize)) wrote, or writes
//!   bytes such an op read, whatever the timing;
//! - streams, events and memory belong to one `Device` (clones share
//!   it): another refuses them with [`BackendError::Refused`], as it refuses
//!   a span outside every live allocation or too long to address.
//!
//! Once a few hundred ops are pending, each op is applied as soon as no later
//! submission can end before it (every stream's tail is past its end), so
//! few ops stay pending on streams that keep moving;
//! [`Streams::synchronize_event`](crate::backend::Streams::synchronize_event) is a
//! full synchronize, which keeps the model deterministic. Events are freed
//! when dropped.
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
//! Kernels are [`Kernel`]s on `f32` data: fill, copy, add, scale. A graph's
//! memory nodes ([`Node`]) come only from [`Device::alloc_async`] and
//! [`Device::free_async`]: no call launches one.

mod ops;
mod clock;
mod faults;
mod hazards;
mod arena;
mod streams;
mod graph;
mod device;
mod backend;
mod timing;

use std::collections::{BTreeMap, BinaryHeap};
use std::fmt;
use std::sync::{Mutex, MutexGuard};

pub use arena::{Arena, HostBuffer};
pub use device::Device;
pub use faults::{Call, FaultLog, Faults};
pub use graph::Graph;
pub use hazards::Hazard;
pub use ops::{AsSpan, Kernel, Node, Span};
pub use streams::{Event, Stream};

use crate::backend::BackendError;
use arena::Allocation;
use hazards::Shadow;
use streams::{EventSlab, Pending, StreamState};

type Result<T> = std::result::Result<T, BackendError>;

/// The simulated device a [`Device`] and its clones share: memory, streams,
/// events, the ops pending on the clock and the hazard detector.
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
    /// Fault injection at every call ([`Faults`]).
    faults: faults::FaultState,
    /// Fault injection: host waits fail (a sticky device error, say).
    waits_fail: bool,
    allocations: u64,
    frees: u64,
    /// Bytes held by live graphs' allocation nodes.
    graph_bytes: u64,
    /// Bytes reserved for graph allocations: as a driver's pool, it grows
    /// with use and shrinks only when trimmed (`trim_graph_memory`).
    graph_reserved: u64,
    /// The time the host last waited for everything (a full synchronize):
    /// an event recorded no later has completed ([`Streams::event_done`](crate::backend::Streams::event_done)).
    host_time: u64,
}

fn lock(state: &Mutex<SimState>) -> MutexGuard<'_, SimState> {
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn sim_error(op: &'static str, reason: impl Into<String>) -> BackendError {
    BackendError::Refused {
        call: op,
        reason: reason.into(),
    }
}

const FOREIGN_STREAM: &str = "stream belongs to another sim::Device";

const FOREIGN_EVENT: &str = "event belongs to another sim::Device";

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
