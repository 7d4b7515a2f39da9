//! A kept step launched again on one stream after a `wait_for` or
//! `wait_all` brings the fence up to date: later users wait for the second
//! launch, not the first.
//!
//! The finding (fixed): a `wait_for` or `wait_all` between two launches of
//! one kept step on one stream recorded the runner's completion after the
//! first launch, and the second launch (nothing else having replayed or
//! consumed) did not bring the fence up to date, so later users waited
//! only for the first. The fence's epoch now counts its event records too.

use crate::support::attacks::replayed_world;
use crate::support::steps::kept::*;
use replay_arena::backend::Streams;
use replay_arena::sim;
use replay_arena::RunnerId;

/// One call on the plan of [`after_kept_launches`], on its stream `s[i]`.
#[derive(Clone, Copy)]
enum Op {
    /// `launch_kept` of the kept step.
    Launch(usize),
    WaitFor(u32, usize),
    WaitAll(usize),
    Replay(u32, usize),
    /// A consumer of the runner copying its view out.
    Consume(u32, usize),
}

/// Two runners of 100 ticks at `generations`, every one replayed on
/// `s[1]` in a kept step (overlapping or not); `ops` run on the plan, and
/// once synchronized, no hazard.
fn after_kept_launches(generations: usize, overlapping: bool, ops: &[Op]) {
    let mut x = setup(2, generations, 100);
    let mut kept = if overlapping {
        let mut step = x.replayable.step();
        for r in 0..2 {
            step.replay(RunnerId(r), &x.s[1]).unwrap();
        }
        step.build_overlapping().unwrap().keep()
    } else {
        kept_all(&mut x, 1)
    };
    let out = x.sim.alloc_f32(64).unwrap();
    let (sim, rp, s) = (&x.sim, &mut x.replayable, &x.s);
    for &op in ops {
        match op {
            Op::Launch(i) => rp.launch_kept(&mut kept, &s[i]).unwrap(),
            Op::WaitFor(r, i) => rp.wait_for(RunnerId(r), &s[i]).unwrap(),
            Op::WaitAll(i) => rp.wait_all(&s[i]).unwrap(),
            Op::Replay(r, i) => rp.replay(RunnerId(r), &s[i]).unwrap(),
            Op::Consume(r, i) => rp
                .consume(RunnerId(r), &s[i], |st, v| {
                    sim.launch(st, sim::Kernel::copy(&v[0], &out), 1)
                })
                .unwrap(),
        }
    }
    x.sim.synchronize().unwrap();
    let h = x.sim.hazards();
    assert!(h.is_empty(), "hazards: {h:?}");
}

/// launch_kept on S; wait_for (records the Pending completion as an event
/// right after launch 1, no epoch bump); launch_kept on S again (same
/// stream, nothing "used" the plan: no absorb); then a replay on another
/// stream waits on the stale event: races with launch 2.
#[test]
fn wait_for_between_kept_launches_on_one_stream() {
    use Op::*;
    after_kept_launches(
        2,
        false,
        &[Launch(2), WaitFor(0, 3), Launch(2), Replay(0, 4)],
    );
}

/// The same with `wait_all`.
#[test]
fn wait_all_between_kept_launches_on_one_stream() {
    use Op::*;
    after_kept_launches(1, false, &[Launch(2), WaitAll(3), Launch(2), Replay(1, 4)]);
}

/// A consumer on the stream that waited after launch 1 skips its wait
/// (`waited_by` is that stream) and races with launch 2.
#[test]
fn wait_for_after_second_kept_launch_is_skipped() {
    use Op::*;
    after_kept_launches(
        2,
        false,
        &[Launch(2), WaitFor(0, 3), Launch(2), Consume(0, 3)],
    );
}

/// Sanity: the fuzz above with `wait_all` on a spare stream between
/// operations (the bug of the first tests).
#[test]
fn fuzz_with_wait_all_finds_the_stale_event() {
    let mut w = replayed_world(4, 2, &[30]);
    let mut k = build_kept(&mut w, &[It::R(0, 0), It::R(1, 1), It::C(1, 2, 0)], false).unwrap();
    let (l3, l4) = (w.lanes[3].clone(), w.lanes[4].clone());
    w.rep.launch_kept(&mut k, &l3).unwrap();
    w.rep.wait_all(&l4).unwrap();
    w.rep.launch_kept(&mut k, &l3).unwrap();
    run_item(&mut w, It::C(1, 0, 10)).unwrap();
    w.sim.synchronize().unwrap();
    assert!(w.sim.hazards().is_empty(), "{:?}", w.sim.hazards());
}

/// The stale-event bug with an overlapping kept step (two graphs) on one
/// launch stream.
#[test]
fn wait_all_between_overlapping_kept_launches_on_one_stream() {
    use Op::*;
    let ops = [Launch(2), Launch(2), WaitAll(3), Launch(2), Replay(0, 4)];
    after_kept_launches(2, true, &ops);
}

/// Control: the same sequence with a borrowed StepGraph cannot be written
/// (wait_all needs `&mut Replayable`); with the kept step launched on a
/// *different* stream the second time, the launch absorbs and all is well.
#[test]
fn control_wait_all_then_kept_on_other_stream_is_fine() {
    use Op::*;
    after_kept_launches(2, false, &[Launch(2), WaitAll(3), Launch(5), Replay(0, 4)]);
}

/// The stale event gives a wrong value: a consumer after the second kept
/// launch reads what the first one wrote.
#[test]
fn stale_event_wrong_value() {
    let mut w = replayed_world(1, 1, &[100]); // view = 1
    let mut k = build_kept(&mut w, &[It::R(0, 0)], false).unwrap();
    let (l1, l2) = (w.lanes[1].clone(), w.lanes[3].clone());
    w.rep.launch_kept(&mut k, &l2).unwrap(); // view = 2
    w.rep.wait_all(&l1).unwrap();
    w.rep.launch_kept(&mut k, &l2).unwrap(); // view = 3
    let out = w.sim.alloc_f32(64).unwrap();
    let sim = w.sim.clone();
    w.rep
        .consume(RunnerId(0), &l1, |s, v| {
            sim.launch(s, sim::Kernel::copy(&v[0], &out), 1)
        })
        .unwrap();
    w.rep.synchronize().unwrap();
    assert_eq!(w.sim.read_f32(&out).unwrap()[0], 3.0);
}
