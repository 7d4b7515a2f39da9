//! Per-slot storage of the fence and its ledger: every slot of the plan
//! (a plan's own fence), or only the slots a step graph's dry run can
//! meet, so that building a step graph per bucket costs in proportion to
//! the bucket, not to the plan ([`Fence::start_from`](super::Fence::start_from)).

use std::ops::{Index, IndexMut};

/// Values by slot: dense (`values[i]` is slot `i`'s), or sparse (only the
/// slots held, in ascending order). Indexing a slot a sparse store does
/// not hold is a bug of whoever chose what it holds, as an index past the
/// end is.
#[derive(Clone, Debug)]
pub(crate) struct Slots<T> {
    /// `None`: dense. Otherwise the slots held, and where each is.
    held: Option<Held>,
    values: Vec<T>,
}

/// The slots a sparse store holds: ascending, and a table that finds one
/// in constant time (a dry run's fence looks its slots up on every wait
/// and record), sized to the slots held, not to the plan.
#[derive(Clone, Debug)]
struct Held {
    /// The slot of each value, ascending.
    slots: Vec<usize>,
    /// Open addressing, linear probing: `k + 1` for the value at `k`, 0
    /// for an empty entry. A power of two, at least twice the slots held
    /// (so a probe always ends), or empty when the run holds them all
    /// (none held, or a bucket's runners alone).
    table: Vec<u32>,
    /// `64 - log2(table.len())`: the hash's shift.
    shift: u32,
    /// The longest run of consecutive slots held (a bucket's runners,
    /// most of what a step's dry run looks up): `(first slot, where its
    /// value is, slots)`. A slot in it is found without the table.
    run: (usize, usize, usize),
}

impl Held {
    fn new(slots: Vec<usize>) -> Held {
        if slots.is_empty() {
            return Held {
                slots,
                table: Vec::new(),
                shift: 0,
                run: (0, 0, 0),
            };
        }
        // Ascending, each once: they are all one run when the last is as
        // far from the first as their count says (a bucket's runners
        // alone), and every slot held is found without the table.
        let (first, last) = (slots[0], slots[slots.len() - 1]);
        if last - first + 1 == slots.len() {
            return Held {
                run: (first, 0, slots.len()),
                slots,
                table: Vec::new(),
                shift: 0,
            };
        }
        // Otherwise the longest run, where each slot follows the one
        // before, and the table for the rest.
        let (mut run, mut start) = ((slots[0], 0, 1), 0);
        for k in 1..slots.len() {
            if slots[k] != slots[k - 1] + 1 {
                start = k;
            }
            if k + 1 - start > run.2 {
                run = (slots[start], start, k + 1 - start);
            }
        }
        let size = (2 * slots.len()).next_power_of_two().max(2);
        let shift = 64 - size.trailing_zeros();
        let mut table = vec![0u32; size];
        let mask = size - 1;
        for (k, &slot) in slots.iter().enumerate() {
            let mut h = Held::hash(slot, shift);
            while table[h] != 0 {
                h = (h + 1) & mask;
            }
            table[h] = u32::try_from(k + 1).expect("fewer than 2^32 slots held");
        }
        Held {
            slots,
            table,
            shift,
            run,
        }
    }

    /// Fibonacci hashing: consecutive slots (a bucket's runners) spread
    /// over the table.
    #[inline(always)]
    fn hash(slot: usize, shift: u32) -> usize {
        ((slot as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> shift) as usize
    }

    /// Where slot `slot`'s value is, if it is held.
    #[inline(always)]
    fn find(&self, slot: usize) -> Option<usize> {
        let (first, at, len) = self.run;
        let i = slot.wrapping_sub(first);
        if i < len {
            return Some(at + i);
        }
        if self.table.is_empty() {
            return None;
        }
        let mask = self.table.len() - 1;
        let mut h = Held::hash(slot, self.shift);
        loop {
            let e = self.table[h];
            if e == 0 {
                return None;
            }
            let k = e as usize - 1;
            if self.slots[k] == slot {
                return Some(k);
            }
            h = (h + 1) & mask;
        }
    }
}

impl<T> Slots<T> {
    /// Every slot, `values[i]` being slot `i`'s.
    pub(crate) fn dense(values: Vec<T>) -> Slots<T> {
        Slots { held: None, values }
    }

    /// Only the slots of `pairs` (ascending, each once).
    #[cfg(test)]
    pub(crate) fn sparse(pairs: Vec<(usize, T)>) -> Slots<T> {
        let (held, values) = pairs.into_iter().unzip();
        Slots::sparse_of(held, values)
    }

    /// Only those of `slots` (ascending, each once) that `from` holds,
    /// with `from`'s values (its part: no list of pairs in between).
    pub(crate) fn sparse_part(from: &Slots<T>, slots: &[usize]) -> Slots<T>
    where
        T: Clone,
    {
        let (mut held, mut values) = (
            Vec::with_capacity(slots.len()),
            Vec::with_capacity(slots.len()),
        );
        for &slot in slots {
            if let Some(value) = from.get(slot) {
                held.push(slot);
                values.push(value.clone());
            }
        }
        Slots::sparse_of(held, values)
    }

    /// Only `slots` (ascending, each once), `values[k]` being slot
    /// `slots[k]`'s.
    pub(crate) fn sparse_of(slots: Vec<usize>, values: Vec<T>) -> Slots<T> {
        debug_assert!(slots.windows(2).all(|w| w[0] < w[1]) && slots.len() == values.len());
        Slots {
            held: Some(Held::new(slots)),
            values,
        }
    }

    /// Appends the value of the next slot of a dense store (a runner that
    /// joined the plan: `buckets.rs`).
    pub(crate) fn push(&mut self, value: T) {
        debug_assert!(self.held.is_none(), "only a plan's own (dense) store grows");
        self.values.push(value);
    }

    /// The slots it holds.
    pub(crate) fn held(&self) -> usize {
        self.values.len()
    }

    /// Where slot `slot`'s value is, if it is held.
    #[inline]
    fn position(&self, slot: usize) -> Option<usize> {
        match &self.held {
            None => (slot < self.values.len()).then_some(slot),
            Some(held) => held.find(slot),
        }
    }

    /// The slot of the `k`th value held.
    pub(crate) fn slot_at(&self, k: usize) -> usize {
        match &self.held {
            None => k,
            Some(held) => held.slots[k],
        }
    }

    #[inline]
    pub(crate) fn get(&self, slot: usize) -> Option<&T> {
        self.position(slot).map(|k| &self.values[k])
    }

    /// Every value held, with its slot.
    pub(crate) fn pairs(&self) -> impl Iterator<Item = (usize, &T)> {
        (0..self.values.len()).map(|k| (self.slot_at(k), &self.values[k]))
    }

    /// Every value held, with its slot, to change.
    pub(crate) fn pairs_mut(&mut self) -> impl Iterator<Item = (usize, &mut T)> {
        let held = self.held.as_ref().map(|h| h.slots.as_slice());
        self.values
            .iter_mut()
            .enumerate()
            .map(move |(k, v)| (held.map_or(k, |h| h[k]), v))
    }

    /// Every value held, by slot.
    #[cfg(test)]
    pub(crate) fn iter(&self) -> std::slice::Iter<'_, T> {
        self.values.iter()
    }
}

/// Sorts `v` ascending and drops repeats; a list already ascending with
/// no repeats (a bucket's runners, mostly) is only checked, in one look.
pub(crate) fn sort_dedup(v: &mut Vec<usize>) {
    if v.windows(2).all(|w| w[0] < w[1]) {
        return;
    }
    v.sort_unstable();
    v.dedup();
}

/// Where a sparse store's `held` holds slot `slot`.
#[inline(always)]
fn sparse_position(held: &Held, slot: usize) -> usize {
    match held.find(slot) {
        Some(k) => k,
        None => not_held(slot),
    }
}

#[cold]
#[inline(never)]
fn not_held(slot: usize) -> ! {
    panic!("fence slot {slot} is not held by this dry run")
}

impl<T> Index<usize> for Slots<T> {
    type Output = T;

    #[inline(always)]
    fn index(&self, slot: usize) -> &T {
        match &self.held {
            None => &self.values[slot],
            Some(held) => &self.values[sparse_position(held, slot)],
        }
    }
}

impl<T> IndexMut<usize> for Slots<T> {
    #[inline(always)]
    fn index_mut(&mut self, slot: usize) -> &mut T {
        let k = match &self.held {
            None => slot,
            Some(held) => sparse_position(held, slot),
        };
        &mut self.values[k]
    }
}

impl<'a, T> IntoIterator for &'a mut Slots<T> {
    type Item = &'a mut T;
    type IntoIter = std::slice::IterMut<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.values.iter_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sparse_store_finds_its_slots_and_no_others() {
        let mut s = Slots::sparse(vec![(2, 'a'), (7, 'b'), (40, 'c')]);
        assert_eq!((s[7], s.get(40), s.get(3)), ('b', Some(&'c'), None));
        s[2] = 'z';
        let pairs: Vec<(usize, char)> = s.pairs().map(|(i, &v)| (i, v)).collect();
        assert_eq!(pairs, vec![(2, 'z'), (7, 'b'), (40, 'c')]);
        assert_eq!((s.held(), s.slot_at(1)), (3, 7));
    }

    #[test]
    fn a_sparse_store_finds_every_slot_it_holds_whatever_their_spacing() {
        // Runs of consecutive slots, strides of powers of two (the worst
        // for a table indexed by low bits) and scattered ones.
        let mut slots: Vec<usize> = (100..164).collect();
        slots.extend((1..=40).map(|k| 5000 + k * 1024));
        slots.extend((1..=30).map(|k| 200_000 + k * k * 37));
        slots.sort_unstable();
        slots.dedup();
        let s = Slots::sparse(slots.iter().map(|&i| (i, i * 3)).collect());
        for &i in &slots {
            assert_eq!(s.get(i), Some(&(i * 3)));
            assert_eq!(s[i], i * 3);
        }
        let held: std::collections::BTreeSet<usize> = slots.iter().copied().collect();
        // Just outside the run of consecutive slots (found without the table).
        assert_eq!(
            (s.get(99), s.get(164), s.get(163)),
            (None, None, Some(&489))
        );
        for i in (0..300_000).step_by(7) {
            assert_eq!(s.get(i).is_some(), held.contains(&i), "slot {i}");
        }
        let empty: Slots<u8> = Slots::sparse(Vec::new());
        assert_eq!((empty.get(0), empty.get(9), empty.held()), (None, None, 0));
    }

    #[test]
    fn a_sparse_store_of_one_run_finds_its_slots_and_no_others() {
        let s = Slots::sparse((10..42).map(|i| (i, i * 2)).collect());
        for i in 0..100 {
            assert_eq!(
                s.get(i),
                (10..42).contains(&i).then_some(&(i * 2)),
                "slot {i}"
            );
        }
        assert_eq!((s[10], s[41], s.held()), (20, 82, 32));
        let mut v = vec![3, 5, 9];
        sort_dedup(&mut v);
        let mut w = vec![9, 3, 5, 3, 5];
        sort_dedup(&mut w);
        let mut x = vec![3, 3, 5, 9];
        sort_dedup(&mut x);
        assert_eq!((v.clone(), w, x), (v.clone(), v.clone(), v));
    }

    #[test]
    fn a_dense_store_is_indexed_by_slot() {
        let mut s = Slots::dense(vec![1, 2, 3]);
        s[1] = 5;
        assert_eq!((s[1], s.get(3), s.held(), s.slot_at(2)), (5, None, 3, 2));
        let pairs: Vec<usize> = s.pairs_mut().map(|(i, v)| i * 10 + *v).collect();
        assert_eq!(pairs, vec![1, 15, 23]);
    }
}
