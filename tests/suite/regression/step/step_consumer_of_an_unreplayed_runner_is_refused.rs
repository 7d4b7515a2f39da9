//! A step consumer of a runner never replayed before it (in the step or
//! before the step graph) is refused at build (`ConsumeError::NotReplayed`);
//! replayed before the step graph, its first launch reads that replay.
//!
//! The hole (fixed): the step build took such a consumer.

use crate::support::steps::plans::*;
use replay_arena::sim;
use replay_arena::{RunnerId, StepError};

#[test]
fn a_step_consumer_of_a_runner_never_replayed_is_refused() -> R {
    let sim = sim::Device::new();
    let s = sim.new_stream();
    let mut rp = temporaries_plan(&sim, &s)?;
    let mut step = rp.step();
    step.consume(RunnerId(0), &s, |_, _| Ok::<(), String>(()))?;
    step.replay(RunnerId(0), &s)?;
    assert!(matches!(
        step.build(),
        Err(StepError::Schedule(replay_arena::ScheduleError::Consume(
            replay_arena::ConsumeError::NotReplayed {
                runner: RunnerId(0)
            }
        )))
    ));
    // Replayed before the step graph: its first launch reads that replay.
    rp.replay(RunnerId(0), &s)?;
    let mut step = rp.step();
    step.consume(RunnerId(0), &s, |_, _| Ok::<(), String>(()))?;
    step.replay(RunnerId(0), &s)?;
    step.build()?.launch(&s)?;
    Ok(())
}
