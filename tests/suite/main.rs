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
mod buckets {
    mod join;
    mod props;
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
    mod waits;
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
// Attack programs index streams and tables by number and keep the shapes
// the review wrote them in, as their files did before the split.
#[allow(
    clippy::needless_range_loop,
    clippy::unnecessary_unwrap,
    clippy::type_complexity,
    clippy::needless_borrow
)]
mod regression {
    mod a_temporary_freed_twice_is_refused;
    mod buckets_at_run_time_attacks;
    mod consumer_counts;
    mod consumer_views_close_when_their_closure_returns;
    mod cut_across_attacks;
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
    #[cfg(feature = "serde")]
    mod handoff_groups_register_without_a_list;
    #[cfg(feature = "serde")]
    mod named_params_avoid_handoff_numbers;
    mod one_pass_step_builds_match_per_runner;
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
    mod fence {
        mod a_launch_refused_by_a_program_capture_commits_nothing;
        mod captures_on_another_thread_lose_no_wait;
        mod consumer_access_is_read_only_or_alone;
        mod consumer_of_no_runner_is_a_typed_error;
        mod consuming_claimed_bytes_is_refused;
        mod dropping_a_buffer_waits_for_its_pending_ops;
        mod hot_path_attacks;
        mod repeat_across_attacks;
        mod failed_sim_graph_launch_enqueues_nothing;
        mod one_stream_capture_per_capture;
        mod panics_in_closures_stay_fenced;
        mod raw_span_into_an_arena_is_refused_at_replay;
        mod streams_in_use_elsewhere_are_refused;
        mod views_stay_in_their_plan_and_closure;
    }
    mod handoff {
        mod overwritten_handoff_is_refused;
        mod step_readers_wait_for_their_own_ready_point;
        mod waiting_for_a_reader_waits_for_its_reads;
    }
    mod kept_step {
        mod kept_bucket_step_attacks;
        mod kept_handoff_step_attacks;
        mod kept_step_interleaving_attacks;
        mod relaunch_after_wait_updates_fence;
    }
    mod step {
        mod foreign_streams_are_refused;
        mod graph_temporaries_stay_in_their_graph;
        mod launches_of_one_graph_run_in_turn;
        mod overlapping_step_graph_fuzz;
        mod overlapping_step_graphs_match_the_host_fence;
        mod panicking_step_consumer_keeps_the_views;
        mod refused_step_build_keeps_step_copies;
        mod repeatable_capture_attacks;
        mod step_consumer_of_an_unreplayed_runner_is_refused;
        mod step_graph_memory_attacks;
        mod step_launch_stream_attacks;
    }
}
mod report {
    mod graph_memory;
    mod table;
}
mod source {
    mod buffer_source;
}
mod step {
    mod build_cost;
    mod cut_across;
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
