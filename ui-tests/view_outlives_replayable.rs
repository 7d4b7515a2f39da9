//! Proves: a view handed out by a `Replayable` cannot outlive it: `replan`
//! frees the arenas, and the view borrows the `Replayable` it consumes.
use replay_arena::sim;
use replay_arena::{Discovering, PlanConfig, Policy, RunnerId};

fn main() {
    let planned = Discovering::new(PlanConfig::new())
        .plan(Policy::Generations(1))
        .unwrap();
    let replayable = planned.allocate(sim::Device::new()).unwrap().seal().unwrap();
    let views = replayable.views(RunnerId(0)).unwrap();
    let _discovery = replayable.replan();
    let _ = views[0].device_address();
}
