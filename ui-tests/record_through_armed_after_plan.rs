//! Proves: an `ArmedRunner` cannot outlive planning: recording through a
//! guard whose `Discovering` was planned would be a request after the plan.
use replay_arena::{DType, Discovering, Domain, PlanConfig, Policy, Request, RunnerId};

fn main() {
    let mut discovery = Discovering::new(PlanConfig::new());
    let mut armed = discovery.arm(RunnerId(0)).unwrap();
    let _planned = discovery.plan(Policy::Generations(1)).unwrap();
    armed
        .record(Request::new(Domain::Device, DType::BF16, 4096))
        .unwrap();
}
