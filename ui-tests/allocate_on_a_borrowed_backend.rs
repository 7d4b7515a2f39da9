//! Proves: a plan allocates on a backend handle it owns; a borrowed one is
//! refused at compile time, and the message says what a backend is and
//! that handles are passed by value.
use replay_arena::sim;
use replay_arena::{Discovering, PlanConfig, Policy};

fn main() {
    let sim = sim::Device::new();
    let planned = Discovering::new(PlanConfig::new())
        .plan(Policy::Generations(1))
        .unwrap();
    let _capturing = planned.allocate(&sim);
}
