//! Proves: `seal` cannot run while a runner's capture is open; the open
//! capture borrows the `Capturing` that `seal` consumes.
use replay_arena::sim;
use replay_arena::{Discovering, PlanConfig, Policy, RunnerId};

fn main() {
    let planned = Discovering::new(PlanConfig::new())
        .plan(Policy::Generations(1))
        .unwrap();
    let mut capturing = planned.allocate(sim::Device::new()).unwrap();
    let cap = capturing.capture(RunnerId(0)).unwrap();
    let _replayable = capturing.seal();
    drop(cap);
}
