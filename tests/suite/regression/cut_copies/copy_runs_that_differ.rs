//! Copy runs of a repeatable capture (the step copies, cut at their ready
//! points) whose work differs from the first run's: a ready point added,
//! doubled, moved or marked on another stream, a handoff written or read
//! after its ready point, an error after the cut, a nested capture.
//! Guards that each is a typed refusal or stays fenced (hazard-free). An
//! attack that found no hole.

use replay_arena::backend::Capture;
use replay_arena::sim;
use replay_arena::{CaptureError, HandoffId, RunnerId, StreamCaptureError, View};

use crate::support::attacks::{assert_readers_hold, assert_values_then_teardown, replayed_values};
use crate::support::faults::chain::{
    chain_with, injected, launch_three, standard, step_launches, two_handoffs, up_to_ready, Chain,
    Ctx,
};
use crate::support::faults::{assert_no_graph_memory, N, R};

/// A chain of `layers` runners at `g` generations, one copy each,
/// captured with `work`: the capture fails naming `what`, nothing is
/// sealed, and it tears down clean.
fn assert_refused(
    layers: usize,
    g: usize,
    what: &str,
    work: &mut dyn FnMut(&Ctx, &sim::Stream) -> R,
) {
    let c = chain_with(layers, g, 1, work);
    assert!(
        c.capture_errors.iter().any(|e| e.contains(what)),
        "{:?}",
        c.capture_errors
    );
    assert!(c.replayable.is_none());
    c.teardown();
}

/// A chain of two runners, one copy each, captured with `work`; `None`
/// (torn down) where the capture was refused.
fn captured_or_refused(work: &mut dyn FnMut(&Ctx, &sim::Stream) -> R) -> Option<Chain> {
    let c = chain_with(2, 1, 1, work);
    if c.capture_errors.is_empty() {
        return Some(c);
    }
    c.teardown();
    None
}

/// The end of a run that differs: own = a temporary's contents, and the
/// temporary freed.
fn own_from_a_temporary(c: &Ctx, s: &sim::Stream) -> R {
    let t = c.sim.alloc_async(s, N)?;
    c.sim.launch(s, sim::Kernel::copy(&t, c.own), 1)?;
    Ok(c.sim.free_async(s, &t)?)
}

#[test]
fn second_run_marks_a_ready_the_first_did_not_is_refused() {
    assert_refused(2, 1, "runner 0", &mut |c, s| {
        if c.run == 1 && c.out.is_some() {
            // first run: no ready
            let (_, out) = c.out.unwrap();
            c.sim.launch(s, sim::Kernel::copy(c.count, out), 2)?;
            return own_from_a_temporary(c, s);
        }
        standard(c, s)
    });
}

#[test]
fn second_run_marks_ready_twice_is_refused() {
    let mut work = standard_then(|run| run == 2, |c, s, h, _| Ok(c.cap.ready(h, s)?));
    assert_refused(2, 1, "runner 0", &mut work);
}

#[test]
fn second_run_marks_ready_on_another_stream_is_refused() {
    let other = std::cell::RefCell::new(None::<sim::Stream>);
    assert_refused(2, 1, "runner 0", &mut |c, s| {
        if c.run == 2 {
            if let Some((h, out)) = c.out {
                c.sim.launch(s, sim::Kernel::copy(c.count, out), 2)?;
                let o = other
                    .borrow_mut()
                    .get_or_insert_with(|| c.sim.new_stream())
                    .clone();
                c.cap.ready(h, &o)?;
                return own_from_a_temporary(c, s);
            }
        }
        standard(c, s)
    });
}

#[test]
fn a_capture_begun_on_another_stream_and_ready_there_in_the_copy_run() {
    let c = chain_with(2, 1, 1, &mut |c, s| {
        if c.run == 2 {
            if let Some((h, out)) = c.out {
                c.sim.launch(s, sim::Kernel::copy(c.count, out), 2)?;
                let o = c.sim.new_stream();
                c.sim.begin_capture(&o)?;
                let r = c.cap.ready(h, &o);
                assert!(r.is_err(), "ready accepted on a foreign capture");
                r?;
            }
        }
        standard(c, s)
    });
    assert!(!c.capture_errors.is_empty());
    c.teardown();
}

#[test]
fn error_after_the_cut_in_the_second_run_fails_the_runner_and_leaks_nothing() {
    assert_refused(3, 2, "runner 1", &mut |c, s| {
        standard(c, s)?;
        if c.run == 2 && c.layer == 1 {
            return Err(injected());
        }
        Ok(())
    });
}

#[test]
fn capture_errors_are_typed() {
    // The copy run failing is reported as the closure's error; a
    // RepeatDiffers as a capture error.
    assert_refused(2, 1, "closure fails", &mut |c, s| {
        if c.run == 2 && c.layer == 0 {
            return Err(injected());
        }
        standard(c, s)
    });
    let _ = (
        CaptureError::NestedCapture {
            runner: RunnerId(0),
        },
        StreamCaptureError::<replay_arena::Error>::Capture(CaptureError::NestedCapture {
            runner: RunnerId(0),
        }),
    );
}

#[test]
fn second_run_allocates_only_after_the_cut_differs_from_first() {
    // First run: temporary allocated before the ready; second: after.
    let expected = replayed_values(2, 1, 1, &mut standard, 4);
    let work = &mut |c: &Ctx, s: &sim::Stream| -> R {
        let sim = c.sim;
        if c.run == 1 {
            let t = sim.alloc_async(s, N)?;
            up_to_ready(c, s)?;
            sim.launch(s, sim::Kernel::copy(c.count, &t), 5)?;
            sim.launch(s, sim::Kernel::copy(&t, c.own), 30)?;
            Ok(sim.free_async(s, &t)?)
        } else {
            standard(c, s)
        }
    };
    if let Some(mut c) = captured_or_refused(work) {
        c.per_runner(1);
        step_launches(&mut c, 2, false).unwrap();
        c.per_runner(1);
        assert_values_then_teardown(c, &expected, "the temporary moved after the cut");
    }
}

/// A chain's work: [`standard`], then, in the runs `when` picks, `extra`
/// on the runner's handoff (where it has one).
fn standard_then(
    when: impl Fn(usize) -> bool,
    extra: impl Fn(&Ctx, &sim::Stream, HandoffId, &View<'_>) -> R,
) -> impl FnMut(&Ctx, &sim::Stream) -> R {
    move |c: &Ctx, s: &sim::Stream| -> R {
        standard(c, s)?;
        match c.out {
            Some((h, out)) if when(c.run) => extra(c, s, h, out),
            _ => Ok(()),
        }
    }
}

/// The handoff filled with 99 after its ready point, slowly.
fn overwrite(c: &Ctx, s: &sim::Stream, _: HandoffId, out: &View<'_>) -> R {
    Ok(c.sim.launch(s, sim::Kernel::fill(out, 99.0), 50)?)
}

#[test]
fn writing_the_handoff_after_ready_only_in_the_copy_is_refused_or_fenced() {
    // The second run writes the handoff after its ready point: in a step
    // graph, the reader starts at the ready point, so part 2 races it.
    if let Some(mut c) = captured_or_refused(&mut standard_then(|run| run == 2, overwrite)) {
        if step_launches(&mut c, 3, false).is_ok() {
            c.hazard_free();
        }
        c.teardown();
    }
}

#[test]
fn writing_the_handoff_after_ready_in_both_runs_is_refused_or_fenced() {
    if let Some(mut c) = captured_or_refused(&mut standard_then(|_| true, overwrite)) {
        c.per_runner(2);
        c.hazard_free();
        let _ = step_launches(&mut c, 3, false);
        c.hazard_free();
        c.teardown();
    }
}

#[test]
fn reading_the_handoff_after_ready_in_the_copy_is_refused_or_fenced() {
    let mut work = standard_then(
        |run| run == 2,
        |c, s, _, out| Ok(c.sim.launch(s, sim::Kernel::copy(out, c.own), 50)?),
    );
    if let Some(mut c) = captured_or_refused(&mut work) {
        let _ = step_launches(&mut c, 3, false);
        c.per_runner(1);
        c.hazard_free();
        c.teardown();
    }
}

#[test]
fn nested_repeatable_capture_inside_the_work_is_refused() {
    let c = chain_with(2, 1, 1, &mut |c, s| {
        standard(c, s)?;
        if c.layer == 0 {
            let inner = c
                .cap
                .stream_capture_repeatable(s, |_s| Ok::<(), replay_arena::Error>(()));
            assert!(inner.is_err(), "nested capture accepted");
        }
        Ok(())
    });
    c.teardown();
}

/// The work of run `bad` differs from the others in the way `how` says.
fn differing_run(bad: usize, how: u8) -> impl FnMut(&Ctx, &sim::Stream) -> R {
    move |c: &Ctx, s: &sim::Stream| -> R {
        if c.run != bad || c.out.is_none() {
            return standard(c, s);
        }
        let sim = c.sim;
        let (h, out) = c.out.unwrap();
        sim.launch(s, sim::Kernel::add(c.one, c.count), 1)?;
        if let Some(input) = c.input {
            sim.launch(s, sim::Kernel::add(input, c.sink), 20)?;
        }
        let t = sim.alloc_async(s, N)?;
        match how {
            // no ready point at all
            0 => sim.launch(s, sim::Kernel::copy(c.count, out), 2)?,
            // ready before the write
            1 => {
                c.cap.ready(h, s)?;
                sim.launch(s, sim::Kernel::copy(c.count, out), 2)?;
            }
            // ready twice
            2 => {
                sim.launch(s, sim::Kernel::copy(c.count, out), 2)?;
                c.cap.ready(h, s)?;
                c.cap.ready(h, s)?;
            }
            // the write moved after the temporary's slow use
            _ => {
                sim.launch(s, sim::Kernel::copy(c.count, &t), 5)?;
                sim.launch(s, sim::Kernel::copy(&t, out), 40)?;
                c.cap.ready(h, s)?;
            }
        }
        sim.launch(s, sim::Kernel::copy(c.count, &t), 5)?;
        sim.launch(s, sim::Kernel::copy(&t, c.own), 30)?;
        Ok(sim.free_async(s, &t)?)
    }
}

#[test]
fn a_later_step_copy_run_that_differs_is_refused_or_fenced() {
    for bad in [2usize, 3, 4] {
        for how in 0..4u8 {
            let expected = replayed_values(3, 2, 3, &mut standard, 3);
            let mut w = differing_run(bad, how);
            let mut c = chain_with(3, 2, 3, &mut w);
            if !c.capture_errors.is_empty() {
                assert!(c.replayable.is_none());
                c.teardown();
                continue;
            }
            for _ in 0..3 {
                step_launches(&mut c, 1, false).unwrap();
            }
            if how == 3 {
                // same values: the write only moved
                assert_values_then_teardown(c, &expected, format!("run {bad} how {how}"));
            } else {
                c.hazard_free();
                c.teardown();
            }
        }
    }
}

#[test]
fn a_copy_run_marking_two_handoffs_in_another_order_is_refused_or_fenced() {
    for overlapping in [false, true] {
        let copies = if overlapping { 2 } else { 1 };
        let (sim, r, streams, _count) =
            two_handoffs(|run| if run == 1 { [0, 1] } else { [1, 0] }, copies);
        match r {
            Err(e) => {
                assert!(e.contains("ready") || e.contains("differ"), "{e}");
                assert_no_graph_memory(&sim, "after the drop");
            }
            Ok(mut r) => {
                launch_three(&mut r, &streams, overlapping);
                // Runners 1 and 2 copied runner 0's count (4 launches).
                assert_readers_hold(&sim, r, 4.0, format!("overlapping {overlapping}"));
            }
        }
    }
}
