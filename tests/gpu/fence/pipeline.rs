//! A backward-like pipeline on the H200: ten buffer-using runners of different
//! sizes (plus one that requests nothing) replay on a pool of 2 or 3 streams
//! with 1, 2 or 3 generations (and packed placement); after each replay a
//! consumer on another stream folds the runner's wgrads into outputs through
//! [`Replayable::consume`]. 1,000 replays per configuration; the outputs
//! must equal an eager run of the same kernels bit for bit, and the eager run
//! must equal the host model.
#![cfg(feature = "cuda")]

use crate::support;

use std::sync::OnceLock;

use replay_arena::{PlacedPolicy, Policy, RunnerId};
use support::gpu::{discover_specs, eager, gpu, host_outputs, mismatches, Rig, Spec};

const STEPS: usize = 100;

/// Runner 2 requests nothing; runners 1 and 5 use two wgrad views (5: the
/// same parameter twice, as MTP does); several read a scratch view of a
/// second key (i32).
fn specs() -> Vec<Spec> {
    vec![
        Spec::new(1, &[3000], None),
        Spec::new(2, &[1024, 5000], Some(777)),
        Spec::new(3, &[], None),
        Spec::new(4, &[12345], Some(64)),
        Spec::new(5, &[257], None),
        Spec::new(6, &[8192, 8192], None),
        Spec::new(7, &[40000], Some(4096)),
        Spec::new(8, &[999], None),
        Spec::new(9, &[65536], Some(100)),
        Spec::new(10, &[3], None),
        Spec::new(11, &[20000], Some(2048)),
    ]
}

/// Host model of every runner's outputs, computed once per process.
fn host() -> &'static Vec<Vec<Vec<u32>>> {
    static HOST: OnceLock<Vec<Vec<Vec<u32>>>> = OnceLock::new();
    HOST.get_or_init(|| {
        specs()
            .iter()
            .map(|s| host_outputs(s, STEPS as u32))
            .collect()
    })
}

fn pipeline(streams: usize, strategy: impl Into<PlacedPolicy>) {
    let strategy = strategy.into();
    let g = gpu();
    let specs = specs();
    let expected = eager(&g, &specs, STEPS);
    assert_eq!(
        mismatches(&expected, host()),
        0,
        "the eager run differs from the host model"
    );

    let planned = discover_specs(&specs).plan(strategy).unwrap();
    println!("{streams} streams, {strategy:?}\n{}", planned.report());

    let rig = Rig::new(&g, &specs, streams);
    let mut capturing = planned.allocate(g.backend.clone()).unwrap();
    let using: Vec<usize> = (0..specs.len())
        .filter(|&r| !specs[r].wgrads.is_empty())
        .collect();
    for &r in &using {
        let cap = capturing.capture(RunnerId(r as u32)).unwrap();
        specs[r].capture(&g, cap, g.ptr(&rig.states[r].step), &rig.pool[r % streams]);
    }
    let mut replayable = capturing.seal().unwrap();

    for step in 0..STEPS {
        for (k, &r) in using.iter().enumerate() {
            rig.replay_and_fold(&g, &mut replayable, &specs[r], r, step + k);
        }
    }
    replayable.synchronize().unwrap();

    let stats = replayable.fence_stats();
    let got = rig.outs(&g);
    let wrong = mismatches(&got, &expected);
    println!(
        "{} replays, {} waits, {} skipped, {} event records; {} output elements, {wrong} differ from eager",
        stats.replays,
        stats.waits,
        stats.waits_skipped,
        stats.event_records,
        got.iter().flatten().map(Vec::len).sum::<usize>()
    );
    assert_eq!(wrong, 0, "replayed outputs differ from the eager run");
    assert!(got == expected);
    assert_eq!(
        g.read(&rig.torn),
        vec![0],
        "a consumer saw its input change"
    );
    assert_eq!(stats.replays, (STEPS * using.len()) as u64);
    assert!(stats.replays >= 1000);
    assert!(stats.waits > 0, "replays on several streams must wait");
    replayable.replan().unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn two_streams_one_generation() {
    pipeline(2, Policy::Generations(1));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn two_streams_two_generations() {
    pipeline(2, Policy::Generations(2));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn two_streams_three_generations() {
    pipeline(2, Policy::Generations(3));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn two_streams_two_generations_packed() {
    pipeline(2, Policy::Generations(2).packed());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn three_streams_one_generation() {
    pipeline(3, Policy::Generations(1));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn three_streams_two_generations() {
    pipeline(3, Policy::Generations(2));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn three_streams_three_generations() {
    pipeline(3, Policy::Generations(3));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn three_streams_two_generations_packed() {
    pipeline(3, Policy::Generations(2).packed());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn three_streams_overlap_depth_three_packed() {
    pipeline(3, Policy::OverlapDepth(3).packed());
}
