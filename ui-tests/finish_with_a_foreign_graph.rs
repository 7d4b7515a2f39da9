//! Proves: safe code cannot hand a capture a graph it did not record (another
//! runner's, or an empty default one): `finish` takes no graph, and the path
//! that does, `finish_with_graph`, is `unsafe`.
use replay_arena::sim;
use replay_arena::{Discovering, PlanConfig, Policy, RunnerId};

fn main() {
    let planned = Discovering::new(PlanConfig::new())
        .plan(Policy::Generations(1))
        .unwrap();
    let mut capturing = planned.allocate(sim::Device::new()).unwrap();
    let cap = capturing.capture(RunnerId(0)).unwrap();
    let _ = cap.finish_with_graph(sim::Graph::default());
}
