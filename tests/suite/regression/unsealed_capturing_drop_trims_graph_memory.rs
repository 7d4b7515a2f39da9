//! Finding: a `Capturing` dropped unsealed (a closure that panicked, a
//! failed `seal` passed on with `?`, or simply dropped) left the pool's
//! reservation behind: the memory in use went back to 0, the reserved
//! memory did not. It now trims graph memory after its graphs are gone,
//! as `replan` and a sealed plan's teardown do. Guards that no graph
//! memory is used or reserved after each such drop.

use crate::support::record_and_finish;
use std::panic::{catch_unwind, AssertUnwindSafe};

use replay_arena::backend::Streams;
use replay_arena::sim;
use replay_arena::{CaptureError, Discovering, PlanConfig, Policy, RunnerId, StreamCaptureError};

use crate::support::faults::chain::{chain_on, OWN};
use crate::support::faults::fan::{self, Spec};
use crate::support::faults::{assert_no_graph_memory, graph_memory, refused, writer_of, N, R};
use crate::support::steps::allocate_discovered;

#[test]
fn dropping_a_capturing_with_temporaries_gives_graph_memory_back() {
    let sim = sim::Device::new();
    let s = sim.new_stream();
    {
        let planned = Discovering::from_runners(PlanConfig::new(), [(RunnerId(0), [OWN])])
            .unwrap()
            .plan(Policy::Generations(1))
            .unwrap();
        let mut capturing = planned.allocate(sim.clone()).unwrap();
        let cap = capturing.capture(RunnerId(0)).unwrap();
        let v = cap.take(OWN).unwrap();
        record_and_finish!(cap, &s, |s| -> R {
            let t = sim.alloc_async(s, N)?;
            sim.launch(s, sim::Kernel::fill(&t, 1.0), 1)?;
            sim.launch(s, sim::Kernel::copy(&t, &v), 1)?;
            Ok(sim.free_async(s, &t)?)
        });
        // dropped here without seal or replan
    }
    assert_no_graph_memory(&sim, "after the drop");
}

#[test]
fn panic_after_the_cut_with_a_live_temporary_leaks_nothing() {
    let sim = sim::Device::new();
    let s2 = sim.clone();
    let out = catch_unwind(AssertUnwindSafe(|| {
        chain_on(s2, 2, 1, 1, &mut |c, s| {
            let t = c.sim.alloc_async(s, N)?;
            c.sim.launch(s, sim::Kernel::copy(c.count, &t), 1)?;
            if let Some((h, out)) = c.out {
                c.sim.launch(s, sim::Kernel::copy(&t, out), 2)?;
                c.cap.ready(h, s)?;
            }
            // temporary still live across the cut
            assert!(c.run < 2, "second run panics after the cut");
            c.sim.launch(s, sim::Kernel::copy(&t, c.own), 1)?;
            Ok(c.sim.free_async(s, &t)?)
        })
    }));
    assert!(out.is_err());
    assert!(sim.hazards().is_empty());
    assert_no_graph_memory(&sim, "after the drop");
}

fn seal_with_question_mark(sim: &sim::Device) -> replay_arena::Result<()> {
    let planned = Discovering::from_runners(
        PlanConfig::new(),
        [(RunnerId(0), [OWN]), (RunnerId(1), [OWN])],
    )?
    .plan(Policy::Generations(1))?;
    let s = sim.new_stream();
    let mut capturing = planned.allocate(sim.clone())?;
    let cap = capturing.capture(RunnerId(0))?;
    let v = cap.take(OWN)?;
    cap.stream_capture_repeatable(&s, |s| -> R {
        let t = sim.alloc_async(s, N)?;
        sim.launch(s, sim::Kernel::fill(&t, 1.0), 1)?;
        sim.launch(s, sim::Kernel::copy(&t, &v), 1)?;
        Ok(sim.free_async(s, &t)?)
    })
    .map_err(|e| e.to_string())
    .unwrap();
    cap.finish()?;
    // Runner 1 is never captured: the seal fails and `?` drops the
    // Capturing, as the SealError docs describe.
    let _r = capturing.seal()?;
    Ok(())
}

#[test]
fn a_failed_seal_propagated_with_question_mark_gives_graph_memory_back() {
    let sim = sim::Device::new();
    assert!(seal_with_question_mark(&sim).is_err());
    assert_no_graph_memory(&sim, "after the drop");
}

#[test]
fn capturing_dropped_unsealed_with_cut_copies_trims_graph_memory() {
    // Dropped after the writer's capture (cut copies held), before the
    // readers' captures.
    for copies in [1, 3] {
        let sim = sim::Device::new();
        let mut d = Discovering::new(PlanConfig::new());
        let hs = writer_of(&mut d, 3, fan::OWN, fan::GRAD);
        for i in 0..3 {
            d.arm(RunnerId(i + 1))
                .unwrap()
                .receive(hs[i as usize])
                .unwrap();
        }
        let s = sim.new_stream();
        let mut capturing = allocate_discovered(&sim, d, Policy::Generations(2));
        {
            let cap = capturing.capture(RunnerId(0)).unwrap();
            cap.step_copies(copies);
            let own = cap.take(fan::OWN).unwrap();
            let xs: Vec<_> = hs.iter().map(|h| cap.hand_off(*h).unwrap()).collect();
            cap.stream_capture_repeatable(&s, |s| -> R {
                let t = sim.alloc_async(s, fan::N)?;
                sim.launch(s, sim::Kernel::fill(&t, 1.0), 1)?;
                for i in 0..3 {
                    sim.launch(s, sim::Kernel::copy(&t, &xs[i]), 1)?;
                    cap.ready(hs[i], s)?;
                }
                sim.launch(s, sim::Kernel::copy(&t, &own), 1)?;
                sim.free_async(s, &t)?;
                Ok(())
            })
            .unwrap();
            cap.finish().unwrap();
        }
        assert!(graph_memory(&sim).used > 0);
        drop(capturing);
        assert_no_graph_memory(&sim, format_args!("copies {copies}"));
        assert!(sim.hazards().is_empty());
        assert_eq!(sim.live_events(), 0);
    }
}

#[test]
fn capturing_dropped_unsealed_with_a_runner_open_is_refused_or_trims() {
    // A failing capture, then the plan dropped; also one forgotten.
    for forget in [false, true] {
        let sim = sim::Device::new();
        let mut d = Discovering::new(PlanConfig::new());
        d.arm(RunnerId(0)).unwrap().record(fan::OWN).unwrap();
        d.arm(RunnerId(1)).unwrap().record(fan::OWN).unwrap();
        let s = sim.new_stream();
        let mut capturing = allocate_discovered(&sim, d, Policy::Generations(1));
        for r in 0..2 {
            let cap = capturing.capture(RunnerId(r)).unwrap();
            cap.step_copies(2);
            let v = cap.take(fan::OWN).unwrap();
            let _ = cap.stream_capture_repeatable(&s, |s| -> R {
                let t = sim.alloc_async(s, fan::N)?;
                sim.launch(s, sim::Kernel::fill(&t, 1.0), 1)?;
                sim.launch(s, sim::Kernel::copy(&t, &v), 1)?;
                sim.free_async(s, &t)?;
                if r == 1 {
                    return Err(refused("fails"));
                }
                Ok(())
            });
            let _ = cap.finish();
        }
        if forget {
            std::mem::forget(capturing);
            // Leaks are allowed, hazards are not.
            assert!(sim.hazards().is_empty());
        } else {
            drop(capturing);
            assert_no_graph_memory(&sim, "after the drop");
        }
    }
}

#[test]
fn a_failing_or_panicking_copy_run_between_cuts_leaks_nothing() {
    // The writer's copy fails (or panics) after its first cut, holding a
    // temporary allocated before it.
    for panic in [false, true] {
        let sim = sim::Device::new();
        let spec = Spec::new(3);
        let mut d = Discovering::new(PlanConfig::new());
        let hs = writer_of(&mut d, 3, fan::OWN, fan::GRAD);
        let _ = spec;
        let s = sim.new_stream();
        let mut capturing = allocate_discovered(&sim, d, Policy::Generations(1));
        {
            let cap = capturing.capture(RunnerId(0)).unwrap();
            let own = cap.take(fan::OWN).unwrap();
            let xs: Vec<_> = hs.iter().map(|h| cap.hand_off(*h).unwrap()).collect();
            let mut run = 0;
            let res = catch_unwind(AssertUnwindSafe(|| {
                cap.stream_capture_repeatable(&s, |s| -> R {
                    run += 1;
                    let t = sim.alloc_async(s, fan::N)?;
                    sim.launch(s, sim::Kernel::fill(&t, 2.0), 1)?;
                    for i in 0..3 {
                        sim.launch(s, sim::Kernel::copy(&t, &xs[i]), 1)?;
                        cap.ready(hs[i], s)?;
                        if run == 2 && i == 1 {
                            if panic {
                                panic!("copy run panics between cuts");
                            }
                            return Err(refused("between cuts"));
                        }
                    }
                    sim.launch(s, sim::Kernel::copy(&t, &own), 1)?;
                    sim.free_async(s, &t)?;
                    Ok(())
                })
            }));
            match res {
                Ok(r) => assert!(matches!(r, Err(StreamCaptureError::Work(_))), "{r:?}"),
                Err(_) => assert!(panic),
            }
            assert!(!sim.is_capturing(&s).unwrap());
            assert!(matches!(cap.finish(), Err(CaptureError::Failed { .. })));
        }
        assert!(capturing.seal().is_err());
        // The stream is usable again.
        assert!(!sim.is_capturing(&s).unwrap());
        assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
        assert_no_graph_memory(&sim, format_args!("panic {panic}"));
    }
}
