//! IQ1_S (1.56 bits/weight): 256 values in 8 sub-blocks of 32, 32 groups of 8
//! from the ternary grid [`IQ1S_GRID`] (values −1, 0, 1). Sub-block `ib` has the
//! u16 `qh[ib]`: bits `3l..3l+3` extend group `4ib + l`'s index `qs[4ib + l]`,
//! bits 12..15 the scale `s`, bit 15 the sign of the shift `δ = ±1/8`:
//! `x = d·(2s + 1)·(grid + δ)`.

use super::iq_grids::IQ1S_GRID;
use super::q8_k::BlockQ8K;
use super::F16Le;
use bytemuck::{Pod, Zeroable};

/// The grid shift magnitude (llama.cpp's `IQ1S_DELTA`, also IQ1_M's).
pub const DELTA: f32 = 0.125;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockIq1S {
    pub d: F16Le,
    pub qs: [u8; 32],
    pub qh: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockIq1S>() == 50);

impl BlockIq1S {
    pub const ELEMS: usize = 256;

    #[inline(always)]
    pub fn qh(&self, ib: usize) -> u16 {
        u16::from_le_bytes([self.qh[2 * ib], self.qh[2 * ib + 1]])
    }

    /// Grid point of group of 8 number `k`.
    #[inline(always)]
    pub fn point(&self, k: usize) -> [i8; 8] {
        let h = ((self.qh(k / 4) >> (3 * (k % 4))) & 7) as usize;
        IQ1S_GRID[self.qs[k] as usize | h << 8].to_le_bytes().map(|b| b as i8)
    }

    /// Codes `8·grid ± 1` (the shift `δ = ±1/8` made integer: values
    /// `d·(2s + 1)/8·code`) in element order, and `2s + 1` per group of 16:
    /// the lane GEMMs' record ([`crate::simd`]'s `decode_iq`, closing constant
    /// 1/8). `Σ ls·Σ code·q8 = 8·sumi + sumi1` of [`block_sums`], and scaling
    /// by 8 is exact, so the GEMM's result equals [`vec_dot`]'s bit for bit.
    pub fn codes(&self) -> ([i8; 256], [u8; 16]) {
        let mut q = [0i8; 256];
        let mut ls = [0u8; 16];
        for ib in 0..8 {
            let (l, sign) = self.scale_delta(ib);
            ls[2 * ib] = l as u8;
            ls[2 * ib + 1] = l as u8;
            for t in 0..4 {
                let k = 4 * ib + t;
                for (o, g) in q[8 * k..8 * k + 8].iter_mut().zip(self.point(k)) {
                    *o = 8 * g + sign as i8;
                }
            }
        }
        (q, ls)
    }

    /// Sub-block `ib`'s `(2s + 1, ±1)`.
    #[inline(always)]
    pub fn scale_delta(&self, ib: usize) -> (i32, i32) {
        let h = self.qh(ib);
        (2 * ((h >> 12) & 7) as i32 + 1, if h & 0x8000 != 0 { -1 } else { 1 })
    }
}

pub fn dequantize(blocks: &[BlockIq1S], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 256);
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(256)) {
        let d = b.d.to_f32();
        for ib in 0..8 {
            let (ls, sign) = b.scale_delta(ib);
            let dl = d * ls as f32;
            let delta = if sign < 0 { -DELTA } else { DELTA };
            for l in 0..4 {
                let k = 4 * ib + l;
                for (j, &g) in b.point(k).iter().enumerate() {
                    o[8 * k + j] = dl * (g as f32 + delta);
                }
            }
        }
    }
}

/// One block's `(Σ_ib ls·Σ grid·q8, Σ_ib ls·δ_sign·Σ q8)`.
#[inline]
pub fn block_sums(x: &BlockIq1S, y: &BlockQ8K) -> (i32, i32) {
    let (mut sumi, mut sumi1) = (0i32, 0i32);
    for ib in 0..8 {
        let (ls, sign) = x.scale_delta(ib);
        let mut lsum = 0i32;
        for l in 0..4 {
            let k = 4 * ib + l;
            lsum += x.point(k).iter().zip(&y.qs[8 * k..]).map(|(&g, &v)| g as i32 * v as i32).sum::<i32>();
        }
        sumi += ls * lsum;
        sumi1 += ls * sign * (y.bsums[2 * ib] as i32 + y.bsums[2 * ib + 1] as i32);
    }
    (sumi, sumi1)
}

/// `Σ_b d·d_a·(sumi + δ·sumi1)` (llama.cpp's order).
pub fn vec_dot(w: &[BlockIq1S], a: &[BlockQ8K]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let (s, s1) = block_sums(x, y);
        sum += x.d.to_f32() * y.d * (s as f32 + DELTA * s1 as f32);
    }
    sum
}
