//! NVFP4 as GGUF stores it (type 40, llama.cpp `block_nvfp4`): 64 E2M1 values
//! in four 16-value sub-blocks, each with an unsigned E4M3 scale:
//! `{u8 d[4]; u8 qs[32]}` = 36 bytes. In sub-block `s`, `qs[8s+j]` holds
//! element `16s+j` (low nibble) and `16s+j+8` (high nibble).
//!
//! `x = E2M1(q) · E4M3(d[s])`. The publishers' FP32 per-tensor scale is not in
//! the block: it travels beside the weight and multiplies the matmul output
//! (ModelOpt's `weight_scale_2`, `1/weight_global_scale` for compressed-tensors).
//! The dot uses ggml's convention (doubled codes, halved scale) against Q8_0
//! activations: one activation block covers two sub-blocks.

use super::minifloat::{e4m3_is_nan, e4m3_to_f32, f32_to_e2m1, f32_to_e4m3, ue4m3_half, E2M1_X2};
use super::q8_0::BlockQ8_0;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockNvfp4 {
    /// UE4M3 scale per 16-value sub-block; 0x7F/0xFF (NaN) are refused at load.
    pub d: [u8; 4],
    pub qs: [u8; 32],
}
const _: () = assert!(std::mem::size_of::<BlockNvfp4>() == 36);

impl BlockNvfp4 {
    pub const ELEMS: usize = 64;
}

pub fn dequantize(blocks: &[BlockNvfp4], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 64);
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(64)) {
        for s in 0..4 {
            let d = ue4m3_half(b.d[s]);
            for j in 0..8 {
                let q = b.qs[8 * s + j];
                o[16 * s + j] = E2M1_X2[(q & 15) as usize] as f32 * d;
                o[16 * s + j + 8] = E2M1_X2[(q >> 4) as usize] as f32 * d;
            }
        }
    }
}

/// NVFP4 quantization of `x / global` (ModelOpt's two-level scheme): each
/// 16-value sub-block gets the E4M3 scale `amax/(6·global)` (rounded), then the
/// values round to the nearest E2M1 of `x/(scale·global)`. With
/// `global = amax_tensor/(6·448)` every block scale fits E4M3's range.
/// `global = 1` is plain GGUF NVFP4 without a tensor scale.
pub fn quantize(x: &[f32], global: f32, out: &mut [BlockNvfp4]) {
    assert_eq!(x.len(), out.len() * 64);
    let g = if global > 0.0 && global.is_finite() { global } else { 1.0 };
    for (xb, b) in x.chunks_exact(64).zip(out.iter_mut()) {
        for s in 0..4 {
            let sub = &xb[16 * s..16 * s + 16];
            let code = f32_to_e4m3(super::amax(sub) / (6.0 * g)) & 0x7F;
            b.d[s] = code;
            let scale = e4m3_to_f32(code) * g;
            let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
            for j in 0..8 {
                b.qs[8 * s + j] = f32_to_e2m1(sub[j] * inv) | f32_to_e2m1(sub[j + 8] * inv) << 4;
            }
        }
    }
}

/// Index of the first block with a NaN scale (E4M3 0x7F/0xFF), if any.
pub fn first_bad_block(blocks: &[BlockNvfp4]) -> Option<usize> {
    blocks.iter().position(|b| b.d.iter().any(|&d| e4m3_is_nan(d)))
}

/// ggml's `ggml_vec_dot_nvfp4_q8_0`: Σ over sub-blocks of
/// `ue4m3_half(d[s])·d_a·Σ (2·E2M1)·q8` (i32 sum per sub-block).
pub fn vec_dot(w: &[BlockNvfp4], a: &[BlockQ8_0]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a.chunks_exact(2)) {
        for s in 0..4 {
            let yb = &y[s / 2];
            let off = (s % 2) * 16;
            let mut sumi = 0i32;
            for j in 0..8 {
                let q = x.qs[8 * s + j];
                sumi += E2M1_X2[(q & 15) as usize] as i32 * yb.qs[off + j] as i32;
                sumi += E2M1_X2[(q >> 4) as usize] as i32 * yb.qs[off + j + 8] as i32;
            }
            sum += sumi as f32 * (ue4m3_half(x.d[s]) * yb.d.to_f32());
        }
    }
    sum
}
