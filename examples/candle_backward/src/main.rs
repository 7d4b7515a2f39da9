//! A candle-core 0.11 program adopting replay-arena: the backward of a
//! 5-layer bf16 linear stack, one runner per layer, each layer's dX handed
//! to the next layer as a handoff, dW and a cuBLAS workspace as requests,
//! replayed on a pool of two streams, with an FP32 main-grad consumer per
//! layer on candle's stream. docs/integration.md ("A candle program") walks
//! through it.
//!
//! Three ways to run a step, timed against each other:
//! - `eager`: candle's ops, as the program runs without graphs (and
//!   `eager+copies`: the same plus the copies the graphed step makes);
//! - `graphed (copies)`: the same candle ops captured; what they allocate
//!   is copied into the plan's views with `ViewExt::copy_from`, received
//!   handoffs copied out with `copy_into`. No `unsafe` in the backward;
//! - `graphed (gemm into views)`: dX and dW computed by cuBLAS straight
//!   into views lent with `with_cudarc_mut`, reading the received handoff
//!   through `with_cudarc` (lends are `unsafe`: the GEMMs stay on the
//!   capture stream): no copy in the graph (one `unsafe` cuBLAS call
//!   per GEMM, as cudarc's `gemm` is `unsafe`);
//! - `step graph (...)`: both captures again as one step graph per step
//!   (`Replayable::step`), launched once per step. Its consumers add each
//!   dW into its FP32 main grad in place (one kernel; candle's `add` makes
//!   a new tensor, which a graph cannot hand back). In the copies mode
//!   every runner's graph allocates (candle's ops), so its step copy is
//!   moved in (`stream_capture_repeatable`).
//!
//! Build and run on a CUDA machine (candle builds its kernels with nvcc):
//!
//! ```sh
//! cargo run --release --manifest-path examples/candle_backward/Cargo.toml
//! cargo run --release --manifest-path examples/candle_backward/Cargo.toml -- 8192 4096
//! ```

use std::time::Instant;

use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, DType as CDType, Device, Storage, Tensor};
use half::bf16;
use replay_arena::cublas::with_workspace;
use replay_arena::cuda::cudarc::cublas::sys::cublasOperation_t;
use replay_arena::cuda::cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use replay_arena::cuda::cudarc::driver::{
    sys, CudaFunction, CudaSlice, CudaView, DevicePtr, LaunchConfig, PushKernelArg,
};
use replay_arena::cuda::cudarc::nvrtc::compile_ptx;
use replay_arena::cuda::{self, ViewExt};
use replay_arena::{
    BackendError, CaptureError, DType, Discovering, Domain, HandoffId, PlanConfig, Policy, Purpose,
    Replayable, Request, RunnerId, ViewsExt,
};

const LAYERS: usize = 5;

/// The step graph's consumer: `main[i] += dw[i]` in place, dW bf16 (its
/// bits widened exactly, as candle's `to_dtype(F32)` does), main FP32.
const ACCUMULATE: &str = r#"
extern "C" __global__ void accumulate(float* main, const unsigned short* dw, unsigned int n) {
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        main[i] += __uint_as_float(((unsigned int)dw[i]) << 16);
}
"#;

/// What a closure of this program can fail with: the crate, or candle.
#[derive(Debug, thiserror::Error)]
enum Fail {
    #[error(transparent)]
    Arena(#[from] replay_arena::Error),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    #[error("{0}")]
    Other(String),
}

impl From<BackendError> for Fail {
    fn from(e: BackendError) -> Fail {
        Fail::Arena(e.into())
    }
}

impl From<CaptureError> for Fail {
    fn from(e: CaptureError) -> Fail {
        Fail::Arena(e.into())
    }
}

impl From<replay_arena::WaitError> for Fail {
    fn from(e: replay_arena::WaitError) -> Fail {
        Fail::Arena(e.into())
    }
}

impl From<replay_arena::ReplayError> for Fail {
    fn from(e: replay_arena::ReplayError) -> Fail {
        Fail::Arena(e.into())
    }
}

impl From<replay_arena::cuda::cudarc::driver::DriverError> for Fail {
    fn from(e: replay_arena::cuda::cudarc::driver::DriverError) -> Fail {
        Fail::Arena(BackendError::from(e).into())
    }
}

type R<T> = std::result::Result<T, Fail>;

/// The bf16 device slice of a contiguous tensor candle allocated (an op's
/// output), for `f`.
fn with_slice<T>(t: &Tensor, f: impl FnOnce(CudaView<'_, bf16>) -> R<T>) -> R<T> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cuda(cuda) = &*storage else {
        return Err(Fail::Other("not a CUDA tensor".into()));
    };
    let start = layout.start_offset();
    if !layout.is_contiguous() {
        return Err(Fail::Other("not contiguous".into()));
    }
    let slice = cuda.as_cuda_slice::<bf16>()?;
    f(slice.slice(start..start + t.elem_count()))
}

/// A candle tensor that owns `slice` (freed when the tensor is dropped).
fn tensor_of(slice: CudaSlice<bf16>, shape: (usize, usize), dev: &CudaDevice) -> Tensor {
    let storage = Storage::Cuda(CudaStorage::wrap_cuda_slice(slice, dev.clone()));
    Tensor::from_storage(storage, shape, BackpropOp::none(), false)
}

/// One layer's backward in candle: `dX = dY W`, `dW = dY^T X`.
fn layer(dy: &Tensor, x: &Tensor, w: &Tensor) -> candle_core::Result<(Tensor, Tensor)> {
    let dx = dy.matmul(w)?;
    let dw = dy.t()?.matmul(x)?;
    Ok((dx, dw))
}

struct Model {
    device: Device,
    cdev: CudaDevice,
    backend: cuda::Device,
    /// candle's stream, adopted.
    stream: cuda::Stream,
    blas: std::sync::Arc<CudaBlas>,
    accumulate: CudaFunction,
    b: usize,
    d: usize,
    xs: Vec<Tensor>,
    ws: Vec<Tensor>,
    dy0: Tensor,
}

fn requests(b: usize, d: usize) -> (Request, Request, Request) {
    let wgrad =
        Request::new(Domain::Device, DType::BF16, (d * d) as u64).purpose(Purpose::WgradRsInput);
    let grad = Request::new(Domain::Device, DType::BF16, (b * d) as u64);
    let workspace = Request::new(Domain::Device, DType::U8, 32 << 20);
    (wgrad, grad, workspace)
}

impl Model {
    fn new(b: usize, d: usize) -> R<Model> {
        let device = candle_core::Device::new_cuda(0)?;
        let cdev = device.as_cuda_device()?.clone();
        // SAFETY: candle runs on its one stream; the plan's streams are
        // ordered by the crate's fence. Called before any tensor exists.
        unsafe { cdev.disable_event_tracking() };
        let backend = cuda::Device::from_context(cdev.cuda_stream().context().clone())?;
        let stream = backend.wrap_stream(cdev.cuda_stream())?;
        let scale = 1.0 / (d as f64).sqrt();
        let randn = |shape: (usize, usize), std: f64| -> R<Tensor> {
            Ok(Tensor::randn(0f32, std as f32, shape, &device)?.to_dtype(CDType::BF16)?)
        };
        let xs = (0..LAYERS)
            .map(|_| randn((b, d), 1.0))
            .collect::<R<Vec<_>>>()?;
        let ws = (0..LAYERS)
            .map(|_| randn((d, d), scale))
            .collect::<R<Vec<_>>>()?;
        let dy0 = randn((b, d), 1.0)?;
        stream.synchronize()?;
        let blas = cdev.cublas_handle();
        let ptx = compile_ptx(ACCUMULATE).map_err(|e| Fail::Other(format!("{e:?}")))?;
        let accumulate = backend
            .context()
            .load_module(ptx)?
            .load_function("accumulate")?;
        Ok(Model {
            device,
            cdev,
            backend,
            stream,
            blas,
            accumulate,
            b,
            d,
            xs,
            ws,
            dy0,
        })
    }

    fn zeros(&self) -> R<Vec<Tensor>> {
        (0..LAYERS)
            .map(|_| Ok(Tensor::zeros((self.d, self.d), CDType::F32, &self.device)?))
            .collect()
    }

    /// `steps` eager steps; with `copies`, also the dtod copies the
    /// graphed step makes (dX and dW into buffers of their own); with
    /// `in_place`, dW added into the main grad by the step graph's
    /// consumer kernel, not by candle's `to_dtype` + `add`.
    fn eager(&self, steps: usize, copies: bool, in_place: bool, main: &mut [Tensor]) -> R<f64> {
        let s = &self.stream;
        let mut ws: CudaSlice<u8> = s.cudarc().alloc_zeros(32 << 20)?;
        let mut dx_buf: CudaSlice<bf16> = s.cudarc().alloc_zeros(self.b * self.d)?;
        let mut dw_buf: CudaSlice<bf16> = s.cudarc().alloc_zeros(self.d * self.d)?;
        s.synchronize()?;
        let t0 = Instant::now();
        // The same workspace size as the graphs', so cuBLAS picks the same
        // algorithms.
        with_workspace(&self.blas, s, &mut ws, |_| -> R<()> {
            for _ in 0..steps {
                let mut dy = self.dy0.clone();
                for (l, main) in main.iter_mut().enumerate() {
                    let (dx, dw) = layer(&dy, &self.xs[l], &self.ws[l])?;
                    if copies {
                        with_slice(&dx, |v| Ok(s.cudarc().memcpy_dtod(&v, &mut dx_buf)?))?;
                        with_slice(&dw, |v| Ok(s.cudarc().memcpy_dtod(&v, &mut dw_buf)?))?;
                    }
                    if in_place {
                        let m = f32_address(main, s)?;
                        let d = with_slice(&dw, |v| Ok(v.device_ptr(s.cudarc()).0))?;
                        self.accumulate_at(s, m, d)?;
                    } else {
                        *main = main.add(&dw.to_dtype(CDType::F32)?)?;
                    }
                    dy = dx;
                }
            }
            Ok(())
        })?;
        s.synchronize()?;
        Ok(t0.elapsed().as_secs_f64() * 1e3 / steps as f64)
    }

    fn discover(&self) -> R<(Discovering, Vec<HandoffId>)> {
        let (wgrad, grad, workspace) = requests(self.b, self.d);
        let mut discovery = Discovering::new(PlanConfig::new());
        let mut handoffs = Vec::new();
        for l in 0..LAYERS {
            let mut armed = discovery
                .arm_named(RunnerId(l as u32), format!("layer{l}.bwd"))
                .map_err(replay_arena::Error::from)?;
            armed.record(wgrad).map_err(replay_arena::Error::from)?;
            if l > 0 {
                armed
                    .receive(handoffs[l - 1])
                    .map_err(replay_arena::Error::from)?;
            }
            if l + 1 < LAYERS {
                handoffs.push(armed.hand_off(grad).map_err(replay_arena::Error::from)?);
            }
            armed.record(workspace).map_err(replay_arena::Error::from)?;
        }
        Ok((discovery, handoffs))
    }

    /// Captures every layer; `gemm`: cuBLAS straight into views, else
    /// candle's ops and copies; `lazy`: runner graphs instantiated at their
    /// first replay (`with_lazy_instantiation`).
    fn capture(&self, gemm: bool, lazy: bool) -> R<Replayable<cuda::Device>> {
        let (wgrad, _, workspace) = requests(self.b, self.d);
        let (discovery, handoffs) = self.discover()?;
        let planned = discovery
            .plan(Policy::OverlapDepth(2))
            .map_err(replay_arena::Error::from)?;
        let mut capturing = planned
            .allocate(self.backend.clone().with_lazy_instantiation(lazy))
            .map_err(replay_arena::Error::from)?;
        // candle uploads small layout and scalar operands with
        // `clone_htod`; inside a capture it must keep them (cached).
        let _htod_cache = self.cdev.enable_cuda_graph_htod_cache();
        for l in 0..LAYERS {
            let cap = capturing.capture(RunnerId(l as u32))?;
            let wg = cap.take(wgrad)?;
            let ws = cap.take(workspace)?;
            let dy_view = if l > 0 {
                Some(cap.receive(handoffs[l - 1])?)
            } else {
                None
            };
            let dx_view = if l + 1 < LAYERS {
                Some((handoffs[l], cap.hand_off(handoffs[l])?))
            } else {
                None
            };
            let ready = |s: &cuda::Stream| -> R<()> {
                if let Some((h, _)) = dx_view {
                    cap.ready(h, s)?;
                }
                Ok(())
            };
            // Repeatable: where candle's ops allocate, a second capture is
            // the step copy a step graph moves in.
            cap.stream_capture_repeatable(&self.stream, |s| -> R<()> {
                let mut ws = ws.as_cuda::<u8>(s)?;
                with_workspace(&self.blas, s, &mut ws, |blas| -> R<()> {
                    if gemm {
                        let (x, w) = (&self.xs[l], &self.ws[l]);
                        let run = |dy: &CudaView<'_, bf16>| -> R<()> {
                            if let Some((_, v)) = &dx_view {
                                // SAFETY: the lent view's only work is this
                                // GEMM, which the handle enqueues on `s`.
                                unsafe {
                                    v.with_cudarc_mut(s, |mut dx| -> R<()> {
                                        with_slice(w, |w| {
                                            // SAFETY: row-major dX[b, d] = dY[b, d] W[d, d].
                                            blas.gemm(self.cfg_dx(), &w, dy, &mut dx)
                                                .map_err(BackendError::from)?;
                                            Ok(())
                                        })
                                    })
                                }?;
                            }
                            ready(s)?;
                            // SAFETY: as above, the GEMM on `s` only.
                            unsafe {
                                wg.with_cudarc_mut(s, |mut dw| -> R<()> {
                                    with_slice(x, |x| {
                                        // SAFETY: row-major dW[d, d] = dY^T X.
                                        blas.gemm(self.cfg_dw(), &x, dy, &mut dw)
                                            .map_err(BackendError::from)?;
                                        Ok(())
                                    })
                                })
                            }
                        };
                        match &dy_view {
                            // SAFETY: `run` puts its work on `s` only.
                            Some(v) => unsafe { v.with_cudarc(s, |dy| run(&dy)) },
                            None => with_slice(&self.dy0, |dy| run(&dy)),
                        }
                    } else {
                        // The received dY, copied into a tensor candle owns.
                        let dy = match &dy_view {
                            None => self.dy0.clone(),
                            Some(v) => {
                                let mut buf = s.cudarc().alloc_zeros::<bf16>(self.b * self.d)?;
                                v.copy_into(s, &mut buf)?;
                                tensor_of(buf, (self.b, self.d), &self.cdev)
                            }
                        };
                        let (dx, dw) = layer(&dy, &self.xs[l], &self.ws[l])?;
                        if let Some((_, v)) = &dx_view {
                            with_slice(&dx, |dx| Ok(v.copy_from(s, &dx)?))?;
                        }
                        ready(s)?;
                        with_slice(&dw, |dw| Ok(wg.copy_from(s, &dw)?))?;
                        // dy, dx, dw are dropped here: freed inside the graph.
                        Ok(())
                    }
                })
            })
            .map_err(|e| Fail::Other(format!("layer {l}: {e}")))?;
            cap.finish()?;
        }
        capturing.seal().map_err(|e| Fail::Other(e.to_string()))
    }

    fn cfg_dx(&self) -> GemmConfig<bf16> {
        // Column-major: dX^T[d, b] = W^T[d, d] dY^T[d, b].
        let (b, d) = (self.b as i32, self.d as i32);
        GemmConfig {
            transa: cublasOperation_t::CUBLAS_OP_N,
            transb: cublasOperation_t::CUBLAS_OP_N,
            m: d,
            n: b,
            k: d,
            alpha: bf16::ONE,
            lda: d,
            ldb: d,
            beta: bf16::ZERO,
            ldc: d,
        }
    }

    fn cfg_dw(&self) -> GemmConfig<bf16> {
        // Column-major: dW^T[d, d] = X^T[d, b] dY[b, d].
        let (b, d) = (self.b as i32, self.d as i32);
        GemmConfig {
            transa: cublasOperation_t::CUBLAS_OP_N,
            transb: cublasOperation_t::CUBLAS_OP_T,
            m: d,
            n: d,
            k: b,
            alpha: bf16::ONE,
            lda: d,
            ldb: d,
            beta: bf16::ZERO,
            ldc: d,
        }
    }

    /// `steps` graphed steps: every layer replayed on the pool, its dW
    /// accumulated into `main` by a consumer on candle's stream.
    fn graphed(
        &self,
        replayable: &mut Replayable<cuda::Device>,
        steps: usize,
        main: &mut [Tensor],
    ) -> R<f64> {
        let (wgrad, _, _) = requests(self.b, self.d);
        let pool = [self.backend.new_stream()?, self.backend.new_stream()?];
        let s = &self.stream;
        s.synchronize()?;
        let t0 = Instant::now();
        for _ in 0..steps {
            for (l, main) in main.iter_mut().enumerate() {
                let runner = RunnerId(l as u32);
                replayable.replay(runner, &pool[l % 2])?;
                // candle's ops run on candle's stream: consume there.
                replayable
                    .consume(runner, s, |s, views| -> R<()> {
                        // Views in request order: the wgrad, then the
                        // workspace; handoffs are not among them.
                        let v = views
                            .find(&wgrad)
                            .ok_or_else(|| Fail::Other("no wgrad".into()))?;
                        let mut buf = s.cudarc().alloc_zeros::<bf16>(self.d * self.d)?;
                        v.copy_into(s, &mut buf)?;
                        let dw = tensor_of(buf, (self.d, self.d), &self.cdev);
                        *main = main.add(&dw.to_dtype(CDType::F32)?)?;
                        Ok(())
                    })
                    .map_err(|e| Fail::Other(e.to_string()))?;
            }
        }
        replayable.wait_all(s)?;
        s.synchronize()?;
        Ok(t0.elapsed().as_secs_f64() * 1e3 / steps as f64)
    }
}

impl Model {
    /// `steps` launches of one step graph (after two warm-up launches,
    /// whose sums are cleared): every layer replayed on the pool, its dW
    /// added into `main` in place by a consumer on candle's stream. With
    /// the driver's graph memory reserved after it.
    fn stepped(
        &self,
        replayable: &mut Replayable<cuda::Device>,
        steps: usize,
        main: &mut [Tensor],
    ) -> R<(f64, f64)> {
        let (wgrad, _, _) = requests(self.b, self.d);
        let pool = [self.backend.new_stream()?, self.backend.new_stream()?];
        let s = &self.stream;
        let n = (self.d * self.d) as u32;
        let mains = main
            .iter()
            .map(|t| f32_address(t, s))
            .collect::<R<Vec<u64>>>()?;
        let mut step = replayable.step();
        for (l, &m) in mains.iter().enumerate() {
            let runner = RunnerId(l as u32);
            step.replay(runner, &pool[l % 2])
                .map_err(|e| Fail::Other(e.to_string()))?;
            step.consume(runner, s, |s, views| -> R<()> {
                let v = views
                    .find(&wgrad)
                    .ok_or_else(|| Fail::Other("no wgrad".into()))?;
                // The view, read on `s`, its consumer's stream.
                self.accumulate_at(s, m, v.device_address())
            })
            .map_err(|e| Fail::Other(e.to_string()))?;
        }
        let mut graph = step.build().map_err(|e| Fail::Other(e.to_string()))?;
        let launch = |graph: &mut replay_arena::StepGraph<'_, cuda::Device>| -> R<()> {
            graph.launch(s).map_err(|e| Fail::Other(e.to_string()))
        };
        for _ in 0..2 {
            launch(&mut graph)?;
        }
        graph.wait_all(s)?;
        for &m in &mains {
            // SAFETY: `m` holds `n` f32, cleared on `s` after the warm-up
            // launches' consumers (ordered before by `wait_all`).
            let code = unsafe { sys::cuMemsetD32Async(m, 0, n as usize, s.cudarc().cu_stream()) };
            if code != sys::CUresult::CUDA_SUCCESS {
                return Err(Fail::Other(format!("cuMemsetD32Async: {code:?}")));
            }
        }
        s.synchronize()?;
        let t0 = Instant::now();
        for _ in 0..steps {
            launch(&mut graph)?;
        }
        graph.wait_all(s)?;
        s.synchronize()?;
        let ms = t0.elapsed().as_secs_f64() * 1e3 / steps as f64;
        drop(graph);
        let reserved = self.backend.graph_memory_in_use()?.reserved;
        Ok((ms, reserved as f64 / (1u64 << 20) as f64))
    }
}

impl Model {
    /// `main[i] += dw[i]` on `s` for the `d * d` elements of a main grad
    /// at `main` and a dW at `dw` (bf16).
    fn accumulate_at(&self, s: &cuda::Stream, main: u64, dw: u64) -> R<()> {
        let n = (self.d * self.d) as u32;
        let mut b = s.cudarc().launch_builder(&self.accumulate);
        b.arg(&main).arg(&dw).arg(&n);
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(256).min(4096), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: `main` holds `n` f32 and `dw` `n` bf16 (a main grad and a
        // dW of this model), both used on `s` now.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }
}

/// The device address of a contiguous FP32 tensor's first element.
fn f32_address(t: &Tensor, s: &cuda::Stream) -> R<u64> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cuda(cuda) = &*storage else {
        return Err(Fail::Other("not a CUDA tensor".into()));
    };
    if !layout.is_contiguous() {
        return Err(Fail::Other("not contiguous".into()));
    }
    let slice = cuda.as_cuda_slice::<f32>()?;
    let (base, _sync) = slice.device_ptr(s.cudarc());
    Ok(base + (layout.start_offset() * std::mem::size_of::<f32>()) as u64)
}

/// Elements that differ, and the largest relative difference.
fn compare(a: &[Tensor], b: &[Tensor]) -> R<(usize, usize, f32)> {
    let (mut differ, mut total, mut worst) = (0, 0, 0f32);
    for (x, y) in a.iter().zip(b) {
        let x = x.flatten_all()?.to_vec1::<f32>()?;
        let y = y.flatten_all()?.to_vec1::<f32>()?;
        total += x.len();
        for (p, q) in x.iter().zip(&y) {
            if p.to_bits() != q.to_bits() {
                differ += 1;
                worst = worst.max((p - q).abs() / p.abs().max(q.abs()).max(1e-6));
            }
        }
    }
    Ok((differ, total, worst))
}

fn main() -> R<()> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (b, d) = match args[..] {
        [b, d, ..] => (b, d),
        _ => (256, 512),
    };
    if let Err(e) = cuda::probe() {
        println!("candle_backward: no CUDA GPU here ({e})");
        return Ok(());
    }
    let steps = if b * d >= 1 << 24 { 20 } else { 200 };
    let model = Model::new(b, d)?;
    println!("candle_backward: {LAYERS} layers, dY {b}x{d}, W {d}x{d}, bf16, {steps} steps");

    // Warm up candle's kernels and cuBLAS, then time.
    let mut warm = model.zeros()?;
    model.eager(2, false, false, &mut warm)?;
    model.eager(2, false, true, &mut warm)?;
    let mut eager_main = model.zeros()?;
    let eager = model.eager(steps, false, false, &mut eager_main)?;
    let mut copies_main = model.zeros()?;
    let eager_copies = model.eager(steps, true, false, &mut copies_main)?;
    let mut in_place_main = model.zeros()?;
    let eager_in_place = model.eager(steps, false, true, &mut in_place_main)?;

    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let before_mib = mib(model.backend.graph_memory_in_use()?.reserved);
    let mut copied = model.capture(false, false)?;
    let mut warm = model.zeros()?;
    model.graphed(&mut copied, 2, &mut warm)?;
    let mut graphed_main = model.zeros()?;
    let graphed = model.graphed(&mut copied, steps, &mut graphed_main)?;
    let copies_layers_mib = mib(model.backend.graph_memory_in_use()?.reserved);
    let mut stepped_copies_main = model.zeros()?;
    let (stepped_copies, copies_step_mib) =
        model.stepped(&mut copied, steps, &mut stepped_copies_main)?;
    drop(copied);
    model.backend.trim_graph_memory()?;

    let mut direct = model.capture(true, false)?;
    let mut warm = model.zeros()?;
    model.graphed(&mut direct, 2, &mut warm)?;
    let mut direct_main = model.zeros()?;
    let graphed_gemm = model.graphed(&mut direct, steps, &mut direct_main)?;
    let gemm_layers_mib = mib(model.backend.graph_memory_in_use()?.reserved);
    let mut stepped_gemm_main = model.zeros()?;
    let (stepped_gemm, gemm_step_mib) =
        model.stepped(&mut direct, steps, &mut stepped_gemm_main)?;
    drop(direct);
    model.backend.trim_graph_memory()?;

    // Copies again, lazily instantiated and launched only as a step graph:
    // no runner graph is ever instantiated, so the step graph is all the
    // driver holds graph memory for.
    let lazy_before_mib = mib(model.backend.graph_memory_in_use()?.reserved);
    let mut lazy = model.capture(false, true)?;
    let mut stepped_lazy_main = model.zeros()?;
    let (stepped_lazy, lazy_step_mib) = model.stepped(&mut lazy, steps, &mut stepped_lazy_main)?;
    let never = (0..LAYERS as u32)
        .filter(|&l| {
            lazy.graph(RunnerId(l))
                .is_some_and(|g| !g.is_instantiated())
        })
        .count();
    drop(lazy);

    let (differ, total, _) = compare(&eager_main, &graphed_main)?;
    let (differ_gemm, _, worst) = compare(&eager_main, &direct_main)?;
    let (differ_step_copies, _, _) = compare(&eager_main, &stepped_copies_main)?;
    let (differ_step_gemm, _, _) = compare(&eager_main, &stepped_gemm_main)?;
    let (differ_in_place, _, _) = compare(&eager_main, &in_place_main)?;
    let (differ_lazy, _, _) = compare(&eager_main, &stepped_lazy_main)?;
    println!("eager                      {eager:8.3} ms/step");
    println!("eager + the graph's copies {eager_copies:8.3} ms/step");
    println!("eager, dW added in place   {eager_in_place:8.3} ms/step   {differ_in_place} differ (the step graph's consumer kernel)");
    println!("graphed (copies)           {graphed:8.3} ms/step   {differ} of {total} main-grad elements differ from eager");
    println!("graphed (gemm into views)  {graphed_gemm:8.3} ms/step   {differ_gemm} differ (largest relative difference {worst:.2e})");
    println!(
        "step graph (copies)        {stepped_copies:8.3} ms/step   {differ_step_copies} differ"
    );
    println!("step graph (gemm into views) {stepped_gemm:6.3} ms/step   {differ_step_gemm} differ");
    println!("step graph (copies, lazy)  {stepped_lazy:8.3} ms/step   {differ_lazy} differ ({never} of {LAYERS} runner graphs never instantiated)");
    println!(
        "driver graph memory reserved, MiB: before {before_mib:.0}; copies {copies_layers_mib:.0} after the per-layer graphs, {copies_step_mib:.0} after the step graph; gemm into views {gemm_layers_mib:.0}, {gemm_step_mib:.0}; copies, lazy, step graph only: {lazy_before_mib:.0} before, {lazy_step_mib:.0} after"
    );
    if differ != 0
        || differ_step_copies != 0
        || differ_step_gemm != 0
        || differ_in_place != 0
        || differ_lazy != 0
    {
        return Err(Fail::Other("the graphed step differs from eager".into()));
    }
    Ok(())
}
