//! Q5_0: 32 values, f16 scale, 5-bit codes offset by 16. The low 4 bits are
//! packed like Q4_0; bit `j` of the little-endian u32 `qh` is the 5th bit of
//! element `j`.

use super::q8_0::BlockQ8_0;
use super::F16Le;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ5_0 {
    pub d: F16Le,
    pub qh: [u8; 4],
    pub qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);

impl BlockQ5_0 {
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

pub fn dequantize(blocks: &[BlockQ5_0], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 32);
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(32)) {
        let d = b.d.to_f32();
        for (o, q) in o.iter_mut().zip(b.codes()) {
            *o = (q as i32 - 16) as f32 * d;
        }
    }
}

/// Σ_b d_w·d_a·Σ (q5 − 16)·q8.
pub fn vec_dot(w: &[BlockQ5_0], a: &[BlockQ8_0]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let sumi: i32 = x.codes().iter().zip(&y.qs).map(|(&p, &q)| (p as i32 - 16) * q as i32).sum();
        sum += sumi as f32 * (x.d.to_f32() * y.d.to_f32());
    }
    sum
}

/// Packs 32 5-bit codes (element order) into `(qs, qh)`.
pub(crate) fn pack5(q: &[u8; 32]) -> ([u8; 16], [u8; 4]) {
    let mut qs = [0u8; 16];
    let mut qh = 0u32;
    for j in 0..16 {
        qs[j] = (q[j] & 15) | ((q[j + 16] & 15) << 4);
        qh |= ((q[j] >> 4) as u32 & 1) << j;
        qh |= ((q[j + 16] >> 4) as u32 & 1) << (j + 16);
    }
    (qs, qh.to_le_bytes())
}

/// llama.cpp's `quantize_row_q5_0_ref`: `max` is the value of largest
/// magnitude (signed), `d = max / −16`, `q = min(31, trunc(x/d + 16.5))`.
pub fn quantize(x: &[f32], out: &mut [BlockQ5_0]) {
    assert_eq!(x.len(), out.len() * 32);
    for (xb, b) in x.chunks_exact(32).zip(out.iter_mut()) {
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = F16Le::from_f32(d);
        let q: [u8; 32] = std::array::from_fn(|j| ((xb[j] * id + 16.5) as i8).min(31) as u8);
        (b.qs, b.qh) = pack5(&q);
    }
}
