//! Q5_1: 32 values, f16 scale `d` and offset `m`, 5-bit codes (`x = q·d + m`),
//! bits packed as in Q5_0.

use super::q8_1::BlockQ8_1;
use super::F16Le;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ5_1 {
    pub d: F16Le,
    pub m: F16Le,
    pub qh: [u8; 4],
    pub qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == 24);

impl BlockQ5_1 {
    pub const ELEMS: usize = 32;

    /// The 32 unsigned 5-bit codes (0..32) in element order.
    #[inline]
    pub fn codes(&self) -> [u8; 32] {
        let qh = u32::from_le_bytes(self.qh);
        let mut q = [0u8; 32];
        for j in 0..16 {
            q[j] = (self.qs[j] & 15) | ((((qh >> j) & 1) as u8) << 4);
            q[j + 16] = (self.qs[j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
        }
        q
    }
}

pub fn dequantize(blocks: &[BlockQ5_1], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 32);
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(32)) {
        let (d, m) = (b.d.to_f32(), b.m.to_f32());
        for (o, q) in o.iter_mut().zip(b.codes()) {
            *o = q as f32 * d + m;
        }
    }
}

/// Σ_b (d_w·d_a·Σ q5·q8 + m_w·s_a).
pub fn vec_dot(w: &[BlockQ5_1], a: &[BlockQ8_1]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let sumi: i32 = x.codes().iter().zip(&y.qs).map(|(&p, &q)| p as i32 * q as i32).sum();
        sum += sumi as f32 * (x.d.to_f32() * y.d.to_f32()) + x.m.to_f32() * y.s.to_f32();
    }
    sum
}

/// llama.cpp's `quantize_row_q5_1_ref`: `d = (max − min)/31`, `m = min`,
/// `q = trunc((x − min)/d + 0.5)`.
pub fn quantize(x: &[f32], out: &mut [BlockQ5_1]) {
    assert_eq!(x.len(), out.len() * 32);
    for (xb, b) in x.chunks_exact(32).zip(out.iter_mut()) {
        let (mut min, mut max) = (f32::MAX, -f32::MAX);
        for &v in xb {
            min = min.min(v);
            max = max.max(v);
        }
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = F16Le::from_f32(d);
        b.m = F16Le::from_f32(min);
        let q: [u8; 32] = std::array::from_fn(|j| ((xb[j] - min) * id + 0.5) as u8);
        (b.qs, b.qh) = super::q5_0::pack5(&q);
    }
}
