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
    /// `None`: dense. Otherwise the slot of each value, ascending.
    held: Option<Vec<usize>>,
    values: Vec<T>,
}

impl<T> Slots<T> {
    /// Every slot, `values[i]` being slot `i`'s.
    pub(crate) fn dense(values: Vec<T>) -> Slots<T> {
        Slots { held: None, values }
    }

    /// Only the slots of `pairs` (ascending, each once).
    pub(crate) fn sparse(pairs: Vec<(usize, T)>) -> Slots<T> {
        debug_assert!(pairs.windows(2).all(|w| w[0].0 < w[1].0));
        let (held, values) = pairs.into_iter().unzip();
        Slots {
            held: Some(held),
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
    fn position(&self, slot: usize) -> Option<usize> {
        match &self.held {
            None => (slot < self.values.len()).then_some(slot),
            Some(held) => held.binary_search(&slot).ok(),
        }
    }

    /// The slot of the `k`th value held.
    pub(crate) fn slot_at(&self, k: usize) -> usize {
        match &self.held {
            None => k,
            Some(held) => held[k],
        }
    }

    pub(crate) fn get(&self, slot: usize) -> Option<&T> {
        self.position(slot).map(|k| &self.values[k])
    }

    /// Every value held, with its slot.
    pub(crate) fn pairs(&self) -> impl Iterator<Item = (usize, &T)> {
        (0..self.values.len()).map(|k| (self.slot_at(k), &self.values[k]))
    }

    /// Every value held, with its slot, to change.
    pub(crate) fn pairs_mut(&mut self) -> impl Iterator<Item = (usize, &mut T)> {
        let held = self.held.as_deref();
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

impl<T> Slots<T> {
    /// Where a sparse store holds slot `slot` (off the dense hot path).
    #[cold]
    #[inline(never)]
    fn sparse_position(&self, slot: usize) -> usize {
        match self.position(slot) {
            Some(k) => k,
            None => panic!("fence slot {slot} is not held by this dry run"),
        }
    }
}

impl<T> Index<usize> for Slots<T> {
    type Output = T;

    #[inline]
    fn index(&self, slot: usize) -> &T {
        match &self.held {
            None => &self.values[slot],
            Some(_) => &self.values[self.sparse_position(slot)],
        }
    }
}

impl<T> IndexMut<usize> for Slots<T> {
    #[inline]
    fn index_mut(&mut self, slot: usize) -> &mut T {
        let k = match &self.held {
            None => slot,
            Some(_) => self.sparse_position(slot),
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
    fn a_dense_store_is_indexed_by_slot() {
        let mut s = Slots::dense(vec![1, 2, 3]);
        s[1] = 5;
        assert_eq!((s[1], s.get(3), s.held(), s.slot_at(2)), (5, None, 3, 2));
        let pairs: Vec<usize> = s.pairs_mut().map(|(i, v)| i * 10 + *v).collect();
        assert_eq!(pairs, vec![1, 15, 23]);
    }
}
