//! cuBLAS on the `cuda` backend (feature `cublas`): a runner's cuBLAS
//! workspace from its own plan request.
//!
//! cuBLAS allocates its workspace lazily, which a stream capture cannot do;
//! a graph that calls cuBLAS needs the workspace set on the handle before the
//! capture, and setting the handle's stream resets the workspace. A
//! per-runner workspace is a plan request (`DType::U8`, 256-byte aligned
//! like every `Device` view) taken inside the runner's capture and bound with
//! [`bind_workspace`], which sets the stream first and the workspace second.

mod result;

use cudarc::cublas::sys as blas;
use cudarc::cublas::CudaBlas;
use cudarc::driver::DevicePtrMut;

use crate::backend::cuda::Stream;
use crate::backend::BackendError;

/// The alignment cuBLAS requires of a workspace's address, in bytes.
pub const WORKSPACE_ALIGNMENT: u64 = 256;

/// Points `blas` at `stream`, then at `workspace` as its workspace
/// (`cublasSetStream_v2`, then `cublasSetWorkspace_v2`: in that order,
/// since setting the stream resets the workspace).
///
/// `workspace` is any cudarc device buffer of bytes: a plan view typed with
/// `view.as_cuda::<u8>(&stream)` (then its bytes are the runner's, fixed for
/// every replay of the graph that captured the cuBLAS calls), or a
/// `CudaSlice<u8>`.
///
/// ```no_run
/// # use replay_arena::{Discovering, PlanConfig, Policy, Request, Domain, DType, RunnerId};
/// # use replay_arena::cuda::{self, ViewExt};
/// # fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// # let backend = cuda::Device::new(0)?;
/// # let stream = backend.new_stream()?;
/// let workspace = Request::new(Domain::Device, DType::U8, 32 << 20);
/// # let mut discovery = Discovering::new(PlanConfig::new());
/// # discovery.arm(RunnerId(0))?.record(workspace)?;
/// # let mut capturing = discovery.plan(Policy::Generations(1))?.allocate(backend)?;
/// let mut handle = replay_arena::cuda::cudarc::cublas::CudaBlas::new(stream.cudarc().clone())?;
/// let cap = capturing.capture(RunnerId(0))?;
/// let ws = cap.take(workspace)?;
/// cap.stream_capture(&stream, |s| -> replay_arena::Result<()> {
///     // A typed view works inside its capture's closure, on its stream.
///     let mut ws = ws.as_cuda::<u8>(s)?;
///     // SAFETY: the handle is used for this runner's capture only, and is
///     // dropped or re-bound before the plan is.
///     unsafe { replay_arena::cublas::bind_workspace(&mut handle, s, &mut ws)? };
///     // cuBLAS calls on `handle`: they use `ws`, never allocate.
///     Ok(())
/// })?;
/// cap.finish()?;
/// # Ok(())
/// # }
/// ```
///
/// # Safety
///
/// The handle keeps the workspace's address: the caller makes sure that the
/// workspace's bytes stay allocated, and are not used by anything else, for
/// as long as work enqueued through `blas` (or a graph that captured such
/// work) may run, and re-binds or drops the handle before they are freed. As
/// with cudarc's `CudaBlas::set_stream`, work enqueued through the handle on
/// `stream` must not race other work on the same memory.
///
/// # Errors
///
/// [`BackendError::Refused`] when the workspace has no address on `stream`
/// (a typed view out of its closure) or its address is not a multiple of
/// [`WORKSPACE_ALIGNMENT`]; [`BackendError::Cublas`] when cuBLAS refuses
/// the stream or the workspace.
pub unsafe fn bind_workspace(
    blas: &mut CudaBlas,
    stream: &Stream,
    workspace: &mut impl DevicePtrMut<u8>,
) -> Result<(), BackendError> {
    let bytes = workspace.len();
    let (ptr, _record) = workspace.device_ptr_mut(stream.cudarc());
    check_workspace(ptr, bytes)?;
    // SAFETY: the caller upholds `CudaBlas::set_stream`'s contract (above).
    unsafe { blas.set_stream(stream.cudarc().clone()) }.map_err(|e| BackendError::Cublas {
        call: "cublasSetStream",
        status: e.0,
    })?;
    // SAFETY: `ptr` addresses `bytes` bytes of device memory, aligned as
    // cuBLAS requires (checked above), which the caller keeps alive while
    // the handle may use them.
    unsafe { result::set_workspace(*blas.handle(), ptr as *mut std::ffi::c_void, bytes) }
}

/// Binds `workspace` on the program's shared cuBLAS handle for the
/// duration of `f`, and puts the handle back as it was when `f` returns,
/// fails or panics.
///
/// For a handle the program shares (candle's `Arc<CudaBlas>`, one handle
/// for every runner): called inside a runner's `stream_capture` closure
/// with that closure's stream and the runner's own workspace request, it
/// points the handle at the capture stream and at the workspace
/// (`cublasSetStream_v2`, then `cublasSetWorkspace_v2`), runs `f` (the
/// framework's ops, whose cuBLAS calls the capture records with this
/// workspace's address), then sets the handle's previous stream again,
/// which also puts back cuBLAS's default workspace (cuBLAS resets the
/// workspace whenever the stream is set). Two runners on two streams that
/// share one handle then each capture their own workspace, so their
/// replays never race on one; and no eager cuBLAS call after the capture
/// writes into a plan's bytes.
///
/// A workspace the program had set on the handle itself
/// (`cublasSetWorkspace_v2`) is not put back (cuBLAS cannot say which it
/// was): set it again after the capture.
///
/// The restore runs after `f` in this function, not in a guard's `Drop`:
/// no value is handed out whose loss (`mem::forget`) could leave the
/// workspace bound. Make every cuBLAS call of the capture inside `f`: after
/// it, the handle has cuBLAS's default workspace again, which cuBLAS would
/// allocate lazily, and a capture cannot allocate it.
///
/// cuBLAS work through the handle goes to the stream the handle was set to,
/// whatever cudarc's `CudaBlas` says about its own: cudarc's `gemm` and
/// friends ask their operands for addresses on the handle's creation
/// stream. With a shared handle whose creation stream is not the closure's,
/// hand them views lent with
/// [`ViewExt::with_cudarc`](crate::cuda::ViewExt::with_cudarc) (typed views
/// refuse work for another stream than their closure's).
///
/// The handle must not be used from another thread while `f` runs (its
/// stream and workspace are this capture's meanwhile): cuBLAS calls through
/// a handle are `unsafe` in cudarc, and that is part of what they vouch for.
///
/// ```no_run
/// # use std::sync::Arc;
/// # use replay_arena::{Discovering, PlanConfig, Policy, Request, Domain, DType, RunnerId};
/// # use replay_arena::cuda::{self, ViewExt};
/// use replay_arena::cuda::cudarc::cublas::CudaBlas;
/// # fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// # let backend = cuda::Device::new(0)?;
/// # let stream = backend.new_stream()?;
/// let workspace = Request::new(Domain::Device, DType::U8, 32 << 20);
/// # let mut discovery = Discovering::new(PlanConfig::new());
/// # discovery.arm(RunnerId(0))?.record(workspace)?;
/// # let mut capturing = discovery.plan(Policy::Generations(1))?.allocate(backend)?;
/// // The program's (the framework's) handle, shared.
/// let handle: Arc<CudaBlas> = Arc::new(CudaBlas::new(stream.cudarc().clone())?);
/// let cap = capturing.capture(RunnerId(0))?;
/// let ws = cap.take(workspace)?;
/// cap.stream_capture(&stream, |s| -> replay_arena::Result<()> {
///     let mut ws = ws.as_cuda::<u8>(s)?;
///     replay_arena::cublas::with_workspace(&handle, s, &mut ws, |blas| {
///         // The framework's ops, calling cuBLAS on `blas`: captured with
///         // this runner's workspace.
///         let _ = blas;
///         Ok::<(), replay_arena::Error>(())
///     })
/// })?;
/// cap.finish()?;
/// # Ok(())
/// # }
/// ```
///
/// # Errors
///
/// As [`bind_workspace`] for the workspace; [`BackendError::Cublas`] when
/// cuBLAS refuses a call (when putting the handle back fails, the handle is
/// left with no workspace at all, `cublasSetWorkspace_v2(NULL, 0)`, never
/// with this one); otherwise what `f` returns.
pub fn with_workspace<R, E: From<BackendError>>(
    blas: &CudaBlas,
    stream: &Stream,
    workspace: &mut impl DevicePtrMut<u8>,
    f: impl FnOnce(&CudaBlas) -> Result<R, E>,
) -> Result<R, E> {
    // SAFETY: `blas` is a live handle for as long as the borrow.
    unsafe { with_workspace_on(*blas.handle(), stream, workspace, || f(blas)) }
}

/// [`with_workspace`] for a raw `cublasHandle_t` (a handle a framework
/// keeps to itself and lends as a raw value).
///
/// # Safety
///
/// `handle` is a live cuBLAS handle of the stream's context for the whole
/// call, not used from another thread meanwhile, and not destroyed by `f`.
///
/// # Errors
///
/// As [`with_workspace`].
pub unsafe fn with_workspace_raw<R, E: From<BackendError>>(
    handle: blas::cublasHandle_t,
    stream: &Stream,
    workspace: &mut impl DevicePtrMut<u8>,
    f: impl FnOnce() -> Result<R, E>,
) -> Result<R, E> {
    // SAFETY: the caller's contract.
    unsafe { with_workspace_on(handle, stream, workspace, f) }
}

/// Refuses a workspace cuBLAS cannot take: no address on the stream (a
/// typed view out of its closure, or on another stream, hands out address
/// 0: cuBLAS would get a NULL workspace of `bytes` bytes), or misaligned.
fn check_workspace(ptr: u64, bytes: usize) -> Result<(), BackendError> {
    if ptr == 0 && bytes > 0 {
        return Err(BackendError::Refused {
            call: "cublasSetWorkspace",
            reason: format!(
                "the workspace of {bytes} bytes has no address on this stream (a plan's typed \
                 view works only inside its own `stream_capture` or `consume` closure, on that \
                 closure's stream): bind the workspace inside the closure"
            ),
        });
    }
    if ptr % WORKSPACE_ALIGNMENT != 0 {
        return Err(BackendError::Refused {
            call: "cublasSetWorkspace",
            reason: format!(
                "a cuBLAS workspace must be {WORKSPACE_ALIGNMENT}-byte aligned; this one is at {ptr:#x}"
            ),
        });
    }
    Ok(())
}

/// # Safety
///
/// `handle` is live, of the stream's context, and not used from another
/// thread during the call.
unsafe fn with_workspace_on<R, E: From<BackendError>>(
    handle: blas::cublasHandle_t,
    stream: &Stream,
    workspace: &mut impl DevicePtrMut<u8>,
    f: impl FnOnce() -> Result<R, E>,
) -> Result<R, E> {
    use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
    let bytes = workspace.len();
    let (ptr, record) = workspace.device_ptr_mut(stream.cudarc());
    check_workspace(ptr, bytes)?;
    // SAFETY: a live handle (the caller's contract).
    let previous = unsafe { result::get_stream(handle) }?;
    // SAFETY: the stream belongs to the handle's context (caller).
    unsafe { result::set_stream(handle, stream.cudarc().cu_stream() as blas::cudaStream_t) }?;
    // SAFETY: `ptr` addresses `bytes` bytes, aligned as cuBLAS requires,
    // valid for the whole call: `workspace` is borrowed for it, and a plan
    // view's address is handed out only inside its closure.
    let bound = unsafe { result::set_workspace(handle, ptr as *mut std::ffi::c_void, bytes) };
    let out = match bound {
        Ok(()) => catch_unwind(AssertUnwindSafe(f)),
        Err(e) => Ok(Err(e.into())),
    };
    // Put the handle back: its previous stream, which resets the workspace
    // to cuBLAS's default. If cuBLAS refuses, leave it with no workspace
    // rather than this one.
    // SAFETY: `previous` is the stream the handle had, still live (the
    // handle kept it); a NULL workspace of 0 bytes is always valid.
    let restored = unsafe { result::set_stream(handle, previous) }.inspect_err(|_| {
        // SAFETY: as above.
        let _ = unsafe { result::set_workspace(handle, std::ptr::null_mut(), 0) };
    });
    drop(record);
    match out {
        Err(panic) => resume_unwind(panic),
        Ok(result) => {
            let value = result?;
            restored?;
            Ok(value)
        }
    }
}
