//! Graphs and graph surgery: instantiation, adopting the program's graphs,
//! the memory nodes a plan checks, splitting a graph at an event record and
//! composing graphs into one.

use std::cell::Cell;
use std::ffi::c_void;
use std::fmt;
use std::marker::PhantomData;
use std::ptr;
use std::sync::{Arc, OnceLock};

use cudarc::driver::CudaContext;

use super::handles::{Device, Event};
use super::probe::open_library;
use super::{check, sys, Result};
use crate::backend::{BackendError, GraphMemory, NodeGraph, StepEnd, StepNode};

/// Raw graph handles; moved between threads only inside a [`Graph`].
pub(super) struct GraphHandles {
    pub(super) graph: sys::CUgraph,
    pub(super) exec: sys::CUgraphExec,
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
            // split graph has no executable graph; a graph moved into a
            // step graph has neither (the step graph owns it).
            unsafe {
                if !self.handles.exec.is_null() {
                    let _ = sys::cuGraphExecDestroy(self.handles.exec);
                }
                if !self.handles.graph.is_null() {
                    let _ = sys::cuGraphDestroy(self.handles.graph);
                }
            }
        }
    }
}

impl Device {
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
    pub(super) unsafe fn instantiate(
        &self,
        graph: sys::CUgraph,
        upload_on: Option<sys::CUstream>,
    ) -> Result<Graph> {
        let mut exec: sys::CUgraphExec = ptr::null_mut();
        let flags = self.instantiate_flags().bits();
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
    /// of what replaying costs in memory.
    /// [`Backend::graph_memory_in_use`](crate::Backend::graph_memory_in_use)
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
        // SAFETY: a device of this context; the driver frees only memory no
        // graph uses.
        check("cuDeviceGraphMemTrim", unsafe {
            sys::cuDeviceGraphMemTrim(self.inner.ctx.cu_device())
        })
    }

    /// Refuses a graph with memory nodes where it would be cloned (a split,
    /// a child graph node): the driver does not clone such graphs
    /// (`cuGraphClone` returns `CUDA_ERROR_NOT_SUPPORTED`).
    fn refuse_memory_nodes(&self, graph: &Graph) -> Result<()> {
        let (mut allocs, mut frees) = (Vec::new(), Vec::new());
        self.memory_nodes(graph.handles.graph, 0, &mut allocs, &mut frees)?;
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
    pub(super) fn memory_nodes(
        &self,
        graph: sys::CUgraph,
        depth: usize,
        allocs: &mut Vec<(u64, u64)>,
        frees: &mut Vec<u64>,
    ) -> std::result::Result<(), BackendError> {
        if depth > 64 {
            return Err(BackendError::Refused {
                op: "graph inspection",
                reason: "child graphs nest more than 64 deep".into(),
            });
        }
        let inspect = |op: &'static str, code: sys::CUresult| match code {
            sys::CUresult::CUDA_SUCCESS => Ok(()),
            code => Err(BackendError::Driver { op, code }),
        };
        // An empty graph (a runner whose capture enqueued nothing) has none.
        let nodes = nodes_of(graph)?;
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

    /// [`Compose::split_graph`](crate::Compose::split_graph): clones the
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

    /// [`Compose::compose`](crate::Compose::compose): a graph of child graph
    /// nodes, instantiated with this backend's flags. A copied node's graph
    /// is cloned in (`cuGraphAddChildGraphNode`); a moved one's is moved in
    /// (`cuGraphAddNode_v2` with `CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE`, CUDA
    /// 12.9 and later: the only way a graph with memory nodes goes into
    /// another), its own executable graph destroyed first, since a graph
    /// with memory nodes may have only one at a time.
    pub(super) fn compose_children(
        &self,
        nodes: Vec<StepNode<'_, Device>>,
        end: Option<StepEnd<'_, Device>>,
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
        let mut parent: sys::CUgraph = ptr::null_mut();
        // SAFETY: a local out pointer.
        check("cuGraphCreate", unsafe {
            sys::cuGraphCreate(&mut parent, 0)
        })?;
        // Destroys the parent (and the graphs moved into it) on failure.
        let parent = Graph {
            handles: GraphHandles {
                graph: parent,
                exec: ptr::null_mut(),
            },
            ctx: self.inner.ctx.clone(),
            _not_sync: PhantomData,
        };
        // An event wait or record node of `parent` after `deps`.
        let event_node = |wait: bool, deps: &[sys::CUgraphNode], event: &Event| {
            let mut n: sys::CUgraphNode = ptr::null_mut();
            // SAFETY: `parent` is live, `deps` are its nodes, the event is
            // live for the borrow and is not destroyed before the graphs
            // (the step graph owns both, graphs first).
            let code = unsafe {
                if wait {
                    sys::cuGraphAddEventWaitNode(
                        &mut n,
                        parent.handles.graph,
                        deps.as_ptr(),
                        deps.len(),
                        event.cu_event(),
                    )
                } else {
                    sys::cuGraphAddEventRecordNode(
                        &mut n,
                        parent.handles.graph,
                        deps.as_ptr(),
                        deps.len(),
                        event.cu_event(),
                    )
                }
            };
            let op = if wait {
                "cuGraphAddEventWaitNode"
            } else {
                "cuGraphAddEventRecordNode"
            };
            check(op, code).map(|()| n)
        };
        let mut added: Vec<sys::CUgraphNode> = Vec::with_capacity(nodes.len());
        for node in nodes {
            let deps = node
                .deps
                .iter()
                .map(|&d| added.get(d).copied())
                .collect::<Option<Vec<_>>>();
            let Some(mut deps) = deps else {
                return Err(BackendError::Refused {
                    op: "cuGraphAddChildGraphNode",
                    reason: "a node depends on a node that is not before it".into(),
                });
            };
            for event in &node.waits {
                deps.push(event_node(true, &[], event)?);
            }
            let mut child: sys::CUgraphNode = ptr::null_mut();
            match node.graph {
                NodeGraph::Copy(g) => {
                    // SAFETY: `parent` and the node's graph are live graphs
                    // of this context; the child graph is cloned in.
                    check("cuGraphAddChildGraphNode", unsafe {
                        sys::cuGraphAddChildGraphNode(
                            &mut child,
                            parent.handles.graph,
                            deps.as_ptr(),
                            deps.len(),
                            g.handles.graph,
                        )
                    })?;
                }
                NodeGraph::Move(mut g) => {
                    let add = add_moved.ok_or_else(|| BackendError::Refused {
                        op: "cuGraphAddNode_v2",
                        reason: "no entry point for moved child graphs".into(),
                    })?;
                    if !g.handles.exec.is_null() {
                        // SAFETY: the graph's own executable graph, never
                        // launched by the plan (a step copy), destroyed once.
                        let _ = unsafe { sys::cuGraphExecDestroy(g.handles.exec) };
                        g.handles.exec = ptr::null_mut();
                    }
                    let mut params = ChildNodeParams::moved(g.handles.graph);
                    // SAFETY: `parent` and `g` are live graphs of this
                    // context; `params` is laid out as `CUgraphNodeParams`
                    // (checked below); no edge data is passed. On success
                    // the parent owns `g`'s graph.
                    check("cuGraphAddNode_v2 (moved child graph)", unsafe {
                        add(
                            &mut child,
                            parent.handles.graph,
                            deps.as_ptr(),
                            ptr::null(),
                            deps.len(),
                            &mut params,
                        )
                    })?;
                    g.handles.graph = ptr::null_mut();
                }
            }
            for event in &node.records {
                event_node(false, &[child], event)?;
            }
            added.push(child);
        }
        if let Some(end) = end {
            // After every node (the record), and a root the graph's
            // completion waits for (the other launch's end).
            event_node(false, &added, end.record)?;
            event_node(true, &[], end.wait)?;
        }
        let mut parent = parent;
        let raw = std::mem::replace(&mut parent.handles.graph, ptr::null_mut());
        drop(parent);
        // SAFETY: `raw` is ours; `instantiate` destroys it on failure.
        unsafe { self.instantiate(raw, None) }
    }

    /// `cuGraphAddNode_v2`, looked up in the driver by name (cudarc binds
    /// the moved-ownership field only for CUDA 12.9 and later), on a
    /// driver of CUDA 12.9 or later.
    fn move_fn(&self) -> Result<AddNodeFn> {
        let mut version: std::ffi::c_int = 0;
        // SAFETY: a local out pointer.
        check("cuDriverGetVersion", unsafe {
            sys::cuDriverGetVersion(&mut version)
        })?;
        if version < 12090 {
            return Err(BackendError::Refused {
                op: "step graph",
                reason: format!(
                    "a graph with temporaries (memory nodes) goes into a step graph only moved, \
                     which needs a CUDA 12.9 or later driver; this driver is CUDA {}.{}: replay \
                     this runner per runner",
                    version / 1000,
                    version % 1000 / 10
                ),
            });
        }
        add_node_fn().ok_or_else(|| BackendError::Refused {
            op: "step graph",
            reason: "the driver exports no cuGraphAddNode_v2, which moves a graph with \
                     temporaries into a step graph"
                .into(),
        })
    }
}

/// `cuGraphAddNode_v2`'s C signature.
type AddNodeFn = unsafe extern "C" fn(
    *mut sys::CUgraphNode,
    sys::CUgraph,
    *const sys::CUgraphNode,
    *const c_void,
    usize,
    *mut ChildNodeParams,
) -> sys::CUresult;

fn add_node_fn() -> Option<AddNodeFn> {
    static ADD: OnceLock<Option<(libloading::Library, AddNodeFn)>> = OnceLock::new();
    ADD.get_or_init(|| {
        let lib = open_library(&["cuda", "nvcuda"])?;
        // SAFETY: the symbol has the C signature above (CUDA's `cuda.h`,
        // 12.3 and later); the library stays loaded with the pointer.
        let f = unsafe {
            lib.get(b"cuGraphAddNode_v2")
                .map(|f: libloading::Symbol<'_, AddNodeFn>| *f)
        }
        .ok()?;
        Some((lib, f))
    })
    .as_ref()
    .map(|(_, f)| *f)
}

/// `CUgraphNodeParams` for a child graph node (`cuda.h`, 12.9 and later:
/// type, three reserved ints, a 232-byte union whose `graph` member is
/// `CUDA_CHILD_GRAPH_NODE_PARAMS { CUgraph graph; ownership }`, and a
/// reserved `long long`), spelled out here so the crate builds with any
/// CUDA version of cudarc's bindings.
#[repr(C)]
struct ChildNodeParams {
    kind: std::ffi::c_int,
    reserved0: [std::ffi::c_int; 3],
    body: ChildNodeBody,
    reserved2: std::ffi::c_longlong,
}

#[repr(C)]
union ChildNodeBody {
    reserved1: [std::ffi::c_longlong; 29],
    graph: ChildGraphParams,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct ChildGraphParams {
    graph: sys::CUgraph,
    ownership: std::ffi::c_int,
}

static_assertions::assert_eq_size!(ChildNodeParams, [u8; 256]);

impl ChildNodeParams {
    /// `CU_GRAPH_NODE_TYPE_GRAPH` moving `graph` in
    /// (`CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE`).
    fn moved(graph: sys::CUgraph) -> ChildNodeParams {
        const GRAPH_NODE: std::ffi::c_int = 4;
        const OWNERSHIP_MOVE: std::ffi::c_int = 1;
        let mut body = ChildNodeBody { reserved1: [0; 29] };
        body.graph = ChildGraphParams {
            graph,
            ownership: OWNERSHIP_MOVE,
        };
        ChildNodeParams {
            kind: GRAPH_NODE,
            reserved0: [0; 3],
            body,
            reserved2: 0,
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
