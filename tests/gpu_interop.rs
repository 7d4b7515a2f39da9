//! Adopting the crate from a cudarc program, on the GPU: the program's
//! context (event tracking refused or turned off by an explicit opt-in), its
//! streams (the per-thread default stream captured in every capture mode,
//! the legacy NULL stream refused), typed views handed to cudarc
//! (`memcpy_dtod`, `memset_zeros`, `launch_builder().arg`) and to a cuBLAS
//! gemm inside a capture, teardown that waits for the plan's work only, and
//! the first replay's latency with and without graph upload.
//!
//! Ignored without a GPU: `cargo test --test gpu_interop -- --include-ignored`.
#![cfg(feature = "cuda")]

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use replay_arena::cuda;
use replay_arena::cuda::cudarc::cublas::sys::cublasOperation_t;
use replay_arena::cuda::cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use replay_arena::cuda::cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, DeviceSlice, LaunchConfig, PushKernelArg,
};
use replay_arena::cuda::cudarc::nvrtc::{compile_ptx, Ptx};
use replay_arena::cuda::{CaptureMode, ViewExt};
use replay_arena::{
    BackendError, Capturing, DType, Discovering, Domain, PlanConfig, Policy, Replayable, Request,
    RunnerId, View,
};

const SOURCE: &str = r#"
// x[i] = a + b * (i % 7): small integers, exact in f32 (and tf32).
extern "C" __global__ void fill(float* x, unsigned int n, float a, float b) {
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        x[i] = a + b * (float)(i % 7u);
}

extern "C" __global__ void add(float* x, unsigned int n, float v) {
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        x[i] += v;
}

extern "C" __global__ void scale(float* x, unsigned int n, float s) {
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        x[i] *= s;
}

__device__ unsigned long long now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Spins for `ns` nanoseconds, then adds v to x (if any). Launched as one thread.
extern "C" __global__ void spin(unsigned long long ns, float* x, unsigned int n, float v) {
    unsigned long long t0 = now();
    while (now() - t0 < ns) { }
    if (x != 0 && blockIdx.x == 0 && threadIdx.x == 0)
        for (unsigned int i = 0; i < n; ++i) x[i] += v;
}
"#;

/// GPU tests of this binary run one at a time: a global-mode capture fails
/// other threads' allocations, and the timings need a quiet device.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The program's own context, as cudarc makes it (event tracking on).
fn program_context() -> Arc<CudaContext> {
    replay_arena::cuda::probe()
        .unwrap_or_else(|e| panic!("this test needs a CUDA GPU (run it on a GPU machine): {e}"));
    CudaContext::new(0).unwrap_or_else(|e| panic!("CudaContext::new: {e:?}"))
}

struct Kernels {
    fill: CudaFunction,
    add: CudaFunction,
    scale: CudaFunction,
    spin: CudaFunction,
}

fn kernels(ctx: &Arc<CudaContext>) -> Kernels {
    static PTX: OnceLock<String> = OnceLock::new();
    let src = PTX.get_or_init(|| {
        compile_ptx(SOURCE)
            .unwrap_or_else(|e| panic!("nvrtc: {e:?}"))
            .to_src()
    });
    let module = ctx
        .load_module(Ptx::from_src(src.clone()))
        .unwrap_or_else(|e| panic!("load_module: {e:?}"));
    let f = |name: &str| {
        module
            .load_function(name)
            .unwrap_or_else(|e| panic!("{name}: {e:?}"))
    };
    Kernels {
        fill: f("fill"),
        add: f("add"),
        scale: f("scale"),
        spin: f("spin"),
    }
}

/// The program's context adopted through the explicit opt-in, once this
/// test holds [`serial`]'s lock (the guard, first).
fn adopted() -> (
    MutexGuard<'static, ()>,
    Arc<CudaContext>,
    cuda::Device,
    Kernels,
) {
    let serial = serial();
    let ctx = program_context();
    // SAFETY: these tests order their own slices with stream syncs.
    let backend = unsafe { cuda::Device::from_context_disabling_event_tracking(ctx.clone()) }
        .unwrap_or_else(|e| panic!("adopting the context: {e}"));
    let k = kernels(&ctx);
    (serial, ctx, backend, k)
}

fn f32s(n: u64) -> Request {
    Request::new(Domain::Device, DType::F32, n)
}

/// A plan of one runner (0) with these requests, allocated on `backend`.
fn one_runner(backend: &cuda::Device, requests: &[Request]) -> Capturing<cuda::Device> {
    let runner = [(RunnerId(0), requests.iter().copied())];
    Discovering::from_runners(PlanConfig::new(), runner)
        .unwrap()
        .plan(Policy::Generations(1))
        .unwrap()
        .allocate(backend.clone())
        .unwrap_or_else(|e| panic!("allocate: {e}"))
}

/// One runner recording `requests`, captured on `stream` by `work` (which
/// gets the runner's views in request order), finished and sealed.
fn sealed_one(
    backend: &cuda::Device,
    stream: &cuda::Stream,
    requests: &[Request],
    work: impl FnOnce(&cuda::Stream, &[View<'_>]) -> Result<(), String>,
) -> Replayable<cuda::Device> {
    let mut capturing = one_runner(backend, requests);
    {
        let cap = capturing.capture(RunnerId(0)).unwrap();
        let views: Vec<View<'_>> = requests.iter().map(|&q| cap.take(q).unwrap()).collect();
        cap.stream_capture(stream, |s| work(s, &views))
            .unwrap_or_else(|e| panic!("capture: {e}"));
        cap.finish().unwrap_or_else(|e| panic!("finish: {e}"));
    }
    capturing.seal().unwrap()
}

fn e<T: std::fmt::Debug>(op: &'static str) -> impl Fn(T) -> String {
    move |err| format!("{op}: {err:?}")
}

/// Reads runner 0's view `index` through a fenced consumer on `stream`.
fn read_view(
    replayable: &mut Replayable<cuda::Device>,
    stream: &cuda::Stream,
    index: usize,
) -> Vec<f32> {
    let mut host = Vec::new();
    replayable
        .consume(RunnerId(0), stream, |s, views| -> Result<(), String> {
            let view = views[index].as_cuda::<f32>(s).map_err(|e| e.to_string())?;
            host = vec![0f32; views[index].len()];
            s.cudarc()
                .memcpy_dtoh(&view, &mut host)
                .map_err(e("memcpy_dtoh"))
        })
        .unwrap_or_else(|e| panic!("consume: {e}"));
    stream.synchronize().unwrap();
    host
}

fn launch_cfg(n: usize) -> LaunchConfig {
    LaunchConfig::for_num_elems(n as u32)
}

/// `x[i] += v` over the `n` floats of the typed view `x`, on `s`.
fn add(
    k: &Kernels,
    s: &cuda::Stream,
    x: &mut replay_arena::cuda::TypedView<'_, f32>,
    n: usize,
    v: f32,
) -> Result<(), String> {
    let count = n as u32;
    let mut launch = s.cudarc().launch_builder(&k.add);
    launch.arg(x).arg(&count).arg(&v);
    // SAFETY: add(float*, unsigned, float) over the view's n floats.
    unsafe { launch.launch(launch_cfg(n)) }.map_err(e("add"))?;
    Ok(())
}

/// One runner of `n` f32s whose graph [`add`]s `v` to them `times` times,
/// captured on `stream` and sealed.
fn sealed_add(
    backend: &cuda::Device,
    k: &Kernels,
    stream: &cuda::Stream,
    (n, v, times): (usize, f32, usize),
) -> Replayable<cuda::Device> {
    sealed_one(backend, stream, &[f32s(n as u64)], |s, views| {
        let mut x = views[0].as_cuda::<f32>(s).map_err(|e| e.to_string())?;
        for _ in 0..times {
            add(k, s, &mut x, n, v)?;
        }
        Ok(())
    })
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn adopting_a_context_with_event_tracking_on_is_refused_naming_the_fix() {
    let _gpu = serial();
    let ctx = program_context();
    assert!(ctx.is_event_tracking(), "cudarc's default");
    let err = cuda::Device::from_context(ctx.clone()).unwrap_err();
    assert_eq!(err, BackendError::EventTracking);
    let message = err.to_string();
    assert!(message.contains("disable_event_tracking"), "{message}");
    assert!(
        message.contains("from_context_disabling_event_tracking"),
        "{message}"
    );
    assert!(ctx.is_event_tracking(), "refusing leaves the context alone");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_opt_in_turns_tracking_off_so_a_slice_made_with_tracking_on_is_captured() {
    let _gpu = serial();
    let ctx = program_context();
    let k = kernels(&ctx);
    // The program's slice, made while cudarc tracked it on a second stream.
    let program = ctx.new_stream().unwrap();
    let host: Vec<f32> = (0..4096).map(|i| (i % 97) as f32).collect();
    let input = program.clone_htod(&host).unwrap();
    program.synchronize().unwrap();

    // SAFETY: the program synchronized its stream above.
    let backend =
        unsafe { cuda::Device::from_context_disabling_event_tracking(ctx.clone()) }.unwrap();
    assert!(!ctx.is_event_tracking());
    assert!(Arc::ptr_eq(backend.context(), &ctx));

    let stream = backend.new_stream().unwrap();
    let req = f32s(4096);
    let mut replayable = sealed_one(&backend, &stream, &[req], |s, views| {
        let view = &views[0];
        let mut out = view.as_cuda::<f32>(s).map_err(|e| e.to_string())?;
        s.cudarc()
            .memcpy_dtod(&input, &mut out)
            .map_err(e("memcpy_dtod"))?;
        add(&k, s, &mut out, 4096, 1.0)
    });
    replayable.replay(RunnerId(0), &stream).unwrap();
    let got = read_view(&mut replayable, &stream, 0);
    let want: Vec<f32> = host.iter().map(|x| x + 1.0).collect();
    assert_eq!(got, want);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_legacy_null_stream_is_refused_with_a_typed_error() {
    let (_gpu, ctx, backend, _k) = adopted();
    let err = backend.wrap_stream(ctx.default_stream()).unwrap_err();
    assert!(matches!(err, BackendError::LegacyStream { .. }), "{err:?}");
    assert!(err.to_string().contains("per_thread_stream"), "{err}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_per_thread_stream_is_captured_and_replayed_in_every_capture_mode() {
    let (_gpu, ctx, backend, k) = adopted();
    let stream = backend.wrap_stream(ctx.per_thread_stream()).unwrap();
    assert!(stream.is_per_thread());
    for (i, mode) in [
        CaptureMode::ThreadLocal,
        CaptureMode::Global,
        CaptureMode::Relaxed,
    ]
    .into_iter()
    .enumerate()
    {
        let backend = backend.clone().with_capture_mode(mode);
        assert_eq!(backend.capture_mode(), mode);
        let step = i as f32 + 1.0;
        let mut replayable = sealed_add(&backend, &k, &stream, (1000, step, 1));
        assert!(!replayable
            .graph(RunnerId(0))
            .unwrap()
            .cu_graph_exec()
            .is_null());
        for _ in 0..3 {
            replayable.replay(RunnerId(0), &stream).unwrap();
        }
        let got = read_view(&mut replayable, &stream, 0);
        // Arenas start zeroed; each replay adds i + 1.
        assert!(
            got.iter().all(|&x| x == 3.0 * (i as f32 + 1.0)),
            "{mode:?}: {:?}",
            &got[..4]
        );
    }
    assert_eq!(backend.capture_mode(), CaptureMode::ThreadLocal);

    // On another thread the handle names that thread's stream: refused.
    std::thread::scope(|scope| {
        let err = scope
            .spawn(|| stream.synchronize().unwrap_err())
            .join()
            .unwrap();
        assert!(matches!(err, BackendError::Refused { .. }), "{err:?}");
    });
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn typed_views_go_through_cudarc_memcpy_memset_and_kernel_arguments() {
    let (_gpu, _ctx, backend, k) = adopted();
    let stream = backend.new_stream().unwrap();
    let n = 5000usize;
    let host: Vec<f32> = (0..n).map(|i| (i % 13) as f32).collect();
    let input: CudaSlice<f32> = stream.cudarc().clone_htod(&host).unwrap();
    stream.synchronize().unwrap();

    let (a_req, b_req) = (f32s(n as u64), f32s(n as u64));
    let mut replayable = sealed_one(&backend, &stream, &[a_req, b_req], |s, views| {
        let [a, b] = views else {
            unreachable!("2 requests, 2 views")
        };
        // A dtype mismatch is a typed error.
        let err = a.as_cuda::<i32>(s).unwrap_err();
        assert_eq!(
            err,
            BackendError::DTypeMismatch {
                view: DType::F32,
                requested: DType::I32,
                type_name: "i32"
            }
        );
        let cu = s.cudarc();
        let mut a = a.as_cuda::<f32>(s).map_err(|e| e.to_string())?;
        let mut b = b.as_cuda::<f32>(s).map_err(|e| e.to_string())?;
        cu.memset_zeros(&mut b).map_err(e("memset_zeros"))?;
        cu.memcpy_dtod(&input, &mut a).map_err(e("memcpy_dtod"))?;
        let len = n as u32;
        let mut launch = cu.launch_builder(&k.scale);
        launch.arg(&mut a).arg(&len).arg(&2f32);
        // SAFETY: scale over the view's n floats.
        unsafe { launch.launch(launch_cfg(n)) }.map_err(e("scale"))?;
        cu.memcpy_dtod(&a, &mut b).map_err(e("memcpy_dtod"))?;
        Ok(())
    });
    for _ in 0..2 {
        replayable.replay(RunnerId(0), &stream).unwrap();
    }
    let want: Vec<f32> = host.iter().map(|x| 2.0 * x).collect();
    assert_eq!(read_view(&mut replayable, &stream, 1), want);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_cudarc_kernel_and_a_cublas_gemm_write_views_inside_a_capture() {
    let (_gpu, _ctx, backend, k) = adopted();
    let stream = backend.new_stream().unwrap();
    let (m, n, kk) = (64usize, 48usize, 32usize);
    let blas = CudaBlas::new(stream.cudarc().clone()).unwrap();
    // cuBLAS must not allocate while capturing: give it its workspace first.
    let mut workspace = stream.cudarc().alloc_zeros::<u8>(32 << 20).unwrap();
    {
        use replay_arena::cuda::cudarc::driver::DevicePtrMut;
        let (ptr, _sync) = workspace.device_ptr_mut(stream.cudarc());
        // SAFETY: the handle and the workspace live until the end of the test.
        let status = unsafe {
            replay_arena::cuda::cudarc::cublas::sys::cublasSetWorkspace_v2(
                *blas.handle(),
                ptr as *mut std::ffi::c_void,
                32 << 20,
            )
        };
        assert_eq!(
            status,
            replay_arena::cuda::cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS
        );
    }
    stream.synchronize().unwrap();

    let (a_req, b_req, c_req) = (
        f32s((m * kk) as u64),
        f32s((kk * n) as u64),
        f32s((m * n) as u64),
    );
    let mut replayable = sealed_one(&backend, &stream, &[a_req, b_req, c_req], |s, views| {
        let [a, b, c] = views else {
            unreachable!("3 requests, 3 views")
        };
        let cu = s.cudarc();
        let mut a = a.as_cuda::<f32>(s).map_err(|e| e.to_string())?;
        let mut b = b.as_cuda::<f32>(s).map_err(|e| e.to_string())?;
        let mut c = c.as_cuda::<f32>(s).map_err(|e| e.to_string())?;
        for (x, len, lo, step) in [(&mut a, m * kk, 1f32, 1f32), (&mut b, kk * n, -3f32, 1f32)] {
            let count = len as u32;
            let mut launch = cu.launch_builder(&k.fill);
            launch.arg(&mut *x).arg(&count).arg(&lo).arg(&step);
            // SAFETY: fill over the view's len floats.
            unsafe { launch.launch(launch_cfg(len)) }.map_err(e("fill"))?;
        }
        let cfg = GemmConfig {
            transa: cublasOperation_t::CUBLAS_OP_N,
            transb: cublasOperation_t::CUBLAS_OP_N,
            m: m as i32,
            n: n as i32,
            k: kk as i32,
            alpha: 1f32,
            lda: m as i32,
            ldb: kk as i32,
            beta: 0f32,
            ldc: m as i32,
        };
        // SAFETY: a is m x k, b is k x n, c is m x n, column-major.
        unsafe { blas.gemm(cfg, &a, &b, &mut c) }.map_err(e("gemm"))?;
        Ok(())
    });
    for _ in 0..3 {
        replayable.replay(RunnerId(0), &stream).unwrap();
    }
    let fill =
        |len: usize, lo: f32| -> Vec<f32> { (0..len).map(|i| lo + (i % 7) as f32).collect() };
    let (ha, hb) = (fill(m * kk, 1.0), fill(kk * n, -3.0));
    let mut want = vec![0f32; m * n];
    for col in 0..n {
        for row in 0..m {
            want[row + col * m] = (0..kk).map(|p| ha[row + p * m] * hb[p + col * kk]).sum();
        }
    }
    assert_eq!(read_view(&mut replayable, &stream, 2), want);
}

/// Launches `spin` for `ms` milliseconds on `stream` (adding 1 to `x`
/// afterwards when given).
fn spin(
    k: &Kernels,
    stream: &Arc<replay_arena::cuda::cudarc::driver::CudaStream>,
    ms: u64,
    x: Option<&mut replay_arena::cuda::TypedView<'_, f32>>,
) -> Result<(), String> {
    let ns = ms * 1_000_000;
    let null = 0u64;
    let len = x.as_ref().map_or(0, |x| DeviceSlice::len(&**x) as u32);
    let mut launch = stream.launch_builder(&k.spin);
    launch.arg(&ns);
    match x {
        Some(x) => launch.arg(x),
        None => launch.arg(&null),
    };
    launch.arg(&len).arg(&1f32);
    // SAFETY: spin(ns, float*, unsigned, float): `len` floats at the view,
    // or a null buffer that is not touched.
    let one = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1, 1, 1),
        shared_mem_bytes: 0,
    };
    unsafe { launch.launch(one) }.map_err(e("spin"))?;
    Ok(())
}

/// The program's long kernel on a stream of its own, and an event after it.
fn unrelated_work(
    ctx: &Arc<CudaContext>,
    k: &Kernels,
    ms: u64,
) -> (
    Arc<replay_arena::cuda::cudarc::driver::CudaStream>,
    CudaEvent,
) {
    let unrelated = ctx.new_stream().unwrap();
    spin(k, &unrelated, ms, None).unwrap();
    let done = ctx.new_event(None).unwrap();
    done.record(&unrelated).unwrap();
    (unrelated, done)
}

const UNRELATED_MS: u64 = 4000;
const FENCED_MS: u64 = 400;

#[test]
#[ignore = "needs a CUDA GPU"]
fn dropping_the_plan_waits_for_its_replay_but_not_for_the_programs_other_streams() {
    let (_gpu, ctx, backend, k) = adopted();
    let stream = backend.new_stream().unwrap();
    let req = f32s(256);
    let mut replayable = sealed_one(&backend, &stream, &[req], |s, views| {
        let view = &views[0];
        let mut x = view.as_cuda::<f32>(s).map_err(|e| e.to_string())?;
        spin(&k, s.cudarc(), FENCED_MS, Some(&mut x))
    });
    stream.synchronize().unwrap();

    let (_unrelated, unrelated_done) = unrelated_work(&ctx, &k, UNRELATED_MS);
    let started = Instant::now();
    replayable.replay(RunnerId(0), &stream).unwrap();
    let replay_done = ctx.new_event(None).unwrap();
    replay_done.record(stream.cudarc()).unwrap();
    drop(replayable);
    let took = started.elapsed();

    waited_for_fenced_work_only("drop", "replay", took, &replay_done, &unrelated_done);
}

/// Teardown (`what`) took `took`: it must have waited for the plan's own
/// `work` (done by `fenced_done`) and not for the program's unrelated kernel.
fn waited_for_fenced_work_only(
    what: &str,
    work: &str,
    took: Duration,
    fenced_done: &CudaEvent,
    unrelated_done: &CudaEvent,
) {
    assert!(
        fenced_done.is_complete(),
        "{what} freed the plan under its in-flight {work}"
    );
    assert!(
        took >= Duration::from_millis(FENCED_MS * 9 / 10),
        "{what} returned in {took:?}, before the {FENCED_MS} ms {work} could end"
    );
    assert!(
        !unrelated_done.is_complete(),
        "{what} waited for the program's unrelated {UNRELATED_MS} ms kernel ({took:?})"
    );
    assert!(took < Duration::from_millis(UNRELATED_MS / 2), "{took:?}");
    println!("{what} took {took:?} ({work} {FENCED_MS} ms, unrelated kernel {UNRELATED_MS} ms)");
    unrelated_done.synchronize().unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn replan_waits_for_a_consumer_but_not_for_the_programs_other_streams() {
    let (_gpu, ctx, backend, k) = adopted();
    let stream = backend.new_stream().unwrap();
    let consumer = backend.new_stream().unwrap();
    let mut replayable = sealed_add(&backend, &k, &stream, (256, 1.0, 1));
    stream.synchronize().unwrap();

    let (_unrelated, unrelated_done) = unrelated_work(&ctx, &k, UNRELATED_MS);
    let started = Instant::now();
    replayable.replay(RunnerId(0), &stream).unwrap();
    replayable
        .consume_mut(RunnerId(0), &consumer, |s, views| -> Result<(), String> {
            // A slow reader of the runner's view (it also writes it).
            let mut x = views[0].as_cuda::<f32>(s).map_err(|e| e.to_string())?;
            spin(&k, s.cudarc(), FENCED_MS, Some(&mut x))
        })
        .unwrap();
    let consumer_done = ctx.new_event(None).unwrap();
    consumer_done.record(consumer.cudarc()).unwrap();
    let discovery = replayable.replan().unwrap();
    let took = started.elapsed();
    drop(discovery);

    waited_for_fenced_work_only("replan", "consumer", took, &consumer_done, &unrelated_done);
}

/// Host time of the first and second replay (each launched and waited for)
/// of a fresh 256-kernel graph.
fn replay_latency(
    backend: &cuda::Device,
    k: &Kernels,
    stream: &cuda::Stream,
) -> (Duration, Duration) {
    let mut replayable = sealed_add(backend, k, stream, (1024, 1.0, 256));
    stream.synchronize().unwrap();
    let mut timed = || {
        let t = Instant::now();
        replayable.replay(RunnerId(0), stream).unwrap();
        stream.synchronize().unwrap();
        t.elapsed()
    };
    let first = timed();
    let second = timed();
    (first, second)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn first_replay_latency_with_and_without_graph_upload() {
    let (_gpu, _ctx, backend, k) = adopted();
    let stream = backend.new_stream().unwrap();
    assert!(backend.graph_upload(), "upload is on by default");
    // Warm up the module and the driver's launch path.
    replay_latency(&backend, &k, &stream);
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let mut rows = Vec::new();
    for upload in [false, true] {
        let backend = backend.clone().with_graph_upload(upload);
        let runs: Vec<(Duration, Duration)> = (0..9)
            .map(|_| replay_latency(&backend, &k, &stream))
            .collect();
        let first = median(runs.iter().map(|r| r.0).collect());
        let second = median(runs.iter().map(|r| r.1).collect());
        rows.push((upload, first, second));
    }
    assert!(backend.graph_upload());
    for (upload, first, second) in rows {
        println!(
            "graph upload {}: first replay {:.1} us, second replay {:.1} us (256-kernel graph, median of 9)",
            if upload { "on " } else { "off" },
            first.as_secs_f64() * 1e6,
            second.as_secs_f64() * 1e6
        );
    }
}

/// cudarc's event tracking off only where the program's cudarc calls go
/// into a graph (integration.md, "cudarc's event tracking"): eager work on
/// tracked slices of two streams is ordered by cudarc; the context is
/// adopted and each capture made with the flag off; per-runner replays,
/// consumers and a step graph run with it on; and the same capture with it
/// on fails (cudarc waits, inside the capture, on events recorded outside).
#[test]
#[ignore = "needs a CUDA GPU"]
fn tracking_stays_on_outside_captures() {
    let _serial = serial();
    let ctx = program_context();
    assert!(ctx.is_event_tracking());
    const N: usize = 1 << 20;
    let a = ctx.new_stream().unwrap();
    let b = ctx.new_stream().unwrap();
    let host: Vec<f32> = (0..N).map(|i| (i % 97) as f32).collect();
    // Tracked (made with tracking on): b's copy waits for a's upload by itself.
    let x = a.clone_htod(&host).unwrap();
    let mut y = b.alloc_zeros::<f32>(N).unwrap();
    b.memcpy_dtod(&x, &mut y).unwrap();
    assert_eq!(b.clone_dtoh(&y).unwrap(), host);

    // SAFETY: no other thread uses the context meanwhile.
    unsafe { ctx.disable_event_tracking() };
    let adopted = cuda::Device::from_context(ctx.clone());
    // SAFETY: as above; nothing was allocated while it was off.
    unsafe { ctx.enable_event_tracking() };
    let backend = adopted.unwrap();
    let stream = backend.wrap_stream(ctx.new_stream().unwrap()).unwrap();
    let side = backend.wrap_stream(b.clone()).unwrap();
    let req = Request::new(Domain::Device, DType::F32, N as u64);
    let plan = || {
        let mut discovery = Discovering::new(PlanConfig::new());
        discovery.arm(RunnerId(0)).unwrap().record(req).unwrap();
        discovery
            .plan(Policy::Generations(1))
            .unwrap()
            .allocate(backend.clone())
            .unwrap()
    };
    let capture_reading_x = |capturing: &mut Capturing<cuda::Device>| {
        let cap = capturing.capture(RunnerId(0)).unwrap();
        let view = cap.take(req).unwrap();
        let captured = cap.stream_capture(&stream, |s| -> replay_arena::Result<()> {
            s.cudarc().memcpy_dtod(&x, &mut view.as_cuda::<f32>(s)?)?;
            Ok(())
        });
        captured
            .map_err(replay_arena::Error::from)
            .and_then(|()| Ok(cap.finish()?))
    };

    // Tracking off around the capture only.
    let mut capturing = plan();
    // SAFETY: this thread is the only one using the context; the capture
    // keeps no slice it allocates.
    unsafe { ctx.disable_event_tracking() };
    let captured = capture_reading_x(&mut capturing);
    unsafe { ctx.enable_event_tracking() };
    captured.unwrap();
    assert!(ctx.is_event_tracking());
    let mut replayable = capturing.seal().unwrap();

    // Replays and consumers with tracking on; the program's tracked `y` is
    // written by the consumer on `b` and read back through cudarc.
    for round in 0..3 {
        a.memset_zeros(&mut y).unwrap(); // tracked: the consumer's write waits for it
        replayable.replay(RunnerId(0), &stream).unwrap();
        replayable
            .consume(RunnerId(0), &side, |s, views| -> replay_arena::Result<()> {
                views[0].copy_into(s, &mut y)?;
                Ok(())
            })
            .unwrap();
        assert_eq!(b.clone_dtoh(&y).unwrap(), host, "round {round}");
    }
    let mut step = replayable.step();
    step.replay(RunnerId(0), &stream).unwrap();
    step.consume(RunnerId(0), &side, |_, _| Ok::<(), replay_arena::Error>(()))
        .unwrap();
    // SAFETY: as for the capture: the step graph's build captures.
    unsafe { ctx.disable_event_tracking() };
    let built = step.build();
    unsafe { ctx.enable_event_tracking() };
    let mut graph = built.unwrap();
    graph.launch(&stream).unwrap();
    drop(graph);
    replayable.wait_all(&side).unwrap();
    side.cudarc().synchronize().unwrap();
    ctx.check_err().unwrap();
}

/// A replay's driver calls (`cuStreamWaitEvent`, `cuGraphLaunch`,
/// `cuEventRecord`) take their context from their handles, so the crate
/// binds no context for them (a `cuCtxGetCurrent` each saved): replays on
/// two streams (waits and records every replay) run with no context
/// current on the thread, and with another context current, and the
/// view's values count every replay.
#[test]
#[ignore = "needs a CUDA GPU"]
fn replays_run_with_no_context_or_another_context_current() {
    use replay_arena::cuda::cudarc::driver::sys;
    let (_serial, ctx, backend, k) = adopted();
    let n = 1024usize;
    let (a, b) = (backend.new_stream().unwrap(), backend.new_stream().unwrap());
    let mut replayable = adding_one(&backend, &a, &k, n);
    let mut replays = 0;
    let mut replay_both = |replayable: &mut Replayable<cuda::Device>, how: &str| {
        for s in [&a, &b, &a, &b] {
            replayable
                .replay(RunnerId(0), s)
                .unwrap_or_else(|e| panic!("{how}: {e}"));
            replays += 1;
        }
    };
    replay_both(&mut replayable, "the context current");
    // SAFETY: no context current on this thread from here.
    assert_eq!(
        unsafe { sys::cuCtxSetCurrent(std::ptr::null_mut()) },
        sys::CUresult::CUDA_SUCCESS
    );
    replay_both(&mut replayable, "no context current");
    let mut other = std::ptr::null_mut();
    // SAFETY: a context of the program's own, destroyed below; creating it
    // makes it current on this thread.
    let created = unsafe { sys::cuCtxCreate_v4(&mut other, std::ptr::null_mut(), 0, 0) };
    assert_eq!(created, sys::CUresult::CUDA_SUCCESS);
    replay_both(&mut replayable, "another context current");
    ctx.bind_to_thread().unwrap();
    // SAFETY: created above, used by nothing since.
    unsafe { sys::cuCtxDestroy_v2(other) };
    let values = read_view(&mut replayable, &a, 0);
    assert!(
        values.iter().all(|&v| v == replays as f32),
        "{} replays, values {:?}",
        replays,
        &values[..4]
    );
}

/// One runner whose graph adds 1.0 to each of its `n` f32, captured on
/// `stream` and sealed.
fn adding_one(
    backend: &cuda::Device,
    stream: &cuda::Stream,
    k: &Kernels,
    n: usize,
) -> Replayable<cuda::Device> {
    sealed_one(backend, stream, &[f32s(n as u64)], |s, views| {
        let mut l = s.cudarc().launch_builder(&k.add);
        let (x, n32, v) = (views[0].device_address(), n as u32, 1.0f32);
        l.arg(&x).arg(&n32).arg(&v);
        unsafe { l.launch(launch_cfg(n)) }
            .map(drop)
            .map_err(e("launch"))
    })
}

/// A lazily instantiated graph's first replay instantiates it with its own
/// context pushed for the call and leaves the thread's context as it was:
/// none current, or another one.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_lazy_first_replay_leaves_the_threads_context_as_it_found_it() {
    use replay_arena::cuda::cudarc::driver::sys;
    let (_serial, ctx, backend, k) = adopted();
    let backend = backend.with_lazy_instantiation(true);
    let n = 1024usize;
    let a = backend.new_stream().unwrap();
    let capture = |backend: &cuda::Device| adding_one(backend, &a, &k, n);
    let current = || {
        let mut c = std::ptr::null_mut();
        // SAFETY: reads this thread's current context.
        assert_eq!(
            unsafe { sys::cuCtxGetCurrent(&mut c) },
            sys::CUresult::CUDA_SUCCESS
        );
        c
    };
    // No context current at the first replay.
    let mut first = capture(&backend);
    assert!(!first.graph(RunnerId(0)).unwrap().is_instantiated());
    // SAFETY: no context current on this thread from here.
    assert_eq!(
        unsafe { sys::cuCtxSetCurrent(std::ptr::null_mut()) },
        sys::CUresult::CUDA_SUCCESS
    );
    first.replay(RunnerId(0), &a).unwrap();
    assert!(
        current().is_null(),
        "the first replay left a context current"
    );
    assert!(first.graph(RunnerId(0)).unwrap().is_instantiated());
    // Another context current at the first replay.
    ctx.bind_to_thread().unwrap();
    let mut second = capture(&backend);
    let mut other = std::ptr::null_mut();
    // SAFETY: a context of the program's own, destroyed below; creating it
    // makes it current on this thread.
    let created = unsafe { sys::cuCtxCreate_v4(&mut other, std::ptr::null_mut(), 0, 0) };
    assert_eq!(created, sys::CUresult::CUDA_SUCCESS);
    second.replay(RunnerId(0), &a).unwrap();
    assert_eq!(current(), other, "the first replay changed the context");
    ctx.bind_to_thread().unwrap();
    // SAFETY: created above, used by nothing since.
    unsafe { sys::cuCtxDestroy_v2(other) };
    for (replayable, name) in [(&mut first, "first"), (&mut second, "second")] {
        let values = read_view(replayable, &a, 0);
        assert!(
            values.iter().all(|&v| v == 1.0),
            "{name}: one replay, values {:?}",
            &values[..4]
        );
    }
}

/// A lazily composed step graph's first launch instantiates it with its
/// context pushed for the call and leaves the thread's context as it was:
/// none current.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_lazy_step_graphs_first_launch_leaves_the_threads_context_as_it_found_it() {
    use replay_arena::cuda::cudarc::driver::sys;
    let (_serial, _ctx, backend, k) = adopted();
    let backend = backend.with_lazy_instantiation(true);
    let n = 1024usize;
    let a = backend.new_stream().unwrap();
    let mut replayable = adding_one(&backend, &a, &k, n);
    {
        let mut step = replayable.step();
        step.replay(RunnerId(0), &a).unwrap();
        let mut graph = step.build().unwrap();
        assert!(!graph.graphs()[0].is_instantiated());
        // SAFETY: no context current on this thread from here.
        assert_eq!(
            unsafe { sys::cuCtxSetCurrent(std::ptr::null_mut()) },
            sys::CUresult::CUDA_SUCCESS
        );
        graph.launch(&a).unwrap();
        let mut current = std::ptr::null_mut();
        // SAFETY: reads this thread's current context.
        assert_eq!(
            unsafe { sys::cuCtxGetCurrent(&mut current) },
            sys::CUresult::CUDA_SUCCESS
        );
        assert!(current.is_null(), "the first launch left a context current");
        assert!(graph.graphs()[0].is_instantiated());
    }
    let values = read_view(&mut replayable, &a, 0);
    assert!(
        values.iter().all(|&v| v == 1.0),
        "one launch, values {:?}",
        &values[..4]
    );
}
