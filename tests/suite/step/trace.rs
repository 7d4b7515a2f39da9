//! A step graph in a trace, on the `sim` model: a launch made while a
//! trace runs shows each replay and consumer inside it as a slice of its
//! own ([`Trace::step_nodes`]), on the lane of the stream the schedule put
//! it on, inside the launch's slice (its parent), at the sim's times; a
//! launch with no trace running composes nothing and records no mark; a
//! step graph holding a moved step copy stays one slice per launch; and a
//! fault at any backend call of a traced launch leaves the plan's fence
//! and the step's results as they would be.

use crate::support;
use crate::support::faults::build;
use crate::support::record_and_finish;
use crate::support::steps::{allocate_discovered, plan_runners};
use replay_arena::backend::Streams;
use replay_arena::sim::{self, Call, Faults};
use replay_arena::{DType, Domain, Policy, Replayable, Request, RunnerId, Trace, Use, UseKind};
use serde_json::Value;
use support::{fill_ticks as duration, filled_plan as setup};

const N: usize = 64;
const REQ: Request = Request::new(Domain::Device, DType::F32, N as u64);

/// Consumers add a view into the sink for this many ticks.
const CONSUME: u64 = 5;

/// The streams of a step: two pool streams (runner `r` on `pool[r % 2]`),
/// a side stream for the consumers, and the launch stream.
struct Lanes {
    pool: [sim::Stream; 2],
    side: sim::Stream,
    launch: sim::Stream,
}

fn lanes(sim: &sim::Device) -> Lanes {
    Lanes {
        pool: [sim.new_stream(), sim.new_stream()],
        side: sim.new_stream(),
        launch: sim.new_stream(),
    }
}

/// A step of `n` runners, each replayed on its pool stream and consumed
/// on the side stream (adding its view into `sink`).
fn build_step<'r>(
    replayable: &'r mut Replayable<sim::Device>,
    sim: &sim::Device,
    l: &Lanes,
    n: u32,
    sink: &sim::HostBuffer,
) -> replay_arena::StepBuilder<'r, sim::Device> {
    let mut step = replayable.step();
    for r in 0..n {
        step.replay(RunnerId(r), &l.pool[r as usize % 2]).unwrap();
        step.consume(RunnerId(r), &l.side, |s, v| {
            sim.launch(s, sim::Kernel::add(&v[0], sink), CONSUME)
        })
        .unwrap();
    }
    step
}

/// [`setup`]`(4, 2)`: four runners at G = 2, with the lanes of their step
/// and an `N`-element sink.
fn four_runners() -> (sim::Device, Replayable<sim::Device>, Lanes, sim::HostBuffer) {
    let (sim, replayable) = setup(4, 2);
    let l = lanes(&sim);
    let sink = sim.alloc_f32(N).unwrap();
    (sim, replayable, l, sink)
}

/// The trace of the step of [`four_runners`] ([`build_step`], built
/// overlapping when `overlapping`) launched on each of `on` in turn.
fn traced_launches(
    replayable: &mut Replayable<sim::Device>,
    sim: &sim::Device,
    l: &Lanes,
    sink: &sim::HostBuffer,
    overlapping: bool,
    on: &[&sim::Stream],
) -> Trace {
    replayable.start_trace().unwrap();
    let mut graph = build(build_step(replayable, sim, l, 4, sink), overlapping).unwrap();
    for stream in on {
        graph.launch(stream).unwrap();
    }
    drop(graph);
    replayable.finish_trace().unwrap()
}

/// The nodes of the launch whose slice is `launch`.
fn nodes_of(trace: &Trace, launch: usize) -> Vec<&Use> {
    trace
        .step_nodes()
        .iter()
        .filter(|s| s.parent == Some(launch))
        .collect()
}

/// Indices of the step launches' slices.
fn launches(trace: &Trace) -> Vec<usize> {
    (0..trace.uses().len())
        .filter(|&i| matches!(trace.uses()[i].kind, UseKind::StepLaunch { .. }))
        .collect()
}

#[test]
fn a_traced_step_launch_shows_each_replay_and_consumer_inside_it_on_its_lane() {
    let (sim, mut replayable, l, sink) = four_runners();
    let on = [&l.launch, &l.launch];
    let trace = traced_launches(&mut replayable, &sim, &l, &sink, false, &on);
    let steps = launches(&trace);
    assert_eq!(steps.len(), 2);
    assert_eq!(trace.step_nodes().len(), 2 * 8);
    let lane_of = |s: &sim::Stream| {
        let id = sim.stream_id(s);
        trace.streams().iter().position(|&x| x == id).unwrap()
    };
    for &k in &steps {
        let launch = &trace.uses()[k];
        assert_eq!(launch.parent, None);
        let nodes = nodes_of(&trace, k);
        // The schedule's order, each on the lane of its stream.
        for r in 0..4u32 {
            let (replay, consume) = (nodes[2 * r as usize], nodes[2 * r as usize + 1]);
            assert_eq!(
                replay.kind,
                UseKind::Replay {
                    runner: RunnerId(r)
                }
            );
            assert_eq!(
                consume.kind,
                UseKind::Consume {
                    runners: vec![RunnerId(r)],
                    writes: false
                }
            );
            assert_eq!(replay.lane, lane_of(&l.pool[r as usize % 2]));
            assert_eq!(consume.lane, lane_of(&l.side));
            // The sim's times: each node runs for its ops' ticks, and a
            // consumer starts once its runner's replay ended.
            assert_eq!(replay.end_us - replay.start_us, duration(r) as f64);
            assert_eq!(consume.end_us - consume.start_us, CONSUME as f64);
            assert!(consume.start_us >= replay.end_us);
        }
        for node in &nodes {
            assert!(node.start_us >= launch.start_us && node.end_us <= launch.end_us);
            assert!(node.waits.is_empty());
        }
        // Runners 0 and 1 (other generations, other streams) overlap
        // inside the launch: the trace shows it.
        assert!(nodes[2].start_us < nodes[0].end_us);
        assert!(launch.end_us == nodes.iter().map(|n| n.end_us).fold(0.0, f64::max));
    }
    // Launches of the step follow one another; the second's nodes after
    // the first's.
    let (first, second) = (&trace.uses()[steps[0]], &trace.uses()[steps[1]]);
    assert!(first.end_us <= second.start_us);
    assert!(sim.hazards().is_empty());
    assert_eq!(
        sim.read_f32(&sink).unwrap()[0],
        2.0 * (0.0 + 1.0 + 2.0 + 3.0)
    );
}

#[test]
fn a_traced_launch_waits_for_the_traced_launch_before_without_a_wait_slice() {
    let (sim, mut replayable, l, sink) = four_runners();
    let other = sim.new_stream();
    // On two streams: only the wait after the traced launch before orders
    // them (each traced copy is another executable graph).
    let on = [&l.launch, &other, &l.launch];
    let trace = traced_launches(&mut replayable, &sim, &l, &sink, false, &on);
    let kinds: Vec<_> = trace.uses().iter().map(|s| s.kind.clone()).collect();
    assert!(matches!(kinds[0], UseKind::Wait { runner: None }));
    assert_eq!(launches(&trace), [1, 2, 3]);
    let s = trace.uses();
    assert!(s[1].end_us <= s[2].start_us && s[2].end_us <= s[3].start_us);
    assert!(sim.hazards().is_empty());
    assert_eq!(sim.read_f32(&sink).unwrap()[0], 3.0 * 6.0);
}

#[test]
fn the_chrome_trace_has_each_node_inside_its_launch_on_its_lane() {
    let (sim, mut replayable, l, sink) = four_runners();
    let trace = traced_launches(&mut replayable, &sim, &l, &sink, false, &[&l.launch]);
    let json: Value = serde_json::from_str(&trace.to_chrome_json()).unwrap();
    let events = json["traceEvents"].as_array().unwrap();
    let complete = |cat: &str| -> Vec<&Value> {
        events
            .iter()
            .filter(|e| e["ph"] == "X" && e["cat"] == cat)
            .collect()
    };
    let (steps, nodes) = (complete("step"), complete("step.node"));
    assert_eq!((steps.len(), nodes.len()), (1, 8));
    let f = |v: &Value| v.as_f64().unwrap();
    let launch = steps[0];
    let parent = launch["args"]["use"].as_u64().unwrap();
    let mut tids = std::collections::BTreeSet::new();
    for node in &nodes {
        assert_eq!(node["args"]["parent"].as_u64(), Some(parent));
        assert_eq!(node["args"]["parent_name"], "step graph 0 launch 0");
        assert!(f(&node["ts"]) >= f(&launch["ts"]));
        assert!(f(&node["ts"]) + f(&node["dur"]) <= f(&launch["ts"]) + f(&launch["dur"]));
        tids.insert(node["tid"].as_u64().unwrap());
    }
    // Two pool lanes and the side lane, none of them the launch's.
    assert_eq!(tids.len(), 3);
    assert!(!tids.contains(&launch["tid"].as_u64().unwrap()));
    assert_eq!(nodes[0]["name"], "replay runner 0");
    assert_eq!(nodes[1]["name"], "consume runner 0");
}

#[test]
fn a_step_graph_launched_with_no_trace_running_composes_nothing_and_records_no_mark() {
    let (sim, mut replayable, l, sink) = four_runners();
    let mut graph = build_step(&mut replayable, &sim, &l, 4, &sink)
        .build()
        .unwrap();
    graph.launch(&l.launch).unwrap();
    let calls = |graph: &mut replay_arena::StepGraph<'_, sim::Device>| {
        sim.inject(Faults::none());
        graph.launch(&l.launch).unwrap();
        sim.fault_log().per_call
    };
    let untraced = calls(&mut graph);
    assert_eq!(untraced.get(&Call::Compose), None);
    assert_eq!(untraced.get(&Call::CreateEvent), None);
    assert_eq!(untraced.get(&Call::Launch), Some(&1));
    // While a trace runs: one traced copy per launch, one mark per node.
    // (The step graph is borrowed: trace through its plan's kept form.)
    let mut kept = graph.keep();
    replayable.start_trace().unwrap();
    sim.inject(Faults::none());
    replayable.launch_kept(&mut kept, &l.launch).unwrap();
    let traced = sim.fault_log().per_call;
    assert_eq!(traced.get(&Call::Compose), Some(&1));
    assert!(traced.get(&Call::CreateEvent).copied().unwrap_or(0) >= kept.nodes() as u64);
    // The next traced launch reuses that copy with new marks: no
    // composition, no instantiation.
    sim.inject(Faults::none());
    replayable.launch_kept(&mut kept, &l.launch).unwrap();
    let again = sim.fault_log().per_call;
    assert_eq!(again.get(&Call::Instantiate), None);
    assert_eq!(again.get(&Call::Compose), Some(&1)); // the retarget
    let trace = replayable.finish_trace().unwrap();
    assert_eq!(trace.step_nodes().len(), 2 * 8);
    // After the trace: the step graph's own composition again, and after
    // the one launch that waits for the traced copy, the same calls as
    // before the trace.
    replayable.launch_kept(&mut kept, &l.launch).unwrap();
    sim.inject(Faults::none());
    replayable.launch_kept(&mut kept, &l.launch).unwrap();
    assert_eq!(sim.fault_log().per_call, untraced);
    drop(kept);
    assert!(sim.hazards().is_empty());
    assert_eq!(sim.read_f32(&sink).unwrap()[0], 6.0 * 6.0);
}

#[test]
fn a_step_graph_holding_a_moved_step_copy_is_one_slice_per_launch() {
    let planned = plan_runners((0..2).map(|r| (RunnerId(r), [REQ])), Policy::Generations(2));
    let sim = sim::Device::new();
    let l = lanes(&sim);
    let mut capturing = planned.allocate(sim.clone()).unwrap();
    for r in 0..2u32 {
        let cap = capturing.capture(RunnerId(r)).unwrap();
        let view = cap.take(REQ).unwrap();
        let work = |s: &sim::Stream| {
            if r == 0 {
                // A temporary: the step graph moves in a step copy.
                let t = sim.alloc_async(s, N)?;
                sim.launch(s, sim::Kernel::fill(&t, 1.0), 3)?;
                sim.launch(s, sim::Kernel::copy(&t, &view), 3)?;
                sim.free_async(s, &t)?;
            } else {
                sim.launch(s, sim::Kernel::fill(&view, 2.0), 4)?;
            }
            Ok::<(), replay_arena::Error>(())
        };
        cap.stream_capture_repeatable(&l.pool[0], work).unwrap();
        cap.finish().unwrap();
    }
    let mut replayable = capturing.seal().unwrap();
    let sink = sim.alloc_f32(N).unwrap();
    replayable.start_trace().unwrap();
    let mut graph = build_step(&mut replayable, &sim, &l, 2, &sink)
        .build()
        .unwrap();
    sim.inject(Faults::none());
    graph.launch(&l.launch).unwrap();
    graph.launch(&l.launch).unwrap();
    assert_eq!(sim.fault_log().per_call.get(&Call::Compose), None);
    drop(graph);
    let trace = replayable.finish_trace().unwrap();
    assert_eq!(launches(&trace).len(), 2);
    assert!(trace.step_nodes().is_empty());
    assert!(sim.hazards().is_empty());
    assert_eq!(sim.read_f32(&sink).unwrap()[0], 2.0 * 3.0);
}

#[test]
fn overlapping_traced_launches_overlap_node_by_node() {
    let (sim, mut replayable, l, sink) = four_runners();
    let launch = [sim.new_stream(), sim.new_stream()];
    let on: Vec<_> = (0..4).map(|k| &launch[k % 2]).collect();
    let trace = traced_launches(&mut replayable, &sim, &l, &sink, true, &on);
    let steps = launches(&trace);
    assert_eq!(steps.len(), 4);
    let nodes: Vec<Vec<&Use>> = steps.iter().map(|&k| nodes_of(&trace, k)).collect();
    for launch in &nodes {
        // Each node starts where the sim started it (after the nodes of
        // its own launch and of the launch before that it waits for).
        for r in 0..4u32 {
            let (replay, consume) = (launch[2 * r as usize], launch[2 * r as usize + 1]);
            assert_eq!(replay.end_us - replay.start_us, duration(r) as f64);
            assert_eq!(consume.end_us - consume.start_us, CONSUME as f64);
        }
    }
    for k in 1..4 {
        assert_eq!(nodes[k].len(), 8);
        // The next step's first replay starts before this step's last
        // consumer ends.
        assert!(nodes[k][0].start_us < nodes[k - 1][7].end_us);
        // Runner 0 of step k runs after step k - 1's consumer of runner 0
        // (the same bytes).
        assert!(nodes[k][0].start_us >= nodes[k - 1][1].end_us);
    }
    assert!(sim.hazards().is_empty());
    assert_eq!(sim.read_f32(&sink).unwrap()[0], 4.0 * 6.0);
}

/// A fault at each backend call of a traced step: the step graph's launch
/// fails with nothing enqueued, or goes out (traced or not); the trace
/// finishes or reports the fault; the fence orders every later use, the
/// sink counts exactly the launches that went out, and no event is left.
#[test]
fn a_fault_at_any_call_of_a_traced_step_leaves_the_plan_and_the_results_consistent() {
    let scenario = |faults: Faults| {
        let (sim, mut replayable, l, sink) = four_runners();
        let other = sim.new_stream();
        let mut graph = build(build_step(&mut replayable, &sim, &l, 4, &sink), true).unwrap();
        graph.launch(&l.launch).unwrap();
        drop(graph);
        replayable.start_trace().unwrap();
        let mut graph = build(build_step(&mut replayable, &sim, &l, 4, &sink), true).unwrap();
        sim.inject(faults);
        let mut ran = 1;
        for k in 0..4 {
            let stream = if k % 2 == 0 { &l.launch } else { &other };
            if graph.launch(stream).is_ok() {
                ran += 1;
            }
        }
        let calls = sim.fault_log().calls;
        sim.inject(Faults::none());
        graph.launch(&l.launch).unwrap();
        ran += 1;
        drop(graph);
        replayable.replay(RunnerId(0), &l.pool[1]).unwrap();
        let finished = replayable.finish_trace();
        replayable.synchronize().unwrap();
        assert_eq!(sim.hazards(), []);
        assert_eq!(sim.read_f32(&sink).unwrap()[0], ran as f32 * 6.0);
        if let Ok(trace) = finished {
            for node in trace.step_nodes() {
                let launch = &trace.uses()[node.parent.unwrap()];
                assert!(node.start_us >= launch.start_us && node.end_us <= launch.end_us);
            }
        }
        drop(replayable);
        assert_eq!(sim.live_events(), 0);
        calls
    };
    let calls = scenario(Faults::none());
    assert!(calls > 20, "{calls}");
    for k in 0..calls {
        scenario(Faults::at(k));
    }
    for seed in 0..50 {
        scenario(Faults::seeded(seed, 4));
    }
}

#[test]
fn a_writer_split_at_its_ready_point_is_two_nodes_and_its_reader_starts_at_the_first() {
    let (d, handoffs) = crate::support::faults::chain_of(2, REQ, REQ);
    let handoff = handoffs[0];
    let sim = sim::Device::new();
    let l = lanes(&sim);
    let mut capturing = allocate_discovered(&sim, d, Policy::Generations(2));
    {
        let cap = capturing.capture(RunnerId(0)).unwrap();
        let own = cap.take(REQ).unwrap();
        let out = cap.hand_off(handoff).unwrap();
        record_and_finish!(cap, &l.pool[0], |s| {
            sim.launch(s, sim::Kernel::fill(&out, 1.0), 4)?;
            cap.ready(handoff, s)?;
            sim.launch(s, sim::Kernel::fill(&own, 2.0), 30)?;
            Ok::<(), replay_arena::Error>(())
        });
    }
    {
        let cap = capturing.capture(RunnerId(1)).unwrap();
        let own = cap.take(REQ).unwrap();
        let input = cap.receive(handoff).unwrap();
        record_and_finish!(cap, &l.pool[1], |s| {
            sim.launch(s, sim::Kernel::copy(&input, &own), 6)
        });
    }
    let mut replayable = capturing.seal().unwrap();
    replayable.start_trace().unwrap();
    let mut step = replayable.step();
    step.replay(RunnerId(0), &l.pool[0]).unwrap();
    step.replay(RunnerId(1), &l.pool[1]).unwrap();
    let mut graph = step.build().unwrap();
    assert_eq!(graph.nodes(), 3);
    graph.launch(&l.launch).unwrap();
    graph.launch(&l.launch).unwrap();
    drop(graph);
    let trace = replayable.finish_trace().unwrap();
    for k in launches(&trace) {
        let nodes = nodes_of(&trace, k);
        let kinds: Vec<_> = nodes.iter().map(|n| n.kind.clone()).collect();
        let replay = |r| UseKind::Replay {
            runner: RunnerId(r),
        };
        assert_eq!(kinds, [replay(0), replay(0), replay(1)]);
        let (first, second, reader) = (nodes[0], nodes[1], nodes[2]);
        assert_eq!(first.end_us - first.start_us, 4.0);
        assert_eq!(second.end_us - second.start_us, 30.0);
        assert_eq!(reader.start_us, first.end_us);
        assert!(reader.end_us < second.end_us);
    }
    assert!(sim.hazards().is_empty());
    let own1 = replayable.views(RunnerId(1)).unwrap()[0];
    assert_eq!(sim.read_f32(&own1).unwrap()[0], 1.0);
}

/// Two kept step graphs (one per bucket, say) launched in turn while a
/// trace runs: each has a number of its own, so their launches' slices
/// (and their nodes' parent names) tell them apart, and each launch is
/// timed after its own graph's launch before, not the other's.
#[test]
fn kept_step_graphs_of_different_schedules_have_names_of_their_own_in_a_trace() {
    let (sim, mut replayable, l, sink) = four_runners();
    let mut kept: Vec<_> = [2u32, 4]
        .into_iter()
        .map(|n| {
            build_step(&mut replayable, &sim, &l, n, &sink)
                .build()
                .unwrap()
                .keep()
        })
        .collect();
    assert_eq!((kept[0].number(), kept[1].number()), (0, 1));
    replayable.start_trace().unwrap();
    for _ in 0..2 {
        for k in &mut kept {
            replayable.launch_kept(k, &l.launch).unwrap();
        }
    }
    let trace = replayable.finish_trace().unwrap();
    let names: Vec<String> = launches(&trace)
        .into_iter()
        .map(|i| trace.uses()[i].kind.name())
        .collect();
    assert_eq!(
        names,
        [
            "step graph 0 launch 0",
            "step graph 1 launch 0",
            "step graph 0 launch 1",
            "step graph 1 launch 1"
        ]
    );
    let json: Value = serde_json::from_str(&trace.to_chrome_json()).unwrap();
    let events = json["traceEvents"].as_array().unwrap();
    let parents: std::collections::BTreeSet<&str> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] == "step.node")
        .map(|e| e["args"]["parent_name"].as_str().unwrap())
        .collect();
    assert_eq!(parents, names.iter().map(String::as_str).collect());
    drop(kept);
    replayable.synchronize().unwrap();
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
}
