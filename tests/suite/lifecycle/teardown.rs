//! Teardown on `sim`: whatever way a plan ends (sealed and dropped, re-planned,
//! a failed capture, a failed seal, an allocation failure midway), every arena
//! it allocated is freed exactly once, after the work that uses it.

use crate::support::record_and_finish;
use replay_arena::sim;
use replay_arena::{
    Capturing, DType, Discovering, Domain, Planned, Policy, Request, Result, RunnerId,
};

const F32_64: Request = Request::new(Domain::Device, DType::F32, 64);
const BF16_1K: Request = Request::new(Domain::Device, DType::BF16, 1024);

/// Four runners, two keys, `G = 2`: four arenas (two keys x two generations).
fn planned() -> Planned {
    let mut discovery = Discovering::new(Default::default());
    for r in 0..4 {
        let mut armed = discovery.arm(RunnerId(r)).unwrap();
        armed.record(F32_64).unwrap();
        armed.record(BF16_1K).unwrap();
    }
    let planned = discovery.plan(Policy::Generations(2)).unwrap();
    assert_eq!(planned.arenas().len(), 4);
    planned
}

/// Captures runner `r` correctly, filling its f32 view with `r`.
fn capture(
    capturing: &mut Capturing<sim::Device>,
    sim: &sim::Device,
    stream: &sim::Stream,
    r: u32,
) {
    let cap = capturing.capture(RunnerId(r)).unwrap();
    let f32_view = cap.take(F32_64).unwrap();
    cap.take(BF16_1K).unwrap();
    record_and_finish!(cap, stream, |s| {
        sim.launch(s, sim::Kernel::fill(&f32_view, r as f32), 10)
    });
}

/// Asserts that `sim` allocated `n` times and freed all of them once.
#[track_caller]
fn assert_all_freed_once(sim: &sim::Device, n: u64) {
    assert_eq!(sim.live_allocations(), 0, "live allocations remain");
    assert_eq!(sim.allocation_counts(), (n, n), "(allocated, freed)");
}

#[test]
fn allocate_makes_one_allocation_per_arena() {
    let sim = sim::Device::new();
    let capturing = planned().allocate(sim.clone()).unwrap();
    assert_eq!(sim.live_allocations(), 4);
    assert_eq!(sim.allocation_counts(), (4, 0));
    drop(capturing);
}

#[test]
fn dropping_a_replayable_frees_every_arena_once() {
    let sim = sim::Device::new();
    let stream = sim.new_stream();
    let mut capturing = planned().allocate(sim.clone()).unwrap();
    for r in 0..4 {
        capture(&mut capturing, &sim, &stream, r);
    }
    let mut replayable = capturing.seal().unwrap();
    for r in 0..4 {
        replayable.replay(RunnerId(r), &stream).unwrap();
    }
    drop(replayable);
    assert_all_freed_once(&sim, 4);
}

#[test]
fn dropping_a_capturing_phase_frees_every_arena_once() {
    let sim = sim::Device::new();
    let stream = sim.new_stream();
    let mut capturing = planned().allocate(sim.clone()).unwrap();
    capture(&mut capturing, &sim, &stream, 0);
    drop(capturing);
    assert_all_freed_once(&sim, 4);
}

#[test]
fn a_failed_capture_then_dropping_frees_every_arena_once() {
    let sim = sim::Device::new();
    let stream = sim.new_stream();
    let mut capturing = planned().allocate(sim.clone()).unwrap();
    {
        let cap = capturing.capture(RunnerId(0)).unwrap();
        cap.take(F32_64).unwrap();
        cap.stream_capture(&stream, |_| Err::<(), _>("boom"))
            .unwrap_err();
    }
    drop(capturing);
    assert_all_freed_once(&sim, 4);
}

#[test]
fn a_failed_seal_frees_every_arena_once() {
    let sim = sim::Device::new();
    let stream = sim.new_stream();
    let mut capturing = planned().allocate(sim.clone()).unwrap();
    capture(&mut capturing, &sim, &stream, 0);
    assert!(capturing.seal().is_err());
    assert_all_freed_once(&sim, 4);
}

#[test]
fn an_allocation_failure_midway_frees_what_was_allocated() {
    let sim = sim::Device::new();
    sim.fail_allocations_after(Some(2));
    assert!(planned().allocate(sim.clone()).is_err());
    assert_all_freed_once(&sim, 2);
}

#[test]
fn an_allocation_failure_at_the_first_arena_allocates_nothing() {
    let sim = sim::Device::new();
    sim.fail_allocations_after(Some(0));
    assert!(planned().allocate(sim.clone()).is_err());
    assert_all_freed_once(&sim, 0);
}

#[test]
fn replan_frees_every_arena_once_before_returning_discovery() {
    let sim = sim::Device::new();
    let stream = sim.new_stream();
    let mut capturing = planned().allocate(sim.clone()).unwrap();
    for r in 0..4 {
        capture(&mut capturing, &sim, &stream, r);
    }
    let mut replayable = capturing.seal().unwrap();
    replayable.replay(RunnerId(0), &stream).unwrap();
    let discovery = replayable.replan().unwrap();
    assert_all_freed_once(&sim, 4);
    assert_eq!(discovery.runners().count(), 0, "discovery starts afresh");
}

#[test]
fn replan_of_a_capturing_phase_frees_every_arena_once() {
    let sim = sim::Device::new();
    let capturing = planned().allocate(sim.clone()).unwrap();
    capturing.replan();
    assert_all_freed_once(&sim, 4);
}

#[test]
fn successive_plans_on_one_backend_each_free_their_own_arenas() {
    let sim = sim::Device::new();
    let stream = sim.new_stream();
    for round in 1..=3 {
        let mut capturing = planned().allocate(sim.clone()).unwrap();
        for r in 0..4 {
            capture(&mut capturing, &sim, &stream, r);
        }
        capturing.seal().unwrap().replan().unwrap();
        assert_all_freed_once(&sim, 4 * round);
    }
}

#[test]
fn teardown_leaves_memory_outside_the_plan_alone() {
    let sim = sim::Device::new();
    let outside = sim.alloc_f32(16).unwrap();
    drop(planned().allocate(sim.clone()).unwrap());
    assert_eq!(sim.live_allocations(), 1);
    assert_eq!(sim.read_f32(&outside).unwrap(), vec![0.0; 16]);
}

#[test]
fn dropping_a_replayable_lets_in_flight_work_finish_before_freeing() {
    // A consumer copies runner 0's view into a buffer outside the plan; the
    // copy is still pending on the simulated clock when the plan is dropped.
    // Teardown synchronizes first, so the copy read live arena memory.
    let sim = sim::Device::new();
    let stream = sim.new_stream();
    let mut capturing = planned().allocate(sim.clone()).unwrap();
    for r in 0..4 {
        capture(&mut capturing, &sim, &stream, r);
    }
    let mut replayable = capturing.seal().unwrap();
    for r in 0..4 {
        replayable.replay(RunnerId(r), &stream).unwrap();
    }
    let out = sim.alloc_f32(64).unwrap();
    let side = sim.new_stream();
    replayable
        .consume(RunnerId(2), &side, |s, views| {
            sim.launch(s, sim::Kernel::copy(&views[0], &out), 100)
        })
        .unwrap();
    drop(replayable);
    assert_eq!(
        sim.live_allocations(),
        1,
        "only the buffer outside the plan"
    );
    assert_eq!(sim.read_f32(&out).unwrap(), vec![2.0; 64]);
}

#[test]
fn a_failed_capture_then_replan_captures_and_replays() -> Result<()> {
    let sim = sim::Device::new();
    let stream = sim.new_stream();
    let mut capturing = planned().allocate(sim.clone())?;
    {
        let cap = capturing.capture(RunnerId(1))?;
        cap.take(F32_64)?;
        cap.stream_capture(&stream, |_| Err::<(), _>("boom"))
            .unwrap_err();
    }
    let mut discovery = capturing.replan();
    assert_all_freed_once(&sim, 4);

    // A fresh discovery, plan and capture on the same backend.
    for r in 0..4 {
        let mut armed = discovery.arm(RunnerId(r))?;
        armed.record(F32_64)?;
        armed.record(BF16_1K)?;
    }
    let mut capturing = discovery
        .plan(Policy::Generations(2))?
        .allocate(sim.clone())?;
    for r in 0..4 {
        capture(&mut capturing, &sim, &stream, r);
    }
    let mut replayable = capturing.seal()?;
    for r in 0..4 {
        replayable.replay(RunnerId(r), &stream)?;
    }
    let views = replayable.views(RunnerId(3))?;
    assert_eq!(sim.read_f32(&views[0])?, vec![3.0; 64]);
    assert!(sim.hazards().is_empty());
    drop(replayable);
    assert_all_freed_once(&sim, 8);
    Ok(())
}
