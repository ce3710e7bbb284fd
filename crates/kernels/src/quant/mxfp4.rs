//! MXFP4 (OCP MX v1.0, GGUF type 39, llama.cpp `block_mxfp4`): 32 E2M1 values
//! sharing one E8M0 scale, `{u8 e; u8 qs[16]}` = 17 bytes.
//! `x[j] = E2M1(lo(qs[j]))·2^(e−127)`, `x[j+16] = E2M1(hi(qs[j]))·2^(e−127)`
//! (the Q4_0 nibble order). The dot uses the doubled codes [`E2M1_X2`] against
//! Q8_0 activations with the halved scale `2^(e−128)`, as ggml does.

use super::minifloat::{e8m0_half, f32_to_e2m1, E2M1_X2};
use super::q8_0::BlockQ8_0;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockMxfp4 {
    /// E8M0 shared exponent; 0xFF (NaN) is refused at load.
    pub e: u8,
    pub qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockMxfp4>() == 17);

impl BlockMxfp4 {
    pub const ELEMS: usize = 32;
}

pub fn dequantize(blocks: &[BlockMxfp4], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 32);
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(32)) {
        let d = e8m0_half(b.e);
        for (j, &q) in b.qs.iter().enumerate() {
            o[j] = E2M1_X2[(q & 15) as usize] as f32 * d;
            o[j + 16] = E2M1_X2[(q >> 4) as usize] as f32 * d;
        }
    }
}

/// OCP MX quantization (as ggml's `quantize_row_mxfp4_ref`): shared exponent
/// `floor(log2(amax)) − 2` (6 = 1.5·2² is the largest E2M1), then each value
/// rounded to the nearest E2M1 (values above 6·scale saturate).
pub fn quantize(x: &[f32], out: &mut [BlockMxfp4]) {
    assert_eq!(x.len(), out.len() * 32);
    for (xb, b) in x.chunks_exact(32).zip(out.iter_mut()) {
        let amax = super::amax(xb);
        let e =
            if amax > 0.0 && amax.is_finite() { (amax.log2().floor() as i32 - 2 + 127).clamp(0, 254) as u8 } else { 0 };
        let inv = 1.0 / (2.0 * e8m0_half(e));
        b.e = e;
        for j in 0..16 {
            b.qs[j] = f32_to_e2m1(xb[j] * inv) | f32_to_e2m1(xb[j + 16] * inv) << 4;
        }
    }
}

/// Index of the first block with a NaN scale (E8M0 0xFF), if any.
pub fn first_bad_block(blocks: &[BlockMxfp4]) -> Option<usize> {
    blocks.iter().position(|b| b.e == 0xFF)
}

/// Σ_b 2^(e−128)·d_a·Σ (2·E2M1)·q8, with an i32 sum per block.
pub fn vec_dot(w: &[BlockMxfp4], a: &[BlockQ8_0]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let mut sumi = 0i32;
        for j in 0..16 {
            sumi += E2M1_X2[(x.qs[j] & 15) as usize] as i32 * y.qs[j] as i32;
            sumi += E2M1_X2[(x.qs[j] >> 4) as usize] as i32 * y.qs[j + 16] as i32;
        }
        sum += sumi as f32 * (e8m0_half(x.e) * y.d.to_f32());
    }
    sum
}
