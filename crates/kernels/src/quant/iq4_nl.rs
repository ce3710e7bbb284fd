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
