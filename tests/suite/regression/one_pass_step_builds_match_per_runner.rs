//! Step graphs whose schedules take one dry pass (they read only what they
//! wrote) or two, launched beside per-runner work, against the same work
//! replayed per runner: the same refusals, the same values, no hazard on
//! the plan's bytes and nothing left after teardown. Directed cases at the
//! edge of a self-contained schedule (a read before its write, a consumer
//! before its runner, a handoff written outside the step, staged inputs),
//! then seeded fuzz over plans, schedules, buckets, step copies and
//! overlapping step graphs.

use replay_arena::backend::Streams;
use replay_arena::sim;
use replay_arena::sim::AsSpan;

/// Hazards outside the program's accumulators (consumers add into them
/// unordered on purpose: adds commute, and they are not the crate's bytes).
pub fn crate_hazards(w: &W) -> Vec<sim::Hazard> {
    let ranges: Vec<(u64, u64)> = w
        .accs
        .iter()
        .map(|a| (a.span().addr(), a.span().addr() + 4 * a.span().len() as u64))
        .collect();
    w.sim
        .hazards()
        .into_iter()
        .filter(|h| !ranges.iter().any(|&(s, e)| h.addr >= s && h.addr < e))
        .collect()
}
use replay_arena::{
    DType, Discovering, Domain, HandoffId, PlanConfig, Policy, Replayable, Request, RunnerId,
};

const N: usize = 64;
const COPIES: usize = 6;
const REQ: Request = Request::new(Domain::Device, DType::F32, N as u64);

/// A handoff: writer, readers, ready point in the writer.
#[derive(Clone, Debug)]
pub struct H {
    pub writer: u32,
    pub readers: Vec<u32>,
    pub ready: bool,
}

#[derive(Clone, Debug)]
pub struct Spec {
    pub n: u32,
    pub policy: replay_arena::PlacedPolicy,
    pub handoffs: Vec<H>,
    pub durs: Vec<u64>,
    /// 0: no temporaries; 1: a temporary freed before the ready points;
    /// 2: a temporary across them, cut across.
    pub temps: u8,
    /// two declared buckets: runners below n/2 and the rest (no handoffs)
    pub buckets: bool,
}

impl Spec {
    /// `n` runners under `policy`, with `handoffs`, each runner's work
    /// taking the next of `durs` ticks; no temporaries, no buckets.
    pub fn new(n: u32, policy: Policy, handoffs: Vec<H>, durs: Vec<u64>) -> Spec {
        Spec {
            n,
            policy: policy.into(),
            handoffs,
            durs,
            temps: 0,
            buckets: false,
        }
    }
}

use crate::support::steps::kept;
/// The kept-step fuzzers' world: a plan on `sim`, its lanes, counts,
/// accumulators and a buffer of ones.
pub use crate::support::steps::kept::World as W;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum It {
    /// replay runner on lane
    R(u32, usize),
    /// consume runner on lane into acc
    C(u32, usize, usize),
    /// consume_mut runner on lane: scale views by 1 then add acc into? (writes view: add one)
    M(u32, usize),
    /// consume_many of two runners on lane into acc
    CM(u32, u32, usize, usize),
}

pub fn build_world(spec: &Spec) -> W {
    let mut d = Discovering::new(PlanConfig::new());
    let mut ids: Vec<Option<HandoffId>> = vec![None; spec.handoffs.len()];
    for r in 0..spec.n {
        if spec.buckets && (r == 0 || r == spec.n / 2) {
            d.bucket(format!("b{r}")).unwrap();
        }
        let mut armed = d.arm(RunnerId(r)).unwrap();
        armed.record(REQ).unwrap();
        for (k, h) in spec.handoffs.iter().enumerate() {
            if h.readers.contains(&r) {
                armed.receive(ids[k].unwrap()).unwrap();
            }
        }
        for (k, h) in spec.handoffs.iter().enumerate() {
            if h.writer == r {
                ids[k] = Some(armed.hand_off(REQ).unwrap());
            }
        }
    }
    let planned = d.plan(spec.policy).unwrap();
    crate::support::steps::kept::world_of(planned, spec.n, |capturing, sim, lanes, one, counts| {
        for r in 0..spec.n {
            let cap = capturing.capture(RunnerId(r)).unwrap();
            let v = cap.take(REQ).unwrap();
            let mut ins = Vec::new();
            for (k, h) in spec.handoffs.iter().enumerate() {
                if h.readers.contains(&r) {
                    ins.push(cap.receive(ids[k].unwrap()).unwrap());
                }
            }
            let mut outs = Vec::new();
            for (k, h) in spec.handoffs.iter().enumerate() {
                if h.writer == r {
                    outs.push((
                        ids[k].unwrap(),
                        h.ready,
                        cap.hand_off(ids[k].unwrap()).unwrap(),
                    ));
                }
            }
            let c = &counts[r as usize];
            let dur = spec.durs[r as usize % spec.durs.len()];
            let sim2 = sim.clone();
            let one2 = &one;
            let temps = spec.temps;
            let work = |st: &sim::Stream| {
                let t = if temps > 0 {
                    let t = sim2.alloc_async(st, N)?;
                    sim2.launch(st, sim::Kernel::copy(one2, &t), 1)?;
                    sim2.launch(st, sim::Kernel::add(&t, c), 1)?;
                    Some(t)
                } else {
                    sim2.launch(st, sim::Kernel::add(one2, c), 1)?;
                    None
                };
                if temps == 1 {
                    sim2.free_async(st, t.as_ref().unwrap())?;
                }
                sim2.launch(st, sim::Kernel::copy(c, &v), 1)?;
                for i in &ins {
                    sim2.launch(st, sim::Kernel::add(i, &v), dur)?;
                }
                for (h, ready, o) in &outs {
                    sim2.launch(st, sim::Kernel::copy(&v, o), dur)?;
                    if *ready {
                        cap.ready(*h, st)?;
                    }
                }
                // work after the ready points: touches only the runner's own bytes
                sim2.launch(st, sim::Kernel::scale(&v, 2.0), dur)?;
                if temps == 2 {
                    let t = t.unwrap();
                    sim2.launch(st, sim::Kernel::add(&t, &v), 1)?;
                    sim2.free_async(st, &t)?;
                }
                Ok::<(), replay_arena::Error>(())
            };
            if temps > 0 {
                cap.step_copies(COPIES);
                if temps == 2 {
                    cap.cut_across_temporaries();
                }
                cap.stream_capture_repeatable(&lanes[0], work).unwrap();
            } else {
                cap.stream_capture(&lanes[0], work).unwrap();
            }
            cap.finish().unwrap();
        }
    })
}

pub fn run_item(w: &mut W, it: It) -> Result<(), String> {
    let sim = w.sim.clone();
    match it {
        It::R(r, l) => kept::run_item(w, kept::It::R(r, l)),
        It::C(r, l, a) => kept::run_item(w, kept::It::C(r, l, a)),
        It::M(r, l) => {
            let one = &w._one;
            w.rep
                .consume_mut(RunnerId(r), &w.lanes[l], |st, v| {
                    sim.launch(st, sim::Kernel::add(one, &v[0]), 7)
                })
                .map_err(|e| format!("{e:?}"))
        }
        It::CM(r, q, l, a) => {
            let acc = &w.accs[a];
            w.rep
                .consume_many(&[RunnerId(r), RunnerId(q)], &w.lanes[l], |st, v| {
                    sim.launch(st, sim::Kernel::add(&v[0][0], acc), 3)?;
                    sim.launch(st, sim::Kernel::add(&v[1][0], acc), 3)
                })
                .map_err(|e| format!("{e:?}"))
        }
    }
}

/// Adds `items` to `step` (replays and consumers on the world's lanes,
/// into its accumulators); the first refused item's error.
fn schedule(
    step: &mut replay_arena::StepBuilder<'_, sim::Device>,
    sim: &sim::Device,
    (lanes, accs, one): (&[sim::Stream], &[sim::HostBuffer], &sim::HostBuffer),
    items: &[It],
) -> Result<(), String> {
    for &it in items {
        let r = match it {
            It::R(r, l) => step
                .replay(RunnerId(r), &lanes[l])
                .map(|_| ())
                .map_err(|e| format!("{e:?}")),
            It::C(r, l, a) => {
                let acc = &accs[a];
                step.consume(RunnerId(r), &lanes[l], |st, v| {
                    sim.launch(st, sim::Kernel::add(&v[0], acc), 7)
                })
                .map(|_| ())
                .map_err(|e| format!("{e:?}"))
            }
            It::M(r, l) => step
                .consume_mut(RunnerId(r), &lanes[l], |st, v| {
                    sim.launch(st, sim::Kernel::add(one, &v[0]), 7)
                })
                .map(|_| ())
                .map_err(|e| format!("{e:?}")),
            It::CM(r, q, l, a) => {
                let acc = &accs[a];
                step.consume_many(&[RunnerId(r), RunnerId(q)], &lanes[l], |st, v| {
                    sim.launch(st, sim::Kernel::add(&v[0][0], acc), 3)?;
                    sim.launch(st, sim::Kernel::add(&v[1][0], acc), 3)
                })
                .map(|_| ())
                .map_err(|e| format!("{e:?}"))
            }
        };
        r.map_err(|e| format!("at item {it:?}: {e}"))?;
    }
    Ok(())
}

pub fn build_step(
    w: &mut W,
    items: &[It],
    overlapping: bool,
) -> Result<replay_arena::KeptStep<sim::Device>, String> {
    let sim = w.sim.clone();
    let mut step = w.rep.step();
    schedule(&mut step, &sim, (&w.lanes, &w.accs, &w._one), items)?;
    let g = if overlapping {
        step.build_overlapping()
    } else {
        step.build()
    };
    g.map(|g| g.keep()).map_err(|e| format!("build: {e:?}"))
}

pub fn values(w: &W) -> Vec<Vec<f32>> {
    w.sim.synchronize().unwrap();
    let mut out = Vec::new();
    for c in &w.counts {
        out.push(w.sim.read_f32(c).unwrap());
    }
    for a in &w.accs {
        out.push(w.sim.read_f32(a).unwrap());
    }
    for r in 0..w.counts.len() as u32 {
        for v in w.rep.views(RunnerId(r)).unwrap().iter() {
            out.push(w.sim.read_f32(v).unwrap());
        }
    }
    out
}

/// Runs `pre` per runner in both worlds, builds `step` in world A and
/// launches it `launches` times (with `between` per runner between
/// launches), and replays the same items per runner in world B.
/// Returns a verdict string; panics on BROKE.
/// [`duel`] of the step `step` after `pre`, nothing between its three
/// launches, one graph; prints what happened under `name`.
fn show(name: String, spec: &Spec, pre: &[It], step: &[It]) {
    eprintln!("{name}: {}", duel(spec, pre, step, &[], 3, false));
}

pub fn duel(
    spec: &Spec,
    pre: &[It],
    step: &[It],
    between: &[It],
    launches: usize,
    overlapping: bool,
) -> String {
    let mut a = build_world(spec);
    let mut b = build_world(spec);
    for &it in pre {
        let ra = run_item(&mut a, it);
        let rb = run_item(&mut b, it);
        if ra.is_err() || rb.is_err() {
            return format!("pre refused: {ra:?}");
        }
    }
    let mut kept = match build_step(&mut a, step, overlapping) {
        Ok(k) => k,
        Err(e) => {
            // is the per-runner equivalent fine for `launches` rounds?
            let mut ok = true;
            'o: for l in 0..launches {
                for &it in step {
                    if run_item(&mut b, it).is_err() {
                        ok = false;
                        break 'o;
                    }
                }
                if l + 1 < launches {
                    for &it in between {
                        if run_item(&mut b, it).is_err() {
                            ok = false;
                            break 'o;
                        }
                    }
                }
            }
            return format!("build refused ({e}); per-runner ok for all launches: {ok}");
        }
    };
    let mut log = Vec::new();
    for l in 0..launches {
        let la = a.rep.launch_kept(&mut kept, &a.lanes[3]);
        let mut rb = Ok(());
        for &it in step {
            if let Err(e) = run_item(&mut b, it) {
                rb = Err(format!("{it:?}: {e}"));
                break;
            }
        }
        log.push(format!(
            "launch {l}: step {:?} per-runner {:?}",
            la.as_ref().map_err(|e| format!("{e:?}")),
            rb
        ));
        match (&la, &rb) {
            (Ok(()), Err(e)) => {
                panic!("BROKE: launch {l} went out but per-runner refuses: {e}; log {log:?}")
            }
            (Err(_), _) => return format!("launch {l} refused; {log:?}"),
            _ => {}
        }
        if l + 1 < launches {
            for &it in between {
                let ra = run_item(&mut a, it);
                let rb = run_item(&mut b, it);
                assert_eq!(
                    ra.is_ok(),
                    rb.is_ok(),
                    "between {it:?}: {ra:?} vs {rb:?}; {log:?}"
                );
                if ra.is_err() {
                    return format!("between refused {ra:?}");
                }
            }
        }
    }
    drop(kept);
    let va = values(&a);
    let vb = values(&b);
    let ha = crate_hazards(&a);
    assert!(
        ha.is_empty(),
        "BROKE: hazards in step world: {ha:?}; {log:?}"
    );
    assert!(crate_hazards(&b).is_empty(), "per-runner world hazards?");
    assert_eq!(va, vb, "BROKE: values differ; {log:?}");
    format!("held; {log:?}")
}

fn chain(policy: Policy, ready: bool) -> Spec {
    // r0 -> h0 -> r1 ; r1 -> h1 -> r2 ; r3 plain
    Spec::new(
        4,
        policy,
        vec![
            H {
                writer: 0,
                readers: vec![1],
                ready,
            },
            H {
                writer: 1,
                readers: vec![2],
                ready,
            },
        ],
        vec![3, 11, 5, 17],
    )
}

use It::*;

/// Reader before writer, then the reader again (runner replayed twice).
#[test]
fn a1_reader_writer_reader() {
    for g in 1..=3 {
        for ready in [false, true] {
            let spec = chain(Policy::Generations(g), ready);
            show(
                format!("a1 g={g} ready={ready}"),
                &spec,
                &[R(0, 0)],
                &[R(1, 1), R(0, 0), R(1, 1)],
            );
        }
    }
}

/// Consumer before the runner's replay, the runner's bytes taken later in the step.
#[test]
fn a2_consumer_before_replay_then_overwritten() {
    for g in 1..=2 {
        let spec = Spec::new(4, Policy::Generations(g), vec![], vec![3, 9]);
        show(
            format!("a2 g={g}"),
            &spec,
            &[R(0, 0)],
            &[C(0, 1, 0), R(0, 0), R(2, 0)],
        );
        show(
            format!("a2b g={g}"),
            &spec,
            &[R(0, 0)],
            &[C(0, 1, 0), R(0, 0), C(0, 2, 1), R(2, 1)],
        );
    }
}

/// consume_many: one runner replayed earlier in the step, the other not.
#[test]
fn a3_consume_many_half_replayed() {
    let spec = Spec::new(4, Policy::Generations(2), vec![], vec![3, 9]);
    let cases: [(&str, &[It], &[It]); 3] = [
        (
            "a3",
            &[R(1, 0)].as_slice(),
            &[R(0, 0), CM(0, 1, 2, 0), R(1, 1), R(3, 1)].as_slice(),
        ),
        (
            "a3b",
            &[R(1, 0)].as_slice(),
            &[R(0, 0), CM(1, 0, 2, 0), R(1, 1), R(3, 1)].as_slice(),
        ),
        (
            "a3c",
            &[R(1, 0)].as_slice(),
            &[R(0, 0), CM(0, 1, 2, 0), R(3, 1)].as_slice(),
        ),
    ];
    for (name, pre, step) in cases {
        show(name.to_string(), &spec, pre, step);
    }
}

/// A reader of two handoffs: one written in the step, the other only before it.
#[test]
fn a4_reader_of_two_handoffs_one_written_outside() {
    for ready in [false, true] {
        let spec = Spec::new(
            4,
            Policy::Generations(2),
            vec![
                H {
                    writer: 0,
                    readers: vec![2],
                    ready,
                },
                H {
                    writer: 1,
                    readers: vec![2],
                    ready,
                },
            ],
            vec![3, 9, 4],
        );
        show(
            format!("a4 ready={ready}"),
            &spec,
            &[R(0, 0), R(1, 1)],
            &[R(0, 0), R(2, 1)],
        );
        show(
            format!("a4b ready={ready}"),
            &spec,
            &[R(0, 0), R(1, 1)],
            &[R(1, 0), R(2, 1)],
        );
    }
}

/// Writer, another runner claiming the handoff's bytes, reader.
#[test]
fn a5_handoff_overwritten_between() {
    for g in 1..=3 {
        let spec = chain(Policy::Generations(g), true);
        for sched in [
            vec![R(0, 0), R(0, 1), R(1, 1)],
            vec![R(0, 0), R(3, 1), R(1, 1)],
            vec![R(0, 0), R(2, 1), R(1, 1)],
            vec![R(0, 0), R(1, 1), R(0, 2), R(1, 1)],
        ] {
            let v = duel(&spec, &[], &sched, &[], 3, false);
            eprintln!("a5 g={g} {sched:?}: {v}");
        }
    }
}

/// Multi-reader handoff where the step reads with only one reader.
#[test]
fn a6_multi_reader_partial() {
    let spec = Spec::new(
        4,
        Policy::Generations(2),
        vec![H {
            writer: 0,
            readers: vec![1, 2],
            ready: true,
        }],
        vec![3, 9, 4, 13],
    );
    for (pre, sched, between) in [
        (vec![], vec![R(0, 0), R(1, 1)], vec![R(2, 2)]),
        (vec![], vec![R(0, 0), R(1, 1), R(2, 2)], vec![]),
        (vec![R(0, 0)], vec![R(2, 2), R(0, 0), R(1, 1)], vec![]),
        (
            vec![R(0, 0), R(1, 1)],
            vec![R(2, 2), R(0, 0), R(1, 1)],
            vec![],
        ),
        (
            vec![],
            vec![R(0, 0), R(1, 1), C(0, 2, 0), R(2, 2), R(3, 0)],
            vec![R(2, 1)],
        ),
    ] {
        let v = duel(&spec, &pre, &sched, &between, 3, false);
        eprintln!("a6 {pre:?} {sched:?} {between:?}: {v}");
    }
}

#[derive(Clone, Debug)]
pub enum Op {
    I(It),
    L(usize, usize),
}

pub use crate::support::steps::kept::Lcg;

fn rand_spec(rng: &mut Lcg) -> Spec {
    let n = 3 + rng.below(3) as u32;
    let g = 1 + rng.below(3) as usize;
    let policy = if rng.below(2) == 0 {
        Policy::Generations(g).into()
    } else {
        Policy::Generations(g).packed()
    };
    let mut handoffs = Vec::new();
    let nh = rng.below(3);
    for _ in 0..nh {
        let w = rng.below(n as u64 - 1) as u32;
        let mut readers = Vec::new();
        for r in (w + 1)..n {
            if rng.below(2) == 0 {
                readers.push(r);
            }
        }
        if readers.is_empty() {
            readers.push(w + 1);
        }
        handoffs.push(H {
            writer: w,
            readers,
            ready: rng.below(2) == 0,
        });
    }
    let durs = (0..n).map(|_| 1 + rng.below(20)).collect();
    Spec {
        n,
        policy,
        handoffs,
        durs,
        temps: 0,
        buckets: false,
    }
}

fn rand_item(rng: &mut Lcg, n: u32) -> It {
    let r = rng.below(n as u64) as u32;
    let l = rng.below(3) as usize;
    match rng.below(10) {
        0..=4 => R(r, l),
        5..=6 => C(r, l, rng.below(8) as usize),
        7 => M(r, l),
        _ => {
            let q = rng.below(n as u64) as u32;
            if q == r {
                C(r, l, 1)
            } else {
                CM(r, q, l, rng.below(8) as usize)
            }
        }
    }
}

/// Self-contained-ish schedule: a prefix of replays in capture order then random items.
fn rand_sched(rng: &mut Lcg, n: u32) -> Vec<It> {
    let mut s = Vec::new();
    match rng.below(3) {
        0 => {
            for r in 0..n {
                if rng.below(4) != 0 {
                    s.push(R(r, rng.below(3) as usize));
                    if rng.below(3) == 0 {
                        s.push(rand_item(rng, n));
                    }
                }
            }
        }
        _ => {
            let len = 1 + rng.below(8);
            for _ in 0..len {
                s.push(rand_item(rng, n));
            }
        }
    }
    if s.is_empty() {
        s.push(R(0, 0));
    }
    s
}

pub fn program(
    spec: &Spec,
    pre: &[It],
    steps: &[(Vec<It>, bool)],
    ops: &[Op],
) -> (usize, usize, Vec<String>) {
    let mut a = build_world(spec);
    let mut b = build_world(spec);
    let mut log = Vec::new();
    for &it in pre {
        let ra = run_item(&mut a, it);
        let rb = run_item(&mut b, it);
        assert_eq!(ra.is_ok(), rb.is_ok());
    }
    let mut kept = Vec::new();
    let mut built = 0;
    for (s, ov) in steps {
        match build_step(&mut a, s, *ov) {
            Ok(k) => {
                built += 1;
                kept.push(Some(k))
            }
            Err(e) => {
                log.push(format!("step {s:?} refused {e}"));
                kept.push(None)
            }
        }
    }
    let mut launched = 0;
    for op in ops {
        match *op {
            Op::I(it) => {
                let ra = run_item(&mut a, it);
                let rb = run_item(&mut b, it);
                log.push(format!("{it:?}: {:?} / {:?}", ra.is_ok(), rb.is_ok()));
                assert_eq!(
                    ra.is_ok(),
                    rb.is_ok(),
                    "item {it:?} differs: {ra:?} vs {rb:?}; {log:?}"
                );
            }
            Op::L(k, lane) => {
                let Some(kp) = kept[k].as_mut() else { continue };
                let la = a.rep.launch_kept(kp, &a.lanes[lane]);
                // per-runner: does the whole step go through? run on a probe first: we cannot undo,
                // so run and record.
                let mut rb = Ok(());
                if la.is_ok() {
                    for &it in &steps[k].0 {
                        if let Err(e) = run_item(&mut b, it) {
                            rb = Err(format!("{it:?}: {e}"));
                            break;
                        }
                    }
                }
                log.push(format!(
                    "launch {k} on {lane}: {:?}; per-runner {rb:?}",
                    la.as_ref().map_err(|e| format!("{e:?}"))
                ));
                if la.is_ok() {
                    launched += 1;
                }
                if let Err(e) = rb {
                    panic!("BROKE: step launch went out, per-runner refuses {e}; spec {spec:?} pre {pre:?} steps {steps:?} ops {ops:?}\nlog {log:#?}");
                }
            }
        }
    }
    drop(kept);
    let va = values(&a);
    let vb = values(&b);
    let ha = crate_hazards(&a);
    assert!(ha.is_empty(), "BROKE: hazards {ha:?}; spec {spec:?} pre {pre:?} steps {steps:?} ops {ops:?}\nlog {log:#?}");
    assert!(
        crate_hazards(&b).is_empty(),
        "per-runner hazards {:?}",
        crate_hazards(&b)
    );
    assert!(va == vb, "BROKE: values differ\n{va:?}\n{vb:?}\nspec {spec:?} pre {pre:?} steps {steps:?} ops {ops:?}\nlog {log:#?}");
    torn_down(a, "step world");
    torn_down(b, "per-runner world");
    (built, launched, log)
}

/// `count` program items: where `launch(rng, i)` gives `(step, lane)`, a
/// launch of that step there, otherwise a random per-runner item.
fn rand_ops(
    rng: &mut Lcg,
    count: u64,
    n: u32,
    mut launch: impl FnMut(&mut Lcg, u64) -> Option<(usize, usize)>,
) -> Vec<Op> {
    (0..count)
        .map(|i| match launch(rng, i) {
            Some((step, lane)) => Op::L(step, lane),
            None => Op::I(rand_item(rng, n)),
        })
        .collect()
}

fn fuzz_one(seed: u64, nsteps: usize) -> (usize, usize) {
    let mut rng = Lcg(seed.wrapping_mul(0x9E3779B97F4A7C15) ^ 0xD1B54A32D192ED03);
    let spec = rand_spec(&mut rng);
    let n = spec.n;
    let pre: Vec<It> = (0..rng.below(6)).map(|_| rand_item(&mut rng, n)).collect();
    let steps: Vec<(Vec<It>, bool)> = (0..nsteps)
        .map(|_| (rand_sched(&mut rng, n), rng.below(5) == 0))
        .collect();
    let count = 2 + rng.below(10);
    let ops = rand_ops(&mut rng, count, n, |rng, _| {
        (rng.below(2) == 0).then(|| (rng.below(nsteps as u64) as usize, rng.below(4) as usize))
    });
    let (b, l, _) = program(&spec, &pre, &steps, &ops);
    (b, l)
}

/// Runs `case` for every seed of `seeds` and prints how many step graphs
/// it built and launched (each case asserts on its own).
fn fuzz(name: &str, seeds: std::ops::Range<u64>, case: impl Fn(u64) -> (usize, usize)) {
    let (built, launched) = seeds
        .map(case)
        .fold((0, 0), |(b, l), (x, y)| (b + x, l + y));
    eprintln!("{name}: built {built}, launched {launched}");
}

#[test]
fn a7_fuzz_one_step() {
    fuzz("a7", 0..6000, |seed| fuzz_one(seed, 1));
}

#[test]
fn a8_fuzz_two_steps() {
    fuzz("a8", 100_000..104_000, |seed| fuzz_one(seed, 2));
}

mod inputs {
    use super::*;
    use replay_arena::Purpose;

    fn input() -> Request {
        Request::new(Domain::Device, DType::F32, N as u64).purpose(Purpose::Input)
    }

    /// Per-runner: stage, replay input runner `a`, replay `b` (same bytes, G = 1),
    /// twice without staging: the second replay of `a` is InputNotStaged.
    /// The step [R(a), R(b)] must not launch twice without a staging.
    fn check(
        rep: &mut Replayable<sim::Device>,
        sim: &sim::Device,
        s: &[sim::Stream],
        a: u32,
        b: u32,
        what: &str,
    ) {
        let one = sim.alloc_f32(N).unwrap();
        rep.consume_mut(RunnerId(a), &s[0], |st, v| {
            sim.launch(st, sim::Kernel::fill(&v[0], 5.0), 1)
        })
        .unwrap();
        let mut step = rep.step();
        step.replay(RunnerId(a), &s[1]).unwrap();
        step.replay(RunnerId(b), &s[2]).unwrap();
        step.consume(RunnerId(b), &s[2], |st, v| {
            sim.launch(st, sim::Kernel::add(&v[0], &one), 1)
        })
        .unwrap();
        match step.build() {
            Err(e) => eprintln!("{what}: build refused {e:?}"),
            Ok(mut g) => {
                let l1 = g.launch(&s[3]);
                let l2 = g.launch(&s[3]);
                eprintln!("{what}: launches {l1:?} {l2:?}");
                assert!(
                    l2.is_err(),
                    "BROKE {what}: second launch without staging went out"
                );
            }
        }
        rep.synchronize().unwrap();
        assert!(sim.hazards().is_empty(), "{what}: {:?}", sim.hazards());
    }

    #[test]
    fn a9_declared_input_runner() {
        let mut d = Discovering::new(PlanConfig::new());
        d.bucket("b0").unwrap();
        d.arm(RunnerId(0)).unwrap().record(input()).unwrap();
        d.arm(RunnerId(1)).unwrap().record(REQ).unwrap();
        let sim = sim::Device::new();
        let s: Vec<_> = (0..4).map(|_| sim.new_stream()).collect();
        let mut capturing = d
            .plan(Policy::Generations(1))
            .unwrap()
            .allocate(sim.clone())
            .unwrap();
        for (r, q) in [(0u32, input()), (1, REQ)] {
            let cap = capturing.capture(RunnerId(r)).unwrap();
            let v = cap.take(q).unwrap();
            cap.stream_capture(&s[0], |st| sim.launch(st, sim::Kernel::scale(&v, 2.0), 3))
                .unwrap();
            cap.finish().unwrap();
        }
        let mut rep = capturing.seal().unwrap();
        check(&mut rep, &sim, &s, 0, 1, "declared");
    }

    #[test]
    fn a10_joined_bucket_input_runner() {
        let mut d = Discovering::new(PlanConfig::new());
        d.bucket("b0").unwrap();
        d.arm(RunnerId(0)).unwrap().record(REQ).unwrap();
        d.arm(RunnerId(1)).unwrap().record(REQ).unwrap();
        let sim = sim::Device::new();
        let s: Vec<_> = (0..4).map(|_| sim.new_stream()).collect();
        let mut capturing = d
            .plan(Policy::Generations(1))
            .unwrap()
            .allocate(sim.clone())
            .unwrap();
        for r in 0..2u32 {
            let cap = capturing.capture(RunnerId(r)).unwrap();
            let v = cap.take(REQ).unwrap();
            cap.stream_capture(&s[0], |st| sim.launch(st, sim::Kernel::scale(&v, 2.0), 3))
                .unwrap();
            cap.finish().unwrap();
        }
        let mut rep = capturing.seal().unwrap();
        {
            let mut join = rep.discover_bucket("joined").unwrap();
            join.arm(RunnerId(10)).unwrap().record(input()).unwrap();
            join.arm(RunnerId(11)).unwrap().record(REQ).unwrap();
            let mut capture = join.fit().unwrap();
            for (r, q) in [(10u32, input()), (11, REQ)] {
                let cap = capture.capture(RunnerId(r)).unwrap();
                let v = cap.take(q).unwrap();
                cap.stream_capture(&s[0], |st| sim.launch(st, sim::Kernel::scale(&v, 2.0), 3))
                    .unwrap();
                cap.finish().unwrap();
            }
            capture.seal().map_err(|_| "seal").unwrap();
        }
        check(&mut rep, &sim, &s, 10, 11, "joined");
        // and per runner the same is refused:
        rep.consume_mut(RunnerId(10), &s[0], |st, v| {
            sim.launch(st, sim::Kernel::fill(&v[0], 5.0), 1)
        })
        .unwrap();
        rep.replay(RunnerId(10), &s[1]).unwrap();
        rep.replay(RunnerId(11), &s[1]).unwrap();
        let e = rep.replay(RunnerId(10), &s[1]);
        eprintln!("per-runner second replay: {e:?}");
        assert!(e.is_err());
    }
}

fn fuzz_overlapping(seed: u64) -> (usize, usize) {
    let mut rng = Lcg(seed.wrapping_mul(0x9E3779B97F4A7C15) ^ 0x1234567);
    let spec = rand_spec(&mut rng);
    let n = spec.n;
    let pre: Vec<It> = (0..rng.below(6)).map(|_| rand_item(&mut rng, n)).collect();
    let steps: Vec<(Vec<It>, bool)> = (0..1 + rng.below(2))
        .map(|_| (rand_sched(&mut rng, n), rng.below(3) != 0))
        .collect();
    let (count, nsteps) = (2 + rng.below(12), steps.len() as u64);
    let ops = rand_ops(&mut rng, count, n, |rng, i| {
        (rng.below(4) != 0).then(|| {
            let step = rng.below(nsteps) as usize;
            (step, if rng.below(2) == 0 { i as usize % 2 } else { 3 })
        })
    });
    let (b, l, _) = program(&spec, &pre, &steps, &ops);
    (b, l)
}

#[test]
fn a11_fuzz_overlapping() {
    fuzz("a11", 0..4000, fuzz_overlapping);
}

/// Borrowed StepGraph (not kept): build after `pre`, launch k times on random lanes,
/// drop, then per-runner items after; against per-runner.
fn fuzz_borrowed(seed: u64) -> usize {
    let mut rng = Lcg(seed.wrapping_mul(0x9E3779B97F4A7C15) ^ 0xabcdef);
    let spec = rand_spec(&mut rng);
    let n = spec.n;
    let pre: Vec<It> = (0..rng.below(6)).map(|_| rand_item(&mut rng, n)).collect();
    let sched = rand_sched(&mut rng, n);
    let overlapping = rng.below(3) == 0;
    let k = 1 + rng.below(4) as usize;
    let lanes: Vec<usize> = (0..k).map(|_| rng.below(4) as usize).collect();
    let post: Vec<It> = (0..rng.below(6)).map(|_| rand_item(&mut rng, n)).collect();
    let mut a = build_world(&spec);
    let mut b = build_world(&spec);
    for &it in &pre {
        assert_eq!(run_item(&mut a, it).is_ok(), run_item(&mut b, it).is_ok());
    }
    let sim = a.sim.clone();
    let mut launched = 0;
    {
        let mut step = a.rep.step();
        let ok = schedule(&mut step, &sim, (&a.lanes, &a.accs, &a._one), &sched).is_ok();
        if ok {
            let g = if overlapping {
                step.build_overlapping()
            } else {
                step.build()
            };
            if let Ok(mut g) = g {
                for &l in &lanes {
                    let la = g.launch(&a.lanes[l]);
                    if la.is_err() {
                        break;
                    }
                    launched += 1;
                    for &it in &sched {
                        if let Err(e) = run_item(&mut b, it) {
                            panic!("BROKE borrowed: seed {seed} launch went out, per-runner {it:?}: {e}; spec {spec:?} pre {pre:?} sched {sched:?} lanes {lanes:?}");
                        }
                    }
                }
            }
        }
    }
    for &it in &post {
        let ra = run_item(&mut a, it);
        let rb = run_item(&mut b, it);
        assert_eq!(
            ra.is_ok(),
            rb.is_ok(),
            "seed {seed} post {it:?}: {ra:?} {rb:?}"
        );
    }
    let va = values(&a);
    let vb = values(&b);
    let ha = crate_hazards(&a);
    assert!(ha.is_empty(), "BROKE borrowed seed {seed}: hazards {ha:?}; spec {spec:?} pre {pre:?} sched {sched:?} ov {overlapping} lanes {lanes:?} post {post:?}");
    assert!(crate_hazards(&b).is_empty());
    assert!(va == vb, "BROKE borrowed seed {seed}: values; spec {spec:?} pre {pre:?} sched {sched:?} ov {overlapping} lanes {lanes:?} post {post:?}\n{va:?}\n{vb:?}");
    launched
}

#[test]
fn a12_fuzz_borrowed() {
    let mut l = 0;
    for seed in 0..6000 {
        l += fuzz_borrowed(seed);
    }
    eprintln!("a12: launched {l}");
}

#[test]
fn a13_fuzz_step_copies() {
    fuzz("a13", 0..1200, |seed| {
        let mut rng = Lcg(seed.wrapping_mul(0x9E3779B97F4A7C15) ^ 0x5555);
        let mut spec = rand_spec(&mut rng);
        spec.temps = 1 + rng.below(2) as u8;
        let n = spec.n;
        let pre: Vec<It> = (0..rng.below(6)).map(|_| rand_item(&mut rng, n)).collect();
        let steps: Vec<(Vec<It>, bool)> = vec![(rand_sched(&mut rng, n), rng.below(4) == 0)];
        let count = 2 + rng.below(8);
        let ops = rand_ops(&mut rng, count, n, |rng, _| {
            (rng.below(2) == 0).then(|| (0, rng.below(4) as usize))
        });
        let (built, launched, _) = program(&spec, &pre, &steps, &ops);
        (built, launched)
    });
}

pub fn torn_down(w: W, what: &str) {
    let sim = w.sim.clone();
    drop(w);
    crate::support::steps::assert_nothing_left(&sim, &format!("LEAK {what}"));
}

#[test]
fn a14_fuzz_buckets() {
    fuzz("a14", 0..2000, |seed| {
        let mut rng = Lcg(seed.wrapping_mul(0x9E3779B97F4A7C15) ^ 0x7777);
        let mut spec = rand_spec(&mut rng);
        spec.n = 4 + rng.below(3) as u32;
        spec.durs = (0..spec.n).map(|_| 1 + rng.below(20)).collect();
        spec.handoffs.clear();
        spec.buckets = true;
        if rng.below(3) == 0 {
            spec.temps = 1;
        }
        let n = spec.n;
        let pre: Vec<It> = (0..rng.below(6)).map(|_| rand_item(&mut rng, n)).collect();
        // a step per bucket, in bucket order
        let h = n / 2;
        let mk = |rng: &mut Lcg, lo: u32, hi: u32| {
            let mut s = Vec::new();
            for r in lo..hi {
                if rng.below(5) != 0 {
                    s.push(R(r, rng.below(3) as usize));
                    if rng.below(2) == 0 {
                        s.push(C(r, rng.below(3) as usize, rng.below(8) as usize));
                    }
                    if rng.below(6) == 0 {
                        s.push(M(r, rng.below(3) as usize));
                    }
                }
            }
            if rng.below(4) == 0 {
                let r = lo + rng.below((hi - lo) as u64) as u32;
                s.push(R(r, rng.below(3) as usize));
                s.push(C(r, rng.below(3) as usize, rng.below(8) as usize));
            }
            if s.is_empty() {
                s.push(R(lo, 0));
            }
            s
        };
        let steps = vec![
            (mk(&mut rng, 0, h), rng.below(5) == 0),
            (mk(&mut rng, h, n), rng.below(5) == 0),
        ];
        let count = 2 + rng.below(12);
        let ops = rand_ops(&mut rng, count, n, |rng, _| {
            (rng.below(3) != 0).then(|| (rng.below(2) as usize, rng.below(4) as usize))
        });
        let (built, launched, _) = program(&spec, &pre, &steps, &ops);
        (built, launched)
    });
}

#[test]
fn a0_first_hazard_was_on_an_accumulator() {
    let spec = Spec::new(3, Policy::Generations(3), vec![], vec![16, 8, 6]);
    let mut a = build_world(&spec);
    for it in [R(1, 2), R(2, 1)] {
        run_item(&mut a, it).unwrap();
    }
    let mut k = build_step(
        &mut a,
        &[R(0, 2), C(1, 2, 4), R(2, 0), CM(2, 0, 0, 4)],
        false,
    )
    .unwrap();
    for it in [R(0, 0), R(1, 2), R(2, 1)] {
        run_item(&mut a, it).unwrap();
    }
    a.rep.launch_kept(&mut k, &a.lanes[0]).unwrap();
    drop(k);
    a.sim.synchronize().unwrap();
    let acc4 = a.accs[4].span();
    eprintln!(
        "all {:?}; acc4 at {:#x}; crate's {:?}",
        a.sim.hazards(),
        acc4.addr(),
        crate_hazards(&a)
    );
}
