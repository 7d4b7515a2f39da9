//! `--svg`: the plan as a picture. One panel per key: addresses upwards,
//! buffer-using runners in capture order from left to right. Each runner's
//! extent is a box that starts at the runner's column and spans the `G`
//! columns of the runners it may be in flight with, so the boxes crossing any
//! column are the bytes live together there; those of conflicting runners
//! never overlap. Each handoff is a hatched box at its place in its key's
//! arena, spanning the runners it lives across (writer to last reader, and
//! the `G - 1` after). Dashed lines mark the lower bound and round-robin's
//! size, and a band marks the peak (the column where the most bytes are
//! live: what sets the lower bound). A box too thin for its panel's scale is
//! drawn [`MIN_BOX`] high (its exact addresses are its `data-lo` and
//! `data-hi`), and dotted lines part the shape buckets of a bucketed plan.
//! Every text's width is measured, and the picture is as wide as its widest
//! text.

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::render::{mask_digits, HandoffPlace, Plan};
use crate::Input;
use replay_arena::{human_bytes, Extent, KeyReport};

/// Beyond this many buffer-using runners a column is narrower than a pixel.
const MAX_RUNNERS: usize = 4096;
const LEFT: f64 = 100.0;
const RIGHT: f64 = 150.0;
const PANEL_HEIGHT: f64 = 220.0;
/// Room above a panel for its title, and below it for the runner axis.
const PANEL_TITLE: f64 = 40.0;
const PANEL_AXIS: f64 = 40.0;
/// The least height, in pixels, a runner's or handoff's box is drawn: a
/// buffer of a few bytes in an arena of gigabytes stays visible.
pub(crate) const MIN_BOX: f64 = 2.0;
/// Module kinds the legend lists one by one.
const KINDS_LISTED: usize = 8;
const PALETTE: [&str; 8] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f",
];
const PEAK_FILL: &str = "#ffd54f";
const PEAK_STROKE: &str = "#a67c00";
const BUCKET_STROKE: &str = "#555";

/// The picture of `plan` as an SVG document.
pub(crate) fn draw(input: &Input, plan: &Plan<'_>) -> Result<String, String> {
    let frame = Frame::of(input, plan)?;
    let report = &plan.report;
    let handoffs = plan.handoff_places();
    // About 1.5 kB per panel: reserved up front, so a picture of many keys
    // is not copied as it grows. The document's header, which names the
    // width, is written last: the widest text sets it.
    let mut canvas = Canvas {
        svg: String::with_capacity(4096 + 1536 * report.keys.len()),
        right: frame.width,
    };
    canvas.header(input, plan, &frame, !handoffs.is_empty());
    canvas.defs(&frame);
    let by_key = ByKey::of(plan, &frame);
    for (key_index, key) in report.keys.iter().enumerate() {
        let panel = Panel::of(&frame, plan, &by_key, key_index, key);
        canvas.panel(&frame, &panel, key, &by_key.extents[key_index], &handoffs);
    }
    Ok(canvas.finish(frame.height))
}

/// What every part of the picture is laid out by.
struct Frame<'p> {
    /// `G`.
    g: usize,
    /// Buffer-using runners, in capture order, by their position in the file.
    using: Vec<usize>,
    /// Columns: the buffer-using runners and the `G - 1` after the last.
    columns: usize,
    /// The width of a column.
    column: f64,
    /// The picture's width before its texts widen it.
    width: f64,
    height: f64,
    /// Where the first panel's room starts.
    top: f64,
    /// Module kinds (runner names with digits masked), in first appearance.
    kinds: Vec<String>,
    /// Each buffer-using runner's colour, by its kind.
    colour: Vec<&'static str>,
    /// Where a new shape bucket starts: (column, bucket name), the first
    /// included; empty for a plan of one bucket.
    buckets: Vec<(usize, &'p str)>,
}

impl<'p> Frame<'p> {
    fn of(input: &Input, plan: &'p Plan<'_>) -> Result<Frame<'p>, String> {
        let report = &plan.report;
        let g = report.generations;
        let using: Vec<usize> = (0..report.runners.len())
            .filter(|&i| !report.runners[i].extents.is_empty())
            .collect();
        if using.len() > MAX_RUNNERS {
            return Err(format!(
                "--svg draws at most {MAX_RUNNERS} buffer-using runners; {} has {}",
                input.label,
                using.len()
            ));
        }
        let columns = (using.len() + g).saturating_sub(1).max(1);
        let column = (900.0 / columns as f64).clamp(3.0, 28.0);
        let (kinds, colour) = kinds(input, &using);
        let buckets = bucket_starts(plan, &using);
        // Two or three lines of explanation, then the legend: its fixed
        // entries and the kinds.
        let lines = 2 + usize::from(plan.planned.handoffs().next().is_some());
        let rows = legend_entries(&buckets).len() + kinds.len().min(KINDS_LISTED);
        let top = legend_top(lines) + 18.0 * rows as f64 + 16.0;
        let panel = PANEL_TITLE + PANEL_HEIGHT + PANEL_AXIS;
        Ok(Frame {
            g,
            columns,
            column,
            width: LEFT + columns as f64 * column + RIGHT,
            height: top + panel * report.keys.len() as f64 + 10.0,
            top,
            kinds,
            colour,
            using,
            buckets,
        })
    }

    /// The left edge of column `col`.
    fn x(&self, col: usize) -> f64 {
        LEFT + col as f64 * self.column
    }
}

/// Module kinds of the buffer-using runners `using` (runner names with
/// digits masked) in first appearance, and each runner's colour by its kind.
fn kinds(input: &Input, using: &[usize]) -> (Vec<String>, Vec<&'static str>) {
    let mut kinds: Vec<String> = Vec::new();
    let mut kind_of: HashMap<String, usize> = HashMap::new();
    let colour = using
        .iter()
        .map(|&i| {
            let kind = mask_digits(&input.runner_label(i));
            let next = kind_of.len();
            let k = *kind_of.entry(kind.clone()).or_insert_with(|| {
                kinds.push(kind);
                next
            });
            PALETTE[k % PALETTE.len()]
        })
        .collect();
    (kinds, colour)
}

/// The columns where a new shape bucket starts among the buffer-using
/// runners `using`, with the bucket's name; empty for a plan of one bucket.
fn bucket_starts<'p>(plan: &'p Plan<'_>, using: &[usize]) -> Vec<(usize, &'p str)> {
    let names: HashMap<_, &str> = plan.planned.buckets().collect();
    if names.len() < 2 {
        return Vec::new();
    }
    let mut starts: Vec<(usize, &str)> = Vec::new();
    let mut last = None;
    for (k, &i) in using.iter().enumerate() {
        let bucket = plan.planned.bucket_of(plan.report.runners[i].runner);
        if bucket != last {
            last = bucket;
            let name = bucket.and_then(|b| names.get(&b).copied()).unwrap_or("");
            starts.push((k, name));
        }
    }
    starts
}

/// Where the legend starts below `lines` lines of explanation.
fn legend_top(lines: usize) -> f64 {
    50.0 + 16.0 * lines.saturating_sub(1) as f64
}

/// A legend entry: its swatch and what it means.
enum Swatch {
    Peak,
    Bucket,
}

/// The legend's fixed entries: the peak band, and the bucket boundaries
/// where the plan has buckets.
fn legend_entries(buckets: &[(usize, &str)]) -> Vec<(Swatch, &'static str)> {
    let mut entries = vec![(
        Swatch::Peak,
        "peak: the column where the most bytes are live (runners and handoffs); it sets the lower bound",
    )];
    if !buckets.is_empty() {
        entries.push((
            Swatch::Bucket,
            "dotted line: where a shape bucket starts (its name beside it); buckets share arenas",
        ));
    }
    entries
}

/// Arenas and extents sorted by key in one pass (the report's keys are in
/// key order), so each panel costs what it draws, not every arena and
/// runner of the plan.
struct ByKey<'p> {
    /// Per key, its arenas (indices into the plan's).
    arenas: Vec<Vec<usize>>,
    /// Per key, (position among buffer-using runners, runner, extent).
    extents: Vec<Vec<(usize, usize, &'p Extent)>>,
}

impl<'p> ByKey<'p> {
    fn of(plan: &'p Plan<'_>, frame: &Frame<'_>) -> ByKey<'p> {
        let report = &plan.report;
        let key_at = |key| report.keys.binary_search_by_key(&key, |k| k.key).ok();
        let mut arenas: Vec<Vec<usize>> = vec![Vec::new(); report.keys.len()];
        for (a, arena) in plan.planned.arenas().iter().enumerate() {
            if let Some(at) = key_at(arena.key) {
                arenas[at].push(a);
            }
        }
        let mut extents: Vec<Vec<_>> = vec![Vec::new(); report.keys.len()];
        for (k, &i) in frame.using.iter().enumerate() {
            for extent in &report.runners[i].extents {
                if let Some(at) = key_at(extent.key) {
                    extents[at].push((k, i, extent));
                }
            }
        }
        ByKey { arenas, extents }
    }
}

/// One key's panel: where it lies and how its addresses scale.
struct Panel<'p> {
    key_index: usize,
    /// The panel's top and bottom edges.
    top: f64,
    bottom: f64,
    /// The address at the panel's top.
    scale_top: u128,
    /// (arena, its base address) of the key's arenas, by arena: stacked
    /// from address 0, generation 0 lowest.
    base: Vec<(usize, u128)>,
    /// (low address, high address, generation) of each of its arenas.
    outlines: Vec<(u128, u128, Option<usize>)>,
    input: &'p Input,
    plan: &'p Plan<'p>,
}

impl<'p> Panel<'p> {
    fn of(
        frame: &Frame<'_>,
        plan: &'p Plan<'p>,
        by_key: &ByKey<'_>,
        key_index: usize,
        key: &KeyReport,
    ) -> Panel<'p> {
        let panel = PANEL_TITLE + PANEL_HEIGHT + PANEL_AXIS;
        let top = frame.top + panel * key_index as f64 + PANEL_TITLE;
        let arenas = plan.planned.arenas();
        let mut base = Vec::with_capacity(by_key.arenas[key_index].len());
        let mut outlines = Vec::with_capacity(base.capacity());
        let mut stacked = 0u128;
        for &a in &by_key.arenas[key_index] {
            let arena = &arenas[a];
            base.push((a, stacked));
            outlines.push((stacked, stacked + u128::from(arena.bytes), arena.generation));
            stacked += u128::from(arena.bytes);
        }
        let scale_top = stacked
            .max(u128::from(key.round_robin_bytes))
            .max(u128::from(key.lower_bound))
            .max(1);
        Panel {
            key_index,
            top,
            bottom: top + PANEL_HEIGHT,
            scale_top,
            base,
            outlines,
            input: plan.input,
            plan,
        }
    }

    /// The height of `address` in the panel.
    fn y(&self, address: u128) -> f64 {
        self.bottom - address as f64 / self.scale_top as f64 * PANEL_HEIGHT
    }

    /// The stacked address range of `bytes` at `offset` of arena `arena`.
    fn range(&self, arena: usize, offset: u64, bytes: u64) -> (u128, u128) {
        let at = self.base.binary_search_by_key(&arena, |&(a, _)| a);
        let lo = at.map_or(0, |at| self.base[at].1) + u128::from(offset);
        (lo, lo + u128::from(bytes))
    }

    /// The top and height of the box of addresses `lo..hi`: exact where
    /// it is at least [`MIN_BOX`] high, else [`MIN_BOX`] high from `lo`
    /// upwards, inside the panel.
    fn box_of(&self, lo: u128, hi: u128) -> (f64, f64) {
        let (low, high) = (self.y(lo), self.y(hi));
        if low - high >= MIN_BOX {
            return (high, low - high);
        }
        let top = (low - MIN_BOX).max(self.top);
        (top, MIN_BOX.max(low - top))
    }
}

/// The document being written, and the rightmost point any text reaches.
struct Canvas {
    svg: String,
    right: f64,
}

impl Canvas {
    /// A text of `size` px starting at `x` widens the picture to hold it.
    fn reach(&mut self, x: f64, text: &str, size: f64, bold: bool) {
        self.right = self.right.max(x + text_width(text, size, bold));
    }

    /// The title, the lines that explain the picture, and the legend.
    fn header(&mut self, input: &Input, plan: &Plan<'_>, frame: &Frame<'_>, handoffs: bool) {
        let report = &plan.report;
        let g = frame.g;
        let title = format!(
            "{}: {} placement, G = {} (policy {}), {} of {} runners use buffers",
            input.workload.name,
            report.placed_policy.placement,
            g,
            report.placed_policy.policy,
            report.runners_using,
            report.runners_total
        );
        self.reach(10.0, &title, 15.0, true);
        let _ = writeln!(
            self.svg,
            r#"<text x="10" y="22" font-size="15" font-weight="bold">{}</text>"#,
            escape(&title)
        );
        let placement = match report.placed_policy.placement {
            replay_arena::Placement::RoundRobin => format!(
                "round-robin: the k-th buffer-using runner's bytes are in generation k % {g}'s arena (arenas stacked, generation 0 lowest)"
            ),
            replay_arena::Placement::Packed => format!(
                "packed: one arena per key; any {g} consecutive buffer-using runners' boxes lie at disjoint addresses"
            ),
        };
        let mut lines = vec![
            format!(
                "addresses upwards; buffer-using runners in capture order left to right; a box spans the {g} runner(s) its bytes may be in flight with"
            ),
            placement,
        ];
        if handoffs {
            lines.push(
                "hatched: a handoff (written by one runner, read by later ones), from its writer to its last reader and the G - 1 runners after"
                    .into(),
            );
        }
        for (i, line) in lines.iter().enumerate() {
            self.reach(10.0, line, 12.0, false);
            let _ = writeln!(
                self.svg,
                r##"<text x="10" y="{}" fill="#444">{}</text>"##,
                40 + 16 * i,
                escape(line)
            );
        }
        self.legend(frame, legend_top(lines.len()));
    }

    /// The legend from `top`: the peak band, bucket boundaries (in a
    /// bucketed plan), then the module kinds' colours.
    fn legend(&mut self, frame: &Frame<'_>, top: f64) {
        let entries = legend_entries(&frame.buckets);
        for (row, (swatch, label)) in entries.iter().enumerate() {
            let y = top + 18.0 * row as f64;
            let _ = match swatch {
                Swatch::Peak => write!(
                    self.svg,
                    r#"<rect class="legend-peak" x="10" y="{y:.1}" width="12" height="12" fill="{PEAK_FILL}" fill-opacity="0.3" stroke="{PEAK_STROKE}" stroke-dasharray="1 2"/>"#
                ),
                Swatch::Bucket => write!(
                    self.svg,
                    r#"<line class="legend-bucket" x1="16" y1="{y:.1}" x2="16" y2="{:.1}" stroke="{BUCKET_STROKE}" stroke-dasharray="2 2"/>"#,
                    y + 12.0
                ),
            };
            self.legend_label(y, label);
        }
        let rows = frame.kinds.len().min(KINDS_LISTED);
        for (k, kind) in frame.kinds.iter().enumerate().take(rows) {
            let y = top + 18.0 * (entries.len() + k) as f64;
            let more = if k + 1 == rows && frame.kinds.len() > rows {
                format!(" (and {} more kinds)", frame.kinds.len() - rows)
            } else {
                String::new()
            };
            let _ = write!(
                self.svg,
                r#"<rect x="10" y="{y:.1}" width="12" height="12" fill="{}"/>"#,
                PALETTE[k % PALETTE.len()]
            );
            self.legend_label(y, &format!("{kind}{more}"));
        }
    }

    /// A legend entry's text, beside its swatch at `y`.
    fn legend_label(&mut self, y: f64, label: &str) {
        self.reach(28.0, label, 12.0, false);
        let _ = writeln!(
            self.svg,
            r#"<text x="28" y="{:.1}">{}</text>"#,
            y + 10.0,
            escape(label)
        );
    }

    /// The hatching of handoffs, and the runner axis every panel shares
    /// (relative to a panel's bottom), a label every few positions.
    fn defs(&mut self, frame: &Frame<'_>) {
        let _ = writeln!(
            self.svg,
            r##"<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="6" height="6" fill="#ddd"/><line x1="0" y1="0" x2="0" y2="6" stroke="#555" stroke-width="2"/></pattern></defs>"##
        );
        let _ = writeln!(self.svg, r#"<defs><g id="runner-axis">"#);
        let step = frame.using.len().div_ceil(16).max(1);
        for k in (0..frame.using.len()).step_by(step) {
            let _ = writeln!(
                self.svg,
                r##"<text x="{:.2}" y="14.0" text-anchor="middle" fill="#444">{k}</text>"##,
                frame.x(k) + frame.column / 2.0
            );
        }
        let _ = writeln!(
            self.svg,
            r##"<text x="{LEFT:.1}" y="30.0" fill="#444">buffer-using runner (capture order)</text>"##
        );
        let _ = writeln!(self.svg, "</g></defs>");
    }

    /// One key's panel: heading, address axis, arenas, extents, handoffs,
    /// bucket boundaries, the peak, the reference lines and the runner axis.
    fn panel(
        &mut self,
        frame: &Frame<'_>,
        panel: &Panel<'_>,
        key: &KeyReport,
        extents: &[(usize, usize, &Extent)],
        handoffs: &[HandoffPlace],
    ) {
        let _ = writeln!(
            self.svg,
            r#"<g class="key" data-key="{}" data-generations="{}">"#,
            panel.key_index, frame.g
        );
        self.axes(panel, key);
        self.arenas(frame, panel);
        // Every box as (first column, column after the last, bytes): what
        // the peak is found from.
        let mut spans: Vec<(usize, usize, u64)> = Vec::with_capacity(extents.len());
        for &(k, i, extent) in extents {
            spans.push((k, k + frame.g, extent.bytes));
            self.extent(frame, panel, k, i, extent);
        }
        for h in handoffs.iter().filter(|h| h.key == panel.key_index) {
            let (from, until) = (h.lifetime.from, h.lifetime.until.min(frame.columns));
            spans.push((from, until, h.bytes));
            self.handoff(frame, panel, h, from, until);
        }
        self.buckets(frame, panel);
        self.peak(frame, panel, &spans);
        self.references(frame, panel, key);
        // Runner axis: the same in every panel, drawn once (in the defs).
        let _ = writeln!(
            self.svg,
            r##"<use href="#runner-axis" y="{}"/>"##,
            Fixed(panel.bottom, 1)
        );
        let _ = writeln!(self.svg, "</g>");
    }

    /// The panel's heading and its address axis, from 0 to its scale's top.
    fn axes(&mut self, panel: &Panel<'_>, key: &KeyReport) {
        let heading = format!(
            "{}: plan {}, lower bound {}, round-robin {}, packed {}",
            key.name,
            human_bytes(key.plan_bytes),
            human_bytes(key.lower_bound),
            human_bytes(key.round_robin_bytes),
            human_bytes(key.packed_bytes)
        );
        self.reach(10.0, &heading, 12.0, true);
        let _ = writeln!(
            self.svg,
            r#"<text x="10" y="{}" font-weight="bold">{}</text>"#,
            Fixed(panel.top - 14.0, 1),
            escape(&heading)
        );
        let _ = writeln!(
            self.svg,
            r#"<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" stroke="black"/><text x="{}" y="{bottom}" text-anchor="end">0</text><text x="{}" y="{}" text-anchor="end">{}</text>"#,
            Fixed(LEFT - 6.0, 1),
            Fixed(LEFT - 6.0, 1),
            Fixed(panel.top + 10.0, 1),
            human_bytes(u64::try_from(panel.scale_top).unwrap_or(u64::MAX)),
            left = Fixed(LEFT, 1),
            top = Fixed(panel.top, 1),
            bottom = Fixed(panel.bottom, 1)
        );
    }

    /// The outline of each of the key's arenas, labelled.
    fn arenas(&mut self, frame: &Frame<'_>, panel: &Panel<'_>) {
        let columns = frame.columns;
        for &(lo, hi, generation) in &panel.outlines {
            let label = ArenaLabel(generation);
            self.reach(frame.x(columns) + 4.0, &label.to_string(), 12.0, false);
            let _ = writeln!(
                self.svg,
                r##"<rect class="arena" x="{}" y="{}" width="{}" height="{}" fill="#f4f4f4" stroke="#999" stroke-dasharray="2 2"/><text x="{}" y="{}" fill="#666">{label}</text>"##,
                Fixed(frame.x(0), 2),
                Fixed(panel.y(hi), 3),
                Fixed(columns as f64 * frame.column, 2),
                Fixed(panel.y(lo) - panel.y(hi), 3),
                Fixed(frame.x(columns) + 4.0, 2),
                Fixed((panel.y(hi) + panel.y(lo)) / 2.0 + 4.0, 3)
            );
        }
    }

    /// Runner `i`'s extent (buffer-using runner `k`): a box over its `G`
    /// columns, at least [`MIN_BOX`] high.
    fn extent(&mut self, frame: &Frame<'_>, panel: &Panel<'_>, k: usize, i: usize, e: &Extent) {
        let runner = &panel.plan.report.runners[i];
        let (lo, hi) = panel.range(e.arena, e.offset, e.bytes);
        let (y, height) = panel.box_of(lo, hi);
        let _ = writeln!(
            self.svg,
            r##"<rect class="extent" data-runner="{k}" data-lo="{lo}" data-hi="{hi}" x="{}" y="{}" width="{}" height="{}" fill="{}" fill-opacity="0.8" stroke="#333" stroke-width="0.5"><title>{} ({}): {} at offset {} of arena {}</title></rect>"##,
            Fixed(frame.x(k) + 1.0, 2),
            Fixed(y, 3),
            Fixed(frame.g as f64 * frame.column - 2.0, 2),
            Fixed(height, 3),
            frame.colour[k],
            escape(&panel.input.runner_label(i)),
            runner.runner,
            human_bytes(e.bytes),
            e.offset,
            e.arena
        );
    }

    /// Handoff `h`: hatched, at its place in the key's arena, over the
    /// columns `from..until` it lives across, at least [`MIN_BOX`] high.
    fn handoff(
        &mut self,
        frame: &Frame<'_>,
        panel: &Panel<'_>,
        h: &HandoffPlace,
        from: usize,
        until: usize,
    ) {
        let (lo, hi) = panel.range(h.arena, h.offset, h.bytes);
        let (y, height) = panel.box_of(lo, hi);
        let readers: Vec<String> = h.readers.iter().map(|r| format!("runner {r}")).collect();
        let _ = writeln!(
            self.svg,
            r##"<rect class="handoff" data-handoff="{}" data-from="{from}" data-until="{until}" data-lo="{lo}" data-hi="{hi}" x="{}" y="{}" width="{}" height="{}" fill="url(#hatch)" stroke="#333" stroke-width="0.5"><title>handoff {}: {} at offset {} of arena {}, written by runner {}, read by {}; live from buffer-using runner {from} to {}</title></rect>"##,
            h.id,
            Fixed(frame.x(from) + 1.0, 2),
            Fixed(y, 3),
            Fixed((until - from) as f64 * frame.column - 2.0, 2),
            Fixed(height, 3),
            h.id,
            human_bytes(h.bytes),
            h.offset,
            h.arena,
            h.writer,
            readers.join(", "),
            until - 1
        );
    }

    /// A dotted line where each shape bucket but the first starts, and each
    /// bucket's name at the top of its first column.
    fn buckets(&mut self, frame: &Frame<'_>, panel: &Panel<'_>) {
        for (n, &(col, name)) in frame.buckets.iter().enumerate() {
            let x = frame.x(col);
            if n > 0 {
                let _ = write!(
                    self.svg,
                    r#"<line class="bucket" data-column="{col}" x1="{x}" y1="{top}" x2="{x}" y2="{bottom}" stroke="{BUCKET_STROKE}" stroke-dasharray="2 2"/>"#,
                    x = Fixed(x, 2),
                    top = Fixed(panel.top, 1),
                    bottom = Fixed(panel.bottom, 1)
                );
            }
            self.reach(x + 3.0, name, 12.0, false);
            let _ = writeln!(
                self.svg,
                r#"<text class="bucket-name" x="{}" y="{}" fill="{BUCKET_STROKE}">{}</text>"#,
                Fixed(x + 3.0, 2),
                Fixed(panel.top + 12.0, 1),
                escape(name)
            );
        }
    }

    /// The peak: the column where the most bytes of this key are live
    /// (the `spans` crossing it), which is what sets the lower bound.
    fn peak(&mut self, frame: &Frame<'_>, panel: &Panel<'_>, spans: &[(usize, usize, u64)]) {
        let Some((col, bytes)) = heaviest_column(spans, frame.columns) else {
            return;
        };
        let first = (col + 1).saturating_sub(frame.g);
        let _ = writeln!(
            self.svg,
            r##"<rect class="peak" data-first="{first}" data-bytes="{bytes}" x="{}" y="{top}" width="{column}" height="{PANEL_HEIGHT}" fill="{PEAK_FILL}" fill-opacity="0.3" stroke="{PEAK_STROKE}" stroke-dasharray="1 2"><title>peak: at buffer-using runner {}, runners {first} to it and the handoffs live then hold {} together</title></rect><text x="{}" y="{}" text-anchor="middle" fill="{PEAK_STROKE}">peak</text>"##,
            Fixed(frame.x(col), 2),
            col,
            human_bytes(bytes),
            Fixed(frame.x(col) + frame.column / 2.0, 2),
            Fixed(panel.top - 2.0, 1),
            top = Fixed(panel.top, 1),
            column = Fixed(frame.column, 2),
            PANEL_HEIGHT = Fixed(PANEL_HEIGHT, 1)
        );
    }

    /// Dashed lines at the key's lower bound and round-robin's size.
    fn references(&mut self, frame: &Frame<'_>, panel: &Panel<'_>, key: &KeyReport) {
        let columns = frame.columns;
        for (label, bytes, colour) in [
            ("lower bound", key.lower_bound, "#2e7d32"),
            ("round-robin", key.round_robin_bytes, "#c62828"),
        ] {
            let at = panel.y(u128::from(bytes));
            self.reach(frame.x(columns) + 44.0, label, 12.0, false);
            let _ = writeln!(
                self.svg,
                r#"<line class="reference" x1="{}" y1="{at}" x2="{}" y2="{at}" stroke="{colour}" stroke-dasharray="6 3"/><text x="{}" y="{}" fill="{colour}">{label}</text>"#,
                Fixed(frame.x(0), 2),
                Fixed(frame.x(columns), 2),
                Fixed(frame.x(columns) + 44.0, 2),
                Fixed(at + if label == "lower bound" { 12.0 } else { -3.0 }, 3),
                at = Fixed(at, 3)
            );
        }
    }

    /// The document: its header (as wide as the widest text), then what
    /// was drawn.
    fn finish(mut self, height: f64) -> String {
        let _ = writeln!(self.svg, "</svg>");
        let width = (self.right + 10.0).ceil();
        let mut document = String::with_capacity(self.svg.len() + 512);
        let _ = writeln!(document, r#"<?xml version="1.0" encoding="UTF-8"?>"#);
        let _ = writeln!(
            document,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(
            document,
            r#"<rect width="100%" height="100%" fill="white"/>"#
        );
        document.push_str(&self.svg);
        document
    }
}

/// How wide `text` draws in a sans-serif font of `size` px, at most: each
/// character at its width in Helvetica/Arial (per 1000 of the size),
/// rounded up, bold an eighth wider. Readers' fonts differ a little; this
/// errs wide.
pub(crate) fn text_width(text: &str, size: f64, bold: bool) -> f64 {
    let per_mille: u32 = text
        .chars()
        .map(|c| match c {
            'i' | 'j' | 'l' | '\'' | '|' | '.' | ',' | ':' | ';' | '!' => 320,
            'f' | 't' | 'r' | ' ' | '(' | ')' | '[' | ']' | '-' | '/' => 400,
            'm' | 'w' | 'M' | 'W' | '@' | '%' => 950,
            c if c.is_ascii_uppercase() => 760,
            c if c.is_ascii() => 640,
            // Wide scripts and symbols.
            _ => 1000,
        })
        .sum();
    let scale = if bold { 1.12 } else { 1.0 };
    f64::from(per_mille) / 1000.0 * size * scale
}

/// The column (of `columns`) where the most bytes are live, and those
/// bytes; `None` when nothing is. `spans` are boxes as (first column,
/// column after the last, bytes): one pass over their ends, then one over
/// the columns.
fn heaviest_column(spans: &[(usize, usize, u64)], columns: usize) -> Option<(usize, u64)> {
    let mut delta = vec![0i128; columns + 1];
    for &(from, until, bytes) in spans {
        let (from, until) = (from.min(columns), until.min(columns));
        if from < until {
            delta[from] += i128::from(bytes);
            delta[until] -= i128::from(bytes);
        }
    }
    let mut live = 0i128;
    let mut best: Option<(usize, i128)> = None;
    for (col, d) in delta.iter().enumerate().take(columns) {
        live += d;
        if live > 0 && best.is_none_or(|(_, b)| live > b) {
            best = Some((col, live));
        }
    }
    best.map(|(col, bytes)| (col, u64::try_from(bytes).unwrap_or(u64::MAX)))
}

/// `value` with `decimals` digits after the point, as `{:.N}` prints it but
/// by integer arithmetic (floating-point formatting was most of the time a
/// picture of many panels took); falls back to `{:.N}` past 2^53.
struct Fixed(f64, u32);

impl std::fmt::Display for Fixed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Fixed(value, decimals) = *self;
        let decimals = decimals.min(9);
        let scale = 10u64.pow(decimals);
        let scaled = (value.abs() * scale as f64).round();
        if !scaled.is_finite() || scaled >= 9.0e15 {
            return write!(f, "{value:.*}", decimals as usize);
        }
        // Digits right to left into a buffer: at most 16 integer digits
        // (below 2^53), the point, up to 9 decimals and a sign.
        let scaled = scaled as u64;
        let mut buf = [0u8; 32];
        let mut at = buf.len();
        let mut push = |digit: u8| {
            at -= 1;
            buf[at] = digit;
        };
        let mut fraction = scaled % scale;
        for _ in 0..decimals {
            push(b'0' + (fraction % 10) as u8);
            fraction /= 10;
        }
        if decimals > 0 {
            push(b'.');
        }
        let mut whole = scaled / scale;
        loop {
            push(b'0' + (whole % 10) as u8);
            whole /= 10;
            if whole == 0 {
                break;
            }
        }
        if value < 0.0 && scaled > 0 {
            push(b'-');
        }
        f.write_str(std::str::from_utf8(&buf[at..]).map_err(|_| std::fmt::Error)?)
    }
}

/// "gen N" for a round-robin arena, "arena" for a packed one.
struct ArenaLabel(Option<usize>);

impl std::fmt::Display for ArenaLabel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(g) => write!(f, "gen {g}"),
            None => f.write_str("arena"),
        }
    }
}

/// Text and attribute values with XML's special characters escaped, written
/// straight into the document.
fn escape(text: &str) -> Escaped<'_> {
    Escaped(text)
}

struct Escaped<'t>(&'t str);

impl std::fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut plain = 0;
        for (at, c) in self.0.char_indices() {
            let replace = match c {
                '&' => "&amp;",
                '<' => "&lt;",
                '>' => "&gt;",
                '"' => "&quot;",
                '\'' => "&apos;",
                // XML 1.0 allows neither most C0 controls nor U+FFFE and
                // U+FFFF, not even as references; the others are replaced
                // too, so no line or tab breaks a text.
                c if c.is_control() => " ",
                '\u{fffe}' | '\u{ffff}' => "\u{fffd}",
                _ => continue,
            };
            f.write_str(&self.0[plain..at])?;
            f.write_str(replace)?;
            plain = at + c.len_utf8();
        }
        f.write_str(&self.0[plain..])
    }
}
