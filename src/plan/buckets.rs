//! Shape buckets in one plan: each bucket's runners placed as a plan of
//! their own would place them, in arenas every bucket shares.
//!
//! Each bucket is planned alone ([`Planned::new_single`] on its runners and
//! handoffs, in their capture order), then the buckets' arenas are laid over
//! each other: the arena of a key (and, under round-robin, a generation)
//! is the largest bucket's arena of it, and every extent and handoff keeps
//! the offset its bucket's plan gave it there. So within a bucket nothing
//! changes (its `G` consecutive runners and live handoffs stay disjoint),
//! and runners of different buckets share bytes from the start of each
//! arena. The fence regions and every claim are then derived from the
//! shared arenas ([`Planned::assemble`]): a packed runner claims its exact
//! extents, a round-robin runner its generation (all buckets' runners of
//! generation `k` use the same arenas, so the claim covers every byte any
//! of them shares) and its exact extents where handoffs of any bucket lie.
//! Two runners of different buckets whose bytes meet therefore claim
//! meeting ranges, and the fence orders them as it orders any two runners.

use crate::discover::{HandoffRecord, PlanConfig, RunnerRecord};
use crate::vocab::{BucketId, HandoffId, Key, RunnerId};

use super::{ArenaPlan, HandoffUse, Place, PlacedPolicy, PlanError, Planned, RunnerPlan};

/// One bucket of a plan: its name, its runners' slots in the shared plan,
/// and the plan it would have alone (bytes and bounds for the report).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BucketPlan {
    /// The name it was declared under.
    pub(crate) name: String,
    /// The shared plan's slot of each of its runners, in capture order (its
    /// own plan's slot `i` is `slots[i]`).
    pub(crate) slots: Vec<usize>,
    /// Its plan alone (runner slots and handoff ids its own).
    pub(crate) alone: Planned,
}

type Handback = (PlanError, Vec<RunnerRecord>, Vec<HandoffRecord>);

/// Plans the buckets `names` declares (at least two) in shared arenas.
pub(super) fn plan(
    config: PlanConfig,
    records: Vec<RunnerRecord>,
    handoffs: Vec<HandoffRecord>,
    names: &[String],
    placed_policy: PlacedPolicy,
) -> Result<Planned, Handback> {
    let n = names.len();
    // Each runner's and handoff's bucket and its index there.
    let mut slots: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut local = vec![0usize; records.len()];
    for (i, r) in records.iter().enumerate() {
        let b = (r.bucket.0 as usize).min(n - 1);
        local[i] = slots[b].len();
        slots[b].push(i);
    }
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut hlocal = vec![0usize; handoffs.len()];
    for (i, h) in handoffs.iter().enumerate() {
        let b = (h.bucket.0 as usize).min(n - 1);
        hlocal[i] = members[b].len();
        members[b].push(i);
    }
    let to_local = |ids: &[HandoffId]| -> Vec<HandoffId> {
        ids.iter()
            .map(|h| HandoffId(hlocal[h.0 as usize] as u32))
            .collect()
    };
    let mut parts: Vec<Planned> = Vec::with_capacity(n);
    for b in 0..n {
        let recs: Vec<RunnerRecord> = slots[b]
            .iter()
            .map(|&i| {
                let mut r = records[i].clone();
                r.writes = to_local(&r.writes);
                r.reads = to_local(&r.reads);
                r
            })
            .collect();
        let hs: Vec<HandoffRecord> = members[b]
            .iter()
            .map(|&i| {
                let mut h = handoffs[i].clone();
                h.writer = local[h.writer];
                h.readers = h.readers.iter().map(|&s| local[s]).collect();
                h
            })
            .collect();
        match Planned::new_single(config.clone(), recs, hs, placed_policy) {
            Ok(mut alone) => {
                alone.bucket_name = names[b].clone();
                parts.push(alone);
            }
            Err((error, _, _)) => {
                // Name the handoffs by their ids in the whole discovery.
                let error = match error {
                    PlanError::ArenaOverflow {
                        key,
                        users,
                        largest,
                        handoffs: uses,
                    } => PlanError::ArenaOverflow {
                        key,
                        users,
                        largest,
                        handoffs: uses
                            .into_iter()
                            .map(|u| HandoffUse {
                                handoff: HandoffId(
                                    members[b].get(u.handoff.0 as usize).copied().unwrap_or(0)
                                        as u32,
                                ),
                                ..u
                            })
                            .collect(),
                    },
                    other => other,
                };
                return Err((error, records, handoffs));
            }
        }
    }

    // The shared arenas: every (key, generation) any bucket has, in the
    // order a plan lists them (key, then generation), each the largest.
    let mut keys: Vec<(Key, Option<usize>)> = parts
        .iter()
        .flat_map(|p| p.arenas.iter().map(|a| (a.key, a.generation)))
        .collect();
    keys.sort_unstable();
    keys.dedup();
    let mut arenas: Vec<ArenaPlan> = keys
        .iter()
        .map(|&(key, generation)| ArenaPlan {
            key,
            generation,
            handoffs: false,
            bytes: 0,
        })
        .collect();
    let maps: Vec<Vec<usize>> = parts
        .iter()
        .map(|p| {
            p.arenas
                .iter()
                .map(|a| {
                    let (Ok(at) | Err(at)) = keys.binary_search(&(a.key, a.generation));
                    let shared = &mut arenas[at];
                    shared.bytes = shared.bytes.max(a.bytes);
                    shared.handoffs |= a.handoffs;
                    at
                })
                .collect()
        })
        .collect();

    let g = parts.iter().map(|p| p.generations).max().unwrap_or(1);
    let mut runners: Vec<Option<RunnerPlan>> = vec![None; records.len()];
    let mut records: Vec<Option<RunnerRecord>> = records.into_iter().map(Some).collect();
    for (b, p) in parts.iter().enumerate() {
        for (i, r) in p.runners.iter().enumerate() {
            let global = slots[b][i];
            let Some(record) = records[global].take() else {
                continue;
            };
            let mut extents = r.extents.clone();
            for e in &mut extents {
                e.arena = maps[b][e.arena];
            }
            runners[global] = Some(RunnerPlan {
                record,
                position: r.position,
                generation: r.generation,
                extents,
                claims: Vec::new(),
            });
        }
    }
    let mut places: Vec<Option<(Place, u64)>> = vec![None; handoffs.len()];
    for (b, p) in parts.iter().enumerate() {
        for (j, h) in p.handoffs.iter().enumerate() {
            if let Some(&global) = members[b].get(j) {
                let place = Place {
                    arena: maps[b][h.place.arena],
                    offset: h.place.offset,
                };
                places[global] = Some((place, h.bytes));
            }
        }
    }
    let buckets = parts
        .into_iter()
        .zip(slots)
        .map(|(alone, slots)| BucketPlan {
            name: alone.bucket_name.clone(),
            slots,
            alone,
        })
        .collect();
    Ok(Planned::assemble(
        config,
        placed_policy,
        g,
        runners.into_iter().flatten().collect(),
        arenas,
        handoffs.into_iter().zip(places).collect(),
        buckets,
    ))
}

impl Planned {
    /// The plan's shape buckets, by id, with their names (one, `default`
    /// unless discovery named it, when discovery declared at most one).
    pub fn buckets(&self) -> impl Iterator<Item = (BucketId, &str)> + '_ {
        let single = self
            .buckets
            .is_empty()
            .then_some((BucketId(0), self.bucket_name.as_str()));
        let many = self
            .buckets
            .iter()
            .enumerate()
            .map(|(i, b)| (BucketId(i as u32), b.name.as_str()));
        single.into_iter().chain(many)
    }

    /// The bucket `runner` belongs to (`None` for an unknown runner).
    pub fn bucket_of(&self, runner: RunnerId) -> Option<BucketId> {
        self.runner(runner).map(|r| r.record.bucket)
    }

    /// The runners of `bucket`, in capture order (none for an unknown
    /// bucket).
    pub fn runners_in(&self, bucket: BucketId) -> impl Iterator<Item = RunnerId> + '_ {
        self.runners
            .iter()
            .filter(move |r| r.record.bucket == bucket)
            .map(|r| r.id())
    }

    /// The bytes `bucket` would allocate as a plan of its own (the same
    /// policy and placement); `None` for an unknown bucket. For the one
    /// bucket of an unbucketed plan, [`Planned::total_bytes`].
    pub fn bucket_bytes(&self, bucket: BucketId) -> Option<u64> {
        if self.buckets.is_empty() {
            return (bucket == BucketId(0)).then(|| self.total_bytes());
        }
        self.buckets
            .get(bucket.0 as usize)
            .map(|b| b.alone.total_bytes())
    }

    /// What separate plans of the buckets would allocate in all: the sum
    /// of [`Planned::bucket_bytes`] (saturating). At least
    /// [`Planned::total_bytes`], which shares arenas among the buckets.
    pub fn separate_bytes(&self) -> u64 {
        if self.buckets.is_empty() {
            return self.total_bytes();
        }
        self.buckets
            .iter()
            .map(|b| b.alone.total_bytes())
            .fold(0, u64::saturating_add)
    }
}
