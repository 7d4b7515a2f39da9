//! Step graphs on the H200: one step's schedule (six runners in two
//! generations on a pool of two streams, a slow consumer of each on a
//! third) compiled into one graph and launched once per step. The slow
//! consumer reads each runner's wgrad twice, many cycles apart, while the
//! next runners of the step would overwrite it if the graph's edges let
//! them: the outputs equal the eager run bit for bit, no read is torn, for
//! round-robin and packed plans, and per-runner replays go on exactly
//! after the step graph is dropped.
#![cfg(feature = "cuda")]

use crate::support;

use replay_arena::{PlacedPolicy, Policy, RunnerId};
use support::gpu::slow::{self, STEPS};
use support::gpu::{capture_specs, discover_specs, eager, gpu, mismatches, Rig};

fn stepped_equals_eager(strategy: PlacedPolicy) {
    let g = gpu();
    let specs = slow::specs(Some(256));
    let planned = discover_specs(&specs).plan(strategy).unwrap();
    let rig = Rig::new(&g, &specs, 2);
    let launch = g.backend.new_stream().unwrap();
    let mut replayable = capture_specs(&g, planned, &specs, &rig.states, &rig.pool);
    {
        let mut step = replayable.step();
        slow::schedule(&g, &rig, &specs, &mut step);
        let mut graph = step.build().unwrap();
        println!("{strategy:?}: {graph:?}");
        for _ in 0..STEPS {
            graph.launch(&launch).unwrap();
        }
        let optimizer = g.backend.new_stream().unwrap();
        graph.wait_all(&optimizer).unwrap();
        optimizer.synchronize().unwrap();
    }
    let got = rig.outs(&g);
    let expected = eager(&g, &specs, STEPS);
    assert_eq!(
        mismatches(&got, &expected),
        0,
        "{strategy:?}: outputs differ from eager"
    );
    assert_eq!(
        g.read(&rig.torn),
        vec![0],
        "{strategy:?}: a consumer's input changed under it"
    );

    // Per runner again, where the step graphs left the plan.
    for (r, spec) in specs.iter().enumerate() {
        let runner = RunnerId(r as u32);
        replayable.replay(runner, &rig.pool[r % 2]).unwrap();
        replayable
            .consume(runner, &rig.consumer, |s, views| {
                slow::fold(&g, &rig, spec, r, s, views)
            })
            .unwrap();
    }
    replayable.synchronize().unwrap();
    let got = rig.outs(&g);
    let expected = eager(&g, &specs, STEPS + 1);
    assert_eq!(
        mismatches(&got, &expected),
        0,
        "{strategy:?}: per runner after the step graph"
    );
    assert_eq!(g.read(&rig.torn), vec![0]);
    assert_eq!(replayable.fence_stats().step_launches, STEPS as u64);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn round_robin_step_graph_equals_eager_with_a_slow_consumer() {
    stepped_equals_eager(Policy::Generations(2).into());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn packed_step_graph_equals_eager_with_a_slow_consumer() {
    stepped_equals_eager(Policy::Generations(2).packed());
}
