//! Shared helpers of the GPU tests: the device, test kernels compiled with
//! nvrtc at run time, runner specs, and a host model of the kernels.
//!
//! Every value a kernel writes is an exactly representable `f32` or a
//! wrapping `u32`, so graph replays, eager runs and the host model agree
//! bit for bit.

use std::sync::OnceLock;

use replay_arena::backend::Streams;
use replay_arena::cuda;
use replay_arena::cuda::cudarc::driver::{
    sys, CudaFunction, CudaSlice, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg,
    ValidAsZeroBits,
};
use replay_arena::cuda::cudarc::nvrtc::{compile_ptx, Ptx};
use replay_arena::{
    Capturing, DType, Discovering, Domain, PlacedPolicy, PlanConfig, Planned, Purpose, Replayable,
    Request, RunnerCapture, RunnerId, View,
};

pub mod backward;
pub mod bucketed;
pub mod slow;
#[cfg(feature = "f16")]
pub mod tp;

/// Errors of test kernels: formatted cudarc errors (there is a driver here).
pub type K = std::result::Result<(), String>;

const SOURCE: &str = r#"
__device__ unsigned int mix(unsigned int x) {
    x ^= x >> 16; x *= 0x7feb352dU; x ^= x >> 15; x *= 0x846ca68bU; x ^= x >> 16;
    return x;
}

// A scratch buffer the wgrad kernels read: x[i] = mix(seed * 31 + i + step * 7919).
extern "C" __global__ void scratch(int* x, unsigned int m, const unsigned int* step, unsigned int seed) {
    unsigned int s = *step;
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < m; i += gridDim.x * blockDim.x)
        x[i] = (int)mix(seed * 31u + i + s * 7919u);
}

// A wgrad-like result: 20 hash bits / 16, plus a byte of the scratch (exact in f32).
extern "C" __global__ void wgrad(float* w, unsigned int n, const unsigned int* step, unsigned int seed,
                                 const int* x, unsigned int m) {
    unsigned int s = *step;
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float v = (float)(mix(seed ^ mix(i + 0x9e3779b9U * s)) & 0xFFFFFu) * 0.0625f;
        if (m != 0) v += (float)(((unsigned int)x[i % m]) & 0xFFu);
        w[i] = v;
    }
}

// The runner's step counter, advanced once per replay.
extern "C" __global__ void bump(unsigned int* step) {
    if (blockIdx.x == 0 && threadIdx.x == 0) *step += 1;
}

// The consumer (a reduce-scatter stand-in): reads w twice, `spin` clock
// cycles apart, counts torn reads, and folds the first read into out.
extern "C" __global__ void consume(unsigned int* out, const float* w, unsigned int n,
                                   long long spin, unsigned int* torn) {
    const volatile float* vw = w;
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        unsigned int a = __float_as_uint(vw[i]);
        if (spin > 0) {
            long long t0 = clock64();
            while (clock64() - t0 < spin) { }
        }
        unsigned int b = __float_as_uint(vw[i]);
        if (a != b) atomicAdd(torn, 1u);
        out[i] = out[i] * 1664525u + a;
    }
}
"#;

/// `source` compiled once (cached in `cell`), loaded into the backend's
/// context, and the functions of `names` from it, in that order.
pub fn load_kernels<const K: usize>(
    backend: &cuda::Device,
    cell: &OnceLock<String>,
    source: &str,
    names: [&str; K],
) -> [CudaFunction; K] {
    let src = cell.get_or_init(|| {
        compile_ptx(source)
            .unwrap_or_else(|e| panic!("nvrtc failed: {e:?}"))
            .to_src()
    });
    let module = backend
        .context()
        .load_module(Ptx::from_src(src.clone()))
        .unwrap_or_else(|e| panic!("loading the test kernels: {e:?}"));
    names.map(|name| {
        module
            .load_function(name)
            .unwrap_or_else(|e| panic!("kernel {name}: {e:?}"))
    })
}

/// The device and the test kernels loaded into its context.
pub struct Gpu {
    /// The backend under test.
    pub backend: cuda::Device,
    /// A stream for setup and read-back.
    pub io: cuda::Stream,
    scratch: CudaFunction,
    wgrad: CudaFunction,
    bump: CudaFunction,
    consume: CudaFunction,
}

/// Opens device 0; these tests are ignored by default and fail without a GPU.
pub fn gpu() -> Gpu {
    gpu_on(0)
}

/// Opens device `ordinal` and loads the test kernels into its context.
pub fn gpu_on(ordinal: usize) -> Gpu {
    let backend = cuda::Device::new(ordinal)
        .unwrap_or_else(|e| panic!("this test needs a CUDA GPU (run it on the GPU machine): {e}"));
    static PTX: OnceLock<String> = OnceLock::new();
    let [scratch, wgrad, bump, consume] = load_kernels(
        &backend,
        &PTX,
        SOURCE,
        ["scratch", "wgrad", "bump", "consume"],
    );
    let io = backend.new_stream().expect("io stream");
    Gpu {
        scratch,
        wgrad,
        bump,
        consume,
        io,
        backend,
    }
}

/// Device 0, for a test that loads no test kernels (probed first: without
/// a driver, the test fails with the probe's reason).
pub fn device() -> cuda::Device {
    cuda::probe().unwrap_or_else(|e| panic!("this test needs a CUDA GPU: {e}"));
    cuda::Device::new(0).unwrap_or_else(|e| panic!("this test needs a CUDA GPU: {e}"))
}

/// `runners` (each a runner and its requests) discovered in one go under
/// `config`, and planned with `policy`.
pub fn plan_with<R: IntoIterator<Item = Request>>(
    config: PlanConfig,
    runners: impl IntoIterator<Item = (RunnerId, R)>,
    policy: impl Into<PlacedPolicy>,
) -> Planned {
    Discovering::from_runners(config, runners)
        .unwrap()
        .plan(policy)
        .unwrap()
}

/// [`plan_with`] the default config.
pub fn plan<R: IntoIterator<Item = Request>>(
    runners: impl IntoIterator<Item = (RunnerId, R)>,
    policy: impl Into<PlacedPolicy>,
) -> Planned {
    plan_with(PlanConfig::new(), runners, policy)
}

/// [`plan`], allocated on `backend`.
pub fn allocate<R: IntoIterator<Item = Request>>(
    backend: &cuda::Device,
    runners: impl IntoIterator<Item = (RunnerId, R)>,
    policy: impl Into<PlacedPolicy>,
) -> Capturing<cuda::Device> {
    plan(runners, policy).allocate(backend.clone()).unwrap()
}

/// One runner (0) that reduce-scatters a view of `comm`'s symmetric
/// domain (as many f32s as `recv` holds) into `recv`: planned in one
/// generation under a config naming the group `gtp`, allocated on an NCCL
/// backend over `b` with `comm`. Returns the symmetric request too.
#[cfg(feature = "nccl")]
pub fn reduce_scatter_plan(
    b: &cuda::Device,
    comm: &replay_arena::nccl::Communicator,
    recv: Request,
) -> (Capturing<replay_arena::nccl::Device>, Request) {
    let group = comm.group();
    let backend = replay_arena::nccl::Device::new(b.clone())
        .with_group(comm.clone())
        .unwrap();
    let sym = Request::new(Domain::Symmetric(group), DType::F32, recv.elements);
    let config = PlanConfig::new().with_group(group, "gtp").unwrap();
    let planned = plan_with(
        config,
        [(RunnerId(0), [sym, recv])],
        replay_arena::Policy::Generations(1),
    );
    (planned.allocate(backend).unwrap(), sym)
}

/// A grid-stride launch over `n` elements.
pub fn cfg(n: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(256).clamp(1, 512), 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A launch error, formatted.
pub fn err(e: impl std::fmt::Debug) -> String {
    format!("{e:?}")
}

impl Gpu {
    /// `x[i] = mix(seed * 31 + i + step * 7919)` for `i < m`.
    pub fn scratch(&self, s: &cuda::Stream, x: u64, m: u32, step: u64, seed: u32) -> K {
        let mut b = s.cudarc().launch_builder(&self.scratch);
        b.arg(&x).arg(&m).arg(&step).arg(&seed);
        unsafe { b.launch(cfg(m)) }.map(drop).map_err(err)
    }

    /// The wgrad kernel (see [`host_wgrad`]).
    #[allow(clippy::too_many_arguments)]
    pub fn wgrad(
        &self,
        s: &cuda::Stream,
        w: u64,
        n: u32,
        step: u64,
        seed: u32,
        x: u64,
        m: u32,
    ) -> K {
        let mut b = s.cudarc().launch_builder(&self.wgrad);
        b.arg(&w).arg(&n).arg(&step).arg(&seed).arg(&x).arg(&m);
        unsafe { b.launch(cfg(n)) }.map(drop).map_err(err)
    }

    /// `*step += 1`.
    pub fn bump(&self, s: &cuda::Stream, step: u64) -> K {
        let mut b = s.cudarc().launch_builder(&self.bump);
        b.arg(&step);
        unsafe { b.launch(cfg(1)) }.map(drop).map_err(err)
    }

    /// `out[i] = out[i] * 1664525 + bits(w[i])`, reading `w[i]` twice `spin`
    /// cycles apart and counting torn reads in `*torn`. `blocks` limits the
    /// grid (a slow consumer uses few blocks so it overlaps other work).
    #[allow(clippy::too_many_arguments)]
    pub fn consume(
        &self,
        s: &cuda::Stream,
        out: u64,
        w: u64,
        n: u32,
        spin: i64,
        torn: u64,
        blocks: Option<u32>,
    ) -> K {
        let mut b = s.cudarc().launch_builder(&self.consume);
        b.arg(&out).arg(&w).arg(&n).arg(&spin).arg(&torn);
        let mut c = cfg(n);
        if let Some(blocks) = blocks {
            c.grid_dim.0 = blocks;
        }
        unsafe { b.launch(c) }.map(drop).map_err(err)
    }

    /// A zeroed device buffer (ready when this returns).
    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, len: usize) -> CudaSlice<T> {
        let buf = self.io.cudarc().alloc_zeros::<T>(len).expect("alloc");
        self.io.synchronize().expect("sync");
        buf
    }

    /// The raw address of a buffer.
    pub fn ptr<T>(&self, buf: &CudaSlice<T>) -> u64 {
        buf.device_ptr(self.io.cudarc()).0
    }

    /// Waits for all work, then copies a buffer to the host.
    pub fn read<T: DeviceRepr + Default + Clone>(&self, buf: &CudaSlice<T>) -> Vec<T> {
        self.backend.synchronize().expect("synchronize");
        let v = self.io.cudarc().clone_dtoh(buf).expect("dtoh");
        self.io.synchronize().expect("sync");
        v
    }

    /// Waits for all work, then copies `len` elements at a raw address (a
    /// view) to the host.
    pub fn read_raw<T: DeviceRepr + Default + Clone>(&self, addr: u64, len: usize) -> Vec<T> {
        self.backend.synchronize().expect("synchronize");
        let mut host = vec![T::default(); len];
        self.backend.context().bind_to_thread().expect("bind");
        let code = unsafe {
            sys::cuMemcpyDtoH_v2(
                host.as_mut_ptr().cast(),
                addr,
                len * std::mem::size_of::<T>(),
            )
        };
        assert_eq!(code, sys::CUresult::CUDA_SUCCESS, "cuMemcpyDtoH");
        host
    }

    /// Free device memory in bytes, after a synchronize and after returning
    /// graph-pool memory to the driver.
    pub fn free_memory(&self) -> u64 {
        self.backend.synchronize().expect("synchronize");
        let device = self.backend.context().cu_device();
        let code = unsafe { sys::cuDeviceGraphMemTrim(device) };
        assert_eq!(code, sys::CUresult::CUDA_SUCCESS, "cuDeviceGraphMemTrim");
        self.backend.mem_info().expect("cuMemGetInfo").0
    }
}

/// One runner of a test pipeline: its wgrad sizes (f32 views, consumed) and
/// an optional i32 scratch view the wgrads read.
#[derive(Clone, Debug)]
pub struct Spec {
    /// Elements of each wgrad view.
    pub wgrads: Vec<u32>,
    /// Elements of the scratch view.
    pub scratch: Option<u32>,
    /// Distinguishes runners' values.
    pub seed: u32,
}

impl Spec {
    /// A runner with these wgrad sizes and scratch.
    pub fn new(seed: u32, wgrads: &[u32], scratch: Option<u32>) -> Spec {
        Spec {
            wgrads: wgrads.to_vec(),
            scratch,
            seed,
        }
    }

    /// Its requests, in order: scratch first, then the wgrads.
    pub fn requests(&self) -> Vec<Request> {
        let mut r = Vec::new();
        if let Some(m) = self.scratch {
            r.push(Request::new(Domain::Device, DType::I32, m.into()).purpose(Purpose::Other));
        }
        for &n in &self.wgrads {
            r.push(
                Request::new(Domain::Device, DType::F32, n.into()).purpose(Purpose::WgradRsInput),
            );
        }
        r
    }

    /// Seed of wgrad `j`.
    pub fn wgrad_seed(&self, j: usize) -> u32 {
        self.seed.wrapping_mul(1000).wrapping_add(j as u32)
    }

    /// Submits the runner's "backward" to `s`: scratch, each wgrad, then the
    /// step bump. `x` and `w` are the scratch and wgrad addresses.
    pub fn submit(&self, g: &Gpu, s: &cuda::Stream, step: u64, x: Option<u64>, w: &[u64]) -> K {
        let (x, m) = match (x, self.scratch) {
            (Some(x), Some(m)) => {
                g.scratch(s, x, m, step, self.seed)?;
                (x, m)
            }
            _ => (0, 0),
        };
        for (j, (&w, &n)) in w.iter().zip(&self.wgrads).enumerate() {
            g.wgrad(s, w, n, step, self.wgrad_seed(j), x, m)?;
        }
        g.bump(s, step)
    }

    /// Takes this runner's views in `cap`, records its backward on `stream`
    /// (step counter at `step`) and finishes the capture.
    pub fn capture(
        &self,
        g: &Gpu,
        cap: RunnerCapture<'_, cuda::Device>,
        step: u64,
        stream: &cuda::Stream,
    ) {
        let views = self.take(&cap);
        let (x, w) = self.split(&views);
        cap.stream_capture(stream, |s| self.submit(g, s, step, x, &w))
            .unwrap();
        cap.finish().unwrap();
    }

    /// Takes this runner's views in `cap`, in request order.
    pub fn take<'c>(&self, cap: &'c RunnerCapture<'_, cuda::Device>) -> Vec<View<'c>> {
        self.requests()
            .into_iter()
            .map(|q| cap.take(q).unwrap())
            .collect()
    }

    /// Splits a runner's views (in request order) into (scratch, wgrads).
    pub fn split<A: replay_arena::Access>(&self, views: &[View<'_, A>]) -> (Option<u64>, Vec<u64>) {
        let skip = usize::from(self.scratch.is_some());
        let x = self.scratch.map(|_| views[0].device_address());
        (x, views[skip..].iter().map(View::device_address).collect())
    }
}

/// Discovery of `specs`: runner `r` records spec `r`'s requests.
pub fn discover_specs(specs: &[Spec]) -> Discovering {
    let runners = specs
        .iter()
        .enumerate()
        .map(|(r, spec)| (RunnerId(r as u32), spec.requests()));
    Discovering::from_runners(PlanConfig::new(), runners).expect("discovery of the specs")
}

/// Allocates `planned` and captures every spec's runner (runner `r` on
/// `pool[r % pool.len()]`, its step counter in `states[r]`), then seals.
pub fn capture_specs(
    g: &Gpu,
    planned: Planned,
    specs: &[Spec],
    states: &[State],
    pool: &[cuda::Stream],
) -> Replayable<cuda::Device> {
    let mut capturing = planned.allocate(g.backend.clone()).expect("allocate");
    for (r, spec) in specs.iter().enumerate() {
        let cap = capturing.capture(RunnerId(r as u32)).expect("capture");
        spec.capture(g, cap, g.ptr(&states[r].step), &pool[r % pool.len()]);
    }
    capturing.seal().expect("seal")
}

/// Per-runner buffers outside the plan: step counter and consumer outputs.
pub struct State {
    /// The step counter the runner's graph reads and bumps.
    pub step: CudaSlice<u32>,
    /// One consumer output per wgrad.
    pub outs: Vec<CudaSlice<u32>>,
}

impl State {
    /// Zeroed state for `spec`.
    pub fn new(g: &Gpu, spec: &Spec) -> State {
        State {
            step: g.zeros(1),
            outs: spec.wgrads.iter().map(|&n| g.zeros(n as usize)).collect(),
        }
    }

    /// Host copies of the outputs.
    pub fn read_outs(&self, g: &Gpu) -> Vec<Vec<u32>> {
        self.outs.iter().map(|o| g.read(o)).collect()
    }

    /// The consumer of `spec`'s runner: folds each wgrad of its `views` (in
    /// request order) into its output on `s` with [`Gpu::consume`], torn
    /// reads counted in `torn`.
    #[allow(clippy::too_many_arguments)]
    pub fn fold<A: replay_arena::Access>(
        &self,
        g: &Gpu,
        spec: &Spec,
        s: &cuda::Stream,
        views: &[View<'_, A>],
        torn: &CudaSlice<u32>,
        spin: i64,
        blocks: Option<u32>,
    ) -> K {
        let (_, w) = spec.split(views);
        for ((out, &w), &n) in self.outs.iter().zip(&w).zip(&spec.wgrads) {
            g.consume(s, g.ptr(out), w, n, spin, g.ptr(torn), blocks)?;
        }
        Ok(())
    }
}

/// What replays of the specs' runners use beside the plan: a pool of
/// streams to replay on, a stream for the consumers, each runner's state,
/// and the count of torn reads.
pub struct Rig {
    /// The streams the runners replay on (and are captured on).
    pub pool: Vec<cuda::Stream>,
    /// The consumers' stream.
    pub consumer: cuda::Stream,
    /// Runner `r`'s step counter and outputs.
    pub states: Vec<State>,
    /// Reads that saw an element change under them.
    pub torn: CudaSlice<u32>,
}

impl Rig {
    /// A pool of `streams` streams, the consumer's, and zeroed state.
    pub fn new(g: &Gpu, specs: &[Spec], streams: usize) -> Rig {
        let pool = (0..streams)
            .map(|_| g.backend.new_stream().unwrap())
            .collect();
        let consumer = g.backend.new_stream().unwrap();
        let states = specs.iter().map(|s| State::new(g, s)).collect();
        Rig {
            pool,
            consumer,
            states,
            torn: g.zeros(1),
        }
    }

    /// [`State::fold`] of runner `r`.
    #[allow(clippy::too_many_arguments)]
    pub fn fold<A: replay_arena::Access>(
        &self,
        g: &Gpu,
        spec: &Spec,
        r: usize,
        s: &cuda::Stream,
        views: &[View<'_, A>],
        spin: i64,
        blocks: Option<u32>,
    ) -> K {
        self.states[r].fold(g, spec, s, views, &self.torn, spin, blocks)
    }

    /// Replays runner `r` on pool stream `lane` (modulo the pool), then
    /// folds its wgrads into its outputs on the consumer stream.
    pub fn replay_and_fold(
        &self,
        g: &Gpu,
        replayable: &mut Replayable<cuda::Device>,
        spec: &Spec,
        r: usize,
        lane: usize,
    ) {
        let runner = RunnerId(r as u32);
        replayable
            .replay(runner, &self.pool[lane % self.pool.len()])
            .unwrap();
        replayable
            .consume(runner, &self.consumer, |s, views| {
                self.fold(g, spec, r, s, views, 0, None)
            })
            .unwrap();
    }

    /// Host copies of every runner's outputs.
    pub fn outs(&self, g: &Gpu) -> Vec<Vec<Vec<u32>>> {
        self.states.iter().map(|s| s.read_outs(g)).collect()
    }
}

/// The eager reference: the same kernels, uncaptured, on one stream, with
/// buffers of their own; returns each runner's consumer outputs.
pub fn eager(g: &Gpu, specs: &[Spec], steps: usize) -> Vec<Vec<Vec<u32>>> {
    let s = g.backend.new_stream().expect("stream");
    let torn: CudaSlice<u32> = g.zeros(1);
    type Buffers = (State, Option<CudaSlice<i32>>, Vec<CudaSlice<f32>>);
    let bufs: Vec<Buffers> = specs
        .iter()
        .map(|spec| {
            (
                State::new(g, spec),
                spec.scratch.map(|m| g.zeros(m as usize)),
                spec.wgrads.iter().map(|&n| g.zeros(n as usize)).collect(),
            )
        })
        .collect();
    for _ in 0..steps {
        for (spec, (state, x, w)) in specs.iter().zip(&bufs) {
            if spec.wgrads.is_empty() {
                continue;
            }
            let w: Vec<u64> = w.iter().map(|b| g.ptr(b)).collect();
            spec.submit(g, &s, g.ptr(&state.step), x.as_ref().map(|x| g.ptr(x)), &w)
                .expect("eager runner");
            for ((out, &w), &n) in state.outs.iter().zip(&w).zip(&spec.wgrads) {
                g.consume(&s, g.ptr(out), w, n, 0, g.ptr(&torn), None)
                    .expect("eager consumer");
            }
        }
    }
    s.synchronize().expect("eager sync");
    assert_eq!(g.read(&torn), vec![0], "the eager run has no concurrency");
    bufs.iter()
        .map(|(state, _, _)| state.read_outs(g))
        .collect()
}

/// Host model of `mix`.
pub fn mix(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846ca68b);
    x ^= x >> 16;
    x
}

/// Host model of wgrad `j` of `spec` at step `s`, element `i`.
pub fn host_wgrad(spec: &Spec, j: usize, s: u32, i: u32) -> f32 {
    let seed = spec.wgrad_seed(j);
    let mut v =
        (mix(seed ^ mix(i.wrapping_add(0x9e3779b9u32.wrapping_mul(s)))) & 0xFFFFF) as f32 * 0.0625;
    if let Some(m) = spec.scratch {
        let x = mix(spec
            .seed
            .wrapping_mul(31)
            .wrapping_add(i % m)
            .wrapping_add(s.wrapping_mul(7919)));
        v += (x & 0xFF) as f32;
    }
    v
}

/// Host model of the consumer outputs after `steps` steps.
pub fn host_outputs(spec: &Spec, steps: u32) -> Vec<Vec<u32>> {
    spec.wgrads
        .iter()
        .enumerate()
        .map(|(j, &n)| {
            (0..n)
                .map(|i| {
                    (0..steps).fold(0u32, |out, s| {
                        out.wrapping_mul(1664525)
                            .wrapping_add(host_wgrad(spec, j, s, i).to_bits())
                    })
                })
                .collect()
        })
        .collect()
}

/// Number of elements that differ.
pub fn mismatches(a: &[Vec<Vec<u32>>], b: &[Vec<Vec<u32>>]) -> usize {
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| x.iter().zip(y).filter(|(p, q)| p != q).count() + x.len().abs_diff(y.len()))
        .sum()
}
