//! What a hostile user tried against the fence, on the `sim` backend: each
//! test is one hole that must stay closed.

use std::panic::{catch_unwind, AssertUnwindSafe};

use replay_arena::sim::{SimBackend, SimOp, SimStream};
use replay_arena::{
    CaptureError, Capturing, ConsumeError, DType, Discovering, Domain, PlanConfig, Policy,
    ReplayError, Replayable, Request, RunnerId,
};

/// 64 f32s: one device alignment unit.
const F32_64: Request = Request::new(Domain::Device, DType::F32, 64);

/// Runner `r` records `runners[r]`; planned under `policy` and allocated on
/// a fresh sim, with one stream.
fn allocated(
    runners: &[&[Request]],
    policy: Policy,
) -> (SimBackend, SimStream, Capturing<SimBackend>) {
    let runners = runners
        .iter()
        .enumerate()
        .map(|(r, requests)| (RunnerId(r as u32), requests.iter().copied()));
    let sim = SimBackend::new();
    let stream = sim.stream();
    let capturing = Discovering::from_runners(PlanConfig::new(), runners)
        .unwrap()
        .plan(policy)
        .unwrap()
        .allocate(sim.clone())
        .unwrap();
    (sim, stream, capturing)
}

/// Runners `0..n`, each filling its one view with `runner + 5` in `ticks`;
/// sealed under `policy`.
fn sealed(n: u32, policy: Policy, ticks: u64) -> (SimBackend, Replayable<SimBackend>) {
    let runners = vec![&[F32_64][..]; n as usize];
    let (sim, stream, mut capturing) = allocated(&runners, policy);
    for r in 0..n {
        let cap = capturing.capture(RunnerId(r)).unwrap();
        let view = cap.take(F32_64).unwrap();
        cap.stream_capture(&stream, |s| {
            sim.launch(s, SimOp::fill(&view, r as f32 + 5.0), ticks)
        })
        .unwrap();
        cap.finish().unwrap();
    }
    (sim, capturing.seal().unwrap())
}

/// A consumer that copies the runner's view into `out`, taking `ticks`.
fn copy_out(
    sim: &SimBackend,
    replayable: &mut Replayable<SimBackend>,
    runner: u32,
    stream: &SimStream,
    out: &replay_arena::sim::SimBuffer,
    ticks: u64,
) -> Result<(), ConsumeError<replay_arena::BackendError>> {
    replayable.consume(RunnerId(runner), stream, |s, views| {
        sim.launch(s, SimOp::copy(&views[0], out), ticks)
    })
}

#[test]
fn consuming_bytes_another_runner_claimed_since_is_overwritten_naming_it() {
    // G = 1: runners 0 and 1 share one arena.
    let (sim, mut replayable) = sealed(2, Policy::Generations(1), 5);
    let (a, b, x) = (sim.stream(), sim.stream(), sim.stream());
    let out = sim.alloc_f32(64).unwrap();
    replayable.replay(RunnerId(0), &a).unwrap();
    replayable.replay(RunnerId(1), &b).unwrap();
    let err = copy_out(&sim, &mut replayable, 0, &x, &out, 1).unwrap_err();
    assert!(matches!(
        err,
        ConsumeError::Replay(ReplayError::Overwritten {
            runner: RunnerId(0),
            by: RunnerId(1)
        })
    ));
    assert!(err.to_string().contains("overwritten by runner 1"), "{err}");
    // The consumer never ran: the output is untouched.
    assert_eq!(sim.read_f32(&out).unwrap(), vec![0.0; 64]);
    assert!(sim.hazards().is_empty());
}

#[test]
fn consuming_a_runner_never_replayed_is_not_replayed_even_after_another_claimed_its_bytes() {
    let (sim, mut replayable) = sealed(2, Policy::Generations(1), 5);
    let out = sim.alloc_f32(64).unwrap();
    for claimed_by_another in [false, true] {
        if claimed_by_another {
            replayable.replay(RunnerId(0), &sim.stream()).unwrap();
        }
        let err = copy_out(&sim, &mut replayable, 1, &sim.stream(), &out, 1).unwrap_err();
        assert!(matches!(
            err,
            ConsumeError::Replay(ReplayError::NotReplayed {
                runner: RunnerId(1)
            })
        ));
    }
}

#[test]
fn a_consumer_reads_its_runners_value_and_the_next_claimer_waits_for_it() {
    // G = 1 on three streams: the consumer of runner 0 is slow; runner 1's
    // replay claims the same bytes and must wait for it.
    let (sim, mut replayable) = sealed(2, Policy::Generations(1), 5);
    let (a, b, x) = (sim.stream(), sim.stream(), sim.stream());
    let out = sim.alloc_f32(64).unwrap();
    replayable.replay(RunnerId(0), &a).unwrap();
    copy_out(&sim, &mut replayable, 0, &x, &out, 100).unwrap();
    replayable.replay(RunnerId(1), &b).unwrap();
    assert_eq!(sim.read_f32(&out).unwrap(), vec![5.0; 64]);
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    assert!(sim.stream_time(&b) >= sim.stream_time(&x));
}

#[test]
fn a_panic_inside_the_work_closure_ends_the_stream_capture() {
    let (sim, stream, mut capturing) = allocated(&[&[F32_64], &[F32_64]], Policy::Generations(2));
    let unwound = catch_unwind(AssertUnwindSafe(|| {
        let cap = capturing.capture(RunnerId(0)).unwrap();
        let view = cap.take(F32_64).unwrap();
        let _ = cap.stream_capture(&stream, |s| {
            sim.launch(s, SimOp::fill(&view, 1.0), 1).unwrap();
            if view.len() == 64 {
                panic!("kernel wrapper panicked");
            }
            Ok::<(), String>(())
        });
    }));
    assert!(unwound.is_err());
    // The stream is no longer capturing: eager work on it runs...
    let buf = sim.alloc_f32(4).unwrap();
    sim.launch(&stream, SimOp::fill(&buf, 3.0), 1).unwrap();
    assert_eq!(sim.read_f32(&buf).unwrap(), vec![3.0; 4]);
    // ...and the next capture on it works.
    let cap = capturing.capture(RunnerId(1)).unwrap();
    let view = cap.take(F32_64).unwrap();
    cap.stream_capture(&stream, |s| sim.launch(s, SimOp::fill(&view, 2.0), 1))
        .unwrap();
    cap.finish().unwrap();
    // Runner 0 is failed for good, with the reason.
    let err = capturing.capture(RunnerId(0)).unwrap_err();
    assert!(err.to_string().contains("panicked"), "{err}");
}

#[test]
fn a_panic_inside_a_consumer_after_it_enqueued_work_stays_fenced() {
    let (sim, mut replayable) = sealed(2, Policy::Generations(1), 5);
    let (a, b, x) = (sim.stream(), sim.stream(), sim.stream());
    let out = sim.alloc_f32(64).unwrap();
    replayable.replay(RunnerId(0), &a).unwrap();
    let unwound = catch_unwind(AssertUnwindSafe(|| {
        let _ = replayable.consume(RunnerId(0), &x, |s, views| {
            sim.launch(s, SimOp::copy(&views[0], &out), 100).unwrap();
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

#[test]
fn seal_ignores_a_dropped_capture_of_a_runner_that_uses_no_buffers() {
    // Runner 1 requests nothing.
    let (sim, stream, mut capturing) = allocated(&[&[F32_64], &[]], Policy::Generations(1));
    drop(capturing.capture(RunnerId(1)).unwrap());
    let cap = capturing.capture(RunnerId(0)).unwrap();
    let view = cap.take(F32_64).unwrap();
    cap.stream_capture(&stream, |s| sim.launch(s, SimOp::fill(&view, 1.0), 1))
        .unwrap();
    cap.finish().unwrap();
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
    cap.stream_capture(&stream, |s| sim.launch(s, SimOp::fill(&view, 1.0), 1))
        .unwrap();
    let again = cap
        .stream_capture(&stream, |s| sim.launch(s, SimOp::fill(&view, 2.0), 1))
        .unwrap_err();
    assert!(matches!(
        again,
        replay_arena::StreamCaptureError::Capture(CaptureError::GraphAlreadyCaptured { .. })
    ));
    cap.finish().unwrap();
}
