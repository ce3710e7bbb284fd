//! Q6_K: 256 values in 16 groups of 16, each with an i8 scale; 6-bit codes
//! offset by 32: `x = d·sc·(q − 32)`. Low 4 bits in `ql`, high 2 bits in `qh`.
//!
//! Each 128-value half `h` uses `ql[64h..]`, `qh[32h..]`, `scales[8h..]`; for
//! `l < 32`, `is = l/16`:
//! * `x[l]    = ql[l]&15    | (qh[l]&3)<<4`,      scale `sc[is]`
//! * `x[l+32] = ql[l+32]&15 | (qh[l]>>2&3)<<4`,   scale `sc[is+2]`
//! * `x[l+64] = ql[l]>>4    | (qh[l]>>4&3)<<4`,   scale `sc[is+4]`
//! * `x[l+96] = ql[l+32]>>4 | (qh[l]>>6)<<4`,     scale `sc[is+6]`

use super::q8_k::BlockQ8K;
use super::F16Le;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ6K {
    pub ql: [u8; 128],
    pub qh: [u8; 64],
    pub scales: [i8; 16],
    pub d: F16Le,
}
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);

impl BlockQ6K {
    pub const ELEMS: usize = 256;

    /// All 256 signed codes (`q − 32`, in −32..32) in element order.
    #[inline]
    pub fn codes(&self) -> [i8; 256] {
        let mut q = [0i8; 256];
        for h in 0..2 {
            let ql = &self.ql[64 * h..];
            let qh = &self.qh[32 * h..];
            let o = &mut q[128 * h..];
            for l in 0..32 {
                o[l] = ((ql[l] & 15) | ((qh[l] & 3) << 4)) as i8 - 32;
                o[l + 32] = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
                o[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
                o[l + 96] = ((ql[l + 32] >> 4) | ((qh[l] >> 6) << 4)) as i8 - 32;
            }
        }
        q
    }
}

pub fn dequantize(blocks: &[BlockQ6K], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 256);
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(256)) {
        let d = b.d.to_f32();
        for (g, (o, q)) in o.chunks_exact_mut(16).zip(b.codes().chunks_exact(16)).enumerate() {
            let s = d * b.scales[g] as f32;
            for (o, &q) in o.iter_mut().zip(q) {
                *o = s * q as f32;
            }
        }
    }
}

/// `Σ_b d·d_a·Σ_g sc_g·Σ (q−32)·q8` over the 16 groups of 16.
pub fn vec_dot(w: &[BlockQ6K], a: &[BlockQ8K]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let q = x.codes();
        let mut sumi = 0i32;
        for g in 0..16 {
            let s: i32 = q[16 * g..16 * g + 16].iter().zip(&y.qs[16 * g..]).map(|(&p, &v)| p as i32 * v as i32).sum();
            sumi += x.scales[g] as i32 * s;
        }
        sum += x.d.to_f32() * y.d * sumi as f32;
    }
    sum
}
