//! `FenceStats::consumers` counts what its doc says: one per consumer whose
//! work succeeded, through `consume`, `consume_mut` or `consume_many`,
//! whatever its runners (one that requests nothing included, as `replays`
//! counts that runner's launches), so a trace's consumer slices and the
//! counter agree.

use crate::support::capture_view;
use crate::support::record_and_finish;
use replay_arena::sim;
use replay_arena::{DType, Discovering, Domain, PlanConfig, Policy, Request, RunnerId};

#[test]
fn every_consumer_that_ran_counts_once_whatever_its_runners() {
    let req = Request::new(Domain::Device, DType::F32, 16);
    let mut discovery = Discovering::new(PlanConfig::new());
    discovery.arm(RunnerId(0)).unwrap().record(req).unwrap();
    discovery.arm(RunnerId(1)).unwrap().record(req).unwrap();
    discovery.arm(RunnerId(2)).unwrap(); // requests nothing
    let planned = discovery.plan(Policy::Generations(3)).unwrap();
    let sim = sim::Device::new();
    let (s, side) = (sim.new_stream(), sim.new_stream());
    let mut capturing = planned.allocate(sim.clone()).unwrap();
    for r in 0..2 {
        capture_view(&mut capturing, RunnerId(r), req, &s, |st, v| {
            sim.launch(st, sim::Kernel::fill(&v, 1.0), 1)
        });
    }
    let cap = capturing.capture(RunnerId(2)).unwrap();
    record_and_finish!(cap, &s, |_| Ok::<(), String>(()));
    let mut rp = capturing.seal().unwrap();
    rp.start_trace().unwrap();
    for r in 0..3 {
        rp.replay(RunnerId(r), &s).unwrap();
    }
    let out = sim.alloc_f32(16).unwrap();
    rp.consume(RunnerId(2), &side, |_, _| Ok::<(), String>(()))
        .unwrap();
    assert_eq!(
        rp.fence_stats().consumers,
        1,
        "a consume of a runner that requests nothing"
    );
    rp.consume_mut(RunnerId(0), &side, |st, v| {
        sim.launch(st, sim::Kernel::scale(&v[0], 2.0), 1)
    })
    .unwrap();
    assert_eq!(rp.fence_stats().consumers, 2, "a consume_mut");
    rp.consume_many(&[RunnerId(0), RunnerId(1)], &side, |st, v| {
        sim.launch(st, sim::Kernel::add(&v[0][0], &out), 1)?;
        sim.launch(st, sim::Kernel::add(&v[1][0], &out), 1)
    })
    .unwrap();
    assert_eq!(
        rp.fence_stats().consumers,
        3,
        "one consume_many of two runners"
    );
    let trace = rp.finish_trace().unwrap();
    let slices = trace.uses().iter();
    let consume_slices = slices.filter(|s| s.kind.category() == "consume").count();
    assert_eq!(consume_slices as u64, rp.fence_stats().consumers);
    // A consumer whose work failed does not count.
    let failed = rp.consume(RunnerId(2), &side, |_, _| Err::<(), _>("no"));
    assert!(failed.is_err());
    assert_eq!(rp.fence_stats().consumers, 3);
    rp.synchronize().unwrap();
    assert_eq!(sim.read_f32(&out).unwrap(), vec![3.0; 16]);
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
}
