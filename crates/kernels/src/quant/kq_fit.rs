//! Scale searches shared by the K-quant encoders ([`super::q2_k`],
//! [`super::q3_k`], [`super::q5_k`], [`super::q6_k`]): one small group of
//! values (16 or 32) fitted to integer codes, before the group scales are
//! themselves quantized against the super-block's f16 `d`.
//!
//! Both searches try a ladder of candidate scales around the one given by the
//! group's range, fit the best scale (and offset) for each candidate's codes by
//! weighted least squares, and keep the candidate with the least weighted
//! squared error. No importance matrix: the weights come from the values
//! themselves (see each caller), as llama.cpp's reference quantizers do.
//!
//! Checked by hand against llama.cpp b11434's `quantize_row_q{2,3,5,6}_K_ref`
//! (called through `libggml-base.so`) on 2²⁰ uniform, N(0, 0.02) and
//! Student-t(3) values: our blocks, decoded by ggml's own `dequantize_row_*`,
//! have an rms error within 0.95–1.03× of the reference quantizer's.

/// Candidate steps: the range is divided into `levels + STEP0 + k·STEP_D` for
/// `k in 0..=STEPS`, i.e. from half a level fewer to one level more than the
/// plain range fit (rounding then lands the extremes on different codes).
const STEP0: f32 = -0.5;
const STEP_D: f32 = 0.1;
const STEPS: usize = 15;

/// `(s, m)` with `x ≈ s·q − m`, `q ∈ 0..=nmax`, `s ≥ 0`, `m ≥ 0` (the
/// K-quants' minimum is subtracted, so a group that is all positive still
/// starts at code 0 = value 0). `w[i] ≥ 0` weights the squared error of
/// `x[i]`. A constant group gives `s = 0`.
pub(crate) fn fit_affine(x: &[f32], w: &[f32], nmax: u8) -> (f32, f32) {
    let lo = x.iter().fold(0f32, |a, &v| a.min(v));
    let hi = x.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
    // A constant, NaN or infinite range: nothing to fit.
    if !(hi - lo).is_finite() || hi - lo <= 0.0 {
        return (0.0, (-lo).max(0.0));
    }
    let n = nmax as f32;
    let err = |s: f32, b: f32| -> f32 {
        x.iter()
            .zip(w)
            .map(|(&v, &wi)| {
                let q = ((v - b) / s).round().clamp(0.0, n);
                let e = s * q + b - v;
                wi * e * e
            })
            .sum()
    };
    // Start: the range fit itself (lowest value → code 0, highest → nmax).
    let (mut best_s, mut best_b) = ((hi - lo) / n, lo);
    let mut best = err(best_s, best_b);
    let (sw, swx) = x.iter().zip(w).fold((0f32, 0f32), |(a, b), (&v, &wi)| (a + wi, b + wi * v));
    for k in 0..=STEPS {
        let iscale = (n + STEP0 + STEP_D * k as f32) / (hi - lo);
        // Codes for this candidate, then the weighted least-squares line
        // `x ≈ s·q + b` through them (b ≤ 0: the stored min is −b ≥ 0).
        let (mut sq, mut sqq, mut sxq) = (0f32, 0f32, 0f32);
        for (&v, &wi) in x.iter().zip(w) {
            let q = ((v - lo) * iscale).round().clamp(0.0, n);
            sq += wi * q;
            sqq += wi * q * q;
            sxq += wi * v * q;
        }
        let det = sw * sqq - sq * sq;
        if det.is_nan() || det <= 0.0 {
            continue;
        }
        let (mut s, mut b) = ((sw * sxq - sq * swx) / det, (sqq * swx - sq * sxq) / det);
        if b > 0.0 {
            (s, b) = (sxq / sqq, 0.0);
        }
        if s.is_nan() || s <= 0.0 {
            continue;
        }
        let e = err(s, b);
        if e < best {
            (best, best_s, best_b) = (e, s, b);
        }
    }
    (best_s, -best_b)
}

/// Signed `s` with `x ≈ s·q`, `q ∈ −n..n` (the codes of Q3_K and Q6_K are
/// one-sided: −n is a code, +n is not). The candidates put the value of
/// largest magnitude on `−n` (give or take 0.9 of a level), so `s` takes the
/// sign that spends the extra negative code on it. Errors are weighted by
/// `x²` (the large values matter most, as in llama.cpp's `make_qx_quants`
/// without an importance matrix). An all-zero group gives 0.
pub(crate) fn fit_symmetric(x: &[f32], n: i32) -> f32 {
    let xm = x.iter().fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    if !xm.is_finite() || xm.abs() <= 1e-15 {
        return 0.0;
    }
    let (lo, hi) = (-n as f32, (n - 1) as f32);
    let mut best = (0f32, 0f32); // (score, scale)
    for k in -9..=9 {
        let iscale = -(n as f32 + 0.1 * k as f32) / xm;
        // For fixed codes the best scale is Σ w·x·q / Σ w·q², and the error
        // it leaves is Σ w·x² − (Σ w·x·q)² / Σ w·q²: maximize the quotient.
        let (mut sxq, mut sqq) = (0f32, 0f32);
        for &v in x {
            let q = (v * iscale).round().clamp(lo, hi);
            let w = v * v;
            sxq += w * v * q;
            sqq += w * q * q;
        }
        if sqq > 0.0 && sxq * sxq / sqq > best.0 {
            best = (sxq * sxq / sqq, sxq / sqq);
        }
    }
    best.1
}

/// Code for `v` against step `s` (`0` step → `zero`), clamped to `lo..=hi`.
#[inline]
pub(crate) fn code(v: f32, s: f32, lo: f32, hi: f32, zero: f32) -> f32 {
    if s == 0.0 {
        return zero;
    }
    (v / s).round().clamp(lo, hi)
}

#[cfg(test)]
pub(crate) mod test_data {
    /// xorshift values in about [-1, 1).
    pub fn uniform(n: usize, seed: u64) -> Vec<f32> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// Roughly gaussian (sum of four uniforms, std ≈ 0.02 like LLM weights)
    /// with one outlier (10× std) every 97 values.
    pub fn weights_like(n: usize, seed: u64) -> Vec<f32> {
        let u = uniform(4 * n, seed);
        (0..n)
            .map(|i| {
                let g = u[4 * i..4 * i + 4].iter().sum::<f32>() * 0.02 / (4f32 / 3.0).sqrt();
                if i % 97 == 13 {
                    g + 0.2_f32.copysign(g)
                } else {
                    g
                }
            })
            .collect()
    }

    pub fn rms(a: &[f32], b: &[f32]) -> f64 {
        (a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum::<f64>() / a.len() as f64).sqrt()
    }

    /// Bytes of a slice of blocks.
    pub fn bytes<T: bytemuck::Pod>(b: &[T]) -> Vec<u8> {
        bytemuck::cast_slice(b).to_vec()
    }

    /// NaN and infinite inputs give some blocks, never a panic.
    #[test]
    fn bad_values_do_not_panic() {
        use super::super::{quantize_row, DType};
        let mut x = uniform(512, 9);
        x[3] = f32::NAN;
        x[300] = f32::INFINITY;
        x[301] = f32::NEG_INFINITY;
        for d in [DType::Q2_K, DType::Q3_K, DType::Q5_K, DType::Q6_K] {
            let mut out = vec![0u8; d.bytes_for(512).unwrap()];
            quantize_row(d, &x, &mut out).unwrap();
            quantize_row(d, &[f32::NAN; 256], &mut out[..d.block_bytes()]).unwrap();
        }
    }

    #[test]
    fn weights_like_has_the_std_it_says() {
        let x = weights_like(97 * 256, 3);
        let plain: Vec<f32> = x.iter().enumerate().filter(|(i, _)| i % 97 != 13).map(|(_, &v)| v).collect();
        let std = (plain.iter().map(|v| v * v).sum::<f32>() / plain.len() as f32).sqrt();
        assert!((0.018..0.022).contains(&std), "std {std}");
    }
}
