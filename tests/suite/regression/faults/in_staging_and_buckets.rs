//! Faults in staged inputs and buckets: stagings (`consume_mut` of a
//! `Purpose::Input` runner) whose wait fails or whose writer fails after
//! writing, bucket switches with a fault at each call, and kept step
//! graphs of a bucket whose bytes another bucket took. Guards that a
//! runner never replays on, and is never consumed after, bytes a failed or
//! foreign writer left. An attack that found no hole.

use crate::support::attacks::{
    assert_summed_then_clean, bucket_discovery, capture_doubling, BucketBench,
};
use replay_arena::sim::{self, Call, Faults};
use replay_arena::Policy;
use replay_arena::{
    ConsumeError, KeptStep, ReplayError, Replayable, RunnerId, ScheduleError, StepLaunchError,
};

use crate::support::faults::{at_each_call, r, read0, under, N};
use crate::support::steps::allocate_discovered;

/// Two buckets (runner 0: 64 elements, runner 1: 256), each with a staged
/// input and an output; each graph copies its input to its output and
/// doubles it. The buckets share bytes from the start of each arena.
fn buckets(sim: &sim::Device) -> Replayable<sim::Device> {
    let sizes = [64u64, 256];
    let d = bucket_discovery(&sizes, 1);
    let mut capturing = allocate_discovered(sim, d, Policy::Generations(1));
    let s = sim.new_stream();
    for (b, &n) in sizes.iter().enumerate() {
        let cap = capturing.capture(r(b as u32)).unwrap();
        capture_doubling(cap, sim, &s, n, (20, 20));
    }
    capturing.seal().unwrap()
}

fn stage(
    rp: &mut Replayable<sim::Device>,
    sim: &sim::Device,
    runner: RunnerId,
    s: &sim::Stream,
    value: f32,
) -> Result<(), ConsumeError<replay_arena::BackendError>> {
    rp.consume_mut(runner, s, |st, v| {
        sim.launch(st, sim::Kernel::fill(&v[0], value), 10)
    })
}

/// A device with its streams (`stage`, `pool`, `side`), and [`buckets`]
/// on it.
fn on_buckets() -> (BucketBench, Replayable<sim::Device>) {
    let b = BucketBench::new(&[]);
    let rp = buckets(&b.sim);
    (b, rp)
}

/// [`on_buckets`], runner 0 staged with `value` and replayed.
fn bucket_0_run(value: f32) -> (BucketBench, Replayable<sim::Device>) {
    let (b, mut rp) = on_buckets();
    stage(&mut rp, &b.sim, r(0), &b.stage, value).unwrap();
    rp.replay(r(0), &b.pool).unwrap();
    (b, rp)
}

/// Runner 1, whose input nothing staged, refuses to replay; no hazard.
fn assert_runner_1_unstaged(
    rp: &mut Replayable<sim::Device>,
    sim: &sim::Device,
    pool: &sim::Stream,
) {
    assert!(matches!(
        rp.replay(r(1), pool),
        Err(ReplayError::InputNotStaged { .. })
    ));
    assert_eq!(sim.hazards(), []);
}

/// A staging whose wait fails (before the writer runs) leaves the earlier
/// staging in place: the runner replays its old input.
#[test]
fn a_staging_whose_wait_fails_keeps_the_earlier_staging() {
    let (b, mut rp) = bucket_0_run(3.0);
    let (sim, st, pool) = (&b.sim, &b.stage, &b.pool);
    let before = rp.fence_stats();
    let failed = under(&sim, Faults::nth(Call::WaitEvent, 0), || {
        stage(&mut rp, &sim, r(0), &st, 4.0)
    });
    assert!(
        matches!(failed, Err(ConsumeError::Backend(_))),
        "{failed:?}"
    );
    assert_eq!(rp.fence_stats(), before);
    rp.replay(r(0), &pool).unwrap();
    rp.synchronize().unwrap();
    assert_eq!(read0(&sim, &rp.views(r(0)).unwrap()[1]), 6.0);
    assert_eq!(sim.hazards(), []);
}

/// Staging the other bucket, whose wait fails, takes nothing from the
/// bucket that holds the bytes: it still replays and is consumed.
#[test]
fn a_bucket_switch_whose_staging_wait_fails_leaves_the_other_bucket_intact() {
    let (b, mut rp) = bucket_0_run(5.0);
    let (sim, st, pool, side) = (&b.sim, &b.stage, &b.pool, &b.side);
    under(&sim, Faults::nth(Call::WaitEvent, 0), || {
        assert!(stage(&mut rp, &sim, r(1), &st, 9.0).is_err())
    });
    let sink = sim.alloc_f32(N).unwrap();
    rp.consume(r(0), &side, |s, v| {
        sim.launch(s, sim::Kernel::copy(&v[1], &sink), 1)
    })
    .unwrap();
    rp.replay(r(0), &pool).unwrap();
    rp.synchronize().unwrap();
    assert_eq!(read0(&sim, &sink), 10.0);
    assert_runner_1_unstaged(&mut rp, sim, pool);
}

/// The other bucket's writer writes the shared bytes and fails: the
/// bucket that held them must not replay on what the failed writer left
/// (its input is gone), nor be consumed as if its output were intact.
#[test]
fn a_failed_staging_of_another_bucket_unstages_the_bucket_whose_bytes_it_wrote() {
    let (b, mut rp) = bucket_0_run(5.0);
    let (sim, st, pool, side) = (&b.sim, &b.stage, &b.pool, &b.side);
    let failed = rp.consume_mut(r(1), &st, |s, v| {
        // Writes every byte of runner 1's input and output, then fails.
        sim.launch(s, sim::Kernel::fill(&v[0], 9.0), 10)
            .map_err(|e| e.to_string())?;
        sim.launch(s, sim::Kernel::fill(&v[1], 9.0), 10)
            .map_err(|e| e.to_string())?;
        Err::<(), String>("the host copy failed".into())
    });
    assert!(failed.is_err());
    match rp.replay(r(0), &pool) {
        Err(ReplayError::InputNotStaged { .. }) => {}
        Ok(()) => {
            rp.synchronize().unwrap();
            assert_eq!(
                read0(&sim, &rp.views(r(0)).unwrap()[1]),
                10.0,
                "runner 0 replayed on the failed writer's bytes"
            );
        }
        Err(e) => panic!("{e:?}"),
    }
    let late = rp.consume(r(0), &side, |_, _| Ok::<(), String>(()));
    assert!(late.is_err(), "runner 0's output was overwritten: {late:?}");
    assert_runner_1_unstaged(&mut rp, sim, pool);
}

/// A fault at each call of a bucket-switching program with staging on a
/// third stream: no hazard, the values after carrying on are exact, and
/// teardown leaks nothing.
#[test]
fn a_fault_at_each_call_of_bucket_switches_leaves_no_hazard_and_no_leak() {
    at_each_call(|attack| {
        let sim = sim::Device::new();
        let s = [sim.new_stream(), sim.new_stream(), sim.new_stream()];
        let mut rp = buckets(&sim);
        let sink = sim.alloc_f32(N).unwrap();
        attack.on(&sim, || {
            for step in 0..4u32 {
                let b = step % 2;
                let _ = stage(&mut rp, &sim, r(b), &s[0], step as f32);
                let _ = rp.replay(r(b), &s[1]);
                let _ = rp.consume(r(b), &s[2], |st, v| {
                    sim.launch(st, sim::Kernel::copy(&v[1], &sink), 30)
                });
            }
        });
        assert_eq!(sim.hazards(), [], "{attack}");
        for b in [1u32, 0] {
            stage(&mut rp, &sim, r(b), &s[1], 10.0 + b as f32).unwrap();
            rp.replay(r(b), &s[2]).unwrap();
            rp.consume(r(b), &s[0], |st, v| {
                sim.launch(st, sim::Kernel::copy(&v[1], &sink), 30)
            })
            .unwrap();
        }
        let what = attack.to_string();
        assert_summed_then_clean((rp, &sim), &sink, (20.0, 1), &what);
    });
}

/// A staging (`consume_mut` of a `Purpose::Input` runner) with a fault
/// at each of its calls, then a replay on another stream: the replay is
/// refused (`InputNotStaged`) or waits for the write and reads it.
#[test]
fn a_staging_failing_at_each_call_is_either_staged_and_waited_for_or_refused() {
    at_each_call(|attack| {
        let (b, mut rp) = bucket_0_run(1.0);
        let (sim, st, pool) = (&b.sim, &b.stage, &b.pool);
        let staged = attack.on_ok(&sim, || stage(&mut rp, &sim, r(0), &st, 2.0));
        match rp.replay(r(0), &pool) {
            Ok(()) => {
                rp.synchronize().unwrap();
                let v = read0(&sim, &rp.views(r(0)).unwrap()[1]);
                if staged.is_ok() {
                    assert_eq!(v, 4.0, "{attack}");
                } else {
                    assert!(v == 2.0 || v == 4.0, "{attack}: {v}");
                }
            }
            Err(ReplayError::InputNotStaged { .. }) => assert!(staged.is_err(), "{attack}"),
            Err(e) => panic!("{attack}: {e:?}"),
        }
        assert_eq!(sim.hazards(), [], "{attack}");
    });
}

/// Bucket 0 staged with 5 and its replay kept as a step graph, launched
/// once on `pool`.
fn kept_bucket_0(
    rp: &mut Replayable<sim::Device>,
    sim: &sim::Device,
    st: &sim::Stream,
    pool: &sim::Stream,
) -> KeptStep<sim::Device> {
    stage(rp, sim, r(0), st, 5.0).unwrap();
    let mut kept = {
        let mut step = rp.step();
        step.replay(r(0), pool).unwrap();
        step.build().unwrap().keep()
    };
    rp.launch_kept(&mut kept, pool).unwrap();
    kept
}

/// Launches bucket 0's kept step again after bucket 1 took its bytes: it
/// is refused (`InputNotStaged`) or reads bucket 0's own input (10).
fn assert_kept_bucket_0_refused_or_intact(
    rp: &mut Replayable<sim::Device>,
    sim: &sim::Device,
    kept: &mut KeptStep<sim::Device>,
    pool: &sim::Stream,
    what: &str,
) {
    match rp.launch_kept(kept, pool) {
        Err(StepLaunchError::Schedule(ScheduleError::Replay(ReplayError::InputNotStaged {
            ..
        }))) => {}
        Ok(()) => {
            rp.synchronize().unwrap();
            assert_eq!(
                read0(sim, &rp.views(r(0)).unwrap()[1]),
                10.0,
                "the kept step replayed runner 0 on {what}"
            );
        }
        Err(e) => panic!("{e:?}"),
    }
    assert_eq!(sim.hazards(), []);
}

/// Per bucket, its staging and replay as a kept step graph: staging
/// the other bucket (per runner) takes the shared bytes, so launching
/// the first bucket's kept step again must not read the other bucket's
/// input as its own.
#[test]
fn a_kept_step_of_a_bucket_whose_input_another_bucket_took_is_refused_or_restages() {
    let (b, mut rp) = on_buckets();
    let (sim, st, pool) = (&b.sim, &b.stage, &b.pool);
    let mut kept = kept_bucket_0(&mut rp, &sim, &st, &pool);
    rp.synchronize().unwrap();
    assert_eq!(read0(&sim, &rp.views(r(0)).unwrap()[1]), 10.0);
    stage(&mut rp, &sim, r(1), &st, 9.0).unwrap();
    rp.replay(r(1), &pool).unwrap();
    assert_kept_bucket_0_refused_or_intact(&mut rp, &sim, &mut kept, &pool, "runner 1's input");
}

/// The same through a failed staging of the other bucket (its writer
/// wrote the shared bytes, then failed).
#[test]
fn a_kept_step_of_a_bucket_after_another_bucket_failed_its_staging_does_not_read_its_bytes() {
    let (b, mut rp) = on_buckets();
    let (sim, st, pool) = (&b.sim, &b.stage, &b.pool);
    let mut kept = kept_bucket_0(&mut rp, &sim, &st, &pool);
    let failed = rp.consume_mut(r(1), &st, |s, v| {
        sim.launch(s, sim::Kernel::fill(&v[0], 9.0), 10)
            .map_err(|e| e.to_string())?;
        Err::<(), String>("the host copy failed".into())
    });
    assert!(failed.is_err());
    assert_kept_bucket_0_refused_or_intact(
        &mut rp,
        &sim,
        &mut kept,
        &pool,
        "a failed writer's bytes",
    );
}
