//! What a plan costs, as data and as a table, and its fingerprint.

use std::collections::BTreeMap;
use std::fmt;

use crate::backend::{GraphMemory, Temporaries};
use crate::painter::Painter;
use crate::placement::{self, Timeline};
use crate::plan::{key_inputs, work_shares, Extent, PlacedPolicy, Placement, Planned};
use crate::vocab::{Domain, GroupId, Key, ParamId, Purpose, RunnerId};

mod table;
mod buckets;
pub use buckets::BucketReport;
use table::{occupancy, paragraph, ratio, Align, Table};

/// Arenas listed one by one up to this many; beyond, as a count and range.
const ARENAS_LISTED: usize = 8;

impl Planned {
    /// The plan described as data and, through `Display`, as a table.
    #[doc(alias = "table")]
    #[doc(alias = "summary")]
    pub fn report(&self) -> PlanReport {
        build(self)
    }

    /// A stable 64-bit hash of the layout (placement, generations, every
    /// runner's requests and extents, every arena). Equal on every rank that
    /// discovered the same requests in the same order; symmetric collectives
    /// need that, since they assume equal offsets on every rank.
    pub fn fingerprint(&self) -> u64 {
        fingerprint(self)
    }
}

/// Per-key figures of a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct KeyReport {
    /// The key.
    pub key: Key,
    /// Name of the key with the group's registered name, e.g. "bf16 in symmetric(gtp)".
    pub name: String,
    /// Bytes of each arena the plan allocates for this key, in the order of
    /// [`Planned::arenas`]: one per generation that has users of the key
    /// under round-robin (in generation order; [`ArenaPlan::generation`]
    /// says which), one under packed. Generations without users of the key
    /// have no arena and no entry, so the report stays as large as the plan
    /// whatever `G` is.
    ///
    /// [`ArenaPlan::generation`]: crate::ArenaPlan::generation
    pub arenas: Vec<u64>,
    /// Bytes this plan allocates for the key.
    pub plan_bytes: u64,
    /// What round-robin placement needs for the same `G`.
    pub round_robin_bytes: u64,
    /// What packed placement needs for the same `G`.
    pub packed_bytes: u64,
    /// The lower bound for `G`: the most bytes of the key live at one point
    /// of capture order (runner bytes for the window of `G` runners in
    /// flight, handoffs from their writer to their last reader and the
    /// `G - 1` runners after it); without handoffs, the largest sum of
    /// capacities of `G` consecutive buffer-using runners.
    pub lower_bound: u64,
    /// The best lower bound the report proved: the lower bound, or more
    /// where an exhaustive search shows that a few consecutive runners'
    /// buffers alone need more ([`Optimum`] says which).
    #[cfg_attr(feature = "serde", serde(default))]
    pub best_bound: u64,
    /// Where packed placement stands against the best bound.
    #[cfg_attr(feature = "serde", serde(default))]
    pub optimum: Optimum,
    /// What the per-parameter wgrad ring of size 2 needs: two slots per
    /// parameter for the wgrad reduce-scatter inputs (one per input without
    /// a parameter), plus each handoff of the key in a buffer of its own.
    pub ring_bytes: u64,
    /// The most fence waits one replay of this key's runners needs in steady
    /// state (every runner replayed in capture order).
    pub longest_wait_list: usize,
}

/// Where packed placement of one key stands against the least memory any
/// placement needs ([`KeyReport::best_bound`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Optimum {
    /// Packed placement needs exactly the lower bound: no placement needs
    /// less.
    #[default]
    #[cfg_attr(feature = "serde", serde(rename = "lb"))]
    LowerBound,
    /// The lower bound cannot be reached: an exhaustive search shows that
    /// the buffers of runners `first` to `last` alone need the best bound,
    /// and packed placement needs exactly that. Optimal.
    Proved {
        /// The first runner of the run searched.
        first: RunnerId,
        /// The last runner of the run searched.
        last: RunnerId,
    },
    /// Packed placement needs more than the best bound the report proved
    /// (within its search budget): it may be above the optimum.
    Open,
}

impl Optimum {
    /// `lb`, `proved` or `open`, as the tables print it and its serialized
    /// form names it.
    pub fn name(self) -> &'static str {
        match self {
            Optimum::LowerBound => "lb",
            Optimum::Proved { .. } => "proved",
            Optimum::Open => "open",
        }
    }
}

/// Per-runner figures of a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct RunnerReport {
    /// The runner.
    pub runner: RunnerId,
    /// The name it was armed with ([`Discovering::arm_named`](crate::discover::Discovering::arm_named)), if any.
    pub name: Option<String>,
    /// Round-robin generation (`None` for empty runners and packed placement).
    pub generation: Option<usize>,
    /// Number of requests recorded.
    pub requests: usize,
    /// Bytes owned, over all keys.
    pub bytes: u64,
    /// Where they are.
    pub extents: Vec<Extent>,
    /// Fence waits this runner's replay needs in steady state.
    pub wait_list: usize,
    /// What its graph's allocation nodes allocate (its temporaries): known
    /// once captured, so only in [`Replayable::report`](crate::Replayable::report).
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub temporaries: Option<Temporaries>,
}

/// The graph memory the driver holds for a plan's temporaries, estimated
/// from the graphs' own layout, beside what the driver reserves.
///
/// The driver shares its physical graph memory among graphs that do not
/// run at once (a plan's per-runner graphs, and a step graph launched after
/// them), so no reading of the driver splits its reservation by graph:
/// what is measured per graph is the address space the driver laid the
/// graph's temporaries out in ([`Temporaries::span`], read from its
/// allocation nodes), and what is estimated is the physical memory that
/// takes: the span rounded up to the pool's granule. The device then holds
/// about one such share per graph that runs at the same time: the
/// `concurrent` streams the program's replays overlap on
/// ([`Replayable::graph_memory`](crate::Replayable::graph_memory)). A step
/// graph holds its own share beside it
/// ([`StepGraph::graph_memory`](crate::StepGraph::graph_memory)); the device
/// holds the larger of the two, not their sum.
///
/// Checked on an H200 (`tests/gpu/step/graph_memory.rs`): within 10% of the
/// reservation the driver reports for a framework-shaped backward at two
/// sizes, on one stream and two.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct GraphMemoryEstimate {
    /// The granule the estimate rounds to ([`Backend::graph_memory_granule`](crate::backend::Backend::graph_memory_granule)).
    pub granule: u64,
    /// The runner whose graph needs the most, if any graph has temporaries.
    pub largest_runner: Option<RunnerId>,
    /// What that graph needs: its span rounded up to the granule. The
    /// estimate for one stream, on which the driver reuses one share for
    /// every graph launched there in turn.
    pub per_stream: u64,
    /// Graphs with temporaries that run at once, as the program said.
    pub concurrent: usize,
    /// `per_stream` times `concurrent`: what the driver holds for the
    /// plan's per-runner graphs.
    pub bytes: u64,
    /// What the driver reserves for graph memory now, on the whole device
    /// (every plan's and program's: [`Backend::graph_memory_in_use`](crate::backend::Backend::graph_memory_in_use)),
    /// when the backend can tell.
    pub driver: Option<GraphMemory>,
}

impl GraphMemoryEstimate {
    /// What a graph whose temporaries span `span` bytes needs of a pool
    /// that grows by `granule`: whole granules (0 for none).
    pub const fn share(span: u64, granule: u64) -> u64 {
        let g = if granule == 0 { 1 } else { granule };
        span.div_ceil(g).saturating_mul(g)
    }
}

/// What a step graph holds of the driver's graph memory, estimated as for
/// a plan ([`GraphMemoryEstimate`]): the replays that may run at once are
/// those at the same depth of the step's edges, and each takes its runner
/// graph's share and one granule more (on an H200 a step graph of
/// moved-in runner graphs takes one granule above them, one stream or
/// two); the estimate is the largest such sum, twice that for an
/// overlapping step graph, whose two graphs run at once. A chain of
/// handoffs runs one replay at a time whatever its streams; independent
/// runners on two streams run two. Copies cut across temporaries
/// ([`Cut::Across`](crate::Cut::Across)) take more than estimated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct StepGraphMemory {
    /// Its graphs' temporaries (moved in from the runners' step copies).
    pub temporaries: Temporaries,
    /// The streams of its schedule.
    pub lanes: usize,
    /// The granule the estimate rounds to.
    pub granule: u64,
    /// The estimate, in bytes.
    pub bytes: u64,
}

/// The temporaries of one plan's graphs (their memory allocation nodes),
/// from the nodes' sizes: the graph memory this plan needs beside its
/// arenas, whatever else the device's graph memory pool holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct GraphTemporaries {
    /// Runners whose graph allocates temporaries.
    pub runners: usize,
    /// Bytes all the runners' graphs allocate, summed.
    pub total: u64,
    /// The largest one runner's graph allocates.
    pub largest: u64,
    /// The `G` largest summed: what replays need at once with one runner in
    /// flight per generation (round-robin; a packed plan may overlap more).
    pub in_flight: u64,
    /// Bytes the step copies still held allocate (a step graph moves them
    /// in: they become its own).
    pub step_copies: u64,
}

/// A plan described as data; `Display` renders it as a table.
///
/// With the `serde` feature its fields keep their names, the vocabulary its
/// own (`"bf16"`, `"device"`, `{"symmetric": 0}`, `"generations(2)"`,
/// `"round_robin"`), and the fingerprint is the table's 16 hex digits.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct PlanReport {
    /// Policy and placement.
    pub placed_policy: PlacedPolicy,
    /// `G`.
    pub generations: usize,
    /// Runners discovered.
    pub runners_total: usize,
    /// Runners that requested something.
    pub runners_using: usize,
    /// Per-key figures, in key order.
    pub keys: Vec<KeyReport>,
    /// Per-runner figures, in capture order.
    pub runners: Vec<RunnerReport>,
    /// Total bytes this plan allocates.
    pub plan_bytes: u64,
    /// Total round-robin bytes for the same `G`.
    pub round_robin_bytes: u64,
    /// Total packed bytes for the same `G`.
    pub packed_bytes: u64,
    /// Total lower bound.
    pub lower_bound: u64,
    /// Total of the keys' best proved bounds ([`KeyReport::best_bound`]).
    #[cfg_attr(feature = "serde", serde(default))]
    pub best_bound: u64,
    /// Total per-parameter ring bytes (wgrad inputs, plus handoffs in
    /// buffers of their own; see [`KeyReport::ring_bytes`]).
    pub ring_bytes: u64,
    /// The most fence waits any one replay needs in steady state.
    pub longest_wait_list: usize,
    /// Handoffs between runners ([`ArmedRunner::hand_off`](crate::ArmedRunner::hand_off)).
    #[cfg_attr(feature = "serde", serde(default))]
    pub handoffs: usize,
    /// What the handoffs add to the arenas that hold them: their bytes above
    /// the highest runner byte in them (0 where the handoffs fit in bytes
    /// the runners leave free; included in `plan_bytes`).
    #[cfg_attr(feature = "serde", serde(default))]
    pub handoff_bytes: u64,
    /// What the driver holds for graph memory nodes (the temporaries that
    /// captured graphs allocate and free inside themselves), beside the
    /// plan's own bytes: known once graphs exist, so only in
    /// [`Replayable::report`](crate::Replayable::report).
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub graph_memory: Option<GraphMemory>,
    /// What the driver holds for this plan's per-runner graphs, estimated
    /// for one stream ([`Replayable::graph_memory`](crate::Replayable::graph_memory)
    /// with `concurrent` 1): known once graphs exist, so only in
    /// [`Replayable::report`](crate::Replayable::report).
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub graph_memory_estimate: Option<GraphMemoryEstimate>,
    /// What this plan's graphs allocate as temporaries: known once graphs
    /// exist, so only in [`Replayable::report`](crate::Replayable::report).
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub temporaries: Option<GraphTemporaries>,
    /// The plan's shape buckets ([`Discovering::bucket`](crate::Discovering::bucket)),
    /// by id; empty for a plan of one bucket.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Vec::is_empty")
    )]
    pub buckets: Vec<BucketReport>,
    /// What separate plans of the buckets would allocate in all (the sum
    /// of [`BucketReport::alone_bytes`]; `plan_bytes` for one bucket).
    #[cfg_attr(feature = "serde", serde(default))]
    pub separate_bytes: u64,
    /// [`Planned::fingerprint`].
    #[cfg_attr(feature = "serde", serde(with = "fingerprint_hex"))]
    pub fingerprint: u64,
}

/// A fingerprint as the table prints it: 16 hex digits.
#[cfg(feature = "serde")]
mod fingerprint_hex {
    use serde::de::{self, Deserialize, Deserializer};
    use serde::Serializer;

    pub(super) fn serialize<S: Serializer>(v: &u64, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&format_args!("{v:016x}"))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
        let text = String::deserialize(deserializer)?;
        match u64::from_str_radix(&text, 16) {
            Ok(v) if text.len() == 16 => Ok(v),
            _ => Err(de::Error::invalid_value(
                de::Unexpected::Str(&text),
                &"a fingerprint of 16 hex digits",
            )),
        }
    }
}

impl PlanReport {
    /// Plan bytes over the lower bound (1.0 is optimal).
    pub fn plan_over_lower_bound(&self) -> f64 {
        byte_ratio(self.plan_bytes, self.lower_bound)
    }

    /// Round-robin bytes over the lower bound.
    pub fn round_robin_over_lower_bound(&self) -> f64 {
        byte_ratio(self.round_robin_bytes, self.lower_bound)
    }

    /// Packed bytes over the lower bound.
    pub fn packed_over_lower_bound(&self) -> f64 {
        byte_ratio(self.packed_bytes, self.lower_bound)
    }

    /// Ring bytes over plan bytes (above 1.0: the plan saves memory).
    pub fn ring_over_plan(&self) -> f64 {
        byte_ratio(self.ring_bytes, self.plan_bytes)
    }
}

/// `a / b` for byte counts, as the report prints ratios: 1.0 when both are
/// zero, infinity when only `b` is.
pub fn byte_ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        if a == 0 {
            1.0
        } else {
            f64::INFINITY
        }
    } else {
        a as f64 / b as f64
    }
}

/// What one pass over the plan gathers for one key.
struct KeyFacts {
    arenas: Vec<u64>,
    /// The index of its first arena in the plan (its arenas follow).
    first_arena: usize,
    longest_wait_list: usize,
    /// (parameter, aligned size) -> wgrad writers, for the ring.
    writers: BTreeMap<(ParamId, u64), u64>,
    /// Wgrad bytes of requests with no parameter (each its own ring slot).
    anonymous: u64,
    /// The bytes of the key's handoffs, each its own buffer.
    handoff_sum: u64,
    /// Bytes of its arenas above their highest runner byte, where they hold
    /// handoffs.
    handoff_bytes: u64,
}

/// Work the exact searches of one report's best bounds may spend in all,
/// shared by the keys as [`placement::work_share`] shares planning's.
pub(crate) const BOUND_WORK: u64 = 4_000_000;

/// Builds the report in a few passes over runners, requests and arenas.
///
/// Every per-key figure is gathered in one pass keyed by [`Key`] (never a
/// scan of all runners, requests or arenas per key, nor per generation), so
/// the report costs `O((runners + requests + arenas) log keys)`, whatever
/// `G` is (round-robin arenas are listed only where a generation has users).
/// The searches, the other placement of each key (packed for a
/// round-robin plan, round-robin with its handoffs for a packed one), run
/// on each key's sparse column (only the runners that use the key, see
/// [`placement::Column`]) and its handoffs with the same pass and work
/// budgets as planning ([`work_shares`]), so the figure is exactly what
/// that placement would allocate and costs what planning it costs. Where
/// packed placement stays above the lower bound, the best bound spends at
/// most its key's share of [`BOUND_WORK`].
pub(crate) fn build(plan: &Planned) -> PlanReport {
    let g = plan.generations;
    let waits = steady_state_waits(plan);
    let using: Vec<usize> = (0..plan.runners.len())
        .filter(|&i| plan.runners[i].position.is_some())
        .collect();
    let inputs = key_inputs(
        &plan.runners,
        &using,
        plan.handoffs.iter().map(|h| &h.record),
        g,
    );
    let (facts, runner_top) = gather_facts(plan, &waits);
    let context = KeyContext {
        plan,
        shares: work_shares(&inputs, plan.config.exact_search()),
        users: inputs
            .iter()
            .map(|k| k.column.len() + k.handoffs.len())
            .sum(),
        inputs,
        timeline: Timeline::new(using.clone(), g),
        bucketed: (!plan.buckets.is_empty()).then(|| buckets::Figures::of(plan)),
    };
    let names: BTreeMap<GroupId, &str> = plan.config.groups().collect();
    let keys: Vec<KeyReport> = facts
        .into_iter()
        .map(|(key, f)| context.key_report(key, f, &names))
        .collect();
    let handoff_bytes = plan
        .arenas
        .iter()
        .zip(&runner_top)
        .filter(|(a, _)| a.handoffs)
        .map(|(a, &top)| a.bytes.saturating_sub(top))
        .fold(0, u64::saturating_add);
    let sum = |f: fn(&KeyReport) -> u64| keys.iter().map(f).fold(0u64, u64::saturating_add);
    PlanReport {
        placed_policy: plan.placed_policy,
        generations: g,
        runners_total: plan.runners.len(),
        runners_using: using.len(),
        plan_bytes: sum(|k| k.plan_bytes),
        round_robin_bytes: sum(|k| k.round_robin_bytes),
        packed_bytes: sum(|k| k.packed_bytes),
        lower_bound: sum(|k| k.lower_bound),
        best_bound: sum(|k| k.best_bound),
        ring_bytes: sum(|k| k.ring_bytes),
        longest_wait_list: waits.iter().copied().max().unwrap_or(0),
        handoffs: plan.handoffs.len(),
        handoff_bytes,
        graph_memory: None,
        graph_memory_estimate: None,
        temporaries: None,
        buckets: context.bucketed.map(|b| b.buckets).unwrap_or_default(),
        separate_bytes: plan.separate_bytes(),
        keys,
        runners: runner_reports(plan, &waits),
        fingerprint: fingerprint(plan),
    }
}

impl KeyFacts {
    fn new() -> KeyFacts {
        KeyFacts {
            arenas: Vec::new(),
            first_arena: 0,
            longest_wait_list: 0,
            writers: BTreeMap::new(),
            anonymous: 0,
            handoff_sum: 0,
            handoff_bytes: 0,
        }
    }

    /// What the per-parameter ring of size 2 would hold: two slots per
    /// parameter and size written twice or more, one per anonymous wgrad
    /// byte, and every handoff.
    fn ring_bytes(&self) -> u64 {
        self.writers
            .iter()
            .map(|(&(_, size), &n)| size.saturating_mul(n.min(2)))
            .fold(self.anonymous, u64::saturating_add)
            .saturating_add(self.handoff_sum)
    }
}

/// One pass over runners, one over arenas and one over handoffs: the facts
/// of each key, and the highest runner byte of each arena.
fn gather_facts(plan: &Planned, waits: &[usize]) -> (BTreeMap<Key, KeyFacts>, Vec<u64>) {
    let mut facts: BTreeMap<Key, KeyFacts> = BTreeMap::new();
    let mut runner_top = vec![0u64; plan.arenas.len()];
    for (r, &wait_list) in plan.runners.iter().zip(waits) {
        for extent in &r.extents {
            let f = facts.entry(extent.key).or_insert_with(KeyFacts::new);
            f.longest_wait_list = f.longest_wait_list.max(wait_list);
            let top = &mut runner_top[extent.arena];
            *top = (*top).max(extent.offset.saturating_add(extent.bytes));
        }
        for q in &r.record.requests {
            if q.purpose != Purpose::WgradRsInput {
                continue;
            }
            let size = q.aligned_bytes().unwrap_or(u64::MAX);
            let f = facts.entry(q.key()).or_insert_with(KeyFacts::new);
            match q.param {
                Some(p) => *f.writers.entry((p, size)).or_default() += 1,
                None => f.anonymous = f.anonymous.saturating_add(size),
            }
        }
    }
    // The plan lists each key's arenas together, in generation order.
    for (a, arena) in plan.arenas.iter().enumerate() {
        let f = facts.entry(arena.key).or_insert_with(KeyFacts::new);
        if f.arenas.is_empty() {
            f.first_arena = a;
        }
        f.arenas.push(arena.bytes);
        if arena.handoffs {
            f.handoff_bytes = f
                .handoff_bytes
                .saturating_add(arena.bytes.saturating_sub(runner_top[a]));
        }
    }
    for h in &plan.handoffs {
        let f = facts
            .entry(h.record.request.key())
            .or_insert_with(KeyFacts::new);
        f.handoff_sum = f.handoff_sum.saturating_add(h.bytes);
    }
    (facts, runner_top)
}

/// Each runner's line of the report.
fn runner_reports(plan: &Planned, waits: &[usize]) -> Vec<RunnerReport> {
    plan.runners
        .iter()
        .zip(waits)
        .map(|(r, &wait_list)| RunnerReport {
            runner: r.id(),
            name: r.record.name.clone(),
            generation: r.generation,
            requests: r.record.requests.len(),
            bytes: r
                .extents
                .iter()
                .map(|s| s.bytes)
                .fold(0, u64::saturating_add),
            extents: r.extents.clone(),
            wait_list,
            temporaries: None,
        })
        .collect()
}

/// (lower bound, round-robin, packed, best bound, optimum) of one key.
type KeyFigures = (u64, u64, u64, u64, Optimum);

/// What every key's figures are computed from.
struct KeyContext<'p> {
    plan: &'p Planned,
    /// Per key (in key order), its sparse column and handoffs.
    inputs: Vec<crate::plan::KeyInput>,
    /// Per key, its work budgets ([`work_shares`]).
    shares: Vec<(u64, u64, u64)>,
    /// The columns' and handoffs' items in all, for [`BOUND_WORK`]'s shares.
    users: usize,
    timeline: Timeline,
    /// The figures of a bucketed plan, computed per bucket.
    bucketed: Option<buckets::Figures>,
}

impl KeyContext<'_> {
    /// The report of key `key`, from its facts.
    fn key_report(&self, key: Key, f: KeyFacts, names: &BTreeMap<GroupId, &str>) -> KeyReport {
        let plan_bytes = f.arenas.iter().copied().fold(0, u64::saturating_add);
        let at = self.inputs.binary_search_by_key(&key, |k| k.key).ok();
        let figures = self.bucketed.as_ref().map(|b| b.key(key, plan_bytes));
        let (lower_bound, round_robin_bytes, packed_bytes, best_bound, optimum) =
            match (figures, at) {
                (Some(figures), _) => figures,
                (None, None) => (0, plan_bytes, plan_bytes, 0, Optimum::LowerBound),
                (None, Some(at)) => self.figures(at, &f, plan_bytes),
            };
        KeyReport {
            key,
            name: key_name(names, key),
            ring_bytes: f.ring_bytes(),
            longest_wait_list: f.longest_wait_list,
            arenas: f.arenas,
            plan_bytes,
            round_robin_bytes,
            packed_bytes,
            lower_bound,
            best_bound,
            optimum,
        }
    }

    /// The searched figures of key `inputs[at]`, whose plan is `plan_bytes`.
    fn figures(&self, at: usize, f: &KeyFacts, plan_bytes: u64) -> KeyFigures {
        let input = &self.inputs[at];
        let (column, handoffs) = (&input.column, &input.handoffs);
        let lower = placement::lower_bound_shared(column, handoffs, &self.timeline);
        let (rr, packed) = self.both_placements(at, f, plan_bytes);
        let (best, optimum) = if packed <= lower {
            (lower, Optimum::LowerBound)
        } else {
            self.best_bound(at, packed)
        };
        (lower, rr, packed, best, optimum)
    }

    /// (round-robin, packed) bytes of key `inputs[at]`: the plan's own, and
    /// the other placement's, planned with the same budgets.
    fn both_placements(&self, at: usize, f: &KeyFacts, plan_bytes: u64) -> (u64, u64) {
        let (plan, input) = (self.plan, &self.inputs[at]);
        let (column, handoffs) = (&input.column, &input.handoffs);
        let (work, handoff_work, exact) = self.shares[at];
        match plan.placed_policy.placement {
            Placement::RoundRobin => {
                // The plan's own layout is round-robin's, the packed
                // search's candidate.
                let first = f.first_arena;
                let own = placement::RoundRobinShared {
                    arenas: plan.arenas[first..first + f.arenas.len()]
                        .iter()
                        .map(|a| (a.generation, a.bytes))
                        .collect(),
                    handoffs: input
                        .members
                        .iter()
                        .map(|&h| {
                            let place = plan.handoffs[h].place;
                            (place.arena - first, place.offset)
                        })
                        .collect(),
                };
                let packed = placement::packed_shared(
                    column,
                    handoffs,
                    &self.timeline,
                    (work, handoff_work, exact),
                    Some(own),
                );
                (plan_bytes, packed.map_or(u64::MAX, |l| l.bytes))
            }
            Placement::Packed => (
                placement::round_robin_shared(column, handoffs, &self.timeline, handoff_work)
                    .map_or(u64::MAX, |l| l.bytes()),
                plan_bytes,
            ),
        }
    }

    /// The best bound of key `inputs[at]` whose packed layout needs
    /// `packed` bytes, within its share of [`BOUND_WORK`], and whether it
    /// proves `packed` optimal.
    fn best_bound(&self, at: usize, packed: u64) -> (u64, Optimum) {
        let input = &self.inputs[at];
        let (column, handoffs) = (&input.column, &input.handoffs);
        let exact = self.shares[at].2;
        let share = placement::share(BOUND_WORK, column.len() + handoffs.len(), self.users);
        let proof = placement::best_bound(column, handoffs, &self.timeline, packed, (share, exact));
        let slot_id = |slot: usize| {
            self.plan
                .runners
                .get(slot)
                .map_or(RunnerId(u32::MAX), |r| r.id())
        };
        let optimum = match proof.span {
            Some((first, last)) if proof.bytes >= packed => Optimum::Proved {
                first: slot_id(first),
                last: slot_id(last),
            },
            _ => Optimum::Open,
        };
        (proof.bytes, optimum)
    }
}

fn key_name(groups: &BTreeMap<GroupId, &str>, key: Key) -> String {
    match key.domain {
        Domain::Device => key.to_string(),
        Domain::Symmetric(group) => match groups.get(&group) {
            Some(name) => format!("{} in symmetric({name})", key.dtype),
            None => key.to_string(),
        },
    }
}

/// Fence waits per runner when every runner replays in capture order on
/// different streams, in steady state (second pass): the number of distinct
/// runners (and handoff readers' writers) that last used the bytes it
/// claims, its handoffs' included, plus one per handoff it reads.
fn steady_state_waits(plan: &Planned) -> Vec<usize> {
    let mut painter = Painter::new(plan.fence_regions);
    let mut waits = vec![0; plan.runners.len()];
    let mut users = Vec::new();
    let base = plan.runners.len();
    for pass in 0..2 {
        for (i, r) in plan.runners.iter().enumerate() {
            users.clear();
            // Its own claims, then those of the handoffs it writes (each
            // painted as the handoff's own fence slot).
            let claims = || {
                let handoffs = r
                    .record
                    .writes
                    .iter()
                    .map(|h| (base + h.0 as usize, plan.handoffs[h.0 as usize].claim));
                r.claims.iter().map(move |&c| (i, c)).chain(handoffs)
            };
            for (_, c) in claims() {
                painter.users(c, &mut users);
            }
            for (owner, c) in claims() {
                painter.paint(c, owner as u32);
            }
            if pass == 1 {
                waits[i] = users.len() + r.record.reads.len();
            }
        }
    }
    waits
}

/// FNV-1a over a canonical encoding of the layout.
pub(crate) fn fingerprint(plan: &Planned) -> u64 {
    let mut h = Fnv::default();
    h.u64(match plan.placed_policy.placement {
        Placement::RoundRobin => 1,
        Placement::Packed => 2,
    });
    h.u64(plan.generations as u64);
    for r in &plan.runners {
        h.u64(u64::from(r.id().0));
        h.u64(r.record.requests.len() as u64);
        for q in &r.record.requests {
            h.key(q.key());
            h.u64(q.elements);
        }
        for s in &r.extents {
            h.key(s.key);
            h.u64(s.arena as u64);
            h.u64(s.offset);
            h.u64(s.bytes);
        }
    }
    for a in &plan.arenas {
        h.key(a.key);
        h.u64(a.bytes);
    }
    for x in &plan.handoffs {
        h.key(x.record.request.key());
        h.u64(x.record.request.elements);
        h.u64(x.record.writer as u64);
        h.u64(x.record.readers.len() as u64);
        for &r in &x.record.readers {
            h.u64(r as u64);
        }
        h.u64(x.place.arena as u64);
        h.u64(x.place.offset);
    }
    if !plan.buckets.is_empty() {
        h.u64(plan.buckets.len() as u64);
        for r in &plan.runners {
            h.u64(u64::from(r.record.bucket.0));
        }
    }
    h.0
}

struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn u64(&mut self, v: u64) {
        for b in v.to_le_bytes() {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn key(&mut self, key: Key) {
        match key.domain {
            Domain::Device => self.u64(0),
            Domain::Symmetric(g) => self.u64(1 + u64::from(g.0)),
        }
        self.u64(key.dtype as u64);
    }
}

/// Bytes for people: "512 B", "1.50 MiB", "16.00 EiB" (binary units up to
/// EiB, so every `u64` fits; two decimals), as the report's table prints them.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut v = bytes as f64;
    let mut u: usize = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        return format!("{bytes} B");
    }
    // `{v:.2}` by integer arithmetic (reports of many keys print millions
    // of these): `v` is exactly the float of `bytes` over `1024^u`, rounded
    // to two decimals half to even, as float formatting rounds.
    let exact = bytes as f64 as u128;
    let unit = 1u128 << (10 * u);
    let (mut hundredths, rest) = (exact * 100 / unit, exact * 100 % unit);
    if 2 * rest > unit || (2 * rest == unit && hundredths % 2 == 1) {
        hundredths += 1;
    }
    format!("{}.{:02} {}", hundredths / 100, hundredths % 100, UNITS[u])
}

impl PlanReport {
    /// The one-line verdict: what packed placement saves over round-robin at
    /// this `G` (or that it saves nothing), and where this plan stands.
    pub fn verdict(&self) -> String {
        format!("{}; {}", self.comparison(), self.standing())
    }

    /// "this plan is round-robin, 1.000x the lower bound".
    fn standing(&self) -> String {
        format!(
            "this plan is {}, {}x the lower bound",
            self.placed_policy.placement,
            ratio(self.plan_bytes, self.lower_bound)
        )
    }

    /// What packed placement saves over round-robin at this `G`.
    fn comparison(&self) -> String {
        let g = self.generations;
        let (rr, packed) = (self.round_robin_bytes, self.packed_bytes);
        let comparison = if self.runners_using == 0 {
            "no runner uses buffers: nothing to place".to_string()
        } else if packed == u64::MAX && rr != u64::MAX {
            format!(
                "packed at G = {g} would overflow 64 bits; round-robin needs {}",
                human_bytes(rr)
            )
        } else if packed < rr {
            format!(
                "packed at G = {g} saves {} ({:.1}%) over round-robin",
                human_bytes(rr - packed),
                100.0 * (rr - packed) as f64 / rr as f64
            )
        } else if rr < packed {
            format!(
                "round-robin at G = {g} saves {} ({:.1}%) over packed",
                human_bytes(packed - rr),
                100.0 * (packed - rr) as f64 / packed as f64
            )
        } else {
            format!(
                "packed at G = {g} saves nothing over round-robin (both {})",
                human_bytes(rr)
            )
        };
        comparison
    }

    /// Whether any runner has a name (the runner table then shows them).
    fn any_named(&self) -> bool {
        self.runners.iter().any(|r| r.name.is_some())
    }

    /// Each key's number, name and arenas.
    fn key_names(&self) -> Table {
        use Align::Left;
        let arena_head = match self.placed_policy.placement {
            Placement::RoundRobin => "arenas (one per generation that uses the key)",
            Placement::Packed => "arena (one per key)",
        };
        let mut t = Table::new(&[("#", Left), ("key", Left), (arena_head, Left)]);
        for (i, k) in self.keys.iter().enumerate() {
            let arenas = if k.arenas.len() <= ARENAS_LISTED {
                let each: Vec<String> = k.arenas.iter().map(|&b| human_bytes(b)).collect();
                each.join(" | ")
            } else {
                let min = k.arenas.iter().copied().min().unwrap_or(0);
                let max = k.arenas.iter().copied().max().unwrap_or(0);
                format!(
                    "{} arenas, {} to {}",
                    k.arenas.len(),
                    human_bytes(min),
                    human_bytes(max)
                )
            };
            t.row(vec![format!("k{}", i + 1), k.name.clone(), arenas]);
        }
        t
    }

    /// Each key's bytes under each placement, and the totals.
    fn key_table(&self) -> Table {
        use Align::{Left, Right};
        let mut t = Table::new(&[
            ("key", Left),
            ("plan", Right),
            ("lower bound", Right),
            ("round-robin", Right),
            ("packed", Right),
            ("ring(2)", Right),
            ("plan/lb", Right),
            ("optimum", Left),
            ("waits", Right),
        ]);
        for (i, k) in self.keys.iter().enumerate() {
            t.row(vec![
                format!("k{}", i + 1),
                human_bytes(k.plan_bytes),
                human_bytes(k.lower_bound),
                human_bytes(k.round_robin_bytes),
                human_bytes(k.packed_bytes),
                human_bytes(k.ring_bytes),
                ratio(k.plan_bytes, k.lower_bound),
                k.optimum.name().into(),
                k.longest_wait_list.to_string(),
            ]);
        }
        t.row(vec![
            "total".into(),
            human_bytes(self.plan_bytes),
            human_bytes(self.lower_bound),
            human_bytes(self.round_robin_bytes),
            human_bytes(self.packed_bytes),
            human_bytes(self.ring_bytes),
            ratio(self.plan_bytes, self.lower_bound),
            String::new(),
            self.longest_wait_list.to_string(),
        ]);
        t
    }

    /// Why packed placement of a key is above its lower bound, one line per
    /// such key (none when every key is at it).
    pub fn bound_notes(&self) -> Vec<String> {
        self.keys
            .iter()
            .enumerate()
            .filter_map(|(i, k)| {
                let packed = format!(
                    "packed needs {} ({}x the lower bound {})",
                    human_bytes(k.packed_bytes),
                    ratio(k.packed_bytes, k.lower_bound),
                    human_bytes(k.lower_bound)
                );
                let why = match k.optimum {
                    Optimum::LowerBound => return None,
                    Optimum::Proved { first, last } => format!(
                        "{packed}, and that is optimal: no layout of the buffers of {first} to {last} alone fits in less (exhaustive search), so the lower bound cannot be reached"
                    ),
                    Optimum::Open if k.best_bound > k.lower_bound => format!(
                        "{packed}; the best bound proved is {} (exhaustive search of a few runners), so packed may be up to {}x the optimum",
                        human_bytes(k.best_bound),
                        ratio(k.packed_bytes, k.best_bound)
                    ),
                    Optimum::Open => format!(
                        "{packed}; no better bound was proved within the search budget, so packed may be above the optimum"
                    ),
                };
                Some(format!("k{} {}: {why}", i + 1, k.name))
            })
            .collect()
    }

    fn runner_table(&self) -> Table {
        use Align::{Left, Right};
        let named = self.any_named();
        let mut columns = vec![
            ("runner", Left),
            ("requests", Right),
            ("bytes", Right),
            ("waits", Right),
        ];
        match self.placed_policy.placement {
            Placement::RoundRobin => columns.push(("gen", Right)),
            Placement::Packed => columns.extend([
                ("key", Left),
                ("offset", Right),
                ("end", Right),
                ("occupancy", Left),
            ]),
        }
        // Names last: the one column as long as the program makes it, so
        // it wraps rather than pushing the others out of line.
        if named {
            columns.push(("name", Left));
        }
        let mut t = Table::new(&columns);
        let index: BTreeMap<Key, usize> = self
            .keys
            .iter()
            .enumerate()
            .map(|(i, k)| (k.key, i))
            .collect();
        for r in &self.runners {
            let mut head = vec![
                r.runner.to_string(),
                r.requests.to_string(),
                human_bytes(r.bytes),
                r.wait_list.to_string(),
            ];
            let name = || r.name.clone().unwrap_or_else(|| "-".into());
            match self.placed_policy.placement {
                Placement::RoundRobin => {
                    head.push(
                        r.generation
                            .map_or_else(|| "none".into(), |g| g.to_string()),
                    );
                    if named {
                        head.push(name());
                    }
                    t.row(head);
                }
                Placement::Packed if r.extents.is_empty() => {
                    head.extend(["none".into(), String::new(), String::new(), String::new()]);
                    if named {
                        head.push(name());
                    }
                    t.row(head);
                }
                Placement::Packed => {
                    let blank = vec![String::new(); head.len()];
                    for (n, s) in r.extents.iter().enumerate() {
                        let mut row = if n == 0 { head.clone() } else { blank.clone() };
                        let k = index.get(&s.key).copied();
                        let arena = k.map_or(0, |k| self.keys[k].plan_bytes);
                        row.extend([
                            k.map_or_else(|| s.key.to_string(), |k| format!("k{}", k + 1)),
                            human_bytes(s.offset),
                            human_bytes(s.offset.saturating_add(s.bytes)),
                            occupancy(s.offset, s.bytes, arena),
                        ]);
                        if named {
                            row.push(if n == 0 { name() } else { String::new() });
                        }
                        t.row(row);
                    }
                }
            }
        }
        t
    }

    /// What every column of the tables means, and the terms the header
    /// lines use, as a table of two columns; what `{:#}` prints after the
    /// report. True of this report's placement: round-robin's generations or
    /// packed's offsets.
    pub fn legend(&self) -> String {
        struct Shown<'r>(&'r PlanReport);
        impl fmt::Display for Shown<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.legend_table().render(f, "")
            }
        }
        Shown(self).to_string()
    }

    fn legend_table(&self) -> Table {
        use Align::Left;
        let mut t = Table::new(&[("legend:", Left), ("", Left)]);
        let mut line = |term: &str, meaning: &str| t.row(vec![term.into(), meaning.into()]);
        match self.placed_policy.placement {
            Placement::RoundRobin => line(
                "G",
                "generations: sets of arenas; the k-th buffer-using runner (in capture order) uses generation k % G, so G consecutive runners can be in flight at once",
            ),
            Placement::Packed => line(
                "G",
                "how many consecutive buffer-using runners may be in flight at once: packed placement gives any G of them disjoint offsets in one arena per key",
            ),
        }
        line(
            "key",
            "a domain (device memory, or one group's symmetric memory) and a dtype; kN numbers the keys, as the runner table names them",
        );
        match self.placed_policy.placement {
            Placement::RoundRobin => line(
                "arenas",
                "the bytes of each generation's arena of the key (generations without users of the key have none)",
            ),
            Placement::Packed => line("arena", "the bytes of the key's one arena"),
        }
        line("plan", "bytes this plan allocates");
        line(
            "lower bound",
            "per key, the most bytes live at once: capacities of G consecutive buffer-using runners, with the handoffs live then (writer to last reader, and G - 1 runners more): no placement needs less",
        );
        line(
            "round-robin",
            "what round-robin placement needs at this G (the k-th buffer-using runner in generation k % G; each arena the largest of its runners)",
        );
        line(
            "packed",
            "what packed placement needs at this G (one arena per key; any G consecutive runners at disjoint offsets)",
        );
        line(
            "ring(2)",
            "what Megatron-LM's older per-parameter wgrad ring of 2 slots needs for the wgrad reduce-scatter inputs, plus each handoff in a buffer of its own (as without a plan)",
        );
        line("plan/lb", "plan over lower bound (1.000 is optimal)");
        line(
            "optimum",
            "lb: packed placement needs the lower bound; proved: the bound cannot be reached and packed is optimal (exhaustive search); open: packed may be above the optimum (bounds: below the table)",
        );
        line(
            "waits",
            "most fence waits one replay needs in steady state (every runner replayed in capture order, each on its own stream)",
        );
        match self.placed_policy.placement {
            Placement::RoundRobin => line(
                "gen",
                "the runner's generation; none: it requested nothing, owns no bytes and is never fenced",
            ),
            Placement::Packed => {
                line(
                    "offset, end",
                    "the bytes the runner owns in the key's arena; key none: it requested nothing, owns no bytes and is never fenced",
                );
                line(
                    "occupancy",
                    "where those bytes lie in the key's arena, 20 characters wide (# the runner's bytes)",
                );
            }
        }
        if self.any_named() {
            line(
                "name",
                "the name the runner was armed with (Discovering::arm_named); - for none",
            );
        }
        t
    }

    /// What the placement of this report does, in a sentence.
    fn placement_note(&self) -> &'static str {
        match self.placed_policy.placement {
            Placement::RoundRobin => {
                "round-robin: the k-th buffer-using runner (in capture order) uses generation k % G, \
                 a set of arenas of its own, so G consecutive runners can be in flight at once; \
                 packed placement would instead give each runner fixed offsets in one arena per \
                 key, any G consecutive runners at disjoint offsets"
            }
            Placement::Packed => {
                "packed: one arena per key, in which each buffer-using runner has fixed offsets, \
                 any G consecutive runners (in capture order) at disjoint offsets, so they can be \
                 in flight at once; round-robin placement would instead give the k-th runner \
                 generation k % G, a set of arenas of its own"
            }
        }
    }
}

impl fmt::Display for PlanReport {
    /// The header (placement, fingerprint, verdict, each explained where it
    /// appears), the keys, the bytes per key (with totals), the runners,
    /// every line at most 100 characters. The alternate form
    /// (`{:#}`) adds the legend of every column ([`PlanReport::legend`]).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_header(f)?;
        self.write_extras(f)?;
        writeln!(f)?;
        writeln!(f, "keys (a domain and a dtype each):")?;
        self.key_names().render(f, "")?;
        writeln!(f)?;
        writeln!(f, "bytes per key:")?;
        self.key_table().render(f, "")?;
        let notes = self.bound_notes();
        if !notes.is_empty() {
            writeln!(f)?;
            writeln!(f, "bounds:")?;
            for note in notes {
                paragraph(f, "  ", &note, 4)?;
            }
        }
        writeln!(f)?;
        writeln!(f, "runners, in capture order:")?;
        self.runner_table().render(f, "")?;
        writeln!(f)?;
        if f.alternate() {
            self.legend_table().render(f, "")
        } else {
            writeln!(
                f,
                "columns: `{{:#}}` or PlanReport::legend prints what each one means"
            )
        }
    }
}

impl PlanReport {
    /// The table's first lines: placement, verdict, standing, fingerprint.
    fn write_header(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let head = format!(
            "plan: {} placement, G = {} (policy {}): {} runners, {} use buffers",
            self.placed_policy.placement,
            self.generations,
            self.placed_policy.policy,
            self.runners_total,
            self.runners_using,
        );
        paragraph(f, "", &head, 2)?;
        paragraph(f, "  ", self.placement_note(), 2)?;
        paragraph(f, "verdict: ", &self.comparison(), 2)?;
        paragraph(
            f,
            "",
            &format!("{} (the fewest bytes any placement needs)", self.standing()),
            2,
        )?;
        paragraph(
            f,
            "fingerprint: ",
            &format!(
                "{:016x}, a hash of the layout (Planned::fingerprint): ranks that planned the same \
                 offsets have the same one, which symmetric collectives need",
                self.fingerprint
            ),
            2,
        )?;
        Ok(())
    }

    /// The lines only some plans have: handoffs, buckets, graph
    /// temporaries and device graph memory.
    fn write_extras(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.handoffs > 0 {
            paragraph(
                f,
                "",
                &format!(
                    "handoffs: {} between runners, {} above the runners' own bytes (in the totals), \
                     each placed for its lifetime in its key's arenas (a handoff: a buffer one runner \
                     writes and later runners read)",
                    self.handoffs,
                    human_bytes(self.handoff_bytes)
                ),
                2,
            )?;
        }
        if !self.buckets.is_empty() {
            paragraph(f, "", &self.bucket_line(), 2)?;
        }
        if let Some(t) = self.temporaries {
            paragraph(
                f,
                "",
                &format!(
                    "graph temporaries (this plan's graphs): {} runner(s) allocate {} in all, the \
                     largest {}; {} with G = {} runners in flight{}, beside the plan's {}",
                    t.runners,
                    human_bytes(t.total),
                    human_bytes(t.largest),
                    human_bytes(t.in_flight),
                    self.generations,
                    if t.step_copies > 0 {
                        format!("; step copies {} more", human_bytes(t.step_copies))
                    } else {
                        String::new()
                    },
                    human_bytes(self.plan_bytes)
                ),
                2,
            )?;
        }
        if let Some(e) = self.graph_memory_estimate.filter(|e| e.per_stream > 0) {
            paragraph(
                f,
                "",
                &format!(
                    "graph memory for the temporaries, estimated: {} per stream the replays \
                     overlap on (runner {}'s graph, the largest, in {} granules)",
                    human_bytes(e.per_stream),
                    e.largest_runner.map_or(0, |r| r.0),
                    human_bytes(e.granule),
                ),
                2,
            )?;
        }
        if let Some(m) = self.graph_memory {
            paragraph(
                f,
                "",
                &format!(
                    "device graph memory (every plan's and program's, for reference): {} in use, \
                     {} reserved by the driver",
                    human_bytes(m.used),
                    human_bytes(m.reserved),
                ),
                2,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::human_bytes;
    use proptest::strategy::Strategy;

    /// What `human_bytes` printed by float formatting.
    fn by_float(bytes: u64) -> String {
        const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
        let mut v = bytes as f64;
        let mut u = 0;
        while v >= 1024.0 && u + 1 < UNITS.len() {
            v /= 1024.0;
            u += 1;
        }
        if u == 0 {
            format!("{bytes} B")
        } else {
            format!("{v:.2} {}", UNITS[u])
        }
    }

    #[test]
    fn human_bytes_rounds_as_float_formatting_does_at_ties_and_extremes() {
        // 1.125 KiB, 1.375 KiB, 2.005 MiB-ish, 1.5 KiB - 1, and the ends.
        for bytes in [
            1152,
            1408,
            1023,
            1024,
            1535,
            1536,
            2_102_394,
            (1 << 20) + 5 * (1 << 10),
            u64::MAX,
            u64::MAX - 1,
            1 << 63,
            (1 << 53) + 1,
        ] {
            assert_eq!(human_bytes(bytes), by_float(bytes), "{bytes}");
        }
    }

    proptest::proptest! {
        #[test]
        fn human_bytes_prints_as_float_formatting_does(
            bytes in proptest::prop_oneof![
                0u64..1 << 24,
                // Multiples of 1/8 KiB, MiB, GiB: exact ties at two decimals.
                (0u64..1 << 20, 0u32..3).prop_map(|(k, u)| k << (7 + 10 * u)),
                proptest::prelude::any::<u64>(),
            ]
        ) {
            proptest::prop_assert_eq!(human_bytes(bytes), by_float(bytes));
        }
    }
}
