//! Q5_K: Q4_K plus a 5th bit per value: `qh[l]` bit `2c` belongs to element
//! `64c+l` (low nibble), bit `2c+1` to element `64c+32+l` (high nibble).

use super::q4_k::{scale_min, scales_mins};
use super::q8_k::BlockQ8K;
use super::F16Le;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ5K {
    pub d: F16Le,
    pub dmin: F16Le,
    pub scales: [u8; 12],
    pub qh: [u8; 32],
    pub qs: [u8; 128],
}
const _: () = assert!(std::mem::size_of::<BlockQ5K>() == 176);

impl BlockQ5K {
    pub const ELEMS: usize = 256;

    /// The 5-bit codes of chunk `c` (0..4): elements `64c..64c+64`.
    #[inline]
    pub fn chunk_codes(&self, c: usize) -> [u8; 64] {
        let mut q = [0u8; 64];
        for l in 0..32 {
            let v = self.qs[32 * c + l];
            let h = self.qh[l] >> (2 * c);
            q[l] = (v & 15) | ((h & 1) << 4);
            q[l + 32] = (v >> 4) | (((h >> 1) & 1) << 4);
        }
        q
    }
}

pub fn dequantize(blocks: &[BlockQ5K], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 256);
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(256)) {
        let (d, dmin) = (b.d.to_f32(), b.dmin.to_f32());
        for c in 0..4 {
            let (sc0, m0) = scale_min(2 * c, &b.scales);
            let (sc1, m1) = scale_min(2 * c + 1, &b.scales);
            let q = b.chunk_codes(c);
            for l in 0..32 {
                o[64 * c + l] = d * sc0 as f32 * q[l] as f32 - dmin * m0 as f32;
                o[64 * c + 32 + l] = d * sc1 as f32 * q[l + 32] as f32 - dmin * m1 as f32;
            }
        }
    }
}

/// Same structure as the Q4_K dot with 5-bit codes.
pub fn vec_dot(w: &[BlockQ5K], a: &[BlockQ8K]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let (sc, m) = scales_mins(&x.scales);
        let mut sumi = 0i32;
        let mut summ = 0i32;
        for c in 0..4 {
            let q = x.chunk_codes(c);
            let (mut s0, mut s1) = (0i32, 0i32);
            for l in 0..32 {
                s0 += q[l] as i32 * y.qs[64 * c + l] as i32;
                s1 += q[l + 32] as i32 * y.qs[64 * c + 32 + l] as i32;
            }
            sumi += sc[2 * c] as i32 * s0 + sc[2 * c + 1] as i32 * s1;
        }
        for j in 0..8 {
            summ += m[j] as i32 * (y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32);
        }
        sum += y.d * x.d.to_f32() * sumi as f32 - y.d * x.dmin.to_f32() * summ as f32;
    }
    sum
}
