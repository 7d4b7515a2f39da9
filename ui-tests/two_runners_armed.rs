//! Proves: two runners cannot be armed at once; the guard borrows the
//! `Discovering` mutably until it is dropped.
use replay_arena::{DType, Discovering, Domain, PlanConfig, Request, RunnerId};

fn main() {
    let mut discovery = Discovering::new(PlanConfig::new());
    let mut first = discovery.arm(RunnerId(0)).unwrap();
    let mut second = discovery.arm(RunnerId(1)).unwrap();
    first
        .record(Request::new(Domain::Device, DType::BF16, 4096))
        .unwrap();
    second
        .record(Request::new(Domain::Device, DType::BF16, 4096))
        .unwrap();
}
