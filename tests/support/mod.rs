//! What the tests share: random workloads for the property tests (here),
//! and the GPU tests' device, kernels and host model (`gpu`).
#![allow(dead_code)] // each test binary uses a subset

/// `$cap.stream_capture($stream, $work)`, then `$cap.finish()`, both
/// expected to succeed: a runner captured in one go. A macro, not a
/// function: `$work` may use views that borrow `$cap`, which `finish` then
/// consumes.
macro_rules! record_and_finish {
    ($cap:ident, $stream:expr, $work:expr $(,)?) => {
        $cap.stream_capture($stream, $work).unwrap();
        $cap.finish().unwrap();
    };
}
#[allow(unused_imports)] // binaries that only use it through the fixtures
pub(crate) use record_and_finish;

#[cfg(feature = "cuda")]
pub mod gpu;
#[cfg(feature = "cuda")]
pub mod ops;
pub mod attacks;
pub mod buckets;
pub mod faults;
pub mod old_packed;
pub mod steps;

use std::fmt;

use proptest::prelude::*;
use replay_arena::backend::Backend;
use replay_arena::{
    Capturing, DType, Discovering, Domain, GroupId, ParamId, PlanConfig, Purpose, Request,
    RunnerId, View,
};

/// One runner's requests, in recording order.
pub type Workload = Vec<Vec<Request>>;

pub const GTP: GroupId = GroupId(7);

pub fn config() -> PlanConfig {
    PlanConfig::new().with_group(GTP, "gtp").unwrap()
}

fn key() -> impl Strategy<Value = (Domain, DType)> {
    prop_oneof![
        Just((Domain::Device, DType::BF16)),
        Just((Domain::Device, DType::F32)),
        Just((Domain::Device, DType::U8)),
        Just((Domain::Symmetric(GTP), DType::BF16)),
    ]
}

pub fn request() -> impl Strategy<Value = Request> {
    (key(), 1u64..20_000, 0u64..6).prop_map(|((domain, dtype), elements, param)| {
        Request::new(domain, dtype, elements)
            .purpose(Purpose::WgradRsInput)
            .param(ParamId(param))
    })
}

/// Up to `max_runners` runners with 0..5 requests each (some runners empty).
pub fn workload(max_runners: usize) -> impl Strategy<Value = Workload> {
    prop::collection::vec(prop::collection::vec(request(), 0..5), 1..max_runners)
}

pub fn discover(workload: &Workload) -> Discovering {
    let runners = workload
        .iter()
        .enumerate()
        .map(|(r, requests)| (RunnerId(r as u32), requests.iter().copied()));
    Discovering::from_runners(config(), runners).unwrap()
}

pub fn aligned(q: &Request) -> u64 {
    q.aligned_bytes().unwrap()
}

/// `K` new streams of `sim`, made in order.
pub fn streams<const K: usize>(sim: &replay_arena::sim::Device) -> [replay_arena::sim::Stream; K] {
    std::array::from_fn(|_| sim.new_stream())
}

/// Runner `r` of [`filled_plan`] fills its view for `10 + r` ticks.
pub fn fill_ticks(r: u32) -> u64 {
    10 + u64::from(r)
}

/// `n` runners of one 64-element `f32` request each at `g` generations,
/// captured on `sim`: runner `r` fills its view with `r` for
/// [`fill_ticks`]`(r)` ticks.
pub fn filled_plan(
    n: u32,
    g: usize,
) -> (
    replay_arena::sim::Device,
    replay_arena::Replayable<replay_arena::sim::Device>,
) {
    use replay_arena::{sim, Policy};
    let req = Request::new(Domain::Device, DType::F32, 64);
    let runners = (0..n).map(|r| (RunnerId(r), [req]));
    let planned = Discovering::from_runners(PlanConfig::new(), runners)
        .unwrap()
        .plan(Policy::Generations(g))
        .unwrap();
    let sim = sim::Device::new();
    let capture = sim.new_stream();
    let capturing = planned.allocate(sim.clone()).unwrap();
    let replayable = seal_each(capturing, n, req, &capture, |r, s, view| {
        sim.launch(s, sim::Kernel::fill(view, r as f32), fill_ticks(r))
    });
    (sim, replayable)
}

/// Captures `runner` of `capturing` on `stream`: it takes its view of
/// `request`, `work` enqueues the runner's graph on it, and the capture is
/// finished.
pub fn capture_view<B: Backend, E: fmt::Display + fmt::Debug>(
    capturing: &mut Capturing<B>,
    runner: RunnerId,
    request: Request,
    stream: &B::Stream,
    work: impl FnOnce(&B::Stream, &View<'_>) -> Result<(), E>,
) {
    let cap = capturing.capture(runner).unwrap();
    let view = cap.take(request).unwrap();
    record_and_finish!(cap, stream, |s| work(s, &view));
}

/// Runners `0..n` of `capturing`, each captured on `stream` with
/// [`capture_view`] (`work` gets the runner's number), then sealed.
pub fn seal_each<B: Backend, E: fmt::Display + fmt::Debug>(
    mut capturing: Capturing<B>,
    n: u32,
    request: Request,
    stream: &B::Stream,
    work: impl Fn(u32, &B::Stream, &View<'_>) -> Result<(), E>,
) -> replay_arena::Replayable<B> {
    for r in 0..n {
        capture_view(&mut capturing, RunnerId(r), request, stream, |s, v| {
            work(r, s, v)
        });
    }
    capturing.seal().unwrap()
}

/// `elements` f32s (a random number of them), in device memory or in
/// `group`'s symmetric memory.
pub fn f32_request(
    group: GroupId,
    elements: std::ops::Range<u64>,
) -> impl Strategy<Value = Request> {
    (any::<bool>(), elements).prop_map(move |(symmetric, n)| {
        let domain = if symmetric {
            Domain::Symmetric(group)
        } else {
            Domain::Device
        };
        Request::new(domain, DType::F32, n)
    })
}

/// Every `.rs` file under `dir`, recursively, in path order.
pub fn rust_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, &mut out);
    out.sort();
    out
}
