//! Buckets that join a sealed plan at run time, and the budget of captured
//! buckets (`src/buckets.rs`), on `sim`.

use replay_arena::sim;
use replay_arena::{
    BucketError, BucketId, BucketState, JoinError, ReplayError, Replayable, RunnerId,
    StepLaunchError,
};

use crate::support::buckets::{capture_double, fixture, join, output, run, TEMPORARIES};

#[test]
fn a_bucket_that_fits_joins_without_allocating_and_replays_right() {
    let mut f = fixture();
    let bytes = f.r.plan().total_bytes();
    f.r.synchronize().unwrap();
    let (allocated, _) = f.sim.allocation_counts();
    let live = f.sim.live_allocations();
    let joined = f.join(RunnerId(7), 128).unwrap();
    assert_eq!(joined.bucket, BucketId(2));
    assert!(joined.released.is_empty());
    // No arena, no re-plan: the same arenas, the same bytes.
    assert_eq!(f.r.plan().total_bytes(), bytes);
    // One allocation more: the joined graph's temporary, no arena.
    assert_eq!(f.sim.live_allocations(), live + 1);
    // The joined runner's views lie in the plan's arenas.
    let base = f.r.views(RunnerId(1)).unwrap()[0].device_address();
    assert_eq!(f.r.views(RunnerId(7)).unwrap()[0].device_address(), base);
    let sink = f.sim.alloc_f32(128).unwrap();
    f.run(RunnerId(7), 3.0, &sink).unwrap();
    f.r.synchronize().unwrap();
    assert_eq!(f.sim.read_f32(&sink).unwrap(), vec![6.0; 128]);
    assert!(f.sim.hazards().is_empty(), "{:?}", f.sim.hazards());
    let (after, _) = f.sim.allocation_counts();
    // Only the graph's temporary (an allocation node) and the sink.
    assert!(after - allocated <= 3, "{allocated} -> {after}");
    assert_eq!(f.r.plan().bucket_of(RunnerId(7)), Some(BucketId(2)));
    assert_eq!(
        f.r.bucket_state(BucketId(2)).unwrap(),
        BucketState::Captured
    );
}

#[test]
fn a_joined_bucket_first_replay_waits_for_the_in_flight_users_of_its_bytes() {
    let mut f = fixture();
    let sink = f.sim.alloc_f32(256).unwrap();
    // Bucket 1's replay and consumer are in flight on their streams...
    f.run(RunnerId(1), 1.0, &sink).unwrap();
    let other = f.sim.new_stream();
    join(&mut f.r, &f.sim, &other, RunnerId(9), 128).unwrap();
    let sink2 = f.sim.alloc_f32(128).unwrap();
    // ... and the joined runner overwrites the same bytes on other streams.
    let others = (&other, &other, &other);
    run(&mut f.r, &f.sim, others, RunnerId(9), 5.0, &sink2).unwrap();
    f.r.synchronize().unwrap();
    assert!(f.sim.hazards().is_empty(), "{:?}", f.sim.hazards());
    assert_eq!(f.sim.read_f32(&sink).unwrap(), vec![2.0; 256]);
    assert_eq!(f.sim.read_f32(&sink2).unwrap(), vec![10.0; 128]);
}

#[test]
fn a_bucket_larger_than_the_arenas_is_refused_naming_the_bytes_missing() {
    let mut f = fixture();
    let before = f.r.plan().clone();
    let error = f.join(RunnerId(5), 512).unwrap_err();
    let replay_arena::Error::Join(JoinError::DoesNotFit { name, short }) = &error else {
        panic!("{error}");
    };
    assert_eq!(name, "bs=512");
    // The message names the bytes and the way to grow the plan.
    let text = error.to_string();
    assert!(
        text.contains("replan()") && text.contains("captured again"),
        "{text}"
    );
    assert_eq!(short.len(), 1);
    assert_eq!(short[0].generation, Some(0));
    assert_eq!(
        (short[0].needed, short[0].available, short[0].missing()),
        (4096, 2048, 2048)
    );
    assert!(error.to_string().contains("2048 missing"), "{error}");
    assert_eq!(f.r.plan(), &before, "the running plan is untouched");
    let sink = f.sim.alloc_f32(256).unwrap();
    f.run(RunnerId(1), 1.0, &sink).unwrap();
}

#[test]
fn bad_joins_are_typed_errors() {
    let mut f = fixture();
    let r = &mut f.r;
    let e = r.discover_bucket("bs=64").unwrap_err();
    assert!(
        matches!(
            e,
            JoinError::DuplicateName {
                bucket: BucketId(0),
                ..
            }
        ),
        "{e}"
    );
    let mut d = r.discover_bucket("new").unwrap();
    assert!(matches!(
        d.arm(RunnerId(1)).unwrap_err(),
        JoinError::RunnerInPlan {
            runner: RunnerId(1)
        }
    ));
    let e = d.fit().unwrap_err();
    assert!(matches!(e, JoinError::NoRunners { .. }), "{e}");
    let mut d = r.discover_bucket("handoff").unwrap();
    d.arm(RunnerId(3)).unwrap().hand_off(output(8)).unwrap();
    let e = d.fit().unwrap_err();
    assert!(
        matches!(
            e,
            JoinError::Handoffs {
                runner: Some(RunnerId(3))
            }
        ),
        "{e}"
    );
    // A capture left unfinished is refused at seal, the capture back.
    let mut d = r.discover_bucket("bs=8").unwrap();
    d.arm(RunnerId(4)).unwrap().record(output(8)).unwrap();
    let mut capture = d.fit().unwrap();
    assert!(
        capture.capture(RunnerId(0)).is_err(),
        "not a runner of this bucket"
    );
    let failed = capture.seal().unwrap_err();
    let JoinError::Capture(error) = failed.error() else {
        panic!("{}", failed.error());
    };
    assert!(matches!(
        **error,
        replay_arena::CaptureError::Unfinished { .. }
    ));
    drop(failed);
    assert_eq!(r.plan().buckets().count(), 2, "nothing joined");
    assert!(matches!(
        r.set_bucket_budget(0),
        Err(BucketError::ZeroBudget)
    ));
    assert!(matches!(
        r.bucket_state(BucketId(9)),
        Err(BucketError::UnknownBucket { .. })
    ));
    assert!(matches!(
        r.recapture_bucket(BucketId(0)),
        Err(JoinError::Budget(BucketError::NotReleased { .. }))
    ));
}

#[test]
fn the_budget_releases_the_least_recently_launched_idle_bucket() {
    let mut f = fixture();
    let sink = f.sim.alloc_f32(256).unwrap();
    assert!(f.r.set_bucket_budget(2).unwrap().is_empty());
    f.run(RunnerId(1), 1.0, &sink).unwrap();
    f.run(RunnerId(0), 1.0, &sink).unwrap();
    // Bucket 1 launched before bucket 0, but both are in flight.
    let error = f.join(RunnerId(7), 128).unwrap_err();
    assert!(
        matches!(
            error,
            replay_arena::Error::Join(JoinError::Budget(BucketError::NothingIdle {
                budget: 2,
                ..
            }))
        ),
        "{error}"
    );
    assert_eq!(
        f.r.bucket_state(BucketId(1)).unwrap(),
        BucketState::Captured
    );
    f.r.synchronize().unwrap();
    let reserved = |r: &Replayable<sim::Device>| r.report().unwrap().graph_memory.unwrap().reserved;
    let before = reserved(&f.r);
    let joined = f.join(RunnerId(7), 128).unwrap();
    assert_eq!(
        joined.released,
        vec![BucketId(1)],
        "the least recently launched"
    );
    assert_eq!(
        f.r.bucket_state(BucketId(1)).unwrap(),
        BucketState::Released
    );
    // Bucket 1's graph memory went back; the joined one's is smaller.
    assert!(reserved(&f.r) < before, "{} !< {before}", reserved(&f.r));
    let e = f.r.replay(RunnerId(1), &f.pool).unwrap_err();
    assert!(
        matches!(
            e,
            ReplayError::Released {
                runner: RunnerId(1),
                bucket: BucketId(1)
            }
        ),
        "{e}"
    );
    let report = f.r.report().unwrap();
    assert_eq!(report.buckets[1].state, Some(BucketState::Released));
    assert_eq!(report.buckets[2].state, Some(BucketState::Captured));
    assert_eq!(report.buckets[1].temporaries, Some(0));
    assert!(report.to_string().contains("released"), "{report}");
    // Captured again (its fit kept): bucket 0 is now the least recent.
    f.r.synchronize().unwrap();
    f.run(RunnerId(7), 1.0, &sink).unwrap();
    f.r.synchronize().unwrap();
    let mut capture = f.r.recapture_bucket(BucketId(1)).unwrap();
    capture_double(capture.capture(RunnerId(1)).unwrap(), &f.sim, &f.pool, 256).unwrap();
    let again = capture.seal().unwrap();
    assert_eq!(again.released, vec![BucketId(0)]);
    f.run(RunnerId(1), 4.0, &sink).unwrap();
    f.r.synchronize().unwrap();
    assert_eq!(f.sim.read_f32(&sink).unwrap(), vec![8.0; 256]);
    assert!(f.sim.hazards().is_empty(), "{:?}", f.sim.hazards());
}

#[test]
fn a_bucket_with_work_in_flight_is_never_released() {
    let mut f = fixture();
    let sink = f.sim.alloc_f32(64).unwrap();
    f.run(RunnerId(0), 1.0, &sink).unwrap();
    let e = f.r.release_bucket(BucketId(0)).unwrap_err();
    assert!(
        matches!(
            e,
            BucketError::InFlight {
                bucket: BucketId(0)
            }
        ),
        "{e}"
    );
    assert!(f.r.graph(RunnerId(0)).is_some());
    f.r.synchronize().unwrap();
    f.r.release_bucket(BucketId(0)).unwrap();
    assert!(f.r.graph(RunnerId(0)).is_none());
    assert!(matches!(
        f.r.release_bucket(BucketId(0)),
        Err(BucketError::AlreadyReleased { .. })
    ));
}

#[test]
fn a_kept_step_of_a_released_bucket_refuses_to_launch() {
    TEMPORARIES.with(|t| t.set(false));
    let mut f = fixture();
    let mut kept = f.launched_kept_step(RunnerId(0));
    f.r.synchronize().unwrap();
    f.r.release_bucket(BucketId(0)).unwrap();
    let e = f.r.launch_kept(&mut kept, &f.pool).unwrap_err();
    assert!(
        matches!(
            e,
            StepLaunchError::Released {
                bucket: BucketId(0)
            }
        ),
        "{e}"
    );
    // Captured again, the old step graph stays refused.
    let mut capture = f.r.recapture_bucket(BucketId(0)).unwrap();
    capture_double(capture.capture(RunnerId(0)).unwrap(), &f.sim, &f.pool, 64).unwrap();
    capture.seal().unwrap();
    assert!(matches!(
        f.r.launch_kept(&mut kept, &f.pool),
        Err(StepLaunchError::Released { .. })
    ));
    drop(kept);
}

#[test]
fn joins_release_and_recapture_leave_nothing_allocated() {
    let mut f = fixture();
    let sim = f.sim.clone();
    let sink = sim.alloc_f32(256).unwrap();
    f.r.set_bucket_budget(1).unwrap();
    for (k, n) in [8u64, 16, 24, 32, 40].into_iter().enumerate() {
        f.r.synchronize().unwrap();
        let runner = RunnerId(10 + k as u32);
        f.join(runner, n).unwrap();
        f.run(runner, k as f32, &sink).unwrap();
        let captured = (0..f.r.plan().buckets().count())
            .filter(|&b| f.r.bucket_state(BucketId(b as u32)).unwrap() == BucketState::Captured)
            .count();
        assert_eq!(captured, 1);
    }
    f.r.synchronize().unwrap();
    assert_eq!(sim.read_f32(&sink).unwrap()[..40], [8.0; 40]);
    drop(f);
    let memory = replay_arena::backend::Backend::graph_memory_in_use(&sim)
        .unwrap()
        .unwrap();
    assert_eq!((memory.used, memory.reserved), (0, 0));
    assert_eq!(sim.live_allocations(), 1, "the sink only");
    assert_eq!(sim.live_events(), 0);
    assert!(sim.hazards().is_empty());
}
