//! Proves: the views a consumer is handed cannot escape the consumer; work
//! on them must be enqueued inside `consume`, where it is fenced.
use replay_arena::sim;
use replay_arena::{Discovering, Error, PlanConfig, Policy, ReadOnly, RunnerId, View};

fn main() {
    let sim = sim::Device::new();
    let stream = sim.new_stream();
    let planned = Discovering::new(PlanConfig::new())
        .plan(Policy::Generations(1))
        .unwrap();
    let mut replayable = planned.allocate(sim).unwrap().seal().unwrap();
    let mut escaped: Vec<View<'_, ReadOnly>> = Vec::new();
    let _ = replayable.consume(RunnerId(0), &stream, |_, views| {
        escaped.extend_from_slice(views);
        Ok::<(), Error>(())
    });
    drop(escaped);
}
