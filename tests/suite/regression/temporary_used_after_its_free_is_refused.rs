//! Finding: `sim` accepted a temporary used after its `free_async` in the
//! same graph (or in a part cut before the use), where CUDA may give its
//! memory to a later allocation of the graph. The model now refuses it.
//! Guards that every shape of use after free (one graph, repeatable, across
//! a cut, only in a copy run, another copy's temporary, a raw span forged
//! at another graph's temporary) is refused or stays hazard-free, and that
//! a freed temporary's bytes are never handed out again within the graph.

use crate::support::record_and_finish;
use replay_arena::backend::GraphMemory;
use replay_arena::sim;
use replay_arena::Policy;
use replay_arena::{Discovering, HandoffId, PlanConfig, RunnerId};

use crate::support::faults::chain::{chain_with, step_launches};
use crate::support::faults::fan::{self, refused_or_hazard_free, Spec};
use crate::support::faults::{graph_memory, writer_of, N, R};
use crate::support::steps::allocate_discovered;

#[test]
fn temporary_freed_before_the_cut_and_used_after_is_refused_or_harmless() {
    // Use after free of a temporary: in part 2 of the copy, and in the
    // runner's own graph.
    let c = chain_with(2, 1, 1, &mut |c, s| {
        let sim = c.sim;
        let t = sim.alloc_async(s, N)?;
        sim.launch(s, sim::Kernel::copy(c.count, &t), 3)?;
        sim.free_async(s, &t)?;
        if let Some((h, out)) = c.out {
            sim.launch(s, sim::Kernel::copy(c.count, out), 2)?;
            c.cap.ready(h, s)?;
        }
        sim.launch(s, sim::Kernel::copy(&t, c.own), 30)?; // freed already
        Ok(())
    });
    if c.capture_errors.is_empty() {
        let mut c = c;
        c.per_runner(2);
        step_launches(&mut c, 3, false).unwrap();
        c.hazard_free();
        c.teardown();
    } else {
        c.teardown();
    }
}

#[test]
fn a_later_copy_using_an_earlier_copys_temporary_is_refused() {
    // Run 3 (the second step copy) uses the temporary of run 2 (the
    // first step copy), before or after the cut.
    for after_cut in [false, true] {
        for from_run in [1usize, 2] {
            let kept: std::cell::RefCell<Vec<sim::Span>> = std::cell::RefCell::new(Vec::new());
            let mut c = chain_with(2, 1, 2, &mut |c, s| -> R {
                let sim = c.sim;
                let t = sim.alloc_async(s, N)?;
                sim.launch(s, sim::Kernel::add(c.one, c.count), 1)?;
                if let Some(input) = c.input {
                    sim.launch(s, sim::Kernel::add(input, c.sink), 20)?;
                }
                let use_old = |s: &sim::Stream| -> R {
                    if c.run == 3 {
                        let old = kept.borrow()[from_run - 1];
                        sim.launch(s, sim::Kernel::copy(c.count, &old), 1)?;
                    }
                    Ok(())
                };
                if !after_cut {
                    use_old(s)?;
                }
                if let Some((h, out)) = c.out {
                    sim.launch(s, sim::Kernel::copy(c.count, out), 2)?;
                    c.cap.ready(h, s)?;
                }
                if after_cut {
                    use_old(s)?;
                }
                sim.launch(s, sim::Kernel::copy(c.count, &t), 5)?;
                sim.launch(s, sim::Kernel::copy(&t, c.own), 30)?;
                sim.free_async(s, &t)?;
                if c.layer == 0 {
                    kept.borrow_mut().push(t);
                }
                Ok(())
            });
            if c.capture_errors.iter().any(|e| e.contains("runner 0")) {
                c.teardown();
                continue;
            }
            // Accepted: use the copies one step graph at a time, the first
            // dropped (its temporaries freed) before the second runs.
            step_launches(&mut c, 2, false).unwrap();
            c.r().trim_graph_memory().unwrap();
            let second = step_launches(&mut c, 2, false);
            c.hazard_free();
            panic!(
                "a copy using another graph's temporary was accepted (after_cut {after_cut}, from run {from_run}); second step graph: {second:?}"
            );
        }
    }
}

#[test]
fn a_temporary_used_after_its_free_in_a_later_part_is_refused() {
    let spec = Spec::new(2);
    refused_or_hazard_free("use after free across a cut", &spec, &mut |w, s| {
        let t = w.sim.alloc_async(s, fan::N)?;
        w.sim.launch(s, sim::Kernel::fill(&t, 2.0), 1)?;
        w.sim.launch(s, sim::Kernel::copy(&t, &w.xs[0]), 5)?;
        if w.run >= 2 {
            w.sim.free_async(s, &t)?;
        }
        w.cap.ready(w.hs[0], s)?;
        w.sim.launch(s, sim::Kernel::copy(&t, &w.xs[1]), 5)?;
        w.cap.ready(w.hs[1], s)?;
        if w.run == 1 {
            w.sim.free_async(s, &t)?;
        }
        w.sim.launch(s, sim::Kernel::fill(w.own, 1.0), 5)?;
        Ok(())
    });
}

/// The work of [`uaf_probe`]'s writer: `(sim, cap, handoff, its view,
/// stream, run)`.
type ProbeWork<'w> = dyn Fn(
        &sim::Device,
        &replay_arena::RunnerCapture<'_, sim::Device>,
        HandoffId,
        &replay_arena::View<'_>,
        &sim::Stream,
        usize,
    ) -> R
    + 'w;

/// A single-runner capture of `work` (repeatable or not, with a handoff
/// `h` read by runner 1); returns the errors and whether it sealed, and
/// replays and step-launches it if so.
fn uaf_probe(
    repeatable: bool,
    work: &ProbeWork<'_>,
) -> (Vec<String>, bool, Vec<sim::Hazard>, GraphMemory) {
    let sim = sim::Device::new();
    let mut d = Discovering::new(PlanConfig::new());
    let h = writer_of(&mut d, 1, fan::OWN, fan::GRAD)[0];
    d.arm(RunnerId(1)).unwrap().receive(h).unwrap();
    let s = [sim.new_stream(), sim.new_stream()];
    let mut capturing = allocate_discovered(&sim, d, Policy::Generations(2));
    let mut errs = Vec::new();
    {
        let cap = capturing.capture(RunnerId(0)).unwrap();
        let own = cap.take(fan::OWN).unwrap();
        let out = cap.hand_off(h).unwrap();
        let mut run = 0;
        let res = if repeatable {
            cap.stream_capture_repeatable(&s[0], |st| -> R {
                run += 1;
                work(&sim, &cap, h, &out, st, run)?;
                Ok(sim.launch(st, sim::Kernel::fill(&own, 1.0), 1)?)
            })
        } else {
            cap.stream_capture(&s[0], |st| -> R {
                work(&sim, &cap, h, &out, st, 1)?;
                Ok(sim.launch(st, sim::Kernel::fill(&own, 1.0), 1)?)
            })
        };
        if let Err(e) = res {
            errs.push(e.to_string());
        }
        if let Err(e) = cap.finish() {
            errs.push(e.to_string());
        }
    }
    {
        let cap = capturing.capture(RunnerId(1)).unwrap();
        let input = cap.receive(h).unwrap();
        let sink = sim.alloc_f32(fan::N).unwrap();
        record_and_finish!(cap, &s[1], |st| {
            sim.launch(st, sim::Kernel::add(&input, &sink), 3)
        });
        std::mem::forget(sink);
    }
    let sealed = match capturing.seal() {
        Ok(mut r) => {
            r.replay(RunnerId(0), &s[0]).unwrap();
            r.replay(RunnerId(1), &s[1]).unwrap();
            let mut step = r.step();
            match step.replay(RunnerId(0), &s[0]) {
                Ok(_) => {
                    step.replay(RunnerId(1), &s[1]).unwrap();
                    match step.build() {
                        Ok(mut g) => g.launch(&s[0]).unwrap(),
                        Err(e) => errs.push(format!("build: {e}")),
                    }
                }
                Err(e) => errs.push(format!("step: {e}")),
            }
            r.replay(RunnerId(0), &s[0]).unwrap();
            r.synchronize().unwrap();
            true
        }
        Err(e) => {
            errs.push(format!("seal: {e}"));
            false
        }
    };
    (errs, sealed, sim.hazards(), graph_memory(&sim))
}

/// [`ProbeWork`], boxed.
type Work = Box<ProbeWork<'static>>;

/// A temporary filled, freed, and then read into the handoff, all before
/// its ready point.
fn freed_then_read() -> Work {
    Box::new(|sim, cap, h, out, s, _| {
        let t = sim.alloc_async(s, fan::N)?;
        sim.launch(s, sim::Kernel::fill(&t, 2.0), 1)?;
        sim.free_async(s, &t)?;
        sim.launch(s, sim::Kernel::copy(&t, out), 5)?;
        cap.ready(h, s)?;
        Ok(())
    })
}

/// A temporary read into the handoff, then written after its ready point
/// (the next part): freed before the ready point in every run, or with
/// `copy_only` only in the copy runs (the first run frees it at the end).
fn used_across_a_cut(copy_only: bool) -> Work {
    Box::new(move |sim, cap, h, out, s, run| {
        let t = sim.alloc_async(s, fan::N)?;
        sim.launch(s, sim::Kernel::copy(&t, out), 1)?;
        let early = !copy_only || run >= 2;
        if early {
            sim.free_async(s, &t)?;
        }
        cap.ready(h, s)?;
        sim.launch(s, sim::Kernel::fill(&t, 7.0), 5)?;
        if !early {
            sim.free_async(s, &t)?;
        }
        Ok(())
    })
}

#[test]
fn a_temporary_used_after_its_free_stays_hazard_free_in_every_capture_shape() {
    // (a) one graph; (b) repeatable, no cut; (c) repeatable, the use in a
    // later part than the free in both runs; (d) only in the copy.
    let cases: Vec<(&str, bool, Work)> = vec![
        ("one graph", false, freed_then_read()),
        ("repeatable, no cut", true, freed_then_read()),
        ("repeatable, across a cut", true, used_across_a_cut(false)),
        ("copy only, across a cut", true, used_across_a_cut(true)),
    ];
    for (name, repeatable, work) in cases {
        let (errs, sealed, hazards, p) = uaf_probe(repeatable, &*work);
        eprintln!("{name}: sealed {sealed} errs {errs:?} hazards {hazards:?} pool {p:?}");
        assert!(hazards.is_empty(), "{name}: {hazards:?}");
        assert_eq!(p.used, 0, "{name}: {p:?}");
        let _ = sealed;
    }
}

#[test]
fn a_temporary_read_after_its_free_never_aliases_a_later_temporary() {
    // The sim keeps a graph's temporaries for the graph's life: one freed
    // and then read must not see a later allocation's bytes.
    let spans = std::cell::RefCell::new(Vec::new());
    let (errs, sealed, hazards, p) = uaf_probe(true, &|sim, cap, h, out, s, _| {
        let t1 = sim.alloc_async(s, fan::N)?;
        sim.launch(s, sim::Kernel::fill(&t1, 1.0), 1)?;
        sim.free_async(s, &t1)?;
        cap.ready(h, s).ok();
        let t2 = sim.alloc_async(s, fan::N)?;
        spans.borrow_mut().push((t1.addr(), t2.addr()));
        sim.launch(s, sim::Kernel::fill(&t2, 5.0), 1)?;
        sim.launch(s, sim::Kernel::copy(&t1, &t2), 5)?;
        sim.free_async(s, &t2)?;
        let _ = out;
        Ok(())
    });
    assert!(hazards.is_empty(), "{hazards:?}");
    for (a, b) in spans.borrow().iter() {
        assert!(
            a.abs_diff(*b) >= 4 * fan::N as u64,
            "a freed temporary's bytes handed out again"
        );
    }
    let _ = (errs, sealed);
    assert_eq!(p.used, 0, "{p:?}");
}

#[test]
fn a_raw_span_forged_at_another_graphs_temporary_is_refused() {
    // The writer's temporary lives over its cut and tail; a reader that
    // starts at the cut forges a raw span at that temporary's address.
    for step_graph in [false, true] {
        let sim = sim::Device::new();
        let mut d = Discovering::new(PlanConfig::new());
        let h = writer_of(&mut d, 1, fan::OWN, fan::GRAD)[0];
        {
            let mut a = d.arm(RunnerId(1)).unwrap();
            a.record(fan::OWN).unwrap();
            a.receive(h).unwrap();
        }
        let s = [sim.new_stream(), sim.new_stream()];
        let mut capturing = allocate_discovered(&sim, d, Policy::Generations(2));
        let addrs = std::cell::RefCell::new(Vec::new());
        {
            let cap = capturing.capture(RunnerId(0)).unwrap();
            let own = cap.take(fan::OWN).unwrap();
            let out = cap.hand_off(h).unwrap();
            cap.stream_capture_repeatable(&s[0], |st| -> R {
                let t = sim.alloc_async(st, fan::N)?;
                addrs.borrow_mut().push(t.addr());
                sim.launch(st, sim::Kernel::fill(&t, 1.0), 1)?;
                sim.launch(st, sim::Kernel::copy(&t, &out), 1)?;
                cap.ready(h, st)?;
                sim.launch(st, sim::Kernel::fill(&t, 2.0), 100)?;
                sim.launch(st, sim::Kernel::copy(&t, &own), 1)?;
                sim.free_async(st, &t)?;
                Ok(())
            })
            .unwrap();
            cap.finish().unwrap();
        }
        let mut errs = Vec::new();
        {
            let cap = capturing.capture(RunnerId(1)).unwrap();
            let own = cap.take(fan::OWN).unwrap();
            let input = cap.receive(h).unwrap();
            let forged: Vec<sim::Span> = addrs
                .borrow()
                .iter()
                .map(|a| sim::Span::new(*a, fan::N))
                .collect();
            let res = cap.stream_capture(&s[1], |st| -> R {
                sim.launch(st, sim::Kernel::copy(&input, &own), 1)?;
                for f in &forged {
                    sim.launch(st, sim::Kernel::fill(f, 9.0), 10)?;
                }
                Ok(())
            });
            if let Err(e) = res {
                errs.push(e.to_string());
            }
            if let Err(e) = cap.finish() {
                errs.push(e.to_string());
            }
        }
        match capturing.seal() {
            Ok(mut r) => {
                for _ in 0..2 {
                    r.replay(RunnerId(0), &s[0]).unwrap();
                    r.replay(RunnerId(1), &s[1]).unwrap();
                }
                if step_graph {
                    let mut step = r.step();
                    step.replay(RunnerId(0), &s[0]).unwrap();
                    step.replay(RunnerId(1), &s[1]).unwrap();
                    let mut g = step.build().unwrap();
                    g.launch(&s[0]).unwrap();
                }
                r.synchronize().unwrap();
                assert!(
                    sim.hazards().is_empty(),
                    "step {step_graph}: forged span accepted, and: {:?}",
                    sim.hazards()
                );
            }
            Err(e) => {
                assert!(!errs.is_empty(), "{e}");
                eprintln!("forged span refused: {errs:?}");
                drop(e.into_capturing().replan());
            }
        }
        assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    }
}
