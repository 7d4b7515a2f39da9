//! Handoffs between runners, on the `sim` model: a buffer one runner's
//! graph writes and later runners' graphs read (a layer's input gradient),
//! declared at discovery, placed for its lifetime, fenced both ways.

use crate::support::capture_view;
use crate::support::faults::chain_of;
use crate::support::record_and_finish;
use crate::support::steps::{allocate_discovered, allocate_runners};
use proptest::prelude::*;
use replay_arena::sim;
use replay_arena::{
    BackendError, CaptureError, Capturing, DType, Discovering, DiscoveryError, Domain, HandoffId,
    Misuse, PlacedPolicy, PlanConfig, Policy, ReplayError, Replayable, Request, RunnerId,
    StreamCaptureError,
};

const GRAD: Request = Request::new(Domain::Device, DType::F32, 64);
const OWN: Request = Request::new(Domain::Device, DType::F32, 32);

/// A backward of `n` layers as a chain: runner `r` reads the gradient
/// runner `r - 1` handed off, and hands its own off to `r + 1`. Each runner
/// also has one buffer of its own.
fn chain(n: u32) -> (Discovering, Vec<HandoffId>) {
    chain_of(n as usize, OWN, GRAD)
}

/// The chain of `n` layers, planned at `G = 2` and allocated on a new sim,
/// with a stream and the chain's handoffs.
fn chain_capturing(
    n: u32,
) -> (
    sim::Device,
    sim::Stream,
    Capturing<sim::Device>,
    Vec<HandoffId>,
) {
    let (d, hs) = chain(n);
    let sim = sim::Device::new();
    let s = sim.new_stream();
    let capturing = allocate_discovered(&sim, d, Policy::Generations(2));
    (sim, s, capturing, hs)
}

/// The chain, captured: runner `r`'s graph copies the gradient it received
/// into its sink, a program buffer (slow: `read` ticks), then adds `one` into the
/// gradient it hands off (marking it ready when `ready`), then fills its
/// own view's tail (slow: `tail` ticks).
struct Chain {
    sim: sim::Device,
    replayable: Replayable<sim::Device>,
    pool: [sim::Stream; 2],
    handoffs: Vec<HandoffId>,
    n: u32,
    sinks: Vec<sim::HostBuffer>,
    _buffers: (sim::HostBuffer, Vec<sim::HostBuffer>),
}

fn captured(n: u32, strategy: impl Into<PlacedPolicy>, ready: bool, read: u64, tail: u64) -> Chain {
    let (d, handoffs) = chain(n);
    let sim = sim::Device::new();
    let pool = [sim.new_stream(), sim.new_stream()];
    let one = sim.alloc_f32(64).unwrap();
    sim.write_f32(&one, &[1.0; 64]).unwrap();
    let sinks: Vec<sim::HostBuffer> = (0..n).map(|_| sim.alloc_f32(64).unwrap()).collect();
    let counts: Vec<sim::HostBuffer> = (0..n).map(|_| sim.alloc_f32(64).unwrap()).collect();
    let mut capturing = allocate_discovered(&sim, d, strategy);
    for r in 0..n {
        let sink = &sinks[r as usize];
        let count = &counts[r as usize];
        let cap = capturing.capture(RunnerId(r)).unwrap();
        let own = cap.take(OWN).unwrap();
        let input = (r > 0).then(|| cap.receive(handoffs[r as usize - 1]).unwrap());
        let output = (r + 1 < n).then(|| cap.hand_off(handoffs[r as usize]).unwrap());
        record_and_finish!(cap, &pool[r as usize % 2], |s| {
            if let Some(input) = &input {
                sim.launch(s, sim::Kernel::copy(input, sink), read)?;
            }
            if let Some(output) = &output {
                // A handoff's bytes hold nothing between steps (they may be
                // another handoff's meanwhile): the writer overwrites them.
                sim.launch(s, sim::Kernel::add(&one, count), 1)?;
                sim.launch(s, sim::Kernel::copy(count, output), 2)?;
                if ready {
                    cap.ready(handoffs[r as usize], s)?;
                }
            }
            sim.launch(s, sim::Kernel::scale(&own, 1.0), tail)?;
            Ok::<(), replay_arena::Error>(())
        });
    }
    Chain {
        replayable: capturing.seal().unwrap(),
        sim,
        pool,
        handoffs,
        n,
        sinks,
        _buffers: (one, counts),
    }
}

impl Chain {
    /// One step: every runner in capture order, on alternating streams.
    fn step(&mut self) {
        for r in 0..self.n {
            self.replayable
                .replay(RunnerId(r), &self.pool[r as usize % 2])
                .unwrap();
        }
    }

    /// What runner `r` copied from its input gradient (first element),
    /// once everything ran.
    fn received(&self, r: u32) -> f32 {
        self.sim.read_f32(&self.sinks[r as usize]).unwrap()[0]
    }
}

#[test]
fn a_chain_of_handoffs_is_exact_and_race_free_over_many_steps() {
    for ready in [false, true] {
        for strategy in [
            Policy::Generations(2).round_robin(),
            Policy::Generations(2).packed(),
        ] {
            let mut c = captured(6, strategy, ready, 40, 25);
            for step in 1..=12 {
                c.step();
                for r in 1..c.n {
                    // Every writer added 1 per step: its reader saw this
                    // step's write, not the last one nor a torn one.
                    assert_eq!(c.received(r), step as f32, "step {step} runner {r}");
                }
            }
            assert!(c.sim.hazards().is_empty(), "{:?}", c.sim.hazards());
        }
    }
}

#[test]
fn a_chain_of_handoffs_shares_its_keys_arena_with_the_runners_and_the_report_says_so() {
    let (d, _) = chain(10);
    let planned = d.plan(Policy::Generations(1)).unwrap();
    // Own buffers and gradients are both f32 in device: one arena.
    let arenas = planned.arenas();
    assert_eq!(arenas.len(), 1);
    assert!(arenas[0].handoffs);
    // G = 1: runner r's 256 bytes are live at r only, the gradient it
    // hands off over [r, r + 1]: at every runner its own bytes and two
    // gradients, 768 bytes, which is the lower bound and the plan.
    assert_eq!(arenas[0].bytes, 3 * 256);
    let infos: Vec<_> = planned.handoffs().collect();
    assert_eq!(infos.len(), 9);
    assert_ne!(infos[0].offset, infos[1].offset);
    assert_eq!(infos[0].offset, infos[2].offset);
    assert_eq!(infos[3].writer, RunnerId(3));
    assert_eq!(infos[3].readers, vec![RunnerId(4)]);
    let report = planned.report();
    assert_eq!(report.handoffs, 9);
    assert_eq!(report.lower_bound, 3 * 256);
    assert_eq!(report.plan_bytes, report.lower_bound);
    // What the gradients add above the runners' own bytes.
    assert_eq!(report.handoff_bytes, 512);
    assert!(report.to_string().contains("handoffs: 9 between runners"));
    // More generations keep more handoffs apart: readers of one step and
    // the writer of the next may be in flight together; with G = 3, three
    // runners' bytes and four gradients are live at once.
    let (d, _) = chain(10);
    let g3 = d.plan(Policy::Generations(3).packed()).unwrap();
    assert_eq!(g3.total_bytes(), (3 + 4) * 256);
    assert_eq!(g3.report().handoff_bytes, 4 * 256);
}

#[test]
fn the_ready_point_lets_readers_start_before_the_writers_graph_ends() {
    let makespan = |ready| {
        let mut c = captured(4, Policy::Generations(2), ready, 5, 100);
        c.step();
        c.replayable.synchronize().unwrap();
        assert!(c.sim.hazards().is_empty());
        c.sim.makespan()
    };
    let (at_end, at_ready) = (makespan(false), makespan(true));
    // Without a ready point each reader waits for its writer's slow tail.
    assert!(at_ready < at_end, "{at_ready} vs {at_end}");
}

#[test]
fn a_reader_cannot_write_its_handoff_nor_a_writer_touch_it_after_ready() {
    let (sim, s, mut capturing, hs) = chain_capturing(2);
    {
        let cap = capturing.capture(RunnerId(0)).unwrap();
        let _own = cap.take(OWN).unwrap();
        let out = cap.hand_off(hs[0]).unwrap();
        assert!(!out.is_read_only());
        let e = cap
            .stream_capture(&s, |s| {
                sim.launch(s, sim::Kernel::fill(&out, 1.0), 1)?;
                cap.ready(hs[0], s)?;
                // Readers may run from here: the writer leaves it alone.
                sim.launch(s, sim::Kernel::fill(&out, 2.0), 1)?;
                Ok::<(), replay_arena::Error>(())
            })
            .unwrap_err();
        assert!(e.to_string().contains("marked ready"), "{e}");
        assert!(
            matches!(
                e,
                StreamCaptureError::Work(replay_arena::Error::Backend(BackendError::InvalidView {
                    reason: Misuse::Retired {
                        runner: RunnerId(0),
                        ..
                    }
                }))
            ),
            "{e:?}"
        );
    }
    let cap = capturing.capture(RunnerId(1)).unwrap();
    let _own = cap.take(OWN).unwrap();
    let input = cap.receive(hs[0]).unwrap();
    assert!(input.is_read_only());
    let e = cap
        .stream_capture(&s, |s| sim.launch(s, sim::Kernel::fill(&input, 1.0), 1))
        .unwrap_err();
    assert!(e.to_string().contains("handoff it received"), "{e}");
    assert!(
        matches!(
            e,
            StreamCaptureError::Work(BackendError::InvalidView {
                reason: Misuse::ReadOnly {
                    runner: RunnerId(1),
                    handoff: true,
                    ..
                }
            })
        ),
        "{e:?}"
    );
}

#[test]
fn misdeclared_handoffs_are_typed_errors_at_discovery() {
    let mut d = Discovering::new(PlanConfig::new());
    let h = d.arm(RunnerId(0)).unwrap().hand_off(GRAD).unwrap();
    {
        let mut armed = d.arm(RunnerId(1)).unwrap();
        assert!(matches!(
            armed.receive(HandoffId(7)),
            Err(DiscoveryError::UnknownHandoff { declared: 1, .. })
        ));
        armed.receive(h).unwrap();
        assert!(matches!(
            armed.receive(h),
            Err(DiscoveryError::HandoffReceivedTwice { .. })
        ));
        let own = armed.hand_off(GRAD).unwrap();
        assert!(matches!(
            armed.receive(own),
            Err(DiscoveryError::OwnHandoff { .. })
        ));
        assert!(matches!(
            armed.hand_off(Request::new(Domain::Device, DType::F32, 0)),
            Err(DiscoveryError::ZeroElements { .. })
        ));
    }
    let listed: Vec<_> = d.handoffs().collect();
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0].2, RunnerId(0));
    assert_eq!(listed[0].3, vec![RunnerId(1)]);
}

#[test]
fn misused_handoffs_are_typed_errors_at_capture() {
    let (_sim, s, mut capturing, hs) = chain_capturing(3);
    {
        let cap = capturing.capture(RunnerId(1)).unwrap();
        // Runner 1 reads handoff 0 and writes handoff 1, not the other way.
        assert!(matches!(
            cap.hand_off(hs[0]),
            Err(CaptureError::HandoffNotDeclared { role: "writer", .. })
        ));
        assert!(matches!(
            cap.receive(hs[1]),
            Err(CaptureError::HandoffNotDeclared { role: "reader", .. })
        ));
        let _own = cap.take(OWN).unwrap();
        let _in = cap.receive(hs[0]).unwrap();
        // Ready outside the closure, and for a handoff it has not taken.
        assert!(matches!(
            cap.ready(hs[1], &s),
            Err(CaptureError::ReadyMisplaced { .. })
        ));
        cap.stream_capture(&s, |s| {
            let e = cap.ready(hs[1], s).unwrap_err();
            assert!(matches!(e, CaptureError::ReadyMisplaced { .. }), "{e}");
            Ok::<(), String>(())
        })
        .unwrap();
        // It never took the handoff it writes.
        assert!(matches!(
            cap.finish(),
            Err(CaptureError::HandoffNotTaken { role: "writer", .. })
        ));
    }
    // Sealing needs every runner in a handoff, even one without buffers.
    let failed = capturing.seal().unwrap_err();
    assert!(matches!(failed.error(), CaptureError::Unfinished { .. }));
}

#[test]
fn a_reader_replayed_before_its_writer_is_a_typed_error() {
    let mut c = captured(3, Policy::Generations(2), true, 1, 1);
    let s = c.pool[0].clone();
    assert!(matches!(
        c.replayable.replay(RunnerId(1), &s),
        Err(ReplayError::HandoffNotWritten {
            writer: RunnerId(0),
            ..
        })
    ));
    c.step();
    // Runner 1 already read runner 0's latest write.
    assert!(matches!(
        c.replayable.replay(RunnerId(1), &s),
        Err(ReplayError::HandoffAlreadyRead {
            writer: RunnerId(0),
            ..
        })
    ));
    c.step();
    assert!(c.sim.hazards().is_empty());
    let _ = &c.handoffs;
}

#[test]
fn a_reader_without_buffers_of_its_own_is_fenced_too() {
    let mut d = Discovering::new(PlanConfig::new());
    let h = d.arm(RunnerId(0)).unwrap().hand_off(GRAD).unwrap();
    d.arm(RunnerId(1)).unwrap().receive(h).unwrap();
    let sim = sim::Device::new();
    let (a, b) = (sim.new_stream(), sim.new_stream());
    let sink = sim.alloc_f32(64).unwrap();
    let mut capturing = allocate_discovered(&sim, d, Policy::Generations(2));
    {
        let cap = capturing.capture(RunnerId(0)).unwrap();
        let out = cap.hand_off(h).unwrap();
        record_and_finish!(cap, &a, |s| sim.launch(
            s,
            sim::Kernel::scale(&out, 2.0),
            30
        ));
    }
    {
        let cap = capturing.capture(RunnerId(1)).unwrap();
        let input = cap.receive(h).unwrap();
        record_and_finish!(cap, &b, |s| sim.launch(
            s,
            sim::Kernel::add(&input, &sink),
            50
        ));
    }
    let mut replayable = capturing.seal().unwrap();
    for _ in 0..5 {
        replayable.replay(RunnerId(0), &a).unwrap();
        replayable.replay(RunnerId(1), &b).unwrap();
    }
    replayable.wait_all(&a).unwrap();
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
}

#[test]
fn the_report_of_a_replayable_shows_graph_memory_beside_the_plan() {
    let sim = sim::Device::new();
    let s = sim.new_stream();
    let mut capturing = allocate_runners(&sim, [(RunnerId(0), [OWN])], Policy::Generations(1));
    {
        capture_view(&mut capturing, RunnerId(0), OWN, &s, |s, own| {
            let tmp = sim.alloc_async(s, 1024)?;
            sim.launch(s, sim::Kernel::fill(&tmp, 1.0), 1)?;
            sim.launch(s, sim::Kernel::copy(&tmp, &own), 1)?;
            sim.free_async(s, &tmp)
        });
    }
    let replayable = capturing.seal().unwrap();
    let report = replayable.report().unwrap();
    let memory = report.graph_memory.unwrap();
    assert_eq!(memory.used, 4096);
    let text = report.to_string();
    assert!(
        text.contains("graph temporaries (this plan's graphs): 1 runner(s) allocate 4.00 KiB"),
        "{report}"
    );
    assert!(text.contains("device graph memory"), "{report}");
    assert!(text.contains("4.00 KiB in use"), "{report}");
    drop(replayable);
    assert_eq!(sim.live_allocations(), 0);
}

/// A random backward: runners in capture order, each handing off to up to
/// two later runners, replayed step after step on random streams, with
/// random durations and ready points.
#[derive(Debug, Clone)]
struct Random {
    /// Per runner: (readers of its handoff as offsets ahead, duration of
    /// its reads, duration of its tail, marks ready).
    runners: Vec<(Vec<u32>, u64, u64, bool)>,
    /// Per step, per runner: its stream.
    streams: Vec<Vec<usize>>,
    generations: usize,
    packed: bool,
}

fn random() -> impl proptest::strategy::Strategy<Value = Random> {
    (2usize..7, 1usize..4, any::<bool>()).prop_flat_map(|(n, g, packed)| {
        let runner = (
            prop::collection::vec(1u32..3, 0..3),
            1u64..30,
            1u64..30,
            any::<bool>(),
        );
        (
            prop::collection::vec(runner, n),
            prop::collection::vec(prop::collection::vec(0usize..3, n), 1..5),
        )
            .prop_map(move |(runners, streams)| Random {
                runners,
                streams,
                generations: g,
                packed,
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Whatever the handoff graph, streams, durations and ready points:
    /// no two users of the same bytes overlap, and every reader sees its
    /// writer's write of the same step.
    #[test]
    fn random_handoff_graphs_never_race_and_readers_see_this_steps_write(w in random()) {
        let n = w.runners.len() as u32;
        let mut d = Discovering::new(PlanConfig::new());
        // Handoff of runner r, if anyone reads it, and its readers.
        let mut readers: Vec<Vec<u32>> = vec![Vec::new(); n as usize];
        for (r, (ahead, ..)) in w.runners.iter().enumerate() {
            for &a in ahead {
                let to = r as u32 + a;
                if to < n && !readers[r].contains(&to) {
                    readers[r].push(to);
                }
            }
        }
        let mut ids: Vec<Option<HandoffId>> = vec![None; n as usize];
        for r in 0..n {
            let mut armed = d.arm(RunnerId(r)).unwrap();
            armed.record(OWN).unwrap();
            for w_ in 0..r {
                if readers[w_ as usize].contains(&r) {
                    armed.receive(ids[w_ as usize].unwrap()).unwrap();
                }
            }
            if !readers[r as usize].is_empty() {
                ids[r as usize] = Some(armed.hand_off(GRAD).unwrap());
            }
        }
        let sim = sim::Device::new();
        let streams = [sim.new_stream(), sim.new_stream(), sim.new_stream()];
        let one = sim.alloc_f32(64).unwrap();
        sim.write_f32(&one, &[1.0; 64]).unwrap();
        // Per runner, a program buffer its graph adds what it reads into
        // (a runner's replays are ordered: each waits for the latest users
        // of its bytes, which waited for its previous replay).
        let sinks: Vec<sim::HostBuffer> = (0..n).map(|_| sim.alloc_f32(64).unwrap()).collect();
        let counts: Vec<sim::HostBuffer> = (0..n).map(|_| sim.alloc_f32(64).unwrap()).collect();
        let policy = Policy::Generations(w.generations);
        let strategy = if w.packed { policy.packed() } else { policy.round_robin() };
        let mut capturing = allocate_discovered(&sim, d, strategy);
        for r in 0..n {
            let (_, read, tail, ready) = w.runners[r as usize];
            let cap = capturing.capture(RunnerId(r)).unwrap();
            let own = cap.take(OWN).unwrap();
            let sink = &sinks[r as usize];
            let count = &counts[r as usize];
            let inputs: Vec<_> = (0..r)
                .filter(|w_| readers[*w_ as usize].contains(&r))
                .map(|w_| cap.receive(ids[w_ as usize].unwrap()).unwrap())
                .collect();
            let output = ids[r as usize].map(|h| (h, cap.hand_off(h).unwrap()));
            record_and_finish!(cap, &streams[0], |s| {
                for input in &inputs {
                    sim.launch(s, sim::Kernel::add(input, sink), read)?;
                }
                if let Some((h, out)) = &output {
                    sim.launch(s, sim::Kernel::add(&one, count), 1)?;
                    sim.launch(s, sim::Kernel::copy(count, out), 2)?;
                    if ready {
                        cap.ready(*h, s)?;
                    }
                }
                sim.launch(s, sim::Kernel::scale(&own, 1.0), tail)?;
                Ok::<(), replay_arena::Error>(())
            });
        }
        let mut replayable = capturing.seal().unwrap();
        for (step, per_runner) in w.streams.iter().enumerate() {
            for r in 0..n {
                replayable.replay(RunnerId(r), &streams[per_runner[r as usize]]).unwrap();
            }
            // Each runner's sink gained, per handoff it reads, its
            // writer's count of writes: this step's.
            for r in 0..n {
                let fed = (0..r).filter(|w_| readers[*w_ as usize].contains(&r)).count();
                let expected: f32 = (1..=step + 1).map(|k| (fed * k) as f32).sum();
                let got = sim.read_f32(&sinks[r as usize]).unwrap()[0];
                prop_assert_eq!(got, expected, "step {} runner {}", step, r);
            }
        }
        let hazards = sim.hazards();
        prop_assert!(hazards.is_empty(), "{:?}", hazards);
    }
}

#[test]
fn a_failed_plan_hands_its_handoffs_back() {
    let (d, _) = chain(3);
    let failed = d.clone().plan(Policy::Generations(0)).unwrap_err();
    let back = failed.into_discovering();
    assert_eq!(back, d);
    assert_eq!(back.handoffs().count(), 2);
}
