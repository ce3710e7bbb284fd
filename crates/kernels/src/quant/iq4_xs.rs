//! IQ4_XS: 256 values in 8 sub-blocks of 32, the IQ4_NL table with a 6-bit
//! scale per sub-block (offset by 32): `x = d·(ls − 32)·K[q]`. Sub-block `ib`:
//! `ls = (scales_l[ib/2] >> 4·(ib%2)) & 15 | ((scales_h >> 2·ib) & 3) << 4`;
//! its codes are `qs[16ib..16ib+16]`, low nibbles first (as IQ4_NL).

use super::iq4_nl::values32;
use super::q8_k::BlockQ8K;
use super::F16Le;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockIq4Xs {
    pub d: F16Le,
    pub scales_h: [u8; 2],
    pub scales_l: [u8; 4],
    pub qs: [u8; 128],
}
const _: () = assert!(std::mem::size_of::<BlockIq4Xs>() == 136);

impl BlockIq4Xs {
    pub const ELEMS: usize = 256;

    /// The 8 sub-block scales `ls − 32` (−32..32).
    #[inline]
    pub fn scales(&self) -> [i8; 8] {
        let h = u16::from_le_bytes(self.scales_h);
        let mut s = [0i8; 8];
        for (ib, s) in s.iter_mut().enumerate() {
            let lo = (self.scales_l[ib / 2] >> (4 * (ib % 2))) & 15;
            let hi = ((h >> (2 * ib)) & 3) as u8;
            *s = (lo | (hi << 4)) as i8 - 32;
        }
        s
    }
}

pub fn dequantize(blocks: &[BlockIq4Xs], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 256);
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(256)) {
        let d = b.d.to_f32();
        let sc = b.scales();
        for (ib, o) in o.chunks_exact_mut(32).enumerate() {
            let dl = d * sc[ib] as f32;
            for (o, &v) in o.iter_mut().zip(&values32(&b.qs[16 * ib..])) {
                *o = dl * v as f32;
            }
        }
    }
}

/// `Σ_ib (ls − 32)·Σ K[q]·q8` for one block.
#[inline]
pub fn block_sum(x: &BlockIq4Xs, y: &BlockQ8K) -> i32 {
    let sc = x.scales();
    let mut isum = 0i32;
    for ib in 0..8 {
        let v = values32(&x.qs[16 * ib..]);
        let s: i32 = v.iter().zip(&y.qs[32 * ib..]).map(|(&p, &q)| p as i32 * q as i32).sum();
        isum += sc[ib] as i32 * s;
    }
    isum
}

/// `Σ_b (d·d_a)·isum` (integer sums within a block; llama.cpp's generic
/// code applies the float scale per sub-block, which differs only in rounding).
pub fn vec_dot(w: &[BlockIq4Xs], a: &[BlockQ8K]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        sum += x.d.to_f32() * y.d * block_sum(x, y) as f32;
    }
    sum
}

/// llama.cpp's `quantize_row_iq4_xs_ref` (no importance matrix): a
/// least-squares scale per sub-block of 32 (7 trial scales each side), stored
/// as 6-bit multiples of `d = −max_scale/32`, codes re-chosen for the stored scale.
pub fn quantize(x: &[f32], out: &mut [BlockIq4Xs]) {
    use super::iq4_nl::{best_index, sub_block_scale};
    assert_eq!(x.len(), out.len() * 256);
    for (xb, b) in x.chunks_exact(256).zip(out.iter_mut()) {
        let mut l = [0u8; 256];
        let mut scales = [0f32; 8];
        let (mut max_scale, mut amax_scale) = (0f32, 0f32);
        for ib in 0..8 {
            scales[ib] = sub_block_scale(&xb[32 * ib..32 * ib + 32], 7, &mut l[32 * ib..32 * ib + 32]);
            if scales[ib].abs() > amax_scale {
                amax_scale = scales[ib].abs();
                max_scale = scales[ib];
            }
        }
        let d = -max_scale / 32.0;
        b.d = F16Le::from_f32(d);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut sh = 0u16;
        b.scales_l = [0; 4];
        for ib in 0..8 {
            let ls = ((id * scales[ib]).round_ties_even() as i32).clamp(-32, 31);
            let dl = d * ls as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            for j in 0..32 {
                l[32 * ib + j] = best_index(idl * xb[32 * ib + j]);
            }
            let u = (ls + 32) as u8;
            b.scales_l[ib / 2] |= (u & 15) << (4 * (ib % 2));
            sh |= ((u >> 4) as u16) << (2 * ib);
        }
        b.scales_h = sh.to_le_bytes();
        for i in 0..8 {
            for j in 0..16 {
                b.qs[16 * i + j] = l[32 * i + j] | (l[32 * i + 16 + j] << 4);
            }
        }
    }
}
