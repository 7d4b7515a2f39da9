//! Proves: a view cannot escape the scope of its capture, even when the
//! capture is dropped (closed unfinished) rather than finished.
use replay_arena::sim;
use replay_arena::{DType, Discovering, Domain, PlanConfig, Policy, Request, RunnerId};

fn main() {
    let request = Request::new(Domain::Device, DType::F32, 64);
    let mut discovery = Discovering::new(PlanConfig::new());
    discovery.arm(RunnerId(0)).unwrap().record(request).unwrap();
    let mut capturing = discovery
        .plan(Policy::Generations(1))
        .unwrap()
        .allocate(sim::Device::new())
        .unwrap();
    let view = {
        let cap = capturing.capture(RunnerId(0)).unwrap();
        cap.take(request).unwrap()
    };
    let _ = view.device_address();
}
