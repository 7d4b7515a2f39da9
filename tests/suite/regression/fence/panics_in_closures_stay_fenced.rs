//! A panic inside a capture's work closure ends the stream capture, and a
//! panic inside a consumer after it enqueued work leaves that work fenced.

use crate::support::attacks::replayed_on_first;
use crate::support::capture_view;
use crate::support::steps::fence::*;
use replay_arena::sim;
use replay_arena::{Policy, RunnerId};
use std::panic::{catch_unwind, AssertUnwindSafe};

#[test]
fn a_panic_inside_the_work_closure_ends_the_stream_capture() {
    let (sim, stream, mut capturing) = allocated(&[&[F32_64], &[F32_64]], Policy::Generations(2));
    let unwound = catch_unwind(AssertUnwindSafe(|| {
        let cap = capturing.capture(RunnerId(0)).unwrap();
        let view = cap.take(F32_64).unwrap();
        let _ = cap.stream_capture(&stream, |s| {
            sim.launch(s, sim::Kernel::fill(&view, 1.0), 1).unwrap();
            if view.len() == 64 {
                panic!("kernel wrapper panicked");
            }
            Ok::<(), String>(())
        });
    }));
    assert!(unwound.is_err());
    // The stream is no longer capturing: eager work on it runs...
    let buf = sim.alloc_f32(4).unwrap();
    sim.launch(&stream, sim::Kernel::fill(&buf, 3.0), 1)
        .unwrap();
    assert_eq!(sim.read_f32(&buf).unwrap(), vec![3.0; 4]);
    // ...and the next capture on it works.
    capture_view(&mut capturing, RunnerId(1), F32_64, &stream, |s, view| {
        sim.launch(s, sim::Kernel::fill(&view, 2.0), 1)
    });
    // Runner 0 is failed for good, with the reason.
    let err = capturing.capture(RunnerId(0)).unwrap_err();
    assert!(err.to_string().contains("panicked"), "{err}");
}

#[test]
fn a_panic_inside_a_consumer_after_it_enqueued_work_stays_fenced() {
    let (sim, [_a, b, x], mut replayable) = replayed_on_first(2);
    let out = sim.alloc_f32(64).unwrap();
    let unwound = catch_unwind(AssertUnwindSafe(|| {
        let _ = replayable.consume(RunnerId(0), &x, |s, views| {
            sim.launch(s, sim::Kernel::copy(&views[0], &out), 100)
                .unwrap();
            if views.len() == 1 {
                panic!("consumer panicked after enqueuing");
            }
            Ok::<(), String>(())
        });
    }));
    assert!(unwound.is_err());
    replayable.replay(RunnerId(1), &b).unwrap();
    assert_eq!(sim.read_f32(&out).unwrap(), vec![5.0; 64]);
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
}
