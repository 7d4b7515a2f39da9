//! The packed placement as it was before planning was made independent of
//! `G` (commit be51f85, `src/placement.rs`), kept verbatim as an oracle:
//! the new placement must never allocate more than this one did.
#![allow(dead_code)]

use std::cmp::Reverse;

/// One key's capacities: the positions that use the key, ascending, each
/// with its capacity (never 0), out of `n` positions in all.
pub struct Column {
    n: usize,
    pos: Vec<usize>,
    cap: Vec<u64>,
}

impl Column {
    /// The column of a dense capacity vector (zeros are runners that do not
    /// use the key).
    pub fn from_dense(cap: &[u64]) -> Column {
        let keep = |&(_, &c): &(usize, &u64)| c > 0;
        Column {
            n: cap.len(),
            pos: cap
                .iter()
                .enumerate()
                .filter(keep)
                .map(|(k, _)| k)
                .collect(),
            cap: cap.iter().copied().filter(|&c| c > 0).collect(),
        }
    }

    fn len(&self) -> usize {
        self.pos.len()
    }
}

/// Offsets and arena size for one column.
pub struct ColumnLayout {
    /// The offset of each entry of the column, in column order.
    pub offsets: Vec<u64>,
    /// Bytes of the key's arena.
    pub bytes: u64,
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

/// Strided layouts are tried for periods `2..=max(MIN_PERIODS, 2 g)`.
const MIN_PERIODS: usize = 8;

/// Runner placements (over all settle and fit passes) one call may spend
/// beyond the first settle: passes cost `O(n g)` each, so for `n` runners at
/// most `max(PASS_BUDGET / n, MIN_PASSES)` further passes run, the most
/// promising first. Up to a few thousand runners that is every candidate;
/// for 10,000 it is four. `n` counts every buffer-using runner, not only the
/// key's users, so a sparse key spends no more passes than a dense one and
/// the total over keys stays proportional to the (runner, key) pairs.
const PASS_BUDGET: usize = 40_000;
/// Passes allowed however many runners there are.
const MIN_PASSES: usize = 3;

/// The old packed search of a column, verbatim.
pub fn packed_column(column: &Column, g: usize) -> Option<ColumnLayout> {
    let n = column.n;
    let bound = u64::try_from(heaviest_window(column, g)).ok()?;
    let mut best = Portfolio::new(bound);
    let round_robin = Slotted::new(column, g, |k| k % g);
    best.offer(round_robin.layout());
    if best.done() {
        return best.layout;
    }
    if g == 2 {
        best.offer(Some(alternating(column, bound)));
        return best.layout;
    }
    // Settling round-robin is the strongest single candidate on irregular
    // capacities; strided seeds win on periodic ones; plain fits come last.
    best.offer(fit(column, g, &round_robin.settle_order(), Fit::First));
    let mut passes = (PASS_BUDGET / n.max(1)).max(MIN_PASSES);
    let mut seeds: Vec<(u64, Slotted)> = (2..=MIN_PERIODS.max(2 * g).min(n))
        .filter(|&p| p != g) // the same slots as round-robin
        .map(|p| strided(column, g, p))
        .filter_map(|s| Some((s.bytes()?, s)))
        .collect();
    seeds.sort_by_key(|(bytes, _)| *bytes);
    for (_, seed) in &seeds {
        if best.done() || passes == 0 {
            return best.layout;
        }
        best.offer(seed.layout());
        best.offer(fit(column, g, &seed.settle_order(), Fit::First));
        passes -= 1;
    }
    let in_capture_order: Vec<usize> = (0..column.len()).collect();
    let mut by_size_desc = in_capture_order.clone();
    by_size_desc.sort_by_key(|&i| (Reverse(column.cap[i]), i));
    for (order, how) in [
        (&in_capture_order, Fit::First),
        (&by_size_desc, Fit::First),
        (&in_capture_order, Fit::Best),
        (&by_size_desc, Fit::Best),
    ] {
        if best.done() || passes == 0 {
            return best.layout;
        }
        best.offer(fit(column, g, order, how));
        passes -= 1;
    }
    best.layout
}

/// The smallest layout offered so far.
struct Portfolio {
    bound: u64,
    layout: Option<ColumnLayout>,
}

impl Portfolio {
    fn new(bound: u64) -> Portfolio {
        Portfolio {
            bound,
            layout: None,
        }
    }

    fn offer(&mut self, candidate: Option<ColumnLayout>) {
        if let Some(c) = candidate {
            if self.layout.as_ref().is_none_or(|b| c.bytes < b.bytes) {
                self.layout = Some(c);
            }
        }
    }

    /// Whether the lower bound is reached (nothing can do better).
    fn done(&self) -> bool {
        self.layout.as_ref().is_some_and(|l| l.bytes <= self.bound)
    }
}

/// A layout in which every runner sits at the start of one of a few slots,
/// laid end to end, each as large as its largest runner.
struct Slotted {
    /// The slot of each entry of the column.
    slot_of: Vec<usize>,
    /// Bytes of each slot.
    sizes: Vec<u64>,
}

impl Slotted {
    /// Puts position `k` in slot `slot(k)` (below `slots`).
    fn new(column: &Column, slots: usize, slot: impl Fn(usize) -> usize) -> Slotted {
        let slot_of: Vec<usize> = column.pos.iter().map(|&k| slot(k)).collect();
        let mut sizes = vec![0u64; slots];
        for (&c, &z) in column.cap.iter().zip(&slot_of) {
            sizes[z] = sizes[z].max(c);
        }
        Slotted { slot_of, sizes }
    }

    /// Total bytes, `None` on overflow.
    fn bytes(&self) -> Option<u64> {
        self.sizes.iter().try_fold(0u64, |t, &z| t.checked_add(z))
    }

    /// The offsets. `None` on overflow.
    fn layout(&self) -> Option<ColumnLayout> {
        let mut starts = Vec::with_capacity(self.sizes.len());
        let mut total = 0u64;
        for &z in &self.sizes {
            starts.push(total);
            total = total.checked_add(z)?;
        }
        Some(ColumnLayout {
            offsets: self.slot_of.iter().map(|&z| starts[z]).collect(),
            bytes: total,
        })
    }

    /// The entries in order of their offset (slot by slot: slots with
    /// runners in them start in slot order), ties in capture order: the
    /// order in which settling re-places them. Settling re-places each at
    /// the lowest offset free of those placed before it; its old offset is
    /// still free then (everything placed before it started no higher and
    /// moved only down), so no runner moves up and the settled layout is
    /// never larger than this one. A counting sort: `O(len + slots)`.
    fn settle_order(&self) -> Vec<usize> {
        let mut first = vec![0usize; self.sizes.len() + 1];
        for &z in &self.slot_of {
            first[z + 1] += 1;
        }
        for z in 1..first.len() {
            first[z] += first[z - 1];
        }
        let mut order = vec![0usize; self.slot_of.len()];
        for (i, &z) in self.slot_of.iter().enumerate() {
            order[first[z]] = i;
            first[z] += 1;
        }
        order
    }
}

/// For `g = 2`: even positions at the bottom, odd positions at the top of an
/// arena of `bound` bytes (the lower bound, so every capacity and every pair
/// of neighbours fits in it).
fn alternating(column: &Column, bound: u64) -> ColumnLayout {
    let offsets: Vec<u64> = column
        .pos
        .iter()
        .zip(&column.cap)
        .map(|(&k, &c)| if k % 2 == 0 { 0 } else { bound - c })
        .collect();
    let bytes = height(column, &offsets);
    ColumnLayout { offsets, bytes }
}

/// Runners of residue class `k % p` share `s = (g - 1) / p + 1` slots, used
/// in turn (`(k / p) % s`). Two runners of one class fewer than `g` positions
/// apart are `m p` apart with `1 <= m < s`, so they use different slots;
/// runners of different classes never share one. `p = 1` is round-robin.
fn strided(column: &Column, g: usize, p: usize) -> Slotted {
    let s = (g - 1) / p + 1;
    Slotted::new(column, p * s, |k| (k % p) * s + (k / p) % s)
}

/// The end of the highest range.
fn height(column: &Column, offsets: &[u64]) -> u64 {
    column
        .cap
        .iter()
        .zip(offsets)
        .map(|(&c, &o)| o + c)
        .max()
        .unwrap_or(0)
}

#[derive(Clone, Copy)]
enum Fit {
    /// Lowest gap that fits.
    First,
    /// Smallest gap that fits (ties: lowest); the top of the arena counts as
    /// an unbounded gap, used only when nothing else fits.
    Best,
}

/// Places the column's entries in `order`; each avoids the ranges of already
/// placed entries within `g - 1` positions of it (neighbours in the column,
/// since it is sorted by position).
fn fit(column: &Column, g: usize, order: &[usize], how: Fit) -> Option<ColumnLayout> {
    let (pos, cap) = (&column.pos, &column.cap);
    let len = column.len();
    let mut offsets = vec![0u64; len];
    let mut placed = vec![false; len];
    let mut bytes = 0u64;
    let mut busy: Vec<(u64, u64)> = Vec::with_capacity(2 * g);
    for &i in order {
        let c = cap[i];
        busy.clear();
        let k = pos[i];
        let near = |j: &usize| k.abs_diff(pos[*j]) < g;
        for j in (0..i)
            .rev()
            .take_while(near)
            .chain((i + 1..len).take_while(near))
        {
            if placed[j] {
                busy.push((offsets[j], offsets[j] + cap[j]));
            }
        }
        busy.sort_unstable();
        let offset = choose_gap(&busy, c, how)?;
        offsets[i] = offset;
        placed[i] = true;
        bytes = bytes.max(offset.checked_add(c)?);
    }
    Some(ColumnLayout { offsets, bytes })
}

/// Picks an offset for `size` bytes among sorted busy ranges.
fn choose_gap(busy: &[(u64, u64)], size: u64, how: Fit) -> Option<u64> {
    let mut cursor = 0u64;
    let mut best: Option<(u64, u64)> = None; // (gap size, offset)
    for &(start, end) in busy {
        if start >= cursor && start - cursor >= size {
            let gap = start - cursor;
            match how {
                Fit::First => return Some(cursor),
                Fit::Best => {
                    if best.is_none_or(|(b, _)| gap < b) {
                        best = Some((gap, cursor));
                    }
                }
            }
        }
        cursor = cursor.max(end);
    }
    match best {
        Some((_, offset)) => Some(offset),
        None => {
            cursor.checked_add(size)?;
            Some(cursor)
        }
    }
}
