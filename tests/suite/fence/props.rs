//! The fence on `sim`: for random plans, replay orders and stream
//! assignments, no arena byte is touched by two unordered replays, and
//! consumers always read what their runner wrote. Without the fence the same
//! schedules are caught.

use crate::support;
use crate::support::record_and_finish;

use proptest::prelude::*;
use replay_arena::sim::{self, AsSpan, Span};
use replay_arena::{DType, Domain, PlacedPolicy, Policy, Replayable, Request, RunnerId};
use support::{discover, f32_request, Workload, GTP};

fn workload() -> impl Strategy<Value = Workload> {
    prop::collection::vec(prop::collection::vec(f32_request(GTP, 1..3000), 0..4), 1..8)
}

/// One step of a schedule: replay `runner` on `stream`, then maybe have a
/// consumer on `consumer` read its views.
#[derive(Clone, Debug)]
struct Step {
    runner: usize,
    stream: usize,
    consumer: Option<(usize, u64)>,
}

fn case() -> impl Strategy<Value = (Workload, PlacedPolicy, usize, Vec<Step>, Vec<u64>)> {
    (workload(), 1usize..4, any::<bool>(), 1usize..4).prop_flat_map(|(w, g, packed, streams)| {
        let n = w.len();
        let step = (0..n, 0..streams, prop::option::of((0..streams, 1u64..300))).prop_map(
            |(runner, stream, consumer)| Step {
                runner,
                stream,
                consumer,
            },
        );
        let policy = Policy::Generations(g);
        let s = if packed {
            policy.packed()
        } else {
            policy.into()
        };
        (
            Just(w),
            Just(s),
            Just(streams),
            prop::collection::vec(step, 1..40),
            prop::collection::vec(1u64..60, n),
        )
    })
}

struct Setup {
    sim: sim::Device,
    streams: Vec<replay_arena::sim::Stream>,
    replayable: Replayable<sim::Device>,
    spans: Vec<Vec<Span>>,
}

fn value(runner: usize) -> f32 {
    runner as f32 + 1.0
}

/// Captures every runner: its graph fills each of its views with its value.
fn setup(w: &Workload, s: PlacedPolicy, streams: usize, durations: &[u64]) -> Setup {
    let sim = sim::Device::new();
    let streams: Vec<_> = (0..streams).map(|_| sim.new_stream()).collect();
    let mut capturing = discover(w).plan(s).unwrap().allocate(sim.clone()).unwrap();
    let mut spans = Vec::new();
    for (r, requests) in w.iter().enumerate() {
        let cap = capturing.capture(RunnerId(r as u32)).unwrap();
        let views: Vec<_> = requests.iter().map(|q| cap.take(*q).unwrap()).collect();
        spans.push(views.iter().map(|v| v.span()).collect());
        record_and_finish!(cap, &streams[0], |st| {
            views
                .iter()
                .try_for_each(|v| sim.launch(st, sim::Kernel::fill(v, value(r)), durations[r]))
        });
    }
    Setup {
        replayable: capturing.seal().unwrap(),
        sim,
        streams,
        spans,
    }
}

fn overlaps(a: &[Span], b: &[Span]) -> bool {
    let end = |s: &Span| s.addr() + 4 * s.len() as u64;
    a.iter().any(|x| {
        b.iter()
            .any(|y| !x.is_empty() && !y.is_empty() && x.addr() < end(y) && y.addr() < end(x))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn fenced_replays_never_touch_bytes_in_use((w, s, n, steps, durations) in case()) {
        let mut t = setup(&w, s, n, &durations);
        let mut reads = Vec::new();
        for step in &steps {
            t.replayable.replay(RunnerId(step.runner as u32), &t.streams[step.stream]).unwrap();
            if let Some((c, duration)) = step.consumer {
                let sim = t.sim.clone();
                let mut outs = Vec::new();
                t.replayable.consume(RunnerId(step.runner as u32), &t.streams[c], |st, views| {
                    for v in views {
                        let out = sim.alloc_f32(v.span().len())?;
                        sim.launch(st, sim::Kernel::copy(v, &out), duration)?;
                        outs.push(out);
                    }
                    Ok::<(), replay_arena::Error>(())
                }).unwrap();
                reads.push((step.runner, outs));
            }
        }
        prop_assert_eq!(t.sim.hazards(), vec![]);
        for (runner, outs) in &reads {
            for out in outs {
                let got = t.sim.read_f32(out).unwrap();
                prop_assert!(got.iter().all(|&x| x == value(*runner)), "consumer of runner {} read {:?}", runner, &got[..got.len().min(4)]);
            }
        }
    }

    #[test]
    fn unfenced_replays_are_caught_exactly_when_they_share_bytes((w, s, n, steps, durations) in case()) {
        let mut t = setup(&w, s, n, &durations);
        let mut outs = Vec::new();
        // (runner, stream, writes)
        let mut accesses: Vec<(usize, usize, bool)> = Vec::new();
        for step in &steps {
            // SAFETY: deliberately unsafe: this test shows what the fence prevents.
            unsafe { t.replayable.replay_unfenced(RunnerId(step.runner as u32), &t.streams[step.stream]).unwrap() };
            accesses.push((step.runner, step.stream, true));
            if let Some((c, duration)) = step.consumer {
                for span in &t.spans[step.runner] {
                    let out = t.sim.alloc_f32(span.len()).unwrap();
                    // SAFETY: deliberately unfenced, as above.
                    unsafe { t.sim.launch_unscoped(&t.streams[c], sim::Kernel::copy(span, &out), duration).unwrap() };
                    outs.push(out);
                }
                accesses.push((step.runner, c, false));
            }
        }
        // Happens-before: stream order, and launches of one graph (one
        // runner's replays) run one after another, as on CUDA.
        let n_acc = accesses.len();
        let mut hb = vec![vec![false; n_acc]; n_acc];
        for j in 0..n_acc {
            let (runner, stream, replay) = accesses[j];
            let same_stream = (0..j).rev().find(|&i| accesses[i].1 == stream);
            let same_graph = (0..j).rev().find(|&i| replay && accesses[i].2 && accesses[i].0 == runner);
            for p in same_stream.into_iter().chain(same_graph) {
                hb[p][j] = true;
                for row in hb.iter_mut().take(p) {
                    if row[p] {
                        row[j] = true;
                    }
                }
            }
        }
        let expected = (0..n_acc).any(|i| {
            (i + 1..n_acc).any(|j| {
                let (a, b) = (accesses[i], accesses[j]);
                !hb[i][j] && (a.2 || b.2) && overlaps(&t.spans[a.0], &t.spans[b.0])
            })
        });
        prop_assert_eq!(!t.sim.hazards().is_empty(), expected);
    }

    #[test]
    fn same_stream_replays_wait_for_nothing((w, s, _n, steps, durations) in case()) {
        let mut t = setup(&w, s, 1, &durations);
        for step in &steps {
            t.replayable.replay(RunnerId(step.runner as u32), &t.streams[0]).unwrap();
        }
        let stats = t.replayable.fence_stats();
        prop_assert_eq!(stats.waits, 0);
        prop_assert_eq!(stats.replays, steps.len() as u64);
        prop_assert_eq!(t.sim.hazards(), vec![]);
    }
}

/// `n` runners of 64 f32s each at `generations`, each replay taking 10
/// ticks, on two streams.
fn ten_tick_runners(n: usize, generations: usize) -> Setup {
    let req = Request::new(Domain::Device, DType::F32, 64);
    let w: Workload = vec![vec![req]; n];
    setup(&w, Policy::Generations(generations).into(), 2, &vec![10; n])
}

/// `replays` replays of the runners in turn, on the two streams in turn.
fn replay_in_turn(t: &mut Setup, replays: u32) {
    let n = t.spans.len() as u32;
    for step in 0..replays {
        t.replayable
            .replay(RunnerId(step % n), &t.streams[step as usize % 2])
            .unwrap();
    }
}

/// Eight replays of four runners at `generations` in turn: they take
/// `makespan` ticks and wait `waits` times, with no hazard.
fn eight_replays_of_four(generations: usize, makespan: u64, waits: u64) {
    let mut t = ten_tick_runners(4, generations);
    replay_in_turn(&mut t, 8);
    assert_eq!(t.sim.makespan(), makespan);
    assert_eq!(t.replayable.fence_stats().waits, waits);
    assert!(t.sim.hazards().is_empty());
}

#[test]
fn one_generation_serializes_runners_on_two_streams() {
    // Every replay after the first waits for the one before it: 80 ticks.
    eight_replays_of_four(1, 80, 7);
}

#[test]
fn two_generations_overlap_consecutive_runners() {
    // Runner k and k+1 run side by side; same-generation runners share a
    // stream, so every wait is skipped.
    eight_replays_of_four(2, 40, 0);
}

#[test]
fn three_generations_on_two_streams_keep_full_overlap() {
    // Runner k waits for runner k - 3, on the other stream. Deferred records
    // would cover runner k - 1 too and serialize everything (600 ticks); after
    // the first round the fence records exactly where it is waited on, so the
    // schedule runs as fast as with no fence at all (300 ticks).
    let mut t = ten_tick_runners(6, 3);
    // Rounds of the six runners in turn, runner k on stream k % 2.
    replay_in_turn(&mut t, 5 * 6);
    let warm = t.sim.makespan();
    replay_in_turn(&mut t, 5 * 6);
    // Five rounds of three 10-tick replays per stream: 150 ticks, no stall.
    assert_eq!(t.sim.makespan() - warm, 150);
    assert!(t.sim.hazards().is_empty());
}
