//! Attacks that found nothing: a kept step per shape bucket (staging its
//! input inside the schedule, or not), interleaved with per-runner
//! staging, replays and consumers, against the same sequence per runner.

use crate::support::attacks::{
    bucket_discovery, capture_doubling, fuzz_kept_launches, kept_or_items, FuzzWorld, Fuzzing,
    KeptLaunches,
};
use crate::support::steps::kept::Lcg;
use replay_arena::backend::Streams;
use replay_arena::sim;
use replay_arena::sim::AsSpan;
use replay_arena::{Policy, Replayable, RunnerId};

/// One item of a bucket world's schedule, on lane `.1`: `S` stages the
/// runner's input (`consume_mut`), `R` replays it, `C` consumes it.
#[derive(Clone, Copy, Debug)]
enum Bi {
    S(u32, usize),
    R(u32, usize),
    C(u32, usize),
}

struct Bw {
    sim: sim::Device,
    rep: Replayable<sim::Device>,
    lanes: Vec<sim::Stream>,
    sinks: Vec<sim::HostBuffer>,
    one: sim::HostBuffer,
}

const BATCH: [u64; 2] = [16, 64];

/// Two buckets (16 and 64 elements) of two runners each, at `g`
/// generations: each runner's graph doubles its input (a copy of `dur`
/// ticks).
fn bworld(g: usize, dur: u64) -> Bw {
    let planned = bucket_discovery(&BATCH, 2)
        .plan(Policy::Generations(g))
        .unwrap();
    let sim = sim::Device::new();
    let lanes: Vec<sim::Stream> = (0..5).map(|_| sim.new_stream()).collect();
    let one = sim.alloc_f32(64).unwrap();
    sim.write_f32(&one, &[1.0; 64]).unwrap();
    let mut capturing = planned.allocate(sim.clone()).unwrap();
    for r in 0..4u32 {
        let n = BATCH[r as usize / 2];
        let cap = capturing.capture(RunnerId(r)).unwrap();
        capture_doubling(cap, &sim, &lanes[0], n, (dur, 1));
    }
    let sinks = (0..12).map(|_| sim.alloc_f32(64).unwrap()).collect();
    Bw {
        rep: capturing.seal().unwrap(),
        sim,
        lanes,
        sinks,
        one,
    }
}

/// `$on.consume_mut` (a plan or a step) of runner `$r` on `$lane`: ones
/// added into the first 16 elements of its input.
macro_rules! stage {
    ($on:expr, $sim:expr, $one:expr, $r:expr, $lane:expr) => {
        $on.consume_mut(RunnerId($r), $lane, |st, v| {
            let input = v[0].slice(0..16).unwrap();
            $sim.launch(st, sim::Kernel::add(&first_16($one), &input), 2)
        })
    };
}

/// `$on.consume` (a plan or a step) of runner `$r` on `$lane`: the first
/// 16 elements of its output added into `$sink`.
macro_rules! consume {
    ($on:expr, $sim:expr, $sink:expr, $r:expr, $lane:expr) => {
        $on.consume(RunnerId($r), $lane, |st, v| {
            let output = v[1].slice(0..16).unwrap();
            $sim.launch(st, sim::Kernel::add(&output, &first_16($sink)), 3)
        })
    };
}

impl FuzzWorld for Bw {
    fn plan_and_lanes(&mut self) -> (&mut Replayable<sim::Device>, &[sim::Stream]) {
        (&mut self.rep, &self.lanes)
    }
}

fn brun(w: &mut Bw, it: Bi) -> Result<(), String> {
    let (sim, one) = (w.sim.clone(), &w.one);
    match it {
        Bi::S(r, l) => stage!(w.rep, sim, one, r, &w.lanes[l]).map_err(|e| format!("{e:?}")),
        Bi::R(r, l) => w
            .rep
            .replay(RunnerId(r), &w.lanes[l])
            .map_err(|e| format!("{e:?}")),
        Bi::C(r, l) => {
            let sink = &w.sinks[r as usize * 3 + l];
            consume!(w.rep, sim, sink, r, &w.lanes[l]).map_err(|e| format!("{e:?}"))
        }
    }
}

/// The first 16 elements of `b`.
fn first_16(b: &sim::HostBuffer) -> sim::Span {
    sim::Span::new(b.span().addr(), 16)
}

fn bbuild(w: &mut Bw, items: &[Bi]) -> Option<replay_arena::KeptStep<sim::Device>> {
    let (sim, one) = (w.sim.clone(), &w.one);
    let mut step = w.rep.step();
    for &it in items {
        let ok = match it {
            Bi::S(r, l) => stage!(step, sim, one, r, &w.lanes[l]).is_ok(),
            Bi::R(r, l) => step.replay(RunnerId(r), &w.lanes[l]).is_ok(),
            Bi::C(r, l) => {
                let sink = &w.sinks[6 + r as usize % 2 * 3 + l];
                let _ = sink;
                let sink = &w.sinks[r as usize * 3 + l];
                consume!(step, sim, sink, r, &w.lanes[l]).is_ok()
            }
        };
        if !ok {
            return None;
        }
    }
    step.build().ok().map(|g| g.keep())
}

fn bfuzz(seed: u64, launches: &mut KeptLaunches) {
    use Bi::*;
    let mut rng = Lcg(seed ^ 0x9E3779B97F4A7C15);
    let mut next = |m: u64| rng.below(m);
    let g = 1 + next(2) as usize;
    let dur = 1 + next(40);
    let mut a = bworld(g, dur);
    let mut b = bworld(g, dur);
    // Stage and replay every runner once, in both.
    for r in 0..4 {
        for it in [S(r, 2), R(r, 0)] {
            let (x, y) = (brun(&mut a, it), brun(&mut b, it));
            assert_eq!(x.is_ok(), y.is_ok());
        }
    }
    let scheds: Vec<Vec<Bi>> = vec![
        vec![S(0, 2), R(0, 0), C(0, 1), S(1, 2), R(1, 1), C(1, 0)],
        vec![S(2, 2), R(2, 0), S(3, 1), R(3, 1), C(2, 2), C(3, 0)],
        vec![R(0, 1), C(0, 2)],
        vec![R(3, 0), C(3, 1)],
        vec![C(1, 1)],
    ];
    let mut kept = Vec::new();
    for s in scheds {
        if let Some(k) = bbuild(&mut a, &s) {
            kept.push((k, s));
        }
    }
    let items = (brun, |next: &mut dyn FnMut(u64) -> u64| {
        let r = next(4) as u32;
        let l = next(3) as usize;
        match next(3) {
            0 => S(r, l),
            1 => R(r, l),
            _ => C(r, l),
        }
    });
    // Where a kept launch was refused, the per-runner sequence must fail
    // somewhere too; only recorded.
    let mut fuzzing = Fuzzing::new(seed, &mut next, launches);
    kept_or_items(&mut fuzzing, (&mut a, &mut b), &mut kept, items);
    let log = fuzzing.log;
    a.sim.synchronize().unwrap();
    b.sim.synchronize().unwrap();
    assert!(
        a.sim.hazards().is_empty(),
        "seed {seed}: {:?}; {log:?}",
        a.sim.hazards()
    );
    assert!(b.sim.hazards().is_empty());
    for (i, (x, y)) in a.sinks.iter().zip(&b.sinks).enumerate() {
        assert_eq!(
            a.sim.read_f32(x).unwrap(),
            b.sim.read_f32(y).unwrap(),
            "seed {seed} sink {i}; {log:?}"
        );
    }
    let sim = a.sim.clone();
    let Bw {
        rep,
        lanes,
        sinks,
        one,
        ..
    } = a;
    drop(rep);
    drop(kept);
    drop((lanes, sinks, one));
    assert!(sim.hazards().is_empty());
    assert_eq!(sim.live_allocations(), 0, "seed {seed}");
    assert_eq!(sim.live_events(), 0, "seed {seed}");
}

#[test]
fn fuzz_buckets_kept() {
    fuzz_kept_launches("kept launches", 300, bfuzz);
}
