//! Random plans with handoffs (random sizes, dtypes, readers, ready
//! points, runners with and without bytes of their own) under random
//! schedules of replays, consumers that succeed, fail or panic, waits, and
//! step graphs (in capture order, rotated, subsampled, or random), on
//! random streams: no hazard, every reader's sum and every consumer's sum
//! exact, no leak, no panic in the library. Written by a hostile review
//! (it found the shared-handoff hole a step graph's first launch had).
//! `HANDOFF_FUZZ_SEEDS=20000 cargo test --release --test suite fence::handoff_props` runs
//! more seeds.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

use replay_arena::sim;
use replay_arena::*;

type R<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

pub fn req(n: u64) -> Request {
    Request::new(Domain::Device, DType::F32, n)
}

/// Tiny xorshift RNG.
pub struct Rng(pub u64);
impl Rng {
    pub fn step(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.step() % n as u64) as usize
    }
    pub fn chance(&mut self, p: u32) -> bool {
        self.below(100) < p as usize
    }
}

#[derive(Clone, Debug)]
pub struct HSpec {
    pub req: Request,
}

#[derive(Clone, Debug, Default)]
pub struct RSpec {
    pub own: Option<Request>,
    pub writes: Vec<usize>,
    pub reads: Vec<usize>,
    /// Handoffs marked ready, in the order `ready` is called; `interleave`:
    /// each ready right after that handoff's fill.
    pub ready: Vec<usize>,
    pub interleave: bool,
}

#[derive(Clone, Debug)]
pub struct Spec {
    pub runners: Vec<RSpec>,
    pub handoffs: Vec<HSpec>,
    pub policy: PlacedPolicy,
}

pub fn hval(h: usize) -> f32 {
    100.0 + h as f32
}
pub fn oval(r: usize) -> f32 {
    1000.0 + r as f32
}

pub struct Built {
    pub rp: Replayable<sim::Device>,
    /// out[r][k]: reader r's copy of its k-th read handoff.
    pub out: Vec<Vec<sim::HostBuffer>>,
}

pub fn elems(r: &Request) -> usize {
    (r.elements * r.dtype.size_bytes() / 4) as usize
}

/// Builds and captures the plan. Writers fill each handoff with hval(h),
/// readers add each received handoff into a program buffer, own bytes get
/// oval(r).
pub fn build(sim: &sim::Device, spec: &Spec, cs: &sim::Stream) -> R<Built> {
    let mut d = Discovering::new(PlanConfig::new());
    let mut hids: Vec<Option<HandoffId>> = vec![None; spec.handoffs.len()];
    for (i, r) in spec.runners.iter().enumerate() {
        let mut a = d.arm(RunnerId(i as u32))?;
        for &h in &r.reads {
            a.receive(hids[h].expect("reader before writer in spec"))?;
        }
        if let Some(o) = r.own {
            a.record(o)?;
        }
        for &h in &r.writes {
            hids[h] = Some(a.hand_off(spec.handoffs[h].req)?);
        }
    }
    let hids: Vec<HandoffId> = hids.into_iter().map(|h| h.unwrap()).collect();
    let planned = d.plan(spec.policy)?;
    let mut out = Vec::new();
    for r in &spec.runners {
        let mut v = Vec::new();
        for &h in &r.reads {
            v.push(sim.alloc_f32(elems(&spec.handoffs[h].req))?);
        }
        out.push(v);
    }
    let mut cap = planned.allocate(sim.clone())?;
    for (i, r) in spec.runners.iter().enumerate() {
        if r.own.is_none() && r.writes.is_empty() && r.reads.is_empty() {
            continue;
        }
        let c = cap.capture(RunnerId(i as u32))?;
        let rv: Vec<_> = r
            .reads
            .iter()
            .map(|&h| c.receive(hids[h]))
            .collect::<Result<_, _>>()?;
        let own = match r.own {
            Some(o) => Some(c.take(o)?),
            None => None,
        };
        let wv: Vec<_> = r
            .writes
            .iter()
            .map(|&h| c.hand_off(hids[h]))
            .collect::<Result<_, _>>()?;
        let outs = &out[i];
        c.stream_capture(cs, |s| {
            for (k, v) in rv.iter().enumerate() {
                sim.launch(s, sim::Kernel::add(v, &outs[k]), 7)?;
            }
            for (k, v) in wv.iter().enumerate() {
                sim.launch(s, sim::Kernel::fill(v, hval(r.writes[k])), 20)?;
                if r.interleave && r.ready.contains(&r.writes[k]) {
                    c.ready(hids[r.writes[k]], s)?;
                }
            }
            if !r.interleave {
                for &h in &r.ready {
                    c.ready(hids[h], s)?;
                }
            }
            if let Some(o) = &own {
                sim.launch(s, sim::Kernel::fill(o, oval(i)), 30)?;
            }
            Ok::<(), Error>(())
        })?;
        c.finish()?;
    }
    let rp = cap.seal()?;
    Ok(Built { rp, out })
}

pub fn base(sim: &sim::Device) -> (usize, usize) {
    (sim.live_allocations(), sim.live_events())
}

/// Random spec: n runners in capture order, handoffs of random sizes and
/// dtypes, random readers (later runners), runners with or without own
/// bytes, some writing two and reading two, random ready subsets/orders.
fn random_spec(rng: &mut Rng) -> Spec {
    let n = 3 + rng.below(5);
    let g = 1 + rng.below(3);
    let packed = rng.chance(50);
    let dtypes = [DType::F32, DType::BF16, DType::F16, DType::I32];
    let mut runners: Vec<RSpec> = (0..n).map(|_| RSpec::default()).collect();
    let mut handoffs = Vec::new();
    for w in 0..n - 1 {
        let k = rng.below(3); // 0..2 handoffs per writer
        for _ in 0..k {
            let h = handoffs.len();
            let dt = if rng.chance(70) {
                DType::F32
            } else {
                dtypes[rng.below(4)]
            };
            let elems = [64u64, 128, 200, 512][rng.below(4)];
            handoffs.push(HSpec {
                req: Request::new(Domain::Device, dt, elems),
            });
            runners[w].writes.push(h);
            // readers: 1..3 later runners
            let nr = 1 + rng.below(3);
            for _ in 0..nr {
                let r = w + 1 + rng.below(n - w - 1);
                if !runners[r].reads.contains(&h) {
                    runners[r].reads.push(h);
                }
            }
            if rng.chance(60) {
                runners[w].ready.push(h);
            }
        }
        if rng.chance(50) {
            runners[w].ready.reverse();
        }
        runners[w].interleave = rng.chance(50);
    }
    for r in runners.iter_mut() {
        if rng.chance(65) || (r.writes.is_empty() && r.reads.is_empty()) {
            r.own = Some(req([64u64, 96, 256][rng.below(3)]));
        }
    }
    let pol = if packed {
        Policy::Generations(g).packed()
    } else {
        Policy::Generations(g).round_robin()
    };
    Spec {
        runners,
        handoffs,
        policy: pol,
    }
}

struct Expect {
    /// (reader, k) -> number of reads
    reads: HashMap<(usize, usize), u64>,
    /// (runner, stream) -> consumer adds
    cons: HashMap<(usize, usize), u64>,
}

fn run_one(seed: u64, steps: bool) -> R<Vec<String>> {
    let mut rng = Rng(seed.wrapping_mul(0x9E3779B97F4A7C15).wrapping_add(7) | 1);
    let spec = random_spec(&mut rng);
    let sim = sim::Device::new();
    let streams: Vec<sim::Stream> = (0..3).map(|_| sim.new_stream()).collect();
    let b0 = base(&sim);
    let mut problems = Vec::new();
    // Events of forgotten step graphs (leaking is allowed).
    let mut leaked_events = 0;
    {
        let Built { mut rp, out, .. } = build(&sim, &spec, &streams[0])?;
        let n = spec.runners.len();
        let cout: Vec<Vec<sim::HostBuffer>> = (0..n)
            .map(|_| (0..3).map(|_| sim.alloc_f32(64).unwrap()).collect())
            .collect();
        let mut ex = Expect {
            reads: HashMap::new(),
            cons: HashMap::new(),
        };
        let has_graph = |r: usize| {
            let s = &spec.runners[r];
            s.own.is_some() || !s.writes.is_empty() || !s.reads.is_empty()
        };
        let mut log = Vec::new();
        for _op in 0..60 {
            let choice = rng.below(if steps { 10 } else { 8 });
            match choice {
                0..=3 => {
                    let r = rng.below(n);
                    let s = rng.below(3);
                    let res = rp.replay(RunnerId(r as u32), &streams[s]);
                    log.push(format!("replay r{r} s{s}: {:?}", res.as_ref().err()));
                    match res {
                        Ok(()) => {
                            for k in 0..spec.runners[r].reads.len() {
                                *ex.reads.entry((r, k)).or_default() += 1;
                            }
                        }
                        // A runner with nothing to do has no graph.
                        Err(_) if !has_graph(r) => {}
                        Err(
                            ReplayError::HandoffNotWritten { .. }
                            | ReplayError::HandoffAlreadyRead { .. }
                            | ReplayError::HandoffOverwritten { .. },
                        ) => {}
                        Err(e) => problems.push(format!("unexpected replay error {e:?}")),
                    }
                }
                4 | 5 => {
                    let r = rng.below(n);
                    let s = rng.below(3);
                    let mode = rng.below(4); // 0 ok, 1 fail after enqueue, 2 panic after enqueue, 3 mut
                    let c = &cout[r][s];
                    macro_rules! f {
                        () => {
                            |st: &sim::Stream,
                             v: &[View<'_, _>]|
                             -> std::result::Result<(), String> {
                                if let Some(v0) = v.first() {
                                    if mode == 3 {
                                        sim.launch(st, sim::Kernel::fill(v0, oval(r)), 3)
                                            .map_err(|e| e.to_string())?;
                                    }
                                    // first 64 f32s of own view (own >= 64 f32s)
                                    let part = v0.slice(0..64.min(v0.len())).unwrap();
                                    sim.launch(st, sim::Kernel::add(&part, c), 5)
                                        .map_err(|e| e.to_string())?;
                                }
                                if mode == 1 {
                                    return Err("consumer fails".into());
                                }
                                if mode == 2 {
                                    panic!("consumer panics");
                                }
                                Ok(())
                            }
                        };
                    }
                    let res = catch_unwind(AssertUnwindSafe(|| {
                        if mode == 3 {
                            rp.consume_mut(RunnerId(r as u32), &streams[s], f!())
                        } else {
                            rp.consume(RunnerId(r as u32), &streams[s], f!())
                        }
                    }));
                    let enq = match &res {
                        Ok(Ok(())) => true,
                        Ok(Err(ConsumeError::Work(_))) => true,
                        Ok(Err(_)) => false,
                        Err(_) => true,
                    };
                    log.push(format!(
                        "consume{} r{r} s{s} mode{mode}: {:?}",
                        if mode == 3 { "_mut" } else { "" },
                        res.as_ref()
                            .map(|r| r.as_ref().err().map(|e| e.to_string()))
                    ));
                    if enq && spec.runners[r].own.is_some() {
                        *ex.cons.entry((r, s)).or_default() += 1;
                    }
                }
                6 => {
                    let r = rng.below(n);
                    let s = rng.below(3);
                    if rng.chance(50) {
                        rp.wait_for(RunnerId(r as u32), &streams[s])?;
                    } else {
                        rp.wait_all(&streams[s])?;
                    }
                }
                7 => {
                    // consume_many over two runners (reads own views)
                    let r1 = rng.below(n);
                    let r2 = rng.below(n);
                    let s = rng.below(3);
                    let rs = [RunnerId(r1 as u32), RunnerId(r2 as u32)];
                    let res = rp.consume_many(&rs, &streams[s], |st, lists| {
                        for (i, views) in lists.iter().enumerate() {
                            let r = [r1, r2][i];
                            if let Some(v0) = views.first() {
                                let part = v0.slice(0..64.min(v0.len())).unwrap();
                                sim.launch(st, sim::Kernel::add(&part, &cout[r][s]), 5)?;
                            }
                        }
                        Ok::<(), BackendError>(())
                    });
                    log.push(format!(
                        "consume_many r{r1},r{r2} s{s}: {:?}",
                        res.as_ref().err().map(|e| e.to_string())
                    ));
                    if res.is_ok() {
                        for r in [r1, r2] {
                            if spec.runners[r].own.is_some() {
                                *ex.cons.entry((r, s)).or_default() += 1;
                            }
                        }
                    }
                }
                _ => {
                    // a step graph
                    let k = 1 + rng.below(6);
                    let mut items: Vec<(bool, usize, usize)> = Vec::new();
                    if rng.chance(60) {
                        // capture order, rotated, subsets, consumers after replays
                        let start = if rng.chance(50) { 0 } else { rng.below(n) };
                        for i in 0..n {
                            let r = (start + i) % n;
                            if rng.chance(80) {
                                items.push((true, r, rng.below(3)));
                                if rng.chance(40) {
                                    items.push((false, r, rng.below(3)));
                                }
                            }
                        }
                    } else {
                        for _ in 0..k {
                            items.push((rng.chance(70), rng.below(n), rng.below(3)));
                        }
                    }
                    let launches = rng.below(4);
                    let ls = rng.below(3);
                    let mut step = rp.step();
                    let mut sched: Vec<(bool, usize, usize)> = Vec::new();
                    for &(is_replay, r, s) in &items {
                        if is_replay {
                            if step.replay(RunnerId(r as u32), &streams[s]).is_ok() {
                                sched.push((true, r, s));
                            }
                        } else {
                            let c = &cout[r][s];
                            let res = step.consume(RunnerId(r as u32), &streams[s], |st, v| {
                                if let Some(v0) = v.first() {
                                    let part = v0.slice(0..64.min(v0.len())).unwrap();
                                    sim.launch(st, sim::Kernel::add(&part, c), 5)?;
                                }
                                Ok::<(), BackendError>(())
                            });
                            if res.is_ok() {
                                sched.push((false, r, s));
                            }
                        }
                    }
                    if rng.chance(10) {
                        // Forgotten before it is built: its consumers'
                        // graphs leak, nothing ran.
                        log.push(format!("forget the step builder of {sched:?}"));
                        std::mem::forget(step);
                        continue;
                    }
                    let g = step.build();
                    log.push(format!(
                        "step {:?} x{launches} on s{ls}: {:?}",
                        sched,
                        g.as_ref().err().map(|e| e.to_string())
                    ));
                    if let Ok(mut g) = g {
                        let forget = rng.chance(40);
                        for _ in 0..launches {
                            g.launch(&streams[ls])?;
                            for &(is_replay, r, s) in &sched {
                                if is_replay {
                                    for k in 0..spec.runners[r].reads.len() {
                                        *ex.reads.entry((r, k)).or_default() += 1;
                                    }
                                } else if spec.runners[r].own.is_some() {
                                    *ex.cons.entry((r, s)).or_default() += 1;
                                }
                            }
                        }
                        if forget {
                            // No safety rests on its destructor: every later
                            // replay, consumer and the teardown stay ordered
                            // after its launches. It leaks its graph and its
                            // completion event.
                            log.push("forget the step graph".into());
                            std::mem::forget(g);
                            leaked_events += 1;
                        }
                    }
                }
            }
        }
        rp.synchronize()?;
        let hz = sim.hazards();
        if !hz.is_empty() {
            problems.push(format!("hazards: {:?}", &hz[..hz.len().min(4)]));
        }
        for r in 0..n {
            for (k, &h) in spec.runners[r].reads.iter().enumerate() {
                let cnt = ex.reads.get(&(r, k)).copied().unwrap_or(0);
                let got = sim.read_f32(&out[r][k])?[0];
                let want = cnt as f32 * hval(h);
                if got != want {
                    problems.push(format!(
                        "reader r{r} of H{h}: sum {got}, want {cnt} x {} = {want}",
                        hval(h)
                    ));
                }
            }
            #[allow(clippy::needless_range_loop)]
            for s in 0..3 {
                let cnt = ex.cons.get(&(r, s)).copied().unwrap_or(0);
                let got = sim.read_f32(&cout[r][s])?[0];
                // own bytes hold oval(r) once the runner was replayed; 0 before
                if got != cnt as f32 * oval(r) {
                    problems.push(format!(
                        "consumers of r{r} on s{s}: sum {got}, want {cnt} x {}",
                        oval(r)
                    ));
                }
            }
        }
        if !problems.is_empty() {
            problems.push(format!("spec: {:?}", spec));
            problems.push(format!("log:\n  {}", log.join("\n  ")));
        }
        drop(rp);
        drop(cout);
        drop(out);
    }
    if base(&sim) != (b0.0, b0.1 + leaked_events) {
        problems.push(format!(
            "leak: {:?} vs {:?} and {leaked_events} forgotten step graph(s)",
            base(&sim),
            b0
        ));
    }
    Ok(problems)
}

fn fuzz(steps: bool, seeds: std::ops::Range<u64>) -> R {
    let mut bad = 0;
    for seed in seeds {
        let p = catch_unwind(AssertUnwindSafe(|| run_one(seed, steps)));
        match p {
            Ok(Ok(p)) if p.is_empty() => {}
            Ok(Ok(p)) => {
                bad += 1;
                if bad <= 2 {
                    eprintln!("seed {seed}:\n{}", p.join("\n"));
                } else {
                    eprintln!("seed {seed}: {}", p[0]);
                }
            }
            Ok(Err(e)) => {
                bad += 1;
                eprintln!("seed {seed}: error {e}");
            }
            Err(_) => {
                bad += 1;
                eprintln!("seed {seed}: PANIC");
            }
        }
    }
    assert_eq!(bad, 0, "{bad} bad seeds");
    Ok(())
}

/// Seeds per test: `HANDOFF_FUZZ_SEEDS` (default 1000).
fn seeds() -> u64 {
    std::env::var("HANDOFF_FUZZ_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000)
}

#[test]
fn random_handoff_plans_per_runner() -> R {
    fuzz(false, 0..seeds())
}

#[test]
fn random_handoff_plans_with_step_graphs() -> R {
    fuzz(true, 0..seeds())
}
