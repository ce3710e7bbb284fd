//! AVX2 + FMA + F16C dots for the low-bit float formats: MXFP4 and NVFP4
//! against Q8_0 activations, FP8 against f32 activations. Scalar references:
//! [`crate::quant::mxfp4`], [`crate::quant::nvfp4`], [`crate::quant::fp8`].
//!
//! FP4 codes become the doubled E2M1 values (i8, |v| ≤ 12) through one
//! `shuffle_epi8` table lookup; then the Q4_0 machinery (sign trick, `maddubs`)
//! applies. A pair sum is at most 2·12·127 < 2¹⁵, so `maddubs` never saturates.
//!
//! FP8 E4M3 becomes f16 exactly by moving bits: `((b & 0x7F) << 7) | (b & 0x80) << 8`
//! reads as `E4M3(b)·2⁻⁸` (bias 15 instead of 7; E4M3 subnormals land on f16
//! subnormals), so the block scale is multiplied by 2⁸. NaN codes are refused at load.

use super::avx2::f16_bits as f16_to_f32;
use super::avx2::{dot_i8i8, hsum_ps, nibbles, rd16};
use super::avx2_rows::prefetch;
use crate::quant::minifloat::{e8m0_half, ue4m3_half, E2M1_X2};
use std::arch::x86_64::*;

/// The doubled E2M1 values in both 128-bit lanes, for `shuffle_epi8`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn e2m1_table() -> __m256i {
    let t = _mm_loadu_si128(E2M1_X2.as_ptr() as *const __m128i);
    _mm256_set_m128i(t, t)
}

/// MXFP4 × Q8_0 (see [`crate::quant::DotFn`]).
///
/// # Safety
/// AVX2+FMA+F16C CPU; pointers as for [`crate::quant::DotFn`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_mxfp4(n: usize, w: *const u8, a: *const u8) -> f32 {
    let nb = n / 32;
    let table = e2m1_table();
    let mut acc = [_mm256_setzero_ps(); 2];
    for i in 0..nb {
        let (x, y) = (w.add(i * 17), a.add(i * 34));
        prefetch(x.wrapping_add(2 * nb * 17));
        let d = _mm256_set1_ps(e8m0_half(*x) * f16_to_f32(rd16(y)));
        let qx = _mm256_shuffle_epi8(table, nibbles(x.add(1)));
        let p = dot_i8i8(qx, _mm256_loadu_si256(y.add(2) as *const __m256i));
        acc[i & 1] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[i & 1]);
    }
    hsum_ps(_mm256_add_ps(acc[0], acc[1]))
}

/// NVFP4 × Q8_0: each Q8_0 block covers two 16-value sub-blocks; the i32 lanes
/// 0–3 of the product belong to the first, 4–7 to the second.
///
/// # Safety
/// AVX2+FMA+F16C CPU; pointers as for [`crate::quant::DotFn`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_nvfp4(n: usize, w: *const u8, a: *const u8) -> f32 {
    let nb = n / 64;
    let table = e2m1_table();
    let low = _mm_set1_epi8(0x0F);
    let mut acc = [_mm256_setzero_ps(); 2];
    for i in 0..nb {
        let x = w.add(i * 36);
        prefetch(x.wrapping_add(2 * nb * 36));
        for h in 0..2 {
            let y = a.add((2 * i + h) * 34);
            let dy = f16_to_f32(rd16(y));
            let (s0, s1) = (ue4m3_half(*x.add(2 * h)) * dy, ue4m3_half(*x.add(2 * h + 1)) * dy);
            let d = _mm256_set_m128(_mm_set1_ps(s1), _mm_set1_ps(s0));
            // Bytes 16h..16h+16: sub-block 2h in bytes 0..8, 2h+1 in 8..16.
            let b = _mm_loadu_si128(x.add(4 + 16 * h) as *const __m128i);
            let lo = _mm_and_si128(b, low);
            let hi = _mm_and_si128(_mm_srli_epi16(b, 4), low);
            // Element order of the activation block: [lo 0..8, hi 0..8 | lo 8..16, hi 8..16].
            let q = _mm256_set_m128i(_mm_unpackhi_epi64(lo, hi), _mm_unpacklo_epi64(lo, hi));
            let qx = _mm256_shuffle_epi8(table, q);
            let p = dot_i8i8(qx, _mm256_loadu_si256(y.add(2) as *const __m256i));
            acc[h] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[h]);
        }
    }
    hsum_ps(_mm256_add_ps(acc[0], acc[1]))
}

/// Eight E4M3 bytes (zero-extended to u16 lanes) → their values · 2⁻⁸ as f16 bits.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn e4m3_to_f16_bits(v: __m256i) -> __m256i {
    let mag = _mm256_slli_epi16(_mm256_and_si256(v, _mm256_set1_epi16(0x7F)), 7);
    let sign = _mm256_slli_epi16(_mm256_and_si256(v, _mm256_set1_epi16(0x80)), 8);
    _mm256_or_si256(mag, sign)
}

/// FP8 (64-value blocks) × f32 activations.
///
/// # Safety
/// AVX2+FMA+F16C CPU; pointers as for [`crate::quant::DotFn`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_fp8(n: usize, w: *const u8, a: *const u8) -> f32 {
    let nb = n / 64;
    let a = a as *const f32;
    let mut acc = _mm256_setzero_ps();
    for i in 0..nb {
        let x = w.add(i * 68);
        prefetch(x.wrapping_add(2 * nb * 68));
        prefetch(x.wrapping_add(2 * nb * 68 + 64));
        let d = f32::from_le_bytes([*x, *x.add(1), *x.add(2), *x.add(3)]) * 256.0;
        let mut s = [_mm256_setzero_ps(); 2];
        for c in 0..4 {
            let b = _mm_loadu_si128(x.add(4 + 16 * c) as *const __m128i);
            let h = e4m3_to_f16_bits(_mm256_cvtepu8_epi16(b));
            let w0 = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
            let w1 = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
            let ap = a.add(i * 64 + 16 * c);
            s[0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(ap), s[0]);
            s[1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(ap.add(8)), s[1]);
        }
        acc = _mm256_fmadd_ps(_mm256_add_ps(s[0], s[1]), _mm256_set1_ps(d), acc);
    }
    hsum_ps(acc)
}

/// Writes the eight tile sums: `y[j·y_stride + r] = Σ acc[r][j]`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn store_tile(acc: &[[__m256; 2]; 4], y: *mut f32, y_stride: usize) {
    for (r, row) in acc.iter().enumerate() {
        for (j, v) in row.iter().enumerate() {
            *y.add(j * y_stride + r) = hsum_ps(*v);
        }
    }
}

/// Four MXFP4 rows × two Q8_0 rows (see [`crate::quant::TileFn`]): each weight
/// block is decoded once for both activation rows.
///
/// # Safety
/// AVX2+FMA+F16C CPU; pointers as for [`crate::quant::TileFn`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tile_mxfp4(
    n: usize,
    w: *const u8,
    stride: usize,
    a: *const u8,
    a_stride: usize,
    y: *mut f32,
    y_stride: usize,
) {
    let nb = n / 32;
    let table = e2m1_table();
    let mut acc = [[_mm256_setzero_ps(); 2]; 4];
    for i in 0..nb {
        let ya = [a.add(i * 34), a.add(a_stride + i * 34)];
        let yv =
            [_mm256_loadu_si256(ya[0].add(2) as *const __m256i), _mm256_loadu_si256(ya[1].add(2) as *const __m256i)];
        let dy = [f16_to_f32(rd16(ya[0])), f16_to_f32(rd16(ya[1]))];
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let x = w.add(r * stride + i * 17);
            let dw = e8m0_half(*x);
            let qx = _mm256_shuffle_epi8(table, nibbles(x.add(1)));
            for j in 0..2 {
                let p = dot_i8i8(qx, yv[j]);
                acc_r[j] = _mm256_fmadd_ps(_mm256_set1_ps(dw * dy[j]), _mm256_cvtepi32_ps(p), acc_r[j]);
            }
        }
    }
    store_tile(&acc, y, y_stride);
}

/// Four NVFP4 rows × two Q8_0 rows (see [`crate::quant::TileFn`]).
///
/// # Safety
/// AVX2+FMA+F16C CPU; pointers as for [`crate::quant::TileFn`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tile_nvfp4(
    n: usize,
    w: *const u8,
    stride: usize,
    a: *const u8,
    a_stride: usize,
    y: *mut f32,
    y_stride: usize,
) {
    let nb = n / 64;
    let table = e2m1_table();
    let low = _mm_set1_epi8(0x0F);
    let mut acc = [[_mm256_setzero_ps(); 2]; 4];
    for i in 0..nb {
        for h in 0..2 {
            let ya = [a.add((2 * i + h) * 34), a.add(a_stride + (2 * i + h) * 34)];
            let yv = [
                _mm256_loadu_si256(ya[0].add(2) as *const __m256i),
                _mm256_loadu_si256(ya[1].add(2) as *const __m256i),
            ];
            let dy = [f16_to_f32(rd16(ya[0])), f16_to_f32(rd16(ya[1]))];
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let x = w.add(r * stride + i * 36);
                let (s0, s1) = (ue4m3_half(*x.add(2 * h)), ue4m3_half(*x.add(2 * h + 1)));
                let b = _mm_loadu_si128(x.add(4 + 16 * h) as *const __m128i);
                let lo = _mm_and_si128(b, low);
                let hi = _mm_and_si128(_mm_srli_epi16(b, 4), low);
                let q = _mm256_set_m128i(_mm_unpackhi_epi64(lo, hi), _mm_unpacklo_epi64(lo, hi));
                let qx = _mm256_shuffle_epi8(table, q);
                for j in 0..2 {
                    let d = _mm256_set_m128(_mm_set1_ps(s1 * dy[j]), _mm_set1_ps(s0 * dy[j]));
                    let p = dot_i8i8(qx, yv[j]);
                    acc_r[j] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc_r[j]);
                }
            }
        }
    }
    store_tile(&acc, y, y_stride);
}

/// Four FP8 rows × two f32 activation rows (see [`crate::quant::TileFn`]).
///
/// # Safety
/// AVX2+FMA+F16C CPU; pointers as for [`crate::quant::TileFn`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tile_fp8(
    n: usize,
    w: *const u8,
    stride: usize,
    a: *const u8,
    a_stride: usize,
    y: *mut f32,
    y_stride: usize,
) {
    let nb = n / 64;
    let ap = [a as *const f32, a.add(a_stride) as *const f32];
    let mut acc = [[_mm256_setzero_ps(); 2]; 4];
    for i in 0..nb {
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let x = w.add(r * stride + i * 68);
            let d = _mm256_set1_ps(f32::from_le_bytes([*x, *x.add(1), *x.add(2), *x.add(3)]) * 256.0);
            let mut s = [_mm256_setzero_ps(); 2];
            for c in 0..4 {
                let h = e4m3_to_f16_bits(_mm256_cvtepu8_epi16(_mm_loadu_si128(x.add(4 + 16 * c) as *const __m128i)));
                let w0 = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
                let w1 = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
                for j in 0..2 {
                    let p = ap[j].add(i * 64 + 16 * c);
                    s[j] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(p), s[j]);
                    s[j] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(p.add(8)), s[j]);
                }
            }
            for j in 0..2 {
                acc_r[j] = _mm256_fmadd_ps(s[j], d, acc_r[j]);
            }
        }
    }
    store_tile(&acc, y, y_stride);
}
