//! Building a step graph costs in proportion to its step, not to the plan:
//! the dry run a bucket's schedule is compiled on holds the fence slots and
//! ledger entries that bucket can meet (its runners, their handoffs, the
//! latest users of their bytes), whatever the number of other buckets. A
//! program that builds one step graph per bucket then pays in proportion
//! to the buckets, not to their square. Counted, not timed
//! ([`StepGraph::dry_run_held`](replay_arena::StepGraph)).

use replay_arena::sim;
use replay_arena::{
    DType, Discovering, Domain, HandoffId, KeptStep, PlacedPolicy, PlanConfig, Policy, Purpose,
    Replayable, Request, RunnerId,
};

const LAYERS: u32 = 8;

fn own() -> Request {
    Request::new(Domain::Device, DType::F32, 64)
}

fn input() -> Request {
    Request::new(Domain::Device, DType::F32, 16).purpose(Purpose::Input)
}

fn grad() -> Request {
    Request::new(Domain::Device, DType::F32, 32)
}

fn id(bucket: u32, layer: u32) -> RunnerId {
    RunnerId(bucket * LAYERS + layer)
}

/// A plan of `buckets` buckets of [`LAYERS`] layers in shared arenas: each
/// layer hands a gradient to the next, the first stages an input.
struct Ladder {
    sim: sim::Device,
    replayable: Replayable<sim::Device>,
    pool: [sim::Stream; 2],
    side: sim::Stream,
    buckets: u32,
}

fn ladder(buckets: u32, strategy: PlacedPolicy) -> Ladder {
    let mut d = Discovering::new(PlanConfig::new());
    let mut handoffs: Vec<HandoffId> = Vec::new();
    for b in 0..buckets {
        d.bucket(format!("b{b}")).unwrap();
        for l in 0..LAYERS {
            let mut armed = d.arm(id(b, l)).unwrap();
            armed.record(own()).unwrap();
            if l == 0 {
                armed.record(input()).unwrap();
            } else {
                armed.receive(*handoffs.last().unwrap()).unwrap();
            }
            if l + 1 < LAYERS {
                handoffs.push(armed.hand_off(grad()).unwrap());
            }
        }
    }
    let sim = sim::Device::new();
    let capture_on = sim.new_stream();
    let mut capturing = d.plan(strategy).unwrap().allocate(sim.clone()).unwrap();
    let mut h = 0;
    for b in 0..buckets {
        for l in 0..LAYERS {
            let cap = capturing.capture(id(b, l)).unwrap();
            let own = cap.take(own()).unwrap();
            let staged = (l == 0).then(|| cap.take(input()).unwrap());
            let received = (l > 0).then(|| cap.receive(handoffs[h - 1]).unwrap());
            let to = (l + 1 < LAYERS).then(|| {
                h += 1;
                cap.hand_off(handoffs[h - 1]).unwrap()
            });
            cap.stream_capture(&capture_on, |s| {
                match (&staged, &received) {
                    (Some(from), _) => sim.launch(s, sim::Kernel::copy(from, &own), 2)?,
                    (_, Some(from)) => sim.launch(s, sim::Kernel::copy(from, &own), 2)?,
                    (None, None) => {}
                }
                match &to {
                    Some(to) => sim.launch(s, sim::Kernel::copy(&own, to), 1),
                    None => Ok(()),
                }
            })
            .unwrap();
            cap.finish().unwrap();
        }
    }
    let replayable = capturing.seal().unwrap();
    let (pool, side) = ([sim.new_stream(), sim.new_stream()], sim.new_stream());
    Ladder {
        sim,
        replayable,
        pool,
        side,
        buckets,
    }
}

impl Ladder {
    /// Stages bucket `b`'s input.
    fn stage(&mut self, b: u32) {
        let sim = &self.sim;
        self.replayable
            .consume_mut(id(b, 0), &self.side, |s, v| {
                sim.launch(s, sim::Kernel::fill(&v[1], b as f32), 1)
            })
            .unwrap();
    }

    /// Every bucket replayed per runner, in turn: the latest users of
    /// every byte are the last bucket's runners.
    fn replay_all(&mut self) {
        for b in 0..self.buckets {
            self.stage(b);
            for l in 0..LAYERS {
                let stream = &self.pool[(l % 2) as usize];
                self.replayable.replay(id(b, l), stream).unwrap();
            }
        }
        self.replayable.synchronize().unwrap();
    }

    /// Bucket `b`'s step graph: its layers on the pool in turn, a
    /// consumer of the last one on the side stream.
    fn build(&mut self, b: u32) -> KeptStep<sim::Device> {
        self.stage(b);
        let mut step = self.replayable.step();
        for l in 0..LAYERS {
            step.replay(id(b, l), &self.pool[(l % 2) as usize]).unwrap();
        }
        step.consume(id(b, LAYERS - 1), &self.side, |_, _| Ok::<(), String>(()))
            .unwrap();
        step.build().unwrap().keep()
    }
}

/// (fence slots, ledger entries) the dry runs of the first and the last
/// bucket's step graphs held: at their builds, and at launches after the
/// other bucket's (each a first launch again, dry-run from the fence's
/// state then).
fn held(buckets: u32, strategy: PlacedPolicy) -> Vec<(usize, usize)> {
    let mut l = ladder(buckets, strategy);
    l.replay_all();
    let (first, last) = (0, buckets - 1);
    let mut steps = [l.build(first), l.build(last)];
    let mut out: Vec<(usize, usize)> = steps.iter().map(KeptStep::dry_run_held).collect();
    let launch = l.sim.new_stream();
    for round in 0..2 {
        for (k, b) in [first, last].into_iter().enumerate() {
            l.stage(b);
            l.replayable.launch_kept(&mut steps[k], &launch).unwrap();
            if round == 1 {
                out.push(steps[k].dry_run_held());
            }
        }
    }
    l.replayable.synchronize().unwrap();
    assert!(l.sim.hazards().is_empty(), "{:?}", l.sim.hazards());
    out
}

#[test]
fn a_buckets_step_build_holds_what_its_bucket_meets_whatever_the_other_buckets() {
    for strategy in [
        Policy::Generations(2).round_robin(),
        Policy::Generations(2).packed(),
    ] {
        let few = held(2, strategy);
        let many = held(24, strategy);
        assert_eq!(few, many, "{strategy:?}: 2 buckets, then 24");
        // A bucket's runners and handoffs, and the latest users of their
        // bytes (no more than one bucket's worth), a few entries each.
        let bucket_slots = (2 * LAYERS - 1) as usize;
        for &(slots, entries) in &many {
            assert!(slots <= 2 * bucket_slots, "{strategy:?}: {slots} slots");
            assert!(entries <= 8 * bucket_slots, "{strategy:?}: {entries}");
        }
    }
}

#[test]
fn a_step_build_holds_no_more_than_the_whole_plan() {
    // One bucket: the step meets every runner and handoff of the plan.
    let held = held(1, Policy::Generations(2).round_robin());
    let plan_slots = (2 * LAYERS - 1) as usize;
    assert!(
        held.iter().all(|&(slots, _)| slots == plan_slots),
        "{held:?}"
    );
}

/// The capture ladder's bucket: `layers` runners of one request each,
/// planned `OverlapDepth(2)`, captured, sealed.
fn capture_ladder(layers: u32) -> (sim::Device, Replayable<sim::Device>) {
    let req = Request::new(Domain::Device, DType::F32, 64);
    let mut d = Discovering::new(PlanConfig::new());
    for l in 0..layers {
        d.arm(RunnerId(l)).unwrap().record(req).unwrap();
    }
    let sim = sim::Device::new();
    let capture_on = sim.new_stream();
    let planned = d.plan(Policy::OverlapDepth(2)).unwrap();
    let mut capturing = planned.allocate(sim.clone()).unwrap();
    for l in 0..layers {
        let cap = capturing.capture(RunnerId(l)).unwrap();
        let v = cap.take(req).unwrap();
        cap.stream_capture(&capture_on, |s| {
            sim.launch(s, sim::Kernel::fill(&v, l as f32), 3)
        })
        .unwrap();
        cap.finish().unwrap();
    }
    (sim.clone(), capturing.seal().unwrap())
}

#[test]
fn the_capture_ladders_step_graph_adds_no_event_node_to_its_chain() {
    // Layers on two streams in turn: layer l + 2 overwrites layer l's
    // bytes on the same stream, so stream order is every edge, and one
    // graph waits on nothing of the step before (launch order does).
    const LAYERS: u32 = 32;
    let (sim, mut r) = capture_ladder(LAYERS);
    let lanes = [sim.new_stream(), sim.new_stream()];
    let side = sim.new_stream();
    for overlapping in [false, true] {
        let mut step = r.step();
        for l in 0..LAYERS {
            step.replay(RunnerId(l), &lanes[(l % 2) as usize]).unwrap();
        }
        let mut g = match overlapping {
            false => step.build().unwrap(),
            true => step.build_overlapping().unwrap(),
        };
        let shown = format!("{g:?}");
        assert_eq!(g.nodes(), LAYERS as usize, "{shown}");
        if overlapping {
            // Per graph: the first two layers wait for the other graph's
            // last two (a record node each), and its end.
            assert_eq!(g.edges(), LAYERS as usize - 2 + 2, "{shown}");
            assert!(shown.contains("events: 6"), "{shown}");
        } else {
            assert_eq!(g.edges(), LAYERS as usize - 2, "{shown}");
            assert!(shown.contains("events: 0"), "{shown}");
        }
        let launch = sim.new_stream();
        for _ in 0..3 {
            g.launch(&launch).unwrap();
        }
        drop(g);
        // The last two layers still own their bytes: read on another
        // stream after the launches, each sees its layer's fill.
        let main = sim.alloc_f32(64).unwrap();
        for l in LAYERS - 2..LAYERS {
            r.consume(RunnerId(l), &side, |s, v| {
                sim.launch(s, sim::Kernel::add(&v[0], &main), 1)
            })
            .unwrap();
        }
        // The layers before them were overwritten in the step.
        assert!(r
            .consume(RunnerId(LAYERS - 3), &side, |_, _| Ok::<(), String>(()))
            .is_err());
        r.synchronize().unwrap();
        assert_eq!(sim.read_f32(&main).unwrap()[0], (2 * LAYERS - 3) as f32);
        assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    }
}
