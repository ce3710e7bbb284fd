//! AVX-512 steps of the attention softmax: a 16-lane `exp` and
//! `x[i] = e^(x[i] − max)` with the sum, used by [`crate::attention`] when
//! AVX-512 is active.
//!
//! [`exp16`] performs the same operations as the AVX2 [`super::avx2_ops::exp8`]
//! (Cody–Waite reduction `x = n·ln2 + r`, `|r| ≤ ln2/2`, degree-6 Taylor
//! polynomial of `e^r` in Horner form with FMAs, `2^n` built in the exponent
//! field), so both levels give bit-identical results. Max relative error
//! against the exact `e^x`, measured over `x ∈ [−86, 0]` by the kernels' tests
//! (`tests/ops.rs`): below 2.5e-7 (about 2 ulp). Inputs below −86 give exactly 0
//! (the true value is < 4.5e-38 there, negligible next to the row maximum's 1).

use std::arch::x86_64::*;

/// `e^x` for 16 lanes (inputs clamped to `[−86, 88]`, below −86 → 0).
///
/// # Safety
/// AVX-512 F CPU.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
pub unsafe fn exp16(x: __m512) -> __m512 {
    let tiny = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(-86.0));
    let x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-86.0)), _mm512_set1_ps(88.0));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(
        x,
        _mm512_set1_ps(std::f32::consts::LOG2_E),
    ));
    // r = x − n·ln2 in two steps (ln2 = hi + lo), as exp8.
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_145_75), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428_606_8e-6), r);
    let mut p = _mm512_set1_ps(1.0 / 720.0);
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    let scale = _mm512_slli_epi32::<23>(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)));
    let y = _mm512_mul_ps(p, _mm512_castsi512_ps(scale));
    _mm512_maskz_mov_ps(!tiny, y)
}

/// `x[i] = e^(x[i] − max)`, returning `Σ x[i]` afterwards (the tail through a
/// masked load/store).
///
/// # Safety
/// AVX-512 F CPU; `x` valid for `n` reads and writes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn exp_sub_sum(x: *mut f32, max: f32, n: usize) -> f32 {
    let mv = _mm512_set1_ps(max);
    let mut acc = _mm512_setzero_ps();
    let mut i = 0;
    while i + 16 <= n {
        let e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x.add(i)), mv));
        _mm512_storeu_ps(x.add(i), e);
        acc = _mm512_add_ps(acc, e);
        i += 16;
    }
    if i < n {
        let m: __mmask16 = (1u32 << (n - i)).wrapping_sub(1) as __mmask16;
        // Masked-off lanes read −∞ → e = 0, so they add nothing.
        let v = _mm512_mask_loadu_ps(_mm512_set1_ps(f32::NEG_INFINITY), m, x.add(i));
        let e = exp16(_mm512_sub_ps(v, mv));
        _mm512_mask_storeu_ps(x.add(i), m, e);
        acc = _mm512_add_ps(acc, e);
    }
    _mm512_reduce_add_ps(acc)
}

/// `o[r][c..c+16·NV] += Σ_j p[r][j] · v[j][c..c+16·NV]` for `NR` rows: per
/// output value an FMA per key in key order, exactly as the AVX2 and scalar
/// `pv` (so all three give the same bits).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn pv_block<const NR: usize, const NV: usize>(
    p: *const f32,
    p_stride: usize,
    p_js: usize,
    v: *const f32,
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
        let mut vv = [_mm512_setzero_ps(); NV];
        for x in 0..NV {
            vv[x] = _mm512_loadu_ps(v.add(j * d + c + 16 * x));
        }
        for r in 0..NR {
            let pr = _mm512_set1_ps(*p.add(r * p_stride + j * p_js));
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
    p_js: usize,
    v: *const f32,
    n: usize,
    d: usize,
    o: *mut f32,
) {
    let mut c = 0;
    while c + 64 <= d {
        pv_block::<NR, 4>(p, p_stride, p_js, v, n, d, o, c);
        c += 64;
    }
    while c < d {
        pv_block::<NR, 1>(p, p_stride, p_js, v, n, d, o, c);
        c += 16;
    }
}

/// `o[r] += Σ_j p[r][j] · v[j]` for `rows` rows and `n` keys (the AVX-512
/// version of [`super::avx2_attn::pv`]: 4 rows × 64 columns in registers).
///
/// # Safety
/// AVX-512 F CPU; `d % 16 == 0`; `p` valid for `rows·p_stride` reads with
/// `n ≤ p_stride`, `v` for `n·d`, `o` for `rows·d` reads and writes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn pv(p: *const f32, p_stride: usize, rows: usize, v: *const f32, n: usize, d: usize, o: *mut f32) {
    pv_strided(p, p_stride, 1, rows, v, n, d, o)
}

/// [`pv`] with row `r`'s weight of key `j` at `p[r·p_stride + j·p_js]` (the
/// row-lane prefill tile keeps `P` transposed: `p_stride` 1, `p_js` its row count).
///
/// # Safety
/// As [`pv`], with `p` valid at every `r·p_stride + j·p_js` for `r < rows`, `j < n`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn pv_strided(
    p: *const f32,
    p_stride: usize,
    p_js: usize,
    rows: usize,
    v: *const f32,
    n: usize,
    d: usize,
    o: *mut f32,
) {
    super::by_row_runs!(pv_rows, rows, d, p, p_stride, (p_js, v, n, d), o)
}

/// Lane `j` = the sum of the 16 lanes of `a[j]` (a transpose-and-add tree:
/// pairs of registers, then pairs of 64-bit halves, then 128-bit lanes twice).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn reduce16(a: &[__m512; 16]) -> __m512 {
    // Per 128-bit lane: (a[2i] partials, a[2i+1] partials) interleaved.
    let mut b = [_mm512_setzero_ps(); 8];
    for i in 0..8 {
        let (x, y) = (a[2 * i], a[2 * i + 1]);
        b[i] = _mm512_add_ps(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y));
    }
    // Per 128-bit lane: (a[4i], a[4i+1], a[4i+2], a[4i+3]) partial sums.
    let mut c = [_mm512_setzero_ps(); 4];
    for i in 0..4 {
        let (x, y) = (_mm512_castps_pd(b[2 * i]), _mm512_castps_pd(b[2 * i + 1]));
        c[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    // 128-bit lanes: (a[8i..8i+4] over lanes 0+1, over 2+3, a[8i+4..8i+8] over 0+1, over 2+3).
    let mut e = [_mm512_setzero_ps(); 2];
    for i in 0..2 {
        let (x, y) = (c[2 * i], c[2 * i + 1]);
        e[i] = _mm512_add_ps(_mm512_shuffle_f32x4::<0b10_00_10_00>(x, y), _mm512_shuffle_f32x4::<0b11_01_11_01>(x, y));
    }
    _mm512_add_ps(_mm512_shuffle_f32x4::<0b10_00_10_00>(e[0], e[1]), _mm512_shuffle_f32x4::<0b11_01_11_01>(e[0], e[1]))
}

/// `s[r][j] = q[r] · k[j]` for `rows` query rows and `n16` keys (a multiple of
/// 16; pad key rows must hold finite values, e.g. zeros): per row and 16 keys,
/// one accumulator per key over `d` in 16-lane steps, then [`reduce16`].
///
/// # Safety
/// AVX-512 F CPU; `d % 16 == 0`; `q` valid for `rows·d` reads, `k` for `n16·d`,
/// `s` for `rows·s_stride` writes with `n16 ≤ s_stride`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn scores(q: *const f32, rows: usize, k: *const f32, n16: usize, d: usize, s: *mut f32, s_stride: usize) {
    for r in 0..rows {
        let qr = q.add(r * d);
        let mut j0 = 0;
        while j0 < n16 {
            let kj = k.add(j0 * d);
            let mut acc = [_mm512_setzero_ps(); 16];
            let mut c = 0;
            while c < d {
                let qv = _mm512_loadu_ps(qr.add(c));
                for (j, a) in acc.iter_mut().enumerate() {
                    *a = _mm512_fmadd_ps(qv, _mm512_loadu_ps(kj.add(j * d + c)), *a);
                }
                c += 16;
            }
            _mm512_storeu_ps(s.add(r * s_stride + j0), reduce16(&acc));
            j0 += 16;
        }
    }
}
