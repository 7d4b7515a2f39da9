//! The quickstart (examples/quickstart.rs, compiled here as a module) follows
//! the docs' schedule advice, and what it prints explains its own counts:
//! every number in its explanation is one the run counted, and the sums it
//! states hold.

#[allow(dead_code)]
#[path = "../../../examples/quickstart.rs"]
mod example;

use replay_arena::{sim, FenceStats};

/// The quickstart on `sim`: what it printed, paragraph by paragraph, and its
/// outcome.
fn run_on_sim() -> (Vec<String>, example::Outcome) {
    let mut printed = Vec::new();
    let sim = sim::Device::new();
    let outcome = example::run(&sim, &mut |p| printed.push(p)).unwrap();
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    (printed, outcome)
}

/// The numbers in `text`, in order (digits only; "G = 2" gives 2).
fn numbers(text: &str) -> Vec<u64> {
    text.split(|c: char| !c.is_ascii_digit())
        .filter(|w| !w.is_empty())
        .map(|w| w.parse().unwrap())
        .collect()
}

#[test]
fn the_quickstart_puts_each_runner_on_its_generations_stream() {
    let (_, outcome) = run_on_sim();
    let s = outcome.stats;
    let fenced = outcome.runners_using * outcome.steps;
    // Every runner is replayed and consumed once per step, the one that
    // requests nothing included.
    let runners = s.replays / outcome.steps;
    assert_eq!(s.consumers, runners * outcome.steps, "{s}");
    // One wait per consumer of a buffer-using runner and one per
    // buffer-using replay after the first G: no replay waited for the
    // runner whose bytes it reuses.
    assert_eq!(s.waits, fenced + fenced - outcome.generations, "{s}");
}

#[test]
fn the_quickstarts_explanation_states_its_own_counts() {
    let (printed, outcome) = run_on_sim();
    let s = outcome.stats;
    let counts = printed
        .iter()
        .find(|p| p.contains("waits on another stream"))
        .expect("a line of counts");
    assert_eq!(
        numbers(counts),
        [s.replays, s.consumers, s.waits, s.waits_skipped],
        "{counts}"
    );
    // The skipped waits are besides the waits, not among them.
    assert!(counts.contains("more skipped"), "{counts}");
    let explanation = printed
        .iter()
        .find(|p| p.starts_with("What this shows"))
        .expect("an explanation");
    let fenced = outcome.runners_using * outcome.steps;
    // Every number it states is a count of the run, or one derived from
    // them, and each sum it states holds.
    let replay_waits = fenced - outcome.generations;
    assert_eq!(
        numbers(explanation),
        [
            s.replays,
            s.replays - fenced,
            fenced,
            s.consumers,
            s.consumers - fenced,
            s.waits,
            fenced,
            outcome.generations,
            replay_waits,
            s.waits_skipped
        ],
        "{explanation}"
    );
    assert_eq!(s.replays - fenced, s.consumers - fenced, "{explanation}");
    assert_eq!(s.waits, fenced + replay_waits, "{explanation}");
    assert!(
        explanation.contains("one per consumer of a runner with buffers"),
        "{explanation}"
    );
    assert!(explanation.contains("not among those"), "{explanation}");
}

/// The step graph's and the trace's counts are explained by numbers that
/// add up: child graphs are the schedule's replays and consumers, slices
/// the traced per-runner steps' replays and consumers, the one wait a step
/// graph's first launch begins with, and the launches.
#[test]
fn the_quickstarts_step_graph_and_trace_counts_add_up() {
    let (printed, outcome) = run_on_sim();
    let runners = outcome.stats.replays / outcome.steps;
    let step = printed
        .iter()
        .find(|p| p.starts_with("step graph:"))
        .expect("a step graph paragraph");
    let n = numbers(step);
    // nodes, replays, consumers, edges, steps
    assert_eq!(n.len(), 5, "{step}");
    assert_eq!(n[0], n[1] + n[2], "{step}");
    assert_eq!(
        [n[1], n[2], n[4]],
        [runners, runners, outcome.steps],
        "{step}"
    );
    let trace = printed
        .iter()
        .find(|p| p.starts_with("trace of"))
        .expect("a trace paragraph");
    // Up to the path the trace is written to (its digits are the machine's).
    let text = &trace[..trace.find("written to").unwrap()];
    let n = numbers(text);
    // 2 steps, launches, slices, streams, replays, consumers, 2 steps,
    // waits, launches, arrows, skipped
    assert_eq!(n.len(), 11, "{text}");
    assert_eq!(n[2], n[4] + n[5] + n[7] + n[8], "{text}");
    assert_eq!([n[0], n[6]], [2, 2], "{text}");
    assert_eq!([n[4], n[5]], [2 * runners, 2 * runners], "{text}");
    assert_eq!([n[1], n[8]], [outcome.steps, outcome.steps], "{text}");
    assert_eq!(n[7], 1, "{text}");
}

#[test]
fn an_explanation_of_a_schedule_that_ignores_the_generations_says_so() {
    let mut stats = FenceStats::default();
    stats.replays = 1000;
    stats.consumers = 1000;
    stats.waits = 2001;
    stats.waits_skipped = 403;
    let text = example::explain(&example::Outcome {
        stats,
        generations: 2,
        runners_using: 4,
        steps: 200,
    });
    // 800 consumers + 798 replays after the first two: 403 more.
    assert!(text.contains("2001 waits are 403 more"), "{text}");
    assert!(
        !text.contains("one per consumer of a runner with buffers (800, each"),
        "{text}"
    );
}

/// What `cargo run --example quickstart` (README's first command) prints,
/// the backend lines included, fits 100 columns: every line but the trace
/// file's path, which is the machine's and printed on a line of its own.
#[test]
fn the_quickstarts_lines_fit_100_columns() {
    let mut printed = Vec::new();
    example::quickstart(&mut |p| printed.push(p)).unwrap();
    let path = std::env::temp_dir();
    let path = path.display().to_string();
    assert!(
        printed.iter().any(|p| p.starts_with("backend: sim")),
        "{printed:?}"
    );
    for line in printed.iter().flat_map(|p| p.lines()) {
        if line.starts_with("  ") && line.trim_start().starts_with(path.as_str()) {
            continue;
        }
        assert!(
            line.chars().count() <= 100,
            "{} wide: {line}",
            line.chars().count()
        );
    }
}
