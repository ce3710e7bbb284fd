//! Q5_K: Q4_K plus a 5th bit per value: `qh[l]` bit `2c` belongs to element
//! `64c+l` (low nibble), bit `2c+1` to element `64c+32+l` (high nibble).

use super::q4_k::{scale_min, scales_mins};
use super::q8_k::BlockQ8K;
use super::F16Le;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ5K {
    pub d: F16Le,
    pub dmin: F16Le,
    pub scales: [u8; 12],
    pub qh: [u8; 32],
    pub qs: [u8; 128],
}
const _: () = assert!(std::mem::size_of::<BlockQ5K>() == 176);

impl BlockQ5K {
    pub const ELEMS: usize = 256;

    /// The 5-bit codes of chunk `c` (0..4): elements `64c..64c+64`.
    #[inline]
    pub fn chunk_codes(&self, c: usize) -> [u8; 64] {
        let mut q = [0u8; 64];
        for l in 0..32 {
            let v = self.qs[32 * c + l];
            let h = self.qh[l] >> (2 * c);
            q[l] = (v & 15) | ((h & 1) << 4);
            q[l + 32] = (v >> 4) | (((h >> 1) & 1) << 4);
        }
        q
    }
}

pub fn dequantize(blocks: &[BlockQ5K], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 256);
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(256)) {
        let (d, dmin) = (b.d.to_f32(), b.dmin.to_f32());
        for c in 0..4 {
            let (sc0, m0) = scale_min(2 * c, &b.scales);
            let (sc1, m1) = scale_min(2 * c + 1, &b.scales);
            let q = b.chunk_codes(c);
            for l in 0..32 {
                o[64 * c + l] = d * sc0 as f32 * q[l] as f32 - dmin * m0 as f32;
                o[64 * c + 32 + l] = d * sc1 as f32 * q[l + 32] as f32 - dmin * m1 as f32;
            }
        }
    }
}

/// Same structure as the Q4_K dot with 5-bit codes.
pub fn vec_dot(w: &[BlockQ5K], a: &[BlockQ8K]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let (sc, m) = scales_mins(&x.scales);
        let mut sumi = 0i32;
        let mut summ = 0i32;
        for c in 0..4 {
            let q = x.chunk_codes(c);
            let (mut s0, mut s1) = (0i32, 0i32);
            for l in 0..32 {
                s0 += q[l] as i32 * y.qs[64 * c + l] as i32;
                s1 += q[l + 32] as i32 * y.qs[64 * c + 32 + l] as i32;
            }
            sumi += sc[2 * c] as i32 * s0 + sc[2 * c + 1] as i32 * s1;
        }
        for j in 0..8 {
            summ += m[j] as i32 * (y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32);
        }
        sum += y.d * x.d.to_f32() * sumi as f32 - y.d * x.dmin.to_f32() * summ as f32;
    }
    sum
}

/// Quantizes `x` (a multiple of 256 values) to Q5_K blocks (llama.cpp's
/// reference scheme, no importance matrix).
///
/// Each sub-block of 32 gets `x ≈ s·q − m` (`q ∈ 0..32`, `m ≥ 0`) from
/// [`super::kq_fit::fit_affine`], errors weighted by `rms(block) + |x|` (the
/// large values count more, the small ones still count). The 8 scales and
/// mins are stored as 6-bit multiples of `d = max s/63`, `dmin = max m/63`
/// (f16, packed as Q4_K's), and the codes recomputed against the stored
/// values.
pub fn quantize(x: &[f32], out: &mut [BlockQ5K]) {
    use super::kq_fit::{code, fit_affine};
    use super::q4_k::six_bit_scales;
    assert_eq!(x.len(), out.len() * 256);
    for (xb, b) in x.chunks_exact(256).zip(out.iter_mut()) {
        let av = (xb.iter().map(|v| v * v).sum::<f32>() / 256.0).sqrt();
        let w: Vec<f32> = xb.iter().map(|v| av + v.abs()).collect();
        let mut scales = [0f32; 8];
        let mut mins = [0f32; 8];
        for j in 0..8 {
            (scales[j], mins[j]) = fit_affine(&xb[32 * j..32 * j + 32], &w[32 * j..32 * j + 32], 31);
        }
        let (ls, lm);
        (b.d, b.dmin, b.scales, ls, lm) = six_bit_scales(&scales, &mins);
        let (d, dmin) = (b.d.to_f32(), b.dmin.to_f32());
        let mut q = [0u8; 256];
        for j in 0..8 {
            let (step, m) = (d * ls[j] as f32, dmin * lm[j] as f32);
            for (qi, &v) in q[32 * j..32 * j + 32].iter_mut().zip(&xb[32 * j..]) {
                *qi = code(v + m, step, 0.0, 31.0, 0.0) as u8;
            }
        }
        pack(&q, b);
    }
}

/// Stores 256 codes (0..32, element order) into `qs`/`qh` (read back by
/// [`BlockQ5K::chunk_codes`]).
fn pack(q: &[u8; 256], b: &mut BlockQ5K) {
    b.qh = [0; 32];
    for c in 0..4 {
        for l in 0..32 {
            let (lo, hi) = (q[64 * c + l], q[64 * c + 32 + l]);
            b.qs[32 * c + l] = (lo & 15) | ((hi & 15) << 4);
            b.qh[l] |= ((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::kq_fit::test_data::{bytes, rms, uniform, weights_like};
    use super::*;

    #[test]
    fn packing_reads_back() {
        let q: [u8; 256] = std::array::from_fn(|i| ((i * 37 + 11) % 32) as u8);
        let mut b = BlockQ5K::zeroed();
        pack(&q, &mut b);
        for c in 0..4 {
            assert_eq!(b.chunk_codes(c)[..], q[64 * c..64 * c + 64]);
        }
    }

    /// Round trip through the dequantizer. Uniform values in [−1, 1): a
    /// sub-block of 32 spans about 1.9, so 31 steps of 0.062 give a rounding
    /// error of step/√12 ≈ 0.018 rms; bound 0.020 (measured 0.0162). Weight-like values: at
    /// most 0.6 of Q4_K's error (one more bit: half the step, plus slack for
    /// the shared 6-bit scales), and no more than Q5_1's (the same 5 bits per
    /// 32 with f16 scales). Zero stays zero; encoding is deterministic.
    #[test]
    fn round_trip_error_and_determinism() {
        let mut z = [BlockQ5K::zeroed(); 1];
        quantize(&[0.0; 256], &mut z);
        let mut back = [1f32; 256];
        dequantize(&z, &mut back);
        assert!(back.iter().all(|&v| v == 0.0));
        let x = uniform(4096, 7);
        let mut b = vec![BlockQ5K::zeroed(); 16];
        quantize(&x, &mut b);
        let mut y = vec![0f32; 4096];
        dequantize(&b, &mut y);
        let e = rms(&x, &y);
        eprintln!("q5_k uniform rms {e:.5}");
        assert!(e <= 0.020, "q5_k uniform rms {e}");
        let mut b2 = vec![BlockQ5K::zeroed(); 16];
        quantize(&x, &mut b2);
        assert_eq!(bytes(&b), bytes(&b2));

        let x = weights_like(4096, 5);
        quantize(&x, &mut b);
        dequantize(&b, &mut y);
        let e5 = rms(&x, &y);
        let mut b4 = vec![super::super::q4_k::BlockQ4K::zeroed(); 16];
        super::super::q4_k::quantize(&x, &mut b4);
        super::super::q4_k::dequantize(&b4, &mut y);
        let e4 = rms(&x, &y);
        let mut b51 = vec![super::super::q5_1::BlockQ5_1::zeroed(); 128];
        super::super::q5_1::quantize(&x, &mut b51);
        super::super::q5_1::dequantize(&b51, &mut y);
        let e51 = rms(&x, &y);
        eprintln!("weights-like rms: q5_k {e5:.3e}, q4_k {e4:.3e}, q5_1 {e51:.3e}");
        assert!(e5 <= 0.6 * e4 && e5 <= e51, "q5_k {e5} vs q4_k {e4}, q5_1 {e51}");
    }
}
