//! [`Backend`] for [`Device`]: arenas, events, stream capture and launch.

use super::graph::Graph;
use super::handles::{capturing, Device, Event, Stream};
use super::memory::Memory;
use super::result;
use super::{driver_error, sys, Result};
use crate::backend::{
    check_memory_nodes, ArenaDesc, Backend, BackendError, Compose, GraphMemory, GraphRejection,
    StepEnd, StepNode, Streams, Temporaries,
};
use crate::vocab::Domain;

impl Streams for Device {
    type Event = Event;

    type Stream = Stream;

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
        Ok(unsafe { result::stream::wait_event(raw, event.cu_event()) }?)
    }

    fn record_event(&self, stream: &Stream, event: &Event) -> Result<()> {
        let raw = stream.raw("cuEventRecord")?;
        self.bind()?;
        // SAFETY: both handles are live objects of this context.
        Ok(unsafe { result::event::record(event.cu_event(), raw) }?)
    }

    fn synchronize_event(&self, event: &Event) -> Result<()> {
        self.bind()?;
        // SAFETY: the event is a live object of this context.
        Ok(unsafe { result::event::synchronize(event.cu_event()) }?)
    }

    fn is_capturing(&self, stream: &Stream) -> Result<bool> {
        capturing(stream.raw("cuStreamIsCapturing")?)
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

impl Backend for Device {
    type Arena = Memory;

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
        Ok(unsafe { result::event::record_external(event.cu_event(), raw) }?)
    }

    unsafe fn launch(&self, graph: &Graph, stream: &Stream) -> Result<()> {
        let raw = stream.raw("cuGraphLaunch")?;
        self.bind()?;
        // SAFETY: the exec and the stream are live objects of this context.
        Ok(unsafe { result::graph::launch(graph.handles.exec, raw) }?)
    }

    fn begin_capture(&self, stream: &Stream) -> Result<()> {
        // `wrap_stream` refused the legacy stream; the per-thread stream is
        // captured like any other (on its own thread).
        let raw = stream.raw("cuStreamBeginCapture")?;
        self.bind()?;
        // SAFETY: the stream is a live, capturable stream of this context.
        Ok(unsafe { result::stream::begin_capture(raw, self.capture_mode().raw()) }?)
    }

    unsafe fn end_capture(&self, stream: &Stream) -> Result<Graph> {
        let raw = stream.raw("cuStreamEndCapture")?;
        self.bind()?;
        // SAFETY: the stream is live (a graph the driver hands back with an
        // error is destroyed by the wrapper).
        let graph = unsafe { result::stream::end_capture(raw) }?;
        if graph.is_null() {
            return Err(BackendError::Refused {
                op: "cuStreamEndCapture",
                reason: "the capture produced no graph".into(),
            });
        }
        // SAFETY: the capture returned `graph` to us.
        unsafe { self.stamp_captured(graph, raw) }?;
        // SAFETY: the capture returned `graph` to us.
        unsafe { self.instantiate(graph, Some(raw)) }
    }

    unsafe fn end_capture_part(&self, stream: &Stream) -> Result<Graph> {
        let raw = stream.raw("cuStreamEndCapture")?;
        self.bind()?;
        // SAFETY: the stream is live (a graph the driver hands back with an
        // error is destroyed by the wrapper).
        let graph = unsafe { result::stream::end_capture(raw) }?;
        if graph.is_null() {
            return Err(BackendError::Refused {
                op: "cuStreamEndCapture",
                reason: "the capture produced no graph".into(),
            });
        }
        // SAFETY: the capture returned `graph` to us.
        unsafe { self.stamp_captured(graph, raw) }?;
        // SAFETY: the capture returned `graph` to us; only ever composed
        // into a step graph (which instantiates the whole), never launched.
        Ok(unsafe { self.own_uninstantiated(graph) })
    }

    fn cuts_at(&self, graph: &Graph, event: &Event) -> Result<bool> {
        self.cuts_at_record(graph, event)
    }

    unsafe fn cut_capture(&self, stream: &Stream) -> Result<Graph> {
        // SAFETY: the caller's contract is the same.
        let first = unsafe { self.end_capture_part(stream) }?;
        let raw = stream.raw("cuStreamBeginCapture")?;
        // SAFETY: the stream is a live, capturable stream of this context
        // (it captured until now).
        unsafe { result::stream::begin_capture(raw, self.capture_mode().raw()) }?;
        Ok(first)
    }

    fn validate_parts(&self, parts: &[&Graph]) -> std::result::Result<(), GraphRejection> {
        let uninspectable = |e| GraphRejection::Uninspectable(Box::new(e));
        self.bind().map_err(uninspectable)?;
        let (mut allocs, mut frees) = (Vec::new(), Vec::new());
        for part in parts {
            self.memory_nodes(part.handles.graph, 0, &mut allocs, &mut frees)
                .map_err(uninspectable)?;
        }
        check_memory_nodes(&allocs, &frees)
    }

    unsafe fn abort_capture(&self, stream: &Stream) {
        // Another thread's per-thread stream is not this capture's.
        let Ok(raw) = stream.raw("cuStreamEndCapture") else {
            return;
        };
        if self.bind().is_err() {
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

    fn graph_memory_in_use(&self) -> Result<Option<GraphMemory>> {
        Device::graph_memory_in_use(self).map(Some)
    }

    fn graph_temporaries(&self, graph: &Graph) -> Result<Temporaries> {
        self.bind()?;
        let (mut allocs, mut frees) = (Vec::new(), Vec::new());
        self.memory_nodes(graph.handles.graph, 0, &mut allocs, &mut frees)?;
        Ok(Temporaries::new(
            allocs.len(),
            allocs.iter().map(|&(_, bytes)| bytes).sum(),
        ))
    }

    fn trim_graph_memory(&self) -> Result<()> {
        Device::trim_graph_memory(self)
    }

    fn validate_graph(&self, graph: &Graph) -> std::result::Result<(), GraphRejection> {
        let uninspectable = |e| GraphRejection::Uninspectable(Box::new(e));
        self.bind().map_err(uninspectable)?;
        let (mut allocs, mut frees) = (Vec::new(), Vec::new());
        self.memory_nodes(graph.handles.graph, 0, &mut allocs, &mut frees)
            .map_err(uninspectable)?;
        check_memory_nodes(&allocs, &frees)
    }
}

impl Compose for Device {
    fn split_graph(&self, graph: &Graph, events: &[&Event]) -> Result<(Graph, Graph, usize)> {
        self.split_at_record(graph, events)
    }

    fn compose(
        &self,
        nodes: Vec<StepNode<'_, Device>>,
        end: Option<StepEnd<'_, Device>>,
    ) -> Result<Graph> {
        self.compose_children(nodes, end)
    }
}
