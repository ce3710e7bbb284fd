//! Q4_0: 32 values, one f16 scale, 4-bit codes offset by 8:
//! `x[j] = (lo(qs[j]) − 8)·d`, `x[j+16] = (hi(qs[j]) − 8)·d`.

use super::q8_0::BlockQ8_0;
use super::F16Le;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ4_0 {
    pub d: F16Le,
    pub qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);

impl BlockQ4_0 {
    pub const ELEMS: usize = 32;
}

pub fn dequantize(blocks: &[BlockQ4_0], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 32);
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(32)) {
        let d = b.d.to_f32();
        for (j, &q) in b.qs.iter().enumerate() {
            o[j] = ((q & 15) as i32 - 8) as f32 * d;
            o[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
        }
    }
}

/// llama.cpp's `quantize_row_q4_0_ref`: `max` is the value of largest magnitude
/// (signed), `d = max / −8`, `q = min(15, trunc(x/d + 8.5))`.
pub fn quantize(x: &[f32], out: &mut [BlockQ4_0]) {
    assert_eq!(x.len(), out.len() * 32);
    for (xb, b) in x.chunks_exact(32).zip(out.iter_mut()) {
        let mut amax = 0f32;
        let mut max = 0f32;
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = F16Le::from_f32(d);
        for j in 0..16 {
            let q0 = ((xb[j] * id + 8.5) as i8).min(15) as u8;
            let q1 = ((xb[j + 16] * id + 8.5) as i8).min(15) as u8;
            b.qs[j] = q0 | (q1 << 4);
        }
    }
}

/// Σ_b d_w·d_a·Σ (q4 − 8)·q8.
pub fn vec_dot(w: &[BlockQ4_0], a: &[BlockQ8_0]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let mut sumi = 0i32;
        for j in 0..16 {
            let v0 = (x.qs[j] & 15) as i32 - 8;
            let v1 = (x.qs[j] >> 4) as i32 - 8;
            sumi += v0 * y.qs[j] as i32 + v1 * y.qs[j + 16] as i32;
        }
        sum += sumi as f32 * (x.d.to_f32() * y.d.to_f32());
    }
    sum
}

/// The same dot summed the way the sixteen-row AVX-512 kernel
/// ([`crate::simd::avx512_rows16`]) sums it, block by block in order:
/// `acc = fma(d_w·d_a, Σ (q − 8)·y, acc)`. That kernel equals this bit for
/// bit at every batch size.
pub fn vec_dot_sequential(w: &[BlockQ4_0], a: &[BlockQ8_0]) -> f32 {
    let mut acc = 0f32;
    for (x, y) in w.iter().zip(a) {
        let mut sumi = 0i32;
        for j in 0..16 {
            sumi += ((x.qs[j] & 15) as i32 - 8) * y.qs[j] as i32 + ((x.qs[j] >> 4) as i32 - 8) * y.qs[j + 16] as i32;
        }
        acc = (x.d.to_f32() * y.d.to_f32()).mul_add(sumi as f32, acc);
    }
    acc
}
