//! Shape buckets on the `sim` model: several captured shapes in one plan,
//! their arenas shared (each key's arena the largest bucket's), runners of
//! different buckets sharing bytes and fenced by them, switching buckets
//! every step on several streams with consumers, race-free and equal to a
//! model; the typed errors for what crosses buckets.

use crate::support::record_and_finish;
use proptest::prelude::*;
use replay_arena::sim;
use replay_arena::{
    BucketId, DType, Discovering, DiscoveryError, Domain, HandoffId, PlacedPolicy, PlanConfig,
    Planned, Policy, ReplayError, Replayable, Request, RunnerId,
};

const STREAMS: usize = 3;

/// One runner of a bucket: its own f32 buffer of `mult` times the bucket's
/// scale, and maybe a bf16 buffer it does not touch (a second key).
#[derive(Clone, Debug)]
struct RunnerSpec {
    mult: u64,
    bf16: Option<u64>,
}

/// One shape bucket: its scale (elements of its handoffs, a unit of its
/// runners' buffers), its runners, and whether they hand off in a chain.
#[derive(Clone, Debug)]
struct BucketSpec {
    scale: u64,
    runners: Vec<RunnerSpec>,
    chain: bool,
}

fn own(b: &BucketSpec, r: &RunnerSpec) -> Request {
    Request::new(Domain::Device, DType::F32, b.scale * r.mult)
}

fn grad(b: &BucketSpec) -> Request {
    Request::new(Domain::Device, DType::F32, b.scale)
}

fn id(b: usize, k: usize) -> RunnerId {
    RunnerId((b * 10 + k) as u32)
}

/// Per bucket, per runner: the handoffs it receives and hands off.
type Chains = Vec<Vec<(Option<HandoffId>, Option<HandoffId>)>>;

/// Discovery of `buckets` (only bucket `only`, alone, when given): per
/// bucket its runners in order, the chain's handoffs between neighbours.
/// Returns each runner's (input, output) handoffs.
fn discover(buckets: &[BucketSpec], only: Option<usize>) -> (Discovering, Chains) {
    let mut d = Discovering::new(PlanConfig::new());
    let mut io = vec![Vec::new(); buckets.len()];
    for (b, spec) in buckets.iter().enumerate() {
        if only.is_some_and(|o| o != b) {
            continue;
        }
        d.bucket(format!("b{b}")).unwrap();
        let mut last: Option<HandoffId> = None;
        for (k, r) in spec.runners.iter().enumerate() {
            let mut armed = d.arm(id(b, k)).unwrap();
            armed.record(own(spec, r)).unwrap();
            if let Some(n) = r.bf16 {
                armed
                    .record(Request::new(Domain::Device, DType::BF16, n))
                    .unwrap();
            }
            let input = last.take();
            if let Some(h) = input {
                armed.receive(h).unwrap();
            }
            let output = (spec.chain && k + 1 < spec.runners.len())
                .then(|| armed.hand_off(grad(spec)).unwrap());
            last = output;
            io[b].push((input, output));
        }
    }
    (d, io)
}

/// The plan captured: runner `r` fills its own view with `c_r`, adds the
/// gradient it receives, copies its own view into the one it hands off,
/// then a slow no-op on its own view; so its own view holds the prefix sum
/// of its bucket's `c`s (where the gradient reaches) after each replay.
struct Rig {
    sim: sim::Device,
    replayable: Replayable<sim::Device>,
    streams: Vec<sim::Stream>,
    /// Per runner slot: its sink (consumers add its own view into it).
    sinks: Vec<sim::HostBuffer>,
    /// Per runner slot: the sink of consumers of two runners (two
    /// consumers of one replay run unordered: each writes its own sink).
    pair_sinks: Vec<sim::HostBuffer>,
    /// Per runner slot: what its own view holds after a replay.
    values: Vec<Vec<f32>>,
    /// Per bucket: its runners' slots.
    slots: Vec<Vec<usize>>,
}

fn c(b: usize, k: usize) -> f32 {
    (b * 10 + k + 1) as f32
}

fn rig(buckets: &[BucketSpec], policy: PlacedPolicy, tail: u64) -> Rig {
    let (d, io) = discover(buckets, None);
    let planned = d.plan(policy).unwrap();
    let sim = sim::Device::new();
    let streams: Vec<sim::Stream> = (0..STREAMS).map(|_| sim.new_stream()).collect();
    let mut capturing = planned.allocate(sim.clone()).unwrap();
    let mut sinks = Vec::new();
    let mut pair_sinks = Vec::new();
    let mut values = Vec::new();
    let mut slots = vec![Vec::new(); buckets.len()];
    for (b, spec) in buckets.iter().enumerate() {
        let mut prefix: Vec<f32> = Vec::new();
        for (k, r) in spec.runners.iter().enumerate() {
            let req = own(spec, r);
            let len = req.elements as usize;
            let mut value = vec![c(b, k); len];
            for (v, p) in value.iter_mut().zip(&prefix) {
                *v += p;
            }
            slots[b].push(values.len());
            sinks.push(sim.alloc_f32(len).unwrap());
            pair_sinks.push(sim.alloc_f32(len).unwrap());
            let (input, output) = io[b][k];
            let cap = capturing.capture(id(b, k)).unwrap();
            let view = cap.take(req).unwrap();
            if let Some(n) = r.bf16 {
                cap.take(Request::new(Domain::Device, DType::BF16, n))
                    .unwrap();
            }
            let input = input.map(|h| cap.receive(h).unwrap());
            let output = output.map(|h| cap.hand_off(h).unwrap());
            let value_k = c(b, k);
            record_and_finish!(cap, &streams[0], |s| {
                sim.launch(s, sim::Kernel::fill(&view, value_k), 3)?;
                if let Some(input) = &input {
                    sim.launch(s, sim::Kernel::add(input, &view), 4)?;
                }
                if let Some(output) = &output {
                    sim.launch(s, sim::Kernel::copy(&view, output), 2)?;
                }
                sim.launch(s, sim::Kernel::scale(&view, 1.0), tail)?;
                Ok::<(), replay_arena::Error>(())
            });
            prefix = value.clone();
            prefix.truncate(spec.scale as usize);
            if !spec.chain {
                prefix.clear();
            }
            values.push(value);
        }
    }
    Rig {
        replayable: capturing.seal().unwrap(),
        sim,
        streams,
        sinks,
        pair_sinks,
        values,
        slots,
    }
}

fn bucket_spec() -> impl Strategy<Value = BucketSpec> {
    (
        1u64..=8,
        prop::collection::vec(
            (1u64..=3, prop::option::weighted(0.3, 1u64..=64))
                .prop_map(|(mult, bf16)| RunnerSpec { mult, bf16 }),
            1..=3,
        ),
        any::<bool>(),
    )
        .prop_map(|(scale, runners, chain)| BucketSpec {
            scale: 16 * scale,
            runners,
            chain,
        })
}

/// One step of a schedule: which bucket, per runner the stream of its
/// replay and maybe of a consumer right after it, and maybe a consumer of
/// the last two runners together.
#[derive(Clone, Debug)]
struct Step {
    bucket: usize,
    lanes: Vec<(usize, Option<usize>)>,
    pair: Option<usize>,
}

fn step(buckets: usize) -> impl Strategy<Value = Step> {
    (
        0..buckets,
        prop::collection::vec((0..STREAMS, prop::option::of(0..STREAMS)), 3),
        prop::option::of(0..STREAMS),
    )
        .prop_map(|(bucket, lanes, pair)| Step {
            bucket,
            lanes,
            pair,
        })
}

/// Per key and generation, the bytes of each arena of `p`.
fn arena_bytes(p: &Planned) -> std::collections::BTreeMap<(replay_arena::Key, Option<usize>), u64> {
    p.arenas()
        .iter()
        .map(|a| ((a.key, a.generation), a.bytes))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Every arena of the shared plan is the largest of the buckets'
    /// separate plans' arenas of its key (and generation): the plan is at
    /// least the largest bucket's, at most the sum; the report says so.
    #[test]
    fn shared_arenas_are_the_largest_buckets_not_the_sum(
        buckets in prop::collection::vec(bucket_spec(), 2..=4),
        g in 1usize..=3,
        packed in any::<bool>(),
    ) {
        let policy = if packed { Policy::Generations(g).packed() } else { Policy::Generations(g).round_robin() };
        let shared = discover(&buckets, None).0.plan(policy).unwrap();
        let alone: Vec<Planned> = (0..buckets.len())
            .map(|b| discover(&buckets, Some(b)).0.plan(policy).unwrap())
            .collect();
        let mut largest = std::collections::BTreeMap::new();
        for p in &alone {
            for (k, bytes) in arena_bytes(p) {
                let e = largest.entry(k).or_insert(0u64);
                *e = (*e).max(bytes);
            }
        }
        prop_assert_eq!(arena_bytes(&shared), largest);
        let sum: u64 = alone.iter().map(Planned::total_bytes).sum();
        let max = alone.iter().map(Planned::total_bytes).max().unwrap();
        prop_assert!(max <= shared.total_bytes() && shared.total_bytes() <= sum);
        prop_assert_eq!(shared.separate_bytes(), sum);
        for (b, p) in alone.iter().enumerate() {
            prop_assert_eq!(shared.bucket_bytes(BucketId(b as u32)), Some(p.total_bytes()));
            let ids: Vec<RunnerId> = shared.runners_in(BucketId(b as u32)).collect();
            prop_assert_eq!(ids, p.runners().collect::<Vec<_>>());
        }
        let report = shared.report();
        prop_assert_eq!(report.buckets.len(), buckets.len());
        prop_assert_eq!(report.separate_bytes, sum);
        // The lower bound: per key the largest of the buckets' bounds.
        for k in &report.keys {
            let bound = alone
                .iter()
                .flat_map(|p| p.report().keys)
                .filter(|a| a.key == k.key)
                .map(|a| a.lower_bound)
                .max()
                .unwrap_or(0);
            prop_assert_eq!(k.lower_bound, bound);
            prop_assert!(k.plan_bytes >= k.lower_bound);
            // Packed is never above round-robin, shared as alone.
            prop_assert!(k.lower_bound <= k.packed_bytes && k.packed_bytes <= k.round_robin_bytes, "{:?}", k);
        }
        prop_assert!(report.to_string().contains("buckets: "));
    }

    /// Random bucket sequences, switching every step, replays and
    /// consumers on several streams: race-free (runners of different
    /// buckets share bytes, and the fence orders them by those bytes), and
    /// every consumer read what a model of the graphs says.
    #[test]
    fn switching_buckets_every_step_is_race_free_and_equal_to_a_model(
        buckets in prop::collection::vec(bucket_spec(), 2..=4),
        g in 1usize..=3,
        packed in any::<bool>(),
        tail in 0u64..30,
        steps in prop::collection::vec(step(4), 2..10),
    ) {
        let policy = if packed { Policy::Generations(g).packed() } else { Policy::Generations(g).round_robin() };
        let mut rig = rig(&buckets, policy, tail);
        let mut counts = vec![0f32; rig.values.len()];
        let mut pairs = vec![0f32; rig.values.len()];
        for st in &steps {
            let b = st.bucket % buckets.len();
            let n = buckets[b].runners.len();
            for k in 0..n {
                let (on, consumer) = st.lanes[k % st.lanes.len()];
                rig.replayable.replay(id(b, k), &rig.streams[on]).unwrap();
                if let Some(side) = consumer {
                    let slot = rig.slots[b][k];
                    let (sim, sink) = (&rig.sim, &rig.sinks[slot]);
                    rig.replayable
                        .consume(id(b, k), &rig.streams[side], |s, v| {
                            sim.launch(s, sim::Kernel::add(&v[0], sink), 5)
                        })
                        .unwrap();
                    counts[slot] += 1.0;
                }
            }
            if let (Some(side), true) = (st.pair, n >= 2) {
                let pair = [id(b, n - 2), id(b, n - 1)];
                let slots = [rig.slots[b][n - 2], rig.slots[b][n - 1]];
                let (sim, sinks) = (&rig.sim, &rig.pair_sinks);
                let got = rig.replayable.consume_many(&pair, &rig.streams[side], |s, runners| {
                    for (views, &slot) in runners.iter().zip(&slots) {
                        sim.launch(s, sim::Kernel::add(&views[0], &sinks[slot]), 5)?;
                    }
                    Ok::<(), replay_arena::BackendError>(())
                });
                match got {
                    Ok(()) => {
                        prop_assert!(g >= 2, "one generation: the bytes were taken");
                        for &slot in &slots {
                            pairs[slot] += 1.0;
                        }
                    }
                    // One generation: the last runner took the bytes of
                    // the one before it.
                    Err(replay_arena::ConsumeError::Overwritten { .. }) => {
                        prop_assert_eq!(g, 1);
                    }
                    Err(e) => prop_assert!(false, "{e}"),
                }
            }
        }
        rig.replayable.synchronize().unwrap();
        prop_assert!(rig.sim.hazards().is_empty(), "{:?}", rig.sim.hazards());
        for (slot, value) in rig.values.iter().enumerate() {
            let want: Vec<f32> = value.iter().map(|v| v * counts[slot]).collect();
            prop_assert_eq!(rig.sim.read_f32(&rig.sinks[slot]).unwrap(), want, "slot {}", slot);
            let want: Vec<f32> = value.iter().map(|v| v * pairs[slot]).collect();
            prop_assert_eq!(rig.sim.read_f32(&rig.pair_sinks[slot]).unwrap(), want, "pair slot {}", slot);
        }
    }
}

fn two_buckets() -> Vec<BucketSpec> {
    let r = |mult| RunnerSpec { mult, bf16: None };
    vec![
        BucketSpec {
            scale: 16,
            runners: vec![r(1), r(2)],
            chain: true,
        },
        BucketSpec {
            scale: 64,
            runners: vec![r(3), r(1), r(2)],
            chain: true,
        },
    ]
}

#[test]
fn runners_of_different_buckets_share_bytes_and_the_fence_orders_them() {
    let buckets = two_buckets();
    let planned = discover(&buckets, None)
        .0
        .plan(Policy::Generations(1))
        .unwrap();
    // Both buckets' runners start at offset 0 of the one f32 arena.
    let a = planned.extents_of(id(0, 0)).unwrap()[0];
    let b = planned.extents_of(id(1, 0)).unwrap()[0];
    assert_eq!((a.arena, a.offset), (b.arena, b.offset));
    let mut rig = rig(&buckets, Policy::Generations(1).into(), 50);
    // Bucket 0's runner, then bucket 1's on another stream: it overwrites
    // those bytes, so the consumer of bucket 0's runner is too late, and
    // nothing raced.
    rig.replayable.replay(id(0, 0), &rig.streams[0]).unwrap();
    rig.replayable.replay(id(1, 0), &rig.streams[1]).unwrap();
    let late = rig
        .replayable
        .consume(id(0, 0), &rig.streams[2], |_, _| Ok::<(), String>(()));
    assert!(matches!(
        late,
        Err(replay_arena::ConsumeError::Overwritten { by, .. }) if by == id(1, 0)
    ));
    rig.replayable.synchronize().unwrap();
    assert!(rig.sim.hazards().is_empty(), "{:?}", rig.sim.hazards());
}

#[test]
fn a_consumer_across_buckets_is_a_typed_error_and_enqueues_nothing() {
    let buckets = two_buckets();
    let mut rig = rig(&buckets, Policy::Generations(2).packed(), 5);
    rig.replayable.replay(id(0, 0), &rig.streams[0]).unwrap();
    rig.replayable.replay(id(1, 0), &rig.streams[0]).unwrap();
    let mut ran = false;
    let got = rig
        .replayable
        .consume_many(&[id(0, 0), id(1, 0)], &rig.streams[1], |_, _| {
            ran = true;
            Ok::<(), String>(())
        });
    assert!(!ran);
    match got {
        Err(replay_arena::ConsumeError::CrossBucket {
            runner,
            bucket,
            other,
            other_bucket,
        }) => {
            assert_eq!((runner, bucket), (id(0, 0), BucketId(0)));
            assert_eq!((other, other_bucket), (id(1, 0), BucketId(1)));
        }
        other => panic!("{other:?}"),
    }
    // The same in a step schedule.
    let mut step = rig.replayable.step();
    let got = step.consume_many(&[id(1, 1), id(0, 1)], &rig.streams[1], |_, _| {
        Ok::<(), String>(())
    });
    assert!(matches!(
        got.map(|_| ()),
        Err(replay_arena::ConsumeError::CrossBucket { .. })
    ));
}

#[test]
fn what_crosses_buckets_at_discovery_is_a_typed_error() {
    let q = Request::new(Domain::Device, DType::F32, 64);
    let mut d = Discovering::new(PlanConfig::new());
    let small = d.bucket("bs=1").unwrap();
    let h = {
        let mut armed = d.arm(RunnerId(0)).unwrap();
        armed.record(q).unwrap();
        armed.hand_off(q).unwrap()
    };
    let large = d.bucket("bs=8").unwrap();
    assert_eq!((small, large), (BucketId(0), BucketId(1)));
    // A handoff from bucket 0 read in bucket 1.
    let err = d.arm(RunnerId(1)).unwrap().receive(h).unwrap_err();
    assert_eq!(
        err,
        DiscoveryError::CrossBucketHandoff {
            runner: RunnerId(1),
            bucket: large,
            handoff: h,
            writer: RunnerId(0),
            writer_bucket: small,
        }
    );
    assert!(err.to_string().contains("handoffs stay within one bucket"));
    // A runner in two buckets.
    assert_eq!(
        d.arm_in(small, RunnerId(1)).unwrap_err(),
        DiscoveryError::RunnerInTwoBuckets {
            runner: RunnerId(1),
            first: large,
            second: small,
        }
    );
    assert_eq!(
        d.arm_in(large, RunnerId(1)).unwrap_err(),
        DiscoveryError::RunnerArmedTwice {
            runner: RunnerId(1)
        }
    );
    // A bucket never declared, a name declared twice.
    assert!(matches!(
        d.arm_in(BucketId(7), RunnerId(2)),
        Err(DiscoveryError::UnknownBucket {
            bucket: BucketId(7),
            declared: 2,
            ..
        })
    ));
    assert_eq!(
        d.bucket("bs=1").unwrap_err(),
        DiscoveryError::BucketNamedTwice {
            name: "bs=1".into(),
            first: small
        }
    );
    // Arming into an earlier bucket by id works.
    d.arm_in(small, RunnerId(2)).unwrap().receive(h).unwrap();
    assert_eq!(d.bucket_of(RunnerId(2)), Some(small));
    let names: Vec<(BucketId, String)> = d.buckets().map(|(b, n)| (b, n.to_string())).collect();
    assert_eq!(
        names,
        [(small, "bs=1".to_string()), (large, "bs=8".to_string())]
    );
}

#[test]
fn runners_armed_before_the_first_bucket_are_in_the_default_bucket() {
    let q = Request::new(Domain::Device, DType::F32, 64);
    let mut d = Discovering::new(PlanConfig::new());
    d.arm(RunnerId(0)).unwrap().record(q).unwrap();
    let b = d.bucket("bs=2").unwrap();
    d.arm(RunnerId(1)).unwrap().record(q).unwrap();
    assert_eq!(b, BucketId(1));
    assert_eq!(d.bucket_of(RunnerId(0)), Some(BucketId(0)));
    let planned = d.plan(Policy::Generations(1)).unwrap();
    let names: Vec<&str> = planned.buckets().map(|(_, n)| n).collect();
    assert_eq!(names, ["default", "bs=2"]);
    assert_eq!(planned.total_bytes(), 256);
    assert_eq!(planned.separate_bytes(), 512);
    // A plan without buckets has one, and the same fingerprint as before.
    let mut one = Discovering::new(PlanConfig::new());
    one.arm(RunnerId(0)).unwrap().record(q).unwrap();
    let one = one.plan(Policy::Generations(1)).unwrap();
    assert_eq!(one.buckets().count(), 1);
    assert!(one.report().buckets.is_empty());
}

#[test]
fn forgetting_a_bucket_step_graph_leaves_the_fence_sound() {
    let buckets = two_buckets();
    let mut rig = rig(&buckets, Policy::Generations(2).round_robin(), 20);
    for round in 0..3 {
        for b in 0..2 {
            let n = buckets[b].runners.len();
            let mut step = rig.replayable.step();
            for k in 0..n {
                step.replay(id(b, k), &rig.streams[k % 2]).unwrap();
            }
            let mut graph = step.build().unwrap();
            graph.launch(&rig.streams[2]).unwrap();
            if round % 2 == 0 {
                std::mem::forget(graph);
            } else {
                drop(graph);
            }
            // The other bucket per runner, on other streams, right after.
            let o = 1 - b;
            for k in 0..buckets[o].runners.len() {
                rig.replayable
                    .replay(id(o, k), &rig.streams[(k + 1) % 3])
                    .unwrap();
            }
        }
    }
    rig.replayable.synchronize().unwrap();
    assert!(rig.sim.hazards().is_empty(), "{:?}", rig.sim.hazards());
}

/// Two buckets of one runner each, with inputs the program stages: the
/// runner's graph copies its input (`ids`) into its output, doubled, and
/// consumers add the output into the bucket's sink. The buckets' runners
/// share bytes (both at the start of the one f32 arena).
struct Staged {
    sim: sim::Device,
    replayable: Replayable<sim::Device>,
    streams: Vec<sim::Stream>,
    sinks: Vec<sim::HostBuffer>,
    lens: Vec<usize>,
}

fn staged_rig(lens: &[usize], tail: u64) -> Staged {
    let ids = |n: usize| {
        Request::new(Domain::Device, DType::F32, n as u64).purpose(replay_arena::Purpose::Input)
    };
    let out = |n: usize| Request::new(Domain::Device, DType::F32, n as u64);
    let mut d = Discovering::new(PlanConfig::new());
    for (b, &n) in lens.iter().enumerate() {
        d.bucket(format!("b{b} len={n}")).unwrap();
        let mut armed = d.arm(id(b, 0)).unwrap();
        armed.record(ids(n)).unwrap();
        armed.record(out(n)).unwrap();
    }
    let planned = d.plan(Policy::Generations(1)).unwrap();
    let sim = sim::Device::new();
    let streams: Vec<sim::Stream> = (0..STREAMS).map(|_| sim.new_stream()).collect();
    let mut capturing = planned.allocate(sim.clone()).unwrap();
    let mut sinks = Vec::new();
    for (b, &n) in lens.iter().enumerate() {
        sinks.push(sim.alloc_f32(n).unwrap());
        let cap = capturing.capture(id(b, 0)).unwrap();
        let input = cap.take(ids(n)).unwrap();
        let output = cap.take(out(n)).unwrap();
        record_and_finish!(cap, &streams[0], |s| {
            sim.launch(s, sim::Kernel::copy(&input, &output), tail)?;
            sim.launch(s, sim::Kernel::scale(&output, 2.0), 2)
        });
    }
    Staged {
        replayable: capturing.seal().unwrap(),
        sim,
        streams,
        sinks,
        lens: lens.to_vec(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Switching buckets every step, each step staging the bucket's input
    /// (before its runner's first replay too) on one stream, replaying on
    /// another, consuming on a third: race-free, and each consumer saw the
    /// input staged for its step.
    #[test]
    fn staged_inputs_are_fenced_across_buckets_and_equal_to_a_model(
        lens in prop::collection::vec(1usize..=4, 2..=3),
        tail in 0u64..30,
        steps in prop::collection::vec((0usize..3, 0..STREAMS, 0..STREAMS, 0..STREAMS, any::<bool>()), 1..12),
        in_steps in any::<bool>(),
    ) {
        let lens: Vec<usize> = lens.iter().map(|l| 16 * l).collect();
        let mut rig = staged_rig(&lens, tail);
        let mut want: Vec<f32> = vec![0.0; lens.len()];
        for (i, &(b, stage_on, replay_on, consume_on, consume)) in steps.iter().enumerate() {
            let b = b % lens.len();
            let value = (i + 1) as f32;
            let r = id(b, 0);
            let (sim, sink) = (&rig.sim, &rig.sinks[b]);
            let [stage_s, replay_s, consume_s] = [stage_on, replay_on, consume_on].map(|s| &rig.streams[s]);
            let stage = |s: &sim::Stream, v: &[replay_arena::View<'_>]| {
                sim.launch(s, sim::Kernel::fill(&v[0], value), 3)
            };
            let read = |s: &sim::Stream, v: &[replay_arena::View<'_, _>]| {
                sim.launch(s, sim::Kernel::add(&v[1], sink), 4)
            };
            if in_steps && i % 2 == 1 {
                // The same schedule as a step graph, launched once.
                let mut step = rig.replayable.step();
                step.consume_mut(r, stage_s, stage).unwrap();
                step.replay(r, replay_s).unwrap();
                if consume {
                    step.consume(r, consume_s, read).unwrap();
                }
                let mut graph = step.build().unwrap();
                graph.launch(&rig.streams[0]).unwrap();
            } else {
                rig.replayable.consume_mut(r, stage_s, stage).unwrap();
                rig.replayable.replay(r, replay_s).unwrap();
                if consume {
                    rig.replayable.consume(r, consume_s, read).unwrap();
                }
            }
            if consume {
                want[b] += 2.0 * value;
            }
        }
        rig.replayable.synchronize().unwrap();
        prop_assert!(rig.sim.hazards().is_empty(), "{:?}", rig.sim.hazards());
        for (b, &n) in rig.lens.iter().enumerate() {
            prop_assert_eq!(rig.sim.read_f32(&rig.sinks[b]).unwrap(), vec![want[b]; n], "bucket {}", b);
        }
    }
}

#[test]
fn a_staged_runner_replays_only_what_was_staged_for_it() {
    let mut st = staged_rig(&[16, 32], 5);
    let (a, b) = (id(0, 0), id(1, 0));
    let s = st.streams.clone();
    let fill = |sim: &sim::Device, v: f32| {
        let sim = sim.clone();
        move |st: &sim::Stream, views: &[replay_arena::View<'_>]| {
            sim.launch(st, sim::Kernel::fill(&views[0], v), 1)
        }
    };
    // Never staged.
    assert!(matches!(
        st.replayable.replay(a, &s[0]),
        Err(ReplayError::InputNotStaged { runner, by: None }) if runner == a
    ));
    // Staged before its first replay: allowed, and the replay follows.
    st.replayable
        .consume_mut(a, &s[1], fill(&st.sim, 1.0))
        .unwrap();
    st.replayable.replay(a, &s[0]).unwrap();
    // Replayed again on the same input: its bytes are still its own.
    st.replayable.replay(a, &s[2]).unwrap();
    // Bucket 1 stages and replays in the same bytes: bucket 0's input is
    // gone, and its replay says who took it.
    st.replayable
        .consume_mut(b, &s[1], fill(&st.sim, 2.0))
        .unwrap();
    st.replayable.replay(b, &s[0]).unwrap();
    let err = st.replayable.replay(a, &s[0]).unwrap_err();
    assert_eq!(
        err,
        ReplayError::InputNotStaged {
            runner: a,
            by: Some(b)
        }
    );
    assert!(err.to_string().contains("stage them with consume_mut"));
    st.replayable.synchronize().unwrap();
    assert!(st.sim.hazards().is_empty(), "{:?}", st.sim.hazards());
    // A runner without staged inputs still may not be written before its
    // first replay.
    let mut plain = self::rig(&two_buckets(), Policy::Generations(1).into(), 1);
    let early = plain
        .replayable
        .consume_mut(id(0, 0), &plain.streams[1], |_, _| Ok::<(), String>(()));
    assert!(matches!(
        early,
        Err(replay_arena::ConsumeError::NotReplayed { runner }) if runner == id(0, 0)
    ));
}

#[test]
fn a_bucket_that_overflows_hands_the_discovery_back_and_names_its_key() {
    let q = |n| Request::new(Domain::Device, DType::F32, n);
    let mut d = Discovering::new(PlanConfig::new());
    d.bucket("small").unwrap();
    d.arm(RunnerId(0)).unwrap().record(q(64)).unwrap();
    d.bucket("huge").unwrap();
    for r in 1..4 {
        d.arm(RunnerId(r)).unwrap().record(q(u64::MAX / 8)).unwrap();
    }
    let before = d.clone();
    // Packed: one arena of the key, which the huge bucket's three runners
    // (all in flight together) overflow.
    let failed = d.plan(Policy::Generations(3).packed()).unwrap_err();
    assert!(matches!(
        failed.error(),
        replay_arena::PlanError::ArenaOverflow { users: 3, .. }
    ));
    assert_eq!(failed.into_discovering(), before);
}

#[test]
fn buckets_change_the_fingerprint_and_the_plan_of_one_bucket_is_unchanged() {
    let q = |n| Request::new(Domain::Device, DType::F32, n);
    let runners = || (0..4).map(|r| (RunnerId(r), [q(64 * u64::from(r + 1))]));
    let plain = Discovering::from_runners(PlanConfig::new(), runners()).unwrap();
    let mut named = Discovering::new(PlanConfig::new());
    named.bucket("only").unwrap();
    for (r, [req]) in runners() {
        named.arm(r).unwrap().record(req).unwrap();
    }
    let mut split = Discovering::new(PlanConfig::new());
    for (r, [req]) in runners() {
        if r.0 % 2 == 0 {
            split.bucket(format!("b{}", r.0)).unwrap();
        }
        split.arm(r).unwrap().record(req).unwrap();
    }
    let policy = Policy::Generations(2);
    let (plain, named, split) = (
        plain.plan(policy).unwrap(),
        named.plan(policy).unwrap(),
        split.plan(policy).unwrap(),
    );
    // One declared bucket plans as no bucket, with its name.
    assert_eq!(plain.fingerprint(), named.fingerprint());
    assert_eq!(named.buckets().next().map(|(_, n)| n), Some("only"));
    // Two buckets of two runners: another layout, another fingerprint.
    assert_ne!(plain.fingerprint(), split.fingerprint());
    assert_eq!(split.separate_bytes(), 256 + 512 + 768 + 1024);
    assert_eq!(split.total_bytes(), 768 + 1024);
}
