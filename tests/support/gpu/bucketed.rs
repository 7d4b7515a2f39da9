//! The shape-bucket tests' model: one runner per bucket of `n` values,
//! its input staged from the host before each replay (`consume_mut` of a
//! `Purpose::Input` request, cudarc's `memcpy_htod` into the typed view),
//! its graph `y = mix2(mix2(x, w, 1), x, 2)` with the inner result a
//! temporary the op allocates and drops inside the capture.

use replay_arena::cuda::cudarc::driver::{CudaSlice, DevicePtr};
use replay_arena::cuda::{self, ViewExt};
use replay_arena::{
    ArmedRunner, DType, Discovering, Domain, PlanConfig, Purpose, Replayable, Request, RunnerId,
    View,
};

use crate::support::ops::{OpResult, Ops};

/// A bucket's input, staged from the host.
pub fn input(n: usize) -> Request {
    Request::new(Domain::Device, DType::I32, n as u64).purpose(Purpose::Input)
}

/// A bucket's output.
pub fn output(n: usize) -> Request {
    Request::new(Domain::Device, DType::I32, n as u64)
}

/// What the program stages for bucket `key` (of `n` values) at `visit`.
pub fn host_input(n: usize, key: usize, visit: usize) -> Vec<i32> {
    (0..n as i32)
        .map(|i| i.wrapping_mul(2654435761u32 as i32) ^ (visit as i32 * 7919 + key as i32))
        .collect()
}

/// Records a bucket's requests of `n` values each.
pub fn record(armed: &mut ArmedRunner<'_>, n: usize) {
    armed.record(input(n)).unwrap();
    armed.record(output(n)).unwrap();
}

/// One bucket per `(name, n)`, runner `i` in the `i`-th.
pub fn discover(buckets: impl IntoIterator<Item = (String, usize)>) -> Discovering {
    let mut d = Discovering::new(PlanConfig::new());
    for (i, (name, n)) in buckets.into_iter().enumerate() {
        d.bucket(name).unwrap();
        record(&mut d.arm(RunnerId(i as u32)).unwrap(), n);
    }
    d
}

/// A bucket's graph on `s`, from its views `x` and `y` and weights `w`.
pub fn work(
    ops: &Ops,
    s: &cuda::Stream,
    (x, y): (&View<'_>, &View<'_>),
    w: &impl DevicePtr<i32>,
) -> OpResult<()> {
    let x = x.as_cuda::<i32>(s).map_err(|e| e.to_string())?;
    let mut y = y.as_cuda::<i32>(s).map_err(|e| e.to_string())?;
    // A temporary the op allocates, freed inside the graph.
    let t = ops.mix2(s, &x, w, 1)?;
    ops.mix2_into(s, &mut y, &t, &x, 2)
}

/// The same eagerly on `io`, the framework's own buffers: the output for
/// `host` staged.
pub fn eager(
    ops: &Ops,
    io: &cuda::Stream,
    host: &[i32],
    w: &impl DevicePtr<i32>,
) -> CudaSlice<i32> {
    let x: CudaSlice<i32> = io.cudarc().clone_htod(host).unwrap();
    let t = ops.mix2(io, &x, w, 1).unwrap();
    ops.mix2(io, &t, &x, 2).unwrap()
}

/// Stages `host` into `runner`'s input on `on`: the write waits for every
/// replay still reading the bytes; the next replay waits for the copy.
pub fn stage(
    replayable: &mut Replayable<cuda::Device>,
    runner: RunnerId,
    on: &cuda::Stream,
    host: &[i32],
) {
    replayable
        .consume_mut(runner, on, |s, views| {
            let mut x = views[0].as_cuda::<i32>(s).map_err(|e| e.to_string())?;
            s.cudarc()
                .memcpy_htod(host, &mut x)
                .map_err(|e| format!("{e:?}"))
        })
        .unwrap();
}
