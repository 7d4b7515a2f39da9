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

/// What a fence's state says, with stream ids as the device's stream
/// numbers (two devices' ids differ by their serial).
fn state_of(f: &Fence<sim::Device>) -> String {
    let at = |id: u64| id & 0xffff_ffff;
    let completion = |c: &Option<Completion<sim::Stream>>| match c {
        None => "-".to_string(),
        Some(Completion::Pending { id, .. }) => format!("P{}", at(*id)),
        Some(Completion::Recorded { id }) => format!("R{}", at(*id)),
    };
    let mut out = format!("epoch {} {:?}", f.epoch, f.stats);
    for r in f.runners.iter() {
        out += &format!(
            " | {} once {} used {} by {:?} readers [{}]",
            completion(&r.completion),
            r.record_at_once,
            r.waited_on,
            r.waited_by.map(at),
            r.readers
                .iter()
                .map(|x| completion(&x.completion))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    out
}

/// One operation of [`a_repeated_replay_does_what_the_whole_transaction_does`].
#[derive(Clone, Debug)]
enum Op {
    /// Replay runner slot `.0` on stream `.1`; its launch fails with `.2`.
    Replay(usize, usize, bool),
    /// A reading consumer of slot `.0` on stream `.1`.
    Consume(usize, usize),
    /// Wait for every replay and consumer.
    Quiesce,
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        6 => (0..2usize, 0..3usize, proptest::bool::weighted(0.05))
            .prop_map(|(r, s, fail)| Op::Replay(r, s, fail)),
        1 => (0..2usize, 0..3usize).prop_map(|(r, s)| Op::Consume(r, s)),
        1 => Just(Op::Quiesce),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    /// The repeated replay (the latest replay again, on its stream or on
    /// another) makes the same backend calls, fails where they fail, and
    /// leaves the same state and counts as the whole transaction, under
    /// faults at any call: the same operations on a fence that never
    /// repeats, on a device with the same fault schedule, compared after
    /// each operation.
    #[test]
    fn a_repeated_replay_does_what_the_whole_transaction_does(
        ops in proptest::collection::vec(op(), 1..60),
        seed in 0u64..1_000,
        one_in in proptest::prop_oneof![proptest::strategy::Just(0u64), 4u64..40],
    ) {
        // Two runners claiming their own bytes (G = 2), so a runner is the
        // latest user of its bytes again and again.
        let q = Request::new(Domain::Device, DType::F32, 64);
        let p = Discovering::from_runners(PlanConfig::new(), (0..2).map(|r| (RunnerId(r), [q])))
            .unwrap()
            .plan(Policy::Generations(2))
            .unwrap();
        let sims = [sim::Device::new(), sim::Device::new()];
        let streams: Vec<Vec<sim::Stream>> =
            sims.iter().map(|s| (0..3).map(|_| s.new_stream()).collect()).collect();
        let mut fences: Vec<Fence<sim::Device>> = sims.iter().map(|s| fence(s, &p)).collect();
        fences[1].never_repeat = true;
        for (sim, _) in sims.iter().zip(0..) {
            sim.inject(match one_in {
                0 => sim::Faults::none(),
                n => sim::Faults::seeded(seed, n),
            });
        }
        for op in &ops {
            let mut results = Vec::new();
            for k in 0..2 {
                let (sim, f) = (&sims[k], &mut fences[k]);
                let result = match *op {
                    Op::Replay(r, s, fail) => {
                        f.replay(sim, &p, r, on(sim, &streams[k][s]), || match fail {
                            true => Err(BackendError::Injected { call: "launch", index: 0 }),
                            false => Ok(()),
                        })
                        .map_err(|e| e.to_string())
                    }
                    Op::Consume(r, s) => f
                        .consume(sim, &p, &[r], on(sim, &streams[k][s]), false, || ((), true))
                        .map_err(|e| e.to_string()),
                    Op::Quiesce => f.quiesce(sim).map_err(|e| e.to_string()),
                };
                let log = sim.fault_log();
                let injected: Vec<(u64, sim::Call)> =
                    log.injected.iter().map(|&(at, call, _)| (at, call)).collect();
                results.push((result.is_ok(), state_of(f), log.calls, log.per_call, injected));
            }
            proptest::prop_assert_eq!(&results[0], &results[1], "after {:?}", op);
        }
    }
}

#[test]
fn one_runner_alternating_two_streams_repeats_across_after_its_first_wait() {
    let sim = sim::Device::new();
    let p = plan(1);
    let mut f = fence(&sim, &p);
    let (a, b) = (sim.new_stream(), sim.new_stream());
    let id = |s: &sim::Stream| sim.stream_id(s);
    replay(&mut f, &sim, &p, 0, &a);
    assert!(matches!(f.repeats(0, id(&a)), Some(Again::OnItsStream)));
    // Pending on `a`: the first replay on `b` records it there, waits, and
    // records at once from then on.
    assert!(f.repeats(0, id(&b)).is_none());
    replay(&mut f, &sim, &p, 0, &b);
    for k in 0..6 {
        let (s, other) = if k % 2 == 0 { (&a, &b) } else { (&b, &a) };
        assert!(matches!(f.repeats(0, id(s)), Some(Again::Across)));
        // Recorded on the other stream, not pending there.
        assert!(f.repeats(0, id(other)).is_none());
        replay(&mut f, &sim, &p, 0, s);
    }
    let st = f.stats();
    // Records: the deferred one on `a`, then one at once after each of the
    // seven replays that followed a wait.
    assert_eq!((st.replays, st.waits, st.event_records), (8, 7, 8));
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

    /// The dry fence's set-up keeps the set the plain sort and dedup
    /// keeps: its claims, few distinct or many, and its slots merged from
    /// two lists in order.
    #[test]
    fn the_dry_fences_claims_and_slots_are_the_sorted_distinct_sets(
        raw in proptest::collection::vec((0u32..3, 0u64..6, 0u64..3), 0..80),
        a in proptest::collection::btree_set(0usize..200, 0..60),
        b in proptest::collection::btree_set(0usize..200, 0..60),
        unsorted in proptest::collection::vec(0usize..50, 0..60),
    ) {
        let claims: Vec<Claim> = (raw.iter())
            .map(|&(region, lo, len)| Claim { region, lo, hi: lo + len + 1 })
            .collect();
        let mut expected = claims.clone();
        expected.sort_unstable_by_key(|c| (c.region, c.lo, c.hi));
        expected.dedup();
        let mut got = claims;
        distinct_claims(&mut got);
        proptest::prop_assert_eq!(got, expected);

        let (a, b): (Vec<usize>, Vec<usize>) = (a.into_iter().collect(), b.into_iter().collect());
        let union: Vec<usize> = a.iter().chain(&b).copied().collect::<std::collections::BTreeSet<_>>().into_iter().collect();
        proptest::prop_assert_eq!(merge(&a, &b), union);

        let mut sorted = unsorted.clone();
        sort_dedup(&mut sorted);
        let mut plain = unsorted;
        plain.sort_unstable();
        plain.dedup();
        proptest::prop_assert_eq!(sorted, plain);
    }
}
