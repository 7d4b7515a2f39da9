//! The `cuda` backend: the CUDA driver through cudarc.
//!
//! - [`probe`] / [`probe_device`] say whether a usable driver and device exist,
//!   without panicking in any of cudarc's linking modes: they first check
//!   that `libcuda` and every entry point used can be loaded, by the names
//!   cudarc's dynamic loading tries (cudarc panics when they cannot).
//! - [`Device::new`] retains a device's primary context in a cudarc
//!   context of its own; [`Device::from_context`] adopts the program's
//!   `Arc<CudaContext>` (candle's, cubecl's, a hand-written cudarc
//!   program's). cudarc's automatic event tracking must be off on an adopted
//!   context (it inserts waits on events recorded outside a capture): a
//!   context that tracks is refused with [`BackendError::EventTracking`],
//!   unless adopted through
//!   [`Device::from_context_disabling_event_tracking`].
//! - [`Device::new_stream`] makes non-blocking streams;
//!   [`Device::wrap_stream`] adopts the program's, the per-thread
//!   default stream included. Only the legacy NULL stream is refused
//!   ([`BackendError::LegacyStream`]): the driver cannot capture it.
//! - Arenas come from the device's default memory pool (`cuMemAllocAsync`,
//!   `cuMemAlloc` where pools are unsupported), outside every graph memory
//!   pool, aligned to [`ARENA_ALIGNMENT`] and zeroed; they are freed with
//!   `cuMemFreeAsync`, which does not wait for the program's other streams.
//!   Events are created with `CU_EVENT_DISABLE_TIMING` and recorded once at
//!   creation.
//! - Captures use the [`CaptureMode`] set on the backend (thread-local by
//!   default); a captured graph is instantiated at once, uploaded to the
//!   device on the capture stream (so the first replay does not pay the
//!   upload; see [`Device::set_graph_upload`]) and owned by a
//!   [`Graph`], whose raw `CUgraphExec` stays reachable.
//! - Views become typed cudarc device pointers through [`ViewExt::as_cuda`]:
//!   a [`TypedView`] implements cudarc's `DevicePtr` and `DevicePtrMut`, so
//!   `memcpy_dtod`, `memset_zeros`, cuBLAS and `launch_builder().arg(..)`
//!   take it. It never frees arena memory.
//!
//! Driver errors are stored as the raw `CUresult`, formatted by this crate:
//! formatting a cudarc `DriverError` calls into `libcuda`.

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::fmt;
use std::marker::PhantomData;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};

pub use cudarc;
use cudarc::driver::sys;
use cudarc::driver::{
    CudaContext, DevicePtr, DevicePtrMut, DeviceRepr, DeviceSlice, LaunchArgs, PushKernelArg,
    SyncOnDrop,
};

use crate::backend::{
    check_memory_nodes, Arena, ArenaDesc, Backend, BackendError, GraphMemory, StepNode,
};
use crate::scope::{check_use, read_only, retired, ScopeKind, SharedScope};
use crate::view::View;
use crate::vocab::{align_up, DType, Domain, GroupId};

type Result<T> = std::result::Result<T, BackendError>;

/// Every arena's base address is a multiple of this (at least the largest
/// domain alignment).
pub const ARENA_ALIGNMENT: u64 = 4096;

/// Driver entry points this backend (and the parts of cudarc it uses) calls.
/// [`probe_device`] checks they all resolve before anything is called, so a
/// too-old driver is an error rather than a panic inside cudarc.
const REQUIRED_SYMBOLS: [&str; 46] = [
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
    "cuStreamIsCapturing",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuEventDestroy_v2",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemAllocAsync",
    "cuMemFreeAsync",
    "cuMemsetD8Async",
    "cuMemGetInfo_v2",
    "cuGraphInstantiateWithFlags",
    "cuGraphUpload",
    "cuGraphLaunch",
    "cuGraphGetNodes",
    "cuGraphNodeGetType",
    "cuGraphChildGraphNodeGetGraph",
    "cuGraphMemAllocNodeGetParams",
    "cuGraphClone",
    "cuGraphCreate",
    "cuGraphAddChildGraphNode",
    "cuGraphNodeFindInClone",
    "cuGraphDestroyNode",
    "cuGraphEventRecordNodeGetEvent",
    "cuDeviceGetGraphMemAttribute",
    "cuGraphMemFreeNodeGetParams",
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
#[non_exhaustive]
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

/// File names for a library `stem` (`"cuda"`, `"nvcuda"`, `"nccl"`) in the
/// order cudarc's dynamic loading tries them: the plain name, its numbered
/// Windows-style names and the sonames `.so.13` to `.so.1`, for each CUDA
/// major version cudarc has bindings for (cudarc tries its own major's).
fn library_candidates(stem: &str) -> Vec<String> {
    use std::env::consts::{DLL_PREFIX, DLL_SUFFIX};
    let base = format!("{DLL_PREFIX}{stem}{DLL_SUFFIX}");
    let mut names = vec![base.clone(), format!("{DLL_PREFIX}{stem}64{DLL_SUFFIX}")];
    for major in [13, 12, 11] {
        names.push(format!("{DLL_PREFIX}{stem}64_{major}{DLL_SUFFIX}"));
        names.push(format!("{DLL_PREFIX}{stem}64_{major}0_0{DLL_SUFFIX}"));
    }
    for major in [13, 12, 11, 10, 9, 1] {
        names.push(format!("{base}.{major}"));
    }
    names
}

/// The first library among the `stems`' [`library_candidates`] that the
/// dynamic loader opens. Checked before cudarc is asked for anything, in
/// every cudarc configuration: cudarc's own dynamic loading (its
/// `dynamic-loading` feature, or `fallback-dynamic-loading` from its default
/// features) panics when it finds no library, and under a linking mode the
/// loader bound the library at start-up, so opening it again finds it.
pub(crate) fn open_library(stems: &[&str]) -> Option<libloading::Library> {
    stems
        .iter()
        .flat_map(|stem| library_candidates(stem))
        // SAFETY: a CUDA or NCCL library's initializers have no
        // preconditions; nothing in the library is called.
        .find_map(|name| unsafe { libloading::Library::new(name) }.ok())
}

/// Whether `libcuda` loads and has every entry point in
/// [`REQUIRED_SYMBOLS`] (cudarc panics on a missing library or symbol).
fn check_library() -> Result<()> {
    let Some(lib) = open_library(&["cuda", "nvcuda"]) else {
        return Err(unavailable(
            "the CUDA driver library (libcuda) was not found by the dynamic loader",
        ));
    };
    let missing = missing_symbols(&lib, &REQUIRED_SYMBOLS);
    if missing.is_empty() {
        Ok(())
    } else {
        Err(unavailable(format!(
            "the CUDA driver library lacks {}; a CUDA 12 or newer driver is needed",
            missing.join(", ")
        )))
    }
}

/// The names among `required` that `lib` does not export (cudarc panics on
/// the first call of a missing one; the probes ask first).
pub(crate) fn missing_symbols<'n>(lib: &libloading::Library, required: &[&'n str]) -> Vec<&'n str> {
    required
        .iter()
        .copied()
        // SAFETY: looking a symbol up calls nothing.
        .filter(|name| unsafe { lib.get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_err())
        .collect()
}

/// Whether a usable CUDA driver and device 0 exist; never panics.
///
/// `Err(BackendError::Unavailable { .. })` when `libcuda` is missing, lacks an
/// entry point this backend needs, fails to initialize, or sees no device.
pub fn probe() -> Result<DeviceInfo> {
    probe_device(0)
}

/// Like [`probe`], for the device with this ordinal.
///
/// It first checks that `libcuda` loads and has every entry point this
/// backend calls, whichever linking mode cudarc was built with (cudarc's
/// default features load the library at run time and panic without it).
pub fn probe_device(ordinal: usize) -> Result<DeviceInfo> {
    check_library()?;
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

/// How a stream capture treats CUDA calls that are unsafe while capturing
/// (`CUstreamCaptureMode`): which threads' captures make such a call fail.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CaptureMode {
    /// Any thread's thread-local or global capture (`GLOBAL`).
    Global,
    /// Only captures this thread began (`THREAD_LOCAL`); the default. Other
    /// threads of the program keep running their own work.
    #[default]
    ThreadLocal,
    /// No check at all (`RELAXED`): the program vouches that nothing it
    /// calls while capturing allocates, frees or synchronizes.
    Relaxed,
}

impl CaptureMode {
    fn from_u8(value: u8) -> CaptureMode {
        match value {
            0 => CaptureMode::Global,
            2 => CaptureMode::Relaxed,
            _ => CaptureMode::ThreadLocal,
        }
    }

    fn to_u8(self) -> u8 {
        match self {
            CaptureMode::Global => 0,
            CaptureMode::ThreadLocal => 1,
            CaptureMode::Relaxed => 2,
        }
    }

    /// The driver's value.
    pub fn raw(self) -> sys::CUstreamCaptureMode {
        match self {
            CaptureMode::Global => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
            CaptureMode::ThreadLocal => {
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
            }
            CaptureMode::Relaxed => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        }
    }
}

/// The `cuda` backend: one CUDA context (its own, or the program's). A cheap
/// handle; clones share the context, the internal stream and the settings
/// ([`CaptureMode`], graph upload).
///
/// ```no_run
/// use replay_arena::cuda;
///
/// let backend = cuda::Device::new(0)?;        // BackendUnavailable without a driver
/// let stream = backend.new_stream()?;         // capture and replay on this
/// println!("{}", backend.info());
/// # Ok::<(), replay_arena::Error>(())
/// ```
///
/// Adopting the program's context and stream (candle's, say):
///
/// ```no_run
/// use replay_arena::cuda::{self, cudarc::driver::CudaContext};
///
/// let ctx = CudaContext::new(0).expect("the program's context");
/// // The program turned cudarc's event tracking off before allocating.
/// unsafe { ctx.disable_event_tracking() };
/// let backend = cuda::Device::from_context(ctx.clone())?;
/// let stream = backend.wrap_stream(ctx.per_thread_stream())?;
/// # Ok::<(), replay_arena::Error>(())
/// ```
#[derive(Clone)]
pub struct Device {
    inner: Arc<Inner>,
}

struct Inner {
    ctx: Arc<CudaContext>,
    /// Where events get their first record, and arenas their allocation,
    /// zeroing and stream-ordered free.
    internal: Arc<cudarc::driver::CudaStream>,
    info: DeviceInfo,
    /// A [`CaptureMode`] as `u8`.
    capture_mode: AtomicU8,
    /// Upload each graph after instantiating it.
    upload: AtomicBool,
    /// `cuGraphInstantiateWithFlags` flags, from [`InstantiateFlags`].
    instantiate: AtomicU64,
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("device", &self.inner.info)
            .field("capture_mode", &self.capture_mode())
            .field("graph_upload", &self.graph_upload())
            .finish_non_exhaustive()
    }
}

impl Device {
    /// Opens device `ordinal`: probes the driver ([`probe_device`]), retains
    /// the primary context in a cudarc context of the backend's own, turns
    /// off cudarc's automatic event tracking on it, and creates an internal
    /// stream.
    ///
    /// A program that has a cudarc context already should adopt it with
    /// [`Device::from_context`] instead: event tracking stays on in the
    /// program's own context object.
    ///
    /// # Errors
    ///
    /// [`BackendError::Unavailable`] when there is no usable driver or no
    /// such device; never panics.
    pub fn new(ordinal: usize) -> Result<Device> {
        let info = probe_device(ordinal)?;
        let ctx = CudaContext::new(ordinal).map_err(|e| {
            unavailable(format!(
                "retaining the primary context of CUDA device {ordinal} returned {:?}",
                e.0
            ))
        })?;
        // SAFETY: nothing has been allocated through this fresh context
        // object; cudarc's tracking would put waits on events recorded
        // outside a capture into captured streams. The plan's fence orders
        // arena use; callers order their own slices of this context.
        unsafe { ctx.disable_event_tracking() };
        Device::adopt(ctx, info)
    }

    /// Adopts the program's cudarc context (candle's, cubecl's, a cudarc
    /// program's): arenas, events and graphs are made in it, and the
    /// program's streams of it can be wrapped with
    /// [`Device::wrap_stream`].
    ///
    /// cudarc's event tracking must be off on it: with tracking on, cudarc
    /// makes a stream wait on events recorded outside the capture whenever a
    /// slice of the program's is used inside one, and the capture fails with
    /// `CUDA_ERROR_STREAM_CAPTURE_ISOLATION`. The program turns it off with
    /// `unsafe { ctx.disable_event_tracking() }` (and takes over ordering its
    /// slices across streams), or hands that step to
    /// [`Device::from_context_disabling_event_tracking`].
    ///
    /// # Errors
    ///
    /// [`BackendError::EventTracking`] when tracking is on;
    /// [`BackendError::Unavailable`] when the driver cannot be used.
    pub fn from_context(ctx: Arc<CudaContext>) -> Result<Device> {
        if ctx.is_event_tracking() {
            return Err(BackendError::EventTracking);
        }
        let info = probe_device(ctx.ordinal())?;
        Device::adopt(ctx, info)
    }

    /// Turns cudarc's event tracking off on the program's context, then
    /// adopts it as [`Device::from_context`] does: the explicit opt-in
    /// for programs that let cudarc order their slices across streams.
    ///
    /// # Safety
    ///
    /// This is cudarc's `CudaContext::disable_event_tracking`, with its
    /// contract: from now on cudarc no longer orders the program's slices
    /// across streams, for every user of this context. The caller
    /// guarantees that no slice is freed before its use on another stream
    /// is finished, that no slice is used on another stream before its
    /// allocation (or last write) on the allocating stream is finished, and
    /// that no slice is written by two streams at once, ordering such uses
    /// with events or stream synchronization where the program has several
    /// streams.
    ///
    /// # Errors
    ///
    /// [`BackendError::Unavailable`] when the driver cannot be used.
    pub unsafe fn from_context_disabling_event_tracking(ctx: Arc<CudaContext>) -> Result<Device> {
        // SAFETY: the caller upholds cudarc's contract (above).
        unsafe { ctx.disable_event_tracking() };
        Device::from_context(ctx)
    }

    fn adopt(ctx: Arc<CudaContext>, info: DeviceInfo) -> Result<Device> {
        let internal = ctx
            .new_stream()
            .map_err(|e| driver_error("cuStreamCreate", e))?;
        Ok(Device {
            inner: Arc::new(Inner {
                ctx,
                internal,
                info,
                capture_mode: AtomicU8::new(CaptureMode::default().to_u8()),
                upload: AtomicBool::new(true),
                instantiate: AtomicU64::new(0),
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

    /// The capture mode of captures begun from now on (thread-local unless
    /// set).
    pub fn capture_mode(&self) -> CaptureMode {
        CaptureMode::from_u8(self.inner.capture_mode.load(Ordering::Relaxed))
    }

    /// Sets the capture mode of captures begun from now on, for this backend
    /// and its clones (the plan's included).
    pub fn set_capture_mode(&self, mode: CaptureMode) {
        self.inner
            .capture_mode
            .store(mode.to_u8(), Ordering::Relaxed);
    }

    /// Whether graphs are uploaded (`cuGraphUpload`, on the capture stream)
    /// right after instantiation, so that the first replay does not pay the
    /// upload. On unless set.
    pub fn graph_upload(&self) -> bool {
        self.inner.upload.load(Ordering::Relaxed)
    }

    /// Turns the upload after instantiation on or off, for graphs captured
    /// from now on by this backend and its clones.
    pub fn set_graph_upload(&self, upload: bool) {
        self.inner.upload.store(upload, Ordering::Relaxed);
    }

    /// How graphs are instantiated (`cuGraphInstantiateWithFlags`).
    pub fn instantiate_flags(&self) -> InstantiateFlags {
        InstantiateFlags::from_bits(self.inner.instantiate.load(Ordering::Relaxed))
    }

    /// Sets how graphs captured (or adopted) from now on by this backend and
    /// its clones are instantiated.
    pub fn set_instantiate_flags(&self, flags: InstantiateFlags) {
        self.inner
            .instantiate
            .store(flags.bits(), Ordering::Relaxed);
    }

    /// A graph the program captured with cudarc (its own
    /// `begin_capture`/`end_capture`), for
    /// [`RunnerCapture::finish_with_graph`](crate::RunnerCapture::finish_with_graph):
    /// the graph is cloned (`cuGraphClone`, so the program's `Graph`
    /// stays the program's) and instantiated with this backend's
    /// [`InstantiateFlags`].
    ///
    /// # Errors
    ///
    /// The driver's error (a graph with memory nodes cannot be cloned:
    /// capture such work with `stream_capture` instead).
    pub fn adopt_graph(&self, graph: &cudarc::driver::CudaGraph) -> Result<Graph> {
        self.bind()?;
        let mut clone: sys::CUgraph = ptr::null_mut();
        // SAFETY: `graph.cu_graph()` is live for the borrow; `clone` is a
        // local out pointer.
        check("cuGraphClone", unsafe {
            sys::cuGraphClone(&mut clone, graph.cu_graph())
        })?;
        // SAFETY: `clone` is ours; `instantiate` destroys it on failure.
        unsafe { self.instantiate(clone, None) }
    }

    /// Instantiates `graph` with this backend's flags (uploading it on
    /// `upload_on` when uploads are on) and owns both handles.
    ///
    /// # Safety
    ///
    /// `graph` is a live graph of this context that the caller hands over:
    /// it is destroyed here on failure, with the returned `Graph`
    /// otherwise.
    unsafe fn instantiate(
        &self,
        graph: sys::CUgraph,
        upload_on: Option<sys::CUstream>,
    ) -> Result<Graph> {
        let mut exec: sys::CUgraphExec = ptr::null_mut();
        let flags = self.inner.instantiate.load(Ordering::Relaxed);
        // SAFETY: `graph` is live; `exec` is a local out pointer.
        let code = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, flags as _) };
        if let Err(e) = check("cuGraphInstantiate", code) {
            // SAFETY: the graph was handed over and is destroyed once.
            let _ = unsafe { sys::cuGraphDestroy(graph) };
            return Err(e);
        }
        // From here on, dropping `owned` destroys both handles.
        let owned = Graph {
            handles: GraphHandles { graph, exec },
            ctx: self.inner.ctx.clone(),
            _not_sync: PhantomData,
        };
        if let Some(raw) = upload_on.filter(|_| self.graph_upload()) {
            // SAFETY: the exec and the stream are live objects of this
            // context; the upload is ordered on that stream, and launches
            // of this exec are ordered behind it.
            check("cuGraphUpload", unsafe { sys::cuGraphUpload(exec, raw) })?;
        }
        Ok(owned)
    }

    /// Device memory the driver holds for graph memory nodes (the
    /// temporaries of every graph on this device: `cuDeviceGetGraphMemAttribute`),
    /// in use now and reserved now. Beside the plan's arenas, the other half
    /// of what replaying costs in memory. [`Backend::graph_memory_in_use`]
    /// gives the same, always `Some`.
    ///
    /// # Errors
    ///
    /// The driver's error.
    pub fn graph_memory_in_use(&self) -> Result<GraphMemory> {
        self.bind()?;
        let get = |attr| {
            let mut value: u64 = 0;
            // SAFETY: the attribute is a 64-bit integer written into a local.
            check("cuDeviceGetGraphMemAttribute", unsafe {
                sys::cuDeviceGetGraphMemAttribute(
                    self.inner.ctx.cu_device(),
                    attr,
                    (&mut value as *mut u64).cast(),
                )
            })
            .map(|()| value)
        };
        Ok(GraphMemory {
            used: get(sys::CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT)?,
            reserved: get(sys::CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)?,
        })
    }

    /// A new non-blocking stream, usable for capture and replay.
    ///
    /// # Errors
    ///
    /// The driver's error.
    pub fn new_stream(&self) -> Result<Stream> {
        let inner = self
            .inner
            .ctx
            .new_stream()
            .map_err(|e| driver_error("cuStreamCreate", e))?;
        Ok(Stream {
            inner,
            per_thread: None,
            serial: next_stream_serial(),
        })
    }

    /// Adopts one of the program's cudarc streams of this backend's context
    /// for capture and replay: one from `ctx.new_stream()`, a stream wrapped
    /// with `wrap_borrowed_stream`, or the per-thread default stream
    /// (`ctx.per_thread_stream()`, candle's). The per-thread stream is a
    /// different stream on every thread: the handle wrapped here stands for
    /// the calling thread's, and using it from another thread is refused.
    ///
    /// # Errors
    ///
    /// [`BackendError::LegacyStream`] for the legacy default (NULL) stream
    /// (`ctx.default_stream()`), which the driver cannot capture;
    /// [`BackendError::Refused`] for a stream of another context.
    pub fn wrap_stream(&self, stream: Arc<cudarc::driver::CudaStream>) -> Result<Stream> {
        if stream.context().cu_ctx() != self.inner.ctx.cu_ctx() {
            return Err(BackendError::Refused {
                op: "wrap stream",
                reason: "the stream belongs to another CUDA context".into(),
            });
        }
        let raw = stream.cu_stream() as usize;
        if raw == LEGACY_NULL || raw == LEGACY_HANDLE {
            return Err(BackendError::LegacyStream { op: "wrap stream" });
        }
        let per_thread = (raw == PER_THREAD_HANDLE).then(this_thread);
        Ok(Stream {
            inner: stream,
            per_thread,
            serial: next_stream_serial(),
        })
    }

    /// Free and total device memory in bytes (`cuMemGetInfo`).
    ///
    /// # Errors
    ///
    /// The driver's error.
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

    fn allocate_device(&self, plan: &ArenaDesc) -> Result<Memory> {
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
        let mut raw: sys::CUdeviceptr = 0;
        // SAFETY: the context is current; `raw` is a live local; the
        // internal stream belongs to the context.
        let (op, code) = unsafe {
            if pooled {
                (
                    "cuMemAllocAsync",
                    sys::cuMemAllocAsync(&mut raw, padded, internal.cu_stream()),
                )
            } else {
                ("cuMemAlloc", sys::cuMemAlloc_v2(&mut raw, padded))
            }
        };
        if code != sys::CUresult::CUDA_SUCCESS {
            return Err(failed(format!("{op} of {padded} bytes returned {code:?}")));
        }
        let base = align_up(raw, ARENA_ALIGNMENT).unwrap_or(raw);
        // From here on, dropping `arena` frees the allocation.
        let arena = Memory {
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
            check(
                "cuMemsetD8Async",
                sys::cuMemsetD8Async(base, 0, plan.bytes as usize, stream),
            )?;
            check("cuStreamSynchronize", sys::cuStreamSynchronize(stream))?;
        }
        Ok(arena)
    }

    #[cfg(not(replay_arena_nccl))]
    fn allocate_symmetric(&self, plan: &ArenaDesc, group: GroupId) -> Result<Memory> {
        Err(BackendError::Allocation {
            key: plan.key,
            bytes: plan.bytes,
            reason: format!(
                "symmetric memory of {group} needs NCCL windows, and this build has no `nccl` feature"
            ),
        })
    }

    #[cfg(replay_arena_nccl)]
    fn allocate_symmetric(&self, _plan: &ArenaDesc, group: GroupId) -> Result<Memory> {
        Err(BackendError::NoCommunicator { group })
    }

    /// Refuses a graph with memory nodes where it would be cloned (a split,
    /// a child graph node): the driver does not clone such graphs
    /// (`cuGraphClone` returns `CUDA_ERROR_NOT_SUPPORTED`).
    fn refuse_memory_nodes(&self, graph: &Graph) -> Result<()> {
        let (mut allocs, mut frees) = (Vec::new(), Vec::new());
        self.memory_nodes(graph.handles.graph, 0, &mut allocs, &mut frees)
            .map_err(|reason| BackendError::Refused {
                op: "step graph",
                reason,
            })?;
        if allocs.is_empty() && frees.is_empty() {
            return Ok(());
        }
        Err(BackendError::Refused {
            op: "step graph",
            reason: format!(
                "the graph has memory nodes ({} allocation(s), {} free(s) of temporaries), which \
                 the driver does not clone into a child graph; replay this runner per runner, or \
                 give its temporaries plan requests",
                allocs.len(),
                frees.len()
            ),
        })
    }

    /// Collects the memory allocation nodes (address, bytes) and free nodes
    /// (address) of `graph` and, recursively, of its child graphs.
    fn memory_nodes(
        &self,
        graph: sys::CUgraph,
        depth: usize,
        allocs: &mut Vec<(u64, u64)>,
        frees: &mut Vec<u64>,
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
        // An empty graph (a runner whose capture enqueued nothing) has none.
        let nodes = nodes_of(graph).map_err(|e| format!("could not inspect the graph: {e}"))?;
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
                // SAFETY: a plain C struct of integers and pointers, for the
                // driver to fill.
                let mut params: sys::CUDA_MEM_ALLOC_NODE_PARAMS = unsafe { std::mem::zeroed() };
                // SAFETY: `node` is an allocation node of `graph`; `params`
                // is a local out pointer.
                inspect("cuGraphMemAllocNodeGetParams", unsafe {
                    sys::cuGraphMemAllocNodeGetParams(node, &mut params)
                })?;
                allocs.push((params.dptr, params.bytesize as u64));
            } else if kind == free {
                let mut dptr: sys::CUdeviceptr = 0;
                // SAFETY: `node` is a free node of `graph`; `dptr` is a local
                // out pointer.
                inspect("cuGraphMemFreeNodeGetParams", unsafe {
                    sys::cuGraphMemFreeNodeGetParams(node, &mut dptr)
                })?;
                frees.push(dptr);
            } else if kind == child {
                let mut sub: sys::CUgraph = ptr::null_mut();
                // SAFETY: `node` is a child graph node; the child graph stays
                // owned by it.
                inspect("cuGraphChildGraphNodeGetGraph", unsafe {
                    sys::cuGraphChildGraphNodeGetGraph(node, &mut sub)
                })?;
                self.memory_nodes(sub, depth + 1, allocs, frees)?;
            }
        }
        Ok(())
    }
}

/// How graphs are instantiated (`cuGraphInstantiateWithFlags`): the
/// program's choice, set with [`Device::set_instantiate_flags`]. The
/// default is none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct InstantiateFlags {
    /// `CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`: a launch first
    /// frees what the previous launch allocated and did not free. (A plan
    /// still refuses such graphs: its fence cannot follow the escaping
    /// memory.)
    pub auto_free_on_launch: bool,
    /// `CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY`: kernel nodes run
    /// at the priority they were captured with, not the launch stream's.
    pub use_node_priority: bool,
}

impl InstantiateFlags {
    fn bits(self) -> u64 {
        u64::from(self.auto_free_on_launch) | (u64::from(self.use_node_priority) << 3)
    }

    fn from_bits(bits: u64) -> InstantiateFlags {
        InstantiateFlags {
            auto_free_on_launch: bits & 1 != 0,
            use_node_priority: bits & 8 != 0,
        }
    }
}

/// `cu_stream()` of cudarc's `default_stream()`: the legacy NULL stream.
const LEGACY_NULL: usize = 0;
/// `CU_STREAM_LEGACY`: the legacy default stream, by its explicit handle.
const LEGACY_HANDLE: usize = 1;
/// `CU_STREAM_PER_THREAD`: the calling thread's default stream.
const PER_THREAD_HANDLE: usize = 2;
/// Whether the stream with this handle is capturing (`cuStreamIsCapturing`).
fn capturing(raw: sys::CUstream) -> Result<bool> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: a live stream handle (the caller holds the stream); `status` is
    // a local out pointer.
    check("cuStreamIsCapturing", unsafe {
        sys::cuStreamIsCapturing(raw, &mut status)
    })?;
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// A [`Backend::stream_id`] for a new [`Stream`] handle: unique in the
/// process and never reused, unlike the driver's `CUstream`, which the next
/// `cuStreamCreate` hands out again as soon as a stream is destroyed.
fn next_stream_serial() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A number for the calling thread, unique in the process.
fn this_thread() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static SERIAL: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    SERIAL.with(|serial| *serial)
}

/// A stream of a [`Device`]'s context. Cheap to clone; clones are the
/// same stream.
///
/// The fence knows it by an identity this crate issued when the handle was
/// made ([`Device::new_stream`], [`Device::wrap_stream`]), never by
/// its raw `CUstream`: a destroyed stream's handle value comes back from the
/// next `cuStreamCreate` while its work may still run. Wrapping one cudarc
/// stream twice gives two identities (the fence then waits where stream
/// order would have sufficed, which is safe).
#[derive(Clone, Debug)]
pub struct Stream {
    inner: Arc<cudarc::driver::CudaStream>,
    /// For the per-thread default stream: the thread whose stream it is.
    per_thread: Option<u64>,
    /// The identity the fence compares.
    serial: u64,
}

impl Stream {
    /// The cudarc stream, to launch kernels on (`launch_builder`) or copy
    /// memory with.
    pub fn cudarc(&self) -> &Arc<cudarc::driver::CudaStream> {
        &self.inner
    }

    /// The raw `CUstream` (do not destroy it; `0x2` for the per-thread
    /// default stream).
    pub fn cu_stream(&self) -> sys::CUstream {
        self.inner.cu_stream()
    }

    /// The identity the fence and the view checks compare (issued by this
    /// crate, unique in the process, never reused).
    pub fn id(&self) -> u64 {
        self.serial
    }

    /// Whether this is the per-thread default stream of the thread that
    /// wrapped it.
    pub fn is_per_thread(&self) -> bool {
        self.per_thread.is_some()
    }

    /// Blocks until everything submitted to this stream is done.
    ///
    /// # Errors
    ///
    /// The driver's error; [`BackendError::Refused`] for a per-thread stream
    /// used from another thread.
    pub fn synchronize(&self) -> Result<()> {
        self.check_thread("cuStreamSynchronize")?;
        self.inner
            .synchronize()
            .map_err(|e| driver_error("cuStreamSynchronize", e))
    }

    /// Refuses a per-thread stream on a thread other than its own: the
    /// handle would name that thread's stream instead.
    fn check_thread(&self, op: &'static str) -> Result<()> {
        match self.per_thread {
            Some(owner) if owner != this_thread() => Err(BackendError::Refused {
                op,
                reason: "this per-thread default stream was wrapped on another thread; on this \
                         thread the handle names a different stream (wrap this thread's own \
                         `ctx.per_thread_stream()`)"
                    .into(),
            }),
            _ => Ok(()),
        }
    }

    /// The stream handle for a driver call, after the thread check.
    fn raw(&self, op: &'static str) -> Result<sys::CUstream> {
        self.check_thread(op)?;
        Ok(self.inner.cu_stream())
    }
}

/// Device memory of one arena, allocated outside every graph memory pool
/// (from the device's default memory pool where it has one); freed on drop
/// without waiting for unrelated streams.
#[derive(Debug)]
pub struct Memory {
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

impl Arena for Memory {
    fn base(&self) -> u64 {
        self.base
    }

    fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        // The plan waited for every fenced use before dropping arenas. A
        // failure here (a dead context) leaves nothing to free; it is kept
        // on the context for the program's next check, as cudarc does.
        if let Err(e) = self.ctx.bind_to_thread() {
            self.ctx.record_err::<()>(Err(e));
            return;
        }
        // SAFETY: `raw` came from the matching allocation in this context
        // and is freed once; the stream-ordered free does not wait for the
        // program's other streams (a plain cuMemFree may).
        let code = unsafe {
            if self.pooled {
                sys::cuMemFreeAsync(self.raw, self.internal.cu_stream())
            } else {
                sys::cuMemFree_v2(self.raw)
            }
        };
        self.ctx.record_err(code.result());
    }
}

/// A completion event (`CU_EVENT_DISABLE_TIMING`), recorded once at creation.
#[derive(Debug)]
pub struct Event {
    inner: cudarc::driver::CudaEvent,
}

impl Event {
    /// The raw `CUevent` (do not destroy it).
    pub fn cu_event(&self) -> sys::CUevent {
        self.inner.cu_event()
    }
}

/// Raw graph handles; moved between threads only inside a [`Graph`].
struct GraphHandles {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

// SAFETY: graph handles may be used from any thread that makes their context
// current (every call here does); `Graph` is `!Sync`, so they are never
// used from two threads at once.
unsafe impl Send for GraphHandles {}

/// A captured graph and its instantiation, owned by the plan once the
/// runner's capture finishes. `Send` but not `Sync`: CUDA graph objects must
/// not be used from two threads at once.
pub struct Graph {
    handles: GraphHandles,
    ctx: Arc<CudaContext>,
    _not_sync: PhantomData<Cell<()>>,
}

impl fmt::Debug for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Graph")
            .field("graph", &self.handles.graph)
            .field("exec", &self.handles.exec)
            .finish()
    }
}

impl Graph {
    /// The raw `CUgraph` (do not destroy it).
    pub fn cu_graph(&self) -> sys::CUgraph {
        self.handles.graph
    }

    /// The raw `CUgraphExec` (do not destroy it).
    pub fn cu_graph_exec(&self) -> sys::CUgraphExec {
        self.handles.exec
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: both handles are owned by this graph and destroyed once;
            // the plan synchronized before dropping graphs. A part of a
            // split graph has no executable graph.
            unsafe {
                if !self.handles.exec.is_null() {
                    let _ = sys::cuGraphExecDestroy(self.handles.exec);
                }
                let _ = sys::cuGraphDestroy(self.handles.graph);
            }
        }
    }
}

/// `cuGraphNodeGetDependencies`, whose signature changed in CUDA 12.3
/// (`_v2`, with edge data) and whose old form is gone from CUDA 13: looked
/// up in the driver by name, so the crate works with whichever version the
/// program's cudarc binds.
enum DepsFn {
    V2(
        unsafe extern "C" fn(
            sys::CUgraphNode,
            *mut sys::CUgraphNode,
            *mut c_void,
            *mut usize,
        ) -> sys::CUresult,
    ),
    V1(unsafe extern "C" fn(sys::CUgraphNode, *mut sys::CUgraphNode, *mut usize) -> sys::CUresult),
}

fn deps_fn() -> Option<&'static DepsFn> {
    static DEPS: OnceLock<Option<(libloading::Library, DepsFn)>> = OnceLock::new();
    DEPS.get_or_init(|| {
        let lib = open_library(&["cuda", "nvcuda"])?;
        // SAFETY: the symbols have the C signatures above (CUDA's
        // `cuda.h`); the library stays loaded with the pointer.
        let found = unsafe {
            lib.get(b"cuGraphNodeGetDependencies_v2")
                .map(|f: libloading::Symbol<'_, _>| DepsFn::V2(*f))
                .or_else(|_| {
                    lib.get(b"cuGraphNodeGetDependencies")
                        .map(|f: libloading::Symbol<'_, _>| DepsFn::V1(*f))
                })
        }
        .ok()?;
        Some((lib, found))
    })
    .as_ref()
    .map(|(_, f)| f)
}

/// The nodes of `graph`.
fn nodes_of(graph: sys::CUgraph) -> Result<Vec<sys::CUgraphNode>> {
    let mut n = 0usize;
    // SAFETY: a live graph; with a null array only the count is written.
    check("cuGraphGetNodes", unsafe {
        sys::cuGraphGetNodes(graph, ptr::null_mut(), &mut n)
    })?;
    let mut nodes = vec![ptr::null_mut(); n];
    if n > 0 {
        // SAFETY: `nodes` has room for `n`.
        check("cuGraphGetNodes", unsafe {
            sys::cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut n)
        })?;
        nodes.truncate(n);
    }
    Ok(nodes)
}

/// The nodes `node` depends on.
fn deps_of(node: sys::CUgraphNode) -> Result<Vec<sys::CUgraphNode>> {
    let f = deps_fn().ok_or_else(|| BackendError::Refused {
        op: "cuGraphNodeGetDependencies",
        reason: "the driver exports neither cuGraphNodeGetDependencies_v2 nor cuGraphNodeGetDependencies".into(),
    })?;
    let call = |out: *mut sys::CUgraphNode, n: &mut usize| match f {
        // SAFETY: a live node; `out` is null or has room for `*n`; no edge
        // data is asked for.
        DepsFn::V2(f) => unsafe { f(node, out, ptr::null_mut(), n) },
        // SAFETY: as above.
        DepsFn::V1(f) => unsafe { f(node, out, n) },
    };
    let mut n = 0usize;
    check("cuGraphNodeGetDependencies", call(ptr::null_mut(), &mut n))?;
    let mut deps = vec![ptr::null_mut(); n];
    if n > 0 {
        check(
            "cuGraphNodeGetDependencies",
            call(deps.as_mut_ptr(), &mut n),
        )?;
        deps.truncate(n);
    }
    Ok(deps)
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust element type with a [`DType`]: what a [`TypedView`] may be typed
/// as. Implemented for `f32`, `f64`, `i32`, `i64`, `i8`, `u8`, [`F8E4M3`], [`F8E5M2`], and, with the
/// `f16` feature (cudarc's `f16`), `half::bf16` and `half::f16`. Sealed.
pub trait Element: DeviceRepr + sealed::Sealed {
    /// The dtype of a view of this type.
    const DTYPE: DType;
}

macro_rules! elements {
    ($($(#[$attr:meta])* $t:ty => $d:ident),* $(,)?) => {$(
        $(#[$attr])*
        impl sealed::Sealed for $t {}
        $(#[$attr])*
        impl Element for $t {
            const DTYPE: DType = DType::$d;
        }
    )*};
}

/// One byte of an FP8 E4M3 value (`__nv_fp8_e4m3`), for typed views of
/// [`DType::F8E4M3`]; the bits are the program's to interpret.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct F8E4M3(pub u8);

/// One byte of an FP8 E5M2 value (`__nv_fp8_e5m2`), for typed views of
/// [`DType::F8E5M2`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct F8E5M2(pub u8);

// SAFETY: one `u8` (`repr(transparent)`), valid for every bit pattern.
unsafe impl DeviceRepr for F8E4M3 {}
// SAFETY: as above.
unsafe impl DeviceRepr for F8E5M2 {}

elements! {
    f32 => F32,
    f64 => F64,
    i32 => I32,
    i64 => I64,
    i8 => I8,
    u8 => U8,
    F8E4M3 => F8E4M3,
    F8E5M2 => F8E5M2,
    #[cfg(feature = "f16")]
    #[cfg_attr(docsrs, doc(cfg(feature = "f16")))]
    half::bf16 => BF16,
    #[cfg(feature = "f16")]
    #[cfg_attr(docsrs, doc(cfg(feature = "f16")))]
    half::f16 => F16,
}

/// A [`View`] as a typed cudarc device pointer: implements cudarc's
/// [`DevicePtr<T>`] and [`DevicePtrMut<T>`] (so `memcpy_dtod`,
/// `memset_zeros`, cuBLAS `gemm` and friends take it) and can be pushed as a
/// kernel argument with `launch_builder().arg(&view)` (`&mut view` for a
/// write).
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
            format!(
                "a typed view of {} elements at {:#x} was handed to cudarc {}; it works only on \
                 the stream of its own closure, while that closure runs",
                self.len,
                self.ptr,
                if self.scope.is_open() {
                    "on another stream"
                } else {
                    "after its closure returned"
                }
            )
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
/// Only element types with a [`DType`] convert:
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
            _view: PhantomData,
        })
    }
}

impl Backend for Device {
    type Arena = Memory;
    type Event = Event;
    type Stream = Stream;
    type Graph = Graph;

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn allocate_arena(&self, plan: &ArenaDesc) -> Result<Memory> {
        match plan.key.domain {
            Domain::Device => self.allocate_device(plan),
            Domain::Symmetric(group) => self.allocate_symmetric(plan, group),
        }
    }

    fn create_event(&self) -> Result<Event> {
        let inner = self
            .inner
            .ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(|e| driver_error("cuEventCreate", e))?;
        inner
            .record(&self.inner.internal)
            .map_err(|e| driver_error("cuEventRecord", e))?;
        Ok(Event { inner })
    }

    fn stream_id(&self, stream: &Stream) -> u64 {
        stream.serial
    }

    fn wait_event(&self, stream: &Stream, event: &Event) -> Result<()> {
        let raw = stream.raw("cuStreamWaitEvent")?;
        self.bind()?;
        // SAFETY: both handles are live objects of this context.
        check("cuStreamWaitEvent", unsafe {
            sys::cuStreamWaitEvent(raw, event.cu_event(), 0)
        })
    }

    fn record_event(&self, stream: &Stream, event: &Event) -> Result<()> {
        let raw = stream.raw("cuEventRecord")?;
        self.bind()?;
        // SAFETY: both handles are live objects of this context.
        check("cuEventRecord", unsafe {
            sys::cuEventRecord(event.cu_event(), raw)
        })
    }

    fn record_event_node(&self, stream: &Stream, event: &Event) -> Result<()> {
        let raw = stream.raw("cuEventRecordWithFlags")?;
        self.bind()?;
        if !capturing(raw)? {
            return Err(BackendError::Refused {
                op: "cuEventRecordWithFlags",
                reason:
                    "an event record node is made inside a capture; the stream is not capturing"
                        .into(),
            });
        }
        // SAFETY: both handles are live objects of this context; an
        // external record on a capturing stream becomes an event record
        // node of the graph.
        check("cuEventRecordWithFlags", unsafe {
            sys::cuEventRecordWithFlags(
                event.cu_event(),
                raw,
                sys::CUevent_record_flags::CU_EVENT_RECORD_EXTERNAL as u32,
            )
        })
    }

    fn synchronize_event(&self, event: &Event) -> Result<()> {
        self.bind()?;
        // SAFETY: the event is a live object of this context.
        check("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(event.cu_event())
        })
    }

    unsafe fn launch(&self, graph: &Graph, stream: &Stream) -> Result<()> {
        let raw = stream.raw("cuGraphLaunch")?;
        self.bind()?;
        // SAFETY: the exec and the stream are live objects of this context.
        check("cuGraphLaunch", unsafe {
            sys::cuGraphLaunch(graph.handles.exec, raw)
        })
    }

    fn begin_capture(&self, stream: &Stream) -> Result<()> {
        // `wrap_stream` refused the legacy stream; the per-thread stream is
        // captured like any other (on its own thread).
        let raw = stream.raw("cuStreamBeginCapture")?;
        self.bind()?;
        // SAFETY: the stream is a live, capturable stream of this context.
        check("cuStreamBeginCapture", unsafe {
            sys::cuStreamBeginCapture_v2(raw, self.capture_mode().raw())
        })
    }

    fn is_capturing(&self, stream: &Stream) -> Result<bool> {
        capturing(stream.raw("cuStreamIsCapturing")?)
    }

    unsafe fn end_capture(&self, stream: &Stream) -> Result<Graph> {
        let raw = stream.raw("cuStreamEndCapture")?;
        self.bind()?;
        let mut graph: sys::CUgraph = ptr::null_mut();
        // SAFETY: the stream is live; `graph` is a local out pointer.
        let code = unsafe { sys::cuStreamEndCapture(raw, &mut graph) };
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
        // SAFETY: the capture returned `graph` to us.
        unsafe { self.instantiate(graph, Some(raw)) }
    }

    unsafe fn abort_capture(&self, stream: &Stream) {
        // Another thread's per-thread stream is not this capture's.
        let Ok(raw) = stream.raw("cuStreamEndCapture") else {
            return;
        };
        if self.bind().is_err() {
            return;
        }
        let mut graph: sys::CUgraph = ptr::null_mut();
        // SAFETY: ending a capture (or failing to, when none is open) leaves
        // the stream usable; a returned graph is destroyed once.
        unsafe {
            let _ = sys::cuStreamEndCapture(raw, &mut graph);
            if !graph.is_null() {
                let _ = sys::cuGraphDestroy(graph);
            }
        }
    }

    fn graph_memory_in_use(&self) -> Result<Option<GraphMemory>> {
        Device::graph_memory_in_use(self).map(Some)
    }

    /// Clones the graph twice: one clone keeps the nodes the chosen record
    /// node depends on, the other every node but those and the record.
    fn split_graph(&self, graph: &Graph, events: &[&Event]) -> Result<(Graph, Graph, usize)> {
        self.bind()?;
        self.refuse_memory_nodes(graph)?;
        let g = graph.handles.graph;
        let record = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EVENT_RECORD as u32;
        let nodes = nodes_of(g)?;
        // The record nodes of `events`, each with its ancestors.
        type Found = (sys::CUgraphNode, std::collections::HashSet<usize>, usize);
        let mut best: Option<Found> = None;
        for &node in &nodes {
            let mut kind: u32 = u32::MAX;
            // SAFETY: a node of `g`; the type is a 32-bit C enum.
            check("cuGraphNodeGetType", unsafe {
                sys::cuGraphNodeGetType(node, (&mut kind as *mut u32).cast())
            })?;
            if kind != record {
                continue;
            }
            let mut event: sys::CUevent = ptr::null_mut();
            // SAFETY: an event record node of `g`; a local out pointer.
            check("cuGraphEventRecordNodeGetEvent", unsafe {
                sys::cuGraphEventRecordNodeGetEvent(node, &mut event)
            })?;
            let Some(which) = events.iter().position(|e| e.cu_event() == event) else {
                continue;
            };
            let mut seen = std::collections::HashSet::new();
            let mut todo = deps_of(node)?;
            while let Some(n) = todo.pop() {
                if seen.insert(n as usize) {
                    todo.extend(deps_of(n)?);
                }
            }
            if best.as_ref().is_none_or(|(_, b, _)| seen.len() < b.len()) {
                best = Some((node, seen, which));
            }
        }
        let Some((at, before, which)) = best else {
            return Err(BackendError::Refused {
                op: "split graph",
                reason: "the graph records none of the events".into(),
            });
        };
        // Each part: a clone without the nodes `drop` names.
        let part = |drop: &dyn Fn(sys::CUgraphNode) -> bool| -> Result<Graph> {
            let mut clone: sys::CUgraph = ptr::null_mut();
            // SAFETY: `g` is live; `clone` a local out pointer.
            check("cuGraphClone", unsafe { sys::cuGraphClone(&mut clone, g) })?;
            let owned = Graph {
                handles: GraphHandles {
                    graph: clone,
                    exec: ptr::null_mut(),
                },
                ctx: self.inner.ctx.clone(),
                _not_sync: PhantomData,
            };
            for &node in nodes.iter().filter(|&&n| drop(n)) {
                let mut twin: sys::CUgraphNode = ptr::null_mut();
                // SAFETY: `node` is a node of `g`, of which `clone` is a
                // clone; then its twin is destroyed once.
                check("cuGraphNodeFindInClone", unsafe {
                    sys::cuGraphNodeFindInClone(&mut twin, node, clone)
                })?;
                check("cuGraphDestroyNode", unsafe {
                    sys::cuGraphDestroyNode(twin)
                })?;
            }
            Ok(owned)
        };
        let first = part(&|n| !before.contains(&(n as usize)))?;
        let rest = part(&|n| n == at || before.contains(&(n as usize)))?;
        Ok((first, rest, which))
    }

    /// A graph of child graph nodes (`cuGraphAddChildGraphNode` copies
    /// each graph in), instantiated with this backend's flags.
    fn compose(&self, nodes: &[StepNode<'_, Device>]) -> Result<Graph> {
        self.bind()?;
        for node in nodes {
            self.refuse_memory_nodes(node.graph)?;
        }
        let mut parent: sys::CUgraph = ptr::null_mut();
        // SAFETY: a local out pointer.
        check("cuGraphCreate", unsafe {
            sys::cuGraphCreate(&mut parent, 0)
        })?;
        let mut added: Vec<sys::CUgraphNode> = Vec::with_capacity(nodes.len());
        for node in nodes {
            let deps = node
                .deps
                .iter()
                .map(|&d| added.get(d).copied())
                .collect::<Option<Vec<_>>>();
            let Some(deps) = deps else {
                // SAFETY: `parent` is ours and destroyed once.
                let _ = unsafe { sys::cuGraphDestroy(parent) };
                return Err(BackendError::Refused {
                    op: "cuGraphAddChildGraphNode",
                    reason: "a node depends on a node that is not before it".into(),
                });
            };
            let mut child: sys::CUgraphNode = ptr::null_mut();
            // SAFETY: `parent` and the node's graph are live graphs of this
            // context; the child graph is cloned into `parent`.
            let added_ok = check("cuGraphAddChildGraphNode", unsafe {
                sys::cuGraphAddChildGraphNode(
                    &mut child,
                    parent,
                    deps.as_ptr(),
                    deps.len(),
                    node.graph.handles.graph,
                )
            });
            if let Err(e) = added_ok {
                // SAFETY: as above.
                let _ = unsafe { sys::cuGraphDestroy(parent) };
                return Err(e);
            }
            added.push(child);
        }
        // SAFETY: `parent` is ours; `instantiate` destroys it on failure.
        unsafe { self.instantiate(parent, None) }
    }

    fn validate_graph(&self, graph: &Graph) -> std::result::Result<(), String> {
        self.bind().map_err(|e| e.to_string())?;
        let (mut allocs, mut frees) = (Vec::new(), Vec::new());
        self.memory_nodes(graph.handles.graph, 0, &mut allocs, &mut frees)?;
        check_memory_nodes(&allocs, &frees)
    }

    /// Waits for the whole context (`cuCtxSynchronize`), the program's
    /// other streams included: the backend does not know every stream work
    /// was submitted to. Teardown does not call it; it waits for the
    /// fence's events only.
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

    assert_impl_all!(Device: Send, Sync, Clone);
    assert_impl_all!(Stream: Send, Sync, Clone);
    assert_impl_all!(Memory: Send, Sync);
    assert_impl_all!(Event: Send, Sync);
    assert_impl_all!(Graph: Send);
    assert_not_impl_any!(Graph: Sync, Clone);
    assert_impl_all!(Replayable<Device>: Send);
    assert_impl_all!(TypedView<'static, f32>: Send, Sync, DevicePtr<f32>, DevicePtrMut<f32>);

    #[test]
    fn element_types_map_to_their_dtypes() {
        assert_eq!(f32::DTYPE, DType::F32);
        assert_eq!(f64::DTYPE, DType::F64);
        assert_eq!(i32::DTYPE, DType::I32);
        assert_eq!(i64::DTYPE, DType::I64);
        assert_eq!(i8::DTYPE, DType::I8);
        assert_eq!(u8::DTYPE, DType::U8);
        for dtype in [
            f32::DTYPE,
            f64::DTYPE,
            i32::DTYPE,
            i64::DTYPE,
            i8::DTYPE,
            u8::DTYPE,
        ] {
            let size = match dtype {
                DType::F32 => std::mem::size_of::<f32>(),
                DType::F64 => std::mem::size_of::<f64>(),
                DType::I32 => std::mem::size_of::<i32>(),
                DType::I64 => std::mem::size_of::<i64>(),
                DType::I8 => std::mem::size_of::<i8>(),
                _ => std::mem::size_of::<u8>(),
            };
            assert_eq!(dtype.size_bytes(), size as u64, "{dtype}");
        }
    }

    #[cfg(feature = "f16")]
    #[test]
    fn half_types_map_to_bf16_and_f16() {
        assert_eq!(half::bf16::DTYPE, DType::BF16);
        assert_eq!(half::f16::DTYPE, DType::F16);
    }

    #[test]
    fn every_dtype_has_an_element_type() {
        let mut covered = vec![
            f32::DTYPE,
            f64::DTYPE,
            i32::DTYPE,
            i64::DTYPE,
            i8::DTYPE,
            u8::DTYPE,
            F8E4M3::DTYPE,
            F8E5M2::DTYPE,
        ];
        #[cfg(feature = "f16")]
        covered.extend([half::bf16::DTYPE, half::f16::DTYPE]);
        #[cfg(feature = "f16")]
        assert!(
            DType::ALL.iter().all(|d| covered.contains(d)),
            "{covered:?}"
        );
        assert_eq!(
            std::mem::size_of::<F8E4M3>() as u64,
            DType::F8E4M3.size_bytes()
        );
        assert_eq!(
            std::mem::size_of::<F8E5M2>() as u64,
            DType::F8E5M2.size_bytes()
        );
    }

    #[test]
    fn instantiate_flags_map_to_the_drivers_bits_and_back() {
        let none = InstantiateFlags::default();
        assert_eq!(none.bits(), 0);
        let both = InstantiateFlags {
            auto_free_on_launch: true,
            use_node_priority: true,
        };
        // CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH = 1,
        // CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY = 8.
        assert_eq!(both.bits(), 1 | 8);
        assert_eq!(InstantiateFlags::from_bits(both.bits()), both);
        assert_eq!(
            u64::from(
                sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH.0
            ),
            1
        );
        assert_eq!(
            u64::from(
                sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY.0
            ),
            8
        );
    }

    #[test]
    fn adoption_errors_name_the_fix() {
        let tracking = BackendError::EventTracking.to_string();
        assert!(tracking.contains("disable_event_tracking()"), "{tracking}");
        assert!(
            tracking.contains("cuda::Device::from_context_disabling_event_tracking"),
            "{tracking}"
        );
        let legacy = BackendError::LegacyStream { op: "wrap stream" }.to_string();
        assert!(legacy.contains("per_thread_stream()"), "{legacy}");
        let mismatch = BackendError::DTypeMismatch {
            view: DType::BF16,
            requested: DType::F32,
            type_name: "f32",
        }
        .to_string();
        assert_eq!(mismatch, "a view of bf16 cannot be used as f32 (f32)");
    }

    #[test]
    fn capture_mode_is_thread_local_by_default_and_round_trips() {
        assert_eq!(CaptureMode::default(), CaptureMode::ThreadLocal);
        for mode in [
            CaptureMode::Global,
            CaptureMode::ThreadLocal,
            CaptureMode::Relaxed,
        ] {
            assert_eq!(CaptureMode::from_u8(mode.to_u8()), mode);
        }
        assert_eq!(
            CaptureMode::Relaxed.raw(),
            sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED
        );
    }

    #[test]
    fn per_thread_stream_ids_differ_by_thread() {
        let here = this_thread();
        assert_eq!(here, this_thread());
        let there = std::thread::spawn(this_thread).join().unwrap();
        assert_ne!(here, there);
    }

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
