//! Attacks that found nothing: overlapping step graphs (`build_overlapping`)
//! and single step graphs, launched on one, two or three streams, on the
//! schedule's own lanes and in odd patterns, against the same schedule run
//! per runner. Consumers that write, consumers of runners the step does
//! not replay, handoffs read across steps, a runner twice per step, a
//! runner without bytes, `consume_many`: the same values and no hazard.

use crate::support::capture_view;
use crate::support::steps::allocate_discovered;
use crate::support::steps::overlap::*;
use replay_arena::sim;
use replay_arena::{Discovering, PlanConfig, Policy, RunnerId};

/// Attack: overlapping step graphs launched on 1, 2, 3 streams, on the
/// schedule's own lanes and in odd patterns, with consumers that write,
/// consumers of runners the step does not replay, temporaries, a runner
/// twice per step, dropped or forgotten: the same values and no hazard as
/// the same schedule per runner.
#[test]
fn overlapping_step_graphs_in_odd_launch_patterns_match_the_host_fence() {
    for (name, sh, lanes, accs, items) in schedules() {
        for (pat, launch) in patterns(lanes) {
            for forget in [false, true] {
                for steps in [1, 3, 7] {
                    let what = format!("{name} / {pat} / forget {forget} / {steps} steps");
                    compare(
                        &sh, lanes, accs, &items, steps, true, forget, &*launch, &what,
                    );
                }
            }
        }
    }
}

/// The same against single step graphs (regression for `build`).
#[test]
fn single_step_graphs_in_odd_launch_patterns_match_the_host_fence() {
    for (name, mut sh, lanes, accs, items) in schedules() {
        sh.copies = 2;
        for (pat, launch) in patterns(lanes) {
            let what = format!("{name} / {pat}");
            compare(&sh, lanes, accs, &items, 4, false, false, &*launch, &what);
        }
    }
}

/// Attack: handoffs read across steps: each reader replayed in the step
/// before its writer (it reads what the step before wrote), with ready
/// points and temporaries, in overlapping graphs over odd launch patterns:
/// the cross-step edges must hold the writer's next write after the read
/// and the read after the write of the launch before.
#[test]
fn handoffs_read_across_overlapping_launches_match_the_host_fence() {
    for temps in [false, true] {
        for g in [1, 2, 3] {
            let sh = shape(3, g, true, temps, 2);
            let warm = [P(0, 0), P(1, 1)];
            let items = [
                P(2, 0),
                C(2, 2, false, 0, 30),
                P(0, 1),
                C(0, 2, true, 1, 50),
                P(1, 0),
                C(1, 1, false, 2, 5),
            ];
            for (pat, launch) in patterns(3) {
                for forget in [false, true] {
                    let what =
                        format!("rotated chain, G = {g}, temps {temps} / {pat} / forget {forget}");
                    compare_w(&sh, 3, 3, &warm, &items, 5, true, forget, &*launch, &what);
                }
            }
        }
    }
}

/// Attack: two overlapping step graphs of different schedules in turn on
/// one plan (the first forgotten), per-runner steps between and after.
#[test]
fn two_overlapping_step_graphs_in_turn_with_per_runner_steps_between() {
    let sh = shape(4, 2, true, false, 2);
    let a_items = four_chain_items();
    let b_items = vec![
        P(0, 1),
        C(0, 0, true, 0, 10),
        P(1, 2),
        P(2, 1),
        C(1, 0, false, 1, 90),
        C(2, 2, false, 2, 5),
        P(3, 0),
        C(3, 1, true, 3, 20),
    ];
    let warm: Vec<Item> = (0..4).map(|r| P(r, r % 3)).collect();
    let mut reference = world(&sh, 3, 4);
    reference.per_runner(&warm, 1).unwrap();
    reference.per_runner(&a_items, 3).unwrap();
    reference.per_runner(&b_items, 1).unwrap();
    reference.per_runner(&b_items, 4).unwrap();
    reference.per_runner(&a_items, 1).unwrap();
    let mut w = world(&sh, 3, 4);
    w.per_runner(&warm, 1).unwrap();
    let ex: Vec<sim::Stream> = (0..3).map(|_| w.sim.new_stream()).collect();
    w.stepped(&a_items, 3, true, true, &|k| ex[k % 2].clone())
        .unwrap();
    w.per_runner(&b_items, 1).unwrap();
    let lanes = w.lanes.clone();
    w.stepped(&b_items, 4, true, false, &|k| {
        if k % 2 == 0 {
            lanes[0].clone()
        } else {
            ex[2].clone()
        }
    })
    .unwrap();
    w.per_runner(&a_items, 1).unwrap();
    assert!(w.sim.hazards().is_empty(), "{:?}", w.sim.hazards());
    assert_eq!(w.values(), reference.values());
}

/// Attack: steps of consumers only (no replay at all): writers and readers
/// of runners the step never replays, on one or several lanes, in
/// overlapping graphs over every launch pattern.
#[test]
fn steps_of_consumers_only_match_the_host_fence() {
    let cases: Vec<(&str, Vec<Item>)> = vec![
        ("one writer", vec![C(0, 0, true, 0, 30)]),
        (
            "writer then reader, two lanes",
            vec![C(0, 0, true, 0, 30), C(0, 1, false, 1, 50)],
        ),
        (
            "reader then writer, two lanes",
            vec![C(1, 1, false, 0, 50), C(1, 0, true, 1, 5)],
        ),
        (
            "two writers of two runners, one lane",
            vec![C(0, 1, true, 0, 30), C(1, 1, true, 1, 30)],
        ),
        (
            "readers of both on lane 0, writer of one on lane 2",
            vec![
                C(0, 0, false, 0, 40),
                C(1, 0, false, 1, 40),
                C(1, 2, true, 2, 1),
            ],
        ),
    ];
    for (name, items) in cases {
        for temps in [false, true] {
            let sh = shape(2, 2, false, temps, 2);
            for (pat, launch) in patterns(3) {
                for forget in [false, true] {
                    let what = format!("{name}, temps {temps} / {pat} / forget {forget}");
                    compare(&sh, 3, 3, &items, 5, true, forget, &*launch, &what);
                }
            }
        }
    }
}

/// Attack: `consume_mut` of a handoff's reader or writer writes every view
/// it is handed (the reader's received view too, if it gets one) while the
/// other side of the handoff replays on another stream, per runner and in
/// overlapping step graphs: never a hazard.
#[test]
fn consume_mut_on_either_side_of_a_handoff_never_races_the_other_side() {
    for (name, items) in [
        (
            "writer's consumer writes while the reader reads",
            vec![P(0, 0), C(0, 2, true, 0, 80), P(1, 1), C(1, 2, false, 1, 5)],
        ),
        (
            "reader's consumer writes while the writer rewrites",
            vec![P(0, 0), P(1, 1), C(1, 2, true, 0, 80)],
        ),
        (
            "reader's consumer writes, writer next on its own lane",
            vec![P(1, 1), C(1, 0, true, 0, 80), P(0, 2)],
        ),
    ] {
        for g in [1, 2] {
            let sh = shape(2, g, true, false, 2);
            let warm = if matches!(items[0], P(1, _)) {
                vec![P(0, 0)]
            } else {
                vec![]
            };
            // how many views does a consumer of each get?
            let mut w = world(&sh, 3, 2);
            w.per_runner(&[P(0, 0), P(1, 1)], 1).unwrap();
            let n0 = w.replayable.views(RunnerId(0)).unwrap().len();
            let n1 = w.replayable.views(RunnerId(1)).unwrap().len();
            let wrote_all = |w: &mut World, r: u32| {
                let sim = w.sim.clone();
                let lane = w.lanes[2].clone();
                w.replayable
                    .consume_mut(RunnerId(r), &lane, |s, v| {
                        for x in v {
                            sim.launch(s, sim::Kernel::fill(x, 7.0), 100)?;
                        }
                        Ok::<(), replay_arena::Error>(())
                    })
                    .map(|_| ())
            };
            let e1 = wrote_all(&mut w, 1);
            w.replayable
                .replay(RunnerId(0), &w.lanes[0].clone())
                .unwrap();
            let e0 = wrote_all(&mut w, 0);
            w.replayable
                .replay(RunnerId(1), &w.lanes[1].clone())
                .unwrap();
            w.replayable.synchronize().unwrap();
            assert!(
                w.sim.hazards().is_empty(),
                "{name} G {g}: views {n0}/{n1}, {e0:?} {e1:?}: {:?}",
                w.sim.hazards()
            );
            for (pat, launch) in patterns(3) {
                let what = format!("{name}, G = {g} / {pat}");
                compare_w(&sh, 3, 2, &warm, &items, 4, true, false, &*launch, &what);
            }
        }
    }
}

/// Attack: a runner that requests nothing (no bytes, never fenced) but
/// whose graph allocates temporaries, replayed twice per step on two lanes
/// in overlapping step graphs launched on alternating streams, beside a
/// runner with bytes: no hazard (its copies' temporaries are their own),
/// the report and `temporaries` count it, teardown gives it all back.
#[test]
fn a_runner_without_bytes_but_with_temporaries_in_overlapping_step_graphs() {
    let mut d = Discovering::new(PlanConfig::new());
    d.arm(RunnerId(0)).unwrap().record(OWN).unwrap();
    d.arm(RunnerId(1)).unwrap();
    let sim = sim::Device::new();
    let [a, b, x, y] = crate::support::streams(&sim);
    let sink = sim.alloc_f32(N).unwrap();
    let mut capturing = allocate_discovered(&sim, d, Policy::Generations(1));
    {
        capture_view(&mut capturing, RunnerId(0), OWN, &a, |s, v| {
            sim.launch(s, sim::Kernel::fill(&v, 1.0), 5)
        });
    }
    {
        let cap = capturing.capture(RunnerId(1)).unwrap();
        cap.step_copies(4);
        let mut runs = 0;
        cap.stream_capture_repeatable(&a, |s| {
            runs += 1;
            let t = sim.alloc_async(s, N)?;
            sim.launch(s, sim::Kernel::fill(&t, 5.0), 50)?;
            sim.launch(s, sim::Kernel::scale(&t, 2.0), 50)?;
            sim.free_async(s, &t)?;
            Ok::<(), replay_arena::Error>(())
        })
        .unwrap();
        cap.finish().unwrap();
        assert_eq!(runs, 5);
    }
    let _ = &sink;
    let mut rp = capturing.seal().unwrap();
    let (t, copies) = rp.temporaries(RunnerId(1)).unwrap();
    assert_eq!((t.bytes, copies), (4 * N as u64, 4));
    let rep = rp.report().unwrap().temporaries.unwrap();
    assert_eq!(
        (rep.runners, rep.total, rep.step_copies),
        (1, t.bytes, 4 * t.bytes)
    );
    rp.replay(RunnerId(1), &a).unwrap();
    rp.replay(RunnerId(1), &b).unwrap();
    {
        let mut step = rp.step();
        step.replay(RunnerId(1), &a).unwrap();
        step.replay(RunnerId(0), &b).unwrap();
        step.replay(RunnerId(1), &b).unwrap();
        let mut g = step.build_overlapping().unwrap();
        for k in 0..5 {
            g.launch(if k % 2 == 0 { &x } else { &y }).unwrap();
        }
        std::mem::forget(g);
    }
    rp.replay(RunnerId(1), &x).unwrap();
    rp.replay(RunnerId(0), &y).unwrap();
    rp.synchronize().unwrap();
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    assert_eq!(rp.temporaries(RunnerId(1)).unwrap().1, 0);
}

/// Attack: `consume_many` over runners of different generations (one
/// replayed in the step, one not; one with temporaries; a runner listed
/// twice) in overlapping step graphs over odd launch patterns, against the
/// same schedule per runner.
#[test]
fn consume_many_in_overlapping_step_graphs_matches_the_host_fence() {
    let runner_sets: Vec<Vec<u32>> = vec![vec![0, 1], vec![1, 2, 0], vec![2, 2]];
    for set in runner_sets {
        for (pat, launch) in patterns(3) {
            let sh = shape(3, 3, false, true, 2);
            let items = [P(1, 0), P(2, 1)];
            let run = |graphed: bool| -> (Vec<Vec<f32>>, Vec<sim::Hazard>) {
                let mut w = world(&sh, 3, 1);
                w.per_runner(&[P(0, 0), P(1, 1), P(2, 2)], 1).unwrap();
                let ids: Vec<RunnerId> = set.iter().map(|&r| RunnerId(r)).collect();
                let steps = 5;
                if graphed {
                    let all = w.launch_streams();
                    let mut step = w.replayable.step();
                    for &it in &items {
                        if let P(r, l) = it {
                            step.replay(RunnerId(r as u32), &w.lanes[l]).unwrap();
                        }
                    }
                    step.consume_many(&ids, &w.lanes[2], many_work(&w.sim, &w.accs[0]))
                        .unwrap();
                    let mut g = step.build_overlapping().unwrap();
                    for k in 0..steps {
                        g.launch(&all[launch(k) % all.len()]).unwrap();
                    }
                } else {
                    for _ in 0..steps {
                        w.per_runner(&items, 1).unwrap();
                        w.replayable
                            .consume_many(&ids, &w.lanes[2], many_work(&w.sim, &w.accs[0]))
                            .unwrap();
                    }
                }
                w.per_runner(&items, 1).unwrap();
                w.replayable.synchronize().unwrap();
                (w.values(), w.sim.hazards())
            };
            let (host, hz_host) = run(false);
            let (step, hz_step) = run(true);
            assert!(
                hz_host.is_empty() && hz_step.is_empty(),
                "{set:?} / {pat}: {hz_step:?}"
            );
            assert_eq!(step, host, "{set:?} / {pat}");
        }
    }
}

fn many_work<'a>(
    sim: &'a sim::Device,
    acc: &'a sim::HostBuffer,
) -> impl FnOnce(
    &sim::Stream,
    &[&[replay_arena::View<'_, replay_arena::ReadOnly>]],
) -> replay_arena::Result<()>
       + 'a {
    move |s, vs| {
        for v in vs {
            sim.launch(s, sim::Kernel::add(&v[0], acc), 25)?;
        }
        Ok(())
    }
}
