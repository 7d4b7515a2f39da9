//! Arena memory: allocated from the device's default memory pool, outside
//! every graph memory pool, aligned, zeroed, and freed stream-ordered.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use cudarc::driver::CudaContext;

use super::device::Device;
use super::result;
use super::{sys, Result, ARENA_ALIGNMENT};
use crate::backend::{self, ArenaDesc, BackendError};
use crate::vocab::{align_up, GroupId};

/// Device memory of one arena, allocated outside every graph memory pool
/// (from the device's default memory pool where it has one); freed on drop
/// without waiting for unrelated streams.
#[derive(Debug)]
pub struct Arena {
    /// What the allocation returned (what the free takes).
    raw: sys::CUdeviceptr,
    /// `raw` rounded up to [`ARENA_ALIGNMENT`].
    base: u64,
    bytes: u64,
    /// From `cuMemAllocAsync` (freed with `cuMemFreeAsync`), else from
    /// `cuMemAlloc`.
    pooled: bool,
    ctx: Arc<CudaContext>,
    /// The backend's internal stream, which orders the free.
    internal: Arc<cudarc::driver::CudaStream>,
}

impl backend::Arena for Arena {
    fn base(&self) -> u64 {
        self.base
    }

    fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// Addresses of views lent as cudarc views
/// ([`ViewExt::with_cudarc`](super::ViewExt::with_cudarc)) whose arenas
/// are still allocated. cudarc's view types let work go to any stream, and
/// the crate cannot follow those: the free of an arena that was lent waits
/// for the whole context, so no such work can run on freed bytes.
static LENT: Mutex<BTreeSet<u64>> = Mutex::new(BTreeSet::new());

/// Remembers that the view at `addr` was lent as a cudarc view.
pub(super) fn note_lent(addr: u64) {
    LENT.lock().unwrap_or_else(|p| p.into_inner()).insert(addr);
}

/// Whether a view in `[base, base + bytes)` was lent; forgets them.
fn take_lent(base: u64, bytes: u64) -> bool {
    let mut lent = LENT.lock().unwrap_or_else(|p| p.into_inner());
    let inside: Vec<u64> = lent
        .range(base..base.saturating_add(bytes.max(1)))
        .copied()
        .collect();
    for addr in &inside {
        lent.remove(addr);
    }
    !inside.is_empty()
}

impl Drop for Arena {
    fn drop(&mut self) {
        // The plan waited for every fenced use before dropping arenas. A
        // failure here (a dead context) leaves nothing to free; it is kept
        // on the context for the program's next check, as cudarc does.
        if let Err(e) = self.ctx.bind_to_thread() {
            self.ctx.record_err::<()>(Err(e));
            return;
        }
        if take_lent(self.base, self.bytes) {
            // Work a lent cudarc view put on a stream the crate never saw
            // must be done before the bytes go back to the pool.
            self.ctx.record_err(self.ctx.synchronize());
        }
        // SAFETY: `raw` came from the matching allocation in this context
        // and is freed once; the stream-ordered free does not wait for the
        // program's other streams (a plain cuMemFree may).
        let freed = unsafe {
            if self.pooled {
                result::mem::free_async(self.raw, self.internal.cu_stream())
            } else {
                result::mem::free(self.raw)
            }
        };
        self.ctx
            .record_err(freed.map_err(result::DriverError::to_cudarc));
    }
}

impl Device {
    pub(super) fn allocate_device(&self, plan: &ArenaDesc) -> Result<Arena> {
        let failed = |reason: String| BackendError::Allocation {
            key: plan.key,
            bytes: plan.bytes,
            reason,
        };
        let padded = plan
            .bytes
            .checked_add(ARENA_ALIGNMENT)
            .and_then(|b| usize::try_from(b).ok())
            .ok_or_else(|| failed("the size overflows the address space".into()))?;
        self.bind()?;
        let internal = self.inner.internal.clone();
        let pooled = self.inner.ctx.has_async_alloc();
        // SAFETY: the context is current; the internal stream belongs to
        // the context.
        let allocated = unsafe {
            if pooled {
                result::mem::alloc_async(padded, internal.cu_stream())
            } else {
                result::mem::alloc(padded)
            }
        };
        let raw = allocated.map_err(|result::DriverError { call: op, code }| {
            failed(format!("{op} of {padded} bytes returned {code:?}"))
        })?;
        let base = align_up(raw, ARENA_ALIGNMENT).unwrap_or(raw);
        // From here on, dropping `arena` frees the allocation.
        let arena = Arena {
            raw,
            base,
            bytes: plan.bytes,
            pooled,
            ctx: self.inner.ctx.clone(),
            internal,
        };
        let stream = arena.internal.cu_stream();
        // SAFETY: [base, base + bytes) lies inside the allocation (base - raw
        // < ARENA_ALIGNMENT); the internal stream belongs to the context and
        // orders the zeroing after the allocation.
        unsafe {
            result::mem::set_d8_async(base, 0, plan.bytes as usize, stream)?;
            result::stream::synchronize(stream)?;
        }
        Ok(arena)
    }

    #[cfg(not(replay_arena_nccl))]
    pub(super) fn allocate_symmetric(&self, plan: &ArenaDesc, group: GroupId) -> Result<Arena> {
        Err(BackendError::Allocation {
            key: plan.key,
            bytes: plan.bytes,
            reason: format!(
                "symmetric memory of {group} needs NCCL windows, and this build has no `nccl` feature"
            ),
        })
    }

    #[cfg(replay_arena_nccl)]
    pub(super) fn allocate_symmetric(&self, _plan: &ArenaDesc, group: GroupId) -> Result<Arena> {
        Err(BackendError::NoCommunicator { group })
    }
}
