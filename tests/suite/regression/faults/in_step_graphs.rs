//! Faults in step graphs: a fault at each call of a build, of a launch
//! (borrowed, overlapping and kept), of alternating kept steps, and step
//! graphs forgotten after a failed launch. Guards that the launches after
//! a fault run in turn with exact sums, that a failed build or launch
//! counts nothing, and that a kept step stays its plan's only. An attack
//! that found no hole.

use std::panic::{catch_unwind, AssertUnwindSafe};

use replay_arena::sim::{self, Call, Faults};
use replay_arena::{StepLaunchError, WaitError};

use crate::support::attacks::{assert_summed, two_runners};
use crate::support::faults::{
    at_each_call, build, copy_out, fill_plan, r, read0, two_step, under, Attack, N,
};

/// `test(overlapping, attack, what)` for borrowed and overlapping step
/// graphs, each with a fault at each call of what the test attacks
/// (`at_each_call`).
fn each_build_at_each_call(test: impl Fn(bool, &Attack, &str)) {
    for overlapping in [false, true] {
        at_each_call(|attack| {
            test(
                overlapping,
                attack,
                &format!("overlapping {overlapping}, {attack}"),
            )
        });
    }
}

/// A fault at every call of a step graph's second launch (on another
/// stream than the first), borrowed and overlapping: the launches after
/// it, on alternating streams, run in turn with exact sums and no hazard.
#[test]
fn a_fault_at_each_call_of_a_step_launch_keeps_later_launches_in_turn() {
    each_build_at_each_call(|overlapping, attack, what| {
        let (sim, [l0, l1, a, b], sink, mut rp) = two_runners();
        let l = [l0, l1];
        let ok = {
            let step = two_step(&mut rp, &sim, &a, &b, &sink);
            let mut g = build(step, overlapping).unwrap();
            g.launch(&l[0]).unwrap();
            let second = attack.on_ok(&sim, || g.launch(&l[1]));
            if let Err(e) = &second {
                assert!(matches!(e, StepLaunchError::Backend(_)), "{e:?}");
            }
            for i in 0..4 {
                g.launch(&l[i % 2]).unwrap();
            }
            let launches = g.launches();
            assert_eq!(launches, 5 + second.is_ok() as u64, "{what}");
            launches
        };
        assert_eq!(rp.fence_stats().step_launches, ok, "{what}");
        assert_summed((&rp, &sim), &sink, 3.0 * ok as f32, what);
        rp.replay(r(1), &b).unwrap();
        drop(rp);
        assert_eq!(sim.hazards(), []);
        assert_eq!(sim.live_events(), 0, "{what}");
    });
}

/// The same for kept step graphs (`launch_kept`), with a per-runner
/// replay between launches.
#[test]
fn a_fault_at_each_call_of_a_kept_launch_keeps_later_launches_ordered() {
    each_build_at_each_call(|overlapping, attack, what| {
        let (sim, [l0, l1, a, b], sink, mut rp) = two_runners();
        let step = two_step(&mut rp, &sim, &a, &b, &sink);
        let mut kept = build(step, overlapping).unwrap().keep();
        rp.launch_kept(&mut kept, &l0).unwrap();
        let second = attack.on_ok(&sim, || rp.launch_kept(&mut kept, &l1));
        rp.launch_kept(&mut kept, &l0).unwrap();
        rp.replay(r(0), &l1).unwrap();
        rp.launch_kept(&mut kept, &l0).unwrap();
        rp.launch_kept(&mut kept, &l1).unwrap();
        let ok = 4 + second.is_ok() as u64;
        assert_eq!(kept.launches(), ok, "{what}");
        assert_eq!(rp.fence_stats().step_launches, ok, "{what}");
        assert_summed((&rp, &sim), &sink, 3.0 * ok as f32, what);
        drop((kept, rp));
        assert_eq!(sim.live_events(), 0, "{what}");
    });
}

/// Two kept step graphs of runners sharing bytes launched in turn on two
/// streams; one of them meets a fault at each call of a launch. The
/// other's next launch waits for whatever went out; sums are exact.
#[test]
fn two_kept_steps_alternating_with_a_fault_at_each_call_stay_ordered() {
    each_build_at_each_call(|overlapping, attack, what| {
        let (sim, [l0, l1, a, b], sink, mut rp) = two_runners();
        let sinks = [sink, sim.alloc_f32(N).unwrap()];
        let mut kept: Vec<_> = (0..2u32)
            .map(|i| {
                let mut step = rp.step();
                step.replay(r(i), &a).unwrap();
                step.consume(r(i), &b, |s, v| {
                    sim.launch(s, sim::Kernel::add(&v[0], &sinks[i as usize]), 40)
                })
                .unwrap();
                build(step, overlapping).unwrap().keep()
            })
            .collect();
        rp.launch_kept(&mut kept[0], &l0).unwrap();
        let failed = attack.on_ok(&sim, || rp.launch_kept(&mut kept[1], &l1));
        rp.launch_kept(&mut kept[0], &l0).unwrap();
        rp.launch_kept(&mut kept[1], &l1).unwrap();
        rp.launch_kept(&mut kept[0], &l1).unwrap();
        assert_summed((&rp, &sim), &sinks[0], 3.0, what);
        let twice = 2.0 * (1.0 + failed.is_ok() as u8 as f32);
        assert_eq!(read0(&sim, &sinks[1]), twice, "{what}");
        let launches = 4 + failed.is_ok() as u64;
        assert_eq!(rp.fence_stats().step_launches, launches, "{what}");
        drop((kept, rp));
        assert_eq!(sim.live_events(), 0, "{what}");
    });
}

/// The first launch of a step graph (borrowed and overlapping) meets a
/// fault at each of its calls after per-runner work on other streams:
/// the launches after it still wait for that work.
#[test]
fn a_first_step_launch_failing_at_each_call_still_waits_for_earlier_work() {
    each_build_at_each_call(|overlapping, attack, what| {
        let (sim, s, sink, mut rp) = two_runners::<3>();
        let side = sim.alloc_f32(N).unwrap();
        rp.replay(r(1), &s[2]).unwrap();
        rp.consume(r(1), &s[2], |st, v| {
            sim.launch(st, sim::Kernel::copy(&v[0], &side), 300)
        })
        .unwrap();
        let step = two_step(&mut rp, &sim, &s[0], &s[1], &sink);
        let mut g = build(step, overlapping).unwrap();
        let first = attack.on(&sim, || g.launch(&s[0]));
        g.launch(&s[1]).unwrap();
        g.launch(&s[0]).unwrap();
        let launches = g.launches();
        drop(g);
        assert_summed((&rp, &sim), &sink, 3.0 * launches as f32, what);
        assert_eq!(read0(&sim, &side), 2.0);
        assert_eq!(launches, 2 + first.is_ok() as u64);
    });
}

/// A step graph launched on `a`, its next launch on `b` failing, then
/// forgotten: a replay on `b` of a runner sharing the step's bytes still
/// waits for the good launch.
#[test]
fn a_forgotten_step_graph_after_a_failed_launch_orders_later_replays() {
    for call in [Call::Launch, Call::WaitEvent, Call::RecordEvent] {
        let (sim, [a, b, c], sink, mut rp) = two_runners();
        {
            let mut g = two_step(&mut rp, &sim, &a, &c, &sink).build().unwrap();
            g.launch(&a).unwrap();
            let _ = under(&sim, Faults::nth(call, 0), || g.launch(&b));
            std::mem::forget(g);
        }
        rp.replay(r(0), &b).unwrap();
        copy_out(&mut rp, &sim, r(0), &c, &sink).unwrap();
        assert_summed((&rp, &sim), &sink, 1.0, &call.to_string());
    }
}

/// A kept step graph launched (long work) and forgotten, then its plan
/// dropped: teardown waits for the launches the fence knows of, so no
/// arena is freed under them (the program's host read afterwards sees
/// the consumer's value and no hazard).
#[test]
fn a_forgotten_kept_step_with_a_failed_last_launch_is_waited_for_by_teardown() {
    for call in [
        None,
        Some(Call::Launch),
        Some(Call::RecordEvent),
        Some(Call::WaitEvent),
    ] {
        let (sim, [a, b, c], sink, mut rp) = two_runners();
        let mut kept = two_step(&mut rp, &sim, &a, &b, &sink)
            .build()
            .unwrap()
            .keep();
        rp.launch_kept(&mut kept, &a).unwrap();
        if let Some(call) = call {
            sim.inject(Faults::nth(call, 0));
        }
        let last = rp.launch_kept(&mut kept, &c);
        sim.inject(Faults::none());
        std::mem::forget(kept);
        drop(rp);
        assert_eq!(sim.live_allocations(), 1, "{call:?}: the arenas are freed");
        assert_eq!(sim.hazards(), [], "{call:?}");
        assert_eq!(
            read0(&sim, &sink),
            3.0 * (1 + last.is_ok() as u8) as f32,
            "{call:?}"
        );
    }
}

/// A fault at every call of a build (borrowed and overlapping): a failed
/// build changes no statistic, the plan carries on, teardown leaks no
/// event and no allocation.
#[test]
fn a_fault_at_each_call_of_a_build_leaves_the_plan_usable_and_leak_free() {
    each_build_at_each_call(|overlapping, attack, what| {
        let (sim, [a, b], sink, mut rp) = two_runners();
        rp.replay(r(0), &b).unwrap();
        let before = rp.fence_stats();
        let built = attack.on_ok(&sim, || {
            catch_unwind(AssertUnwindSafe(|| -> Result<(), String> {
                let mut step = rp.step();
                for i in 0..2 {
                    step.replay(r(i), &a).map_err(|e| e.to_string())?;
                    step.consume(r(i), &b, |s, v| {
                        sim.launch(s, sim::Kernel::add(&v[0], &sink), 10)
                    })
                    .map_err(|e| format!("{e:?}"))?;
                }
                let g = build(step, overlapping).map_err(|e| e.to_string())?;
                drop(g);
                Ok(())
            }))
            .expect("no panic from library code")
        });
        if built.is_err() {
            assert_eq!(rp.fence_stats(), before, "{what}");
        }
        rp.replay(r(1), &a).unwrap();
        copy_out(&mut rp, &sim, r(1), &b, &sink).unwrap();
        assert_summed((&rp, &sim), &sink, 2.0, what);
        drop(rp);
        assert_eq!(sim.live_events(), 0, "{what}");
        assert_eq!(sim.live_allocations(), 1, "{what}");
    });
}

/// A step consumer whose closure panics: the stream capture it began is
/// ended, the builder goes on, and the stream takes per-runner work after.
#[test]
fn a_panicking_step_consumer_leaves_the_builder_and_its_stream_usable() {
    let (sim, [a, b], sink, mut rp) = two_runners();
    {
        let mut step = rp.step();
        step.replay(r(0), &a).unwrap();
        let unwound = catch_unwind(AssertUnwindSafe(|| {
            step.consume(r(0), &b, |s, v| -> Result<(), String> {
                sim.launch(s, sim::Kernel::add(&v[0], &sink), 10).unwrap();
                panic!("the framework's op panicked")
            })
            .map(|_| ())
        }));
        assert!(unwound.is_err());
        step.consume(r(0), &b, |s, v| {
            sim.launch(s, sim::Kernel::add(&v[0], &sink), 10)
        })
        .unwrap();
        let mut g = step.build().unwrap();
        g.launch(&a).unwrap();
        g.launch(&b).unwrap();
    }
    rp.replay(r(1), &b).unwrap();
    copy_out(&mut rp, &sim, r(1), &a, &sink).unwrap();
    assert_summed((&rp, &sim), &sink, 2.0, "after the panic");
    assert_eq!(rp.fence_stats().step_launches, 2);
}

/// A kept step graph is its plan's only: after the plan is dropped, a
/// second plan on the same device refuses it (`ForeignStep`) even after
/// a failed launch on the first plan.
#[test]
fn a_kept_step_of_a_dropped_plan_is_foreign_to_the_next_plan() {
    let (sim, [a, b], sink, mut rp) = two_runners();
    let mut kept = two_step(&mut rp, &sim, &a, &b, &sink)
        .build()
        .unwrap()
        .keep();
    under(&sim, Faults::nth(Call::Launch, 0), || {
        assert!(rp.launch_kept(&mut kept, &a).is_err())
    });
    drop(rp);
    let mut next = fill_plan(&sim, 2, 1);
    assert!(matches!(
        next.launch_kept(&mut kept, &a),
        Err(StepLaunchError::ForeignStep)
    ));
    assert!(matches!(
        next.wait_kept(&kept, &b),
        Err(WaitError::ForeignStep)
    ));
    drop(kept);
    drop(next);
    assert_eq!(sim.hazards(), []);
    assert_eq!(sim.live_events(), 0);
}
