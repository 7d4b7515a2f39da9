//! The guides of `docs/`, one page each, as they read in the repository.
//! Their Rust snippets are this crate's doc tests: each one is a complete
//! program (or an item that compiles as it stands), so it compiles when
//! pasted into a crate that depends on `replay-arena`. Snippets that need a
//! GPU are compiled, not run (`no_run`).
//!
//! Links between guides are reference links named for the page they lead to
//! on GitHub (`[the schedules][lifecycle.md#replay-schedules]`). Each page
//! ends with the GitHub targets of its links; here each page's text is
//! preceded by definitions of the same labels (`guide_links!` below),
//! which come first and so win: the page's module, or the file in the
//! package's source on docs.rs. `tests/suite/docs/references.rs` checks that every
//! link of a page has both definitions and that they name the same page
//! and heading; a module path that does not resolve fails the doc build.

//!
//! Shape buckets join a sealed plan at run time, within a budget of
//! captured buckets the program sets: `lifecycle`'s "Buckets at run time"
//! (its example runs on `sim`).

#![deny(rustdoc::broken_intra_doc_links)]

/// The docs.rs targets of the guides' links, one per label a page uses:
/// `[PAGE.md#anchor]: crate::guide::MODULE#anchor`, or the file in the
/// package's source for files that are not guides.
macro_rules! guide_links {
    () => {
        "\
[architecture.md]: crate::guide::architecture
[BENCHMARKS.md]: crate::guide::benchmarks
[BENCHMARKS.md#gpu-a-tensor-parallel-backward-on-cublas-graphed-per-module-on-one-and-two-h200s]: crate::guide::benchmarks#gpu-a-tensor-parallel-backward-on-cublas-graphed-per-module-on-one-and-two-h200s
[BENCHMARKS.md#gpu-captured-symmetric-reduce-scatter-two-h200s]: crate::guide::benchmarks#gpu-captured-symmetric-reduce-scatter-two-h200s
[BENCHMARKS.md#gpu-overlap-kept]: crate::guide::benchmarks#gpu-overlap-kept
[BENCHMARKS.md#gpu-the-cost-of-a-trace]: crate::guide::benchmarks#gpu-the-cost-of-a-trace
[concepts.md]: crate::guide::concepts
[concepts.md#glossary]: crate::guide::concepts#glossary
[fuzzing.md]: crate::guide::fuzzing
[gpu.md]: crate::guide::gpu
[gpu.md#running-under-compute-sanitizer]: crate::guide::gpu#running-under-compute-sanitizer
[gpu.md#what-you-need]: crate::guide::gpu#what-you-need
[integration.md]: crate::guide::integration
[lifecycle.md]: crate::guide::lifecycle
[lifecycle.md#5-stepgraph-one-launch-per-step]: crate::guide::lifecycle#5-stepgraph-one-launch-per-step
[lifecycle.md#replay-schedules]: crate::guide::lifecycle#replay-schedules
[lifecycle.md#shape-buckets-several-captured-shapes-in-one-plan]: crate::guide::lifecycle#shape-buckets-several-captured-shapes-in-one-plan
[nccl.md]: crate::guide::nccl
[nccl.md#environment]: crate::guide::nccl#environment
[safety.md]: crate::guide::safety
[trace.md]: crate::guide::trace
[workload-format.md]: crate::guide::workload_format
[../CHANGELOG.md]: https://docs.rs/crate/replay-arena/latest/source/CHANGELOG.md
[plan-tp-backward-mid.svg]: https://docs.rs/crate/replay-arena/latest/source/docs/plan-tp-backward-mid.svg
"
    };
}

#[doc = guide_links!()]
#[doc = include_str!("../docs/concepts.md")]
pub mod concepts {}

#[doc = guide_links!()]
#[doc = include_str!("../docs/lifecycle.md")]
pub mod lifecycle {}

#[doc = guide_links!()]
#[doc = include_str!("../docs/trace.md")]
pub mod trace {}

#[doc = guide_links!()]
#[cfg_attr(feature = "cuda", doc = include_str!("../docs/integration.md"))]
#[cfg_attr(
    not(feature = "cuda"),
    doc = "Adopting replay-arena in a cudarc program: `docs/integration.md` (needs the `cuda` feature)."
)]
pub mod integration {}

#[doc = guide_links!()]
#[doc = include_str!("../docs/safety.md")]
pub mod safety {}

#[doc = guide_links!()]
#[cfg_attr(feature = "cuda", doc = include_str!("../docs/gpu.md"))]
#[cfg_attr(
    not(feature = "cuda"),
    doc = "The `cuda` backend on your GPU: `docs/gpu.md` (needs the `cuda` feature)."
)]
pub mod gpu {}

#[doc = guide_links!()]
#[cfg_attr(replay_arena_nccl, doc = include_str!("../docs/nccl.md"))]
#[cfg_attr(
    not(replay_arena_nccl),
    doc = "Symmetric domains on NCCL: `docs/nccl.md` (needs the `nccl` feature)."
)]
pub mod nccl {}

#[doc = guide_links!()]
#[cfg_attr(feature = "serde", doc = include_str!("../docs/workload-format.md"))]
#[cfg_attr(
    not(feature = "serde"),
    doc = "Workload files and the plan explorer: `docs/workload-format.md` (needs the `serde` feature)."
)]
pub mod workload_format {}

#[doc = guide_links!()]
#[doc = include_str!("../docs/BENCHMARKS.md")]
pub mod benchmarks {}

#[doc = guide_links!()]
#[doc = include_str!("../docs/architecture.md")]
pub mod architecture {}

#[doc = guide_links!()]
#[doc = include_str!("../docs/fuzzing.md")]
pub mod fuzzing {}

/// The README's snippets, compiled (its `cuda` ones `no_run`), and its
/// example run, as doc tests.
#[doc = include_str!("../README.md")]
#[cfg(all(doctest, feature = "cuda"))]
pub struct ReadmeDoctests;
