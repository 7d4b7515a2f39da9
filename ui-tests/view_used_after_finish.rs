//! Proves: a view cannot be used after its capture closed with `finish`;
//! views borrow the `RunnerCapture` that `finish` consumes.
use replay_arena::sim;
use replay_arena::{DType, Discovering, Domain, Error, PlanConfig, Policy, Request, RunnerId};

fn main() {
    let request = Request::new(Domain::Device, DType::F32, 64);
    let mut discovery = Discovering::new(PlanConfig::new());
    discovery.arm(RunnerId(0)).unwrap().record(request).unwrap();
    let sim = sim::Device::new();
    let stream = sim.new_stream();
    let mut capturing = discovery
        .plan(Policy::Generations(1))
        .unwrap()
        .allocate(sim)
        .unwrap();
    let cap = capturing.capture(RunnerId(0)).unwrap();
    let view = cap.take(request).unwrap();
    cap.stream_capture(&stream, |_| Ok::<(), Error>(())).unwrap();
    cap.finish().unwrap();
    let _ = view.device_address();
}
