//! Attacks that found nothing: kept steps over chains of handoffs (with or
//! without ready points), interleaved with per-runner replays, against the
//! same sequence per runner.

use crate::support::record_and_finish;
use crate::support::steps::kept::*;
use replay_arena::sim;
use replay_arena::{Discovering, PlanConfig, Policy, RunnerId};

fn hworld(g: usize, ready: bool, dur: u64) -> World {
    let mut d = Discovering::new(PlanConfig::new());
    let mut h = None;
    for r in 0..3u32 {
        let mut armed = d.arm(RunnerId(r)).unwrap();
        armed.record(REQ).unwrap();
        if r == 1 {
            armed.receive(h.unwrap()).unwrap();
        }
        if r == 0 {
            h = Some(armed.hand_off(REQ).unwrap());
        }
    }
    let h = h.unwrap();
    let planned = d.plan(Policy::Generations(g)).unwrap();
    world_of(planned, 3, |capturing, sim, lanes, one, counts| {
        for r in 0..3u32 {
            let cap = capturing.capture(RunnerId(r)).unwrap();
            let v = cap.take(REQ).unwrap();
            let input = (r == 1).then(|| cap.receive(h).unwrap());
            let output = (r == 0).then(|| cap.hand_off(h).unwrap());
            let c = &counts[r as usize];
            record_and_finish!(cap, &lanes[0], |st| {
                sim.launch(st, sim::Kernel::add(one, c), 1)?;
                if let Some(o) = &output {
                    sim.launch(st, sim::Kernel::copy(c, o), 2)?;
                    if ready {
                        cap.ready(h, st)?;
                    }
                }
                if let Some(i) = &input {
                    sim.launch(st, sim::Kernel::add(i, c), dur)?;
                }
                sim.launch(st, sim::Kernel::copy(c, &v), dur)?;
                Ok::<(), replay_arena::Error>(())
            });
        }
    })
}

fn hfuzz(seed: u64) {
    let mut rng = Lcg(seed ^ 0xD1B54A32D192ED03);
    let mut next = |m: u64| rng.below(m);
    let (g, ready, dur) = (1 + next(3) as usize, next(2) == 0, 1 + next(30));
    let mut a = hworld(g, ready, dur);
    let mut b = hworld(g, ready, dur);
    let scheds = vec![
        (
            vec![
                It::R(0, 0),
                It::R(1, 1),
                It::C(0, 2, 0),
                It::R(2, 0),
                It::C(1, 1, 1),
            ],
            false,
        ),
        (vec![It::R(0, 1), It::R(1, 0), It::C(1, 2, 2)], true),
        (vec![It::R(0, 2)], false),
        (vec![It::R(1, 2), It::C(1, 0, 3)], false),
        (vec![It::R(2, 1), It::C(2, 0, 4)], next(2) == 0),
    ];
    let (scheds, mut kept): (Vec<_>, Vec<_>) = scheds
        .into_iter()
        .filter_map(|(s, o)| build_kept(&mut a, &s, o).map(|k| ((s, o), k)))
        .unzip();
    let mut log = Vec::new();
    for _ in 0..40 {
        if next(2) == 0 && !kept.is_empty() {
            let k = next(kept.len() as u64) as usize;
            let l = 3 + next(2) as usize;
            let launch = a.lanes[l].clone();
            let got = a.rep.launch_kept(&mut kept[k], &launch);
            log.push(format!("K{k}@{l}:{got:?}"));
            HOK.fetch_add(got.is_ok() as usize, std::sync::atomic::Ordering::Relaxed);
            HALL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if got.is_ok() {
                for &it in &scheds[k].0 {
                    if let Err(e) = run_item(&mut b, it) {
                        panic!("seed {seed}: kept ok, per-runner {it:?}: {e}; {log:?}");
                    }
                }
            }
        } else {
            let r = next(3) as u32;
            let l = next(3) as usize;
            let it = if next(2) == 0 {
                It::R(r, l)
            } else {
                It::C(r, l, 7 + 3 * r as usize + l)
            };
            let (x, y) = (run_item(&mut a, it), run_item(&mut b, it));
            log.push(format!("{it:?}:{x:?}"));
            assert_eq!(
                x.is_ok(),
                y.is_ok(),
                "seed {seed}: {it:?} {x:?} vs {y:?}; {log:?}"
            );
        }
    }
    assert_same_worlds(&a, &b, seed, &log);
}

static HOK: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

static HALL: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

#[test]
fn fuzz_handoffs_kept() {
    for seed in 0..300 {
        hfuzz(seed);
    }
    let (ok, all) = (
        HOK.load(std::sync::atomic::Ordering::Relaxed),
        HALL.load(std::sync::atomic::Ordering::Relaxed),
    );
    eprintln!("handoff kept launches ok {ok} of {all}");
    assert!(ok * 4 > all, "{ok} of {all}");
}
