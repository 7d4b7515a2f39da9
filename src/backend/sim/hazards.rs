//! The hazard model: a vector-clock detector over shadow memory that finds
//! every pair of unordered accesses to the same bytes, at least one a
//! write.

use std::collections::BTreeMap;
use std::fmt;

use super::clock::Access;

/// Two unordered accesses to the same bytes, at least one a write.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Hazard {
    /// Stream of the earlier-submitted access.
    pub first_stream: usize,
    /// Whether it wrote.
    pub first_writes: bool,
    /// Stream of the later-submitted access.
    pub second_stream: usize,
    /// Whether it wrote.
    pub second_writes: bool,
    /// First overlapping byte address.
    pub addr: u64,
}

impl fmt::Display for Hazard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rw = |w| if w { "write" } else { "read" };
        write!(
            f,
            "{} on stream {} and {} on stream {} touch {:#x} unordered",
            rw(self.first_writes),
            self.first_stream,
            rw(self.second_writes),
            self.second_stream,
            self.addr
        )
    }
}

/// Shadow state of one byte interval `[start, end)`.
#[derive(Clone, Debug, Default)]
pub(super) struct Cell {
    end: u64,
    /// The last write.
    writer: Option<Access>,
    /// Reads since the last write: the latest per stream (an op unordered
    /// with an earlier read of a stream is unordered with its later ones).
    readers: Vec<Access>,
}

impl Cell {
    fn is_empty(&self) -> bool {
        self.writer.is_none() && self.readers.is_empty()
    }

    /// Checks an access starting at byte `start` of this cell against the
    /// cell's write (and, for a write, its reads), noting each unordered one
    /// in `conflicts` once per (stream, whether it wrote); a read joins the
    /// cell's reads.
    fn visit(
        &mut self,
        start: u64,
        write: bool,
        access: Access,
        clock: &[u64],
        conflicts: &mut Vec<(Access, bool, u64)>,
    ) {
        let mut note = |earlier: Access, wrote: bool| {
            let seen = conflicts
                .iter()
                .any(|(a, w, _)| a.stream == earlier.stream && *w == wrote);
            if !seen {
                conflicts.push((earlier, wrote, start));
            }
        };
        if let Some(w) = self.writer {
            if !w.ordered_before(clock) {
                note(w, true);
            }
        }
        if write {
            for &r in &self.readers {
                if !r.ordered_before(clock) {
                    note(r, false);
                }
            }
        } else {
            match self.readers.iter_mut().find(|r| r.stream == access.stream) {
                Some(r) => r.seq = access.seq,
                None => self.readers.push(access),
            }
        }
    }
}

/// Disjoint byte intervals `start -> cell`, covering every byte accessed
/// since the last synchronize (less what pruning proved ordered).
#[derive(Default)]
pub(super) struct Shadow {
    pub(super) cells: BTreeMap<u64, Cell>,
    /// Prune when the map grows past this (doubles with the live size, so
    /// pruning costs amortized `O(1)` per access).
    prune_at: usize,
}

/// The least size at which the shadow is pruned.
const PRUNE_AT_LEAST: usize = 4096;

impl Shadow {
    /// Splits the cell that straddles `at`, if any.
    fn split(&mut self, at: u64) {
        let Some((_, cell)) = self.cells.range_mut(..at).next_back() else {
            return;
        };
        if cell.end > at {
            let upper = cell.clone();
            cell.end = at;
            self.cells.insert(at, upper);
        }
    }

    /// Records an access of `[lo, hi)` by `access` (whose stream's vector
    /// clock is `clock`) and adds to `conflicts` the earlier accesses it is
    /// unordered with, once per (stream, whether it wrote), with the first
    /// byte each touches.
    pub(super) fn access(
        &mut self,
        (lo, hi): (u64, u64),
        write: bool,
        access: Access,
        clock: &[u64],
        conflicts: &mut Vec<(Access, bool, u64)>,
    ) {
        if lo >= hi {
            // An empty span touches no byte.
            return;
        }
        // Fast path: the bytes are one cell already (a graph replayed over
        // the same views).
        if let Some(cell) = self.cells.get_mut(&lo).filter(|c| c.end == hi) {
            cell.visit(lo, write, access, clock, conflicts);
            if write {
                cell.writer = Some(access);
                cell.readers.clear();
            }
            return;
        }
        self.split(lo);
        self.split(hi);
        // Fill the gaps so that [lo, hi) is covered by cells.
        let mut gaps = Vec::new();
        let mut cursor = lo;
        for (&start, cell) in self.cells.range(lo..hi) {
            if start > cursor {
                gaps.push((cursor, start));
            }
            cursor = cell.end;
        }
        if cursor < hi {
            gaps.push((cursor, hi));
        }
        for (start, end) in gaps {
            self.cells.insert(
                start,
                Cell {
                    end,
                    ..Cell::default()
                },
            );
        }
        for (&start, cell) in self.cells.range_mut(lo..hi) {
            cell.visit(start, write, access, clock, conflicts);
        }
        if write {
            let inside: Vec<u64> = self.cells.range(lo..hi).map(|(&s, _)| s).collect();
            for start in inside {
                self.cells.remove(&start);
            }
            self.cells.insert(
                lo,
                Cell {
                    end: hi,
                    writer: Some(access),
                    readers: Vec::new(),
                },
            );
        }
    }

    /// Forgets accesses every stream is ordered after (no later op of these
    /// streams can be unordered with them) once the map has grown enough.
    /// `clocks` are the streams' vector clocks.
    pub(super) fn maybe_prune<'c>(&mut self, clocks: impl Iterator<Item = &'c [u64]> + Clone) {
        if self.cells.len() < self.prune_at.max(PRUNE_AT_LEAST) {
            return;
        }
        let stale = |a: &Access| clocks.clone().all(|clock| a.ordered_before(clock));
        self.cells.retain(|_, cell| {
            if cell.writer.as_ref().is_some_and(stale) {
                cell.writer = None;
            }
            cell.readers.retain(|r| !stale(r));
            !cell.is_empty()
        });
        self.prune_at = 2 * self.cells.len();
    }

    pub(super) fn clear(&mut self) {
        self.cells.clear();
    }
}
