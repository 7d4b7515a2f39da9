//! The `cuda` backend's probe on any machine: with no driver it returns a
//! typed error and never panics; on a GPU machine (`REQUIRE_GPU=1`) it finds
//! the device and the backend opens.
#![cfg(feature = "cuda")]

use replay_arena::cuda::{self, probe, probe_device};
use replay_arena::BackendError;

fn gpu_required() -> bool {
    std::env::var("REQUIRE_GPU").is_ok_and(|v| v == "1")
}

#[test]
fn probe_and_new_return_a_typed_error_without_a_driver_or_succeed_with_one() {
    let probed = probe();
    let opened = cuda::Device::new(0);
    match probed {
        Err(BackendError::Unavailable { reason }) => {
            assert!(
                !gpu_required(),
                "REQUIRE_GPU=1 but the probe says: {reason}"
            );
            assert!(!reason.is_empty());
            match opened {
                Err(BackendError::Unavailable { reason: again }) => assert_eq!(again, reason),
                other => panic!("probe failed ({reason}) but cuda::Device::new gave {other:?}"),
            }
        }
        Err(other) => panic!("the probe failed with a non-availability error: {other}"),
        Ok(info) => {
            assert!(info.device_count >= 1 && info.ordinal == 0, "{info:?}");
            assert!(
                info.total_memory > 0 && info.compute_capability.0 > 0,
                "{info:?}"
            );
            let backend = opened.expect("the probe found a device, so the backend opens");
            assert_eq!(backend.info(), &info);
            let (free, total) = backend.mem_info().expect("cuMemGetInfo");
            assert!(free > 0 && free <= total, "free {free} of {total}");
            println!("{info}");
        }
    }
}

#[test]
fn a_device_that_does_not_exist_is_a_typed_error_not_a_panic() {
    let ordinal = 4096;
    match probe_device(ordinal) {
        Err(BackendError::Unavailable { reason }) => {
            if gpu_required() {
                assert!(
                    reason.contains("does not exist"),
                    "with a driver the reason names the missing device: {reason}"
                );
            }
        }
        other => panic!("device {ordinal} cannot exist, yet the probe gave {other:?}"),
    }
    assert!(matches!(
        cuda::Device::new(ordinal),
        Err(BackendError::Unavailable { .. })
    ));
}
