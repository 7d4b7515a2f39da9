//! The transaction rule, as a property on `sim` with a fault at a random
//! backend call of each operation: an operation that fails before its
//! launch (or its consumer's work) went out leaves the fence exactly as it
//! was (the same digest of every slot, reader, statistic and the ledger);
//! one that fails after leaves it ordering everything it launched, so no
//! schedule of them shows a hazard.

use proptest::prelude::*;

use crate::backend::sim::{self, Call, Faults};
use crate::discover::{Discovering, PlanConfig};
use crate::plan::Policy;
use crate::replay::Replayable;
use crate::step::KeptStep;
use crate::vocab::{DType, Domain, Purpose, Request, RunnerId};

const RUNNERS: u32 = 4;
const STREAMS: usize = 3;

#[derive(Clone, Debug)]
enum Op {
    Replay(u32, usize),
    Consume(u32, usize),
    Stage(usize),
    WaitFor(u32, usize),
    WaitAll(usize),
    Kept(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let r = 0..RUNNERS;
    let s = 0..STREAMS;
    prop_oneof![
        4 => (r.clone(), s.clone()).prop_map(|(r, s)| Op::Replay(r, s)),
        2 => (r.clone(), s.clone()).prop_map(|(r, s)| Op::Consume(r, s)),
        1 => s.clone().prop_map(Op::Stage),
        1 => (r, s.clone()).prop_map(|(r, s)| Op::WaitFor(r, s)),
        1 => s.clone().prop_map(Op::WaitAll),
        2 => s.prop_map(Op::Kept),
    ]
}

const CALLS: [Call; 6] = [
    Call::Launch,
    Call::RecordEvent,
    Call::WaitEvent,
    Call::CreateEvent,
    Call::CaptureStatus,
    Call::Kernel,
];

fn fault() -> impl Strategy<Value = Option<(Call, u64)>> {
    prop_oneof![
        1 => Just(None),
        3 => (0..CALLS.len(), 0..3u64).prop_map(|(c, n)| Some((CALLS[c], n))),
    ]
}

/// `RUNNERS` runners of one request each on `g` generations; runner 0
/// also reads an input the program stages. Each graph fills its views.
fn plan(sim: &sim::Device, g: usize) -> Replayable<sim::Device> {
    let q = Request::new(Domain::Device, DType::F32, 64);
    let input = q.purpose(Purpose::Input);
    let mut d = Discovering::new(PlanConfig::new());
    for r in 0..RUNNERS {
        let mut armed = d.arm(RunnerId(r)).unwrap();
        armed.record(q).unwrap();
        if r == 0 {
            armed.record(input).unwrap();
        }
    }
    let mut capturing = d
        .plan(Policy::Generations(g))
        .unwrap()
        .allocate(sim.clone())
        .unwrap();
    let s = sim.new_stream();
    for r in 0..RUNNERS {
        let cap = capturing.capture(RunnerId(r)).unwrap();
        let view = cap.take(q).unwrap();
        let staged = (r == 0).then(|| cap.take(input).unwrap());
        cap.stream_capture(&s, |s| {
            if let Some(input) = &staged {
                sim.launch(s, sim::Kernel::copy(input, &view), 3)?;
            }
            sim.launch(s, sim::Kernel::fill(&view, r as f32), 5)
        })
        .unwrap();
        cap.finish().unwrap();
    }
    capturing.seal().unwrap()
}

/// A kept step graph: every runner but the staged one, on two streams,
/// and a consumer of the last.
fn kept(sim: &sim::Device, rp: &mut Replayable<sim::Device>) -> KeptStep<sim::Device> {
    let (a, b, c) = (sim.new_stream(), sim.new_stream(), sim.new_stream());
    let sink = sim.alloc_f32(64).unwrap();
    let mut step = rp.step();
    for r in 1..RUNNERS {
        step.replay(RunnerId(r), if r % 2 == 0 { &a } else { &b })
            .unwrap();
    }
    step.consume(RunnerId(RUNNERS - 1), &c, |s, v| {
        sim.launch(s, sim::Kernel::copy(&v[0], &sink), 4)
    })
    .unwrap();
    step.build().unwrap().keep()
}

fn run(g: usize, ops: Vec<(Op, Option<(Call, u64)>)>) -> Result<(), TestCaseError> {
    let sim = sim::Device::new();
    let streams: Vec<_> = (0..STREAMS).map(|_| sim.new_stream()).collect();
    // A buffer per stream for consumers to copy into.
    let sinks: Vec<_> = (0..STREAMS).map(|_| sim.alloc_f32(64).unwrap()).collect();
    let mut rp = plan(&sim, g);
    let mut step = kept(&sim, &mut rp);
    for (op, fault) in ops {
        let before = rp.fence.digest();
        let stats = rp.fence_stats();
        let faults = fault.map_or(Faults::none(), |(call, n)| Faults::nth(call, n));
        sim.inject(faults);
        let ran = std::cell::Cell::new(false);
        let failed = match &op {
            Op::Replay(r, s) => rp.replay(RunnerId(*r), &streams[*s]).is_err(),
            Op::Consume(r, st) => rp
                .consume(RunnerId(*r), &streams[*st], |s, v| {
                    ran.set(true);
                    sim.launch(s, sim::Kernel::copy(&v[0], &sinks[*st]), 4)
                })
                .is_err(),
            Op::Stage(s) => rp
                .consume_mut(RunnerId(0), &streams[*s], |s, v| {
                    ran.set(true);
                    sim.launch(s, sim::Kernel::fill(&v[1], 7.0), 2)
                })
                .is_err(),
            Op::WaitFor(r, s) => rp.wait_for(RunnerId(*r), &streams[*s]).is_err(),
            Op::WaitAll(s) => rp.wait_all(&streams[*s]).is_err(),
            Op::Kept(s) => rp.launch_kept(&mut step, &streams[*s]).is_err(),
        };
        sim.inject(Faults::none());
        let after = rp.fence_stats();
        let went_out = ran.get()
            || after.replays != stats.replays
            || after.step_launches != stats.step_launches;
        if failed && !went_out {
            prop_assert_eq!(&before, &rp.fence.digest(), "{:?} with {:?}", op, fault);
        }
        prop_assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    }
    drop(step);
    drop(rp);
    prop_assert!(sim.hazards().is_empty());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_failed_operation_leaves_the_fence_as_it_was_or_orders_what_went_out(
        g in 1..=2usize,
        ops in prop::collection::vec((op(), fault()), 1..24),
    ) {
        run(g, ops)?;
    }
}
