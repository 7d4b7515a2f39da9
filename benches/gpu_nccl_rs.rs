//! A captured symmetric reduce-scatter on persistent views (an NCCL window
//! registered with `NCCL_WIN_COLL_SYMMETRIC`) against the same captured
//! reduce-scatter on unregistered `cuMemAlloc` memory, for 1, 2, 8, 32 and
//! 128 MiB of send buffer per rank, one thread per GPU. Needs 2+ GPUs; prints
//! why it skipped otherwise. Run with NCCL_NVLS_ENABLE=0 (multicast off).

use std::ffi::c_void;
use std::sync::{Arc, Barrier};
use std::time::Instant;

use replay_arena::backend::{Capture, Launch, Streams};
use replay_arena::cuda;
use replay_arena::cuda::cudarc::driver::{result as cu, sys};
use replay_arena::cuda::cudarc::nccl::sys as nc;
use replay_arena::cuda::probe;
use replay_arena::nccl::{self, Communicator, UniqueId};
use replay_arena::{DType, Discovering, Domain, GroupId, PlanConfig, Policy, Request, RunnerId};

type R<T> = Result<T, String>;
const GTP: GroupId = GroupId(0);
const SIZES_MIB: [u64; 5] = [1, 2, 8, 32, 128];
const REPLAYS: usize = 50;

fn e(x: impl std::fmt::Debug) -> String {
    format!("{x:?}")
}

/// Median over 3 runs of `REPLAYS` launches of `graph`, microseconds each.
fn time_graph(
    b: &cuda::Device,
    s: &cuda::Stream,
    graph: &replay_arena::cuda::Graph,
    barrier: &Barrier,
) -> R<f64> {
    // SAFETY (both loops): the graph is this bench's own reduce-scatter on
    // its own buffers, launched on one stream, one launch after another.
    for _ in 0..5 {
        unsafe { b.launch(graph, s) }.map_err(e)?;
    }
    s.synchronize().map_err(e)?;
    let mut t = Vec::new();
    for _ in 0..3 {
        barrier.wait();
        let start = Instant::now();
        for _ in 0..REPLAYS {
            unsafe { b.launch(graph, s) }.map_err(e)?;
        }
        s.synchronize().map_err(e)?;
        t.push(start.elapsed().as_secs_f64() * 1e6 / REPLAYS as f64);
    }
    t.sort_by(f64::total_cmp);
    Ok(t[1])
}

fn rank_main(
    rank: usize,
    ranks: usize,
    id: UniqueId,
    barrier: Arc<Barrier>,
) -> R<Vec<(u64, f64, f64)>> {
    let cuda = cuda::Device::new(rank).map_err(e)?;
    let comm = Communicator::new(&cuda, GTP, &id, rank, ranks).map_err(e)?;
    let s = cuda.new_stream().map_err(e)?;
    let mut rows = Vec::new();
    for mib in SIZES_MIB {
        let elems = mib * (1 << 20) / 4; // f32 send elements per rank
        let recv = elems / ranks as u64;
        // Symmetric: a one-runner plan whose graph reduce-scatters its view.
        let mut d = Discovering::new(PlanConfig::new().with_group(GTP, "gtp").map_err(e)?);
        {
            let mut a = d.arm(RunnerId(0)).map_err(e)?;
            a.record(Request::new(Domain::Symmetric(GTP), DType::F32, elems))
                .map_err(e)?;
            a.record(Request::new(Domain::Device, DType::F32, recv))
                .map_err(e)?;
        }
        let planned = d.plan(Policy::Generations(1)).map_err(e)?;
        comm.check_fingerprint(planned.fingerprint()).map_err(e)?;
        let backend = nccl::Device::new(cuda.clone())
            .with_group(comm.clone())
            .map_err(e)?;
        let mut capturing = planned.allocate(backend).map_err(e)?;
        {
            let cap = capturing.capture(RunnerId(0)).map_err(e)?;
            let send = cap
                .take(Request::new(Domain::Symmetric(GTP), DType::F32, elems))
                .map_err(e)?;
            let out = cap
                .take(Request::new(Domain::Device, DType::F32, recv))
                .map_err(e)?;
            cap.stream_capture(&s, |s| comm.reduce_scatter(&send, &out, s))
                .map_err(e)?;
            cap.finish().map_err(e)?;
        }
        let replayable = capturing.seal().map_err(e)?;
        let graph = replayable.graph(RunnerId(0)).ok_or("no graph")?;
        let symmetric = time_graph(&cuda, &s, graph, &barrier)?;
        drop(replayable);

        // Unregistered: the same reduce-scatter on plain device memory.
        cuda.context().bind_to_thread().map_err(e)?;
        let sendbuf = unsafe { cu::malloc_sync((elems * 4) as usize) }.map_err(e)?;
        let recvbuf = unsafe { cu::malloc_sync((recv * 4) as usize) }.map_err(e)?;
        cuda.begin_capture(&s).map_err(e)?;
        let r = unsafe {
            nc::ncclReduceScatter(
                sendbuf as *const c_void,
                recvbuf as *mut c_void,
                recv as usize,
                nc::ncclDataType_t::ncclFloat32,
                nc::ncclRedOp_t::ncclSum,
                comm.raw(),
                s.cu_stream() as nc::cudaStream_t,
            )
        };
        if r != nc::ncclResult_t::ncclSuccess {
            // SAFETY: the capture this bench began.
            unsafe { cuda.abort_capture(&s) };
            return Err(format!("ncclReduceScatter: {r:?}"));
        }
        // SAFETY: the capture this bench began.
        let graph = unsafe { cuda.end_capture(&s) }.map_err(e)?;
        let plain = time_graph(&cuda, &s, &graph, &barrier)?;
        drop(graph);
        cuda.synchronize().map_err(e)?;
        unsafe {
            let _ = sys::cuMemFree_v2(sendbuf);
            let _ = sys::cuMemFree_v2(recvbuf);
        }
        rows.push((mib, symmetric, plain));
    }
    Ok(rows)
}

fn main() -> R<()> {
    let info = match probe() {
        Ok(info) => info,
        Err(err) => {
            println!("gpu_nccl_rs: skipped, no usable GPU: {err}");
            return Ok(());
        }
    };
    if info.device_count < 2 {
        println!(
            "gpu_nccl_rs: skipped, needs 2+ GPUs, found {}",
            info.device_count
        );
        return Ok(());
    }
    if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
        std::env::set_var("NCCL_NVLS_ENABLE", "0");
    }
    let ranks = info.device_count;
    let id = UniqueId::new().map_err(e)?;
    let barrier = Arc::new(Barrier::new(ranks));
    let threads: Vec<_> = (0..ranks)
        .map(|rank| {
            let barrier = barrier.clone();
            std::thread::spawn(move || rank_main(rank, ranks, id, barrier))
        })
        .collect();
    let results: Vec<_> = threads
        .into_iter()
        .map(|t| t.join().map_err(|_| "rank panicked".to_string())?)
        .collect::<R<_>>()?;
    println!("## captured reduce-scatter, {ranks} ranks, f32 sum, median of 3 x {REPLAYS} graph launches (rank 0)");
    println!(
        "| send MiB/rank | symmetric window (us) | unregistered (us) | unregistered / symmetric |"
    );
    println!("|---:|---:|---:|---:|");
    for (mib, sym, plain) in &results[0] {
        println!("| {mib} | {sym:.1} | {plain:.1} | {:.2}x |", plain / sym);
    }
    Ok(())
}
