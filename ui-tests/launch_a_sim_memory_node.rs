//! Proves: a program cannot put a graph memory node into a `sim` capture
//! itself. Memory nodes are no `sim::Kernel` (only `alloc_async` and
//! `free_async` make them), and `launch` takes an `Op`, not a `sim::Node`:
//! so the model's use-after-free check knows every free in a graph.
use replay_arena::sim;

fn free_behind_the_models_back(sim: &sim::Device, stream: &sim::Stream, addr: u64) {
    let _ = sim.launch(stream, sim::Kernel::FreeNode { addr }, 0);
}

fn launch_a_node_of_another_graph(sim: &sim::Device, stream: &sim::Stream, graph: &sim::Graph) {
    let (node, _) = graph.ops()[0];
    let _ = sim.launch(stream, node, 0);
}

fn main() {}
