//! cuBLAS's entry points, one checked wrapper each, as the driver's are in
//! `backend/cuda/result.rs` (and cudarc's in `cublas/result.rs`): every raw
//! `sys::cublas*` call of the crate is here.
//!
//! Each wrapper makes one call, turns its out pointers into a return value
//! and its `cublasStatus_t` into a [`BackendError::Cublas`] that keeps the
//! raw status and names the call. Every wrapper takes a raw handle, so
//! every one is `unsafe`: the handle is live and not used from another
//! thread during the call.

use std::ffi::c_void;
use std::ptr;

use cudarc::cublas::sys;

use crate::backend::BackendError;

/// What a wrapper returns.
pub(super) type CublasResult<T> = std::result::Result<T, BackendError>;

/// `Ok(value)` on `CUBLAS_STATUS_SUCCESS`, else the call's
/// [`BackendError::Cublas`].
fn check<T>(op: &'static str, status: sys::cublasStatus_t, value: T) -> CublasResult<T> {
    match status {
        sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS => Ok(value),
        status => Err(BackendError::Cublas { call: op, status }),
    }
}

/// `cublasGetStream_v2`: the stream the handle enqueues on.
///
/// # Safety
///
/// `handle` is a live cuBLAS handle, not used from another thread during
/// the call.
pub(super) unsafe fn get_stream(handle: sys::cublasHandle_t) -> CublasResult<sys::cudaStream_t> {
    let mut stream: sys::cudaStream_t = ptr::null_mut();
    // SAFETY: the caller's; `stream` is a local out pointer.
    let status = unsafe { sys::cublasGetStream_v2(handle, &mut stream) };
    check("cublasGetStream", status, stream)
}

/// `cublasSetStream_v2`: the handle enqueues on `stream` from now on, and
/// its workspace is reset to cuBLAS's default.
///
/// # Safety
///
/// `handle` is a live cuBLAS handle, not used from another thread during
/// the call; `stream` is a live stream of the handle's context (or NULL,
/// the legacy stream).
pub(super) unsafe fn set_stream(
    handle: sys::cublasHandle_t,
    stream: sys::cudaStream_t,
) -> CublasResult<()> {
    // SAFETY: the caller's.
    let status = unsafe { sys::cublasSetStream_v2(handle, stream) };
    check("cublasSetStream", status, ())
}

/// `cublasSetWorkspace_v2`: `bytes` bytes at `workspace` are the handle's
/// workspace from now on (NULL and 0: none).
///
/// # Safety
///
/// `handle` is a live cuBLAS handle, not used from another thread during
/// the call; `workspace` is NULL with `bytes` 0, or addresses `bytes` bytes
/// of device memory of the handle's context, aligned as cuBLAS requires,
/// that stay allocated and used by nothing else for as long as work the
/// handle enqueues with them (or a graph that captured it) may run.
pub(super) unsafe fn set_workspace(
    handle: sys::cublasHandle_t,
    workspace: *mut c_void,
    bytes: usize,
) -> CublasResult<()> {
    // SAFETY: the caller's.
    let status = unsafe { sys::cublasSetWorkspace_v2(handle, workspace, bytes) };
    check("cublasSetWorkspace", status, ())
}
