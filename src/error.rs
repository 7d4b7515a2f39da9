//! Every check that fails returns one structured [`Error`] naming what was
//! wrong, where, and what was expected.

use crate::vocab::{DType, GroupId, Key, Request, RunnerId};

/// Shorthand for `Result<T, replay_arena::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong, one variant per failed check.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // ---- discovery -------------------------------------------------------
    /// A runner was armed for discovery a second time.
    #[error("{runner} was armed twice for discovery; each runner records its requests once, in one eager backward")]
    RunnerArmedTwice {
        /// The runner armed again.
        runner: RunnerId,
    },
    /// A request asked for zero elements.
    #[error("{runner} requested zero elements of {key}; every request needs at least one element")]
    ZeroElements {
        /// The recording runner.
        runner: RunnerId,
        /// The request's key.
        key: Key,
    },
    /// A request named a symmetric group that is not registered in the config.
    #[error("{runner} requested symmetric memory of {group}, which is not registered in the PlanConfig (registered: {registered:?})")]
    UnknownGroup {
        /// The recording runner.
        runner: RunnerId,
        /// The unknown group.
        group: GroupId,
        /// The groups that are registered.
        registered: Vec<GroupId>,
    },
    /// A size computation overflowed `u64`.
    #[error("{what} of {runner} for {key} overflows 64 bits ({elements} elements of {dtype})")]
    SizeOverflow {
        /// The runner whose request or capacity overflowed.
        runner: RunnerId,
        /// The key.
        key: Key,
        /// Which size overflowed.
        what: &'static str,
        /// Elements of the request that tipped it over.
        elements: u64,
        /// Its dtype.
        dtype: DType,
    },
    /// An arena's size overflowed `u64` while planning.
    #[error("the arena for {key} overflows 64 bits while planning")]
    ArenaOverflow {
        /// The key whose arena overflowed.
        key: Key,
    },
    /// A policy asked for zero generations (or an overlap depth of zero).
    #[error("policy {policy} asks for zero generations; at least one is needed")]
    ZeroGenerations {
        /// The policy as written.
        policy: String,
    },
    /// The same group was registered twice in a [`PlanConfig`](crate::PlanConfig).
    #[error("{group} is registered twice in the PlanConfig")]
    GroupRegisteredTwice {
        /// The group.
        group: GroupId,
    },

    // ---- capture ---------------------------------------------------------
    /// A capture was opened for a runner the plan does not know.
    #[error("{runner} was not discovered, so the plan has no storage for it")]
    UnknownRunner {
        /// The runner.
        runner: RunnerId,
    },
    /// A capture was opened for a runner whose capture already closed.
    #[error("{runner} was already captured ({state}); re-plan to capture it again")]
    AlreadyCaptured {
        /// The runner.
        runner: RunnerId,
        /// "finished" or "failed: reason".
        state: String,
    },
    /// A capture-time request would go past the runner's discovered capacity.
    #[error("{runner} requested {requested} bytes of {key} with {consumed} of {capacity} bytes already consumed (request #{index}: {request})")]
    CapacityExceeded {
        /// The runner.
        runner: RunnerId,
        /// The key.
        key: Key,
        /// Position of the request in the runner's capture.
        index: usize,
        /// The request.
        request: Request,
        /// Aligned bytes requested.
        requested: u64,
        /// Bytes of this key consumed before this request.
        consumed: u64,
        /// The runner's capacity for this key.
        capacity: u64,
    },
    /// A capture-time request differs from the one discovery recorded at the
    /// same position.
    #[error("{runner} request #{index} is {request} but discovery recorded {expected} ({}: requested {requested} bytes, consumed {consumed} of {capacity})", .request.key())]
    RequestMismatch {
        /// The runner.
        runner: RunnerId,
        /// Position of the request.
        index: usize,
        /// What capture asked for (its key is the one sizes refer to).
        request: Request,
        /// What discovery recorded at this position.
        expected: Request,
        /// Aligned bytes requested.
        requested: u64,
        /// Bytes of this key consumed before this request.
        consumed: u64,
        /// The runner's capacity for this key.
        capacity: u64,
    },
    /// Closing a capture found that the runner did not consume exactly its
    /// discovered capacity.
    #[error("{runner} consumed {consumed}/{capacity} bytes of {key}")]
    ConsumptionMismatch {
        /// The runner.
        runner: RunnerId,
        /// The key.
        key: Key,
        /// Bytes consumed during capture.
        consumed: u64,
        /// Bytes discovered.
        capacity: u64,
    },
    /// The user's capture closure failed; the stream capture was ended and
    /// discarded.
    #[error("capture of {runner} failed and was discarded: {reason}")]
    CaptureFailed {
        /// The runner.
        runner: RunnerId,
        /// The closure's error, formatted.
        reason: String,
    },
    /// A captured graph was rejected.
    #[error("the graph captured for {runner} was rejected: {reason}")]
    GraphRejected {
        /// The runner.
        runner: RunnerId,
        /// Why.
        reason: String,
    },
    /// `seal` found runners whose capture did not finish.
    #[error("cannot seal: {}", describe_unfinished(.runners))]
    Unfinished {
        /// Each runner that did not finish, with its state.
        runners: Vec<(RunnerId, String)>,
    },

    // ---- replay ----------------------------------------------------------
    /// A replay named a runner that has no captured graph.
    #[error("{runner} has no captured graph to replay")]
    NoGraph {
        /// The runner.
        runner: RunnerId,
    },

    /// Work submitted through [`Replayable::consume`](crate::Replayable::consume) failed to enqueue.
    #[error("consumer of {runner}'s views failed: {reason}")]
    ConsumerFailed {
        /// The runner whose views were consumed.
        runner: RunnerId,
        /// The error, formatted.
        reason: String,
    },

    // ---- backends --------------------------------------------------------
    /// The backend is not usable on this machine (no driver, no device).
    #[error("backend unavailable: {reason}")]
    BackendUnavailable {
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
    /// A backend call failed.
    #[error("{op} failed: {detail}")]
    Backend {
        /// The call.
        op: &'static str,
        /// The backend's own error, formatted by this crate.
        detail: String,
    },
    /// A symmetric domain names a group the backend has no communicator for.
    #[error("{group} has no communicator registered with the backend")]
    NoCommunicator {
        /// The group.
        group: GroupId,
    },
    /// A view or buffer was used where it does not belong.
    #[error("invalid use of a view: {reason}")]
    InvalidView {
        /// What was wrong.
        reason: String,
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

fn describe_unfinished(runners: &[(RunnerId, String)]) -> String {
    runners
        .iter()
        .map(|(r, s)| format!("{r} {s}"))
        .collect::<Vec<_>>()
        .join(", ")
}
