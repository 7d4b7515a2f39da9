//! A program with its own thiserror enum: one `#[from] replay_arena::Error`
//! variant and `replay_arena::from_errors!`, then `?` on every call of the
//! crate's `cuda` backend; cudarc's calls inside the capture closure use `?`
//! into the crate's error.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, DriverError};
use replay_arena::cuda::{probe, ViewExt};
use replay_arena::cuda;
use replay_arena::{
    Capturing, DType, Discovering, Domain, PlanConfig, Policy, Replayable, Request, RunnerId,
};

/// The program's error.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// Anything replay-arena returns.
    #[error(transparent)]
    Arena(#[from] replay_arena::Error),
    /// The program's own cudarc calls.
    #[error("CUDA call failed: {0:?}")]
    Cuda(#[from] DriverError),
    /// The program's own checks.
    #[error("batch {0} is empty")]
    EmptyBatch(usize),
}

replay_arena::from_errors!(AppError);

const WGRAD: Request = Request::new(Domain::Device, DType::F32, 1024);

/// Probes, opens device 0 and makes a stream.
pub fn open() -> Result<(cuda::Device, cuda::Stream), AppError> {
    let info = probe()?;
    let backend = cuda::Device::new(info.ordinal)?;
    let stream = backend.new_stream()?;
    Ok((backend, stream))
}

/// Adopts the program's context and per-thread stream.
pub fn adopt(ctx: Arc<CudaContext>) -> Result<(cuda::Device, cuda::Stream), AppError> {
    let backend = cuda::Device::from_context(ctx.clone())?;
    let stream = backend.wrap_stream(ctx.per_thread_stream())?;
    Ok((backend, stream))
}

/// Discovery, planning and allocation for two runners.
pub fn allocate(backend: cuda::Device) -> Result<Capturing<cuda::Device>, AppError> {
    let mut discovery = Discovering::new(PlanConfig::new());
    for r in 0..2 {
        discovery.arm(RunnerId(r))?.record(WGRAD)?;
    }
    let planned = discovery.plan(Policy::Generations(2))?;
    Ok(planned.allocate(backend)?)
}

/// Captures one runner; the closure returns the crate's `Result`, and
/// cudarc's `DriverError` goes into it with `?`.
pub fn capture(
    capturing: &mut Capturing<cuda::Device>,
    runner: RunnerId,
    stream: &cuda::Stream,
    input: &CudaSlice<f32>,
) -> Result<(), AppError> {
    let cap = capturing.capture(runner)?;
    let view = cap.take(WGRAD)?;
    cap.stream_capture(stream, |s| -> replay_arena::Result<()> {
        let mut out = view.as_cuda::<f32>(s)?;
        s.cudarc().memcpy_dtod(input, &mut out)?;
        Ok(())
    })?;
    cap.finish()?;
    Ok(())
}

/// Seals with `?` (the `Capturing` is dropped on failure), replays both
/// runners, hands runner 1's bytes to a consumer whose own error is the
/// program's, waits and replans.
pub fn replay(
    capturing: Capturing<cuda::Device>,
    stream: &cuda::Stream,
    main_grad: &mut CudaSlice<f32>,
    batch: usize,
) -> Result<Discovering, AppError> {
    let mut replayable: Replayable<cuda::Device> = capturing.seal()?;
    for r in 0..2 {
        replayable.replay(RunnerId(r), stream)?;
    }
    replayable.consume(RunnerId(1), stream, |s, views| -> Result<(), AppError> {
        if batch == 0 {
            return Err(AppError::EmptyBatch(batch));
        }
        let grad = views[0].as_cuda::<f32>(s)?;
        s.cudarc().memcpy_dtod(&grad, main_grad)?;
        Ok(())
    })?;
    let _views = replayable.views(RunnerId(0))?;
    replayable.synchronize()?;
    Ok(replayable.replan()?)
}

/// Seals, or keeps the `Capturing` to start discovery again.
pub fn seal_or_replan(
    capturing: Capturing<cuda::Device>,
) -> Result<Result<Replayable<cuda::Device>, Discovering>, AppError> {
    Ok(match capturing.seal() {
        Ok(replayable) => Ok(replayable),
        Err(failed) => Err(failed.into_capturing().replan()),
    })
}
