//! Hostile review of step copies cut at their ready point, traced step
//! graphs, and the backend roles, on the `sim` model. Each test either
//! expects a typed refusal or checks that the device stays hazard-free,
//! the values right, and graph memory returns to zero.

#![allow(clippy::needless_range_loop, clippy::unnecessary_unwrap)]

use replay_arena::sim::{self, Call, Faults};
use replay_arena::{
    Backend, Capture, GraphMemory, HandoffId, ReadOnly, RunnerCapture, Streams, View,
};
use replay_arena::{
    CaptureError, DType, Discovering, Domain, PlanConfig, Policy, Replayable, Request, RunnerId,
    StepError, StreamCaptureError,
};
use std::panic::{catch_unwind, AssertUnwindSafe};

const N: usize = 64;
const OWN: Request = Request::new(Domain::Device, DType::F32, N as u64);
const GRAD: Request = Request::new(Domain::Device, DType::F32, N as u64);

type R = replay_arena::Result<()>;

/// What a runner's work closure sees.
#[allow(dead_code)]
struct Ctx<'a, 'c> {
    sim: &'a sim::Device,
    cap: &'a RunnerCapture<'c, sim::Device>,
    layer: usize,
    layers: usize,
    run: usize,
    own: &'a View<'a>,
    input: Option<&'a View<'a, ReadOnly>>,
    out: Option<(HandoffId, &'a View<'a>)>,
    one: &'a sim::HostBuffer,
    count: &'a sim::HostBuffer,
    sink: &'a sim::HostBuffer,
}

/// The standard work: count += 1; sink += input; out = count; ready;
/// own = count through a temporary.
fn standard(c: &Ctx, s: &sim::Stream) -> R {
    let sim = c.sim;
    sim.launch(s, sim::Op::add(c.one, c.count), 1)?;
    if let Some(input) = c.input {
        sim.launch(s, sim::Op::add(input, c.sink), 20)?;
    }
    if let Some((h, out)) = c.out {
        sim.launch(s, sim::Op::copy(c.count, out), 2)?;
        c.cap.ready(h, s)?;
    }
    let t = sim.alloc_async(s, N)?;
    sim.launch(s, sim::Op::copy(c.count, &t), 5)?;
    sim.launch(s, sim::Op::copy(&t, c.own), 30)?;
    sim.free_async(s, &t)?;
    Ok(())
}

struct Chain {
    sim: sim::Device,
    pool: [sim::Stream; 2],
    replayable: Option<Replayable<sim::Device>>,
    failed: Option<replay_arena::Capturing<sim::Device>>,
    capture_errors: Vec<String>,
    sinks: Vec<sim::HostBuffer>,
    _keep: Vec<sim::HostBuffer>,
}

/// A chain of `layers` runners (runner l hands its count to l + 1),
/// captured repeatably with `copies` step copies each, with `work`.
fn chain_with(
    layers: usize,
    g: usize,
    copies: usize,
    work: &mut dyn FnMut(&Ctx, &sim::Stream) -> R,
) -> Chain {
    let sim = sim::Device::new();
    chain_on(sim, layers, g, copies, work)
}

fn chain_on(
    sim: sim::Device,
    layers: usize,
    g: usize,
    copies: usize,
    work: &mut dyn FnMut(&Ctx, &sim::Stream) -> R,
) -> Chain {
    chain_faulty(sim, layers, g, copies, work, None)
}

fn chain_faulty(
    sim: sim::Device,
    layers: usize,
    g: usize,
    copies: usize,
    work: &mut dyn FnMut(&Ctx, &sim::Stream) -> R,
    faults: Option<Faults>,
) -> Chain {
    let mut d = Discovering::new(PlanConfig::new());
    let mut handoffs: Vec<HandoffId> = Vec::new();
    for l in 0..layers {
        let mut armed = d.arm(RunnerId(l as u32)).unwrap();
        armed.record(OWN).unwrap();
        if l > 0 {
            armed.receive(handoffs[l - 1]).unwrap();
        }
        if l + 1 < layers {
            handoffs.push(armed.hand_off(GRAD).unwrap());
        }
    }
    let pool = [sim.stream(), sim.stream()];
    let one = sim.alloc_f32(N).unwrap();
    sim.write_f32(&one, &[1.0; N]).unwrap();
    let counts: Vec<sim::HostBuffer> = (0..layers).map(|_| sim.alloc_f32(N).unwrap()).collect();
    let sinks: Vec<sim::HostBuffer> = (0..layers).map(|_| sim.alloc_f32(N).unwrap()).collect();
    let planned = d.plan(Policy::Generations(g)).unwrap();
    let mut keep = counts;
    keep.push(one);
    let (counts, one) = (&keep[..layers], &keep[layers]);
    if let Some(f) = faults {
        sim.inject(f);
    }
    let mut capture_errors = Vec::new();
    let mut capturing = match planned.allocate(sim.clone()) {
        Ok(c) => c,
        Err(e) => {
            capture_errors.push(format!("allocate: {e}"));
            return Chain {
                sim,
                pool,
                replayable: None,
                failed: None,
                capture_errors,
                sinks,
                _keep: keep,
            };
        }
    };
    for l in 0..layers {
        let cap = match capturing.capture(RunnerId(l as u32)) {
            Ok(c) => c,
            Err(e) => {
                capture_errors.push(format!("capture {l}: {e}"));
                continue;
            }
        };
        cap.step_copies(copies);
        let own = cap.take(OWN).unwrap();
        let input = (l > 0).then(|| cap.receive(handoffs[l - 1]).unwrap());
        let out = (l + 1 < layers).then(|| cap.hand_off(handoffs[l]).unwrap());
        let mut run = 0;
        let res = cap.stream_capture_repeatable(&pool[0], |s| {
            run += 1;
            let c = Ctx {
                sim: &sim,
                cap: &cap,
                layer: l,
                layers,
                run,
                own: &own,
                input: input.as_ref(),
                out: out.as_ref().map(|o| (handoffs[l], o)),
                one,
                count: &counts[l],
                sink: &sinks[l],
            };
            work(&c, s)
        });
        if let Err(e) = res {
            capture_errors.push(format!("runner {l}: {e}"));
        }
        if let Err(e) = cap.finish() {
            capture_errors.push(format!("finish {l}: {e}"));
        }
        assert!(
            !sim.is_capturing(&pool[0]).unwrap_or(false),
            "left capturing"
        );
    }
    let (replayable, failed) = match capturing.seal() {
        Ok(r) => (Some(r), None),
        Err(e) => {
            capture_errors.push(format!("seal: {e}"));
            (None, Some(e.into_capturing()))
        }
    };
    Chain {
        sim,
        pool,
        replayable,
        failed,
        capture_errors,
        sinks,
        _keep: keep,
    }
}

impl Chain {
    fn r(&mut self) -> &mut Replayable<sim::Device> {
        self.replayable.as_mut().expect("sealed")
    }
    fn per_runner(&mut self, steps: usize) {
        let layers = self.sinks.len();
        for _ in 0..steps {
            for l in 0..layers {
                let s = self.pool[l % 2].clone();
                self.r().replay(RunnerId(l as u32), &s).unwrap();
            }
        }
    }
    fn values(&self) -> Vec<Vec<f32>> {
        let layers = self.sinks.len();
        let r = self.replayable.as_ref().unwrap();
        let mut out: Vec<Vec<f32>> = self
            .sinks
            .iter()
            .map(|b| self.sim.read_f32(b).unwrap())
            .collect();
        for l in 0..layers {
            let v = r.views(RunnerId(l as u32)).unwrap()[0];
            out.push(self.sim.read_f32(&v).unwrap());
        }
        out
    }
    fn hazard_free(&self) {
        assert!(self.sim.hazards().is_empty(), "{:?}", self.sim.hazards());
    }
    /// Drops the plan; graph memory must return to zero.
    fn teardown(mut self) {
        let sim = self.sim.clone();
        self.replayable.take();
        if let Some(c) = self.failed.take() {
            // The documented way to give up on a failed plan.
            drop(c.replan());
        }
        drop(self);
        assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
        let p = pool(&sim);
        assert_eq!((p.used, p.reserved), (0, 0), "graph memory left: {p:?}");
    }
}

fn pool(sim: &sim::Device) -> GraphMemory {
    sim.graph_memory_in_use().unwrap().unwrap()
}

fn injected() -> replay_arena::Error {
    replay_arena::Error::Backend(replay_arena::BackendError::Refused {
        op: "test",
        reason: "closure fails".into(),
    })
}

/// Launches `steps` step graphs of every runner on `pool[l % 2]`.
fn step_launches(c: &mut Chain, steps: usize, overlapping: bool) -> Result<(), String> {
    let layers = c.sinks.len();
    let pool = c.pool.clone();
    let r = c.replayable.as_mut().unwrap();
    let mut step = r.step();
    for l in 0..layers {
        step.replay(RunnerId(l as u32), &pool[l % 2])
            .map_err(|e| e.to_string())?;
    }
    let mut graph = if overlapping {
        step.build_overlapping()
    } else {
        step.build()
    }
    .map_err(|e| e.to_string())?;
    for k in 0..steps {
        graph.launch(&pool[k % 2]).map_err(|e| e.to_string())?;
    }
    Ok(())
}

// ---------------------------------------------------------------------
// 1. Step copies cut at their ready point
// ---------------------------------------------------------------------

#[test]
fn baseline_cut_copies_match_per_runner_replays() {
    let mut reference = chain_with(4, 2, 1, &mut standard);
    reference.per_runner(8);
    let mut c = chain_with(4, 2, 1, &mut standard);
    assert!(c.capture_errors.is_empty(), "{:?}", c.capture_errors);
    c.per_runner(1);
    step_launches(&mut c, 6, false).unwrap();
    c.per_runner(1);
    c.hazard_free();
    assert_eq!(c.values(), reference.values());
    c.teardown();
}

#[test]
fn second_run_marks_a_ready_the_first_did_not_is_refused() {
    let c = chain_with(2, 1, 1, &mut |c, s| {
        if c.run == 1 && c.out.is_some() {
            // first run: no ready
            let (_, out) = c.out.unwrap();
            c.sim.launch(s, sim::Op::copy(c.count, out), 2)?;
            let t = c.sim.alloc_async(s, N)?;
            c.sim.launch(s, sim::Op::copy(&t, c.own), 1)?;
            return Ok(c.sim.free_async(s, &t)?);
        }
        standard(c, s)
    });
    assert!(
        c.capture_errors.iter().any(|e| e.contains("runner 0")),
        "{:?}",
        c.capture_errors
    );
    assert!(c.replayable.is_none());
    c.teardown();
}

#[test]
fn second_run_marks_ready_twice_is_refused() {
    let c = chain_with(2, 1, 1, &mut |c, s| {
        standard(c, s)?;
        if c.run == 2 {
            if let Some((h, _)) = c.out {
                c.cap.ready(h, s)?;
            }
        }
        Ok(())
    });
    assert!(
        c.capture_errors.iter().any(|e| e.contains("runner 0")),
        "{:?}",
        c.capture_errors
    );
    c.teardown();
}

#[test]
fn second_run_marks_ready_on_another_stream_is_refused() {
    let other = std::cell::RefCell::new(None::<sim::Stream>);
    let c = chain_with(2, 1, 1, &mut |c, s| {
        if c.run == 2 {
            if let Some((h, out)) = c.out {
                c.sim.launch(s, sim::Op::copy(c.count, out), 2)?;
                let o = other
                    .borrow_mut()
                    .get_or_insert_with(|| c.sim.stream())
                    .clone();
                c.cap.ready(h, &o)?;
                let t = c.sim.alloc_async(s, N)?;
                c.sim.launch(s, sim::Op::copy(&t, c.own), 1)?;
                return Ok(c.sim.free_async(s, &t)?);
            }
        }
        standard(c, s)
    });
    assert!(
        c.capture_errors.iter().any(|e| e.contains("runner 0")),
        "{:?}",
        c.capture_errors
    );
    c.teardown();
}

#[test]
fn error_after_the_cut_in_the_second_run_fails_the_runner_and_leaks_nothing() {
    let c = chain_with(3, 2, 1, &mut |c, s| {
        standard(c, s)?;
        if c.run == 2 && c.layer == 1 {
            return Err(injected());
        }
        Ok(())
    });
    assert!(
        c.capture_errors.iter().any(|e| e.contains("runner 1")),
        "{:?}",
        c.capture_errors
    );
    assert!(c.replayable.is_none());
    c.teardown();
}

#[test]
fn panic_after_the_cut_with_a_live_temporary_leaks_nothing() {
    let sim = sim::Device::new();
    let s2 = sim.clone();
    let out = catch_unwind(AssertUnwindSafe(|| {
        chain_on(s2, 2, 1, 1, &mut |c, s| {
            let t = c.sim.alloc_async(s, N)?;
            c.sim.launch(s, sim::Op::copy(c.count, &t), 1)?;
            if let Some((h, out)) = c.out {
                c.sim.launch(s, sim::Op::copy(&t, out), 2)?;
                c.cap.ready(h, s)?;
            }
            // temporary still live across the cut
            assert!(c.run < 2, "second run panics after the cut");
            c.sim.launch(s, sim::Op::copy(&t, c.own), 1)?;
            Ok(c.sim.free_async(s, &t)?)
        })
    }));
    assert!(out.is_err());
    assert!(sim.hazards().is_empty());
    let p = pool(&sim);
    assert_eq!((p.used, p.reserved), (0, 0), "{p:?}");
}

#[test]
fn temporary_used_and_freed_across_the_cut_gives_right_values() {
    let mut work = |c: &Ctx, s: &sim::Stream| -> R {
        let sim = c.sim;
        let t = sim.alloc_async(s, N)?;
        sim.launch(s, sim::Op::add(c.one, c.count), 1)?;
        sim.launch(s, sim::Op::copy(c.count, &t), 3)?;
        if let Some(input) = c.input {
            sim.launch(s, sim::Op::add(input, c.sink), 20)?;
        }
        if let Some((h, out)) = c.out {
            sim.launch(s, sim::Op::copy(&t, out), 2)?;
            c.cap.ready(h, s)?;
        }
        sim.launch(s, sim::Op::copy(&t, c.own), 30)?;
        Ok(sim.free_async(s, &t)?)
    };
    let mut reference = chain_with(3, 1, 1, &mut work);
    reference.per_runner(5);
    let mut c = chain_with(3, 1, 1, &mut work);
    assert!(c.capture_errors.is_empty(), "{:?}", c.capture_errors);
    step_launches(&mut c, 5, false).unwrap();
    c.hazard_free();
    assert_eq!(c.values(), reference.values());
    c.teardown();
}

#[test]
fn temporary_freed_before_the_cut_and_used_after_is_refused_or_harmless() {
    // Use after free of a temporary: in part 2 of the copy, and in the
    // runner's own graph.
    let c = chain_with(2, 1, 1, &mut |c, s| {
        let sim = c.sim;
        let t = sim.alloc_async(s, N)?;
        sim.launch(s, sim::Op::copy(c.count, &t), 3)?;
        sim.free_async(s, &t)?;
        if let Some((h, out)) = c.out {
            sim.launch(s, sim::Op::copy(c.count, out), 2)?;
            c.cap.ready(h, s)?;
        }
        sim.launch(s, sim::Op::copy(&t, c.own), 30)?; // freed already
        Ok(())
    });
    if c.capture_errors.is_empty() {
        let mut c = c;
        c.per_runner(2);
        step_launches(&mut c, 3, false).unwrap();
        c.hazard_free();
        c.teardown();
    } else {
        c.teardown();
    }
}

#[test]
fn second_run_allocates_only_after_the_cut_differs_from_first() {
    // First run: temporary allocated before the ready; second: after.
    let mut reference = chain_with(2, 1, 1, &mut standard);
    reference.per_runner(4);
    let mut c = chain_with(2, 1, 1, &mut |c, s| {
        let sim = c.sim;
        if c.run == 1 {
            let t = sim.alloc_async(s, N)?;
            sim.launch(s, sim::Op::add(c.one, c.count), 1)?;
            if let Some(input) = c.input {
                sim.launch(s, sim::Op::add(input, c.sink), 20)?;
            }
            if let Some((h, out)) = c.out {
                sim.launch(s, sim::Op::copy(c.count, out), 2)?;
                c.cap.ready(h, s)?;
            }
            sim.launch(s, sim::Op::copy(c.count, &t), 5)?;
            sim.launch(s, sim::Op::copy(&t, c.own), 30)?;
            Ok(sim.free_async(s, &t)?)
        } else {
            standard(c, s)
        }
    });
    if !c.capture_errors.is_empty() {
        return c.teardown();
    }
    c.per_runner(1);
    step_launches(&mut c, 2, false).unwrap();
    c.per_runner(1);
    c.hazard_free();
    assert_eq!(c.values(), reference.values());
    c.teardown();
}

#[test]
fn writing_the_handoff_after_ready_only_in_the_copy_is_refused_or_fenced() {
    // The second run writes the handoff after its ready point: in a step
    // graph, the reader starts at the ready point, so part 2 races it.
    let mut c = chain_with(2, 1, 1, &mut |c, s| {
        standard(c, s)?;
        if c.run == 2 {
            if let Some((_, out)) = c.out {
                c.sim.launch(s, sim::Op::fill(out, 99.0), 50)?;
            }
        }
        Ok(())
    });
    if !c.capture_errors.is_empty() {
        return c.teardown();
    }
    let r = step_launches(&mut c, 3, false);
    if r.is_ok() {
        c.hazard_free();
    }
    c.teardown();
}

#[test]
fn writing_the_handoff_after_ready_in_both_runs_is_refused_or_fenced() {
    let mut c = chain_with(2, 1, 1, &mut |c, s| {
        standard(c, s)?;
        if let Some((_, out)) = c.out {
            c.sim.launch(s, sim::Op::fill(out, 99.0), 50)?;
        }
        Ok(())
    });
    if !c.capture_errors.is_empty() {
        return c.teardown();
    }
    c.per_runner(2);
    c.hazard_free();
    let _ = step_launches(&mut c, 3, false);
    c.hazard_free();
    c.teardown();
}

#[test]
fn a_middle_runner_reading_its_input_after_its_own_ready_is_fenced_in_steps() {
    // Runner l reads its input in part 2 (after marking its own output
    // ready). The next step's writer of that input must wait for part 2.
    let mut work = |c: &Ctx, s: &sim::Stream| -> R {
        let sim = c.sim;
        sim.launch(s, sim::Op::add(c.one, c.count), 1)?;
        if let Some((h, out)) = c.out {
            sim.launch(s, sim::Op::copy(c.count, out), 2)?;
            c.cap.ready(h, s)?;
        }
        let t = sim.alloc_async(s, N)?;
        if let Some(input) = c.input {
            sim.launch(s, sim::Op::copy(input, &t), 40)?; // long read after ready
            sim.launch(s, sim::Op::add(&t, c.sink), 1)?;
        }
        sim.launch(s, sim::Op::copy(c.count, &t), 1)?;
        sim.launch(s, sim::Op::copy(&t, c.own), 1)?;
        Ok(sim.free_async(s, &t)?)
    };
    for overlapping in [false, true] {
        for g in [1, 2] {
            let copies = if overlapping { 2 } else { 1 };
            let mut reference = chain_with(3, g, copies, &mut work);
            reference.per_runner(6);
            let mut c = chain_with(3, g, copies, &mut work);
            assert!(c.capture_errors.is_empty(), "{:?}", c.capture_errors);
            step_launches(&mut c, 6, overlapping).unwrap();
            c.hazard_free();
            assert_eq!(
                c.values(),
                reference.values(),
                "overlapping {overlapping} g {g}"
            );
            c.teardown();
        }
    }
}

#[test]
fn nested_repeatable_capture_inside_the_work_is_refused() {
    let c = chain_with(2, 1, 1, &mut |c, s| {
        standard(c, s)?;
        if c.layer == 0 {
            let inner = c
                .cap
                .stream_capture_repeatable(s, |_s| Ok::<(), replay_arena::Error>(()));
            assert!(inner.is_err(), "nested capture accepted");
        }
        Ok(())
    });
    c.teardown();
}

#[test]
fn step_copies_zero_one_two_three_plain_and_overlapping() {
    for copies in [0usize, 1, 2, 3] {
        for overlapping in [false, true] {
            let mut reference = chain_with(3, 2, copies, &mut standard);
            reference.per_runner(2 + 4 + 2);
            let mut c = chain_with(3, 2, copies, &mut standard);
            assert!(c.capture_errors.is_empty(), "{:?}", c.capture_errors);
            c.per_runner(2);
            let res = step_launches(&mut c, 4, overlapping);
            let needed = if overlapping { 2 } else { 1 };
            if copies < needed {
                let e = res.unwrap_err();
                assert!(e.contains("copy") || e.contains("copies"), "{e}");
                c.per_runner(4);
            } else {
                res.unwrap();
                // A second step graph from the copies left, if any.
                let more = step_launches(&mut c, 0, overlapping);
                assert_eq!(
                    more.is_ok(),
                    copies >= 2 * needed,
                    "copies {copies}: {more:?}"
                );
            }
            c.per_runner(2);
            c.hazard_free();
            assert_eq!(
                c.values(),
                reference.values(),
                "copies {copies} overlapping {overlapping}"
            );
            c.teardown();
        }
    }
}

#[test]
fn dropping_a_capturing_with_temporaries_gives_graph_memory_back() {
    let sim = sim::Device::new();
    let s = sim.stream();
    {
        let planned = Discovering::from_runners(PlanConfig::new(), [(RunnerId(0), [OWN])])
            .unwrap()
            .plan(Policy::Generations(1))
            .unwrap();
        let mut capturing = planned.allocate(sim.clone()).unwrap();
        let cap = capturing.capture(RunnerId(0)).unwrap();
        let v = cap.take(OWN).unwrap();
        cap.stream_capture(&s, |s| -> R {
            let t = sim.alloc_async(s, N)?;
            sim.launch(s, sim::Op::fill(&t, 1.0), 1)?;
            sim.launch(s, sim::Op::copy(&t, &v), 1)?;
            Ok(sim.free_async(s, &t)?)
        })
        .unwrap();
        cap.finish().unwrap();
        // dropped here without seal or replan
    }
    let p = pool(&sim);
    assert_eq!((p.used, p.reserved), (0, 0), "{p:?}");
}

// ---------------------------------------------------------------------
// Whole programs over cut copies: steps, kept steps, traces, consumers,
// and a fault at every backend call.
// ---------------------------------------------------------------------

/// A program mixing every use of a plan of cut copies (3 copies each):
/// per-runner replays, a plain step graph launched on alternating
/// streams, a kept overlapping step graph, a consumer and a program
/// wait, all optionally traced. Returns the errors seen (none expected
/// without faults).
fn program(c: &mut Chain, trace: bool, forget: bool) -> Vec<String> {
    let mut errs = Vec::new();
    let layers = c.sinks.len();
    let pool = c.pool.clone();
    let side = c.sim.stream();
    let sim = c.sim.clone();
    let sink = &c.sinks[0];
    let r = c.replayable.as_mut().unwrap();
    let mut e = |x: Result<(), String>| {
        if let Err(x) = x {
            errs.push(x)
        }
    };
    for l in 0..layers {
        e(r.replay(RunnerId(l as u32), &pool[l % 2])
            .map_err(|x| x.to_string()));
    }
    if trace {
        e(r.start_trace().map_err(|x| x.to_string()));
    }
    // A plain step graph, launched on alternating streams.
    let built = {
        let mut step = r.step();
        let mut ok = true;
        for l in 0..layers {
            if let Err(x) = step.replay(RunnerId(l as u32), &pool[l % 2]) {
                e(Err(x.to_string()));
                ok = false;
            }
        }
        if let Err(x) = step.consume(RunnerId(layers as u32 - 1), &side, |s, v| {
            sim.launch(s, sim::Op::add(&v[0], sink), 3)
        }) {
            e(Err(x.to_string()));
            ok = false;
        }
        if ok {
            match step.build() {
                Ok(mut g) => {
                    for k in 0..3 {
                        e(g.launch(&pool[k % 2]).map_err(|x| x.to_string()));
                    }
                    if forget {
                        std::mem::forget(g);
                    }
                    true
                }
                Err(x) => {
                    e(Err(x.to_string()));
                    false
                }
            }
        } else {
            false
        }
    };
    let _ = built;
    // Per-runner replays between.
    for l in 0..layers {
        e(r.replay(RunnerId(l as u32), &pool[(l + 1) % 2])
            .map_err(|x| x.to_string()));
    }
    // A kept overlapping step graph.
    let mut kept = {
        let mut step = r.step();
        let mut ok = true;
        for l in 0..layers {
            if let Err(x) = step.replay(RunnerId(l as u32), &pool[l % 2]) {
                e(Err(x.to_string()));
                ok = false;
            }
        }
        if ok {
            match step.build_overlapping() {
                Ok(g) => Some(g.keep()),
                Err(x) => {
                    e(Err(x.to_string()));
                    None
                }
            }
        } else {
            None
        }
    };
    if let Some(k) = kept.as_mut() {
        for i in 0..3 {
            e(r.launch_kept(k, &pool[i % 2]).map_err(|x| x.to_string()));
        }
    }
    e(r.consume(RunnerId(layers as u32 - 1), &side, |s, v| {
        sim.launch(s, sim::Op::add(&v[0], sink), 7)
    })
    .map_err(|x| x.to_string()));
    e(r.wait_for(RunnerId(1), &side).map_err(|x| x.to_string()));
    if trace {
        match r.finish_trace() {
            Ok(t) => {
                // Every node sits inside its launch.
                for node in t.step_nodes() {
                    let p = &t.slices()[node.parent.expect("node without parent")];
                    assert!(node.start_us >= p.start_us && node.end_us <= p.end_us);
                }
            }
            Err(x) => e(Err(x.to_string())),
        }
    }
    if let Some(k) = kept.as_mut() {
        e(r.launch_kept(k, &pool[1]).map_err(|x| x.to_string()));
    }
    for l in 0..layers {
        e(r.replay(RunnerId(l as u32), &pool[l % 2])
            .map_err(|x| x.to_string()));
    }
    if forget {
        std::mem::forget(kept);
    } else {
        drop(kept);
    }
    e(r.synchronize().map_err(|x| x.to_string()));
    errs
}

#[test]
fn a_whole_program_over_cut_copies_is_hazard_free_traced_or_not() {
    for trace in [false, true] {
        let mut c = chain_with(3, 2, 3, &mut standard);
        assert!(c.capture_errors.is_empty(), "{:?}", c.capture_errors);
        let errs = program(&mut c, trace, false);
        assert!(errs.is_empty(), "{errs:?}");
        c.hazard_free();
        // Same values traced and untraced.
        c.teardown();
    }
    let mut a = chain_with(3, 2, 3, &mut standard);
    let mut b = chain_with(3, 2, 3, &mut standard);
    program(&mut a, false, false);
    program(&mut b, true, false);
    assert_eq!(a.values(), b.values());
}

#[test]
fn forgetting_step_graphs_and_kept_steps_over_cut_copies_is_fenced() {
    for trace in [false, true] {
        let mut c = chain_with(3, 2, 3, &mut standard);
        let errs = program(&mut c, trace, true);
        assert!(errs.is_empty(), "{errs:?}");
        c.per_runner(2);
        c.hazard_free();
        let sim = c.sim.clone();
        c.replayable.take();
        assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
        // Forgotten graphs may keep their memory, but nothing they use
        // may have been freed under them: no hazard after teardown.
    }
}

fn fault_sweep(trace: bool, every: u64) {
    let probe = sim::Device::new();
    probe.inject(Faults::none());
    let mut c = chain_faulty(probe.clone(), 3, 2, 3, &mut standard, Some(Faults::none()));
    let errs = program(&mut c, trace, false);
    assert!(errs.is_empty(), "{errs:?}");
    c.teardown();
    let calls = probe.fault_log().calls;
    assert!(calls > 50, "{calls}");
    let mut n = 0;
    while n < calls {
        let sim = sim::Device::new();
        let mut c = chain_faulty(sim.clone(), 3, 2, 3, &mut standard, Some(Faults::at(n)));
        let injected = || sim.fault_log().injected.clone();
        if c.replayable.is_some() {
            let _ = catch_unwind(AssertUnwindSafe(|| program(&mut c, trace, false)))
                .unwrap_or_else(|_| panic!("panic in library at call {n}: {:?}", injected()));
        }
        assert!(
            sim.hazards().is_empty(),
            "fault at {n} {:?}: {:?}",
            injected(),
            sim.hazards()
        );
        let inj = injected();
        sim.inject(Faults::none());
        let ok = catch_unwind(AssertUnwindSafe(|| c.teardown()));
        assert!(ok.is_ok(), "teardown after fault at {n}: {inj:?}");
        assert_eq!(sim.live_events(), 0, "events leaked, fault at {n}: {inj:?}");
        assert_eq!(
            sim.live_allocations(),
            0,
            "allocations leaked, fault at {n}: {inj:?}"
        );
        n += every;
    }
}

#[test]
fn a_fault_at_any_call_of_an_untraced_program_over_cut_copies() {
    fault_sweep(false, 1);
}

#[test]
fn a_fault_at_any_call_of_a_traced_program_over_cut_copies() {
    fault_sweep(true, 1);
}

// ---------------------------------------------------------------------
// 2. Traced step graphs
// ---------------------------------------------------------------------

/// Work that allocates nothing: its graph is copied into step graphs,
/// so traced launches compose a traced copy.
fn plain(c: &Ctx, s: &sim::Stream) -> R {
    let sim = c.sim;
    sim.launch(s, sim::Op::add(c.one, c.count), 1)?;
    if let Some(input) = c.input {
        sim.launch(s, sim::Op::add(input, c.sink), 20)?;
    }
    if let Some((h, out)) = c.out {
        sim.launch(s, sim::Op::copy(c.count, out), 2)?;
        c.cap.ready(h, s)?;
    }
    sim.launch(s, sim::Op::copy(c.count, c.own), 30)?;
    Ok(())
}

fn kept_of(c: &mut Chain, overlapping: bool) -> replay_arena::KeptStep<sim::Device> {
    let layers = c.sinks.len();
    let pool = c.pool.clone();
    let r = c.r();
    let mut step = r.step();
    for l in 0..layers {
        step.replay(RunnerId(l as u32), &pool[l % 2]).unwrap();
    }
    let g = if overlapping {
        step.build_overlapping()
    } else {
        step.build()
    };
    g.unwrap().keep()
}

#[test]
fn kept_steps_launched_traced_and_untraced_alternately_on_two_streams() {
    for work in [plain as fn(&Ctx, &sim::Stream) -> R, standard] {
        for overlapping in [false, true] {
            let copies = 2;
            let mut reference = chain_with(4, 2, copies, &mut |c, s| work(c, s));
            reference.per_runner(12);
            let mut c = chain_with(4, 2, copies, &mut |c, s| work(c, s));
            let mut kept = kept_of(&mut c, overlapping);
            let pool = c.pool.clone();
            let third = c.sim.stream();
            let r = c.r();
            let mut traces = Vec::new();
            for k in 0..12 {
                match k % 4 {
                    0 => r.start_trace().unwrap(),
                    2 => traces.push(r.finish_trace().unwrap()),
                    _ => {}
                }
                let s = [&pool[0], &pool[1], &third][k % 3];
                r.launch_kept(&mut kept, s).unwrap();
            }
            // A trace left running when the plan goes.
            r.start_trace().unwrap();
            r.launch_kept(&mut kept, &pool[1]).unwrap();
            drop(kept);
            c.hazard_free();
            for t in &traces {
                for node in t.step_nodes() {
                    let p = &t.slices()[node.parent.unwrap()];
                    assert!(node.start_us >= p.start_us && node.end_us <= p.end_us);
                }
            }
            reference.per_runner(1);
            assert_eq!(c.values(), reference.values(), "overlapping {overlapping}");
            c.r().replay(RunnerId(0), &pool[0]).unwrap();
            c.teardown();
        }
    }
}

#[test]
fn traced_kept_step_values_equal_untraced() {
    for overlapping in [false, true] {
        let mut vals = Vec::new();
        for trace in [false, true] {
            let mut c = chain_with(4, 2, 2, &mut plain);
            let mut kept = kept_of(&mut c, overlapping);
            let pool = c.pool.clone();
            let r = c.r();
            if trace {
                r.start_trace().unwrap();
            }
            for k in 0..6 {
                r.launch_kept(&mut kept, &pool[k % 2]).unwrap();
                if k == 3 && trace {
                    // restart while launches are in flight
                    r.start_trace().unwrap();
                }
            }
            if trace {
                let t = r.finish_trace().unwrap();
                assert!(!t.step_nodes().is_empty());
            }
            drop(kept);
            c.hazard_free();
            vals.push(c.values());
            c.teardown();
        }
        assert_eq!(vals[0], vals[1], "overlapping {overlapping}");
    }
}

#[test]
fn a_fault_at_any_call_of_traced_kept_launches_of_copied_graphs() {
    // Count the calls of the launches alone, then fail each.
    let run = |faults: Option<Faults>| -> (Chain, u64) {
        let mut c = chain_with(4, 2, 2, &mut plain);
        let mut kept = kept_of(&mut c, true);
        let pool = c.pool.clone();
        let sim = c.sim.clone();
        let r = c.r();
        r.start_trace().unwrap();
        if let Some(f) = faults {
            sim.inject(f);
        } else {
            sim.inject(Faults::none());
        }
        for k in 0..4 {
            let _ = r.launch_kept(&mut kept, &pool[k % 2]);
            if k == 1 {
                let _ = r.finish_trace();
                let _ = r.start_trace();
            }
        }
        let _ = r.replay(RunnerId(0), &pool[1]);
        let _ = r.finish_trace();
        let calls = sim.fault_log().calls;
        sim.inject(Faults::none());
        drop(kept);
        (c, calls)
    };
    let (c, calls) = run(None);
    c.hazard_free();
    c.teardown();
    for n in 0..calls {
        let (c, _) = run(Some(Faults::at(n)));
        assert!(
            c.sim.hazards().is_empty(),
            "fault at {n}: {:?}",
            c.sim.hazards()
        );
        c.teardown();
    }
}

// ---------------------------------------------------------------------
// 3. Backend roles from safe code
// ---------------------------------------------------------------------

#[test]
fn a_capture_begun_by_the_program_blocks_every_fenced_launch_on_that_stream() {
    let mut c = chain_with(3, 2, 2, &mut standard);
    let mut kept = kept_of(&mut c, false);
    let pool = c.pool.clone();
    let sim = c.sim.clone();
    let s = sim.stream();
    sim.begin_capture(&s).unwrap(); // safe
    let r = c.r();
    assert!(r.replay(RunnerId(0), &s).is_err());
    assert!(r.launch_kept(&mut kept, &s).is_err());
    assert!(r.wait_for(RunnerId(0), &s).is_err());
    assert!(r.wait_all(&s).is_err());
    let consumed = r.consume(RunnerId(0), &s, |s, v| {
        sim.launch(s, sim::Op::scale(&v[0], 2.0), 1)
    });
    assert!(consumed.is_err());
    // The plan goes on elsewhere.
    r.launch_kept(&mut kept, &pool[0]).unwrap();
    r.replay(RunnerId(0), &pool[1]).unwrap();
    drop(kept);
    c.hazard_free();
    c.teardown();
}

#[test]
fn a_capture_begun_inside_a_consumer_closure_is_refused_or_harmless() {
    let mut c = chain_with(2, 1, 1, &mut plain);
    let pool = c.pool.clone();
    let sim = c.sim.clone();
    let side = sim.stream();
    let sink = sim.alloc_f32(N).unwrap();
    let r = c.r();
    r.replay(RunnerId(0), &pool[0]).unwrap();
    let res = r.consume(RunnerId(0), &side, |s, v| -> R {
        sim.begin_capture(s)?; // the consumer's stream now captures
        sim.launch(s, sim::Op::add(&v[0], &sink), 50)?;
        Ok(())
    });
    // Refused: the fence cannot record its event into the program's capture.
    assert!(
        res.is_err(),
        "a consumer whose stream was captured away was counted"
    );
    // Whatever happened, the next writer must not overlap the consumer,
    // and the plan must still work on other streams.
    let _ = r.replay(RunnerId(0), &pool[1]);
    let _ = r.replay(RunnerId(1), &pool[0]);
    let _ = r.replay(RunnerId(0), &pool[0]);
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    let p = catch_unwind(AssertUnwindSafe(|| c.teardown()));
    assert!(p.is_ok());
}

#[test]
fn a_capture_begun_inside_a_step_consumer_closure_is_refused_or_harmless() {
    let mut c = chain_with(2, 1, 1, &mut plain);
    let pool = c.pool.clone();
    let sim = c.sim.clone();
    let side = sim.stream();
    let sink = sim.alloc_f32(N).unwrap();
    let r = c.r();
    let mut step = r.step();
    step.replay(RunnerId(0), &pool[0]).unwrap();
    let res = step.consume(RunnerId(0), &side, |s, v| -> R {
        let _ = sim.begin_capture(s); // already capturing: refused
        sim.launch(s, sim::Op::add(&v[0], &sink), 50)?;
        Ok(())
    });
    let _ = res;
    step.replay(RunnerId(1), &pool[1]).unwrap();
    if let Ok(mut g) = step.build() {
        for k in 0..3 {
            let _ = g.launch(&pool[k % 2]);
        }
    }
    assert!(!sim.is_capturing(&side).unwrap());
    r.replay(RunnerId(0), &pool[1]).unwrap();
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    c.teardown();
}

#[test]
fn a_capture_begun_on_another_stream_and_ready_there_in_the_copy_run() {
    let c = chain_with(2, 1, 1, &mut |c, s| {
        if c.run == 2 {
            if let Some((h, out)) = c.out {
                c.sim.launch(s, sim::Op::copy(c.count, out), 2)?;
                let o = c.sim.stream();
                c.sim.begin_capture(&o)?;
                let r = c.cap.ready(h, &o);
                assert!(r.is_err(), "ready accepted on a foreign capture");
                r?;
            }
        }
        standard(c, s)
    });
    assert!(!c.capture_errors.is_empty());
    c.teardown();
}

#[test]
fn a_program_event_record_node_before_the_ready_point() {
    // The program's own event record node beside the plan's: the cut and
    // split must still happen at the plan's ready point.
    let ev = std::cell::RefCell::new(Vec::new());
    let mut work = |c: &Ctx, s: &sim::Stream| -> R {
        let e = c.sim.create_event()?;
        c.sim.record_event_node(s, &e)?;
        ev.borrow_mut().push(e);
        standard(c, s)
    };
    let mut reference = chain_with(3, 2, 1, &mut standard);
    reference.per_runner(5);
    let mut c = chain_with(3, 2, 1, &mut work);
    assert!(c.capture_errors.is_empty(), "{:?}", c.capture_errors);
    step_launches(&mut c, 5, false).unwrap();
    c.hazard_free();
    assert_eq!(c.values(), reference.values());
    c.teardown();
}

#[test]
fn trimming_graph_memory_while_step_copies_are_held_keeps_them_valid() {
    let mut reference = chain_with(3, 2, 2, &mut standard);
    reference.per_runner(1 + 3 + 3 + 1);
    let mut c = chain_with(3, 2, 2, &mut standard);
    c.sim.trim_graph_memory().unwrap(); // safe, any time
    c.per_runner(1);
    c.sim.trim_graph_memory().unwrap();
    step_launches(&mut c, 3, false).unwrap();
    c.sim.trim_graph_memory().unwrap();
    step_launches(&mut c, 3, false).unwrap();
    c.per_runner(1);
    c.hazard_free();
    assert_eq!(c.values(), reference.values());
    c.teardown();
}

#[test]
fn composing_a_plans_graph_with_temporaries_from_safe_code_is_refused() {
    use replay_arena::{Compose, NodeGraph, StepNode};
    let c = chain_with(2, 1, 1, &mut standard);
    let r = c.replayable.as_ref().unwrap();
    let g = r.graph(RunnerId(0)).unwrap();
    let composed = c
        .sim
        .compose(vec![StepNode::new(NodeGraph::Copy(g), vec![], 0)], None);
    assert!(composed.is_err(), "a graph with temporaries was copied");
    // The plan still replays.
    let mut c = c;
    c.per_runner(2);
    c.hazard_free();
    c.teardown();
}

/// Runner 0 writes two handoffs, read by runners 1 and 2; `order(run)`
/// gives the order runner 0 writes and marks them in each run.
fn two_handoffs(
    order: impl Fn(usize) -> [usize; 2],
    copies: usize,
) -> (
    sim::Device,
    Result<Replayable<sim::Device>, String>,
    [sim::Stream; 3],
    [sim::HostBuffer; 2],
) {
    let mut d = Discovering::new(PlanConfig::new());
    let hs = {
        let mut a = d.arm(RunnerId(0)).unwrap();
        a.record(OWN).unwrap();
        [a.hand_off(GRAD).unwrap(), a.hand_off(GRAD).unwrap()]
    };
    for i in 0..2 {
        let mut a = d.arm(RunnerId(1 + i as u32)).unwrap();
        a.record(OWN).unwrap();
        a.receive(hs[i]).unwrap();
    }
    let sim = sim::Device::new();
    let streams = [sim.stream(), sim.stream(), sim.stream()];
    let one = sim.alloc_f32(N).unwrap();
    sim.write_f32(&one, &[1.0; N]).unwrap();
    let count = sim.alloc_f32(N).unwrap();
    let mut capturing = d
        .plan(Policy::Generations(1))
        .unwrap()
        .allocate(sim.clone())
        .unwrap();
    let mut errs = Vec::new();
    {
        let cap = capturing.capture(RunnerId(0)).unwrap();
        cap.step_copies(copies);
        let own = cap.take(OWN).unwrap();
        let outs = [cap.hand_off(hs[0]).unwrap(), cap.hand_off(hs[1]).unwrap()];
        let mut run = 0;
        let res = cap.stream_capture_repeatable(&streams[0], |s| -> R {
            run += 1;
            sim.launch(s, sim::Op::add(&one, &count), 1)?;
            let t = sim.alloc_async(s, N)?;
            sim.launch(s, sim::Op::copy(&count, &t), 1)?;
            for (k, &i) in order(run).iter().enumerate() {
                // the second handoff written is slow
                sim.launch(s, sim::Op::copy(&t, &outs[i]), if k == 0 { 2 } else { 60 })?;
                cap.ready(hs[i], s)?;
            }
            sim.launch(s, sim::Op::copy(&t, &own), 5)?;
            Ok(sim.free_async(s, &t)?)
        });
        if let Err(e) = res {
            errs.push(e.to_string());
        }
        if let Err(e) = cap.finish() {
            errs.push(e.to_string());
        }
    }
    for i in 0..2usize {
        let cap = capturing.capture(RunnerId(1 + i as u32)).unwrap();
        let own = cap.take(OWN).unwrap();
        let input = cap.receive(hs[i]).unwrap();
        cap.stream_capture(&streams[0], |s| {
            sim.launch(s, sim::Op::copy(&input, &own), 3)
        })
        .unwrap();
        cap.finish().unwrap();
    }
    let r = if errs.is_empty() {
        capturing.seal().map_err(|e| e.to_string())
    } else {
        drop(capturing.replan());
        Err(errs.join("; "))
    };
    (sim, r, streams, [count, one])
}

#[test]
fn a_copy_run_marking_two_handoffs_in_another_order_is_refused_or_fenced() {
    for overlapping in [false, true] {
        let copies = if overlapping { 2 } else { 1 };
        let (sim, r, streams, _count) =
            two_handoffs(|run| if run == 1 { [0, 1] } else { [1, 0] }, copies);
        match r {
            Err(e) => {
                assert!(e.contains("ready") || e.contains("differ"), "{e}");
            }
            Ok(mut r) => {
                launch_three(&mut r, &streams, overlapping);
                r.synchronize().unwrap();
                assert!(
                    sim.hazards().is_empty(),
                    "overlapping {overlapping}: {:?}",
                    sim.hazards()
                );
                // Runners 1 and 2 copied runner 0's count (4 launches).
                for i in 1..3u32 {
                    let v = sim.read_f32(&r.views(RunnerId(i)).unwrap()[0]).unwrap();
                    assert_eq!(v[0], 4.0, "reader {i} overlapping {overlapping}");
                }
                drop(r);
            }
        }
        let p = pool(&sim);
        assert_eq!((p.used, p.reserved), (0, 0));
    }
}

/// Runners 0, 1 and 2 replayed on their own streams in one step graph (or
/// two overlapping), launched 4 times on the streams in turn.
fn launch_three(r: &mut Replayable<sim::Device>, streams: &[sim::Stream], overlapping: bool) {
    let mut step = r.step();
    for i in 0..3u32 {
        step.replay(RunnerId(i), &streams[i as usize]).unwrap();
    }
    let mut g = if overlapping {
        step.build_overlapping()
    } else {
        step.build()
    }
    .unwrap();
    for k in 0..4 {
        g.launch(&streams[k % 3]).unwrap();
    }
}

#[test]
fn two_handoffs_in_the_same_order_give_right_values_in_step_graphs() {
    for order in [[0, 1], [1, 0]] {
        for overlapping in [false, true] {
            let copies = if overlapping { 2 } else { 1 };
            let (sim, r, streams, _count) = two_handoffs(move |_| order, copies);
            let mut r = r.unwrap();
            launch_three(&mut r, &streams, overlapping);
            for i in 0..3u32 {
                r.replay(RunnerId(i), &streams[(i as usize + 1) % 3])
                    .unwrap();
            }
            r.synchronize().unwrap();
            assert!(
                sim.hazards().is_empty(),
                "{order:?} {overlapping}: {:?}",
                sim.hazards()
            );
            for i in 1..3u32 {
                let v = sim.read_f32(&r.views(RunnerId(i)).unwrap()[0]).unwrap();
                assert_eq!(v[0], 5.0, "reader {i} {order:?} overlapping {overlapping}");
            }
            drop(r);
            let p = pool(&sim);
            assert_eq!((p.used, p.reserved), (0, 0));
        }
    }
}

#[test]
fn consumers_after_a_step_launch_wait_for_the_part_after_the_cut() {
    // Runner 0's own view is written after its ready point (part 2 of
    // its copy, 30 ticks); a consumer of runner 0 after the launch, and
    // one inside the step, must wait for part 2.
    for inside in [false, true] {
        for write in [false, true] {
            let mut c = chain_with(2, 2, 2, &mut standard);
            let pool = c.pool.clone();
            let sim = c.sim.clone();
            let side = sim.stream();
            let sink = sim.alloc_f32(N).unwrap();
            {
                let r = c.r();
                let mut step = r.step();
                step.replay(RunnerId(0), &pool[0]).unwrap();
                if inside {
                    if write {
                        step.consume_mut(RunnerId(0), &side, |s, v| -> R {
                            for x in v {
                                sim.launch(s, sim::Op::scale(x, 1.0), 1)?;
                            }
                            Ok(())
                        })
                        .unwrap();
                    } else {
                        step.consume(RunnerId(0), &side, |s, v| -> R {
                            for x in v {
                                sim.launch(s, sim::Op::add(x, &sink), 1)?;
                            }
                            Ok(())
                        })
                        .unwrap();
                    }
                }
                step.replay(RunnerId(1), &pool[1]).unwrap();
                let mut g = step.build().unwrap();
                for k in 0..3 {
                    g.launch(&pool[k % 2]).unwrap();
                }
            }
            let r = c.r();
            if write {
                r.consume_mut(RunnerId(0), &side, |s, v| -> R {
                    for x in v {
                        sim.launch(s, sim::Op::scale(x, 1.0), 1)?;
                    }
                    Ok(())
                })
                .unwrap();
            } else {
                r.consume(RunnerId(0), &side, |s, v| -> R {
                    for x in v {
                        sim.launch(s, sim::Op::add(x, &sink), 1)?;
                    }
                    Ok(())
                })
                .unwrap();
            }
            r.replay(RunnerId(0), &pool[1]).unwrap();
            r.replay(RunnerId(1), &pool[0]).unwrap();
            assert!(
                sim.hazards().is_empty(),
                "inside {inside} write {write}: {:?}",
                sim.hazards()
            );
            drop(sink);
            c.teardown();
        }
    }
}

#[test]
fn reading_the_handoff_after_ready_in_the_copy_is_refused_or_fenced() {
    let mut c = chain_with(2, 1, 1, &mut |c, s| {
        standard(c, s)?;
        if c.run == 2 {
            if let Some((_, out)) = c.out {
                c.sim.launch(s, sim::Op::copy(out, c.own), 50)?;
            }
        }
        Ok(())
    });
    if c.capture_errors.is_empty() {
        let _ = step_launches(&mut c, 3, false);
        c.per_runner(1);
        c.hazard_free();
    }
    c.teardown();
}

#[test]
fn kept_cut_steps_outliving_a_replan_with_a_trace_running() {
    let mut c = chain_with(3, 2, 3, &mut standard);
    let mut kept = kept_of(&mut c, true);
    let mut plain_kept = kept_of(&mut c, false);
    let lanes = c.pool.clone();
    let sim = c.sim.clone();
    let r = c.replayable.take().unwrap();
    let mut r = r;
    r.start_trace().unwrap();
    r.launch_kept(&mut kept, &lanes[0]).unwrap();
    r.launch_kept(&mut plain_kept, &lanes[1]).unwrap();
    r.launch_kept(&mut kept, &lanes[1]).unwrap();
    let d = r.replan().unwrap();
    drop(d);
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    // A second plan on the same device: the old kept step is refused.
    let mut c2 = chain_on(sim.clone(), 3, 2, 1, &mut standard);
    let r2 = c2.r();
    assert!(r2.launch_kept(&mut kept, &lanes[0]).is_err());
    drop(kept);
    drop(plain_kept);
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    c2.teardown();
    drop(c);
    let p = pool(&sim);
    assert_eq!((p.used, p.reserved), (0, 0), "{p:?}");
}

#[test]
fn dropping_a_builder_or_a_failed_build_keeps_the_step_copies() {
    let mut c = chain_with(3, 2, 1, &mut standard);
    let pool = c.pool.clone();
    let sim = c.sim.clone();
    let r = c.r();
    {
        let mut step = r.step();
        for l in 0..3u32 {
            step.replay(RunnerId(l), &pool[l as usize % 2]).unwrap();
        }
        // dropped unbuilt
    }
    for l in 0..3u32 {
        assert_eq!(r.temporaries(RunnerId(l)).unwrap().1, 1);
    }
    // A build failing on a backend fault while composing.
    {
        let mut step = r.step();
        for l in 0..3u32 {
            step.replay(RunnerId(l), &pool[l as usize % 2]).unwrap();
        }
        sim.inject(Faults::nth(Call::Compose, 0));
        let e = step.build();
        sim.inject(Faults::none());
        assert!(matches!(e, Err(StepError::Backend(_))), "{:?}", e.err());
    }
    // Copies lost or kept, the count is consistent with what builds do.
    let left: Vec<usize> = (0..3u32)
        .map(|l| r.temporaries(RunnerId(l)).unwrap().1)
        .collect();
    let mut step = r.step();
    let mut ok = true;
    for l in 0..3u32 {
        let res = step.replay(RunnerId(l), &pool[l as usize % 2]);
        if left[l as usize] == 0 {
            assert!(
                matches!(res, Err(StepError::NoStepCopy { .. })),
                "{l}: {:?}",
                res.err()
            );
            ok = false;
        } else {
            res.unwrap();
        }
    }
    if ok {
        let mut g = step.build().unwrap();
        g.launch(&pool[0]).unwrap();
    } else {
        drop(step);
    }
    c.per_runner(2);
    c.hazard_free();
    c.teardown();
}

#[test]
fn capture_errors_are_typed() {
    // The copy run failing is reported as the closure's error; a
    // RepeatDiffers as a capture error.
    let c = chain_with(2, 1, 1, &mut |c, s| {
        if c.run == 2 && c.layer == 0 {
            return Err(injected());
        }
        standard(c, s)
    });
    assert!(c.capture_errors.iter().any(|e| e.contains("closure fails")));
    c.teardown();
    let _ = (
        CaptureError::NestedCapture {
            runner: RunnerId(0),
        },
        StreamCaptureError::<replay_arena::Error>::Capture(CaptureError::NestedCapture {
            runner: RunnerId(0),
        }),
    );
}

#[test]
fn splitting_a_plans_graph_with_temporaries_from_safe_code_leaves_it_intact() {
    use replay_arena::Compose;
    // The program records its own event node inside a runner's graph that
    // allocates, then splits the plan's graph there (safe) and drops the
    // parts: the plan's graph must keep its temporaries.
    let evs = std::cell::RefCell::new(Vec::new());
    let mut reference = chain_with(2, 1, 1, &mut standard);
    reference.per_runner(4);
    let mut c = chain_with(2, 1, 1, &mut |c, s| {
        let sim = c.sim;
        let t = sim.alloc_async(s, N)?;
        sim.launch(s, sim::Op::add(c.one, c.count), 1)?;
        if let Some(input) = c.input {
            sim.launch(s, sim::Op::add(input, c.sink), 20)?;
        }
        if let Some((h, out)) = c.out {
            sim.launch(s, sim::Op::copy(c.count, out), 2)?;
            c.cap.ready(h, s)?;
        }
        sim.launch(s, sim::Op::copy(c.count, &t), 5)?;
        let e = sim.create_event()?;
        sim.record_event_node(s, &e)?; // between the temporary's uses
        evs.borrow_mut().push(e);
        sim.launch(s, sim::Op::copy(&t, c.own), 30)?;
        Ok(sim.free_async(s, &t)?)
    });
    assert!(c.capture_errors.is_empty(), "{:?}", c.capture_errors);
    let before = pool(&c.sim);
    {
        let r = c.replayable.as_ref().unwrap();
        let evs = evs.borrow();
        for l in 0..2u32 {
            let g = r.graph(RunnerId(l)).unwrap();
            for e in evs.iter() {
                let split = c.sim.split_graph(g, &[e]);
                if let Ok((a, b, _)) = split {
                    drop(a);
                    drop(b);
                }
            }
        }
    }
    let after = pool(&c.sim);
    assert_eq!(before.used, after.used, "{before:?} -> {after:?}");
    c.per_runner(2);
    step_launches(&mut c, 2, false).unwrap();
    c.hazard_free();
    assert_eq!(c.values(), reference.values());
    c.teardown();
}

#[test]
fn a_trace_capacity_beyond_memory_is_a_typed_error_not_a_panic() {
    let mut c = chain_with(2, 1, 1, &mut plain);
    let mut r = c.replayable.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let res = catch_unwind(AssertUnwindSafe(|| {
            r.start_trace_with_capacity(usize::MAX).is_err()
        }));
        let _ = tx.send(res.ok());
        drop(r);
    });
    // Give it a few seconds: a typed error needs no time at all.
    match rx.recv_timeout(std::time::Duration::from_secs(3)) {
        Ok(Some(true)) => {}
        Ok(Some(false)) => panic!("an impossible capacity was accepted"),
        Ok(None) => panic!("the library panicked"),
        Err(_) => {
            // Still allocating: stop the process before it exhausts memory.
            eprintln!("start_trace_with_capacity(usize::MAX) did not return within 3 s");
            std::process::exit(101);
        }
    }
}

#[test]
fn a_cut_runner_replayed_twice_in_one_step_graph() {
    for overlapping in [false, true] {
        let copies = if overlapping { 4 } else { 2 };
        let mut reference = chain_with(2, 2, copies, &mut standard);
        reference.per_runner(6);
        let mut c = chain_with(2, 2, copies, &mut standard);
        let pool = c.pool.clone();
        {
            let r = c.r();
            let mut step = r.step();
            for _ in 0..2 {
                step.replay(RunnerId(0), &pool[0]).unwrap();
                step.replay(RunnerId(1), &pool[1]).unwrap();
            }
            let mut g = if overlapping {
                step.build_overlapping()
            } else {
                step.build()
            }
            .unwrap();
            for k in 0..3 {
                g.launch(&pool[k % 2]).unwrap();
            }
        }
        c.hazard_free();
        assert_eq!(c.values(), reference.values(), "overlapping {overlapping}");
        c.teardown();
    }
}

#[test]
fn a_step_graph_mixing_cut_copies_and_copied_graphs_traced() {
    // Runner 0 allocates (a cut copy moves in), runner 1 does not (its
    // graph is copied): traced and untraced launches agree.
    let mut vals = Vec::new();
    for trace in [false, true] {
        let mut c = chain_with(3, 2, 1, &mut |c, s| {
            if c.layer == 1 {
                plain(c, s)
            } else {
                standard(c, s)
            }
        });
        let pool = c.pool.clone();
        let sim = c.sim.clone();
        let side = sim.stream();
        let sink = sim.alloc_f32(N).unwrap();
        let r = c.r();
        if trace {
            r.start_trace().unwrap();
        }
        {
            let mut step = r.step();
            for l in 0..3u32 {
                step.replay(RunnerId(l), &pool[l as usize % 2]).unwrap();
                step.consume(RunnerId(l), &side, |s, v| {
                    sim.launch(s, sim::Op::add(&v[0], &sink), 4)
                })
                .unwrap();
            }
            let mut g = step.build().unwrap();
            for k in 0..4 {
                g.launch(&pool[k % 2]).unwrap();
            }
        }
        if trace {
            let t = r.finish_trace().unwrap();
            for node in t.step_nodes() {
                let p = &t.slices()[node.parent.unwrap()];
                assert!(node.start_us >= p.start_us && node.end_us <= p.end_us);
            }
        }
        c.hazard_free();
        let mut v = c.values();
        v.push(sim.read_f32(&sink).unwrap());
        vals.push(v);
        drop(sink);
        c.teardown();
    }
    assert_eq!(vals[0], vals[1]);
}

/// The work of run `bad` differs from the others in the way `how` says.
fn differing_run(bad: usize, how: u8) -> impl FnMut(&Ctx, &sim::Stream) -> R {
    move |c: &Ctx, s: &sim::Stream| -> R {
        if c.run != bad || c.out.is_none() {
            return standard(c, s);
        }
        let sim = c.sim;
        let (h, out) = c.out.unwrap();
        sim.launch(s, sim::Op::add(c.one, c.count), 1)?;
        if let Some(input) = c.input {
            sim.launch(s, sim::Op::add(input, c.sink), 20)?;
        }
        let t = sim.alloc_async(s, N)?;
        match how {
            // no ready point at all
            0 => sim.launch(s, sim::Op::copy(c.count, out), 2)?,
            // ready before the write
            1 => {
                c.cap.ready(h, s)?;
                sim.launch(s, sim::Op::copy(c.count, out), 2)?;
            }
            // ready twice
            2 => {
                sim.launch(s, sim::Op::copy(c.count, out), 2)?;
                c.cap.ready(h, s)?;
                c.cap.ready(h, s)?;
            }
            // the write moved after the temporary's slow use
            _ => {
                sim.launch(s, sim::Op::copy(c.count, &t), 5)?;
                sim.launch(s, sim::Op::copy(&t, out), 40)?;
                c.cap.ready(h, s)?;
            }
        }
        sim.launch(s, sim::Op::copy(c.count, &t), 5)?;
        sim.launch(s, sim::Op::copy(&t, c.own), 30)?;
        Ok(sim.free_async(s, &t)?)
    }
}

#[test]
fn a_later_step_copy_run_that_differs_is_refused_or_fenced() {
    for bad in [2usize, 3, 4] {
        for how in 0..4u8 {
            let mut reference = chain_with(3, 2, 3, &mut standard);
            reference.per_runner(3);
            let mut w = differing_run(bad, how);
            let mut c = chain_with(3, 2, 3, &mut w);
            if !c.capture_errors.is_empty() {
                assert!(c.replayable.is_none());
                c.teardown();
                continue;
            }
            for _ in 0..3 {
                step_launches(&mut c, 1, false).unwrap();
            }
            c.hazard_free();
            if how == 3 {
                // same values: the write only moved
                assert_eq!(c.values(), reference.values(), "run {bad} how {how}");
            }
            c.teardown();
        }
    }
}

#[test]
fn a_later_copy_using_an_earlier_copys_temporary_is_refused() {
    // Run 3 (the second step copy) uses the temporary of run 2 (the
    // first step copy), before or after the cut.
    for after_cut in [false, true] {
        for from_run in [1usize, 2] {
            let kept: std::cell::RefCell<Vec<sim::Span>> = std::cell::RefCell::new(Vec::new());
            let mut c = chain_with(2, 1, 2, &mut |c, s| -> R {
                let sim = c.sim;
                let t = sim.alloc_async(s, N)?;
                sim.launch(s, sim::Op::add(c.one, c.count), 1)?;
                if let Some(input) = c.input {
                    sim.launch(s, sim::Op::add(input, c.sink), 20)?;
                }
                let use_old = |s: &sim::Stream| -> R {
                    if c.run == 3 {
                        let old = kept.borrow()[from_run - 1];
                        sim.launch(s, sim::Op::copy(c.count, &old), 1)?;
                    }
                    Ok(())
                };
                if !after_cut {
                    use_old(s)?;
                }
                if let Some((h, out)) = c.out {
                    sim.launch(s, sim::Op::copy(c.count, out), 2)?;
                    c.cap.ready(h, s)?;
                }
                if after_cut {
                    use_old(s)?;
                }
                sim.launch(s, sim::Op::copy(c.count, &t), 5)?;
                sim.launch(s, sim::Op::copy(&t, c.own), 30)?;
                sim.free_async(s, &t)?;
                if c.layer == 0 {
                    kept.borrow_mut().push(t);
                }
                Ok(())
            });
            if c.capture_errors.iter().any(|e| e.contains("runner 0")) {
                c.teardown();
                continue;
            }
            // Accepted: use the copies one step graph at a time, the first
            // dropped (its temporaries freed) before the second runs.
            step_launches(&mut c, 2, false).unwrap();
            c.r().trim_graph_memory().unwrap();
            let second = step_launches(&mut c, 2, false);
            c.hazard_free();
            panic!(
                "a copy using another graph's temporary was accepted (after_cut {after_cut}, from run {from_run}); second step graph: {second:?}"
            );
        }
    }
}

#[test]
fn traced_launches_with_no_marks_made_ahead_and_failing_event_creation() {
    for k in 0..24u64 {
        for overlapping in [false, true] {
            let mut c = chain_with(3, 2, 2, &mut plain);
            let mut kept = kept_of(&mut c, overlapping);
            let pool = c.pool.clone();
            let sim = c.sim.clone();
            let r = c.r();
            r.start_trace_with_capacity(0).unwrap();
            sim.inject(Faults::nth(Call::CreateEvent, k));
            for i in 0..4 {
                let _ = r.launch_kept(&mut kept, &pool[i % 2]);
                let _ = r.replay(RunnerId(0), &pool[(i + 1) % 2]);
                let _ = r.replay(RunnerId(1), &pool[i % 2]);
                let _ = r.replay(RunnerId(2), &pool[(i + 1) % 2]);
            }
            let _ = r.finish_trace();
            sim.inject(Faults::none());
            r.launch_kept(&mut kept, &pool[0]).unwrap();
            drop(kept);
            assert!(sim.hazards().is_empty(), "k {k}: {:?}", sim.hazards());
            c.teardown();
            assert_eq!(sim.live_events(), 0, "k {k}");
        }
    }
}

#[test]
fn a_panicking_step_consumer_keeps_the_cut_copies_and_leaves_no_capture() {
    let mut c = chain_with(2, 2, 1, &mut standard);
    let pool = c.pool.clone();
    let sim = c.sim.clone();
    let side = sim.stream();
    let c_sink = sim.alloc_f32(N).unwrap();
    {
        let r = c.r();
        let res = catch_unwind(AssertUnwindSafe(|| {
            let mut step = r.step();
            step.replay(RunnerId(0), &pool[0]).unwrap();
            let _ = step.consume(RunnerId(0), &side, |s, v| -> R {
                sim.launch(s, sim::Op::scale(&v[0], 1.0), 1).ok();
                panic!("consumer panics");
            });
        }));
        assert!(res.is_err());
        assert!(!sim.is_capturing(&side).unwrap());
        assert_eq!(
            r.temporaries(RunnerId(0)).unwrap().1,
            1,
            "copy lost by a panic"
        );
        let mut step = r.step();
        step.replay(RunnerId(0), &pool[0]).unwrap();
        step.replay(RunnerId(1), &pool[1]).unwrap();
        let sink = &c_sink;
        step.consume(RunnerId(1), &side, |s, v| {
            sim.launch(s, sim::Op::add(&v[0], sink), 1)
        })
        .unwrap();
        let mut g = step.build().unwrap();
        g.launch(&pool[1]).unwrap();
        g.launch(&side).unwrap();
    }
    c.per_runner(1);
    c.hazard_free();
    drop(c_sink);
    c.teardown();
}

fn seal_with_question_mark(sim: &sim::Device) -> replay_arena::Result<()> {
    let planned = Discovering::from_runners(
        PlanConfig::new(),
        [(RunnerId(0), [OWN]), (RunnerId(1), [OWN])],
    )?
    .plan(Policy::Generations(1))?;
    let s = sim.stream();
    let mut capturing = planned.allocate(sim.clone())?;
    let cap = capturing.capture(RunnerId(0))?;
    let v = cap.take(OWN)?;
    cap.stream_capture_repeatable(&s, |s| -> R {
        let t = sim.alloc_async(s, N)?;
        sim.launch(s, sim::Op::fill(&t, 1.0), 1)?;
        sim.launch(s, sim::Op::copy(&t, &v), 1)?;
        Ok(sim.free_async(s, &t)?)
    })
    .map_err(|e| e.to_string())
    .unwrap();
    cap.finish()?;
    // Runner 1 is never captured: the seal fails and `?` drops the
    // Capturing, as the SealError docs describe.
    let _r = capturing.seal()?;
    Ok(())
}

#[test]
fn a_failed_seal_propagated_with_question_mark_gives_graph_memory_back() {
    let sim = sim::Device::new();
    assert!(seal_with_question_mark(&sim).is_err());
    let p = pool(&sim);
    assert_eq!((p.used, p.reserved), (0, 0), "{p:?}");
}
