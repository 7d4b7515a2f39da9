//! Plan explorer: reads a workload file and prints the persistent-buffer plan
//! a policy gives it, or compares every policy and both placements.
//!
//! ```text
//! cargo run --example plan -- examples/workloads/gpt3-175b-per-module.json --generations 2 --packed
//! cargo run --example plan -- examples/workloads/mixtral-8x7b-per-module.json --module-kinds 3 --json
//! cat my-workload.json | cargo run --example plan -- - --overlap-depth 3
//! cargo run --example plan -- --compare examples/workloads/*.json
//! cargo run --example plan -- --compare --markdown examples/workloads/*.json
//! ```
//!
//! With one policy (`--generations N`, `--module-kinds K` or
//! `--overlap-depth D`, plus `--packed` for the packed placement) it prints the
//! library's plan report, or with `--json` the same report as data. With
//! `--compare`, or when no policy is given, it prints per workload the ring
//! bytes, the bytes of round-robin and packed placement for G = 1, 2, 3 and the
//! module-kinds rule, the lower bound, and the ratios; `--json` and
//! `--markdown` give the same table as data or as a Markdown table.
//!
//! # Workload files
//!
//! ```json
//! {
//!   "name": "tiny",
//!   "source": "where the shapes come from (optional)",
//!   "module_kinds": 2,
//!   "runners": [
//!     {"name": "layer1.mlp.bwd", "requests": [
//!       {"domain": {"symmetric": "gtp"}, "dtype": "bf16", "elements": 4096,
//!        "purpose": "wgrad_rs_input", "param": "l1.fc1"},
//!       {"domain": "device", "dtype": "f32", "elements": 512}
//!     ]},
//!     {"name": "layer1.attn.bwd", "requests": []}
//!   ]
//! }
//! ```
//!
//! - `runners` are in capture order; runner `i` becomes `RunnerId(i)`. Runner
//!   names must be unique and non-empty; a runner may request nothing.
//! - `domain` is `"device"` or `{"symmetric": GROUP}`; groups are registered
//!   in the `PlanConfig` in order of first appearance (`GroupId(0)`, ...) and
//!   reports show them by name.
//! - `dtype` is a `DType` name (`bf16`, `f32`, ...); `elements` a positive
//!   integer; `purpose` (default `other`) one of `wgrad_rs_input`,
//!   `rs_output`, `fp32_rs_scratch`, `fp32_accum_scratch`, `other`; `param`
//!   (optional) names the parameter, mapped to `ParamId` by order of first
//!   appearance (the ring of size 2 counts writers per parameter).
//! - `module_kinds` (optional) is the number of local-graph module kinds the
//!   upstream rule counts. Without it, the number of distinct runner names
//!   once digits are masked (`layer3.mlp.bwd` -> `layer#.mlp.bwd`) is used.
//! - Unknown fields are errors (a misspelt `purpose` would otherwise be
//!   silently dropped). Every error names the JSON path of the problem, e.g.
//!   `runners[3].requests[0].dtype: unknown dtype "bf17"`.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::io::Read;
use std::process::ExitCode;

use replay_arena::{
    byte_ratio, human_bytes, DType, Discovering, Domain, GroupId, Key, ParamId, PlanConfig,
    PlanReport, Planned, Policy, Purpose, Request, RunnerId, Strategy,
};
use serde_json::{json, Map, Value};

const USAGE: &str = "\
usage: plan [OPTIONS] FILE...      (FILE is a workload JSON file, or - for stdin)

  --generations N     plan with N generations (Policy::Generations)
  --module-kinds K    plan with the upstream rule for K module kinds (Policy::ModuleKinds)
  --overlap-depth D   plan for D runner graphs in flight (Policy::OverlapDepth)
  --packed            use packed placement instead of round-robin (needs a policy)
  --compare           compare G = 1, 2, 3 and the module-kinds rule, round-robin and
                      packed (the default when no policy is given)
  --json              print data (JSON) instead of a table
  --markdown          print the comparison as one Markdown table (with --compare)
  -h, --help          this text";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match Options::parse(&args) {
        Ok(Command::Help) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Ok(Command::Run(options)) => options,
        Err(message) => {
            eprintln!("error: {message}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&options) {
        Ok(output) => {
            print!("{output}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Reads every input, then renders what the options ask for.
fn run(options: &Options) -> Result<String, String> {
    let mut workloads = Vec::with_capacity(options.inputs.len());
    for input in &options.inputs {
        let text = read_input(input).map_err(|e| format!("{input}: {e}"))?;
        let workload = Workload::parse(&text).map_err(|e| format!("{input}: {e}"))?;
        workloads.push((input.as_str(), workload));
    }
    match options.mode {
        Mode::Single(strategy) => {
            let mut out = String::new();
            let mut reports = Vec::new();
            for (input, workload) in &workloads {
                let report = workload
                    .plan(strategy)
                    .map_err(|e| format!("{input}: {e}"))?
                    .report();
                match options.format {
                    Format::Json => reports.push(report_json(input, workload, &report)),
                    _ => out.push_str(&report_text(input, workload, &report)),
                }
            }
            if options.format == Format::Json {
                out = json_lines(reports);
            }
            Ok(out)
        }
        Mode::Compare => {
            let mut comparisons = Vec::with_capacity(workloads.len());
            for (input, workload) in &workloads {
                comparisons.push(Comparison::of(workload).map_err(|e| format!("{input}: {e}"))?);
            }
            Ok(match options.format {
                Format::Text => comparisons
                    .iter()
                    .zip(&workloads)
                    .map(|(c, (input, _))| c.text(input))
                    .collect::<Vec<_>>()
                    .join("\n"),
                Format::Json => json_lines(comparisons.iter().map(Comparison::json).collect()),
                Format::Markdown => markdown(&comparisons),
            })
        }
    }
}

/// One JSON value per input; an array when there are several.
fn json_lines(mut values: Vec<Value>) -> String {
    let value = if values.len() == 1 {
        values.remove(0)
    } else {
        Value::Array(values)
    };
    format!(
        "{}\n",
        serde_json::to_string_pretty(&value).expect("JSON values always serialize")
    )
}

fn read_input(input: &str) -> std::io::Result<String> {
    if input == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text)?;
        Ok(text)
    } else {
        std::fs::read_to_string(input)
    }
}

// ---- command line ----------------------------------------------------------

/// What the command line asks for.
#[derive(Debug, PartialEq)]
enum Command {
    /// Print the usage.
    Help,
    /// Plan or compare the inputs.
    Run(Options),
}

/// Parsed command-line options.
#[derive(Debug, PartialEq)]
struct Options {
    /// Workload files, `-` for stdin.
    inputs: Vec<String>,
    /// One strategy, or the comparison.
    mode: Mode,
    /// How to print.
    format: Format,
}

/// One strategy's report, or the comparison of all of them.
#[derive(Debug, PartialEq)]
enum Mode {
    Single(Strategy),
    Compare,
}

/// How results are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Text,
    Json,
    Markdown,
}

impl Options {
    fn parse(args: &[String]) -> Result<Command, String> {
        let mut inputs = Vec::new();
        let mut policy: Option<Policy> = None;
        let (mut packed, mut compare, mut json, mut markdown) = (false, false, false, false);
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let make: Option<fn(usize) -> Policy> = match arg.as_str() {
                "--generations" => Some(Policy::Generations),
                "--module-kinds" => Some(Policy::ModuleKinds),
                "--overlap-depth" => Some(Policy::OverlapDepth),
                _ => None,
            };
            if let Some(make) = make {
                let value = it.next().ok_or_else(|| format!("{arg} needs a value"))?;
                let n: usize = value
                    .parse()
                    .map_err(|_| format!("{arg} needs a positive integer, got {value:?}"))?;
                if n == 0 {
                    return Err(format!("{arg} must be at least 1"));
                }
                if let Some(previous) = policy {
                    return Err(format!(
                        "give one policy; {previous} and {arg} {value} were both given"
                    ));
                }
                policy = Some(make(n));
                continue;
            }
            match arg.as_str() {
                "-h" | "--help" => return Ok(Command::Help),
                "--packed" => packed = true,
                "--compare" => compare = true,
                "--json" => json = true,
                "--markdown" => markdown = true,
                "-" => inputs.push(arg.clone()),
                flag if flag.starts_with('-') => return Err(format!("unknown option {flag}")),
                path => inputs.push(path.to_string()),
            }
        }
        if inputs.is_empty() {
            return Err("no workload file given (use - for stdin)".into());
        }
        if inputs.iter().filter(|i| *i == "-").count() > 1 {
            return Err("stdin (-) can be read only once".into());
        }
        if json && markdown {
            return Err("--json and --markdown exclude each other".into());
        }
        let mode = match (policy, compare) {
            (Some(policy), false) => Mode::Single(if packed {
                policy.packed()
            } else {
                policy.into()
            }),
            (Some(policy), true) => {
                return Err(format!(
                    "--compare covers every policy; drop {policy} or --compare"
                ))
            }
            (None, _) if packed => {
                return Err("--packed needs a policy (--compare shows both placements)".into())
            }
            (None, _) => Mode::Compare,
        };
        if markdown && mode != Mode::Compare {
            return Err("--markdown formats the comparison; use it with --compare".into());
        }
        let format = match (json, markdown) {
            (true, _) => Format::Json,
            (_, true) => Format::Markdown,
            _ => Format::Text,
        };
        Ok(Command::Run(Options {
            inputs,
            mode,
            format,
        }))
    }
}

// ---- workload files --------------------------------------------------------

/// A problem in a workload file: the JSON path where it is, and what is
/// wrong. The path is empty for problems with the file as a whole.
#[derive(Clone, Debug, PartialEq, Eq)]
struct WorkloadError {
    path: String,
    message: String,
}

impl WorkloadError {
    fn new(path: impl Into<String>, message: impl Into<String>) -> WorkloadError {
        WorkloadError {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for WorkloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// One runner of a workload.
#[derive(Clone, Debug, PartialEq)]
struct RunnerSpec {
    name: String,
    requests: Vec<Request>,
}

/// A parsed and checked workload file.
#[derive(Clone, Debug, PartialEq)]
struct Workload {
    name: String,
    source: Option<String>,
    /// `module_kinds` from the file, if given.
    module_kinds: Option<usize>,
    /// Symmetric group names; `GroupId(i)` is `groups[i]`.
    groups: Vec<String>,
    /// Parameter names; `ParamId(i)` is `params[i]`.
    params: Vec<String>,
    /// Runners in capture order; `RunnerId(i)` is `runners[i]`.
    runners: Vec<RunnerSpec>,
}

/// "an object", "a string", ...: what a JSON value is, for error messages.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn field_path(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_string()
    } else {
        format!("{path}.{field}")
    }
}

/// `value` as an object whose fields are all in `allowed`.
fn object<'v>(
    value: &'v Value,
    path: &str,
    allowed: &[&str],
) -> Result<&'v Map<String, Value>, WorkloadError> {
    let map = value.as_object().ok_or_else(|| {
        let what = if path.is_empty() {
            "the workload to be an object"
        } else {
            "an object"
        };
        WorkloadError::new(path, format!("expected {what}, found {}", kind(value)))
    })?;
    if let Some(unknown) = map.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(WorkloadError::new(
            field_path(path, unknown),
            format!("unknown field (expected one of: {})", allowed.join(", ")),
        ));
    }
    Ok(map)
}

fn required<'v>(
    map: &'v Map<String, Value>,
    path: &str,
    field: &str,
) -> Result<&'v Value, WorkloadError> {
    map.get(field)
        .ok_or_else(|| WorkloadError::new(field_path(path, field), "missing"))
}

fn string<'v>(value: &'v Value, path: &str) -> Result<&'v str, WorkloadError> {
    let s = value.as_str().ok_or_else(|| {
        WorkloadError::new(path, format!("expected a string, found {}", kind(value)))
    })?;
    if s.is_empty() {
        return Err(WorkloadError::new(path, "must not be empty"));
    }
    Ok(s)
}

fn positive(value: &Value, path: &str) -> Result<u64, WorkloadError> {
    match value.as_u64() {
        Some(0) => Err(WorkloadError::new(path, "must be at least 1")),
        Some(n) => Ok(n),
        None => Err(WorkloadError::new(
            path,
            match value {
                Value::Number(n) => format!("expected a positive integer, found {n}"),
                other => format!("expected a positive integer, found {}", kind(other)),
            },
        )),
    }
}

/// Index of `name` in `names`, appending it on first appearance.
fn intern(names: &mut Vec<String>, name: &str) -> usize {
    match names.iter().position(|n| n == name) {
        Some(i) => i,
        None => {
            names.push(name.to_string());
            names.len() - 1
        }
    }
}

impl Workload {
    /// Parses and checks a workload file.
    fn parse(text: &str) -> Result<Workload, WorkloadError> {
        let root: Value = serde_json::from_str(text)
            .map_err(|e| WorkloadError::new("", format!("invalid JSON: {e}")))?;
        let map = object(&root, "", &["name", "source", "module_kinds", "runners"])?;
        let name = string(required(map, "", "name")?, "name")?.to_string();
        let source = map
            .get("source")
            .map(|v| string(v, "source").map(str::to_string))
            .transpose()?;
        let module_kinds = map
            .get("module_kinds")
            .map(|v| {
                positive(v, "module_kinds").and_then(|n| {
                    usize::try_from(n).map_err(|_| WorkloadError::new("module_kinds", "too large"))
                })
            })
            .transpose()?;
        let runners_value = required(map, "", "runners")?;
        let runner_values = runners_value.as_array().ok_or_else(|| {
            WorkloadError::new(
                "runners",
                format!("expected an array, found {}", kind(runners_value)),
            )
        })?;
        if runner_values.is_empty() {
            return Err(WorkloadError::new(
                "runners",
                "must list at least one runner",
            ));
        }
        if u32::try_from(runner_values.len()).is_err() {
            return Err(WorkloadError::new(
                "runners",
                "more runners than RunnerId can number",
            ));
        }
        let mut workload = Workload {
            name,
            source,
            module_kinds,
            groups: Vec::new(),
            params: Vec::new(),
            runners: Vec::with_capacity(runner_values.len()),
        };
        let mut seen: HashMap<String, usize> = HashMap::new();
        for (i, value) in runner_values.iter().enumerate() {
            let path = format!("runners[{i}]");
            let runner = object(value, &path, &["name", "requests"])?;
            let name_path = field_path(&path, "name");
            let name = string(required(runner, &path, "name")?, &name_path)?;
            if let Some(first) = seen.insert(name.to_string(), i) {
                return Err(WorkloadError::new(
                    name_path,
                    format!("duplicate runner name {name:?} (also runners[{first}])"),
                ));
            }
            let requests_path = field_path(&path, "requests");
            let requests_value = required(runner, &path, "requests")?;
            let request_values = requests_value.as_array().ok_or_else(|| {
                WorkloadError::new(
                    &requests_path,
                    format!("expected an array, found {}", kind(requests_value)),
                )
            })?;
            let mut requests = Vec::with_capacity(request_values.len());
            for (j, value) in request_values.iter().enumerate() {
                requests.push(workload.request(value, &format!("{requests_path}[{j}]"))?);
            }
            workload.runners.push(RunnerSpec {
                name: name.to_string(),
                requests,
            });
        }
        // Discovery checks what one request alone cannot show (capacity
        // overflow); run it once so a bad file fails here, with a path.
        workload.discover()?;
        Ok(workload)
    }

    fn request(&mut self, value: &Value, path: &str) -> Result<Request, WorkloadError> {
        let map = object(
            value,
            path,
            &["domain", "dtype", "elements", "purpose", "param"],
        )?;
        let domain_path = field_path(path, "domain");
        let domain = match required(map, path, "domain")? {
            Value::String(s) if s == "device" => Domain::Device,
            Value::String(s) => {
                return Err(WorkloadError::new(
                    domain_path,
                    format!(
                        "unknown domain {s:?} (expected \"device\" or {{\"symmetric\": GROUP}})"
                    ),
                ))
            }
            v @ Value::Object(_) => {
                let m = object(v, &domain_path, &["symmetric"])?;
                let group_path = field_path(&domain_path, "symmetric");
                let group = string(required(m, &domain_path, "symmetric")?, &group_path)?;
                let id = intern(&mut self.groups, group);
                Domain::Symmetric(GroupId(u32::try_from(id).map_err(|_| {
                    WorkloadError::new(&group_path, "more groups than GroupId can number")
                })?))
            }
            other => {
                return Err(WorkloadError::new(
                    domain_path,
                    format!(
                        "expected \"device\" or {{\"symmetric\": GROUP}}, found {}",
                        kind(other)
                    ),
                ))
            }
        };
        let dtype_path = field_path(path, "dtype");
        let dtype_name = string(required(map, path, "dtype")?, &dtype_path)?;
        let dtype = DType::from_name(dtype_name).ok_or_else(|| {
            let known: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
            WorkloadError::new(
                &dtype_path,
                format!(
                    "unknown dtype {dtype_name:?} (expected one of: {})",
                    known.join(", ")
                ),
            )
        })?;
        let elements_path = field_path(path, "elements");
        let elements = positive(required(map, path, "elements")?, &elements_path)?;
        let mut request = Request::new(domain, dtype, elements);
        if request.aligned_bytes().is_none() {
            return Err(WorkloadError::new(
                elements_path,
                format!("{elements} elements of {dtype} overflow a 64-bit byte count"),
            ));
        }
        if let Some(v) = map.get("purpose") {
            let purpose_path = field_path(path, "purpose");
            let name = string(v, &purpose_path)?;
            request = request.purpose(Purpose::from_name(name).ok_or_else(|| {
                WorkloadError::new(
                    &purpose_path,
                    format!(
                        "unknown purpose {name:?} (expected one of: wgrad_rs_input, rs_output, \
                         fp32_rs_scratch, fp32_accum_scratch, other)"
                    ),
                )
            })?);
        }
        if let Some(v) = map.get("param") {
            let name = string(v, &field_path(path, "param"))?;
            request = request.param(ParamId(intern(&mut self.params, name) as u64));
        }
        Ok(request)
    }

    /// The plan config: every symmetric group, by order of first appearance.
    fn config(&self) -> PlanConfig {
        self.groups
            .iter()
            .enumerate()
            .try_fold(PlanConfig::new(), |config, (i, name)| {
                config.with_group(GroupId(i as u32), name.as_str())
            })
            .expect("group ids are distinct")
    }

    /// Runs discovery: runner `i` is armed as `RunnerId(i)` and records its
    /// requests in file order.
    fn discover(&self) -> Result<Discovering, WorkloadError> {
        let mut discovery = Discovering::new(self.config());
        for (i, runner) in self.runners.iter().enumerate() {
            let path = format!("runners[{i}]");
            let mut armed = discovery
                .arm(RunnerId(i as u32))
                .map_err(|e| WorkloadError::new(&path, e.to_string()))?;
            for (j, &request) in runner.requests.iter().enumerate() {
                armed.record(request).map_err(|e| {
                    WorkloadError::new(format!("{path}.requests[{j}]"), e.to_string())
                })?;
            }
        }
        Ok(discovery)
    }

    /// Discovers and plans.
    fn plan(&self, strategy: Strategy) -> Result<Planned, WorkloadError> {
        self.discover()?
            .plan(strategy)
            .map_err(|e| WorkloadError::new("", format!("planning {strategy:?} failed: {e}")))
    }

    /// `module_kinds` from the file, or the number of distinct runner names
    /// with digits masked; and where it came from.
    fn module_kinds(&self) -> (usize, &'static str) {
        match self.module_kinds {
            Some(k) => (k, "file"),
            None => {
                let kinds: BTreeSet<String> =
                    self.runners.iter().map(|r| mask_digits(&r.name)).collect();
                (kinds.len(), "runner names")
            }
        }
    }

    fn runner_name(&self, runner: RunnerId) -> &str {
        &self.runners[runner.0 as usize].name
    }

    fn group_name(&self, group: GroupId) -> &str {
        &self.groups[group.0 as usize]
    }

    fn domain_json(&self, domain: Domain) -> Value {
        match domain {
            Domain::Device => json!("device"),
            Domain::Symmetric(g) => json!({ "symmetric": self.group_name(g) }),
        }
    }

    fn key_name(&self, key: Key) -> String {
        match key.domain {
            Domain::Device => key.to_string(),
            Domain::Symmetric(g) => format!("{} in symmetric({})", key.dtype, self.group_name(g)),
        }
    }
}

/// `layer12.mlp.bwd` -> `layer#.mlp.bwd`.
fn mask_digits(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if c.is_ascii_digit() {
            if !out.ends_with('#') {
                out.push('#');
            }
        } else {
            out.push(c);
        }
    }
    out
}

// ---- one policy --------------------------------------------------------------

fn report_text(input: &str, workload: &Workload, report: &PlanReport) -> String {
    let mut out = format!(
        "workload {} ({input}): {} runners\n",
        workload.name,
        workload.runners.len()
    );
    if let Some(source) = &workload.source {
        out.push_str(&format!("source: {source}\n"));
    }
    out.push_str(&report.to_string());
    out.push_str("runner names: ");
    let names: Vec<String> = workload
        .runners
        .iter()
        .enumerate()
        .map(|(i, r)| format!("{i} {}", r.name))
        .collect();
    out.push_str(&names.join(", "));
    out.push('\n');
    out
}

/// The plan report as data, with group and runner names from the file.
fn report_json(input: &str, workload: &Workload, report: &PlanReport) -> Value {
    let keys: Vec<Value> = report
        .keys
        .iter()
        .map(|k| {
            json!({
                "name": workload.key_name(k.key),
                "domain": workload.domain_json(k.key.domain),
                "dtype": k.key.dtype.name(),
                "arenas": k.arenas,
                "plan_bytes": k.plan_bytes,
                "round_robin_bytes": k.round_robin_bytes,
                "packed_bytes": k.packed_bytes,
                "lower_bound": k.lower_bound,
                "ring_bytes": k.ring_bytes,
                "longest_wait_list": k.longest_wait_list,
            })
        })
        .collect();
    let runners: Vec<Value> = report
        .runners
        .iter()
        .map(|r| {
            let slices: Vec<Value> = r
                .slices
                .iter()
                .map(|s| {
                    json!({
                        "key": workload.key_name(s.key),
                        "arena": s.arena,
                        "offset": s.offset,
                        "bytes": s.bytes,
                    })
                })
                .collect();
            json!({
                "id": r.runner.0,
                "name": workload.runner_name(r.runner),
                "generation": r.generation,
                "requests": r.requests,
                "bytes": r.bytes,
                "wait_list": r.wait_list,
                "slices": slices,
            })
        })
        .collect();
    json!({
        "workload": {
            "name": workload.name,
            "source": workload.source,
            "file": input,
        },
        "policy": report.strategy.policy.to_string(),
        "placement": report.strategy.placement.to_string(),
        "generations": report.generations,
        "runners_total": report.runners_total,
        "runners_using": report.runners_using,
        "plan_bytes": report.plan_bytes,
        "round_robin_bytes": report.round_robin_bytes,
        "packed_bytes": report.packed_bytes,
        "lower_bound": report.lower_bound,
        "ring_bytes": report.ring_bytes,
        "longest_wait_list": report.longest_wait_list,
        "fingerprint": format!("{:016x}", report.fingerprint),
        "ratios": {
            "plan_over_lower_bound": report.plan_over_lower_bound(),
            "round_robin_over_lower_bound": report.round_robin_over_lower_bound(),
            "packed_over_lower_bound": report.packed_over_lower_bound(),
            "ring_over_plan": report.ring_over_plan(),
        },
        "groups": workload.groups,
        "keys": keys,
        "runners": runners,
    })
}

// ---- comparison ------------------------------------------------------------

/// One policy in the comparison: both placements' bytes and the lower bound.
#[derive(Clone, Debug, PartialEq)]
struct Row {
    policy: Policy,
    generations: usize,
    lower_bound: u64,
    round_robin: u64,
    packed: u64,
}

impl Row {
    fn packed_over_lower_bound(&self) -> f64 {
        byte_ratio(self.packed, self.lower_bound)
    }

    fn round_robin_over_lower_bound(&self) -> f64 {
        byte_ratio(self.round_robin, self.lower_bound)
    }
}

/// Every policy of the comparison for one workload.
#[derive(Clone, Debug, PartialEq)]
struct Comparison {
    name: String,
    source: Option<String>,
    runners: usize,
    runners_using: usize,
    module_kinds: usize,
    module_kinds_from: &'static str,
    ring: u64,
    rows: Vec<Row>,
}

impl Comparison {
    /// Plans G = 1, 2, 3 and the module-kinds rule with both placements.
    fn of(workload: &Workload) -> Result<Comparison, WorkloadError> {
        let (module_kinds, module_kinds_from) = workload.module_kinds();
        let policies = [
            Policy::Generations(1),
            Policy::Generations(2),
            Policy::Generations(3),
            Policy::ModuleKinds(module_kinds),
        ];
        let mut rows = Vec::with_capacity(policies.len());
        let mut ring = 0;
        let mut runners_using = 0;
        for policy in policies {
            let round_robin = workload.plan(policy.into())?;
            let packed = workload.plan(policy.packed())?;
            let report = round_robin.report();
            ring = report.ring_bytes;
            runners_using = report.runners_using;
            rows.push(Row {
                policy,
                generations: round_robin.generations(),
                lower_bound: report.lower_bound,
                round_robin: round_robin.total_bytes(),
                packed: packed.total_bytes(),
            });
        }
        Ok(Comparison {
            name: workload.name.clone(),
            source: workload.source.clone(),
            runners: workload.runners.len(),
            runners_using,
            module_kinds,
            module_kinds_from,
            ring,
            rows,
        })
    }

    fn text(&self, input: &str) -> String {
        let mut out = format!(
            "workload {} ({input}): {} runners ({} use buffers), module kinds {} (from {}), ring(2) {}\n",
            self.name,
            self.runners,
            self.runners_using,
            self.module_kinds,
            self.module_kinds_from,
            human_bytes(self.ring)
        );
        if let Some(source) = &self.source {
            out.push_str(&format!("source: {source}\n"));
        }
        out.push_str(&format!(
            "{:<16} {:>2} {:>9} {:>9} {:>11} {:>9} {:>12} {:>12} {:>12}\n",
            "policy",
            "G",
            "packed/lb",
            "rr/lb",
            "ring/packed",
            "ring/rr",
            "lower bound",
            "packed",
            "round-robin"
        ));
        for r in &self.rows {
            out.push_str(&format!(
                "{:<16} {:>2} {:>9.3} {:>9.3} {:>11.2} {:>9.2} {:>12} {:>12} {:>12}\n",
                r.policy.to_string(),
                r.generations,
                r.packed_over_lower_bound(),
                r.round_robin_over_lower_bound(),
                byte_ratio(self.ring, r.packed),
                byte_ratio(self.ring, r.round_robin),
                human_bytes(r.lower_bound),
                human_bytes(r.packed),
                human_bytes(r.round_robin)
            ));
        }
        out
    }

    fn json(&self) -> Value {
        let rows: Vec<Value> = self
            .rows
            .iter()
            .map(|r| {
                json!({
                    "policy": r.policy.to_string(),
                    "generations": r.generations,
                    "lower_bound": r.lower_bound,
                    "packed_bytes": r.packed,
                    "round_robin_bytes": r.round_robin,
                    "packed_over_lower_bound": r.packed_over_lower_bound(),
                    "round_robin_over_lower_bound": r.round_robin_over_lower_bound(),
                    "ring_over_packed": byte_ratio(self.ring, r.packed),
                    "ring_over_round_robin": byte_ratio(self.ring, r.round_robin),
                })
            })
            .collect();
        json!({
            "name": self.name,
            "source": self.source,
            "runners": self.runners,
            "runners_using": self.runners_using,
            "module_kinds": self.module_kinds,
            "module_kinds_from": self.module_kinds_from,
            "ring_bytes": self.ring,
            "rows": rows,
        })
    }
}

/// All comparisons as one Markdown table, ratios first.
fn markdown(comparisons: &[Comparison]) -> String {
    let mut out = String::from(
        "| workload | policy | G | packed/lb | rr/lb | ring/packed | ring/rr | lower bound | packed | round-robin | ring(2) |\n\
         |---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n",
    );
    for c in comparisons {
        for r in &c.rows {
            out.push_str(&format!(
                "| {} | {} | {} | {:.3} | {:.3} | {:.2} | {:.2} | {} | {} | {} | {} |\n",
                c.name,
                r.policy,
                r.generations,
                r.packed_over_lower_bound(),
                r.round_robin_over_lower_bound(),
                byte_ratio(c.ring, r.packed),
                byte_ratio(c.ring, r.round_robin),
                human_bytes(r.lower_bound),
                human_bytes(r.packed),
                human_bytes(r.round_robin),
                human_bytes(c.ring)
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TINY: &str = r#"{
        "name": "tiny",
        "source": "hand-written",
        "runners": [
            {"name": "layer1.mlp.bwd", "requests": [
                {"domain": {"symmetric": "gtp"}, "dtype": "bf16", "elements": 4096,
                 "purpose": "wgrad_rs_input", "param": "l1.fc1"},
                {"domain": "device", "dtype": "f32", "elements": 100},
                {"domain": {"symmetric": "expert-gtp"}, "dtype": "bf16", "elements": 8,
                 "purpose": "wgrad_rs_input", "param": "l1.experts"}
            ]},
            {"name": "layer1.attn.bwd", "requests": []},
            {"name": "layer0.mlp.bwd", "requests": [
                {"domain": {"symmetric": "gtp"}, "dtype": "bf16", "elements": 4096,
                 "purpose": "wgrad_rs_input", "param": "l1.fc1"},
                {"domain": {"symmetric": "gtp"}, "dtype": "bf16", "elements": 4096,
                 "purpose": "wgrad_rs_input", "param": "l1.fc1"}
            ]}
        ]
    }"#;

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_string).collect()
    }

    fn options(line: &str) -> Options {
        match Options::parse(&args(line)) {
            Ok(Command::Run(options)) => options,
            other => panic!("{line}: {other:?}"),
        }
    }

    fn parse_error(line: &str) -> String {
        Options::parse(&args(line)).expect_err(line)
    }

    /// TINY with `from` replaced by `to` (which must occur exactly once).
    fn tiny_with(from: &str, to: &str) -> String {
        assert_eq!(TINY.matches(from).count(), 1, "{from}");
        TINY.replacen(from, to, 1)
    }

    fn error_of(text: &str) -> String {
        Workload::parse(text)
            .expect_err("should not parse")
            .to_string()
    }

    // ---- command line ----

    #[test]
    fn a_policy_flag_selects_one_round_robin_report() {
        let o = options("w.json --generations 3");
        assert_eq!(o.mode, Mode::Single(Policy::Generations(3).into()));
        assert_eq!(o.format, Format::Text);
        assert_eq!(o.inputs, vec!["w.json".to_string()]);
    }

    #[test]
    fn packed_selects_the_packed_placement() {
        let o = options("--module-kinds 2 --packed - --json");
        assert_eq!(o.mode, Mode::Single(Policy::ModuleKinds(2).packed()));
        assert_eq!(o.format, Format::Json);
        assert_eq!(o.inputs, vec!["-".to_string()]);
        let o = options("a.json --overlap-depth 4 --packed");
        assert_eq!(o.mode, Mode::Single(Policy::OverlapDepth(4).packed()));
    }

    #[test]
    fn no_policy_means_compare() {
        assert_eq!(options("a.json b.json").mode, Mode::Compare);
        let o = options("--compare --markdown a.json");
        assert_eq!((o.mode, o.format), (Mode::Compare, Format::Markdown));
    }

    #[test]
    fn help_is_a_command() {
        assert_eq!(Options::parse(&args("a.json --help")), Ok(Command::Help));
    }

    #[test]
    fn bad_command_lines_are_refused_with_a_reason() {
        assert!(parse_error("a.json --generations 0").contains("at least 1"));
        assert!(parse_error("a.json --generations x").contains("positive integer"));
        assert!(parse_error("a.json --generations").contains("needs a value"));
        assert!(parse_error("a.json --generations 2 --module-kinds 2").contains("one policy"));
        assert!(parse_error("a.json --packed").contains("needs a policy"));
        assert!(parse_error("a.json --compare --generations 2").contains("--compare"));
        assert!(parse_error("a.json --frobnicate").contains("unknown option --frobnicate"));
        assert!(parse_error("--compare").contains("no workload file"));
        assert!(parse_error("- -").contains("only once"));
        assert!(parse_error("a.json --json --markdown").contains("exclude"));
        assert!(parse_error("a.json --generations 2 --markdown").contains("--compare"));
    }

    // ---- workload files ----

    #[test]
    fn groups_and_params_are_numbered_by_first_appearance() {
        let w = Workload::parse(TINY).unwrap();
        assert_eq!(w.name, "tiny");
        assert_eq!(w.source.as_deref(), Some("hand-written"));
        assert_eq!(w.groups, vec!["gtp".to_string(), "expert-gtp".to_string()]);
        assert_eq!(
            w.params,
            vec!["l1.fc1".to_string(), "l1.experts".to_string()]
        );
        let first = &w.runners[0].requests;
        assert_eq!(first[0].domain, Domain::Symmetric(GroupId(0)));
        assert_eq!(first[0].param, Some(ParamId(0)));
        assert_eq!(first[2].domain, Domain::Symmetric(GroupId(1)));
        assert_eq!(first[2].param, Some(ParamId(1)));
        assert_eq!(w.runners[2].requests[1].param, Some(ParamId(0)));
    }

    #[test]
    fn purpose_defaults_to_other_and_param_to_none() {
        let w = Workload::parse(TINY).unwrap();
        let r = w.runners[0].requests[1];
        assert_eq!(r, Request::new(Domain::Device, DType::F32, 100));
        assert_eq!(r.purpose, Purpose::Other);
        assert_eq!(r.param, None);
    }

    #[test]
    fn runners_are_discovered_in_file_order_and_empty_ones_use_nothing() {
        let w = Workload::parse(TINY).unwrap();
        let planned = w.plan(Policy::Generations(2).into()).unwrap();
        let ids: Vec<RunnerId> = planned.runners().collect();
        assert_eq!(ids, vec![RunnerId(0), RunnerId(1), RunnerId(2)]);
        assert_eq!(planned.generation_of(RunnerId(0)), Some(0));
        assert_eq!(planned.generation_of(RunnerId(1)), None);
        assert_eq!(planned.generation_of(RunnerId(2)), Some(1));
    }

    #[test]
    fn symmetric_groups_are_reported_by_name() {
        let w = Workload::parse(TINY).unwrap();
        let report = w.plan(Policy::Generations(1).into()).unwrap().report();
        let names: Vec<&str> = report.keys.iter().map(|k| k.name.as_str()).collect();
        assert!(names.contains(&"bf16 in symmetric(gtp)"), "{names:?}");
        assert!(
            names.contains(&"bf16 in symmetric(expert-gtp)"),
            "{names:?}"
        );
        let text = report_text("tiny.json", &w, &report);
        assert!(text.contains("symmetric(expert-gtp)"), "{text}");
        assert!(text.contains("2 layer0.mlp.bwd"), "{text}");
    }

    #[test]
    fn a_repeated_param_in_one_runner_gets_two_slices_and_two_ring_slots() {
        let w = Workload::parse(TINY).unwrap();
        let report = w.plan(Policy::Generations(1).into()).unwrap().report();
        let gtp = report
            .keys
            .iter()
            .find(|k| k.name == "bf16 in symmetric(gtp)")
            .unwrap();
        // Runner 2 writes l1.fc1 twice: 2 x 8192 bytes (4096-aligned).
        assert_eq!(gtp.lower_bound, 2 * 8192);
        // Three writers of l1.fc1 of one size; the ring keeps min(2, 3) slots.
        assert_eq!(gtp.ring_bytes, 2 * 8192);
    }

    #[test]
    fn unknown_dtype_names_its_path() {
        let text = tiny_with(r#""elements": 100"#, r#""elements": 100, "dtype": "bf17""#);
        // Duplicate keys: serde_json keeps the last, so the request has dtype bf17.
        assert_eq!(
            error_of(&text),
            "runners[0].requests[1].dtype: unknown dtype \"bf17\" (expected one of: f64, f32, \
             f16, bf16, f8e4m3, f8e5m2, i64, i32, i8, u8)"
        );
    }

    #[test]
    fn unknown_purpose_names_its_path() {
        // Duplicate keys: serde_json keeps the last.
        let text = tiny_with(
            r#""param": "l1.experts""#,
            r#""param": "l1.experts", "purpose": "wgrad""#,
        );
        let e = error_of(&text);
        assert!(
            e.starts_with("runners[0].requests[2].purpose: unknown purpose \"wgrad\""),
            "{e}"
        );
    }

    #[test]
    fn unknown_domain_names_its_path() {
        let text = tiny_with(r#""domain": "device""#, r#""domain": "host""#);
        let e = error_of(&text);
        assert!(
            e.starts_with("runners[0].requests[1].domain: unknown domain \"host\""),
            "{e}"
        );
        let text = tiny_with(r#""domain": "device""#, r#""domain": 3"#);
        let e = error_of(&text);
        assert!(
            e.starts_with("runners[0].requests[1].domain: expected \"device\""),
            "{e}"
        );
        assert!(e.ends_with("found a number"), "{e}");
    }

    #[test]
    fn bad_symmetric_groups_name_their_path() {
        let text = tiny_with(r#"{"symmetric": "expert-gtp"}"#, r#"{"symmetric": ""}"#);
        assert_eq!(
            error_of(&text),
            "runners[0].requests[2].domain.symmetric: must not be empty"
        );
        let text = tiny_with(r#"{"symmetric": "expert-gtp"}"#, r#"{"group": "x"}"#);
        assert!(error_of(&text).starts_with("runners[0].requests[2].domain.group: unknown field"));
        let text = tiny_with(r#"{"symmetric": "expert-gtp"}"#, r#"{}"#);
        assert_eq!(
            error_of(&text),
            "runners[0].requests[2].domain.symmetric: missing"
        );
    }

    #[test]
    fn bad_element_counts_name_their_path() {
        let at = |v: &str| {
            error_of(&tiny_with(
                r#""elements": 100"#,
                &format!(r#""elements": {v}"#),
            ))
        };
        assert_eq!(
            at("0"),
            "runners[0].requests[1].elements: must be at least 1"
        );
        assert_eq!(
            at("-3"),
            "runners[0].requests[1].elements: expected a positive integer, found -3"
        );
        assert_eq!(
            at("1.5"),
            "runners[0].requests[1].elements: expected a positive integer, found 1.5"
        );
        assert_eq!(
            at("\"100\""),
            "runners[0].requests[1].elements: expected a positive integer, found a string"
        );
        assert_eq!(
            at("18446744073709551615"),
            "runners[0].requests[1].elements: 18446744073709551615 elements of f32 overflow a \
             64-bit byte count"
        );
    }

    #[test]
    fn capacity_overflow_names_the_request_that_tips_it() {
        // Each request alone fits in u64; their sum per key does not.
        let big = u64::MAX / 4 / 2 + 1;
        let text = format!(
            r#"{{"name": "big", "runners": [{{"name": "r", "requests": [
                {{"domain": "device", "dtype": "f32", "elements": {big}}},
                {{"domain": "device", "dtype": "f32", "elements": {big}}}]}}]}}"#
        );
        let e = error_of(&text);
        assert!(
            e.starts_with("runners[0].requests[1]: capacity of runner 0"),
            "{e}"
        );
    }

    #[test]
    fn missing_and_mistyped_fields_name_their_path() {
        assert_eq!(
            error_of(&tiny_with(r#""name": "tiny","#, "")),
            "name: missing"
        );
        assert_eq!(
            error_of(&tiny_with(r#""name": "layer1.attn.bwd", "#, "")),
            "runners[1].name: missing"
        );
        assert_eq!(
            error_of(&tiny_with(r#""name": "tiny""#, r#""name": 7"#)),
            "name: expected a string, found a number"
        );
        assert_eq!(
            error_of(r#"{"name": "x", "runners": {}}"#),
            "runners: expected an array, found an object"
        );
        assert_eq!(
            error_of(r#"{"name": "x", "runners": []}"#),
            "runners: must list at least one runner"
        );
        assert_eq!(
            error_of(r#"{"name": "x", "runners": [{"name": "a", "requests": 1}]}"#),
            "runners[0].requests: expected an array, found a number"
        );
        assert_eq!(
            error_of(r#"{"name": "x", "runners": [{"name": "a", "requests": [[]]}]}"#),
            "runners[0].requests[0]: expected an object, found an array"
        );
        assert_eq!(
            error_of("[1, 2]"),
            "expected the workload to be an object, found an array"
        );
        assert_eq!(
            error_of(r#"{"name": "x", "module_kinds": 0, "runners": []}"#),
            "module_kinds: must be at least 1"
        );
    }

    #[test]
    fn misspelt_fields_are_errors_not_silently_dropped() {
        let e = error_of(&tiny_with(
            r#""elements": 100"#,
            r#""elements": 100, "purpse": "other""#,
        ));
        assert!(e.starts_with("runners[0].requests[1].purpse: unknown field (expected one of: domain, dtype, elements, purpose, param)"), "{e}");
        let e = error_of(&tiny_with(r#""source""#, r#""sauce""#));
        assert!(e.starts_with("sauce: unknown field"), "{e}");
    }

    #[test]
    fn duplicate_runner_names_point_at_both() {
        let e = error_of(&tiny_with(r#""layer0.mlp.bwd""#, r#""layer1.mlp.bwd""#));
        assert_eq!(
            e,
            "runners[2].name: duplicate runner name \"layer1.mlp.bwd\" (also runners[0])"
        );
    }

    #[test]
    fn invalid_json_says_where() {
        let e = error_of(r#"{"name": "x", "runners": [}"#);
        assert!(e.starts_with("invalid JSON: "), "{e}");
        assert!(e.contains("line 1 column"), "{e}");
    }

    #[test]
    fn module_kinds_come_from_the_file_or_from_masked_runner_names() {
        let w = Workload::parse(TINY).unwrap();
        assert_eq!(w.module_kinds(), (2, "runner names"));
        let w = Workload::parse(&tiny_with(
            r#""source": "hand-written","#,
            r#""module_kinds": 5,"#,
        ))
        .unwrap();
        assert_eq!(w.module_kinds(), (5, "file"));
        assert_eq!(mask_digits("layer12.mlp3.bwd"), "layer#.mlp#.bwd");
    }

    // ---- output ----

    #[test]
    fn report_json_carries_names_sizes_and_ratios() {
        let w = Workload::parse(TINY).unwrap();
        let report = w.plan(Policy::Generations(2).packed()).unwrap().report();
        let v = report_json("tiny.json", &w, &report);
        assert_eq!(v["placement"], "packed");
        assert_eq!(v["policy"], "Generations(2)");
        assert_eq!(v["workload"]["file"], "tiny.json");
        assert_eq!(v["groups"], json!(["gtp", "expert-gtp"]));
        assert_eq!(v["runners"][2]["name"], "layer0.mlp.bwd");
        assert_eq!(v["runners"][1]["slices"], json!([]));
        assert_eq!(v["plan_bytes"], report.plan_bytes);
        assert_eq!(v["packed_bytes"], report.plan_bytes);
        let gtp = v["keys"]
            .as_array()
            .unwrap()
            .iter()
            .find(|k| k["name"] == "bf16 in symmetric(gtp)")
            .unwrap();
        assert_eq!(gtp["domain"], json!({"symmetric": "gtp"}));
        assert_eq!(gtp["lower_bound"], 3 * 8192);
        assert_eq!(v["ratios"]["packed_over_lower_bound"], 1.0);
        // It is plain JSON: it survives a round trip through text.
        let text = serde_json::to_string(&v).unwrap();
        assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), v);
    }

    #[test]
    fn comparison_rows_cover_three_counts_and_the_module_kinds_rule() {
        let w = Workload::parse(TINY).unwrap();
        let c = Comparison::of(&w).unwrap();
        let policies: Vec<Policy> = c.rows.iter().map(|r| r.policy).collect();
        assert_eq!(
            policies,
            vec![
                Policy::Generations(1),
                Policy::Generations(2),
                Policy::Generations(3),
                Policy::ModuleKinds(2)
            ]
        );
        // Two runners use buffers, so G = 3 is capped at 2.
        let gens: Vec<usize> = c.rows.iter().map(|r| r.generations).collect();
        assert_eq!(gens, vec![1, 2, 2, 2]);
        assert_eq!(c.runners_using, 2);
        let v = c.json();
        assert_eq!(v["rows"][3]["policy"], "ModuleKinds(2)");
        assert_eq!(v["module_kinds_from"], "runner names");
        let md = markdown(&[c]);
        assert_eq!(md.lines().count(), 2 + 4, "{md}");
        assert!(md.contains("| tiny | ModuleKinds(2) | 2 |"), "{md}");
    }

    // ---- bundled workloads ----

    fn bundled() -> Vec<(String, Workload)> {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/workloads");
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "json") {
                let text = std::fs::read_to_string(&path).unwrap();
                let w =
                    Workload::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
                out.push((stem, w));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    fn by_name<'w>(all: &'w [(String, Workload)], name: &str) -> &'w Workload {
        &all.iter().find(|(n, _)| n == name).unwrap().1
    }

    #[test]
    fn bundled_workloads_parse_and_name_their_source() {
        let all = bundled();
        let names: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            vec![
                "deepseek-v3-mtp",
                "gpt3-175b-per-module",
                "gpt3-175b-whole-layer",
                "mixtral-8x7b-per-module"
            ]
        );
        let readme = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/examples/workloads/README.md"
        ))
        .unwrap();
        for (stem, w) in &all {
            assert_eq!(&w.name, stem);
            assert!(w.source.as_ref().is_some_and(|s| s.len() > 40), "{stem}");
            assert!(w.module_kinds.is_some(), "{stem}");
            assert!(
                readme.contains(&format!("{stem}.json")),
                "README misses {stem}"
            );
        }
    }

    #[test]
    fn bundled_workloads_mix_every_purpose() {
        for (stem, w) in bundled() {
            let purposes: BTreeSet<Purpose> = w
                .runners
                .iter()
                .flat_map(|r| r.requests.iter().map(|q| q.purpose))
                .collect();
            for p in [
                Purpose::WgradRsInput,
                Purpose::RsOutput,
                Purpose::Fp32RsScratch,
                Purpose::Fp32AccumScratch,
            ] {
                assert!(purposes.contains(&p), "{stem} has no {p}");
            }
        }
    }

    #[test]
    fn gpt_whole_layer_and_per_module_request_the_same_bytes() {
        let all = bundled();
        let total = |w: &Workload| -> u64 {
            w.runners
                .iter()
                .flat_map(|r| &r.requests)
                .map(|q| q.aligned_bytes().unwrap())
                .sum()
        };
        let whole = by_name(&all, "gpt3-175b-whole-layer");
        let per_module = by_name(&all, "gpt3-175b-per-module");
        assert_eq!(total(whole), total(per_module));
        assert_eq!(per_module.runners.len(), 2 * whole.runners.len());
        assert_eq!(whole.module_kinds, Some(1));
        assert_eq!(per_module.module_kinds, Some(2));
    }

    #[test]
    fn moe_workload_has_period_three_and_two_groups() {
        let all = bundled();
        let w = by_name(&all, "mixtral-8x7b-per-module");
        assert_eq!(w.groups, vec!["expert-gtp".to_string(), "gtp".to_string()]);
        let kinds: Vec<String> = w.runners.iter().map(|r| mask_digits(&r.name)).collect();
        for (i, k) in kinds.iter().enumerate().skip(3) {
            assert_eq!(k, &kinds[i - 3]);
        }
        assert_eq!(kinds.iter().collect::<BTreeSet<_>>().len(), 3);
        // Expert wgrads go to the expert group only.
        for r in w.runners.iter().filter(|r| r.name.contains("experts")) {
            for q in r
                .requests
                .iter()
                .filter(|q| q.purpose == Purpose::WgradRsInput)
            {
                assert_eq!(q.domain, Domain::Symmetric(GroupId(0)), "{}", r.name);
            }
        }
    }

    #[test]
    fn mtp_workload_repeats_a_param_in_one_runner() {
        let all = bundled();
        let w = by_name(&all, "deepseek-v3-mtp");
        let first = &w.runners[0].requests;
        let wgrads: Vec<ParamId> = first
            .iter()
            .filter(|q| q.purpose == Purpose::WgradRsInput)
            .filter_map(|q| q.param)
            .collect();
        let distinct: BTreeSet<ParamId> = wgrads.iter().copied().collect();
        assert!(distinct.len() < wgrads.len(), "no repeated wgrad param");
    }

    #[test]
    fn packed_is_within_five_percent_of_the_lower_bound_but_where_that_is_unreachable() {
        for (stem, w) in bundled() {
            let c = Comparison::of(&w).unwrap();
            for r in c.rows.iter().filter(|r| r.packed_over_lower_bound() > 1.05) {
                // The one exception allowed: G = 3 over runners alternating
                // between capacities 2a and a, where no layout beats 6a =
                // round-robin while the lower bound is 5a (proven in
                // src/placement.rs). Every key must follow that pattern.
                assert_eq!(r.generations, 3, "{stem} {}", r.policy);
                assert_eq!(r.packed, r.round_robin, "{stem} {}", r.policy);
                let keys: BTreeSet<Key> = w
                    .runners
                    .iter()
                    .flat_map(|x| x.requests.iter().map(|q| q.key()))
                    .collect();
                for key in keys {
                    let caps: Vec<u64> = w
                        .runners
                        .iter()
                        .map(|x| {
                            x.requests
                                .iter()
                                .filter(|q| q.key() == key)
                                .map(|q| q.aligned_bytes().unwrap())
                                .sum()
                        })
                        .collect();
                    let (big, small) = (caps[0], caps[1]);
                    let ratio = big as f64 / small as f64;
                    assert!((1.99..=2.01).contains(&ratio), "{stem} {key}: {caps:?}");
                    for (i, &cap) in caps.iter().enumerate() {
                        assert_eq!(cap, if i % 2 == 0 { big } else { small }, "{stem} {key}");
                    }
                }
            }
        }
    }

    #[test]
    fn bundled_comparisons_keep_lower_bound_le_packed_le_round_robin() {
        for (stem, w) in bundled() {
            let c = Comparison::of(&w).unwrap();
            for r in &c.rows {
                assert!(r.lower_bound <= r.packed, "{stem} {}", r.policy);
                assert!(r.packed <= r.round_robin, "{stem} {}", r.policy);
                // The report's packed figure is what a packed plan allocates.
                let report = w.plan(r.policy.into()).unwrap().report();
                assert_eq!(report.packed_bytes, r.packed, "{stem} {}", r.policy);
            }
        }
    }
}
