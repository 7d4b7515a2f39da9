//! Fault injection: any call of the `sim` backend can be told to fail, at
//! its n-th use, at the n-th call of any kind, or on a seeded schedule, as
//! FoundationDB's simulator and TigerBeetle's VOPR fail their I/O. A failed
//! call does nothing (as a CUDA call that returns an error enqueues
//! nothing) and returns [`BackendError::Injected`]. Every call is counted,
//! with the place in the crate (or the program) that made it, so an
//! explorer can tell which failure sites it reached.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::panic::Location;

use crate::backend::BackendError;

/// A call of the `sim` backend that can be made to fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Call {
    /// [`Streams::create_event`](crate::backend::Streams::create_event).
    CreateEvent,
    /// [`Streams::record_event`](crate::backend::Streams::record_event).
    RecordEvent,
    /// [`Streams::wait_event`](crate::backend::Streams::wait_event).
    WaitEvent,
    /// [`Streams::synchronize_event`](crate::backend::Streams::synchronize_event).
    SynchronizeEvent,
    /// [`Streams::synchronize`](crate::backend::Streams::synchronize).
    Synchronize,
    /// [`Streams::event_done`](crate::backend::Streams::event_done): the
    /// non-blocking event query.
    QueryEvent,
    /// [`Streams::is_capturing`](crate::backend::Streams::is_capturing) (the capture
    /// status query).
    CaptureStatus,
    /// [`Allocate::allocate_arena`](crate::backend::Allocate::allocate_arena).
    AllocateArena,
    /// [`Capture::record_event_node`](crate::backend::Capture::record_event_node).
    RecordNode,
    /// [`Launch::launch`](crate::backend::Launch::launch): a graph launch.
    Launch,
    /// [`Capture::begin_capture`](crate::backend::Capture::begin_capture).
    BeginCapture,
    /// [`Capture::end_capture`](crate::backend::Capture::end_capture): ending the
    /// capture.
    EndCapture,
    /// The instantiation [`Capture::end_capture`](crate::backend::Capture::end_capture)
    /// and [`Compose::compose`](crate::backend::Compose::compose) end with.
    Instantiate,
    /// [`Compose::split_graph`](crate::backend::Compose::split_graph).
    SplitGraph,
    /// [`Compose::compose`](crate::backend::Compose::compose): building a step graph
    /// from child graphs (moved or copied).
    Compose,
    /// [`Backend::trim_graph_memory`](crate::backend::Backend::trim_graph_memory).
    TrimGraphMemory,
    /// [`Backend::graph_memory_in_use`](crate::backend::Backend::graph_memory_in_use)
    /// and [`Capture::graph_temporaries`](crate::backend::Capture::graph_temporaries).
    GraphMemoryQuery,
    /// [`Device::launch`](super::Device::launch) and
    /// [`Device::launch_unscoped`](super::Device::launch_unscoped): a kernel
    /// of the program.
    Kernel,
    /// [`Device::alloc_f32`](super::Device::alloc_f32): memory of the
    /// program.
    Alloc,
    /// [`Device::alloc_async`](super::Device::alloc_async): graph memory
    /// (an allocation node).
    GraphAlloc,
    /// [`Device::free_async`](super::Device::free_async): a free node.
    GraphFree,
    /// [`Device::read_f32`](super::Device::read_f32) and
    /// [`Device::write_f32`](super::Device::write_f32): copies between host
    /// and device.
    Copy,
}

impl Call {
    /// Every call, in order.
    pub const ALL: [Call; 22] = [
        Call::CreateEvent,
        Call::RecordEvent,
        Call::WaitEvent,
        Call::SynchronizeEvent,
        Call::Synchronize,
        Call::QueryEvent,
        Call::CaptureStatus,
        Call::AllocateArena,
        Call::RecordNode,
        Call::Launch,
        Call::BeginCapture,
        Call::EndCapture,
        Call::Instantiate,
        Call::SplitGraph,
        Call::Compose,
        Call::TrimGraphMemory,
        Call::GraphMemoryQuery,
        Call::Kernel,
        Call::Alloc,
        Call::GraphAlloc,
        Call::GraphFree,
        Call::Copy,
    ];

    /// Its name, as an error and a log print it (`launch`, `record event`).
    pub fn name(self) -> &'static str {
        match self {
            Call::CreateEvent => "create event",
            Call::RecordEvent => "record event",
            Call::WaitEvent => "wait event",
            Call::SynchronizeEvent => "synchronize event",
            Call::Synchronize => "synchronize",
            Call::QueryEvent => "query event",
            Call::CaptureStatus => "capture status",
            Call::AllocateArena => "allocate arena",
            Call::RecordNode => "record event node",
            Call::Launch => "launch",
            Call::BeginCapture => "begin capture",
            Call::EndCapture => "end capture",
            Call::Instantiate => "instantiate",
            Call::SplitGraph => "split graph",
            Call::Compose => "compose",
            Call::TrimGraphMemory => "trim graph memory",
            Call::GraphMemoryQuery => "graph memory query",
            Call::Kernel => "kernel",
            Call::Alloc => "alloc",
            Call::GraphAlloc => "graph alloc",
            Call::GraphFree => "graph free",
            Call::Copy => "copy",
        }
    }
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which calls fail: none, one chosen by position, or a seeded schedule.
/// Installed with [`Device::inject`](super::Device::inject).
///
/// ```
/// use replay_arena::sim::{self, Call, Faults};
/// use replay_arena::{BackendError};
/// use replay_arena::backend::Streams;
///
/// let sim = sim::Device::new();
/// let stream = sim.new_stream();
/// sim.inject(Faults::nth(Call::CreateEvent, 1)); // the second event fails
/// let first = sim.create_event()?;
/// assert!(matches!(sim.create_event(), Err(BackendError::Injected { .. })));
/// sim.record_event(&stream, &first)?; // other calls go on
/// # Ok::<(), replay_arena::BackendError>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    rule: Rule,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
enum Rule {
    #[default]
    None,
    /// The `n`-th call (from 0) of any kind.
    At(u64),
    /// The `n`-th use (from 0) of one call.
    Nth(Call, u64),
    /// Each call fails with probability `1 / one_in`, drawn from `state`.
    Seeded { state: u64, one_in: u64 },
}

impl Faults {
    /// No call fails.
    pub fn none() -> Faults {
        Faults::default()
    }

    /// The `n`-th backend call from now (counted from 0, every kind
    /// together) fails; every other call succeeds. Run a program once
    /// with [`Faults::none`] to learn how many calls it makes
    /// ([`FaultLog::calls`]), then once per position.
    pub fn at(n: u64) -> Faults {
        Faults { rule: Rule::At(n) }
    }

    /// The `n`-th use from now (counted from 0) of `call` fails.
    pub fn nth(call: Call, n: u64) -> Faults {
        Faults {
            rule: Rule::Nth(call, n),
        }
    }

    /// Each call fails with probability `1 / one_in`, on a schedule drawn
    /// from `seed` (the same seed fails the same calls of the same
    /// program). `one_in` of 0 or 1 fails every call.
    pub fn seeded(seed: u64, one_in: u64) -> Faults {
        Faults {
            rule: Rule::Seeded {
                state: seed,
                one_in: one_in.max(1),
            },
        }
    }
}

/// What fault injection saw since [`Device::inject`](super::Device::inject):
/// every call counted, where it was made, and which failed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FaultLog {
    /// Calls made (failed ones included).
    pub calls: u64,
    /// Per call kind: how many were made.
    pub per_call: BTreeMap<Call, u64>,
    /// Every place (`file:line`) a call was made from, with its kind.
    pub sites: BTreeSet<(Call, String)>,
    /// The calls that were made to fail: (position, kind, place).
    pub injected: Vec<(u64, Call, String)>,
}

/// The fault state of one simulated device.
#[derive(Debug, Default)]
pub(super) struct FaultState {
    faults: Faults,
    log: FaultLog,
    /// Calls made, per kind (in `Call::ALL`'s order).
    counts: [u64; Call::ALL.len()],
    /// Where calls were made from, sorted by the address of their
    /// location (formatted into the log when asked).
    sites: Vec<(usize, Call, &'static Location<'static>)>,
}

impl FaultState {
    pub(super) fn install(&mut self, faults: Faults) {
        self.faults = faults;
        self.log = FaultLog::default();
        self.counts = [0; Call::ALL.len()];
        self.sites.clear();
    }

    pub(super) fn log(&self) -> FaultLog {
        let mut log = self.log.clone();
        log.per_call = Call::ALL
            .iter()
            .zip(self.counts)
            .filter(|&(_, n)| n > 0)
            .map(|(&call, n)| (call, n))
            .collect();
        log.sites = self
            .sites
            .iter()
            .map(|&(_, call, at)| (call, format!("{}:{}", at.file(), at.line())))
            .collect();
        log
    }

    /// Counts a call of `call` made at `at`, and fails it when the rule
    /// says so.
    pub(super) fn check(
        &mut self,
        call: Call,
        at: &'static Location<'static>,
    ) -> Result<(), BackendError> {
        let index = self.log.calls;
        let count = &mut self.counts[call as usize];
        let nth = *count;
        *count += 1;
        self.log.calls += 1;
        let key = (std::ptr::from_ref(at) as usize, call);
        if let Err(i) = self.sites.binary_search_by(|&(a, c, _)| (a, c).cmp(&key)) {
            self.sites.insert(i, (key.0, call, at));
        }
        let fail = match &mut self.faults.rule {
            Rule::None => false,
            Rule::At(n) => *n == index,
            Rule::Nth(c, n) => *c == call && *n == nth,
            Rule::Seeded { state, one_in } => splitmix(state) % *one_in == 0,
        };
        if !fail {
            return Ok(());
        }
        let site = format!("{}:{}", at.file(), at.line());
        self.log.injected.push((index, call, site));
        Err(BackendError::Injected {
            call: call.name(),
            index,
        })
    }
}

/// SplitMix64: the next value of a deterministic sequence.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
