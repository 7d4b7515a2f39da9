//! The slow consumer of the fence's races: runners of one size whose
//! consumer reads each element twice, many clock cycles apart, on few
//! blocks, so that it runs alongside the runners' graphs and a replay that
//! overwrote its input mid-read would show.

use replay_arena::cuda;
use replay_arena::{Access, RunnerId, StepBuilder, View};

use super::{Gpu, Rig, Spec, K};

/// Runners; planned in two generations, runner `r + 2` takes runner `r`'s bytes.
pub const RUNNERS: u32 = 6;
/// Elements of each runner's one wgrad.
pub const N: u32 = 1 << 14;
/// Steps of a run.
pub const STEPS: usize = 20;
/// Clock cycles between the consumer's two reads of an element (about 10 us).
pub const SPIN: i64 = 20_000;
/// Blocks of the consumer: few, so it runs alongside the runners' graphs.
pub const CONSUMER_BLOCKS: u32 = 8;

/// The runners: runner `r` seeded `r`, with `scratch` elements of scratch.
pub fn specs(scratch: Option<u32>) -> Vec<Spec> {
    (0..RUNNERS).map(|r| Spec::new(r, &[N], scratch)).collect()
}

/// The slow consumer of runner `r`: [`Rig::fold`] spinning [`SPIN`] cycles
/// on [`CONSUMER_BLOCKS`] blocks.
pub fn fold<A: Access>(
    g: &Gpu,
    rig: &Rig,
    spec: &Spec,
    r: usize,
    s: &cuda::Stream,
    views: &[View<'_, A>],
) -> K {
    rig.fold(g, spec, r, s, views, SPIN, Some(CONSUMER_BLOCKS))
}

/// Schedules every runner of `specs` into `step`: runner `r` replayed on
/// `rig.pool[r % 2]`, then its slow consumer on `rig.consumer`.
pub fn schedule(g: &Gpu, rig: &Rig, specs: &[Spec], step: &mut StepBuilder<'_, cuda::Device>) {
    for (r, spec) in specs.iter().enumerate() {
        let runner = RunnerId(r as u32);
        step.replay(runner, &rig.pool[r % 2]).unwrap();
        step.consume(runner, &rig.consumer, |s, views| {
            fold(g, rig, spec, r, s, views)
        })
        .unwrap();
    }
}
