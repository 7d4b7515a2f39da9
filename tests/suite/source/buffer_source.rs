//! One call for code shared by eager, discovery and captured paths.

use crate::support::record_and_finish;
use replay_arena::sim::{self, AsSpan};
use replay_arena::{
    Buffer, BufferSource, CaptureError, DType, Discovering, DiscoveryError, Domain, Error,
    HandoffTicket, ParamId, PlanConfig, Policy, Purpose, Received, Request, RunnerId, SourceError,
    View, ViewsExt,
};

/// A layer's backward: two wgrad buffers of one parameter (as MTP does) and
/// a scratch buffer, asked for the same way in every phase. Returns the
/// persistent views it got, if any.
fn layer_backward<'s>(src: &mut BufferSource<'s, '_>) -> Result<Vec<View<'s>>, Error> {
    let wgrad = Request::new(Domain::Device, DType::BF16, 3000)
        .purpose(Purpose::WgradRsInput)
        .param(ParamId(7));
    let scratch = Request::new(Domain::Device, DType::F32, 100).purpose(Purpose::Fp32AccumScratch);
    let mut got = Vec::new();
    for request in [wgrad, wgrad, scratch] {
        match src.request(request)? {
            Buffer::Persistent(view) => got.push(view),
            Buffer::AllocateYourself => {}
        }
    }
    Ok(got)
}

#[test]
fn eager_runs_record_nothing_and_allocate_for_themselves() {
    assert!(layer_backward(&mut BufferSource::Plain).unwrap().is_empty());
}

#[test]
fn the_same_code_records_in_discovery_and_gets_fixed_views_in_capture() {
    let mut discovery = Discovering::new(PlanConfig::new());
    {
        let mut armed = discovery.arm(RunnerId(0)).unwrap();
        let got = layer_backward(&mut BufferSource::Discover(&mut armed)).unwrap();
        assert!(
            got.is_empty(),
            "discovery still allocates for the eager run"
        );
    }
    let planned = discovery.plan(Policy::Generations(1)).unwrap();
    // Two distinct slices for the repeated parameter, aligned to 256 bytes.
    let slices = planned.extents_of(RunnerId(0)).unwrap();
    let bf16 = slices.iter().find(|s| s.key.dtype == DType::BF16).unwrap();
    assert_eq!(bf16.bytes, 2 * 6144);

    let sim = sim::Device::new();
    let stream = sim.new_stream();
    let mut capturing = planned.allocate(sim.clone()).unwrap();
    let addrs;
    {
        let cap = capturing.capture(RunnerId(0)).unwrap();
        let views = layer_backward(&mut BufferSource::Capture(&cap)).unwrap();
        cap.stream_capture(&stream, |s| {
            views
                .iter()
                .try_for_each(|v| sim.launch(s, sim::Kernel::fill(v, 1.0), 1))
        })
        .unwrap();
        addrs = views.iter().map(|v| v.device_address()).collect::<Vec<_>>();
        cap.finish().unwrap();
    }
    assert_eq!(addrs.len(), 3);
    assert_eq!(
        addrs[1] - addrs[0],
        6144,
        "the repeated parameter gets its own slice"
    );
    let mut replayable = capturing.seal().unwrap();
    replayable.replay(RunnerId(0), &stream).unwrap();
    let views = replayable.views(RunnerId(0)).unwrap();
    let same: Vec<u64> = views.iter().map(|v| v.device_address()).collect();
    assert_eq!(
        same, addrs,
        "replay-time views have the capture-time addresses"
    );
}

#[test]
fn a_capture_that_differs_from_discovery_fails_through_the_same_call() {
    let mut discovery = Discovering::new(PlanConfig::new());
    discovery
        .arm(RunnerId(0))
        .unwrap()
        .record(Request::new(Domain::Device, DType::BF16, 3000))
        .unwrap();
    let sim = sim::Device::new();
    let mut capturing = discovery
        .plan(Policy::Generations(1))
        .unwrap()
        .allocate(sim)
        .unwrap();
    let cap = capturing.capture(RunnerId(0)).unwrap();
    let err = layer_backward(&mut BufferSource::Capture(&cap)).unwrap_err();
    assert!(
        matches!(err, Error::Capture(CaptureError::RequestMismatch { .. })),
        "{err}"
    );
}

/// Layers of the handoff tests, top (backward first) to bottom.
const LAYERS: usize = 3;
const LEN: usize = 64;

fn dgrad_request() -> Request {
    Request::new(Domain::Device, DType::F32, LEN as u64).purpose(Purpose::Other)
}

fn wgrad_request(layer: usize) -> Request {
    Request::new(Domain::Device, DType::F32, LEN as u64)
        .purpose(Purpose::WgradRsInput)
        .param(ParamId(layer as u64))
}

/// A layer's incoming gradient: the ticket of the layer above (none for the
/// top layer) and, for eager runs, where that layer's own output lies.
#[derive(Clone, Copy)]
struct Incoming {
    ticket: Option<HandoffTicket>,
    eager: sim::Span,
}

/// Where a buffer lies: the plan's view in a capture, a buffer of the
/// program's allocator (kept alive in `eager`) otherwise.
fn place(
    buffer: Buffer<'_>,
    sim: &sim::Device,
    eager: &mut Vec<sim::HostBuffer>,
) -> Result<sim::Span, Error> {
    Ok(match buffer {
        Buffer::Persistent(view) => view.span(),
        Buffer::AllocateYourself => {
            let b = sim.alloc_f32(LEN)?;
            let span = b.span();
            eager.push(b);
            span
        }
    })
}

/// One layer's backward, the same code in every phase: dX = 2 dY, handed
/// to the layer below (marked ready right after), then its wgrad
/// (layer + 1) dY into a request of its own. Returns what it hands off
/// (`None` for the bottom layer) and where its wgrad lies.
fn linear_backward(
    src: &mut BufferSource<'_, '_>,
    sim: &sim::Device,
    s: &sim::Stream,
    layer: usize,
    dy: Incoming,
    eager: &mut Vec<sim::HostBuffer>,
) -> Result<(Option<Incoming>, sim::Span), Error> {
    let dy_span = match dy.ticket {
        None => dy.eager,
        Some(ticket) => match src.receive(ticket)? {
            Received::Persistent(view) => view.span(),
            Received::Eager => dy.eager,
        },
    };
    let out = if layer > 0 {
        let (ticket, buffer) = src.hand_off(dgrad_request())?;
        let dx = place(buffer, sim, eager)?;
        sim.launch(s, sim::Kernel::copy(&dy_span, &dx), 2)?;
        sim.launch(s, sim::Kernel::scale(&dx, 2.0), 2)?;
        src.ready(ticket, s)?;
        Some(Incoming {
            ticket: Some(ticket),
            eager: dx,
        })
    } else {
        None
    };
    let wgrad = place(src.request(wgrad_request(layer))?, sim, eager)?;
    sim.launch(s, sim::Kernel::copy(&dy_span, &wgrad), 3)?;
    sim.launch(s, sim::Kernel::scale(&wgrad, (layer + 1) as f32), 3)?;
    Ok((out, wgrad))
}

/// Layer `layer`'s wgrad for the seed `i as f32`: (layer + 1) 2^(top - layer) i.
fn expected_wgrad(layer: usize) -> Vec<f32> {
    let factor = (layer + 1) as f32 * 2f32.powi((LAYERS - 1 - layer) as i32);
    (0..LEN).map(|i| factor * i as f32).collect()
}

fn seed(sim: &sim::Device) -> sim::HostBuffer {
    let seed = sim.alloc_f32(LEN).unwrap();
    let values: Vec<f32> = (0..LEN).map(|i| i as f32).collect();
    sim.write_f32(&seed, &values).unwrap();
    seed
}

/// Runner `r` is layer `LAYERS - 1 - r`: backward order.
fn layer_of(runner: usize) -> usize {
    LAYERS - 1 - runner
}

#[test]
fn one_layer_function_hands_gradients_down_eagerly_in_discovery_and_in_capture() {
    let sim = sim::Device::new();
    let stream = sim.new_stream();
    let seed = seed(&sim);
    let top = Incoming {
        ticket: None,
        eager: seed.span(),
    };

    // An eager run of runner `r`'s layer, its wgrad checked: what it
    // hands down.
    let eager_layer = |src: &mut BufferSource<'_, '_>, r, dy, eager: &mut _| {
        let (out, wgrad) = linear_backward(src, &sim, &stream, layer_of(r), dy, eager).unwrap();
        assert_eq!(sim.read_f32(&wgrad).unwrap(), expected_wgrad(layer_of(r)));
        out
    };

    // Eager: the program's allocator, plain tickets.
    let mut eager = Vec::new();
    let mut dy = top;
    for r in 0..LAYERS {
        let out = eager_layer(&mut BufferSource::Plain, r, dy, &mut eager);
        assert_eq!(out.is_some(), layer_of(r) > 0);
        if let Some(out) = out {
            assert_eq!(
                out.ticket.unwrap().id(),
                None,
                "a plain run names no handoff"
            );
            dy = out;
        }
    }

    // Discovery: the same eager run, recorded.
    let mut discovery = Discovering::new(PlanConfig::new());
    let mut dy = top;
    for r in 0..LAYERS {
        let mut armed = discovery.arm(RunnerId(r as u32)).unwrap();
        let out = eager_layer(&mut BufferSource::Discover(&mut armed), r, dy, &mut eager);
        if let Some(out) = out {
            dy = out;
        }
    }
    let declared: Vec<_> = discovery
        .handoffs()
        .map(|(id, _, writer, readers)| (id.0, writer.0, readers.iter().map(|r| r.0).collect()))
        .collect();
    assert_eq!(declared, vec![(0, 0, vec![1]), (1, 1, vec![2])]);
    drop(eager);

    // Capture: fixed views, a ready point per handoff.
    let planned = discovery.plan(Policy::Generations(2)).unwrap();
    let mut capturing = planned.allocate(sim.clone()).unwrap();
    let mut dy = top;
    let mut ready_ids = Vec::new();
    for r in 0..LAYERS {
        let cap = capturing.capture(RunnerId(r as u32)).unwrap();
        let mut out = None;
        let mut no_allocations = Vec::new();
        cap.stream_capture(&stream, |s| -> Result<(), Error> {
            let mut src = BufferSource::Capture(&cap);
            out = linear_backward(&mut src, &sim, s, layer_of(r), dy, &mut no_allocations)?.0;
            Ok(())
        })
        .unwrap();
        assert!(no_allocations.is_empty(), "a capture allocates nothing");
        cap.finish().unwrap();
        if let Some(out) = out {
            ready_ids.push(out.ticket.unwrap().id().unwrap().0);
            dy = out;
        }
    }
    assert_eq!(ready_ids, vec![0, 1], "capture hands out discovery's ids");
    let mut replayable = capturing.seal().unwrap();

    // Per-layer replays on two streams, each wgrad consumed on a side
    // stream (a reduce-scatter stand-in copying it out), over three steps.
    let lanes = [sim.new_stream(), sim.new_stream()];
    let side = sim.new_stream();
    let outs: Vec<sim::HostBuffer> = (0..LAYERS).map(|_| sim.alloc_f32(LEN).unwrap()).collect();
    for step in 0..3 {
        for r in 0..LAYERS {
            let runner = RunnerId(r as u32);
            replayable.replay(runner, &lanes[r % 2]).unwrap();
            replayable
                .consume(runner, &side, |s, views| {
                    let wgrad = views.find(&wgrad_request(layer_of(r))).unwrap();
                    sim.launch(s, sim::Kernel::copy(&wgrad, &outs[r]), 1)
                })
                .unwrap();
        }
        replayable.wait_all(&stream).unwrap();
        for (r, out) in outs.iter().enumerate() {
            assert_eq!(
                sim.read_f32(out).unwrap(),
                expected_wgrad(layer_of(r)),
                "step {step}, layer {}",
                layer_of(r)
            );
        }
    }
    assert_eq!(sim.hazards(), vec![], "the fence orders every handoff");
}

/// A two-layer discovery (runner 0 hands off to runner 1), planned and
/// allocated on `sim`; the ticket discovery gave.
fn two_layer_plan(sim: &sim::Device) -> (replay_arena::Capturing<sim::Device>, HandoffTicket) {
    let mut discovery = Discovering::new(PlanConfig::new());
    let ticket = {
        let mut armed = discovery.arm(RunnerId(0)).unwrap();
        let mut src = BufferSource::Discover(&mut armed);
        src.hand_off(dgrad_request()).unwrap().0
    };
    {
        let mut armed = discovery.arm(RunnerId(1)).unwrap();
        BufferSource::Discover(&mut armed).receive(ticket).unwrap();
    }
    let capturing = discovery
        .plan(Policy::Generations(1))
        .unwrap()
        .allocate(sim.clone())
        .unwrap();
    (capturing, ticket)
}

#[test]
fn tickets_of_another_kind_of_run_are_refused() {
    let (plain, _) = BufferSource::Plain.hand_off(dgrad_request()).unwrap();
    let mut discovery = Discovering::new(PlanConfig::new());
    let mut armed = discovery.arm(RunnerId(0)).unwrap();
    let err = BufferSource::Discover(&mut armed)
        .receive(plain)
        .unwrap_err();
    assert_phase_mismatch(&err, Some("discovery"));
    let planned = BufferSource::Discover(&mut armed)
        .hand_off(dgrad_request())
        .unwrap()
        .0;
    let _ = armed;
    let err = BufferSource::Plain.receive(planned).unwrap_err();
    assert_phase_mismatch(&err, Some("a plain run"));
    let sim = sim::Device::new();
    let err = BufferSource::Plain
        .ready(planned, &sim.new_stream())
        .unwrap_err();
    assert_phase_mismatch(&err, None);
}

/// `err` is a ticket of another kind of run, refused by a run in `phase`
/// (where one is given).
#[track_caller]
fn assert_phase_mismatch(err: &Error, phase: Option<&str>) {
    let Error::Source(SourceError::PhaseMismatch { phase: refused, .. }) = err else {
        panic!("not a phase mismatch: {err}");
    };
    if let Some(phase) = phase {
        assert_eq!(*refused, phase, "{err}");
    }
}

#[test]
fn a_receive_of_a_handoff_that_is_not_the_plans_is_refused() {
    // In discovery: an id it never handed out.
    let mut other = Discovering::new(PlanConfig::new());
    let foreign = {
        let mut armed = other.arm(RunnerId(0)).unwrap();
        let big = Request::new(Domain::Device, DType::F32, 4096);
        let _ = BufferSource::Discover(&mut armed).hand_off(big).unwrap();
        BufferSource::Discover(&mut armed).hand_off(big).unwrap().0
    };
    let mut discovery = Discovering::new(PlanConfig::new());
    let mut armed = discovery.arm(RunnerId(1)).unwrap();
    let err = BufferSource::Discover(&mut armed)
        .receive(foreign)
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Discovery(DiscoveryError::UnknownHandoff { declared: 0, .. })
        ),
        "{err}"
    );
    let _ = armed;

    // In a capture: the plan's id 0 holds another request than the foreign
    // discovery's id 0; the plan's reader gets a typed error, not a view.
    let sim = sim::Device::new();
    let (mut capturing, ticket) = two_layer_plan(&sim);
    let other_zero = {
        let mut d = Discovering::new(PlanConfig::new());
        let mut armed = d.arm(RunnerId(5)).unwrap();
        BufferSource::Discover(&mut armed)
            .hand_off(Request::new(Domain::Device, DType::F32, 4096))
            .unwrap()
            .0
    };
    assert_eq!(other_zero.id(), ticket.id());
    {
        let cap = capturing.capture(RunnerId(0)).unwrap();
        let mut src = BufferSource::Capture(&cap);
        // Runner 0 writes handoff 0: it does not read it.
        let err = src.receive(ticket).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Capture(CaptureError::HandoffNotDeclared { role: "reader", .. })
            ),
            "{err}"
        );
        let (got, buffer) = src.hand_off(dgrad_request()).unwrap();
        assert_eq!(got, ticket, "capture hands out discovery's ticket");
        assert!(matches!(buffer, Buffer::Persistent(_)));
        // One handoff declared: a second is refused, with what discovery declared.
        let err = src.hand_off(dgrad_request()).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Source(SourceError::HandoffMismatch {
                    index: 1,
                    expected: None,
                    declared: 1,
                    ..
                })
            ),
            "{err}"
        );
        record_and_finish!(cap, &stream_of(&sim), |s| {
            let mut src = BufferSource::Capture(&cap);
            src.ready(ticket, s)?;
            // The capture recorded it: a second mark is refused.
            let again = src.ready(ticket, s).unwrap_err();
            assert!(
                matches!(again, Error::Capture(CaptureError::ReadyMisplaced { .. })),
                "{again}"
            );
            Ok::<(), Error>(())
        });
    }
    let cap = capturing.capture(RunnerId(1)).unwrap();
    let mut src = BufferSource::Capture(&cap);
    let err = src.receive(other_zero).unwrap_err();
    assert!(
        matches!(err, Error::Source(SourceError::ForeignTicket { planned, .. }) if planned == dgrad_request()),
        "{err}"
    );
    // Only the writer marks a handoff ready, and only on the backend's stream.
    let err = src.ready(ticket, &stream_of(&sim)).unwrap_err();
    assert!(
        matches!(err, Error::Source(SourceError::NotTheWriter { .. })),
        "{err}"
    );
    assert!(matches!(
        src.receive(ticket).unwrap(),
        Received::Persistent(_)
    ));
}

#[test]
fn a_capture_that_hands_off_another_request_or_readies_on_a_foreign_stream_fails() {
    let sim = sim::Device::new();
    let (mut capturing, ticket) = two_layer_plan(&sim);
    let cap = capturing.capture(RunnerId(0)).unwrap();
    let mut src = BufferSource::Capture(&cap);
    let wrong = Request::new(Domain::Device, DType::F32, 65);
    let err = src.hand_off(wrong).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Source(SourceError::HandoffMismatch { index: 0, expected: Some(e), .. }) if e == dgrad_request()
        ),
        "{err}"
    );
    // The refused hand_off took nothing: the right one still gets the view.
    let (got, _) = src.hand_off(dgrad_request()).unwrap();
    assert_eq!(got, ticket);
    let stream = sim.new_stream();
    let err = cap
        .stream_capture(&stream, |_| {
            BufferSource::Capture(&cap).ready(ticket, &"not a stream")
        })
        .unwrap_err();
    let err = Error::from(err);
    assert!(
        matches!(err, Error::Source(SourceError::StreamType { expected, .. }) if expected.contains("sim")),
        "{err}"
    );
}

#[test]
fn discovery_refuses_a_ready_by_a_reader() {
    let mut discovery = Discovering::new(PlanConfig::new());
    let ticket = {
        let mut armed = discovery.arm(RunnerId(0)).unwrap();
        BufferSource::Discover(&mut armed)
            .hand_off(dgrad_request())
            .unwrap()
            .0
    };
    let mut armed = discovery.arm(RunnerId(1)).unwrap();
    let mut src = BufferSource::Discover(&mut armed);
    assert_eq!(src.receive(ticket).unwrap(), Received::Eager);
    let sim = sim::Device::new();
    let err = src.ready(ticket, &sim.new_stream()).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Source(SourceError::NotTheWriter {
                runner: RunnerId(1),
                writer: RunnerId(0),
                ..
            })
        ),
        "{err}"
    );
}

fn stream_of(sim: &sim::Device) -> sim::Stream {
    sim.new_stream()
}

#[test]
fn a_failed_ready_record_fails_the_capture_and_leaks_nothing() {
    // The one backend call `BufferSource::ready` makes in a capture is the
    // ready point's event record node: made to fail, the error is typed,
    // the runner's capture fails, and nothing stays capturing or allocated.
    let sim = sim::Device::new();
    let (mut capturing, ticket) = two_layer_plan(&sim);
    let stream = stream_of(&sim);
    {
        let cap = capturing.capture(RunnerId(0)).unwrap();
        let mut src = BufferSource::Capture(&cap);
        let (got, _buffer) = src.hand_off(dgrad_request()).unwrap();
        assert_eq!(got, ticket);
        sim.inject(sim::Faults::nth(sim::Call::RecordNode, 0));
        let err = cap
            .stream_capture(&stream, |s| {
                BufferSource::Capture(&cap).ready(ticket, s)?;
                Ok::<(), Error>(())
            })
            .unwrap_err();
        sim.inject(sim::Faults::none());
        assert!(err.to_string().contains("injected"), "{err}");
        assert!(cap.finish().is_err());
    }
    assert!(!replay_arena::backend::Streams::is_capturing(&sim, &stream).unwrap());
    assert!(capturing.seal().is_err(), "a failed runner cannot seal");
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
}
