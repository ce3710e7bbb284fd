//! shardlm-kernels: the numeric heart of shardlm.
//!
//! * [`DType`]: every weight storage type we read (float and GGUF block quants).
//! * [`quant`]: one file per block format: layout, reference dequantize, reference
//!   quantize (where we produce it) and the scalar dot product against 8-bit activations.
//! * [`matmul`](mod@matmul): `y = x · Wᵀ` over a weight stored in any [`DType`], multi-threaded on
//!   the persistent [`pool::ThreadPool`], dispatched at run time to the best ISA.
//! * [`ops`]: the small f32 steps (RMSNorm, rope, softmax, SiLU/GELU).
//! * [`attention`](mod@attention): tiled causal attention over the KV cache (online softmax);
//!   f16, f32 or the quantized Q8_0/Q4_0 blocks of [`kv_quant`].
//!
//! We write these ourselves because they *are* the product: speed on CPUs comes from
//! kernels that read quantized weights directly, and distribution needs kernels that
//! work on any row range of a weight (a tensor-parallel shard). A general BLAS or
//! tensor library gives us neither: none reads GGUF blocks in place, their thread
//! pools are fork-join (too slow at batch 1, where one op is a few microseconds),
//! and matching llama.cpp's logits needs its exact activation quantization.
//!
//! Every SIMD kernel has a scalar reference and is tested against it. Set
//! `SHARDLM_ISA=scalar|avx2|avx512` to force a lower ISA level (see [`isa`]).
//!
//! # Numerics
//! As llama.cpp's CPU backend: activations are quantized once per matmul to the
//! weight's vec-dot type (Q8_0 for Q4_0/Q5_0/Q8_0/MXFP4/NVFP4, Q8_1 for Q4_1/Q5_1, Q8_K for the
//! K-quants) and dot products run on integers with one float FMA per block. Float
//! weights multiply f32 activations in f32. [`matmul::matmul_reference`] has the
//! same numerics in plain scalar code; [`matmul::matmul_f64_reference`] is exact.
//!
//! # ISA coverage (x86-64)
//! Which kernel each type runs at each level is the one table
//! [`dispatch::TABLE`]; in short:
//!
//! | weight | scalar | AVX2+FMA | AVX-512 VNNI |
//! |---|---|---|---|
//! | Q4_0, Q4_1, Q8_0 | ✓ | one-row and four-row kernels | one-row and four-row (VNNI), lane GEMM |
//! | Q5_0, Q5_1 | ✓ | one-row | AVX2 one-row, lane GEMM |
//! | Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS | ✓ | one-row, 8-lane GEMM | one-row (512-bit), sixteen-row groups in the vector lanes (`packed::lanes16`, `simd::avx512_rows16_k`), lane GEMM |
//! | IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S | ✓ | one-row, 8-lane GEMM | one-row (512-bit gathers for IQ2_XXS with VBMI, IQ2_XS, IQ3_S; else AVX2), lane GEMM |
//! | IQ1_S, IQ1_M | ✓ | one-row | AVX2 one-row |
//! | F32, F16, BF16 | ✓ | one-row | one-row (masked tails) |
//! | MXFP4, NVFP4 (× Q8_0), FP8 (× f32) | ✓ | one-row | one-row (VNNI / 512-bit); MXFP4 lane GEMM |
//!
//! For `m > 1` (prefill), Q4_0, Q4_1, MXFP4, NVFP4 and FP8 also have AVX2 4 × 2 tile kernels (four
//! weight rows × two activation rows); batches of at least 32 rows take the
//! lane GEMMs where listed (`simd::avx512_gemm`, `simd::avx512_gemm_k`,
//! `simd::avx2_gemm_k`: activation rows in the vector lanes). Q4_0, Q4_1 and Q8_0 weights can be
//! repacked at load into the interleaved four-row layout of [`packed`], with
//! their own AVX2 four-row and tile kernels (scalar: rows unpacked, then the
//! reference dot). The activation quantizers (Q8_0, Q8_1,
//! Q8_K) have AVX2 versions that are bit-identical to the scalar ones. A SIMD level is used only after a start-up
//! self-check against scalar ([`simd::selftest`]); aarch64 runs the scalar code.

#![allow(clippy::needless_range_loop)]

pub mod affinity;
pub mod attention;
pub mod delta_rule;
pub mod dispatch;
pub mod dtype;
pub mod hugepages;
pub mod isa;
pub mod kv_int_dot;
pub mod kv_quant;
pub mod matmul;
pub mod ops;
pub mod packed;
pub mod pool;
pub mod quant;
#[cfg(target_arch = "x86_64")]
pub mod simd;

pub use dtype::DType;
pub use matmul::{matmul, matmul_each, matmul_many, MatRef, MatmulScratch};
pub use pool::ThreadPool;

/// Errors from kernel-level helpers (bad sizes, unsupported conversions).
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("row of {elems} elements is not a multiple of the {dtype} block size {block}")]
    BadRowLength { dtype: DType, elems: usize, block: usize },
    #[error("expected {expected} bytes, got {actual}")]
    BadDataLength { expected: usize, actual: usize },
    #[error("a {dtype} weight of {rows}×{cols} has no packed four-row layout")]
    NotPackable { dtype: DType, rows: usize, cols: usize },
    #[error("{dtype} block {block} has a NaN or infinite scale (or FP8 NaN code)")]
    BadScale { dtype: DType, block: usize },
    #[error("cannot quantize to {0}: only q8_0, q4_0, mxfp4, nvfp4 and fp8 are produced")]
    UnsupportedQuantizeTarget(DType),
}
