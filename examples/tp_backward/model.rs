//! The model of the tensor-parallel backward example, shared with its GPU
//! tests (`tests/support/gpu/tp.rs` includes this file): shapes, bf16
//! tensors, cuBLAS GEMMs, the reduce-scatter (NCCL or a copy kernel standing
//! in), the FP32 accumulation, and the four ways to run a step (eager,
//! discovery, capture, replay).
//!
//! Runners are modules in backward order: for each layer from the last, its
//! MLP module (fc2 then fc1) and its attention-projection module (one
//! hidden x hidden linear). Each module's backward, on one stream:
//!
//! 1. set the cuBLAS workspace to the module's own workspace buffer;
//! 2. per linear, last first: dgrad `dX = dY W` (cuBLAS, bf16 in and out,
//!    FP32 compute); the module's input gradient is ready: it is a handoff
//!    to the next module (`hand_off` / `receive` at discovery), and when
//!    captured, `RunnerCapture::ready` marks this point, so the next
//!    module's replay starts here while this one's wgrad still runs;
//! 3. per linear: wgrad into the `wgrad_rs_input` buffer, `dW = dY^T X`
//!    (`[out, in]`) for a column-parallel linear, `dW^T = X^T dY`
//!    (`[in, out]`) for a row-parallel one, so that each rank's Megatron
//!    shard is a contiguous slice;
//! 4. per linear: reduce-scatter of the wgrad into the `rs_output` buffer
//!    (over the ranks; each rank computed its own rows of the batch).
//!
//! Then, on a side stream, the shard is accumulated in FP32 into the main
//! grad (through `Replayable::consume` when replayed).
//!
//! Persistent requests per module, in order: the cuBLAS workspace (u8), then
//! per linear its `wgrad_rs_input` and its `rs_output` (bf16).
#![allow(dead_code)] // the example and the GPU test each use a subset

use std::ffi::c_void;
use std::fmt;

use cudarc::cublas::sys as blas;
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{
    sys, CudaEvent, CudaFunction, CudaSlice, DevicePtr, DevicePtrMut, DeviceSlice, LaunchConfig,
    PushKernelArg, SyncOnDrop,
};
use cudarc::nvrtc::compile_ptx;
use half::bf16;
use replay_arena::backend::Compose;
use replay_arena::cuda;
use replay_arena::cuda::ViewExt;
use replay_arena::{
    BackendError, Buffer, BufferSource, Capturing, DType, Discovering, Domain, GroupId, HandoffId,
    ParamId, PlanConfig, Purpose, ReadOnly, Replayable, Request, RunnerId, StepGraph,
    StreamCaptureError, View,
};

/// The group the reduce-scatter runs over when it is NCCL.
pub const TP_GROUP: GroupId = GroupId(0);

/// What can go wrong, typed. Driver, cuBLAS and NCCL codes are kept raw and
/// formatted here (formatting through cudarc calls into the libraries).
#[derive(Debug, thiserror::Error)]
pub enum TpError {
    /// No usable GPU or driver.
    #[error("no usable CUDA GPU: {0}")]
    NoGpu(BackendError),
    /// The cuBLAS library cannot be loaded.
    #[error("cuBLAS (libcublas) was not found by the dynamic loader")]
    NoCublas,
    /// A shape cuBLAS cannot take (a dimension past `i32`).
    #[error("shape: {0}")]
    Shape(String),
    /// A cuBLAS call failed.
    #[error("{op} returned {status:?}")]
    Cublas {
        /// The entry point.
        op: &'static str,
        /// Its status.
        status: blas::cublasStatus_t,
    },
    /// A driver call failed.
    #[error("{op} returned {code:?}")]
    Driver {
        /// The entry point.
        op: &'static str,
        /// Its result.
        code: sys::CUresult,
    },
    /// nvrtc failed on the example's kernels.
    #[error("compiling the kernels with nvrtc failed: {0}")]
    Nvrtc(String),
    /// cuBLAS could not be captured into a runner's graph (it tried to
    /// allocate, or picked an algorithm that cannot be captured).
    #[error("cuBLAS could not be captured for {runner} ({module}, workspace {workspace} bytes): {reason}")]
    CublasCapture {
        /// The runner.
        runner: RunnerId,
        /// Its module.
        module: String,
        /// The workspace it was given.
        workspace: u64,
        /// What failed.
        reason: String,
    },
    /// A buffer source answered in a way this phase does not expect.
    #[error("buffers: {0}")]
    View(String),
    /// A check of the run failed (numerics against eager, workspace
    /// sharing).
    #[error("check failed: {0}")]
    Check(String),
    /// The plan's lifecycle failed.
    #[error(transparent)]
    Arena(#[from] replay_arena::Error),
}

/// Each phase's error into [`TpError::Arena`].
macro_rules! arena_error {
    ($($t:ty),*) => {$(
        impl From<$t> for TpError {
            fn from(e: $t) -> TpError {
                TpError::Arena(e.into())
            }
        }
    )*};
}

arena_error!(
    BackendError,
    replay_arena::CaptureError,
    replay_arena::ReplayError,
    replay_arena::PlanError,
    replay_arena::PlanFailed,
    replay_arena::AllocateFailed,
    replay_arena::DiscoveryError,
    replay_arena::StepError,
    replay_arena::StepLaunchError,
    replay_arena::WaitError,
    replay_arena::BackendFailure,
    replay_arena::UnknownRunner
);

type Result<T, E = TpError> = std::result::Result<T, E>;

fn driver(op: &'static str) -> impl Fn(cudarc::driver::DriverError) -> TpError {
    move |e| TpError::Driver { op, code: e.0 }
}

fn check(op: &'static str, code: sys::CUresult) -> Result<()> {
    match code {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        code => Err(TpError::Driver { op, code }),
    }
}

fn check_blas(op: &'static str, status: blas::cublasStatus_t) -> Result<()> {
    match status {
        blas::cublasStatus_t::CUBLAS_STATUS_SUCCESS => Ok(()),
        status => Err(TpError::Cublas { op, status }),
    }
}

/// The model's shapes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Hidden size.
    pub hidden: usize,
    /// MLP inner size.
    pub ffn: usize,
    /// Tokens per step (sequence x micro-batch).
    pub tokens: usize,
    /// Layers.
    pub layers: usize,
    /// Bytes of each runner's cuBLAS workspace.
    pub workspace: u64,
}

impl Shape {
    /// A configuration where launch overhead dominates.
    pub const SMALL: Shape = Shape {
        hidden: 512,
        ffn: 2048,
        tokens: 128,
        layers: 8,
        workspace: 32 << 20,
    };

    /// A mid-size configuration.
    pub const MID: Shape = Shape {
        hidden: 4096,
        ffn: 16384,
        tokens: 2048,
        layers: 8,
        workspace: 32 << 20,
    };

    /// The modules in backward order.
    pub fn modules(&self) -> Vec<Module> {
        let (h, f) = (self.hidden, self.ffn);
        let mut modules = Vec::with_capacity(2 * self.layers);
        let mut param = 0u64;
        let mut linear = |name: &'static str, inputs: usize, outputs: usize, split: Split| {
            param += 1;
            Linear {
                name,
                inputs,
                outputs,
                split,
                param: ParamId(param),
            }
        };
        let mut layers = Vec::new();
        for layer in 0..self.layers {
            let attn = vec![linear("proj", h, h, Split::Row)];
            let mlp = vec![
                linear("fc1", h, f, Split::Column),
                linear("fc2", f, h, Split::Row),
            ];
            layers.push((layer, attn, mlp));
        }
        for (layer, attn, mlp) in layers.into_iter().rev() {
            modules.push(Module {
                name: format!("layer{layer}.mlp"),
                linears: mlp,
            });
            modules.push(Module {
                name: format!("layer{layer}.attn_proj"),
                linears: attn,
            });
        }
        modules
    }

    /// FLOPs of one backward step (two GEMMs per linear).
    pub fn flops(&self) -> f64 {
        self.modules()
            .iter()
            .flat_map(|m| &m.linears)
            .map(|l| 4.0 * (self.tokens * l.inputs * l.outputs) as f64)
            .sum()
    }

    /// Checks that every size is positive and every matrix fits cuBLAS's
    /// 32-bit sizes.
    ///
    /// # Errors
    ///
    /// [`TpError::Shape`] naming the shape.
    pub fn check(&self) -> Result<()> {
        let dims = [self.hidden, self.ffn, self.tokens];
        if dims.contains(&0) || self.layers == 0 {
            return Err(TpError::Shape(format!(
                "every size must be positive: {self}"
            )));
        }
        let big = self.hidden.max(self.ffn) * self.hidden.max(self.ffn).max(self.tokens);
        if i32::try_from(big).is_err() {
            return Err(TpError::Shape(format!(
                "{self}: a matrix has more than 2^31 elements, past cuBLAS's 32-bit sizes"
            )));
        }
        Ok(())
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "hidden {}, ffn {}, tokens {}, L = {}, cuBLAS workspace {} MiB per runner",
            self.hidden,
            self.ffn,
            self.tokens,
            self.layers,
            self.workspace >> 20
        )
    }
}

/// How Megatron's tensor parallelism splits a linear's weight over the
/// ranks, and so which shard of its gradient each rank keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// Column-parallel (fc1): rank `r` keeps output rows `r out / N ..`. The
    /// wgrad is computed as `[out, in]`, so a rank's shard is contiguous.
    Column,
    /// Row-parallel (fc2, the attention projection): rank `r` keeps input
    /// columns `r in / N ..`. The wgrad is computed transposed, `[in, out]`,
    /// so a rank's shard is contiguous again.
    Row,
}

/// One linear layer `y = x W^T`, `W: [outputs, inputs]`.
#[derive(Clone, Debug)]
pub struct Linear {
    /// Its name inside the module.
    pub name: &'static str,
    /// Input features.
    pub inputs: usize,
    /// Output features.
    pub outputs: usize,
    /// Its tensor-parallel split.
    pub split: Split,
    /// Its parameter (for the plan's per-parameter ring comparison).
    pub param: ParamId,
}

impl Linear {
    fn weight_elements(&self) -> usize {
        self.inputs * self.outputs
    }
}

/// One runner: a module whose backward is captured as one graph.
#[derive(Clone, Debug)]
pub struct Module {
    /// `layer3.mlp`.
    pub name: String,
    /// Its linears in forward order.
    pub linears: Vec<Linear>,
}

/// How the wgrad reaches `rs_output`.
pub enum Reduce {
    /// A copy kernel standing in for a reduce-scatter over one rank.
    StandIn,
    /// NCCL's reduce-scatter on symmetric views.
    #[cfg(feature = "nccl")]
    Nccl(replay_arena::nccl::Communicator),
    /// NCCL's reduce-scatter on plain device views (memory no window
    /// registers): the same graphs, for comparison.
    #[cfg(feature = "nccl")]
    NcclPlain(replay_arena::nccl::Communicator),
}

impl Reduce {
    /// Ranks the wgrad is scattered over.
    pub fn ranks(&self) -> usize {
        match self {
            Reduce::StandIn => 1,
            #[cfg(feature = "nccl")]
            Reduce::Nccl(comm) | Reduce::NcclPlain(comm) => comm.size(),
        }
    }

    /// This process's rank among them.
    pub fn rank(&self) -> usize {
        match self {
            Reduce::StandIn => 0,
            #[cfg(feature = "nccl")]
            Reduce::Nccl(comm) | Reduce::NcclPlain(comm) => comm.rank(),
        }
    }

    /// The domain of the reduce-scatter's buffers.
    pub fn domain(&self) -> Domain {
        match self {
            Reduce::StandIn => Domain::Device,
            #[cfg(feature = "nccl")]
            Reduce::NcclPlain(_) => Domain::Device,
            #[cfg(feature = "nccl")]
            Reduce::Nccl(_) => Domain::Symmetric(TP_GROUP),
        }
    }

    /// The plan config (names the group when NCCL is used).
    pub fn config(&self) -> Result<PlanConfig> {
        Ok(match self {
            Reduce::StandIn => PlanConfig::new(),
            #[cfg(feature = "nccl")]
            Reduce::NcclPlain(_) => PlanConfig::new(),
            #[cfg(feature = "nccl")]
            Reduce::Nccl(_) => PlanConfig::new()
                .with_group(TP_GROUP, "tp")
                .map_err(replay_arena::Error::from)?,
        })
    }

    /// How the output describes it.
    pub fn describe(&self) -> String {
        match self {
            Reduce::StandIn => {
                "reduce-scatter: a copy kernel standing in (1 rank, no NCCL in this build or --rs copy)"
                    .into()
            }
            #[cfg(feature = "nccl")]
            Reduce::Nccl(comm) => format!(
                "reduce-scatter: {} on symmetric windows, {} rank(s)",
                nccl_version(),
                comm.size()
            ),
            #[cfg(feature = "nccl")]
            Reduce::NcclPlain(comm) => format!(
                "reduce-scatter: {} on plain device memory (no window registered), {} rank(s)",
                nccl_version(),
                comm.size()
            ),
        }
    }
}

const SOURCE: &str = r#"
__device__ unsigned int mix(unsigned int x) {
    x ^= x >> 16; x *= 0x7feb352dU; x ^= x >> 15; x *= 0x846ca68bU; x ^= x >> 16;
    return x;
}
__device__ float bf16_to_f32(unsigned short b) { return __uint_as_float(((unsigned int)b) << 16); }
__device__ unsigned short f32_to_bf16(float f) {
    unsigned int u = __float_as_uint(f);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}
#define FOR_EACH(i, n) for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; \
                            i < (n); i += (unsigned long long)gridDim.x * blockDim.x)

// Uniform in [-scale, scale), rounded to bf16; element i takes the value of
// index offset + i, so a rank's rows of a tensor equal the same rows of the
// whole tensor.
extern "C" __global__ void init_bf16(unsigned short* p, unsigned long long n, unsigned int seed, float scale,
                                     unsigned long long offset) {
    FOR_EACH(i, n) {
        unsigned long long k = offset + i;
        unsigned int h = mix(seed ^ mix((unsigned int)k ^ mix((unsigned int)(k >> 32) + 0x9e3779b9u)));
        p[i] = f32_to_bf16(((float)(h & 0xFFFFFFu) / 16777216.0f - 0.5f) * 2.0f * scale);
    }
}

// The reduce-scatter stand-in (one rank: the whole wgrad is the shard).
extern "C" __global__ void copy_bf16(unsigned short* dst, const unsigned short* src, unsigned long long n) {
    FOR_EACH(i, n) dst[i] = src[i];
}

// main += shard, in FP32.
extern "C" __global__ void accumulate(float* main_grad, const unsigned short* shard, unsigned long long n) {
    FOR_EACH(i, n) main_grad[i] += bf16_to_f32(shard[i]);
}

// counts[0]: elements whose bits differ; counts[1]: elements past the
// tolerance |a - b| > rtol * max(|a|, |b|) + atol. maxes[0]: max |a - b|,
// maxes[1]: max |a| (non-negative floats order like their bits). Reduced per
// warp first (blockDim is a multiple of 32), one atomic per warp.
extern "C" __global__ void compare(const float* a, const float* b, unsigned long long n, float rtol, float atol,
                                   unsigned long long* counts, unsigned int* maxes) {
    unsigned long long bits = 0, past = 0;
    float dmax = 0.0f, amax = 0.0f;
    FOR_EACH(i, n) {
        float x = a[i], y = b[i];
        if (__float_as_uint(x) != __float_as_uint(y)) bits++;
        float d = fabsf(x - y);
        if (!(d <= rtol * fmaxf(fabsf(x), fabsf(y)) + atol)) past++;
        dmax = fmaxf(dmax, d);
        amax = fmaxf(amax, fabsf(x));
    }
    for (int o = 16; o > 0; o >>= 1) {
        bits += __shfl_xor_sync(0xffffffffu, bits, o);
        past += __shfl_xor_sync(0xffffffffu, past, o);
        dmax = fmaxf(dmax, __shfl_xor_sync(0xffffffffu, dmax, o));
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    }
    if ((threadIdx.x & 31u) == 0) {
        if (bits) atomicAdd(&counts[0], bits);
        if (past) atomicAdd(&counts[1], past);
        atomicMax(&maxes[0], __float_as_uint(dmax));
        atomicMax(&maxes[1], __float_as_uint(amax));
    }
}
"#;

fn grid(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(256).clamp(1, 4096) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The example's kernels, loaded into the backend's context.
pub struct Kernels {
    init: CudaFunction,
    copy: CudaFunction,
    accumulate: CudaFunction,
    compare: CudaFunction,
}

impl Kernels {
    /// Compiles (nvrtc) and loads the kernels.
    pub fn load(backend: &cuda::Device) -> Result<Kernels> {
        let ptx = compile_ptx(SOURCE).map_err(|e| TpError::Nvrtc(format!("{e:?}")))?;
        let module = backend
            .context()
            .load_module(ptx)
            .map_err(driver("cuModuleLoadData"))?;
        let f = |name: &str| {
            module
                .load_function(name)
                .map_err(driver("cuModuleGetFunction"))
        };
        Ok(Kernels {
            init: f("init_bf16")?,
            copy: f("copy_bf16")?,
            accumulate: f("accumulate")?,
            compare: f("compare")?,
        })
    }

    fn init(
        &self,
        s: &cuda::Stream,
        p: u64,
        n: usize,
        seed: u32,
        scale: f32,
        offset: u64,
    ) -> Result<()> {
        let n64 = n as u64;
        let mut b = s.cudarc().launch_builder(&self.init);
        b.arg(&p).arg(&n64).arg(&seed).arg(&scale).arg(&offset);
        // SAFETY: `p` holds `n` bf16 elements.
        unsafe { b.launch(grid(n)) }
            .map(drop)
            .map_err(driver("cuLaunchKernel"))
    }

    fn copy(&self, s: &cuda::Stream, dst: u64, src: u64, n: usize) -> Result<()> {
        let n64 = n as u64;
        let mut b = s.cudarc().launch_builder(&self.copy);
        b.arg(&dst).arg(&src).arg(&n64);
        // SAFETY: both hold `n` bf16 elements.
        unsafe { b.launch(grid(n)) }
            .map(drop)
            .map_err(driver("cuLaunchKernel"))
    }

    /// `main += shard` (FP32 += bf16) on `s`.
    pub fn accumulate(&self, s: &cuda::Stream, main: u64, shard: u64, n: usize) -> Result<()> {
        let n64 = n as u64;
        let mut b = s.cudarc().launch_builder(&self.accumulate);
        b.arg(&main).arg(&shard).arg(&n64);
        // SAFETY: `main` holds `n` f32, `shard` `n` bf16 elements.
        unsafe { b.launch(grid(n)) }
            .map(drop)
            .map_err(driver("cuLaunchKernel"))
    }
}

/// A cuBLAS handle; its stream and workspace are set per module.
pub struct Blas {
    handle: CudaBlas,
}

/// Rows and columns of a row-major matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Dims(usize, usize);

impl Blas {
    /// Checks that libcublas loads (cudarc panics when it does not), then
    /// creates a handle on `stream`.
    pub fn new(stream: &cuda::Stream) -> Result<Blas> {
        // SAFETY: only tries to open the library.
        if !unsafe { blas::is_culib_present() } {
            return Err(TpError::NoCublas);
        }
        let handle = CudaBlas::new(stream.cudarc().clone()).map_err(|e| TpError::Cublas {
            op: "cublasCreate",
            status: e.0,
        })?;
        Ok(Blas { handle })
    }

    /// Points the handle at `stream` and at `workspace` (in that order:
    /// setting the stream resets the workspace).
    fn bind(&mut self, stream: &cuda::Stream, workspace: &impl DevicePtr<u8>) -> Result<()> {
        // SAFETY: the handle is used on one stream at a time (this program
        // is single-threaded and binds before every module).
        unsafe { self.handle.set_stream(stream.cudarc().clone()) }.map_err(|e| {
            TpError::Cublas {
                op: "cublasSetStream",
                status: e.0,
            }
        })?;
        let (ptr, _sync) = workspace.device_ptr(stream.cudarc());
        // SAFETY: `workspace` holds `len` bytes of device memory, 256-byte
        // aligned, that stay alive while anything this handle enqueues (or a
        // graph that captured it) may run.
        check_blas("cublasSetWorkspace", unsafe {
            blas::cublasSetWorkspace_v2(*self.handle.handle(), ptr as *mut c_void, workspace.len())
        })
    }

    /// Row-major `c = op(a) op(b)` (`op` transposes when asked) through
    /// cudarc's `Gemm<bf16>`: `cublasGemmEx`, bf16 in and out,
    /// `CUBLAS_COMPUTE_32F`, default algorithm.
    #[allow(clippy::too_many_arguments)]
    fn matmul(
        &self,
        a: &impl DevicePtr<bf16>,
        da: Dims,
        ta: bool,
        b: &impl DevicePtr<bf16>,
        db: Dims,
        tb: bool,
        c: &mut impl DevicePtrMut<bf16>,
        dc: Dims,
    ) -> Result<()> {
        let Dims(m, k) = if ta { Dims(da.1, da.0) } else { da };
        let Dims(k2, n) = if tb { Dims(db.1, db.0) } else { db };
        let fits = |len: usize, d: Dims| len >= d.0 * d.1;
        if k != k2
            || dc != Dims(m, n)
            || !fits(a.len(), da)
            || !fits(b.len(), db)
            || !fits(c.len(), dc)
        {
            return Err(TpError::Shape(format!(
                "matmul of {m}x{k} by {k2}x{n} into {}x{} (buffers of {}, {} and {} elements)",
                dc.0,
                dc.1,
                a.len(),
                b.len(),
                c.len()
            )));
        }
        let int = |v: usize| {
            i32::try_from(v).map_err(|_| TpError::Shape(format!("{v} is past cuBLAS's i32")))
        };
        let op = |t: bool| {
            if t {
                blas::cublasOperation_t::CUBLAS_OP_T
            } else {
                blas::cublasOperation_t::CUBLAS_OP_N
            }
        };
        // Row-major C = A B is column-major C^T = B^T A^T: swap the operands.
        let cfg = GemmConfig {
            transa: op(tb),
            transb: op(ta),
            m: int(n)?,
            n: int(m)?,
            k: int(k)?,
            alpha: bf16::ONE,
            lda: int(db.1)?,
            ldb: int(da.1)?,
            beta: bf16::ZERO,
            ldc: int(dc.1)?,
        };
        // SAFETY: the buffers hold at least rows x cols elements each
        // (checked above) on the handle's device.
        unsafe { self.handle.gemm(cfg, b, a, c) }.map_err(|e| TpError::Cublas {
            op: "cublasGemmEx",
            status: e.0,
        })
    }
}

/// The tensors of one linear outside the plan: weight and saved input.
struct LinearTensors {
    weight: CudaSlice<bf16>,
    input: CudaSlice<bf16>,
}

/// Main grads of every linear (FP32 shards), per module.
pub struct MainGrads {
    grads: Vec<Vec<CudaSlice<f32>>>,
}

/// The model on one device: shapes, tensors, kernels, cuBLAS.
pub struct Model {
    /// The shapes.
    pub shape: Shape,
    /// The modules, in backward order (runner `r` is module `r`).
    pub modules: Vec<Module>,
    /// How the reduce-scatter runs.
    pub reduce: Reduce,
    /// The kernels.
    pub kernels: Kernels,
    /// The cuBLAS handle.
    pub blas: Blas,
    /// Setup and read-back stream.
    pub io: cuda::Stream,
    tensors: Vec<Vec<LinearTensors>>,
    /// Per module and linear: the input gradient its dgrad writes (the
    /// module's first one is what the next module reads; graphed, that one
    /// is a handoff of the plan instead).
    dgrads: Vec<Vec<CudaSlice<bf16>>>,
    loss_grad: CudaSlice<bf16>,
    /// Per module but the last: the handoff of its input gradient to the
    /// next module (declared at discovery).
    handoffs: Vec<HandoffId>,
    /// Whether captured graphs contain the reduce-scatter. Off only to
    /// measure what the collective costs (same graphs without it; their
    /// shards are then never written and their main grads meaningless).
    pub reduce_in_graphs: bool,
}

impl Model {
    /// Allocates and fills the model's tensors (bf16 weights scaled to keep
    /// gradients near unit size, activations and the loss gradient uniform in
    /// [-1, 1)).
    pub fn new(backend: &cuda::Device, shape: Shape, reduce: Reduce) -> Result<Model> {
        shape.check()?;
        let io = backend.new_stream()?;
        let kernels = Kernels::load(backend)?;
        let blas = Blas::new(&io)?;
        let modules = shape.modules();
        let alloc = |n: usize| {
            io.cudarc()
                .alloc_zeros::<bf16>(n)
                .map_err(driver("cuMemAlloc"))
        };
        // Weights are the same on every rank (gathered for compute, as GTP
        // does); activations and the loss gradient are this rank's rows of
        // the whole batch's (`ranks x tokens` rows).
        let rank = reduce.rank() as u64;
        let mut seed = 1u32;
        let mut fill = |buf: &CudaSlice<bf16>, scale: f32, rows_before: bool| {
            seed += 1;
            let p = buf.device_ptr(io.cudarc()).0;
            let offset = if rows_before {
                rank * buf.len() as u64
            } else {
                0
            };
            kernels.init(&io, p, buf.len(), seed, scale, offset)
        };
        let mut tensors = Vec::with_capacity(modules.len());
        let mut dgrads = Vec::with_capacity(modules.len());
        for m in &modules {
            let mut ts = Vec::with_capacity(m.linears.len());
            let mut ds = Vec::with_capacity(m.linears.len());
            for l in &m.linears {
                let t = LinearTensors {
                    weight: alloc(l.weight_elements())?,
                    input: alloc(shape.tokens * l.inputs)?,
                };
                fill(&t.weight, (3.0 / l.outputs as f32).sqrt(), false)?;
                fill(&t.input, 1.0, true)?;
                ts.push(t);
                ds.push(alloc(shape.tokens * l.inputs)?);
            }
            tensors.push(ts);
            dgrads.push(ds);
        }
        let loss_grad = alloc(shape.tokens * shape.hidden)?;
        fill(&loss_grad, 1.0, true)?;
        io.synchronize()?;
        Ok(Model {
            shape,
            modules,
            reduce,
            kernels,
            blas,
            io,
            tensors,
            dgrads,
            loss_grad,
            handoffs: Vec::new(),
            reduce_in_graphs: true,
        })
    }

    fn ptr<T>(&self, buf: &CudaSlice<T>) -> u64 {
        buf.device_ptr(self.io.cudarc()).0
    }

    /// Elements of linear `l`'s reduce-scatter output (its shard).
    fn shard(&self, l: &Linear) -> usize {
        l.weight_elements() / self.reduce.ranks()
    }

    /// Module `m`'s persistent requests, in order: the cuBLAS workspace,
    /// then per linear (last first) its `wgrad_rs_input` and `rs_output`.
    pub fn requests(&self, m: usize) -> Vec<Request> {
        let domain = self.reduce.domain();
        let mut r = vec![
            Request::new(Domain::Device, DType::U8, self.shape.workspace).purpose(Purpose::Other),
        ];
        for l in self.modules[m].linears.iter().rev() {
            r.push(
                Request::new(domain, DType::BF16, l.weight_elements() as u64)
                    .purpose(Purpose::WgradRsInput)
                    .param(l.param),
            );
            r.push(
                Request::new(domain, DType::BF16, self.shard(l) as u64)
                    .purpose(Purpose::RsOutput)
                    .param(l.param),
            );
        }
        r
    }

    /// Zeroed FP32 main grads for every linear.
    pub fn main_grads(&self) -> Result<MainGrads> {
        let grads = self
            .modules
            .iter()
            .map(|m| {
                m.linears
                    .iter()
                    .rev()
                    .map(|l| {
                        self.io
                            .cudarc()
                            .alloc_zeros::<f32>(self.shard(l))
                            .map_err(driver("cuMemAlloc"))
                    })
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<Vec<_>>>()?;
        self.io.synchronize()?;
        Ok(MainGrads { grads })
    }

    /// Sets every main grad to zero.
    pub fn zero(&self, main: &mut MainGrads) -> Result<()> {
        for g in main.grads.iter_mut().flatten() {
            self.io
                .cudarc()
                .memset_zeros(g)
                .map_err(driver("cuMemsetD8"))?;
        }
        Ok(self.io.synchronize()?)
    }

    /// Raw addresses of module `m`'s main grads, linear order as in
    /// [`Model::requests`].
    pub fn main_ptrs(&self, main: &MainGrads, m: usize) -> Vec<u64> {
        main.grads[m].iter().map(|g| self.ptr(g)).collect()
    }

    /// The handoff request of module `m`'s input gradient (what its first
    /// linear's dgrad writes and module `m + 1` reads).
    fn input_grad(&self, m: usize) -> Request {
        let l = &self.modules[m].linears[0];
        Request::new(
            Domain::Device,
            DType::BF16,
            (self.shape.tokens * l.inputs) as u64,
        )
    }

    /// Module `m`'s backward on `s` with these buffers (see the module
    /// docs). `ready`, when captured: marks the handoff of the input
    /// gradient ready once the dgrads are done.
    fn backward(
        &mut self,
        m: usize,
        bufs: &mut Bufs<'_>,
        s: &cuda::Stream,
        ready: Option<&Ready<'_>>,
    ) -> Result<()> {
        let capturing = ready.is_some();
        match &bufs.workspace {
            Workspace::Owned(w) => self.blas.bind(s, w)?,
            Workspace::View(w) => self.blas.bind(s, w)?,
        }
        let tokens = self.shape.tokens;
        let linears = &self.modules[m].linears;
        let tensors = &self.tensors[m];
        let n = linears.len();
        // The gradient this module reads: the loss gradient for the first
        // module, else the input gradient the module before it wrote.
        let (before, rest) = self.dgrads.split_at_mut(m);
        // The module's incoming gradient: the handoff it received when
        // captured, else the loss gradient or the module before's.
        let outer = match (&bufs.input, before.last()) {
            (Some(input), _) => Grad::Received(input),
            (None, None) => Grad::Slice(&self.loss_grad),
            (None, Some(prev)) => Grad::Slice(&prev[0]),
        };
        let own = &mut rest[0];
        // Linear i reads the gradient of its output: linear i + 1's input
        // gradient, or the module's incoming one for the last linear.
        let dy_dims = |i: usize| Dims(tokens, linears[i].outputs);
        for i in (0..n).rev() {
            let l = &linears[i];
            let (lo, hi) = own.split_at_mut(i + 1);
            let dy = hi.first().map_or(outer, Grad::Slice);
            // dgrad: dX = dY W, [tokens, in]; the first linear's is the
            // module's input gradient (the handoff, when captured).
            let w = &tensors[i].weight;
            let (dw, dx) = (Dims(l.outputs, l.inputs), Dims(tokens, l.inputs));
            match (&mut bufs.output, i) {
                (Some(out), 0) => {
                    self.blas
                        .matmul(&dy, dy_dims(i), false, w, dw, false, out, dx)?
                }
                _ => self
                    .blas
                    .matmul(&dy, dy_dims(i), false, w, dw, false, &mut lo[i], dx)?,
            }
        }
        if let Some(ready) = ready {
            ready(s)?;
        }
        let own = &*own;
        for (j, wgrad) in bufs.wgrad.iter_mut().enumerate() {
            let i = n - 1 - j;
            let l = &linears[i];
            let dy = own.get(i + 1).map_or(outer, Grad::Slice);
            let dy = &dy;
            let x = &tensors[i].input;
            let dx_dims = Dims(tokens, l.inputs);
            // wgrad into the wgrad_rs_input buffer, laid out so that each
            // rank's shard is contiguous: dW = dY^T X, [out, in], for a
            // column-parallel linear; dW^T = X^T dY, [in, out], for a
            // row-parallel one.
            match l.split {
                Split::Column => self.blas.matmul(
                    dy,
                    dy_dims(i),
                    true,
                    x,
                    dx_dims,
                    false,
                    wgrad,
                    Dims(l.outputs, l.inputs),
                )?,
                Split::Row => self.blas.matmul(
                    x,
                    dx_dims,
                    true,
                    dy,
                    dy_dims(i),
                    false,
                    wgrad,
                    Dims(l.inputs, l.outputs),
                )?,
            }
        }
        if capturing && !self.reduce_in_graphs {
            return Ok(());
        }
        for (j, l) in linears.iter().rev().enumerate() {
            let shard = l.weight_elements() / self.reduce.ranks();
            reduce_scatter(&self.reduce, &self.kernels, bufs, j, shard, s)?;
        }
        Ok(())
    }

    /// Accumulates shard `shard` (bf16) into main grad `main` (FP32) of
    /// module `m`'s `j`-th linear (order as in [`Model::requests`]) on `s`.
    pub fn accumulate_one(
        &self,
        m: usize,
        j: usize,
        main: u64,
        shard: &impl DevicePtr<bf16>,
        s: &cuda::Stream,
    ) -> Result<()> {
        let l = &self.modules[m].linears[self.modules[m].linears.len() - 1 - j];
        let (p, _sync) = shard.device_ptr(s.cudarc());
        self.kernels.accumulate(s, main, p, self.shard(l))
    }

    /// Accumulates module `m`'s shards at raw addresses (order as in
    /// [`Model::requests`]) into its main grads on `s`.
    pub fn accumulate(
        &self,
        m: usize,
        main: &[u64],
        rs_out: &[u64],
        s: &cuda::Stream,
    ) -> Result<()> {
        for ((l, &g), &r) in self.modules[m].linears.iter().rev().zip(main).zip(rs_out) {
            self.kernels.accumulate(s, g, r, self.shard(l))?;
        }
        Ok(())
    }

    /// One module of an eager step on `s`, buffers from `src` (recorded in
    /// discovery, allocated here in both discovery and plain runs),
    /// accumulated on the same stream.
    pub fn eager_module(
        &mut self,
        m: usize,
        src: &mut BufferSource<'_, '_>,
        main: &MainGrads,
        s: &cuda::Stream,
    ) -> Result<()> {
        let mut workspace = None;
        let mut tensors = Vec::new();
        for q in self.requests(m) {
            if let Buffer::Persistent(v) = src.request(q)? {
                return Err(TpError::View(format!(
                    "an eager step got a persistent view ({})",
                    v.request()
                )));
            }
            let n = q.elements as usize;
            // SAFETY: every element is written (wgrad, shard) or is cuBLAS
            // scratch before it is read.
            if q.dtype == DType::U8 {
                workspace =
                    Some(unsafe { s.cudarc().alloc::<u8>(n) }.map_err(driver("cuMemAllocAsync"))?);
            } else {
                tensors.push(
                    unsafe { s.cudarc().alloc::<bf16>(n) }.map_err(driver("cuMemAllocAsync"))?,
                );
            }
        }
        let workspace = workspace.ok_or_else(|| TpError::View("no workspace request".into()))?;
        let mut bufs = Bufs::new(
            Workspace::Owned(workspace),
            tensors.into_iter().map(Tensor::Owned),
            None,
        );
        self.backward(m, &mut bufs, s, None)?;
        for (j, (rs, g)) in bufs.rs_out.iter().zip(&main.grads[m]).enumerate() {
            self.accumulate_one(m, j, self.ptr(g), rs, s)?;
        }
        // The buffers go back to the stream-ordered pool after this work.
        drop(bufs);
        Ok(())
    }

    /// An eager step: every module on `s`, in backward order.
    pub fn eager_step(&mut self, main: &MainGrads, s: &cuda::Stream) -> Result<()> {
        for m in 0..self.modules.len() {
            self.eager_module(m, &mut BufferSource::Plain, main, s)?;
        }
        Ok(())
    }

    /// The discovery step: an eager step with each module's runner armed.
    pub fn discover(&mut self, main: &MainGrads, s: &cuda::Stream) -> Result<Discovering> {
        let mut discovery = Discovering::new(self.reduce.config()?);
        for m in 0..self.modules.len() {
            let name = format!("{}.bwd", self.modules[m].name);
            let mut armed = discovery.arm_named(RunnerId(m as u32), name)?;
            self.eager_module(m, &mut BufferSource::Discover(&mut armed), main, s)?;
            // The input gradient module m - 1 handed off, and its own, for
            // module m + 1.
            if let Some(&h) = self.handoffs.get(m.wrapping_sub(1)) {
                armed.receive(h)?;
            }
            if m + 1 < self.modules.len() {
                let h = armed.hand_off(self.input_grad(m))?;
                self.handoffs.truncate(m);
                self.handoffs.push(h);
            }
        }
        s.synchronize()?;
        Ok(discovery)
    }

    /// Captures every module's backward on `stream` into its runner: views
    /// from the plan, typed for cudarc (`as_cuda`), the workspace set inside
    /// the capture.
    pub fn capture<B: Compose<Stream = cuda::Stream, Graph = cuda::Graph>>(
        &mut self,
        capturing: &mut Capturing<B>,
        stream: &cuda::Stream,
    ) -> Result<()> {
        for m in 0..self.modules.len() {
            let runner = RunnerId(m as u32);
            let cap = capturing.capture(runner)?;
            let mut src = BufferSource::Capture(&cap);
            let mut views = Vec::new();
            for q in self.requests(m) {
                match src.request(q)? {
                    Buffer::Persistent(v) => views.push(v),
                    Buffer::AllocateYourself => {
                        return Err(TpError::View("a capture got no persistent view".into()))
                    }
                }
            }
            let input = match m.checked_sub(1) {
                Some(prev) => Some(cap.receive(self.handoff(prev)?)?),
                None => None,
            };
            let output = match m + 1 < self.modules.len() {
                true => Some((self.handoff(m)?, cap.hand_off(self.handoff(m)?)?)),
                false => None,
            };
            // Marks the input gradient ready for module m + 1.
            let ready = |s: &cuda::Stream| -> Result<()> {
                if let Some((h, _)) = output {
                    cap.ready(h, s)?;
                }
                Ok(())
            };
            // Typed views are made inside the capture's closure, on its
            // stream: the only place they reach the arena.
            let captured = cap.stream_capture(stream, |s| {
                let workspace = Workspace::View(views[0].as_cuda::<u8>(s)?);
                let tensors = views[1..]
                    .iter()
                    .map(|v| v.as_cuda::<bf16>(s).map(Tensor::View))
                    .collect::<Result<Vec<_>, _>>()?;
                let mut bufs = Bufs::new(workspace, tensors, Some(views.clone()));
                bufs.input = input.map(|v| v.as_cuda::<bf16>(s)).transpose()?;
                bufs.output = output
                    .map(|(_, v)| v.as_cuda::<bf16>(s).map(Tensor::View))
                    .transpose()?;
                self.backward(m, &mut bufs, s, Some(&ready))
            });
            if let Err(e) = captured {
                return Err(self.capture_failed(runner, e));
            }
            cap.finish()?;
        }
        Ok(())
    }

    /// Names what failed in a capture: anything cuBLAS did (or the driver
    /// refused) while capturing is a typed "cuBLAS could not be captured".
    fn capture_failed(&self, runner: RunnerId, e: StreamCaptureError<TpError>) -> TpError {
        let module = self.modules[runner.0 as usize].name.clone();
        let workspace = self.shape.workspace;
        let reason = match e {
            StreamCaptureError::Work(TpError::Arena(e)) => return TpError::Arena(e),
            StreamCaptureError::Work(e) => e.to_string(),
            StreamCaptureError::Capture(e) => e.to_string(),
        };
        TpError::CublasCapture {
            runner,
            module,
            workspace,
            reason,
        }
    }

    /// The handoff of module `m`'s input gradient (to module `m + 1`).
    fn handoff(&self, m: usize) -> Result<HandoffId> {
        self.handoffs
            .get(m)
            .copied()
            .ok_or_else(|| TpError::View(format!("module {m} hands nothing off: discover first")))
    }

    /// Compares two sets of main grads of this model, tensor by tensor:
    /// bits and a tolerance (`a` is the reference).
    pub fn compare(&self, a: &MainGrads, b: &MainGrads, tol: Tolerance) -> Result<Comparison> {
        let pairs: Vec<(u64, u64, usize)> = a
            .grads
            .iter()
            .flatten()
            .zip(b.grads.iter().flatten())
            .map(|(x, y)| (self.ptr(x), self.ptr(y), x.len()))
            .collect();
        self.compare_tensors(&pairs, tol)
    }

    /// Compares this rank's main-grad shards with the same shards of
    /// `reference`'s main grads, a one-rank model of the whole batch
    /// (`ranks x tokens` rows): this rank's shard of each linear is the
    /// `rank`-th slice of the reference's whole gradient.
    pub fn compare_to_reference(
        &self,
        main: &MainGrads,
        reference: &Model,
        whole: &MainGrads,
        tol: Tolerance,
    ) -> Result<Comparison> {
        if reference.reduce.ranks() != 1 || reference.modules.len() != self.modules.len() {
            return Err(TpError::Check(
                "the reference must be a one-rank model of the same modules".into(),
            ));
        }
        let rank = self.reduce.rank() as u64;
        let pairs: Vec<(u64, u64, usize)> = whole
            .grads
            .iter()
            .flatten()
            .zip(main.grads.iter().flatten())
            .map(|(w, g)| {
                let offset = rank * g.len() as u64 * 4;
                (reference.ptr(w) + offset, self.ptr(g), g.len())
            })
            .collect();
        if whole
            .grads
            .iter()
            .flatten()
            .zip(main.grads.iter().flatten())
            .any(|(w, g)| w.len() != g.len() * self.reduce.ranks())
        {
            return Err(TpError::Check(
                "the reference's gradients are not ranks x this rank's shards".into(),
            ));
        }
        self.compare_tensors(&pairs, tol)
    }

    /// Compares (reference, other, elements) FP32 tensors: one pass for the
    /// reference tensor's largest magnitude, one for the differences.
    fn compare_tensors(&self, pairs: &[(u64, u64, usize)], tol: Tolerance) -> Result<Comparison> {
        let mut total = Comparison {
            elements: 0,
            differing_bits: 0,
            past_tolerance: 0,
            max_abs_diff: 0.0,
            max_abs: 0.0,
            max_diff_over_max: 0.0,
        };
        for &(a, b, n) in pairs {
            let [_, _, _, scale] = self.compare_raw(a, a, n, 0.0, 0.0)?;
            let scale = f32::from_bits(scale as u32);
            let atol = tol.atol + tol.of_max * scale;
            let [bits, past, dmax, amax] = self.compare_raw(a, b, n, tol.rtol, atol)?;
            let (dmax, amax) = (f32::from_bits(dmax as u32), f32::from_bits(amax as u32));
            total.elements += n as u64;
            total.differing_bits += bits;
            total.past_tolerance += past;
            total.max_abs_diff = total.max_abs_diff.max(dmax);
            total.max_abs = total.max_abs.max(amax);
            if scale > 0.0 {
                total.max_diff_over_max = total.max_diff_over_max.max(dmax / scale);
            }
        }
        Ok(total)
    }

    /// One launch of the compare kernel on `n` f32 at `a` and `b`: (bits
    /// differing, past tolerance, max |diff| bits, max |a| bits).
    fn compare_raw(&self, a: u64, b: u64, n: usize, rtol: f32, atol: f32) -> Result<[u64; 4]> {
        let s = &self.io;
        let counts = s
            .cudarc()
            .alloc_zeros::<u64>(2)
            .map_err(driver("cuMemAlloc"))?;
        let maxes = s
            .cudarc()
            .alloc_zeros::<u32>(2)
            .map_err(driver("cuMemAlloc"))?;
        let n64 = n as u64;
        let mut l = s.cudarc().launch_builder(&self.kernels.compare);
        let (cp, mp) = (self.ptr(&counts), self.ptr(&maxes));
        l.arg(&a)
            .arg(&b)
            .arg(&n64)
            .arg(&rtol)
            .arg(&atol)
            .arg(&cp)
            .arg(&mp);
        // SAFETY: both hold `n` f32 (the callers' tensors); counts and maxes
        // hold two each.
        unsafe { l.launch(grid(n)) }.map_err(driver("cuLaunchKernel"))?;
        let c = s
            .cudarc()
            .clone_dtoh(&counts)
            .map_err(driver("cuMemcpyDtoH"))?;
        let mx = s
            .cudarc()
            .clone_dtoh(&maxes)
            .map_err(driver("cuMemcpyDtoH"))?;
        s.synchronize()?;
        Ok([c[0], c[1], u64::from(mx[0]), u64::from(mx[1])])
    }
}

/// The reduce-scatter of module buffer pair `j`: NCCL on the plan's
/// symmetric views when captured (the crate checks they lie in this group's
/// windows), NCCL on raw addresses in eager steps, or the copy kernel.
fn reduce_scatter(
    reduce: &Reduce,
    kernels: &Kernels,
    bufs: &Bufs<'_>,
    j: usize,
    shard: usize,
    s: &cuda::Stream,
) -> Result<()> {
    let (send, _a) = bufs.wgrad[j].device_ptr(s.cudarc());
    let (recv, _b) = bufs.rs_out[j].device_ptr(s.cudarc());
    match reduce {
        Reduce::StandIn => kernels.copy(s, recv, send, shard),
        #[cfg(feature = "nccl")]
        Reduce::Nccl(comm) => match &bufs.views {
            Some(views) => Ok(comm.reduce_scatter(&views[1 + 2 * j], &views[2 + 2 * j], s)?),
            None => nccl_raw(comm, send, recv, shard, s),
        },
        #[cfg(feature = "nccl")]
        Reduce::NcclPlain(comm) => nccl_raw(comm, send, recv, shard, s),
    }
}

/// The loaded NCCL's version, `NCCL 2.28.9`.
#[cfg(feature = "nccl")]
fn nccl_version() -> String {
    use cudarc::nccl::sys as nc;
    let mut v = 0i32;
    // SAFETY: a valid out-pointer; libnccl is loaded (a communicator of it
    // exists whenever a `Reduce` names one).
    match unsafe { nc::ncclGetVersion(&mut v) } {
        nc::ncclResult_t::ncclSuccess => {
            format!("NCCL {}.{}.{}", v / 10000, (v % 10000) / 100, v % 100)
        }
        code => format!("NCCL (ncclGetVersion returned {code:?})"),
    }
}

/// A raw NCCL reduce-scatter of unregistered memory: an eager step's
/// buffers, or plain device views of the plan (captured).
#[cfg(feature = "nccl")]
fn nccl_raw(
    comm: &replay_arena::nccl::Communicator,
    send: u64,
    recv: u64,
    shard: usize,
    s: &cuda::Stream,
) -> Result<()> {
    use cudarc::nccl::sys as nc;
    // SAFETY: `send` holds `size * shard` and `recv` `shard` bf16 elements,
    // alive until the stream passes this call (stream-ordered frees), or
    // for as long as a graph that captured it can replay (plan views).
    let code = unsafe {
        nc::ncclReduceScatter(
            send as *const c_void,
            recv as *mut c_void,
            shard,
            nc::ncclDataType_t::ncclBfloat16,
            nc::ncclRedOp_t::ncclSum,
            comm.raw(),
            s.cu_stream() as nc::cudaStream_t,
        )
    };
    match code {
        nc::ncclResult_t::ncclSuccess => Ok(()),
        code => Err(BackendError::Nccl {
            call: "ncclReduceScatter",
            code,
        }
        .into()),
    }
}

/// A cuBLAS workspace: the eager step's own, or the plan's.
enum Workspace<'v> {
    Owned(CudaSlice<u8>),
    View(cuda::TypedView<'v, u8>),
}

/// A bf16 buffer: the eager step's own, or a typed view of the plan's.
enum Tensor<'v> {
    Owned(CudaSlice<bf16>),
    View(cuda::TypedView<'v, bf16>),
}

/// cudarc's slice and pointer traits for an enum of bf16 buffers, each
/// call passed to the buffer the variant holds.
macro_rules! delegate_bf16 {
    ($ty:ty: $($variant:path),+) => {
        impl DeviceSlice<bf16> for $ty {
            fn len(&self) -> usize {
                match self {
                    $($variant(t) => t.len(),)+
                }
            }

            fn stream(&self) -> &std::sync::Arc<cudarc::driver::CudaStream> {
                match self {
                    $($variant(t) => t.stream(),)+
                }
            }
        }

        impl DevicePtr<bf16> for $ty {
            fn device_ptr<'a>(
                &'a self,
                stream: &'a cudarc::driver::CudaStream,
            ) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
                match self {
                    $($variant(t) => t.device_ptr(stream),)+
                }
            }
        }
    };
}

delegate_bf16!(Tensor<'_>: Tensor::Owned, Tensor::View);

impl DevicePtrMut<bf16> for Tensor<'_> {
    fn device_ptr_mut<'a>(
        &'a mut self,
        stream: &'a cudarc::driver::CudaStream,
    ) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        match self {
            Tensor::Owned(t) => t.device_ptr_mut(stream),
            Tensor::View(t) => t.device_ptr_mut(stream),
        }
    }
}

/// One module's buffers (and the plan's views, when captured).
struct Bufs<'v> {
    workspace: Workspace<'v>,
    wgrad: Vec<Tensor<'v>>,
    rs_out: Vec<Tensor<'v>>,
    views: Option<Vec<View<'v>>>,
    /// Captured: the input gradient the module before handed off (read
    /// only: a received handoff).
    input: Option<cuda::TypedView<'v, bf16, ReadOnly>>,
    /// Captured: the input gradient this module hands off.
    output: Option<Tensor<'v>>,
}

/// Marks a captured module's handoff ready on the capture's stream.
type Ready<'a> = dyn Fn(&cuda::Stream) -> Result<()> + 'a;

/// A gradient a GEMM reads: a program tensor or a plan view.
#[derive(Clone, Copy)]
enum Grad<'a, 'v> {
    Slice(&'a CudaSlice<bf16>),
    Tensor(&'a Tensor<'v>),
    Received(&'a cuda::TypedView<'v, bf16, ReadOnly>),
}

delegate_bf16!(Grad<'_, '_>: Grad::Slice, Grad::Tensor, Grad::Received);

impl<'v> Bufs<'v> {
    /// From tensors in request order after the workspace: (wgrad, rs_out)
    /// pairs.
    fn new(
        workspace: Workspace<'v>,
        tensors: impl IntoIterator<Item = Tensor<'v>>,
        views: Option<Vec<View<'v>>>,
    ) -> Bufs<'v> {
        let (mut wgrad, mut rs_out) = (Vec::new(), Vec::new());
        for (i, t) in tensors.into_iter().enumerate() {
            if i % 2 == 0 {
                wgrad.push(t);
            } else {
                rs_out.push(t);
            }
        }
        Bufs {
            workspace,
            wgrad,
            rs_out,
            views,
            input: None,
            output: None,
        }
    }
}

/// The `rs_output` addresses among a runner's views (request order).
pub fn rs_outputs(views: &[View<'_>]) -> Vec<u64> {
    views
        .iter()
        .skip(2)
        .step_by(2)
        .map(View::device_address)
        .collect()
}

/// The workspace view's byte range (address, bytes) of a runner.
pub fn workspace_range(views: &[View<'_>]) -> Option<(u64, u64)> {
    views.first().map(|v| (v.device_address(), v.bytes()))
}

/// What [`Model::compare`] found.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Comparison {
    /// Elements compared.
    pub elements: u64,
    /// Elements whose bits differ.
    pub differing_bits: u64,
    /// Elements past the tolerance.
    pub past_tolerance: u64,
    /// Largest absolute difference.
    pub max_abs_diff: f32,
    /// Largest absolute value of the reference.
    pub max_abs: f32,
    /// Over the tensors: largest |diff| over the tensor's largest |value|.
    pub max_diff_over_max: f32,
}

/// An element passes when `|a - b| <= rtol max(|a|, |b|) + atol + of_max M`,
/// `M` the largest |value| of the reference's tensor.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    /// Relative to the element.
    pub rtol: f32,
    /// Absolute.
    pub atol: f32,
    /// Relative to the tensor's largest magnitude.
    pub of_max: f32,
}

impl fmt::Display for Tolerance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "|a - b| <= {:e} max(|a|, |b|) + {:e} + {:e} max|reference tensor|",
            self.rtol, self.atol, self.of_max
        )
    }
}

impl Comparison {
    /// Bit for bit equal.
    pub fn bitwise(&self) -> bool {
        self.differing_bits == 0
    }
}

impl fmt::Display for Comparison {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.bitwise() {
            write!(f, "bitwise equal ({} elements)", self.elements)
        } else {
            write!(
                f,
                "{} of {} elements differ in bits, {} past tolerance; max |diff| {:e} (max |value| {:e}; worst tensor: max |diff| = {:.2e} of its max |value|)",
                self.differing_bits,
                self.elements,
                self.past_tolerance,
                self.max_abs_diff,
                self.max_abs,
                self.max_diff_over_max
            )
        }
    }
}

/// One step compiled into one graph: the schedule of [`graphed_step`]
/// (module `m` on `pool[m % pool.len()]`, its shards accumulated into
/// `main` on `side`), its waits turned into the graph's edges. Each
/// `launch` of the result runs a whole step.
pub fn step_graph<'r, B: Compose<Stream = cuda::Stream>>(
    model: &Model,
    replayable: &'r mut Replayable<B>,
    main: &MainGrads,
    pool: &[cuda::Stream],
    side: &cuda::Stream,
    overlapping: bool,
) -> Result<StepGraph<'r, B>> {
    let mut step = replayable.step();
    for m in 0..model.modules.len() {
        let runner = RunnerId(m as u32);
        step.replay(runner, &pool[m % pool.len()])?;
        let mains = &main.grads[m];
        step.consume(runner, side, |s, views| {
            for (j, (v, g)) in views.iter().skip(2).step_by(2).zip(mains).enumerate() {
                let shard = v.as_cuda::<bf16>(s)?;
                model.accumulate_one(m, j, model.ptr(g), &shard, s)?;
            }
            Ok::<(), TpError>(())
        })
        .map_err(|e| match e.into_check() {
            Ok(check) => replay_arena::Error::from(check).into(),
            Err(w) => w,
        })?;
    }
    Ok(if overlapping {
        step.build_overlapping()?
    } else {
        step.build()?
    })
}

/// Replays one step of every runner with the fence: module `m` on
/// `pool[m % pool.len()]` after its inputs, its shards accumulated on
/// `side` through `consume`.
pub fn graphed_step<B: Compose<Stream = cuda::Stream>>(
    model: &Model,
    replayable: &mut Replayable<B>,
    main: &MainGrads,
    pool: &[cuda::Stream],
    side: &cuda::Stream,
) -> Result<()> {
    let n = model.modules.len();
    for m in 0..n {
        let s = &pool[m % pool.len()];
        let runner = RunnerId(m as u32);
        // Waits for what module m - 1 handed off (its ready point), and for
        // the last users of the bytes it overwrites.
        replayable.replay(runner, s)?;
        let mains = &main.grads[m];
        replayable
            .consume(runner, side, |s, views| {
                for (j, (v, g)) in views.iter().skip(2).step_by(2).zip(mains).enumerate() {
                    let shard = v.as_cuda::<bf16>(s)?;
                    model.accumulate_one(m, j, model.ptr(g), &shard, s)?;
                }
                Ok::<(), TpError>(())
            })
            .map_err(|e| match e.into_check() {
                Ok(check) => replay_arena::Error::from(check).into(),
                Err(w) => w,
            })?;
    }
    Ok(())
}

/// Records `event` on `s`.
pub fn record(event: &CudaEvent, s: &cuda::Stream) -> Result<()> {
    // SAFETY: both are live objects of this context.
    check("cuEventRecord", unsafe {
        sys::cuEventRecord(event.cu_event(), s.cu_stream())
    })
}

/// Makes `s` wait for `event`'s latest record.
pub fn wait(s: &cuda::Stream, event: &CudaEvent) -> Result<()> {
    // SAFETY: both are live objects of this context.
    check("cuStreamWaitEvent", unsafe {
        sys::cuStreamWaitEvent(s.cu_stream(), event.cu_event(), 0)
    })
}

/// Replays one step of every runner with no fence (the unsafe reference):
/// as [`graphed_step`], but each consumer waits only for its runner's graph
/// (an event recorded after the launch), and each module only for the input
/// gradient it reads; nothing stops a later replay from overwriting bytes a
/// consumer or the next module has not read yet.
///
/// # Safety
///
/// As [`Replayable::replay_unfenced`]: the caller accepts that shards may be
/// overwritten before they are accumulated (the numbers are then wrong, the
/// memory stays valid), and synchronizes before any fenced replay of the
/// same `replayable`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn unfenced_step<B: Compose<Stream = cuda::Stream>>(
    model: &Model,
    replayable: &mut Replayable<B>,
    mains: &[Vec<u64>],
    shards: &[Vec<u64>],
    pool: &[cuda::Stream],
    side: &cuda::Stream,
    graph_done: &[CudaEvent],
) -> Result<()> {
    let n = model.modules.len();
    for m in 0..n {
        let s = &pool[m % pool.len()];
        // SAFETY: the caller's contract (the replay still waits for the
        // input gradient it reads).
        unsafe { replayable.replay_unfenced(RunnerId(m as u32), s) }?;
        record(&graph_done[m], s)?;
        wait(side, &graph_done[m])?;
        model.accumulate(m, &mains[m], &shards[m], side)?;
    }
    Ok(())
}

/// A timing-free event of the backend's context.
pub fn new_event(backend: &cuda::Device) -> Result<CudaEvent> {
    backend
        .context()
        .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
        .map_err(driver("cuEventCreate"))
}

/// What a traced run of steps does at the step boundary: `uses` in
/// enqueue order, `per_step` of them a step (a step's replays and
/// consumers, or a step graph launch's nodes), medians over the steps
/// after the first.
pub struct Boundaries {
    /// From one step's last work ending to the next's.
    pub period_us: f64,
    /// From the step before ending (its last work, consumers included) to
    /// this step's first work starting: negative when the steps overlap.
    pub gap_us: f64,
    /// From the step's last replay ending to its last work ending (the
    /// last consumers' tail).
    pub tail_us: f64,
}

impl Boundaries {
    /// The boundaries of `uses`, whose step each is `step(index, use)`
    /// (consecutive uses of one step together).
    pub fn of(
        uses: &[replay_arena::Use],
        step: impl Fn(usize, &replay_arena::Use) -> usize,
    ) -> Boundaries {
        // Per step: its first start, its last end, its last replay's end.
        let mut steps: Vec<(usize, f64, f64, f64)> = Vec::new();
        for (i, u) in uses.iter().enumerate() {
            let k = step(i, u);
            if steps.last().is_none_or(|s| s.0 != k) {
                steps.push((k, f64::INFINITY, f64::NEG_INFINITY, f64::NEG_INFINITY));
            }
            let Some(s) = steps.last_mut() else { continue };
            s.1 = s.1.min(u.start_us);
            s.2 = s.2.max(u.end_us);
            if matches!(u.kind, replay_arena::UseKind::Replay { .. }) {
                s.3 = s.3.max(u.end_us);
            }
        }
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
        };
        let pairs = || steps.windows(2);
        Boundaries {
            period_us: median(pairs().map(|w| w[1].2 - w[0].2).collect()),
            gap_us: median(pairs().map(|w| w[1].1 - w[0].2).collect()),
            tail_us: median(steps.iter().skip(1).map(|s| s.2 - s.3).collect()),
        }
    }
}
