//! Attacks on the buckets that join a sealed plan at run time
//! (`docs/lifecycle.md`, "Buckets at run time"), from safe code on `sim`:
//! releases under in-flight work, budgets under churn, forgotten and
//! panicking captures, faults at every call of a seal.

use crate::support::attacks::{with_buckets, BucketBench};
use crate::support::faults::at_each_call;
use replay_arena::backend::Streams;
use replay_arena::sim;
use replay_arena::{BucketError, BucketId, BucketState, JoinError, RunnerId};

use crate::support::buckets::{capture_double, input, output, run, sealed};

/// `$on.consume_mut` (a plan or a step) of runner `$runner` on `$stream`:
/// its input filled with `$value`.
macro_rules! stage {
    ($on:expr, $sim:expr, $runner:expr, $stream:expr, $value:expr) => {
        $on.consume_mut(RunnerId($runner), $stream, |s, v| {
            $sim.launch(s, sim::Kernel::fill(&v[0], $value), 1)
        })
        .unwrap()
    };
}

/// `$on.consume` (a plan or a step) of runner `$runner` on `$stream`: its
/// output copied to `$sink` in `$ticks`.
macro_rules! copy_out {
    ($on:expr, $sim:expr, $runner:expr, $stream:expr, $sink:expr, $ticks:expr) => {
        $on.consume(RunnerId($runner), $stream, |s, v| {
            $sim.launch(s, sim::Kernel::copy(&v[1], $sink), $ticks)
        })
        .unwrap()
    };
}

#[test]
fn a_bucket_whose_consumer_still_reads_on_another_stream_is_not_released() {
    with_buckets(true, &[256], |b, r| {
        stage!(r, b.sim, 1, &b.pool, 1.0);
        r.replay(RunnerId(1), &b.pool).unwrap();
        r.synchronize().unwrap();
        // A long read of the runner's output on another stream.
        copy_out!(r, b.sim, 1, &b.side, &b.sinks[0], 1000);
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
    });
}

#[test]
fn a_bucket_whose_kept_step_is_in_flight_is_not_released() {
    with_buckets(false, &[], |b, r| {
        stage!(r, b.sim, 0, &b.stage, 1.0);
        let mut step = r.step();
        step.replay(RunnerId(0), &b.pool).unwrap();
        let mut kept = step.build().unwrap().keep();
        r.launch_kept(&mut kept, &b.pool).unwrap();
        // In flight: neither a release nor a budget may drop it.
        assert!(matches!(
            r.release_bucket(BucketId(0)),
            Err(BucketError::InFlight { .. })
        ));
        assert_eq!(r.set_bucket_budget(1).unwrap(), [BucketId(1)]);
        assert_eq!(r.bucket_state(BucketId(0)).unwrap(), BucketState::Captured);
        r.launch_kept(&mut kept, &b.pool).unwrap();
        r.synchronize().unwrap();
        r.release_bucket(BucketId(0)).unwrap();
        drop(kept);
    });
}

#[test]
fn a_step_over_a_joined_runner_waits_for_the_declared_bucket_sharing_its_bytes() {
    with_buckets(false, &[256, 128], |b, r| {
        let other = b.sim.new_stream();
        let (sink, sink2) = (&b.sinks[0], &b.sinks[1]);
        b.run(r, 1, 1.0, sink).unwrap();
        crate::support::buckets::join(r, &b.sim, &other, RunnerId(9), 128).unwrap();
        // At once, on another stream, a step graph over the joined runner
        // and the declared one whose bytes it shares.
        let mut step = r.step();
        stage!(step, b.sim, 9, &other, 4.0);
        step.replay(RunnerId(9), &other).unwrap();
        copy_out!(step, b.sim, 9, &other, sink2, 1);
        let mut kept = step.build().unwrap().keep();
        r.launch_kept(&mut kept, &other).unwrap();
        b.run(r, 1, 3.0, sink).unwrap();
        r.launch_kept(&mut kept, &other).unwrap();
        r.synchronize().unwrap();
        assert_eq!(b.sim.read_f32(sink2).unwrap(), vec![8.0; 128]);
        assert_eq!(b.sim.read_f32(sink).unwrap(), vec![6.0; 256]);
        drop(kept);
    });
}

#[test]
fn a_budget_of_one_alternating_two_buckets_over_two_streams_waits_and_stays_right() {
    let bench = BucketBench::new(&[64, 256]);
    let (sim, sinks) = (&bench.sim, &bench.sinks);
    let streams: Vec<_> = (0..6).map(|_| sim.new_stream()).collect();
    let sizes = [64u64, 256];
    {
        let mut r = sealed(sim, &streams[0], &sizes);
        assert_eq!(r.set_bucket_budget(1).unwrap(), [BucketId(0)]);
        for k in 0..8usize {
            let b = k % 2;
            let s = &streams[3 * (k % 2)..3 * (k % 2) + 3];
            if r.bucket_state(BucketId(b as u32)).unwrap() == BucketState::Released {
                let mut capture = r.recapture_bucket(BucketId(b as u32)).unwrap();
                let pool = &s[1];
                capture_double(
                    capture.capture(RunnerId(b as u32)).unwrap(),
                    sim,
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
                        Streams::synchronize(sim).unwrap();
                        let joined = capture.seal().unwrap();
                        assert_eq!(joined.released, [BucketId(1 - b as u32)]);
                    }
                }
            }
            let lanes = (&s[0], &s[1], &s[2]);
            run(&mut r, sim, lanes, RunnerId(b as u32), k as f32, &sinks[b]).unwrap();
        }
        r.synchronize().unwrap();
        assert_eq!(sim.read_f32(&sinks[0]).unwrap(), vec![12.0; 64]);
        assert_eq!(sim.read_f32(&sinks[1]).unwrap(), vec![14.0; 256]);
    }
    bench.assert_clean();
}

#[test]
fn a_forgotten_bucket_capture_leaks_the_arenas_and_later_joins_say_arenas_gone() {
    let b = BucketBench::new(&[256]);
    let (sim, sink) = (&b.sim, &b.sinks[0]);
    let mut r = b.sealed();
    r.set_bucket_budget(2).unwrap();
    r.synchronize().unwrap();
    r.release_bucket(BucketId(0)).unwrap();
    {
        let mut discovery = r.discover_bucket("bs=128").unwrap();
        let mut armed = discovery.arm(RunnerId(5)).unwrap();
        armed.record(input(128)).unwrap();
        armed.record(output(128)).unwrap();
        let mut capture = discovery.fit().unwrap();
        capture_double(capture.capture(RunnerId(5)).unwrap(), sim, &b.pool, 128).unwrap();
        std::mem::forget(capture);
    }
    // The plan goes on: its views still address live (leaked) memory.
    b.run(&mut r, 1, 2.0, sink).unwrap();
    r.synchronize().unwrap();
    assert_eq!(sim.read_f32(sink).unwrap(), vec![4.0; 256]);
    assert!(r.replay(RunnerId(5), &b.pool).is_err());
    assert!(matches!(
        r.recapture_bucket(BucketId(0)),
        Err(JoinError::ArenasGone)
    ));
    let e = b.join(&mut r, 6, 32).unwrap_err();
    assert!(e.to_string().contains("arena"), "{e}");
    drop(r);
    assert_eq!(sim.hazards(), []);
    // Leaking is allowed: the arenas the forgotten capture held stay.
    assert!(sim.live_allocations() > 1, "the arenas leaked, not freed");
}

#[test]
fn a_forgotten_bucket_discovery_changes_nothing() {
    with_buckets(true, &[256], |b, r| {
        let mut discovery = r.discover_bucket("bs=128").unwrap();
        discovery
            .arm(RunnerId(5))
            .unwrap()
            .record(input(128))
            .unwrap();
        std::mem::forget(discovery);
        // The same name and runner join afterwards.
        b.join(r, 5, 128).unwrap();
        b.run(r, 5, 1.5, &b.sinks[0]).unwrap();
        r.synchronize().unwrap();
        assert_eq!(b.sim.read_f32(&b.sinks[0]).unwrap()[..128], [3.0; 128]);
    });
}

#[test]
fn a_join_whose_capture_closure_panics_or_fails_leaves_the_plan_usable() {
    with_buckets(true, &[256], |b, r| {
        let (sim, pool) = (&b.sim, &b.pool);
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
                let got = cap.stream_capture(pool, |s| {
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
            assert!(!sim.is_capturing(pool).unwrap(), "pool left capturing");
        }
        assert!(r.replay(RunnerId(5), pool).is_err());
        b.join(r, 5, 128).unwrap();
        b.run(r, 5, 1.0, &b.sinks[0]).unwrap();
        b.run(r, 1, 2.0, &b.sinks[0]).unwrap();
        r.synchronize().unwrap();
        assert_eq!(sim.read_f32(&b.sinks[0]).unwrap(), vec![4.0; 256]);
    });
}

#[test]
fn a_released_buckets_runner_ids_are_not_reused_by_a_join() {
    let b = BucketBench::new(&[]);
    let mut r = b.sealed();
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
        with_buckets(true, &[256], |b, r| {
            let (sim, pool, sink) = (&b.sim, &b.pool, &b.sinks[0]);
            r.set_bucket_budget(2).unwrap();
            b.run(r, 0, 1.0, sink).unwrap();
            r.synchronize().unwrap();
            let joined = attack.on(sim, || b.join(r, 7, 128));
            // The join released bucket 1 (never launched).
            let released = attack.on(sim, || r.release_bucket(BucketId(0)).is_ok());
            let mut again = |n: u32, len: u64| {
                attack.on(sim, || -> replay_arena::Result<Vec<BucketId>> {
                    let mut capture = r.recapture_bucket(BucketId(n))?;
                    capture_double(capture.capture(RunnerId(n))?, sim, pool, len)?;
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
            for (bucket, runner, n) in [(0u32, 0u32, 64usize), (1, 1, 256), (2, 7, 128)] {
                let state = r.bucket_state(BucketId(bucket));
                if state.as_ref().ok() != Some(&BucketState::Captured) {
                    assert!(r.replay(RunnerId(runner), pool).is_err(), "{attack}");
                    continue;
                }
                b.run(r, runner, 3.0, sink)
                    .unwrap_or_else(|e| panic!("{attack}: {e}"));
                r.synchronize().unwrap();
                assert_eq!(
                    sim.read_f32(sink).unwrap()[..n],
                    vec![6.0; n][..],
                    "{attack}"
                );
            }
        });
    });
    assert!(attacked > 3, "{attacked}");
}

#[test]
fn a_trace_spans_joins_releases_and_recaptures() {
    with_buckets(true, &[256], |b, r| {
        let sink = &b.sinks[0];
        r.start_trace().unwrap();
        b.run(r, 1, 1.0, sink).unwrap();
        r.synchronize().unwrap();
        r.release_bucket(BucketId(1)).unwrap();
        // Joined mid-trace: a runner slot the trace did not know at start.
        b.join(r, 9, 128).unwrap();
        b.run(r, 9, 2.0, sink).unwrap();
        let mut capture = r.recapture_bucket(BucketId(1)).unwrap();
        capture_double(capture.capture(RunnerId(1)).unwrap(), &b.sim, &b.pool, 256).unwrap();
        capture.seal().unwrap();
        b.run(r, 1, 3.0, sink).unwrap();
        let trace = r.finish_trace().unwrap();
        let names: Vec<String> = trace.uses().iter().map(|u| u.kind.name()).collect();
        let replays: Vec<&String> = names.iter().filter(|n| n.starts_with("replay")).collect();
        assert_eq!(replays.len(), 3, "{names:?}");
        assert!(replays[1].contains('9'), "{names:?}");
        assert_eq!(b.sim.read_f32(sink).unwrap(), vec![6.0; 256]);
    });
}

#[test]
fn a_step_over_a_declared_and_a_joined_runner_sharing_bytes_is_ordered_and_refuses_once_released() {
    with_buckets(false, &[], |b, r| {
        let pool = &b.pool;
        b.join(r, 9, 128).unwrap();
        // The two share bytes (G = 1): each is staged right before it runs.
        let mut kept = staged_and_replayed(b, r, [0, 9]);
        r.launch_kept(&mut kept, pool).unwrap();
        r.synchronize().unwrap();
        assert_eq!(b.sim.hazards(), [], "the first launch");
        r.launch_kept(&mut kept, pool).unwrap();
        assert!(matches!(
            r.release_bucket(BucketId(2)),
            Err(BucketError::InFlight { .. })
        ));
        r.synchronize().unwrap();
        r.release_bucket(BucketId(2)).unwrap();
        assert!(matches!(
            r.launch_kept(&mut kept, pool),
            Err(replay_arena::StepLaunchError::Released {
                bucket: BucketId(2)
            })
        ));
        // The declared runner alone still replays.
        stage!(r, b.sim, 0, &b.stage, 1.0);
        r.replay(RunnerId(0), pool).unwrap();
        r.synchronize().unwrap();
        drop(kept);
    });
}

/// A kept step that stages (on `stage`) and replays (on `pool`) each of
/// `runners` in turn.
fn staged_and_replayed(
    b: &BucketBench,
    r: &mut replay_arena::Replayable<sim::Device>,
    runners: [u32; 2],
) -> replay_arena::KeptStep<sim::Device> {
    let mut step = r.step();
    for runner in runners {
        stage!(step, b.sim, runner, &b.stage, 1.0);
        step.replay(RunnerId(runner), &b.pool).unwrap();
    }
    step.build().unwrap().keep()
}

/// The finding's control: the same step over two declared runners that
/// share bytes is ordered.
#[test]
fn a_step_staging_and_replaying_two_declared_runners_sharing_bytes_is_ordered() {
    with_buckets(false, &[], |b, r| {
        let mut kept = staged_and_replayed(b, r, [0, 1]);
        r.launch_kept(&mut kept, &b.pool).unwrap();
        r.synchronize().unwrap();
        drop(kept);
    });
}

/// One joined runner alone, staged on one stream and replayed on another
/// inside a step graph, is ordered.
#[test]
fn a_step_staging_and_replaying_a_joined_runner_on_two_streams_is_ordered() {
    with_buckets(false, &[128], |b, r| {
        b.join(r, 9, 128).unwrap();
        let mut step = r.step();
        stage!(step, b.sim, 9, &b.stage, 1.0);
        step.replay(RunnerId(9), &b.pool).unwrap();
        copy_out!(step, b.sim, 9, &b.stage, &b.sinks[0], 1);
        let mut kept = step.build().unwrap().keep();
        r.launch_kept(&mut kept, &b.pool).unwrap();
        r.synchronize().unwrap();
        assert_eq!(b.sim.hazards(), []);
        assert_eq!(b.sim.read_f32(&b.sinks[0]).unwrap(), vec![2.0; 128]);
        drop(kept);
    });
}
