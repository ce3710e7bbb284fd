//! Q2_K: 256 values in 16 groups of 16. Each group has a 4-bit scale and a
//! 4-bit min (`scales[g]`: low nibble scale, high nibble min); 2-bit codes:
//! `x = d·sc·q − dmin·m`.
//!
//! Element order: half `h` (0..2) covers elements `128h..128h+128` from
//! `qs[32h..32h+32]`; for `j < 4`, `l < 32`, element `128h + 32j + l` is bits
//! `2j..2j+2` of `qs[32h + l]`, in group `(128h + 32j + l)/16`.

use super::q8_k::BlockQ8K;
use super::F16Le;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ2K {
    pub scales: [u8; 16],
    pub qs: [u8; 64],
    pub d: F16Le,
    pub dmin: F16Le,
}
const _: () = assert!(std::mem::size_of::<BlockQ2K>() == 84);

impl BlockQ2K {
    pub const ELEMS: usize = 256;

    /// All 256 codes (0..4) in element order.
    #[inline]
    pub fn codes(&self) -> [u8; 256] {
        let mut q = [0u8; 256];
        for h in 0..2 {
            for j in 0..4 {
                for l in 0..32 {
                    q[128 * h + 32 * j + l] = (self.qs[32 * h + l] >> (2 * j)) & 3;
                }
            }
        }
        q
    }
}

pub fn dequantize(blocks: &[BlockQ2K], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 256);
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(256)) {
        let (d, dmin) = (b.d.to_f32(), b.dmin.to_f32());
        for (g, (o, q)) in o.chunks_exact_mut(16).zip(b.codes().chunks_exact(16)).enumerate() {
            let dl = d * (b.scales[g] & 15) as f32;
            let ml = dmin * (b.scales[g] >> 4) as f32;
            for (o, &q) in o.iter_mut().zip(q) {
                *o = dl * q as f32 - ml;
            }
        }
    }
}

/// The two integer sums of one block: `Σ_g sc_g·Σ q·q8` and `Σ_g m_g·bsum_g`.
#[inline]
pub fn block_sums(x: &BlockQ2K, y: &BlockQ8K) -> (i32, i32) {
    let q = x.codes();
    let mut isum = 0i32;
    let mut summs = 0i32;
    for g in 0..16 {
        let s: i32 = q[16 * g..16 * g + 16].iter().zip(&y.qs[16 * g..]).map(|(&p, &v)| p as i32 * v as i32).sum();
        isum += (x.scales[g] & 15) as i32 * s;
        summs += (x.scales[g] >> 4) as i32 * y.bsums[g] as i32;
    }
    (isum, summs)
}

/// `Σ_b (d_a·d)·isum − (d_a·dmin)·summs` (llama.cpp's order).
pub fn vec_dot(w: &[BlockQ2K], a: &[BlockQ8K]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let (isum, summs) = block_sums(x, y);
        sum += combine(x, y, isum, summs);
    }
    sum
}

/// One block's float contribution from its integer sums (shared with the SIMD
/// kernels so that they match scalar bit for bit).
#[inline(always)]
pub fn combine(x: &BlockQ2K, y: &BlockQ8K, isum: i32, summs: i32) -> f32 {
    let dall = y.d * x.d.to_f32();
    let dmin = y.d * x.dmin.to_f32();
    dall * isum as f32 - dmin * summs as f32
}
