//! The backend's handles: the [`Device`] (a context, its internal stream and
//! its settings), its streams and events, and the settings themselves
//! ([`CaptureMode`], [`InstantiateFlags`]).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use cudarc::driver::CudaContext;

use super::probe::{probe_device, DeviceInfo};
use super::result;
use super::{driver_error, sys, unavailable, Result};
use crate::backend::BackendError;

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
/// handle; clones share the context and the internal stream.
///
/// Its settings ([`CaptureMode`], graph upload, lazy instantiation,
/// [`InstantiateFlags`]) are the handle's own, chosen when it is made
/// (`with_capture_mode`, `with_graph_upload`, `with_lazy_instantiation`,
/// `with_instantiate_flags`) and copied by its clones:
/// the plan captures and instantiates with those of the handle given to
/// [`Planned::allocate`](crate::Planned::allocate), whatever is done to other
/// handles afterwards.
///
/// ```no_run
/// use replay_arena::cuda;
///
/// let backend = cuda::Device::new(0)?;        // BackendUnavailable without a driver
/// let stream = backend.new_stream()?;         // capture and replay on this
/// println!("{}", backend.info());
/// let relaxed = backend.clone().with_capture_mode(cuda::CaptureMode::Relaxed);
/// assert_eq!(backend.capture_mode(), cuda::CaptureMode::ThreadLocal);
/// # drop(relaxed);
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
    pub(super) inner: Arc<Inner>,
    /// This handle's own settings (its clones copy them).
    settings: Settings,
}

pub(super) struct Inner {
    pub(super) ctx: Arc<CudaContext>,
    /// Where events get their first record, and arenas their allocation,
    /// zeroing and stream-ordered free.
    pub(super) internal: Arc<cudarc::driver::CudaStream>,
    pub(super) info: DeviceInfo,
}

/// How a handle captures and instantiates graphs.
/// [`Device::graph_memory_granule`] unless chosen.
const DEFAULT_GRAPH_MEMORY_GRANULE: u64 = 32 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Settings {
    capture_mode: CaptureMode,
    /// Upload each graph after instantiating it.
    upload: bool,
    /// Instantiate a runner's graph at its first launch, not at capture.
    lazy: bool,
    instantiate: InstantiateFlags,
    /// What the driver's graph memory pool grows by.
    granule: u64,
}

impl Default for Settings {
    /// Thread-local captures, uploads on, no instantiation flags.
    fn default() -> Settings {
        Settings {
            capture_mode: CaptureMode::default(),
            upload: true,
            lazy: false,
            instantiate: InstantiateFlags::default(),
            granule: DEFAULT_GRAPH_MEMORY_GRANULE,
        }
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("device", &self.inner.info)
            .field("capture_mode", &self.capture_mode())
            .field("graph_upload", &self.graph_upload())
            .field("lazy_instantiation", &self.lazy_instantiation())
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
            }),
            settings: Settings::default(),
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

    /// The capture mode of this handle's captures (thread-local unless
    /// chosen).
    pub fn capture_mode(&self) -> CaptureMode {
        self.settings.capture_mode
    }

    /// This handle with `mode` for its captures (and its clones', the plan's
    /// when it is allocated with it).
    pub fn with_capture_mode(mut self, mode: CaptureMode) -> Device {
        self.settings.capture_mode = mode;
        self
    }

    /// Whether this handle uploads graphs (`cuGraphUpload`, on the capture
    /// stream) right after instantiation, so that the first replay does not
    /// pay the upload. On unless chosen; with lazy instantiation
    /// ([`Device::with_lazy_instantiation`]) the first replay instantiates
    /// and uploads.
    pub fn graph_upload(&self) -> bool {
        self.settings.upload
    }

    /// This handle with the upload after instantiation on or off (and its
    /// clones').
    pub fn with_graph_upload(mut self, upload: bool) -> Device {
        self.settings.upload = upload;
        self
    }

    /// Whether this handle instantiates a runner's captured graph at its
    /// first launch (a replay, traced or not) instead of at the end of its
    /// capture, and a step graph at its first launch instead of at its
    /// build. Off unless chosen.
    pub fn lazy_instantiation(&self) -> bool {
        self.settings.lazy
    }

    /// This handle with lazy instantiation on or off (and its clones'). On,
    /// a runner's graph gets its executable graph (`cuGraphInstantiate`)
    /// at its first launch, which then pays the instantiation and the
    /// upload (no upload at capture, whatever
    /// [`Device::with_graph_upload`] says). A graph that only ever goes
    /// into step graphs (they compose the captured graph, not its
    /// executable one) is never instantiated: a program that launches only
    /// step graphs saves the instantiation of every runner graph at
    /// start-up (`cargo bench --bench gpu_startup`). The driver's graph
    /// memory for temporaries is what the step graph needs either way
    /// (the candle example measures it). A graph the program hands over
    /// (`RunnerCapture::finish_with_graph`) is instantiated when adopted,
    /// as before.
    ///
    /// Step graphs too: a step graph built on such a device
    /// (`StepBuilder::build`) is composed, not instantiated; its first
    /// launch (`StepGraph::launch`, `Replayable::launch_kept`) instantiates
    /// it, so building one step graph per shape bucket costs the
    /// composition only, and a bucket never launched is never
    /// instantiated. A graph the driver cannot instantiate is then refused
    /// at its first launch instead of at its build.
    ///
    /// A first launch that fails to instantiate fails as any failed launch
    /// does: the fence rolls back to where it was (the waits it had
    /// enqueued order nothing new), and the next launch tries again. The
    /// instantiation makes the graph's context current for the call only.
    /// It is a driver call like the instantiation at capture, only later:
    /// a capture another thread runs in `CaptureMode::Global` may forbid
    /// it (then replay each graph once before such a capture, or keep
    /// this off), and a traced first replay's slice includes it.
    pub fn with_lazy_instantiation(mut self, lazy: bool) -> Device {
        self.settings.lazy = lazy;
        self
    }

    /// The granule the driver's graph memory pool grows by, which the
    /// crate's graph memory estimates round to
    /// ([`GraphMemoryEstimate`](crate::GraphMemoryEstimate)): 32 MiB unless
    /// chosen, what driver 580 reserves on an H200 for a graph whose
    /// temporaries are one small allocation (`tests/gpu/step/graph_memory.rs`
    /// measures it). The driver does not report it.
    pub fn graph_memory_granule(&self) -> u64 {
        self.settings.granule
    }

    /// This handle with another graph memory granule (and its clones'): a
    /// driver that reserves in other steps. 0 is taken as 1 (no rounding).
    pub fn with_graph_memory_granule(mut self, bytes: u64) -> Device {
        self.settings.granule = bytes.max(1);
        self
    }

    /// How this handle instantiates graphs (`cuGraphInstantiateWithFlags`).
    pub fn instantiate_flags(&self) -> InstantiateFlags {
        self.settings.instantiate
    }

    /// This handle with `flags` for the graphs it captures, adopts or
    /// composes (and its clones').
    pub fn with_instantiate_flags(mut self, flags: InstantiateFlags) -> Device {
        self.settings.instantiate = flags;
        self
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
        let serial = stream_identity(&inner, None);
        Ok(Stream {
            inner,
            per_thread: None,
            serial,
        })
    }

    /// The stream priorities this context supports
    /// (`cuCtxGetStreamPriorityRange`).
    ///
    /// # Errors
    ///
    /// The driver's error.
    pub fn stream_priorities(&self) -> Result<StreamPriorities> {
        self.bind()?;
        let (least, greatest) = result::stream::priority_range()?;
        Ok(StreamPriorities { least, greatest })
    }

    /// A new non-blocking stream at `priority`, as cudarc's
    /// `CudaContext::new_stream_with_priority` makes it (lower numbers are
    /// higher priorities; the driver clamps a priority outside
    /// [`Device::stream_priorities`]). Work captured on it keeps the
    /// priority inside step graphs: the crate gives the kernel nodes of a
    /// graph captured on a stream of another priority than the least that
    /// priority, and instantiates step graphs with
    /// `CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY`. Put consumers
    /// (reduce-scatters) on such a stream so that they get SMs ahead of the
    /// next runner's GEMMs, as Megatron's communication streams do.
    ///
    /// # Errors
    ///
    /// The driver's error.
    #[doc(alias = "cuStreamCreateWithPriority")]
    pub fn new_stream_with_priority(&self, priority: i32) -> Result<Stream> {
        let inner = self
            .inner
            .ctx
            .new_stream_with_priority(priority)
            .map_err(|e| driver_error("cuStreamCreateWithPriority", e))?;
        let serial = stream_identity(&inner, None);
        Ok(Stream {
            inner,
            per_thread: None,
            serial,
        })
    }

    /// [`Device::new_stream_with_priority`] at the greatest priority this
    /// context supports: the stream for communication.
    ///
    /// # Errors
    ///
    /// The driver's error.
    pub fn new_high_priority_stream(&self) -> Result<Stream> {
        let greatest = self.stream_priorities()?.greatest;
        self.new_stream_with_priority(greatest)
    }

    /// Adopts one of the program's cudarc streams of this backend's context
    /// for capture and replay: one from `ctx.new_stream()`, a stream wrapped
    /// with `wrap_borrowed_stream`, or the per-thread default stream
    /// (`ctx.per_thread_stream()`, candle's). The per-thread stream is a
    /// different stream on every thread: the handle wrapped here stands for
    /// the calling thread's, and using it from another thread is refused.
    ///
    /// One stream has one identity for the fence and the view checks while
    /// any handle of it lives: wrapping it again (or wrapping the cudarc
    /// stream of a [`Device::new_stream`]) gives a handle with the same
    /// [`stream_id`](crate::backend::Streams::stream_id), so a capture on one handle
    /// excludes the fence's work and consumers on the other.
    ///
    /// # Errors
    ///
    /// [`BackendError::LegacyStream`] for the legacy default (NULL) stream
    /// (`ctx.default_stream()`), which the driver cannot capture;
    /// [`BackendError::Refused`] for a stream of another context.
    pub fn wrap_stream(&self, stream: Arc<cudarc::driver::CudaStream>) -> Result<Stream> {
        if stream.context().cu_ctx() != self.inner.ctx.cu_ctx() {
            return Err(BackendError::Refused {
                call: "wrap stream",
                reason: "the stream belongs to another CUDA context".into(),
            });
        }
        let raw = stream.cu_stream() as usize;
        if raw == LEGACY_NULL || raw == LEGACY_HANDLE {
            return Err(BackendError::LegacyStream {
                call: "wrap stream",
            });
        }
        let per_thread = (raw == PER_THREAD_HANDLE).then(this_thread);
        let serial = stream_identity(&stream, per_thread);
        Ok(Stream {
            inner: stream,
            per_thread,
            serial,
        })
    }

    /// Free and total device memory in bytes (`cuMemGetInfo`).
    ///
    /// # Errors
    ///
    /// The driver's error.
    pub fn mem_info(&self) -> Result<(u64, u64)> {
        self.bind()?;
        let (free, total) = result::device::memory_info()?;
        Ok((free as u64, total as u64))
    }

    /// Makes the context current on the calling thread.
    pub(super) fn bind(&self) -> Result<()> {
        self.inner
            .ctx
            .bind_to_thread()
            .map_err(|e| driver_error("cuCtxSetCurrent", e))
    }
}

/// How graphs are instantiated (`cuGraphInstantiateWithFlags`): the
/// program's choice, given with [`Device::with_instantiate_flags`]. The
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
    pub(super) fn bits(self) -> u64 {
        u64::from(self.auto_free_on_launch) | (u64::from(self.use_node_priority) << 3)
    }
}

/// The stream priorities of a context ([`Device::stream_priorities`]):
/// lower numbers are higher priorities, so `greatest <= least`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamPriorities {
    /// The lowest priority (the default a stream gets: 0).
    pub least: i32,
    /// The highest priority (the lowest number, -5 on recent GPUs).
    pub greatest: i32,
}

/// `cu_stream()` of cudarc's `default_stream()`: the legacy NULL stream.
const LEGACY_NULL: usize = 0;
/// `CU_STREAM_LEGACY`: the legacy default stream, by its explicit handle.
const LEGACY_HANDLE: usize = 1;
/// `CU_STREAM_PER_THREAD`: the calling thread's default stream.
const PER_THREAD_HANDLE: usize = 2;
/// Whether the stream with this handle is capturing (`cuStreamIsCapturing`).
pub(super) fn capturing(raw: sys::CUstream) -> Result<bool> {
    // SAFETY: a live stream handle (the caller holds the stream).
    let status = unsafe { result::stream::capture_status(raw) }?;
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// A fresh [`Streams::stream_id`](crate::backend::Streams::stream_id): unique in
/// the process and never reused, unlike the driver's `CUstream`, which the
/// next `cuStreamCreate` hands out again as soon as a stream is destroyed.
fn next_stream_serial() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// One stream some live [`Stream`] handle names: its context, raw handle
/// and (the per-thread default stream) thread, the identity its handles
/// share, and the cudarc streams they hold.
struct KnownStream {
    ctx: usize,
    raw: usize,
    thread: Option<u64>,
    serial: u64,
    handles: Vec<Weak<cudarc::driver::CudaStream>>,
}

/// The streams live [`Stream`] handles name.
static KNOWN_STREAMS: Mutex<Vec<KnownStream>> = Mutex::new(Vec::new());

/// The identity of a new [`Stream`] handle of `stream`: the one the live
/// handles of the same stream (context, `CUstream`, and thread for the
/// per-thread default stream) have, else a fresh one. A stream is known
/// while a cudarc handle of it lives: every [`Stream`] holds one, and
/// cudarc destroys the stream only with its last, so a `CUstream` the
/// driver hands out again after a destroy is another stream with a fresh
/// identity (and an identity the fence still remembers is never reused).
fn stream_identity(stream: &Arc<cudarc::driver::CudaStream>, thread: Option<u64>) -> u64 {
    let ctx = stream.context().cu_ctx() as usize;
    let raw = stream.cu_stream() as usize;
    let mut known = KNOWN_STREAMS.lock().unwrap_or_else(|p| p.into_inner());
    known.retain_mut(|k| {
        k.handles.retain(|w| w.strong_count() > 0);
        !k.handles.is_empty()
    });
    if let Some(k) = known
        .iter_mut()
        .find(|k| (k.ctx, k.raw, k.thread) == (ctx, raw, thread))
    {
        if !k.handles.iter().any(|w| w.as_ptr() == Arc::as_ptr(stream)) {
            k.handles.push(Arc::downgrade(stream));
        }
        return k.serial;
    }
    let serial = next_stream_serial();
    known.push(KnownStream {
        ctx,
        raw,
        thread,
        serial,
        handles: vec![Arc::downgrade(stream)],
    });
    serial
}

/// A number for the calling thread, unique in the process.
pub(super) fn this_thread() -> u64 {
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
/// next `cuStreamCreate` while its work may still run. Every handle of one
/// stream has the same identity while any of them lives (wrapping a stream
/// twice included): the claims that keep the fence's work and consumers off
/// a capturing stream compare identities.
#[derive(Clone, Debug)]
pub struct Stream {
    pub(super) inner: Arc<cudarc::driver::CudaStream>,
    /// For the per-thread default stream: the thread whose stream it is.
    pub(super) per_thread: Option<u64>,
    /// The identity the fence and the view checks compare (issued by this
    /// crate, unique in the process, never reused): what
    /// [`Streams::stream_id`](crate::backend::Streams::stream_id) returns.
    pub(crate) serial: u64,
}

impl Stream {
    /// The cudarc stream, to launch kernels on (`launch_builder`) or copy
    /// memory with.
    pub fn cudarc(&self) -> &Arc<cudarc::driver::CudaStream> {
        &self.inner
    }

    /// The stream's priority (`cuStreamGetPriority`: lower numbers are
    /// higher priorities).
    ///
    /// # Errors
    ///
    /// [`BackendError::Refused`] for another thread's per-thread stream;
    /// the driver's error.
    pub fn priority(&self) -> Result<i32> {
        let raw = self.raw("cuStreamGetPriority")?;
        self.inner
            .context()
            .bind_to_thread()
            .map_err(|e| driver_error("cuCtxSetCurrent", e))?;
        // SAFETY: a live stream of its context, current on this thread.
        Ok(unsafe { result::stream::priority(raw) }?)
    }

    /// The raw `CUstream` (do not destroy it; `0x2` for the per-thread
    /// default stream).
    pub fn cu_stream(&self) -> sys::CUstream {
        self.inner.cu_stream()
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
                call: op,
                reason: "this per-thread default stream was wrapped on another thread; on this \
                         thread the handle names a different stream (wrap this thread's own \
                         `ctx.per_thread_stream()`)"
                    .into(),
            }),
            _ => Ok(()),
        }
    }

    /// The stream handle for a driver call, after the thread check.
    pub(super) fn raw(&self, op: &'static str) -> Result<sys::CUstream> {
        self.check_thread(op)?;
        Ok(self.inner.cu_stream())
    }
}

/// A completion event (`CU_EVENT_DISABLE_TIMING`), recorded once at creation.
#[derive(Debug)]
pub struct Event {
    pub(super) inner: cudarc::driver::CudaEvent,
}

impl Event {
    /// The raw `CUevent` (do not destroy it).
    pub fn cu_event(&self) -> sys::CUevent {
        self.inner.cu_event()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::DType;

    #[test]
    fn instantiate_flags_map_to_the_drivers_bits() {
        let none = InstantiateFlags::default();
        assert_eq!(none.bits(), 0);
        let both = InstantiateFlags {
            auto_free_on_launch: true,
            use_node_priority: true,
        };
        // CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH = 1,
        // CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY = 8.
        assert_eq!(both.bits(), 1 | 8);
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
    fn a_handle_captures_thread_locally_uploads_and_sets_no_flags_unless_chosen() {
        let settings = Settings::default();
        assert_eq!(settings.capture_mode, CaptureMode::ThreadLocal);
        assert!(settings.upload);
        assert_eq!(settings.instantiate, InstantiateFlags::default());
    }

    #[test]
    fn adoption_errors_name_the_fix() {
        let tracking = BackendError::EventTracking.to_string();
        assert!(tracking.contains("disable_event_tracking()"), "{tracking}");
        assert!(
            tracking.contains("cuda::Device::from_context_disabling_event_tracking"),
            "{tracking}"
        );
        let legacy = BackendError::LegacyStream {
            call: "wrap stream",
        }
        .to_string();
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
    fn capture_mode_is_thread_local_by_default_and_maps_to_the_drivers_mode() {
        assert_eq!(CaptureMode::default(), CaptureMode::ThreadLocal);
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
}
