//! In a step graph, a reader of two handoffs of one writer waits for the
//! ready point of each handoff it reads, not only the first.
//!
//! The hole (fixed): the step graph's reader did not wait for the ready
//! point of the later handoff, and raced with its write.

use crate::support::steps::plans::*;
use replay_arena::sim;
use replay_arena::{Discovering, Error, PlanConfig, Policy, RunnerId};

#[test]
fn a_step_graph_readers_wait_for_the_ready_point_of_their_own_handoff() -> R {
    let sim = sim::Device::new();
    let (sa, sb) = (sim.new_stream(), sim.new_stream());
    let mut d = Discovering::new(PlanConfig::new());
    let (h0, h1) = {
        let mut a = d.arm(RunnerId(0))?;
        a.record(req(64))?;
        (a.hand_off(req(64))?, a.hand_off(req(64))?)
    };
    {
        let mut a = d.arm(RunnerId(1))?;
        a.record(req(64))?;
        a.receive(h0)?;
        a.receive(h1)?;
    }
    let mut cap = d.plan(Policy::OverlapDepth(2))?.allocate(sim.clone())?;
    {
        let c = cap.capture(RunnerId(0))?;
        let (w, x0, x1) = (c.take(req(64))?, c.hand_off(h0)?, c.hand_off(h1)?);
        c.stream_capture(&sa, |s| {
            sim.launch(s, sim::Kernel::fill(&x0, 1.0), 5)?;
            c.ready(h0, s)?;
            sim.launch(s, sim::Kernel::fill(&x1, 2.0), 500)?; // h1 is written long after h0
            c.ready(h1, s)?;
            sim.launch(s, sim::Kernel::fill(&w, 3.0), 5)?;
            Ok::<(), Error>(())
        })?;
        c.finish()?;
    }
    {
        let c = cap.capture(RunnerId(1))?;
        let (w, y0, y1) = (c.take(req(64))?, c.receive(h0)?, c.receive(h1)?);
        c.stream_capture(&sb, |s| {
            sim.launch(s, sim::Kernel::copy(&y1, &w), 5)?;
            sim.launch(s, sim::Kernel::add(&y0, &w), 5)
        })?;
        c.finish()?;
    }
    let mut rp = cap.seal()?;
    rp.replay(RunnerId(0), &sa)?;
    rp.replay(RunnerId(1), &sb)?;
    {
        let mut step = rp.step();
        step.replay(RunnerId(0), &sa)?;
        step.replay(RunnerId(1), &sb)?;
        let mut g = step.build()?;
        for _ in 0..3 {
            g.launch(&sa)?;
        }
    }
    rp.synchronize()?;
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    assert_eq!(sim.read_f32(&rp.views(RunnerId(1))?[0])?[0], 3.0);
    Ok(())
}
