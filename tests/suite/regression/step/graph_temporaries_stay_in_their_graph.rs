//! A graph temporary (a `sim::Span` allocated and freed inside a runner's
//! capture) works only inside its own capture closure: no step copy, no
//! other runner's graph and no consumer may touch it.
//!
//! The finding (fixed): the second run of a repeatable capture could use
//! the first run's temporary, so a step copy touched memory of another
//! graph outside that allocation's alloc/free window
//! (`a_step_copy_that_touches_the_first_runs_temporary_is_refused`).

use crate::support::capture_view;
use crate::support::steps::fence::*;
use crate::support::steps::overlap::*;
use crate::support::steps::plan_runners;
use replay_arena::sim;
use replay_arena::{Policy, RunnerId};

/// Found by this review (fixed): the second run of a repeatable capture
/// used the first run's temporary (a `sim::Span` allocated and freed
/// inside the runner's own graph): it was accepted, so the step copy
/// touched memory of another graph
/// (the runner's own graph), outside that allocation's alloc/free window.
/// Docs: the second run "can use no others" views; `alloc_async`: the span
/// "works like the runner's views: inside that closure, on its stream (no
/// other graph, no op outside it)". Another runner's temporary, or a
/// consumer using one, is refused (tests below): only the runner's own
/// first run leaks into its copies. No hazard shows on `sim` (the fence
/// orders a runner's graph and its copies), but the copy's result depends
/// on another graph's memory.
#[test]
fn a_step_copy_that_touches_the_first_runs_temporary_is_refused() {
    for copies in [1, 2] {
        let mut c = cap1(false);
        let mut first: Option<sim::Span> = None;
        let (sim, s) = (c.sim.clone(), c.s.clone());
        let res;
        let fin;
        {
            let cap = c.capturing.capture(RunnerId(0)).unwrap();
            let v = cap.take(OWN).unwrap();
            cap.step_copies(copies);
            let mut run = 0;
            res = cap.stream_capture_repeatable(&s, |s| {
                run += 1;
                let t = sim.alloc_async(s, N)?;
                sim.launch(s, sim::Kernel::fill(&t, run as f32), 1)?;
                if let Some(old) = &first {
                    sim.launch(s, sim::Kernel::copy(old, &v), 1)?; // the first graph's temporary
                }
                sim.free_async(s, &t)?;
                first.get_or_insert(t);
                Ok::<(), replay_arena::Error>(())
            });
            fin = cap.finish();
        }
        assert!(
            res.is_err() || fin.is_err(),
            "copies {copies}: a step copy used another graph's temporary: {res:?} {fin:?}"
        );
        after_failure(c, "temporary of the first run");
    }
}

/// Attack (held): runner 1's step copy (its second run) writes a temporary of
/// runner 0's graph (a span kept from runner 0's capture). The docs: a
/// temporary "works like the runner's views: inside that closure, on its
/// stream (no other graph, no op outside it)", and a second run "can use
/// no others" views. If the crate takes it, a forgotten step graph holding
/// runner 1's copy and a per-runner replay of runner 0 (another
/// generation: no fence wait between them) write the same bytes at once.
#[test]
fn a_step_copy_that_writes_another_runners_temporary_is_refused() {
    let planned = plan_runners((0..2).map(|r| (RunnerId(r), [OWN])), Policy::Generations(2));
    let sim = sim::Device::new();
    let (a, b, x) = (sim.new_stream(), sim.new_stream(), sim.new_stream());
    let mut capturing = planned.allocate(sim.clone()).unwrap();
    let mut t0: Option<sim::Span> = None;
    {
        capture_view(&mut capturing, RunnerId(0), OWN, &a, |s, v| {
            let t = sim.alloc_async(s, N)?;
            sim.launch(s, sim::Kernel::fill(&t, 1.0), 200)?; // long write of its temporary
            sim.launch(s, sim::Kernel::copy(&t, &v), 1)?;
            sim.free_async(s, &t)?;
            t0 = Some(t);
            Ok::<(), replay_arena::Error>(())
        });
    }
    let t0 = t0.unwrap();
    let (res, fin) = {
        let cap = capturing.capture(RunnerId(1)).unwrap();
        let v = cap.take(OWN).unwrap();
        let mut run = 0;
        let res = cap.stream_capture_repeatable(&b, |s| {
            run += 1;
            let t = sim.alloc_async(s, N)?;
            sim.launch(s, sim::Kernel::fill(&t, 2.0), 1)?;
            if run == 2 {
                sim.launch(s, sim::Kernel::fill(&t0, 9.0), 200)?; // runner 0's temporary
            }
            sim.launch(s, sim::Kernel::copy(&t, &v), 1)?;
            sim.free_async(s, &t)?;
            Ok::<(), replay_arena::Error>(())
        });
        (
            res.map_err(|e| e.to_string()),
            cap.finish().map_err(|e| e.to_string()),
        )
    };
    if res.is_err() || fin.is_err() {
        eprintln!("refused: {res:?} / {fin:?}");
        return; // refused: held
    }
    let mut r = capturing.seal().unwrap();
    r.replay(RunnerId(0), &a).unwrap();
    r.replay(RunnerId(1), &b).unwrap();
    r.synchronize().unwrap();
    {
        let mut step = r.step();
        step.replay(RunnerId(1), &b).unwrap();
        let mut g = step.build().unwrap();
        g.launch(&x).unwrap();
        std::mem::forget(g); // safe
    }
    r.replay(RunnerId(0), &a).unwrap(); // another generation: no wait
    r.synchronize().unwrap();
    let hz = sim.hazards();
    panic!("runner 1's step copy was allowed to write runner 0's graph temporary; hazards: {hz:?}");
}

/// Attack: a span of runner 0's graph temporary, kept from its capture,
/// used by a consumer of runner 1 (per runner and in a step graph) while
/// runner 0 replays on another stream: the sim's docs say a temporary
/// works only inside its own capture closure.
#[test]
fn a_consumer_cannot_touch_a_runners_graph_temporary() {
    let planned = plan_runners((0..2).map(|r| (RunnerId(r), [OWN])), Policy::Generations(2));
    let sim = sim::Device::new();
    let (a, b, c) = (sim.new_stream(), sim.new_stream(), sim.new_stream());
    let mut capturing = planned.allocate(sim.clone()).unwrap();
    let mut t0: Option<sim::Span> = None;
    for r in 0..2u32 {
        capture_view(&mut capturing, RunnerId(r), OWN, &a, |s, v| {
            if r == 1 {
                sim.launch(s, sim::Kernel::fill(&v, 1.0), 1)?;
                return Ok(());
            }
            let t = sim.alloc_async(s, N)?;
            sim.launch(s, sim::Kernel::fill(&t, 1.0), 200)?;
            sim.launch(s, sim::Kernel::copy(&t, &v), 1)?;
            sim.free_async(s, &t)?;
            if r == 0 {
                t0 = Some(t);
            }
            Ok::<(), replay_arena::Error>(())
        });
    }
    let t0 = t0.unwrap();
    let mut r = capturing.seal().unwrap();
    r.replay(RunnerId(1), &b).unwrap();
    r.replay(RunnerId(0), &a).unwrap();
    let per_runner = r.consume(RunnerId(1), &c, |s, _| {
        sim.launch(s, sim::Kernel::fill(&t0, 3.0), 100)
    });
    let mut step = r.step();
    step.replay(RunnerId(1), &b).unwrap();
    let in_step = step
        .consume(RunnerId(1), &c, |s, _| {
            sim.launch(s, sim::Kernel::fill(&t0, 3.0), 100)
        })
        .map(|_| ());
    drop(step);
    r.synchronize().unwrap();
    assert!(
        per_runner.is_err(),
        "a consumer wrote another graph's temporary"
    );
    assert!(
        in_step.is_err(),
        "a step consumer wrote another graph's temporary"
    );
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
}

#[test]
fn a_graph_temporary_works_only_inside_its_capture_closure() {
    let (sim, stream, mut capturing) = allocated(&[&[F32_64], &[F32_64]], Policy::Generations(2));
    let other = sim.new_stream();
    let mut kept = None;
    {
        capture_view(&mut capturing, RunnerId(0), F32_64, &stream, |s, v| {
            let t = sim.alloc_async(s, 64)?;
            // Not on another stream, even inside the closure.
            assert!(sim.launch(&other, sim::Kernel::fill(&t, 3.0), 1).is_err());
            sim.launch(s, sim::Kernel::fill(&t, 2.0), 1)?;
            sim.launch(s, sim::Kernel::copy(&t, &v), 1)?;
            kept = Some(t);
            sim.free_async(s, &t)
        });
    }
    let kept = kept.unwrap();
    // Outside its closure, and in another runner's graph: refused.
    assert!(sim
        .launch(&other, sim::Kernel::fill(&kept, 9.0), 1)
        .is_err());
    let cap = capturing.capture(RunnerId(1)).unwrap();
    let v1 = cap.take(F32_64).unwrap();
    let refused = cap.stream_capture(&stream, |s| {
        sim.launch(s, sim::Kernel::fill(&v1, 1.0), 1)?;
        sim.launch(s, sim::Kernel::fill(&kept, 9.0), 1)
    });
    assert!(refused.is_err());
    // Outside every capture there is nothing to allocate into.
    assert!(sim.alloc_async(&other, 16).is_err());
}
