//! A step graph whose schedule replays a runner with staged inputs
//! (`Purpose::Input`) and, later in the step, a runner that reuses its
//! bytes (more buffer-using runners than generations): the program stages
//! the input before each launch (`consume_mut` outside the step), as
//! docs/lifecycle.md's bucket recipe says. The schedule builds; each
//! launch after a staging reads that staging's input; a launch right after
//! the step's own launch, with no staging between, is refused
//! (`ReplayError::InputNotStaged`, naming the runner that took the bytes)
//! before anything is enqueued.

use crate::support::capture_view;
use crate::support::record_and_finish;
use replay_arena::sim;
use replay_arena::{
    DType, Discovering, Domain, PlanConfig, Policy, Purpose, ReplayError, Replayable, Request,
    RunnerId, ScheduleError, StepBuilder, StepLaunchError,
};

const N: usize = 32;

fn input() -> Request {
    Request::new(Domain::Device, DType::F32, N as u64).purpose(Purpose::Input)
}

fn buf() -> Request {
    Request::new(Domain::Device, DType::F32, N as u64)
}

/// Runner 0 copies its staged input into its output, doubled; runners 1
/// and 2 (wgrad-like) fill a gradient with 1 and 2. `G = 2`: runner 2
/// reuses runner 0's bytes.
fn plan(sim: &sim::Device, pool: &sim::Stream) -> Replayable<sim::Device> {
    let mut discovery = Discovering::new(PlanConfig::new());
    {
        let mut armed = discovery.arm(RunnerId(0)).unwrap();
        armed.record(input()).unwrap();
        armed.record(buf()).unwrap();
    }
    for r in 1..3 {
        discovery.arm(RunnerId(r)).unwrap().record(buf()).unwrap();
    }
    let planned = discovery.plan(Policy::Generations(2)).unwrap();
    assert_eq!(
        planned.generation_of(RunnerId(2)),
        planned.generation_of(RunnerId(0))
    );
    let mut capturing = planned.allocate(sim.clone()).unwrap();
    {
        let cap = capturing.capture(RunnerId(0)).unwrap();
        let (i, o) = (cap.take(input()).unwrap(), cap.take(buf()).unwrap());
        record_and_finish!(cap, pool, |s| {
            sim.launch(s, sim::Kernel::copy(&i, &o), 5)?;
            sim.launch(s, sim::Kernel::scale(&o, 2.0), 5)
        });
    }
    for r in 1..3u32 {
        capture_view(&mut capturing, RunnerId(r), buf(), pool, |s, g| {
            sim.launch(s, sim::Kernel::fill(&g, r as f32), 10)
        });
    }
    capturing.seal().unwrap()
}

/// A new sim: its staging, consumer and launch streams, and [`plan`]
/// captured on the first of two pool streams.
fn planned() -> (
    sim::Device,
    [sim::Stream; 3],
    [sim::Stream; 2],
    Replayable<sim::Device>,
) {
    let sim = sim::Device::new();
    let streams = [sim.new_stream(), sim.new_stream(), sim.new_stream()];
    let pool = [sim.new_stream(), sim.new_stream()];
    let rp = plan(&sim, &pool[0]);
    (sim, streams, pool, rp)
}

fn stage(rp: &mut Replayable<sim::Device>, sim: &sim::Device, s: &sim::Stream, v: f32) {
    rp.consume_mut(RunnerId(0), s, |s, views| {
        sim.launch(s, sim::Kernel::fill(&views[0], v), 3)
    })
    .unwrap();
}

/// Schedules runner 0's replay on `on.0`, then a consumer on `on.1`
/// copying its output into `out` (20 ticks).
fn replay_and_copy_out(
    step: &mut StepBuilder<'_, sim::Device>,
    sim: &sim::Device,
    on: (&sim::Stream, &sim::Stream),
    out: &sim::HostBuffer,
) {
    step.replay(RunnerId(0), on.0).unwrap();
    step.consume(RunnerId(0), on.1, |s, v| {
        sim.launch(s, sim::Kernel::copy(&v[1], out), 20)
    })
    .unwrap();
}

fn not_staged(e: &StepLaunchError) -> bool {
    matches!(
        e,
        StepLaunchError::Schedule(ScheduleError::Replay(ReplayError::InputNotStaged {
            runner: RunnerId(0),
            by: Some(RunnerId(2)),
        }))
    )
}

/// The 3-runner repro: an input runner and two wgrad runners at `G = 2`,
/// each bucket's step kept and launched after staging its input.
#[test]
fn a_kept_step_whose_runners_reuse_its_staged_runners_bytes_builds_and_launches_after_each_staging()
{
    for overlapping in [false, true] {
        let (sim, [st, side, launch], pool, mut rp) = planned();
        let (out, grads) = (sim.alloc_f32(N).unwrap(), sim.alloc_f32(N).unwrap());
        stage(&mut rp, &sim, &st, 1.0);
        let mut kept = {
            let mut step = rp.step();
            // Read before runner 2 takes runner 0's bytes.
            replay_and_copy_out(&mut step, &sim, (&pool[0], &side), &out);
            for r in 1..3u32 {
                step.replay(RunnerId(r), &pool[r as usize % 2]).unwrap();
                step.consume(RunnerId(r), &side, |s, v| {
                    sim.launch(s, sim::Kernel::add(&v[0], &grads), 20)
                })
                .unwrap();
            }
            let built = if overlapping {
                step.build_overlapping()
            } else {
                step.build()
            };
            built
                .unwrap_or_else(|e| panic!("overlapping {overlapping}: {e}"))
                .keep()
        };
        for k in 0..5 {
            if k > 0 {
                stage(&mut rp, &sim, &st, (k + 1) as f32);
            }
            rp.launch_kept(&mut kept, &launch).unwrap();
            rp.synchronize().unwrap();
            assert_eq!(
                sim.read_f32(&out).unwrap(),
                vec![2.0 * (k + 1) as f32; N],
                "launch {k}, overlapping {overlapping}"
            );
        }
        // Launched again with no staging: it would read runner 2's bytes.
        let again = rp.launch_kept(&mut kept, &launch).unwrap_err();
        assert!(not_staged(&again), "{again:?}");
        assert!(
            again.to_string().contains("stage them with consume_mut"),
            "{again}"
        );
        // Nothing went out: the next staging and launch go on.
        stage(&mut rp, &sim, &st, 9.0);
        rp.launch_kept(&mut kept, &launch).unwrap();
        rp.synchronize().unwrap();
        assert_eq!(sim.read_f32(&out).unwrap(), vec![18.0; N]);
        assert_eq!(sim.read_f32(&grads).unwrap(), vec![6.0 * 3.0; N]);
        assert_eq!(kept.launches(), 6);
        drop(kept);
        assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    }
}

/// The same schedule as a borrowed step graph: its first launch reads the
/// input staged before the build; a second is refused (nothing can stage
/// while it borrows the plan); staging inside the step (`consume_mut` in
/// the schedule) launches every time.
#[test]
fn a_borrowed_step_graph_launches_once_per_staging_and_one_that_stages_inside_launches_on() {
    let (sim, [st, side, launch], pool, mut rp) = planned();
    let (src, out) = (sim.alloc_f32(N).unwrap(), sim.alloc_f32(N).unwrap());
    sim.launch(&st, sim::Kernel::fill(&src, 3.0), 1).unwrap();
    stage(&mut rp, &sim, &st, 1.0);
    for inside in [false, true] {
        let mut step = rp.step();
        if inside {
            // Staged inside the step: each launch writes the input first.
            step.consume_mut(RunnerId(0), &st, |s, v| {
                sim.launch(s, sim::Kernel::copy(&src, &v[0]), 3)
            })
            .unwrap();
        }
        replay_and_copy_out(&mut step, &sim, (&pool[0], &side), &out);
        for r in 1..3u32 {
            step.replay(RunnerId(r), &pool[r as usize % 2]).unwrap();
        }
        let mut graph = step.build().unwrap();
        graph.launch(&launch).unwrap();
        if inside {
            for _ in 0..3 {
                graph.launch(&launch).unwrap();
            }
            assert_eq!(graph.launches(), 4);
        } else {
            let again = graph.launch(&launch).unwrap_err();
            assert!(not_staged(&again), "{again:?}");
            assert_eq!(graph.launches(), 1);
        }
        drop(graph);
        rp.synchronize().unwrap();
        let want = if inside { 6.0 } else { 2.0 };
        assert_eq!(
            sim.read_f32(&out).unwrap(),
            vec![want; N],
            "inside {inside}"
        );
    }
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
}
