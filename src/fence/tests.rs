//! The fence's unit tests: its ledger and transactions on `sim`.

use super::*;
use crate::backend::sim;
use crate::discover::{Discovering, PlanConfig};
use crate::plan::Policy;
use crate::vocab::{DType, Domain, Request};

/// `n` runners of one request each at G = 1: they all claim the one
/// generation's region.
fn plan(n: u32) -> Planned {
    let q = Request::new(Domain::Device, DType::F32, 64);
    Discovering::from_runners(PlanConfig::new(), (0..n).map(|r| (RunnerId(r), [q])))
        .unwrap()
        .plan(Policy::Generations(1))
        .unwrap()
}

/// The fence of `plan`, with an event per runner.
fn fence(sim: &sim::Device, plan: &Planned) -> Fence<sim::Device> {
    let n = plan.runners.len();
    let events = (0..n).map(|_| Some(sim.create_event().unwrap())).collect();
    Fence::new(events, plan, &[])
}

/// `stream` with its identity, as `enter` gives it.
fn on<'s>(sim: &sim::Device, stream: &'s sim::Stream) -> On<'s, sim::Stream> {
    On {
        stream,
        id: sim.stream_id(stream),
    }
}

/// A replay of slot `i` on `stream` (an empty launch).
fn replay(
    f: &mut Fence<sim::Device>,
    sim: &sim::Device,
    p: &Planned,
    i: usize,
    stream: &sim::Stream,
) {
    f.replay(sim, p, i, on(sim, stream), || Ok(())).unwrap();
}

/// A reading consumer of slot `i` on `stream` that enqueues nothing.
fn consume(
    f: &mut Fence<sim::Device>,
    sim: &sim::Device,
    p: &Planned,
    i: usize,
    stream: &sim::Stream,
) {
    f.consume(sim, p, &[i], on(sim, stream), false, || ((), true))
        .unwrap();
}

#[test]
fn fence_stats_print_as_one_readable_line() {
    let stats = FenceStats {
        replays: 3,
        consumers: 2,
        waits: 1,
        waits_skipped: 4,
        event_records: 5,
        step_launches: 6,
    };
    assert_eq!(
        stats.to_string(),
        "3 replays, 2 consumers, 1 waits on another stream and 4 skipped (stream order implied \
         them), 5 event records, 6 step graph launches"
    );
}

#[test]
fn a_first_replay_waits_for_nothing() {
    let sim = sim::Device::new();
    let p = plan(2);
    let mut f = fence(&sim, &p);
    replay(&mut f, &sim, &p, 0, &sim.new_stream());
    let s = f.stats();
    assert_eq!(
        (s.replays, s.waits, s.waits_skipped, s.event_records),
        (1, 0, 0, 0)
    );
}

#[test]
fn a_claimer_on_the_same_stream_skips_the_wait() {
    let sim = sim::Device::new();
    let p = plan(2);
    let mut f = fence(&sim, &p);
    let a = sim.new_stream();
    replay(&mut f, &sim, &p, 0, &a);
    replay(&mut f, &sim, &p, 1, &a);
    assert_eq!(f.stats().waits_skipped, 1);
    assert_eq!(f.stats().waits, 0);
}

#[test]
fn a_claimer_on_another_stream_records_the_deferred_event_then_waits() {
    let sim = sim::Device::new();
    let p = plan(2);
    let mut f = fence(&sim, &p);
    let (a, b) = (sim.new_stream(), sim.new_stream());
    replay(&mut f, &sim, &p, 0, &a);
    replay(&mut f, &sim, &p, 1, &b);
    assert_eq!((f.stats().event_records, f.stats().waits), (1, 1));
    // Runner 0 was waited on, so from now on it records at once.
    replay(&mut f, &sim, &p, 0, &a);
    assert_eq!(
        f.stats().event_records,
        3,
        "runner 1 deferred, then 0 at once"
    );
}

#[test]
fn ownership_is_lost_to_the_next_claimer_and_missing_before_any_replay() {
    let sim = sim::Device::new();
    let p = plan(2);
    let mut f = fence(&sim, &p);
    let a = sim.new_stream();
    let all = p.runners[0].claims.clone();
    assert_eq!(f.owner_check(0, &all), Err(NotOwner::NeverReplayed));
    replay(&mut f, &sim, &p, 0, &a);
    assert_eq!(f.owner_check(0, &all), Ok(()));
    replay(&mut f, &sim, &p, 1, &a);
    assert_eq!(f.owner_check(0, &all), Err(NotOwner::OverwrittenBy(1)));
}

#[test]
fn a_consumer_waits_for_the_replay_and_a_later_claimer_on_its_stream_waits_no_more() {
    let sim = sim::Device::new();
    let p = plan(2);
    let mut f = fence(&sim, &p);
    let (a, x) = (sim.new_stream(), sim.new_stream());
    replay(&mut f, &sim, &p, 0, &a);
    consume(&mut f, &sim, &p, 0, &x);
    assert_eq!((f.stats().consumers, f.stats().waits), (1, 1));
    // The next claimer on `x` is ordered after the consumer by stream
    // order, and waits for the replay on `a` only.
    replay(&mut f, &sim, &p, 1, &x);
    assert_eq!(f.stats().waits, 1);
}

#[test]
fn quiesce_records_deferred_completions_and_leaves_nothing_pending() {
    let sim = sim::Device::new();
    let p = plan(2);
    let mut f = fence(&sim, &p);
    let (a, b) = (sim.new_stream(), sim.new_stream());
    replay(&mut f, &sim, &p, 0, &a);
    replay(&mut f, &sim, &p, 1, &b); // different claim owners: 1 now owns it
    f.quiesce(&sim).unwrap();
    assert!(f
        .runners
        .iter()
        .all(|r| matches!(r.completion, None | Some(Completion::Recorded { .. }))));
}
