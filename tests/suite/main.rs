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
    mod consumer_views_close_when_their_closure_returns;
    mod cut_copies {
        mod backend_roles_from_safe_code;
        mod copy_runs_that_differ;
        mod traced_step_graphs;
        mod values_match_per_runner_replays;
        mod whole_programs;
    }
    mod faults {
        mod in_handoffs;
        mod in_staging_and_buckets;
        mod in_step_graphs;
        mod in_teardown_allocation_and_traces;
        mod in_temporaries_and_step_copies;
        mod in_waits_and_consumers;
    }
    mod fence_holes;
    mod handoff_and_step_holes;
    #[cfg(feature = "serde")]
    mod handoff_groups_register_without_a_list;
    mod kept_steps;
    #[cfg(feature = "serde")]
    mod named_params_avoid_handoff_numbers;
    mod overlapping_steps_and_copies;
    mod sim_memory_nodes_only_from_alloc_and_free;
    mod split_writers {
        mod copy_runs_that_differ;
        mod faults_at_cuts_and_builds;
        mod values_match_per_runner_replays;
    }
    mod step_copies_outlive_failed_builds;
    mod temporary_used_after_its_free_is_refused;
    mod trace_capacity_is_bounded;
    mod unsealed_capturing_drop_trims_graph_memory;
}
mod report {
    mod table;
}
mod source {
    mod buffer_source;
}
mod step {
    mod graph;
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
