//! The user pages (README.md and docs/*.md) cite only files and items that
//! exist: every repository path (`src/..`, `tests/..`, `examples/..`,
//! `benches/..`, `docs/..`, `ui-tests/..`, `.ci/..`) and every relative
//! Markdown link names a file or folder of the tree, and every
//! `Type::member` names a type this crate defines and a member (function,
//! variant, constant or field) defined in its source, or one of the few
//! outside types the pages use (cudarc, std, half). CHANGELOG.md is history
//! and may name what no longer exists; it is not checked.

use crate::support::rust_files;
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

/// Asserts that `missing` finds nothing missing in any page (given its
/// path and text); else fails with `what` and each finding after the
/// name of its page.
#[track_caller]
fn assert_no_page_misses(what: &str, missing: impl Fn(&Path, &str) -> Vec<String>) {
    let mut all = Vec::new();
    for page in pages() {
        let text = fs::read_to_string(&page).unwrap();
        let name = page.strip_prefix(root()).unwrap().display().to_string();
        all.extend(
            missing(&page, &text)
                .into_iter()
                .map(|m| format!("{name}: {m}")),
        );
    }
    assert!(all.is_empty(), "{what}:\n{}", all.join("\n"));
}

#[test]
fn pages_cite_only_paths_that_exist() {
    assert_no_page_misses("cited but missing", |page, text| {
        let gone = cited_paths(text).into_iter().filter(|path| !exists(path));
        let dir = page.parent().unwrap();
        let broken = links(text)
            .into_iter()
            .filter(|link| !dir.join(link).exists());
        let gone = gone.map(|path| format!("path `{path}`"));
        gone.chain(broken.map(|link| format!("link `{link}`")))
            .collect()
    });
}

#[test]
fn pages_cite_only_items_that_exist() {
    let files = rust_files(&root().join("src"));
    let source: String = files
        .iter()
        .map(|f| fs::read_to_string(f).unwrap())
        .collect::<Vec<_>>()
        .join("\n");
    assert_no_page_misses("cited but not defined", |_, text| {
        let mut missing = Vec::new();
        for (ty, member) in cited_items(text) {
            if EXTERNAL.contains(&ty.as_str()) {
                continue;
            }
            if !defines_type(&source, &ty) {
                missing.push(format!("type `{ty}` (in `{ty}::{member}`)"));
            } else if !defines_member(&source, &member) {
                missing.push(format!("`{ty}::{member}`"));
            }
        }
        missing
    });
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

// ---------------------------------------------------------------------------
// Links of the guides, on GitHub and in the rustdoc build (src/guide.rs
// includes each docs/ page as a module's documentation).
// ---------------------------------------------------------------------------

/// Inline links the pages still carry that break in the rustdoc build, each
/// with the reason it is not converted yet. Empty is the goal.
const PENDING_INLINE: &[(&str, &str)] = &[];

/// Ids rustdoc gives its own page parts: a heading with one of these ids
/// gets another (`-1` added) in the rustdoc build, so a link to it breaks
/// there.
const RUSTDOC_IDS: &[&str] = &[
    "help",
    "settings",
    "search",
    "main-content",
    "crate-search",
    "toggle-all-docs",
    "all-types",
    "default-settings",
    "copy-path",
    "rustdoc-vars",
    "sidebar-vars",
    "fields",
    "variants",
    "implementations",
    "trait-implementations",
    "synthetic-implementations",
    "blanket-implementations",
    "required-methods",
    "provided-methods",
    "implementors",
    "modules",
    "structs",
    "enums",
    "functions",
    "macros",
    "constants",
    "traits",
    "types",
    "reexports",
    "layout",
];

/// A Markdown page as text outside code: each line, with fenced code blocks
/// blanked and inline code spans removed.
fn prose(text: &str) -> Vec<String> {
    let mut fenced = false;
    text.lines()
        .map(|line| {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                return String::new();
            }
            if fenced {
                return String::new();
            }
            // Drop `code spans`.
            let mut out = String::new();
            let mut in_code = false;
            for c in line.chars() {
                if c == '`' {
                    in_code = !in_code;
                } else if !in_code {
                    out.push(c);
                }
            }
            out
        })
        .collect()
}

/// The anchor GitHub and rustdoc give a heading: lower case, spaces to
/// hyphens, anything but letters, digits, `-` and `_` dropped. (They differ
/// only on non-ASCII capitals, which the pages' headings do not use.)
fn slug(heading: &str) -> String {
    heading
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '-' || c == '_' {
                Some(c.to_ascii_lowercase())
            } else if c == ' ' {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

/// Every heading anchor of a Markdown page, with `-1`, `-2` .. for
/// repeated headings, as both renderers number them.
fn anchors(text: &str) -> Vec<String> {
    let mut seen: Vec<String> = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#');
        if !title.starts_with(' ') {
            continue;
        }
        // Link text stays, targets go: `[text](url)` -> `text`.
        let mut plain = String::new();
        let mut rest = title.trim();
        while let Some(open) = rest.find("](") {
            let close = rest[open..].find(')').map_or(rest.len(), |c| open + c + 1);
            plain.push_str(&rest[..open].replace('[', ""));
            rest = &rest[close..];
        }
        plain.push_str(&rest.replace(['[', ']'], ""));
        let base = slug(&plain);
        let mut id = base.clone();
        let mut n = 0;
        while seen.contains(&id) {
            n += 1;
            id = format!("{base}-{n}");
        }
        seen.push(id);
    }
    seen
}

/// What follows each `open` in `line` up to the next `close` (an `open`
/// with no `close` after it ends the search).
fn each_after(line: &str, open: &str, close: char) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find(open) {
        let after = &rest[i + open.len()..];
        let Some(end) = after.find(close) else { break };
        found.push(after[..end].to_string());
        rest = &after[end..];
    }
    found
}

/// Inline links `[text](target)` in `line` (images included), as targets.
fn inline_links(line: &str) -> Vec<String> {
    each_after(line, "](", ')')
}

/// Reference links `[text][label]` in `line`, as labels.
fn reference_links(line: &str) -> Vec<String> {
    let mut labels = each_after(line, "][", ']');
    labels.retain(|label| !label.is_empty());
    labels
}

/// Link reference definitions `[label]: target`, one per line.
fn definitions(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|line| {
            let line = line.strip_prefix('[')?;
            let (label, target) = line.split_once("]: ")?;
            Some((label.to_string(), target.trim().to_string()))
        })
        .collect()
}

/// What src/guide.rs builds: each included page (`docs/NAME.md`) with its
/// module, and the definitions its `guide_links!` puts before every page.
struct Guide {
    modules: Vec<(String, String)>,
    definitions: Vec<(String, String)>,
}

fn guide() -> Guide {
    let source = fs::read_to_string(root().join("src/guide.rs")).unwrap();
    let mut modules = Vec::new();
    let mut page = None;
    for line in source.lines() {
        if let Some(at) = line.find("include_str!(\"../docs/") {
            let rest = &line[at + "include_str!(\"../".len()..];
            page = Some(rest[..rest.find('"').unwrap()].to_string());
        }
        if let Some(module) = line.strip_prefix("pub mod ") {
            let module = module.trim_end_matches(" {}").to_string();
            if let Some(page) = page.take() {
                modules.push((page, module));
            }
        }
    }
    let start = source.find("macro_rules! guide_links").unwrap();
    let body = &source[start..];
    let body = &body[..body.find("\"\n    };").unwrap()];
    Guide {
        modules,
        definitions: definitions(body),
    }
}

/// `base` joined with a relative `target`, `..` resolved: `docs` +
/// `../CHANGELOG.md` is `CHANGELOG.md`.
fn join(base: &str, target: &str) -> String {
    let mut parts: Vec<&str> = base.split('/').filter(|p| !p.is_empty()).collect();
    for part in target.split('/') {
        match part {
            ".." => {
                parts.pop();
            }
            "." => {}
            p => parts.push(p),
        }
    }
    parts.join("/")
}

/// Where a rustdoc link target leads, as (repository file, anchor): a
/// guide module's page, or a file of the package's source on docs.rs.
fn rustdoc_target(guide: &Guide, target: &str) -> Option<(String, String)> {
    let (path, anchor) = target.split_once('#').unwrap_or((target, ""));
    if let Some(module) = path.strip_prefix("crate::guide::") {
        let page = guide.modules.iter().find(|(_, m)| m == module)?;
        return Some((page.0.clone(), anchor.to_string()));
    }
    let file = path.strip_prefix("https://docs.rs/crate/replay-arena/latest/source/")?;
    Some((file.to_string(), anchor.to_string()))
}

/// Problems with the links of `page` (a path under the root), on GitHub and,
/// where src/guide.rs includes it, in the rustdoc build.
fn link_problems(guide: &Guide, page: &str) -> Vec<String> {
    let text = fs::read_to_string(root().join(page)).unwrap();
    let dir = page.rsplit_once('/').map_or("", |(d, _)| d);
    let in_rustdoc = guide.modules.iter().any(|(p, _)| p == page);
    let own = definitions(&text);
    let mut problems = Vec::new();
    let mut say = |line: usize, what: String| problems.push(format!("{page}:{line}: {what}"));
    // Does `file#anchor` (repository paths) exist?
    let resolves = |file: &str, anchor: &str| -> Result<(), String> {
        if !root().join(file).exists() {
            return Err(format!("`{file}` does not exist"));
        }
        if anchor.is_empty() {
            return Ok(());
        }
        let target = fs::read_to_string(root().join(file)).unwrap_or_default();
        let ids = anchors(&target);
        if !ids.iter().any(|id| id == anchor) {
            return Err(format!("`{file}` has no heading `#{anchor}`"));
        }
        if RUSTDOC_IDS.contains(&anchor) {
            return Err(format!(
                "`{file}#{anchor}`: rustdoc renames this heading (it uses the id itself)"
            ));
        }
        Ok(())
    };
    for (n, line) in prose(&text).iter().enumerate() {
        let n = n + 1;
        for target in inline_links(line) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            if target.contains("::") {
                say(
                    n,
                    format!(
                        "`{target}` is a Rust path: a link only rustdoc resolves \
                         (write the item in backticks, or link its page)"
                    ),
                );
                continue;
            }
            let (file, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let file = if file.is_empty() {
                page.to_string()
            } else {
                join(dir, file)
            };
            if let Err(e) = resolves(&file, anchor) {
                say(n, format!("link `{target}`: {e}"));
            }
            let pending = PENDING_INLINE
                .iter()
                .any(|&(p, t)| p == page && t == target);
            if in_rustdoc && !target.starts_with('#') && !pending {
                say(
                    n,
                    format!(
                        "inline link `({target})` breaks in the rustdoc build: write \
                         `[text][{target}]`, with `[{target}]: {target}` at the page's end \
                         and its rustdoc target in src/guide.rs's guide_links!"
                    ),
                );
            }
        }
        for label in reference_links(line) {
            let github = own.iter().find(|(l, _)| l.eq_ignore_ascii_case(&label));
            let Some((_, target)) = github else {
                say(
                    n,
                    format!("`[{label}]` has no definition on the page (GitHub)"),
                );
                continue;
            };
            let (file, anchor) = target.split_once('#').unwrap_or((target, ""));
            let file = join(dir, file);
            if let Err(e) = resolves(&file, anchor) {
                say(n, format!("link `[{label}]`: {e}"));
            }
            if !in_rustdoc {
                continue;
            }
            let docs = guide
                .definitions
                .iter()
                .find(|(l, _)| l.eq_ignore_ascii_case(&label));
            match docs.and_then(|(_, t)| rustdoc_target(guide, t).map(|to| (t, to))) {
                None => say(
                    n,
                    format!("`[{label}]` has no rustdoc target in src/guide.rs's guide_links!"),
                ),
                Some((t, (to_file, to_anchor)))
                    if (to_file.as_str(), to_anchor.as_str()) != (file.as_str(), anchor) =>
                {
                    say(
                        n,
                        format!(
                            "`[{label}]` leads to `{target}` on GitHub but to `{t}` in rustdoc"
                        ),
                    )
                }
                Some(_) => {}
            }
        }
    }
    problems
}

#[test]
fn every_link_of_every_page_resolves_on_github_and_in_rustdoc() {
    let guide = guide();
    assert!(
        guide.modules.len() >= 10,
        "src/guide.rs includes {:?}",
        guide.modules
    );
    let mut problems = Vec::new();
    for page in pages() {
        let name = page.strip_prefix(root()).unwrap().display().to_string();
        problems.extend(link_problems(&guide, &name));
    }
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

#[test]
fn every_rustdoc_link_target_names_a_guide_or_a_packaged_file() {
    let guide = guide();
    let mut problems = Vec::new();
    for (label, target) in &guide.definitions {
        match rustdoc_target(&guide, target) {
            None => problems.push(format!("[{label}]: {target} (no such guide module)")),
            Some((file, anchor)) => {
                let text = fs::read_to_string(root().join(&file));
                match text {
                    Err(_) => problems.push(format!("[{label}]: {target} (no `{file}`)")),
                    Ok(text) if !anchor.is_empty() && !anchors(&text).contains(&anchor) => {
                        problems.push(format!("[{label}]: {target} (no heading `#{anchor}`)"))
                    }
                    Ok(_) => {}
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_link_checks_catch_what_they_are_for() {
    let guide = Guide {
        modules: vec![
            ("docs/concepts.md".into(), "concepts".into()),
            ("docs/lifecycle.md".into(), "lifecycle".into()),
        ],
        definitions: definitions(
            "[lifecycle.md#replay-schedules]: crate::guide::lifecycle#replay-schedules\n\
             [lifecycle.md]: crate::guide::concepts",
        ),
    };
    assert_eq!(
        rustdoc_target(&guide, "crate::guide::lifecycle#replay-schedules"),
        Some(("docs/lifecycle.md".into(), "replay-schedules".into()))
    );
    assert_eq!(rustdoc_target(&guide, "crate::guide::nope"), None);
    assert_eq!(join("docs", "../CHANGELOG.md"), "CHANGELOG.md");
    assert_eq!(
        anchors("# A `B`: c\n```\n# not a heading\n```\n## A B c\n## A B c"),
        ["a-b-c", "a-b-c-1", "a-b-c-2"]
    );
    assert_eq!(
        slug("5. `StepGraph`: one launch per step"),
        "5-stepgraph-one-launch-per-step"
    );
    assert_eq!(
        inline_links("see [x](a.md#b) and ![p](c.svg)"),
        ["a.md#b", "c.svg"]
    );
    assert_eq!(
        reference_links("see [x][a.md#b], `[y][z]`"),
        ["a.md#b", "z"]
    );
    assert!(prose("see `[y](z)` here")[0] == "see  here");
}
