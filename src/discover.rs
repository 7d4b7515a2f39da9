//! Phase 1: [`Discovering`]. An eager backward arms each runner in turn and
//! records its requests.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::fmt;

use crate::vocab::{DType, Domain, GroupId, Key, Request, RunnerId};

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

/// Settings shared by every phase: the symmetric groups requests may name.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct PlanConfig {
    groups: Vec<(GroupId, String)>,
    /// Each registered group's index in `groups`: registration and lookup
    /// in `O(log groups)`, so registering and discovering many groups stays
    /// near-linear.
    index: BTreeMap<GroupId, usize>,
}

impl fmt::Debug for PlanConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PlanConfig")
            .field("groups", &self.groups)
            .finish()
    }
}

impl PlanConfig {
    /// A config with no symmetric groups: only [`Domain::Device`] requests.
    pub fn new() -> PlanConfig {
        PlanConfig::default()
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
}

/// Phase 1 of 4: an eager backward records each runner's requests.
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
    index: HashMap<RunnerId, usize>,
}

impl Discovering {
    /// Starts discovery with no runners recorded.
    pub fn new(config: PlanConfig) -> Discovering {
        Discovering {
            config,
            runners: Vec::new(),
            index: HashMap::new(),
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
        self.arm_inner(runner, None)
    }

    /// Like [`Discovering::arm`], and names the runner (`layer47.mlp.bwd`):
    /// reports, workload files and errors show the name beside the id.
    pub fn arm_named(
        &mut self,
        runner: RunnerId,
        name: impl Into<String>,
    ) -> Result<ArmedRunner<'_>> {
        self.arm_inner(runner, Some(name.into()))
    }

    fn arm_inner(&mut self, runner: RunnerId, name: Option<String>) -> Result<ArmedRunner<'_>> {
        if self.index.contains_key(&runner) {
            return Err(DiscoveryError::RunnerArmedTwice { runner });
        }
        self.index.insert(runner, self.runners.len());
        self.runners.push(RunnerRecord {
            id: runner,
            name,
            requests: Vec::new(),
            capacity: BTreeMap::new(),
            offsets: Vec::new(),
        });
        let config = &self.config;
        let record = self.runners.last_mut();
        record
            .map(|record| ArmedRunner { config, record })
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
}

/// One armed runner; requests can only be recorded through it. Dropping it
/// disarms the runner.
#[derive(Debug)]
pub struct ArmedRunner<'d> {
    config: &'d PlanConfig,
    record: &'d mut RunnerRecord,
}

impl ArmedRunner<'_> {
    /// The armed runner.
    pub fn runner(&self) -> RunnerId {
        self.record.id
    }

    /// Records one request; returns its aligned size in bytes. Capacity per
    /// key is the sum of the aligned sizes, so two requests for the same
    /// parameter get two distinct slices.
    ///
    /// # Errors
    ///
    /// [`DiscoveryError::ZeroElements`], [`DiscoveryError::UnknownGroup`]
    /// for a group the config does not register, and
    /// [`DiscoveryError::SizeOverflow`].
    pub fn record(&mut self, request: Request) -> Result<u64> {
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
        let aligned = request
            .aligned_bytes()
            .ok_or_else(|| overflow("request size"))?;
        let offset = self.record.capacity.get(&key).copied().unwrap_or(0);
        let capacity = offset
            .checked_add(aligned)
            .ok_or_else(|| overflow("capacity"))?;
        self.record.capacity.insert(key, capacity);
        self.record.requests.push(request);
        self.record.offsets.push(offset);
        Ok(aligned)
    }
}
