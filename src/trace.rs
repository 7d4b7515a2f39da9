//! The fence's schedule as a timeline: every replay, consumer, step graph
//! launch and program wait of a plan as a use on its stream's lane, and
//! every wait the fence made (or skipped: stream order implied it) as an
//! edge from the use it waited for. [`Trace`] holds it as data and writes
//! it as a Chrome trace (Trace Event Format), which Perfetto
//! (<https://ui.perfetto.dev>) and Chrome's `about:tracing` open
//! (`docs/trace.md`).
//!
//! The fence tells an [`Observer`] what it does: a use begins (before its
//! waits), each wait made or skipped names the use it waited for (the id
//! the observer gave it, which every completion that use leaves carries),
//! two marks bracket its work on its stream, and it ends once enqueued.
//! A step graph launched while a trace runs also hands it a *node mark*
//! per node (an event its traced composition records after the node), so
//! that each replay and consumer inside the launch becomes a use of its
//! own, on its lane, with the launch as its parent ([`Trace::step_nodes`]).
//! [`Recorder`] is the observer
//! [`Replayable::start_trace`](crate::Replayable::start_trace) installs:
//! it takes the marks from the backend's [`Timing`] and reads their times
//! when the trace is finished.

use std::fmt::Write as _;
use std::path::Path;

use crate::backend::{BackendError, Streams, Timing};
use crate::vocab::RunnerId;

/// The trace id of no use: work before the trace, or no trace running.
pub(crate) const NO_USER: u32 = u32::MAX;

/// What one use of a [`Trace`] is.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum UseKind {
    /// A runner's graph, launched by
    /// [`Replayable::replay`](crate::Replayable::replay).
    Replay {
        /// The runner.
        runner: RunnerId,
    },
    /// A consumer ([`Replayable::consume`](crate::Replayable::consume),
    /// `consume_mut`, `consume_many`): what its closure enqueued.
    Consume {
        /// The runners whose views it read, in order.
        runners: Vec<RunnerId>,
        /// It could also write them (`consume_mut`).
        writes: bool,
    },
    /// A launch of a step graph ([`StepGraph::launch`](crate::StepGraph::launch),
    /// [`Replayable::launch_kept`](crate::Replayable::launch_kept)).
    StepLaunch {
        /// Which step graph of the plan: step graphs built from the plan
        /// before it (the first is 0), so kept step graphs of different
        /// buckets have names of their own.
        step: u64,
        /// Launches of that step graph before this one.
        launch: u64,
        /// Which of the step graph's executable graphs ran (a step graph
        /// whose steps overlap alternates two).
        graph: usize,
    },
    /// The program's wait ([`Replayable::wait_for`](crate::Replayable::wait_for),
    /// [`Replayable::wait_all`](crate::Replayable::wait_all), and the wait
    /// for everything before a step graph's first launch): no work, only
    /// waits.
    Wait {
        /// The runner waited for; `None` for every runner.
        runner: Option<RunnerId>,
    },
}

impl UseKind {
    /// The use's name in the trace: `replay runner 3`, `consume runners
    /// 0, 2`, `consume_mut runner 1`, `step graph 1 launch 4` (the plan's
    /// second step graph, its fifth launch), `wait_for runner 3`,
    /// `wait_all`.
    pub fn name(&self) -> String {
        match self {
            UseKind::Replay { runner } => format!("replay {runner}"),
            UseKind::Consume { runners, writes } => {
                let call = if *writes { "consume_mut" } else { "consume" };
                match runners.as_slice() {
                    [one] => format!("{call} {one}"),
                    many => {
                        let ids: Vec<String> = many.iter().map(|r| r.0.to_string()).collect();
                        format!("{call} runners {}", ids.join(", "))
                    }
                }
            }
            UseKind::StepLaunch { step, launch, .. } => {
                format!("step graph {step} launch {launch}")
            }
            UseKind::Wait { runner: Some(r) } => format!("wait_for {r}"),
            UseKind::Wait { runner: None } => "wait_all".to_string(),
        }
    }

    /// The use's category in the trace: `replay`, `consume`, `step`,
    /// `wait`.
    pub fn category(&self) -> &'static str {
        match self {
            UseKind::Replay { .. } => "replay",
            UseKind::Consume { .. } => "consume",
            UseKind::StepLaunch { .. } => "step",
            UseKind::Wait { .. } => "wait",
        }
    }
}

/// One wait the fence made before a use's work, or skipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Waited {
    /// The use it waited for (by index in [`Trace::uses`]); `None` for
    /// work enqueued before the trace started.
    pub from: Option<usize>,
    /// Not issued: stream order already ordered the use after it (same
    /// stream, or this stream waited for it before).
    pub skipped: bool,
}

/// One use of the plan on its stream's lane, with the times its marks
/// read, in microseconds from the trace's origin (on `sim`, the clock's own
/// ticks).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Use {
    /// What it is.
    pub kind: UseKind,
    /// Its stream's lane (index in [`Trace::streams`]).
    pub lane: usize,
    /// When its work started: its stream reached it, after the fence's
    /// waits (and, for a graph, after the graph's previous launch: launches
    /// of one graph run one after another).
    pub start_us: f64,
    /// When its work ended.
    pub end_us: f64,
    /// The waits the fence made (or skipped) for it, each source once
    /// (none for a node of a step graph: its graph's edges order it).
    pub waits: Vec<Waited>,
    /// For a replay or consumer inside a step graph launch
    /// ([`Trace::step_nodes`]): the launch's use (index in
    /// [`Trace::uses`]). `None` for the fence's own uses.
    pub parent: Option<usize>,
}

/// What a plan's fence did while a trace ran
/// ([`Replayable::start_trace`](crate::Replayable::start_trace) to
/// [`Replayable::finish_trace`](crate::Replayable::finish_trace)): its
/// uses in the order they were enqueued, one lane per stream.
#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    backend: &'static str,
    streams: Vec<u64>,
    uses: Vec<Use>,
    step_nodes: Vec<Use>,
}

impl Trace {
    /// The uses, in the order the program enqueued them.
    pub fn uses(&self) -> &[Use] {
        &self.uses
    }

    /// The replays and consumers inside traced step graph launches, each
    /// with its launch as [`Use::parent`], on the lane of the stream the
    /// step schedule put it on ([`StepBuilder::replay`](crate::StepBuilder::replay),
    /// [`StepBuilder::consume`](crate::StepBuilder::consume)), in the
    /// order of their launches and, within one, of the schedule (a writer
    /// split at its ready point is two). A node starts when the nodes it
    /// depends on have ended (or its launch started) and ends when its
    /// work did, within its launch's use. Empty for step graphs whose
    /// nodes cannot be timed (see `docs/trace.md`).
    pub fn step_nodes(&self) -> &[Use] {
        &self.step_nodes
    }

    /// The streams, one lane each, in order of first use: the identities
    /// the backend gives them ([`Streams::stream_id`]).
    pub fn streams(&self) -> &[u64] {
        &self.streams
    }

    /// The backend's name (`sim`, `cuda`).
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// The trace as Chrome's Trace Event Format (JSON), which
    /// <https://ui.perfetto.dev> ("Open trace file") and Chrome's
    /// `about:tracing` open: one thread (`tid` = lane + 1) per stream, a
    /// complete event (`"ph":"X"`, `ts` and `dur` in microseconds) per
    /// use with its index and waits in `args`, a flow arrow (`"ph":"s"`
    /// to `"ph":"f"`, category `fence`) from the use waited for to the
    /// waiting use for every wait the fence made, and an instant event
    /// (`"ph":"i"`, category `fence.skipped`) on the waiting use for
    /// every wait it skipped; each node of a traced step graph launch is a
    /// complete event of category `step.node` on its lane, its launch's
    /// index in `args.parent`.
    #[doc(alias = "perfetto")]
    #[doc(alias = "chrome_trace")]
    #[doc(alias = "export_chrome_trace")]
    pub fn to_chrome_json(&self) -> String {
        let mut events: Vec<String> = Vec::new();
        events.push(format!(
            r#"{{"ph":"M","name":"process_name","pid":1,"tid":0,"args":{{"name":{}}}}}"#,
            json_str(&format!("replay-arena ({})", self.backend))
        ));
        for (lane, id) in self.streams.iter().enumerate() {
            events.push(format!(
                r#"{{"ph":"M","name":"thread_name","pid":1,"tid":{},"args":{{"name":{}}}}}"#,
                lane + 1,
                json_str(&format!("stream {lane} (id {id:#x})"))
            ));
            events.push(format!(
                r#"{{"ph":"M","name":"thread_sort_index","pid":1,"tid":{},"args":{{"sort_index":{lane}}}}}"#,
                lane + 1
            ));
        }
        let mut flow = 0u64;
        for (i, entry) in self.uses.iter().enumerate() {
            let tid = entry.lane + 1;
            let list = |skipped: bool| {
                let ids: Vec<String> = entry
                    .waits
                    .iter()
                    .filter(|w| w.skipped == skipped)
                    .filter_map(|w| w.from)
                    .map(|f| f.to_string())
                    .collect();
                ids.join(",")
            };
            let before = entry.waits.iter().filter(|w| w.from.is_none()).count();
            events.push(format!(
                r#"{{"ph":"X","name":{},"cat":"{}","pid":1,"tid":{tid},"ts":{},"dur":{},"args":{{"use":{i},"waited_for":[{}],"skipped":[{}],"before_trace":{before}}}}}"#,
                json_str(&entry.kind.name()),
                entry.kind.category(),
                num(entry.start_us),
                num(entry.end_us - entry.start_us),
                list(false),
                list(true),
            ));
            let at = mid(entry);
            for wait in &entry.waits {
                let Some(from) = wait.from.and_then(|f| self.uses.get(f).map(|s| (f, s))) else {
                    continue;
                };
                let (f, source) = from;
                if wait.skipped {
                    events.push(format!(
                        r#"{{"ph":"i","s":"t","name":{},"cat":"fence.skipped","pid":1,"tid":{tid},"ts":{},"args":{{"use":{i},"from":{f}}}}}"#,
                        json_str(&format!(
                            "wait for {} skipped: stream order",
                            source.kind.name()
                        )),
                        num(entry.start_us),
                    ));
                    continue;
                }
                flow += 1;
                events.push(format!(
                    r#"{{"ph":"s","id":{flow},"name":"wait","cat":"fence","pid":1,"tid":{},"ts":{},"args":{{"from":{f},"to":{i}}}}}"#,
                    source.lane + 1,
                    num(mid(source)),
                ));
                events.push(format!(
                    r#"{{"ph":"f","bp":"e","id":{flow},"name":"wait","cat":"fence","pid":1,"tid":{tid},"ts":{},"args":{{"from":{f},"to":{i}}}}}"#,
                    num(at),
                ));
            }
        }
        for (k, node) in self.step_nodes.iter().enumerate() {
            let parent = node.parent.and_then(|p| self.uses.get(p).map(|s| (p, s)));
            let Some((p, launch)) = parent else {
                continue;
            };
            events.push(format!(
                r#"{{"ph":"X","name":{},"cat":"step.node","pid":1,"tid":{},"ts":{},"dur":{},"args":{{"node":{k},"parent":{p},"parent_name":{}}}}}"#,
                json_str(&node.kind.name()),
                node.lane + 1,
                num(node.start_us),
                num(node.end_us - node.start_us),
                json_str(&launch.kind.name()),
            ));
        }
        let clock = match self.backend {
            "sim" => "the sim's clock: one tick is shown as one microsecond",
            _ => "microseconds from the trace's start (timing events)",
        };
        let mut out = String::from("{\"otherData\":{\"backend\":");
        out.push_str(&json_str(self.backend));
        out.push_str(",\"clock\":");
        out.push_str(&json_str(clock));
        out.push_str("},\"traceEvents\":[\n");
        out.push_str(&events.join(",\n"));
        out.push_str("\n]}\n");
        out
    }

    /// Writes [`Trace::to_chrome_json`] to `path`.
    ///
    /// # Errors
    ///
    /// The file system's error.
    pub fn write_chrome_json(&self, path: impl AsRef<Path>) -> std::io::Result<()> {
        std::fs::write(path, self.to_chrome_json())
    }
}

/// Inside the use (its flows bind to it there), and at its start when it
/// has no length.
fn mid(entry: &Use) -> f64 {
    entry.start_us + (entry.end_us - entry.start_us) / 2.0
}

/// A JSON number of microseconds, to the nanosecond (timing events resolve
/// half a microsecond; the sim's ticks stay whole). A time is always
/// finite; anything else is written 0.
fn num(x: f64) -> String {
    if x.is_finite() {
        format!("{}", (x * 1000.0).round() / 1000.0)
    } else {
        "0".to_string()
    }
}

/// `s` as a JSON string, quoted and escaped.
fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// What the fence tells a trace ([`Fence`](crate::fence) calls it): a use
/// begins on a stream (before its waits), waits for earlier uses (by the
/// ids `begin` gave them), is bracketed by two marks, and ends once
/// enqueued. A use that never ends failed before it enqueued anything.
pub(crate) trait Observer<B: Streams>: Send {
    /// A use of the plan begins on the stream with id `stream`; returns its
    /// id (`NO_USER` when it is not kept).
    fn begin(&mut self, kind: UseKind, stream: u64) -> u32;
    /// The use in progress waited for the use `from` (or `skipped`: stream
    /// order ordered it).
    fn wait(&mut self, from: u32, skipped: bool);
    /// A mark on `stream`: first before the use's work, then after it.
    fn mark(&mut self, backend: &B, stream: &B::Stream);
    /// The use in progress is enqueued.
    fn end(&mut self);
    /// Node marks for the `n` nodes of a step graph launch about to
    /// begin ([`Timing::new_node_mark`]); `None` when the backend times no
    /// graph nodes, or creating them failed (kept for `finish`).
    fn node_marks(&mut self, backend: &B, n: usize) -> Option<Vec<B::Event>>;
    /// The step graph launch that just ended ran `nodes`, each recording
    /// its mark when done.
    fn step_nodes(&mut self, nodes: Vec<NodeMark<B::Event>>);
    /// Preparing a traced step graph launch failed (the launch went out
    /// untraced): `finish` reports it.
    fn fail(&mut self, error: BackendError);
    /// The trace, with every mark's time read (this waits for the marks).
    ///
    /// # Errors
    ///
    /// The first failed mark, or the failure to read one's time.
    fn finish(self: Box<Self>, backend: &B) -> Result<Trace, BackendError>;
}

/// One node of a traced step graph launch ([`Observer::step_nodes`]).
pub(crate) struct NodeMark<E> {
    /// A replay or a consumer.
    pub(crate) kind: UseKind,
    /// The stream the step schedule put it on.
    pub(crate) stream: u64,
    /// The earlier nodes of the launch it runs after.
    pub(crate) deps: Vec<usize>,
    /// The nodes of the launch before it runs after (step graphs launched
    /// in turn).
    pub(crate) before: Vec<usize>,
    /// Recorded by the launch when the node is done.
    pub(crate) mark: E,
}

/// One use as it was recorded.
struct Entry<M, E> {
    kind: UseKind,
    lane: usize,
    /// (trace id waited for, skipped)
    waits: Vec<(u32, bool)>,
    start: Option<M>,
    end: Option<M>,
    done: bool,
    /// A later use began before this one ended.
    failed: bool,
    /// A traced step graph launch's nodes, each with its lane.
    nodes: Vec<(NodeMark<E>, usize)>,
}

/// The observer a trace runs with: marks from the backend's [`Timing`].
pub(crate) struct Recorder<B: Timing> {
    backend: &'static str,
    origin: B::Mark,
    /// Marks created ahead, taken from the end.
    spare: Vec<B::Mark>,
    streams: Vec<u64>,
    entries: Vec<Entry<B::Mark, B::Event>>,
    /// The first mark that failed: reported by `finish`.
    error: Option<BackendError>,
}

impl<B: Timing> Recorder<B> {
    /// A recorder whose times are measured from `backend`'s origin now,
    /// with the marks of `uses` uses created ahead.
    ///
    /// # Errors
    ///
    /// The backend's error creating a mark or taking the origin.
    pub(crate) fn new(
        backend: &B,
        name: &'static str,
        uses: usize,
    ) -> Result<Recorder<B>, BackendError> {
        let spare = (0..uses.saturating_mul(2))
            .map(|_| backend.new_mark())
            .collect::<Result<_, _>>()?;
        Ok(Recorder {
            backend: name,
            origin: backend.origin()?,
            spare,
            streams: Vec::new(),
            entries: Vec::new(),
            error: None,
        })
    }

    /// The use in progress, if any.
    fn open(&mut self) -> Option<&mut Entry<B::Mark, B::Event>> {
        self.entries.last_mut().filter(|e| !e.done && !e.failed)
    }

    /// The lane of the stream with id `stream`, a new one at its first use.
    fn lane(&mut self, stream: u64) -> usize {
        match self.streams.iter().position(|&s| s == stream) {
            Some(lane) => lane,
            None => {
                self.streams.push(stream);
                self.streams.len() - 1
            }
        }
    }
}

impl<B: Timing> Observer<B> for Recorder<B> {
    fn begin(&mut self, kind: UseKind, stream: u64) -> u32 {
        // A use that never ended (it failed before it enqueued anything)
        // keeps its id, which completions may carry: `finish` drops it.
        if let Some(entry) = self.open() {
            entry.failed = true;
        }
        let Ok(id) = u32::try_from(self.entries.len()) else {
            return NO_USER;
        };
        if id == NO_USER {
            return NO_USER;
        }
        let lane = self.lane(stream);
        self.entries.push(Entry {
            kind,
            lane,
            waits: Vec::new(),
            start: None,
            end: None,
            done: false,
            failed: false,
            nodes: Vec::new(),
        });
        id
    }

    fn wait(&mut self, from: u32, skipped: bool) {
        if let Some(entry) = self.open() {
            if !entry.waits.contains(&(from, skipped)) {
                entry.waits.push((from, skipped));
            }
        }
    }

    fn mark(&mut self, backend: &B, stream: &B::Stream) {
        if self.open().is_none() {
            return;
        }
        let taken = match self.spare.pop() {
            Some(mark) => Ok(mark),
            None => backend.new_mark(),
        }
        .and_then(|mut mark| backend.take_mark(&mut mark, stream).map(|()| mark));
        let mark = match taken {
            Ok(mark) => mark,
            Err(e) => {
                self.error.get_or_insert(e);
                return;
            }
        };
        if let Some(entry) = self.open() {
            match entry.start {
                None => entry.start = Some(mark),
                Some(_) => entry.end = Some(mark),
            }
        }
    }

    fn end(&mut self) {
        if let Some(entry) = self.open() {
            entry.done = true;
        }
    }

    fn node_marks(&mut self, backend: &B, n: usize) -> Option<Vec<B::Event>> {
        if !backend.times_graph_nodes() || self.error.is_some() {
            return None;
        }
        match (0..n).map(|_| backend.new_node_mark()).collect() {
            Ok(marks) => Some(marks),
            Err(e) => {
                self.error = Some(e);
                None
            }
        }
    }

    fn step_nodes(&mut self, nodes: Vec<NodeMark<B::Event>>) {
        let launched = self
            .entries
            .last()
            .is_some_and(|e| e.done && matches!(e.kind, UseKind::StepLaunch { .. }));
        if !launched {
            return;
        }
        let nodes: Vec<_> = nodes
            .into_iter()
            .map(|node| {
                let lane = self.lane(node.stream);
                (node, lane)
            })
            .collect();
        if let Some(entry) = self.entries.last_mut() {
            entry.nodes = nodes;
        }
    }

    fn fail(&mut self, error: BackendError) {
        self.error.get_or_insert(error);
    }

    fn finish(self: Box<Self>, backend: &B) -> Result<Trace, BackendError> {
        let Recorder {
            backend: name,
            origin,
            streams,
            entries,
            error,
            ..
        } = *self;
        if let Some(e) = error {
            return Err(e);
        }
        // Marks of one stream complete in order: wait for each lane's last.
        backend.wait_mark(&origin)?;
        for lane in 0..streams.len() {
            let last = entries
                .iter()
                .rev()
                .filter(|e| e.lane == lane)
                .find_map(|e| e.end.as_ref().or(e.start.as_ref()));
            if let Some(mark) = last {
                backend.wait_mark(mark)?;
            }
        }
        // Entry index -> use index (a use that never ended has none).
        let mut index = vec![None; entries.len()];
        let mut uses: Vec<Use> = Vec::with_capacity(entries.len());
        let mut step_nodes: Vec<Use> = Vec::new();
        // The ends of the latest step graph launch's nodes.
        let mut ends_before: Vec<f64> = Vec::new();
        let mut serial = Serial::default();
        for (i, entry) in entries.iter().enumerate() {
            let (Some(start), true) = (&entry.start, entry.done) else {
                continue;
            };
            let start_us = backend.elapsed_us(&origin, start)?;
            let end_us = match &entry.end {
                Some(end) => backend.elapsed_us(&origin, end)?,
                None => start_us,
            };
            let start_us = serial.start(&entry.kind, start_us, end_us);
            let waits = entry
                .waits
                .iter()
                .map(|&(from, skipped)| Waited {
                    from: index.get(from as usize).copied().flatten(),
                    skipped,
                })
                .collect();
            index[i] = Some(uses.len());
            let parent = Use {
                kind: entry.kind.clone(),
                lane: entry.lane,
                start_us,
                end_us: end_us.max(start_us),
                waits,
                parent: None,
            };
            if matches!(entry.kind, UseKind::StepLaunch { .. }) {
                let nodes = node_uses(
                    backend,
                    &origin,
                    &entry.nodes,
                    (&parent, uses.len()),
                    &ends_before,
                );
                ends_before = nodes.iter().map(|n| n.end_us).collect();
                step_nodes.extend(nodes);
            }
            uses.push(parent);
        }
        Ok(Trace {
            backend: name,
            streams,
            uses,
            step_nodes,
        })
    }
}

/// Launches of one graph run one after another: a runner's replay starts
/// after its previous one, a step graph's launch after the previous launch
/// of the same executable graph.
#[derive(Default)]
struct Serial {
    runner_end: Vec<(RunnerId, f64)>,
    /// Per step graph and executable graph of it: its latest launch's end.
    step_end: Vec<((u64, usize), f64)>,
}

impl Serial {
    /// When a use of `kind` whose marks read `start_us` and `end_us`
    /// started, given the launches of its graph before it.
    fn start(&mut self, kind: &UseKind, start_us: f64, end_us: f64) -> f64 {
        match kind {
            UseKind::Replay { runner } => {
                match self.runner_end.iter_mut().find(|(r, _)| r == runner) {
                    Some((_, last)) => {
                        let start = start_us.max(*last);
                        *last = end_us;
                        start
                    }
                    None => {
                        self.runner_end.push((*runner, end_us));
                        start_us
                    }
                }
            }
            UseKind::StepLaunch { step, graph, .. } => {
                // Step graphs (kept ones of several buckets, say) are
                // other executable graphs: each runs after its own only.
                let key = (*step, *graph);
                match self.step_end.iter_mut().find(|(k, _)| *k == key) {
                    Some((_, last)) => {
                        let start = start_us.max(*last);
                        *last = end_us;
                        start
                    }
                    None => {
                        self.step_end.push((key, end_us));
                        start_us
                    }
                }
            }
            UseKind::Consume { .. } | UseKind::Wait { .. } => start_us,
        }
    }
}

/// The uses of a step graph launch's `nodes` inside `launch` (a use
/// and its index): each ends at its mark and starts when the nodes it
/// depends on ended (those of this launch, and those of the launch before,
/// which ended at `ends_before`), or when the launch started. A mark that
/// cannot be read leaves the launch without nodes (its own use stays).
///
/// A launch before that was of another step graph, or untraced, ended
/// before this one started (a launch after anything else waits for
/// everything the fence knows of): its nodes bound nothing.
fn node_uses<B: Timing>(
    backend: &B,
    origin: &B::Mark,
    nodes: &[(NodeMark<B::Event>, usize)],
    (launch, index): (&Use, usize),
    ends_before: &[f64],
) -> Vec<Use> {
    let ends: Result<Vec<f64>, _> = nodes
        .iter()
        .map(|(node, _)| backend.node_mark_us(origin, &node.mark))
        .collect();
    let Ok(ends) = ends else {
        return Vec::new();
    };
    nodes
        .iter()
        .zip(&ends)
        .map(|((node, lane), &end)| {
            let before = node.before.iter().filter_map(|&d| ends_before.get(d));
            let start_us = node
                .deps
                .iter()
                .filter_map(|&d| ends.get(d))
                .chain(before)
                .fold(launch.start_us, |a, &b| a.max(b));
            Use {
                kind: node.kind.clone(),
                lane: *lane,
                start_us,
                end_us: end.max(start_us),
                waits: Vec::new(),
                parent: Some(index),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_escaped_as_json_wants() {
        assert_eq!(json_str("a\"b\\c\nd\u{1}é"), r#""a\"b\\c\nd\u0001é""#);
    }

    #[test]
    fn use_names_say_the_call_and_its_runners() {
        let consume = UseKind::Consume {
            runners: vec![RunnerId(0), RunnerId(2)],
            writes: false,
        };
        assert_eq!(consume.name(), "consume runners 0, 2");
        let one = UseKind::Consume {
            runners: vec![RunnerId(1)],
            writes: true,
        };
        assert_eq!(one.name(), "consume_mut runner 1");
        assert_eq!(UseKind::Wait { runner: None }.name(), "wait_all");
    }
}
