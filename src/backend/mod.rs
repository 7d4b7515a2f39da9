//! Backends: what a plan needs from a device runtime.
//!
//! - [`sim`]: always built; host arenas, simulated streams and events on a
//!   deterministic clock, with a hazard detector. The reference model.
//! - `cuda` (feature `cuda`): the CUDA driver through cudarc.
//! - `nccl` (feature `nccl`): symmetric domains on NCCL-registered windows.

use crate::error::Result;
use crate::plan::ArenaPlan;

pub mod sim;

#[cfg(feature = "cuda")]
pub mod cuda;

#[cfg(feature = "nccl")]
pub mod nccl;

/// One allocated arena. Dropping it frees the memory.
pub trait Arena {
    /// Device (or host, for `sim`) address of the first byte.
    fn base(&self) -> u64;
    /// Size in bytes.
    fn bytes(&self) -> u64;
}

/// What the lifecycle needs from a device runtime.
///
/// Every call takes `&self`: backends are thin handles over a runtime. The
/// lifecycle guarantees the order: arenas and events are created before any
/// capture; graphs are dropped before events and arenas; [`Backend::synchronize`]
/// runs before anything is freed.
pub trait Backend {
    /// An allocated arena.
    type Arena: Arena;
    /// A completion event.
    type Event;
    /// A stream work is submitted to; clones are handles of one stream.
    type Stream: Clone;
    /// A captured, launchable graph.
    type Graph;

    /// Short name for reports ("sim", "cuda").
    fn name(&self) -> &'static str;

    /// Allocates one arena, outside every graph memory pool, aligned to at
    /// least the domain's alignment.
    fn allocate_arena(&self, plan: &ArenaPlan) -> Result<Self::Arena>;

    /// Creates a completion event, already recorded once, so that a first
    /// wait on it is valid.
    fn create_event(&self) -> Result<Self::Event>;

    /// A number identifying the stream, equal for handles of one stream.
    fn stream_id(&self, stream: &Self::Stream) -> u64;

    /// Makes `stream` wait for the event's latest record.
    fn wait_event(&self, stream: &Self::Stream, event: &Self::Event) -> Result<()>;

    /// Records the event at the current tail of `stream`.
    fn record_event(&self, stream: &Self::Stream, event: &Self::Event) -> Result<()>;

    /// Launches a graph on `stream`.
    fn launch(&self, graph: &Self::Graph, stream: &Self::Stream) -> Result<()>;

    /// Starts capturing the work submitted to `stream`.
    fn begin_capture(&self, stream: &Self::Stream) -> Result<()>;

    /// Ends the capture and returns the graph.
    fn end_capture(&self, stream: &Self::Stream) -> Result<Self::Graph>;

    /// Ends a capture and discards what was captured (best effort, after a
    /// failure).
    fn abort_capture(&self, stream: &Self::Stream);

    /// Checks that a captured graph may be owned by a plan: `Err(reason)` if
    /// it allocates or frees memory (graph memory nodes make later launches
    /// invalid once the arenas' neighbours move).
    fn validate_graph(&self, graph: &Self::Graph) -> std::result::Result<(), String>;

    /// Waits for all work submitted through this backend.
    fn synchronize(&self) -> Result<()>;
}
