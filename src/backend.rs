//! Implementing a backend: what the lifecycle needs from a device runtime.
//!
//! A program picks a backend (`replay_arena::sim`, `cuda`, `nccl`) and
//! rarely names anything here but [`Backend`] (a generic bound) and a role
//! trait whose method it calls. A backend's author implements the roles
//! below; the crate root holds the rest.
//!
//! - [`sim`]: always built; host arenas, simulated streams and events on a
//!   deterministic clock, with a hazard detector. The reference model.
//! - `cuda` (feature `cuda`): the CUDA driver through cudarc.
//! - `nccl` (feature `nccl`): symmetric domains on NCCL-registered windows.
//!
//! A backend knows nothing of plans: it allocates what an [`ArenaDesc`]
//! describes, and creates, waits on and records events.
//!
//! # Roles
//!
//! What a device does is split into the roles its users need, as
//! wgpu-hal splits a device into `Instance`, `Adapter`, `Device`, `Queue`:
//! each user asks for the roles it uses, and a stand-in implements only
//! the roles it plays.
//!
//! | role | methods | who needs it |
//! |---|---|---|
//! | [`Streams`] | events, stream identities, waits, records, host waits | the replay fence (and the step compiler's dry run, which implements it alone) |
//! | [`Allocate`] | [`allocate_arena`](Allocate::allocate_arena) | [`Planned::allocate`](crate::Planned::allocate) |
//! | [`Capture`]: [`Streams`] | begin, end and abort a stream capture; event record nodes; a captured graph's memory nodes checked and temporaries counted | [`RunnerCapture`](crate::RunnerCapture), step consumers |
//! | [`Launch`]: [`Capture`] | [`launch`](Launch::launch) (`unsafe`: the fence is the safe way in) | [`Replayable::replay`](crate::Replayable::replay), step graphs |
//! | [`Backend`]: [`Allocate`] + [`Capture`] + [`Launch`] | [`name`](Backend::name); the device's graph memory, [`graph_memory_in_use`](Backend::graph_memory_in_use) and [`trim_graph_memory`](Backend::trim_graph_memory) | every phase ([`Capturing`](crate::Capturing), [`Replayable`](crate::Replayable), ...) |
//! | [`Compose`]: [`Backend`] | [`split_graph`](Compose::split_graph), [`compose`](Compose::compose) | step graphs ([`Replayable::step`](crate::Replayable::step)) |
//! | [`Timing`]: [`Streams`] | timing marks on streams | traces ([`Replayable::start_trace`](crate::Replayable::start_trace)) |
//!
//! [`Backend`] is their umbrella: a device a plan runs on, with every role
//! the lifecycle needs ([`Allocate`] + [`Capture`] + [`Launch`]), a name
//! for reports, and what belongs to the whole device rather than to one
//! role (the memory it holds for graph allocations, reported and
//! trimmed); it is the bound the public API takes. A method of a role is
//! called through its role's trait (`use replay_arena::backend::Capture;` for
//! `begin_capture` on a concrete backend; a generic `B: Backend` reaches
//! them all).
//!
//! Step nodes ([`StepNode`], [`NodeGraph`], [`StepEnd`]) are generic over
//! the graph and event types, not the backend, so backends with the same
//! graphs and events share them.
//!
//! Who plays which role: `sim::Device` plays them all. `cuda::Device`
//! plays them all; its [`Streams`], [`Capture`], [`Launch`], [`Compose`]
//! and [`Timing`] are implemented once for every handle of a CUDA device
//! (`cuda::AsDevice`), so the `nccl` backend, a `cuda::Device` with
//! symmetric windows as its allocator, implements [`Allocate`] and the
//! umbrella [`Backend`] (its name, the device's graph memory) and takes
//! every other role from `cuda`.

use crate::view::Misuse;
use crate::vocab::{GroupId, Key};

mod timing;
pub mod sim;

pub use timing::Timing;

#[cfg(feature = "cuda")]
#[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
pub mod cuda;

#[cfg(replay_arena_nccl)]
#[cfg_attr(docsrs, doc(cfg(feature = "nccl")))]
pub mod nccl;

#[cfg(feature = "cublas")]
#[cfg_attr(docsrs, doc(cfg(feature = "cublas")))]
pub mod cublas;

/// What one arena must be: the backend's own descriptor (it never sees the
/// plan).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ArenaDesc {
    /// Its key: the domain picks where the memory comes from.
    pub key: Key,
    /// Size in bytes.
    pub bytes: u64,
    /// Required alignment of the base address (a power of two).
    pub alignment: u64,
}

/// The `op` of a [`BackendError::Driver`] made from a cudarc `DriverError`
/// (`?` on a cudarc driver call): cudarc's error keeps the code, not the call.
#[cfg(feature = "cuda")]
#[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
pub const CUDARC_DRIVER_CALL: &str = "a cudarc driver call";

/// The `op` of a [`BackendError::Nccl`] made from a cudarc `NcclError`.
#[cfg(replay_arena_nccl)]
#[cfg_attr(docsrs, doc(cfg(feature = "nccl")))]
pub const CUDARC_NCCL_CALL: &str = "a cudarc NCCL call";

#[cfg(feature = "cuda")]
#[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
impl From<cudarc::driver::DriverError> for BackendError {
    /// Keeps the raw `CUresult` (formatting a `DriverError` calls into the
    /// driver; this crate formats the code itself), with
    /// [`CUDARC_DRIVER_CALL`] as the operation.
    fn from(error: cudarc::driver::DriverError) -> BackendError {
        BackendError::Driver {
            call: CUDARC_DRIVER_CALL,
            code: error.0,
        }
    }
}

#[cfg(replay_arena_nccl)]
#[cfg_attr(docsrs, doc(cfg(feature = "nccl")))]
impl From<cudarc::nccl::result::NcclError> for BackendError {
    /// Keeps the raw `ncclResult_t`, with [`CUDARC_NCCL_CALL`] as the
    /// operation.
    fn from(error: cudarc::nccl::result::NcclError) -> BackendError {
        BackendError::Nccl {
            call: CUDARC_NCCL_CALL,
            code: error.0,
        }
    }
}

/// The `op` of a [`BackendError::Cublas`] made from a cudarc `CublasError`.
#[cfg(feature = "cublas")]
#[cfg_attr(docsrs, doc(cfg(feature = "cublas")))]
pub const CUDARC_CUBLAS_CALL: &str = "a cudarc cuBLAS call";

#[cfg(feature = "cublas")]
#[cfg_attr(docsrs, doc(cfg(feature = "cublas")))]
impl From<cudarc::cublas::result::CublasError> for BackendError {
    /// Keeps the raw `cublasStatus_t`, with [`CUDARC_CUBLAS_CALL`] as the
    /// operation.
    fn from(error: cudarc::cublas::result::CublasError) -> BackendError {
        BackendError::Cublas {
            call: CUDARC_CUBLAS_CALL,
            status: error.0,
        }
    }
}

/// A failed backend call. Driver and NCCL failures keep the library's own
/// code, as cudarc's `DriverError(CUresult)` does; it is formatted by this
/// crate (formatting through cudarc calls into the driver).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// The backend refuses to keep a captured graph.
    #[error("{call}: {rejection}")]
    GraphRejected {
        /// What was refused (`capture of a step's consumer`).
        call: &'static str,
        /// Why.
        rejection: GraphRejection,
    },
    /// The backend is not usable on this machine (no driver, no device, a
    /// library too old).
    #[error("backend unavailable: {reason}")]
    Unavailable {
        /// Why.
        reason: String,
    },
    /// An arena could not be allocated.
    #[error("allocating {bytes} bytes for the arena of {key} failed: {reason}")]
    Allocation {
        /// The key.
        key: Key,
        /// Bytes asked for.
        bytes: u64,
        /// Why.
        reason: String,
    },
    /// A CUDA driver call failed.
    #[cfg(feature = "cuda")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
    #[error("{call} returned {code:?}")]
    Driver {
        /// The driver entry point; [`CUDARC_DRIVER_CALL`] for a cudarc
        /// `DriverError` converted with `?` (which does not say which call
        /// failed).
        call: &'static str,
        /// Its result code.
        code: cudarc::driver::sys::CUresult,
    },
    /// An NCCL call failed.
    #[cfg(replay_arena_nccl)]
    #[cfg_attr(docsrs, doc(cfg(feature = "nccl")))]
    #[error("{call} returned {code:?}")]
    Nccl {
        /// The NCCL entry point; [`CUDARC_NCCL_CALL`] for a cudarc
        /// `NcclError` converted with `?`.
        call: &'static str,
        /// Its result code.
        code: cudarc::nccl::sys::ncclResult_t,
    },
    /// A cuBLAS call failed.
    #[cfg(feature = "cublas")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cublas")))]
    #[error("{call} returned {status:?}")]
    Cublas {
        /// The cuBLAS entry point; [`CUDARC_CUBLAS_CALL`] for a cudarc
        /// `CublasError` converted with `?`.
        call: &'static str,
        /// Its status code.
        status: cudarc::cublas::sys::cublasStatus_t,
    },
    /// A call of the `sim` backend failed because fault injection told it
    /// to ([`sim::Faults`]); it did nothing.
    #[error("{call} failed (injected fault at call #{index})")]
    Injected {
        /// The call ([`sim::Call::name`](crate::sim::Call::name)).
        call: &'static str,
        /// Its position among the calls since the faults were installed.
        index: u64,
    },
    /// A call was refused before reaching the runtime (a stream of another
    /// device or backend, a stream that cannot be captured, a simulated
    /// access outside every allocation).
    #[error("{call}: {reason}")]
    Refused {
        /// The call refused.
        call: &'static str,
        /// Why it was refused.
        reason: String,
    },
    /// A program's cudarc context was adopted with cudarc's event tracking
    /// on. That tracking makes cudarc record and wait on events around every
    /// use of the program's slices; inside a stream capture such a wait on
    /// an event recorded outside the capture fails
    /// (`CUDA_ERROR_STREAM_CAPTURE_ISOLATION`).
    #[cfg(feature = "cuda")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
    #[error("the CUDA context has cudarc's event tracking on, which breaks stream capture: call `unsafe {{ ctx.disable_event_tracking() }}` before allocating anything a graph will use and then `cuda::Device::from_context`, or adopt it with `cuda::Device::from_context_disabling_event_tracking`")]
    EventTracking,
    /// The legacy default (NULL) stream was offered for capture or replay;
    /// the driver cannot capture it (the per-thread default stream is fine).
    #[cfg(feature = "cuda")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
    #[error("{call}: the legacy default (NULL) stream cannot be captured; use the per-thread stream (`ctx.per_thread_stream()`) or a stream from `ctx.new_stream()`")]
    LegacyStream {
        /// The call refused.
        call: &'static str,
    },
    /// A typed view was asked for with an element type whose dtype differs
    /// from the view's.
    #[cfg(feature = "cuda")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
    #[error("a view of {view} cannot be used as {requested} ({type_name})")]
    DTypeMismatch {
        /// The view's dtype.
        view: crate::vocab::DType,
        /// The dtype of the requested element type.
        requested: crate::vocab::DType,
        /// The requested Rust type.
        type_name: &'static str,
    },
    /// A symmetric domain names a group the backend has no communicator for.
    #[error("{group} has no communicator registered with the backend")]
    NoCommunicator {
        /// The group.
        group: GroupId,
    },
    /// A second communicator was added for a group that has one.
    #[error("{group} has a communicator already; a backend holds one per group")]
    CommunicatorTwice {
        /// The group.
        group: GroupId,
    },
    /// A view was used where it does not belong: outside its closure, on
    /// another stream, written where it may only be read, or (for a
    /// reduce-scatter) of the wrong dtype, domain or length.
    #[error("invalid use of a view: {reason}")]
    InvalidView {
        /// What was wrong.
        reason: Misuse,
    },
    /// Ranks of a group planned different layouts.
    #[error("plan fingerprints differ across {group}: rank(s) {ranks:?} disagree with rank 0 ({fingerprints:016x?})")]
    FingerprintMismatch {
        /// The group the fingerprints were gathered over.
        group: GroupId,
        /// Ranks whose fingerprint differs from rank 0's.
        ranks: Vec<usize>,
        /// Every rank's fingerprint.
        fingerprints: Vec<u64>,
    },
}

/// The rule a plan's graph keeps for graph memory nodes (`sim` and `cuda`):
/// every allocation is freed by the same graph (else its next launch
/// fails: an allocation that escapes its graph must be freed before a
/// relaunch), and every free is of memory the same graph allocated (else
/// each replay frees the program's memory). Balanced temporaries keep
/// their addresses at every launch.
///
/// One pass over each list with a set of the other's addresses (linear in
/// the graph's memory nodes); the unfreed bytes are summed with checked
/// arithmetic, and allocation nodes whose sizes overflow `u64` make the
/// graph [`GraphRejection::Uninspectable`].
pub(crate) fn check_memory_nodes(
    allocs: &[(u64, u64)],
    frees: &[u64],
) -> std::result::Result<(), GraphRejection> {
    use std::collections::HashMap;
    // Each free takes one allocation of its address (a driver may give a
    // later allocation a freed one's address, so an address may be
    // allocated and freed more than once): a free with none left frees
    // memory the graph did not allocate (a second free of one temporary
    // among them), and an allocation no free takes is never freed.
    let mut live: HashMap<u64, usize> = HashMap::with_capacity(allocs.len());
    for &(addr, _) in allocs {
        *live.entry(addr).or_default() += 1;
    }
    let mut foreign_frees = 0usize;
    let mut first_foreign_free = None;
    for &addr in frees {
        match live.get_mut(&addr) {
            Some(n) if *n > 0 => *n -= 1,
            _ => {
                foreign_frees += 1;
                first_foreign_free.get_or_insert(addr);
            }
        }
    }
    let mut unfreed = 0usize;
    let mut unfreed_bytes = Some(0u64);
    let mut first_unfreed = None;
    for &(addr, bytes) in allocs {
        if let Some(n) = live.get_mut(&addr).filter(|n| **n > 0) {
            *n -= 1;
            unfreed += 1;
            unfreed_bytes = unfreed_bytes.and_then(|sum| sum.checked_add(bytes));
            first_unfreed.get_or_insert(addr);
        }
    }
    if unfreed == 0 && foreign_frees == 0 {
        return Ok(());
    }
    let Some(unfreed_bytes) = unfreed_bytes else {
        return Err(GraphRejection::Uninspectable(Box::new(
            BackendError::Refused {
                call: "check graph memory nodes",
                reason: format!(
                    "the {unfreed} allocation node(s) the graph never frees hold more than \
                     u64::MAX bytes in all: the backend reported impossible sizes"
                ),
            },
        )));
    };
    Err(GraphRejection::MemoryNodes {
        unfreed,
        unfreed_bytes,
        first_unfreed,
        foreign_frees,
        first_foreign_free,
    })
}

#[cfg(test)]
mod memory_node_checks {
    use super::{check_memory_nodes, BackendError, GraphRejection};

    #[test]
    fn a_second_free_of_one_allocation_is_a_foreign_free() {
        // One allocation freed twice: the second free frees nothing the
        // graph allocated (CUDA refuses it at capture).
        assert_eq!(
            check_memory_nodes(&[(0x100, 8)], &[0x100, 0x100]),
            Err(GraphRejection::MemoryNodes {
                unfreed: 0,
                unfreed_bytes: 0,
                first_unfreed: None,
                foreign_frees: 1,
                first_foreign_free: Some(0x100),
            })
        );
        // An address allocated twice (reused after its first free) and
        // freed twice is balanced.
        assert_eq!(
            check_memory_nodes(&[(0x100, 8), (0x100, 8)], &[0x100, 0x100]),
            Ok(())
        );
    }

    #[test]
    fn balanced_nodes_pass_and_unbalanced_ones_are_named_in_order() {
        assert_eq!(check_memory_nodes(&[], &[]), Ok(()));
        assert_eq!(
            check_memory_nodes(&[(0x100, 8), (0x200, 16)], &[0x200, 0x100]),
            Ok(())
        );
        assert_eq!(
            check_memory_nodes(
                &[(0x100, 8), (0x200, 16), (0x300, 32)],
                &[0x200, 0x900, 0x800]
            ),
            Err(GraphRejection::MemoryNodes {
                unfreed: 2,
                unfreed_bytes: 40,
                first_unfreed: Some(0x100),
                foreign_frees: 2,
                first_foreign_free: Some(0x900),
            })
        );
    }

    #[test]
    fn unfreed_bytes_that_overflow_u64_are_a_typed_error_not_a_panic_or_a_wrap() {
        let allocs = [(0x100, u64::MAX), (0x200, 2), (0x300, 1)];
        let got = check_memory_nodes(&allocs, &[0x300]);
        let Err(GraphRejection::Uninspectable(e)) = got else {
            panic!("expected an uninspectable graph, got {got:?}");
        };
        let BackendError::Refused { call: op, reason } = *e else {
            panic!("expected a refusal, got {e:?}");
        };
        assert_eq!(op, "check graph memory nodes");
        assert!(reason.contains("2 allocation node(s)"), "{reason}");
        // Right up to the limit the sum is exact.
        assert_eq!(
            check_memory_nodes(&[(0x100, u64::MAX - 2), (0x200, 2)], &[]),
            Err(GraphRejection::MemoryNodes {
                unfreed: 2,
                unfreed_bytes: u64::MAX,
                first_unfreed: Some(0x100),
                foreign_frees: 0,
                first_foreign_free: None,
            })
        );
    }

    /// Linear: 200 000 nodes each way take milliseconds (a pairwise
    /// comparison would make 4e10 of them).
    #[test]
    fn many_memory_nodes_are_checked_in_one_pass() {
        let n = 200_000u64;
        let allocs: Vec<(u64, u64)> = (0..n).map(|i| (0x1000 + i * 256, 256)).collect();
        // Freed in reverse order, one left over and one foreign free.
        let mut frees: Vec<u64> = allocs[1..].iter().rev().map(|&(a, _)| a).collect();
        frees.push(0x10);
        let started = std::time::Instant::now();
        let got = check_memory_nodes(&allocs, &frees);
        assert_eq!(
            got,
            Err(GraphRejection::MemoryNodes {
                unfreed: 1,
                unfreed_bytes: 256,
                first_unfreed: Some(0x1000),
                foreign_frees: 1,
                first_foreign_free: Some(0x10),
            })
        );
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "{:?}",
            started.elapsed()
        );
    }
}

/// Why a backend refuses to keep a captured graph
/// ([`Capture::validate_graph`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GraphRejection {
    /// Its memory nodes are not balanced: allocations the graph never
    /// frees (the next launch fails: memory a graph allocates must be
    /// freed inside it or come from the plan), or frees of memory it did
    /// not allocate (every replay would free the program's memory).
    #[error("{}", describe_memory_nodes(*.unfreed, *.unfreed_bytes, *.first_unfreed, *.foreign_frees, *.first_foreign_free))]
    MemoryNodes {
        /// Allocation nodes the graph never frees.
        unfreed: usize,
        /// Their bytes in all.
        unfreed_bytes: u64,
        /// The address of the first of them.
        first_unfreed: Option<u64>,
        /// Free nodes of memory the graph did not allocate.
        foreign_frees: usize,
        /// The address the first of them frees.
        first_foreign_free: Option<u64>,
    },
    /// The graph could not be inspected.
    #[error("could not inspect the graph: {0}")]
    Uninspectable(Box<BackendError>),
}

fn describe_memory_nodes(
    unfreed: usize,
    bytes: u64,
    first: Option<u64>,
    foreign: usize,
    first_foreign: Option<u64>,
) -> String {
    let mut reasons = Vec::new();
    if let Some(first) = first {
        reasons.push(format!(
            "{unfreed} allocation(s) of {bytes} bytes in all (the first at {first:#x}) are never \
             freed by the graph: memory a graph allocates must be freed inside it (drop \
             temporaries before the capture ends) or come from the plan"
        ));
    }
    if let Some(first) = first_foreign {
        reasons.push(format!(
            "{foreign} free(s) (the first at {first:#x}) of memory the graph did not allocate: \
             every replay would free the program's memory"
        ));
    }
    reasons.join("; ")
}

/// Device memory the backend holds for graph memory nodes
/// (CUDA: `cuDeviceGetGraphMemAttribute`), on the whole device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct GraphMemory {
    /// Bytes in use by graph allocations now.
    pub used: u64,
    /// Bytes reserved for graph allocations now.
    pub reserved: u64,
}

impl GraphMemory {
    /// `used` bytes in use and `reserved` bytes reserved (what a backend's
    /// [`Backend::graph_memory_in_use`] reports).
    pub const fn new(used: u64, reserved: u64) -> GraphMemory {
        GraphMemory { used, reserved }
    }
}

/// One allocated arena. Dropping it frees the memory.
pub trait Arena {
    /// Device (or host, for `sim`) address of the first byte.
    fn base(&self) -> u64;
    /// Size in bytes.
    fn bytes(&self) -> u64;
}

/// What a graph's memory allocation nodes hand out: a runner's
/// temporaries (a framework's op outputs allocated inside the capture,
/// CUDA's `cuMemAllocAsync` under capture), which the graph also frees.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Temporaries {
    /// Allocation nodes.
    pub allocations: usize,
    /// Bytes they allocate, summed.
    pub bytes: u64,
    /// Bytes of address space they cover, each byte once: where the
    /// runtime placed temporaries whose lifetimes do not overlap at the
    /// same addresses (CUDA reuses a freed temporary's addresses within a
    /// graph), they count once. At most `bytes`; what the graph needs of
    /// the runtime's graph memory pool at the least.
    #[cfg_attr(feature = "serde", serde(default))]
    pub span: u64,
}

impl Temporaries {
    /// `allocations` allocation nodes of `bytes` bytes in all, at
    /// addresses not known to overlap (`span` is `bytes`).
    pub const fn new(allocations: usize, bytes: u64) -> Temporaries {
        Temporaries {
            allocations,
            bytes,
            span: bytes,
        }
    }

    /// The temporaries of a graph whose allocation nodes hand out
    /// `allocations` (address, bytes): their count, their bytes summed and
    /// the address space they cover (each byte once).
    pub fn of_allocations(allocations: &[(u64, u64)]) -> Temporaries {
        let mut ranges: Vec<(u64, u64)> = allocations
            .iter()
            .map(|&(addr, bytes)| (addr, addr.saturating_add(bytes)))
            .collect();
        ranges.sort_unstable();
        let mut span = 0u64;
        let mut covered: Option<(u64, u64)> = None;
        for (start, end) in ranges {
            covered = match covered {
                Some((s, e)) if start <= e => Some((s, e.max(end))),
                Some((s, e)) => {
                    span = span.saturating_add(e - s);
                    Some((start, end))
                }
                None => Some((start, end)),
            };
        }
        if let Some((s, e)) = covered {
            span = span.saturating_add(e - s);
        }
        Temporaries {
            allocations: allocations.len(),
            bytes: allocations
                .iter()
                .fold(0u64, |sum, &(_, bytes)| sum.saturating_add(bytes)),
            span,
        }
    }

    /// The temporaries of two graphs together (a step graph's parts):
    /// counts, bytes and spans summed.
    pub const fn and(self, other: Temporaries) -> Temporaries {
        Temporaries {
            allocations: self.allocations + other.allocations,
            bytes: self.bytes.saturating_add(other.bytes),
            span: self.span.saturating_add(other.span),
        }
    }

    /// Whether the graph allocates nothing (the driver copies such a graph
    /// into a step graph; one that allocates must be moved in).
    pub const fn is_empty(&self) -> bool {
        self.allocations == 0
    }
}

/// How a node's graph goes into [`Compose::compose`]; `G` is the backend's
/// graph type ([`Capture::Graph`]).
pub enum NodeGraph<'a, G> {
    /// Copied in (CUDA: a child graph node clones the graph); the graph
    /// stays the caller's. Refused for a graph with memory nodes: the
    /// driver does not clone those.
    Copy(&'a G),
    /// Moved in (CUDA 12.9 and later: a child graph node that takes
    /// ownership, `CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE`): the graph belongs
    /// to the composed graph from then on, and is gone with it, even when
    /// composing fails. A graph with temporaries goes in this way.
    Move(G),
}

impl<G> NodeGraph<'_, G> {
    /// The graph, either way.
    pub fn graph(&self) -> &G {
        match self {
            NodeGraph::Copy(g) => g,
            NodeGraph::Move(g) => g,
        }
    }
}

/// One node of [`Compose::compose`]: a graph, the earlier nodes it waits
/// for, and the stream of the step it was scheduled on; in a step graph
/// that overlaps its neighbours, also the events it waits for first and
/// records when done (event wait and record nodes: the other graph's
/// launch before it). `G` and `E` are the backend's graph and event types
/// ([`Capture::Graph`], [`Streams::Event`]): backends that share them share
/// their nodes.
pub struct StepNode<'a, G, E> {
    /// The graph the node runs, copied or moved in.
    pub graph: NodeGraph<'a, G>,
    /// Indices of earlier nodes it runs after (borrowed: a step graph's
    /// edges stay with it, and a build allocates no list per node).
    pub deps: &'a [usize],
    /// The step's stream (lane) it was scheduled on.
    pub lane: usize,
    /// Events whose latest record (at the composed graph's launch) it runs
    /// after.
    pub waits: Vec<&'a E>,
    /// Events it records once done, at each launch.
    pub records: Vec<&'a E>,
}

impl<'a, G, E> StepNode<'a, G, E> {
    /// A node running `graph` on `lane` after the nodes `deps`.
    pub fn new(graph: NodeGraph<'a, G>, deps: &'a [usize], lane: usize) -> StepNode<'a, G, E> {
        StepNode {
            graph,
            deps,
            lane,
            waits: Vec::new(),
            records: Vec::new(),
        }
    }
}

/// How a composed graph ends, for step graphs launched in turn that
/// overlap: it records `record` once every node is done, and completes
/// only once `wait`'s latest record (at its launch) has completed too, so
/// that its completion implies the launch before it completed. `E` is the
/// backend's event type ([`Streams::Event`]).
pub struct StepEnd<'a, E> {
    /// Recorded after every node.
    pub record: &'a E,
    /// The composed graph completes after its latest record.
    pub wait: &'a E,
}

/// Whether a step copy is cut at a ready point ([`Capture::cuts_at`]), and
/// why not.
///
/// A cut lets the readers of a handoff start at its ready point inside a
/// step graph. A temporary that lives across the cut costs more than that:
/// on an H200 (driver 580.159.04) a step graph whose cut parts pass a
/// temporary from one part to the next reserved 5 to 7 times the graph
/// memory of the same step with whole copies (320 MiB against 64 for five
/// layers of 16 MiB temporaries; `tests/gpu/step/graph_memory.rs`), so the
/// crate keeps such a copy whole at that ready point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Cut {
    /// Cut: everything runs before the ready point or after it, and no
    /// temporary lives across it.
    Clean,
    /// Not cut: other work of the capture runs beside the ready point (on
    /// another stream of the capture).
    WorkBeside,
    /// Not cut: temporaries allocated before the ready point are freed after
    /// it, `bytes` in all. Free them before the ready point (or allocate
    /// them after it) to let the readers start there.
    TemporariesAcross {
        /// The bytes of the temporaries that live across the ready point.
        bytes: u64,
    },
    /// Not cut: the backend cannot cut captures.
    Unsupported,
    /// Cut although temporaries allocated before the ready point are freed
    /// after it, `bytes` in all, as the capture chose
    /// ([`RunnerCapture::cut_across_temporaries`](crate::RunnerCapture::cut_across_temporaries)):
    /// readers start at the ready point, for several times the graph memory
    /// of whole copies.
    Across {
        /// The bytes of the temporaries that live across the ready point.
        bytes: u64,
    },
}

impl Cut {
    /// Whether the copy is cut there with no temporary across.
    pub fn is_clean(self) -> bool {
        self == Cut::Clean
    }

    /// Whether the copy is cut there, cleanly or across temporaries.
    pub fn is_cut(self) -> bool {
        matches!(self, Cut::Clean | Cut::Across { .. })
    }
}

impl std::fmt::Display for Cut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cut::Clean => f.write_str("cut at its ready point"),
            Cut::WorkBeside => {
                f.write_str("kept whole: other work of its capture runs beside the ready point")
            }
            Cut::TemporariesAcross { bytes } => write!(
                f,
                "kept whole: {bytes} bytes of temporaries allocated before the ready point are \
                 freed after it (free them before it to let readers start there)"
            ),
            Cut::Unsupported => f.write_str("kept whole: the backend cannot cut captures"),
            Cut::Across { bytes } => write!(
                f,
                "cut at its ready point across {bytes} bytes of temporaries, as chosen (more \
                 graph memory than whole copies)"
            ),
        }
    }
}

/// The streams role: streams the runtime gives identities, events to order
/// them, and host waits. It is all the replay fence needs (the dry run a
/// step graph is compiled on implements this alone).
///
/// Every call takes `&self`: backends are thin handles over a runtime.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a replay-arena backend",
    label = "the fence needs a backend's streams and events here",
    note = "backends are cheap handles passed by value (`backend.clone()`, not `&backend`): `sim::Device`, `cuda::Device` (`cuda::Device::from_context` adopts a cudarc context), `nccl::Device`"
)]
pub trait Streams {
    /// A completion event.
    type Event;
    /// A stream work is submitted to; clones are handles of one stream.
    type Stream: Clone;

    /// Creates a completion event, already recorded once, so that a first
    /// wait on it is valid.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn create_event(&self) -> Result<Self::Event, BackendError>;

    /// A number identifying the stream, equal for clones of one handle and
    /// never given to another stream while this backend lives, even after
    /// the stream was destroyed (a driver's raw handle is recycled at once:
    /// the fence would count a wait as implied by stream order on a new
    /// stream). Handles of one stream made separately may differ: the fence
    /// then waits where it could have skipped, which is safe.
    fn stream_id(&self, stream: &Self::Stream) -> u64;

    /// Makes `stream` wait for the event's latest record.
    ///
    /// # Errors
    ///
    /// The runtime's error, or [`BackendError::Refused`] for a stream this
    /// backend does not own.
    fn wait_event(&self, stream: &Self::Stream, event: &Self::Event) -> Result<(), BackendError>;

    /// Records the event at the current tail of `stream`.
    ///
    /// # Errors
    ///
    /// As [`Streams::wait_event`].
    fn record_event(&self, stream: &Self::Stream, event: &Self::Event) -> Result<(), BackendError>;

    /// Blocks the calling thread until the event's latest record completed.
    ///
    /// # Errors
    ///
    /// The runtime's error (a sticky device error, say).
    fn synchronize_event(&self, event: &Self::Event) -> Result<(), BackendError>;

    /// Whether the event's latest record has completed, without blocking
    /// (an event never recorded has). Run-time buckets ask it before they
    /// release a bucket's graphs ([`Replayable::set_bucket_budget`](crate::Replayable::set_bucket_budget)).
    /// The default answers `false` (not known to be done): such a backend
    /// never releases a bucket.
    ///
    /// # Errors
    ///
    /// The runtime's error (a sticky device error, say).
    fn event_done(&self, event: &Self::Event) -> Result<bool, BackendError> {
        let _ = event;
        Ok(false)
    }

    /// Whether `stream` is capturing.
    ///
    /// # Errors
    ///
    /// The runtime's error, or [`BackendError::Refused`] for a stream this
    /// backend does not own.
    fn is_capturing(&self, stream: &Self::Stream) -> Result<bool, BackendError>;

    /// Waits for all work submitted through this backend (for
    /// [`Replayable::synchronize`](crate::Replayable::synchronize); teardown
    /// waits only for the fence's events).
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn synchronize(&self) -> Result<(), BackendError>;
}

/// The allocation role: where a plan's arenas come from. A plan allocates
/// every arena once, before any capture
/// ([`Planned::allocate`](crate::Planned::allocate)), and drops them only
/// after every event the fence recorded was waited for.
///
/// A backend that differs from another only in where some domain's memory
/// comes from implements this role alone on top of the other's: the `nccl`
/// backend is the `cuda` backend with symmetric windows as its allocator.
#[diagnostic::on_unimplemented(
    message = "`{Self}` allocates no arenas",
    label = "a plan allocates its arenas here",
    note = "backends are cheap handles passed by value (`backend.clone()`, not `&backend`): `sim::Device`, `cuda::Device`, `nccl::Device`"
)]
pub trait Allocate {
    /// An allocated arena.
    type Arena: Arena;

    /// Allocates one arena, outside every graph memory pool, aligned to at
    /// least `desc.alignment`.
    ///
    /// # Errors
    ///
    /// [`BackendError::Allocation`] when the memory cannot be had, or the
    /// runtime's own error.
    fn allocate_arena(&self, desc: &ArenaDesc) -> Result<Self::Arena, BackendError>;
}

/// The capture role: stream capture into graphs, event record nodes inside
/// them, and what a plan asks of a captured graph (its memory nodes
/// checked, its temporaries counted).
#[diagnostic::on_unimplemented(
    message = "`{Self}` captures no graphs",
    note = "backends are cheap handles passed by value (`backend.clone()`, not `&backend`): `sim::Device`, `cuda::Device`, `nccl::Device`"
)]
pub trait Capture: Streams {
    /// A captured, launchable graph.
    type Graph;

    /// Starts capturing the work submitted to `stream`.
    ///
    /// # Errors
    ///
    /// [`BackendError::Refused`] for a stream that cannot be captured, or the
    /// runtime's error (the stream is already capturing, say).
    fn begin_capture(&self, stream: &Self::Stream) -> Result<(), BackendError>;

    /// Ends the capture and returns the graph, ready to launch.
    ///
    /// # Safety
    ///
    /// The capture on `stream` is the caller's own: ending a capture that
    /// [`RunnerCapture::stream_capture`](crate::RunnerCapture::stream_capture)
    /// opened, from inside its closure, would let the closure's work on the
    /// runner's views run at once, outside every fence.
    ///
    /// # Errors
    ///
    /// The runtime's error (the capture was invalidated, say).
    unsafe fn end_capture(&self, stream: &Self::Stream) -> Result<Self::Graph, BackendError>;

    /// [`Capture::end_capture`] for a graph only ever composed into a step
    /// graph, never launched on its own (a step copy, a step's consumer):
    /// a backend may leave it uninstantiated. The default instantiates it
    /// all the same.
    ///
    /// # Safety
    ///
    /// As [`Capture::end_capture`].
    ///
    /// # Errors
    ///
    /// As [`Capture::end_capture`].
    unsafe fn end_capture_part(&self, stream: &Self::Stream) -> Result<Self::Graph, BackendError> {
        // SAFETY: the caller's contract is the same.
        unsafe { self.end_capture(stream) }
    }

    /// Ends a capture and discards what was captured (best effort, after a
    /// failure or during unwinding).
    ///
    /// # Safety
    ///
    /// As [`Capture::end_capture`].
    unsafe fn abort_capture(&self, stream: &Self::Stream);

    /// Records the event *inside* the capture running on `stream`, as a
    /// node of the graph being captured: every launch of the graph records
    /// the event at that point of the graph (CUDA: an external event record
    /// node, `cuEventRecordWithFlags(.., CU_EVENT_RECORD_EXTERNAL)`).
    ///
    /// # Errors
    ///
    /// The runtime's error; [`BackendError::Refused`] when `stream` is not
    /// capturing.
    fn record_event_node(
        &self,
        stream: &Self::Stream,
        event: &Self::Event,
    ) -> Result<(), BackendError>;

    /// Whether the capture of work like `graph`'s can be cut in two at the
    /// record node of `event` ([`Capture::record_event_node`]) without
    /// costing more than it gains: [`Cut::Clean`] when every other node of
    /// `graph` runs before that record or after it, none beside it (no
    /// other stream of the capture has work across it), and no temporary
    /// allocated before it is freed after it. A step copy of an allocating
    /// runner is cut at a ready point only then ([`Capture::cut_capture`]).
    /// [`Cut::Unsupported`] when the backend cannot cut captures.
    ///
    /// # Errors
    ///
    /// The runtime's error while inspecting the graph.
    fn cuts_at(&self, graph: &Self::Graph, event: &Self::Event) -> Result<Cut, BackendError> {
        let _ = (graph, event);
        Ok(Cut::Unsupported)
    }

    /// Ends the capture on `stream` and begins another on it at once, so
    /// that the work goes on into a second graph: the first part, returned,
    /// is not instantiated (it is only ever moved into a step graph, before
    /// the part after it). Temporaries the first part allocates may be used
    /// and freed in the second. On error the stream may have left capture.
    ///
    /// # Safety
    ///
    /// As [`Capture::end_capture`]; and no other stream has work in the
    /// capture that the stream's tail does not follow
    /// ([`Capture::cuts_at`] said so of the same work's graph).
    ///
    /// # Errors
    ///
    /// [`BackendError::Refused`] when the backend cannot cut captures; the
    /// runtime's error.
    unsafe fn cut_capture(&self, stream: &Self::Stream) -> Result<Self::Graph, BackendError> {
        let _ = stream;
        Err(BackendError::Refused {
            call: "cut capture",
            reason: "this backend cannot cut a capture in two".into(),
        })
    }

    /// [`Capture::validate_graph`] for a graph captured in parts
    /// ([`Capture::cut_capture`]): their memory nodes are balanced taken
    /// together.
    ///
    /// # Errors
    ///
    /// Why the parts cannot be owned.
    fn validate_parts(&self, parts: &[&Self::Graph]) -> Result<(), GraphRejection> {
        match parts {
            [one] => self.validate_graph(one),
            _ => Err(GraphRejection::Uninspectable(Box::new(
                BackendError::Refused {
                    call: "validate graph parts",
                    reason: "this backend cannot cut a capture in two".into(),
                },
            ))),
        }
    }

    /// Checks that a captured graph may be owned by a plan: its memory
    /// nodes are balanced (temporaries
    /// allocated and freed inside the graph are fine; an allocation that
    /// escapes the graph, or a free of memory it did not allocate, is
    /// `Err(reason)`).
    ///
    /// # Errors
    ///
    /// Why the graph cannot be owned.
    fn validate_graph(&self, graph: &Self::Graph) -> Result<(), GraphRejection>;

    /// What `graph`'s memory allocation nodes (and its child graphs')
    /// allocate: the runner's temporaries, from the nodes' sizes. A backend
    /// whose graphs cannot allocate reports none.
    ///
    /// # Errors
    ///
    /// The runtime's error while inspecting the graph.
    fn graph_temporaries(&self, graph: &Self::Graph) -> Result<Temporaries, BackendError> {
        let _ = graph;
        Ok(Temporaries::default())
    }
}

/// The launch role: a captured graph put on a stream, all or nothing.
#[diagnostic::on_unimplemented(
    message = "`{Self}` launches no graphs",
    note = "backends are cheap handles passed by value (`backend.clone()`, not `&backend`): `sim::Device`, `cuda::Device`, `nccl::Device`"
)]
pub trait Launch: Capture {
    /// Launches a graph on `stream`, all or nothing: on error nothing of
    /// the graph was enqueued.
    ///
    /// A launch on a stream that is capturing must fail (as the CUDA
    /// driver refuses `cuGraphLaunch` there in every capture mode,
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`), never be recorded into
    /// that capture: [`Replayable::replay`](crate::Replayable::replay) asks
    /// no capture status before its launch, and names the refusal
    /// [`StreamCapturing`](crate::StreamCapturing) after it.
    ///
    /// # Safety
    ///
    /// A plan's graph writes arena bytes that other replays and consumers
    /// use: the caller guarantees that every earlier user of the bytes the
    /// graph touches is complete or ordered before `stream`'s tail, and that
    /// later users will be ordered after this launch. [`Replayable::replay`](crate::Replayable::replay)
    /// is the safe way to launch a plan's graph.
    ///
    /// # Errors
    ///
    /// As [`Streams::wait_event`].
    unsafe fn launch(&self, graph: &Self::Graph, stream: &Self::Stream)
        -> Result<(), BackendError>;
}

/// A device runtime a plan runs on: every role the lifecycle needs
/// ([`Allocate`], [`Capture`], [`Launch`], and with them [`Streams`]),
/// under one name for reports, and what belongs to the whole device rather
/// than to one role: the memory it holds for graph allocations, reported
/// and trimmed.
///
/// The lifecycle guarantees the order: arenas and events are created
/// before any capture; graphs are dropped before events and arenas; every
/// event the fence recorded is waited for ([`Streams::synchronize_event`])
/// before anything is freed.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a replay-arena backend",
    label = "a plan allocates its arenas on a backend",
    note = "backends are cheap handles passed by value (`backend.clone()`, not `&backend`): `sim::Device`, `cuda::Device` (`cuda::Device::from_context` adopts a cudarc context), `nccl::Device`"
)]
pub trait Backend: Allocate + Capture + Launch {
    /// Short name for reports ("sim", "cuda").
    fn name(&self) -> &'static str;

    /// What the backend holds for graph memory nodes on the device: the
    /// other half of what replaying costs in memory beside the plan's
    /// arenas. `None` when the backend cannot tell.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn graph_memory_in_use(&self) -> Result<Option<GraphMemory>, BackendError> {
        Ok(None)
    }

    /// Gives the memory the backend holds for graph allocations, and no
    /// live graph uses, back to the device (CUDA: `cuDeviceGraphMemTrim`).
    /// A plan calls it at teardown and `replan`, once none of its graphs
    /// can run; a program may call it at any time.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn trim_graph_memory(&self) -> Result<(), BackendError> {
        Ok(())
    }

    /// The granule the backend's graph memory pool grows by: a graph's
    /// temporaries take whole granules of it
    /// ([`GraphMemoryEstimate`](crate::GraphMemoryEstimate)). 1 (no
    /// rounding) unless the backend knows better; CUDA:
    /// [`cuda::Device::graph_memory_granule`](crate::cuda::Device::graph_memory_granule).
    fn graph_memory_granule(&self) -> u64 {
        1
    }
}

/// The compose role, what step graphs
/// ([`Replayable::step`](crate::Replayable::step)) need besides
/// [`Backend`]: a graph split at a ready point, and a graph of graphs.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot compose graphs, so its plans have no step graphs",
    note = "`Replayable::step` needs a backend that implements `Compose`: `sim::Device`, `cuda::Device`, `nccl::Device`"
)]
pub trait Compose: Backend {
    /// Splits a captured graph at the earliest event record node of
    /// `events` (made by [`Capture::record_event_node`]): the nodes that
    /// record depends on, and the rest, as two graphs for
    /// [`Compose::compose`] (not to be launched on their own), and the index
    /// in `events` of the event it split at. The second part runs after the
    /// first; the other events' records stay where they were.
    ///
    /// # Errors
    ///
    /// The runtime's error; [`BackendError::Refused`] when the graph
    /// records none of `events`.
    fn split_graph(
        &self,
        graph: &Self::Graph,
        events: &[&Self::Event],
    ) -> Result<(Self::Graph, Self::Graph, usize), BackendError>;

    /// One graph of graphs: each node runs its graph after the nodes it
    /// depends on (earlier nodes, by index) and nothing else orders it.
    /// `lane` says which stream of the step the node was scheduled on: a
    /// model backend runs each lane as a stream; the driver ignores it.
    /// A [`NodeGraph::Copy`] is copied in (it may be dropped afterwards); a
    /// [`NodeGraph::Move`] is the composed graph's from then on. A node's
    /// `waits` and `records`, and `end`, become event wait and record nodes
    /// (they take effect at each launch, in launch order, as a stream's
    /// event waits and records do).
    ///
    /// # Errors
    ///
    /// The runtime's error (a graph the runtime cannot nest, a graph with
    /// temporaries copied, or moved on a driver that cannot move graphs,
    /// say). The moved graphs are gone then too.
    fn compose(
        &self,
        nodes: Vec<StepNode<'_, Self::Graph, Self::Event>>,
        end: Option<StepEnd<'_, Self::Event>>,
    ) -> Result<Self::Graph, BackendError>;

    /// Points, in a graph [`Compose::compose`] made whose every node records
    /// at least one event, each node's last record at `events[i]` instead,
    /// for the graph's next launches (launches already made record what
    /// they recorded): a traced step graph's node marks, new for each
    /// launch without composing again (CUDA:
    /// `cuGraphExecEventRecordNodeSetEvent`). On error the graph may record
    /// some new events and some old: compose it again.
    ///
    /// # Errors
    ///
    /// [`BackendError::Refused`] when the backend cannot, or for another
    /// graph; the runtime's error.
    fn retarget_records(
        &self,
        graph: &mut Self::Graph,
        events: &[&Self::Event],
    ) -> Result<(), BackendError> {
        let _ = (graph, events);
        Err(BackendError::Refused {
            call: "retarget records",
            reason: "this backend composes again instead".into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use static_assertions::assert_impl_all;

    #[test]
    fn temporaries_cover_each_byte_of_address_space_once() {
        // Two reusing one range, one apart, one overlapping the last, an
        // empty one inside the first: 48 + 16 bytes, 4 allocations.
        let t = Temporaries::of_allocations(&[(0, 32), (0, 32), (100, 8), (104, 12), (8, 0)]);
        assert_eq!((t.allocations, t.bytes, t.span), (5, 84, 48));
        assert_eq!(Temporaries::of_allocations(&[]), Temporaries::default());
        let u = u64::MAX;
        let huge = Temporaries::of_allocations(&[(u - 4, 8), (0, u)]);
        assert_eq!((huge.bytes, huge.span), (u, u));
        assert_eq!(t.and(t).span, 96);
    }

    // The model plays every role.
    assert_impl_all!(sim::Device: Streams, Allocate, Capture, Launch, Backend, Compose, Timing);

    #[cfg(feature = "cuda")]
    assert_impl_all!(cuda::Device: Streams, Allocate, Capture, Launch, Backend, Compose, Timing);

    // The `nccl` backend allocates on its own and takes every other role
    // from `cuda` (Timing included), with `cuda`'s graphs and events.
    #[cfg(replay_arena_nccl)]
    assert_impl_all!(nccl::Device: Streams, Allocate, Capture, Launch, Backend, Compose, Timing);

    #[cfg(replay_arena_nccl)]
    #[test]
    fn nccl_and_cuda_compose_the_same_step_nodes() {
        fn same_nodes<B: Compose, C: Compose<Graph = B::Graph, Event = B::Event>>() {}
        same_nodes::<cuda::Device, nccl::Device>();
    }
}
