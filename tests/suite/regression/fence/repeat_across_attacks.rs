//! Attacks on a runner's replay again on another stream, from safe code on
//! the `sim` model: once a runner's completion was recorded at once where
//! it completes (another stream waited for it), its next replay on another
//! stream with nothing committed in between waits for that event,
//! launches, and records the event again at once on its own stream. Each
//! test interleaves such replays with what could make one wrong (a replay
//! of the runner again on its own stream, a reader, another runner of the
//! same bytes, a program wait, a trace, a step graph, a kept step, a
//! bucket released or joined, a staged input, a handoff, a capture, a
//! failed call, a panic) and checks what the sim sees (no hazard, the last
//! writer's values, no leak) and what the fence says (typed errors,
//! counters that match the calls).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;

use crate::support::faults::{
    assert_clean, assert_hazard_free, at_each_call, chain_of, copy_out, fill_plan, one_each, r,
    read0, refused, under, Q,
};
use crate::support::steps::allocate_discovered;
use crate::support::{buckets, capture_view, record_and_finish};
use replay_arena::backend::Capture;
use replay_arena::sim::{self, Call, FaultLog, Faults};
use replay_arena::{
    BackendError, BackendFailure, BucketError, BucketId, ConsumeError, DType, Discovering, Domain,
    FenceStats, Operation, PlanConfig, Policy, Purpose, ReplayError, Replayable, Request, RunnerId,
    StreamCapturing, UseKind,
};

type Plan = Replayable<sim::Device>;

/// A sim, `K` streams of it and [`fill_plan`]'s `runners` over `g`
/// generations, runner 0 replayed on the first stream, then on the
/// second (which waited for the first, so its completion is recorded at
/// once from there on): its next replay on any stream but the second is
/// one again on another stream.
fn across<const K: usize>(runners: u32, g: usize) -> (sim::Device, [sim::Stream; K], Plan) {
    let sim = sim::Device::new();
    let streams = crate::support::streams::<K>(&sim);
    let mut rp = fill_plan(&sim, runners, g);
    rp.replay(r(0), &streams[0]).unwrap();
    rp.replay(r(0), &streams[1]).unwrap();
    (sim, streams, rp)
}

/// How many calls of `call` the sim saw since its faults were last set.
fn seen(log: &FaultLog, call: Call) -> u64 {
    log.per_call.get(&call).copied().unwrap_or(0)
}

/// The fence counted, since `before`, the launches, event waits and event
/// records the sim saw since its faults were last set (none failed).
#[track_caller]
fn counted_as_seen(sim: &sim::Device, rp: &Plan, before: FenceStats) {
    let (now, log) = (rp.fence_stats(), sim.fault_log());
    assert_eq!(
        now.replays - before.replays,
        seen(&log, Call::Launch),
        "{now}"
    );
    assert_eq!(
        now.waits - before.waits,
        seen(&log, Call::WaitEvent),
        "{now}"
    );
    assert_eq!(
        now.event_records - before.event_records,
        seen(&log, Call::RecordEvent),
        "{now}"
    );
}

/// `runner`'s view holds `value` once all is done, and no hazard.
#[track_caller]
fn holds(sim: &sim::Device, rp: &Plan, runner: u32, value: f32) {
    rp.synchronize().unwrap();
    assert_eq!(
        sim.read_f32(&rp.views(r(runner)).unwrap()[0]).unwrap(),
        vec![value; 64]
    );
    assert_hazard_free(sim);
}

/// Replays `runner` on each stream of `order` (indices into `streams`).
fn replay_over(rp: &mut Plan, runner: u32, streams: &[sim::Stream], order: &[usize]) {
    for &s in order {
        rp.replay(r(runner), &streams[s]).unwrap();
    }
}

/// A replay that failed at a backend call, named as one.
#[track_caller]
fn failed_replay(res: Result<(), ReplayError>, runner: u32) {
    assert!(
        matches!(
            &res,
            Err(ReplayError::Backend(BackendFailure {
                op: Operation::Replay(id),
                ..
            })) if *id == r(runner)
        ),
        "{res:?}"
    );
}

#[track_caller]
fn capturing_err(res: Result<(), ReplayError>, runner: u32) {
    assert_eq!(
        res,
        Err(ReplayError::StreamCapturing(StreamCapturing {
            op: Operation::Replay(r(runner))
        }))
    );
}

/// One replay again on another stream is one wait, one launch and one
/// record; over a round of three streams with repeats on a stream between,
/// the counters are the calls the sim saw, and the values the runner's.
#[test]
fn replays_across_streams_count_the_calls_the_device_saw() {
    let (sim, s, mut rp) = across::<3>(1, 1);
    let before = rp.fence_stats();
    sim.inject(Faults::none());
    rp.replay(r(0), &s[2]).unwrap();
    let log = sim.fault_log();
    let calls = [Call::WaitEvent, Call::Launch, Call::RecordEvent].map(|c| seen(&log, c));
    assert_eq!(calls, [1, 1, 1], "{log:?}");
    counted_as_seen(&sim, &rp, before);
    let before = rp.fence_stats();
    sim.inject(Faults::none());
    replay_over(&mut rp, 0, &s, &[0, 1, 2, 2, 2, 0, 1, 1, 2, 0, 2, 1]);
    counted_as_seen(&sim, &rp, before);
    assert_eq!(rp.fence_stats().replays, 15);
    holds(&sim, &rp, 0, 1.0);
    drop(rp);
    assert_clean(&sim, 0, "teardown");
}

/// A replay again on the runner's own stream launches and records
/// nothing: the next replay elsewhere must wait for it, not for the
/// replay whose completion the event holds.
#[test]
fn a_repeat_on_its_stream_is_waited_for_by_the_next_stream() {
    let (sim, s, mut rp) = across::<3>(1, 1);
    for order in [[2, 2, 0], [0, 0, 1], [1, 1, 1], [2, 2, 2], [0, 1, 1]] {
        replay_over(&mut rp, 0, &s, &order);
        assert_hazard_free(&sim);
    }
    holds(&sim, &rp, 0, 1.0);
}

/// A stream that waited for an older replay of the runner (a program wait,
/// a replay of another runner of the same bytes) waits again for a newer
/// one.
#[test]
fn a_stream_that_waited_for_an_older_replay_waits_for_the_newer() {
    let (sim, s, mut rp) = across::<3>(2, 1);
    rp.wait_for(r(0), &s[2]).unwrap();
    replay_over(&mut rp, 0, &s, &[1, 2]); // again on its stream, then on the waiter
    rp.wait_for(r(0), &s[0]).unwrap();
    replay_over(&mut rp, 0, &s, &[2, 1, 0]);
    rp.replay(r(1), &s[2]).unwrap(); // waits for runner 0 on `s[0]`
    replay_over(&mut rp, 0, &s, &[1, 0]);
    rp.replay(r(1), &s[2]).unwrap(); // waits again, for the newer one
    holds(&sim, &rp, 1, 2.0);
}

/// A reader on a fourth stream between replays over three: every replay
/// waits for the reader before it, every reader for the replay before it.
#[test]
fn readers_between_replays_across_streams_are_waited_for() {
    let (sim, s, mut rp) = across::<4>(1, 1);
    let sink = sim.alloc_f32(64).unwrap();
    for k in 0..9 {
        rp.replay(r(0), &s[k % 3]).unwrap();
        rp.replay(r(0), &s[(k + 1) % 3]).unwrap();
        if k % 2 == 0 {
            copy_out(&mut rp, &sim, r(0), &s[3], &sink).unwrap();
        }
    }
    holds(&sim, &rp, 0, 1.0);
    assert_eq!(sim.read_f32(&sink).unwrap(), vec![1.0; 64]);
    assert_eq!(rp.fence_stats().consumers, 5);
}

/// Two runners on the same bytes (G = 1) and a writing consumer: each
/// runner's replays across streams wait for the other's, and the last
/// writer's values stay.
#[test]
fn another_runner_of_the_same_bytes_between_replays_across_streams() {
    let (sim, s, mut rp) = across::<3>(2, 1);
    let sink = sim.alloc_f32(64).unwrap();
    for round in 0..3 {
        replay_over(&mut rp, 0, &s, &[2, 0, 1]);
        rp.replay(r(1), &s[round % 3]).unwrap();
        replay_over(&mut rp, 1, &s, &[(round + 1) % 3, (round + 2) % 3]);
        copy_out(&mut rp, &sim, r(1), &s[round % 3], &sink).unwrap();
        rp.synchronize().unwrap();
        assert_eq!(read0(&sim, &sink), 2.0, "round {round}");
        rp.replay(r(0), &s[2]).unwrap();
        rp.replay(r(0), &s[0]).unwrap();
        rp.consume_mut(r(0), &s[1], |st, v| {
            sim.launch(st, sim::Kernel::fill(&v[0], 7.0), 40)
        })
        .unwrap();
        replay_over(&mut rp, 0, &s, &[2, 0]);
    }
    holds(&sim, &rp, 0, 1.0);
}

/// `synchronize` between replays across streams: the next replays still
/// order after each other.
#[test]
fn replays_across_streams_after_a_synchronize_stay_ordered() {
    let (sim, s, mut rp) = across::<3>(2, 1);
    for order in [[2, 0], [1, 2], [1, 0]] {
        rp.synchronize().unwrap();
        replay_over(&mut rp, 0, &s, &order);
        assert_hazard_free(&sim);
    }
    rp.synchronize().unwrap();
    rp.replay(r(1), &s[1]).unwrap();
    holds(&sim, &rp, 1, 2.0);
}

/// A trace started between replays across streams sees each one, each
/// waiting (not skipped) for the one before it, and starting after it
/// ended.
#[test]
fn a_trace_started_between_replays_across_streams_sees_every_wait() {
    let (sim, s, mut rp) = across::<3>(1, 1);
    rp.start_trace().unwrap();
    replay_over(&mut rp, 0, &s, &[2, 0, 1, 0, 2]);
    let trace = rp.finish_trace().unwrap();
    let uses = trace.uses();
    assert_eq!(uses.len(), 5, "{uses:?}");
    for (k, u) in uses.iter().enumerate() {
        assert_eq!(u.kind, UseKind::Replay { runner: r(0) });
        let from = k.checked_sub(1);
        assert_eq!(u.waits.len(), 1, "use {k}: {:?}", u.waits);
        assert_eq!((u.waits[0].from, u.waits[0].skipped), (from, false), "{k}");
        if let Some(p) = from {
            assert!(u.start_us >= uses[p].end_us, "use {k} starts early");
        }
    }
    rp.replay(r(0), &s[1]).unwrap();
    holds(&sim, &rp, 0, 1.0);
}

/// A step graph replaying another runner of the same bytes, launched on a
/// third stream between replays across streams.
#[test]
fn a_step_graph_launched_between_replays_across_streams_is_waited_for() {
    let (sim, s, mut rp) = across::<3>(2, 1);
    for k in 0..3 {
        {
            let mut step = rp.step();
            step.replay(r(1), &s[2]).unwrap();
            let mut g = step.build().unwrap();
            g.launch(&s[2]).unwrap();
            g.launch(&s[k % 2]).unwrap();
        }
        replay_over(&mut rp, 0, &s, &[2, 0, 1]);
        holds(&sim, &rp, 0, 1.0);
    }
    assert_eq!(rp.fence_stats().step_launches, 6);
}

/// A kept step that reads runner 0 into a sink, launched on streams of
/// its own between replays across streams.
#[test]
fn a_kept_reader_between_replays_across_streams_is_waited_for() {
    let (sim, s, mut rp) = across::<4>(1, 1);
    let sink = sim.alloc_f32(64).unwrap();
    let mut kept = {
        let mut step = rp.step();
        step.consume(r(0), &s[3], |st, v| {
            sim.launch(st, sim::Kernel::copy(&v[0], &sink), 30)
        })
        .unwrap();
        step.build().unwrap().keep()
    };
    for k in 0..4 {
        rp.launch_kept(&mut kept, &s[3]).unwrap();
        replay_over(&mut rp, 0, &s, &[k % 3, (k + 1) % 3]);
        rp.launch_kept(&mut kept, &s[(k + 2) % 3]).unwrap();
        replay_over(&mut rp, 0, &s, &[k % 3, (k + 1) % 3, (k + 1) % 3]);
    }
    holds(&sim, &rp, 0, 1.0);
    assert_eq!(sim.read_f32(&sink).unwrap(), vec![1.0; 64]);
    assert_eq!(rp.fence_stats().step_launches, 8);
    drop(kept);
    drop(rp);
    assert_clean(&sim, 1, "teardown");
}

/// A step graph that reads runner 0, launched and forgotten
/// (`mem::forget`): the fence already orders the replays after it.
#[test]
fn a_forgotten_step_graph_between_replays_across_streams_is_waited_for() {
    let (sim, s, mut rp) = across::<3>(1, 1);
    let sink = sim.alloc_f32(64).unwrap();
    {
        let mut step = rp.step();
        step.consume(r(0), &s[2], |st, v| {
            sim.launch(st, sim::Kernel::copy(&v[0], &sink), 60)
        })
        .unwrap();
        let mut g = step.build().unwrap();
        g.launch(&s[2]).unwrap();
        std::mem::forget(g);
    }
    replay_over(&mut rp, 0, &s, &[0, 1, 2, 0]);
    holds(&sim, &rp, 0, 1.0);
    assert_eq!(sim.read_f32(&sink).unwrap(), vec![1.0; 64]);
}

/// A consumer whose closure enqueues a read and panics: its read is
/// waited for by the replays across streams after it.
#[test]
fn a_panicking_reader_between_replays_across_streams_is_waited_for() {
    let (sim, s, mut rp) = across::<3>(1, 1);
    let sink = sim.alloc_f32(64).unwrap();
    for k in 0..3 {
        let unwound = catch_unwind(AssertUnwindSafe(|| {
            let _ = rp.consume(r(0), &s[2], |st, v| {
                sim.launch(st, sim::Kernel::copy(&v[0], &sink), 80)?;
                panic!("the program's closure panics");
                #[allow(unreachable_code)]
                Ok::<(), BackendError>(())
            });
        }));
        assert!(unwound.is_err());
        replay_over(&mut rp, 0, &s, &[k % 2, (k + 1) % 2, 2, 0]);
        assert_hazard_free(&sim);
    }
    holds(&sim, &rp, 0, 1.0);
    assert_eq!(rp.fence_stats().consumers, 0);
}

/// A reader whose closure fails after enqueuing its read, then replays
/// across streams.
#[test]
fn a_failed_reader_between_replays_across_streams_is_waited_for() {
    let (sim, s, mut rp) = across::<3>(1, 1);
    let sink = sim.alloc_f32(64).unwrap();
    let failed = rp.consume(r(0), &s[2], |st, v| {
        sim.launch(st, sim::Kernel::copy(&v[0], &sink), 80)?;
        Err(refused("after enqueuing"))
    });
    assert!(matches!(failed, Err(ConsumeError::Work(_))), "{failed:?}");
    replay_over(&mut rp, 0, &s, &[0, 1, 0]);
    holds(&sim, &rp, 0, 1.0);
}

/// A staged input the runner scales in place: every replay across streams
/// reads what the one before it wrote, so the value doubles each time.
#[test]
fn a_staged_input_scaled_in_place_across_streams_doubles_each_replay() {
    let input = Request::new(Domain::Device, DType::F32, 64).purpose(Purpose::Input);
    let mut d = Discovering::new(PlanConfig::new());
    d.arm(r(0)).unwrap().record(input).unwrap();
    let sim = sim::Device::new();
    let s = crate::support::streams::<3>(&sim);
    let mut cap = allocate_discovered(&sim, d, Policy::Generations(1));
    capture_view(&mut cap, r(0), input, &s[0], |st, v| {
        sim.launch(st, sim::Kernel::scale(v, 2.0), 10)
    });
    let mut rp = cap.seal().unwrap();
    rp.consume_mut(r(0), &s[2], |st, v| {
        sim.launch(st, sim::Kernel::fill(&v[0], 1.0), 30)
    })
    .unwrap();
    let order = [0, 1, 0, 2, 2, 1, 0, 1, 2, 0];
    replay_over(&mut rp, 0, &s, &order);
    holds(&sim, &rp, 0, 1024.0);
    rp.consume_mut(r(0), &s[1], |st, v| {
        sim.launch(st, sim::Kernel::fill(&v[0], 3.0), 30)
    })
    .unwrap();
    replay_over(&mut rp, 0, &s, &[2, 0, 1]);
    holds(&sim, &rp, 0, 24.0);
}

/// A reader of a handoff replayed again on another stream has read the
/// write already, as on its own stream; its writer, replayed across
/// streams, is read after its latest write.
#[test]
fn a_handoff_reader_replayed_again_on_another_stream_already_read() {
    let own = Request::new(Domain::Device, DType::F32, 64);
    let (d, handoffs) = chain_of(2, own, own);
    let h = handoffs[0];
    let sim = sim::Device::new();
    let s = crate::support::streams::<3>(&sim);
    let mut cap = allocate_discovered(&sim, d, Policy::Generations(2));
    {
        let c = cap.capture(r(0)).unwrap();
        let (w, x) = (c.take(own).unwrap(), c.hand_off(h).unwrap());
        record_and_finish!(c, &s[0], |st| {
            sim.launch(st, sim::Kernel::fill(&w, 7.0), 5)?;
            sim.launch(st, sim::Kernel::fill(&x, 3.0), 40)
        });
    }
    {
        let c = cap.capture(r(1)).unwrap();
        let (o, y) = (c.take(own).unwrap(), c.receive(h).unwrap());
        record_and_finish!(c, &s[0], |st| sim.launch(st, sim::Kernel::copy(&y, &o), 40));
    }
    let mut rp = cap.seal().unwrap();
    for k in 0..3 {
        replay_over(&mut rp, 0, &s, &[k % 3, (k + 1) % 3, (k + 2) % 3]);
        rp.replay(r(1), &s[k % 3]).unwrap();
        rp.wait_for(r(1), &s[(k + 1) % 3]).unwrap();
        for other in [(k + 2) % 3, (k + 1) % 3, k % 3] {
            assert!(
                matches!(
                    rp.replay(r(1), &s[other]),
                    Err(ReplayError::HandoffAlreadyRead {
                        reader: RunnerId(1),
                        writer: RunnerId(0),
                        ..
                    })
                ),
                "a reader again on stream {other} reads its write again"
            );
        }
    }
    holds(&sim, &rp, 1, 3.0);
    assert_eq!(rp.fence_stats().replays, 12);
}

/// A fault at the wait of a replay again on another stream: typed, nothing
/// counted, and the same replay then goes through, ordered.
#[test]
fn a_failed_wait_of_a_replay_across_streams_changes_nothing() {
    let (sim, s, mut rp) = across::<3>(2, 1);
    let stats = rp.fence_stats();
    let res = under(&sim, Faults::nth(Call::WaitEvent, 0), || {
        rp.replay(r(0), &s[2])
    });
    failed_replay(res, 0);
    assert_eq!(rp.fence_stats(), stats);
    replay_over(&mut rp, 0, &s, &[2, 0]);
    rp.replay(r(1), &s[1]).unwrap();
    holds(&sim, &rp, 1, 2.0);
}

/// A fault at the launch of a replay again on another stream (its wait
/// went out): typed, nothing counted; a replay on the runner's own stream
/// and one on a third are still ordered.
#[test]
fn a_failed_launch_of_a_replay_across_streams_changes_nothing() {
    let (sim, s, mut rp) = across::<3>(2, 1);
    let stats = rp.fence_stats();
    let res = under(&sim, Faults::nth(Call::Launch, 0), || {
        rp.replay(r(0), &s[2])
    });
    failed_replay(res, 0);
    assert_eq!(rp.fence_stats(), stats);
    replay_over(&mut rp, 0, &s, &[1, 0, 2]);
    rp.replay(r(1), &s[1]).unwrap();
    holds(&sim, &rp, 1, 2.0);
}

/// A fault at the record after the launch of a replay again on another
/// stream: the replay ran (counted, never named `StreamCapturing`), its
/// completion pends on its stream, and whatever comes next there or on
/// another stream (a replay again, a reader, another runner of the bytes)
/// is ordered after it.
#[test]
fn a_failed_record_of_a_replay_across_streams_leaves_it_pending() {
    for next in 0..6 {
        let (sim, s, mut rp) = across::<3>(2, 1);
        let sink = sim.alloc_f32(64).unwrap();
        let stats = rp.fence_stats();
        let res = under(&sim, Faults::nth(Call::RecordEvent, 0), || {
            rp.replay(r(0), &s[2])
        });
        failed_replay(res, 0);
        assert_eq!(rp.fence_stats().replays, stats.replays + 1, "it ran");
        match next {
            0 => replay_over(&mut rp, 0, &s, &[0, 1]),
            1 => replay_over(&mut rp, 0, &s, &[2, 1, 0]),
            2 => copy_out(&mut rp, &sim, r(0), &s[0], &sink).unwrap(),
            3 => rp.replay(r(1), &s[1]).unwrap(),
            4 => {
                rp.wait_for(r(0), &s[0]).unwrap();
                replay_over(&mut rp, 0, &s, &[2, 0]);
                copy_out(&mut rp, &sim, r(0), &s[1], &sink).unwrap();
            }
            _ => {
                // Another fault at the next replay across, and again.
                for k in 0..2 {
                    let res = under(&sim, Faults::nth(Call::RecordEvent, 0), || {
                        rp.replay(r(0), &s[k])
                    });
                    assert!(res.is_ok() || matches!(res, Err(ReplayError::Backend(_))));
                }
                rp.replay(r(1), &s[2]).unwrap();
            }
        }
        rp.synchronize().unwrap();
        assert_hazard_free(&sim);
        drop(rp);
        assert_clean(&sim, 1, format!("next {next}"));
    }
}

/// A fault at each backend call of a schedule of replays across streams,
/// readers, a program wait and another runner of the same bytes; the
/// program goes on after the failure with the same schedule and no fault:
/// no hazard, counters that are the calls made, and a clean teardown.
#[test]
fn a_fault_anywhere_among_replays_across_streams_loses_no_wait() {
    #[derive(Clone, Copy, Debug)]
    enum Op {
        Replay(u32, usize),
        Read(u32, usize),
        Wait(u32, usize),
    }
    use Op::*;
    let ops = [
        Replay(0, 0),
        Replay(0, 1),
        Replay(0, 2),
        Replay(0, 0),
        Read(0, 3),
        Replay(0, 1),
        Replay(0, 2),
        Replay(0, 2),
        Replay(0, 0),
        Wait(0, 3),
        Replay(0, 1),
        Replay(1, 2),
        Replay(0, 0),
        Replay(0, 3),
    ];
    let attacked = at_each_call(|attack| {
        let sim = sim::Device::new();
        let s = crate::support::streams::<4>(&sim);
        let mut rp = fill_plan(&sim, 2, 1);
        let sink = sim.alloc_f32(64).unwrap();
        let run = |rp: &mut Plan, op: Op| -> bool {
            match op {
                Replay(i, k) => rp.replay(r(i), &s[k]).is_ok(),
                Read(i, k) => copy_out(rp, &sim, r(i), &s[k], &sink).is_ok(),
                Wait(i, k) => rp.wait_for(r(i), &s[k]).is_ok(),
            }
        };
        let mut typed = Vec::new();
        attack.on(&sim, || {
            for op in ops {
                let res = match op {
                    Replay(i, k) => rp.replay(r(i), &s[k]),
                    _ => {
                        let ok = run(&mut rp, op);
                        assert!(ok || attack.fault().is_some(), "{attack}: {op:?}");
                        Ok(())
                    }
                };
                if let Err(e) = res {
                    typed.push(e);
                }
            }
        });
        for e in &typed {
            assert!(
                matches!(e, ReplayError::Backend(_)),
                "{attack}: a failed replay is a backend failure: {e:?}"
            );
        }
        rp.synchronize().unwrap();
        assert_hazard_free(&sim);
        let faulted = attack.log();
        let launched = seen(&faulted, Call::Launch)
            - faulted
                .injected
                .iter()
                .filter(|(_, call, _)| *call == Call::Launch)
                .count() as u64;
        assert_eq!(rp.fence_stats().replays, launched, "{attack}");
        let before = rp.fence_stats();
        sim.inject(Faults::none());
        for op in ops {
            assert!(run(&mut rp, op), "{attack}: {op:?} failed with no fault");
        }
        counted_as_seen(&sim, &rp, before);
        rp.synchronize().unwrap();
        assert_hazard_free(&sim);
        assert_eq!(
            sim.read_f32(&rp.views(r(0)).unwrap()[0]).unwrap(),
            vec![1.0; 64],
            "{attack}"
        );
        drop(rp);
        assert_clean(&sim, 1, attack);
    });
    assert!(attacked > 20, "{attacked} calls");
}

/// A replay again on another stream that the program captures (its own
/// capture on this thread, another plan's capture of the crate) is refused
/// by its launch, named `StreamCapturing`, counts nothing and leaves
/// nothing in that capture; after it the runner's replays go on, ordered.
#[test]
fn a_replay_across_onto_a_captured_stream_is_stream_capturing() {
    let (sim, s, mut rp) = across::<3>(1, 1);
    let stats = rp.fence_stats();
    sim.begin_capture(&s[2]).unwrap();
    capturing_err(rp.replay(r(0), &s[2]), 0);
    capturing_err(rp.replay(r(0), &s[2]), 0);
    assert_eq!(rp.fence_stats(), stats, "nothing counted");
    // SAFETY: the capture this test began on `s[2]`, on this thread.
    unsafe { sim.abort_capture(&s[2]) };
    let mut other = allocate_discovered(&sim, one_each(1, Q), Policy::Generations(1));
    capture_view(&mut other, r(0), Q, &s[0], |st, v| {
        capturing_err(rp.replay(r(0), st), 0);
        sim.launch(st, sim::Kernel::fill(v, 9.0), 3)
    });
    let other = other.seal().unwrap();
    assert_eq!(other.graph(r(0)).unwrap().ops().len(), 1, "only its op");
    assert_eq!(rp.fence_stats(), stats);
    replay_over(&mut rp, 0, &s, &[2, 0, 1]);
    holds(&sim, &rp, 0, 1.0);
}

/// Another thread's capture of the crate on the stream the runner's
/// latest replay completes on (its completion recorded there already):
/// a replay again on another stream needs no call there, goes on while
/// the capture is open, and puts nothing into it. One on the captured
/// stream is refused.
#[test]
fn a_capture_of_another_thread_where_the_runner_completes() {
    let (sim, s, mut rp) = across::<3>(1, 1);
    let (inside_tx, inside_rx) = mpsc::channel::<()>();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    std::thread::scope(|scope| {
        let (sim, captured) = (&sim, &s[1]);
        let capture = scope.spawn(move || {
            let mut other = allocate_discovered(sim, one_each(1, Q), Policy::Generations(1));
            capture_view(&mut other, r(0), Q, captured, |st, v| {
                inside_tx.send(()).unwrap();
                done_rx.recv().unwrap();
                sim.launch(st, sim::Kernel::fill(v, 9.0), 3)
            });
            other.seal().unwrap().graph(r(0)).unwrap().ops().len()
        });
        inside_rx.recv().unwrap();
        let stats = rp.fence_stats();
        capturing_err(rp.replay(r(0), &s[1]), 0);
        assert_eq!(rp.fence_stats(), stats);
        let across = rp.replay(r(0), &s[2]);
        let again = rp.replay(r(0), &s[0]);
        done_tx.send(()).unwrap();
        assert_eq!(capture.join().unwrap(), 1, "only the capture's own op");
        assert_eq!((across, again), (Ok(()), Ok(())));
    });
    replay_over(&mut rp, 0, &s, &[1, 2]);
    holds(&sim, &rp, 0, 1.0);
}

/// A bucket's runner replayed across streams, then another bucket joined,
/// released, and the first bucket released after a replay whose record
/// failed: a release never lets go of a graph in flight, and the replays
/// on the joined bucket's bytes are ordered after it.
#[test]
fn buckets_joined_and_released_between_replays_across_streams() {
    buckets::TEMPORARIES.with(|t| t.set(false));
    let mut f = buckets::fixture();
    let sink = f.sim.alloc_f32(64).unwrap();
    f.run(r(0), 3.0, &sink).unwrap();
    let streams = [f.pool.clone(), f.side.clone(), f.stage.clone()];
    replay_over(&mut f.r, 0, &streams, &[1, 2, 0, 1]);
    f.r.consume(r(0), &f.side, |st, v| {
        f.sim.launch(st, sim::Kernel::copy(&v[1], &sink), 2)
    })
    .unwrap();
    f.r.synchronize().unwrap();
    assert_eq!(f.sim.read_f32(&sink).unwrap(), vec![6.0; 64]);
    let joined = f.join(r(2), 128).unwrap();
    let sink2 = f.sim.alloc_f32(128).unwrap();
    f.run(r(2), 5.0, &sink2).unwrap();
    f.r.synchronize().unwrap();
    assert_eq!(f.sim.read_f32(&sink2).unwrap(), vec![10.0; 128]);
    f.r.release_bucket(joined.bucket).unwrap();
    f.run(r(0), 4.0, &sink).unwrap();
    replay_over(&mut f.r, 0, &streams, &[1, 0]);
    f.r.synchronize().unwrap();
    // A replay again elsewhere whose record fails: its launch is in flight
    // with no event recorded after it.
    let res = under(&f.sim, Faults::nth(Call::RecordEvent, 0), || {
        f.r.replay(r(0), &streams[2])
    });
    failed_replay(res, 0);
    assert_eq!(
        f.r.release_bucket(BucketId(0)),
        Err(BucketError::InFlight {
            bucket: BucketId(0)
        })
    );
    f.r.synchronize().unwrap();
    assert_hazard_free(&f.sim);
    // Waited for on the host: idle now, released.
    f.r.release_bucket(BucketId(0)).unwrap();
    assert!(matches!(
        f.r.replay(r(0), &streams[1]),
        Err(ReplayError::Released { .. })
    ));
    let fresh = f.join(r(3), 32).unwrap();
    assert_eq!(fresh.released, []);
    let sink3 = f.sim.alloc_f32(32).unwrap();
    f.run(r(3), 2.0, &sink3).unwrap();
    replay_over(&mut f.r, 3, &streams, &[1, 2, 0]);
    f.r.synchronize().unwrap();
    assert_eq!(f.sim.read_f32(&sink3).unwrap(), vec![4.0; 32]);
    assert_hazard_free(&f.sim);
}

/// A replay across streams, raced by a program capture that another
/// thread begins on its stream at any moment: a replay that launched
/// (counted) is never named `StreamCapturing`, whether its wait, its
/// launch or its record met the capture.
#[test]
fn a_replay_across_that_launched_is_never_named_stream_capturing() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
    use std::sync::Barrier;
    let sim = sim::Device::new();
    let rounds = 4_000;
    let delay = AtomicU64::new(60);
    let stop = AtomicBool::new(false);
    let setup: Vec<[sim::Stream; 2]> = (0..rounds)
        .map(|_| crate::support::streams::<2>(&sim))
        .collect();
    let raced: Vec<sim::Stream> = (0..rounds).map(|_| sim.new_stream()).collect();
    let barrier = Barrier::new(2);
    let mut wrong = Vec::new();
    let mut outcomes = std::collections::BTreeMap::<String, u32>::new();
    std::thread::scope(|scope| {
        let (sim, raced, barrier, delay, stop) = (&sim, &raced, &barrier, &delay, &stop);
        scope.spawn(move || {
            for (k, s) in raced.iter().enumerate() {
                barrier.wait();
                let jitter = (k as u64 * 7919) % 16;
                for _ in 0..delay.load(Relaxed) + jitter {
                    std::hint::spin_loop();
                }
                sim.begin_capture(s).unwrap(); // the program's own, never ended
                barrier.wait();
                if stop.load(Relaxed) {
                    return;
                }
            }
        });
        for k in 0..rounds {
            let mut rp = fill_plan(&sim, 1, 1);
            let set =
                rp.replay(r(0), &setup[k][0]).is_ok() && rp.replay(r(0), &setup[k][1]).is_ok();
            barrier.wait();
            let before = rp.fence_stats().replays;
            let res = rp.replay(r(0), &raced[k]);
            let counted = rp.fence_stats().replays - before;
            let name = match &res {
                Ok(()) => "ok".to_string(),
                Err(ReplayError::StreamCapturing(_)) => format!("capturing, counted {counted}"),
                Err(e) => format!("{e}"),
            };
            *outcomes.entry(format!("{set} {name}")).or_default() += 1;
            if matches!(res, Err(ReplayError::StreamCapturing(_))) && counted != 0 {
                wrong.push((k, res.clone()));
            }
            let d = delay.load(Relaxed);
            let d = match (&res, counted) {
                (Ok(()), _) => d.saturating_sub(3),
                (_, 0) => d + 3,
                _ => d,
            };
            delay.store(d, Relaxed);
            std::mem::forget(rp); // its teardown cannot record on `raced[k]`
            let enough = !wrong.is_empty();
            stop.store(enough, Relaxed);
            barrier.wait();
            if enough {
                break;
            }
        }
    });
    assert_eq!(
        wrong,
        [],
        "replays that launched (counted) but returned StreamCapturing: {outcomes:?}"
    );
}
