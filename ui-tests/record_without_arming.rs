//! Proves: a request cannot be recorded without arming a runner; only the
//! `ArmedRunner` guard has `record`.
use replay_arena::{DType, Discovering, Domain, PlanConfig, Request};

fn main() {
    let mut discovery = Discovering::new(PlanConfig::new());
    discovery.record(Request::new(Domain::Device, DType::BF16, 4096));
}
