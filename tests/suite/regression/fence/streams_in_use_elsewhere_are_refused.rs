//! A stream another capture records (on this thread or another) is
//! refused to a consumer, and a capture cannot open on a stream a consumer
//! works on: no plan's work is recorded into another plan's graph.
//!
//! The finding (fixed): a consumer on another thread could open on a
//! stream between a capture closure's return and the end of the capture,
//! and its work was recorded into the other plan's graph; a capture now
//! keeps its stream claimed until its stream capture has ended.

use crate::support::attacks::{assert_capture_refused, replayed_on_first};
use crate::support::capture_view;
use crate::support::steps::fence::*;
use replay_arena::sim;
use replay_arena::{CaptureError, Capturing, Operation, Replayable, RunnerId};

/// A device with streams `a` and `other`; plan A (one runner filling its
/// view with 1, captured on `a`) replayed on `replayed_on`'s pick of the
/// two; plan B (one runner) allocated on the same device.
fn plans_a_and_b(
    replayed_on: fn(&[sim::Stream; 2]) -> &sim::Stream,
) -> (
    sim::Device,
    [sim::Stream; 2],
    Replayable<sim::Device>,
    Capturing<sim::Device>,
) {
    let sim = sim::Device::new();
    let streams = [sim.new_stream(), sim.new_stream()];
    let mut pa = one_runner(&sim, &streams[0], 1.0);
    pa.replay(RunnerId(0), replayed_on(&streams)).unwrap();
    let b = on_sim(&sim, &[F32_64]);
    (sim, streams, pa, b)
}

#[test]
fn a_consumer_on_a_stream_another_capture_records_is_refused() {
    // Replayed on the stream plan B captures on: the consumer's wait would
    // be implied by stream order, and its work recorded into B's graph.
    let (sim, [_a, s_cap], mut pa, mut b) = plans_a_and_b(|[_, other]| other);
    capture_view(&mut b, RunnerId(0), F32_64, &s_cap, |s, view| {
        let inner = pa.consume(RunnerId(0), s, |s2, v| {
            sim.launch(s2, sim::Kernel::fill(&v[0], 99.0), 10)
        });
        assert!(
            matches!(
                inner,
                Err(replay_arena::ConsumeError::StreamCapturing(
                    replay_arena::StreamCapturing {
                        op: Operation::Consume(RunnerId(0))
                    }
                ))
            ),
            "{inner:?}"
        );
        sim.launch(s, sim::Kernel::fill(&view, 5.0), 10)
    });
    let b = b.seal().unwrap();
    assert_eq!(
        b.graph(RunnerId(0)).unwrap().ops().len(),
        1,
        "only B's own op"
    );
}

#[test]
fn a_capture_opened_on_a_consumers_stream_is_refused() {
    let (sim, [_a, c], mut pa, mut capturing) = plans_a_and_b(|[a, _]| a);
    pa.consume(RunnerId(0), &c, |s, v| -> Result<(), String> {
        let cap = capturing.capture(RunnerId(0)).map_err(|e| e.to_string())?;
        let view = cap.take(F32_64).map_err(|e| e.to_string())?;
        let refused = cap.stream_capture(s, |s2| {
            sim.launch(s2, sim::Kernel::fill(&view, 5.0), 10)?;
            sim.launch(s2, sim::Kernel::fill(&v[0], 66.0), 10)
        });
        let runner = RunnerId(0);
        assert_capture_refused(refused, CaptureError::StreamInUse { runner });
        Ok(())
    })
    .unwrap();
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
}

#[test]
fn a_capture_on_a_stream_another_threads_consumer_works_on_is_refused() {
    use std::sync::mpsc::channel;
    let (sim, [_pool, a], mut replayable) = replayed_on_first(1);
    let (inside_tx, inside_rx) = channel::<()>();
    let (done_tx, done_rx) = channel();
    std::thread::scope(|scope| {
        let (sim, a) = (&sim, &a);
        scope.spawn(move || {
            let mut capturing = on_sim(sim, &[F32_64]);
            let cap = capturing.capture(RunnerId(0)).unwrap();
            let v = cap.take(F32_64).unwrap();
            inside_rx.recv().unwrap(); // the other thread's consumer is open on `a`
            let refused = cap.stream_capture(a, |s| sim.launch(s, sim::Kernel::fill(&v, 1.0), 1));
            done_tx.send(format!("{refused:?}")).unwrap();
        });
        replayable
            .consume(RunnerId(0), a, |_, _| {
                inside_tx.send(()).unwrap();
                let refused = done_rx.recv().unwrap();
                assert!(refused.contains("StreamInUse"), "{refused}");
                Ok::<(), String>(())
            })
            .unwrap();
    });
}
