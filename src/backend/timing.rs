//! [`Timing`]: timestamps on streams, for the fence's trace
//! ([`Replayable::start_trace`](crate::Replayable::start_trace)).

use super::{BackendError, Streams};

/// Points on the device's timeline that a trace reads times from: a *mark*
/// taken on a stream completes when everything enqueued on the stream
/// before it has. Marks cost host time (on CUDA an event with timing on,
/// created, then recorded per mark), so only a trace the program started
/// takes them.
///
/// A traced step graph's nodes are timed by *node marks*: completion
/// events ([`Streams::Event`]) that its composed graph records after each
/// node, as event record nodes ([`StepNode::records`](crate::backend::StepNode)),
/// read with [`Timing::node_mark_us`]. A backend that cannot read a time
/// from an event leaves [`Timing::times_graph_nodes`] false: its step
/// graphs trace as one slice per launch. A trace keeps its node marks until
/// it is finished, so they are `Send`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` takes no timing marks, so its plans cannot be traced",
    note = "`Replayable::start_trace` needs a backend that implements `Timing`: `sim::Device`, `cuda::Device`"
)]
pub trait Timing: Streams<Event: Send> {
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

    /// Whether [`Timing::new_node_mark`] and [`Timing::node_mark_us`] work:
    /// events recorded inside a composed graph can be read as times.
    /// `false` unless the backend says so.
    fn times_graph_nodes(&self) -> bool {
        false
    }

    /// An event a composed graph can record after a node, whose latest
    /// record [`Timing::node_mark_us`] reads as a time (CUDA: an event with
    /// timing on, not recorded yet).
    ///
    /// # Errors
    ///
    /// The runtime's error; [`BackendError::Refused`] when the backend
    /// does not time graph nodes (the default).
    fn new_node_mark(&self) -> Result<Self::Event, BackendError> {
        Err(BackendError::Refused {
            call: "node mark",
            reason: "this backend does not time the nodes of a graph".into(),
        })
    }

    /// Microseconds from `origin` to the latest record of `event` (made by
    /// [`Timing::new_node_mark`]), both completed (a mark taken after the
    /// record on the stream it completed on was waited for).
    ///
    /// # Errors
    ///
    /// The runtime's error; [`BackendError::Refused`] when the backend
    /// does not time graph nodes (the default).
    fn node_mark_us(&self, origin: &Self::Mark, event: &Self::Event) -> Result<f64, BackendError> {
        let _ = (origin, event);
        Err(BackendError::Refused {
            call: "node mark",
            reason: "this backend does not time the nodes of a graph".into(),
        })
    }
}
