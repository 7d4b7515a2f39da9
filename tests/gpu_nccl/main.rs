//! The GPU tests that use NCCL and every GPU of the machine (feature
//! `nccl`), in a process of their own: symmetric domains on registered
//! windows, and the tensor-parallel example with one rank per GPU.

#![allow(clippy::result_large_err)]

#[path = "../support/mod.rs"]
mod support;

mod backend {
    mod nccl;
}
#[cfg(feature = "f16")]
mod examples {
    mod tp_backward_ranks;
}
