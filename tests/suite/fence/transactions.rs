//! Failed operations on `sim` with injected faults: a launch that fails
//! leaves the fence as it was, so nothing later skips a wait it needs.

use crate::support::capture_view;
use crate::support::steps::allocate_runners;
use replay_arena::sim::{self, Call, Faults};

use crate::support::steps::allocate_discovered;
use replay_arena::{
    BackendError, DType, Discovering, Domain, PlanConfig, Policy, Purpose, ReplayError, Replayable,
    Request, RunnerId,
};

const Q: Request = Request::new(Domain::Device, DType::F32, 64);

/// A new sim with two streams, and two runners on it sharing one
/// generation's bytes (G = 1), each filling its view for 20 ticks.
fn two_runners() -> (sim::Device, [sim::Stream; 2], Replayable<sim::Device>) {
    let sim = sim::Device::new();
    let streams = [sim.new_stream(), sim.new_stream()];
    let mut capturing = allocate_runners(
        &sim,
        (0..2).map(|r| (RunnerId(r), [Q])),
        Policy::Generations(1),
    );
    let s = sim.new_stream();
    for r in 0..2 {
        capture_view(&mut capturing, RunnerId(r), Q, &s, |s, view| {
            sim.launch(s, sim::Kernel::fill(&view, r as f32), 20)
        });
    }
    (sim, streams, capturing.seal().unwrap())
}

#[test]
fn a_kept_step_whose_launch_on_another_stream_fails_leaves_the_fence_to_its_launch_before() {
    let (sim, [a, b], mut rp) = two_runners();
    let mut step = rp.step();
    step.replay(RunnerId(0), &a).unwrap();
    let mut kept = step.build().unwrap().keep();
    rp.launch_kept(&mut kept, &a).unwrap();
    // The next launch, on `b`, fails in the backend.
    sim.inject(Faults::nth(Call::Launch, 0));
    let failed = rp.launch_kept(&mut kept, &b);
    assert!(matches!(
        failed,
        Err(replay_arena::StepLaunchError::Backend(
            replay_arena::BackendFailure {
                error: BackendError::Injected { .. },
                ..
            }
        ))
    ));
    sim.inject(Faults::none());
    // A good launch on `a`, then a replay on `b` of a runner sharing the
    // step's bytes: it must wait for that launch.
    rp.launch_kept(&mut kept, &a).unwrap();
    rp.replay(RunnerId(1), &b).unwrap();
    assert_eq!(sim.hazards(), []);
    assert_eq!(kept.launches(), 2, "the failed launch does not count");
    assert_eq!(rp.fence_stats().step_launches, 2);
}

#[test]
fn a_borrowed_step_whose_launch_on_another_stream_fails_leaves_the_fence_to_its_launch_before() {
    let (sim, [a, b], mut rp) = two_runners();
    let mut step = rp.step();
    step.replay(RunnerId(0), &a).unwrap();
    let mut graph = step.build().unwrap();
    graph.launch(&a).unwrap();
    sim.inject(Faults::nth(Call::Launch, 0));
    assert!(graph.launch(&b).is_err());
    sim.inject(Faults::none());
    graph.launch(&a).unwrap();
    drop(graph);
    rp.replay(RunnerId(1), &b).unwrap();
    assert_eq!(sim.hazards(), []);
}

#[test]
fn a_failed_replay_leaves_its_runner_unreplayed_and_counts_nothing() {
    // Runner 1 on `b` must wait for runner 0 on `a`: the record, the wait
    // or the launch fails in turn.
    for call in [Call::RecordEvent, Call::WaitEvent, Call::Launch] {
        let (sim, [a, b], mut rp) = two_runners();
        rp.replay(RunnerId(0), &a).unwrap();
        let before = rp.fence_stats();
        sim.inject(Faults::nth(call, 0));
        let failed = rp.replay(RunnerId(1), &b);
        sim.inject(Faults::none());
        assert!(
            matches!(
                failed,
                Err(ReplayError::Backend(replay_arena::BackendFailure {
                    runner: Some(RunnerId(1)),
                    error: BackendError::Injected { .. },
                    ..
                }))
            ),
            "{call}: {failed:?}"
        );
        assert_eq!(rp.fence_stats(), before, "{call}");
        // Runner 0 still owns the bytes: a consumer of it may read them.
        let sink = sim.alloc_f32(64).unwrap();
        rp.consume(RunnerId(0), &b, |s, v| {
            sim.launch(s, sim::Kernel::copy(&v[0], &sink), 1)
        })
        .unwrap();
        assert_eq!(sim.read_f32(&sink).unwrap(), [0.0; 64]);
        rp.replay(RunnerId(1), &b).unwrap();
        rp.replay(RunnerId(0), &a).unwrap();
        assert_eq!(sim.hazards(), []);
    }
}

#[test]
fn a_staged_input_whose_write_failed_is_not_staged() {
    let sim = sim::Device::new();
    let s = sim.new_stream();
    let input = Q.purpose(Purpose::Input);
    let mut capturing = allocate_runners(&sim, [(RunnerId(0), [input])], Policy::Generations(1));
    capture_view(&mut capturing, RunnerId(0), input, &s, |s, view| {
        sim.launch(s, sim::Kernel::scale(&view, 2.0), 5)
    });
    let mut rp = capturing.seal().unwrap();
    let host = sim.alloc_f32(64).unwrap();
    rp.consume_mut(RunnerId(0), &s, |s, v| {
        sim.launch(s, sim::Kernel::copy(&host, &v[0]), 1)
    })
    .unwrap();
    rp.replay(RunnerId(0), &s).unwrap();
    let consumers = rp.fence_stats().consumers;
    // The next write fails half-way (its kernel fails): not staged.
    let failed = rp.consume_mut(RunnerId(0), &s, |s, v| {
        sim.launch(s, sim::Kernel::fill(&v[0], 1.0), 1)
            .map_err(|e| e.to_string())?;
        Err::<(), _>("the copy from the host failed".to_string())
    });
    assert!(failed.is_err());
    assert_eq!(rp.fence_stats().consumers, consumers, "work that failed");
    assert!(matches!(
        rp.replay(RunnerId(0), &s),
        Err(ReplayError::InputNotStaged { by: None, .. })
    ));
    // A panicking write is not staged either.
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        rp.consume_mut(RunnerId(0), &s, |_, _| -> Result<(), String> {
            panic!("the program's writer panicked")
        })
    }));
    assert!(unwound.is_err());
    assert!(matches!(
        rp.replay(RunnerId(0), &s),
        Err(ReplayError::InputNotStaged { .. })
    ));
    // A write that succeeds stages them again.
    rp.consume_mut(RunnerId(0), &s, |s, v| {
        sim.launch(s, sim::Kernel::fill(&v[0], 3.0), 1)
    })
    .unwrap();
    rp.replay(RunnerId(0), &s).unwrap();
    assert_eq!(
        sim.read_f32(&rp.views(RunnerId(0)).unwrap()[0]).unwrap(),
        [6.0; 64]
    );
    assert_eq!(sim.hazards(), []);
}

#[test]
fn a_capture_whose_end_fails_leaves_the_stream_usable() {
    let sim = sim::Device::new();
    let s = sim.new_stream();
    let mut capturing = allocate_runners(&sim, [(RunnerId(0), [Q])], Policy::Generations(1));
    for call in [Call::EndCapture, Call::Instantiate, Call::BeginCapture] {
        let cap = capturing.capture(RunnerId(0)).unwrap();
        let view = cap.take(Q).unwrap();
        sim.inject(Faults::nth(call, 0));
        let failed = cap.stream_capture(&s, |s| sim.launch(s, sim::Kernel::fill(&view, 1.0), 5));
        sim.inject(Faults::none());
        assert!(failed.is_err(), "{call}");
        drop(cap);
        drop(capturing.replan());
        // A fresh discovery: the same runner again.
        let d = Discovering::from_runners(PlanConfig::new(), [(RunnerId(0), [Q])]).unwrap();
        capturing = allocate_discovered(&sim, d, Policy::Generations(1));
        // The stream is not capturing: a plain op runs on it.
        let buf = sim.alloc_f32(4).unwrap();
        sim.launch(&s, sim::Kernel::fill(&buf, 2.0), 1).unwrap();
        assert_eq!(sim.read_f32(&buf).unwrap(), [2.0; 4], "{call}");
    }
}
