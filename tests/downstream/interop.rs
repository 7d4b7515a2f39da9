//! What a cudarc program does to adopt replay-arena, shared by the
//! downstream crates: adopt its context and stream, capture a runner whose
//! work is cudarc calls on typed views, replay it.

use std::sync::Arc;

use replay_arena::cuda::cudarc::driver::{CudaContext, CudaFunction, LaunchConfig, PushKernelArg};
use replay_arena::cuda::{CaptureMode, ViewExt};
use replay_arena::cuda;
use replay_arena::{
    BackendError, DType, Discovering, Domain, Error, PlanConfig, Policy, Replayable, Request,
    RunnerId,
};

/// The program's context and stream (candle's `per_thread_stream()`, say).
pub fn adopt(ctx: Arc<CudaContext>) -> Result<(cuda::Device, cuda::Stream), Error> {
    let backend = match cuda::Device::from_context(ctx.clone()) {
        Ok(backend) => backend,
        // The program kept cudarc's event tracking on: opt in to turning it off.
        Err(BackendError::EventTracking) => {
            // SAFETY: this program orders its slices across streams itself.
            unsafe { cuda::Device::from_context_disabling_event_tracking(ctx.clone())? }
        }
        Err(e) => return Err(e.into()),
    };
    let backend = backend
        .with_capture_mode(CaptureMode::ThreadLocal)
        .with_graph_upload(true);
    let stream = backend.wrap_stream(ctx.per_thread_stream())?;
    Ok((backend, stream))
}

/// One runner: copies `input` into a view, then a cudarc kernel scales it in
/// place; captured once, replayed.
pub fn capture_and_replay(
    backend: cuda::Device,
    stream: &cuda::Stream,
    input: &replay_arena::cuda::cudarc::driver::CudaSlice<f32>,
    scale: &CudaFunction,
) -> Result<Replayable<cuda::Device>, Error> {
    let req = Request::new(Domain::Device, DType::F32, input.len() as u64);
    let mut discovery = Discovering::new(PlanConfig::new());
    discovery.arm(RunnerId(0))?.record(req)?;
    let mut capturing = discovery.plan(Policy::Generations(1))?.allocate(backend)?;
    {
        let cap = capturing.capture(RunnerId(0))?;
        let view = cap.take(req)?;
        cap.stream_capture(stream, |s| -> Result<(), Error> {
            let mut out = view.as_cuda::<f32>(s)?;
            // cudarc's `DriverError` converts into the crate's error.
            s.cudarc().memcpy_dtod(input, &mut out)?;
            let n = input.len() as u32;
            let mut launch = s.cudarc().launch_builder(scale);
            launch.arg(&mut out).arg(&n);
            // SAFETY: `scale(float*, unsigned)` reads and writes n floats.
            unsafe { launch.launch(LaunchConfig::for_num_elems(n)) }?;
            Ok(())
        })?;
        cap.finish()?;
    }
    let mut replayable = capturing.seal()?;
    replayable.replay(RunnerId(0), stream)?;
    Ok(replayable)
}
