//! Attacks that found nothing, on repeatable captures
//! (`stream_capture_repeatable`): a later run that fails, panics, nests a
//! capture, differs in its ready points or changes `step_copies`, and
//! capture guards forgotten after a repeatable capture. Each fails the
//! runner (or stays sound) and leaves nothing behind.

#![allow(clippy::type_complexity)] // attack tables

use crate::support::attacks::counted_runs;
use crate::support::steps::overlap::*;
use crate::support::steps::plan_runners;
use replay_arena::backend::{Backend, Streams};
use replay_arena::sim;
use replay_arena::{Policy, RunnerId};

/// A run's work: `(sim, stream, another stream, the view, run, what the
/// runs keep)`.
type Work = dyn Fn(
    &sim::Device,
    &sim::Stream,
    &sim::Stream,
    &replay_arena::View<'_>,
    usize,
    &mut Vec<sim::Span>,
) -> replay_arena::Result<()>;

/// Work that passes the view through a temporary each run, and in run
/// `n` does `extra` (`sim, stream, another stream, view`) too.
fn on_run(
    n: usize,
    extra: impl Fn(
            &sim::Device,
            &sim::Stream,
            &sim::Stream,
            &replay_arena::View<'_>,
        ) -> replay_arena::Result<()>
        + 'static,
) -> Box<Work> {
    Box::new(move |sim, s, other, v, run, _| {
        with_temporary(sim, s, v)?;
        if run == n {
            extra(sim, s, other, v)?;
        }
        Ok(())
    })
}

/// Attack: the second (or third) run fails, panics, nests a capture, works
/// on another stream, frees what the first allocated, allocates without
/// freeing: every one fails the runner and leaves nothing behind.
#[test]
fn every_way_a_later_run_can_go_wrong_fails_the_runner_and_leaks_nothing() {
    let cases: Vec<(&str, usize, Box<Work>)> = vec![
        (
            "error on run 2",
            1,
            on_run(2, |_, _, _, _| Err(test_err("run 2"))),
        ),
        (
            "error on run 3 of 3",
            2,
            on_run(3, |_, _, _, _| Err(test_err("run 3"))),
        ),
        (
            "error on run 3, after an alloc, unbalanced",
            2,
            on_run(3, |sim, s, _, _| {
                let _t = sim.alloc_async(s, N)?;
                Err(test_err("run 3"))
            }),
        ),
        (
            "work on another stream in run 2",
            1,
            on_run(2, |sim, _, other, v| {
                Ok(sim.launch(other, sim::Kernel::fill(v, 9.0), 1)?)
            }),
        ),
        (
            "unbalanced alloc only in copy 2 of 2",
            2,
            on_run(3, |sim, s, _, _| {
                let _t = sim.alloc_async(s, N)?;
                Ok(())
            }),
        ),
        (
            "run 2 frees what run 1 allocated",
            1,
            Box::new(|sim, s, _, v, run, keep| {
                sim.launch(s, sim::Kernel::fill(v, 1.0), 1)?;
                if run == 1 {
                    keep.push(sim.alloc_async(s, N)?);
                } else {
                    sim.free_async(s, &keep[0])?;
                }
                Ok(())
            }),
        ),
        (
            "run 2 frees run 1's (balanced) temporary once more",
            1,
            Box::new(|sim, s, _, v, run, keep| {
                let t = sim.alloc_async(s, N)?;
                sim.launch(s, sim::Kernel::copy(&t, v), 1)?;
                sim.free_async(s, &t)?;
                if run == 1 {
                    keep.push(t);
                } else {
                    sim.free_async(s, &keep[0])?;
                }
                Ok(())
            }),
        ),
        (
            "run 2 allocates, run 1 did not",
            1,
            Box::new(|sim, s, _, v, run, _| {
                sim.launch(s, sim::Kernel::fill(v, 1.0), 1)?;
                if run == 2 {
                    with_temporary(sim, s, v)?;
                }
                Ok(())
            }),
        ),
    ];
    let mut findings = Vec::new();
    for (what, copies, work) in cases {
        let mut c = cap1(false);
        let (sim, s, other) = (c.sim.clone(), c.s.clone(), c.other.clone());
        let mut keep = Vec::new();
        let (res, fin) = {
            let cap = c.capturing.capture(RunnerId(0)).unwrap();
            let v = cap.take(OWN).unwrap();
            cap.step_copies(copies);
            let mut run = 0;
            let res = cap.stream_capture_repeatable(&s, |st| {
                run += 1;
                work(&sim, st, &other, &v, run, &mut keep)
            });
            (
                res.map_err(|e| e.to_string()),
                cap.finish().map_err(|e| e.to_string()),
            )
        };
        if res.is_ok() && fin.is_ok() {
            // Then the plan must be usable and sound.
            let mut r = match c.capturing.seal() {
                Ok(r) => r,
                Err(e) => panic!("{what}: {e}"),
            };
            r.replay(RunnerId(0), &c.s).unwrap();
            let copies_left = r.temporaries(RunnerId(0)).unwrap().1;
            {
                let mut step = r.step();
                if step.replay(RunnerId(0), &c.s).is_ok() {
                    let mut g = step.build().unwrap();
                    g.launch(&c.other).unwrap();
                }
            }
            r.replay(RunnerId(0), &c.other).unwrap();
            r.synchronize().unwrap();
            findings.push(format!("{what}: accepted ({copies_left} copies)"));
            drop(r);
            assert!(sim.hazards().is_empty(), "{what}: {:?}", sim.hazards());
            let p = sim.graph_memory_in_use().unwrap().unwrap();
            assert_eq!((p.used, p.reserved), (0, 0), "{what}");
            continue;
        }
        eprintln!("{what}: {res:?} / {fin:?}");
        after_failure(c, what);
    }
    eprintln!("{findings:#?}");
}

/// Attack: a panic on the second or third run (after a ready point, after
/// a temporary's allocation) unwinds through the crate: the stream stops
/// capturing, nothing leaks, the plan can be replanned.
#[test]
fn a_panic_on_a_later_run_leaves_a_consistent_capturing() {
    for (panic_on, copies, alloc_first) in
        [(2, 1, false), (2, 1, true), (3, 2, true), (3, 2, false)]
    {
        let mut c = cap1(true);
        let (sim, s) = (c.sim.clone(), c.s.clone());
        let h = c.h.unwrap();
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let cap = c.capturing.capture(RunnerId(0)).unwrap();
            let v = cap.take(OWN).unwrap();
            let dx = cap.hand_off(h).unwrap();
            cap.step_copies(copies);
            let mut run = 0;
            let _ = cap.stream_capture_repeatable(&s, |s| {
                run += 1;
                sim.launch(s, sim::Kernel::fill(&dx, 1.0), 1)?;
                cap.ready(h, s)?;
                let t = sim.alloc_async(s, N)?;
                if alloc_first && run == panic_on {
                    panic!("run {run} panics holding a temporary");
                }
                sim.launch(s, sim::Kernel::copy(&t, &v), 1)?;
                sim.free_async(s, &t)?;
                if run == panic_on {
                    panic!("run {run} panics");
                }
                Ok::<(), replay_arena::Error>(())
            });
        }));
        assert!(out.is_err());
        after_failure(
            c,
            &format!("panic on run {panic_on}, alloc_first {alloc_first}"),
        );
    }
}

/// Attack: a nested `stream_capture` (or a second repeatable capture) from
/// inside the second run only.
#[test]
fn a_nested_capture_in_a_later_run_is_refused() {
    for repeatable_inner in [false, true] {
        let mut c = cap1(false);
        let (sim, s, other) = (c.sim.clone(), c.s.clone(), c.other.clone());
        let (res, fin) = {
            let cap = c.capturing.capture(RunnerId(0)).unwrap();
            let v = cap.take(OWN).unwrap();
            let mut run = 0;
            let res = cap.stream_capture_repeatable(&s, |st| {
                run += 1;
                with_temporary(&sim, st, &v)?;
                if run == 2 {
                    let inner = |o: &sim::Stream| sim.launch(o, sim::Kernel::fill(&v, 5.0), 1);
                    let r = if repeatable_inner {
                        cap.stream_capture_repeatable(&other, inner)
                    } else {
                        cap.stream_capture(&other, inner)
                    };
                    r.map_err(|e| test_err(&e.to_string()))?;
                }
                Ok::<(), replay_arena::Error>(())
            });
            (res.map_err(|e| e.to_string()), cap.finish())
        };
        assert!(
            res.is_err() && fin.is_err(),
            "nested ({repeatable_inner}): {res:?} {fin:?}"
        );
        eprintln!("{res:?}");
        after_failure(c, "nested");
    }
}

/// Attack: a capture forgotten (`mem::forget`) after its repeatable
/// capture, before `finish`: seal must refuse the runner, and replan and
/// teardown stay sound (the forgotten guard may leak what it held).
#[test]
fn a_forgotten_capture_after_a_repeatable_capture_is_sound() {
    let mut c = cap1(false);
    let (sim, s) = (c.sim.clone(), c.s.clone());
    {
        let cap = c.capturing.capture(RunnerId(0)).unwrap();
        let v = cap.take(OWN).unwrap();
        cap.step_copies(2);
        cap.stream_capture_repeatable(&s, |st| with_temporary(&sim, st, &v))
            .unwrap();
        std::mem::forget(cap);
    }
    assert!(!sim.is_capturing(&s).unwrap());
    let capturing = match c.capturing.seal() {
        Ok(_) => panic!("sealed a runner whose capture was forgotten"),
        Err(e) => e.into_capturing(),
    };
    drop(capturing.replan());
    assert!(sim.hazards().is_empty());
    let p = sim.graph_memory_in_use().unwrap().unwrap();
    eprintln!(
        "after a forgotten capture: {p:?}, {} allocations, {} events",
        sim.live_allocations(),
        sim.live_events()
    );
}

/// Attack: `step_copies` changed from inside the work closure (more on
/// every run, then fewer): however the crate reads it, the copies it
/// reports are the runs it made less one, each holds its temporaries, and
/// teardown gives them all back.
#[test]
fn step_copies_changed_from_inside_the_closure_stay_consistent() {
    for grow in [true, false] {
        let mut c = cap1(false);
        let sim = c.sim.clone();
        let runs = counted_runs(&mut c, 3, |cap, st, v, runs| {
            if grow && runs < 6 {
                cap.step_copies(runs + 3);
            } else if !grow {
                cap.step_copies(0);
            }
            with_temporary(&sim, st, v)
        });
        let r = c.capturing.seal().unwrap();
        let (t, copies) = r.temporaries(RunnerId(0)).unwrap();
        let p = sim.graph_memory_in_use().unwrap().unwrap();
        eprintln!("grow {grow}: runs {runs}, copies {copies}, pool {p:?}");
        assert_eq!(copies + 1, runs, "grow {grow}");
        assert_eq!(p.used, runs as u64 * t.bytes, "grow {grow}");
        drop(r);
        let p = sim.graph_memory_in_use().unwrap().unwrap();
        assert_eq!((p.used, p.reserved), (0, 0));
    }
}

/// Attack: a capture guard forgotten after its repeatable capture: the
/// next runner captures on the same stream, the forgotten runner cannot
/// be captured again nor sealed, and the views it handed out are dead
/// (ops on them refused), whatever the forgotten guard still holds.
#[test]
fn a_forgotten_capture_guard_leaves_the_stream_and_the_scopes_sound() {
    let planned = plan_runners((0..2).map(|r| (RunnerId(r), [OWN])), Policy::Generations(1));
    let sim = sim::Device::new();
    let s = sim.new_stream();
    let mut capturing = planned.allocate(sim.clone()).unwrap();
    let mut kept: Option<sim::Span> = None;
    let kept_view_addr;
    {
        let cap = capturing.capture(RunnerId(0)).unwrap();
        let v = cap.take(OWN).unwrap();
        kept_view_addr = v.device_address();
        cap.step_copies(2);
        cap.stream_capture_repeatable(&s, |st| {
            let t = sim.alloc_async(st, N)?;
            sim.launch(st, sim::Kernel::fill(&t, 1.0), 1)?;
            sim.launch(st, sim::Kernel::copy(&t, &v), 1)?;
            sim.free_async(st, &t)?;
            kept = Some(t);
            Ok::<(), replay_arena::Error>(())
        })
        .unwrap();
        std::mem::forget(cap);
    }
    assert_ne!(kept_view_addr, 0);
    {
        let cap = capturing.capture(RunnerId(1)).unwrap();
        let _v = cap.take(OWN).unwrap();
        let t0 = kept.unwrap();
        // A temporary of the forgotten capture's graph, used in another runner's capture.
        let stale = cap.stream_capture(&s, |st| sim.launch(st, sim::Kernel::fill(&t0, 5.0), 1));
        assert!(
            stale.is_err(),
            "another runner's capture wrote the forgotten capture's temporary"
        );
        drop(cap);
        let cap = capturing.capture(RunnerId(1));
        assert!(cap.is_err(), "a failed runner captured again");
    }
    // The forgotten runner may be captured again (its guard's drop never
    // marked it failed): then it must be a clean capture, sound to replay.
    let again = capturing.capture(RunnerId(0)).map(|cap| {
        let v = cap.take(OWN).map_err(|e| e.to_string())?;
        assert_eq!(v.device_address(), kept_view_addr, "same fixed address");
        cap.stream_capture(&s, |st| sim.launch(st, sim::Kernel::fill(&v, 3.0), 1))
            .map_err(|e| e.to_string())?;
        cap.finish().map_err(|e| e.to_string())
    });
    eprintln!(
        "captured again: {:?}",
        again.as_ref().map_err(|e| e.to_string())
    );
    let capturing = match capturing.seal() {
        Ok(_) => panic!("sealed"),
        Err(e) => e.into_capturing(),
    };
    drop(capturing.replan());
    assert!(sim.hazards().is_empty());
}

/// Attack: a runner whose capture guard was forgotten after a repeatable
/// capture is captured again (the crate allows it) and the plan sealed:
/// its replays, step graphs and consumers are sound and exact; only what
/// the forgotten guard held stays behind after teardown.
#[test]
fn a_runner_captured_again_after_a_forgotten_guard_is_sound() {
    let planned = plan_runners((0..2).map(|r| (RunnerId(r), [OWN])), Policy::Generations(1));
    let sim = sim::Device::new();
    let (s, t, c) = (sim.new_stream(), sim.new_stream(), sim.new_stream());
    let acc = sim.alloc_f32(N).unwrap();
    let mut capturing = planned.allocate(sim.clone()).unwrap();
    {
        let cap = capturing.capture(RunnerId(0)).unwrap();
        let v = cap.take(OWN).unwrap();
        cap.step_copies(2);
        cap.stream_capture_repeatable(&s, |st| with_temporary(&sim, st, &v))
            .unwrap();
        std::mem::forget(cap);
    }
    let forgotten = sim.graph_memory_in_use().unwrap().unwrap().used;
    for r in 0..2u32 {
        let cap = capturing.capture(RunnerId(r)).unwrap();
        let v = cap.take(OWN).unwrap();
        cap.step_copies(2);
        cap.stream_capture_repeatable(&s, |st| {
            let tmp = sim.alloc_async(st, N)?;
            sim.launch(st, sim::Kernel::fill(&tmp, r as f32 + 1.0), 30)?;
            sim.launch(st, sim::Kernel::copy(&tmp, &v), 30)?;
            sim.free_async(st, &tmp)?;
            Ok::<(), replay_arena::Error>(())
        })
        .unwrap();
        cap.finish().unwrap();
    }
    let mut rp = capturing.seal().unwrap();
    for k in 0..3 {
        for r in 0..2u32 {
            rp.replay(RunnerId(r), if k % 2 == 0 { &s } else { &t })
                .unwrap();
            rp.consume(RunnerId(r), &c, |st, v| {
                sim.launch(st, sim::Kernel::add(&v[0], &acc), 40)
            })
            .unwrap();
        }
    }
    {
        let mut step = rp.step();
        for r in 0..2u32 {
            step.replay(RunnerId(r), if r == 0 { &s } else { &t })
                .unwrap();
            step.consume(RunnerId(r), &c, |st, v| {
                sim.launch(st, sim::Kernel::add(&v[0], &acc), 40)
            })
            .unwrap();
        }
        let mut g = step.build_overlapping().unwrap();
        let x = sim.new_stream();
        for k in 0..3 {
            g.launch(if k % 2 == 0 { &x } else { &c }).unwrap();
        }
    }
    rp.synchronize().unwrap();
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    assert_eq!(sim.read_f32(&acc).unwrap()[0], 6.0 * 3.0);
    drop(rp);
    let p = sim.graph_memory_in_use().unwrap().unwrap();
    assert_eq!(p.used, forgotten, "only the forgotten guard's graphs stay");
    assert_eq!(sim.live_events(), 0);
}

/// Attack: ready points that differ between runs (only run 1, only run 2,
/// only copy 2 of 2), and a later run touching the handoff after its ready
/// point: each fails the runner (RepeatDiffers or a refused view) and
/// leaves nothing behind.
#[test]
fn ready_points_that_differ_between_runs_fail_cleanly() {
    let cases: [(&str, usize, fn(usize) -> bool, bool); 4] = [
        ("ready only in run 1", 1, |run| run == 1, false),
        ("ready only in run 2", 1, |run| run == 2, false),
        ("ready missing in copy 2 of 2", 2, |run| run != 3, false),
        (
            "run 2 writes the handoff after its ready point",
            1,
            |_| true,
            true,
        ),
    ];
    for (what, copies, ready_in, touch_after) in cases {
        let mut c = cap1(true);
        let (sim, s, h) = (c.sim.clone(), c.s.clone(), c.h.unwrap());
        let (res, fin) = {
            let cap = c.capturing.capture(RunnerId(0)).unwrap();
            let v = cap.take(OWN).unwrap();
            let dx = cap.hand_off(h).unwrap();
            cap.step_copies(copies);
            let mut run = 0;
            let res = cap.stream_capture_repeatable(&s, |st| {
                run += 1;
                sim.launch(st, sim::Kernel::fill(&dx, 1.0), 1)?;
                if ready_in(run) {
                    cap.ready(h, st)?;
                }
                if touch_after && run == 2 {
                    sim.launch(st, sim::Kernel::fill(&dx, 2.0), 1)?;
                }
                with_temporary(&sim, st, &v)
            });
            (
                res.map_err(|e| e.to_string()),
                cap.finish().map_err(|e| e.to_string()),
            )
        };
        assert!(res.is_err() && fin.is_err(), "{what}: {res:?} {fin:?}");
        after_failure(c, what);
    }
}
