//! The layering of `src/`: each module imports only modules declared before
//! it in `src/lib.rs` (lowest first), so the phases read one way: vocabulary,
//! views, the scope registry and backends at the bottom, then discovery,
//! planning, capture, the fence and replay, with the crate error and
//! `BufferSource` on top.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

/// The modules in `src/lib.rs`'s declaration order.
fn layers() -> Vec<String> {
    let lib = fs::read_to_string("src/lib.rs").unwrap();
    lib.lines()
        .filter_map(|l| l.strip_prefix("mod "))
        .map(|m| m.trim_end_matches(';').to_string())
        .collect()
}

/// The top-level module a source file belongs to (`backend/sim.rs` ->
/// `backend`).
fn module_of(path: &Path) -> String {
    let rel = path.strip_prefix("src").unwrap();
    let first = rel.components().next().unwrap().as_os_str();
    first.to_string_lossy().trim_end_matches(".rs").to_string()
}

/// Every `crate::<module>` named in code (not comments) of the file, outside
/// its `#[cfg(test)]` module.
fn imports(source: &str) -> Vec<String> {
    let code = source.split("#[cfg(test)]").next().unwrap_or(source);
    let mut out = Vec::new();
    for line in code.lines() {
        let line = line.split("//").next().unwrap_or("");
        let mut rest = line;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() && name.chars().next().unwrap().is_lowercase() {
                out.push(name);
            }
        }
    }
    out
}

fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_module_imports_a_module_declared_after_it() {
    let layers = layers();
    let rank: BTreeMap<&str, usize> = layers
        .iter()
        .enumerate()
        .map(|(i, m)| (m.as_str(), i))
        .collect();
    let mut files = Vec::new();
    sources(Path::new("src"), &mut files);
    let mut upward = Vec::new();
    for file in files {
        let module = module_of(&file);
        let Some(&own) = rank.get(module.as_str()) else {
            continue; // lib.rs itself
        };
        let source = fs::read_to_string(&file).unwrap();
        for import in imports(&source) {
            let Some(&theirs) = rank.get(import.as_str()) else {
                continue;
            };
            if theirs > own {
                upward.push(format!("{} imports {import}", file.display()));
            }
        }
    }
    upward.sort();
    upward.dedup();
    assert!(upward.is_empty(), "upward imports: {upward:#?}");
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
