//! Proves: the sim's escape hatch that lets an op touch a plan's arenas
//! outside the fence is `unsafe`, like a CUDA kernel on raw addresses.
use replay_arena::sim::{self, Span};

fn raw(sim: &sim::Device, stream: &sim::Stream, addr: u64) {
    let _ = sim.launch_unscoped(stream, sim::Kernel::fill(&Span::new(addr, 4), 1.0), 1);
}

fn main() {}
