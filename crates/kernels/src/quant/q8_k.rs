//! Q8_K: the activation format for the K-quants. 256 values, an f32 scale and
//! the sums of each 16-value group (`bsums`), which let a K-quant dot product
//! apply its per-sub-block minimums without re-reading the activations.

use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; 256],
    pub bsums: [i16; 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ8K>() == 292);

impl BlockQ8K {
    pub const ELEMS: usize = 256;
}

/// llama.cpp's `quantize_row_q8_K_ref`: `max` is the value of largest magnitude
/// (with its sign), `iscale = -127/max`, `q = min(127, nearest_even(iscale·x))`,
/// `d = 1/iscale` (so `d` is negative when `max` is positive).
pub fn quantize(x: &[f32], out: &mut [BlockQ8K]) {
    assert_eq!(x.len(), out.len() * 256);
    for (xb, b) in x.chunks_exact(256).zip(out.iter_mut()) {
        let mut amax = 0f32;
        let mut max = 0f32;
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            b.d = 0.0;
            b.qs = [0; 256];
            b.bsums = [0; 16];
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in b.qs.iter_mut().zip(xb) {
            *q = ((iscale * v).round_ties_even() as i32).min(127) as i8;
        }
        for (s, g) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
            *s = g.iter().map(|&q| q as i16).sum();
        }
        b.d = 1.0 / iscale;
    }
}

pub fn dequantize(blocks: &[BlockQ8K], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 256);
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(256)) {
        for (o, &q) in o.iter_mut().zip(&b.qs) {
            *o = q as f32 * b.d;
        }
    }
}
