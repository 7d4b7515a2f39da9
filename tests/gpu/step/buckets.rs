//! Shape buckets on the GPU: three buckets of different sizes share one
//! plan (their arenas laid over each other), switching every step for 30
//! steps on a pool of two streams. Each step stages its bucket's input from
//! the host (`consume_mut` of a `Purpose::Input` request, cudarc's
//! `memcpy_htod` into the typed view), replays the bucket's graph (ops that
//! allocate their outputs inside the capture), and folds its output into the
//! bucket's accumulator on a side stream (a slow consumer). Bit for bit
//! equal to the same steps run eagerly per bucket; compute-sanitizer
//! memcheck clean.
#![cfg(feature = "cuda")]

use crate::support;

use replay_arena::cuda::cudarc::driver::CudaSlice;
use replay_arena::cuda::{self, ViewExt};
use replay_arena::{Policy, ReadOnly, Replayable, RunnerId, View};
use support::gpu::bucketed::{self, host_input};
use support::ops::{Framework, OpResult};

/// Elements per bucket.
const SIZES: [usize; 3] = [1 << 12, 1 << 14, 1 << 16];
const STEPS: usize = 30;
const SPIN: i64 = 20_000;

struct Model {
    fw: Framework,
    weights: Vec<CudaSlice<i32>>,
}

fn bucket_of(step: usize) -> usize {
    step % SIZES.len()
}

impl Model {
    fn new() -> Model {
        let fw = Framework::new();
        let io = &fw.io;
        let weights = SIZES
            .iter()
            .enumerate()
            .map(|(b, &n)| {
                let host: Vec<i32> = (0..n as i32).map(|i| i ^ (31 * b as i32 + 3)).collect();
                io.cudarc().clone_htod(&host).unwrap()
            })
            .collect();
        Model { fw, weights }
    }

    fn accumulators(&self) -> Vec<CudaSlice<i32>> {
        SIZES
            .iter()
            .map(|&n| self.fw.io.cudarc().alloc_zeros(n).unwrap())
            .collect()
    }

    fn read(&self, acc: &[CudaSlice<i32>]) -> Vec<Vec<i32>> {
        acc.iter()
            .map(|a| self.fw.io.cudarc().clone_dtoh(a).unwrap())
            .collect()
    }

    /// The same steps, one stream, the framework's own buffers.
    fn eager(&self) -> Vec<Vec<i32>> {
        let (io, ops) = (&self.fw.io, &self.fw.ops);
        let mut acc = self.accumulators();
        for step in 0..STEPS {
            let b = bucket_of(step);
            let host = host_input(SIZES[b], b, step);
            let y = bucketed::eager(ops, io, &host, &self.weights[b]);
            ops.fold(io, &mut acc[b], &y, 0).unwrap();
        }
        self.read(&acc)
    }

    /// One plan for the three buckets, captured.
    fn plan(&self) -> Replayable<cuda::Device> {
        let d = bucketed::discover(SIZES.map(|n| (format!("n={n}"), n)));
        let planned = d.plan(Policy::Generations(2)).unwrap();
        let largest = 2 * 4 * SIZES[2] as u64;
        assert!(
            planned.total_bytes() < planned.separate_bytes(),
            "shared {} against separate {}",
            planned.total_bytes(),
            planned.separate_bytes()
        );
        assert!(planned.total_bytes() >= largest);
        let mut capturing = planned.allocate(self.fw.backend.clone()).unwrap();
        let capture_stream = self.fw.backend.new_stream().unwrap();
        for (b, &n) in SIZES.iter().enumerate() {
            let cap = capturing.capture(RunnerId(b as u32)).unwrap();
            let x = cap.take(bucketed::input(n)).unwrap();
            let y = cap.take(bucketed::output(n)).unwrap();
            let (w, ops) = (&self.weights[b], &self.fw.ops);
            // Repeatable: a step graph of the bucket moves in its copy.
            cap.stream_capture_repeatable(&capture_stream, |s| bucketed::work(ops, s, (&x, &y), w))
                .unwrap();
            cap.finish().unwrap();
        }
        self.fw.io.synchronize().unwrap();
        capturing.seal().unwrap()
    }
}

/// Stages bucket `b`'s input of `step`: the write waits for every replay
/// still reading the bytes (this bucket's or another's); the replay waits
/// for the copy.
fn stage(replayable: &mut Replayable<cuda::Device>, on: &cuda::Stream, step: usize) {
    let b = bucket_of(step);
    let host = host_input(SIZES[b], b, step);
    bucketed::stage(replayable, RunnerId(b as u32), on, &host);
}

fn assert_equal(got: &[Vec<i32>], eager: &[Vec<i32>]) {
    for b in 0..SIZES.len() {
        let differ = got[b].iter().zip(&eager[b]).filter(|(x, y)| x != y).count();
        assert_eq!(
            differ, 0,
            "bucket {b}: {differ} of {} elements differ from eager",
            SIZES[b]
        );
    }
}

/// What both tests start from: the model and its eager run, the plan, a
/// pool of two streams, a stream to stage on, a side stream for the
/// consumers, and the buckets' accumulators.
struct Setup {
    model: Model,
    eager: Vec<Vec<i32>>,
    replayable: Replayable<cuda::Device>,
    pool: [cuda::Stream; 2],
    on_stage: cuda::Stream,
    side: cuda::Stream,
    acc: Vec<CudaSlice<i32>>,
}

fn setup() -> Setup {
    let model = Model::new();
    let eager = model.eager();
    let replayable = model.plan();
    let b = &model.fw.backend;
    let pool = [b.new_stream().unwrap(), b.new_stream().unwrap()];
    let (on_stage, side) = (b.new_stream().unwrap(), b.new_stream().unwrap());
    let acc = model.accumulators();
    Setup {
        model,
        eager,
        replayable,
        pool,
        on_stage,
        side,
        acc,
    }
}

/// The consumer: folds the bucket's output (its second view) into `acc`,
/// slowly.
fn fold(
    model: &Model,
    s: &cuda::Stream,
    views: &[View<'_, ReadOnly>],
    acc: &mut CudaSlice<i32>,
) -> OpResult<()> {
    let y = views[1].as_cuda::<i32>(s).map_err(|e| e.to_string())?;
    model.fw.ops.fold(s, acc, &y, SPIN)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn three_buckets_switching_every_step_equal_eager() {
    let mut t = setup();
    for step in 0..STEPS {
        let bucket = bucket_of(step);
        let runner = RunnerId(bucket as u32);
        stage(&mut t.replayable, &t.on_stage, step);
        t.replayable.replay(runner, &t.pool[step % 2]).unwrap();
        let acc_b = &mut t.acc[bucket];
        t.replayable
            .consume(runner, &t.side, |s, views| fold(&t.model, s, views, acc_b))
            .unwrap();
    }
    t.replayable.wait_all(&t.model.fw.io).unwrap();
    assert_equal(&t.model.read(&t.acc), &t.eager);
    let stats = t.replayable.fence_stats();
    println!(
        "3 buckets, {STEPS} switching steps: plan {} B shared against {} B as separate plans; {stats}",
        t.replayable.plan().total_bytes(),
        t.replayable.plan().separate_bytes()
    );
    assert!(
        stats.waits > 0,
        "switching buckets must wait for the other buckets' users"
    );
}

/// A step graph per bucket, kept beside the plan, launched whichever the
/// next step's bucket is, with the inputs staged per runner between them.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_kept_step_graph_per_bucket_launched_in_turn_equals_eager() {
    let mut t = setup();
    let mut kept: Vec<replay_arena::KeptStep<cuda::Device>> = Vec::new();
    for (bucket, acc_b) in t.acc.iter_mut().enumerate() {
        let runner = RunnerId(bucket as u32);
        // The buckets share bytes: staging one's input takes another's, so
        // each schedule is built right after its bucket's input is staged.
        stage(&mut t.replayable, &t.on_stage, bucket);
        let mut step = t.replayable.step();
        step.replay(runner, &t.pool[0]).unwrap();
        step.consume(runner, &t.side, |s, views| fold(&t.model, s, views, acc_b))
            .unwrap();
        kept.push(step.build().unwrap().keep());
    }
    for step in 0..STEPS {
        let bucket = bucket_of(step);
        // Another bucket's replays may have taken this bucket's bytes
        // since: its input is staged again before every launch.
        stage(&mut t.replayable, &t.on_stage, step);
        t.replayable
            .launch_kept(&mut kept[bucket], &t.pool[step % 2])
            .unwrap();
    }
    for k in &kept {
        t.replayable.wait_kept(k, &t.model.fw.io).unwrap();
    }
    t.replayable.wait_all(&t.model.fw.io).unwrap();
    assert_equal(&t.model.read(&t.acc), &t.eager);
    assert_eq!(t.replayable.fence_stats().step_launches, STEPS as u64);
    drop(kept);
}
