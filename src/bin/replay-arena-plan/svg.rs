//! `--svg`: the plan as a picture. One panel per key: addresses upwards,
//! buffer-using runners in capture order from left to right. Each runner's
//! extent is a box that starts at the runner's column and spans the `G`
//! columns of the runners it may be in flight with, so the boxes crossing any
//! column are the bytes live together there; those of conflicting runners
//! never overlap. Each handoff is a hatched box at its place in its key's
//! arena, spanning the runners it lives across (writer to last reader, and
//! the `G - 1` after). Dashed lines mark the lower bound and round-robin's
//! size, and a band marks the peak (the column where the most bytes are
//! live: what sets the lower bound). Every text's width is measured, and
//! the picture is as wide as its widest text.

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::render::{mask_digits, Plan};
use crate::Input;
use replay_arena::{human_bytes, Extent};

/// Beyond this many buffer-using runners a column is narrower than a pixel.
const MAX_RUNNERS: usize = 4096;
const LEFT: f64 = 100.0;
const RIGHT: f64 = 150.0;
const PANEL_HEIGHT: f64 = 220.0;
/// Room above a panel for its title, and below it for the runner axis.
const PANEL_TITLE: f64 = 40.0;
const PANEL_AXIS: f64 = 40.0;
const PALETTE: [&str; 8] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f",
];

/// The picture of `plan` as an SVG document.
pub(crate) fn draw(input: &Input, plan: &Plan<'_>) -> Result<String, String> {
    let report = &plan.report;
    let g = report.generations;
    // Buffer-using runners, in capture order, with their position in the file.
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
    let width = LEFT + columns as f64 * column + RIGHT;

    // Colours by module kind (runner name with digits masked).
    let mut kinds: Vec<String> = Vec::new();
    let mut kind_of: HashMap<String, usize> = HashMap::new();
    let colour: Vec<&str> = using
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

    let legend_rows = kinds.len().min(8);
    // Two or three lines of explanation, then the kinds.
    let top = 82.0 + 18.0 * legend_rows as f64;
    let panel = PANEL_TITLE + PANEL_HEIGHT + PANEL_AXIS;
    let height = top + panel * report.keys.len() as f64 + 10.0;

    // About 1.5 kB per panel: reserved up front, so a picture of many keys
    // is not copied as it grows. The document's header, which names the
    // width, is written last: the widest text sets it.
    let mut svg = String::with_capacity(4096 + 1536 * report.keys.len());
    // The rightmost point any text reaches.
    let mut right = width;
    let title = format!(
        "{}: {} placement, G = {} (policy {}), {} of {} runners use buffers",
        input.workload.name,
        report.placed_policy.placement,
        g,
        report.placed_policy.policy,
        report.runners_using,
        report.runners_total
    );
    right = right.max(10.0 + text_width(&title, 15.0, true));
    let _ = writeln!(
        svg,
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
    let handoffs = plan.handoff_places();
    let mut lines = vec![
        format!(
            "addresses upwards; buffer-using runners in capture order left to right; a box spans the {g} runner(s) its bytes may be in flight with"
        ),
        placement,
    ];
    if !handoffs.is_empty() {
        lines.push(
            "hatched: a handoff (written by one runner, read by later ones), from its writer to its last reader and the G - 1 runners after"
                .into(),
        );
    }
    for (i, line) in lines.iter().enumerate() {
        right = right.max(10.0 + text_width(line, 12.0, false));
        let _ = writeln!(
            svg,
            r##"<text x="10" y="{}" fill="#444">{}</text>"##,
            40 + 16 * i,
            escape(line)
        );
    }
    let legend_top = 50.0 + 16.0 * (lines.len() - 1) as f64;
    for (k, kind) in kinds.iter().enumerate().take(legend_rows) {
        let y = legend_top + 18.0 * k as f64;
        let more = if k + 1 == legend_rows && kinds.len() > legend_rows {
            format!(" (and {} more kinds)", kinds.len() - legend_rows)
        } else {
            String::new()
        };
        let label = format!("{kind}{more}");
        right = right.max(28.0 + text_width(&label, 12.0, false));
        let _ = writeln!(
            svg,
            r#"<rect x="10" y="{y:.1}" width="12" height="12" fill="{}"/><text x="28" y="{:.1}">{}</text>"#,
            PALETTE[k % PALETTE.len()],
            y + 10.0,
            escape(&label)
        );
    }
    let _ = writeln!(
        svg,
        r##"<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="6" height="6" fill="#ddd"/><line x1="0" y1="0" x2="0" y2="6" stroke="#555" stroke-width="2"/></pattern></defs>"##
    );

    // One pass over arenas and extents sorts them by key (report.keys is in
    // key order), so each panel costs what it draws, not every arena and
    // runner of the plan.
    let key_at = |key| report.keys.binary_search_by_key(&key, |k| k.key).ok();
    // The runner axis every panel shares, every few positions, relative to
    // the panel's bottom.
    let _ = writeln!(svg, r#"<defs><g id="runner-axis">"#);
    let step = using.len().div_ceil(16).max(1);
    for k in (0..using.len()).step_by(step) {
        let _ = writeln!(
            svg,
            r##"<text x="{:.2}" y="14.0" text-anchor="middle" fill="#444">{k}</text>"##,
            LEFT + k as f64 * column + column / 2.0
        );
    }
    let _ = writeln!(
        svg,
        r##"<text x="{LEFT:.1}" y="30.0" fill="#444">buffer-using runner (capture order)</text>"##
    );
    let _ = writeln!(svg, "</g></defs>");

    let arenas = plan.planned.arenas();
    let mut arenas_of: Vec<Vec<usize>> = vec![Vec::new(); report.keys.len()];
    for (a, arena) in arenas.iter().enumerate() {
        if let Some(at) = key_at(arena.key) {
            arenas_of[at].push(a);
        }
    }
    // Per key, (position among buffer-using runners, runner, extent).
    let mut extents_of: Vec<Vec<(usize, usize, &Extent)>> = vec![Vec::new(); report.keys.len()];
    for (k, &i) in using.iter().enumerate() {
        for extent in &report.runners[i].extents {
            if let Some(at) = key_at(extent.key) {
                extents_of[at].push((k, i, extent));
            }
        }
    }
    for (key_index, key) in report.keys.iter().enumerate() {
        let panel_top = top + panel * key_index as f64 + PANEL_TITLE;
        let bottom = panel_top + PANEL_HEIGHT;
        let extents = &extents_of[key_index];
        // The key's arenas stacked from address 0: generation 0 lowest.
        // (arena, its base address), by arena.
        let mut base: Vec<(usize, u128)> = Vec::with_capacity(arenas_of[key_index].len());
        let mut stacked = 0u128;
        let mut outlines = Vec::new();
        for &a in &arenas_of[key_index] {
            let arena = &arenas[a];
            base.push((a, stacked));
            outlines.push((stacked, stacked + u128::from(arena.bytes), arena.generation));
            stacked += u128::from(arena.bytes);
        }
        let scale_top = stacked
            .max(u128::from(key.round_robin_bytes))
            .max(u128::from(key.lower_bound))
            .max(1);
        let y = |address: u128| bottom - address as f64 / scale_top as f64 * PANEL_HEIGHT;
        let x = |col: usize| LEFT + col as f64 * column;

        let _ = writeln!(
            svg,
            r#"<g class="key" data-key="{key_index}" data-generations="{g}">"#
        );
        let heading = format!(
            "{}: plan {}, lower bound {}, round-robin {}, packed {}",
            key.name,
            human_bytes(key.plan_bytes),
            human_bytes(key.lower_bound),
            human_bytes(key.round_robin_bytes),
            human_bytes(key.packed_bytes)
        );
        right = right.max(10.0 + text_width(&heading, 12.0, true));
        let _ = writeln!(
            svg,
            r#"<text x="10" y="{}" font-weight="bold">{}</text>"#,
            Fixed(panel_top - 14.0, 1),
            escape(&heading)
        );
        // Address axis.
        let _ = writeln!(
            svg,
            r#"<line x1="{left}" y1="{panel_top}" x2="{left}" y2="{bottom}" stroke="black"/><text x="{}" y="{bottom}" text-anchor="end">0</text><text x="{}" y="{}" text-anchor="end">{}</text>"#,
            Fixed(LEFT - 6.0, 1),
            Fixed(LEFT - 6.0, 1),
            Fixed(panel_top + 10.0, 1),
            human_bytes(u64::try_from(scale_top).unwrap_or(u64::MAX)),
            left = Fixed(LEFT, 1),
            panel_top = Fixed(panel_top, 1),
            bottom = Fixed(bottom, 1)
        );
        // Arena outlines.
        for (lo, hi, generation) in &outlines {
            let label = ArenaLabel(*generation);
            right = right.max(x(columns) + 4.0 + text_width(&label.to_string(), 12.0, false));
            let _ = writeln!(
                svg,
                r##"<rect class="arena" x="{}" y="{}" width="{}" height="{}" fill="#f4f4f4" stroke="#999" stroke-dasharray="2 2"/><text x="{}" y="{}" fill="#666">{label}</text>"##,
                Fixed(x(0), 2),
                Fixed(y(*hi), 3),
                Fixed(columns as f64 * column, 2),
                Fixed(y(*lo) - y(*hi), 3),
                Fixed(x(columns) + 4.0, 2),
                Fixed((y(*hi) + y(*lo)) / 2.0 + 4.0, 3)
            );
        }
        // Extents.
        for &(k, i, extent) in extents {
            let runner = &report.runners[i];
            let at = base.binary_search_by_key(&extent.arena, |&(a, _)| a);
            let lo = at.map_or(0, |at| base[at].1) + u128::from(extent.offset);
            let hi = lo + u128::from(extent.bytes);
            let _ = writeln!(
                svg,
                r##"<rect class="extent" data-runner="{k}" x="{}" y="{}" width="{}" height="{}" fill="{}" fill-opacity="0.8" stroke="#333" stroke-width="0.5"><title>{} ({}): {} at offset {} of arena {}</title></rect>"##,
                Fixed(x(k) + 1.0, 2),
                Fixed(y(hi), 3),
                Fixed(g as f64 * column - 2.0, 2),
                Fixed(y(lo) - y(hi), 3),
                colour[k],
                escape(&input.runner_label(i)),
                runner.runner,
                human_bytes(extent.bytes),
                extent.offset,
                extent.arena
            );
        }
        // Handoffs: hatched, at their place in the key's arena, over the
        // columns they live across.
        let mut spans: Vec<(usize, usize, u64)> = extents
            .iter()
            .map(|&(k, _, s)| (k, k + g, s.bytes))
            .collect();
        for h in handoffs.iter().filter(|h| h.key == key_index) {
            let at = base.binary_search_by_key(&h.arena, |&(a, _)| a);
            let lo = at.map_or(0, |at| base[at].1) + u128::from(h.offset);
            let hi = lo + u128::from(h.bytes);
            let (from, until) = (h.lifetime.from, h.lifetime.until.min(columns));
            spans.push((from, until, h.bytes));
            let _ = writeln!(
                svg,
                r##"<rect class="handoff" data-handoff="{}" data-from="{from}" data-until="{until}" x="{}" y="{}" width="{}" height="{}" fill="url(#hatch)" stroke="#333" stroke-width="0.5"><title>handoff {}: {} at offset {} of arena {}, written by runner {}, read by {}; live from buffer-using runner {from} to {}</title></rect>"##,
                h.id,
                Fixed(x(from) + 1.0, 2),
                Fixed(y(hi), 3),
                Fixed((until - from) as f64 * column - 2.0, 2),
                Fixed(y(lo) - y(hi), 3),
                h.id,
                human_bytes(h.bytes),
                h.offset,
                h.arena,
                h.writer,
                h.readers
                    .iter()
                    .map(|r| format!("runner {r}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                until - 1
            );
        }
        // The peak: the column where the most bytes of this key are live
        // (boxes crossing it), which is what sets the lower bound.
        if let Some((col, bytes)) = heaviest_column(&spans, columns) {
            let first = (col + 1).saturating_sub(g);
            let _ = writeln!(
                svg,
                r##"<rect class="peak" data-first="{first}" data-bytes="{bytes}" x="{}" y="{panel_top}" width="{column}" height="{PANEL_HEIGHT}" fill="#ffd54f" fill-opacity="0.3" stroke="#a67c00" stroke-dasharray="1 2"><title>peak: at buffer-using runner {}, runners {first} to it and the handoffs live then hold {} together</title></rect><text x="{}" y="{}" text-anchor="middle" fill="#a67c00">peak</text>"##,
                Fixed(x(col), 2),
                col,
                human_bytes(bytes),
                Fixed(x(col) + column / 2.0, 2),
                Fixed(panel_top - 2.0, 1),
                panel_top = Fixed(panel_top, 1),
                column = Fixed(column, 2),
                PANEL_HEIGHT = Fixed(PANEL_HEIGHT, 1)
            );
        }
        // Reference lines.
        for (label, bytes, colour) in [
            ("lower bound", key.lower_bound, "#2e7d32"),
            ("round-robin", key.round_robin_bytes, "#c62828"),
        ] {
            let at = y(u128::from(bytes));
            right = right.max(x(columns) + 44.0 + text_width(label, 12.0, false));
            let _ = writeln!(
                svg,
                r#"<line class="reference" x1="{}" y1="{at}" x2="{}" y2="{at}" stroke="{colour}" stroke-dasharray="6 3"/><text x="{}" y="{}" fill="{colour}">{label}</text>"#,
                Fixed(x(0), 2),
                Fixed(x(columns), 2),
                Fixed(x(columns) + 44.0, 2),
                Fixed(at + if label == "lower bound" { 12.0 } else { -3.0 }, 3),
                at = Fixed(at, 3)
            );
        }
        // Runner axis: the same in every panel, drawn once (below).
        let _ = writeln!(
            svg,
            r##"<use href="#runner-axis" y="{}"/>"##,
            Fixed(bottom, 1)
        );
        let _ = writeln!(svg, "</g>");
    }
    let _ = writeln!(svg, "</svg>");
    let width = (right + 10.0).ceil();
    let mut document = String::with_capacity(svg.len() + 512);
    let _ = writeln!(document, r#"<?xml version="1.0" encoding="UTF-8"?>"#);
    let _ = writeln!(
        document,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        document,
        r#"<rect width="100%" height="100%" fill="white"/>"#
    );
    document.push_str(&svg);
    Ok(document)
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
                c if c.is_control() => " ",
                _ => continue,
            };
            f.write_str(&self.0[plain..at])?;
            f.write_str(replace)?;
            plain = at + c.len_utf8();
        }
        f.write_str(&self.0[plain..])
    }
}
