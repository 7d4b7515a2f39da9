//! Every test that runs without a GPU, in one binary: a module per room of
//! `src/` (the layout of `docs/architecture.md`), the whole lifecycle, the
//! user pages, and a `regression` module with one file per finding, named by
//! the behaviour it guards. A test of `StepGraph::launch` goes in
//! `step/`; one that guards a fixed hole goes in `regression/`.
//!
//! The fixtures every module shares are `support` (tests/support/).
//! `architecture::tests_layout` checks that each module sits under a room.

#![allow(clippy::result_large_err)]

#[path = "../support/mod.rs"]
mod support;

mod architecture {
    mod layering;
    mod tests_layout;
}
mod backend {
    mod sim_model;
}
mod capture {
    mod framework_ops;
}
#[cfg(feature = "cli")]
mod cli {
    mod explorer;
}
mod docs {
    mod programs;
    mod quickstart;
    mod references;
}
mod error {
    mod ergonomics;
    mod every_error;
}
mod fence {
    mod fault_explorer;
    mod handoff_props;
    mod handoffs;
    mod leak_safety;
    mod props;
    mod transactions;
}
mod lifecycle {
    mod fuzz;
    mod teardown;
}
mod plan {
    mod buckets;
    mod props;
    mod scale;
}
mod regression {
    mod consumer_counts;
    mod cut_copies_and_traced_steps;
    mod faults_at_every_call;
    mod fence_holes;
    mod handoff_and_step_holes;
    mod kept_steps;
    mod overlapping_steps_and_copies;
    mod writers_split_at_ready_points;
}
mod report {
    mod table;
}
mod source {
    mod buffer_source;
}
mod step {
    mod graph;
    mod staged_inputs;
    mod temporaries;
    mod trace;
}
mod trace {
    mod chrome;
}
#[cfg(feature = "serde")]
mod workload {
    mod format;
}
