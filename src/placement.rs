//! Where each runner's bytes of one key go: the planner's cleverness.
//!
//! Both placements solve the same problem per key: runners are the
//! buffer-using runners in capture order (position `k`), each with a capacity
//! `cap[k]` (0 when it does not use the key); any `g` consecutive runners may
//! be in flight together, so their ranges must be pairwise disjoint.

/// Offsets and arena size for one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KeyLayout {
    /// One offset per runner position (meaningless where `cap` is 0).
    pub(crate) offsets: Vec<u64>,
    /// Bytes of the key's arena.
    pub(crate) bytes: u64,
}

/// Round-robin: position `k` goes to generation `k % g`; each generation's
/// arena is the max over its runners. Returns the arena size per generation.
pub(crate) fn round_robin(cap: &[u64], g: usize) -> Vec<u64> {
    let mut arenas = vec![0u64; g];
    for (k, &c) in cap.iter().enumerate() {
        let a = &mut arenas[k % g];
        *a = (*a).max(c);
    }
    arenas
}

/// The lower bound: the largest sum of capacities over any `g` consecutive
/// positions (no wrap-around).
pub(crate) fn lower_bound(cap: &[u64], g: usize) -> u64 {
    let mut best = 0u128;
    let mut window = 0u128;
    for (k, &c) in cap.iter().enumerate() {
        window += u128::from(c);
        if k >= g {
            window -= u128::from(cap[k - g]);
        }
        best = best.max(window);
    }
    u64::try_from(best).unwrap_or(u64::MAX)
}

/// Packed: per-runner offsets in one arena so that any `g` consecutive
/// runners are disjoint. Tries several placements and keeps the smallest;
/// the round-robin layout (generations laid end to end) is one of them, so
/// the result is never larger than round-robin. `None` on overflow.
pub(crate) fn packed(cap: &[u64], g: usize) -> Option<KeyLayout> {
    let n = cap.len();
    let in_capture_order: Vec<usize> = (0..n).collect();
    let mut by_size_desc = in_capture_order.clone();
    by_size_desc.sort_by(|&a, &b| cap[b].cmp(&cap[a]).then(a.cmp(&b)));

    let candidates = [
        fit(cap, g, &in_capture_order, Fit::First),
        fit(cap, g, &by_size_desc, Fit::First),
        fit(cap, g, &in_capture_order, Fit::Best),
        fit(cap, g, &by_size_desc, Fit::Best),
        round_robin_concatenated(cap, g),
    ];
    candidates.into_iter().flatten().min_by_key(|l| l.bytes)
}

/// The round-robin layout expressed as offsets in one arena.
fn round_robin_concatenated(cap: &[u64], g: usize) -> Option<KeyLayout> {
    let arenas = round_robin(cap, g);
    let mut starts = Vec::with_capacity(g);
    let mut total = 0u64;
    for a in &arenas {
        starts.push(total);
        total = total.checked_add(*a)?;
    }
    Some(KeyLayout {
        offsets: (0..cap.len()).map(|k| starts[k % g]).collect(),
        bytes: total,
    })
}

#[derive(Clone, Copy)]
enum Fit {
    /// Lowest gap that fits.
    First,
    /// Smallest gap that fits (ties: lowest); the top of the arena counts as
    /// an unbounded gap, used only when nothing else fits.
    Best,
}

/// Places runners in `order`; each avoids the ranges of already placed
/// runners within `g - 1` positions of it.
fn fit(cap: &[u64], g: usize, order: &[usize], how: Fit) -> Option<KeyLayout> {
    let n = cap.len();
    let mut offsets = vec![0u64; n];
    let mut placed = vec![false; n];
    let mut bytes = 0u64;
    let mut busy: Vec<(u64, u64)> = Vec::with_capacity(2 * g);
    for &k in order {
        let c = cap[k];
        if c == 0 {
            continue;
        }
        busy.clear();
        let lo = k.saturating_sub(g - 1);
        let hi = (k + g).min(n);
        for j in lo..hi {
            if placed[j] && cap[j] > 0 {
                busy.push((offsets[j], offsets[j] + cap[j]));
            }
        }
        busy.sort_unstable();
        let offset = choose_gap(&busy, c, how)?;
        offsets[k] = offset;
        placed[k] = true;
        bytes = bytes.max(offset.checked_add(c)?);
    }
    Some(KeyLayout { offsets, bytes })
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
