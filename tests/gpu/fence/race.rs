//! The fence is what keeps a slow consumer's input intact, shown on the H200.
//!
//! Six runners of one size share two generations (round-robin or packed), so
//! runner r + 2 overwrites runner r's bytes. Runners replay on a pool of two
//! streams; a slow consumer on a third stream reads each runner's wgrad twice,
//! many clock cycles apart, and folds it into an output. The consumer starts
//! once its runner's replay is done (a test event), so the only thing that
//! can keep runner r + 2 from overwriting the bytes mid-read is the fence:
//!
//! - fenced ([`Replayable::replay`]): outputs equal the eager run, no torn
//!   read, every time;
//! - unfenced ([`Replayable::replay_unfenced`]): the same schedule is seen to
//!   corrupt the consumer's input.
#![cfg(feature = "cuda")]

use crate::support;

use replay_arena::cuda;
use replay_arena::{PlacedPolicy, Policy, ReadOnly, RunnerId, View};
use support::gpu::slow::{self, N, RUNNERS, STEPS};
use support::gpu::{capture_specs, discover_specs, eager, gpu, mismatches, Gpu, Rig, Spec};

struct Outcome {
    /// Output elements that differ from the eager run.
    wrong: usize,
    /// Reads that saw the element change under them.
    torn: u32,
}

fn run(g: &Gpu, specs: &[Spec], strategy: PlacedPolicy, fenced: bool) -> Outcome {
    let planned = discover_specs(specs).plan(strategy).unwrap();
    assert_eq!(planned.generations(), 2);
    let rig = Rig::new(g, specs, 2);
    let done: Vec<_> = specs
        .iter()
        .map(|_| g.backend.context().new_event(None).unwrap())
        .collect();

    let mut replayable = capture_specs(g, planned, specs, &rig.states, &rig.pool);
    // Runner r and r + 2 must share bytes, or there is nothing to race on.
    let base = |r: u32| replayable.views(RunnerId(r)).unwrap()[0].device_address();
    assert_eq!(base(0), base(2), "runners 0 and 2 share their arena bytes");

    for _ in 0..STEPS {
        for (r, spec) in specs.iter().enumerate() {
            let runner = RunnerId(r as u32);
            let stream = &rig.pool[r % 2];
            if fenced {
                replayable.replay(runner, stream).unwrap();
            } else {
                // SAFETY: this run exists to show the corruption the fence
                // prevents; nothing but the test's own reads is affected.
                unsafe { replayable.replay_unfenced(runner, stream) }.unwrap();
            }
            done[r].record(stream.cudarc()).unwrap();
            let consume = |s: &cuda::Stream, views: &[View<'_, ReadOnly>]| {
                s.cudarc().wait(&done[r]).map_err(|e| format!("{e:?}"))?;
                slow::fold(g, &rig, spec, r, s, views)
            };
            if fenced {
                replayable.consume(runner, &rig.consumer, consume).unwrap();
            } else {
                // The unfenced reference reads the views with no fence
                // either (the fence never saw the unfenced replays).
                let views = replayable.views(runner).unwrap();
                let views: Vec<_> = views.iter().map(View::read_only).collect();
                consume(&rig.consumer, &views).unwrap();
            }
        }
    }
    replayable.synchronize().unwrap();
    let got = rig.outs(g);
    let expected = eager(g, specs, STEPS);
    let outcome = Outcome {
        wrong: mismatches(&got, &expected),
        torn: g.read(&rig.torn)[0],
    };
    println!(
        "{strategy:?}, fence {}: {} of {} output elements differ from eager, {} torn reads",
        if fenced { "on" } else { "off" },
        outcome.wrong,
        RUNNERS * N,
        outcome.torn
    );
    replayable.replan().unwrap();
    outcome
}

fn fence_on_never_corrupts_fence_off_does(strategy: PlacedPolicy) {
    let g = gpu();
    let specs = slow::specs(None);
    for round in 0..3 {
        let on = run(&g, &specs, strategy, true);
        assert_eq!(
            (on.wrong, on.torn),
            (0, 0),
            "round {round}: the fence let a replay overwrite a consumer's input"
        );
    }
    let off = run(&g, &specs, strategy, false);
    assert!(
        off.wrong > 0 || off.torn > 0,
        "without the fence the slow consumer should have seen its input overwritten"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn slow_consumer_round_robin_fence_on_clean_fence_off_corrupt() {
    fence_on_never_corrupts_fence_off_does(Policy::Generations(2).into());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn slow_consumer_packed_fence_on_clean_fence_off_corrupt() {
    fence_on_never_corrupts_fence_off_does(Policy::Generations(2).packed());
}
