//! The vector clock: each stream counts its ops, and each stream and event
//! carries the count of every stream's ops ordered before it; an access is
//! ordered before an op when the op's clock has reached the access's count.

/// One access: its stream and that stream's sequence number for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Access {
    pub(super) stream: usize,
    pub(super) seq: u64,
}

impl Access {
    /// Whether an op with vector clock `clock` is ordered after this access.
    pub(super) fn ordered_before(&self, clock: &[u64]) -> bool {
        clock_at(clock, self.stream) >= self.seq
    }
}

/// Stream `stream`'s count in `clock` (0 for a stream the clock has not
/// heard of).
fn clock_at(clock: &[u64], stream: usize) -> u64 {
    clock.get(stream).copied().unwrap_or(0)
}

/// `into` becomes the pointwise max of `into` and `from`: ordered after
/// whatever either was ordered after.
pub(super) fn merge(into: &mut Vec<u64>, from: &[u64]) {
    if into.len() < from.len() {
        into.resize(from.len(), 0);
    }
    for (a, b) in into.iter_mut().zip(from) {
        *a = (*a).max(*b);
    }
}
