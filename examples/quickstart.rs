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
//! The last two per-runner steps and the step graph's launches are traced:
//! the fence's schedule is written as a Chrome trace file (one lane per
//! stream, an arrow per wait) whose path the example prints; open it at
//! <https://ui.perfetto.dev> ("Open trace file") or in Chrome's
//! `about:tracing` (docs/trace.md).
//!
//! Runs on the `sim` backend everywhere, and on the GPU (`cuda` backend) when
//! one is present.

use replay_arena::sim;
use replay_arena::{
    Backend, Compose, DType, Discovering, Domain, ParamId, PlanConfig, Policy, Purpose, ReadOnly,
    Replayable, Request, Result, RunnerId, Streams, Timing, View,
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
trait Kernels {
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

type Stream<K> = <<K as Kernels>::Backend as Streams>::Stream;

impl Kernels for sim::Device {
    type Backend = sim::Device;
    type Buffer = sim::HostBuffer;
    fn backend(&self) -> &sim::Device {
        self
    }
    fn new_stream(&self) -> Result<sim::Stream> {
        Ok(self.stream())
    }
    fn zeros(&self, len: usize) -> Result<sim::HostBuffer> {
        Ok(self.alloc_f32(len)?)
    }
    fn write_grad(&self, stream: &sim::Stream, view: &View<'_>, value: f32) -> Result<()> {
        Ok(self.launch(stream, sim::Op::fill(view, value), 20)?)
    }
    fn accumulate(
        &self,
        stream: &sim::Stream,
        view: &View<'_, ReadOnly>,
        out: &sim::HostBuffer,
    ) -> Result<()> {
        Ok(self.launch(stream, sim::Op::add(view, out), 50)?)
    }
    fn read(&self, out: &sim::HostBuffer) -> Result<Vec<f32>> {
        Ok(self.read_f32(out)?)
    }
}

#[cfg(feature = "cuda")]
mod gpu {
    //! The same kernels on the GPU, compiled with nvrtc at start.
    use super::Kernels;
    use replay_arena::cuda;
    use replay_arena::cuda::cudarc::driver::{
        CudaFunction, CudaSlice, DevicePtr, LaunchConfig, PushKernelArg,
    };
    use replay_arena::cuda::cudarc::nvrtc::compile_ptx;
    use replay_arena::{Error, ReadOnly, Result, Streams, View};

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

fn run<K: Kernels>(backend: &K) -> Result<()> {
    let planned = discover()?.plan(Policy::OverlapDepth(2))?;
    println!("{}", planned.report());

    let pool = [backend.new_stream()?, backend.new_stream()?];
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
            replayable.replay(runner, &pool[r % pool.len()])?;
            replayable.consume(runner, &rs_stream, |s, views| {
                views
                    .iter()
                    .zip(params.iter())
                    .try_for_each(|(v, &p)| backend.accumulate(s, v, &main_grads[p]))
            })?;
        }
    }
    // The same schedule, compiled once into one step graph: each further
    // step is one launch, its waits are the graph's edges.
    {
        let mut step = replayable.step();
        for (r, (_, params)) in RUNNERS.iter().enumerate() {
            let runner = RunnerId(r as u32);
            step.replay(runner, &pool[r % pool.len()])?;
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
        println!(
            "step graph: {} graphs, {} edges; {STEPS} steps, one launch each",
            graph.nodes(),
            graph.edges()
        );
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
    let waits = || trace.slices().iter().flat_map(|s| &s.waits);
    let skipped = waits().filter(|w| w.skipped).count();
    let drawn = waits().filter(|w| !w.skipped && w.from.is_some()).count();
    println!(
        "trace of the last 2 per-runner steps and the {STEPS} step graph launches: {} slices on {} streams, \
         {} waits drawn as arrows, {} skipped (stream order), written to {}\n\
         open it at https://ui.perfetto.dev (\"Open trace file\") or in Chrome's about:tracing",
        trace.slices().len(),
        trace.streams().len(),
        drawn,
        skipped,
        path.display()
    );
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
        // STEPS steps per runner, then STEPS launches of the step graph.
        let expected = per_step * (2 * STEPS) as f32;
        let got = backend.read(&main_grads[p])?;
        if let Some(bad) = got.iter().position(|&x| x != expected) {
            return Err(replay_arena::Error::Work(
                format!("{name}[{bad}] = {} but expected {expected}", got[bad]).into(),
            ));
        }
        println!(
            "{name:<10} main grad = {expected} everywhere after {} steps ({STEPS} replayed runner by runner, \
             {STEPS} step graph launches; {per_step} per step): ok",
            2 * STEPS
        );
    }
    let stats = replayable.fence_stats();
    println!(
        "{} replays and {} consumers on {}: {} waits on another stream, {} skipped because stream order already implied them; then {} step graph launches",
        stats.replays,
        stats.consumers,
        backend.backend().name(),
        stats.waits,
        stats.waits_skipped,
        stats.step_launches
    );
    println!(
        "What this shows: every main grad equals the eager sum exactly, so no wgrad view was overwritten while the\n\
         reduce-scatter stand-in still read it. Each replay waited only for the consumer that last read its\n\
         arena, and each consumer only for its runner's replay: one wait each, where they ran on different streams."
    );
    drop(replayable.replan()?);
    Ok(())
}

fn main() -> Result<()> {
    let sim = sim::Device::new();
    run(&sim)?;
    if !sim.hazards().is_empty() {
        eprintln!("hazards: {:?}", sim.hazards());
        std::process::exit(1);
    }
    println!(
        "backend: sim (no hazards, {} allocations left)",
        sim.live_allocations()
    );
    #[cfg(feature = "cuda")]
    match replay_arena::cuda::probe() {
        Ok(info) => {
            let gpu = gpu::Gpu::new(0)?;
            run(&gpu)?;
            println!("backend: cuda on {info}");
        }
        Err(e) => println!("backend: cuda skipped, no usable GPU ({e})"),
    }
    Ok(())
}
