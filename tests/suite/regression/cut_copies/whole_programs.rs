//! Whole programs over cut step copies (per-runner replays, a step graph,
//! a kept overlapping step, a consumer, a program wait; traced or not,
//! graphs forgotten or not), and a fault at every backend call of them.
//! Guards that the device stays hazard-free, traced and untraced values
//! agree, and teardown leaks no event, allocation or graph memory. An
//! attack that found no hole.

use std::panic::{catch_unwind, AssertUnwindSafe};

use replay_arena::sim::{self, Faults};
use replay_arena::{RunnerId, StepBuilder};

use crate::support::faults::assert_nodes_inside_launches;
use crate::support::faults::chain::{chain_faulty, chain_with, standard, Chain};

/// Schedules the replays of `layers` runners on `step`, on alternating streams of
/// `pool`: whether all were accepted (each refusal goes to `e`).
fn replay_layers(
    step: &mut StepBuilder<'_, sim::Device>,
    layers: usize,
    pool: &[sim::Stream; 2],
    e: &mut impl FnMut(Result<(), String>),
) -> bool {
    let mut ok = true;
    for l in 0..layers {
        if let Err(x) = step.replay(RunnerId(l as u32), &pool[l % 2]) {
            e(Err(x.to_string()));
            ok = false;
        }
    }
    ok
}

/// A program mixing every use of a plan of cut copies (3 copies each):
/// per-runner replays, a plain step graph launched on alternating
/// streams, a kept overlapping step graph, a consumer and a program
/// wait, all optionally traced. Returns the errors seen (none expected
/// without faults).
fn program(c: &mut Chain, trace: bool, forget: bool) -> Vec<String> {
    let mut errs = Vec::new();
    let layers = c.sinks.len();
    let pool = c.pool.clone();
    let side = c.sim.new_stream();
    let sim = c.sim.clone();
    let sink = &c.sinks[0];
    let r = c.replayable.as_mut().unwrap();
    let mut e = |x: Result<(), String>| {
        if let Err(x) = x {
            errs.push(x)
        }
    };
    for l in 0..layers {
        e(r.replay(RunnerId(l as u32), &pool[l % 2])
            .map_err(|x| x.to_string()));
    }
    if trace {
        e(r.start_trace().map_err(|x| x.to_string()));
    }
    // A plain step graph, launched on alternating streams.
    let built = {
        let mut step = r.step();
        let mut ok = replay_layers(&mut step, layers, &pool, &mut e);
        if let Err(x) = step.consume(RunnerId(layers as u32 - 1), &side, |s, v| {
            sim.launch(s, sim::Kernel::add(&v[0], sink), 3)
        }) {
            e(Err(x.to_string()));
            ok = false;
        }
        if ok {
            match step.build() {
                Ok(mut g) => {
                    for k in 0..3 {
                        e(g.launch(&pool[k % 2]).map_err(|x| x.to_string()));
                    }
                    if forget {
                        std::mem::forget(g);
                    }
                    true
                }
                Err(x) => {
                    e(Err(x.to_string()));
                    false
                }
            }
        } else {
            false
        }
    };
    let _ = built;
    // Per-runner replays between.
    for l in 0..layers {
        e(r.replay(RunnerId(l as u32), &pool[(l + 1) % 2])
            .map_err(|x| x.to_string()));
    }
    // A kept overlapping step graph.
    let mut kept = {
        let mut step = r.step();
        let ok = replay_layers(&mut step, layers, &pool, &mut e);
        if ok {
            match step.build_overlapping() {
                Ok(g) => Some(g.keep()),
                Err(x) => {
                    e(Err(x.to_string()));
                    None
                }
            }
        } else {
            None
        }
    };
    if let Some(k) = kept.as_mut() {
        for i in 0..3 {
            e(r.launch_kept(k, &pool[i % 2]).map_err(|x| x.to_string()));
        }
    }
    e(r.consume(RunnerId(layers as u32 - 1), &side, |s, v| {
        sim.launch(s, sim::Kernel::add(&v[0], sink), 7)
    })
    .map_err(|x| x.to_string()));
    e(r.wait_for(RunnerId(1), &side).map_err(|x| x.to_string()));
    if trace {
        match r.finish_trace() {
            Ok(t) => {
                // Every node sits inside its launch.
                assert_nodes_inside_launches(&t);
            }
            Err(x) => e(Err(x.to_string())),
        }
    }
    if let Some(k) = kept.as_mut() {
        e(r.launch_kept(k, &pool[1]).map_err(|x| x.to_string()));
    }
    for l in 0..layers {
        e(r.replay(RunnerId(l as u32), &pool[l % 2])
            .map_err(|x| x.to_string()));
    }
    if forget {
        std::mem::forget(kept);
    } else {
        drop(kept);
    }
    e(r.synchronize().map_err(|x| x.to_string()));
    errs
}

#[test]
fn a_whole_program_over_cut_copies_is_hazard_free_traced_or_not() {
    for trace in [false, true] {
        let mut c = chain_with(3, 2, 3, &mut standard);
        assert!(c.capture_errors.is_empty(), "{:?}", c.capture_errors);
        let errs = program(&mut c, trace, false);
        assert!(errs.is_empty(), "{errs:?}");
        c.hazard_free();
        // Same values traced and untraced.
        c.teardown();
    }
    let mut a = chain_with(3, 2, 3, &mut standard);
    let mut b = chain_with(3, 2, 3, &mut standard);
    program(&mut a, false, false);
    program(&mut b, true, false);
    assert_eq!(a.values(), b.values());
}

#[test]
fn forgetting_step_graphs_and_kept_steps_over_cut_copies_is_fenced() {
    for trace in [false, true] {
        let mut c = chain_with(3, 2, 3, &mut standard);
        let errs = program(&mut c, trace, true);
        assert!(errs.is_empty(), "{errs:?}");
        c.per_runner(2);
        c.hazard_free();
        let sim = c.sim.clone();
        c.replayable.take();
        assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
        // Forgotten graphs may keep their memory, but nothing they use
        // may have been freed under them: no hazard after teardown.
    }
}

fn fault_sweep(trace: bool, every: u64) {
    let probe = sim::Device::new();
    probe.inject(Faults::none());
    let mut c = chain_faulty(probe.clone(), 3, 2, 3, &mut standard, Some(Faults::none()));
    let errs = program(&mut c, trace, false);
    assert!(errs.is_empty(), "{errs:?}");
    c.teardown();
    let calls = probe.fault_log().calls;
    assert!(calls > 50, "{calls}");
    let mut n = 0;
    while n < calls {
        let sim = sim::Device::new();
        let mut c = chain_faulty(sim.clone(), 3, 2, 3, &mut standard, Some(Faults::at(n)));
        let injected = || sim.fault_log().injected.clone();
        if c.replayable.is_some() {
            let _ = catch_unwind(AssertUnwindSafe(|| program(&mut c, trace, false)))
                .unwrap_or_else(|_| panic!("panic in library at call {n}: {:?}", injected()));
        }
        assert!(
            sim.hazards().is_empty(),
            "fault at {n} {:?}: {:?}",
            injected(),
            sim.hazards()
        );
        let inj = injected();
        sim.inject(Faults::none());
        let ok = catch_unwind(AssertUnwindSafe(|| c.teardown()));
        assert!(ok.is_ok(), "teardown after fault at {n}: {inj:?}");
        assert_eq!(sim.live_events(), 0, "events leaked, fault at {n}: {inj:?}");
        assert_eq!(
            sim.live_allocations(),
            0,
            "allocations leaked, fault at {n}: {inj:?}"
        );
        n += every;
    }
}

#[test]
fn a_fault_at_any_call_of_an_untraced_program_over_cut_copies() {
    fault_sweep(false, 1);
}

#[test]
fn a_fault_at_any_call_of_a_traced_program_over_cut_copies() {
    fault_sweep(true, 1);
}
