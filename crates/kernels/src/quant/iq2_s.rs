//! IQ2_S (2.56 bits/weight): 256 values in 32 groups of 8 from the 1024-point
//! grid [`IQ2S_GRID`]. Group `k = 4ib + l`: index `qs[k] | ((qh[ib] >> 2l) & 3) << 8`,
//! sign bits `qs[32 + k]` (bit `j`: value `j` negative, no parity rule). Each 16
//! values have a 4-bit scale `s` as in IQ2_XS: `x = d·(0.5 + s)·0.25·grid·sign`.

use super::iq2_xxs::{grouped_sum, put_point, signed_point};
use super::iq_grids::IQ2S_GRID;
use super::q8_k::BlockQ8K;
use super::F16Le;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockIq2S {
    pub d: F16Le,
    /// 32 low index bytes, then 32 sign bytes.
    pub qs: [u8; 64],
    pub qh: [u8; 8],
    pub scales: [u8; 8],
}
const _: () = assert!(std::mem::size_of::<BlockIq2S>() == 82);

impl BlockIq2S {
    pub const ELEMS: usize = 256;

    /// Grid index and sign byte of group of 8 number `k`.
    #[inline(always)]
    pub fn group(&self, k: usize) -> (usize, u8) {
        let hi = ((self.qh[k / 4] >> (2 * (k % 4))) & 3) as usize;
        (self.qs[k] as usize | hi << 8, self.qs[32 + k])
    }

    #[inline(always)]
    pub fn scale(&self, g: usize) -> u8 {
        (self.scales[g / 2] >> (4 * (g % 2))) & 15
    }

    /// Signed codes in element order and `2s + 1` per group of 16.
    pub fn codes(&self) -> ([i8; 256], [u8; 16]) {
        let mut q = [0i8; 256];
        let mut ls = [0u8; 16];
        for (g, l) in ls.iter_mut().enumerate() {
            *l = 2 * self.scale(g) + 1;
        }
        for k in 0..32 {
            let (i, s) = self.group(k);
            q[8 * k..8 * k + 8].copy_from_slice(&signed_point(IQ2S_GRID[i], s));
        }
        (q, ls)
    }
}

pub fn dequantize(blocks: &[BlockIq2S], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 256);
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(256)) {
        let d = b.d.to_f32();
        for k in 0..32 {
            let db = d * (0.5 + b.scale(k / 2) as f32) * 0.25;
            let (i, s) = b.group(k);
            put_point(&mut o[8 * k..], db, IQ2S_GRID[i], s);
        }
    }
}

/// `0.125·Σ_b (d·d_a)·Σ_g ls_g·Σ code·q8`.
pub fn vec_dot(w: &[BlockIq2S], a: &[BlockQ8K]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let (q, ls) = x.codes();
        sum += x.d.to_f32() * y.d * grouped_sum(&q, &ls, y) as f32;
    }
    0.125 * sum
}
