//! Buckets that join a sealed plan at run time, and the budget of captured
//! buckets (`src/buckets.rs`), on `sim`.

use replay_arena::sim;
use replay_arena::{
    BucketError, BucketId, BucketState, JoinError, ReplayError, Replayable, RunnerId,
    StepLaunchError,
};

use crate::support::buckets::{capture_double, join, output, run, sealed, TEMPORARIES};

#[test]
fn a_bucket_that_fits_joins_without_allocating_and_replays_right() {
    let sim = sim::Device::new();
    let (stage, pool, side) = (sim.new_stream(), sim.new_stream(), sim.new_stream());
    let mut r = sealed(&sim, &pool, &[64, 256]);
    let bytes = r.plan().total_bytes();
    r.synchronize().unwrap();
    let (allocated, _) = sim.allocation_counts();
    let live = sim.live_allocations();
    let joined = join(&mut r, &sim, &pool, RunnerId(7), 128).unwrap();
    assert_eq!(joined.bucket, BucketId(2));
    assert!(joined.released.is_empty());
    // No arena, no re-plan: the same arenas, the same bytes.
    assert_eq!(r.plan().total_bytes(), bytes);
    // One allocation more: the joined graph's temporary, no arena.
    assert_eq!(sim.live_allocations(), live + 1);
    // The joined runner's views lie in the plan's arenas.
    let base = r.views(RunnerId(1)).unwrap()[0].device_address();
    assert_eq!(r.views(RunnerId(7)).unwrap()[0].device_address(), base);
    let sink = sim.alloc_f32(128).unwrap();
    run(
        &mut r,
        &sim,
        (&stage, &pool, &side),
        RunnerId(7),
        3.0,
        &sink,
    )
    .unwrap();
    r.synchronize().unwrap();
    assert_eq!(sim.read_f32(&sink).unwrap(), vec![6.0; 128]);
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    let (after, _) = sim.allocation_counts();
    // Only the graph's temporary (an allocation node) and the sink.
    assert!(after - allocated <= 3, "{allocated} -> {after}");
    assert_eq!(r.plan().bucket_of(RunnerId(7)), Some(BucketId(2)));
    assert_eq!(r.bucket_state(BucketId(2)).unwrap(), BucketState::Captured);
}

#[test]
fn a_joined_bucket_first_replay_waits_for_the_in_flight_users_of_its_bytes() {
    let sim = sim::Device::new();
    let (stage, pool, side) = (sim.new_stream(), sim.new_stream(), sim.new_stream());
    let other = sim.new_stream();
    let mut r = sealed(&sim, &pool, &[64, 256]);
    let sink = sim.alloc_f32(256).unwrap();
    // Bucket 1's replay and consumer are in flight on their streams...
    run(
        &mut r,
        &sim,
        (&stage, &pool, &side),
        RunnerId(1),
        1.0,
        &sink,
    )
    .unwrap();
    join(&mut r, &sim, &other, RunnerId(9), 128).unwrap();
    let sink2 = sim.alloc_f32(128).unwrap();
    // ... and the joined runner overwrites the same bytes on other streams.
    run(
        &mut r,
        &sim,
        (&other, &other, &other),
        RunnerId(9),
        5.0,
        &sink2,
    )
    .unwrap();
    r.synchronize().unwrap();
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    assert_eq!(sim.read_f32(&sink).unwrap(), vec![2.0; 256]);
    assert_eq!(sim.read_f32(&sink2).unwrap(), vec![10.0; 128]);
}

#[test]
fn a_bucket_larger_than_the_arenas_is_refused_naming_the_bytes_missing() {
    let sim = sim::Device::new();
    let (stage, pool, side) = (sim.new_stream(), sim.new_stream(), sim.new_stream());
    let mut r = sealed(&sim, &pool, &[64, 256]);
    let before = r.plan().clone();
    let error = join(&mut r, &sim, &pool, RunnerId(5), 512).unwrap_err();
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
    assert_eq!(r.plan(), &before, "the running plan is untouched");
    let sink = sim.alloc_f32(256).unwrap();
    run(
        &mut r,
        &sim,
        (&stage, &pool, &side),
        RunnerId(1),
        1.0,
        &sink,
    )
    .unwrap();
}

#[test]
fn bad_joins_are_typed_errors() {
    let sim = sim::Device::new();
    let pool = sim.new_stream();
    let mut r = sealed(&sim, &pool, &[64, 256]);
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
    let sim = sim::Device::new();
    let (stage, pool, side) = (sim.new_stream(), sim.new_stream(), sim.new_stream());
    let streams = (&stage, &pool, &side);
    let mut r = sealed(&sim, &pool, &[64, 256]);
    let sink = sim.alloc_f32(256).unwrap();
    assert!(r.set_bucket_budget(2).unwrap().is_empty());
    run(&mut r, &sim, streams, RunnerId(1), 1.0, &sink).unwrap();
    run(&mut r, &sim, streams, RunnerId(0), 1.0, &sink).unwrap();
    // Bucket 1 launched before bucket 0, but both are in flight.
    let error = join(&mut r, &sim, &pool, RunnerId(7), 128).unwrap_err();
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
    assert_eq!(r.bucket_state(BucketId(1)).unwrap(), BucketState::Captured);
    r.synchronize().unwrap();
    let reserved = |r: &Replayable<sim::Device>| r.report().unwrap().graph_memory.unwrap().reserved;
    let before = reserved(&r);
    let joined = join(&mut r, &sim, &pool, RunnerId(7), 128).unwrap();
    assert_eq!(
        joined.released,
        vec![BucketId(1)],
        "the least recently launched"
    );
    assert_eq!(r.bucket_state(BucketId(1)).unwrap(), BucketState::Released);
    // Bucket 1's graph memory went back; the joined one's is smaller.
    assert!(reserved(&r) < before, "{} !< {before}", reserved(&r));
    let e = r.replay(RunnerId(1), &pool).unwrap_err();
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
    let report = r.report().unwrap();
    assert_eq!(report.buckets[1].state, Some(BucketState::Released));
    assert_eq!(report.buckets[2].state, Some(BucketState::Captured));
    assert_eq!(report.buckets[1].temporaries, Some(0));
    assert!(report.to_string().contains("released"), "{report}");
    // Captured again (its fit kept): bucket 0 is now the least recent.
    r.synchronize().unwrap();
    run(&mut r, &sim, streams, RunnerId(7), 1.0, &sink).unwrap();
    r.synchronize().unwrap();
    let mut capture = r.recapture_bucket(BucketId(1)).unwrap();
    capture_double(capture.capture(RunnerId(1)).unwrap(), &sim, &pool, 256).unwrap();
    let again = capture.seal().unwrap();
    assert_eq!(again.released, vec![BucketId(0)]);
    run(&mut r, &sim, streams, RunnerId(1), 4.0, &sink).unwrap();
    r.synchronize().unwrap();
    assert_eq!(sim.read_f32(&sink).unwrap(), vec![8.0; 256]);
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
}

#[test]
fn a_bucket_with_work_in_flight_is_never_released() {
    let sim = sim::Device::new();
    let (stage, pool, side) = (sim.new_stream(), sim.new_stream(), sim.new_stream());
    let mut r = sealed(&sim, &pool, &[64, 256]);
    let sink = sim.alloc_f32(64).unwrap();
    run(
        &mut r,
        &sim,
        (&stage, &pool, &side),
        RunnerId(0),
        1.0,
        &sink,
    )
    .unwrap();
    let e = r.release_bucket(BucketId(0)).unwrap_err();
    assert!(
        matches!(
            e,
            BucketError::InFlight {
                bucket: BucketId(0)
            }
        ),
        "{e}"
    );
    assert!(r.graph(RunnerId(0)).is_some());
    r.synchronize().unwrap();
    r.release_bucket(BucketId(0)).unwrap();
    assert!(r.graph(RunnerId(0)).is_none());
    assert!(matches!(
        r.release_bucket(BucketId(0)),
        Err(BucketError::AlreadyReleased { .. })
    ));
}

#[test]
fn a_kept_step_of_a_released_bucket_refuses_to_launch() {
    TEMPORARIES.with(|t| t.set(false));
    let sim = sim::Device::new();
    let (stage, pool) = (sim.new_stream(), sim.new_stream());
    let mut r = sealed(&sim, &pool, &[64, 256]);
    r.consume_mut(RunnerId(0), &stage, |s, v| {
        sim.launch(s, sim::Kernel::fill(&v[0], 1.0), 1)
    })
    .unwrap();
    let mut step = r.step();
    step.replay(RunnerId(0), &pool).unwrap();
    let mut kept = step.build().unwrap().keep();
    r.launch_kept(&mut kept, &pool).unwrap();
    r.synchronize().unwrap();
    r.release_bucket(BucketId(0)).unwrap();
    let e = r.launch_kept(&mut kept, &pool).unwrap_err();
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
    let mut capture = r.recapture_bucket(BucketId(0)).unwrap();
    capture_double(capture.capture(RunnerId(0)).unwrap(), &sim, &pool, 64).unwrap();
    capture.seal().unwrap();
    assert!(matches!(
        r.launch_kept(&mut kept, &pool),
        Err(StepLaunchError::Released { .. })
    ));
    drop(kept);
}

#[test]
fn joins_release_and_recapture_leave_nothing_allocated() {
    let sim = sim::Device::new();
    let (stage, pool, side) = (sim.new_stream(), sim.new_stream(), sim.new_stream());
    let sink = sim.alloc_f32(256).unwrap();
    {
        let mut r = sealed(&sim, &pool, &[64, 256]);
        r.set_bucket_budget(1).unwrap();
        for (k, n) in [8u64, 16, 24, 32, 40].into_iter().enumerate() {
            r.synchronize().unwrap();
            let runner = RunnerId(10 + k as u32);
            join(&mut r, &sim, &pool, runner, n).unwrap();
            run(
                &mut r,
                &sim,
                (&stage, &pool, &side),
                runner,
                k as f32,
                &sink,
            )
            .unwrap();
            let captured = (0..r.plan().buckets().count())
                .filter(|&b| r.bucket_state(BucketId(b as u32)).unwrap() == BucketState::Captured)
                .count();
            assert_eq!(captured, 1);
        }
        r.synchronize().unwrap();
        assert_eq!(sim.read_f32(&sink).unwrap()[..40], [8.0; 40]);
    }
    let memory = replay_arena::backend::Backend::graph_memory_in_use(&sim)
        .unwrap()
        .unwrap();
    assert_eq!((memory.used, memory.reserved), (0, 0));
    assert_eq!(sim.live_allocations(), 1, "the sink only");
    assert_eq!(sim.live_events(), 0);
    assert!(sim.hazards().is_empty());
}
