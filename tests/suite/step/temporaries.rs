//! Runners whose graphs allocate temporaries (graph memory nodes, as a
//! framework's ops allocating their outputs inside the capture make them)
//! in step graphs, on the `sim` model: the step graph moves in a step copy
//! that `stream_capture_repeatable` captured, per-runner replay stays
//! intact around the step graph's life, a missing copy is a typed error,
//! and the plan's report and teardown account for the graph memory.

use crate::support::record_and_finish;
use crate::support::steps::fence::allocated;
use replay_arena::backend::Streams;
use replay_arena::sim;
use replay_arena::Cut;

use crate::support::faults::{chain_of, graph_memory, read_back};
use crate::support::steps::{allocate_discovered, ones_through_temporary};
use replay_arena::{
    CaptureError, DType, Discovering, Domain, HandoffId, PlanConfig, Policy, Replayable, Request,
    RunnerId, StepError, StreamCaptureError,
};

const N: usize = 64;
const OWN: Request = Request::new(Domain::Device, DType::F32, N as u64);
const GRAD: Request = Request::new(Domain::Device, DType::F32, N as u64);

/// A chain of `layers` runners: runner `l` adds one to its counter, passes
/// it through a temporary into its own view, and hands its counter to the
/// next runner, which adds what it receives into its sink. With
/// `repeatable`, captured with `stream_capture_repeatable`.
struct Chain {
    sim: sim::Device,
    replayable: Replayable<sim::Device>,
    pool: [sim::Stream; 2],
    sinks: Vec<sim::HostBuffer>,
    _keep: Vec<sim::HostBuffer>,
}

fn chain(layers: usize, repeatable: bool, ready: bool) -> Chain {
    let (d, handoffs) = chain_of(layers, OWN, GRAD);
    let sim = sim::Device::new();
    let pool = [sim.new_stream(), sim.new_stream()];
    let one = sim.alloc_f32(N).unwrap();
    sim.write_f32(&one, &[1.0; N]).unwrap();
    let counts: Vec<sim::HostBuffer> = (0..layers).map(|_| sim.alloc_f32(N).unwrap()).collect();
    let sinks: Vec<sim::HostBuffer> = (0..layers).map(|_| sim.alloc_f32(N).unwrap()).collect();
    let mut capturing = allocate_discovered(&sim, d, Policy::Generations(2));
    for l in 0..layers {
        let cap = capturing.capture(RunnerId(l as u32)).unwrap();
        let own = cap.take(OWN).unwrap();
        let input = (l > 0).then(|| cap.receive(handoffs[l - 1]).unwrap());
        let output = (l + 1 < layers).then(|| (handoffs[l], cap.hand_off(handoffs[l]).unwrap()));
        let (count, sink) = (&counts[l], &sinks[l]);
        let work = |s: &sim::Stream| {
            sim.launch(s, sim::Kernel::add(&one, count), 1)?;
            if let Some(input) = &input {
                sim.launch(s, sim::Kernel::add(input, sink), 20)?;
            }
            if let Some((h, out)) = &output {
                sim.launch(s, sim::Kernel::copy(count, out), 2)?;
                if ready {
                    cap.ready(*h, s)?;
                }
            }
            let t = sim.alloc_async(s, N)?;
            sim.launch(s, sim::Kernel::copy(count, &t), 5)?;
            sim.launch(s, sim::Kernel::copy(&t, &own), 30)?;
            sim.free_async(s, &t)?;
            Ok::<(), replay_arena::Error>(())
        };
        if repeatable {
            cap.stream_capture_repeatable(&pool[0], work).unwrap();
        } else {
            cap.stream_capture(&pool[0], work).unwrap();
        }
        cap.finish().unwrap();
    }
    let mut keep = counts;
    keep.push(one);
    Chain {
        replayable: capturing.seal().unwrap(),
        sim,
        pool,
        sinks,
        _keep: keep,
    }
}

impl Chain {
    fn per_runner(&mut self, steps: usize) {
        let layers = self.sinks.len();
        for _ in 0..steps {
            for l in 0..layers {
                let s = &self.pool[l % 2];
                self.replayable.replay(RunnerId(l as u32), s).unwrap();
            }
        }
    }

    /// Every sink and view.
    fn values(&self) -> Vec<Vec<f32>> {
        let r = &self.replayable;
        let views = (0..self.sinks.len()).map(|l| r.views(RunnerId(l as u32)).unwrap()[0]);
        read_back(&self.sim, &self.sinks, views)
    }
}

#[test]
fn a_step_graph_moves_in_step_copies_and_per_runner_replay_goes_on_around_it() {
    for ready in [false, true] {
        let (layers, steps) = (4, 20);
        let mut reference = chain(layers, true, ready);
        reference.per_runner(2 + steps + 2);
        let mut c = chain(layers, true, ready);
        c.per_runner(2);
        for l in 0..layers {
            let (t, copies) = c.replayable.temporaries(RunnerId(l as u32)).unwrap();
            assert_eq!((t.allocations, t.bytes, copies), (1, 4 * N as u64, 1));
        }
        {
            let mut step = c.replayable.step();
            for l in 0..layers {
                step.replay(RunnerId(l as u32), &c.pool[l % 2]).unwrap();
            }
            let mut graph = step.build().unwrap();
            for _ in 0..steps {
                graph.launch(&c.pool[0]).unwrap();
            }
        }
        c.per_runner(2);
        assert!(c.sim.hazards().is_empty(), "{:?}", c.sim.hazards());
        assert_eq!(c.values(), reference.values(), "ready points: {ready}");
        // The copies are the step graph's now: none is left.
        for l in 0..layers {
            assert_eq!(c.replayable.temporaries(RunnerId(l as u32)).unwrap().1, 0);
        }
        let report = c.replayable.report().unwrap();
        assert_eq!(report.temporaries.unwrap().step_copies, 0);
    }
}

/// How many step copies the runner `err` refuses had captured.
fn copies_captured(err: &StepError) -> usize {
    match err {
        StepError::NoStepCopy { captured, .. } => *captured,
        other => panic!("not a missing step copy: {other}"),
    }
}

#[test]
fn a_runner_with_temporaries_and_no_step_copy_is_a_typed_error() {
    // Captured with `stream_capture`: no step copy at all.
    let mut c = chain(2, false, false);
    c.per_runner(1);
    let mut step = c.replayable.step();
    let err = step.replay(RunnerId(0), &c.pool[0]).unwrap_err();
    let StepError::NoStepCopy {
        runner,
        allocations,
        captured,
    } = err
    else {
        panic!("{err}");
    };
    assert_eq!((runner, allocations, captured), (RunnerId(0), 1, 0));
    assert!(
        err.to_string().contains("stream_capture_repeatable"),
        "{err}"
    );
    drop(step);

    // One copy: one replay in one step graph.
    let mut c = chain(2, true, false);
    let mut step = c.replayable.step();
    step.replay(RunnerId(0), &c.pool[0]).unwrap();
    let twice = step.replay(RunnerId(0), &c.pool[1]).unwrap_err();
    assert_eq!(copies_captured(&twice), 1, "{twice}");
    step.replay(RunnerId(1), &c.pool[1]).unwrap();
    let graph = step.build().unwrap();
    drop(graph);
    let mut again = c.replayable.step();
    let used = again.replay(RunnerId(1), &c.pool[0]).unwrap_err();
    assert_eq!(copies_captured(&used), 1, "{used}");
    assert!(used.to_string().contains("used up"), "{used}");
    drop(again);
    // The runners' own graphs replay as before.
    c.per_runner(3);
    assert!(c.sim.hazards().is_empty());
}

#[test]
fn work_without_temporaries_runs_once_and_is_copied_into_step_graphs() {
    let (sim, s, mut capturing) = allocated(&[&[OWN]], Policy::Generations(1));
    let cap = capturing.capture(RunnerId(0)).unwrap();
    let v = cap.take(OWN).unwrap();
    let mut runs = 0;
    cap.stream_capture_repeatable(&s, |s| {
        runs += 1;
        sim.launch(s, sim::Kernel::fill(&v, 3.0), 1)
    })
    .unwrap();
    cap.finish().unwrap();
    assert_eq!(runs, 1);
    let mut r = capturing.seal().unwrap();
    assert_eq!(r.temporaries(RunnerId(0)).unwrap().1, 0);
    // Any number of step graphs: the graph is copied in.
    for _ in 0..3 {
        let mut step = r.step();
        step.replay(RunnerId(0), &s).unwrap();
        step.build().unwrap().launch(&s).unwrap();
    }
    assert_eq!(
        sim.read_f32(&r.views(RunnerId(0)).unwrap()[0]).unwrap()[0],
        3.0
    );
}

/// Runs one repeatable capture of runner 0 with `work`, returns the
/// capture's result and what `finish` says.
fn capture_once(
    work: impl FnMut(
        &sim::Device,
        &sim::Stream,
        &replay_arena::View<'_>,
        usize,
    ) -> replay_arena::Result<()>,
) -> (
    Result<(), StreamCaptureError<replay_arena::Error>>,
    Result<(), CaptureError>,
    sim::Device,
) {
    let mut work = work;
    let (sim, s, mut capturing) = allocated(&[&[OWN]], Policy::Generations(1));
    let cap = capturing.capture(RunnerId(0)).unwrap();
    let v = cap.take(OWN).unwrap();
    let mut run = 0;
    let captured = cap.stream_capture_repeatable(&s, |s| {
        run += 1;
        work(&sim, s, &v, run)
    });
    let finished = cap.finish();
    // The plan stays consistent: sealing refuses the failed runner, and
    // nothing of its captures is left on the stream.
    if finished.is_err() {
        assert!(capturing.seal().is_err());
    }
    assert!(!sim.is_capturing(&s).unwrap());
    (captured, finished, sim)
}

#[test]
fn a_second_run_that_fails_or_panics_fails_the_runner_and_leaks_nothing() {
    // Fails on its second run.
    let (captured, finished, sim) = capture_once(|sim, s, v, run| {
        ones_through_temporary(sim, s, v, N)?;
        if run == 2 {
            return Err(replay_arena::Error::Backend(
                replay_arena::BackendError::Refused {
                    call: "test",
                    reason: "second run".into(),
                },
            ));
        }
        Ok(())
    });
    assert!(matches!(captured, Err(StreamCaptureError::Work(_))));
    assert!(
        matches!(finished, Err(CaptureError::Failed { .. })),
        "{finished:?}"
    );
    assert_eq!(
        graph_memory(&sim).used,
        0,
        "the failed runner's graphs are freed with the plan"
    );

    // Panics on its second run.
    let sim_out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        capture_once(|sim, s, v, run| {
            ones_through_temporary(sim, s, v, N)?;
            assert!(run < 2, "second run panics");
            Ok(())
        })
    }));
    assert!(sim_out.is_err());

    // Every graph memory byte is given back once the plans are gone.
    let (captured, finished, sim) = capture_once(|sim, s, v, run| {
        ones_through_temporary(sim, s, v, N)?;
        if run == 2 {
            let _leak = sim.alloc_async(s, N)?; // only the copy allocates more
        }
        Ok(())
    });
    captured.unwrap();
    // The copy's allocation escapes it: the graph is rejected at finish.
    assert!(
        matches!(finished, Err(CaptureError::GraphRejected { .. })),
        "{finished:?}"
    );
    assert_eq!(graph_memory(&sim).used, 0, "the rejected graphs are freed");
}

#[test]
fn a_second_run_with_other_ready_points_is_a_typed_error() {
    let (sim, s, mut capturing, h) = writer_and_reader(1);
    let cap = capturing.capture(RunnerId(0)).unwrap();
    let own = cap.take(OWN).unwrap();
    let out = cap.hand_off(h).unwrap();
    let mut run = 0;
    let err = cap
        .stream_capture_repeatable(&s, |s| {
            run += 1;
            ones_through_temporary(&sim, s, &own, N)?;
            sim.launch(s, sim::Kernel::fill(&out, 1.0), 1)?;
            if run == 1 {
                cap.ready(h, s)?;
            }
            Ok::<(), replay_arena::Error>(())
        })
        .unwrap_err();
    assert!(
        matches!(
            err,
            StreamCaptureError::Capture(CaptureError::RepeatDiffers {
                runner: RunnerId(0),
                ..
            })
        ),
        "{err}"
    );
    assert!(matches!(cap.finish(), Err(CaptureError::Failed { .. })));
}

#[test]
fn the_report_counts_the_plans_temporaries_and_teardown_gives_the_pool_back() {
    let sim;
    {
        let mut c = chain(3, true, false);
        sim = c.sim.clone();
        c.per_runner(2);
        let report = c.replayable.report().unwrap();
        let t = report.temporaries.unwrap();
        let each = 4 * N as u64;
        assert_eq!((t.runners, t.total, t.largest), (3, 3 * each, each));
        assert_eq!(t.in_flight, 2 * each, "G = 2 runners in flight");
        assert_eq!(t.step_copies, 3 * each);
        assert!(report
            .runners
            .iter()
            .all(|r| r.temporaries.unwrap().bytes == each));
        let text = report.to_string();
        assert!(
            text.contains("graph temporaries (this plan's graphs): 3 runner(s)"),
            "{text}"
        );
        assert!(text.contains("device graph memory"), "{text}");
        // The graphs and copies hold their temporaries; the pool reserves
        // at least that.
        let held = graph_memory(&sim).reserved;
        assert!(held >= 6 * each, "{held}");
    }
    // Teardown freed the graphs and trimmed the pool.
    assert_eq!(graph_memory(&sim).reserved, 0);
    assert_eq!(graph_memory(&sim).used, 0);
}

#[test]
fn a_step_copy_may_not_use_a_temporary_of_the_first_run() {
    let mut kept: Option<sim::Span> = None;
    let (captured, finished, sim) = capture_once(|sim, s, v, run| {
        let t = sim.alloc_async(s, N)?;
        sim.launch(s, sim::Kernel::fill(&t, 1.0), 1)?;
        if run == 2 {
            // The first run's temporary: mapped only while that graph runs.
            let old = kept.expect("the first run kept its temporary");
            sim.launch(s, sim::Kernel::copy(&old, v), 1)?;
        } else {
            sim.launch(s, sim::Kernel::copy(&t, v), 1)?;
        }
        sim.free_async(s, &t)?;
        kept = Some(t);
        Ok(())
    });
    let err = captured.unwrap_err();
    assert!(
        err.to_string().contains("a temporary of another graph"),
        "{err}"
    );
    assert!(
        matches!(finished, Err(CaptureError::Failed { .. })),
        "{finished:?}"
    );
    assert_eq!(graph_memory(&sim).used, 0);
}

/// Makespan on the sim of `steps` launches of one step graph of a chain
/// whose runners allocate: runner `l` on `pool[l % 2]`.
fn step_makespan(c: &mut Chain, steps: usize) -> (u64, usize) {
    let layers = c.sinks.len();
    let start = c.sim.makespan();
    let nodes;
    {
        let mut step = c.replayable.step();
        for l in 0..layers {
            step.replay(RunnerId(l as u32), &c.pool[l % 2]).unwrap();
        }
        let mut graph = step.build().unwrap();
        nodes = graph.nodes();
        for _ in 0..steps {
            graph.launch(&c.pool[0]).unwrap();
        }
    }
    c.replayable.synchronize().unwrap();
    (c.sim.makespan() - start, nodes)
}

#[test]
fn step_copies_are_cut_at_their_ready_point_so_readers_start_there() {
    let (layers, steps) = (4, 10);
    let mut at_end = chain(layers, true, false);
    let mut at_ready = chain(layers, true, true);
    let (end_span, end_nodes) = step_makespan(&mut at_end, steps);
    let (ready_span, ready_nodes) = step_makespan(&mut at_ready, steps);
    // Each writer's copy comes in two parts, cut at its ready point: one
    // node more per writer (the last runner hands nothing off).
    assert_eq!(end_nodes, layers);
    assert_eq!(ready_nodes, layers + (layers - 1));
    // The reader of each handoff starts at the ready point, not after the
    // writer's slow tail (its temporary's 35 ticks).
    assert!(
        ready_span + (steps as u64) * 30 <= end_span,
        "{ready_span} vs {end_span}"
    );
    for c in [&at_end, &at_ready] {
        assert!(c.sim.hazards().is_empty(), "{:?}", c.sim.hazards());
    }
    // The same values as replays per runner.
    let mut reference = chain(layers, true, true);
    reference.per_runner(steps);
    assert_eq!(at_ready.values(), reference.values());
}

/// Runner 0 owns a view and hands a handoff to runner 1, planned in
/// `generations` and allocated on a new sim: the sim, a stream, the
/// capture and the handoff.
fn writer_and_reader(
    generations: usize,
) -> (
    sim::Device,
    sim::Stream,
    replay_arena::Capturing<sim::Device>,
    HandoffId,
) {
    let mut d = Discovering::new(PlanConfig::new());
    let h = {
        let mut a = d.arm(RunnerId(0)).unwrap();
        a.record(OWN).unwrap();
        a.hand_off(GRAD).unwrap()
    };
    d.arm(RunnerId(1)).unwrap().receive(h).unwrap();
    let sim = sim::Device::new();
    let s = sim.new_stream();
    let capturing = allocate_discovered(&sim, d, Policy::Generations(generations));
    (sim, s, capturing, h)
}

#[test]
fn a_failed_cut_fails_the_runner_and_leaks_nothing() {
    // The copy run's cut ends the capture (the second end) and begins the
    // next part (the third begin): either may fail.
    for (call, n) in [(sim::Call::EndCapture, 1), (sim::Call::BeginCapture, 2)] {
        let (sim, s, mut capturing, h) = writer_and_reader(2);
        let cap = capturing.capture(RunnerId(0)).unwrap();
        let (own, out) = (cap.take(OWN).unwrap(), cap.hand_off(h).unwrap());
        sim.inject(sim::Faults::nth(call, n));
        let mut runs = 0;
        let err = cap
            .stream_capture_repeatable(&s, |s| {
                runs += 1;
                // A temporary on each side of the ready point, none across
                // it: the copy is cut there.
                let t = sim.alloc_async(s, N)?;
                sim.launch(s, sim::Kernel::fill(&t, 1.0), 1)?;
                sim.launch(s, sim::Kernel::copy(&t, &out), 1)?;
                sim.free_async(s, &t)?;
                cap.ready(h, s)?;
                let t = sim.alloc_async(s, N)?;
                sim.launch(s, sim::Kernel::fill(&t, 2.0), 1)?;
                sim.launch(s, sim::Kernel::copy(&t, &own), 1)?;
                sim.free_async(s, &t)?;
                Ok::<(), replay_arena::Error>(())
            })
            .unwrap_err();
        sim.inject(sim::Faults::none());
        assert_eq!(runs, 2, "{call:?}");
        assert!(err.to_string().contains("injected"), "{call:?}: {err}");
        assert!(
            matches!(cap.finish(), Err(CaptureError::Failed { .. })),
            "{call:?}"
        );
        // The stream left capture; nothing of either run is held.
        assert!(!sim.is_capturing(&s).unwrap(), "{call:?}");
        drop(capturing);
        assert_eq!(graph_memory(&sim).used, 0, "{call:?}");
    }
}

/// Where the writer of [`two_ready_points`] allocates its temporary.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Temporary {
    /// None: its graph is split at both ready points.
    None,
    /// In its tail, after both ready points: its step copy is cut at both.
    AfterBoth,
    /// Before the first ready point, freed after the second: the copy is
    /// kept whole.
    AcrossBoth,
    /// Between the two ready points, freed after the second: the copy is
    /// cut at the first only.
    AcrossSecond,
}

/// A writer of two handoffs, each marked ready (the second long after the
/// first, then a long tail), and a reader of each on streams of their own;
/// the writer allocates a temporary where `temporary` says (its step copy
/// is moved in, cut at each ready point no temporary lives across).
fn two_ready_points(
    temporary: Temporary,
) -> (
    sim::Device,
    Replayable<sim::Device>,
    [sim::Stream; 3],
    [HandoffId; 2],
) {
    let mut d = Discovering::new(PlanConfig::new());
    let (h0, h1) = {
        let mut a = d.arm(RunnerId(0)).unwrap();
        a.record(OWN).unwrap();
        (a.hand_off(GRAD).unwrap(), a.hand_off(GRAD).unwrap())
    };
    for (r, h) in [(1, h0), (2, h1)] {
        let mut a = d.arm(RunnerId(r)).unwrap();
        a.record(OWN).unwrap();
        a.receive(h).unwrap();
    }
    let sim = sim::Device::new();
    let s = [sim.new_stream(), sim.new_stream(), sim.new_stream()];
    let mut capturing = allocate_discovered(&sim, d, Policy::Generations(3));
    {
        let cap = capturing.capture(RunnerId(0)).unwrap();
        let own = cap.take(OWN).unwrap();
        let (x0, x1) = (cap.hand_off(h0).unwrap(), cap.hand_off(h1).unwrap());
        let work = |st: &sim::Stream| {
            let alloc = |at: Temporary| match temporary == at {
                true => sim.alloc_async(st, N).map(Some),
                false => Ok(None),
            };
            let mut t = alloc(Temporary::AcrossBoth)?;
            sim.launch(st, sim::Kernel::fill(&x0, 1.0), 5)?;
            cap.ready(h0, st)?;
            if t.is_none() {
                t = alloc(Temporary::AcrossSecond)?;
            }
            sim.launch(st, sim::Kernel::fill(&x1, 2.0), 50)?;
            cap.ready(h1, st)?;
            if t.is_none() {
                t = alloc(Temporary::AfterBoth)?;
            }
            match &t {
                Some(t) => {
                    sim.launch(st, sim::Kernel::fill(t, 3.0), 200)?;
                    sim.launch(st, sim::Kernel::copy(t, &own), 1)?;
                    sim.free_async(st, t)?;
                }
                None => sim.launch(st, sim::Kernel::fill(&own, 3.0), 200)?,
            }
            Ok::<(), replay_arena::Error>(())
        };
        cap.stream_capture_repeatable(&s[0], work).unwrap();
        cap.finish().unwrap();
    }
    for (r, h) in [(1u32, h0), (2, h1)] {
        let cap = capturing.capture(RunnerId(r)).unwrap();
        let own = cap.take(OWN).unwrap();
        let input = cap.receive(h).unwrap();
        record_and_finish!(cap, &s[r as usize], |st| {
            sim.launch(st, sim::Kernel::copy(&input, &own), 5)
        });
    }
    (sim, capturing.seal().unwrap(), s, [h0, h1])
}

/// One step graph of the three runners of [`two_ready_points`], each on
/// its own stream, of `nodes` nodes, launched on stream 0: no hazard, the
/// writer's and readers' values. Returns how long the launch took.
fn launched_step_span(
    sim: &sim::Device,
    rp: &mut Replayable<sim::Device>,
    s: &[sim::Stream; 3],
    nodes: usize,
    what: &str,
) -> u64 {
    let start = sim.makespan();
    {
        let mut step = rp.step();
        for r in 0..3u32 {
            step.replay(RunnerId(r), &s[r as usize]).unwrap();
        }
        let mut graph = step.build().unwrap();
        assert_eq!(graph.nodes(), nodes, "{what}");
        graph.launch(&s[0]).unwrap();
    }
    rp.synchronize().unwrap();
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    let value = |r: u32| sim.read_f32(&rp.views(RunnerId(r)).unwrap()[0]).unwrap()[0];
    assert_eq!((value(0), value(1), value(2)), (3.0, 1.0, 2.0));
    sim.makespan() - start
}

#[test]
fn every_ready_point_is_kept_in_a_step_graph_cut_copies_and_split_graphs_alike() {
    for temporaries in [Temporary::None, Temporary::AfterBoth] {
        let (sim, mut rp, s, _) = two_ready_points(temporaries);
        // The writer in three parts (one per ready point, and the rest),
        // and the two readers.
        let what = format!("temporaries: {temporaries:?}");
        let span = launched_step_span(&sim, &mut rp, &s, 5, &what);
        // Both readers ran before the writer's tail ended: the launch took
        // the writer's time alone (5 + 50 + 200 ticks and the temporary's
        // copy), not a reader's 5 more after it.
        assert!(
            span <= 5 + 50 + 200 + 1,
            "temporaries: {temporaries:?}: {span}"
        );
    }
}

#[test]
fn a_step_copy_is_kept_whole_at_a_ready_point_a_temporary_lives_across() {
    // Cut there, the driver keeps the temporary (and the parts' others)
    // apart from every other runner's for the whole step: several times the
    // graph memory of whole copies on an H200. Whole, the reader of that
    // handoff starts after the writer's copy.
    let bytes = N as u64 * 4;
    for (temporary, nodes, cut) in [
        (Temporary::AcrossBoth, 3, [false, false]),
        (Temporary::AcrossSecond, 4, [true, false]),
        (Temporary::AfterBoth, 5, [true, true]),
    ] {
        let (sim, mut rp, s, [h0, h1]) = two_ready_points(temporary);
        let decided = rp.ready_points(RunnerId(0)).unwrap().to_vec();
        let expect = |h, clean| {
            (
                h,
                if clean {
                    Cut::Clean
                } else {
                    Cut::TemporariesAcross { bytes }
                },
            )
        };
        assert_eq!(
            decided,
            [expect(h0, cut[0]), expect(h1, cut[1])],
            "{temporary:?}"
        );
        assert!(rp.ready_points(RunnerId(1)).unwrap().is_empty());
        let span = launched_step_span(&sim, &mut rp, &s, nodes, &format!("{temporary:?}"));
        // A reader of a ready point kept whole starts after the writer's
        // 5 + 50 + 200 ticks (and the copy), 5 ticks of its own after that.
        if cut == [true, true] {
            assert!(span <= 5 + 50 + 200 + 1, "{temporary:?}: {span}");
        } else {
            assert!(span >= 5 + 50 + 200 + 1 + 5, "{temporary:?}: {span}");
        }
        assert!(
            Cut::TemporariesAcross { bytes }
                .to_string()
                .contains("free them before it"),
            "the reason names the fix"
        );
    }
}

#[test]
fn a_temporary_used_after_its_free_in_the_same_graph_is_refused() {
    // CUDA may give a freed temporary's memory to a later allocation of
    // the same graph: the sim refuses the use, across a cut too.
    for cut in [false, true] {
        let (sim, s, mut capturing, h) = writer_and_reader(2);
        let cap = capturing.capture(RunnerId(0)).unwrap();
        let (own, out) = (cap.take(OWN).unwrap(), cap.hand_off(h).unwrap());
        let err = cap
            .stream_capture_repeatable(&s, |st| {
                let t = sim.alloc_async(st, N)?;
                sim.launch(st, sim::Kernel::fill(&t, 1.0), 1)?;
                sim.launch(st, sim::Kernel::copy(&t, &out), 1)?;
                sim.free_async(st, &t)?;
                if cut {
                    cap.ready(h, st)?;
                }
                sim.launch(st, sim::Kernel::copy(&t, &own), 1)?;
                if !cut {
                    cap.ready(h, st)?;
                }
                Ok::<(), replay_arena::Error>(())
            })
            .unwrap_err();
        assert!(err.to_string().contains("freed"), "cut {cut}: {err}");
        assert!(matches!(cap.finish(), Err(CaptureError::Failed { .. })));
        drop(capturing);
        assert_eq!(graph_memory(&sim).used, 0);
    }
}
