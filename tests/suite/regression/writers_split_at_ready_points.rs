//! Hostile review, second round: writers split at every ready point in
//! step graphs (several handoffs per writer, cut step copies with
//! temporaries spanning several cuts), unsealed plans dropped, and trace
//! capacities. On the `sim` model. Each test either expects a typed
//! refusal or checks that the device stays hazard-free, the values equal
//! those of per-runner replays, and graph memory returns to zero.

#![allow(
    clippy::needless_range_loop,
    clippy::type_complexity,
    clippy::result_large_err
)]

use replay_arena::sim::{self, Call, Faults};
use replay_arena::{Backend, GraphMemory, HandoffId, Streams};
use replay_arena::{
    CaptureError, DType, Discovering, Domain, PlanConfig, Policy, Replayable, Request, RunnerId,
    StepError, StreamCaptureError, TraceError,
};
use std::panic::{catch_unwind, AssertUnwindSafe};

const N: usize = 16;
const OWN: Request = Request::new(Domain::Device, DType::F32, N as u64);
const GRAD: Request = Request::new(Domain::Device, DType::F32, N as u64);

type R = replay_arena::Result<()>;

fn pool(sim: &sim::Device) -> GraphMemory {
    sim.graph_memory_in_use().unwrap().unwrap()
}

/// The shape of a fan: runner 0 writes `k` handoffs, marking them ready
/// in `order(run)` (run 1 is the graph, run 2.. the step copies); reader
/// `i` (runner `i + 1`) receives handoff `i` on a stream of its own;
/// with `chain`, reader 0 also hands off to a collector (runner `k + 1`).
#[derive(Clone)]
struct Spec {
    k: usize,
    copies: usize,
    chain: bool,
    writer_temps: bool,
    reader_temps: bool,
    g: usize,
}

impl Spec {
    fn new(k: usize) -> Spec {
        Spec {
            k,
            copies: 1,
            chain: false,
            writer_temps: true,
            reader_temps: false,
            g: 2,
        }
    }
    fn runners(&self) -> usize {
        1 + self.k + self.chain as usize
    }
}

struct Fan {
    sim: sim::Device,
    streams: Vec<sim::Stream>,
    side: sim::Stream,
    r: Option<Replayable<sim::Device>>,
    failed: Option<replay_arena::Capturing<sim::Device>>,
    errors: Vec<String>,
    sinks: Vec<sim::HostBuffer>,
    consumer_sink: sim::HostBuffer,
    _keep: Vec<sim::HostBuffer>,
}

fn identity(k: usize) -> impl Fn(usize) -> Vec<usize> {
    move |_| (0..k).collect()
}

fn fan(spec: &Spec, order: &dyn Fn(usize) -> Vec<usize>) -> Fan {
    fan_faulty(sim::Device::new(), spec, order, None)
}

/// What a custom writer's work sees.
struct W<'a, 'c> {
    sim: &'a sim::Device,
    cap: &'a replay_arena::RunnerCapture<'c, sim::Device>,
    hs: &'a [HandoffId],
    xs: &'a [replay_arena::View<'a>],
    own: &'a replay_arena::View<'a>,
    side: &'a sim::Stream,
    run: usize,
}

type Writer<'w> = &'w mut dyn FnMut(&W, &sim::Stream) -> R;

fn fan_faulty(
    sim: sim::Device,
    spec: &Spec,
    order: &dyn Fn(usize) -> Vec<usize>,
    writer_faults: Option<Faults>,
) -> Fan {
    fan_with(sim, spec, order, writer_faults, None)
}

fn fan_custom(spec: &Spec, writer: Writer) -> Fan {
    fan_with(
        sim::Device::new(),
        spec,
        &identity(spec.k),
        None,
        Some(writer),
    )
}

fn fan_with(
    sim: sim::Device,
    spec: &Spec,
    order: &dyn Fn(usize) -> Vec<usize>,
    writer_faults: Option<Faults>,
    mut writer: Option<Writer>,
) -> Fan {
    let k = spec.k;
    let mut d = Discovering::new(PlanConfig::new());
    let hs: Vec<HandoffId> = {
        let mut a = d.arm(RunnerId(0)).unwrap();
        a.record(OWN).unwrap();
        (0..k).map(|_| a.hand_off(GRAD).unwrap()).collect()
    };
    let mut g_handoff = None;
    for i in 0..k {
        let mut a = d.arm(RunnerId(i as u32 + 1)).unwrap();
        a.record(OWN).unwrap();
        a.receive(hs[i]).unwrap();
        if i == 0 && spec.chain {
            g_handoff = Some(a.hand_off(GRAD).unwrap());
        }
    }
    if let Some(gh) = g_handoff {
        let mut a = d.arm(RunnerId(k as u32 + 1)).unwrap();
        a.record(OWN).unwrap();
        a.receive(gh).unwrap();
    }
    let runners = spec.runners();
    let streams: Vec<sim::Stream> = (0..runners).map(|_| sim.stream()).collect();
    let side = sim.stream();
    let one = sim.alloc_f32(N).unwrap();
    sim.write_f32(&one, &[1.0; N]).unwrap();
    let count = sim.alloc_f32(N).unwrap();
    let sinks: Vec<sim::HostBuffer> = (0..runners).map(|_| sim.alloc_f32(N).unwrap()).collect();
    let consumer_sink = sim.alloc_f32(N).unwrap();
    let mut capturing = d
        .plan(Policy::Generations(spec.g))
        .unwrap()
        .allocate(sim.clone())
        .unwrap();
    let mut errors = Vec::new();
    // The writer.
    {
        let cap = capturing.capture(RunnerId(0)).unwrap();
        cap.step_copies(spec.copies);
        let own = cap.take(OWN).unwrap();
        let xs: Vec<_> = hs.iter().map(|h| cap.hand_off(*h).unwrap()).collect();
        let mut run = 0;
        let faulty = writer_faults.is_some();
        if let Some(f) = writer_faults {
            sim.inject(f);
        }
        let wside = sim.stream();
        let res = cap.stream_capture_repeatable(&streams[0], |s| -> R {
            run += 1;
            if let Some(w) = writer.as_mut() {
                let ctx = W {
                    sim: &sim,
                    cap: &cap,
                    hs: &hs,
                    xs: &xs,
                    own: &own,
                    side: &wside,
                    run,
                };
                return w(&ctx, s);
            }
            sim.launch(s, sim::Op::add(&one, &count), 1)?;
            let t = if spec.writer_temps {
                let t = sim.alloc_async(s, N)?;
                sim.launch(s, sim::Op::copy(&count, &t), 1)?;
                Some(t)
            } else {
                None
            };
            macro_rules! body {
                ($src:expr) => {{
                    let src = $src;
                    let mut written = vec![false; k];
                    for i in order(run) {
                        if !written[i] {
                            sim.launch(s, sim::Op::copy(src, &xs[i]), 5)?;
                            sim.launch(s, sim::Op::scale(&xs[i], (i + 1) as f32), 5)?;
                            written[i] = true;
                        }
                        cap.ready(hs[i], s)?;
                    }
                    for i in 0..k {
                        if !written[i] {
                            sim.launch(s, sim::Op::copy(src, &xs[i]), 5)?;
                            sim.launch(s, sim::Op::scale(&xs[i], (i + 1) as f32), 5)?;
                        }
                    }
                    sim.launch(s, sim::Op::copy(src, &own), 100)?;
                }};
            }
            match &t {
                Some(t) => body!(t),
                None => body!(&count),
            }
            if let Some(t) = &t {
                sim.free_async(s, t)?;
            }
            Ok(())
        });
        if faulty {
            sim.inject(Faults::none());
        }
        if let Err(e) = res {
            errors.push(format!("writer: {e}"));
        }
        assert!(!sim.is_capturing(&streams[0]).unwrap(), "left capturing");
        if let Err(e) = cap.finish() {
            errors.push(format!("writer finish: {e}"));
        }
    }
    // The readers.
    for i in 0..k {
        let r = RunnerId(i as u32 + 1);
        let cap = capturing.capture(r).unwrap();
        let own = cap.take(OWN).unwrap();
        let input = cap.receive(hs[i]).unwrap();
        let out = if i == 0 && spec.chain {
            Some(cap.hand_off(g_handoff.unwrap()).unwrap())
        } else {
            None
        };
        let sink = &sinks[i + 1];
        let s = &streams[i + 1];
        cap.stream_capture_repeatable(s, |s| -> R {
            sim.launch(s, sim::Op::add(&input, sink), 20)?;
            if spec.reader_temps {
                let t = sim.alloc_async(s, N)?;
                sim.launch(s, sim::Op::copy(&input, &t), 3)?;
                sim.launch(s, sim::Op::copy(&t, &own), 3)?;
                sim.free_async(s, &t)?;
            } else {
                sim.launch(s, sim::Op::copy(&input, &own), 3)?;
            }
            if let Some(out) = &out {
                sim.launch(s, sim::Op::copy(&input, out), 2)?;
                sim.launch(s, sim::Op::scale(out, 10.0), 2)?;
                cap.ready(g_handoff.unwrap(), s)?;
                sim.launch(s, sim::Op::add(&input, &own), 50)?;
            }
            Ok(())
        })
        .unwrap();
        cap.finish().unwrap();
    }
    if let Some(gh) = g_handoff {
        let cap = capturing.capture(RunnerId(k as u32 + 1)).unwrap();
        let own = cap.take(OWN).unwrap();
        let input = cap.receive(gh).unwrap();
        let sink = &sinks[k + 1];
        cap.stream_capture(&streams[k + 1], |s| -> R {
            sim.launch(s, sim::Op::add(&input, sink), 7)?;
            sim.launch(s, sim::Op::copy(&input, &own), 1)?;
            Ok(())
        })
        .unwrap();
        cap.finish().unwrap();
    }
    let (r, failed) = match capturing.seal() {
        Ok(r) => (Some(r), None),
        Err(e) => {
            errors.push(format!("seal: {e}"));
            (None, Some(e.into_capturing()))
        }
    };
    Fan {
        sim,
        streams,
        side,
        r,
        failed,
        errors,
        sinks,
        consumer_sink,
        _keep: vec![one, count],
    }
}

/// One entry of a step: a replay of a runner on a stream, or a consumer
/// of a runner on the side stream (adds its first view to the consumer
/// sink).
#[derive(Clone, Copy, Debug)]
enum Item {
    Replay(u32, usize),
    Consume(u32),
}

impl Fan {
    fn r(&mut self) -> &mut Replayable<sim::Device> {
        self.r.as_mut().expect("sealed")
    }

    /// Runs `items` per runner (the reference for a step graph).
    fn per_runner(&mut self, items: &[Item]) {
        let streams = self.streams.clone();
        let side = self.side.clone();
        let sim = self.sim.clone();
        let cs = &self.consumer_sink;
        let r = self.r.as_mut().unwrap();
        for it in items {
            match *it {
                Item::Replay(run, s) => r.replay(RunnerId(run), &streams[s]).unwrap(),
                Item::Consume(run) => r
                    .consume(RunnerId(run), &side, |s, v| {
                        sim.launch(s, sim::Op::add(&v[0], cs), 3)
                    })
                    .unwrap(),
            }
        }
    }

    fn build(
        &mut self,
        items: &[Item],
        overlapping: bool,
    ) -> Result<replay_arena::KeptStep<sim::Device>, StepError> {
        self.try_build(items, overlapping).map_err(|e| match e {
            BuildError::Step(e) => e,
            BuildError::Consume(e) => panic!("step consume: {e}"),
        })
    }

    /// `build`, with a failing consumer as an error of its own.
    fn try_build(
        &mut self,
        items: &[Item],
        overlapping: bool,
    ) -> Result<replay_arena::KeptStep<sim::Device>, BuildError> {
        let streams = self.streams.clone();
        let side = self.side.clone();
        let sim = self.sim.clone();
        let cs = &self.consumer_sink;
        let r = self.r.as_mut().unwrap();
        let mut step = r.step();
        for it in items {
            match *it {
                Item::Replay(run, s) => {
                    step.replay(RunnerId(run), &streams[s])?;
                }
                Item::Consume(run) => {
                    if let Err(e) = step.consume(RunnerId(run), &side, |s, v| {
                        sim.launch(s, sim::Op::add(&v[0], cs), 3)
                    }) {
                        return Err(BuildError::Consume(e.to_string()));
                    }
                }
            }
        }
        let g = if overlapping {
            step.build_overlapping()?
        } else {
            step.build()?
        };
        Ok(g.keep())
    }

    fn values(&self) -> Vec<Vec<f32>> {
        let r = self.r.as_ref().unwrap();
        let mut out: Vec<Vec<f32>> = self
            .sinks
            .iter()
            .map(|b| self.sim.read_f32(b).unwrap())
            .collect();
        out.push(self.sim.read_f32(&self.consumer_sink).unwrap());
        for l in 0..self.sinks.len() {
            for v in r.views(RunnerId(l as u32)).unwrap() {
                out.push(self.sim.read_f32(v).unwrap());
            }
        }
        out
    }

    fn hazard_free(&self) {
        assert!(self.sim.hazards().is_empty(), "{:?}", self.sim.hazards());
    }

    fn teardown(mut self) {
        let sim = self.sim.clone();
        self.r.take();
        if let Some(c) = self.failed.take() {
            drop(c.replan());
        }
        drop(self);
        assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
        let p = pool(&sim);
        assert_eq!((p.used, p.reserved), (0, 0), "graph memory left: {p:?}");
        assert_eq!(sim.live_events(), 0, "events leaked");
        assert_eq!(sim.live_allocations(), 0, "allocations leaked");
    }
}

enum BuildError {
    Step(StepError),
    Consume(String),
}

impl From<StepError> for BuildError {
    fn from(e: StepError) -> Self {
        BuildError::Step(e)
    }
}

/// Every runner once, each on its own stream.
fn all(spec: &Spec) -> Vec<Item> {
    (0..spec.runners())
        .map(|r| Item::Replay(r as u32, r))
        .collect()
}

/// Runs `items` as a step graph `steps` times, with per-runner replays
/// of `items` before and after, and compares against a fan replayed per
/// runner alone.
fn check_step(spec: &Spec, items: &[Item], overlapping: bool, steps: usize) {
    check_step_primed(spec, &[], items, overlapping, steps)
}

/// `check_step` after `prime` replayed per runner.
fn check_step_primed(spec: &Spec, prime: &[Item], items: &[Item], overlapping: bool, steps: usize) {
    let mut reference = fan(spec, &identity(spec.k));
    assert!(reference.errors.is_empty(), "{:?}", reference.errors);
    reference.per_runner(prime);
    for _ in 0..steps + 2 {
        reference.per_runner(items);
    }
    let mut f = fan(spec, &identity(spec.k));
    assert!(f.errors.is_empty(), "{:?}", f.errors);
    f.per_runner(prime);
    f.per_runner(items);
    let mut kept = f.build(items, overlapping).unwrap();
    let streams = f.streams.clone();
    for i in 0..steps {
        f.r()
            .launch_kept(&mut kept, &streams[i % streams.len()])
            .unwrap();
    }
    f.per_runner(items);
    drop(kept);
    f.hazard_free();
    assert_eq!(
        f.values(),
        reference.values(),
        "spec k={} items {items:?} overlapping {overlapping}",
        spec.k
    );
    reference.teardown();
    f.teardown();
}

// ---------------------------------------------------------------------
// 1. Writers split at every ready point
// ---------------------------------------------------------------------

#[test]
fn writers_of_two_to_four_handoffs_match_per_runner_replays() {
    for k in 2..=4 {
        for temps in [false, true] {
            let mut spec = Spec::new(k);
            spec.writer_temps = temps;
            check_step(&spec, &all(&spec), false, 5);
        }
    }
}

#[test]
fn the_step_graph_has_one_node_per_part() {
    for k in 2..=4 {
        for temps in [false, true] {
            let mut spec = Spec::new(k);
            spec.writer_temps = temps;
            let mut f = fan(&spec, &identity(k));
            let items = all(&spec);
            let kept = f.build(&items, false).unwrap();
            // The writer in k + 1 parts and k readers.
            assert_eq!(kept.nodes(), (k + 1) + k, "k={k} temps={temps}");
            drop(kept);
            f.teardown();
        }
    }
}

#[test]
fn readers_that_write_other_handoffs_and_readers_with_temporaries() {
    for k in 2..=4 {
        for reader_temps in [false, true] {
            let mut spec = Spec::new(k);
            spec.chain = true;
            spec.reader_temps = reader_temps;
            check_step(&spec, &all(&spec), false, 4);
        }
    }
}

#[test]
fn readers_scheduled_before_the_writer_and_on_shared_streams() {
    let mut spec = Spec::new(3);
    spec.chain = true;
    // Readers of later ready points scheduled first, sharing the
    // writer's stream and one another's.
    let items = [
        Item::Replay(0, 0),
        Item::Replay(3, 0),
        Item::Replay(2, 1),
        Item::Replay(1, 1),
        Item::Replay(4, 0),
    ];
    check_step_primed(&spec, &all(&spec), &items, false, 4);
    let items = [
        Item::Replay(0, 2),
        Item::Replay(3, 2),
        Item::Replay(1, 2),
        Item::Replay(4, 2),
        Item::Replay(2, 2),
    ];
    check_step(&spec, &items, false, 4);
}

#[test]
fn the_writer_replayed_twice_in_a_step() {
    for temps in [false, true] {
        let mut spec = Spec::new(3);
        spec.copies = 2;
        spec.chain = true;
        spec.writer_temps = temps;
        let items = [
            Item::Replay(0, 0),
            Item::Replay(1, 1),
            Item::Replay(2, 2),
            Item::Replay(0, 3),
            Item::Replay(3, 3),
            Item::Replay(4, 4),
            Item::Replay(2, 0),
        ];
        check_step(&spec, &items, false, 3);
    }
}

#[test]
fn the_writer_twice_with_one_copy_is_a_typed_error() {
    let spec = Spec::new(2);
    let mut f = fan(&spec, &identity(2));
    let items = [Item::Replay(0, 0), Item::Replay(1, 1), Item::Replay(0, 2)];
    let err = f.build(&items, false).unwrap_err();
    assert!(
        matches!(err, StepError::NoStepCopy { captured: 1, .. }),
        "{err}"
    );
    // The copy is kept for the next step.
    let kept = f.build(&all(&spec), false).unwrap();
    drop(kept);
    f.per_runner(&all(&spec));
    f.hazard_free();
    f.teardown();
}

#[test]
fn overlapping_step_graphs_of_split_writers() {
    for temps in [false, true] {
        for k in [2, 4] {
            let mut spec = Spec::new(k);
            spec.copies = 2;
            spec.chain = true;
            spec.writer_temps = temps;
            check_step(&spec, &all(&spec), true, 6);
        }
    }
}

#[test]
fn consumers_of_the_split_writer() {
    for temps in [false, true] {
        for overlapping in [false, true] {
            let mut spec = Spec::new(3);
            spec.copies = 2;
            spec.g = 4;
            spec.writer_temps = temps;
            let mut items = all(&spec);
            items.insert(1, Item::Consume(0));
            items.push(Item::Consume(0));
            items.push(Item::Consume(2));
            check_step(&spec, &items, overlapping, 4);
        }
    }
}

#[test]
fn consuming_an_overwritten_writer_in_a_step_is_a_typed_error() {
    let mut spec = Spec::new(3);
    spec.g = 2;
    let mut f = fan(&spec, &identity(3));
    let side = f.side.clone();
    let s = f.streams.clone();
    let sim = f.sim.clone();
    let cs = f.sim.alloc_f32(N).unwrap();
    let mut step = f.r().step();
    for r in 0..4u32 {
        step.replay(RunnerId(r), &s[r as usize]).unwrap();
    }
    let mut ran = false;
    let res = step.consume(RunnerId(0), &side, |s, v| -> R {
        ran = true;
        Ok(sim.launch(s, sim::Op::add(&v[0], &cs), 3)?)
    });
    // Refused at the consumer or at build, before anything runs.
    if res.is_ok() {
        let err = match step.build() {
            Ok(_) => panic!("a consumer of overwritten views built"),
            Err(e) => e,
        };
        assert!(matches!(err, StepError::Schedule(_)), "{err}");
    } else {
        drop(step);
    }
    // The writer's cut copy is still there.
    let mut kept = f.build(&all(&spec), false).unwrap();
    f.r().launch_kept(&mut kept, &s[0]).unwrap();
    drop(kept);
    let _ = (ran, cs);
    f.per_runner(&all(&spec));
    f.hazard_free();
    f.teardown();
}

#[test]
fn copy_runs_that_mark_ready_points_otherwise_are_typed_errors() {
    let k = 3;
    let cases: Vec<(&str, Box<dyn Fn(usize) -> Vec<usize>>)> = vec![
        (
            "another order",
            Box::new(|run| {
                if run == 1 {
                    vec![0, 1, 2]
                } else {
                    vec![0, 2, 1]
                }
            }),
        ),
        (
            "one skipped",
            Box::new(|run| if run == 1 { vec![0, 1, 2] } else { vec![0, 2] }),
        ),
        (
            "one added",
            Box::new(|run| if run == 1 { vec![0, 2] } else { vec![0, 1, 2] }),
        ),
        (
            "the last skipped",
            Box::new(|run| if run == 1 { vec![0, 1, 2] } else { vec![0, 1] }),
        ),
        (
            "none in the copy",
            Box::new(|run| if run == 1 { vec![0, 1, 2] } else { vec![] }),
        ),
        (
            "all in the copy only",
            Box::new(|run| if run == 1 { vec![] } else { vec![0, 1, 2] }),
        ),
        (
            "the second copy differs",
            Box::new(|run| {
                if run <= 2 {
                    vec![0, 1, 2]
                } else {
                    vec![1, 0, 2]
                }
            }),
        ),
    ];
    for (name, order) in cases {
        let mut spec = Spec::new(k);
        spec.copies = 2;
        let f = fan(&spec, &*order);
        assert!(
            f.errors.iter().any(|e| e.contains("writer")),
            "{name}: {:?}",
            f.errors
        );
        assert!(f.r.is_none(), "{name}: sealed despite a differing copy");
        f.teardown();
    }
}

#[test]
fn a_copy_run_that_readies_a_handoff_twice_is_refused() {
    let mut spec = Spec::new(2);
    spec.copies = 1;
    let f = fan(&spec, &|run| {
        if run == 1 {
            vec![0, 1]
        } else {
            vec![0, 1, 1]
        }
    });
    assert!(!f.errors.is_empty(), "readied twice was accepted");
    f.teardown();
    let f = fan(&spec, &|_| vec![0, 0, 1]);
    assert!(!f.errors.is_empty(), "readied twice was accepted");
    f.teardown();
}

#[test]
fn subsets_of_ready_points_match_per_runner_replays() {
    // The first run and copy mark the same subset of ready points: the
    // others' readers wait for the whole writer.
    for order in [vec![1], vec![2], vec![0, 2], vec![1, 2], vec![]] {
        let spec = Spec::new(3);
        let o = order.clone();
        let mut reference = fan(&spec, &move |_| o.clone());
        assert!(reference.errors.is_empty(), "{:?}", reference.errors);
        let items = all(&spec);
        for _ in 0..4 {
            reference.per_runner(&items);
        }
        let o = order.clone();
        let mut f = fan(&spec, &move |_| o.clone());
        f.per_runner(&items);
        let mut kept = f.build(&items, false).unwrap();
        let streams = f.streams.clone();
        for i in 0..2 {
            f.r().launch_kept(&mut kept, &streams[i]).unwrap();
        }
        drop(kept);
        f.per_runner(&items);
        f.hazard_free();
        assert_eq!(f.values(), reference.values(), "{order:?}");
        reference.teardown();
        f.teardown();
    }
}

#[test]
fn a_reordered_but_consistent_ready_order_matches_per_runner_replays() {
    // Ready points in another order than the handoffs were declared.
    let spec = Spec::new(4);
    let order = |_| vec![3, 1, 0, 2];
    let items = all(&spec);
    let mut reference = fan(&spec, &order);
    for _ in 0..5 {
        reference.per_runner(&items);
    }
    let mut f = fan(&spec, &order);
    f.per_runner(&items);
    let mut kept = f.build(&items, false).unwrap();
    let streams = f.streams.clone();
    for i in 0..3 {
        f.r().launch_kept(&mut kept, &streams[4 - i]).unwrap();
    }
    drop(kept);
    f.per_runner(&items);
    f.hazard_free();
    assert_eq!(f.values(), reference.values());
    reference.teardown();
    f.teardown();
}

/// Faults at every `call` of the writer's capture: either the writer
/// fails (typed, stream left capturing never, nothing leaked) or the plan
/// works as the reference.
fn fault_at_cuts(call: Option<Call>) {
    let mut spec = Spec::new(3);
    spec.copies = 2;
    spec.chain = true;
    let items = all(&spec);
    let mut reference = fan(&spec, &identity(3));
    for _ in 0..4 {
        reference.per_runner(&items);
    }
    let expected = reference.values();
    reference.teardown();
    let max = if call.is_some() { 12 } else { 80 };
    let mut failures = 0;
    for n in 0..max {
        let faults = match call {
            Some(c) => Faults::nth(c, n),
            None => Faults::at(n),
        };
        let sim = sim::Device::new();
        let res = catch_unwind(AssertUnwindSafe(|| {
            fan_faulty(sim.clone(), &spec, &identity(3), Some(faults))
        }));
        let mut f = res.unwrap_or_else(|_| panic!("panic at {call:?} {n}"));
        if f.r.is_some() {
            f.per_runner(&items);
            let mut kept = f.build(&items, false).unwrap();
            let mut kept2 = f.build(&items, false).unwrap();
            let s = f.streams.clone();
            f.r().launch_kept(&mut kept, &s[1]).unwrap();
            f.r().launch_kept(&mut kept2, &s[2]).unwrap();
            drop(kept);
            std::mem::forget(kept2);
            f.per_runner(&items);
            f.hazard_free();
            assert_eq!(f.values(), expected, "{call:?} {n}");
            // A forgotten kept step may keep its graph memory: check
            // hazards only.
            let sim = f.sim.clone();
            f.r.take();
            assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
        } else {
            failures += 1;
            assert!(
                f.errors.iter().any(|e| e.contains("injected")),
                "{call:?} {n}: {:?}",
                f.errors
            );
            f.teardown();
        }
    }
    assert!(failures > 0, "{call:?}: no fault hit");
}

#[test]
fn a_fault_at_each_end_capture_of_the_cut_writer() {
    fault_at_cuts(Some(Call::EndCapture));
}

#[test]
fn a_fault_at_each_begin_capture_of_the_cut_writer() {
    fault_at_cuts(Some(Call::BeginCapture));
}

#[test]
fn a_fault_at_every_call_of_the_cut_writers_capture() {
    fault_at_cuts(None);
}

#[test]
fn a_failing_or_panicking_copy_run_between_cuts_leaks_nothing() {
    // The writer's copy fails (or panics) after its first cut, holding a
    // temporary allocated before it.
    for panic in [false, true] {
        let sim = sim::Device::new();
        let spec = Spec::new(3);
        let mut d = Discovering::new(PlanConfig::new());
        let hs: Vec<HandoffId> = {
            let mut a = d.arm(RunnerId(0)).unwrap();
            a.record(OWN).unwrap();
            (0..3).map(|_| a.hand_off(GRAD).unwrap()).collect()
        };
        let _ = spec;
        let s = sim.stream();
        let mut capturing = d
            .plan(Policy::Generations(1))
            .unwrap()
            .allocate(sim.clone())
            .unwrap();
        {
            let cap = capturing.capture(RunnerId(0)).unwrap();
            let own = cap.take(OWN).unwrap();
            let xs: Vec<_> = hs.iter().map(|h| cap.hand_off(*h).unwrap()).collect();
            let mut run = 0;
            let res = catch_unwind(AssertUnwindSafe(|| {
                cap.stream_capture_repeatable(&s, |s| -> R {
                    run += 1;
                    let t = sim.alloc_async(s, N)?;
                    sim.launch(s, sim::Op::fill(&t, 2.0), 1)?;
                    for i in 0..3 {
                        sim.launch(s, sim::Op::copy(&t, &xs[i]), 1)?;
                        cap.ready(hs[i], s)?;
                        if run == 2 && i == 1 {
                            if panic {
                                panic!("copy run panics between cuts");
                            }
                            return Err(replay_arena::Error::Backend(
                                replay_arena::BackendError::Refused {
                                    op: "test",
                                    reason: "between cuts".into(),
                                },
                            ));
                        }
                    }
                    sim.launch(s, sim::Op::copy(&t, &own), 1)?;
                    sim.free_async(s, &t)?;
                    Ok(())
                })
            }));
            match res {
                Ok(r) => assert!(matches!(r, Err(StreamCaptureError::Work(_))), "{r:?}"),
                Err(_) => assert!(panic),
            }
            assert!(!sim.is_capturing(&s).unwrap());
            assert!(matches!(cap.finish(), Err(CaptureError::Failed { .. })));
        }
        assert!(capturing.seal().is_err());
        // The stream is usable again.
        assert!(!sim.is_capturing(&s).unwrap());
        assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
        let p = pool(&sim);
        assert_eq!((p.used, p.reserved), (0, 0), "panic {panic}: {p:?}");
    }
}

#[test]
fn kept_steps_and_per_runner_replays_interleaved_around_split_writers() {
    let mut spec = Spec::new(3);
    spec.copies = 4;
    spec.chain = true;
    let items = all(&spec);
    let mut reference = fan(&spec, &identity(3));
    let mut f = fan(&spec, &identity(3));
    let mut a = f.build(&items, false).unwrap();
    let mut b = f.build(&items, true).unwrap();
    let mut c = f.build(&items, false).unwrap();
    let s = f.streams.clone();
    let mut n = 0;
    for round in 0..4 {
        f.r().launch_kept(&mut a, &s[round % 3]).unwrap();
        f.per_runner(&items);
        f.r().launch_kept(&mut b, &s[(round + 1) % 5]).unwrap();
        f.r().launch_kept(&mut c, &s[4]).unwrap();
        f.r().launch_kept(&mut b, &s[0]).unwrap();
        n += 5;
    }
    drop(b);
    // A trace around the rest.
    f.r().start_trace().unwrap();
    f.r().launch_kept(&mut a, &s[2]).unwrap();
    f.per_runner(&items);
    n += 2;
    let t = f.r().finish_trace().unwrap();
    for node in t.step_nodes() {
        let p = &t.slices()[node.parent.unwrap()];
        assert!(node.start_us >= p.start_us && node.end_us <= p.end_us);
    }
    drop(a);
    std::mem::forget(c);
    for _ in 0..n {
        reference.per_runner(&items);
    }
    f.hazard_free();
    assert_eq!(f.values(), reference.values());
    reference.teardown();
    let sim = f.sim.clone();
    f.r.take();
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
}

#[test]
fn dropped_builders_and_failed_builds_keep_the_cut_copies() {
    let spec = Spec::new(3);
    let mut f = fan(&spec, &identity(3));
    let items = all(&spec);
    {
        // A builder dropped after the writer's replay.
        let s = f.streams.clone();
        let mut step = f.r().step();
        step.replay(RunnerId(0), &s[0]).unwrap();
        step.replay(RunnerId(1), &s[1]).unwrap();
        drop(step);
    }
    {
        // A failed build (the writer twice with one copy).
        let err = f
            .build(&[Item::Replay(0, 0), Item::Replay(0, 1)], false)
            .unwrap_err();
        assert!(matches!(err, StepError::NoStepCopy { .. }), "{err}");
    }
    {
        // build_overlapping wants two copies per replay.
        let r = f.build(&items, true);
        if let Err(e) = &r {
            assert!(matches!(e, StepError::NoStepCopy { .. }), "{e}");
        }
    }
    let (_, left) = f.r().temporaries(RunnerId(0)).unwrap();
    if left == 1 {
        let mut kept = f.build(&items, false).unwrap();
        let s = f.streams.clone();
        f.r().launch_kept(&mut kept, &s[0]).unwrap();
    }
    f.per_runner(&items);
    f.hazard_free();
    f.teardown();
}

// ---------------------------------------------------------------------
// 2. Unsealed plans dropped, trace capacities
// ---------------------------------------------------------------------

#[test]
fn capturing_dropped_unsealed_with_cut_copies_trims_graph_memory() {
    // Dropped after the writer's capture (cut copies held), before the
    // readers' captures.
    for copies in [1, 3] {
        let sim = sim::Device::new();
        let mut d = Discovering::new(PlanConfig::new());
        let hs: Vec<HandoffId> = {
            let mut a = d.arm(RunnerId(0)).unwrap();
            a.record(OWN).unwrap();
            (0..3).map(|_| a.hand_off(GRAD).unwrap()).collect()
        };
        for i in 0..3 {
            d.arm(RunnerId(i + 1))
                .unwrap()
                .receive(hs[i as usize])
                .unwrap();
        }
        let s = sim.stream();
        let mut capturing = d
            .plan(Policy::Generations(2))
            .unwrap()
            .allocate(sim.clone())
            .unwrap();
        {
            let cap = capturing.capture(RunnerId(0)).unwrap();
            cap.step_copies(copies);
            let own = cap.take(OWN).unwrap();
            let xs: Vec<_> = hs.iter().map(|h| cap.hand_off(*h).unwrap()).collect();
            cap.stream_capture_repeatable(&s, |s| -> R {
                let t = sim.alloc_async(s, N)?;
                sim.launch(s, sim::Op::fill(&t, 1.0), 1)?;
                for i in 0..3 {
                    sim.launch(s, sim::Op::copy(&t, &xs[i]), 1)?;
                    cap.ready(hs[i], s)?;
                }
                sim.launch(s, sim::Op::copy(&t, &own), 1)?;
                sim.free_async(s, &t)?;
                Ok(())
            })
            .unwrap();
            cap.finish().unwrap();
        }
        assert!(pool(&sim).used > 0);
        drop(capturing);
        let p = pool(&sim);
        assert_eq!((p.used, p.reserved), (0, 0), "copies {copies}: {p:?}");
        assert!(sim.hazards().is_empty());
        assert_eq!(sim.live_events(), 0);
    }
}

#[test]
fn capturing_dropped_unsealed_with_a_runner_open_is_refused_or_trims() {
    // A failing capture, then the plan dropped; also one forgotten.
    for forget in [false, true] {
        let sim = sim::Device::new();
        let mut d = Discovering::new(PlanConfig::new());
        d.arm(RunnerId(0)).unwrap().record(OWN).unwrap();
        d.arm(RunnerId(1)).unwrap().record(OWN).unwrap();
        let s = sim.stream();
        let mut capturing = d
            .plan(Policy::Generations(1))
            .unwrap()
            .allocate(sim.clone())
            .unwrap();
        for r in 0..2 {
            let cap = capturing.capture(RunnerId(r)).unwrap();
            cap.step_copies(2);
            let v = cap.take(OWN).unwrap();
            let _ = cap.stream_capture_repeatable(&s, |s| -> R {
                let t = sim.alloc_async(s, N)?;
                sim.launch(s, sim::Op::fill(&t, 1.0), 1)?;
                sim.launch(s, sim::Op::copy(&t, &v), 1)?;
                sim.free_async(s, &t)?;
                if r == 1 {
                    return Err(replay_arena::Error::Backend(
                        replay_arena::BackendError::Refused {
                            op: "test",
                            reason: "fails".into(),
                        },
                    ));
                }
                Ok(())
            });
            let _ = cap.finish();
        }
        if forget {
            std::mem::forget(capturing);
            // Leaks are allowed, hazards are not.
            assert!(sim.hazards().is_empty());
        } else {
            drop(capturing);
            let p = pool(&sim);
            assert_eq!((p.used, p.reserved), (0, 0), "{p:?}");
        }
    }
}

#[test]
fn a_trace_capacity_beyond_the_maximum_is_a_typed_error() {
    let spec = Spec::new(2);
    let mut f = fan(&spec, &identity(2));
    let max = Replayable::<sim::Device>::MAX_TRACE_CAPACITY;
    for slices in [max + 1, max.saturating_mul(2), usize::MAX, usize::MAX / 2] {
        let err = f.r().start_trace_with_capacity(slices).unwrap_err();
        assert!(
            matches!(err, TraceError::CapacityTooLarge { slices: s, max: m } if s == slices && m == max),
            "{err}"
        );
        // No trace started.
        assert!(matches!(f.r().finish_trace(), Err(TraceError::NoTrace)));
    }
    // A refused capacity while a trace runs leaves that trace running.
    f.r().start_trace_with_capacity(4).unwrap();
    let items = all(&spec);
    f.per_runner(&items);
    assert!(f.r().start_trace_with_capacity(usize::MAX).is_err());
    f.per_runner(&items);
    let t = f.r().finish_trace().unwrap();
    assert!(!t.slices().is_empty());
    f.hazard_free();
    f.teardown();
}

#[test]
fn a_trace_at_the_maximum_capacity_is_accepted_and_cleaned_up() {
    let spec = Spec::new(2);
    let mut f = fan(&spec, &identity(2));
    let max = Replayable::<sim::Device>::MAX_TRACE_CAPACITY;
    let start = std::time::Instant::now();
    f.r().start_trace_with_capacity(max).unwrap();
    assert!(start.elapsed().as_secs() < 10, "{:?}", start.elapsed());
    let items = all(&spec);
    f.per_runner(&items);
    let mut kept = f.build(&items, false).unwrap();
    let s = f.streams.clone();
    f.r().launch_kept(&mut kept, &s[0]).unwrap();
    // Restarted while launched work is in flight, at capacity again.
    f.r().start_trace_with_capacity(max).unwrap();
    f.r().launch_kept(&mut kept, &s[1]).unwrap();
    let t = f.r().finish_trace().unwrap();
    for node in t.step_nodes() {
        let p = &t.slices()[node.parent.unwrap()];
        assert!(node.start_us >= p.start_us && node.end_us <= p.end_us);
    }
    drop(kept);
    // A trace left running at teardown.
    f.r().start_trace_with_capacity(max).unwrap();
    f.hazard_free();
    f.teardown();
}

// ---------------------------------------------------------------------
// 3. Copy runs whose work differs from the first run's around the cuts
// ---------------------------------------------------------------------

/// Builds the step of every runner, launches it twice, replays per
/// runner; returns the hazards.
fn step_and_replays(f: &mut Fan) -> Vec<sim::Hazard> {
    let spec_items: Vec<Item> = (0..f.sinks.len())
        .map(|r| Item::Replay(r as u32, r))
        .collect();
    f.per_runner(&spec_items);
    if let Ok(mut kept) = f.build(&spec_items, false) {
        let s = f.streams.clone();
        f.r().launch_kept(&mut kept, &s[0]).unwrap();
        f.r().launch_kept(&mut kept, &s[1]).unwrap();
    }
    f.per_runner(&spec_items);
    f.r().synchronize().unwrap();
    f.sim.hazards()
}

/// Either the writer is refused (typed, nothing leaked), or its steps
/// and replays are hazard-free.
fn refused_or_hazard_free(name: &str, spec: &Spec, writer: Writer) {
    let mut f = fan_custom(spec, writer);
    if f.r.is_some() {
        let h = step_and_replays(&mut f);
        assert!(h.is_empty(), "{name}: accepted, and: {h:?}");
        eprintln!("{name}: accepted, hazard-free");
    } else {
        assert!(!f.errors.is_empty(), "{name}");
        eprintln!("{name}: refused: {:?}", f.errors);
    }
    f.teardown();
}

fn write_all(w: &W, s: &sim::Stream, src: &dyn Fn(&W, &sim::Stream, usize) -> R) -> R {
    for i in 0..w.hs.len() {
        src(w, s, i)?;
        w.cap.ready(w.hs[i], s)?;
    }
    Ok(())
}

#[test]
fn a_copy_run_that_writes_a_handoff_after_its_ready_point() {
    let spec = Spec::new(3);
    refused_or_hazard_free("copy writes x0 after ready(h0)", &spec, &mut |w, s| {
        let t = w.sim.alloc_async(s, N)?;
        w.sim.launch(s, sim::Op::fill(&t, 2.0), 1)?;
        for i in 0..3 {
            w.sim.launch(s, sim::Op::copy(&t, &w.xs[i]), 5)?;
            w.cap.ready(w.hs[i], s)?;
            if w.run >= 2 && i == 0 {
                w.sim.launch(s, sim::Op::fill(&w.xs[0], 9.0), 50)?;
            }
        }
        w.sim.launch(s, sim::Op::copy(&t, w.own), 100)?;
        w.sim.free_async(s, &t)?;
        Ok(())
    });
}

#[test]
fn a_writer_that_writes_a_handoff_after_its_ready_point_in_every_run() {
    for temps in [false, true] {
        let spec = Spec::new(2);
        refused_or_hazard_free("every run writes x0 after ready(h0)", &spec, &mut |w, s| {
            let t = if temps {
                Some(w.sim.alloc_async(s, N)?)
            } else {
                None
            };
            w.sim.launch(s, sim::Op::fill(&w.xs[0], 1.0), 5)?;
            w.cap.ready(w.hs[0], s)?;
            w.sim.launch(s, sim::Op::fill(&w.xs[0], 9.0), 50)?;
            w.sim.launch(s, sim::Op::fill(&w.xs[1], 2.0), 5)?;
            w.cap.ready(w.hs[1], s)?;
            w.sim.launch(s, sim::Op::fill(w.own, 3.0), 100)?;
            if let Some(t) = &t {
                w.sim.launch(s, sim::Op::fill(t, 3.0), 1)?;
                w.sim.free_async(s, t)?;
            }
            Ok(())
        });
    }
}

#[test]
fn a_copy_run_that_forks_across_a_cut() {
    // The first run keeps everything on its stream (so the crate cuts at
    // each ready point); the copy forks x1's write onto a side stream
    // across the cut at h0, joined before h1's ready point.
    let spec = Spec::new(2);
    refused_or_hazard_free("copy forks across a cut", &spec, &mut |w, s| {
        let t = w.sim.alloc_async(s, N)?;
        w.sim.launch(s, sim::Op::fill(&t, 2.0), 1)?;
        w.sim.launch(s, sim::Op::copy(&t, &w.xs[0]), 5)?;
        if w.run >= 2 {
            let fork = w.sim.create_event()?;
            w.sim.record_event(s, &fork)?;
            w.sim.wait_event(w.side, &fork)?;
            w.sim.launch(w.side, sim::Op::fill(&w.xs[1], 4.0), 80)?;
            w.cap.ready(w.hs[0], s)?;
            let join = w.sim.create_event()?;
            w.sim.record_event(w.side, &join)?;
            w.sim.wait_event(s, &join)?;
        } else {
            w.cap.ready(w.hs[0], s)?;
            w.sim.launch(s, sim::Op::fill(&w.xs[1], 4.0), 80)?;
        }
        w.cap.ready(w.hs[1], s)?;
        w.sim.launch(s, sim::Op::copy(&t, w.own), 10)?;
        w.sim.free_async(s, &t)?;
        Ok(())
    });
}

#[test]
fn a_writer_that_forks_across_a_ready_point_in_every_run() {
    // Not cut there: the readers of h0 start after the whole copy.
    for temps in [false, true] {
        let spec = Spec::new(3);
        let mut writer = |w: &W, s: &sim::Stream| -> R {
            let t = if temps {
                Some(w.sim.alloc_async(s, N)?)
            } else {
                None
            };
            w.sim.launch(s, sim::Op::fill(&w.xs[0], 1.0), 5)?;
            let fork = w.sim.create_event()?;
            w.sim.record_event(s, &fork)?;
            w.sim.wait_event(w.side, &fork)?;
            w.sim.launch(w.side, sim::Op::fill(&w.xs[1], 4.0), 80)?;
            w.cap.ready(w.hs[0], s)?;
            let join = w.sim.create_event()?;
            w.sim.record_event(w.side, &join)?;
            w.sim.wait_event(s, &join)?;
            w.cap.ready(w.hs[1], s)?;
            w.sim.launch(s, sim::Op::fill(&w.xs[2], 5.0), 5)?;
            w.cap.ready(w.hs[2], s)?;
            if let Some(t) = &t {
                w.sim.launch(s, sim::Op::fill(t, 3.0), 10)?;
                w.sim.launch(s, sim::Op::copy(t, w.own), 10)?;
                w.sim.free_async(s, t)?;
            } else {
                w.sim.launch(s, sim::Op::fill(w.own, 3.0), 10)?;
            }
            Ok(())
        };
        let mut f = fan_custom(&spec, &mut writer);
        if f.r.is_none() {
            // The sim may refuse a fork in a captured closure.
            assert!(!f.errors.is_empty());
            f.teardown();
            continue;
        }
        let h = step_and_replays(&mut f);
        assert!(h.is_empty(), "temps {temps}: {h:?}");
        let r = f.r.as_ref().unwrap();
        let v = |run: u32| f.sim.read_f32(&r.views(RunnerId(run)).unwrap()[0]).unwrap()[0];
        assert_eq!(
            (v(0), v(1), v(2), v(3)),
            (3.0, 1.0, 4.0, 5.0),
            "temps {temps}"
        );
        f.teardown();
    }
}

#[test]
fn a_copy_run_that_marks_a_ready_point_on_another_stream() {
    let spec = Spec::new(2);
    let mut f = fan_custom(&spec, &mut |w, s| {
        let t = w.sim.alloc_async(s, N)?;
        w.sim.launch(s, sim::Op::fill(&t, 2.0), 1)?;
        write_all(w, s, &|w, s, i| {
            w.sim.launch(s, sim::Op::copy(&t, &w.xs[i]), 5)?;
            if w.run >= 2 && i == 1 {
                // Marked on the side stream, which is not capturing.
                w.cap.ready(w.hs[1], w.side)?;
                return Err(replay_arena::Error::Backend(
                    replay_arena::BackendError::Refused {
                        op: "test",
                        reason: "unreachable if refused".into(),
                    },
                ));
            }
            Ok(())
        })?;
        w.sim.launch(s, sim::Op::copy(&t, w.own), 1)?;
        w.sim.free_async(s, &t)?;
        Ok(())
    });
    assert!(
        f.errors.iter().any(|e| e.contains("writer")),
        "{:?}",
        f.errors
    );
    assert!(f.r.is_none());
    let sim = f.sim.clone();
    assert!(!sim.is_capturing(&f.streams[0]).unwrap());
    assert!(!sim.is_capturing(&f.side).unwrap());
    f.errors.clear();
    f.teardown();
}

/// A writer whose temporaries live in different parts: `a` over every
/// cut, `b` between the first and second cut, `c` after the last.
fn temps_across_parts(w: &W, s: &sim::Stream) -> R {
    let sim = w.sim;
    let a = sim.alloc_async(s, N)?;
    sim.launch(s, sim::Op::fill(&a, 1.0), 1)?;
    sim.launch(s, sim::Op::copy(&a, &w.xs[0]), 5)?;
    w.cap.ready(w.hs[0], s)?;
    let b = sim.alloc_async(s, N)?;
    sim.launch(s, sim::Op::copy(&a, &b), 5)?;
    sim.launch(s, sim::Op::scale(&b, 2.0), 5)?;
    sim.launch(s, sim::Op::copy(&b, &w.xs[1]), 5)?;
    sim.free_async(s, &b)?;
    w.cap.ready(w.hs[1], s)?;
    sim.launch(s, sim::Op::copy(&a, &w.xs[2]), 5)?;
    sim.launch(s, sim::Op::scale(&w.xs[2], 3.0), 5)?;
    w.cap.ready(w.hs[2], s)?;
    let c = sim.alloc_async(s, N)?;
    sim.launch(s, sim::Op::copy(&a, &c), 50)?;
    sim.free_async(s, &a)?;
    sim.launch(s, sim::Op::add(&c, w.own), 50)?;
    sim.free_async(s, &c)?;
    Ok(())
}

#[test]
fn temporaries_living_in_different_parts_of_a_cut_copy() {
    let mut spec = Spec::new(3);
    spec.copies = 3;
    spec.chain = true;
    let items = all(&spec);
    let mut reference = fan_custom(&spec, &mut temps_across_parts);
    assert!(reference.errors.is_empty(), "{:?}", reference.errors);
    let mut f = fan_custom(&spec, &mut temps_across_parts);
    assert!(f.errors.is_empty(), "{:?}", f.errors);
    let mut plain = f.build(&items, false).unwrap();
    assert_eq!(plain.nodes(), 4 + (2 + 1 + 1) + 1); // reader 0 is cut at its own ready point
    let mut over = f.build(&items, true).unwrap();
    let s = f.streams.clone();
    for i in 0..3 {
        f.r().launch_kept(&mut plain, &s[i]).unwrap();
        f.per_runner(&items);
        f.r().launch_kept(&mut over, &s[4 - i]).unwrap();
        f.r().launch_kept(&mut over, &s[i]).unwrap();
    }
    drop(plain);
    drop(over);
    for _ in 0..12 {
        reference.per_runner(&items);
    }
    f.hazard_free();
    assert_eq!(f.values(), reference.values());
    reference.teardown();
    f.teardown();
}

#[test]
fn a_temporary_freed_in_a_later_part_than_the_copy_run_ends_its_use() {
    // The copy run frees its temporary before a cut where the first run
    // freed it after: same ready points, other memory nodes per part.
    let spec = Spec::new(2);
    refused_or_hazard_free("free moved across a cut", &spec, &mut |w, s| {
        let t = w.sim.alloc_async(s, N)?;
        w.sim.launch(s, sim::Op::fill(&t, 2.0), 1)?;
        w.sim.launch(s, sim::Op::copy(&t, &w.xs[0]), 5)?;
        w.sim.launch(s, sim::Op::copy(&t, &w.xs[1]), 5)?;
        if w.run >= 2 {
            w.sim.free_async(s, &t)?;
        }
        w.cap.ready(w.hs[0], s)?;
        w.cap.ready(w.hs[1], s)?;
        if w.run == 1 {
            w.sim.free_async(s, &t)?;
        }
        w.sim.launch(s, sim::Op::fill(w.own, 1.0), 5)?;
        Ok(())
    });
}

#[test]
fn a_temporary_used_after_its_free_in_a_later_part_is_refused() {
    let spec = Spec::new(2);
    refused_or_hazard_free("use after free across a cut", &spec, &mut |w, s| {
        let t = w.sim.alloc_async(s, N)?;
        w.sim.launch(s, sim::Op::fill(&t, 2.0), 1)?;
        w.sim.launch(s, sim::Op::copy(&t, &w.xs[0]), 5)?;
        if w.run >= 2 {
            w.sim.free_async(s, &t)?;
        }
        w.cap.ready(w.hs[0], s)?;
        w.sim.launch(s, sim::Op::copy(&t, &w.xs[1]), 5)?;
        w.cap.ready(w.hs[1], s)?;
        if w.run == 1 {
            w.sim.free_async(s, &t)?;
        }
        w.sim.launch(s, sim::Op::fill(w.own, 1.0), 5)?;
        Ok(())
    });
}

// ---------------------------------------------------------------------
// 4. Faults while building and launching step graphs of cut writers
// ---------------------------------------------------------------------

#[test]
fn a_fault_at_every_call_of_building_and_launching_cut_step_graphs() {
    let mut spec = Spec::new(3);
    spec.copies = 3;
    spec.chain = true;
    let items = all(&spec);
    let program = |f: &mut Fan| -> Vec<String> {
        let mut errs = Vec::new();
        let s = f.streams.clone();
        match f.build(&items, false) {
            Ok(mut k) => {
                for i in 0..2 {
                    if let Err(e) = f.r().launch_kept(&mut k, &s[i]) {
                        errs.push(e.to_string());
                    }
                }
            }
            Err(e) => errs.push(e.to_string()),
        }
        match f.build(&items, true) {
            Ok(mut k) => {
                for i in 0..3 {
                    if let Err(e) = f.r().launch_kept(&mut k, &s[i]) {
                        errs.push(e.to_string());
                    }
                }
            }
            Err(e) => errs.push(e.to_string()),
        }
        for it in &items {
            if let Item::Replay(r, st) = *it {
                if let Err(e) = f.r().replay(RunnerId(r), &s[st]) {
                    errs.push(e.to_string());
                }
            }
        }
        errs
    };
    let mut probe = fan(&spec, &identity(3));
    probe.sim.inject(Faults::none());
    assert!(program(&mut probe).is_empty());
    let calls = probe.sim.fault_log().calls;
    probe.sim.inject(Faults::none());
    probe.teardown();
    assert!(calls > 20, "{calls}");
    for n in 0..calls {
        let mut f = fan(&spec, &identity(3));
        f.sim.inject(Faults::at(n));
        let res = catch_unwind(AssertUnwindSafe(|| program(&mut f)));
        let inj = f.sim.fault_log().injected.clone();
        f.sim.inject(Faults::none());
        assert!(res.is_ok(), "panic in library, fault at {n}: {inj:?}");
        assert!(
            f.sim.hazards().is_empty(),
            "fault at {n} {inj:?}: {:?}",
            f.sim.hazards()
        );
        // The plan goes on after the fault.
        let _ = program(&mut f);
        let _ = f.r().synchronize();
        assert!(
            f.sim.hazards().is_empty(),
            "after fault at {n} {inj:?}: {:?}",
            f.sim.hazards()
        );
        f.teardown();
    }
}

/// A single-runner capture of `work` (repeatable or not, with a handoff
/// `h` read by runner 1); returns the errors and whether it sealed, and
/// replays and step-launches it if so.
fn uaf_probe(
    repeatable: bool,
    work: &dyn Fn(
        &sim::Device,
        &replay_arena::RunnerCapture<'_, sim::Device>,
        HandoffId,
        &replay_arena::View<'_>,
        &sim::Stream,
        usize,
    ) -> R,
) -> (Vec<String>, bool, Vec<sim::Hazard>, GraphMemory) {
    let sim = sim::Device::new();
    let mut d = Discovering::new(PlanConfig::new());
    let h = {
        let mut a = d.arm(RunnerId(0)).unwrap();
        a.record(OWN).unwrap();
        a.hand_off(GRAD).unwrap()
    };
    d.arm(RunnerId(1)).unwrap().receive(h).unwrap();
    let s = [sim.stream(), sim.stream()];
    let mut capturing = d
        .plan(Policy::Generations(2))
        .unwrap()
        .allocate(sim.clone())
        .unwrap();
    let mut errs = Vec::new();
    {
        let cap = capturing.capture(RunnerId(0)).unwrap();
        let own = cap.take(OWN).unwrap();
        let out = cap.hand_off(h).unwrap();
        let mut run = 0;
        let res = if repeatable {
            cap.stream_capture_repeatable(&s[0], |st| -> R {
                run += 1;
                work(&sim, &cap, h, &out, st, run)?;
                Ok(sim.launch(st, sim::Op::fill(&own, 1.0), 1)?)
            })
        } else {
            cap.stream_capture(&s[0], |st| -> R {
                work(&sim, &cap, h, &out, st, 1)?;
                Ok(sim.launch(st, sim::Op::fill(&own, 1.0), 1)?)
            })
        };
        if let Err(e) = res {
            errs.push(e.to_string());
        }
        if let Err(e) = cap.finish() {
            errs.push(e.to_string());
        }
    }
    {
        let cap = capturing.capture(RunnerId(1)).unwrap();
        let input = cap.receive(h).unwrap();
        let sink = sim.alloc_f32(N).unwrap();
        cap.stream_capture(&s[1], |st| sim.launch(st, sim::Op::add(&input, &sink), 3))
            .unwrap();
        cap.finish().unwrap();
        std::mem::forget(sink);
    }
    let sealed = match capturing.seal() {
        Ok(mut r) => {
            r.replay(RunnerId(0), &s[0]).unwrap();
            r.replay(RunnerId(1), &s[1]).unwrap();
            let mut step = r.step();
            match step.replay(RunnerId(0), &s[0]) {
                Ok(_) => {
                    step.replay(RunnerId(1), &s[1]).unwrap();
                    match step.build() {
                        Ok(mut g) => g.launch(&s[0]).unwrap(),
                        Err(e) => errs.push(format!("build: {e}")),
                    }
                }
                Err(e) => errs.push(format!("step: {e}")),
            }
            r.replay(RunnerId(0), &s[0]).unwrap();
            r.synchronize().unwrap();
            true
        }
        Err(e) => {
            errs.push(format!("seal: {e}"));
            false
        }
    };
    (errs, sealed, sim.hazards(), pool(&sim))
}

#[test]
fn a_temporary_used_after_its_free_stays_hazard_free_in_every_capture_shape() {
    // (a) one graph; (b) repeatable, no cut; (c) repeatable, the use in a
    // later part than the free in both runs; (d) only in the copy.
    type Work = Box<
        dyn Fn(
            &sim::Device,
            &replay_arena::RunnerCapture<'_, sim::Device>,
            HandoffId,
            &replay_arena::View<'_>,
            &sim::Stream,
            usize,
        ) -> R,
    >;
    let cases: Vec<(&str, bool, Work)> = vec![
        (
            "one graph",
            false,
            Box::new(|sim, cap, h, out, s, _| {
                let t = sim.alloc_async(s, N)?;
                sim.launch(s, sim::Op::fill(&t, 2.0), 1)?;
                sim.free_async(s, &t)?;
                sim.launch(s, sim::Op::copy(&t, out), 5)?;
                cap.ready(h, s)?;
                Ok(())
            }),
        ),
        (
            "repeatable, no cut",
            true,
            Box::new(|sim, cap, h, out, s, _| {
                let t = sim.alloc_async(s, N)?;
                sim.launch(s, sim::Op::fill(&t, 2.0), 1)?;
                sim.free_async(s, &t)?;
                sim.launch(s, sim::Op::copy(&t, out), 5)?;
                cap.ready(h, s)?;
                Ok(())
            }),
        ),
        (
            "repeatable, across a cut",
            true,
            Box::new(|sim, cap, h, out, s, _| {
                let t = sim.alloc_async(s, N)?;
                sim.launch(s, sim::Op::copy(&t, out), 1)?;
                sim.free_async(s, &t)?;
                cap.ready(h, s)?;
                sim.launch(s, sim::Op::fill(&t, 7.0), 5)?;
                Ok(())
            }),
        ),
        (
            "copy only, across a cut",
            true,
            Box::new(|sim, cap, h, out, s, run| {
                let t = sim.alloc_async(s, N)?;
                sim.launch(s, sim::Op::copy(&t, out), 1)?;
                if run >= 2 {
                    sim.free_async(s, &t)?;
                }
                cap.ready(h, s)?;
                sim.launch(s, sim::Op::fill(&t, 7.0), 5)?;
                if run == 1 {
                    sim.free_async(s, &t)?;
                }
                Ok(())
            }),
        ),
    ];
    for (name, repeatable, work) in cases {
        let (errs, sealed, hazards, p) = uaf_probe(repeatable, &*work);
        eprintln!("{name}: sealed {sealed} errs {errs:?} hazards {hazards:?} pool {p:?}");
        assert!(hazards.is_empty(), "{name}: {hazards:?}");
        assert_eq!(p.used, 0, "{name}: {p:?}");
        let _ = sealed;
    }
}

#[test]
fn a_temporary_read_after_its_free_never_aliases_a_later_temporary() {
    // The sim keeps a graph's temporaries for the graph's life: one freed
    // and then read must not see a later allocation's bytes.
    let spans = std::cell::RefCell::new(Vec::new());
    let (errs, sealed, hazards, p) = uaf_probe(true, &|sim, cap, h, out, s, _| {
        let t1 = sim.alloc_async(s, N)?;
        sim.launch(s, sim::Op::fill(&t1, 1.0), 1)?;
        sim.free_async(s, &t1)?;
        cap.ready(h, s).ok();
        let t2 = sim.alloc_async(s, N)?;
        spans.borrow_mut().push((t1.addr(), t2.addr()));
        sim.launch(s, sim::Op::fill(&t2, 5.0), 1)?;
        sim.launch(s, sim::Op::copy(&t1, &t2), 5)?;
        sim.free_async(s, &t2)?;
        let _ = out;
        Ok(())
    });
    assert!(hazards.is_empty(), "{hazards:?}");
    for (a, b) in spans.borrow().iter() {
        assert!(
            a.abs_diff(*b) >= 4 * N as u64,
            "a freed temporary's bytes handed out again"
        );
    }
    let _ = (errs, sealed);
    assert_eq!(p.used, 0, "{p:?}");
}

#[test]
fn a_raw_span_forged_at_another_graphs_temporary_is_refused() {
    // The writer's temporary lives over its cut and tail; a reader that
    // starts at the cut forges a raw span at that temporary's address.
    for step_graph in [false, true] {
        let sim = sim::Device::new();
        let mut d = Discovering::new(PlanConfig::new());
        let h = {
            let mut a = d.arm(RunnerId(0)).unwrap();
            a.record(OWN).unwrap();
            a.hand_off(GRAD).unwrap()
        };
        {
            let mut a = d.arm(RunnerId(1)).unwrap();
            a.record(OWN).unwrap();
            a.receive(h).unwrap();
        }
        let s = [sim.stream(), sim.stream()];
        let mut capturing = d
            .plan(Policy::Generations(2))
            .unwrap()
            .allocate(sim.clone())
            .unwrap();
        let addrs = std::cell::RefCell::new(Vec::new());
        {
            let cap = capturing.capture(RunnerId(0)).unwrap();
            let own = cap.take(OWN).unwrap();
            let out = cap.hand_off(h).unwrap();
            cap.stream_capture_repeatable(&s[0], |st| -> R {
                let t = sim.alloc_async(st, N)?;
                addrs.borrow_mut().push(t.addr());
                sim.launch(st, sim::Op::fill(&t, 1.0), 1)?;
                sim.launch(st, sim::Op::copy(&t, &out), 1)?;
                cap.ready(h, st)?;
                sim.launch(st, sim::Op::fill(&t, 2.0), 100)?;
                sim.launch(st, sim::Op::copy(&t, &own), 1)?;
                sim.free_async(st, &t)?;
                Ok(())
            })
            .unwrap();
            cap.finish().unwrap();
        }
        let mut errs = Vec::new();
        {
            let cap = capturing.capture(RunnerId(1)).unwrap();
            let own = cap.take(OWN).unwrap();
            let input = cap.receive(h).unwrap();
            let forged: Vec<sim::Span> = addrs
                .borrow()
                .iter()
                .map(|a| sim::Span::new(*a, N))
                .collect();
            let res = cap.stream_capture(&s[1], |st| -> R {
                sim.launch(st, sim::Op::copy(&input, &own), 1)?;
                for f in &forged {
                    sim.launch(st, sim::Op::fill(f, 9.0), 10)?;
                }
                Ok(())
            });
            if let Err(e) = res {
                errs.push(e.to_string());
            }
            if let Err(e) = cap.finish() {
                errs.push(e.to_string());
            }
        }
        match capturing.seal() {
            Ok(mut r) => {
                for _ in 0..2 {
                    r.replay(RunnerId(0), &s[0]).unwrap();
                    r.replay(RunnerId(1), &s[1]).unwrap();
                }
                if step_graph {
                    let mut step = r.step();
                    step.replay(RunnerId(0), &s[0]).unwrap();
                    step.replay(RunnerId(1), &s[1]).unwrap();
                    let mut g = step.build().unwrap();
                    g.launch(&s[0]).unwrap();
                }
                r.synchronize().unwrap();
                assert!(
                    sim.hazards().is_empty(),
                    "step {step_graph}: forged span accepted, and: {:?}",
                    sim.hazards()
                );
            }
            Err(e) => {
                assert!(!errs.is_empty(), "{e}");
                eprintln!("forged span refused: {errs:?}");
                drop(e.into_capturing().replan());
            }
        }
        assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    }
}

#[test]
fn seeded_faults_over_whole_programs_of_split_writers() {
    let mut spec = Spec::new(3);
    spec.copies = 3;
    spec.chain = true;
    spec.reader_temps = true;
    spec.g = 3;
    let mut items = all(&spec);
    items.push(Item::Consume(0));
    for seed in 0..80u64 {
        let sim = sim::Device::new();
        let res = catch_unwind(AssertUnwindSafe(|| {
            let mut f = fan_with(
                sim.clone(),
                &spec,
                &identity(3),
                Some(Faults::seeded(seed, 40)),
                None,
            );
            sim.inject(Faults::seeded(seed.wrapping_mul(31), 25));
            if f.r.is_some() {
                SEALED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let s = f.streams.clone();
                for overlapping in [false, true, false] {
                    if let Ok(mut k) = f.try_build(&items, overlapping) {
                        for i in 0..3 {
                            let _ = f.r().launch_kept(&mut k, &s[i]);
                        }
                        if overlapping {
                            std::mem::forget(k);
                        }
                    }
                    for it in &items {
                        if let Item::Replay(r, st) = *it {
                            let _ = f.r().replay(RunnerId(r), &s[st]);
                        }
                    }
                }
                let _ = f.r().synchronize();
            }
            sim.inject(Faults::none());
            f
        }));
        let f = res.unwrap_or_else(|_| panic!("panic in library, seed {seed}"));
        assert!(sim.hazards().is_empty(), "seed {seed}: {:?}", sim.hazards());
        drop(f);
        assert!(sim.hazards().is_empty(), "seed {seed}: {:?}", sim.hazards());
    }
    let sealed = SEALED.load(std::sync::atomic::Ordering::Relaxed);
    assert!(sealed > 5, "only {sealed} programs ran");
}

static SEALED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
