//! x86-64 SIMD kernels. Each function is `#[target_feature]`-gated and only
//! reachable through [`crate::quant::dot_fn`] / [`crate::quant::quantize_act_fn`]
//! after [`crate::isa`] confirmed the CPU supports it.

pub mod avx2;
pub mod avx2_attn;
pub mod avx2_fp;
pub mod avx2_k;
pub mod avx2_ops;
pub mod avx2_packed;
pub mod avx2_rows;
pub mod avx2_tile;
pub mod avx512;
pub mod avx512_attn;
pub mod avx512_direct;
pub mod avx512_fp;
pub mod avx512_fp4;
pub mod avx512_fp4_vbmi;
pub mod avx512_fp8_bf16;
pub mod avx512_k;
pub mod avx512_lanes;
pub mod avx512_packed;
pub mod kvq;
pub mod kvq_dot;
pub mod selftest;
