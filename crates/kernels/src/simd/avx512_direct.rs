//! AVX-512 decode steps of [`crate::attention`] that read the cache in place (f16;
//! Q8_0 values in [`pv_q8_0`]):
//! each key or value row is widened in registers (`vcvtph2ps`) right before its
//! FMAs, instead of first being written to an f32 scratch block and read back.
//!
//! In decode a tile has only a GQA group's few query rows per KV head, so the
//! widened block would serve 1–4 rows: the widen's stores and reloads cost as
//! much as the arithmetic. Here a key's 16-value chunk is converted once and used
//! by up to three query rows; a value's by up to four.
//!
//! Shapes: `q` is `rows × d` f32, cache row `j` is at `k + j·stride` (`stride`
//! in f16 values, `d` of them used), `s` is `rows × s_stride`, `p` likewise,
//! `o` is `rows × d`. All functions need `d % 16 == 0`, and never read a cache
//! row at or past `n`.

use std::arch::x86_64::*;

/// Keys per score step (one accumulator per key and row).
const J: usize = 8;

/// Sums each of the eight accumulators' lanes: lane `j` of the result is
/// `Σ a[j]` (pairs of registers, then pairs of 64-bit halves, then 128-bit lanes).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn reduce8(a: &[__m512; J]) -> __m256 {
    // Per 128-bit lane: (a[2i], a[2i+1], a[2i], a[2i+1]) partial sums.
    let mut b = [_mm512_setzero_ps(); 4];
    for i in 0..4 {
        let (x, y) = (a[2 * i], a[2 * i + 1]);
        b[i] = _mm512_add_ps(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y));
    }
    // Per 128-bit lane: (a[4i], a[4i+1], a[4i+2], a[4i+3]) partial sums.
    let mut c = [_mm512_setzero_ps(); 2];
    for i in 0..2 {
        let (x, y) = (_mm512_castps_pd(b[2 * i]), _mm512_castps_pd(b[2 * i + 1]));
        c[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    // 128-bit lanes: keys 0–3 (lanes 0+1), keys 0–3 (2+3), keys 4–7 (0+1), keys 4–7 (2+3).
    let (x, y) = (c[0], c[1]);
    let e = _mm512_add_ps(_mm512_shuffle_f32x4::<0b10_00_10_00>(x, y), _mm512_shuffle_f32x4::<0b11_01_11_01>(x, y));
    // Low 256 bits: keys 0–3, keys 4–7.
    let f = _mm512_add_ps(_mm512_shuffle_f32x4::<0b00_00_10_00>(e, e), _mm512_shuffle_f32x4::<0b00_00_11_01>(e, e));
    _mm512_castps512_ps256(f)
}

/// Scores of `NR` rows against keys `j0 .. j0 + 8` (rows past `n` read row
/// `n − 1` again; their scores are not stored).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn scores_block<const NR: usize>(
    q: *const f32,
    k: *const u16,
    stride: usize,
    j0: usize,
    n: usize,
    d: usize,
    s: *mut f32,
    s_stride: usize,
) {
    let mut kp = [k; J];
    for (j, p) in kp.iter_mut().enumerate() {
        *p = k.add((j0 + j).min(n - 1) * stride);
    }
    let mut acc = [[_mm512_setzero_ps(); J]; NR];
    let mut c = 0;
    while c < d {
        for (j, &kj) in kp.iter().enumerate() {
            let kv = _mm512_cvtph_ps(_mm256_loadu_si256(kj.add(c) as *const __m256i));
            for r in 0..NR {
                acc[r][j] = _mm512_fmadd_ps(kv, _mm512_loadu_ps(q.add(r * d + c)), acc[r][j]);
            }
        }
        c += 16;
    }
    let mask: __mmask8 = if n - j0 >= J { 0xff } else { ((1u32 << (n - j0)) - 1) as __mmask8 };
    for r in 0..NR {
        _mm256_mask_storeu_ps(s.add(r * s_stride + j0), mask, reduce8(&acc[r]));
    }
}

/// `s[r·s_stride + j] = q[r] · k[j]` for `rows` rows and `n` keys (`n ≥ 1`):
/// three rows at a time, eight keys per step, each key chunk widened once.
///
/// # Safety
/// AVX-512 F CPU; `d % 16 == 0`; `n ≥ 1`; `q` valid for `rows·d` reads, key
/// rows `0..n` for `d` reads each, `s` for `rows·s_stride` writes, `n ≤ s_stride`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn scores_f16(
    q: *const f32,
    rows: usize,
    k: *const u16,
    stride: usize,
    n: usize,
    d: usize,
    s: *mut f32,
    s_stride: usize,
) {
    let mut r = 0;
    while r < rows {
        let (qr, sr) = (q.add(r * d), s.add(r * s_stride));
        let mut j0 = 0;
        while j0 < n {
            match rows - r {
                1 => scores_block::<1>(qr, k, stride, j0, n, d, sr, s_stride),
                2 => scores_block::<2>(qr, k, stride, j0, n, d, sr, s_stride),
                _ => scores_block::<3>(qr, k, stride, j0, n, d, sr, s_stride),
            }
            j0 += J;
        }
        r += 3;
    }
}

/// `o[r][c..c+16·NV] += Σ_j p[r][j] · v[j][c..c+16·NV]` for `NR` rows, one FMA
/// per output value and key in key order (as [`super::avx512_attn::pv`], so
/// both give the same bits).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn pv_block<const NR: usize, const NV: usize>(
    p: *const f32,
    p_stride: usize,
    v: *const u16,
    stride: usize,
    n: usize,
    d: usize,
    o: *mut f32,
    c: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); NV]; NR];
    for r in 0..NR {
        for x in 0..NV {
            acc[r][x] = _mm512_loadu_ps(o.add(r * d + c + 16 * x));
        }
    }
    for j in 0..n {
        let vj = v.add(j * stride + c);
        let mut vv = [_mm512_setzero_ps(); NV];
        for (x, w) in vv.iter_mut().enumerate() {
            *w = _mm512_cvtph_ps(_mm256_loadu_si256(vj.add(16 * x) as *const __m256i));
        }
        for r in 0..NR {
            let pr = _mm512_set1_ps(*p.add(r * p_stride + j));
            for x in 0..NV {
                acc[r][x] = _mm512_fmadd_ps(pr, vv[x], acc[r][x]);
            }
        }
    }
    for r in 0..NR {
        for x in 0..NV {
            _mm512_storeu_ps(o.add(r * d + c + 16 * x), acc[r][x]);
        }
    }
}

/// `NR` rows of `o += p · v` over all of `d`: 64-column chunks, then 16-column ones.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn pv_rows<const NR: usize>(
    p: *const f32,
    p_stride: usize,
    v: *const u16,
    stride: usize,
    n: usize,
    d: usize,
    o: *mut f32,
) {
    let mut c = 0;
    while c + 64 <= d {
        pv_block::<NR, 4>(p, p_stride, v, stride, n, d, o, c);
        c += 64;
    }
    while c < d {
        pv_block::<NR, 1>(p, p_stride, v, stride, n, d, o, c);
        c += 16;
    }
}

/// `o[r] += Σ_j p[r·p_stride + j] · v[j]` for `rows` rows and `n` value rows.
///
/// # Safety
/// AVX-512 F CPU; `d % 16 == 0`; `p` valid for `rows·p_stride` reads with
/// `n ≤ p_stride`, value rows `0..n` for `d` reads each, `o` for `rows·d`
/// reads and writes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn pv_f16(
    p: *const f32,
    p_stride: usize,
    rows: usize,
    v: *const u16,
    stride: usize,
    n: usize,
    d: usize,
    o: *mut f32,
) {
    super::by_row_runs!(pv_rows, rows, d, p, p_stride, (v, stride, n, d), o)
}

/// `NR` rows of `o += p · v` over one 64- (`NB = 2`) or 32-value (`NB = 1`)
/// chunk at column `c` of a Q8_0 cache: value row `j`'s blocks start at byte
/// `v + j·stride_bytes`, 34 bytes each (f16 scale, 32 int8 codes). Each block
/// is dequantized in registers as `q · scale` (the product [`crate::kv_quant`]'s
/// widen computes) and used by all `NR` rows, so the sums are bit-identical to
/// widening the block and running the f32 P·V.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn pv_q8_0_block<const NR: usize, const NB: usize>(
    p: *const f32,
    p_stride: usize,
    v: *const u8,
    stride_bytes: usize,
    n: usize,
    d: usize,
    o: *mut f32,
    c: usize,
) {
    let mut acc = [[[_mm512_setzero_ps(); 2]; NB]; NR];
    for r in 0..NR {
        for b in 0..NB {
            for h in 0..2 {
                acc[r][b][h] = _mm512_loadu_ps(o.add(r * d + c + 32 * b + 16 * h));
            }
        }
    }
    for j in 0..n {
        let row = v.add(j * stride_bytes + c / 32 * 34);
        let mut vv = [[_mm512_setzero_ps(); 2]; NB];
        for (b, w) in vv.iter_mut().enumerate() {
            let blk = row.add(34 * b);
            let scale = _mm512_cvtph_ps(_mm256_set1_epi16(std::ptr::read_unaligned(blk as *const i16)));
            for (h, x) in w.iter_mut().enumerate() {
                let q = _mm_loadu_si128(blk.add(2 + 16 * h) as *const __m128i);
                *x = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), scale);
            }
        }
        for r in 0..NR {
            let pr = _mm512_set1_ps(*p.add(r * p_stride + j));
            for b in 0..NB {
                for h in 0..2 {
                    acc[r][b][h] = _mm512_fmadd_ps(pr, vv[b][h], acc[r][b][h]);
                }
            }
        }
    }
    for r in 0..NR {
        for b in 0..NB {
            for h in 0..2 {
                _mm512_storeu_ps(o.add(r * d + c + 32 * b + 16 * h), acc[r][b][h]);
            }
        }
    }
}

/// `NR` rows of the Q8_0 P·V over all of `d`: 64-value chunks, then a 32-value one.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn pv_q8_0_rows<const NR: usize>(
    p: *const f32,
    p_stride: usize,
    v: *const u8,
    stride_bytes: usize,
    n: usize,
    d: usize,
    o: *mut f32,
) {
    let mut c = 0;
    while c + 64 <= d {
        pv_q8_0_block::<NR, 2>(p, p_stride, v, stride_bytes, n, d, o, c);
        c += 64;
    }
    if c < d {
        pv_q8_0_block::<NR, 1>(p, p_stride, v, stride_bytes, n, d, o, c);
    }
}

/// `o[r] += Σ_j p[r·p_stride + j] · v[j]` for `rows` rows and `n` value rows
/// of a Q8_0 cache (`stride_bytes` between rows, `d / 32` blocks used).
///
/// # Safety
/// AVX-512 F CPU with F16C; `d % 32 == 0`; `p` valid for `rows·p_stride`
/// reads with `n ≤ p_stride`, value rows `0..n` for `34·d/32` bytes each, `o`
/// for `rows·d` reads and writes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn pv_q8_0(
    p: *const f32,
    p_stride: usize,
    rows: usize,
    v: *const u8,
    stride_bytes: usize,
    n: usize,
    d: usize,
    o: *mut f32,
) {
    super::by_row_runs!(pv_q8_0_rows, rows, d, p, p_stride, (v, stride_bytes, n, d), o)
}
