//! TODO

use std::panic::{catch_unwind, AssertUnwindSafe};

use replay_arena::sim::{self, Call, Faults};
use replay_arena::{ConsumeError, Replayable, WaitError};

use crate::support::faults::{calls_of, copy_out, fill_plan, r, read0, N};

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
