//! cuBLAS on the `cuda` backend (feature `cublas`): a runner's cuBLAS
//! workspace from its own plan request.
//!
//! cuBLAS allocates its workspace lazily, which a stream capture cannot do;
//! a graph that calls cuBLAS needs the workspace set on the handle before the
//! capture, and setting the handle's stream resets the workspace. A
//! per-runner workspace is a plan request (`DType::U8`, 256-byte aligned
//! like every `Device` view) taken inside the runner's capture and bound with
//! [`bind_workspace`], which sets the stream first and the workspace second.

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
    if ptr == 0 && bytes > 0 {
        // A typed view out of its closure (or on another stream) hands out
        // address 0: cuBLAS would get a NULL workspace of `bytes` bytes.
        return Err(BackendError::Refused {
            op: "cublasSetWorkspace",
            reason: format!(
                "the workspace of {bytes} bytes has no address on this stream (a plan's typed \
                 view works only inside its own `stream_capture` or `consume` closure, on that \
                 closure's stream): bind the workspace inside the closure"
            ),
        });
    }
    if ptr % WORKSPACE_ALIGNMENT != 0 {
        return Err(BackendError::Refused {
            op: "cublasSetWorkspace",
            reason: format!(
                "a cuBLAS workspace must be {WORKSPACE_ALIGNMENT}-byte aligned; this one is at {ptr:#x}"
            ),
        });
    }
    // SAFETY: the caller upholds `CudaBlas::set_stream`'s contract (above).
    unsafe { blas.set_stream(stream.cudarc().clone()) }.map_err(|e| BackendError::Cublas {
        op: "cublasSetStream",
        status: e.0,
    })?;
    // SAFETY: `ptr` addresses `bytes` bytes of device memory, aligned as
    // cuBLAS requires (checked above), which the caller keeps alive while
    // the handle may use them.
    let status =
        unsafe { blas::cublasSetWorkspace_v2(*blas.handle(), ptr as *mut std::ffi::c_void, bytes) };
    match status {
        blas::cublasStatus_t::CUBLAS_STATUS_SUCCESS => Ok(()),
        status => Err(BackendError::Cublas {
            op: "cublasSetWorkspace",
            status,
        }),
    }
}
