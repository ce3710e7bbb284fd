//! AVX2 + FMA + F16C block steps of the tiled attention in [`crate::attention`]:
//! f16 ↔ f32 conversion of cache rows, the score block `S = Q·Kᵀ` and the
//! weighted sum `O += P·V`.
//!
//! Buffers are the per-thread tile scratch of [`crate::attention`], all f32,
//! row-major: `q` is `rows × d`, `kb`/`vb` are `keys × d` (one converted key or
//! value row per key), `s` is `rows × kb_stride`, `o` is `rows × d`. Every
//! function requires `d % 8 == 0` (the caller falls back to scalar otherwise).

use std::arch::x86_64::*;

/// `dst[i] = f16(src[i])`, rounding to nearest even (as `half::f16::from_f32`).
///
/// # Safety
/// AVX2+F16C CPU; `src` valid for `n` reads, `dst` (f16 bits) for `n` writes.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f32_to_f16(src: *const f32, dst: *mut u16, n: usize) {
    let mut i = 0;
    while i + 8 <= n {
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(src.add(i)));
        _mm_storeu_si128(dst.add(i) as *mut __m128i, h);
        i += 8;
    }
    while i < n {
        *dst.add(i) = half::f16::from_f32(*src.add(i)).to_bits();
        i += 1;
    }
}

/// Widens `n` cache rows of `d` f16 values (row `j` at `src + j·stride`) into
/// `dst` (`n × d` f32), then zero-fills rows `n..n_pad`.
///
/// # Safety
/// AVX2+F16C CPU; `d % 8 == 0`; every source row valid for `d` reads; `dst`
/// valid for `n_pad · d` writes.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn widen_rows(src: *const u16, stride: usize, n: usize, n_pad: usize, d: usize, dst: *mut f32) {
    for j in 0..n {
        let (s, o) = (src.add(j * stride), dst.add(j * d));
        let mut c = 0;
        while c < d {
            _mm256_storeu_ps(o.add(c), _mm256_cvtph_ps(_mm_loadu_si128(s.add(c) as *const __m128i)));
            c += 8;
        }
    }
    for j in n..n_pad {
        let o = dst.add(j * d);
        let mut c = 0;
        while c < d {
            _mm256_storeu_ps(o.add(c), _mm256_setzero_ps());
            c += 8;
        }
    }
}

/// Prefetches `n` cache rows of `d` f16 values (row `j` at `src + j·stride`) into
/// L1, so the next block's keys and values load while this one computes.
///
/// # Safety
/// AVX2 CPU (prefetches never fault; addresses are formed with wrapping arithmetic).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn prefetch_rows(src: *const u16, stride: usize, n: usize, d: usize) {
    for j in 0..n {
        let row = src.wrapping_add(j * stride) as *const i8;
        let mut b = 0;
        while b < 2 * d {
            _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(b));
            b += 64;
        }
    }
}

/// Sums each of the four accumulators' lanes: `[Σa0, Σa1, Σa2, Σa3]`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn hsum4(a0: __m256, a1: __m256, a2: __m256, a3: __m256) -> __m128 {
    // Within each 128-bit lane: [a0, a1, a2, a3] partial sums, then fold lanes.
    let h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h))
}

/// Scores of `NR` query rows (`q`, row stride `d`) against 4 keys (`k`, row
/// stride `d`), written to `s[r·s_stride .. +4]`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn scores_nr4<const NR: usize>(q: *const f32, k: *const f32, d: usize, s: *mut f32, s_stride: usize) {
    let mut acc = [[_mm256_setzero_ps(); 4]; NR];
    let mut c = 0;
    while c < d {
        let kv = [
            _mm256_loadu_ps(k.add(c)),
            _mm256_loadu_ps(k.add(d + c)),
            _mm256_loadu_ps(k.add(2 * d + c)),
            _mm256_loadu_ps(k.add(3 * d + c)),
        ];
        for r in 0..NR {
            let qv = _mm256_loadu_ps(q.add(r * d + c));
            for j in 0..4 {
                acc[r][j] = _mm256_fmadd_ps(qv, kv[j], acc[r][j]);
            }
        }
        c += 8;
    }
    for r in 0..NR {
        _mm_storeu_ps(s.add(r * s_stride), hsum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
    }
}

/// `s[r][j] = q[r] · k[j]` for `rows` query rows and `n4` keys (a multiple of 4;
/// pad key rows must hold finite values, e.g. zeros).
///
/// # Safety
/// AVX2+FMA CPU; `d % 8 == 0`; `q` valid for `rows·d` reads, `k` for `n4·d`,
/// `s` for `rows·s_stride` writes with `n4 ≤ s_stride`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn scores(q: *const f32, rows: usize, k: *const f32, n4: usize, d: usize, s: *mut f32, s_stride: usize) {
    let mut r = 0;
    while r + 2 <= rows {
        let mut j = 0;
        while j < n4 {
            scores_nr4::<2>(q.add(r * d), k.add(j * d), d, s.add(r * s_stride + j), s_stride);
            j += 4;
        }
        r += 2;
    }
    if r < rows {
        let mut j = 0;
        while j < n4 {
            scores_nr4::<1>(q.add(r * d), k.add(j * d), d, s.add(r * s_stride + j), s_stride);
            j += 4;
        }
    }
}

/// `o[r][c..c+8·NV] += Σ_j p[r][j] · v[j][c..c+8·NV]` for `NR` rows.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn pv_block<const NR: usize, const NV: usize>(
    p: *const f32,
    p_stride: usize,
    v: *const f32,
    n: usize,
    d: usize,
    o: *mut f32,
    c: usize,
) {
    let mut acc = [[_mm256_setzero_ps(); NV]; NR];
    for r in 0..NR {
        for x in 0..NV {
            acc[r][x] = _mm256_loadu_ps(o.add(r * d + c + 8 * x));
        }
    }
    for j in 0..n {
        let mut vv = [_mm256_setzero_ps(); NV];
        for x in 0..NV {
            vv[x] = _mm256_loadu_ps(v.add(j * d + c + 8 * x));
        }
        for r in 0..NR {
            let pr = _mm256_broadcast_ss(&*p.add(r * p_stride + j));
            for x in 0..NV {
                acc[r][x] = _mm256_fmadd_ps(pr, vv[x], acc[r][x]);
            }
        }
    }
    for r in 0..NR {
        for x in 0..NV {
            _mm256_storeu_ps(o.add(r * d + c + 8 * x), acc[r][x]);
        }
    }
}

/// `NR` rows of `o += p · v` over all of `d`: 32-column chunks, then 8-column ones.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn pv_rows<const NR: usize>(p: *const f32, p_stride: usize, v: *const f32, n: usize, d: usize, o: *mut f32) {
    let mut c = 0;
    while c + 32 <= d {
        pv_block::<NR, 4>(p, p_stride, v, n, d, o, c);
        c += 32;
    }
    while c < d {
        pv_block::<NR, 1>(p, p_stride, v, n, d, o, c);
        c += 8;
    }
}

/// `o[r] += Σ_j p[r][j] · v[j]` for `rows` rows and `n` keys.
///
/// # Safety
/// AVX2+FMA CPU; `d % 8 == 0`; `p` valid for `rows·p_stride` reads with
/// `n ≤ p_stride`, `v` for `n·d`, `o` for `rows·d` reads and writes.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn pv(p: *const f32, p_stride: usize, rows: usize, v: *const f32, n: usize, d: usize, o: *mut f32) {
    let mut r = 0;
    while r + 2 <= rows {
        pv_rows::<2>(p.add(r * p_stride), p_stride, v, n, d, o.add(r * d));
        r += 2;
    }
    if r < rows {
        pv_rows::<1>(p.add(r * p_stride), p_stride, v, n, d, o.add(r * d));
    }
}

/// `x[i] *= c`.
///
/// # Safety
/// AVX2 CPU; `x` valid for `n` reads and writes.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn scale(x: *mut f32, c: f32, n: usize) {
    let cv = _mm256_set1_ps(c);
    let mut i = 0;
    while i + 8 <= n {
        _mm256_storeu_ps(x.add(i), _mm256_mul_ps(cv, _mm256_loadu_ps(x.add(i))));
        i += 8;
    }
    while i < n {
        *x.add(i) *= c;
        i += 1;
    }
}
