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

/// Quantizes `x` (a multiple of 256 values) to Q3_K blocks (llama.cpp's
/// reference scheme, no importance matrix).
///
/// Each group of 16 gets a signed scale from [`super::kq_fit::fit_symmetric`]
/// (codes −4..4). The 16 scales are stored as 6-bit signed multiples
/// (−32..32) of the block's f16 `d`, chosen so that the scale of largest
/// magnitude is exactly −32; the codes are then recomputed against the stored
/// `d·sc`.
pub fn quantize(x: &[f32], out: &mut [BlockQ3K]) {
    use super::kq_fit::{code, fit_symmetric};
    assert_eq!(x.len(), out.len() * 256);
    for (xb, b) in x.chunks_exact(256).zip(out.iter_mut()) {
        let scales: [f32; 16] = std::array::from_fn(|g| fit_symmetric(&xb[16 * g..16 * g + 16], 4));
        let ext = scales.iter().fold(0f32, |m, &s| if s.abs() > m.abs() { s } else { m });
        *b = BlockQ3K::zeroed();
        // A zero block: scale codes 32 (= 0) and value codes 4 (= 0).
        let (d, inv) = if ext != 0.0 {
            b.d = F16Le::from_f32(ext / -32.0);
            let d = b.d.to_f32();
            (d, if d != 0.0 { 1.0 / d } else { 0.0 })
        } else {
            (0.0, 0.0)
        };
        let mut sc = [0i8; 16];
        let mut q = [0u8; 256];
        for g in 0..16 {
            sc[g] = (scales[g] * inv).round().clamp(-32.0, 31.0) as i8;
            let step = d * sc[g] as f32;
            for (qi, &v) in q[16 * g..16 * g + 16].iter_mut().zip(&xb[16 * g..]) {
                *qi = (code(v, step, -4.0, 3.0, 0.0) + 4.0) as u8;
            }
        }
        b.scales = pack_scales(&sc);
        pack(&q, b);
    }
}

/// The 12 bytes [`scales`] reads back as `sc` (each in −32..32).
pub fn pack_scales(sc: &[i8; 16]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for (g, &v) in sc.iter().enumerate() {
        let u = (v as i16 + 32) as u8 & 63;
        s[g % 8] |= (u & 15) << (4 * (g / 8));
        s[8 + g % 4] |= (u >> 4) << (2 * (g / 4));
    }
    s
}

/// Stores 256 codes (0..8 = signed code + 4, element order) into `qs`
/// (low 2 bits) and `hmask` (the third bit), read back by [`BlockQ3K::codes`].
fn pack(q: &[u8; 256], b: &mut BlockQ3K) {
    b.qs = [0; 64];
    b.hmask = [0; 32];
    for h in 0..2 {
        for j in 0..4 {
            for l in 0..32 {
                let u = q[128 * h + 32 * j + l];
                b.qs[32 * h + l] |= (u & 3) << (2 * j);
                b.hmask[l] |= (u >> 2) << (4 * h + j);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::kq_fit::test_data::{bytes, rms, uniform, weights_like};
    use super::*;

    #[test]
    fn packing_reads_back() {
        let q: [u8; 256] = std::array::from_fn(|i| ((i * 37 + 11) % 8) as u8);
        let sc: [i8; 16] = [-32, -1, 0, 1, 31, 7, -7, 15, -16, 2, 3, -4, 5, 30, -31, 9];
        let mut b = BlockQ3K::zeroed();
        pack(&q, &mut b);
        b.scales = pack_scales(&sc);
        assert!(q.iter().zip(b.codes()).all(|(&a, c)| a as i8 - 4 == c));
        assert_eq!(scales(&b.scales), sc);
    }

    /// Round trip through the dequantizer. Uniform values in [−1, 1): the
    /// group's step is about amax/4 ≈ 1/4, a rounding error of step/√12 ≈
    /// 0.072 rms (the x²-weighted fit trades a little of it for the large
    /// values); bound 0.085 (measured 0.071). Weight-like values: between Q4_K's error and 2.5×
    /// it (one bit fewer doubles the step; Q3_K's groups of 16 win some back).
    /// Zero stays zero; encoding is deterministic.
    #[test]
    fn round_trip_error_and_determinism() {
        let mut z = [BlockQ3K::zeroed(); 1];
        quantize(&[0.0; 256], &mut z);
        let mut back = [1f32; 256];
        dequantize(&z, &mut back);
        assert!(back.iter().all(|&v| v == 0.0));
        let x = uniform(4096, 7);
        let mut b = vec![BlockQ3K::zeroed(); 16];
        quantize(&x, &mut b);
        let mut y = vec![0f32; 4096];
        dequantize(&b, &mut y);
        let e = rms(&x, &y);
        eprintln!("q3_k uniform rms {e:.5}");
        assert!(e <= 0.085, "q3_k uniform rms {e}");
        let mut b2 = vec![BlockQ3K::zeroed(); 16];
        quantize(&x, &mut b2);
        assert_eq!(bytes(&b), bytes(&b2));

        let x = weights_like(4096, 5);
        quantize(&x, &mut b);
        dequantize(&b, &mut y);
        let e3 = rms(&x, &y);
        let mut b4 = vec![super::super::q4_k::BlockQ4K::zeroed(); 16];
        super::super::q4_k::quantize(&x, &mut b4);
        super::super::q4_k::dequantize(&b4, &mut y);
        let e4 = rms(&x, &y);
        eprintln!("weights-like rms: q3_k {e3:.3e}, q4_k {e4:.3e}");
        assert!(e3 >= e4 && e3 <= 2.5 * e4, "q3_k {e3} vs q4_k {e4}");
    }
}
