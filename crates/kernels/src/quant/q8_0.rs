//! Q8_0: 32 values, one f16 scale `d`, `x = d · q` with `q: i8`.
//!
//! Used both as a weight format (load-time `--quantize q8_0`) and as the
//! activation format for Q4_0/Q5_0/Q8_0 weights.

use super::{amax, F16Le};
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ8_0 {
    pub d: F16Le,
    pub qs: [i8; 32],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);

impl BlockQ8_0 {
    pub const ELEMS: usize = 32;
}

pub fn dequantize(blocks: &[BlockQ8_0], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 32);
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(32)) {
        let d = b.d.to_f32();
        for (o, &q) in o.iter_mut().zip(&b.qs) {
            *o = q as f32 * d;
        }
    }
}

/// Weight quantization, llama.cpp's `quantize_row_q8_0_ref`: `d = amax/127`,
/// `q = roundf(x · (1/d))` (ties away from zero).
pub fn quantize(x: &[f32], out: &mut [BlockQ8_0]) {
    assert_eq!(x.len(), out.len() * 32);
    for (xb, b) in x.chunks_exact(32).zip(out.iter_mut()) {
        let d = amax(xb) / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = F16Le::from_f32(d);
        for (q, &v) in b.qs.iter_mut().zip(xb) {
            *q = (v * id).round() as i8;
        }
    }
}

/// Activation quantization as llama.cpp's x86 CPU backend does it
/// (`quantize_row_q8_0` AVX path): `d = amax/127` stored as f16,
/// `q = round_half_even(x · (127/amax))`. SIMD versions are bit-identical.
pub fn quantize_activations(x: &[f32], out: &mut [BlockQ8_0]) {
    assert_eq!(x.len(), out.len() * 32);
    for (xb, b) in x.chunks_exact(32).zip(out.iter_mut()) {
        let m = amax(xb);
        b.d = F16Le::from_f32(m / 127.0);
        let id = if m != 0.0 { 127.0 / m } else { 0.0 };
        for (q, &v) in b.qs.iter_mut().zip(xb) {
            *q = (v * id).round_ties_even() as i8;
        }
    }
}

/// Σ_b d_w·d_a·Σ q_w·q_a with an i32 sum per block.
pub fn vec_dot(w: &[BlockQ8_0], a: &[BlockQ8_0]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let sumi: i32 = x.qs.iter().zip(&y.qs).map(|(&p, &q)| p as i32 * q as i32).sum();
        sum += sumi as f32 * (x.d.to_f32() * y.d.to_f32());
    }
    sum
}

/// The same dot summed the way the sixteen-row AVX-512 kernel
/// ([`crate::simd::avx512_rows16`]) sums it, block by block in order:
/// `acc = fma(d_w·d_a, Σ w·y, acc)`. That kernel equals this bit for bit at
/// every batch size.
pub fn vec_dot_sequential(w: &[BlockQ8_0], a: &[BlockQ8_0]) -> f32 {
    let mut acc = 0f32;
    for (x, y) in w.iter().zip(a) {
        let sumi: i32 = x.qs.iter().zip(&y.qs).map(|(&p, &q)| p as i32 * q as i32).sum();
        acc = (x.d.to_f32() * y.d.to_f32()).mul_add(sumi as f32, acc);
    }
    acc
}
