//! Start-up at serving scale: `cargo bench --bench gpu_startup` on a machine
//! with an NVIDIA GPU (it says why it skipped on one without), beside
//! `python3 benches/torch_startup.py` (PyTorch capturing the same sizes).
//!
//! 67 shape buckets, vLLM's default capture sizes (batch 1, 2, 4, then 8 to
//! 512 by 8), of one small layer stack: `LAYERS` layers of
//! `h = tanh(h * w + b)` on a batch x `HIDDEN` f32 activation, three
//! kernels per layer (scale, shift, tanh), as PyTorch runs it. Each layer
//! is a runner: its two intermediates are its own requests, its output a
//! handoff the next layer receives.
//!
//! Timed from the first discovery to every bucket's step graph built and
//! kept: one eager run per bucket (as PyTorch warms up before it
//! captures), discovery, planning, allocation, capture, seal, and one step
//! graph per bucket. Then: the arena bytes the plan holds, and the
//! driver's graph memory (reserved, used) against before the plan. One
//! launch of every bucket's step graph, then its last layer's output read
//! back against the eager run's, bitwise.
//!
//! All of it twice: first with lazy instantiation
//! (`cuda::Device::with_lazy_instantiation`), where the runner graphs, only
//! ever composed into step graphs here, are never instantiated, and each
//! step graph is instantiated at its first launch (timed apart, every
//! bucket's step graph launched once); then with the runner graphs
//! instantiated at capture and the step graphs at their build (the
//! default). Beside the step graphs: the same parent graphs composed and
//! instantiated by hand.

use std::time::Instant;

use replay_arena::cuda;
use replay_arena::cuda::cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};
use replay_arena::cuda::cudarc::nvrtc::compile_ptx;
use replay_arena::cuda::probe;
use replay_arena::{DType, Discovering, Domain, HandoffId, PlanConfig, Policy, Request, RunnerId};

const LAYERS: usize = 4;
const HIDDEN: usize = 1024;

const SOURCE: &str = r#"
extern "C" __global__ void scale(const float* x, float* y, float w, unsigned int n) {
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) y[i] = x[i] * w;
}
extern "C" __global__ void shift(const float* x, float* y, float b, unsigned int n) {
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) y[i] = x[i] + b;
}
extern "C" __global__ void tanh_(const float* x, float* y, unsigned int n) {
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) y[i] = tanhf(x[i]);
}
extern "C" __global__ void ramp(float* x, unsigned int n) {
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] = (float)(i % 97) / 97.0f - 0.5f;
}
"#;

type R<T> = Result<T, Box<dyn std::error::Error>>;

/// vLLM's default capture sizes: 1, 2, 4, then 8 to 512 by 8.
fn sizes() -> Vec<usize> {
    let mut s = vec![1, 2, 4];
    s.extend((1..=64).map(|k| 8 * k));
    s
}

struct Kernels {
    scale: CudaFunction,
    shift: CudaFunction,
    tanh: CudaFunction,
    ramp: CudaFunction,
}

fn config(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(256).min(1024) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn err(e: impl std::fmt::Debug) -> String {
    format!("{e:?}")
}

/// One layer: `out = tanh(input * w + b)` through `t1` and `t2`.
#[allow(clippy::too_many_arguments)]
fn layer(
    k: &Kernels,
    s: &cuda::Stream,
    (input, t1, t2, out): (u64, u64, u64, u64),
    w: f32,
    b: f32,
    n: usize,
) -> Result<(), String> {
    let n32 = n as u32;
    let cfg = config(n);
    let mut l = s.cudarc().launch_builder(&k.scale);
    l.arg(&input).arg(&t1).arg(&w).arg(&n32);
    unsafe { l.launch(cfg) }.map_err(err)?;
    let mut l = s.cudarc().launch_builder(&k.shift);
    l.arg(&t1).arg(&t2).arg(&b).arg(&n32);
    unsafe { l.launch(cfg) }.map_err(err)?;
    let mut l = s.cudarc().launch_builder(&k.tanh);
    l.arg(&t2).arg(&out).arg(&n32);
    unsafe { l.launch(cfg) }.map_err(err)?;
    Ok(())
}

fn weights(l: usize) -> (f32, f32) {
    (0.9 + 0.05 * l as f32, 0.01 * l as f32 - 0.02)
}

fn main() -> R<()> {
    if let Err(e) = probe() {
        println!("gpu_startup: skipped, no usable GPU: {e}");
        return Ok(());
    }
    let backend = cuda::Device::new(0)?;
    println!("gpu_startup on {}", backend.info());
    let ptx = compile_ptx(SOURCE).map_err(err)?;
    let m = backend.context().load_module(ptx).map_err(err)?;
    let f = |n: &str| m.load_function(n).map_err(err);
    let k = Kernels {
        scale: f("scale")?,
        shift: f("shift")?,
        tanh: f("tanh_")?,
        ramp: f("ramp")?,
    };
    let sizes = sizes();
    let max = sizes.iter().max().copied().unwrap_or(1) * HIDDEN;
    let s = backend.new_stream()?;
    let cu = s.cudarc().clone();
    // The program's input (the largest bucket's), and the eager run's
    // buffers, its own.
    let x = cu.alloc_zeros::<f32>(max)?;
    let eager: Vec<_> = (0..4)
        .map(|_| cu.alloc_zeros::<f32>(max))
        .collect::<Result<_, _>>()?;
    let addr = |b: &replay_arena::cuda::cudarc::driver::CudaSlice<f32>| {
        use replay_arena::cuda::cudarc::driver::DevicePtr;
        b.device_ptr(&cu).0
    };
    let (xa, ea): (u64, Vec<u64>) = (addr(&x), eager.iter().map(addr).collect());
    {
        let mut l = cu.launch_builder(&k.ramp);
        let n32 = max as u32;
        l.arg(&xa).arg(&n32);
        unsafe { l.launch(config(max)) }.map_err(err)?;
    }
    cu.synchronize()?;
    let before = backend.graph_memory_in_use()?;

    // The eager run of `batch`, on the program's own buffers: the address
    // of its last output.
    let eager_run = |batch: usize| -> Result<u64, String> {
        let mut h = xa;
        for l in 0..LAYERS {
            let (w, b) = weights(l);
            let out = ea[2 + l % 2];
            layer(&k, &s, (h, ea[0], ea[1], out), w, b, batch * HIDDEN)?;
            h = out;
        }
        Ok(h)
    };
    // Twice: runner graphs instantiated lazily (`with_lazy_instantiation`:
    // only step graphs are launched, so none of them is), first, on a
    // driver as cold as PyTorch's; then at capture (the default).
    let base = backend.clone();
    for lazy in [true, false] {
        let backend = base.clone().with_lazy_instantiation(lazy);
        let t0 = Instant::now();
        // One eager run per bucket, and its discovery.
        let mut d = Discovering::new(PlanConfig::new());
        let mut handoffs: Vec<Vec<HandoffId>> = Vec::new();
        for (bucket, &batch) in sizes.iter().enumerate() {
            let n = batch * HIDDEN;
            eager_run(batch)?;
            d.bucket(format!("batch={batch}"))?;
            let req = Request::new(Domain::Device, DType::F32, n as u64);
            let mut hs = Vec::with_capacity(LAYERS);
            for l in 0..LAYERS {
                let mut a = d.arm(RunnerId((bucket * LAYERS + l) as u32))?;
                a.record(req)?;
                a.record(req)?;
                if l > 0 {
                    a.receive(hs[l - 1])?;
                }
                hs.push(a.hand_off(req)?);
            }
            handoffs.push(hs);
        }
        let discovered = t0.elapsed();
        let mut capturing = d.plan(Policy::OverlapDepth(2))?.allocate(backend.clone())?;
        let allocated = t0.elapsed();
        // Each bucket's last output, at its fixed address.
        let mut last_out = Vec::with_capacity(sizes.len());
        for (bucket, &batch) in sizes.iter().enumerate() {
            let n = batch * HIDDEN;
            let req = Request::new(Domain::Device, DType::F32, n as u64);
            for l in 0..LAYERS {
                let cap = capturing.capture(RunnerId((bucket * LAYERS + l) as u32))?;
                let (t1, t2) = (cap.take(req)?, cap.take(req)?);
                let out = cap.hand_off(handoffs[bucket][l])?;
                let input = match l {
                    0 => None,
                    _ => Some(cap.receive(handoffs[bucket][l - 1])?),
                };
                let (w, b) = weights(l);
                if l == LAYERS - 1 {
                    last_out.push(out.device_address());
                }
                cap.stream_capture(&s, |s| {
                    let inp = input.as_ref().map_or(xa, |v| v.device_address());
                    let views = (
                        inp,
                        t1.device_address(),
                        t2.device_address(),
                        out.device_address(),
                    );
                    layer(&k, s, views, w, b, n)
                })?;
                cap.finish()?;
            }
        }
        let mut replayable = capturing.seal()?;
        let sealed = t0.elapsed();
        let mut kept = Vec::with_capacity(sizes.len());
        for bucket in 0..sizes.len() {
            let mut step = replayable.step();
            for l in 0..LAYERS {
                step.replay(RunnerId((bucket * LAYERS + l) as u32), &s)?;
            }
            kept.push(step.build()?.keep());
        }
        let built = t0.elapsed();
        s.synchronize()?;
        let started = t0.elapsed();
        // Beside the step graphs: the same parent graphs composed by hand
        // (a chain of child graph nodes of the runners' captured graphs,
        // instantiated), then the crate's again and the hand's again, warm.
        let hand_first = hand_steps(&replayable, sizes.len())?;
        let crate_again = {
            let t = Instant::now();
            let again = (0..sizes.len())
                .map(|bucket| {
                    let mut step = replayable.step();
                    for l in 0..LAYERS {
                        step.replay(RunnerId((bucket * LAYERS + l) as u32), &s)?;
                    }
                    Ok(step.build()?.keep())
                })
                .collect::<R<Vec<_>>>()?;
            let took = t.elapsed();
            drop(again);
            took
        };
        let hand_again = hand_steps(&replayable, sizes.len())?;
        // Every bucket's first launch (lazily: its instantiation too).
        let t = Instant::now();
        for kept in kept.iter_mut() {
            replayable.launch_kept(kept, &s)?;
        }
        s.synchronize()?;
        let first_launches = t.elapsed();
        let after = backend.graph_memory_in_use()?;
        let arena = replayable.plan().report().plan_bytes;

        // Every bucket's step graph once, its output against eager, bitwise.
        let read = |addr: u64, n: usize| -> R<Vec<f32>> {
            s.synchronize()?;
            let mut host = vec![0f32; n];
            // SAFETY: a read of the program's own after a full wait; leaked
            // after (the memory is not cudarc's to free).
            let view = unsafe { cu.upgrade_device_ptr::<f32>(addr, n) };
            cu.memcpy_dtoh(&view, &mut host)?;
            view.leak();
            Ok(host)
        };
        let mut equal = 0;
        for (bucket, kept) in kept.iter_mut().enumerate() {
            let n = sizes[bucket] * HIDDEN;
            let expected = read(eager_run(sizes[bucket])?, n)?;
            replayable.launch_kept(kept, &s)?;
            let host = read(last_out[bucket], n)?;
            if host
                .iter()
                .zip(&expected)
                .all(|(a, b)| a.to_bits() == b.to_bits())
            {
                equal += 1;
            }
        }
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        println!(
            "## start-up: {} buckets x {LAYERS} layers (hidden {HIDDEN}, 3 kernels a layer), one eager run per bucket; runner graphs instantiated {}",
            sizes.len(),
            if lazy { "lazily (at a first replay: none here)" } else { "at capture" }
        );
        println!("| what | value |");
        println!("|---|---:|");
        println!(
            "| eager runs + discovery, ms | {:.1} |",
            discovered.as_secs_f64() * 1e3
        );
        println!(
            "| first eager run to every step graph built, ms | {:.1} |",
            started.as_secs_f64() * 1e3
        );
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        println!(
            "| of which: plan + allocate / capture + seal / step graphs / the last synchronize, ms | {:.1} / {:.1} / {:.1} / {:.1} |",
            ms(allocated - discovered),
            ms(sealed - allocated),
            ms(built - sealed),
            ms(started - built)
        );
        println!(
            "| step graphs: the crate's{} (first, again) / by hand, instantiated (first, again), ms | {:.1}, {:.1} / {:.1}, {:.1} |",
            if lazy { ", composed only" } else { "" },
            ms(built - sealed),
            ms(crate_again),
            ms(hand_first),
            ms(hand_again)
        );
        println!(
            "| every step graph's first launch{}, then a synchronize, ms | {:.1} |",
            if lazy { " (its instantiation)" } else { "" },
            ms(first_launches)
        );
        println!(
            "| first eager run to every step graph launched once, ms | {:.1} |",
            ms(started + first_launches)
        );
        println!("| arena bytes, MiB | {:.2} |", mib(arena));
        println!(
            "| driver graph memory reserved, MiB (before, after) | {:.1}, {:.1} |",
            mib(before.reserved),
            mib(after.reserved)
        );
        println!(
            "| driver graph memory used, MiB (before, after) | {:.1}, {:.1} |",
            mib(before.used),
            mib(after.used)
        );
        println!(
            "| buckets bitwise equal to eager | {equal} of {} |",
            sizes.len()
        );
        drop(kept);
    }
    Ok(())
}

/// Composes by hand what the crate's step graphs compose: per bucket a
/// parent graph of a chain of child graph nodes, the runners' captured
/// graphs, instantiated with no flags; the time for all `buckets`, after
/// which they are destroyed.
fn hand_steps(
    replayable: &replay_arena::Replayable<cuda::Device>,
    buckets: usize,
) -> R<std::time::Duration> {
    use replay_arena::cuda::cudarc::driver::sys;
    let graphs = (0..buckets * LAYERS)
        .map(|r| {
            (replayable.graph(RunnerId(r as u32)))
                .map(cuda::Graph::cu_graph)
                .ok_or("a runner without a graph")
        })
        .collect::<Result<Vec<_>, _>>()?;
    let ok = |code: sys::CUresult, call: &str| match code {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        code => Err(format!("{call}: {code:?}")),
    };
    let t = Instant::now();
    let mut made = Vec::with_capacity(buckets);
    for bucket in 0..buckets {
        // SAFETY: the runners' graphs are live for the call (the plan
        // holds them); what is created here is destroyed below.
        unsafe {
            let mut parent = std::ptr::null_mut();
            ok(sys::cuGraphCreate(&mut parent, 0), "cuGraphCreate")?;
            let mut prev: Option<sys::CUgraphNode> = None;
            for &g in &graphs[bucket * LAYERS..(bucket + 1) * LAYERS] {
                let mut node = std::ptr::null_mut();
                let deps: &[sys::CUgraphNode] = prev.as_slice();
                ok(
                    sys::cuGraphAddChildGraphNode(&mut node, parent, deps.as_ptr(), deps.len(), g),
                    "cuGraphAddChildGraphNode",
                )?;
                prev = Some(node);
            }
            let mut exec = std::ptr::null_mut();
            ok(
                sys::cuGraphInstantiateWithFlags(&mut exec, parent, 0),
                "cuGraphInstantiateWithFlags",
            )?;
            made.push((exec, parent));
        }
    }
    let took = t.elapsed();
    for (exec, parent) in made {
        // SAFETY: made above, never launched.
        unsafe {
            sys::cuGraphExecDestroy(exec);
            sys::cuGraphDestroy(parent);
        }
    }
    Ok(took)
}
