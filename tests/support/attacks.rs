//! Benches several attack files of `suite/regression/` share, on `sim`:
//! the plan of run-time buckets with its streams and sinks
//! ([`BucketBench`]), and the checks of a chain of cut step copies against
//! its per-runner replays ([`replayed_values`]).

use std::borrow::Borrow;
use std::fmt;

use replay_arena::sim::{self, AsSpan};
use replay_arena::{Joined, Replayable, RunnerId, StepGraph};

use super::buckets::{self, TEMPORARIES};
use super::faults::chain::{chain_with, Chain, Ctx};
use super::faults::fan::{Item, Spec};
use super::faults::{assert_no_graph_memory, R};

/// A device with three streams (`stage`, `pool`, `side`) and program
/// sinks, for [`buckets::sealed`] plans of buckets 64 and 256.
pub struct BucketBench {
    pub sim: sim::Device,
    pub stage: sim::Stream,
    pub pool: sim::Stream,
    pub side: sim::Stream,
    /// One sink per length asked for, allocated before any plan.
    pub sinks: Vec<sim::HostBuffer>,
}

impl BucketBench {
    /// A new device, its three streams, and a sink of each of `sinks`
    /// elements.
    pub fn new(sinks: &[usize]) -> BucketBench {
        let sim = sim::Device::new();
        let (stage, pool, side) = (sim.new_stream(), sim.new_stream(), sim.new_stream());
        let sinks = sinks.iter().map(|&n| sim.alloc_f32(n).unwrap()).collect();
        BucketBench {
            sim,
            stage,
            pool,
            side,
            sinks,
        }
    }

    /// Buckets of 64 and 256 elements (runners 0 and 1), captured on
    /// `pool` and sealed.
    pub fn sealed(&self) -> Replayable<sim::Device> {
        buckets::sealed(&self.sim, &self.pool, &[64, 256])
    }

    /// [`buckets::run`] of `runner` on the three streams.
    pub fn run(
        &self,
        r: &mut Replayable<sim::Device>,
        runner: u32,
        value: f32,
        sink: &impl AsSpan,
    ) -> replay_arena::Result<()> {
        let streams = (&self.stage, &self.pool, &self.side);
        buckets::run(r, &self.sim, streams, RunnerId(runner), value, sink)
    }

    /// [`buckets::join`] of bucket `bs={n}` with `runner`, captured on
    /// `pool`.
    pub fn join(
        &self,
        r: &mut Replayable<sim::Device>,
        runner: u32,
        n: u64,
    ) -> replay_arena::Result<Joined> {
        buckets::join(r, &self.sim, &self.pool, RunnerId(runner), n)
    }

    /// After teardown: no hazard, no event, and only the sinks live.
    pub fn assert_clean(&self) {
        let sim = &self.sim;
        assert_eq!(sim.hazards(), [], "hazards");
        assert_eq!(sim.live_events(), 0, "events leaked");
        assert_eq!(
            sim.live_allocations(),
            self.sinks.len(),
            "allocations leaked"
        );
    }
}

/// A [`BucketBench`] with `sinks`, its graphs allocating a temporary or
/// not (`temporaries`): `body` runs on its sealed plan, and after the
/// plan's drop the device holds only the sinks.
pub fn with_buckets(
    temporaries: bool,
    sinks: &[usize],
    body: impl FnOnce(&BucketBench, &mut Replayable<sim::Device>),
) {
    TEMPORARIES.with(|t| t.set(temporaries));
    let bench = BucketBench::new(sinks);
    {
        let mut r = bench.sealed();
        body(&bench, &mut r);
    }
    TEMPORARIES.with(|t| t.set(true));
    bench.assert_clean();
}

/// A [`chain_with`] chain whose every runner captured.
pub fn captured_chain(
    layers: usize,
    g: usize,
    copies: usize,
    work: &mut dyn FnMut(&Ctx, &sim::Stream) -> R,
) -> Chain {
    let c = chain_with(layers, g, copies, work);
    assert!(c.capture_errors.is_empty(), "{:?}", c.capture_errors);
    c
}

/// The values of a [`chain_with`] chain after `replays` per-runner
/// replays: what the same chain's step graphs must give.
pub fn replayed_values(
    layers: usize,
    g: usize,
    copies: usize,
    work: &mut dyn FnMut(&Ctx, &sim::Stream) -> R,
    replays: usize,
) -> Vec<Vec<f32>> {
    let mut reference = chain_with(layers, g, copies, work);
    reference.per_runner(replays);
    reference.values()
}

/// `c` is hazard-free and holds `expected`; then it tears down clean.
pub fn assert_values_then_teardown(c: Chain, expected: &[Vec<f32>], what: impl fmt::Display) {
    c.hazard_free();
    assert_eq!(c.values(), expected, "{what}");
    c.teardown();
}

/// No hazard on `sim`.
pub fn assert_hazard_free(sim: &sim::Device, what: impl fmt::Display) {
    assert!(sim.hazards().is_empty(), "{what}: {:?}", sim.hazards());
}

/// After the launches of a `two_handoffs` plan `r`: once synchronized,
/// no hazard, and both readers (runners 1 and 2) hold `value`; then the
/// plan is dropped and its graph memory is gone.
pub fn assert_readers_hold(
    sim: &sim::Device,
    r: Replayable<sim::Device>,
    value: f32,
    what: impl fmt::Display,
) {
    r.synchronize().unwrap();
    assert_hazard_free(sim, &what);
    for i in 1..3u32 {
        let v = sim.read_f32(&r.views(RunnerId(i)).unwrap()[0]).unwrap();
        assert_eq!(v[0], value, "reader {i} {what}");
    }
    drop(r);
    assert_no_graph_memory(sim, "after the drop");
}

/// `c` is hazard-free; then it tears down clean.
pub fn assert_hazard_free_then_teardown(c: Chain) {
    c.hazard_free();
    c.teardown();
}

/// Launches `g` `times` times, on `streams` in turn.
pub fn launch_in_turn<S: Borrow<sim::Stream>>(
    g: &mut StepGraph<'_, sim::Device>,
    streams: &[S],
    times: usize,
) {
    for k in 0..times {
        g.launch(streams[k % streams.len()].borrow()).unwrap();
    }
}

/// A [`Spec`] of a writer of `k` handoffs with `copies` step copies,
/// reader 0 handing on to a collector.
pub fn chained(k: usize, copies: usize) -> Spec {
    let mut spec = Spec::new(k);
    spec.copies = copies;
    spec.chain = true;
    spec
}

/// A fan's step items: a replay of each `(runner, stream)`, in order.
pub fn replays(items: &[(u32, usize)]) -> Vec<Item> {
    items.iter().map(|&(r, s)| Item::Replay(r, s)).collect()
}
