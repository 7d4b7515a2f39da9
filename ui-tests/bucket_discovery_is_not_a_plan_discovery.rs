// A bucket's discovery joins a sealed plan: it cannot be planned as the
// plan's own discovery.
use replay_arena::{sim, Discovering, PlanConfig, Policy};

fn main() {
    let planned = Discovering::new(PlanConfig::new()).plan(Policy::Generations(1)).unwrap();
    let mut replayable = planned.allocate(sim::Device::new()).unwrap().seal().unwrap();
    let discovery = replayable.discover_bucket("bs=8").unwrap();
    let _ = discovery.plan(Policy::Generations(1));
}
