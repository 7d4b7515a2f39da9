//! Fixed-address persistent buffers for CUDA graph capture and replay, with a
//! lifecycle the compiler enforces.
//!
//! A CUDA graph bakes device addresses in at capture. Work whose buffers
//! outlive the graph that produced them (the asynchronous reduce-scatter of
//! weight gradients, above all) needs storage whose address never changes and
//! which is not overwritten while an earlier replay that uses it is in flight.
//! This crate plans that storage from one eager run, hands out fixed-address
//! views during capture, and fences replays with events.
//!
//! # The lifecycle: five phases, five types
//!
//! [`Discovering`], [`Planned`], [`Capturing`], [`Replayable`] and
//! [`StepGraph`], the fifth running on a [`Replayable`] (below).
//!
//! Each phase is a type whose transition consumes it (a failed transition,
//! [`PlanFailed`], [`AllocateFailed`] or [`SealError`], hands it back); a
//! sealed plan then runs per runner or as step graphs.
//!
//! 1. [`Discovering`]: during an eager backward, each runner is armed in turn
//!    ([`Discovering::arm`]) and records its requests through the
//!    [`ArmedRunner`] guard.
//! 2. [`Planned`]: [`Discovering::plan`] spreads buffer-using runners over
//!    generations (or packed offsets), sizes the arenas and can describe
//!    itself ([`Planned::report`], [`Planned::fingerprint`]).
//! 3. [`Capturing`]: [`Planned::allocate`] allocates every arena before any
//!    capture; [`Capturing::capture`] opens one runner's capture, whose
//!    [`RunnerCapture::take`] hands out views in discovery order, whose
//!    [`RunnerCapture::stream_capture`] captures the runner's graph, and whose
//!    [`RunnerCapture::finish`] checks that it took exactly its capacity.
//! 4. [`Replayable`]: [`Capturing::seal`] succeeds once every buffer-using
//!    runner is captured; [`Replayable::replay`] waits for the last users of
//!    the bytes it overwrites (unless stream order implies it), then
//!    launches. [`Replayable::replan`] frees everything and starts discovery
//!    again.
//! 5. [`StepGraph`]: step graphs run on a [`Replayable`], not after it:
//!    [`Replayable::step`] takes one step's fixed schedule of replays and
//!    consumers ([`StepBuilder`]) and compiles it, the fence's waits
//!    included, into one graph launched with one call. A [`StepGraph`]
//!    borrows the plan, and dropping it hands the plan back;
//!    [`StepGraph::keep`] makes it a [`KeptStep`], which borrows nothing and
//!    is launched with [`Replayable::launch_kept`] between per-runner
//!    replays and other kept step graphs (one per shape bucket, say).
//!
//! Data one runner's graph passes to a later one (a layer's input gradient)
//! is a *handoff*: [`ArmedRunner::hand_off`] and [`ArmedRunner::receive`] at
//! discovery, [`RunnerCapture::hand_off`], [`RunnerCapture::receive`] and
//! [`RunnerCapture::ready`] in the capture; the fence orders both ways.
//!
//! ```
//! use replay_arena::{Discovering, PlanConfig, Policy, Request, Domain, DType, RunnerId};
//! use replay_arena::sim;
//!
//! let wgrad = Request::new(Domain::Device, DType::F32, 1024);
//! let mut discovery = Discovering::new(PlanConfig::new());
//! for r in 0..4 {
//!     let mut armed = discovery.arm(RunnerId(r))?;   // ArmedRunner<'_>
//!     armed.record(wgrad)?;
//! }                                                   // disarmed on drop
//! let planned = discovery.plan(Policy::Generations(2))?;
//! println!("{}", planned.report());
//!
//! let sim = sim::Device::new();                       // or the `cuda` backend
//! let stream = sim.new_stream();
//! let mut capturing = planned.allocate(sim.clone())?;
//! for r in 0..4 {
//!     let cap = capturing.capture(RunnerId(r))?;
//!     let view = cap.take(wgrad)?;                    // fixed address
//!     cap.stream_capture(&stream, |s| sim.launch(s, sim::Kernel::fill(&view, r as f32), 5))?;
//!     cap.finish()?;                                  // took exactly what was discovered
//! }
//! let mut replayable = capturing.seal()?;
//! for _step in 0..3 {
//!     for r in 0..4 {
//!         replayable.replay(RunnerId(r), &stream)?;   // fence, then launch
//!     }
//! }
//! assert!(sim.hazards().is_empty());
//! let discovery = replayable.replan()?;               // after a shape change
//! # drop(discovery);
//! # Ok::<(), replay_arena::Error>(())
//! ```
//!
//! What the types cannot rule out is a typed error naming the runner, the key
//! and the sizes involved. Each phase has its own ([`DiscoveryError`],
//! [`PlanError`], [`CaptureError`], [`BackendError`]); on a sealed plan each
//! operation has its own, listing only what it can return: [`ReplayError`]
//! (replay), [`ConsumeError`] (the consumers), [`WaitError`] (the waits),
//! [`TraceError`] (tracing), [`StepError`] (building a step graph) and
//! [`StepLaunchError`] (launching one), with [`BackendFailure`] or
//! [`UnknownRunner`] alone where nothing else can fail. They are built from
//! shared parts: a backend call that failed is one [`BackendFailure`]
//! everywhere (its [`Operation`], its runner, and the driver's own code), a
//! capturing stream one [`StreamCapturing`]. All are joined into [`Error`]
//! so `?` works across phases and operations; work closures keep their own
//! error type ([`StreamCaptureError`], [`ConsumeError`]).
//!
//! # Guides
//!
//! The guides of `docs/` are pages of [`guide`], their snippets doc tests:
//! [`guide::lifecycle`] (the phases, the fence, schedules, errors, and the
//! compile errors misuse gives), [`guide::trace`] (the fence's schedule as
//! a timeline: [`Replayable::start_trace`]), [`guide::concepts`],
//! [`guide::integration`], [`guide::safety`], [`guide::gpu`],
//! [`guide::architecture`], [`guide::benchmarks`] and the others.
//!
//! With the `serde` feature, `Workload` saves what discovery recorded as a
//! file and loads it back, so a plan can be studied away from the GPUs
//! (`docs/workload-format.md`), and reports and the vocabulary serialize
//! with the names files and tables use (`"bf16"`, `"device"`); the `cli`
//! feature adds the plan explorer, `replay-arena-plan`.
//!
//! # Backends
//!
//! - [`sim`] (always built): host arenas and a deterministic stream model with
//!   a hazard detector.
//! - `cuda` (feature `cuda`, default): the CUDA driver via cudarc. It adopts
//!   the program's context and streams and hands views to cudarc and cuBLAS
//!   as typed device pointers (`docs/integration.md`). The feature picks
//!   neither cudarc's linking mode nor its CUDA version; the default features
//!   add dynamic loading and CUDA 13.0, so the crate builds and its CPU tests
//!   run without CUDA.
//! - `nccl` (feature `nccl`): symmetric domains on NCCL-registered windows:
//!   the `cuda` backend with an allocator of its own.
//!
//! # Two doors: using the crate, implementing a backend
//!
//! The root holds what a program writes: the phases, the vocabulary, the
//! errors, step graphs, traces and the backends it picks (`sim`, `cuda`,
//! `nccl`, `cublas`). What a backend implements lives in [`backend`]: the
//! roles a device plays, each asked for by whoever uses it
//! ([`Streams`](backend::Streams) for the fence,
//! [`Allocate`](backend::Allocate) for arenas,
//! [`Capture`](backend::Capture) for stream capture,
//! [`Launch`](backend::Launch) for graph launches,
//! [`Compose`](backend::Compose) for step graphs,
//! [`Timing`](backend::Timing) for traces, with
//! [`Backend`](backend::Backend) their umbrella, the bound every phase
//! takes), the step nodes a composition receives, and the descriptions of
//! arenas and graph memory. A program generic over backends names
//! `B: backend::Backend`; one calling a role's method on a concrete backend
//! imports that role (`use replay_arena::backend::Capture;`).

#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]
// Errors are structured (runner, key, every size involved) and only built on
// failure; `Ok(())` stays a discriminant write on the replay path.
#![allow(clippy::result_large_err)]

// This crate cannot see cudarc's features, so the NCCL version comes through
// its own (build.rs sets `replay_arena_nccl` when one is on).
#[cfg(all(feature = "nccl", not(replay_arena_nccl)))]
compile_error!(
    "replay-arena: feature `nccl` needs an NCCL version for cudarc's bindings: also turn on \
     replay-arena's feature `nccl-version-from-cudarc` when your own cudarc dependency names one \
     (`nccl-02028` or newer, or `nccl`), else replay-arena's `nccl-02028`"
);

// Layers, lowest first: each module imports only modules listed before it
// (tests/suite/architecture/layering.rs checks it; docs/architecture.md draws it).
mod vocab;
mod failed;
mod view;
mod scope;
pub mod backend;
mod discover;
mod painter;
mod placement;
mod plan;
mod report;
mod failure;
mod capture;
mod trace;
mod fence;
mod replay;
mod buckets;
mod step;
mod error;
mod source;
#[cfg(feature = "serde")]
mod workload;
// The transaction rule as a property over the fence's internals (on `sim`).
#[cfg(test)]
mod transactions;

pub mod guide;

#[cfg(feature = "cublas")]
#[cfg_attr(docsrs, doc(cfg(feature = "cublas")))]
pub use backend::cublas;
#[cfg(feature = "cuda")]
#[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
pub use backend::cuda;
#[cfg(replay_arena_nccl)]
#[cfg_attr(docsrs, doc(cfg(feature = "nccl")))]
pub use backend::nccl;
pub use backend::sim;
pub use backend::{BackendError, Cut};
pub use buckets::{
    BucketCapture, BucketDiscovery, BucketError, BucketSealFailed, JoinError, Joined, Shortfall,
};
pub use capture::{
    AllocateFailed, CaptureError, CaptureFailure, Capturing, RunnerCapture, StreamCaptureError,
};
pub use discover::{ArmedRunner, Discovering, DiscoveryError, PlanConfig};
pub use error::{Error, Result, SourceError};
pub use failed::Failed;
pub use fence::{FenceStats, Operation};
pub use plan::{
    ArenaPlan, Extent, HandoffInfo, HandoffUse, PlacedPolicy, Placement, PlanError, PlanFailed,
    Planned, Policy,
};
pub use replay::{
    BackendFailure, ConsumeError, ReplayError, Replayable, SealError, StreamCapturing, TraceError,
    UnknownRunner, WaitError,
};
pub use report::{
    byte_ratio, human_bytes, BucketReport, GraphMemoryEstimate, GraphTemporaries, KeyReport,
    Optimum, PlanReport, RunnerReport, StepGraphMemory,
};
pub use source::{Buffer, BufferSource, Received, ViewSource};
pub use step::{KeptStep, ScheduleError, StepBuilder, StepError, StepGraph, StepLaunchError};
pub use trace::{Trace, Use, UseKind, Waited};
pub use view::{Access, Misuse, ReadOnly, ReadWrite, SliceError, View, ViewsExt, Writable};
pub use vocab::{
    BucketId, BucketState, DType, Domain, GroupId, HandoffId, HandoffTicket, Key, ParamId, Purpose,
    Request, RunnerId, DEVICE_ALIGNMENT, SYMMETRIC_ALIGNMENT,
};
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
pub use workload::{
    DomainSpec, GroupSpec, ParamRef, RequestSpec, RunnerSpec, Workload, WorkloadError,
};

use static_assertions::{assert_impl_all, assert_not_impl_any};

// Plain data phases move and share freely.
assert_impl_all!(Discovering: Send, Sync, Clone);
assert_impl_all!(Planned: Send, Sync, Clone);
assert_impl_all!(PlanReport: Send, Sync, Clone);
assert_impl_all!(Trace: Send, Sync, Clone);
// Resource-owning phases are never cloned (that would double-free); on `sim`
// they may move between threads.
assert_not_impl_any!(Capturing<sim::Device>: Clone);
assert_not_impl_any!(Replayable<sim::Device>: Clone);
assert_impl_all!(Capturing<sim::Device>: Send);
assert_impl_all!(Replayable<sim::Device>: Send);
// An open capture stays on the thread that opened it (CUDA stream capture is
// per thread).
assert_not_impl_any!(RunnerCapture<'static, sim::Device>: Send, Sync);
assert_impl_all!(View<'static>: Send, Sync, Copy);
// Every error goes into `anyhow::Error` and `Box<dyn Error + Send + Sync>`.
assert_impl_all!(Error: std::error::Error, Send, Sync);
assert_impl_all!(DiscoveryError: std::error::Error, Send, Sync);
assert_impl_all!(PlanError: std::error::Error, Send, Sync);
assert_impl_all!(CaptureError: std::error::Error, Send, Sync);
assert_impl_all!(ReplayError: std::error::Error, Send, Sync);
assert_impl_all!(WaitError: std::error::Error, Send, Sync);
assert_impl_all!(TraceError: std::error::Error, Send, Sync);
assert_impl_all!(StepError: std::error::Error, Send, Sync);
assert_impl_all!(StepLaunchError: std::error::Error, Send, Sync);
assert_impl_all!(BackendFailure: std::error::Error, Send, Sync);
assert_impl_all!(UnknownRunner: std::error::Error, Send, Sync);
assert_impl_all!(ConsumeError: std::error::Error, Send, Sync);
assert_impl_all!(BackendError: std::error::Error, Send, Sync);
assert_impl_all!(StreamCaptureError<Error>: std::error::Error, Send, Sync);
assert_impl_all!(ConsumeError<Error>: std::error::Error, Send, Sync);
assert_impl_all!(SealError<sim::Device>: std::error::Error, Send, Sync);
#[cfg(feature = "cuda")]
assert_impl_all!(SealError<cuda::Device>: std::error::Error, Send, Sync);
