//! Symmetric domains on NCCL (feature `nccl`).
//!
//! A [`Communicator`] is a crate-owned NCCL communicator for one
//! [`GroupId`]: the caller exchanges the [`UniqueId`] bytes between ranks
//! however it likes (a file, a TCP store, `MPI_Bcast`). A [`Device`] is
//! the `cuda` backend with an allocator of its own: one communicator per
//! group, which backs every arena of `Domain::Symmetric(group)`. It
//! implements the allocation role ([`Allocate`]) and the umbrella
//! [`Backend`] (its name; the device's graph memory is `cuda`'s); streams,
//! capture, launch, composition and timing are the `cuda` backend's,
//! implemented once for every handle of a CUDA device ([`cuda::AsDevice`]).
//! One `ncclMemAlloc`
//! allocation per arena of that domain (one per (generation, dtype) under
//! round-robin placement, one per dtype under packed), registered with
//! `ncclCommWindowRegister(.., NCCL_WIN_COLL_SYMMETRIC)` on exactly that
//! communicator before any capture, and deregistered and freed (after a
//! synchronize) on teardown. Memory of one group is never inside another
//! group's window: each window belongs to one communicator, and
//! [`Communicator::reduce_scatter`] refuses views outside its own windows.
//!
//! Symmetric collectives need equal offsets on every rank:
//! [`Communicator::check_fingerprint`] all-gathers
//! [`Planned::fingerprint`](crate::Planned::fingerprint) and
//! names the ranks that differ.

mod result;

use std::cell::RefCell;
use std::ffi::c_void;
use std::fmt;
use std::rc::Rc;

use cudarc::nccl::sys as nc;

use crate::backend::cuda::{self, Stream};
use crate::backend::{self, Allocate, ArenaDesc, Backend, BackendError, GraphMemory};
use crate::scope::check_use;
use crate::view::{Access, Misuse, NotSend, View};
use crate::vocab::{DType, Domain, GroupId};

type Result<T> = std::result::Result<T, BackendError>;

/// `NCCL_WIN_COLL_SYMMETRIC` from `nccl.h`.
const NCCL_WIN_COLL_SYMMETRIC: i32 = 0x01;

/// Whether the NCCL library can be loaded (without panicking when it cannot),
/// by the names cudarc's dynamic loading tries; under cudarc's linking modes
/// the loader bound it at start-up, so it is found again.
pub fn available() -> bool {
    crate::backend::cuda::open_library(&["nccl"]).is_some()
}

/// NCCL entry points this module calls; checked before the first call, since
/// cudarc panics on a missing symbol (NCCL before 2.28 has no symmetric windows).
const REQUIRED_SYMBOLS: [&str; 12] = [
    "ncclGetUniqueId",
    "ncclCommInitRank",
    "ncclCommDestroy",
    "ncclCommUserRank",
    "ncclCommCount",
    "ncclAllGather",
    "ncclReduceScatter",
    "ncclMemAlloc",
    "ncclMemFree",
    "ncclCommWindowRegister",
    "ncclCommWindowDeregister",
    "ncclGetVersion",
];

fn require_nccl() -> Result<()> {
    let Some(lib) = crate::backend::cuda::open_library(&["nccl"]) else {
        return Err(BackendError::Unavailable {
            reason: "libnccl.so could not be loaded (is NCCL installed and on LD_LIBRARY_PATH?)"
                .into(),
        });
    };
    let missing = crate::backend::cuda::missing_symbols(&lib, &REQUIRED_SYMBOLS);
    if missing.is_empty() {
        Ok(())
    } else {
        Err(BackendError::Unavailable {
            reason: format!(
                "the NCCL library lacks {}; NCCL 2.28 or newer is needed for symmetric windows",
                missing.join(", ")
            ),
        })
    }
}

/// The 128-byte id every rank of a communicator is created from. Rank 0
/// makes it with [`UniqueId::new`]; the caller sends its bytes to the others.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId([u8; 128]);

impl UniqueId {
    /// A fresh id (`ncclGetUniqueId`).
    pub fn new() -> Result<UniqueId> {
        require_nccl()?;
        result::comm::unique_id().map(UniqueId)
    }

    /// The bytes to send to the other ranks.
    pub fn as_bytes(&self) -> &[u8; 128] {
        &self.0
    }

    /// An id received from rank 0.
    pub fn from_bytes(bytes: [u8; 128]) -> UniqueId {
        UniqueId(bytes)
    }
}

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UniqueId({:02x?}..)", &self.0[..8])
    }
}

struct CommInner {
    /// The device the communicator lives on; bound before every NCCL call.
    cuda: cuda::Device,
    comm: nc::ncclComm_t,
    group: GroupId,
    rank: usize,
    size: usize,
    /// (base, bytes) of every window registered on this communicator.
    windows: RefCell<Vec<(u64, u64)>>,
    /// Created here (destroyed on drop), else adopted from the program.
    owned: bool,
}

impl Drop for CommInner {
    fn drop(&mut self) {
        // Every window holds an `Rc` to this, so all are deregistered by now.
        let _ = bind(&self.cuda);
        if self.owned {
            // SAFETY: `comm` came from ncclCommInitRank and is destroyed once.
            let _ = unsafe { result::comm::destroy(self.comm) };
        }
    }
}

/// A crate-owned NCCL communicator for one group. Not `Send`: NCCL
/// communicators and the windows registered on them stay on the thread (and
/// CUDA context) that made them.
#[derive(Clone)]
pub struct Communicator {
    inner: Rc<CommInner>,
    _not_send: NotSend,
}

impl fmt::Debug for Communicator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Communicator")
            .field("group", &self.inner.group)
            .field("rank", &self.inner.rank)
            .field("size", &self.inner.size)
            .field("windows", &self.inner.windows.borrow().len())
            .finish()
    }
}

impl Communicator {
    /// Joins communicator `id` as `rank` of `size` (`ncclCommInitRank`) on
    /// `backend`'s device. Every rank must call this (from its own thread or
    /// process) with the same id and size.
    pub fn new(
        backend: &cuda::Device,
        group: GroupId,
        id: &UniqueId,
        rank: usize,
        size: usize,
    ) -> Result<Communicator> {
        require_nccl()?;
        if size == 0 || rank >= size {
            return Err(BackendError::Refused {
                call: "ncclCommInitRank",
                reason: format!("rank {rank} of a communicator of size {size}"),
            });
        }
        bind(backend)?;
        let comm = result::comm::init_rank(size as i32, &id.0, rank as i32)?;
        Communicator::wrap(backend, group, comm, rank, size, true)
    }

    /// Adopts a communicator the program created (`ncclCommInitRank`, or
    /// cudarc's `Comm`) for `group`, on `backend`'s device. Rank and size are
    /// read from it. Like [`Communicator::new`], it is collective: every rank
    /// adopts its communicator at the same time (one all-gather connects the
    /// peers and checks the ranks). The program keeps ownership: dropping
    /// this does not destroy `comm`.
    ///
    /// # Safety
    ///
    /// `comm` is a live communicator on `backend`'s device, and stays alive
    /// (not destroyed, not aborted) for as long as this `Communicator`, its
    /// clones, or any backend, plan or window holding one exists.
    ///
    /// # Errors
    ///
    /// NCCL's error; [`BackendError::Refused`] when the ranks do not agree.
    pub unsafe fn adopt(
        backend: &cuda::Device,
        group: GroupId,
        comm: nc::ncclComm_t,
    ) -> Result<Communicator> {
        require_nccl()?;
        bind(backend)?;
        // SAFETY: the caller vouches for `comm`.
        let rank = unsafe { result::comm::user_rank(comm) }?;
        // SAFETY: as above.
        let size = unsafe { result::comm::count(comm) }?;
        Communicator::wrap(backend, group, comm, rank as usize, size as usize, false)
    }

    /// Wraps a live communicator and connects it (see `new`).
    fn wrap(
        backend: &cuda::Device,
        group: GroupId,
        comm: nc::ncclComm_t,
        rank: usize,
        size: usize,
        owned: bool,
    ) -> Result<Communicator> {
        let comm = Communicator {
            inner: Rc::new(CommInner {
                cuda: backend.clone(),
                comm,
                group,
                rank,
                size,
                windows: RefCell::new(Vec::new()),
                owned,
            }),
            _not_send: NotSend::default(),
        };
        // NCCL connects peers lazily, at a communicator's first collective,
        // which cannot happen inside a stream capture. Connect now, and check
        // that every rank joined with a distinct rank number.
        let ranks = comm.all_gather_u64(rank as u64)?;
        if ranks != (0..size as u64).collect::<Vec<_>>() {
            return Err(BackendError::Refused {
                call: "ncclCommInitRank",
                reason: format!("{group}: ranks reported {ranks:?}, expected 0..{size}"),
            });
        }
        Ok(comm)
    }

    /// The group this communicator serves.
    pub fn group(&self) -> GroupId {
        self.inner.group
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.inner.size
    }

    /// The raw `ncclComm_t`, for collectives this crate does not wrap. Do not
    /// destroy it; it lives as long as any clone of this communicator.
    pub fn raw(&self) -> nc::ncclComm_t {
        self.inner.comm
    }

    /// (base, bytes) of the windows currently registered on this
    /// communicator.
    pub fn windows(&self) -> Vec<(u64, u64)> {
        self.inner.windows.borrow().clone()
    }

    /// All-gathers every rank's plan fingerprint
    /// ([`Planned::fingerprint`](crate::Planned::fingerprint)) and fails,
    /// naming the ranks that differ from rank 0, unless all agree. Call it on
    /// every rank before [`Planned::allocate`](crate::Planned::allocate):
    /// window registration and symmetric collectives assume equal layouts
    /// everywhere.
    ///
    /// # Errors
    ///
    /// [`BackendError::FingerprintMismatch`], or NCCL's error.
    pub fn check_fingerprint(&self, fingerprint: u64) -> Result<()> {
        let all = self.all_gather_u64(fingerprint)?;
        let ranks: Vec<usize> = (0..all.len()).filter(|&r| all[r] != all[0]).collect();
        if ranks.is_empty() {
            Ok(())
        } else {
            Err(BackendError::FingerprintMismatch {
                group: self.inner.group,
                ranks,
                fingerprints: all,
            })
        }
    }

    fn all_gather_u64(&self, value: u64) -> Result<Vec<u64>> {
        bind(&self.inner.cuda)?;
        let size = self.inner.size;
        // A plain device allocation of `size` u64s, freed below.
        let buf = result::scratch::alloc_u64(size)?;
        let gathered = (|| -> Result<Vec<u64>> {
            let mine = buf + 8 * self.inner.rank as u64;
            // SAFETY: `mine` is inside `buf`.
            unsafe { result::scratch::write_u64(mine, &[value]) }?;
            // SAFETY: in-place all-gather (send = recv + rank * count) on the
            // legacy stream, waited for by the synchronous copy below.
            unsafe {
                result::coll::all_gather(
                    mine as *const c_void,
                    buf as *mut c_void,
                    1,
                    nc::ncclDataType_t::ncclUint64,
                    self.inner.comm,
                    std::ptr::null_mut(),
                )
            }?;
            let mut all = vec![0u64; size];
            // SAFETY: `buf` holds `size` u64s.
            unsafe { result::scratch::read_u64(&mut all, buf) }?;
            Ok(all)
        })();
        // SAFETY: allocated above; the synchronous copy finished all use.
        let freed = unsafe { result::scratch::free(buf) };
        let all = gathered?;
        freed?;
        Ok(all)
    }

    /// Reduce-scatters (sum) `send` into `recv` on `stream`; capturable, so it
    /// can be part of a runner's graph. `send` must be a view of this group's
    /// symmetric domain lying in one of this communicator's windows, with
    /// `size * recv.len()` elements of `recv`'s dtype. Both views are used
    /// where views may be: inside the closure of the capture or consumer
    /// that handed them out, on its stream (so the fence orders the
    /// collective, and teardown waits for it). `send` is only read, so it may
    /// be a [`ReadOnly`](crate::ReadOnly) view (a consumer's); `recv` is
    /// written, so it must be writable.
    ///
    /// # Errors
    ///
    /// [`BackendError::InvalidView`] for a view out of its closure or on
    /// another stream, a dtype or size mismatch, or a send view outside this
    /// communicator's windows; NCCL's error.
    pub fn reduce_scatter<A: Access>(
        &self,
        send: &View<'_, A>,
        recv: &View<'_>,
        stream: &Stream,
    ) -> Result<()> {
        if recv.dtype() != send.dtype() {
            return Err(BackendError::InvalidView {
                reason: Misuse::DTypesDiffer {
                    send: send.dtype(),
                    recv: recv.dtype(),
                },
            });
        }
        check_use(&recv.tag(), stream.serial, true)
            .map_err(|reason| BackendError::InvalidView { reason })?;
        // SAFETY: `recv` is a live view of `recv.len()` elements, used inside
        // its closure on that closure's (fenced) stream.
        unsafe { self.reduce_scatter_raw(send, recv.device_address(), recv.len(), stream) }
    }

    /// [`Communicator::reduce_scatter`] into a buffer outside the plan.
    /// `send` is checked as there.
    ///
    /// # Safety
    ///
    /// `recv` must point to `recv_len` elements of `send.dtype()` of device
    /// memory that stays valid until the reduce-scatter (and every replay of a
    /// graph that captured it) has completed.
    pub unsafe fn reduce_scatter_raw<A: Access>(
        &self,
        send: &View<'_, A>,
        recv: u64,
        recv_len: usize,
        stream: &Stream,
    ) -> Result<()> {
        check_use(&send.tag(), stream.serial, false)
            .map_err(|reason| BackendError::InvalidView { reason })?;
        self.check_send_view(send, recv_len)?;
        // SAFETY: checked above: `send` lies in a registered window and holds
        // size * recv_len elements; the caller vouches for `recv`.
        unsafe {
            result::coll::reduce_scatter(
                send.device_address() as *const c_void,
                recv as *mut c_void,
                recv_len,
                nccl_dtype(send.dtype()),
                nc::ncclRedOp_t::ncclSum,
                self.inner.comm,
                stream.cu_stream(),
            )
        }
    }

    fn check_send_view<A: Access>(&self, send: &View<'_, A>, recv_len: usize) -> Result<()> {
        let group = self.inner.group;
        if send.domain() != Domain::Symmetric(group) {
            return Err(BackendError::InvalidView {
                reason: Misuse::NotSymmetric {
                    group,
                    domain: send.domain(),
                },
            });
        }
        let (start, end) = (send.device_address(), send.device_address() + send.bytes());
        let inside = self
            .inner
            .windows
            .borrow()
            .iter()
            .any(|&(base, bytes)| start >= base && end <= base + bytes);
        if !inside {
            return Err(BackendError::InvalidView {
                reason: Misuse::OutsideWindows {
                    address: start,
                    group,
                },
            });
        }
        let expected = recv_len.checked_mul(self.inner.size);
        if expected != Some(send.len()) {
            return Err(BackendError::InvalidView {
                reason: Misuse::SendLength {
                    ranks: self.inner.size,
                    recv: recv_len,
                    send: send.len(),
                },
            });
        }
        Ok(())
    }
}

fn bind(backend: &cuda::Device) -> Result<()> {
    backend
        .context()
        .bind_to_thread()
        .map_err(|e| BackendError::Driver {
            call: "cuCtxSetCurrent",
            code: e.0,
        })
}

fn nccl_dtype(dtype: DType) -> nc::ncclDataType_t {
    use nc::ncclDataType_t as T;
    match dtype {
        DType::F64 => T::ncclFloat64,
        DType::F32 => T::ncclFloat32,
        DType::F16 => T::ncclFloat16,
        DType::BF16 => T::ncclBfloat16,
        DType::F8E4M3 => T::ncclFloat8e4m3,
        DType::F8E5M2 => T::ncclFloat8e5m2,
        DType::I64 => T::ncclInt64,
        DType::I32 => T::ncclInt32,
        DType::I8 => T::ncclInt8,
        DType::U8 => T::ncclUint8,
    }
}

/// One symmetric arena: `ncclMemAlloc` memory registered as a symmetric
/// window on one communicator. Dropping it deregisters, then frees (the
/// lifecycle synchronizes before any arena is dropped).
pub struct Window {
    comm: Rc<CommInner>,
    base: u64,
    bytes: u64,
    window: nc::ncclWindow_t,
}

impl fmt::Debug for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Window")
            .field("group", &self.comm.group)
            .field("base", &format_args!("{:#x}", self.base))
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl Window {
    /// Allocates and registers `bytes` on `comm`. Collective: every rank
    /// registers its windows in the same order (equal fingerprints ensure it).
    pub(crate) fn new(comm: &Communicator, bytes: u64) -> Result<Window> {
        let inner = &comm.inner;
        bind(&inner.cuda)?;
        let len = usize::try_from(bytes).map_err(|_| BackendError::Refused {
            call: "ncclMemAlloc",
            reason: format!("{bytes} bytes exceed the address space"),
        })?;
        let ptr = result::mem::alloc(len)?;
        // SAFETY: `ptr` holds `len` bytes from ncclMemAlloc, freed only after
        // the window is deregistered (or below, when it was never registered).
        let registered =
            unsafe { result::window::register(inner.comm, ptr, len, NCCL_WIN_COLL_SYMMETRIC) }
                .and_then(|window| {
                    if window.is_null() {
                        Err(BackendError::Refused {
                            call: "ncclCommWindowRegister",
                            reason: format!(
                                "returned success but a null window for {bytes} bytes on {}",
                                inner.group
                            ),
                        })
                    } else {
                        Ok(window)
                    }
                });
        let window = match registered {
            Ok(window) => window,
            Err(e) => {
                // SAFETY: allocated above, never registered.
                let _ = unsafe { result::mem::free(ptr) };
                return Err(e);
            }
        };
        let base = ptr as u64;
        inner.windows.borrow_mut().push((base, bytes));
        Ok(Window {
            comm: inner.clone(),
            base,
            bytes,
            window,
        })
    }

    /// Address of the first byte.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Size in bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The group whose communicator the window is registered on.
    pub fn group(&self) -> GroupId {
        self.comm.group
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        self.comm
            .windows
            .borrow_mut()
            .retain(|&(b, _)| b != self.base);
        let _ = bind(&self.comm.cuda);
        // SAFETY: registered on this communicator in `new` and deregistered
        // once; the memory came from ncclMemFree's allocator and is no longer
        // used (the lifecycle synchronized before dropping arenas).
        unsafe {
            let _ = result::window::deregister(self.comm.comm, self.window);
            let _ = result::mem::free(self.base as *mut c_void);
        }
    }
}

/// An arena of a [`Device`]: plain device memory or a symmetric window.
#[derive(Debug)]
pub enum Arena {
    /// A `Domain::Device` arena.
    Device(cuda::Arena),
    /// A `Domain::Symmetric` arena.
    Symmetric(Window),
}

impl backend::Arena for Arena {
    fn base(&self) -> u64 {
        match self {
            Arena::Device(a) => a.base(),
            Arena::Symmetric(w) => w.base(),
        }
    }

    fn bytes(&self) -> u64 {
        match self {
            Arena::Device(a) => a.bytes(),
            Arena::Symmetric(w) => w.bytes(),
        }
    }
}

/// The `cuda` backend with symmetric windows as its allocator: one
/// [`Communicator`] per symmetric group. `Domain::Device` arenas come from
/// the driver as in the `cuda` backend; `Domain::Symmetric(g)` arenas are
/// windows registered on `g`'s communicator. The roles [`Streams`],
/// [`Capture`], [`Launch`], [`Compose`] and [`Timing`] are the `cuda`
/// backend's, on [`Device::cuda`] ([`cuda::AsDevice`]). Not `Send`:
/// communicators stay on their thread.
///
/// [`Streams`]: crate::backend::Streams
/// [`Capture`]: crate::backend::Capture
/// [`Launch`]: crate::backend::Launch
/// [`Compose`]: crate::backend::Compose
/// [`Timing`]: crate::backend::Timing
///
/// ```no_run
/// use replay_arena::cuda;
/// use replay_arena::nccl::{self, Communicator, UniqueId};
/// use replay_arena::GroupId;
///
/// let cuda = cuda::Device::new(0)?;
/// let id = UniqueId::new()?; // rank 0 makes it; send id.as_bytes() to the others
/// let gtp = Communicator::new(&cuda, GroupId(0), &id, 0, 1)?;
/// let backend = nccl::Device::new(cuda).with_group(gtp)?;
/// # Ok::<(), replay_arena::Error>(())
/// ```
#[derive(Debug)]
pub struct Device {
    cuda: cuda::Device,
    groups: Vec<Communicator>,
}

impl Device {
    /// Wraps a `cuda` backend; add communicators with [`Device::with_group`].
    pub fn new(cuda: cuda::Device) -> Device {
        Device {
            cuda,
            groups: Vec::new(),
        }
    }

    /// Adds the communicator of one group (one per group).
    pub fn with_group(mut self, comm: Communicator) -> Result<Device> {
        if self.communicator(comm.group()).is_some() {
            return Err(BackendError::CommunicatorTwice {
                group: comm.group(),
            });
        }
        self.groups.push(comm);
        Ok(self)
    }

    /// The `cuda` backend underneath.
    pub fn cuda(&self) -> &cuda::Device {
        &self.cuda
    }

    /// The communicator of `group`.
    pub fn communicator(&self, group: GroupId) -> Option<&Communicator> {
        self.groups.iter().find(|c| c.group() == group)
    }
}

impl cuda::Sealed for Device {}

/// Every role but allocation is the `cuda` backend's, on this device.
impl cuda::AsDevice for Device {
    fn as_device(&self) -> &cuda::Device {
        &self.cuda
    }
}

/// `Domain::Device` arenas from the `cuda` backend; `Domain::Symmetric(g)`
/// arenas are windows registered on `g`'s communicator.
impl Allocate for Device {
    type Arena = Arena;

    fn allocate_arena(&self, plan: &ArenaDesc) -> Result<Arena> {
        match plan.key.domain {
            Domain::Device => self.cuda.allocate_arena(plan).map(Arena::Device),
            Domain::Symmetric(group) => {
                let comm = self
                    .communicator(group)
                    .ok_or(BackendError::NoCommunicator { group })?;
                Window::new(comm, plan.bytes)
                    .map(Arena::Symmetric)
                    .map_err(|e| BackendError::Allocation {
                        key: plan.key,
                        bytes: plan.bytes,
                        reason: e.to_string(),
                    })
            }
        }
    }
}

/// The device's graph memory is the `cuda` backend's.
impl Backend for Device {
    fn name(&self) -> &'static str {
        "cuda+nccl"
    }

    fn graph_memory_in_use(&self) -> Result<Option<GraphMemory>> {
        self.cuda.graph_memory_in_use().map(Some)
    }

    fn trim_graph_memory(&self) -> Result<()> {
        self.cuda.trim_graph_memory()
    }

    fn graph_memory_granule(&self) -> u64 {
        self.cuda.graph_memory_granule()
    }
}
