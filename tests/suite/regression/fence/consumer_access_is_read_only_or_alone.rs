//! A consumer may only read its views, and a writing consumer
//! (`consume_mut`) is alone on its runner's bytes.

use crate::support::attacks::replayed_on_first;
use replay_arena::sim;
use replay_arena::{BackendError, Misuse, RunnerId};

#[test]
fn a_consumer_may_only_read_its_views_and_a_writing_consumer_is_alone() {
    let (sim, [_pool, x, y], mut replayable) = replayed_on_first(1);
    let out = sim.alloc_f32(64).unwrap();
    replayable
        .consume(RunnerId(0), &x, |s, views| {
            let err = sim
                .launch(s, sim::Kernel::fill(&views[0], 7.0), 50)
                .unwrap_err();
            assert!(
                err.to_string().contains("consumer's view, which it reads"),
                "{err}"
            );
            let BackendError::InvalidView {
                reason: Misuse::ReadOnly {
                    runner, handoff, ..
                },
            } = &err
            else {
                panic!("{err:?}")
            };
            assert_eq!((*runner, *handoff), (RunnerId(0), false), "{err:?}");
            sim.launch(s, sim::Kernel::copy(&views[0], &out), 100)
        })
        .unwrap();
    // A writing consumer on another stream waits for the reader above.
    replayable
        .consume_mut(RunnerId(0), &y, |s, views| {
            sim.launch(s, sim::Kernel::scale(&views[0], 2.0), 10)
        })
        .unwrap();
    replayable.synchronize().unwrap();
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    assert_eq!(sim.read_f32(&out).unwrap(), vec![5.0; 64]);
    let v = replayable.views(RunnerId(0)).unwrap()[0];
    assert_eq!(sim.read_f32(&v).unwrap(), vec![10.0; 64]);
}
