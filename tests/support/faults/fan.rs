//! A fan: one writer of several handoffs, split at each ready point in
//! step graphs, each handoff read by a runner of its own (optionally one
//! reader handing on to a collector): the plan of the attacks on writers
//! split at their ready points.

#![allow(
    clippy::needless_range_loop,
    clippy::type_complexity,
    clippy::result_large_err
)]

use replay_arena::backend::Streams;
use replay_arena::sim::AsSpan;
use replay_arena::sim::{self, Faults};
use replay_arena::Policy;
use replay_arena::{
    DType, Discovering, Domain, HandoffId, KeptStep, PlanConfig, Replayable, Request,
    RunnerCapture, RunnerId, StepError, View,
};

use super::{assert_clean, assert_no_graph_memory, build, writer_of, R};
use crate::support::steps::allocate_discovered;

/// Elements of every buffer of a fan.
pub const N: usize = 16;

pub const OWN: Request = Request::new(Domain::Device, DType::F32, N as u64);

pub const GRAD: Request = Request::new(Domain::Device, DType::F32, N as u64);

/// The shape of a fan: runner 0 writes `k` handoffs, marking them ready
/// in `order(run)` (run 1 is the graph, run 2.. the step copies); reader
/// `i` (runner `i + 1`) receives handoff `i` on a stream of its own;
/// with `chain`, reader 0 also hands off to a collector (runner `k + 1`).
#[derive(Clone)]
pub struct Spec {
    pub k: usize,
    pub copies: usize,
    pub chain: bool,
    pub writer_temps: bool,
    pub reader_temps: bool,
    pub g: usize,
}

impl Spec {
    pub fn new(k: usize) -> Spec {
        Spec {
            k,
            copies: 1,
            chain: false,
            writer_temps: true,
            reader_temps: false,
            g: 2,
        }
    }
    pub fn runners(&self) -> usize {
        1 + self.k + self.chain as usize
    }
}

pub struct Fan {
    pub sim: sim::Device,
    pub streams: Vec<sim::Stream>,
    pub side: sim::Stream,
    pub r: Option<Replayable<sim::Device>>,
    pub failed: Option<replay_arena::Capturing<sim::Device>>,
    pub errors: Vec<String>,
    pub sinks: Vec<sim::HostBuffer>,
    pub consumer_sink: sim::HostBuffer,
    pub _keep: Vec<sim::HostBuffer>,
}

pub fn identity(k: usize) -> impl Fn(usize) -> Vec<usize> {
    move |_| (0..k).collect()
}

pub fn fan(spec: &Spec, order: &dyn Fn(usize) -> Vec<usize>) -> Fan {
    fan_faulty(sim::Device::new(), spec, order, None)
}

/// What a custom writer's work sees.
pub struct W<'a, 'c> {
    pub sim: &'a sim::Device,
    pub cap: &'a RunnerCapture<'c, sim::Device>,
    pub hs: &'a [HandoffId],
    pub xs: &'a [View<'a>],
    pub own: &'a View<'a>,
    pub side: &'a sim::Stream,
    pub run: usize,
}

pub type Writer<'w> = &'w mut dyn FnMut(&W, &sim::Stream) -> R;

pub fn fan_faulty(
    sim: sim::Device,
    spec: &Spec,
    order: &dyn Fn(usize) -> Vec<usize>,
    writer_faults: Option<Faults>,
) -> Fan {
    fan_with(sim, spec, order, writer_faults, None)
}

pub fn fan_custom(spec: &Spec, writer: Writer) -> Fan {
    fan_with(
        sim::Device::new(),
        spec,
        &identity(spec.k),
        None,
        Some(writer),
    )
}

pub fn fan_with(
    sim: sim::Device,
    spec: &Spec,
    order: &dyn Fn(usize) -> Vec<usize>,
    writer_faults: Option<Faults>,
    mut writer: Option<Writer>,
) -> Fan {
    let k = spec.k;
    let mut d = Discovering::new(PlanConfig::new());
    let hs = writer_of(&mut d, k, OWN, GRAD);
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
    let streams: Vec<sim::Stream> = (0..runners).map(|_| sim.new_stream()).collect();
    let side = sim.new_stream();
    let one = sim.alloc_f32(N).unwrap();
    sim.write_f32(&one, &[1.0; N]).unwrap();
    let count = sim.alloc_f32(N).unwrap();
    let sinks: Vec<sim::HostBuffer> = (0..runners).map(|_| sim.alloc_f32(N).unwrap()).collect();
    let consumer_sink = sim.alloc_f32(N).unwrap();
    let mut capturing = allocate_discovered(&sim, d, Policy::Generations(spec.g));
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
        let wside = sim.new_stream();
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
            sim.launch(s, sim::Kernel::add(&one, &count), 1)?;
            // With `writer_temps`, each part between ready points works on
            // a temporary of its own (allocated after the ready point before
            // it, freed before the one after it): none lives across a ready
            // point, so the step copies are cut at every one.
            let temp = |t: &mut Option<sim::Span>| -> replay_arena::Result<()> {
                if spec.writer_temps && t.is_none() {
                    let new = sim.alloc_async(s, N)?;
                    sim.launch(s, sim::Kernel::copy(&count, &new), 1)?;
                    *t = Some(new);
                }
                Ok(())
            };
            let release = |t: &mut Option<sim::Span>| match t.take() {
                Some(t) => sim.free_async(s, &t),
                None => Ok(()),
            };
            let mut t = None;
            let mut written = vec![false; k];
            for i in order(run) {
                if !written[i] {
                    temp(&mut t)?;
                    let src = t.unwrap_or_else(|| count.span());
                    sim.launch(s, sim::Kernel::copy(&src, &xs[i]), 5)?;
                    sim.launch(s, sim::Kernel::scale(&xs[i], (i + 1) as f32), 5)?;
                    written[i] = true;
                }
                release(&mut t)?;
                cap.ready(hs[i], s)?;
            }
            temp(&mut t)?;
            let src = t.unwrap_or_else(|| count.span());
            for i in 0..k {
                if !written[i] {
                    sim.launch(s, sim::Kernel::copy(&src, &xs[i]), 5)?;
                    sim.launch(s, sim::Kernel::scale(&xs[i], (i + 1) as f32), 5)?;
                }
            }
            sim.launch(s, sim::Kernel::copy(&src, &own), 100)?;
            release(&mut t)?;
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
            sim.launch(s, sim::Kernel::add(&input, sink), 20)?;
            if spec.reader_temps {
                let t = sim.alloc_async(s, N)?;
                sim.launch(s, sim::Kernel::copy(&input, &t), 3)?;
                sim.launch(s, sim::Kernel::copy(&t, &own), 3)?;
                sim.free_async(s, &t)?;
            } else {
                sim.launch(s, sim::Kernel::copy(&input, &own), 3)?;
            }
            if let Some(out) = &out {
                sim.launch(s, sim::Kernel::copy(&input, out), 2)?;
                sim.launch(s, sim::Kernel::scale(out, 10.0), 2)?;
                cap.ready(g_handoff.unwrap(), s)?;
                sim.launch(s, sim::Kernel::add(&input, &own), 50)?;
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
        record_and_finish!(cap, &streams[k + 1], |s| -> R {
            sim.launch(s, sim::Kernel::add(&input, sink), 7)?;
            sim.launch(s, sim::Kernel::copy(&input, &own), 1)?;
            Ok(())
        });
    }
    let (r, failed) = super::seal_or_note(capturing, &mut errors);
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
pub enum Item {
    Replay(u32, usize),
    Consume(u32),
}

impl Fan {
    pub fn r(&mut self) -> &mut Replayable<sim::Device> {
        self.r.as_mut().expect("sealed")
    }

    /// Runs `items` per runner (the reference for a step graph).
    pub fn per_runner(&mut self, items: &[Item]) {
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
                        sim.launch(s, sim::Kernel::add(&v[0], cs), 3)
                    })
                    .unwrap(),
            }
        }
    }

    pub fn build(
        &mut self,
        items: &[Item],
        overlapping: bool,
    ) -> Result<KeptStep<sim::Device>, StepError> {
        self.try_build(items, overlapping).map_err(|e| match e {
            BuildError::Step(e) => e,
            BuildError::Consume(e) => panic!("step consume: {e}"),
        })
    }

    /// `build`, with a failing consumer as an error of its own.
    pub fn try_build(
        &mut self,
        items: &[Item],
        overlapping: bool,
    ) -> Result<KeptStep<sim::Device>, BuildError> {
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
                        sim.launch(s, sim::Kernel::add(&v[0], cs), 3)
                    }) {
                        return Err(BuildError::Consume(e.to_string()));
                    }
                }
            }
        }
        let g = build(step, overlapping)?;
        Ok(g.keep())
    }

    pub fn values(&self) -> Vec<Vec<f32>> {
        let r = self.r.as_ref().unwrap();
        let buffers = self.sinks.iter().chain([&self.consumer_sink]);
        let views = (0..self.sinks.len()).flat_map(|l| r.views(RunnerId(l as u32)).unwrap());
        super::read_back(&self.sim, buffers, views.copied())
    }

    pub fn hazard_free(&self) {
        super::assert_hazard_free(&self.sim);
    }

    pub fn teardown(mut self) {
        let sim = self.sim.clone();
        super::drop_plan(self.r.take(), self.failed.take());
        drop(self);
        assert_no_graph_memory(&sim, "teardown");
        assert_clean(&sim, 0, "teardown");
    }
}

pub enum BuildError {
    Step(StepError),
    Consume(String),
}

impl From<StepError> for BuildError {
    fn from(e: StepError) -> Self {
        BuildError::Step(e)
    }
}

/// Every runner once, each on its own stream.
pub fn all(spec: &Spec) -> Vec<Item> {
    (0..spec.runners())
        .map(|r| Item::Replay(r as u32, r))
        .collect()
}

/// Builds the step of every runner, launches it twice, replays per
/// runner; returns the hazards.
pub fn step_and_replays(f: &mut Fan) -> Vec<sim::Hazard> {
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
pub fn refused_or_hazard_free(name: &str, spec: &Spec, writer: Writer) {
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

pub fn write_all(w: &W, s: &sim::Stream, src: &dyn Fn(&W, &sim::Stream, usize) -> R) -> R {
    for i in 0..w.hs.len() {
        src(w, s, i)?;
        w.cap.ready(w.hs[i], s)?;
    }
    Ok(())
}
