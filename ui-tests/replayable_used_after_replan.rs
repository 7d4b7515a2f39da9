//! Proves: no replay after `replan` freed the arenas and graphs; it consumes
//! the `Replayable`.
use replay_arena::sim;
use replay_arena::{Discovering, PlanConfig, Policy, RunnerId};

fn main() {
    let sim = sim::Device::new();
    let stream = sim.new_stream();
    let planned = Discovering::new(PlanConfig::new())
        .plan(Policy::Generations(1))
        .unwrap();
    let mut replayable = planned.allocate(sim).unwrap().seal().unwrap();
    let _discovery = replayable.replan();
    let _ = replayable.replay(RunnerId(0), &stream);
}
