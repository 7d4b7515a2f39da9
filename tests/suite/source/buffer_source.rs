//! One call for code shared by eager, discovery and captured paths.

use replay_arena::sim;
use replay_arena::{
    Buffer, BufferSource, CaptureError, DType, Discovering, Domain, Error, ParamId, PlanConfig,
    Policy, Purpose, Request, RunnerId, View,
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
    let stream = sim.stream();
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
