//! Launches of one graph run one after another, as launches of one CUDA
//! executable graph do, so a runner without bytes (never fenced) does not
//! share its temporaries between two launches in flight; a graph with
//! memory nodes and no step copy is refused in a step (`NoStepCopy`).
//!
//! The hole (fixed): the `sim` model let two launches of one graph run at
//! once, on two streams.

use crate::support::steps::plans::*;
use replay_arena::sim;
use replay_arena::{RunnerId, StepError};

#[test]
fn launches_of_one_graph_run_one_after_another_as_on_cuda() -> R {
    let sim = sim::Device::new();
    let (sa, sb) = (sim.new_stream(), sim.new_stream());
    let mut rp = temporaries_plan(&sim, &sa)?;
    // Unfenced (it owns no bytes), but its temporaries are not shared
    // between two launches in flight: launches of one graph are serialized.
    rp.replay(RunnerId(1), &sa)?;
    rp.replay(RunnerId(1), &sb)?;
    rp.synchronize()?;
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    // As on CUDA, a graph with memory nodes cannot be copied into a step
    // graph, and this one's capture kept no step copy to move in.
    let mut step = rp.step();
    let err = step.replay(RunnerId(1), &sa).unwrap_err();
    assert!(
        matches!(
            err,
            replay_arena::StepError::NoStepCopy {
                runner: RunnerId(1),
                captured: 0,
                ..
            }
        ),
        "{err}"
    );
    assert!(matches!(step.build(), Err(StepError::Empty)));
    Ok(())
}
