//! The `cuda` backend: the CUDA driver through cudarc, loaded at run time.
//!
//! - [`probe`] / [`probe_device`] say whether a usable driver and device exist,
//!   without panicking (cudarc panics when `libcuda` is missing and nothing
//!   checked first).
//! - [`CudaBackend::new`] retains the device's primary context, turns off
//!   cudarc's automatic event tracking on it (that tracking inserts event
//!   records and waits into captured streams; the plan's fence does the
//!   ordering instead) and creates an internal stream.
//! - [`CudaBackend::new_stream`] makes the non-blocking streams that work is
//!   captured on and replayed on. The default (null) stream cannot be captured.
//! - Arenas are `cuMemAlloc`'d outside every graph memory pool, aligned to
//!   [`ARENA_ALIGNMENT`], zeroed, and freed on drop. Events are created with
//!   `CU_EVENT_DISABLE_TIMING` and recorded once at creation. Captures use
//!   thread-local capture mode; a captured graph is instantiated at once and
//!   owned by a [`CudaGraph`].
//!
//! Driver errors are stored as the raw `CUresult` name, formatted by this
//! crate: formatting a cudarc `DriverError` calls into `libcuda`.
//!
//! Kernels are the caller's: compile them with cudarc's nvrtc (re-exported as
//! [`cudarc`]) and launch them on [`CudaStream::cudarc`] with views' raw
//! [`device_ptr`](crate::View::device_ptr)s as arguments.

use std::cell::Cell;
use std::ffi::{c_char, c_int, CStr};
use std::fmt;
use std::marker::PhantomData;
use std::ptr;
use std::sync::Arc;

pub use cudarc;
use cudarc::driver::sys;
use cudarc::driver::CudaContext;

use crate::backend::{Arena, ArenaDesc, Backend, BackendError};
use crate::vocab::{align_up, Domain, GroupId};

type Result<T> = std::result::Result<T, BackendError>;

/// Every arena's base address is a multiple of this (at least the largest
/// domain alignment).
pub const ARENA_ALIGNMENT: u64 = 4096;

/// Driver entry points this backend (and the parts of cudarc it uses) calls.
/// [`probe_device`] checks they all resolve before anything is called, so a
/// too-old driver is an error rather than a panic inside cudarc.
const REQUIRED_SYMBOLS: [&str; 33] = [
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDeviceTotalMem_v2",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamWaitEvent",
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuEventDestroy_v2",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemsetD8Async",
    "cuMemGetInfo_v2",
    "cuGraphInstantiateWithFlags",
    "cuGraphLaunch",
    "cuGraphGetNodes",
    "cuGraphNodeGetType",
    "cuGraphChildGraphNodeGetGraph",
    "cuGraphExecDestroy",
    "cuGraphDestroy",
];

/// `Ok(())` on `CUDA_SUCCESS`, else the code's name (no call into the driver).
fn check(op: &'static str, code: sys::CUresult) -> Result<()> {
    match code {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        code => Err(BackendError::Driver { op, code }),
    }
}

/// A cudarc error as this crate's error, without formatting it through cudarc.
fn driver_error(op: &'static str, error: cudarc::driver::DriverError) -> BackendError {
    BackendError::Driver { op, code: error.0 }
}

fn unavailable(reason: impl Into<String>) -> BackendError {
    BackendError::Unavailable {
        reason: reason.into(),
    }
}

/// What [`probe_device`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The device's ordinal.
    pub ordinal: usize,
    /// Devices the driver sees.
    pub device_count: usize,
    /// The device's name ("NVIDIA H200").
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Total device memory in bytes.
    pub total_memory: u64,
    /// The driver's CUDA version as `1000 * major + 10 * minor` (13000 is 13.0).
    pub driver_version: i32,
}

impl fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (device {} of {}, sm_{}{}, {:.1} GiB, CUDA driver {}.{})",
            self.name,
            self.ordinal,
            self.device_count,
            self.compute_capability.0,
            self.compute_capability.1,
            self.total_memory as f64 / (1u64 << 30) as f64,
            self.driver_version / 1000,
            self.driver_version % 1000 / 10
        )
    }
}

/// Whether a usable CUDA driver and device 0 exist; never panics.
///
/// `Err(BackendError::Unavailable { .. })` when `libcuda` is missing, lacks an
/// entry point this backend needs, fails to initialize, or sees no device.
pub fn probe() -> Result<DeviceInfo> {
    probe_device(0)
}

/// Like [`probe`], for the device with this ordinal.
pub fn probe_device(ordinal: usize) -> Result<DeviceInfo> {
    // SAFETY: loads and unloads the library by name; calls nothing in it.
    if !unsafe { sys::is_culib_present() } {
        return Err(unavailable(
            "the CUDA driver library (libcuda) was not found by the dynamic loader",
        ));
    }
    // SAFETY: the library is present (checked above), so `culib` does not
    // panic; looking a symbol up calls nothing.
    let lib = unsafe { sys::culib() };
    let missing: Vec<&str> = REQUIRED_SYMBOLS
        .iter()
        .copied()
        .filter(|name| unsafe { lib.get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_err())
        .collect();
    if !missing.is_empty() {
        return Err(unavailable(format!(
            "the CUDA driver library lacks {}; a CUDA 12 or newer driver is needed",
            missing.join(", ")
        )));
    }
    // SAFETY: every entry point called below was resolved above; all out
    // pointers point at live locals.
    unsafe {
        let code = sys::cuInit(0);
        if code != sys::CUresult::CUDA_SUCCESS {
            return Err(unavailable(format!("cuInit returned {code:?}")));
        }
        let mut driver_version: c_int = 0;
        check(
            "cuDriverGetVersion",
            sys::cuDriverGetVersion(&mut driver_version),
        )?;
        let mut count: c_int = 0;
        let code = sys::cuDeviceGetCount(&mut count);
        if code != sys::CUresult::CUDA_SUCCESS {
            return Err(unavailable(format!("cuDeviceGetCount returned {code:?}")));
        }
        let device_count = usize::try_from(count).unwrap_or(0);
        if ordinal >= device_count {
            return Err(unavailable(format!(
                "CUDA device {ordinal} does not exist: the driver sees {device_count} device(s)"
            )));
        }
        let mut device: sys::CUdevice = 0;
        check(
            "cuDeviceGet",
            sys::cuDeviceGet(&mut device, ordinal as c_int),
        )?;
        let mut name = [0 as c_char; 256];
        check(
            "cuDeviceGetName",
            sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as c_int, device),
        )?;
        let name = CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned();
        let attribute = |attribute| {
            let mut value: c_int = 0;
            check(
                "cuDeviceGetAttribute",
                sys::cuDeviceGetAttribute(&mut value, attribute, device),
            )
            .map(|()| value)
        };
        let major =
            attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor =
            attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let mut total: usize = 0;
        check(
            "cuDeviceTotalMem",
            sys::cuDeviceTotalMem_v2(&mut total, device),
        )?;
        Ok(DeviceInfo {
            ordinal,
            device_count,
            name,
            compute_capability: (major, minor),
            total_memory: total as u64,
            driver_version,
        })
    }
}

/// The `cuda` backend: one device's primary context. A cheap handle; clones
/// share the context.
///
/// ```no_run
/// use replay_arena::cuda::CudaBackend;
///
/// let backend = CudaBackend::new(0)?;          // BackendUnavailable without a driver
/// let stream = backend.new_stream()?;          // capture and replay on this
/// println!("{}", backend.info());
/// # Ok::<(), replay_arena::Error>(())
/// ```
#[derive(Clone)]
pub struct CudaBackend {
    inner: Arc<Inner>,
}

struct Inner {
    ctx: Arc<CudaContext>,
    /// Where events get their first record and arenas their zeroing.
    internal: Arc<cudarc::driver::CudaStream>,
    info: DeviceInfo,
}

impl fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaBackend")
            .field("device", &self.inner.info)
            .finish_non_exhaustive()
    }
}

impl CudaBackend {
    /// Opens device `ordinal`: probes the driver ([`probe_device`]), retains
    /// the primary context, turns off cudarc's automatic event tracking on
    /// it, and creates an internal stream.
    ///
    /// `Err(BackendError::Unavailable { .. })` when there is no usable driver
    /// or no such device; never panics.
    pub fn new(ordinal: usize) -> Result<CudaBackend> {
        let info = probe_device(ordinal)?;
        let ctx = CudaContext::new(ordinal).map_err(|e| {
            unavailable(format!(
                "retaining the primary context of CUDA device {ordinal} returned {:?}",
                e.0
            ))
        })?;
        // SAFETY: cudarc's tracking records and waits on events around every
        // use of a slice it allocated, which would put foreign event nodes
        // into captured graphs. Turning it off before anything is allocated
        // makes cross-stream ordering the caller's job: the plan's fence
        // orders arena use, and callers order their own slices.
        unsafe { ctx.disable_event_tracking() };
        let internal = ctx
            .new_stream()
            .map_err(|e| driver_error("cuStreamCreate", e))?;
        Ok(CudaBackend {
            inner: Arc::new(Inner {
                ctx,
                internal,
                info,
            }),
        })
    }

    /// What the probe found for this device.
    pub fn info(&self) -> &DeviceInfo {
        &self.inner.info
    }

    /// The cudarc context (event tracking is off on it: slices allocated
    /// through it are not ordered across streams automatically).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.inner.ctx
    }

    /// A new non-blocking stream, usable for capture and replay.
    pub fn new_stream(&self) -> Result<CudaStream> {
        let inner = self
            .inner
            .ctx
            .new_stream()
            .map_err(|e| driver_error("cuStreamCreate", e))?;
        Ok(CudaStream { inner })
    }

    /// Wraps a cudarc stream of this backend's context (the default stream
    /// may be wrapped for replay, but cannot be captured).
    pub fn wrap_stream(&self, stream: Arc<cudarc::driver::CudaStream>) -> Result<CudaStream> {
        if stream.context().cu_ctx() != self.inner.ctx.cu_ctx() {
            return Err(BackendError::Refused {
                op: "wrap stream",
                reason: "the stream belongs to another CUDA context".into(),
            });
        }
        Ok(CudaStream { inner: stream })
    }

    /// Free and total device memory in bytes (`cuMemGetInfo`).
    pub fn mem_info(&self) -> Result<(u64, u64)> {
        self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: the context is current; out pointers point at locals.
        check("cuMemGetInfo", unsafe {
            sys::cuMemGetInfo_v2(&mut free, &mut total)
        })?;
        Ok((free as u64, total as u64))
    }

    /// Makes the context current on the calling thread.
    fn bind(&self) -> Result<()> {
        self.inner
            .ctx
            .bind_to_thread()
            .map_err(|e| driver_error("cuCtxSetCurrent", e))
    }

    fn allocate_device(&self, plan: &ArenaDesc) -> Result<CudaArena> {
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
        let mut raw: sys::CUdeviceptr = 0;
        // SAFETY: the context is current; `raw` is a live local.
        let code = unsafe { sys::cuMemAlloc_v2(&mut raw, padded) };
        if code != sys::CUresult::CUDA_SUCCESS {
            return Err(failed(format!(
                "cuMemAlloc of {padded} bytes returned {code:?}"
            )));
        }
        let base = align_up(raw, ARENA_ALIGNMENT).unwrap_or(raw);
        // From here on, dropping `arena` frees the allocation.
        let arena = CudaArena {
            raw,
            base,
            bytes: plan.bytes,
            ctx: self.inner.ctx.clone(),
        };
        let internal = self.inner.internal.cu_stream();
        // SAFETY: [base, base + bytes) lies inside the allocation (base - raw
        // < ARENA_ALIGNMENT); the internal stream belongs to the context.
        unsafe {
            check(
                "cuMemsetD8Async",
                sys::cuMemsetD8Async(base, 0, plan.bytes as usize, internal),
            )?;
            check("cuStreamSynchronize", sys::cuStreamSynchronize(internal))?;
        }
        Ok(arena)
    }

    #[cfg(not(feature = "nccl"))]
    fn allocate_symmetric(&self, plan: &ArenaDesc, group: GroupId) -> Result<CudaArena> {
        Err(BackendError::Allocation {
            key: plan.key,
            bytes: plan.bytes,
            reason: format!(
                "symmetric memory of {group} needs NCCL windows, and this build has no `nccl` feature"
            ),
        })
    }

    #[cfg(feature = "nccl")]
    fn allocate_symmetric(&self, _plan: &ArenaDesc, group: GroupId) -> Result<CudaArena> {
        Err(BackendError::NoCommunicator { group })
    }

    /// Counts memory allocation and free nodes in `graph` and, recursively,
    /// in its child graphs.
    fn count_memory_nodes(
        &self,
        graph: sys::CUgraph,
        depth: usize,
        counts: &mut (usize, usize),
    ) -> std::result::Result<(), String> {
        if depth > 64 {
            return Err("child graphs nest more than 64 deep".into());
        }
        let inspect = |op: &str, code: sys::CUresult| match code {
            sys::CUresult::CUDA_SUCCESS => Ok(()),
            code => Err(format!(
                "could not inspect the graph: {op} returned {code:?}"
            )),
        };
        let mut n = 0usize;
        // SAFETY: `graph` is a live graph of this context (the context is
        // current); with a null node array the call only writes the count.
        inspect("cuGraphGetNodes", unsafe {
            sys::cuGraphGetNodes(graph, ptr::null_mut(), &mut n)
        })?;
        if n == 0 {
            // An empty graph (a runner whose capture enqueued nothing).
            return Ok(());
        }
        let mut nodes: Vec<sys::CUgraphNode> = vec![ptr::null_mut(); n];
        // SAFETY: `nodes` has room for `n` nodes.
        inspect("cuGraphGetNodes", unsafe {
            sys::cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut n)
        })?;
        nodes.truncate(n);
        let alloc = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC as u32;
        let free = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_FREE as u32;
        let child = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_GRAPH as u32;
        for node in nodes {
            // Read as a plain integer: a newer driver may report a node type
            // cudarc's enum does not list.
            let mut kind: u32 = u32::MAX;
            // SAFETY: `node` belongs to `graph`; the node type is a 32-bit
            // C enum written into a `u32`.
            inspect("cuGraphNodeGetType", unsafe {
                sys::cuGraphNodeGetType(node, (&mut kind as *mut u32).cast())
            })?;
            if kind == alloc {
                counts.0 += 1;
            } else if kind == free {
                counts.1 += 1;
            } else if kind == child {
                let mut sub: sys::CUgraph = ptr::null_mut();
                // SAFETY: `node` is a child graph node; the child graph stays
                // owned by it.
                inspect("cuGraphChildGraphNodeGetGraph", unsafe {
                    sys::cuGraphChildGraphNodeGetGraph(node, &mut sub)
                })?;
                self.count_memory_nodes(sub, depth + 1, counts)?;
            }
        }
        Ok(())
    }
}

/// A stream of a [`CudaBackend`]'s context. Cheap to clone; clones are the
/// same stream.
#[derive(Clone, Debug)]
pub struct CudaStream {
    inner: Arc<cudarc::driver::CudaStream>,
}

impl CudaStream {
    /// The cudarc stream, to launch kernels on (`launch_builder`) or copy
    /// memory with.
    pub fn cudarc(&self) -> &Arc<cudarc::driver::CudaStream> {
        &self.inner
    }

    /// The raw `CUstream` (do not destroy it).
    pub fn cu_stream(&self) -> sys::CUstream {
        self.inner.cu_stream()
    }

    /// Blocks until everything submitted to this stream is done.
    pub fn synchronize(&self) -> Result<()> {
        self.inner
            .synchronize()
            .map_err(|e| driver_error("cuStreamSynchronize", e))
    }

    /// Whether this is the legacy or per-thread default stream, which cannot
    /// be captured.
    fn is_default(&self) -> bool {
        let raw = self.cu_stream() as usize;
        raw == 0 || raw == 1 || raw == 2
    }
}

/// Device memory of one arena, allocated with `cuMemAlloc` outside every
/// graph memory pool; freed on drop.
#[derive(Debug)]
pub struct CudaArena {
    /// What `cuMemAlloc` returned (what `cuMemFree` takes).
    raw: sys::CUdeviceptr,
    /// `raw` rounded up to [`ARENA_ALIGNMENT`].
    base: u64,
    bytes: u64,
    ctx: Arc<CudaContext>,
}

impl Arena for CudaArena {
    fn base(&self) -> u64 {
        self.base
    }

    fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for CudaArena {
    fn drop(&mut self) {
        // The plan synchronized before dropping arenas. A failure here (a
        // dead context) leaves nothing to free.
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: `raw` came from cuMemAlloc in this context and is freed
            // once.
            let _ = unsafe { sys::cuMemFree_v2(self.raw) };
        }
    }
}

/// A completion event (`CU_EVENT_DISABLE_TIMING`), recorded once at creation.
#[derive(Debug)]
pub struct CudaEvent {
    inner: cudarc::driver::CudaEvent,
}

impl CudaEvent {
    /// The raw `CUevent` (do not destroy it).
    pub fn cu_event(&self) -> sys::CUevent {
        self.inner.cu_event()
    }
}

/// Raw graph handles; moved between threads only inside a [`CudaGraph`].
struct GraphHandles {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

// SAFETY: graph handles may be used from any thread that makes their context
// current (every call here does); `CudaGraph` is `!Sync`, so they are never
// used from two threads at once.
unsafe impl Send for GraphHandles {}

/// A captured graph and its instantiation, owned by the plan once the
/// runner's capture finishes. `Send` but not `Sync`: CUDA graph objects must
/// not be used from two threads at once.
pub struct CudaGraph {
    handles: GraphHandles,
    ctx: Arc<CudaContext>,
    _not_sync: PhantomData<Cell<()>>,
}

impl fmt::Debug for CudaGraph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaGraph")
            .field("graph", &self.handles.graph)
            .field("exec", &self.handles.exec)
            .finish()
    }
}

impl CudaGraph {
    /// The raw `CUgraph` (do not destroy it).
    pub fn cu_graph(&self) -> sys::CUgraph {
        self.handles.graph
    }

    /// The raw `CUgraphExec` (do not destroy it).
    pub fn cu_graph_exec(&self) -> sys::CUgraphExec {
        self.handles.exec
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: both handles are owned by this graph and destroyed once;
            // the plan synchronized before dropping graphs.
            unsafe {
                let _ = sys::cuGraphExecDestroy(self.handles.exec);
                let _ = sys::cuGraphDestroy(self.handles.graph);
            }
        }
    }
}

impl Backend for CudaBackend {
    type Arena = CudaArena;
    type Event = CudaEvent;
    type Stream = CudaStream;
    type Graph = CudaGraph;

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn allocate_arena(&self, plan: &ArenaDesc) -> Result<CudaArena> {
        match plan.key.domain {
            Domain::Device => self.allocate_device(plan),
            Domain::Symmetric(group) => self.allocate_symmetric(plan, group),
        }
    }

    fn create_event(&self) -> Result<CudaEvent> {
        let inner = self
            .inner
            .ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(|e| driver_error("cuEventCreate", e))?;
        inner
            .record(&self.inner.internal)
            .map_err(|e| driver_error("cuEventRecord", e))?;
        Ok(CudaEvent { inner })
    }

    fn stream_id(&self, stream: &CudaStream) -> u64 {
        stream.cu_stream() as u64
    }

    fn wait_event(&self, stream: &CudaStream, event: &CudaEvent) -> Result<()> {
        self.bind()?;
        // SAFETY: both handles are live objects of this context.
        check("cuStreamWaitEvent", unsafe {
            sys::cuStreamWaitEvent(stream.cu_stream(), event.cu_event(), 0)
        })
    }

    fn record_event(&self, stream: &CudaStream, event: &CudaEvent) -> Result<()> {
        self.bind()?;
        // SAFETY: both handles are live objects of this context.
        check("cuEventRecord", unsafe {
            sys::cuEventRecord(event.cu_event(), stream.cu_stream())
        })
    }

    fn synchronize_event(&self, event: &CudaEvent) -> Result<()> {
        self.bind()?;
        // SAFETY: the event is a live object of this context.
        check("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(event.cu_event())
        })
    }

    fn launch(&self, graph: &CudaGraph, stream: &CudaStream) -> Result<()> {
        self.bind()?;
        // SAFETY: the exec and the stream are live objects of this context.
        check("cuGraphLaunch", unsafe {
            sys::cuGraphLaunch(graph.handles.exec, stream.cu_stream())
        })
    }

    fn begin_capture(&self, stream: &CudaStream) -> Result<()> {
        if stream.is_default() {
            return Err(BackendError::Refused {
                op: "cuStreamBeginCapture",
                reason: "the default (null) stream cannot be captured; capture on a stream from CudaBackend::new_stream".into(),
            });
        }
        self.bind()?;
        // SAFETY: the stream is a live, non-default stream of this context.
        check("cuStreamBeginCapture", unsafe {
            sys::cuStreamBeginCapture_v2(
                stream.cu_stream(),
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        })
    }

    fn end_capture(&self, stream: &CudaStream) -> Result<CudaGraph> {
        self.bind()?;
        let mut graph: sys::CUgraph = ptr::null_mut();
        // SAFETY: the stream is live; `graph` is a local out pointer.
        let code = unsafe { sys::cuStreamEndCapture(stream.cu_stream(), &mut graph) };
        if code != sys::CUresult::CUDA_SUCCESS || graph.is_null() {
            if !graph.is_null() {
                // SAFETY: the graph was returned to us and is destroyed once.
                let _ = unsafe { sys::cuGraphDestroy(graph) };
            }
            check("cuStreamEndCapture", code)?;
            return Err(BackendError::Refused {
                op: "cuStreamEndCapture",
                reason: "the capture produced no graph".into(),
            });
        }
        let mut exec: sys::CUgraphExec = ptr::null_mut();
        // SAFETY: `graph` is live; `exec` is a local out pointer.
        let code = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) };
        if let Err(e) = check("cuGraphInstantiate", code) {
            // SAFETY: the graph is ours and destroyed once.
            let _ = unsafe { sys::cuGraphDestroy(graph) };
            return Err(e);
        }
        Ok(CudaGraph {
            handles: GraphHandles { graph, exec },
            ctx: self.inner.ctx.clone(),
            _not_sync: PhantomData,
        })
    }

    fn abort_capture(&self, stream: &CudaStream) {
        if self.bind().is_err() {
            return;
        }
        let mut graph: sys::CUgraph = ptr::null_mut();
        // SAFETY: ending a capture (or failing to, when none is open) leaves
        // the stream usable; a returned graph is destroyed once.
        unsafe {
            let _ = sys::cuStreamEndCapture(stream.cu_stream(), &mut graph);
            if !graph.is_null() {
                let _ = sys::cuGraphDestroy(graph);
            }
        }
    }

    fn validate_graph(&self, graph: &CudaGraph) -> std::result::Result<(), String> {
        self.bind().map_err(|e| e.to_string())?;
        let mut counts = (0, 0);
        self.count_memory_nodes(graph.handles.graph, 0, &mut counts)?;
        match counts {
            (0, 0) => Ok(()),
            (allocs, frees) => Err(format!(
                "it contains {allocs} memory allocation node(s) and {frees} memory free node(s) \
                 (stream-ordered allocation such as cuMemAllocAsync during capture); graph memory \
                 nodes make later launches invalid, so allocate every buffer the graph uses before \
                 capture or take it from the plan"
            )),
        }
    }

    fn synchronize(&self) -> Result<()> {
        self.inner
            .ctx
            .synchronize()
            .map_err(|e| driver_error("cuCtxSynchronize", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::Replayable;
    use static_assertions::{assert_impl_all, assert_not_impl_any};

    assert_impl_all!(CudaBackend: Send, Sync, Clone);
    assert_impl_all!(CudaStream: Send, Sync, Clone);
    assert_impl_all!(CudaArena: Send, Sync);
    assert_impl_all!(CudaEvent: Send, Sync);
    assert_impl_all!(CudaGraph: Send);
    assert_not_impl_any!(CudaGraph: Sync, Clone);
    assert_impl_all!(Replayable<CudaBackend>: Send);

    #[test]
    fn device_info_displays_name_capability_memory_and_driver() {
        let info = DeviceInfo {
            ordinal: 0,
            device_count: 1,
            name: "NVIDIA H200".into(),
            compute_capability: (9, 0),
            total_memory: 150 << 30,
            driver_version: 13000,
        };
        assert_eq!(
            info.to_string(),
            "NVIDIA H200 (device 0 of 1, sm_90, 150.0 GiB, CUDA driver 13.0)"
        );
    }
}
