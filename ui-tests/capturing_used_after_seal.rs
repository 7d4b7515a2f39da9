//! Proves: no capture after `seal`; it consumes the `Capturing`.
use replay_arena::sim;
use replay_arena::{Discovering, PlanConfig, Policy, RunnerId};

fn main() {
    let planned = Discovering::new(PlanConfig::new())
        .plan(Policy::Generations(1))
        .unwrap();
    let mut capturing = planned.allocate(sim::Device::new()).unwrap();
    let _replayable = capturing.seal();
    let _cap = capturing.capture(RunnerId(0));
}
