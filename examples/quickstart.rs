//! A backward-like pipeline end to end: discovery, the plan report, capture,
//! and many fenced replays whose results are checked.
//!
//! Five runners (one per layer's backward, last layer first, plus an MTP
//! layer that uses one parameter twice) write a weight gradient into
//! persistent views; a reduce-scatter-like consumer on its own stream adds
//! every gradient into the parameter's main grad, asynchronously, after the
//! graph that produced it. Runners replay on a pool of two streams with two
//! generations, so consecutive runners overlap while no arena is overwritten
//! before its consumer is done.
//!
//! Runs on the `sim` backend everywhere, and on the GPU (`cuda` backend) when
//! one is present.

use replay_arena::sim::{SimBackend, SimBuffer, SimOp, SimStream};
use replay_arena::{
    Backend, DType, Discovering, Domain, ParamId, PlanConfig, Policy, Purpose, Replayable, Request,
    Result, RunnerId, View,
};

/// Parameters: (name, elements of its wgrad shard).
const PARAMS: [(&str, u64); 4] = [
    ("attn.qkv", 3 * 1024),
    ("attn.proj", 1024),
    ("mlp.fc1", 4 * 1024),
    ("mlp.fc2", 4 * 1024),
];

/// Runners in backward (capture) order, each with the parameters whose wgrad
/// it produces. The MTP runner reuses `mlp.fc1` twice in one graph.
const RUNNERS: [(&str, &[usize]); 5] = [
    ("mtp.bwd", &[2, 2, 3]),
    ("layer2.bwd", &[0, 1, 2, 3]),
    ("layer1.bwd", &[0, 1, 2, 3]),
    ("layer1.loss_scale", &[]),
    ("layer0.bwd", &[0, 1, 2, 3]),
];

const STEPS: usize = 200;

fn wgrad_request(param: usize) -> Request {
    Request::new(Domain::Device, DType::F32, PARAMS[param].1)
        .purpose(Purpose::WgradRsInput)
        .param(ParamId(param as u64))
}

/// The gradient value runner `r` writes for its `i`-th request.
fn grad_value(r: usize, i: usize) -> f32 {
    (r * 10 + i + 1) as f32
}

/// The kernels the pipeline needs, per backend.
trait Kernels: Backend + Clone {
    /// A buffer outside the plan holding one parameter's main grad.
    type Buffer;
    fn new_stream(&self) -> Result<Self::Stream>;
    fn zeros(&self, len: usize) -> Result<Self::Buffer>;
    /// `view[..] = value` (the wgrad GEMM).
    fn write_grad(&self, stream: &Self::Stream, view: &View<'_>, value: f32) -> Result<()>;
    /// `main_grad[..] += view[..]` (the reduce-scatter, on another stream).
    fn accumulate(&self, stream: &Self::Stream, view: &View<'_>, out: &Self::Buffer) -> Result<()>;
    fn read(&self, out: &Self::Buffer) -> Result<Vec<f32>>;
}

impl Kernels for SimBackend {
    type Buffer = SimBuffer;
    fn new_stream(&self) -> Result<SimStream> {
        Ok(self.stream())
    }
    fn zeros(&self, len: usize) -> Result<SimBuffer> {
        self.alloc_f32(len)
    }
    fn write_grad(&self, stream: &SimStream, view: &View<'_>, value: f32) -> Result<()> {
        self.launch(stream, SimOp::fill(view, value), 20)
    }
    fn accumulate(&self, stream: &SimStream, view: &View<'_>, out: &SimBuffer) -> Result<()> {
        self.launch(stream, SimOp::add(view, out), 50)
    }
    fn read(&self, out: &SimBuffer) -> Result<Vec<f32>> {
        self.read_f32(out)
    }
}

fn discover() -> Result<Discovering> {
    let mut discovery = Discovering::new(PlanConfig::new());
    for (r, (_, params)) in RUNNERS.iter().enumerate() {
        let mut armed = discovery.arm(RunnerId(r as u32))?;
        for &p in *params {
            armed.record(wgrad_request(p))?;
        }
    }
    Ok(discovery)
}

fn run<K: Kernels>(backend: K) -> Result<()> {
    let planned = discover()?.plan(Policy::OverlapDepth(2))?;
    println!("{}", planned.report());

    let pool = [backend.new_stream()?, backend.new_stream()?];
    let rs_stream = backend.new_stream()?;
    let main_grads: Vec<K::Buffer> = PARAMS
        .iter()
        .map(|&(_, n)| backend.zeros(n as usize))
        .collect::<Result<_>>()?;

    let mut capturing = planned.allocate(backend.clone())?;
    for (r, (_, params)) in RUNNERS.iter().enumerate() {
        let cap = capturing.capture(RunnerId(r as u32))?;
        let views: Vec<View<'_>> = params
            .iter()
            .map(|&p| cap.take(wgrad_request(p)))
            .collect::<Result<_>>()?;
        let graph = cap.record(&pool[0], |s| {
            views
                .iter()
                .enumerate()
                .try_for_each(|(i, v)| backend.write_grad(s, v, grad_value(r, i)))
        })?;
        cap.finish(graph)?;
    }
    let mut replayable: Replayable<K> = capturing.seal()?;

    for _ in 0..STEPS {
        for (r, (_, params)) in RUNNERS.iter().enumerate() {
            let runner = RunnerId(r as u32);
            replayable.replay(runner, &pool[r % pool.len()])?;
            replayable.consume(runner, &rs_stream, |s, views| {
                views
                    .iter()
                    .zip(params.iter())
                    .try_for_each(|(v, &p)| backend.accumulate(s, v, &main_grads[p]))
            })?;
        }
    }
    replayable.synchronize()?;

    for (p, (name, _)) in PARAMS.iter().enumerate() {
        let per_step: f32 = RUNNERS
            .iter()
            .enumerate()
            .flat_map(|(r, (_, params))| {
                params
                    .iter()
                    .enumerate()
                    .filter(move |(_, &q)| q == p)
                    .map(move |(i, _)| grad_value(r, i))
            })
            .sum();
        let expected = per_step * STEPS as f32;
        let got = backend.read(&main_grads[p])?;
        if let Some(bad) = got.iter().position(|&x| x != expected) {
            return Err(replay_arena::Error::Backend {
                op: "quickstart check",
                detail: format!("{name}[{bad}] = {} but expected {expected}", got[bad]),
            });
        }
        println!("{name:<10} main grad = {expected} everywhere after {STEPS} steps: ok");
    }
    let stats = replayable.fence_stats();
    println!(
        "{} replays on {}: {} fence waits, {} elided by stream order",
        stats.replays,
        backend.name(),
        stats.waits,
        stats.elided
    );
    drop(replayable.replan()?);
    Ok(())
}

fn main() -> Result<()> {
    let sim = SimBackend::new();
    run(sim.clone())?;
    if !sim.hazards().is_empty() {
        eprintln!("hazards: {:?}", sim.hazards());
        std::process::exit(1);
    }
    println!(
        "backend: sim (no hazards, {} allocations left)",
        sim.live_allocations()
    );
    Ok(())
}
