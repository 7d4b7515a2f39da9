//! Compiling a step's schedule into one graph (or two launched in turn):
//! writers split at their ready points, a dry run of the schedule through
//! the fence whose waits become the edges, then the composition.

use super::dry_run::{
    dry_fence, dry_pass, reduce_cross, restage, touched, Adjacency, DryRun, Edges, Use,
};
use super::graph::StepCore;
use super::traced::{Events, Source, TracedNode, Tracing};
use super::{Item, StepError, StepGraph};
use crate::backend::{BackendError, Compose, NodeGraph, StepEnd, StepNode};
use crate::capture::StepCopy;
use crate::fence::{BackendFailure, ConsumeError, Fence, Operation};
use crate::replay::Replayable;
use crate::report::GraphMemoryEstimate;
use crate::trace::UseKind;
use crate::vocab::RunnerId;

/// Writers split at their ready points, per item: the parts of a split
/// writer's graph (empty for one whose step copy is moved in, already in
/// parts, and for every other item), and the fence slots of the ready
/// events at which its parts end, but the last (empty: one node).
/// The lists are per item once any item has one (none at all for a
/// schedule whose replays mark nothing ready, most of them).
struct Splits<G> {
    parts: Vec<Vec<G>>,
    ends: Vec<Vec<usize>>,
    /// Per item, the fence slots of the handoffs it marks ready (a
    /// replay's; empty for every other item).
    marks: Vec<Vec<usize>>,
}

impl<G> Splits<G> {
    /// The nodes of item `k`.
    fn nodes(&self, k: usize) -> usize {
        self.ends(k).len() + 1
    }

    fn parts(&self, k: usize) -> &[G] {
        self.parts.get(k).map_or(&[], Vec::as_slice)
    }

    fn ends(&self, k: usize) -> &[usize] {
        self.ends.get(k).map_or(&[], Vec::as_slice)
    }

    fn marks(&self, k: usize) -> &[usize] {
        self.marks.get(k).map_or(&[], Vec::as_slice)
    }

    /// Per item lists for `items` items, from the first one needed.
    fn per_item(&mut self, items: usize) {
        if self.marks.is_empty() {
            self.parts.resize_with(items, Vec::new);
            self.ends.resize_with(items, Vec::new);
            self.marks.resize_with(items, Vec::new);
        }
    }
}

/// What the dry run of the schedule found: the edges of a launch (and, for
/// two graphs in turn, those on the launch before), the fence slots the
/// step uses (ascending), whether the first pass after the first was
/// already steady, and the fence it leaves.
struct Dry {
    deps: Adjacency,
    cross: Vec<Vec<usize>>,
    touched: Vec<usize>,
    first_steady: bool,
    fence: Fence<DryRun>,
    /// Staged runners whose bytes the step's own replays take, each with
    /// the runner that takes them: the program stages them before each
    /// launch.
    restaged: Vec<(RunnerId, RunnerId)>,
}

/// Compiles the schedule `items` on the lanes of the streams `lane_ids`
/// into a step graph of `r` (two graphs launched in turn when
/// `overlapping`).
pub(super) fn compile<B: Compose>(
    r: &mut Replayable<B>,
    mut items: Vec<Item<B>>,
    lane_ids: Vec<u64>,
    overlapping: bool,
) -> Result<StepGraph<'_, B>, StepError> {
    let lanes = lane_ids.len();
    if items.is_empty() {
        return Err(StepError::Empty);
    }
    let mut moved_consumers = moved_consumers(r, &mut items, overlapping)?;
    let split = split_writers(r, &items)?;
    // Whether a replay of the schedule moves a step copy in (most do not).
    let moving = (items.iter())
        .any(|item| matches!(item, Item::Replay { slot, .. } if r.runners[*slot].moves()));
    // Per item its first node: a replay split at its ready points is one
    // node per part.
    let mut first = Vec::with_capacity(items.len());
    let mut nodes = 0;
    for k in 0..items.len() {
        first.push(nodes);
        nodes += split.nodes(k);
    }
    let execs = if overlapping { 2 } else { 1 };
    if overlapping {
        copies_for_two(r, &items)?;
    }
    let uses = uses_of(&items, &first, &split);
    let dry = run_dry(&r.fence, &r.plan, &uses, (lanes, nodes), overlapping)?;
    let event = || {
        r.backend
            .create_event()
            .map_err(|error| Operation::StepBuild.failed(error))
    };
    let mut events = Events {
        sources: {
            let mut v: Vec<usize> = dry.cross.iter().flatten().copied().collect();
            v.sort_unstable();
            v.dedup();
            v
        },
        nodes: Vec::with_capacity(execs),
        ends: Vec::with_capacity(execs),
    };
    if overlapping {
        for _ in 0..execs {
            let node_events: Result<Vec<B::Event>, _> =
                events.sources.iter().map(|_| event()).collect();
            events.nodes.push(node_events?);
            events.ends.push(event()?);
        }
    }
    let done = event()?;
    let start = if overlapping && dry.first_steady {
        Some(event()?)
    } else {
        None
    };
    let mut graphs: Vec<B::Graph> = Vec::with_capacity(execs);
    for x in 0..execs {
        let graph = compose(
            r,
            &items,
            &mut moved_consumers,
            &split,
            &dry,
            &events,
            (x, nodes),
            moving,
        )?;
        graphs.push(graph);
    }
    let edges = dry.deps.edges() + dry.cross.iter().map(Vec::len).sum::<usize>();
    let graph_memory = concurrent_share(r, &items, &first, &dry.deps);
    let Dry {
        deps,
        cross,
        touched,
        fence,
        restaged,
        ..
    } = dry;
    let held = fence.held();
    // Every node a whole replay of its runner's own graph: no consumer,
    // no step copy moved in, no writer split.
    let plain = moved_consumers.is_empty() && !moving && split.parts.is_empty();
    let tracing = tracing_of(r, items, split, (deps, cross), lane_ids, plain);
    let epoch = r.fence.epoch();
    let number = r.fence.number_step();
    Ok(StepGraph {
        core: StepCore {
            graphs,
            events,
            start,
            done,
            ledger: fence.into_ledger(),
            held,
            touched,
            launched: None,
            launches: 0,
            since: 0,
            turn: 0,
            epoch,
            uses,
            lanes,
            graph_memory,
            nodes,
            edges,
            tracing,
            restaged,
            number,
        },
        replayable: r,
    })
}

/// What one launch of the step graph holds of the driver's graph memory,
/// estimated ([`StepGraphMemory`](crate::StepGraphMemory)): the nodes that
/// may run at once are those at the same depth of the launch's edges
/// (`deps`, each node one level below its deepest dependency), and each
/// replay node among them takes its runner graph's share, its temporaries'
/// span in whole granules, and one granule more; the estimate is the
/// largest sum over a depth. A chain of handoffs takes one share at a time
/// whatever its streams; independent runners on two streams take two.
fn concurrent_share<B: Compose>(
    r: &Replayable<B>,
    items: &[Item<B>],
    first: &[usize],
    deps: &Adjacency,
) -> u64 {
    let no_share = |item: &Item<B>| match *item {
        Item::Replay { slot, .. } => r.runners[slot].temporaries.span == 0,
        Item::Consume { .. } => true,
    };
    if items.iter().all(no_share) {
        // No replay node takes a share: nothing at any depth.
        return 0;
    }
    let granule = r.backend.graph_memory_granule();
    let mut share = vec![0u64; deps.len()];
    for (k, item) in items.iter().enumerate() {
        let Item::Replay { slot, .. } = *item else {
            continue;
        };
        let span = r.runners[slot].temporaries.span;
        if span == 0 {
            continue;
        }
        // Every node of the replay (each part of a cut copy) takes it.
        let end = first.get(k + 1).copied().unwrap_or(deps.len());
        share[first[k]..end]
            .fill(GraphMemoryEstimate::share(span, granule).saturating_add(granule));
    }
    let mut depth = vec![0usize; deps.len()];
    let mut at_depth = vec![0u64; deps.len()];
    for n in 0..deps.len() {
        depth[n] = (deps.get(n).iter())
            .filter(|&&p| p < n)
            .map(|&p| depth[p] + 1)
            .max()
            .unwrap_or(0);
        at_depth[depth[n]] = at_depth[depth[n]].saturating_add(share[n]);
    }
    at_depth.into_iter().max().unwrap_or(0)
}

/// What the step graph keeps to compose a traced copy of itself: per node
/// where its graph comes from (the split writers' parts and the
/// consumers' graphs kept), its kind in a trace, its lane and its edges
/// (the dry run's, `deps` and `cross`, moved in).
fn tracing_of<B: Compose>(
    r: &Replayable<B>,
    items: Vec<Item<B>>,
    mut split: Splits<B::Graph>,
    (deps, cross): (Adjacency, Vec<Vec<usize>>),
    lanes: Vec<u64>,
    plain: bool,
) -> Tracing<B> {
    let whole = |(k, item): (usize, &Item<B>)| match item {
        Item::Replay { slot, .. } => !r.runners[*slot].moves() && split.parts(k).is_empty(),
        Item::Consume { .. } => false,
    };
    // `plain`: known so without a look at each item.
    if plain || items.iter().enumerate().all(whole) {
        // Every node a whole replay of its runner's own graph: the list
        // waits for the first traced launch.
        return Tracing::new(None, Vec::new(), lanes, (deps, cross));
    }
    let mut parts = std::mem::take(&mut split.parts);
    let mut held: Vec<B::Graph> = Vec::new();
    let mut nodes: Vec<TracedNode> = Vec::with_capacity(deps.len());
    let mut node = |source, kind: &UseKind, lane| {
        nodes.push(TracedNode {
            source,
            kind: kind.clone(),
            lane,
        });
    };
    for (k, item) in items.into_iter().enumerate() {
        match item {
            Item::Replay { slot, lane } => {
                let kind = UseKind::Replay {
                    runner: r.plan.runners[slot].id(),
                };
                let split_parts = parts.get_mut(k).map(std::mem::take).unwrap_or_default();
                if r.runners[slot].moves() {
                    for _ in 0..split.nodes(k) {
                        node(Source::Moved, &kind, lane);
                    }
                } else if !split_parts.is_empty() {
                    for part in split_parts {
                        held.push(part);
                        node(Source::Held(held.len() - 1), &kind, lane);
                    }
                } else {
                    node(Source::Runner(slot), &kind, lane);
                }
            }
            Item::Consume {
                slots,
                lane,
                exclusive,
                graph,
            } => {
                let kind = UseKind::Consume {
                    runners: slots.iter().map(|&s| r.plan.runners[s].id()).collect(),
                    writes: exclusive,
                };
                match graph {
                    Some(graph) => {
                        held.push(*graph);
                        node(Source::Held(held.len() - 1), &kind, lane);
                    }
                    None => node(Source::Moved, &kind, lane),
                }
            }
        }
    }
    Tracing::new(Some(nodes), held, lanes, (deps, cross))
}

/// A consumer whose graph allocates temporaries goes in moved, as a step
/// copy does: into one step graph only. Checked before any step copy is
/// touched, so a refusal keeps them all. Per item, the consumer's graph
/// taken to be moved in (none at all for a schedule of replays only).
fn moved_consumers<B: Compose>(
    r: &Replayable<B>,
    items: &mut [Item<B>],
    overlapping: bool,
) -> Result<Vec<Option<B::Graph>>, StepError> {
    if !items.iter().any(|i| matches!(i, Item::Consume { .. })) {
        // No consumer: nothing moved in (and no list to fill).
        return Ok(Vec::new());
    }
    let mut moved_consumers: Vec<Option<B::Graph>> = Vec::with_capacity(items.len());
    for item in items.iter_mut() {
        let mut moved = None;
        if let Item::Consume { slots, graph, .. } = item {
            let runner = r.plan.runners[slots[0]].id();
            let failed = |error| BackendFailure::of(Operation::StepBuild, runner, error);
            if let Some(g) = graph.as_ref() {
                let t = r.backend.graph_temporaries(g).map_err(failed)?;
                if !t.is_empty() {
                    if overlapping {
                        return Err(failed(BackendError::Refused {
                            call: "overlapping step graphs",
                            reason: "this consumer's graph allocates temporaries, which go \
                                     into one graph only (moved); build one step graph, or \
                                     give the consumer plan memory"
                                .into(),
                        })
                        .into());
                    }
                    moved = graph.take().map(|g| *g);
                }
            }
        }
        moved_consumers.push(moved);
    }
    Ok(moved_consumers)
}

/// The fence slots of the handoffs runner slot `slot` writes that its
/// graph marks ready.
fn ready<B: Compose>(r: &Replayable<B>, slot: usize) -> Vec<usize> {
    let writes = &r.plan.runners[slot].record.writes;
    if writes.is_empty() {
        // Most runners write no handoff: no list to make.
        return Vec::new();
    }
    writes
        .iter()
        .filter(|&&h| r.fence.is_ready(h))
        .map(|&h| r.fence.handoff_slot(h))
        .collect()
}

/// 1. Writers with ready points split at each: readers of a handoff start
///    where its ready point ends a part. A graph is split at its earliest
///    ready point, the rest at the earliest of the others, and so on; a
///    step copy moved in comes in the parts its capture cut it in (readers
///    of a handoff it was not cut at start after the whole copy).
fn split_writers<B: Compose>(
    r: &Replayable<B>,
    items: &[Item<B>],
) -> Result<Splits<B::Graph>, StepError> {
    let mut split = Splits {
        parts: Vec::new(),
        ends: Vec::new(),
        marks: Vec::new(),
    };
    for (k, item) in items.iter().enumerate() {
        let Item::Replay { slot, .. } = item else {
            continue;
        };
        let g = &r.runners[*slot];
        let marks = ready(r, *slot);
        if marks.is_empty() && (!g.moves() || g.cuts().is_empty()) {
            // Marks nothing ready, cut nowhere: one node.
            continue;
        }
        split.per_item(items.len());
        split.marks[k] = marks;
        let marks = &split.marks[k];
        let runner = r.plan.runners[*slot].id();
        let failed = |error| BackendFailure::of(Operation::StepBuild, runner, error);
        if g.moves() {
            // Cut at capture.
            for &h in g.cuts() {
                let at = r.fence.handoff_slot(h);
                if !marks.contains(&at) {
                    return Err(failed(BackendError::Refused {
                        call: "step graph",
                        reason: "its step copies were cut at a handoff it does not mark ready"
                            .into(),
                    })
                    .into());
                }
                split.ends[k].push(at);
            }
            continue;
        }
        let Some(graph) = g.graph.as_ref().filter(|_| !marks.is_empty()) else {
            // Nothing to split at (or nothing to split).
            continue;
        };
        let mut left: Vec<(usize, &B::Event)> = marks
            .iter()
            .filter_map(|&h| Some((h, r.fence.event(h)?)))
            .collect();
        let mut rest: Option<B::Graph> = None;
        while !left.is_empty() {
            let events: Vec<&B::Event> = left.iter().map(|&(_, e)| e).collect();
            let whole = rest.as_ref().unwrap_or(graph);
            let (part, after, which) = r.backend.split_graph(whole, &events).map_err(failed)?;
            split.parts[k].push(part);
            split.ends[k].push(left.remove(which).0);
            rest = Some(after);
        }
        split.parts[k].extend(rest);
    }
    Ok(split)
}

/// Two graphs launched in turn move in two step copies per replay of a
/// runner whose graph allocates.
fn copies_for_two<B: Compose>(r: &Replayable<B>, items: &[Item<B>]) -> Result<(), StepError> {
    for (k, item) in items.iter().enumerate() {
        if let Item::Replay { slot, .. } = item {
            let earlier = items[..k]
                .iter()
                .filter(|i| matches!(i, Item::Replay { slot: s, .. } if s == slot))
                .count();
            let g = &r.runners[*slot];
            if g.moves() && g.step_copies.len() < 2 * (earlier + 1) {
                return Err(StepError::NoStepCopy {
                    runner: r.plan.runners[*slot].id(),
                    allocations: g.temporaries.allocations,
                    captured: g.copies_made,
                });
            }
        }
    }
    Ok(())
}

/// The schedule as the fence sees it: each use's slots, lane, nodes and
/// the ready events it records where.
fn uses_of<B: Compose>(items: &[Item<B>], first: &[usize], split: &Splits<B::Graph>) -> Vec<Use> {
    let uses: Vec<Use> = items
        .iter()
        .enumerate()
        .map(|(k, item)| match item {
            Item::Replay { slot, lane } => {
                // A ready event is recorded where it ends a part; the
                // others at the end of the last.
                let ends = split.ends(k);
                let marks = match split.marks(k) {
                    [] => Vec::new(),
                    marks => (marks.iter())
                        .map(|&h| {
                            let part = ends.iter().position(|&e| e == h).unwrap_or(ends.len());
                            (h, first[k] + part)
                        })
                        .collect(),
                };
                Use::Replay {
                    slot: *slot,
                    lane: *lane,
                    first: first[k],
                    count: split.nodes(k),
                    marks,
                }
            }
            Item::Consume {
                slots,
                lane,
                exclusive,
                ..
            } => Use::Consume {
                slots: slots.clone(),
                lane: *lane,
                first: first[k],
                exclusive: *exclusive,
            },
        })
        .collect();
    uses
}

/// 2. Runs the schedule through the fence dry, starting where the plan's
///    fence stands (a consumer before its runner's replay in the step reads
///    what the last replay before the step graph left, if it is still
///    there), until a pass is the steady state. One graph: one pass when
///    the schedule reads only what it wrote ([`self_contained`]: every
///    launch then checks and waits alike, the first included), two
///    otherwise, on the same lanes; waits on the step before are implied
///    by launch order. Two graphs launched in turn: passes alternate
///    between two sets of lanes, so the fence sees the step before on
///    other streams and every wait on it is a cross edge; waits on the step
///    before that are implied (it is the same graph's previous launch).
fn run_dry<C: crate::backend::Streams>(
    plan_fence: &Fence<C>,
    plan: &crate::plan::Planned,
    uses: &[Use],
    shape: (usize, usize),
    overlapping: bool,
) -> Result<Dry, StepError> {
    let passes = match overlapping {
        true => 6,
        false if self_contained(plan_fence, plan, uses) => 1,
        false => 2,
    };
    dry_passes(plan_fence, plan, uses, shape, overlapping, passes)
}

/// [`run_dry`] with at most `passes` passes (one: the first is taken as
/// the steady state), on `lanes` lanes of `nodes` nodes.
fn dry_passes<C: crate::backend::Streams>(
    plan_fence: &Fence<C>,
    plan: &crate::plan::Planned,
    uses: &[Use],
    (lanes, nodes): (usize, usize),
    overlapping: bool,
    passes: usize,
) -> Result<Dry, StepError> {
    let execs = if overlapping { 2 } else { 1 };
    let dry = DryRun::new(execs * lanes, nodes, overlapping);
    let mut fence = dry_fence(plan_fence, &dry, plan, uses);
    let touched = touched(&fence, plan, uses);
    // The edges of the passes after the first (of the first, when it is
    // the only one): of the latest, of the one before it, and (two graphs
    // in turn, where more than two of them may run) a copy of the first
    // of them.
    let (mut last, mut before): (Option<Edges>, Option<Edges>) = (None, None);
    let mut first_kept: Option<Edges> = None;
    let mut restaged = Vec::new();
    let mut slots: Vec<usize> = Vec::new();
    for pass in 0..passes {
        let offset = (pass % execs) * lanes;
        dry.begin_pass(pass, offset..offset + lanes);
        if pass == 1 {
            restaged = taken_inputs(plan, uses, &mut fence);
            slots = restaged.iter().map(|&(slot, _)| slot).collect();
        }
        // The program stages those before each launch after the first.
        restage(&mut fence, &dry, plan, &slots)?;
        dry_pass(&mut fence, &dry, plan, uses, offset)?;
        if pass > 0 || passes == 1 {
            // The pass two before is no longer needed: the next pass
            // writes into its lists.
            let edges = dry.take_edges(before.take(), pass + 1 == passes);
            before = last.replace(edges);
            if pass == 1 && passes > 3 {
                first_kept = last.clone();
            }
            // Steady: two passes in a row wait alike.
            if before.is_some() && before == last {
                break;
            }
        }
    }
    let steady = before.is_none() || before == last;
    // The second graph's first launch waits node by node for the first's
    // when the first pass after the first was already steady; otherwise for
    // the whole first launch.
    let first_steady = match (&first_kept, &before) {
        (Some(first), _) => Some(first) == last.as_ref(),
        // One or two passes kept: the first is the one before the latest.
        (None, Some(b)) => Some(b) == last.as_ref(),
        (None, None) => true,
    };
    let Some((deps, cross)) = last.filter(|_| steady) else {
        return Err(Operation::StepBuild
            .failed(BackendError::Refused {
                call: "step graph",
                reason: "the fence's waits for the schedule did not settle into a steady state"
                    .into(),
            })
            .into());
    };
    // Every event node costs a launch host time and the device a wait:
    // keep only the cross edges nothing else implies.
    let cross = reduce_cross(&deps, &cross);
    let restaged = restaged
        .into_iter()
        .map(|(slot, by)| (plan.runners[slot].id(), by))
        .collect();
    Ok(Dry {
        deps,
        cross,
        touched,
        first_steady,
        fence,
        restaged,
    })
}

/// Whether the schedule `uses` reads only what it wrote itself, before
/// the read: each handoff a replay reads was written by an earlier replay
/// of the schedule, each fenced runner a consumer reads was replayed
/// earlier in it, and no runner of it stages inputs. Every check and wait
/// of a launch then meets either the schedule's own earlier uses, the same
/// at every launch, or whatever ran before the launch, which launch order
/// (and the launch's own waits) covers, and which the dry fence's exact
/// records keep from moving any edge: the first pass of the dry run is
/// the steady state.
fn self_contained<C: crate::backend::Streams>(
    fence: &Fence<C>,
    plan: &crate::plan::Planned,
    uses: &[Use],
) -> bool {
    // Per replayed slot, its first replay's place in the schedule (in
    // proportion to the step, not to the plan), found at the first read.
    let mut firsts: Option<Vec<(usize, usize)>> = None;
    let mut before = |slot: usize, at: usize| {
        let firsts = firsts.get_or_insert_with(|| first_replays(uses));
        (firsts.binary_search_by_key(&slot, |&(s, _)| s)).is_ok_and(|k| firsts[k].1 < at)
    };
    for (at, u) in uses.iter().enumerate() {
        match u {
            Use::Replay { slot, .. } => {
                if fence.stages(*slot) {
                    return false;
                }
                for h in &plan.runners[*slot].record.reads {
                    if !before(plan.handoffs[h.0 as usize].record.writer, at) {
                        return false;
                    }
                }
            }
            Use::Consume { slots, .. } => {
                for &s in slots {
                    if fence.stages(s) || (fence.is_fenced(s) && !before(s, at)) {
                        return false;
                    }
                }
            }
        }
    }
    true
}

/// Per runner slot `uses` replays, ascending, the place of its first
/// replay.
fn first_replays(uses: &[Use]) -> Vec<(usize, usize)> {
    let mut firsts: Vec<(usize, usize)> = (uses.iter().enumerate())
        .filter_map(|(at, u)| match u {
            Use::Replay { slot, .. } => Some((*slot, at)),
            Use::Consume { .. } => None,
        })
        .collect();
    firsts.sort_unstable();
    firsts.dedup_by_key(|&mut (slot, _)| slot);
    firsts
}

/// The staged runners (`Purpose::Input`) the schedule replays, with no
/// `consume_mut` of their own before their first replay in it, whose
/// bytes the step has taken by its end (`fence`: after one pass), each
/// with the runner that took them. Launched again, the step would replay
/// them on that runner's bytes: the program stages them between launches
/// (as before the first), and a launch right after the step's own launch
/// is refused.
fn taken_inputs(
    plan: &crate::plan::Planned,
    uses: &[Use],
    fence: &mut Fence<DryRun>,
) -> Vec<(usize, RunnerId)> {
    let mut out: Vec<(usize, RunnerId)> = Vec::new();
    let mut seen: Vec<usize> = Vec::new();
    for u in uses {
        let slot = match u {
            Use::Replay { slot, .. } => *slot,
            Use::Consume {
                slots,
                exclusive: true,
                ..
            } if slots.len() == 1 => {
                // Staged inside the step: it stages itself.
                seen.push(slots[0]);
                continue;
            }
            Use::Consume { .. } => continue,
        };
        if seen.contains(&slot) || !fence.stages(slot) {
            continue;
        }
        seen.push(slot);
        // A reader's check: refused when another runner took the staged
        // runner's bytes.
        if let Err(ConsumeError::Overwritten { by, .. }) = fence.check_consumable(plan, &[slot]) {
            out.push((slot, by));
        }
    }
    out
}

/// 3. Graph `x` of the step (of two when overlapping): the runners' graphs
///    (or their parts, or their step copies moved in, in parts) and the
///    consumers' graphs, with the dry run's edges; when overlapping, per
///    node an event it records for the other graph's next launch and the
///    other graph's events it waits for, and an end.
#[allow(clippy::too_many_arguments)] // one graph's parts
fn compose<B: Compose>(
    r: &mut Replayable<B>,
    items: &[Item<B>],
    moved_consumers: &mut [Option<B::Graph>],
    split: &Splits<B::Graph>,
    dry: &Dry,
    events: &Events<B>,
    (x, nodes): (usize, usize),
    moving: bool,
) -> Result<B::Graph, StepError> {
    let deps = &dry.deps;
    // The step copies this graph moves in, one per replay of a runner
    // whose graph allocates (no list when none does: `moving`).
    let mut taken: Vec<Option<StepCopy<B::Graph>>> = match moving {
        false => Vec::new(),
        true => (items.iter())
            .map(|item| match item {
                Item::Replay { slot, .. } if r.runners[*slot].moves() => {
                    r.runners[*slot].step_copies.pop()
                }
                _ => None,
            })
            .collect(),
    };
    let mut step_nodes: Vec<StepNode<'_, B::Graph, B::Event>> = Vec::with_capacity(nodes);
    for (k, item) in items.iter().enumerate() {
        let (lane, graphs) = match item {
            // Most nodes: a whole replay of a runner's own graph, copied
            // (what `replay_node_graphs` gives it), pushed as it is. No
            // list taken: no replay of the schedule moves a copy in.
            Item::Replay { slot, lane } if taken.is_empty() && split.parts(k).is_empty() => {
                debug_assert!(!r.runners[*slot].moves());
                if let Some(graph) = &r.runners[*slot].graph {
                    let n = step_nodes.len();
                    step_nodes.push(StepNode::new(NodeGraph::Copy(graph), deps.get(n), *lane));
                }
                continue;
            }
            Item::Replay { slot, lane } => {
                let copy = taken.get_mut(k).and_then(Option::take);
                (*lane, replay_node_graphs(r, *slot, copy, split, k)?)
            }
            Item::Consume {
                slots, lane, graph, ..
            } => {
                let name = r.plan.runners[slots[0]].id();
                let own = graph.as_deref();
                let moved = moved_consumers.get_mut(k).and_then(Option::take);
                let graph = consumer_node_graph(name, own, moved)?;
                (*lane, NodeGraphs::One(Some(graph)))
            }
        };
        for graph in graphs {
            let n = step_nodes.len();
            step_nodes.push(StepNode::new(graph, deps.get(n), lane));
        }
    }
    let end = events.wire(&mut step_nodes, &dry.cross, x);
    // The copied graphs, with their runners: asked for only when the
    // backend refuses.
    let copied = || {
        let mut copied: Vec<(&B::Graph, RunnerId)> = Vec::new();
        for (k, item) in items.iter().enumerate() {
            match item {
                Item::Replay { slot, .. } if !r.runners[*slot].moves() => {
                    let name = r.plan.runners[*slot].id();
                    let parts = split.parts(k).iter();
                    match split.parts(k).is_empty() {
                        true => copied.extend(r.runners[*slot].graph.iter().map(|g| (g, name))),
                        false => copied.extend(parts.map(|g| (g, name))),
                    }
                }
                Item::Consume { slots, graph, .. } => {
                    let name = r.plan.runners[slots[0]].id();
                    copied.extend(graph.as_deref().map(|g| (g, name)));
                }
                Item::Replay { .. } => {}
            }
        }
        copied
    };
    compose_naming(&r.backend, step_nodes, end, copied)
}

/// The graphs of one item's nodes, in order (no list of its own: most
/// items are one node).
enum NodeGraphs<'g, G> {
    /// A step copy's parts, moved in.
    Moved(std::vec::IntoIter<G>),
    /// A split writer's parts, copied.
    Parts(std::slice::Iter<'g, G>),
    /// One graph (or none).
    One(Option<NodeGraph<'g, G>>),
}

impl<'g, G> Iterator for NodeGraphs<'g, G> {
    type Item = NodeGraph<'g, G>;

    fn next(&mut self) -> Option<NodeGraph<'g, G>> {
        match self {
            NodeGraphs::Moved(parts) => parts.next().map(NodeGraph::Move),
            NodeGraphs::Parts(parts) => parts.next().map(NodeGraph::Copy),
            NodeGraphs::One(graph) => graph.take(),
        }
    }
}

/// The graphs of item `k`, a replay of runner slot `slot`: its step copy
/// (`copy`, moved in, in as many parts as the schedule counted nodes), its
/// split parts, or its graph.
fn replay_node_graphs<'g, B: Compose>(
    r: &'g Replayable<B>,
    slot: usize,
    copy: Option<StepCopy<B::Graph>>,
    split: &'g Splits<B::Graph>,
    k: usize,
) -> Result<NodeGraphs<'g, B::Graph>, StepError> {
    if r.runners[slot].moves() {
        // Checked above and in `replay`: a copy is left for each.
        let Some(copy) = copy.filter(|c| c.parts.len() == split.nodes(k)) else {
            return Err(BackendFailure::of(
                Operation::StepBuild,
                r.plan.runners[slot].id(),
                BackendError::Refused {
                    call: "step graph",
                    reason: "no step copy left (in as many parts as scheduled)".into(),
                },
            )
            .into());
        };
        return Ok(NodeGraphs::Moved(copy.parts.into_iter()));
    }
    if !split.parts(k).is_empty() {
        return Ok(NodeGraphs::Parts(split.parts(k).iter()));
    }
    let graph = r.runners[slot].graph.as_ref();
    Ok(NodeGraphs::One(graph.map(NodeGraph::Copy)))
}

/// A consumer's graph (named by its first runner, `name`): the one moved
/// in (it allocates), or its own, copied.
fn consumer_node_graph<'g, G>(
    name: RunnerId,
    own: Option<&'g G>,
    moved: Option<G>,
) -> Result<NodeGraph<'g, G>, StepError> {
    match (own, moved) {
        (_, Some(moved)) => Ok(NodeGraph::Move(moved)),
        (Some(g), None) => Ok(NodeGraph::Copy(g)),
        (None, None) => Err(BackendFailure::of(
            Operation::StepBuild,
            name,
            BackendError::Refused {
                call: "step graph",
                reason: "the consumer's graph went into an earlier graph".into(),
            },
        )
        .into()),
    }
}

/// Composes `step_nodes` with `end`; when the backend refuses, names the
/// runner whose copied graph it refuses alone, if one is (`copied`: the
/// copied graphs and their runners, asked for then only).
fn compose_naming<'g, B: Compose>(
    backend: &B,
    step_nodes: Vec<StepNode<'_, B::Graph, B::Event>>,
    end: Option<StepEnd<'_, B::Event>>,
    copied: impl FnOnce() -> Vec<(&'g B::Graph, RunnerId)>,
) -> Result<B::Graph, StepError>
where
    B::Graph: 'g,
{
    backend.compose(step_nodes, end).map_err(|error| {
        let runner = copied()
            .into_iter()
            .find(|(g, _)| {
                let alone = StepNode::new(NodeGraph::Copy(*g), &[], 0);
                backend.compose(vec![alone], None).is_err()
            })
            .map(|(_, runner)| runner);
        StepError::Backend(BackendFailure {
            op: Operation::StepBuild,
            runner,
            error,
        })
    })
}

#[cfg(test)]
mod tests;
