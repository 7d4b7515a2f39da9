//! The fence's own work per replay, in figures that host noise cannot move:
//! `cargo bench --bench hot_path`.
//!
//! The plan runs on a *counting* backend: `sim` for everything that sets a
//! plan up (arenas, captures), but the calls a replay makes on the hot path
//! (`wait_event`, `record_event`, `launch`, `is_capturing`) only count
//! themselves and return. What a replay costs above them is the crate's own
//! work. Two figures per mode:
//!
//! - **backend calls per replay** (of each kind), exact;
//! - **instructions per replay** of the crate's own work, counted by
//!   Valgrind's callgrind when `valgrind` is on the `PATH` (the bench runs
//!   itself under it, counting only the replay loop: the difference of a
//!   loop of 2,000 and one of 1,000 replays, so set-up and the loop's first
//!   replays drop out). Without Valgrind, that column says so.
//!
//! Modes, as in `cargo bench --bench gpu_replay -- host`:
//! one stream (waits implied by stream order), alternating two streams
//! (record + wait + launch), a pool (round-robin G = 2, 4 runners, stream
//! `k % 2`) and packed (packed G = 2, 4 runners, two streams).
//!
//! Then the crate's own instructions per step-graph build (the same
//! counting, on `sim`'s composition, which callgrind leaves out of the
//! count: it stands for the driver's), for the GPU capture bench's ladders
//! (1, 4, 16 and 64 buckets of 32 runners) and the start-up bench's
//! buckets (4 layers, each handing off to the next).
//!
//! The instruction count is of this machine's build (x86-64, release, the
//! bench profile); it moves with the code, not with the load. Its history
//! is in `docs/BENCHMARKS.md`.

use std::hint::black_box;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use replay_arena::backend::{
    Allocate, ArenaDesc, Backend, BackendError, Capture, Compose, GraphRejection, Launch, StepEnd,
    StepNode, Streams,
};
use replay_arena::sim;
use replay_arena::{
    DType, Discovering, Domain, PlacedPolicy, PlanConfig, Policy, Replayable, Request, RunnerId,
};

/// Hot-path calls, by kind: wait, record, launch, capture-status query
/// (the columns of the table).
static CALLS: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];

fn count(kind: usize) {
    CALLS[kind].fetch_add(1, Relaxed);
}

/// `sim` for set-up; the hot path's calls count and return.
#[derive(Clone)]
struct Counting(sim::Device);

impl Streams for Counting {
    type Event = sim::Event;
    type Stream = sim::Stream;
    fn create_event(&self) -> Result<sim::Event, BackendError> {
        self.0.create_event()
    }
    fn stream_id(&self, stream: &sim::Stream) -> u64 {
        self.0.stream_id(stream)
    }
    fn wait_event(&self, _: &sim::Stream, _: &sim::Event) -> Result<(), BackendError> {
        count(0);
        Ok(())
    }
    fn record_event(&self, _: &sim::Stream, _: &sim::Event) -> Result<(), BackendError> {
        count(1);
        Ok(())
    }
    fn synchronize_event(&self, event: &sim::Event) -> Result<(), BackendError> {
        self.0.synchronize_event(event)
    }
    fn is_capturing(&self, _: &sim::Stream) -> Result<bool, BackendError> {
        count(3);
        Ok(false)
    }
    fn synchronize(&self) -> Result<(), BackendError> {
        self.0.synchronize()
    }
}

impl Allocate for Counting {
    type Arena = sim::Arena;
    fn allocate_arena(&self, desc: &ArenaDesc) -> Result<sim::Arena, BackendError> {
        self.0.allocate_arena(desc)
    }
}

impl Capture for Counting {
    type Graph = sim::Graph;
    fn begin_capture(&self, stream: &sim::Stream) -> Result<(), BackendError> {
        self.0.begin_capture(stream)
    }
    unsafe fn end_capture(&self, stream: &sim::Stream) -> Result<sim::Graph, BackendError> {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.0.end_capture(stream) }
    }
    unsafe fn abort_capture(&self, stream: &sim::Stream) {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.0.abort_capture(stream) }
    }
    fn record_event_node(
        &self,
        stream: &sim::Stream,
        event: &sim::Event,
    ) -> Result<(), BackendError> {
        self.0.record_event_node(stream, event)
    }
    fn validate_graph(&self, graph: &sim::Graph) -> Result<(), GraphRejection> {
        self.0.validate_graph(graph)
    }
}

impl Launch for Counting {
    unsafe fn launch(&self, _: &sim::Graph, _: &sim::Stream) -> Result<(), BackendError> {
        count(2);
        Ok(())
    }
}

/// Step builds: `sim`'s composition, which the count leaves out (it stands
/// for the driver's).
impl Compose for Counting {
    fn split_graph(
        &self,
        graph: &sim::Graph,
        events: &[&sim::Event],
    ) -> Result<(sim::Graph, sim::Graph, usize), BackendError> {
        self.0.split_graph(graph, events)
    }
    #[inline(never)]
    fn compose(
        &self,
        nodes: Vec<StepNode<'_, sim::Graph, sim::Event>>,
        end: Option<StepEnd<'_, sim::Event>>,
    ) -> Result<sim::Graph, BackendError> {
        self.0.compose(nodes, end)
    }
}

impl Backend for Counting {
    fn name(&self) -> &'static str {
        "counting"
    }
}

type R<T> = Result<T, Box<dyn std::error::Error>>;

const MODES: [&str; 4] = ["one stream", "alternating two streams", "pool", "packed"];

/// A plan of `runners` one-kernel runners.
fn build(b: &Counting, runners: usize, policy: PlacedPolicy) -> R<Replayable<Counting>> {
    let req = Request::new(Domain::Device, DType::F32, 64);
    let mut d = Discovering::new(PlanConfig::new());
    for r in 0..runners {
        d.arm(RunnerId(r as u32))?.record(req)?;
    }
    let mut capturing = d.plan(policy)?.allocate(b.clone())?;
    let s = b.0.new_stream();
    for r in 0..runners {
        let cap = capturing.capture(RunnerId(r as u32))?;
        let v = cap.take(req)?;
        cap.stream_capture(&s, |s| b.0.launch(s, sim::Kernel::fill(&v, 1.0), 0))?;
        cap.finish()?;
    }
    Ok(capturing.seal()?)
}

/// One mode's plan and streams.
struct Mode {
    plan: Replayable<Counting>,
    streams: [sim::Stream; 2],
    mode: usize,
}

impl Mode {
    fn new(mode: usize) -> R<Mode> {
        let b = Counting(sim::Device::new());
        let plan = match mode {
            0 | 1 => build(&b, 1, Policy::Generations(1).into())?,
            2 => build(&b, 4, Policy::Generations(2).into())?,
            _ => build(&b, 4, Policy::Generations(2).packed())?,
        };
        Ok(Mode {
            plan,
            streams: [b.0.new_stream(), b.0.new_stream()],
            mode,
        })
    }

    /// Replays `n` times in the mode's pattern.
    #[inline(never)]
    fn measured_replays(&mut self, n: usize) -> R<()> {
        for i in 0..n {
            let (runner, stream) = match self.mode {
                0 => (0, 0),
                1 => (0, i % 2),
                2 => (i % 4, i % 2),
                _ => (i % 4, (i / 4) % 2),
            };
            black_box(&mut self.plan).replay(RunnerId(runner as u32), &self.streams[stream])?;
        }
        Ok(())
    }
}

/// Step-graph builds: `buckets` buckets of `layers` one-kernel runners,
/// planned as the GPU capture ladder is (`cargo bench --bench gpu_replay
/// -- capture`), each bucket's step alternating two lanes; or, `chained`,
/// as the start-up bench's buckets are (`cargo bench --bench
/// gpu_startup`): each layer hands its output to the next, one lane.
struct Builds {
    plan: Replayable<Counting>,
    lanes: [sim::Stream; 2],
    shape: BuildShape,
}

#[derive(Clone, Copy)]
struct BuildShape {
    buckets: usize,
    layers: usize,
    chained: bool,
}

const BUILD_SHAPES: [BuildShape; 5] = [
    BuildShape::ladder(1),
    BuildShape::ladder(4),
    BuildShape::ladder(16),
    BuildShape::ladder(64),
    BuildShape {
        buckets: 67,
        layers: 4,
        chained: true,
    },
];

impl BuildShape {
    const fn ladder(buckets: usize) -> BuildShape {
        BuildShape {
            buckets,
            layers: 32,
            chained: false,
        }
    }

    fn runner(&self, bucket: usize, l: usize) -> RunnerId {
        RunnerId((bucket * self.layers + l) as u32)
    }
}

impl Builds {
    fn new(shape: BuildShape) -> R<Builds> {
        let b = Counting(sim::Device::new());
        let req = Request::new(Domain::Device, DType::F32, 16384);
        let mut d = Discovering::new(PlanConfig::new());
        let mut handoffs = Vec::new();
        for bucket in 0..shape.buckets {
            d.bucket(format!("b{bucket}"))?;
            for l in 0..shape.layers {
                let mut a = d.arm(shape.runner(bucket, l))?;
                a.record(req)?;
                if shape.chained {
                    if l > 0 {
                        a.receive(handoffs[bucket * shape.layers + l - 1])?;
                    }
                    handoffs.push(a.hand_off(req)?);
                }
            }
        }
        let mut capturing = d.plan(Policy::OverlapDepth(2))?.allocate(b.clone())?;
        let s = b.0.new_stream();
        for bucket in 0..shape.buckets {
            for l in 0..shape.layers {
                let cap = capturing.capture(shape.runner(bucket, l))?;
                let v = cap.take(req)?;
                if shape.chained {
                    let k = bucket * shape.layers + l;
                    let out = cap.hand_off(handoffs[k])?;
                    if l > 0 {
                        cap.receive(handoffs[k - 1])?;
                    }
                    cap.stream_capture(&s, |s| {
                        b.0.launch(s, sim::Kernel::fill(&v, 1.0), 0)?;
                        b.0.launch(s, sim::Kernel::fill(&out, 1.0), 0)
                    })?;
                } else {
                    cap.stream_capture(&s, |s| b.0.launch(s, sim::Kernel::fill(&v, 1.0), 0))?;
                }
                cap.finish()?;
            }
        }
        Ok(Builds {
            plan: capturing.seal()?,
            lanes: [b.0.new_stream(), b.0.new_stream()],
            shape,
        })
    }

    /// Builds (and keeps) every bucket's step graph `rounds` times, each
    /// round's dropped after it, outside the count.
    fn rounds(&mut self, rounds: usize) -> R<()> {
        for _ in 0..rounds {
            drop(self.measured_builds()?);
        }
        Ok(())
    }

    /// No closures inside: callgrind toggles its count at every function
    /// whose name matches, a closure of this one's included.
    #[inline(never)]
    fn measured_builds(&mut self) -> R<Vec<replay_arena::KeptStep<Counting>>> {
        let plan = black_box(&mut self.plan);
        let shape = self.shape;
        let mut kept = Vec::with_capacity(shape.buckets);
        for bucket in 0..shape.buckets {
            let mut step = plan.step();
            for l in 0..shape.layers {
                let lane = if shape.chained { 0 } else { l % 2 };
                step.replay(shape.runner(bucket, l), &self.lanes[lane])?;
            }
            kept.push(step.build()?.keep());
        }
        Ok(kept)
    }
}

const WARM: usize = 100;
const SHORT: usize = 1000;
const LONG: usize = 2000;

/// Under callgrind: the one mode, `n` counted replays (a mode past the
/// replay modes: step builds of `BUILD_SHAPES[mode - 4]` buckets, `n`
/// rounds).
fn child(mode: usize, n: usize) -> R<()> {
    if let Some(&buckets) = mode
        .checked_sub(MODES.len())
        .and_then(|i| BUILD_SHAPES.get(i))
    {
        let mut b = Builds::new(buckets)?;
        return b.rounds(n);
    }
    let mut m = Mode::new(mode)?;
    m.measured_replays(WARM)?; // outside the count: collection is off here
    m.plan.synchronize()?;
    m.measured_replays(n)
}

/// Instructions callgrind counted inside `measured_replays` for `n`
/// replays of `mode` (the warm-up's included: it cancels in the difference).
fn callgrind(mode: usize, n: usize) -> Option<u64> {
    let exe = std::env::current_exe().ok()?;
    let out = Command::new("valgrind")
        .args([
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            "--collect-atstart=no",
            "--toggle-collect=*measured_replays*",
            "--toggle-collect=*measured_builds*",
            // Toggled off again inside: the composition stands for the
            // driver's.
            "--toggle-collect=*Counting*Compose*compose*",
        ])
        .arg(exe)
        .args(["--child", &mode.to_string(), &n.to_string()])
        .output()
        .ok()?;
    let err = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        eprintln!("callgrind run failed: {err}");
        return None;
    }
    err.lines()
        .find_map(|l| l.split("Collected :").nth(1))
        .and_then(|n| n.trim().parse().ok())
}

fn main() -> R<()> {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--child") {
        return child(args[i + 1].parse()?, args[i + 2].parse()?);
    }
    let valgrind = Command::new("valgrind").arg("--version").output().is_ok();
    println!(
        "## the crate's own work per replay (counting backend; `cargo bench --bench hot_path`)"
    );
    println!("| mode | waits | records | launches | capture queries | instructions |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (mode, name) in MODES.iter().enumerate() {
        let mut m = Mode::new(mode)?;
        m.measured_replays(WARM)?;
        let before: Vec<u64> = CALLS.iter().map(|c| c.load(Relaxed)).collect();
        m.measured_replays(SHORT)?;
        let per: Vec<String> = CALLS
            .iter()
            .zip(&before)
            .map(|(c, b)| format!("{:.2}", (c.load(Relaxed) - b) as f64 / SHORT as f64))
            .collect();
        let instructions = if valgrind {
            match (callgrind(mode, SHORT), callgrind(mode, LONG)) {
                (Some(short), Some(long)) => {
                    format!(
                        "{:.0}",
                        long.saturating_sub(short) as f64 / (LONG - SHORT) as f64
                    )
                }
                _ => "callgrind failed".into(),
            }
        } else {
            "no valgrind".into()
        };
        println!("| {name} | {} | {instructions} |", per.join(" | "));
    }
    println!();
    println!("## the crate's own work per step-graph build (the composition left out)");
    println!("| buckets x layers | instructions per build | per runner |");
    println!("|---|---:|---:|");
    for (i, shape) in BUILD_SHAPES.into_iter().enumerate() {
        let BuildShape {
            buckets, layers, ..
        } = shape;
        let name = match shape.chained {
            true => format!("{buckets} x {layers}, each layer handing off to the next"),
            false => format!("{buckets} x {layers}"),
        };
        // One round outside callgrind: the builds succeed.
        Builds::new(shape)?.rounds(1)?;
        let (short, long) = (2, 4);
        let per = match valgrind {
            false => None,
            true => match (
                callgrind(MODES.len() + i, short),
                callgrind(MODES.len() + i, long),
            ) {
                (Some(s), Some(l)) => {
                    Some(l.saturating_sub(s) as f64 / ((long - short) * buckets) as f64)
                }
                _ => None,
            },
        };
        match per {
            Some(per) => println!("| {name} | {per:.0} | {:.0} |", per / layers as f64),
            None if valgrind => println!("| {name} | callgrind failed | |"),
            None => println!("| {name} | no valgrind | |"),
        }
    }
    Ok(())
}
