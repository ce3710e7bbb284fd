//! IQ2_XXS (2.06 bits/weight): 256 values in 8 sub-blocks of 32, each 4 groups
//! of 8 taken from the E8-lattice grid [`IQ2XXS_GRID`] with signs from
//! [`KSIGNS`]. Sub-block `ib` is 8 bytes of `qs`: bytes 0..4 are the 4 grid
//! indices, the u32 of bytes 4..8 holds four 7-bit sign indices (bits `7l..`)
//! and the 4-bit scale `s` (bits 28..32): `x = d·(0.5 + s)·0.25·grid·sign`.

use super::iq_grids::{IQ2XXS_GRID, KSIGNS};
use super::q8_k::BlockQ8K;
use super::F16Le;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockIq2Xxs {
    pub d: F16Le,
    pub qs: [u8; 64],
}
const _: () = assert!(std::mem::size_of::<BlockIq2Xxs>() == 66);

impl BlockIq2Xxs {
    pub const ELEMS: usize = 256;

    /// Sub-block `ib`'s (grid indices, sign/scale word).
    #[inline(always)]
    pub fn sub(&self, ib: usize) -> ([u8; 4], u32) {
        let q = &self.qs[8 * ib..8 * ib + 8];
        ([q[0], q[1], q[2], q[3]], u32::from_le_bytes([q[4], q[5], q[6], q[7]]))
    }

    /// Signed codes (grid value with its sign) in element order, and the odd
    /// integer scale `2s + 1` of each group of 16 (the weight is
    /// `d·(2s+1)/8·code`).
    pub fn codes(&self) -> ([i8; 256], [u8; 16]) {
        let mut q = [0i8; 256];
        let mut ls = [0u8; 16];
        for ib in 0..8 {
            let (idx, aux) = self.sub(ib);
            ls[2 * ib] = (2 * (aux >> 28) + 1) as u8;
            ls[2 * ib + 1] = ls[2 * ib];
            for l in 0..4 {
                let p = signed_point(IQ2XXS_GRID[idx[l] as usize], KSIGNS[((aux >> (7 * l)) & 127) as usize]);
                q[32 * ib + 8 * l..32 * ib + 8 * l + 8].copy_from_slice(&p);
            }
        }
        (q, ls)
    }
}

/// The 8 bytes of grid point `g` with sign bit `j` of `signs` applied to byte `j`.
#[inline(always)]
pub fn signed_point(g: u64, signs: u8) -> [i8; 8] {
    let mut p = g.to_le_bytes().map(|b| b as i8);
    for (j, v) in p.iter_mut().enumerate() {
        if signs >> j & 1 != 0 {
            *v = -*v;
        }
    }
    p
}

/// Writes `8` values `db·grid[j]·(±1)` (gguf-py's and llama.cpp's order).
#[inline(always)]
pub(crate) fn put_point(o: &mut [f32], db: f32, g: u64, signs: u8) {
    for (j, (o, b)) in o.iter_mut().zip(g.to_le_bytes()).enumerate() {
        let v = db * b as f32;
        *o = if signs >> j & 1 != 0 { -v } else { v };
    }
}

pub fn dequantize(blocks: &[BlockIq2Xxs], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 256);
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(256)) {
        let d = b.d.to_f32();
        for ib in 0..8 {
            let (idx, aux) = b.sub(ib);
            let db = d * (0.5 + (aux >> 28) as f32) * 0.25;
            for l in 0..4 {
                let signs = KSIGNS[((aux >> (7 * l)) & 127) as usize];
                put_point(&mut o[32 * ib + 8 * l..], db, IQ2XXS_GRID[idx[l] as usize], signs);
            }
        }
    }
}

/// `Σ_g ls_g·Σ code·q8` over the 16 groups of 16 (shared by the IQ2/IQ3 types).
#[inline]
pub fn grouped_sum(q: &[i8; 256], ls: &[u8; 16], y: &BlockQ8K) -> i32 {
    let mut isum = 0i32;
    for g in 0..16 {
        let s: i32 = q[16 * g..16 * g + 16].iter().zip(&y.qs[16 * g..]).map(|(&p, &v)| p as i32 * v as i32).sum();
        isum += ls[g] as i32 * s;
    }
    isum
}

/// `0.125·Σ_b (d·d_a)·isum`.
pub fn vec_dot(w: &[BlockIq2Xxs], a: &[BlockQ8K]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let (q, ls) = x.codes();
        sum += x.d.to_f32() * y.d * grouped_sum(&q, &ls, y) as f32;
    }
    0.125 * sum
}
