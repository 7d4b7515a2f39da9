//! Handoffs the plan lets share bytes (lifetimes that do not meet): a
//! reader replayed after another handoff took the bytes gets
//! `ReplayError::HandoffOverwritten`, per runner and at a step build, also
//! when the other handoff was written before the step.
//!
//! The hole (fixed): the reader was replayed over the other handoff's
//! bytes, per runner or in a step graph.

use crate::support::steps::plans::*;
use replay_arena::sim;
use replay_arena::{
    Discovering, Error, PlanConfig, Policy, ReplayError, Replayable, RunnerId, StepError,
};

/// At G = 1, handoffs H0 (runner 0 to 1) and H1 (runner 3 to 4) have
/// lifetimes that do not meet, so the plan gives them the same bytes.
fn shared_handoff_plan(
    sim: &sim::Device,
    s: &sim::Stream,
    out: &sim::HostBuffer,
) -> R<Replayable<sim::Device>> {
    let mut d = Discovering::new(PlanConfig::new());
    let h0 = {
        let mut a = d.arm(RunnerId(0))?;
        a.record(req(64))?;
        a.hand_off(req(64))?
    };
    d.arm(RunnerId(1))?.receive(h0)?;
    d.arm(RunnerId(2))?.record(req(64))?;
    let h1 = {
        let mut a = d.arm(RunnerId(3))?;
        a.record(req(64))?;
        a.hand_off(req(64))?
    };
    d.arm(RunnerId(4))?.receive(h1)?;
    let planned = d.plan(Policy::Generations(1))?;
    let places: Vec<_> = planned.handoffs().map(|h| (h.arena, h.offset)).collect();
    assert_eq!(places[0], places[1], "the two handoffs share bytes");
    let mut cap = planned.allocate(sim.clone())?;
    for (r, h, val) in [(0, h0, 1.0), (3, h1, 3.0)] {
        let c = cap.capture(RunnerId(r))?;
        let (w, dx) = (c.take(req(64))?, c.hand_off(h)?);
        c.stream_capture(s, |s| {
            sim.launch(s, sim::Kernel::fill(&dx, val), 5)?;
            c.ready(h, s)?;
            sim.launch(s, sim::Kernel::fill(&w, 7.0), 1)?;
            Ok::<(), Error>(())
        })?;
        c.finish()?;
    }
    for (r, h) in [(1, h0), (4, h1)] {
        let c = cap.capture(RunnerId(r))?;
        let dy = c.receive(h)?;
        c.stream_capture(s, |s| sim.launch(s, sim::Kernel::copy(&dy, out), 50))?;
        c.finish()?;
    }
    let c = cap.capture(RunnerId(2))?;
    let w = c.take(req(64))?;
    c.stream_capture(s, |s| sim.launch(s, sim::Kernel::fill(&w, 2.0), 5))?;
    c.finish()?;
    Ok(cap.seal()?)
}

#[test]
fn a_reader_of_a_handoff_whose_bytes_another_handoff_took_is_refused() -> R {
    let sim = sim::Device::new();
    let (sa, sb, sc) = (sim.new_stream(), sim.new_stream(), sim.new_stream());
    let out = sim.alloc_f32(64)?;
    let mut rp = shared_handoff_plan(&sim, &sa, &out)?;
    rp.replay(RunnerId(0), &sa)?;
    rp.replay(RunnerId(3), &sc)?; // H1 over H0's bytes
    assert!(matches!(
        rp.replay(RunnerId(1), &sb),
        Err(ReplayError::HandoffOverwritten {
            writer: RunnerId(0),
            by: RunnerId(3),
            ..
        })
    ));
    // In capture order all is well.
    rp.replay(RunnerId(0), &sa)?;
    rp.replay(RunnerId(1), &sb)?;
    rp.synchronize()?;
    assert_eq!(sim.read_f32(&out)?[0], 1.0);
    // A step graph of the same bad schedule is refused at build.
    let mut step = rp.step();
    step.replay(RunnerId(0), &sa)?;
    step.replay(RunnerId(3), &sc)?;
    step.replay(RunnerId(1), &sb)?;
    assert!(matches!(
        step.build(),
        Err(StepError::Schedule(replay_arena::ScheduleError::Replay(
            replay_arena::ReplayError::HandoffOverwritten { .. }
        )))
    ));
    rp.synchronize()?;
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    Ok(())
}

#[test]
fn a_step_graph_sees_a_handoff_overwritten_before_the_step() -> R {
    let sim = sim::Device::new();
    let (sa, sb) = (sim.new_stream(), sim.new_stream());
    let out = sim.alloc_f32(64)?;
    let mut rp = shared_handoff_plan(&sim, &sa, &out)?;
    rp.replay(RunnerId(0), &sa)?; // H0
    rp.replay(RunnerId(3), &sa)?; // H1, over H0's bytes
    let mut step = rp.step();
    step.replay(RunnerId(1), &sb)?; // would read H0 before its writer
    step.replay(RunnerId(0), &sa)?;
    assert!(matches!(
        step.build(),
        Err(StepError::Schedule(replay_arena::ScheduleError::Replay(
            replay_arena::ReplayError::HandoffOverwritten {
                by: RunnerId(3),
                ..
            }
        )))
    ));
    Ok(())
}
