//! The single-generation path (G = 1, upstream's rule for one module kind)
//! end to end on the H200: four runners of different sizes share one set of
//! arenas, replay 2,000 times each on two streams with a consumer on a third,
//! and every consumer output and the final arena contents are checked against
//! a host model of the kernels.
#![cfg(feature = "cuda")]

use crate::support;

use replay_arena::{Policy, RunnerId};
use support::gpu::{
    capture_specs, discover_specs, gpu, host_outputs, host_wgrad, mismatches, Rig, Spec,
};

const STEPS: usize = 2000;

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_generation_many_replays_match_the_host_model() {
    let g = gpu();
    let specs = [
        Spec::new(21, &[4096], None),
        Spec::new(22, &[777, 1500], Some(300)),
        Spec::new(23, &[10000], None),
        Spec::new(24, &[2500], Some(999)),
    ];
    let planned = discover_specs(&specs).plan(Policy::ModuleKinds(1)).unwrap();
    assert_eq!(planned.generations(), 1);
    println!("{}", planned.report());

    let rig = Rig::new(&g, &specs, 2);
    let mut replayable = capture_specs(&g, planned, &specs, &rig.states, &rig.pool);
    // One generation: every runner's first wgrad view starts at the same
    // address.
    let first: Vec<u64> = specs
        .iter()
        .enumerate()
        .map(|(r, spec)| spec.split(replayable.views(RunnerId(r as u32)).unwrap()).1[0])
        .collect();
    assert!(first.iter().all(|&a| a == first[0]), "{first:x?}");

    let started = std::time::Instant::now();
    for step in 0..STEPS {
        for (r, spec) in specs.iter().enumerate() {
            rig.replay_and_fold(&g, &mut replayable, spec, r, step + r);
        }
    }
    replayable.synchronize().unwrap();
    let elapsed = started.elapsed();
    let stats = replayable.fence_stats();
    println!(
        "{} replays + consumers in {:.1} ms ({:.2} us per replay+consume), {} waits, {} skipped",
        stats.replays,
        elapsed.as_secs_f64() * 1e3,
        elapsed.as_secs_f64() * 1e6 / stats.replays as f64,
        stats.waits,
        stats.waits_skipped
    );
    assert_eq!(stats.replays, (STEPS * specs.len()) as u64);

    let got = rig.outs(&g);
    let expected: Vec<Vec<Vec<u32>>> = specs
        .iter()
        .map(|s| host_outputs(s, STEPS as u32))
        .collect();
    assert_eq!(
        mismatches(&got, &expected),
        0,
        "outputs differ from the host model"
    );
    assert_eq!(g.read(&rig.torn), vec![0]);
    for (r, state) in rig.states.iter().enumerate() {
        assert_eq!(g.read(&state.step), vec![STEPS as u32], "runner {r} steps");
    }
    // The shared arena holds what the last runner wrote at the last step.
    let last = specs.len() - 1;
    let views = replayable.views(RunnerId(last as u32)).unwrap();
    let (_, w) = specs[last].split(views);
    let n = specs[last].wgrads[0];
    let arena: Vec<f32> = g.read_raw(w[0], n as usize);
    let model: Vec<f32> = (0..n)
        .map(|i| host_wgrad(&specs[last], 0, STEPS as u32 - 1, i))
        .collect();
    assert!(
        arena == model,
        "the arena's final contents differ from the model"
    );
    replayable.replan().unwrap();
}
