//! What a hostile user tried against the fence, on the `sim` backend: each
//! test is one hole that must stay closed.

use std::panic::{catch_unwind, AssertUnwindSafe};

use replay_arena::sim;
use replay_arena::{
    CaptureError, Capturing, ConsumeError, DType, Discovering, Domain, Operation, PlanConfig,
    Policy, Replayable, Request, RunnerId,
};

/// One runner recording `requests`, planned in one generation and
/// allocated on `sim`.
fn on_sim(sim: &sim::Device, requests: &[Request]) -> Capturing<sim::Device> {
    Discovering::from_runners(PlanConfig::new(), [(RunnerId(0), requests.iter().copied())])
        .unwrap()
        .plan(Policy::Generations(1))
        .unwrap()
        .allocate(sim.clone())
        .unwrap()
}

/// 64 f32s: one device alignment unit.
const F32_64: Request = Request::new(Domain::Device, DType::F32, 64);

/// Runner `r` records `runners[r]`; planned under `policy` and allocated on
/// a fresh sim, with one stream.
fn allocated(
    runners: &[&[Request]],
    policy: Policy,
) -> (sim::Device, sim::Stream, Capturing<sim::Device>) {
    let runners = runners
        .iter()
        .enumerate()
        .map(|(r, requests)| (RunnerId(r as u32), requests.iter().copied()));
    let sim = sim::Device::new();
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
fn sealed(n: u32, policy: Policy, ticks: u64) -> (sim::Device, Replayable<sim::Device>) {
    let runners = vec![&[F32_64][..]; n as usize];
    let (sim, stream, mut capturing) = allocated(&runners, policy);
    for r in 0..n {
        let cap = capturing.capture(RunnerId(r)).unwrap();
        let view = cap.take(F32_64).unwrap();
        cap.stream_capture(&stream, |s| {
            sim.launch(s, sim::Op::fill(&view, r as f32 + 5.0), ticks)
        })
        .unwrap();
        cap.finish().unwrap();
    }
    (sim, capturing.seal().unwrap())
}

/// A consumer that copies the runner's view into `out`, taking `ticks`.
fn copy_out(
    sim: &sim::Device,
    replayable: &mut Replayable<sim::Device>,
    runner: u32,
    stream: &sim::Stream,
    out: &replay_arena::sim::HostBuffer,
    ticks: u64,
) -> Result<(), ConsumeError<replay_arena::BackendError>> {
    replayable.consume(RunnerId(runner), stream, |s, views| {
        sim.launch(s, sim::Op::copy(&views[0], out), ticks)
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
        replay_arena::ConsumeError::Overwritten {
            runner: RunnerId(0),
            by: RunnerId(1)
        }
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
            replay_arena::ConsumeError::NotReplayed {
                runner: RunnerId(1)
            }
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
            sim.launch(s, sim::Op::fill(&view, 1.0), 1).unwrap();
            if view.len() == 64 {
                panic!("kernel wrapper panicked");
            }
            Ok::<(), String>(())
        });
    }));
    assert!(unwound.is_err());
    // The stream is no longer capturing: eager work on it runs...
    let buf = sim.alloc_f32(4).unwrap();
    sim.launch(&stream, sim::Op::fill(&buf, 3.0), 1).unwrap();
    assert_eq!(sim.read_f32(&buf).unwrap(), vec![3.0; 4]);
    // ...and the next capture on it works.
    let cap = capturing.capture(RunnerId(1)).unwrap();
    let view = cap.take(F32_64).unwrap();
    cap.stream_capture(&stream, |s| sim.launch(s, sim::Op::fill(&view, 2.0), 1))
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
            sim.launch(s, sim::Op::copy(&views[0], &out), 100).unwrap();
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
    cap.stream_capture(&stream, |s| sim.launch(s, sim::Op::fill(&view, 1.0), 1))
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
    cap.stream_capture(&stream, |s| sim.launch(s, sim::Op::fill(&view, 1.0), 1))
        .unwrap();
    let again = cap
        .stream_capture(&stream, |s| sim.launch(s, sim::Op::fill(&view, 2.0), 1))
        .unwrap_err();
    assert!(matches!(
        again,
        replay_arena::StreamCaptureError::Capture(CaptureError::GraphAlreadyCaptured { .. })
    ));
    cap.finish().unwrap();
}

/// The sim's refusal of a view used where the fence cannot order it.
fn assert_out_of_scope<T: std::fmt::Debug>(result: Result<T, replay_arena::BackendError>) {
    use replay_arena::Misuse;
    let err = result.unwrap_err();
    assert!(
        matches!(
            err,
            replay_arena::BackendError::InvalidView {
                reason: Misuse::OutsideClosure { .. }
                    | Misuse::OtherStream { .. }
                    | Misuse::NoScope { .. }
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("outside the work closure")
            || err.to_string().contains("another stream")
            || err
                .to_string()
                .contains("not handed out by a capture or consumer"),
        "{err}"
    );
}

#[test]
fn a_capture_cannot_write_a_view_of_another_live_plan() {
    let (sim, stream, mut a) = allocated(&[&[F32_64]], Policy::Generations(1));
    let mut b = on_sim(&sim, &[F32_64]);
    let cap_a = a.capture(RunnerId(0)).unwrap();
    let theirs = cap_a.take(F32_64).unwrap();
    let cap_b = b.capture(RunnerId(0)).unwrap();
    let ours = cap_b.take(F32_64).unwrap();
    let other = sim.stream();
    cap_b
        .stream_capture(&other, |s| {
            // Plan A's view, taken but outside A's closure: refused, and the
            // refusal recorded nothing.
            assert_out_of_scope(sim.launch(s, sim::Op::fill(&theirs, 9.0), 1));
            sim.launch(s, sim::Op::fill(&ours, 1.0), 1)
        })
        .unwrap();
    // Nested inside A's own closure, A's view on B's stream is refused too.
    cap_a
        .stream_capture(&stream, |s| {
            assert_out_of_scope(sim.launch(&other, sim::Op::fill(&theirs, 9.0), 1));
            sim.launch(s, sim::Op::fill(&theirs, 2.0), 1)
        })
        .unwrap();
    cap_b.finish().unwrap();
    cap_a.finish().unwrap();
    let (a, b) = (a.seal().unwrap(), b.seal().unwrap());
    assert_eq!(b.graph(RunnerId(0)).unwrap().ops().len(), 1);
    assert_eq!(a.graph(RunnerId(0)).unwrap().ops().len(), 1);
}

#[test]
fn a_consumer_cannot_use_a_view_of_another_plan_or_on_another_stream() {
    let (sim, mut a) = sealed(1, Policy::Generations(1), 5);
    let (_, mut b) = {
        let runners = [(RunnerId(0), [F32_64])];
        let s = sim.stream();
        let mut c = Discovering::from_runners(PlanConfig::new(), runners)
            .unwrap()
            .plan(Policy::Generations(1))
            .unwrap()
            .allocate(sim.clone())
            .unwrap();
        let cap = c.capture(RunnerId(0)).unwrap();
        let v = cap.take(F32_64).unwrap();
        cap.stream_capture(&s, |s| sim.launch(s, sim::Op::fill(&v, 3.0), 1))
            .unwrap();
        cap.finish().unwrap();
        (s, c.seal().unwrap())
    };
    let (s1, s2) = (sim.stream(), sim.stream());
    a.replay(RunnerId(0), &s1).unwrap();
    b.replay(RunnerId(0), &s1).unwrap();
    let out = sim.alloc_f32(64).unwrap();
    a.consume(RunnerId(0), &s1, |s, mine| {
        b.consume(RunnerId(0), &s2, |_, theirs| {
            // B's view on A's consumer stream, and A's view on B's: refused.
            assert_out_of_scope(sim.launch(s, sim::Op::copy(&theirs[0], &out), 1));
            assert_out_of_scope(sim.launch(&s2, sim::Op::copy(&mine[0], &out), 1));
            Ok::<(), String>(())
        })
        .unwrap();
        // A's own view on another stream than its consumer's: refused.
        assert_out_of_scope(sim.launch(&s2, sim::Op::copy(&mine[0], &out), 1));
        Ok::<(), String>(())
    })
    .unwrap();
    assert_eq!(sim.read_f32(&out).unwrap(), vec![0.0; 64]);
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
}

#[test]
fn a_view_or_its_span_cannot_be_used_after_its_closure_returned() {
    let (sim, mut replayable) = sealed(2, Policy::Generations(1), 5);
    let (pool, side) = (sim.stream(), sim.stream());
    replayable.replay(RunnerId(0), &pool).unwrap();
    let mut kept = None;
    replayable
        .consume(RunnerId(0), &side, |_, views| {
            kept = Some(replay_arena::sim::AsSpan::span(&views[0]));
            Ok::<(), String>(())
        })
        .unwrap();
    let kept = kept.unwrap();
    // The span escaped the closure (it is plain data), but its scope closed:
    // it cannot race runner 1's replay, which claims the same bytes.
    replayable.replay(RunnerId(1), &pool).unwrap();
    assert_out_of_scope(sim.launch(&side, sim::Op::fill(&kept, 7.0), 50));
    // Views read from the plan are for addresses: no device work.
    let view = replayable.views(RunnerId(1)).unwrap()[0];
    assert_out_of_scope(sim.launch(&side, sim::Op::fill(&view, 7.0), 50));
    // Nor can a raw span of the same bytes get in.
    let raw = replay_arena::sim::Span::new(view.device_address(), 64);
    let err = sim.launch(&side, sim::Op::fill(&raw, 7.0), 50).unwrap_err();
    assert!(err.to_string().contains("lie in a plan's arena"), "{err}");
    assert_eq!(sim.read_f32(&view).unwrap(), vec![6.0; 64]);
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
}

#[test]
fn stream_capture_called_from_its_own_closure_is_refused_and_the_outer_capture_goes_on() {
    let (sim, stream, mut capturing) = allocated(&[&[F32_64]], Policy::Generations(1));
    let cap = capturing.capture(RunnerId(0)).unwrap();
    let view = cap.take(F32_64).unwrap();
    let other = sim.stream();
    cap.stream_capture(&stream, |s| {
        let nested = cap.stream_capture(&other, |o| sim.launch(o, sim::Op::fill(&view, 9.0), 1));
        assert!(
            matches!(
                nested,
                Err(replay_arena::StreamCaptureError::Capture(
                    CaptureError::NestedCapture {
                        runner: RunnerId(0)
                    }
                ))
            ),
            "{nested:?}"
        );
        sim.launch(s, sim::Op::fill(&view, 1.0), 1)
    })
    .unwrap();
    cap.finish().unwrap();
    let mut replayable = capturing.seal().unwrap();
    assert_eq!(replayable.graph(RunnerId(0)).unwrap().ops().len(), 1);
    replayable.replay(RunnerId(0), &stream).unwrap();
    let view = replayable.views(RunnerId(0)).unwrap()[0];
    assert_eq!(sim.read_f32(&view).unwrap(), vec![1.0; 64]);
}

#[test]
fn a_failed_sim_graph_launch_enqueues_nothing() {
    use replay_arena::{Capture, Launch};
    let sim = sim::Device::new();
    let (capture, other) = (sim.stream(), sim.stream());
    let kept = sim.alloc_f32(64).unwrap();
    let dropped = sim.alloc_f32(64).unwrap();
    sim.begin_capture(&capture).unwrap();
    sim.launch(&capture, sim::Op::fill(&kept, 1.0), 10).unwrap();
    sim.launch(&capture, sim::Op::fill(&dropped, 2.0), 10)
        .unwrap();
    // SAFETY: the capture this test began.
    let graph = unsafe { sim.end_capture(&capture) }.unwrap();
    drop(dropped);
    // SAFETY: the graph touches the program's own buffers only.
    let err = unsafe { Launch::launch(&sim, &graph, &other) }.unwrap_err();
    assert!(
        err.to_string().contains("outside every live allocation"),
        "{err}"
    );
    assert_eq!(sim.stream_time(&other), 0, "the first op was not enqueued");
    assert_eq!(sim.read_f32(&kept).unwrap(), vec![0.0; 64]);
}

// ---- found by a second hostile pass ----------------------------------------

/// One runner filling its view with `value` on `stream`, sealed.
fn one_runner(sim: &sim::Device, stream: &sim::Stream, value: f32) -> Replayable<sim::Device> {
    let mut capturing = on_sim(sim, &[F32_64]);
    let cap = capturing.capture(RunnerId(0)).unwrap();
    let v = cap.take(F32_64).unwrap();
    cap.stream_capture(stream, |s| sim.launch(s, sim::Op::fill(&v, value), 10))
        .unwrap();
    cap.finish().unwrap();
    capturing.seal().unwrap()
}

#[test]
fn a_consumer_on_a_stream_another_capture_records_is_refused() {
    let sim = sim::Device::new();
    let (a, s_cap) = (sim.stream(), sim.stream());
    let mut pa = one_runner(&sim, &a, 1.0);
    // Replayed on the stream plan B captures on: the consumer's wait would
    // be implied by stream order, and its work recorded into B's graph.
    pa.replay(RunnerId(0), &s_cap).unwrap();
    let mut b = on_sim(&sim, &[F32_64]);
    let cap = b.capture(RunnerId(0)).unwrap();
    let view = cap.take(F32_64).unwrap();
    cap.stream_capture(&s_cap, |s| {
        let inner = pa.consume(RunnerId(0), s, |s2, v| {
            sim.launch(s2, sim::Op::fill(&v[0], 99.0), 10)
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
        sim.launch(s, sim::Op::fill(&view, 5.0), 10)
    })
    .unwrap();
    cap.finish().unwrap();
    let b = b.seal().unwrap();
    assert_eq!(
        b.graph(RunnerId(0)).unwrap().ops().len(),
        1,
        "only B's own op"
    );
}

#[test]
fn a_capture_opened_on_a_consumers_stream_is_refused() {
    let sim = sim::Device::new();
    let (a, c) = (sim.stream(), sim.stream());
    let mut pa = one_runner(&sim, &a, 1.0);
    pa.replay(RunnerId(0), &a).unwrap();
    let mut capturing = on_sim(&sim, &[F32_64]);
    pa.consume(RunnerId(0), &c, |s, v| -> Result<(), String> {
        let cap = capturing.capture(RunnerId(0)).map_err(|e| e.to_string())?;
        let view = cap.take(F32_64).map_err(|e| e.to_string())?;
        let refused = cap.stream_capture(s, |s2| {
            sim.launch(s2, sim::Op::fill(&view, 5.0), 10)?;
            sim.launch(s2, sim::Op::fill(&v[0], 66.0), 10)
        });
        assert!(
            matches!(
                refused,
                Err(replay_arena::StreamCaptureError::Capture(
                    CaptureError::StreamInUse {
                        runner: RunnerId(0)
                    }
                ))
            ),
            "{refused:?}"
        );
        Ok(())
    })
    .unwrap();
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
}

#[test]
fn a_graph_whose_raw_span_now_names_a_plans_arena_is_refused_at_replay() {
    // The program captures a raw span of its own buffer, then frees it; a
    // later plan's arena may get the address. Retried until it does.
    let reused = (0..50).any(|_| {
        let sim = sim::Device::new();
        let (a, b) = (sim.stream(), sim.stream());
        let x = sim.alloc_f32(64).unwrap();
        let addr = replay_arena::sim::AsSpan::span(&x).addr();
        let mut capturing = on_sim(&sim, &[F32_64]);
        let cap = capturing.capture(RunnerId(0)).unwrap();
        let view = cap.take(F32_64).unwrap();
        cap.stream_capture(&a, |s| {
            sim.launch(s, sim::Op::fill(&view, 1.0), 10)?;
            sim.launch(
                s,
                sim::Op::fill(&replay_arena::sim::Span::new(addr, 64), 77.0),
                10,
            )
        })
        .unwrap();
        cap.finish().unwrap();
        let mut pb = capturing.seal().unwrap();
        drop(x);
        let mut pa = one_runner(&sim, &b, 2.0);
        let arena = pa.views(RunnerId(0)).unwrap()[0].device_address();
        pa.replay(RunnerId(0), &b).unwrap();
        let replayed = pb.replay(RunnerId(0), &a);
        if arena != addr {
            return false;
        }
        let err = replayed.unwrap_err();
        assert!(err.to_string().contains("lie in a plan's arena"), "{err}");
        let v = pa.views(RunnerId(0)).unwrap()[0];
        assert_eq!(sim.read_f32(&v).unwrap(), vec![2.0; 64]);
        assert!(sim.hazards().is_empty());
        true
    });
    assert!(reused, "the allocator never handed the address out again");
}

#[test]
fn dropping_a_buffer_lets_its_pending_ops_end_first() {
    let sim = sim::Device::new();
    let s = sim.stream();
    let x = sim.alloc_f32(64).unwrap();
    sim.launch(&s, sim::Op::fill(&x, 13.0), 1_000).unwrap();
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

// ---- found by a third hostile pass ------------------------------------------

#[test]
fn a_consumer_may_only_read_its_views_and_a_writing_consumer_is_alone() {
    let (sim, mut replayable) = sealed(1, Policy::Generations(1), 5);
    let (pool, x, y) = (sim.stream(), sim.stream(), sim.stream());
    replayable.replay(RunnerId(0), &pool).unwrap();
    let out = sim.alloc_f32(64).unwrap();
    replayable
        .consume(RunnerId(0), &x, |s, views| {
            let err = sim
                .launch(s, sim::Op::fill(&views[0], 7.0), 50)
                .unwrap_err();
            assert!(
                err.to_string().contains("consumer's view, which it reads"),
                "{err}"
            );
            assert!(
                matches!(
                    err,
                    replay_arena::BackendError::InvalidView {
                        reason: replay_arena::Misuse::ReadOnly {
                            runner: RunnerId(0),
                            handoff: false,
                            ..
                        }
                    }
                ),
                "{err:?}"
            );
            sim.launch(s, sim::Op::copy(&views[0], &out), 100)
        })
        .unwrap();
    // A writing consumer on another stream waits for the reader above.
    replayable
        .consume_mut(RunnerId(0), &y, |s, views| {
            sim.launch(s, sim::Op::scale(&views[0], 2.0), 10)
        })
        .unwrap();
    replayable.synchronize().unwrap();
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    assert_eq!(sim.read_f32(&out).unwrap(), vec![5.0; 64]);
    let v = replayable.views(RunnerId(0)).unwrap()[0];
    assert_eq!(sim.read_f32(&v).unwrap(), vec![10.0; 64]);
}

#[test]
fn a_capture_on_a_stream_another_threads_consumer_works_on_is_refused() {
    use std::sync::mpsc::channel;
    let (sim, mut replayable) = sealed(1, Policy::Generations(1), 5);
    let (pool, a) = (sim.stream(), sim.stream());
    replayable.replay(RunnerId(0), &pool).unwrap();
    let (inside_tx, inside_rx) = channel::<()>();
    let (done_tx, done_rx) = channel();
    std::thread::scope(|scope| {
        let (sim, a) = (&sim, &a);
        scope.spawn(move || {
            let mut capturing = on_sim(sim, &[F32_64]);
            let cap = capturing.capture(RunnerId(0)).unwrap();
            let v = cap.take(F32_64).unwrap();
            inside_rx.recv().unwrap(); // the other thread's consumer is open on `a`
            let refused = cap.stream_capture(a, |s| sim.launch(s, sim::Op::fill(&v, 1.0), 1));
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

#[test]
fn a_graph_temporary_works_only_inside_its_capture_closure() {
    let (sim, stream, mut capturing) = allocated(&[&[F32_64], &[F32_64]], Policy::Generations(2));
    let other = sim.stream();
    let mut kept = None;
    {
        let cap = capturing.capture(RunnerId(0)).unwrap();
        let v = cap.take(F32_64).unwrap();
        cap.stream_capture(&stream, |s| {
            let t = sim.alloc_async(s, 64)?;
            // Not on another stream, even inside the closure.
            assert!(sim.launch(&other, sim::Op::fill(&t, 3.0), 1).is_err());
            sim.launch(s, sim::Op::fill(&t, 2.0), 1)?;
            sim.launch(s, sim::Op::copy(&t, &v), 1)?;
            kept = Some(t);
            sim.free_async(s, &t)
        })
        .unwrap();
        cap.finish().unwrap();
    }
    let kept = kept.unwrap();
    // Outside its closure, and in another runner's graph: refused.
    assert!(sim.launch(&other, sim::Op::fill(&kept, 9.0), 1).is_err());
    let cap = capturing.capture(RunnerId(1)).unwrap();
    let v1 = cap.take(F32_64).unwrap();
    let refused = cap.stream_capture(&stream, |s| {
        sim.launch(s, sim::Op::fill(&v1, 1.0), 1)?;
        sim.launch(s, sim::Op::fill(&kept, 9.0), 1)
    });
    assert!(refused.is_err());
    // Outside every capture there is nothing to allocate into.
    assert!(sim.alloc_async(&other, 16).is_err());
}

#[test]
fn a_consumer_of_no_runner_is_a_typed_error() {
    let (sim, mut replayable) = sealed(1, Policy::Generations(1), 5);
    let err = replayable
        .consume_many(&[], &sim.stream(), |_, _| Ok::<(), String>(()))
        .unwrap_err();
    assert!(
        matches!(err, replay_arena::ConsumeError::NoRunners),
        "{err:?}"
    );
}
