//! A stream of another backend (whose index aliases one of this backend's
//! streams) is never taken for one of this backend: as a launch stream, a
//! step lane or a `wait_for`/`wait_all` target it is refused, and never
//! drops a wait.
//!
//! The finding (fixed): `wait_for` and `wait_all` took a stream of another
//! backend for this backend's stream of the same index
//! (`a_stream_of_another_backend_is_never_taken_for_one_of_this_backend`);
//! stream ids now carry their backend's serial.

use crate::support::faults::build;
use crate::support::steps::overlap::*;
use crate::support::steps::plans::*;
use replay_arena::sim;
use replay_arena::RunnerId;

#[test]
fn a_stream_of_another_backend_is_never_taken_for_one_of_this_backend() -> R {
    let sim = sim::Device::new();
    let other = sim::Device::new();
    let s = sim.new_stream();
    let foreign = other.new_stream(); // index 0, as `s`
    let mut rp = temporaries_plan(&sim, &s)?;
    rp.replay(RunnerId(0), &s)?;
    assert!(rp.wait_for(RunnerId(0), &foreign).is_err());
    assert!(rp.wait_all(&foreign).is_err());
    Ok(())
}

/// Attack: streams of another sim device (whose indices alias this
/// device's streams) as launch streams, step lanes, and `wait_all`
/// targets of an overlapping step graph: refused, or at least never a
/// hazard.
#[test]
fn foreign_streams_in_overlapping_step_graphs_are_refused() {
    let sh = shape(2, 2, false, false, 2);
    let mut w = world(&sh, 2, 1);
    w.per_runner(&[P(0, 0), P(1, 1)], 1).unwrap();
    let other = sim::Device::new();
    let foreign: Vec<sim::Stream> = (0..4).map(|_| other.new_stream()).collect();
    let mut results = Vec::new();
    {
        let mut step = w.replayable.step();
        results.push((
            "foreign lane",
            step.replay(RunnerId(0), &foreign[0]).map(|_| ()).is_err(),
        ));
        drop(step);
        let mut step = w.replayable.step();
        step.replay(RunnerId(0), &w.lanes[0]).unwrap();
        step.replay(RunnerId(1), &w.lanes[1]).unwrap();
        let mut g = step.build_overlapping().unwrap();
        results.push(("foreign launch stream", g.launch(&foreign[1]).is_err()));
        g.launch(&w.lanes[0]).unwrap();
        results.push((
            "foreign launch stream after one",
            g.launch(&foreign[0]).is_err(),
        ));
        results.push(("foreign wait_all", g.wait_all(&foreign[2]).is_err()));
        std::mem::forget(g);
    }
    w.per_runner(&[P(0, 0), P(1, 1)], 1).unwrap();
    w.replayable.synchronize().unwrap();
    assert!(w.sim.hazards().is_empty(), "{:?}", w.sim.hazards());
    assert!(other.hazards().is_empty(), "{:?}", other.hazards());
    let accepted: Vec<_> = results
        .iter()
        .filter(|(_, refused)| !refused)
        .map(|(w, _)| *w)
        .collect();
    eprintln!("foreign streams accepted: {accepted:?}");
    assert!(!accepted.contains(&"foreign launch stream"));
    assert!(!accepted.contains(&"foreign wait_all"));
}

/// Attack (held, with a note): a step lane that is a stream of another sim device, whose
/// index equals a lane of this device. `StepBuilder::replay` accepts it
/// (the per-runner `replay` refuses such streams). Runner 1 shares runner
/// 0's bytes (G = 1): if the fence takes the foreign stream for this
/// device's stream of the same index, it skips runner 1's wait as "implied
/// by stream order" while the step graph puts them on two lanes.
#[test]
fn a_foreign_step_lane_aliasing_a_lane_never_drops_a_wait() {
    for overlapping in [false, true] {
        for consumer in [false, true] {
            let sh = shape(2, 1, false, false, 2);
            let mut w = world(&sh, 2, 1);
            w.per_runner(&[P(0, 0), P(1, 1)], 1).unwrap();
            let other = sim::Device::new();
            let foreign = other.new_stream(); // index 0, as w.lanes[0]
            assert_eq!(foreign.index(), w.lanes[0].index());
            let per_runner = w
                .replayable
                .replay(RunnerId(0), &foreign)
                .map_err(|e| e.to_string());
            let x = w.sim.new_stream();
            let built = {
                let mut step = w.replayable.step();
                step.replay(RunnerId(0), &w.lanes[0]).unwrap();
                let mut ok = true;
                if consumer {
                    let (sim, acc) = (&w.sim, &w.accs[0]);
                    ok &= step
                        .consume(RunnerId(0), &foreign, |s, v| {
                            sim.launch(s, sim::Kernel::add(&v[0], acc), 50)
                        })
                        .is_ok();
                }
                ok &= step.replay(RunnerId(1), &foreign).is_ok();
                if ok {
                    let g = build(step, overlapping);
                    match g {
                        Ok(mut g) => {
                            for k in 0..3 {
                                g.launch(if k % 2 == 0 { &x } else { &w.lanes[1] }).unwrap();
                            }
                            Ok(())
                        }
                        Err(e) => Err(e.to_string()),
                    }
                } else {
                    Err("refused at schedule".to_string())
                }
            };
            w.replayable.synchronize().unwrap();
            let hz = w.sim.hazards();
            eprintln!("overlapping {overlapping} consumer {consumer}: per-runner {per_runner:?}, step {built:?}");
            assert!(
                hz.is_empty(),
                "overlapping {overlapping} consumer {consumer}: {hz:?}"
            );
            assert!(other.hazards().is_empty());
            if built.is_ok() {
                // Same values as on this device's own lanes.
                let mut reference = world(&sh, 2, 1);
                reference.per_runner(&[P(0, 0), P(1, 1)], 1).unwrap();
                let items: Vec<Item> = if consumer {
                    vec![P(0, 0), C(0, 0, false, 0, 50), P(1, 0)]
                } else {
                    vec![P(0, 0), P(1, 0)]
                };
                let _ = items;
                reference.per_runner(&[P(0, 0), P(1, 0)], 3).unwrap();
                if !consumer {
                    assert_eq!(w.values(), reference.values(), "overlapping {overlapping}");
                }
            }
        }
    }
}
