//! A replay on a stream the program captures by its own means (the
//! backend's `Capture::begin_capture`, not a plan's capture) is refused at
//! its launch, which the backend refuses on a capturing stream: the replay
//! asks nothing before it (no capture-status query on the hot path). The
//! refusal is `StreamCapturing`, and the fence commits nothing of it: the
//! runner's wait for the bytes' latest user is still owed, so the next
//! replay on that stream, once the program's capture ended, waits again
//! (the sim's hazard detector would see the overlap otherwise).

use replay_arena::backend::Capture;
use replay_arena::sim;
use replay_arena::{
    DType, Discovering, Domain, Operation, PlanConfig, Policy, ReplayError, Request, RunnerId,
    StreamCapturing,
};

const REQ: Request = Request::new(Domain::Device, DType::F32, 64);

#[test]
fn a_replay_refused_by_a_program_capture_commits_nothing() {
    let sim = sim::Device::new();
    let (a, s) = (sim.new_stream(), sim.new_stream());
    let runners = (0..2).map(|r| (RunnerId(r), [REQ]));
    let planned = Discovering::from_runners(PlanConfig::new(), runners)
        .unwrap()
        .plan(Policy::Generations(1)) // both runners use the same bytes
        .unwrap();
    let mut capturing = planned.allocate(sim.clone()).unwrap();
    for r in 0..2u32 {
        let cap = capturing.capture(RunnerId(r)).unwrap();
        let v = cap.take(REQ).unwrap();
        cap.stream_capture(&a, |s| {
            sim.launch(s, sim::Kernel::fill(&v, r as f32 + 1.0), 1_000_000)
        })
        .unwrap();
        cap.finish().unwrap();
    }
    let mut rp = capturing.seal().unwrap();
    rp.replay(RunnerId(0), &a).unwrap(); // long, on `a`
    let stats = rp.fence_stats();

    sim.begin_capture(&s).unwrap(); // the program's own capture
    let refused = rp.replay(RunnerId(1), &s);
    assert_eq!(
        refused,
        Err(ReplayError::StreamCapturing(StreamCapturing {
            op: Operation::Replay(RunnerId(1))
        }))
    );
    // SAFETY: the capture this test began, on this thread.
    unsafe { sim.abort_capture(&s) };
    assert_eq!(rp.fence_stats().replays, stats.replays, "nothing committed");

    // Runner 1 still waits for runner 0 on `a`: no hazard, its values last.
    rp.replay(RunnerId(1), &s).unwrap();
    rp.synchronize().unwrap();
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    let view = rp.views(RunnerId(1)).unwrap()[0];
    assert_eq!(sim.read_f32(&view).unwrap(), vec![2.0; 64]);
}
