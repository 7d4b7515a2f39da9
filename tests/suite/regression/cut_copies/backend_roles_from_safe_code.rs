//! The backend roles called from safe code against a plan: the program
//! begins a capture on a fenced stream (or inside a consumer closure),
//! composes or splits a plan's graph that holds temporaries. Guards that
//! each is refused or harmless and the plan's graphs keep their
//! temporaries. An attack that found no hole.

use std::panic::{catch_unwind, AssertUnwindSafe};

use replay_arena::backend::{Capture, Streams};
use replay_arena::sim;
use replay_arena::RunnerId;

use crate::support::attacks::assert_hazard_free_then_teardown;
use crate::support::faults::chain::{
    chain_with, kept_of, plain, standard, step_launches, up_to_ready,
};
use crate::support::faults::{graph_memory, N, R};

#[test]
fn a_capture_begun_by_the_program_blocks_every_fenced_launch_on_that_stream() {
    let mut c = chain_with(3, 2, 2, &mut standard);
    let mut kept = kept_of(&mut c, false);
    let pool = c.pool.clone();
    let sim = c.sim.clone();
    let s = sim.new_stream();
    sim.begin_capture(&s).unwrap(); // safe
    let r = c.r();
    assert!(r.replay(RunnerId(0), &s).is_err());
    assert!(r.launch_kept(&mut kept, &s).is_err());
    assert!(r.wait_for(RunnerId(0), &s).is_err());
    assert!(r.wait_all(&s).is_err());
    let consumed = r.consume(RunnerId(0), &s, |s, v| {
        sim.launch(s, sim::Kernel::scale(&v[0], 2.0), 1)
    });
    assert!(consumed.is_err());
    // The plan goes on elsewhere.
    r.launch_kept(&mut kept, &pool[0]).unwrap();
    r.replay(RunnerId(0), &pool[1]).unwrap();
    drop(kept);
    assert_hazard_free_then_teardown(c);
}

#[test]
fn a_capture_begun_inside_a_consumer_closure_is_refused_or_harmless() {
    let mut c = chain_with(2, 1, 1, &mut plain);
    let (pool, sim, side, sink) = c.apart();
    let r = c.r();
    r.replay(RunnerId(0), &pool[0]).unwrap();
    let res = r.consume(RunnerId(0), &side, |s, v| -> R {
        sim.begin_capture(s)?; // the consumer's stream now captures
        sim.launch(s, sim::Kernel::add(&v[0], &sink), 50)?;
        Ok(())
    });
    // Refused: the fence cannot record its event into the program's capture.
    assert!(
        res.is_err(),
        "a consumer whose stream was captured away was counted"
    );
    // Whatever happened, the next writer must not overlap the consumer,
    // and the plan must still work on other streams.
    let _ = r.replay(RunnerId(0), &pool[1]);
    let _ = r.replay(RunnerId(1), &pool[0]);
    let _ = r.replay(RunnerId(0), &pool[0]);
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    let p = catch_unwind(AssertUnwindSafe(|| c.teardown()));
    assert!(p.is_ok());
}

#[test]
fn a_capture_begun_inside_a_step_consumer_closure_is_refused_or_harmless() {
    let mut c = chain_with(2, 1, 1, &mut plain);
    let (pool, sim, side, sink) = c.apart();
    let r = c.r();
    let mut step = r.step();
    step.replay(RunnerId(0), &pool[0]).unwrap();
    let res = step.consume(RunnerId(0), &side, |s, v| -> R {
        let _ = sim.begin_capture(s); // already capturing: refused
        sim.launch(s, sim::Kernel::add(&v[0], &sink), 50)?;
        Ok(())
    });
    let _ = res;
    step.replay(RunnerId(1), &pool[1]).unwrap();
    if let Ok(mut g) = step.build() {
        for k in 0..3 {
            let _ = g.launch(&pool[k % 2]);
        }
    }
    assert!(!sim.is_capturing(&side).unwrap());
    r.replay(RunnerId(0), &pool[1]).unwrap();
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    c.teardown();
}

#[test]
fn composing_a_plans_graph_with_temporaries_from_safe_code_is_refused() {
    use replay_arena::backend::{Compose, NodeGraph, StepNode};
    let c = chain_with(2, 1, 1, &mut standard);
    let r = c.replayable.as_ref().unwrap();
    let g = r.graph(RunnerId(0)).unwrap();
    let composed = c
        .sim
        .compose(vec![StepNode::new(NodeGraph::Copy(g), &[], 0)], None);
    assert!(composed.is_err(), "a graph with temporaries was copied");
    // The plan still replays.
    let mut c = c;
    c.per_runner(2);
    assert_hazard_free_then_teardown(c);
}

#[test]
fn splitting_a_plans_graph_with_temporaries_from_safe_code_leaves_it_intact() {
    use replay_arena::backend::Compose;
    // The program records its own event node inside a runner's graph that
    // allocates, then splits the plan's graph there (safe) and drops the
    // parts: the plan's graph must keep its temporaries.
    let evs = std::cell::RefCell::new(Vec::new());
    let mut reference = chain_with(2, 1, 1, &mut standard);
    reference.per_runner(4);
    let mut c = chain_with(2, 1, 1, &mut |c, s| {
        let sim = c.sim;
        let t = sim.alloc_async(s, N)?;
        up_to_ready(c, s)?;
        sim.launch(s, sim::Kernel::copy(c.count, &t), 5)?;
        let e = sim.create_event()?;
        sim.record_event_node(s, &e)?; // between the temporary's uses
        evs.borrow_mut().push(e);
        sim.launch(s, sim::Kernel::copy(&t, c.own), 30)?;
        Ok(sim.free_async(s, &t)?)
    });
    assert!(c.capture_errors.is_empty(), "{:?}", c.capture_errors);
    let before = graph_memory(&c.sim);
    {
        let r = c.replayable.as_ref().unwrap();
        let evs = evs.borrow();
        for l in 0..2u32 {
            let g = r.graph(RunnerId(l)).unwrap();
            for e in evs.iter() {
                let split = c.sim.split_graph(g, &[e]);
                if let Ok((a, b, _)) = split {
                    drop(a);
                    drop(b);
                }
            }
        }
    }
    let after = graph_memory(&c.sim);
    assert_eq!(before.used, after.used, "{before:?} -> {after:?}");
    c.per_runner(2);
    step_launches(&mut c, 2, false).unwrap();
    c.hazard_free();
    assert_eq!(c.values(), reference.values());
    c.teardown();
}
