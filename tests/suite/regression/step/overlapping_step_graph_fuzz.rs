//! Attack that found nothing (a fuzz): random plans and schedules as
//! overlapping and single step graphs, launched in random patterns, against
//! the host fence. It takes `HOSTILE_SEED` and `HOSTILE_CASES` from the
//! environment.

use crate::support::steps::leftovers;
use crate::support::steps::overlap::*;
use replay_arena::StepError;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// Attack (fuzz): random plans (handoffs, ready points, temporaries,
/// packed or round-robin, G = 1..3), random schedules (runners in any
/// order, some twice, some not at all; consumers that read or write, of
/// any runner, on any lane), random launch patterns over the schedule's
/// lanes and three more streams, 1 to 6 launches, dropped or forgotten:
/// the step graph (single and overlapping) refuses what the host fence
/// refuses, and otherwise leaves the same values and no hazard, also
/// after one more per-runner step.
#[test]
fn fuzz_overlapping_step_graphs_against_the_host_fence() {
    let seed: u64 = std::env::var("HOSTILE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x9e37_79b9_7f4a_7c15);
    let cases: usize = std::env::var("HOSTILE_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(400);
    let mut rng = Rng(seed);
    let (mut compared, mut refused) = (0, 0);
    for case in 0..cases {
        let n = 2 + rng.below(4);
        let lanes = 1 + rng.below(3);
        let sh = Shape {
            runners: (0..n)
                .map(|_| {
                    (
                        rng.chance(50),
                        rng.chance(50),
                        rng.chance(40),
                        1 + rng.below(40) as u64,
                    )
                })
                .collect(),
            generations: 1 + rng.below(3),
            packed: rng.chance(50),
            copies: 4,
        };
        let mut items = Vec::new();
        let mut accs = 0;
        for _ in 0..(1 + rng.below(2 * n + 2)) {
            if rng.chance(55) {
                items.push(P(rng.below(n), rng.below(lanes)));
            } else {
                items.push(C(
                    rng.below(n),
                    rng.below(lanes),
                    rng.chance(30),
                    accs,
                    1 + rng.below(60) as u64,
                ));
                accs += 1;
            }
        }
        if !items.iter().any(|i| matches!(i, P(..))) {
            items.push(P(0, 0));
        }
        // at most two replays of a runner per step (copies: 4 = 2 x 2)
        let mut seen = vec![0; n];
        items.retain(|i| match i {
            P(r, _) => {
                seen[*r] += 1;
                seen[*r] <= 2
            }
            _ => true,
        });
        // Warm-up per runner, sometimes with long consumers still in flight
        // (reading or writing) when the step graph's first launches start.
        let mut warm: Vec<Item> = Vec::new();
        let slow = rng.chance(50);
        for r in 0..n {
            warm.push(P(r, r % lanes));
            if slow {
                warm.push(C(
                    r,
                    rng.below(lanes),
                    rng.chance(30),
                    accs,
                    100 + rng.below(400) as u64,
                ));
                accs += 1;
            }
        }
        let overlapping = rng.chance(70);
        let forget = rng.chance(50);
        let steps = 1 + rng.below(6);
        let pat: Vec<usize> = (0..steps).map(|_| rng.below(lanes + 3)).collect();
        let what = format!("case {case}: {sh:?} items {items:?} overlapping {overlapping} forget {forget} launches {pat:?}");
        let mut fenced = world(&sh, lanes, accs);
        if fenced.per_runner(&warm, 1).is_err() {
            continue; // a warm-up consumer of bytes reused since (G = 1)
        }
        let host = fenced.per_runner(&items, steps.max(2));
        if host.is_err() {
            let mut graphed = world(&sh, lanes, accs);
            graphed.per_runner(&warm, 1).unwrap();
            let x = graphed.sim.new_stream();
            let built = graphed.stepped(&items, 1, overlapping, forget, &|_| x.clone());
            if !matches!(built, Err(StepError::Schedule(_))) {
                // A step that the host fence refuses only from its second
                // step on must be refused too (steady state).
                panic!("{what}: host fence {host:?} but step graph {built:?}");
            }
            refused += 1;
            continue;
        }
        let mut fenced = world(&sh, lanes, accs);
        fenced.per_runner(&warm, 1).unwrap();
        fenced.per_runner(&items, steps).unwrap();
        let mut graphed = world(&sh, lanes, accs);
        graphed.per_runner(&warm, 1).unwrap();
        let all = graphed.launch_streams();
        let built = graphed.stepped(&items, steps, overlapping, forget, &|k| all[pat[k]].clone());
        if let Err(e) = built {
            panic!("{what}: host fence ok but step graph {e:?}");
        }
        let hz = graphed.sim.hazards();
        assert!(hz.is_empty(), "{what}: hazards {hz:?}");
        assert_eq!(graphed.values(), fenced.values(), "{what}: values");
        fenced.per_runner(&items, 1).unwrap();
        graphed.per_runner(&items, 1).unwrap();
        let hz = graphed.sim.hazards();
        assert!(hz.is_empty(), "{what}: hazards after {hz:?}");
        assert_eq!(graphed.values(), fenced.values(), "{what}: values after");
        if !forget {
            let sim = graphed.sim.clone();
            drop(graphed);
            assert_eq!(leftovers(&sim), (0, 0, 0, 0), "{what}: leaks");
        }
        compared += 1;
    }
    eprintln!("compared {compared}, refused {refused}");
    assert!(compared > 100);
}
