//! The layout of `tests/`: tests are filed by the room they test, so a
//! newcomer finds where a new one goes from the names alone.
//!
//! - A few binaries: `suite` (everything that runs without a GPU), `ui`
//!   (compile-fail), `probe` (the backends' probes), and the GPU binaries,
//!   whose names start with `gpu`.
//! - Each module of `suite` and `gpu` sits under a room: a module of
//!   `src/lib.rs`, or one of the few rooms that are not a module
//!   ([`OTHER_ROOMS`]).
//! - Every file under a binary's folder is a module of it: no file is left
//!   out of the build.
//! - No file is named after a review round: a finding lives in
//!   `suite/regression/`, in a file named by the behaviour it guards.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// Rooms that are not modules of `src/`: the shared fixtures, the crate's
/// own shape, the user pages, the whole lifecycle end to end, the plan
/// explorer (`src/bin`), the examples, and the regressions.
const OTHER_ROOMS: &[&str] = &[
    "support",
    "architecture",
    "docs",
    "lifecycle",
    "cli",
    "examples",
    "regression",
];

/// The most test binaries `tests/` may build: each one is a link step.
const MOST_BINARIES: usize = 12;

/// The modules `src/lib.rs` declares, public or not.
fn src_modules() -> BTreeSet<String> {
    let lib = fs::read_to_string("src/lib.rs").unwrap();
    lib.lines()
        .map(str::trim)
        .filter_map(|l| {
            l.strip_prefix("pub mod ")
                .or_else(|| l.strip_prefix("mod "))
        })
        .map(|m| m.trim_end_matches(';').trim().to_string())
        .collect()
}

/// The test binaries: `tests/*.rs` and `tests/*/main.rs`, by name.
fn binaries() -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    for entry in fs::read_dir("tests").unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rs") {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            out.push((name, path));
        } else if path.join("main.rs").is_file() {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            out.push((name, path.join("main.rs")));
        }
    }
    out.sort();
    out
}

/// The top-level modules a binary's root declares (`mod step { .. }`,
/// `mod support;`), attributes and comments aside.
fn top_level_modules(root: &str) -> Vec<String> {
    let mut depth = 0usize;
    let mut out = Vec::new();
    for line in root.lines() {
        let code = line.split("//").next().unwrap_or("").trim();
        if depth == 0 {
            if let Some(rest) = code.strip_prefix("mod ") {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                out.push(name);
            }
        }
        depth += code.matches('{').count();
        depth -= code.matches('}').count();
    }
    out
}

/// The module files a binary's root and its inline modules declare, as
/// paths relative to the root's folder (`step/graph.rs`).
fn declared_files(root: &str) -> BTreeSet<PathBuf> {
    let mut stack: Vec<String> = Vec::new();
    let mut out = BTreeSet::new();
    let mut path_attr = None;
    for line in root.lines() {
        let code = line.split("//").next().unwrap_or("").trim();
        if let Some(p) = code.strip_prefix("#[path = \"") {
            path_attr = Some(p.trim_end_matches("\"]").to_string());
            continue;
        }
        if let Some(rest) = code.strip_prefix("mod ") {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if rest.trim_end().ends_with('{') {
                stack.push(name);
            } else {
                let file = match path_attr.take() {
                    Some(p) => PathBuf::from(p),
                    None => {
                        let mut p: PathBuf = stack.iter().collect();
                        p.push(format!("{name}.rs"));
                        p
                    }
                };
                out.insert(file);
            }
        } else if code == "}" {
            stack.pop();
        }
    }
    out
}

/// Every `.rs` file under `dir`, as a path from `dir`.
fn rust_files_in(dir: &Path) -> BTreeSet<PathBuf> {
    let files = crate::support::rust_files(dir).into_iter();
    files
        .map(|p| p.strip_prefix(dir).unwrap().to_path_buf())
        .collect()
}

#[test]
fn tests_build_a_few_binaries_named_for_what_they_run() {
    let names: Vec<String> = binaries().into_iter().map(|(n, _)| n).collect();
    assert!(
        names.len() <= MOST_BINARIES,
        "{} test binaries (at most {MOST_BINARIES}): {names:?}",
        names.len()
    );
    let strays: Vec<&String> = names
        .iter()
        .filter(|n| !["suite", "ui", "probe"].contains(&n.as_str()) && !n.starts_with("gpu"))
        .collect();
    assert!(
        strays.is_empty(),
        "a test belongs in `suite` (no GPU), a `gpu*` binary, `ui` or `probe`: {strays:?}"
    );
}

#[test]
fn every_test_module_sits_under_a_room() {
    let mut rooms = src_modules();
    rooms.extend(OTHER_ROOMS.iter().map(|r| r.to_string()));
    let mut outside = Vec::new();
    for (name, root) in binaries() {
        if root.file_name().is_some_and(|f| f != "main.rs") {
            continue;
        }
        let text = fs::read_to_string(&root).unwrap();
        for module in top_level_modules(&text) {
            let room = module.strip_prefix("gpu_").unwrap_or(&module);
            if !rooms.contains(room) {
                outside.push(format!("{name}: mod {module}"));
            }
        }
    }
    assert!(
        outside.is_empty(),
        "test modules outside every room (a module of src/lib.rs or one of {OTHER_ROOMS:?}): \
         {outside:#?}"
    );
}

#[test]
fn every_file_of_a_binary_is_one_of_its_modules() {
    let mut orphans = Vec::new();
    for (name, root) in binaries() {
        if root.file_name().is_some_and(|f| f != "main.rs") {
            continue;
        }
        let dir = root.parent().unwrap();
        let declared = declared_files(&fs::read_to_string(&root).unwrap());
        let mut present = rust_files_in(dir);
        present.remove(Path::new("main.rs"));
        let undeclared = present.difference(&declared);
        orphans.extend(undeclared.map(|file| format!("tests/{name}/{}", file.display())));
    }
    assert!(
        orphans.is_empty(),
        "files no module declares (they would never build): {orphans:#?}"
    );
}

#[test]
fn no_test_file_is_named_after_a_review_round() {
    let named: Vec<PathBuf> = rust_files_in(Path::new("tests"))
        .into_iter()
        .filter(|p| {
            let s = p.to_string_lossy();
            s.contains("hostile") || s.contains("_round") || s.contains("review")
        })
        .collect();
    assert!(
        named.is_empty(),
        "a regression is named by the behaviour it guards, never by the round that found it: \
         {named:?}"
    );
}

#[test]
fn the_layout_checks_see_modules_and_files() {
    let root = "#[path = \"../support/mod.rs\"]\nmod support;\n\
                mod step {\n    mod graph;\n    #[cfg(x)]\n    mod launch;\n}\nmod plan {\n    mod props;\n}\n";
    assert_eq!(top_level_modules(root), ["support", "step", "plan"]);
    let files: Vec<String> = declared_files(root)
        .into_iter()
        .map(|p| p.display().to_string())
        .collect();
    assert_eq!(
        files,
        [
            "../support/mod.rs",
            "plan/props.rs",
            "step/graph.rs",
            "step/launch.rs"
        ]
    );
}
