//! The dry run: a step schedule run through the fence on a dry backend
//! whose streams are the schedule's lanes and whose events remember the
//! node last run on the stream they were recorded on, so the fence's waits
//! become the step graph's edges.

use std::cell::RefCell;
use std::rc::Rc;

use super::ScheduleError;
use crate::backend::{BackendError, Streams};
use crate::fence::{sort_dedup, Fence, On};

/// One use of a compiled schedule, as the fence sees it.
#[derive(Clone, Debug)]
pub(super) enum Use {
    Replay {
        slot: usize,
        lane: usize,
        /// Its first node, and how many (two when split at a ready point).
        first: usize,
        count: usize,
        /// (ready event, node that records it).
        marks: Vec<(usize, usize)>,
    },
    Consume {
        slots: Vec<usize>,
        lane: usize,
        first: usize,
        exclusive: bool,
    },
}

/// The runner slots a schedule replays, and those its consumers read:
/// what its dry run's fence holds ([`Fence::start_from`]).
pub(super) fn reach(uses: &[Use]) -> (Vec<usize>, Vec<usize>) {
    let (mut replays, mut consumes) = (Vec::with_capacity(uses.len()), Vec::new());
    for u in uses {
        match u {
            Use::Replay { slot, .. } => replays.push(*slot),
            Use::Consume { slots, .. } => consumes.extend_from_slice(slots),
        }
    }
    for slots in [&mut replays, &mut consumes] {
        sort_dedup(slots);
    }
    (replays, consumes)
}

/// A fence that starts where `fence` (the plan's) stands, holding what
/// the schedule `uses` can meet; `dry` gets an event of its own for each
/// fenced slot it holds.
pub(super) fn dry_fence<C: Streams>(
    fence: &Fence<C>,
    dry: &DryRun,
    plan: &crate::plan::Planned,
    uses: &[Use],
) -> Fence<DryRun> {
    let (replays, consumes) = reach(uses);
    // Room for an event per runner, per handoff its slot's and a
    // reader's, and a few latest users from before the step.
    let handoffs: usize = (replays.iter())
        .map(|&slot| &plan.runners[slot].record)
        .map(|record| record.writes.len() + record.reads.len())
        .sum();
    let room = replays.len() + consumes.len() + 2 * handoffs + 2;
    // The fenced slots it holds, ascending (asked for so): slot
    // `slots[k]`'s event is event `k`, the first ones.
    let mut slots = Vec::with_capacity(room);
    let fence = Fence::start_from(fence, plan, (&replays, &consumes), |slot| {
        slots.push(slot);
        DryEvent(slots.len() - 1)
    });
    dry.slot_events(slots, room);
    fence
}

/// One pass of the schedule through `fence`, on lanes `offset..`: every
/// wait and record it makes goes to `dry`.
pub(super) fn dry_pass(
    fence: &mut Fence<DryRun>,
    dry: &DryRun,
    plan: &crate::plan::Planned,
    uses: &[Use],
    offset: usize,
) -> Result<(), ScheduleError> {
    for u in uses {
        match u {
            Use::Replay {
                slot,
                lane,
                first,
                count,
                marks,
            } => {
                let id = offset + *lane;
                let on = On {
                    stream: &Lane(id),
                    id: id as u64,
                };
                fence.replay(dry, plan, *slot, on, || {
                    dry.run(*first, *count, id);
                    Ok(())
                })?;
                for &(h, node) in marks {
                    dry.mark(h, node);
                }
            }
            Use::Consume {
                slots,
                lane,
                first,
                exclusive,
            } => {
                let id = offset + *lane;
                let on = On {
                    stream: &Lane(id),
                    id: id as u64,
                };
                fence.consume(dry, plan, slots, on, *exclusive, || {
                    (dry.run(*first, 1, id), true)
                })?;
            }
        }
    }
    Ok(())
}

/// The fence slots the schedule `uses` uses, ascending, each once: its
/// replays' runners and the handoffs they write, and the fenced runners
/// its consumers read (the same in every pass: what a launch of the step
/// leaves its latest users).
pub(super) fn touched(
    fence: &Fence<DryRun>,
    plan: &crate::plan::Planned,
    uses: &[Use],
) -> Vec<usize> {
    // Room for a runner and a handoff it writes per use (not grown for
    // a chain of handoffs).
    let mut touched = Vec::with_capacity(2 * uses.len());
    for u in uses {
        match u {
            Use::Replay { slot, .. } => {
                touched.push(*slot);
                for &h in &plan.runners[*slot].record.writes {
                    touched.push(fence.handoff_slot(h));
                }
            }
            Use::Consume { slots, .. } => {
                touched.extend(slots.iter().filter(|&&slot| fence.is_fenced(slot)));
            }
        }
    }
    sort_dedup(&mut touched);
    touched
}

/// The staging the program does between two launches of a step graph
/// whose own replays take the bytes of a staged runner (`slots`): a
/// `consume_mut` of each, on the dry run's staging lane, which runs no
/// node, so the staged runners' replays in the next pass wait for nothing
/// of the pass (the launch after a staging waits for everything the fence
/// knows of first).
pub(super) fn restage(
    fence: &mut Fence<DryRun>,
    dry: &DryRun,
    plan: &crate::plan::Planned,
    slots: &[usize],
) -> Result<(), ScheduleError> {
    let lane = dry.stage_lane();
    for &slot in slots {
        let on = On {
            stream: &Lane(lane),
            id: lane as u64,
        };
        fence.consume(dry, plan, &[slot], on, true, || ((), true))?;
    }
    Ok(())
}

/// The cross edges (`cross[x]`: nodes of the other graph's launch before
/// that node `x` waits for) that neither `x`'s other cross edges nor its
/// ancestors' imply, given both graphs' edges `deps` (the same schedule:
/// waiting for node `y` implies waiting for `y`'s ancestors).
pub(super) fn reduce_cross(deps: &Adjacency, cross: &Adjacency) -> Vec<Vec<usize>> {
    let n = deps.len();
    if cross.edges() == 0 {
        // One graph: nothing to reduce (and no square tables to fill), and
        // no list at all (a node past the end has none).
        return Vec::new();
    }
    // ancestors[y][z]: y runs after z, in one launch.
    let mut ancestors = vec![vec![false; n]; n];
    for y in 0..n {
        for &d in deps.get(y) {
            if d < y {
                ancestors[y][d] = true;
                let (before, rest) = ancestors.split_at_mut(y);
                for (z, &a) in before[d].iter().enumerate() {
                    rest[0][z] |= a;
                }
            }
        }
    }
    // reached[x][z]: x runs after node z of the launch before.
    let mut reached = vec![vec![false; n]; n];
    let mut out = vec![Vec::new(); n];
    for x in 0..n {
        let mut implied = vec![false; n];
        for &d in deps.get(x) {
            if d < x {
                for (z, &r) in reached[d].iter().enumerate() {
                    implied[z] |= r;
                }
            }
        }
        // The latest sources first: an earlier one may be their ancestor.
        let mut mine: Vec<usize> = cross.get(x).iter().copied().filter(|&y| y < n).collect();
        mine.sort_unstable_by(|a, b| b.cmp(a));
        for y in mine {
            if implied[y] {
                continue;
            }
            out[x].push(y);
            implied[y] = true;
            for (z, &a) in ancestors[y].iter().enumerate() {
                implied[z] |= a;
            }
        }
        out[x].sort_unstable();
        reached[x] = implied;
    }
    out
}

/// The backend a step schedule is dry-run on: streams are the schedule's
/// streams (lanes; for overlapping step graphs, two sets of them, one per
/// graph), a "launch" runs step graph nodes, and every event remembers the
/// node last run on the stream it was recorded on, and in which pass.
#[derive(Clone)]
pub(super) struct DryRun {
    state: Rc<RefCell<Passes>>,
}

/// A node of one pass of the schedule: (pass, node).
pub(super) type Ran = (usize, usize);

/// Per node: the nodes of its own launch it runs after, and those of the
/// launch before (overlapping step graphs).
pub(super) type Edges = (Adjacency, Adjacency);

/// Per node, a list of nodes (the nodes it runs after), every list in one
/// allocation: a dry run writes one per node and pass, and the step graph
/// keeps them.
#[derive(Clone, Debug, Default)]
pub(super) struct Adjacency {
    /// Node `n`'s list: `flat[start..start + len]`, `spans[n] = (start, len)`.
    spans: Vec<(usize, usize)>,
    flat: Vec<usize>,
}

impl Adjacency {
    /// `nodes` empty lists.
    pub(super) fn new(nodes: usize) -> Adjacency {
        Adjacency {
            spans: vec![(0, 0); nodes],
            flat: Vec::new(),
        }
    }

    /// Nodes.
    pub(super) fn len(&self) -> usize {
        self.spans.len()
    }

    /// Entries of every list.
    pub(super) fn edges(&self) -> usize {
        self.spans.iter().map(|&(_, len)| len).sum()
    }

    /// Node `n`'s list (empty past the last node).
    pub(super) fn get(&self, n: usize) -> &[usize] {
        match self.spans.get(n) {
            Some(&(start, len)) => &self.flat[start..start + len],
            None => &[],
        }
    }

    /// Every list, by node.
    pub(super) fn lists(&self) -> impl Iterator<Item = &[usize]> + '_ {
        (0..self.len()).map(|n| self.get(n))
    }

    /// Every list empty again, the room kept.
    fn clear(&mut self) {
        self.spans.fill((0, 0));
        self.flat.clear();
    }

    /// Makes node `n`'s list `item` (none or one).
    fn set_one(&mut self, n: usize, item: Option<usize>) {
        let start = self.flat.len();
        self.flat.extend(item);
        self.spans[n] = (start, self.flat.len() - start);
    }

    /// Makes node `n`'s list `items`, ascending, each once.
    fn set(&mut self, n: usize, items: impl IntoIterator<Item = usize>) {
        let start = self.flat.len();
        self.flat.extend(items);
        let list = &mut self.flat[start..];
        // Most lists hold one node or two (stream order, and one wait).
        match list {
            [] | [_] => {}
            [a, b] => {
                if a > b {
                    std::mem::swap(a, b);
                }
            }
            _ => list.sort_unstable(),
        }
        let mut len = 0;
        for i in 0..list.len() {
            if len == 0 || list[i] != list[len - 1] {
                list[len] = list[i];
                len += 1;
            }
        }
        self.flat.truncate(start + len);
        self.spans[n] = (start, len);
    }
}

impl PartialEq for Adjacency {
    fn eq(&self, other: &Adjacency) -> bool {
        self.len() == other.len() && self.lists().eq(other.lists())
    }
}

impl Eq for Adjacency {}

pub(super) struct Passes {
    /// Per lane: its latest node (a lane of the pass before keeps its
    /// tail: the fence may record an event there late), and nodes the next
    /// one waits for.
    tails: Vec<Option<Ran>>,
    waits: Vec<Vec<Ran>>,
    /// Per event (by its id, [`DryEvent`]): the node its latest record
    /// follows (`None`: before this pass's nodes on its lane, which launch
    /// order covers, or never recorded). In proportion to the step: one
    /// per fenced slot the dry fence holds, then one per event it created.
    recorded: Vec<Option<Ran>>,
    /// The fence slots whose events are the first ones, ascending: slot
    /// `slot_events[k]`'s event is event `k` (a ready point names its
    /// event by its handoff's slot, [`DryRun::mark`]).
    slot_events: Vec<usize>,
    /// Per node, from the latest pass: the nodes of the same pass it runs
    /// after, and those of the pass before (waits on the other graph's
    /// launch, for overlapping step graphs; launch order covers them for
    /// one graph).
    deps: Adjacency,
    cross: Adjacency,
    /// Overlapping step graphs: lanes per graph (lane `l` of one graph is
    /// lane `l + half` of the other, modulo `2 * half`); 0 for one graph.
    half: usize,
    /// The lane after the schedule's, where stagings between launches go
    /// ([`restage`]): it runs no node.
    stage: usize,
    pass: usize,
    /// Nodes run in this pass.
    ran: usize,
}

#[derive(Clone)]
pub(super) struct Lane(pub(super) usize);

/// An event of the dry run: an index into its records (not a fence
/// slot: [`DryRun::slot_events`]).
pub(super) struct DryEvent(pub(super) usize);

impl DryRun {
    pub(super) fn new(lanes: usize, nodes: usize, overlapping: bool) -> DryRun {
        DryRun {
            state: Rc::new(RefCell::new(Passes {
                tails: vec![None; lanes + 1],
                waits: vec![Vec::new(); lanes + 1],
                // Room made by the dry fence ([`dry_fence`]).
                recorded: Vec::new(),
                slot_events: Vec::new(),
                deps: Adjacency {
                    // About one wait per node.
                    flat: Vec::with_capacity(nodes),
                    ..Adjacency::new(nodes)
                },
                // One graph: no node waits on the launch before.
                cross: Adjacency::new(if overlapping { nodes } else { 0 }),
                half: if overlapping { lanes / 2 } else { 0 },
                stage: lanes,
                pass: 0,
                ran: 0,
            })),
        }
    }

    /// The fenced slots whose events are the first ones, ascending (slot
    /// `slots[k]`'s event is event `k`), before any other event is
    /// created; room for `events` events in all.
    pub(super) fn slot_events(&self, slots: Vec<usize>, events: usize) {
        let mut t = self.state.borrow_mut();
        debug_assert!(
            t.recorded.is_empty() && slots.windows(2).all(|w| w[0] < w[1]),
            "slot events come first, in ascending slot order"
        );
        t.recorded = Vec::with_capacity(events.max(slots.len()));
        t.recorded.resize(slots.len(), None);
        t.slot_events = slots;
    }

    /// Pass `pass` of the schedule: a new step on lanes `lanes`, whose
    /// tails start fresh.
    pub(super) fn begin_pass(&self, pass: usize, lanes: std::ops::Range<usize>) {
        let mut t = self.state.borrow_mut();
        for lane in lanes {
            t.tails[lane] = None;
            t.waits[lane].clear();
        }
        let stage = t.stage;
        t.waits[stage].clear();
        t.pass = pass;
        t.ran = 0;
    }

    /// The staging lane ([`restage`]).
    pub(super) fn stage_lane(&self) -> usize {
        self.state.borrow().stage
    }

    /// Runs nodes `first..first + parts` on `lane`, one after another.
    pub(super) fn run(&self, first: usize, parts: usize, lane: usize) {
        let mut guard = self.state.borrow_mut();
        let t = &mut *guard;
        let pass = t.pass;
        for node in first..first + parts {
            // Each node's lists go where the pass before left room
            // (`take_edges`): nothing allocated once they have grown.
            let waits = &t.waits[lane];
            let tail = t.tails[lane];
            let same = |&(p, n): &Ran| (p == pass).then_some(n);
            match (waits.as_slice(), tail.as_ref().and_then(same)) {
                // Most nodes: stream order alone, or nothing.
                ([], tail) => t.deps.set_one(node, tail),
                (waits, tail) => t.deps.set(node, waits.iter().filter_map(same).chain(tail)),
            }
            // Waits on the pass before: the other graph's launch (older
            // passes are this graph's previous launch, complete first). And
            // a lane's first node runs after that lane's last node of the
            // pass before: the schedule's streams keep their order across
            // steps, as replays on them do (consumers accumulating into one
            // buffer on one stream, say).
            // (One graph: none, its lists stay empty.)
            if t.half > 0 {
                let twin = (lane + t.half) % (2 * t.half);
                let twin = (t.tails[twin])
                    .filter(|&(p, _)| tail.is_none() && p + 1 == pass)
                    .map(|(_, n)| n);
                t.cross.set(
                    node,
                    (waits.iter())
                        .filter(|(p, _)| *p + 1 == pass)
                        .map(|&(_, n)| n)
                        .chain(twin),
                );
            }
            t.waits[lane].clear();
            t.tails[lane] = Some((pass, node));
            t.ran += 1;
        }
    }

    /// The event of fence slot `slot` was recorded inside node `node` of
    /// this pass (a slot with no event of the dry fence's: nobody waits
    /// for it).
    pub(super) fn mark(&self, slot: usize, node: usize) {
        let mut t = self.state.borrow_mut();
        let pass = t.pass;
        if let Ok(k) = t.slot_events.binary_search(&slot) {
            t.recorded[k] = Some((pass, node));
        }
    }

    /// The latest pass's edges, (same pass, pass before), taken out of
    /// the dry run; `spare` (the edges of an earlier pass, no longer
    /// needed) is where the next pass writes its own, so that passes
    /// after the first two allocate nothing.
    /// After the `last` pass, nothing is left in their place.
    pub(super) fn take_edges(&self, spare: Option<Edges>, last: bool) -> Edges {
        let mut t = self.state.borrow_mut();
        // A pass that succeeded ran every node once.
        debug_assert_eq!(t.ran, t.deps.len(), "a pass ran every node once");
        if last {
            let deps = std::mem::take(&mut t.deps);
            let cross = std::mem::take(&mut t.cross);
            return (deps, cross);
        }
        let (nodes, crossing) = (t.deps.len(), t.cross.len());
        let (mut deps, mut cross) = spare
            .filter(|(d, c)| d.len() == nodes && c.len() == crossing)
            .unwrap_or_else(|| (Adjacency::new(nodes), Adjacency::new(crossing)));
        deps.clear();
        cross.clear();
        let deps = std::mem::replace(&mut t.deps, deps);
        let cross = std::mem::replace(&mut t.cross, cross);
        (deps, cross)
    }
}

impl Streams for DryRun {
    type Event = DryEvent;

    type Stream = Lane;

    fn create_event(&self) -> Result<DryEvent, BackendError> {
        let mut t = self.state.borrow_mut();
        t.recorded.push(None);
        Ok(DryEvent(t.recorded.len() - 1))
    }

    fn stream_id(&self, stream: &Lane) -> u64 {
        stream.0 as u64
    }

    fn wait_event(&self, stream: &Lane, event: &DryEvent) -> Result<(), BackendError> {
        let mut t = self.state.borrow_mut();
        if let Some(&Some(node)) = t.recorded.get(event.0) {
            t.waits[stream.0].push(node);
        }
        Ok(())
    }

    fn record_event(&self, stream: &Lane, event: &DryEvent) -> Result<(), BackendError> {
        let mut t = self.state.borrow_mut();
        let tail = t.tails[stream.0];
        if let Some(recorded) = t.recorded.get_mut(event.0) {
            *recorded = tail;
        }
        Ok(())
    }

    fn synchronize_event(&self, _: &DryEvent) -> Result<(), BackendError> {
        Ok(())
    }

    fn is_capturing(&self, _: &Lane) -> Result<bool, BackendError> {
        Ok(false)
    }

    fn synchronize(&self) -> Result<(), BackendError> {
        Ok(())
    }
}
