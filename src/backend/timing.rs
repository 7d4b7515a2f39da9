//! [`Timing`]: timestamps on streams, for the fence's trace
//! ([`Replayable::start_trace`](crate::Replayable::start_trace)).

use super::{BackendError, Streams};

/// Points on the device's timeline that a trace reads times from: a *mark*
/// taken on a stream completes when everything enqueued on the stream
/// before it has. Marks cost host time (on CUDA an event with timing on,
/// created, then recorded per mark), so only a trace the program started
/// takes them.
#[diagnostic::on_unimplemented(
    message = "`{Self}` takes no timing marks, so its plans cannot be traced",
    note = "`Replayable::start_trace` needs a backend that implements `Timing`: `sim::Device`, `cuda::Device`"
)]
pub trait Timing: Streams {
    /// One mark (sim: a time on its clock; CUDA: a timing event).
    type Mark: Send;

    /// A mark not taken yet (CUDA: creates the event), to take later with
    /// [`Timing::take_mark`]: a trace creates its marks before the work it
    /// times, so that taking one costs only the record.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn new_mark(&self) -> Result<Self::Mark, BackendError>;

    /// Takes `mark` at the tail of `stream` (again, if it was taken
    /// before).
    ///
    /// # Errors
    ///
    /// The runtime's error, or [`BackendError::Refused`] for a stream this
    /// backend does not own.
    fn take_mark(&self, mark: &mut Self::Mark, stream: &Self::Stream) -> Result<(), BackendError>;

    /// The mark every time of a trace is measured from, taken now (sim: the
    /// clock's zero; CUDA: an event recorded on the backend's own stream).
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn origin(&self) -> Result<Self::Mark, BackendError>;

    /// Blocks until `mark` completed, and with it every mark taken before
    /// it on its stream.
    ///
    /// # Errors
    ///
    /// The runtime's error (a sticky device error, say).
    fn wait_mark(&self, mark: &Self::Mark) -> Result<(), BackendError>;

    /// Microseconds from `origin` to `mark` (negative when `mark` completed
    /// first). Both have completed ([`Timing::wait_mark`] on them, or on a
    /// later mark of their stream); CUDA says `CUDA_ERROR_NOT_READY`
    /// otherwise.
    ///
    /// # Errors
    ///
    /// The runtime's error.
    fn elapsed_us(&self, origin: &Self::Mark, mark: &Self::Mark) -> Result<f64, BackendError>;
}
