//! Copy runs of a repeatable capture (the step copies, cut at their ready
//! points) whose work differs from the first run's: a ready point added,
//! doubled, moved or marked on another stream, a handoff written or read
//! after its ready point, an error after the cut, a nested capture.
//! Guards that each is a typed refusal or stays fenced (hazard-free). An
//! attack that found no hole.

use replay_arena::backend::Capture;
use replay_arena::sim;
use replay_arena::{CaptureError, RunnerId, StreamCaptureError};

use crate::support::faults::chain::{
    chain_with, injected, launch_three, standard, step_launches, two_handoffs, up_to_ready, Ctx,
};
use crate::support::faults::{assert_no_graph_memory, N, R};

#[test]
fn second_run_marks_a_ready_the_first_did_not_is_refused() {
    let c = chain_with(2, 1, 1, &mut |c, s| {
        if c.run == 1 && c.out.is_some() {
            // first run: no ready
            let (_, out) = c.out.unwrap();
            c.sim.launch(s, sim::Kernel::copy(c.count, out), 2)?;
            let t = c.sim.alloc_async(s, N)?;
            c.sim.launch(s, sim::Kernel::copy(&t, c.own), 1)?;
            return Ok(c.sim.free_async(s, &t)?);
        }
        standard(c, s)
    });
    assert!(
        c.capture_errors.iter().any(|e| e.contains("runner 0")),
        "{:?}",
        c.capture_errors
    );
    assert!(c.replayable.is_none());
    c.teardown();
}

#[test]
fn second_run_marks_ready_twice_is_refused() {
    let c = chain_with(2, 1, 1, &mut |c, s| {
        standard(c, s)?;
        if c.run == 2 {
            if let Some((h, _)) = c.out {
                c.cap.ready(h, s)?;
            }
        }
        Ok(())
    });
    assert!(
        c.capture_errors.iter().any(|e| e.contains("runner 0")),
        "{:?}",
        c.capture_errors
    );
    c.teardown();
}

#[test]
fn second_run_marks_ready_on_another_stream_is_refused() {
    let other = std::cell::RefCell::new(None::<sim::Stream>);
    let c = chain_with(2, 1, 1, &mut |c, s| {
        if c.run == 2 {
            if let Some((h, out)) = c.out {
                c.sim.launch(s, sim::Kernel::copy(c.count, out), 2)?;
                let o = other
                    .borrow_mut()
                    .get_or_insert_with(|| c.sim.new_stream())
                    .clone();
                c.cap.ready(h, &o)?;
                let t = c.sim.alloc_async(s, N)?;
                c.sim.launch(s, sim::Kernel::copy(&t, c.own), 1)?;
                return Ok(c.sim.free_async(s, &t)?);
            }
        }
        standard(c, s)
    });
    assert!(
        c.capture_errors.iter().any(|e| e.contains("runner 0")),
        "{:?}",
        c.capture_errors
    );
    c.teardown();
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
    let c = chain_with(3, 2, 1, &mut |c, s| {
        standard(c, s)?;
        if c.run == 2 && c.layer == 1 {
            return Err(injected());
        }
        Ok(())
    });
    assert!(
        c.capture_errors.iter().any(|e| e.contains("runner 1")),
        "{:?}",
        c.capture_errors
    );
    assert!(c.replayable.is_none());
    c.teardown();
}

#[test]
fn capture_errors_are_typed() {
    // The copy run failing is reported as the closure's error; a
    // RepeatDiffers as a capture error.
    let c = chain_with(2, 1, 1, &mut |c, s| {
        if c.run == 2 && c.layer == 0 {
            return Err(injected());
        }
        standard(c, s)
    });
    assert!(c.capture_errors.iter().any(|e| e.contains("closure fails")));
    c.teardown();
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
    let mut reference = chain_with(2, 1, 1, &mut standard);
    reference.per_runner(4);
    let mut c = chain_with(2, 1, 1, &mut |c, s| {
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
    });
    if !c.capture_errors.is_empty() {
        return c.teardown();
    }
    c.per_runner(1);
    step_launches(&mut c, 2, false).unwrap();
    c.per_runner(1);
    c.hazard_free();
    assert_eq!(c.values(), reference.values());
    c.teardown();
}

#[test]
fn writing_the_handoff_after_ready_only_in_the_copy_is_refused_or_fenced() {
    // The second run writes the handoff after its ready point: in a step
    // graph, the reader starts at the ready point, so part 2 races it.
    let mut c = chain_with(2, 1, 1, &mut |c, s| {
        standard(c, s)?;
        if c.run == 2 {
            if let Some((_, out)) = c.out {
                c.sim.launch(s, sim::Kernel::fill(out, 99.0), 50)?;
            }
        }
        Ok(())
    });
    if !c.capture_errors.is_empty() {
        return c.teardown();
    }
    let r = step_launches(&mut c, 3, false);
    if r.is_ok() {
        c.hazard_free();
    }
    c.teardown();
}

#[test]
fn writing_the_handoff_after_ready_in_both_runs_is_refused_or_fenced() {
    let mut c = chain_with(2, 1, 1, &mut |c, s| {
        standard(c, s)?;
        if let Some((_, out)) = c.out {
            c.sim.launch(s, sim::Kernel::fill(out, 99.0), 50)?;
        }
        Ok(())
    });
    if !c.capture_errors.is_empty() {
        return c.teardown();
    }
    c.per_runner(2);
    c.hazard_free();
    let _ = step_launches(&mut c, 3, false);
    c.hazard_free();
    c.teardown();
}

#[test]
fn reading_the_handoff_after_ready_in_the_copy_is_refused_or_fenced() {
    let mut c = chain_with(2, 1, 1, &mut |c, s| {
        standard(c, s)?;
        if c.run == 2 {
            if let Some((_, out)) = c.out {
                c.sim.launch(s, sim::Kernel::copy(out, c.own), 50)?;
            }
        }
        Ok(())
    });
    if c.capture_errors.is_empty() {
        let _ = step_launches(&mut c, 3, false);
        c.per_runner(1);
        c.hazard_free();
    }
    c.teardown();
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
            let mut reference = chain_with(3, 2, 3, &mut standard);
            reference.per_runner(3);
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
            c.hazard_free();
            if how == 3 {
                // same values: the write only moved
                assert_eq!(c.values(), reference.values(), "run {bad} how {how}");
            }
            c.teardown();
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
            }
            Ok(mut r) => {
                launch_three(&mut r, &streams, overlapping);
                r.synchronize().unwrap();
                assert!(
                    sim.hazards().is_empty(),
                    "overlapping {overlapping}: {:?}",
                    sim.hazards()
                );
                // Runners 1 and 2 copied runner 0's count (4 launches).
                for i in 1..3u32 {
                    let v = sim.read_f32(&r.views(RunnerId(i)).unwrap()[0]).unwrap();
                    assert_eq!(v[0], 4.0, "reader {i} overlapping {overlapping}");
                }
                drop(r);
            }
        }
        assert_no_graph_memory(&sim, "after the drop");
    }
}
