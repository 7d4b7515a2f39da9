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

use replay_arena::cuda;
use replay_arena::cuda::cudarc::driver::CudaSlice;
use replay_arena::{PlacedPolicy, Policy, ReadOnly, RunnerId, View};
use support::gpu::{capture_specs, discover_specs, eager, gpu, mismatches, Gpu, Spec, State};

const RUNNERS: u32 = 6;
const N: u32 = 1 << 14;
const STEPS: usize = 20;
const SPIN: i64 = 20_000;
const CONSUMER_BLOCKS: u32 = 8;

fn stepped_equals_eager(strategy: PlacedPolicy) {
    let g = gpu();
    let specs: Vec<Spec> = (0..RUNNERS)
        .map(|r| Spec::new(r, &[N], Some(256)))
        .collect();
    let planned = discover_specs(&specs).plan(strategy).unwrap();
    let pool: Vec<cuda::Stream> = (0..2).map(|_| g.backend.new_stream().unwrap()).collect();
    let (consumer, launch) = (
        g.backend.new_stream().unwrap(),
        g.backend.new_stream().unwrap(),
    );
    let states: Vec<State> = specs.iter().map(|s| State::new(&g, s)).collect();
    let torn: CudaSlice<u32> = g.zeros(1);
    let mut replayable = capture_specs(&g, planned, &specs, &states, &pool);
    let consume = |g: &Gpu,
                   spec: &Spec,
                   out: &CudaSlice<u32>,
                   s: &cuda::Stream,
                   views: &[View<'_, ReadOnly>]| {
        let (_, w) = spec.split(views);
        g.consume(
            s,
            g.ptr(out),
            w[0],
            N,
            SPIN,
            g.ptr(&torn),
            Some(CONSUMER_BLOCKS),
        )
    };
    {
        let mut step = replayable.step();
        for (r, spec) in specs.iter().enumerate() {
            let runner = RunnerId(r as u32);
            step.replay(runner, &pool[r % 2]).unwrap();
            let out = &states[r].outs[0];
            step.consume(runner, &consumer, |s, views| {
                consume(&g, spec, out, s, views)
            })
            .unwrap();
        }
        let mut graph = step.build().unwrap();
        println!("{strategy:?}: {graph:?}");
        for _ in 0..STEPS {
            graph.launch(&launch).unwrap();
        }
        let optimizer = g.backend.new_stream().unwrap();
        graph.wait_all(&optimizer).unwrap();
        optimizer.synchronize().unwrap();
    }
    let got: Vec<Vec<Vec<u32>>> = states.iter().map(|s| s.read_outs(&g)).collect();
    let expected = eager(&g, &specs, STEPS);
    assert_eq!(
        mismatches(&got, &expected),
        0,
        "{strategy:?}: outputs differ from eager"
    );
    assert_eq!(
        g.read(&torn),
        vec![0],
        "{strategy:?}: a consumer's input changed under it"
    );

    // Per runner again, where the step graphs left the plan.
    for (r, spec) in specs.iter().enumerate() {
        let runner = RunnerId(r as u32);
        replayable.replay(runner, &pool[r % 2]).unwrap();
        let out = &states[r].outs[0];
        replayable
            .consume(runner, &consumer, |s, views| {
                consume(&g, spec, out, s, views)
            })
            .unwrap();
    }
    replayable.synchronize().unwrap();
    let got: Vec<Vec<Vec<u32>>> = states.iter().map(|s| s.read_outs(&g)).collect();
    let expected = eager(&g, &specs, STEPS + 1);
    assert_eq!(
        mismatches(&got, &expected),
        0,
        "{strategy:?}: per runner after the step graph"
    );
    assert_eq!(g.read(&torn), vec![0]);
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
