//! IQ1_M (1.75 bits/weight): 256 values, 32 groups of 8 from the IQ1_S grid,
//! no separate scale field: the f16 super-scale is split over the top nibbles
//! of the four u16 words of `scales`. Group `k = 4ib + l`: index
//! `qs[k] | (qh[k/2] >> 4·(k%2) & 7) << 8`, shift sign bit 3 of that nibble
//! (`δ = ±1/8`). Each 16 values have a 3-bit scale `s` (word `g/4`, bits
//! `3·(g%4)..`): `x = d·(2s + 1)·(grid + δ)`.

use super::iq1_s::DELTA;
use super::iq_grids::IQ1S_GRID;
use super::q8_k::BlockQ8K;
use bytemuck::{Pod, Zeroable};
use half::f16;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockIq1M {
    pub qs: [u8; 32],
    pub qh: [u8; 16],
    pub scales: [u8; 8],
}
const _: () = assert!(std::mem::size_of::<BlockIq1M>() == 56);

impl BlockIq1M {
    pub const ELEMS: usize = 256;

    #[inline(always)]
    fn word(&self, i: usize) -> u16 {
        u16::from_le_bytes([self.scales[2 * i], self.scales[2 * i + 1]])
    }

    /// The super-block scale, assembled from the four top nibbles.
    #[inline(always)]
    pub fn d(&self) -> f32 {
        let bits = (self.word(0) >> 12)
            | ((self.word(1) >> 8) & 0x00F0)
            | ((self.word(2) >> 4) & 0x0F00)
            | (self.word(3) & 0xF000);
        f16::from_bits(bits).to_f32()
    }

    /// `2s + 1` for group of 16 number `g`.
    #[inline(always)]
    pub fn ls(&self, g: usize) -> i32 {
        2 * ((self.word(g / 4) >> (3 * (g % 4))) & 7) as i32 + 1
    }

    /// Codes `8·grid ± 1` (each group of 8's shift made integer, as
    /// [`super::iq1_s::BlockIq1S::codes`]) in element order, and `2s + 1` per
    /// group of 16: the lane GEMMs' record, closing constant 1/8, equal to
    /// [`vec_dot`] bit for bit (`Σ ls·Σ code·q8 = 8·sumi1 + sumi2`).
    pub fn codes(&self) -> ([i8; 256], [u8; 16]) {
        let mut q = [0i8; 256];
        let mut ls = [0u8; 16];
        for (g, l) in ls.iter_mut().enumerate() {
            *l = self.ls(g) as u8;
        }
        for k in 0..32 {
            let (p, sign) = self.point(k);
            for (o, g) in q[8 * k..8 * k + 8].iter_mut().zip(p) {
                *o = 8 * g + sign as i8;
            }
        }
        (q, ls)
    }

    /// Grid point and shift sign (±1) of group of 8 number `k`.
    #[inline(always)]
    pub fn point(&self, k: usize) -> ([i8; 8], i32) {
        let nib = (self.qh[k / 2] >> (4 * (k % 2))) & 15;
        let g = IQ1S_GRID[self.qs[k] as usize | ((nib & 7) as usize) << 8].to_le_bytes().map(|b| b as i8);
        (g, if nib & 8 != 0 { -1 } else { 1 })
    }
}

pub fn dequantize(blocks: &[BlockIq1M], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 256);
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(256)) {
        let d = b.d();
        for k in 0..32 {
            let dl = d * b.ls(k / 2) as f32;
            let (g, sign) = b.point(k);
            let delta = if sign < 0 { -DELTA } else { DELTA };
            for (j, &g) in g.iter().enumerate() {
                o[8 * k + j] = dl * (g as f32 + delta);
            }
        }
    }
}

/// One block's `(Σ_g ls_g·Σ grid·q8, Σ_g ls_g·Σ_{k in g} δ_k·Σ q8)`.
#[inline]
pub fn block_sums(x: &BlockIq1M, y: &BlockQ8K) -> (i32, i32) {
    let (mut sumi1, mut sumi2) = (0i32, 0i32);
    for g in 0..16 {
        let (mut s1, mut s2) = (0i32, 0i32);
        for k in [2 * g, 2 * g + 1] {
            let (p, sign) = x.point(k);
            let q8 = &y.qs[8 * k..8 * k + 8];
            s1 += p.iter().zip(q8).map(|(&a, &b)| a as i32 * b as i32).sum::<i32>();
            s2 += sign * q8.iter().map(|&b| b as i32).sum::<i32>();
        }
        let ls = x.ls(g);
        sumi1 += ls * s1;
        sumi2 += ls * s2;
    }
    (sumi1, sumi2)
}

/// `Σ_b d·d_a·(sumi1 + δ·sumi2)` (llama.cpp's order).
pub fn vec_dot(w: &[BlockIq1M], a: &[BlockQ8K]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let (s1, s2) = block_sums(x, y);
        sum += x.d() * y.d * (s1 as f32 + DELTA * s2 as f32);
    }
    sum
}
