//! A backward-like pipeline end to end: discovery, the plan report, capture,
//! and many fenced replays whose results are checked.
//!
//! Five runners (one per layer's backward, last layer first, plus an MTP
//! layer that uses one parameter twice) write a weight gradient into
//! persistent views; a reduce-scatter-like consumer on its own stream adds
//! every gradient into the parameter's main grad, asynchronously, after the
//! graph that produced it. Runners replay on a pool of two streams with two
//! generations, so consecutive runners overlap while no arena is overwritten
//! before its consumer is done. Each runner replays on the stream of its
//! generation (`plan().generation_of`, as docs/lifecycle.md advises: the
//! k-th buffer-using runner on stream k mod G), so a replay never waits for
//! the runner whose bytes it reuses: stream order already orders them.
//!
//! The last two per-runner steps and the step graph's launches are traced:
//! the fence's schedule is written as a Chrome trace file (one lane per
//! stream, an arrow per wait) whose path the example prints; open it at
//! <https://ui.perfetto.dev> ("Open trace file") or in Chrome's
//! `about:tracing` (docs/trace.md).
//!
//! Runs on the `sim` backend everywhere, and on the GPU (`cuda` backend) when
//! one is present (`cuda::probe()` says whether one is, before anything
//! touches the driver). An error is printed with `Display`, as a sentence.

use replay_arena::backend::{Backend, Compose, Streams, Timing};
use replay_arena::sim;
use replay_arena::{
    DType, Discovering, Domain, FenceStats, ParamId, PlanConfig, Policy, Purpose, ReadOnly,
    Replayable, Request, Result, RunnerId, View,
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
pub(crate) trait Kernels {
    type Backend: Compose + Timing + Clone + 'static;
    /// A buffer outside the plan holding one parameter's main grad.
    type Buffer;
    fn backend(&self) -> &Self::Backend;
    fn new_stream(&self) -> Result<Stream<Self>>;
    fn zeros(&self, len: usize) -> Result<Self::Buffer>;
    /// `view[..] = value` (the wgrad GEMM).
    fn write_grad(&self, stream: &Stream<Self>, view: &View<'_>, value: f32) -> Result<()>;
    /// `main_grad[..] += view[..]` (the reduce-scatter, on another stream).
    fn accumulate(
        &self,
        stream: &Stream<Self>,
        view: &View<'_, ReadOnly>,
        out: &Self::Buffer,
    ) -> Result<()>;
    fn read(&self, out: &Self::Buffer) -> Result<Vec<f32>>;
}

pub(crate) type Stream<K> = <<K as Kernels>::Backend as Streams>::Stream;

impl Kernels for sim::Device {
    type Backend = sim::Device;
    type Buffer = sim::HostBuffer;
    fn backend(&self) -> &sim::Device {
        self
    }
    fn new_stream(&self) -> Result<sim::Stream> {
        Ok(sim::Device::new_stream(self))
    }
    fn zeros(&self, len: usize) -> Result<sim::HostBuffer> {
        Ok(self.alloc_f32(len)?)
    }
    fn write_grad(&self, stream: &sim::Stream, view: &View<'_>, value: f32) -> Result<()> {
        // The last argument: how long the op runs, in ticks of sim's clock.
        Ok(self.launch(stream, sim::Kernel::fill(view, value), 20)?)
    }
    fn accumulate(
        &self,
        stream: &sim::Stream,
        view: &View<'_, ReadOnly>,
        out: &sim::HostBuffer,
    ) -> Result<()> {
        Ok(self.launch(stream, sim::Kernel::add(view, out), 50)?)
    }
    fn read(&self, out: &sim::HostBuffer) -> Result<Vec<f32>> {
        Ok(self.read_f32(out)?)
    }
}

#[cfg(feature = "cuda")]
mod gpu {
    //! The same kernels on the GPU, compiled with nvrtc at start.
    use super::Kernels;
    use replay_arena::backend::Streams;
    use replay_arena::cuda;
    use replay_arena::cuda::cudarc::driver::{
        CudaFunction, CudaSlice, DevicePtr, LaunchConfig, PushKernelArg,
    };
    use replay_arena::cuda::cudarc::nvrtc::compile_ptx;
    use replay_arena::{Error, ReadOnly, Result, View};

    const SOURCE: &str = r#"
    extern "C" __global__ void fill(float* w, unsigned int n, float value) {
        for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) w[i] = value;
    }
    extern "C" __global__ void add(float* out, const float* w, unsigned int n) {
        for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] += w[i];
    }
    "#;

    fn failed(op: &'static str) -> impl Fn(String) -> Error {
        move |detail| Error::Work(format!("{op} failed: {detail}").into())
    }

    /// The `cuda` backend with the example's two kernels.
    pub struct Gpu {
        pub backend: cuda::Device,
        fill: CudaFunction,
        add: CudaFunction,
        io: cuda::Stream,
    }

    impl Gpu {
        pub fn new(ordinal: usize) -> Result<Gpu> {
            let backend = cuda::Device::new(ordinal)?;
            let ptx = compile_ptx(SOURCE).map_err(|e| failed("nvrtc")(format!("{e:?}")))?;
            let module = backend
                .context()
                .load_module(ptx)
                .map_err(|e| failed("cuModuleLoad")(format!("{:?}", e.0)))?;
            let f = |name| {
                module
                    .load_function(name)
                    .map_err(|e| failed("cuModuleGetFunction")(format!("{:?}", e.0)))
            };
            Ok(Gpu {
                fill: f("fill")?,
                add: f("add")?,
                io: backend.new_stream()?,
                backend,
            })
        }
    }

    fn cfg(n: usize) -> LaunchConfig {
        LaunchConfig::for_num_elems(n as u32)
    }

    impl Kernels for Gpu {
        type Backend = cuda::Device;
        type Buffer = CudaSlice<f32>;
        fn backend(&self) -> &cuda::Device {
            &self.backend
        }
        fn new_stream(&self) -> Result<cuda::Stream> {
            Ok(self.backend.new_stream()?)
        }
        fn zeros(&self, len: usize) -> Result<CudaSlice<f32>> {
            let buf = self
                .io
                .cudarc()
                .alloc_zeros::<f32>(len)
                .map_err(|e| failed("cuMemAlloc")(format!("{:?}", e.0)))?;
            self.io.synchronize()?;
            Ok(buf)
        }
        fn write_grad(&self, s: &cuda::Stream, view: &View<'_>, value: f32) -> Result<()> {
            let (ptr, n) = (view.device_address(), view.len() as u32);
            let mut b = s.cudarc().launch_builder(&self.fill);
            b.arg(&ptr).arg(&n).arg(&value);
            unsafe { b.launch(cfg(view.len())) }
                .map(drop)
                .map_err(|e| failed("cuLaunchKernel")(format!("{:?}", e.0)))
        }
        fn accumulate(
            &self,
            s: &cuda::Stream,
            view: &View<'_, ReadOnly>,
            out: &CudaSlice<f32>,
        ) -> Result<()> {
            let (src, n) = (view.device_address(), view.len() as u32);
            let dst = out.device_ptr(self.io.cudarc()).0;
            let mut b = s.cudarc().launch_builder(&self.add);
            b.arg(&dst).arg(&src).arg(&n);
            unsafe { b.launch(cfg(view.len())) }
                .map(drop)
                .map_err(|e| failed("cuLaunchKernel")(format!("{:?}", e.0)))
        }
        fn read(&self, out: &CudaSlice<f32>) -> Result<Vec<f32>> {
            self.backend.synchronize()?;
            let v = self
                .io
                .cudarc()
                .clone_dtoh(out)
                .map_err(|e| failed("cuMemcpyDtoH")(format!("{:?}", e.0)))?;
            self.io.synchronize()?;
            Ok(v)
        }
    }
}

fn discover() -> Result<Discovering> {
    let mut discovery = Discovering::new(PlanConfig::new());
    for (r, (name, params)) in RUNNERS.iter().enumerate() {
        let mut armed = discovery.arm_named(RunnerId(r as u32), *name)?;
        for &p in *params {
            armed.record(wgrad_request(p))?;
        }
    }
    Ok(discovery)
}

/// The counts a run ends with, and how many of its fenced operations it
/// ran per backend: what [`explain`] turns into sentences.
pub(crate) struct Outcome {
    /// The fence's counters after the per-runner steps (before the step
    /// graph's launches).
    pub(crate) stats: FenceStats,
    /// `G`.
    pub(crate) generations: u64,
    /// Runners that request buffers (the others are never fenced).
    pub(crate) runners_using: u64,
    /// Per-runner steps (each replays every runner once).
    pub(crate) steps: u64,
}

/// What the counts show, in sentences whose numbers are the counts'. One
/// wait per consumer of a buffer-using runner (for its runner's replay, on
/// another stream) and one per replay of a buffer-using runner (for the
/// consumer that last read its arena; the first `G` replays have none) is
/// what a schedule that follows the generations costs; anything above that
/// is said, not hidden.
pub(crate) fn explain(outcome: &Outcome) -> String {
    let s = &outcome.stats;
    // Each step replays and consumes every runner once.
    let fenced = outcome.runners_using * outcome.steps;
    let unfenced = s.replays.saturating_sub(fenced);
    let replay_waits = fenced.saturating_sub(outcome.generations);
    let expected = fenced + replay_waits;
    let mut text = format!(
        "What this shows: every main grad equals the eager sum exactly, so no wgrad view was\n\
         overwritten while the reduce-scatter stand-in still read it. Of the {} replays, {unfenced}\n\
         are of the runner that requests nothing (never fenced) and {fenced} of runners with buffers;\n\
         so are the {} consumers ({} of the runner that requests nothing, with nothing to wait for).\n",
        s.replays,
        s.consumers,
        s.consumers.saturating_sub(fenced)
    );
    if s.waits == expected {
        text += &format!(
            "The {} waits are one per consumer of a runner with buffers ({fenced}, each for its\n\
             runner's replay) and one per buffer-using replay after the first {} ({replay_waits}, each\n\
             for the consumer that last read its arena). The {} skipped waits, not among those, were\n\
             for the runner whose bytes a replay reuses: it ran on the same stream (its generation's),\n\
             so stream order already implied them.",
            s.waits, outcome.generations, s.waits_skipped
        );
    } else {
        text += &format!(
            "The {} waits are {} more than one per consumer of a runner with buffers ({fenced}) and\n\
             one per buffer-using replay after the first {} ({replay_waits}): some runners ran on a\n\
             stream other than their generation's, so replays waited for the runner whose bytes they\n\
             reuse.",
            s.waits,
            s.waits as i128 - expected as i128,
            outcome.generations
        );
    }
    text
}

/// Runs the pipeline on `backend`, passing each paragraph it prints to
/// `say`.
pub(crate) fn run<K: Kernels>(backend: &K, say: &mut dyn FnMut(String)) -> Result<Outcome> {
    let planned = discover()?.plan(Policy::OverlapDepth(2))?;
    say(planned.report().to_string());
    // The k-th buffer-using runner replays on stream k mod G: the stream of
    // its generation. A runner that requests nothing has no generation and
    // may go on any stream.
    let lane: Vec<usize> = (0..RUNNERS.len())
        .map(|r| planned.generation_of(RunnerId(r as u32)).unwrap_or(0))
        .collect();
    let generations = planned.generations();
    let runners_using = lane.len() - RUNNERS.iter().filter(|(_, p)| p.is_empty()).count();

    let pool: Vec<_> = (0..generations)
        .map(|_| backend.new_stream())
        .collect::<Result<_>>()?;
    let rs_stream = backend.new_stream()?;
    let main_grads: Vec<K::Buffer> = PARAMS
        .iter()
        .map(|&(_, n)| backend.zeros(n as usize))
        .collect::<Result<_>>()?;

    let mut capturing = planned.allocate(backend.backend().clone())?;
    for (r, (_, params)) in RUNNERS.iter().enumerate() {
        let cap = capturing.capture(RunnerId(r as u32))?;
        let views: Vec<View<'_>> = params
            .iter()
            .map(|&p| cap.take(wgrad_request(p)))
            .collect::<Result<_, _>>()?;
        cap.stream_capture(&pool[0], |s| {
            views
                .iter()
                .enumerate()
                .try_for_each(|(i, v)| backend.write_grad(s, v, grad_value(r, i)))
        })?;
        cap.finish()?;
    }
    let mut replayable: Replayable<K::Backend> = capturing.seal()?;

    for step in 0..STEPS {
        if step == STEPS - 2 {
            // Traced from here to the end of the step graph's launches.
            replayable.start_trace()?;
        }
        for (r, (_, params)) in RUNNERS.iter().enumerate() {
            let runner = RunnerId(r as u32);
            replayable.replay(runner, &pool[lane[r]])?;
            replayable.consume(runner, &rs_stream, |s, views| {
                views
                    .iter()
                    .zip(params.iter())
                    .try_for_each(|(v, &p)| backend.accumulate(s, v, &main_grads[p]))
            })?;
        }
    }
    let per_runner = replayable.fence_stats();
    // The same schedule, compiled once into one step graph: each further
    // step is one launch, its waits are the graph's edges.
    {
        let mut step = replayable.step();
        for (r, (_, params)) in RUNNERS.iter().enumerate() {
            let runner = RunnerId(r as u32);
            step.replay(runner, &pool[lane[r]])?;
            step.consume(runner, &rs_stream, |s, views| {
                views
                    .iter()
                    .zip(params.iter())
                    .try_for_each(|(v, &p)| backend.accumulate(s, v, &main_grads[p]))
            })?;
        }
        let mut graph = step.build()?;
        for _ in 0..STEPS {
            graph.launch(&pool[0])?;
        }
        say(format!(
            "step graph: one step compiled into one graph of {} child graphs, one per replay ({}) and\n\
             per consumer ({}) of the schedule, and {} edges (the fence's waits between them, and\n\
             stream order); {STEPS} steps, one launch each",
            graph.nodes(),
            RUNNERS.len(),
            RUNNERS.len(),
            graph.edges()
        ));
    } // dropping it hands the plan back
    let trace = replayable.finish_trace()?;
    let path = std::env::temp_dir().join(format!(
        "replay-arena-quickstart.{}.json",
        backend.backend().name()
    ));
    trace
        .write_chrome_json(&path)
        .map_err(|e| replay_arena::Error::Work(format!("{}: {e}", path.display()).into()))?;
    // Waits for work before the trace have no slice to draw an arrow from.
    let waits = || trace.uses().iter().flat_map(|s| &s.waits);
    let skipped = waits().filter(|w| w.skipped).count();
    let drawn = waits().filter(|w| !w.skipped && w.from.is_some()).count();
    let of = |category: &str| {
        let slices = trace.uses().iter();
        slices.filter(|s| s.kind.category() == category).count()
    };
    say(format!(
        "trace of the last 2 per-runner steps and the {STEPS} step graph launches: {} slices on {}\n\
         streams ({} replays and {} consumers, 2 steps' worth; {} wait for everything, which a step\n\
         graph's first launch begins with; {} launches), {drawn} waits drawn as arrows, {skipped}\n\
         skipped (stream order); open it at https://ui.perfetto.dev (\"Open trace file\") or in\n\
         Chrome's about:tracing; written to\n  {}",
        trace.uses().len(),
        trace.streams().len(),
        of("replay"),
        of("consume"),
        of("wait"),
        of("step"),
        path.display()
    ));
    replayable.synchronize()?;

    say(format!(
        "main grads after {} steps ({STEPS} runner by runner, {STEPS} step graph launches); each step\n\
         adds, per parameter, the sum of the wgrad values its runners write for it:",
        2 * STEPS
    ));
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
        // STEPS steps per runner, then STEPS launches of the step graph.
        let expected = per_step * (2 * STEPS) as f32;
        let got = backend.read(&main_grads[p])?;
        if let Some(bad) = got.iter().position(|&x| x != expected) {
            return Err(replay_arena::Error::Work(
                format!("{name}[{bad}] = {} but expected {expected}", got[bad]).into(),
            ));
        }
        say(format!(
            "  {name:<10} {expected} everywhere ({per_step} per step x {}): ok",
            2 * STEPS
        ));
    }
    let stats = replayable.fence_stats();
    say(format!(
        "{} replays and {} consumers on {}: {} waits on another stream, and {} more skipped\n\
         because stream order already implied them",
        per_runner.replays,
        per_runner.consumers,
        backend.backend().name(),
        per_runner.waits,
        per_runner.waits_skipped,
    ));
    say(format!(
        "then {} step graph launches, which waited {} times on another stream in all: for work the\n\
         per-runner steps left on other streams (inside a launch the waits are the graph's edges)",
        stats.step_launches - per_runner.step_launches,
        stats.waits - per_runner.waits,
    ));
    let outcome = Outcome {
        stats: per_runner,
        generations: generations as u64,
        runners_using: runners_using as u64,
        steps: STEPS as u64,
    };
    say(explain(&outcome));
    drop(replayable.replan()?);
    Ok(outcome)
}

/// Runs the pipeline on `sim`, then on the GPU when one is present,
/// passing each paragraph it prints to `say`.
pub(crate) fn quickstart(say: &mut dyn FnMut(String)) -> Result<()> {
    let sim = sim::Device::new();
    run(&sim, say)?;
    if !sim.hazards().is_empty() {
        return Err(replay_arena::Error::Work(
            format!("hazards on sim: {:?}", sim.hazards()).into(),
        ));
    }
    say(format!(
        "backend: sim (no hazards, {} allocations left)",
        sim.live_allocations()
    ));
    // The probe first: it returns an error where cudarc would panic (no
    // libcuda, no device).
    #[cfg(feature = "cuda")]
    match replay_arena::cuda::probe() {
        Ok(info) => {
            let gpu = gpu::Gpu::new(0)?;
            run(&gpu, say)?;
            say(format!("backend: cuda on {info}"));
        }
        Err(e) => say(format!("backend: cuda skipped, no usable GPU:\n  {e}")),
    }
    Ok(())
}

/// Prints an error as the sentence its `Display` writes, not as `Debug`.
fn main() -> std::process::ExitCode {
    match quickstart(&mut |paragraph| println!("{paragraph}")) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
