//! Proves: a phase that owns arenas cannot be cloned (two owners would free
//! every arena twice).
use replay_arena::sim;
use replay_arena::{Discovering, PlanConfig, Policy};

fn main() {
    let planned = Discovering::new(PlanConfig::new())
        .plan(Policy::Generations(1))
        .unwrap();
    let capturing = planned.allocate(sim::Device::new()).unwrap();
    let _twin = capturing.clone();
}
