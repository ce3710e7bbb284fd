//! IQ3_S (3.44 bits/weight): 256 values in 64 groups of 4 from the 512-point
//! grid [`IQ3S_GRID`]. Group `i` (0..64): index `qs[i] | bit (i % 8) of qh[i / 8] << 8`;
//! value `e` has sign bit `e % 8` of `signs[e / 8]`. Sub-block `ib` of 32 has the
//! 4-bit scale `s = scales[ib/2] >> 4·(ib%2)`: `x = d·(1 + 2s)·grid·sign`.

use super::iq2_xxs::grouped_sum;
use super::iq_grids::IQ3S_GRID;
use super::q8_k::BlockQ8K;
use super::F16Le;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockIq3S {
    pub d: F16Le,
    pub qs: [u8; 64],
    pub qh: [u8; 8],
    pub signs: [u8; 32],
    pub scales: [u8; 4],
}
const _: () = assert!(std::mem::size_of::<BlockIq3S>() == 110);

impl BlockIq3S {
    pub const ELEMS: usize = 256;

    /// The 4 grid magnitudes of group of 4 number `i`.
    #[inline(always)]
    pub fn point(&self, i: usize) -> [u8; 4] {
        let hi = ((self.qh[i / 8] >> (i % 8)) & 1) as usize;
        IQ3S_GRID[self.qs[i] as usize | hi << 8].to_le_bytes()
    }

    #[inline(always)]
    pub fn scale(&self, ib: usize) -> u8 {
        (self.scales[ib / 2] >> (4 * (ib % 2))) & 15
    }

    /// Signed codes in element order and `2s + 1` per group of 16.
    pub fn codes(&self) -> ([i8; 256], [u8; 16]) {
        let mut q = [0i8; 256];
        let mut ls = [0u8; 16];
        for (g, l) in ls.iter_mut().enumerate() {
            *l = 2 * self.scale(g / 2) + 1;
        }
        for i in 0..64 {
            for (j, &g) in self.point(i).iter().enumerate() {
                let e = 4 * i + j;
                q[e] = if self.signs[e / 8] >> (e % 8) & 1 != 0 { -(g as i8) } else { g as i8 };
            }
        }
        (q, ls)
    }
}

pub fn dequantize(blocks: &[BlockIq3S], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 256);
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(256)) {
        let d = b.d.to_f32();
        for i in 0..64 {
            let db = d * (1 + 2 * b.scale(i / 8) as u32) as f32;
            for (j, &g) in b.point(i).iter().enumerate() {
                let e = 4 * i + j;
                let v = db * g as f32;
                o[e] = if b.signs[e / 8] >> (e % 8) & 1 != 0 { -v } else { v };
            }
        }
    }
}

/// `Σ_b (d·d_a)·Σ_g ls_g·Σ code·q8`.
pub fn vec_dot(w: &[BlockIq3S], a: &[BlockQ8K]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let (q, ls) = x.codes();
        sum += x.d.to_f32() * y.d * grouped_sum(&q, &ls, y) as f32;
    }
    sum
}
