//! The `sim` refuses what CUDA refuses for a graph's memory nodes, from safe
//! code: a temporary freed twice in one graph (a hostile check found the
//! sim accepted it: its memory-node check compared address sets, so a
//! repeated free was never counted; it now takes one allocation per free),
//! a free of memory the graph did not allocate, a free at an interior
//! address, a use after free through a raw span, and a step copy freeing
//! the first run's temporary.
use replay_arena::sim;
use replay_arena::Policy;
use replay_arena::{Discovering, PlanConfig, RunnerId};

use crate::support::faults::fan;
use crate::support::faults::R;
use crate::support::steps::allocate_discovered;

/// One runner, capture `work`; Ok(()) when sealed and replayed, else errors.
fn probe(
    repeatable: bool,
    work: &dyn Fn(&sim::Device, &sim::Stream, usize) -> R,
) -> std::result::Result<Vec<sim::Hazard>, Vec<String>> {
    let sim = sim::Device::new();
    let mut d = Discovering::new(PlanConfig::new());
    {
        let mut a = d.arm(RunnerId(0)).unwrap();
        a.record(fan::OWN).unwrap();
    }
    let s = sim.new_stream();
    let mut capturing = allocate_discovered(&sim, d, Policy::Generations(2));
    let mut errs = Vec::new();
    {
        let cap = capturing.capture(RunnerId(0)).unwrap();
        let own = cap.take(fan::OWN).unwrap();
        let mut run = 0;
        let res = if repeatable {
            cap.stream_capture_repeatable(&s, |st| -> R {
                run += 1;
                work(&sim, st, run)?;
                Ok(sim.launch(st, sim::Kernel::fill(&own, 1.0), 1)?)
            })
        } else {
            cap.stream_capture(&s, |st| -> R {
                work(&sim, st, 1)?;
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
    if !errs.is_empty() {
        return Err(errs);
    }
    match capturing.seal() {
        Ok(mut r) => {
            r.replay(RunnerId(0), &s)
                .map_err(|e| vec![format!("replay: {e}")])?;
            r.replay(RunnerId(0), &s)
                .map_err(|e| vec![format!("replay: {e}")])?;
            r.synchronize().unwrap();
            Ok(sim.hazards())
        }
        Err(e) => Err(vec![format!("seal: {e}")]),
    }
}

/// [`probe`] of `work` refuses it (at capture, seal or replay).
fn expect_refused(
    name: &str,
    repeatable: bool,
    work: &dyn Fn(&sim::Device, &sim::Stream, usize) -> R,
) {
    match probe(repeatable, work) {
        Ok(h) => panic!("HOLE {name}: accepted, hazards {h:?}"),
        Err(e) => assert!(!e.is_empty(), "{name}"),
    }
}

/// A temporary of the graph, filled with 2.
fn twos(sim: &sim::Device, s: &sim::Stream) -> replay_arena::Result<sim::Span> {
    let t = sim.alloc_async(s, fan::N)?;
    sim.launch(s, sim::Kernel::fill(&t, 2.0), 1)?;
    Ok(t)
}

/// A temporary filled and freed twice.
fn free_twice(sim: &sim::Device, s: &sim::Stream, _: usize) -> R {
    let t = twos(sim, s)?;
    sim.free_async(s, &t)?;
    sim.free_async(s, &t)?;
    Ok(())
}

#[test]
fn double_free_in_one_graph() {
    expect_refused("double free", false, &free_twice);
}

#[test]
fn double_free_via_raw_span_at_base() {
    expect_refused("double free via Span::new", false, &|sim, s, _| {
        let t = sim.alloc_async(s, fan::N)?;
        sim.free_async(s, &t)?;
        sim.free_async(s, &sim::Span::new(t.addr(), 1))?;
        Ok(())
    });
}

#[test]
fn free_of_host_buffer() {
    expect_refused("free of alloc_f32 buffer", false, &|sim, s, _| {
        let b = sim.alloc_f32(fan::N).unwrap();
        sim.free_async(s, &{
            use sim::AsSpan;
            b.span()
        })?;
        std::mem::forget(b);
        Ok(())
    });
}

#[test]
fn free_of_forged_address() {
    expect_refused("free of forged addr", false, &|sim, s, _| {
        sim.free_async(s, &sim::Span::new(0x1000, 4))?;
        Ok(())
    });
}

#[test]
fn free_interior_address_then_free_base() {
    // Interior free plus base free: balances the base, but frees a foreign addr.
    expect_refused("interior free", false, &|sim, s, _| {
        let t = sim.alloc_async(s, fan::N)?;
        sim.free_async(s, &sim::Span::new(t.addr() + 4, 1))?;
        sim.free_async(s, &t)?;
        Ok(())
    });
}

#[test]
fn use_after_free_via_raw_span() {
    expect_refused("uaf raw", false, &|sim, s, _| {
        let t = sim.alloc_async(s, fan::N)?;
        sim.free_async(s, &t)?;
        let freed = sim::Span::new(t.addr(), fan::N);
        sim.launch(s, sim::Kernel::fill(&freed, 3.0), 1)?;
        Ok(())
    });
}

#[test]
fn free_other_runs_temporary_in_copy() {
    // Repeatable: run 2 frees run 1's temporary too (after it allocs its own).
    let kept = std::cell::RefCell::new(Vec::<sim::Span>::new());
    expect_refused("free other copy's temp", true, &|sim, s, run| {
        let t = twos(sim, s)?;
        sim.free_async(s, &t)?;
        if run >= 2 {
            let old = kept.borrow()[0];
            sim.free_async(s, &old)?;
        }
        kept.borrow_mut().push(t);
        Ok(())
    });
}

#[test]
fn double_free_repeatable() {
    expect_refused("double free repeatable", true, &free_twice);
}
