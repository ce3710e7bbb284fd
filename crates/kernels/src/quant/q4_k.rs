//! Q4_K: 256 values in 8 sub-blocks of 32. Each sub-block has a 6-bit scale and
//! a 6-bit min (packed in `scales[12]`, see [`scale_min`]); `x = d·sc·q − dmin·m`.
//!
//! Element order: chunk `c` (0..4) covers elements `64c..64c+64` from
//! `qs[32c..32c+32]`; element `64c+l` is the low nibble of `qs[32c+l]` (sub-block
//! `2c`), element `64c+32+l` the high nibble (sub-block `2c+1`).

use super::q8_k::BlockQ8K;
use super::F16Le;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ4K {
    pub d: F16Le,
    pub dmin: F16Le,
    pub scales: [u8; 12],
    pub qs: [u8; 128],
}
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);

impl BlockQ4K {
    pub const ELEMS: usize = 256;
}

/// Scale and min of sub-block `j` (0..8) from the 12 packed bytes (ggml's
/// `get_scale_min_k4`).
#[inline(always)]
pub fn scale_min(j: usize, s: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        ((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
    }
}

/// All 8 (scale, min) pairs, decoded a word at a time (same result as
/// [`scale_min`] for each `j`).
#[inline]
pub fn scales_mins(s: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    const LOW6: u32 = 0x3F3F_3F3F;
    const LOW4: u32 = 0x0F0F_0F0F;
    const TOP2: u32 = 0x0303_0303;
    let a = u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    let b = u32::from_le_bytes([s[4], s[5], s[6], s[7]]);
    let c = u32::from_le_bytes([s[8], s[9], s[10], s[11]]);
    let sc_hi = (c & LOW4) | (((a >> 6) & TOP2) << 4);
    let m_hi = ((c >> 4) & LOW4) | (((b >> 6) & TOP2) << 4);
    let sc = (a & LOW6) as u64 | (sc_hi as u64) << 32;
    let m = (b & LOW6) as u64 | (m_hi as u64) << 32;
    (sc.to_le_bytes(), m.to_le_bytes())
}

pub fn dequantize(blocks: &[BlockQ4K], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 256);
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(256)) {
        let (d, dmin) = (b.d.to_f32(), b.dmin.to_f32());
        for c in 0..4 {
            let (sc0, m0) = scale_min(2 * c, &b.scales);
            let (sc1, m1) = scale_min(2 * c + 1, &b.scales);
            let (d0, mm0) = (d * sc0 as f32, dmin * m0 as f32);
            let (d1, mm1) = (d * sc1 as f32, dmin * m1 as f32);
            for l in 0..32 {
                let q = b.qs[32 * c + l];
                o[64 * c + l] = d0 * (q & 15) as f32 - mm0;
                o[64 * c + 32 + l] = d1 * (q >> 4) as f32 - mm1;
            }
        }
    }
}

/// Quantizes `x` (a multiple of 256 values) to Q4_K blocks.
///
/// Each sub-block of 32 gets `x ≈ s·q − m`, `q ∈ 0..=15`, `m ≥ 0`: first
/// from its range (`m = −min(0, lo)`, `s = (hi + m)/15`), then two rounds of
/// least squares on the chosen `q`. The 8 scales and mins are then stored as
/// 6-bit multiples of the block's `d = max s/63` and `dmin = max m/63` (both
/// f16), and the values are re-quantized against those stored scales, so the
/// The super-block header shared by Q4_K and Q5_K: eight sub-block scales and
/// mins (≥ 0) become `d`, `dmin` (their maxima ÷ 63, f16) and 6-bit multiples
/// of them, packed as the block stores them. Returns (d, dmin, packed, the
/// 6-bit scales, the 6-bit mins).
pub(crate) fn six_bit_scales(scales: &[f32; 8], mins: &[f32; 8]) -> (F16Le, F16Le, [u8; 12], [u8; 8], [u8; 8]) {
    let max_s = scales.iter().fold(0f32, |a, &v| a.max(v));
    let max_m = mins.iter().fold(0f32, |a, &v| a.max(v));
    let (d, dmin) = (F16Le::from_f32(max_s / 63.0), F16Le::from_f32(max_m / 63.0));
    let six_bit = |v: f32, unit: f32| if unit > 0.0 { (v / unit).round().clamp(0.0, 63.0) as u8 } else { 0 };
    let ls: [u8; 8] = std::array::from_fn(|j| six_bit(scales[j], d.to_f32()));
    let lm: [u8; 8] = std::array::from_fn(|j| six_bit(mins[j], dmin.to_f32()));
    (d, dmin, pack_scales_mins(&ls, &lm), ls, lm)
}

/// codes fit what the dequantizer will compute.
pub fn quantize(x: &[f32], out: &mut [BlockQ4K]) {
    assert_eq!(x.len(), out.len() * 256);
    for (xb, b) in x.chunks_exact(256).zip(out.iter_mut()) {
        let mut scales = [0f32; 8];
        let mut mins = [0f32; 8];
        for (j, sub) in xb.chunks_exact(32).enumerate() {
            (scales[j], mins[j]) = fit_sub_block(sub);
        }
        let (ls, lm);
        (b.d, b.dmin, b.scales, ls, lm) = six_bit_scales(&scales, &mins);
        let (d, dmin) = (b.d.to_f32(), b.dmin.to_f32());
        for c in 0..4 {
            for half in 0..2 {
                let j = 2 * c + half;
                let (sc, m) = (d * ls[j] as f32, dmin * lm[j] as f32);
                let inv = if sc > 0.0 { 1.0 / sc } else { 0.0 };
                for l in 0..32 {
                    let q = ((xb[32 * j + l] + m) * inv).round().clamp(0.0, 15.0) as u8;
                    let byte = &mut b.qs[32 * c + l];
                    *byte = if half == 0 { (*byte & 0xF0) | q } else { (*byte & 0x0F) | (q << 4) };
                }
            }
        }
    }
}

/// `(s, m)` with `x ≈ s·q − m` for one sub-block of 32 (see [`quantize`]).
fn fit_sub_block(x: &[f32]) -> (f32, f32) {
    let lo = x.iter().fold(0f32, |a, &v| a.min(v));
    let hi = x.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
    let (mut s, mut m) = ((hi - lo) / 15.0, -lo);
    if s <= 0.0 {
        return (0.0, m.max(0.0));
    }
    for _ in 0..2 {
        // Least squares of x = s·q − m over the current codes.
        let (mut sq, mut sqq, mut sx, mut sxq) = (0f64, 0f64, 0f64, 0f64);
        for &v in x {
            let q = ((v + m) / s).round().clamp(0.0, 15.0) as f64;
            sq += q;
            sqq += q * q;
            sx += v as f64;
            sxq += v as f64 * q;
        }
        let n = x.len() as f64;
        let det = n * sqq - sq * sq;
        if det <= 0.0 {
            break;
        }
        let (s_new, m_new) = ((n * sxq - sq * sx) / det, (sq * sxq - sqq * sx) / det);
        if s_new <= 0.0 || m_new < 0.0 {
            break;
        }
        (s, m) = (s_new as f32, m_new as f32);
    }
    (s, m)
}

/// The 12 bytes [`scale_min`] reads back as `(ls[j], lm[j])` (each < 64).
pub fn pack_scales_mins(ls: &[u8; 8], lm: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..4 {
        s[j] = ls[j] | ((ls[j + 4] >> 4) << 6);
        s[j + 4] = lm[j] | ((lm[j + 4] >> 4) << 6);
        s[j + 8] = (ls[j + 4] & 15) | ((lm[j + 4] & 15) << 4);
    }
    s
}

/// `Σ_b d_a·(d·Σ_j sc_j·Σ q·q8 − dmin·Σ_j m_j·bsum_j)` with the sub-block sums of
/// the activations taken from `bsums` (pairs of 16-value sums).
pub fn vec_dot(w: &[BlockQ4K], a: &[BlockQ8K]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let (sc, m) = scales_mins(&x.scales);
        let mut sumi = 0i32;
        let mut summ = 0i32;
        for c in 0..4 {
            let (mut s0, mut s1) = (0i32, 0i32);
            for l in 0..32 {
                let q = x.qs[32 * c + l];
                s0 += (q & 15) as i32 * y.qs[64 * c + l] as i32;
                s1 += (q >> 4) as i32 * y.qs[64 * c + 32 + l] as i32;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_decode_matches_bytewise() {
        let mut s = [0u8; 12];
        let mut x = 0x1234_5678_9abc_def1u64;
        for _ in 0..1000 {
            for v in s.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *v = x as u8;
            }
            let (sc, m) = scales_mins(&s);
            for j in 0..8 {
                assert_eq!((sc[j], m[j]), scale_min(j, &s));
            }
        }
    }

    /// xorshift values in about [-1, 1).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        crate::quant::kq_fit::test_data::uniform(n, seed)
    }

    #[test]
    fn packing_reads_back() {
        let ls: [u8; 8] = [0, 1, 17, 63, 32, 48, 5, 63];
        let lm: [u8; 8] = [63, 0, 9, 31, 16, 1, 62, 0];
        let s = pack_scales_mins(&ls, &lm);
        for j in 0..8 {
            assert_eq!(scale_min(j, &s), (ls[j], lm[j]), "sub-block {j}");
        }
    }

    /// Round trip through the dequantizer: zero stays zero, and the error of
    /// uniform and gaussian-like data is at most that of Q4_0 on the same
    /// values (Q4_K has the same 16 levels per 32 values, plus a min that puts
    /// them on the data's range).
    #[test]
    fn round_trip_error_is_at_most_q4_0s() {
        let mut zeros = [BlockQ4K::zeroed(); 1];
        quantize(&[0.0; 256], &mut zeros);
        let mut back = [1f32; 256];
        dequantize(&zeros, &mut back);
        assert!(back.iter().all(|&v| v == 0.0));
        let rms = |a: &[f32], b: &[f32]| {
            (a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum::<f64>() / a.len() as f64).sqrt()
        };
        let uniform = values(4096, 7);
        let skewed: Vec<f32> = values(4096, 11).iter().map(|v| v * v * v * 3.0 + 0.5).collect();
        for (name, x) in [("uniform", uniform), ("skewed", skewed)] {
            let mut k = vec![BlockQ4K::zeroed(); x.len() / 256];
            quantize(&x, &mut k);
            let mut yk = vec![0f32; x.len()];
            dequantize(&k, &mut yk);
            let mut q0 = vec![super::super::q4_0::BlockQ4_0::zeroed(); x.len() / 32];
            super::super::q4_0::quantize(&x, &mut q0);
            let mut y0 = vec![0f32; x.len()];
            super::super::q4_0::dequantize(&q0, &mut y0);
            let (ek, e0) = (rms(&x, &yk), rms(&x, &y0));
            assert!(ek <= e0, "{name}: q4_k rms {ek} > q4_0 rms {e0}");
        }
    }
}
