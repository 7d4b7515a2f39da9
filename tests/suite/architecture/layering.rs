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
//!
//! The same holds file by file: a file imports only files of earlier layers,
//! where the files of a directory module are layered in the order of its
//! root file's `mod` declarations (`backend/sim.rs`: `ops`, `clock`,
//! `hazards`, ...), and the file graph has no circle. There a path is
//! followed through every `use` and re-export to the file that defines
//! the item (`super::ViewExt` in `cuda/lend.rs` is `cuda/view_ext.rs`).
//! A module's root file and the files of its own subtree are left out of
//! each other's checks: the root declares its children and holds the state
//! they share (`sim::SimState`), so Rust makes that pair import each other.

use crate::support::rust_files;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The modules in `src/lib.rs`'s declaration order, public (`backend`) or
/// not; `guide`, the user pages, is no layer.
fn layers() -> Vec<String> {
    let lib = fs::read_to_string("src/lib.rs").unwrap();
    lib.lines()
        .filter_map(|l| {
            l.strip_prefix("mod ")
                .or_else(|| l.strip_prefix("pub mod "))
        })
        .map(|m| m.trim_end_matches(';').to_string())
        .filter(|m| m != "guide")
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

/// Every module-to-module import: (importing file, its module, the module
/// imported, the name as written), and the names that resolve to no module.
#[allow(clippy::type_complexity)]
fn edges() -> (Vec<(String, String, String, String)>, Vec<String>) {
    let rank: BTreeSet<String> = layers().into_iter().collect();
    let exports = root_exports();
    let paths = rust_files(Path::new("src"));
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
    let files = rust_files(Path::new("src"));
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
    let circle = first_circle(&graph);
    assert!(circle.is_none(), "import circle: {:?}", circle.unwrap());
}

/// A circle of `graph` (a node, the nodes it leads to, back to it), if it
/// has one: a depth-first search from each node in order, where a node met
/// again on the current path closes a circle.
fn first_circle<N: Ord + Clone>(graph: &BTreeMap<N, BTreeSet<N>>) -> Option<Vec<N>> {
    fn visit<N: Ord + Clone>(
        m: &N,
        graph: &BTreeMap<N, BTreeSet<N>>,
        path: &mut Vec<N>,
        done: &mut BTreeSet<N>,
    ) -> Option<Vec<N>> {
        if let Some(at) = path.iter().position(|p| p == m) {
            let mut circle = path[at..].to_vec();
            circle.push(m.clone());
            return Some(circle);
        }
        if !done.insert(m.clone()) {
            return None;
        }
        path.push(m.clone());
        for next in graph.get(m).into_iter().flatten() {
            if let Some(circle) = visit(next, graph, path, done) {
                return Some(circle);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|m| visit(m, graph, &mut Vec::new(), &mut done))
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

// ---------------------------------------------------------------------------
// File level.
// ---------------------------------------------------------------------------

/// The module path of a source file: `src/backend/sim/streams.rs` ->
/// `[backend, sim, streams]`, `src/backend.rs` -> `[backend]`,
/// `src/lib.rs` -> `[]`.
fn module_path(file: &Path) -> Vec<String> {
    let rel = file.strip_prefix("src").unwrap().with_extension("");
    let mut path: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().to_string())
        .collect();
    if matches!(path.last().map(String::as_str), Some("mod" | "lib")) {
        path.pop();
    }
    path
}

/// A `use` declaration's names: (the name it binds, the path it names).
/// `use super::{a::b, c as d};` gives `b -> super::a::b` and
/// `d -> super::c`; `{self, ..}` binds the group's module; globs bind
/// nothing.
fn use_tree(prefix: &[String], tree: &str, out: &mut Vec<(String, Vec<String>)>) {
    let tree = tree.trim();
    if let Some(open) = top_level(tree, '{') {
        let mut prefix = prefix.to_vec();
        prefix.extend(segments(tree[..open].trim_end_matches("::")));
        let inner = &tree[open + 1..closing_brace(tree, open) - 1];
        for item in split_top_level(inner) {
            use_tree(&prefix, item, out);
        }
        return;
    }
    let (path, alias) = match tree.split_once(" as ") {
        Some((path, alias)) => (path, Some(alias.trim().to_string())),
        None => (tree, None),
    };
    let mut full = prefix.to_vec();
    for s in segments(path) {
        if s != "self" || full.is_empty() {
            full.push(s);
        }
    }
    if full.last().is_none_or(|s| s == "*") || path.trim().is_empty() {
        return;
    }
    let name = alias.unwrap_or_else(|| full.last().unwrap().clone());
    out.push((name, full));
}

fn segments(path: &str) -> Vec<String> {
    path.split("::")
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// The index of the first `c` outside braces.
fn top_level(text: &str, c: char) -> Option<usize> {
    let mut depth = 0usize;
    for (i, ch) in text.char_indices() {
        match ch {
            _ if ch == c && depth == 0 => return Some(i),
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    None
}

fn split_top_level(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, ch) in text.char_indices() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&text[start..]);
    out.into_iter().filter(|s| !s.trim().is_empty()).collect()
}

fn is_ident_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// `code`'s `use` declarations (as [`use_tree`] reads them) and the code
/// with them blanked out.
fn uses(code: &str) -> (Vec<(String, Vec<String>)>, String) {
    let mut out = Vec::new();
    let mut rest_code = String::with_capacity(code.len());
    let b = code.as_bytes();
    let mut k = 0;
    let mut copied = 0;
    while let Some(i) = code[k..].find("use ") {
        let at = k + i;
        k = at + 4;
        // A declaration starts an item: after `;`, a brace, an attribute or
        // a visibility (not `use` in a string or a comment's prose).
        let before = code[..at].trim_end();
        let before = before
            .strip_suffix("pub")
            .or_else(|| {
                let v = before.strip_suffix(')')?;
                Some(&v[..v.rfind("pub(")?])
            })
            .unwrap_or(before)
            .trim_end();
        let item_start = before.is_empty() || before.ends_with([';', '{', '}', ']']);
        if (at > 0 && is_ident_byte(b[at - 1])) || !item_start {
            continue;
        }
        let Some(end) = code[k..].find(';').map(|e| k + e) else {
            break;
        };
        use_tree(&[], &code[k..end], &mut out);
        rest_code.push_str(&code[copied..at]);
        copied = end + 1;
        k = end + 1;
    }
    rest_code.push_str(&code[copied..]);
    (out, rest_code)
}

/// Every path in `code` (use declarations left out) that starts with
/// `crate::`, `$crate::`, `super::` or `self::`, or with one of `children`
/// (a module file's own child modules), as segments.
fn code_paths(code: &str, children: &BTreeSet<String>) -> Vec<Vec<String>> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut k = 0;
    while k < b.len() {
        let starts_word = k == 0 || !(is_ident_byte(b[k - 1]) || b[k - 1] == b':');
        if !starts_word || !(is_ident_byte(b[k]) || b[k] == b'$') {
            k += 1;
            continue;
        }
        let mut segs = Vec::new();
        let mut j = k;
        loop {
            let from = j;
            if b.get(j) == Some(&b'$') {
                j += 1;
            }
            while j < b.len() && is_ident_byte(b[j]) {
                j += 1;
            }
            segs.push(code[from..j].to_string());
            if code[j..].starts_with("::") && b.get(j + 2).is_some_and(|c| is_ident_byte(*c)) {
                j += 2;
            } else {
                break;
            }
        }
        let head = segs[0].as_str();
        if segs.len() > 1
            && (matches!(head, "crate" | "$crate" | "super" | "self") || children.contains(head))
        {
            out.push(segs);
        }
        k = j.max(k + 1);
    }
    out
}

/// Every source file of the library (not the binaries, which are crates of
/// their own), with its code ([`code`]).
fn library_files() -> BTreeMap<Vec<String>, (PathBuf, String)> {
    rust_files(Path::new("src"))
        .into_iter()
        .filter(|p| !p.starts_with("src/bin"))
        .map(|p| {
            let code = code(&fs::read_to_string(&p).unwrap());
            let code = inline_modules_flattened(&strings_blanked(&code));
            (module_path(&p), (p, code))
        })
        .collect()
}

/// `code` with the text of its string and character literals blanked (a
/// path in a message, `"sim::Device"`, is no import).
fn strings_blanked(code: &str) -> String {
    let b = code.as_bytes();
    let mut out = b.to_vec();
    let mut k = 0;
    while k < b.len() {
        let (from, to) = match b[k] {
            b'r' if raw_string_at(b, k).is_some() => {
                let hashes = raw_string_at(b, k).unwrap();
                let close = format!("\"{}", "#".repeat(hashes));
                let from = k + 2 + hashes;
                (
                    from,
                    code[from..].find(&close).map_or(b.len(), |i| from + i),
                )
            }
            b'"' => {
                let mut j = k + 1;
                while j < b.len() && b[j] != b'"' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                (k + 1, j.min(b.len()))
            }
            b'\'' if b.get(k + 2) == Some(&b'\'') => (k + 1, k + 2),
            _ => {
                k += 1;
                continue;
            }
        };
        for c in &mut out[from..to] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
        k = to + 1;
    }
    String::from_utf8(out).unwrap_or_else(|_| code.to_string())
}

/// `code` with `super::` inside its inline modules (`mod names { .. }`)
/// written `self::`: the file's own items, as seen from the file.
fn inline_modules_flattened(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(i) = rest.find("mod ") {
        let after = &rest[i + 4..];
        let name_len = ident(after).len();
        let header = after[name_len..].trim_start();
        let inline = (i == 0 || !is_ident_byte(rest.as_bytes()[i - 1]))
            && name_len > 0
            && header.starts_with('{');
        if !inline {
            out.push_str(&rest[..i + 4]);
            rest = after;
            continue;
        }
        let open = i + 4 + name_len + (after[name_len..].len() - header.len());
        let close = closing_brace(rest, open);
        out.push_str(&rest[..open]);
        out.push_str(&rest[open..close].replace("super::", "self::"));
        rest = &rest[close..];
    }
    out.push_str(rest);
    out
}

/// The files of `src/` and what each names of the others.
struct Files {
    files: BTreeMap<Vec<String>, (PathBuf, String)>,
    uses: BTreeMap<Vec<String>, BTreeMap<String, Vec<String>>>,
    macros: BTreeMap<String, Vec<String>>,
}

impl Files {
    fn read() -> Files {
        let files = library_files();
        let mut uses_of = BTreeMap::new();
        let mut macros = BTreeMap::new();
        for (module, (_, code)) in &files {
            let (decls, _) = uses(code);
            uses_of.insert(module.clone(), decls.into_iter().collect());
            let mut rest = code.as_str();
            while let Some(i) = rest.find("macro_rules! ") {
                rest = &rest[i + "macro_rules! ".len()..];
                macros.insert(ident(rest), module.clone());
            }
        }
        Files {
            files,
            uses: uses_of,
            macros,
        }
    }

    fn children(&self, module: &[String]) -> BTreeSet<String> {
        self.files
            .keys()
            .filter(|m| m.len() == module.len() + 1 && m.starts_with(module))
            .map(|m| m.last().unwrap().clone())
            .collect()
    }

    /// The file (as its module path) that defines what `path`, written in
    /// `from`'s file, names; `None` for another crate's item. A name a file
    /// brings in with `use` (or re-exports) is followed to where it is
    /// defined.
    fn resolve(&self, from: &[String], path: &[String], depth: usize) -> Option<Vec<String>> {
        assert!(depth < 32, "use declarations loop at {from:?}: {path:?}");
        let mut module = from.to_vec();
        let mut rest = path;
        match path.first().map(String::as_str) {
            Some("crate" | "$crate") => {
                module.clear();
                rest = &path[1..];
            }
            Some("self") => rest = &path[1..],
            Some("super") => {
                while rest.first().is_some_and(|s| s == "super") {
                    module.pop();
                    rest = &rest[1..];
                }
            }
            _ => {}
        }
        for (i, seg) in rest.iter().enumerate() {
            let mut child = module.clone();
            child.push(seg.clone());
            if self.files.contains_key(&child) {
                module = child;
                continue;
            }
            let bound = self.uses[&module]
                .get(seg)
                .filter(|t| !(t.len() == 2 && t[0] == "self" && t[1] == *seg));
            if let Some(target) = bound {
                // `use x::y` at a module's first segment names a crate.
                let external = !matches!(target[0].as_str(), "crate" | "$crate" | "super" | "self")
                    && !self
                        .files
                        .contains_key(&[module.clone(), vec![target[0].clone()]].concat());
                if external {
                    return None;
                }
                let mut next = target.clone();
                next.extend(rest[i + 1..].iter().cloned());
                return self.resolve(&module, &next, depth + 1);
            }
            if module.is_empty() && i == rest.len() - 1 {
                if let Some(m) = self.macros.get(seg) {
                    return Some(m.clone());
                }
            }
            return Some(module);
        }
        Some(module)
    }

    /// Every import from one file to another: (importing file, imported
    /// file), as module paths.
    fn edges(&self) -> BTreeSet<(Vec<String>, Vec<String>)> {
        let mut edges = BTreeSet::new();
        for (module, (_, code)) in &self.files {
            let (decls, rest) = uses(code);
            let children = self.children(module);
            let mut paths: Vec<Vec<String>> = decls.into_iter().map(|(_, p)| p).collect();
            paths.extend(code_paths(&rest, &children));
            for path in paths {
                let head = path[0].as_str();
                let local = matches!(head, "crate" | "$crate" | "super" | "self")
                    || children.contains(head);
                if !local {
                    continue;
                }
                if let Some(target) = self.resolve(module, &path, 0) {
                    if &target != module {
                        edges.insert((module.clone(), target));
                    }
                }
            }
        }
        edges
    }

    /// Where a file sits in the layers: at each level of its module path,
    /// the place of that module among its parent's `mod` declarations
    /// (`src/lib.rs`'s order at the top).
    fn layer_key(&self, module: &[String]) -> Vec<usize> {
        (1..=module.len())
            .map(|n| {
                let parent = &module[..n - 1];
                let order = declared_modules(&self.files[parent].1);
                order
                    .iter()
                    .position(|m| *m == module[n - 1])
                    .unwrap_or_else(|| panic!("{:?} is not declared in its parent", &module[..n]))
            })
            .collect()
    }
}

/// The `mod name;` declarations of a file's code, in order.
fn declared_modules(code: &str) -> Vec<String> {
    code.lines()
        .map(str::trim)
        .filter_map(|l| {
            l.strip_prefix("pub mod ")
                .or_else(|| l.strip_prefix("pub(crate) mod "))
                .or_else(|| l.strip_prefix("mod "))
        })
        .filter_map(|l| l.strip_suffix(';'))
        .map(str::to_string)
        .collect()
}

fn file_name(files: &Files, module: &[String]) -> String {
    files.files[module].0.display().to_string()
}

/// Whether `a` is the root file of a module that holds `b` (or the other
/// way round): `backend/sim.rs` and `backend/sim/streams.rs`. A module's
/// root file declares its children and may hold the state they share, so
/// the two import each other by Rust's design; those edges are the module
/// tree, not layers.
fn related(a: &[String], b: &[String]) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

#[test]
fn files_resolve_paths_through_their_use_declarations() {
    let files = Files::read();
    let at = |m: &[&str]| m.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        files.resolve(
            &at(&["backend", "sim", "device"]),
            &at(&["super", "SimState"]),
            0
        ),
        Some(at(&["backend", "sim"]))
    );
    assert_eq!(
        files.resolve(&at(&["replay"]), &at(&["crate", "plan", "Planned"]), 0),
        Some(at(&["plan"]))
    );
    // Through the root re-exports to the defining file.
    assert_eq!(
        files.resolve(&at(&["step"]), &at(&["crate", "sim", "Hazard"]), 0),
        Some(at(&["backend", "sim", "hazards"]))
    );
    let mut out = Vec::new();
    use_tree(&[], "super::{a::{b, c as d}, self, e}", &mut out);
    assert_eq!(
        out,
        [
            ("b".to_string(), at(&["super", "a", "b"])),
            ("d".to_string(), at(&["super", "a", "c"])),
            ("super".to_string(), at(&["super"])),
            ("e".to_string(), at(&["super", "e"])),
        ]
    );
    let children = BTreeSet::from(["ops".to_string(), "sim".to_string()]);
    // A path in a message is no import.
    let message = strings_blanked(r#"note = "use `sim::Device`"; let c = '"'; sim::x();"#);
    assert_eq!(code_paths(&message, &children), [at(&["sim", "x"])]);
    assert_eq!(
        code_paths(
            "let x = super::a::B::new(ops::Op::Fill, y::z, $crate::E);",
            &children
        ),
        [
            at(&["super", "a", "B", "new"]),
            at(&["ops", "Op", "Fill"]),
            at(&["$crate", "E"])
        ]
    );
}

#[test]
fn no_file_imports_a_file_of_a_later_layer() {
    let files = Files::read();
    let mut upward = Vec::new();
    for (from, to) in files.edges() {
        if related(&from, &to) {
            continue;
        }
        let (a, b) = (files.layer_key(&from), files.layer_key(&to));
        let split = a.iter().zip(&b).position(|(x, y)| x != y).unwrap();
        if b[split] > a[split] {
            upward.push(format!(
                "{} imports {}",
                file_name(&files, &from),
                file_name(&files, &to)
            ));
        }
    }
    assert!(
        upward.is_empty(),
        "imports up the layers (a module's files are layered in its `mod` order): {upward:#?}"
    );
}

#[test]
fn the_file_graph_has_no_circle() {
    let files = Files::read();
    let mut graph: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (from, to) in files.edges() {
        if !related(&from, &to) {
            graph.entry(from).or_default().insert(to);
        }
    }
    if let Some(circle) = first_circle(&graph) {
        let names: Vec<String> = circle.iter().map(|m| file_name(&files, m)).collect();
        panic!("import circle between files: {}", names.join(" -> "));
    }
}

/// The foreign libraries and the one file (the result layer) that calls
/// each one's entry points: (the prefix of its entry points' names, the
/// library, its result layer). Longer prefixes first (`cublas` before
/// `cu`).
const RESULT_LAYERS: [(&str, &str, &str); 3] = [
    ("cublas", "cuBLAS", "src/backend/cublas/result.rs"),
    ("nccl", "NCCL", "src/backend/nccl/result.rs"),
    ("cu", "the CUDA driver", "src/backend/cuda/result.rs"),
];

/// The prefix (of [`RESULT_LAYERS`]) of the library `name` is an entry
/// point of: its prefix and then a capital (`cuGraphLaunch`,
/// `ncclAllGather`, `cublasSetStream_v2`). Types (`CUgraph`,
/// `ncclComm_t`, `cublasHandle_t`, `cudaStream_t`) and the crate's own
/// snake_case names are none.
fn entry_point_of(name: &str) -> Option<&'static str> {
    if name.ends_with("_t") {
        return None;
    }
    RESULT_LAYERS
        .iter()
        .map(|(prefix, _, _)| *prefix)
        .find(|prefix| {
            name.strip_prefix(prefix)
                .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_uppercase()))
        })
}

/// The foreign entry points `source` calls, names or looks up: (line,
/// the library's prefix, or `culib` for cudarc's raw library handle, and
/// what was written). Found:
///
/// - an entry point through a bindings module, `sys::cuGraphLaunch` or
///   `nc::ncclCommDestroy` (the file's aliases of cudarc's `sys` modules:
///   `use cudarc::nccl::sys as nc;`), called or not;
/// - an entry point called by its bare name (imported by name or by glob:
///   `ncclCommDestroy(comm)`);
/// - an entry point looked up by name (`lib.get(b"cuGraphAddNode_v2")`);
/// - cudarc's raw library handle (`sys::culib()`), which calls anything.
///
/// Comments and the text of string literals are not code (an error's
/// `op: "ncclCommInitRank"` names a call, it does not make one); looking
/// up a name held in a variable (`missing_symbols` checking that a library
/// exports it) calls nothing.
fn foreign_calls(source: &str) -> Vec<(usize, &'static str, String)> {
    let blanked = strings_blanked(source);
    let lines: Vec<&str> = blanked
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect();
    let mut aliases = BTreeSet::from(["sys".to_string()]);
    for line in &lines {
        for (i, _) in line.match_indices("sys as ") {
            aliases.insert(ident(&line[i + "sys as ".len()..]));
        }
    }
    let mut out = Vec::new();
    for (n, (code, raw)) in lines.iter().zip(source.lines()).enumerate() {
        let b = code.as_bytes();
        let mut k = 0;
        while k < b.len() {
            if !is_ident_byte(b[k]) || (k > 0 && is_ident_byte(b[k - 1])) {
                k += 1;
                continue;
            }
            let name = ident(&code[k..]);
            let before = &code[..k];
            let after = code[k + name.len()..].trim_start();
            let through_bindings = before.strip_suffix("::").is_some_and(|path| {
                let tail =
                    path.len() - path.bytes().rev().take_while(|c| is_ident_byte(*c)).count();
                aliases.contains(&path[tail..])
            });
            let called = after.starts_with('(') && !before.trim_end().ends_with("fn");
            if let Some(prefix) = entry_point_of(&name) {
                if through_bindings || called {
                    out.push((n + 1, prefix, name.clone()));
                }
            } else if name == "culib" && called {
                out.push((n + 1, "culib", name.clone()));
            }
            k += name.len();
        }
        let raw = raw.split("//").next().unwrap_or("");
        for (i, _) in raw.match_indices("b\"") {
            let name = ident(&raw[i + 2..]);
            if let Some(prefix) = entry_point_of(&name) {
                out.push((n + 1, prefix, format!("b\"{name}\"")));
            }
        }
    }
    out
}

#[test]
fn foreign_calls_are_found_however_the_library_is_named() {
    let found = |source: &str| -> Vec<(usize, &str, String)> { foreign_calls(source) };
    let at = |n, prefix, what: &str| (n, prefix, what.to_string());
    let sample = "use cudarc::nccl::sys as nc;\n\
                  use cudarc::cublas::sys as blas;\n\
                  unsafe { nc::ncclCommDestroy(comm) };\n\
                  let s = unsafe { blas::cublasSetStream_v2(h, s) };\n\
                  cudarc::driver::sys::cuGraphLaunch(\n\
                  let f = sys::cuInit; // a pointer to it is as raw\n\
                  ncclMemFree(ptr); // imported by name\n\
                  let f = lib.get(b\"cuGraphAddNode_v2\");\n\
                  let lib = sys::culib();";
    assert_eq!(
        found(sample),
        [
            at(3, "nccl", "ncclCommDestroy"),
            at(4, "cublas", "cublasSetStream_v2"),
            at(5, "cu", "cuGraphLaunch"),
            at(6, "cu", "cuInit"),
            at(7, "nccl", "ncclMemFree"),
            at(8, "cu", "b\"cuGraphAddNode_v2\""),
            at(9, "culib", "culib"),
        ]
    );
    // Types, enum values, the wrappers, messages and comments call nothing.
    let clean = "use cudarc::nccl::sys as nc;\n\
                 fn raw(&self) -> nc::ncclComm_t { self.comm }\n\
                 let ok = code == nc::ncclResult_t::ncclSuccess;\n\
                 let s: blas::cudaStream_t = sys::CUstream_st::default();\n\
                 let comm = result::comm::init_rank(size, &id, rank)?;\n\
                 Err(Refused { op: \"ncclCommInitRank\", reason })\n\
                 // sys::cuGraphLaunch(exec, stream)\n\
                 const REQUIRED: [&str; 1] = [\"ncclGetUniqueId\"];\n\
                 lib.get::<unsafe extern \"C\" fn()>(name.as_bytes())";
    assert_eq!(found(clean), []);
}

#[test]
fn only_the_result_layers_call_foreign_libraries() {
    let files = rust_files(Path::new("src"));
    for (_, _, layer) in RESULT_LAYERS {
        assert!(files.contains(&PathBuf::from(layer)), "{layer} is gone");
    }
    let mut raw = Vec::new();
    for file in files {
        // Test modules too: a raw call is a raw call wherever it is.
        let source = fs::read_to_string(&file).unwrap();
        for (n, prefix, what) in foreign_calls(&source) {
            let home = RESULT_LAYERS.iter().find(|(p, _, _)| *p == prefix);
            if home.is_some_and(|(_, _, layer)| file == Path::new(layer)) {
                continue;
            }
            let wanted = match home {
                Some((_, library, layer)) => format!("raw {library}: wrap it in {layer}"),
                None => "cudarc's raw library handle: look entry points up in a result layer"
                    .to_string(),
            };
            raw.push(format!("{}:{n}: {what} ({wanted})", file.display()));
        }
    }
    assert!(
        raw.is_empty(),
        "foreign entry points called outside their result layer: {raw:#?}"
    );
}

/// A module with files of its own is `foo.rs` beside `foo/`, never
/// `foo/mod.rs`: one spelling for every module file.
#[test]
fn module_roots_sit_beside_their_directories() {
    let paths = rust_files(Path::new("src"));
    let roots: Vec<_> = paths.iter().filter(|p| p.ends_with("mod.rs")).collect();
    assert!(roots.is_empty(), "mod.rs files in src/: {roots:?}");
}
