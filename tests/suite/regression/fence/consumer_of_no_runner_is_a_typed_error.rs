//! A consumer of a runner the plan does not have is a typed error, not a
//! panic.

use crate::support::steps::fence::*;
use replay_arena::Policy;

#[test]
fn a_consumer_of_no_runner_is_a_typed_error() {
    let (sim, mut replayable) = sealed(1, Policy::Generations(1), 5);
    let err = replayable
        .consume_many(&[], &sim.new_stream(), |_, _| Ok::<(), String>(()))
        .unwrap_err();
    assert!(
        matches!(err, replay_arena::ConsumeError::NoRunners),
        "{err:?}"
    );
}
