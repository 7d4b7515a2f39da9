//! Attacks that found nothing, on graph memory: overlapping step graphs
//! forgotten, dropped, left unlaunched or dropped while host waits fail,
//! `trim_graph_memory` with graphs in flight, the report's temporaries
//! figures, and every way out of a plan: no arena is freed under queued
//! work and every graph-memory byte, allocation and event comes back.

use crate::support::faults::build;
use crate::support::steps::leftovers;
use crate::support::steps::overlap::*;
use crate::support::steps::plan_runners;
use replay_arena::backend::Backend;
use replay_arena::sim;
use replay_arena::{Policy, RunnerId};

/// Attack: forget an overlapping step graph after 1 or 3 launches (its
/// work still pending on the sim clock), then replan at once: the arenas
/// must not be freed under the forgotten launches (a sim error or hazard),
/// and nothing of the plan may leak but what the forgotten graph owns.
#[test]
fn replan_right_after_a_forgotten_overlapping_step_graph_is_safe() {
    for launches in [1, 2, 3] {
        for temps in [false, true] {
            let sh = shape(4, 2, true, temps, 2);
            let mut w = world(&sh, 3, 4);
            let ex = [w.sim.new_stream(), w.sim.new_stream()];
            let items = four_chain_items();
            w.stepped(&items, launches, true, true, &|k| ex[k % 2].clone())
                .unwrap();
            let World {
                sim,
                replayable,
                accs,
                lane_accs,
                one,
                sinks,
                _keep,
                lanes,
            } = w;
            let d = replayable.replan().unwrap();
            drop(d);
            // Reading a program buffer the forgotten launches wrote waits for everything.
            for b in accs.iter().chain(&lane_accs) {
                sim.read_f32(b).unwrap();
            }
            let hz = sim.hazards();
            assert!(hz.is_empty(), "{launches} launches, temps {temps}: {hz:?}");
            // What the forgotten step graph owns stays (its moved copies'
            // temporaries: runners 1 and 3, two copies each); the plan's
            // arenas are gone.
            let moved = if temps { 4 } else { 0 };
            assert_eq!(
                sim.live_allocations(),
                program_buffers(4, 3, 4) + moved,
                "{launches} launches, temps {temps}: arenas freed"
            );
            let p = sim.graph_memory_in_use().unwrap().unwrap();
            assert_eq!(
                p.used,
                moved as u64 * 4 * N as u64,
                "{launches} launches, temps {temps}"
            );
            drop((accs, lane_accs, one, sinks, _keep, lanes));
        }
    }
}

/// Attack: an overlapping step graph dropped (not forgotten), then the plan
/// dropped: every event, arena and graph memory byte is given back.
#[test]
fn dropping_an_overlapping_step_graph_and_its_plan_leaks_nothing() {
    for temps in [false, true] {
        let sh = shape(4, 2, true, temps, 2);
        let mut w = world(&sh, 3, 4);
        let ex = [w.sim.new_stream(), w.sim.new_stream(), w.sim.new_stream()];
        let items = four_chain_items();
        let events_before = w.sim.live_events();
        w.stepped(&items, 5, true, false, &|k| ex[k % 3].clone())
            .unwrap();
        assert_eq!(
            w.sim.live_events(),
            events_before,
            "temps {temps}: the step graph's events"
        );
        w.per_runner(&items, 2).unwrap();
        let sim = w.sim.clone();
        drop(w);
        assert_eq!(sim.live_allocations(), 0, "temps {temps}");
        assert_eq!(sim.live_events(), 0, "temps {temps}");
        let p = sim.graph_memory_in_use().unwrap().unwrap();
        assert_eq!((p.used, p.reserved), (0, 0), "temps {temps}");
        assert!(sim.hazards().is_empty());
    }
}

/// Attack: `trim_graph_memory` while step graphs with moved copies and
/// per-runner replays are in flight (nothing synchronized), then more
/// launches: no sim error, the right values, and the pool keeps what the
/// live graphs use.
#[test]
fn trimming_graph_memory_while_graphs_are_in_flight_is_harmless() {
    let each = 4 * N as u64;
    let sh = shape(4, 2, true, true, 2);
    let items = four_chain_items();
    let mut reference = world(&sh, 3, 4);
    reference.per_runner(&items, 1 + 6 + 1).unwrap();
    let mut w = world(&sh, 3, 4);
    w.per_runner(&items, 1).unwrap();
    w.replayable.trim_graph_memory().unwrap(); // replays in flight
    {
        let ex = [w.sim.new_stream(), w.sim.new_stream()];
        let step = step_of!(w, &items, 1).unwrap();
        let mut g = step.build_overlapping().unwrap();
        for k in 0..6 {
            g.launch(&ex[k % 2]).unwrap();
            g.replayable().trim_graph_memory().unwrap(); // launches in flight
            let p = g
                .replayable()
                .backend()
                .graph_memory_in_use()
                .unwrap()
                .unwrap();
            assert!(p.reserved >= p.used, "{p:?}");
            // The runners' own graphs (2 allocate) and the moved copies (2 x 2).
            assert_eq!(p.used, 6 * each, "{p:?}");
        }
    }
    w.replayable.trim_graph_memory().unwrap();
    assert_eq!(
        w.pool().used,
        2 * each,
        "the step graph's copies went with it"
    );
    assert_eq!(w.pool().reserved, 2 * each);
    w.per_runner(&items, 1).unwrap();
    w.replayable.trim_graph_memory().unwrap();
    assert!(w.sim.hazards().is_empty(), "{:?}", w.sim.hazards());
    assert_eq!(w.values(), reference.values());
    let report = w.replayable.report().unwrap();
    let t = report.temporaries.unwrap();
    assert_eq!(
        (t.runners, t.total, t.largest, t.in_flight, t.step_copies),
        (2, 2 * each, each, 2 * each, 0)
    );
    let gm = report.graph_memory.unwrap();
    assert_eq!(gm.used, 2 * each);
}

/// Attack: the report's temporaries figures with runners of different
/// temporary sizes: `largest`, `total`, and `in_flight` (the G largest).
#[test]
fn the_report_adds_up_uneven_temporaries() {
    let planned = plan_runners((0..4).map(|r| (RunnerId(r), [OWN])), Policy::Generations(2));
    let sim = sim::Device::new();
    let s = sim.new_stream();
    let mut capturing = planned.allocate(sim.clone()).unwrap();
    // runner r allocates r temporaries of (r + 1) * 8 floats, runner 0 none
    let sizes = [0u64, 2 * 8 * 4, 0, 2 * 3 * 8 * 4 + 4 * 8 * 4];
    for r in 0..4u32 {
        let cap = capturing.capture(RunnerId(r)).unwrap();
        let v = cap.take(OWN).unwrap();
        cap.step_copies(r as usize);
        cap.stream_capture_repeatable(&s, |st| {
            sim.launch(st, sim::Kernel::fill(&v, 1.0), 1)?;
            let lens: &[usize] = match r {
                1 => &[16],
                3 => &[48, 32],
                _ => &[],
            };
            let ts: Vec<_> = lens
                .iter()
                .map(|&l| sim.alloc_async(st, l))
                .collect::<Result<_, _>>()?;
            for t in &ts {
                sim.launch(st, sim::Kernel::fill(t, 2.0), 1)?;
            }
            for t in &ts {
                sim.free_async(st, t)?;
            }
            Ok::<(), replay_arena::Error>(())
        })
        .unwrap();
        cap.finish().unwrap();
    }
    let r = capturing.seal().unwrap();
    for k in 0..4u32 {
        let (t, copies) = r.temporaries(RunnerId(k)).unwrap();
        assert_eq!(t.bytes, sizes[k as usize], "runner {k}");
        assert_eq!(
            copies,
            if sizes[k as usize] > 0 { k as usize } else { 0 },
            "runner {k}"
        );
    }
    let t = r.report().unwrap().temporaries.unwrap();
    let (s1, s3) = (sizes[1], sizes[3]);
    assert_eq!(
        (t.runners, t.total, t.largest, t.in_flight),
        (2, s1 + s3, s3, s1 + s3)
    );
    assert_eq!(t.step_copies, s1 + 3 * s3);
    let p = sim.graph_memory_in_use().unwrap().unwrap();
    assert_eq!(p.used, 2 * s1 + 4 * s3, "own graphs and copies");
    drop(r);
    let p = sim.graph_memory_in_use().unwrap().unwrap();
    assert_eq!((p.used, p.reserved), (0, 0));
}

/// Attack: dropping a step graph (which waits for its last launch) while
/// host waits fail (a sticky device error): it must not free its graphs
/// (moved copies' temporaries) under launches still in flight. After the
/// fault clears, the pending work runs: no sim error, no hazard, and the
/// plan still tears down.
#[test]
fn dropping_a_step_graph_whose_wait_fails_frees_nothing_in_flight() {
    for overlapping in [false, true] {
        let sh = shape(4, 2, true, true, 2);
        let mut w = world(&sh, 3, 4);
        let items = four_chain_items();
        w.per_runner(&(0..4).map(|r| P(r, r % 3)).collect::<Vec<_>>(), 1)
            .unwrap();
        let ex = [w.sim.new_stream(), w.sim.new_stream()];
        let sim = w.sim.clone();
        let used_before = w.pool().used;
        {
            let step = step_of!(w, &items, 100).unwrap();
            let mut g = build(step, overlapping).unwrap();
            for k in 0..3 {
                g.launch(&ex[k % 2]).unwrap();
            }
            let pending = sim.bookkeeping().1;
            sim.fail_waits(true);
            drop(g);
            sim.fail_waits(false);
            let after = sim.bookkeeping().1;
            eprintln!("pending ops before drop {pending}, after {after}");
        }
        let p = w.pool();
        eprintln!("overlapping {overlapping}: pool {p:?} (before {used_before})");
        // Let the pending launches run.
        for b in w.accs.iter() {
            sim.read_f32(b).unwrap();
        }
        w.replayable.synchronize().unwrap();
        let hz = sim.hazards();
        assert!(hz.is_empty(), "overlapping {overlapping}: {hz:?}");
        w.per_runner(&items, 1).unwrap();
        w.replayable.synchronize().unwrap();
        assert!(sim.hazards().is_empty());
    }
}

/// Attack: every way out of a plan whose graphs hold temporaries and step
/// copies (an unsealed `Capturing` replanned, a failed seal replanned, a
/// `Replayable` replanned after an overlapping step graph) gives every
/// graph memory byte, arena and event back.
#[test]
fn every_way_out_gives_graph_memory_back() {
    let capture_some = |upto: u32| {
        let planned = plan_runners((0..3).map(|r| (RunnerId(r), [OWN])), Policy::Generations(2));
        let sim = sim::Device::new();
        let s = sim.new_stream();
        let mut capturing = planned.allocate(sim.clone()).unwrap();
        for r in 0..upto {
            let cap = capturing.capture(RunnerId(r)).unwrap();
            let v = cap.take(OWN).unwrap();
            cap.step_copies(3);
            cap.stream_capture_repeatable(&s, |st| with_temporary(&sim, st, &v))
                .unwrap();
            cap.finish().unwrap();
        }
        (sim, s, capturing)
    };
    let clean = |sim: &sim::Device, what: &str| {
        assert_eq!(leftovers(sim), (0, 0, 0, 0), "{what}");
    };
    // Unsealed, replanned.
    let (sim, _s, capturing) = capture_some(3);
    assert!(sim.graph_memory_in_use().unwrap().unwrap().used > 0);
    drop(capturing.replan());
    clean(&sim, "unsealed capturing replanned");
    // A failed seal, replanned.
    let (sim, _s, capturing) = capture_some(2);
    let capturing = match capturing.seal() {
        Ok(_) => panic!("sealed without runner 2"),
        Err(e) => e.into_capturing(),
    };
    drop(capturing.replan());
    clean(&sim, "failed seal replanned");
    // Replayable replanned after an overlapping step graph and per-runner replays.
    let (sim, s, capturing) = capture_some(3);
    let mut r = capturing.seal().unwrap();
    let t = sim.new_stream();
    for k in 0..3u32 {
        r.replay(RunnerId(k), if k % 2 == 0 { &s } else { &t })
            .unwrap();
    }
    {
        let mut step = r.step();
        for k in 0..3u32 {
            step.replay(RunnerId(k), if k % 2 == 0 { &s } else { &t })
                .unwrap();
        }
        let mut g = step.build_overlapping().unwrap();
        let x = sim.new_stream();
        for k in 0..4 {
            g.launch(if k % 2 == 0 { &x } else { &t }).unwrap();
        }
    }
    r.replay(RunnerId(0), &t).unwrap();
    drop(r.replan().unwrap());
    clean(&sim, "replayable replanned");
    assert!(sim.hazards().is_empty());
}

/// Attack: step builders dropped unbuilt (after consumers were captured
/// and copies scheduled) and overlapping step graphs built and dropped
/// unlaunched, many times over: no event, allocation or graph memory
/// piles up, and the copies stay.
#[test]
fn builders_and_unlaunched_step_graphs_leave_nothing_behind() {
    let sh = shape(3, 2, true, true, 2);
    let mut w = world(&sh, 3, 3);
    let items = vec![
        P(0, 0),
        C(0, 2, false, 0, 10),
        P(1, 1),
        C(1, 2, true, 1, 10),
        P(2, 0),
        C(2, 1, false, 2, 10),
    ];
    w.per_runner(&items, 1).unwrap();
    w.replayable.synchronize().unwrap();
    w.replayable.trim_graph_memory().unwrap();
    let base = (w.sim.live_events(), w.sim.live_allocations(), w.pool());
    for round in 0..20 {
        let step = step_of!(w, &items, 1).unwrap();
        if round % 2 == 0 {
            drop(step);
        } else {
            // Built but never launched: the moved copies are gone with it.
            drop(step.build_overlapping().unwrap());
            break;
        }
        w.replayable.trim_graph_memory().unwrap();
        assert_eq!(
            (w.sim.live_events(), w.sim.live_allocations(), w.pool()),
            base,
            "round {round}"
        );
    }
    // Runner 1 (temporaries) used its two copies in the one build.
    assert_eq!(w.replayable.temporaries(RunnerId(1)).unwrap().1, 0);
    w.replayable.trim_graph_memory().unwrap();
    let each = 4 * N as u64;
    assert_eq!(w.pool().used, base.2.used - 2 * each);
    assert_eq!(w.sim.live_events(), base.0);
    w.per_runner(&items, 1).unwrap();
    assert!(w.sim.hazards().is_empty());
}
