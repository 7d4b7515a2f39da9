//! Buffers live over intervals of capture order (the handoffs), placed by
//! first fit in order of start: a sweep that keeps the free gaps among the
//! live buffers' ranges in a tree ([`Gaps`]), so each buffer costs
//! `O(log live)` however many are live and wherever the gaps are.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// One buffer live over an interval of capture order (a handoff from its
/// writer to its last reader): `[start, end]`, inclusive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Interval {
    pub(crate) start: usize,
    pub(crate) end: usize,
    pub(crate) bytes: u64,
}

/// First-fit offsets for buffers live over intervals: two whose intervals
/// meet get disjoint ranges; the arena's size is the highest end. A sweep
/// in order of start: buffers whose interval ended give their range back
/// (a heap by end of interval), and each buffer takes the lowest free gap
/// it fits in ([`Gaps`]), so `O(n log n)` however many are live at once
/// and wherever the gaps are. Buffers live at one point all contain it, so
/// they are pairwise disjoint: the gaps between their ranges are exactly
/// the bytes free for the next one. `None` when the arena overflows `u64`.
/// Offsets are sums of sizes, so they keep the sizes' alignment.
pub(crate) fn place_intervals(items: &[Interval]) -> Option<(Vec<u64>, u64)> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| (items[i].start, i));
    let mut offsets = vec![0u64; items.len()];
    // Live buffers by end of interval: (end, offset, end of range).
    let mut live: BinaryHeap<Reverse<(usize, u64, u64)>> = BinaryHeap::new();
    let mut gaps = Gaps::new();
    let mut top = 0u64;
    for i in order {
        let it = items[i];
        while let Some(&Reverse((end, lo, hi))) = live.peek() {
            if end >= it.start {
                break;
            }
            live.pop();
            gaps.release(lo, hi);
        }
        let at = gaps.first_fit(it.bytes)?;
        let hi = at.checked_add(it.bytes)?;
        gaps.take(at, it.bytes);
        offsets[i] = at;
        top = top.max(hi);
        live.push(Reverse((it.end, at, hi)));
    }
    Some((offsets, top))
}

/// The free gaps among disjoint ranges `[lo, hi)` of `u64` offsets, by
/// start, in a treap whose nodes know the longest gap below them: the
/// lowest gap of at least `size` bytes, taking bytes from a gap's start
/// and giving a range back (merged with the gaps beside it) each cost
/// `O(log gaps)`. Starts as one gap, `[0, u64::MAX)`. Deterministic: the
/// treap's priorities come from a fixed sequence.
struct Gaps {
    nodes: Vec<Gap>,
    root: u32,
    /// Nodes removed, for reuse.
    spare: Vec<u32>,
    /// The state of the priority sequence (xorshift64).
    seed: u64,
}

/// No node.
const NIL: u32 = u32::MAX;

/// One free gap `[start, end)`, a treap node.
#[derive(Clone, Copy)]
struct Gap {
    start: u64,
    end: u64,
    priority: u64,
    left: u32,
    right: u32,
    /// The longest gap in this node's subtree.
    longest: u64,
}

impl Gaps {
    /// Everything free: one gap `[0, u64::MAX)`.
    fn new() -> Gaps {
        let mut gaps = Gaps {
            nodes: Vec::new(),
            root: NIL,
            spare: Vec::new(),
            seed: 0x9e37_79b9_7f4a_7c15,
        };
        gaps.insert(0, u64::MAX);
        gaps
    }

    /// The start of the lowest gap of at least `size` bytes; `None` when
    /// none is (only past the top of `u64`).
    fn first_fit(&self, size: u64) -> Option<u64> {
        let mut t = self.root;
        while t != NIL {
            let n = &self.nodes[t as usize];
            if n.left != NIL && self.nodes[n.left as usize].longest >= size {
                t = n.left;
            } else if n.end - n.start >= size {
                return Some(n.start);
            } else if n.right != NIL && self.nodes[n.right as usize].longest >= size {
                t = n.right;
            } else {
                return None;
            }
        }
        None
    }

    /// Takes `[at, at + size)` from the start of the gap that starts at
    /// `at` (as [`Gaps::first_fit`] returned it).
    fn take(&mut self, at: u64, size: u64) {
        if size == 0 {
            return;
        }
        if let Some(end) = self.remove(at) {
            if at + size < end {
                self.insert(at + size, end);
            }
        }
    }

    /// Gives `[lo, hi)` back, merged with the gaps that end at `lo` and
    /// start at `hi`.
    fn release(&mut self, lo: u64, hi: u64) {
        if lo >= hi {
            return;
        }
        let (mut start, mut end) = (lo, hi);
        if let Some((s, e)) = self.below(lo) {
            if e == lo {
                self.remove(s);
                start = s;
            }
        }
        if let Some(e) = self.remove(hi) {
            end = e;
        }
        self.insert(start, end);
    }

    /// The gap with the greatest start below `at`.
    fn below(&self, at: u64) -> Option<(u64, u64)> {
        let mut t = self.root;
        let mut found = None;
        while t != NIL {
            let n = &self.nodes[t as usize];
            if n.start < at {
                found = Some((n.start, n.end));
                t = n.right;
            } else {
                t = n.left;
            }
        }
        found
    }

    fn longest(&self, t: u32) -> u64 {
        if t == NIL {
            0
        } else {
            self.nodes[t as usize].longest
        }
    }

    /// Recomputes `t`'s longest gap from its children.
    fn pull(&mut self, t: u32) {
        let n = self.nodes[t as usize];
        let longest = (n.end - n.start)
            .max(self.longest(n.left))
            .max(self.longest(n.right));
        self.nodes[t as usize].longest = longest;
    }

    /// Splits `t` into the gaps starting below `key` and the rest.
    fn split(&mut self, t: u32, key: u64) -> (u32, u32) {
        if t == NIL {
            return (NIL, NIL);
        }
        if self.nodes[t as usize].start < key {
            let (l, r) = self.split(self.nodes[t as usize].right, key);
            self.nodes[t as usize].right = l;
            self.pull(t);
            (t, r)
        } else {
            let (l, r) = self.split(self.nodes[t as usize].left, key);
            self.nodes[t as usize].left = r;
            self.pull(t);
            (l, t)
        }
    }

    /// Joins `a` and `b`, every start of `a` below every start of `b`.
    fn merge(&mut self, a: u32, b: u32) -> u32 {
        if a == NIL {
            return b;
        }
        if b == NIL {
            return a;
        }
        if self.nodes[a as usize].priority > self.nodes[b as usize].priority {
            let r = self.merge(self.nodes[a as usize].right, b);
            self.nodes[a as usize].right = r;
            self.pull(a);
            a
        } else {
            let l = self.merge(a, self.nodes[b as usize].left);
            self.nodes[b as usize].left = l;
            self.pull(b);
            b
        }
    }

    /// Adds the gap `[start, end)` (no gap starts at `start`).
    fn insert(&mut self, start: u64, end: u64) {
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        let node = Gap {
            start,
            end,
            priority: self.seed,
            left: NIL,
            right: NIL,
            longest: end - start,
        };
        let t = match self.spare.pop() {
            Some(t) => {
                self.nodes[t as usize] = node;
                t
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        let (l, r) = self.split(self.root, start);
        let l = self.merge(l, t);
        self.root = self.merge(l, r);
    }

    /// Removes the gap that starts at `start`, if one does; its end.
    fn remove(&mut self, start: u64) -> Option<u64> {
        let (l, r) = self.split(self.root, start);
        let (m, r) = match start.checked_add(1) {
            Some(next) => self.split(r, next),
            None => (r, NIL),
        };
        let end = (m != NIL).then(|| {
            self.spare.push(m);
            self.nodes[m as usize].end
        });
        self.root = self.merge(l, r);
        end
    }
}

/// The most bytes live at once over the intervals: no placement of them
/// needs less.
#[cfg(test)]
pub(crate) fn interval_lower_bound(items: &[Interval]) -> u64 {
    let mut events: Vec<(usize, bool, u64)> = Vec::with_capacity(2 * items.len());
    for it in items {
        events.push((it.start, false, it.bytes));
        events.push((it.end, true, it.bytes));
    }
    // At one point, starts count before ends (both endpoints are live).
    events.sort_unstable();
    let (mut now, mut most) = (0u128, 0u128);
    for (_, ends, bytes) in events {
        if ends {
            now -= u128::from(bytes);
        } else {
            now += u128::from(bytes);
            most = most.max(now);
        }
    }
    u64::try_from(most).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod interval_tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Buffers whose intervals meet never share a byte, and the arena
        /// is at least the lower bound.
        #[test]
        fn overlapping_intervals_get_disjoint_ranges(
            raw in prop::collection::vec((0usize..20, 0usize..6, 1u64..9), 0..24)
        ) {
            let items: Vec<Interval> = raw
                .iter()
                .map(|&(start, len, bytes)| Interval { start, end: start + len, bytes: bytes * 256 })
                .collect();
            let (offsets, top) = place_intervals(&items).unwrap();
            for i in 0..items.len() {
                prop_assert!(offsets[i] + items[i].bytes <= top);
                for j in 0..i {
                    let meet = items[i].start <= items[j].end && items[j].start <= items[i].end;
                    let apart = offsets[i] + items[i].bytes <= offsets[j]
                        || offsets[j] + items[j].bytes <= offsets[i];
                    prop_assert!(!meet || apart, "{i} and {j} overlap");
                }
            }
            prop_assert!(interval_lower_bound(&items) <= top);
        }
    }

    proptest! {
        /// Each buffer, in order of start, goes to the lowest offset free
        /// of the buffers placed before it whose intervals meet it: what a
        /// plain scan of every live buffer from offset 0 finds.
        #[test]
        fn each_interval_takes_the_lowest_offset_free_of_those_placed_before(
            raw in prop::collection::vec((0usize..30, 0usize..8, 1u64..9), 0..40)
        ) {
            let items: Vec<Interval> = raw
                .iter()
                .map(|&(start, len, bytes)| Interval { start, end: start + len, bytes })
                .collect();
            let mut order: Vec<usize> = (0..items.len()).collect();
            order.sort_by_key(|&i| (items[i].start, i));
            let mut expected = vec![0u64; items.len()];
            for (k, &i) in order.iter().enumerate() {
                let mut busy: Vec<(u64, u64)> = order[..k]
                    .iter()
                    .filter(|&&j| items[j].end >= items[i].start)
                    .map(|&j| (expected[j], expected[j] + items[j].bytes))
                    .collect();
                busy.sort_unstable();
                let mut at = 0;
                for (lo, hi) in busy {
                    if at + items[i].bytes <= lo {
                        break;
                    }
                    at = at.max(hi);
                }
                expected[i] = at;
            }
            let (offsets, _) = place_intervals(&items).unwrap();
            prop_assert_eq!(offsets, expected);
        }
    }

    #[test]
    fn a_chain_of_handoffs_needs_two_buffers() {
        // Runner k hands off to k + 1: neighbours meet, every other does not.
        let items: Vec<Interval> = (0..10)
            .map(|k| Interval {
                start: k,
                end: k + 1,
                bytes: 512,
            })
            .collect();
        let (offsets, top) = place_intervals(&items).unwrap();
        assert_eq!(top, 1024);
        assert_eq!(interval_lower_bound(&items), 1024);
        assert_ne!(offsets[0], offsets[1]);
        assert_eq!(offsets[0], offsets[2]);
    }
}
