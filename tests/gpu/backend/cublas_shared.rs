//! cuBLAS workspaces on one handle the program shares
//! (`replay_arena::cublas::with_workspace`, feature `cublas`): two runners
//! captured on two streams through one `Arc<CudaBlas>`, each with its own
//! workspace request, replayed concurrently many times and checked exactly;
//! the handle gets its stream (and cuBLAS's default workspace) back after
//! each capture, after a failing closure and after a panicking one, and an
//! eager gemm on it after the plan is gone works (run under
//! compute-sanitizer, a workspace left bound to freed arena bytes shows).
//!
//! Ignored without a GPU: `cargo test --features cublas --test
//! gpu_cublas_shared -- --include-ignored`.

use std::sync::Arc;

use crate::support::gpu::{allocate, device};
use replay_arena::cublas::{with_workspace, with_workspace_raw};
use replay_arena::cuda::cudarc::cublas::sys::{self as blas_sys, cublasOperation_t};
use replay_arena::cuda::cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use replay_arena::cuda::cudarc::driver::CudaSlice;
use replay_arena::cuda::ViewExt;
use replay_arena::{BackendError, DType, Domain, Policy, Request, RunnerId, StreamCaptureError};

const M: usize = 256;
const N: usize = 192;
const K: usize = 320;
const C: Request = Request::new(Domain::Device, DType::F32, (M * N) as u64);
const WS: Request = Request::new(Domain::Device, DType::U8, 8 << 20);

fn cfg() -> GemmConfig<f32> {
    GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_N,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: M as i32,
        n: N as i32,
        k: K as i32,
        alpha: 1.0,
        lda: M as i32,
        ldb: K as i32,
        beta: 0.0,
        ldc: M as i32,
    }
}

/// Column-major `a (M x K) * b (K x N)` on the host: small integers, so
/// every summation order gives the same f32.
fn host_gemm(a: &[f32], b: &[f32]) -> Vec<f32> {
    let mut c = vec![0f32; M * N];
    for j in 0..N {
        for p in 0..K {
            let bv = b[p + j * K];
            for i in 0..M {
                c[i + j * M] += a[i + p * M] * bv;
            }
        }
    }
    c
}

/// The stream the handle enqueues on now.
fn handle_stream(blas: &CudaBlas) -> usize {
    let mut s: blas_sys::cudaStream_t = std::ptr::null_mut();
    // SAFETY: a live handle; `s` is a local out pointer.
    let status = unsafe { blas_sys::cublasGetStream_v2(*blas.handle(), &mut s) };
    assert_eq!(status, blas_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS);
    s as usize
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn two_runners_on_two_streams_share_one_handle_with_their_own_workspaces() {
    let backend = device();
    let (a_stream, b_stream) = (backend.new_stream().unwrap(), backend.new_stream().unwrap());
    let side = backend.new_stream().unwrap();
    let home = a_stream.cudarc().cu_stream() as usize;
    // The program's one handle, shared (as candle shares its `Arc<CudaBlas>`).
    let handle = Arc::new(CudaBlas::new(a_stream.cudarc().clone()).unwrap());
    let inputs: Vec<(Vec<f32>, Vec<f32>)> = (0..2)
        .map(|r| {
            let a = (0..M * K)
                .map(|i| ((i * (r + 3)) % 7) as f32 - 3.0)
                .collect();
            let b = (0..K * N)
                .map(|i| ((i * (r + 5)) % 5) as f32 - 2.0)
                .collect();
            (a, b)
        })
        .collect();
    let expected: Vec<Vec<f32>> = inputs.iter().map(|(a, b)| host_gemm(a, b)).collect();
    let device: Vec<(CudaSlice<f32>, CudaSlice<f32>)> = inputs
        .iter()
        .map(|(a, b)| {
            (
                a_stream.cudarc().clone_htod(a).unwrap(),
                a_stream.cudarc().clone_htod(b).unwrap(),
            )
        })
        .collect();
    a_stream.synchronize().unwrap();

    let runners = (0..2).map(|r| (RunnerId(r), [C, WS]));
    let mut capturing = allocate(&backend, runners, Policy::Generations(2));
    let streams = [&a_stream, &b_stream];
    for r in 0..2usize {
        let cap = capturing.capture(RunnerId(r as u32)).unwrap();
        let (c, ws) = (cap.take(C).unwrap(), cap.take(WS).unwrap());
        let (a, b) = &device[r];
        cap.stream_capture(streams[r], |s| -> replay_arena::Result<()> {
            let mut ws = ws.as_cuda::<u8>(s)?;
            let gemm = |blas: &CudaBlas| -> replay_arena::Result<()> {
                // The handle's own stream is `a_stream`: hand cuBLAS a lent
                // cudarc view, which works whatever stream cudarc names.
                // SAFETY: the lent view's only work is this GEMM, which
                // the handle enqueues on `s` (bound by `with_workspace`).
                unsafe {
                    c.with_cudarc_mut(s, |mut c| -> replay_arena::Result<()> {
                        // SAFETY: a is M x K, b is K x N, c is M x N,
                        // column-major; the handle enqueues on `s` meanwhile.
                        blas.gemm(cfg(), a, b, &mut c)?;
                        Ok(())
                    })
                }
            };
            if r == 0 {
                with_workspace(&handle, s, &mut ws, |blas| {
                    assert_eq!(handle_stream(blas), s.cudarc().cu_stream() as usize);
                    gemm(blas)
                })
            } else {
                // The same handle as a raw `cublasHandle_t`.
                // SAFETY: the handle lives for the call, on this thread only.
                unsafe { with_workspace_raw(*handle.handle(), s, &mut ws, || gemm(&handle)) }
            }
        })
        .unwrap();
        cap.finish().unwrap();
        assert_eq!(
            handle_stream(&handle),
            home,
            "runner {r}: the handle's stream is back"
        );
    }
    let mut replayable = capturing.seal().unwrap();
    let mut outs: Vec<CudaSlice<f32>> = (0..2)
        .map(|_| side.cudarc().alloc_zeros(M * N).unwrap())
        .collect();
    side.synchronize().unwrap();
    let mut differ = 0usize;
    for step in 0..50 {
        for r in 0..2usize {
            replayable.replay(RunnerId(r as u32), streams[r]).unwrap();
            replayable
                .consume(RunnerId(r as u32), &side, |s, views| {
                    views[0].copy_into::<f32>(s, &mut outs[r])
                })
                .unwrap();
        }
        if step % 10 == 9 {
            for r in 0..2 {
                let host = side.cudarc().clone_dtoh(&outs[r]).unwrap();
                side.synchronize().unwrap();
                differ += host
                    .iter()
                    .zip(&expected[r])
                    .filter(|(x, y)| x != y)
                    .count();
            }
        }
    }
    assert_eq!(differ, 0, "{differ} elements differ from the host gemm");
    drop(replayable);

    // After the plan is gone, eager cuBLAS work on the handle uses cuBLAS's
    // own workspace, not freed arena bytes.
    let mut c: CudaSlice<f32> = a_stream.cudarc().alloc_zeros(M * N).unwrap();
    let (a, b) = &device[0];
    // SAFETY: shapes as above; the handle enqueues on its own stream.
    unsafe { handle.gemm(cfg(), a, b, &mut c) }.unwrap();
    let host = a_stream.cudarc().clone_dtoh(&c).unwrap();
    a_stream.synchronize().unwrap();
    assert_eq!(host, expected[0]);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_handle_is_put_back_after_a_failing_or_panicking_closure() {
    let backend = device();
    let (home_stream, capture_stream) =
        (backend.new_stream().unwrap(), backend.new_stream().unwrap());
    let home = home_stream.cudarc().cu_stream() as usize;
    let handle = Arc::new(CudaBlas::new(home_stream.cudarc().clone()).unwrap());
    let runners = (0..3).map(|r| (RunnerId(r), [WS]));
    let mut capturing = allocate(&backend, runners, Policy::Generations(1));

    // A failing closure: the error comes back, the handle is put back.
    let cap = capturing.capture(RunnerId(0)).unwrap();
    let ws = cap.take(WS).unwrap();
    let err = cap
        .stream_capture(&capture_stream, |s| -> replay_arena::Result<()> {
            let mut ws = ws.as_cuda::<u8>(s)?;
            with_workspace(&handle, s, &mut ws, |_| {
                Err(BackendError::Refused {
                    call: "the framework's op",
                    reason: "failed".into(),
                }
                .into())
            })
        })
        .unwrap_err();
    assert!(matches!(err, StreamCaptureError::Work(_)), "{err}");
    assert_eq!(handle_stream(&handle), home);
    drop(cap);

    // A panicking closure: the panic goes on, the handle is put back.
    let cap = capturing.capture(RunnerId(1)).unwrap();
    let ws = cap.take(WS).unwrap();
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        cap.stream_capture(&capture_stream, |s| -> replay_arena::Result<()> {
            let mut ws = ws.as_cuda::<u8>(s)?;
            with_workspace(&handle, s, &mut ws, |_| -> replay_arena::Result<()> {
                panic!("a framework op panics")
            })
        })
        .map_err(|e| e.to_string())
    }));
    assert!(panicked.is_err());
    assert_eq!(handle_stream(&handle), home);
    drop(cap);

    // A workspace bound outside its closure is refused before the handle
    // is touched.
    let cap = capturing.capture(RunnerId(2)).unwrap();
    let ws = cap.take(WS).unwrap();
    let mut outside = None;
    cap.stream_capture(&capture_stream, |s| -> replay_arena::Result<()> {
        outside = Some(ws.as_cuda::<u8>(s)?);
        Ok(())
    })
    .unwrap();
    let mut ws = outside.unwrap();
    let refused = with_workspace(
        &handle,
        &capture_stream,
        &mut ws,
        |_| -> replay_arena::Result<()> { panic!("must not run") },
    );
    assert!(
        matches!(
            refused,
            Err(replay_arena::Error::Backend(BackendError::Refused {
                call: "cublasSetWorkspace",
                ..
            }))
        ),
        "{refused:?}"
    );
    assert_eq!(handle_stream(&handle), home);
}
