//! What the tests share: random workloads for the property tests (here),
//! and the GPU tests' device, kernels and host model (`gpu`).
#![allow(dead_code)] // each test binary uses a subset

#[cfg(feature = "cuda")]
pub mod gpu;
#[cfg(feature = "cuda")]
pub mod ops;

use proptest::prelude::*;
use replay_arena::{
    DType, Discovering, Domain, GroupId, ParamId, PlanConfig, Purpose, Request, RunnerId,
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
