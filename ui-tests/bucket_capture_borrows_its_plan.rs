// A bucket's capture borrows the plan it joins: the plan cannot replay (or
// join another bucket) until it is sealed or dropped.
use replay_arena::{sim, DType, Discovering, Domain, PlanConfig, Policy, Request, RunnerId};

fn main() {
    let planned = Discovering::new(PlanConfig::new()).plan(Policy::Generations(1)).unwrap();
    let sim = sim::Device::new();
    let stream = sim.new_stream();
    let mut replayable = planned.allocate(sim).unwrap().seal().unwrap();
    let mut discovery = replayable.discover_bucket("bs=8").unwrap();
    discovery
        .arm(RunnerId(1))
        .unwrap()
        .record(Request::new(Domain::Device, DType::F32, 8))
        .unwrap();
    let capture = discovery.fit().unwrap();
    replayable.replay(RunnerId(0), &stream).unwrap();
    drop(capture);
}
