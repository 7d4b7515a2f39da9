//! Buckets at run time: a shape bucket that joins a sealed plan, and the
//! budget of captured buckets the program sets.
//!
//! A bucket's own lifecycle, beside the plan's:
//! [`Replayable::discover_bucket`] opens a [`BucketDiscovery`] (an eager
//! run of the new shape records its runners' requests, as [`Discovering`]
//! does); [`BucketDiscovery::fit`] plans the bucket alone, with the plan's
//! policy and placement, and fits it in the sealed plan's arenas (every
//! key, every generation), or names what is missing; the
//! [`BucketCapture`] it returns captures the bucket's runners on views of
//! those arenas (no allocation, no re-plan), and [`BucketCapture::seal`]
//! adds them to the plan. Each borrows the [`Replayable`] it came from, so
//! nothing of one bucket's join outlives it or mixes with another's.
//!
//! The fence needs nothing new: the joined runners' claims are derived from
//! the shared arenas as a declared bucket's are, so their first replays
//! wait for the in-flight users of the same bytes.
//!
//! A budget ([`Replayable::set_bucket_budget`]) bounds the buckets whose
//! graphs are held (declared and joined alike). When a capture would pass
//! it, the least recently launched idle bucket's graphs are released:
//! idle as the fence knows it (every event of its latest replays and
//! consumers has completed, asked without blocking). A released bucket
//! keeps its place in the arenas and its fence state; its runners refuse
//! to replay ([`ReplayError::Released`](crate::ReplayError::Released)) until
//! [`Replayable::recapture_bucket`] captures it again.

use std::fmt;

use crate::backend::{Backend, Temporaries};
use crate::capture::{CaptureError, Capturing, Resources, Slot, Trimmed};
use crate::discover::{ArmedRunner, Discovering, DiscoveryError};
use crate::failed::Failed;
use crate::failure::{BackendFailure, Operation};
use crate::plan::{Fitted, Planned, RunnerPlan};
use crate::replay::live::BucketLive;
use crate::replay::{views_of, Replayable, RunnerGraph};
use crate::vocab::{BucketId, BucketState, Key, RunnerId};

/// One arena a joining bucket needs more of ([`JoinError::DoesNotFit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Shortfall {
    /// The key (domain and dtype).
    pub key: Key,
    /// Its round-robin generation (`None` when packed).
    pub generation: Option<usize>,
    /// The bytes the bucket needs there.
    pub needed: u64,
    /// The bytes the plan's arena has (0 when the plan has none).
    pub available: u64,
}

impl Shortfall {
    /// The bytes missing: what the arena must grow by.
    pub fn missing(&self) -> u64 {
        self.needed - self.available
    }
}

impl fmt::Display for Shortfall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.key)?;
        if let Some(g) = self.generation {
            write!(f, " generation {g}")?;
        }
        write!(
            f,
            " needs {} bytes, the plan has {} ({} missing)",
            self.needed,
            self.available,
            self.missing()
        )
    }
}

fn describe(short: &[Shortfall]) -> String {
    let all: Vec<String> = short.iter().map(ToString::to_string).collect();
    all.join("; ")
}

fn describe_ids(buckets: &[BucketId]) -> String {
    let all: Vec<String> = buckets.iter().map(ToString::to_string).collect();
    all.join(", ")
}

/// A bucket that cannot join the sealed plan; the plan is as it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JoinError {
    /// The plan has a bucket of this name already.
    #[error("the plan has a bucket named {name:?} already ({bucket})")]
    DuplicateName {
        /// The name.
        name: String,
        /// The bucket of that name.
        bucket: BucketId,
    },
    /// A runner id the plan (or this bucket) has already.
    #[error("{runner} is a runner of the plan already; a joining bucket's runners take new ids")]
    RunnerInPlan {
        /// The runner.
        runner: RunnerId,
    },
    /// The bucket's discovery failed.
    #[error(transparent)]
    Discovery(Box<DiscoveryError>),
    /// The bucket recorded nothing.
    #[error("bucket {name:?} armed no runner")]
    NoRunners {
        /// Its name.
        name: String,
    },
    /// Handoffs are not supported in buckets that join at run time (nor
    /// in a plan that has any): a handoff's fence slot follows the plan's
    /// runners.
    #[error("{}: buckets that join a sealed plan have no handoffs; declare the bucket before plan()", match .runner { Some(r) => format!("{r} declares a handoff"), None => "the plan has handoffs".to_string() })]
    Handoffs {
        /// The runner of the bucket that declared one (`None`: the plan
        /// has handoffs).
        runner: Option<RunnerId>,
    },
    /// Planning the bucket alone failed.
    #[error("the bucket cannot be planned: {0}")]
    Plan(Box<crate::plan::PlanError>),
    /// The bucket needs more bytes than the plan's arenas have; the plan
    /// grows only by a new plan ([`Replayable::replan`] with the bucket
    /// declared: every bucket is captured again).
    #[error(
        "bucket {name:?} does not fit the plan's arenas: {}; to grow the plan, `replan()` \
         and declare it with the others (every bucket is captured again)",
        describe(.short)
    )]
    DoesNotFit {
        /// Its name.
        name: String,
        /// Each arena it needs more of, in key order.
        short: Vec<Shortfall>,
    },
    /// The arenas of a join whose capture was leaked (`mem::forget`) are
    /// gone from the plan: no bucket can join it any more.
    #[error("an earlier join's capture was forgotten with the plan's arenas; no bucket can join this plan")]
    ArenasGone,
    /// A capture of the bucket, or its seal, failed.
    #[error(transparent)]
    Capture(Box<CaptureError>),
    /// The budget has no room and every other captured bucket has work in
    /// flight (or there is no other).
    #[error(transparent)]
    Budget(#[from] BucketError),
    /// A backend call failed (creating the joined runners' events).
    #[error(transparent)]
    Backend(#[from] BackendFailure),
}

impl From<DiscoveryError> for JoinError {
    fn from(e: DiscoveryError) -> JoinError {
        JoinError::Discovery(Box::new(e))
    }
}

impl From<CaptureError> for JoinError {
    fn from(e: CaptureError) -> JoinError {
        JoinError::Capture(Box::new(e))
    }
}

impl From<crate::plan::PlanError> for JoinError {
    fn from(e: crate::plan::PlanError) -> JoinError {
        JoinError::Plan(Box::new(e))
    }
}

/// A bucket operation on a sealed plan that cannot be done.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BucketError {
    /// A budget of zero buckets.
    #[error("a bucket budget of zero holds no graph; allow at least one bucket")]
    ZeroBudget,
    /// The plan has no such bucket.
    #[error("the plan has no {bucket} (it has {count})")]
    UnknownBucket {
        /// The bucket.
        bucket: BucketId,
        /// How many buckets it has.
        count: usize,
    },
    /// The bucket's replays or consumers may still run.
    #[error("{bucket} has work in flight; its graphs are released only once it is done (synchronize, or wait for it)")]
    InFlight {
        /// The bucket.
        bucket: BucketId,
    },
    /// The bucket's graphs were released already.
    #[error("{bucket} was released already")]
    AlreadyReleased {
        /// The bucket.
        bucket: BucketId,
    },
    /// The bucket's graphs are held: nothing to capture again.
    #[error("{bucket} is captured; release it before capturing it again")]
    NotReleased {
        /// The bucket.
        bucket: BucketId,
    },
    /// Within the budget, nothing can be released: every other captured
    /// bucket has work in flight.
    #[error("the budget of {budget} bucket(s) is full and no captured bucket is idle ({}); wait for their work, or raise the budget", describe_ids(.busy))]
    NothingIdle {
        /// The budget.
        budget: usize,
        /// The captured buckets with work in flight.
        busy: Vec<BucketId>,
    },
    /// A backend call failed (an event query or record); nothing was
    /// released.
    #[error(transparent)]
    Backend(#[from] BackendFailure),
}

/// A bucket's eager run against a sealed plan
/// ([`Replayable::discover_bucket`]): arm each runner of the new shape
/// and record its requests, then [`BucketDiscovery::fit`]. It is not a
/// plan's discovery:
///
/// ```compile_fail
/// # use replay_arena::{sim, Replayable};
/// # fn f(r: &mut Replayable<sim::Device>) -> replay_arena::Result<()> {
/// let discovery = r.discover_bucket("bs=24")?;
/// let planned = discovery.plan(replay_arena::Policy::Generations(1)); // no method `plan`
/// # Ok(()) }
/// ```
pub struct BucketDiscovery<'r, B: Backend> {
    replayable: &'r mut Replayable<B>,
    name: String,
    discovery: Discovering,
}

impl<B: Backend> fmt::Debug for BucketDiscovery<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BucketDiscovery")
            .field("name", &self.name)
            .field("runners", &self.discovery.runners.len())
            .finish_non_exhaustive()
    }
}

impl<B: Backend + Clone> Replayable<B> {
    /// Opens the discovery of a new shape bucket named `name`, to join
    /// this sealed plan: see [`BucketDiscovery`].
    ///
    /// # Errors
    ///
    /// [`JoinError::DuplicateName`] for a name the plan has;
    /// [`JoinError::Handoffs`] for a plan with handoffs.
    pub fn discover_bucket(
        &mut self,
        name: impl Into<String>,
    ) -> Result<BucketDiscovery<'_, B>, JoinError> {
        let name = name.into();
        if let Some(bucket) = self.plan.bucket_named(&name) {
            return Err(JoinError::DuplicateName { name, bucket });
        }
        if !self.plan.handoffs.is_empty() {
            return Err(JoinError::Handoffs { runner: None });
        }
        let discovery = Discovering::new(self.plan.config.clone());
        Ok(BucketDiscovery {
            replayable: self,
            name,
            discovery,
        })
    }

    /// Opens a new capture of `bucket`, whose graphs were released: its
    /// runners are captured again in the bytes they had (the fit is kept),
    /// as [`BucketDiscovery::fit`]'s capture does.
    ///
    /// # Errors
    ///
    /// [`BucketError::UnknownBucket`], [`BucketError::NotReleased`];
    /// [`JoinError::ArenasGone`].
    pub fn recapture_bucket(
        &mut self,
        bucket: BucketId,
    ) -> Result<BucketCapture<'_, B>, JoinError> {
        let live = self.bucket_live(bucket)?;
        if live.captured {
            return Err(BucketError::NotReleased { bucket }.into());
        }
        let slots = self.plan.bucket_slots(bucket);
        let runners = slots
            .iter()
            .map(|&s| self.plan.runners[s].clone())
            .collect();
        BucketCapture::open(self, runners, Target::Again { bucket, slots })
    }
}

impl<B: Backend> Replayable<B> {
    /// Sets the most buckets whose graphs this plan holds at once
    /// (declared and joined alike); releases the least recently launched
    /// idle buckets now if more are held, and returns them.
    ///
    /// # Errors
    ///
    /// [`BucketError::ZeroBudget`]; [`BucketError::NothingIdle`] when not
    /// enough buckets are idle (nothing is released and the budget stays).
    pub fn set_bucket_budget(&mut self, buckets: usize) -> Result<Vec<BucketId>, BucketError> {
        if buckets == 0 {
            return Err(BucketError::ZeroBudget);
        }
        let over = self.buckets.captured().saturating_sub(buckets);
        let victims = self.victims(over, None, buckets)?;
        self.release(&victims);
        self.buckets.budget = Some(buckets);
        Ok(victims)
    }

    /// The budget ([`Replayable::set_bucket_budget`]); `None`: no limit.
    pub fn bucket_budget(&self) -> Option<usize> {
        self.buckets.budget
    }

    /// Whether `bucket`'s graphs are held.
    ///
    /// # Errors
    ///
    /// [`BucketError::UnknownBucket`].
    pub fn bucket_state(&self, bucket: BucketId) -> Result<BucketState, BucketError> {
        Ok(match self.bucket_live(bucket)?.captured {
            true => BucketState::Captured,
            false => BucketState::Released,
        })
    }

    /// Releases `bucket`'s graphs now (its runners' graphs and step
    /// copies; the driver's graph memory is trimmed), if it is idle.
    ///
    /// # Errors
    ///
    /// [`BucketError::UnknownBucket`], [`BucketError::AlreadyReleased`],
    /// [`BucketError::InFlight`] (nothing is released), or the event
    /// query's [`BucketError::Backend`].
    pub fn release_bucket(&mut self, bucket: BucketId) -> Result<(), BucketError> {
        if !self.bucket_live(bucket)?.captured {
            return Err(BucketError::AlreadyReleased { bucket });
        }
        if self.bucket_busy(bucket)? {
            return Err(BucketError::InFlight { bucket });
        }
        self.release(&[bucket]);
        Ok(())
    }

    fn bucket_live(&self, bucket: BucketId) -> Result<BucketLive, BucketError> {
        let count = self.buckets.buckets.len();
        self.buckets
            .buckets
            .get(bucket.0 as usize)
            .copied()
            .ok_or(BucketError::UnknownBucket { bucket, count })
    }

    /// Whether work of `bucket`'s runners may still run (the fence asks
    /// their events without blocking).
    fn bucket_busy(&mut self, bucket: BucketId) -> Result<bool, BucketError> {
        let slots = self.plan.bucket_slots(bucket);
        self.fence
            .in_flight(&self.backend, &slots)
            .map_err(|e| Operation::Release(bucket).failed(e).into())
    }

    /// The fence epoch of `bucket`'s latest launch (a replay of one of its
    /// runners, or a kept step graph of it).
    fn last_launch(&self, bucket: BucketId, live: &BucketLive) -> u64 {
        let slots = self.plan.bucket_slots(bucket);
        let replayed = slots.iter().map(|&s| self.runners[s].used).max();
        replayed.unwrap_or(0).max(live.stepped)
    }

    /// `count` idle captured buckets other than `keep`, the least recently
    /// launched first.
    fn victims(
        &mut self,
        count: usize,
        keep: Option<BucketId>,
        budget: usize,
    ) -> Result<Vec<BucketId>, BucketError> {
        if count == 0 {
            return Ok(Vec::new());
        }
        let mut order: Vec<(u64, BucketId)> = (0..self.buckets.buckets.len())
            .map(|b| BucketId(b as u32))
            .filter(|&b| Some(b) != keep)
            .filter_map(|b| {
                let live = self.buckets.buckets[b.0 as usize];
                live.captured.then(|| (self.last_launch(b, &live), b))
            })
            .collect();
        order.sort_unstable();
        let (mut idle, mut busy) = (Vec::new(), Vec::new());
        for (_, b) in order {
            if idle.len() == count {
                break;
            }
            match self.bucket_busy(b)? {
                true => busy.push(b),
                false => idle.push(b),
            }
        }
        if idle.len() < count {
            return Err(BucketError::NothingIdle { budget, busy });
        }
        Ok(idle)
    }

    /// Drops the graphs of `buckets` (idle: checked) and gives their graph
    /// memory back to the device (best effort, as teardown does).
    fn release(&mut self, buckets: &[BucketId]) {
        if buckets.is_empty() {
            return;
        }
        for &b in buckets {
            for slot in self.plan.bucket_slots(b) {
                let g = &mut self.runners[slot];
                g.graph = None;
                g.step_copies.clear();
                g.temporaries = Temporaries::default();
                g.ready_points.clear();
            }
            self.buckets.buckets[b.0 as usize].captured = false;
        }
        let _ = self.backend.trim_graph_memory();
    }

    /// Each bucket's state and what its graphs allocate as temporaries,
    /// for the report.
    pub(crate) fn bucket_figures(&self) -> Vec<(BucketState, u64)> {
        (0..self.buckets.buckets.len())
            .map(|b| {
                let live = self.buckets.buckets[b];
                let state = match live.captured {
                    true => BucketState::Captured,
                    false => BucketState::Released,
                };
                let bytes = self
                    .plan
                    .bucket_slots(BucketId(b as u32))
                    .iter()
                    .map(|&s| self.runners[s].temporaries.bytes)
                    .fold(0, u64::saturating_add);
                (state, bytes)
            })
            .collect()
    }
}

impl<'r, B: Backend + Clone> BucketDiscovery<'r, B> {
    /// The bucket's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Arms `runner` of the new bucket: record its requests through the
    /// guard, in the order its capture takes them
    /// ([`Discovering::arm`]).
    ///
    /// # Errors
    ///
    /// [`JoinError::RunnerInPlan`] for an id the plan has; as
    /// [`Discovering::arm`].
    pub fn arm(&mut self, runner: RunnerId) -> Result<ArmedRunner<'_>, JoinError> {
        if self.replayable.plan.slot(runner).is_some() {
            return Err(JoinError::RunnerInPlan { runner });
        }
        Ok(self.discovery.arm(runner)?)
    }

    /// Plans the bucket alone (the plan's policy and placement, at most its
    /// `G` generations) and fits it in the plan's arenas.
    ///
    /// # Errors
    ///
    /// [`JoinError::DoesNotFit`] naming each (key, generation) and the
    /// bytes missing; [`JoinError::NoRunners`], [`JoinError::Handoffs`],
    /// [`JoinError::Plan`], [`JoinError::ArenasGone`]. The plan is as it
    /// was.
    pub fn fit(self) -> Result<BucketCapture<'r, B>, JoinError> {
        let BucketDiscovery {
            replayable,
            name,
            mut discovery,
        } = self;
        if let Some(h) = discovery.handoffs.first() {
            return Err(JoinError::Handoffs {
                runner: Some(h.writer_id),
            });
        }
        let records = std::mem::take(&mut discovery.runners);
        if records.is_empty() {
            return Err(JoinError::NoRunners { name });
        }
        let bucket = BucketId(replayable.plan.bucket_count() as u32);
        let fitted = match replayable.plan.fit_bucket(&name, bucket, records) {
            Ok(fitted) => fitted,
            Err((Ok(short), _)) => {
                let short = short
                    .into_iter()
                    .map(|s| Shortfall {
                        key: s.key,
                        generation: s.generation,
                        needed: s.needed,
                        available: s.available,
                    })
                    .collect();
                return Err(JoinError::DoesNotFit { name, short });
            }
            Err((Err(error), _)) => return Err(error.into()),
        };
        let runners = fitted.runners.clone();
        let fitted = Box::new(fitted);
        BucketCapture::open(replayable, runners, Target::Join { name, fitted })
    }
}

/// What a [`BucketCapture`] seals into.
enum Target {
    /// A new bucket joins.
    Join { name: String, fitted: Box<Fitted> },
    /// A released bucket is captured again (its runners' slots).
    Again { bucket: BucketId, slots: Vec<usize> },
}

/// A bucket's runners captured on views of the sealed plan's arenas
/// ([`BucketDiscovery::fit`], [`Replayable::recapture_bucket`]): capture
/// each runner as [`Capturing::capture`] does, then
/// [`BucketCapture::seal`]. Dropping it unsealed drops its graphs; the
/// plan is as it was.
pub struct BucketCapture<'r, B: Backend> {
    /// The bucket's runners' captures, over the plan's arenas (lent for
    /// the capture, given back at seal or drop).
    capturing: Option<Capturing<B>>,
    replayable: &'r mut Replayable<B>,
    target: Target,
}

impl<B: Backend> fmt::Debug for BucketCapture<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BucketCapture")
            .field("capturing", &self.capturing)
            .finish_non_exhaustive()
    }
}

/// What [`BucketCapture::seal`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Joined {
    /// The bucket that was sealed.
    pub bucket: BucketId,
    /// The buckets whose graphs were released to stay within the budget
    /// (the least recently launched idle ones), in that order.
    pub released: Vec<BucketId>,
}

/// A failed [`BucketCapture::seal`]: why, and the capture back (to capture
/// what is missing, or to seal again once a bucket is idle).
pub type BucketSealFailed<'r, B> = Failed<JoinError, BucketCapture<'r, B>>;

impl<'r, B: Backend + Clone> BucketCapture<'r, B> {
    /// A capture of `runners` (their extents in the plan's arenas) that
    /// seals into `target`.
    fn open(
        replayable: &'r mut Replayable<B>,
        runners: Vec<RunnerPlan>,
        target: Target,
    ) -> Result<BucketCapture<'r, B>, JoinError> {
        let plan = &replayable.plan;
        if replayable._arenas.len() != plan.arenas.len() {
            return Err(JoinError::ArenasGone);
        }
        let index = crate::plan::runner_index(&runners);
        let own = Planned {
            config: plan.config.clone(),
            placed_policy: plan.placed_policy,
            generations: plan.generations,
            runners,
            arenas: plan.arenas.clone(),
            fence_regions: plan.fence_regions,
            index,
            handoffs: Vec::new(),
            buckets: Vec::new(),
            bucket_name: String::new(),
        };
        let arenas = std::mem::take(&mut replayable._arenas);
        let capturing = Capturing {
            slots: own.runners.iter().map(|_| Slot::Pending).collect(),
            ready: Vec::new(),
            plan: own,
            res: Resources {
                events: Vec::new(),
                arenas,
                backend: Trimmed::new(replayable.backend.clone()),
            },
        };
        Ok(BucketCapture {
            capturing: Some(capturing),
            replayable,
            target,
        })
    }
}

impl<'r, B: Backend> BucketCapture<'r, B> {
    fn capturing(&mut self) -> &mut Capturing<B> {
        self.capturing
            .as_mut()
            .expect("a bucket capture holds its Capturing until seal or drop")
    }

    /// The bucket's runners, in capture order.
    pub fn runners(&self) -> impl Iterator<Item = RunnerId> + '_ {
        self.capturing.iter().flat_map(|c| c.plan.runners())
    }

    /// The backend, to submit work while capturing.
    pub fn backend(&self) -> &B {
        &self.replayable.backend
    }

    /// Opens `runner`'s capture, as [`Capturing::capture`]: its views lie
    /// in the plan's arenas, where the fit placed them.
    ///
    /// # Errors
    ///
    /// [`CaptureError::UnknownRunner`] for a runner not in this bucket; as
    /// [`Capturing::capture`].
    pub fn capture(
        &mut self,
        runner: RunnerId,
    ) -> Result<crate::capture::RunnerCapture<'_, B>, CaptureError> {
        self.capturing().capture(runner)
    }

    /// Adds the bucket's graphs to the plan: a joining bucket's runners
    /// join the plan (and the fence), a released one's graphs come back.
    /// When the budget is full, the least recently launched idle buckets'
    /// graphs are released first ([`Joined::released`]).
    ///
    /// # Errors
    ///
    /// [`BucketSealFailed`], with the capture back: [`JoinError::Capture`]
    /// with [`CaptureError::Unfinished`] for runners not captured;
    /// [`JoinError::Budget`] with [`BucketError::NothingIdle`] when no
    /// bucket can be released; [`JoinError::Backend`]. Nothing changed.
    pub fn seal(mut self) -> Result<Joined, BucketSealFailed<'r, B>> {
        if let Some(unfinished) = self.capturing().unfinished() {
            return Err(Failed::new(unfinished.into(), self));
        }
        let (bucket, keep) = match &self.target {
            Target::Join { .. } => (BucketId(self.replayable.plan.bucket_count() as u32), None),
            Target::Again { bucket, .. } => (*bucket, Some(*bucket)),
        };
        let r = &mut *self.replayable;
        let victims = match r.buckets.budget {
            Some(budget) => {
                let over = (r.buckets.captured() + 1).saturating_sub(budget);
                match r.victims(over, keep, budget) {
                    Ok(v) => v,
                    Err(e) => return Err(Failed::new(e.into(), self)),
                }
            }
            None => Vec::new(),
        };
        let mut events = Vec::new();
        if let Target::Join { fitted, .. } = &self.target {
            for runner in &fitted.runners {
                let event = match runner.is_fenced() {
                    true => match self.replayable.backend.create_event() {
                        Ok(e) => Some(e),
                        Err(e) => {
                            let error = Operation::Join(bucket).failed(e);
                            return Err(Failed::new(error.into(), self));
                        }
                    },
                    false => None,
                };
                events.push(event);
            }
        }
        // Nothing fails from here on.
        self.replayable.release(&victims);
        let Some(capturing) = self.capturing.take() else {
            unreachable!("held until now")
        };
        let Capturing { slots, res, .. } = capturing;
        let Resources {
            arenas, backend, ..
        } = res;
        drop(backend.into_inner());
        let r = &mut *self.replayable;
        r._arenas = arenas;
        let target = std::mem::replace(
            &mut self.target,
            Target::Again {
                bucket,
                slots: Vec::new(),
            },
        );
        let graphs = slots.into_iter().map(|s| match s {
            Slot::Captured(c) => Some(c),
            Slot::Pending | Slot::Failed(_) => None,
        });
        match target {
            Target::Join { name, fitted } => {
                let added = r.plan.join_bucket(name, *fitted);
                for (slot, c) in added.clone().zip(graphs) {
                    let start = r.views.len();
                    let views: Vec<_> = views_of(&r.plan, &r._arenas, slot).collect();
                    r.views.extend(views);
                    r.runners.push(RunnerGraph::of(c, start..r.views.len()));
                }
                r.fence.add_runners(&r.plan, events);
                r.buckets.buckets.push(BucketLive {
                    captured: true,
                    serial: 1,
                    stepped: 0,
                });
            }
            Target::Again { slots, .. } => {
                for (slot, c) in slots.into_iter().zip(graphs) {
                    let views = r.runners[slot].views.clone();
                    r.runners[slot] = RunnerGraph::of(c, views);
                }
                let live = &mut r.buckets.buckets[bucket.0 as usize];
                live.captured = true;
                live.serial += 1;
            }
        }
        Ok(Joined {
            bucket,
            released: victims,
        })
    }
}

impl<B: Backend> Drop for BucketCapture<'_, B> {
    fn drop(&mut self) {
        // Unsealed: the arenas go back to the plan, the graphs go.
        if let Some(capturing) = self.capturing.take() {
            let Capturing { slots, res, .. } = capturing;
            drop(slots);
            let Resources {
                arenas, backend, ..
            } = res;
            drop(backend.into_inner());
            self.replayable._arenas = arenas;
            let _ = self.replayable.backend.trim_graph_memory();
        }
    }
}
