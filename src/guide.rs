//! The guides of `docs/`, one page each, as they read in the repository.
//! Their Rust snippets are this crate's doc tests: each one is a complete
//! program (or an item that compiles as it stands), so it compiles when
//! pasted into a crate that depends on `replay-arena`. Snippets that need a
//! GPU are compiled, not run (`no_run`). Links between guides name the
//! `.md` files of the repository (`docs/`), which the package ships.

#[doc = include_str!("../docs/concepts.md")]
pub mod concepts {}

#[doc = include_str!("../docs/lifecycle.md")]
pub mod lifecycle {}

#[doc = include_str!("../docs/trace.md")]
pub mod trace {}

#[cfg_attr(feature = "cuda", doc = include_str!("../docs/integration.md"))]
#[cfg_attr(
    not(feature = "cuda"),
    doc = "Adopting replay-arena in a cudarc program: `docs/integration.md` (needs the `cuda` feature)."
)]
pub mod integration {}

#[doc = include_str!("../docs/safety.md")]
pub mod safety {}

#[cfg_attr(feature = "cuda", doc = include_str!("../docs/gpu.md"))]
#[cfg_attr(
    not(feature = "cuda"),
    doc = "The `cuda` backend on your GPU: `docs/gpu.md` (needs the `cuda` feature)."
)]
pub mod gpu {}

#[cfg_attr(replay_arena_nccl, doc = include_str!("../docs/nccl.md"))]
#[cfg_attr(
    not(replay_arena_nccl),
    doc = "Symmetric domains on NCCL: `docs/nccl.md` (needs the `nccl` feature)."
)]
pub mod nccl {}

#[cfg_attr(feature = "serde", doc = include_str!("../docs/workload-format.md"))]
#[cfg_attr(
    not(feature = "serde"),
    doc = "Workload files and the plan explorer: `docs/workload-format.md` (needs the `serde` feature)."
)]
pub mod workload_format {}

#[doc = include_str!("../docs/BENCHMARKS.md")]
pub mod benchmarks {}

#[doc = include_str!("../docs/architecture.md")]
pub mod architecture {}

#[doc = include_str!("../docs/fuzzing.md")]
pub mod fuzzing {}

/// The README's snippets, compiled (its `cuda` ones `no_run`), and its
/// example run, as doc tests.
#[doc = include_str!("../README.md")]
#[cfg(all(doctest, feature = "cuda"))]
pub struct ReadmeDoctests;
