//! Finding: `Replayable::start_trace_with_capacity(usize::MAX)` allocated
//! marks until memory ran out. It now refuses more than
//! `Replayable::MAX_TRACE_CAPACITY` uses with
//! `TraceError::CapacityTooLarge { uses, max }`. Guards the refusal (and
//! that it leaves a running trace running) and that a trace at the maximum
//! is accepted, restarted and cleaned up.

use std::panic::{catch_unwind, AssertUnwindSafe};

use replay_arena::sim;
use replay_arena::{Replayable, TraceError};

use crate::support::faults::assert_nodes_inside_launches;
use crate::support::faults::chain::{chain_with, plain};
use crate::support::faults::fan::{all, fan, identity, Spec};

#[test]
fn a_trace_capacity_beyond_memory_is_a_typed_error_not_a_panic() {
    let mut c = chain_with(2, 1, 1, &mut plain);
    let mut r = c.replayable.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let res = catch_unwind(AssertUnwindSafe(|| {
            r.start_trace_with_capacity(usize::MAX).is_err()
        }));
        let _ = tx.send(res.ok());
        drop(r);
    });
    // Give it a few seconds: a typed error needs no time at all.
    match rx.recv_timeout(std::time::Duration::from_secs(3)) {
        Ok(Some(true)) => {}
        Ok(Some(false)) => panic!("an impossible capacity was accepted"),
        Ok(None) => panic!("the library panicked"),
        Err(_) => {
            // Still allocating: stop the process before it exhausts memory.
            eprintln!("start_trace_with_capacity(usize::MAX) did not return within 3 s");
            std::process::exit(101);
        }
    }
}

#[test]
fn a_trace_capacity_beyond_the_maximum_is_a_typed_error() {
    let spec = Spec::new(2);
    let mut f = fan(&spec, &identity(2));
    let max = Replayable::<sim::Device>::MAX_TRACE_CAPACITY;
    for uses in [max + 1, max.saturating_mul(2), usize::MAX, usize::MAX / 2] {
        let err = f.r().start_trace_with_capacity(uses).unwrap_err();
        assert!(
            matches!(err, TraceError::CapacityTooLarge { uses: s, max: m } if s == uses && m == max),
            "{err}"
        );
        // No trace started.
        assert!(matches!(f.r().finish_trace(), Err(TraceError::NoTrace)));
    }
    // A refused capacity while a trace runs leaves that trace running.
    f.r().start_trace_with_capacity(4).unwrap();
    let items = all(&spec);
    f.per_runner(&items);
    assert!(f.r().start_trace_with_capacity(usize::MAX).is_err());
    f.per_runner(&items);
    let t = f.r().finish_trace().unwrap();
    assert!(!t.uses().is_empty());
    f.hazard_free();
    f.teardown();
}

#[test]
fn a_trace_at_the_maximum_capacity_is_accepted_and_cleaned_up() {
    let spec = Spec::new(2);
    let mut f = fan(&spec, &identity(2));
    let max = Replayable::<sim::Device>::MAX_TRACE_CAPACITY;
    let start = std::time::Instant::now();
    f.r().start_trace_with_capacity(max).unwrap();
    assert!(start.elapsed().as_secs() < 10, "{:?}", start.elapsed());
    let items = all(&spec);
    f.per_runner(&items);
    let mut kept = f.build(&items, false).unwrap();
    let s = f.streams.clone();
    f.r().launch_kept(&mut kept, &s[0]).unwrap();
    // Restarted while launched work is in flight, at capacity again.
    f.r().start_trace_with_capacity(max).unwrap();
    f.r().launch_kept(&mut kept, &s[1]).unwrap();
    let t = f.r().finish_trace().unwrap();
    assert_nodes_inside_launches(&t);
    drop(kept);
    // A trace left running at teardown.
    f.r().start_trace_with_capacity(max).unwrap();
    f.hazard_free();
    f.teardown();
}
