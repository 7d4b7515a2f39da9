//! Attacks on the buckets that join a sealed plan at run time
//! (`docs/lifecycle.md`, "Buckets at run time"), from safe code on `sim`:
//! releases under in-flight work, budgets under churn, forgotten and
//! panicking captures, faults at every call of a seal.

use crate::support::faults::at_each_call;
use replay_arena::backend::Streams;
use replay_arena::sim;
use replay_arena::{BucketError, BucketId, BucketState, JoinError, RunnerId};

use crate::support::buckets::{capture_double, input, join, output, run, sealed, TEMPORARIES};

fn clean_after(sim: &sim::Device, own: usize) {
    assert_eq!(sim.hazards(), [], "hazards");
    assert_eq!(sim.live_events(), 0, "events leaked");
    assert_eq!(sim.live_allocations(), own, "allocations leaked");
}

#[test]
fn a_bucket_whose_consumer_still_reads_on_another_stream_is_not_released() {
    let sim = sim::Device::new();
    let (pool, side) = (sim.new_stream(), sim.new_stream());
    let sink = sim.alloc_f32(256).unwrap();
    {
        let mut r = sealed(&sim, &pool, &[64, 256]);
        r.consume_mut(RunnerId(1), &pool, |s, v| {
            sim.launch(s, sim::Kernel::fill(&v[0], 1.0), 1)
        })
        .unwrap();
        r.replay(RunnerId(1), &pool).unwrap();
        r.synchronize().unwrap();
        // A long read of the runner's output on another stream.
        r.consume(RunnerId(1), &side, |s, v| {
            sim.launch(s, sim::Kernel::copy(&v[1], &sink), 1000)
        })
        .unwrap();
        assert!(matches!(
            r.release_bucket(BucketId(1)),
            Err(BucketError::InFlight {
                bucket: BucketId(1)
            })
        ));
        // A budget of one must not pick it either: bucket 0 is the victim.
        assert_eq!(r.set_bucket_budget(1).unwrap(), [BucketId(0)]);
        assert_eq!(r.bucket_state(BucketId(1)).unwrap(), BucketState::Captured);
        r.synchronize().unwrap();
        r.release_bucket(BucketId(1)).unwrap();
    }
    clean_after(&sim, 1);
}

#[test]
fn a_bucket_whose_kept_step_is_in_flight_is_not_released() {
    TEMPORARIES.with(|t| t.set(false));
    let sim = sim::Device::new();
    let (stage, pool) = (sim.new_stream(), sim.new_stream());
    {
        let mut r = sealed(&sim, &pool, &[64, 256]);
        r.consume_mut(RunnerId(0), &stage, |s, v| {
            sim.launch(s, sim::Kernel::fill(&v[0], 1.0), 1)
        })
        .unwrap();
        let mut step = r.step();
        step.replay(RunnerId(0), &pool).unwrap();
        let mut kept = step.build().unwrap().keep();
        r.launch_kept(&mut kept, &pool).unwrap();
        // In flight: neither a release nor a budget may drop it.
        assert!(matches!(
            r.release_bucket(BucketId(0)),
            Err(BucketError::InFlight { .. })
        ));
        assert_eq!(r.set_bucket_budget(1).unwrap(), [BucketId(1)]);
        assert_eq!(r.bucket_state(BucketId(0)).unwrap(), BucketState::Captured);
        r.launch_kept(&mut kept, &pool).unwrap();
        r.synchronize().unwrap();
        r.release_bucket(BucketId(0)).unwrap();
        drop(kept);
    }
    TEMPORARIES.with(|t| t.set(true));
    clean_after(&sim, 0);
}

#[test]
fn a_step_over_a_joined_runner_waits_for_the_declared_bucket_sharing_its_bytes() {
    TEMPORARIES.with(|t| t.set(false));
    let sim = sim::Device::new();
    let (stage, pool, side, other) = (
        sim.new_stream(),
        sim.new_stream(),
        sim.new_stream(),
        sim.new_stream(),
    );
    let sink = sim.alloc_f32(256).unwrap();
    let sink2 = sim.alloc_f32(128).unwrap();
    {
        let mut r = sealed(&sim, &pool, &[64, 256]);
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
        // At once, on another stream, a step graph over the joined runner
        // and the declared one whose bytes it shares.
        let mut step = r.step();
        step.consume_mut(RunnerId(9), &other, |s, v| {
            sim.launch(s, sim::Kernel::fill(&v[0], 4.0), 1)
        })
        .unwrap();
        step.replay(RunnerId(9), &other).unwrap();
        step.consume(RunnerId(9), &other, |s, v| {
            sim.launch(s, sim::Kernel::copy(&v[1], &sink2), 1)
        })
        .unwrap();
        let mut kept = step.build().unwrap().keep();
        r.launch_kept(&mut kept, &other).unwrap();
        run(
            &mut r,
            &sim,
            (&stage, &pool, &side),
            RunnerId(1),
            3.0,
            &sink,
        )
        .unwrap();
        r.launch_kept(&mut kept, &other).unwrap();
        r.synchronize().unwrap();
        assert_eq!(sim.read_f32(&sink2).unwrap(), vec![8.0; 128]);
        assert_eq!(sim.read_f32(&sink).unwrap(), vec![6.0; 256]);
        drop(kept);
    }
    TEMPORARIES.with(|t| t.set(true));
    clean_after(&sim, 2);
}

#[test]
fn a_budget_of_one_alternating_two_buckets_over_two_streams_waits_and_stays_right() {
    let sim = sim::Device::new();
    let streams: Vec<_> = (0..6).map(|_| sim.new_stream()).collect();
    let sinks = [sim.alloc_f32(64).unwrap(), sim.alloc_f32(256).unwrap()];
    let sizes = [64u64, 256];
    {
        let mut r = sealed(&sim, &streams[0], &sizes);
        assert_eq!(r.set_bucket_budget(1).unwrap(), [BucketId(0)]);
        for k in 0..8usize {
            let b = k % 2;
            let s = &streams[3 * (k % 2)..3 * (k % 2) + 3];
            if r.bucket_state(BucketId(b as u32)).unwrap() == BucketState::Released {
                let mut capture = r.recapture_bucket(BucketId(b as u32)).unwrap();
                let pool = &s[1];
                capture_double(
                    capture.capture(RunnerId(b as u32)).unwrap(),
                    &sim,
                    pool,
                    sizes[b],
                )
                .unwrap();
                match capture.seal() {
                    // Nothing of the other bucket ran yet.
                    Ok(joined) => assert_eq!((k, joined.released), (0, vec![BucketId(1)])),
                    Err(failed) => {
                        assert!(
                            matches!(
                                failed.error(),
                                JoinError::Budget(BucketError::NothingIdle { .. })
                            ),
                            "{}",
                            failed.error()
                        );
                        // The capture came back; once idle, it seals.
                        let capture = failed.into_input();
                        Streams::synchronize(&sim).unwrap();
                        let joined = capture.seal().unwrap();
                        assert_eq!(joined.released, [BucketId(1 - b as u32)]);
                    }
                }
            }
            run(
                &mut r,
                &sim,
                (&s[0], &s[1], &s[2]),
                RunnerId(b as u32),
                k as f32,
                &sinks[b],
            )
            .unwrap();
        }
        r.synchronize().unwrap();
        assert_eq!(sim.read_f32(&sinks[0]).unwrap(), vec![12.0; 64]);
        assert_eq!(sim.read_f32(&sinks[1]).unwrap(), vec![14.0; 256]);
    }
    clean_after(&sim, 2);
}

#[test]
fn a_forgotten_bucket_capture_leaks_the_arenas_and_later_joins_say_arenas_gone() {
    let sim = sim::Device::new();
    let (stage, pool, side) = (sim.new_stream(), sim.new_stream(), sim.new_stream());
    let sink = sim.alloc_f32(256).unwrap();
    let mut r = sealed(&sim, &pool, &[64, 256]);
    r.set_bucket_budget(2).unwrap();
    r.synchronize().unwrap();
    r.release_bucket(BucketId(0)).unwrap();
    {
        let mut discovery = r.discover_bucket("bs=128").unwrap();
        let mut armed = discovery.arm(RunnerId(5)).unwrap();
        armed.record(input(128)).unwrap();
        armed.record(output(128)).unwrap();
        let mut capture = discovery.fit().unwrap();
        capture_double(capture.capture(RunnerId(5)).unwrap(), &sim, &pool, 128).unwrap();
        std::mem::forget(capture);
    }
    // The plan goes on: its views still address live (leaked) memory.
    run(
        &mut r,
        &sim,
        (&stage, &pool, &side),
        RunnerId(1),
        2.0,
        &sink,
    )
    .unwrap();
    r.synchronize().unwrap();
    assert_eq!(sim.read_f32(&sink).unwrap(), vec![4.0; 256]);
    assert!(r.replay(RunnerId(5), &pool).is_err());
    assert!(matches!(
        r.recapture_bucket(BucketId(0)),
        Err(JoinError::ArenasGone)
    ));
    let e = join(&mut r, &sim, &pool, RunnerId(6), 32).unwrap_err();
    assert!(e.to_string().contains("arena"), "{e}");
    drop(r);
    assert_eq!(sim.hazards(), []);
    // Leaking is allowed: the arenas the forgotten capture held stay.
    assert!(sim.live_allocations() > 1, "the arenas leaked, not freed");
}

#[test]
fn a_forgotten_bucket_discovery_changes_nothing() {
    let sim = sim::Device::new();
    let (stage, pool, side) = (sim.new_stream(), sim.new_stream(), sim.new_stream());
    let sink = sim.alloc_f32(256).unwrap();
    {
        let mut r = sealed(&sim, &pool, &[64, 256]);
        let mut discovery = r.discover_bucket("bs=128").unwrap();
        discovery
            .arm(RunnerId(5))
            .unwrap()
            .record(input(128))
            .unwrap();
        std::mem::forget(discovery);
        // The same name and runner join afterwards.
        join(&mut r, &sim, &pool, RunnerId(5), 128).unwrap();
        run(
            &mut r,
            &sim,
            (&stage, &pool, &side),
            RunnerId(5),
            1.5,
            &sink,
        )
        .unwrap();
        r.synchronize().unwrap();
        assert_eq!(sim.read_f32(&sink).unwrap()[..128], [3.0; 128]);
    }
    clean_after(&sim, 1);
}

#[test]
fn a_join_whose_capture_closure_panics_or_fails_leaves_the_plan_usable() {
    let sim = sim::Device::new();
    let (stage, pool, side) = (sim.new_stream(), sim.new_stream(), sim.new_stream());
    let sink = sim.alloc_f32(256).unwrap();
    {
        let mut r = sealed(&sim, &pool, &[64, 256]);
        for panics in [true, false] {
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let mut discovery = r.discover_bucket("bs=128").unwrap();
                {
                    let mut armed = discovery.arm(RunnerId(5)).unwrap();
                    armed.record(input(128)).unwrap();
                    armed.record(output(128)).unwrap();
                }
                let mut capture = discovery.fit().unwrap();
                let cap = capture.capture(RunnerId(5)).unwrap();
                let v = cap.take(input(128)).unwrap();
                let got = cap.stream_capture(&pool, |s| {
                    sim.launch(s, sim::Kernel::fill(&v, 1.0), 1)?;
                    if panics {
                        panic!("the program's closure panics");
                    }
                    Err(replay_arena::backend::BackendError::Refused {
                        call: "the program's kernel",
                        reason: "it fails".into(),
                    })
                });
                assert!(got.is_err());
                drop(cap);
                // The seal names the runner not captured.
                let failed = capture.seal().unwrap_err();
                assert!(
                    matches!(failed.error(), JoinError::Capture(_)),
                    "{}",
                    failed.error()
                );
            }));
            assert_eq!(outcome.is_err(), panics);
            assert!(!sim.is_capturing(&pool).unwrap(), "pool left capturing");
        }
        assert!(r.replay(RunnerId(5), &pool).is_err());
        join(&mut r, &sim, &pool, RunnerId(5), 128).unwrap();
        run(
            &mut r,
            &sim,
            (&stage, &pool, &side),
            RunnerId(5),
            1.0,
            &sink,
        )
        .unwrap();
        run(
            &mut r,
            &sim,
            (&stage, &pool, &side),
            RunnerId(1),
            2.0,
            &sink,
        )
        .unwrap();
        r.synchronize().unwrap();
        assert_eq!(sim.read_f32(&sink).unwrap(), vec![4.0; 256]);
    }
    clean_after(&sim, 1);
}

#[test]
fn a_released_buckets_runner_ids_are_not_reused_by_a_join() {
    let sim = sim::Device::new();
    let pool = sim.new_stream();
    let mut r = sealed(&sim, &pool, &[64, 256]);
    r.release_bucket(BucketId(0)).unwrap();
    let mut discovery = r.discover_bucket("bs=32").unwrap();
    assert!(matches!(
        discovery.arm(RunnerId(0)),
        Err(JoinError::RunnerInPlan {
            runner: RunnerId(0)
        })
    ));
    drop(discovery);
    assert!(matches!(
        r.discover_bucket("bs=64"),
        Err(JoinError::DuplicateName { .. })
    ));
    assert_eq!(r.bucket_state(BucketId(0)).unwrap(), BucketState::Released);
}

/// Faults at every backend call of a join's seal (which releases a victim
/// under a budget of one), of a release and of a recapture's seal: each
/// either happens whole or leaves the plan as it was, and the plan replays
/// right and tears down clean after.
#[test]
fn faults_in_join_release_and_recapture_leave_the_plan_consistent() {
    let attacked = at_each_call(|attack| {
        let sim = sim::Device::new();
        let (stage, pool, side) = (sim.new_stream(), sim.new_stream(), sim.new_stream());
        let sink = sim.alloc_f32(256).unwrap();
        {
            let mut r = sealed(&sim, &pool, &[64, 256]);
            r.set_bucket_budget(2).unwrap();
            run(
                &mut r,
                &sim,
                (&stage, &pool, &side),
                RunnerId(0),
                1.0,
                &sink,
            )
            .unwrap();
            r.synchronize().unwrap();
            let joined = attack.on(&sim, || join(&mut r, &sim, &pool, RunnerId(7), 128));
            // The join released bucket 1 (never launched).
            let released = attack.on(&sim, || r.release_bucket(BucketId(0)).is_ok());
            let mut again = |b: u32, n: u64| {
                attack.on(&sim, || -> replay_arena::Result<Vec<BucketId>> {
                    let mut capture = r.recapture_bucket(BucketId(b))?;
                    capture_double(capture.capture(RunnerId(b))?, &sim, &pool, n)?;
                    Ok(capture.seal()?.released)
                })
            };
            let one = again(1, 256);
            // Under the budget of two, bucket 0's seal releases one.
            let zero = again(0, 64);
            if attack.fault().is_none() {
                assert_eq!(joined.unwrap().released, [BucketId(1)]);
                assert!(released);
                assert_eq!(one.unwrap(), []);
                // Neither 1 nor 2 was launched since: the tie goes to the lower id.
                assert_eq!(zero.unwrap(), [BucketId(1)]);
            }
            // Whatever is captured replays right.
            for (b, runner, n) in [(0u32, 0u32, 64usize), (1, 1, 256), (2, 7, 128)] {
                let state = r.bucket_state(BucketId(b));
                if state.as_ref().ok() != Some(&BucketState::Captured) {
                    assert!(r.replay(RunnerId(runner), &pool).is_err(), "{attack}");
                    continue;
                }
                run(
                    &mut r,
                    &sim,
                    (&stage, &pool, &side),
                    RunnerId(runner),
                    3.0,
                    &sink,
                )
                .unwrap_or_else(|e| panic!("{attack}: {e}"));
                r.synchronize().unwrap();
                assert_eq!(
                    sim.read_f32(&sink).unwrap()[..n],
                    vec![6.0; n][..],
                    "{attack}"
                );
            }
        }
        clean_after(&sim, 1);
    });
    assert!(attacked > 3, "{attacked}");
}

#[test]
fn a_trace_spans_joins_releases_and_recaptures() {
    let sim = sim::Device::new();
    let (stage, pool, side) = (sim.new_stream(), sim.new_stream(), sim.new_stream());
    let sink = sim.alloc_f32(256).unwrap();
    {
        let mut r = sealed(&sim, &pool, &[64, 256]);
        r.start_trace().unwrap();
        run(
            &mut r,
            &sim,
            (&stage, &pool, &side),
            RunnerId(1),
            1.0,
            &sink,
        )
        .unwrap();
        r.synchronize().unwrap();
        r.release_bucket(BucketId(1)).unwrap();
        // Joined mid-trace: a runner slot the trace did not know at start.
        join(&mut r, &sim, &pool, RunnerId(9), 128).unwrap();
        run(
            &mut r,
            &sim,
            (&stage, &pool, &side),
            RunnerId(9),
            2.0,
            &sink,
        )
        .unwrap();
        let mut capture = r.recapture_bucket(BucketId(1)).unwrap();
        capture_double(capture.capture(RunnerId(1)).unwrap(), &sim, &pool, 256).unwrap();
        capture.seal().unwrap();
        run(
            &mut r,
            &sim,
            (&stage, &pool, &side),
            RunnerId(1),
            3.0,
            &sink,
        )
        .unwrap();
        let trace = r.finish_trace().unwrap();
        let names: Vec<String> = trace.uses().iter().map(|u| u.kind.name()).collect();
        let replays: Vec<&String> = names.iter().filter(|n| n.starts_with("replay")).collect();
        assert_eq!(replays.len(), 3, "{names:?}");
        assert!(replays[1].contains('9'), "{names:?}");
        assert_eq!(sim.read_f32(&sink).unwrap(), vec![6.0; 256]);
    }
    clean_after(&sim, 1);
}

#[test]
fn a_step_over_a_declared_and_a_joined_runner_sharing_bytes_is_ordered_and_refuses_once_released() {
    TEMPORARIES.with(|t| t.set(false));
    let sim = sim::Device::new();
    let (stage, pool) = (sim.new_stream(), sim.new_stream());
    {
        let mut r = sealed(&sim, &pool, &[64, 256]);
        join(&mut r, &sim, &pool, RunnerId(9), 128).unwrap();
        // The two share bytes (G = 1): each is staged right before it runs.
        let mut step = r.step();
        for runner in [0, 9] {
            step.consume_mut(RunnerId(runner), &stage, |s, v| {
                sim.launch(s, sim::Kernel::fill(&v[0], 1.0), 1)
            })
            .unwrap();
            step.replay(RunnerId(runner), &pool).unwrap();
        }
        let mut kept = step.build().unwrap().keep();
        r.launch_kept(&mut kept, &pool).unwrap();
        r.synchronize().unwrap();
        assert_eq!(sim.hazards(), [], "the first launch");
        r.launch_kept(&mut kept, &pool).unwrap();
        assert!(matches!(
            r.release_bucket(BucketId(2)),
            Err(BucketError::InFlight { .. })
        ));
        r.synchronize().unwrap();
        r.release_bucket(BucketId(2)).unwrap();
        assert!(matches!(
            r.launch_kept(&mut kept, &pool),
            Err(replay_arena::StepLaunchError::Released {
                bucket: BucketId(2)
            })
        ));
        // The declared runner alone still replays.
        r.consume_mut(RunnerId(0), &stage, |s, v| {
            sim.launch(s, sim::Kernel::fill(&v[0], 1.0), 1)
        })
        .unwrap();
        r.replay(RunnerId(0), &pool).unwrap();
        r.synchronize().unwrap();
        drop(kept);
    }
    TEMPORARIES.with(|t| t.set(true));
    clean_after(&sim, 0);
}

/// The finding's control: the same step over two declared runners that
/// share bytes is ordered.
#[test]
fn a_step_staging_and_replaying_two_declared_runners_sharing_bytes_is_ordered() {
    TEMPORARIES.with(|t| t.set(false));
    let sim = sim::Device::new();
    let (stage, pool) = (sim.new_stream(), sim.new_stream());
    {
        let mut r = sealed(&sim, &pool, &[64, 256]);
        let mut step = r.step();
        for runner in [0, 1] {
            step.consume_mut(RunnerId(runner), &stage, |s, v| {
                sim.launch(s, sim::Kernel::fill(&v[0], 1.0), 1)
            })
            .unwrap();
            step.replay(RunnerId(runner), &pool).unwrap();
        }
        let mut kept = step.build().unwrap().keep();
        r.launch_kept(&mut kept, &pool).unwrap();
        r.synchronize().unwrap();
        drop(kept);
    }
    TEMPORARIES.with(|t| t.set(true));
    clean_after(&sim, 0);
}

/// One joined runner alone, staged on one stream and replayed on another
/// inside a step graph, is ordered.
#[test]
fn a_step_staging_and_replaying_a_joined_runner_on_two_streams_is_ordered() {
    TEMPORARIES.with(|t| t.set(false));
    let sim = sim::Device::new();
    let (stage, pool) = (sim.new_stream(), sim.new_stream());
    let sink = sim.alloc_f32(128).unwrap();
    {
        let mut r = sealed(&sim, &pool, &[64, 256]);
        join(&mut r, &sim, &pool, RunnerId(9), 128).unwrap();
        let mut step = r.step();
        step.consume_mut(RunnerId(9), &stage, |s, v| {
            sim.launch(s, sim::Kernel::fill(&v[0], 1.0), 1)
        })
        .unwrap();
        step.replay(RunnerId(9), &pool).unwrap();
        step.consume(RunnerId(9), &stage, |s, v| {
            sim.launch(s, sim::Kernel::copy(&v[1], &sink), 1)
        })
        .unwrap();
        let mut kept = step.build().unwrap().keep();
        r.launch_kept(&mut kept, &pool).unwrap();
        r.synchronize().unwrap();
        assert_eq!(sim.hazards(), []);
        assert_eq!(sim.read_f32(&sink).unwrap(), vec![2.0; 128]);
        drop(kept);
    }
    TEMPORARIES.with(|t| t.set(true));
    clean_after(&sim, 1);
}
