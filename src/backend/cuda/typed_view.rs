//! Views as typed cudarc device pointers ([`TypedView`], [`ViewExt`]).

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{DevicePtr, DevicePtrMut, DeviceSlice, LaunchArgs, PushKernelArg, SyncOnDrop};

use super::element::Element;
use super::handles::{capturing, this_thread, Stream};
use super::{sys, Result};
use crate::backend::BackendError;
use crate::scope::{check_use, read_only, retired, ScopeKind, SharedScope};
use crate::view::{Misuse, NotSend, View};

/// A [`View`] as a typed cudarc device pointer: implements cudarc's
/// [`DevicePtr<T>`] and [`DevicePtrMut<T>`] (so `memcpy_dtod`,
/// `memset_zeros`, cuBLAS `gemm` and friends take it) and can be pushed as a
/// kernel argument with `launch_builder().arg(&view)` (`&mut view` for a
/// write).
///
/// It is neither `Send` nor `Sync`: it works on the thread of the closure
/// that made it, while that closure runs.
///
/// It never frees arena memory (dropping it drops a stream handle only),
/// and it borrows what the view borrows (the open capture, or the
/// [`Replayable`](crate::Replayable)), so it cannot outlive the arena. It
/// carries no cudarc event: ordering across streams is the fence's (inside
/// graphs and [`Replayable::consume`](crate::Replayable::consume)) or the
/// caller's.
///
/// ```no_run
/// # use replay_arena::{Discovering, PlanConfig, Policy, Request, Domain, DType, RunnerId};
/// use replay_arena::cuda::{self, ViewExt};
///
/// # let req = Request::new(Domain::Device, DType::F32, 1024);
/// # let mut discovery = Discovering::new(PlanConfig::new());
/// # discovery.arm(RunnerId(0))?.record(req)?;
/// let backend = cuda::Device::new(0)?;
/// let stream = backend.new_stream()?;
/// let mut capturing = discovery.plan(Policy::Generations(1))?.allocate(backend.clone())?;
/// let cap = capturing.capture(RunnerId(0))?;
/// let view = cap.take(req)?;
/// cap.stream_capture(&stream, |s| {
///     let mut out = view.as_cuda::<f32>(s)?;  // DevicePtrMut<f32>
///     s.cudarc().memset_zeros(&mut out).map_err(|e| replay_arena::BackendError::Driver {
///         op: "cuMemsetD8Async",
///         code: e.0,
///     })
/// })?;
/// cap.finish()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct TypedView<'a, T> {
    /// The view's address; pushed by address as a kernel argument.
    ptr: sys::CUdeviceptr,
    /// The view's scope and names, for errors.
    tag: crate::view::ViewTag,
    len: usize,
    /// The stream of the closure that made it: the only stream cudarc may
    /// put work on it on (also what cudarc's context checks see).
    stream: Arc<cudarc::driver::CudaStream>,
    /// For the per-thread default stream: the thread whose stream it is.
    per_thread: Option<u64>,
    /// The capture or consumer whose closure may use it.
    scope: SharedScope,
    /// It stays on the thread of its closure: its checks (scope open, the
    /// stream's capture state) and cudarc's enqueue happen on that thread,
    /// so the closure cannot return (and its capture end, or its reader's
    /// completion be recorded) between them.
    _on_its_thread: NotSend,
    _view: PhantomData<&'a [T]>,
}

impl<T> fmt::Debug for TypedView<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TypedView")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .field("type", &std::any::type_name::<T>())
            .finish()
    }
}

impl<T> TypedView<'_, T> {
    /// The device address of the first element.
    pub fn device_address(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// The address cudarc may put work on `stream` on: the view's own while
    /// its closure runs and `stream` is the closure's stream; otherwise 0
    /// (fail closed: cudarc's copies, fills and collectives then fail with
    /// the driver's or NCCL's invalid-argument error, nothing touches the
    /// arena), and the capture or consumer reports
    /// [`ViewOutOfScope`](crate::CaptureError::ViewOutOfScope).
    fn address_on(&self, stream: &cudarc::driver::CudaStream, write: bool) -> sys::CUdeviceptr {
        let same_stream = stream.cu_stream() == self.stream.cu_stream()
            && self.per_thread.is_none_or(|owner| owner == this_thread());
        // A capture's view works only while the stream still captures (not
        // after the program ended the capture under the crate); a
        // consumer's only while it does not (its work must run, fenced).
        let capture = self.scope.kind == ScopeKind::Capture;
        let state_matches = || capturing(stream.cu_stream()).is_ok_and(|c| c == capture);
        let writable = !write || (self.scope.kind != ScopeKind::Read && !self.tag.read_only);
        let in_use = self.scope.in_use(&self.tag);
        if self.scope.is_open() && same_stream && writable && in_use && state_matches() {
            return self.ptr;
        }
        self.scope.record_misuse(if !writable {
            read_only(&self.tag)
        } else if !in_use {
            retired(&self.tag)
        } else {
            Misuse::TypedViewElsewhere {
                request: self.tag.request,
                runner: self.tag.runner,
                address: self.ptr,
                returned: !self.scope.is_open(),
            }
        });
        0
    }
}

impl<T> DeviceSlice<T> for TypedView<'_, T> {
    fn len(&self) -> usize {
        self.len
    }

    fn stream(&self) -> &Arc<cudarc::driver::CudaStream> {
        &self.stream
    }
}

impl<T> DevicePtr<T> for TypedView<'_, T> {
    fn device_ptr<'b>(
        &'b self,
        stream: &'b cudarc::driver::CudaStream,
    ) -> (sys::CUdeviceptr, SyncOnDrop<'b>) {
        // No event to wait on or record: arena memory is ordered by the
        // fence (the closure's stream is the fenced one), never by cudarc's
        // tracking.
        (self.address_on(stream, false), SyncOnDrop::Record(None))
    }
}

impl<T> DevicePtrMut<T> for TypedView<'_, T> {
    fn device_ptr_mut<'b>(
        &'b mut self,
        stream: &'b cudarc::driver::CudaStream,
    ) -> (sys::CUdeviceptr, SyncOnDrop<'b>) {
        (self.address_on(stream, true), SyncOnDrop::Record(None))
    }
}

// SAFETY: pushes a pointer to the view's device address, which lives in the
// view for `'b`, longer than the launch arguments ('b: 'a).
unsafe impl<'a, 'b: 'a, 'c: 'b, T> PushKernelArg<&'b TypedView<'c, T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b TypedView<'c, T>) -> &mut Self {
        self.arg(&arg.ptr)
    }
}

// SAFETY: as above; `&mut` marks the argument as written by the kernel.
unsafe impl<'a, 'b: 'a, 'c: 'b, T> PushKernelArg<&'b mut TypedView<'c, T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b mut TypedView<'c, T>) -> &mut Self {
        self.arg(&arg.ptr)
    }
}

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
    fn as_cuda<T: Element>(&self, stream: &Stream) -> Result<TypedView<'a, T>>;

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
    ) -> std::result::Result<R, E>;

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
    fn copy_from<T: Element>(&self, stream: &Stream, src: &impl DevicePtr<T>) -> Result<()>;

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

impl<'a> ViewExt<'a> for View<'a> {
    fn as_cuda<T: Element>(&self, stream: &Stream) -> Result<TypedView<'a, T>> {
        if self.dtype() != T::DTYPE {
            return Err(BackendError::DTypeMismatch {
                view: self.dtype(),
                requested: T::DTYPE,
                type_name: std::any::type_name::<T>(),
            });
        }
        let scope = check_use(&self.tag(), stream.serial, false)
            .map_err(|reason| BackendError::InvalidView { reason })?;
        Ok(TypedView {
            ptr: self.device_address(),
            tag: self.tag(),
            len: self.len(),
            stream: stream.inner.clone(),
            per_thread: stream.per_thread,
            scope,
            _on_its_thread: NotSend::default(),
            _view: PhantomData,
        })
    }

    unsafe fn with_cudarc<T: Element, R, E: From<BackendError>>(
        &self,
        stream: &Stream,
        f: impl FnOnce(cudarc::driver::CudaView<'_, T>) -> std::result::Result<R, E>,
    ) -> std::result::Result<R, E> {
        super::lend::with_cudarc(self, stream, f)
    }

    unsafe fn with_cudarc_mut<T: Element, R, E: From<BackendError>>(
        &self,
        stream: &Stream,
        f: impl FnOnce(cudarc::driver::CudaViewMut<'_, T>) -> std::result::Result<R, E>,
    ) -> std::result::Result<R, E> {
        super::lend::with_cudarc_mut(self, stream, f)
    }

    fn copy_from<T: Element>(&self, stream: &Stream, src: &impl DevicePtr<T>) -> Result<()> {
        super::lend::copy_from(self, stream, src)
    }

    fn copy_into<T: Element>(&self, stream: &Stream, dst: &mut impl DevicePtrMut<T>) -> Result<()> {
        super::lend::copy_into(self, stream, dst)
    }
}
