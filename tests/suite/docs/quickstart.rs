//! The quickstart (examples/quickstart.rs, compiled here as a module) follows
//! the docs' schedule advice, and what it prints explains its own counts:
//! every number in its explanation is one the run counted, and the sums it
//! states hold.

#[allow(dead_code)]
#[path = "../../../examples/quickstart.rs"]
mod quickstart;

use replay_arena::{sim, FenceStats};

/// The quickstart on `sim`: what it printed, paragraph by paragraph, and its
/// outcome.
fn run_on_sim() -> (Vec<String>, quickstart::Outcome) {
    let mut printed = Vec::new();
    let sim = sim::Device::new();
    let outcome = quickstart::run(&sim, &mut |p| printed.push(p)).unwrap();
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
    let fenced_replays = outcome.runners_using * outcome.steps;
    // One wait per consumer and one per buffer-using replay after the first
    // G: no replay waited for the runner whose bytes it reuses.
    assert_eq!(
        s.waits,
        s.consumers + fenced_replays - outcome.generations,
        "{s}"
    );
    assert_eq!(s.consumers, fenced_replays, "{s}");
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
            s.waits,
            s.consumers,
            outcome.generations,
            replay_waits,
            s.waits_skipped
        ],
        "{explanation}"
    );
    assert_eq!(s.waits, s.consumers + replay_waits, "{explanation}");
    assert!(explanation.contains("one per consumer"), "{explanation}");
}

#[test]
fn an_explanation_of_a_schedule_that_ignores_the_generations_says_so() {
    let mut stats = FenceStats::default();
    stats.replays = 1000;
    stats.consumers = 800;
    stats.waits = 2001;
    stats.waits_skipped = 403;
    let text = quickstart::explain(&quickstart::Outcome {
        stats,
        generations: 2,
        runners_using: 4,
        steps: 200,
    });
    // 800 consumers + 798 replays after the first two: 403 more.
    assert!(text.contains("2001 waits are 403 more"), "{text}");
    assert!(!text.contains("one per consumer (800, each"), "{text}");
}

#[test]
fn the_quickstarts_lines_fit_100_columns() {
    let (printed, _) = run_on_sim();
    for line in printed.iter().flat_map(|p| p.lines()) {
        // The trace file's path is the machine's.
        if line.contains("written to") {
            continue;
        }
        assert!(line.chars().count() <= 100, "{} wide: {line}", line.len());
    }
}
