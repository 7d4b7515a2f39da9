//! Proves: while a step graph of a plan exists, the plan's per-runner API
//! cannot be used (the step graph's edges assume nothing else runs on the
//! plan's bytes); dropping the step graph hands the plan back.
use replay_arena::sim;
use replay_arena::{Replayable, RunnerId};

fn both(replayable: &mut Replayable<sim::Device>, stream: &sim::Stream) {
    let mut step = replayable.step();
    step.replay(RunnerId(0), stream).unwrap();
    let mut graph = step.build().unwrap();
    replayable.replay(RunnerId(1), stream).unwrap(); // `replayable` is borrowed by `graph`
    graph.launch(stream).unwrap();
}

fn main() {}
