//! Captured graphs as op lists with their event record nodes and
//! temporaries, composed graphs run on lanes, and graph launch (all or
//! nothing).

use std::sync::{Arc, Mutex};

use super::ops::Node;
use super::streams::EventState;
use super::{lock, Result, SimState};

/// A captured op list, and the memory its allocation nodes hand out (kept
/// for the graph's life, as CUDA keeps a graph's allocations at fixed
/// addresses).
#[derive(Clone, Debug, Default)]
pub struct Graph {
    pub(super) ops: Vec<(Node, u64)>,
    /// Event record nodes: (index of the op they precede, event id).
    pub(super) records: Vec<(usize, usize)>,
    /// Held for their drop: frees the allocation nodes' memory with the
    /// graph (a composed graph holds its parts').
    pub(super) memory: Vec<Arc<GraphMemory>>,
    /// A composed graph ([`Compose::compose`]): its nodes, run on lanes.
    pub(super) step: Option<Arc<SimStep>>,
    /// Where the latest launch ended: launches of one graph run one after
    /// another, as launches of one CUDA executable graph do.
    pub(super) last: Arc<Mutex<Option<EventState>>>,
}

/// The byte ranges one op touches: ((start, end), written?).
pub(super) type OpRanges = Vec<((u64, u64), bool)>;

/// A graph of graphs: each node runs on its lane (an internal stream)
/// after the nodes it depends on.
#[derive(Clone, Debug)]
pub(super) struct SimStep {
    pub(super) nodes: Vec<SimStepNode>,
    /// Lane -> the internal stream it runs on.
    pub(super) lanes: Vec<usize>,
    /// Recorded after every node; the launch completes after the other's
    /// latest record ([`StepEnd`](crate::backend::StepEnd)): (record, wait) event ids.
    pub(super) end: Option<(usize, usize)>,
}

#[derive(Clone, Debug)]
pub(super) struct SimStepNode {
    pub(super) ops: Vec<(Node, u64)>,
    pub(super) records: Vec<(usize, usize)>,
    pub(super) deps: Vec<usize>,
    pub(super) lane: usize,
    /// Event ids it waits for first (their latest records at launch).
    pub(super) waits: Vec<usize>,
    /// Event ids it records once done.
    pub(super) records_after: Vec<usize>,
}

impl PartialEq for Graph {
    fn eq(&self, other: &Graph) -> bool {
        self.ops == other.ops
    }
}

/// Host memory behind a graph's allocation nodes; freed with the graph.
#[derive(Debug)]
pub(super) struct GraphMemory {
    pub(super) state: Arc<Mutex<SimState>>,
    pub(super) bases: Vec<u64>,
}

impl Drop for GraphMemory {
    fn drop(&mut self) {
        let mut s = lock(&self.state);
        s.synchronize();
        for &base in &self.bases {
            s.free_graph_memory(base);
        }
    }
}

impl Graph {
    /// The captured nodes (kernels and memory nodes) with their durations.
    pub fn ops(&self) -> &[(Node, u64)] {
        &self.ops
    }
}

impl SimState {
    /// Checks a graph's ops before any is submitted (all or nothing): a raw
    /// span captured into a program buffer that was freed since may now
    /// name a plan's arena.
    fn graph_ranges(&self, ops: &[(Node, u64)]) -> Result<Vec<OpRanges>> {
        ops.iter()
            .map(|(op, _)| {
                op.accesses()
                    .iter()
                    .try_for_each(|(span, _)| self.check_raw(span))?;
                self.ranges(op)
            })
            .collect()
    }

    /// Submits checked ops to stream `s`, with the event records between
    /// them.
    fn run_ops(
        &mut self,
        s: usize,
        ops: &[(Node, u64)],
        records: &[(usize, usize)],
        ranges: Vec<OpRanges>,
    ) {
        let mut records = records.iter().peekable();
        for (i, (&(op, duration), ranges)) in ops.iter().zip(ranges).enumerate() {
            while let Some(&(_, event)) = records.next_if(|(at, _)| *at == i) {
                self.record(s, event);
            }
            self.submit_checked(s, op, ranges, duration);
        }
        for &(_, event) in records {
            self.record(s, event);
        }
    }

    /// Launches `graph` on stream `s`, after its previous launch (on
    /// whatever stream it ran), as launches of one CUDA executable graph
    /// run. A composed graph runs each node on its lane (an internal
    /// stream) after its dependencies, every lane starting after what `s`
    /// holds, and `s` goes on after every node. All or nothing.
    pub(super) fn launch_graph(&mut self, s: usize, graph: &Graph) -> Result<()> {
        let nodes: Vec<&[(Node, u64)]> = match &graph.step {
            Some(step) => step.nodes.iter().map(|n| n.ops.as_slice()).collect(),
            None => vec![graph.ops.as_slice()],
        };
        let ranges = nodes
            .iter()
            .map(|ops| self.graph_ranges(ops))
            .collect::<Result<Vec<_>>>()?;
        let mut last = graph.last.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(prev) = last.as_ref() {
            self.wait_for(s, prev);
        }
        match &graph.step {
            None => {
                let ranges = ranges.into_iter().next().unwrap_or_default();
                self.run_ops(s, &graph.ops, &graph.records, ranges);
            }
            Some(step) => {
                let start = self.tail_of(s);
                for &lane in &step.lanes {
                    self.wait_for(lane, &start);
                }
                let mut ends: Vec<EventState> = Vec::with_capacity(step.nodes.len());
                for (node, ranges) in step.nodes.iter().zip(ranges) {
                    let lane = step.lanes[node.lane];
                    for &e in &node.waits {
                        if let Some(after) = self.events.get(e).cloned() {
                            self.wait_for(lane, &after);
                        }
                    }
                    for &d in &node.deps {
                        let after = ends[d].clone();
                        self.wait_for(lane, &after);
                    }
                    self.run_ops(lane, &node.ops, &node.records, ranges);
                    for &e in &node.records_after {
                        self.record(lane, e);
                    }
                    ends.push(self.tail_of(lane));
                }
                for &lane in &step.lanes {
                    let end = self.tail_of(lane);
                    self.wait_for(s, &end);
                }
                if let Some((record, wait)) = step.end {
                    self.record(s, record);
                    if let Some(after) = self.events.get(wait).cloned() {
                        self.wait_for(s, &after);
                    }
                }
            }
        }
        *last = Some(self.tail_of(s));
        Ok(())
    }
}
