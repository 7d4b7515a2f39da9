//! Step graphs on the `sim` model: one step's schedule compiled into one
//! graph. For random plans and schedules (placements, generations, streams,
//! consumers, handoffs, ready points, and runners whose graphs allocate
//! temporaries, moved in as step copies) the step graph never lets two
//! users of the same bytes overlap, leaves every value the per-runner
//! fenced replay of the same schedule leaves, refuses exactly the
//! schedules the host fence refuses, and hands the plan back consistent.

use crate::support::steps::overlap::{world, Shape, World};
use proptest::prelude::*;
use replay_arena::sim;
use replay_arena::{ReplayError, Replayable, RunnerId, StepError};

/// One random step.
#[derive(Debug, Clone)]
struct Schedule {
    /// Per runner in capture order: (hands off to the next runner, marks it
    /// ready, its lane, its duration, allocates a temporary).
    runners: Vec<(bool, bool, usize, u64, bool)>,
    /// Consumers: (runner, placed after this many more replays, lane,
    /// duration, writes).
    consumers: Vec<(usize, usize, usize, u64, bool)>,
    generations: usize,
    packed: bool,
}

fn schedule() -> impl proptest::strategy::Strategy<Value = Schedule> {
    (2usize..7, 1usize..4, any::<bool>()).prop_flat_map(|(n, g, packed)| {
        let runner = (
            any::<bool>(),
            any::<bool>(),
            0usize..3,
            1u64..40,
            any::<bool>(),
        );
        let consumer = (
            0..n,
            0usize..3,
            0usize..3,
            1u64..60,
            prop::bool::weighted(0.2),
        );
        (
            prop::collection::vec(runner, n),
            prop::collection::vec(consumer, 0..6),
        )
            .prop_map(move |(runners, consumers)| Schedule {
                runners,
                consumers,
                generations: g,
                packed,
            })
    })
}

/// The plan of a schedule, captured on `sim` (the [`world`] of its runners,
/// three lanes, an accumulator per consumer): runner `r` bumps its counter
/// (a program buffer) and copies it into its own view and into the
/// gradient it hands off (if any); a reader adds what it receives into its
/// sink. Consumers add a runner's view into their own accumulator.
struct Setup {
    sim: sim::Device,
    replayable: Replayable<sim::Device>,
    lanes: [sim::Stream; 3],
    /// Launch streams; overlapping step graphs alternate between them.
    launch: [sim::Stream; 2],
    sinks: Vec<sim::HostBuffer>,
    accs: Vec<sim::HostBuffer>,
    /// Per lane: what every consumer on it also adds into (a program
    /// buffer that only the lane's stream order keeps race-free).
    lane_accs: Vec<sim::HostBuffer>,
    _keep: Vec<sim::HostBuffer>,
}

fn setup(w: &Schedule) -> Setup {
    let shape = Shape {
        runners: (w.runners.iter())
            .map(|&(hands_off, ready, _, duration, temporary)| {
                (hands_off, ready, temporary, duration)
            })
            .collect(),
        generations: w.generations,
        packed: w.packed,
        // Two copies: enough for an overlapping step graph.
        copies: 2,
    };
    let World {
        sim,
        replayable,
        lanes,
        sinks,
        accs,
        lane_accs,
        one,
        _keep: mut keep,
    } = world(&shape, 3, w.consumers.len());
    let launch = [sim.new_stream(), sim.new_stream()];
    keep.push(one);
    Setup {
        lanes: lanes.try_into().unwrap(),
        replayable,
        sim,
        launch,
        sinks,
        accs,
        lane_accs,
        _keep: keep,
    }
}

/// The schedule's items in order: replays in capture order, each consumer
/// after the replay of its runner and `delay` more.
fn items(w: &Schedule) -> Vec<(bool, usize)> {
    let n = w.runners.len();
    let mut out = Vec::new();
    for r in 0..n {
        out.push((true, r));
        for (c, &(runner, delay, ..)) in w.consumers.iter().enumerate() {
            if (runner + delay).min(n - 1) == r {
                out.push((false, c));
            }
        }
    }
    out
}

/// A consumer's work: adds the first view it is handed into its own
/// accumulator (for `duration` ticks) and into its lane's.
fn consumer_work<'a, A: replay_arena::Access>(
    sim: &'a sim::Device,
    acc: &'a sim::HostBuffer,
    shared: &'a sim::HostBuffer,
    duration: u64,
) -> impl FnOnce(&sim::Stream, &[replay_arena::View<'_, A>]) -> Result<(), replay_arena::BackendError> + 'a
{
    move |st, v| {
        sim.launch(st, sim::Kernel::add(&v[0], acc), duration)?;
        sim.launch(st, sim::Kernel::add(&v[0], shared), 1)
    }
}

/// Runs `steps` steps per runner through the host fence.
fn per_runner(
    s: &mut Setup,
    w: &Schedule,
    steps: usize,
) -> Result<(), replay_arena::ScheduleError> {
    for _ in 0..steps {
        for &(replay, i) in &items(w) {
            if replay {
                let lane = &s.lanes[w.runners[i].2];
                s.replayable.replay(RunnerId(i as u32), lane)?;
            } else {
                let (runner, _, lane, duration, writes) = w.consumers[i];
                let (sim, acc, shared) = (&s.sim, &s.accs[i], &s.lane_accs[lane]);
                let lane = &s.lanes[lane];
                let r = RunnerId(runner as u32);
                let done = if writes {
                    s.replayable
                        .consume_mut(r, lane, consumer_work(sim, acc, shared, duration))
                } else {
                    s.replayable
                        .consume(r, lane, consumer_work(sim, acc, shared, duration))
                };
                done.map_err(|e| match e.into_check() {
                    Ok(check) => check,
                    Err(w) => panic!("{w}"),
                })?;
            }
        }
    }
    Ok(())
}

/// Builds the step graph of the schedule (with `overlapping`, the two
/// graphs launched in turn, alternating launch streams) and launches it
/// `steps` times; then drops it, or with `forget` leaks it (`mem::forget`
/// is safe: the plan must be just as safe to use afterwards).
fn stepped(
    s: &mut Setup,
    w: &Schedule,
    steps: usize,
    forget: bool,
    overlapping: bool,
) -> Result<(usize, usize), StepError> {
    let mut step = s.replayable.step();
    for &(replay, i) in &items(w) {
        if replay {
            step.replay(RunnerId(i as u32), &s.lanes[w.runners[i].2])?;
        } else {
            let (runner, _, lane, duration, writes) = w.consumers[i];
            let (sim, acc, shared) = (&s.sim, &s.accs[i], &s.lane_accs[lane]);
            let r = RunnerId(runner as u32);
            let done = if writes {
                step.consume_mut(r, &s.lanes[lane], consumer_work(sim, acc, shared, duration))
                    .map(|_| ())
            } else {
                step.consume(r, &s.lanes[lane], consumer_work(sim, acc, shared, duration))
                    .map(|_| ())
            };
            done.map_err(|e| match e.into_check() {
                Ok(check) => StepError::Schedule(check.into()),
                Err(w) => panic!("{w}"),
            })?;
        }
    }
    let mut graph = if overlapping {
        step.build_overlapping()?
    } else {
        step.build()?
    };
    assert_eq!(graph.is_overlapping(), overlapping);
    for k in 0..steps {
        let launch = if overlapping {
            &s.launch[k % 2]
        } else {
            &s.launch[0]
        };
        graph.launch(launch).unwrap();
    }
    let shape = (graph.nodes(), graph.edges());
    if forget {
        std::mem::forget(graph);
    }
    Ok(shape)
}

fn values(s: &Setup) -> Vec<Vec<f32>> {
    s.sinks
        .iter()
        .chain(&s.accs)
        .chain(&s.lane_accs)
        .map(|b| s.sim.read_f32(b).unwrap())
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The step graph against the host fence on the same schedule: the
    /// same refusals, the same values, no overlap; and the plan goes on
    /// per runner afterwards without overlap either, whether the step
    /// graph was dropped or forgotten.
    #[test]
    fn a_step_graph_is_the_host_fence_compiled(
        w in schedule(),
        forget in any::<bool>(),
        overlapping in any::<bool>(),
    ) {
        let steps = 5;
        let mut fenced = setup(&w);
        let host = per_runner(&mut fenced, &w, steps);
        let mut graphed = setup(&w);
        let built = stepped(&mut graphed, &w, steps, forget, overlapping);
        match (&host, &built) {
            (Ok(()), Ok(_)) => {}
            (Err(_), Err(StepError::Schedule(_))) => return Ok(()),
            _ => prop_assert!(false, "host fence {:?} but step graph {:?}", host, built),
        }
        prop_assert!(fenced.sim.hazards().is_empty(), "host fence: {:?}", fenced.sim.hazards());
        let hazards = graphed.sim.hazards();
        prop_assert!(hazards.is_empty(), "step graph: {:?}", hazards);
        prop_assert_eq!(values(&graphed), values(&fenced));
        // Per runner again, after the step graph: still exact, still safe.
        per_runner(&mut graphed, &w, 1).unwrap();
        per_runner(&mut fenced, &w, 1).unwrap();
        prop_assert!(graphed.sim.hazards().is_empty(), "{:?}", graphed.sim.hazards());
        prop_assert_eq!(values(&graphed), values(&fenced));
    }
}

/// Four runners in two generations on two streams, a consumer of each on a
/// third: the chain the per-module backward makes.
fn four_with_consumers() -> Schedule {
    Schedule {
        runners: (0..4).map(|r| (true, true, r % 2, 20, false)).collect(),
        consumers: (0..4).map(|r| (r, 0, 2, 30, false)).collect(),
        generations: 2,
        packed: false,
    }
}

#[test]
fn one_launch_runs_the_step_and_overlaps_what_the_fence_overlaps() {
    let w = four_with_consumers();
    let mut fenced = setup(&w);
    per_runner(&mut fenced, &w, 1).unwrap();
    fenced.replayable.synchronize().unwrap();
    let mut graphed = setup(&w);
    let (nodes, edges) = stepped(&mut graphed, &w, 1, false, false).unwrap();
    // Four writers split at their ready points (the last has no reader but
    // marks nothing: it hands nothing off), four consumers.
    assert_eq!(nodes, 3 * 2 + 1 + 4);
    assert!(edges > 0);
    graphed.replayable.synchronize().unwrap();
    assert_eq!(values(&graphed), values(&fenced));
    // The same dependencies within a step: the same simulated time (each
    // reader starts at its writer's ready point in both). Across steps a
    // step graph gives up one thing: a launch starts after the whole
    // previous launch, where the host fence lets the next step's first
    // runners start under the last consumers.
    assert_eq!(graphed.sim.makespan(), fenced.sim.makespan());
    assert!(graphed.sim.hazards().is_empty());
}

#[test]
fn overlapping_step_graphs_keep_the_overlap_of_the_host_fence_across_steps() {
    // Long consumers: per runner, the next step's first runners start
    // under them; one step graph waits for the whole step before; two
    // graphs launched in turn on two streams overlap as the host fence does.
    let w = Schedule {
        runners: (0..4).map(|r| (true, true, r % 2, 20, r == 1)).collect(),
        consumers: (0..4).map(|r| (r, 0, 2, 60, false)).collect(),
        generations: 2,
        packed: false,
    };
    let steps = 8;
    let mut fenced = setup(&w);
    per_runner(&mut fenced, &w, steps).unwrap();
    fenced.replayable.synchronize().unwrap();
    let mut one = setup(&w);
    stepped(&mut one, &w, steps, false, false).unwrap();
    one.replayable.synchronize().unwrap();
    let mut two = setup(&w);
    stepped(&mut two, &w, steps, false, true).unwrap();
    two.replayable.synchronize().unwrap();
    assert_eq!(values(&one), values(&fenced));
    assert_eq!(values(&two), values(&fenced));
    assert!(one.sim.hazards().is_empty() && two.sim.hazards().is_empty());
    let (host, one, two) = (
        fenced.sim.makespan(),
        one.sim.makespan(),
        two.sim.makespan(),
    );
    assert!(one > host, "one graph: {one}, host fence: {host}");
    assert!(two < one, "overlapping: {two}, one graph: {one}");
    // At most the host fence's time (a composed graph's lanes are its own
    // streams: the two graphs' nodes may overlap more than three streams
    // let the host fence).
    assert!(
        two <= host,
        "overlapping graphs: {two}, host fence: {host}, one graph: {one}"
    );
}

#[test]
fn an_overlapping_step_graph_completes_only_after_the_launch_before_it() {
    // A consumer of runner 0, which the step does not replay: its reads in
    // two launches in turn are not ordered against each other, so only the
    // end of each launch (after the one before) keeps runner 0's next
    // writer after both.
    let w = Schedule {
        runners: vec![(false, false, 0, 5, false), (false, false, 1, 5, false)],
        consumers: Vec::new(),
        generations: 2,
        packed: false,
    };
    for overlapping in [false, true] {
        let mut s = setup(&w);
        per_runner(&mut s, &w, 1).unwrap();
        let acc = s.sim.alloc_f32(32).unwrap();
        {
            let mut step = s.replayable.step();
            step.replay(RunnerId(1), &s.lanes[1]).unwrap();
            let sim = &s.sim;
            step.consume(RunnerId(0), &s.lanes[2], |st, v| {
                sim.launch(st, sim::Kernel::add(&v[0], &acc), 200)
            })
            .unwrap();
            let mut graph = if overlapping {
                step.build_overlapping().unwrap()
            } else {
                step.build().unwrap()
            };
            for k in 0..4 {
                graph.launch(&s.launch[k % 2]).unwrap();
            }
            // forgotten or dropped, the plan goes on safely
            std::mem::forget(graph);
        }
        s.replayable.replay(RunnerId(0), &s.lanes[0]).unwrap();
        s.replayable.synchronize().unwrap();
        assert!(
            s.sim.hazards().is_empty(),
            "{overlapping}: {:?}",
            s.sim.hazards()
        );
        assert_eq!(s.sim.read_f32(&acc).unwrap()[0], 4.0);
    }
}

#[test]
fn the_fence_goes_on_from_where_the_step_left_it() {
    the_fence_goes_on_after_the_step(false);
}

#[test]
fn the_fence_goes_on_from_where_a_forgotten_step_graph_left_it() {
    the_fence_goes_on_after_the_step(true);
}

/// Three launches of the step graph, dropped or forgotten: the plan's fence
/// knows what they left (ownership, handoff reads, completions), so a
/// consumer, a reader and a replay right after are typed or race-free.
fn the_fence_goes_on_after_the_step(forget: bool) {
    let w = four_with_consumers();
    let mut s = setup(&w);
    stepped(&mut s, &w, 3, forget, false).unwrap();
    let stats = s.replayable.fence_stats();
    assert_eq!(stats.step_launches, 3);
    // Runner 3 replayed last in the step: its views are consumable; runner
    // 1's bytes were claimed by runner 3 since.
    let side = s.sim.new_stream();
    s.replayable
        .consume(RunnerId(3), &side, |_, _| Ok::<(), String>(()))
        .unwrap();
    let late = s
        .replayable
        .consume(RunnerId(1), &side, |_, _| Ok::<(), String>(()));
    assert!(matches!(
        late,
        Err(replay_arena::ConsumeError::Overwritten {
            by: RunnerId(3),
            ..
        })
    ));
    // Runner 1 reads what runner 0 handed off in the last step: runner 0
    // first, then runner 1.
    assert!(matches!(
        s.replayable.replay(RunnerId(1), &side),
        Err(ReplayError::HandoffAlreadyRead { .. })
    ));
    s.replayable.replay(RunnerId(0), &side).unwrap();
    s.replayable.replay(RunnerId(1), &s.lanes[1]).unwrap();
    s.replayable.synchronize().unwrap();
    assert!(s.sim.hazards().is_empty());
}

#[test]
fn schedules_the_fence_refuses_are_typed_errors() {
    let w = four_with_consumers();
    let mut s = setup(&w);
    assert!(matches!(s.replayable.step().build(), Err(StepError::Empty)));
    // A consumer of runner 0 after runner 2 claimed its bytes.
    let mut step = s.replayable.step();
    for r in 0..3 {
        step.replay(RunnerId(r), &s.lanes[r as usize % 2]).unwrap();
    }
    step.consume(RunnerId(0), &s.lanes[2], |_, _| Ok::<(), String>(()))
        .unwrap();
    assert!(matches!(
        step.build(),
        Err(StepError::Schedule(replay_arena::ScheduleError::Consume(
            replay_arena::ConsumeError::Overwritten {
                by: RunnerId(2),
                ..
            }
        )))
    ));
    // A reader whose writer was never replayed.
    let mut step = s.replayable.step();
    step.replay(RunnerId(1), &s.lanes[0]).unwrap();
    assert!(matches!(
        step.build(),
        Err(StepError::Schedule(replay_arena::ScheduleError::Replay(
            replay_arena::ReplayError::HandoffNotWritten { .. }
        )))
    ));
    // An unknown runner.
    let mut step = s.replayable.step();
    assert!(matches!(
        step.replay(RunnerId(9), &s.lanes[0]),
        Err(StepError::UnknownRunner { .. })
    ));
}

#[test]
fn a_consumer_of_a_step_reads_and_may_not_write_its_views() {
    let w = four_with_consumers();
    let mut s = setup(&w);
    let mut step = s.replayable.step();
    step.replay(RunnerId(0), &s.lanes[0]).unwrap();
    let sim = s.sim.clone();
    let e = step
        .consume(RunnerId(0), &s.lanes[2], |st, v| {
            sim.launch(st, sim::Kernel::fill(&v[0], 0.0), 1)
        })
        .unwrap_err();
    assert!(
        e.to_string().contains("consumer") || e.to_string().contains("read"),
        "{e}"
    );
    // A consumer that fails leaves the stream free for the next one.
    step.consume(RunnerId(0), &s.lanes[2], |_, _| Ok::<(), String>(()))
        .unwrap();
    let mut graph = step.build().unwrap();
    graph.launch(&s.launch[0]).unwrap();
    let optimizer = s.sim.new_stream();
    graph.wait_all(&optimizer).unwrap();
}

#[test]
fn wait_all_orders_the_programs_work_after_the_latest_launch() {
    let w = four_with_consumers();
    let mut s = setup(&w);
    let optimizer = s.sim.new_stream();
    let copy = s.sim.alloc_f32(32).unwrap();
    let mut step = s.replayable.step();
    for r in 0..4 {
        let (sim, acc) = (&s.sim, &s.accs[r]);
        step.replay(RunnerId(r as u32), &s.lanes[r % 2]).unwrap();
        step.consume(RunnerId(r as u32), &s.lanes[2], |st, v| {
            sim.launch(st, sim::Kernel::add(&v[0], acc), 30)
        })
        .unwrap();
    }
    let mut graph = step.build().unwrap();
    graph.launch(&s.launch[0]).unwrap();
    graph.wait_all(&optimizer).unwrap();
    // The optimizer reads what the step's last consumer wrote.
    s.sim
        .launch(&optimizer, sim::Kernel::copy(&s.accs[3], &copy), 1)
        .unwrap();
    drop(graph);
    assert!(s.sim.hazards().is_empty(), "{:?}", s.sim.hazards());
}

/// A composition the backend refuses whole, whose every copied graph it
/// composes alone, names no runner: the build asks it once per copied
/// graph, the replays' and the consumer's, and keeps the plan usable.
#[test]
fn a_refused_composition_asks_each_copied_graph_alone_and_names_no_runner_when_all_compose() {
    use replay_arena::sim::{Call, Faults};
    let w = four_with_consumers();
    let mut s = setup(&w);
    per_runner(&mut s, &w, 1).unwrap();
    let (sim, acc, lanes) = (s.sim.clone(), &s.accs[0], s.lanes.clone());
    let schedule = |r: &mut Replayable<sim::Device>| {
        let mut step = r.step();
        for k in 0..4u32 {
            step.replay(RunnerId(k), &lanes[k as usize % 2]).unwrap();
            if k == 0 {
                step.consume(RunnerId(0), &lanes[2], |st, v| {
                    sim.launch(st, sim::Kernel::add(&v[0], acc), 1)
                })
                .unwrap();
            }
        }
        step.build().map(|g| g.nodes())
    };
    let nodes = schedule(&mut s.replayable).unwrap();
    s.sim.inject(Faults::nth(Call::Compose, 0));
    let runner = match schedule(&mut s.replayable) {
        Err(StepError::Backend(failure)) => failure.runner,
        other => panic!("{other:?}"),
    };
    let composes = s.sim.fault_log().per_call.get(&Call::Compose).copied();
    s.sim.inject(Faults::none());
    assert_eq!(runner, None);
    // The whole, then each copied graph alone (all are copied here).
    assert_eq!(composes, Some(1 + nodes as u64));
    // The plan goes on.
    per_runner(&mut s, &w, 1).unwrap();
    assert!(s.sim.hazards().is_empty(), "{:?}", s.sim.hazards());
}

#[test]
fn a_consumer_with_temporaries_is_moved_into_one_step_graph_and_refused_by_overlapping_ones() {
    let w = four_with_consumers();
    for overlapping in [false, true] {
        let mut s = setup(&w);
        per_runner(&mut s, &w, 1).unwrap();
        let mut step = s.replayable.step();
        step.replay(RunnerId(0), &s.lanes[0]).unwrap();
        let sim = s.sim.clone();
        let acc = &s.accs[0];
        // A consumer with a graph temporary: no copy of its graph can be
        // made, so it is moved in, into one graph only.
        step.consume(RunnerId(0), &s.lanes[2], |st, v| {
            let t = sim.alloc_async(st, 32)?;
            sim.launch(st, sim::Kernel::copy(&v[0], &t), 1)?;
            sim.launch(st, sim::Kernel::add(&t, acc), 1)?;
            sim.free_async(st, &t)
        })
        .unwrap();
        if overlapping {
            match step.build_overlapping() {
                Err(StepError::Backend(failure)) => {
                    assert_eq!(failure.runner, Some(RunnerId(0)))
                }
                other => panic!("{other:?}"),
            }
            assert_eq!(s.replayable.fence_stats().step_launches, 0);
        } else {
            let before = s.sim.read_f32(acc).unwrap()[0];
            let mut graph = step.build().unwrap();
            for _ in 0..3 {
                graph.launch(&s.launch[0]).unwrap();
            }
            drop(graph);
            let after = s.sim.read_f32(acc).unwrap()[0];
            // Runner 0's count went up by one per launch, ending at `f`:
            // the consumer added f - 2, f - 1 and f.
            let f = s
                .sim
                .read_f32(&s.replayable.views(RunnerId(0)).unwrap()[0])
                .unwrap()[0];
            assert_eq!(after - before, 3.0 * f - 3.0);
            assert!(s.sim.hazards().is_empty());
        }
    }
}

/// The runners that receive no handoff, in capture order.
fn unfed(w: &Schedule) -> Vec<usize> {
    (0..w.runners.len())
        .filter(|&r| r == 0 || !w.runners[r - 1].0)
        .collect()
}

/// The replays of the runners that receive no handoff: a second schedule
/// over part of the plan (another bucket's, say).
fn even_replays(
    s: &mut Setup,
    w: &Schedule,
    kept: bool,
) -> Option<replay_arena::KeptStep<sim::Device>> {
    if kept {
        let mut step = s.replayable.step();
        for r in unfed(w) {
            step.replay(RunnerId(r as u32), &s.lanes[w.runners[r].2])
                .ok()?;
        }
        return step.build().ok().map(replay_arena::StepGraph::keep);
    }
    for r in unfed(w) {
        s.replayable
            .replay(RunnerId(r as u32), &s.lanes[w.runners[r].2])
            .unwrap();
    }
    None
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Two kept step graphs of one plan (the whole schedule, and the even
    /// runners' replays) launched in any order, on any launch stream, with
    /// per-runner steps between them: the same values as the host fence
    /// running the same sequence, and no overlap.
    #[test]
    fn kept_step_graphs_interleave_with_each_other_and_per_runner_steps(
        w in schedule(),
        ops in prop::collection::vec((0usize..4, 0usize..2), 1..12),
    ) {
        let mut fenced = setup(&w);
        let mut graphed = setup(&w);
        // The host fence refuses some schedules: so does the step builder.
        if per_runner(&mut setup(&w), &w, 2).is_err() {
            return Ok(());
        }
        let mut whole = {
            let mut step = graphed.replayable.step();
            for &(replay, i) in &items(&w) {
                if replay {
                    step.replay(RunnerId(i as u32), &graphed.lanes[w.runners[i].2]).unwrap();
                } else {
                    let (runner, _, lane, duration, writes) = w.consumers[i];
                    let (sim, acc, shared) =
                        (&graphed.sim, &graphed.accs[i], &graphed.lane_accs[lane]);
                    let r = RunnerId(runner as u32);
                    if writes {
                        step.consume_mut(r, &graphed.lanes[lane], consumer_work(sim, acc, shared, duration)).map(|_| ()).unwrap();
                    } else {
                        step.consume(r, &graphed.lanes[lane], consumer_work(sim, acc, shared, duration)).map(|_| ()).unwrap();
                    }
                }
            }
            step.build().unwrap().keep()
        };
        let mut even = even_replays(&mut graphed, &w, true).expect("replays build");
        for &(op, launch) in &ops {
            let l = graphed.launch[launch].clone();
            match op {
                0 => {
                    let host = per_runner(&mut fenced, &w, 1);
                    let got = graphed.replayable.launch_kept(&mut whole, &l);
                    prop_assert_eq!(host.is_ok(), got.is_ok(), "{:?} / {:?}", host, got);
                }
                1 => {
                    even_replays(&mut fenced, &w, false);
                    graphed.replayable.launch_kept(&mut even, &l).unwrap();
                }
                2 => {
                    let host = per_runner(&mut fenced, &w, 1);
                    let got = per_runner(&mut graphed, &w, 1);
                    prop_assert_eq!(host.is_ok(), got.is_ok());
                }
                _ => {
                    // A consumer of the last runner, which the second
                    // schedule may not replay: consumable exactly when the
                    // host fence says so.
                    let last = RunnerId(w.runners.len() as u32 - 1);
                    let consume = |s: &mut Setup| {
                        let (sim, acc) = (&s.sim, &s.lane_accs[2]);
                        s.replayable
                            .consume(last, &s.lanes[2], |st, v| {
                                sim.launch(st, sim::Kernel::add(&v[0], acc), 3)
                            })
                            .map_err(|e| e.to_string())
                    };
                    let host = consume(&mut fenced);
                    let got = consume(&mut graphed);
                    prop_assert_eq!(&host, &got);
                }
            }
        }
        fenced.replayable.synchronize().unwrap();
        graphed.replayable.synchronize().unwrap();
        prop_assert!(fenced.sim.hazards().is_empty(), "host: {:?}", fenced.sim.hazards());
        let hazards = graphed.sim.hazards();
        prop_assert!(hazards.is_empty(), "kept step graphs: {:?}", hazards);
        prop_assert_eq!(values(&graphed), values(&fenced));
        // Forgotten or dropped, the plan goes on safely.
        std::mem::forget(even);
        drop(whole);
        per_runner(&mut graphed, &w, 1).unwrap();
        per_runner(&mut fenced, &w, 1).unwrap();
        prop_assert!(graphed.sim.hazards().is_empty());
        prop_assert_eq!(values(&graphed), values(&fenced));
    }
}

#[test]
fn a_kept_step_graph_of_another_plan_is_refused() {
    let w = four_with_consumers();
    let mut a = setup(&w);
    let mut b = setup(&w);
    let mut kept = {
        let mut step = a.replayable.step();
        step.replay(RunnerId(0), &a.lanes[0]).unwrap();
        step.build().unwrap().keep()
    };
    let err = b
        .replayable
        .launch_kept(&mut kept, &b.launch[0])
        .unwrap_err();
    assert!(
        matches!(err, replay_arena::StepLaunchError::ForeignStep),
        "{err}"
    );
    assert_eq!(kept.launches(), 0);
    a.replayable.launch_kept(&mut kept, &a.launch[0]).unwrap();
    assert_eq!(kept.launches(), 1);
}
