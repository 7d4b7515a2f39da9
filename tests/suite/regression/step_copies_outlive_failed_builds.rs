//! A step builder dropped unbuilt, a build that fails (a backend fault
//! while composing, the writer twice with one copy, a consumer of
//! overwritten views) or a step consumer that panics keeps the runners'
//! step copies for the next step graph, and leaves no stream capturing.
//! An attack that found no hole.

use std::panic::{catch_unwind, AssertUnwindSafe};

use replay_arena::backend::Streams;
use replay_arena::sim::{self, Call, Faults};
use replay_arena::{RunnerId, StepError};

use crate::support::faults::chain::{chain_with, standard};
use crate::support::faults::fan::{self, all, fan, identity, Item, Spec};
use crate::support::faults::{under, R};

#[test]
fn dropping_a_builder_or_a_failed_build_keeps_the_step_copies() {
    let mut c = chain_with(3, 2, 1, &mut standard);
    let pool = c.pool.clone();
    let sim = c.sim.clone();
    let r = c.r();
    {
        let mut step = r.step();
        for l in 0..3u32 {
            step.replay(RunnerId(l), &pool[l as usize % 2]).unwrap();
        }
        // dropped unbuilt
    }
    for l in 0..3u32 {
        assert_eq!(r.temporaries(RunnerId(l)).unwrap().1, 1);
    }
    // A build failing on a backend fault while composing.
    {
        let mut step = r.step();
        for l in 0..3u32 {
            step.replay(RunnerId(l), &pool[l as usize % 2]).unwrap();
        }
        let e = under(&sim, Faults::nth(Call::Compose, 0), || step.build());
        assert!(matches!(e, Err(StepError::Backend(_))), "{:?}", e.err());
    }
    // Copies lost or kept, the count is consistent with what builds do.
    let left: Vec<usize> = (0..3u32)
        .map(|l| r.temporaries(RunnerId(l)).unwrap().1)
        .collect();
    let mut step = r.step();
    let mut ok = true;
    for l in 0..3u32 {
        let res = step.replay(RunnerId(l), &pool[l as usize % 2]);
        if left[l as usize] == 0 {
            assert!(
                matches!(res, Err(StepError::NoStepCopy { .. })),
                "{l}: {:?}",
                res.err()
            );
            ok = false;
        } else {
            res.unwrap();
        }
    }
    if ok {
        let mut g = step.build().unwrap();
        g.launch(&pool[0]).unwrap();
    } else {
        drop(step);
    }
    c.per_runner(2);
    c.hazard_free();
    c.teardown();
}

#[test]
fn a_panicking_step_consumer_keeps_the_cut_copies_and_leaves_no_capture() {
    let mut c = chain_with(2, 2, 1, &mut standard);
    let (pool, sim, side, c_sink) = c.apart();
    {
        let r = c.r();
        let res = catch_unwind(AssertUnwindSafe(|| {
            let mut step = r.step();
            step.replay(RunnerId(0), &pool[0]).unwrap();
            let _ = step.consume(RunnerId(0), &side, |s, v| -> R {
                sim.launch(s, sim::Kernel::scale(&v[0], 1.0), 1).ok();
                panic!("consumer panics");
            });
        }));
        assert!(res.is_err());
        assert!(!sim.is_capturing(&side).unwrap());
        assert_eq!(
            r.temporaries(RunnerId(0)).unwrap().1,
            1,
            "copy lost by a panic"
        );
        let mut step = r.step();
        step.replay(RunnerId(0), &pool[0]).unwrap();
        step.replay(RunnerId(1), &pool[1]).unwrap();
        let sink = &c_sink;
        step.consume(RunnerId(1), &side, |s, v| {
            sim.launch(s, sim::Kernel::add(&v[0], sink), 1)
        })
        .unwrap();
        let mut g = step.build().unwrap();
        g.launch(&pool[1]).unwrap();
        g.launch(&side).unwrap();
    }
    c.per_runner(1);
    c.hazard_free();
    drop(c_sink);
    c.teardown();
}

#[test]
fn the_writer_twice_with_one_copy_is_a_typed_error() {
    let spec = Spec::new(2);
    let mut f = fan(&spec, &identity(2));
    let items = [Item::Replay(0, 0), Item::Replay(1, 1), Item::Replay(0, 2)];
    let err = f.build(&items, false).unwrap_err();
    assert!(
        matches!(err, StepError::NoStepCopy { captured: 1, .. }),
        "{err}"
    );
    // The copy is kept for the next step.
    let kept = f.build(&all(&spec), false).unwrap();
    drop(kept);
    f.per_runner(&all(&spec));
    f.hazard_free();
    f.teardown();
}

#[test]
fn consuming_an_overwritten_writer_in_a_step_is_a_typed_error() {
    let mut spec = Spec::new(3);
    spec.g = 2;
    let mut f = fan(&spec, &identity(3));
    let side = f.side.clone();
    let s = f.streams.clone();
    let sim = f.sim.clone();
    let cs = f.sim.alloc_f32(fan::N).unwrap();
    let mut step = f.r().step();
    for r in 0..4u32 {
        step.replay(RunnerId(r), &s[r as usize]).unwrap();
    }
    let mut ran = false;
    let res = step.consume(RunnerId(0), &side, |s, v| -> R {
        ran = true;
        Ok(sim.launch(s, sim::Kernel::add(&v[0], &cs), 3)?)
    });
    // Refused at the consumer or at build, before anything runs.
    if res.is_ok() {
        let err = match step.build() {
            Ok(_) => panic!("a consumer of overwritten views built"),
            Err(e) => e,
        };
        assert!(matches!(err, StepError::Schedule(_)), "{err}");
    } else {
        drop(step);
    }
    // The writer's cut copy is still there.
    let mut kept = f.build(&all(&spec), false).unwrap();
    f.r().launch_kept(&mut kept, &s[0]).unwrap();
    drop(kept);
    let _ = (ran, cs);
    f.per_runner(&all(&spec));
    f.hazard_free();
    f.teardown();
}

#[test]
fn dropped_builders_and_failed_builds_keep_the_cut_copies() {
    let spec = Spec::new(3);
    let mut f = fan(&spec, &identity(3));
    let items = all(&spec);
    {
        // A builder dropped after the writer's replay.
        let s = f.streams.clone();
        let mut step = f.r().step();
        step.replay(RunnerId(0), &s[0]).unwrap();
        step.replay(RunnerId(1), &s[1]).unwrap();
        drop(step);
    }
    {
        // A failed build (the writer twice with one copy).
        let err = f
            .build(&[Item::Replay(0, 0), Item::Replay(0, 1)], false)
            .unwrap_err();
        assert!(matches!(err, StepError::NoStepCopy { .. }), "{err}");
    }
    {
        // build_overlapping wants two copies per replay.
        let r = f.build(&items, true);
        if let Err(e) = &r {
            assert!(matches!(e, StepError::NoStepCopy { .. }), "{e}");
        }
    }
    let (_, left) = f.r().temporaries(RunnerId(0)).unwrap();
    if left == 1 {
        let mut kept = f.build(&items, false).unwrap();
        let s = f.streams.clone();
        f.r().launch_kept(&mut kept, &s[0]).unwrap();
    }
    f.per_runner(&items);
    f.hazard_free();
    f.teardown();
}
