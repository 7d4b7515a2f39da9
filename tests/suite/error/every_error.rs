//! Every `replay_arena::Error` a CPU can trigger, triggered through the public
//! API on the `sim` backend.
//!
//! Each test is one specification: the misuse it names produces exactly this
//! variant, and the message names the runner, the key and the sizes involved.
//! Variants only a GPU can produce (`BackendUnavailable`, `NoCommunicator`,
//! `FingerprintMismatch`, and the `InvalidView` reasons of typed views and
//! reduce-scatters) are tested with the `cuda` and `nccl` backends.

use crate::support::capture_view;
use crate::support::record_and_finish;
use replay_arena::backend::GraphRejection;
use replay_arena::sim::{self, AsSpan};
use replay_arena::{
    BackendError, CaptureError, CaptureFailure, Capturing, ConsumeError, DType, Discovering,
    DiscoveryError, Domain, GroupId, Misuse, PlanConfig, PlanError, Policy, Purpose, ReplayError,
    Replayable, Request, RunnerId, StreamCaptureError,
};

// ---- helpers ---------------------------------------------------------------

/// `elements` elements of `dtype` in device memory.
fn device(dtype: DType, elements: u64) -> Request {
    Request::new(Domain::Device, dtype, elements)
}

/// 64 f32s: 256 bytes, exactly one device alignment unit.
const F32_64: Request = Request::new(Domain::Device, DType::F32, 64);

/// The error of a call that must fail (works for phases without `Debug`).
#[track_caller]
fn expect_err<T, E>(result: std::result::Result<T, E>) -> E {
    match result {
        Ok(_) => panic!("expected an error, the call succeeded"),
        Err(e) => e,
    }
}

/// Asserts that the error's message names every fragment.
#[track_caller]
fn assert_mentions(err: &dyn std::fmt::Display, fragments: &[&str]) {
    let message = err.to_string();
    for fragment in fragments {
        assert!(
            message.contains(fragment),
            "message {message:?} does not mention {fragment:?}"
        );
    }
}

/// Arms `runner` in a new discovery of `config` and records `requests` in
/// order: all but the last are recorded, the last is refused with this
/// error.
#[track_caller]
fn refused_record(config: PlanConfig, runner: u32, requests: &[Request]) -> DiscoveryError {
    let (last, first) = requests.split_last().expect("a request to refuse");
    let mut discovery = Discovering::new(config);
    let mut armed = discovery.arm(RunnerId(runner)).unwrap();
    for &q in first {
        armed.record(q).unwrap();
    }
    armed.record(*last).unwrap_err()
}

/// Planning one runner of one `F32_64` under `policy` is refused as zero
/// generations, in a message naming `fragments`.
#[track_caller]
fn assert_zero_generations(policy: Policy, fragments: &[&str]) {
    let err = discovered(&[(0, &[F32_64])])
        .plan(policy)
        .unwrap_err()
        .into_error();
    assert_eq!(err, PlanError::ZeroGenerations { policy });
    assert_mentions(&err, fragments);
}

/// Discovery in which each runner records its requests, in order.
fn discovered(runners: &[(u32, &[Request])]) -> Discovering {
    let runners = runners
        .iter()
        .map(|&(r, requests)| (RunnerId(r), requests.iter().copied()));
    Discovering::from_runners(PlanConfig::new(), runners).unwrap()
}

/// The runners planned with `G = 1` and allocated on a fresh sim.
fn allocated(runners: &[(u32, &[Request])]) -> (sim::Device, sim::Stream, Capturing<sim::Device>) {
    let sim = sim::Device::new();
    let stream = sim.new_stream();
    let capturing = discovered(runners)
        .plan(Policy::Generations(1))
        .unwrap()
        .allocate(sim.clone())
        .unwrap();
    (sim, stream, capturing)
}

/// Captures `runner` correctly: takes `requests` in order, fills each view,
/// finishes.
fn capture_ok(
    capturing: &mut Capturing<sim::Device>,
    sim: &sim::Device,
    stream: &sim::Stream,
    runner: u32,
    requests: &[Request],
) {
    let cap = capturing.capture(RunnerId(runner)).unwrap();
    let views: Vec<_> = requests.iter().map(|&q| cap.take(q).unwrap()).collect();
    record_and_finish!(cap, stream, |s| {
        views
            .iter()
            .try_for_each(|v| sim.launch(s, sim::Kernel::fill(v, runner as f32), 1))
    });
}

/// One runner with one f32 request, captured and sealed.
fn sealed_one() -> (sim::Device, sim::Stream, Replayable<sim::Device>) {
    let (sim, stream, mut capturing) = allocated(&[(0, &[F32_64])]);
    capture_ok(&mut capturing, &sim, &stream, 0, &[F32_64]);
    (sim, stream, capturing.seal().unwrap())
}

// ---- discovery -------------------------------------------------------------

#[test]
fn arming_a_runner_twice_is_runner_armed_twice() {
    let mut discovery = Discovering::new(PlanConfig::new());
    discovery.arm(RunnerId(4)).unwrap(); // armed and disarmed
    let err = expect_err(discovery.arm(RunnerId(4)));
    assert_eq!(
        err,
        DiscoveryError::RunnerArmedTwice {
            runner: RunnerId(4)
        }
    );
    assert_mentions(&err, &["runner 4", "armed twice"]);
}

#[test]
fn recording_zero_elements_is_zero_elements() {
    let err = refused_record(PlanConfig::new(), 1, &[device(DType::BF16, 0)]);
    assert!(matches!(
        err,
        DiscoveryError::ZeroElements { runner: RunnerId(1), key } if key == device(DType::BF16, 0).key()
    ));
    assert_mentions(&err, &["runner 1", "zero elements", "bf16 in device"]);
}

#[test]
fn a_rejected_request_is_not_recorded() {
    let mut discovery = Discovering::new(PlanConfig::new());
    {
        let mut armed = discovery.arm(RunnerId(0)).unwrap();
        armed.record(device(DType::F32, 0)).unwrap_err();
        armed.record(device(DType::F32, u64::MAX)).unwrap_err();
        armed.record(F32_64).unwrap();
    }
    let planned = discovery.plan(Policy::Generations(1)).unwrap();
    let slices = planned.extents_of(RunnerId(0)).unwrap();
    assert_eq!(slices.len(), 1);
    assert_eq!(slices[0].bytes, 256);
}

#[test]
fn requesting_an_unregistered_group_is_unknown_group() {
    let config = PlanConfig::new().with_group(GroupId(1), "dense").unwrap();
    let request = Request::new(Domain::Symmetric(GroupId(7)), DType::BF16, 1024);
    let err = refused_record(config, 2, &[request]);
    assert_eq!(
        err,
        DiscoveryError::UnknownGroup {
            runner: RunnerId(2),
            group: GroupId(7),
            registered: vec![GroupId(1)],
        }
    );
    assert_mentions(&err, &["runner 2", "group 7", "registered: group 1"]);
}

#[test]
fn a_request_whose_byte_size_overflows_is_size_overflow() {
    let err = refused_record(PlanConfig::new(), 2, &[device(DType::F32, u64::MAX)]);
    assert!(matches!(
        err,
        DiscoveryError::SizeOverflow {
            runner: RunnerId(2),
            what: "request size",
            elements: u64::MAX,
            dtype: DType::F32,
            ..
        }
    ));
    assert_mentions(
        &err,
        &[
            "request size",
            "runner 2",
            "f32 in device",
            "18446744073709551615 elements of f32",
        ],
    );
}

#[test]
fn a_request_whose_aligned_size_overflows_is_size_overflow() {
    // u64::MAX bytes fit in 64 bits; rounding them up to 256 does not.
    let err = refused_record(PlanConfig::new(), 0, &[device(DType::U8, u64::MAX)]);
    assert!(matches!(
        err,
        DiscoveryError::SizeOverflow {
            what: "request size",
            ..
        }
    ));
    assert_mentions(&err, &["request size", "runner 0", "u8 in device"]);
}

#[test]
fn a_capacity_that_overflows_is_size_overflow() {
    let half = device(DType::U8, 1 << 63);
    let err = refused_record(PlanConfig::new(), 5, &[half, half]);
    assert!(matches!(
        err,
        DiscoveryError::SizeOverflow {
            runner: RunnerId(5),
            what: "capacity",
            elements: 9_223_372_036_854_775_808,
            dtype: DType::U8,
            ..
        }
    ));
    assert_mentions(
        &err,
        &[
            "capacity of runner 5 for u8 in device",
            "9223372036854775808 elements of u8",
        ],
    );
}

#[test]
fn registering_a_group_twice_is_group_registered_twice() {
    let err = PlanConfig::new()
        .with_group(GroupId(3), "dense")
        .unwrap()
        .with_group(GroupId(3), "expert")
        .unwrap_err();
    assert_eq!(
        err,
        DiscoveryError::GroupRegisteredTwice { group: GroupId(3) }
    );
    assert_mentions(&err, &["group 3", "twice"]);
}

// ---- planning --------------------------------------------------------------

#[test]
fn zero_generations_is_zero_generations() {
    assert_zero_generations(
        Policy::Generations(0),
        &["generations(0)", "zero generations"],
    );
}

#[test]
fn an_overlap_depth_of_zero_is_zero_generations() {
    assert_zero_generations(Policy::OverlapDepth(0), &["overlap_depth(0)"]);
}

#[test]
fn zero_generations_is_an_error_under_packed_placement_too() {
    let err = discovered(&[(0, &[F32_64])])
        .plan(Policy::Generations(0).packed())
        .unwrap_err();
    assert!(matches!(err.error(), PlanError::ZeroGenerations { .. }));
}

#[test]
fn zero_module_kinds_means_one_generation_not_an_error() {
    let planned = discovered(&[(0, &[F32_64]), (1, &[F32_64])])
        .plan(Policy::ModuleKinds(0))
        .unwrap();
    assert_eq!(planned.generations(), 1);
}

#[test]
fn a_packed_arena_past_64_bits_is_arena_overflow() {
    // Two consecutive runners of 2^63 bytes each must be disjoint when both
    // may be in flight: 2^64 bytes.
    let half = device(DType::U8, 1 << 63);
    let failed = discovered(&[(0, &[half]), (1, &[half])])
        .plan(Policy::Generations(2).packed())
        .unwrap_err();
    assert_eq!(
        failed.error(),
        &PlanError::ArenaOverflow {
            key: half.key(),
            users: 2,
            largest: vec![(RunnerId(0), 1 << 63), (RunnerId(1), 1 << 63)],
            handoffs: vec![],
        }
    );
    assert_mentions(
        failed.error(),
        &[
            "u8 in device",
            "overflows 64 bits",
            "2 runner(s) use u8 in device and need more than 2^64 bytes",
            "runner 0 with 9223372036854775808 bytes, runner 1 with",
        ],
    );
    // The discovery comes back: round-robin plans the same records.
    let planned = failed
        .into_discovering()
        .plan(Policy::Generations(2))
        .unwrap();
    assert_eq!(planned.generations(), 2);
}

#[test]
fn a_failed_plan_hands_the_discovery_back_unchanged() {
    let discovery = discovered(&[(0, &[F32_64]), (3, &[F32_64, F32_64])]);
    let before = discovery.clone();
    let failed = discovery.plan(Policy::Generations(0)).unwrap_err();
    assert_eq!(failed.into_discovering(), before);
}

#[test]
fn a_plan_past_64_bits_in_total_describes_itself_without_panicking() {
    // Round-robin arenas of 2^63 bytes each are valid one by one; their sum
    // is not. The totals saturate instead of overflowing.
    let half = device(DType::U8, 1 << 63);
    let other = device(DType::I8, 1 << 63);
    let planned = discovered(&[(0, &[half, other]), (1, &[half])])
        .plan(Policy::Generations(2))
        .unwrap();
    assert_eq!(planned.total_bytes(), u64::MAX);
    let report = planned.report();
    assert_eq!(report.plan_bytes, u64::MAX);
    assert_eq!(report.runners[0].bytes, u64::MAX);
    let _table = report.to_string();
}

// ---- allocation ------------------------------------------------------------

#[test]
fn a_failed_arena_allocation_is_allocation() {
    // Arenas are allocated in key order: f32 (256 bytes), then bf16 (2048).
    let bf16 = device(DType::BF16, 1024);
    let planned = discovered(&[(0, &[F32_64, bf16])])
        .plan(Policy::Generations(1))
        .unwrap();
    let sim = sim::Device::new();
    sim.fail_allocations_after(Some(1));
    let failed = expect_err(planned.allocate(sim.clone()));
    let err = failed.error().error.clone();
    assert!(matches!(
        &err,
        BackendError::Allocation { key, bytes: 2048, .. } if *key == bf16.key()
    ));
    // The plan comes back: once memory is there, it allocates.
    sim.fail_allocations_after(None);
    failed.into_planned().allocate(sim).unwrap();
    assert_mentions(
        &err,
        &[
            "2048 bytes",
            "bf16 in device",
            "injected allocation failure",
        ],
    );
}

#[test]
fn an_arena_larger_than_the_address_space_is_allocation_not_a_panic() {
    let huge = device(DType::U8, 1 << 63);
    let planned = discovered(&[(0, &[huge])])
        .plan(Policy::Generations(1))
        .unwrap();
    let err = expect_err(planned.allocate(sim::Device::new()))
        .into_error()
        .error;
    assert!(matches!(
        err,
        BackendError::Allocation {
            bytes: 9_223_372_036_854_775_808,
            ..
        }
    ));
    assert_mentions(&err, &["9223372036854775808 bytes", "u8 in device"]);
}

// ---- capture ---------------------------------------------------------------

#[test]
fn capturing_an_undiscovered_runner_is_unknown_runner() {
    let (_sim, _stream, mut capturing) = allocated(&[(0, &[F32_64])]);
    let err = expect_err(capturing.capture(RunnerId(9)));
    assert_eq!(
        err,
        CaptureError::UnknownRunner {
            runner: RunnerId(9)
        }
    );
    assert_mentions(&err, &["runner 9", "not discovered"]);
}

#[test]
fn capturing_a_finished_runner_again_is_already_captured() {
    let (sim, stream, mut capturing) = allocated(&[(0, &[F32_64])]);
    capture_ok(&mut capturing, &sim, &stream, 0, &[F32_64]);
    let err = expect_err(capturing.capture(RunnerId(0)));
    assert_eq!(
        err,
        CaptureError::AlreadyCaptured {
            runner: RunnerId(0),
            failure: None
        }
    );
    assert_mentions(&err, &["runner 0", "already captured", "finished"]);
}

#[test]
fn capturing_a_failed_runner_again_is_already_captured_with_the_failure() {
    let (_sim, _stream, mut capturing) = allocated(&[(0, &[F32_64])]);
    drop(capturing.capture(RunnerId(0)).unwrap());
    let err = expect_err(capturing.capture(RunnerId(0)));
    assert_eq!(
        err,
        CaptureError::AlreadyCaptured {
            runner: RunnerId(0),
            failure: Some(CaptureFailure::Dropped)
        }
    );
    assert_mentions(&err, &["runner 0", "dropped before finish"]);
}

#[test]
fn taking_past_the_discovered_capacity_is_capacity_exceeded() {
    let (_sim, _stream, mut capturing) = allocated(&[(0, &[F32_64])]);
    let cap = capturing.capture(RunnerId(0)).unwrap();
    cap.take(F32_64).unwrap();
    let err = cap.take(F32_64).unwrap_err();
    assert_eq!(
        err,
        CaptureError::CapacityExceeded {
            runner: RunnerId(0),
            key: F32_64.key(),
            index: 1,
            request: F32_64,
            requested: 256,
            taken: 256,
            capacity: 256,
        }
    );
    assert_mentions(
        &err,
        &[
            "runner 0",
            "requested 256 bytes of f32 in device",
            "256 of 256 bytes already taken",
            "request #1",
            "discovery recorded only 1 request",
        ],
    );
}

#[test]
fn taking_a_key_discovery_never_saw_is_request_mismatch_naming_what_discovery_recorded() {
    let (_sim, _stream, mut capturing) = allocated(&[(2, &[F32_64])]);
    let cap = capturing.capture(RunnerId(2)).unwrap();
    let err = cap.take(device(DType::BF16, 128)).unwrap_err();
    assert_eq!(
        err,
        CaptureError::RequestMismatch {
            runner: RunnerId(2),
            index: 0,
            request: device(DType::BF16, 128),
            expected: F32_64,
            requested: 256,
            taken: 0,
            capacity: 0,
        }
    );
    assert_mentions(
        &err,
        &[
            "runner 2 request #0 is 128 x bf16 in device",
            "discovery recorded 64 x f32 in device",
        ],
    );
}

#[test]
fn taking_an_unregistered_group_is_request_mismatch() {
    let (_sim, _stream, mut capturing) = allocated(&[(0, &[F32_64])]);
    let cap = capturing.capture(RunnerId(0)).unwrap();
    let foreign = Request::new(Domain::Symmetric(GroupId(9)), DType::F32, 64);
    let err = cap.take(foreign).unwrap_err();
    assert!(matches!(err, CaptureError::RequestMismatch { expected, .. } if expected == F32_64));
    assert_mentions(
        &err,
        &[
            "symmetric(group 9)",
            "discovery recorded 64 x f32 in device",
        ],
    );
}

#[test]
fn taking_zero_elements_during_capture_is_request_mismatch() {
    let (_sim, _stream, mut capturing) = allocated(&[(0, &[F32_64])]);
    let cap = capturing.capture(RunnerId(0)).unwrap();
    let err = cap.take(device(DType::F32, 0)).unwrap_err();
    assert!(matches!(
        err,
        CaptureError::RequestMismatch { runner: RunnerId(0), expected, .. } if expected == F32_64
    ));
}

#[test]
fn taking_an_overflowing_request_during_capture_is_request_mismatch() {
    let (_sim, _stream, mut capturing) = allocated(&[(0, &[F32_64])]);
    let cap = capturing.capture(RunnerId(0)).unwrap();
    let err = cap.take(device(DType::F32, u64::MAX)).unwrap_err();
    assert!(matches!(
        err,
        CaptureError::RequestMismatch {
            runner: RunnerId(0),
            requested: u64::MAX,
            ..
        }
    ));
    assert_mentions(&err, &["runner 0", "f32 in device"]);
}

#[test]
fn taking_a_different_size_than_discovery_is_request_mismatch() {
    // 512 bytes fit in the runner's 512-byte capacity, but discovery recorded
    // two requests of 256, not one of 512.
    let (_sim, _stream, mut capturing) = allocated(&[(1, &[F32_64, F32_64])]);
    let cap = capturing.capture(RunnerId(1)).unwrap();
    let err = cap.take(device(DType::F32, 128)).unwrap_err();
    assert_eq!(
        err,
        CaptureError::RequestMismatch {
            runner: RunnerId(1),
            index: 0,
            request: device(DType::F32, 128),
            expected: F32_64,
            requested: 512,
            taken: 0,
            capacity: 512,
        }
    );
    assert_mentions(
        &err,
        &[
            "runner 1 request #0",
            "128 x f32 in device",
            "discovery recorded 64 x f32 in device",
            "requested 512 bytes",
            "taken 0 of 512",
        ],
    );
}

#[test]
fn taking_a_different_purpose_than_discovery_is_request_mismatch() {
    let wgrad = F32_64.purpose(Purpose::WgradRsInput);
    let (_sim, _stream, mut capturing) = allocated(&[(0, &[wgrad])]);
    let cap = capturing.capture(RunnerId(0)).unwrap();
    let err = cap.take(F32_64).unwrap_err();
    assert!(matches!(err, CaptureError::RequestMismatch { expected, .. } if expected == wgrad));
    assert_mentions(&err, &["(other)", "(wgrad_rs_input)"]);
}

#[test]
fn a_rejected_take_takes_nothing() {
    let (sim, stream, mut capturing) = allocated(&[(0, &[F32_64])]);
    {
        let cap = capturing.capture(RunnerId(0)).unwrap();
        cap.take(device(DType::F32, 128)).unwrap_err();
        let view = cap.take(F32_64).unwrap();
        record_and_finish!(cap, &stream, |s| sim.launch(
            s,
            sim::Kernel::fill(&view, 1.0),
            1
        ));
    }
    capturing.seal().unwrap();
}

#[test]
fn finishing_with_capacity_left_is_taken_mismatch() {
    let bf16 = device(DType::BF16, 64); // 128 bytes, aligned to 256
    let (sim, stream, mut capturing) = allocated(&[(3, &[bf16, bf16])]);
    let cap = capturing.capture(RunnerId(3)).unwrap();
    let view = cap.take(bf16).unwrap();
    cap.stream_capture(&stream, |s| sim.launch(s, sim::Kernel::fill(&view, 1.0), 1))
        .unwrap();
    let err = cap.finish().unwrap_err();
    assert_eq!(
        err,
        CaptureError::TakenMismatch {
            runner: RunnerId(3),
            key: bf16.key(),
            taken: 256,
            capacity: 512,
        }
    );
    assert_eq!(
        err.to_string(),
        "runner 3 took 256/512 bytes of bf16 in device; a capture must take exactly what discovery recorded"
    );
}

#[test]
fn a_taken_mismatch_fails_the_runner_and_seal_reports_it() {
    let (sim, stream, mut capturing) = allocated(&[(3, &[F32_64, F32_64])]);
    {
        let cap = capturing.capture(RunnerId(3)).unwrap();
        let view = cap.take(F32_64).unwrap();
        cap.stream_capture(&stream, |s| sim.launch(s, sim::Kernel::fill(&view, 1.0), 1))
            .unwrap();
        cap.finish().unwrap_err();
    }
    let err = expect_err(capturing.seal()).into_error();
    assert!(matches!(&err, CaptureError::Unfinished { runners } if runners.len() == 1));
    assert_mentions(
        &err,
        &["runner 3 failed", "took 256/512 bytes of f32 in device"],
    );
}

#[test]
fn a_failing_work_closure_returns_the_closures_own_error() {
    let (_sim, stream, mut capturing) = allocated(&[(2, &[F32_64])]);
    let cap = capturing.capture(RunnerId(2)).unwrap();
    let _view = cap.take(F32_64).unwrap();
    let err = cap
        .stream_capture(&stream, |_| Err::<(), _>("kernel launch refused"))
        .unwrap_err();
    assert!(matches!(
        err,
        StreamCaptureError::Work("kernel launch refused")
    ));
    assert_mentions(&err, &["work closure failed", "kernel launch refused"]);
}

#[test]
fn a_failed_capture_fails_the_runner_and_seal_reports_it() {
    let (_sim, stream, mut capturing) = allocated(&[(2, &[F32_64])]);
    {
        let cap = capturing.capture(RunnerId(2)).unwrap();
        let _view = cap.take(F32_64).unwrap();
        cap.stream_capture(&stream, |_| Err::<(), _>("kernel launch refused"))
            .unwrap_err();
    } // the capture closes here, unfinished
    let err = expect_err(capturing.capture(RunnerId(2)));
    assert_mentions(
        &err,
        &[
            "runner 2",
            "failed: the work closure failed: kernel launch refused",
        ],
    );
    let err = expect_err(capturing.seal()).into_error();
    assert_eq!(
        err,
        CaptureError::Unfinished {
            runners: vec![(
                RunnerId(2),
                Some(CaptureFailure::Work("kernel launch refused".into()))
            )]
        }
    );
    assert_mentions(
        &err,
        &[
            "cannot seal",
            "runner 2 failed: the work closure failed: kernel launch refused",
        ],
    );
}

#[test]
fn capturing_again_after_a_failed_capture_fails_and_so_does_finish() {
    // Once the work closure failed, the runner stays failed: a second
    // stream capture is refused and `finish` reports the first failure.
    let (sim, stream, mut capturing) = allocated(&[(0, &[F32_64])]);
    {
        let cap = capturing.capture(RunnerId(0)).unwrap();
        let view = cap.take(F32_64).unwrap();
        cap.stream_capture(&stream, |_| Err::<(), _>("out of launch slots"))
            .unwrap_err();
        let again = cap
            .stream_capture(&stream, |s| sim.launch(s, sim::Kernel::fill(&view, 1.0), 1))
            .unwrap_err();
        assert!(matches!(
            again,
            StreamCaptureError::Capture(CaptureError::Failed {
                runner: RunnerId(0),
                ..
            })
        ));
        let err = cap.finish().unwrap_err();
        assert_eq!(
            err,
            CaptureError::Failed {
                runner: RunnerId(0),
                failure: CaptureFailure::Work("out of launch slots".into())
            }
        );
    }
    let err = expect_err(capturing.seal());
    assert_mentions(&err, &["runner 0 failed", "out of launch slots"]);
}

#[test]
fn a_failed_capture_leaves_the_stream_free_for_the_next_capture() {
    let (sim, stream, mut capturing) = allocated(&[(0, &[F32_64]), (1, &[F32_64])]);
    {
        let cap = capturing.capture(RunnerId(0)).unwrap();
        cap.take(F32_64).unwrap();
        cap.stream_capture(&stream, |_| Err::<(), _>("boom"))
            .unwrap_err();
    }
    capture_ok(&mut capturing, &sim, &stream, 1, &[F32_64]);
}

#[test]
fn a_graph_whose_allocation_escapes_it_is_graph_rejected() {
    let (sim, stream, mut capturing) = allocated(&[(1, &[F32_64])]);
    let cap = capturing.capture(RunnerId(1)).unwrap();
    let view = cap.take(F32_64).unwrap();
    cap.stream_capture(&stream, |s| {
        let out = sim.alloc_async(s, 1024)?; // an op's output, never dropped
        sim.launch(s, sim::Kernel::copy(&view, &out), 1)
    })
    .unwrap();
    let err = cap.finish().unwrap_err();
    assert!(
        matches!(
            &err,
            CaptureError::GraphRejected {
                runner: RunnerId(1),
                reason: GraphRejection::MemoryNodes {
                    unfreed: 1,
                    unfreed_bytes: 4096,
                    foreign_frees: 0,
                    ..
                },
            }
        ),
        "{err}"
    );
    assert_mentions(
        &err,
        &[
            "graph captured for runner 1 was rejected",
            "1 allocation(s) of 4096 bytes",
            "never freed",
        ],
    );
}

#[test]
fn a_graph_that_frees_memory_it_did_not_allocate_is_graph_rejected() {
    let (sim, stream, mut capturing) = allocated(&[(1, &[F32_64])]);
    let program = sim.alloc_f32(16).unwrap();
    let cap = capturing.capture(RunnerId(1)).unwrap();
    let view = cap.take(F32_64).unwrap();
    cap.stream_capture(&stream, |s| {
        sim.launch(s, sim::Kernel::fill(&view, 1.0), 1)?;
        sim.free_async(s, &replay_arena::sim::AsSpan::span(&program))
    })
    .unwrap();
    let err = cap.finish().unwrap_err();
    assert!(
        matches!(
            &err,
            CaptureError::GraphRejected {
                runner: RunnerId(1),
                reason: GraphRejection::MemoryNodes {
                    unfreed: 0,
                    foreign_frees: 1,
                    ..
                },
            }
        ),
        "{err}"
    );
    assert_mentions(&err, &["1 free(s)", "did not allocate"]);
}

#[test]
fn a_rejected_graph_fails_the_runner_and_seal_reports_it() {
    let (sim, stream, mut capturing) = allocated(&[(1, &[F32_64])]);
    {
        let cap = capturing.capture(RunnerId(1)).unwrap();
        cap.take(F32_64).unwrap();
        cap.stream_capture(&stream, |s| sim.alloc_async(s, 16).map(drop))
            .unwrap();
        cap.finish().unwrap_err();
    }
    let err = expect_err(capturing.seal());
    assert_mentions(&err, &["runner 1 failed", "never freed"]);
}

#[test]
fn sealing_with_a_runner_never_captured_is_unfinished() {
    let (sim, stream, mut capturing) = allocated(&[(0, &[F32_64]), (1, &[F32_64])]);
    capture_ok(&mut capturing, &sim, &stream, 0, &[F32_64]);
    let err = expect_err(capturing.seal()).into_error();
    assert_eq!(
        err,
        CaptureError::Unfinished {
            runners: vec![(RunnerId(1), None)]
        }
    );
    assert_eq!(err.to_string(), "cannot seal: runner 1 was never captured");
}

#[test]
fn sealing_after_a_dropped_capture_is_unfinished() {
    let (_sim, _stream, mut capturing) = allocated(&[(0, &[F32_64])]);
    {
        let cap = capturing.capture(RunnerId(0)).unwrap();
        cap.take(F32_64).unwrap();
    } // dropped without finish
    let err = expect_err(capturing.seal()).into_error();
    assert_eq!(
        err,
        CaptureError::Unfinished {
            runners: vec![(RunnerId(0), Some(CaptureFailure::Dropped))]
        }
    );
    assert_mentions(
        &err,
        &["runner 0 failed: the capture was dropped before finish"],
    );
}

#[test]
fn sealing_lists_every_unfinished_runner_in_capture_order() {
    let (_sim, _stream, mut capturing) = allocated(&[(5, &[F32_64]), (2, &[F32_64])]);
    drop(capturing.capture(RunnerId(2)).unwrap());
    let err = expect_err(capturing.seal());
    assert_mentions(
        &err,
        &["runner 5 was never captured; runner 2 failed: the capture was dropped before finish"],
    );
}

// ---- replay ----------------------------------------------------------------

#[test]
fn an_empty_runner_needs_no_capture_and_has_no_graph() {
    let (sim, stream, mut capturing) = allocated(&[(0, &[F32_64]), (1, &[])]);
    capture_ok(&mut capturing, &sim, &stream, 0, &[F32_64]);
    let mut replayable = capturing.seal().unwrap();
    let err = replayable.replay(RunnerId(1), &stream).unwrap_err();
    assert_eq!(
        err,
        ReplayError::NoGraph {
            runner: RunnerId(1)
        }
    );
    assert_eq!(err.to_string(), "runner 1 has no captured graph to replay");
}

#[test]
fn replaying_an_undiscovered_runner_is_unknown_runner() {
    let (_sim, stream, mut replayable) = sealed_one();
    let err = replayable.replay(RunnerId(7), &stream).unwrap_err();
    assert_eq!(
        err,
        ReplayError::UnknownRunner {
            runner: RunnerId(7)
        }
    );
    assert_mentions(&err, &["runner 7"]);
}

#[test]
fn views_of_an_undiscovered_runner_is_unknown_runner() {
    let (_sim, _stream, replayable) = sealed_one();
    let err = replayable.views(RunnerId(7)).unwrap_err();
    assert_eq!(err.runner, RunnerId(7));
}

#[test]
fn consuming_an_undiscovered_runner_is_unknown_runner() {
    let (_sim, stream, mut replayable) = sealed_one();
    let err = replayable
        .consume(RunnerId(7), &stream, |_, _| Ok::<(), String>(()))
        .unwrap_err();
    assert!(matches!(
        err,
        replay_arena::ConsumeError::UnknownRunner {
            runner: RunnerId(7)
        }
    ));
}

#[test]
fn a_failing_consumer_returns_its_own_error() {
    let (_sim, stream, mut replayable) = sealed_one();
    replayable.replay(RunnerId(0), &stream).unwrap();
    let err = replayable
        .consume(RunnerId(0), &stream, |_, _| {
            Err::<(), _>("reduce-scatter enqueue failed")
        })
        .unwrap_err();
    assert!(matches!(
        err,
        ConsumeError::Work("reduce-scatter enqueue failed")
    ));
    assert_mentions(&err, &["consumer failed", "reduce-scatter enqueue failed"]);
}

#[test]
fn a_failing_consumer_is_still_fenced() {
    // Whatever the consumer managed to enqueue before failing stays fenced:
    // the runner now completes on the consumer's stream, so the next replay
    // on the first stream waits for it.
    let (sim, stream, mut replayable) = sealed_one();
    let side = sim.new_stream();
    replayable.replay(RunnerId(0), &stream).unwrap();
    replayable
        .consume(RunnerId(0), &side, |_, _| Err::<(), _>("nope"))
        .unwrap_err();
    let before = replayable.fence_stats();
    replayable.replay(RunnerId(0), &stream).unwrap();
    assert_eq!(replayable.fence_stats().waits, before.waits + 1);
}

#[test]
fn a_replay_whose_graph_touches_freed_memory_is_backend() {
    // The graph copies from a buffer outside the plan, which is freed before
    // the replay: the sim refuses the launch.
    let (sim, stream, mut capturing) = allocated(&[(0, &[F32_64])]);
    let outside = sim.alloc_f32(64).unwrap();
    let addr = outside.span().addr();
    {
        capture_view(&mut capturing, RunnerId(0), F32_64, &stream, |s, view| {
            sim.launch(s, sim::Kernel::copy(&outside, &view), 1)
        });
    }
    let mut replayable = capturing.seal().unwrap();
    drop(outside);
    let err = replayable.replay(RunnerId(0), &stream).unwrap_err();
    assert!(matches!(
        err,
        ReplayError::Backend(replay_arena::BackendFailure {
            op: replay_arena::Operation::Replay(RunnerId(0)),
            runner: Some(RunnerId(0)),
            error: BackendError::Refused {
                call: "sim launch",
                ..
            }
        })
    ));
    assert_mentions(
        &err,
        &[
            "runner 0: sim launch:",
            &format!("64 f32 at {addr:#x}"),
            "outside every live allocation",
        ],
    );
}

// ---- views used where they do not work ---------------------------------------

#[test]
fn a_view_used_out_of_its_closure_on_sim_is_invalid_view_naming_it() {
    let (sim, stream, mut capturing) = allocated(&[(0, &[F32_64])]);
    let cap = capturing.capture(RunnerId(0)).unwrap();
    let view = cap.take(F32_64).unwrap();
    let outside = sim
        .launch(&stream, sim::Kernel::fill(&view, 1.0), 1)
        .unwrap_err();
    assert_eq!(
        outside,
        BackendError::InvalidView {
            reason: Misuse::OutsideClosure {
                request: F32_64,
                runner: RunnerId(0),
            }
        }
    );
    assert_mentions(
        &outside,
        &[
            "invalid use of a view: ",
            "of runner 0",
            "outside the work closure",
        ],
    );
    let other = sim.new_stream();
    record_and_finish!(cap, &stream, |s| {
        let elsewhere = sim
            .launch(&other, sim::Kernel::fill(&view, 1.0), 1)
            .unwrap_err();
        assert_eq!(
            elsewhere,
            BackendError::InvalidView {
                reason: Misuse::OtherStream {
                    request: F32_64,
                    runner: RunnerId(0),
                    capture: true,
                }
            }
        );
        sim.launch(s, sim::Kernel::fill(&view, 1.0), 1)
    });
    let mut replayable = capturing.seal().unwrap();
    replayable.replay(RunnerId(0), &stream).unwrap();
    let addresses_only = replayable.views(RunnerId(0)).unwrap()[0];
    assert_eq!(
        sim.launch(&stream, sim::Kernel::fill(&addresses_only, 1.0), 1)
            .unwrap_err(),
        BackendError::InvalidView {
            reason: Misuse::NoScope {
                request: F32_64,
                runner: RunnerId(0),
            }
        }
    );
    let written = replayable.consume(RunnerId(0), &stream, |s, views| {
        sim.launch(s, sim::Kernel::fill(&views[0], 1.0), 1)
    });
    assert!(
        matches!(
            written,
            Err(ConsumeError::Work(BackendError::InvalidView {
                reason: Misuse::ReadOnly {
                    runner: RunnerId(0),
                    handoff: false,
                    ..
                }
            }))
        ),
        "{written:?}"
    );
}

#[test]
fn each_misuse_names_the_view_and_where_it_works() {
    let (q, r) = (F32_64, RunnerId(2));
    let (request, runner) = (q, r);
    let mut cases = vec![
        (
            Misuse::NoScope { request, runner },
            format!(
                "{q} of {r} was not handed out by a capture or consumer (views from \
                 `Replayable::views` are for reading addresses; put device work on them inside \
                 `Replayable::consume`)"
            ),
        ),
        (
            Misuse::OutsideClosure { request, runner },
            format!(
                "{q} of {r} is used outside the work closure of the capture or consumer that \
                 handed it out (a view works only inside its own `stream_capture` or `consume` \
                 closure)"
            ),
        ),
        (
            Misuse::ReadOnly {
                request,
                runner,
                handoff: true,
            },
            format!(
                "{q} of {r} is a handoff it received, which it reads (the writer's next replay \
                 and other readers rely on that); write handoffs in their writer's graph"
            ),
        ),
        (
            Misuse::ReadOnly {
                request,
                runner,
                handoff: false,
            },
            format!(
                "{q} of {r} is a consumer's view, which it reads (consumers on other streams may \
                 read it at the same time); write a runner's views in its graph, or in \
                 `consume_mut`"
            ),
        ),
        (
            Misuse::Retired { request, runner },
            format!(
                "{q} of {r} is a handoff its capture marked ready; after that point of the graph, \
                 readers and the next writer may use it, so the writer's graph leaves it alone"
            ),
        ),
    ];
    for (capture, runs) in [(true, "capture"), (false, "consumer")] {
        cases.push((
            Misuse::OtherStream {
                request,
                runner,
                capture,
            },
            format!(
                "{q} of {r} is used on another stream than its {runs} runs on (a view works on \
                 the stream of its own `stream_capture` or `consume` closure)"
            ),
        ));
    }
    #[cfg(feature = "cuda")]
    for (returned, when) in [
        (false, "on another stream"),
        (true, "after its closure returned"),
    ] {
        cases.push((
            Misuse::TypedViewElsewhere {
                request,
                runner,
                address: 0x7f00,
                returned,
            },
            format!(
                "a typed view of 64 elements at 0x7f00 was handed to cudarc {when}; it works \
                 only on the stream of its own closure, while that closure runs"
            ),
        ));
    }
    #[cfg(feature = "nccl")]
    cases.extend([
        (
            Misuse::DTypesDiffer {
                send: DType::F32,
                recv: DType::BF16,
            },
            format!(
                "reduce-scatter from {} into {}: dtypes differ",
                DType::F32,
                DType::BF16
            ),
        ),
        (
            Misuse::NotSymmetric {
                group: GroupId(1),
                domain: Domain::Device,
            },
            format!(
                "reduce-scatter on {g} needs a view of symmetric({g}), got one of {}",
                Domain::Device,
                g = GroupId(1)
            ),
        ),
        (
            Misuse::OutsideWindows {
                address: 0x7f00,
                group: GroupId(1),
            },
            format!(
                "the send view at 0x7f00 lies in no window registered on {}'s communicator",
                GroupId(1)
            ),
        ),
        (
            Misuse::SendLength {
                ranks: 4,
                recv: 100,
                send: 300,
            },
            "reduce-scatter over 4 ranks into 100 elements needs 400 send elements, the view has \
             300"
            .to_string(),
        ),
    ]);
    for (misuse, message) in cases {
        assert_eq!(misuse.to_string(), message);
        let capture = CaptureError::ViewOutOfScope {
            runner,
            reason: misuse.clone(),
        };
        assert_eq!(
            capture.to_string(),
            format!("capture of {r} used a view out of its scope: {message}")
        );
        let replay = ConsumeError::<std::convert::Infallible>::ViewOutOfScope {
            runner,
            reason: misuse,
        };
        assert_eq!(
            replay.to_string(),
            format!("the consumer of {r} used a view out of its scope: {message}")
        );
    }
}

// ---- each cause prints once ---------------------------------------------------

/// The error chain as `anyhow`'s `{:#}` prints it: each message, then its
/// `source()`'s, and so on.
fn chain(err: &(dyn std::error::Error + 'static)) -> Vec<String> {
    let mut out = vec![err.to_string()];
    let mut next = err.source();
    while let Some(e) = next {
        out.push(e.to_string());
        next = e.source();
    }
    out
}

/// Asserts that no message in the chain repeats a cause printed after it.
#[track_caller]
fn assert_each_cause_once(err: &(dyn std::error::Error + 'static)) {
    let messages = chain(err);
    for (i, m) in messages.iter().enumerate() {
        for later in &messages[i + 1..] {
            assert!(
                !m.contains(later.as_str()),
                "{m:?} prints its cause {later:?}, which the chain prints again"
            );
        }
    }
}

#[test]
fn every_error_with_a_cause_prints_it_once_in_an_error_chain() {
    let cause = || BackendError::Refused {
        call: "sim launch",
        reason: "the cause".into(),
    };
    let replay = ReplayError::Backend(replay_arena::BackendFailure::new(
        replay_arena::Operation::Replay(RunnerId(3)),
        Some(RunnerId(3)),
        cause(),
    ));
    let step = replay_arena::StepError::Backend(replay_arena::BackendFailure::new(
        replay_arena::Operation::StepBuild,
        Some(RunnerId(3)),
        cause(),
    ));
    let schedule = replay_arena::StepError::from(replay_arena::ScheduleError::from(replay.clone()));
    let capture = CaptureError::Backend(replay_arena::BackendFailure::new(
        replay_arena::Operation::Capture(RunnerId(3)),
        Some(RunnerId(3)),
        cause(),
    ));
    let errors: Vec<Box<dyn std::error::Error + 'static>> = vec![
        Box::new(replay.clone()),
        Box::new(replay_arena::Error::from(replay.clone())),
        Box::new(ConsumeError::<String>::Backend(
            replay_arena::BackendFailure::new(
                replay_arena::Operation::Consume(RunnerId(3)),
                Some(RunnerId(3)),
                cause(),
            ),
        )),
        Box::new(step.clone()),
        Box::new(replay_arena::Error::from(step)),
        Box::new(schedule.clone()),
        Box::new(replay_arena::Error::from(schedule)),
        Box::new(capture.clone()),
        Box::new(StreamCaptureError::<String>::Capture(capture.clone())),
        Box::new(replay_arena::Error::from(capture)),
    ];
    for err in &errors {
        assert!(
            chain(err.as_ref()).iter().any(|m| m.contains("the cause")),
            "{err}"
        );
        assert_each_cause_once(err.as_ref());
    }
}

#[test]
fn failed_transitions_print_their_reason_once_in_an_error_chain() {
    let discovery = || Discovering::from_runners(PlanConfig::new(), [(RunnerId(0), [F32_64])]);
    let plan_failed = discovery()
        .unwrap()
        .plan(Policy::Generations(0))
        .unwrap_err();
    let sim = sim::Device::new();
    sim.fail_allocations_after(Some(0));
    let allocate_failed = discovery()
        .unwrap()
        .plan(Policy::Generations(1))
        .unwrap()
        .allocate(sim.clone())
        .unwrap_err();
    sim.fail_allocations_after(None);
    let seal_failed = discovery()
        .unwrap()
        .plan(Policy::Generations(1))
        .unwrap()
        .allocate(sim.clone())
        .unwrap()
        .seal()
        .unwrap_err();
    assert_mentions(&plan_failed, &["zero"]);
    assert_mentions(&seal_failed, &["runner 0 was never captured"]);
    assert_each_cause_once(&plan_failed);
    assert_each_cause_once(&replay_arena::Error::from(plan_failed));
    assert_each_cause_once(&allocate_failed);
    assert_each_cause_once(&replay_arena::Error::from(allocate_failed));
    assert_each_cause_once(&seal_failed);
    assert_each_cause_once(&replay_arena::Error::from(seal_failed));
}

#[test]
fn an_arena_of_handoffs_past_64_bits_names_the_handoffs() {
    // Two handoffs of 2^63 bytes each, both live while runner 2 reads them:
    // 2^64 bytes. Their writers have no bytes of their own in the key.
    let half = device(DType::U8, 1 << 63);
    let mut d = Discovering::new(PlanConfig::new());
    let h0 = d.arm(RunnerId(0)).unwrap().hand_off(half).unwrap();
    let h1 = d.arm(RunnerId(1)).unwrap().hand_off(half).unwrap();
    {
        let mut reader = d.arm(RunnerId(2)).unwrap();
        reader.receive(h0).unwrap();
        reader.receive(h1).unwrap();
    }
    for policy in [
        Policy::Generations(1).into(),
        Policy::Generations(2).packed(),
    ] {
        let failed = d.clone().plan(policy).unwrap_err();
        match failed.error() {
            PlanError::ArenaOverflow {
                key,
                users,
                largest,
                handoffs,
            } => {
                assert_eq!((*key, *users, largest.len()), (half.key(), 0, 0));
                let named: Vec<_> = handoffs
                    .iter()
                    .map(|h| (h.handoff, h.writer, h.readers.clone(), h.bytes))
                    .collect();
                assert_eq!(
                    named,
                    vec![
                        (h0, RunnerId(0), vec![RunnerId(2)], 1 << 63),
                        (h1, RunnerId(1), vec![RunnerId(2)], 1 << 63),
                    ]
                );
            }
            other => panic!("expected ArenaOverflow, got {other:?}"),
        }
        assert_mentions(
            failed.error(),
            &[
                "2 handoff(s) use u8 in device",
                "handoff 0 written by runner 0, read by runner 2, with 9223372036854775808 bytes",
                "handoff 1 written by runner 1",
            ],
        );
        assert!(
            !failed.error().to_string().contains("runner(s)"),
            "{}",
            failed.error()
        );
    }
}
