//! What a program writes around the crate: errors that go into `anyhow`-like
//! boxes and into the program's own enum with `?`, cudarc's driver errors
//! into the crate's, and a placement chosen in one expression.

use std::error::Error as StdError;

use replay_arena::sim;
use replay_arena::{
    CaptureError, Capturing, DType, Discovering, Domain, Error, PlacedPolicy, Placement,
    PlanConfig, PlanError, Policy, Replayable, Request, RunnerId, SealError,
};

/// What `anyhow::Error` needs of an error, without the dependency.
type Boxed = Box<dyn StdError + Send + Sync + 'static>;

const REQ: Request = Request::new(Domain::Device, DType::F32, 64);

fn allocated(runners: u32) -> (sim::Device, Capturing<sim::Device>) {
    let planned = Discovering::from_runners(
        PlanConfig::new(),
        (0..runners).map(|r| (RunnerId(r), [REQ])),
    )
    .unwrap()
    .plan(Policy::Generations(1))
    .unwrap();
    let sim = sim::Device::new();
    let capturing = planned.allocate(sim.clone()).unwrap();
    (sim, capturing)
}

fn capture(sim: &sim::Device, capturing: &mut Capturing<sim::Device>, r: u32) -> Result<(), Boxed> {
    let stream = sim.new_stream();
    let cap = capturing.capture(RunnerId(r))?;
    let view = cap.take(REQ)?;
    cap.stream_capture(&stream, |s| sim.launch(s, sim::Kernel::fill(&view, 1.0), 5))?;
    cap.finish()?;
    Ok(())
}

fn seal_boxed(capturing: Capturing<sim::Device>) -> Result<Replayable<sim::Device>, Boxed> {
    Ok(capturing.seal()?)
}

#[test]
fn every_phase_error_goes_into_a_send_sync_box_with_question_mark() {
    let plan = || -> Result<(), Boxed> {
        Discovering::new(PlanConfig::new()).plan(Policy::Generations(0))?;
        Ok(())
    };
    let e = plan().unwrap_err();
    // The boxed error is the `PlanFailed`, with the discovery inside.
    assert!(matches!(
        e.downcast_ref::<replay_arena::PlanFailed>()
            .map(|f| f.error()),
        Some(PlanError::ZeroGenerations { .. })
    ));

    let (sim, mut capturing) = allocated(1);
    capture(&sim, &mut capturing, 0).unwrap();
    let mut replayable = seal_boxed(capturing).unwrap();
    let stream = sim.new_stream();
    let consume = |replayable: &mut Replayable<sim::Device>| -> Result<(), Boxed> {
        replayable.replay(RunnerId(0), &stream)?;
        replayable.consume(RunnerId(0), &stream, |_, _| {
            Err::<(), Boxed>("short read".into())
        })?;
        Ok(())
    };
    let e = consume(&mut replayable).unwrap_err();
    assert!(e.to_string().contains("short read"), "{e}");
}

#[test]
fn a_failed_seal_in_a_box_hands_the_capturing_back_by_downcast() {
    let (sim, capturing) = allocated(2);
    let before = sim.live_allocations();
    let e = seal_boxed(capturing).unwrap_err();
    assert!(e.to_string().contains("runner 0"), "{e}");
    let failed = e.downcast::<SealError<sim::Device>>().unwrap();
    assert!(matches!(failed.error(), CaptureError::Unfinished { .. }));
    let mut capturing = failed.into_capturing();
    assert_eq!(sim.live_allocations(), before, "the arenas are still there");
    capture(&sim, &mut capturing, 0).unwrap();
    capture(&sim, &mut capturing, 1).unwrap();
    assert!(capturing.seal().is_ok(), "sealed after capturing the rest");
}

#[test]
fn a_failed_seal_turned_into_a_plain_error_frees_the_plan() {
    let (sim, capturing) = allocated(1);
    assert!(sim.live_allocations() > 0);
    let e: CaptureError = capturing.seal().map_err(SealError::into_error).unwrap_err();
    assert!(matches!(e, CaptureError::Unfinished { .. }));
    assert_eq!(sim.live_allocations(), 0);

    let (sim, capturing) = allocated(1);
    let seal = || -> replay_arena::Result<Replayable<sim::Device>> { Ok(capturing.seal()?) };
    assert!(matches!(
        seal(),
        Err(Error::Capture(CaptureError::Unfinished { .. }))
    ));
    assert_eq!(sim.live_allocations(), 0);
}

#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Arena(#[from] Error),
    #[error("the program's own: {0}")]
    Own(&'static str),
}

replay_arena::from_errors!(AppError);

#[test]
fn a_program_enum_takes_every_crate_error_with_one_from_and_the_macro() {
    let plan = || -> Result<(), AppError> {
        Discovering::new(PlanConfig::new()).plan(Policy::Generations(0))?;
        Ok(())
    };
    assert!(matches!(
        plan(),
        Err(AppError::Arena(Error::Plan(
            PlanError::ZeroGenerations { .. }
        )))
    ));

    let (sim, mut capturing) = allocated(2);
    let stream = sim.new_stream();
    let mut work_fails = || -> Result<(), AppError> {
        let cap = capturing.capture(RunnerId(0))?;
        let view = cap.take(REQ)?;
        cap.stream_capture(&stream, |s| -> Result<(), AppError> {
            sim.launch(s, sim::Kernel::fill(&view, 1.0), 5)?; // BackendError
            Err(AppError::Own("bad input"))
        })?;
        Ok(())
    };
    // The closure's own error comes back as itself, not wrapped.
    assert!(matches!(work_fails(), Err(AppError::Own("bad input"))));

    let seal = move || -> Result<Replayable<sim::Device>, AppError> { Ok(capturing.seal()?) };
    assert!(matches!(
        seal(),
        Err(AppError::Arena(Error::Capture(
            CaptureError::Unfinished { .. }
        )))
    ));
}

#[cfg(feature = "cuda")]
mod cuda {
    use super::*;
    use replay_arena::backend::CUDARC_DRIVER_CALL;
    use replay_arena::cuda;
    use replay_arena::cuda::cudarc::driver::{sys::CUresult, DriverError};
    use replay_arena::BackendError;

    #[test]
    fn a_cudarc_driver_error_goes_into_the_crate_error_with_its_code() {
        let call = || -> replay_arena::Result<()> {
            Err(DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY))?;
            Ok(())
        };
        let e = call().unwrap_err();
        assert!(matches!(
            e,
            Error::Backend(BackendError::Driver {
                call: CUDARC_DRIVER_CALL,
                code: CUresult::CUDA_ERROR_OUT_OF_MEMORY
            })
        ));
        // Formatted by this crate: no call into a driver that may be absent.
        assert_eq!(
            e.to_string(),
            "a cudarc driver call returned CUDA_ERROR_OUT_OF_MEMORY"
        );
        let backend: BackendError = DriverError(CUresult::CUDA_ERROR_INVALID_VALUE).into();
        assert!(matches!(
            backend,
            BackendError::Driver {
                call: CUDARC_DRIVER_CALL,
                ..
            }
        ));
    }

    /// Compiles only while `SealError<cuda::Device>` is `Send + Sync`.
    #[allow(dead_code)]
    fn seal_on_cuda_goes_into_a_send_sync_box(
        capturing: Capturing<cuda::Device>,
    ) -> Result<Replayable<cuda::Device>, Boxed> {
        Ok(capturing.seal()?)
    }
}

/// The `nccl` backend's `Capturing` stays on its thread (NCCL communicators),
/// so a failed seal goes into a `Send + Sync` box as its plain reason.
#[cfg(feature = "nccl")]
#[allow(dead_code)]
fn seal_on_nccl_goes_into_a_send_sync_box_as_its_reason(
    capturing: Capturing<replay_arena::nccl::Device>,
) -> Result<Replayable<replay_arena::nccl::Device>, Boxed> {
    Ok(capturing.seal().map_err(SealError::into_error)?)
}

#[test]
fn a_placement_is_chosen_in_one_expression() {
    let policy = Policy::OverlapDepth(2);
    for packed in [false, true] {
        let strategy = if packed {
            policy.packed()
        } else {
            policy.round_robin()
        };
        let want = if packed {
            Placement::Packed
        } else {
            Placement::RoundRobin
        };
        assert_eq!(strategy, policy.placed(want));
        assert!(Discovering::new(PlanConfig::new()).plan(strategy).is_ok());
    }
    assert_eq!(policy.round_robin(), PlacedPolicy::from(policy));
}
