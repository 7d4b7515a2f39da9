//! The user pages (README.md and docs/*.md) cite only files and items that
//! exist: every repository path (`src/..`, `tests/..`, `examples/..`,
//! `benches/..`, `docs/..`, `ui-tests/..`, `.ci/..`) and every relative
//! Markdown link names a file or folder of the tree, and every
//! `Type::member` names a type this crate defines and a member (function,
//! variant, constant or field) defined in its source, or one of the few
//! outside types the pages use (cudarc, std, half). CHANGELOG.md is history
//! and may name what no longer exists; it is not checked.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// Types the pages use that this crate does not define, with the members
/// they call on them.
const EXTERNAL: &[&str] = &[
    // cudarc
    "CudaContext",
    "CudaSlice",
    "CudaFunction",
    "LaunchConfig",
    "CudaBlas",
    "DriverError",
    "NcclError",
    "CublasError",
    // std
    "Arc",
    "Box",
    "Option",
    "Result",
    "Vec",
    "String",
    "File",
    "std",
    // half
    "half",
    // libloading
    "Library",
    // candle (docs/integration.md's candle guide; examples/candle_backward)
    "CudaStorage",
    "Tensor",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn pages() -> Vec<PathBuf> {
    let mut pages = vec![root().join("README.md")];
    let mut docs: Vec<_> = fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn is_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "_./*-".contains(c)
}

/// Whether `pattern` (a path, possibly with `*` in its last parts) names
/// something in the tree.
fn exists(pattern: &str) -> bool {
    let pattern = pattern.trim_end_matches('/');
    match pattern.find('*') {
        None => root().join(pattern).exists(),
        // A glob: the folder before the first `*` must exist and hold
        // something.
        Some(star) => {
            let dir = &pattern[..pattern[..star].rfind('/').map_or(0, |i| i + 1)];
            root()
                .join(dir)
                .read_dir()
                .is_ok_and(|mut d| d.next().is_some())
        }
    }
}

/// Repository paths cited in `text`.
fn cited_paths(text: &str) -> BTreeSet<String> {
    const ROOTS: [&str; 7] = [
        "src/",
        "tests/",
        "examples/",
        "benches/",
        "docs/",
        "ui-tests/",
        ".ci/",
    ];
    let mut found = BTreeSet::new();
    for (i, _) in text.char_indices() {
        let before = text[..i].chars().next_back();
        if before.is_some_and(|c| is_path_char(c) || c == '<') {
            continue;
        }
        if let Some(prefix) = ROOTS.iter().find(|r| text[i..].starts_with(*r)) {
            let len = text[i..]
                .find(|c: char| !is_path_char(c))
                .unwrap_or(text.len() - i);
            let path = text[i..i + len].trim_end_matches(['.', ',', ':', '-']);
            // `<hash>` and the like are placeholders, not files.
            if text[i + len..].starts_with('<') || path.len() <= prefix.len() && path != *prefix {
                continue;
            }
            found.insert(path.to_string());
        }
    }
    found
}

/// Relative Markdown link targets in `text` (no scheme, no pure anchors),
/// without their anchors.
fn links(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = rest[..end].split('#').next().unwrap();
        if !target.is_empty() && !target.contains("://") && !target.contains(' ') {
            found.insert(target.to_string());
        }
    }
    found
}

/// `Type::member` pairs in `text` (a type starts with an upper-case letter).
fn cited_items(text: &str) -> BTreeSet<(String, String)> {
    let mut found = BTreeSet::new();
    let mut from = 0;
    while let Some(i) = text[from..].find("::") {
        let at = from + i;
        from = at + 2;
        let start = text[..at]
            .char_indices()
            .rev()
            .take_while(|(_, c)| is_ident(*c))
            .last()
            .map_or(at, |(j, _)| j);
        let ty = &text[start..at];
        let end = text[at + 2..]
            .find(|c: char| !is_ident(c))
            .map_or(text.len(), |j| at + 2 + j);
        let member = &text[at + 2..end];
        let preceded_by_path = text[..start].ends_with("::");
        if preceded_by_path
            || member.is_empty()
            || !ty.starts_with(|c: char| c.is_ascii_uppercase())
        {
            continue;
        }
        found.insert((ty.to_string(), member.to_string()));
    }
    found
}

fn defines_type(source: &str, ty: &str) -> bool {
    ["struct", "enum", "trait", "type", "union"]
        .iter()
        .any(|kw| {
            source.match_indices(&format!("{kw} {ty}")).any(|(i, m)| {
                !source[i + m.len()..].starts_with(is_ident) && !source[..i].ends_with(is_ident)
            })
        })
}

fn defines_member(source: &str, member: &str) -> bool {
    let word_at = |i: usize, len: usize| {
        !source[i + len..].starts_with(is_ident) && !source[..i].ends_with(is_ident)
    };
    // A function or constant.
    for kw in ["fn ", "const "] {
        let pat = format!("{kw}{member}");
        if source
            .match_indices(&pat)
            .any(|(i, m)| word_at(i + kw.len(), m.len() - kw.len()))
        {
            return true;
        }
    }
    // A variant or field: the name first on a line, then `,`, `(`, `{` or `:`.
    source.lines().any(|line| {
        let line = line.trim_start();
        line.strip_prefix(member)
            .or_else(|| {
                line.strip_prefix("pub ")
                    .and_then(|l| l.strip_prefix(member))
            })
            .is_some_and(|rest| rest.starts_with([',', '(', ' ', '{', ':']) || rest.is_empty())
    })
}

#[test]
fn pages_cite_only_paths_that_exist() {
    let mut missing = Vec::new();
    for page in pages() {
        let text = fs::read_to_string(&page).unwrap();
        let name = page.strip_prefix(root()).unwrap().display().to_string();
        for path in cited_paths(&text) {
            if !exists(&path) {
                missing.push(format!("{name}: path `{path}`"));
            }
        }
        for link in links(&text) {
            let target = page.parent().unwrap().join(&link);
            if !target.exists() {
                missing.push(format!("{name}: link `{link}`"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "cited but missing:\n{}",
        missing.join("\n")
    );
}

#[test]
fn pages_cite_only_items_that_exist() {
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    let source: String = files
        .iter()
        .map(|f| fs::read_to_string(f).unwrap())
        .collect::<Vec<_>>()
        .join("\n");
    let mut missing = Vec::new();
    for page in pages() {
        let text = fs::read_to_string(&page).unwrap();
        let name = page.strip_prefix(root()).unwrap().display().to_string();
        for (ty, member) in cited_items(&text) {
            if EXTERNAL.contains(&ty.as_str()) {
                continue;
            }
            if !defines_type(&source, &ty) {
                missing.push(format!("{name}: type `{ty}` (in `{ty}::{member}`)"));
            } else if !defines_member(&source, &member) {
                missing.push(format!("{name}: `{ty}::{member}`"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "cited but not defined:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_checks_catch_what_they_are_for() {
    assert!(cited_paths("see `tests/nope.rs`, and src/lib.rs.").contains("tests/nope.rs"));
    assert!(cited_paths("see src/lib.rs.").contains("src/lib.rs"));
    assert!(!exists("tests/nope.rs"));
    assert!(exists("examples/workloads/*.json"));
    assert!(cited_items("`Replayable::replay_twice(r)`")
        .contains(&("Replayable".to_string(), "replay_twice".to_string())));
    let source = "pub struct Replayable;\nimpl Replayable { pub fn replay(&self) {} }\nenum E {\n    Overwritten { runner: u32 },\n}";
    assert!(defines_type(source, "Replayable") && !defines_type(source, "Replay"));
    assert!(defines_member(source, "replay") && !defines_member(source, "replay_twice"));
    assert!(defines_member(source, "Overwritten"));
    assert!(links("[x](nope.md#a) [y](https://e.org)").contains("nope.md"));
}
