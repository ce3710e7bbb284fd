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

/// Quantizes `x` (a multiple of 256 values) to Q2_K blocks (llama.cpp's
/// reference scheme, no importance matrix).
///
/// Each group of 16 gets `x ≈ s·q − m` (`q ∈ 0..4`, `m ≥ 0`) from
/// [`super::kq_fit::fit_affine`], errors weighted by `|x|` (with 4 levels the
/// fit cannot serve every value; the large ones matter most). The 16 scales
/// and mins are stored as 4-bit multiples of `d = max s/15` and
/// `dmin = max m/15` (f16), and the codes recomputed against the stored values.
pub fn quantize(x: &[f32], out: &mut [BlockQ2K]) {
    use super::kq_fit::{code, fit_affine};
    assert_eq!(x.len(), out.len() * 256);
    for (xb, b) in x.chunks_exact(256).zip(out.iter_mut()) {
        let w: Vec<f32> = xb.iter().map(|v| v.abs()).collect();
        let mut scales = [0f32; 16];
        let mut mins = [0f32; 16];
        for g in 0..16 {
            (scales[g], mins[g]) = fit_affine(&xb[16 * g..16 * g + 16], &w[16 * g..16 * g + 16], 3);
        }
        let max_s = scales.iter().fold(0f32, |a, &v| a.max(v));
        let max_m = mins.iter().fold(0f32, |a, &v| a.max(v));
        b.d = F16Le::from_f32(max_s / 15.0);
        b.dmin = F16Le::from_f32(max_m / 15.0);
        let (d, dmin) = (b.d.to_f32(), b.dmin.to_f32());
        let four_bit = |v: f32, unit: f32| if unit > 0.0 { (v / unit).round().clamp(0.0, 15.0) as u8 } else { 0 };
        let mut q = [0u8; 256];
        for g in 0..16 {
            let (ls, lm) = (four_bit(scales[g], d), four_bit(mins[g], dmin));
            b.scales[g] = ls | (lm << 4);
            let (step, m) = (d * ls as f32, dmin * lm as f32);
            for (qi, &v) in q[16 * g..16 * g + 16].iter_mut().zip(&xb[16 * g..]) {
                *qi = code(v + m, step, 0.0, 3.0, 0.0) as u8;
            }
        }
        pack(&q, b);
    }
}

/// Stores 256 codes (0..4, element order) into `qs` (read back by
/// [`BlockQ2K::codes`]).
fn pack(q: &[u8; 256], b: &mut BlockQ2K) {
    b.qs = [0; 64];
    for h in 0..2 {
        for j in 0..4 {
            for l in 0..32 {
                b.qs[32 * h + l] |= q[128 * h + 32 * j + l] << (2 * j);
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
        let q: [u8; 256] = std::array::from_fn(|i| ((i * 37 + 11) % 4) as u8);
        let mut b = BlockQ2K::zeroed();
        pack(&q, &mut b);
        assert_eq!(b.codes(), q);
    }

    /// Round trip through the dequantizer. Uniform values in [−1, 1): a group
    /// of 16 spans about 1.8, so 3 steps of 0.6 give a rounding error of
    /// step/√12 ≈ 0.17 rms (the |x|-weighted fit and the 4-bit scales cost a
    /// little more); bound 0.20 (measured 0.134). Weight-like values: between Q3_K's error and
    /// 2.5× it. Zero stays zero; encoding is deterministic.
    #[test]
    fn round_trip_error_and_determinism() {
        let mut z = [BlockQ2K::zeroed(); 1];
        quantize(&[0.0; 256], &mut z);
        let mut back = [1f32; 256];
        dequantize(&z, &mut back);
        assert!(back.iter().all(|&v| v == 0.0));
        let x = uniform(4096, 7);
        let mut b = vec![BlockQ2K::zeroed(); 16];
        quantize(&x, &mut b);
        let mut y = vec![0f32; 4096];
        dequantize(&b, &mut y);
        let e = rms(&x, &y);
        eprintln!("q2_k uniform rms {e:.5}");
        assert!(e <= 0.20, "q2_k uniform rms {e}");
        let mut b2 = vec![BlockQ2K::zeroed(); 16];
        quantize(&x, &mut b2);
        assert_eq!(bytes(&b), bytes(&b2));

        let x = weights_like(4096, 5);
        quantize(&x, &mut b);
        dequantize(&b, &mut y);
        let e2 = rms(&x, &y);
        let mut b3 = vec![super::super::q3_k::BlockQ3K::zeroed(); 16];
        super::super::q3_k::quantize(&x, &mut b3);
        super::super::q3_k::dequantize(&b3, &mut y);
        let e3 = rms(&x, &y);
        eprintln!("weights-like rms: q2_k {e2:.3e}, q3_k {e3:.3e}");
        assert!(e2 >= e3 && e2 <= 2.5 * e3, "q2_k {e2} vs q3_k {e3}");
    }
}
