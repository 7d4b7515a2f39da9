//! A step consumer whose closure panics leaves the plan's views as they
//! were (writable, not read-only) and its stream free; the plan goes on.
//!
//! The hole (fixed): after the panic the plan's views were no longer as
//! they were before the step.

use crate::support::steps::plans::*;
use replay_arena::backend::Streams;
use replay_arena::sim;
use replay_arena::RunnerId;
use std::panic::{catch_unwind, AssertUnwindSafe};

#[test]
fn a_panicking_step_consumer_leaves_the_plans_views_as_they_were() -> R {
    let sim = sim::Device::new();
    let (sa, sb) = (sim.new_stream(), sim.new_stream());
    let mut rp = temporaries_plan(&sim, &sa)?;
    let before = format!("{:?}", rp.views(RunnerId(0))?[0]);
    {
        let mut step = rp.step();
        step.replay(RunnerId(0), &sa)?;
        let panicked = catch_unwind(AssertUnwindSafe(|| {
            let _ = step.consume(RunnerId(0), &sb, |_, _| -> Result<(), String> {
                panic!("the consumer's closure panics")
            });
        }));
        assert!(panicked.is_err());
        assert!(!Streams::is_capturing(&sim, &sb)?);
    }
    let after = rp.views(RunnerId(0))?[0];
    assert_eq!(before, format!("{after:?}"));
    assert!(!after.is_read_only());
    // The stream is free and the plan goes on.
    rp.replay(RunnerId(0), &sa)?;
    rp.consume(RunnerId(0), &sb, |_, _| Ok::<(), String>(()))?;
    Ok(())
}
