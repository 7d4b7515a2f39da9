//! One way for code shared by uncaptured and captured paths to ask for a
//! buffer.

use crate::backend::Backend;
use crate::capture::{CaptureError, RunnerCapture};
use crate::discover::ArmedRunner;
use crate::error::Result;
use crate::view::View;
use crate::vocab::Request;

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
}

mod sealed {
    pub trait Sealed {}
}

impl<B: Backend> sealed::Sealed for RunnerCapture<'_, B> {}

impl<B: Backend> ViewSource for RunnerCapture<'_, B> {
    fn take_view(&self, request: Request) -> std::result::Result<View<'_>, CaptureError> {
        self.take(request)
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
