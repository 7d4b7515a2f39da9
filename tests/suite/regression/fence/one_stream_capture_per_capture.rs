//! A runner's capture takes exactly one stream capture: `finish` without
//! one is `NoGraphCaptured`, a second is refused, a nested one from its own
//! closure is refused and the outer capture goes on, and `seal` ignores a
//! dropped capture of a runner that uses no buffers.

use crate::support::attacks::assert_capture_refused;
use crate::support::capture_view;
use crate::support::record_and_finish;
use crate::support::steps::fence::*;
use replay_arena::sim;
use replay_arena::{CaptureError, Policy, RunnerId};

#[test]
fn seal_ignores_a_dropped_capture_of_a_runner_that_uses_no_buffers() {
    // Runner 1 requests nothing.
    let (sim, stream, mut capturing) = allocated(&[&[F32_64], &[]], Policy::Generations(1));
    drop(capturing.capture(RunnerId(1)).unwrap());
    capture_view(&mut capturing, RunnerId(0), F32_64, &stream, |s, view| {
        sim.launch(s, sim::Kernel::fill(&view, 1.0), 1)
    });
    let replayable = capturing.seal().unwrap();
    assert!(replayable.graph(RunnerId(1)).is_none());
}

#[test]
fn finish_without_a_stream_capture_is_no_graph_captured() {
    let (_sim, _stream, mut capturing) = allocated(&[&[F32_64]], Policy::Generations(1));
    let cap = capturing.capture(RunnerId(0)).unwrap();
    cap.take(F32_64).unwrap();
    assert_eq!(
        cap.finish().unwrap_err(),
        CaptureError::NoGraphCaptured {
            runner: RunnerId(0)
        }
    );
}

#[test]
fn a_second_stream_capture_on_one_capture_is_refused() {
    let (sim, stream, mut capturing) = allocated(&[&[F32_64]], Policy::Generations(1));
    let cap = capturing.capture(RunnerId(0)).unwrap();
    let view = cap.take(F32_64).unwrap();
    cap.stream_capture(&stream, |s| sim.launch(s, sim::Kernel::fill(&view, 1.0), 1))
        .unwrap();
    let again = cap.stream_capture(&stream, |s| sim.launch(s, sim::Kernel::fill(&view, 2.0), 1));
    let runner = RunnerId(0);
    assert_capture_refused(again, CaptureError::GraphAlreadyCaptured { runner });
    cap.finish().unwrap();
}

#[test]
fn stream_capture_called_from_its_own_closure_is_refused_and_the_outer_capture_goes_on() {
    let (sim, stream, mut capturing) = allocated(&[&[F32_64]], Policy::Generations(1));
    let cap = capturing.capture(RunnerId(0)).unwrap();
    let view = cap.take(F32_64).unwrap();
    let other = sim.new_stream();
    record_and_finish!(cap, &stream, |s| {
        let nested =
            cap.stream_capture(&other, |o| sim.launch(o, sim::Kernel::fill(&view, 9.0), 1));
        let runner = RunnerId(0);
        assert_capture_refused(nested, CaptureError::NestedCapture { runner });
        sim.launch(s, sim::Kernel::fill(&view, 1.0), 1)
    });
    let mut replayable = capturing.seal().unwrap();
    assert_eq!(replayable.graph(RunnerId(0)).unwrap().ops().len(), 1);
    replayable.replay(RunnerId(0), &stream).unwrap();
    let view = replayable.views(RunnerId(0)).unwrap()[0];
    assert_eq!(sim.read_f32(&view).unwrap(), vec![1.0; 64]);
}
