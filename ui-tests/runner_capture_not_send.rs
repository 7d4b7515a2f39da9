//! Proves: an open capture stays on the thread that opened it (CUDA stream
//! capture is per thread); `RunnerCapture` is `!Send` through a crate-owned
//! marker, so the diagnostic names no backend type.
use replay_arena::sim;
use replay_arena::{Discovering, PlanConfig, Policy, RunnerId};

fn main() {
    let planned = Discovering::new(PlanConfig::new())
        .plan(Policy::Generations(1))
        .unwrap();
    let mut capturing = planned.allocate(sim::Device::new()).unwrap();
    let cap = capturing.capture(RunnerId(0)).unwrap();
    std::thread::scope(|s| {
        s.spawn(move || drop(cap));
    });
}
