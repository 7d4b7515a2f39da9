//! Proves: a plan is allocated at most once; `allocate` consumes the
//! `Planned`, so a second allocation (double arenas) does not compile.
use replay_arena::sim::SimBackend;
use replay_arena::{Discovering, PlanConfig, Policy};

fn main() {
    let planned = Discovering::new(PlanConfig::new())
        .plan(Policy::Generations(1))
        .unwrap();
    let _first = planned.allocate(SimBackend::new());
    let _second = planned.allocate(SimBackend::new());
}
