//! Attacks that found nothing: random interleavings of kept steps (one and
//! two graphs) with per-runner replays and consumers, against the same
//! sequence per runner (no `wait_for`/`wait_all`, to look past the
//! stale-event finding); teardown in either order; a kept step on a
//! replanned or another plan (`ForeignStep`); guards forgotten and views
//! borrowed between kept launches; traces around kept launches.

use crate::support::attacks::{
    kept_schedules, launch_kept_on_both, random_item, replayed_world, run_on_both,
};
use crate::support::steps::kept::*;
use crate::support::steps::plan_runners;
use replay_arena::backend::Streams;
use replay_arena::sim;
use replay_arena::{Policy, Replayable, RunnerId};

fn fuzz_one(seed: u64) {
    let mut rng = Lcg(seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407));
    let mut next = |m: u64| rng.below(m);
    let n = 4;
    let g = 1 + next(3) as usize;
    let durs: Vec<u64> = (0..4).map(|_| 1 + next(50)).collect();
    let schedules: Vec<(Vec<It>, bool)> = vec![
        (
            vec![
                It::R(0, 0),
                It::R(1, 1),
                It::C(1, 2, 0),
                It::R(2, 0),
                It::C(2, 0, 2),
                It::R(3, 1),
                It::C(3, 2, 1),
            ],
            false,
        ),
        (vec![It::R(2, 1), It::C(2, 2, 3), It::R(3, 0)], next(2) == 0),
        (vec![It::C(0, 1, 4)], false),
        (
            vec![It::R(1, 0), It::R(0, 1), It::C(0, 2, 5), It::C(1, 0, 6)],
            true,
        ),
    ];
    let mut a = replayed_world(n, g, &durs);
    let mut b = replayed_world(n, g, &durs);
    let mut kept = kept_schedules(&mut a, schedules);
    let mut log = Vec::new();
    for _ in 0..40 {
        match next(3) {
            0 | 1 => {
                let on_a = (&mut a.rep, &a.lanes[..]);
                let on_b = (&mut b, run_item);
                launch_kept_on_both(&mut next, on_a, &mut kept, on_b, seed, &mut log);
            }
            _ => {
                let it = random_item(&mut next, n);
                run_on_both((&mut a, &mut b), it, run_item, seed, &mut log);
            }
        }
    }
    assert_same_worlds(&a, &b, seed, &log);
    // Teardown: forget one kept step, drop the plan first, then the rest.
    let (forgotten, _) = kept.pop().unwrap();
    std::mem::forget(forgotten);
    let sim = a.sim.clone();
    drop(a.rep);
    drop(kept);
    assert!(sim.hazards().is_empty(), "seed {seed}: teardown hazards");
}

#[test]
fn fuzz_kept_interleavings() {
    for seed in 0..300 {
        fuzz_one(seed);
    }
}

/// Leaks: kept steps (one and two graphs) dropped after the plan, and
/// before it; then everything dropped: nothing left.
#[test]
fn teardown_orders_leave_nothing() {
    for order in 0..2 {
        let mut w = replayed_world(4, 2, &[30]);
        let mut k1 =
            build_kept(&mut w, &[It::R(0, 0), It::R(1, 1), It::C(1, 2, 0)], false).unwrap();
        let mut k2 = build_kept(&mut w, &[It::R(2, 0), It::C(2, 1, 1), It::R(3, 2)], true).unwrap();
        let (l3, l4) = (w.lanes[3].clone(), w.lanes[4].clone());
        for i in 0..5 {
            w.rep
                .launch_kept(&mut k1, if i % 2 == 0 { &l3 } else { &l4 })
                .unwrap();
            w.rep
                .launch_kept(&mut k2, if i % 2 == 0 { &l4 } else { &l3 })
                .unwrap();
            w.rep
                .launch_kept(&mut k2, if i % 2 == 0 { &l3 } else { &l4 })
                .unwrap();
        }
        let sim = w.sim.clone();
        let World {
            rep,
            lanes,
            counts,
            accs,
            _one,
            ..
        } = w;
        if order == 0 {
            drop(rep);
            drop((k1, k2));
        } else {
            drop((k1, k2));
            drop(rep);
        }
        drop((lanes, counts, accs, _one));
        assert!(
            sim.hazards().is_empty(),
            "order {order}: {:?}",
            sim.hazards()
        );
        assert_eq!(sim.live_allocations(), 0, "order {order}");
        assert_eq!(sim.live_events(), 0, "order {order}");
    }
}

/// A kept step of a plan launched on the plan replanned and sealed again,
/// and on another plan: refused.
#[test]
fn kept_step_on_replanned_plan_is_foreign() {
    let mut w = world(2, 1, &[5]);
    run_item(&mut w, It::R(0, 0)).unwrap();
    let mut k = build_kept(&mut w, &[It::R(0, 0), It::R(1, 1)], false).unwrap();
    let l = w.lanes[3].clone();
    w.rep.launch_kept(&mut k, &l).unwrap();
    let mut other = world(2, 1, &[5]);
    let lo = other.lanes[0].clone();
    assert!(matches!(
        other.rep.launch_kept(&mut k, &lo),
        Err(replay_arena::StepLaunchError::ForeignStep)
    ));
    assert!(matches!(
        other.rep.wait_kept(&k, &lo),
        Err(replay_arena::WaitError::ForeignStep)
    ));
    let sim = w.sim.clone();
    let d = w.rep.replan().unwrap();
    drop(d);
    drop(k);
    sim.synchronize().unwrap();
    assert!(sim.hazards().is_empty());
}

/// Runners with temporaries (step copies), a kept overlapping step and a
/// kept single one, a borrowed StepGraph launched and forgotten between
/// kept launches, a forgotten kept step; then replays, plan dropped.
#[test]
fn forget_and_borrowed_between_kept() {
    let rs = (0..3).map(|r| (RunnerId(r), [REQ]));
    let planned = plan_runners(rs, Policy::Generations(1));
    let sim = sim::Device::new();
    let l: Vec<sim::Stream> = (0..5).map(|_| sim.new_stream()).collect();
    let counts: Vec<_> = (0..3).map(|_| sim.alloc_f32(64).unwrap()).collect();
    let one = sim.alloc_f32(64).unwrap();
    sim.write_f32(&one, &[1.0; 64]).unwrap();
    let mut capturing = planned.allocate(sim.clone()).unwrap();
    for r in 0..3u32 {
        let cap = capturing.capture(RunnerId(r)).unwrap();
        let v = cap.take(REQ).unwrap();
        let c = &counts[r as usize];
        cap.step_copies(40);
        cap.stream_capture_repeatable(&l[0], |s| {
            sim.launch(s, sim::Kernel::add(&one, c), 1)?;
            let t = sim.alloc_async(s, 64)?;
            sim.launch(s, sim::Kernel::copy(c, &t), 3)?;
            sim.launch(s, sim::Kernel::copy(&t, &v), 20)?;
            sim.free_async(s, &t)
        })
        .unwrap();
        cap.finish().unwrap();
    }
    let mut rep = capturing.seal().unwrap();
    let acc = sim.alloc_f32(64).unwrap();
    let mut k1 = mk_step(&mut rep, &sim, &l, &acc, true).keep();
    let mut k2 = mk_step(&mut rep, &sim, &l, &acc, false).keep();
    for i in 0..6 {
        rep.launch_kept(&mut k1, &l[3 + i % 2]).unwrap();
        rep.launch_kept(&mut k1, &l[4 - i % 2]).unwrap();
        rep.replay(RunnerId(2), &l[i % 3]).unwrap();
        {
            let mut g = mk_step(&mut rep, &sim, &l, &acc, i % 2 == 0);
            g.launch(&l[3]).unwrap();
            g.launch(&l[4]).unwrap();
            if i % 3 == 0 {
                std::mem::forget(g);
            }
        }
        rep.launch_kept(&mut k2, &l[4]).unwrap();
        rep.consume(RunnerId(1), &l[0], |s, v| {
            sim.launch(s, sim::Kernel::add(&v[0], &acc), 4)
        })
        .unwrap();
    }
    std::mem::forget(k2);
    rep.replay(RunnerId(0), &l[2]).unwrap();
    rep.launch_kept(&mut k1, &l[3]).unwrap();
    rep.synchronize().unwrap();
    // 6 * (2 + 2 + 1) + 1 + 1 replays of runner 0 in all.
    assert_eq!(sim.read_f32(&counts[0]).unwrap()[0], 32.0);
    drop(rep);
    drop(k1);
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    drop((counts, one, acc));
    eprintln!(
        "after forgetting: live allocations {}, live events {}",
        sim.live_allocations(),
        sim.live_events()
    );
}

fn mk_step<'r>(
    rep: &'r mut Replayable<sim::Device>,
    sim: &sim::Device,
    l: &[sim::Stream],
    acc: &sim::HostBuffer,
    overlapping: bool,
) -> replay_arena::StepGraph<'r, sim::Device> {
    let mut st = rep.step();
    st.replay(RunnerId(0), &l[0]).unwrap();
    st.replay(RunnerId(1), &l[1]).unwrap();
    st.consume(RunnerId(1), &l[2], |s, v| {
        sim.launch(s, sim::Kernel::add(&v[0], acc), 4)
    })
    .unwrap();
    if overlapping {
        st.build_overlapping().unwrap()
    } else {
        st.build().unwrap()
    }
}

/// Traces started and finished between kept launches (same stream, no
/// absorb): no panic, no hazard, the trace reads.
#[test]
fn trace_around_kept_launches() {
    let mut w = replayed_world(3, 2, &[10]);
    let mut k1 = build_kept(&mut w, &[It::R(0, 0), It::R(1, 1), It::C(1, 2, 0)], true).unwrap();
    let mut k2 = build_kept(&mut w, &[It::R(2, 0), It::C(2, 1, 1)], false).unwrap();
    let (l3, l4) = (w.lanes[3].clone(), w.lanes[4].clone());
    w.rep.launch_kept(&mut k1, &l3).unwrap();
    w.rep.start_trace().unwrap();
    w.rep.launch_kept(&mut k1, &l3).unwrap();
    w.rep.launch_kept(&mut k1, &l3).unwrap();
    let t = w.rep.finish_trace().unwrap();
    let _ = format!("{t:?}");
    w.rep.launch_kept(&mut k1, &l3).unwrap();
    w.rep.start_trace().unwrap();
    w.rep.launch_kept(&mut k2, &l4).unwrap();
    w.rep.launch_kept(&mut k1, &l4).unwrap();
    run_item(&mut w, It::R(0, 1)).unwrap();
    w.rep.launch_kept(&mut k1, &l4).unwrap();
    w.rep.launch_kept(&mut k1, &l4).unwrap();
    let t = w.rep.finish_trace().unwrap();
    let _ = format!("{t:?}");
    w.rep.synchronize().unwrap();
    assert!(w.sim.hazards().is_empty());
}
