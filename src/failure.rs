//! A backend call that failed, the one spelling of a backend failure in
//! every phase's error: [`BackendFailure`] names the [`Operation`] it was
//! part of (allocating a plan, capturing a runner, replaying it, ...), the
//! runner when there is one, and the backend's own [`BackendError`]. Below
//! `capture` and `fence`, so both report it.

use crate::backend::BackendError;
use crate::vocab::{BucketId, RunnerId};

/// An operation of a plan: what a [`StreamCapturing`](crate::StreamCapturing) refused, or what a
/// [`BackendFailure`] failed in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Operation {
    /// [`Planned::allocate`](crate::Planned::allocate): the plan's arenas
    /// and events.
    Allocate,
    /// The capture of the runner ([`Capturing::capture`](crate::Capturing::capture),
    /// its `stream_capture`, `ready` and `finish`).
    Capture(RunnerId),
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
    /// Building a step graph ([`StepBuilder::build`](crate::StepBuilder::build),
    /// `build_overlapping`).
    StepBuild,
    /// [`Replayable::report`](crate::Replayable::report) asking the backend
    /// for its graph memory.
    Report,
    /// [`Replayable::trim_graph_memory`](crate::Replayable::trim_graph_memory).
    TrimGraphMemory,
    /// [`Replayable::synchronize`](crate::Replayable::synchronize).
    Synchronize,
    /// [`Replayable::replan`](crate::Replayable::replan) waiting for the
    /// plan's work.
    Replan,
    /// A timing mark of a trace ([`Replayable::start_trace`](crate::Replayable::start_trace),
    /// [`Replayable::finish_trace`](crate::Replayable::finish_trace)).
    TraceMark,
    /// Sealing a bucket into a sealed plan
    /// ([`BucketCapture::seal`](crate::BucketCapture::seal)): its runners'
    /// events.
    Join(BucketId),
    /// Asking whether the bucket's work is done, before its graphs are
    /// released ([`Replayable::release_bucket`](crate::Replayable::release_bucket),
    /// the budget).
    Release(BucketId),
}

impl Operation {
    /// The runner the operation is about, if one.
    pub fn runner(self) -> Option<RunnerId> {
        match self {
            Operation::Replay(r)
            | Operation::Consume(r)
            | Operation::WaitFor(r)
            | Operation::Capture(r) => Some(r),
            _ => None,
        }
    }

    /// The backend failure of this operation, naming its runner if it has
    /// one.
    pub(crate) fn failed(self, error: BackendError) -> BackendFailure {
        BackendFailure {
            op: self,
            runner: self.runner(),
            error,
        }
    }
}

impl std::fmt::Display for Operation {
    /// `replay of runner 3`, `launch of a step graph`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Operation::Allocate => f.write_str("allocation of the plan's arenas and events"),
            Operation::Capture(r) => write!(f, "capture of {r}"),
            Operation::Replay(r) => write!(f, "replay of {r}"),
            Operation::Consume(r) => write!(f, "consumer of {r}"),
            Operation::WaitFor(r) => write!(f, "wait for {r}"),
            Operation::WaitAll => f.write_str("wait for everything fenced"),
            Operation::StepLaunch => f.write_str("launch of a step graph"),
            Operation::StepWait => f.write_str("wait for a step graph"),
            Operation::StepBuild => f.write_str("build of a step graph"),
            Operation::Report => f.write_str("report of the graphs' memory"),
            Operation::TrimGraphMemory => f.write_str("trim of graph memory"),
            Operation::Synchronize => f.write_str("synchronize"),
            Operation::Replan => f.write_str("wait for the plan's work before replanning"),
            Operation::TraceMark => f.write_str("timing mark of a trace"),
            Operation::Join(b) => write!(f, "join of {b}"),
            Operation::Release(b) => write!(f, "release of {b}"),
        }
    }
}

/// A backend call that failed: the one spelling of a backend failure in
/// every operation's error. The backend's error keeps the driver's own code
/// ([`BackendError::Driver`](crate::BackendError) and its kin).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{op}{}: {error}", match .runner { Some(r) if op.runner() != Some(*r) => format!(" ({r})"), _ => String::new() })]
pub struct BackendFailure {
    /// The operation the call was part of.
    pub op: Operation,
    /// The runner it was for, if one (for a step graph's build, the runner
    /// whose node failed).
    pub runner: Option<RunnerId>,
    /// The backend's error (printed in this error's message, so not its
    /// `source()`: a chain would print it twice).
    pub error: BackendError,
}

impl BackendFailure {
    /// The failure of a backend call in `op`, for `runner` if one.
    pub fn new(op: Operation, runner: Option<RunnerId>, error: BackendError) -> BackendFailure {
        BackendFailure { op, runner, error }
    }

    /// The failure of a call for `runner` in `op`.
    pub(crate) fn of(op: Operation, runner: RunnerId, error: BackendError) -> BackendFailure {
        BackendFailure {
            op,
            runner: Some(runner),
            error,
        }
    }
}
