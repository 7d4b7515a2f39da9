//! Step graphs of cut step copies give the values of per-runner replays:
//! temporaries across the cut, readers after their own ready point, zero
//! to three copies, a runner twice in one step, two handoffs of one
//! writer, consumers waiting for the part after the cut, trims between
//! launches. An attack that found no hole.

use replay_arena::backend::{Backend, Capture, Streams};
use replay_arena::sim;
use replay_arena::RunnerId;

use crate::support::attacks::{
    assert_hazard_free, assert_readers_hold, assert_values_then_teardown, captured_chain,
    launch_in_turn, replayed_values,
};
use crate::support::faults::chain::{launch_three, standard, step_launches, two_handoffs, Ctx};
use crate::support::faults::{build, N, R};

/// A chain of `layers` runners at `g` generations with `copies` step
/// copies, captured with `work`: `before` per-runner replays, `launches`
/// launches of one step graph (overlapping or not), `after` per-runner
/// replays give the values of the chain captured with `reference`
/// replayed per runner throughout.
struct Steps {
    layers: usize,
    g: usize,
    copies: usize,
    before: usize,
    launches: usize,
    after: usize,
    overlapping: bool,
}

impl Steps {
    fn match_replays(
        &self,
        reference: &mut dyn FnMut(&Ctx, &sim::Stream) -> R,
        work: &mut dyn FnMut(&Ctx, &sim::Stream) -> R,
    ) {
        let Steps {
            layers,
            g,
            copies,
            before,
            launches,
            after,
            overlapping,
        } = *self;
        let replays = before + launches + after;
        let expected = replayed_values(layers, g, copies, reference, replays);
        let mut c = captured_chain(layers, g, copies, work);
        c.per_runner(before);
        step_launches(&mut c, launches, overlapping).unwrap();
        c.per_runner(after);
        let what = format!("overlapping {overlapping} g {g}");
        assert_values_then_teardown(c, &expected, what);
    }
}

/// [`Steps`] of three runners, one copy each, launched 5 times.
const FIVE_LAUNCHES: Steps = Steps {
    layers: 3,
    g: 1,
    copies: 1,
    before: 0,
    launches: 5,
    after: 0,
    overlapping: false,
};

#[test]
fn baseline_cut_copies_match_per_runner_replays() {
    let steps = Steps {
        layers: 4,
        g: 2,
        before: 1,
        launches: 6,
        after: 1,
        ..FIVE_LAUNCHES
    };
    steps.match_replays(&mut standard, &mut standard);
}

#[test]
fn temporary_used_and_freed_across_the_cut_gives_right_values() {
    let mut work = |c: &Ctx, s: &sim::Stream| -> R {
        let sim = c.sim;
        let t = sim.alloc_async(s, N)?;
        sim.launch(s, sim::Kernel::add(c.one, c.count), 1)?;
        sim.launch(s, sim::Kernel::copy(c.count, &t), 3)?;
        if let Some(input) = c.input {
            sim.launch(s, sim::Kernel::add(input, c.sink), 20)?;
        }
        if let Some((h, out)) = c.out {
            sim.launch(s, sim::Kernel::copy(&t, out), 2)?;
            c.cap.ready(h, s)?;
        }
        sim.launch(s, sim::Kernel::copy(&t, c.own), 30)?;
        Ok(sim.free_async(s, &t)?)
    };
    let mut reference = work;
    FIVE_LAUNCHES.match_replays(&mut reference, &mut work);
}

#[test]
fn a_middle_runner_reading_its_input_after_its_own_ready_is_fenced_in_steps() {
    // Runner l reads its input in part 2 (after marking its own output
    // ready). The next step's writer of that input must wait for part 2.
    let mut work = |c: &Ctx, s: &sim::Stream| -> R {
        let sim = c.sim;
        sim.launch(s, sim::Kernel::add(c.one, c.count), 1)?;
        if let Some((h, out)) = c.out {
            sim.launch(s, sim::Kernel::copy(c.count, out), 2)?;
            c.cap.ready(h, s)?;
        }
        let t = sim.alloc_async(s, N)?;
        if let Some(input) = c.input {
            sim.launch(s, sim::Kernel::copy(input, &t), 40)?; // long read after ready
            sim.launch(s, sim::Kernel::add(&t, c.sink), 1)?;
        }
        sim.launch(s, sim::Kernel::copy(c.count, &t), 1)?;
        sim.launch(s, sim::Kernel::copy(&t, c.own), 1)?;
        Ok(sim.free_async(s, &t)?)
    };
    let mut reference = work;
    for overlapping in [false, true] {
        for g in [1, 2] {
            let steps = Steps {
                g,
                copies: if overlapping { 2 } else { 1 },
                launches: 6,
                overlapping,
                ..FIVE_LAUNCHES
            };
            steps.match_replays(&mut reference, &mut work);
        }
    }
}

#[test]
fn step_copies_zero_one_two_three_plain_and_overlapping() {
    for copies in [0usize, 1, 2, 3] {
        for overlapping in [false, true] {
            let expected = replayed_values(3, 2, copies, &mut standard, 2 + 4 + 2);
            let mut c = captured_chain(3, 2, copies, &mut standard);
            c.per_runner(2);
            let res = step_launches(&mut c, 4, overlapping);
            let needed = if overlapping { 2 } else { 1 };
            if copies < needed {
                let e = res.unwrap_err();
                assert!(e.contains("copy") || e.contains("copies"), "{e}");
                c.per_runner(4);
            } else {
                res.unwrap();
                // A second step graph from the copies left, if any.
                let more = step_launches(&mut c, 0, overlapping);
                assert_eq!(
                    more.is_ok(),
                    copies >= 2 * needed,
                    "copies {copies}: {more:?}"
                );
            }
            c.per_runner(2);
            let what = format!("copies {copies} overlapping {overlapping}");
            assert_values_then_teardown(c, &expected, what);
        }
    }
}

#[test]
fn a_program_event_record_node_before_the_ready_point() {
    // The program's own event record node beside the plan's: the cut and
    // split must still happen at the plan's ready point.
    let ev = std::cell::RefCell::new(Vec::new());
    let mut work = |c: &Ctx, s: &sim::Stream| -> R {
        let e = c.sim.create_event()?;
        c.sim.record_event_node(s, &e)?;
        ev.borrow_mut().push(e);
        standard(c, s)
    };
    let steps = Steps {
        g: 2,
        ..FIVE_LAUNCHES
    };
    steps.match_replays(&mut standard, &mut work);
}

#[test]
fn trimming_graph_memory_while_step_copies_are_held_keeps_them_valid() {
    let expected = replayed_values(3, 2, 2, &mut standard, 1 + 3 + 3 + 1);
    let mut c = captured_chain(3, 2, 2, &mut standard);
    c.sim.trim_graph_memory().unwrap(); // safe, any time
    c.per_runner(1);
    c.sim.trim_graph_memory().unwrap();
    step_launches(&mut c, 3, false).unwrap();
    c.sim.trim_graph_memory().unwrap();
    step_launches(&mut c, 3, false).unwrap();
    c.per_runner(1);
    assert_values_then_teardown(c, &expected, "trimmed between launches");
}

#[test]
fn a_cut_runner_replayed_twice_in_one_step_graph() {
    for overlapping in [false, true] {
        let copies = if overlapping { 4 } else { 2 };
        let expected = replayed_values(2, 2, copies, &mut standard, 6);
        let mut c = captured_chain(2, 2, copies, &mut standard);
        let pool = c.pool.clone();
        {
            let r = c.r();
            let mut step = r.step();
            for _ in 0..2 {
                step.replay(RunnerId(0), &pool[0]).unwrap();
                step.replay(RunnerId(1), &pool[1]).unwrap();
            }
            launch_in_turn(&mut build(step, overlapping).unwrap(), &pool, 3);
        }
        assert_values_then_teardown(c, &expected, format!("overlapping {overlapping}"));
    }
}

/// `$on.consume_mut` (`$write`) or `$on.consume` of runner 0 on `$side`:
/// every view it is handed written (scaled by one) or added into `$sink`.
macro_rules! touch_views {
    ($on:expr, $write:expr, $sim:expr, $side:expr, $sink:expr) => {
        if $write {
            $on.consume_mut(RunnerId(0), $side, |s, v| -> R {
                for x in v {
                    $sim.launch(s, sim::Kernel::scale(x, 1.0), 1)?;
                }
                Ok(())
            })
            .unwrap();
        } else {
            $on.consume(RunnerId(0), $side, |s, v| -> R {
                for x in v {
                    $sim.launch(s, sim::Kernel::add(x, $sink), 1)?;
                }
                Ok(())
            })
            .unwrap();
        }
    };
}

#[test]
fn consumers_after_a_step_launch_wait_for_the_part_after_the_cut() {
    // Runner 0's own view is written after its ready point (part 2 of
    // its copy, 30 ticks); a consumer of runner 0 after the launch, and
    // one inside the step, must wait for part 2.
    for inside in [false, true] {
        for write in [false, true] {
            let mut c = captured_chain(2, 2, 2, &mut standard);
            let (pool, sim, side, sink) = c.apart();
            {
                let r = c.r();
                let mut step = r.step();
                step.replay(RunnerId(0), &pool[0]).unwrap();
                if inside {
                    touch_views!(step, write, sim, &side, &sink);
                }
                step.replay(RunnerId(1), &pool[1]).unwrap();
                launch_in_turn(&mut step.build().unwrap(), &pool, 3);
            }
            let r = c.r();
            touch_views!(r, write, sim, &side, &sink);
            r.replay(RunnerId(0), &pool[1]).unwrap();
            r.replay(RunnerId(1), &pool[0]).unwrap();
            assert_hazard_free(&sim, format!("inside {inside} write {write}"));
            drop(sink);
            c.teardown();
        }
    }
}

#[test]
fn two_handoffs_in_the_same_order_give_right_values_in_step_graphs() {
    for order in [[0, 1], [1, 0]] {
        for overlapping in [false, true] {
            let copies = if overlapping { 2 } else { 1 };
            let (sim, r, streams, _count) = two_handoffs(move |_| order, copies);
            let mut r = r.unwrap();
            launch_three(&mut r, &streams, overlapping);
            for i in 0..3u32 {
                r.replay(RunnerId(i), &streams[(i as usize + 1) % 3])
                    .unwrap();
            }
            assert_readers_hold(&sim, r, 5.0, format!("{order:?} overlapping {overlapping}"));
        }
    }
}
