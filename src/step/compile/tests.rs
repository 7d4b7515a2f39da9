//! The dry run's one pass against its two: a schedule that reads only what
//! it wrote (`self_contained`) gets the same edges, checks and ledger from
//! its first pass as from the pass after it.

use super::*;
use crate::backend::sim;
use crate::backend::Streams;
use crate::discover::{Discovering, PlanConfig};
use crate::plan::{Planned, Policy};
use crate::vocab::{DType, Domain, HandoffId, Purpose, Request};
use proptest::prelude::*;

/// A plan of `runners`: per runner its elements and the earlier runners'
/// handoffs it reads (each by index into the handoffs handed out so far),
/// and whether it hands one off; at `generations`, and with the runners
/// whose index `staged` has (modulo their number) reading inputs the
/// program stages.
#[derive(Clone, Debug)]
struct PlanShape {
    runners: Vec<(usize, Vec<usize>, bool)>,
    generations: usize,
    staged: Vec<usize>,
}

fn plan_of(shape: &PlanShape) -> Planned {
    let mut d = Discovering::new(PlanConfig::new());
    let mut handoffs: Vec<HandoffId> = Vec::new();
    for (r, (elements, reads, writes)) in shape.runners.iter().enumerate() {
        let q = Request::new(Domain::Device, DType::F32, 64 * *elements as u64);
        let mut armed = d.arm(RunnerId(r as u32)).unwrap();
        armed.record(q).unwrap();
        if shape.staged.iter().any(|&k| k % shape.runners.len() == r) {
            armed.record(q.purpose(Purpose::Input)).unwrap();
        }
        let mut seen = Vec::new();
        for &k in reads {
            if let Some(&h) = handoffs.get(k % handoffs.len().max(1)) {
                if !seen.contains(&h) {
                    seen.push(h);
                    armed.receive(h).unwrap();
                }
            }
        }
        if *writes {
            handoffs.push(armed.hand_off(q).unwrap());
        }
    }
    d.plan(Policy::Generations(shape.generations)).unwrap()
}

/// One use, before its slot is taken modulo the plan's runners: a replay
/// `(true, slot, lane, _)` or a consumer `(false, slot, lane, exclusive)`.
type Op = (bool, usize, usize, bool);

fn shape() -> impl Strategy<Value = PlanShape> {
    (
        prop::collection::vec(
            (
                1..3usize,
                prop::collection::vec(0..4usize, 0..3),
                any::<bool>(),
            ),
            2..7,
        ),
        1..3usize,
        prop::collection::vec(0..8usize, 0..2),
    )
        .prop_map(|(runners, generations, staged)| PlanShape {
            runners,
            generations,
            staged,
        })
}

fn ops(most: usize) -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        (
            prop::bool::weighted(0.7),
            0..8usize,
            0..3usize,
            any::<bool>(),
        ),
        1..most,
    )
}

/// The plan's fence, its handoffs ready where `ready` says, after `before`
/// ran eagerly on two streams (uses the fence refuses are left out).
fn fence_after(
    sim: &sim::Device,
    plan: &Planned,
    ready: &[bool],
    before: &[Op],
) -> Fence<sim::Device> {
    let slots = plan.runners.len() + plan.handoffs.len();
    let events = (0..slots)
        .map(|slot| {
            let fenced = slot >= plan.runners.len() || !plan.runners[slot].claims.is_empty();
            fenced.then(|| sim.create_event().unwrap())
        })
        .collect();
    let ready: Vec<bool> = (0..plan.handoffs.len())
        .map(|h| ready.get(h).copied().unwrap_or(false))
        .collect();
    let mut fence = Fence::new(events, plan, &ready);
    let streams = [sim.new_stream(), sim.new_stream()];
    for &(replay, slot, stream, exclusive) in before {
        let slot = slot % plan.runners.len();
        let stream = &streams[stream % 2];
        let on = crate::fence::On {
            stream,
            id: sim.stream_id(stream),
        };
        let _ = match replay {
            true => fence.replay(sim, plan, slot, on, || Ok(())).is_ok(),
            false => fence
                .consume(sim, plan, &[slot], on, exclusive, || ((), true))
                .is_ok(),
        };
    }
    fence
}

/// The schedule `ops` on `lanes` lanes, as the dry run sees it: one node
/// per use, and a replay's ready handoffs recorded at its node.
fn uses(plan: &Planned, fence: &Fence<sim::Device>, ops: &[Op], lanes: usize) -> Vec<Use> {
    ops.iter()
        .enumerate()
        .map(|(first, &(replay, slot, lane, exclusive))| {
            let (slot, lane) = (slot % plan.runners.len(), lane % lanes);
            match replay {
                true => Use::Replay {
                    slot,
                    lane,
                    first,
                    count: 1,
                    marks: (plan.runners[slot].record.writes.iter())
                        .filter(|&&h| fence.is_ready(h))
                        .map(|&h| (fence.handoff_slot(h), first))
                        .collect(),
                },
                false => Use::Consume {
                    slots: vec![slot],
                    lane,
                    first,
                    exclusive,
                },
            }
        })
        .collect()
}

/// `ops` with a replay put before each use that reads what the schedule
/// has not written yet (a handoff's writer before its reader, a runner
/// before its consumer), on the use's lane: a self-contained schedule.
fn contained(plan: &Planned, ops: &[Op]) -> Vec<Op> {
    // A replay of `slot` on `lane`, after the writers of what it reads
    // (each armed before its readers: this ends).
    fn replay(plan: &Planned, out: &mut Vec<Op>, slot: usize, lane: usize) {
        for h in &plan.runners[slot].record.reads {
            let writer = plan.handoffs[h.0 as usize].record.writer;
            if !out.iter().any(|o| o.0 && o.1 == writer) {
                replay(plan, out, writer, lane);
            }
        }
        out.push((true, slot, lane, false));
    }
    let mut out: Vec<Op> = Vec::new();
    for &(is_replay, slot, lane, exclusive) in ops {
        let slot = slot % plan.runners.len();
        if is_replay || !out.iter().any(|o| o.0 && o.1 == slot) {
            replay(plan, &mut out, slot, lane);
        }
        if !is_replay {
            out.push((false, slot, lane, exclusive));
        }
    }
    out
}

/// What a launch takes from a dry run: its edges, the slots it touches,
/// the staged runners it restages and the ledger it leaves (as relations).
fn outcome(plan: &Planned, dry: &Result<Dry, StepError>) -> Result<String, String> {
    match dry {
        Ok(d) => Ok(format!(
            "{:?} {:?} {:?} {:?} {}",
            d.deps.lists().collect::<Vec<_>>(),
            d.cross,
            d.touched,
            d.restaged,
            d.fence.ledger_digest(plan)
        )),
        Err(e) => Err(e.to_string()),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// The dry run a build makes gives what two passes give: the same
    /// edges, the same refusals and a ledger alike, from any state the
    /// program left the fence in. A schedule with its missing writers put
    /// first is self-contained (unless a runner of it stages inputs) and
    /// takes one pass; a schedule as it comes takes one where it is.
    #[test]
    fn the_dry_run_is_its_two_pass_steady_state(
        shape in shape(),
        ready in prop::collection::vec(any::<bool>(), 0..6),
        before in ops(7),
        schedule in ops(9),
        lanes in 1..4usize,
    ) {
        let sim = sim::Device::new();
        let plan = plan_of(&shape);
        let fence = fence_after(&sim, &plan, &ready, &before);
        let own = contained(&plan, &schedule);
        for (schedule, self_contained_by_construction) in [(own, true), (schedule, false)] {
            let uses = uses(&plan, &fence, &schedule, lanes);
            let stages_none = uses.iter().all(|u| match u {
                Use::Replay { slot, .. } => !fence.stages(*slot),
                Use::Consume { slots, .. } => !slots.iter().any(|&s| fence.stages(s)),
            });
            if self_contained_by_construction && stages_none {
                prop_assert!(self_contained(&fence, &plan, &uses));
            }
            let nodes = uses.len();
            let built = run_dry(&fence, &plan, &uses, (lanes, nodes), false);
            let two = dry_passes(&fence, &plan, &uses, (lanes, nodes), false, 2);
            prop_assert_eq!(outcome(&plan, &built), outcome(&plan, &two));
        }
    }
}

/// A schedule that reads a handoff it never writes is not self-contained:
/// its first pass reads the write from before the step and passes, the
/// second finds that write read already and refuses the step. One pass
/// would let the step graph read the same write at every launch.
#[test]
fn a_schedule_that_reads_a_handoff_it_never_writes_takes_two_passes() {
    let sim = sim::Device::new();
    let plan = plan_of(&PlanShape {
        runners: vec![(1, vec![], true), (1, vec![0], false)],
        generations: 1,
        staged: vec![],
    });
    // The writer replayed before the step; the step replays the reader.
    let fence = fence_after(&sim, &plan, &[], &[(true, 0, 0, false)]);
    let uses = uses(&plan, &fence, &[(true, 1, 0, false)], 1);
    assert!(!self_contained(&fence, &plan, &uses));
    let one = dry_passes(&fence, &plan, &uses, (1, 1), false, 1);
    let two = dry_passes(&fence, &plan, &uses, (1, 1), false, 2);
    assert!(outcome(&plan, &one).is_ok(), "the first launch may read it");
    let refused = outcome(&plan, &two).unwrap_err();
    assert!(refused.contains("read"), "{refused}");
    // Compiled, it is refused.
    assert!(run_dry(&fence, &plan, &uses, (1, 1), false).is_err());
}
