//! IQ4_NL: 32 values, one f16 scale, 4-bit indices into the non-linear table
//! [`KVALUES`]: `x[j] = d·K[lo(qs[j])]`, `x[j+16] = d·K[hi(qs[j])]`. Its
//! activation type is Q8_0 (as in llama.cpp).

use super::q8_0::BlockQ8_0;
use super::F16Le;
use bytemuck::{Pod, Zeroable};

/// llama.cpp's `kvalues_iq4nl`.
pub const KVALUES: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockIq4Nl {
    pub d: F16Le,
    pub qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockIq4Nl>() == 18);

impl BlockIq4Nl {
    pub const ELEMS: usize = 32;
}

/// The 32 table values of 16 packed index bytes (low nibbles first).
#[inline(always)]
pub fn values32(qs: &[u8]) -> [i8; 32] {
    let mut v = [0i8; 32];
    for j in 0..16 {
        v[j] = KVALUES[(qs[j] & 15) as usize];
        v[j + 16] = KVALUES[(qs[j] >> 4) as usize];
    }
    v
}

pub fn dequantize(blocks: &[BlockIq4Nl], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 32);
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(32)) {
        let d = b.d.to_f32();
        for (o, &v) in o.iter_mut().zip(&values32(&b.qs)) {
            *o = d * v as f32;
        }
    }
}

/// `Σ_b (d_a·d)·Σ K[q]·q8`.
pub fn vec_dot(w: &[BlockIq4Nl], a: &[BlockQ8_0]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let v = values32(&x.qs);
        let sumi: i32 = v.iter().zip(&y.qs).map(|(&p, &q)| p as i32 * q as i32).sum();
        sum += y.d.to_f32() * x.d.to_f32() * sumi as f32;
    }
    sum
}

/// llama.cpp's `best_index_int8`: the index of the table value nearest `x`
/// (ties to the lower one).
#[inline]
pub(crate) fn best_index(x: f32) -> u8 {
    let v = &KVALUES;
    if x <= v[0] as f32 {
        return 0;
    }
    if x >= v[15] as f32 {
        return 15;
    }
    let (mut ml, mut mu) = (0usize, 15usize);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < v[mav] as f32 {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - (v[mu - 1] as f32) < v[mu] as f32 - x {
        (mu - 1) as u8
    } else {
        mu as u8
    }
}

/// llama.cpp's `GROUP_MAX_EPS`: a sub-block whose largest magnitude is below
/// this gets scale 0.
pub(crate) const GROUP_MAX_EPS: f32 = 1e-15;

/// One 32-value sub-block's least-squares scale (llama.cpp's
/// `quantize_row_iq4_nl_impl` without importance weights: weights `x²`, a start
/// from `max/K[0]`, then `ntry` extra trial scales each side) and its codes.
pub(crate) fn sub_block_scale(xb: &[f32], ntry: i32, codes: &mut [u8]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in xb {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        codes.iter_mut().for_each(|c| *c = 0);
        return 0.0;
    }
    let k0 = KVALUES[0] as f32;
    let mut d = if ntry > 0 { -max / k0 } else { max / k0 };
    let mut id = 1.0 / d;
    let (mut sumqx, mut sumq2) = (0f32, 0f32);
    for (c, &x) in codes.iter_mut().zip(xb) {
        let l = best_index(id * x);
        *c = l;
        let q = KVALUES[l as usize] as f32;
        let w = x * x;
        sumqx += w * q * x;
        sumq2 += w * q * q;
    }
    d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for itry in -ntry..=ntry {
        id = (itry as f32 + k0) / max;
        let (mut sqx, mut sq2) = (0f32, 0f32);
        for &x in xb {
            let q = KVALUES[best_index(id * x) as usize] as f32;
            let w = x * x;
            sqx += w * q * x;
            sq2 += w * q * q;
        }
        if sq2 > 0.0 && sqx * sqx > best * sq2 {
            d = sqx / sq2;
            best = d * sqx;
        }
    }
    d
}

/// llama.cpp's `quantize_row_iq4_nl_ref`: one least-squares scale per block of
/// 32 from the start `max/K[0]` (no extra trials), codes from that start.
pub fn quantize(x: &[f32], out: &mut [BlockIq4Nl]) {
    assert_eq!(x.len(), out.len() * 32);
    for (xb, b) in x.chunks_exact(32).zip(out.iter_mut()) {
        let mut l = [0u8; 32];
        let d = sub_block_scale(xb, -1, &mut l);
        b.d = F16Le::from_f32(d);
        for j in 0..16 {
            b.qs[j] = l[j] | (l[j + 16] << 4);
        }
    }
}
