//! Faults in handoffs: a handoff writer or reader whose launch fails, a
//! fault at each call of the writer (with and without a ready point), its
//! stream dropped after the fault, and a kept step launched after it.
//! Guards that a failed write does not count as a write, a failed read
//! does not mark the handoff read, and the reader stays ordered after the
//! writer. An attack that found no hole.

use crate::support::record_and_finish;
use replay_arena::sim::{self, Call, Faults};
use replay_arena::Policy;
use replay_arena::{HandoffId, ReplayError, Replayable};

use crate::support::faults::{at_each_call, chain_of, r, read0, under, Attack, N, Q};
use crate::support::steps::allocate_discovered;

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
    let (d, handoffs) = chain_of(2, Q, Q);
    let h: HandoffId = handoffs[0];
    let one = sim.alloc_f32(N).unwrap();
    sim.write_f32(&one, &[1.0; N]).unwrap();
    let count = sim.alloc_f32(N).unwrap();
    let mut capturing = allocate_discovered(&sim, d, Policy::Generations(1));
    let s = sim.new_stream();
    {
        let cap = capturing.capture(r(0)).unwrap();
        let (w, dx) = (cap.take(Q).unwrap(), cap.hand_off(h).unwrap());
        record_and_finish!(cap, &s, |s| {
            sim.launch(s, sim::Kernel::add(&one, &count), 1)?;
            sim.launch(s, sim::Kernel::copy(&count, &dx), 5)?;
            if ready {
                cap.ready(h, s)?;
            }
            sim.launch(s, sim::Kernel::fill(&w, 1.0), 50)?;
            Ok::<(), replay_arena::Error>(())
        });
    }
    {
        let cap = capturing.capture(r(1)).unwrap();
        let (w, dy) = (cap.take(Q).unwrap(), cap.receive(h).unwrap());
        record_and_finish!(cap, &s, |s| sim.launch(s, sim::Kernel::copy(&dy, &w), 5));
    }
    Handoff {
        rp: capturing.seal().unwrap(),
        sim,
        count,
        _one: one,
    }
}

impl Handoff {
    /// The first element of the reader's view.
    fn read(&self) -> f32 {
        read0(&self.sim, &self.rp.views(r(1)).unwrap()[0])
    }

    /// Once synchronized: no hazard, and the reader holds the writer's
    /// last count.
    fn assert_reader_holds_the_count(&mut self, what: &str) {
        self.rp.synchronize().unwrap();
        assert_eq!(self.sim.hazards(), [], "{what}");
        assert_eq!(self.read(), read0(&self.sim, &self.count), "{what}");
    }
}

/// `test(ready, handoff(ready), streams)` for a writer with and without a
/// ready point, with two new streams of its device.
fn each_writer(mut test: impl FnMut(bool, Handoff, [sim::Stream; 2])) {
    for ready in [false, true] {
        let hf = handoff(ready);
        let s = [hf.sim.new_stream(), hf.sim.new_stream()];
        test(ready, hf, s);
    }
}

/// [`each_writer`], each with a fault at each call of what the test
/// attacks (`at_each_call`).
fn each_writer_at_each_call(test: impl Fn(String, &Attack, Handoff, [sim::Stream; 2])) {
    for ready in [false, true] {
        at_each_call(|attack| {
            let hf = handoff(ready);
            let s = [hf.sim.new_stream(), hf.sim.new_stream()];
            test(format!("ready {ready}, {attack}"), attack, hf, s);
        });
    }
}

/// A writer replay whose launch fails wrote nothing: its reader, which
/// already read the last write, may not read it again.
#[test]
fn a_handoff_writer_whose_launch_fails_does_not_count_as_a_write() {
    each_writer(|ready, mut hf, [a, b]| {
        let sim = hf.sim.clone();
        hf.rp.replay(r(0), &a).unwrap();
        hf.rp.replay(r(1), &b).unwrap();
        let before = hf.rp.fence_stats();
        under(&sim, Faults::nth(Call::Launch, 0), || {
            assert!(hf.rp.replay(r(0), &a).is_err())
        });
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
        assert_eq!(hf.read(), 2.0);
        assert_eq!(read0(&sim, &hf.count), 2.0);
        assert_eq!(sim.hazards(), []);
    });
}

/// A reader replay whose launch fails read nothing: it reads the same
/// write next time.
#[test]
fn a_handoff_reader_whose_launch_fails_is_not_marked_read() {
    each_writer(|_, mut hf, [a, b]| {
        let sim = hf.sim.clone();
        hf.rp.replay(r(0), &a).unwrap();
        under(&sim, Faults::nth(Call::Launch, 0), || {
            assert!(hf.rp.replay(r(1), &b).is_err())
        });
        hf.rp.replay(r(1), &b).unwrap();
        hf.rp.synchronize().unwrap();
        assert_eq!(hf.read(), 1.0);
        assert_eq!(sim.hazards(), []);
    });
}

/// A fault at every call of a writer's replay (launch included, and the
/// records after it), then its reader on another stream and the writer
/// again on a third: no hazard, values in range, the program carries on.
#[test]
fn a_fault_at_each_call_of_a_handoff_writer_keeps_its_reader_ordered() {
    each_writer_at_each_call(|what, attack, mut hf, [first_stream, reader]| {
        let sim = hf.sim.clone();
        let third = sim.new_stream();
        hf.rp.replay(r(0), &first_stream).unwrap();
        hf.rp.replay(r(1), &reader).unwrap();
        let first = attack.on_ok(&sim, || hf.rp.replay(r(0), &first_stream));
        let second = hf.rp.replay(r(1), &reader);
        if first.is_ok() {
            second.unwrap();
        }
        hf.rp.replay(r(0), &third).unwrap();
        hf.rp.replay(r(1), &reader).unwrap();
        hf.assert_reader_holds_the_count(&what);
        drop(hf.rp);
        assert_eq!(sim.live_events(), 0, "{what}");
    });
}

/// A handoff writer (no ready point: its completion is recorded after
/// the launch) meets a fault at each call, and its stream is dropped
/// right after: the reader on a fresh stream still waits for the write.
#[test]
fn a_writer_whose_stream_is_dropped_after_a_fault_still_orders_its_reader() {
    each_writer_at_each_call(|what, attack, mut hf, [a, b]| {
        let sim = hf.sim.clone();
        let wrote = attack.on_ok(&sim, || hf.rp.replay(r(0), &a));
        drop(a);
        match hf.rp.replay(r(1), &b) {
            Ok(()) => {}
            Err(ReplayError::HandoffNotWritten { .. }) => assert!(wrote.is_err(), "{attack}"),
            Err(e) => panic!("{what}: {e:?}"),
        }
        let c = sim.new_stream();
        hf.rp.replay(r(0), &c).unwrap();
        hf.rp.replay(r(1), &b).unwrap();
        hf.assert_reader_holds_the_count(&what);
    });
}

/// A kept step graph launched on `a`, then a per-runner replay on `b`
/// with a fault at each of its calls: the kept step's next launch waits
/// for whatever of that replay went out.
#[test]
fn a_kept_launch_after_a_replay_failing_at_each_call_waits_for_what_went_out() {
    each_writer_at_each_call(|what, attack, mut hf, [a, b]| {
        let sim = hf.sim.clone();
        let mut step = hf.rp.step();
        step.replay(r(0), &a).unwrap();
        step.replay(r(1), &a).unwrap();
        let mut kept = step.build().unwrap().keep();
        hf.rp.launch_kept(&mut kept, &a).unwrap();
        let _ = attack.on_ok(&sim, || hf.rp.replay(r(0), &b));
        hf.rp.launch_kept(&mut kept, &a).unwrap();
        hf.assert_reader_holds_the_count(&what);
    });
}
