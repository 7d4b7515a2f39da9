//! The roles of [`Device`]: [`Allocate`] and [`Backend`] for it alone;
//! [`Streams`], [`Capture`], [`Launch`] and [`Compose`] once for every
//! handle of a CUDA device ([`AsDevice`]: `cuda::Device`, and the `nccl`
//! backend, which only allocates differently).

use super::arena::Arena;
use super::device::{capturing, Device, Event, Stream};
use super::graph::Graph;
use super::result;
use super::{driver_error, sys, Result};
use crate::backend::{
    check_memory_nodes, Allocate, ArenaDesc, Backend, BackendError, Capture, Compose, Cut,
    GraphMemory, GraphRejection, Launch, StepEnd, StepNode, Streams, Temporaries,
};
use crate::vocab::Domain;

pub(crate) mod sealed {
    /// Only this crate's handles of a CUDA device are [`AsDevice`](super::AsDevice).
    pub trait Sealed {}
}

/// A handle of one CUDA device: [`Device`] itself, or a backend that is a
/// `Device` with an allocator of its own (`nccl::Device`, whose symmetric
/// windows are its arenas). The `cuda` backend's roles [`Streams`],
/// [`Capture`], [`Launch`], [`Compose`] and [`Timing`](crate::backend::Timing) are
/// implemented once for every such handle, on the device it names, so a
/// backend built on `Device` implements [`Allocate`] and the umbrella
/// [`Backend`] (its name, the device's graph memory) and nothing else.
/// Sealed: the roles trust that every call names the same device.
pub trait AsDevice: sealed::Sealed {
    /// The device every role but allocation runs on.
    fn as_device(&self) -> &Device;
}

impl sealed::Sealed for Device {}

impl AsDevice for Device {
    fn as_device(&self) -> &Device {
        self
    }
}

impl<D: AsDevice> Streams for D {
    type Event = Event;

    type Stream = Stream;

    fn create_event(&self) -> Result<Event> {
        let device = self.as_device();
        let inner = device
            .inner
            .ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(|e| driver_error("cuEventCreate", e))?;
        inner
            .record(&device.inner.internal)
            .map_err(|e| driver_error("cuEventRecord", e))?;
        Ok(Event { inner })
    }

    fn stream_id(&self, stream: &Stream) -> u64 {
        stream.serial
    }

    fn wait_event(&self, stream: &Stream, event: &Event) -> Result<()> {
        let raw = stream.raw("cuStreamWaitEvent")?;
        // No context bound: the call takes its context from its handles
        // (`tests/gpu_interop.rs`, `replays_run_with_no_context_or_another_context_current`).
        // SAFETY: both handles are live objects of this context.
        Ok(unsafe { result::stream::wait_event(raw, event.cu_event()) }?)
    }

    fn record_event(&self, stream: &Stream, event: &Event) -> Result<()> {
        let raw = stream.raw("cuEventRecord")?;
        // No context bound: the call takes its context from its handles
        // (`tests/gpu_interop.rs`, `replays_run_with_no_context_or_another_context_current`).
        // SAFETY: both handles are live objects of this context.
        Ok(unsafe { result::event::record(event.cu_event(), raw) }?)
    }

    fn synchronize_event(&self, event: &Event) -> Result<()> {
        self.as_device().bind()?;
        // SAFETY: the event is a live object of this context.
        Ok(unsafe { result::event::synchronize(event.cu_event()) }?)
    }

    fn event_done(&self, event: &Event) -> Result<bool> {
        self.as_device().bind()?;
        event
            .inner
            .try_is_complete()
            .map_err(|e| driver_error("cuEventQuery", e))
    }

    fn is_capturing(&self, stream: &Stream) -> Result<bool> {
        capturing(stream.raw("cuStreamIsCapturing")?)
    }

    /// Waits for the whole context (`cuCtxSynchronize`), the program's
    /// other streams included: the backend does not know every stream work
    /// was submitted to. Teardown does not call it; it waits for the
    /// fence's events only.
    fn synchronize(&self) -> Result<()> {
        self.as_device()
            .inner
            .ctx
            .synchronize()
            .map_err(|e| driver_error("cuCtxSynchronize", e))
    }
}

impl Allocate for Device {
    type Arena = Arena;

    fn allocate_arena(&self, plan: &ArenaDesc) -> Result<Arena> {
        match plan.key.domain {
            Domain::Device => self.allocate_device(plan),
            Domain::Symmetric(group) => self.allocate_symmetric(plan, group),
        }
    }
}

impl<D: AsDevice> Capture for D {
    type Graph = Graph;

    fn begin_capture(&self, stream: &Stream) -> Result<()> {
        // `wrap_stream` refused the legacy stream; the per-thread stream is
        // captured like any other (on its own thread).
        let raw = stream.raw("cuStreamBeginCapture")?;
        let device = self.as_device();
        device.bind()?;
        // SAFETY: the stream is a live, capturable stream of this context.
        Ok(unsafe { result::stream::begin_capture(raw, device.capture_mode().raw()) }?)
    }

    unsafe fn end_capture(&self, stream: &Stream) -> Result<Graph> {
        // SAFETY: the caller's contract is the same.
        let (graph, raw) = unsafe { self.as_device().end_stamped(stream) }?;
        let device = self.as_device();
        if device.lazy_instantiation() {
            // SAFETY: the capture returned `graph` to us.
            return unsafe { device.own_lazily(graph) };
        }
        // SAFETY: the capture returned `graph` to us.
        unsafe { device.instantiate(graph, Some(raw)) }
    }

    unsafe fn end_capture_part(&self, stream: &Stream) -> Result<Graph> {
        // SAFETY: the caller's contract is the same.
        let (graph, _) = unsafe { self.as_device().end_stamped(stream) }?;
        // SAFETY: the capture returned `graph` to us; only ever composed
        // into a step graph (which instantiates the whole), never launched.
        Ok(unsafe { self.as_device().own_uninstantiated(graph) })
    }

    fn cuts_at(&self, graph: &Graph, event: &Event) -> Result<Cut> {
        self.as_device().cuts_at_record(graph, event)
    }

    unsafe fn cut_capture(&self, stream: &Stream) -> Result<Graph> {
        // SAFETY: the caller's contract is the same.
        let first = unsafe { self.end_capture_part(stream) }?;
        let raw = stream.raw("cuStreamBeginCapture")?;
        // SAFETY: the stream is a live, capturable stream of this context
        // (it captured until now).
        unsafe { result::stream::begin_capture(raw, self.as_device().capture_mode().raw()) }?;
        Ok(first)
    }

    fn validate_parts(&self, parts: &[&Graph]) -> std::result::Result<(), GraphRejection> {
        let (mut allocs, mut frees) = (Vec::new(), Vec::new());
        for part in parts {
            let m = self
                .as_device()
                .memory_of(part)
                .map_err(|e| GraphRejection::Uninspectable(Box::new(e)))?;
            allocs.extend_from_slice(&m.allocs);
            frees.extend_from_slice(&m.frees);
        }
        check_memory_nodes(&allocs, &frees)
    }

    unsafe fn abort_capture(&self, stream: &Stream) {
        // Another thread's per-thread stream is not this capture's.
        let Ok(raw) = stream.raw("cuStreamEndCapture") else {
            return;
        };
        if self.as_device().bind().is_err() {
            return;
        }
        // SAFETY: ending a capture (or failing to, when none is open) leaves
        // the stream usable; a returned graph is destroyed once (by the
        // wrapper when the driver returns an error with it).
        unsafe {
            if let Ok(graph) = result::stream::end_capture(raw) {
                if !graph.is_null() {
                    let _ = result::graph::destroy(graph);
                }
            }
        }
    }

    fn record_event_node(&self, stream: &Stream, event: &Event) -> Result<()> {
        let raw = stream.raw("cuEventRecordWithFlags")?;
        self.as_device().bind()?;
        if !capturing(raw)? {
            return Err(BackendError::Refused {
                call: "cuEventRecordWithFlags",
                reason:
                    "an event record node is made inside a capture; the stream is not capturing"
                        .into(),
            });
        }
        // SAFETY: both handles are live objects of this context; an
        // external record on a capturing stream becomes an event record
        // node of the graph.
        Ok(unsafe { result::event::record_external(event.cu_event(), raw) }?)
    }

    fn validate_graph(&self, graph: &Graph) -> std::result::Result<(), GraphRejection> {
        let m = self
            .as_device()
            .memory_of(graph)
            .map_err(|e| GraphRejection::Uninspectable(Box::new(e)))?;
        check_memory_nodes(&m.allocs, &m.frees)
    }

    fn graph_temporaries(&self, graph: &Graph) -> Result<Temporaries> {
        let m = self.as_device().memory_of(graph)?;
        Ok(Temporaries::of_allocations(&m.allocs))
    }
}

impl<D: AsDevice> Launch for D {
    unsafe fn launch(&self, graph: &Graph, stream: &Stream) -> Result<()> {
        let raw = stream.raw("cuGraphLaunch")?;
        // No context bound: the call takes its context from its handles
        // (`tests/gpu_interop.rs`, `replays_run_with_no_context_or_another_context_current`).
        let exec = match graph.handles.exec.get() {
            exec if !exec.is_null() => exec,
            // Captured with lazy instantiation: its first launch (the
            // instantiation pushes the graph's context and pops it).
            _ => self.as_device().instantiate_pending(graph)?,
        };
        // SAFETY: the exec and the stream are live objects of this context.
        Ok(unsafe { result::graph::launch(exec, raw) }?)
    }
}

impl Backend for Device {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn graph_memory_in_use(&self) -> Result<Option<GraphMemory>> {
        Device::graph_memory_in_use(self).map(Some)
    }

    fn trim_graph_memory(&self) -> Result<()> {
        Device::trim_graph_memory(self)
    }

    fn graph_memory_granule(&self) -> u64 {
        Device::graph_memory_granule(self)
    }
}

// The graph and event types are named (they are the `cuda` backend's
// anyway) so that the compiler reads them from the bound.
impl<D> Compose for D
where
    D: AsDevice + Backend<Graph = Graph, Event = Event>,
{
    fn split_graph(&self, graph: &Graph, events: &[&Event]) -> Result<(Graph, Graph, usize)> {
        self.as_device().split_at_record(graph, events)
    }

    fn compose(
        &self,
        nodes: Vec<StepNode<'_, Graph, Event>>,
        end: Option<StepEnd<'_, Event>>,
    ) -> Result<Graph> {
        self.as_device().compose_children(nodes, end)
    }

    fn retarget_records(&self, graph: &mut Graph, events: &[&Event]) -> Result<()> {
        self.as_device().retarget_last_records(graph, events)
    }
}
