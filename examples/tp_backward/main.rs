//! A tensor-parallel backward pass on cuBLAS and NCCL, on one GPU or
//! several (one thread per GPU, one rank each), graphed per module with
//! `replay-arena`, against the same pass run eagerly.
//!
//! L layers, each an MLP module (fc1, column-parallel; fc2, row-parallel)
//! and an attention-projection module (row-parallel); bf16 weights and
//! activations, FP32 main grads. As in GTP (generalized tensor parallelism),
//! each of the N ranks computes the weight gradients of its own rows of the
//! batch and the wgrads are reduce-scattered over the ranks, so that each
//! rank ends with its Megatron shard of every gradient (output rows of a
//! column-parallel weight, input columns of a row-parallel one; the wgrad
//! is laid out so that the shard is contiguous). Each module's backward
//! (dgrad and wgrad GEMMs on cuBLAS, the wgrad into a persistent
//! `wgrad_rs_input` view, the reduce-scatter into an `rs_output` view) is one
//! runner; its shard is accumulated into the main grad by `consume` on a
//! side stream. Each runner's cuBLAS workspace is a persistent request too.
//!
//! Lifecycle, on every rank: one eager step with each runner armed; plan
//! with `OverlapDepth(2)` (round-robin and packed) for a pool of two streams;
//! check the plan's fingerprint across the ranks; capture each module;
//! replay. Modes, interleaved round by round (the ranks meet at a barrier
//! before each): eager; graphed round-robin and packed (fenced); graphed
//! with no fence (the unsafe reference); graphed on one stream (the
//! collective serialized); and, to measure what the reduce-scatter costs,
//! the same graphs captured without it. Prints step time, host time,
//! memory, how much of the reduce-scatter is hidden behind the next
//! module's backward, and how every mode's main grads compare with the
//! eager run's and (N > 1) with a one-rank run of the whole batch.
//!
//! ```sh
//! cargo run --release --features nccl,f16 --example tp_backward                   # small, 1 rank
//! cargo run --release --features nccl,f16 --example tp_backward -- --ranks 2      # small, 2 GPUs
//! cargo run --release --features nccl,f16 --example tp_backward -- --ranks 2 --preset mid
//! cargo run --release --features nccl,f16 --example tp_backward -- --ranks 2 --rs nccl-plain  # unregistered memory
//! cargo run --release --features f16 --example tp_backward -- --rs copy          # no NCCL: a copy stands in
//! ```
//!
//! Without a GPU, driver or cuBLAS it says so in one line and exits with 0
//! (with 1 when `REQUIRE_GPU=1`).

mod model;

use std::process::ExitCode;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use cudarc::driver::{sys, CudaContext};
use model::{
    graphed_step, unfenced_step, Comparison, MainGrads, Model, Reduce, Shape, Tolerance, TpError,
};
use replay_arena::backend::{Compose, Streams, Timing};
use replay_arena::cuda;
use replay_arena::cuda::probe;
use replay_arena::{human_bytes, BackendError, PlacedPolicy, Policy, Replayable, RunnerId};

type Result<T, E = TpError> = std::result::Result<T, E>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rs {
    Copy,
    Nccl,
    NcclPlain,
}

struct Args {
    shape: Shape,
    steps: usize,
    rounds: usize,
    rs: Rs,
    ranks: usize,
    /// The consumers' (reduce-scatters') stream at the greatest priority.
    high_priority: bool,
    /// Where to write traces of a few per-module and step graph steps
    /// (`--trace DIR`), profiled at the step boundary.
    trace: Option<std::path::PathBuf>,
}

const USAGE: &str = "usage: tp_backward [--ranks N] [--preset small|mid] [--hidden N] [--ffn N] \
[--tokens N] [--layers N] [--workspace-mib N] [--steps N] [--rounds N] [--rs copy|nccl|nccl-plain] \
[--side-priority high|normal] [--trace DIR]";

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
            ranks: 1,
            high_priority: true,
            trace: None,
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
                "--ranks" => a.ranks = number()?,
                "--rs" => {
                    a.rs = match value()?.as_str() {
                        "copy" => Rs::Copy,
                        "nccl" => Rs::Nccl,
                        "nccl-plain" => Rs::NcclPlain,
                        v => return Err(format!("--rs takes copy, nccl or nccl-plain, not {v:?}")),
                    }
                }
                "--side-priority" => {
                    a.high_priority = match value()?.as_str() {
                        "high" => true,
                        "normal" => false,
                        v => {
                            return Err(format!("--side-priority takes high or normal, not {v:?}"))
                        }
                    }
                }
                "--trace" => a.trace = Some(value()?.into()),
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
        if a.ranks == 0 {
            return Err("--ranks must be positive".into());
        }
        if a.ranks > 1 && a.rs == Rs::Copy {
            return Err("--rs copy stands in for one rank only; more ranks need NCCL".into());
        }
        if a.ranks > 1 {
            let (h, f) = (a.shape.hidden, a.shape.ffn);
            if h % a.ranks != 0 || f % a.ranks != 0 {
                return Err(format!(
                    "hidden ({h}) and ffn ({f}) must be multiples of --ranks ({})",
                    a.ranks
                ));
            }
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

/// This rank's place among the ranks, and the barrier they meet at.
#[derive(Clone, Copy)]
struct Team<'a> {
    rank: usize,
    ranks: usize,
    barrier: &'a Barrier,
}

impl Team<'_> {
    /// Rank 0 prints the tables; the others only their own verdicts.
    fn lead(&self) -> bool {
        self.rank == 0
    }
}

fn run(args: &Args) -> Result<()> {
    let info = probe().map_err(TpError::NoGpu)?;
    println!("device: {info}");
    if args.ranks == 1 {
        let barrier = Barrier::new(1);
        return run_rank(
            args,
            Team {
                rank: 0,
                ranks: 1,
                barrier: &barrier,
            },
            None,
        );
    }
    let gpus = CudaContext::device_count().map_err(|e| TpError::Driver {
        op: "cuDeviceGetCount",
        code: e.0,
    })? as usize;
    if gpus < args.ranks {
        return Err(TpError::Check(format!(
            "--ranks {} needs {} GPUs, this machine has {gpus}",
            args.ranks, args.ranks
        )));
    }
    let id = unique_id()?;
    let barrier = Barrier::new(args.ranks);
    let results: Vec<Result<()>> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..args.ranks)
            .map(|rank| {
                let team = Team {
                    rank,
                    ranks: args.ranks,
                    barrier: &barrier,
                };
                scope.spawn(move || run_rank(args, team, id))
            })
            .collect();
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err(TpError::Check("a rank's thread panicked".into())))
            })
            .collect()
    });
    let mut failed = None;
    for (rank, r) in results.into_iter().enumerate() {
        if let Err(e) = r {
            eprintln!("tp_backward: rank {rank}: {e}");
            failed.get_or_insert(e);
        }
    }
    match failed {
        None => {
            println!("all {} ranks passed their checks", args.ranks);
            Ok(())
        }
        Some(e) => Err(e),
    }
}

/// The id of the ranks' communicator, made once and handed to every rank's
/// thread.
#[cfg(feature = "nccl")]
fn unique_id() -> Result<Option<[u8; 128]>> {
    if !replay_arena::nccl::available() {
        return Err(TpError::Check(
            "more than one rank needs NCCL, which the dynamic loader did not find".into(),
        ));
    }
    Ok(Some(*replay_arena::nccl::UniqueId::new()?.as_bytes()))
}

#[cfg(not(feature = "nccl"))]
fn unique_id() -> Result<Option<[u8; 128]>> {
    Err(TpError::Check(
        "more than one rank needs the `nccl` feature".into(),
    ))
}

/// One rank: its own cudarc context on GPU `rank`, adopted by the backend;
/// its communicator (joined from `id`, or a fresh one-rank one); the run.
fn run_rank(args: &Args, team: Team<'_>, id: Option<[u8; 128]>) -> Result<()> {
    // The program's own cudarc context (the probe checked there is a
    // driver, so cudarc will not panic), adopted by the backend.
    let ctx = CudaContext::new(team.rank).map_err(|e| TpError::Driver {
        op: "cuDevicePrimaryCtxRetain",
        code: e.0,
    })?;
    // SAFETY: nothing was allocated on the context yet. This program orders
    // its own slices across streams: tensors and main grads are written on
    // the setup stream, which is synchronized before other streams use
    // them; an eager step's buffers live and die on its one stream; the
    // streams of a graphed step are ordered by events (module inputs, step
    // ends) and by the plan's fence.
    let cuda = unsafe { cuda::Device::from_context_disabling_event_tracking(ctx) }
        .map_err(TpError::NoGpu)?;
    #[cfg(feature = "nccl")]
    if args.rs != Rs::Copy {
        use replay_arena::nccl::{self, available, Communicator, UniqueId};
        if available() {
            let id = match id {
                Some(bytes) => UniqueId::from_bytes(bytes),
                None => UniqueId::new()?,
            };
            let comm = Communicator::new(&cuda, model::TP_GROUP, &id, team.rank, team.ranks)?;
            if args.rs == Rs::NcclPlain {
                let reduce = Reduce::NcclPlain(comm);
                return run_with(&cuda, &|| Ok(cuda.clone()), reduce, args, team);
            }
            let make = || nccl::Device::new(cuda.clone()).with_group(comm.clone());
            return run_with(&cuda, &make, Reduce::Nccl(comm.clone()), args, team);
        }
        println!("NCCL was not found by the dynamic loader: using the copy stand-in");
    }
    if args.rs != Rs::Copy && !cfg!(feature = "nccl") {
        println!("this build has no `nccl` feature: using the copy stand-in");
    }
    // Without NCCL no rank joins a shared communicator (`unique_id`
    // refused more than one rank).
    #[cfg(not(feature = "nccl"))]
    let _ = id;
    run_with(&cuda, &|| Ok(cuda.clone()), Reduce::StandIn, args, team)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Eager,
    RoundRobin,
    Packed,
    Unfenced,
    OneStream,
    StepRoundRobin,
    StepPacked,
    OverlapRoundRobin,
    OverlapPacked,
    RoundRobinBarrier,
    RoundRobinNoRs,
    UnfencedNoRs,
    OneStreamNoRs,
}

impl Mode {
    /// Every mode, in declaration order (`mode as usize` is its index).
    const ALL: [Mode; 13] = [
        Mode::Eager,
        Mode::RoundRobin,
        Mode::Packed,
        Mode::Unfenced,
        Mode::OneStream,
        Mode::StepRoundRobin,
        Mode::StepPacked,
        Mode::OverlapRoundRobin,
        Mode::OverlapPacked,
        Mode::RoundRobinBarrier,
        Mode::RoundRobinNoRs,
        Mode::UnfencedNoRs,
        Mode::OneStreamNoRs,
    ];

    fn name(self) -> &'static str {
        match self {
            Mode::Eager => "eager (one stream, stream-ordered allocations)",
            Mode::RoundRobin => "graphed, OverlapDepth(2) round-robin, fenced",
            Mode::Packed => "graphed, OverlapDepth(2) packed, fenced",
            Mode::Unfenced => "graphed, no fence (unsafe reference)",
            Mode::OneStream => "graphed, round-robin plan on one stream (RS serialized), fenced",
            Mode::StepRoundRobin => "step graph (one launch per step), round-robin",
            Mode::StepPacked => "step graph (one launch per step), packed",
            Mode::OverlapRoundRobin => {
                "overlapping step graphs (two in turn, one launch per step), round-robin"
            }
            Mode::OverlapPacked => {
                "overlapping step graphs (two in turn, one launch per step), packed"
            }
            Mode::RoundRobinBarrier => {
                "graphed, round-robin, fenced, each step after the whole step before"
            }
            Mode::RoundRobinNoRs => "same graphs without the RS: round-robin, fenced",
            Mode::UnfencedNoRs => "same graphs without the RS: no fence",
            Mode::OneStreamNoRs => "same graphs without the RS: one stream, fenced",
        }
    }

    /// Whether its main grads mean anything (the modes without the
    /// reduce-scatter accumulate shards nothing wrote).
    fn checked(self) -> bool {
        !matches!(
            self,
            Mode::RoundRobinNoRs | Mode::UnfencedNoRs | Mode::OneStreamNoRs
        )
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

/// Checks that every rank planned the same layout (symmetric collectives
/// assume equal offsets everywhere) before anything is allocated.
/// (Without NCCL there is one rank and nothing to check.)
#[cfg_attr(not(feature = "nccl"), allow(unused_variables))]
fn check_fingerprint(reduce: &Reduce, planned: &replay_arena::Planned) -> Result<()> {
    match reduce {
        Reduce::StandIn => Ok(()),
        #[cfg(feature = "nccl")]
        Reduce::Nccl(comm) | Reduce::NcclPlain(comm) => {
            Ok(comm.check_fingerprint(planned.fingerprint())?)
        }
    }
}

fn run_with<B: Compose<Stream = cuda::Stream, Graph = cuda::Graph> + Timing + 'static>(
    cuda: &cuda::Device,
    make: &dyn Fn() -> Result<B, BackendError>,
    reduce: Reduce,
    args: &Args,
    team: Team<'_>,
) -> Result<()> {
    let shape = args.shape;
    let lead = team.lead();
    let mut model = Model::new(cuda, shape, reduce)?;
    if lead {
        println!(
            "model: {shape}, per rank; {} rank(s), {} tokens in all",
            team.ranks,
            shape.tokens * team.ranks
        );
        println!("{}", model.reduce.describe());
        println!(
            "{} runners (modules), {:.2} TFLOP per backward step per rank",
            model.modules.len(),
            shape.flops() / 1e12
        );
    }
    // The program's cudarc streams, wrapped for the plan.
    let stream = || -> Result<cuda::Stream> {
        let s = cuda.context().new_stream().map_err(|e| TpError::Driver {
            op: "cuStreamCreate",
            code: e.0,
        })?;
        Ok(cuda.wrap_stream(s)?)
    };
    let eager_stream = stream()?;
    let pool = [stream()?, stream()?];
    // Communication first: the reduce-scatters' stream at the greatest
    // priority, so they get SMs ahead of the next module's GEMMs (in step
    // graphs too: captured work keeps its stream's priority).
    let side = if args.high_priority {
        cuda.new_high_priority_stream()?
    } else {
        stream()?
    };
    println!(
        "consumer stream priority: {} (--side-priority {})",
        side.priority()?,
        if args.high_priority { "high" } else { "normal" }
    );
    let capture_stream = stream()?;
    // One set of main grads per checked mode; the modes without the
    // reduce-scatter share one.
    let checked = Mode::ALL.iter().filter(|m| m.checked()).count();
    let mut mains: Vec<MainGrads> = (0..=checked)
        .map(|_| model.main_grads())
        .collect::<Result<_>>()?;
    // The checked modes come first in `Mode::ALL`, each `mode as usize`.
    debug_assert!(Mode::ALL
        .iter()
        .enumerate()
        .all(|(k, &m)| m as usize == k && (m.checked() == (k < checked))));
    let slot = |k: usize| if Mode::ALL[k].checked() { k } else { checked };

    // 1. Discovery: one eager step with each module's runner armed.
    let discovery = model.discover(&mains[0], &eager_stream)?;
    let eager_peak = eager_pool_peak(cuda, &mut model, &mains[0], &eager_stream)?;
    for m in &mut mains {
        model.zero(m)?;
    }

    // 2. Plan for a pool of two streams, both placements; every rank checks
    //    that all ranks planned the same layout.
    let rr_strategy: PlacedPolicy = Policy::OverlapDepth(2).into();
    let packed_strategy = Policy::OverlapDepth(2).packed();
    let rr_plan = discovery.clone().plan(rr_strategy)?;
    let bare_plan = discovery.clone().plan(rr_strategy)?;
    let rr_step_plan = discovery.clone().plan(rr_strategy)?;
    let packed_step_plan = discovery.clone().plan(packed_strategy)?;
    let rr_overlap_plan = discovery.clone().plan(rr_strategy)?;
    let packed_overlap_plan = discovery.clone().plan(packed_strategy)?;
    let packed_plan = discovery.plan(packed_strategy)?;
    for p in [&rr_plan, &bare_plan, &packed_plan] {
        check_fingerprint(&model.reduce, p)?;
    }
    let rr_report = rr_plan.report();
    let packed_report = packed_plan.report();
    if lead {
        println!(
            "plan fingerprint {:016x}, equal on all {} rank(s)",
            rr_plan.fingerprint(),
            team.ranks
        );
        println!("\nplan, {}:\n{rr_report}", strategy_name(rr_strategy));
    }

    // 3. Capture every module's backward, once per plan (and once without
    //    the reduce-scatter, to measure it).
    let capture_start = Instant::now();
    let mut rr = capture(&mut model, rr_plan, make()?, &capture_stream)?;
    let mut packed = capture(&mut model, packed_plan, make()?, &capture_stream)?;
    model.reduce_in_graphs = false;
    let bare = capture(&mut model, bare_plan, make()?, &capture_stream);
    model.reduce_in_graphs = true;
    let mut bare = bare?;
    let mut rr_s = capture(&mut model, rr_step_plan, make()?, &capture_stream)?;
    let mut packed_s = capture(&mut model, packed_step_plan, make()?, &capture_stream)?;
    let mut rr_o = capture(&mut model, rr_overlap_plan, make()?, &capture_stream)?;
    let mut packed_o = capture(&mut model, packed_overlap_plan, make()?, &capture_stream)?;
    if lead {
        println!(
            "captured {} graphs per plan in {:.1} ms (seven plans)",
            model.modules.len(),
            capture_start.elapsed().as_secs_f64() * 1e3
        );
    }
    workspaces("round-robin", &rr, lead)?;
    workspaces("packed", &packed, lead)?;

    // 4. Replay, modes interleaved round by round.
    let n = model.modules.len();
    let graph_done: Vec<_> = (0..n)
        .map(|_| model::new_event(cuda))
        .collect::<Result<_>>()?;
    let step_done = model::new_event(cuda)?;
    let unfenced_k = Mode::Unfenced as usize;
    let unfenced_mains: Vec<Vec<u64>> = (0..n)
        .map(|m| model.main_ptrs(&mains[unfenced_k], m))
        .collect();
    let bare_mains: Vec<Vec<u64>> = (0..n)
        .map(|m| model.main_ptrs(&mains[checked], m))
        .collect();
    let shards = |r: &Replayable<B>| -> Result<Vec<Vec<u64>>> {
        (0..n)
            .map(|m| Ok(model::rs_outputs(r.views(RunnerId(m as u32))?)))
            .collect()
    };
    let rr_shards = shards(&rr)?;
    let bare_shards = shards(&bare)?;
    let one = std::slice::from_ref(&pool[0]);
    // The step graphs: the pool schedule compiled once per plan; each step
    // is one launch on `pool[0]`.
    let build_start = Instant::now();
    let at = |m: Mode| &mains[slot(m as usize)];
    let mut rr_step = model::step_graph(
        &model,
        &mut rr_s,
        at(Mode::StepRoundRobin),
        &pool,
        &side,
        false,
    )?;
    let mut packed_step = model::step_graph(
        &model,
        &mut packed_s,
        at(Mode::StepPacked),
        &pool,
        &side,
        false,
    )?;
    let mut rr_overlap = model::step_graph(
        &model,
        &mut rr_o,
        at(Mode::OverlapRoundRobin),
        &pool,
        &side,
        true,
    )?;
    let mut packed_overlap = model::step_graph(
        &model,
        &mut packed_o,
        at(Mode::OverlapPacked),
        &pool,
        &side,
        true,
    )?;
    if lead {
        println!(
            "step graphs: {} graphs and {} edges each, built in {:.1} ms (both)",
            rr_step.nodes(),
            rr_step.edges(),
            build_start.elapsed().as_secs_f64() * 1e3
        );
    }
    let per_round = args.steps / args.rounds;
    let steps = per_round * args.rounds;
    let mut times: Vec<Times> = Mode::ALL.iter().map(|_| Times::default()).collect();
    // Round 0 warms up (graph upload, cuBLAS heuristics, NCCL); it counts in
    // the main grads (every mode runs it) but not in the times.
    for round in 0..=args.rounds {
        for (k, &mode) in Mode::ALL.iter().enumerate() {
            let main = &mains[slot(k)];
            cuda.synchronize()?;
            team.barrier.wait();
            let start = Instant::now();
            let mut host = Duration::ZERO;
            let count = if round == 0 { 1 } else { per_round };
            for i in 0..count {
                match mode {
                    Mode::Eager => model.eager_step(main, &eager_stream)?,
                    Mode::RoundRobin => graphed_step(&model, &mut rr, main, &pool, &side)?,
                    Mode::Packed => graphed_step(&model, &mut packed, main, &pool, &side)?,
                    Mode::OneStream => graphed_step(&model, &mut rr, main, one, &side)?,
                    Mode::StepRoundRobin => rr_step.launch(&pool[0])?,
                    Mode::StepPacked => packed_step.launch(&pool[0])?,
                    // Two graphs in turn, on alternating streams: each
                    // step starts under the one before.
                    Mode::OverlapRoundRobin => rr_overlap.launch(&pool[i % 2])?,
                    Mode::OverlapPacked => packed_overlap.launch(&pool[i % 2])?,
                    // What a step graph gives up: every stream of the next
                    // step waits for the whole step (its last consumers too).
                    Mode::RoundRobinBarrier => {
                        graphed_step(&model, &mut rr, main, &pool, &side)?;
                        rr.wait_all(&pool[0])?;
                        model::record(&step_done, &pool[0])?;
                        for s in pool.iter().skip(1).chain([&side]) {
                            model::wait(s, &step_done)?;
                        }
                    }
                    Mode::RoundRobinNoRs => graphed_step(&model, &mut bare, main, &pool, &side)?,
                    Mode::OneStreamNoRs => graphed_step(&model, &mut bare, main, one, &side)?,
                    // SAFETY: the unsafe reference: its shards may be
                    // overwritten before they are accumulated (measured
                    // below); the device is synchronized before any fenced
                    // replay of the same plan.
                    Mode::Unfenced => unsafe {
                        unfenced_step(
                            &model,
                            &mut rr,
                            &unfenced_mains,
                            &rr_shards,
                            &pool,
                            &side,
                            &graph_done,
                        )?
                    },
                    // SAFETY: as above.
                    Mode::UnfencedNoRs => unsafe {
                        unfenced_step(
                            &model,
                            &mut bare,
                            &bare_mains,
                            &bare_shards,
                            &pool,
                            &side,
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

    // 5. Numerics against the eager run of the same ranks.
    let k_steps = (steps + 1) as f32;
    // Bitwise when eager and captured steps run the same cuBLAS algorithms
    // and NCCL sums the ranks in the same order (both were seen on the
    // H200s); else one bf16 ulp per wgrad element and step, and with more
    // than one rank one ulp of the tensor's largest value for another
    // summation order of the ranks' bf16 partials.
    let vs_eager = Tolerance {
        rtol: 1.0 / 128.0,
        atol: 1e-4 * k_steps,
        of_max: if team.ranks > 1 { 1.0 / 256.0 } else { 0.0 },
    };
    let comparisons: Vec<Option<Comparison>> = Mode::ALL
        .iter()
        .enumerate()
        .map(|(k, m)| {
            m.checked()
                .then(|| model.compare(&mains[0], &mains[k], vs_eager))
                .transpose()
        })
        .collect::<Result<_>>()?;

    // With `--trace`: a few more steps of per-module replays and of the
    // step graph, traced (after the numerics: they add to the main grads),
    // and what each does at the step boundary. The traced step graph is
    // built again inside the trace, from the same schedule.
    drop(rr_step);
    if let (Some(dir), true) = (&args.trace, lead) {
        const TRACED: usize = 6;
        let main = &mains[slot(Mode::RoundRobin as usize)];
        rr.start_trace().map_err(replay_arena::Error::from)?;
        for _ in 0..TRACED {
            graphed_step(&model, &mut rr, main, &pool, &side)?;
        }
        cuda.synchronize()?;
        let per_module = rr.finish_trace().map_err(replay_arena::Error::from)?;
        rr_s.start_trace().map_err(replay_arena::Error::from)?;
        let main = at(Mode::StepRoundRobin);
        let mut traced = model::step_graph(&model, &mut rr_s, main, &pool, &side, false)?;
        for _ in 0..TRACED {
            traced.launch(&pool[0])?;
        }
        drop(traced);
        cuda.synchronize()?;
        let stepped = rr_s.finish_trace().map_err(replay_arena::Error::from)?;
        for (name, t) in [("per_module", &per_module), ("step_graph", &stepped)] {
            let path = dir.join(format!("tp_backward_{name}.json"));
            t.write_chrome_json(&path)
                .map_err(|e| TpError::Check(format!("writing {}: {e}", path.display())))?;
        }
        println!("\nat the step boundary, round-robin, {TRACED} traced steps (medians over steps after the first; traces in {}):", dir.display());
        println!("| mode | step period | next step's first work, after the step before ends | the step's tail after its last module's replay |");
        println!("|---|---:|---:|---:|");
        // A step of replays: each module's replay and consumer; of the
        // step graph: the nodes of one launch.
        let by_module = model::Boundaries::of(per_module.uses(), |i, _| i / (2 * n));
        let by_launch = model::Boundaries::of(stepped.step_nodes(), |_, u| u.parent.unwrap_or(0));
        for (name, b) in [
            ("per-module replays, fenced", by_module),
            ("step graph", by_launch),
        ] {
            println!(
                "| {name} | {:.1} us | {:+.1} us | {:.1} us |",
                b.period_us, b.gap_us, b.tail_us
            );
        }
    }

    let med = |k: usize| median(&times[k].step).as_secs_f64();
    if lead {
        println!(
            "\n{} steps per mode ({} rounds of {per_round}, modes interleaved; medians over rounds; rank 0's clock), plus one warm-up step",
            steps, args.rounds
        );
        println!(
            "| mode | step time | host time per step | TFLOP/s per rank | main grads vs eager |"
        );
        println!("|---|---:|---:|---:|---|");
        let eager_step = med(Mode::Eager as usize);
        for (k, &mode) in Mode::ALL.iter().enumerate() {
            let step = med(k);
            let host = median(&times[k].host).as_secs_f64();
            let vs = match &comparisons[k] {
                _ if k == 0 => "(reference)".to_string(),
                Some(c) => c.to_string(),
                None => "(timing only: no reduce-scatter)".to_string(),
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
        // What the reduce-scatter costs: serialized (one stream, nothing to
        // hide it behind) against what the step loses with it on the pool.
        let at = |m: Mode| med(m as usize);
        let collective = at(Mode::OneStream) - at(Mode::OneStreamNoRs);
        let exposed_fenced = at(Mode::RoundRobin) - at(Mode::RoundRobinNoRs);
        let exposed_unfenced = at(Mode::Unfenced) - at(Mode::UnfencedNoRs);
        let hidden = |exposed: f64| {
            if collective > 0.0 {
                format!(
                    "{:.3} ms exposed, {:.3} ms hidden ({:.0}% of it)",
                    exposed * 1e3,
                    (collective - exposed) * 1e3,
                    100.0 * (collective - exposed) / collective
                )
            } else {
                "not measurable (no cost on one stream)".to_string()
            }
        };
        println!(
            "\nreduce-scatter per step: {:.3} ms when serialized (one stream, with minus without); on the pool of two streams, fenced: {}; unfenced: {}",
            collective * 1e3,
            hidden(exposed_fenced),
            hidden(exposed_unfenced)
        );
        let stats = rr.fence_stats();
        println!(
            "fence, round-robin plan: {} replays, {} consumers, {} waits, {} waits skipped (implied by stream order), {} event records",
            stats.replays, stats.consumers, stats.waits, stats.waits_skipped, stats.event_records
        );
        println!(
            "\nmemory per rank: plan {} (round-robin) / {} (packed), lower bound {}; per-parameter ring of 2 (wgrad inputs only) {}; eager run's peak of the same buffers {} (stream-ordered pool high-water mark)",
            human_bytes(rr_report.plan_bytes),
            human_bytes(packed_report.plan_bytes),
            human_bytes(rr_report.lower_bound),
            human_bytes(rr_report.ring_bytes),
            human_bytes(eager_peak)
        );
        println!("numerics, every mode against the eager run of the same ranks: {vs_eager}");
    }
    let who = if team.ranks > 1 {
        format!("rank {}: ", team.rank)
    } else {
        String::new()
    };
    for (k, &mode) in Mode::ALL.iter().enumerate().skip(1) {
        let Some(c) = &comparisons[k] else { continue };
        let verdict = if c.bitwise() {
            "bitwise equal to eager"
        } else if c.past_tolerance == 0 {
            "within the tolerance of eager, not bitwise"
        } else if mode == Mode::Unfenced {
            "WRONG: shards were overwritten before they were accumulated (no fence)"
        } else {
            "WRONG"
        };
        println!("  {who}{}: {verdict}", mode.name());
    }
    let fenced_ok = [
        Mode::RoundRobin,
        Mode::Packed,
        Mode::OneStream,
        Mode::StepRoundRobin,
        Mode::StepPacked,
    ]
    .iter()
    .all(|&m| {
        comparisons[m as usize]
            .as_ref()
            .is_some_and(|c| c.past_tolerance == 0)
    });
    drop(packed_step);
    drop((rr, packed, bare, rr_s, packed_s));

    // 6. More than one rank: the eager main-grad shards against a one-rank
    //    run of the whole batch on this rank's GPU (same weights, all ranks'
    //    rows), as many steps.
    let reference_ok = if team.ranks > 1 {
        let whole = Shape {
            tokens: shape.tokens * team.ranks,
            ..shape
        };
        let mut reference = Model::new(cuda, whole, Reduce::StandIn)?;
        let whole_main = reference.main_grads()?;
        for _ in 0..=steps {
            reference.eager_step(&whole_main, &eager_stream)?;
        }
        cuda.synchronize()?;
        // Each rank rounds its partial wgrad to bf16 and the reduce-scatter
        // rounds their sum again, where the one-rank run rounds the whole
        // sum once: up to three half-ulps of bf16 per step, accumulated
        // identically every step. One bf16 ulp of the element plus two of
        // the tensor's largest value.
        let tol = Tolerance {
            rtol: 1.0 / 128.0,
            atol: 0.0,
            of_max: 1.0 / 64.0,
        };
        let eager = model.compare_to_reference(&mains[0], &reference, &whole_main, tol)?;
        let graphed = model.compare_to_reference(
            &mains[Mode::RoundRobin as usize],
            &reference,
            &whole_main,
            tol,
        )?;
        team.barrier.wait();
        if lead {
            println!(
                "numerics, {} ranks against one rank of the whole batch ({} tokens, {} steps): {tol}",
                team.ranks,
                whole.tokens,
                steps + 1
            );
        }
        team.barrier.wait();
        println!("  {who}eager vs one rank: {eager}");
        println!("  {who}graphed round-robin vs one rank: {graphed}");
        eager.past_tolerance == 0 && graphed.past_tolerance == 0
    } else {
        true
    };
    if !fenced_ok {
        return Err(TpError::Check(
            "fenced graphed main grads differ from the eager run's".into(),
        ));
    }
    if !reference_ok {
        return Err(TpError::Check(
            "main grads differ from the one-rank run of the whole batch past the tolerance".into(),
        ));
    }
    Ok(())
}

fn strategy_name(s: PlacedPolicy) -> String {
    format!("{} {}", s.policy, s.placement)
}

/// Allocates `plan`'s arenas on `backend`, captures every module, seals.
fn capture<B: Compose<Stream = cuda::Stream, Graph = cuda::Graph>>(
    model: &mut Model,
    plan: replay_arena::Planned,
    backend: B,
    stream: &cuda::Stream,
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
fn workspaces<B: Compose>(name: &str, replayable: &Replayable<B>, lead: bool) -> Result<()> {
    let runners: Vec<RunnerId> = replayable.plan().runners().collect();
    let mut ranges = Vec::with_capacity(runners.len());
    for &r in &runners {
        let views = replayable.views(r)?;
        if let Some(range) = model::workspace_range(views) {
            ranges.push(range);
        }
    }
    let mut distinct = ranges.clone();
    distinct.sort();
    distinct.dedup();
    let overlap = |(a, n): (u64, u64), (b, m): (u64, u64)| a < b + m && b < a + n;
    let shared = ranges.windows(2).filter(|w| overlap(w[0], w[1])).count();
    if lead {
        println!(
        "cuBLAS workspaces, {name}: {} runners use {} distinct workspace ranges; consecutive runners (in flight together on the pool) sharing workspace bytes: {shared}; runners that do share are ordered by the fence",
            ranges.len(),
            distinct.len()
        );
    }
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
    cuda: &cuda::Device,
    model: &mut Model,
    main: &MainGrads,
    s: &cuda::Stream,
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
