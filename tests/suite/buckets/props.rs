//! Random joins, releases, re-captures, replays and kept step launches
//! under a bucket budget, with a fault injected at any backend call: no
//! hazard, every value that was computed is right, nothing leaks.

use proptest::prelude::*;
use replay_arena::sim::{self, Faults};
use replay_arena::{BucketId, BucketState, KeptStep, RunnerId};

use crate::support::buckets::{capture_double, join, run, sealed, TEMPORARIES};

thread_local! {
    static LAUNCHED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

#[derive(Clone, Debug)]
enum Op {
    Join(u64),
    Run(usize, u8),
    Release(usize),
    Recapture(usize),
    Sync,
    Step(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1u64..=32).prop_map(|n| Op::Join(n * 8)),
        (0usize..8, 1u8..9).prop_map(|(b, v)| Op::Run(b, v)),
        (0usize..8).prop_map(Op::Release),
        (0usize..8).prop_map(Op::Recapture),
        Just(Op::Sync),
        (0usize..8).prop_map(Op::Step),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_bucket_lives_under_faults(
        ops in prop::collection::vec(op(), 1..24),
        seed in any::<u64>(),
        one_in in 4u64..40,
        budget in 1usize..4,
        temporaries in any::<bool>(),
    ) {
        TEMPORARIES.with(|t| t.set(temporaries));
        let sim = sim::Device::new();
        let (stage, pool, side) = (sim.new_stream(), sim.new_stream(), sim.new_stream());
        let streams = (&stage, &pool, &side);
        // Sinks per bucket (by index): the value expected there, if known.
        let mut sinks = Vec::new();
        let mut expect: Vec<Option<f32>> = Vec::new();
        {
            let mut r = sealed(&sim, &pool, &[64, 256]);
            let mut sizes = vec![64u64, 256];
            for &n in &sizes {
                sinks.push(sim.alloc_f32(n as usize).unwrap());
                expect.push(None);
            }
            let _ = r.set_bucket_budget(budget);
            let mut steps: Vec<Option<KeptStep<sim::Device>>> = vec![None, None];
            sim.inject(Faults::seeded(seed, one_in));
            let mut next = 100u32;
            let mut launched = 0usize;
            for op in ops {
                match op {
                    Op::Join(n) => {
                        let runner = RunnerId(next);
                        if join(&mut r, &sim, &pool, runner, n).is_ok() {
                            next += 1;
                            sizes.push(n);
                            let Ok(sink) = sim.alloc_f32(n as usize) else { break };
                            sinks.push(sink);
                            expect.push(None);
                            steps.push(None);
                        }
                    }
                    Op::Run(b, v) => {
                        let b = b % sizes.len();
                        let runner = r.plan().runners_in(BucketId(b as u32)).next().unwrap();
                        let ran = run(&mut r, &sim, streams, runner, v as f32, &sinks[b]);
                        expect[b] = ran.ok().map(|()| 2.0 * v as f32);
                    }
                    Op::Release(b) => {
                        let b = BucketId((b % sizes.len()) as u32);
                        let _ = r.release_bucket(b);
                    }
                    Op::Recapture(b) => {
                        let bi = b % sizes.len();
                        let b = BucketId(bi as u32);
                        let runner = r.plan().runners_in(b).next().unwrap();
                        if let Ok(mut capture) = r.recapture_bucket(b) {
                            let captured = capture
                                .capture(runner)
                                .map_err(replay_arena::Error::from)
                                .and_then(|cap| capture_double(cap, &sim, &pool, sizes[bi]));
                            if captured.is_ok() {
                                let _ = capture.seal();
                            }
                        }
                    }
                    Op::Sync => {
                        let _ = r.synchronize();
                    }
                    Op::Step(b) => {
                        let bi = b % sizes.len();
                        let runner = r.plan().runners_in(BucketId(bi as u32)).next().unwrap();
                        if steps[bi].is_none() && r.bucket_state(BucketId(bi as u32)).unwrap() == BucketState::Captured {
                            let staged = r.consume_mut(runner, &stage, |s, v| sim.launch(s, sim::Kernel::fill(&v[0], 1.0), 1));
                            if staged.is_ok() {
                                let mut step = r.step();
                                if step.replay(runner, &pool).is_ok() {
                                    steps[bi] = step.build().ok().map(|s| s.keep());
                                }
                            }
                        }
                        if let Some(kept) = steps[bi].as_mut() {
                            let staged = r.consume_mut(runner, &stage, |s, v| sim.launch(s, sim::Kernel::fill(&v[0], 1.0), 1));
                            if staged.is_ok() {
                                launched += usize::from(r.launch_kept(kept, &pool).is_ok());
                            }
                        }
                    }
                }
            }
            sim.inject(Faults::none());
            r.synchronize().unwrap();
            drop(steps);
            LAUNCHED.with(|l| l.set(l.get() + launched));
        }
        prop_assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
        for (sink, want) in sinks.iter().zip(&expect) {
            if let Some(want) = want {
                let got = sim.read_f32(sink).unwrap();
                prop_assert!(got.iter().all(|x| x == want), "{got:?} != {want}");
            }
        }
        let memory = replay_arena::backend::Backend::graph_memory_in_use(&sim).unwrap().unwrap();
        prop_assert_eq!((memory.used, memory.reserved), (0, 0));
        prop_assert_eq!(sim.live_allocations(), sinks.len());
        prop_assert_eq!(sim.live_events(), 0);
    }
}
