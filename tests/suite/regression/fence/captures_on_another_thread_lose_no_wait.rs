//! Captures another thread begins and ends on a replay's stream (capture
//! mode toggling under the fence) never let a replay skip its wait, and a
//! replay whose event record is refused after its launch still tracks
//! every handoff it read.
//!
//! The findings (fixed): a replay could skip its wait while another thread
//! began capturing on its stream; and a failed record after the launch
//! left the replay's handoff reads untracked (the fence now sets a
//! replay's completion before any record and goes on after a failed one).

use crate::support::steps::allocate_runners;
use crate::support::steps::plans::*;
use replay_arena::sim;
use replay_arena::{Discovering, Error, PlanConfig, Policy, RunnerId};

#[test]
fn a_capture_starting_on_another_thread_never_lets_a_replay_skip_its_wait() -> R {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let sim = sim::Device::new();
    let (s, t) = (sim.new_stream(), sim.new_stream());
    // G = 1: runner 1 waits for runner 0 on the other stream every time.
    let rs = (0..2).map(|r| (RunnerId(r), [req(16)]));
    let mut cap = Discovering::from_runners(PlanConfig::new(), rs)?
        .plan(Policy::Generations(1))?
        .allocate(sim.clone())?;
    for r in 0..2 {
        let c = cap.capture(RunnerId(r))?;
        let v = c.take(req(16))?;
        c.stream_capture(&s, |s| sim.launch(s, sim::Kernel::fill(&v, r as f32), 3))?;
        c.finish()?;
    }
    let mut a = cap.seal()?;
    let stop = Arc::new(AtomicBool::new(false));
    let capturer = {
        let (sim, s, stop) = (sim.clone(), s.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let rs = [(RunnerId(0), [req(16)])];
                let mut cap = allocate_runners(&sim, rs, Policy::Generations(1));
                let c = cap.capture(RunnerId(0)).unwrap();
                let _ = c.stream_capture(&s, |_| Ok::<(), Error>(()));
            }
        })
    };
    let start = std::time::Instant::now();
    while start.elapsed() < std::time::Duration::from_millis(1500) && sim.hazards().is_empty() {
        for (r, st) in [(0u32, &s), (1, &t)] {
            // Refusals (the stream is capturing) are fine; skipped waits
            // are not.
            let _ = a.replay(RunnerId(r), st);
        }
    }
    stop.store(true, Ordering::Relaxed);
    capturer.join().unwrap();
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards().first());
    Ok(())
}

#[test]
fn a_replay_whose_record_fails_after_its_launch_still_tracks_every_read() -> R {
    use std::sync::atomic::{AtomicBool, Ordering};
    let q = req(64);
    let mut d = Discovering::new(PlanConfig::new());
    let h0 = {
        let mut a = d.arm(RunnerId(0))?;
        a.record(q)?;
        a.hand_off(q)?
    };
    let h1 = {
        let mut a = d.arm(RunnerId(1))?;
        a.record(q)?;
        a.hand_off(q)?
    };
    {
        let mut a = d.arm(RunnerId(2))?; // reads both, no bytes of its own
        a.receive(h0)?;
        a.receive(h1)?;
    }
    let sim = sim::Device::new();
    let (sa, sb, s) = (sim.new_stream(), sim.new_stream(), sim.new_stream());
    let out = sim.alloc_f32(64)?;
    let mut cap = d.plan(Policy::Generations(2))?.allocate(sim.clone())?;
    for (r, h) in [(0u32, h0), (1, h1)] {
        let c = cap.capture(RunnerId(r))?;
        let (w, x) = (c.take(q)?, c.hand_off(h)?);
        c.stream_capture(&sa, |st| {
            sim.launch(st, sim::Kernel::fill(&x, 1.0 + r as f32), 5)?;
            sim.launch(st, sim::Kernel::fill(&w, 7.0), 5)
        })?;
        c.finish()?;
    }
    {
        let c = cap.capture(RunnerId(2))?;
        let (y0, y1) = (c.receive(h0)?, c.receive(h1)?);
        c.stream_capture(&sa, |st| {
            sim.launch(st, sim::Kernel::add(&y0, &out), 50)?;
            sim.launch(st, sim::Kernel::add(&y1, &out), 50)
        })?;
        c.finish()?;
    }
    let mut rp = cap.seal()?;
    // Another thread's captures toggle capture mode on the reader's stream.
    let n = 3000u32;
    let mut other =
        Discovering::from_runners(PlanConfig::new(), (0..n).map(|r| (RunnerId(r), [q])))?
            .plan(Policy::Generations(1))?
            .allocate(sim.clone())?;
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let (s2, stop) = (s.clone(), &stop);
        scope.spawn(move || {
            for r in 0..n {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let c = other.capture(RunnerId(r)).unwrap();
                let _v = c.take(q).unwrap();
                let _ = c.stream_capture(&s2, |_| Ok::<(), String>(()));
                let _ = c.finish();
            }
        });
        for _ in 0..2000 {
            // Refusals are fine; untracked reads are not.
            let _ = rp.replay(RunnerId(0), &sa);
            let _ = rp.replay(RunnerId(1), &sb);
            let _ = rp.replay(RunnerId(2), &s);
            if !sim.hazards().is_empty() {
                break;
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    let _ = rp.replay(RunnerId(0), &sa);
    let _ = rp.replay(RunnerId(1), &sb);
    rp.synchronize()?;
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards().first());
    Ok(())
}
