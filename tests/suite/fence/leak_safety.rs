//! No safety rests on a destructor: `mem::forget` is safe, so every guard
//! and phase value a program holds is forgotten here, then the worst next
//! thing is done (replay a runner sharing the bytes, read a handoff,
//! consume, re-plan, drop the plan and allocate a new one on the same
//! backend). Leaking memory is allowed; a hazard, a stale completion or a
//! freed arena under queued work is not. One guard per test; the table in
//! `docs/safety.md` ("Forgetting a guard") says what each one leaks.
//!
//! Also here: a launch on a stream that is capturing is the crate's typed
//! error, for replays, unfenced replays and step graphs alike.

use replay_arena::sim;
use replay_arena::{
    CaptureError, Capturing, DType, Discovering, Domain, Error, Operation, PlanConfig, Policy,
    ReplayError, Replayable, Request, RunnerId,
};

type R<T = ()> = Result<T, Box<dyn std::error::Error>>;

const REQ: Request = Request::new(Domain::Device, DType::F32, 64);

/// Two runners at G = 1 (so they share one arena), each filling its view
/// with `r + 1` for `duration` ticks; runner 0 also hands a gradient to
/// runner 1, which adds it into `sink`.
fn two_runners(
    sim: &sim::Device,
    stream: &sim::Stream,
    sink: &sim::HostBuffer,
    duration: u64,
) -> R<Replayable<sim::Device>> {
    let mut d = Discovering::new(PlanConfig::new());
    let h = {
        let mut a = d.arm(RunnerId(0))?;
        a.record(REQ)?;
        a.hand_off(REQ)?
    };
    {
        let mut a = d.arm(RunnerId(1))?;
        a.record(REQ)?;
        a.receive(h)?;
    }
    let mut capturing = d.plan(Policy::Generations(1))?.allocate(sim.clone())?;
    {
        let cap = capturing.capture(RunnerId(0))?;
        let (v, dx) = (cap.take(REQ)?, cap.hand_off(h)?);
        cap.stream_capture(stream, |s| {
            sim.launch(s, sim::Kernel::fill(&v, 1.0), duration)?;
            sim.launch(s, sim::Kernel::fill(&dx, 10.0), duration)
        })?;
        cap.finish()?;
    }
    {
        let cap = capturing.capture(RunnerId(1))?;
        let (v, dy) = (cap.take(REQ)?, cap.receive(h)?);
        cap.stream_capture(stream, |s| {
            sim.launch(s, sim::Kernel::fill(&v, 2.0), duration)?;
            sim.launch(s, sim::Kernel::add(&dy, sink), duration)
        })?;
        cap.finish()?;
    }
    Ok(capturing.seal()?)
}

/// A fresh backend with three streams and [`two_runners`] captured on `a`,
/// its handoff adding into `sink` (so `sink` lives as long as the plan).
struct Two {
    sim: sim::Device,
    a: sim::Stream,
    b: sim::Stream,
    l: sim::Stream,
    sink: sim::HostBuffer,
    rp: Replayable<sim::Device>,
}

/// [`Two`] whose graphs run for `duration` ticks each.
fn two(duration: u64) -> R<Two> {
    let sim = sim::Device::new();
    let (a, b, l) = (sim.new_stream(), sim.new_stream(), sim.new_stream());
    let sink = sim.alloc_f32(64)?;
    let rp = two_runners(&sim, &a, &sink, duration)?;
    Ok(Two {
        sim,
        a,
        b,
        l,
        sink,
        rp,
    })
}

/// [`two`], then a step graph of runner 0 (on `a`) launched `launches`
/// times on `l` and forgotten.
fn two_with_a_forgotten_step(duration: u64, launches: usize) -> R<Two> {
    let mut t = two(duration)?;
    forget_a_step_of_runner_0(&mut t.rp, &t.a, &t.l, launches)?;
    Ok(t)
}

/// Waits for everything `rp` queued; nothing overlapped on `sim`.
fn race_free(sim: &sim::Device, rp: &mut Replayable<sim::Device>) -> R {
    rp.synchronize()?;
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    Ok(())
}

/// Replays runner 0 on `first` and runner 1 on `second`, race-free.
fn both_replay_race_free(
    sim: &sim::Device,
    rp: &mut Replayable<sim::Device>,
    first: &sim::Stream,
    second: &sim::Stream,
) -> R {
    rp.replay(RunnerId(0), first)?;
    rp.replay(RunnerId(1), second)?;
    race_free(sim, rp)
}

/// A step graph of runner 0 alone (on `lane`), launched `launches` times
/// on `launch`, then forgotten.
fn forget_a_step_of_runner_0(
    rp: &mut Replayable<sim::Device>,
    lane: &sim::Stream,
    launch: &sim::Stream,
    launches: usize,
) -> R {
    let mut step = rp.step();
    step.replay(RunnerId(0), lane)?;
    let mut graph = step.build()?;
    for _ in 0..launches {
        graph.launch(launch)?;
    }
    std::mem::forget(graph);
    Ok(())
}

#[test]
fn a_forgotten_step_graph_leaves_a_replay_of_its_bytes_ordered_after_it() -> R {
    let mut t = two_with_a_forgotten_step(100, 3)?;
    // Runner 0's writes are queued on `l`; runner 1 shares the arena.
    t.rp.replay(RunnerId(1), &t.b)?;
    t.rp.replay(RunnerId(0), &t.a)?;
    race_free(&t.sim, &mut t.rp)
}

#[test]
fn a_forgotten_step_graph_leaves_a_reader_of_its_handoff_ordered_after_it() -> R {
    let mut t = two_with_a_forgotten_step(100, 2)?;
    // The step wrote the handoff; its reader waits for that write.
    t.rp.replay(RunnerId(1), &t.b)?;
    race_free(&t.sim, &mut t.rp)?;
    assert_eq!(t.sim.read_f32(&t.sink)?[0], 10.0);
    // The handoff's state moved with the step: the reader read its write.
    assert!(matches!(
        t.rp.replay(RunnerId(1), &t.b),
        Err(ReplayError::HandoffAlreadyRead { .. })
    ));
    Ok(())
}

#[test]
fn a_forgotten_step_graph_leaves_consumers_reading_what_it_wrote() -> R {
    let mut t = two_with_a_forgotten_step(100, 1)?;
    let (sim, side, out) = (&t.sim, &t.b, t.sim.alloc_f32(64)?);
    // Runner 0 was never replayed per runner: the step's launch made it
    // the owner of its bytes.
    t.rp.consume(RunnerId(0), side, |s, v| {
        sim.launch(s, sim::Kernel::copy(&v[0], &out), 5)
    })?;
    race_free(sim, &mut t.rp)?;
    assert_eq!(sim.read_f32(&out)?, vec![1.0; 64]);
    Ok(())
}

#[test]
fn a_forgotten_step_graph_counts_its_launches() -> R {
    let t = two_with_a_forgotten_step(1, 4)?;
    assert_eq!(t.rp.fence_stats().step_launches, 4);
    Ok(())
}

#[test]
fn a_forgotten_step_graph_is_waited_for_by_replan_and_the_next_plan_is_race_free() -> R {
    let t = two_with_a_forgotten_step(1_000, 3)?;
    let events = t.sim.live_events();
    drop(t.rp.replan()?);
    // The step graph's completion event is all it leaked.
    assert_eq!(t.sim.live_events(), 1, "{events} before the replan");
    let mut next = two_runners(&t.sim, &t.b, &t.sink, 1)?;
    both_replay_race_free(&t.sim, &mut next, &t.b, &t.a)
}

#[test]
fn a_step_launch_that_fails_leaves_the_fence_as_it_was() -> R {
    let mut t = two(1)?;
    let (rp, side) = (&mut t.rp, &t.b);
    let foreign = sim::Device::new().new_stream();
    {
        let mut step = rp.step();
        step.replay(RunnerId(0), &t.a)?;
        let mut graph = step.build()?;
        // A stream of another backend: refused, nothing ran.
        assert!(graph.launch(&foreign).is_err());
        std::mem::forget(graph);
    }
    // The step never ran: runner 0 never wrote its bytes or the handoff.
    let consumed = rp.consume(RunnerId(0), side, |_, _| Ok::<(), String>(()));
    assert!(
        matches!(
            consumed,
            Err(replay_arena::ConsumeError::NotReplayed { .. })
        ),
        "{consumed:?}"
    );
    assert!(matches!(
        rp.replay(RunnerId(1), side),
        Err(ReplayError::HandoffNotWritten { .. })
    ));
    assert_eq!(rp.fence_stats().step_launches, 0);
    Ok(())
}

#[test]
fn a_forgotten_step_builder_leaves_the_plan_as_it_was() -> R {
    let mut t = two(50)?;
    let (sim, rp, side) = (&t.sim, &mut t.rp, &t.l);
    let out = sim.alloc_f32(64)?;
    rp.replay(RunnerId(0), &t.a)?;
    {
        let mut step = rp.step();
        step.replay(RunnerId(1), &t.b)?;
        // Captured into the step, never run.
        step.consume(RunnerId(0), side, |s, v| {
            sim.launch(s, sim::Kernel::copy(&v[0], &out), 5)
        })?;
        std::mem::forget(step);
    }
    assert_eq!(sim.read_f32(&out)?, vec![0.0; 64], "the consumer never ran");
    rp.replay(RunnerId(1), &t.b)?;
    race_free(sim, rp)?;
    assert_eq!(sim.read_f32(&t.sink)?[0], 10.0);
    Ok(())
}

#[test]
fn a_forgotten_runner_capture_leaves_the_runner_uncaptured_and_capturable() -> R {
    let sim = sim::Device::new();
    let stream = sim.new_stream();
    let planned = Discovering::from_runners(PlanConfig::new(), [(RunnerId(0), [REQ])])?
        .plan(Policy::Generations(1))?;
    let mut capturing = planned.allocate(sim.clone())?;
    {
        let cap = capturing.capture(RunnerId(0))?;
        let v = cap.take(REQ)?;
        cap.stream_capture(&stream, |s| sim.launch(s, sim::Kernel::fill(&v, 9.0), 5))?;
        std::mem::forget(cap);
    }
    // Never finished: seal refuses, and hands the capturing phase back.
    let refused = capturing.seal().unwrap_err();
    assert!(
        matches!(refused.error(), CaptureError::Unfinished { runners } if runners == &[(RunnerId(0), None)]),
        "{refused}"
    );
    let mut rp = seal_filled(refused.into_capturing(), &sim, &stream, 1.0, 5)?;
    // The forgotten graph never ran.
    replays_to(&sim, &mut rp, &stream, 1.0)
}

#[test]
fn a_forgotten_armed_runner_keeps_what_it_recorded() -> R {
    let mut d = Discovering::new(PlanConfig::new());
    {
        let mut armed = d.arm(RunnerId(0))?;
        armed.record(REQ)?;
        // `ArmedRunner` has no `Drop` to skip today; the test pins that
        // none ever matters.
        #[allow(clippy::forget_non_drop)]
        std::mem::forget(armed);
    }
    d.arm(RunnerId(1))?.record(REQ)?;
    assert_eq!(d.requests(RunnerId(0)), Some(&[REQ][..]));
    let planned = d.plan(Policy::Generations(2))?;
    assert_eq!(planned.generation_of(RunnerId(0)), Some(0));
    assert_eq!(planned.generation_of(RunnerId(1)), Some(1));
    Ok(())
}

#[test]
fn a_forgotten_replayable_leaks_its_arenas_under_queued_work_and_the_next_plan_gets_other_memory(
) -> R {
    let mut t = two(10_000)?;
    t.rp.replay(RunnerId(0), &t.a)?;
    t.rp.replay(RunnerId(1), &t.b)?;
    let old = t.rp.views(RunnerId(0))?[0].device_address();
    let live = t.sim.live_allocations();
    std::mem::forget(t.rp);
    let mut next = two_runners(&t.sim, &t.b, &t.sink, 1)?;
    assert_ne!(next.views(RunnerId(0))?[0].device_address(), old);
    both_replay_race_free(&t.sim, &mut next, &t.b, &t.a)?;
    drop(next);
    assert_live(&t.sim, live, "only the forgotten plan's arenas");
    Ok(())
}

#[test]
fn forgotten_failed_transitions_leak_what_they_hold_and_nothing_runs() -> R {
    let sim = sim::Device::new();
    let runners = || Discovering::from_runners(PlanConfig::new(), [(RunnerId(0), [REQ])]);
    // A failed plan holds the discovery (host data).
    std::mem::forget(runners()?.plan(Policy::Generations(0)).unwrap_err());
    // A failed allocation frees what it allocated before handing the plan
    // back.
    sim.fail_allocations_after(Some(0));
    let failed = runners()?
        .plan(Policy::Generations(1))?
        .allocate(sim.clone());
    sim.fail_allocations_after(None);
    std::mem::forget(failed.unwrap_err());
    assert_eq!(sim.live_allocations(), 0);
    // A failed seal holds the capturing phase: its arenas and events leak.
    let capturing = runners()?
        .plan(Policy::Generations(1))?
        .allocate(sim.clone())?;
    std::mem::forget(capturing.seal().unwrap_err());
    assert_eq!(sim.live_allocations(), 1);
    // The backend goes on: a new plan beside the leaked arena.
    let stream = sim.new_stream();
    let capturing = runners()?
        .plan(Policy::Generations(1))?
        .allocate(sim.clone())?;
    let mut rp = seal_filled(capturing, &sim, &stream, 3.0, 5)?;
    replays_to(&sim, &mut rp, &stream, 3.0)
}

// ---- launches on a capturing stream ----------------------------------------------

/// What `attempt` returns when given a stream another plan is capturing.
fn on_a_capturing_stream<T>(sim: &sim::Device, attempt: impl FnOnce(&sim::Stream) -> T) -> R<T> {
    let mut got = None;
    while_captured(sim, &sim.new_stream(), |s| got = Some(attempt(s)))?;
    Ok(got.expect("`while_captured` runs its closure"))
}

/// The refusal of `op` on a capturing stream.
fn capturing(op: Operation) -> replay_arena::StreamCapturing {
    replay_arena::StreamCapturing { op }
}

#[test]
fn a_replay_on_a_capturing_stream_is_a_typed_error() -> R {
    let mut t = two(1)?;
    let (sim, a, rp) = (&t.sim, &t.a, &mut t.rp);
    let got = on_a_capturing_stream(sim, |s| rp.replay(RunnerId(0), s))?;
    let replay_0 = capturing(Operation::Replay(RunnerId(0)));
    assert_eq!(got, Err(ReplayError::StreamCapturing(replay_0)));
    // Nothing was enqueued or tracked: runner 0 was never replayed.
    assert!(matches!(
        rp.replay(RunnerId(1), a),
        Err(ReplayError::HandoffNotWritten { .. })
    ));
    Ok(())
}

#[test]
fn an_unfenced_replay_on_a_capturing_stream_is_a_typed_error() -> R {
    let mut t = two(1)?;
    let (sim, rp) = (&t.sim, &mut t.rp);
    let got = on_a_capturing_stream(sim, |s| {
        // SAFETY: nothing else of the plan runs.
        unsafe { rp.replay_unfenced(RunnerId(0), s) }
    })?;
    let replay_0 = capturing(Operation::Replay(RunnerId(0)));
    assert_eq!(got, Err(ReplayError::StreamCapturing(replay_0)));
    Ok(())
}

#[test]
fn a_step_graph_launch_on_a_capturing_stream_is_a_typed_error() -> R {
    let mut t = two(1)?;
    let (sim, a, rp) = (&t.sim, &t.a, &mut t.rp);
    let mut step = rp.step();
    step.replay(RunnerId(0), a)?;
    let mut graph = step.build()?;
    let got = on_a_capturing_stream(sim, |s| graph.launch(s))?;
    let step_launch = capturing(Operation::StepLaunch);
    assert_eq!(
        got,
        Err(replay_arena::StepLaunchError::StreamCapturing(step_launch))
    );
    assert_eq!(graph.launches(), 0);
    let e: Error = got.unwrap_err().into();
    assert!(e.to_string().contains("capturing"), "{e}");
    Ok(())
}

// ---- teardown that cannot wait, and captures racing the fence ------------------

/// A one-runner plan whose graph fills its view with `value` for `duration`.
fn one_runner(
    sim: &sim::Device,
    stream: &sim::Stream,
    value: f32,
    duration: u64,
) -> R<Replayable<sim::Device>> {
    let capturing = Discovering::from_runners(PlanConfig::new(), [(RunnerId(0), [REQ])])?
        .plan(Policy::Generations(1))?
        .allocate(sim.clone())?;
    seal_filled(capturing, sim, stream, value, duration)
}

/// Captures runner 0 of `capturing` on `stream` (its graph fills its view
/// with `value` for `duration`) and seals.
fn seal_filled(
    mut capturing: Capturing<sim::Device>,
    sim: &sim::Device,
    stream: &sim::Stream,
    value: f32,
    duration: u64,
) -> R<Replayable<sim::Device>> {
    let cap = capturing.capture(RunnerId(0))?;
    let v = cap.take(REQ)?;
    cap.stream_capture(stream, |s| {
        sim.launch(s, sim::Kernel::fill(&v, value), duration)
    })?;
    cap.finish()?;
    Ok(capturing.seal()?)
}

/// Runner 0 replayed on `stream` leaves `value` in its view.
fn replays_to(
    sim: &sim::Device,
    rp: &mut Replayable<sim::Device>,
    stream: &sim::Stream,
    value: f32,
) -> R {
    rp.replay(RunnerId(0), stream)?;
    rp.synchronize()?;
    assert_eq!(sim.read_f32(&rp.views(RunnerId(0))?[0])?, vec![value; 64]);
    Ok(())
}

/// [`one_runner`] replayed once on `stream` (so the replay is queued), and
/// the backend's live allocations then.
fn one_replay_queued(
    sim: &sim::Device,
    stream: &sim::Stream,
    duration: u64,
) -> R<(Replayable<sim::Device>, usize)> {
    let mut rp = one_runner(sim, stream, 1.0, duration)?;
    rp.replay(RunnerId(0), stream)?;
    Ok((rp, sim.live_allocations()))
}

/// Runs `f` with `sim`'s waits failing if `fail`, then lets them succeed.
fn waits_failing<T>(sim: &sim::Device, fail: bool, f: impl FnOnce() -> T) -> T {
    sim.fail_waits(fail);
    let out = f();
    sim.fail_waits(false);
    out
}

/// Asserts that `sim` holds `live` allocations (`why` if it does not).
#[track_caller]
fn assert_live(sim: &sim::Device, live: usize, why: &str) {
    assert_eq!(sim.live_allocations(), live, "{why}");
}

#[test]
fn a_teardown_that_cannot_wait_leaks_the_arenas_instead_of_freeing_them() -> R {
    let sim = sim::Device::new();
    let a = sim.new_stream();
    let (rp, live) = one_replay_queued(&sim, &a, 1_000)?;
    waits_failing(&sim, true, || drop(rp));
    assert_live(&sim, live, "the arena was freed under its queued replay");

    let (rp, live) = one_replay_queued(&sim, &a, 1_000)?;
    let replanned = waits_failing(&sim, true, || rp.replan());
    assert!(
        matches!(replanned, Err(replay_arena::BackendFailure { .. })),
        "{replanned:?}"
    );
    assert_live(&sim, live, "the arena was freed under its queued replay");
    Ok(())
}

/// Runs `inside` while another plan's capture holds `stream` (it gets the
/// capturing stream).
fn while_captured(sim: &sim::Device, stream: &sim::Stream, inside: impl FnOnce(&sim::Stream)) -> R {
    let planned = Discovering::from_runners(PlanConfig::new(), [(RunnerId(7), [REQ])])?
        .plan(Policy::Generations(1))?;
    let mut other = planned.allocate(sim.clone())?;
    let cap = other.capture(RunnerId(7))?;
    let v = cap.take(REQ)?;
    cap.stream_capture(stream, |s| {
        inside(s);
        sim.launch(s, sim::Kernel::fill(&v, 2.0), 1)
    })?;
    cap.finish()?;
    Ok(())
}

#[test]
fn a_teardown_whose_completion_stream_another_plan_captures_waits_or_leaks() -> R {
    let sim = sim::Device::new();
    let (a, l) = (sim.new_stream(), sim.new_stream());
    // A replay queued on `a` (its record deferred), then teardown while a
    // capture holds `a`: the record is refused, and teardown waits for the
    // whole backend instead; if that fails too, it leaks.
    for fail in [false, true] {
        let (rp, live) = one_replay_queued(&sim, &a, 1_000_000)?;
        let mut replanned = None;
        while_captured(&sim, &a, |_| {
            replanned = Some(waits_failing(&sim, fail, || rp.replan().map(drop)));
        })?;
        let replanned = replanned.unwrap();
        if fail {
            assert!(replanned.is_err());
            assert_live(&sim, live, "freed under the queued replay");
        } else {
            assert!(replanned.is_ok(), "{replanned:?}");
        }
    }
    // The same with a forgotten step graph's launch queued on `l`.
    let mut rp = one_runner(&sim, &a, 1.0, 1_000_000)?;
    {
        let mut step = rp.step();
        step.replay(RunnerId(0), &a)?;
        let mut graph = step.build()?;
        graph.launch(&l)?;
        std::mem::forget(graph);
    }
    let live = sim.live_allocations();
    while_captured(&sim, &l, |_| waits_failing(&sim, true, || drop(rp)))?;
    assert_live(&sim, live, "freed under the queued step launch");
    Ok(())
}

#[test]
fn no_fence_call_works_on_a_stream_another_plan_captures() -> R {
    let sim = sim::Device::new();
    let (a, b) = (sim.new_stream(), sim.new_stream());
    let mut rp = one_runner(&sim, &a, 1.0, 10)?;
    rp.replay(RunnerId(0), &a)?; // its record is deferred on `a`
    let mut got = Vec::new();
    while_captured(&sim, &a, |_| {
        got.push(format!("{:?}", rp.wait_for(RunnerId(0), &a)));
        got.push(format!("{:?}", rp.wait_all(&a)));
        // On `b`, the wait must record on `a`, which the capture holds.
        got.push(format!("{:?}", rp.wait_for(RunnerId(0), &b)));
        got.push(format!("{:?}", rp.replay(RunnerId(0), &b)));
    })?;
    for g in &got {
        assert!(g.starts_with("Err("), "{got:?}");
    }
    // Afterwards everything works, and nothing overlapped.
    rp.replay(RunnerId(0), &b)?;
    race_free(&sim, &mut rp)
}

#[test]
fn a_consumer_racing_another_plans_capture_on_its_stream_is_never_captured_into_it() -> R {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let sim = sim::Device::new();
    let (a, c) = (sim.new_stream(), sim.new_stream());
    let mut rp = one_runner(&sim, &a, 1.0, 1)?;
    let captures = 40_000u32;
    let mut other = Discovering::from_runners(
        PlanConfig::new(),
        (0..captures).map(|r| (RunnerId(r), Vec::<Request>::new())),
    )?
    .plan(Policy::Generations(1))?
    .allocate(sim.clone())?;
    let stop = Arc::new(AtomicBool::new(false));
    let (sim1, c1, stop1) = (sim.clone(), c.clone(), stop.clone());
    let racer = std::thread::spawn(move || {
        while !stop1.load(Ordering::Relaxed) {
            if rp.replay(RunnerId(0), &c1).is_ok() {
                let _ = rp.consume_mut(RunnerId(0), &c1, |s, v| {
                    sim1.launch(s, sim::Kernel::scale(&v[0], 2.0), 1)
                });
            }
        }
        rp
    });
    for r in 0..captures {
        let cap = other.capture(RunnerId(r))?;
        if cap.stream_capture(&c, |_| Ok::<(), String>(())).is_ok() {
            cap.finish()?;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let rp = racer.join().expect("the racing thread");
    drop(rp);
    let other = match other.seal() {
        Ok(rp) => rp,
        Err(e) => e.into_capturing().seal().map_err(|e| e.into_error())?,
    };
    let empty = replay_arena::sim::Graph::default();
    for r in 0..captures {
        if let Some(g) = other.graph(RunnerId(r)) {
            assert_eq!(
                *g, empty,
                "runner {r}'s empty capture recorded another plan's work"
            );
        }
    }
    Ok(())
}
