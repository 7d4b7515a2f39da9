//! A graph whose raw span now names a plan's arena (the span's memory freed
//! and the arena allocated over it) is refused at replay.

use crate::support::capture_view;
use crate::support::steps::fence::*;
use replay_arena::sim;
use replay_arena::RunnerId;

#[test]
fn a_graph_whose_raw_span_now_names_a_plans_arena_is_refused_at_replay() {
    // The program captures a raw span of its own buffer, then frees it; a
    // later plan's arena may get the address. Retried until it does.
    let reused = (0..50).any(|_| {
        let sim = sim::Device::new();
        let (a, b) = (sim.new_stream(), sim.new_stream());
        let x = sim.alloc_f32(64).unwrap();
        let addr = replay_arena::sim::AsSpan::span(&x).addr();
        let mut capturing = on_sim(&sim, &[F32_64]);
        capture_view(&mut capturing, RunnerId(0), F32_64, &a, |s, view| {
            sim.launch(s, sim::Kernel::fill(&view, 1.0), 10)?;
            sim.launch(
                s,
                sim::Kernel::fill(&replay_arena::sim::Span::new(addr, 64), 77.0),
                10,
            )
        });
        let mut pb = capturing.seal().unwrap();
        drop(x);
        let mut pa = one_runner(&sim, &b, 2.0);
        let arena = pa.views(RunnerId(0)).unwrap()[0].device_address();
        pa.replay(RunnerId(0), &b).unwrap();
        let replayed = pb.replay(RunnerId(0), &a);
        if arena != addr {
            return false;
        }
        let err = replayed.unwrap_err();
        assert!(err.to_string().contains("lie in a plan's arena"), "{err}");
        let v = pa.views(RunnerId(0)).unwrap()[0];
        assert_eq!(sim.read_f32(&v).unwrap(), vec![2.0; 64]);
        assert!(sim.hazards().is_empty());
        true
    });
    assert!(reused, "the allocator never handed the address out again");
}
