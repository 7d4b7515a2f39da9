//! The fence waits and records no more than it must, on `sim`: a replay
//! waits once for the readers of the bytes it overwrites (they are then
//! behind it), and an event recorded at once where a runner completes
//! (another stream waited for it before) is recorded at once again only
//! while somebody waits for it. Counted as the calls the device saw.

use crate::support::faults::{assert_hazard_free, copy_out, fill_plan, r};
use replay_arena::sim::{self, Call, Faults};
use replay_arena::Replayable;

type Plan = Replayable<sim::Device>;

/// Event waits and event records the sim saw while `op` ran.
fn calls(sim: &sim::Device, op: impl FnOnce()) -> (u64, u64) {
    sim.inject(Faults::none());
    op();
    let log = sim.fault_log();
    let seen = |call| log.per_call.get(&call).copied().unwrap_or(0);
    (seen(Call::WaitEvent), seen(Call::RecordEvent))
}

/// Two runners of their own bytes (two generations), on three streams.
fn plan() -> (sim::Device, [sim::Stream; 3], Plan) {
    let sim = sim::Device::new();
    let streams = crate::support::streams::<3>(&sim);
    let rp = fill_plan(&sim, 2, 2);
    (sim, streams, rp)
}

/// A reader of runner 0 on another stream is waited for by runner 0's
/// next replay, and not by the replay after it: that replay follows the
/// one that waited, in stream order. (Runner 1 replays between them, so
/// the second is not a repeat of the first.)
#[test]
fn a_reader_is_waited_for_once() {
    let (sim, s, mut rp) = plan();
    let sink = sim.alloc_f32(64).unwrap();
    rp.replay(r(0), &s[0]).unwrap();
    copy_out(&mut rp, &sim, r(0), &s[1], &sink).unwrap();
    let (waits, _) = calls(&sim, || rp.replay(r(0), &s[0]).unwrap());
    assert_eq!(waits, 1, "the replay after the reader waits for it");
    rp.replay(r(1), &s[0]).unwrap();
    let (waits, _) = calls(&sim, || rp.replay(r(0), &s[0]).unwrap());
    assert_eq!(waits, 0, "the reader was waited for already");
    rp.synchronize().unwrap();
    assert_eq!(sim.read_f32(&sink).unwrap(), vec![1.0; 64]);
    assert_hazard_free(&sim);
}

/// Once another stream waited for runner 0, its next replay records its
/// completion at once; when nobody waits for that record, the replay
/// after it records nothing (it defers again, as before the wait), and
/// a stream that then waits still gets a record, made late.
#[test]
fn a_record_at_once_nobody_waited_for_is_not_made_again() {
    let (sim, s, mut rp) = plan();
    rp.replay(r(0), &s[0]).unwrap();
    // Runner 1 on another stream does not wait for runner 0 (other bytes);
    // a program wait does.
    rp.wait_for(r(0), &s[1]).unwrap();
    let (_, records) = calls(&sim, || rp.replay(r(0), &s[0]).unwrap());
    assert_eq!(records, 1, "recorded at once: a stream waited before");
    rp.replay(r(1), &s[0]).unwrap();
    let (_, records) = calls(&sim, || rp.replay(r(0), &s[0]).unwrap());
    assert_eq!(records, 0, "nobody waited for the record made at once");
    let (waits, records) = calls(&sim, || rp.wait_for(r(0), &s[2]).unwrap());
    assert_eq!((waits, records), (1, 1), "a later waiter records late");
    rp.synchronize().unwrap();
    assert_hazard_free(&sim);
    assert_eq!(
        sim.read_f32(&rp.views(r(0)).unwrap()[0]).unwrap(),
        vec![1.0; 64]
    );
}
