//! Phase 1: [`Discovering`]. An eager backward arms each runner in turn and
//! records its requests.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::fmt;

use crate::vocab::{BucketId, DType, Domain, GroupId, HandoffId, Key, Request, RunnerId};

/// A failed check during discovery (or while building a [`PlanConfig`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DiscoveryError {
    /// A runner was armed for discovery a second time.
    #[error("{runner} was armed twice for discovery; each runner records its requests once, in one eager backward")]
    RunnerArmedTwice {
        /// The runner armed again.
        runner: RunnerId,
    },
    /// A request asked for zero elements.
    #[error("{runner} requested zero elements of {key}; every request needs at least one element")]
    ZeroElements {
        /// The recording runner.
        runner: RunnerId,
        /// The request's key.
        key: Key,
    },
    /// A request named a symmetric group that is not registered in the config.
    #[error("{runner} requested symmetric memory of {group}, which is not registered in the PlanConfig (registered: {})", list_groups(.registered))]
    UnknownGroup {
        /// The recording runner.
        runner: RunnerId,
        /// The unknown group.
        group: GroupId,
        /// The groups that are registered.
        registered: Vec<GroupId>,
    },
    /// A size computation overflowed `u64`.
    #[error("{what} of {runner} for {key} overflows 64 bits ({elements} elements of {dtype})")]
    SizeOverflow {
        /// The runner whose request or capacity overflowed.
        runner: RunnerId,
        /// The key.
        key: Key,
        /// Which size overflowed ("request size" or "capacity").
        what: &'static str,
        /// Elements of the request that tipped it over.
        elements: u64,
        /// Its dtype.
        dtype: DType,
    },
    /// The same group was registered twice in a [`PlanConfig`].
    #[error("{group} is registered twice in the PlanConfig")]
    GroupRegisteredTwice {
        /// The group.
        group: GroupId,
    },
    /// A runner received a handoff this discovery never declared.
    #[error("{runner} receives {handoff}, which this discovery never declared ({declared} handoff(s) declared so far); receive the id `hand_off` returned, after its writer was armed")]
    UnknownHandoff {
        /// The receiving runner.
        runner: RunnerId,
        /// The handoff.
        handoff: HandoffId,
        /// Handoffs declared so far.
        declared: usize,
    },
    /// A runner received its own handoff: a handoff goes from its writer to
    /// later runners.
    #[error("{runner} receives {handoff}, which it writes itself; a handoff is read by runners armed after its writer")]
    OwnHandoff {
        /// The runner.
        runner: RunnerId,
        /// The handoff.
        handoff: HandoffId,
    },
    /// A runner received the same handoff twice.
    #[error(
        "{runner} receives {handoff} twice; receive it once and use its view as often as needed"
    )]
    HandoffReceivedTwice {
        /// The runner.
        runner: RunnerId,
        /// The handoff.
        handoff: HandoffId,
    },
    /// A runner was armed again in another bucket: a runner belongs to
    /// exactly one shape bucket.
    #[error("{runner} was armed in {first} and again in {second}; a runner belongs to exactly one bucket (arm one runner per shape)")]
    RunnerInTwoBuckets {
        /// The runner.
        runner: RunnerId,
        /// The bucket it was armed in first.
        first: BucketId,
        /// The bucket it was armed in again.
        second: BucketId,
    },
    /// A runner was armed in a bucket this discovery never declared.
    #[error("{runner} was armed in {bucket}, which this discovery never declared ({declared} bucket(s) declared); arm in an id `Discovering::bucket` returned")]
    UnknownBucket {
        /// The runner.
        runner: RunnerId,
        /// The bucket.
        bucket: BucketId,
        /// Buckets declared so far.
        declared: usize,
    },
    /// Two buckets were declared under one name.
    #[error("bucket name {name:?} is declared twice (first as {first}); every bucket needs its own name")]
    BucketNamedTwice {
        /// The name.
        name: String,
        /// The bucket first declared under it.
        first: BucketId,
    },
    /// A runner received a handoff written by a runner of another bucket:
    /// buckets never run within one step, so nothing would write it before
    /// the read.
    #[error("{runner} of {bucket} receives {handoff}, written by {writer} of {writer_bucket}; handoffs stay within one bucket")]
    CrossBucketHandoff {
        /// The receiving runner.
        runner: RunnerId,
        /// Its bucket.
        bucket: BucketId,
        /// The handoff.
        handoff: HandoffId,
        /// The handoff's writer.
        writer: RunnerId,
        /// The writer's bucket.
        writer_bucket: BucketId,
    },
}

fn list_groups(groups: &[GroupId]) -> String {
    if groups.is_empty() {
        return "none".into();
    }
    groups
        .iter()
        .map(|g| g.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

type Result<T> = std::result::Result<T, DiscoveryError>;

/// The name of the bucket of runners armed before any bucket was declared.
pub(crate) const DEFAULT_BUCKET: &str = "default";

/// Bucket names by id: the declared ones, or the one `default` bucket.
pub(crate) fn bucket_names(names: &[String]) -> impl Iterator<Item = (BucketId, &str)> {
    let default = names.is_empty().then_some((BucketId(0), DEFAULT_BUCKET));
    let declared = names
        .iter()
        .enumerate()
        .map(|(i, n)| (BucketId(i as u32), n.as_str()));
    default.into_iter().chain(declared)
}

/// Settings shared by every phase: the symmetric groups requests may name,
/// and the budget of the planner's exact search.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct PlanConfig {
    groups: Vec<(GroupId, String)>,
    /// Each registered group's index in `groups`: registration and lookup
    /// in `O(log groups)`, so registering and discovering many groups stays
    /// near-linear.
    index: BTreeMap<GroupId, usize>,
    /// Steps the exact search of packed placement may take over the whole
    /// plan ([`PlanConfig::with_exact_search`]).
    exact_search: u64,
}

impl Default for PlanConfig {
    fn default() -> PlanConfig {
        PlanConfig {
            groups: Vec::new(),
            index: BTreeMap::new(),
            exact_search: PlanConfig::DEFAULT_EXACT_SEARCH,
        }
    }
}

impl fmt::Debug for PlanConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PlanConfig")
            .field("groups", &self.groups)
            .field("exact_search", &self.exact_search)
            .finish()
    }
}

impl PlanConfig {
    /// The exact search's budget unless the program sets one: about 0.05 s
    /// of one core at most for a whole plan (measured on a loaded 2-core
    /// machine), spent only on keys that packed placement leaves above
    /// their lower bound.
    pub const DEFAULT_EXACT_SEARCH: u64 = 2_000_000;

    /// A config with no symmetric groups: only [`Domain::Device`] requests.
    pub fn new() -> PlanConfig {
        PlanConfig::default()
    }

    /// Sets the budget of packed placement's exact search (branch and bound
    /// over each key's live intervals) for the whole plan, in steps (buffer
    /// pairs it looks at; tens of nanoseconds each), shared among the
    /// keys by their number of buffers. The search is anytime: where the
    /// budget runs out, the best layout found so far stands (never above
    /// what the search started from), so a larger workload gets a good
    /// layout, not a cliff; where it finishes, the layout is optimal and
    /// the report says `proved`. A count of steps, not a clock, so every
    /// rank computes the same plan. 0 turns the search off.
    /// Default: [`PlanConfig::DEFAULT_EXACT_SEARCH`].
    ///
    /// ```
    /// use replay_arena::PlanConfig;
    /// let config = PlanConfig::new().with_exact_search(1_000_000);
    /// assert_eq!(config.exact_search(), 1_000_000);
    /// assert_eq!(PlanConfig::new().exact_search(), PlanConfig::DEFAULT_EXACT_SEARCH);
    /// ```
    pub fn with_exact_search(mut self, steps: u64) -> PlanConfig {
        self.exact_search = steps;
        self
    }

    /// The exact search's budget for a whole plan, in steps
    /// ([`PlanConfig::with_exact_search`]).
    pub fn exact_search(&self) -> u64 {
        self.exact_search
    }

    /// Registers a symmetric group under a human-readable name (used in
    /// reports). Registering the same id twice is an error.
    pub fn with_group(mut self, group: GroupId, name: impl Into<String>) -> Result<PlanConfig> {
        match self.index.entry(group) {
            Entry::Occupied(_) => Err(DiscoveryError::GroupRegisteredTwice { group }),
            Entry::Vacant(slot) => {
                slot.insert(self.groups.len());
                self.groups.push((group, name.into()));
                Ok(self)
            }
        }
    }

    /// The registered groups, in registration order.
    pub fn groups(&self) -> impl Iterator<Item = (GroupId, &str)> {
        self.groups.iter().map(|(g, n)| (*g, n.as_str()))
    }

    /// The name a group was registered under.
    pub fn group_name(&self, group: GroupId) -> Option<&str> {
        let &i = self.index.get(&group)?;
        self.groups.get(i).map(|(_, n)| n.as_str())
    }
}

/// What discovery learned about one runner.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct RunnerRecord {
    pub(crate) id: RunnerId,
    /// A human-readable name (`layer47.mlp.bwd`), if one was given.
    pub(crate) name: Option<String>,
    /// Requests in the order they were recorded.
    pub(crate) requests: Vec<Request>,
    /// Sum of aligned request sizes per key.
    pub(crate) capacity: BTreeMap<Key, u64>,
    /// Per request, its byte offset inside the runner's slice of its key:
    /// the key's capacity before it was recorded (bump allocation, done
    /// once, here).
    pub(crate) offsets: Vec<u64>,
    /// Handoffs this runner writes, in declaration order.
    pub(crate) writes: Vec<HandoffId>,
    /// Handoffs this runner reads, in the order it received them.
    pub(crate) reads: Vec<HandoffId>,
    /// The shape bucket it belongs to.
    pub(crate) bucket: BucketId,
}

/// What discovery learned about one handoff.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct HandoffRecord {
    pub(crate) request: Request,
    /// The writer's slot (its index in capture order).
    pub(crate) writer: usize,
    /// The readers' slots, in the order they were armed.
    pub(crate) readers: Vec<usize>,
    /// Its writer's bucket (every reader's too).
    pub(crate) bucket: BucketId,
    /// Its writer's id.
    pub(crate) writer_id: RunnerId,
}

/// Phase 1 of 5: an eager backward records each runner's requests.
///
/// Requests go through the [`ArmedRunner`] guard that [`Discovering::arm`]
/// returns, so recording without arming, or with two runners armed at once,
/// does not compile; dropping the guard disarms.
///
/// ```
/// use replay_arena::{Discovering, PlanConfig, Policy, Request, Domain, DType, RunnerId};
///
/// let mut discovery = Discovering::new(PlanConfig::new());
/// {
///     let mut armed = discovery.arm(RunnerId(0))?;
///     armed.record(Request::new(Domain::Device, DType::BF16, 4096))?;
/// } // disarmed here
/// let planned = discovery.plan(Policy::Generations(2))?;
/// assert_eq!(planned.generations(), 1); // only one runner used buffers
/// # Ok::<(), replay_arena::Error>(())
/// ```
///
/// Two runners cannot be armed at once:
///
/// ```compile_fail
/// use replay_arena::{Discovering, PlanConfig, RunnerId};
/// let mut discovery = Discovering::new(PlanConfig::new());
/// let a = discovery.arm(RunnerId(0)).unwrap();
/// let b = discovery.arm(RunnerId(1)).unwrap();
/// drop((a, b));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Discovering {
    pub(crate) config: PlanConfig,
    pub(crate) runners: Vec<RunnerRecord>,
    pub(crate) handoffs: Vec<HandoffRecord>,
    index: HashMap<RunnerId, usize>,
    /// Declared bucket names, by id; empty while none was declared (then
    /// every runner is in `BucketId(0)`).
    pub(crate) buckets: Vec<String>,
    /// Each declared bucket name's id: declaring many buckets checks each
    /// name in `O(1)`, not against every earlier one.
    bucket_index: HashMap<String, BucketId>,
}

impl Discovering {
    /// Starts discovery with no runners recorded.
    pub fn new(config: PlanConfig) -> Discovering {
        Discovering {
            config,
            runners: Vec::new(),
            handoffs: Vec::new(),
            index: HashMap::new(),
            buckets: Vec::new(),
            bucket_index: HashMap::new(),
        }
    }

    /// Discovery as if each runner, in order, had been armed and had
    /// recorded its requests: for request lists recorded elsewhere, and for
    /// tests.
    ///
    /// # Errors
    ///
    /// The first check of [`Discovering::arm`] or [`ArmedRunner::record`]
    /// that fails.
    pub fn from_runners<R>(
        config: PlanConfig,
        runners: impl IntoIterator<Item = (RunnerId, R)>,
    ) -> Result<Discovering>
    where
        R: IntoIterator<Item = Request>,
    {
        let mut discovery = Discovering::new(config);
        for (runner, requests) in runners {
            let mut armed = discovery.arm(runner)?;
            for request in requests {
                armed.record(request)?;
            }
        }
        Ok(discovery)
    }

    /// The config discovery runs under.
    pub fn config(&self) -> &PlanConfig {
        &self.config
    }

    /// Arms `runner` for recording. Its capture order is the order of the
    /// first (and only) `arm`.
    ///
    /// # Errors
    ///
    /// [`DiscoveryError::RunnerArmedTwice`] for a runner armed before.
    pub fn arm(&mut self, runner: RunnerId) -> Result<ArmedRunner<'_>> {
        self.arm_inner(self.current(), runner, None)
    }

    /// Declares a shape bucket (a batch size, a sequence length: one eager
    /// run per shape) under `name`, and makes it the bucket that
    /// [`Discovering::arm`] and [`Discovering::arm_named`] arm in from now
    /// on. The first bucket declared before any runner is armed is
    /// `BucketId(0)`; runners armed before any declaration are in
    /// `BucketId(0)`, named `default`.
    ///
    /// Each bucket's runners are placed as a plan of their own would place
    /// them, in arenas all buckets share: a key's arena is the largest
    /// bucket's need, not the sum. Runners of different buckets may share
    /// bytes; the fence orders them by those bytes as it orders any two
    /// runners.
    ///
    /// # Errors
    ///
    /// [`DiscoveryError::BucketNamedTwice`].
    ///
    /// ```
    /// use replay_arena::{Discovering, PlanConfig, Policy, Request, Domain, DType, RunnerId};
    /// let req = |n| Request::new(Domain::Device, DType::F32, n);
    /// let mut discovery = Discovering::new(PlanConfig::new());
    /// for (b, batch) in [1u64, 8].into_iter().enumerate() {
    ///     discovery.bucket(format!("bs={batch}"))?;
    ///     discovery.arm(RunnerId(b as u32))?.record(req(1024 * batch))?;
    /// }
    /// let planned = discovery.plan(Policy::Generations(1))?;
    /// assert_eq!(planned.total_bytes(), 8 * 4096); // the largest, not the sum
    /// # Ok::<(), replay_arena::Error>(())
    /// ```
    pub fn bucket(&mut self, name: impl Into<String>) -> Result<BucketId> {
        let name = name.into();
        if let Some(&first) = self.bucket_index.get(&name) {
            return Err(DiscoveryError::BucketNamedTwice { name, first });
        }
        if self.buckets.is_empty() && !self.runners.is_empty() {
            if name == DEFAULT_BUCKET {
                return Err(DiscoveryError::BucketNamedTwice {
                    name,
                    first: BucketId(0),
                });
            }
            self.bucket_index
                .insert(DEFAULT_BUCKET.to_string(), BucketId(0));
            self.buckets.push(DEFAULT_BUCKET.to_string());
        }
        let id = BucketId(self.buckets.len() as u32);
        self.bucket_index.insert(name.clone(), id);
        self.buckets.push(name);
        Ok(id)
    }

    /// The bucket [`Discovering::arm`] arms in: the latest declared.
    fn current(&self) -> BucketId {
        BucketId(self.buckets.len().saturating_sub(1) as u32)
    }

    /// Arms `runner` in `bucket` (as [`Discovering::arm`] does in the
    /// latest declared bucket).
    ///
    /// # Errors
    ///
    /// [`DiscoveryError::UnknownBucket`], [`DiscoveryError::RunnerInTwoBuckets`]
    /// for a runner armed before in another bucket,
    /// [`DiscoveryError::RunnerArmedTwice`] in the same one.
    pub fn arm_in(&mut self, bucket: BucketId, runner: RunnerId) -> Result<ArmedRunner<'_>> {
        self.arm_inner(bucket, runner, None)
    }

    /// [`Discovering::arm_in`] with a name, as [`Discovering::arm_named`].
    ///
    /// # Errors
    ///
    /// As [`Discovering::arm_in`].
    pub fn arm_named_in(
        &mut self,
        bucket: BucketId,
        runner: RunnerId,
        name: impl Into<String>,
    ) -> Result<ArmedRunner<'_>> {
        self.arm_inner(bucket, runner, Some(name.into()))
    }

    /// The declared buckets, by id, with their names (one bucket,
    /// `default`, when none was declared).
    pub fn buckets(&self) -> impl Iterator<Item = (BucketId, &str)> {
        bucket_names(&self.buckets)
    }

    /// The bucket `runner` was armed in.
    pub fn bucket_of(&self, runner: RunnerId) -> Option<BucketId> {
        let i = *self.index.get(&runner)?;
        Some(self.runners[i].bucket)
    }

    /// Like [`Discovering::arm`], and names the runner (`layer47.mlp.bwd`):
    /// reports, workload files and errors show the name beside the id.
    pub fn arm_named(
        &mut self,
        runner: RunnerId,
        name: impl Into<String>,
    ) -> Result<ArmedRunner<'_>> {
        self.arm_inner(self.current(), runner, Some(name.into()))
    }

    fn arm_inner(
        &mut self,
        bucket: BucketId,
        runner: RunnerId,
        name: Option<String>,
    ) -> Result<ArmedRunner<'_>> {
        if let Some(&i) = self.index.get(&runner) {
            let first = self.runners[i].bucket;
            if first != bucket {
                return Err(DiscoveryError::RunnerInTwoBuckets {
                    runner,
                    first,
                    second: bucket,
                });
            }
            return Err(DiscoveryError::RunnerArmedTwice { runner });
        }
        let declared = self.buckets.len().max(1);
        if bucket.0 as usize >= declared {
            return Err(DiscoveryError::UnknownBucket {
                runner,
                bucket,
                declared,
            });
        }
        self.index.insert(runner, self.runners.len());
        self.runners.push(RunnerRecord {
            id: runner,
            name,
            requests: Vec::new(),
            capacity: BTreeMap::new(),
            offsets: Vec::new(),
            writes: Vec::new(),
            reads: Vec::new(),
            bucket,
        });
        let slot = self.runners.len() - 1;
        let config = &self.config;
        let handoffs = &mut self.handoffs;
        let record = self.runners.last_mut();
        record
            .map(|record| ArmedRunner {
                config,
                record,
                handoffs,
                slot,
            })
            .ok_or(DiscoveryError::RunnerArmedTwice { runner })
    }

    /// Runners armed so far, in capture order.
    pub fn runners(&self) -> impl Iterator<Item = RunnerId> + '_ {
        self.runners.iter().map(|r| r.id)
    }

    /// The name `runner` was armed with ([`Discovering::arm_named`]).
    pub fn runner_name(&self, runner: RunnerId) -> Option<&str> {
        let i = *self.index.get(&runner)?;
        self.runners[i].name.as_deref()
    }

    /// The requests `runner` recorded, in order (`None` for a runner never
    /// armed).
    pub fn requests(&self, runner: RunnerId) -> Option<&[Request]> {
        let i = *self.index.get(&runner)?;
        Some(&self.runners[i].requests)
    }

    /// Handoffs declared so far: (id, its request, writer, readers).
    pub fn handoffs(
        &self,
    ) -> impl Iterator<Item = (HandoffId, Request, RunnerId, Vec<RunnerId>)> + '_ {
        self.handoffs.iter().enumerate().map(|(i, h)| {
            (
                HandoffId(i as u32),
                h.request,
                self.runners[h.writer].id,
                h.readers.iter().map(|&r| self.runners[r].id).collect(),
            )
        })
    }
}

/// One armed runner; requests can only be recorded through it. Dropping it
/// disarms the runner.
#[derive(Debug)]
pub struct ArmedRunner<'d> {
    config: &'d PlanConfig,
    record: &'d mut RunnerRecord,
    handoffs: &'d mut Vec<HandoffRecord>,
    slot: usize,
}

impl ArmedRunner<'_> {
    /// The armed runner.
    pub fn runner(&self) -> RunnerId {
        self.record.id
    }

    /// Records one request; returns its aligned size in bytes. Capacity per
    /// key is the sum of the aligned sizes, so two requests for the same
    /// parameter get two distinct views.
    ///
    /// # Errors
    ///
    /// [`DiscoveryError::ZeroElements`], [`DiscoveryError::UnknownGroup`]
    /// for a group the config does not register, and
    /// [`DiscoveryError::SizeOverflow`].
    pub fn record(&mut self, request: Request) -> Result<u64> {
        let aligned = self.check(request)?;
        let runner = self.record.id;
        let key = request.key();
        let offset = self.record.capacity.get(&key).copied().unwrap_or(0);
        let capacity = offset
            .checked_add(aligned)
            .ok_or(DiscoveryError::SizeOverflow {
                runner,
                key,
                what: "capacity",
                elements: request.elements,
                dtype: request.dtype,
            })?;
        self.record.capacity.insert(key, capacity);
        self.record.requests.push(request);
        self.record.offsets.push(offset);
        Ok(aligned)
    }

    /// Declares a buffer this runner writes and later runners read (its
    /// input gradient, which the next layer's backward reads): the plan
    /// places it for its whole lifetime, from this runner to its last
    /// reader, in bytes nothing else live with it uses. In the capture, the
    /// writer takes it with
    /// [`RunnerCapture::hand_off`](crate::RunnerCapture::hand_off) and each
    /// reader with [`RunnerCapture::receive`](crate::RunnerCapture::receive);
    /// the fence makes each reader's replay wait for the writer's write, and
    /// the writer's next replay wait for every reader.
    ///
    /// # Errors
    ///
    /// As [`ArmedRunner::record`].
    ///
    /// ```
    /// use replay_arena::{Discovering, PlanConfig, Request, Domain, DType, RunnerId};
    /// let grad = Request::new(Domain::Device, DType::BF16, 4096);
    /// let mut discovery = Discovering::new(PlanConfig::new());
    /// let h = discovery.arm(RunnerId(0))?.hand_off(grad)?; // layer 1 writes dX
    /// let got = discovery.arm(RunnerId(1))?.receive(h)?;   // layer 0 reads it
    /// assert_eq!(got, grad);
    /// # Ok::<(), replay_arena::Error>(())
    /// ```
    pub fn hand_off(&mut self, request: Request) -> Result<HandoffId> {
        self.check(request)?;
        let id = HandoffId(self.handoffs.len() as u32);
        self.handoffs.push(HandoffRecord {
            request,
            writer: self.slot,
            readers: Vec::new(),
            bucket: self.record.bucket,
            writer_id: self.record.id,
        });
        self.record.writes.push(id);
        Ok(id)
    }

    /// Declares that this runner reads `handoff`, written by a runner armed
    /// before it; returns the handoff's request.
    ///
    /// # Errors
    ///
    /// [`DiscoveryError::UnknownHandoff`] for an id this discovery never
    /// handed out, [`DiscoveryError::OwnHandoff`] for one this runner
    /// writes, [`DiscoveryError::HandoffReceivedTwice`].
    pub fn receive(&mut self, handoff: HandoffId) -> Result<Request> {
        let runner = self.record.id;
        let declared = self.handoffs.len();
        let Some(h) = self.handoffs.get_mut(handoff.0 as usize) else {
            return Err(DiscoveryError::UnknownHandoff {
                runner,
                handoff,
                declared,
            });
        };
        if h.writer == self.slot {
            return Err(DiscoveryError::OwnHandoff { runner, handoff });
        }
        // Readers are armed in capture order and this runner is the latest
        // armed, so a reader it already is can only be the last one: `O(1)`
        // however many readers the handoff has.
        if h.readers.last() == Some(&self.slot) {
            return Err(DiscoveryError::HandoffReceivedTwice { runner, handoff });
        }
        if h.bucket != self.record.bucket {
            return Err(DiscoveryError::CrossBucketHandoff {
                runner,
                bucket: self.record.bucket,
                handoff,
                writer: h.writer_id,
                writer_bucket: h.bucket,
            });
        }
        h.readers.push(self.slot);
        self.record.reads.push(handoff);
        Ok(h.request)
    }

    /// The checks every request passes; its aligned size.
    fn check(&self, request: Request) -> Result<u64> {
        let runner = self.record.id;
        let key = request.key();
        if request.elements == 0 {
            return Err(DiscoveryError::ZeroElements { runner, key });
        }
        if let Domain::Symmetric(group) = request.domain {
            if self.config.group_name(group).is_none() {
                return Err(DiscoveryError::UnknownGroup {
                    runner,
                    group,
                    registered: self.config.groups().map(|(g, _)| g).collect(),
                });
            }
        }
        let overflow = |what| DiscoveryError::SizeOverflow {
            runner,
            key,
            what,
            elements: request.elements,
            dtype: request.dtype,
        };
        request
            .aligned_bytes()
            .ok_or_else(|| overflow("request size"))
    }
}
