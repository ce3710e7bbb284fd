//! Q4_1: 32 values, f16 scale `d` and offset `m`, 4-bit codes:
//! `x = q·d + m` (low nibbles are elements 0..16, high nibbles 16..32).

use super::q8_1::BlockQ8_1;
use super::F16Le;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ4_1 {
    pub d: F16Le,
    pub m: F16Le,
    pub qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);

impl BlockQ4_1 {
    pub const ELEMS: usize = 32;
}

pub fn dequantize(blocks: &[BlockQ4_1], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 32);
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(32)) {
        let (d, m) = (b.d.to_f32(), b.m.to_f32());
        for (j, &q) in b.qs.iter().enumerate() {
            o[j] = (q & 15) as f32 * d + m;
            o[j + 16] = (q >> 4) as f32 * d + m;
        }
    }
}

/// Σ_b (d_w·d_a·Σ q4·q8 + m_w·s_a).
pub fn vec_dot(w: &[BlockQ4_1], a: &[BlockQ8_1]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let mut sumi = 0i32;
        for j in 0..16 {
            sumi += (x.qs[j] & 15) as i32 * y.qs[j] as i32 + (x.qs[j] >> 4) as i32 * y.qs[j + 16] as i32;
        }
        sum += sumi as f32 * (x.d.to_f32() * y.d.to_f32()) + x.m.to_f32() * y.s.to_f32();
    }
    sum
}
