//! What a framework needs to graph its own ops, on the `sim` model:
//! completion the program can wait on, and temporaries inside a runner's
//! graph (balanced allocation and free nodes).

use crate::support::capture_view;
use crate::support::record_and_finish;
use crate::support::steps::allocate_runners;
use replay_arena::sim;
use replay_arena::{CaptureError, DType, Domain, Policy, Replayable, Request, RunnerId};

/// One runner recording `requests`, planned in one generation and
/// allocated on `sim`.
fn on_sim(sim: &sim::Device, requests: &[Request]) -> replay_arena::Capturing<sim::Device> {
    allocate_runners(
        sim,
        [(RunnerId(0), requests.iter().copied())],
        Policy::Generations(1),
    )
}

const REQ: Request = Request::new(Domain::Device, DType::F32, 64);

/// Two runners in two generations, each filling its view with `r + 1`,
/// replayed on two pool streams; each consumer adds its runner's view into
/// the main grad (slow, on its own side stream). Returns the optimizer
/// stream and the main grad.
fn step(wait: impl Fn(&mut Replayable<sim::Device>, &sim::Stream)) -> (sim::Device, Vec<f32>) {
    let sim = sim::Device::new();
    let rs = (0..2).map(|r| (RunnerId(r), [REQ]));
    let mut capturing = allocate_runners(&sim, rs, Policy::Generations(2));
    let pool = [sim.new_stream(), sim.new_stream()];
    let side = [sim.new_stream(), sim.new_stream()];
    let optimizer = sim.new_stream();
    for r in 0..2u32 {
        let cap = capturing.capture(RunnerId(r)).unwrap();
        let v = cap.take(REQ).unwrap();
        record_and_finish!(cap, &pool[r as usize], |s| {
            sim.launch(s, sim::Kernel::fill(&v, r as f32 + 1.0), 5)
        });
    }
    let mut replayable = capturing.seal().unwrap();
    let main: [sim::HostBuffer; 2] = [sim.alloc_f32(64).unwrap(), sim.alloc_f32(64).unwrap()];
    for r in 0..2usize {
        replayable.replay(RunnerId(r as u32), &pool[r]).unwrap();
        replayable
            .consume(RunnerId(r as u32), &side[r], |s, v| {
                sim.launch(s, sim::Kernel::add(&v[0], &main[r]), 100)
            })
            .unwrap();
    }
    wait(&mut replayable, &optimizer);
    // The optimizer step reads both main grads.
    sim.launch(&optimizer, sim::Kernel::add(&main[0], &main[1]), 1)
        .unwrap();
    let out = sim.read_f32(&main[1]).unwrap();
    (sim, out)
}

#[test]
fn wait_all_orders_the_program_after_every_consumer() {
    let (sim, out) = step(|rp, s| rp.wait_all(s).unwrap());
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    assert_eq!(out, vec![3.0; 64]);
}

#[test]
fn without_a_wait_the_optimizer_races_the_consumers() {
    let (sim, _) = step(|_, _| {});
    assert!(!sim.hazards().is_empty());
}

#[test]
fn wait_for_one_runner_covers_that_runner_only() {
    let (sim, _) = step(|rp, s| rp.wait_for(RunnerId(1), s).unwrap());
    let hazards = sim.hazards();
    assert!(!hazards.is_empty(), "runner 0's consumer is not covered");
    let (sim, out) = step(|rp, s| {
        rp.wait_for(RunnerId(0), s).unwrap();
        rp.wait_for(RunnerId(1), s).unwrap();
    });
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    assert_eq!(out, vec![3.0; 64]);
}

#[test]
fn waiting_for_an_unknown_runner_is_a_typed_error() {
    step(|rp, s| {
        let err = rp.wait_for(RunnerId(9), s).unwrap_err();
        assert_eq!(
            err,
            replay_arena::WaitError::UnknownRunner {
                runner: RunnerId(9)
            }
        );
        rp.wait_all(s).unwrap();
    });
    let _ = CaptureError::NestedCapture {
        runner: RunnerId(0),
    };
}

/// A framework op: allocates its output inside the capture (an allocation
/// node), as `stream.alloc_zeros` does, and writes `src * 2` into it.
fn scaled(
    sim: &sim::Device,
    s: &sim::Stream,
    src: &impl replay_arena::sim::AsSpan,
    len: usize,
) -> Result<replay_arena::sim::Span, replay_arena::BackendError> {
    let out = sim.alloc_async(s, len)?;
    sim.launch(s, sim::Kernel::copy(src, &out), 2)?;
    sim.launch(s, sim::Kernel::scale(&out, 2.0), 2)?;
    Ok(out)
}

#[test]
fn temporaries_allocated_and_freed_inside_a_graph_are_accepted_and_replay_exactly() {
    let sim = sim::Device::new();
    let stream = sim.new_stream();
    let input = sim.alloc_f32(64).unwrap();
    sim.write_f32(&input, &[1.5; 64]).unwrap();
    let mut capturing = on_sim(&sim, &[REQ]);
    capture_view(&mut capturing, RunnerId(0), REQ, &stream, |s, wgrad| {
        // Two ops with intermediates, dropped before the capture ends.
        let t1 = scaled(&sim, s, &input, 64)?;
        let t2 = scaled(&sim, s, &t1, 64)?;
        sim.free_async(s, &t1)?;
        sim.launch(s, sim::Kernel::copy(&t2, &wgrad), 1)?;
        sim.free_async(s, &t2)
    });
    let live = sim.live_allocations();
    let mut replayable = capturing.seal().unwrap();
    for _ in 0..5 {
        replayable.replay(RunnerId(0), &stream).unwrap();
    }
    let view = replayable.views(RunnerId(0)).unwrap()[0];
    assert_eq!(sim.read_f32(&view).unwrap(), vec![6.0; 64]);
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    drop(replayable);
    assert!(
        sim.live_allocations() < live,
        "the graph's temporaries go with it"
    );
    drop(input);
    assert_eq!(sim.live_allocations(), 0);
}

#[test]
fn a_capture_that_fails_frees_its_temporaries() {
    let sim = sim::Device::new();
    let stream = sim.new_stream();
    let mut capturing = on_sim(&sim, &[REQ]);
    let arenas = sim.live_allocations();
    let cap = capturing.capture(RunnerId(0)).unwrap();
    let _ = cap.take(REQ).unwrap();
    let err = cap.stream_capture(&stream, |s| {
        sim.alloc_async(s, 64)?;
        Err::<(), _>(replay_arena::BackendError::Refused {
            call: "op",
            reason: "failed".into(),
        })
    });
    assert!(err.is_err());
    assert_eq!(sim.live_allocations(), arenas);
}

// ---- views and consumers shaped for bucketed reduce-scatter --------------------

#[test]
fn sub_views_keep_the_closure_and_the_fence() {
    let sim = sim::Device::new();
    let stream = sim.new_stream();
    let bucket = Request::new(Domain::Device, DType::F32, 128);
    let mut capturing = on_sim(&sim, &[bucket]);
    let cap = capturing.capture(RunnerId(0)).unwrap();
    let view = cap.take(bucket).unwrap();
    let (a, b) = view.split_at(48).unwrap();
    assert_eq!(b.device_address(), view.device_address() + 4 * 48);
    assert_eq!(
        (a.dtype(), b.domain(), b.runner()),
        (DType::F32, Domain::Device, RunnerId(0))
    );
    assert_eq!(b.alignment(), 64);
    let err = view.slice(100..129).unwrap_err();
    assert_eq!((err.start, err.end, err.len), (100, 129, 128));
    assert!(view.split_at(0).is_err() && view.split_at(128).is_err());
    cap.stream_capture(&stream, |s| {
        sim.launch(s, sim::Kernel::fill(&a, 1.0), 1)?;
        sim.launch(s, sim::Kernel::fill(&b, 2.0), 1)
    })
    .unwrap();
    // Out of its closure, a sub-view is as refused as its view.
    let outside = sim.launch(&stream, sim::Kernel::fill(&b, 9.0), 1);
    let reason = replay_arena::Misuse::OutsideClosure {
        request: b.request(),
        runner: RunnerId(0),
    };
    assert_eq!(
        outside,
        Err(replay_arena::BackendError::InvalidView { reason })
    );
    let err = outside.unwrap_err().to_string();
    assert!(err.contains("outside the work closure"), "{err}");
    cap.finish().unwrap();
    let mut replayable = capturing.seal().unwrap();
    replayable.replay(RunnerId(0), &stream).unwrap();
    let whole = replayable.views(RunnerId(0)).unwrap()[0];
    let got = sim.read_f32(&whole).unwrap();
    assert_eq!(&got[..48], &[1.0; 48][..]);
    assert_eq!(&got[48..], &[2.0; 80][..]);
}

#[test]
fn consumers_find_views_by_request_purpose_and_parameter() {
    use replay_arena::{ParamId, Purpose, ViewsExt};
    let w = |p| {
        Request::new(Domain::Device, DType::F32, 64)
            .purpose(Purpose::WgradRsInput)
            .param(ParamId(p))
    };
    let scratch = Request::new(Domain::Device, DType::F32, 16).purpose(Purpose::Fp32AccumScratch);
    let sim = sim::Device::new();
    let stream = sim.new_stream();
    let mut capturing = on_sim(&sim, &[w(1), scratch, w(2)]);
    let cap = capturing.capture(RunnerId(0)).unwrap();
    let vs = [w(1), scratch, w(2)].map(|q| cap.take(q).unwrap());
    record_and_finish!(cap, &stream, |s| {
        sim.launch(s, sim::Kernel::fill(&vs[0], 1.0), 1)?;
        sim.launch(s, sim::Kernel::fill(&vs[2], 2.0), 1)
    });
    let mut replayable = capturing.seal().unwrap();
    replayable.replay(RunnerId(0), &stream).unwrap();
    let out = sim.alloc_f32(64).unwrap();
    replayable
        .consume(RunnerId(0), &stream, |s, views| {
            assert_eq!(views.with_purpose(Purpose::WgradRsInput).count(), 2);
            assert_eq!(views.find(&scratch).unwrap().len(), 16);
            let second = views.of_param(ParamId(2)).next().unwrap();
            sim.launch(s, sim::Kernel::copy(&second, &out), 1)
        })
        .unwrap();
    assert_eq!(sim.read_f32(&out).unwrap(), vec![2.0; 64]);
}

/// Runner 0 replays (5 ticks); consumers on two side streams take 100
/// ticks each. Returns the makespan.
fn two_consumers(sim: &sim::Device) -> u64 {
    let stream = sim.new_stream();
    let (x, y) = (sim.new_stream(), sim.new_stream());
    let mut capturing = on_sim(sim, &[REQ]);
    capture_view(&mut capturing, RunnerId(0), REQ, &stream, |s, v| {
        sim.launch(s, sim::Kernel::fill(&v, 3.0), 5)
    });
    let mut replayable = capturing.seal().unwrap();
    let outs = [sim.alloc_f32(64).unwrap(), sim.alloc_f32(64).unwrap()];
    replayable.replay(RunnerId(0), &stream).unwrap();
    for (s, out) in [&x, &y].into_iter().zip(&outs) {
        replayable
            .consume(RunnerId(0), s, |s, views| {
                sim.launch(s, sim::Kernel::copy(&views[0], out), 100)
            })
            .unwrap();
    }
    // The next replay waits for both readers.
    replayable.replay(RunnerId(0), &stream).unwrap();
    replayable.synchronize().unwrap();
    for out in &outs {
        assert_eq!(sim.read_f32(out).unwrap(), vec![3.0; 64]);
    }
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    sim.makespan()
}

#[test]
fn consumers_of_one_runner_on_two_streams_run_at_once_and_both_are_waited_for() {
    let sim = sim::Device::new();
    let makespan = two_consumers(&sim);
    // Replay (5), both consumers side by side (100), the next replay (5):
    // not 5 + 100 + 100 + 5, which serialized consumers would take.
    assert_eq!(makespan, 110);
}

#[test]
fn one_consumer_over_several_runners_is_fenced_against_each() {
    let sim = sim::Device::new();
    let rs = (0..3).map(|r| (RunnerId(r), [REQ]));
    let mut capturing = allocate_runners(&sim, rs, Policy::Generations(3));
    let pools = [sim.new_stream(), sim.new_stream(), sim.new_stream()];
    for r in 0..3u32 {
        let cap = capturing.capture(RunnerId(r)).unwrap();
        let v = cap.take(REQ).unwrap();
        record_and_finish!(cap, &pools[r as usize], |s| {
            sim.launch(
                s,
                sim::Kernel::fill(&v, r as f32 + 1.0),
                10 * (r as u64 + 1),
            )
        });
    }
    let mut replayable = capturing.seal().unwrap();
    for r in 0..3u32 {
        replayable.replay(RunnerId(r), &pools[r as usize]).unwrap();
    }
    let side = sim.new_stream();
    let bucket = sim.alloc_f32(64).unwrap();
    replayable
        .consume_many(
            &[RunnerId(0), RunnerId(1), RunnerId(2)],
            &side,
            |s, runners| {
                assert_eq!(runners.len(), 3);
                runners
                    .iter()
                    .try_for_each(|views| sim.launch(s, sim::Kernel::add(&views[0], &bucket), 5))
            },
        )
        .unwrap();
    // Each runner's next replay waits for the bucket's reads.
    for r in 0..3u32 {
        replayable.replay(RunnerId(r), &pools[r as usize]).unwrap();
    }
    replayable.synchronize().unwrap();
    assert_eq!(sim.read_f32(&bucket).unwrap(), vec![6.0; 64]);
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    // A runner that lost its bytes refuses the whole consumer.
    let err = replayable
        .consume_many(&[RunnerId(0), RunnerId(9)], &side, |_, _| {
            Ok::<(), String>(())
        })
        .unwrap_err();
    assert!(matches!(
        err,
        replay_arena::ConsumeError::UnknownRunner { .. }
    ));
}
