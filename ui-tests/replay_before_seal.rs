//! Proves: nothing replays before `seal`; `Capturing` has no `replay`.
use replay_arena::sim;
use replay_arena::{Discovering, PlanConfig, Policy, RunnerId};

fn main() {
    let sim = sim::Device::new();
    let stream = sim.new_stream();
    let planned = Discovering::new(PlanConfig::new())
        .plan(Policy::Generations(1))
        .unwrap();
    let mut capturing = planned.allocate(sim).unwrap();
    let _ = capturing.replay(RunnerId(0), &stream);
}
