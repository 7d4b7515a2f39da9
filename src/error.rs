//! The crate error: every operation's own error, joined with `#[from]` so
//! `?` works across operations and phases. Discovery returns
//! [`DiscoveryError`], planning [`PlanError`], allocation [`BackendFailure`]
//! (inside [`AllocateFailed`](crate::AllocateFailed)), capture
//! [`CaptureError`]; on a sealed plan each operation has its own:
//! [`ReplayError`], [`ConsumeError`], [`WaitError`], [`TraceError`],
//! [`StepError`] (building a step graph), [`StepLaunchError`], and
//! [`BackendFailure`] or [`UnknownRunner`] alone where nothing else can
//! fail. Closures keep the caller's own error type ([`StreamCaptureError`],
//! [`ConsumeError`]).
//!
//! Every one of them is `Send + Sync + 'static` (so `?` takes it into
//! `anyhow::Error`); [`from_errors!`](crate::from_errors) lets a program's
//! own error type take all of them with `?`.

use crate::backend::BackendError;
use crate::capture::{CaptureError, StreamCaptureError};
use crate::discover::DiscoveryError;
use crate::failed::Failed;
use crate::plan::PlanError;
use crate::replay::{
    BackendFailure, ConsumeError, ReplayError, TraceError, UnknownRunner, WaitError,
};
use crate::step::{StepError, StepLaunchError};
use crate::view::SliceError;
use crate::vocab::{HandoffId, HandoffTicket, Request, RunnerId};

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
    /// A replay failed.
    #[error(transparent)]
    Replay(#[from] ReplayError),
    /// A consumer's check or backend call failed (its closure's own error
    /// is [`Error::Work`]).
    #[error(transparent)]
    Consume(ConsumeError),
    /// A wait for the plan's work failed.
    #[error(transparent)]
    Wait(#[from] WaitError),
    /// A trace could not be started or finished.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// A step graph could not be built.
    #[error(transparent)]
    Step(#[from] StepError),
    /// A step graph could not be launched.
    #[error(transparent)]
    StepLaunch(#[from] StepLaunchError),
    /// A bucket could not join a sealed plan, or be captured again.
    #[error(transparent)]
    Join(#[from] crate::buckets::JoinError),
    /// A bucket operation (the budget, a release) failed.
    #[error(transparent)]
    Bucket(#[from] crate::buckets::BucketError),
    /// A backend call of an operation with no other failure failed
    /// (`report`, `synchronize`, `replan`, ...).
    #[error(transparent)]
    BackendFailure(#[from] BackendFailure),
    /// A runner the plan does not know was named (`views`, `temporaries`).
    #[error(transparent)]
    UnknownRunner(#[from] UnknownRunner),
    /// A backend call outside a plan's operations failed (device setup, a
    /// cudarc call `?`'d in a closure).
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// A sub-view outside its view.
    #[error(transparent)]
    Slice(#[from] SliceError),
    /// A [`BufferSource`](crate::BufferSource) handoff call was misused.
    #[error(transparent)]
    Source(#[from] SourceError),
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
        match e.into_check() {
            Ok(check) => Error::Consume(check),
            Err(work) => Error::work(work),
        }
    }
}

#[cfg(feature = "cuda")]
#[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
impl From<cudarc::driver::DriverError> for Error {
    /// A cudarc driver call's failure, `?`'d inside a closure or function
    /// returning this crate's `Result`: a [`BackendError::Driver`] keeping
    /// the raw code.
    fn from(error: cudarc::driver::DriverError) -> Error {
        Error::Backend(error.into())
    }
}

#[cfg(replay_arena_nccl)]
#[cfg_attr(docsrs, doc(cfg(feature = "nccl")))]
impl From<cudarc::nccl::result::NcclError> for Error {
    /// A cudarc NCCL call's failure: a [`BackendError::Nccl`] keeping the
    /// raw code.
    fn from(error: cudarc::nccl::result::NcclError) -> Error {
        Error::Backend(error.into())
    }
}

#[cfg(feature = "cublas")]
#[cfg_attr(docsrs, doc(cfg(feature = "cublas")))]
impl From<cudarc::cublas::result::CublasError> for Error {
    /// A cudarc cuBLAS call's failure: a [`BackendError::Cublas`] keeping
    /// the raw status.
    fn from(error: cudarc::cublas::result::CublasError) -> Error {
        Error::Backend(error.into())
    }
}

impl<E, T> From<Failed<E, T>> for Error
where
    Error: From<E>,
{
    /// Keeps the reason; the input inside (a discovery, a plan, a
    /// `Capturing`, whose arenas are freed) is dropped.
    fn from(e: Failed<E, T>) -> Error {
        Error::from(e.into_error())
    }
}

/// Lets a program's own error type take every error of this crate with `?`.
///
/// The type must already convert from [`Error`] (a thiserror
/// `#[error(transparent)] Arena(#[from] replay_arena::Error)` variant does
/// it). `?` applies one `From`, and only the program may implement `From`
/// for its own type, so this macro writes the rest:
///
/// - each operation's error ([`DiscoveryError`](crate::DiscoveryError),
///   [`PlanError`](crate::PlanError), [`CaptureError`](crate::CaptureError),
///   [`ReplayError`](crate::ReplayError), [`WaitError`](crate::WaitError),
///   [`TraceError`](crate::TraceError), [`StepError`](crate::StepError),
///   [`StepLaunchError`](crate::StepLaunchError),
///   [`BackendFailure`](crate::BackendFailure),
///   [`UnknownRunner`](crate::UnknownRunner),
///   [`BackendError`](crate::BackendError)), through [`Error`];
/// - [`StreamCaptureError<E>`](crate::StreamCaptureError) and
///   [`ConsumeError<E>`](crate::ConsumeError) for every closure error `E` the
///   type converts from: the closure's own error comes back as itself, not
///   wrapped;
/// - [`SealError<B>`](crate::SealError) for every backend: the reason is
///   kept, the `Capturing` dropped (to keep it, match on `seal()`'s result).
///
/// Do not also derive `From` for those types on the same enum.
///
/// ```
/// use replay_arena::{Discovering, PlanConfig, Policy, Request, Domain, DType, RunnerId};
/// use replay_arena::sim;
///
/// #[derive(Debug, thiserror::Error)]
/// enum AppError {
///     #[error(transparent)]
///     Arena(#[from] replay_arena::Error),
///     #[error("bad batch: {0}")]
///     Batch(String),
/// }
/// replay_arena::from_errors!(AppError);
///
/// fn run() -> Result<(), AppError> {
///     let req = Request::new(Domain::Device, DType::F32, 64);
///     let planned = Discovering::from_runners(PlanConfig::new(), [(RunnerId(0), [req])])?
///         .plan(Policy::Generations(1))?;                       // PlanError
///     let sim = sim::Device::new();
///     let stream = sim.new_stream();
///     let mut capturing = planned.allocate(sim.clone())?;      // BackendFailure
///     let cap = capturing.capture(RunnerId(0))?;                // CaptureError
///     let view = cap.take(req)?;
///     cap.stream_capture(&stream, |s| {
///         sim.launch(s, sim::Kernel::fill(&view, 1.0), 5)?;           // inside: AppError
///         Ok::<(), AppError>(())
///     })?;                                                      // StreamCaptureError<AppError>
///     cap.finish()?;
///     let mut replayable = capturing.seal()?;                   // SealError<sim::Device>
///     replayable.replay(RunnerId(0), &stream)?;                 // ReplayError
///     replayable.consume(RunnerId(0), &stream, |_, _| {
///         Err(AppError::Batch("empty".into()))
///     })?;                                                      // ConsumeError<AppError>
///     Ok(())
/// }
/// // The consumer's own error comes back as itself.
/// assert!(matches!(run(), Err(AppError::Batch(_))));
/// ```
#[macro_export]
macro_rules! from_errors {
    (@via $ty:ty: $phase:ty) => {
        impl ::core::convert::From<$phase> for $ty {
            fn from(e: $phase) -> Self {
                <$ty as ::core::convert::From<$crate::Error>>::from(e.into())
            }
        }
    };
    ($ty:ty) => {
        $crate::from_errors!(@via $ty: $crate::DiscoveryError);
        $crate::from_errors!(@via $ty: $crate::PlanError);
        $crate::from_errors!(@via $ty: $crate::CaptureError);
        $crate::from_errors!(@via $ty: $crate::ReplayError);
        $crate::from_errors!(@via $ty: $crate::WaitError);
        $crate::from_errors!(@via $ty: $crate::TraceError);
        $crate::from_errors!(@via $ty: $crate::StepError);
        $crate::from_errors!(@via $ty: $crate::StepLaunchError);
        $crate::from_errors!(@via $ty: $crate::JoinError);
        $crate::from_errors!(@via $ty: $crate::BucketError);
        $crate::from_errors!(@via $ty: $crate::BackendFailure);
        $crate::from_errors!(@via $ty: $crate::UnknownRunner);
        $crate::from_errors!(@via $ty: $crate::BackendError);
        $crate::from_errors!(@via $ty: $crate::SliceError);

        impl<E, T> ::core::convert::From<$crate::Failed<E, T>> for $ty
        where
            $crate::Error: ::core::convert::From<E>,
        {
            fn from(e: $crate::Failed<E, T>) -> Self {
                <$ty as ::core::convert::From<$crate::Error>>::from(e.into_error().into())
            }
        }

        impl<E> ::core::convert::From<$crate::StreamCaptureError<E>> for $ty
        where
            $ty: ::core::convert::From<E>,
        {
            fn from(e: $crate::StreamCaptureError<E>) -> Self {
                match e {
                    $crate::StreamCaptureError::Capture(c) => {
                        <$ty as ::core::convert::From<$crate::Error>>::from(c.into())
                    }
                    $crate::StreamCaptureError::Work(w) => {
                        <$ty as ::core::convert::From<E>>::from(w)
                    }
                }
            }
        }

        impl<E> ::core::convert::From<$crate::ConsumeError<E>> for $ty
        where
            $ty: ::core::convert::From<E>,
        {
            fn from(e: $crate::ConsumeError<E>) -> Self {
                match e.into_check() {
                    ::core::result::Result::Ok(check) => {
                        <$ty as ::core::convert::From<$crate::Error>>::from(check.into())
                    }
                    ::core::result::Result::Err(w) => <$ty as ::core::convert::From<E>>::from(w),
                }
            }
        }

    };
}

/// Misuse of [`BufferSource`](crate::BufferSource)'s handoff calls.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// A ticket of another kind of run: a plain run's ticket in discovery
    /// or capture, or a plan's ticket in a plain run.
    #[error("{phase} was given {ticket}: a layer receives the tickets its writer got from the same kind of run (plain, or discovery and capture of one plan)")]
    PhaseMismatch {
        /// "a plain run", "discovery" or "a capture".
        phase: &'static str,
        /// The ticket.
        ticket: HandoffTicket,
    },
    /// A capture handed off something discovery did not declare at this
    /// position (or past the runner's last handoff).
    #[error("{runner} hands off {request} as its handoff #{index}, but discovery declared {}", describe(.expected, *.declared))]
    HandoffMismatch {
        /// The runner.
        runner: RunnerId,
        /// Position among the runner's handoffs.
        index: usize,
        /// What the capture handed off.
        request: Request,
        /// What discovery declared there, `None` past the last.
        expected: Option<Request>,
        /// How many handoffs discovery declared for the runner.
        declared: usize,
    },
    /// A ticket's request is not what the plan holds under its id: a
    /// ticket of another discovery or plan.
    #[error("{runner} receives {handoff} as {request}, but this plan's {handoff} holds {planned}: the ticket is not of this plan")]
    ForeignTicket {
        /// The receiving runner.
        runner: RunnerId,
        /// The ticket's handoff.
        handoff: HandoffId,
        /// The ticket's request.
        request: Request,
        /// What the plan (or discovery) holds under that id.
        planned: Request,
    },
    /// A runner that does not write a handoff marked it ready.
    #[error("{runner} marks {handoff} ready, but {writer} writes it: only a handoff's writer marks it ready")]
    NotTheWriter {
        /// The runner that marked it.
        runner: RunnerId,
        /// The handoff.
        handoff: HandoffId,
        /// Its writer.
        writer: RunnerId,
    },
    /// [`BufferSource::ready`](crate::BufferSource::ready) in a capture got a stream of another type
    /// than the capture's backend's.
    #[error("{runner} marks {handoff} ready on a stream that is not a `{expected}`: pass the capture's stream")]
    StreamType {
        /// The runner.
        runner: RunnerId,
        /// The handoff.
        handoff: HandoffId,
        /// The backend's stream type.
        expected: &'static str,
    },
}

fn describe(expected: &Option<Request>, declared: usize) -> String {
    match expected {
        Some(request) => format!("{request} there"),
        None => format!("only {declared} handoff(s) for it"),
    }
}
