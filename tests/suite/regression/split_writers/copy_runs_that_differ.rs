//! Copy runs of a split writer whose ready points or work differ from the
//! first run's: another order, one skipped or added, readied twice, a
//! handoff written after its ready point, a fork across a cut, a ready
//! point on another stream, a free moved across a cut. Guards that each
//! is a typed refusal or hazard-free. An attack that found no hole.

use replay_arena::backend::Streams;
use replay_arena::sim;
use replay_arena::RunnerId;

use crate::support::faults::fan::{
    fan, fan_custom, refused_or_hazard_free, step_and_replays, write_all, Fan, Spec, N, W,
};
use crate::support::faults::{refused, R};

/// The writer's capture failed and nothing was sealed.
fn assert_writer_refused(f: &Fan, what: &str) {
    assert!(
        f.errors.iter().any(|e| e.contains("writer")),
        "{what}: {:?}",
        f.errors
    );
    assert!(f.r.is_none(), "{what}: sealed despite a differing copy");
}

/// A temporary of the writer's graph, filled with 2.
fn twos(w: &W, s: &sim::Stream) -> replay_arena::Result<sim::Span> {
    let t = w.sim.alloc_async(s, N)?;
    w.sim.launch(s, sim::Kernel::fill(&t, 2.0), 1)?;
    Ok(t)
}

/// The end of a writer: its own view copied from `t` in `ticks`, and `t`
/// freed.
fn own_from(w: &W, s: &sim::Stream, t: &sim::Span, ticks: u64) -> R {
    w.sim.launch(s, sim::Kernel::copy(t, w.own), ticks)?;
    w.sim.free_async(s, t)?;
    Ok(())
}

/// A temporary of the writer's graph where `temps` asks for one.
fn temporary_if(temps: bool, w: &W, s: &sim::Stream) -> replay_arena::Result<Option<sim::Span>> {
    Ok(if temps {
        Some(w.sim.alloc_async(s, N)?)
    } else {
        None
    })
}

/// Forks the write of `x1` (4s, slow) onto the side stream.
fn fork_x1_to_the_side(w: &W, s: &sim::Stream) -> R {
    let fork = w.sim.create_event()?;
    w.sim.record_event(s, &fork)?;
    w.sim.wait_event(w.side, &fork)?;
    w.sim.launch(w.side, sim::Kernel::fill(&w.xs[1], 4.0), 80)?;
    Ok(())
}

/// Joins the side stream back into `s`.
fn join_the_side(w: &W, s: &sim::Stream) -> R {
    let join = w.sim.create_event()?;
    w.sim.record_event(w.side, &join)?;
    w.sim.wait_event(s, &join)?;
    Ok(())
}

#[test]
fn copy_runs_that_mark_ready_points_otherwise_are_typed_errors() {
    let k = 3;
    let cases: Vec<(&str, Box<dyn Fn(usize) -> Vec<usize>>)> = vec![
        (
            "another order",
            Box::new(|run| {
                if run == 1 {
                    vec![0, 1, 2]
                } else {
                    vec![0, 2, 1]
                }
            }),
        ),
        (
            "one skipped",
            Box::new(|run| if run == 1 { vec![0, 1, 2] } else { vec![0, 2] }),
        ),
        (
            "one added",
            Box::new(|run| if run == 1 { vec![0, 2] } else { vec![0, 1, 2] }),
        ),
        (
            "the last skipped",
            Box::new(|run| if run == 1 { vec![0, 1, 2] } else { vec![0, 1] }),
        ),
        (
            "none in the copy",
            Box::new(|run| if run == 1 { vec![0, 1, 2] } else { vec![] }),
        ),
        (
            "all in the copy only",
            Box::new(|run| if run == 1 { vec![] } else { vec![0, 1, 2] }),
        ),
        (
            "the second copy differs",
            Box::new(|run| {
                if run <= 2 {
                    vec![0, 1, 2]
                } else {
                    vec![1, 0, 2]
                }
            }),
        ),
    ];
    for (name, order) in cases {
        let mut spec = Spec::new(k);
        spec.copies = 2;
        let f = fan(&spec, &*order);
        assert_writer_refused(&f, name);
        f.teardown();
    }
}

#[test]
fn a_copy_run_that_readies_a_handoff_twice_is_refused() {
    let mut spec = Spec::new(2);
    spec.copies = 1;
    let f = fan(&spec, &|run| {
        if run == 1 {
            vec![0, 1]
        } else {
            vec![0, 1, 1]
        }
    });
    assert!(!f.errors.is_empty(), "readied twice was accepted");
    f.teardown();
    let f = fan(&spec, &|_| vec![0, 0, 1]);
    assert!(!f.errors.is_empty(), "readied twice was accepted");
    f.teardown();
}

#[test]
fn a_copy_run_that_writes_a_handoff_after_its_ready_point() {
    refused_or_hazard_free(
        "copy writes x0 after ready(h0)",
        &Spec::new(3),
        &mut |w, s| {
            let t = twos(w, s)?;
            for i in 0..3 {
                w.sim.launch(s, sim::Kernel::copy(&t, &w.xs[i]), 5)?;
                w.cap.ready(w.hs[i], s)?;
                if w.run >= 2 && i == 0 {
                    w.sim.launch(s, sim::Kernel::fill(&w.xs[0], 9.0), 50)?;
                }
            }
            own_from(w, s, &t, 100)
        },
    );
}

#[test]
fn a_writer_that_writes_a_handoff_after_its_ready_point_in_every_run() {
    for temps in [false, true] {
        refused_or_hazard_free(
            "every run writes x0 after ready(h0)",
            &Spec::new(2),
            &mut |w, s| {
                let t = temporary_if(temps, w, s)?;
                w.sim.launch(s, sim::Kernel::fill(&w.xs[0], 1.0), 5)?;
                w.cap.ready(w.hs[0], s)?;
                w.sim.launch(s, sim::Kernel::fill(&w.xs[0], 9.0), 50)?;
                w.sim.launch(s, sim::Kernel::fill(&w.xs[1], 2.0), 5)?;
                w.cap.ready(w.hs[1], s)?;
                w.sim.launch(s, sim::Kernel::fill(w.own, 3.0), 100)?;
                if let Some(t) = &t {
                    w.sim.launch(s, sim::Kernel::fill(t, 3.0), 1)?;
                    w.sim.free_async(s, t)?;
                }
                Ok(())
            },
        );
    }
}

#[test]
fn a_copy_run_that_forks_across_a_cut() {
    // The first run keeps everything on its stream (so the crate cuts at
    // each ready point); the copy forks x1's write onto a side stream
    // across the cut at h0, joined before h1's ready point.
    refused_or_hazard_free("copy forks across a cut", &Spec::new(2), &mut |w, s| {
        let t = twos(w, s)?;
        w.sim.launch(s, sim::Kernel::copy(&t, &w.xs[0]), 5)?;
        if w.run >= 2 {
            fork_x1_to_the_side(w, s)?;
            w.cap.ready(w.hs[0], s)?;
            join_the_side(w, s)?;
        } else {
            w.cap.ready(w.hs[0], s)?;
            w.sim.launch(s, sim::Kernel::fill(&w.xs[1], 4.0), 80)?;
        }
        w.cap.ready(w.hs[1], s)?;
        own_from(w, s, &t, 10)
    });
}

#[test]
fn a_writer_that_forks_across_a_ready_point_in_every_run() {
    // Not cut there: the readers of h0 start after the whole copy.
    for temps in [false, true] {
        let spec = Spec::new(3);
        let mut writer = |w: &W, s: &sim::Stream| -> R {
            let t = temporary_if(temps, w, s)?;
            w.sim.launch(s, sim::Kernel::fill(&w.xs[0], 1.0), 5)?;
            fork_x1_to_the_side(w, s)?;
            w.cap.ready(w.hs[0], s)?;
            join_the_side(w, s)?;
            w.cap.ready(w.hs[1], s)?;
            w.sim.launch(s, sim::Kernel::fill(&w.xs[2], 5.0), 5)?;
            w.cap.ready(w.hs[2], s)?;
            if let Some(t) = &t {
                w.sim.launch(s, sim::Kernel::fill(t, 3.0), 10)?;
                w.sim.launch(s, sim::Kernel::copy(t, w.own), 10)?;
                w.sim.free_async(s, t)?;
            } else {
                w.sim.launch(s, sim::Kernel::fill(w.own, 3.0), 10)?;
            }
            Ok(())
        };
        let mut f = fan_custom(&spec, &mut writer);
        if f.r.is_none() {
            // The sim may refuse a fork in a captured closure.
            assert!(!f.errors.is_empty());
            f.teardown();
            continue;
        }
        let h = step_and_replays(&mut f);
        assert!(h.is_empty(), "temps {temps}: {h:?}");
        let r = f.r.as_ref().unwrap();
        let v = |run: u32| f.sim.read_f32(&r.views(RunnerId(run)).unwrap()[0]).unwrap()[0];
        assert_eq!(
            (v(0), v(1), v(2), v(3)),
            (3.0, 1.0, 4.0, 5.0),
            "temps {temps}"
        );
        f.teardown();
    }
}

#[test]
fn a_copy_run_that_marks_a_ready_point_on_another_stream() {
    let spec = Spec::new(2);
    let mut f = fan_custom(&spec, &mut |w, s| {
        let t = twos(w, s)?;
        write_all(w, s, &|w, s, i| {
            w.sim.launch(s, sim::Kernel::copy(&t, &w.xs[i]), 5)?;
            if w.run >= 2 && i == 1 {
                // Marked on the side stream, which is not capturing.
                w.cap.ready(w.hs[1], w.side)?;
                return Err(refused("unreachable if refused"));
            }
            Ok(())
        })?;
        own_from(w, s, &t, 1)
    });
    assert_writer_refused(&f, "ready on the side stream");
    let sim = f.sim.clone();
    assert!(!sim.is_capturing(&f.streams[0]).unwrap());
    assert!(!sim.is_capturing(&f.side).unwrap());
    f.errors.clear();
    f.teardown();
}

#[test]
fn a_temporary_freed_in_a_later_part_than_the_copy_run_ends_its_use() {
    // The copy run frees its temporary before a cut where the first run
    // freed it after: same ready points, other memory nodes per part.
    refused_or_hazard_free("free moved across a cut", &Spec::new(2), &mut |w, s| {
        let t = twos(w, s)?;
        w.sim.launch(s, sim::Kernel::copy(&t, &w.xs[0]), 5)?;
        w.sim.launch(s, sim::Kernel::copy(&t, &w.xs[1]), 5)?;
        if w.run >= 2 {
            w.sim.free_async(s, &t)?;
        }
        w.cap.ready(w.hs[0], s)?;
        w.cap.ready(w.hs[1], s)?;
        if w.run == 1 {
            w.sim.free_async(s, &t)?;
        }
        w.sim.launch(s, sim::Kernel::fill(w.own, 1.0), 5)?;
        Ok(())
    });
}
