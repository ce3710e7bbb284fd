//! AVX2 Q6_K row-range kernels for batches: each block of a weight row is
//! decoded once for up to [`TILE`] activation rows.
//!
//! Why: at AVX2 Q6_K stays in the file layout and below the GEMM's 32 rows
//! every (row, activation row) pair ran the one-row dot, which decodes the
//! block (codes from `ql`/`qh`, scale word pairs: ~60 µops) for ~30 µops of
//! products. A batch of `m` streams paid the decode `m` times, and Q6_K
//! matmuls scaled 1.5× from 1 to 16 rows on the Zen 3 VM where Q4_K scaled
//! 2–3×. Q6_K is in every K-quant file people download (the output head,
//! half of `ffn_down`/`attn_v` in Q4_K_M and Q5_K_M), so it was the part of
//! a batched decode that did not batch.
//!
//! The rows are recoded at load as the identity
//! ([`crate::packed::Recoding::Q6kRows`]): the copy puts them in the
//! loader's huge-page arena and routes every batch size below the GEMM's to
//! [`rows_q6_k`]; the GEMM reads them as they lie.
//!
//! Numerics: per (row, activation row) the same exact integer sums and the
//! same float steps as [`super::avx2_k::dot_q6_k`] (an FMA a block into
//! eight lanes, then one horizontal sum), so a batch equals the one-row dot
//! bit for bit.

use super::avx2::hsum_ps;
use super::avx2_k::{dot_q6_k, q6k_decode, q6k_scale, q6k_sums};
use super::avx512_rows16_k::{prefetch_l2, PREFETCH_AHEAD};
use std::arch::x86_64::*;

/// Bytes of a Q6_K block and of a Q8_K one.
const BLOCK: usize = 210;
const Q8K_BYTES: usize = 292;
/// Most activation rows one decoded block serves.
const TILE: usize = 16;

/// Row `x0` (`nb` blocks) against `m ≤ TILE` Q8_K rows at `a`, `a_stride`
/// apart: `y[j·y_stride]` gets act `j`'s dot.
#[inline(always)]
unsafe fn row_tile(nb: usize, x0: *const u8, a: *const u8, a_stride: usize, m: usize, y: *mut f32, y_stride: usize) {
    debug_assert!(m <= TILE);
    let mut acc = [_mm256_setzero_ps(); TILE];
    for i in 0..nb {
        let x = x0.add(i * BLOCK);
        for l in 0..4 {
            prefetch_l2(x.wrapping_add(PREFETCH_AHEAD + 64 * l));
        }
        let blk = q6k_decode(x);
        for (j, acc) in acc[..m].iter_mut().enumerate() {
            let yb = a.add(j * a_stride + i * Q8K_BYTES);
            let sumi = q6k_sums(&blk, yb);
            *acc = _mm256_fmadd_ps(q6k_scale(x, yb), _mm256_cvtepi32_ps(sumi), *acc);
        }
    }
    for (j, acc) in acc[..m].iter().enumerate() {
        *y.add(j * y_stride) = hsum_ps(*acc);
    }
}

/// `rows` Q6_K rows in the file layout, `row_bytes` apart, × `m` Q8_K
/// activation rows (see [`crate::quant::Rows16Fn`]): `y[j·y_stride + r] =
/// row r · act j`, each equal to [`dot_q6_k`] bit for bit.
///
/// # Safety
/// AVX2/FMA/F16C CPU; `w` holds `rows` rows of `n / 256` blocks (`n` a
/// multiple of 256); `a` holds `m` Q8_K rows `a_stride` bytes apart; `y`
/// valid for the writes.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn rows_q6_k(
    n: usize,
    w: *const u8,
    row_bytes: usize,
    rows: usize,
    a: *const u8,
    a_stride: usize,
    m: usize,
    y: *mut f32,
    y_stride: usize,
) {
    let nb = n / 256;
    // Row by row, every activation row against it while it is in L1: the
    // weights stream from memory once whatever the batch.
    for r in 0..rows {
        let x = w.add(r * row_bytes);
        if m == 1 {
            *y.add(r) = dot_q6_k(n, x, a);
            continue;
        }
        let mut j = 0;
        while j < m {
            let take = (m - j).min(TILE);
            row_tile(nb, x, a.add(j * a_stride), a_stride, take, y.add(j * y_stride + r), y_stride);
            j += take;
        }
    }
}

/// Four Q6_K rows in the file layout, `stride` bytes apart (see
/// [`crate::quant::Dot4Fn`]): four one-row dots.
///
/// # Safety
/// As for [`crate::quant::Dot4Fn`]; AVX2/FMA/F16C CPU.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot4_q6_k(n: usize, w: *const u8, stride: usize, a: *const u8, out: *mut f32) {
    for r in 0..4 {
        *out.add(r) = dot_q6_k(n, w.add(r * stride), a);
    }
}

#[cfg(test)]
mod tests {
    /// The batch tiles equal the one-row dot bit for bit, at one activation
    /// row, a tile, and more than a tile; and the one-row dot stays within
    /// float rounding of the scalar reference.
    #[test]
    fn batches_equal_the_one_row_dot() {
        use crate::quant::{self, q8_k};
        if !is_x86_feature_detected!("avx2") || !is_x86_feature_detected!("fma") || !is_x86_feature_detected!("f16c") {
            eprintln!("skipped: no AVX2 here");
            return;
        }
        let mut rng = super::super::XorShift(0x0F1E_2D3C_4B5A_6978);
        let scalar = quant::scalar::dot_fn(crate::DType::Q6_K);
        let rows = 5;
        for nb in [1usize, 3] {
            let (n, rb) = (256 * nb, 210 * nb);
            let mut w: Vec<u8> = (0..rows * rb).map(|_| rng.next() as u8).collect();
            for blk in w.chunks_exact_mut(210) {
                // A finite scale: f16 0.0–1.0.
                blk[208..210].copy_from_slice(&((rng.next() % 0x3C00) as u16).to_le_bytes());
            }
            for m in [1usize, 3, 17] {
                let x: Vec<f32> = (0..m * n).map(|_| (rng.next() % 2001) as f32 / 1000.0 - 1.0).collect();
                let mut a = vec![<q8_k::BlockQ8K as bytemuck::Zeroable>::zeroed(); m * nb];
                q8_k::quantize(&x, &mut a);
                let ap = bytemuck::cast_slice::<_, u8>(&a).as_ptr();
                let mut y = vec![0f32; m * rows];
                unsafe { super::rows_q6_k(n, w.as_ptr(), rb, rows, ap, 292 * nb, m, y.as_mut_ptr(), rows) };
                for j in 0..m {
                    for r in 0..rows {
                        let (wr, aj) = (unsafe { w.as_ptr().add(r * rb) }, unsafe { ap.add(j * 292 * nb) });
                        let one = unsafe { super::dot_q6_k(n, wr, aj) };
                        let g = y[j * rows + r];
                        assert_eq!(g.to_bits(), one.to_bits(), "row {r}, act {j} of {m}, {nb} blocks: {g} vs {one}");
                        let want = unsafe { scalar(n, wr, aj) };
                        assert!((g - want).abs() <= 1e-4 * want.abs().max(1.0), "{g} vs scalar {want}");
                    }
                }
            }
        }
    }
}
