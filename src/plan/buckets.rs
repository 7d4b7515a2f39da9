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
    let split = Split::of(&records, &handoffs, names.len());
    let mut parts: Vec<Planned> = Vec::with_capacity(names.len());
    for (b, name) in names.iter().enumerate() {
        match split.plan_alone(b, &config, &records, &handoffs, placed_policy) {
            Ok(mut alone) => {
                alone.bucket_name = name.clone();
                parts.push(alone);
            }
            Err(error) => return Err((error, records, handoffs)),
        }
    }
    let (arenas, maps) = shared_arenas(&parts);
    let g = parts.iter().map(|p| p.generations).max().unwrap_or(1);
    let runners = shared_runners(&parts, &split.slots, &maps, records);
    let places = shared_places(&parts, &split.members, &maps, handoffs.len());
    let buckets = parts
        .into_iter()
        .zip(split.slots)
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
        runners,
        arenas,
        handoffs.into_iter().zip(places).collect(),
        buckets,
    ))
}

/// Which bucket each runner and handoff is in, and its index there.
struct Split {
    /// Per bucket, the slots of its runners in capture order.
    slots: Vec<Vec<usize>>,
    /// Per runner, its index in its bucket.
    local: Vec<usize>,
    /// Per bucket, the ids of its handoffs in order.
    members: Vec<Vec<usize>>,
    /// Per handoff, its index in its bucket.
    hlocal: Vec<usize>,
}

impl Split {
    /// The split of `records` and `handoffs` into `n` buckets (a bucket id
    /// past the last counts as the last).
    fn of(records: &[RunnerRecord], handoffs: &[HandoffRecord], n: usize) -> Split {
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
        Split {
            slots,
            local,
            members,
            hlocal,
        }
    }

    /// Handoff ids of the whole discovery as ids within their bucket.
    fn to_local(&self, ids: &[HandoffId]) -> Vec<HandoffId> {
        ids.iter()
            .map(|h| HandoffId(self.hlocal[h.0 as usize] as u32))
            .collect()
    }

    /// Bucket `b` planned alone: its runners and handoffs, renumbered
    /// within the bucket. An error names handoffs by their ids in the
    /// whole discovery.
    fn plan_alone(
        &self,
        b: usize,
        config: &PlanConfig,
        records: &[RunnerRecord],
        handoffs: &[HandoffRecord],
        placed_policy: PlacedPolicy,
    ) -> Result<Planned, PlanError> {
        let recs: Vec<RunnerRecord> = self.slots[b]
            .iter()
            .map(|&i| {
                let mut r = records[i].clone();
                r.writes = self.to_local(&r.writes);
                r.reads = self.to_local(&r.reads);
                r
            })
            .collect();
        let hs: Vec<HandoffRecord> = self.members[b]
            .iter()
            .map(|&i| {
                let mut h = handoffs[i].clone();
                h.writer = self.local[h.writer];
                h.readers = h.readers.iter().map(|&s| self.local[s]).collect();
                h
            })
            .collect();
        Planned::new_single(config.clone(), recs, hs, placed_policy)
            .map_err(|(error, _, _)| self.global_handoffs(b, error))
    }

    /// `error` of bucket `b`'s own plan, its handoffs named by their ids in
    /// the whole discovery.
    fn global_handoffs(&self, b: usize, error: PlanError) -> PlanError {
        match error {
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
                            self.members[b]
                                .get(u.handoff.0 as usize)
                                .copied()
                                .unwrap_or(0) as u32,
                        ),
                        ..u
                    })
                    .collect(),
            },
            other => other,
        }
    }
}

/// The shared arenas: every (key, generation) any bucket has, in the order
/// a plan lists them (key, then generation), each the largest; and per
/// bucket, the shared arena of each of its own.
fn shared_arenas(parts: &[Planned]) -> (Vec<ArenaPlan>, Vec<Vec<usize>>) {
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
    (arenas, maps)
}

/// Every runner of the buckets' plans in its slot of the shared plan, its
/// extents in the shared arenas (claims are derived later).
fn shared_runners(
    parts: &[Planned],
    slots: &[Vec<usize>],
    maps: &[Vec<usize>],
    records: Vec<RunnerRecord>,
) -> Vec<RunnerPlan> {
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
    runners.into_iter().flatten().collect()
}

/// Each of the `count` handoffs' place in the shared arenas, and its bytes.
fn shared_places(
    parts: &[Planned],
    members: &[Vec<usize>],
    maps: &[Vec<usize>],
    count: usize,
) -> Vec<Option<(Place, u64)>> {
    let mut places: Vec<Option<(Place, u64)>> = vec![None; count];
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
    places
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

/// A bucket that joins a sealed plan: its runners placed as a plan of
/// their own would place them, in the sealed plan's arenas.
#[derive(Clone, Debug)]
pub(crate) struct Fitted {
    /// Its runners, their extents in the sealed plan's arenas and their
    /// claims derived from them, in capture order.
    pub(crate) runners: Vec<RunnerPlan>,
    /// Its plan alone (for the report and for what a grown plan needs).
    pub(crate) alone: Planned,
}

/// One (key, generation) a bucket needs more of than the sealed plan has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Short {
    pub(crate) key: Key,
    pub(crate) generation: Option<usize>,
    pub(crate) needed: u64,
    pub(crate) available: u64,
}

impl Planned {
    /// Plans `records` (one bucket, named `name`, numbered `bucket`) alone
    /// with this plan's policy and placement, at most this plan's `G`
    /// generations (the fence's regions stay as they are), and fits it in
    /// this plan's arenas: `Err` with every (key, generation) it needs more
    /// of, or the planning error. The records come back on failure.
    #[allow(clippy::type_complexity)]
    pub(crate) fn fit_bucket(
        &self,
        name: &str,
        bucket: BucketId,
        mut records: Vec<RunnerRecord>,
    ) -> std::result::Result<
        Fitted,
        (
            std::result::Result<Vec<Short>, PlanError>,
            Vec<RunnerRecord>,
        ),
    > {
        for r in &mut records {
            r.bucket = bucket;
        }
        let policy = crate::plan::Policy::Generations(self.generations.max(1))
            .placed(self.placed_policy.placement);
        let mut alone = match Planned::new_single(self.config.clone(), records, Vec::new(), policy)
        {
            Ok(alone) => alone,
            Err((error, records, _)) => return Err((Err(error), records)),
        };
        alone.bucket_name = name.to_string();
        let mut short = Vec::new();
        let mut map = Vec::with_capacity(alone.arenas.len());
        for a in &alone.arenas {
            let at = self
                .arenas
                .iter()
                .position(|s| s.key == a.key && s.generation == a.generation && !s.handoffs);
            let available = at.map_or(0, |i| self.arenas[i].bytes);
            if a.bytes > available {
                short.push(Short {
                    key: a.key,
                    generation: a.generation,
                    needed: a.bytes,
                    available,
                });
            }
            map.push(at.unwrap_or(0));
        }
        if !short.is_empty() {
            let records = alone.runners.into_iter().map(|r| r.record).collect();
            return Err((Ok(short), records));
        }
        let mut runners = alone.runners.clone();
        for r in &mut runners {
            for e in &mut r.extents {
                e.arena = map[e.arena];
            }
        }
        let placement = self.placed_policy.placement;
        let regions = super::fence_regions(&self.arenas, placement, self.generations);
        super::assign_claims(&mut runners, &regions, placement);
        Ok(Fitted { runners, alone })
    }

    /// The plan's buckets as a list even when it has one (named as
    /// discovery named it): before a bucket joins.
    fn bucket_list(&mut self) {
        if !self.buckets.is_empty() {
            return;
        }
        let mut alone = self.clone();
        alone.bucket_name = self.bucket_name.clone();
        self.buckets.push(BucketPlan {
            name: self.bucket_name.clone(),
            slots: (0..self.runners.len()).collect(),
            alone,
        });
    }

    /// Adds `fitted`'s runners after the plan's, as bucket `name` (the
    /// next bucket id); returns their slots.
    pub(crate) fn join_bucket(&mut self, name: String, fitted: Fitted) -> std::ops::Range<usize> {
        self.bucket_list();
        let start = self.runners.len();
        self.runners.extend(fitted.runners);
        let slots = start..self.runners.len();
        self.buckets.push(BucketPlan {
            name,
            slots: slots.clone().collect(),
            alone: fitted.alone,
        });
        self.index = self
            .runners
            .iter()
            .enumerate()
            .map(|(i, r)| (r.id(), i))
            .collect();
        self.index.sort_unstable();
        slots
    }

    /// The number of buckets (1 for an unbucketed plan).
    pub(crate) fn bucket_count(&self) -> usize {
        self.buckets.len().max(1)
    }

    /// The runner slots of `bucket`.
    pub(crate) fn bucket_slots(&self, bucket: BucketId) -> Vec<usize> {
        match self.buckets.get(bucket.0 as usize) {
            Some(b) => b.slots.clone(),
            None if self.buckets.is_empty() && bucket == BucketId(0) => {
                (0..self.runners.len()).collect()
            }
            None => Vec::new(),
        }
    }

    /// The bucket named `name`, if any.
    pub(crate) fn bucket_named(&self, name: &str) -> Option<BucketId> {
        self.buckets().find(|(_, n)| *n == name).map(|(b, _)| b)
    }
}
