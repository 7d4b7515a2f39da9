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

mod support;

use replay_arena::cuda::cudarc::driver::CudaSlice;
use replay_arena::cuda::{self, ViewExt};
use replay_arena::{DType, Discovering, Domain, PlanConfig, Policy, Purpose, Request, RunnerId};
use support::ops::Ops;

/// Elements per bucket.
const SIZES: [usize; 3] = [1 << 12, 1 << 14, 1 << 16];
const STEPS: usize = 30;
const SPIN: i64 = 20_000;

fn input(n: usize) -> Request {
    Request::new(Domain::Device, DType::I32, n as u64).purpose(Purpose::Input)
}

fn output(n: usize) -> Request {
    Request::new(Domain::Device, DType::I32, n as u64)
}

/// What the program stages before step `step` of bucket `b`.
fn host_input(b: usize, step: usize) -> Vec<i32> {
    (0..SIZES[b] as i32)
        .map(|i| i.wrapping_mul(2654435761u32 as i32) ^ (step as i32 * 7919 + b as i32))
        .collect()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn three_buckets_switching_every_step_equal_eager() {
    let backend =
        cuda::Device::new(0).unwrap_or_else(|e| panic!("this test needs a CUDA GPU: {e}"));
    let ops = Ops::new(&backend);
    let io = backend.new_stream().unwrap();
    let weights: Vec<CudaSlice<i32>> = SIZES
        .iter()
        .enumerate()
        .map(|(b, &n)| {
            let host: Vec<i32> = (0..n as i32).map(|i| i ^ (31 * b as i32 + 3)).collect();
            io.cudarc().clone_htod(&host).unwrap()
        })
        .collect();
    let accumulators = || -> Vec<CudaSlice<i32>> {
        SIZES
            .iter()
            .map(|&n| io.cudarc().alloc_zeros(n).unwrap())
            .collect()
    };
    let bucket_of = |step: usize| step % SIZES.len();

    // Eager: the same steps, one stream, the framework's own buffers.
    let mut eager = accumulators();
    for step in 0..STEPS {
        let b = bucket_of(step);
        let x: CudaSlice<i32> = io.cudarc().clone_htod(&host_input(b, step)).unwrap();
        let t = ops.mix2(&io, &x, &weights[b], 1).unwrap();
        let y = ops.mix2(&io, &t, &x, 2).unwrap();
        ops.fold(&io, &mut eager[b], &y, 0).unwrap();
    }
    let eager: Vec<Vec<i32>> = eager
        .iter()
        .map(|a| io.cudarc().clone_dtoh(a).unwrap())
        .collect();

    // One plan for the three buckets.
    let mut d = Discovering::new(PlanConfig::new());
    for (b, &n) in SIZES.iter().enumerate() {
        d.bucket(format!("n={n}")).unwrap();
        let mut armed = d.arm(RunnerId(b as u32)).unwrap();
        armed.record(input(n)).unwrap();
        armed.record(output(n)).unwrap();
    }
    let planned = d.plan(Policy::Generations(2)).unwrap();
    let largest = 2 * 4 * SIZES[2] as u64;
    assert!(
        planned.total_bytes() < planned.separate_bytes(),
        "shared {} against separate {}",
        planned.total_bytes(),
        planned.separate_bytes()
    );
    assert!(planned.total_bytes() >= largest);
    let mut capturing = planned.allocate(backend.clone()).unwrap();
    let capture_stream = backend.new_stream().unwrap();
    for (b, &n) in SIZES.iter().enumerate() {
        let cap = capturing.capture(RunnerId(b as u32)).unwrap();
        let (x, y) = (cap.take(input(n)).unwrap(), cap.take(output(n)).unwrap());
        let w = &weights[b];
        cap.stream_capture(&capture_stream, |s| {
            let x = x.as_cuda::<i32>(s).map_err(|e| e.to_string())?;
            let mut y = y.as_cuda::<i32>(s).map_err(|e| e.to_string())?;
            // A temporary the op allocates, freed inside the graph.
            let t = ops.mix2(s, &x, w, 1)?;
            ops.mix2_into(s, &mut y, &t, &x, 2)
        })
        .unwrap();
        cap.finish().unwrap();
    }
    let mut replayable = capturing.seal().unwrap();
    let pool = [backend.new_stream().unwrap(), backend.new_stream().unwrap()];
    let (stage, side) = (backend.new_stream().unwrap(), backend.new_stream().unwrap());
    let mut acc = accumulators();
    io.synchronize().unwrap();
    for step in 0..STEPS {
        let b = bucket_of(step);
        let runner = RunnerId(b as u32);
        let host = host_input(b, step);
        // Stage the input: waits for every replay still reading the bytes
        // (this bucket's or another's); the replay waits for the copy.
        replayable
            .consume_mut(runner, &stage, |s, views| {
                let mut x = views[0].as_cuda::<i32>(s).map_err(|e| e.to_string())?;
                s.cudarc()
                    .memcpy_htod(&host, &mut x)
                    .map_err(|e| format!("{e:?}"))
            })
            .unwrap();
        replayable.replay(runner, &pool[step % 2]).unwrap();
        let acc_b = &mut acc[b];
        replayable
            .consume(runner, &side, |s, views| {
                let y = views[1].as_cuda::<i32>(s).map_err(|e| e.to_string())?;
                ops.fold(s, acc_b, &y, SPIN)
            })
            .unwrap();
    }
    replayable.wait_all(&io).unwrap();
    let got: Vec<Vec<i32>> = acc
        .iter()
        .map(|a| io.cudarc().clone_dtoh(a).unwrap())
        .collect();
    for b in 0..SIZES.len() {
        let differ = got[b].iter().zip(&eager[b]).filter(|(x, y)| x != y).count();
        assert_eq!(
            differ, 0,
            "bucket {b}: {differ} of {} elements differ from eager",
            SIZES[b]
        );
    }
    let stats = replayable.fence_stats();
    println!(
        "3 buckets, {STEPS} switching steps: plan {} B shared against {} B as separate plans; {stats}",
        replayable.plan().total_bytes(),
        replayable.plan().separate_bytes()
    );
    assert!(
        stats.waits > 0,
        "switching buckets must wait for the other buckets' users"
    );
}
