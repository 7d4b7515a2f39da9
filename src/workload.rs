//! Recorded discovery as data: the workload file format (feature `serde`).

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::io::{Read, Write};

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use crate::discover::{ArmedRunner, Discovering, PlanConfig};
use crate::error::Error;
use crate::vocab::names;
use crate::vocab::{
    BucketId, DType, Domain, GroupId, HandoffId, ParamId, Purpose, Request, RunnerId,
};

/// A workload file: the runners one eager backward discovered, in capture
/// order, with everything a plan needs (feature `serde`).
///
/// Runners keep their names and ids, requests their purpose and parameter,
/// and the symmetric groups their names. Save what a run discovered on the training
/// cluster with [`Workload::from_discovering`] and [`Workload::to_json`]; load
/// it anywhere with [`Workload::from_json_str`] or [`Workload::from_reader`]
/// and plan it with [`Workload::to_discovering`]:
///
/// ```
/// use replay_arena::{
///     DType, Discovering, Domain, GroupId, PlanConfig, Policy, Request, RunnerId, Workload,
/// };
///
/// // On the cluster: discovery as usual, then saved.
/// let config = PlanConfig::new().with_group(GroupId(0), "gtp")?;
/// let mut discovery = Discovering::new(config);
/// discovery
///     .arm_named(RunnerId(0), "layer1.mlp.bwd")?
///     .record(Request::new(Domain::Symmetric(GroupId(0)), DType::BF16, 4096))?;
/// let text = Workload::from_discovering("tiny", &discovery)?.to_json()?;
///
/// // On a laptop: loaded and planned, with every discovery check applied again.
/// let loaded = Workload::from_json_str(&text)?.to_discovering()?;
/// assert_eq!(loaded, discovery);
/// let planned = loaded.plan(Policy::Generations(2))?;
/// assert_eq!(planned.total_bytes(), 8192);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// Reading checks the shape of the JSON (unknown and duplicate fields are
/// errors); [`Workload::to_discovering`] checks the rest (empty or duplicate
/// names, unknown groups, zero elements, sizes that overflow) and arms every
/// runner through the public discovery API, so a loaded workload passes the
/// same checks as a live run. Every error names the JSON path of the problem,
/// such as `runners[3].requests[0].dtype`. The format is described in
/// `docs/workload-format.md`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// A short name for reports (`gpt3-175b-per-module`). Not empty.
    pub name: String,
    /// Where the shapes come from, for people. Not empty when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// How many local-graph module kinds the model graphs, for
    /// [`Policy::ModuleKinds`](crate::Policy::ModuleKinds). At least 1 when
    /// given.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "count::optional"
    )]
    pub module_kinds: Option<usize>,
    /// The symmetric groups, registered in this order. Without it, every group
    /// a request or a handoff names is registered on first appearance as
    /// `GroupId(0)`, `GroupId(1)`, ...
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "object::optional_list"
    )]
    pub groups: Option<Vec<GroupSpec>>,
    /// The shape buckets ([`Discovering::bucket`]), by name, declared in
    /// this order (bucket `i` is `BucketId(i)`); each runner then names its
    /// own. Without it, every runner is in the one bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buckets: Option<Vec<String>>,
    /// The runners in capture order. At least one.
    #[serde(deserialize_with = "object::list")]
    pub runners: Vec<RunnerSpec>,
}

/// One symmetric group of [`Workload::groups`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupSpec {
    /// Its id; without it, its position in the list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u32>,
    /// Its name, which requests use. Not empty; unique in the file.
    pub name: String,
}

/// One runner of [`Workload::runners`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunnerSpec {
    /// Its id; without it, its position in the list (runner `i` is
    /// `RunnerId(i)`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u32>,
    /// Its name (`layer47.mlp.bwd`), if it has one. Not empty; unique in the
    /// file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The name of its bucket in [`Workload::buckets`]; required where the
    /// workload lists buckets, refused where it does not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<String>,
    /// What it requested, in order. May be empty: a runner that requests
    /// nothing gets no generation.
    #[serde(deserialize_with = "object::list")]
    pub requests: Vec<RequestSpec>,
    /// The handoffs it reads, by id (declared by an earlier runner's
    /// `hand_off`; ids count from 0 in file order).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub receive: Vec<u32>,
    /// The handoffs it writes, in order
    /// ([`ArmedRunner::hand_off`](crate::ArmedRunner::hand_off)).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hand_off: Vec<RequestSpec>,
}

/// One request of [`RunnerSpec::requests`]: a [`Request`] whose group and
/// parameter may be given by name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestSpec {
    /// Where the memory comes from.
    pub domain: DomainSpec,
    /// Element type, by [`DType::name`].
    pub dtype: DType,
    /// Number of elements. At least 1 (0 is refused when the file is
    /// read, with its line and column).
    #[serde(
        serialize_with = "count::serialize",
        deserialize_with = "count::at_least_one"
    )]
    pub elements: u64,
    /// What the buffer is for, by [`Purpose::name`]; `other` when left out.
    #[serde(default, skip_serializing_if = "is_other")]
    pub purpose: Purpose,
    /// The parameter the buffer belongs to, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub param: Option<ParamRef>,
}

/// [`Domain`] with the group given by name: `"device"` or `{"symmetric":
/// "gtp"}` in JSON.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum DomainSpec {
    /// [`Domain::Device`].
    Device,
    /// [`Domain::Symmetric`] of the group of this name.
    Symmetric(String),
}

/// A parameter, by name (`"l47.mlp.fc1"`) or by [`ParamId`] number (`17`).
///
/// Names get ids in order of first appearance, skipping every number the
/// file uses (in requests and handoffs alike), so named and numbered
/// parameters never collide.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ParamRef {
    /// A parameter name. Not empty.
    Name(String),
    /// A [`ParamId`] as a number.
    Id(u64),
}

/// Why a workload could not be read, checked, turned into discovery or
/// written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkloadError {
    /// The text is not JSON.
    #[error("invalid JSON: {message}")]
    Syntax {
        /// What the JSON parser said, with line and column.
        message: String,
    },
    /// The JSON does not have the workload's shape: a field is unknown,
    /// missing, given twice or of the wrong type.
    #[error("{}{message}", path_prefix(path))]
    Shape {
        /// JSON path of the problem (`runners[3].requests[0].dtype`); empty
        /// for the file as a whole.
        path: String,
        /// What is wrong, with line and column.
        message: String,
    },
    /// A value has the right type but is not allowed there.
    #[error("{path}: {message}")]
    Invalid {
        /// JSON path of the value.
        path: String,
        /// What is wrong with it.
        message: String,
    },
    /// Two runners of the file have the same name.
    #[error("{path}: duplicate runner name {name:?} (also runners[{first}])")]
    DuplicateRunnerName {
        /// JSON path of the second name.
        path: String,
        /// The name.
        name: String,
        /// Position of the first runner with that name.
        first: usize,
    },
    /// Two groups of the file have the same name.
    #[error("{path}: duplicate group name {name:?} (also groups[{first}])")]
    DuplicateGroupName {
        /// JSON path of the second name.
        path: String,
        /// The name.
        name: String,
        /// Position of the first group with that name.
        first: usize,
    },
    /// A request names a group that the file's `groups` list lacks.
    #[error("{path}: unknown group {name:?} (groups: {known})")]
    UnknownGroup {
        /// JSON path of the group name.
        path: String,
        /// The name.
        name: String,
        /// The groups the file lists, comma-separated.
        known: String,
    },
    /// Discovery refused what the file asks for.
    #[error("{path}: {error}")]
    Discovery {
        /// JSON path of the runner, group or request.
        path: String,
        /// What discovery said.
        error: Box<Error>,
    },
    /// A [`Discovering`] to save has two runners of one name.
    #[error("{first} and {second} are both named {name:?}; a workload names runners uniquely")]
    RunnerNameTaken {
        /// The name.
        name: String,
        /// The first runner with that name, in capture order.
        first: RunnerId,
        /// The second.
        second: RunnerId,
    },
    /// A [`Discovering`] to save has two groups of one name.
    #[error(
        "{first} and {second} are both registered as {name:?}; a workload names groups uniquely"
    )]
    GroupNameTaken {
        /// The name.
        name: String,
        /// The group registered first.
        first: GroupId,
        /// The second.
        second: GroupId,
    },
    /// A [`Discovering`] to save has an empty runner or group name.
    #[error("{what} has an empty name; a workload needs names that are not empty")]
    EmptyName {
        /// The runner or group, as in "runner 3" or "group 1".
        what: String,
    },
    /// An error of a file's content ([`Workload::to_discovering`]'s checks)
    /// with the line and column of the value it names
    /// ([`WorkloadError::located`]).
    #[error("{error} at line {line} column {column}")]
    Located {
        /// The error.
        error: Box<WorkloadError>,
        /// Line of the value, from 1.
        line: usize,
        /// Column of the value, from 1.
        column: usize,
    },
    /// Reading the input failed.
    #[error("reading the workload failed: {0}")]
    Read(std::io::Error),
    /// Writing the JSON failed.
    #[error("writing the workload failed: {0}")]
    Write(std::io::Error),
}

impl WorkloadError {
    /// The JSON path the error names, if it names one.
    pub fn path(&self) -> Option<&str> {
        match self {
            WorkloadError::Shape { path, .. }
            | WorkloadError::Invalid { path, .. }
            | WorkloadError::DuplicateRunnerName { path, .. }
            | WorkloadError::DuplicateGroupName { path, .. }
            | WorkloadError::UnknownGroup { path, .. }
            | WorkloadError::Discovery { path, .. } => Some(path),
            WorkloadError::Located { error, .. } => error.path(),
            _ => None,
        }
    }

    /// The error with the line and column, in `text` (the JSON the workload
    /// was read from), of the value its path names: what a check of
    /// [`Workload::to_discovering`] finds has a path but no position, since
    /// the workload no longer holds its text. Errors that carry a position
    /// already (syntax and shape errors), or name no path found in `text`,
    /// are returned as they are.
    ///
    /// ```
    /// # #[cfg(feature = "serde")] {
    /// use replay_arena::Workload;
    /// let text = r#"{"name": "w", "runners": [
    ///     {"name": "a", "requests": []},
    ///     {"name": "a", "requests": []}]}"#;
    /// let error = Workload::from_json_str(text).unwrap().to_discovering().unwrap_err();
    /// assert_eq!(
    ///     error.located(text).to_string(),
    ///     "runners[1].name: duplicate runner name \"a\" (also runners[0]) at line 3 column 14"
    /// );
    /// # }
    /// ```
    pub fn located(self, text: &str) -> WorkloadError {
        if matches!(
            self,
            WorkloadError::Syntax { .. }
                | WorkloadError::Shape { .. }
                | WorkloadError::Located { .. }
        ) {
            return self;
        }
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        match self.path().and_then(|path| position::of(text, path)) {
            Some((line, column)) => WorkloadError::Located {
                error: Box::new(self),
                line,
                column,
            },
            None => self,
        }
    }
}

/// Where a JSON path's value starts in a JSON text.
mod position {
    /// `(line, column)`, both from 1, of the value at `path`
    /// (`runners[2].requests[0].elements`) in `text`; `None` when the text
    /// does not hold it. One pass over the text up to the value.
    pub(super) fn of(text: &str, path: &str) -> Option<(usize, usize)> {
        let bytes = text.as_bytes();
        let mut at = skip_space(bytes, 0);
        for segment in segments(path)? {
            at = match segment {
                Segment::Key(key) => member(bytes, at, key)?,
                Segment::Index(index) => element(bytes, at, index)?,
            };
        }
        let before = &text[..at];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        Some((line, column))
    }

    enum Segment<'p> {
        Key(&'p str),
        Index(usize),
    }

    fn segments(path: &str) -> Option<Vec<Segment<'_>>> {
        let mut out = Vec::new();
        for part in path.split('.').filter(|p| !p.is_empty()) {
            let (key, mut rest) = part.split_at(part.find('[').unwrap_or(part.len()));
            if !key.is_empty() {
                out.push(Segment::Key(key));
            }
            while let Some(close) = rest.find(']') {
                out.push(Segment::Index(rest.get(1..close)?.parse().ok()?));
                rest = &rest[close + 1..];
            }
        }
        Some(out)
    }

    fn skip_space(bytes: &[u8], mut at: usize) -> usize {
        while at < bytes.len() && bytes[at].is_ascii_whitespace() {
            at += 1;
        }
        at
    }

    /// The end of the string starting at `at` (its opening quote).
    fn string_end(bytes: &[u8], mut at: usize) -> Option<usize> {
        at += 1;
        while at < bytes.len() {
            match bytes[at] {
                b'\\' => at += 2,
                b'"' => return Some(at + 1),
                _ => at += 1,
            }
        }
        None
    }

    /// The end of the value starting at `at`.
    fn value_end(bytes: &[u8], at: usize) -> Option<usize> {
        match bytes.get(at)? {
            b'"' => string_end(bytes, at),
            b'{' | b'[' => {
                let mut depth = 0usize;
                let mut i = at;
                while i < bytes.len() {
                    match bytes[i] {
                        b'"' => {
                            i = string_end(bytes, i)?;
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                return Some(i + 1);
                            }
                        }
                        _ => {}
                    }
                    i += 1;
                }
                None
            }
            _ => {
                let mut i = at;
                while i < bytes.len() && !b",}] \t\r\n".contains(&bytes[i]) {
                    i += 1;
                }
                Some(i)
            }
        }
    }

    /// The start of member `key`'s value in the object at `at`.
    fn member(bytes: &[u8], at: usize, key: &str) -> Option<usize> {
        if bytes.get(at) != Some(&b'{') {
            return None;
        }
        let mut i = skip_space(bytes, at + 1);
        while bytes.get(i) == Some(&b'"') {
            let end = string_end(bytes, i)?;
            let name = &bytes[i + 1..end - 1];
            i = skip_space(bytes, end);
            if bytes.get(i) != Some(&b':') {
                return None;
            }
            let value = skip_space(bytes, i + 1);
            if name == key.as_bytes() {
                return Some(value);
            }
            i = skip_space(bytes, value_end(bytes, value)?);
            if bytes.get(i) == Some(&b',') {
                i = skip_space(bytes, i + 1);
            }
        }
        None
    }

    /// The start of element `index` of the array at `at`.
    fn element(bytes: &[u8], at: usize, index: usize) -> Option<usize> {
        if bytes.get(at) != Some(&b'[') {
            return None;
        }
        let mut i = skip_space(bytes, at + 1);
        for _ in 0..index {
            i = skip_space(bytes, value_end(bytes, i)?);
            if bytes.get(i) != Some(&b',') {
                return None;
            }
            i = skip_space(bytes, i + 1);
        }
        (bytes.get(i) != Some(&b']')).then_some(i)
    }
}

fn path_prefix(path: &str) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!("{path}: ")
    }
}

impl Workload {
    /// Reads a workload from JSON text. A leading byte-order mark is skipped;
    /// unknown or duplicate fields are errors naming their JSON path. Only
    /// the shape is checked here: [`Workload::to_discovering`] checks names,
    /// groups and sizes.
    pub fn from_json_str(text: &str) -> Result<Workload, WorkloadError> {
        Workload::from_json_slice(text.as_bytes())
    }

    /// Like [`Workload::from_json_str`], reading all of `reader` first.
    pub fn from_reader(mut reader: impl Read) -> Result<Workload, WorkloadError> {
        let mut bytes = Vec::new();
        reader
            .read_to_end(&mut bytes)
            .map_err(WorkloadError::Read)?;
        Workload::from_json_slice(&bytes)
    }

    fn from_json_slice(bytes: &[u8]) -> Result<Workload, WorkloadError> {
        let bytes = bytes.strip_prefix("\u{feff}".as_bytes()).unwrap_or(bytes);
        let mut de = serde_json::Deserializer::from_slice(bytes);
        let object::Object(workload) = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let path = e.path().to_string();
            shape_error(
                if path == "." { String::new() } else { path },
                e.into_inner(),
            )
        })?;
        de.end().map_err(|e| shape_error(String::new(), e))?;
        Ok(workload)
    }

    /// The workload as JSON text: top-level fields and runners one per line,
    /// each request on its own line.
    pub fn to_json(&self) -> Result<String, WorkloadError> {
        let mut out = Vec::new();
        self.to_writer(&mut out)?;
        String::from_utf8(out).map_err(|e| {
            WorkloadError::Write(std::io::Error::new(std::io::ErrorKind::InvalidData, e))
        })
    }

    /// The checks of the file as a whole that loading makes: a name, a
    /// source that is not empty, at least one module kind and one runner.
    fn check_top_level(&self) -> Result<(), WorkloadError> {
        non_empty(&self.name, || "name".into())?;
        if let Some(source) = &self.source {
            non_empty(source, || "source".into())?;
        }
        if self.module_kinds == Some(0) {
            return Err(invalid("module_kinds", "must be at least 1"));
        }
        if self.runners.is_empty() {
            return Err(invalid("runners", "must list at least one runner"));
        }
        Ok(())
    }

    /// Writes [`Workload::to_json`] to `writer`.
    ///
    /// # Errors
    ///
    /// What [`Workload::to_discovering`] would say of the file as a whole
    /// (an empty name or source, zero module kinds, no runner): a saved file
    /// always loads that far. [`WorkloadError::Write`] when writing fails.
    pub fn to_writer(&self, mut writer: impl Write) -> Result<(), WorkloadError> {
        self.check_top_level()?;
        let w = &mut writer;
        let io = |e: std::io::Error| WorkloadError::Write(e);
        w.write_all(b"{\n  \"name\": ").map_err(io)?;
        json_to(w, &self.name)?;
        if let Some(source) = &self.source {
            w.write_all(b",\n  \"source\": ").map_err(io)?;
            json_to(w, source)?;
        }
        if let Some(kinds) = self.module_kinds {
            write!(w, ",\n  \"module_kinds\": {kinds}").map_err(io)?;
        }
        if let Some(groups) = &self.groups {
            w.write_all(b",\n  \"groups\": ").map_err(io)?;
            json_to(w, groups)?;
        }
        if let Some(buckets) = &self.buckets {
            w.write_all(b",\n  \"buckets\": ").map_err(io)?;
            json_to(w, buckets)?;
        }
        w.write_all(b",\n  \"runners\": [").map_err(io)?;
        for (i, runner) in self.runners.iter().enumerate() {
            w.write_all(if i == 0 { b"\n    {" } else { b",\n    {" })
                .map_err(io)?;
            if let Some(id) = runner.id {
                write!(w, "\"id\": {id}, ").map_err(io)?;
            }
            if let Some(name) = &runner.name {
                w.write_all(b"\"name\": ").map_err(io)?;
                json_to(w, name)?;
                w.write_all(b", ").map_err(io)?;
            }
            if let Some(bucket) = &runner.bucket {
                w.write_all(b"\"bucket\": ").map_err(io)?;
                json_to(w, bucket)?;
                w.write_all(b", ").map_err(io)?;
            }
            w.write_all(b"\"requests\": [").map_err(io)?;
            for (j, request) in runner.requests.iter().enumerate() {
                w.write_all(if j == 0 { b"\n      " } else { b",\n      " })
                    .map_err(io)?;
                json_to(w, request)?;
            }
            if !runner.requests.is_empty() {
                w.write_all(b"\n    ").map_err(io)?;
            }
            w.write_all(b"]").map_err(io)?;
            if !runner.receive.is_empty() {
                w.write_all(b", \"receive\": ").map_err(io)?;
                json_to(w, &runner.receive)?;
            }
            if !runner.hand_off.is_empty() {
                w.write_all(b", \"hand_off\": ").map_err(io)?;
                json_to(w, &runner.hand_off)?;
            }
            w.write_all(b"}").map_err(io)?;
        }
        w.write_all(b"\n  ]\n}\n").map_err(io)
    }

    /// Saves what discovery recorded: every runner in capture order with its
    /// id (where it is not its position), its name and its requests, and
    /// every registered group. Parameters are saved as numbers.
    ///
    /// Fails when two runners or two groups share a name or a name is empty:
    /// the file refers to groups by name, and people read runners by name;
    /// and, as loading would, for an empty workload name or a discovery with
    /// no runner.
    pub fn from_discovering(
        name: impl Into<String>,
        discovery: &Discovering,
    ) -> Result<Workload, WorkloadError> {
        let config = discovery.config();
        let mut group_names: HashMap<&str, GroupId> = HashMap::new();
        let mut groups = Vec::new();
        for (i, (group, group_name)) in config.groups().enumerate() {
            if group_name.is_empty() {
                return Err(WorkloadError::EmptyName {
                    what: group.to_string(),
                });
            }
            if let Some(&first) = group_names.get(group_name) {
                return Err(WorkloadError::GroupNameTaken {
                    name: group_name.to_string(),
                    first,
                    second: group,
                });
            }
            group_names.insert(group_name, group);
            groups.push(GroupSpec {
                id: (u64::from(group.0) != i as u64).then_some(group.0),
                name: group_name.to_string(),
            });
        }
        let mut runner_names: HashMap<&str, RunnerId> = HashMap::new();
        let mut runners = Vec::new();
        let mut receives: HashMap<RunnerId, Vec<u32>> = HashMap::new();
        let mut hand_offs: HashMap<RunnerId, Vec<RequestSpec>> = HashMap::new();
        for (id, request, writer, readers) in discovery.handoffs() {
            hand_offs
                .entry(writer)
                .or_default()
                .push(RequestSpec::from_request(&request, config));
            for reader in readers {
                receives.entry(reader).or_default().push(id.0);
            }
        }
        let bucketed = !discovery.buckets.is_empty();
        let bucket_names: Vec<String> = discovery.buckets().map(|(_, n)| n.to_string()).collect();
        for (i, runner) in discovery.runners().enumerate() {
            let runner_name = discovery.runner_name(runner);
            if let Some(n) = runner_name {
                if n.is_empty() {
                    return Err(WorkloadError::EmptyName {
                        what: runner.to_string(),
                    });
                }
                if let Some(&first) = runner_names.get(n) {
                    return Err(WorkloadError::RunnerNameTaken {
                        name: n.to_string(),
                        first,
                        second: runner,
                    });
                }
                runner_names.insert(n, runner);
            }
            let requests = discovery
                .requests(runner)
                .unwrap_or_default()
                .iter()
                .map(|r| RequestSpec::from_request(r, config))
                .collect();
            let bucket = discovery.bucket_of(runner).unwrap_or_default();
            runners.push(RunnerSpec {
                id: (u64::from(runner.0) != i as u64).then_some(runner.0),
                name: runner_name.map(str::to_string),
                bucket: bucketed.then(|| bucket_names[bucket.0 as usize].clone()),
                requests,
                receive: receives.remove(&runner).unwrap_or_default(),
                hand_off: hand_offs.remove(&runner).unwrap_or_default(),
            });
        }
        let workload = Workload {
            name: name.into(),
            source: None,
            module_kinds: None,
            groups: (!groups.is_empty()).then_some(groups),
            buckets: bucketed.then_some(bucket_names),
            runners,
        };
        // What loading would refuse (no runner, an empty name) is refused
        // here, with the same error.
        workload.check_top_level()?;
        Ok(workload)
    }

    /// Checks the workload and replays it as discovery: the groups are
    /// registered, then runner `i` is armed (with its name) and records its
    /// requests in order, through the same API an eager backward uses, so
    /// every discovery check applies. Errors name the JSON path of the
    /// problem. Linear in the size of the workload.
    pub fn to_discovering(&self) -> Result<Discovering, WorkloadError> {
        self.check_top_level()?;
        let groups = self.group_table()?;
        let mut discovery = Discovering::new(groups.config()?);
        let buckets = self.declare_buckets(&mut discovery)?;
        let mut params = ParamTable::new(self);
        let mut names: HashMap<&str, usize> = HashMap::with_capacity(self.runners.len());
        for (i, runner) in self.runners.iter().enumerate() {
            let bucket = self.bucket_of(runner, i, &buckets)?;
            let mut armed = arm(&mut discovery, runner, i, bucket, &mut names)?;
            record_all(&mut armed, runner, i, &groups, &mut params)?;
        }
        Ok(discovery)
    }

    /// Declares the workload's buckets in order, checked, with a name lookup.
    fn declare_buckets(
        &self,
        discovery: &mut Discovering,
    ) -> Result<HashMap<&str, BucketId>, WorkloadError> {
        let mut buckets = HashMap::new();
        for (i, name) in self.buckets.iter().flatten().enumerate() {
            non_empty(name, || format!("buckets[{i}]"))?;
            let id = discovery
                .bucket(name.as_str())
                .map_err(|e| discovery_error(format!("buckets[{i}]"), e))?;
            buckets.insert(name.as_str(), id);
        }
        Ok(buckets)
    }

    /// The bucket runner `i` names: required where the workload lists
    /// buckets, refused where it does not.
    fn bucket_of(
        &self,
        runner: &RunnerSpec,
        i: usize,
        buckets: &HashMap<&str, BucketId>,
    ) -> Result<BucketId, WorkloadError> {
        match (&runner.bucket, &self.buckets) {
            (None, None) => Ok(BucketId(0)),
            (Some(name), Some(_)) => buckets.get(name.as_str()).copied().ok_or_else(|| {
                invalid(
                    format!("runners[{i}].bucket"),
                    format!("names bucket {name:?}, which `buckets` does not list"),
                )
            }),
            (None, Some(_)) => Err(invalid(
                format!("runners[{i}]"),
                "the workload lists buckets: name this runner's `bucket`",
            )),
            (Some(_), None) => Err(invalid(
                format!("runners[{i}].bucket"),
                "names a bucket, but the workload lists no `buckets`",
            )),
        }
    }

    /// The groups to register, checked, with a name lookup.
    fn group_table(&self) -> Result<GroupTable<'_>, WorkloadError> {
        let mut table = GroupTable {
            listed: self.groups.is_some(),
            order: Vec::new(),
            by_name: HashMap::new(),
        };
        match &self.groups {
            Some(groups) => table.list(groups)?,
            None => {
                // Every group a request or a handoff names, in the order
                // discovery records them.
                let named = self
                    .request_specs()
                    .filter_map(|(i, list, j, q)| match &q.domain {
                        DomainSpec::Symmetric(name) => Some((i, list, j, name)),
                        DomainSpec::Device => None,
                    });
                for (i, list, j, name) in named {
                    if !table.by_name.contains_key(name.as_str()) {
                        table.register(name, || format!("{}.domain.symmetric", list.path(i, j)))?;
                    }
                }
            }
        }
        Ok(table)
    }

    /// Every request and handoff of the workload, as (runner, list,
    /// position in the list, spec), in the order discovery records them.
    fn request_specs(&self) -> impl Iterator<Item = (usize, List, usize, &RequestSpec)> {
        self.runners
            .iter()
            .enumerate()
            .flat_map(|(i, r)| r.specs().map(move |(list, j, q)| (i, list, j, q)))
    }
}

/// Which list of a runner a request spec is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum List {
    /// `requests`: recorded.
    Requests,
    /// `hand_off`: handed off.
    HandOff,
}

impl List {
    /// The JSON path of spec `j` of this list of runner `i`.
    fn path(self, i: usize, j: usize) -> String {
        match self {
            List::Requests => format!("runners[{i}].requests[{j}]"),
            List::HandOff => format!("runners[{i}].hand_off[{j}]"),
        }
    }
}

impl RunnerSpec {
    /// Its requests, then its handoffs, as (list, position in it, spec).
    fn specs(&self) -> impl Iterator<Item = (List, usize, &RequestSpec)> {
        let requests = self.requests.iter().enumerate();
        let hand_offs = self.hand_off.iter().enumerate();
        requests
            .map(|(j, q)| (List::Requests, j, q))
            .chain(hand_offs.map(|(j, q)| (List::HandOff, j, q)))
    }
}

/// Arms runner `i` in `bucket`, with its id and its name (checked: not
/// empty, not taken by an earlier runner of `names`).
fn arm<'d, 'w>(
    discovery: &'d mut Discovering,
    runner: &'w RunnerSpec,
    i: usize,
    bucket: BucketId,
    names: &mut HashMap<&'w str, usize>,
) -> Result<ArmedRunner<'d>, WorkloadError> {
    // Paths are built only for errors: loading stays linear and lean.
    let path = || format!("runners[{i}]");
    let id = match runner.id {
        Some(id) => RunnerId(id),
        None => RunnerId(
            u32::try_from(i)
                .map_err(|_| invalid(path(), "more runners than RunnerId can number; give ids"))?,
        ),
    };
    match &runner.name {
        Some(name) => {
            non_empty(name, || format!("runners[{i}].name"))?;
            if let Some(first) = names.insert(name, i) {
                return Err(WorkloadError::DuplicateRunnerName {
                    path: format!("runners[{i}].name"),
                    name: name.clone(),
                    first,
                });
            }
            discovery.arm_named_in(bucket, id, name.as_str())
        }
        None => discovery.arm_in(bucket, id),
    }
    .map_err(|e| discovery_error(path(), e))
}

/// Runner `i`'s requests, then the handoffs it receives (declared by
/// earlier runners), then those it hands off.
fn record_all<'w>(
    armed: &mut ArmedRunner<'_>,
    runner: &'w RunnerSpec,
    i: usize,
    groups: &GroupTable<'_>,
    params: &mut ParamTable<'w>,
) -> Result<(), WorkloadError> {
    let mut received = false;
    for (list, j, spec) in runner.specs() {
        if list == List::HandOff && !received {
            receive_all(armed, runner, i)?;
            received = true;
        }
        let path = || list.path(i, j);
        let request = spec.to_request(&path, groups, params)?;
        let recorded = match list {
            List::HandOff => armed.hand_off(request).map(|_| ()),
            List::Requests => armed.record(request).map(|_| ()),
        };
        recorded.map_err(|e| discovery_error(path(), e))?;
    }
    if !received {
        receive_all(armed, runner, i)?;
    }
    Ok(())
}

/// Parameter names to ids: in order of first appearance, skipping every
/// number the workload uses (in requests and handoffs alike), so named and
/// numbered parameters never collide.
struct ParamTable<'w> {
    /// Every parameter the workload gives as a number.
    numbered: HashSet<u64>,
    /// The names seen so far, with their ids.
    interned: HashMap<&'w str, ParamId>,
    /// The least number a new name may get.
    next: u64,
}

impl<'w> ParamTable<'w> {
    fn new(workload: &'w Workload) -> ParamTable<'w> {
        let numbered = workload
            .request_specs()
            .filter_map(|(_, _, _, q)| match q.param {
                Some(ParamRef::Id(n)) => Some(n),
                _ => None,
            })
            .collect();
        ParamTable {
            numbered,
            interned: HashMap::with_capacity(workload.runners.len()),
            next: 0,
        }
    }

    /// The id of parameter `name`.
    fn id(&mut self, name: &'w str) -> ParamId {
        if let Some(&id) = self.interned.get(name) {
            return id;
        }
        while self.numbered.contains(&self.next) {
            self.next += 1;
        }
        let id = ParamId(self.next);
        self.next += 1;
        self.interned.insert(name, id);
        id
    }
}

/// Group names to ids, for one workload.
struct GroupTable<'w> {
    /// Whether the workload lists its groups (otherwise every name is known).
    listed: bool,
    /// Registration order.
    order: Vec<(&'w str, GroupId)>,
    /// Name to (position, id).
    by_name: HashMap<&'w str, (usize, GroupId)>,
}

impl<'w> GroupTable<'w> {
    /// Registers the workload's `groups` list in order: names not empty and
    /// unique, ids as given or by position.
    fn list(&mut self, groups: &'w [GroupSpec]) -> Result<(), WorkloadError> {
        for (i, group) in groups.iter().enumerate() {
            let path = format!("groups[{i}].name");
            non_empty(&group.name, || path.clone())?;
            let id = match group.id {
                Some(id) => GroupId(id),
                None => GroupId(
                    u32::try_from(i)
                        .map_err(|_| invalid(&path, "more groups than GroupId can number"))?,
                ),
            };
            if let Some((first, _)) = self.by_name.insert(&group.name, (i, id)) {
                return Err(WorkloadError::DuplicateGroupName {
                    path,
                    name: group.name.clone(),
                    first,
                });
            }
            self.order.push((&group.name, id));
        }
        Ok(())
    }

    /// Registers group `name` (not registered yet) as the next id; `path`
    /// gives the JSON path of the name.
    fn register(&mut self, name: &'w str, path: impl Fn() -> String) -> Result<(), WorkloadError> {
        non_empty(name, &path)?;
        let n = self.order.len();
        let id = GroupId(
            u32::try_from(n).map_err(|_| invalid(path(), "more groups than GroupId can number"))?,
        );
        self.by_name.insert(name, (n, id));
        self.order.push((name, id));
        Ok(())
    }

    /// A configuration with every group registered, in order.
    fn config(&self) -> Result<PlanConfig, WorkloadError> {
        let mut config = PlanConfig::new();
        for (i, (name, id)) in self.order.iter().enumerate() {
            config = config
                .with_group(*id, *name)
                .map_err(|e| discovery_error(format!("groups[{i}]"), e))?;
        }
        Ok(config)
    }
}

impl GroupTable<'_> {
    /// The id of group `name`; `path` gives the JSON path of the name.
    fn id(&self, name: &str, path: impl Fn() -> String) -> Result<GroupId, WorkloadError> {
        non_empty(name, &path)?;
        match self.by_name.get(name) {
            Some(&(_, id)) => Ok(id),
            None => Err(WorkloadError::UnknownGroup {
                path: path(),
                name: name.to_string(),
                known: if self.listed && self.order.is_empty() {
                    "none listed".to_string()
                } else {
                    let names: Vec<&str> = self.order.iter().map(|(n, _)| *n).collect();
                    names.join(", ")
                },
            }),
        }
    }
}

impl RequestSpec {
    /// The request this spec asks for; `path` gives its JSON path.
    fn to_request<'w>(
        &'w self,
        path: &impl Fn() -> String,
        groups: &GroupTable<'_>,
        params: &mut ParamTable<'w>,
    ) -> Result<Request, WorkloadError> {
        if self.elements == 0 {
            return Err(invalid(
                format!("{}.elements", path()),
                "must be at least 1",
            ));
        }
        let domain = match &self.domain {
            DomainSpec::Device => Domain::Device,
            DomainSpec::Symmetric(name) => {
                Domain::Symmetric(groups.id(name, || format!("{}.domain.symmetric", path()))?)
            }
        };
        let request = Request::new(domain, self.dtype, self.elements).purpose(self.purpose);
        Ok(match &self.param {
            None => request,
            Some(ParamRef::Id(n)) => request.param(ParamId(*n)),
            Some(ParamRef::Name(name)) => {
                non_empty(name, || format!("{}.param", path()))?;
                request.param(params.id(name))
            }
        })
    }

    /// The spec of a recorded request, naming its group as `config` does.
    fn from_request(request: &Request, config: &PlanConfig) -> RequestSpec {
        RequestSpec {
            domain: match request.domain {
                Domain::Device => DomainSpec::Device,
                Domain::Symmetric(group) => {
                    DomainSpec::Symmetric(config.group_name(group).unwrap_or_default().to_string())
                }
            },
            dtype: request.dtype,
            elements: request.elements,
            purpose: request.purpose,
            param: request.param.map(|p| ParamRef::Id(p.0)),
        }
    }
}

fn invalid(path: impl Into<String>, message: impl Into<String>) -> WorkloadError {
    WorkloadError::Invalid {
        path: path.into(),
        message: message.into(),
    }
}

fn non_empty(value: &str, path: impl FnOnce() -> String) -> Result<(), WorkloadError> {
    if value.is_empty() {
        Err(invalid(path(), "must not be empty"))
    } else {
        Ok(())
    }
}

/// Runner `i`'s receives, in order.
fn receive_all(
    armed: &mut ArmedRunner<'_>,
    runner: &RunnerSpec,
    i: usize,
) -> Result<(), WorkloadError> {
    for (n, &h) in runner.receive.iter().enumerate() {
        armed
            .receive(HandoffId(h))
            .map_err(|e| discovery_error(format!("runners[{i}].receive[{n}]"), e))?;
    }
    Ok(())
}

fn discovery_error(path: String, error: impl Into<Error>) -> WorkloadError {
    WorkloadError::Discovery {
        path,
        error: Box::new(error.into()),
    }
}

fn shape_error(path: String, error: serde_json::Error) -> WorkloadError {
    match error.classify() {
        serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
            WorkloadError::Syntax {
                message: error.to_string(),
            }
        }
        serde_json::error::Category::Io => WorkloadError::Read(error.into()),
        serde_json::error::Category::Data => WorkloadError::Shape {
            path,
            message: error.to_string(),
        },
    }
}

fn json_to(w: &mut impl Write, value: &impl Serialize) -> Result<(), WorkloadError> {
    serde_json::to_writer(w, value).map_err(|e| WorkloadError::Write(e.into()))
}

fn is_other(purpose: &Purpose) -> bool {
    *purpose == Purpose::Other
}

impl Serialize for DomainSpec {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            DomainSpec::Device => Domain::Device.serialize(serializer),
            DomainSpec::Symmetric(group) => names::serialize_symmetric(group, serializer),
        }
    }
}

impl<'de> Deserialize<'de> for DomainSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<DomainSpec, D::Error> {
        let group = names::deserialize_domain::<D, String>(deserializer, "GROUP")?;
        Ok(group.map_or(DomainSpec::Device, DomainSpec::Symmetric))
    }
}

impl Serialize for ParamRef {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            ParamRef::Name(name) => serializer.serialize_str(name),
            ParamRef::Id(id) => serializer.serialize_u64(*id),
        }
    }
}

impl<'de> Deserialize<'de> for ParamRef {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<ParamRef, D::Error> {
        struct ParamVisitor;

        impl Visitor<'_> for ParamVisitor {
            type Value = ParamRef;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a parameter name or a non-negative integer id")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<ParamRef, E> {
                Ok(ParamRef::Name(v.to_string()))
            }

            fn visit_string<E: de::Error>(self, v: String) -> Result<ParamRef, E> {
                Ok(ParamRef::Name(v))
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ParamRef, E> {
                Ok(ParamRef::Id(v))
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ParamRef, E> {
                Err(count::not_a_count(v, &self))
            }

            fn visit_f64<E: de::Error>(self, v: f64) -> Result<ParamRef, E> {
                Err(count::not_a_whole_count(v, &self))
            }
        }

        deserializer.deserialize_any(ParamVisitor)
    }
}

/// JSON objects only: derived struct impls also take arrays of field values,
/// which no workload file means.
mod object {
    use std::fmt;
    use std::marker::PhantomData;

    use serde::de::{value::MapAccessDeserializer, Deserialize, Deserializer, MapAccess, Visitor};

    /// A `T` read from a JSON object only.
    pub(super) struct Object<T>(pub(super) T);

    impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Object<T>, D::Error> {
            deserializer.deserialize_map(ObjectVisitor(PhantomData))
        }
    }

    struct ObjectVisitor<T>(PhantomData<T>);

    impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectVisitor<T> {
        type Value = Object<T>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an object")
        }

        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Object<T>, A::Error> {
            T::deserialize(MapAccessDeserializer::new(map)).map(Object)
        }
    }

    /// A list of objects.
    pub(super) fn list<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
    where
        D: Deserializer<'de>,
        T: Deserialize<'de>,
    {
        let objects = Vec::<Object<T>>::deserialize(deserializer)?;
        Ok(objects.into_iter().map(|Object(t)| t).collect())
    }

    /// An optional list of objects.
    pub(super) fn optional_list<'de, D, T>(deserializer: D) -> Result<Option<Vec<T>>, D::Error>
    where
        D: Deserializer<'de>,
        T: Deserialize<'de>,
    {
        list(deserializer).map(Some)
    }
}

/// Positive integers (`elements`, `module_kinds`) with messages that say what
/// was expected and print the value as written.
mod count {
    use std::fmt;

    use serde::de::{self, Deserializer, Expected, Visitor};
    use serde::Serializer;

    pub(super) fn serialize<S: Serializer>(v: &u64, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(*v)
    }

    /// A count of at least 1: 0 is refused where it is read, so the error
    /// carries the line and column of the value like every other one.
    pub(super) fn at_least_one<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<u64, D::Error> {
        match deserializer.deserialize_any(CountVisitor)? {
            0 => Err(de::Error::custom("must be at least 1, found 0")),
            n => Ok(n),
        }
    }

    pub(super) fn optional<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<usize>, D::Error> {
        let n = deserializer.deserialize_any(CountVisitor)?;
        usize::try_from(n).map(Some).map_err(|_| {
            de::Error::custom(format_args!("{n} does not fit in this machine's usize"))
        })
    }

    /// A negative integer where a count was expected.
    pub(super) fn not_a_count<E: de::Error>(v: i64, expected: &dyn Expected) -> E {
        E::custom(format_args!("expected {expected}, found {v}"))
    }

    /// A JSON number with a fraction or exponent, or one beyond `u64`.
    pub(super) fn not_a_whole_count<E: de::Error>(v: f64, expected: &dyn Expected) -> E {
        if v.fract() == 0.0 && v >= 18_446_744_073_709_551_616.0 {
            E::custom(format_args!(
                "expected {expected}, found a number of at least 2^64 (the most is {})",
                u64::MAX
            ))
        } else {
            E::custom(format_args!("expected {expected}, found {v}"))
        }
    }

    struct CountVisitor;

    impl Visitor<'_> for CountVisitor {
        type Value = u64;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a positive integer")
        }

        fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
            Ok(v)
        }

        fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
            Err(not_a_count(v, &self))
        }

        fn visit_f64<E: de::Error>(self, v: f64) -> Result<u64, E> {
            Err(not_a_whole_count(v, &self))
        }
    }
}
