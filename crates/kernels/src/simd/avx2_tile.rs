//! AVX2 tile kernels for `m > 1` (prefill): four weight rows × two activation
//! rows. Each weight block pair is loaded and unpacked once for both activation
//! rows, and each activation pair is regrouped once for all four weight rows.

use super::avx2::{dot_u8i8, nibbles};
use super::avx2_rows::hsum4;
use std::arch::x86_64::*;

/// Weight rows per tile.
pub const TILE_ROWS: usize = 4;
/// Activation rows per tile.
pub const TILE_ACTS: usize = 2;

#[inline(always)]
unsafe fn rd32(p: *const u8) -> i32 {
    (p as *const i32).read_unaligned()
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn join(a: *const u8, b: *const u8) -> __m256i {
    let lo = _mm_loadu_si128(a as *const __m128i);
    _mm256_inserti128_si256(_mm256_castsi128_si256(lo), _mm_loadu_si128(b as *const __m128i), 1)
}

/// `[d, m]` of blocks `o0`, `o1` of rows `p` and `q` as 8 floats
/// (`[d_p0, m_p0, d_p1, m_p1, d_q0, m_q0, d_q1, m_q1]`).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dm4(p: *const u8, q: *const u8, o0: usize, o1: usize) -> __m256 {
    _mm256_cvtph_ps(_mm_setr_epi32(rd32(p.add(o0)), rd32(p.add(o1)), rd32(q.add(o0)), rd32(q.add(o1))))
}

/// Lanes 1, 3 (first row) and 5, 7 (second row) summed: `[m_p, m_q]` in lanes 0, 1.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn m_terms(v: __m256) -> __m128 {
    let t = _mm256_castps256_ps128(_mm256_permutevar8x32_ps(v, _mm256_setr_epi32(1, 5, 3, 7, 0, 0, 0, 0)));
    _mm_add_ps(t, _mm_movehl_ps(t, t))
}

/// Q4_1 weights × Q8_1 activations, 4 × 2 tile (see [`TileFn`]).
///
/// # Safety
/// AVX2+FMA+F16C CPU; pointers as for [`TileFn`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tile_q4_1(
    n: usize,
    w: *const u8,
    stride: usize,
    a: *const u8,
    a_stride: usize,
    y: *mut f32,
    y_stride: usize,
) {
    let nb = n / 32;
    let low = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let x = [w, w.add(stride), w.add(2 * stride), w.add(3 * stride)];
    let av = [a, a.add(a_stride)];
    let mut acc = [[_mm256_setzero_ps(); 2]; 4];
    let mut accm = [[_mm256_setzero_ps(); 2]; 2];
    let mut b = 0;
    while b + 2 <= nb {
        let (o0, o1) = (b * 20, b * 20 + 20);
        let xa = dm4(x[0], x[1], o0, o1);
        let xb = dm4(x[2], x[3], o0, o1);
        let mut ylo = [_mm256_setzero_si256(); 2];
        let mut yhi = [_mm256_setzero_si256(); 2];
        let mut ps = [[_mm256_setzero_ps(); 2]; 2];
        for j in 0..2 {
            let (y0, y1) = (av[j].add(b * 36), av[j].add(b * 36 + 36));
            ylo[j] = join(y0.add(4), y1.add(4));
            yhi[j] = join(y0.add(20), y1.add(20));
            let ys = _mm256_cvtph_ps(_mm_set1_epi64x((rd32(y0) as u32 as i64) | ((rd32(y1) as i64) << 32)));
            ps[j] = [_mm256_mul_ps(xa, ys), _mm256_mul_ps(xb, ys)];
            accm[j][0] = _mm256_add_ps(accm[j][0], ps[j][0]);
            accm[j][1] = _mm256_add_ps(accm[j][1], ps[j][1]);
        }
        for r in 0..4 {
            let q = join(x[r].add(o0 + 4), x[r].add(o1 + 4));
            let lo = _mm256_and_si256(q, low);
            let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
            let k = 4 * (r as i32 & 1);
            let idx = _mm256_setr_epi32(k, k, k, k, k + 2, k + 2, k + 2, k + 2);
            for j in 0..2 {
                let s = _mm256_add_epi16(_mm256_maddubs_epi16(lo, ylo[j]), _mm256_maddubs_epi16(hi, yhi[j]));
                let p = _mm256_madd_epi16(s, ones);
                let d = _mm256_permutevar8x32_ps(ps[j][r >> 1], idx);
                acc[r][j] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[r][j]);
            }
        }
        b += 2;
    }
    let mut m = [_mm_setzero_ps(); 2];
    for j in 0..2 {
        m[j] = _mm_movelh_ps(m_terms(accm[j][0]), m_terms(accm[j][1]));
    }
    if b < nb {
        // Odd tail: one block.
        let xo = b * 20;
        let xs = _mm256_cvtph_ps(_mm_setr_epi32(
            rd32(x[0].add(xo)),
            rd32(x[1].add(xo)),
            rd32(x[2].add(xo)),
            rd32(x[3].add(xo)),
        ));
        let q = [
            nibbles(x[0].add(xo + 4)),
            nibbles(x[1].add(xo + 4)),
            nibbles(x[2].add(xo + 4)),
            nibbles(x[3].add(xo + 4)),
        ];
        for j in 0..2 {
            let yb = av[j].add(b * 36);
            let yv = _mm256_loadu_si256(yb.add(4) as *const __m256i);
            let prod = _mm256_mul_ps(xs, _mm256_cvtph_ps(_mm_set1_epi32(rd32(yb))));
            for r in 0..4 {
                let d = _mm256_permutevar8x32_ps(prod, _mm256_set1_epi32(2 * r as i32));
                acc[r][j] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_u8i8(q[r], yv)), acc[r][j]);
            }
            let ms = _mm256_permutevar8x32_ps(prod, _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7));
            m[j] = _mm_add_ps(m[j], _mm256_castps256_ps128(ms));
        }
    }
    for j in 0..2 {
        let s = hsum4([acc[0][j], acc[1][j], acc[2][j], acc[3][j]]);
        _mm_storeu_ps(y.add(j * y_stride), _mm_add_ps(s, m[j]));
    }
}

/// `[d]` of blocks `o0`, `o1` of the four rows as 8 floats (lane `2r + k`).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn d8(x: &[*const u8; 4], o0: usize, o1: usize) -> __m256 {
    let h = |p: *const u8| (p as *const i16).read_unaligned();
    _mm256_cvtph_ps(_mm_setr_epi16(
        h(x[0].add(o0)),
        h(x[0].add(o1)),
        h(x[1].add(o0)),
        h(x[1].add(o1)),
        h(x[2].add(o0)),
        h(x[2].add(o1)),
        h(x[3].add(o0)),
        h(x[3].add(o1)),
    ))
}

/// Q4_0 weights × Q8_0 activations, 4 × 2 tile (see [`TileFn`]); the −8 offset
/// enters as `−8·Σy` per activation block.
///
/// # Safety
/// AVX2+FMA+F16C CPU; pointers as for [`TileFn`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tile_q4_0(
    n: usize,
    w: *const u8,
    stride: usize,
    a: *const u8,
    a_stride: usize,
    y: *mut f32,
    y_stride: usize,
) {
    let nb = n / 32;
    let low = _mm256_set1_epi8(0x0F);
    let eight = _mm256_set1_epi8(8);
    let ones = _mm256_set1_epi16(1);
    let x = [w, w.add(stride), w.add(2 * stride), w.add(3 * stride)];
    let av = [a, a.add(a_stride)];
    let mut acc = [[_mm256_setzero_ps(); 2]; 4];
    let mut b = 0;
    while b + 2 <= nb {
        let (o0, o1) = (b * 18, b * 18 + 18);
        let xd = d8(&x, o0, o1);
        let mut ylo = [_mm256_setzero_si256(); 2];
        let mut yhi = [_mm256_setzero_si256(); 2];
        let mut s8 = [_mm256_setzero_si256(); 2];
        let mut ds = [_mm256_setzero_ps(); 2];
        for j in 0..2 {
            let (y0, y1) = (av[j].add(b * 34), av[j].add(b * 34 + 34));
            ylo[j] = join(y0.add(2), y1.add(2));
            yhi[j] = join(y0.add(18), y1.add(18));
            let sy = _mm256_add_epi16(_mm256_maddubs_epi16(eight, ylo[j]), _mm256_maddubs_epi16(eight, yhi[j]));
            s8[j] = _mm256_madd_epi16(sy, ones);
            let h = |p: *const u8| (p as *const u16).read_unaligned() as u32;
            let ys = _mm256_cvtph_ps(_mm_set1_epi32((h(y0) | h(y1) << 16) as i32));
            ds[j] = _mm256_mul_ps(xd, ys);
        }
        for r in 0..4 {
            let q = join(x[r].add(o0 + 2), x[r].add(o1 + 2));
            let lo = _mm256_and_si256(q, low);
            let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
            let k = 2 * r as i32;
            let idx = _mm256_setr_epi32(k, k, k, k, k + 1, k + 1, k + 1, k + 1);
            for j in 0..2 {
                let s = _mm256_add_epi16(_mm256_maddubs_epi16(lo, ylo[j]), _mm256_maddubs_epi16(hi, yhi[j]));
                let p = _mm256_sub_epi32(_mm256_madd_epi16(s, ones), s8[j]);
                let d = _mm256_permutevar8x32_ps(ds[j], idx);
                acc[r][j] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[r][j]);
            }
        }
        b += 2;
    }
    if b < nb {
        // Odd tail: one block, sign trick on (q − 8).
        let xo = b * 18;
        let xd = d8(&x, xo, xo);
        let q = [
            nibbles(x[0].add(xo + 2)),
            nibbles(x[1].add(xo + 2)),
            nibbles(x[2].add(xo + 2)),
            nibbles(x[3].add(xo + 2)),
        ];
        for j in 0..2 {
            let yb = av[j].add(b * 34);
            let yv = _mm256_loadu_si256(yb.add(2) as *const __m256i);
            let ya = _mm256_sign_epi8(yv, yv);
            let ys = _mm256_cvtph_ps(_mm_set1_epi16((yb as *const i16).read_unaligned()));
            let ds = _mm256_mul_ps(xd, ys);
            for r in 0..4 {
                let qs = _mm256_sub_epi8(q[r], eight);
                let p = dot_u8i8(ya, _mm256_sign_epi8(qs, yv));
                let d = _mm256_permutevar8x32_ps(ds, _mm256_set1_epi32(2 * r as i32));
                acc[r][j] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[r][j]);
            }
        }
    }
    for j in 0..2 {
        _mm_storeu_ps(y.add(j * y_stride), hsum4([acc[0][j], acc[1][j], acc[2][j], acc[3][j]]));
    }
}
