//! Graphs and graph surgery: instantiation, adopting the program's graphs,
//! the memory nodes a plan checks, splitting a graph at an event record and
//! composing graphs into one.

use std::cell::{Cell, OnceCell};
use std::fmt;
use std::marker::PhantomData;
use std::ptr;
use std::sync::Arc;

use cudarc::driver::CudaContext;

use super::device::{Device, Event};
use super::result::{self, AddNodeV2, NodeGetDependencies};
use super::{sys, Result};
use crate::backend::{BackendError, Cut, GraphMemory, NodeGraph, StepEnd, StepNode};

/// Raw graph handles; moved between threads only inside a [`Graph`].
pub(super) struct GraphHandles {
    pub(super) graph: sys::CUgraph,
    /// Null until instantiated (a graph captured with lazy instantiation
    /// gets it at its first launch, through `&self`: `Graph` is `!Sync`).
    pub(super) exec: Cell<sys::CUgraphExec>,
}

// SAFETY: graph handles may be used from any thread that makes their context
// current (every call here does); `Graph` is `!Sync`, so they are never
// used from two threads at once.
unsafe impl Send for GraphHandles {}

/// A captured graph and its instantiation, owned by the plan once the
/// runner's capture finishes. `Send` but not `Sync`: CUDA graph objects must
/// not be used from two threads at once.
pub struct Graph {
    pub(super) handles: GraphHandles,
    ctx: Arc<CudaContext>,
    /// Its memory nodes, read once (a captured graph's nodes never change):
    /// before its upload, so that no later inspection waits for it.
    memory: OnceCell<MemoryNodes>,
    /// A composed graph's event record nodes, per step node, in the order
    /// of its `records` ([`Compose::retarget_records`](crate::backend::Compose::retarget_records)).
    records: Vec<Vec<usize>>,
    /// The instantiation flags of a graph captured or composed with lazy
    /// instantiation ([`Device::with_lazy_instantiation`](super::Device::with_lazy_instantiation)),
    /// instantiated at its first launch (kept while a runner's graph is
    /// only composed into step graphs); `None` once instantiated, and for
    /// graphs that are never launched on their own (parts and step
    /// copies).
    pending: Cell<Option<u64>>,
    _not_sync: PhantomData<Cell<()>>,
}

/// A graph's memory allocation nodes (address, bytes) and free nodes
/// (address), its child graphs' included.
#[derive(Debug, Default)]
pub(super) struct MemoryNodes {
    pub(super) allocs: Vec<(u64, u64)>,
    pub(super) frees: Vec<u64>,
}

impl fmt::Debug for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Graph")
            .field("graph", &self.handles.graph)
            .field("exec", &self.handles.exec.get())
            .finish()
    }
}

impl Graph {
    /// The raw `CUgraph` (do not destroy it).
    pub fn cu_graph(&self) -> sys::CUgraph {
        self.handles.graph
    }

    /// The raw `CUgraphExec` (do not destroy it): null for a graph
    /// captured or composed with lazy instantiation
    /// ([`Device::with_lazy_instantiation`](super::Device::with_lazy_instantiation))
    /// until its first launch, and for a graph only ever composed into a
    /// step graph.
    pub fn cu_graph_exec(&self) -> sys::CUgraphExec {
        self.handles.exec.get()
    }

    /// Whether it has its executable graph: false for a graph captured or
    /// composed with lazy instantiation until its first launch.
    pub fn is_instantiated(&self) -> bool {
        !self.handles.exec.get().is_null()
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: both handles are owned by this graph and destroyed once;
            // the plan synchronized before dropping graphs. A part of a
            // split graph has no executable graph; a graph moved into a
            // step graph has neither (the step graph owns it).
            unsafe {
                if !self.handles.exec.get().is_null() {
                    let _ = result::graph::exec_destroy(self.handles.exec.get());
                }
                if !self.handles.graph.is_null() {
                    let _ = result::graph::destroy(self.handles.graph);
                }
            }
        }
    }
}

impl Device {
    /// Owns `graph` without instantiating it (a part of a step copy, only
    /// ever moved into a step graph).
    ///
    /// # Safety
    ///
    /// `graph` is a live graph of this context that the caller hands over.
    pub(super) unsafe fn own_uninstantiated(&self, graph: sys::CUgraph) -> Graph {
        Graph {
            handles: GraphHandles {
                graph,
                exec: Cell::new(ptr::null_mut()),
            },
            ctx: self.inner.ctx.clone(),
            memory: OnceCell::new(),
            records: Vec::new(),
            pending: Cell::new(None),
            _not_sync: PhantomData,
        }
    }

    /// Owns a captured `graph` to be instantiated at its first launch
    /// ([`Device::with_lazy_instantiation`](super::Device::with_lazy_instantiation)),
    /// with this backend's flags; its memory nodes read now.
    ///
    /// # Safety
    ///
    /// `graph` is a live graph of this context that the caller hands over
    /// (destroyed here on failure).
    pub(super) unsafe fn own_lazily(&self, graph: sys::CUgraph) -> Result<Graph> {
        // SAFETY: the caller's; from here on, dropping `owned` destroys it.
        let owned = unsafe { self.own_uninstantiated(graph) };
        owned.pending.set(Some(self.instantiate_flags().bits()));
        self.keep_memory_nodes(&owned)?;
        Ok(owned)
    }

    /// The executable graph of `graph` waiting for its first launch,
    /// instantiated now (no upload: the launch that follows uploads it).
    /// On failure nothing changes, and the next launch tries again.
    #[cold]
    pub(super) fn instantiate_pending(&self, graph: &Graph) -> Result<sys::CUgraphExec> {
        let Some(flags) = graph.pending.get() else {
            return Err(BackendError::Refused {
                call: "cuGraphLaunch",
                reason: "the graph has no executable graph: it is only ever composed into a \
                         step graph"
                    .into(),
            });
        };
        // The graph's context current for the call, then whatever was
        // current before again: a launch leaves the thread's context as it
        // found it (`tests/gpu_interop.rs`).
        // SAFETY: a live context (the backend's), popped once below.
        unsafe { result::device::push_current(self.inner.ctx.cu_ctx()) }?;
        // SAFETY: the graph is live and ours; its executable graph is made
        // once (`pending` is cleared below, and `Graph` is `!Sync`).
        let made = unsafe { result::graph::instantiate(graph.handles.graph, flags) };
        // SAFETY: after the push above, once.
        let _ = unsafe { result::device::pop_current() };
        let exec = made?;
        graph.handles.exec.set(exec);
        graph.pending.set(None);
        Ok(exec)
    }

    /// Ends the capture on `stream` and stamps the graph's kernel nodes
    /// with the stream's priority ([`Device::stamp_captured`]): the graph,
    /// the caller's now, and the raw stream.
    ///
    /// # Safety
    ///
    /// As [`Capture::end_capture`](crate::backend::Capture::end_capture).
    pub(super) unsafe fn end_stamped(
        &self,
        stream: &super::device::Stream,
    ) -> Result<(sys::CUgraph, sys::CUstream)> {
        let raw = stream.raw("cuStreamEndCapture")?;
        self.bind()?;
        // SAFETY: the stream is live (a graph the driver hands back with an
        // error is destroyed by the wrapper).
        let graph = unsafe { result::stream::end_capture(raw) }?;
        if graph.is_null() {
            return Err(BackendError::Refused {
                call: "cuStreamEndCapture",
                reason: "the capture produced no graph".into(),
            });
        }
        // SAFETY: the capture returned `graph` to us.
        unsafe { self.stamp_captured(graph, raw) }?;
        Ok((graph, raw))
    }

    /// Stamps a captured graph's kernel nodes with the priority of the
    /// stream `raw` that captured it, so that it stays with the work in
    /// step graphs (which run nodes at their own priority); destroys the
    /// graph on failure.
    ///
    /// # Safety
    ///
    /// `graph` is a live graph the capture on `raw` returned to the caller,
    /// not instantiated yet.
    pub(super) unsafe fn stamp_captured(
        &self,
        graph: sys::CUgraph,
        raw: sys::CUstream,
    ) -> Result<()> {
        // SAFETY: a live stream of this context, current on this thread.
        let stamped = unsafe { result::stream::priority(raw) }
            .map_err(BackendError::from)
            .and_then(|priority| match priority {
                0 => Ok(()),
                // SAFETY: the caller's graph; nothing instantiates it yet.
                p => unsafe { self.stamp_priority(graph, p, 0) },
            });
        if stamped.is_err() {
            // SAFETY: the caller handed `graph` over; destroyed once.
            let _ = unsafe { result::graph::destroy(graph) };
        }
        stamped
    }

    /// [`Capture::cuts_at`](crate::backend::Capture::cuts_at): the record node of
    /// `event` in `graph`, whether every other node is its ancestor or its
    /// descendant, and the bytes of the allocation nodes among its
    /// ancestors whose free nodes are among its descendants.
    pub(super) fn cuts_at_record(&self, graph: &Graph, event: &Event) -> Result<Cut> {
        self.bind()?;
        let nodes = nodes_of(graph.handles.graph)?;
        let record = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EVENT_RECORD as u32;
        let mut at = None;
        for &node in &nodes {
            // SAFETY: a node of the live graph.
            if unsafe { result::graph::node_type(node) }? == record
                // SAFETY: an event record node of the graph.
                && unsafe { result::graph::record_node_event(node) }? == event.cu_event()
            {
                at = Some(node);
                break;
            }
        }
        let Some(at) = at else {
            return Ok(Cut::WorkBeside);
        };
        let index: std::collections::HashMap<usize, usize> = nodes
            .iter()
            .enumerate()
            .map(|(i, &n)| (n as usize, i))
            .collect();
        let deps: Vec<Vec<usize>> = nodes
            .iter()
            .map(|&n| {
                Ok(deps_of(n)?
                    .iter()
                    .filter_map(|d| index.get(&(*d as usize)).copied())
                    .collect())
            })
            .collect::<Result<_>>()?;
        let at = index[&(at as usize)];
        // Ancestors: walk the dependencies up from the record.
        let mut before = vec![false; nodes.len()];
        let mut todo = deps[at].clone();
        while let Some(n) = todo.pop() {
            if !before[n] {
                before[n] = true;
                todo.extend(&deps[n]);
            }
        }
        // Descendants: in an order where dependencies come first (Kahn).
        let mut dependents = vec![Vec::new(); nodes.len()];
        let mut waiting: Vec<usize> = deps.iter().map(Vec::len).collect();
        for (n, ds) in deps.iter().enumerate() {
            for &d in ds {
                dependents[d].push(n);
            }
        }
        let mut after = vec![false; nodes.len()];
        let mut ready: Vec<usize> = (0..nodes.len()).filter(|&n| waiting[n] == 0).collect();
        while let Some(n) = ready.pop() {
            after[n] = after[n] || deps[n].iter().any(|&d| d == at || after[d]);
            for &m in &dependents[n] {
                waiting[m] -= 1;
                if waiting[m] == 0 {
                    ready.push(m);
                }
            }
        }
        if !(0..nodes.len()).all(|n| n == at || before[n] || after[n]) {
            return Ok(Cut::WorkBeside);
        }
        // Temporaries across the record: allocated before it and not freed
        // before it (the graph's memory nodes balance, so freed after). The
        // driver may give a later allocation a freed one's address, so an
        // address counts as live by its allocations less its frees.
        let alloc = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC as u32;
        let free = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_FREE as u32;
        let mut live: std::collections::HashMap<u64, (i64, u64)> = std::collections::HashMap::new();
        for (&node, _) in nodes.iter().zip(&before).filter(|&(_, &b)| b) {
            // SAFETY: a node of the live graph.
            let kind = unsafe { result::graph::node_type(node) }?;
            if kind == alloc {
                // SAFETY: an allocation node of the graph.
                let (addr, bytes) = unsafe { result::graph::mem_alloc_node_params(node) }?;
                let entry = live.entry(addr).or_default();
                *entry = (entry.0 + 1, entry.1.max(bytes));
            } else if kind == free {
                // SAFETY: a free node of the graph.
                let addr = unsafe { result::graph::mem_free_node_params(node) }?;
                live.entry(addr).or_default().0 -= 1;
            }
        }
        let across = live
            .values()
            .filter(|&&(n, _)| n > 0)
            .fold(0u64, |sum, &(_, bytes)| sum.saturating_add(bytes));
        Ok(if across == 0 {
            Cut::Clean
        } else {
            Cut::TemporariesAcross { bytes: across }
        })
    }

    /// A graph the program captured with cudarc (its own
    /// `begin_capture`/`end_capture`), for
    /// [`RunnerCapture::finish_with_graph`](crate::RunnerCapture::finish_with_graph):
    /// the graph is cloned (`cuGraphClone`, so the program's `Graph`
    /// stays the program's) and instantiated with this backend's
    /// [`InstantiateFlags`](super::InstantiateFlags).
    ///
    /// # Errors
    ///
    /// The driver's error (a graph with memory nodes cannot be cloned:
    /// capture such work with `stream_capture` instead).
    pub fn adopt_graph(&self, graph: &cudarc::driver::CudaGraph) -> Result<Graph> {
        self.bind()?;
        // SAFETY: `graph.cu_graph()` is live for the borrow.
        let clone = unsafe { result::graph::clone(graph.cu_graph()) }?;
        // SAFETY: `clone` is ours; `instantiate` destroys it on failure.
        unsafe { self.instantiate(clone, None) }
    }

    /// Gives every kernel node of `graph` (child graphs included) that has
    /// no priority of its own `priority`: the priority of the stream it was
    /// captured on, which a step graph (instantiated with
    /// `CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY`) keeps.
    ///
    /// # Safety
    ///
    /// `graph` is a live graph of the current context that nothing
    /// instantiates meanwhile.
    pub(super) unsafe fn stamp_priority(
        &self,
        graph: sys::CUgraph,
        priority: i32,
        depth: usize,
    ) -> Result<()> {
        if depth > 64 {
            return Err(BackendError::Refused {
                call: "graph inspection",
                reason: "child graphs nest more than 64 deep".into(),
            });
        }
        let kernel = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL as u32;
        let child = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_GRAPH as u32;
        for node in nodes_of(graph)? {
            // SAFETY: `node` belongs to `graph`.
            let kind = unsafe { result::graph::node_type(node) }?;
            if kind == kernel {
                // SAFETY: a kernel node of `graph`.
                if unsafe { result::graph::kernel_priority(node) }? == 0 {
                    // SAFETY: as above; nothing instantiates `graph` now.
                    unsafe { result::graph::set_kernel_priority(node, priority) }?;
                }
            } else if kind == child {
                // SAFETY: a child graph node; the child stays its own.
                let sub = unsafe { result::graph::child_graph(node) }?;
                // SAFETY: a live graph of the current context.
                unsafe { self.stamp_priority(sub, priority, depth + 1) }?;
            }
        }
        Ok(())
    }

    /// Instantiates `graph` with this backend's flags (uploading it on
    /// `upload_on` when uploads are on) and owns both handles.
    ///
    /// # Safety
    ///
    /// `graph` is a live graph of this context that the caller hands over:
    /// it is destroyed here on failure, with the returned `Graph`
    /// otherwise.
    pub(super) unsafe fn instantiate(
        &self,
        graph: sys::CUgraph,
        upload_on: Option<sys::CUstream>,
    ) -> Result<Graph> {
        // SAFETY: the caller's.
        unsafe { self.instantiate_with(graph, upload_on, self.instantiate_flags()) }
    }

    /// [`Device::instantiate`] with `flags`.
    ///
    /// # Safety
    ///
    /// As [`Device::instantiate`].
    pub(super) unsafe fn instantiate_with(
        &self,
        graph: sys::CUgraph,
        upload_on: Option<sys::CUstream>,
        flags: super::InstantiateFlags,
    ) -> Result<Graph> {
        let flags = flags.bits();
        // SAFETY: `graph` is live.
        let exec = match unsafe { result::graph::instantiate(graph, flags) } {
            Ok(exec) => exec,
            Err(e) => {
                // SAFETY: the graph was handed over and is destroyed once.
                let _ = unsafe { result::graph::destroy(graph) };
                return Err(e.into());
            }
        };
        // From here on, dropping `owned` destroys both handles.
        let owned = Graph {
            handles: GraphHandles {
                graph,
                exec: Cell::new(exec),
            },
            ctx: self.inner.ctx.clone(),
            memory: OnceCell::new(),
            records: Vec::new(),
            pending: Cell::new(None),
            _not_sync: PhantomData,
        };
        if upload_on.is_some() {
            // A captured graph: its memory nodes are read now, before the
            // upload, which a later inspection would wait for.
            self.keep_memory_nodes(&owned)?;
        }
        if let Some(raw) = upload_on.filter(|_| self.graph_upload()) {
            // SAFETY: the exec and the stream are live objects of this
            // context; the upload is ordered on that stream, and launches
            // of this exec are ordered behind it.
            unsafe { result::graph::upload(exec, raw) }?;
        }
        Ok(owned)
    }

    /// Device memory the driver holds for graph memory nodes (the
    /// temporaries of every graph on this device: `cuDeviceGetGraphMemAttribute`),
    /// in use now and reserved now. Beside the plan's arenas, the other half
    /// of what replaying costs in memory.
    /// [`Backend::graph_memory_in_use`](crate::backend::Backend::graph_memory_in_use)
    /// gives the same, always `Some`.
    ///
    /// # Errors
    ///
    /// The driver's error.
    pub fn graph_memory_in_use(&self) -> Result<GraphMemory> {
        self.bind()?;
        let get = |attr| result::device::graph_mem_attribute(self.inner.ctx.cu_device(), attr);
        Ok(GraphMemory {
            used: get(sys::CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT)?,
            reserved: get(sys::CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)?,
        })
    }

    /// Gives the device memory the driver reserved for graph allocations,
    /// and no live graph uses, back to the device
    /// (`cuDeviceGraphMemTrim`); [`GraphMemory::reserved`] falls by what it
    /// gave back. A plan does it at teardown and `replan`; call it after
    /// dropping other graphs with temporaries.
    ///
    /// # Errors
    ///
    /// The driver's error.
    pub fn trim_graph_memory(&self) -> Result<()> {
        self.bind()?;
        Ok(result::device::graph_mem_trim(self.inner.ctx.cu_device())?)
    }

    /// Refuses a graph with memory nodes where it would be cloned (a split,
    /// a child graph node): the driver does not clone such graphs
    /// (`cuGraphClone` returns `CUDA_ERROR_NOT_SUPPORTED`).
    fn refuse_memory_nodes(&self, graph: &Graph) -> Result<()> {
        // Read once per graph (a captured graph's at its capture): a step
        // graph's build asks again for every runner it copies in.
        let m = self.memory_of(graph)?;
        let (allocs, frees) = (&m.allocs, &m.frees);
        if allocs.is_empty() && frees.is_empty() {
            return Ok(());
        }
        Err(BackendError::Refused {
            call: "step graph",
            reason: format!(
                "the graph has memory nodes ({} allocation(s), {} free(s) of temporaries), which \
                 the driver does not clone into a child graph; replay this runner per runner, or \
                 give its temporaries plan requests",
                allocs.len(),
                frees.len()
            ),
        })
    }

    /// `graph`'s memory nodes, read from the driver the first time only.
    pub(super) fn memory_of<'g>(&self, graph: &'g Graph) -> Result<&'g MemoryNodes> {
        if let Some(m) = graph.memory.get() {
            return Ok(m);
        }
        self.bind()?;
        let mut m = MemoryNodes::default();
        self.memory_nodes(graph.handles.graph, 0, &mut m.allocs, &mut m.frees)?;
        Ok(graph.memory.get_or_init(|| m))
    }

    /// Reads a captured graph's memory nodes into `graph` now (before its
    /// upload: see [`Graph`]'s `memory`).
    pub(super) fn keep_memory_nodes(&self, graph: &Graph) -> Result<()> {
        self.memory_of(graph).map(drop)
    }

    /// Collects the memory allocation nodes (address, bytes) and free nodes
    /// (address) of `graph` and, recursively, of its child graphs.
    pub(super) fn memory_nodes(
        &self,
        graph: sys::CUgraph,
        depth: usize,
        allocs: &mut Vec<(u64, u64)>,
        frees: &mut Vec<u64>,
    ) -> std::result::Result<(), BackendError> {
        if depth > 64 {
            return Err(BackendError::Refused {
                call: "graph inspection",
                reason: "child graphs nest more than 64 deep".into(),
            });
        }
        // An empty graph (a runner whose capture enqueued nothing) has none.
        let nodes = nodes_of(graph)?;
        let alloc = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC as u32;
        let free = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_FREE as u32;
        let child = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_GRAPH as u32;
        for node in nodes {
            // SAFETY: `node` belongs to `graph`.
            let kind = unsafe { result::graph::node_type(node) }?;
            if kind == alloc {
                // SAFETY: `node` is an allocation node of `graph`.
                allocs.push(unsafe { result::graph::mem_alloc_node_params(node) }?);
            } else if kind == free {
                // SAFETY: `node` is a free node of `graph`.
                frees.push(unsafe { result::graph::mem_free_node_params(node) }?);
            } else if kind == child {
                // SAFETY: `node` is a child graph node; the child graph stays
                // owned by it.
                let sub = unsafe { result::graph::child_graph(node) }?;
                self.memory_nodes(sub, depth + 1, allocs, frees)?;
            }
        }
        Ok(())
    }

    /// [`Compose::split_graph`](crate::backend::Compose::split_graph): clones the
    /// graph twice: one clone keeps the nodes the chosen record node depends
    /// on, the other every node but those and the record.
    pub(super) fn split_at_record(
        &self,
        graph: &Graph,
        events: &[&Event],
    ) -> Result<(Graph, Graph, usize)> {
        self.bind()?;
        self.refuse_memory_nodes(graph)?;
        let g = graph.handles.graph;
        let record = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EVENT_RECORD as u32;
        let nodes = nodes_of(g)?;
        // The record nodes of `events`, each with its ancestors.
        type Found = (sys::CUgraphNode, std::collections::HashSet<usize>, usize);
        let mut best: Option<Found> = None;
        for &node in &nodes {
            // SAFETY: a node of `g`.
            if unsafe { result::graph::node_type(node) }? != record {
                continue;
            }
            // SAFETY: an event record node of `g`.
            let event = unsafe { result::graph::record_node_event(node) }?;
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
                call: "split graph",
                reason: "the graph records none of the events".into(),
            });
        };
        // Each part: a clone without the nodes `drop` names.
        let part = |drop: &dyn Fn(sys::CUgraphNode) -> bool| -> Result<Graph> {
            // SAFETY: `g` is live.
            let clone = unsafe { result::graph::clone(g) }?;
            // SAFETY: `clone` is ours, of this context.
            let owned = unsafe { self.own_uninstantiated(clone) };
            for &node in nodes.iter().filter(|&&n| drop(n)) {
                // SAFETY: `node` is a node of `g`, of which `clone` is a
                // clone; then its twin is destroyed once.
                unsafe {
                    let twin = result::graph::find_in_clone(node, clone)?;
                    result::graph::destroy_node(twin)?;
                }
            }
            Ok(owned)
        };
        let first = part(&|n| !before.contains(&(n as usize)))?;
        let rest = part(&|n| n == at || before.contains(&(n as usize)))?;
        Ok((first, rest, which))
    }

    /// [`Compose::compose`](crate::backend::Compose::compose): a graph of child graph
    /// nodes, instantiated with this backend's flags. A copied node's graph
    /// is cloned in (`cuGraphAddChildGraphNode`); a moved one's is moved in
    /// (`cuGraphAddNode_v2` with `CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE`, CUDA
    /// 12.9 and later: the only way a graph with memory nodes goes into
    /// another), its own executable graph destroyed first, since a graph
    /// with memory nodes may have only one at a time.
    pub(super) fn compose_children(
        &self,
        nodes: Vec<StepNode<'_, Graph, Event>>,
        end: Option<StepEnd<'_, Event>>,
    ) -> Result<Graph> {
        self.bind()?;
        for node in &nodes {
            if let NodeGraph::Copy(g) = &node.graph {
                self.refuse_memory_nodes(g)?;
            }
        }
        let add_moved = if nodes.iter().any(|n| matches!(n.graph, NodeGraph::Move(_))) {
            Some(self.move_fn()?)
        } else {
            None
        };
        let parent = result::graph::create()?;
        // Destroys the parent (and the graphs moved into it) on failure.
        // SAFETY: `parent` is a live graph of this context, ours.
        let parent = unsafe { self.own_uninstantiated(parent) };
        let event_node = |wait: bool, deps: &[sys::CUgraphNode], event: &Event| {
            event_node(&parent, wait, deps, event)
        };
        let mut added: Vec<sys::CUgraphNode> = Vec::with_capacity(nodes.len());
        // Node handles as addresses: a `Graph` is `Send`.
        let mut records: Vec<Vec<usize>> = Vec::with_capacity(nodes.len());
        // One list of dependencies, refilled for each node: a build
        // allocates none per node.
        let mut deps: Vec<sys::CUgraphNode> = Vec::new();
        for node in nodes {
            deps.clear();
            for &d in node.deps {
                let Some(&before) = added.get(d) else {
                    return Err(BackendError::Refused {
                        call: "cuGraphAddChildGraphNode",
                        reason: "a node depends on a node that is not before it".into(),
                    });
                };
                deps.push(before);
            }
            for event in &node.waits {
                deps.push(event_node(true, &[], event)?);
            }
            let child = add_child(&parent, &deps, node.graph, add_moved)?;
            let recorded = node
                .records
                .iter()
                .map(|event| event_node(false, &[child], event).map(|n| n as usize))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            records.push(recorded);
            added.push(child);
        }
        if let Some(end) = end {
            // After every node (the record), and a root the graph's
            // completion waits for (the other launch's end).
            event_node(false, &added, end.record)?;
            event_node(true, &[], end.wait)?;
        }
        self.instantiate_composed(parent, records)
    }

    /// Finishes a composed `parent`: an instantiation with this backend's
    /// flags, its kernel nodes at the priority they were captured with,
    /// and `records` (per step node, its record nodes). With lazy
    /// instantiation ([`Device::with_lazy_instantiation`](super::Device::with_lazy_instantiation)),
    /// the instantiation waits for the step graph's first launch.
    fn instantiate_composed(&self, mut parent: Graph, records: Vec<Vec<usize>>) -> Result<Graph> {
        // Kernel nodes run at the priority they were captured with (a
        // consumer on a high-priority stream gets SMs first), not the
        // launch stream's.
        let flags = super::InstantiateFlags {
            use_node_priority: true,
            ..self.instantiate_flags()
        };
        if self.lazy_instantiation() {
            // Its memory nodes (those of the step copies moved in) read
            // now, as a lazily captured graph's are.
            self.keep_memory_nodes(&parent)?;
            parent.pending.set(Some(flags.bits()));
            parent.records = records;
            return Ok(parent);
        }
        let raw = std::mem::replace(&mut parent.handles.graph, ptr::null_mut());
        drop(parent);
        // SAFETY: `raw` is ours; `instantiate_with` destroys it on failure.
        let mut composed = unsafe { self.instantiate_with(raw, None, flags) }?;
        composed.records = records;
        Ok(composed)
    }

    /// [`Compose::retarget_records`](crate::backend::Compose::retarget_records): each
    /// step node's last record node records `events[i]` at the executable
    /// graph's next launches (`cuGraphExecEventRecordNodeSetEvent`).
    pub(super) fn retarget_last_records(&self, graph: &Graph, events: &[&Event]) -> Result<()> {
        if graph.handles.exec.get().is_null()
            || events.len() != graph.records.len()
            || graph.records.iter().any(Vec::is_empty)
        {
            return Err(BackendError::Refused {
                call: "retarget records",
                reason: "not a composed graph that records an event after each of these nodes"
                    .into(),
            });
        }
        self.bind()?;
        for (nodes, event) in graph.records.iter().zip(events) {
            let node = nodes[nodes.len() - 1] as sys::CUgraphNode;
            // SAFETY: the exec, its graph's record node and the event are
            // live objects of this context.
            unsafe {
                result::graph::exec_set_record_event(
                    graph.handles.exec.get(),
                    node,
                    event.cu_event(),
                )
            }?;
        }
        Ok(())
    }

    /// `cuGraphAddNode_v2`, looked up in the driver by name (cudarc binds
    /// the moved-ownership field only for CUDA 12.9 and later), on a
    /// driver of CUDA 12.9 or later.
    fn move_fn(&self) -> Result<AddNodeV2> {
        let version = result::driver_version()?;
        if version < 12090 {
            return Err(BackendError::Refused {
                call: "step graph",
                reason: format!(
                    "a graph with temporaries (memory nodes) goes into a step graph only moved, \
                     which needs a CUDA 12.9 or later driver; this driver is CUDA {}.{}: replay \
                     this runner per runner",
                    version / 1000,
                    version % 1000 / 10
                ),
            });
        }
        AddNodeV2::get().ok_or_else(|| BackendError::Refused {
            call: "step graph",
            reason: "the driver exports no cuGraphAddNode_v2, which moves a graph with \
                     temporaries into a step graph"
                .into(),
        })
    }
}

/// The nodes of `graph`.
fn nodes_of(graph: sys::CUgraph) -> Result<Vec<sys::CUgraphNode>> {
    // SAFETY: a live graph (every caller's graph is).
    Ok(unsafe { result::graph::nodes(graph) }?)
}

/// The nodes `node` depends on.
fn deps_of(node: sys::CUgraphNode) -> Result<Vec<sys::CUgraphNode>> {
    let f = NodeGetDependencies::get().ok_or_else(|| BackendError::Refused {
        call: "cuGraphNodeGetDependencies",
        reason: "the driver exports neither cuGraphNodeGetDependencies_v2 nor cuGraphNodeGetDependencies".into(),
    })?;
    // SAFETY: a node of a live graph (every caller's node is).
    Ok(unsafe { f.dependencies(node) }?)
}

/// An event wait (`wait`) or record node of `parent` after `deps`.
fn event_node(
    parent: &Graph,
    wait: bool,
    deps: &[sys::CUgraphNode],
    event: &Event,
) -> Result<sys::CUgraphNode> {
    let (graph, event) = (parent.handles.graph, event.cu_event());
    // SAFETY: `parent` is live, `deps` are its nodes, the event is live for
    // the borrow and is not destroyed before the graphs (the step graph
    // owns both, graphs first).
    let node = unsafe {
        if wait {
            result::graph::add_event_wait_node(graph, deps, event)
        } else {
            result::graph::add_event_record_node(graph, deps, event)
        }
    }?;
    Ok(node)
}

/// A child graph node of `parent` after `deps`: `graph` cloned in, or
/// moved in with `add_moved` (its own executable graph destroyed first:
/// a graph with memory nodes may have only one at a time).
fn add_child(
    parent: &Graph,
    deps: &[sys::CUgraphNode],
    graph: NodeGraph<'_, Graph>,
    add_moved: Option<AddNodeV2>,
) -> Result<sys::CUgraphNode> {
    match graph {
        NodeGraph::Copy(g) => {
            // SAFETY: `parent` and the node's graph are live graphs of this
            // context; the child graph is cloned in.
            let child = unsafe {
                result::graph::add_child_graph_node(parent.handles.graph, deps, g.handles.graph)
            }?;
            Ok(child)
        }
        NodeGraph::Move(mut g) => {
            let add = add_moved.ok_or_else(|| BackendError::Refused {
                call: "cuGraphAddNode_v2",
                reason: "no entry point for moved child graphs".into(),
            })?;
            if !g.handles.exec.get().is_null() {
                // SAFETY: the graph's own executable graph, never launched
                // by the plan (a step copy), destroyed once.
                let _ = unsafe { result::graph::exec_destroy(g.handles.exec.get()) };
                g.handles.exec.set(ptr::null_mut());
            }
            g.pending.set(None);
            // SAFETY: `parent` and `g` are live graphs of this context, `g`
            // without an executable graph now; the driver is CUDA 12.9 or
            // later (`move_fn`). On success the parent owns `g`'s graph.
            let child =
                unsafe { add.add_moved_child(parent.handles.graph, deps, g.handles.graph) }?;
            g.handles.graph = ptr::null_mut();
            Ok(child)
        }
    }
}
