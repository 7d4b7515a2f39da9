//! The crate error: each phase's own error, joined with `#[from]` so `?`
//! works across phases. Each phase's operations return that phase's error
//! ([`DiscoveryError`], [`PlanError`], [`CaptureError`], [`ReplayError`],
//! [`BackendError`]); closures keep the caller's own error type
//! ([`StreamCaptureError`], [`ConsumeError`]).

use crate::backend::{Backend, BackendError};
use crate::capture::{CaptureError, StreamCaptureError};
use crate::discover::DiscoveryError;
use crate::plan::PlanError;
use crate::replay::{ConsumeError, ReplayError, SealError};

/// Shorthand for `Result<T, replay_arena::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Any error of this crate, or of a work closure passed through it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Discovery (or building the config) failed.
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
    /// Planning failed.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// A capture, or sealing, failed.
    #[error(transparent)]
    Capture(#[from] CaptureError),
    /// A replay or consumer failed.
    #[error(transparent)]
    Replay(#[from] ReplayError),
    /// A backend call failed (allocation, device setup).
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The caller's own work closure failed.
    #[error("{0}")]
    Work(Box<dyn std::error::Error + Send + Sync>),
}

impl Error {
    /// The caller's closure error as `Error`: an `Error` passed back through
    /// a closure stays itself instead of nesting.
    fn work<E: Into<Box<dyn std::error::Error + Send + Sync>>>(e: E) -> Error {
        let boxed: Box<dyn std::error::Error + Send + Sync> = e.into();
        match boxed.downcast::<Error>() {
            Ok(inner) => *inner,
            Err(other) => Error::Work(other),
        }
    }
}

impl<E: Into<Box<dyn std::error::Error + Send + Sync>>> From<StreamCaptureError<E>> for Error {
    fn from(e: StreamCaptureError<E>) -> Error {
        match e {
            StreamCaptureError::Capture(c) => Error::Capture(c),
            StreamCaptureError::Work(w) => Error::work(w),
        }
    }
}

impl<E: Into<Box<dyn std::error::Error + Send + Sync>>> From<ConsumeError<E>> for Error {
    fn from(e: ConsumeError<E>) -> Error {
        match e {
            ConsumeError::Replay(r) => Error::Replay(r),
            ConsumeError::Work(w) => Error::work(w),
        }
    }
}

impl<B: Backend> From<SealError<B>> for Error {
    /// Keeps the reason; the `Capturing` inside is dropped (freed).
    fn from(e: SealError<B>) -> Error {
        Error::Capture(e.error)
    }
}
