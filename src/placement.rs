//! Where each runner's bytes of one key go: the planner's cleverness.
//!
//! Both placements solve the same problem per key: runners are the
//! buffer-using runners in capture order (position `k`), each with a capacity
//! `cap[k]` (0 when it does not use the key); any `g` consecutive runners may
//! be in flight together, so their ranges must be pairwise disjoint.
//!
//! The lower bound `L` is the heaviest window of `g` consecutive capacities:
//! those runners are pairwise in conflict, so their ranges alone need `L`
//! bytes. Packed placement searches for offsets that come close to it:
//!
//! - `g = 1`: nothing conflicts; every runner at offset 0 needs the largest
//!   capacity, which is `L`. Round-robin already does this.
//! - `g = 2`: conflicts form a path, and alternating runners between the
//!   bottom and the top of an arena of exactly `L` bytes works: runner `2i`
//!   holds `[0, cap)`, runner `2i + 1` holds `[L - cap, L)`, and neighbours
//!   are disjoint because their capacities sum to at most `L`. Optimal.
//! - `g >= 3`: `L` is not always reachable. Runners alternating between
//!   capacities `2a` and `a` (a dense model graphed per module, MLP and
//!   attention) have `L = 5a`, yet no layout of nine or more of them fits in
//!   less than `6a`, which round-robin already achieves (see
//!   `two_to_one_alternation_cannot_reach_the_lower_bound_with_three_generations`).
//!   Packed placement keeps the smallest of a portfolio of layouts, stopping
//!   early at `L`: round-robin laid end to end (the guarantee: never more than
//!   round-robin); *strided* layouts (runners of one residue class modulo a
//!   period `p` share a few slots; they fit workloads whose pattern repeats
//!   every `p` runners, like attention/router/experts); each of these
//!   *settled* (runners re-placed in order of their offset at the lowest free
//!   offset, which never raises a layout and often lowers it); and first and
//!   best fit in capture order and by decreasing size. Each settle or fit is
//!   a pass over every runner and its neighbours within `g - 1` positions
//!   (for large `g`, first fit asks a segment tree over the runners for the
//!   lowest offset free in a window instead: the same offsets in
//!   `O(log n)` tree nodes per runner); beyond settling round-robin, a call
//!   spends at most `max(PASS_BUDGET / n, MIN_PASSES)` passes, the most
//!   promising first, and the whole search at most its share of
//!   [`WORK_BUDGET`], so a plan costs `O(pairs log pairs)` plus a bounded
//!   search whatever `g` is (round-robin's `g` slots are only the used ones;
//!   no vector has `g` entries). Where the budget cuts a search, the best
//!   layout found so far stands (never more than round-robin).
//!
//!   A column of at most [`exact::MOST`] users that the portfolio leaves
//!   above `L` is then searched exactly ([`exact`]: branch and bound over
//!   settled layouts, from the portfolio's layout down, within its share of
//!   the plan's exact search budget, `PlanConfig::with_exact_search`), so
//!   ragged columns get their optimum, not only a good layout, and where
//!   the budget ends first the best layout found stands.
//!
//! Handoffs share their key's arena with the runner bytes ([`shared`]):
//! both are intervals of capture order, and the same disjointness rule and
//! lower bound (the most bytes live at one point) cover both.
//!
//! Every function works on a [`Column`]: only the runners that use the key,
//! with their positions. A key used by a few of many runners (one symmetric
//! group per expert, say) costs in proportion to its users, not to all
//! runners, so planning or reporting many sparse keys stays near-linear in
//! the total number of (runner, key) pairs. Zeros in a dense capacity vector
//! constrain nothing, so the dense entry points ([`packed`], [`round_robin`])
//! give exactly what their column counterparts give.
//!
//! Every offset is a sum of capacities (or `L` minus a capacity, itself a sum
//! of capacities), so offsets keep the domain alignment every capacity has.

mod exact;
mod intervals;
mod portfolio;
mod shared;

pub(crate) use exact::MOST as EXACT_MOST;
pub(crate) use intervals::{place_intervals, Interval};
use portfolio::{choose_gap, neighbours, portfolio, Fit, Portfolio};

pub(crate) use shared::{
    best_bound, lower_bound_shared, packed_shared, round_robin_shared, RoundRobinShared, Timeline,
};

/// One key's capacities: the positions (capture order among buffer-using
/// runners) that use the key, ascending, each with its capacity (never 0),
/// out of `n` positions in all.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Column {
    n: usize,
    pos: Vec<usize>,
    cap: Vec<u64>,
}

impl Column {
    /// An empty column over `n` positions.
    pub(crate) fn new(n: usize) -> Column {
        // Room for a few users up front: most keys of a model are used by
        // many runners, and sparse keys should not cost `n` each.
        let room = n.min(16);
        Column {
            n,
            pos: Vec::with_capacity(room),
            cap: Vec::with_capacity(room),
        }
    }

    /// The column of a dense capacity vector (zeros are runners that do not
    /// use the key).
    #[cfg(test)]
    pub(crate) fn from_dense(cap: &[u64]) -> Column {
        let mut column = Column::new(cap.len());
        for (k, &c) in cap.iter().enumerate() {
            column.push(k, c);
        }
        column
    }

    /// Appends position `k` with capacity `c`; `k` must be above every
    /// position pushed before and below `n`. A zero capacity is skipped.
    pub(crate) fn push(&mut self, k: usize, c: u64) {
        debug_assert!(k < self.n && self.pos.last().is_none_or(|&last| last < k));
        if c > 0 {
            self.pos.push(k);
            self.cap.push(c);
        }
    }

    /// (position, capacity) of each runner that uses the key, in order.
    pub(crate) fn entries(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        self.pos.iter().copied().zip(self.cap.iter().copied())
    }

    /// Number of runners that use the key.
    pub(crate) fn len(&self) -> usize {
        self.pos.len()
    }
}

/// Offsets and arena size for one key, dense: one offset per position.
#[cfg(test)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KeyLayout {
    /// One offset per runner position (meaningless where `cap` is 0).
    pub(crate) offsets: Vec<u64>,
    /// Bytes of the key's arena.
    pub(crate) bytes: u64,
}

/// Offsets and arena size for one [`Column`]: one offset per entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ColumnLayout {
    /// The offset of each entry of the column, in column order.
    pub(crate) offsets: Vec<u64>,
    /// Bytes of the key's arena.
    pub(crate) bytes: u64,
}

/// Round-robin: position `k` goes to generation `k % g`; each generation's
/// arena is the max over its runners. Returns the arena size per generation.
#[cfg(test)]
pub(crate) fn round_robin(cap: &[u64], g: usize) -> Vec<u64> {
    let mut arenas = vec![0u64; g];
    for (generation, bytes) in round_robin_arenas(&Column::from_dense(cap), g) {
        arenas[generation] = bytes;
    }
    arenas
}

/// Round-robin of a column, sparse: `(generation, bytes)` for each
/// generation that has users, in generation order, in `O(len log len)`
/// whatever `g` is (never a vector of `g` entries).
pub(crate) fn round_robin_arenas(column: &Column, g: usize) -> Vec<(usize, u64)> {
    if g <= 2 * column.len() + 16 {
        // Few generations for the users: a max per generation, no sort.
        let mut arenas = vec![0u64; g];
        for (k, c) in column.entries() {
            let a = &mut arenas[k % g];
            *a = (*a).max(c);
        }
        return arenas
            .into_iter()
            .enumerate()
            .filter(|&(_, bytes)| bytes > 0)
            .collect();
    }
    let mut by_generation: Vec<(usize, u64)> = column.entries().map(|(k, c)| (k % g, c)).collect();
    by_generation.sort_unstable();
    // The last entry of each generation is its largest.
    let mut arenas: Vec<(usize, u64)> = Vec::with_capacity(by_generation.len());
    for (generation, c) in by_generation {
        match arenas.last_mut() {
            Some(last) if last.0 == generation => last.1 = c,
            _ => arenas.push((generation, c)),
        }
    }
    arenas
}

/// The total of [`round_robin_arenas`] (saturating).
#[cfg(test)]
pub(crate) fn round_robin_bytes(column: &Column, g: usize) -> u64 {
    round_robin_arenas(column, g)
        .iter()
        .map(|&(_, c)| c)
        .fold(0, u64::saturating_add)
}

/// [`lower_bound_column`] of a dense capacity vector.
#[cfg(test)]
pub(crate) fn lower_bound(cap: &[u64], g: usize) -> u64 {
    lower_bound_column(&Column::from_dense(cap), g)
}

/// The lower bound: the largest sum of capacities over any `g` consecutive
/// positions (no wrap-around), saturating at `u64::MAX`.
#[cfg(test)]
pub(crate) fn lower_bound_column(column: &Column, g: usize) -> u64 {
    u64::try_from(heaviest_window(column, g)).unwrap_or(u64::MAX)
}

/// The exact heaviest window of `g` consecutive positions: windows ending at
/// a used position are the only candidates (capacities are positive).
fn heaviest_window(column: &Column, g: usize) -> u128 {
    let (pos, cap) = (&column.pos, &column.cap);
    let mut best = 0u128;
    let mut window = 0u128;
    let mut first = 0;
    for i in 0..column.len() {
        window += u128::from(cap[i]);
        while pos[first] + g <= pos[i] {
            window -= u128::from(cap[first]);
            first += 1;
        }
        best = best.max(window);
    }
    best
}

/// Work (entries visited) the packed search of a whole plan may spend
/// beyond round-robin: each key gets the share of its users
/// ([`work_share`]). A settle or fit pass visits each entry and its
/// neighbours within `g - 1` positions, so its cost is known before it runs
/// and a pass that does not fit in what is left is skipped; a strided seed
/// costs one visit per entry. Planned workloads of thousands of runners at
/// small `G` spend a few percent of it, so the budget only ever cuts the
/// search of very large `G`, where round-robin's layout (or a strided one)
/// stands.
pub(crate) const WORK_BUDGET: u64 = 16_000_000;

/// The packed search budget of a key with `users` users, out of `pairs`
/// (runner, key) pairs in the whole plan: its share of [`WORK_BUDGET`], and
/// at least a few visits per user.
pub(crate) fn work_share(users: usize, pairs: usize) -> u64 {
    share(WORK_BUDGET, users, pairs)
}

/// The share of `budget` of a key with `users` users out of `total`, and
/// at least a few visits per user.
pub(crate) fn share(budget: u64, users: usize, total: usize) -> u64 {
    let users = users as u64;
    let share = u128::from(budget) * u128::from(users) / (total.max(1) as u128);
    u64::try_from(share)
        .unwrap_or(u64::MAX)
        .max(users.saturating_mul(4))
}

/// What is left of a search's budget.
pub(crate) struct Work(pub(crate) u64);

impl Work {
    /// Takes `cost` if that much is left.
    fn spend(&mut self, cost: u64) -> bool {
        match self.0.checked_sub(cost) {
            Some(left) => {
                self.0 = left;
                true
            }
            None => false,
        }
    }
}

/// Packed: per-runner offsets in one arena so that any `g` consecutive
/// runners are disjoint, as small as the portfolio described in the module
/// docs finds. Never larger than round-robin (whose layout is one of the
/// candidates); exactly the lower bound for `g <= 2`. `None` when the arena
/// would overflow `u64`. Deterministic: equal inputs give equal layouts (every
/// rank must agree on the offsets).
#[cfg(test)]
pub(crate) fn packed(cap: &[u64], g: usize) -> Option<KeyLayout> {
    let column = Column::from_dense(cap);
    let layout = packed_column(&column, g, WORK_BUDGET, EXACT_SEARCH)?;
    let mut offsets = vec![0u64; cap.len()];
    for (&k, &o) in column.pos.iter().zip(&layout.offsets) {
        offsets[k] = o;
    }
    Some(KeyLayout {
        offsets,
        bytes: layout.bytes,
    })
}

/// [`packed`] of a column, spending at most `work` entry visits beyond
/// round-robin (see [`WORK_BUDGET`]) and `exact` steps of the exact search
/// ([`exact`]), which runs where the portfolio stays above the lower bound
/// and the column has at most [`exact::MOST`] users. Round-robin and the
/// lower bound cost `O(len log len)` whatever `g` is; memory is `O(len)`.
pub(crate) fn packed_column(
    column: &Column,
    g: usize,
    work: u64,
    exact: u64,
) -> Option<ColumnLayout> {
    let bound = u64::try_from(heaviest_window(column, g)).ok()?;
    let mut best = Portfolio::new(bound);
    let mut work = Work(work);
    portfolio(column, g, &mut work, &mut best);
    if !best.done() && column.len() <= exact::MOST && exact > 0 {
        let ceiling = best.layout.as_ref().map_or(u64::MAX, |l| l.bytes);
        let items: Vec<(usize, usize, u64)> =
            column.entries().map(|(k, c)| (k, k + (g - 1), c)).collect();
        if let Some((offsets, bytes)) =
            exact::search(&items, ceiling, bound, &mut Work(exact)).layout
        {
            best.offer(Some(ColumnLayout { offsets, bytes }));
        }
    }
    best.layout
}

/// The exact search budget of the dense test entry points: the default a
/// plan has ([`PlanConfig::DEFAULT_EXACT_SEARCH`](crate::PlanConfig::DEFAULT_EXACT_SEARCH)).
#[cfg(test)]
pub(crate) const EXACT_SEARCH: u64 = 2_000_000;

#[cfg(test)]
mod tests {
    use super::portfolio::{first_fit_windowed, fit, fit_scanning, strided};
    use super::*;
    use std::cmp::Reverse;

    #[test]
    fn lower_bound_is_the_heaviest_window() {
        assert_eq!(lower_bound(&[10, 1, 20, 10, 1, 20], 2), 30);
        assert_eq!(lower_bound(&[10, 1, 20], 1), 20);
        assert_eq!(lower_bound(&[10, 1, 20], 3), 31);
    }

    #[test]
    fn round_robin_takes_the_max_per_generation() {
        assert_eq!(round_robin(&[10, 1, 20, 10, 1, 20], 2), vec![20, 20]);
    }

    #[test]
    fn packed_beats_round_robin_on_a_period_of_three() {
        let cap = [10, 1, 20, 10, 1, 20, 10, 1, 20];
        let rr: u64 = round_robin(&cap, 2).iter().sum();
        let p = packed(&cap, 2).unwrap();
        assert_eq!(rr, 40);
        assert!(p.bytes <= 31, "packed {}", p.bytes);
    }

    #[test]
    fn best_fit_uses_the_top_only_when_no_gap_fits() {
        assert_eq!(choose_gap(&[(4, 8)], 4, Fit::Best), Some(0));
        assert_eq!(choose_gap(&[(2, 8)], 4, Fit::Best), Some(8));
        assert_eq!(choose_gap(&[(2, 8), (14, 20)], 4, Fit::Best), Some(8));
    }

    /// Panics unless any `g` consecutive runners are pairwise disjoint and
    /// every range lies inside the arena.
    fn assert_valid(cap: &[u64], g: usize, layout: &KeyLayout) {
        for (i, &ci) in cap.iter().enumerate().filter(|(_, &c)| c > 0) {
            let oi = layout.offsets[i];
            assert!(oi + ci <= layout.bytes, "runner {i} ends past the arena");
            for (j, &cj) in cap.iter().enumerate().take(i + g).skip(i + 1) {
                let oj = layout.offsets[j];
                assert!(
                    cj == 0 || oi + ci <= oj || oj + cj <= oi,
                    "runners {i} and {j} overlap: {cap:?} g={g} {:?}",
                    layout.offsets
                );
            }
        }
    }

    /// A column's layout with one offset per position (0 where unused).
    fn dense(column: &Column, layout: ColumnLayout) -> KeyLayout {
        let mut offsets = vec![0; column.n];
        for (&k, &o) in column.pos.iter().zip(&layout.offsets) {
            offsets[k] = o;
        }
        KeyLayout {
            offsets,
            bytes: layout.bytes,
        }
    }

    /// Whether some layout of integer offsets fits in `height` bytes. Integer
    /// offsets suffice for integer capacities: settling any layout (see
    /// [`Slotted::settle_order`]; the argument holds for any layout) never
    /// raises it and leaves every offset a sum of capacities.
    fn fits_exhaustively(cap: &[u64], g: usize, height: u64) -> bool {
        fn place(cap: &[u64], g: usize, height: u64, offsets: &mut Vec<u64>) -> bool {
            let k = offsets.len();
            if k == cap.len() {
                return true;
            }
            let c = cap[k];
            if c > height {
                return false;
            }
            for o in 0..=height - c {
                let clear = (k.saturating_sub(g - 1)..k).all(|j| {
                    cap[j] == 0 || c == 0 || o + c <= offsets[j] || offsets[j] + cap[j] <= o
                });
                if clear {
                    offsets.push(o);
                    if place(cap, g, height, offsets) {
                        return true;
                    }
                    offsets.pop();
                }
            }
            false
        }
        place(cap, g, height, &mut Vec::new())
    }

    /// The least height of any layout of integer offsets, by dynamic
    /// programming over positions: a state is the offsets of the last
    /// `g - 1` runners (the only ones a later runner can conflict with), so
    /// every layout is considered. Integer offsets suffice (see
    /// [`fits_exhaustively`]).
    fn optimum_by_every_layout(cap: &[u64], g: usize) -> u64 {
        use std::collections::HashSet;
        let feasible = |height: u64| {
            let mut states: HashSet<Vec<Option<u64>>> = HashSet::from([vec![None; g - 1]]);
            for (k, &c) in cap.iter().enumerate() {
                let mut next = HashSet::new();
                for state in &states {
                    let shift = |o: Option<u64>| {
                        let mut s: Vec<Option<u64>> = state[1.min(state.len())..].to_vec();
                        if g > 1 {
                            s.push(o);
                        }
                        s
                    };
                    if c == 0 {
                        next.insert(shift(None));
                        continue;
                    }
                    for o in 0..=height.saturating_sub(c) {
                        if c > height {
                            break;
                        }
                        // state[i] is position k - (g - 1) + i.
                        let clear = state.iter().enumerate().all(|(i, &p)| match p {
                            None => true,
                            Some(p) => {
                                let cp = cap[k + i + 1 - g];
                                o + c <= p || p + cp <= o
                            }
                        });
                        if clear {
                            next.insert(shift(Some(o)));
                        }
                    }
                }
                states = next;
            }
            !states.is_empty()
        };
        let mut height = lower_bound(cap, g);
        while !feasible(height) {
            height += 1;
        }
        height
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(96))]

        /// Ragged random columns (no repeating pattern, some runners
        /// without buffers) at G = 3 and 4: packed placement needs exactly
        /// the least memory of any layout.
        #[test]
        fn packed_reaches_the_exact_optimum_on_ragged_random_columns_at_three_and_four_generations(
            cap in proptest::collection::vec(
                proptest::prop_oneof![1 => proptest::strategy::Just(0u64), 4 => 1u64..9], 4..17),
            g in 3usize..5,
        ) {
            let p = packed(&cap, g).unwrap();
            assert_valid(&cap, g, &p);
            proptest::prop_assert_eq!(p.bytes, optimum_by_every_layout(&cap, g), "{:?} g={}", cap, g);
        }
    }

    #[test]
    fn the_exact_search_finds_the_optimum_of_ragged_columns_the_portfolio_misses() {
        for (cap, g, optimum) in [
            (vec![2, 3, 4, 3, 4, 1, 4, 3, 1, 0], 3, 11),
            (vec![6, 8, 8, 3, 8, 6, 7, 6, 7, 1, 5, 6], 3, 22),
            (vec![1, 3, 2, 4, 1, 0, 5, 2, 3, 0], 4, 10),
            (vec![0, 5, 5, 2, 3, 5, 2, 0, 7, 3, 1, 4], 4, 15),
        ] {
            let column = Column::from_dense(&cap);
            let mut alone = Portfolio::new(lower_bound(&cap, g));
            portfolio(&column, g, &mut Work(WORK_BUDGET), &mut alone);
            assert!(alone.layout.unwrap().bytes > optimum, "{cap:?}");
            assert_eq!(optimum_by_every_layout(&cap, g), optimum, "{cap:?}");
            let p = packed(&cap, g).unwrap();
            assert_valid(&cap, g, &p);
            assert_eq!(p.bytes, optimum, "{cap:?} g={g}");
        }
    }

    #[test]
    fn two_generations_reach_the_lower_bound_by_alternating() {
        let cap = [10, 1, 20, 10, 1, 20, 10, 1, 20];
        let p = packed(&cap, 2).unwrap();
        assert_eq!(p.bytes, 30);
        assert_valid(&cap, 2, &p);
        // Zeros (runners that do not use the key) break nothing.
        let cap = [7, 0, 0, 9, 3, 0, 12, 12];
        let p = packed(&cap, 2).unwrap();
        assert_eq!(p.bytes, 24);
        assert_valid(&cap, 2, &p);
    }

    #[test]
    fn two_to_one_alternation_cannot_reach_the_lower_bound_with_three_generations() {
        // MLP (2a) and attention (a) runners of a dense model graphed per
        // module, G = 3: windows weigh 5a or 4a, so the lower bound is 5a.
        let cap = [2, 1, 2, 1, 2, 1, 2, 1, 2];
        assert_eq!(lower_bound(&cap, 3), 5);
        // No layout fits in 5a; by integrality nothing below 6a does either.
        assert!(!fits_exhaustively(&cap, 3, 5));
        assert!(fits_exhaustively(&cap, 3, 6));
        // Round-robin's 6a is optimal, and packed finds it, at any scale.
        let a = 4096 * 27;
        let scaled: Vec<u64> = cap.iter().map(|c| c * a).collect();
        let p = packed(&scaled, 3).unwrap();
        assert_valid(&scaled, 3, &p);
        assert_eq!(p.bytes, 6 * a);
        assert_eq!(round_robin(&scaled, 3).iter().sum::<u64>(), 6 * a);
        // With eight runners or fewer, 5a is still reachable.
        assert!(fits_exhaustively(&cap[..8], 3, 5));
    }

    #[test]
    fn strided_layouts_beat_round_robin_on_a_one_to_three_alternation() {
        // Lower bound 7, round-robin 9, optimum 8: the two capacities each
        // alternate between two slots of their own (period 2).
        let cap: Vec<u64> = [1, 3].repeat(6);
        assert_eq!(lower_bound(&cap, 3), 7);
        assert_eq!(round_robin(&cap, 3).iter().sum::<u64>(), 9);
        assert!(!fits_exhaustively(&cap, 3, 7));
        let p = packed(&cap, 3).unwrap();
        assert_valid(&cap, 3, &p);
        assert_eq!(p.bytes, 8);
    }

    #[test]
    fn a_period_equal_to_g_is_packed_at_the_lower_bound() {
        // Experts, router, attention with G = 3, and a first runner (output
        // head) larger than any layer.
        let mut cap: Vec<u64> = [48, 1, 7].repeat(10);
        cap.insert(0, 60);
        let p = packed(&cap, 3).unwrap();
        assert_valid(&cap, 3, &p);
        assert_eq!(p.bytes, lower_bound(&cap, 3));
    }

    #[test]
    fn offsets_keep_the_alignment_of_capacities() {
        let cap: Vec<u64> = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]
            .iter()
            .map(|c| c * 4096)
            .collect();
        for g in 1..=5 {
            let p = packed(&cap, g).unwrap();
            assert_valid(&cap, g, &p);
            assert!(
                p.offsets.iter().all(|o| o % 4096 == 0),
                "g={g} {:?}",
                p.offsets
            );
        }
    }

    #[test]
    fn packed_is_none_only_when_the_arena_would_overflow() {
        let half = u64::MAX / 2 + 1;
        assert_eq!(packed(&[half, half], 2), None);
        assert_eq!(packed(&[half, half], 1).unwrap().bytes, half);
        assert_eq!(packed(&[half, 0, half], 2).unwrap().bytes, half);
    }

    proptest::proptest! {
        #[test]
        fn packed_is_valid_and_between_the_lower_bound_and_round_robin(
            cap in proptest::collection::vec(
                proptest::prop_oneof![proptest::strategy::Just(0u64), 1u64..64], 1..40),
            g in 1usize..6,
        ) {
            let g = g.min(cap.len());
            let p = packed(&cap, g).unwrap();
            assert_valid(&cap, g, &p);
            proptest::prop_assert!(p.bytes >= lower_bound(&cap, g));
            proptest::prop_assert!(p.bytes <= round_robin(&cap, g).iter().sum::<u64>());
            if g <= 2 {
                proptest::prop_assert_eq!(p.bytes, lower_bound(&cap, g));
            }
        }

        #[test]
        fn round_robin_bytes_of_a_column_is_the_round_robin_total(
            cap in proptest::collection::vec(
                proptest::prop_oneof![proptest::strategy::Just(0u64), 1u64..64], 0..40),
            g in 1usize..6,
        ) {
            proptest::prop_assert_eq!(
                round_robin_bytes(&Column::from_dense(&cap), g),
                round_robin(&cap, g).iter().sum::<u64>()
            );
        }

        #[test]
        fn first_fit_through_the_tree_places_as_scanning_does(
            cap in proptest::collection::vec(
                proptest::prop_oneof![proptest::strategy::Just(0u64), 1u64..64], 1..120),
            g in 1usize..80,
            seed in proptest::prelude::any::<u64>(),
        ) {
            let column = Column::from_dense(&cap);
            // Capture order, by size, and a pseudo-random order.
            let mut orders = vec![(0..column.len()).collect::<Vec<usize>>()];
            let mut by_size = orders[0].clone();
            by_size.sort_by_key(|&i| (Reverse(column.cap[i]), i));
            let mut shuffled = orders[0].clone();
            let mut x = seed | 1;
            for i in (1..shuffled.len()).rev() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                shuffled.swap(i, (x % (i as u64 + 1)) as usize);
            }
            orders.extend([by_size, shuffled]);
            for order in &orders {
                let tree = first_fit_windowed(&column, g, order, &mut Work(u64::MAX));
                let scan = fit_scanning(&column, g, order, Fit::First);
                proptest::prop_assert_eq!(tree, scan);
            }
        }

        #[test]
        fn settling_never_raises_a_layout(
            cap in proptest::collection::vec(0u64..64, 1..40),
            g in 1usize..6,
            p in 1usize..9,
        ) {
            let g = g.min(cap.len());
            let column = Column::from_dense(&cap);
            let slotted = strided(&column, g, p);
            let seed = dense(&column, slotted.layout().unwrap());
            assert_valid(&cap, g, &seed);
            let settled = fit(&column, g, &slotted.settle_order(), Fit::First, &mut Work(u64::MAX))
                .unwrap();
            let settled = dense(&column, settled);
            assert_valid(&cap, g, &settled);
            proptest::prop_assert!(settled.bytes <= seed.bytes);
        }
    }
}
