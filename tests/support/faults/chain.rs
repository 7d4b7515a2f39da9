//! A chain of runners (runner `l` hands its count to `l + 1`) captured
//! repeatably with step copies: the plan of the attacks on step copies cut
//! at their ready points, traced step graphs and the backend roles.

#![allow(clippy::needless_range_loop, clippy::unnecessary_unwrap)]

use replay_arena::backend::Streams;
use replay_arena::sim::{self, Faults};
use replay_arena::{
    Discovering, HandoffId, KeptStep, PlanConfig, Policy, ReadOnly, Replayable, Request,
    RunnerCapture, RunnerId, View,
};

pub use super::N;
use super::{assert_no_graph_memory, build, chain_of, Q, R};
use crate::support::steps::allocate_discovered;

/// Each runner's own view.
pub const OWN: Request = Q;
/// Each handoff.
pub const GRAD: Request = Q;

/// What a runner's work closure sees.
#[allow(dead_code)]
pub struct Ctx<'a, 'c> {
    pub sim: &'a sim::Device,
    pub cap: &'a RunnerCapture<'c, sim::Device>,
    pub layer: usize,
    pub layers: usize,
    pub run: usize,
    pub own: &'a View<'a>,
    pub input: Option<&'a View<'a, ReadOnly>>,
    pub out: Option<(HandoffId, &'a View<'a>)>,
    pub one: &'a sim::HostBuffer,
    pub count: &'a sim::HostBuffer,
    pub sink: &'a sim::HostBuffer,
}

/// What every work of a chain does up to its ready point: count += 1;
/// sink += input; out = count; ready.
pub fn up_to_ready(c: &Ctx, s: &sim::Stream) -> R {
    let sim = c.sim;
    sim.launch(s, sim::Kernel::add(c.one, c.count), 1)?;
    if let Some(input) = c.input {
        sim.launch(s, sim::Kernel::add(input, c.sink), 20)?;
    }
    if let Some((h, out)) = c.out {
        sim.launch(s, sim::Kernel::copy(c.count, out), 2)?;
        c.cap.ready(h, s)?;
    }
    Ok(())
}

/// The standard work: [`up_to_ready`], then own = count through a
/// temporary.
pub fn standard(c: &Ctx, s: &sim::Stream) -> R {
    let sim = c.sim;
    up_to_ready(c, s)?;
    let t = sim.alloc_async(s, N)?;
    sim.launch(s, sim::Kernel::copy(c.count, &t), 5)?;
    sim.launch(s, sim::Kernel::copy(&t, c.own), 30)?;
    sim.free_async(s, &t)?;
    Ok(())
}

/// Work that allocates nothing ([`up_to_ready`], then own = count): its
/// graph is copied into step graphs, so traced launches compose a traced
/// copy.
pub fn plain(c: &Ctx, s: &sim::Stream) -> R {
    up_to_ready(c, s)?;
    c.sim.launch(s, sim::Kernel::copy(c.count, c.own), 30)?;
    Ok(())
}

pub struct Chain {
    pub sim: sim::Device,
    pub pool: [sim::Stream; 2],
    pub replayable: Option<Replayable<sim::Device>>,
    pub failed: Option<replay_arena::Capturing<sim::Device>>,
    pub capture_errors: Vec<String>,
    pub sinks: Vec<sim::HostBuffer>,
    pub _keep: Vec<sim::HostBuffer>,
}

/// A chain of `layers` runners (runner l hands its count to l + 1),
/// captured repeatably with `copies` step copies each, with `work`.
pub fn chain_with(
    layers: usize,
    g: usize,
    copies: usize,
    work: &mut dyn FnMut(&Ctx, &sim::Stream) -> R,
) -> Chain {
    let sim = sim::Device::new();
    chain_on(sim, layers, g, copies, work)
}

pub fn chain_on(
    sim: sim::Device,
    layers: usize,
    g: usize,
    copies: usize,
    work: &mut dyn FnMut(&Ctx, &sim::Stream) -> R,
) -> Chain {
    chain_faulty(sim, layers, g, copies, work, None)
}

pub fn chain_faulty(
    sim: sim::Device,
    layers: usize,
    g: usize,
    copies: usize,
    work: &mut dyn FnMut(&Ctx, &sim::Stream) -> R,
    faults: Option<Faults>,
) -> Chain {
    let (d, handoffs) = chain_of(layers, OWN, GRAD);
    let pool = [sim.new_stream(), sim.new_stream()];
    let one = sim.alloc_f32(N).unwrap();
    sim.write_f32(&one, &[1.0; N]).unwrap();
    let counts: Vec<sim::HostBuffer> = (0..layers).map(|_| sim.alloc_f32(N).unwrap()).collect();
    let sinks: Vec<sim::HostBuffer> = (0..layers).map(|_| sim.alloc_f32(N).unwrap()).collect();
    let planned = d.plan(Policy::Generations(g)).unwrap();
    let mut keep = counts;
    keep.push(one);
    let (counts, one) = (&keep[..layers], &keep[layers]);
    if let Some(f) = faults {
        sim.inject(f);
    }
    let mut capture_errors = Vec::new();
    let mut capturing = match planned.allocate(sim.clone()) {
        Ok(c) => c,
        Err(e) => {
            capture_errors.push(format!("allocate: {e}"));
            return Chain {
                sim,
                pool,
                replayable: None,
                failed: None,
                capture_errors,
                sinks,
                _keep: keep,
            };
        }
    };
    for l in 0..layers {
        let cap = match capturing.capture(RunnerId(l as u32)) {
            Ok(c) => c,
            Err(e) => {
                capture_errors.push(format!("capture {l}: {e}"));
                continue;
            }
        };
        cap.step_copies(copies);
        let own = cap.take(OWN).unwrap();
        let input = (l > 0).then(|| cap.receive(handoffs[l - 1]).unwrap());
        let out = (l + 1 < layers).then(|| cap.hand_off(handoffs[l]).unwrap());
        let mut run = 0;
        let res = cap.stream_capture_repeatable(&pool[0], |s| {
            run += 1;
            let c = Ctx {
                sim: &sim,
                cap: &cap,
                layer: l,
                layers,
                run,
                own: &own,
                input: input.as_ref(),
                out: out.as_ref().map(|o| (handoffs[l], o)),
                one,
                count: &counts[l],
                sink: &sinks[l],
            };
            work(&c, s)
        });
        if let Err(e) = res {
            capture_errors.push(format!("runner {l}: {e}"));
        }
        if let Err(e) = cap.finish() {
            capture_errors.push(format!("finish {l}: {e}"));
        }
        assert!(
            !sim.is_capturing(&pool[0]).unwrap_or(false),
            "left capturing"
        );
    }
    let (replayable, failed) = super::seal_or_note(capturing, &mut capture_errors);
    Chain {
        sim,
        pool,
        replayable,
        failed,
        capture_errors,
        sinks,
        _keep: keep,
    }
}

impl Chain {
    /// Clones of the chain's pool and device, a new side stream and a new
    /// `N`-element sink: what a test of its step builders holds apart from
    /// the plan, which the builder borrows.
    pub fn apart(&self) -> ([sim::Stream; 2], sim::Device, sim::Stream, sim::HostBuffer) {
        let sim = self.sim.clone();
        let side = sim.new_stream();
        let sink = sim.alloc_f32(N).unwrap();
        (self.pool.clone(), sim, side, sink)
    }
    pub fn r(&mut self) -> &mut Replayable<sim::Device> {
        self.replayable.as_mut().expect("sealed")
    }
    pub fn per_runner(&mut self, steps: usize) {
        let layers = self.sinks.len();
        for _ in 0..steps {
            for l in 0..layers {
                let s = self.pool[l % 2].clone();
                self.r().replay(RunnerId(l as u32), &s).unwrap();
            }
        }
    }
    pub fn hazard_free(&self) {
        super::assert_hazard_free(&self.sim);
    }
    pub fn values(&self) -> Vec<Vec<f32>> {
        let r = self.replayable.as_ref().unwrap();
        let views = (0..self.sinks.len()).map(|l| r.views(RunnerId(l as u32)).unwrap()[0]);
        super::read_back(&self.sim, &self.sinks, views)
    }
    /// Drops the plan; graph memory must return to zero.
    pub fn teardown(mut self) {
        let sim = self.sim.clone();
        super::drop_plan(self.replayable.take(), self.failed.take());
        drop(self);
        super::assert_hazard_free(&sim);
        assert_no_graph_memory(&sim, "teardown");
    }
}

/// The error a work closure fails with on purpose.
pub fn injected() -> replay_arena::Error {
    super::refused("closure fails")
}

/// Launches `steps` step graphs of every runner on `pool[l % 2]`.
pub fn step_launches(c: &mut Chain, steps: usize, overlapping: bool) -> Result<(), String> {
    let layers = c.sinks.len();
    let pool = c.pool.clone();
    let r = c.replayable.as_mut().unwrap();
    let mut step = r.step();
    for l in 0..layers {
        step.replay(RunnerId(l as u32), &pool[l % 2])
            .map_err(|e| e.to_string())?;
    }
    let mut graph = build(step, overlapping).map_err(|e| e.to_string())?;
    for k in 0..steps {
        graph.launch(&pool[k % 2]).map_err(|e| e.to_string())?;
    }
    Ok(())
}

pub fn kept_of(c: &mut Chain, overlapping: bool) -> KeptStep<sim::Device> {
    let layers = c.sinks.len();
    let pool = c.pool.clone();
    let r = c.r();
    let mut step = r.step();
    for l in 0..layers {
        step.replay(RunnerId(l as u32), &pool[l % 2]).unwrap();
    }
    let g = build(step, overlapping);
    g.unwrap().keep()
}

/// Runner 0 writes two handoffs, read by runners 1 and 2; `order(run)`
/// gives the order runner 0 writes and marks them in each run.
pub fn two_handoffs(
    order: impl Fn(usize) -> [usize; 2],
    copies: usize,
) -> (
    sim::Device,
    Result<Replayable<sim::Device>, String>,
    [sim::Stream; 3],
    [sim::HostBuffer; 2],
) {
    let mut d = Discovering::new(PlanConfig::new());
    let hs = {
        let mut a = d.arm(RunnerId(0)).unwrap();
        a.record(OWN).unwrap();
        [a.hand_off(GRAD).unwrap(), a.hand_off(GRAD).unwrap()]
    };
    for i in 0..2 {
        let mut a = d.arm(RunnerId(1 + i as u32)).unwrap();
        a.record(OWN).unwrap();
        a.receive(hs[i]).unwrap();
    }
    let sim = sim::Device::new();
    let streams = [sim.new_stream(), sim.new_stream(), sim.new_stream()];
    let one = sim.alloc_f32(N).unwrap();
    sim.write_f32(&one, &[1.0; N]).unwrap();
    let count = sim.alloc_f32(N).unwrap();
    let mut capturing = allocate_discovered(&sim, d, Policy::Generations(1));
    let mut errs = Vec::new();
    {
        let cap = capturing.capture(RunnerId(0)).unwrap();
        cap.step_copies(copies);
        let own = cap.take(OWN).unwrap();
        let outs = [cap.hand_off(hs[0]).unwrap(), cap.hand_off(hs[1]).unwrap()];
        let mut run = 0;
        let res = cap.stream_capture_repeatable(&streams[0], |s| -> R {
            run += 1;
            sim.launch(s, sim::Kernel::add(&one, &count), 1)?;
            let t = sim.alloc_async(s, N)?;
            sim.launch(s, sim::Kernel::copy(&count, &t), 1)?;
            for (k, &i) in order(run).iter().enumerate() {
                // the second handoff written is slow
                sim.launch(
                    s,
                    sim::Kernel::copy(&t, &outs[i]),
                    if k == 0 { 2 } else { 60 },
                )?;
                cap.ready(hs[i], s)?;
            }
            sim.launch(s, sim::Kernel::copy(&t, &own), 5)?;
            Ok(sim.free_async(s, &t)?)
        });
        if let Err(e) = res {
            errs.push(e.to_string());
        }
        if let Err(e) = cap.finish() {
            errs.push(e.to_string());
        }
    }
    for i in 0..2usize {
        let cap = capturing.capture(RunnerId(1 + i as u32)).unwrap();
        let own = cap.take(OWN).unwrap();
        let input = cap.receive(hs[i]).unwrap();
        record_and_finish!(cap, &streams[0], |s| {
            sim.launch(s, sim::Kernel::copy(&input, &own), 3)
        });
    }
    let r = if errs.is_empty() {
        capturing.seal().map_err(|e| e.to_string())
    } else {
        drop(capturing.replan());
        Err(errs.join("; "))
    };
    (sim, r, streams, [count, one])
}

/// Runners 0, 1 and 2 replayed on their own streams in one step graph (or
/// two overlapping), launched 4 times on the streams in turn.
pub fn launch_three(r: &mut Replayable<sim::Device>, streams: &[sim::Stream], overlapping: bool) {
    let mut step = r.step();
    for i in 0..3u32 {
        step.replay(RunnerId(i), &streams[i as usize]).unwrap();
    }
    let mut g = build(step, overlapping).unwrap();
    for k in 0..4 {
        g.launch(&streams[k % 3]).unwrap();
    }
}
