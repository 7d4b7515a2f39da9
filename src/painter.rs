//! Who last used which bytes: the bookkeeping behind the replay fence (and
//! the report's wait counts). Pure data, below the plan.
//!
//! A runner *claims* byte ranges of *fence regions*: under round-robin
//! placement, the whole of its generation (one region per generation, so one
//! wait per replay, as Megatron-LM's plan does); under packed placement, its slice of each
//! key's arena. The [`Painter`] remembers, for every region, which runner
//! last claimed each byte, as disjoint painted intervals.

use std::collections::BTreeMap;

/// A byte range `[lo, hi)` of fence region `region`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Claim {
    pub(crate) region: u32,
    pub(crate) lo: u64,
    pub(crate) hi: u64,
}

/// Per region, disjoint intervals `start -> (end, runner)`.
#[derive(Clone, Debug, Default)]
pub(crate) struct Painter {
    regions: Vec<Region>,
}

/// One region's painted intervals: at most one, kept inline (a round-robin
/// generation, claimed whole by whichever runner ran last), or any number
/// in a map (exact extents).
#[derive(Clone, Debug, Default)]
enum Region {
    #[default]
    Unpainted,
    /// `[lo, hi)` painted by `runner`, and nothing else.
    One {
        lo: u64,
        hi: u64,
        runner: u32,
    },
    Map(BTreeMap<u64, (u64, u32)>),
}

impl Region {
    /// The region's intervals as a map (an inline one moved into it).
    fn map_mut(&mut self) -> &mut BTreeMap<u64, (u64, u32)> {
        match self {
            Region::Map(map) => map,
            Region::Unpainted => {
                *self = Region::Map(BTreeMap::new());
                self.map_mut()
            }
            &mut Region::One { lo, hi, runner } => {
                *self = Region::Map(BTreeMap::from([(lo, (hi, runner))]));
                self.map_mut()
            }
        }
    }

    /// The intervals that meet `[lo, hi)`, highest first, as
    /// `(start, end, runner)`.
    fn meeting(&self, lo: u64, hi: u64) -> impl Iterator<Item = (u64, u64, u32)> + '_ {
        let (one, map) = match self {
            Region::Unpainted => (None, None),
            &Region::One {
                lo: s,
                hi: e,
                runner,
            } => ((s < hi && lo < e).then_some((s, e, runner)), None),
            Region::Map(map) => (None, Some(map)),
        };
        let mapped = map
            .into_iter()
            .flat_map(move |m| m.range(..hi).rev())
            .take_while(move |(_, &(end, _))| end > lo)
            .map(|(&start, &(end, runner))| (start, end, runner));
        one.into_iter().chain(mapped)
    }

    fn len(&self) -> usize {
        match self {
            Region::Unpainted => 0,
            Region::One { .. } => 1,
            Region::Map(map) => map.len(),
        }
    }
}

impl Painter {
    pub(crate) fn new(regions: usize) -> Painter {
        Painter {
            regions: vec![Region::Unpainted; regions],
        }
    }

    /// Adds to `out` (once each) the runners that last claimed any byte of
    /// `claim`. A region painted by one runner (a round-robin generation,
    /// most replays) is read inline; a map apart.
    #[inline(always)]
    pub(crate) fn users(&self, claim: Claim, out: &mut Vec<u32>) {
        match &self.regions[claim.region as usize] {
            Region::Unpainted => {}
            &Region::One { lo, hi, runner } => {
                if lo < claim.hi && claim.lo < hi && !out.contains(&runner) {
                    out.push(runner);
                }
            }
            Region::Map(map) => map_users(map, claim, out),
        }
    }

    /// The one runner that last claimed any byte of `claim` (`Some(None)`:
    /// none), where the claim's region is painted by one runner or none, or
    /// the claim is exactly one of its intervals (an exact extent
    /// repainted: intervals are disjoint, so no other one meets it);
    /// `None` otherwise ([`Painter::users`] then).
    #[inline(always)]
    pub(crate) fn sole_user(&self, claim: Claim) -> Option<Option<u32>> {
        match &self.regions[claim.region as usize] {
            Region::Unpainted => Some(None),
            &Region::One { lo, hi, runner } => {
                Some((lo < claim.hi && claim.lo < hi).then_some(runner))
            }
            Region::Map(map) => match map.get(&claim.lo) {
                Some(&(end, runner)) if end == claim.hi => Some(Some(runner)),
                _ => None,
            },
        }
    }

    /// Makes `runner` the last user of every byte of `claim`. The range
    /// painted exactly as the region's one interval already (a round-robin
    /// generation, most replays) is repainted inline; the rest apart.
    #[inline(always)]
    pub(crate) fn paint(&mut self, claim: Claim, runner: u32) {
        if let Region::One {
            lo,
            hi,
            runner: owner,
        } = &mut self.regions[claim.region as usize]
        {
            if *lo == claim.lo && *hi == claim.hi {
                *owner = runner;
                return;
            }
        }
        self.paint_apart(claim, runner);
    }

    /// [`Painter::paint`] but for the inline case.
    #[inline(never)]
    fn paint_apart(&mut self, claim: Claim, runner: u32) {
        let region = &mut self.regions[claim.region as usize];
        match region {
            // Fast paths: a first interval, kept inline, or the range
            // painted exactly as one interval already.
            Region::Unpainted => {
                *region = Region::One {
                    lo: claim.lo,
                    hi: claim.hi,
                    runner,
                };
                return;
            }
            Region::Map(map) => {
                if let Some((end, owner)) = map.get_mut(&claim.lo) {
                    if *end == claim.hi {
                        *owner = runner;
                        return;
                    }
                }
            }
            Region::One { .. } => {}
        }
        self.erase(claim);
        self.regions[claim.region as usize]
            .map_mut()
            .insert(claim.lo, (claim.hi, runner));
    }

    /// Makes every byte of `claim` unpainted (no last user).
    fn erase(&mut self, claim: Claim) {
        let region = &mut self.regions[claim.region as usize];
        if matches!(region, Region::Unpainted) {
            return;
        }
        let map = region.map_mut();
        let mut meeting = (map.range(..claim.hi).rev())
            .take_while(|(_, &(end, _))| end > claim.lo)
            .map(|(&s, &v)| (s, v));
        // Mostly one interval meets it (a handoff's bytes beside its
        // writer's): the rest is empty, and an empty list allocates nothing.
        let first = meeting.next();
        let rest: Vec<(u64, (u64, u32))> = meeting.collect();
        for (start, (end, owner)) in first.into_iter().chain(rest) {
            map.remove(&start);
            if start < claim.lo {
                map.insert(start, (claim.lo, owner));
            }
            if end > claim.hi {
                map.insert(claim.hi, (end, owner));
            }
        }
    }

    /// The painted intervals of `claim`'s bytes, cut to them: (claim of
    /// the interval's part, its runner), highest first.
    pub(crate) fn pieces(&self, claim: Claim) -> impl Iterator<Item = (Claim, u32)> + '_ {
        let region = self.regions.get(claim.region as usize);
        region
            .into_iter()
            .flat_map(move |r| r.meeting(claim.lo, claim.hi))
            .map(move |(start, end, runner)| {
                let lo = start.max(claim.lo);
                let hi = end.min(claim.hi);
                (Claim { lo, hi, ..claim }, runner)
            })
    }

    /// The painting of the bytes of `claims` alone (every interval that
    /// meets one, cut to it): for a claim within them, [`Painter::users`]
    /// finds the same runners, in the same order, as on `self`. Holds only
    /// the regions up to the highest one `claims` name.
    pub(crate) fn restricted(&self, claims: &[Claim]) -> Painter {
        let regions = claims.iter().map(|c| c.region as usize + 1).max();
        let mut out = Painter::new(regions.unwrap_or(0));
        for &claim in claims {
            for (piece, runner) in self.pieces(claim) {
                out.paint(piece, runner);
            }
        }
        out
    }

    /// Paints the bytes of `claims` exactly as `from` has them (unpainted
    /// where `from` leaves them so); the rest stays as it is.
    pub(crate) fn overlay(&mut self, from: &Painter, claims: &[Claim]) {
        for &claim in claims {
            self.erase(claim);
        }
        for &claim in claims {
            for (piece, runner) in from.pieces(claim) {
                self.paint(piece, runner);
            }
        }
    }

    /// The painted intervals, in every region.
    pub(crate) fn intervals(&self) -> usize {
        self.regions.iter().map(Region::len).sum()
    }
}

/// [`Painter::users`] of a region of several intervals.
#[inline(never)]
fn map_users(map: &BTreeMap<u64, (u64, u32)>, claim: Claim, out: &mut Vec<u32>) {
    let mut add = |runner: u32| {
        if !out.contains(&runner) {
            out.push(runner);
        }
    };
    // Fast path: one interval is exactly the claim (intervals are
    // disjoint, so no other one meets it): an exact extent repainted.
    if let Some(&(end, runner)) = map.get(&claim.lo) {
        if end == claim.hi {
            add(runner);
            return;
        }
    }
    for (_, &(end, runner)) in map.range(..claim.hi).rev() {
        if end <= claim.lo {
            break;
        }
        add(runner);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Replaying runners in any order, each waiting for the last users of
        /// its bytes: every earlier replay whose bytes overlap a later one is
        /// reached through the chain of waits (so it finished first).
        #[test]
        fn waits_reach_every_earlier_overlapping_replay(
            ranges in prop::collection::vec((0u64..64, 1u64..16), 1..12),
            order in prop::collection::vec(0usize..12, 1..60),
        ) {
            let mut p = Painter::new(1);
            // For each replay: (runner, [lo, hi), replays it waited for).
            let mut replays: Vec<(u64, u64, Vec<usize>)> = Vec::new();
            let mut last_replay_of: Vec<Option<usize>> = vec![None; ranges.len()];
            for &pick in &order {
                let r = pick % ranges.len();
                let (lo, len) = ranges[r];
                let c = claim(lo, lo + len);
                let mut users = Vec::new();
                p.users(c, &mut users);
                let waits = users.iter().map(|&u| last_replay_of[u as usize].unwrap()).collect();
                p.paint(c, r as u32);
                last_replay_of[r] = Some(replays.len());
                replays.push((lo, lo + len, waits));
            }
            for j in 0..replays.len() {
                let mut reached = vec![false; j];
                let mut stack = replays[j].2.clone();
                while let Some(k) = stack.pop() {
                    if !reached[k] {
                        reached[k] = true;
                        stack.extend(replays[k].2.iter().copied());
                    }
                }
                for (i, done) in reached.iter().enumerate() {
                    let overlap = replays[i].0 < replays[j].1 && replays[j].0 < replays[i].1;
                    prop_assert!(!overlap || *done, "replay {} overlaps earlier replay {} unfenced", j, i);
                }
            }
        }
    }

    fn claim(lo: u64, hi: u64) -> Claim {
        Claim { region: 0, lo, hi }
    }

    fn users(p: &Painter, lo: u64, hi: u64) -> Vec<u32> {
        let mut out = Vec::new();
        p.users(claim(lo, hi), &mut out);
        out.sort_unstable();
        out
    }

    #[test]
    fn a_claim_sees_every_runner_that_last_painted_its_bytes() {
        let mut p = Painter::new(1);
        p.paint(claim(0, 100), 1);
        p.paint(claim(20, 40), 2);
        p.paint(claim(90, 120), 3);
        assert_eq!(users(&p, 0, 10), vec![1]);
        assert_eq!(users(&p, 30, 50), vec![1, 2]);
        assert_eq!(users(&p, 40, 90), vec![1]);
        assert_eq!(users(&p, 85, 95), vec![1, 3]);
        assert_eq!(users(&p, 120, 130), Vec::<u32>::new());
        p.paint(claim(0, 120), 4);
        assert_eq!(users(&p, 0, 120), vec![4]);
    }

    #[test]
    fn an_exact_interval_answers_alone_and_a_wider_claim_sees_its_neighbours() {
        let mut p = Painter::new(1);
        p.paint(claim(0, 10), 1);
        p.paint(claim(10, 20), 2);
        p.paint(claim(20, 30), 3);
        assert_eq!(users(&p, 10, 20), vec![2]);
        assert_eq!(users(&p, 10, 21), vec![2, 3]);
        assert_eq!(users(&p, 9, 20), vec![1, 2]);
        assert_eq!(users(&p, 10, 15), vec![2]);
    }

    #[test]
    fn a_restricted_painter_answers_for_its_claims_as_the_whole_does() {
        let mut p = Painter::new(1);
        p.paint(claim(0, 100), 1);
        p.paint(claim(20, 40), 2);
        p.paint(claim(90, 120), 3);
        let r = p.restricted(&[claim(30, 50), claim(85, 95)]);
        assert_eq!(users(&r, 30, 50), vec![1, 2]);
        assert_eq!(users(&r, 85, 95), vec![1, 3]);
        assert_eq!(users(&r, 40, 45), vec![1]);
        // Nothing outside the claims.
        assert_eq!(users(&r, 0, 30), Vec::<u32>::new());
        assert_eq!(r.intervals(), 4);
    }

    #[test]
    fn an_overlay_repaints_its_claims_and_nothing_else() {
        let mut p = Painter::new(1);
        p.paint(claim(0, 100), 1);
        let claims = [claim(10, 20), claim(50, 60)];
        let mut step = p.restricted(&claims);
        step.paint(claim(10, 15), 7);
        p.paint(claim(50, 60), 9);
        p.overlay(&step, &claims);
        assert_eq!(users(&p, 10, 15), vec![7]);
        assert_eq!(users(&p, 15, 20), vec![1]);
        // As `step` has it: runner 1 there, not 9.
        assert_eq!(users(&p, 50, 60), vec![1]);
        assert_eq!(users(&p, 0, 10), vec![1]);
        assert_eq!(users(&p, 60, 100), vec![1]);
        // Unpainted where `step` is.
        let mut empty = Painter::new(1);
        empty.overlay(&Painter::new(1), &[claim(0, 5)]);
        p.overlay(&Painter::new(1), &[claim(0, 5)]);
        assert_eq!(users(&p, 0, 5), Vec::<u32>::new());
        assert_eq!(empty.intervals(), 0);
    }

    #[test]
    fn repainting_the_same_range_keeps_one_interval() {
        let mut p = Painter::new(2);
        for r in 0..10 {
            p.paint(
                Claim {
                    region: 1,
                    lo: 0,
                    hi: 1,
                },
                r,
            );
        }
        assert!(matches!(p.regions[1], Region::One { runner: 9, .. }));
        assert!(matches!(p.regions[0], Region::Unpainted));
        // A second interval moves the region to a map, which repaints in
        // place as well.
        p.paint(
            Claim {
                region: 1,
                lo: 1,
                hi: 2,
            },
            10,
        );
        for r in 0..10 {
            p.paint(
                Claim {
                    region: 1,
                    lo: 0,
                    hi: 1,
                },
                r,
            );
        }
        match &p.regions[1] {
            Region::Map(map) => assert_eq!(map.len(), 2),
            other => panic!("{other:?}"),
        }
    }
}
