//! The GPU tests (one H200 is enough), in one binary: a module per room of
//! `src/`. Each test is `#[ignore = "needs a CUDA GPU"]`; run them with
//! `cargo test --release --features cuda,nccl,f16,cublas --test gpu --
//! --include-ignored --test-threads=1` (they read device-wide figures such as
//! the driver's graph memory, so one at a time). Tests that must stay in a
//! process of their own are `gpu_failures` (it takes nearly all device
//! memory), `gpu_interop` (it changes the context's event tracking) and
//! `gpu_nccl` (every GPU of the machine, feature `nccl`).

#![allow(clippy::result_large_err)]

#[path = "../support/mod.rs"]
mod support;

mod backend {
    #[cfg(feature = "cublas")]
    mod cublas;
    #[cfg(feature = "cublas")]
    mod cublas_shared;
    mod lazy;
    mod priority;
}
mod capture {
    mod errors;
    mod framework_ops;
    mod framework_views;
}
#[cfg(feature = "f16")]
mod examples {
    mod tp_backward;
}
mod fence {
    mod pipeline;
    mod race;
    mod single_generation;
    mod soundness;
}
mod step {
    mod buckets;
    mod graph;
    mod graph_memory;
    mod handoffs;
    mod runtime_buckets;
}
mod trace {
    mod timing;
}
