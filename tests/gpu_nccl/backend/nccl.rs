//! Symmetric domains on NCCL, on the H200: two groups ("gtp" and
//! "expert-gtp") with their own communicators and registered windows; runners
//! write a wgrad into a symmetric view and reduce-scatter it inside their
//! graph; 1,000 fenced replays with exact results; no alias between groups;
//! teardown gives every window back. Multi-rank variants (one thread per GPU)
//! skip with a message when fewer than 2 GPUs are present.
#![cfg(feature = "nccl")]

use crate::support;

use std::sync::{Arc, Barrier};

use replay_arena::cuda;
use replay_arena::cuda::cudarc::driver::CudaSlice;
use replay_arena::nccl::{self, Communicator, UniqueId};
use replay_arena::{
    BackendError, DType, Discovering, Domain, GroupId, Misuse, PlanConfig, Planned, Policy,
    Purpose, Request, RunnerId, View,
};
use support::gpu::{gpu, gpu_on, host_wgrad, Gpu, Spec};

const GTP: GroupId = GroupId(0);
const EXPERT: GroupId = GroupId(1);

fn config() -> PlanConfig {
    PlanConfig::new()
        .with_group(GTP, "gtp")
        .unwrap()
        .with_group(EXPERT, "expert-gtp")
        .unwrap()
}

/// One runner: a wgrad of `ranks * n` elements in its group's symmetric
/// domain, reduce-scattered into `n` elements of device memory.
#[derive(Clone, Debug)]
struct Rs {
    group: GroupId,
    n: u32,
    seed: u32,
}

impl Rs {
    fn requests(&self, ranks: usize) -> [Request; 2] {
        [
            Request::new(
                Domain::Symmetric(self.group),
                DType::F32,
                u64::from(self.n) * ranks as u64,
            )
            .purpose(Purpose::WgradRsInput),
            Request::new(Domain::Device, DType::F32, self.n.into()).purpose(Purpose::RsOutput),
        ]
    }

    /// The wgrad of `rank` (its seed depends on the rank).
    fn spec(&self, ranks: usize, rank: usize) -> Spec {
        Spec::new(
            self.seed + 1000 * rank as u32,
            &[self.n * ranks as u32],
            None,
        )
    }
}

fn runners() -> Vec<Rs> {
    vec![
        Rs {
            group: GTP,
            n: 3000,
            seed: 1,
        },
        Rs {
            group: EXPERT,
            n: 5000,
            seed: 2,
        },
        Rs {
            group: GTP,
            n: 1024,
            seed: 3,
        },
        Rs {
            group: EXPERT,
            n: 777,
            seed: 4,
        },
    ]
}

fn plan(runners: &[Rs], ranks: usize, extra: u64) -> Planned {
    let mut d = Discovering::new(config());
    for (r, rs) in runners.iter().enumerate() {
        let mut armed = d.arm(RunnerId(r as u32)).unwrap();
        for q in rs.requests(ranks) {
            armed.record(q).unwrap();
        }
        if r == 0 && extra > 0 {
            armed
                .record(Request::new(Domain::Device, DType::F32, extra))
                .unwrap();
        }
    }
    d.plan(Policy::Generations(2)).unwrap()
}

/// Host model: rank `rank`'s reduce-scatter output at `step`, element `i`.
fn host_rs(rs: &Rs, ranks: usize, rank: usize, step: u32, i: u32) -> f32 {
    (0..ranks)
        .map(|q| host_wgrad(&rs.spec(ranks, q), 0, step, rank as u32 * rs.n + i))
        .sum()
}

/// Host model of the consumer's fold of the outputs over `steps` steps.
fn host_fold(rs: &Rs, ranks: usize, rank: usize, steps: u32) -> Vec<u32> {
    (0..rs.n)
        .map(|i| {
            (0..steps).fold(0u32, |out, s| {
                out.wrapping_mul(1664525)
                    .wrapping_add(host_rs(rs, ranks, rank, s, i).to_bits())
            })
        })
        .collect()
}

fn inside(windows: &[(u64, u64)], v: &View<'_>) -> bool {
    windows
        .iter()
        .any(|&(b, n)| v.device_address() >= b && v.device_address() + v.bytes() <= b + n)
}

/// Captures every runner (wgrad, reduce-scatter, step bump), replays
/// `steps` rounds on two streams with a consumer folding each output, and
/// returns each runner's folded output.
fn run(
    g: &Gpu,
    backend: nccl::Device,
    planned: Planned,
    runners: &[Rs],
    ranks: usize,
    rank: usize,
    steps: usize,
) -> Vec<Vec<u32>> {
    let pool: Vec<cuda::Stream> = (0..2).map(|_| g.backend.new_stream().unwrap()).collect();
    let consumer = g.backend.new_stream().unwrap();
    let steps_buf: Vec<CudaSlice<u32>> = runners.iter().map(|_| g.zeros(1)).collect();
    let outs: Vec<CudaSlice<u32>> = runners.iter().map(|r| g.zeros(r.n as usize)).collect();
    let torn: CudaSlice<u32> = g.zeros(1);

    let mut capturing = planned.allocate(backend).unwrap();
    for (r, rs) in runners.iter().enumerate() {
        let comm = capturing.backend().communicator(rs.group).unwrap().clone();
        let other = if rs.group == GTP { EXPERT } else { GTP };
        let other_windows = capturing.backend().communicator(other).unwrap().windows();
        let cap = capturing.capture(RunnerId(r as u32)).unwrap();
        let [send, recv] = rs.requests(ranks).map(|q| cap.take(q).unwrap());
        assert!(
            inside(&comm.windows(), &send),
            "a view lies in its own group's window"
        );
        assert!(
            !inside(&other_windows, &send),
            "and never in the other group's"
        );
        let spec = rs.spec(ranks, rank);
        let step = g.ptr(&steps_buf[r]);
        cap.stream_capture(&pool[0], |s| {
            spec.submit(g, s, step, None, &[send.device_address()])?;
            comm.reduce_scatter(&send, &recv, s)
                .map_err(|e| e.to_string())
        })
        .unwrap();
        cap.finish().unwrap();
    }
    let mut replayable = capturing.seal().unwrap();
    for step in 0..steps {
        for (r, rs) in runners.iter().enumerate() {
            let runner = RunnerId(r as u32);
            replayable.replay(runner, &pool[(step + r) % 2]).unwrap();
            replayable
                .consume(runner, &consumer, |s, views| {
                    g.consume(
                        s,
                        g.ptr(&outs[r]),
                        views[1].device_address(),
                        rs.n,
                        0,
                        g.ptr(&torn),
                        None,
                    )
                })
                .unwrap();
        }
    }
    replayable.synchronize().unwrap();
    assert_eq!(
        replayable.fence_stats().replays,
        (steps * runners.len()) as u64
    );
    assert_eq!(g.read(&torn), vec![0]);
    let got = outs.iter().map(|o| g.read(o)).collect();
    drop(replayable.replan().unwrap());
    got
}

/// compute-sanitizer allocates device memory of its own, so free-memory
/// comparisons are skipped when the command sets REPLAY_ARENA_SANITIZER=1.
fn under_sanitizer() -> bool {
    std::env::var_os("REPLAY_ARENA_SANITIZER").is_some()
}

/// Both groups as 1-rank communicators, and a backend holding them.
fn one_rank_groups(g: &Gpu) -> (Communicator, Communicator, nccl::Device) {
    rank_backend(
        g,
        0,
        1,
        [UniqueId::new().unwrap(), UniqueId::new().unwrap()],
    )
}

fn one_rank_comm(g: &Gpu, group: GroupId) -> Communicator {
    let id = UniqueId::new().unwrap();
    Communicator::new(&g.backend, group, &id, 0, 1).unwrap()
}

/// A backend with a 1-rank communicator of `gtp` only.
fn gtp_only(g: &Gpu) -> nccl::Device {
    nccl::Device::new(g.backend.clone())
        .with_group(one_rank_comm(g, GTP))
        .unwrap()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn symmetric_reduce_scatter_replays_exactly_in_two_groups() {
    let g = gpu();
    let before = g.free_memory();
    let (gtp, expert, backend) = one_rank_groups(&g);
    let runners = runners();
    let planned = plan(&runners, 1, 0);
    println!("{}", planned.report());
    gtp.check_fingerprint(planned.fingerprint()).unwrap();
    expert.check_fingerprint(planned.fingerprint()).unwrap();
    let steps = 250; // 4 runners x 250 = 1,000 replays
    let got = run(&g, backend, planned, &runners, 1, 0, steps);
    for (r, rs) in runners.iter().enumerate() {
        assert!(
            got[r] == host_fold(rs, 1, 0, steps as u32),
            "runner {r} output differs"
        );
    }
    assert!(
        gtp.windows().is_empty() && expert.windows().is_empty(),
        "windows deregistered"
    );
    let with_comms = g.free_memory();
    drop((gtp, expert));
    let after = g.free_memory();
    println!(
        "free memory: {before} before the communicators, {with_comms} after the plan's teardown \
         with the communicators alive, {after} after they are destroyed"
    );
    assert!(
        under_sanitizer() || after + (4 << 20) >= before,
        "device memory left behind: {before} -> {after}"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn two_groups_get_two_disjoint_windows() {
    let g = gpu();
    let (gtp, expert, backend) = one_rank_groups(&g);
    let planned = plan(&runners(), 1, 0);
    let windows_per_group = planned
        .arenas()
        .iter()
        .filter(|a| a.key.domain == Domain::Symmetric(GTP))
        .count();
    let capturing = planned.allocate(backend).unwrap();
    let (a, b) = (gtp.windows(), expert.windows());
    assert_eq!(a.len(), windows_per_group);
    assert!(!a.is_empty() && !b.is_empty());
    for &(x, n) in &a {
        for &(y, m) in &b {
            assert!(x + n <= y || y + m <= x, "windows of two groups alias");
        }
    }
    drop(capturing);
    assert!(gtp.windows().is_empty() && expert.windows().is_empty());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_view_of_another_group_or_the_wrong_size_is_refused() {
    let g = gpu();
    let (gtp, _expert, backend) = one_rank_groups(&g);
    let runners = runners();
    let s = g.backend.new_stream().unwrap();
    let mut capturing = plan(&runners, 1, 0).allocate(backend).unwrap();
    let cap = capturing.capture(RunnerId(1)).unwrap(); // an expert-gtp runner
    let [send, recv] = runners[1].requests(1).map(|q| cap.take(q).unwrap());
    // Outside its closure a view is refused before anything else is checked.
    let err = gtp.reduce_scatter(&send, &recv, &s).unwrap_err();
    assert!(
        err.to_string().contains("outside the work closure"),
        "{err}"
    );
    assert!(
        matches!(
            err,
            BackendError::InvalidView {
                reason: Misuse::OutsideClosure {
                    runner: RunnerId(1),
                    ..
                }
            }
        ),
        "{err:?}"
    );
    let inside = cap.stream_capture(&s, |s| {
        let err = gtp.reduce_scatter(&send, &recv, s).unwrap_err();
        assert!(
            matches!(
                err,
                BackendError::InvalidView {
                    reason: Misuse::NotSymmetric { .. }
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("symmetric(group 1)"), "{err}");
        Ok::<(), BackendError>(())
    });
    inside.unwrap();
    drop(cap);
    let cap = capturing.capture(RunnerId(0)).unwrap(); // a gtp runner
    let [send, _] = runners[0].requests(1).map(|q| cap.take(q).unwrap());
    cap.stream_capture(&s, |s| {
        // SAFETY: refused before anything is enqueued.
        let err = unsafe { gtp.reduce_scatter_raw(&send, 0, 2999, s) }.unwrap_err();
        assert!(
            err.to_string()
                .contains("needs 2999 send elements, the view has 3000"),
            "{err}"
        );
        assert!(
            matches!(
                err,
                BackendError::InvalidView {
                    reason: Misuse::SendLength {
                        recv: 2999,
                        send: 3000,
                        ..
                    }
                }
            ),
            "{err:?}"
        );
        Ok::<(), BackendError>(())
    })
    .unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_symmetric_group_without_communicator_cannot_allocate() {
    let g = gpu();
    let err = plan(&runners(), 1, 0)
        .allocate(gtp_only(&g))
        .unwrap_err()
        .into_error()
        .error;
    assert_eq!(err, BackendError::NoCommunicator { group: EXPERT });
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_group_registers_one_communicator() {
    let g = gpu();
    let err = gtp_only(&g).with_group(one_rank_comm(&g, GTP)).unwrap_err();
    assert_eq!(err, BackendError::CommunicatorTwice { group: GTP });
}

fn device_count() -> usize {
    replay_arena::cuda::cudarc::driver::result::init().unwrap();
    replay_arena::cuda::cudarc::driver::result::device::get_count().unwrap() as usize
}

/// Runs `body(rank, ranks, ids, barrier)` on one thread per GPU, or says
/// why not.
fn on_every_gpu<T: Send + 'static>(
    body: impl Fn(usize, usize, [UniqueId; 2], &Barrier) -> T + Send + Sync + Copy + 'static,
) -> Option<Vec<T>> {
    let ranks = device_count();
    if ranks < 2 {
        println!("skipped: this multi-rank test needs at least 2 GPUs, this machine has {ranks}");
        return None;
    }
    // NVLink multicast stays off on shared hosts.
    if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
        std::env::set_var("NCCL_NVLS_ENABLE", "0");
    }
    let ids = [UniqueId::new().unwrap(), UniqueId::new().unwrap()];
    let barrier = Arc::new(Barrier::new(ranks));
    let threads: Vec<_> = (0..ranks)
        .map(|rank| {
            let barrier = barrier.clone();
            std::thread::spawn(move || body(rank, ranks, ids, &barrier))
        })
        .collect();
    Some(threads.into_iter().map(|t| t.join().unwrap()).collect())
}

fn rank_backend(
    g: &Gpu,
    rank: usize,
    ranks: usize,
    ids: [UniqueId; 2],
) -> (Communicator, Communicator, nccl::Device) {
    let gtp = Communicator::new(&g.backend, GTP, &ids[0], rank, ranks).unwrap();
    let expert = Communicator::new(&g.backend, EXPERT, &ids[1], rank, ranks).unwrap();
    let backend = nccl::Device::new(g.backend.clone())
        .with_group(gtp.clone())
        .unwrap()
        .with_group(expert.clone())
        .unwrap();
    (gtp, expert, backend)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn multi_rank_reduce_scatter_replays_exactly() {
    let steps = 500; // 2 runners x 500 = 1,000 replays per rank
    let done = on_every_gpu(move |rank, ranks, ids, barrier| {
        let g = gpu_on(rank);
        let before = g.free_memory();
        let (gtp, expert, backend) = rank_backend(&g, rank, ranks, ids);
        let runners = vec![
            Rs {
                group: GTP,
                n: 2048,
                seed: 11,
            },
            Rs {
                group: EXPERT,
                n: 512,
                seed: 12,
            },
        ];
        let planned = plan(&runners, ranks, 0);
        gtp.check_fingerprint(planned.fingerprint()).unwrap();
        let got = run(&g, backend, planned, &runners, ranks, rank, steps);
        for (r, rs) in runners.iter().enumerate() {
            assert!(
                got[r] == host_fold(rs, ranks, rank, steps as u32),
                "rank {rank} runner {r}"
            );
        }
        assert!(gtp.windows().is_empty() && expert.windows().is_empty());
        drop((gtp, expert));
        // Peers map each other's NCCL buffers: measure once every rank has
        // destroyed its communicators.
        barrier.wait();
        let after = g.free_memory();
        assert!(
            under_sanitizer() || after + (64 << 20) >= before,
            "rank {rank} left memory behind: {before} -> {after}"
        );
        rank
    });
    if let Some(ranks) = done {
        println!("{} ranks reduce-scattered exactly", ranks.len());
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn multi_rank_fingerprint_check_names_the_rank_that_differs() {
    let done = on_every_gpu(|rank, ranks, ids, _| {
        let g = gpu_on(rank);
        let (gtp, _expert, _backend) = rank_backend(&g, rank, ranks, ids);
        // Rank 1 discovered one more request than the others.
        let planned = plan(&runners(), ranks, if rank == 1 { 64 } else { 0 });
        gtp.check_fingerprint(planned.fingerprint()).unwrap_err()
    });
    for err in done.into_iter().flatten() {
        match err {
            BackendError::FingerprintMismatch { group, ranks, .. } => {
                assert_eq!(group, GTP);
                assert_eq!(ranks, vec![1]);
            }
            other => panic!("expected a fingerprint mismatch, got {other}"),
        }
    }
}
