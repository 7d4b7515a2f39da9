//! A hostile pass over the transaction rule (`docs/safety.md`, "Every
//! operation is a transaction"): a fault at each backend call of each
//! public operation on the `sim` model, on one to three streams, with
//! forgotten guards and failing or panicking closures. After each one:
//! no hazard, the values read back are right, the program carries on,
//! teardown leaks nothing, the counters count only work that ran, and
//! every error is typed.
//!
//! A test whose doc comment starts with "HOLE:" would expose a behaviour
//! that breaks the documented rule and fail on purpose; every test here
//! documents an attack the crate defended at the commit it was written
//! against (none found a hole).

use std::panic::{catch_unwind, AssertUnwindSafe};

use replay_arena::sim::{self, Call, Faults};
use replay_arena::{Backend, GraphMemory, Streams};
use replay_arena::{
    BackendFailure, ConsumeError, DType, Discovering, Domain, HandoffId, Operation, PlanConfig,
    Policy, Purpose, ReplayError, Replayable, Request, RunnerId, ScheduleError, StepLaunchError,
    WaitError,
};

const N: usize = 64;
const Q: Request = Request::new(Domain::Device, DType::F32, N as u64);

fn r(i: u32) -> RunnerId {
    RunnerId(i)
}

/// `runners` runners with one `Q` each under `Policy::Generations(g)`;
/// runner `i`'s graph fills its view with `i + 1` for 20 ticks.
fn fill_plan(sim: &sim::Device, runners: u32, g: usize) -> Replayable<sim::Device> {
    let d = Discovering::from_runners(PlanConfig::new(), (0..runners).map(|i| (r(i), [Q])));
    let mut capturing = d
        .unwrap()
        .plan(Policy::Generations(g))
        .unwrap()
        .allocate(sim.clone())
        .unwrap();
    let s = sim.stream();
    for i in 0..runners {
        let cap = capturing.capture(r(i)).unwrap();
        let view = cap.take(Q).unwrap();
        cap.stream_capture(&s, |s| {
            sim.launch(s, sim::Op::fill(&view, (i + 1) as f32), 20)
        })
        .unwrap();
        cap.finish().unwrap();
    }
    capturing.seal().unwrap()
}

/// A consumer that copies `runner`'s view into `sink` (30 ticks).
fn copy_out(
    rp: &mut Replayable<sim::Device>,
    sim: &sim::Device,
    runner: RunnerId,
    s: &sim::Stream,
    sink: &sim::HostBuffer,
) -> Result<(), ConsumeError<replay_arena::BackendError>> {
    rp.consume(runner, s, |s, v| {
        sim.launch(s, sim::Op::copy(&v[0], sink), 30)
    })
}

fn read0(sim: &sim::Device, b: &impl sim::AsSpan) -> f32 {
    sim.read_f32(b).unwrap()[0]
}

fn graph_memory(sim: &sim::Device) -> GraphMemory {
    sim.graph_memory_in_use().unwrap().unwrap()
}

/// How many backend calls `f` makes with no fault.
fn calls_of(sim: &sim::Device, f: impl FnOnce()) -> u64 {
    sim.inject(Faults::none());
    f();
    sim.fault_log().calls
}

// ---------------------------------------------------------------------
// Per-runner operations
// ---------------------------------------------------------------------

/// A fault at every call of a three-stream program of replays, consumers
/// and `wait_all` (runners sharing bytes): no hazard, the program carries
/// on with exact values, teardown leaks nothing.
#[test]
fn a_fault_at_each_call_of_a_three_stream_program_leaves_no_hazard_and_no_leak() {
    let program = |sim: &sim::Device,
                   rp: &mut Replayable<sim::Device>,
                   s: &[sim::Stream; 3],
                   sink: &sim::HostBuffer| {
        let _ = rp.replay(r(0), &s[0]);
        let _ = copy_out(rp, sim, r(0), &s[1], sink);
        let _ = rp.replay(r(1), &s[2]);
        let _ = copy_out(rp, sim, r(1), &s[0], sink);
        let _ = rp.wait_all(&s[2]);
        let _ = rp.replay(r(0), &s[1]);
        let _ = rp.wait_for(r(0), &s[2]);
    };
    let n = {
        let sim = sim::Device::new();
        let s = [sim.stream(), sim.stream(), sim.stream()];
        let mut rp = fill_plan(&sim, 2, 1);
        let sink = sim.alloc_f32(N).unwrap();
        calls_of(&sim, || program(&sim, &mut rp, &s, &sink))
    };
    assert!(n > 5);
    for k in 0..n {
        let sim = sim::Device::new();
        let s = [sim.stream(), sim.stream(), sim.stream()];
        let mut rp = fill_plan(&sim, 2, 1);
        let sink = sim.alloc_f32(N).unwrap();
        sim.inject(Faults::at(k));
        program(&sim, &mut rp, &s, &sink);
        sim.inject(Faults::none());
        assert_eq!(sim.hazards(), [], "fault at {k}");
        // Carry on.
        rp.replay(r(1), &s[1]).unwrap();
        copy_out(&mut rp, &sim, r(1), &s[2], &sink).unwrap();
        rp.replay(r(0), &s[0]).unwrap();
        copy_out(&mut rp, &sim, r(0), &s[1], &sink).unwrap();
        rp.synchronize().unwrap();
        assert_eq!(read0(&sim, &sink), 1.0, "fault at {k}");
        assert_eq!(sim.hazards(), [], "fault at {k}");
        drop(rp);
        assert_eq!(sim.live_allocations(), 1, "fault at {k}: only the sink");
        assert_eq!(sim.live_events(), 0, "fault at {k}");
    }
}

/// `wait_for` whose wait (or the record it needs) fails counts no wait
/// and no record: the statistics are as before.
#[test]
fn a_failed_wait_for_counts_nothing() {
    for call in [Call::RecordEvent, Call::WaitEvent] {
        let sim = sim::Device::new();
        let (a, b) = (sim.stream(), sim.stream());
        let mut rp = fill_plan(&sim, 1, 1);
        rp.replay(r(0), &a).unwrap();
        let before = rp.fence_stats();
        sim.inject(Faults::nth(call, 0));
        let failed = rp.wait_for(r(0), &b);
        sim.inject(Faults::none());
        assert!(failed.is_err(), "{call}");
        assert_eq!(rp.fence_stats(), before, "{call}");
        rp.wait_for(r(0), &b).unwrap();
        assert_eq!(sim.hazards(), []);
    }
}

/// `wait_all` that fails at its second wait, after the first went out,
/// counts nothing.
#[test]
fn a_wait_all_failing_half_way_counts_nothing() {
    let sim = sim::Device::new();
    let s = [sim.stream(), sim.stream(), sim.stream()];
    let w = sim.stream();
    let mut rp = fill_plan(&sim, 3, 3);
    for i in 0..3 {
        rp.replay(r(i), &s[i as usize]).unwrap();
    }
    let before = rp.fence_stats();
    sim.inject(Faults::nth(Call::WaitEvent, 1));
    assert!(matches!(rp.wait_all(&w), Err(WaitError::Backend(_))));
    sim.inject(Faults::none());
    assert_eq!(rp.fence_stats(), before);
    rp.wait_all(&w).unwrap();
    let out = sim.alloc_f32(N).unwrap();
    rp.consume(r(2), &w, |s, v| {
        sim.launch(s, sim::Op::copy(&v[0], &out), 1)
    })
    .unwrap();
    rp.synchronize().unwrap();
    assert_eq!(read0(&sim, &out), 3.0);
    assert_eq!(sim.hazards(), []);
}

/// `consume_many` whose wait for its second runner fails: the closure is
/// not called, nothing is counted.
#[test]
fn a_consume_many_failing_at_its_second_wait_calls_nothing_and_counts_nothing() {
    let sim = sim::Device::new();
    let s = [sim.stream(), sim.stream(), sim.stream()];
    let mut rp = fill_plan(&sim, 2, 2);
    rp.replay(r(0), &s[0]).unwrap();
    rp.replay(r(1), &s[1]).unwrap();
    let before = rp.fence_stats();
    sim.inject(Faults::nth(Call::WaitEvent, 1));
    let mut called = false;
    let failed = rp.consume_many(&[r(0), r(1)], &s[2], |_, _| {
        called = true;
        Ok::<(), String>(())
    });
    sim.inject(Faults::none());
    assert!(
        matches!(failed, Err(ConsumeError::Backend(_))),
        "{failed:?}"
    );
    assert!(!called);
    assert_eq!(rp.fence_stats(), before);
    let sink = sim.alloc_f32(N).unwrap();
    rp.consume_many(&[r(0), r(1)], &s[2], |st, runners| {
        for v in runners {
            sim.launch(st, sim::Op::add(&v[0], &sink), 5)?;
        }
        Ok::<(), replay_arena::BackendError>(())
    })
    .unwrap();
    rp.synchronize().unwrap();
    assert_eq!(read0(&sim, &sink), 3.0);
    assert_eq!(sim.hazards(), []);
}

/// A consumer that enqueues a long read and then fails: a replay on a
/// third stream that overwrites the bytes waits for the read, and the
/// consumer is not counted.
#[test]
fn a_consumer_failing_after_enqueuing_is_waited_for_on_a_third_stream() {
    let sim = sim::Device::new();
    let s = [sim.stream(), sim.stream(), sim.stream()];
    let mut rp = fill_plan(&sim, 2, 1);
    let sink = sim.alloc_f32(N).unwrap();
    rp.replay(r(0), &s[0]).unwrap();
    let consumers = rp.fence_stats().consumers;
    let failed = rp.consume(r(0), &s[1], |st, v| {
        sim.launch(st, sim::Op::copy(&v[0], &sink), 500)
            .map_err(|e| e.to_string())?;
        Err::<(), String>("the collective failed".into())
    });
    assert!(matches!(failed, Err(ConsumeError::Work(_))));
    assert_eq!(rp.fence_stats().consumers, consumers);
    rp.replay(r(1), &s[2]).unwrap();
    rp.synchronize().unwrap();
    assert_eq!(read0(&sim, &sink), 1.0, "the read saw runner 0's bytes");
    assert_eq!(sim.hazards(), []);
}

/// A writing consumer that writes and panics: the next replay of a runner
/// sharing the bytes on another stream waits for the write; nothing is
/// counted; the stream is usable after the unwind.
#[test]
fn a_writing_consumer_panicking_after_its_write_is_waited_for() {
    let sim = sim::Device::new();
    let s = [sim.stream(), sim.stream(), sim.stream()];
    let mut rp = fill_plan(&sim, 2, 1);
    rp.replay(r(0), &s[0]).unwrap();
    let consumers = rp.fence_stats().consumers;
    let unwound = catch_unwind(AssertUnwindSafe(|| {
        rp.consume_mut(r(0), &s[1], |st, v| -> Result<(), String> {
            sim.launch(st, sim::Op::fill(&v[0], 7.0), 500).unwrap();
            panic!("the program's writer panicked")
        })
    }));
    assert!(unwound.is_err());
    assert_eq!(rp.fence_stats().consumers, consumers);
    rp.replay(r(1), &s[2]).unwrap();
    rp.synchronize().unwrap();
    assert_eq!(read0(&sim, &rp.views(r(1)).unwrap()[0]), 2.0);
    // The stream of the panicking consumer works.
    let sink = sim.alloc_f32(N).unwrap();
    copy_out(&mut rp, &sim, r(1), &s[1], &sink).unwrap();
    rp.synchronize().unwrap();
    assert_eq!(read0(&sim, &sink), 2.0);
    assert_eq!(sim.hazards(), []);
}

/// A consumer whose own completion record (after the closure succeeded)
/// fails: the error is typed, and a replay overwriting the bytes on
/// another stream still waits for the consumer's read.
#[test]
fn a_consumer_whose_completion_record_fails_is_still_waited_for() {
    for k in 0..4 {
        let sim = sim::Device::new();
        let s = [sim.stream(), sim.stream(), sim.stream()];
        let mut rp = fill_plan(&sim, 2, 1);
        let sink = sim.alloc_f32(N).unwrap();
        rp.replay(r(0), &s[0]).unwrap();
        sim.inject(Faults::nth(Call::RecordEvent, k));
        let _ = rp.consume(r(0), &s[1], |st, v| {
            sim.launch(st, sim::Op::copy(&v[0], &sink), 500)
        });
        sim.inject(Faults::none());
        rp.replay(r(1), &s[2]).unwrap();
        rp.synchronize().unwrap();
        assert_eq!(sim.hazards(), [], "record {k}");
        let v = read0(&sim, &sink);
        assert!(v == 0.0 || v == 1.0, "record {k}: {v}");
    }
}

// ---------------------------------------------------------------------
// Staged inputs and buckets
// ---------------------------------------------------------------------

const fn ids(n: u64) -> Request {
    Request::new(Domain::Device, DType::F32, n).purpose(Purpose::Input)
}
const fn out(n: u64) -> Request {
    Request::new(Domain::Device, DType::F32, n)
}

/// Two buckets (runner 0: 64 elements, runner 1: 256), each with a staged
/// input and an output; each graph copies its input to its output and
/// doubles it. The buckets share bytes from the start of each arena.
fn buckets(sim: &sim::Device) -> Replayable<sim::Device> {
    let sizes = [64u64, 256];
    let mut d = Discovering::new(PlanConfig::new());
    for (b, &n) in sizes.iter().enumerate() {
        d.bucket(format!("bs={n}")).unwrap();
        let mut armed = d.arm(r(b as u32)).unwrap();
        armed.record(ids(n)).unwrap();
        armed.record(out(n)).unwrap();
    }
    let mut capturing = d
        .plan(Policy::Generations(1))
        .unwrap()
        .allocate(sim.clone())
        .unwrap();
    let s = sim.stream();
    for (b, &n) in sizes.iter().enumerate() {
        let cap = capturing.capture(r(b as u32)).unwrap();
        let (i, o) = (cap.take(ids(n)).unwrap(), cap.take(out(n)).unwrap());
        cap.stream_capture(&s, |s| {
            sim.launch(s, sim::Op::copy(&i, &o), 20)?;
            sim.launch(s, sim::Op::scale(&o, 2.0), 20)
        })
        .unwrap();
        cap.finish().unwrap();
    }
    capturing.seal().unwrap()
}

fn stage(
    rp: &mut Replayable<sim::Device>,
    sim: &sim::Device,
    runner: RunnerId,
    s: &sim::Stream,
    value: f32,
) -> Result<(), ConsumeError<replay_arena::BackendError>> {
    rp.consume_mut(runner, s, |st, v| {
        sim.launch(st, sim::Op::fill(&v[0], value), 10)
    })
}

/// A staging whose wait fails (before the writer runs) leaves the earlier
/// staging in place: the runner replays its old input.
#[test]
fn a_staging_whose_wait_fails_keeps_the_earlier_staging() {
    let sim = sim::Device::new();
    let (st, pool) = (sim.stream(), sim.stream());
    let mut rp = buckets(&sim);
    stage(&mut rp, &sim, r(0), &st, 3.0).unwrap();
    rp.replay(r(0), &pool).unwrap();
    let before = rp.fence_stats();
    sim.inject(Faults::nth(Call::WaitEvent, 0));
    let failed = stage(&mut rp, &sim, r(0), &st, 4.0);
    sim.inject(Faults::none());
    assert!(
        matches!(failed, Err(ConsumeError::Backend(_))),
        "{failed:?}"
    );
    assert_eq!(rp.fence_stats(), before);
    rp.replay(r(0), &pool).unwrap();
    rp.synchronize().unwrap();
    assert_eq!(read0(&sim, &rp.views(r(0)).unwrap()[1]), 6.0);
    assert_eq!(sim.hazards(), []);
}

/// Staging the other bucket, whose wait fails, takes nothing from the
/// bucket that holds the bytes: it still replays and is consumed.
#[test]
fn a_bucket_switch_whose_staging_wait_fails_leaves_the_other_bucket_intact() {
    let sim = sim::Device::new();
    let (st, pool, side) = (sim.stream(), sim.stream(), sim.stream());
    let mut rp = buckets(&sim);
    stage(&mut rp, &sim, r(0), &st, 5.0).unwrap();
    rp.replay(r(0), &pool).unwrap();
    sim.inject(Faults::nth(Call::WaitEvent, 0));
    assert!(stage(&mut rp, &sim, r(1), &st, 9.0).is_err());
    sim.inject(Faults::none());
    let sink = sim.alloc_f32(N).unwrap();
    rp.consume(r(0), &side, |s, v| {
        sim.launch(s, sim::Op::copy(&v[1], &sink), 1)
    })
    .unwrap();
    rp.replay(r(0), &pool).unwrap();
    rp.synchronize().unwrap();
    assert_eq!(read0(&sim, &sink), 10.0);
    assert!(matches!(
        rp.replay(r(1), &pool),
        Err(ReplayError::InputNotStaged { .. })
    ));
    assert_eq!(sim.hazards(), []);
}

/// The other bucket's writer writes the shared bytes and fails: the
/// bucket that held them must not replay on what the failed writer left
/// (its input is gone), nor be consumed as if its output were intact.
#[test]
fn a_failed_staging_of_another_bucket_unstages_the_bucket_whose_bytes_it_wrote() {
    let sim = sim::Device::new();
    let (st, pool, side) = (sim.stream(), sim.stream(), sim.stream());
    let mut rp = buckets(&sim);
    stage(&mut rp, &sim, r(0), &st, 5.0).unwrap();
    rp.replay(r(0), &pool).unwrap();
    let failed = rp.consume_mut(r(1), &st, |s, v| {
        // Writes every byte of runner 1's input and output, then fails.
        sim.launch(s, sim::Op::fill(&v[0], 9.0), 10)
            .map_err(|e| e.to_string())?;
        sim.launch(s, sim::Op::fill(&v[1], 9.0), 10)
            .map_err(|e| e.to_string())?;
        Err::<(), String>("the host copy failed".into())
    });
    assert!(failed.is_err());
    match rp.replay(r(0), &pool) {
        Err(ReplayError::InputNotStaged { .. }) => {}
        Ok(()) => {
            rp.synchronize().unwrap();
            assert_eq!(
                read0(&sim, &rp.views(r(0)).unwrap()[1]),
                10.0,
                "runner 0 replayed on the failed writer's bytes"
            );
        }
        Err(e) => panic!("{e:?}"),
    }
    let late = rp.consume(r(0), &side, |_, _| Ok::<(), String>(()));
    assert!(late.is_err(), "runner 0's output was overwritten: {late:?}");
    assert!(matches!(
        rp.replay(r(1), &pool),
        Err(ReplayError::InputNotStaged { .. })
    ));
    assert_eq!(sim.hazards(), []);
}

/// A fault at each call of a bucket-switching program with staging on a
/// third stream: no hazard, the values after carrying on are exact, and
/// teardown leaks nothing.
#[test]
fn a_fault_at_each_call_of_bucket_switches_leaves_no_hazard_and_no_leak() {
    let program = |sim: &sim::Device,
                   rp: &mut Replayable<sim::Device>,
                   s: &[sim::Stream; 3],
                   sink: &sim::HostBuffer| {
        for step in 0..4u32 {
            let b = step % 2;
            let _ = stage(rp, sim, r(b), &s[0], step as f32);
            let _ = rp.replay(r(b), &s[1]);
            let _ = rp.consume(r(b), &s[2], |st, v| {
                sim.launch(st, sim::Op::copy(&v[1], sink), 30)
            });
        }
    };
    let n = {
        let sim = sim::Device::new();
        let s = [sim.stream(), sim.stream(), sim.stream()];
        let mut rp = buckets(&sim);
        let sink = sim.alloc_f32(N).unwrap();
        calls_of(&sim, || program(&sim, &mut rp, &s, &sink))
    };
    for k in 0..n {
        let sim = sim::Device::new();
        let s = [sim.stream(), sim.stream(), sim.stream()];
        let mut rp = buckets(&sim);
        let sink = sim.alloc_f32(N).unwrap();
        sim.inject(Faults::at(k));
        program(&sim, &mut rp, &s, &sink);
        sim.inject(Faults::none());
        assert_eq!(sim.hazards(), [], "fault at {k}");
        for b in [1u32, 0] {
            stage(&mut rp, &sim, r(b), &s[1], 10.0 + b as f32).unwrap();
            rp.replay(r(b), &s[2]).unwrap();
            rp.consume(r(b), &s[0], |st, v| {
                sim.launch(st, sim::Op::copy(&v[1], &sink), 30)
            })
            .unwrap();
        }
        rp.synchronize().unwrap();
        assert_eq!(read0(&sim, &sink), 20.0, "fault at {k}");
        assert_eq!(sim.hazards(), [], "fault at {k}");
        drop(rp);
        assert_eq!(sim.live_allocations(), 1, "fault at {k}");
        assert_eq!(sim.live_events(), 0, "fault at {k}");
    }
}

// ---------------------------------------------------------------------
// Handoffs
// ---------------------------------------------------------------------

struct Handoff {
    sim: sim::Device,
    rp: Replayable<sim::Device>,
    count: sim::HostBuffer,
    _one: sim::HostBuffer,
}

/// Runner 0 counts its replays into a program buffer and hands the count
/// to runner 1 (marking the handoff ready when `ready`, then a long
/// write of its own view); runner 1 copies what it receives into its own
/// view.
fn handoff(ready: bool) -> Handoff {
    let sim = sim::Device::new();
    let mut d = Discovering::new(PlanConfig::new());
    let h: HandoffId = {
        let mut a = d.arm(r(0)).unwrap();
        a.record(Q).unwrap();
        a.hand_off(Q).unwrap()
    };
    {
        let mut a = d.arm(r(1)).unwrap();
        a.record(Q).unwrap();
        a.receive(h).unwrap();
    }
    let one = sim.alloc_f32(N).unwrap();
    sim.write_f32(&one, &[1.0; N]).unwrap();
    let count = sim.alloc_f32(N).unwrap();
    let mut capturing = d
        .plan(Policy::Generations(1))
        .unwrap()
        .allocate(sim.clone())
        .unwrap();
    let s = sim.stream();
    {
        let cap = capturing.capture(r(0)).unwrap();
        let (w, dx) = (cap.take(Q).unwrap(), cap.hand_off(h).unwrap());
        cap.stream_capture(&s, |s| {
            sim.launch(s, sim::Op::add(&one, &count), 1)?;
            sim.launch(s, sim::Op::copy(&count, &dx), 5)?;
            if ready {
                cap.ready(h, s)?;
            }
            sim.launch(s, sim::Op::fill(&w, 1.0), 50)?;
            Ok::<(), replay_arena::Error>(())
        })
        .unwrap();
        cap.finish().unwrap();
    }
    {
        let cap = capturing.capture(r(1)).unwrap();
        let (w, dy) = (cap.take(Q).unwrap(), cap.receive(h).unwrap());
        cap.stream_capture(&s, |s| sim.launch(s, sim::Op::copy(&dy, &w), 5))
            .unwrap();
        cap.finish().unwrap();
    }
    Handoff {
        rp: capturing.seal().unwrap(),
        sim,
        count,
        _one: one,
    }
}

/// A writer replay whose launch fails wrote nothing: its reader, which
/// already read the last write, may not read it again.
#[test]
fn a_handoff_writer_whose_launch_fails_does_not_count_as_a_write() {
    for ready in [false, true] {
        let mut hf = handoff(ready);
        let sim = hf.sim.clone();
        let (a, b) = (sim.stream(), sim.stream());
        hf.rp.replay(r(0), &a).unwrap();
        hf.rp.replay(r(1), &b).unwrap();
        let before = hf.rp.fence_stats();
        sim.inject(Faults::nth(Call::Launch, 0));
        assert!(hf.rp.replay(r(0), &a).is_err());
        sim.inject(Faults::none());
        assert_eq!(hf.rp.fence_stats(), before, "ready {ready}");
        assert!(
            matches!(
                hf.rp.replay(r(1), &b),
                Err(ReplayError::HandoffAlreadyRead { .. })
            ),
            "ready {ready}"
        );
        hf.rp.replay(r(0), &a).unwrap();
        hf.rp.replay(r(1), &b).unwrap();
        hf.rp.synchronize().unwrap();
        assert_eq!(read0(&sim, &hf.rp.views(r(1)).unwrap()[0]), 2.0);
        assert_eq!(read0(&sim, &hf.count), 2.0);
        assert_eq!(sim.hazards(), []);
    }
}

/// A reader replay whose launch fails read nothing: it reads the same
/// write next time.
#[test]
fn a_handoff_reader_whose_launch_fails_is_not_marked_read() {
    for ready in [false, true] {
        let mut hf = handoff(ready);
        let sim = hf.sim.clone();
        let (a, b) = (sim.stream(), sim.stream());
        hf.rp.replay(r(0), &a).unwrap();
        sim.inject(Faults::nth(Call::Launch, 0));
        assert!(hf.rp.replay(r(1), &b).is_err());
        sim.inject(Faults::none());
        hf.rp.replay(r(1), &b).unwrap();
        hf.rp.synchronize().unwrap();
        assert_eq!(read0(&sim, &hf.rp.views(r(1)).unwrap()[0]), 1.0);
        assert_eq!(sim.hazards(), []);
    }
}

/// A fault at every call of a writer's replay (launch included, and the
/// records after it), then its reader on another stream and the writer
/// again on a third: no hazard, values in range, the program carries on.
#[test]
fn a_fault_at_each_call_of_a_handoff_writer_keeps_its_reader_ordered() {
    for ready in [false, true] {
        let n = {
            let mut hf = handoff(ready);
            let sim = hf.sim.clone();
            let (a, b) = (sim.stream(), sim.stream());
            hf.rp.replay(r(0), &a).unwrap();
            hf.rp.replay(r(1), &b).unwrap();
            calls_of(&sim, || {
                hf.rp.replay(r(0), &a).unwrap();
            })
        };
        for k in 0..n {
            let mut hf = handoff(ready);
            let sim = hf.sim.clone();
            let s = [sim.stream(), sim.stream(), sim.stream()];
            hf.rp.replay(r(0), &s[0]).unwrap();
            hf.rp.replay(r(1), &s[1]).unwrap();
            sim.inject(Faults::at(k));
            let first = hf.rp.replay(r(0), &s[0]);
            sim.inject(Faults::none());
            let second = hf.rp.replay(r(1), &s[1]);
            if first.is_ok() {
                second.unwrap();
            }
            hf.rp.replay(r(0), &s[2]).unwrap();
            hf.rp.replay(r(1), &s[1]).unwrap();
            hf.rp.synchronize().unwrap();
            assert_eq!(sim.hazards(), [], "ready {ready}, fault at {k}");
            let c = read0(&sim, &hf.count);
            assert_eq!(
                read0(&sim, &hf.rp.views(r(1)).unwrap()[0]),
                c,
                "ready {ready}, {k}"
            );
            drop(hf.rp);
            assert_eq!(sim.live_events(), 0, "ready {ready}, fault at {k}");
        }
    }
}

// ---------------------------------------------------------------------
// Step graphs
// ---------------------------------------------------------------------

/// A step of two runners sharing bytes (G = 1), each replayed on `a` and
/// consumed on `b` into `sink` (adds): 3 per launch.
fn two_step<'r>(
    rp: &'r mut Replayable<sim::Device>,
    sim: &sim::Device,
    a: &sim::Stream,
    b: &sim::Stream,
    sink: &sim::HostBuffer,
) -> replay_arena::StepBuilder<'r, sim::Device> {
    let mut step = rp.step();
    for i in 0..2 {
        step.replay(r(i), a).unwrap();
        step.consume(r(i), b, |s, v| sim.launch(s, sim::Op::add(&v[0], sink), 10))
            .unwrap();
    }
    step
}

/// A fault at every call of a step graph's second launch (on another
/// stream than the first), borrowed and overlapping: the launches after
/// it, on alternating streams, run in turn with exact sums and no hazard.
#[test]
fn a_fault_at_each_call_of_a_step_launch_keeps_later_launches_in_turn() {
    for overlapping in [false, true] {
        let n = {
            let sim = sim::Device::new();
            let l = [sim.stream(), sim.stream()];
            let (a, b) = (sim.stream(), sim.stream());
            let sink = sim.alloc_f32(N).unwrap();
            let mut rp = fill_plan(&sim, 2, 1);
            let step = two_step(&mut rp, &sim, &a, &b, &sink);
            let mut g = if overlapping {
                step.build_overlapping()
            } else {
                step.build()
            }
            .unwrap();
            g.launch(&l[0]).unwrap();
            calls_of(&sim, || g.launch(&l[1]).unwrap())
        };
        for k in 0..n {
            let sim = sim::Device::new();
            let l = [sim.stream(), sim.stream()];
            let (a, b) = (sim.stream(), sim.stream());
            let sink = sim.alloc_f32(N).unwrap();
            let mut rp = fill_plan(&sim, 2, 1);
            let ok = {
                let step = two_step(&mut rp, &sim, &a, &b, &sink);
                let mut g = if overlapping {
                    step.build_overlapping()
                } else {
                    step.build()
                }
                .unwrap();
                g.launch(&l[0]).unwrap();
                sim.inject(Faults::at(k));
                let second = g.launch(&l[1]);
                sim.inject(Faults::none());
                if let Err(e) = &second {
                    assert!(matches!(e, StepLaunchError::Backend(_)), "{e:?}");
                }
                for i in 0..4 {
                    g.launch(&l[i % 2]).unwrap();
                }
                let launches = g.launches();
                assert_eq!(launches, 5 + second.is_ok() as u64, "{overlapping} {k}");
                launches
            };
            assert_eq!(rp.fence_stats().step_launches, ok, "{overlapping} {k}");
            rp.synchronize().unwrap();
            assert_eq!(
                read0(&sim, &sink),
                3.0 * ok as f32,
                "overlapping {overlapping}, fault at {k}"
            );
            assert_eq!(sim.hazards(), [], "overlapping {overlapping}, fault at {k}");
            rp.replay(r(1), &b).unwrap();
            drop(rp);
            assert_eq!(sim.hazards(), []);
            assert_eq!(
                sim.live_events(),
                0,
                "overlapping {overlapping}, fault at {k}"
            );
        }
    }
}

/// The same for kept step graphs (`launch_kept`), with a per-runner
/// replay between launches.
#[test]
fn a_fault_at_each_call_of_a_kept_launch_keeps_later_launches_ordered() {
    for overlapping in [false, true] {
        let mk = |sim: &sim::Device,
                  rp: &mut Replayable<sim::Device>,
                  a: &sim::Stream,
                  b: &sim::Stream,
                  sink: &sim::HostBuffer| {
            let step = two_step(rp, sim, a, b, sink);
            if overlapping {
                step.build_overlapping()
            } else {
                step.build()
            }
            .unwrap()
            .keep()
        };
        let n = {
            let sim = sim::Device::new();
            let l = [sim.stream(), sim.stream()];
            let (a, b) = (sim.stream(), sim.stream());
            let sink = sim.alloc_f32(N).unwrap();
            let mut rp = fill_plan(&sim, 2, 1);
            let mut kept = mk(&sim, &mut rp, &a, &b, &sink);
            rp.launch_kept(&mut kept, &l[0]).unwrap();
            calls_of(&sim, || rp.launch_kept(&mut kept, &l[1]).unwrap())
        };
        for k in 0..n {
            let sim = sim::Device::new();
            let l = [sim.stream(), sim.stream()];
            let (a, b) = (sim.stream(), sim.stream());
            let sink = sim.alloc_f32(N).unwrap();
            let mut rp = fill_plan(&sim, 2, 1);
            let mut kept = mk(&sim, &mut rp, &a, &b, &sink);
            rp.launch_kept(&mut kept, &l[0]).unwrap();
            sim.inject(Faults::at(k));
            let second = rp.launch_kept(&mut kept, &l[1]);
            sim.inject(Faults::none());
            rp.launch_kept(&mut kept, &l[0]).unwrap();
            rp.replay(r(0), &l[1]).unwrap();
            rp.launch_kept(&mut kept, &l[0]).unwrap();
            rp.launch_kept(&mut kept, &l[1]).unwrap();
            let ok = 4 + second.is_ok() as u64;
            assert_eq!(kept.launches(), ok, "{overlapping} {k}");
            assert_eq!(rp.fence_stats().step_launches, ok, "{overlapping} {k}");
            rp.synchronize().unwrap();
            assert_eq!(
                read0(&sim, &sink),
                3.0 * ok as f32,
                "overlapping {overlapping}, fault at {k}"
            );
            assert_eq!(sim.hazards(), [], "overlapping {overlapping}, fault at {k}");
            drop(kept);
            drop(rp);
            assert_eq!(
                sim.live_events(),
                0,
                "overlapping {overlapping}, fault at {k}"
            );
        }
    }
}

/// A step graph launched on `a`, its next launch on `b` failing, then
/// forgotten: a replay on `b` of a runner sharing the step's bytes still
/// waits for the good launch.
#[test]
fn a_forgotten_step_graph_after_a_failed_launch_orders_later_replays() {
    for call in [Call::Launch, Call::WaitEvent, Call::RecordEvent] {
        let sim = sim::Device::new();
        let (a, b, c) = (sim.stream(), sim.stream(), sim.stream());
        let sink = sim.alloc_f32(N).unwrap();
        let mut rp = fill_plan(&sim, 2, 1);
        {
            let mut g = two_step(&mut rp, &sim, &a, &c, &sink).build().unwrap();
            g.launch(&a).unwrap();
            sim.inject(Faults::nth(call, 0));
            let _ = g.launch(&b);
            sim.inject(Faults::none());
            std::mem::forget(g);
        }
        rp.replay(r(0), &b).unwrap();
        copy_out(&mut rp, &sim, r(0), &c, &sink).unwrap();
        rp.synchronize().unwrap();
        assert_eq!(read0(&sim, &sink), 1.0, "{call}");
        assert_eq!(sim.hazards(), [], "{call}");
    }
}

/// A fault at every call of a build (borrowed and overlapping): a failed
/// build changes no statistic, the plan carries on, teardown leaks no
/// event and no allocation.
#[test]
fn a_fault_at_each_call_of_a_build_leaves_the_plan_usable_and_leak_free() {
    for overlapping in [false, true] {
        let n = {
            let sim = sim::Device::new();
            let (a, b) = (sim.stream(), sim.stream());
            let sink = sim.alloc_f32(N).unwrap();
            let mut rp = fill_plan(&sim, 2, 1);
            calls_of(&sim, || {
                let step = two_step(&mut rp, &sim, &a, &b, &sink);
                drop(
                    if overlapping {
                        step.build_overlapping()
                    } else {
                        step.build()
                    }
                    .unwrap(),
                );
            })
        };
        for k in 0..n {
            let sim = sim::Device::new();
            let (a, b) = (sim.stream(), sim.stream());
            let sink = sim.alloc_f32(N).unwrap();
            let mut rp = fill_plan(&sim, 2, 1);
            rp.replay(r(0), &b).unwrap();
            let before = rp.fence_stats();
            sim.inject(Faults::at(k));
            let built = catch_unwind(AssertUnwindSafe(|| -> Result<(), String> {
                let mut step = rp.step();
                for i in 0..2 {
                    step.replay(r(i), &a).map_err(|e| e.to_string())?;
                    step.consume(r(i), &b, |s, v| {
                        sim.launch(s, sim::Op::add(&v[0], &sink), 10)
                    })
                    .map_err(|e| format!("{e:?}"))?;
                }
                let g = if overlapping {
                    step.build_overlapping()
                } else {
                    step.build()
                }
                .map_err(|e| e.to_string())?;
                drop(g);
                Ok(())
            }))
            .expect("no panic from library code");
            sim.inject(Faults::none());
            if built.is_err() {
                assert_eq!(rp.fence_stats(), before, "{overlapping}: fault at {k}");
            }
            rp.replay(r(1), &a).unwrap();
            copy_out(&mut rp, &sim, r(1), &b, &sink).unwrap();
            rp.synchronize().unwrap();
            assert_eq!(read0(&sim, &sink), 2.0, "{overlapping}: fault at {k}");
            assert_eq!(sim.hazards(), [], "{overlapping}: fault at {k}");
            drop(rp);
            assert_eq!(sim.live_events(), 0, "{overlapping}: fault at {k}");
            assert_eq!(sim.live_allocations(), 1, "{overlapping}: fault at {k}");
        }
    }
}

/// A step consumer whose closure panics: the stream capture it began is
/// ended, the builder goes on, and the stream takes per-runner work after.
#[test]
fn a_panicking_step_consumer_leaves_the_builder_and_its_stream_usable() {
    let sim = sim::Device::new();
    let (a, b) = (sim.stream(), sim.stream());
    let sink = sim.alloc_f32(N).unwrap();
    let mut rp = fill_plan(&sim, 2, 1);
    {
        let mut step = rp.step();
        step.replay(r(0), &a).unwrap();
        let unwound = catch_unwind(AssertUnwindSafe(|| {
            step.consume(r(0), &b, |s, v| -> Result<(), String> {
                sim.launch(s, sim::Op::add(&v[0], &sink), 10).unwrap();
                panic!("the framework's op panicked")
            })
            .map(|_| ())
        }));
        assert!(unwound.is_err());
        step.consume(r(0), &b, |s, v| {
            sim.launch(s, sim::Op::add(&v[0], &sink), 10)
        })
        .unwrap();
        let mut g = step.build().unwrap();
        g.launch(&a).unwrap();
        g.launch(&b).unwrap();
    }
    rp.replay(r(1), &b).unwrap();
    copy_out(&mut rp, &sim, r(1), &a, &sink).unwrap();
    rp.synchronize().unwrap();
    assert_eq!(read0(&sim, &sink), 2.0);
    assert_eq!(rp.fence_stats().step_launches, 2);
    assert_eq!(sim.hazards(), []);
}

/// A kept step graph launched on `a`, then a per-runner replay on `b`
/// with a fault at each of its calls: the kept step's next launch waits
/// for whatever of that replay went out.
#[test]
fn a_kept_launch_after_a_replay_failing_at_each_call_waits_for_what_went_out() {
    for ready in [false, true] {
        let n = {
            let mut hf = handoff(ready);
            let sim = hf.sim.clone();
            let (a, b) = (sim.stream(), sim.stream());
            let mut step = hf.rp.step();
            step.replay(r(0), &a).unwrap();
            step.replay(r(1), &a).unwrap();
            let mut kept = step.build().unwrap().keep();
            hf.rp.launch_kept(&mut kept, &a).unwrap();
            calls_of(&sim, || hf.rp.replay(r(0), &b).unwrap())
        };
        for k in 0..n {
            let mut hf = handoff(ready);
            let sim = hf.sim.clone();
            let (a, b) = (sim.stream(), sim.stream());
            let mut step = hf.rp.step();
            step.replay(r(0), &a).unwrap();
            step.replay(r(1), &a).unwrap();
            let mut kept = step.build().unwrap().keep();
            hf.rp.launch_kept(&mut kept, &a).unwrap();
            sim.inject(Faults::at(k));
            let _ = hf.rp.replay(r(0), &b);
            sim.inject(Faults::none());
            hf.rp.launch_kept(&mut kept, &a).unwrap();
            hf.rp.synchronize().unwrap();
            assert_eq!(sim.hazards(), [], "ready {ready}, fault at {k}");
            let c = read0(&sim, &hf.count);
            assert_eq!(
                read0(&sim, &hf.rp.views(r(1)).unwrap()[0]),
                c,
                "ready {ready}, {k}"
            );
        }
    }
}

// ---------------------------------------------------------------------
// Temporaries and step copies
// ---------------------------------------------------------------------

/// Two runners sharing bytes whose graphs pass their value through a
/// temporary (`alloc_async` / `free_async`), captured repeatably with
/// `copies` step copies each.
fn temporaries(sim: &sim::Device, copies: usize) -> Replayable<sim::Device> {
    let d = Discovering::from_runners(PlanConfig::new(), (0..2).map(|i| (r(i), [Q])));
    let mut capturing = d
        .unwrap()
        .plan(Policy::Generations(1))
        .unwrap()
        .allocate(sim.clone())
        .unwrap();
    let s = sim.stream();
    for i in 0..2u32 {
        let cap = capturing.capture(r(i)).unwrap();
        cap.step_copies(copies);
        let view = cap.take(Q).unwrap();
        cap.stream_capture_repeatable(&s, |s| {
            let t = sim.alloc_async(s, N)?;
            sim.launch(s, sim::Op::fill(&t, (i + 1) as f32), 5)?;
            sim.launch(s, sim::Op::copy(&t, &view), 20)?;
            sim.free_async(s, &t)?;
            Ok::<(), replay_arena::BackendError>(())
        })
        .unwrap();
        cap.finish().unwrap();
    }
    capturing.seal().unwrap()
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
        let s = sim.stream();
        let res = {
            let cap = capturing.capture(r(0)).map_err(|e| e.to_string())?;
            cap.step_copies(2);
            let view = cap.take(Q).map_err(|e| e.to_string())?;
            let res = cap
                .stream_capture_repeatable(&s, |s| {
                    let t = sim.alloc_async(s, N)?;
                    sim.launch(s, sim::Op::copy(&t, &view), 20)?;
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
    let n = {
        let sim = sim::Device::new();
        calls_of(&sim, || capture(&sim).unwrap())
    };
    for k in 0..n {
        let sim = sim::Device::new();
        sim.inject(Faults::at(k));
        let got = capture(&sim);
        let log = sim.fault_log();
        sim.inject(Faults::none());
        // A failed trim leaves the pool's reservation (nothing uses it);
        // no graph may hold graph memory, and a trim gives it back.
        assert_eq!(
            graph_memory(&sim).used,
            0,
            "fault at {k}: {:?} {got:?}",
            log.injected
        );
        sim.trim_graph_memory().unwrap();
        assert_eq!(
            graph_memory(&sim),
            GraphMemory::new(0, 0),
            "fault at {k}: {:?} {got:?}",
            log.injected
        );
        assert_eq!(sim.live_allocations(), 0, "fault at {k}");
        assert_eq!(sim.live_events(), 0, "fault at {k}");
        assert_eq!(sim.hazards(), [], "fault at {k}");
    }
}

/// A fault at every call of a build that moves step copies in, then the
/// plan goes on and is dropped: the graph memory the copies held is given
/// back.
#[test]
fn a_fault_at_each_call_of_a_build_with_step_copies_gives_graph_memory_back() {
    let n = {
        let sim = sim::Device::new();
        let (a, b) = (sim.stream(), sim.stream());
        let mut rp = temporaries(&sim, 1);
        calls_of(&sim, || {
            let mut step = rp.step();
            step.replay(r(0), &a).unwrap();
            step.replay(r(1), &b).unwrap();
            drop(step.build().unwrap());
        })
    };
    for k in 0..n {
        let sim = sim::Device::new();
        let (a, b) = (sim.stream(), sim.stream());
        let mut rp = temporaries(&sim, 1);
        sim.inject(Faults::at(k));
        {
            let mut step = rp.step();
            let _ = step.replay(r(0), &a);
            let _ = step.replay(r(1), &b);
            if let Ok(mut g) = step.build() {
                let _ = g.launch(&a);
            }
        }
        sim.inject(Faults::none());
        rp.replay(r(1), &a).unwrap();
        rp.replay(r(0), &b).unwrap();
        rp.synchronize().unwrap();
        assert_eq!(
            read0(&sim, &rp.views(r(0)).unwrap()[0]),
            1.0,
            "fault at {k}"
        );
        assert_eq!(sim.hazards(), [], "fault at {k}");
        drop(rp);
        assert_eq!(graph_memory(&sim), GraphMemory::new(0, 0), "fault at {k}");
        assert_eq!(sim.live_events(), 0, "fault at {k}");
        assert_eq!(sim.live_allocations(), 0, "fault at {k}");
    }
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
    let n = {
        let sim = sim::Device::new();
        let (a, b) = (sim.stream(), sim.stream());
        let kept = setup(&sim, &a, &b);
        calls_of(&sim, || drop(kept))
    };
    assert!(n > 0);
    for k in 0..n {
        let sim = sim::Device::new();
        let (a, b) = (sim.stream(), sim.stream());
        let kept = setup(&sim, &a, &b);
        sim.inject(Faults::at(k));
        drop(kept);
        let log = sim.fault_log();
        sim.inject(Faults::none());
        assert_eq!(
            graph_memory(&sim).used,
            0,
            "fault at {k}: {:?}",
            log.injected
        );
        sim.trim_graph_memory().unwrap();
        assert_eq!(
            graph_memory(&sim),
            GraphMemory::new(0, 0),
            "fault at {k}: {:?}",
            log.injected
        );
        assert_eq!(sim.live_events(), 0, "fault at {k}");
        assert_eq!(sim.live_allocations(), 0, "fault at {k}");
        assert_eq!(sim.hazards(), [], "fault at {k}");
    }
}

// ---------------------------------------------------------------------
// Teardown, replan, traces, allocation
// ---------------------------------------------------------------------

/// A plan with work in flight on three streams (replays and consumers of
/// runners sharing bytes).
fn busy(
    sim: &sim::Device,
    s: &[sim::Stream; 3],
    sink: &[sim::HostBuffer; 2],
) -> Replayable<sim::Device> {
    let mut rp = fill_plan(sim, 3, 2);
    rp.replay(r(0), &s[0]).unwrap();
    copy_out(&mut rp, sim, r(0), &s[1], &sink[0]).unwrap();
    rp.replay(r(1), &s[2]).unwrap();
    copy_out(&mut rp, sim, r(1), &s[0], &sink[1]).unwrap();
    rp.replay(r(2), &s[1]).unwrap();
    rp
}

/// docs/safety.md: "when a wait fails they wait for the whole device,
/// and when that fails too, arenas, events and graphs are leaked": a
/// single fault during teardown, whose whole-device wait then succeeds,
/// leaks nothing.
#[test]
fn a_teardown_with_one_fault_at_each_call_leaks_nothing() {
    let n = {
        let sim = sim::Device::new();
        let s = [sim.stream(), sim.stream(), sim.stream()];
        let sink = [sim.alloc_f32(N).unwrap(), sim.alloc_f32(N).unwrap()];
        let rp = busy(&sim, &s, &sink);
        calls_of(&sim, || drop(rp))
    };
    assert!(n > 0);
    for k in 0..n {
        let sim = sim::Device::new();
        let s = [sim.stream(), sim.stream(), sim.stream()];
        let sink = [sim.alloc_f32(N).unwrap(), sim.alloc_f32(N).unwrap()];
        let rp = busy(&sim, &s, &sink);
        sim.inject(Faults::at(k));
        drop(rp);
        sim.inject(Faults::none());
        assert_eq!(sim.hazards(), [], "fault at {k}");
        assert_eq!(sim.live_allocations(), 2, "fault at {k}: only the sinks");
        assert_eq!(sim.live_events(), 0, "fault at {k}");
    }
}

/// `replan` with a single fault at each of its calls: it returns the
/// discovery (the whole-device wait covers the failed call), no hazard,
/// nothing leaked; with every host wait failing it is a typed error and
/// leaks rather than frees.
#[test]
fn a_replan_with_one_fault_at_each_call_returns_its_discovery() {
    let n = {
        let sim = sim::Device::new();
        let s = [sim.stream(), sim.stream(), sim.stream()];
        let sink = [sim.alloc_f32(N).unwrap(), sim.alloc_f32(N).unwrap()];
        let rp = busy(&sim, &s, &sink);
        calls_of(&sim, || drop(rp.replan().unwrap()))
    };
    for k in 0..n {
        let sim = sim::Device::new();
        let s = [sim.stream(), sim.stream(), sim.stream()];
        let sink = [sim.alloc_f32(N).unwrap(), sim.alloc_f32(N).unwrap()];
        let rp = busy(&sim, &s, &sink);
        sim.inject(Faults::at(k));
        let d = rp.replan();
        sim.inject(Faults::none());
        assert!(d.is_ok(), "fault at {k}: {:?}", d.err());
        assert_eq!(sim.hazards(), [], "fault at {k}");
        assert_eq!(sim.live_allocations(), 2, "fault at {k}");
        assert_eq!(sim.live_events(), 0, "fault at {k}");
    }
    let sim = sim::Device::new();
    let s = [sim.stream(), sim.stream(), sim.stream()];
    let sink = [sim.alloc_f32(N).unwrap(), sim.alloc_f32(N).unwrap()];
    let rp = busy(&sim, &s, &sink);
    sim.fail_waits(true);
    assert!(matches!(
        rp.replan(),
        Err(BackendFailure {
            op: Operation::Replan,
            ..
        })
    ));
    sim.fail_waits(false);
    assert!(sim.live_allocations() > 2, "leaked, not freed");
    sim.synchronize().unwrap();
    assert_eq!(sim.hazards(), []);
}

/// A step graph (borrowed) dropped with a single fault at each call of
/// its drop: the plan is then dropped and nothing is left.
#[test]
fn a_step_graph_dropped_with_one_fault_at_each_call_leaks_nothing() {
    let n = {
        let sim = sim::Device::new();
        let (a, b) = (sim.stream(), sim.stream());
        let sink = sim.alloc_f32(N).unwrap();
        let mut rp = fill_plan(&sim, 2, 1);
        let mut g = two_step(&mut rp, &sim, &a, &b, &sink)
            .build_overlapping()
            .unwrap();
        g.launch(&a).unwrap();
        g.launch(&b).unwrap();
        calls_of(&sim, || drop(g))
    };
    for k in 0..n {
        let sim = sim::Device::new();
        let (a, b) = (sim.stream(), sim.stream());
        let sink = sim.alloc_f32(N).unwrap();
        let mut rp = fill_plan(&sim, 2, 1);
        {
            let mut g = two_step(&mut rp, &sim, &a, &b, &sink)
                .build_overlapping()
                .unwrap();
            g.launch(&a).unwrap();
            g.launch(&b).unwrap();
            sim.inject(Faults::at(k));
            drop(g);
            sim.inject(Faults::none());
        }
        rp.replay(r(0), &b).unwrap();
        rp.synchronize().unwrap();
        assert_eq!(read0(&sim, &sink), 6.0, "fault at {k}");
        drop(rp);
        assert_eq!(sim.hazards(), [], "fault at {k}");
        assert_eq!(sim.live_events(), 0, "fault at {k}");
        assert_eq!(sim.live_allocations(), 1, "fault at {k}");
    }
}

/// A trace whose start fails at each of its calls leaves no event
/// behind, and the fence goes on; a replay that fails while a trace runs
/// shows no slice in the trace (it never ran).
#[test]
fn traces_under_faults_leak_nothing_and_show_no_work_that_never_ran() {
    let n = {
        let sim = sim::Device::new();
        let mut rp = fill_plan(&sim, 1, 1);
        calls_of(&sim, || rp.start_trace().unwrap())
    };
    for k in 0..n {
        let sim = sim::Device::new();
        let a = sim.stream();
        let mut rp = fill_plan(&sim, 1, 1);
        sim.inject(Faults::at(k));
        let _ = rp.start_trace();
        sim.inject(Faults::none());
        rp.replay(r(0), &a).unwrap();
        let _ = rp.finish_trace();
        drop(rp);
        assert_eq!(sim.live_events(), 0, "fault at {k}");
    }
    let sim = sim::Device::new();
    let (a, b) = (sim.stream(), sim.stream());
    let mut rp = fill_plan(&sim, 2, 1);
    rp.start_trace().unwrap();
    rp.replay(r(0), &a).unwrap();
    sim.inject(Faults::nth(Call::Launch, 0));
    assert!(rp.replay(r(1), &b).is_err());
    sim.inject(Faults::none());
    let trace = rp.finish_trace().unwrap();
    assert_eq!(trace.slices().len(), 1, "{:?}", trace.slices());
}

/// Allocation failing at each arena, and `Faults` at each call of
/// `allocate`: a typed error, the plan back, nothing left allocated, and
/// the plan allocates again.
#[test]
fn an_allocation_failing_at_each_call_frees_what_it_had() {
    let planned = || {
        Discovering::from_runners(PlanConfig::new(), (0..4).map(|i| (r(i), [Q])))
            .unwrap()
            .plan(Policy::Generations(3))
            .unwrap()
    };
    let n = {
        let sim = sim::Device::new();
        calls_of(&sim, || drop(planned().allocate(sim.clone()).unwrap()))
    };
    for k in 0..n {
        let sim = sim::Device::new();
        sim.inject(Faults::at(k));
        let got = planned().allocate(sim.clone());
        sim.inject(Faults::none());
        match got {
            Ok(c) => drop(c),
            Err(failed) => {
                assert_eq!(sim.live_allocations(), 0, "fault at {k}");
                assert_eq!(sim.live_events(), 0, "fault at {k}");
                drop(failed.into_planned().allocate(sim.clone()).unwrap());
            }
        }
        assert_eq!(sim.live_allocations(), 0, "fault at {k}");
        assert_eq!(sim.live_events(), 0, "fault at {k}");
    }
    for after in 0..3 {
        let sim = sim::Device::new();
        sim.fail_allocations_after(Some(after));
        assert!(planned().allocate(sim.clone()).is_err());
        sim.fail_allocations_after(None);
        assert_eq!(sim.live_allocations(), 0);
    }
}

// ---------------------------------------------------------------------
// Second round
// ---------------------------------------------------------------------

/// A replay that overwrites a consumed runner's bytes meets a fault at
/// each of its calls; a consumer of the first runner afterwards either is
/// refused (`Overwritten`) or reads the first runner's value, never the
/// second's.
#[test]
fn a_replay_failing_at_each_call_never_lets_a_consumer_read_its_bytes_as_the_old_runner() {
    let n = {
        let sim = sim::Device::new();
        let (a, b) = (sim.stream(), sim.stream());
        let mut rp = fill_plan(&sim, 2, 1);
        rp.replay(r(0), &a).unwrap();
        calls_of(&sim, || rp.replay(r(1), &b).unwrap())
    };
    for k in 0..n {
        let sim = sim::Device::new();
        let s = [sim.stream(), sim.stream(), sim.stream()];
        let sink = sim.alloc_f32(N).unwrap();
        let mut rp = fill_plan(&sim, 2, 1);
        rp.replay(r(0), &s[0]).unwrap();
        sim.inject(Faults::at(k));
        let replayed = rp.replay(r(1), &s[1]);
        sim.inject(Faults::none());
        match copy_out(&mut rp, &sim, r(0), &s[2], &sink) {
            Ok(()) => {
                rp.synchronize().unwrap();
                assert_eq!(read0(&sim, &sink), 1.0, "fault at {k}: {replayed:?}");
            }
            Err(ConsumeError::Overwritten { .. }) => {}
            Err(e) => panic!("fault at {k}: {e:?}"),
        }
        assert_eq!(sim.hazards(), [], "fault at {k}");
    }
}

/// A staging (`consume_mut` of a `Purpose::Input` runner) with a fault
/// at each of its calls, then a replay on another stream: the replay is
/// refused (`InputNotStaged`) or waits for the write and reads it.
#[test]
fn a_staging_failing_at_each_call_is_either_staged_and_waited_for_or_refused() {
    let n = {
        let sim = sim::Device::new();
        let (st, pool) = (sim.stream(), sim.stream());
        let mut rp = buckets(&sim);
        stage(&mut rp, &sim, r(0), &st, 1.0).unwrap();
        rp.replay(r(0), &pool).unwrap();
        calls_of(&sim, || stage(&mut rp, &sim, r(0), &st, 2.0).unwrap())
    };
    for k in 0..n {
        let sim = sim::Device::new();
        let (st, pool) = (sim.stream(), sim.stream());
        let mut rp = buckets(&sim);
        stage(&mut rp, &sim, r(0), &st, 1.0).unwrap();
        rp.replay(r(0), &pool).unwrap();
        sim.inject(Faults::at(k));
        let staged = stage(&mut rp, &sim, r(0), &st, 2.0);
        sim.inject(Faults::none());
        match rp.replay(r(0), &pool) {
            Ok(()) => {
                rp.synchronize().unwrap();
                let v = read0(&sim, &rp.views(r(0)).unwrap()[1]);
                if staged.is_ok() {
                    assert_eq!(v, 4.0, "fault at {k}");
                } else {
                    assert!(v == 2.0 || v == 4.0, "fault at {k}: {v}");
                }
            }
            Err(ReplayError::InputNotStaged { .. }) => assert!(staged.is_err(), "fault at {k}"),
            Err(e) => panic!("fault at {k}: {e:?}"),
        }
        assert_eq!(sim.hazards(), [], "fault at {k}");
    }
}

/// Per bucket, its staging and replay as a kept step graph: staging
/// the other bucket (per runner) takes the shared bytes, so launching
/// the first bucket's kept step again must not read the other bucket's
/// input as its own.
#[test]
fn a_kept_step_of_a_bucket_whose_input_another_bucket_took_is_refused_or_restages() {
    let sim = sim::Device::new();
    let (st, pool) = (sim.stream(), sim.stream());
    let mut rp = buckets(&sim);
    stage(&mut rp, &sim, r(0), &st, 5.0).unwrap();
    let mut kept = {
        let mut step = rp.step();
        step.replay(r(0), &pool).unwrap();
        step.build().unwrap().keep()
    };
    rp.launch_kept(&mut kept, &pool).unwrap();
    rp.synchronize().unwrap();
    assert_eq!(read0(&sim, &rp.views(r(0)).unwrap()[1]), 10.0);
    stage(&mut rp, &sim, r(1), &st, 9.0).unwrap();
    rp.replay(r(1), &pool).unwrap();
    match rp.launch_kept(&mut kept, &pool) {
        Err(StepLaunchError::Schedule(ScheduleError::Replay(ReplayError::InputNotStaged {
            ..
        }))) => {}
        Ok(()) => {
            rp.synchronize().unwrap();
            assert_eq!(
                read0(&sim, &rp.views(r(0)).unwrap()[1]),
                10.0,
                "the kept step replayed runner 0 on runner 1's input"
            );
        }
        Err(e) => panic!("{e:?}"),
    }
    assert_eq!(sim.hazards(), []);
}

/// The same through a failed staging of the other bucket (its writer
/// wrote the shared bytes, then failed).
#[test]
fn a_kept_step_of_a_bucket_after_another_bucket_failed_its_staging_does_not_read_its_bytes() {
    let sim = sim::Device::new();
    let (st, pool) = (sim.stream(), sim.stream());
    let mut rp = buckets(&sim);
    stage(&mut rp, &sim, r(0), &st, 5.0).unwrap();
    let mut kept = {
        let mut step = rp.step();
        step.replay(r(0), &pool).unwrap();
        step.build().unwrap().keep()
    };
    rp.launch_kept(&mut kept, &pool).unwrap();
    let failed = rp.consume_mut(r(1), &st, |s, v| {
        sim.launch(s, sim::Op::fill(&v[0], 9.0), 10)
            .map_err(|e| e.to_string())?;
        Err::<(), String>("the host copy failed".into())
    });
    assert!(failed.is_err());
    match rp.launch_kept(&mut kept, &pool) {
        Err(StepLaunchError::Schedule(ScheduleError::Replay(ReplayError::InputNotStaged {
            ..
        }))) => {}
        Ok(()) => {
            rp.synchronize().unwrap();
            assert_eq!(
                read0(&sim, &rp.views(r(0)).unwrap()[1]),
                10.0,
                "the kept step replayed runner 0 on a failed writer's bytes"
            );
        }
        Err(e) => panic!("{e:?}"),
    }
    assert_eq!(sim.hazards(), []);
}

/// Two kept step graphs of runners sharing bytes launched in turn on two
/// streams; one of them meets a fault at each call of a launch. The
/// other's next launch waits for whatever went out; sums are exact.
#[test]
fn two_kept_steps_alternating_with_a_fault_at_each_call_stay_ordered() {
    for overlapping in [false, true] {
        let setup =
            |sim: &sim::Device, a: &sim::Stream, b: &sim::Stream, sinks: &[sim::HostBuffer; 2]| {
                let mut rp = fill_plan(sim, 2, 1);
                let kept: Vec<_> = (0..2u32)
                    .map(|i| {
                        let mut step = rp.step();
                        step.replay(r(i), a).unwrap();
                        step.consume(r(i), b, |s, v| {
                            sim.launch(s, sim::Op::add(&v[0], &sinks[i as usize]), 40)
                        })
                        .unwrap();
                        if overlapping {
                            step.build_overlapping()
                        } else {
                            step.build()
                        }
                        .unwrap()
                        .keep()
                    })
                    .collect();
                (rp, kept)
            };
        let n = {
            let sim = sim::Device::new();
            let l = [sim.stream(), sim.stream()];
            let (a, b) = (sim.stream(), sim.stream());
            let sinks = [sim.alloc_f32(N).unwrap(), sim.alloc_f32(N).unwrap()];
            let (mut rp, mut kept) = setup(&sim, &a, &b, &sinks);
            rp.launch_kept(&mut kept[0], &l[0]).unwrap();
            calls_of(&sim, || rp.launch_kept(&mut kept[1], &l[1]).unwrap())
        };
        for k in 0..n {
            let sim = sim::Device::new();
            let l = [sim.stream(), sim.stream()];
            let (a, b) = (sim.stream(), sim.stream());
            let sinks = [sim.alloc_f32(N).unwrap(), sim.alloc_f32(N).unwrap()];
            let (mut rp, mut kept) = setup(&sim, &a, &b, &sinks);
            rp.launch_kept(&mut kept[0], &l[0]).unwrap();
            sim.inject(Faults::at(k));
            let failed = rp.launch_kept(&mut kept[1], &l[1]);
            sim.inject(Faults::none());
            rp.launch_kept(&mut kept[0], &l[0]).unwrap();
            rp.launch_kept(&mut kept[1], &l[1]).unwrap();
            rp.launch_kept(&mut kept[0], &l[1]).unwrap();
            rp.synchronize().unwrap();
            assert_eq!(sim.hazards(), [], "overlapping {overlapping}, fault at {k}");
            assert_eq!(read0(&sim, &sinks[0]), 3.0, "{overlapping} {k}");
            assert_eq!(
                read0(&sim, &sinks[1]),
                2.0 * (1.0 + failed.is_ok() as u8 as f32),
                "{overlapping} {k}"
            );
            assert_eq!(
                rp.fence_stats().step_launches,
                4 + failed.is_ok() as u64,
                "{overlapping} {k}"
            );
            drop(kept);
            drop(rp);
            assert_eq!(
                sim.live_events(),
                0,
                "overlapping {overlapping}, fault at {k}"
            );
        }
    }
}

/// The first launch of a step graph (borrowed and overlapping) meets a
/// fault at each of its calls after per-runner work on other streams:
/// the launches after it still wait for that work.
#[test]
fn a_first_step_launch_failing_at_each_call_still_waits_for_earlier_work() {
    for overlapping in [false, true] {
        let run = |k: Option<u64>| -> u64 {
            let sim = sim::Device::new();
            let s = [sim.stream(), sim.stream(), sim.stream()];
            let sink = sim.alloc_f32(N).unwrap();
            let side = sim.alloc_f32(N).unwrap();
            let mut rp = fill_plan(&sim, 2, 1);
            rp.replay(r(1), &s[2]).unwrap();
            rp.consume(r(1), &s[2], |st, v| {
                sim.launch(st, sim::Op::copy(&v[0], &side), 300)
            })
            .unwrap();
            let step = two_step(&mut rp, &sim, &s[0], &s[1], &sink);
            let mut g = if overlapping {
                step.build_overlapping()
            } else {
                step.build()
            }
            .unwrap();
            sim.inject(k.map_or(Faults::none(), Faults::at));
            let first = g.launch(&s[0]);
            let calls = sim.fault_log().calls;
            sim.inject(Faults::none());
            g.launch(&s[1]).unwrap();
            g.launch(&s[0]).unwrap();
            let launches = g.launches();
            drop(g);
            rp.synchronize().unwrap();
            assert_eq!(sim.hazards(), [], "overlapping {overlapping}, fault {k:?}");
            assert_eq!(read0(&sim, &side), 2.0);
            assert_eq!(launches, 2 + first.is_ok() as u64);
            assert_eq!(
                read0(&sim, &sink),
                3.0 * launches as f32,
                "{overlapping} {k:?}"
            );
            calls
        };
        let n = run(None);
        for k in 0..n {
            run(Some(k));
        }
    }
}

/// A kept step graph launched (long work) and forgotten, then its plan
/// dropped: teardown waits for the launches the fence knows of, so no
/// arena is freed under them (the program's host read afterwards sees
/// the consumer's value and no hazard).
#[test]
fn a_forgotten_kept_step_with_a_failed_last_launch_is_waited_for_by_teardown() {
    for call in [
        None,
        Some(Call::Launch),
        Some(Call::RecordEvent),
        Some(Call::WaitEvent),
    ] {
        let sim = sim::Device::new();
        let (a, b, c) = (sim.stream(), sim.stream(), sim.stream());
        let sink = sim.alloc_f32(N).unwrap();
        let mut rp = fill_plan(&sim, 2, 1);
        let mut kept = two_step(&mut rp, &sim, &a, &b, &sink)
            .build()
            .unwrap()
            .keep();
        rp.launch_kept(&mut kept, &a).unwrap();
        if let Some(call) = call {
            sim.inject(Faults::nth(call, 0));
        }
        let last = rp.launch_kept(&mut kept, &c);
        sim.inject(Faults::none());
        std::mem::forget(kept);
        drop(rp);
        assert_eq!(sim.live_allocations(), 1, "{call:?}: the arenas are freed");
        assert_eq!(sim.hazards(), [], "{call:?}");
        assert_eq!(
            read0(&sim, &sink),
            3.0 * (1 + last.is_ok() as u8) as f32,
            "{call:?}"
        );
    }
}

/// A repeatable capture whose second run (the step copy) panics: typed
/// capture failure, the stream not left capturing, nothing leaked after
/// replan.
#[test]
fn a_repeatable_capture_whose_copy_run_panics_fails_and_leaks_nothing() {
    let sim = sim::Device::new();
    let s = sim.stream();
    let d = Discovering::from_runners(PlanConfig::new(), [(r(0), [Q])]).unwrap();
    let mut capturing = d
        .plan(Policy::Generations(1))
        .unwrap()
        .allocate(sim.clone())
        .unwrap();
    {
        let cap = capturing.capture(r(0)).unwrap();
        let view = cap.take(Q).unwrap();
        let mut runs = 0;
        let unwound = catch_unwind(AssertUnwindSafe(|| {
            cap.stream_capture_repeatable(&s, |st| {
                runs += 1;
                let t = sim.alloc_async(st, N)?;
                sim.launch(st, sim::Op::copy(&t, &view), 20)?;
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
    sim.launch(&s, sim::Op::fill(&buf, 2.0), 1).unwrap();
    assert_eq!(
        sim.read_f32(&buf).unwrap(),
        [2.0; 4],
        "the stream is not capturing"
    );
    drop(buf);
    drop(capturing.replan());
    assert_eq!(graph_memory(&sim).used, 0);
    assert_eq!(sim.live_allocations(), 0);
    assert_eq!(sim.live_events(), 0);
    assert_eq!(sim.hazards(), []);
}

/// A consumer (reading, and a staging writer) that panics after
/// enqueuing while the record of its completion fails during the
/// unwind: no abort, no panic of the crate's own, and the next user of
/// the bytes on another stream still waits for the enqueued work.
#[test]
fn a_panicking_consumer_whose_unwind_record_fails_is_still_waited_for() {
    for k in 0..3 {
        for write in [false, true] {
            let sim = sim::Device::new();
            let s = [sim.stream(), sim.stream(), sim.stream()];
            let sink = sim.alloc_f32(N).unwrap();
            let mut rp = fill_plan(&sim, 2, 1);
            rp.replay(r(0), &s[0]).unwrap();
            sim.inject(Faults::nth(Call::RecordEvent, k));
            let mut called = false;
            let unwound = catch_unwind(AssertUnwindSafe(|| {
                if write {
                    rp.consume_mut(r(0), &s[1], |st, v| -> Result<(), String> {
                        called = true;
                        sim.launch(st, sim::Op::fill(&v[0], 7.0), 300).unwrap();
                        panic!("writer panicked")
                    })
                    .map_err(|e| format!("{e:?}"))
                } else {
                    rp.consume(r(0), &s[1], |st, v| -> Result<(), String> {
                        called = true;
                        sim.launch(st, sim::Op::copy(&v[0], &sink), 300).unwrap();
                        panic!("reader panicked")
                    })
                    .map_err(|e| format!("{e:?}"))
                }
            }));
            sim.inject(Faults::none());
            match unwound {
                // The record before the closure failed: a typed error, no call.
                Ok(res) => assert!(res.is_err() && !called, "record {k}, write {write}"),
                Err(p) => {
                    let msg = p
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .unwrap_or_default();
                    assert!(
                        called && msg.ends_with("panicked"),
                        "record {k}, write {write}: {msg}"
                    );
                }
            }
            rp.replay(r(1), &s[2]).unwrap();
            rp.synchronize().unwrap();
            assert_eq!(sim.hazards(), [], "record {k}, write {write}");
            assert_eq!(read0(&sim, &rp.views(r(1)).unwrap()[0]), 2.0);
        }
    }
}

/// A kept step graph is its plan's only: after the plan is dropped, a
/// second plan on the same device refuses it (`ForeignStep`) even after
/// a failed launch on the first plan.
#[test]
fn a_kept_step_of_a_dropped_plan_is_foreign_to_the_next_plan() {
    let sim = sim::Device::new();
    let (a, b) = (sim.stream(), sim.stream());
    let sink = sim.alloc_f32(N).unwrap();
    let mut rp = fill_plan(&sim, 2, 1);
    let mut kept = two_step(&mut rp, &sim, &a, &b, &sink)
        .build()
        .unwrap()
        .keep();
    sim.inject(Faults::nth(Call::Launch, 0));
    assert!(rp.launch_kept(&mut kept, &a).is_err());
    sim.inject(Faults::none());
    drop(rp);
    let mut next = fill_plan(&sim, 2, 1);
    assert!(matches!(
        next.launch_kept(&mut kept, &a),
        Err(StepLaunchError::ForeignStep)
    ));
    assert!(matches!(
        next.wait_kept(&kept, &b),
        Err(WaitError::ForeignStep)
    ));
    drop(kept);
    drop(next);
    assert_eq!(sim.hazards(), []);
    assert_eq!(sim.live_events(), 0);
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
    let n = {
        let sim = sim::Device::new();
        let (a, b) = (sim.stream(), sim.stream());
        let mut rp = temporaries(&sim, 2);
        calls_of(&sim, || program(&sim, &mut rp, &a, &b))
    };
    for k in 0..n {
        let sim = sim::Device::new();
        let (a, b) = (sim.stream(), sim.stream());
        let mut rp = temporaries(&sim, 2);
        sim.inject(Faults::at(k));
        program(&sim, &mut rp, &a, &b);
        sim.inject(Faults::none());
        rp.replay(r(1), &b).unwrap();
        rp.replay(r(0), &a).unwrap();
        rp.synchronize().unwrap();
        assert_eq!(
            read0(&sim, &rp.views(r(0)).unwrap()[0]),
            1.0,
            "fault at {k}"
        );
        assert_eq!(sim.hazards(), [], "fault at {k}");
        drop(rp);
        assert_eq!(graph_memory(&sim).used, 0, "fault at {k}");
        assert_eq!(sim.live_events(), 0, "fault at {k}");
        assert_eq!(sim.live_allocations(), 0, "fault at {k}");
    }
}

/// A handoff writer (no ready point: its completion is recorded after
/// the launch) meets a fault at each call, and its stream is dropped
/// right after: the reader on a fresh stream still waits for the write.
#[test]
fn a_writer_whose_stream_is_dropped_after_a_fault_still_orders_its_reader() {
    for ready in [false, true] {
        let n = {
            let mut hf = handoff(ready);
            let sim = hf.sim.clone();
            let a = sim.stream();
            calls_of(&sim, || hf.rp.replay(r(0), &a).unwrap())
        };
        for k in 0..n {
            let mut hf = handoff(ready);
            let sim = hf.sim.clone();
            let a = sim.stream();
            sim.inject(Faults::at(k));
            let wrote = hf.rp.replay(r(0), &a);
            sim.inject(Faults::none());
            drop(a);
            let b = sim.stream();
            match hf.rp.replay(r(1), &b) {
                Ok(()) => {}
                Err(ReplayError::HandoffNotWritten { .. }) => assert!(wrote.is_err(), "{k}"),
                Err(e) => panic!("ready {ready}, fault at {k}: {e:?}"),
            }
            let c = sim.stream();
            hf.rp.replay(r(0), &c).unwrap();
            hf.rp.replay(r(1), &b).unwrap();
            hf.rp.synchronize().unwrap();
            assert_eq!(sim.hazards(), [], "ready {ready}, fault at {k}");
            assert_eq!(
                read0(&sim, &hf.rp.views(r(1)).unwrap()[0]),
                read0(&sim, &hf.count)
            );
        }
    }
}

/// While a trace runs, a consumer whose wait fails leaves no slice and a
/// step launch whose launch fails leaves no launch slice (only the waits
/// that went out before it): the trace shows only work that ran.
#[test]
fn a_trace_shows_no_slice_for_a_failed_consumer_or_step_launch() {
    let sim = sim::Device::new();
    let (a, b, c) = (sim.stream(), sim.stream(), sim.stream());
    let sink = sim.alloc_f32(N).unwrap();
    let mut rp = fill_plan(&sim, 2, 1);
    rp.start_trace().unwrap();
    rp.replay(r(0), &a).unwrap();
    sim.inject(Faults::nth(Call::WaitEvent, 0));
    assert!(copy_out(&mut rp, &sim, r(0), &b, &sink).is_err());
    sim.inject(Faults::none());
    let trace = rp.finish_trace().unwrap();
    assert_eq!(trace.slices().len(), 1, "{:?}", trace.slices());
    let mut g = two_step(&mut rp, &sim, &a, &b, &sink).build().unwrap();
    g.launch(&a).unwrap();
    drop(g);
    rp.start_trace().unwrap();
    let mut g = two_step(&mut rp, &sim, &a, &b, &sink).build().unwrap();
    sim.inject(Faults::nth(Call::Launch, 0));
    assert!(g.launch(&c).is_err());
    sim.inject(Faults::none());
    drop(g);
    let trace = rp.finish_trace().unwrap();
    // The waits that went out before the failed launch stay on the device
    // (and in the trace); the launch itself is not there.
    assert!(
        trace
            .slices()
            .iter()
            .all(|s| !matches!(s.kind, replay_arena::SliceKind::StepLaunch { .. })),
        "{:?}",
        trace.slices()
    );
    assert_eq!(sim.hazards(), []);
}
