//! A framework-shaped backward whose ops (`support::ops`, shaped like
//! candle's: inputs as cudarc's `CudaView`, outputs allocated as
//! `CudaSlice`) read received handoffs and consumers' views lent with
//! `ViewExt::with_cudarc`, write wgrads straight into views lent with
//! `with_cudarc_mut` (both `unsafe`: cudarc's view types take work on any
//! stream, and every lend here keeps it on the lent stream, see `lend`),
//! and leave allocated outputs in views with the copy helper `copy_from`
//! (and read them back with `copy_into`). `gpu_handoffs.rs` is the same
//! kind of backward with no `unsafe` at all. Five layers,
//! replayed on a pool of two streams with consumers on a third, bit for bit
//! equal to the eager run; then every refusal a typed view makes, made by a
//! lend or a copy.
#![cfg(feature = "cuda")]

use crate::support;

use replay_arena::cuda::cudarc::driver::CudaSlice;
use replay_arena::cuda::{self, ViewExt};
use replay_arena::{
    BackendError, CaptureError, DType, Discovering, Domain, Misuse, PlanConfig, Policy, Purpose,
    Request, RunnerId, StreamCaptureError, ViewsExt,
};
use support::gpu::backward::{self, Model};
use support::gpu::device;

const N: usize = 1 << 18;
const LAYERS: usize = 5;
const STEPS: usize = 20;
const SPIN: i64 = 10_000;
/// The wgrad, written straight into its view (as cuBLAS writes a GEMM's C).
const WGRAD: Request =
    Request::new(Domain::Device, DType::I32, N as u64).purpose(Purpose::WgradRsInput);
/// A second result, computed into a framework-allocated tensor and copied in.
const AUX: Request = Request::new(Domain::Device, DType::I32, N as u64);
const GRAD: Request = Request::new(Domain::Device, DType::I32, N as u64);

/// The closures' error: the crate's, or an op's (formatted).
#[derive(Debug)]
enum E {
    Crate(BackendError),
    Op(String),
}

impl std::fmt::Display for E {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            E::Crate(e) => e.fmt(f),
            E::Op(e) => f.write_str(e),
        }
    }
}

impl From<BackendError> for E {
    fn from(e: BackendError) -> E {
        E::Crate(e)
    }
}

impl From<String> for E {
    fn from(e: String) -> E {
        E::Op(e)
    }
}

/// One layer's results, wherever they live.
struct Out<'o> {
    dx: Option<&'o mut CudaSlice<i32>>,
    wgrad: &'o mut CudaSlice<i32>,
    aux: &'o mut CudaSlice<i32>,
}

fn model() -> Model {
    Model::new(LAYERS, N, true)
}

/// The eager backward of layer `l`, in the framework's own tensors.
fn eager_layer(model: &Model, s: &cuda::Stream, l: usize, g_in: &CudaSlice<i32>, out: Out<'_>) {
    let (w, x) = (
        model.layers.weights[l].as_view(),
        model.layers.inputs[l].as_view(),
    );
    let g = g_in.as_view();
    let ops = &model.fw.ops;
    let t1 = ops.mix2_v(s, &g, &w, 1).unwrap();
    let dx = ops.mix2_v(s, &t1.as_view(), &w, 2).unwrap();
    if let Some(d) = out.dx {
        s.cudarc().memcpy_dtod(&dx, d).unwrap();
    }
    ops.mix2_out(s, &mut out.wgrad.as_view_mut(), &g, &x, 3)
        .unwrap();
    let aux = ops.mix2_v(s, &x, &g, 5).unwrap();
    s.cudarc().memcpy_dtod(&aux, out.aux).unwrap();
}

/// Each layer's wgrads, then each layer's aux results, folded over the
/// steps.
fn eager(model: &Model) -> Vec<Vec<i32>> {
    let s = &model.fw.io;
    let mut acc = model.zeros(2 * LAYERS);
    let mut grads: Vec<CudaSlice<i32>> = (0..LAYERS)
        .map(|_| s.cudarc().alloc_zeros(N).unwrap())
        .collect();
    let zeros = || -> CudaSlice<i32> { s.cudarc().alloc_zeros(N).unwrap() };
    for _ in 0..STEPS {
        for l in 0..LAYERS {
            let (mut wgrad, mut aux) = (zeros(), zeros());
            let (before, rest) = grads.split_at_mut(l);
            let dx = (l + 1 < LAYERS).then_some(&mut rest[0]);
            let g_in = before.last().unwrap_or(&model.layers.loss);
            let out = Out {
                dx,
                wgrad: &mut wgrad,
                aux: &mut aux,
            };
            eager_layer(model, s, l, g_in, out);
            let (a, b) = acc.split_at_mut(LAYERS + l);
            model
                .fw
                .ops
                .fold_v(s, &mut a[l], &wgrad.as_view(), 0)
                .unwrap();
            model
                .fw
                .ops
                .fold_v(s, &mut b[0], &aux.as_view(), 0)
                .unwrap();
        }
    }
    model.read(&acc)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_backward_through_lent_views_and_copies_replays_exactly() {
    let model = model();
    let expected = eager(&model);
    let b = &model.fw.backend;
    let (d, handoffs) = backward::discover(LAYERS, WGRAD, Some(GRAD), Some(AUX));
    let mut capturing = d
        .plan(Policy::Generations(2))
        .unwrap()
        .allocate(b.clone())
        .unwrap();
    let capture_stream = b.new_stream().unwrap();
    for l in 0..LAYERS {
        let (w, x) = (
            model.layers.weights[l].as_view(),
            model.layers.inputs[l].as_view(),
        );
        let cap = capturing.capture(RunnerId(l as u32)).unwrap();
        let wgrad = cap.take(WGRAD).unwrap();
        let input = (l > 0).then(|| cap.receive(handoffs[l - 1]).unwrap());
        let output = (l + 1 < LAYERS).then(|| (handoffs[l], cap.hand_off(handoffs[l]).unwrap()));
        let aux = cap.take(AUX).unwrap();
        cap.stream_capture(&capture_stream, |s| -> Result<(), E> {
            // The layer, given its input gradient as a cudarc view.
            let layer =
                |g: &replay_arena::cuda::cudarc::driver::CudaView<'_, i32>| -> Result<(), E> {
                    let t1 = model.fw.ops.mix2_v(s, g, &w, 1)?;
                    let dx = model.fw.ops.mix2_v(s, &t1.as_view(), &w, 2)?;
                    drop(t1);
                    if let Some((h, dx_view)) = &output {
                        // The framework allocated dX: copy it into the handoff.
                        dx_view.copy_from(s, &dx)?;
                        cap.ready(*h, s).map_err(|e| E::Op(e.to_string()))?;
                    }
                    drop(dx);
                    // The wgrad straight into its view.
                    lend_mut(&wgrad, s, |mut out| {
                        model.fw.ops.mix2_out(s, &mut out, g, &x, 3).map_err(E::Op)
                    })?;
                    let t = model.fw.ops.mix2_v(s, &x, g, 5)?;
                    aux.copy_from(s, &t)?;
                    Ok(())
                };
            match &input {
                // A received handoff, read through a lent read-only view.
                Some(dy) => lend(dy, s, |g| layer(&g)),
                None => layer(&model.layers.loss.as_view()),
            }
        })
        .unwrap();
        cap.finish().unwrap();
    }
    let mut replayable = capturing.seal().unwrap();
    let pool = [b.new_stream().unwrap(), b.new_stream().unwrap()];
    let side = b.new_stream().unwrap();
    let mut acc = model.zeros(2 * LAYERS);
    let mut staging: CudaSlice<i32> = side.cudarc().alloc_zeros(N).unwrap();
    side.synchronize().unwrap();
    for _ in 0..STEPS {
        for l in 0..LAYERS {
            let runner = RunnerId(l as u32);
            replayable.replay(runner, &pool[l % 2]).unwrap();
            let (a, rest) = acc.split_at_mut(LAYERS + l);
            let (acc_w, acc_aux) = (&mut a[l], &mut rest[0]);
            replayable
                .consume(runner, &side, |s, views| -> Result<(), E> {
                    // A consumer gets the runner's requests, in request
                    // order; handoffs are not among them.
                    assert_eq!(views.len(), 2);
                    assert_eq!(views[0].request(), WGRAD);
                    let w = views.find(&WGRAD).expect("the wgrad view");
                    assert_eq!(views.with_purpose(Purpose::WgradRsInput).count(), 1);
                    lend(&w, s, |w| {
                        model.fw.ops.fold_v(s, acc_w, &w, SPIN).map_err(E::Op)
                    })?;
                    // A framework op that needs owned storage: copy out.
                    views[1].copy_into(s, &mut staging)?;
                    model.fw.ops.fold_v(s, acc_aux, &staging.as_view(), 0)?;
                    Ok(())
                })
                .unwrap();
        }
    }
    replayable.wait_all(&side).unwrap();
    let got: Vec<Vec<i32>> = acc
        .iter()
        .map(|a| side.cudarc().clone_dtoh(a).unwrap())
        .collect();
    side.synchronize().unwrap();
    let differ = backward::differing(&got, &expected);
    assert_eq!(
        differ,
        0,
        "{differ} of {} elements differ from eager",
        2 * LAYERS * N
    );
    // The lent views' arenas are freed only after the whole context is idle.
    drop(replayable);
}

fn refused(r: Result<(), E>) -> Misuse {
    match r {
        Err(E::Crate(BackendError::InvalidView { reason })) => reason,
        other => panic!("expected InvalidView, got {other:?}"),
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn lends_and_copies_refuse_what_a_typed_view_refuses() {
    let b = device();
    let (s1, s2) = (b.new_stream().unwrap(), b.new_stream().unwrap());
    let mut d = Discovering::new(PlanConfig::new());
    let h = {
        let mut armed = d.arm(RunnerId(0)).unwrap();
        armed.record(AUX).unwrap();
        armed.hand_off(GRAD).unwrap()
    };
    {
        let mut armed = d.arm(RunnerId(1)).unwrap();
        armed.receive(h).unwrap();
        armed.record(AUX).unwrap();
    }
    let mut capturing = d
        .plan(Policy::Generations(2))
        .unwrap()
        .allocate(b.clone())
        .unwrap();
    let mut short: CudaSlice<i32> = s1.cudarc().alloc_zeros(N - 1).unwrap();
    let src: CudaSlice<i32> = s1.cudarc().alloc_zeros(N).unwrap();
    s1.synchronize().unwrap();

    // Runner 0: a lend outside the closure, on another stream, of another
    // dtype, a copy of another length; a handoff marked ready while lent.
    let cap = capturing.capture(RunnerId(0)).unwrap();
    let aux = cap.take(AUX).unwrap();
    let dx = cap.hand_off(h).unwrap();
    assert!(matches!(
        refused(lend::<i32, _, E, _>(&aux, &s1, |_| Ok(()))),
        Misuse::OutsideClosure { .. }
    ));
    let err = cap
        .stream_capture(&s1, |s| -> Result<(), E> {
            assert!(matches!(
                refused(lend::<i32, _, E, _>(&aux, &s2, |_| Ok(()))),
                Misuse::OtherStream { capture: true, .. }
            ));
            assert!(matches!(
                lend::<f32, _, E, _>(&aux, s, |_| Ok(())),
                Err(E::Crate(BackendError::DTypeMismatch { .. }))
            ));
            assert!(matches!(
                aux.copy_into(s, &mut short),
                Err(BackendError::Refused {
                    call: "copy_into",
                    ..
                })
            ));
            assert!(matches!(
                aux.copy_from(s, &short),
                Err(BackendError::Refused {
                    call: "copy_from",
                    ..
                })
            ));
            aux.copy_from(s, &src)?;
            lend_mut::<i32, _, E>(&dx, s, |mut v| {
                cap.ready(h, s).map_err(|e| E::Op(e.to_string()))?;
                // Written after the ready point: the crate cannot see it.
                s.cudarc()
                    .memset_zeros(&mut v)
                    .map_err(BackendError::from)?;
                Ok(())
            })
        })
        .expect_err("a handoff marked ready while it was lent");
    assert!(
        matches!(
            &err,
            StreamCaptureError::Capture(CaptureError::ViewOutOfScope {
                runner: RunnerId(0),
                reason: Misuse::Retired { .. }
            })
        ),
        "{err}"
    );
    drop(cap);

    // Runner 1: a received handoff is lent read-only (lending it writable,
    // or copying into it, does not compile: ui-tests/
    // write_a_read_only_view_through_cudarc.rs); a panic inside a lend
    // unwinds out of the capture and leaves no capture open on the stream.
    let cap = capturing.capture(RunnerId(1)).unwrap();
    let dy = cap.receive(h).unwrap();
    let aux1 = cap.take(AUX).unwrap();
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        cap.stream_capture(&s1, |s| -> Result<(), E> {
            assert!(dy.is_read_only());
            lend::<i32, _, E, _>(&dy, s, |_| Ok(()))?;
            lend::<i32, (), E, _>(&aux1, s, |_| panic!("a framework op panics"))
        })
    }));
    assert!(panicked.is_err());
    drop(cap);
    // The stream captures nothing any more: eager work on it runs.
    let mut host = vec![1i32; N];
    s1.cudarc().memcpy_dtoh(&src, &mut host).unwrap();
    s1.synchronize().unwrap();
    assert!(host.iter().all(|&x| x == 0));
    assert!(capturing.seal().is_err());
}

/// `ViewExt::with_cudarc`, for this file's closures.
fn lend<T: cuda::Element, R, E2: From<BackendError>, A: replay_arena::Access>(
    view: &replay_arena::View<'_, A>,
    s: &cuda::Stream,
    f: impl FnOnce(replay_arena::cuda::cudarc::driver::CudaView<'_, T>) -> Result<R, E2>,
) -> Result<R, E2> {
    // SAFETY: every closure this file lends a view to puts its work on the
    // lent view on the stream it is lent on (the ops of `support::ops`
    // launch on the stream they are given, and every call passes that
    // stream); the lends on other streams are refused before their
    // closure, which does nothing, would run.
    unsafe { view.with_cudarc(s, f) }
}

/// `ViewExt::with_cudarc_mut`, for this file's closures.
fn lend_mut<T: cuda::Element, R, E2: From<BackendError>>(
    view: &replay_arena::View<'_>,
    s: &cuda::Stream,
    f: impl FnOnce(replay_arena::cuda::cudarc::driver::CudaViewMut<'_, T>) -> Result<R, E2>,
) -> Result<R, E2> {
    // SAFETY: as in `lend`.
    unsafe { view.with_cudarc_mut(s, f) }
}
