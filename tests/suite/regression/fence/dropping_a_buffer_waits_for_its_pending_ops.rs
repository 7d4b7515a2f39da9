//! Dropping a `sim` buffer lets the ops pending on it end first.

use crate::support::steps::fence::*;
use replay_arena::sim;
use replay_arena::RunnerId;

#[test]
fn dropping_a_buffer_lets_its_pending_ops_end_first() {
    let sim = sim::Device::new();
    let s = sim.new_stream();
    let x = sim.alloc_f32(64).unwrap();
    sim.launch(&s, sim::Kernel::fill(&x, 13.0), 1_000).unwrap();
    drop(x);
    // Whatever reuses the memory now, nothing pending writes it.
    let mut pa = one_runner(&sim, &s, 1.0);
    pa.replay(RunnerId(0), &s).unwrap();
    let fresh = sim.alloc_f32(64).unwrap();
    assert_eq!(sim.read_f32(&fresh).unwrap(), vec![0.0; 64]);
    let v = pa.views(RunnerId(0)).unwrap()[0];
    assert_eq!(sim.read_f32(&v).unwrap(), vec![1.0; 64]);
    assert!(sim.hazards().is_empty());
}
