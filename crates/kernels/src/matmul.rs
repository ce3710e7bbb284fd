//! `y = x · Wᵀ` over a weight in any [`DType`].
//!
//! Numeric choice (same as llama.cpp): for quantized weights the activations are
//! quantized once per call to the weight's vec-dot type (Q8_0 for Q4_0/Q5_0/Q8_0,
//! Q8_1 for Q4_1/Q5_1, Q8_K for the K-quants) and dot products run on integers.
//! Float weights (F32/F16/BF16) are widened to f32 and multiplied in f32.

use crate::{DType, KernelError, ThreadPool};

/// A row-major weight matrix: `rows` output features, each a contiguous run of
/// `cols` input features stored as `dtype`. Shape in PyTorch order `[rows, cols]`.
#[derive(Debug, Clone, Copy)]
pub struct MatRef<'a> {
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
}

impl<'a> MatRef<'a> {
    /// Checks that `data` holds exactly `rows` rows of `cols` elements.
    pub fn new(dtype: DType, rows: usize, cols: usize, data: &'a [u8]) -> Result<Self, KernelError> {
        let _ = (dtype, rows, cols, data);
        todo!("kernels helper")
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        todo!("kernels helper")
    }

    /// The contiguous rows `start..end` (a tensor-parallel shard of output features).
    pub fn rows_range(&self, start: usize, end: usize) -> MatRef<'a> {
        let _ = (start, end);
        todo!("kernels helper")
    }
}

/// Buffers reused across calls (quantized activations) so the hot loop does not
/// allocate. One per thread of control that calls [`matmul`].
#[derive(Default)]
pub struct MatmulScratch {
    _private: (),
}

/// `y[i, r] = Σ_k x[i, k] · W[r, k]` for `i < m`, `r < w.rows`.
///
/// * `x`: `m × w.cols`, row-major f32.
/// * `y`: `m × w.rows`, row-major f32 (overwritten).
///
/// Work is split across `pool` by output rows (and, for large `m`, by tiles).
pub fn matmul(pool: &ThreadPool, w: MatRef<'_>, x: &[f32], m: usize, y: &mut [f32], scratch: &mut MatmulScratch) {
    let _ = (pool, w, x, m, y, scratch);
    todo!("kernels helper")
}

/// Single-threaded scalar reference with the same numerics as [`matmul`]
/// (including activation quantization). SIMD paths are tested against it.
pub fn matmul_reference(w: MatRef<'_>, x: &[f32], m: usize, y: &mut [f32]) {
    let _ = (w, x, m, y);
    todo!("kernels helper")
}

/// Exact reference: dequantize the weight and accumulate in f64, with no
/// activation quantization. Used to bound the error of the fast path.
pub fn matmul_f64_reference(w: MatRef<'_>, x: &[f32], m: usize, y: &mut [f32]) {
    let _ = (w, x, m, y);
    todo!("kernels helper")
}
