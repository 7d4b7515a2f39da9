//! [`ViewExt`]: views as typed cudarc device pointers ([`TypedView`]),
//! lent as cudarc's own view types, and copied to and from the program's
//! device memory.

use cudarc::driver::{DevicePtr, DevicePtrMut};

use super::device::Stream;
use super::element::Element;
use super::lend;
use super::typed_view::{typed, TypedView};
use super::Result;
use crate::backend::BackendError;
use crate::view::{Access, View, Writable};

/// Typed cudarc views of a [`View`]: `use replay_arena::cuda::ViewExt`.
///
/// Only element types with a [`DType`](crate::DType) convert:
///
/// ```compile_fail
/// use replay_arena::cuda::{Stream, ViewExt};
/// fn typed(view: replay_arena::View<'_>, stream: &Stream) {
///     let _ = view.as_cuda::<u16>(stream); // u16 is not a cuda::Element
/// }
/// ```
///
/// and a typed view cannot outlive the view's owner:
///
/// ```compile_fail
/// use replay_arena::cuda::{self, Stream, TypedView, ViewExt};
/// use replay_arena::{Capturing, Request, RunnerId};
/// fn escape<'s>(capturing: &'s mut Capturing<cuda::Device>, req: Request, stream: &Stream) -> TypedView<'s, f32> {
///     let cap = capturing.capture(RunnerId(0)).unwrap();
///     let view = cap.take(req).unwrap();
///     view.as_cuda::<f32>(stream).unwrap() // borrows `cap`, dropped here
/// }
/// ```
pub trait ViewExt<'a> {
    /// The view's access ([`ReadWrite`](crate::ReadWrite) or
    /// [`ReadOnly`](crate::ReadOnly)), which its typed form keeps.
    type Access: Access;

    /// The view as a [`TypedView<T>`], for cudarc calls on `stream`, which
    /// must be the stream of the closure that handed the view out
    /// ([`RunnerCapture::stream_capture`](crate::RunnerCapture::stream_capture)
    /// or [`Replayable::consume`](crate::Replayable::consume)), called from
    /// inside that closure. It lives as long as the view does, and cudarc
    /// gets its address only for work on that stream while the closure runs.
    ///
    /// # Errors
    ///
    /// [`BackendError::DTypeMismatch`] when `T`'s dtype is not the view's;
    /// [`BackendError::InvalidView`] outside the view's closure or for
    /// another stream.
    fn as_cuda<T: Element>(&self, stream: &Stream) -> Result<TypedView<'a, T, Self::Access>>;

    /// Lends the view to `f` as cudarc's own read-only view type,
    /// [`CudaView<'_, T>`](cudarc::driver::CudaView), for framework code
    /// that takes cudarc's types rather than the pointer traits. Called
    /// inside the closure that handed the view out, with that closure's
    /// stream, like [`as_cuda`](ViewExt::as_cuda); the lent view borrows a
    /// value local to this call, so it cannot leave `f`, and it never frees
    /// the arena's bytes.
    ///
    /// The checks a [`TypedView`] makes at each use are made once, here.
    /// cudarc's view types carry no such check: cudarc's safe methods take
    /// work on a `CudaView` on *any* stream, and the crate cannot see it.
    /// That is why a lend is `unsafe`; the safe ways to hand a view to
    /// framework code are [`as_cuda`](ViewExt::as_cuda) (a [`TypedView`]
    /// implements cudarc's `DevicePtr`/`DevicePtrMut`, checked at each use)
    /// and the copies [`copy_from`](ViewExt::copy_from) /
    /// [`copy_into`](ViewExt::copy_into). See `docs/integration.md`,
    /// "Views lent as cudarc views".
    ///
    /// # Safety
    ///
    /// Every use of the lent view inside `f` puts its work on `stream`
    /// (cudarc's `CudaStream` methods called on `stream.cudarc()`, kernels
    /// launched there), or on a stream that joins `stream`'s capture (forked
    /// from it by an event and joined back into it before `f` returns).
    /// Work on the lent view on any other stream runs outside the fence:
    /// it may overlap replays and consumers that use the same bytes.
    ///
    /// ```no_run
    /// # use replay_arena::{Discovering, PlanConfig, Policy, Request, Domain, DType, RunnerId};
    /// use replay_arena::cuda::{self, ViewExt};
    /// use replay_arena::cuda::cudarc::driver::{CudaSlice, CudaView};
    ///
    /// /// A framework op that takes cudarc's view type.
    /// fn sum_into(s: &cuda::Stream, x: &CudaView<'_, f32>, out: &mut CudaSlice<f32>) -> replay_arena::Result<()> {
    ///     s.cudarc().memcpy_dtod(x, out)?;
    ///     Ok(())
    /// }
    ///
    /// # let req = Request::new(Domain::Device, DType::F32, 1024);
    /// # let mut discovery = Discovering::new(PlanConfig::new());
    /// # discovery.arm(RunnerId(0))?.record(req)?;
    /// let backend = cuda::Device::new(0)?;
    /// let stream = backend.new_stream()?;
    /// let mut main: CudaSlice<f32> = stream.cudarc().alloc_zeros(1024)?;
    /// # let capturing = discovery.plan(Policy::Generations(1))?.allocate(backend.clone())?;
    /// # let mut replayable = capturing.seal()?;
    /// replayable.consume(RunnerId(0), &stream, |s, views| -> replay_arena::Result<()> {
    ///     // SAFETY: `sum_into` puts its work on `s`, the consumer's stream.
    ///     unsafe { views[0].with_cudarc(s, |x| sum_into(s, &x, &mut main)) }
    /// })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// The lent view cannot leave `f`:
    ///
    /// ```compile_fail
    /// use replay_arena::cuda::cudarc::driver::CudaView;
    /// use replay_arena::cuda::{Stream, ViewExt};
    /// use replay_arena::BackendError;
    /// fn escape<'v>(view: replay_arena::View<'v>, s: &Stream) -> CudaView<'v, f32> {
    ///     unsafe { view.with_cudarc::<f32, _, BackendError>(s, |v| Ok(v)) }.unwrap()
    /// }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`as_cuda`](ViewExt::as_cuda); also [`BackendError::Refused`] for
    /// a view of a symmetric domain (use `as_cuda` there), and
    /// [`BackendError::EventTracking`] when the stream's context has
    /// cudarc's event tracking on.
    unsafe fn with_cudarc<T: Element, R, E: From<BackendError>>(
        &self,
        stream: &Stream,
        f: impl FnOnce(cudarc::driver::CudaView<'_, T>) -> std::result::Result<R, E>,
    ) -> std::result::Result<R, E>;

    /// Lends the view to `f` as cudarc's writable view type,
    /// [`CudaViewMut<'_, T>`](cudarc::driver::CudaViewMut): as
    /// [`with_cudarc`](ViewExt::with_cudarc), for a view the closure may
    /// write (a capture's own request or handed-off view, a
    /// `consume_mut` consumer's views).
    ///
    /// A handoff that its capture marks ready while it is lent makes the
    /// capture fail at `finish` with
    /// [`ViewOutOfScope`](crate::CaptureError::ViewOutOfScope): the crate
    /// cannot see whether the lent view was written after the ready point.
    ///
    /// # Safety
    ///
    /// As [`with_cudarc`](ViewExt::with_cudarc): every use of the lent view
    /// inside `f` puts its work on `stream` (or on a stream that joins its
    /// capture).
    ///
    /// # Errors
    ///
    /// As [`with_cudarc`](ViewExt::with_cudarc), and
    /// [`BackendError::InvalidView`] for a view its closure may only read.
    unsafe fn with_cudarc_mut<T: Element, R, E: From<BackendError>>(
        &self,
        stream: &Stream,
        f: impl FnOnce(cudarc::driver::CudaViewMut<'_, T>) -> std::result::Result<R, E>,
    ) -> std::result::Result<R, E>
    where
        Self::Access: Writable;

    /// Copies the program's device memory `src` (a framework tensor's
    /// `CudaSlice`, a `CudaView` of it) into the view, on `stream`: the
    /// copy a framework whose ops allocate their outputs needs to leave a
    /// result in a plan view. Same checks as [`as_cuda`](ViewExt::as_cuda)
    /// for a write.
    ///
    /// # Errors
    ///
    /// As [`as_cuda`](ViewExt::as_cuda) (and
    /// [`BackendError::InvalidView`] for a view its closure may only read);
    /// [`BackendError::Refused`] when the lengths differ; the driver's
    /// error.
    fn copy_from<T: Element>(&self, stream: &Stream, src: &impl DevicePtr<T>) -> Result<()>
    where
        Self::Access: Writable;

    /// Copies the view into the program's device memory `dst` (a tensor
    /// the framework allocated), on `stream`: how framework ops that need
    /// owned storage read a received handoff or a consumer's view.
    ///
    /// # Errors
    ///
    /// As [`as_cuda`](ViewExt::as_cuda); [`BackendError::Refused`] when the
    /// lengths differ; the driver's error.
    fn copy_into<T: Element>(&self, stream: &Stream, dst: &mut impl DevicePtrMut<T>) -> Result<()>;
}

impl<'a, A: Access> ViewExt<'a> for View<'a, A> {
    type Access = A;

    fn as_cuda<T: Element>(&self, stream: &Stream) -> Result<TypedView<'a, T, A>> {
        typed(self, stream)
    }

    unsafe fn with_cudarc<T: Element, R, E: From<BackendError>>(
        &self,
        stream: &Stream,
        f: impl FnOnce(cudarc::driver::CudaView<'_, T>) -> std::result::Result<R, E>,
    ) -> std::result::Result<R, E> {
        lend::with_cudarc(self, stream, f)
    }

    unsafe fn with_cudarc_mut<T: Element, R, E: From<BackendError>>(
        &self,
        stream: &Stream,
        f: impl FnOnce(cudarc::driver::CudaViewMut<'_, T>) -> std::result::Result<R, E>,
    ) -> std::result::Result<R, E>
    where
        A: Writable,
    {
        lend::with_cudarc_mut(self, stream, f)
    }

    fn copy_from<T: Element>(&self, stream: &Stream, src: &impl DevicePtr<T>) -> Result<()>
    where
        A: Writable,
    {
        lend::copy_from(self, stream, src)
    }

    fn copy_into<T: Element>(&self, stream: &Stream, dst: &mut impl DevicePtrMut<T>) -> Result<()> {
        lend::copy_into(self, stream, dst)
    }
}
