//! The layering of `src/`: each module imports only modules declared before
//! it in `src/lib.rs` (lowest first), so the phases read one way: vocabulary,
//! views, the scope registry and backends at the bottom, then discovery,
//! planning, capture, the fence and replay, with the crate error and
//! `BufferSource` on top.
//!
//! An import is every `crate::` path in code (`crate::plan::Planned`,
//! `use crate::{vocab, view}`, `$crate::Error` in a macro). A path through
//! the root re-exports (`crate::Planned`, `crate::cuda`) counts as an import
//! of the module that `src/lib.rs` re-exports it from, so no dependency
//! hides behind `lib.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The modules in `src/lib.rs`'s declaration order.
fn layers() -> Vec<String> {
    let lib = fs::read_to_string("src/lib.rs").unwrap();
    lib.lines()
        .filter_map(|l| l.strip_prefix("mod "))
        .map(|m| m.trim_end_matches(';').to_string())
        .collect()
}

/// `source` without its `#[cfg(test)]` modules (other `#[cfg(test)]` items
/// stay) and without comments (doc comments included).
fn code(source: &str) -> String {
    let mut kept = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(i) = rest.find("#[cfg(test)]") {
        kept.push_str(&rest[..i]);
        let after = &rest[i + "#[cfg(test)]".len()..];
        let item = after.trim_start();
        let is_module = item.starts_with("mod ")
            && item
                .find('{')
                .is_some_and(|b| item.find(';').is_none_or(|s| b < s));
        if is_module {
            rest = &item[closing_brace(item, item.find('{').unwrap())..];
        } else {
            kept.push_str("#[cfg(test)]");
            rest = after;
        }
    }
    kept.push_str(rest);
    kept.lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// How many `#` open the raw string literal starting at `b[k]` (`r"`,
/// `r#"`, ...), if one does.
fn raw_string_at(b: &[u8], k: usize) -> Option<usize> {
    let ident = |c: &u8| c.is_ascii_alphanumeric() || *c == b'_';
    if b[k] != b'r' || k.checked_sub(1).is_some_and(|j| ident(&b[j])) {
        return None;
    }
    let hashes = b[k + 1..].iter().take_while(|c| **c == b'#').count();
    (b.get(k + 1 + hashes) == Some(&b'"')).then_some(hashes)
}

/// The index just past the brace that closes the one at `open`, braces in
/// string and character literals not counted.
fn closing_brace(text: &str, open: usize) -> usize {
    let b = text.as_bytes();
    let mut depth = 0usize;
    let mut k = open;
    while k < b.len() {
        match b[k] {
            b'/' if b.get(k + 1) == Some(&b'/') => {
                while k < b.len() && b[k] != b'\n' {
                    k += 1;
                }
            }
            b'/' if b.get(k + 1) == Some(&b'*') => {
                k = text[k + 2..].find("*/").map_or(b.len(), |i| k + 2 + i + 1);
            }
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return k + 1;
                }
            }
            // A raw string: r"..", r#".."#, ...
            b'r' if raw_string_at(b, k).is_some() => {
                let hashes = raw_string_at(b, k).unwrap();
                let close = format!("\"{}", "#".repeat(hashes));
                let from = k + 2 + hashes;
                k = text[from..]
                    .find(&close)
                    .map_or(b.len(), |i| from + i + close.len())
                    - 1;
            }
            b'"' => {
                k += 1;
                while k < b.len() && b[k] != b'"' {
                    k += if b[k] == b'\\' { 2 } else { 1 };
                }
            }
            // A character literal ('{', '\''), not a lifetime ('a).
            b'\'' if b.get(k + 2) == Some(&b'\'') => k += 2,
            b'\'' if b.get(k + 1) == Some(&b'\\') => {
                k += 2;
                while k < b.len() && b[k] != b'\'' {
                    k += 1;
                }
            }
            _ => {}
        }
        k += 1;
    }
    b.len()
}

/// What `src/lib.rs` re-exports at the root, by name, with the top-level
/// module each comes from: `pub use plan::{Planned, Policy};` gives
/// `Planned -> plan` and `Policy -> plan`; `pub use backend::cuda;` gives
/// `cuda -> backend`.
fn root_exports() -> BTreeMap<String, String> {
    let lib = code(&fs::read_to_string("src/lib.rs").unwrap());
    let mut exports = BTreeMap::new();
    let mut rest = lib.as_str();
    while let Some(i) = rest.find("pub use ") {
        rest = &rest[i + "pub use ".len()..];
        let end = rest.find(';').unwrap();
        let item = &rest[..end];
        rest = &rest[end..];
        let module = item.split("::").next().unwrap().trim().to_string();
        let names = match (item.find('{'), item.rfind('}')) {
            (Some(open), Some(close)) => item[open + 1..close].to_string(),
            _ => item.rsplit("::").next().unwrap().to_string(),
        };
        for name in names.split(',') {
            // `Name as Alias` is known by its alias.
            let name = name.split(" as ").last().unwrap().trim();
            if !name.is_empty() {
                exports.insert(name.to_string(), module.clone());
            }
        }
    }
    exports
}

/// The top-level module a source file belongs to (`backend/sim/ops.rs` ->
/// `backend`).
fn module_of(path: &Path) -> String {
    let rel = path.strip_prefix("src").unwrap();
    let first = rel.components().next().unwrap().as_os_str();
    first.to_string_lossy().trim_end_matches(".rs").to_string()
}

fn ident(rest: &str) -> String {
    rest.chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// The first name of every `crate::` path in `code`, the names of a
/// `crate::{..}` group each on its own.
fn imports(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let close = group.find('}').unwrap_or(group.len());
            for name in group[..close].split(',') {
                let name = ident(name.trim_start());
                if !name.is_empty() {
                    out.push(name);
                }
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                out.push(name);
            }
        }
    }
    out
}

/// The macros `src/` exports at the root, with the module defining each.
fn macros(files: &[(PathBuf, String)]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (path, code) in files {
        let mut rest = code.as_str();
        while let Some(i) = rest.find("macro_rules! ") {
            rest = &rest[i + "macro_rules! ".len()..];
            out.insert(ident(rest), module_of(path));
        }
    }
    out
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every module-to-module import: (importing file, its module, the module
/// imported, the name as written), and the names that resolve to no module.
#[allow(clippy::type_complexity)]
fn edges() -> (Vec<(String, String, String, String)>, Vec<String>) {
    let rank: BTreeSet<String> = layers().into_iter().collect();
    let exports = root_exports();
    let mut paths = Vec::new();
    sources(Path::new("src"), &mut paths);
    paths.sort();
    let files: Vec<(PathBuf, String)> = paths
        .into_iter()
        // The binaries are crates of their own.
        .filter(|p| !p.starts_with("src/bin"))
        .map(|p| {
            let code = code(&fs::read_to_string(&p).unwrap());
            (p, code)
        })
        .collect();
    let macros = macros(&files);
    let mut edges = Vec::new();
    let mut unresolved = Vec::new();
    for (path, code) in &files {
        let module = module_of(path);
        if !rank.contains(&module) {
            continue; // lib.rs itself
        }
        for name in imports(code) {
            let target = if rank.contains(&name) {
                name.clone()
            } else if let Some(m) = exports.get(&name).or_else(|| macros.get(&name)) {
                m.clone()
            } else {
                unresolved.push(format!("{}: crate::{name}", path.display()));
                continue;
            };
            if target != module {
                edges.push((path.display().to_string(), module.clone(), target, name));
            }
        }
    }
    unresolved.sort();
    unresolved.dedup();
    (edges, unresolved)
}

#[test]
fn every_crate_path_resolves_to_a_module() {
    let (_, unresolved) = edges();
    assert!(
        unresolved.is_empty(),
        "crate:: paths that name neither a module nor a root re-export: {unresolved:#?}"
    );
}

#[test]
fn the_root_re_exports_are_resolved() {
    let exports = root_exports();
    assert_eq!(exports["Planned"], "plan");
    assert_eq!(exports["Replayable"], "replay");
    assert_eq!(exports["cuda"], "backend");
    assert_eq!(exports["DType"], "vocab");
    assert_eq!(
        imports("use crate::{Planned, vocab::Key};\nlet e: crate::Error;"),
        ["Planned", "vocab", "Error"]
    );
}

#[test]
fn test_modules_and_comments_are_left_out_and_other_test_items_kept() {
    let source = "use crate::a; // crate::c\n#[cfg(test)]\nmod tests {\n    fn t() { \
                  let _ = (\"{ // \", '{', r#\"}\"#, '\\''); } // }\n    /* { */\n}\n\
                  #[cfg(test)]\nfn helper() { crate::b::x(); }\n/// [`crate::d`]\n\
                  mod m { use crate::e; }";
    assert_eq!(imports(&code(source)), ["a", "b", "e"]);
}

#[test]
fn modules_import_through_module_paths_not_the_root() {
    let rank: BTreeSet<String> = layers().into_iter().collect();
    let exports = root_exports();
    let mut files = Vec::new();
    sources(Path::new("src"), &mut files);
    let mut through_root = Vec::new();
    for file in files {
        if !rank.contains(&module_of(&file)) {
            continue; // lib.rs and the binaries
        }
        let code = code(&fs::read_to_string(&file).unwrap());
        // `$crate::Name` in an exported macro is the public path, as it must be.
        let code = code.replace("$crate::", "");
        for name in imports(&code) {
            if exports.contains_key(&name) && !rank.contains(&name) {
                through_root.push(format!("{}: crate::{name}", file.display()));
            }
        }
    }
    assert!(
        through_root.is_empty(),
        "name the module an item lives in (crate::plan::Planned, not crate::Planned): \
         {through_root:#?}"
    );
}

#[test]
fn no_module_imports_a_module_declared_after_it() {
    let layers = layers();
    let rank: BTreeMap<&str, usize> = layers
        .iter()
        .enumerate()
        .map(|(i, m)| (m.as_str(), i))
        .collect();
    let (edges, _) = edges();
    let mut upward: Vec<String> = edges
        .iter()
        .filter(|(_, from, to, _)| rank[to.as_str()] > rank[from.as_str()])
        .map(|(file, _, to, name)| format!("{file} imports {to} (crate::{name})"))
        .collect();
    upward.sort();
    upward.dedup();
    assert!(upward.is_empty(), "upward imports: {upward:#?}");
}

#[test]
fn the_module_graph_has_no_circle() {
    let (edges, _) = edges();
    let mut graph: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (_, from, to, _) in &edges {
        graph.entry(from).or_default().insert(to);
    }
    // Depth-first search; a module met again on the current path closes a
    // circle.
    fn visit<'m>(
        m: &'m str,
        graph: &BTreeMap<&'m str, BTreeSet<&'m str>>,
        path: &mut Vec<&'m str>,
        done: &mut BTreeSet<&'m str>,
    ) -> Option<Vec<&'m str>> {
        if let Some(at) = path.iter().position(|p| *p == m) {
            let mut circle = path[at..].to_vec();
            circle.push(m);
            return Some(circle);
        }
        if !done.insert(m) {
            return None;
        }
        path.push(m);
        for next in graph.get(m).into_iter().flatten() {
            if let Some(circle) = visit(next, graph, path, done) {
                return Some(circle);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    for m in graph.keys() {
        let circle = visit(m, &graph, &mut Vec::new(), &mut done);
        assert!(circle.is_none(), "import circle: {:?}", circle.unwrap());
    }
}

#[test]
fn the_phases_are_layered_in_lifecycle_order() {
    let layers = layers();
    let at = |m: &str| layers.iter().position(|l| l == m).unwrap();
    assert!(at("discover") < at("plan"));
    assert!(at("plan") < at("capture"));
    assert!(at("capture") < at("fence"));
    assert!(at("fence") < at("replay"));
    assert!(
        at("backend") < at("discover"),
        "backends know nothing of plans"
    );
    assert!(
        at("view") < at("scope") && at("scope") < at("backend"),
        "the scope registry knows views only; backends check views against it"
    );
}
