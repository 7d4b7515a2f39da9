//! Proves: a closed capture hands out no more views; `finish` consumes the
//! `RunnerCapture`.
use replay_arena::sim;
use replay_arena::{DType, Discovering, Domain, PlanConfig, Policy, Request, RunnerId};

fn main() {
    let request = Request::new(Domain::Device, DType::F32, 64);
    let planned = Discovering::new(PlanConfig::new())
        .plan(Policy::Generations(1))
        .unwrap();
    let mut capturing = planned.allocate(sim::Device::new()).unwrap();
    let cap = capturing.capture(RunnerId(0)).unwrap();
    let _ = cap.finish();
    let _ = cap.take(request);
}
