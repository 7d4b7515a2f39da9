//! What the fence reports: [`ReplayError`], the operations it refuses on
//! a capturing stream ([`Operation`]), and its counters ([`FenceStats`]).

use crate::backend::BackendError;
use crate::view::Misuse;
use crate::vocab::{HandoffId, RunnerId};

/// An operation of the fence on a stream: what
/// [`ReplayError::StreamCapturing`] refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Operation {
    /// [`Replayable::replay`](crate::Replayable::replay) of the runner.
    Replay(RunnerId),
    /// A consumer of the runner ([`Replayable::consume`](crate::Replayable::consume),
    /// `consume_mut`, `consume_many`: its first runner).
    Consume(RunnerId),
    /// [`Replayable::wait_for`](crate::Replayable::wait_for) the runner.
    WaitFor(RunnerId),
    /// [`Replayable::wait_all`](crate::Replayable::wait_all).
    WaitAll,
    /// A launch of a step graph ([`StepGraph::launch`](crate::StepGraph::launch),
    /// [`Replayable::launch_kept`](crate::Replayable::launch_kept)).
    StepLaunch,
    /// A wait for a step graph's latest launch
    /// ([`StepGraph::wait_all`](crate::StepGraph::wait_all),
    /// [`Replayable::wait_kept`](crate::Replayable::wait_kept)).
    StepWait,
}

impl Operation {
    /// The runner the operation is about, if one.
    pub fn runner(self) -> Option<RunnerId> {
        match self {
            Operation::Replay(r) | Operation::Consume(r) | Operation::WaitFor(r) => Some(r),
            Operation::WaitAll | Operation::StepLaunch | Operation::StepWait => None,
        }
    }

    /// The error for a backend call of this operation that failed:
    /// [`ReplayError::Backend`] naming its runner, or
    /// [`ReplayError::Wait`] for one with none.
    pub(crate) fn failed(self, error: BackendError) -> ReplayError {
        match self.runner() {
            Some(runner) => ReplayError::Backend { runner, error },
            None => ReplayError::Wait(error),
        }
    }
}

impl std::fmt::Display for Operation {
    /// `replay of runner 3`, `launch of a step graph`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Operation::Replay(r) => write!(f, "replay of {r}"),
            Operation::Consume(r) => write!(f, "consumer of {r}"),
            Operation::WaitFor(r) => write!(f, "wait for {r}"),
            Operation::WaitAll => f.write_str("wait for everything fenced"),
            Operation::StepLaunch => f.write_str("launch of a step graph"),
            Operation::StepWait => f.write_str("wait for a step graph"),
        }
    }
}

/// A failed check or backend call while replaying.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// The runner was never discovered.
    #[error("{runner} was not discovered, so the plan has no graph for it")]
    UnknownRunner {
        /// The runner.
        runner: RunnerId,
    },
    /// The runner has no captured graph (a runner that uses no buffers and
    /// was not captured).
    #[error("{runner} has no captured graph to replay")]
    NoGraph {
        /// The runner.
        runner: RunnerId,
    },
    /// A step schedule replays a runner whose graph allocates temporaries
    /// (graph memory nodes): the driver copies no such graph into a step
    /// graph, so a step graph moves in a *step copy* of it instead, and
    /// none is left.
    #[error("{runner}'s graph allocates temporaries ({allocations} allocation node(s)), which the driver does not copy into a step graph, and {}", no_copy_hint(*.captured))]
    NoStepCopy {
        /// The runner.
        runner: RunnerId,
        /// Its graph's allocation nodes.
        allocations: usize,
        /// Step copies its capture made (0: it was captured with
        /// `stream_capture`, not `stream_capture_repeatable`).
        captured: usize,
    },
    /// A kept step graph was launched on (or waited for through) another
    /// plan than the one it was built for.
    #[error("this kept step graph belongs to another plan: launch it with the Replayable it was built from")]
    ForeignStep,
    /// A consumer asked for a runner's bytes before the runner was replayed.
    #[error("{runner} was never replayed, so its views hold nothing to consume")]
    NotReplayed {
        /// The runner.
        runner: RunnerId,
    },
    /// A consumer asked for a runner's bytes after another runner claimed
    /// some of them.
    #[error("{runner}'s bytes were overwritten by {by}, replayed since; consume a runner's views before the next runner that shares its arena replays")]
    Overwritten {
        /// The runner whose views were asked for.
        runner: RunnerId,
        /// The runner that claimed its bytes since.
        by: RunnerId,
    },
    /// The backend failed while replaying or consuming a runner.
    #[error("{runner}: {error}")]
    Backend {
        /// The runner.
        runner: RunnerId,
        /// The backend's error.
        error: BackendError,
    },
    /// A consumer used a view where the fence cannot order it (another
    /// stream than the consumer's, say); the use was refused.
    #[error("the consumer of {runner} used a view out of its scope: {reason}")]
    ViewOutOfScope {
        /// The runner.
        runner: RunnerId,
        /// Which view, and where it was used.
        reason: Misuse,
    },
    /// An operation of the fence was asked for on a stream that is
    /// capturing (inside a `stream_capture` closure of this or another
    /// plan, or the program's own capture): its waits, launch and records
    /// would be recorded into that graph instead of running, outside the
    /// fence. Nothing was enqueued. Every operation that uses the plan on a
    /// stream refuses a capturing stream with this one variant.
    #[error("{op}: the stream is capturing, so the work would go into that graph instead of running; use a stream that is not capturing")]
    StreamCapturing {
        /// The operation refused.
        op: Operation,
    },
    /// A runner that reads a handoff was replayed before the handoff's
    /// writer was ever replayed.
    #[error("{reader} reads {handoff}, which {writer} writes, and {writer} was never replayed; replay runners in the order discovery armed them")]
    HandoffNotWritten {
        /// The reading runner.
        reader: RunnerId,
        /// The handoff.
        handoff: HandoffId,
        /// Its writer.
        writer: RunnerId,
    },
    /// A runner that reads a handoff was replayed after another handoff
    /// that shares its bytes (their lifetimes do not meet in capture order,
    /// so the plan let them share) was written since: the data is gone.
    #[error("{reader} reads {handoff}, but {by} wrote bytes of another handoff over it since {writer} wrote it; replay runners in the order discovery armed them")]
    HandoffOverwritten {
        /// The reading runner.
        reader: RunnerId,
        /// The handoff.
        handoff: HandoffId,
        /// Its writer.
        writer: RunnerId,
        /// The runner whose handoff took the bytes since.
        by: RunnerId,
    },
    /// A runner that reads a handoff was replayed again before the
    /// handoff's writer was: it would read the write it already read (its
    /// writer comes first in the order the plan assumed).
    #[error("{reader} already read {handoff}'s latest write; replay its writer {writer} first (runners replay in the order discovery armed them)")]
    HandoffAlreadyRead {
        /// The reading runner.
        reader: RunnerId,
        /// The handoff.
        handoff: HandoffId,
        /// Its writer.
        writer: RunnerId,
    },
    /// A runner with staged inputs ([`Purpose::Input`](crate::Purpose::Input))
    /// was replayed while its bytes were not its own: never staged, or
    /// another runner (or bucket) took them since it was staged or last
    /// replayed, so its graph would read that runner's bytes as its input.
    #[error("{runner} reads inputs the program stages, and {}; stage them with consume_mut before this replay", match .by { Some(by) => format!("{by} overwrote its bytes since"), None => "they are not staged (never written, or the latest write failed)".to_string() })]
    InputNotStaged {
        /// The runner.
        runner: RunnerId,
        /// Who took its bytes (`None`: never staged nor replayed).
        by: Option<RunnerId>,
    },
    /// `consume_many` was given no runner.
    #[error("consume_many was given no runner: a consumer reads at least one runner's views")]
    NoRunners,
    /// `consume_many` was given runners of different shape buckets: their
    /// bytes may be the same bytes, so no replay leaves both to read.
    #[error("consume_many was given {runner} of {bucket} and {other} of {other_bucket}; one consumer reads the runners of one bucket")]
    CrossBucket {
        /// The first runner given.
        runner: RunnerId,
        /// Its bucket.
        bucket: crate::vocab::BucketId,
        /// The first runner given of another bucket.
        other: RunnerId,
        /// That runner's bucket.
        other_bucket: crate::vocab::BucketId,
    },
    /// Waiting for fenced work (synchronize, teardown) failed.
    #[error("waiting for the plan's work failed: {0}")]
    Wait(BackendError),
    /// [`Replayable::finish_trace`](crate::Replayable::finish_trace) was
    /// called with no trace started.
    #[error("no trace was started: call start_trace before the work to trace")]
    NoTrace,
    /// A timing mark of the trace failed (taking it, or reading its time);
    /// the fenced work itself was not affected.
    #[error("a timing mark of the trace failed: {0}")]
    TraceMark(BackendError),
}

/// Counters of the fence's work since sealing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FenceStats {
    /// Graph launches through [`Replayable::replay`](crate::Replayable::replay).
    pub replays: u64,
    /// Consumers run through [`Replayable::consume`](crate::Replayable::consume).
    pub consumers: u64,
    /// Event waits issued (a stream waited for another stream).
    pub waits: u64,
    /// Waits not issued because stream order already implied them (the
    /// runner waited for completes on the same stream): free ordering.
    pub waits_skipped: u64,
    /// Event records issued (only for waits on another stream).
    pub event_records: u64,
    /// Launches of step graphs of the plan ([`StepGraph`](crate::StepGraph)),
    /// counted at each launch.
    pub step_launches: u64,
}

impl std::fmt::Display for FenceStats {
    /// One line a person reads: `1000 replays, 800 consumers, 2001 waits
    /// on another stream (403 skipped: stream order implied them), 2100
    /// event records, 200 step graph launches`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} replays, {} consumers, {} waits on another stream ({} skipped: stream order \
             implied them), {} event records, {} step graph launches",
            self.replays,
            self.consumers,
            self.waits,
            self.waits_skipped,
            self.event_records,
            self.step_launches
        )
    }
}

/// The fix [`ReplayError::NoStepCopy`] names.
fn no_copy_hint(captured: usize) -> &'static str {
    if captured == 0 {
        "its capture kept no step copy to move in: capture it with \
         RunnerCapture::stream_capture_repeatable (and step_copies of at least 1), which runs its \
         work again into copies"
    } else {
        "its step copies are used up (each serves one replay in one step graph, two in \
         overlapping ones; this schedule or an earlier step graph took them): replan to capture \
         new ones, with more step_copies"
    }
}
