//! AVX-512 (F/BW/VL/VNNI) dots for the low-bit float formats. Same numerics as
//! [`super::avx2_fp`]: doubled E2M1 codes against Q8_0 activations for MXFP4
//! and NVFP4, exact E4M3 → f16 bit moves for FP8 against f32 activations.
//!
//! VNNI's `dpbusd` multiplies unsigned by signed bytes, so the FP4 codes are
//! looked up as magnitudes (0..12) and their signs moved onto the activations
//! (`y` negated where the code's sign bit is set; Q8_0 never holds −128, so the
//! negation cannot overflow).

use super::avx2::rd16;
use super::avx2_rows::prefetch;
use crate::quant::minifloat::{e8m0_half, ue4m3_half};
use std::arch::x86_64::*;

/// |2·E2M1| by code: the sign (bit 3) is applied to the activations instead.
const E2M1_X2_ABS: [u8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, 1, 2, 3, 4, 6, 8, 12];

#[inline(always)]
fn f16_to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// Σ of 4-byte groups of `|code value| · ±y` for 32 codes (`q`, one per byte) and 32 activations.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn fp4_dot256(q: __m256i, y: __m256i) -> __m256i {
    let t = _mm_loadu_si128(E2M1_X2_ABS.as_ptr() as *const __m128i);
    let mag = _mm256_shuffle_epi8(_mm256_set_m128i(t, t), q);
    let neg = _mm256_test_epi8_mask(q, _mm256_set1_epi8(8));
    let ys = _mm256_mask_sub_epi8(y, neg, _mm256_setzero_si256(), y);
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), mag, ys)
}

/// As [`fp4_dot256`] for 64 codes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn fp4_dot512(q: __m512i, y: __m512i) -> __m512i {
    let t = _mm512_broadcast_i32x4(_mm_loadu_si128(E2M1_X2_ABS.as_ptr() as *const __m128i));
    let mag = _mm512_shuffle_epi8(t, q);
    let neg = _mm512_test_epi8_mask(q, _mm512_set1_epi8(8));
    let ys = _mm512_mask_sub_epi8(y, neg, _mm512_setzero_si512(), y);
    _mm512_dpbusd_epi32(_mm512_setzero_si512(), mag, ys)
}

/// MXFP4 × Q8_0 (256-bit VNNI, one block per step).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI CPU; pointers as for [`DotFn`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_mxfp4(n: usize, w: *const u8, a: *const u8) -> f32 {
    let nb = n / 32;
    let low = _mm_set1_epi8(0x0F);
    let mut acc = [_mm256_setzero_ps(); 2];
    for i in 0..nb {
        let (x, y) = (w.add(i * 17), a.add(i * 34));
        prefetch(x.wrapping_add(2 * nb * 17));
        let d = _mm256_set1_ps(e8m0_half(*x) * f16_to_f32(rd16(y)));
        let b = _mm_loadu_si128(x.add(1) as *const __m128i);
        let q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), low), _mm_and_si128(b, low));
        let p = fp4_dot256(q, _mm256_loadu_si256(y.add(2) as *const __m256i));
        acc[i & 1] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[i & 1]);
    }
    super::avx2::hsum_ps(_mm256_add_ps(acc[0], acc[1]))
}

/// NVFP4 × Q8_0: a whole 64-value block per step, one 128-bit lane per sub-block.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI CPU; pointers as for [`DotFn`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_nvfp4(n: usize, w: *const u8, a: *const u8) -> f32 {
    let nb = n / 64;
    let low = _mm256_set1_epi8(0x0F);
    // Lane l of the result takes scale l.
    let spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    let mut acc = [_mm512_setzero_ps(); 2];
    for i in 0..nb {
        let x = w.add(i * 36);
        prefetch(x.wrapping_add(2 * nb * 36));
        let (y0, y1) = (a.add(2 * i * 34), a.add((2 * i + 1) * 34));
        let (dy0, dy1) = (f16_to_f32(rd16(y0)), f16_to_f32(rd16(y1)));
        let s = _mm_setr_ps(
            ue4m3_half(*x) * dy0,
            ue4m3_half(*x.add(1)) * dy0,
            ue4m3_half(*x.add(2)) * dy1,
            ue4m3_half(*x.add(3)) * dy1,
        );
        let d = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(s));
        let b = _mm256_loadu_si256(x.add(4) as *const __m256i);
        let lo = _mm256_and_si256(b, low);
        let hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), low);
        // Per 128-bit lane: unpacklo = [sub-block 0 | 2], unpackhi = [1 | 3], each [lo 0..8, hi 0..8].
        let raw =
            _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_unpacklo_epi64(lo, hi)), _mm256_unpackhi_epi64(lo, hi), 1);
        // [sb0, sb2, sb1, sb3] → [sb0, sb1, sb2, sb3].
        let q = _mm512_shuffle_i64x2(raw, raw, 0b11_01_10_00);
        let y = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256(y0.add(2) as *const __m256i)),
            _mm256_loadu_si256(y1.add(2) as *const __m256i),
            1,
        );
        let p = fp4_dot512(q, y);
        acc[i & 1] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p), acc[i & 1]);
    }
    _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]))
}

/// 32 E4M3 bytes → 32 f16 values `E4M3(b)·2⁻⁸` (exact). Sign-extending the
/// byte to 16 bits and shifting left by 7 puts the magnitude in bits 7..13 and
/// the sign in bits 14 and 15; clearing bit 14 leaves `sign<<15 | (b&0x7F)<<7`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn e4m3_to_f16x32(p: *const u8) -> __m512i {
    let v = _mm512_cvtepi8_epi16(_mm256_loadu_si256(p as *const __m256i));
    _mm512_and_si512(_mm512_slli_epi16(v, 7), _mm512_set1_epi16(!0x4000))
}

/// Σ over one 64-value FP8 block of `E4M3(q)·2⁻⁸ · a` (block at `x`, values at `x + 4`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn fp8_block(x: *const u8, a: *const f32) -> __m512 {
    let mut s = [_mm512_setzero_ps(); 2];
    for c in 0..2 {
        let h = e4m3_to_f16x32(x.add(4 + 32 * c));
        let w0 = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
        let w1 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
        let ap = a.add(32 * c);
        s[0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(ap), s[0]);
        s[1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(ap.add(16)), s[1]);
    }
    _mm512_add_ps(s[0], s[1])
}

/// The block's f32 scale times 2⁸ (undoing the f16 bias of [`e4m3_to_f16x32`]).
#[inline(always)]
unsafe fn fp8_scale(x: *const u8) -> f32 {
    f32::from_le_bytes([*x, *x.add(1), *x.add(2), *x.add(3)]) * 256.0
}

/// FP8 (64-value blocks) × f32 activations.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI CPU; pointers as for [`DotFn`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_fp8(n: usize, w: *const u8, a: *const u8) -> f32 {
    let nb = n / 64;
    let a = a as *const f32;
    let mut acc = _mm512_setzero_ps();
    for i in 0..nb {
        let x = w.add(i * 68);
        prefetch(x.wrapping_add(2 * nb * 68));
        prefetch(x.wrapping_add(2 * nb * 68 + 64));
        acc = _mm512_fmadd_ps(fp8_block(x, a.add(i * 64)), _mm512_set1_ps(fp8_scale(x)), acc);
    }
    _mm512_reduce_add_ps(acc)
}

/// Four FP8 rows × one f32 activation row (see [`crate::quant::Dot4Fn`]): each
/// activation vector is loaded once for the four rows (cache-resident, but the
/// loads were half of the one-row kernel's instructions).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI CPU; pointers as for [`crate::quant::Dot4Fn`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot4_fp8(n: usize, w: *const u8, stride: usize, a: *const u8, out: *mut f32) {
    let nb = n / 64;
    let a = a as *const f32;
    let mut acc = [_mm512_setzero_ps(); 4];
    for i in 0..nb {
        let ap = a.add(i * 64);
        let av = [
            _mm512_loadu_ps(ap),
            _mm512_loadu_ps(ap.add(16)),
            _mm512_loadu_ps(ap.add(32)),
            _mm512_loadu_ps(ap.add(48)),
        ];
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let x = w.add(r * stride + i * 68);
            prefetch(x.wrapping_add(super::avx2_rows::PREFETCH_ROWS * stride));
            prefetch(x.wrapping_add(super::avx2_rows::PREFETCH_ROWS * stride + 64));
            let mut s = [_mm512_setzero_ps(); 2];
            for c in 0..2 {
                let h = e4m3_to_f16x32(x.add(4 + 32 * c));
                s[0] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(h)), av[2 * c], s[0]);
                s[1] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)), av[2 * c + 1], s[1]);
            }
            *acc_r = _mm512_fmadd_ps(_mm512_add_ps(s[0], s[1]), _mm512_set1_ps(fp8_scale(x)), *acc_r);
        }
    }
    for (r, v) in acc.iter().enumerate() {
        *out.add(r) = _mm512_reduce_add_ps(*v);
    }
}
