//! Plans and comparisons, and how they print: tables, JSON and Markdown.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt::Write as _;

use replay_arena::{
    byte_ratio, human_bytes, GroupSpec, Optimum, PlacedPolicy, PlanReport, Planned, Policy,
};
use serde::Serialize;
use serde_json::{json, Value};

use crate::Input;

/// How results are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    Text,
    Json,
    Markdown,
}

/// What the columns of a comparison table mean, printed once after them.
pub(crate) const COMPARISON_LEGEND: &str = "\
legend:
G            generations: how many buffer-using runners may be in flight at once
lower bound  per key, the most bytes live at once (G consecutive buffer-using runners, with the
             handoffs live then), summed: no placement needs less
packed       bytes packed placement allocates (one arena per key, any G consecutive runners at
             disjoint offsets)
round-robin  bytes round-robin placement allocates (runner k in generation k % G; each arena the
             largest of its runners)
packed/lb    packed over the lower bound (1.000 is optimal)
rr/lb        round-robin over the lower bound
optimum      lb: packed needs the lower bound in every key; proved: where it does not, an exhaustive
             search proves the bound unreachable and packed optimal; open: packed may be above the
             optimum in some key
ring/packed  what Megatron-LM's older per-parameter wgrad ring of 2 slots needs, over packed (above
             1: packed saves memory)
ring/rr      the same ring over round-robin
";

/// The most characters a line of text output has (the report's tables
/// keep to it too).
pub(crate) const WIDTH: usize = 100;

/// `text` wrapped at spaces into lines of at most [`WIDTH`] characters,
/// each but the first indented by `hang` spaces, each ending in a newline.
/// A line breaks after its last comma where that keeps at least half of
/// it, so clauses stay whole; a word longer than a line (a long path) gets
/// a line of its own.
pub(crate) fn wrap(text: &str, hang: usize) -> String {
    let mut lines: Vec<Vec<&str>> = vec![Vec::new()];
    let width = |words: &[&str], indent: usize| {
        indent
            + words.iter().map(|w| w.chars().count()).sum::<usize>()
            + words.len().saturating_sub(1)
    };
    for word in text.split(' ') {
        let indent = if lines.len() == 1 { 0 } else { hang };
        let line = lines.last_mut().expect("a line");
        line.push(word);
        if line.len() == 1 || width(line, indent) <= WIDTH {
            continue;
        }
        let at = (1..line.len())
            .rev()
            .find(|&i| line[i - 1].ends_with(',') && 2 * width(&line[..i], indent) >= WIDTH)
            .unwrap_or(line.len() - 1);
        let rest = line.split_off(at);
        lines.push(rest);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for (i, line) in lines.iter().enumerate() {
        if i > 0 {
            out.extend(std::iter::repeat_n(' ', hang));
        }
        out.push_str(&line.join(" "));
        out.push('\n');
    }
    out
}

/// "policy generations(2), packed placement".
pub(crate) fn describe(placed_policy: PlacedPolicy) -> String {
    format!(
        "policy {}, {} placement",
        placed_policy.policy, placed_policy.placement
    )
}

/// One JSON document per input; an array when there are several.
pub(crate) fn json_lines<T: Serialize>(values: &[T]) -> Result<String, String> {
    let text = match values {
        [one] => serde_json::to_string_pretty(one),
        all => serde_json::to_string_pretty(all),
    };
    text.map(|t| t + "\n")
        .map_err(|e| format!("writing JSON failed: {e}"))
}

impl Input {
    /// "workload NAME (FILE): N runners{details}", then the source line.
    /// Wrapped at [`WIDTH`], as the report's own lines are.
    fn header(&self, details: &str) -> String {
        let w = &self.workload;
        let head = format!(
            "workload {} ({}): {} runners{details}",
            w.name,
            self.label,
            w.runners.len()
        );
        let mut out = wrap(&head, 2);
        if let Some(source) = &w.source {
            out.push_str(&wrap(&format!("source: {source}"), 2));
        }
        out
    }

    /// Runner `position`'s name, or "runner ID" for a runner without one.
    pub(crate) fn runner_label(&self, position: usize) -> Cow<'_, str> {
        let spec = &self.workload.runners[position];
        match &spec.name {
            Some(name) => Cow::Borrowed(name),
            None => Cow::Owned(format!(
                "runner {}",
                spec.id.map_or(position as u64, u64::from)
            )),
        }
    }

    /// `module_kinds` from the file, or the number of distinct runner names
    /// with digits masked; and where it came from.
    pub(crate) fn module_kinds(&self) -> (usize, &'static str) {
        match self.workload.module_kinds {
            Some(k) => (k, "file"),
            None => {
                let kinds: HashSet<String> = (0..self.workload.runners.len())
                    .map(|i| mask_digits(&self.runner_label(i)))
                    .collect();
                (kinds.len(), "runner names")
            }
        }
    }
}

/// `layer12.mlp.bwd` -> `layer#.mlp.bwd`.
pub(crate) fn mask_digits(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if !c.is_ascii_digit() {
            out.push(c);
        } else if !out.ends_with('#') {
            out.push('#');
        }
    }
    out
}

/// Refuses a report in which a figure saturated at `u64::MAX`: the report's
/// sign that the true figure does not fit in 64 bits.
fn check_figures(report: &PlanReport) -> Result<(), String> {
    let overflow = |what: &str, of: &str| {
        Err(format!(
            "with {}: the {what} of {of} overflow 64 bits, so no plan of this workload fits in \
             memory",
            describe(report.placed_policy)
        ))
    };
    let figures = |plan, round_robin, packed, lower_bound, ring| {
        [
            ("plan bytes", plan),
            ("round-robin bytes", round_robin),
            ("packed bytes", packed),
            ("lower bound bytes", lower_bound),
            ("ring bytes", ring),
        ]
    };
    let per_key = report.keys.iter().map(|k| {
        let f = figures(
            k.plan_bytes,
            k.round_robin_bytes,
            k.packed_bytes,
            k.lower_bound,
            k.ring_bytes,
        );
        (k.name.as_str(), f)
    });
    let r = report;
    let total = figures(
        r.plan_bytes,
        r.round_robin_bytes,
        r.packed_bytes,
        r.lower_bound,
        r.ring_bytes,
    );
    for (of, figures) in per_key.chain(std::iter::once(("all keys", total))) {
        for (what, bytes) in figures {
            if bytes == u64::MAX {
                return overflow(what, of);
            }
        }
    }
    Ok(())
}

/// Plans `input` with `placed_policy` and checks that every figure fits.
fn plan(input: &Input, placed_policy: PlacedPolicy) -> Result<(Planned, PlanReport), String> {
    let planned = input
        .discovery
        .clone()
        .plan(placed_policy)
        .map_err(|e| format!("planning with {} failed: {e}", describe(placed_policy)))?;
    let report = planned.report();
    check_figures(&report)?;
    Ok((planned, report))
}

/// One workload planned with one placed policy.
pub(crate) struct Plan<'i> {
    pub(crate) input: &'i Input,
    pub(crate) planned: Planned,
    pub(crate) report: PlanReport,
}

impl<'i> Plan<'i> {
    pub(crate) fn of(input: &'i Input, placed_policy: PlacedPolicy) -> Result<Plan<'i>, String> {
        let (planned, report) = plan(input, placed_policy)?;
        Ok(Plan {
            input,
            planned,
            report,
        })
    }

    /// The workload's header, then the report's own table (verdict, keys,
    /// runners with their names, legend).
    pub(crate) fn text(&self) -> String {
        let mut out = self.input.header("");
        let report = self.report.to_string();
        // The report's last line says how a program prints the legend; here
        // it follows the last plan.
        let table = match report.rfind("\ncolumns: ") {
            Some(at) => &report[..at + 1],
            None => &report,
        };
        out.push_str(table);
        out.push_str("columns: the legend after the last plan says what each one means\n\n");
        out
    }

    /// The report as data: its own serialized form (`PlanReport`'s), with
    /// where it came from, its ratios and the groups' names. Serialized as
    /// it is written: a million runners need no tree of values.
    pub(crate) fn json(&self) -> PlanDocument<'_> {
        let r = &self.report;
        let w = &self.input.workload;
        PlanDocument {
            workload: Source {
                name: &w.name,
                source: w.source.as_deref(),
                file: &self.input.label,
            },
            report: r,
            ratios: Ratios {
                plan_over_lower_bound: r.plan_over_lower_bound(),
                round_robin_over_lower_bound: r.round_robin_over_lower_bound(),
                packed_over_lower_bound: r.packed_over_lower_bound(),
                ring_over_plan: r.ring_over_plan(),
            },
            groups: self
                .input
                .discovery
                .config()
                .groups()
                .map(|(id, name)| GroupSpec {
                    id: Some(id.0),
                    name: name.to_string(),
                })
                .collect(),
            handoff_places: self.handoff_places(),
        }
    }
}

/// Where a handoff lies and how long it lives: in its key's arena, from its
/// writer to its last reader and the `G - 1` buffer-using runners after it
/// (the span the planner keeps it for).
#[derive(Serialize)]
pub(crate) struct HandoffPlace {
    /// Its id (the order handoffs were declared in).
    pub(crate) id: u32,
    /// The key's index in the report's `keys`.
    #[serde(skip)]
    pub(crate) key: usize,
    /// The key's name.
    pub(crate) key_name: String,
    /// Index of its arena in the plan's arenas.
    pub(crate) arena: usize,
    /// Its byte offset in that arena.
    pub(crate) offset: u64,
    /// Its bytes (aligned).
    pub(crate) bytes: u64,
    /// The runner that writes it.
    pub(crate) writer: u32,
    /// The runners that read it, in capture order.
    pub(crate) readers: Vec<u32>,
    /// Its lifetime, as positions among buffer-using runners in capture
    /// order: live from `from` until `until` (exclusive).
    pub(crate) lifetime: Lifetime,
}

/// Positions among buffer-using runners, `until` exclusive.
#[derive(Serialize, Clone, Copy)]
pub(crate) struct Lifetime {
    pub(crate) from: usize,
    pub(crate) until: usize,
}

impl Plan<'_> {
    /// Every handoff of the plan with its place and lifetime, in id order.
    pub(crate) fn handoff_places(&self) -> Vec<HandoffPlace> {
        let report = &self.report;
        let g = report.generations;
        // A runner's column: the buffer-using runners before it (its own
        // position when it uses buffers).
        let mut column = std::collections::HashMap::new();
        let mut using = 0;
        for r in &report.runners {
            column.insert(r.runner, using);
            if !r.extents.is_empty() {
                using += 1;
            }
        }
        self.planned
            .handoffs()
            .map(|h| {
                let from = column.get(&h.writer).copied().unwrap_or(0);
                let last = h
                    .readers
                    .iter()
                    .filter_map(|r| column.get(r).copied())
                    .max()
                    .unwrap_or(from)
                    .max(from);
                let key = report
                    .keys
                    .binary_search_by_key(&h.request.key(), |k| k.key)
                    .unwrap_or(0);
                HandoffPlace {
                    id: h.id.0,
                    key,
                    key_name: report
                        .keys
                        .get(key)
                        .map_or_else(String::new, |k| k.name.clone()),
                    arena: h.arena,
                    offset: h.offset,
                    bytes: h.request.aligned_bytes().unwrap_or(u64::MAX),
                    writer: h.writer.0,
                    readers: h.readers.iter().map(|r| r.0).collect(),
                    lifetime: Lifetime {
                        from,
                        until: last + g,
                    },
                }
            })
            .collect()
    }
}

/// [`Plan::json`]'s document: the report's fields, beside the workload it
/// planned, the report's ratios, and each group's id and name (the report
/// names groups by id).
#[derive(Serialize)]
pub(crate) struct PlanDocument<'p> {
    workload: Source<'p>,
    #[serde(flatten)]
    report: &'p PlanReport,
    ratios: Ratios,
    groups: Vec<GroupSpec>,
    /// Each handoff's place and lifetime ([`Plan::handoff_places`]).
    handoff_places: Vec<HandoffPlace>,
}

/// The workload a document describes, and the file it came from.
#[derive(Serialize)]
struct Source<'p> {
    name: &'p str,
    source: Option<&'p str>,
    file: &'p str,
}

/// [`PlanReport`]'s ratios.
#[derive(Serialize)]
struct Ratios {
    plan_over_lower_bound: f64,
    round_robin_over_lower_bound: f64,
    packed_over_lower_bound: f64,
    ring_over_plan: f64,
}

/// One policy in the comparison: both placements' bytes and the lower bound.
pub(crate) struct Row {
    policy: Policy,
    generations: usize,
    lower_bound: u64,
    round_robin: u64,
    packed: u64,
    /// The keys' [`Optimum`]s, summed up: `open` if any key is open, else
    /// `proved` if any key is proved, else `lb`.
    optimum: &'static str,
    /// With shape buckets: what separate plans of the buckets would
    /// allocate, (round-robin, packed).
    separate: Option<(u64, u64)>,
}

impl Row {
    fn packed_over_lower_bound(&self) -> f64 {
        byte_ratio(self.packed, self.lower_bound)
    }

    fn round_robin_over_lower_bound(&self) -> f64 {
        byte_ratio(self.round_robin, self.lower_bound)
    }
}

/// `open` if packed may be above the optimum in some key, else `proved`
/// if some key's bound is exhaustive, else `lb`.
fn summary(report: &PlanReport) -> &'static str {
    let all = || report.keys.iter().map(|k| k.optimum);
    if all().any(|o| o == Optimum::Open) {
        Optimum::Open.name()
    } else if all().any(|o| o != Optimum::LowerBound) {
        "proved"
    } else {
        Optimum::LowerBound.name()
    }
}

/// Every policy of the comparison for one workload.
pub(crate) struct Comparison<'i> {
    input: &'i Input,
    /// Shape buckets of the workload (0 without buckets).
    buckets: usize,
    runners_using: usize,
    module_kinds: usize,
    module_kinds_from: &'static str,
    ring: u64,
    rows: Vec<Row>,
}

impl<'i> Comparison<'i> {
    /// Plans G = 1, 2, 3 and the module-kinds rule; each round-robin report
    /// carries the packed figure too.
    pub(crate) fn of(input: &'i Input) -> Result<Comparison<'i>, String> {
        let (module_kinds, module_kinds_from) = input.module_kinds();
        let policies = [
            Policy::Generations(1),
            Policy::Generations(2),
            Policy::Generations(3),
            Policy::ModuleKinds(module_kinds),
        ];
        let mut rows = Vec::with_capacity(policies.len());
        let mut ring = 0;
        let mut runners_using = 0;
        let mut buckets = 0;
        for policy in policies {
            let (_, report) = plan(input, policy.into())?;
            ring = report.ring_bytes;
            runners_using = report.runners_using;
            buckets = report.buckets.len();
            let separate = if report.buckets.is_empty() {
                None
            } else {
                let (_, packed) = plan(input, policy.packed())?;
                Some((report.separate_bytes, packed.separate_bytes))
            };
            rows.push(Row {
                policy,
                generations: report.generations,
                lower_bound: report.lower_bound,
                round_robin: report.round_robin_bytes,
                packed: report.packed_bytes,
                optimum: summary(&report),
                separate,
            });
        }
        Ok(Comparison {
            input,
            buckets,
            runners_using,
            module_kinds,
            module_kinds_from,
            ring,
            rows,
        })
    }

    pub(crate) fn text(&self) -> String {
        let mut out = self.input.header(&format!(
            " ({} use buffers), module kinds {} (from {}), ring(2) {}",
            self.runners_using,
            self.module_kinds,
            self.module_kinds_from,
            human_bytes(self.ring)
        ));
        let _ = writeln!(
            out,
            "{:<16} {:>2} {:>9} {:>5} {:<7} {:>11} {:>7} {:>11} {:>10} {:>11}",
            "policy",
            "G",
            "packed/lb",
            "rr/lb",
            "optimum",
            "ring/packed",
            "ring/rr",
            "lower bound",
            "packed",
            "round-robin"
        );
        for r in &self.rows {
            let _ = writeln!(
                out,
                "{:<16} {:>2} {:>9.3} {:>5.3} {:<7} {:>11.2} {:>7.2} {:>11} {:>10} {:>11}",
                r.policy.to_string(),
                r.generations,
                r.packed_over_lower_bound(),
                r.round_robin_over_lower_bound(),
                r.optimum,
                byte_ratio(self.ring, r.packed),
                byte_ratio(self.ring, r.round_robin),
                human_bytes(r.lower_bound),
                human_bytes(r.packed),
                human_bytes(r.round_robin)
            );
        }
        if self.buckets > 0 {
            let _ = writeln!(
                out,
                "{} shape buckets share the arenas (each key's the largest bucket's); as separate plans:",
                self.buckets
            );
            for r in &self.rows {
                if let Some((rr, packed)) = r.separate {
                    let _ = writeln!(
                        out,
                        "{:<16} packed {} shared vs {} separate ({:.2}x),\n{:<16} round-robin {} shared vs {} separate ({:.2}x)",
                        r.policy.to_string(),
                        human_bytes(r.packed),
                        human_bytes(packed),
                        byte_ratio(packed, r.packed),
                        "",
                        human_bytes(r.round_robin),
                        human_bytes(rr),
                        byte_ratio(rr, r.round_robin)
                    );
                }
            }
        }
        out
    }

    pub(crate) fn json(&self) -> Value {
        let w = &self.input.workload;
        let rows: Vec<Value> = self
            .rows
            .iter()
            .map(|r| {
                json!({
                    "policy": r.policy,
                    "generations": r.generations,
                    "lower_bound": r.lower_bound,
                    "packed_bytes": r.packed,
                    "round_robin_bytes": r.round_robin,
                    "packed_over_lower_bound": r.packed_over_lower_bound(),
                    "round_robin_over_lower_bound": r.round_robin_over_lower_bound(),
                    "optimum": r.optimum,
                    "ring_over_packed": byte_ratio(self.ring, r.packed),
                    "ring_over_round_robin": byte_ratio(self.ring, r.round_robin),
                    "separate_round_robin_bytes": r.separate.map(|s| s.0),
                    "separate_packed_bytes": r.separate.map(|s| s.1),
                })
            })
            .collect();
        json!({
            "name": w.name,
            "source": w.source,
            "file": self.input.label,
            "runners": w.runners.len(),
            "runners_using": self.runners_using,
            "module_kinds": self.module_kinds,
            "module_kinds_from": self.module_kinds_from,
            "ring_bytes": self.ring,
            "buckets": self.buckets,
            "rows": rows,
        })
    }
}

/// All comparisons as one Markdown table, ratios first.
pub(crate) fn markdown(comparisons: &[Comparison<'_>]) -> String {
    let mut out = String::from(
        "| workload | policy | G | packed/lb | rr/lb | optimum | ring/packed | ring/rr | lower bound | packed | round-robin | ring(2) |\n\
         |---|---|--:|--:|--:|---|--:|--:|--:|--:|--:|--:|\n",
    );
    for c in comparisons {
        for r in &c.rows {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.3} | {:.3} | {} | {:.2} | {:.2} | {} | {} | {} | {} |",
                c.input.workload.name,
                r.policy,
                r.generations,
                r.packed_over_lower_bound(),
                r.round_robin_over_lower_bound(),
                r.optimum,
                byte_ratio(c.ring, r.packed),
                byte_ratio(c.ring, r.round_robin),
                human_bytes(r.lower_bound),
                human_bytes(r.packed),
                human_bytes(r.round_robin),
                human_bytes(c.ring)
            );
        }
    }
    out
}
