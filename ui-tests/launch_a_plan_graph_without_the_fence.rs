//! Proves: safe code cannot launch a plan's graph around the fence. The
//! plan's graph and backend are reachable, but `Launch::launch` is an
//! `unsafe fn`: `Replayable::replay` is the safe way in.
use replay_arena::sim;
use replay_arena::{Replayable, RunnerId};
use replay_arena::backend::Launch;

fn unfenced(replayable: &Replayable<sim::Device>, stream: &sim::Stream) {
    let graph = replayable.graph(RunnerId(0)).unwrap();
    let _ = Launch::launch(replayable.backend(), graph, stream);
}

fn main() {}
