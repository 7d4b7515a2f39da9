//! Teardown on `sim`: whatever way a plan ends (sealed and dropped, re-planned,
//! a failed capture, a failed seal, an allocation failure midway), every arena
//! it allocated is freed exactly once, after the work that uses it.

use crate::support::record_and_finish;
use replay_arena::sim;
use replay_arena::{
    Capturing, DType, Discovering, Domain, Planned, Policy, Replayable, Request, Result, RunnerId,
};

const F32_64: Request = Request::new(Domain::Device, DType::F32, 64);
const BF16_1K: Request = Request::new(Domain::Device, DType::BF16, 1024);

/// Four runners, two keys, `G = 2`: four arenas (two keys x two generations).
fn planned() -> Planned {
    plan_of(Discovering::new(Default::default())).unwrap()
}

/// [`planned`]'s four runners recorded into `discovery`, then planned.
fn plan_of(mut discovery: Discovering) -> Result<Planned> {
    for r in 0..4 {
        let mut armed = discovery.arm(RunnerId(r))?;
        armed.record(F32_64)?;
        armed.record(BF16_1K)?;
    }
    let planned = discovery.plan(Policy::Generations(2))?;
    assert_eq!(planned.arenas().len(), 4);
    Ok(planned)
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

/// Captures all four runners (see [`capture`]).
fn capture_all(capturing: &mut Capturing<sim::Device>, sim: &sim::Device, stream: &sim::Stream) {
    for r in 0..4 {
        capture(capturing, sim, stream, r);
    }
}

/// [`planned`] allocated on `sim` with all four runners captured.
fn all_captured(sim: &sim::Device, stream: &sim::Stream) -> Capturing<sim::Device> {
    let mut capturing = planned().allocate(sim.clone()).unwrap();
    capture_all(&mut capturing, sim, stream);
    capturing
}

/// Seals `capturing` and replays every runner once on `stream`.
fn seal_and_replay_all(
    capturing: Capturing<sim::Device>,
    stream: &sim::Stream,
) -> Replayable<sim::Device> {
    let mut replayable = capturing.seal().unwrap();
    for r in 0..4 {
        replayable.replay(RunnerId(r), stream).unwrap();
    }
    replayable
}

/// Starts runner `r`'s capture, takes its f32 view, and fails the capture.
fn fail_a_capture(capturing: &mut Capturing<sim::Device>, stream: &sim::Stream, r: u32) {
    let cap = capturing.capture(RunnerId(r)).unwrap();
    cap.take(F32_64).unwrap();
    cap.stream_capture(stream, |_| Err::<(), _>("boom"))
        .unwrap_err();
}

/// Allocation `n + 1` fails: allocating the plan is refused, and the `n`
/// arenas allocated before it are freed once each.
fn an_allocation_failing_after(n: usize) {
    let sim = sim::Device::new();
    sim.fail_allocations_after(Some(n));
    assert!(planned().allocate(sim.clone()).is_err());
    assert_all_freed_once(&sim, n as u64);
}

/// Ends a fresh [`planned`] allocation on a fresh backend with `end` (given
/// the backend, a stream and the capturing phase), then asserts that all
/// four arenas were freed once each.
fn ending_frees_every_arena_once(
    end: impl FnOnce(&sim::Device, &sim::Stream, Capturing<sim::Device>),
) {
    let sim = sim::Device::new();
    let stream = sim.new_stream();
    end(&sim, &stream, planned().allocate(sim.clone()).unwrap());
    assert_all_freed_once(&sim, 4);
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
    ending_frees_every_arena_once(|sim, stream, mut capturing| {
        capture_all(&mut capturing, sim, stream);
        drop(seal_and_replay_all(capturing, stream));
    });
}

#[test]
fn dropping_a_capturing_phase_frees_every_arena_once() {
    ending_frees_every_arena_once(|sim, stream, mut capturing| {
        capture(&mut capturing, sim, stream, 0);
        drop(capturing);
    });
}

#[test]
fn a_failed_capture_then_dropping_frees_every_arena_once() {
    ending_frees_every_arena_once(|_, stream, mut capturing| {
        fail_a_capture(&mut capturing, stream, 0);
        drop(capturing);
    });
}

#[test]
fn a_failed_seal_frees_every_arena_once() {
    ending_frees_every_arena_once(|sim, stream, mut capturing| {
        capture(&mut capturing, sim, stream, 0);
        assert!(capturing.seal().is_err());
    });
}

#[test]
fn an_allocation_failure_midway_frees_what_was_allocated() {
    an_allocation_failing_after(2);
}

#[test]
fn an_allocation_failure_at_the_first_arena_allocates_nothing() {
    an_allocation_failing_after(0);
}

#[test]
fn replan_frees_every_arena_once_before_returning_discovery() {
    let sim = sim::Device::new();
    let stream = sim.new_stream();
    let mut replayable = all_captured(&sim, &stream).seal().unwrap();
    replayable.replay(RunnerId(0), &stream).unwrap();
    let discovery = replayable.replan().unwrap();
    assert_all_freed_once(&sim, 4);
    assert_eq!(discovery.runners().count(), 0, "discovery starts afresh");
}

#[test]
fn replan_of_a_capturing_phase_frees_every_arena_once() {
    ending_frees_every_arena_once(|_, _, capturing| {
        capturing.replan();
    });
}

#[test]
fn successive_plans_on_one_backend_each_free_their_own_arenas() {
    let sim = sim::Device::new();
    let stream = sim.new_stream();
    for round in 1..=3 {
        all_captured(&sim, &stream)
            .seal()
            .unwrap()
            .replan()
            .unwrap();
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
    let mut replayable = seal_and_replay_all(all_captured(&sim, &stream), &stream);
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
    fail_a_capture(&mut capturing, &stream, 1);
    let discovery = capturing.replan();
    assert_all_freed_once(&sim, 4);

    // A fresh discovery, plan and capture on the same backend.
    let mut capturing = plan_of(discovery)?.allocate(sim.clone())?;
    capture_all(&mut capturing, &sim, &stream);
    let replayable = seal_and_replay_all(capturing, &stream);
    let views = replayable.views(RunnerId(3))?;
    assert_eq!(sim.read_f32(&views[0])?, vec![3.0; 64]);
    assert!(sim.hazards().is_empty());
    drop(replayable);
    assert_all_freed_once(&sim, 8);
    Ok(())
}
