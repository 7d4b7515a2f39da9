//! The report of a plan with several shape buckets: each bucket's bytes as
//! a plan of its own, and per key the bounds every bucket must fit.

use std::collections::BTreeMap;

use super::{build, human_bytes, ratio, Optimum, PlanReport};
use crate::plan::{Placement, Planned};
use crate::vocab::{BucketId, Key};

/// One shape bucket of a plan ([`PlanReport::buckets`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct BucketReport {
    /// The bucket.
    pub bucket: BucketId,
    /// The name it was declared under.
    pub name: String,
    /// Its runners.
    pub runners: usize,
    /// Its runners that use buffers.
    pub runners_using: usize,
    /// What it would allocate as a plan of its own (same policy and
    /// placement).
    pub alone_bytes: u64,
    /// Its lower bound alone (summed over keys).
    pub lower_bound: u64,
    /// Whether its graphs are held (a sealed plan's report only:
    /// [`Replayable::report`](crate::Replayable::report)).
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub state: Option<crate::vocab::BucketState>,
    /// What its runners' graphs allocate as temporaries, in bytes (a
    /// sealed plan's report only).
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub temporaries: Option<u64>,
}

/// Per key: (lower bound, round-robin bytes, packed bytes, best bound,
/// optimum) of the shared plan.
type KeyFigures = (u64, u64, u64, u64, Optimum);

/// What a bucketed plan's report takes from its buckets' separate plans.
pub(super) struct Figures {
    /// Per key: the largest of the buckets' lower bounds and best bounds
    /// (every bucket's buffers must fit the key's arenas alone), and where
    /// the bucket of the largest best bound stands (its proof's span).
    bounds: BTreeMap<Key, (u64, u64, Optimum)>,
    /// Per key: the bytes the other placement's shared plan allocates.
    other: BTreeMap<Key, u64>,
    placement: Placement,
    pub(super) buckets: Vec<BucketReport>,
}

impl Figures {
    pub(super) fn of(plan: &Planned) -> Figures {
        let mut bounds: BTreeMap<Key, (u64, u64, Optimum)> = BTreeMap::new();
        let mut buckets = Vec::with_capacity(plan.buckets.len());
        for (i, b) in plan.buckets.iter().enumerate() {
            let alone = build(&b.alone);
            for k in &alone.keys {
                let e = bounds.entry(k.key).or_default();
                e.0 = e.0.max(k.lower_bound);
                if k.best_bound > e.1 {
                    e.1 = k.best_bound;
                    e.2 = k.optimum;
                }
            }
            buckets.push(BucketReport {
                bucket: BucketId(i as u32),
                name: b.name.clone(),
                runners: alone.runners_total,
                runners_using: alone.runners_using,
                alone_bytes: alone.plan_bytes,
                lower_bound: alone.lower_bound,
                state: None,
                temporaries: None,
            });
        }
        let placement = plan.placed_policy.placement;
        let other_placement = match placement {
            Placement::RoundRobin => Placement::Packed,
            Placement::Packed => Placement::RoundRobin,
        };
        let names: Vec<String> = plan.buckets.iter().map(|b| b.name.clone()).collect();
        let other = Planned::new(
            plan.config.clone(),
            plan.runners.iter().map(|r| r.record.clone()).collect(),
            plan.handoffs.iter().map(|h| h.record.clone()).collect(),
            &names,
            plan.placed_policy.policy.placed(other_placement),
        );
        let mut by_key: BTreeMap<Key, u64> = BTreeMap::new();
        match other {
            Ok(other) => {
                for a in &other.arenas {
                    let e = by_key.entry(a.key).or_default();
                    *e = e.saturating_add(a.bytes);
                }
            }
            Err(_) => {
                for a in &plan.arenas {
                    by_key.insert(a.key, u64::MAX);
                }
            }
        }
        Figures {
            bounds,
            other: by_key,
            placement,
            buckets,
        }
    }

    /// The shared plan's figures for `key`, whose arenas hold `plan_bytes`.
    pub(super) fn key(&self, key: Key, plan_bytes: u64) -> KeyFigures {
        let (lower, best, proof) = self.bounds.get(&key).copied().unwrap_or_default();
        let other = self.other.get(&key).copied().unwrap_or(plan_bytes);
        let (rr, packed) = match self.placement {
            Placement::RoundRobin => (plan_bytes, other),
            Placement::Packed => (other, plan_bytes),
        };
        let best = best.max(lower);
        // Every bucket's buffers must fit the shared arena: a bucket's proved
        // bound is the shared plan's too.
        let optimum = match proof {
            _ if packed <= lower => Optimum::LowerBound,
            Optimum::Proved { first, last } if packed <= best => Optimum::Proved { first, last },
            _ => Optimum::Open,
        };
        (lower, rr, packed, best, optimum)
    }
}

impl PlanReport {
    /// The line on shape buckets: their count, the shared bytes against
    /// the sum of separate plans and against the largest bound.
    pub(super) fn bucket_line(&self) -> String {
        let each: Vec<String> = self
            .buckets
            .iter()
            .map(|b| {
                let held = match (b.state, b.temporaries) {
                    (Some(state), Some(t)) if t > 0 => {
                        format!(" ({state}, graph temporaries {})", human_bytes(t))
                    }
                    (Some(state), _) => format!(" ({state})"),
                    (None, _) => String::new(),
                };
                format!("{} {}{held}", b.name, human_bytes(b.alone_bytes))
            })
            .collect();
        format!(
            "buckets: {} share the arenas: {} shared vs {} as separate plans ({}x), {}x the largest bucket bound {}; alone: {}",
            self.buckets.len(),
            human_bytes(self.plan_bytes),
            human_bytes(self.separate_bytes),
            ratio(self.separate_bytes, self.plan_bytes),
            ratio(self.plan_bytes, self.lower_bound),
            human_bytes(self.lower_bound),
            each.join(", ")
        )
    }
}
