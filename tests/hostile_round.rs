//! Hostile review of step copies cut at their ready point, traced step
//! graphs, and the backend roles, on the `sim` model. Each test either
//! expects a typed refusal or checks that the device stays hazard-free,
//! the values right, and graph memory returns to zero.

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
#[ignore = "HOLE: a closure panicking in the step-copy run leaves the graph memory pool reserved (Capturing dropped while unwinding never trims)"]
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
#[ignore = "HOLE: dropping a Capturing (no seal/replan, e.g. unwinding from a panicking closure) leaves graph memory reserved"]
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
        e(r.replay(RunnerId(l as u32), &pool[l % 2]).map_err(|x| x.to_string()));
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
        e(r.replay(RunnerId(l as u32), &pool[(l + 1) % 2]).map_err(|x| x.to_string()));
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
    e(r
        .consume(RunnerId(layers as u32 - 1), &side, |s, v| {
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
        e(r.replay(RunnerId(l as u32), &pool[l % 2]).map_err(|x| x.to_string()));
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
        assert_eq!(sim.live_allocations(), 0, "allocations leaked, fault at {n}: {inj:?}");
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
