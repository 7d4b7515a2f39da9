//! A consumer of a runner whose bytes another runner claimed since is
//! `Overwritten`, naming that runner; a runner never replayed is
//! `NotReplayed` even after another claimed its bytes; a consumer reads its
//! runner's value and the next claimer waits for it.

use crate::support::attacks::replayed_on_first;
use crate::support::steps::fence::*;
use replay_arena::sim;
use replay_arena::{ConsumeError, Policy, Replayable, RunnerId};

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
        sim.launch(s, sim::Kernel::copy(&views[0], out), ticks)
    })
}

#[test]
fn consuming_bytes_another_runner_claimed_since_is_overwritten_naming_it() {
    // G = 1: runners 0 and 1 share one arena.
    let (sim, [_a, b, x], mut replayable) = replayed_on_first(2);
    let out = sim.alloc_f32(64).unwrap();
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
            replayable.replay(RunnerId(0), &sim.new_stream()).unwrap();
        }
        let err = copy_out(&sim, &mut replayable, 1, &sim.new_stream(), &out, 1).unwrap_err();
        let runner = RunnerId(1);
        assert_eq!(err, ConsumeError::NotReplayed { runner });
    }
}

#[test]
fn a_consumer_reads_its_runners_value_and_the_next_claimer_waits_for_it() {
    // G = 1 on three streams: the consumer of runner 0 is slow; runner 1's
    // replay claims the same bytes and must wait for it.
    let (sim, [_a, b, x], mut replayable) = replayed_on_first(2);
    let out = sim.alloc_f32(64).unwrap();
    copy_out(&sim, &mut replayable, 0, &x, &out, 100).unwrap();
    replayable.replay(RunnerId(1), &b).unwrap();
    assert_eq!(sim.read_f32(&out).unwrap(), vec![5.0; 64]);
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    assert!(sim.stream_time(&b) >= sim.stream_time(&x));
}
