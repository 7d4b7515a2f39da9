//! The fence's trace on the `sim` model: the Chrome trace JSON parses, has
//! one slice per replay, consumer, step graph launch and program wait, one
//! lane per stream, arrows only from earlier slices that ended before the
//! waiting slice started, skipped waits as instants, and times that are
//! the sim's clock.

use crate::support;
use replay_arena::backend::Timing;
use replay_arena::sim;
use replay_arena::{Replayable, RunnerId, StepBuilder, UseKind};
use serde_json::Value;
use support::filled_plan as setup;

/// Two steps of 4 runners at G = 2 on two pool streams, each replay
/// consumed on a side stream (5 ticks), then the program waits for all.
fn traced_schedule() -> (sim::Device, Replayable<sim::Device>, replay_arena::Trace) {
    let (sim, mut replayable) = setup(4, 2);
    let pool: [sim::Stream; 2] = support::streams(&sim);
    let [side, optimizer] = support::streams(&sim);
    let main = sim.alloc_f32(64).unwrap();
    replayable.start_trace().unwrap();
    for _step in 0..2 {
        for r in 0..4 {
            let lane = &pool[r as usize % 2];
            replayable.replay(RunnerId(r), lane).unwrap();
            let consumed = replayable.consume(RunnerId(r), &side, |s, v| {
                sim.launch(s, sim::Kernel::add(&v[0], &main), 5)
            });
            consumed.unwrap();
        }
    }
    replayable.wait_all(&optimizer).unwrap();
    let trace = replayable.finish_trace().unwrap();
    (sim, replayable, trace)
}

/// A step of the 4 runners of `setup(4, 2)`, runner `r` replayed on
/// `pool[r % 2]` and consumed on `side`, adding its view into `main` for
/// `ticks`.
fn step_of_four<'r>(
    replayable: &'r mut Replayable<sim::Device>,
    sim: &sim::Device,
    (pool, side): (&[sim::Stream; 2], &sim::Stream),
    main: &sim::HostBuffer,
    ticks: u64,
) -> StepBuilder<'r, sim::Device> {
    let mut step = replayable.step();
    for r in 0..4 {
        step.replay(RunnerId(r), &pool[r as usize % 2]).unwrap();
        step.consume(RunnerId(r), side, |s, v| {
            sim.launch(s, sim::Kernel::add(&v[0], main), ticks)
        })
        .unwrap();
    }
    step
}

fn events(json: &str) -> Vec<Value> {
    let doc: Value = serde_json::from_str(json).expect("the trace is JSON");
    doc["traceEvents"]
        .as_array()
        .expect("a traceEvents array")
        .clone()
}

fn of_phase<'a>(events: &'a [Value], ph: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["ph"] == ph).collect()
}

fn f(v: &Value) -> f64 {
    v.as_f64().expect("a number")
}

#[test]
fn the_json_has_one_slice_per_replay_consumer_and_wait_on_the_lane_of_its_stream() {
    let (_sim, replayable, trace) = traced_schedule();
    let events = events(&trace.to_chrome_json());
    let slices = of_phase(&events, "X");
    let cat = |c: &str| slices.iter().filter(|e| e["cat"] == c).count();
    let stats = replayable.fence_stats();
    assert_eq!(cat("replay") as u64, stats.replays);
    assert_eq!(cat("consume") as u64, stats.consumers);
    assert_eq!((cat("replay"), cat("consume"), cat("wait")), (8, 8, 1));
    // Lanes are streams: two pool streams, the side stream, the optimizer's.
    let threads: Vec<_> = of_phase(&events, "M")
        .into_iter()
        .filter(|e| e["name"] == "thread_name")
        .collect();
    assert_eq!(threads.len(), 4);
    assert_eq!(trace.streams().len(), 4);
    for (i, slice) in slices.iter().enumerate() {
        let kind = &trace.uses()[i];
        assert_eq!(slice["tid"], kind.lane as u64 + 1);
        assert_eq!(slice["args"]["use"], i as u64);
        assert_eq!(slice["name"], kind.kind.name().as_str());
    }
    // A lane's slices follow one another (a viewer nests overlapping ones).
    for lane in 0..trace.streams().len() {
        let on: Vec<_> = trace.uses().iter().filter(|s| s.lane == lane).collect();
        for pair in on.windows(2) {
            assert!(pair[1].start_us >= pair[0].end_us, "{pair:?}");
        }
    }
    // Replays alternate between the two pool streams, consumers share one.
    let lanes: Vec<_> = trace.uses().iter().map(|s| s.lane).collect();
    assert_eq!(&lanes[..8], &[0, 1, 2, 1, 0, 1, 2, 1][..]);
}

#[test]
fn sim_times_are_the_sims_clock() {
    let (sim, mut replayable) = setup(2, 1);
    let (a, b) = (sim.new_stream(), sim.new_stream());
    let main = sim.alloc_f32(64).unwrap();
    replayable.start_trace().unwrap();
    replayable.replay(RunnerId(0), &a).unwrap(); // 0..10 on a
    replayable
        .consume(RunnerId(0), &b, |s, v| {
            sim.launch(s, sim::Kernel::add(&v[0], &main), 4)
        })
        .unwrap(); // waits for the replay: 10..14 on b
    replayable.replay(RunnerId(1), &a).unwrap(); // waits for the consumer: 14..25
    replayable.replay(RunnerId(0), &b).unwrap(); // waits for runner 1: 25..35
    let trace = replayable.finish_trace().unwrap();
    let times: Vec<_> = trace
        .uses()
        .iter()
        .map(|s| (s.start_us, s.end_us))
        .collect();
    assert_eq!(
        times,
        [(0.0, 10.0), (10.0, 14.0), (14.0, 25.0), (25.0, 35.0)]
    );
    // The clock itself agrees: each stream's tail is its last slice's end.
    let origin = sim.origin().unwrap();
    for (stream, tail) in [(&a, 25.0), (&b, 35.0)] {
        let mut mark = sim.new_mark().unwrap();
        sim.take_mark(&mut mark, stream).unwrap();
        assert_eq!(sim.elapsed_us(&origin, &mark).unwrap(), tail);
    }
    let events = events(&trace.to_chrome_json());
    let json_times: Vec<_> = of_phase(&events, "X")
        .iter()
        .map(|e| (f(&e["ts"]), f(&e["ts"]) + f(&e["dur"])))
        .collect();
    assert_eq!(json_times, times);
}

#[test]
fn arrows_start_in_an_earlier_slice_that_ended_before_the_waiting_one_started() {
    let (_sim, replayable, trace) = traced_schedule();
    let events = events(&trace.to_chrome_json());
    let slices = of_phase(&events, "X");
    // The slice enclosing (tid, ts), by index.
    let enclosing = |tid: &Value, ts: f64| {
        slices
            .iter()
            .position(|e| e["tid"] == *tid && f(&e["ts"]) <= ts && ts <= f(&e["ts"]) + f(&e["dur"]))
            .expect("a flow inside a slice")
    };
    // Nothing ran before the trace: every wait names a slice of it.
    for slice in trace.uses() {
        assert!(slice.waits.iter().all(|w| w.from.is_some()), "{slice:?}");
    }
    let starts = of_phase(&events, "s");
    let ends = of_phase(&events, "f");
    assert_eq!(starts.len(), ends.len());
    assert_eq!(starts.len() as u64, replayable.fence_stats().waits);
    assert!(!starts.is_empty());
    for (s, e) in starts.iter().zip(&ends) {
        assert_eq!(s["id"], e["id"]);
        assert_eq!(e["bp"], "e");
        let from = enclosing(&s["tid"], f(&s["ts"]));
        let to = enclosing(&e["tid"], f(&e["ts"]));
        assert_eq!(
            (from as u64, to as u64),
            (
                s["args"]["from"].as_u64().unwrap(),
                s["args"]["to"].as_u64().unwrap()
            )
        );
        assert!(from < to, "an arrow from slice {from} to slice {to}");
        let (a, b) = (slices[from], slices[to]);
        assert!(
            f(&a["ts"]) + f(&a["dur"]) <= f(&b["ts"]),
            "slice {to} starts before slice {from}, which it waited for, ended"
        );
        assert_ne!(s["tid"], e["tid"], "a wait is for another stream");
    }
}

#[test]
fn each_consumer_waits_for_its_runners_latest_replay() {
    let (_sim, _replayable, trace) = traced_schedule();
    let slices = trace.uses();
    let mut consumers = 0;
    for (i, slice) in slices.iter().enumerate() {
        let UseKind::Consume { runners, .. } = &slice.kind else {
            continue;
        };
        let latest = slices[..i]
            .iter()
            .rposition(|s| s.kind == UseKind::Replay { runner: runners[0] });
        let drawn: Vec<_> = slice.waits.iter().filter(|w| !w.skipped).collect();
        assert_eq!(drawn.len(), 1, "slice {i}: {:?}", slice.waits);
        assert_eq!(drawn[0].from, latest, "slice {i}");
        consumers += 1;
    }
    assert_eq!(consumers, 8);
}

#[test]
fn skipped_waits_are_instants_on_the_waiting_slice() {
    let (_sim, replayable, trace) = traced_schedule();
    let events = events(&trace.to_chrome_json());
    let slices = of_phase(&events, "X");
    let skipped = of_phase(&events, "i");
    assert_eq!(skipped.len() as u64, replayable.fence_stats().waits_skipped);
    assert!(!skipped.is_empty());
    for instant in skipped {
        assert_eq!(instant["cat"], "fence.skipped");
        let i = instant["args"]["use"].as_u64().unwrap() as usize;
        let from = instant["args"]["from"].as_u64().unwrap() as usize;
        assert!(from < i);
        assert_eq!(instant["tid"], slices[i]["tid"]);
        assert_eq!(f(&instant["ts"]), f(&slices[i]["ts"]));
        assert!(slices[i]["args"]["skipped"]
            .as_array()
            .unwrap()
            .contains(&Value::from(from)));
    }
}

#[test]
fn a_step_graph_launch_is_one_slice_after_the_wait_for_everything_before_it() {
    let (sim, mut replayable) = setup(4, 2);
    let (pool, side, launch) = (
        [sim.new_stream(), sim.new_stream()],
        sim.new_stream(),
        sim.new_stream(),
    );
    let main = sim.alloc_f32(64).unwrap();
    replayable.replay(RunnerId(0), &pool[0]).unwrap(); // before the trace
    replayable.start_trace().unwrap();
    let step = step_of_four(&mut replayable, &sim, (&pool, &side), &main, 5);
    let mut graph = step.build().unwrap();
    for _ in 0..3 {
        graph.launch(&launch).unwrap();
    }
    drop(graph);
    replayable.replay(RunnerId(0), &pool[0]).unwrap();
    let trace = replayable.finish_trace().unwrap();
    let kinds: Vec<_> = trace.uses().iter().map(|s| s.kind.clone()).collect();
    assert_eq!(
        kinds,
        [
            UseKind::Wait { runner: None },
            UseKind::StepLaunch {
                step: 0,
                launch: 0,
                graph: 0
            },
            UseKind::StepLaunch {
                step: 0,
                launch: 1,
                graph: 0
            },
            UseKind::StepLaunch {
                step: 0,
                launch: 2,
                graph: 0
            },
            UseKind::Replay {
                runner: RunnerId(0)
            },
        ]
    );
    let s = trace.uses();
    // The first launch's wait waited for the replay before the trace.
    assert_eq!(s[0].waits.len(), 1);
    assert_eq!(s[0].waits[0].from, None);
    // Launches of one graph follow one another on the launch stream.
    assert!(s[1].end_us <= s[2].start_us && s[2].end_us <= s[3].start_us);
    assert!(s[1].end_us > s[1].start_us);
    // The replay after the step waits for its last launch.
    assert!(s[4].waits.iter().any(|w| w.from == Some(3) && !w.skipped));
    assert!(s[4].start_us >= s[3].end_us);
}

#[test]
fn a_use_that_fails_before_it_enqueues_leaves_no_slice() {
    let (sim, mut replayable) = setup(2, 1);
    let (a, b) = (sim.new_stream(), sim.new_stream());
    replayable.start_trace().unwrap();
    replayable.replay(RunnerId(0), &a).unwrap();
    replayable.replay(RunnerId(1), &a).unwrap();
    // Runner 0's bytes are runner 1's now: refused before anything runs.
    let late = replayable.consume(RunnerId(0), &b, |_, _| Ok::<(), String>(()));
    assert!(late.is_err());
    assert!(replayable.replay(RunnerId(7), &a).is_err());
    replayable.replay(RunnerId(0), &b).unwrap();
    let trace = replayable.finish_trace().unwrap();
    assert_eq!(trace.uses().len(), 3);
    assert_eq!(trace.uses()[2].waits[0].from, Some(1));
}

#[test]
fn finishing_a_trace_never_started_is_a_typed_error() {
    let (_sim, mut replayable) = setup(1, 1);
    assert_eq!(
        replayable.finish_trace(),
        Err(replay_arena::TraceError::NoTrace)
    );
    replayable.start_trace().unwrap();
    replayable.finish_trace().unwrap();
    assert_eq!(
        replayable.finish_trace(),
        Err(replay_arena::TraceError::NoTrace)
    );
}

#[test]
fn overlapping_step_graphs_show_as_overlapping_slices_of_alternating_graphs() {
    let (sim, mut replayable) = setup(4, 2);
    let (pool, side) = ([sim.new_stream(), sim.new_stream()], sim.new_stream());
    let launch = [sim.new_stream(), sim.new_stream()];
    let main = sim.alloc_f32(64).unwrap();
    replayable.start_trace().unwrap();
    let step = step_of_four(&mut replayable, &sim, (&pool, &side), &main, 30);
    let mut graph = step.build_overlapping().unwrap();
    for k in 0..4 {
        graph.launch(&launch[k % 2]).unwrap();
    }
    drop(graph);
    let trace = replayable.finish_trace().unwrap();
    let steps: Vec<_> = trace
        .uses()
        .iter()
        .filter(|s| matches!(s.kind, UseKind::StepLaunch { .. }))
        .collect();
    let graphs: Vec<_> = steps
        .iter()
        .map(|s| match s.kind {
            UseKind::StepLaunch { graph, .. } => graph,
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(graphs, [0, 1, 0, 1]);
    for k in 1..4 {
        assert_ne!(steps[k].lane, steps[k - 1].lane);
        // Each launch completes after the one before it.
        assert!(steps[k].end_us >= steps[k - 1].end_us);
    }
    for k in 2..4 {
        // A graph's launches run one after another.
        assert!(steps[k].start_us >= steps[k - 2].end_us);
    }
    // Consecutive launches overlap: the trace shows it.
    assert!(steps[1].start_us < steps[0].end_us);
    assert!(sim.hazards().is_empty());
}
