//! AVX2 four-row kernels: one activation row against four consecutive weight
//! rows. The activation block is loaded (and its scale converted) once for all
//! four rows, the four row sums are reduced together, and the caller pays one
//! indirect call per four outputs. This is the batch-1 decode path.

use super::avx2::{dot_u8i8, nibbles, rd16};
use crate::quant::Dot4Fn;
use crate::DType;
use std::arch::x86_64::*;

/// The AVX2 four-row dot for `dtype`, if there is one.
pub fn dot4_fn(dtype: DType) -> Option<Dot4Fn> {
    match dtype {
        DType::Q4_0 => Some(dot4_q4_0),
        DType::Q4_1 => Some(dot4_q4_1),
        DType::Q8_0 => Some(dot4_q8_0),
        _ => None,
    }
}

#[inline(always)]
unsafe fn ld(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

#[inline(always)]
unsafe fn rd32(p: *const u8) -> i32 {
    (p as *const i32).read_unaligned()
}

/// Horizontal sums of four vectors → `[Σa, Σb, Σc, Σd]`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn hsum4(acc: [__m256; 4]) -> __m128 {
    let t = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
    _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1))
}

/// Lane `r` of `v` broadcast to 8 lanes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn lane(v: __m256, r: i32) -> __m256 {
    _mm256_permutevar8x32_ps(v, _mm256_set1_epi32(r))
}

/// Four Q4_1 rows × one Q8_1 row (see [`Dot4Fn`]).
///
/// # Safety
/// AVX2+FMA+F16C CPU; pointers as for [`Dot4Fn`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot4_q4_1(n: usize, w: *const u8, stride: usize, a: *const u8, out: *mut f32) {
    let nb = n / 32;
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut accm = _mm256_setzero_ps();
    let x = [w, w.add(stride), w.add(2 * stride), w.add(3 * stride)];
    for b in 0..nb {
        let y = a.add(b * 36);
        let yv = ld(y.add(4));
        let xo = b * 20;
        // [d0, m0, d1, m1, d2, m2, d3, m3] · [dy, sy, dy, sy, ...]
        let xs = _mm256_cvtph_ps(_mm_setr_epi32(
            rd32(x[0].add(xo)),
            rd32(x[1].add(xo)),
            rd32(x[2].add(xo)),
            rd32(x[3].add(xo)),
        ));
        let prod = _mm256_mul_ps(xs, _mm256_cvtph_ps(_mm_set1_epi32(rd32(y))));
        accm = _mm256_add_ps(accm, prod);
        for r in 0..4 {
            let p = dot_u8i8(nibbles(x[r].add(xo + 4)), yv);
            acc[r] = _mm256_fmadd_ps(lane(prod, 2 * r as i32), _mm256_cvtepi32_ps(p), acc[r]);
        }
    }
    let m = _mm256_castps256_ps128(_mm256_permutevar8x32_ps(accm, _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7)));
    _mm_storeu_ps(out, _mm_add_ps(hsum4(acc), m));
}

/// Four Q4_0 rows × one Q8_0 row.
///
/// # Safety
/// AVX2+FMA+F16C CPU; pointers as for [`Dot4Fn`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot4_q4_0(n: usize, w: *const u8, stride: usize, a: *const u8, out: *mut f32) {
    let nb = n / 32;
    let mut acc = [_mm256_setzero_ps(); 4];
    let x = [w, w.add(stride), w.add(2 * stride), w.add(3 * stride)];
    let off = _mm256_set1_epi8(8);
    for b in 0..nb {
        let y = a.add(b * 34);
        let yv = ld(y.add(2));
        let ya = _mm256_sign_epi8(yv, yv);
        let xo = b * 18;
        let xs = _mm_cvtph_ps(_mm_setr_epi16(
            rd16(x[0].add(xo)) as i16,
            rd16(x[1].add(xo)) as i16,
            rd16(x[2].add(xo)) as i16,
            rd16(x[3].add(xo)) as i16,
            0,
            0,
            0,
            0,
        ));
        let ds = _mm256_castps128_ps256(_mm_mul_ps(xs, _mm_cvtph_ps(_mm_set1_epi16(rd16(y) as i16))));
        for r in 0..4 {
            let q = _mm256_sub_epi8(nibbles(x[r].add(xo + 2)), off);
            let p = dot_u8i8(ya, _mm256_sign_epi8(q, yv));
            acc[r] = _mm256_fmadd_ps(lane(ds, r as i32), _mm256_cvtepi32_ps(p), acc[r]);
        }
    }
    _mm_storeu_ps(out, hsum4(acc));
}

/// Four Q8_0 rows × one Q8_0 row.
///
/// # Safety
/// AVX2+FMA+F16C CPU; pointers as for [`Dot4Fn`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot4_q8_0(n: usize, w: *const u8, stride: usize, a: *const u8, out: *mut f32) {
    let nb = n / 32;
    let mut acc = [_mm256_setzero_ps(); 4];
    let x = [w, w.add(stride), w.add(2 * stride), w.add(3 * stride)];
    for b in 0..nb {
        let y = a.add(b * 34);
        let yv = ld(y.add(2));
        let xo = b * 34;
        let xs = _mm_cvtph_ps(_mm_setr_epi16(
            rd16(x[0].add(xo)) as i16,
            rd16(x[1].add(xo)) as i16,
            rd16(x[2].add(xo)) as i16,
            rd16(x[3].add(xo)) as i16,
            0,
            0,
            0,
            0,
        ));
        let ds = _mm256_castps128_ps256(_mm_mul_ps(xs, _mm_cvtph_ps(_mm_set1_epi16(rd16(y) as i16))));
        for r in 0..4 {
            // Weights may hold −128, so the sign trick keys on the weight side.
            let q = ld(x[r].add(xo + 2));
            let p = dot_u8i8(_mm256_sign_epi8(q, q), _mm256_sign_epi8(yv, q));
            acc[r] = _mm256_fmadd_ps(lane(ds, r as i32), _mm256_cvtepi32_ps(p), acc[r]);
        }
    }
    _mm_storeu_ps(out, hsum4(acc));
}
