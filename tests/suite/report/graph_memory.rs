//! The graph memory a plan's temporaries hold, estimated from the graphs'
//! layout (`Replayable::graph_memory`, `StepGraph::graph_memory`), on the
//! `sim` model, whose graph pool has no granule: each graph's share is the
//! address space its temporaries span.

use crate::support::faults::chain_of;
use crate::support::steps::{allocate_discovered, allocate_runners};
use replay_arena::backend::Backend;
use replay_arena::sim;
use replay_arena::{DType, Domain, Policy, Replayable, Request, RunnerId, StepBuilder};

const N: usize = 16;
const OWN: Request = Request::new(Domain::Device, DType::F32, N as u64);

/// Two runners: runner 0's graph holds temporaries of 256 and 128 floats at
/// once, runner 1's one of 64; both with four step copies (one per step graph, two for an overlapping
/// one).
fn plan(sim: &sim::Device, s: &sim::Stream) -> Replayable<sim::Device> {
    let runners = [(RunnerId(0), [OWN]), (RunnerId(1), [OWN])];
    let mut capturing = allocate_runners(sim, runners, Policy::Generations(2));
    for (r, temps) in [(0u32, &[256usize, 128][..]), (1, &[64][..])] {
        let cap = capturing.capture(RunnerId(r)).unwrap();
        let own = cap.take(OWN).unwrap();
        cap.step_copies(4);
        cap.stream_capture_repeatable(s, |s| {
            let held = (temps.iter())
                .map(|&len| sim.alloc_async(s, len))
                .collect::<Result<Vec<_>, _>>()?;
            for t in &held {
                sim.launch(s, sim::Kernel::fill(&own, 1.0), 1)?;
                sim.free_async(s, t)?;
            }
            Ok::<(), replay_arena::Error>(())
        })
        .unwrap();
        cap.finish().unwrap();
    }
    capturing.seal().unwrap()
}

/// A step of runner `r` on `lanes[r]`, for each `r`.
fn step_on<'r>(
    rp: &'r mut Replayable<sim::Device>,
    lanes: &[&sim::Stream],
) -> StepBuilder<'r, sim::Device> {
    let mut step = rp.step();
    for (r, lane) in lanes.iter().enumerate() {
        step.replay(RunnerId(r as u32), lane).unwrap();
    }
    step
}

#[test]
fn a_plans_estimate_is_its_largest_graphs_span_per_stream_that_runs_at_once() {
    let sim = sim::Device::new();
    let s = sim.new_stream();
    let rp = plan(&sim, &s);
    let (t0, _) = rp.temporaries(RunnerId(0)).unwrap();
    assert_eq!((t0.allocations, t0.bytes, t0.span), (2, 384 * 4, 384 * 4));
    let e = rp.graph_memory(2).unwrap();
    assert_eq!(e.granule, sim.graph_memory_granule());
    assert_eq!(e.granule, 1);
    assert_eq!(e.largest_runner, Some(RunnerId(0)));
    assert_eq!((e.per_stream, e.concurrent, e.bytes), (1536, 2, 3072));
    assert_eq!(e.driver, sim.graph_memory_in_use().unwrap());
    // No concurrency is one stream.
    assert_eq!(rp.graph_memory(0).unwrap().bytes, 1536);
    let report = rp.report().unwrap();
    assert_eq!(
        report.graph_memory_estimate,
        Some(rp.graph_memory(1).unwrap())
    );
    let text = report.to_string();
    assert!(
        text.contains("estimated: 1.50 KiB per stream the replays overlap on (runner 0's"),
        "{text}"
    );
}

#[test]
fn a_step_graphs_estimate_takes_a_share_and_a_granule_per_lane() {
    let sim = sim::Device::new();
    let (s, x, y) = (sim.new_stream(), sim.new_stream(), sim.new_stream());
    let mut rp = plan(&sim, &s);
    let one_lane = (&[&x, &x][..], 1, 1536 + 1);
    let two_lanes = (&[&x, &y][..], 2, 1536 + 1 + 256 + 1);
    for (lanes, n, expected) in [one_lane, two_lanes] {
        let graph = step_on(&mut rp, lanes).build().unwrap();
        let m = graph.graph_memory().unwrap();
        assert_eq!(m.lanes, n);
        assert_eq!((m.temporaries.allocations, m.temporaries.bytes), (3, 1792));
        assert_eq!((m.granule, m.bytes), (1, expected));
        let kept = graph.keep();
        assert_eq!(kept.graph_memory().unwrap(), m);
    }
    // Overlapping: two graphs that run at once, each its share.
    let graph = step_on(&mut rp, &[&x, &x]).build_overlapping().unwrap();
    assert_eq!(graph.graph_memory().unwrap().bytes, 2 * (1536 + 1));
}

#[test]
fn a_chain_of_handoffs_on_two_streams_takes_one_share_at_a_time() {
    // Runner 1 reads runner 0's handoff (no ready point: after its whole
    // graph), so the two never run at once, whatever their streams.
    let (d, handoffs) = chain_of(2, OWN, OWN);
    let h = handoffs[0];
    let sim = sim::Device::new();
    let (x, y) = (sim.new_stream(), sim.new_stream());
    let mut capturing = allocate_discovered(&sim, d, Policy::Generations(2));
    for (r, len) in [(0u32, 256usize), (1, 64)] {
        let cap = capturing.capture(RunnerId(r)).unwrap();
        let own = cap.take(OWN).unwrap();
        let out = (r == 0).then(|| cap.hand_off(h).unwrap());
        let input = (r == 1).then(|| cap.receive(h).unwrap());
        cap.stream_capture_repeatable(&x, |s| {
            let t = sim.alloc_async(s, len)?;
            sim.launch(s, sim::Kernel::fill(&own, 1.0), 1)?;
            if let Some(out) = &out {
                sim.launch(s, sim::Kernel::copy(&own, out), 1)?;
            }
            if let Some(input) = &input {
                sim.launch(s, sim::Kernel::add(input, &own), 1)?;
            }
            sim.free_async(s, &t)?;
            Ok::<(), replay_arena::Error>(())
        })
        .unwrap();
        cap.finish().unwrap();
    }
    let mut rp = capturing.seal().unwrap();
    let graph = step_on(&mut rp, &[&x, &y]).build().unwrap();
    let m = graph.graph_memory().unwrap();
    assert_eq!(m.lanes, 2);
    assert_eq!(m.bytes, 1024 + 1, "the larger share, not both");
}
