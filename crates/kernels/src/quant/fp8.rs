//! FP8 E4M3 weights in shardlm's own 64-value block: `{f32 d (LE); u8 q[64]}` =
//! 68 bytes (1.0625 bytes per weight, as Q8_0). `x = d · E4M3(q)`.
//!
//! Publishers ship FP8 with a scale per tensor, per output row or per 128×128
//! block; the loader repeats that scale into every 64-value block it covers
//! (exact: the scale is copied, not recomputed), so one kernel serves all three
//! and any row range is a valid shard. It has no GGUF type id (llama.cpp has no
//! FP8 type). The dot takes f32 activations: its only error is f32 rounding.

use super::minifloat::{e4m3_is_nan, e4m3_to_f32, f32_to_e4m3, E4M3_MAX};
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockFp8 {
    /// f32 scale, little-endian bytes (alignment 1).
    pub d: [u8; 4],
    pub qs: [u8; 64],
}
const _: () = assert!(std::mem::size_of::<BlockFp8>() == 68);

impl BlockFp8 {
    pub const ELEMS: usize = 64;

    #[inline(always)]
    pub fn scale(&self) -> f32 {
        f32::from_le_bytes(self.d)
    }
}

pub fn dequantize(blocks: &[BlockFp8], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 64);
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(64)) {
        let d = b.scale();
        for (o, &q) in o.iter_mut().zip(&b.qs) {
            *o = e4m3_to_f32(q) * d;
        }
    }
}

/// Encodes `x` with the given scale: `q = E4M3(x / scale)` (nearest even, saturating).
pub fn encode(x: &[f32], scale: f32, q: &mut [u8]) {
    let inv = if scale != 0.0 { 1.0 / scale } else { 0.0 };
    for (q, &v) in q.iter_mut().zip(x) {
        *q = f32_to_e4m3(v * inv);
    }
}

/// Per-block quantization: `d = amax/448`.
pub fn quantize(x: &[f32], out: &mut [BlockFp8]) {
    assert_eq!(x.len(), out.len() * 64);
    for (xb, b) in x.chunks_exact(64).zip(out.iter_mut()) {
        let d = super::amax(xb) / E4M3_MAX;
        b.d = d.to_le_bytes();
        encode(xb, d, &mut b.qs);
    }
}

/// Index of the first block with a non-finite scale or a NaN code, if any.
pub fn first_bad_block(blocks: &[BlockFp8]) -> Option<usize> {
    blocks.iter().position(|b| !b.scale().is_finite() || b.qs.iter().any(|&q| e4m3_is_nan(q)))
}

/// Σ_b d·Σ E4M3(q)·a in f32 (the per-block sum first, then scaled).
pub fn vec_dot(w: &[BlockFp8], a: &[f32]) -> f32 {
    let mut sum = 0f32;
    for (x, a) in w.iter().zip(a.chunks_exact(64)) {
        let mut s = 0f32;
        for (&q, &v) in x.qs.iter().zip(a) {
            s += e4m3_to_f32(q) * v;
        }
        sum += s * x.scale();
    }
    sum
}

/// Whether the FP8 kernels at `isa` round the activations to bf16 (the AVX-512
/// BF16 kernels, [`crate::simd::avx512_fp8_bf16`]); otherwise they are exact
/// up to f32 rounding.
pub fn bf16_activations(isa: crate::isa::Isa) -> bool {
    #[cfg(target_arch = "x86_64")]
    if isa == crate::isa::Isa::Avx512 {
        return crate::simd::avx512_fp8_bf16::has_bf16();
    }
    let _ = isa;
    false
}

/// The relative part of the bf16 kernels' error bound for `n`-value rows:
/// `2⁻⁸ + 2·γ(n+2)·(1 + 2⁻⁸)` with `γ(k) = k·2⁻²⁴/(1 − k·2⁻²⁴)`, a multiple of
/// `Σ|w·a|` (see [`bf16_dot_bound`]).
pub fn bf16_rel_bound(n: usize) -> f32 {
    let k = (n + 2) as f64 * 2f64.powi(-24);
    let gamma = k / (1.0 - k);
    ((2f64.powi(-8) + 2.0 * gamma * (1.0 + 2f64.powi(-8))) * (1.0 + 1e-6)) as f32
}

/// The bound on `|bf16 kernel − vec_dot(w, a)|` derived in
/// [`crate::simd::avx512_fp8_bf16`]: `bf16_rel_bound(n)·Σ|w·a| +
/// 2⁻¹²⁶·(Σ|w| + 128·Σ|d|)`, `w` the dequantized weights (the last term covers
/// the denormals the bf16 instructions flush). Sums in f64, rounded up.
pub fn bf16_dot_bound(w: &[BlockFp8], a: &[f32]) -> f32 {
    let (mut wa, mut wabs, mut dabs) = (0f64, 0f64, 0f64);
    for (x, a) in w.iter().zip(a.chunks_exact(64)) {
        let d = x.scale() as f64;
        dabs += d.abs();
        for (&q, &v) in x.qs.iter().zip(a) {
            let wv = (e4m3_to_f32(q) as f64 * d).abs();
            wabs += wv;
            wa += wv * (v as f64).abs();
        }
    }
    let rel = bf16_rel_bound(w.len() * 64) as f64;
    ((rel * wa + 2f64.powi(-126) * (wabs + 128.0 * dabs)) * (1.0 + 1e-6)) as f32
}
