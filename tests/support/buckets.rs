//! Run-time buckets' fixtures (`src/buckets.rs`), on `sim`: a plan of
//! buckets whose runners double their input through a graph temporary, a
//! bucket that joins it, and one staged replay of a runner.

use replay_arena::sim::{self, AsSpan};
use replay_arena::{
    ArmedRunner, DType, Discovering, Domain, PlanConfig, Policy, Purpose, Replayable, Request,
    RunnerCapture, RunnerId,
};

pub fn input(n: u64) -> Request {
    Request::new(Domain::Device, DType::F32, n).purpose(Purpose::Input)
}

pub fn output(n: u64) -> Request {
    Request::new(Domain::Device, DType::F32, n)
}

thread_local! {
    /// Whether `capture_double` allocates a temporary in its graph (a
    /// runner with one builds into step graphs only from step copies).
    pub static TEMPORARIES: std::cell::Cell<bool> = const { std::cell::Cell::new(true) };
}

/// Records the runner's `input(n)` and `output(n)`, in that order.
fn record_io(mut armed: ArmedRunner<'_>, n: u64) -> replay_arena::Result<()> {
    armed.record(input(n))?;
    armed.record(output(n))?;
    Ok(())
}

/// One runner's graph: `out = 2 * in`, through a temporary the graph
/// allocates and frees (graph memory the driver reserves).
pub fn capture_double(
    cap: RunnerCapture<'_, sim::Device>,
    sim: &sim::Device,
    pool: &sim::Stream,
    n: u64,
) -> replay_arena::Result<()> {
    let (i, o) = (cap.take(input(n))?, cap.take(output(n))?);
    if !TEMPORARIES.with(|t| t.get()) {
        cap.stream_capture(pool, |s| {
            sim.launch(s, sim::Kernel::copy(&i, &o), 3)?;
            sim.launch(s, sim::Kernel::scale(&o, 2.0), 3)
        })?;
        cap.finish()?;
        return Ok(());
    }
    cap.stream_capture(pool, |s| {
        let t = sim.alloc_async(s, n as usize)?;
        sim.launch(s, sim::Kernel::copy(&i, &t), 3)?;
        sim.launch(s, sim::Kernel::scale(&t, 2.0), 3)?;
        sim.launch(s, sim::Kernel::copy(&t, &o), 3)?;
        sim.free_async(s, &t)
    })?;
    cap.finish()?;
    Ok(())
}

/// A sealed plan of buckets `sizes` (runner `b` in bucket `b`, input and
/// output of `sizes[b]` f32s), one generation.
pub fn sealed(sim: &sim::Device, pool: &sim::Stream, sizes: &[u64]) -> Replayable<sim::Device> {
    let mut d = Discovering::new(PlanConfig::new());
    for (b, &n) in sizes.iter().enumerate() {
        let bucket = d.bucket(format!("bs={n}")).unwrap();
        record_io(d.arm_in(bucket, RunnerId(b as u32)).unwrap(), n).unwrap();
    }
    let planned = d.plan(Policy::Generations(1)).unwrap();
    let mut capturing = planned.allocate(sim.clone()).unwrap();
    for (b, &n) in sizes.iter().enumerate() {
        let cap = capturing.capture(RunnerId(b as u32)).unwrap();
        capture_double(cap, sim, pool, n).unwrap();
    }
    capturing.seal().unwrap()
}

/// Joins bucket `bs={n}` with runner `runner`.
pub fn join(
    r: &mut Replayable<sim::Device>,
    sim: &sim::Device,
    pool: &sim::Stream,
    runner: RunnerId,
    n: u64,
) -> replay_arena::Result<replay_arena::Joined> {
    let mut discovery = r.discover_bucket(format!("bs={n}"))?;
    record_io(discovery.arm(runner)?, n)?;
    let mut capture = discovery.fit()?;
    capture_double(capture.capture(runner)?, sim, pool, n)?;
    Ok(capture.seal()?)
}

/// Stages `value`, replays `runner`, copies its output to `sink`.
pub fn run(
    r: &mut Replayable<sim::Device>,
    sim: &sim::Device,
    streams: (&sim::Stream, &sim::Stream, &sim::Stream),
    runner: RunnerId,
    value: f32,
    sink: &impl AsSpan,
) -> replay_arena::Result<()> {
    let (stage, pool, side) = streams;
    r.consume_mut(runner, stage, |s, v| {
        sim.launch(s, sim::Kernel::fill(&v[0], value), 2)
    })?;
    r.replay(runner, pool)?;
    r.consume(runner, side, |s, v| {
        sim.launch(s, sim::Kernel::copy(&v[1], sink), 2)
    })?;
    Ok(())
}

/// A fresh `sim`, its staging, pool and side streams, and `sealed` buckets
/// of 64 and 256 f32s captured on the pool.
pub struct Fixture {
    pub r: Replayable<sim::Device>,
    pub sim: sim::Device,
    pub stage: sim::Stream,
    pub pool: sim::Stream,
    pub side: sim::Stream,
}

pub fn fixture() -> Fixture {
    let sim = sim::Device::new();
    let (stage, pool, side) = (sim.new_stream(), sim.new_stream(), sim.new_stream());
    Fixture {
        r: sealed(&sim, &pool, &[64, 256]),
        sim,
        stage,
        pool,
        side,
    }
}

impl Fixture {
    /// [`run`] on the fixture's three streams.
    pub fn run(
        &mut self,
        runner: RunnerId,
        value: f32,
        sink: &impl AsSpan,
    ) -> replay_arena::Result<()> {
        let streams = (&self.stage, &self.pool, &self.side);
        run(&mut self.r, &self.sim, streams, runner, value, sink)
    }

    /// [`join`] of bucket `bs={n}`, captured on the pool.
    pub fn join(&mut self, runner: RunnerId, n: u64) -> replay_arena::Result<replay_arena::Joined> {
        join(&mut self.r, &self.sim, &self.pool, runner, n)
    }

    /// Fills `runner`'s input with ones on the staging stream, then keeps a
    /// step graph replaying it on the pool and launches it once there.
    pub fn launched_kept_step(&mut self, runner: RunnerId) -> replay_arena::KeptStep<sim::Device> {
        let sim = &self.sim;
        self.r
            .consume_mut(runner, &self.stage, |s, v| {
                sim.launch(s, sim::Kernel::fill(&v[0], 1.0), 1)
            })
            .unwrap();
        let mut step = self.r.step();
        step.replay(runner, &self.pool).unwrap();
        let mut kept = step.build().unwrap().keep();
        self.r.launch_kept(&mut kept, &self.pool).unwrap();
        kept
    }
}
