//! One way for code shared by uncaptured and captured paths to ask for a
//! buffer.

use std::any::Any;

use crate::backend::Backend;
use crate::capture::{CaptureError, RunnerCapture};
use crate::discover::ArmedRunner;
use crate::error::{Result, SourceError};
use crate::view::{ReadOnly, View};
use crate::vocab::{HandoffId, HandoffTicket, Request, RunnerId};

/// Where a layer's code gets its persistent buffers from, passed down
/// explicitly (no global state): the same call records in discovery, hands
/// out a fixed-address view in capture, and says "allocate it yourself" in
/// plain runs.
///
/// It does not name the backend (a capture of any backend is a
/// [`ViewSource`]), so a layer's signature carries only two lifetimes and
/// plain and discovery runs need no backend type at all.
///
/// ```
/// use replay_arena::{Buffer, BufferSource, Discovering, PlanConfig, Request, Domain, DType, RunnerId};
///
/// fn wgrad(src: &mut BufferSource<'_, '_>) -> replay_arena::Result<()> {
///     match src.request(Request::new(Domain::Device, DType::BF16, 1024))? {
///         Buffer::Persistent(view) => { /* launch into view.device_address() */ let _ = view; }
///         Buffer::AllocateYourself => { /* use the framework's allocator */ }
///     }
///     Ok(())
/// }
///
/// let mut discovery = Discovering::new(PlanConfig::new());
/// let mut armed = discovery.arm(RunnerId(0))?;
/// wgrad(&mut BufferSource::Discover(&mut armed))?;   // records
/// wgrad(&mut BufferSource::Plain)?;                  // records nothing
/// # Ok::<(), replay_arena::Error>(())
/// ```
pub enum BufferSource<'s, 'c> {
    /// A plain run (neither discovery nor capture): nothing is recorded or
    /// handed out.
    Plain,
    /// An eager discovery backward: requests are recorded for the armed
    /// runner; the caller still allocates for this run.
    Discover(&'s mut ArmedRunner<'c>),
    /// A capture: requests get fixed-address views. A `&RunnerCapture<'_, B>`
    /// of any backend coerces to it: `BufferSource::Capture(&cap)`.
    Capture(&'s dyn ViewSource),
}

/// An open capture seen without its backend type: what
/// [`BufferSource::Capture`] holds. Implemented by [`RunnerCapture`] only
/// (sealed).
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not hand out a plan's views",
    note = "`BufferSource::Capture` takes the open capture: `BufferSource::Capture(&cap)` with `cap` from `capturing.capture(runner)?`"
)]
pub trait ViewSource: sealed::Sealed {
    /// [`RunnerCapture::take`].
    ///
    /// # Errors
    ///
    /// [`RunnerCapture::take`]'s.
    fn take_view(&self, request: Request) -> std::result::Result<View<'_>, CaptureError>;

    /// [`RunnerCapture::runner`].
    fn capture_runner(&self) -> RunnerId;

    /// The first handoff the runner writes that this capture has not taken
    /// yet (its position among the runner's, its id and request), and how
    /// many it writes.
    fn next_hand_off(&self) -> (Option<(usize, HandoffId, Request)>, usize);

    /// [`RunnerCapture::hand_off`].
    ///
    /// # Errors
    ///
    /// [`RunnerCapture::hand_off`]'s.
    fn hand_off_view(&self, handoff: HandoffId) -> std::result::Result<View<'_>, CaptureError>;

    /// [`RunnerCapture::receive`].
    ///
    /// # Errors
    ///
    /// [`RunnerCapture::receive`]'s.
    fn receive_view(
        &self,
        handoff: HandoffId,
    ) -> std::result::Result<View<'_, ReadOnly>, CaptureError>;

    /// [`RunnerCapture::ready`], with the stream seen as [`Any`].
    ///
    /// # Errors
    ///
    /// [`SourceError::StreamType`] when `stream` is not the backend's
    /// stream type; [`RunnerCapture::ready`]'s.
    fn ready_on(&self, handoff: HandoffId, stream: &dyn Any) -> Result<()>;
}

mod sealed {
    pub trait Sealed {}
}

impl<B: Backend> sealed::Sealed for RunnerCapture<'_, B> {}

impl<B: Backend> ViewSource for RunnerCapture<'_, B>
where
    B::Stream: 'static,
{
    fn take_view(&self, request: Request) -> std::result::Result<View<'_>, CaptureError> {
        self.take(request)
    }

    fn capture_runner(&self) -> RunnerId {
        self.runner()
    }

    fn next_hand_off(&self) -> (Option<(usize, HandoffId, Request)>, usize) {
        self.next_write()
    }

    fn hand_off_view(&self, handoff: HandoffId) -> std::result::Result<View<'_>, CaptureError> {
        self.hand_off(handoff)
    }

    fn receive_view(
        &self,
        handoff: HandoffId,
    ) -> std::result::Result<View<'_, ReadOnly>, CaptureError> {
        self.receive(handoff)
    }

    fn ready_on(&self, handoff: HandoffId, stream: &dyn Any) -> Result<()> {
        let Some(stream) = stream.downcast_ref::<B::Stream>() else {
            return Err(SourceError::StreamType {
                runner: self.runner(),
                handoff,
                expected: std::any::type_name::<B::Stream>(),
            }
            .into());
        };
        Ok(self.ready(handoff, stream)?)
    }
}

/// What [`BufferSource::request`] gives back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buffer<'v> {
    /// Use this persistent view.
    Persistent(View<'v>),
    /// No persistent storage in this phase: allocate as usual.
    AllocateYourself,
}

impl<'s> BufferSource<'s, '_> {
    /// Asks for one buffer.
    ///
    /// # Errors
    ///
    /// Discovery's checks while discovering, capture's while capturing.
    pub fn request(&mut self, request: Request) -> Result<Buffer<'s>> {
        match self {
            BufferSource::Plain => Ok(Buffer::AllocateYourself),
            BufferSource::Discover(armed) => {
                armed.record(request)?;
                Ok(Buffer::AllocateYourself)
            }
            BufferSource::Capture(capture) => {
                let capture: &'s dyn ViewSource = *capture;
                Ok(capture.take_view(request).map(Buffer::Persistent)?)
            }
        }
    }
}

/// What [`BufferSource::receive`] gives back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Received<'v> {
    /// Read this persistent, read-only view (a capture).
    Persistent(View<'v, ReadOnly>),
    /// Not captured: read what the writer's code produced in this run (the
    /// framework's own tensor).
    Eager,
}

impl BufferSource<'_, '_> {
    fn phase(&self) -> &'static str {
        match self {
            BufferSource::Plain => "a plain run",
            BufferSource::Discover(_) => "discovery",
            BufferSource::Capture(_) => "a capture",
        }
    }

    /// The ticket's handoff and writer, where this run is one of a plan.
    fn planned(&self, ticket: HandoffTicket) -> Result<Option<(HandoffId, RunnerId)>> {
        let plain = matches!(self, BufferSource::Plain);
        match (ticket.id.zip(ticket.writer), plain) {
            (None, true) => Ok(None),
            (Some(planned), false) => Ok(Some(planned)),
            _ => Err(SourceError::PhaseMismatch {
                phase: self.phase(),
                ticket,
            }
            .into()),
        }
    }
}

impl<'s> BufferSource<'s, '_> {
    /// Hands off a buffer this layer writes and later layers read (its
    /// input gradient): declares it in discovery
    /// ([`ArmedRunner::hand_off`]), takes the runner's next declared
    /// handoff in a capture ([`RunnerCapture::hand_off`]; handoffs come in
    /// the order discovery declared them), and in a plain run only says
    /// "allocate it yourself". Pass the ticket to the readers'
    /// [`BufferSource::receive`], and to [`BufferSource::ready`] once this
    /// layer is done with the buffer.
    ///
    /// # Errors
    ///
    /// Discovery's checks while discovering; in a capture
    /// [`SourceError::HandoffMismatch`] when discovery declared another
    /// request at this position (or fewer handoffs), and the capture's
    /// checks.
    pub fn hand_off(&mut self, request: Request) -> Result<(HandoffTicket, Buffer<'s>)> {
        match self {
            BufferSource::Plain => Ok((
                HandoffTicket {
                    id: None,
                    writer: None,
                    request,
                },
                Buffer::AllocateYourself,
            )),
            BufferSource::Discover(armed) => {
                let id = armed.hand_off(request)?;
                let ticket = HandoffTicket {
                    id: Some(id),
                    writer: Some(armed.runner()),
                    request,
                };
                Ok((ticket, Buffer::AllocateYourself))
            }
            BufferSource::Capture(capture) => {
                let capture: &'s dyn ViewSource = *capture;
                let runner = capture.capture_runner();
                let (next, declared) = capture.next_hand_off();
                let mismatch = |index, expected| SourceError::HandoffMismatch {
                    runner,
                    index,
                    request,
                    expected,
                    declared,
                };
                let Some((index, id, expected)) = next else {
                    return Err(mismatch(declared, None).into());
                };
                if expected != request {
                    return Err(mismatch(index, Some(expected)).into());
                }
                let view = capture.hand_off_view(id)?;
                let ticket = HandoffTicket {
                    id: Some(id),
                    writer: Some(runner),
                    request,
                };
                Ok((ticket, Buffer::Persistent(view)))
            }
        }
    }

    /// Receives what an earlier layer handed off: declares this runner a
    /// reader in discovery ([`ArmedRunner::receive`]), gives the read-only
    /// view in a capture ([`RunnerCapture::receive`]), and in a plain run
    /// says "read the writer's own output" ([`Received::Eager`]).
    ///
    /// # Errors
    ///
    /// [`SourceError::PhaseMismatch`] for a ticket of another kind of run,
    /// [`SourceError::ForeignTicket`] for one whose request is not what
    /// the discovery or plan holds under its id; discovery's checks
    /// ([`DiscoveryError::UnknownHandoff`](crate::DiscoveryError::UnknownHandoff)
    /// for an id it never handed out, `OwnHandoff`,
    /// `HandoffReceivedTwice`) and the capture's
    /// ([`CaptureError::HandoffNotDeclared`] for a handoff this runner does
    /// not read in the plan).
    pub fn receive(&mut self, ticket: HandoffTicket) -> Result<Received<'s>> {
        let Some((id, _)) = self.planned(ticket)? else {
            return Ok(Received::Eager);
        };
        let foreign = |runner, planned| SourceError::ForeignTicket {
            runner,
            handoff: id,
            request: ticket.request,
            planned,
        };
        match self {
            BufferSource::Plain => Ok(Received::Eager),
            BufferSource::Discover(armed) => {
                let planned = armed.receive(id)?;
                if planned != ticket.request {
                    return Err(foreign(armed.runner(), planned).into());
                }
                Ok(Received::Eager)
            }
            BufferSource::Capture(capture) => {
                let capture: &'s dyn ViewSource = *capture;
                let view = capture.receive_view(id)?;
                if view.request() != ticket.request {
                    return Err(foreign(capture.capture_runner(), view.request()).into());
                }
                Ok(Received::Persistent(view))
            }
        }
    }

    /// Marks where this layer is done with the handoff it handed off:
    /// [`RunnerCapture::ready`] in a capture (readers start there); nothing
    /// to mark in discovery or a plain run (eager work is ordered by its
    /// stream). `stream` is the stream the layer's work goes to; in a
    /// capture it must be the capture's (the backend's stream type,
    /// `cuda::Stream` or `sim::Stream`).
    ///
    /// # Errors
    ///
    /// [`SourceError::PhaseMismatch`] for a ticket of another kind of run,
    /// [`SourceError::NotTheWriter`] for a handoff this runner does not
    /// hand off, [`SourceError::StreamType`] for a stream of another
    /// backend; the capture's checks
    /// ([`CaptureError::ReadyMisplaced`] outside the work closure, on
    /// another stream, or marked twice).
    pub fn ready<S: Any>(&mut self, ticket: HandoffTicket, stream: &S) -> Result<()> {
        let Some((id, writer)) = self.planned(ticket)? else {
            return Ok(());
        };
        let runner = match self {
            BufferSource::Plain => return Ok(()),
            BufferSource::Discover(armed) => armed.runner(),
            BufferSource::Capture(capture) => capture.capture_runner(),
        };
        if writer != runner {
            return Err(SourceError::NotTheWriter {
                runner,
                handoff: id,
                writer,
            }
            .into());
        }
        match self {
            BufferSource::Capture(capture) => capture.ready_on(id, stream),
            _ => Ok(()),
        }
    }
}
