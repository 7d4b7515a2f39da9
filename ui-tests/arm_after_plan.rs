//! Proves: no request after the backward that discovered them: `plan`
//! consumes the `Discovering`, so arming another runner is a use of a moved
//! value.
use replay_arena::{Discovering, PlanConfig, Policy, RunnerId};

fn main() {
    let mut discovery = Discovering::new(PlanConfig::new());
    let _planned = discovery.plan(Policy::Generations(2)).unwrap();
    let _armed = discovery.arm(RunnerId(0));
}
