//! The packed search of one key's runner bytes: a portfolio of layouts
//! (round-robin, strided slots, settles and first and best fits), each a
//! pass over the column's entries and their neighbours within `g - 1`
//! positions, offered to the best so far until it reaches the lower bound
//! or the work budget runs out (see the module docs of [`placement`](super)).

use std::cmp::Reverse;
use std::collections::BTreeMap;

use super::{Column, ColumnLayout, Work};

/// Strided layouts are tried for periods `2..=max(MIN_PERIODS, 2 g)`.
const MIN_PERIODS: usize = 8;

/// Settle and fit passes one call may run beyond the first settle: for `n`
/// buffer-using runners at most `max(PASS_BUDGET / n, MIN_PASSES)`, the most
/// promising first. Up to a few thousand runners that is every candidate;
/// for 10,000 it is four.
const PASS_BUDGET: usize = 40_000;
/// Passes allowed however many runners there are.
const MIN_PASSES: usize = 3;

/// The portfolio of layouts described in the module docs, offered to
/// `best` until it reaches the lower bound or the passes or `work` run out.
pub(super) fn portfolio(column: &Column, g: usize, work: &mut Work, best: &mut Portfolio) {
    let n = column.n;
    let bound = best.bound;
    let round_robin = Slotted::new(column, g, |k| k % g);
    best.offer(round_robin.layout());
    if best.done() {
        return;
    }
    if g == 2 {
        best.offer(Some(alternating(column, bound)));
        return;
    }
    let len = column.len() as u64;
    // Settling round-robin is the strongest single candidate on irregular
    // capacities; strided seeds win on periodic ones; plain fits come last.
    let order = round_robin.settle_order();
    best.offer(fit(column, g, &order, Fit::First, work));
    if best.done() {
        return;
    }
    let mut passes = (PASS_BUDGET / n.max(1)).max(MIN_PASSES);
    let mut seeds: Vec<(u64, usize)> = Vec::new();
    for p in (2..=MIN_PERIODS.max(2 * g).min(n)).filter(|&p| p != g) {
        // p = g gives the same slots as round-robin.
        if !work.spend(len) {
            break;
        }
        if let Some(bytes) = strided(column, g, p).bytes() {
            seeds.push((bytes, p));
        }
    }
    // Stable: ties stay in order of period.
    seeds.sort_by_key(|&(bytes, _)| bytes);
    for &(_, p) in &seeds {
        if best.done() || passes == 0 {
            return;
        }
        let seed = strided(column, g, p);
        best.offer(seed.layout());
        best.offer(fit(column, g, &seed.settle_order(), Fit::First, work));
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
        if best.done() || passes == 0 || work.0 == 0 {
            return;
        }
        best.offer(fit(column, g, order, how, work));
        passes -= 1;
    }
}

/// The number of (entry, other entry) pairs of the column within `g - 1`
/// positions of each other, counted both ways: what one settle or fit pass
/// visits.
pub(super) fn neighbours(column: &Column, g: usize) -> u64 {
    let pos = &column.pos;
    let mut first = 0;
    let mut pairs = 0u64;
    for i in 0..pos.len() {
        while pos[first] + g <= pos[i] {
            first += 1;
        }
        pairs += (i - first) as u64;
    }
    pairs.saturating_mul(2)
}

/// The smallest layout offered so far.
pub(super) struct Portfolio {
    pub(super) bound: u64,
    pub(super) layout: Option<ColumnLayout>,
}

impl Portfolio {
    pub(super) fn new(bound: u64) -> Portfolio {
        Portfolio {
            bound,
            layout: None,
        }
    }

    pub(super) fn offer(&mut self, candidate: Option<ColumnLayout>) {
        if let Some(c) = candidate {
            if self.layout.as_ref().is_none_or(|b| c.bytes < b.bytes) {
                self.layout = Some(c);
            }
        }
    }

    /// Whether the lower bound is reached (nothing can do better).
    pub(super) fn done(&self) -> bool {
        self.layout.as_ref().is_some_and(|l| l.bytes <= self.bound)
    }
}

/// A layout in which every runner sits at the start of one of a few slots,
/// laid end to end, each as large as its largest runner.
pub(super) struct Slotted {
    /// The slot of each entry of the column.
    slot_of: Vec<usize>,
    /// Bytes of each slot.
    sizes: Vec<u64>,
}

impl Slotted {
    /// Puts position `k` in slot `slot(k)` (below `slots`).
    /// Slots that no entry uses are dropped when there are many more slots
    /// than entries (they hold no bytes, so the layout and the settle order
    /// stay the same): memory and time are `O(len log len)`, not `O(slots)`.
    pub(super) fn new(column: &Column, slots: usize, slot: impl Fn(usize) -> usize) -> Slotted {
        let mut slot_of: Vec<usize> = column.pos.iter().map(|&k| slot(k)).collect();
        let mut slots = slots;
        if slots > 2 * slot_of.len() + 16 {
            let mut used = slot_of.clone();
            used.sort_unstable();
            used.dedup();
            for z in &mut slot_of {
                *z = used.binary_search(z).unwrap_or_else(|at| at);
            }
            slots = used.len();
        }
        let mut sizes = vec![0u64; slots];
        for (&c, &z) in column.cap.iter().zip(&slot_of) {
            sizes[z] = sizes[z].max(c);
        }
        Slotted { slot_of, sizes }
    }

    /// Total bytes, `None` on overflow.
    pub(super) fn bytes(&self) -> Option<u64> {
        self.sizes.iter().try_fold(0u64, |t, &z| t.checked_add(z))
    }

    /// The offsets. `None` on overflow.
    pub(super) fn layout(&self) -> Option<ColumnLayout> {
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
    pub(super) fn settle_order(&self) -> Vec<usize> {
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
pub(super) fn alternating(column: &Column, bound: u64) -> ColumnLayout {
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
pub(super) fn strided(column: &Column, g: usize, p: usize) -> Slotted {
    let s = (g - 1) / p + 1;
    Slotted::new(column, p * s, |k| (k % p) * s + (k / p) % s)
}

/// The end of the highest range.
pub(super) fn height(column: &Column, offsets: &[u64]) -> u64 {
    column
        .cap
        .iter()
        .zip(offsets)
        .map(|(&c, &o)| o + c)
        .max()
        .unwrap_or(0)
}

#[derive(Clone, Copy)]
pub(super) enum Fit {
    /// Lowest gap that fits.
    First,
    /// Smallest gap that fits (ties: lowest); the top of the arena counts as
    /// an unbounded gap, used only when nothing else fits.
    Best,
}

/// Places the column's entries in `order`; each avoids the ranges of already
/// placed entries within `g - 1` positions of it (neighbours in the column,
/// since it is sorted by position).
///
/// Spends from `work`: a scanning pass its known cost up front (`None`
/// without running when that is more than is left), a pass through the tree
/// what it really used (`None` when it runs out: a partial layout is no
/// candidate). Both counts are deterministic, so equal inputs still give
/// equal layouts.
pub(super) fn fit(
    column: &Column,
    g: usize,
    order: &[usize],
    how: Fit,
    work: &mut Work,
) -> Option<ColumnLayout> {
    let neighbours = neighbours(column, g);
    let len = column.len() as u64;
    if matches!(how, Fit::First) && neighbours > TREE_FROM.saturating_mul(len) {
        first_fit_windowed(column, g, order, work)
    } else if work.spend(len.saturating_add(neighbours)) {
        fit_scanning(column, g, order, how)
    } else {
        None
    }
}

/// [`fit`] by scanning and sorting each entry's placed neighbours.
pub(super) fn fit_scanning(
    column: &Column,
    g: usize,
    order: &[usize],
    how: Fit,
) -> Option<ColumnLayout> {
    let (pos, cap) = (&column.pos, &column.cap);
    let len = column.len();
    let mut offsets = vec![0u64; len];
    let mut placed = vec![false; len];
    let mut bytes = 0u64;
    let mut busy: Vec<(u64, u64)> = Vec::with_capacity((2 * g).min(len));
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

/// Neighbours per entry from which first fit asks a [`Windows`] tree
/// instead of scanning and sorting every neighbour.
const TREE_FROM: u64 = 128;

/// Work units one tree operation (a map lookup, insert or removal) is
/// charged: a few neighbour visits' worth.
const TREE_OP: u64 = 2;

/// [`fit`] with [`Fit::First`], each entry asking a segment tree over the
/// column for the lowest offset free in its window of neighbours: the same
/// offsets as scanning them (the lowest offset clear of every placed
/// neighbour), in `O(log len)` tree nodes per entry instead of `O(g)`
/// neighbours.
pub(super) fn first_fit_windowed(
    column: &Column,
    g: usize,
    order: &[usize],
    work: &mut Work,
) -> Option<ColumnLayout> {
    let (pos, cap) = (&column.pos, &column.cap);
    let len = column.len();
    // Each entry's neighbours are the entries lo[i]..=hi[i] (itself
    // included, never placed when it asks).
    let mut lo = vec![0usize; len];
    let mut hi = vec![0usize; len];
    let mut first = 0;
    for i in 0..len {
        while pos[first] + g <= pos[i] {
            first += 1;
        }
        lo[i] = first;
    }
    let mut last = len;
    for i in (0..len).rev() {
        while last > i + 1 && pos[last - 1] >= pos[i] + g {
            last -= 1;
        }
        hi[i] = last.max(i + 1) - 1;
    }
    let mut tree = Windows::new(len, work.0 / TREE_OP);
    let mut offsets = vec![0u64; len];
    let mut bytes = 0u64;
    let mut nodes = Vec::new();
    let mut placed = || -> Option<()> {
        for &i in order {
            let c = cap[i];
            tree.cover(lo[i], hi[i], &mut nodes);
            let offset = tree.lowest_free(&nodes, c)?;
            let end = offset.checked_add(c)?;
            tree.insert(i, offset, end)?;
            offsets[i] = offset;
            bytes = bytes.max(end);
        }
        Some(())
    };
    let done = placed();
    work.0 = work.0.saturating_sub(tree.ops.saturating_mul(TREE_OP));
    done.map(|()| ColumnLayout { offsets, bytes })
}

/// A segment tree over a column's entries: each node holds the union of
/// the ranges placed by the entries below it, as disjoint intervals.
struct Windows {
    size: usize,
    /// Map operations so far, and the most allowed.
    ops: u64,
    limit: u64,
    /// Per node, `start -> end` of disjoint, non-touching ranges.
    nodes: Vec<BTreeMap<u64, u64>>,
}

impl Windows {
    fn new(len: usize, limit: u64) -> Windows {
        let size = len.next_power_of_two().max(1);
        Windows {
            size,
            ops: 0,
            limit,
            nodes: vec![BTreeMap::new(); 2 * size],
        }
    }

    /// The nodes that together cover entries `lo..=hi`.
    fn cover(&self, lo: usize, hi: usize, out: &mut Vec<usize>) {
        out.clear();
        let (mut l, mut r) = (lo + self.size, hi + self.size + 1);
        while l < r {
            if l & 1 == 1 {
                out.push(l);
                l += 1;
            }
            if r & 1 == 1 {
                r -= 1;
                out.push(r);
            }
            l >>= 1;
            r >>= 1;
        }
    }

    /// Counts one map operation; `None` past the limit.
    fn op(&mut self) -> Option<()> {
        self.ops += 1;
        (self.ops <= self.limit).then_some(())
    }

    /// Entry `i` holds `[start, end)`. `None` past the limit.
    fn insert(&mut self, i: usize, start: u64, end: u64) -> Option<()> {
        let mut node = i + self.size;
        while node >= 1 {
            self.op()?;
            let map = &mut self.nodes[node];
            let (mut s, mut e) = (start, end);
            // Merge every range that overlaps or touches [s, e).
            while let Some((&ms, &me)) = map.range(..=e).next_back() {
                if me < s {
                    break;
                }
                map.remove(&ms);
                s = s.min(ms);
                e = e.max(me);
                self.ops += 1;
            }
            map.insert(s, e);
            node >>= 1;
        }
        Some(())
    }

    /// The lowest offset `o` such that `[o, o + size)` meets no range in
    /// any of `nodes`; `None` on overflow or past the limit.
    fn lowest_free(&mut self, nodes: &[usize], size: u64) -> Option<u64> {
        let mut o = 0u64;
        loop {
            let mut moved = false;
            for &n in nodes {
                self.op()?;
                let map = &self.nodes[n];
                // The last range starting before o + size either ends by o
                // (then so do all before it: [o, o + size) is clear here) or
                // overlaps: jump past it.
                while let Some((_, &end)) = map.range(..o.checked_add(size)?).next_back() {
                    if end <= o {
                        break;
                    }
                    o = end;
                    moved = true;
                    self.ops += 1;
                }
            }
            if !moved {
                return Some(o);
            }
        }
    }
}

/// Picks an offset for `size` bytes among sorted busy ranges.
pub(super) fn choose_gap(busy: &[(u64, u64)], size: u64, how: Fit) -> Option<u64> {
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
