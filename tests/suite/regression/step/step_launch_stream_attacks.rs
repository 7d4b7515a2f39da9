//! Attacks that found nothing, on the streams of step launches: `wait_all`
//! after overlapping launches, a deferred record on a stream another plan
//! captures, refused or failed launches between good ones (the fence
//! stays as it was), a step reading a handoff it never writes, and program
//! work on a lane between launches (ordered the documented way).

use crate::support::attacks::{assert_hazard_free, launch_in_turn};
use crate::support::capture_view;
use crate::support::faults::build;
use crate::support::steps::overlap::*;
use crate::support::steps::plan_runners;
use replay_arena::sim;
use replay_arena::{Operation, Policy, RunnerId, StepError};

/// Program work on `s`: every one of `buffers` (a world's accumulators,
/// lane accumulators and sinks: all its consumers write) halved.
fn halve_program_buffers(sim: &sim::Device, buffers: [&[sim::HostBuffer]; 3], s: &sim::Stream) {
    for b in buffers.into_iter().flatten() {
        sim.launch(s, sim::Kernel::scale(b, 0.5), 3).unwrap();
    }
}

/// Two runners sharing bytes on `sim`, each filling its view with its
/// number plus one (slowly), captured on `a`; runner 0 replayed on `a`.
fn slow_pair_replayed_on(
    sim: &sim::Device,
    a: &sim::Stream,
) -> replay_arena::Replayable<sim::Device> {
    let planned = plan_runners((0..2).map(|r| (RunnerId(r), [OWN])), Policy::Generations(1));
    let mut capturing = planned.allocate(sim.clone()).unwrap();
    for r in 0..2u32 {
        capture_view(&mut capturing, RunnerId(r), OWN, a, |s, v| {
            sim.launch(s, sim::Kernel::fill(&v, r as f32 + 1.0), 1000)
        });
    }
    let mut rp = capturing.seal().unwrap();
    rp.replay(RunnerId(0), a).unwrap();
    rp
}

/// Attack: `wait_all` after overlapping launches alternating over three
/// streams, then program work on a fourth stream writes every program
/// buffer the step's consumers write (and reads every view through a
/// consumer-free path: the accumulators): no hazard. Then, with the graph
/// forgotten, `Replayable::wait_all` orders program work just as well.
#[test]
fn wait_all_after_overlapping_launches_orders_program_work() {
    for forget in [false, true] {
        let sh = shape(4, 2, true, true, 2);
        let mut w = world(&sh, 3, 4);
        w.per_runner(&(0..4).map(|r| P(r, r % 3)).collect::<Vec<_>>(), 1)
            .unwrap();
        let ex = [w.sim.new_stream(), w.sim.new_stream(), w.sim.new_stream()];
        let opt = w.sim.new_stream();
        let items = four_chain_items();
        {
            let step = step_of!(w, &items, 1).unwrap();
            let mut g = step.build_overlapping().unwrap();
            launch_in_turn(&mut g, &ex, 5);
            if forget {
                std::mem::forget(g);
            } else {
                g.wait_all(&opt).unwrap();
                halve_program_buffers(&w.sim, [&w.accs, &w.lane_accs, &w.sinks], &opt);
            }
        }
        if forget {
            w.replayable.wait_all(&opt).unwrap();
            halve_program_buffers(&w.sim, [&w.accs, &w.lane_accs, &w.sinks], &opt);
        }
        w.replayable.synchronize().unwrap();
        w.sim.read_f32(&w.accs[0]).unwrap();
        let hz = w.sim.hazards();
        assert!(hz.is_empty(), "forget {forget}: {hz:?}");
    }
}

/// Attack: a step that replays only a handoff's reader (its writer ran
/// before the step, per runner): the second step would read nothing new.
/// Per runner that is `HandoffAlreadyRead` on the second step; the step
/// graph (steady state) must refuse it at build, for both builds.
#[test]
fn a_step_reading_a_handoff_it_never_writes_is_refused() {
    for overlapping in [false, true] {
        let sh = shape(2, 2, true, false, 2);
        let mut w = world(&sh, 2, 1);
        w.per_runner(&[P(0, 0)], 1).unwrap();
        let mut step = w.replayable.step();
        step.replay(RunnerId(1), &w.lanes[1]).unwrap();
        let built = build(step, overlapping);
        match built {
            Err(StepError::Schedule(replay_arena::ScheduleError::Replay(
                replay_arena::ReplayError::HandoffAlreadyRead { .. },
            ))) => {}
            Err(e) => panic!("overlapping {overlapping}: another error {e:?}"),
            Ok(_) => panic!(
                "overlapping {overlapping}: built a step that reads a handoff never rewritten"
            ),
        }
    }
}

/// Attack: the first launch of a step graph must wait for a per-runner
/// replay whose event record was deferred on stream `a`, while another
/// plan captures on `a` (a record there would go into that graph, and a
/// wait on it would wait for nothing). Must wait right or refuse; never
/// overlap. Both builds; launch inside the capture, and also `wait_all`
/// (StepGraph and Replayable) inside it.
#[test]
fn a_step_launch_whose_deferred_record_stream_is_captured_by_another_plan() {
    for overlapping in [false, true] {
        for build_inside in [false, true] {
            let sim = sim::Device::new();
            let [a, b, x, y] = crate::support::streams(&sim);
            // Nobody waits for the replay on `a`: its record is deferred.
            let mut rp = slow_pair_replayed_on(&sim, &a);
            let mut results = Vec::new();
            if build_inside {
                while_captured(&sim, &a, |_| {
                    let mut step = rp.step();
                    step.replay(RunnerId(1), &b).unwrap();
                    let mut g = build(step, overlapping).unwrap();
                    results.push(g.launch(&x).map_err(|e| e.to_string()));
                    results.push(g.launch(&y).map_err(|e| e.to_string()));
                    results.push(g.wait_all(&y).map_err(|e| e.to_string()));
                    std::mem::forget(g);
                });
            } else {
                let mut step = rp.step();
                step.replay(RunnerId(1), &b).unwrap();
                let mut g = build(step, overlapping).unwrap();
                while_captured(&sim, &a, |_| {
                    results.push(g.launch(&x).map_err(|e| e.to_string()));
                    results.push(g.launch(&y).map_err(|e| e.to_string()));
                });
                drop(g);
            }
            rp.synchronize().unwrap();
            let hz = sim.hazards();
            assert!(
                hz.is_empty(),
                "overlapping {overlapping}, build inside {build_inside}: {results:?} {hz:?}"
            );
            eprintln!("overlapping {overlapping}, build inside {build_inside}: {results:?}");
        }
    }
}

/// Attack: a launch refused (capturing stream) between two good launches
/// of an overlapping step graph must not flip its turn or tell the fence a
/// launch happened: the values equal two good launches.
#[test]
fn a_refused_launch_between_good_ones_changes_nothing() {
    let sh = shape(4, 2, true, true, 2);
    let items = four_chain_items();
    let mut reference = world(&sh, 3, 4);
    let warm: Vec<Item> = (0..4).map(|r| P(r, r % 3)).collect();
    reference.per_runner(&warm, 1).unwrap();
    reference.per_runner(&items, 3).unwrap();
    let mut w = world(&sh, 3, 4);
    w.per_runner(&warm, 1).unwrap();
    let (x, y, z) = (w.sim.new_stream(), w.sim.new_stream(), w.sim.new_stream());
    let sim = w.sim.clone();
    {
        let step = step_of!(w, &items, 1).unwrap();
        let mut g = step.build_overlapping().unwrap();
        g.launch(&x).unwrap();
        let mut refused = None;
        while_captured(&sim, &z, |s| refused = Some(g.launch(s)));
        assert_eq!(
            refused,
            Some(Err(replay_arena::StepLaunchError::StreamCapturing(
                replay_arena::StreamCapturing {
                    op: Operation::StepLaunch
                }
            )))
        );
        assert_eq!(g.launches(), 1);
        g.launch(&y).unwrap();
        g.launch(&x).unwrap();
        assert_eq!(g.launches(), 3);
    }
    w.per_runner(&items, 1).unwrap();
    reference.per_runner(&items, 1).unwrap();
    assert!(w.sim.hazards().is_empty(), "{:?}", w.sim.hazards());
    assert_eq!(w.values(), reference.values());
}

/// Attack: step launches that fail (the first launch's wait needs a record
/// on a stream another plan captures) must leave the fence as if they never
/// happened: runner 0's data is still there to consume (not
/// `Overwritten` by the never-run replay of runner 1), the launch counters
/// stay 0, and a later good launch waits right.
#[test]
fn failed_step_launches_leave_the_fence_untouched() {
    for overlapping in [false, true] {
        let sim = sim::Device::new();
        let (a, b, x) = (sim.new_stream(), sim.new_stream(), sim.new_stream());
        let acc = sim.alloc_f32(N).unwrap();
        let mut rp = slow_pair_replayed_on(&sim, &a);
        {
            let mut step = rp.step();
            step.replay(RunnerId(1), &b).unwrap();
            let mut g = build(step, overlapping).unwrap();
            let mut failed = Vec::new();
            while_captured(&sim, &a, |_| {
                failed.push(g.launch(&x).is_err());
                failed.push(g.launch(&b).is_err());
            });
            assert_eq!(failed, vec![true, true]);
            assert_eq!(g.launches(), 0);
        }
        assert_eq!(
            rp.fence_stats().step_launches,
            0,
            "overlapping {overlapping}"
        );
        let got = rp.consume(RunnerId(0), &x, |s, v| {
            sim.launch(s, sim::Kernel::add(&v[0], &acc), 1)
        });
        assert!(got.is_ok(), "overlapping {overlapping}: {got:?}");
        rp.synchronize().unwrap();
        assert_eq!(sim.read_f32(&acc).unwrap()[0], 1.0);
        {
            let mut step = rp.step();
            step.replay(RunnerId(1), &b).unwrap();
            let mut g = build(step, overlapping).unwrap();
            g.launch(&x).unwrap();
            g.launch(&b).unwrap();
        }
        let got = rp.consume(RunnerId(1), &a, |s, v| {
            sim.launch(s, sim::Kernel::add(&v[0], &acc), 1)
        });
        assert!(got.is_ok());
        rp.synchronize().unwrap();
        assert_eq!(sim.read_f32(&acc).unwrap()[0], 3.0);
        assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    }
}

/// Probe (documented behaviour, not a bug): a step's lanes are the step
/// graph's own, not the streams named in the schedule, so program work
/// enqueued on a lane between launches is not stream-ordered with the
/// consumers the schedule put on that lane (per runner it would be). The
/// docs say work outside the crate is the program's to order (`wait_all`);
/// with `wait_all` on the lane before the program work and the launch made
/// on that lane, it is ordered. This checks the documented way holds.
#[test]
fn program_work_on_a_lane_between_launches_is_ordered_the_documented_way() {
    for overlapping in [false, true] {
        let sh = shape(2, 2, false, false, 2);
        let mut w = world(&sh, 2, 2);
        w.per_runner(&[P(0, 0), P(1, 1)], 1).unwrap();
        let sim = w.sim.clone();
        let mut step = w.replayable.step();
        step.replay(RunnerId(0), &w.lanes[0]).unwrap();
        step.consume(
            RunnerId(0),
            &w.lanes[1],
            consume_work(&w.sim, &w.accs[0], &w.lane_accs[1], &w.one, false, 40),
        )
        .unwrap();
        let mut g = build(step, overlapping).unwrap();
        for _ in 0..4 {
            // launched on lane 1, program work on lane 1 after wait_all.
            g.launch(&w.lanes[1]).unwrap();
            g.wait_all(&w.lanes[1]).unwrap();
            sim.launch(&w.lanes[1], sim::Kernel::scale(&w.lane_accs[1], 0.5), 5)
                .unwrap();
        }
        drop(g);
        assert_hazard_free(&sim, format!("overlapping {overlapping}"));
    }
}
