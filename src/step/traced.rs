//! A step graph's nodes in a trace: what a step graph keeps to compose a
//! *traced* copy of itself (the same nodes and edges, and after each node
//! an event record node of a node mark, [`Timing::new_node_mark`]) for the
//! launches made while a trace runs, and the order between launches of
//! different compositions.
//!
//! Untraced launches run the step graph's own composition, with no timing
//! node: a step graph launched with no trace running costs nothing more.
//! Each launch made while a trace runs needs marks of its own (a graph's
//! record node records the same event at every launch). The first traced
//! launch of a graph composes its traced copy, with the same event wait and
//! record nodes across launches when two graphs launch in turn; each later
//! one reuses the copy launched last, its node marks' record nodes pointed
//! at new marks ([`Compose::retarget_records`]), or composes a new copy
//! when that fails. Launches of one executable graph run one after another,
//! which the step graph's edges count on; launches of two do not, so a
//! launch that follows a launch of another composition of the same graph
//! waits for that launch whole: for the event recorded after a traced
//! launch, or, when there is none (the launch before ran the step graph's
//! own composition, or the record failed), for everything the fence knows
//! of, as a first launch does.
//!
//! A node moved into the step graph (a step copy, a consumer with
//! temporaries) is the step graph's own composition's alone: a step graph
//! holding one is never composed again, and traces as one slice per launch.
//!
//! [`Timing::new_node_mark`]: crate::backend::Timing::new_node_mark
//! [`Compose::retarget_records`]: crate::backend::Compose::retarget_records

use super::dry_run::{Adjacency, Use};
use crate::backend::{Backend, BackendError, Capture, Compose, NodeGraph, StepEnd, StepNode};
use crate::replay::Replayable;
use crate::trace::{NodeMark, UseKind};

/// Where a node's graph comes from when the step graph is composed again.
pub(super) enum Source {
    /// The runner slot's own graph (the plan keeps it).
    Runner(usize),
    /// One of the graphs the step graph keeps (a split writer's part, a
    /// consumer's graph).
    Held(usize),
    /// Moved into the step graph's own composition: in no other.
    Moved,
}

/// One node of the step graph, as a trace shows it.
pub(super) struct TracedNode {
    pub(super) source: Source,
    pub(super) kind: UseKind,
    /// The schedule's lane it was put on.
    pub(super) lane: usize,
}

/// The events of two graphs launched in turn (none for one graph): per
/// graph, one per node the other graph's nodes wait for (`sources`), and
/// its end.
pub(super) struct Events<B: Backend> {
    pub(super) sources: Vec<usize>,
    pub(super) nodes: Vec<Vec<B::Event>>,
    pub(super) ends: Vec<B::Event>,
}

impl<B: Backend> Events<B> {
    /// Events held.
    pub(super) fn len(&self) -> usize {
        self.nodes.iter().map(Vec::len).sum::<usize>() + self.ends.len()
    }

    /// Gives the nodes of graph `x` (of two launched in turn) the other
    /// graph's events they wait for (by the edges `cross` on the launch
    /// before) and the events they record, and returns the graph's end;
    /// nothing for one graph.
    pub(super) fn wire<'a>(
        &'a self,
        nodes: &mut [StepNode<'a, B::Graph, B::Event>],
        cross: &[Vec<usize>],
        x: usize,
    ) -> Option<StepEnd<'a, B::Event>> {
        if self.ends.len() < 2 {
            return None;
        }
        let other = (x + 1) % 2;
        for (n, node) in nodes.iter_mut().enumerate() {
            node.waits = cross
                .get(n)
                .into_iter()
                .flatten()
                .filter_map(|y| self.sources.binary_search(y).ok())
                .map(|e| &self.nodes[other][e])
                .collect();
            if let Ok(e) = self.sources.binary_search(&n) {
                node.records = vec![&self.nodes[x][e]];
            }
        }
        Some(StepEnd {
            record: &self.ends[x],
            wait: &self.ends[other],
        })
    }
}

/// A traced copy of a step graph, and its nodes with their marks.
pub(super) type TracedCopy<B> = (
    <B as Capture>::Graph,
    Vec<NodeMark<<B as crate::backend::Streams>::Event>>,
);

/// What the launch before this one ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Last {
    /// No launch yet.
    Nothing,
    /// The step graph's own composition.
    Own,
    /// A traced copy; `after`: the event after it was recorded.
    Traced { after: bool },
}

/// How a launch is ordered after the launch before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Order {
    /// By launch order of one executable graph (or by the fence, for the
    /// first launch): nothing more.
    Own,
    /// By a wait for the event recorded after the traced launch before.
    After,
    /// By a wait for everything the fence knows of.
    Everything,
}

/// What a step graph keeps to be traced node by node.
pub(super) struct Tracing<B: Backend> {
    /// The traced copies launched, held until the step graph is freed
    /// (after its last launch, which runs after them), before the events
    /// their nodes wait for and record.
    launched: Vec<B::Graph>,
    /// Per graph: its traced copy launched last, reused for the next traced
    /// launch with new marks ([`Compose::retarget_records`]) instead of
    /// composed again.
    cached: Vec<Option<B::Graph>>,
    /// `None` while every node is a whole replay of its runner's own graph
    /// (most step graphs): listed from the schedule at the first traced
    /// launch, not at every build.
    nodes: Option<Vec<TracedNode>>,
    /// Whether a traced copy can be composed: nothing was moved in (known
    /// at build, asked at every launch).
    traceable: bool,
    /// The split writers' parts and the consumers' graphs ([`Source::Held`]).
    held: Vec<B::Graph>,
    /// The schedule's streams (ids), by lane.
    lanes: Vec<u64>,
    /// Per node, the earlier nodes it runs after.
    deps: Adjacency,
    /// Edges on the launch before, per node (two graphs in turn).
    cross: Vec<Vec<usize>>,
    /// Per graph: recorded after each traced launch of it, on its stream.
    after: Vec<Option<B::Event>>,
    /// Per graph: what its launch before ran.
    last: Vec<Last>,
}

impl<B: Backend> Tracing<B> {
    /// `nodes`: `None` when every node is a whole replay of its runner's
    /// own graph, listed from the schedule when first needed.
    pub(super) fn new(
        nodes: Option<Vec<TracedNode>>,
        held: Vec<B::Graph>,
        lanes: Vec<u64>,
        (deps, cross): (Adjacency, Vec<Vec<usize>>),
    ) -> Self {
        Tracing {
            launched: Vec::new(),
            cached: Vec::new(),
            traceable: !(nodes.iter().flatten()).any(|n| matches!(n.source, Source::Moved)),
            nodes,
            held,
            lanes,
            deps,
            cross,
            after: Vec::new(),
            last: Vec::new(),
        }
    }

    /// How a launch of graph `x` (`traced`: of a traced copy of it) is
    /// ordered after graph `x`'s launch before it.
    pub(super) fn order(&self, x: usize, traced: bool) -> Order {
        match (self.last.get(x).copied().unwrap_or(Last::Nothing), traced) {
            (Last::Nothing, _) | (Last::Own, false) => Order::Own,
            (Last::Traced { after: true }, _) => Order::After,
            (Last::Traced { after: false }, _) | (Last::Own, true) => Order::Everything,
        }
    }

    /// The event to wait for under `order`, for a launch of graph `x`.
    pub(super) fn after(&self, x: usize, order: Order) -> Option<&B::Event> {
        match order {
            Order::After => self.after.get(x).and_then(Option::as_ref),
            Order::Own | Order::Everything => None,
        }
    }

    fn set_last(&mut self, x: usize, last: Last) {
        if self.last.len() <= x {
            self.last.resize(x + 1, Last::Nothing);
        }
        self.last[x] = last;
    }

    /// Graph `x` itself was launched.
    pub(super) fn launched_own(&mut self, x: usize) {
        self.set_last(x, Last::Own);
    }

    /// `copy`, a traced copy of graph `x`, was launched on `stream`: it is
    /// held, and the event after it recorded there (when that fails, the
    /// next launch of graph `x` waits for everything instead).
    pub(super) fn launched_traced(&mut self, b: &B, x: usize, copy: B::Graph, stream: &B::Stream) {
        if self.cached.len() <= x {
            self.cached.resize_with(x + 1, || None);
        }
        if let Some(old) = self.cached[x].replace(copy) {
            self.launched.push(old);
        }
        if self.after.len() <= x {
            self.after.resize_with(x + 1, || None);
        }
        if self.after[x].is_none() {
            self.after[x] = b.create_event().ok();
        }
        let after = match &self.after[x] {
            Some(event) => b.record_event(stream, event).is_ok(),
            None => false,
        };
        self.set_last(x, Last::Traced { after });
    }

    /// Holds a traced copy that may have been launched before (its
    /// launch now failed) until the step graph is freed.
    pub(super) fn hold(&mut self, copy: B::Graph) {
        self.launched.push(copy);
    }

    /// Frees the traced copies (after the step graph's last launch).
    pub(super) fn free(&mut self) {
        self.launched.clear();
        self.cached.clear();
    }
}

impl<B: Compose> Tracing<B> {
    /// A traced copy of graph `x` of the step graph (whose events are
    /// `events`) for the launch about to be made, with its nodes' marks,
    /// when a trace runs, the backend times graph nodes and nothing was
    /// moved in; else `None` (a failure to make one is the trace's error,
    /// and the launch goes out untraced).
    pub(super) fn prepare(
        &mut self,
        r: &mut Replayable<B>,
        uses: &[Use],
        events: &Events<B>,
        x: usize,
    ) -> Option<TracedCopy<B>> {
        if !self.traceable {
            return None;
        }
        let marks = r
            .fence
            .observer()?
            .node_marks(&r.backend, self.deps.len())?;
        self.nodes.get_or_insert_with(|| replays_of(r, uses));
        // The copy launched last, its nodes pointed at the new marks; when
        // that fails, it is held (it may still run) and a copy composed.
        let reused = self
            .cached
            .get_mut(x)
            .and_then(Option::take)
            .and_then(|mut copy| {
                let refs: Vec<&B::Event> = marks.iter().collect();
                match r.backend.retarget_records(&mut copy, &refs) {
                    Ok(()) => Some(copy),
                    Err(_) => {
                        self.launched.push(copy);
                        None
                    }
                }
            });
        let composed = match reused {
            Some(copy) => Ok(copy),
            None => self.compose(r, &marks, events, x),
        };
        match composed {
            Ok(graph) => {
                let nodes = (self.nodes.iter().flatten())
                    .zip(marks)
                    .enumerate()
                    .map(|(n, (node, mark))| NodeMark {
                        kind: node.kind.clone(),
                        stream: self.lanes.get(node.lane).copied().unwrap_or_default(),
                        deps: self.deps.get(n).to_vec(),
                        before: self.cross.get(n).cloned().unwrap_or_default(),
                        mark,
                    })
                    .collect();
                Some((graph, nodes))
            }
            Err(error) => {
                if let Some(observer) = r.fence.observer() {
                    observer.fail(error);
                }
                None
            }
        }
    }

    /// Graph `x`'s nodes, edges and events, each node recording its mark
    /// when done.
    fn compose(
        &self,
        r: &Replayable<B>,
        marks: &[B::Event],
        events: &Events<B>,
        x: usize,
    ) -> Result<B::Graph, BackendError> {
        let refused = |reason: &str| BackendError::Refused {
            call: "traced step graph",
            reason: reason.into(),
        };
        let mut nodes: Vec<StepNode<'_, B::Graph, B::Event>> = Vec::with_capacity(self.deps.len());
        for (n, node) in self.nodes.iter().flatten().enumerate() {
            let graph = match node.source {
                Source::Runner(slot) => r.runners.get(slot).and_then(|g| g.graph.as_ref()),
                Source::Held(i) => self.held.get(i),
                Source::Moved => None,
            }
            .ok_or_else(|| refused("a node's graph is gone"))?;
            nodes.push(StepNode::new(
                NodeGraph::Copy(graph),
                self.deps.get(n),
                node.lane,
            ));
        }
        let end = events.wire(&mut nodes, &self.cross, x);
        for (node, mark) in nodes.iter_mut().zip(marks) {
            node.records.push(mark);
        }
        r.backend.compose(nodes, end)
    }
}

/// The traced nodes of a schedule (`uses`) whose every node is a whole
/// replay of its runner's own graph.
fn replays_of<B: Backend>(r: &Replayable<B>, uses: &[Use]) -> Vec<TracedNode> {
    (uses.iter())
        .filter_map(|u| match u {
            Use::Replay { slot, lane, .. } => Some(TracedNode {
                source: Source::Runner(*slot),
                kind: UseKind::Replay {
                    runner: r.plan.runners[*slot].id(),
                },
                lane: *lane,
            }),
            Use::Consume { .. } => None,
        })
        .collect()
}
