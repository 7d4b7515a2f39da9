//! The holes a hostile pass found in handoffs and step graphs, from safe
//! code only, one test each (each failed before its fix).

use std::panic::{catch_unwind, AssertUnwindSafe};

use replay_arena::sim;
use replay_arena::{
    DType, Discovering, Domain, Error, PlanConfig, Policy, ReplayError, Replayable, Request,
    RunnerId, StepError, Streams,
};

type R<T = ()> = Result<T, Box<dyn std::error::Error>>;

fn req(n: u64) -> Request {
    Request::new(Domain::Device, DType::F32, n)
}

/// At G = 1, handoffs H0 (runner 0 to 1) and H1 (runner 3 to 4) have
/// lifetimes that do not meet, so the plan gives them the same bytes.
fn shared_handoff_plan(
    sim: &sim::Device,
    s: &sim::Stream,
    out: &sim::HostBuffer,
) -> R<Replayable<sim::Device>> {
    let mut d = Discovering::new(PlanConfig::new());
    let h0 = {
        let mut a = d.arm(RunnerId(0))?;
        a.record(req(64))?;
        a.hand_off(req(64))?
    };
    d.arm(RunnerId(1))?.receive(h0)?;
    d.arm(RunnerId(2))?.record(req(64))?;
    let h1 = {
        let mut a = d.arm(RunnerId(3))?;
        a.record(req(64))?;
        a.hand_off(req(64))?
    };
    d.arm(RunnerId(4))?.receive(h1)?;
    let planned = d.plan(Policy::Generations(1))?;
    let places: Vec<_> = planned.handoffs().map(|h| (h.arena, h.offset)).collect();
    assert_eq!(places[0], places[1], "the two handoffs share bytes");
    let mut cap = planned.allocate(sim.clone())?;
    for (r, h, val) in [(0, h0, 1.0), (3, h1, 3.0)] {
        let c = cap.capture(RunnerId(r))?;
        let (w, dx) = (c.take(req(64))?, c.hand_off(h)?);
        c.stream_capture(s, |s| {
            sim.launch(s, sim::Op::fill(&dx, val), 5)?;
            c.ready(h, s)?;
            sim.launch(s, sim::Op::fill(&w, 7.0), 1)?;
            Ok::<(), Error>(())
        })?;
        c.finish()?;
    }
    for (r, h) in [(1, h0), (4, h1)] {
        let c = cap.capture(RunnerId(r))?;
        let dy = c.receive(h)?;
        c.stream_capture(s, |s| sim.launch(s, sim::Op::copy(&dy, out), 50))?;
        c.finish()?;
    }
    let c = cap.capture(RunnerId(2))?;
    let w = c.take(req(64))?;
    c.stream_capture(s, |s| sim.launch(s, sim::Op::fill(&w, 2.0), 5))?;
    c.finish()?;
    Ok(cap.seal()?)
}

#[test]
fn a_reader_of_a_handoff_whose_bytes_another_handoff_took_is_refused() -> R {
    let sim = sim::Device::new();
    let (sa, sb, sc) = (sim.stream(), sim.stream(), sim.stream());
    let out = sim.alloc_f32(64)?;
    let mut rp = shared_handoff_plan(&sim, &sa, &out)?;
    rp.replay(RunnerId(0), &sa)?;
    rp.replay(RunnerId(3), &sc)?; // H1 over H0's bytes
    assert!(matches!(
        rp.replay(RunnerId(1), &sb),
        Err(ReplayError::HandoffOverwritten {
            writer: RunnerId(0),
            by: RunnerId(3),
            ..
        })
    ));
    // In capture order all is well.
    rp.replay(RunnerId(0), &sa)?;
    rp.replay(RunnerId(1), &sb)?;
    rp.synchronize()?;
    assert_eq!(sim.read_f32(&out)?[0], 1.0);
    // A step graph of the same bad schedule is refused at build.
    let mut step = rp.step();
    step.replay(RunnerId(0), &sa)?;
    step.replay(RunnerId(3), &sc)?;
    step.replay(RunnerId(1), &sb)?;
    assert!(matches!(
        step.build(),
        Err(StepError::Schedule(replay_arena::ScheduleError::Replay(
            replay_arena::ReplayError::HandoffOverwritten { .. }
        )))
    ));
    rp.synchronize()?;
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    Ok(())
}

#[test]
fn a_step_graph_readers_wait_for_the_ready_point_of_their_own_handoff() -> R {
    let sim = sim::Device::new();
    let (sa, sb) = (sim.stream(), sim.stream());
    let mut d = Discovering::new(PlanConfig::new());
    let (h0, h1) = {
        let mut a = d.arm(RunnerId(0))?;
        a.record(req(64))?;
        (a.hand_off(req(64))?, a.hand_off(req(64))?)
    };
    {
        let mut a = d.arm(RunnerId(1))?;
        a.record(req(64))?;
        a.receive(h0)?;
        a.receive(h1)?;
    }
    let mut cap = d.plan(Policy::OverlapDepth(2))?.allocate(sim.clone())?;
    {
        let c = cap.capture(RunnerId(0))?;
        let (w, x0, x1) = (c.take(req(64))?, c.hand_off(h0)?, c.hand_off(h1)?);
        c.stream_capture(&sa, |s| {
            sim.launch(s, sim::Op::fill(&x0, 1.0), 5)?;
            c.ready(h0, s)?;
            sim.launch(s, sim::Op::fill(&x1, 2.0), 500)?; // h1 is written long after h0
            c.ready(h1, s)?;
            sim.launch(s, sim::Op::fill(&w, 3.0), 5)?;
            Ok::<(), Error>(())
        })?;
        c.finish()?;
    }
    {
        let c = cap.capture(RunnerId(1))?;
        let (w, y0, y1) = (c.take(req(64))?, c.receive(h0)?, c.receive(h1)?);
        c.stream_capture(&sb, |s| {
            sim.launch(s, sim::Op::copy(&y1, &w), 5)?;
            sim.launch(s, sim::Op::add(&y0, &w), 5)
        })?;
        c.finish()?;
    }
    let mut rp = cap.seal()?;
    rp.replay(RunnerId(0), &sa)?;
    rp.replay(RunnerId(1), &sb)?;
    {
        let mut step = rp.step();
        step.replay(RunnerId(0), &sa)?;
        step.replay(RunnerId(1), &sb)?;
        let mut g = step.build()?;
        for _ in 0..3 {
            g.launch(&sa)?;
        }
    }
    rp.synchronize()?;
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    assert_eq!(sim.read_f32(&rp.views(RunnerId(1))?[0])?[0], 3.0);
    Ok(())
}

/// A runner that requests nothing but allocates a temporary in its graph.
fn temporaries_plan(sim: &sim::Device, s: &sim::Stream) -> R<Replayable<sim::Device>> {
    let mut d = Discovering::new(PlanConfig::new());
    d.arm(RunnerId(0))?.record(req(64))?;
    d.arm(RunnerId(1))?;
    let mut cap = d.plan(Policy::Generations(1))?.allocate(sim.clone())?;
    {
        let c = cap.capture(RunnerId(0))?;
        let v = c.take(req(64))?;
        c.stream_capture(s, |s| sim.launch(s, sim::Op::fill(&v, 1.0), 5))?;
        c.finish()?;
    }
    let c = cap.capture(RunnerId(1))?;
    c.stream_capture(s, |s| {
        let t = sim.alloc_async(s, 64)?;
        sim.launch(s, sim::Op::fill(&t, 5.0), 50)?;
        sim.free_async(s, &t)
    })?;
    c.finish()?;
    Ok(cap.seal()?)
}

#[test]
fn launches_of_one_graph_run_one_after_another_as_on_cuda() -> R {
    let sim = sim::Device::new();
    let (sa, sb) = (sim.stream(), sim.stream());
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

#[test]
fn a_capture_starting_on_another_thread_never_lets_a_replay_skip_its_wait() -> R {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let sim = sim::Device::new();
    let (s, t) = (sim.stream(), sim.stream());
    // G = 1: runner 1 waits for runner 0 on the other stream every time.
    let rs = (0..2).map(|r| (RunnerId(r), [req(16)]));
    let mut cap = Discovering::from_runners(PlanConfig::new(), rs)?
        .plan(Policy::Generations(1))?
        .allocate(sim.clone())?;
    for r in 0..2 {
        let c = cap.capture(RunnerId(r))?;
        let v = c.take(req(16))?;
        c.stream_capture(&s, |s| sim.launch(s, sim::Op::fill(&v, r as f32), 3))?;
        c.finish()?;
    }
    let mut a = cap.seal()?;
    let stop = Arc::new(AtomicBool::new(false));
    let capturer = {
        let (sim, s, stop) = (sim.clone(), s.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let rs = [(RunnerId(0), [req(16)])];
                let mut cap = Discovering::from_runners(PlanConfig::new(), rs)
                    .unwrap()
                    .plan(Policy::Generations(1))
                    .unwrap()
                    .allocate(sim.clone())
                    .unwrap();
                let c = cap.capture(RunnerId(0)).unwrap();
                let _ = c.stream_capture(&s, |_| Ok::<(), Error>(()));
            }
        })
    };
    let start = std::time::Instant::now();
    while start.elapsed() < std::time::Duration::from_millis(1500) && sim.hazards().is_empty() {
        for (r, st) in [(0u32, &s), (1, &t)] {
            // Refusals (the stream is capturing) are fine; skipped waits
            // are not.
            let _ = a.replay(RunnerId(r), st);
        }
    }
    stop.store(true, Ordering::Relaxed);
    capturer.join().unwrap();
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards().first());
    Ok(())
}

#[test]
fn a_panicking_step_consumer_leaves_the_plans_views_as_they_were() -> R {
    let sim = sim::Device::new();
    let (sa, sb) = (sim.stream(), sim.stream());
    let mut rp = temporaries_plan(&sim, &sa)?;
    let before = format!("{:?}", rp.views(RunnerId(0))?[0]);
    {
        let mut step = rp.step();
        step.replay(RunnerId(0), &sa)?;
        let panicked = catch_unwind(AssertUnwindSafe(|| {
            let _ = step.consume(RunnerId(0), &sb, |_, _| -> Result<(), String> {
                panic!("the consumer's closure panics")
            });
        }));
        assert!(panicked.is_err());
        assert!(!Streams::is_capturing(&sim, &sb)?);
    }
    let after = rp.views(RunnerId(0))?[0];
    assert_eq!(before, format!("{after:?}"));
    assert!(!after.is_read_only());
    // The stream is free and the plan goes on.
    rp.replay(RunnerId(0), &sa)?;
    rp.consume(RunnerId(0), &sb, |_, _| Ok::<(), String>(()))?;
    Ok(())
}

#[test]
fn a_step_consumer_of_a_runner_never_replayed_is_refused() -> R {
    let sim = sim::Device::new();
    let s = sim.stream();
    let mut rp = temporaries_plan(&sim, &s)?;
    let mut step = rp.step();
    step.consume(RunnerId(0), &s, |_, _| Ok::<(), String>(()))?;
    step.replay(RunnerId(0), &s)?;
    assert!(matches!(
        step.build(),
        Err(StepError::Schedule(replay_arena::ScheduleError::Consume(
            replay_arena::ConsumeError::NotReplayed {
                runner: RunnerId(0)
            }
        )))
    ));
    // Replayed before the step graph: its first launch reads that replay.
    rp.replay(RunnerId(0), &s)?;
    let mut step = rp.step();
    step.consume(RunnerId(0), &s, |_, _| Ok::<(), String>(()))?;
    step.replay(RunnerId(0), &s)?;
    step.build()?.launch(&s)?;
    Ok(())
}

#[test]
fn a_stream_of_another_backend_is_never_taken_for_one_of_this_backend() -> R {
    let sim = sim::Device::new();
    let other = sim::Device::new();
    let s = sim.stream();
    let foreign = other.stream(); // index 0, as `s`
    let mut rp = temporaries_plan(&sim, &s)?;
    rp.replay(RunnerId(0), &s)?;
    assert!(rp.wait_for(RunnerId(0), &foreign).is_err());
    assert!(rp.wait_all(&foreign).is_err());
    Ok(())
}

// The second hostile pass.

#[test]
fn a_step_graph_sees_a_handoff_overwritten_before_the_step() -> R {
    let sim = sim::Device::new();
    let (sa, sb) = (sim.stream(), sim.stream());
    let out = sim.alloc_f32(64)?;
    let mut rp = shared_handoff_plan(&sim, &sa, &out)?;
    rp.replay(RunnerId(0), &sa)?; // H0
    rp.replay(RunnerId(3), &sa)?; // H1, over H0's bytes
    let mut step = rp.step();
    step.replay(RunnerId(1), &sb)?; // would read H0 before its writer
    step.replay(RunnerId(0), &sa)?;
    assert!(matches!(
        step.build(),
        Err(StepError::Schedule(replay_arena::ScheduleError::Replay(
            replay_arena::ReplayError::HandoffOverwritten {
                by: RunnerId(3),
                ..
            }
        )))
    ));
    Ok(())
}

#[test]
fn waiting_for_a_reader_without_bytes_of_its_own_waits_for_its_reads() -> R {
    let mut d = Discovering::new(PlanConfig::new());
    let h = {
        let mut a = d.arm(RunnerId(0))?;
        a.record(req(64))?;
        a.hand_off(req(64))?
    };
    d.arm(RunnerId(1))?.receive(h)?;
    let sim = sim::Device::new();
    let (sa, sb, opt) = (sim.stream(), sim.stream(), sim.stream());
    let out = sim.alloc_f32(64)?;
    let mut cap = d.plan(Policy::Generations(2))?.allocate(sim.clone())?;
    {
        let c = cap.capture(RunnerId(0))?;
        let (w, x) = (c.take(req(64))?, c.hand_off(h)?);
        c.stream_capture(&sa, |s| {
            sim.launch(s, sim::Op::fill(&x, 1.0), 5)?;
            sim.launch(s, sim::Op::fill(&w, 7.0), 5)
        })?;
        c.finish()?;
    }
    {
        let c = cap.capture(RunnerId(1))?;
        let y = c.receive(h)?;
        c.stream_capture(&sa, |s| sim.launch(s, sim::Op::copy(&y, &out), 50))?;
        c.finish()?;
    }
    let mut rp = cap.seal()?;
    rp.replay(RunnerId(0), &sa)?;
    rp.replay(RunnerId(1), &sb)?; // its graph writes `out`
    rp.wait_for(RunnerId(1), &opt)?;
    let copy = sim.alloc_f32(64)?;
    sim.launch(&opt, sim::Op::copy(&out, &copy), 1)?;
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    assert_eq!(sim.read_f32(&copy)?[0], 1.0);
    Ok(())
}

#[test]
fn a_replay_whose_record_fails_after_its_launch_still_tracks_every_read() -> R {
    use std::sync::atomic::{AtomicBool, Ordering};
    let q = req(64);
    let mut d = Discovering::new(PlanConfig::new());
    let h0 = {
        let mut a = d.arm(RunnerId(0))?;
        a.record(q)?;
        a.hand_off(q)?
    };
    let h1 = {
        let mut a = d.arm(RunnerId(1))?;
        a.record(q)?;
        a.hand_off(q)?
    };
    {
        let mut a = d.arm(RunnerId(2))?; // reads both, no bytes of its own
        a.receive(h0)?;
        a.receive(h1)?;
    }
    let sim = sim::Device::new();
    let (sa, sb, s) = (sim.stream(), sim.stream(), sim.stream());
    let out = sim.alloc_f32(64)?;
    let mut cap = d.plan(Policy::Generations(2))?.allocate(sim.clone())?;
    for (r, h) in [(0u32, h0), (1, h1)] {
        let c = cap.capture(RunnerId(r))?;
        let (w, x) = (c.take(q)?, c.hand_off(h)?);
        c.stream_capture(&sa, |st| {
            sim.launch(st, sim::Op::fill(&x, 1.0 + r as f32), 5)?;
            sim.launch(st, sim::Op::fill(&w, 7.0), 5)
        })?;
        c.finish()?;
    }
    {
        let c = cap.capture(RunnerId(2))?;
        let (y0, y1) = (c.receive(h0)?, c.receive(h1)?);
        c.stream_capture(&sa, |st| {
            sim.launch(st, sim::Op::add(&y0, &out), 50)?;
            sim.launch(st, sim::Op::add(&y1, &out), 50)
        })?;
        c.finish()?;
    }
    let mut rp = cap.seal()?;
    // Another thread's captures toggle capture mode on the reader's stream.
    let n = 3000u32;
    let mut other =
        Discovering::from_runners(PlanConfig::new(), (0..n).map(|r| (RunnerId(r), [q])))?
            .plan(Policy::Generations(1))?
            .allocate(sim.clone())?;
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let (s2, stop) = (s.clone(), &stop);
        scope.spawn(move || {
            for r in 0..n {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let c = other.capture(RunnerId(r)).unwrap();
                let _v = c.take(q).unwrap();
                let _ = c.stream_capture(&s2, |_| Ok::<(), String>(()));
                let _ = c.finish();
            }
        });
        for _ in 0..2000 {
            // Refusals are fine; untracked reads are not.
            let _ = rp.replay(RunnerId(0), &sa);
            let _ = rp.replay(RunnerId(1), &sb);
            let _ = rp.replay(RunnerId(2), &s);
            if !sim.hazards().is_empty() {
                break;
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    let _ = rp.replay(RunnerId(0), &sa);
    let _ = rp.replay(RunnerId(1), &sb);
    rp.synchronize()?;
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards().first());
    Ok(())
}
