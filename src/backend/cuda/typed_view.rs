//! Views as typed cudarc device pointers ([`TypedView`]).

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{DevicePtr, DevicePtrMut, DeviceSlice, LaunchArgs, PushKernelArg, SyncOnDrop};

use super::device::{capturing, this_thread, Stream};
use super::element::Element;
use super::{sys, Result};
use crate::backend::BackendError;
use crate::scope::{check_use, read_only, retired, ScopeKind, SharedScope};
use crate::view::{Access, Misuse, NotSend, ReadWrite, View};

/// A [`View`] as a typed cudarc device pointer: implements cudarc's
/// [`DevicePtr<T>`] and, for a writable view ([`ReadWrite`], the default
/// access), [`DevicePtrMut<T>`] (so `memcpy_dtod`, `memset_zeros`, cuBLAS
/// `gemm` and friends take it), and can be pushed as a kernel argument with
/// `launch_builder().arg(&view)` (`&mut view` for a write), as cudarc's
/// `CudaView` and `CudaViewMut` are.
///
/// The typed form of a [`ReadOnly`](crate::ReadOnly) view (a received
/// handoff, a `consume` or `consume_many` consumer's views) implements
/// `DevicePtr` only: writing it through cudarc does not compile.
///
/// ```compile_fail
/// use replay_arena::cuda::{Stream, ViewExt};
/// use replay_arena::{ReadOnly, View};
/// fn zero(view: &View<'_, ReadOnly>, s: &Stream) {
///     let mut typed = view.as_cuda::<f32>(s).unwrap();
///     let _ = s.cudarc().memset_zeros(&mut typed); // DevicePtrMut: a writable view's only
/// }
/// ```
///
/// What types cannot see is checked at each use: the stream, the closure
/// still running (cudarc gets address 0 and the scope a deferred error).
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
///         call: "cuMemsetD8Async",
///         code: e.0,
///     })
/// })?;
/// cap.finish()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct TypedView<'a, T, A: Access = ReadWrite> {
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
    _view: PhantomData<(&'a [T], A)>,
}

impl<T, A: Access> fmt::Debug for TypedView<'_, T, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TypedView")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .field("type", &std::any::type_name::<T>())
            .finish()
    }
}

impl<T, A: Access> TypedView<'_, T, A> {
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

impl<T, A: Access> DeviceSlice<T> for TypedView<'_, T, A> {
    fn len(&self) -> usize {
        self.len
    }

    fn stream(&self) -> &Arc<cudarc::driver::CudaStream> {
        &self.stream
    }
}

impl<T, A: Access> DevicePtr<T> for TypedView<'_, T, A> {
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

/// Writable views only: a [`ReadOnly`](crate::ReadOnly) view's typed form
/// has no `DevicePtrMut`.
impl<T> DevicePtrMut<T> for TypedView<'_, T, ReadWrite> {
    fn device_ptr_mut<'b>(
        &'b mut self,
        stream: &'b cudarc::driver::CudaStream,
    ) -> (sys::CUdeviceptr, SyncOnDrop<'b>) {
        (self.address_on(stream, true), SyncOnDrop::Record(None))
    }
}

// SAFETY: pushes a pointer to the view's device address, which lives in the
// view for `'b`, longer than the launch arguments ('b: 'a).
unsafe impl<'a, 'b: 'a, 'c: 'b, T, A: Access> PushKernelArg<&'b TypedView<'c, T, A>>
    for LaunchArgs<'a>
{
    #[inline(always)]
    fn arg(&mut self, arg: &'b TypedView<'c, T, A>) -> &mut Self {
        self.arg(&arg.ptr)
    }
}

// SAFETY: as above; `&mut` marks the argument as written by the kernel
// (writable views only).
unsafe impl<'a, 'b: 'a, 'c: 'b, T> PushKernelArg<&'b mut TypedView<'c, T, ReadWrite>>
    for LaunchArgs<'a>
{
    #[inline(always)]
    fn arg(&mut self, arg: &'b mut TypedView<'c, T, ReadWrite>) -> &mut Self {
        self.arg(&arg.ptr)
    }
}

/// `view` as a [`TypedView<T>`] for cudarc calls on `stream`
/// ([`ViewExt::as_cuda`](super::ViewExt::as_cuda)).
pub(super) fn typed<'a, T: Element, A: Access>(
    view: &View<'a, A>,
    stream: &Stream,
) -> Result<TypedView<'a, T, A>> {
    if view.dtype() != T::DTYPE {
        return Err(BackendError::DTypeMismatch {
            view: view.dtype(),
            requested: T::DTYPE,
            type_name: std::any::type_name::<T>(),
        });
    }
    let scope = check_use(&view.tag(), stream.serial, false)
        .map_err(|reason| BackendError::InvalidView { reason })?;
    Ok(TypedView {
        ptr: view.device_address(),
        tag: view.tag(),
        len: view.len(),
        stream: stream.inner.clone(),
        per_thread: stream.per_thread,
        scope,
        _on_its_thread: NotSend::default(),
        _view: PhantomData,
    })
}
