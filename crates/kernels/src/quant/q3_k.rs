//! Q3_K: 256 values in 16 groups of 16, each with a 6-bit scale offset by 32
//! (packed in `scales[12]`, see [`scales`]); 3-bit signed codes
//! `q = (2 low bits) − 4·(high bit clear)`, `x = d·(sc − 32)·q`.
//!
//! Element order: half `h` (0..2), `j < 4`, `l < 32`: element `128h + 32j + l`
//! takes bits `2j..2j+2` of `qs[32h + l]` and bit `4h + j` of `hmask[l]`.

use super::q8_k::BlockQ8K;
use super::F16Le;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ3K {
    pub hmask: [u8; 32],
    pub qs: [u8; 64],
    pub scales: [u8; 12],
    pub d: F16Le,
}
const _: () = assert!(std::mem::size_of::<BlockQ3K>() == 110);

impl BlockQ3K {
    pub const ELEMS: usize = 256;

    /// All 256 signed codes (−4..4) in element order.
    #[inline]
    pub fn codes(&self) -> [i8; 256] {
        let mut q = [0i8; 256];
        for h in 0..2 {
            for j in 0..4 {
                let m = 1u8 << (4 * h + j);
                for l in 0..32 {
                    let lo = ((self.qs[32 * h + l] >> (2 * j)) & 3) as i8;
                    q[128 * h + 32 * j + l] = lo - if self.hmask[l] & m != 0 { 0 } else { 4 };
                }
            }
        }
        q
    }
}

/// The 16 group scales, `sc − 32` (−32..32). Group `g`: low 4 bits from
/// `scales[g % 8]` (nibble `g / 8`), high 2 bits from `scales[8 + g % 4]`
/// (bits `2·(g/4)..`).
#[inline]
pub fn scales(s: &[u8; 12]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (g, o) in out.iter_mut().enumerate() {
        let lo = (s[g % 8] >> (4 * (g / 8))) & 15;
        let hi = (s[8 + g % 4] >> (2 * (g / 4))) & 3;
        *o = (lo | (hi << 4)) as i8 - 32;
    }
    out
}

pub fn dequantize(blocks: &[BlockQ3K], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 256);
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(256)) {
        let d = b.d.to_f32();
        let sc = scales(&b.scales);
        for (g, (o, q)) in o.chunks_exact_mut(16).zip(b.codes().chunks_exact(16)).enumerate() {
            let dl = d * sc[g] as f32;
            for (o, &q) in o.iter_mut().zip(q) {
                *o = dl * q as f32;
            }
        }
    }
}

/// `Σ_g (sc_g − 32)·Σ q·q8` for one block.
#[inline]
pub fn block_sum(x: &BlockQ3K, y: &BlockQ8K) -> i32 {
    let q = x.codes();
    let sc = scales(&x.scales);
    let mut isum = 0i32;
    for g in 0..16 {
        let s: i32 = q[16 * g..16 * g + 16].iter().zip(&y.qs[16 * g..]).map(|(&p, &v)| p as i32 * v as i32).sum();
        isum += sc[g] as i32 * s;
    }
    isum
}

/// `Σ_b (d·d_a)·isum`.
pub fn vec_dot(w: &[BlockQ3K], a: &[BlockQ8K]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        sum += x.d.to_f32() * y.d * block_sum(x, y) as f32;
    }
    sum
}
