//! A runner's cuBLAS workspace from its own plan request
//! (`replay_arena::cublas::bind_workspace`, feature `cublas`): a gemm captured
//! with the workspace bound, replayed, checked numerically; a misaligned
//! workspace refused.
//!
//! Ignored without a GPU: `cargo test --features cublas --test gpu backend::cublas --
//! --include-ignored`.

use crate::support::gpu::{allocate, device};
use replay_arena::cublas::{bind_workspace, WORKSPACE_ALIGNMENT};
use replay_arena::cuda::cudarc::cublas::sys::cublasOperation_t;
use replay_arena::cuda::cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use replay_arena::cuda::ViewExt;
use replay_arena::{BackendError, DType, Domain, Policy, Request, RunnerId};

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_gemm_captured_on_a_plan_workspace_replays_and_a_misaligned_one_is_refused() {
    let backend = device();
    let stream = backend.new_stream().unwrap();
    let (m, n, k) = (64usize, 48usize, 32usize);
    let ha: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32).collect();
    let hb: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 - 2.0).collect();
    let a = stream.cudarc().clone_htod(&ha).unwrap();
    let b = stream.cudarc().clone_htod(&hb).unwrap();
    let mut blas = CudaBlas::new(stream.cudarc().clone()).unwrap();

    // A workspace one byte past an aligned address is refused.
    let mut raw = stream.cudarc().alloc_zeros::<u8>(1 << 20).unwrap();
    let mut off = raw.slice_mut(1..);
    // SAFETY: refused before the handle is touched.
    let refused = unsafe { bind_workspace(&mut blas, &stream, &mut off) };
    assert!(
        matches!(
            refused,
            Err(BackendError::Refused {
                call: "cublasSetWorkspace",
                ..
            })
        ),
        "{refused:?}"
    );

    let c_req = Request::new(Domain::Device, DType::F32, (m * n) as u64);
    let ws_req = Request::new(Domain::Device, DType::U8, 4 << 20);
    let runner = [(RunnerId(0), [c_req, ws_req])];
    let mut capturing = allocate(&backend, runner, Policy::Generations(1));
    {
        let cap = capturing.capture(RunnerId(0)).unwrap();
        let c = cap.take(c_req).unwrap();
        let ws = cap.take(ws_req).unwrap();
        cap.stream_capture(&stream, |s| -> replay_arena::Result<()> {
            // Typed views exist inside the capture's closure only.
            let mut ws = ws.as_cuda::<u8>(s)?;
            assert_eq!(ws.device_address() % WORKSPACE_ALIGNMENT, 0);
            // SAFETY: the handle is used for this capture only and dropped
            // before the plan.
            unsafe { bind_workspace(&mut blas, s, &mut ws) }?;
            let mut c = c.as_cuda::<f32>(s)?;
            let cfg = GemmConfig {
                transa: cublasOperation_t::CUBLAS_OP_N,
                transb: cublasOperation_t::CUBLAS_OP_N,
                m: m as i32,
                n: n as i32,
                k: k as i32,
                alpha: 1f32,
                lda: m as i32,
                ldb: k as i32,
                beta: 0f32,
                ldc: m as i32,
            };
            // SAFETY: a is m x k, b is k x n, c is m x n, column-major.
            unsafe { blas.gemm(cfg, &a, &b, &mut c) }?;
            Ok(())
        })
        .unwrap_or_else(|e| panic!("capture: {e}"));
        cap.finish().unwrap();
    }
    let mut replayable = capturing.seal().unwrap();
    for _ in 0..3 {
        replayable.replay(RunnerId(0), &stream).unwrap();
    }
    let mut got = vec![0f32; m * n];
    replayable
        .consume(
            RunnerId(0),
            &stream,
            |s, views| -> replay_arena::Result<()> {
                let c = views[0].as_cuda::<f32>(s)?;
                s.cudarc().memcpy_dtoh(&c, &mut got)?;
                Ok(())
            },
        )
        .unwrap();
    stream.synchronize().unwrap();
    let mut want = vec![0f32; m * n];
    for col in 0..n {
        for row in 0..m {
            want[row + col * m] = (0..k).map(|p| ha[row + p * m] * hb[p + col * k]).sum();
        }
    }
    assert_eq!(got, want);
    drop(replayable);
    drop(blas);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_typed_view_with_no_address_on_the_stream_is_refused_as_a_workspace() {
    let backend = device();
    let (stream, other) = (backend.new_stream().unwrap(), backend.new_stream().unwrap());
    let mut blas = CudaBlas::new(stream.cudarc().clone()).unwrap();
    let ws_req = Request::new(Domain::Device, DType::U8, 4 << 20);
    let mut capturing = allocate(&backend, [(RunnerId(0), [ws_req])], Policy::Generations(1));
    let cap = capturing.capture(RunnerId(0)).unwrap();
    let ws = cap.take(ws_req).unwrap();
    let mut refused = None;
    let captured = cap.stream_capture(&stream, |s| -> replay_arena::Result<()> {
        let mut ws = ws.as_cuda::<u8>(s)?;
        // On another stream than its capture's, the view's address is 0:
        // cuBLAS must not get a NULL workspace of 4 MiB.
        // SAFETY: refused before the handle is touched.
        refused = Some(unsafe { bind_workspace(&mut blas, &other, &mut ws) });
        Ok(())
    });
    let refused = refused.expect("the closure ran");
    assert!(
        matches!(
            &refused,
            Err(BackendError::Refused { call: "cublasSetWorkspace", reason }) if reason.contains("no address")
        ),
        "{refused:?}"
    );
    // The capture reports the misuse too.
    assert!(captured.is_err(), "{captured:?}");
    drop(blas);
}
