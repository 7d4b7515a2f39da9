//! The exact search: the least arena that holds a few buffers, each live
//! over an interval of the timeline, such that buffers whose intervals meet
//! get disjoint bytes.
//!
//! Every layout can be *settled* (buffers re-placed in order of offset, each
//! at the lowest offset free of those placed before it) without raising any
//! buffer, and settling again until nothing moves ends in a layout where,
//! taken in order of (offset, index), every buffer sits at the lowest offset
//! free of the buffers before it. So the optimum is among the layouts built
//! bottom up by first fit in some order whose offsets never decrease: the
//! search branches on which buffer comes next, only where its first-fit
//! offset is not below the last one's (ties by index), and prunes
//!
//! - a buffer that has a free gap entirely below the last offset (it can
//!   never come next again, so no layout of this branch is of that form);
//! - identical buffers (same interval, same size) out of index order;
//! - branches whose height bound reaches the best layout found: every
//!   buffer still to place ends at least at its lowest free offset from the
//!   last offset up plus its size, and the buffers still to place that are
//!   live at one point all lie above the last offset, beside the bytes that
//!   buffers placed there hold above it.
//!
//! The search spends a budget of work (per node, the buffers it looks at
//! and the placed buffers each meets); when the budget runs out it says so,
//! and only the layouts it found are known, not that none is better: it is
//! anytime, the best layout found so far stands. Up to [`MOST`] buffers (a
//! bit each in a `u64`); larger keys keep the portfolio's layout.

use super::Work;

/// Most buffers the exact search takes on (one bit each in a `u64`).
pub(crate) const MOST: usize = 64;

/// The outcome of [`search`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Found {
    /// A layout lower than the ceiling it was asked to beat, if one exists
    /// and was found: offsets in input order, and its height.
    pub(crate) layout: Option<(Vec<u64>, u64)>,
    /// Whether the search ran to the end: then no layout is lower than the
    /// one found (or than the ceiling, when none was found).
    pub(crate) complete: bool,
}

/// The least layout of `items` (`(start, end, bytes)`, `end` inclusive, at
/// most [`MOST`] of them) lower than `ceiling`, stopping early at `floor`
/// (a lower bound of the optimum), spending from `work`.
pub(crate) fn search(
    items: &[(usize, usize, u64)],
    ceiling: u64,
    floor: u64,
    work: &mut Work,
) -> Found {
    let n = items.len();
    debug_assert!(n <= MOST);
    if n == 0 {
        return Found {
            layout: (ceiling > 0).then(|| (Vec::new(), 0)),
            complete: true,
        };
    }
    let meet = |a: (usize, usize, u64), b: (usize, usize, u64)| a.0 <= b.1 && b.0 <= a.1;
    let mut conflicts = vec![0u64; n];
    let mut twins = vec![0u64; n];
    for i in 0..n {
        for j in 0..n {
            if i != j && meet(items[i], items[j]) {
                conflicts[i] |= 1 << j;
            }
            if j < i && items[j] == items[i] {
                twins[i] |= 1 << j;
            }
        }
    }
    // The maximal cliques of an interval graph: the buffers live at each
    // start.
    let mut cliques: Vec<u64> = items
        .iter()
        .map(|&(s, _, _)| {
            (0..n)
                .filter(|&j| items[j].0 <= s && s <= items[j].1)
                .fold(0u64, |m, j| m | 1 << j)
        })
        .collect();
    cliques.sort_unstable();
    cliques.dedup();
    let mut s = Search {
        sizes: items.iter().map(|it| it.2).collect(),
        conflicts,
        twins,
        cliques,
        offsets: vec![0; n],
        best: ceiling,
        best_offsets: None,
        floor,
        aborted: false,
        work,
    };
    s.dfs(0, 0, None, 0);
    Found {
        complete: !s.aborted,
        layout: s.best_offsets.map(|o| (o, s.best)),
    }
}

struct Search<'w> {
    sizes: Vec<u64>,
    conflicts: Vec<u64>,
    twins: Vec<u64>,
    cliques: Vec<u64>,
    offsets: Vec<u64>,
    best: u64,
    best_offsets: Option<Vec<u64>>,
    floor: u64,
    aborted: bool,
    work: &'w mut Work,
}

impl Search<'_> {
    /// The lowest offset at or above `from` where buffer `i` fits among the
    /// placed buffers it conflicts with; `None` on overflow.
    fn lowest(&self, i: usize, placed: u64, from: u64, busy: &mut Vec<(u64, u64)>) -> Option<u64> {
        busy.clear();
        let mut others = self.conflicts[i] & placed;
        while others != 0 {
            let j = others.trailing_zeros() as usize;
            others &= others - 1;
            busy.push((self.offsets[j], self.offsets[j] + self.sizes[j]));
        }
        busy.sort_unstable();
        let mut at = from;
        for &(lo, hi) in busy.iter() {
            if at.checked_add(self.sizes[i])? <= lo {
                break;
            }
            at = at.max(hi);
        }
        at.checked_add(self.sizes[i])?;
        Some(at)
    }

    /// Places the rest of the buffers; `last` is the (offset, index) of the
    /// buffer placed last, `height` the top so far.
    fn dfs(&mut self, placed: u64, height: u64, last: Option<(u64, usize)>, depth: usize) {
        if self.aborted || self.best <= self.floor {
            return;
        }
        let n = self.sizes.len();
        if depth == n {
            if height < self.best {
                self.best = height;
                self.best_offsets = Some(self.offsets.clone());
            }
            return;
        }
        let from = last.map_or(0, |(o, _)| o);
        let mut busy = Vec::with_capacity(n);
        let mut bound = height;
        // (first-fit offset, index) of every buffer that may come next.
        let mut next: Vec<(u64, usize)> = Vec::with_capacity(n - depth);
        // Steps this node takes: one per buffer and per placed buffer each
        // one meets, one per clique and per buffer of each open clique.
        let mut steps = (n + self.cliques.len()) as u64;
        for i in (0..n).filter(|&i| placed & (1 << i) == 0) {
            steps += u64::from((self.conflicts[i] & placed).count_ones());
            let Some(fit) = self.lowest(i, placed, 0, &mut busy) else {
                return;
            };
            if fit.saturating_add(self.sizes[i]) <= from && last.is_some() {
                // A gap below the last offset that nothing can close.
                return;
            }
            let above = if fit >= from {
                fit
            } else {
                match self.lowest(i, placed, from, &mut busy) {
                    Some(o) => o,
                    None => return,
                }
            };
            bound = bound.max(above.saturating_add(self.sizes[i]));
            let after_last = last.is_none_or(|l| (fit, i) > l);
            if after_last && self.twins[i] & !placed == 0 {
                next.push((fit, i));
            }
        }
        for &clique in &self.cliques {
            let open = clique & !placed;
            if open == 0 {
                continue;
            }
            steps += u64::from(clique.count_ones());
            let mut need = from;
            let mut bits = open;
            while bits != 0 {
                let j = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                need = need.saturating_add(self.sizes[j]);
            }
            let mut bits = clique & placed;
            while bits != 0 {
                let j = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let (lo, hi) = (self.offsets[j], self.offsets[j] + self.sizes[j]);
                need = need.saturating_add(hi.saturating_sub(lo.max(from)));
            }
            bound = bound.max(need);
        }
        if !self.work.spend(steps) {
            self.aborted = true;
            return;
        }
        if bound >= self.best {
            return;
        }
        // Lowest offsets first, larger buffers first among equals: good
        // layouts early, so the bound prunes more.
        next.sort_unstable_by_key(|&(fit, i)| (fit, std::cmp::Reverse(self.sizes[i]), i));
        for (fit, i) in next {
            self.offsets[i] = fit;
            let top = height.max(fit + self.sizes[i]);
            if top < self.best {
                self.dfs(placed | 1 << i, top, Some((fit, i)), depth + 1);
            }
            if self.aborted || self.best <= self.floor {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The least height over every order of first fit: the optimum, by the
    /// argument in the module docs (an oracle for a handful of buffers).
    fn by_every_order(items: &[(usize, usize, u64)]) -> u64 {
        fn go(items: &[(usize, usize, u64)], order: &mut Vec<usize>, best: &mut u64) {
            if order.len() == items.len() {
                let mut offsets = vec![0u64; items.len()];
                let mut top = 0;
                for (k, &i) in order.iter().enumerate() {
                    let mut busy: Vec<(u64, u64)> = order[..k]
                        .iter()
                        .filter(|&&j| items[i].0 <= items[j].1 && items[j].0 <= items[i].1)
                        .map(|&j| (offsets[j], offsets[j] + items[j].2))
                        .collect();
                    busy.sort_unstable();
                    let mut at = 0;
                    for (lo, hi) in busy {
                        if at + items[i].2 <= lo {
                            break;
                        }
                        at = at.max(hi);
                    }
                    offsets[i] = at;
                    top = top.max(at + items[i].2);
                }
                *best = (*best).min(top);
                return;
            }
            for i in 0..items.len() {
                if !order.contains(&i) {
                    order.push(i);
                    go(items, order, best);
                    order.pop();
                }
            }
        }
        let mut best = u64::MAX;
        go(items, &mut Vec::new(), &mut best);
        best
    }

    proptest::proptest! {
        #[test]
        fn the_search_finds_the_least_height_of_any_first_fit_order(
            raw in proptest::collection::vec((0usize..8, 0usize..4, 1u64..9), 1..8)
        ) {
            let items: Vec<(usize, usize, u64)> =
                raw.iter().map(|&(s, l, b)| (s, s + l, b)).collect();
            let found = search(&items, u64::MAX, 0, &mut Work(u64::MAX));
            proptest::prop_assert!(found.complete);
            let (offsets, height) = found.layout.unwrap();
            proptest::prop_assert_eq!(height, by_every_order(&items));
            for i in 0..items.len() {
                proptest::prop_assert!(offsets[i] + items[i].2 <= height);
                for j in 0..i {
                    let meet = items[i].0 <= items[j].1 && items[j].0 <= items[i].1;
                    let apart = offsets[i] + items[i].2 <= offsets[j]
                        || offsets[j] + items[j].2 <= offsets[i];
                    proptest::prop_assert!(!meet || apart);
                }
            }
        }
    }

    #[test]
    fn a_ceiling_nothing_beats_is_a_complete_search_with_no_layout() {
        // Three buffers live together need their sum.
        let items = [(0, 2, 3), (1, 3, 4), (2, 4, 5)];
        let found = search(&items, 12, 0, &mut Work(u64::MAX));
        assert_eq!(
            found,
            Found {
                layout: None,
                complete: true
            }
        );
        let found = search(&items, 13, 0, &mut Work(u64::MAX));
        assert_eq!(found.layout.map(|l| l.1), Some(12));
    }

    #[test]
    fn a_search_out_of_work_says_it_is_incomplete() {
        let items: Vec<(usize, usize, u64)> =
            (0..12).map(|k| (k, k + 2, 1 + k as u64 % 3)).collect();
        let found = search(&items, u64::MAX, 0, &mut Work(10));
        assert!(!found.complete);
    }
}
