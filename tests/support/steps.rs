//! Plans, worlds and schedules for the step-graph, kept-step and fence
//! regressions (`suite/regression/`), all on the `sim` backend.
//!
//! - [`overlap`]: a world of runners (handoffs, ready points, temporaries,
//!   step copies), schedules of replays and consumers run per runner and
//!   as step graphs, and the host-fence comparison.
//! - [`kept`]: plans of one request per runner for kept step graphs.
//! - [`plans`]: small plans the handoff and step holes share.
//! - [`fence`]: one-request plans the fence holes share.
//! - [`plan_runners`], [`allocate_runners`], [`allocate_discovered`]: a
//!   plan (and its allocation) in one call.
//! - [`assert_torn_down`]: what a plan's teardown must leave on a sim.

use replay_arena::backend::Backend;
use replay_arena::sim::AsSpan;
use replay_arena::{Capturing, Discovering, PlacedPolicy, PlanConfig, Planned, Request, RunnerId};

/// `runners` (each with its requests, in recording order) discovered with
/// the default config and planned under `policy`.
pub fn plan_runners<R: IntoIterator<Item = Request>>(
    runners: impl IntoIterator<Item = (RunnerId, R)>,
    policy: impl Into<PlacedPolicy>,
) -> Planned {
    Discovering::from_runners(PlanConfig::new(), runners)
        .unwrap()
        .plan(policy)
        .unwrap()
}

/// [`plan_runners`], allocated on `backend`.
pub fn allocate_runners<B: Backend + Clone, R: IntoIterator<Item = Request>>(
    backend: &B,
    runners: impl IntoIterator<Item = (RunnerId, R)>,
    policy: impl Into<PlacedPolicy>,
) -> Capturing<B> {
    plan_runners(runners, policy)
        .allocate(backend.clone())
        .unwrap()
}

/// `discovering` planned under `policy` and allocated on `backend`.
pub fn allocate_discovered<B: Backend + Clone>(
    backend: &B,
    discovering: Discovering,
    policy: impl Into<PlacedPolicy>,
) -> Capturing<B> {
    discovering
        .plan(policy)
        .unwrap()
        .allocate(backend.clone())
        .unwrap()
}

/// What is left on `sim`: live allocations, live events, graph memory used
/// and reserved.
pub fn leftovers(sim: &replay_arena::sim::Device) -> (usize, usize, u64, u64) {
    let p = sim.graph_memory_in_use().unwrap().unwrap();
    (
        sim.live_allocations(),
        sim.live_events(),
        p.used,
        p.reserved,
    )
}

/// What a plan's teardown must leave on `sim`: no allocation, no event, no
/// graph memory used or reserved, no hazard.
pub fn assert_torn_down(sim: &replay_arena::sim::Device, what: &str) {
    assert_nothing_left(sim, what);
    assert!(sim.hazards().is_empty(), "{what}: {:?}", sim.hazards());
}

/// No allocation, no event and no graph memory used or reserved left on
/// `sim` (hazards are the caller's to judge).
pub fn assert_nothing_left(sim: &replay_arena::sim::Device, what: &str) {
    assert_eq!(sim.live_allocations(), 0, "{what}: allocations left");
    assert_eq!(sim.live_events(), 0, "{what}: events left");
    let p = sim.graph_memory_in_use().unwrap().unwrap();
    assert_eq!((p.used, p.reserved), (0, 0), "{what}: graph memory left");
}

/// Enqueues a copy of `from` into `to` on `s`, taking `ticks`; with
/// `temporary`, through `n` f32s that the graph allocates and frees (the
/// copy into them takes one tick).
pub fn copy_into(
    sim: &replay_arena::sim::Device,
    s: &replay_arena::sim::Stream,
    (from, to): (&impl AsSpan, &impl AsSpan),
    n: usize,
    ticks: u64,
    temporary: bool,
) -> replay_arena::Result<()> {
    use replay_arena::sim::Kernel;
    if !temporary {
        sim.launch(s, Kernel::copy(from, to), ticks)?;
        return Ok(());
    }
    let t = sim.alloc_async(s, n)?;
    sim.launch(s, Kernel::copy(from, &t), 1)?;
    sim.launch(s, Kernel::copy(&t, to), ticks)?;
    sim.free_async(s, &t)?;
    Ok(())
}

/// Enqueues on `s` a fill of `n` f32s that the graph allocates with ones,
/// their copy into `to`, and their free (one tick each).
pub fn ones_through_temporary(
    sim: &replay_arena::sim::Device,
    s: &replay_arena::sim::Stream,
    to: &impl AsSpan,
    n: usize,
) -> replay_arena::Result<()> {
    use replay_arena::sim::Kernel;
    let t = sim.alloc_async(s, n)?;
    sim.launch(s, Kernel::fill(&t, 1.0), 1)?;
    sim.launch(s, Kernel::copy(&t, to), 1)?;
    sim.free_async(s, &t)?;
    Ok(())
}

/// Overlapping step graphs, step copies and graph memory: the world the
/// attacks run in.
pub mod overlap {
    #![allow(clippy::type_complexity)] // attack tables
    use super::{allocate_discovered, plan_runners};

    use replay_arena::backend::{Backend, GraphMemory, Streams};
    use replay_arena::sim;
    use replay_arena::{
        ConsumeError, DType, Discovering, Domain, HandoffId, PlanConfig, Policy, Replayable,
        Request, RunnerId, StepError,
    };

    pub const N: usize = 32;

    pub const OWN: Request = Request::new(Domain::Device, DType::F32, N as u64);

    pub const GRAD: Request = Request::new(Domain::Device, DType::F32, N as u64);

    /// How the world's runners are made.
    #[derive(Clone, Debug)]
    pub struct Shape {
        /// Per runner: (hands off to the next, marks ready, allocates a temporary, duration).
        pub runners: Vec<(bool, bool, bool, u64)>,
        pub generations: usize,
        pub packed: bool,
        pub copies: usize,
    }

    /// One item of a schedule.
    #[derive(Clone, Copy, Debug)]
    pub enum Item {
        /// replay(runner, lane)
        Replay(usize, usize),
        /// consume(runner, lane, writes, accumulator index, duration)
        Consume(usize, usize, bool, usize, u64),
    }

    /// A step builder of `$w` (a [`World`]) with `$items` scheduled on its
    /// lanes, each consumer taking `$slow` times its duration: a
    /// `Result<StepBuilder, StepError>`. A macro, so that the builder borrows
    /// only the world's plan and the rest of the world stays usable.
    macro_rules! step_of {
        ($w:expr, $items:expr, $slow:expr) => {
            'step_of: {
                use $crate::support::steps::overlap::{consume_work, map_consume, Item};
                let mut step = $w.replayable.step();
                for &it in $items {
                    match it {
                        Item::Replay(r, lane) => {
                            let id = replay_arena::RunnerId(r as u32);
                            if let Err(e) = step.replay(id, &$w.lanes[lane]) {
                                break 'step_of Err(e);
                            }
                        }
                        Item::Consume(r, lane, writes, acc, dur) => {
                            macro_rules! work {
                                () => {
                                    consume_work(
                                        &$w.sim,
                                        &$w.accs[acc],
                                        &$w.lane_accs[lane],
                                        &$w.one,
                                        writes,
                                        dur * $slow,
                                    )
                                };
                            }
                            let id = replay_arena::RunnerId(r as u32);
                            let done = if writes {
                                step.consume_mut(id, &$w.lanes[lane], work!()).map(|_| ())
                            } else {
                                step.consume(id, &$w.lanes[lane], work!()).map(|_| ())
                            };
                            if let Err(e) = done {
                                break 'step_of Err(replay_arena::StepError::Schedule(
                                    map_consume(e),
                                ));
                            }
                        }
                    }
                }
                Ok::<_, replay_arena::StepError>(step)
            }
        };
    }
    #[allow(unused_imports)] // binaries without the regressions
    pub(crate) use step_of;

    pub struct World {
        pub sim: sim::Device,
        pub replayable: Replayable<sim::Device>,
        pub lanes: Vec<sim::Stream>,
        pub sinks: Vec<sim::HostBuffer>,
        pub accs: Vec<sim::HostBuffer>,
        /// Per lane: a program buffer every consumer on that lane adds into
        /// (only stream order of the lane keeps it race-free).
        pub lane_accs: Vec<sim::HostBuffer>,
        pub one: sim::HostBuffer,
        pub _keep: Vec<sim::HostBuffer>,
    }

    pub fn world(shape: &Shape, lanes: usize, accs: usize) -> World {
        let n = shape.runners.len();
        let mut d = Discovering::new(PlanConfig::new());
        let mut handoffs: Vec<Option<HandoffId>> = vec![None; n];
        for r in 0..n {
            let mut armed = d.arm(RunnerId(r as u32)).unwrap();
            armed.record(OWN).unwrap();
            if r > 0 {
                if let Some(h) = handoffs[r - 1] {
                    armed.receive(h).unwrap();
                }
            }
            if shape.runners[r].0 && r + 1 < n {
                handoffs[r] = Some(armed.hand_off(GRAD).unwrap());
            }
        }
        let sim = sim::Device::new();
        let lanes: Vec<sim::Stream> = (0..lanes).map(|_| sim.new_stream()).collect();
        let one = sim.alloc_f32(N).unwrap();
        sim.write_f32(&one, &[1.0; N]).unwrap();
        let counts: Vec<sim::HostBuffer> = (0..n).map(|_| sim.alloc_f32(N).unwrap()).collect();
        let sinks: Vec<sim::HostBuffer> = (0..n).map(|_| sim.alloc_f32(N).unwrap()).collect();
        let accs_v: Vec<sim::HostBuffer> = (0..accs).map(|_| sim.alloc_f32(N).unwrap()).collect();
        let lane_accs: Vec<sim::HostBuffer> = (0..lanes.len())
            .map(|_| sim.alloc_f32(N).unwrap())
            .collect();
        let policy = Policy::Generations(shape.generations);
        let strategy = if shape.packed {
            policy.packed()
        } else {
            policy.round_robin()
        };
        let mut capturing = allocate_discovered(&sim, d, strategy);
        for r in 0..n {
            let (_, ready, temporary, duration) = shape.runners[r];
            let cap = capturing.capture(RunnerId(r as u32)).unwrap();
            let own = cap.take(OWN).unwrap();
            let input = (r > 0)
                .then(|| handoffs[r - 1])
                .flatten()
                .map(|h| cap.receive(h).unwrap());
            let output = handoffs[r].map(|h| (h, cap.hand_off(h).unwrap()));
            let (count, sink) = (&counts[r], &sinks[r]);
            cap.step_copies(shape.copies);
            cap.stream_capture_repeatable(&lanes[0], |s| {
                sim.launch(s, sim::Kernel::add(&one, count), 1)?;
                if let Some(input) = &input {
                    sim.launch(s, sim::Kernel::add(input, sink), duration)?;
                }
                if let Some((h, out)) = &output {
                    sim.launch(s, sim::Kernel::copy(count, out), 2)?;
                    if ready {
                        cap.ready(*h, s)?;
                    }
                }
                super::copy_into(&sim, s, (count, &own), N, duration, temporary)
            })
            .unwrap();
            cap.finish().unwrap();
        }
        World {
            replayable: capturing.seal().unwrap(),
            sim,
            lanes,
            sinks,
            accs: accs_v,
            lane_accs,
            one,
            _keep: counts,
        }
    }

    pub fn consume_work<'a, A: replay_arena::Access>(
        sim: &'a sim::Device,
        acc: &'a sim::HostBuffer,
        shared: &'a sim::HostBuffer,
        one: &'a sim::HostBuffer,
        writes: bool,
        duration: u64,
    ) -> impl FnOnce(&sim::Stream, &[replay_arena::View<'_, A>]) -> replay_arena::Result<()> + 'a
    {
        move |st, v| {
            if writes {
                // every view it is handed (a handed-off or received view too)
                for x in v {
                    sim.launch(st, sim::Kernel::add(one, x), 1)?;
                }
            }
            sim.launch(st, sim::Kernel::add(&v[0], acc), duration)?;
            sim.launch(st, sim::Kernel::add(&v[0], shared), 1)?;
            Ok(())
        }
    }

    pub fn map_consume(e: ConsumeError<replay_arena::Error>) -> replay_arena::ScheduleError {
        match e.into_check() {
            Ok(check) => check.into(),
            Err(w) => panic!("consumer work failed: {w}"),
        }
    }

    impl World {
        pub fn per_runner(
            &mut self,
            items: &[Item],
            steps: usize,
        ) -> Result<(), replay_arena::ScheduleError> {
            for _ in 0..steps {
                for &it in items {
                    match it {
                        Item::Replay(r, lane) => self
                            .replayable
                            .replay(RunnerId(r as u32), &self.lanes[lane])?,
                        Item::Consume(r, lane, writes, acc, dur) => {
                            macro_rules! work {
                                () => {
                                    consume_work(
                                        &self.sim,
                                        &self.accs[acc],
                                        &self.lane_accs[lane],
                                        &self.one,
                                        writes,
                                        dur,
                                    )
                                };
                            }
                            let id = RunnerId(r as u32);
                            let done = if writes {
                                self.replayable
                                    .consume_mut(id, &self.lanes[lane], work!())
                                    .map(|_| ())
                            } else {
                                self.replayable
                                    .consume(id, &self.lanes[lane], work!())
                                    .map(|_| ())
                            };
                            done.map_err(map_consume)?;
                        }
                    }
                }
            }
            Ok(())
        }

        /// Builds the step (overlapping or not), launches it `steps` times on
        /// `launch(k)`, then drops or forgets it.
        pub fn stepped(
            &mut self,
            items: &[Item],
            steps: usize,
            overlapping: bool,
            forget: bool,
            launch: &dyn Fn(usize) -> sim::Stream,
        ) -> Result<(), StepError> {
            let step = step_of!(self, items, 1)?;
            let mut graph = if overlapping {
                step.build_overlapping()?
            } else {
                step.build()?
            };
            for k in 0..steps {
                graph.launch(&launch(k)).unwrap();
            }
            if forget {
                std::mem::forget(graph);
            }
            Ok(())
        }

        /// The streams a launch pattern indexes: the lanes, then three more.
        pub fn launch_streams(&self) -> Vec<sim::Stream> {
            let extra = (0..3).map(|_| self.sim.new_stream());
            self.lanes.iter().cloned().chain(extra).collect()
        }

        pub fn values(&self) -> Vec<Vec<f32>> {
            let mut out: Vec<Vec<f32>> = self
                .sinks
                .iter()
                .chain(&self.accs)
                .chain(&self.lane_accs)
                .map(|b| self.sim.read_f32(b).unwrap())
                .collect();
            for r in 0..self.sinks.len() {
                let v = self.replayable.views(RunnerId(r as u32)).unwrap()[0];
                out.push(self.sim.read_f32(&v).unwrap());
            }
            out
        }

        pub fn pool(&self) -> GraphMemory {
            self.sim.graph_memory_in_use().unwrap().unwrap()
        }
    }

    pub fn shape(n: usize, g: usize, handoffs: bool, temps: bool, copies: usize) -> Shape {
        Shape {
            runners: (0..n)
                .map(|r| {
                    (
                        handoffs,
                        handoffs,
                        temps && r % 2 == 1,
                        10 + 7 * (r as u64 % 3),
                    )
                })
                .collect(),
            generations: g,
            packed: false,
            copies,
        }
    }

    /// Runs `items` per runner and as a step graph in the same world shape and
    /// compares values and hazards (then one more per-runner step on both).
    /// `launch(k)` names launch k's stream: below `lanes` a lane of the
    /// schedule, else one of three extra streams.
    #[allow(clippy::too_many_arguments)]
    pub fn compare(
        sh: &Shape,
        lanes: usize,
        accs: usize,
        items: &[Item],
        steps: usize,
        overlapping: bool,
        forget: bool,
        launch: &dyn Fn(usize) -> usize,
        what: &str,
    ) {
        let warm: Vec<Item> = (0..sh.runners.len()).map(|r| P(r, r % lanes)).collect();
        compare_w(
            sh,
            lanes,
            accs,
            &warm,
            items,
            steps,
            overlapping,
            forget,
            launch,
            what,
        )
    }

    #[allow(clippy::too_many_arguments)]
    pub fn compare_w(
        sh: &Shape,
        lanes: usize,
        accs: usize,
        warm: &[Item],
        items: &[Item],
        steps: usize,
        overlapping: bool,
        forget: bool,
        launch: &dyn Fn(usize) -> usize,
        what: &str,
    ) {
        let mut fenced = world(sh, lanes, accs);
        fenced.per_runner(warm, 1).unwrap();
        fenced.per_runner(items, steps).unwrap();
        let mut graphed = world(sh, lanes, accs);
        graphed.per_runner(warm, 1).unwrap();
        let all = graphed.launch_streams();
        let l = |k: usize| all[launch(k) % all.len()].clone();
        graphed
            .stepped(items, steps, overlapping, forget, &l)
            .unwrap();
        assert!(
            fenced.sim.hazards().is_empty(),
            "{what} host: {:?}",
            fenced.sim.hazards()
        );
        let hz = graphed.sim.hazards();
        assert!(hz.is_empty(), "{what}: step graph hazards: {hz:?}");
        assert_eq!(graphed.values(), fenced.values(), "{what}: values");
        fenced.per_runner(items, 1).unwrap();
        graphed.per_runner(items, 1).unwrap();
        let hz = graphed.sim.hazards();
        assert!(hz.is_empty(), "{what}: after the step graph: {hz:?}");
        assert_eq!(graphed.values(), fenced.values(), "{what}: values after");
    }

    pub use Item::{Consume as C, Replay as P};

    /// Launch patterns: index functions over (lanes.., extra0, extra1, extra2).
    pub fn patterns(lanes: usize) -> Vec<(&'static str, Box<dyn Fn(usize) -> usize>)> {
        vec![
            ("one extra stream", Box::new(move |_| lanes)),
            (
                "two extra streams in turn",
                Box::new(move |k| lanes + k % 2),
            ),
            (
                "three extra streams in turn",
                Box::new(move |k| lanes + k % 3),
            ),
            ("lane 0 of the schedule", Box::new(|_| 0)),
            (
                "lanes of the schedule in turn",
                Box::new(move |k| k % lanes),
            ),
            (
                "last lane then extra",
                Box::new(move |k| if k % 3 == 0 { lanes - 1 } else { lanes + k % 2 }),
            ),
            (
                "odd: e0 e0 e1 e0 e2 e1 ...",
                Box::new(move |k| lanes + [0, 0, 1, 0, 2, 1, 1][k % 7]),
            ),
        ]
    }

    pub fn schedules() -> Vec<(&'static str, Shape, usize, usize, Vec<Item>)> {
        vec![
            (
                "chain with ready points, consumers on a side lane",
                shape(4, 2, true, false, 2),
                3,
                4,
                vec![
                    P(0, 0),
                    C(0, 2, false, 0, 40),
                    P(1, 1),
                    C(1, 2, false, 1, 40),
                    P(2, 0),
                    C(2, 2, false, 2, 40),
                    P(3, 1),
                    C(3, 2, false, 3, 40),
                ],
            ),
            (
                "consumers that write, of a runner not replayed in the step",
                shape(3, 3, false, false, 2),
                3,
                3,
                vec![
                    P(1, 0),
                    C(0, 1, true, 0, 30),
                    C(0, 2, false, 1, 50),
                    C(0, 1, true, 2, 5),
                    P(2, 1),
                ],
            ),
            (
                "several consumers on lane 0 (the replays' lane) writing one program buffer",
                shape(4, 2, false, false, 2),
                2,
                4,
                vec![
                    P(0, 1),
                    C(0, 0, false, 0, 30),
                    P(1, 1),
                    C(1, 0, true, 1, 30),
                    P(2, 1),
                    C(2, 0, false, 2, 30),
                    P(3, 1),
                    C(3, 0, true, 3, 3),
                ],
            ),
            (
                "temporaries moved in, two copies",
                shape(4, 2, true, true, 2),
                3,
                4,
                vec![
                    P(0, 0),
                    C(0, 2, false, 0, 40),
                    P(1, 1),
                    C(1, 2, true, 1, 40),
                    P(2, 0),
                    C(2, 1, false, 2, 4),
                    P(3, 1),
                    C(3, 2, false, 3, 40),
                ],
            ),
            (
                "a runner replayed twice in the step on two lanes, consumers between",
                shape(3, 2, false, true, 4),
                3,
                4,
                vec![
                    P(1, 0),
                    C(1, 2, false, 0, 50),
                    P(1, 1),
                    C(1, 2, true, 1, 20),
                    P(0, 2),
                    C(0, 0, false, 2, 5),
                    P(2, 1),
                    C(2, 0, false, 3, 70),
                ],
            ),
            (
                "G = 1 everything on alternating lanes",
                shape(3, 1, true, false, 2),
                2,
                3,
                vec![
                    P(0, 0),
                    C(0, 1, false, 0, 20),
                    P(1, 1),
                    C(1, 0, true, 1, 20),
                    P(2, 0),
                    C(2, 1, false, 2, 20),
                ],
            ),
            (
                "packed G = 2",
                Shape {
                    packed: true,
                    ..shape(5, 2, true, true, 2)
                },
                3,
                5,
                vec![
                    P(0, 0),
                    P(1, 1),
                    C(0, 2, false, 0, 60),
                    P(2, 0),
                    C(1, 2, true, 1, 10),
                    P(3, 1),
                    C(2, 0, false, 2, 5),
                    P(4, 0),
                    C(3, 2, false, 3, 60),
                    C(4, 1, true, 4, 9),
                ],
            ),
        ]
    }

    /// Program buffers a world allocates: one, counts, sinks, accs, lane accs.
    pub fn program_buffers(runners: usize, lanes: usize, accs: usize) -> usize {
        1 + 2 * runners + accs + lanes
    }

    pub fn four_chain_items() -> Vec<Item> {
        vec![
            P(0, 0),
            C(0, 2, false, 0, 40),
            P(1, 1),
            C(1, 2, true, 1, 40),
            P(2, 0),
            C(2, 2, false, 2, 40),
            P(3, 1),
            C(3, 2, false, 3, 40),
        ]
    }

    /// A one-runner plan (plus a handoff reader when `handoff`), for capture attacks.
    pub struct Cap1 {
        pub sim: sim::Device,
        pub s: sim::Stream,
        pub other: sim::Stream,
        pub h: Option<HandoffId>,
        pub capturing: replay_arena::Capturing<sim::Device>,
    }

    pub fn cap1(handoff: bool) -> Cap1 {
        let mut d = Discovering::new(PlanConfig::new());
        let h = {
            let mut armed = d.arm(RunnerId(0)).unwrap();
            armed.record(OWN).unwrap();
            handoff.then(|| armed.hand_off(GRAD).unwrap())
        };
        if let Some(h) = h {
            let mut armed = d.arm(RunnerId(1)).unwrap();
            armed.record(OWN).unwrap();
            armed.receive(h).unwrap();
        }
        let sim = sim::Device::new();
        let (s, other) = (sim.new_stream(), sim.new_stream());
        let capturing = allocate_discovered(&sim, d, Policy::Generations(1));
        Cap1 {
            sim,
            s,
            other,
            h,
            capturing,
        }
    }

    pub fn test_err(why: &str) -> replay_arena::Error {
        replay_arena::Error::Backend(replay_arena::BackendError::Refused {
            call: "test",
            reason: why.into(),
        })
    }

    /// After a failed repeatable capture of runner 0: the stream is free, the
    /// runner is failed, seal refuses, replan gives everything back.
    pub fn after_failure(c: Cap1, what: &str) {
        let Cap1 {
            sim,
            s,
            other,
            capturing,
            ..
        } = c;
        assert!(
            !sim.is_capturing(&s).unwrap(),
            "{what}: stream left capturing"
        );
        assert!(
            !sim.is_capturing(&other).unwrap(),
            "{what}: other stream left capturing"
        );
        let sealed = capturing.seal();
        let capturing = match sealed {
            Ok(_) => panic!("{what}: sealed with a failed runner"),
            Err(e) => e.into_capturing(),
        };
        drop(capturing.replan());
        super::assert_torn_down(&sim, what);
    }

    pub fn with_temporary(
        sim: &sim::Device,
        s: &sim::Stream,
        v: &replay_arena::View<'_>,
    ) -> replay_arena::Result<()> {
        super::ones_through_temporary(sim, s, v, N)
    }

    /// Runs `inside` while another plan captures on `stream` (so anything
    /// enqueued on `stream` meanwhile goes into that plan's graph instead).
    pub fn while_captured(
        sim: &sim::Device,
        stream: &sim::Stream,
        inside: impl FnOnce(&sim::Stream),
    ) {
        let planned = plan_runners([(RunnerId(7), [OWN])], Policy::Generations(1));
        let mut other = planned.allocate(sim.clone()).unwrap();
        crate::support::capture_view(&mut other, RunnerId(7), OWN, stream, |s, v| {
            inside(s);
            sim.launch(s, sim::Kernel::fill(&v, 2.0), 1)
        });
    }
}

/// Kept step graphs: runners of one 64-element request each.
pub mod kept {
    use super::plan_runners;
    use replay_arena::backend::Streams;

    use replay_arena::sim;

    use replay_arena::{DType, Domain, Policy, Replayable, Request, RunnerId};

    pub const REQ: Request = Request::new(Domain::Device, DType::F32, 64);

    pub struct Setup {
        pub sim: sim::Device,
        pub replayable: Replayable<sim::Device>,
        pub s: Vec<sim::Stream>,
    }

    /// `n` runners, one generation each shared (`generations` < n: runners
    /// share bytes); runner r fills its view with r+1 for `dur` ticks.
    pub fn setup(n: u32, generations: usize, dur: u64) -> Setup {
        let rs = (0..n).map(|r| (RunnerId(r), [REQ]));
        let planned = plan_runners(rs, Policy::Generations(generations));
        let sim = sim::Device::new();
        let s: Vec<sim::Stream> = (0..6).map(|_| sim.new_stream()).collect();
        let capturing = planned.allocate(sim.clone()).unwrap();
        let replayable = crate::support::seal_each(capturing, n, REQ, &s[0], |r, st, v| {
            sim.launch(st, sim::Kernel::fill(v, (r + 1) as f32), dur)
        });
        Setup { replayable, sim, s }
    }

    pub fn kept_all(x: &mut Setup, lane: usize) -> replay_arena::KeptStep<sim::Device> {
        let n = x.replayable.plan().runners().count() as u32;
        let mut step = x.replayable.step();
        for r in 0..n {
            step.replay(RunnerId(r), &x.s[lane]).unwrap();
        }
        step.build().unwrap().keep()
    }

    #[derive(Clone, Copy, Debug)]
    pub enum It {
        R(u32, usize),
        C(u32, usize, usize),
    }

    pub struct World {
        pub sim: sim::Device,
        pub rep: Replayable<sim::Device>,
        pub lanes: Vec<sim::Stream>,
        pub counts: Vec<sim::HostBuffer>,
        pub accs: Vec<sim::HostBuffer>,
        pub _one: sim::HostBuffer,
    }

    pub fn world(n: u32, g: usize, durs: &[u64]) -> World {
        let rs = (0..n).map(|r| (RunnerId(r), [REQ]));
        let planned = plan_runners(rs, Policy::Generations(g));
        world_of(planned, n, |capturing, sim, lanes, one, counts| {
            for r in 0..n {
                let cap = capturing.capture(RunnerId(r)).unwrap();
                let v = cap.take(REQ).unwrap();
                let c = &counts[r as usize];
                let d = durs[r as usize % durs.len()];
                record_and_finish!(cap, &lanes[0], |st| {
                    sim.launch(st, sim::Kernel::add(one, c), 1)?;
                    sim.launch(st, sim::Kernel::copy(c, &v), d)
                });
            }
        })
    }

    /// A [`World`] of `planned` on a new `sim`: five lanes, a buffer of
    /// ones, `n` counts and 20 accumulators are made, the plan is
    /// allocated, `capture(capturing, sim, lanes, one, counts)` captures
    /// its runners, and it is sealed.
    pub fn world_of(
        planned: replay_arena::Planned,
        n: u32,
        capture: impl FnOnce(
            &mut replay_arena::Capturing<sim::Device>,
            &sim::Device,
            &[sim::Stream],
            &sim::HostBuffer,
            &[sim::HostBuffer],
        ),
    ) -> World {
        let sim = sim::Device::new();
        let lanes: Vec<sim::Stream> = (0..5).map(|_| sim.new_stream()).collect();
        let one = sim.alloc_f32(64).unwrap();
        sim.write_f32(&one, &[1.0; 64]).unwrap();
        let counts: Vec<_> = (0..n).map(|_| sim.alloc_f32(64).unwrap()).collect();
        let accs: Vec<_> = (0..20).map(|_| sim.alloc_f32(64).unwrap()).collect();
        let mut capturing = planned.allocate(sim.clone()).unwrap();
        capture(&mut capturing, &sim, &lanes, &one, &counts);
        World {
            rep: capturing.seal().unwrap(),
            sim,
            lanes,
            counts,
            accs,
            _one: one,
        }
    }

    pub fn run_item(w: &mut World, it: It) -> Result<(), String> {
        match it {
            It::R(r, l) => w
                .rep
                .replay(RunnerId(r), &w.lanes[l])
                .map_err(|e| format!("{e:?}")),
            It::C(r, l, a) => {
                let (sim, acc) = (w.sim.clone(), &w.accs[a]);
                w.rep
                    .consume(RunnerId(r), &w.lanes[l], |st, v| {
                        sim.launch(st, sim::Kernel::add(&v[0], acc), 7)
                    })
                    .map_err(|e| format!("{e:?}"))
            }
        }
    }

    pub fn build_kept(
        w: &mut World,
        items: &[It],
        overlapping: bool,
    ) -> Option<replay_arena::KeptStep<sim::Device>> {
        let mut step = w.rep.step();
        for &it in items {
            match it {
                It::R(r, l) => {
                    step.replay(RunnerId(r), &w.lanes[l]).unwrap();
                }
                It::C(r, l, a) => {
                    let (sim, acc) = (w.sim.clone(), &w.accs[a]);
                    step.consume(RunnerId(r), &w.lanes[l], |st, v| {
                        sim.launch(st, sim::Kernel::add(&v[0], acc), 7)
                    })
                    .unwrap();
                }
            }
        }
        let g = if overlapping {
            step.build_overlapping()
        } else {
            step.build()
        };
        g.ok().map(|g| g.keep())
    }

    /// A linear congruential generator for the kept-step fuzzers.
    pub struct Lcg(pub u64);

    impl Lcg {
        /// The next number below `m`.
        pub fn below(&mut self, m: u64) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (self.0 >> 33) % m
        }
    }

    /// `a` (kept steps) and `b` (the same per runner) after both
    /// synchronized: no hazard on either, the same counts and accumulators.
    pub fn assert_same_worlds(a: &World, b: &World, seed: u64, log: &[String]) {
        a.sim.synchronize().unwrap();
        b.sim.synchronize().unwrap();
        let ha = a.sim.hazards();
        assert!(ha.is_empty(), "seed {seed}: hazards {ha:?}; {log:?}");
        assert!(b.sim.hazards().is_empty());
        for (x, y) in a.counts.iter().zip(&b.counts) {
            assert_eq!(
                a.sim.read_f32(x).unwrap(),
                b.sim.read_f32(y).unwrap(),
                "seed {seed} counts; {log:?}"
            );
        }
        for (i, (x, y)) in a.accs.iter().zip(&b.accs).enumerate() {
            assert_eq!(
                a.sim.read_f32(x).unwrap(),
                b.sim.read_f32(y).unwrap(),
                "seed {seed} acc {i}; {log:?}"
            );
        }
    }
}

/// Plans the handoff and step holes share.
pub mod plans {

    use replay_arena::sim;
    use replay_arena::{
        DType, Discovering, Domain, PlanConfig, Policy, Replayable, Request, RunnerId,
    };

    pub type R<T = ()> = Result<T, Box<dyn std::error::Error>>;

    pub fn req(n: u64) -> Request {
        Request::new(Domain::Device, DType::F32, n)
    }

    /// A runner that requests nothing but allocates a temporary in its graph.
    pub fn temporaries_plan(sim: &sim::Device, s: &sim::Stream) -> R<Replayable<sim::Device>> {
        let mut d = Discovering::new(PlanConfig::new());
        d.arm(RunnerId(0))?.record(req(64))?;
        d.arm(RunnerId(1))?;
        let mut cap = d.plan(Policy::Generations(1))?.allocate(sim.clone())?;
        {
            let c = cap.capture(RunnerId(0))?;
            let v = c.take(req(64))?;
            c.stream_capture(s, |s| sim.launch(s, sim::Kernel::fill(&v, 1.0), 5))?;
            c.finish()?;
        }
        let c = cap.capture(RunnerId(1))?;
        c.stream_capture(s, |s| {
            let t = sim.alloc_async(s, 64)?;
            sim.launch(s, sim::Kernel::fill(&t, 5.0), 50)?;
            sim.free_async(s, &t)
        })?;
        c.finish()?;
        Ok(cap.seal()?)
    }
}

/// One-request plans the fence holes share.
pub mod fence {
    use super::allocate_runners;

    use replay_arena::sim;
    use replay_arena::{Capturing, DType, Domain, Policy, Replayable, Request, RunnerId};

    /// One runner recording `requests`, planned in one generation and
    /// allocated on `sim`.
    pub fn on_sim(sim: &sim::Device, requests: &[Request]) -> Capturing<sim::Device> {
        allocate_runners(
            sim,
            [(RunnerId(0), requests.iter().copied())],
            Policy::Generations(1),
        )
    }

    /// 64 f32s: one device alignment unit.
    pub const F32_64: Request = Request::new(Domain::Device, DType::F32, 64);

    /// Runner `r` records `runners[r]`; planned under `policy` and allocated on
    /// a fresh sim, with one stream.
    pub fn allocated(
        runners: &[&[Request]],
        policy: Policy,
    ) -> (sim::Device, sim::Stream, Capturing<sim::Device>) {
        let runners = runners
            .iter()
            .enumerate()
            .map(|(r, requests)| (RunnerId(r as u32), requests.iter().copied()));
        let sim = sim::Device::new();
        let stream = sim.new_stream();
        let capturing = allocate_runners(&sim, runners, policy);
        (sim, stream, capturing)
    }

    /// Runners `0..n`, each filling its one view with `runner + 5` in `ticks`;
    /// sealed under `policy`.
    pub fn sealed(n: u32, policy: Policy, ticks: u64) -> (sim::Device, Replayable<sim::Device>) {
        let runners = vec![&[F32_64][..]; n as usize];
        let (sim, stream, capturing) = allocated(&runners, policy);
        let replayable = crate::support::seal_each(capturing, n, F32_64, &stream, |r, s, view| {
            sim.launch(s, sim::Kernel::fill(view, r as f32 + 5.0), ticks)
        });
        (sim, replayable)
    }

    /// One runner filling its view with `value` on `stream`, sealed.
    pub fn one_runner(
        sim: &sim::Device,
        stream: &sim::Stream,
        value: f32,
    ) -> Replayable<sim::Device> {
        crate::support::seal_each(on_sim(sim, &[F32_64]), 1, F32_64, stream, |_, s, v| {
            sim.launch(s, sim::Kernel::fill(v, value), 10)
        })
    }
}
