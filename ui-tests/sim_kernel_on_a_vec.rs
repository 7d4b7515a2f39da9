//! Proves: a sim op runs on sim memory only; a host `Vec` is refused at
//! compile time, and the message names what an op takes.
use replay_arena::sim;

fn main() {
    let host = vec![0.0f32; 4];
    let _op = sim::Kernel::fill(&host, 1.0);
}
