//! Proves: views are only handed out inside a runner's capture: `take` is a
//! method of the `RunnerCapture` guard, and the `Capturing` phase is not one.
use replay_arena::sim;
use replay_arena::{
    DType, Discovering, Domain, PlanConfig, Policy, Request, RunnerCapture, RunnerId,
};

fn main() {
    let request = Request::new(Domain::Device, DType::F32, 64);
    let mut discovery = Discovering::new(PlanConfig::new());
    discovery.arm(RunnerId(0)).unwrap().record(request).unwrap();
    let capturing = discovery
        .plan(Policy::Generations(1))
        .unwrap()
        .allocate(sim::Device::new())
        .unwrap();
    let _view = RunnerCapture::take(&capturing, request);
}
