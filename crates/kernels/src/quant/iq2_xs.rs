//! IQ2_XS (2.31 bits/weight): 256 values in 32 groups of 8. Group `k` is the
//! u16 `qs[k]`: bits 0..9 index [`IQ2XS_GRID`], bits 9..16 index [`KSIGNS`].
//! Each 16 values have a 4-bit scale `s` (`scales[ib]`, low nibble for groups
//! `4ib, 4ib+1`, high for `4ib+2, 4ib+3`): `x = d·(0.5 + s)·0.25·grid·sign`.

use super::iq2_xxs::{grouped_sum, put_point, signed_point};
use super::iq_grids::{IQ2XS_GRID, KSIGNS};
use super::q8_k::BlockQ8K;
use super::F16Le;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockIq2Xs {
    pub d: F16Le,
    pub qs: [u8; 64],
    pub scales: [u8; 8],
}
const _: () = assert!(std::mem::size_of::<BlockIq2Xs>() == 74);

impl BlockIq2Xs {
    pub const ELEMS: usize = 256;

    #[inline(always)]
    pub fn word(&self, k: usize) -> u16 {
        u16::from_le_bytes([self.qs[2 * k], self.qs[2 * k + 1]])
    }

    /// 4-bit scale of group of 16 number `g`.
    #[inline(always)]
    pub fn scale(&self, g: usize) -> u8 {
        (self.scales[g / 2] >> (4 * (g % 2))) & 15
    }

    /// Signed codes in element order and the integer scale `2s + 1` of each
    /// group of 16.
    pub fn codes(&self) -> ([i8; 256], [u8; 16]) {
        let mut q = [0i8; 256];
        let mut ls = [0u8; 16];
        for (g, l) in ls.iter_mut().enumerate() {
            *l = 2 * self.scale(g) + 1;
        }
        for k in 0..32 {
            let w = self.word(k);
            let p = signed_point(IQ2XS_GRID[(w & 511) as usize], KSIGNS[(w >> 9) as usize]);
            q[8 * k..8 * k + 8].copy_from_slice(&p);
        }
        (q, ls)
    }
}

pub fn dequantize(blocks: &[BlockIq2Xs], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 256);
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(256)) {
        let d = b.d.to_f32();
        for k in 0..32 {
            let db = d * (0.5 + b.scale(k / 2) as f32) * 0.25;
            let w = b.word(k);
            put_point(&mut o[8 * k..], db, IQ2XS_GRID[(w & 511) as usize], KSIGNS[(w >> 9) as usize]);
        }
    }
}

/// `0.125·Σ_b (d·d_a)·Σ_g ls_g·Σ code·q8`.
pub fn vec_dot(w: &[BlockIq2Xs], a: &[BlockQ8K]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let (q, ls) = x.codes();
        sum += x.d.to_f32() * y.d * grouped_sum(&q, &ls, y) as f32;
    }
    0.125 * sum
}
