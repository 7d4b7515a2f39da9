//! Planner invariants, for random workloads, policies and placements.

use crate::support;
use crate::support::old_packed;
use crate::support::record_and_finish;
use crate::support::steps::allocate_discovered;

use std::collections::BTreeMap;

use proptest::prelude::*;
use replay_arena::sim;
use replay_arena::{
    DType, Discovering, Domain, HandoffId, Key, PlacedPolicy, Placement, PlanConfig, Planned,
    Policy, ReplayError, Request, RunnerId,
};
use support::{aligned, discover, request, workload, Workload};

fn strategy() -> impl proptest::strategy::Strategy<Value = PlacedPolicy> {
    (1usize..5, any::<bool>()).prop_map(|(g, packed)| {
        let p = Policy::Generations(g);
        if packed {
            p.packed()
        } else {
            p.into()
        }
    })
}

/// Buffer-using runners in capture order.
fn using(w: &Workload) -> Vec<usize> {
    (0..w.len()).filter(|&r| !w[r].is_empty()).collect()
}

fn capacity(requests: &[replay_arena::Request]) -> BTreeMap<Key, u64> {
    let mut c = BTreeMap::new();
    for q in requests {
        *c.entry(q.key()).or_insert(0) += aligned(q);
    }
    c
}

fn plan(w: &Workload, s: PlacedPolicy) -> Planned {
    discover(w).plan(s).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn capacity_is_the_sum_of_aligned_requests(w in workload(12), s in strategy()) {
        let p = plan(&w, s);
        for (r, requests) in w.iter().enumerate() {
            let slices = p.extents_of(RunnerId(r as u32)).unwrap();
            let expected = capacity(requests);
            prop_assert_eq!(slices.len(), expected.len());
            for sl in slices {
                prop_assert_eq!(Some(&sl.bytes), expected.get(&sl.key));
                prop_assert_eq!(sl.bytes % sl.key.domain.alignment(), 0);
                prop_assert_eq!(sl.offset % sl.key.domain.alignment(), 0);
                prop_assert!(sl.offset + sl.bytes <= p.arenas()[sl.arena].bytes);
            }
        }
    }

    #[test]
    fn only_buffer_using_runners_get_generations_round_robin(w in workload(12), g in 1usize..5) {
        let p = plan(&w, Policy::Generations(g).into());
        let users = using(&w);
        prop_assert_eq!(p.generations(), g.min(users.len()).max(1));
        for (r, requests) in w.iter().enumerate() {
            let gen = p.generation_of(RunnerId(r as u32));
            match users.iter().position(|&u| u == r) {
                Some(k) => prop_assert_eq!(gen, Some(k % p.generations())),
                None => { prop_assert!(requests.is_empty()); prop_assert_eq!(gen, None); }
            }
        }
    }

    #[test]
    fn round_robin_arena_is_the_max_of_its_runners(w in workload(12), g in 1usize..5) {
        let p = plan(&w, Policy::Generations(g).into());
        for (i, arena) in p.arenas().iter().enumerate() {
            let max = w.iter().enumerate()
                .filter(|(r, _)| p.generation_of(RunnerId(*r as u32)) == arena.generation)
                .filter_map(|(_, q)| capacity(q).get(&arena.key).copied())
                .max();
            prop_assert_eq!(Some(arena.bytes), max, "arena {}", i);
        }
    }

    #[test]
    fn runners_in_flight_together_never_share_bytes(w in workload(14), s in strategy()) {
        let p = plan(&w, s);
        let users = using(&w);
        let g = p.generations();
        for a in 0..users.len() {
            for b in a + 1..users.len().min(a + g) {
                for x in p.extents_of(RunnerId(users[a] as u32)).unwrap() {
                    for y in p.extents_of(RunnerId(users[b] as u32)).unwrap() {
                        let disjoint = x.arena != y.arena
                            || x.offset + x.bytes <= y.offset
                            || y.offset + y.bytes <= x.offset;
                        prop_assert!(disjoint, "runners {} and {} overlap: {:?} {:?}", users[a], users[b], x, y);
                    }
                }
            }
        }
    }

    #[test]
    fn views_are_disjoint_aligned_and_inside_their_arena(w in workload(10), s in strategy()) {
        let p = plan(&w, s);
        let g = p.generations();
        let users = using(&w);
        let sim = sim::Device::new();
        let stream = sim.new_stream();
        let mut capturing = p.allocate(sim.clone()).unwrap();
        // (position among users, addr, aligned end)
        let mut views: Vec<(usize, u64, u64)> = Vec::new();
        for (r, requests) in w.iter().enumerate() {
            let cap = capturing.capture(RunnerId(r as u32)).unwrap();
            for q in requests {
                let v = cap.take(*q).unwrap();
                prop_assert_eq!(v.device_address() % q.domain.alignment(), 0);
                let pos = users.iter().position(|&u| u == r).unwrap();
                views.push((pos, v.device_address(), v.device_address() + aligned(q)));
            }
            record_and_finish!(cap, &stream, |_| Ok::<(), replay_arena::Error>(()));
        }
        for (i, a) in views.iter().enumerate() {
            for b in &views[i + 1..] {
                if a.0.abs_diff(b.0) < g {
                    prop_assert!(a.2 <= b.1 || b.2 <= a.1, "views {:?} and {:?} overlap", a, b);
                }
            }
        }
        drop(capturing);
        prop_assert_eq!(sim.live_allocations(), 0);
    }

    #[test]
    fn lower_bound_le_packed_le_round_robin(w in workload(16), g in 1usize..5) {
        let rr = plan(&w, Policy::Generations(g).into()).report();
        let packed = plan(&w, Policy::Generations(g).packed()).report();
        prop_assert_eq!(rr.lower_bound, packed.lower_bound);
        prop_assert_eq!(rr.plan_bytes, rr.round_robin_bytes);
        prop_assert_eq!(packed.plan_bytes, packed.packed_bytes);
        prop_assert!(packed.lower_bound <= packed.plan_bytes);
        prop_assert!(packed.plan_bytes <= rr.plan_bytes);
        for k in &packed.keys {
            prop_assert!(k.lower_bound <= k.packed_bytes && k.packed_bytes <= k.round_robin_bytes, "{:?}", k);
        }
    }

    /// With at most two generations, wgrad-only requests and no parameter
    /// used twice in one runner, the plan never needs more than the
    /// per-parameter ring of size 2 (which would be correct there too).
    #[test]
    fn plan_le_ring_when_the_ring_is_valid(w in workload(16), g in 1usize..3, packed in any::<bool>()) {
        let w: Workload = w.into_iter().map(|mut rs| {
            let mut seen = std::collections::HashSet::new();
            rs.retain(|q| seen.insert(q.param));
            rs
        }).collect();
        let policy = Policy::Generations(g);
        let report = plan(&w, if packed { policy.packed() } else { policy.round_robin() }).report();
        prop_assert!(report.lower_bound <= report.plan_bytes);
        prop_assert!(report.plan_bytes <= report.ring_bytes, "{}", report);
    }

    #[test]
    fn fingerprint_is_equal_for_equal_discovery(w in workload(12), s in strategy()) {
        prop_assert_eq!(plan(&w, s).fingerprint(), plan(&w.clone(), s).fingerprint());
    }

    #[test]
    fn fingerprint_changes_with_any_request(w in workload(12), s in strategy(), pick in any::<prop::sample::Index>(), grow in 1u64..5000) {
        let all: Vec<(usize, usize)> = w.iter().enumerate()
            .flat_map(|(r, qs)| (0..qs.len()).map(move |i| (r, i))).collect();
        prop_assume!(!all.is_empty());
        let (r, i) = all[pick.index(all.len())];
        let mut changed = w.clone();
        changed[r][i].elements += grow;
        prop_assert_ne!(plan(&w, s).fingerprint(), plan(&changed, s).fingerprint());
    }

    #[test]
    fn packed_placement_is_chosen_when_asked(w in workload(8), g in 1usize..4) {
        let p = plan(&w, Policy::Generations(g).packed());
        prop_assert_eq!(p.placed_policy().placement, Placement::Packed);
        let keys: std::collections::BTreeSet<Key> = w.iter().flatten().map(|q| q.key()).collect();
        prop_assert_eq!(p.arenas().len(), keys.len());
    }
}

/// What the old packed placement allocates for the plan's discovery: per
/// key, the capacities of the buffer-using runners in capture order.
fn old_packed_bytes(p: &Planned) -> u64 {
    let using: Vec<RunnerId> = p
        .runners()
        .filter(|&r| !p.extents_of(r).unwrap_or_default().is_empty())
        .collect();
    let mut columns: BTreeMap<Key, Vec<u64>> = BTreeMap::new();
    for (k, &r) in using.iter().enumerate() {
        for s in p.extents_of(r).unwrap_or_default() {
            columns.entry(s.key).or_insert_with(|| vec![0; using.len()])[k] = s.bytes;
        }
    }
    columns
        .values()
        .map(|cap| {
            old_packed::packed_column(&old_packed::Column::from_dense(cap), p.generations())
                .expect("no overflow")
                .bytes
        })
        .sum()
}

/// One device key; runner `k` needs `cap[k]` units of 256 bytes (none when
/// 0). Model-like columns repeat a short pattern, the others are random.
fn one_key(cap: &[u64]) -> Discovering {
    let runners = cap.iter().enumerate().map(|(k, &c)| {
        let requests = (c > 0).then(|| Request::new(Domain::Device, DType::BF16, 128 * c));
        (RunnerId(k as u32), requests.into_iter())
    });
    Discovering::from_runners(PlanConfig::new(), runners).unwrap()
}

fn capacities() -> impl proptest::strategy::Strategy<Value = Vec<u64>> {
    prop_oneof![
        // Random sizes, some runners without buffers.
        prop::collection::vec(prop_oneof![Just(0u64), 1u64..64], 1..160),
        // A repeating pattern (layers of a model graphed per module).
        (prop::collection::vec(1u64..64, 1..7), 1usize..40)
            .prop_map(|(pattern, repeats)| pattern.repeat(repeats)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// The placement made independent of `G` never allocates more than the
    /// old one (kept as an oracle in `support/old_packed.rs`), on random
    /// multi-key workloads and on long single-key columns with any `G` up to
    /// past the number of runners.
    #[test]
    fn packed_never_allocates_more_than_the_old_placement(w in workload(24), g in 1usize..9) {
        let p = plan(&w, Policy::Generations(g).packed());
        prop_assert!(p.total_bytes() <= old_packed_bytes(&p));
    }

    #[test]
    fn packed_never_allocates_more_than_the_old_placement_at_any_g(
        cap in capacities(),
        g in prop_oneof![1usize..8, 8usize..200],
    ) {
        let p = one_key(&cap).plan(Policy::Generations(g).packed()).unwrap();
        let old = old_packed_bytes(&p);
        prop_assert!(p.total_bytes() <= old, "new {} old {} g {}", p.total_bytes(), old, p.generations());
        let report = p.report();
        prop_assert!(report.lower_bound <= report.plan_bytes);
        prop_assert!(report.plan_bytes <= report.round_robin_bytes);
    }
}

#[test]
fn policies_resolve_to_generation_counts() {
    assert_eq!(Policy::ModuleKinds(0).requested(), Ok(1));
    assert_eq!(Policy::ModuleKinds(1).requested(), Ok(1));
    assert_eq!(Policy::ModuleKinds(5).requested(), Ok(2));
    assert_eq!(Policy::OverlapDepth(3).requested(), Ok(3));
    assert_eq!(Policy::Generations(4).requested(), Ok(4));
    assert!(Policy::Generations(0).requested().is_err());
    assert!(Policy::OverlapDepth(0).requested().is_err());
}

/// Handoffs of a workload: (writer, readers, request), readers after the
/// writer.
type Handoffs = Vec<(usize, Vec<usize>, Request)>;

/// A random workload with random handoffs (each read by one to three later
/// runners, up to four ahead; any key, so they share arenas with runner
/// bytes or have a key of their own).
fn workload_with_handoffs(
    max_runners: usize,
) -> impl proptest::strategy::Strategy<Value = (Workload, Handoffs)> {
    workload(max_runners).prop_flat_map(|w| {
        let handoffs = handoffs_among(w.len(), 1..5, 1..4, 0..8, request());
        (Just(w), handoffs)
    })
}

/// `count` random handoffs among `n` runners, each of a `value`: a writer
/// and `readers` distinct later runners, each `ahead` of it (a handoff
/// whose readers are all past the last runner is left out).
fn handoffs_among<T: std::fmt::Debug + Clone>(
    n: usize,
    ahead: std::ops::Range<usize>,
    readers: std::ops::Range<usize>,
    count: std::ops::Range<usize>,
    value: impl Strategy<Value = T>,
) -> impl Strategy<Value = Vec<(usize, Vec<usize>, T)>> {
    let handoff = (0..n, prop::collection::vec(ahead, readers), value);
    prop::collection::vec(handoff, count).prop_map(move |raw| {
        raw.into_iter()
            .filter_map(|(writer, ahead, value)| {
                let mut readers: Vec<usize> = ahead
                    .iter()
                    .map(|a| writer + a)
                    .filter(|&r| r < n)
                    .collect();
                readers.sort_unstable();
                readers.dedup();
                (!readers.is_empty()).then_some((writer, readers, value))
            })
            .collect()
    })
}

/// Discovery of `w` with its handoffs: each runner records its requests,
/// receives, then hands off. The ids, in `hs` order.
fn discover_with(w: &Workload, hs: &Handoffs) -> (Discovering, Vec<HandoffId>) {
    let mut d = Discovering::new(support::config());
    let mut ids: Vec<Option<HandoffId>> = vec![None; hs.len()];
    for (r, requests) in w.iter().enumerate() {
        let mut armed = d.arm(RunnerId(r as u32)).unwrap();
        for &q in requests {
            armed.record(q).unwrap();
        }
        for (i, (_, readers, _)) in hs.iter().enumerate() {
            if readers.contains(&r) {
                armed.receive(ids[i].unwrap()).unwrap();
            }
        }
        for (i, &(writer, _, q)) in hs.iter().enumerate() {
            if writer == r {
                ids[i] = Some(armed.hand_off(q).unwrap());
            }
        }
    }
    (d, ids.into_iter().map(Option::unwrap).collect())
}

/// Each buffer of a plan: (key, arena, offset, bytes, first slot, last
/// slot) of the capture-order stretch over which it must not share bytes:
/// a runner's bytes from its slot to just before the `G`-th buffer-using
/// runner after it (the last `G` to the end), a handoff from its writer
/// to its last reader and `G - 1` runners more.
fn lifetimes(p: &Planned) -> Vec<(Key, usize, u64, u64, usize, usize)> {
    let g = p.generations();
    let slots: Vec<RunnerId> = p.runners().collect();
    let slot_of = |r: RunnerId| slots.iter().position(|&x| x == r).unwrap();
    let using: Vec<usize> = (0..slots.len())
        .filter(|&i| !p.extents_of(slots[i]).unwrap().is_empty())
        .collect();
    let mut out = Vec::new();
    for (k, &slot) in using.iter().enumerate() {
        let end = using.get(k + g).map_or(usize::MAX, |&s| s - 1);
        for s in p.extents_of(slots[slot]).unwrap() {
            out.push((s.key, s.arena, s.offset, s.bytes, slot, end));
        }
    }
    for h in p.handoffs() {
        let last = h.readers.iter().map(|&r| slot_of(r)).max().unwrap();
        let bytes = h.request.aligned_bytes().unwrap();
        out.push((
            h.request.key(),
            h.arena,
            h.offset,
            bytes,
            slot_of(h.writer),
            last + g - 1,
        ));
    }
    out
}

/// What the separate placement of handoffs needed on top of the runners'
/// plan: per key, first fit over the handoffs' lifetimes in order of
/// start.
fn separate_handoff_bytes(p: &Planned) -> u64 {
    let mut by_key: BTreeMap<Key, Vec<(usize, usize, u64)>> = BTreeMap::new();
    let all = lifetimes(p);
    let handoffs = &all[all.len() - p.handoffs().count()..];
    for &(key, _, _, bytes, start, end) in handoffs {
        by_key.entry(key).or_default().push((start, end, bytes));
    }
    by_key
        .values_mut()
        .map(|items| {
            items.sort_by_key(|&(s, _, _)| s);
            let mut placed: Vec<(u64, u64, usize)> = Vec::new();
            let mut top = 0;
            for &(start, end, bytes) in items.iter() {
                placed.retain(|&(_, _, e)| e >= start);
                placed.sort_unstable();
                let mut at = 0;
                for &(lo, hi, _) in &placed {
                    if at + bytes <= lo {
                        break;
                    }
                    at = at.max(hi);
                }
                placed.push((at, at + bytes, end));
                top = top.max(at + bytes);
            }
            top
        })
        .sum()
}

/// [`discover_with`], planned under `policy`.
fn plan_with(w: &Workload, hs: &Handoffs, policy: PlacedPolicy) -> Planned {
    discover_with(w, hs).0.plan(policy).unwrap()
}

/// The same workload with every request and handoff in device f32.
fn in_one_key(w: Workload, hs: Handoffs) -> (Workload, Handoffs) {
    let f32 = |q: Request| Request::new(Domain::Device, DType::F32, q.elements);
    let w = w
        .into_iter()
        .map(|rs| rs.into_iter().map(f32).collect())
        .collect();
    let hs = hs.into_iter().map(|(w, r, q)| (w, r, f32(q))).collect();
    (w, hs)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Runner bytes and handoffs share arenas: the plan never needs more
    /// than the runners' plan with each key's handoffs placed apart on top.
    #[test]
    fn handoffs_beside_runner_bytes_never_need_more_than_the_separate_placement(
        (w, hs) in workload_with_handoffs(14),
        s in strategy(),
    ) {
        let p = plan_with(&w, &hs, s);
        let runners_alone = plan(&w, s).total_bytes();
        prop_assert!(
            p.total_bytes() <= runners_alone + separate_handoff_bytes(&p),
            "{} > {} + {}", p.total_bytes(), runners_alone, separate_handoff_bytes(&p)
        );
        let report = p.report();
        prop_assert!(report.lower_bound <= report.best_bound);
        prop_assert!(report.best_bound <= report.packed_bytes);
    }

    /// Any runner's bytes and any handoff whose lifetimes meet (they may
    /// be in flight together) lie in different arenas or disjoint bytes,
    /// inside their arena.
    #[test]
    fn buffers_in_flight_together_never_share_bytes_handoffs_included(
        (w, hs) in workload_with_handoffs(14),
        s in strategy(),
    ) {
        let p = plan_with(&w, &hs, s);
        let all = lifetimes(&p);
        for (i, a) in all.iter().enumerate() {
            prop_assert!(a.2 + a.3 <= p.arenas()[a.1].bytes, "{:?} ends past its arena", a);
            prop_assert_eq!(p.arenas()[a.1].key, a.0);
            for b in &all[..i] {
                let meet = a.4 <= b.5 && b.4 <= a.5;
                let apart = a.1 != b.1 || a.2 + a.3 <= b.2 || b.2 + b.3 <= a.2;
                prop_assert!(!meet || apart, "{:?} and {:?} overlap", a, b);
            }
        }
    }

    #[test]
    fn packed_with_handoffs_is_never_worse_than_round_robin(
        (w, hs) in workload_with_handoffs(16),
        g in 1usize..5,
    ) {
        let (d, _) = discover_with(&w, &hs);
        let rr = d.clone().plan(Policy::Generations(g)).unwrap();
        let packed = d.plan(Policy::Generations(g).packed()).unwrap();
        prop_assert!(packed.total_bytes() <= rr.total_bytes());
        let (a, b) = (rr.report(), packed.report());
        prop_assert_eq!(a.packed_bytes, b.plan_bytes);
        prop_assert_eq!(b.round_robin_bytes, a.plan_bytes);
        prop_assert_eq!(a.lower_bound, b.lower_bound);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// On `sim`, every runner's graph writes all its views and the
    /// handoffs it writes and reads the handoffs it receives; steps of
    /// random subsets of runners in capture order on random streams (a
    /// reader whose writer was skipped is refused with a typed error):
    /// the fence orders every two users of the same bytes.
    #[test]
    fn random_schedules_of_plans_with_handoffs_leave_no_hazard_on_sim(
        (w, hs) in workload_with_handoffs(14),
        s in strategy(),
        steps in prop::collection::vec(prop::collection::vec((0usize..3, any::<bool>()), 14), 1..5),
        one_key in any::<bool>(),
    ) {
        // Half the cases put every buffer in one key, so that handoffs and
        // runner bytes share arenas as often as they can.
        let (w, hs) = if one_key { in_one_key(w, hs) } else { (w, hs) };
        let (d, ids) = discover_with(&w, &hs);
        let sim = sim::Device::new();
        let streams = [sim.new_stream(), sim.new_stream(), sim.new_stream()];
        let mut graphed = vec![false; w.len()];
        let mut sinks = Vec::new();
        let mut capturing = allocate_discovered(&sim, d, s);
        for (r, requests) in w.iter().enumerate() {
            let reads: Vec<usize> = (0..hs.len()).filter(|&i| hs[i].1.contains(&r)).collect();
            let writes: Vec<usize> = (0..hs.len()).filter(|&i| hs[i].0 == r).collect();
            if requests.is_empty() && reads.is_empty() && writes.is_empty() {
                continue;
            }
            graphed[r] = true;
            let cap = capturing.capture(RunnerId(r as u32)).unwrap();
            let own: Vec<_> = requests.iter().map(|&q| cap.take(q).unwrap()).collect();
            // A program buffer of its own for each handoff it reads.
            let first = sinks.len();
            sinks.extend(reads.iter().map(|&i| sim.alloc_f32((aligned(&hs[i].2) / 4) as usize).unwrap()));
            let inputs: Vec<_> = reads
                .iter()
                .zip(&sinks[first..])
                .map(|(&i, sink)| (sink, cap.receive(ids[i]).unwrap()))
                .collect();
            let outputs: Vec<_> = writes.iter().map(|&i| cap.hand_off(ids[i]).unwrap()).collect();
            record_and_finish!(cap, &streams[r % 3], |st| {
                for (sink, input) in &inputs {
                    sim.launch(st, sim::Kernel::copy(input, *sink), 25)?;
                }
                for v in own.iter().chain(&outputs) {
                    sim.launch(st, sim::Kernel::fill(v, r as f32), 2)?;
                }
                Ok::<(), replay_arena::Error>(())
            });
        }
        let mut replayable = capturing.seal().unwrap();
        for step in &steps {
            for (r, &(stream, replay)) in step.iter().enumerate().take(w.len()) {
                if !replay || !graphed[r] {
                    continue;
                }
                match replayable.replay(RunnerId(r as u32), &streams[stream]) {
                    Ok(())
                    | Err(ReplayError::HandoffNotWritten { .. })
                    | Err(ReplayError::HandoffAlreadyRead { .. })
                    | Err(ReplayError::HandoffOverwritten { .. }) => {}
                    Err(e) => prop_assert!(false, "replay of runner {}: {}", r, e),
                }
            }
        }
        replayable.synchronize().unwrap();
        let hazards = sim.hazards();
        prop_assert!(hazards.is_empty(), "{:?}", hazards);
    }
}

/// Units per runner (0: none) and handoffs `(writer, readers, units)`.
type Tiny = (Vec<u64>, Vec<(usize, Vec<usize>, u64)>);

/// A small one-key workload: up to seven runners, each with a device f32
/// buffer of 1 to 6 units of 256 bytes or none, and up to three handoffs
/// of 1 to 4 units, each read by one or two of the next three runners.
fn tiny_workload() -> impl proptest::strategy::Strategy<Value = Tiny> {
    prop::collection::vec(prop_oneof![1 => Just(0u64), 4 => 1u64..7], 2..8).prop_flat_map(|cap| {
        let handoffs = handoffs_among(cap.len(), 1..4, 1..3, 0..4, 1u64..5);
        (Just(cap), handoffs)
    })
}

/// The least height, in units, of any layout of integer offsets of
/// `items` (`(units, first slot, last slot)`) in which buffers whose slots
/// meet are disjoint: every height from the most units live at one slot up
/// is tried, and for each every offset of every buffer, in input order.
/// Nothing of the planner's own reasoning (settled layouts, first-fit
/// orders) is used: an independent reference.
fn least_height_by_every_offset(items: &[(u64, usize, usize)]) -> u64 {
    fn fits(items: &[(u64, usize, usize)], height: u64, offsets: &mut Vec<u64>) -> bool {
        let k = offsets.len();
        let Some(&(units, first, last)) = items.get(k) else {
            return true;
        };
        if units > height {
            return false;
        }
        for o in 0..=height - units {
            let clear = items[..k]
                .iter()
                .zip(offsets.iter())
                .all(|(&(u, f, l), &p)| {
                    let meet = first <= l && f <= last;
                    !meet || o + units <= p || p + u <= o
                });
            if clear {
                offsets.push(o);
                if fits(items, height, offsets) {
                    return true;
                }
                offsets.pop();
            }
        }
        false
    }
    let slots = items
        .iter()
        .map(|it| it.1)
        .chain(items.iter().map(|it| it.2));
    let most_live = slots
        .map(|s| {
            items
                .iter()
                .filter(|it| it.1 <= s && s <= it.2)
                .map(|it| it.0)
                .sum::<u64>()
        })
        .max()
        .unwrap_or(0);
    let mut height = most_live;
    while !fits(items, height, &mut Vec::new()) {
        height += 1;
    }
    height
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// On every workload small enough to search exhaustively, packed
    /// placement needs exactly the least memory of any layout of its
    /// buffers (runner bytes and handoffs of one key), never more than
    /// round-robin, never less than the lower bound; and the report says
    /// `lb` or `proved` there, never `open`.
    #[test]
    fn packed_equals_an_exhaustive_search_on_small_workloads(
        (cap, hs) in tiny_workload(),
        g in 1usize..4,
    ) {
        const UNIT: u64 = 256;
        let w: Workload = cap
            .iter()
            .map(|&c| {
                (c > 0)
                    .then(|| Request::new(Domain::Device, DType::F32, c * UNIT / 4))
                    .into_iter()
                    .collect()
            })
            .collect();
        let hs: Handoffs = hs
            .into_iter()
            .map(|(writer, readers, units)| {
                (writer, readers, Request::new(Domain::Device, DType::F32, units * UNIT / 4))
            })
            .collect();
        let (d, _) = discover_with(&w, &hs);
        let packed = d.clone().plan(Policy::Generations(g).packed()).unwrap();
        let rr = d.plan(Policy::Generations(g)).unwrap();
        let items: Vec<(u64, usize, usize)> = lifetimes(&packed)
            .iter()
            .map(|&(_, _, _, bytes, first, last)| (bytes / UNIT, first, last))
            .collect();
        let optimum = least_height_by_every_offset(&items) * UNIT;
        let report = packed.report();
        prop_assert_eq!(packed.total_bytes(), optimum, "{:?} {:?} g={}", cap, items, g);
        prop_assert!(packed.total_bytes() <= rr.total_bytes());
        prop_assert!(report.lower_bound <= packed.total_bytes());
        for k in &report.keys {
            prop_assert!(k.optimum.name() != "open", "{:?}", k);
        }
    }
}
