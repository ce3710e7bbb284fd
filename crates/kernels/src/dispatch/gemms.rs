//! The prefill GEMMs the dispatch table lists (x86-64 only).

use super::{Choice, Feature::Base, Gemm};
use crate::simd::{avx2_gemm_32, avx2_gemm_k, avx512_gemm, avx512_gemm_k};

/// The lane GEMM for types of 32-value blocks (Q8_0 or Q8_1 activations):
/// it sums in its own order.
pub(super) const GEMM_Q8_0: Choice<Gemm> =
    &[(Base, Gemm { name: "avx512_gemm", run: avx512_gemm::matmul, min_m: avx512_gemm::MIN_M, exact: false })];

/// The lane GEMM for the K-quants and IQ4_XS (Q8_K activations).
pub(super) const GEMM_K: Choice<Gemm> =
    &[(Base, Gemm { name: "avx512_gemm_k", run: avx512_gemm_k::matmul, min_m: avx512_gemm_k::MIN_M, exact: true })];

/// Its AVX2 sibling (8 lanes).
pub(super) const GEMM_K_AVX2: Choice<Gemm> =
    &[(Base, Gemm { name: "avx2_gemm_k", run: avx2_gemm_k::matmul, min_m: avx2_gemm_k::MIN_M, exact: true })];

/// The same GEMM for the grid I-quants, from [`avx2_gemm_k::MIN_M_GRID`]
/// rows: their one-row kernels decode every block again for each row of a
/// batch.
pub(super) const GEMM_K_AVX2_GRID: Choice<Gemm> =
    &[(Base, Gemm { name: "avx2_gemm_k", run: avx2_gemm_k::matmul, min_m: avx2_gemm_k::MIN_M_GRID, exact: true })];

/// The AVX2 lane GEMM of the 32-value types with signed codes and Q8_0
/// activations (IQ4_NL, Q5_0, Q4_0, Q8_0): exact.
pub(super) const GEMM_32_AVX2: Choice<Gemm> =
    &[(Base, Gemm { name: "avx2_gemm_32", run: avx2_gemm_32::matmul, min_m: avx2_gemm_32::MIN_M, exact: true })];
