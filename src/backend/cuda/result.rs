//! The driver's entry points, one checked wrapper each, as cudarc's
//! `driver/result.rs` does: every raw `sys::cu*` call of the crate is here.
//!
//! Each wrapper makes one call, turns its out pointers into a return value
//! and its `CUresult` into a [`DriverError`] that keeps the raw code and
//! names the call (this crate formats the code itself: formatting cudarc's
//! `DriverError` calls into `libcuda`). A wrapper is `unsafe` where the
//! caller must uphold something, said in its `# Safety` section: mostly
//! that the handles it passes are live objects of the context current on
//! this thread.
//!
//! Two entry points are looked up in the driver by name at run time
//! ([`AddNodeV2`], [`NodeGetDependencies`]): cudarc binds them differently,
//! or not at all, across the CUDA versions it has bindings for, and the
//! crate builds against every one of them.

use std::ffi::{c_char, c_int, c_void};
use std::ptr;
use std::sync::OnceLock;

use super::library::open_library;
use super::sys;
use crate::backend::BackendError;

/// A driver call that did not return `CUDA_SUCCESS`: the call and the raw
/// code it returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct DriverError {
    /// The entry point, as errors name it (`cuGraphLaunch`).
    pub(super) call: &'static str,
    /// What it returned.
    pub(super) code: sys::CUresult,
}

impl From<DriverError> for BackendError {
    fn from(e: DriverError) -> BackendError {
        BackendError::Driver {
            call: e.call,
            code: e.code,
        }
    }
}

impl DriverError {
    /// The same code as cudarc's error, for what takes cudarc's
    /// (`CudaContext::record_err`); cudarc's error is never formatted here.
    pub(super) fn to_cudarc(self) -> cudarc::driver::DriverError {
        cudarc::driver::DriverError(self.code)
    }
}

/// What a wrapper returns.
pub(super) type DriverResult<T> = std::result::Result<T, DriverError>;

/// `Ok(value)` on `CUDA_SUCCESS`, else the call's [`DriverError`].
fn check<T>(op: &'static str, code: sys::CUresult, value: T) -> DriverResult<T> {
    match code {
        sys::CUresult::CUDA_SUCCESS => Ok(value),
        code => Err(DriverError { call: op, code }),
    }
}

/// `cuInit(0)`.
pub(super) fn init() -> DriverResult<()> {
    // SAFETY: no argument but the flags, which must be 0.
    check("cuInit", unsafe { sys::cuInit(0) }, ())
}

/// `cuDriverGetVersion`: `1000 * major + 10 * minor`.
pub(super) fn driver_version() -> DriverResult<c_int> {
    let mut version: c_int = 0;
    // SAFETY: a local out pointer.
    let code = unsafe { sys::cuDriverGetVersion(&mut version) };
    check("cuDriverGetVersion", code, version)
}

/// Devices, contexts and device-wide memory.
pub(super) mod device {
    use super::*;

    /// `cuCtxPushCurrent_v2`: `ctx` current on this thread until the
    /// matching [`pop_current`].
    ///
    /// # Safety
    ///
    /// `ctx` is a live context, popped once by the caller.
    pub(in super::super) unsafe fn push_current(ctx: sys::CUcontext) -> DriverResult<()> {
        // SAFETY: the caller's.
        check(
            "cuCtxPushCurrent",
            unsafe { sys::cuCtxPushCurrent_v2(ctx) },
            (),
        )
    }

    /// `cuCtxPopCurrent_v2`: the context [`push_current`] made current
    /// goes, and the one before it is current again.
    ///
    /// # Safety
    ///
    /// After a [`push_current`] of this thread, once.
    pub(in super::super) unsafe fn pop_current() -> DriverResult<()> {
        let mut popped: sys::CUcontext = ptr::null_mut();
        // SAFETY: the caller's; `popped` is a local out pointer.
        check(
            "cuCtxPopCurrent",
            unsafe { sys::cuCtxPopCurrent_v2(&mut popped) },
            (),
        )
    }

    /// `cuDeviceGetCount`.
    pub(in super::super) fn count() -> DriverResult<c_int> {
        let mut count: c_int = 0;
        // SAFETY: a local out pointer.
        let code = unsafe { sys::cuDeviceGetCount(&mut count) };
        check("cuDeviceGetCount", code, count)
    }

    /// `cuDeviceGet`.
    pub(in super::super) fn get(ordinal: c_int) -> DriverResult<sys::CUdevice> {
        let mut device: sys::CUdevice = 0;
        // SAFETY: a local out pointer; the driver checks the ordinal.
        let code = unsafe { sys::cuDeviceGet(&mut device, ordinal) };
        check("cuDeviceGet", code, device)
    }

    /// `cuDeviceGetName`.
    pub(in super::super) fn name(device: sys::CUdevice) -> DriverResult<String> {
        let mut name = [0 as c_char; 256];
        // SAFETY: `name` has room for the length passed; the driver checks
        // the device.
        let code = unsafe { sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as c_int, device) };
        check("cuDeviceGetName", code, ())?;
        let bytes: Vec<u8> = name
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// `cuDeviceGetAttribute`.
    pub(in super::super) fn attribute(
        device: sys::CUdevice,
        attribute: sys::CUdevice_attribute,
    ) -> DriverResult<c_int> {
        let mut value: c_int = 0;
        // SAFETY: a local out pointer; the driver checks the device.
        let code = unsafe { sys::cuDeviceGetAttribute(&mut value, attribute, device) };
        check("cuDeviceGetAttribute", code, value)
    }

    /// `cuDeviceTotalMem_v2`.
    pub(in super::super) fn total_memory(device: sys::CUdevice) -> DriverResult<usize> {
        let mut total: usize = 0;
        // SAFETY: a local out pointer; the driver checks the device.
        let code = unsafe { sys::cuDeviceTotalMem_v2(&mut total, device) };
        check("cuDeviceTotalMem", code, total)
    }

    /// `cuMemGetInfo_v2`: (free, total) bytes of the current context's
    /// device.
    pub(in super::super) fn memory_info() -> DriverResult<(usize, usize)> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: local out pointers; without a current context the driver
        // returns an error.
        let code = unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) };
        check("cuMemGetInfo", code, (free, total))
    }

    /// `cuDeviceGetGraphMemAttribute` of a 64-bit attribute.
    pub(in super::super) fn graph_mem_attribute(
        device: sys::CUdevice,
        attribute: sys::CUgraphMem_attribute,
    ) -> DriverResult<u64> {
        let mut value: u64 = 0;
        // SAFETY: the attributes read here are 64-bit integers, written into
        // a local; the driver checks the device.
        let code = unsafe {
            sys::cuDeviceGetGraphMemAttribute(device, attribute, (&mut value as *mut u64).cast())
        };
        check("cuDeviceGetGraphMemAttribute", code, value)
    }

    /// `cuDeviceGraphMemTrim`: the driver frees only memory no graph uses.
    pub(in super::super) fn graph_mem_trim(device: sys::CUdevice) -> DriverResult<()> {
        // SAFETY: the driver checks the device and keeps what graphs use.
        check(
            "cuDeviceGraphMemTrim",
            unsafe { sys::cuDeviceGraphMemTrim(device) },
            (),
        )
    }
}

/// Streams: waits, captures, synchronization.
pub(super) mod stream {
    use super::*;

    /// `cuStreamWaitEvent(stream, event, 0)`.
    ///
    /// # Safety
    ///
    /// `stream` and `event` are live objects of the current context.
    pub(in super::super) unsafe fn wait_event(
        stream: sys::CUstream,
        event: sys::CUevent,
    ) -> DriverResult<()> {
        // SAFETY: the caller's.
        let code = unsafe { sys::cuStreamWaitEvent(stream, event, 0) };
        check("cuStreamWaitEvent", code, ())
    }

    /// `cuStreamSynchronize`.
    ///
    /// # Safety
    ///
    /// `stream` is a live stream of the current context.
    pub(in super::super) unsafe fn synchronize(stream: sys::CUstream) -> DriverResult<()> {
        // SAFETY: the caller's.
        check(
            "cuStreamSynchronize",
            unsafe { sys::cuStreamSynchronize(stream) },
            (),
        )
    }

    /// `cuStreamBeginCapture_v2`.
    ///
    /// # Safety
    ///
    /// `stream` is a live, capturable (not the legacy NULL) stream of the
    /// current context.
    pub(in super::super) unsafe fn begin_capture(
        stream: sys::CUstream,
        mode: sys::CUstreamCaptureMode,
    ) -> DriverResult<()> {
        // SAFETY: the caller's.
        let code = unsafe { sys::cuStreamBeginCapture_v2(stream, mode) };
        check("cuStreamBeginCapture", code, ())
    }

    /// `cuStreamEndCapture`: the captured graph, now the caller's (null when
    /// the capture produced none). A graph the driver hands back with an
    /// error is destroyed here.
    ///
    /// # Safety
    ///
    /// `stream` is a live stream of the current context.
    pub(in super::super) unsafe fn end_capture(
        stream: sys::CUstream,
    ) -> DriverResult<sys::CUgraph> {
        let mut graph: sys::CUgraph = ptr::null_mut();
        // SAFETY: the caller's; `graph` is a local out pointer.
        let code = unsafe { sys::cuStreamEndCapture(stream, &mut graph) };
        if code != sys::CUresult::CUDA_SUCCESS && !graph.is_null() {
            // SAFETY: the graph was returned to us and is destroyed once.
            let _ = unsafe { super::graph::destroy(graph) };
        }
        check("cuStreamEndCapture", code, graph)
    }

    /// `cuStreamIsCapturing`.
    ///
    /// # Safety
    ///
    /// `stream` is a live stream (or the per-thread default stream).
    pub(in super::super) unsafe fn capture_status(
        stream: sys::CUstream,
    ) -> DriverResult<sys::CUstreamCaptureStatus> {
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: the caller's; `status` is a local out pointer.
        let code = unsafe { sys::cuStreamIsCapturing(stream, &mut status) };
        check("cuStreamIsCapturing", code, status)
    }

    /// `cuStreamGetPriority`: lower numbers are higher priorities.
    ///
    /// # Safety
    ///
    /// `stream` is a live stream of the current context.
    pub(in super::super) unsafe fn priority(stream: sys::CUstream) -> DriverResult<c_int> {
        let mut priority: c_int = 0;
        // SAFETY: the caller's; `priority` is a local out pointer.
        let code = unsafe { sys::cuStreamGetPriority(stream, &mut priority) };
        check("cuStreamGetPriority", code, priority)
    }

    /// `cuCtxGetStreamPriorityRange` of the current context: (least,
    /// greatest); the greatest priority is the lowest number.
    pub(in super::super) fn priority_range() -> DriverResult<(c_int, c_int)> {
        let (mut least, mut greatest): (c_int, c_int) = (0, 0);
        // SAFETY: two local out pointers.
        let code = unsafe { sys::cuCtxGetStreamPriorityRange(&mut least, &mut greatest) };
        check("cuCtxGetStreamPriorityRange", code, (least, greatest))
    }
}

/// Events.
pub(super) mod event {
    use super::*;

    /// `cuEventRecord`.
    ///
    /// # Safety
    ///
    /// `event` and `stream` are live objects of the current context.
    pub(in super::super) unsafe fn record(
        event: sys::CUevent,
        stream: sys::CUstream,
    ) -> DriverResult<()> {
        // SAFETY: the caller's.
        check(
            "cuEventRecord",
            unsafe { sys::cuEventRecord(event, stream) },
            (),
        )
    }

    /// `cuEventRecordWithFlags(.., CU_EVENT_RECORD_EXTERNAL)`: on a
    /// capturing stream, an event record node of the graph.
    ///
    /// # Safety
    ///
    /// `event` and `stream` are live objects of the current context.
    pub(in super::super) unsafe fn record_external(
        event: sys::CUevent,
        stream: sys::CUstream,
    ) -> DriverResult<()> {
        let flags = sys::CUevent_record_flags::CU_EVENT_RECORD_EXTERNAL as u32;
        // SAFETY: the caller's.
        let code = unsafe { sys::cuEventRecordWithFlags(event, stream, flags) };
        check("cuEventRecordWithFlags", code, ())
    }

    /// `cuEventSynchronize`.
    ///
    /// # Safety
    ///
    /// `event` is a live event of the current context.
    pub(in super::super) unsafe fn synchronize(event: sys::CUevent) -> DriverResult<()> {
        // SAFETY: the caller's.
        check(
            "cuEventSynchronize",
            unsafe { sys::cuEventSynchronize(event) },
            (),
        )
    }
}

/// Device memory.
pub(super) mod mem {
    use super::*;

    /// `cuMemAllocAsync` from the device's default pool, ordered on
    /// `stream`.
    ///
    /// # Safety
    ///
    /// `stream` is a live stream of the current context.
    pub(in super::super) unsafe fn alloc_async(
        bytes: usize,
        stream: sys::CUstream,
    ) -> DriverResult<sys::CUdeviceptr> {
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: the caller's; `ptr` is a local out pointer.
        let code = unsafe { sys::cuMemAllocAsync(&mut ptr, bytes, stream) };
        check("cuMemAllocAsync", code, ptr)
    }

    /// `cuMemAlloc_v2`.
    pub(in super::super) fn alloc(bytes: usize) -> DriverResult<sys::CUdeviceptr> {
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: a local out pointer; without a current context the driver
        // returns an error.
        let code = unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes) };
        check("cuMemAlloc", code, ptr)
    }

    /// `cuMemFreeAsync`, ordered on `stream`.
    ///
    /// # Safety
    ///
    /// `ptr` came from [`alloc_async`] in the current context and is freed
    /// once, after every use of it; `stream` is a live stream of the
    /// context.
    pub(in super::super) unsafe fn free_async(
        ptr: sys::CUdeviceptr,
        stream: sys::CUstream,
    ) -> DriverResult<()> {
        // SAFETY: the caller's.
        check(
            "cuMemFreeAsync",
            unsafe { sys::cuMemFreeAsync(ptr, stream) },
            (),
        )
    }

    /// `cuMemFree_v2`.
    ///
    /// # Safety
    ///
    /// `ptr` came from [`alloc`] in the current context and is freed once,
    /// after every use of it.
    pub(in super::super) unsafe fn free(ptr: sys::CUdeviceptr) -> DriverResult<()> {
        // SAFETY: the caller's.
        check("cuMemFree_v2", unsafe { sys::cuMemFree_v2(ptr) }, ())
    }

    /// `cuMemsetD8Async`: `bytes` bytes from `ptr` set to `value` on
    /// `stream`.
    ///
    /// # Safety
    ///
    /// `ptr..ptr + bytes` is device memory of the current context that no
    /// other work uses meanwhile; `stream` is a live stream of the context.
    pub(in super::super) unsafe fn set_d8_async(
        ptr: sys::CUdeviceptr,
        value: u8,
        bytes: usize,
        stream: sys::CUstream,
    ) -> DriverResult<()> {
        // SAFETY: the caller's.
        let code = unsafe { sys::cuMemsetD8Async(ptr, value, bytes, stream) };
        check("cuMemsetD8Async", code, ())
    }
}

/// Graphs, their nodes and executable graphs.
pub(super) mod graph {
    use super::*;

    /// `cuGraphCreate(.., 0)`: an empty graph, the caller's.
    pub(in super::super) fn create() -> DriverResult<sys::CUgraph> {
        let mut graph: sys::CUgraph = ptr::null_mut();
        // SAFETY: a local out pointer; without a current context the driver
        // returns an error.
        let code = unsafe { sys::cuGraphCreate(&mut graph, 0) };
        check("cuGraphCreate", code, graph)
    }

    /// `cuGraphClone`: a copy of `graph`, the caller's.
    ///
    /// # Safety
    ///
    /// `graph` is a live graph of the current context.
    pub(in super::super) unsafe fn clone(graph: sys::CUgraph) -> DriverResult<sys::CUgraph> {
        let mut clone: sys::CUgraph = ptr::null_mut();
        // SAFETY: the caller's; `clone` is a local out pointer.
        let code = unsafe { sys::cuGraphClone(&mut clone, graph) };
        check("cuGraphClone", code, clone)
    }

    /// `cuGraphDestroy`.
    ///
    /// # Safety
    ///
    /// `graph` is a live graph the caller owns, destroyed once; nothing
    /// uses it afterwards (its executable graphs are separate objects).
    pub(in super::super) unsafe fn destroy(graph: sys::CUgraph) -> DriverResult<()> {
        // SAFETY: the caller's.
        check("cuGraphDestroy", unsafe { sys::cuGraphDestroy(graph) }, ())
    }

    /// `cuGraphInstantiateWithFlags`: the executable graph, the caller's.
    ///
    /// # Safety
    ///
    /// `graph` is a live graph of the current context.
    pub(in super::super) unsafe fn instantiate(
        graph: sys::CUgraph,
        flags: u64,
    ) -> DriverResult<sys::CUgraphExec> {
        let mut exec: sys::CUgraphExec = ptr::null_mut();
        // SAFETY: the caller's; `exec` is a local out pointer.
        let code = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, flags as _) };
        check("cuGraphInstantiate", code, exec)
    }

    /// `cuGraphUpload`.
    ///
    /// # Safety
    ///
    /// `exec` and `stream` are live objects of the current context.
    pub(in super::super) unsafe fn upload(
        exec: sys::CUgraphExec,
        stream: sys::CUstream,
    ) -> DriverResult<()> {
        // SAFETY: the caller's.
        check(
            "cuGraphUpload",
            unsafe { sys::cuGraphUpload(exec, stream) },
            (),
        )
    }

    /// `cuGraphLaunch`.
    ///
    /// # Safety
    ///
    /// `exec` and `stream` are live objects of the current context, and
    /// the launch is ordered after every use of the memory its graph
    /// touches (the fence's job).
    pub(in super::super) unsafe fn launch(
        exec: sys::CUgraphExec,
        stream: sys::CUstream,
    ) -> DriverResult<()> {
        // SAFETY: the caller's.
        check(
            "cuGraphLaunch",
            unsafe { sys::cuGraphLaunch(exec, stream) },
            (),
        )
    }

    /// `cuGraphExecDestroy`.
    ///
    /// # Safety
    ///
    /// `exec` is a live executable graph the caller owns, destroyed once,
    /// with no launch of it left to enqueue.
    pub(in super::super) unsafe fn exec_destroy(exec: sys::CUgraphExec) -> DriverResult<()> {
        // SAFETY: the caller's.
        check(
            "cuGraphExecDestroy",
            unsafe { sys::cuGraphExecDestroy(exec) },
            (),
        )
    }

    /// `cuGraphGetNodes`, both calls: the count, then the nodes.
    ///
    /// # Safety
    ///
    /// `graph` is a live graph of the current context.
    pub(in super::super) unsafe fn nodes(
        graph: sys::CUgraph,
    ) -> DriverResult<Vec<sys::CUgraphNode>> {
        let mut n = 0usize;
        // SAFETY: the caller's; with a null array only the count is written.
        let code = unsafe { sys::cuGraphGetNodes(graph, ptr::null_mut(), &mut n) };
        check("cuGraphGetNodes", code, ())?;
        let mut nodes = vec![ptr::null_mut(); n];
        if n > 0 {
            // SAFETY: `nodes` has room for `n`.
            let code = unsafe { sys::cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut n) };
            check("cuGraphGetNodes", code, ())?;
            nodes.truncate(n);
        }
        Ok(nodes)
    }

    /// `cuGraphNodeGetType`, as a plain integer: a newer driver may report
    /// a node type cudarc's enum does not list.
    ///
    /// # Safety
    ///
    /// `node` is a node of a live graph of the current context.
    pub(in super::super) unsafe fn node_type(node: sys::CUgraphNode) -> DriverResult<u32> {
        let mut kind: u32 = u32::MAX;
        // SAFETY: the caller's; the node type is a 32-bit C enum written
        // into a `u32`.
        let code = unsafe { sys::cuGraphNodeGetType(node, (&mut kind as *mut u32).cast()) };
        check("cuGraphNodeGetType", code, kind)
    }

    /// `cuGraphMemAllocNodeGetParams`: (address, bytes).
    ///
    /// # Safety
    ///
    /// `node` is a memory allocation node of a live graph of the current
    /// context.
    pub(in super::super) unsafe fn mem_alloc_node_params(
        node: sys::CUgraphNode,
    ) -> DriverResult<(u64, u64)> {
        // SAFETY: a plain C struct of integers and pointers, for the driver
        // to fill.
        let mut params: sys::CUDA_MEM_ALLOC_NODE_PARAMS = unsafe { std::mem::zeroed() };
        // SAFETY: the caller's; `params` is a local out pointer.
        let code = unsafe { sys::cuGraphMemAllocNodeGetParams(node, &mut params) };
        check(
            "cuGraphMemAllocNodeGetParams",
            code,
            (params.dptr, params.bytesize as u64),
        )
    }

    /// `cuGraphMemFreeNodeGetParams`: the address freed.
    ///
    /// # Safety
    ///
    /// `node` is a memory free node of a live graph of the current context.
    pub(in super::super) unsafe fn mem_free_node_params(
        node: sys::CUgraphNode,
    ) -> DriverResult<sys::CUdeviceptr> {
        let mut dptr: sys::CUdeviceptr = 0;
        // SAFETY: the caller's; `dptr` is a local out pointer.
        let code = unsafe { sys::cuGraphMemFreeNodeGetParams(node, &mut dptr) };
        check("cuGraphMemFreeNodeGetParams", code, dptr)
    }

    /// `cuGraphKernelNodeGetAttribute(CU_LAUNCH_ATTRIBUTE_PRIORITY)`: the
    /// priority a kernel node runs at under
    /// `CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY`.
    ///
    /// # Safety
    ///
    /// `node` is a kernel node of a live graph of the current context.
    pub(in super::super) unsafe fn kernel_priority(node: sys::CUgraphNode) -> DriverResult<c_int> {
        // SAFETY: a plain C union of integers and structs, for the driver
        // to fill.
        let mut value: sys::CUkernelNodeAttrValue = unsafe { std::mem::zeroed() };
        let attr = sys::CUkernelNodeAttrID::CU_LAUNCH_ATTRIBUTE_PRIORITY;
        // SAFETY: the caller's; `value` is a local out pointer.
        let code = unsafe { sys::cuGraphKernelNodeGetAttribute(node, attr, &mut value) };
        // SAFETY: the priority member is the one this attribute writes.
        check("cuGraphKernelNodeGetAttribute", code, unsafe {
            value.priority
        })
    }

    /// `cuGraphKernelNodeSetAttribute(CU_LAUNCH_ATTRIBUTE_PRIORITY)`.
    ///
    /// # Safety
    ///
    /// `node` is a kernel node of a live graph of the current context that
    /// no executable is being instantiated from meanwhile.
    pub(in super::super) unsafe fn set_kernel_priority(
        node: sys::CUgraphNode,
        priority: c_int,
    ) -> DriverResult<()> {
        // SAFETY: as above.
        let mut value: sys::CUkernelNodeAttrValue = unsafe { std::mem::zeroed() };
        value.priority = priority;
        let attr = sys::CUkernelNodeAttrID::CU_LAUNCH_ATTRIBUTE_PRIORITY;
        // SAFETY: the caller's; `value` is a local.
        let code = unsafe { sys::cuGraphKernelNodeSetAttribute(node, attr, &value) };
        check("cuGraphKernelNodeSetAttribute", code, ())
    }

    /// `cuGraphChildGraphNodeGetGraph`: the child graph, still owned by
    /// the node.
    ///
    /// # Safety
    ///
    /// `node` is a child graph node of a live graph of the current context.
    pub(in super::super) unsafe fn child_graph(
        node: sys::CUgraphNode,
    ) -> DriverResult<sys::CUgraph> {
        let mut graph: sys::CUgraph = ptr::null_mut();
        // SAFETY: the caller's; `graph` is a local out pointer.
        let code = unsafe { sys::cuGraphChildGraphNodeGetGraph(node, &mut graph) };
        check("cuGraphChildGraphNodeGetGraph", code, graph)
    }

    /// `cuGraphEventRecordNodeGetEvent`.
    ///
    /// # Safety
    ///
    /// `node` is an event record node of a live graph of the current
    /// context.
    pub(in super::super) unsafe fn record_node_event(
        node: sys::CUgraphNode,
    ) -> DriverResult<sys::CUevent> {
        let mut event: sys::CUevent = ptr::null_mut();
        // SAFETY: the caller's; `event` is a local out pointer.
        let code = unsafe { sys::cuGraphEventRecordNodeGetEvent(node, &mut event) };
        check("cuGraphEventRecordNodeGetEvent", code, event)
    }

    /// `cuGraphNodeFindInClone`: `node`'s twin in `clone`.
    ///
    /// # Safety
    ///
    /// `node` is a node of the live graph of which `clone` is a live clone.
    pub(in super::super) unsafe fn find_in_clone(
        node: sys::CUgraphNode,
        clone: sys::CUgraph,
    ) -> DriverResult<sys::CUgraphNode> {
        let mut twin: sys::CUgraphNode = ptr::null_mut();
        // SAFETY: the caller's; `twin` is a local out pointer.
        let code = unsafe { sys::cuGraphNodeFindInClone(&mut twin, node, clone) };
        check("cuGraphNodeFindInClone", code, twin)
    }

    /// `cuGraphDestroyNode`.
    ///
    /// # Safety
    ///
    /// `node` is a node of a live graph the caller owns, destroyed once.
    pub(in super::super) unsafe fn destroy_node(node: sys::CUgraphNode) -> DriverResult<()> {
        // SAFETY: the caller's.
        check(
            "cuGraphDestroyNode",
            unsafe { sys::cuGraphDestroyNode(node) },
            (),
        )
    }

    /// `cuGraphAddEventWaitNode`: a node of `graph` after `deps` that waits
    /// for `event`.
    ///
    /// # Safety
    ///
    /// `graph` is a live graph of the current context, `deps` its nodes,
    /// and `event` a live event that outlives every executable graph made
    /// from `graph`.
    pub(in super::super) unsafe fn add_event_wait_node(
        graph: sys::CUgraph,
        deps: &[sys::CUgraphNode],
        event: sys::CUevent,
    ) -> DriverResult<sys::CUgraphNode> {
        let mut node: sys::CUgraphNode = ptr::null_mut();
        // SAFETY: the caller's; `node` is a local out pointer, `deps` a
        // live slice of its length.
        let code = unsafe {
            sys::cuGraphAddEventWaitNode(&mut node, graph, deps.as_ptr(), deps.len(), event)
        };
        check("cuGraphAddEventWaitNode", code, node)
    }

    /// `cuGraphAddEventRecordNode`: a node of `graph` after `deps` that
    /// records `event`.
    ///
    /// # Safety
    ///
    /// As [`add_event_wait_node`].
    pub(in super::super) unsafe fn add_event_record_node(
        graph: sys::CUgraph,
        deps: &[sys::CUgraphNode],
        event: sys::CUevent,
    ) -> DriverResult<sys::CUgraphNode> {
        let mut node: sys::CUgraphNode = ptr::null_mut();
        // SAFETY: as in `add_event_wait_node`.
        let code = unsafe {
            sys::cuGraphAddEventRecordNode(&mut node, graph, deps.as_ptr(), deps.len(), event)
        };
        check("cuGraphAddEventRecordNode", code, node)
    }

    /// `cuGraphExecEventRecordNodeSetEvent`: the record node `node` (of the
    /// graph `exec` was instantiated from) records `event` at `exec`'s next
    /// launches; launches already made are not affected.
    ///
    /// # Safety
    ///
    /// `exec`, `node` and `event` are live objects of the current context;
    /// `node` is an event record node of `exec`'s graph.
    pub(in super::super) unsafe fn exec_set_record_event(
        exec: sys::CUgraphExec,
        node: sys::CUgraphNode,
        event: sys::CUevent,
    ) -> DriverResult<()> {
        // SAFETY: the caller's.
        let code = unsafe { sys::cuGraphExecEventRecordNodeSetEvent(exec, node, event) };
        check("cuGraphExecEventRecordNodeSetEvent", code, ())
    }

    /// `cuGraphAddChildGraphNode`: a node of `graph` after `deps` that runs
    /// a clone of `child`.
    ///
    /// # Safety
    ///
    /// `graph` and `child` are live graphs of the current context and
    /// `deps` nodes of `graph`.
    pub(in super::super) unsafe fn add_child_graph_node(
        graph: sys::CUgraph,
        deps: &[sys::CUgraphNode],
        child: sys::CUgraph,
    ) -> DriverResult<sys::CUgraphNode> {
        let mut node: sys::CUgraphNode = ptr::null_mut();
        // SAFETY: the caller's; `node` is a local out pointer.
        let code = unsafe {
            sys::cuGraphAddChildGraphNode(&mut node, graph, deps.as_ptr(), deps.len(), child)
        };
        check("cuGraphAddChildGraphNode", code, node)
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

/// `cuGraphAddNode_v2`, looked up in the driver by name: cudarc binds the
/// moved-ownership field of its parameters only for CUDA 12.9 and later.
#[derive(Clone, Copy)]
pub(super) struct AddNodeV2(AddNodeFn);

impl AddNodeV2 {
    /// The entry point, when the driver exports it (CUDA 12.3 and later).
    pub(super) fn get() -> Option<AddNodeV2> {
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
        .map(|(_, f)| AddNodeV2(*f))
    }

    /// A child graph node of `parent` after `deps` that `child` is moved
    /// into (`CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE`): on success the parent
    /// owns `child`.
    ///
    /// # Safety
    ///
    /// `parent` and `child` are live graphs of the current context, `deps`
    /// nodes of `parent`; `child` has no executable graph, and the driver
    /// is CUDA 12.9 or later (the moved-ownership field).
    pub(super) unsafe fn add_moved_child(
        self,
        parent: sys::CUgraph,
        deps: &[sys::CUgraphNode],
        child: sys::CUgraph,
    ) -> DriverResult<sys::CUgraphNode> {
        let mut node: sys::CUgraphNode = ptr::null_mut();
        let mut params = ChildNodeParams::moved(child);
        // SAFETY: the caller's; `params` is laid out as `CUgraphNodeParams`
        // (checked below); no edge data is passed.
        let code = unsafe {
            (self.0)(
                &mut node,
                parent,
                deps.as_ptr(),
                ptr::null(),
                deps.len(),
                &mut params,
            )
        };
        check("cuGraphAddNode_v2 (moved child graph)", code, node)
    }
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
#[derive(Clone, Copy)]
pub(super) enum NodeGetDependencies {
    /// `cuGraphNodeGetDependencies_v2`.
    V2(
        unsafe extern "C" fn(
            sys::CUgraphNode,
            *mut sys::CUgraphNode,
            *mut c_void,
            *mut usize,
        ) -> sys::CUresult,
    ),
    /// `cuGraphNodeGetDependencies`.
    V1(unsafe extern "C" fn(sys::CUgraphNode, *mut sys::CUgraphNode, *mut usize) -> sys::CUresult),
}

impl NodeGetDependencies {
    /// The entry point the driver exports, `_v2` first.
    pub(super) fn get() -> Option<NodeGetDependencies> {
        static DEPS: OnceLock<Option<(libloading::Library, NodeGetDependencies)>> = OnceLock::new();
        DEPS.get_or_init(|| {
            let lib = open_library(&["cuda", "nvcuda"])?;
            // SAFETY: the symbols have the C signatures above (CUDA's
            // `cuda.h`); the library stays loaded with the pointer.
            let found = unsafe {
                lib.get(b"cuGraphNodeGetDependencies_v2")
                    .map(|f: libloading::Symbol<'_, _>| NodeGetDependencies::V2(*f))
                    .or_else(|_| {
                        lib.get(b"cuGraphNodeGetDependencies")
                            .map(|f: libloading::Symbol<'_, _>| NodeGetDependencies::V1(*f))
                    })
            }
            .ok()?;
            Some((lib, found))
        })
        .as_ref()
        .map(|(_, f)| *f)
    }

    /// The nodes `node` depends on (both calls: the count, then the nodes).
    ///
    /// # Safety
    ///
    /// `node` is a node of a live graph of the current context.
    pub(super) unsafe fn dependencies(
        self,
        node: sys::CUgraphNode,
    ) -> DriverResult<Vec<sys::CUgraphNode>> {
        let call = |out: *mut sys::CUgraphNode, n: &mut usize| match self {
            // SAFETY: the caller's node; `out` is null or has room for
            // `*n`; no edge data is asked for.
            NodeGetDependencies::V2(f) => unsafe { f(node, out, ptr::null_mut(), n) },
            // SAFETY: as above.
            NodeGetDependencies::V1(f) => unsafe { f(node, out, n) },
        };
        let mut n = 0usize;
        check(
            "cuGraphNodeGetDependencies",
            call(ptr::null_mut(), &mut n),
            (),
        )?;
        let mut deps = vec![ptr::null_mut(); n];
        if n > 0 {
            check(
                "cuGraphNodeGetDependencies",
                call(deps.as_mut_ptr(), &mut n),
                (),
            )?;
            deps.truncate(n);
        }
        Ok(deps)
    }
}
