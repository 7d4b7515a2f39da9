//! Proves: only one runner's capture can be open at a time; the capture
//! guard borrows the `Capturing` mutably.
use replay_arena::sim;
use replay_arena::{Discovering, PlanConfig, Policy, RunnerId};

fn main() {
    let planned = Discovering::new(PlanConfig::new())
        .plan(Policy::Generations(1))
        .unwrap();
    let mut capturing = planned.allocate(sim::Device::new()).unwrap();
    let first = capturing.capture(RunnerId(0)).unwrap();
    let second = capturing.capture(RunnerId(1)).unwrap();
    drop((first, second));
}
