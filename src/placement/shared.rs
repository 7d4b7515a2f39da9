//! One placement for a key's runner bytes and its handoffs, in the same
//! arenas, so that bytes free during a handoff's life are reused.
//!
//! Both kinds of buffer are intervals of one timeline, the runner slots in
//! capture order ([`Timeline`]): the bytes of the buffer-using runner at
//! position `k` are live from its slot to just before the slot of position
//! `k + G` (the first runner that may reuse them without waiting for one it
//! could overlap; the last `G` runners' bytes stay live to the end), and a
//! handoff from its writer's slot to its last reader's slot plus `G - 1`
//! (the runners that may be in flight with the reader). Buffers whose
//! intervals meet get disjoint bytes; the lower bound is the most bytes
//! live at one point of the timeline ([`lower_bound_shared`]), which for
//! runner bytes alone is the heaviest window of `G` consecutive runners.
//!
//! Packed placement ([`packed_shared`]) lays the runner bytes out as it
//! always has ([`packed_column`](super::packed_column)), puts the handoffs
//! on top where the separate arena was (what the separate placement cost),
//! takes round-robin's layout with its handoffs end to end if that is
//! smaller (so packed is never larger than round-robin), then fills the handoffs in around the runners (in order of that layout's
//! offset, which never raises one, then in order of start and by size),
//! settles runners and handoffs together, and for a few buffers searches
//! exactly ([`exact`](super::exact)). Round-robin ([`round_robin_shared`])
//! keeps every runner at the start of its generation's arena and fills the
//! handoffs in around them, on top of one arena or wherever an arena grows
//! least, each arena settled.
//!
//! Every pass beyond the first layout spends from a work budget, counted
//! in the (buffer, buffer) pairs it visits, so a plan with handoffs costs
//! its size plus a bounded search.

use std::cmp::Reverse;
use std::collections::HashMap;

use super::{
    choose_gap, exact, heaviest_window, neighbours, packed_column, place_intervals,
    round_robin_arenas, Column, Fit, Interval, Work,
};

/// The end of the timeline: the last `G` runners' bytes live to it.
pub(crate) const FOREVER: usize = usize::MAX;

/// The capture-order timeline of one plan: the slot (index among all
/// runners) of each buffer-using position, and `G`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Timeline {
    slots: Vec<usize>,
    g: usize,
}

impl Timeline {
    /// The timeline of buffer-using runners at `slots` (ascending), with
    /// `g` runners in flight.
    pub(crate) fn new(slots: Vec<usize>, g: usize) -> Timeline {
        Timeline { slots, g }
    }

    /// `[start, end]` (inclusive) over which the bytes of the runner at
    /// position `k` are live.
    pub(crate) fn window(&self, k: usize) -> (usize, usize) {
        let end = self
            .slots
            .get(k.saturating_add(self.g))
            .map_or(FOREVER, |&s| s - 1);
        (self.slots[k], end)
    }
}

/// Offsets of one key's runner entries and handoffs in one arena (packed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SharedLayout {
    /// The offset of each column entry, in column order.
    pub(crate) runners: Vec<u64>,
    /// The offset of each handoff, in input order.
    pub(crate) handoffs: Vec<u64>,
    /// Bytes of the arena.
    pub(crate) bytes: u64,
}

/// One key's round-robin arenas with its handoffs among them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RoundRobinShared {
    /// `(generation, bytes)` of each arena in generation order; a key that
    /// only handoffs use has one arena of no generation.
    pub(crate) arenas: Vec<(Option<usize>, u64)>,
    /// `(index into arenas, offset)` of each handoff, in input order.
    pub(crate) handoffs: Vec<(usize, u64)>,
}

impl RoundRobinShared {
    /// Total bytes (saturating).
    pub(crate) fn bytes(&self) -> u64 {
        self.arenas.iter().map(|a| a.1).fold(0, u64::saturating_add)
    }
}

/// The runner bytes of `column` and `handoffs` as intervals: runners in
/// column order, then handoffs.
fn intervals(column: &Column, handoffs: &[Interval], t: &Timeline) -> Vec<(usize, usize, u64)> {
    column
        .entries()
        .map(|(k, c)| {
            let (s, e) = t.window(k);
            (s, e, c)
        })
        .chain(handoffs.iter().map(|h| (h.start, h.end, h.bytes)))
        .collect()
}

/// The lower bound of one key with its handoffs: the most bytes live at
/// one point of the timeline (saturating at `u64::MAX`). Without handoffs,
/// the heaviest window of `G` consecutive runners.
pub(crate) fn lower_bound_shared(column: &Column, handoffs: &[Interval], t: &Timeline) -> u64 {
    if handoffs.is_empty() {
        return u64::try_from(heaviest_window(column, t.g)).unwrap_or(u64::MAX);
    }
    u64::try_from(most_live(&intervals(column, handoffs, t))).unwrap_or(u64::MAX)
}

/// The most bytes live at one point over `items`.
fn most_live(items: &[(usize, usize, u64)]) -> u128 {
    // (time, 0 = ends before it, 1 = starts, bytes): at one point, buffers
    // that ended just before go first.
    let mut events: Vec<(usize, u8, u64)> = Vec::with_capacity(2 * items.len());
    for &(s, e, b) in items {
        events.push((s, 1, b));
        if e != FOREVER {
            events.push((e + 1, 0, b));
        }
    }
    events.sort_unstable();
    let (mut now, mut most) = (0u128, 0u128);
    for (_, starts, b) in events {
        if starts == 1 {
            now += u128::from(b);
            most = most.max(now);
        } else {
            now -= u128::from(b);
        }
    }
    most
}

/// Who meets whom among one key's runner entries and handoffs.
struct Meetings {
    /// Per handoff, the column entries `lo..hi` whose runner bytes it meets.
    runners: Vec<(usize, usize)>,
    /// Per handoff, the handoffs it meets.
    handoffs: Vec<Vec<u32>>,
    /// (runner, handoff) pairs that meet.
    runner_pairs: u64,
    /// (handoff, handoff) pairs that meet, counted both ways.
    handoff_pairs: u64,
}

impl Meetings {
    /// The meetings, if counting and listing them fits in `work`.
    fn new(
        column: &Column,
        handoffs: &[Interval],
        t: &Timeline,
        work: &mut Work,
    ) -> Option<Meetings> {
        let len = column.len();
        let start = |i: usize| t.window(column.pos[i]).0;
        let end = |i: usize| t.window(column.pos[i]).1;
        // Both ends of runner windows grow with the position: the runners
        // a handoff meets are one run of entries.
        let runners: Vec<(usize, usize)> = handoffs
            .iter()
            .map(|h| {
                let lo = partition(len, |i| end(i) < h.start);
                let hi = partition(len, |i| start(i) <= h.end);
                (lo, hi.max(lo))
            })
            .collect();
        let runner_pairs: u64 = runners.iter().map(|&(lo, hi)| (hi - lo) as u64).sum();
        let mut by_start: Vec<usize> = (0..handoffs.len()).collect();
        by_start.sort_by_key(|&i| (handoffs[i].start, i));
        let starts: Vec<usize> = by_start.iter().map(|&i| handoffs[i].start).collect();
        // Handoff `by_start[a]` meets the later-starting ones up to its end.
        let reach: Vec<usize> = (0..by_start.len())
            .map(|a| a + 1 + starts[a + 1..].partition_point(|&s| s <= handoffs[by_start[a]].end))
            .collect();
        let handoff_pairs: u64 = reach
            .iter()
            .enumerate()
            .map(|(a, &r)| 2 * (r - a - 1) as u64)
            .sum();
        let cost = (handoffs.len() as u64)
            .saturating_add(runner_pairs)
            .saturating_add(handoff_pairs);
        if !work.spend(cost) {
            return None;
        }
        let mut lists = vec![Vec::new(); handoffs.len()];
        for a in 0..by_start.len() {
            for &j in &by_start[a + 1..reach[a]] {
                let i = by_start[a];
                lists[i].push(j as u32);
                lists[j].push(i as u32);
            }
        }
        Some(Meetings {
            runners,
            handoffs: lists,
            runner_pairs,
            handoff_pairs,
        })
    }

    /// What one pass placing every handoff visits.
    fn fill_cost(&self) -> u64 {
        self.runner_pairs.saturating_add(self.handoff_pairs)
    }
}

/// The first index in `0..len` where `below` stops holding (it holds on a
/// prefix).
fn partition(len: usize, below: impl Fn(usize) -> bool) -> usize {
    let (mut lo, mut hi) = (0, len);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if below(mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// Packed: one arena per key for its runner bytes and its handoffs, never
/// larger than the runner layout with the separate handoff placement on top
/// nor than round-robin with its handoffs (both are candidates), spending
/// `work` on the runner layout (as [`packed_column`]), `handoff_work` on
/// the rest, and `exact` steps of the exact search on each of the runner
/// layout and, where it has at most [`exact::MOST`] buffers, the whole key. `round_robin`: [`round_robin_shared`] of the same input with
/// `handoff_work`, where the caller has it (a round-robin plan's report),
/// else computed here. `None` on overflow. Deterministic.
pub(crate) fn packed_shared(
    column: &Column,
    handoffs: &[Interval],
    t: &Timeline,
    (work, handoff_work, exact): (u64, u64, u64),
    round_robin: Option<RoundRobinShared>,
) -> Option<SharedLayout> {
    let runners = packed_column(column, t.g, work, exact)?;
    if handoffs.is_empty() {
        return Some(SharedLayout {
            runners: runners.offsets,
            handoffs: Vec::new(),
            bytes: runners.bytes,
        });
    }
    let bound = lower_bound_shared(column, handoffs, t);
    let separate = place_intervals(handoffs)?;
    let separate_bytes = separate.1;
    let stacked = SharedLayout {
        handoffs: separate
            .0
            .iter()
            .map(|&o| runners.bytes.checked_add(o))
            .collect::<Option<Vec<u64>>>()?,
        runners: runners.offsets,
        bytes: runners.bytes.checked_add(separate_bytes)?,
    };
    let mut best = stacked;
    let mut work = Work(handoff_work);
    if best.bytes <= bound {
        return Some(best);
    }
    let offer = |best: &mut SharedLayout, c: Option<SharedLayout>| {
        if let Some(c) = c {
            if c.bytes < best.bytes {
                *best = c;
            }
        }
    };
    // Round-robin's layout with its handoffs, its arenas end to end: so
    // packed is never larger than round-robin, handoffs included.
    let rr = match round_robin {
        Some(rr) => Some(rr),
        None => round_robin_around(column, handoffs, t, handoff_work, separate),
    };
    offer(&mut best, rr.and_then(|rr| end_to_end(column, t, &rr)));
    if best.bytes <= bound {
        return Some(best);
    }
    let Some(meet) = Meetings::new(column, handoffs, t, &mut work) else {
        return Some(best);
    };
    // Around the runners: in the separate layout's order of offset first
    // (each handoff's old place is still free then, so none moves up).
    let mut stacked_order: Vec<usize> = (0..handoffs.len()).collect();
    stacked_order.sort_by_key(|&i| (best.handoffs[i], i));
    let mut by_start: Vec<usize> = (0..handoffs.len()).collect();
    by_start.sort_by_key(|&i| (handoffs[i].start, i));
    let mut by_size: Vec<usize> = (0..handoffs.len()).collect();
    by_size.sort_by_key(|&i| (Reverse(handoffs[i].bytes), handoffs[i].start, i));
    for order in [&stacked_order, &by_start, &by_size] {
        if best.bytes <= bound || !work.spend(meet.fill_cost()) {
            break;
        }
        let c = fill_around(column, handoffs, &meet, &best.runners, order);
        offer(&mut best, c);
    }
    // Runners and handoffs together, in order of the best layout's offset.
    let settle_cost = neighbours(column, t.g)
        .saturating_add(2 * meet.fill_cost())
        .saturating_add(column.len() as u64);
    if best.bytes > bound && work.spend(settle_cost) {
        let c = settle_all(column, handoffs, t, &meet, &best);
        offer(&mut best, c);
    }
    if best.bytes > bound && column.len() + handoffs.len() <= exact::MOST && exact > 0 {
        let items = intervals(column, handoffs, t);
        if let Some((offsets, bytes)) =
            exact::search(&items, best.bytes, bound, &mut Work(exact)).layout
        {
            let (r, h) = offsets.split_at(column.len());
            offer(
                &mut best,
                Some(SharedLayout {
                    runners: r.to_vec(),
                    handoffs: h.to_vec(),
                    bytes,
                }),
            );
        }
    }
    Some(best)
}

/// A round-robin layout as one arena: its arenas laid end to end.
fn end_to_end(column: &Column, t: &Timeline, rr: &RoundRobinShared) -> Option<SharedLayout> {
    let mut base = Vec::with_capacity(rr.arenas.len());
    let mut top = 0u64;
    for &(_, bytes) in &rr.arenas {
        base.push(top);
        top = top.checked_add(bytes)?;
    }
    let gens: Vec<Option<usize>> = rr.arenas.iter().map(|a| a.0).collect();
    let runners = column
        .entries()
        .map(|(k, _)| {
            let gen = Some(k % t.g);
            gens.binary_search(&gen).ok().map(|a| base[a])
        })
        .collect::<Option<Vec<u64>>>()?;
    Some(SharedLayout {
        runners,
        handoffs: rr.handoffs.iter().map(|&(a, o)| base[a] + o).collect(),
        bytes: top,
    })
}

/// The handoffs placed in `order`, each at the lowest offset free of the
/// runners it meets (fixed at `runners`) and of the handoffs placed before
/// it.
fn fill_around(
    column: &Column,
    handoffs: &[Interval],
    meet: &Meetings,
    runners: &[u64],
    order: &[usize],
) -> Option<SharedLayout> {
    let mut offsets = vec![0u64; handoffs.len()];
    let mut placed = vec![false; handoffs.len()];
    let mut bytes = runners
        .iter()
        .zip(&column.cap)
        .map(|(&o, &c)| o + c)
        .max()
        .unwrap_or(0);
    let mut busy = Vec::new();
    for &h in order {
        busy.clear();
        let (lo, hi) = meet.runners[h];
        busy.extend((lo..hi).map(|i| (runners[i], runners[i] + column.cap[i])));
        busy.extend(
            meet.handoffs[h]
                .iter()
                .map(|&j| j as usize)
                .filter(|&j| placed[j])
                .map(|j| (offsets[j], offsets[j] + handoffs[j].bytes)),
        );
        busy.sort_unstable();
        let at = choose_gap(&busy, handoffs[h].bytes, Fit::First)?;
        offsets[h] = at;
        placed[h] = true;
        bytes = bytes.max(at.checked_add(handoffs[h].bytes)?);
    }
    Some(SharedLayout {
        runners: runners.to_vec(),
        handoffs: offsets,
        bytes,
    })
}

/// Every runner entry and handoff of `layout` re-placed in order of its
/// offset at the lowest offset free of those placed before it that it
/// meets: no buffer moves up (its old place is still free when its turn
/// comes), so the result is never larger.
fn settle_all(
    column: &Column,
    handoffs: &[Interval],
    t: &Timeline,
    meet: &Meetings,
    layout: &SharedLayout,
) -> Option<SharedLayout> {
    let len = column.len();
    // Per entry, the handoffs it meets.
    let mut of_entry: Vec<Vec<u32>> = vec![Vec::new(); len];
    for (h, &(lo, hi)) in meet.runners.iter().enumerate() {
        for list in &mut of_entry[lo..hi] {
            list.push(h as u32);
        }
    }
    // Items: entries 0..len, then handoffs len.. .
    let offset_of = |i: usize| {
        if i < len {
            layout.runners[i]
        } else {
            layout.handoffs[i - len]
        }
    };
    let mut order: Vec<usize> = (0..len + handoffs.len()).collect();
    order.sort_by_key(|&i| (offset_of(i), i));
    let mut runners = vec![0u64; len];
    let mut offsets = vec![0u64; handoffs.len()];
    let mut placed = vec![false; len + handoffs.len()];
    let mut bytes = 0u64;
    let mut busy: Vec<(u64, u64)> = Vec::new();
    let pos = &column.pos;
    for i in order {
        busy.clear();
        let size = if i < len {
            let near = |j: &usize| pos[i].abs_diff(pos[*j]) < t.g;
            for j in (0..i)
                .rev()
                .take_while(near)
                .chain((i + 1..len).take_while(near))
            {
                if placed[j] {
                    busy.push((runners[j], runners[j] + column.cap[j]));
                }
            }
            for &h in &of_entry[i] {
                let h = h as usize;
                if placed[len + h] {
                    busy.push((offsets[h], offsets[h] + handoffs[h].bytes));
                }
            }
            column.cap[i]
        } else {
            let h = i - len;
            let (lo, hi) = meet.runners[h];
            for j in lo..hi {
                if placed[j] {
                    busy.push((runners[j], runners[j] + column.cap[j]));
                }
            }
            for &k in &meet.handoffs[h] {
                let k = k as usize;
                if placed[len + k] {
                    busy.push((offsets[k], offsets[k] + handoffs[k].bytes));
                }
            }
            handoffs[h].bytes
        };
        busy.sort_unstable();
        let at = choose_gap(&busy, size, Fit::First)?;
        if i < len {
            runners[i] = at;
        } else {
            offsets[i - len] = at;
        }
        placed[i] = true;
        bytes = bytes.max(at.checked_add(size)?);
    }
    Some(SharedLayout {
        runners,
        handoffs: offsets,
        bytes,
    })
}

/// Round-robin: every runner at the start of its generation's arena (the
/// max over its runners, as ever), the handoffs filled in around them:
/// never more than those arenas plus the separate handoff placement (one
/// of the candidates: it on top of the largest arena). A key only handoffs
/// use gets one arena of no generation. `None` on overflow. Deterministic.
pub(crate) fn round_robin_shared(
    column: &Column,
    handoffs: &[Interval],
    t: &Timeline,
    handoff_work: u64,
) -> Option<RoundRobinShared> {
    round_robin_around(
        column,
        handoffs,
        t,
        handoff_work,
        place_intervals(handoffs)?,
    )
}

/// [`round_robin_shared`] given the separate placement of the handoffs
/// ([`place_intervals`]).
fn round_robin_around(
    column: &Column,
    handoffs: &[Interval],
    t: &Timeline,
    handoff_work: u64,
    (separate, separate_bytes): (Vec<u64>, u64),
) -> Option<RoundRobinShared> {
    let g = t.g;
    let runner_arenas = round_robin_arenas(column, g);
    let arenas: Vec<(Option<usize>, u64)> = runner_arenas
        .iter()
        .map(|&(gen, b)| (Some(gen), b))
        .collect();
    if handoffs.is_empty() {
        return Some(RoundRobinShared {
            arenas,
            handoffs: Vec::new(),
        });
    }
    if arenas.is_empty() {
        return Some(RoundRobinShared {
            arenas: vec![(None, separate_bytes)],
            handoffs: separate.into_iter().map(|o| (0, o)).collect(),
        });
    }
    let best = stacked(&arenas, &separate, separate_bytes)?;
    let bound = lower_bound_shared(column, handoffs, t);
    let mut work = Work(handoff_work);
    if best.bytes() <= bound {
        return Some(best);
    }
    let Some(meet) = Meetings::new(column, handoffs, t, &mut work) else {
        return Some(best);
    };
    // Per handoff, (arena, the largest runner of its generation it meets),
    // sparse and by arena.
    if !work.spend(meet.runner_pairs) {
        return Some(best);
    }
    let gens: Vec<usize> = runner_arenas.iter().map(|&(gen, _)| gen).collect();
    let obstacles = obstacles(column, &meet, &gens, g);
    let fill = Fill {
        handoffs,
        meet: &meet,
        obstacles: &obstacles,
        runner_bytes: &arenas,
    };
    Some(fill.improve(best, bound, &mut work))
}

/// The separate handoff placement on top of the largest of the runners'
/// `arenas` (ties: the lowest generation). `None` on overflow.
fn stacked(
    arenas: &[(Option<usize>, u64)],
    separate: &[u64],
    separate_bytes: u64,
) -> Option<RoundRobinShared> {
    let top = (0..arenas.len())
        .max_by_key(|&a| (arenas[a].1, Reverse(a)))
        .unwrap_or(0);
    let base = arenas[top].1;
    let mut stacked = RoundRobinShared {
        handoffs: separate
            .iter()
            .map(|&o| Some((top, base.checked_add(o)?)))
            .collect::<Option<Vec<_>>>()?,
        arenas: arenas.to_vec(),
    };
    stacked.arenas[top].1 = base.checked_add(separate_bytes)?;
    Some(stacked)
}

/// Per handoff, (arena, the largest runner of its generation it meets),
/// sparse and by arena: the runners `meet` finds, in the arenas of the
/// generations `gens` (ascending) at `G = g`.
fn obstacles(column: &Column, meet: &Meetings, gens: &[usize], g: usize) -> Vec<Vec<(usize, u64)>> {
    meet.runners
        .iter()
        .map(|&(lo, hi)| {
            let mut v: Vec<(usize, u64)> = (lo..hi)
                .map(|i| {
                    let gen = column.pos[i] % g;
                    (gens.binary_search(&gen).unwrap_or(0), column.cap[i])
                })
                .collect();
            // The largest of each arena last among its equals: keep it.
            v.sort_unstable();
            v.reverse();
            v.dedup_by_key(|&mut (a, _)| a);
            v.reverse();
            v
        })
        .collect()
}

impl Fill<'_> {
    /// `best` (the stacked layout), improved while it is above `bound`
    /// and `work` lasts: settled in its arena (never larger), then greedy
    /// fills over every arena (handoffs by start, then by size), each
    /// settled; the smallest wins.
    fn improve(&self, mut best: RoundRobinShared, bound: u64, work: &mut Work) -> RoundRobinShared {
        let (handoffs, meet) = (self.handoffs, self.meet);
        let arenas = self.runner_bytes.len();
        let offer = |best: &mut RoundRobinShared, c: Option<RoundRobinShared>| {
            if let Some(c) = c {
                if c.bytes() < best.bytes() {
                    *best = c;
                }
            }
        };
        if work.spend(meet.fill_cost()) {
            let c = self.settle(&best);
            offer(&mut best, c);
        }
        let mut by_start: Vec<usize> = (0..handoffs.len()).collect();
        by_start.sort_by_key(|&i| (handoffs[i].start, i));
        let mut by_size: Vec<usize> = (0..handoffs.len()).collect();
        by_size.sort_by_key(|&i| (Reverse(handoffs[i].bytes), handoffs[i].start, i));
        let greedy_cost = (handoffs.len() as u64)
            .saturating_mul(arenas as u64)
            .saturating_add(meet.fill_cost().saturating_mul(arenas as u64 + 1));
        for order in [&by_start, &by_size] {
            if best.bytes() <= bound || !work.spend(greedy_cost) {
                break;
            }
            let c = self.greedy(order).and_then(|c| self.settle(&c));
            offer(&mut best, c);
        }
        best
    }
}

/// What the round-robin fills need.
struct Fill<'a> {
    handoffs: &'a [Interval],
    meet: &'a Meetings,
    /// Per handoff, (arena, the largest runner of its generation it meets).
    obstacles: &'a [Vec<(usize, u64)>],
    /// The arenas as the runners need them.
    runner_bytes: &'a [(Option<usize>, u64)],
}

impl Fill<'_> {
    /// Runner bytes handoff `h` must avoid in arena `a`: `[0, this)`.
    fn obstacle(&self, h: usize, a: usize) -> u64 {
        let list = &self.obstacles[h];
        list.binary_search_by_key(&a, |&(x, _)| x)
            .map_or(0, |at| list[at].1)
    }

    /// The lowest offset of arena `a` free for handoff `h` among the
    /// runners there and the placed handoffs there that it meets.
    fn lowest(
        &self,
        h: usize,
        a: usize,
        places: &[Option<(usize, u64)>],
        busy: &mut Vec<(u64, u64)>,
    ) -> Option<u64> {
        busy.clear();
        let wall = self.obstacle(h, a);
        if wall > 0 {
            busy.push((0, wall));
        }
        for &j in &self.meet.handoffs[h] {
            let j = j as usize;
            if let Some((aj, o)) = places[j] {
                if aj == a {
                    busy.push((o, o + self.handoffs[j].bytes));
                }
            }
        }
        busy.sort_unstable();
        choose_gap(busy, self.handoffs[h].bytes, Fit::First)
    }

    /// Arenas sized for `places`.
    fn layout(&self, places: Vec<Option<(usize, u64)>>) -> Option<RoundRobinShared> {
        let mut arenas = self.runner_bytes.to_vec();
        let mut handoffs = Vec::with_capacity(places.len());
        for (h, place) in places.into_iter().enumerate() {
            let (a, o) = place?;
            arenas[a].1 = arenas[a].1.max(o.checked_add(self.handoffs[h].bytes)?);
            handoffs.push((a, o));
        }
        Some(RoundRobinShared { arenas, handoffs })
    }

    /// Each handoff, in order of its offset in `layout`, re-placed in its
    /// arena at the lowest free offset: none moves up.
    fn settle(&self, layout: &RoundRobinShared) -> Option<RoundRobinShared> {
        let mut order: Vec<usize> = (0..self.handoffs.len()).collect();
        order.sort_by_key(|&h| (layout.handoffs[h].1, h));
        let mut places: Vec<Option<(usize, u64)>> = vec![None; self.handoffs.len()];
        let mut busy = Vec::new();
        for h in order {
            let a = layout.handoffs[h].0;
            places[h] = Some((a, self.lowest(h, a, &places, &mut busy)?));
        }
        self.layout(places)
    }

    /// Each handoff, in `order`, where its arena grows least (ties: the
    /// lower offset, then the earlier arena).
    fn greedy(&self, order: &[usize]) -> Option<RoundRobinShared> {
        let mut sizes: Vec<u64> = self.runner_bytes.iter().map(|a| a.1).collect();
        let mut places: Vec<Option<(usize, u64)>> = vec![None; self.handoffs.len()];
        let mut busy = Vec::new();
        for &h in order {
            let bytes = self.handoffs[h].bytes;
            let mut choice: Option<(u64, u64, usize)> = None;
            for (a, &size) in sizes.iter().enumerate() {
                let o = self.lowest(h, a, &places, &mut busy)?;
                let grow = (o + bytes).saturating_sub(size);
                if choice.is_none_or(|c| (grow, o, a) < c) {
                    choice = Some((grow, o, a));
                }
            }
            let (_, o, a) = choice?;
            sizes[a] = sizes[a].max(o + bytes);
            places[h] = Some((a, o));
        }
        self.layout(places)
    }
}

/// A bound above the lower bound, and what proves it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Proof {
    /// No placement of the key needs fewer bytes.
    pub(crate) bytes: u64,
    /// The slots of the first and last buffer the exact search looked at:
    /// those buffers alone need `bytes`. `None`: the lower bound itself.
    pub(crate) span: Option<(usize, usize)>,
}

/// Buffers in one exact search of [`best_bound`].
pub(crate) const BOUND_ITEMS: usize = 12;

/// Runs of distinct shape [`best_bound`] searches, at most.
pub(crate) const BOUND_RUNS: usize = 64;

/// The best lower bound of one key found within `work`: the most live
/// bytes, or more where runs of [`BOUND_ITEMS`] buffers (consecutive in
/// order of start) need more than that alone (the optimum of a part is a
/// lower bound of the whole), searched exactly, heaviest runs first (by the
/// bytes of their buffers; at most [`BOUND_RUNS`] of distinct shape), until
/// one reaches `target` (a layout's size: nothing can prove more). Runs
/// that fit within `G` buffers are cliques (they prove nothing beyond the
/// lower bound) and are not searched. Where no run proves `target` and the
/// key has at most [`exact::MOST`] buffers, the whole key is searched
/// exactly within `exact` steps: a search that ends without a layout below
/// `target` proves `target` (the span is then every buffer of the key).
pub(crate) fn best_bound(
    column: &Column,
    handoffs: &[Interval],
    t: &Timeline,
    target: u64,
    (work, exact): (u64, u64),
) -> Proof {
    let mut proof = runs_bound(column, handoffs, t, target, work);
    if proof.bytes < target && column.len() + handoffs.len() <= exact::MOST && exact > 0 {
        let items = intervals(column, handoffs, t);
        let found = exact::search(&items, target, proof.bytes, &mut Work(exact));
        if found.complete && found.layout.is_none() {
            let first = items.iter().map(|it| it.0).min().unwrap_or(0);
            let last = items.iter().map(|it| it.0).max().unwrap_or(0);
            proof = Proof {
                bytes: target,
                span: Some((first, last)),
            };
        }
    }
    proof
}

/// [`best_bound`] from runs of [`BOUND_ITEMS`] buffers only.
fn runs_bound(
    column: &Column,
    handoffs: &[Interval],
    t: &Timeline,
    target: u64,
    work: u64,
) -> Proof {
    let lower = lower_bound_shared(column, handoffs, t);
    let mut proof = Proof {
        bytes: lower,
        span: None,
    };
    let mut items = intervals(column, handoffs, t);
    let m = BOUND_ITEMS.min(items.len());
    if lower >= target || m <= t.g || items.len() > 4_000_000 {
        return proof;
    }
    let mut work = Work(work);
    if !work.spend(items.len() as u64 * m as u64) {
        return proof;
    }
    items.sort_unstable();
    // Runs by weight (the bytes of their buffers), heaviest first.
    let mut weight: u128 = items[..m].iter().map(|it| u128::from(it.2)).sum();
    let mut runs: Vec<(Reverse<u128>, usize)> = Vec::with_capacity(items.len() - m + 1);
    for a in 0..=items.len() - m {
        if a > 0 {
            weight = weight - u128::from(items[a - 1].2) + u128::from(items[a + m - 1].2);
        }
        runs.push((Reverse(weight), a));
    }
    runs.sort_unstable();
    let mut seen: HashMap<Vec<(usize, usize, u64)>, ()> = HashMap::new();
    for (_, a) in runs {
        let run = &items[a..a + m];
        // The run's shape, from its first start: equal shapes, equal optima.
        let first = run[0].0;
        let last = run[m - 1].0;
        let shape: Vec<(usize, usize, u64)> = run
            .iter()
            .map(|&(s, e, b)| (s - first, e.min(last) - first, b))
            .collect();
        if seen.len() == BOUND_RUNS {
            break;
        }
        if seen.insert(shape.clone(), ()).is_some() {
            continue;
        }
        // Only a run that needs more than the bound so far helps: stop at
        // the first layout no higher than it.
        let found = exact::search(&shape, target, proof.bytes, &mut work);
        if !found.complete {
            if work.0 == 0 {
                break;
            }
            continue;
        }
        let need = found.layout.map_or(target, |(_, h)| h);
        if need > proof.bytes {
            proof = Proof {
                bytes: need,
                span: Some((first, last)),
            };
            if need >= target {
                break;
            }
        }
    }
    proof
}

#[cfg(test)]
mod tests {
    use super::super::EXACT_SEARCH;
    use super::*;

    /// Runners `caps` (one per slot, all buffer-using) and handoffs
    /// `(start, end, bytes)` already widened.
    fn key(caps: &[u64], g: usize) -> (Column, Timeline) {
        let column = Column::from_dense(caps);
        (column, Timeline::new((0..caps.len()).collect(), g))
    }

    fn interval(start: usize, end: usize, bytes: u64) -> Interval {
        Interval { start, end, bytes }
    }

    /// Panics unless buffers whose intervals meet are disjoint and inside
    /// the arena.
    fn assert_disjoint(column: &Column, handoffs: &[Interval], t: &Timeline, l: &SharedLayout) {
        let items = intervals(column, handoffs, t);
        let offsets: Vec<u64> = l.runners.iter().chain(&l.handoffs).copied().collect();
        for i in 0..items.len() {
            assert!(
                offsets[i] + items[i].2 <= l.bytes,
                "item {i} ends past the arena"
            );
            for j in 0..i {
                let meet = items[i].0 <= items[j].1 && items[j].0 <= items[i].1;
                let apart =
                    offsets[i] + items[i].2 <= offsets[j] || offsets[j] + items[j].2 <= offsets[i];
                assert!(!meet || apart, "{i} and {j} overlap: {items:?} {offsets:?}");
            }
        }
    }

    /// Panics unless, under round-robin, every runner sits at the start of
    /// its generation's arena, and buffers of one arena whose intervals
    /// meet are disjoint and inside it.
    fn assert_round_robin_disjoint(
        column: &Column,
        handoffs: &[Interval],
        t: &Timeline,
        l: &RoundRobinShared,
    ) {
        let items = intervals(column, handoffs, t);
        // (arena, offset) of every item.
        let places: Vec<(usize, u64)> = column
            .entries()
            .map(|(k, _)| {
                let a = l.arenas.iter().position(|a| a.0 == Some(k % t.g)).unwrap();
                (a, 0)
            })
            .chain(l.handoffs.iter().copied())
            .collect();
        for i in 0..items.len() {
            let (a, o) = places[i];
            assert!(
                o + items[i].2 <= l.arenas[a].1,
                "item {i} ends past its arena"
            );
            for j in 0..i {
                let (b, p) = places[j];
                let meet = items[i].0 <= items[j].1 && items[j].0 <= items[i].1;
                let apart = a != b || o + items[i].2 <= p || p + items[j].2 <= o;
                assert!(!meet || apart, "{i} and {j} overlap: {items:?} {places:?}");
            }
        }
    }

    #[test]
    fn a_handoff_reuses_bytes_a_small_runner_leaves_free() {
        // G = 2: runners 4, 1, 4, 1 units; a handoff of 3 written by runner
        // 1 and read by runner 2 lives over slots 1..=3. Apart it costs 3
        // more than the runners' 5; beside the small runners it fits in 8?
        // No: at slot 2 runners 1 and 2 (5) and the handoff (3) are live:
        // 8 is the bound, and the shared placement reaches it.
        let (column, t) = key(&[4, 1, 4, 1, 4], 2);
        let handoffs = [interval(1, 3, 3)];
        let separate = packed_column(&column, 2, u64::MAX, EXACT_SEARCH)
            .unwrap()
            .bytes
            + 3;
        let l = packed_shared(
            &column,
            &handoffs,
            &t,
            (u64::MAX, u64::MAX, EXACT_SEARCH),
            None,
        )
        .unwrap();
        assert_disjoint(&column, &handoffs, &t, &l);
        assert_eq!(lower_bound_shared(&column, &handoffs, &t), 8);
        assert_eq!(l.bytes, 8);
        assert_eq!(separate, 8);
    }

    #[test]
    fn a_long_handoff_fills_the_gap_above_small_runners() {
        // G = 1: runners 8, 2, 2, 2, 8; a handoff of 6 from runner 1 to 3
        // fits above the small runners: the arena stays 8 (apart: 14).
        let (column, t) = key(&[8, 2, 2, 2, 8], 1);
        let handoffs = [interval(1, 3, 6)];
        let l = packed_shared(
            &column,
            &handoffs,
            &t,
            (u64::MAX, u64::MAX, EXACT_SEARCH),
            None,
        )
        .unwrap();
        assert_disjoint(&column, &handoffs, &t, &l);
        assert_eq!(l.bytes, 8);
        let rr = round_robin_shared(&column, &handoffs, &t, u64::MAX).unwrap();
        assert_eq!(rr.bytes(), 8);
        assert_eq!(rr.arenas, vec![(Some(0), 8)]);
    }

    #[test]
    fn the_lower_bound_counts_runners_and_handoffs_live_together() {
        let (column, t) = key(&[4, 1, 4], 2);
        // Runner windows [0, 1], [1, 2], [2, forever]; handoffs at 0 and 2.
        let handoffs = [interval(0, 0, 10), interval(2, 2, 10)];
        assert_eq!(lower_bound_shared(&column, &handoffs, &t), 15);
        assert_eq!(lower_bound_shared(&column, &[], &t), 5);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

        #[test]
        fn shared_layouts_are_disjoint_and_between_the_bound_and_apart(
            caps in proptest::collection::vec(
                proptest::prop_oneof![proptest::strategy::Just(0u64), 1u64..16], 1..24),
            raw in proptest::collection::vec((0usize..24, 0usize..6, 1u64..16), 0..10),
            g in 1usize..5,
        ) {
            // Runners without buffers leave gaps in the slots of the users.
            let users: Vec<usize> = (0..caps.len()).filter(|&k| caps[k] > 0).collect();
            proptest::prop_assume!(!users.is_empty());
            let g = g.min(users.len());
            let mut column = Column::new(users.len());
            for (k, &u) in users.iter().enumerate() {
                column.push(k, caps[u]);
            }
            let t = Timeline::new(users.clone(), g);
            let handoffs: Vec<Interval> = raw
                .iter()
                .map(|&(s, l, b)| interval(s, s + l + g - 1, b))
                .collect();
            let l = packed_shared(&column, &handoffs, &t, (u64::MAX, u64::MAX, EXACT_SEARCH), None).unwrap();
            assert_disjoint(&column, &handoffs, &t, &l);
            let bound = lower_bound_shared(&column, &handoffs, &t);
            let apart = packed_column(&column, g, u64::MAX, EXACT_SEARCH).unwrap().bytes
                + place_intervals(&handoffs).unwrap().1;
            proptest::prop_assert!(bound <= l.bytes && l.bytes <= apart);
            let rr = round_robin_shared(&column, &handoffs, &t, u64::MAX).unwrap();
            assert_round_robin_disjoint(&column, &handoffs, &t, &rr);
            let rr_apart = super::super::round_robin_bytes(&column, g)
                + place_intervals(&handoffs).unwrap().1;
            proptest::prop_assert!(bound <= rr.bytes() && rr.bytes() <= rr_apart);
            proptest::prop_assert!(l.bytes <= rr.bytes());
            let proof = best_bound(&column, &handoffs, &t, l.bytes, (u64::MAX, EXACT_SEARCH));
            proptest::prop_assert!(bound <= proof.bytes && proof.bytes <= l.bytes);
        }
    }
}
