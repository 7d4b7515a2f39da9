//! A view works only in its own plan, on its closure's stream and inside
//! its closure: a capture cannot write a view of another live plan, a
//! consumer cannot use a view of another plan or on another stream, and a
//! view or its span is refused once its closure returned.

use crate::support::attacks::replayed_on_first;
use crate::support::capture_view;
use crate::support::steps::allocate_runners;
use crate::support::steps::fence::*;
use replay_arena::sim;
use replay_arena::{Policy, RunnerId};

/// The sim's refusal of a view used where the fence cannot order it.
fn assert_out_of_scope<T: std::fmt::Debug>(result: Result<T, replay_arena::BackendError>) {
    use replay_arena::Misuse;
    let err = result.unwrap_err();
    assert!(
        matches!(
            err,
            replay_arena::BackendError::InvalidView {
                reason: Misuse::OutsideClosure { .. }
                    | Misuse::OtherStream { .. }
                    | Misuse::NoScope { .. }
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("outside the work closure")
            || err.to_string().contains("another stream")
            || err
                .to_string()
                .contains("not handed out by a capture or consumer"),
        "{err}"
    );
}

#[test]
fn a_capture_cannot_write_a_view_of_another_live_plan() {
    let (sim, stream, mut a) = allocated(&[&[F32_64]], Policy::Generations(1));
    let mut b = on_sim(&sim, &[F32_64]);
    let cap_a = a.capture(RunnerId(0)).unwrap();
    let theirs = cap_a.take(F32_64).unwrap();
    let cap_b = b.capture(RunnerId(0)).unwrap();
    let ours = cap_b.take(F32_64).unwrap();
    let other = sim.new_stream();
    cap_b
        .stream_capture(&other, |s| {
            // Plan A's view, taken but outside A's closure: refused, and the
            // refusal recorded nothing.
            assert_out_of_scope(sim.launch(s, sim::Kernel::fill(&theirs, 9.0), 1));
            sim.launch(s, sim::Kernel::fill(&ours, 1.0), 1)
        })
        .unwrap();
    // Nested inside A's own closure, A's view on B's stream is refused too.
    cap_a
        .stream_capture(&stream, |s| {
            assert_out_of_scope(sim.launch(&other, sim::Kernel::fill(&theirs, 9.0), 1));
            sim.launch(s, sim::Kernel::fill(&theirs, 2.0), 1)
        })
        .unwrap();
    cap_b.finish().unwrap();
    cap_a.finish().unwrap();
    let (a, b) = (a.seal().unwrap(), b.seal().unwrap());
    assert_eq!(b.graph(RunnerId(0)).unwrap().ops().len(), 1);
    assert_eq!(a.graph(RunnerId(0)).unwrap().ops().len(), 1);
}

#[test]
fn a_consumer_cannot_use_a_view_of_another_plan_or_on_another_stream() {
    let (sim, mut a) = sealed(1, Policy::Generations(1), 5);
    let (_, mut b) = {
        let runners = [(RunnerId(0), [F32_64])];
        let s = sim.new_stream();
        let mut c = allocate_runners(&sim, runners, Policy::Generations(1));
        capture_view(&mut c, RunnerId(0), F32_64, &s, |s, v| {
            sim.launch(s, sim::Kernel::fill(&v, 3.0), 1)
        });
        (s, c.seal().unwrap())
    };
    let (s1, s2) = (sim.new_stream(), sim.new_stream());
    a.replay(RunnerId(0), &s1).unwrap();
    b.replay(RunnerId(0), &s1).unwrap();
    let out = sim.alloc_f32(64).unwrap();
    a.consume(RunnerId(0), &s1, |s, mine| {
        b.consume(RunnerId(0), &s2, |_, theirs| {
            // B's view on A's consumer stream, and A's view on B's: refused.
            assert_out_of_scope(sim.launch(s, sim::Kernel::copy(&theirs[0], &out), 1));
            assert_out_of_scope(sim.launch(&s2, sim::Kernel::copy(&mine[0], &out), 1));
            Ok::<(), String>(())
        })
        .unwrap();
        // A's own view on another stream than its consumer's: refused.
        assert_out_of_scope(sim.launch(&s2, sim::Kernel::copy(&mine[0], &out), 1));
        Ok::<(), String>(())
    })
    .unwrap();
    assert_eq!(sim.read_f32(&out).unwrap(), vec![0.0; 64]);
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
}

#[test]
fn a_view_or_its_span_cannot_be_used_after_its_closure_returned() {
    let (sim, [pool, side], mut replayable) = replayed_on_first(2);
    let mut kept = None;
    replayable
        .consume(RunnerId(0), &side, |_, views| {
            kept = Some(replay_arena::sim::AsSpan::span(&views[0]));
            Ok::<(), String>(())
        })
        .unwrap();
    let kept = kept.unwrap();
    // The span escaped the closure (it is plain data), but its scope closed:
    // it cannot race runner 1's replay, which claims the same bytes.
    replayable.replay(RunnerId(1), &pool).unwrap();
    assert_out_of_scope(sim.launch(&side, sim::Kernel::fill(&kept, 7.0), 50));
    // Views read from the plan are for addresses: no device work.
    let view = replayable.views(RunnerId(1)).unwrap()[0];
    assert_out_of_scope(sim.launch(&side, sim::Kernel::fill(&view, 7.0), 50));
    // Nor can a raw span of the same bytes get in.
    let raw = replay_arena::sim::Span::new(view.device_address(), 64);
    let err = sim
        .launch(&side, sim::Kernel::fill(&raw, 7.0), 50)
        .unwrap_err();
    assert!(err.to_string().contains("lie in a plan's arena"), "{err}");
    assert_eq!(sim.read_f32(&view).unwrap(), vec![6.0; 64]);
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
}
