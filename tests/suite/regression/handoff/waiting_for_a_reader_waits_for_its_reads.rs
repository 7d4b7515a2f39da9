//! `wait_for(r)` of a handoff reader that owns no bytes waits for its
//! graph (its handoff reads), so program work after it is ordered.
//!
//! The finding (fixed): `wait_for` of a reader without bytes of its own
//! waited for nothing.

use crate::support::steps::plans::*;
use replay_arena::sim;
use replay_arena::{Discovering, PlanConfig, Policy, RunnerId};

#[test]
fn waiting_for_a_reader_without_bytes_of_its_own_waits_for_its_reads() -> R {
    let mut d = Discovering::new(PlanConfig::new());
    let h = {
        let mut a = d.arm(RunnerId(0))?;
        a.record(req(64))?;
        a.hand_off(req(64))?
    };
    d.arm(RunnerId(1))?.receive(h)?;
    let sim = sim::Device::new();
    let (sa, sb, opt) = (sim.new_stream(), sim.new_stream(), sim.new_stream());
    let out = sim.alloc_f32(64)?;
    let mut cap = d.plan(Policy::Generations(2))?.allocate(sim.clone())?;
    {
        let c = cap.capture(RunnerId(0))?;
        let (w, x) = (c.take(req(64))?, c.hand_off(h)?);
        c.stream_capture(&sa, |s| {
            sim.launch(s, sim::Kernel::fill(&x, 1.0), 5)?;
            sim.launch(s, sim::Kernel::fill(&w, 7.0), 5)
        })?;
        c.finish()?;
    }
    {
        let c = cap.capture(RunnerId(1))?;
        let y = c.receive(h)?;
        c.stream_capture(&sa, |s| sim.launch(s, sim::Kernel::copy(&y, &out), 50))?;
        c.finish()?;
    }
    let mut rp = cap.seal()?;
    rp.replay(RunnerId(0), &sa)?;
    rp.replay(RunnerId(1), &sb)?; // its graph writes `out`
    rp.wait_for(RunnerId(1), &opt)?;
    let copy = sim.alloc_f32(64)?;
    sim.launch(&opt, sim::Kernel::copy(&out, &copy), 1)?;
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    assert_eq!(sim.read_f32(&copy)?[0], 1.0);
    Ok(())
}
