//! Faults in captures with temporaries and step copies: a fault at each
//! call of a repeatable capture, of a build that moves step copies in, of
//! the drop of a kept step that outlived its plan, and a copy run that
//! panics. Guards that no graph memory, event or arena is left once the
//! plan is given up. An attack that found no hole.

use crate::support::steps::allocate_runners;
use std::panic::{catch_unwind, AssertUnwindSafe};

use replay_arena::backend::{Backend, GraphMemory};
use replay_arena::sim;
use replay_arena::{Discovering, PlanConfig, Policy, Replayable};

use crate::support::faults::{assert_clean, at_each_call, graph_memory, r, read0, Attack, N, Q};

/// Two runners sharing bytes whose graphs pass their value through a
/// temporary (`alloc_async` / `free_async`), captured repeatably with
/// `copies` step copies each.
fn temporaries(sim: &sim::Device, copies: usize) -> Replayable<sim::Device> {
    let mut capturing = allocate_runners(sim, (0..2).map(|i| (r(i), [Q])), Policy::Generations(1));
    let s = sim.new_stream();
    for i in 0..2u32 {
        let cap = capturing.capture(r(i)).unwrap();
        cap.step_copies(copies);
        let view = cap.take(Q).unwrap();
        cap.stream_capture_repeatable(&s, |s| {
            let t = sim.alloc_async(s, N)?;
            sim.launch(s, sim::Kernel::fill(&t, (i + 1) as f32), 5)?;
            sim.launch(s, sim::Kernel::copy(&t, &view), 20)?;
            sim.free_async(s, &t)?;
            Ok::<(), replay_arena::BackendError>(())
        })
        .unwrap();
        cap.finish().unwrap();
    }
    capturing.seal().unwrap()
}

/// After an attack on `sim` (which returned `got`): no graph holds graph
/// memory (a failed trim leaves only the pool's reservation, nothing
/// using it) and a trim gives it back; no arena, event or hazard is
/// left.
fn assert_given_back(sim: &sim::Device, attack: &Attack, got: impl std::fmt::Debug) {
    let injected = attack.log().injected;
    assert_eq!(graph_memory(sim).used, 0, "{attack}: {injected:?} {got:?}");
    sim.trim_graph_memory().unwrap();
    assert_eq!(
        graph_memory(sim),
        GraphMemory::new(0, 0),
        "{attack}: {injected:?} {got:?}"
    );
    assert_clean(sim, 0, attack);
}

/// After an attack on [`temporaries`]: runner 1 replayed on `lanes[0]`
/// and runner 0 on `lanes[1]`, runner 0 holds its own value with no
/// hazard; once the plan is dropped, no event and no arena is left. The
/// graph memory left.
fn goes_on_then_torn_down(
    sim: &sim::Device,
    mut rp: Replayable<sim::Device>,
    lanes: [&sim::Stream; 2],
    attack: &Attack,
) -> GraphMemory {
    rp.replay(r(1), lanes[0]).unwrap();
    rp.replay(r(0), lanes[1]).unwrap();
    rp.synchronize().unwrap();
    assert_eq!(read0(sim, &rp.views(r(0)).unwrap()[0]), 1.0, "{attack}");
    assert_eq!(sim.hazards(), [], "{attack}");
    drop(rp);
    assert_clean(sim, 0, attack);
    graph_memory(sim)
}

/// A fault at every call of a repeatable capture (its step copy
/// included): the capture fails typed or succeeds, and after giving the
/// plan up no graph memory, event or arena is left (a fault in the trim
/// itself leaves only the pool's reservation, which a later trim gives
/// back).
#[test]
fn a_fault_at_each_call_of_a_repeatable_capture_leaks_no_graph_memory() {
    let capture = |sim: &sim::Device| -> Result<(), String> {
        let d = Discovering::from_runners(PlanConfig::new(), [(r(0), [Q])]).unwrap();
        let mut capturing = d
            .plan(Policy::Generations(1))
            .unwrap()
            .allocate(sim.clone())
            .map_err(|e| format!("{e:?}"))?;
        let s = sim.new_stream();
        let res = {
            let cap = capturing.capture(r(0)).map_err(|e| e.to_string())?;
            cap.step_copies(2);
            let view = cap.take(Q).map_err(|e| e.to_string())?;
            let res = cap
                .stream_capture_repeatable(&s, |s| {
                    let t = sim.alloc_async(s, N)?;
                    sim.launch(s, sim::Kernel::copy(&t, &view), 20)?;
                    sim.free_async(s, &t)?;
                    Ok::<(), replay_arena::BackendError>(())
                })
                .map_err(|e| e.to_string());
            res.and_then(|()| cap.finish().map_err(|e| e.to_string()))
        };
        match res {
            Ok(()) => {
                let rp = capturing.seal().map_err(|e| e.to_string())?;
                drop(rp);
            }
            Err(_) => drop(capturing.replan()),
        }
        res
    };
    at_each_call(|attack| {
        let sim = sim::Device::new();
        let got = attack.on_ok(&sim, || capture(&sim));
        assert_given_back(&sim, attack, got);
    });
}

/// A repeatable capture whose second run (the step copy) panics: typed
/// capture failure, the stream not left capturing, nothing leaked after
/// replan.
#[test]
fn a_repeatable_capture_whose_copy_run_panics_fails_and_leaks_nothing() {
    let sim = sim::Device::new();
    let s = sim.new_stream();
    let mut capturing = allocate_runners(&sim, [(r(0), [Q])], Policy::Generations(1));
    {
        let cap = capturing.capture(r(0)).unwrap();
        let view = cap.take(Q).unwrap();
        let mut runs = 0;
        let unwound = catch_unwind(AssertUnwindSafe(|| {
            cap.stream_capture_repeatable(&s, |st| {
                runs += 1;
                let t = sim.alloc_async(st, N)?;
                sim.launch(st, sim::Kernel::copy(&t, &view), 20)?;
                if runs == 2 {
                    panic!("the framework panicked in the copy run");
                }
                sim.free_async(st, &t)?;
                Ok::<(), replay_arena::BackendError>(())
            })
        }));
        assert!(unwound.is_err());
        assert!(cap.finish().is_err());
    }
    let buf = sim.alloc_f32(4).unwrap();
    sim.launch(&s, sim::Kernel::fill(&buf, 2.0), 1).unwrap();
    assert_eq!(
        sim.read_f32(&buf).unwrap(),
        [2.0; 4],
        "the stream is not capturing"
    );
    drop(buf);
    drop(capturing.replan());
    assert_eq!(graph_memory(&sim).used, 0);
    assert_clean(&sim, 0, "after replan");
}

/// A fault at every call of a build that moves step copies in, then the
/// plan goes on and is dropped: the graph memory the copies held is given
/// back.
#[test]
fn a_fault_at_each_call_of_a_build_with_step_copies_gives_graph_memory_back() {
    at_each_call(|attack| {
        let sim = sim::Device::new();
        let (a, b) = (sim.new_stream(), sim.new_stream());
        let mut rp = temporaries(&sim, 1);
        attack.on(&sim, || {
            let mut step = rp.step();
            let _ = step.replay(r(0), &a);
            let _ = step.replay(r(1), &b);
            if let Ok(mut g) = step.build() {
                let _ = g.launch(&a);
            }
        });
        let left = goes_on_then_torn_down(&sim, rp, [&a, &b], attack);
        assert_eq!(left, GraphMemory::new(0, 0), "{attack}");
    });
}

/// An overlapping step graph of runners with temporaries (two step
/// copies each) whose build and launches meet a fault at each call: the
/// plan goes on, and teardown leaves no graph memory in use, no event
/// and no arena.
#[test]
fn an_overlapping_step_with_step_copies_under_a_fault_at_each_call_leaks_nothing() {
    let program =
        |sim: &sim::Device, rp: &mut Replayable<sim::Device>, a: &sim::Stream, b: &sim::Stream| {
            let mut step = rp.step();
            let _ = step.replay(r(0), a);
            let _ = step.replay(r(1), b);
            if let Ok(mut g) = step.build_overlapping() {
                let _ = g.launch(a);
                let _ = g.launch(b);
                let _ = g.launch(a);
            }
            let _ = sim;
        };
    at_each_call(|attack| {
        let sim = sim::Device::new();
        let (a, b) = (sim.new_stream(), sim.new_stream());
        let mut rp = temporaries(&sim, 2);
        attack.on(&sim, || program(&sim, &mut rp, &a, &b));
        let left = goes_on_then_torn_down(&sim, rp, [&b, &a], attack);
        assert_eq!(left.used, 0, "{attack}");
    });
}

/// A kept step graph with moved step copies outlives its plan; its drop
/// meets a fault at each of its calls (one fault: the host fallback
/// works). Its graph memory comes back, and no event is left.
#[test]
fn a_kept_step_outliving_its_plan_dropped_under_a_fault_gives_everything_back() {
    let setup = |sim: &sim::Device, a: &sim::Stream, b: &sim::Stream| {
        let mut rp = temporaries(sim, 1);
        let mut step = rp.step();
        step.replay(r(0), a).unwrap();
        step.replay(r(1), b).unwrap();
        let mut kept = step.build().unwrap().keep();
        rp.launch_kept(&mut kept, a).unwrap();
        rp.launch_kept(&mut kept, b).unwrap();
        drop(rp);
        kept
    };
    let n = at_each_call(|attack| {
        let sim = sim::Device::new();
        let (a, b) = (sim.new_stream(), sim.new_stream());
        let kept = setup(&sim, &a, &b);
        attack.on(&sim, || drop(kept));
        assert_given_back(&sim, attack, ());
    });
    assert!(n > 0);
}
