//! Lazy instantiation (`cuda::Device::with_lazy_instantiation`): a
//! runner's graph gets its executable graph at its first replay, never for
//! step graphs (which compose the captured graph), a step graph at its
//! first launch, and replays and step graphs of such a plan equal the
//! eager run bit for bit.
#![cfg(feature = "cuda")]

use crate::support;

use replay_arena::{Policy, RunnerId};
use support::gpu::slow::{self, STEPS};
use support::gpu::{capture_specs, discover_specs, eager, gpu, mismatches, Rig};

#[test]
#[ignore = "needs a CUDA GPU"]
fn runner_and_step_graphs_are_instantiated_at_their_first_launch_and_runner_graphs_never_for_a_step_graph(
) {
    let mut g = gpu();
    g.backend = g.backend.clone().with_lazy_instantiation(true);
    assert!(g.backend.lazy_instantiation());
    let specs = slow::specs(Some(256));
    let planned = discover_specs(&specs)
        .plan(Policy::OverlapDepth(2))
        .unwrap();
    let rig = Rig::new(&g, &specs, 2);
    let mut replayable = capture_specs(&g, planned, &specs, &rig.states, &rig.pool);
    let runners: Vec<RunnerId> = (0..specs.len() as u32).map(RunnerId).collect();
    let instantiated = |r: &replay_arena::Replayable<replay_arena::cuda::Device>| -> Vec<bool> {
        runners
            .iter()
            .map(|&id| r.graph(id).expect("captured").is_instantiated())
            .collect()
    };
    assert_eq!(
        instantiated(&replayable),
        vec![false; specs.len()],
        "at seal"
    );
    assert!(replayable
        .graph(RunnerId(0))
        .unwrap()
        .cu_graph_exec()
        .is_null());

    // Step graphs only: the runner graphs stay uninstantiated, and the
    // step graph gets its executable graph at its first launch, once.
    {
        let launch = g.backend.new_stream().unwrap();
        let mut step = replayable.step();
        slow::schedule(&g, &rig, &specs, &mut step);
        let mut graph = step.build().unwrap();
        let step_graph = |graph: &replay_arena::StepGraph<'_, replay_arena::cuda::Device>| {
            let [one] = graph.graphs() else {
                panic!("one composed graph")
            };
            (one.is_instantiated(), one.cu_graph_exec())
        };
        assert_eq!(
            step_graph(&graph),
            (false, std::ptr::null_mut()),
            "a step graph built lazily is not instantiated before its first launch"
        );
        graph.launch(&launch).unwrap();
        let (instantiated, exec) = step_graph(&graph);
        assert!(instantiated, "instantiated at its first launch");
        for _ in 1..STEPS {
            graph.launch(&launch).unwrap();
            assert_eq!(step_graph(&graph), (true, exec), "instantiated once");
        }
    }
    replayable.synchronize().unwrap();
    assert_eq!(
        instantiated(&replayable),
        vec![false; specs.len()],
        "after step graph launches"
    );
    assert_eq!(
        mismatches(&rig.outs(&g), &eager(&g, &specs, STEPS)),
        0,
        "step graphs of uninstantiated runner graphs differ from eager"
    );
    assert_eq!(g.read(&rig.torn), vec![0]);

    // Per runner: each graph is instantiated at its first replay, in turn.
    for (r, spec) in specs.iter().enumerate() {
        let runner = RunnerId(r as u32);
        replayable.replay(runner, &rig.pool[r % 2]).unwrap();
        let now = instantiated(&replayable);
        assert!(now[..=r].iter().all(|&i| i), "runner {r} replayed");
        assert!(now[r + 1..].iter().all(|&i| !i), "runners after {r}");
        replayable
            .consume(runner, &rig.consumer, |s, views| {
                slow::fold(&g, &rig, spec, r, s, views)
            })
            .unwrap();
    }
    // And again, on the executable graphs made at the first replays.
    for (r, spec) in specs.iter().enumerate() {
        let runner = RunnerId(r as u32);
        let exec = replayable.graph(runner).unwrap().cu_graph_exec();
        replayable.replay(runner, &rig.pool[r % 2]).unwrap();
        assert_eq!(replayable.graph(runner).unwrap().cu_graph_exec(), exec);
        replayable
            .consume(runner, &rig.consumer, |s, views| {
                slow::fold(&g, &rig, spec, r, s, views)
            })
            .unwrap();
    }
    replayable.synchronize().unwrap();
    assert_eq!(
        mismatches(&rig.outs(&g), &eager(&g, &specs, STEPS + 2)),
        0,
        "per-runner replays of lazily instantiated graphs differ from eager"
    );
    assert_eq!(g.read(&rig.torn), vec![0]);
}
