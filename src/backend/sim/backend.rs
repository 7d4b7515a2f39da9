//! Every role for [`Device`] (the model plays them all): [`Streams`],
//! [`Allocate`], [`Capture`], [`Launch`], [`Backend`] and [`Compose`] on
//! the model (its [`Timing`](crate::backend::Timing) is in `timing.rs`).

use std::sync::Arc;

use super::arena::Arena;
use super::device::Device;
use super::faults::Call;
use super::graph::{Graph, GraphMemory, SimStep, SimStepNode};
use super::ops::Node;
use super::streams::{Capture as OpenCapture, Event, EventState, Stream};
use super::{clock::merge, sim_error, Result, FOREIGN_EVENT};
use crate::backend::{
    check_memory_nodes, Allocate, ArenaDesc, Backend, BackendError, Capture, Compose, Cut,
    GraphRejection, Launch, NodeGraph, StepEnd, StepNode, Streams, Temporaries,
};

impl Streams for Device {
    type Event = Event;

    type Stream = Stream;

    #[track_caller]
    fn create_event(&self) -> Result<Event> {
        self.fault(Call::CreateEvent)?;
        let id = self.state().events.insert(EventState::default());
        Ok(Event {
            state: self.state.clone(),
            id,
        })
    }

    /// The stream's own backend's serial and its index: a stream of
    /// another backend never shares an id with one of this backend.
    fn stream_id(&self, stream: &Stream) -> u64 {
        (stream.serial << 32) | stream.id as u64
    }

    #[track_caller]
    fn wait_event(&self, stream: &Stream, event: &Event) -> Result<()> {
        self.fault(Call::WaitEvent)?;
        let sid = self.own(stream, "sim wait")?;
        let eid = self.own_event(event, "sim wait")?;
        let mut s = self.state();
        let e = s
            .events
            .get_mut(eid)
            .cloned()
            .ok_or_else(|| sim_error("sim wait", FOREIGN_EVENT))?;
        let st = &mut s.streams[sid];
        if st.capturing.is_some() {
            return Err(sim_error(
                "sim wait",
                "the sim does not capture event waits",
            ));
        }
        st.tail = st.tail.max(e.time);
        merge(&mut st.clock, &e.clock);
        Ok(())
    }

    #[track_caller]
    fn record_event(&self, stream: &Stream, event: &Event) -> Result<()> {
        self.fault(Call::RecordEvent)?;
        let sid = self.own(stream, "sim record")?;
        let eid = self.own_event(event, "sim record")?;
        let mut s = self.state();
        let st = &s.streams[sid];
        if st.capturing.is_some() {
            return Err(sim_error(
                "sim record",
                "the sim does not capture event records",
            ));
        }
        let recorded = EventState {
            time: st.tail,
            clock: st.clock.clone(),
        };
        *s.events
            .get_mut(eid)
            .ok_or_else(|| sim_error("sim record", FOREIGN_EVENT))? = recorded;
        Ok(())
    }

    /// A full synchronize (deterministic, and never less than the event
    /// needs).
    #[track_caller]
    fn synchronize_event(&self, event: &Event) -> Result<()> {
        self.fault(Call::SynchronizeEvent)?;
        self.own_event(event, "sim event synchronize")?;
        let mut s = self.state();
        if s.waits_fail {
            return Err(sim_error("sim event synchronize", "waits fail (injected)"));
        }
        s.synchronize();
        Ok(())
    }

    /// Done once the host synchronized at or after the record: the sim's
    /// work completes only when the host waits for it.
    #[track_caller]
    fn event_done(&self, event: &Event) -> Result<bool> {
        self.fault(Call::QueryEvent)?;
        let eid = self.own_event(event, "sim event query")?;
        let s = self.state();
        let e = s
            .events
            .get(eid)
            .ok_or_else(|| sim_error("sim event query", FOREIGN_EVENT))?;
        Ok(e.time <= s.host_time)
    }

    #[track_caller]
    fn is_capturing(&self, stream: &Stream) -> Result<bool> {
        self.fault(Call::CaptureStatus)?;
        let id = self.own(stream, "sim capture status")?;
        Ok(self.state().streams[id].capturing.is_some())
    }

    #[track_caller]
    fn synchronize(&self) -> Result<()> {
        self.fault(Call::Synchronize)?;
        let mut s = self.state();
        if s.waits_fail {
            return Err(sim_error("sim synchronize", "waits fail (injected)"));
        }
        s.synchronize();
        Ok(())
    }
}

impl Allocate for Device {
    type Arena = Arena;

    #[track_caller]
    fn allocate_arena(&self, desc: &ArenaDesc) -> Result<Arena> {
        self.fault(Call::AllocateArena)?;
        let base = self
            .state()
            .alloc(desc.bytes, desc.alignment, true)
            .map_err(|reason| BackendError::Allocation {
                key: desc.key,
                bytes: desc.bytes,
                reason,
            })?;
        Ok(Arena {
            state: self.state.clone(),
            base,
            bytes: desc.bytes,
        })
    }
}

impl Capture for Device {
    type Graph = Graph;

    #[track_caller]
    fn begin_capture(&self, stream: &Stream) -> Result<()> {
        self.fault(Call::BeginCapture)?;
        let id = self.own(stream, "sim begin capture")?;
        let mut s = self.state();
        let st = &mut s.streams[id];
        if st.capturing.is_some() {
            return Err(sim_error(
                "sim begin capture",
                "the stream is already capturing",
            ));
        }
        st.capturing = Some(OpenCapture::default());
        Ok(())
    }

    #[track_caller]
    unsafe fn end_capture(&self, stream: &Stream) -> Result<Graph> {
        let id = self.own(stream, "sim end capture")?;
        let capture = self.state().streams[id]
            .capturing
            .take()
            .ok_or_else(|| sim_error("sim end capture", "the stream is not capturing"))?;
        // As CUDA's invalidated capture: a failed end (or instantiation)
        // ends the capture all the same, and its graph is gone.
        let failed = self
            .fault(Call::EndCapture)
            .and_then(|()| self.fault(Call::Instantiate));
        if let Err(e) = failed {
            let mut s = self.state();
            for base in capture.temps {
                s.free_graph_memory(base);
            }
            return Err(e);
        }
        let memory = (!capture.temps.is_empty())
            .then(|| {
                Arc::new(GraphMemory {
                    state: self.state.clone(),
                    bases: capture.temps,
                })
            })
            .into_iter()
            .collect();
        Ok(Graph {
            ops: capture.ops,
            records: capture.records,
            memory,
            step: None,
            last: Arc::default(),
        })
    }

    fn cuts_at(&self, graph: &Graph, event: &Event) -> Result<Cut> {
        // A sim capture is one stream's op list: nothing runs beside a
        // record node. A temporary lives across it when its allocation
        // comes before the record and its free after.
        let id = self.own_event(event, "sim cuts at")?;
        let at = graph
            .records
            .iter()
            .find(|&&(_, e)| e == id)
            .map(|&(at, _)| at);
        let (Some(at), None) = (at, &graph.step) else {
            return Ok(Cut::WorkBeside);
        };
        // Live at the record: allocated before it and not freed before it
        // (a graph's memory nodes balance, so freed after).
        let mut live = std::collections::HashMap::new();
        for (op, _) in &graph.ops[..at.min(graph.ops.len())] {
            match *op {
                Node::Alloc { addr, bytes } => {
                    live.insert(addr, bytes);
                }
                Node::Free { addr } => {
                    live.remove(&addr);
                }
                _ => {}
            }
        }
        let across = live.values().fold(0u64, |sum, &b| sum.saturating_add(b));
        Ok(if across == 0 {
            Cut::Clean
        } else {
            Cut::TemporariesAcross { bytes: across }
        })
    }

    #[track_caller]
    unsafe fn cut_capture(&self, stream: &Stream) -> Result<Graph> {
        let id = self.own(stream, "sim cut capture")?;
        if self.state().streams[id].capturing.is_none() {
            return Err(sim_error("sim cut capture", "the stream is not capturing"));
        }
        // All or nothing: both calls may fail before anything changes.
        self.fault(Call::EndCapture)?;
        self.fault(Call::BeginCapture)?;
        let mut s = self.state();
        let Some(capture) = s.streams[id].capturing.as_mut() else {
            return Err(sim_error("sim cut capture", "the stream is not capturing"));
        };
        let mut inherited = std::mem::take(&mut capture.inherited);
        inherited.extend_from_slice(&capture.temps);
        let freed = capture.freed.clone();
        let first = std::mem::replace(
            capture,
            OpenCapture {
                inherited,
                freed,
                ..OpenCapture::default()
            },
        );
        drop(s);
        let memory = (!first.temps.is_empty())
            .then(|| {
                Arc::new(GraphMemory {
                    state: self.state.clone(),
                    bases: first.temps,
                })
            })
            .into_iter()
            .collect();
        Ok(Graph {
            ops: first.ops,
            records: first.records,
            memory,
            step: None,
            last: Arc::default(),
        })
    }

    fn validate_parts(&self, parts: &[&Graph]) -> std::result::Result<(), GraphRejection> {
        let mut allocs = Vec::new();
        let mut frees = Vec::new();
        for (op, _) in parts.iter().flat_map(|g| &g.ops) {
            match *op {
                Node::Alloc { addr, bytes } => allocs.push((addr, bytes)),
                Node::Free { addr } => frees.push(addr),
                _ => {}
            }
        }
        check_memory_nodes(&allocs, &frees)
    }

    unsafe fn abort_capture(&self, stream: &Stream) {
        if let Ok(id) = self.own(stream, "sim abort capture") {
            let mut s = self.state();
            if let Some(capture) = s.streams[id].capturing.take() {
                for base in capture.temps {
                    s.free_graph_memory(base);
                }
            }
        }
    }

    #[track_caller]
    fn record_event_node(&self, stream: &Stream, event: &Event) -> Result<()> {
        self.fault(Call::RecordNode)?;
        let sid = self.own(stream, "sim record node")?;
        let eid = self.own_event(event, "sim record node")?;
        let mut s = self.state();
        match s.streams[sid].capturing.as_mut() {
            Some(capture) => {
                capture.records.push((capture.ops.len(), eid));
                Ok(())
            }
            None => Err(sim_error(
                "sim record node",
                "an event record node is made inside a capture; the stream is not capturing",
            )),
        }
    }

    fn validate_graph(&self, graph: &Graph) -> std::result::Result<(), GraphRejection> {
        let mut allocs = Vec::new();
        let mut frees = Vec::new();
        for (op, _) in &graph.ops {
            match *op {
                Node::Alloc { addr, bytes } => allocs.push((addr, bytes)),
                Node::Free { addr } => frees.push(addr),
                _ => {}
            }
        }
        check_memory_nodes(&allocs, &frees)
    }

    #[track_caller]
    fn graph_temporaries(&self, graph: &Graph) -> Result<Temporaries> {
        self.fault(Call::GraphMemoryQuery)?;
        let nodes: Vec<&[(Node, u64)]> = match &graph.step {
            Some(step) => step.nodes.iter().map(|n| n.ops.as_slice()).collect(),
            None => vec![graph.ops.as_slice()],
        };
        let allocs: Vec<(u64, u64)> = nodes
            .into_iter()
            .flatten()
            .filter_map(|(op, _)| match *op {
                Node::Alloc { addr, bytes } => Some((addr, bytes)),
                _ => None,
            })
            .collect();
        Ok(Temporaries::of_allocations(&allocs))
    }
}

impl Launch for Device {
    /// All or nothing, as `cuGraphLaunch`: every op is checked before the
    /// first is submitted.
    #[track_caller]
    unsafe fn launch(&self, graph: &Graph, stream: &Stream) -> Result<()> {
        self.fault(Call::Launch)?;
        let id = self.own(stream, "sim graph launch")?;
        let mut s = self.state();
        if s.streams[id].capturing.is_some() {
            return Err(sim_error("sim graph launch", "the stream is capturing"));
        }
        s.launch_graph(id, graph)
    }
}

impl Backend for Device {
    fn name(&self) -> &'static str {
        "sim"
    }

    /// The bytes of every live graph's allocation nodes, and what the sim's
    /// pool reserves: the most ever in use since the last trim, as a
    /// driver's graph memory pool keeps what it mapped until trimmed.
    #[track_caller]
    fn graph_memory_in_use(&self) -> Result<Option<crate::backend::GraphMemory>> {
        self.fault(Call::GraphMemoryQuery)?;
        let s = self.state();
        Ok(Some(crate::backend::GraphMemory::new(
            s.graph_bytes,
            s.graph_reserved,
        )))
    }

    /// The pool's reservation shrinks to what live graphs use.
    #[track_caller]
    fn trim_graph_memory(&self) -> Result<()> {
        self.fault(Call::TrimGraphMemory)?;
        let mut s = self.state();
        s.graph_reserved = s.graph_bytes;
        Ok(())
    }
}

impl Compose for Device {
    #[track_caller]
    fn split_graph(&self, graph: &Graph, events: &[&Event]) -> Result<(Graph, Graph, usize)> {
        self.fault(Call::SplitGraph)?;
        let ids = events
            .iter()
            .map(|e| self.own_event(e, "sim split graph"))
            .collect::<Result<Vec<_>>>()?;
        let Some((at, which)) = graph
            .records
            .iter()
            .find_map(|&(at, e)| Some((at, ids.iter().position(|&i| i == e)?)))
        else {
            return Err(sim_error(
                "sim split graph",
                "the graph records none of the events",
            ));
        };
        let split_at = ids[which];
        let part = |range: std::ops::Range<usize>, last: bool| Graph {
            ops: graph.ops[range.clone()].to_vec(),
            // The split record goes; the others stay where they were (a
            // record at the very end belongs to the second part).
            records: graph
                .records
                .iter()
                .filter(|&&(p, e)| {
                    e != split_at && (range.contains(&p) || (last && p == range.end))
                })
                .map(|&(p, e)| (p - range.start, e))
                .collect(),
            memory: graph.memory.clone(),
            step: None,
            last: Arc::default(),
        };
        Ok((part(0..at, false), part(at..graph.ops.len(), true), which))
    }

    #[track_caller]
    fn compose(
        &self,
        nodes: Vec<StepNode<'_, Graph, Event>>,
        end: Option<StepEnd<'_, Event>>,
    ) -> Result<Graph> {
        self.fault(Call::Compose)?;
        let ids = |events: &[&Event]| -> Result<Vec<usize>> {
            events
                .iter()
                .map(|e| self.own_event(e, "sim compose"))
                .collect()
        };
        let end = match end {
            Some(end) => Some((
                self.own_event(end.record, "sim compose")?,
                self.own_event(end.wait, "sim compose")?,
            )),
            None => None,
        };
        if nodes.iter().any(|n| n.graph.graph().step.is_some()) {
            return Err(sim_error(
                "sim compose",
                "a composed graph cannot be a node",
            ));
        }
        // As CUDA: a graph with memory nodes cannot be cloned into a child
        // graph node; it can be moved in.
        let memory_nodes = |g: &Graph| g.ops.iter().any(|(node, _)| node.is_memory());
        if nodes
            .iter()
            .any(|n| matches!(n.graph, NodeGraph::Copy(g) if memory_nodes(g)))
        {
            return Err(sim_error(
                "sim compose",
                "a graph with memory nodes cannot be copied into a child graph (CUDA refuses to \
                 clone it); move it in",
            ));
        }
        if let Some((i, _)) = nodes
            .iter()
            .enumerate()
            .find(|(i, n)| n.deps.iter().any(|d| d >= i))
        {
            return Err(sim_error(
                "sim compose",
                format!("node {i} depends on a node that is not before it"),
            ));
        }
        self.fault(Call::Instantiate)?;
        let lanes = nodes.iter().map(|n| n.lane + 1).max().unwrap_or(0);
        // Internal streams that run only inside a launch, each from the
        // launch's start (not from when the graph was composed).
        let lanes = (0..lanes)
            .map(|_| {
                let id = self.new_stream().id;
                self.state().streams[id].tail = 0;
                id
            })
            .collect();
        let events = nodes
            .iter()
            .map(|n| Ok((ids(&n.waits)?, ids(&n.records)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Graph {
            ops: Vec::new(),
            records: Vec::new(),
            last: Arc::default(),
            // A moved graph's memory is the composed graph's from now on
            // (its value is consumed here); a copied one's is shared.
            memory: nodes
                .iter()
                .flat_map(|n| n.graph.graph().memory.iter().cloned())
                .collect(),
            step: Some(Arc::new(SimStep {
                nodes: nodes
                    .iter()
                    .zip(events)
                    .map(|(n, (waits, records_after))| SimStepNode {
                        ops: n.graph.graph().ops.clone(),
                        records: n.graph.graph().records.clone(),
                        deps: n.deps.to_vec(),
                        lane: n.lane,
                        waits,
                        records_after,
                    })
                    .collect(),
                lanes,
                end,
            })),
        })
    }

    #[track_caller]
    fn retarget_records(&self, graph: &mut Graph, events: &[&Event]) -> Result<()> {
        self.fault(Call::Compose)?;
        let ids = events
            .iter()
            .map(|e| self.own_event(e, "sim retarget records"))
            .collect::<Result<Vec<_>>>()?;
        let Some(step) = graph.step.as_ref() else {
            return Err(sim_error("sim retarget records", "not a composed graph"));
        };
        if ids.len() != step.nodes.len() || step.nodes.iter().any(|n| n.records_after.is_empty()) {
            return Err(sim_error(
                "sim retarget records",
                "not a graph that records an event after each of these nodes",
            ));
        }
        // Launches already made keep theirs: the model's launches read the
        // step when they run, so the step is replaced, not changed.
        let mut next = SimStep::clone(step);
        for (node, id) in next.nodes.iter_mut().zip(ids) {
            if let Some(last) = node.records_after.last_mut() {
                *last = id;
            }
        }
        graph.step = Some(Arc::new(next));
        Ok(())
    }
}
