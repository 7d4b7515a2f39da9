//! Attacks that found nothing: kept steps over chains of handoffs (with or
//! without ready points), interleaved with per-runner replays, against the
//! same sequence per runner.

use crate::support::attacks::{
    fuzz_kept_launches, kept_or_items, kept_schedules, random_item, Fuzzing, KeptLaunches,
};
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

fn hfuzz(seed: u64, launches: &mut KeptLaunches) {
    use It::*;
    let mut rng = Lcg(seed ^ 0xD1B54A32D192ED03);
    let mut next = |m: u64| rng.below(m);
    let (g, ready, dur) = (1 + next(3) as usize, next(2) == 0, 1 + next(30));
    let mut a = hworld(g, ready, dur);
    let mut b = hworld(g, ready, dur);
    let scheds = vec![
        (
            vec![R(0, 0), R(1, 1), C(0, 2, 0), R(2, 0), C(1, 1, 1)],
            false,
        ),
        (vec![R(0, 1), R(1, 0), C(1, 2, 2)], true),
        (vec![R(0, 2)], false),
        (vec![R(1, 2), C(1, 0, 3)], false),
        (vec![R(2, 1), C(2, 0, 4)], next(2) == 0),
    ];
    let mut kept = kept_schedules(&mut a, scheds);
    let items = (run_item, |next: &mut dyn FnMut(u64) -> u64| {
        random_item(next, 3)
    });
    let mut fuzzing = Fuzzing::new(seed, &mut next, launches);
    kept_or_items(&mut fuzzing, (&mut a, &mut b), &mut kept, items);
    let log = fuzzing.log;
    assert_same_worlds(&a, &b, seed, &log);
}

#[test]
fn fuzz_handoffs_kept() {
    fuzz_kept_launches("handoff kept launches", 300, hfuzz);
}
