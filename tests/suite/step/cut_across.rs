//! A step copy cut where a temporary lives across its ready point, as the
//! capture chose (`RunnerCapture::cut_across_temporaries`): the reader of
//! the handoff starts at the ready point, the choice is reported, and the
//! step stays as ordered as a whole copy's.

use crate::support::faults::chain_of;
use replay_arena::sim;
use replay_arena::{Cut, DType, Domain, Policy, Request, RunnerId};

const N: usize = 64;
const OWN: Request = Request::new(Domain::Device, DType::F32, N as u64);

/// A writer whose temporary lives across its ready point (5 ticks before
/// it, 200 after), and a reader of its handoff (5 ticks) on another
/// stream; cut across when `across`. The step's span in ticks, and what
/// the writer's copy decided.
fn step_span(across: bool) -> (u64, Cut) {
    let (d, handoffs) = chain_of(2, OWN, OWN);
    let h = handoffs[0];
    let sim = sim::Device::new();
    let s = [sim.new_stream(), sim.new_stream()];
    let planned = d.plan(Policy::Generations(2)).unwrap();
    let mut capturing = planned.allocate(sim.clone()).unwrap();
    {
        let cap = capturing.capture(RunnerId(0)).unwrap();
        let (own, out) = (cap.take(OWN).unwrap(), cap.hand_off(h).unwrap());
        if across {
            cap.cut_across_temporaries();
        }
        cap.stream_capture_repeatable(&s[0], |st| {
            let t = sim.alloc_async(st, N)?;
            sim.launch(st, sim::Kernel::fill(&t, 2.0), 5)?;
            sim.launch(st, sim::Kernel::copy(&t, &out), 1)?;
            cap.ready(h, st)?;
            sim.launch(st, sim::Kernel::copy(&t, &own), 200)?;
            sim.free_async(st, &t)?;
            Ok::<(), replay_arena::Error>(())
        })
        .unwrap();
        cap.finish().unwrap();
    }
    {
        let cap = capturing.capture(RunnerId(1)).unwrap();
        let (own, input) = (cap.take(OWN).unwrap(), cap.receive(h).unwrap());
        cap.stream_capture(&s[1], |st| {
            sim.launch(st, sim::Kernel::copy(&input, &own), 5)
        })
        .unwrap();
        cap.finish().unwrap();
    }
    let mut rp = capturing.seal().unwrap();
    let decided = rp.ready_points(RunnerId(0)).unwrap().to_vec();
    assert_eq!(decided.len(), 1);
    assert_eq!(decided[0].0, h);
    let start = sim.makespan();
    {
        let mut step = rp.step();
        step.replay(RunnerId(0), &s[0]).unwrap();
        step.replay(RunnerId(1), &s[1]).unwrap();
        let mut graph = step.build().unwrap();
        assert_eq!(graph.nodes(), if across { 3 } else { 2 });
        graph.launch(&s[0]).unwrap();
    }
    rp.synchronize().unwrap();
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    let value = |r: u32| sim.read_f32(&rp.views(RunnerId(r)).unwrap()[0]).unwrap()[0];
    assert_eq!((value(0), value(1)), (2.0, 2.0));
    (sim.makespan() - start, decided[0].1)
}

#[test]
fn a_copy_cut_across_its_temporaries_lets_the_reader_start_at_the_ready_point() {
    let bytes = N as u64 * 4;
    let (whole, kept) = step_span(false);
    assert_eq!(kept, Cut::TemporariesAcross { bytes });
    assert!(!kept.is_cut());
    // Whole: the reader waits for the writer's 206 ticks, then runs 5.
    assert!(whole >= 206 + 5, "{whole}");
    let (cut, chosen) = step_span(true);
    assert_eq!(chosen, Cut::Across { bytes });
    assert!(chosen.is_cut() && !chosen.is_clean());
    assert!(chosen.to_string().contains("as chosen"), "{chosen}");
    // Cut: the reader runs beside the writer's tail.
    assert!(cut <= 206 + 1, "{cut}");
}
