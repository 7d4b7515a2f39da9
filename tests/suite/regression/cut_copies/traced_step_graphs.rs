//! Traced step graphs: kept steps launched traced and untraced in turn,
//! mixed cut copies and copied graphs, traces restarted while launches are
//! in flight, event creation failing with no marks made ahead, and kept
//! steps outliving a `replan` with a trace running. Guards that traced and
//! untraced launches agree, every node sits inside its launch, and no
//! event leaks. An attack that found no hole.

use replay_arena::sim::{self, Call, Faults};
use replay_arena::RunnerId;

use crate::support::attacks::{assert_hazard_free, launch_in_turn};
use crate::support::faults::chain::{chain_on, chain_with, kept_of, plain, standard, Chain, Ctx};
use crate::support::faults::{assert_no_graph_memory, assert_nodes_inside_launches, R};

#[test]
fn kept_steps_launched_traced_and_untraced_alternately_on_two_streams() {
    for work in [plain as fn(&Ctx, &sim::Stream) -> R, standard] {
        for overlapping in [false, true] {
            let copies = 2;
            let mut reference = chain_with(4, 2, copies, &mut |c, s| work(c, s));
            reference.per_runner(12);
            let mut c = chain_with(4, 2, copies, &mut |c, s| work(c, s));
            let mut kept = kept_of(&mut c, overlapping);
            let pool = c.pool.clone();
            let third = c.sim.new_stream();
            let r = c.r();
            let mut traces = Vec::new();
            for k in 0..12 {
                match k % 4 {
                    0 => r.start_trace().unwrap(),
                    2 => traces.push(r.finish_trace().unwrap()),
                    _ => {}
                }
                let s = [&pool[0], &pool[1], &third][k % 3];
                r.launch_kept(&mut kept, s).unwrap();
            }
            // A trace left running when the plan goes.
            r.start_trace().unwrap();
            r.launch_kept(&mut kept, &pool[1]).unwrap();
            drop(kept);
            c.hazard_free();
            for t in &traces {
                assert_nodes_inside_launches(t);
            }
            reference.per_runner(1);
            assert_eq!(c.values(), reference.values(), "overlapping {overlapping}");
            c.r().replay(RunnerId(0), &pool[0]).unwrap();
            c.teardown();
        }
    }
}

#[test]
fn traced_kept_step_values_equal_untraced() {
    for overlapping in [false, true] {
        let mut vals = Vec::new();
        for trace in [false, true] {
            let mut c = chain_with(4, 2, 2, &mut plain);
            let mut kept = kept_of(&mut c, overlapping);
            let pool = c.pool.clone();
            let r = c.r();
            if trace {
                r.start_trace().unwrap();
            }
            for k in 0..6 {
                r.launch_kept(&mut kept, &pool[k % 2]).unwrap();
                if k == 3 && trace {
                    // restart while launches are in flight
                    r.start_trace().unwrap();
                }
            }
            if trace {
                let t = r.finish_trace().unwrap();
                assert!(!t.step_nodes().is_empty());
            }
            drop(kept);
            c.hazard_free();
            vals.push(c.values());
            c.teardown();
        }
        assert_eq!(vals[0], vals[1], "overlapping {overlapping}");
    }
}

#[test]
fn a_fault_at_any_call_of_traced_kept_launches_of_copied_graphs() {
    // Count the calls of the launches alone, then fail each.
    let run = |faults: Option<Faults>| -> (Chain, u64) {
        let mut c = chain_with(4, 2, 2, &mut plain);
        let mut kept = kept_of(&mut c, true);
        let pool = c.pool.clone();
        let sim = c.sim.clone();
        let r = c.r();
        r.start_trace().unwrap();
        if let Some(f) = faults {
            sim.inject(f);
        } else {
            sim.inject(Faults::none());
        }
        for k in 0..4 {
            let _ = r.launch_kept(&mut kept, &pool[k % 2]);
            if k == 1 {
                let _ = r.finish_trace();
                let _ = r.start_trace();
            }
        }
        let _ = r.replay(RunnerId(0), &pool[1]);
        let _ = r.finish_trace();
        let calls = sim.fault_log().calls;
        sim.inject(Faults::none());
        drop(kept);
        (c, calls)
    };
    let (c, calls) = run(None);
    c.hazard_free();
    c.teardown();
    for n in 0..calls {
        let (c, _) = run(Some(Faults::at(n)));
        assert_hazard_free(&c.sim, format!("fault at {n}"));
        c.teardown();
    }
}

#[test]
fn a_step_graph_mixing_cut_copies_and_copied_graphs_traced() {
    // Runner 0 allocates (a cut copy moves in), runner 1 does not (its
    // graph is copied): traced and untraced launches agree.
    let mut vals = Vec::new();
    for trace in [false, true] {
        let mut c = chain_with(3, 2, 1, &mut |c, s| {
            if c.layer == 1 {
                plain(c, s)
            } else {
                standard(c, s)
            }
        });
        let (pool, sim, side, sink) = c.apart();
        let r = c.r();
        if trace {
            r.start_trace().unwrap();
        }
        {
            let mut step = r.step();
            for l in 0..3u32 {
                step.replay(RunnerId(l), &pool[l as usize % 2]).unwrap();
                step.consume(RunnerId(l), &side, |s, v| {
                    sim.launch(s, sim::Kernel::add(&v[0], &sink), 4)
                })
                .unwrap();
            }
            launch_in_turn(&mut step.build().unwrap(), &pool, 4);
        }
        if trace {
            let t = r.finish_trace().unwrap();
            assert_nodes_inside_launches(&t);
        }
        c.hazard_free();
        let mut v = c.values();
        v.push(sim.read_f32(&sink).unwrap());
        vals.push(v);
        drop(sink);
        c.teardown();
    }
    assert_eq!(vals[0], vals[1]);
}

#[test]
fn traced_launches_with_no_marks_made_ahead_and_failing_event_creation() {
    for k in 0..24u64 {
        for overlapping in [false, true] {
            let mut c = chain_with(3, 2, 2, &mut plain);
            let mut kept = kept_of(&mut c, overlapping);
            let pool = c.pool.clone();
            let sim = c.sim.clone();
            let r = c.r();
            r.start_trace_with_capacity(0).unwrap();
            sim.inject(Faults::nth(Call::CreateEvent, k));
            for i in 0..4 {
                let _ = r.launch_kept(&mut kept, &pool[i % 2]);
                let _ = r.replay(RunnerId(0), &pool[(i + 1) % 2]);
                let _ = r.replay(RunnerId(1), &pool[i % 2]);
                let _ = r.replay(RunnerId(2), &pool[(i + 1) % 2]);
            }
            let _ = r.finish_trace();
            sim.inject(Faults::none());
            r.launch_kept(&mut kept, &pool[0]).unwrap();
            drop(kept);
            assert_hazard_free(&sim, format!("k {k}"));
            c.teardown();
            assert_eq!(sim.live_events(), 0, "k {k}");
        }
    }
}

#[test]
fn kept_cut_steps_outliving_a_replan_with_a_trace_running() {
    let mut c = chain_with(3, 2, 3, &mut standard);
    let mut kept = kept_of(&mut c, true);
    let mut plain_kept = kept_of(&mut c, false);
    let lanes = c.pool.clone();
    let sim = c.sim.clone();
    let r = c.replayable.take().unwrap();
    let mut r = r;
    r.start_trace().unwrap();
    r.launch_kept(&mut kept, &lanes[0]).unwrap();
    r.launch_kept(&mut plain_kept, &lanes[1]).unwrap();
    r.launch_kept(&mut kept, &lanes[1]).unwrap();
    let d = r.replan().unwrap();
    drop(d);
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    // A second plan on the same device: the old kept step is refused.
    let mut c2 = chain_on(sim.clone(), 3, 2, 1, &mut standard);
    let r2 = c2.r();
    assert!(r2.launch_kept(&mut kept, &lanes[0]).is_err());
    drop(kept);
    drop(plain_kept);
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    c2.teardown();
    drop(c);
    assert_no_graph_memory(&sim, "after the drop");
}
