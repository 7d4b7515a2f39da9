//! The programs the user pages show (README.md and docs/*.md) and the
//! examples, read as a newcomer runs them: a snippet that touches CUDA asks
//! the probe first (cudarc panics where libcuda is missing; the probe
//! returns an error), a `main` prints errors with `Display` (a `main` that
//! returns a `Result` prints its error with `Debug`), `sim.launch`'s last
//! argument is explained where a page first uses it, and every list of the
//! fence's counters names them all.

use std::fs;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every docs/*.md, with their text.
fn pages() -> Vec<(String, String)> {
    let mut names = vec!["README.md".to_string()];
    let mut docs: Vec<String> = fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .map(|p| format!("docs/{}", p.file_name().unwrap().to_string_lossy()))
        .collect();
    docs.sort();
    names.extend(docs);
    names
        .into_iter()
        .map(|n| {
            let text = fs::read_to_string(root().join(&n)).unwrap();
            (n, text)
        })
        .collect()
}

/// The Rust snippets of a page: (first line number, code).
fn snippets(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (n, line) in text.lines().enumerate() {
        let fence = line.trim_start().starts_with("```");
        match (&mut current, fence) {
            (None, true) if line.trim_start()[3..].starts_with("rust") => {
                current = Some((n + 2, String::new()));
            }
            (Some(_), true) => out.extend(current.take()),
            (Some((_, code)), false) => {
                code.push_str(line);
                code.push('\n');
            }
            _ => {}
        }
    }
    out
}

/// Calls that reach cudarc's driver without a check of their own: cudarc
/// panics inside them where libcuda is missing.
const UNCHECKED_CUDA: [&str; 2] = ["CudaContext::new(", "compile_ptx("];

/// Calls that need a GPU to succeed (they return an error without one).
const NEEDS_GPU: [&str; 3] = ["cuda::Device::new(", "Communicator::new(", "UniqueId::new("];

#[test]
fn every_snippet_that_creates_a_cuda_context_asks_the_probe_first() {
    let mut problems = Vec::new();
    for (page, text) in pages() {
        for (line, code) in snippets(&text) {
            let probe = code.find("probe(").or_else(|| code.find("probe_device("));
            for call in UNCHECKED_CUDA.iter().chain(&NEEDS_GPU) {
                if let Some(at) = code.find(call) {
                    if probe.is_none_or(|p| p > at) {
                        problems.push(format!(
                            "{page}:{line}: `{call}` before `cuda::probe()` (or `probe_device`)"
                        ));
                    }
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// `fn main() -> ..` in `code`, with what it returns.
fn main_returns(code: &str) -> Option<String> {
    let at = code.find("fn main()")?;
    let rest = &code[at + "fn main()".len()..];
    let head = &rest[..rest.find('{')?];
    Some(head.trim().trim_start_matches("->").trim().to_string())
}

#[test]
fn programs_print_errors_with_display() {
    let mut problems = Vec::new();
    let mut programs: Vec<(String, String)> = Vec::new();
    for (page, text) in pages() {
        for (line, code) in snippets(&text) {
            programs.push((format!("{page}:{line}"), code));
        }
    }
    for example in ["examples/quickstart.rs", "examples/tp_backward/main.rs"] {
        programs.push((
            example.to_string(),
            fs::read_to_string(root().join(example)).unwrap(),
        ));
    }
    for (at, code) in programs {
        match main_returns(&code) {
            // Returning a `Result` from `main` prints its error with `Debug`.
            Some(ret) if ret.contains("Result") || ret.starts_with("R<") => problems.push(format!(
                "{at}: `fn main() -> {ret}` prints an error with Debug; report it with `{{}}`"
            )),
            _ => {}
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn a_pages_first_sim_launch_says_what_its_last_argument_is() {
    let mut problems = Vec::new();
    for (page, text) in pages() {
        let Some(first) = text.find("sim::Kernel::") else {
            continue;
        };
        // The comment explaining it is on the lines just before.
        let before = &text[..first];
        let start = before.rmatch_indices('\n').nth(2).map_or(0, |(i, _)| i);
        if !text[start..first].contains("ticks") {
            problems.push(format!(
                "{page}: its first sim op's duration is not explained (\"ticks\")"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The fields of `FenceStats`, from its definition.
fn fence_stats_fields() -> Vec<String> {
    let source = fs::read_to_string(root().join("src/fence/error.rs")).unwrap();
    let start = source.find("pub struct FenceStats {").unwrap();
    let body = &source[start..start + source[start..].find("\n}").unwrap()];
    body.lines()
        .filter_map(|l| l.trim().strip_prefix("pub "))
        .filter_map(|l| l.split_once(':').map(|(name, _)| name.to_string()))
        .filter(|n| !n.starts_with("struct"))
        .collect()
}

#[test]
fn every_list_of_fence_counters_names_them_all() {
    let fields = fence_stats_fields();
    assert!(fields.len() >= 6, "{fields:?}");
    let mut problems = Vec::new();
    for (page, text) in pages() {
        // A paragraph that names two counters lists them.
        for paragraph in text.split("\n\n") {
            let named: Vec<&String> = fields
                .iter()
                .filter(|f| paragraph.contains(&format!("`{f}`")))
                .collect();
            if named.len() >= 2 && named.len() < fields.len() {
                let missing: Vec<&String> = fields.iter().filter(|f| !named.contains(f)).collect();
                problems.push(format!(
                    "{page}: a list of FenceStats fields leaves out {missing:?}:\n{paragraph}"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_checks_find_what_they_are_for() {
    assert_eq!(
        main_returns("fn main() -> replay_arena::Result<()> {"),
        Some("replay_arena::Result<()>".into())
    );
    assert_eq!(main_returns("fn main() {"), Some(String::new()));
    let page = "text\n```rust,no_run\nlet x = 1;\n```\nmore\n```text\nno\n```\n";
    assert_eq!(snippets(page), [(3, "let x = 1;\n".to_string())]);
    assert!(fence_stats_fields().contains(&"step_launches".to_string()));
}
