//! A tensor-parallel backward pass on cuBLAS (and NCCL with the `nccl`
//! feature), graphed per module with `replay-arena`, against the same pass
//! run eagerly.
//!
//! L layers, each an MLP module (fc1, fc2) and an attention-projection
//! module; bf16 weights and activations, FP32 main grads. Each module's
//! backward (dgrad and wgrad GEMMs on cuBLAS, the wgrad into a persistent
//! `wgrad_rs_input` view, a reduce-scatter into an `rs_output` view) is one
//! runner; its shard is accumulated into the main grad by `consume` on a side
//! stream. Each runner's cuBLAS workspace is a persistent request too, set
//! inside its capture, so two graphs that may run at once never share one.
//!
//! Lifecycle: one eager step with each runner armed; plan with
//! `OverlapDepth(2)` (round-robin and packed) for a pool of two streams;
//! capture each module; replay. Modes, interleaved round by round: eager,
//! graphed round-robin, graphed packed, graphed with no fence (the unsafe
//! reference). Prints step time, host time per step, memory, and how every
//! mode's main grads compare with the eager run's.
//!
//! ```sh
//! cargo run --release --features f16 --example tp_backward                   # small shapes
//! cargo run --release --features f16 --example tp_backward -- --preset mid   # hidden 4096, ffn 16384, 2048 tokens, L = 8
//! cargo run --release --features f16 --example tp_backward -- --hidden 1024 --ffn 4096 --tokens 512 --layers 4 --steps 100
//! cargo run --release --features nccl,f16 --example tp_backward              # reduce-scatter on NCCL symmetric windows
//! ```
//!
//! Without a GPU, driver or cuBLAS it says so in one line and exits with 0
//! (with 1 when `REQUIRE_GPU=1`).

mod model;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use cudarc::driver::{sys, CudaContext};
use model::{graphed_step, unfenced_step, Comparison, MainGrads, Model, Reduce, Shape, TpError};
use replay_arena::cuda::{probe, CudaBackend, CudaGraph, CudaStream};
use replay_arena::{human_bytes, Backend, BackendError, Policy, Replayable, RunnerId, Strategy};

type Result<T, E = TpError> = std::result::Result<T, E>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rs {
    Copy,
    Nccl,
}

struct Args {
    shape: Shape,
    steps: usize,
    rounds: usize,
    rs: Rs,
}

const USAGE: &str = "usage: tp_backward [--preset small|mid] [--hidden N] [--ffn N] [--tokens N] \
[--layers N] [--workspace-mib N] [--steps N] [--rounds N] [--rs copy|nccl]";

impl Args {
    fn parse() -> Result<Args, String> {
        let mut a = Args {
            shape: Shape::SMALL,
            steps: 50,
            rounds: 10,
            rs: if cfg!(feature = "nccl") {
                Rs::Nccl
            } else {
                Rs::Copy
            },
        };
        let mut it = std::env::args().skip(1);
        while let Some(flag) = it.next() {
            let mut value = || it.next().ok_or(format!("{flag} needs a value; {USAGE}"));
            let mut number = || -> Result<usize, String> {
                let v = value()?;
                v.parse()
                    .map_err(|_| format!("{flag} takes a number, not {v:?}"))
            };
            match flag.as_str() {
                "--preset" => {
                    let v = value()?;
                    a.shape = match v.as_str() {
                        "small" => Shape::SMALL,
                        "mid" => Shape::MID,
                        _ => return Err(format!("unknown preset {v:?}; {USAGE}")),
                    };
                }
                "--hidden" => a.shape.hidden = number()?,
                "--ffn" => a.shape.ffn = number()?,
                "--tokens" => a.shape.tokens = number()?,
                "--layers" => a.shape.layers = number()?,
                "--workspace-mib" => a.shape.workspace = (number()? as u64) << 20,
                "--steps" => a.steps = number()?,
                "--rounds" => a.rounds = number()?,
                "--rs" => {
                    a.rs = match value()?.as_str() {
                        "copy" => Rs::Copy,
                        "nccl" => Rs::Nccl,
                        v => return Err(format!("--rs takes copy or nccl, not {v:?}")),
                    }
                }
                "-h" | "--help" => return Err(USAGE.into()),
                _ => return Err(format!("unknown argument {flag:?}; {USAGE}")),
            }
        }
        if a.rounds == 0 || a.steps < a.rounds {
            return Err(format!(
                "--steps ({}) must be at least --rounds ({}), which must be positive",
                a.steps, a.rounds
            ));
        }
        if a.shape.workspace == 0 {
            return Err("--workspace-mib must be positive: each runner's cuBLAS workspace is a plan request".into());
        }
        Ok(a)
    }
}

fn main() -> ExitCode {
    let args = match Args::parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("tp_backward: {e}");
            return ExitCode::from(2);
        }
    };
    let required = std::env::var("REQUIRE_GPU").is_ok_and(|v| v == "1");
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ (TpError::NoGpu(_) | TpError::NoCublas)) if !required => {
            println!("tp_backward: skipped: {e}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("tp_backward: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<()> {
    let info = probe().map_err(TpError::NoGpu)?;
    // The program's own cudarc context (the probe checked there is a
    // driver, so cudarc will not panic), adopted by the backend.
    let ctx = CudaContext::new(0).map_err(|e| TpError::Driver {
        op: "cuDevicePrimaryCtxRetain",
        code: e.0,
    })?;
    // SAFETY: nothing was allocated on the context yet. This program orders
    // its own slices across streams: tensors and main grads are written on
    // the setup stream, which is synchronized before other streams use
    // them; an eager step's buffers live and die on its one stream; the
    // streams of a graphed step are ordered by events (module inputs, step
    // ends) and by the plan's fence.
    let cuda = unsafe { CudaBackend::from_context_disabling_event_tracking(ctx) }
        .map_err(TpError::NoGpu)?;
    println!("device: {info}");
    #[cfg(feature = "nccl")]
    if args.rs == Rs::Nccl {
        use replay_arena::nccl::{available, Communicator, NcclBackend, UniqueId};
        if available() {
            let id = UniqueId::new()?;
            let comm = Communicator::new(&cuda, model::TP_GROUP, &id, 0, 1)?;
            let make = || NcclBackend::new(cuda.clone()).with_group(comm.clone());
            return run_with(&cuda, &make, Reduce::Nccl(comm.clone()), args);
        }
        println!("NCCL was not found by the dynamic loader: using the copy stand-in");
    }
    if args.rs == Rs::Nccl && !cfg!(feature = "nccl") {
        println!("this build has no `nccl` feature: using the copy stand-in");
    }
    run_with(&cuda, &|| Ok(cuda.clone()), Reduce::StandIn, args)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Eager,
    RoundRobin,
    Packed,
    Unfenced,
}

impl Mode {
    const ALL: [Mode; 4] = [Mode::Eager, Mode::RoundRobin, Mode::Packed, Mode::Unfenced];

    fn name(self) -> &'static str {
        match self {
            Mode::Eager => "eager (one stream, stream-ordered allocations)",
            Mode::RoundRobin => "graphed, OverlapDepth(2) round-robin, fenced",
            Mode::Packed => "graphed, OverlapDepth(2) packed, fenced",
            Mode::Unfenced => "graphed, no fence (unsafe reference)",
        }
    }
}

/// Step and host times of one mode, one sample per round.
#[derive(Default)]
struct Times {
    step: Vec<Duration>,
    host: Vec<Duration>,
}

fn median(v: &[Duration]) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

fn run_with<B: Backend<Stream = CudaStream, Graph = CudaGraph>>(
    cuda: &CudaBackend,
    make: &dyn Fn() -> Result<B, BackendError>,
    reduce: Reduce,
    args: &Args,
) -> Result<()> {
    let shape = args.shape;
    let mut model = Model::new(cuda, shape, reduce)?;
    println!("model: {shape}");
    println!("{}", model.reduce.describe());
    println!(
        "{} runners (modules), {:.2} TFLOP per backward step",
        model.modules.len(),
        shape.flops() / 1e12
    );
    // The program's cudarc streams, wrapped for the plan.
    let stream = || -> Result<CudaStream> {
        let s = cuda.context().new_stream().map_err(|e| TpError::Driver {
            op: "cuStreamCreate",
            code: e.0,
        })?;
        Ok(cuda.wrap_stream(s)?)
    };
    let eager_stream = stream()?;
    let pool = [stream()?, stream()?];
    let side = stream()?;
    let capture_stream = stream()?;
    let mut mains: Vec<MainGrads> = Mode::ALL
        .iter()
        .map(|_| model.main_grads())
        .collect::<Result<_>>()?;

    // 1. Discovery: one eager step with each module's runner armed.
    let discovery = model.discover(&mains[0], &eager_stream)?;
    let eager_peak = eager_pool_peak(cuda, &mut model, &mains[0], &eager_stream)?;
    for m in &mut mains {
        model.zero(m)?;
    }

    // 2. Plan for a pool of two streams, both placements.
    let rr_strategy: Strategy = Policy::OverlapDepth(2).into();
    let packed_strategy = Policy::OverlapDepth(2).packed();
    let rr_plan = discovery.clone().plan(rr_strategy)?;
    let packed_plan = discovery.plan(packed_strategy)?;
    let rr_report = rr_plan.report();
    let packed_report = packed_plan.report();
    println!("\nplan, {}:\n{rr_report}", strategy_name(rr_strategy));

    // 3. Capture every module's backward, once per plan.
    let capture_start = Instant::now();
    let mut rr = capture(&mut model, rr_plan, make()?, &capture_stream)?;
    let mut packed = capture(&mut model, packed_plan, make()?, &capture_stream)?;
    println!(
        "captured {} graphs per plan in {:.1} ms (both plans)",
        model.modules.len(),
        capture_start.elapsed().as_secs_f64() * 1e3
    );
    workspaces("round-robin", &rr)?;
    workspaces("packed", &packed)?;

    // 4. Replay, modes interleaved round by round.
    let n = model.modules.len();
    let step_done = model::new_event(cuda)?;
    let graph_done: Vec<_> = (0..n)
        .map(|_| model::new_event(cuda))
        .collect::<Result<_>>()?;
    let unfenced_mains: Vec<Vec<u64>> = (0..n).map(|m| model.main_ptrs(&mains[3], m)).collect();
    let shards: Vec<Vec<u64>> = (0..n)
        .map(|m| Ok(model::rs_outputs(&rr.views(RunnerId(m as u32))?)))
        .collect::<Result<_>>()?;
    let per_round = args.steps / args.rounds;
    let steps = per_round * args.rounds;
    let mut times: Vec<Times> = Mode::ALL.iter().map(|_| Times::default()).collect();
    // Round 0 warms up (graph upload, cuBLAS heuristics); it counts in the
    // main grads (every mode runs it) but not in the times.
    for round in 0..=args.rounds {
        for (k, &mode) in Mode::ALL.iter().enumerate() {
            cuda.synchronize()?;
            let start = Instant::now();
            let mut host = Duration::ZERO;
            let count = if round == 0 { 1 } else { per_round };
            for i in 0..count {
                match mode {
                    Mode::Eager => model.eager_step(&mains[k], &eager_stream)?,
                    Mode::RoundRobin => {
                        graphed_step(&model, &mut rr, &mains[k], &pool, &side, &step_done)?
                    }
                    Mode::Packed => {
                        graphed_step(&model, &mut packed, &mains[k], &pool, &side, &step_done)?
                    }
                    // SAFETY: the unsafe reference: its shards may be
                    // overwritten before they are accumulated (measured
                    // below); the device is synchronized before any fenced
                    // replay of `rr`.
                    Mode::Unfenced => unsafe {
                        unfenced_step(
                            &model,
                            &mut rr,
                            &unfenced_mains,
                            &shards,
                            &pool,
                            &side,
                            &step_done,
                            &graph_done,
                        )?
                    },
                }
                if i == 0 {
                    // The first step of a round is enqueued on an idle
                    // device: pure host time, no back-pressure.
                    host = start.elapsed();
                }
            }
            cuda.synchronize()?;
            if round > 0 {
                times[k].step.push(start.elapsed() / per_round as u32);
                times[k].host.push(host);
            }
        }
    }

    // 5. Numerics against the eager run.
    let rtol = 1.0 / 128.0;
    let atol = 1e-4 * (steps + 1) as f32;
    let comparisons: Vec<Comparison> = mains
        .iter()
        .map(|m| model.compare(&mains[0], m, rtol, atol))
        .collect::<Result<_>>()?;

    println!(
        "\n{} steps per mode ({} rounds of {per_round}, modes interleaved; medians over rounds), plus one warm-up step",
        steps, args.rounds
    );
    println!("| mode | step time | host time per step | TFLOP/s | main grads vs eager |");
    println!("|---|---:|---:|---:|---|");
    let eager_step = median(&times[0].step).as_secs_f64();
    for (k, &mode) in Mode::ALL.iter().enumerate() {
        let step = median(&times[k].step).as_secs_f64();
        let host = median(&times[k].host).as_secs_f64();
        let vs = if k == 0 {
            "(reference)".to_string()
        } else {
            comparisons[k].to_string()
        };
        println!(
            "| {} | {:.3} ms ({:.2}x eager) | {:.1} us | {:.1} | {vs} |",
            mode.name(),
            step * 1e3,
            eager_step / step,
            host * 1e6,
            shape.flops() / step / 1e12
        );
    }
    let stats = rr.fence_stats();
    println!(
        "fence, round-robin plan: {} replays, {} consumers, {} waits, {} waits skipped (implied by stream order), {} event records",
        stats.replays, stats.consumers, stats.waits, stats.waits_skipped, stats.event_records
    );
    println!(
        "\nmemory: plan {} (round-robin) / {} (packed), lower bound {}; per-parameter ring of 2 (wgrad inputs only) {}; eager run's peak of the same buffers {} (stream-ordered pool high-water mark)",
        human_bytes(rr_report.plan_bytes),
        human_bytes(packed_report.plan_bytes),
        human_bytes(rr_report.lower_bound),
        human_bytes(rr_report.ring_bytes),
        human_bytes(eager_peak)
    );
    println!(
        "numerics: tolerance |a - b| <= 2^-7 max(|a|, |b|) + {atol:e} (one bf16 ulp per wgrad element when cuBLAS picks another algorithm, i.e. another FP32 summation order before the bf16 rounding, accumulated identically {} times)",
        steps + 1
    );
    for (k, &mode) in Mode::ALL.iter().enumerate().skip(1) {
        let c = &comparisons[k];
        let verdict = if c.bitwise() {
            "bitwise equal: the same cuBLAS algorithms ran (same shapes, same workspace size)"
        } else if c.past_tolerance == 0 {
            "within the bf16 tolerance, not bitwise"
        } else if mode == Mode::Unfenced {
            "WRONG: shards were overwritten before they were accumulated (no fence)"
        } else {
            "WRONG"
        };
        println!("  {}: {verdict}", mode.name());
    }
    let fenced_ok = comparisons[1..3].iter().all(|c| c.past_tolerance == 0);
    drop(rr);
    drop(packed);
    if fenced_ok {
        Ok(())
    } else {
        Err(TpError::Check(
            "fenced graphed main grads differ from the eager run's".into(),
        ))
    }
}

fn strategy_name(s: Strategy) -> String {
    format!("{} {}", s.policy, s.placement)
}

/// Allocates `plan`'s arenas on `backend`, captures every module, seals.
fn capture<B: Backend<Stream = CudaStream, Graph = CudaGraph>>(
    model: &mut Model,
    plan: replay_arena::Planned,
    backend: B,
    stream: &CudaStream,
) -> Result<Replayable<B>> {
    let mut capturing = plan.allocate(backend)?;
    model.capture(&mut capturing, stream)?;
    capturing
        .seal()
        .map_err(|e| TpError::Arena(replay_arena::Error::from(e)))
}

/// Shows where each runner's cuBLAS workspace is, and checks that two
/// runners that can be in flight at once on the pool (consecutive ones)
/// never share workspace bytes.
fn workspaces<B: Backend>(name: &str, replayable: &Replayable<B>) -> Result<()> {
    let runners: Vec<RunnerId> = replayable.plan().runners().collect();
    let mut ranges = Vec::with_capacity(runners.len());
    for &r in &runners {
        let views = replayable.views(r)?;
        if let Some(range) = model::workspace_range(&views) {
            ranges.push(range);
        }
    }
    let mut distinct = ranges.clone();
    distinct.sort();
    distinct.dedup();
    let overlap = |(a, n): (u64, u64), (b, m): (u64, u64)| a < b + m && b < a + n;
    let shared = ranges.windows(2).filter(|w| overlap(w[0], w[1])).count();
    println!(
        "cuBLAS workspaces, {name}: {} runners use {} distinct workspace ranges; consecutive runners (in flight together on the pool) sharing workspace bytes: {shared}; runners that do share are ordered by the fence",
        ranges.len(),
        distinct.len()
    );
    if shared == 0 {
        Ok(())
    } else {
        Err(TpError::Check(format!(
            "{shared} pairs of consecutive runners share a cuBLAS workspace"
        )))
    }
}

/// Device memory the eager step's own buffers (workspace, wgrad, shard) take
/// at their peak: the stream-ordered pool's high-water mark over one plain
/// eager step, above what was in use before it.
fn eager_pool_peak(
    cuda: &CudaBackend,
    model: &mut Model,
    main: &MainGrads,
    s: &CudaStream,
) -> Result<u64> {
    let device = cuda.context().cu_device();
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let check = |op: &'static str, code: sys::CUresult| match code {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        code => Err(TpError::Driver { op, code }),
    };
    cuda.synchronize()?;
    // SAFETY: out pointers point at live locals; the pool is the device's.
    let before = unsafe {
        check(
            "cuDeviceGetDefaultMemPool",
            sys::cuDeviceGetDefaultMemPool(&mut pool, device),
        )?;
        let mut used = 0u64;
        check(
            "cuMemPoolGetAttribute",
            sys::cuMemPoolGetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
                (&mut used as *mut u64).cast(),
            ),
        )?;
        let mut zero = 0u64;
        check(
            "cuMemPoolSetAttribute",
            sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                (&mut zero as *mut u64).cast(),
            ),
        )?;
        used
    };
    model.eager_step(main, s)?;
    cuda.synchronize()?;
    let mut high = 0u64;
    // SAFETY: as above.
    unsafe {
        check(
            "cuMemPoolGetAttribute",
            sys::cuMemPoolGetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                (&mut high as *mut u64).cast(),
            ),
        )?;
    }
    Ok(high.saturating_sub(before))
}
