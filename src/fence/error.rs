//! What the fence's operations report, one error type per operation
//! ([`ReplayError`], [`ConsumeError`], [`WaitError`], [`TraceError`]),
//! each built from shared parts with `#[from]`: a backend call that failed
//! ([`BackendFailure`]), a capturing stream refused ([`StreamCapturing`]), a
//! runner the plan does not know ([`UnknownRunner`]); the operations
//! themselves ([`Operation`]) and the fence's counters ([`FenceStats`]).

use std::convert::Infallible;

pub use crate::failure::{BackendFailure, Operation};
use crate::view::Misuse;
use crate::vocab::{BucketId, HandoffId, RunnerId};

/// An operation of the fence was asked for on a stream that is capturing
/// (inside a `stream_capture` closure of this or another plan, or the
/// program's own capture): its waits, launch and records would be recorded
/// into that graph instead of running, outside the fence. Nothing ran,
/// and the fence is as before. Every operation that uses the plan on a
/// stream refuses a capturing stream with this one error. Most ask the
/// backend first and enqueue nothing; a replay asks nothing on its hot
/// path and is refused at its launch (the driver refuses a graph launch
/// on a capturing stream), so on a stream the program captures by its own
/// means, the replay's waits may have gone into that capture first (which
/// the driver may then invalidate).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{op}: the stream is capturing, so the work would go into that graph instead of running; use a stream that is not capturing")]
pub struct StreamCapturing {
    /// The operation refused.
    pub op: Operation,
}

/// A runner the plan does not know was named
/// ([`Replayable::views`](crate::Replayable::views),
/// [`Replayable::temporaries`](crate::Replayable::temporaries)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{runner} was not discovered, so the plan has nothing for it")]
pub struct UnknownRunner {
    /// The runner.
    pub runner: RunnerId,
}

/// Why the fence could not be entered on a stream: the one entry's
/// refusal, taken by every operation's error with `?`.
#[derive(Debug)]
pub(crate) enum Refused {
    /// The stream is capturing.
    Capturing(StreamCapturing),
    /// Asking whether it captures failed.
    Failed(BackendFailure),
}

/// `From` the shared parts every operation on a stream can fail with.
macro_rules! from_parts {
    ($($ty:ident $(<$e:ident>)?),*) => {$(
        impl$(<$e>)? From<Refused> for $ty$(<$e>)? {
            fn from(refused: Refused) -> Self {
                match refused {
                    Refused::Capturing(c) => c.into(),
                    Refused::Failed(f) => f.into(),
                }
            }
        }

        impl$(<$e>)? From<UnknownRunner> for $ty$(<$e>)? {
            fn from(UnknownRunner { runner }: UnknownRunner) -> Self {
                Self::UnknownRunner { runner }
            }
        }
    )*};
}
from_parts!(ReplayError, ConsumeError<E>, WaitError);

/// What [`Replayable::replay`](crate::Replayable::replay) (and
/// `replay_unfenced`) returns on failure.
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
    /// The runner's bucket was released: its graphs are gone (the budget
    /// made room for another bucket). Capture it again with
    /// [`Replayable::recapture_bucket`](crate::Replayable::recapture_bucket).
    #[error("{runner} is in {bucket}, whose graphs were released to stay within the bucket budget; capture the bucket again first")]
    Released {
        /// The runner.
        runner: RunnerId,
        /// Its bucket.
        bucket: BucketId,
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
    /// The stream is capturing; nothing was enqueued.
    #[error(transparent)]
    StreamCapturing(#[from] StreamCapturing),
    /// A backend call failed (a wait, the launch, a record).
    #[error(transparent)]
    Backend(#[from] BackendFailure),
}

/// What [`Replayable::consume`](crate::Replayable::consume),
/// `consume_mut` and `consume_many` (and their
/// [`StepBuilder`](crate::StepBuilder) forms) return on failure: the
/// crate's checks, or the work closure's own error (`E`), unchanged. Either
/// way, whatever the closure enqueued is fenced. `ConsumeError` with no
/// parameter (`E = Infallible`) is the checks alone, as
/// [`Error::Consume`](crate::Error::Consume) holds them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumeError<E = Infallible> {
    /// The runner was never discovered.
    #[error("{runner} was not discovered, so the plan has no graph for it")]
    UnknownRunner {
        /// The runner.
        runner: RunnerId,
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
        bucket: BucketId,
        /// The first runner given of another bucket.
        other: RunnerId,
        /// That runner's bucket.
        other_bucket: BucketId,
    },
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
    /// A consumer used a view where the fence cannot order it (another
    /// stream than the consumer's, say); the use was refused.
    #[error("the consumer of {runner} used a view out of its scope: {reason}")]
    ViewOutOfScope {
        /// The runner.
        runner: RunnerId,
        /// Which view, and where it was used.
        reason: Misuse,
    },
    /// The stream is capturing; `work` was not called.
    #[error(transparent)]
    StreamCapturing(#[from] StreamCapturing),
    /// A backend call failed (a wait, a record, or, in a step schedule,
    /// capturing the consumer's work).
    #[error(transparent)]
    Backend(#[from] BackendFailure),
    /// The work closure failed.
    #[error("the consumer failed: {0}")]
    Work(E),
}

impl<E> ConsumeError<E> {
    /// The crate's check as `Ok`, or the work closure's own error as `Err`.
    pub fn into_check(self) -> Result<ConsumeError, E> {
        self.split()
    }

    /// The crate's check as a consumer error of any work type, or the work
    /// closure's own error.
    fn split<F>(self) -> Result<ConsumeError<F>, E> {
        Ok(match self {
            ConsumeError::UnknownRunner { runner } => ConsumeError::UnknownRunner { runner },
            ConsumeError::NoRunners => ConsumeError::NoRunners,
            ConsumeError::CrossBucket {
                runner,
                bucket,
                other,
                other_bucket,
            } => ConsumeError::CrossBucket {
                runner,
                bucket,
                other,
                other_bucket,
            },
            ConsumeError::NotReplayed { runner } => ConsumeError::NotReplayed { runner },
            ConsumeError::Overwritten { runner, by } => ConsumeError::Overwritten { runner, by },
            ConsumeError::ViewOutOfScope { runner, reason } => {
                ConsumeError::ViewOutOfScope { runner, reason }
            }
            ConsumeError::StreamCapturing(c) => ConsumeError::StreamCapturing(c),
            ConsumeError::Backend(b) => ConsumeError::Backend(b),
            ConsumeError::Work(e) => return Err(e),
        })
    }
}

impl ConsumeError {
    /// The check as the error of a consumer whose closure fails with `E`.
    pub(crate) fn with_work<E>(self) -> ConsumeError<E> {
        match self.split() {
            Ok(check) => check,
            Err(never) => match never {},
        }
    }
}

/// What the waits return on failure: [`Replayable::wait_for`](crate::Replayable::wait_for),
/// [`Replayable::wait_all`](crate::Replayable::wait_all),
/// [`StepGraph::wait_all`](crate::StepGraph::wait_all) and
/// [`Replayable::wait_kept`](crate::Replayable::wait_kept).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WaitError {
    /// The runner was never discovered.
    #[error("{runner} was not discovered, so the plan has no graph for it")]
    UnknownRunner {
        /// The runner.
        runner: RunnerId,
    },
    /// A kept step graph was launched on (or waited for through) another
    /// plan than the one it was built for.
    #[error("this kept step graph belongs to another plan: launch it with the Replayable it was built from")]
    ForeignStep,
    /// The stream is capturing; nothing was enqueued.
    #[error(transparent)]
    StreamCapturing(#[from] StreamCapturing),
    /// A backend call failed (a record, a wait).
    #[error(transparent)]
    Backend(#[from] BackendFailure),
}

/// What [`Replayable::start_trace`](crate::Replayable::start_trace) and
/// [`Replayable::finish_trace`](crate::Replayable::finish_trace) return on
/// failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    /// [`Replayable::finish_trace`](crate::Replayable::finish_trace) was
    /// called with no trace started.
    #[error("no trace was started: call start_trace before the work to trace")]
    NoTrace,
    /// [`Replayable::start_trace_with_capacity`](crate::Replayable::start_trace_with_capacity)
    /// was asked to create the marks of more uses up front than it
    /// creates at once; a trace that outgrows its capacity creates more
    /// marks as it goes, so ask for fewer.
    #[error("a trace creates the marks of at most {max} uses up front, not {uses}: ask for fewer (a trace creates more marks as it goes)")]
    CapacityTooLarge {
        /// The uses asked for.
        uses: usize,
        /// The most it creates up front.
        max: usize,
    },
    /// A timing mark of the trace failed (taking it, or reading its
    /// time); the fenced work itself was not affected.
    #[error(transparent)]
    Backend(#[from] BackendFailure),
}

/// Counters of the fence's work since sealing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FenceStats {
    /// Graph launches through [`Replayable::replay`](crate::Replayable::replay).
    pub replays: u64,
    /// Consumers run through [`Replayable::consume`](crate::Replayable::consume),
    /// [`consume_mut`](crate::Replayable::consume_mut) and
    /// [`consume_many`](crate::Replayable::consume_many): one per call whose
    /// work succeeded, whatever its runners (a runner that requests nothing
    /// included, as [`replays`](Self::replays) counts its launches).
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
    /// on another stream and 403 skipped (stream order implied them), 2100
    /// event records, 200 step graph launches` (the skipped waits are not
    /// among the waits issued).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} replays, {} consumers, {} waits on another stream and {} skipped (stream order \
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
