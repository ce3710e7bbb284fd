//! AVX2 4 × 2 tile for IQ4_NL weights × Q8_0 activations (small batches; at
//! AVX2 also the prefill kernel, there being no AVX2 lane GEMM of 32-value
//! blocks).
//!
//! Why: IQ4_NL had the one-row dot only, so a batch decoded every weight block
//! (table lookup) once per activation row. Here each block of 4 weight rows is
//! decoded once for 2 activation rows, and each activation block loaded once
//! for 4 weight rows.
//!
//! Numerics: per (weight row, activation row, block) the same exact integer
//! sum as [`super::avx2_lowk::dot_iq4_nl`] (`|K|·sign(a, K)` pairs,
//! 2·127·127 < 2¹⁵), the 8 sums reduced together (exact), then the scalar
//! reference's float step `sum += (d_a·d)·sumi` per block in order, 8 pairs in
//! the 8 lanes, no FMA: every output equals the one-row kernel's and the
//! scalar reference's bit for bit, so batches stay identical to decode.

use super::avx512_lowk::f16_at;
use crate::quant::iq4_nl::KVALUES;
use std::arch::x86_64::*;

/// IQ4_NL block bytes: f16 `d`, 16 nibble bytes.
const BLOCK: usize = 18;
/// Q8_0 block bytes: f16 `d`, 32 × i8.
const Q8_0: usize = 34;

/// The 32 signed values `K[code]` of one block's 16 nibble bytes at `qs`
/// (element `j` the low nibble of byte `j`, `j + 16` its high nibble).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn values(qs: *const u8, table: __m256i) -> __m256i {
    let b = _mm_loadu_si128(qs as *const __m128i);
    let m = _mm_set1_epi8(0x0F);
    _mm256_shuffle_epi8(table, _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m)))
}

/// Lane `k` = the sum of the 8 lanes of `v[k]` (exact i32 adds).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn hsum8(v: [__m256i; 8]) -> __m256i {
    let a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    let b = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    // a: [v0..v3 partial (low 128) | v0..v3 partial (high 128)], b likewise.
    _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31))
}

/// IQ4_NL weights × Q8_0 activations, 4 × 2 tile (see [`crate::quant::TileFn`]).
///
/// # Safety
/// AVX2+FMA+F16C CPU; pointers as for [`crate::quant::TileFn`] (`n` a multiple of 32).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tile_iq4_nl(
    n: usize,
    w: *const u8,
    stride: usize,
    a: *const u8,
    a_stride: usize,
    y: *mut f32,
    y_stride: usize,
) {
    let t = _mm_loadu_si128(KVALUES.as_ptr() as *const __m128i);
    let table = _mm256_set_m128i(t, t);
    let ones = _mm256_set1_epi16(1);
    // Lane 4j + r: weight row r × activation row j.
    let mut acc = _mm256_setzero_ps();
    for i in 0..n / 32 {
        let mut dx = [0f32; 4];
        let mut v = [_mm256_setzero_si256(); 4];
        for r in 0..4 {
            let x = w.add(r * stride + i * BLOCK);
            dx[r] = f16_at(x);
            v[r] = values(x.add(2), table);
        }
        let mut s = [_mm256_setzero_si256(); 8];
        let mut dd = [0f32; 8];
        for j in 0..2 {
            let yb = a.add(j * a_stride + i * Q8_0);
            let dy = f16_at(yb);
            let q8 = _mm256_loadu_si256(yb.add(2) as *const __m256i);
            for r in 0..4 {
                let p = _mm256_maddubs_epi16(_mm256_abs_epi8(v[r]), _mm256_sign_epi8(q8, v[r]));
                s[4 * j + r] = _mm256_madd_epi16(p, ones);
                dd[4 * j + r] = dy * dx[r];
            }
        }
        let sumi = _mm256_cvtepi32_ps(hsum8(s));
        acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(dd.as_ptr()), sumi));
    }
    let mut out = [0f32; 8];
    _mm256_storeu_ps(out.as_mut_ptr(), acc);
    for j in 0..2 {
        for r in 0..4 {
            *y.add(j * y_stride + r) = out[4 * j + r];
        }
    }
}
