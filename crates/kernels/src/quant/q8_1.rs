//! Q8_1: the activation format for Q4_1/Q5_1 weights. Like Q8_0 plus
//! `s = d · Σq` (f16), which folds the weights' offset `m` into one multiply.

use super::{amax, F16Le};
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ8_1 {
    pub d: F16Le,
    pub s: F16Le,
    pub qs: [i8; 32],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_1>() == 36);

impl BlockQ8_1 {
    pub const ELEMS: usize = 32;
}

/// llama.cpp's x86 `quantize_row_q8_1`: `d = amax/127`,
/// `q = round_half_even(x · 127/amax)`, `s = f16(d · Σq)` with `d` in f32.
pub fn quantize(x: &[f32], out: &mut [BlockQ8_1]) {
    assert_eq!(x.len(), out.len() * 32);
    for (xb, b) in x.chunks_exact(32).zip(out.iter_mut()) {
        let m = amax(xb);
        let d = m / 127.0;
        let id = if m != 0.0 { 127.0 / m } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in b.qs.iter_mut().zip(xb) {
            *q = (v * id).round_ties_even() as i8;
            sum += *q as i32;
        }
        b.d = F16Le::from_f32(d);
        b.s = F16Le::from_f32(d * sum as f32);
    }
}

pub fn dequantize(blocks: &[BlockQ8_1], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 32);
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(32)) {
        let d = b.d.to_f32();
        for (o, &q) in o.iter_mut().zip(&b.qs) {
            *o = q as f32 * d;
        }
    }
}
