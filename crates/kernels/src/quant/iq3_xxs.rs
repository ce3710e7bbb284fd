//! IQ3_XXS (3.06 bits/weight): 256 values in 8 sub-blocks of 32, 64 groups of
//! 4 from [`IQ3XXS_GRID`]. `qs[0..64]` are the grid indices (8 per sub-block);
//! sub-block `ib`'s u32 at `qs[64 + 4ib..]` holds four 7-bit [`KSIGNS`] indices
//! (one per 8 values) and the 4-bit scale `s` (bits 28..32):
//! `x = d·(0.5 + s)·0.5·grid·sign`.

use super::iq2_xxs::grouped_sum;
use super::iq_grids::{IQ3XXS_GRID, KSIGNS};
use super::q8_k::BlockQ8K;
use super::F16Le;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockIq3Xxs {
    pub d: F16Le,
    pub qs: [u8; 96],
}
const _: () = assert!(std::mem::size_of::<BlockIq3Xxs>() == 98);

impl BlockIq3Xxs {
    pub const ELEMS: usize = 256;

    #[inline(always)]
    pub fn aux(&self, ib: usize) -> u32 {
        let o = 64 + 4 * ib;
        u32::from_le_bytes([self.qs[o], self.qs[o + 1], self.qs[o + 2], self.qs[o + 3]])
    }

    /// The 8 grid magnitudes of group of 8 number `k = 4ib + l`.
    #[inline(always)]
    pub fn point(&self, k: usize) -> [u8; 8] {
        let a = IQ3XXS_GRID[self.qs[2 * k] as usize].to_le_bytes();
        let b = IQ3XXS_GRID[self.qs[2 * k + 1] as usize].to_le_bytes();
        [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]
    }

    /// Signed codes in element order and `2s + 1` per group of 16.
    pub fn codes(&self) -> ([i8; 256], [u8; 16]) {
        let mut q = [0i8; 256];
        let mut ls = [0u8; 16];
        for ib in 0..8 {
            let aux = self.aux(ib);
            ls[2 * ib] = (2 * (aux >> 28) + 1) as u8;
            ls[2 * ib + 1] = ls[2 * ib];
            for l in 0..4 {
                let k = 4 * ib + l;
                let signs = KSIGNS[((aux >> (7 * l)) & 127) as usize];
                for (j, &g) in self.point(k).iter().enumerate() {
                    q[8 * k + j] = if signs >> j & 1 != 0 { -(g as i8) } else { g as i8 };
                }
            }
        }
        (q, ls)
    }
}

pub fn dequantize(blocks: &[BlockIq3Xxs], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 256);
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(256)) {
        let d = b.d.to_f32();
        for ib in 0..8 {
            let aux = b.aux(ib);
            let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
            for l in 0..4 {
                let k = 4 * ib + l;
                let signs = KSIGNS[((aux >> (7 * l)) & 127) as usize];
                for (j, &g) in b.point(k).iter().enumerate() {
                    let v = db * g as f32;
                    o[8 * k + j] = if signs >> j & 1 != 0 { -v } else { v };
                }
            }
        }
    }
}

/// `0.25·Σ_b (d·d_a)·Σ_g ls_g·Σ code·q8`.
pub fn vec_dot(w: &[BlockIq3Xxs], a: &[BlockQ8K]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let (q, ls) = x.codes();
        sum += x.d.to_f32() * y.d * grouped_sum(&q, &ls, y) as f32;
    }
    0.25 * sum
}
