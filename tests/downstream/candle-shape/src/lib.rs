//! Compiles the adoption path against this crate's cudarc choices.

#[path = "../../interop.rs"]
pub mod interop;

use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use replay_arena::cuda::ViewExt;
use replay_arena::cuda;
use replay_arena::View;

/// `c = a * b` (column-major, m x k times k x n) with cuBLAS, straight into
/// views of the plan: the program's own cudarc types take them.
pub fn gemm_into_views(
    blas: &CudaBlas,
    stream: &cuda::Stream,
    (a, b, c): (&View<'_>, &View<'_>, &View<'_>),
    (m, n, k): (i32, i32, i32),
) -> Result<(), Box<dyn std::error::Error>> {
    let a = a.as_cuda::<f32>(stream)?;
    let b = b.as_cuda::<f32>(stream)?;
    let mut c = c.as_cuda::<f32>(stream)?;
    let cfg = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_N,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m,
        n,
        k,
        alpha: 1.0f32,
        lda: m,
        ldb: k,
        beta: 0.0f32,
        ldc: m,
    };
    // SAFETY: the views hold m*k, k*n and m*n floats (checked by the caller).
    unsafe { blas.gemm(cfg, &a, &b, &mut c) }.map_err(|e| format!("cublas: {:?}", e.0))?;
    Ok(())
}

/// A bf16 view through cudarc's `f16` feature.
pub fn bf16_view<'a>(
    view: &View<'a>,
    stream: &cuda::Stream,
) -> Result<replay_arena::cuda::TypedView<'a, half::bf16>, replay_arena::BackendError> {
    view.as_cuda::<half::bf16>(stream)
}
