//! Faults in waits and consumers (`docs/safety.md`, "Every operation is a
//! transaction"): a fault at each backend call of `replay`, `consume`,
//! `consume_many`, `wait_for` and `wait_all` on one to three streams, and
//! consumers that fail or panic after enqueuing. Guards that a failed
//! operation counts nothing, that later users of the bytes still wait for
//! whatever went out, and that teardown leaks nothing. An attack that
//! found no hole.

use std::panic::{catch_unwind, AssertUnwindSafe};

use replay_arena::sim::{self, Call, Faults};
use replay_arena::{ConsumeError, Replayable, WaitError};

use crate::support::attacks::{assert_summed, two_runners};
use crate::support::faults::{assert_clean, at_each_call, copy_out, fill_plan, r, read0, under, N};

/// [`two_runners`] on three streams, runner 0 replayed on the first.
fn runner_0_replayed() -> (
    sim::Device,
    [sim::Stream; 3],
    sim::HostBuffer,
    Replayable<sim::Device>,
) {
    let (sim, s, sink, mut rp) = two_runners::<3>();
    rp.replay(r(0), &s[0]).unwrap();
    (sim, s, sink, rp)
}

/// A fault at every call of a three-stream program of replays, consumers
/// and `wait_all` (runners sharing bytes): no hazard, the program carries
/// on with exact values, teardown leaks nothing.
#[test]
fn a_fault_at_each_call_of_a_three_stream_program_leaves_no_hazard_and_no_leak() {
    let n = at_each_call(|attack| {
        let (sim, s, sink, mut rp) = two_runners::<3>();
        attack.on(&sim, || {
            let _ = rp.replay(r(0), &s[0]);
            let _ = copy_out(&mut rp, &sim, r(0), &s[1], &sink);
            let _ = rp.replay(r(1), &s[2]);
            let _ = copy_out(&mut rp, &sim, r(1), &s[0], &sink);
            let _ = rp.wait_all(&s[2]);
            let _ = rp.replay(r(0), &s[1]);
            let _ = rp.wait_for(r(0), &s[2]);
        });
        assert_eq!(sim.hazards(), [], "{attack}");
        // Carry on.
        rp.replay(r(1), &s[1]).unwrap();
        copy_out(&mut rp, &sim, r(1), &s[2], &sink).unwrap();
        rp.replay(r(0), &s[0]).unwrap();
        copy_out(&mut rp, &sim, r(0), &s[1], &sink).unwrap();
        assert_summed((&rp, &sim), &sink, 1.0, &attack.to_string());
        drop(rp);
        assert_clean(&sim, 1, format_args!("{attack}: only the sink"));
    });
    assert!(n > 5);
}

/// `wait_for` whose wait (or the record it needs) fails counts no wait
/// and no record: the statistics are as before.
#[test]
fn a_failed_wait_for_counts_nothing() {
    for call in [Call::RecordEvent, Call::WaitEvent] {
        let sim = sim::Device::new();
        let (a, b) = (sim.new_stream(), sim.new_stream());
        let mut rp = fill_plan(&sim, 1, 1);
        rp.replay(r(0), &a).unwrap();
        let before = rp.fence_stats();
        let failed = under(&sim, Faults::nth(call, 0), || rp.wait_for(r(0), &b));
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
    let s = [sim.new_stream(), sim.new_stream(), sim.new_stream()];
    let w = sim.new_stream();
    let mut rp = fill_plan(&sim, 3, 3);
    for i in 0..3 {
        rp.replay(r(i), &s[i as usize]).unwrap();
    }
    let before = rp.fence_stats();
    under(&sim, Faults::nth(Call::WaitEvent, 1), || {
        assert!(matches!(rp.wait_all(&w), Err(WaitError::Backend(_))))
    });
    assert_eq!(rp.fence_stats(), before);
    rp.wait_all(&w).unwrap();
    let out = sim.alloc_f32(N).unwrap();
    rp.consume(r(2), &w, |s, v| {
        sim.launch(s, sim::Kernel::copy(&v[0], &out), 1)
    })
    .unwrap();
    assert_summed((&rp, &sim), &out, 3.0, "after the wait");
}

/// `consume_many` whose wait for its second runner fails: the closure is
/// not called, nothing is counted.
#[test]
fn a_consume_many_failing_at_its_second_wait_calls_nothing_and_counts_nothing() {
    let sim = sim::Device::new();
    let s = [sim.new_stream(), sim.new_stream(), sim.new_stream()];
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
            sim.launch(st, sim::Kernel::add(&v[0], &sink), 5)?;
        }
        Ok::<(), replay_arena::BackendError>(())
    })
    .unwrap();
    assert_summed((&rp, &sim), &sink, 3.0, "both consumed");
}

/// A consumer that enqueues a long read and then fails: a replay on a
/// third stream that overwrites the bytes waits for the read, and the
/// consumer is not counted.
#[test]
fn a_consumer_failing_after_enqueuing_is_waited_for_on_a_third_stream() {
    let (sim, s, sink, mut rp) = runner_0_replayed();
    let consumers = rp.fence_stats().consumers;
    let failed = rp.consume(r(0), &s[1], |st, v| {
        sim.launch(st, sim::Kernel::copy(&v[0], &sink), 500)
            .map_err(|e| e.to_string())?;
        Err::<(), String>("the collective failed".into())
    });
    assert!(matches!(failed, Err(ConsumeError::Work(_))));
    assert_eq!(rp.fence_stats().consumers, consumers);
    rp.replay(r(1), &s[2]).unwrap();
    assert_summed((&rp, &sim), &sink, 1.0, "the read saw runner 0's bytes");
}

/// A writing consumer that writes and panics: the next replay of a runner
/// sharing the bytes on another stream waits for the write; nothing is
/// counted; the stream is usable after the unwind.
#[test]
fn a_writing_consumer_panicking_after_its_write_is_waited_for() {
    let (sim, s, sink, mut rp) = runner_0_replayed();
    let consumers = rp.fence_stats().consumers;
    let unwound = catch_unwind(AssertUnwindSafe(|| {
        rp.consume_mut(r(0), &s[1], |st, v| -> Result<(), String> {
            sim.launch(st, sim::Kernel::fill(&v[0], 7.0), 500).unwrap();
            panic!("the program's writer panicked")
        })
    }));
    assert!(unwound.is_err());
    assert_eq!(rp.fence_stats().consumers, consumers);
    rp.replay(r(1), &s[2]).unwrap();
    rp.synchronize().unwrap();
    assert_eq!(read0(&sim, &rp.views(r(1)).unwrap()[0]), 2.0);
    // The stream of the panicking consumer works.
    copy_out(&mut rp, &sim, r(1), &s[1], &sink).unwrap();
    assert_summed((&rp, &sim), &sink, 2.0, "after the unwind");
}

/// A consumer whose own completion record (after the closure succeeded)
/// fails: the error is typed, and a replay overwriting the bytes on
/// another stream still waits for the consumer's read.
#[test]
fn a_consumer_whose_completion_record_fails_is_still_waited_for() {
    for k in 0..4 {
        let (sim, s, sink, mut rp) = runner_0_replayed();
        sim.inject(Faults::nth(Call::RecordEvent, k));
        let _ = rp.consume(r(0), &s[1], |st, v| {
            sim.launch(st, sim::Kernel::copy(&v[0], &sink), 500)
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
            let (sim, s, sink, mut rp) = runner_0_replayed();
            sim.inject(Faults::nth(Call::RecordEvent, k));
            let mut called = false;
            let unwound = catch_unwind(AssertUnwindSafe(|| {
                if write {
                    rp.consume_mut(r(0), &s[1], |st, v| -> Result<(), String> {
                        called = true;
                        sim.launch(st, sim::Kernel::fill(&v[0], 7.0), 300).unwrap();
                        panic!("writer panicked")
                    })
                    .map_err(|e| format!("{e:?}"))
                } else {
                    rp.consume(r(0), &s[1], |st, v| -> Result<(), String> {
                        called = true;
                        sim.launch(st, sim::Kernel::copy(&v[0], &sink), 300)
                            .unwrap();
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
    at_each_call(|attack| {
        let (sim, s, sink, mut rp) = runner_0_replayed();
        let replayed = attack.on_ok(&sim, || rp.replay(r(1), &s[1]));
        match copy_out(&mut rp, &sim, r(0), &s[2], &sink) {
            Ok(()) => {
                rp.synchronize().unwrap();
                assert_eq!(read0(&sim, &sink), 1.0, "{attack}: {replayed:?}");
            }
            Err(ConsumeError::Overwritten { .. }) => {}
            Err(e) => panic!("{attack}: {e:?}"),
        }
        assert_eq!(sim.hazards(), [], "{attack}");
    });
}
