//! Faults in teardown, `replan`, `allocate` and traces: one fault at each
//! call of a plan's drop, `replan`, a step graph's drop, `allocate` and
//! `start_trace`. Guards `docs/safety.md`'s promise that a teardown whose
//! whole-device wait succeeds leaks nothing (and one that cannot wait
//! leaks rather than frees), and that a trace shows no work that never
//! ran. An attack that found no hole.

use replay_arena::backend::Streams;
use replay_arena::sim::{self, Call, Faults};
use replay_arena::{BackendFailure, Discovering, Operation, PlanConfig, Policy, Replayable};

use crate::support::attacks::{assert_summed_then_clean, two_runners};
use crate::support::faults::{
    assert_clean, at_each_call, copy_out, fill_plan, r, two_step, under, N, Q,
};

/// A new device with three streams and two sinks, and a plan on it with
/// work in flight on the three (replays and consumers of runners sharing
/// bytes).
fn busy() -> (sim::Device, [sim::HostBuffer; 2], Replayable<sim::Device>) {
    let sim = sim::Device::new();
    let s = [sim.new_stream(), sim.new_stream(), sim.new_stream()];
    let sink = [sim.alloc_f32(N).unwrap(), sim.alloc_f32(N).unwrap()];
    let mut rp = fill_plan(&sim, 3, 2);
    rp.replay(r(0), &s[0]).unwrap();
    copy_out(&mut rp, &sim, r(0), &s[1], &sink[0]).unwrap();
    rp.replay(r(1), &s[2]).unwrap();
    copy_out(&mut rp, &sim, r(1), &s[0], &sink[1]).unwrap();
    rp.replay(r(2), &s[1]).unwrap();
    (sim, sink, rp)
}

/// docs/safety.md: "when a wait fails they wait for the whole device,
/// and when that fails too, arenas, events and graphs are leaked": a
/// single fault during teardown, whose whole-device wait then succeeds,
/// leaks nothing.
#[test]
fn a_teardown_with_one_fault_at_each_call_leaks_nothing() {
    let n = at_each_call(|attack| {
        let (sim, _sink, rp) = busy();
        attack.on(&sim, || drop(rp));
        assert_clean(&sim, 2, format_args!("{attack}: only the sinks"));
    });
    assert!(n > 0);
}

/// `replan` with a single fault at each of its calls: it returns the
/// discovery (the whole-device wait covers the failed call), no hazard,
/// nothing leaked; with every host wait failing it is a typed error and
/// leaks rather than frees.
#[test]
fn a_replan_with_one_fault_at_each_call_returns_its_discovery() {
    at_each_call(|attack| {
        let (sim, _sink, rp) = busy();
        let d = attack.on_ok(&sim, || rp.replan());
        assert!(d.is_ok(), "{attack}: {:?}", d.err());
        assert_clean(&sim, 2, attack);
    });
    let (sim, _sink, rp) = busy();
    sim.fail_waits(true);
    assert!(matches!(
        rp.replan(),
        Err(BackendFailure {
            op: Operation::Replan,
            ..
        })
    ));
    sim.fail_waits(false);
    assert!(sim.live_allocations() > 2, "leaked, not freed");
    sim.synchronize().unwrap();
    assert_eq!(sim.hazards(), []);
}

/// A step graph (borrowed) dropped with a single fault at each call of
/// its drop: the plan is then dropped and nothing is left.
#[test]
fn a_step_graph_dropped_with_one_fault_at_each_call_leaks_nothing() {
    at_each_call(|attack| {
        let (sim, [a, b], sink, mut rp) = two_runners();
        {
            let mut g = two_step(&mut rp, &sim, &a, &b, &sink)
                .build_overlapping()
                .unwrap();
            g.launch(&a).unwrap();
            g.launch(&b).unwrap();
            attack.on(&sim, || drop(g));
        }
        rp.replay(r(0), &b).unwrap();
        let what = attack.to_string();
        assert_summed_then_clean((rp, &sim), &sink, (6.0, 1), &what);
    });
}

/// Allocation failing at each arena, and `Faults` at each call of
/// `allocate`: a typed error, the plan back, nothing left allocated, and
/// the plan allocates again.
#[test]
fn an_allocation_failing_at_each_call_frees_what_it_had() {
    let planned = || {
        Discovering::from_runners(PlanConfig::new(), (0..4).map(|i| (r(i), [Q])))
            .unwrap()
            .plan(Policy::Generations(3))
            .unwrap()
    };
    at_each_call(|attack| {
        let sim = sim::Device::new();
        let got = attack.on_ok(&sim, || planned().allocate(sim.clone()));
        match got {
            Ok(c) => drop(c),
            Err(failed) => {
                assert_eq!(sim.live_allocations(), 0, "{attack}");
                assert_eq!(sim.live_events(), 0, "{attack}");
                drop(failed.into_planned().allocate(sim.clone()).unwrap());
            }
        }
        assert_eq!(sim.live_allocations(), 0, "{attack}");
        assert_eq!(sim.live_events(), 0, "{attack}");
    });
    for after in 0..3 {
        let sim = sim::Device::new();
        sim.fail_allocations_after(Some(after));
        assert!(planned().allocate(sim.clone()).is_err());
        sim.fail_allocations_after(None);
        assert_eq!(sim.live_allocations(), 0);
    }
}

/// A trace whose start fails at each of its calls leaves no event
/// behind, and the fence goes on; a replay that fails while a trace runs
/// shows no slice in the trace (it never ran).
#[test]
fn traces_under_faults_leak_nothing_and_show_no_work_that_never_ran() {
    at_each_call(|attack| {
        let sim = sim::Device::new();
        let a = sim.new_stream();
        let mut rp = fill_plan(&sim, 1, 1);
        let _ = attack.on_ok(&sim, || rp.start_trace());
        rp.replay(r(0), &a).unwrap();
        let _ = rp.finish_trace();
        drop(rp);
        assert_eq!(sim.live_events(), 0, "{attack}");
    });
    let sim = sim::Device::new();
    let (a, b) = (sim.new_stream(), sim.new_stream());
    let mut rp = fill_plan(&sim, 2, 1);
    rp.start_trace().unwrap();
    rp.replay(r(0), &a).unwrap();
    under(&sim, Faults::nth(Call::Launch, 0), || {
        assert!(rp.replay(r(1), &b).is_err())
    });
    let trace = rp.finish_trace().unwrap();
    assert_eq!(trace.uses().len(), 1, "{:?}", trace.uses());
}

/// While a trace runs, a consumer whose wait fails leaves no slice and a
/// step launch whose launch fails leaves no launch slice (only the waits
/// that went out before it): the trace shows only work that ran.
#[test]
fn a_trace_shows_no_slice_for_a_failed_consumer_or_step_launch() {
    let sim = sim::Device::new();
    let (a, b, c) = (sim.new_stream(), sim.new_stream(), sim.new_stream());
    let sink = sim.alloc_f32(N).unwrap();
    let mut rp = fill_plan(&sim, 2, 1);
    rp.start_trace().unwrap();
    rp.replay(r(0), &a).unwrap();
    under(&sim, Faults::nth(Call::WaitEvent, 0), || {
        assert!(copy_out(&mut rp, &sim, r(0), &b, &sink).is_err())
    });
    let trace = rp.finish_trace().unwrap();
    assert_eq!(trace.uses().len(), 1, "{:?}", trace.uses());
    let mut g = two_step(&mut rp, &sim, &a, &b, &sink).build().unwrap();
    g.launch(&a).unwrap();
    drop(g);
    rp.start_trace().unwrap();
    let mut g = two_step(&mut rp, &sim, &a, &b, &sink).build().unwrap();
    under(&sim, Faults::nth(Call::Launch, 0), || {
        assert!(g.launch(&c).is_err())
    });
    drop(g);
    let trace = rp.finish_trace().unwrap();
    // The waits that went out before the failed launch stay on the device
    // (and in the trace); the launch itself is not there.
    assert!(
        trace
            .uses()
            .iter()
            .all(|s| !matches!(s.kind, replay_arena::UseKind::StepLaunch { .. })),
        "{:?}",
        trace.uses()
    );
    assert_eq!(sim.hazards(), []);
}
