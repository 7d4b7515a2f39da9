//! Phase 2: [`Planned`]. Generations (or packed offsets), arena sizes, fence
//! claims, a report and a fingerprint.

use crate::failed::Failed;
use std::collections::HashMap;
use std::fmt;

use crate::discover::{Discovering, HandoffRecord, PlanConfig, RunnerRecord};
use crate::painter::Claim;
use crate::placement::{self, Column, Timeline};
use crate::vocab::{HandoffId, Key, Request, RunnerId};

mod buckets;
pub(crate) use buckets::{BucketPlan, Fitted};

/// A plan that cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// A policy asked for zero generations (or an overlap depth of zero).
    #[error("policy {policy} asks for zero generations; at least one is needed")]
    ZeroGenerations {
        /// The policy as written.
        policy: Policy,
    },
    /// An arena's size overflowed `u64` while planning.
    #[error("the arena for {key} overflows 64 bits: {} use {key} and need more than 2^64 bytes of it in all ({}); plan fewer generations or smaller requests", describe_users(*.users, .handoffs.len()), describe_largest(.largest, .handoffs))]
    ArenaOverflow {
        /// The key whose arena overflowed.
        key: Key,
        /// Buffer-using runners with capacity of their own in this key.
        users: usize,
        /// The runners with the largest capacities of their own in this
        /// key (up to four), with their bytes, largest first.
        largest: Vec<(RunnerId, u64)>,
        /// The handoffs of this key (the largest first, up to four): what
        /// the arena holds beside runner bytes.
        handoffs: Vec<HandoffUse>,
    },
}

/// One handoff in an error: which, who writes and reads it, its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HandoffUse {
    /// The handoff.
    pub handoff: HandoffId,
    /// Its writer.
    pub writer: RunnerId,
    /// Its readers, in the order they were armed.
    pub readers: Vec<RunnerId>,
    /// Its aligned bytes.
    pub bytes: u64,
}

fn describe_users(users: usize, handoffs: usize) -> String {
    match (users, handoffs) {
        (u, 0) => format!("{u} runner(s)"),
        (0, h) => format!("{h} handoff(s)"),
        (u, h) => format!("{u} runner(s) and {h} handoff(s)"),
    }
}

fn describe_largest(largest: &[(RunnerId, u64)], handoffs: &[HandoffUse]) -> String {
    let runners = largest.iter().map(|(r, b)| format!("{r} with {b} bytes"));
    let handoffs = handoffs.iter().map(|h| {
        let readers: Vec<String> = h.readers.iter().map(ToString::to_string).collect();
        let read = match readers.as_slice() {
            [] => "read by none".to_string(),
            r => format!("read by {}", r.join(" and ")),
        };
        format!(
            "{} written by {}, {read}, with {} bytes",
            h.handoff, h.writer, h.bytes
        )
    });
    let (runners, handoffs): (Vec<_>, Vec<_>) = (runners.collect(), handoffs.collect());
    match (runners.is_empty(), handoffs.is_empty()) {
        (false, true) => format!("the largest: {}", runners.join(", ")),
        (true, false) => format!("the largest handoffs: {}", handoffs.join("; ")),
        _ => format!(
            "the largest runners: {}; the largest handoffs: {}",
            runners.join(", "),
            handoffs.join("; ")
        ),
    }
}

/// A failed [`Discovering::plan`]: why, and the discovery back, so a second
/// try (fewer generations, another placement) needs no second eager run.
pub type PlanFailed = Failed<PlanError, Discovering>;

impl<E> Failed<E, Discovering> {
    /// The discovery, as it was, to plan again.
    pub fn into_discovering(self) -> Discovering {
        self.into_input()
    }
}

type Result<T> = std::result::Result<T, PlanError>;

impl Discovering {
    /// Ends discovery and plans arenas and fences. Consumes `self`, so no
    /// request can be recorded after the backward that discovered them.
    ///
    /// # Errors
    ///
    /// [`PlanFailed`] with [`PlanError::ZeroGenerations`] for a policy of
    /// zero, or [`PlanError::ArenaOverflow`] when an arena would not fit in
    /// 64 bits; the discovery comes back inside
    /// ([`PlanFailed::into_discovering`]).
    ///
    /// ```
    /// use replay_arena::{Discovering, PlanConfig, PlanError, Policy, Request, Domain, DType, RunnerId};
    /// let q = Request::new(Domain::Device, DType::F32, 64);
    /// let discovery = Discovering::from_runners(PlanConfig::new(), [(RunnerId(0), [q])])?;
    /// let failed = discovery.plan(Policy::Generations(0)).unwrap_err();
    /// assert!(matches!(failed.error(), PlanError::ZeroGenerations { .. }));
    /// let planned = failed.into_discovering().plan(Policy::Generations(1))?; // no second backward
    /// # Ok::<(), replay_arena::Error>(())
    /// ```
    pub fn plan(self, policy: impl Into<PlacedPolicy>) -> std::result::Result<Planned, PlanFailed> {
        let mut discovering = self;
        let records = std::mem::take(&mut discovering.runners);
        let handoffs = std::mem::take(&mut discovering.handoffs);
        let config = discovering.config.clone();
        let names = discovering.buckets.clone();
        Planned::new(config, records, handoffs, &names, policy.into()).map_err(
            |(error, records, handoffs)| {
                // The records come back unchanged: the discovery is as it was.
                discovering.runners = records;
                discovering.handoffs = handoffs;
                Failed::new(error, discovering)
            },
        )
    }
}

/// How many runners' buffers may be live at once.
///
/// `Display` writes it in the workload format's snake case, its kind and
/// its count: `generations(2)`, `module_kinds(3)`, `overlap_depth(4)`;
/// [`Policy::from_name`] reads that back, and with the `serde` feature it is
/// that string (`"generations(2)"`), as reports and the plan explorer print
/// it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Policy {
    /// Exactly this many generations (at least 1).
    Generations(usize),
    /// Megatron-LM's rule: one generation when at most one
    /// local-graph module kind is configured, two when several are.
    ModuleKinds(usize),
    /// As many generations as runner graphs can really be in flight at once
    /// (for example the size of the runner-stream pool; at least 1).
    OverlapDepth(usize),
}

impl Policy {
    /// The generation count the policy asks for, before capping at the number
    /// of buffer-using runners.
    ///
    /// # Errors
    ///
    /// [`PlanError::ZeroGenerations`] for a count of zero.
    pub fn requested(self) -> Result<usize> {
        let n = match self {
            Policy::Generations(n) | Policy::OverlapDepth(n) => n,
            Policy::ModuleKinds(k) => {
                if k <= 1 {
                    1
                } else {
                    2
                }
            }
        };
        if n == 0 {
            return Err(PlanError::ZeroGenerations { policy: self });
        }
        Ok(n)
    }

    /// This policy with the [`Placement::Packed`] placement.
    pub fn packed(self) -> PlacedPolicy {
        self.placed(Placement::Packed)
    }

    /// This policy with the [`Placement::RoundRobin`] placement (what a bare
    /// `Policy` converts into), as a [`PlacedPolicy`], so that either placement
    /// can be chosen in one expression:
    ///
    /// ```
    /// use replay_arena::{Discovering, PlanConfig, Policy};
    ///
    /// let packed = std::env::args().any(|a| a == "--packed");
    /// let policy = Policy::OverlapDepth(2);
    /// let placed = if packed { policy.packed() } else { policy.round_robin() };
    /// let planned = Discovering::new(PlanConfig::new()).plan(placed)?;
    /// # drop(planned);
    /// # Ok::<(), replay_arena::Error>(())
    /// ```
    pub fn round_robin(self) -> PlacedPolicy {
        self.placed(Placement::RoundRobin)
    }

    /// This policy with the given placement.
    pub fn placed(self, placement: Placement) -> PlacedPolicy {
        PlacedPolicy {
            policy: self,
            placement,
        }
    }
}

/// A kind of policy: its name and how it is made from its count.
type PolicyKind = (&'static str, fn(usize) -> Policy);

impl Policy {
    /// Each kind of policy by its name.
    const KINDS: [PolicyKind; 3] = [
        ("generations", Policy::Generations),
        ("module_kinds", Policy::ModuleKinds),
        ("overlap_depth", Policy::OverlapDepth),
    ];

    /// The policy's kind, by name, and its count.
    fn parts(self) -> (&'static str, usize) {
        match self {
            Policy::Generations(n) => (Policy::KINDS[0].0, n),
            Policy::ModuleKinds(k) => (Policy::KINDS[1].0, k),
            Policy::OverlapDepth(d) => (Policy::KINDS[2].0, d),
        }
    }

    /// Parses what `Display` writes (`generations(2)`, `module_kinds(3)`,
    /// `overlap_depth(4)`).
    ///
    /// ```
    /// use replay_arena::Policy;
    ///
    /// assert_eq!(Policy::from_name("overlap_depth(4)"), Some(Policy::OverlapDepth(4)));
    /// assert_eq!(Policy::Generations(2).to_string(), "generations(2)");
    /// assert_eq!(Policy::from_name("Generations(2)"), None);
    /// ```
    pub fn from_name(name: &str) -> Option<Policy> {
        let (kind, count) = name.strip_suffix(')')?.split_once('(')?;
        let count = count.parse().ok()?;
        Policy::KINDS
            .iter()
            .find(|(name, _)| *name == kind)
            .map(|(_, policy)| policy(count))
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (kind, count) = self.parts();
        write!(f, "{kind}({count})")
    }
}

/// Where each runner's bytes go.
///
/// `Display` writes its [`Placement::name`] (`round_robin`, `packed`, the
/// workload format's snake case), [`Placement::from_name`] reads it back, and
/// with the `serde` feature it is that string (`"round_robin"`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Placement {
    /// Megatron-LM's placement: the k-th buffer-using runner uses generation
    /// `k % G`; each (generation, key) arena is the max over its runners; one
    /// fence per generation.
    #[default]
    RoundRobin,
    /// One arena per key; each runner gets a fixed offset such that any `G`
    /// consecutive buffer-using runners occupy disjoint ranges; fences follow
    /// overlapping ranges.
    Packed,
}

impl Placement {
    /// Both placements, in declaration order.
    pub const ALL: [Placement; 2] = [Placement::RoundRobin, Placement::Packed];

    /// The name reports print: `round_robin` or `packed`.
    pub const fn name(self) -> &'static str {
        match self {
            Placement::RoundRobin => "round_robin",
            Placement::Packed => "packed",
        }
    }

    /// Parses [`Placement::name`].
    pub fn from_name(name: &str) -> Option<Placement> {
        Placement::ALL.into_iter().find(|p| p.name() == name)
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// [`Policy`] and [`Placement`] by their names (feature `serde`).
#[cfg(feature = "serde")]
mod names {
    use serde::de::Deserializer;
    use serde::{Deserialize, Serialize, Serializer};

    use super::{Placement, Policy};
    use crate::vocab::names::ByName;

    impl Serialize for Policy {
        fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            serializer.collect_str(self)
        }
    }

    impl<'de> Deserialize<'de> for Policy {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Policy, D::Error> {
            deserializer.deserialize_str(ByName {
                what: "policy",
                parse: Policy::from_name,
                names: || {
                    let kinds = Policy::KINDS.iter();
                    kinds.map(|(kind, _)| format!("{kind}(N)")).collect()
                },
            })
        }
    }

    crate::vocab::names::by_name! {
        Placement => "placement",
    }
}

/// A policy with its placement: what [`Discovering::plan`] takes and what
/// [`Planned::placed_policy`] gives back. A bare [`Policy`] converts into the
/// round-robin one; [`Policy::packed`], [`Policy::round_robin`] and
/// [`Policy::placed`] name the placement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct PlacedPolicy {
    /// How many runners may be in flight at once.
    pub policy: Policy,
    /// Where their bytes go.
    pub placement: Placement,
}

impl From<Policy> for PlacedPolicy {
    fn from(policy: Policy) -> PlacedPolicy {
        PlacedPolicy {
            policy,
            placement: Placement::RoundRobin,
        }
    }
}

/// One arena the plan allocates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct ArenaPlan {
    /// Its key.
    pub key: Key,
    /// Its generation under round-robin placement (`None` when packed, and
    /// for the arena of a key that only handoffs use).
    pub generation: Option<usize>,
    /// It holds handoffs of the key, each placed for its lifetime (writer to
    /// last reader, and `G - 1` runners more) beside the runners' bytes:
    /// bytes a runner does not use while a handoff is live hold it.
    #[cfg_attr(feature = "serde", serde(default))]
    pub handoffs: bool,
    /// Its size in bytes (a multiple of the domain's alignment).
    pub bytes: u64,
}

/// The bytes of one key a runner owns in one arena: its extent, out of
/// which capture hands out the runner's views (a view's own sub-views are
/// [`View::slice`](crate::View::slice)'s).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Extent {
    /// The key.
    pub key: Key,
    /// Index into [`Planned::arenas`].
    pub arena: usize,
    /// Byte offset inside that arena (aligned).
    pub offset: u64,
    /// Bytes owned (the runner's capacity for the key).
    pub bytes: u64,
}

/// Everything the plan decided for one runner.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct RunnerPlan {
    pub(crate) record: RunnerRecord,
    /// Position among buffer-using runners, in capture order.
    pub(crate) position: Option<usize>,
    /// Round-robin generation.
    pub(crate) generation: Option<usize>,
    /// One extent per key, in key order.
    pub(crate) extents: Vec<Extent>,
    /// Byte ranges of fence regions this runner's replay overwrites.
    pub(crate) claims: Vec<Claim>,
}

/// Everything the plan decided for one handoff.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct HandoffPlan {
    pub(crate) record: HandoffRecord,
    /// Index into [`Planned::arenas`], and the byte offset there.
    pub(crate) place: Place,
    /// Aligned bytes.
    pub(crate) bytes: u64,
    /// The bytes its writer's replay overwrites.
    pub(crate) claim: Claim,
}

/// Where one request's view lies ([`Planned::place`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Place {
    /// Index into [`Planned::arenas`].
    pub(crate) arena: usize,
    /// Byte offset inside that arena.
    pub(crate) offset: u64,
}

impl RunnerPlan {
    pub(crate) fn id(&self) -> RunnerId {
        self.record.id
    }

    /// Whether the fence tracks this runner's replays: it owns bytes (its
    /// requests or the handoffs it writes).
    pub(crate) fn is_fenced(&self) -> bool {
        self.position.is_some() || !self.record.writes.is_empty()
    }

    /// Whether sealing needs this runner's graph: it owns bytes or reads
    /// a handoff.
    pub(crate) fn needs_graph(&self) -> bool {
        self.is_fenced() || !self.record.reads.is_empty()
    }

    pub(crate) fn extent(&self, key: Key) -> Option<&Extent> {
        self.extents.iter().find(|s| s.key == key)
    }
}

/// Phase 2 of 5: a plan for arenas, views and fences, made from discovery.
///
/// Pure data: it can be inspected ([`Planned::report`]), compared across ranks
/// ([`Planned::fingerprint`]) and then turned into real arenas with
/// [`Planned::allocate`]. Discovery is gone once planned:
///
/// ```compile_fail
/// use replay_arena::{Discovering, PlanConfig, Policy, Request, Domain, DType, RunnerId};
/// let mut discovery = Discovering::new(PlanConfig::new());
/// let planned = discovery.plan(Policy::Generations(2)).unwrap();
/// discovery.arm(RunnerId(0)); // use of moved value
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Planned {
    pub(crate) config: PlanConfig,
    pub(crate) placed_policy: PlacedPolicy,
    pub(crate) generations: usize,
    pub(crate) runners: Vec<RunnerPlan>,
    pub(crate) arenas: Vec<ArenaPlan>,
    /// Number of fence regions.
    pub(crate) fence_regions: usize,
    /// (runner, slot), sorted by runner: the one lookup every phase uses.
    pub(crate) index: Vec<(RunnerId, usize)>,
    /// Handoffs, by id.
    pub(crate) handoffs: Vec<HandoffPlan>,
    /// Shape buckets, by id, each with its separate plan; empty when
    /// discovery declared at most one ([`Discovering::bucket`]).
    pub(crate) buckets: Vec<BucketPlan>,
    /// The one bucket's name when `buckets` is empty.
    pub(crate) bucket_name: String,
}

impl Planned {
    /// Plans `records` in the buckets `names` declares (one bucket plan
    /// when at most one); on failure hands them back unchanged.
    #[allow(clippy::type_complexity)]
    pub(crate) fn new(
        config: PlanConfig,
        records: Vec<RunnerRecord>,
        handoffs: Vec<HandoffRecord>,
        names: &[String],
        placed_policy: PlacedPolicy,
    ) -> std::result::Result<Planned, (PlanError, Vec<RunnerRecord>, Vec<HandoffRecord>)> {
        if names.len() > 1 {
            return buckets::plan(config, records, handoffs, names, placed_policy);
        }
        let name = names
            .first()
            .map_or(crate::discover::DEFAULT_BUCKET, String::as_str)
            .to_string();
        let mut planned = Planned::new_single(config, records, handoffs, placed_policy)?;
        planned.bucket_name = name;
        Ok(planned)
    }

    /// Plans `records` as one bucket.
    #[allow(clippy::type_complexity)]
    pub(crate) fn new_single(
        config: PlanConfig,
        records: Vec<RunnerRecord>,
        handoffs: Vec<HandoffRecord>,
        placed_policy: PlacedPolicy,
    ) -> std::result::Result<Planned, (PlanError, Vec<RunnerRecord>, Vec<HandoffRecord>)> {
        let requested = match placed_policy.policy.requested() {
            Ok(n) => n,
            Err(e) => return Err((e, records, handoffs)),
        };
        let using = records.iter().filter(|r| !r.capacity.is_empty()).count();
        let g = requested.min(using).max(1);
        let mut runners = positioned(records, placed_policy.placement, g);
        let using: Vec<usize> = (0..runners.len())
            .filter(|&i| runners[i].position.is_some())
            .collect();

        let timeline = Timeline::new(using.clone(), g);
        let inputs = key_inputs(&runners, &using, &handoffs, g);
        let shares = work_shares(&inputs, config.exact_search());
        let mut arenas: Vec<ArenaPlan> = Vec::new();
        // Per handoff: its place and aligned bytes.
        let mut places: Vec<Option<(Place, u64)>> = vec![None; handoffs.len()];
        for (input, &(work, handoff_work, exact)) in inputs.iter().zip(&shares) {
            let (cap, items) = (&input.column, &input.handoffs);
            let mut placing = Placing {
                runners: &mut runners,
                using: &using,
                arenas: &mut arenas,
                places: &mut places,
            };
            let placed = match placed_policy.placement {
                Placement::RoundRobin => {
                    placement::round_robin_shared(cap, items, &timeline, handoff_work)
                        .map(|layout| placing.round_robin(input, layout, g))
                }
                Placement::Packed => placement::packed_shared(
                    cap,
                    items,
                    &timeline,
                    (work, handoff_work, exact),
                    None,
                )
                .map(|layout| {
                    placing.packed(input, &layout.runners, &layout.handoffs, layout.bytes)
                }),
            };
            if placed.is_none() {
                return Err(overflowed(input, runners, &using, handoffs));
            }
        }

        let handoffs = handoffs.into_iter().zip(places).collect();
        Ok(Planned::assemble(
            config,
            placed_policy,
            g,
            runners,
            arenas,
            handoffs,
            Vec::new(),
        ))
    }

    /// The plan of runners with their extents and handoffs with their
    /// places: the fence regions and every claim, derived from the arenas
    /// and those places (exact bytes, whichever bucket placed them).
    pub(crate) fn assemble(
        config: PlanConfig,
        placed_policy: PlacedPolicy,
        g: usize,
        mut runners: Vec<RunnerPlan>,
        arenas: Vec<ArenaPlan>,
        handoffs: Vec<(HandoffRecord, Option<(Place, u64)>)>,
        buckets: Vec<BucketPlan>,
    ) -> Planned {
        let regions = fence_regions(&arenas, placed_policy.placement, g);
        assign_claims(&mut runners, &regions, placed_policy.placement);
        let fence_regions = match placed_policy.placement {
            Placement::RoundRobin => g + regions.iter().flatten().count(),
            Placement::Packed => arenas.len(),
        };
        let handoffs: Vec<HandoffPlan> = handoffs
            .into_iter()
            .filter_map(|(record, place)| {
                let (place, bytes) = place?;
                let region = regions[place.arena]?;
                Some(HandoffPlan {
                    record,
                    place,
                    bytes,
                    claim: Claim {
                        region,
                        lo: place.offset,
                        hi: place.offset + bytes,
                    },
                })
            })
            .collect();
        let index = runner_index(&runners);
        Planned {
            config,
            placed_policy,
            generations: g,
            runners,
            arenas,
            fence_regions,
            index,
            handoffs,
            buckets,
            bucket_name: String::new(),
        }
    }

    /// The config the plan was made under.
    pub fn config(&self) -> &PlanConfig {
        &self.config
    }

    /// The policy and placement.
    pub fn placed_policy(&self) -> PlacedPolicy {
        self.placed_policy
    }

    /// `G`: the policy's count capped at the number of buffer-using runners
    /// (at least 1). Under packed placement, the window of runners that may be
    /// in flight together.
    pub fn generations(&self) -> usize {
        self.generations
    }

    /// Every arena the plan allocates.
    pub fn arenas(&self) -> &[ArenaPlan] {
        &self.arenas
    }

    /// Total arena bytes (saturating at `u64::MAX`).
    pub fn total_bytes(&self) -> u64 {
        self.arenas
            .iter()
            .map(|a| a.bytes)
            .fold(0, u64::saturating_add)
    }

    /// Runners in capture order.
    pub fn runners(&self) -> impl Iterator<Item = RunnerId> + '_ {
        self.runners.iter().map(|r| r.id())
    }

    /// The name `runner` was armed with, if any.
    pub fn runner_name(&self, runner: RunnerId) -> Option<&str> {
        self.runner(runner).and_then(|r| r.record.name.as_deref())
    }

    /// The requests `runner` recorded in discovery, in order.
    pub fn requests(&self, runner: RunnerId) -> Option<&[Request]> {
        self.runner(runner).map(|r| r.record.requests.as_slice())
    }

    /// The runner's round-robin generation; `None` for a runner that requested
    /// nothing (never fenced), for an unknown runner, and under packed
    /// placement.
    pub fn generation_of(&self, runner: RunnerId) -> Option<usize> {
        self.runner(runner).and_then(|r| r.generation)
    }

    /// The extents a runner owns, one per key it uses.
    pub fn extents_of(&self, runner: RunnerId) -> Option<&[Extent]> {
        self.runner(runner).map(|r| r.extents.as_slice())
    }

    pub(crate) fn runner(&self, runner: RunnerId) -> Option<&RunnerPlan> {
        self.slot(runner).map(|i| &self.runners[i])
    }

    /// Where request `index` of runner slot `slot` lies: the one place
    /// where a view's arena and offset are worked out (capture and
    /// `Replayable::views` both ask here). `None` past the runner's last
    /// request.
    pub(crate) fn place(&self, slot: usize, index: usize) -> Option<Place> {
        let r = &self.runners[slot];
        let request = r.record.requests.get(index)?;
        let extent = r.extent(request.key())?;
        Some(Place {
            arena: extent.arena,
            offset: extent.offset + r.record.offsets.get(index)?,
        })
    }

    /// Every handoff as planned, in id order.
    pub fn handoffs(&self) -> impl Iterator<Item = HandoffInfo> + '_ {
        self.handoffs.iter().enumerate().map(|(i, h)| HandoffInfo {
            id: HandoffId(i as u32),
            request: h.record.request,
            writer: self.runners[h.record.writer].id(),
            readers: h
                .record
                .readers
                .iter()
                .map(|&r| self.runners[r].id())
                .collect(),
            arena: h.place.arena,
            offset: h.place.offset,
        })
    }

    /// The runner's slot (its index in capture order): at its id's place
    /// in the index when the ids are 0, 1, 2, ... (the replay's quick path,
    /// inlined), by binary search otherwise.
    #[inline]
    pub(crate) fn slot(&self, runner: RunnerId) -> Option<usize> {
        // Runner ids 0, 1, 2, ...: the id is its place in the index.
        if let Some(&(id, slot)) = self.index.get(runner.0 as usize) {
            if id == runner {
                return Some(slot);
            }
        }
        self.slot_searched(runner)
    }

    /// [`Planned::slot`] for ids that are not their place in the index.
    #[cold]
    fn slot_searched(&self, runner: RunnerId) -> Option<usize> {
        self.index
            .binary_search_by_key(&runner, |&(r, _)| r)
            .ok()
            .map(|k| self.index[k].1)
    }
}

/// Runner id -> slot, sorted by id ([`Planned::slot`]).
pub(crate) fn runner_index(runners: &[RunnerPlan]) -> Vec<(RunnerId, usize)> {
    let mut index: Vec<(RunnerId, usize)> = runners
        .iter()
        .enumerate()
        .map(|(i, r)| (r.id(), i))
        .collect();
    index.sort_unstable();
    index
}

/// One handoff as planned ([`Planned::handoffs`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct HandoffInfo {
    /// Its id.
    pub id: HandoffId,
    /// What it holds.
    pub request: Request,
    /// The runner that writes it.
    pub writer: RunnerId,
    /// The runners that read it, in capture order.
    pub readers: Vec<RunnerId>,
    /// Index into [`Planned::arenas`] of its arena.
    pub arena: usize,
    /// Its byte offset there.
    pub offset: u64,
}

/// Each handoff's lifetime, in capture order: from its writer to its last
/// reader, and `g - 1` runners more (runners that close may be in flight
/// together: a handoff that reused those bytes at once would make its
/// writer wait for them).
pub(crate) fn handoff_interval(h: &HandoffRecord, g: usize, window: bool) -> placement::Interval {
    let last = h
        .readers
        .iter()
        .copied()
        .max()
        .unwrap_or(h.writer)
        .max(h.writer);
    placement::Interval {
        start: h.writer,
        end: if window {
            last.saturating_add(g - 1)
        } else {
            last
        },
        bytes: h.request.aligned_bytes().unwrap_or(u64::MAX),
    }
}

/// The runners of `records` in capture order, each buffer-using one with
/// its position among them and, under round-robin, its generation
/// (position mod `g`); no extents or claims yet.
fn positioned(records: Vec<RunnerRecord>, placement: Placement, g: usize) -> Vec<RunnerPlan> {
    let mut runners: Vec<RunnerPlan> = Vec::with_capacity(records.len());
    let mut position = 0;
    for record in records {
        let pos = (!record.capacity.is_empty()).then(|| {
            position += 1;
            position - 1
        });
        let keys = record.capacity.len();
        runners.push(RunnerPlan {
            record,
            position: pos,
            generation: match placement {
                Placement::RoundRobin => pos.map(|p| p % g),
                Placement::Packed => None,
            },
            extents: Vec::with_capacity(keys),
            claims: Vec::new(),
        });
    }
    runners
}

/// Where one plan's keys are placed, key by key: the runners' extents, the
/// arenas and the handoffs' places (and aligned bytes).
struct Placing<'p> {
    runners: &'p mut [RunnerPlan],
    /// The slots of the buffer-using runners, by position.
    using: &'p [usize],
    arenas: &'p mut Vec<ArenaPlan>,
    places: &'p mut [Option<(Place, u64)>],
}

impl Placing<'_> {
    /// Key `input` placed round-robin by `layout`: an arena per generation
    /// that has users (sparse, so many keys at a large G cost their users,
    /// not keys x G), each runner at the start of its generation's.
    fn round_robin(&mut self, input: &KeyInput, layout: placement::RoundRobinShared, g: usize) {
        let (key, cap, items) = (input.key, &input.column, &input.handoffs);
        let first = self.arenas.len();
        let mut holds = vec![false; layout.arenas.len()];
        for &(a, _) in &layout.handoffs {
            holds[a] = true;
        }
        for (&(gen, bytes), handoffs) in layout.arenas.iter().zip(holds) {
            self.arenas.push(ArenaPlan {
                key,
                generation: gen,
                handoffs,
                bytes,
            });
        }
        let mine = &self.arenas[first..];
        for (k, bytes) in cap.entries() {
            let gen = k % g;
            let at = mine.partition_point(|a| a.generation < Some(gen));
            self.runners[self.using[k]].extents.push(Extent {
                key,
                arena: first + at,
                offset: 0,
                bytes,
            });
        }
        for ((&h, it), &(a, offset)) in input.members.iter().zip(items).zip(&layout.handoffs) {
            let place = Place {
                arena: first + a,
                offset,
            };
            self.places[h] = Some((place, it.bytes));
        }
    }

    /// Key `input` packed in one arena of `bytes`: its column's runners at
    /// `runners` (in column order), its handoffs at `handoffs`.
    fn packed(&mut self, input: &KeyInput, runners: &[u64], handoffs: &[u64], bytes: u64) {
        let (key, cap, items) = (input.key, &input.column, &input.handoffs);
        let arena = self.arenas.len();
        self.arenas.push(ArenaPlan {
            key,
            generation: None,
            handoffs: !items.is_empty(),
            bytes,
        });
        for ((k, bytes), &offset) in cap.entries().zip(runners) {
            self.runners[self.using[k]].extents.push(Extent {
                key,
                arena,
                offset,
                bytes,
            });
        }
        for ((&h, it), &offset) in input.members.iter().zip(items).zip(handoffs) {
            self.places[h] = Some((Place { arena, offset }, it.bytes));
        }
    }
}

/// A plan that overflowed at `input`'s key: the error, and the records
/// handed back (the discovery is as it was).
fn overflowed(
    input: &KeyInput,
    runners: Vec<RunnerPlan>,
    using: &[usize],
    handoffs: Vec<HandoffRecord>,
) -> (PlanError, Vec<RunnerRecord>, Vec<HandoffRecord>) {
    let error = overflow(input, &runners, using, &handoffs);
    (
        error,
        runners.into_iter().map(|r| r.record).collect(),
        handoffs,
    )
}

/// [`PlanError::ArenaOverflow`] for `input`'s key: the runners whose bytes
/// or handoffs use it, and the largest of those buffers.
fn overflow(
    input: &KeyInput,
    runners: &[RunnerPlan],
    using: &[usize],
    handoffs: &[HandoffRecord],
) -> PlanError {
    let mut largest: Vec<(RunnerId, u64)> = input
        .column
        .entries()
        .map(|(k, bytes)| (runners[using[k]].id(), bytes))
        .collect();
    largest.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let users = largest.len();
    largest.truncate(4);
    let mut uses: Vec<HandoffUse> = input
        .members
        .iter()
        .zip(&input.handoffs)
        .map(|(&h, it)| HandoffUse {
            handoff: HandoffId(h as u32),
            writer: runners[handoffs[h].writer].id(),
            readers: handoffs[h]
                .readers
                .iter()
                .map(|&r| runners[r].id())
                .collect(),
            bytes: it.bytes,
        })
        .collect();
    uses.sort_unstable_by(|a, b| b.bytes.cmp(&a.bytes).then(a.handoff.cmp(&b.handoff)));
    uses.truncate(4);
    PlanError::ArenaOverflow {
        key: input.key,
        users,
        largest,
        handoffs: uses,
    }
}

/// What placement works on for one key.
pub(crate) struct KeyInput {
    /// The key.
    pub(crate) key: Key,
    /// The buffer-using runners that use it (by position), with their
    /// capacity.
    pub(crate) column: Column,
    /// Its handoffs' lifetimes on the plan's [`Timeline`], widened by
    /// `G - 1` ([`handoff_interval`]).
    pub(crate) handoffs: Vec<placement::Interval>,
    /// The id of each of those handoffs.
    pub(crate) members: Vec<usize>,
}

/// Per key, in key order, its runners' capacities and its handoffs: only
/// the users, so many sparse keys cost what their users do. `using` is the
/// slot of each buffer-using runner, in capture order.
pub(crate) fn key_inputs<'h>(
    runners: &[RunnerPlan],
    using: &[usize],
    handoffs: impl IntoIterator<Item = &'h HandoffRecord>,
    g: usize,
) -> Vec<KeyInput> {
    let mut inputs: Vec<KeyInput> = capacities_by_key(runners, using)
        .into_iter()
        .map(|(key, column)| KeyInput {
            key,
            column,
            handoffs: Vec::new(),
            members: Vec::new(),
        })
        .collect();
    for (i, h) in handoffs.into_iter().enumerate() {
        let key = h.request.key();
        let at = match inputs.binary_search_by_key(&key, |k| k.key) {
            Ok(at) => at,
            Err(at) => {
                inputs.insert(
                    at,
                    KeyInput {
                        key,
                        column: Column::new(using.len()),
                        handoffs: Vec::new(),
                        members: Vec::new(),
                    },
                );
                at
            }
        };
        inputs[at].handoffs.push(handoff_interval(h, g, true));
        inputs[at].members.push(i);
    }
    inputs
}

/// Each key's packed search budget for its runner bytes (its users' share
/// of [`placement::WORK_BUDGET`] among every key's), for its handoffs
/// (their share of the same budget among every handoff) and for its exact
/// search (its buffers' share of `exact`, the config's
/// [`PlanConfig::exact_search`], among the keys small enough to search), as
/// planning and reporting both spend it.
pub(crate) fn work_shares(inputs: &[KeyInput], exact: u64) -> Vec<(u64, u64, u64)> {
    let pairs: usize = inputs.iter().map(|k| k.column.len()).sum();
    let handoffs: usize = inputs.iter().map(|k| k.handoffs.len()).sum();
    // Only keys small enough to search exactly share the exact budget.
    let searched = |k: &KeyInput| k.column.len() + k.handoffs.len() <= placement::EXACT_MOST;
    let items: usize = inputs
        .iter()
        .filter(|k| searched(k))
        .map(|k| k.column.len() + k.handoffs.len())
        .sum();
    inputs
        .iter()
        .map(|k| {
            (
                placement::work_share(k.column.len(), pairs),
                placement::work_share(k.handoffs.len(), handoffs),
                if searched(k) {
                    placement::share(exact, k.column.len() + k.handoffs.len(), items)
                } else {
                    0
                },
            )
        })
        .collect()
}

fn capacities_by_key(runners: &[RunnerPlan], using: &[usize]) -> Vec<(Key, Column)> {
    // Models have a handful of keys: a linear scan beats hashing. Past
    // `SCAN` keys (many symmetric groups), a map keeps it linear overall.
    const SCAN: usize = 16;
    let mut columns: Vec<(Key, Column)> = Vec::new();
    let mut lookup: HashMap<Key, usize> = HashMap::new();
    for (k, &i) in using.iter().enumerate() {
        for (&key, &bytes) in &runners[i].record.capacity {
            let found = if columns.len() <= SCAN {
                columns.iter().position(|(q, _)| *q == key)
            } else {
                lookup.get(&key).copied()
            };
            let c = found.unwrap_or_else(|| {
                columns.push((key, Column::new(using.len())));
                if columns.len() == SCAN + 1 {
                    lookup.extend(columns.iter().enumerate().map(|(c, (q, _))| (*q, c)));
                } else if columns.len() > SCAN + 1 {
                    lookup.insert(key, columns.len() - 1);
                }
                columns.len() - 1
            });
            columns[c].1.push(k, bytes);
        }
    }
    columns.sort_unstable_by_key(|(key, _)| *key);
    columns
}

/// The fence region of each arena's exact byte ranges, if it has one:
/// under packed placement every arena is its own region; under round-robin
/// (whose runners claim their whole generation, regions `0..G`) each arena
/// that holds handoffs gets one after those, so that a runner and a handoff
/// that share bytes of it claim the same bytes.
fn fence_regions(arenas: &[ArenaPlan], placement: Placement, g: usize) -> Vec<Option<u32>> {
    let mut next = g as u32;
    arenas
        .iter()
        .enumerate()
        .map(|(i, a)| match placement {
            Placement::Packed => Some(i as u32),
            Placement::RoundRobin if a.handoffs => {
                next += 1;
                Some(next - 1)
            }
            Placement::RoundRobin => None,
        })
        .collect()
}

/// Gives every buffer-using runner the byte ranges its replay claims.
///
/// Round-robin: the whole of its generation (one fence region per
/// generation, so one wait per replay), and where an arena of its
/// generation also holds handoffs, its exact bytes there. Packed: its extent
/// of each key's arena (one region per arena), so it waits only for those
/// that last used the bytes it overwrites.
fn assign_claims(runners: &mut [RunnerPlan], regions: &[Option<u32>], placement: Placement) {
    for r in runners.iter_mut() {
        let generation = match placement {
            Placement::RoundRobin => r.generation.map(|gen| Claim {
                region: gen as u32,
                lo: 0,
                hi: 1,
            }),
            Placement::Packed => None,
        };
        let exact = r.extents.iter().filter_map(|s| {
            regions[s.arena].map(|region| Claim {
                region,
                lo: s.offset,
                hi: s.offset + s.bytes,
            })
        });
        r.claims = generation.into_iter().chain(exact).collect();
    }
}
