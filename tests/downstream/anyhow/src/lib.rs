//! A program on `anyhow`: `?` on every call of the crate's `cuda` backend,
//! and on cudarc's own calls inside the capture closure.

use std::sync::Arc;

use anyhow::Context as _;
use cudarc::driver::{CudaContext, CudaSlice};
use replay_arena::cuda::{probe, ViewExt};
use replay_arena::cuda;
use replay_arena::{
    Capturing, DType, Discovering, Domain, PlanConfig, Policy, Replayable, Request, RunnerId,
    SealError,
};

const WGRAD: Request = Request::new(Domain::Device, DType::F32, 1024);

/// Probes, opens device 0 and makes a stream; the probe's error (no driver)
/// comes back as an `anyhow::Error`.
pub fn open() -> anyhow::Result<(cuda::Device, cuda::Stream)> {
    let info = probe()?;
    let backend = cuda::Device::new(info.ordinal)?;
    let stream = backend.new_stream()?;
    Ok((backend, stream))
}

/// Adopts the program's context and per-thread stream.
pub fn adopt(ctx: Arc<CudaContext>) -> anyhow::Result<(cuda::Device, cuda::Stream)> {
    let backend = cuda::Device::from_context(ctx.clone())?;
    let stream = backend.wrap_stream(ctx.per_thread_stream())?;
    Ok((backend, stream))
}

/// Discovery, planning and allocation for two runners.
pub fn allocate(backend: cuda::Device) -> anyhow::Result<Capturing<cuda::Device>> {
    let mut discovery = Discovering::new(PlanConfig::new());
    for r in 0..2 {
        discovery.arm(RunnerId(r))?.record(WGRAD)?;
    }
    let planned = discovery.plan(Policy::Generations(2))?;
    Ok(planned.allocate(backend)?)
}

/// Captures one runner whose work is cudarc calls on its view.
pub fn capture(
    capturing: &mut Capturing<cuda::Device>,
    runner: RunnerId,
    stream: &cuda::Stream,
    input: &CudaSlice<f32>,
) -> anyhow::Result<()> {
    let cap = capturing.capture(runner)?;
    let view = cap.take(WGRAD)?;
    cap.stream_capture(stream, |s| -> anyhow::Result<()> {
        let mut out = view.as_cuda::<f32>(s)?;
        s.cudarc().memcpy_dtod(input, &mut out)?;
        Ok(())
    })?;
    cap.finish()?;
    Ok(())
}

/// Seals with `?`: on failure the `Capturing` travels inside the
/// `anyhow::Error`.
pub fn seal(capturing: Capturing<cuda::Device>) -> anyhow::Result<Replayable<cuda::Device>> {
    Ok(capturing.seal()?)
}

/// Seals, or gets the `Capturing` back out of the `anyhow::Error` to start
/// discovery again.
pub fn seal_or_replan(capturing: Capturing<cuda::Device>) -> anyhow::Result<Option<Discovering>> {
    match seal(capturing) {
        Ok(replayable) => {
            drop(replayable);
            Ok(None)
        }
        Err(e) => {
            let failed = e.downcast::<SealError<cuda::Device>>()?;
            Ok(Some(failed.into_capturing().replan()))
        }
    }
}

/// Seals, dropping the `Capturing` before the error goes on.
pub fn seal_or_drop(capturing: Capturing<cuda::Device>) -> anyhow::Result<Replayable<cuda::Device>> {
    capturing
        .seal()
        .map_err(SealError::into_error)
        .context("sealing the plan")
}

/// Replays both runners, reads runner 1's bytes with a consumer, waits,
/// and replans.
pub fn step(
    mut replayable: Replayable<cuda::Device>,
    stream: &cuda::Stream,
    main_grad: &mut CudaSlice<f32>,
) -> anyhow::Result<Discovering> {
    for r in 0..2 {
        replayable.replay(RunnerId(r), stream)?;
    }
    replayable.consume(RunnerId(1), stream, |s, views| -> anyhow::Result<()> {
        let grad = views[0].as_cuda::<f32>(s)?;
        s.cudarc().memcpy_dtod(&grad, main_grad)?;
        Ok(())
    })?;
    let views = replayable.views(RunnerId(0))?;
    anyhow::ensure!(views.len() == 1, "one view per request");
    replayable.synchronize()?;
    Ok(replayable.replan()?)
}

/// The whole lifecycle on device 0.
pub fn run() -> anyhow::Result<()> {
    let (backend, stream) = open()?;
    let input = stream.cudarc().alloc_zeros::<f32>(1024)?;
    let mut main_grad = stream.cudarc().alloc_zeros::<f32>(1024)?;
    let mut capturing = allocate(backend)?;
    for r in 0..2 {
        capture(&mut capturing, RunnerId(r), &stream, &input)?;
    }
    let replayable = seal(capturing)?;
    let discovery = step(replayable, &stream, &mut main_grad)?;
    drop(discovery);
    Ok(())
}
