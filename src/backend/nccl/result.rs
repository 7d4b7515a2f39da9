//! NCCL's entry points, one checked wrapper each, as the driver's are in
//! `backend/cuda/result.rs` (and cudarc's in `nccl/result.rs`): every raw
//! `sys::nccl*` call of the crate is here.
//!
//! Each wrapper makes one call, turns its out pointers into a return value
//! and its `ncclResult_t` into a [`BackendError::Nccl`] that keeps the raw
//! code and names the call. A wrapper is `unsafe` where the caller must
//! uphold something, said in its `# Safety` section: mostly that the
//! communicator it passes is live. Every call runs on the device of the
//! CUDA context current on this thread (the callers bind it first).
//!
//! The all-gather that connects a communicator needs a small device buffer
//! and two synchronous copies ([`scratch`]): those are driver calls,
//! through cudarc's checked driver layer (the crate's own,
//! `backend/cuda/result.rs`, is private to the `cuda` backend), named here
//! so the NCCL backend makes no foreign call of its own.

use std::ffi::{c_int, c_void};
use std::ptr;

use cudarc::nccl::sys;

use crate::backend::BackendError;

/// What a wrapper returns.
pub(super) type NcclResult<T> = std::result::Result<T, BackendError>;

/// `Ok(value)` on `ncclSuccess`, else the call's [`BackendError::Nccl`].
fn check<T>(op: &'static str, code: sys::ncclResult_t, value: T) -> NcclResult<T> {
    match code {
        sys::ncclResult_t::ncclSuccess => Ok(value),
        code => Err(BackendError::Nccl { call: op, code }),
    }
}

/// Communicators: ids, creation, destruction, rank and size.
pub(super) mod comm {
    use super::*;

    /// `ncclGetUniqueId`: the 128 bytes of a fresh id.
    pub(in super::super) fn unique_id() -> NcclResult<[u8; 128]> {
        let mut id = sys::ncclUniqueId { internal: [0; 128] };
        // SAFETY: a local out pointer.
        let code = unsafe { sys::ncclGetUniqueId(&mut id) };
        check("ncclGetUniqueId", code, id.internal.map(|c| c as u8))
    }

    /// `ncclCommInitRank`: joins the communicator of `id` as `rank` of
    /// `size`, on the current context's device; the communicator is the
    /// caller's. Blocks until every rank joined.
    pub(in super::super) fn init_rank(
        size: c_int,
        id: &[u8; 128],
        rank: c_int,
    ) -> NcclResult<sys::ncclComm_t> {
        let mut comm: sys::ncclComm_t = ptr::null_mut();
        let unique = sys::ncclUniqueId {
            internal: id.map(|b| b as _),
        };
        // SAFETY: a local out pointer; the id is passed by value; NCCL
        // checks the rank and size.
        let code = unsafe { sys::ncclCommInitRank(&mut comm, size, unique, rank) };
        check("ncclCommInitRank", code, comm)
    }

    /// `ncclCommDestroy`.
    ///
    /// # Safety
    ///
    /// `comm` came from [`init_rank`], is destroyed once, and nothing uses
    /// it afterwards (every window registered on it was deregistered).
    pub(in super::super) unsafe fn destroy(comm: sys::ncclComm_t) -> NcclResult<()> {
        // SAFETY: the caller's.
        check("ncclCommDestroy", unsafe { sys::ncclCommDestroy(comm) }, ())
    }

    /// `ncclCommUserRank`.
    ///
    /// # Safety
    ///
    /// `comm` is a live communicator.
    pub(in super::super) unsafe fn user_rank(comm: sys::ncclComm_t) -> NcclResult<c_int> {
        let mut rank: c_int = 0;
        // SAFETY: the caller's; `rank` is a local out pointer.
        let code = unsafe { sys::ncclCommUserRank(comm, &mut rank) };
        check("ncclCommUserRank", code, rank)
    }

    /// `ncclCommCount`.
    ///
    /// # Safety
    ///
    /// `comm` is a live communicator.
    pub(in super::super) unsafe fn count(comm: sys::ncclComm_t) -> NcclResult<c_int> {
        let mut size: c_int = 0;
        // SAFETY: the caller's; `size` is a local out pointer.
        let code = unsafe { sys::ncclCommCount(comm, &mut size) };
        check("ncclCommCount", code, size)
    }
}

/// Collectives.
pub(super) mod coll {
    use super::*;

    /// `ncclAllGather` of `count` elements per rank on `stream`.
    ///
    /// # Safety
    ///
    /// `comm` is a live communicator of the current context's device;
    /// `send` holds `count` elements of `dtype` and `recv` room for
    /// `count` times the communicator's size, both device memory valid
    /// until the collective completes on `stream` (a live stream of the
    /// context, or NULL for the legacy stream).
    pub(in super::super) unsafe fn all_gather(
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dtype: sys::ncclDataType_t,
        comm: sys::ncclComm_t,
        stream: cudarc::driver::sys::CUstream,
    ) -> NcclResult<()> {
        // SAFETY: the caller's.
        let code = unsafe {
            sys::ncclAllGather(send, recv, count, dtype, comm, stream as sys::cudaStream_t)
        };
        check("ncclAllGather", code, ())
    }

    /// `ncclReduceScatter` of `recv_count` elements per rank on `stream`.
    ///
    /// # Safety
    ///
    /// `comm` is a live communicator of the current context's device;
    /// `send` holds `recv_count` times the communicator's size elements of
    /// `dtype` and `recv` room for `recv_count`, both device memory valid
    /// until the collective (and every replay of a graph that captured it)
    /// completes on `stream`, a live stream of the context. A `send` in a
    /// symmetric window is registered on `comm`.
    pub(in super::super) unsafe fn reduce_scatter(
        send: *const c_void,
        recv: *mut c_void,
        recv_count: usize,
        dtype: sys::ncclDataType_t,
        op: sys::ncclRedOp_t,
        comm: sys::ncclComm_t,
        stream: cudarc::driver::sys::CUstream,
    ) -> NcclResult<()> {
        // SAFETY: the caller's.
        let code = unsafe {
            sys::ncclReduceScatter(
                send,
                recv,
                recv_count,
                dtype,
                op,
                comm,
                stream as sys::cudaStream_t,
            )
        };
        check("ncclReduceScatter", code, ())
    }
}

/// Memory NCCL allocates for windows.
pub(super) mod mem {
    use super::*;

    /// `ncclMemAlloc` of `bytes` bytes on the current context's device;
    /// the memory is the caller's.
    pub(in super::super) fn alloc(bytes: usize) -> NcclResult<*mut c_void> {
        let mut ptr: *mut c_void = ptr::null_mut();
        // SAFETY: a local out pointer.
        let code = unsafe { sys::ncclMemAlloc(&mut ptr, bytes) };
        check("ncclMemAlloc", code, ptr)
    }

    /// `ncclMemFree`.
    ///
    /// # Safety
    ///
    /// `ptr` came from [`alloc`], is freed once, after every use of it, and
    /// lies in no registered window.
    pub(in super::super) unsafe fn free(ptr: *mut c_void) -> NcclResult<()> {
        // SAFETY: the caller's.
        check("ncclMemFree", unsafe { sys::ncclMemFree(ptr) }, ())
    }
}

/// Windows: memory registered on a communicator.
pub(super) mod window {
    use super::*;

    /// `ncclCommWindowRegister`: `bytes` bytes at `ptr` as a window of
    /// `comm` with `flags` (`NCCL_WIN_*`). Collective: every rank
    /// registers its windows in the same order. The window is the
    /// caller's; NCCL may return success and a NULL window, which the
    /// caller refuses.
    ///
    /// # Safety
    ///
    /// `comm` is a live communicator; `ptr` holds `bytes` bytes from
    /// [`mem::alloc`](super::mem::alloc) that stay allocated until the
    /// window is deregistered.
    pub(in super::super) unsafe fn register(
        comm: sys::ncclComm_t,
        ptr: *mut c_void,
        bytes: usize,
        flags: c_int,
    ) -> NcclResult<sys::ncclWindow_t> {
        let mut window: sys::ncclWindow_t = ptr::null_mut();
        // SAFETY: the caller's; `window` is a local out pointer.
        let code = unsafe { sys::ncclCommWindowRegister(comm, ptr, bytes, &mut window, flags) };
        check("ncclCommWindowRegister", code, window)
    }

    /// `ncclCommWindowDeregister`.
    ///
    /// # Safety
    ///
    /// `window` was registered on `comm` (live) by [`register`], is
    /// deregistered once, and no work that uses it is pending.
    pub(in super::super) unsafe fn deregister(
        comm: sys::ncclComm_t,
        window: sys::ncclWindow_t,
    ) -> NcclResult<()> {
        // SAFETY: the caller's.
        let code = unsafe { sys::ncclCommWindowDeregister(comm, window) };
        check("ncclCommWindowDeregister", code, ())
    }
}

/// The device buffer of the all-gather that connects a communicator and
/// checks fingerprints: plain driver memory and synchronous copies,
/// through cudarc's checked driver layer. Errors are
/// [`BackendError::Driver`], naming the call.
pub(super) mod scratch {
    use cudarc::driver::result as cu;
    use cudarc::driver::sys::CUdeviceptr;

    use crate::backend::BackendError;

    fn driver(op: &'static str) -> impl Fn(cudarc::driver::DriverError) -> BackendError {
        move |e| BackendError::Driver {
            call: op,
            code: e.0,
        }
    }

    /// `cuMemAlloc` of `count` u64s in the current context; the buffer is
    /// the caller's.
    pub(in super::super) fn alloc_u64(count: usize) -> Result<CUdeviceptr, BackendError> {
        // SAFETY: a plain device allocation; without a current context the
        // driver returns an error.
        unsafe { cu::malloc_sync(8 * count) }.map_err(driver("cuMemAlloc"))
    }

    /// `cuMemcpyHtoD` of `values` to `dst`, synchronous.
    ///
    /// # Safety
    ///
    /// `dst` has room for `values` in device memory of the current context.
    pub(in super::super) unsafe fn write_u64(
        dst: CUdeviceptr,
        values: &[u64],
    ) -> Result<(), BackendError> {
        // SAFETY: the caller's.
        unsafe { cu::memcpy_htod_sync(dst, values) }.map_err(driver("cuMemcpyHtoD"))
    }

    /// `cuMemcpyDtoH` from `src` into `values`, synchronous: it waits for
    /// the legacy stream's work.
    ///
    /// # Safety
    ///
    /// `src` holds `values.len()` u64s of device memory of the current
    /// context.
    pub(in super::super) unsafe fn read_u64(
        values: &mut [u64],
        src: CUdeviceptr,
    ) -> Result<(), BackendError> {
        // SAFETY: the caller's.
        unsafe { cu::memcpy_dtoh_sync(values, src) }.map_err(driver("cuMemcpyDtoH"))
    }

    /// `cuMemFree`.
    ///
    /// # Safety
    ///
    /// `buf` came from [`alloc_u64`], is freed once, after every use of it.
    pub(in super::super) unsafe fn free(buf: CUdeviceptr) -> Result<(), BackendError> {
        // SAFETY: the caller's.
        unsafe { cu::free_sync(buf) }.map_err(driver("cuMemFree"))
    }
}
