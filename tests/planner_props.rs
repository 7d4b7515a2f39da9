//! Planner invariants, for random workloads, policies and placements.

mod support;
#[path = "support/old_packed.rs"]
mod old_packed;

use std::collections::BTreeMap;

use proptest::prelude::*;
use replay_arena::sim;
use replay_arena::{
    DType, Discovering, Domain, Key, PlacedPolicy, Placement, PlanConfig, Planned, Policy, Request,
    RunnerId,
};
use support::{aligned, discover, workload, Workload};

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
        let stream = sim.stream();
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
            cap.stream_capture(&stream, |_| Ok::<(), replay_arena::Error>(())).unwrap();
            cap.finish().unwrap();
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
