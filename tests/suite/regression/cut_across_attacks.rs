//! Attacks on step copies cut across temporaries
//! (`RunnerCapture::cut_across_temporaries`, `Cut::Across`) from safe code
//! on the `sim` model: a writer of one or two handoffs whose temporary
//! lives across its ready points, readers on other streams, consumers in
//! the step, kept and overlapping step graphs, per-runner replays before
//! and after, replan, copy runs that misuse temporaries across the cuts,
//! work beside a ready point, faults at each call and panics, and the
//! read-only graph memory estimates. Each test asserts the safe outcome:
//! a typed refusal, or hazard-free values equal to per-runner replays of
//! the same schedule, and nothing left once the plan is dropped. An attack
//! that found no hole.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};

use replay_arena::backend::{Backend, Streams};
use replay_arena::sim::{self, Call, Faults};
use replay_arena::{
    Capturing, Cut, Discovering, HandoffId, KeptStep, PlanConfig, Policy, Replayable,
    RunnerCapture, RunnerId, View,
};

use crate::support::faults::{
    assert_clean, assert_hazard_free, assert_no_graph_memory, at_each_call, build, drop_plan,
    read_back, seal_or_note, writer_of, Attack, N, Q, R,
};

/// Bytes of one temporary of `N` f32s.
const BYTES: u64 = N as u64 * 4;

/// The shape of a plan: runner 0 writes `k` handoffs, reader `i` (runner
/// `i + 1`) receives handoff `i`.
#[derive(Clone)]
struct Spec {
    k: usize,
    copies: usize,
    across: bool,
    g: usize,
    reader_temps: bool,
    reader_copies: usize,
}

impl Spec {
    fn new(k: usize) -> Spec {
        Spec {
            k,
            copies: 1,
            across: true,
            g: 2,
            reader_temps: false,
            reader_copies: 1,
        }
    }
    fn copies(mut self, copies: usize) -> Spec {
        self.copies = copies;
        self.reader_copies = copies;
        self
    }
    fn across(mut self, across: bool) -> Spec {
        self.across = across;
        self
    }
    fn reader_temps(mut self) -> Spec {
        self.reader_temps = true;
        self
    }
}

/// What a writer's work sees.
struct W<'a, 'c> {
    sim: &'a sim::Device,
    cap: &'a RunnerCapture<'c, sim::Device>,
    hs: &'a [HandoffId],
    xs: &'a [View<'a>],
    own: &'a View<'a>,
    one: &'a sim::HostBuffer,
    count: &'a sim::HostBuffer,
    side: &'a sim::Stream,
    run: usize,
}

type Writer<'w> = &'w mut dyn FnMut(&W, &sim::Stream) -> R;

/// The standard writer: count += 1; a temporary t = count, allocated
/// before the first ready point and freed after the last; each handoff
/// `i` = t * (i + 1), ready, then t doubled in the next part; own = t.
/// The temporary lives across every ready point and is written in every
/// part.
fn across_all(w: &W, s: &sim::Stream) -> R {
    let sim = w.sim;
    sim.launch(s, sim::Kernel::add(w.one, w.count), 1)?;
    let t = sim.alloc_async(s, N)?;
    sim.launch(s, sim::Kernel::copy(w.count, &t), 2)?;
    for i in 0..w.hs.len() {
        sim.launch(s, sim::Kernel::copy(&t, &w.xs[i]), 3)?;
        sim.launch(s, sim::Kernel::scale(&w.xs[i], (i + 1) as f32), 3)?;
        w.cap.ready(w.hs[i], s)?;
        sim.launch(s, sim::Kernel::scale(&t, 2.0), 10)?;
    }
    sim.launch(s, sim::Kernel::copy(&t, w.own), 40)?;
    Ok(sim.free_async(s, &t)?)
}

struct Plan {
    sim: sim::Device,
    hs: Vec<HandoffId>,
    streams: Vec<sim::Stream>,
    side: sim::Stream,
    r: Option<Replayable<sim::Device>>,
    failed: Option<Capturing<sim::Device>>,
    errors: Vec<String>,
    sinks: Vec<sim::HostBuffer>,
    csink: sim::HostBuffer,
    _keep: Vec<sim::HostBuffer>,
}

fn discovery(k: usize) -> (Discovering, Vec<HandoffId>) {
    let mut d = Discovering::new(PlanConfig::new());
    let hs = writer_of(&mut d, k, Q, Q);
    for i in 0..k {
        let mut a = d.arm(RunnerId(i as u32 + 1)).unwrap();
        a.record(Q).unwrap();
        a.receive(hs[i]).unwrap();
    }
    (d, hs)
}

fn plan(spec: &Spec, writer: Writer) -> Plan {
    plan_with(sim::Device::new(), spec, writer, None)
}

/// The plan of `spec` on `sim`, its writer's work `writer`; with `attack`,
/// allocation, captures and seal run under its fault. Every failure (a
/// panic of the writer's work too) is noted in `errors`.
fn plan_with(sim: sim::Device, spec: &Spec, writer: Writer, attack: Option<&Attack>) -> Plan {
    let k = spec.k;
    let (d, hs) = discovery(k);
    let streams: Vec<sim::Stream> = (0..=k).map(|_| sim.new_stream()).collect();
    let side = sim.new_stream();
    let wside = sim.new_stream();
    let one = sim.alloc_f32(N).unwrap();
    sim.write_f32(&one, &[1.0; N]).unwrap();
    let count = sim.alloc_f32(N).unwrap();
    let sinks: Vec<sim::HostBuffer> = (0..=k).map(|_| sim.alloc_f32(N).unwrap()).collect();
    let csink = sim.alloc_f32(N).unwrap();
    let planned = d.plan(Policy::Generations(spec.g)).unwrap();
    let body = || {
        let mut errors = Vec::new();
        let mut capturing = match planned.allocate(sim.clone()) {
            Ok(c) => c,
            Err(e) => {
                errors.push(format!("allocate: {e}"));
                return (None, None, errors);
            }
        };
        // The writer (once: a runner whose capture failed stays failed
        // until replan).
        if let Ok(cap) = capturing
            .capture(RunnerId(0))
            .map_err(|e| errors.push(format!("capture writer: {e}")))
        {
            cap.step_copies(spec.copies);
            if spec.across {
                cap.cut_across_temporaries();
            }
            let own = cap.take(Q).unwrap();
            let xs: Vec<_> = hs.iter().map(|h| cap.hand_off(*h).unwrap()).collect();
            let mut run = 0;
            let res = catch_unwind(AssertUnwindSafe(|| {
                cap.stream_capture_repeatable(&streams[0], |s| -> R {
                    run += 1;
                    let w = W {
                        sim: &sim,
                        cap: &cap,
                        hs: &hs,
                        xs: &xs,
                        own: &own,
                        one: &one,
                        count: &count,
                        side: &wside,
                        run,
                    };
                    writer(&w, s)
                })
            }));
            assert!(
                !sim.is_capturing(&streams[0]).unwrap_or(false),
                "left capturing"
            );
            assert!(!sim.is_capturing(&wside).unwrap_or(false), "side capturing");
            let ok = match res {
                Ok(Ok(())) => true,
                Ok(Err(e)) => {
                    errors.push(format!("writer: {e}"));
                    false
                }
                Err(_) => {
                    errors.push("writer panicked".into());
                    false
                }
            };
            match cap.finish() {
                Ok(()) if ok => {}
                Ok(()) => errors.push("writer finished after a failure".into()),
                Err(e) => errors.push(format!("writer finish: {e}")),
            }
        }
        for i in 0..k {
            let cap = match capturing.capture(RunnerId(i as u32 + 1)) {
                Ok(c) => c,
                Err(e) => {
                    errors.push(format!("capture reader {i}: {e}"));
                    continue;
                }
            };
            cap.step_copies(spec.reader_copies);
            let own = cap.take(Q).unwrap();
            let input = cap.receive(hs[i]).unwrap();
            let sink = &sinks[i + 1];
            let res = cap.stream_capture_repeatable(&streams[i + 1], |s| -> R {
                sim.launch(s, sim::Kernel::add(&input, sink), 20)?;
                if spec.reader_temps {
                    let t = sim.alloc_async(s, N)?;
                    sim.launch(s, sim::Kernel::copy(&input, &t), 3)?;
                    sim.launch(s, sim::Kernel::scale(&t, 3.0), 3)?;
                    sim.launch(s, sim::Kernel::copy(&t, &own), 3)?;
                    sim.free_async(s, &t)?;
                } else {
                    sim.launch(s, sim::Kernel::copy(&input, &own), 3)?;
                }
                Ok(())
            });
            if let Err(e) = res {
                errors.push(format!("reader {i}: {e}"));
            }
            if let Err(e) = cap.finish() {
                errors.push(format!("reader {i} finish: {e}"));
            }
        }
        let (r, failed) = seal_or_note(capturing, &mut errors);
        (r, failed, errors)
    };
    let (r, failed, errors) = match attack {
        Some(a) => a.on(&sim, body),
        None => body(),
    };
    Plan {
        sim,
        hs,
        streams,
        side,
        r,
        failed,
        errors,
        sinks,
        csink,
        _keep: vec![one, count],
    }
}

/// One entry of a schedule: a replay of a runner on a stream, or a
/// consumer of a runner on the side stream (adds its first view to the
/// consumer sink).
#[derive(Clone, Copy, Debug)]
enum Item {
    Replay(u32, usize),
    Consume(u32),
}
use Item::{Consume, Replay};

impl Plan {
    fn r(&mut self) -> &mut Replayable<sim::Device> {
        self.r.as_mut().expect("sealed")
    }

    fn per_runner(&mut self, items: &[Item]) {
        let (streams, side, sim) = (self.streams.clone(), self.side.clone(), self.sim.clone());
        let cs = &self.csink;
        let r = self.r.as_mut().unwrap();
        for it in items {
            match *it {
                Replay(run, s) => r.replay(RunnerId(run), &streams[s]).unwrap(),
                Consume(run) => r
                    .consume(RunnerId(run), &side, |s, v| {
                        sim.launch(s, sim::Kernel::add(&v[0], cs), 3)
                    })
                    .unwrap(),
            }
        }
    }

    /// The step graph of `items`, kept.
    fn kept(&mut self, items: &[Item], overlapping: bool) -> Result<KeptStep<sim::Device>, String> {
        let (streams, side, sim) = (self.streams.clone(), self.side.clone(), self.sim.clone());
        let cs = &self.csink;
        let r = self.r.as_mut().unwrap();
        let mut step = r.step();
        for it in items {
            match *it {
                Replay(run, s) => {
                    step.replay(RunnerId(run), &streams[s])
                        .map_err(|e| format!("replay: {e}"))?;
                }
                Consume(run) => {
                    step.consume(RunnerId(run), &side, |s, v| {
                        sim.launch(s, sim::Kernel::add(&v[0], cs), 3)
                    })
                    .map_err(|e| format!("consume: {e}"))?;
                }
            }
        }
        Ok(build(step, overlapping)
            .map_err(|e| format!("build: {e}"))?
            .keep())
    }

    /// Launches `kept` `launches` times, on the streams in turn.
    fn launch_kept(&mut self, kept: &mut KeptStep<sim::Device>, launches: usize) {
        let streams = self.streams.clone();
        for n in 0..launches {
            self.r()
                .launch_kept(kept, &streams[n % streams.len()])
                .unwrap();
        }
    }

    fn values(&self) -> Vec<Vec<f32>> {
        let r = self.r.as_ref().unwrap();
        r.synchronize().unwrap();
        let buffers = self.sinks.iter().chain([&self.csink]);
        let views = (0..self.sinks.len()).flat_map(|l| r.views(RunnerId(l as u32)).unwrap());
        read_back(&self.sim, buffers, views.copied())
    }

    fn ready_points(&self) -> Vec<Cut> {
        let r = self.r.as_ref().unwrap();
        let points = r.ready_points(RunnerId(0)).unwrap();
        assert_eq!(
            points.iter().map(|p| p.0).collect::<Vec<_>>(),
            self.hs,
            "ready points in the work's order"
        );
        points.iter().map(|p| p.1).collect()
    }

    /// Drops the plan: no hazard, no event, no graph memory and only the
    /// program's buffers left (then none).
    fn teardown(mut self, what: &str) {
        let sim = self.sim.clone();
        drop_plan(self.r.take(), self.failed.take());
        assert_hazard_free(&sim);
        assert_no_graph_memory(&sim, what);
        assert_clean(&sim, self.sinks.len() + 3, what);
        drop(self);
        assert_clean(&sim, 0, what);
    }
}

/// What per-runner replays of `rounds` (each a schedule, run in turn)
/// leave, on a fresh plan of `spec` with `writer`.
fn reference(spec: &Spec, writer: Writer, rounds: &[&[Item]]) -> Vec<Vec<f32>> {
    let mut p = plan(spec, writer);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    for items in rounds {
        p.per_runner(items);
    }
    let v = p.values();
    assert_hazard_free(&p.sim);
    p.teardown("reference");
    v
}

/// The schedules the step attacks run: readers on streams of their own,
/// all on the writer's stream, consumers between replays, the writer on
/// a reader's stream.
fn schedules() -> Vec<Vec<Item>> {
    vec![
        vec![Replay(0, 0), Replay(1, 1), Replay(2, 2)],
        vec![Replay(0, 0), Replay(1, 0), Replay(2, 0)],
        vec![
            Replay(0, 0),
            Consume(0),
            Replay(1, 1),
            Consume(1),
            Replay(2, 1),
            Consume(2),
        ],
        vec![Replay(0, 1), Replay(2, 0), Replay(1, 2), Consume(2)],
    ]
}

#[test]
fn copies_cut_across_a_temporary_spanning_two_ready_points_match_per_runner_replays() {
    for across in [false, true] {
        for overlapping in [false, true] {
            for items in schedules() {
                let what = format!("across {across}, overlapping {overlapping}, {items:?}");
                let spec = Spec::new(2).across(across).copies(1 + overlapping as usize);
                let mut p = plan(&spec, &mut across_all);
                assert!(p.errors.is_empty(), "{what}: {:?}", p.errors);
                let expected = if across {
                    Cut::Across { bytes: BYTES }
                } else {
                    Cut::TemporariesAcross { bytes: BYTES }
                };
                assert_eq!(p.ready_points(), [expected; 2], "{what}");
                p.per_runner(&items);
                let mut kept = p.kept(&items, overlapping).unwrap();
                p.launch_kept(&mut kept, 3);
                p.per_runner(&items);
                p.launch_kept(&mut kept, 2);
                p.per_runner(&items);
                assert_hazard_free(&p.sim);
                let got = p.values();
                let want = reference(&spec, &mut across_all, &[&items[..]; 8]);
                assert_eq!(got, want, "{what}");
                // A second step graph of the writer has no copy left.
                let again = p.kept(&items, false).map(|_| ()).unwrap_err();
                assert!(again.contains("used up"), "{what}: {again}");
                drop(kept);
                p.teardown(&what);
            }
        }
    }
}

#[test]
fn step_graphs_cut_across_readers_with_temporaries_of_their_own() {
    let spec = Spec::new(2).reader_temps();
    let items = [Replay(0, 0), Replay(2, 2), Replay(1, 1)];
    let mut p = plan(&spec, &mut across_all);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    {
        let streams = p.streams.clone();
        let r = p.r();
        let mut step = r.step();
        for it in items {
            if let Replay(run, s) = it {
                step.replay(RunnerId(run), &streams[s]).unwrap();
            }
        }
        let mut g = step.build().unwrap();
        // The writer in three parts, the readers whole.
        assert_eq!(g.nodes(), 3 + 2);
        for n in 0..4 {
            g.launch(&streams[n % 3]).unwrap();
        }
        let m = g.graph_memory().unwrap();
        assert_eq!(m.temporaries.bytes, 3 * BYTES, "{m:?}");
    }
    p.per_runner(&[Replay(0, 1), Replay(1, 0), Replay(2, 1)]);
    assert_hazard_free(&p.sim);
    let got = p.values();
    let replays = [Replay(0, 0), Replay(2, 2), Replay(1, 1)];
    let want = reference(
        &spec,
        &mut across_all,
        &[&replays, &replays, &replays, &replays, &replays],
    );
    assert_eq!(got, want);
    p.teardown("readers with temporaries");
}

#[test]
fn the_writer_twice_in_one_step_cut_across_matches_per_runner_replays() {
    let items = [
        Replay(0, 0),
        Replay(1, 1),
        Replay(2, 2),
        Replay(0, 1),
        Replay(1, 2),
        Consume(0),
        Replay(2, 0),
    ];
    for overlapping in [false, true] {
        let spec = Spec::new(2).copies(2 + 2 * overlapping as usize);
        let mut p = plan(&spec, &mut across_all);
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        let mut kept = p.kept(&items, overlapping).unwrap();
        p.launch_kept(&mut kept, 3);
        p.per_runner(&items);
        p.launch_kept(&mut kept, 1);
        assert_hazard_free(&p.sim);
        let got = p.values();
        assert_eq!(got, reference(&spec, &mut across_all, &[&items[..]; 5]));
        drop(kept);
        p.teardown("writer twice");
    }
}

#[test]
fn an_overlapping_step_with_one_copy_cut_across_is_refused_and_keeps_it() {
    let spec = Spec::new(2);
    let items = [Replay(0, 0), Replay(1, 1), Replay(2, 2)];
    let mut p = plan(&spec, &mut across_all);
    let e = p.kept(&items, true).map(|_| ()).unwrap_err();
    assert!(e.contains("used up") || e.contains("step cop"), "{e}");
    // The copies are still there for a step graph that needs one each.
    let mut kept = p.kept(&items, false).unwrap();
    p.launch_kept(&mut kept, 2);
    assert_hazard_free(&p.sim);
    assert_eq!(
        p.values(),
        reference(&spec, &mut across_all, &[&items, &items])
    );
    drop(kept);
    p.teardown("overlapping with one copy");
}

#[test]
fn replan_captures_new_copies_cut_across_again() {
    let spec = Spec::new(2);
    let items = [Replay(0, 0), Replay(1, 1), Replay(2, 2), Consume(1)];
    let mut p = plan(&spec, &mut across_all);
    let mut kept = p.kept(&items, false).unwrap();
    p.launch_kept(&mut kept, 2);
    drop(kept);
    let first = p.values();
    // Replan: a fresh discovery, captured again with the option.
    let sim = p.sim.clone();
    let rp = p.r.take().unwrap();
    let d = rp.replan().unwrap();
    drop(d);
    assert_no_graph_memory(&sim, "after replan");
    assert_eq!(sim.live_events(), 0);
    p.teardown("first plan");
    let mut q = plan(&spec, &mut across_all);
    assert_eq!(q.ready_points(), [Cut::Across { bytes: BYTES }; 2]);
    let mut kept = q.kept(&items, false).unwrap();
    q.launch_kept(&mut kept, 2);
    drop(kept);
    assert_eq!(q.values(), first);
    q.teardown("second plan");
}

#[test]
fn per_runner_replays_around_a_forgotten_cut_across_step_graph_stay_ordered() {
    let spec = Spec::new(2);
    let items = [Replay(0, 0), Replay(1, 1), Replay(2, 2)];
    let mut p = plan(&spec, &mut across_all);
    {
        let streams = p.streams.clone();
        let r = p.r();
        let mut step = r.step();
        for it in items {
            if let Replay(run, s) = it {
                step.replay(RunnerId(run), &streams[s]).unwrap();
            }
        }
        let mut g = step.build().unwrap();
        g.launch(&streams[0]).unwrap();
        g.launch(&streams[2]).unwrap();
        std::mem::forget(g);
    }
    // Straight after, each runner on another stream.
    p.per_runner(&[Replay(0, 1), Replay(2, 0), Replay(1, 2)]);
    p.per_runner(&items);
    assert_hazard_free(&p.sim);
    let got = p.values();
    let swapped = [Replay(0, 1), Replay(2, 0), Replay(1, 2)];
    assert_eq!(
        got,
        reference(&spec, &mut across_all, &[&items, &items, &swapped, &items])
    );
    let sim = p.sim.clone();
    drop(p.r.take());
    assert_hazard_free(&sim);
}

/// Runs a writer whose copy run misuses a temporary: the plan is refused
/// with a typed error, or every step and replay is hazard-free and equal
/// to per-runner replays; nothing is left either way.
fn refused_or_sound(name: &str, spec: &Spec, writer: &mut dyn FnMut(&W, &sim::Stream) -> R) {
    let mut p = plan(spec, writer);
    if !p.errors.is_empty() {
        eprintln!("{name}: refused: {:?}", p.errors);
        p.teardown(name);
        return;
    }
    let items = [Replay(0, 0), Replay(1, 1), Replay(2, 2)];
    p.per_runner(&items);
    match p.kept(&items, false) {
        Ok(mut kept) => {
            p.launch_kept(&mut kept, 3);
            drop(kept);
        }
        Err(e) => eprintln!("{name}: step refused: {e}"),
    }
    p.per_runner(&items);
    assert!(p.sim.hazards().is_empty(), "{name}: {:?}", p.sim.hazards());
    eprintln!("{name}: accepted, hazard-free");
    p.teardown(name);
}

/// A temporary `b` freed before the first ready point and, in the copy run
/// only, used after it: in another part of the cut copy.
fn freed_then_used_in_the_next_part(w: &W, s: &sim::Stream) -> R {
    let sim = w.sim;
    sim.launch(s, sim::Kernel::add(w.one, w.count), 1)?;
    let t = sim.alloc_async(s, N)?;
    let b = sim.alloc_async(s, N)?;
    sim.launch(s, sim::Kernel::copy(w.count, &b), 1)?;
    sim.launch(s, sim::Kernel::copy(&b, &t), 1)?;
    sim.free_async(s, &b)?;
    for i in 0..w.hs.len() {
        sim.launch(s, sim::Kernel::copy(&t, &w.xs[i]), 3)?;
        w.cap.ready(w.hs[i], s)?;
        if w.run == 2 {
            sim.launch(s, sim::Kernel::fill(&b, 9.0), 3)?;
        }
    }
    sim.launch(s, sim::Kernel::copy(&t, w.own), 40)?;
    Ok(sim.free_async(s, &t)?)
}

#[test]
fn a_temporary_freed_in_one_part_and_used_in_the_next_is_refused() {
    let mut used_in_part_two = false;
    let mut w = |w: &W, s: &sim::Stream| -> R {
        let r = freed_then_used_in_the_next_part(w, s);
        if w.run == 2 {
            used_in_part_two = r.is_ok();
        }
        r
    };
    let p = plan(&Spec::new(2), &mut w);
    assert!(
        !used_in_part_two && !p.errors.is_empty(),
        "a freed temporary was used in the next part of a cut copy: {:?}",
        p.errors
    );
    p.teardown("freed then used");
}

#[test]
fn a_temporary_across_one_cut_freed_and_used_after_the_next_is_refused() {
    // t lives across h0 (cut across), is freed before h1 and, in the copy
    // run, written after h1: its free is two parts back.
    let mut w = |w: &W, s: &sim::Stream| -> R {
        let sim = w.sim;
        sim.launch(s, sim::Kernel::add(w.one, w.count), 1)?;
        let t = sim.alloc_async(s, N)?;
        sim.launch(s, sim::Kernel::copy(w.count, &t), 1)?;
        sim.launch(s, sim::Kernel::copy(&t, &w.xs[0]), 3)?;
        w.cap.ready(w.hs[0], s)?;
        sim.launch(s, sim::Kernel::copy(&t, &w.xs[1]), 3)?;
        sim.free_async(s, &t)?;
        w.cap.ready(w.hs[1], s)?;
        if w.run == 2 {
            sim.launch(s, sim::Kernel::fill(&t, 9.0), 3)?;
        }
        sim.launch(s, sim::Kernel::copy(w.count, w.own), 3)?;
        Ok(())
    };
    let p = plan(&Spec::new(2), &mut w);
    assert!(!p.errors.is_empty(), "used after its free two parts back");
    p.teardown("freed two parts back");
}

/// A writer whose temporary lives across every ready point and is kept in
/// `stash` in run `keep`: t = count, each handoff = t, then `after_ready`
/// after each ready point, own = t (for `tail` ticks), t freed.
fn stashing<'s>(
    stash: &'s Cell<Option<sim::Span>>,
    keep: usize,
    tail: u64,
    mut after_ready: impl FnMut(&W, &sim::Stream, &sim::Span) -> R + 's,
) -> impl FnMut(&W, &sim::Stream) -> R + 's {
    move |w: &W, s: &sim::Stream| -> R {
        let sim = w.sim;
        let t = sim.alloc_async(s, N)?;
        if w.run == keep {
            stash.set(Some(t));
        }
        sim.launch(s, sim::Kernel::copy(w.count, &t), 1)?;
        for i in 0..w.hs.len() {
            sim.launch(s, sim::Kernel::copy(&t, &w.xs[i]), 3)?;
            w.cap.ready(w.hs[i], s)?;
            after_ready(w, s, &t)?;
        }
        sim.launch(s, sim::Kernel::copy(&t, w.own), tail)?;
        Ok(sim.free_async(s, &t)?)
    }
}

#[test]
fn a_first_run_temporary_in_a_later_part_of_the_copy_is_refused() {
    let stash: Cell<Option<sim::Span>> = Cell::new(None);
    let mut w = stashing(&stash, 1, 3, |w, s, t| {
        if w.run == 2 {
            let old = stash.get().unwrap();
            w.sim.launch(s, sim::Kernel::copy(t, &old), 3)?;
        }
        Ok(())
    });
    let p = plan(&Spec::new(2), &mut w);
    assert!(!p.errors.is_empty(), "the first run's temporary was used");
    p.teardown("first run's temporary");
}

#[test]
fn a_copy_that_frees_its_temporary_twice_across_cuts_is_refused() {
    let mut w = |w: &W, s: &sim::Stream| -> R {
        let sim = w.sim;
        let t = sim.alloc_async(s, N)?;
        sim.launch(s, sim::Kernel::copy(w.count, &t), 1)?;
        for i in 0..w.hs.len() {
            sim.launch(s, sim::Kernel::copy(&t, &w.xs[i]), 3)?;
            w.cap.ready(w.hs[i], s)?;
            if w.run == 2 && i == 0 {
                sim.free_async(s, &t)?;
            }
        }
        Ok(sim.free_async(s, &t)?)
    };
    let p = plan(&Spec::new(2), &mut w);
    assert!(!p.errors.is_empty(), "freed twice across a cut");
    p.teardown("freed twice");
}

#[test]
fn a_copy_whose_temporary_is_never_freed_is_refused() {
    let mut w = |w: &W, s: &sim::Stream| -> R {
        let sim = w.sim;
        let t = sim.alloc_async(s, N)?;
        sim.launch(s, sim::Kernel::copy(w.count, &t), 1)?;
        for i in 0..w.hs.len() {
            sim.launch(s, sim::Kernel::copy(&t, &w.xs[i]), 3)?;
            w.cap.ready(w.hs[i], s)?;
        }
        sim.launch(s, sim::Kernel::copy(&t, w.own), 3)?;
        if w.run == 1 {
            sim.free_async(s, &t)?;
        }
        Ok(())
    };
    let p = plan(&Spec::new(2), &mut w);
    assert!(!p.errors.is_empty(), "a copy that leaks its temporary");
    p.teardown("never freed");
}

#[test]
fn a_copy_whose_temporary_lives_across_where_the_first_run_freed_it_is_sound() {
    // The first run frees its temporary before each ready point (clean
    // cuts); the copy run keeps one across both. With and without the
    // option: refused, or hazard-free.
    for across in [false, true] {
        let mut w = |w: &W, s: &sim::Stream| -> R {
            let sim = w.sim;
            sim.launch(s, sim::Kernel::add(w.one, w.count), 1)?;
            let mut t = Some(sim.alloc_async(s, N)?);
            for i in 0..w.hs.len() {
                let cur = match t {
                    Some(t) => t,
                    None => {
                        let n = sim.alloc_async(s, N)?;
                        t = Some(n);
                        n
                    }
                };
                sim.launch(s, sim::Kernel::copy(w.count, &cur), 1)?;
                sim.launch(s, sim::Kernel::copy(&cur, &w.xs[i]), 3)?;
                if w.run == 1 {
                    sim.free_async(s, &cur)?;
                    t = None;
                }
                w.cap.ready(w.hs[i], s)?;
                sim.launch(s, sim::Kernel::scale(&w.count, 1.0), 1)?;
            }
            if let Some(t) = t {
                sim.launch(s, sim::Kernel::copy(&t, w.own), 30)?;
                sim.free_async(s, &t)?;
            } else {
                sim.launch(s, sim::Kernel::copy(w.count, w.own), 30)?;
            }
            Ok(())
        };
        refused_or_sound(
            &format!("copy keeps a temporary across, across {across}"),
            &Spec::new(2).across(across),
            &mut w,
        );
    }
}

#[test]
fn a_handoff_written_after_its_ready_point_in_a_cut_part_is_refused() {
    let mut wrote = false;
    let mut w = |w: &W, s: &sim::Stream| -> R {
        let sim = w.sim;
        let t = sim.alloc_async(s, N)?;
        sim.launch(s, sim::Kernel::copy(w.count, &t), 1)?;
        for i in 0..w.hs.len() {
            sim.launch(s, sim::Kernel::copy(&t, &w.xs[i]), 3)?;
            w.cap.ready(w.hs[i], s)?;
        }
        if w.run == 2 {
            // Swallow the refusal: the op must not be in the copy.
            wrote = sim.launch(s, sim::Kernel::fill(&w.xs[0], 7.0), 50).is_ok();
            let _ = sim.launch(s, sim::Kernel::copy(&w.xs[1], &t), 50);
        }
        sim.launch(s, sim::Kernel::copy(&t, w.own), 3)?;
        Ok(sim.free_async(s, &t)?)
    };
    let mut p = plan(&Spec::new(2), &mut w);
    assert!(!wrote, "a handoff was written after its ready point");
    if p.errors.is_empty() {
        let items = [Replay(0, 0), Replay(1, 1), Replay(2, 2)];
        let mut kept = p.kept(&items, false).unwrap();
        p.launch_kept(&mut kept, 3);
        drop(kept);
        assert_hazard_free(&p.sim);
        // Readers see t, never 7.
        assert!(p.values()[1].iter().all(|&x| x != 7.0 * 3.0));
    }
    p.teardown("handoff after ready");
}

#[test]
fn a_cut_copy_temporary_used_by_a_reader_or_a_step_consumer_is_refused() {
    let stash: Cell<Option<sim::Span>> = Cell::new(None);
    // Stash the copy run's temporary through a writer of our own.
    let mut writer = stashing(&stash, 2, 30, |_, _, _| Ok(()));
    let mut p = plan(&Spec::new(2), &mut writer);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    let t = stash.get().unwrap();
    let (streams, side, sim) = (p.streams.clone(), p.side.clone(), p.sim.clone());
    // A step consumer of the writer that writes the copy's temporary.
    {
        let r = p.r();
        let mut step = r.step();
        step.replay(RunnerId(0), &streams[0]).unwrap();
        let e = step.consume(RunnerId(0), &side, |s, v| {
            sim.launch(s, sim::Kernel::copy(&v[0], &t), 3)
        });
        assert!(e.is_err(), "a step consumer wrote a copy's temporary");
        step.replay(RunnerId(1), &streams[1]).unwrap();
        let e = step.consume(RunnerId(1), &side, |s, _| {
            sim.launch(s, sim::Kernel::fill(&t, 5.0), 3)
        });
        assert!(e.is_err(), "a step consumer wrote a copy's temporary");
        step.replay(RunnerId(2), &streams[2]).unwrap();
        let mut g = step.build().unwrap();
        g.launch(&streams[0]).unwrap();
        g.launch(&streams[1]).unwrap();
    }
    // Per runner, and outside every closure.
    let e = p.r().consume(RunnerId(0), &side, |s, _| {
        sim.launch(s, sim::Kernel::fill(&t, 5.0), 3)
    });
    assert!(e.is_err(), "a consumer wrote a copy's temporary");
    assert!(sim.launch(&side, sim::Kernel::fill(&t, 5.0), 3).is_err());
    assert!(sim.read_f32(&t).is_err() || sim.hazards().is_empty());
    p.per_runner(&[Replay(0, 0), Replay(1, 1), Replay(2, 2)]);
    assert_hazard_free(&sim);
    p.teardown("temporary elsewhere");
}

#[test]
fn the_option_set_inside_the_work_or_after_it_changes_nothing_unsafe() {
    // Set during the first run, during the copy run: the decision is
    // reported, and the step is hazard-free and matches per-runner replays.
    for when in [1usize, 2] {
        let mut w = |w: &W, s: &sim::Stream| -> R {
            if w.run == when {
                w.cap.cut_across_temporaries();
            }
            across_all(w, s)
        };
        let spec = Spec::new(2).across(false);
        let mut p = plan(&spec, &mut w);
        if !p.errors.is_empty() {
            eprintln!("set in run {when}: refused: {:?}", p.errors);
            p.teardown("set inside");
            continue;
        }
        let cuts = p.ready_points();
        eprintln!("set in run {when}: {cuts:?}");
        let items = [Replay(0, 0), Replay(1, 1), Replay(2, 2), Consume(2)];
        let mut kept = p.kept(&items, false).unwrap();
        p.launch_kept(&mut kept, 3);
        drop(kept);
        assert_hazard_free(&p.sim);
        let got = p.values();
        assert_eq!(
            got,
            reference(&spec, &mut across_all, &[&items, &items, &items]),
            "set in run {when}"
        );
        p.teardown("set inside");
    }
}

#[test]
fn work_beside_a_ready_point_is_refused_or_stays_whole_when_cut_across_is_chosen() {
    // x1 is written on a side stream forked before h0 and joined after it;
    // a temporary lives across both ready points. (The `sim` captures one
    // stream: it refuses the fork's event record, a typed error.)
    let mut w = |w: &W, s: &sim::Stream| -> R {
        let sim = w.sim;
        sim.launch(s, sim::Kernel::add(w.one, w.count), 1)?;
        let t = sim.alloc_async(s, N)?;
        sim.launch(s, sim::Kernel::copy(w.count, &t), 2)?;
        let fork = sim.create_event()?;
        sim.record_event(s, &fork)?;
        sim.wait_event(w.side, &fork)?;
        sim.launch(w.side, sim::Kernel::fill(&w.xs[1], 4.0), 80)?;
        sim.launch(s, sim::Kernel::copy(&t, &w.xs[0]), 3)?;
        w.cap.ready(w.hs[0], s)?;
        sim.launch(s, sim::Kernel::scale(&t, 2.0), 10)?;
        let join = sim.create_event()?;
        sim.record_event(w.side, &join)?;
        sim.wait_event(s, &join)?;
        w.cap.ready(w.hs[1], s)?;
        sim.launch(s, sim::Kernel::copy(&t, w.own), 40)?;
        Ok(sim.free_async(s, &t)?)
    };
    let spec = Spec::new(2);
    let mut p = plan(&spec, &mut w);
    if !p.errors.is_empty() {
        eprintln!("work beside: refused: {:?}", p.errors);
        p.teardown("work beside");
        return;
    }
    let cuts = p.ready_points();
    assert_eq!(cuts[0], Cut::WorkBeside, "{cuts:?}");
    let items = [Replay(0, 0), Replay(1, 1), Replay(2, 2)];
    let mut kept = p.kept(&items, false).unwrap();
    p.launch_kept(&mut kept, 3);
    drop(kept);
    p.per_runner(&items);
    assert_hazard_free(&p.sim);
    let got = p.values();
    assert_eq!(got, reference(&spec, &mut w, &[&items[..]; 4]));
    p.teardown("work beside");
}

#[test]
fn a_fault_at_each_call_of_a_cut_across_capture_is_refused_or_sound() {
    let spec = Spec::new(2);
    let items = [Replay(0, 0), Replay(1, 1), Consume(0), Replay(2, 2)];
    let want = reference(&spec, &mut across_all, &[&items[..]; 3]);
    let n = at_each_call(|attack| {
        let mut p = plan_with(sim::Device::new(), &spec, &mut across_all, Some(attack));
        if attack.fault().is_none() {
            assert!(p.errors.is_empty(), "{:?}", p.errors);
        }
        if p.r.is_some() {
            let mut kept = p.kept(&items, false).unwrap();
            p.launch_kept(&mut kept, 2);
            drop(kept);
            p.per_runner(&items);
            assert!(
                p.sim.hazards().is_empty(),
                "{attack}: {:?}",
                p.sim.hazards()
            );
            assert_eq!(p.values(), want, "{attack}: {:?}", p.errors);
        } else {
            assert!(!p.errors.is_empty(), "{attack}");
        }
        p.teardown(&attack.to_string());
    });
    assert!(n > 20, "{n} calls");
}

#[test]
fn a_fault_at_each_call_of_a_cut_across_build_and_launch_leaves_the_plan_sound() {
    let spec = Spec::new(2);
    let items = [Replay(0, 0), Replay(1, 1), Consume(1), Replay(2, 2)];
    for overlapping in [false, true] {
        let spec = spec.clone().copies(1 + overlapping as usize);
        let n = at_each_call(|attack| {
            let mut p = plan(&spec, &mut across_all);
            let streams = p.streams.clone();
            let mut launched = 0usize;
            let kept = attack.on(&p.sim.clone(), || {
                let mut kept = p.kept(&items, overlapping).ok()?;
                for n in 0..2 {
                    if p.r().launch_kept(&mut kept, &streams[n]).is_ok() {
                        launched += 1;
                    }
                }
                Some(kept)
            });
            if attack.fault().is_none() {
                assert!(kept.is_some() && launched == 2);
            }
            // A build that fails before composing keeps the copies; one
            // that fails composing may have moved them (the count says
            // so, and the next build is a typed `NoStepCopy`); a failed
            // launch enqueued nothing.
            let left = p.r().temporaries(RunnerId(0)).unwrap().1;
            let kept = match kept {
                Some(k) => Some(k),
                None => match p.kept(&items, overlapping) {
                    Ok(k) => Some(k),
                    Err(e) => {
                        assert!(left < spec.copies && e.contains("used up"), "{attack}: {e}");
                        None
                    }
                },
            };
            if let Some(mut kept) = kept {
                p.launch_kept(&mut kept, 1);
                launched += 1;
                drop(kept);
            }
            p.per_runner(&items);
            assert!(
                p.sim.hazards().is_empty(),
                "{attack}: {:?}",
                p.sim.hazards()
            );
            let rounds = vec![&items[..]; launched + 1];
            assert_eq!(
                p.values(),
                reference(&spec, &mut across_all, &rounds),
                "{attack}, overlapping {overlapping}"
            );
            p.teardown(&attack.to_string());
        });
        assert!(n > 5, "{n} calls");
    }
}

#[test]
fn a_copy_run_panicking_in_a_later_part_fails_the_runner_and_leaves_nothing() {
    for part in 0..3usize {
        let panicked = Cell::new(false);
        let mut w = |w: &W, s: &sim::Stream| -> R {
            let sim = w.sim;
            sim.launch(s, sim::Kernel::add(w.one, w.count), 1)?;
            let t = sim.alloc_async(s, N)?;
            sim.launch(s, sim::Kernel::copy(w.count, &t), 2)?;
            for i in 0..=w.hs.len() {
                if w.run == 2 && i == part && !panicked.get() {
                    panicked.set(true);
                    panic!("copy run panics in part {part}");
                }
                if i == w.hs.len() {
                    break;
                }
                sim.launch(s, sim::Kernel::copy(&t, &w.xs[i]), 3)?;
                sim.launch(s, sim::Kernel::scale(&w.xs[i], (i + 1) as f32), 3)?;
                w.cap.ready(w.hs[i], s)?;
                sim.launch(s, sim::Kernel::scale(&t, 2.0), 10)?;
            }
            sim.launch(s, sim::Kernel::copy(&t, w.own), 40)?;
            Ok(sim.free_async(s, &t)?)
        };
        let spec = Spec::new(2);
        let p = plan(&spec, &mut w);
        assert!(panicked.get());
        assert!(
            p.errors.iter().any(|e| e.contains("panicked")),
            "{:?}",
            p.errors
        );
        // The runner failed: the seal names it, and the plan is given up
        // (`replan`) with nothing left.
        assert!(p.r.is_none(), "sealed after a panic: {:?}", p.errors);
        assert!(
            p.errors
                .iter()
                .any(|e| e.starts_with("seal:") && e.contains("runner 0")),
            "{:?}",
            p.errors
        );
        p.teardown("panic in a part");
    }
}

#[test]
fn graph_memory_estimates_of_cut_across_steps_are_read_only() {
    let spec = Spec::new(2).reader_temps();
    let items = [Replay(0, 0), Consume(0), Replay(1, 1), Replay(2, 2)];
    let mut p = plan(&spec, &mut across_all);
    let sim = p.sim.clone();
    let (temps, copies) = p.r().temporaries(RunnerId(0)).unwrap();
    assert_eq!((temps.bytes, copies), (BYTES, 1));
    let one = p.r().graph_memory(0).unwrap();
    assert_eq!(one.concurrent, 1, "{one:?}");
    let two = p.r().graph_memory(2).unwrap();
    assert_eq!(two.bytes, 2 * one.bytes, "{two:?}");
    let mut kept = p.kept(&items, false).unwrap();
    assert_eq!(p.r().temporaries(RunnerId(0)).unwrap().1, 0);
    let before = (sim.makespan(), sim.live_events(), sim.live_allocations());
    let m = kept.graph_memory().unwrap();
    assert_eq!(m.temporaries.bytes, 3 * BYTES, "{m:?}");
    // At least the largest runner graph's share and one granule (cut
    // across, the driver takes more than estimated: documented).
    let largest = replay_arena::GraphMemoryEstimate::share(BYTES, m.granule) + m.granule;
    assert!(m.bytes >= largest, "{m:?}");
    let _ = p.r().graph_memory(3).unwrap();
    assert_eq!(
        before,
        (sim.makespan(), sim.live_events(), sim.live_allocations())
    );
    // A failing query changes nothing.
    sim.inject(Faults::nth(Call::GraphMemoryQuery, 0));
    let failed = kept.graph_memory();
    sim.inject(Faults::nth(Call::GraphMemoryQuery, 0));
    let failed_plan = p.r().graph_memory(1);
    sim.inject(Faults::none());
    eprintln!("under a fault: {failed:?} / {failed_plan:?}");
    assert_eq!(kept.graph_memory().unwrap(), m);
    p.launch_kept(&mut kept, 3);
    assert_eq!(kept.graph_memory().unwrap(), m);
    assert_hazard_free(&sim);
    assert_eq!(
        p.values(),
        reference(&spec, &mut across_all, &[&items[..]; 3])
    );
    // The kept step outlives its plan: its estimate and drop stay sound.
    let what = "kept outlives";
    let k = p.sinks.len();
    drop(p.r.take());
    let after = kept.graph_memory();
    eprintln!("kept after its plan: {after:?}");
    drop(kept);
    Backend::trim_graph_memory(&sim).unwrap();
    assert_hazard_free(&sim);
    assert_no_graph_memory(&sim, what);
    assert_clean(&sim, k + 3, what);
    drop(p);
    assert_clean(&sim, 0, what);
}

#[test]
fn two_kept_cut_across_steps_in_turn_and_an_unused_copy_leave_nothing() {
    let spec = Spec::new(2).copies(3);
    let a = [Replay(0, 0), Replay(1, 1), Replay(2, 2)];
    let b = [
        Replay(0, 2),
        Consume(0),
        Replay(2, 1),
        Replay(1, 0),
        Consume(1),
    ];
    let mut p = plan(&spec, &mut across_all);
    let mut ka = p.kept(&a, false).unwrap();
    let mut kb = p.kept(&b, false).unwrap();
    assert_eq!(p.r().temporaries(RunnerId(0)).unwrap().1, 1);
    p.launch_kept(&mut ka, 1);
    p.launch_kept(&mut kb, 2);
    p.per_runner(&a);
    p.launch_kept(&mut ka, 1);
    p.per_runner(&b);
    p.launch_kept(&mut kb, 1);
    assert_hazard_free(&p.sim);
    let got = p.values();
    let want = reference(&spec, &mut across_all, &[&a, &b, &b, &a, &a, &b, &b]);
    assert_eq!(got, want);
    drop(ka);
    drop(kb);
    // One copy never moved in: dropped with the plan.
    p.teardown("two kept steps");
}
