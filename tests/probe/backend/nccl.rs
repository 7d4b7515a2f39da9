//! Without NCCL the `nccl` feature's entry points are typed errors, never
//! panics (cudarc panics when a library or symbol is missing and nothing
//! checked first). With NCCL and a GPU (`REQUIRE_GPU=1`) they work.
#![cfg(feature = "nccl")]

use replay_arena::nccl::{available, UniqueId};
use replay_arena::BackendError;

#[test]
fn a_unique_id_is_a_typed_error_without_nccl_or_works_with_it() {
    match UniqueId::new() {
        Ok(id) => assert!(available(), "an id came from a loaded library: {id:?}"),
        Err(BackendError::Unavailable { reason }) => {
            assert!(
                std::env::var_os("REQUIRE_GPU").is_none(),
                "NCCL expected: {reason}"
            );
            assert!(
                reason.contains("NCCL") || reason.contains("libnccl"),
                "{reason}"
            );
        }
        Err(other) => panic!("expected BackendUnavailable, got {other}"),
    }
}
