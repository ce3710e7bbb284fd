//! AVX2 kernels over the packed four-row layout ([`crate::packed`]): per pair of
//! blocks, the scales of all four rows come in with one vector load and each
//! row's quants for both blocks with another, so the loop is the integer dot
//! and one FMA per row with almost no gathering around it. Same numerics as the
//! row-major kernels (Q8_0 activations). Q4_1 packs in sixteen-row lanes at
//! AVX2 ([`super::avx2_rows16_q5`]).

use super::avx2::dot_u8i8;
use super::avx2_rows::{hsum4, join, pair_lanes, prefetch};
use std::arch::x86_64::*;

/// How far ahead of the current block pair the stream is prefetched, in bytes.
const PREFETCH_AHEAD: usize = 2048;

#[inline(always)]
unsafe fn ld(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

#[inline(always)]
unsafe fn rd16(p: *const u8) -> u32 {
    (p as *const u16).read_unaligned() as u32
}

/// Eight f16 at `p` as f32.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn f16x8(p: *const u8) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
}

/// Activations of blocks `2p`, `2p + 1` regrouped for packed 4-bit quants:
/// `(low halves, high halves)` of both blocks, as `[b | b+1]`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn act_pair(y0: *const u8, y1: *const u8, qs: usize) -> (__m256i, __m256i) {
    (join(y0.add(qs), y1.add(qs)), join(y0.add(qs + 16), y1.add(qs + 16)))
}

/// `Σ` over 4-byte groups of nibble·y for both blocks (lanes 0..4 block b).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn nib_dot(lo: __m256i, hi: __m256i, ylo: __m256i, yhi: __m256i) -> __m256i {
    let p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, ylo), _mm256_maddubs_epi16(hi, yhi));
    _mm256_madd_epi16(p, _mm256_set1_epi16(1))
}

/// Low and high nibbles of 32 packed bytes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn split(q: __m256i) -> (__m256i, __m256i) {
    let low = _mm256_set1_epi8(0x0F);
    (_mm256_and_si256(q, low), _mm256_and_si256(_mm256_srli_epi16(q, 4), low))
}

/// `8·Σy` over 4-byte groups of both activation blocks (the Q4_0 offset term).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn eight_sum(ylo: __m256i, yhi: __m256i) -> __m256i {
    let eight = _mm256_set1_epi8(8);
    nib_dot(eight, eight, ylo, yhi)
}

/// Packed Q4_0 group × one Q8_0 activation row (see [`Dot4Fn`]).
/// A pair is 144 bytes: 8 scales (16 bytes), then 32 quant bytes per row.
///
/// # Safety
/// AVX2+FMA+F16C CPU; `w` a packed group of 4 rows of `n` elements.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot4_q4_0(n: usize, w: *const u8, _stride: usize, a: *const u8, out: *mut f32) {
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut g = w;
    for p in 0..n / 64 {
        let (y0, y1) = (a.add(p * 68), a.add(p * 68 + 34));
        let (ylo, yhi) = act_pair(y0, y1, 2);
        let s8 = eight_sum(ylo, yhi);
        let ys = _mm256_cvtph_ps(_mm_set1_epi32((rd16(y0) | rd16(y1) << 16) as i32));
        let ds = _mm256_mul_ps(f16x8(g), ys);
        prefetch(g.wrapping_add(PREFETCH_AHEAD));
        prefetch(g.wrapping_add(PREFETCH_AHEAD + 64));
        prefetch(g.wrapping_add(PREFETCH_AHEAD + 128));
        for r in 0..4 {
            let (lo, hi) = split(ld(g.add(16 + 32 * r)));
            let d = _mm256_sub_epi32(nib_dot(lo, hi, ylo, yhi), s8);
            acc[r] = _mm256_fmadd_ps(pair_lanes(ds, 2 * r as i32, 1), _mm256_cvtepi32_ps(d), acc[r]);
        }
        g = g.add(144);
    }
    _mm_storeu_ps(out, hsum4(acc));
}

/// Packed Q8_0 group × one Q8_0 activation row (see [`Dot4Fn`]).
/// A pair is 272 bytes: 8 scales (16 bytes), then 64 quant bytes per row.
///
/// # Safety
/// AVX2+FMA+F16C CPU; `w` a packed group of 4 rows of `n` elements.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot4_q8_0(n: usize, w: *const u8, _stride: usize, a: *const u8, out: *mut f32) {
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut g = w;
    for p in 0..n / 64 {
        let (y0, y1) = (a.add(p * 68), a.add(p * 68 + 34));
        let (yv0, yv1) = (ld(y0.add(2)), ld(y1.add(2)));
        let ys = _mm256_cvtph_ps(_mm_set1_epi32((rd16(y0) | rd16(y1) << 16) as i32));
        let ds = _mm256_mul_ps(f16x8(g), ys);
        for k in 0..5 {
            prefetch(g.wrapping_add(PREFETCH_AHEAD + 64 * k));
        }
        for r in 0..4 {
            // Weights may hold −128, so the sign trick keys on the weight side.
            let (q0, q1) = (ld(g.add(16 + 64 * r)), ld(g.add(48 + 64 * r)));
            let d0 = dot_u8i8(_mm256_sign_epi8(q0, q0), _mm256_sign_epi8(yv0, q0));
            let d1 = dot_u8i8(_mm256_sign_epi8(q1, q1), _mm256_sign_epi8(yv1, q1));
            let k = 2 * r as i32;
            acc[r] =
                _mm256_fmadd_ps(_mm256_permutevar8x32_ps(ds, _mm256_set1_epi32(k)), _mm256_cvtepi32_ps(d0), acc[r]);
            acc[r] =
                _mm256_fmadd_ps(_mm256_permutevar8x32_ps(ds, _mm256_set1_epi32(k + 1)), _mm256_cvtepi32_ps(d1), acc[r]);
        }
        g = g.add(272);
    }
    _mm_storeu_ps(out, hsum4(acc));
}

/// Packed Q4_0 group × two Q8_0 activation rows (see [`TileFn`]): each row's
/// quants are unpacked once for both activation rows.
///
/// # Safety
/// AVX2+FMA+F16C CPU; `w` a packed group of 4 rows of `n` elements.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tile_q4_0(
    n: usize,
    w: *const u8,
    _stride: usize,
    a: *const u8,
    a_stride: usize,
    y: *mut f32,
    y_stride: usize,
) {
    let av = [a, a.add(a_stride)];
    let mut acc = [[_mm256_setzero_ps(); 2]; 4];
    let mut g = w;
    for p in 0..n / 64 {
        let xd = f16x8(g);
        let mut yq = [(_mm256_setzero_si256(), _mm256_setzero_si256()); 2];
        let mut s8 = [_mm256_setzero_si256(); 2];
        let mut ds = [_mm256_setzero_ps(); 2];
        for j in 0..2 {
            let (y0, y1) = (av[j].add(p * 68), av[j].add(p * 68 + 34));
            yq[j] = act_pair(y0, y1, 2);
            s8[j] = eight_sum(yq[j].0, yq[j].1);
            ds[j] = _mm256_mul_ps(xd, _mm256_cvtph_ps(_mm_set1_epi32((rd16(y0) | rd16(y1) << 16) as i32)));
        }
        for r in 0..4 {
            let (lo, hi) = split(ld(g.add(16 + 32 * r)));
            for j in 0..2 {
                let d = _mm256_sub_epi32(nib_dot(lo, hi, yq[j].0, yq[j].1), s8[j]);
                acc[r][j] = _mm256_fmadd_ps(pair_lanes(ds[j], 2 * r as i32, 1), _mm256_cvtepi32_ps(d), acc[r][j]);
            }
        }
        g = g.add(144);
    }
    for j in 0..2 {
        _mm_storeu_ps(y.add(j * y_stride), hsum4([acc[0][j], acc[1][j], acc[2][j], acc[3][j]]));
    }
}
