//! `replay-arena-plan`: reads workload files (recorded discovery, see
//! `docs/workload-format.md`) and prints the persistent-buffer plan a policy
//! gives them, or compares every policy and both placements.
//!
//! ```text
//! replay-arena-plan examples/workloads/gpt3-175b-per-module.json --generations 2 --packed
//! replay-arena-plan examples/workloads/mixtral-8x7b-per-module.json --module-kinds 3 --json
//! replay-arena-plan examples/workloads/gpt3-175b-per-module.json -g 3 --svg plan.svg
//! cat my-workload.json | replay-arena-plan - --overlap-depth 3
//! replay-arena-plan --compare --markdown examples/workloads/*.json
//! ```

mod render;
mod svg;

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{ArgGroup, CommandFactory, Parser};
use replay_arena::{Discovering, PlacedPolicy, Policy, Workload};

/// Prints the persistent-buffer plan of recorded discovery (workload files),
/// or compares every policy and both placements.
///
/// With one policy (--generations, --module-kinds or --overlap-depth, plus
/// --packed for the packed placement) it prints the plan report: per key the
/// bytes of the plan, the lower bound, round-robin, packed and the old
/// per-parameter ring, and per runner its generation, bytes and fence waits.
/// With --compare, or when no policy is given, it prints per workload the
/// bytes of round-robin and packed placement for G = 1, 2, 3 and the
/// module-kinds rule, the lower bound and the ratios. --json prints the same
/// as data, --markdown the comparison as one Markdown table, --svg a picture
/// of the plan.
#[derive(Debug, Parser)]
#[command(name = "replay-arena-plan", version, verbatim_doc_comment)]
#[command(override_usage = USAGE)]
#[command(group(ArgGroup::new("policy").args(["generations", "module_kinds", "overlap_depth"])))]
struct Cli {
    /// Workload files (JSON); `-` reads standard input.
    #[arg(value_name = "FILE", required = true)]
    inputs: Vec<String>,

    /// Plan with exactly N generations.
    #[arg(short, long, value_name = "N", value_parser = positive)]
    generations: Option<usize>,

    /// Plan with Megatron-LM's rule for K local-graph module kinds.
    #[arg(short = 'k', long, value_name = "K", value_parser = positive)]
    module_kinds: Option<usize>,

    /// Plan for D runner graphs in flight at once.
    #[arg(short = 'd', long, value_name = "D", value_parser = positive)]
    overlap_depth: Option<usize>,

    /// Use packed placement instead of round-robin (with a policy).
    #[arg(long)]
    packed: bool,

    /// Compare every policy and both placements (the default with no policy)
    ///
    /// G = 1, 2, 3 and the module-kinds rule, each round-robin and packed.
    #[arg(long, conflicts_with = "policy", verbatim_doc_comment)]
    compare: bool,

    /// Print data (JSON) instead of a table.
    #[arg(long)]
    json: bool,

    /// Print the comparison as one Markdown table.
    #[arg(long, conflicts_with_all = ["json", "policy"])]
    markdown: bool,

    /// Also draw the plan as an SVG picture (one workload, with a policy)
    ///
    /// Written to SVG: per key, addresses against the buffer-using runners
    /// in capture order, handoffs included.
    #[arg(long, value_name = "SVG", verbatim_doc_comment)]
    svg: Option<PathBuf>,
}

/// The command lines the parser accepts, one form a line: what every usage
/// and error message shows, so that following one is never refused
/// (tests/suite/cli/explorer.rs runs each form). `(a | b)`: one of them; `[a]`: optional.
/// The policies by their short flags, so that each form fits in 100
/// characters; the options list their long names.
const USAGE: &str = "\
replay-arena-plan <FILE>... (-g <N> | -k <K> | -d <D>) [--packed] [--json]
       replay-arena-plan <FILE> (-g <N> | -k <K> | -d <D>) [--packed] [--json] --svg <SVG>
       replay-arena-plan <FILE>... [--compare] [--json | --markdown]";

/// `N >= 1`, with a message that says so.
fn positive(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_string()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("expected a positive integer, got {text:?}")),
    }
}

/// What the command line asks for, checked.
struct Options {
    inputs: Vec<String>,
    /// One placed policy, or `None` for the comparison.
    placed_policy: Option<PlacedPolicy>,
    format: render::Format,
    svg: Option<PathBuf>,
}

impl Cli {
    fn options(self) -> Result<Options, clap::Error> {
        let refuse = |message: &str| Cli::command().error(ErrorKind::ArgumentConflict, message);
        if self.inputs.iter().filter(|i| *i == "-").count() > 1 {
            return Err(refuse("standard input (-) can be read only once"));
        }
        if self.svg.is_some() && self.inputs.len() > 1 {
            return Err(refuse("--svg draws one workload; give one FILE"));
        }
        let policy = match (self.generations, self.module_kinds, self.overlap_depth) {
            (Some(n), _, _) => Some(Policy::Generations(n)),
            (_, Some(k), _) => Some(Policy::ModuleKinds(k)),
            (_, _, Some(d)) => Some(Policy::OverlapDepth(d)),
            _ => None,
        };
        // What needs one plan, asked for with a comparison (named or by
        // default): said as such, with the policies to choose from.
        let one_plan = |flag: &str| {
            let asked = if self.compare {
                "cannot be used with --compare"
            } else {
                "needs a policy"
            };
            refuse(&format!(
                "'{flag}' {asked}: it is about one plan;\n  \
                 give --generations <N>, --module-kinds <K> or --overlap-depth <D>"
            ))
        };
        if policy.is_none() && self.svg.is_some() {
            return Err(one_plan("--svg <SVG>"));
        }
        if policy.is_none() && self.packed {
            return Err(one_plan("--packed"));
        }
        let placed_policy = policy.map(|p| {
            if self.packed {
                p.packed()
            } else {
                p.round_robin()
            }
        });
        let format = match (self.json, self.markdown) {
            (true, _) => render::Format::Json,
            (_, true) => render::Format::Markdown,
            _ => render::Format::Text,
        };
        Ok(Options {
            inputs: self.inputs,
            placed_policy,
            format,
            svg: self.svg,
        })
    }
}

fn main() -> ExitCode {
    let options = match Cli::try_parse().and_then(Cli::options) {
        Ok(options) => options,
        Err(e) => {
            // Help and version go to stdout; a closed pipe there is no error.
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    let result = run(&options).and_then(|output| write_stdout(&output));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            let _ = writeln!(io::stderr(), "error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Writes the output; a reader that went away (`| head`) ends it quietly.
fn write_stdout(output: &str) -> Result<(), String> {
    let mut stdout = io::stdout().lock();
    match stdout
        .write_all(output.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => {
            Err(format!("writing the output failed: {e}"))
        }
        _ => Ok(()),
    }
}

/// One workload file, read and discovered.
pub(crate) struct Input {
    /// The file as given on the command line.
    pub(crate) label: String,
    pub(crate) workload: Workload,
    pub(crate) discovery: Discovering,
}

impl Input {
    fn read(label: &str) -> Result<Input, String> {
        use std::io::Read;
        let mut bytes = Vec::new();
        let read = if label == "-" {
            io::stdin().lock().read_to_end(&mut bytes)
        } else {
            let mut file = std::fs::File::open(label).map_err(|e| format!("{label}: {e}"))?;
            file.read_to_end(&mut bytes)
        };
        read.map_err(|e| format!("{label}: {}", replay_arena::WorkloadError::Read(e)))?;
        let workload = Workload::from_reader(&bytes[..]).map_err(|e| format!("{label}: {e}"))?;
        // Every error names its line and column, the checks after reading
        // too.
        let discovery = workload.to_discovering().map_err(|e| {
            let located = e.located(&String::from_utf8_lossy(&bytes));
            format!("{label}: {located}")
        })?;
        Ok(Input {
            label: label.to_string(),
            workload,
            discovery,
        })
    }
}

/// Reads every input, then renders what the options ask for.
fn run(options: &Options) -> Result<String, String> {
    let inputs = options
        .inputs
        .iter()
        .map(|i| Input::read(i))
        .collect::<Result<Vec<_>, _>>()?;
    match options.placed_policy {
        Some(placed_policy) => {
            let mut plans = Vec::with_capacity(inputs.len());
            for input in &inputs {
                let plan = render::Plan::of(input, placed_policy)
                    .map_err(|e| format!("{}: {e}", input.label))?;
                if let Some(path) = &options.svg {
                    let picture = svg::draw(input, &plan)?;
                    std::fs::write(path, picture)
                        .map_err(|e| format!("writing {}: {e}", path.display()))?;
                    // On stderr: stdout stays the report (`--json` parses).
                    eprintln!(
                        "wrote the plan's picture ({} keys) to {}",
                        plan.report.keys.len(),
                        path.display()
                    );
                }
                plans.push(plan);
            }
            Ok(match options.format {
                render::Format::Json => {
                    render::json_lines(&plans.iter().map(|p| p.json()).collect::<Vec<_>>())?
                }
                // The reports, then the legend of their columns once.
                _ => {
                    let mut text: String = plans.iter().map(render::Plan::text).collect();
                    if let Some(last) = plans.last() {
                        text.push_str(&last.report.legend());
                    }
                    text
                }
            })
        }
        None => {
            let comparisons = inputs
                .iter()
                .map(|i| render::Comparison::of(i).map_err(|e| format!("{}: {e}", i.label)))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(match options.format {
                render::Format::Text => {
                    let tables: Vec<String> =
                        comparisons.iter().map(render::Comparison::text).collect();
                    format!("{}\n{}", tables.join("\n"), render::COMPARISON_LEGEND)
                }
                render::Format::Json => {
                    render::json_lines(&comparisons.iter().map(|c| c.json()).collect::<Vec<_>>())?
                }
                render::Format::Markdown => render::markdown(&comparisons),
            })
        }
    }
}
