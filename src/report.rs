//! What a plan costs, as data and as a table, and its fingerprint.

use std::collections::BTreeMap;
use std::fmt;

use crate::painter::Painter;
use crate::placement::{self, Column};
use crate::plan::{Placement, Planned, Slice, Strategy};
use crate::vocab::{Domain, GroupId, Key, ParamId, Purpose, RunnerId};

/// Per-key figures of a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct KeyReport {
    /// The key.
    pub key: Key,
    /// Name of the key with the group's registered name, e.g. "bf16 in symmetric(gtp)".
    pub name: String,
    /// Bytes of each arena of this key: one per generation under
    /// round-robin (0 where no runner of that generation uses the key), one
    /// under packed.
    pub arenas: Vec<u64>,
    /// Bytes this plan allocates for the key.
    pub plan_bytes: u64,
    /// What round-robin placement needs for the same `G`.
    pub round_robin_bytes: u64,
    /// What packed placement needs for the same `G`.
    pub packed_bytes: u64,
    /// The lower bound for `G`.
    pub lower_bound: u64,
    /// What the per-parameter wgrad ring of size 2 needs (wgrad inputs only).
    pub ring_bytes: u64,
    /// The most fence waits one replay of this key's runners needs in steady
    /// state (every runner replayed in capture order).
    pub longest_wait_list: usize,
}

/// Per-runner figures of a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RunnerReport {
    /// The runner.
    pub runner: RunnerId,
    /// The name it was armed with ([`Discovering::arm_named`](crate::Discovering::arm_named)), if any.
    pub name: Option<String>,
    /// Round-robin generation (`None` for empty runners and packed placement).
    pub generation: Option<usize>,
    /// Number of requests recorded.
    pub requests: usize,
    /// Bytes owned, over all keys.
    pub bytes: u64,
    /// Where they are.
    pub slices: Vec<Slice>,
    /// Fence waits this runner's replay needs in steady state.
    pub wait_list: usize,
}

/// A plan described as data; `Display` renders it as a table.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct PlanReport {
    /// Policy and placement.
    pub strategy: Strategy,
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
    /// Total per-parameter ring bytes (wgrad inputs only).
    pub ring_bytes: u64,
    /// The most fence waits any one replay needs in steady state.
    pub longest_wait_list: usize,
    /// [`Planned::fingerprint`].
    pub fingerprint: u64,
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
    column: Column,
    arenas: Vec<u64>,
    longest_wait_list: usize,
    /// (parameter, aligned size) -> wgrad writers, for the ring.
    writers: BTreeMap<(ParamId, u64), u64>,
    /// Wgrad bytes of requests with no parameter (each its own ring slot).
    anonymous: u64,
}

/// Builds the report in a few passes over runners, requests and arenas.
///
/// Every per-key figure is gathered in one pass keyed by [`Key`] (never a
/// scan of all runners, requests or arenas per key, nor per generation), so
/// the report costs `O((runners + requests + arenas) log keys)` plus its own
/// size (`keys x G` arena figures under round-robin). The one search, the
/// packed column of a round-robin plan, runs on each key's sparse column
/// (only the runners that use the key, see [`placement::Column`]) with the
/// planner's pass budget, which is set by the number of buffer-using runners:
/// it costs what packed planning costs, `O(users x G)` per key and pass,
/// and the passes per key shrink as runners grow. It is computed rather than
/// cached or bounded so the column is exactly what
/// [`Policy::packed`](crate::Policy::packed) would allocate.
pub(crate) fn build(plan: &Planned) -> PlanReport {
    let g = plan.generations;
    let waits = steady_state_waits(plan);
    let using = plan.runners.iter().filter(|r| r.position.is_some()).count();
    let mut facts: BTreeMap<Key, KeyFacts> = BTreeMap::new();
    let fresh = || KeyFacts {
        column: Column::new(using),
        arenas: match plan.strategy.placement {
            Placement::RoundRobin => vec![0; g],
            Placement::Packed => Vec::new(),
        },
        longest_wait_list: 0,
        writers: BTreeMap::new(),
        anonymous: 0,
    };
    for (r, &wait_list) in plan.runners.iter().zip(&waits) {
        if let Some(position) = r.position {
            for (&key, &bytes) in &r.record.capacity {
                facts
                    .entry(key)
                    .or_insert_with(fresh)
                    .column
                    .push(position, bytes);
            }
        }
        for slice in &r.slices {
            let f = facts.entry(slice.key).or_insert_with(fresh);
            f.longest_wait_list = f.longest_wait_list.max(wait_list);
        }
        for q in &r.record.requests {
            if q.purpose != Purpose::WgradRsInput {
                continue;
            }
            let size = q.aligned_bytes().unwrap_or(u64::MAX);
            let f = facts.entry(q.key()).or_insert_with(fresh);
            match q.param {
                Some(p) => *f.writers.entry((p, size)).or_default() += 1,
                None => f.anonymous = f.anonymous.saturating_add(size),
            }
        }
    }
    for a in &plan.arenas {
        let f = facts.entry(a.key).or_insert_with(fresh);
        match a.generation {
            Some(generation) => f.arenas[generation] = a.bytes,
            None => f.arenas.push(a.bytes),
        }
    }
    let names: BTreeMap<GroupId, &str> = plan.config.groups().collect();
    let keys: Vec<KeyReport> = facts
        .into_iter()
        .map(|(key, f)| {
            let plan_bytes = f.arenas.iter().copied().fold(0, u64::saturating_add);
            let (round_robin_bytes, packed_bytes) = match plan.strategy.placement {
                Placement::RoundRobin => (
                    plan_bytes,
                    placement::packed_column(&f.column, g).map_or(u64::MAX, |l| l.bytes),
                ),
                Placement::Packed => (placement::round_robin_bytes(&f.column, g), plan_bytes),
            };
            KeyReport {
                key,
                name: key_name(&names, key),
                arenas: f.arenas,
                plan_bytes,
                round_robin_bytes,
                packed_bytes,
                lower_bound: placement::lower_bound_column(&f.column, g),
                ring_bytes: f
                    .writers
                    .iter()
                    .map(|(&(_, size), &n)| size.saturating_mul(n.min(2)))
                    .fold(f.anonymous, u64::saturating_add),
                longest_wait_list: f.longest_wait_list,
            }
        })
        .collect();
    let runners: Vec<RunnerReport> = plan
        .runners
        .iter()
        .zip(&waits)
        .map(|(r, &wait_list)| RunnerReport {
            runner: r.id(),
            name: r.record.name.clone(),
            generation: r.generation,
            requests: r.record.requests.len(),
            bytes: r
                .slices
                .iter()
                .map(|s| s.bytes)
                .fold(0, u64::saturating_add),
            slices: r.slices.clone(),
            wait_list,
        })
        .collect();
    let sum = |f: fn(&KeyReport) -> u64| keys.iter().map(f).fold(0u64, u64::saturating_add);
    PlanReport {
        strategy: plan.strategy,
        generations: g,
        runners_total: plan.runners.len(),
        runners_using: using,
        plan_bytes: sum(|k| k.plan_bytes),
        round_robin_bytes: sum(|k| k.round_robin_bytes),
        packed_bytes: sum(|k| k.packed_bytes),
        lower_bound: sum(|k| k.lower_bound),
        ring_bytes: sum(|k| k.ring_bytes),
        longest_wait_list: waits.iter().copied().max().unwrap_or(0),
        keys,
        runners,
        fingerprint: fingerprint(plan),
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
/// runners that last used the bytes it claims.
fn steady_state_waits(plan: &Planned) -> Vec<usize> {
    let mut painter = Painter::new(plan.fence_regions);
    let mut waits = vec![0; plan.runners.len()];
    let mut users = Vec::new();
    for pass in 0..2 {
        for (i, r) in plan.runners.iter().enumerate() {
            users.clear();
            for &c in &r.claims {
                painter.users(c, &mut users);
            }
            for &c in &r.claims {
                painter.paint(c, i as u32);
            }
            if pass == 1 {
                waits[i] = users.len();
            }
        }
    }
    waits
}

/// FNV-1a over a canonical encoding of the layout.
pub(crate) fn fingerprint(plan: &Planned) -> u64 {
    let mut h = Fnv::default();
    h.u64(match plan.strategy.placement {
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
        for s in &r.slices {
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

/// Bytes for people: "512 B", "1.50 MiB" (binary units, two decimals), as
/// the report's table prints them.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
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

impl fmt::Display for PlanReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "plan: {} placement, G = {} (policy {}), {} runners ({} use buffers), fingerprint {:016x}",
            self.strategy.placement,
            self.generations,
            self.strategy.policy,
            self.runners_total,
            self.runners_using,
            self.fingerprint
        )?;
        let arena_head = match self.strategy.placement {
            Placement::RoundRobin => "arenas (per generation)",
            Placement::Packed => "arena",
        };
        writeln!(
            f,
            "{:<28} {:>12} {:>12} {:>12} {:>12} {:>12} {:>7} {:>7}  {arena_head}",
            "key", "plan", "lower bound", "round-robin", "packed", "ring(2)", "plan/lb", "waits"
        )?;
        for k in &self.keys {
            let arenas: Vec<String> = k.arenas.iter().map(|&b| human_bytes(b)).collect();
            writeln!(
                f,
                "{:<28} {:>12} {:>12} {:>12} {:>12} {:>12} {:>7.3} {:>7}  {}",
                k.name,
                human_bytes(k.plan_bytes),
                human_bytes(k.lower_bound),
                human_bytes(k.round_robin_bytes),
                human_bytes(k.packed_bytes),
                human_bytes(k.ring_bytes),
                byte_ratio(k.plan_bytes, k.lower_bound),
                k.longest_wait_list,
                arenas.join(" | ")
            )?;
        }
        writeln!(
            f,
            "{:<28} {:>12} {:>12} {:>12} {:>12} {:>12} {:>7.3} {:>7}",
            "total",
            human_bytes(self.plan_bytes),
            human_bytes(self.lower_bound),
            human_bytes(self.round_robin_bytes),
            human_bytes(self.packed_bytes),
            human_bytes(self.ring_bytes),
            self.plan_over_lower_bound(),
            self.longest_wait_list
        )?;
        writeln!(
            f,
            "plan/lower bound {:.3}x, round-robin/lower bound {:.3}x, packed/lower bound {:.3}x, ring/plan {:.3}x",
            self.plan_over_lower_bound(),
            self.round_robin_over_lower_bound(),
            self.packed_over_lower_bound(),
            self.ring_over_plan()
        )?;
        writeln!(
            f,
            "{:<12} {:>4} {:>9} {:>12} {:>6}",
            "runner", "gen", "requests", "bytes", "waits"
        )?;
        for r in &self.runners {
            let gen = r
                .generation
                .map_or_else(|| "-".to_string(), |g| g.to_string());
            writeln!(
                f,
                "{:<12} {:>4} {:>9} {:>12} {:>6}",
                r.runner.to_string(),
                gen,
                r.requests,
                human_bytes(r.bytes),
                r.wait_list
            )?;
        }
        Ok(())
    }
}
