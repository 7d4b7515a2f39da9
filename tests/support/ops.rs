//! A small op library shaped like a framework's (candle's): every op
//! allocates its output on the stream it runs on (`alloc_zeros`, i.e.
//! `cuMemAllocAsync`), and intermediates are dropped when done
//! (`cuMemFreeAsync`). Inside a runner's capture these become graph memory
//! nodes. Values are `i32` with wrapping arithmetic, so every run agrees
//! bit for bit.

use std::sync::OnceLock;

use replay_arena::cuda;
use replay_arena::cuda::cudarc::driver::{
    CudaFunction, CudaSlice, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, PushKernelArg,
};

use super::gpu::{cfg, device, err, load_kernels};

/// An op's error, formatted (there is a driver here).
pub type OpResult<T> = std::result::Result<T, String>;

const SOURCE: &str = r#"
__device__ unsigned int mix(unsigned int x) {
    x ^= x >> 16; x *= 0x7feb352dU; x ^= x >> 15; x *= 0x846ca68bU; x ^= x >> 16;
    return x;
}
// out[i] = mix(a[i] ^ (b[i] * 0x9e3779b9 + salt))
extern "C" __global__ void mix2(int* out, const int* a, const int* b, unsigned int n, unsigned int salt) {
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        out[i] = (int)mix((unsigned int)a[i] ^ ((unsigned int)b[i] * 0x9e3779b9U + salt));
}
// acc[i] = acc[i] * 1664525 + w[i] (a slow one when spin > 0)
extern "C" __global__ void fold(int* acc, const int* w, unsigned int n, long long spin) {
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        unsigned int v = (unsigned int)w[i];
        if (spin > 0) { long long t0 = clock64(); while (clock64() - t0 < spin) { } }
        acc[i] = (int)((unsigned int)acc[i] * 1664525U + v);
    }
}
"#;

/// The op library on one device.
pub struct Ops {
    mix2: CudaFunction,
    fold: CudaFunction,
}

impl Ops {
    /// Loads the kernels into the backend's context.
    pub fn new(backend: &cuda::Device) -> Ops {
        static PTX: OnceLock<String> = OnceLock::new();
        let [mix2, fold] = load_kernels(backend, &PTX, SOURCE, ["mix2", "fold"]);
        Ops { mix2, fold }
    }

    /// A new tensor: `mix(a ^ (b * golden + salt))`, allocated on `s` (a
    /// graph allocation node when `s` captures).
    pub fn mix2(
        &self,
        s: &cuda::Stream,
        a: &impl DevicePtr<i32>,
        b: &impl DevicePtr<i32>,
        salt: u32,
    ) -> OpResult<CudaSlice<i32>> {
        let n = a.len();
        let mut out: CudaSlice<i32> = s.cudarc().alloc_zeros(n).map_err(err)?;
        self.mix2_into(s, &mut out, a, b, salt)?;
        Ok(out)
    }

    /// `mix2` into an existing tensor (a plan view, say).
    pub fn mix2_into(
        &self,
        s: &cuda::Stream,
        out: &mut impl DevicePtrMut<i32>,
        a: &impl DevicePtr<i32>,
        b: &impl DevicePtr<i32>,
        salt: u32,
    ) -> OpResult<()> {
        let n = a.len() as u32;
        let cs = s.cudarc();
        // Addresses through the pointer traits: a plan view hands out its
        // own only inside its closure, on its stream.
        let (o, _o) = out.device_ptr_mut(cs);
        let (pa, _a) = a.device_ptr(cs);
        let (pb, _b) = b.device_ptr(cs);
        let mut l = cs.launch_builder(&self.mix2);
        l.arg(&o).arg(&pa).arg(&pb).arg(&n).arg(&salt);
        // SAFETY: the kernel reads `n` elements of `a` and `b` and writes
        // `n` of `out`, all at least that long.
        unsafe { l.launch(cfg(n)) }.map(|_| ()).map_err(err)
    }

    /// `acc = acc * 1664525 + w`, spinning `spin` cycles per element.
    pub fn fold(
        &self,
        s: &cuda::Stream,
        acc: &mut impl DevicePtrMut<i32>,
        w: &impl DevicePtr<i32>,
        spin: i64,
    ) -> OpResult<()> {
        let n = w.len() as u32;
        let cs = s.cudarc();
        let (pacc, _acc) = acc.device_ptr_mut(cs);
        let (pw, _w) = w.device_ptr(cs);
        let mut l = cs.launch_builder(&self.fold);
        l.arg(&pacc).arg(&pw).arg(&n).arg(&spin);
        // SAFETY: as `mix2_into`.
        unsafe { l.launch(cfg(n)) }.map(|_| ()).map_err(err)
    }

    /// A copy into an existing tensor.
    pub fn copy_into(
        &self,
        s: &cuda::Stream,
        src: &impl DevicePtr<i32>,
        dst: &mut impl DevicePtrMut<i32>,
    ) -> OpResult<()> {
        s.cudarc().memcpy_dtod(src, dst).map_err(err)
    }

    /// The op in the framework's own types (as a framework's API takes
    /// cudarc's borrowed views): `mix2` of two views, output allocated.
    pub fn mix2_v(
        &self,
        s: &cuda::Stream,
        a: &CudaView<'_, i32>,
        b: &CudaView<'_, i32>,
        salt: u32,
    ) -> OpResult<CudaSlice<i32>> {
        self.mix2(s, a, b, salt)
    }

    /// `mix2` into a writable view (`out=`, as cuBLAS writes a GEMM's C).
    pub fn mix2_out(
        &self,
        s: &cuda::Stream,
        out: &mut CudaViewMut<'_, i32>,
        a: &CudaView<'_, i32>,
        b: &CudaView<'_, i32>,
        salt: u32,
    ) -> OpResult<()> {
        self.mix2_into(s, out, a, b, salt)
    }

    /// `fold` of a view into an accumulator the program owns.
    pub fn fold_v(
        &self,
        s: &cuda::Stream,
        acc: &mut CudaSlice<i32>,
        w: &CudaView<'_, i32>,
        spin: i64,
    ) -> OpResult<()> {
        self.fold(s, acc, w, spin)
    }
}

/// A framework on the first GPU: the device, the op library in its
/// context, and the stream it uploads and reads on.
pub struct Framework {
    pub backend: cuda::Device,
    pub ops: Ops,
    pub io: cuda::Stream,
}

impl Framework {
    pub fn new() -> Framework {
        let backend = device();
        let ops = Ops::new(&backend);
        let io = backend.new_stream().unwrap();
        Framework { backend, ops, io }
    }

    /// `n` values `i * seed ^ seed` (wrapping), uploaded on `io`.
    pub fn seeded(&self, n: usize, seed: i32) -> CudaSlice<i32> {
        let host: Vec<i32> = (0..n as i32).map(|i| i.wrapping_mul(seed) ^ seed).collect();
        self.io.cudarc().clone_htod(&host).unwrap()
    }
}

/// A layered model's tensors of `n` values each: a weight per layer
/// (seeded `3 + 2l`), an input per layer (`101 + 2l`) where asked for,
/// and the loss gradient (`7919`).
pub struct Layers {
    pub weights: Vec<CudaSlice<i32>>,
    pub inputs: Vec<CudaSlice<i32>>,
    pub loss: CudaSlice<i32>,
}

impl Layers {
    /// Uploads the tensors on `fw.io` and waits for them.
    pub fn new(fw: &Framework, layers: usize, n: usize, inputs: bool) -> Layers {
        let weights = (0..layers)
            .map(|l| fw.seeded(n, 3 + 2 * l as i32))
            .collect();
        let inputs = match inputs {
            true => (0..layers)
                .map(|l| fw.seeded(n, 101 + 2 * l as i32))
                .collect(),
            false => Vec::new(),
        };
        let loss = fw.seeded(n, 7919);
        fw.io.synchronize().unwrap();
        Layers {
            weights,
            inputs,
            loss,
        }
    }
}
