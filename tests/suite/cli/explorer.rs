//! The plan explorer (`replay-arena-plan`, feature `cli`), run as a user
//! would: command lines, outputs, errors, closed pipes and the SVG picture.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{json, Value};

/// A small hand-written workload: three runners (one empty), two groups,
/// one parameter written three times.
const TINY: &str = include_str!("../../support/tiny-workload.json");

const BUNDLED: [&str; 4] = [
    "deepseek-v3-mtp",
    "gpt3-175b-per-module",
    "gpt3-175b-whole-layer",
    "mixtral-8x7b-per-module",
];

fn bundled(stem: &str) -> String {
    format!(
        "{}/examples/workloads/{stem}.json",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// A fresh path in the target's scratch folder.
fn scratch(name: &str) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("cli-{}-{n}-{name}", std::process::id()))
}

/// Writes `text` to a scratch file and returns its path.
fn file(text: &str) -> String {
    let path = scratch("workload.json");
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

fn explorer() -> Command {
    Command::new(env!("CARGO_BIN_EXE_replay-arena-plan"))
}

/// Runs the explorer with `args`, `stdin` on its standard input.
fn run_with(args: &[&str], stdin: &str) -> Output {
    let mut child = explorer()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn run(args: &[&str]) -> Output {
    run_with(args, "")
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

/// Stdout of a run that must succeed.
fn ok(args: &[&str]) -> String {
    let o = run(args);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    stdout(&o)
}

fn json_of(args: &[&str]) -> Value {
    serde_json::from_str(&ok(args)).unwrap()
}

/// The one-line error of a run that must fail with exit status 1.
fn failure(args: &[&str]) -> String {
    let o = run(args);
    assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stdout(&o));
    let e = stderr(&o);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(e.starts_with("error: "), "{e}");
    // No Rust Debug in what users read.
    assert!(!e.contains("{ ") && !e.contains("PlacedPolicy"), "{e}");
    e
}

/// The usage error of a command line clap refuses (exit status 2).
fn refused(args: &[&str]) -> String {
    let o = run(args);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stdout(&o));
    stderr(&o)
}

// ---- command line ------------------------------------------------------------

#[test]
fn a_policy_flag_prints_one_round_robin_report() {
    let tiny = file(TINY);
    let out = ok(&[&tiny, "--generations", "3"]);
    assert!(
        out.contains("plan: round_robin placement, G = 2 (policy generations(3))"),
        "{out}"
    );
    assert!(out.starts_with("workload tiny ("), "{out}");
}

#[test]
fn packed_selects_the_packed_placement_and_dash_reads_stdin() {
    let o = run_with(&["--module-kinds", "2", "--packed", "-", "--json"], TINY);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["placed_policy"]["placement"], "packed");
    assert_eq!(v["placed_policy"]["policy"], "module_kinds(2)");
    assert_eq!(v["workload"]["file"], "-");
    let tiny = file(TINY);
    let v = json_of(&[&tiny, "-d", "4", "--packed", "--json"]);
    assert_eq!(v["placed_policy"]["policy"], "overlap_depth(4)");
}

#[test]
fn conventional_flag_forms_are_accepted() {
    let tiny = file(TINY);
    let v = json_of(&["--generations=2", "--json", "--", &tiny]);
    assert_eq!(v["placed_policy"]["policy"], "generations(2)");
    let v = json_of(&["-g2", "--json", &tiny]);
    assert_eq!(v["generations"], 2);
}

#[test]
fn no_policy_means_compare() {
    let tiny = file(TINY);
    let out = ok(&[&tiny]);
    assert!(out.contains("module kinds 2 (from runner names)"), "{out}");
    assert_eq!(out, ok(&["--compare", &tiny]));
    let md = ok(&["--compare", "--markdown", &tiny]);
    assert!(md.starts_with("| workload | policy |"), "{md}");
}

#[test]
fn help_and_version_exit_zero() {
    let o = run(&["--help"]);
    assert!(o.status.success());
    assert!(stdout(&o).contains("Usage: replay-arena-plan <FILE>... (-g <N> | -k <K> | -d <D>)"));
    // The options name the long forms.
    assert!(stdout(&o).contains("-g, --generations <N>"));
    assert!(run(&["--version"]).status.success());
}

#[test]
fn bad_command_lines_are_refused_with_a_reason() {
    let cases: [(&[&str], &str); 13] = [
        (&["a.json", "--generations", "0"], "must be at least 1"),
        (
            &["a.json", "--generations", "x"],
            "expected a positive integer",
        ),
        (&["a.json", "--generations"], "a value is required"),
        (
            &["a.json", "--generations", "2", "--module-kinds", "2"],
            "cannot be used with",
        ),
        (&["a.json", "--packed"], "--generations <N>"),
        (
            &["a.json", "--compare", "--generations", "2"],
            "cannot be used with",
        ),
        (
            &["a.json", "--frobnicate"],
            "unexpected argument '--frobnicate'",
        ),
        (&["--compare"], "required arguments were not provided"),
        (&["-", "-"], "standard input (-) can be read only once"),
        (&["a.json", "--json", "--markdown"], "cannot be used with"),
        (
            &["a.json", "--generations", "2", "--markdown"],
            "cannot be used with",
        ),
        (&["a.json", "--svg", "x.svg"], "--generations <N>"),
        (
            &["a.json", "b.json", "-g", "2", "--svg", "x.svg"],
            "--svg draws one workload; give one FILE",
        ),
    ];
    for (args, reason) in cases {
        let e = refused(args);
        assert!(e.contains(reason), "{args:?}: {e}");
    }
}

// ---- errors ------------------------------------------------------------------

#[test]
fn file_errors_are_one_line_naming_the_file_and_the_json_path() {
    let bad = file(&TINY.replacen(r#""dtype": "f32""#, r#""dtype": "bf17""#, 1));
    let e = failure(&[&bad]);
    assert!(
        e.starts_with(&format!(
            "error: {bad}: runners[0].requests[1].dtype: unknown dtype"
        )),
        "{e}"
    );
    let e = failure(&["/nonexistent/w.json"]);
    assert!(e.starts_with("error: /nonexistent/w.json: "), "{e}");
}

#[test]
fn duplicate_keys_are_refused() {
    let dup = file(&TINY.replacen(
        r#""elements": 100"#,
        r#""elements": 64, "elements": 128"#,
        1,
    ));
    let e = failure(&[&dup]);
    assert!(
        e.contains("runners[0].requests[1]: duplicate field `elements`"),
        "{e}"
    );
}

#[test]
fn a_byte_order_mark_is_skipped() {
    let bom = file(&format!("\u{feff}{TINY}"));
    assert_eq!(
        json_of(&[&bom, "--json"])["rows"],
        json_of(&[&file(TINY), "--json"])["rows"]
    );
}

#[test]
fn two_to_the_64_elements_are_reported_as_an_integer_bound() {
    let big = file(&TINY.replacen(
        r#""elements": 100"#,
        r#""elements": 18446744073709551616"#,
        1,
    ));
    let e = failure(&[&big]);
    assert!(e.contains("found a number of at least 2^64"), "{e}");
    assert!(!e.contains("e+19"), "{e}");
}

/// A u8 runner of 2^64 - 1000 elements and one of 1000: each fits, their
/// arenas together do not.
fn overflowing() -> String {
    let big = u64::MAX - 999;
    file(&format!(
        r#"{{"name": "huge", "runners": [
            {{"requests": [{{"domain": "device", "dtype": "u8", "elements": {big}}}]}},
            {{"requests": [{{"domain": "device", "dtype": "u8", "elements": 1000}}]}}]}}"#
    ))
}

#[test]
fn an_overflowing_figure_is_an_error_in_every_mode() {
    let huge = overflowing();
    for args in [
        vec![huge.as_str(), "--generations", "2"],
        vec![huge.as_str(), "--generations", "2", "--json"],
        vec![huge.as_str(), "--generations", "2", "--packed"],
        vec![huge.as_str(), "--compare"],
        vec![huge.as_str(), "--markdown"],
    ] {
        let e = failure(&args);
        assert!(e.contains("overflow"), "{args:?}: {e}");
        assert!(!e.contains("TiB"), "{args:?}: {e}");
    }
    let e = failure(&[&huge, "--generations", "2"]);
    assert!(
        e.contains("with policy generations(2), round_robin placement: the"),
        "{e}"
    );
}

#[test]
fn figures_beyond_a_tebibyte_print_in_larger_units() {
    let exbi = file(
        r#"{"name": "exbi", "runners": [
            {"requests": [{"domain": "device", "dtype": "u8", "elements": 1152921504606846976}]}]}"#,
    );
    let out = ok(&[&exbi]);
    assert!(out.contains("1.00 EiB"), "{out}");
    assert!(!out.contains("TiB"), "{out}");
    let v = json_of(&[&exbi, "-g", "1", "--json"]);
    // Data keeps exact integers.
    assert_eq!(v["plan_bytes"], json!(1_152_921_504_606_846_976u64));
}

/// A workload whose table is far larger than a pipe's buffer.
fn large() -> String {
    let runners: Vec<String> = (0..20_000)
        .map(|i| {
            format!(
                r#"{{"name": "layer{i}.bwd", "requests": [{{"domain": "device", "dtype": "f32", "elements": {}}}]}}"#,
                1 + i % 97
            )
        })
        .collect();
    file(&format!(
        r#"{{"name": "large", "runners": [{}]}}"#,
        runners.join(",")
    ))
}

#[test]
fn a_closed_pipe_ends_the_output_quietly() {
    let large = large();
    let mut child = explorer()
        .args([large.as_str(), "--generations", "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    // The reader is dropped here, as `| head -1` does.
    assert!(first.starts_with("workload large"), "{first}");
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stderr(&o), "");
}

#[test]
fn a_full_device_is_a_one_line_error() {
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        return; // no /dev/full on this system
    };
    let o = explorer()
        .args([large().as_str(), "--generations", "2"])
        .stdout(full)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(e.starts_with("error: writing the output failed: "), "{e}");
}

// ---- output ------------------------------------------------------------------

#[test]
fn the_report_names_runners_and_groups() {
    let tiny = file(TINY);
    let out = ok(&[&tiny, "--generations", "1"]);
    assert!(out.contains("bf16 in symmetric(expert-gtp)"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("runner 2 ") && l.ends_with("  layer0.mlp.bwd")),
        "{out}"
    );
    assert_eq!(out.matches("legend:").count(), 1, "{out}");
    let unnamed = file(
        r#"{"name": "u", "runners": [{"id": 9, "requests": [
            {"domain": "device", "dtype": "f32", "elements": 1}]}]}"#,
    );
    let out = ok(&[&unnamed, "-g", "1"]);
    assert!(out.contains("\nrunner 9 "), "{out}");
    assert!(
        !out.contains(" name "),
        "no name column without names: {out}"
    );
}

#[test]
fn report_json_carries_names_sizes_and_ratios() {
    let tiny = file(TINY);
    let v = json_of(&[&tiny, "--generations", "2", "--packed", "--json"]);
    assert_eq!(
        v["placed_policy"],
        json!({"policy": "generations(2)", "placement": "packed"})
    );
    assert_eq!(v["workload"]["file"], tiny.as_str());
    assert_eq!(v["workload"]["source"], "hand-written");
    assert_eq!(
        v["groups"],
        json!([{"id": 0, "name": "gtp"}, {"id": 1, "name": "expert-gtp"}])
    );
    assert_eq!(v["runners"][2]["name"], "layer0.mlp.bwd");
    assert_eq!(v["runners"][1]["extents"], json!([]));
    assert_eq!(v["packed_bytes"], v["plan_bytes"]);
    let gtp = v["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["name"] == "bf16 in symmetric(gtp)")
        .unwrap();
    assert_eq!(
        gtp["key"],
        json!({"domain": {"symmetric": 0}, "dtype": "bf16"})
    );
    assert_eq!(
        v["runners"][0]["extents"][0]["key"],
        json!({"domain": "device", "dtype": "f32"})
    );
    assert_eq!(v["fingerprint"].as_str().unwrap().len(), 16);
    assert_eq!(gtp["lower_bound"], 3 * 8192);
    assert_eq!(v["ratios"]["packed_over_lower_bound"], 1.0);
}

#[test]
fn several_files_give_a_json_array() {
    let tiny = file(TINY);
    let v = json_of(&[&tiny, &tiny, "-g", "2", "--json"]);
    assert_eq!(v.as_array().unwrap().len(), 2);
}

#[test]
fn comparison_rows_cover_three_counts_and_the_module_kinds_rule() {
    let tiny = file(TINY);
    let v = json_of(&[&tiny, "--json"]);
    let policies: Vec<&str> = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["policy"].as_str().unwrap())
        .collect();
    assert_eq!(
        policies,
        vec![
            "generations(1)",
            "generations(2)",
            "generations(3)",
            "module_kinds(2)"
        ]
    );
    // Two runners use buffers, so G = 3 is capped at 2.
    let gens: Vec<u64> = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["generations"].as_u64().unwrap())
        .collect();
    assert_eq!(gens, vec![1, 2, 2, 2]);
    assert_eq!(v["runners_using"], 2);
    assert_eq!(v["module_kinds_from"], "runner names");
    let md = ok(&[&tiny, "--markdown"]);
    assert_eq!(md.lines().count(), 2 + 4, "{md}");
    assert!(md.contains("| tiny | module_kinds(2) | 2 |"), "{md}");
}

#[test]
fn bundled_comparisons_keep_lower_bound_le_packed_le_round_robin() {
    let files: Vec<String> = BUNDLED.iter().map(|s| bundled(s)).collect();
    let mut args: Vec<&str> = files.iter().map(String::as_str).collect();
    args.push("--json");
    let all = json_of(&args);
    for c in all.as_array().unwrap() {
        assert_eq!(c["module_kinds_from"], "file", "{}", c["name"]);
        for r in c["rows"].as_array().unwrap() {
            let lb = r["lower_bound"].as_u64().unwrap();
            let packed = r["packed_bytes"].as_u64().unwrap();
            let rr = r["round_robin_bytes"].as_u64().unwrap();
            assert!(
                lb <= packed && packed <= rr,
                "{} {}",
                c["name"],
                r["policy"]
            );
        }
    }
}

// ---- the SVG picture ---------------------------------------------------------

/// One box of the picture.
#[derive(Debug)]
struct ExtentBox {
    runner: usize,
    x: f64,
    w: f64,
    /// Its exact stacked addresses, `lo..hi`.
    lo: u128,
    hi: u128,
}

/// The least height the explorer draws a box (src/bin/replay-arena-plan/svg.rs).
const MIN_BOX: f64 = 2.0;

fn exact(node: roxmltree::Node<'_, '_>, name: &str) -> u128 {
    node.attribute(name).unwrap().parse().unwrap()
}

fn attr(node: roxmltree::Node<'_, '_>, name: &str) -> f64 {
    node.attribute(name).unwrap().parse().unwrap()
}

/// Draws `workload` with `args`, checks that the SVG is well formed, that
/// every key has a panel whose peak window holds the key's lower bound, and
/// that boxes of conflicting runners (fewer than G apart in capture order)
/// share columns but never overlap.
fn check_picture(workload: &str, args: &[&str]) {
    let path = scratch("plan.svg");
    let svg_path = path.to_string_lossy().into_owned();
    let mut all = vec![workload, "--json", "--svg", svg_path.as_str()];
    all.extend_from_slice(args);
    let out = run(&all);
    assert!(out.status.success(), "{all:?}: {}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("to {svg_path}")) && stderr(&out).contains("wrote"),
        "--svg says what it wrote: {}",
        stderr(&out)
    );
    let report: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let g = report["generations"].as_u64().unwrap() as usize;
    let text = std::fs::read_to_string(&path).unwrap();
    let doc = roxmltree::Document::parse(&text)
        .unwrap_or_else(|e| panic!("{workload} {args:?}: not well-formed SVG: {e}"));
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    assert_eq!(
        root.tag_name().namespace(),
        Some("http://www.w3.org/2000/svg")
    );
    let keys = report["keys"].as_array().unwrap();
    let panels: Vec<_> = root
        .descendants()
        .filter(|n| n.attribute("class") == Some("key"))
        .collect();
    assert_eq!(panels.len(), keys.len(), "{workload} {args:?}");
    for (panel, key) in panels.iter().zip(keys) {
        let peak = panel
            .descendants()
            .find(|n| n.attribute("class") == Some("peak"))
            .unwrap();
        assert_eq!(
            peak.attribute("data-bytes")
                .unwrap()
                .parse::<u64>()
                .unwrap(),
            key["lower_bound"].as_u64().unwrap(),
            "{workload} {args:?} {}",
            key["name"]
        );
        let boxes: Vec<ExtentBox> = panel
            .descendants()
            .filter(|n| n.attribute("class") == Some("extent"))
            .map(|n| {
                // Coordinates are printed to 0.001 px; a box is at least
                // MIN_BOX high, however few bytes it holds.
                assert!(attr(n, "height") >= MIN_BOX - 0.001, "{workload} {args:?}");
                ExtentBox {
                    runner: n.attribute("data-runner").unwrap().parse().unwrap(),
                    x: attr(n, "x"),
                    w: attr(n, "width"),
                    lo: exact(n, "data-lo"),
                    hi: exact(n, "data-hi"),
                }
            })
            .collect();
        let handoffs = panel
            .descendants()
            .filter(|n| n.attribute("class") == Some("handoff"))
            .count();
        assert!(!boxes.is_empty() || handoffs > 0, "an empty panel");
        for (i, a) in boxes.iter().enumerate() {
            assert!(a.lo < a.hi, "{workload} {args:?}: {a:?}");
            for b in &boxes[i + 1..] {
                if a.runner.abs_diff(b.runner) >= g {
                    continue;
                }
                let share_columns = a.x < b.x + b.w && b.x < a.x + a.w;
                assert!(share_columns, "{workload} {args:?}: {a:?} {b:?}");
                let overlap = a.lo < b.hi && b.lo < a.hi;
                assert!(
                    !overlap,
                    "{workload} {args:?} {}: {a:?} overlaps {b:?}",
                    key["name"]
                );
            }
        }
    }
}

#[test]
fn bundled_pictures_are_well_formed_and_conflicting_boxes_do_not_overlap() {
    for stem in BUNDLED {
        let path = bundled(stem);
        for g in ["1", "2", "3"] {
            check_picture(&path, &["-g", g]);
            check_picture(&path, &["-g", g, "--packed"]);
        }
    }
}

#[test]
fn irregular_pictures_are_well_formed_and_conflicting_boxes_do_not_overlap() {
    // Pseudo-random sizes over two keys, empty runners, and names that need
    // escaping in XML.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let runners: Vec<String> = (0..60)
        .map(|i| {
            let mut requests = Vec::new();
            for _ in 0..next() % 4 {
                let domain = if next() % 2 == 0 {
                    r#""device""#
                } else {
                    r#"{"symmetric": "g<&>"}"#
                };
                requests.push(format!(
                    r#"{{"domain": {domain}, "dtype": "bf16", "elements": {}}}"#,
                    1 + next() % 100_000
                ));
            }
            format!(
                r#"{{"name": "r<{i}>&\"'", "requests": [{}]}}"#,
                requests.join(",")
            )
        })
        .collect();
    let workload = file(&format!(
        r#"{{"name": "irregular <&>", "runners": [{}]}}"#,
        runners.join(",")
    ));
    for g in ["1", "2", "3", "4", "5"] {
        check_picture(&workload, &["-g", g]);
        check_picture(&workload, &["-g", g, "--packed"]);
    }
}

#[test]
fn a_picture_of_too_many_runners_is_refused_not_drawn() {
    let large = large();
    let svg = scratch("large.svg");
    let e = failure(&[&large, "-g", "2", "--svg", svg.to_str().unwrap()]);
    assert!(
        e.contains("--svg draws at most 4096 buffer-using runners;"),
        "{e}"
    );
    assert!(!svg.exists());
}

#[test]
fn module_kinds_come_from_the_file_or_from_masked_runner_names() {
    let v = json_of(&[&file(TINY), "--json"]);
    assert_eq!(
        (&v["module_kinds"], &v["module_kinds_from"]),
        (&json!(2), &json!("runner names"))
    );
    let given = file(&TINY.replacen(r#""source": "hand-written","#, r#""module_kinds": 5,"#, 1));
    let v = json_of(&[&given, "--json"]);
    assert_eq!(
        (&v["module_kinds"], &v["module_kinds_from"]),
        (&json!(5), &json!("file"))
    );
    // Runs of digits mask to one `#`: `layer12.mlp3.bwd` -> `layer#.mlp#.bwd`.
    let masked = file(
        r#"{"name": "m", "runners": [
            {"name": "layer12.mlp3.bwd", "requests": []},
            {"name": "layer7.mlp0.bwd", "requests": []},
            {"name": "layer7.attn.bwd", "requests": []}]}"#,
    );
    assert_eq!(json_of(&[&masked, "--json"])["module_kinds"], 2);
}

#[test]
fn a_workload_with_handoffs_plans_reports_and_draws() {
    let w = file(
        r#"{"name": "handoffs", "runners": [
          {"name": "l2.bwd", "requests": [{"domain": "device", "dtype": "f32", "elements": 4096}],
           "hand_off": [{"domain": "device", "dtype": "bf16", "elements": 8192}]},
          {"name": "l1.bwd", "requests": [{"domain": "device", "dtype": "f32", "elements": 4096}],
           "receive": [0], "hand_off": [{"domain": "device", "dtype": "bf16", "elements": 8192}]},
          {"name": "l0.bwd", "requests": [{"domain": "device", "dtype": "f32", "elements": 2048}],
           "receive": [1]}
        ]}"#,
    );
    let text = ok(&[&w, "-g", "2"]);
    assert!(
        text.contains("handoffs: 2 between runners, 32.00 KiB"),
        "{text}"
    );
    let v = json_of(&[&w, "-g", "2", "--json"]);
    assert_eq!(v["handoffs"], 2);
    // Two handoffs of 16 KiB whose widened lifetimes meet: 32 KiB.
    assert_eq!(v["handoff_bytes"], 32768);
    let svg = scratch("handoffs.svg");
    ok(&[&w, "-g", "2", "--svg", svg.to_str().unwrap()]);
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg "));
    let cmp = ok(&["--compare", &w]);
    assert!(cmp.contains("generations(2)"), "{cmp}");
    // A receive of a handoff nobody declared is refused with its path.
    let bad = file(
        &std::fs::read_to_string(&w)
            .unwrap()
            .replace(r#""receive": [1]"#, r#""receive": [7]"#),
    );
    let out = run(&[&bad]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("runners[2].receive[0]"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_bound_no_layout_reaches_is_named_proved_in_the_json_and_the_comparison() {
    // Nine runners alternating 2a and a, G = 3: the lower bound is 5a, and
    // no layout fits in less than 6a.
    let runners: Vec<String> = (0..9)
        .map(|k| {
            let elements = if k % 2 == 0 { 8192 } else { 4096 };
            format!(
                r#"{{"name": "m{k}", "requests": [{{"domain": "device", "dtype": "f32", "elements": {elements}}}]}}"#
            )
        })
        .collect();
    let w = file(&format!(
        r#"{{"name": "two-to-one", "runners": [{}]}}"#,
        runners.join(",\n")
    ));
    let v = json_of(&[&w, "-g", "3", "--packed", "--json"]);
    let key = &v["keys"][0];
    // The run the exhaustive search proved it on.
    let proved = &key["optimum"]["proved"];
    assert!(proved["first"].as_u64() < proved["last"].as_u64(), "{key}");
    assert_eq!(key["lower_bound"], 5 * 16384);
    assert_eq!(key["best_bound"], key["plan_bytes"]);
    assert_eq!(v["best_bound"], 6 * 16384);
    let md = ok(&["--compare", "--markdown", &w]);
    let g3 = md.lines().find(|l| l.contains("generations(3)")).unwrap();
    assert!(g3.contains("| proved |"), "{md}");
}

/// A decode-shaped workload of three shape buckets: per bucket an input
/// (token ids), a per-layer workspace and an output.
fn bucketed_workload() -> String {
    let mut runners = Vec::new();
    for b in [1u64, 4, 16] {
        for layer in 0..2 {
            runners.push(format!(
                r#"{{"name": "bs{b}.layer{layer}", "bucket": "bs={b}", "requests": [
                    {{"domain": "device", "dtype": "i32", "elements": {b}, "purpose": "input"}},
                    {{"domain": "device", "dtype": "bf16", "elements": {}}},
                    {{"domain": "device", "dtype": "bf16", "elements": {}}}]}}"#,
                4096 * b,
                1024 * b
            ));
        }
    }
    format!(
        r#"{{"name": "decode-buckets", "module_kinds": 1, "buckets": ["bs=1", "bs=4", "bs=16"], "runners": [{}]}}"#,
        runners.join(",")
    )
}

#[test]
fn compare_shows_shared_bucket_bytes_against_separate_plans() {
    let path = file(&bucketed_workload());
    let text = ok(&[&path, "--compare"]);
    assert!(text.contains("3 shape buckets share the arenas"), "{text}");
    assert!(text.contains("separate ("), "{text}");
    let v = json_of(&[&path, "--compare", "--json"]);
    assert_eq!(v["buckets"], 3);
    for r in v["rows"].as_array().unwrap() {
        let shared = r["packed_bytes"].as_u64().unwrap();
        let separate = r["separate_packed_bytes"].as_u64().unwrap();
        // The largest bucket is about 16/21 of the three together.
        assert!(shared < separate && 2 * shared > separate, "{r}");
    }
    // A single plan's report has the bucket line.
    let one = ok(&[&path, "-g", "2"]);
    assert!(one.contains("buckets: 3 share the arenas"), "{one}");
}

// ---- usage lines -------------------------------------------------------------

/// The usage forms in `text` (after "Usage: ", one a line).
fn usage_forms(text: &str) -> Vec<String> {
    let mut forms = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if let Some(first) = line.strip_prefix("Usage: ") {
            forms.push(first.trim().to_string());
            for more in lines.by_ref() {
                let more = more.trim();
                if !more.starts_with("replay-arena-plan") {
                    break;
                }
                forms.push(more.to_string());
            }
        }
    }
    forms
}

/// The parts of a usage form: each a list of choices, each choice a list of
/// words; an optional part has an empty choice first.
fn parts(form: &str) -> Vec<Vec<Vec<String>>> {
    let mut out = Vec::new();
    let mut rest = form.trim_start_matches("replay-arena-plan").trim();
    while !rest.is_empty() {
        let (part, after) = match rest.chars().next() {
            Some(open @ ('(' | '[')) => {
                let close = if open == '(' { ')' } else { ']' };
                let end = rest.find(close).expect("a closed group");
                let choices: Vec<Vec<String>> = rest[1..end]
                    .split(" | ")
                    .map(|c| c.split_whitespace().map(String::from).collect())
                    .collect();
                let mut part = Vec::new();
                if open == '[' {
                    part.push(Vec::new());
                }
                part.extend(choices);
                (part, &rest[end + 1..])
            }
            _ => {
                let end = rest.find(' ').unwrap_or(rest.len());
                (vec![vec![rest[..end].to_string()]], &rest[end..])
            }
        };
        out.push(part);
        rest = after.trim_start();
    }
    out
}

/// Command lines that follow `form`: its first choices, then each other
/// choice of each part in turn; placeholders filled in.
fn follow(form: &str, workload: &str, svg: &str) -> Vec<Vec<String>> {
    let parts = parts(form);
    let fill = |word: &str| -> Vec<String> {
        match word {
            "<FILE>..." => vec![workload.to_string(), workload.to_string()],
            "<FILE>" => vec![workload.to_string()],
            "<N>" | "<K>" | "<D>" => vec!["2".to_string()],
            "<SVG>" => vec![svg.to_string()],
            w => vec![w.to_string()],
        }
    };
    let line = |choice: &[usize]| -> Vec<String> {
        parts
            .iter()
            .zip(choice)
            .flat_map(|(part, &c)| part[c].iter().flat_map(|w| fill(w)))
            .collect()
    };
    let mut lines = vec![line(&vec![0; parts.len()])];
    for (p, part) in parts.iter().enumerate() {
        for c in 1..part.len() {
            let mut choice = vec![0; parts.len()];
            choice[p] = c;
            lines.push(line(&choice));
        }
    }
    lines
}

#[test]
fn every_usage_line_the_explorer_prints_is_accepted_when_followed() {
    let tiny = file(TINY);
    let svg = scratch("usage.svg");
    let svg = svg.to_str().unwrap();
    let mut texts = vec![stdout(&run(&["--help"]))];
    for args in [
        &["--compare", "--svg", "x.svg", "a.json"][..],
        &["--svg", "x.svg", "a.json"],
        &["--packed", "a.json"],
        &["a.json", "--compare", "--generations", "2"],
        &["a.json", "--generations", "2", "--markdown"],
        &["--compare"],
    ] {
        let e = refused(args);
        assert!(e.contains("Usage: "), "{args:?}: {e}");
        texts.push(e);
    }
    for text in &texts {
        let forms = usage_forms(text);
        assert_eq!(forms.len(), 3, "{text}");
        for form in forms {
            for args in follow(&form, &tiny, svg) {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                // `--svg` draws one workload: its form names one FILE.
                let o = run(&args);
                assert!(
                    o.status.success(),
                    "{form}\nfollowed as {args:?}, refused: {}",
                    stderr(&o)
                );
            }
        }
    }
}

#[test]
fn the_usage_checker_follows_each_choice() {
    let lines = follow(
        "replay-arena-plan <FILE> (-a | -b <N>) [--c | --d]",
        "w",
        "s",
    );
    assert_eq!(
        lines,
        [
            vec!["w", "-a"],
            vec!["w", "-b", "2"],
            vec!["w", "-a", "--c"],
            vec!["w", "-a", "--d"],
        ]
    );
}

#[test]
fn svg_or_packed_without_a_policy_says_which_policies_there_are() {
    let e = refused(&["--compare", "--svg", "x.svg", "a.json"]);
    assert!(
        e.contains("'--svg <SVG>' cannot be used with --compare")
            && e.contains("--overlap-depth <D>"),
        "{e}"
    );
    let e = refused(&["--packed", "a.json"]);
    assert!(e.contains("'--packed' needs a policy"), "{e}");
}

// ---- handoffs in the picture and the JSON ---------------------------------------

/// The bundled workload whose modules hand their input gradients on.
fn tp_backward() -> String {
    format!(
        "{}/examples/workloads/tp-backward-mid.json",
        env!("CARGO_MANIFEST_DIR")
    )
}

#[test]
fn a_picture_draws_each_handoff_in_its_keys_arena_over_its_lifetime() {
    for placement in [&[][..], &["--packed"]] {
        let svg = scratch("handoffs.svg");
        let mut args = vec![tp_backward(), "-g".into(), "2".into(), "--json".into()];
        args.extend(placement.iter().map(|a| a.to_string()));
        args.extend(["--svg".to_string(), svg.to_string_lossy().into_owned()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let v: Value = serde_json::from_str(&ok(&args)).unwrap();
        let places = v["handoff_places"].as_array().unwrap();
        assert_eq!(places.len() as u64, v["handoffs"].as_u64().unwrap());
        assert!(!places.is_empty());
        let text = std::fs::read_to_string(&svg).unwrap();
        let doc = roxmltree::Document::parse(&text).unwrap();
        let keys = v["keys"].as_array().unwrap();
        let panels: Vec<_> = doc
            .descendants()
            .filter(|n| n.attribute("class") == Some("key"))
            .collect();
        for place in places {
            let key = keys
                .iter()
                .position(|k| k["name"] == place["key_name"])
                .unwrap();
            let id = place["id"].to_string();
            let rect = panels[key]
                .descendants()
                .find(|n| {
                    n.attribute("class") == Some("handoff")
                        && n.attribute("data-handoff") == Some(id.as_str())
                })
                .unwrap_or_else(|| panic!("handoff {id} not drawn in {}", place["key_name"]));
            let lifetime = &place["lifetime"];
            assert_eq!(
                rect.attribute("data-from").unwrap(),
                lifetime["from"].to_string()
            );
            assert_eq!(
                rect.attribute("data-until").unwrap(),
                lifetime["until"].to_string()
            );
            // Live from its writer to its last reader and G - 1 runners more.
            let (from, until) = (
                lifetime["from"].as_u64().unwrap(),
                lifetime["until"].as_u64().unwrap(),
            );
            assert!(until > from + 1, "{place}");
            // Inside one of the key's arenas.
            let (y, h) = (attr(rect, "y"), attr(rect, "height"));
            let inside = panels[key]
                .descendants()
                .filter(|n| n.attribute("class") == Some("arena"))
                .any(|a| {
                    attr(a, "y") - 0.01 <= y && y + h <= attr(a, "y") + attr(a, "height") + 0.01
                });
            assert!(inside, "handoff {id} outside its arenas");
        }
        // The key that holds only handoffs is drawn with them, not empty.
        let only = panels
            .iter()
            .find(|p| {
                p.descendants()
                    .all(|n| n.attribute("class") != Some("extent"))
            })
            .expect("tp-backward-mid has a key of handoffs only");
        assert!(only
            .descendants()
            .any(|n| n.attribute("class") == Some("handoff")));
    }
}

#[test]
fn every_text_of_a_picture_fits_inside_it() {
    for (workload, args) in [
        (tp_backward(), &["-g", "2", "--packed"][..]),
        (tp_backward(), &["-g", "3"]),
        (bundled("mixtral-8x7b-per-module"), &["-g", "2"]),
        (bundled("deepseek-v3-mtp"), &["-k", "3", "--packed"]),
    ] {
        let svg = scratch("fits.svg");
        let mut all = vec![workload.as_str(), "--svg", svg.to_str().unwrap()];
        all.extend_from_slice(args);
        ok(&all);
        let text = std::fs::read_to_string(&svg).unwrap();
        let doc = roxmltree::Document::parse(&text).unwrap();
        let width = attr(doc.root_element(), "width");
        for t in doc.descendants().filter(|n| n.has_tag_name("text")) {
            if t.ancestors().any(|a| a.has_tag_name("defs")) {
                continue; // the runner axis: numbers under the columns
            }
            let size = t
                .attribute("font-size")
                .map_or(12.0, |s| s.parse().unwrap());
            let bold = t.attribute("font-weight") == Some("bold");
            let chars = t.text().unwrap_or("").chars().count() as f64;
            // Arial's average is about 0.5 em; bold a little wider.
            let w = chars * size * if bold { 0.58 } else { 0.53 };
            let x = attr(t, "x");
            let right = match t.attribute("text-anchor") {
                Some("middle") => x + w / 2.0,
                Some("end") => x,
                _ => x + w,
            };
            assert!(
                right <= width,
                "{workload} {args:?}: {:?} reaches {right:.0} of {width}",
                t.text()
            );
        }
    }
}

// ---- error positions ------------------------------------------------------------

#[test]
fn every_workload_error_names_its_line_and_column() {
    let cases: [(&str, &str, &str); 7] = [
        (
            r#""elements": 100"#,
            r#""elements": 0"#,
            "must be at least 1",
        ),
        (
            r#""elements": 100"#,
            r#""elements": -1"#,
            "expected a positive",
        ),
        (r#""dtype": "f32""#, r#""dtype": "bf17""#, "unknown dtype"),
        (
            r#""name": "layer0.mlp.bwd""#,
            r#""name": "layer1.attn.bwd""#,
            "duplicate runner name",
        ),
        (
            r#""name": "layer1.attn.bwd""#,
            r#""name": """#,
            "must not be empty",
        ),
        (
            r#""source": "hand-written""#,
            r#""source": 3"#,
            "invalid type",
        ),
        (
            r#""requests": []"#,
            r#""requests": [], "receive": [9]"#,
            "receive",
        ),
    ];
    for (from, to, what) in cases {
        assert!(TINY.contains(from), "{from}");
        let text = TINY.replacen(from, to, 1);
        let e = failure(&[&file(&text)]);
        assert!(e.contains(what), "{to}: {e}");
        // "at line L column C", and L:C is at the value (its start, or
        // just after it where the JSON parser stopped).
        let (_, at) = e
            .rsplit_once(" at line ")
            .unwrap_or_else(|| panic!("{to}: {e}"));
        let (line, column) = at.trim().split_once(" column ").unwrap();
        let (line, column): (usize, usize) = (line.parse().unwrap(), column.parse().unwrap());
        // Where the replacement is (TINY's first `from`).
        let before = &text[..TINY.find(from).unwrap()];
        let row = before.matches('\n').count() + 1;
        let start = before.rsplit('\n').next().unwrap().chars().count() + 1;
        let value = start + to.find(": ").map_or(0, |c| c + 2);
        assert_eq!(line, row, "{to}: {e}");
        assert!(
            (value..=start + to.len()).contains(&column),
            "{to}: {e}: the value is at columns {value} to {}",
            start + to.len()
        );
    }
}

// ---- picture details ------------------------------------------------------------

/// Draws `workload` with `args` and returns the SVG text, parsed once to
/// check that it is well-formed XML.
fn picture(workload: &str, args: &[&str]) -> String {
    let svg = scratch("picture.svg");
    let mut all = vec![workload, "--svg", svg.to_str().unwrap()];
    all.extend_from_slice(args);
    ok(&all);
    let text = std::fs::read_to_string(&svg).unwrap();
    if let Err(e) = roxmltree::Document::parse(&text) {
        panic!("{workload} {args:?}: not well-formed XML: {e}");
    }
    text
}

#[test]
fn names_with_characters_xml_forbids_still_draw_well_formed_xml() {
    // U+FFFE and U+FFFF are valid JSON and pass every name check, but XML
    // 1.0 allows neither, not even as a character reference; nor most C0
    // controls.
    let names = ["a\\ufffe", "b\\uffff", "c\\u0001\\u001f", "d\\u007f\\u0085"];
    let runners: Vec<String> = names
        .iter()
        .map(|name| {
            format!(
                r#"{{"name": "{name}", "requests": [
                    {{"domain": {{"symmetric": "g\ufffe"}}, "dtype": "bf16", "elements": 64}}]}}"#
            )
        })
        .collect();
    let workload = file(&format!(
        r#"{{"name": "w\uffff", "runners": [{}]}}"#,
        runners.join(",")
    ));
    for args in [&["-g", "2"][..], &["-g", "1", "--packed"]] {
        let text = picture(&workload, args);
        assert!(!text.contains(['\u{fffe}', '\u{ffff}', '\u{1}']), "{text}");
        // Replaced, not dropped: the names stay apart.
        assert!(
            text.contains("a\u{fffd}") && text.contains("b\u{fffd}"),
            "{text}"
        );
    }
}

#[test]
fn the_legend_names_the_peak_band() {
    let text = picture(&tp_backward(), &["-g", "2", "--packed"]);
    let doc = roxmltree::Document::parse(&text).unwrap();
    let swatch = doc
        .descendants()
        .find(|n| n.attribute("class") == Some("legend-peak"))
        .expect("a peak swatch in the legend");
    // The swatch is drawn as the band is, and its text says what it means.
    let band = doc
        .descendants()
        .find(|n| n.attribute("class") == Some("peak"))
        .unwrap();
    assert_eq!(swatch.attribute("fill"), band.attribute("fill"));
    let label = swatch.next_sibling_element().unwrap();
    assert!(
        label
            .text()
            .unwrap()
            .starts_with("peak: the column where the most bytes are live"),
        "{:?}",
        label.text()
    );
    // Above the first panel.
    let first_panel = doc
        .descendants()
        .find(|n| n.attribute("class") == Some("arena"))
        .unwrap();
    assert!(attr(label, "y") < attr(first_panel, "y"));
}

#[test]
fn boxes_too_small_for_the_scale_stay_visible() {
    // Mixtral's router buffers are a few KiB beside gigabytes of experts.
    let text = picture(&bundled("mixtral-8x7b-per-module"), &["-g", "2"]);
    let doc = roxmltree::Document::parse(&text).unwrap();
    let mut tiny = 0;
    for n in doc
        .descendants()
        .filter(|n| matches!(n.attribute("class"), Some("extent" | "handoff")))
    {
        let (lo, hi) = (exact(n, "data-lo"), exact(n, "data-hi"));
        let h = attr(n, "height");
        assert!(h >= MIN_BOX - 0.001, "{lo}..{hi} drawn {h} high");
        // The box covers at least its own addresses: its bottom is at lo.
        if h <= MIN_BOX + 0.001 {
            tiny += 1;
        }
    }
    assert!(tiny > 0, "mixtral has boxes thinner than MIN_BOX at scale");
}

#[test]
fn bucket_boundaries_are_drawn_where_a_bucket_starts() {
    let path = file(&bucketed_workload());
    let text = picture(&path, &["-g", "2"]);
    let doc = roxmltree::Document::parse(&text).unwrap();
    let panels: Vec<_> = doc
        .descendants()
        .filter(|n| n.attribute("class") == Some("key"))
        .collect();
    assert!(!panels.is_empty());
    for panel in panels {
        // Three buckets of two runners each: boundaries before columns 2
        // and 4, and the three names.
        let lines: Vec<&str> = panel
            .descendants()
            .filter(|n| n.attribute("class") == Some("bucket"))
            .map(|n| n.attribute("data-column").unwrap())
            .collect();
        assert_eq!(lines, ["2", "4"]);
        let names: Vec<&str> = panel
            .descendants()
            .filter(|n| n.attribute("class") == Some("bucket-name"))
            .map(|n| n.text().unwrap())
            .collect();
        assert_eq!(names, ["bs=1", "bs=4", "bs=16"]);
    }
    assert!(doc
        .descendants()
        .any(|n| n.attribute("class") == Some("legend-bucket")));
    // Without buckets, none.
    let plain = picture(&tp_backward(), &["-g", "2"]);
    assert!(!plain.contains(r#"class="bucket""#) && !plain.contains("legend-bucket"));
}

// ---- line width ---------------------------------------------------------------

#[test]
fn no_line_of_text_output_is_wider_than_100_characters() {
    let all: Vec<String> = [
        "deepseek-v3-mtp",
        "gpt3-175b-per-module",
        "gpt3-175b-whole-layer",
        "mixtral-8x7b-per-module",
        "tp-backward-mid",
    ]
    .iter()
    .map(|s| bundled(s))
    .collect();
    let bucketed = file(&bucketed_workload());
    let mut runs: Vec<Vec<String>> = vec![
        vec!["--help".into()],
        vec!["-h".into()],
        vec!["--version".into()],
        vec![bucketed.clone()],
        vec![bucketed.clone(), "-g".into(), "2".into()],
    ];
    let mut compare = vec!["--compare".to_string()];
    compare.extend(all.iter().cloned());
    runs.push(compare);
    for w in &all {
        for policy in [
            &["-g", "2"][..],
            &["-g", "3", "--packed"],
            &["-k", "3"],
            &["-d", "2"],
        ] {
            let mut args = vec![w.clone()];
            args.extend(policy.iter().map(|a| a.to_string()));
            runs.push(args);
        }
    }
    for args in &runs {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = ok(&args);
        assert!(!out.is_empty(), "{args:?}");
        for line in out.lines() {
            assert!(
                line.chars().count() <= 100,
                "{args:?}: a line of {} characters: {line}",
                line.chars().count()
            );
        }
    }
    // A usage error shows the usage forms, each within 100 characters too.
    let e = refused(&["--packed", "a.json"]);
    for line in e.lines() {
        assert!(line.chars().count() <= 100, "{line}");
    }
}

#[test]
fn the_picture_in_the_docs_is_what_the_explorer_draws() {
    // docs/workload-format.md: the bundled `tp-backward-mid` workload packed
    // at G = 2.
    let drawn = picture(&tp_backward(), &["-g", "2", "--packed"]);
    let docs = std::fs::read_to_string(format!(
        "{}/docs/plan-tp-backward-mid.svg",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    assert!(
        drawn == docs,
        "docs/plan-tp-backward-mid.svg is stale: regenerate it with \
         `replay-arena-plan examples/workloads/tp-backward-mid.json -g 2 --packed \
         --svg docs/plan-tp-backward-mid.svg`"
    );
}
