//! Proves: a plan is allocated at most once; `allocate` consumes the
//! `Planned`, so a second allocation (double arenas) does not compile.
use replay_arena::sim;
use replay_arena::{Discovering, PlanConfig, Policy};

fn main() {
    let planned = Discovering::new(PlanConfig::new())
        .plan(Policy::Generations(1))
        .unwrap();
    let _first = planned.allocate(sim::Device::new());
    let _second = planned.allocate(sim::Device::new());
}
