//! AVX2 + FMA versions of the f32 vector steps used by [`crate::ops`]: dot,
//! axpy, scaling, sum of squares, and a vectorized `exp` (Cody–Waite range
//! reduction, degree-6 polynomial: ≤ 2 ulp against `f32::exp` on the ranges we
//! use; inputs below −86 give 0).
//!
//! All take raw pointers and a length; callers ([`crate::ops`]) pass slices of
//! matching lengths and only call them after the ISA check.

use super::avx2::hsum_ps;
use std::arch::x86_64::*;

/// `e^x` for 8 lanes: Cody–Waite reduction `x = n·ln2 + r` (|r| ≤ ln2/2),
/// degree-6 Taylor polynomial of `e^r` (Horner, FMA), `2^n` in the exponent
/// field. Max relative error against f64 `exp` over `x ∈ [−86, 0]`: 2.3e-7
/// (`softmax_exp_accuracy` in tests/ops.rs); below −86 exactly 0.
///
/// # Safety
/// AVX2+FMA CPU.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub unsafe fn exp8(x: __m256) -> __m256 {
    let tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-86.0), _CMP_LT_OQ);
    let x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-86.0)), _mm256_set1_ps(88.0));
    let n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)), _MM_FROUND_TO_NEAREST_INT);
    // r = x − n·ln2 in two steps (ln2 = hi + lo) to keep r exact enough.
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_145_75), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428_606_8e-6), r);
    let mut p = _mm256_set1_ps(1.0 / 720.0);
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    let y = _mm256_mul_ps(p, _mm256_castsi256_ps(scale));
    _mm256_andnot_ps(tiny, y)
}

/// `Σ a[i]·b[i]`.
///
/// # Safety
/// AVX2+FMA CPU; `a`, `b` valid for `n` reads.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot(a: *const f32, b: *const f32, n: usize) -> f32 {
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for k in 0..4 {
            acc[k] = _mm256_fmadd_ps(_mm256_loadu_ps(a.add(i + 8 * k)), _mm256_loadu_ps(b.add(i + 8 * k)), acc[k]);
        }
        i += 32;
    }
    while i + 8 <= n {
        acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(a.add(i)), _mm256_loadu_ps(b.add(i)), acc[0]);
        i += 8;
    }
    let mut s = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    while i < n {
        s += *a.add(i) * *b.add(i);
        i += 1;
    }
    s
}

/// `y[i] = y[i]·c + a·x[i]`.
///
/// # Safety
/// AVX2+FMA CPU; `y` valid for `n` writes, `x` for `n` reads.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn scale_axpy(y: *mut f32, c: f32, a: f32, x: *const f32, n: usize) {
    let (cv, av) = (_mm256_set1_ps(c), _mm256_set1_ps(a));
    let mut i = 0;
    while i + 8 <= n {
        let v = _mm256_fmadd_ps(av, _mm256_loadu_ps(x.add(i)), _mm256_mul_ps(cv, _mm256_loadu_ps(y.add(i))));
        _mm256_storeu_ps(y.add(i), v);
        i += 8;
    }
    while i < n {
        *y.add(i) = *y.add(i) * c + a * *x.add(i);
        i += 1;
    }
}

/// `y[i] += a·x[i]`.
///
/// # Safety
/// AVX2+FMA CPU; `y` valid for `n` writes, `x` for `n` reads.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn axpy(y: *mut f32, a: f32, x: *const f32, n: usize) {
    let av = _mm256_set1_ps(a);
    let mut i = 0;
    while i + 8 <= n {
        _mm256_storeu_ps(y.add(i), _mm256_fmadd_ps(av, _mm256_loadu_ps(x.add(i)), _mm256_loadu_ps(y.add(i))));
        i += 8;
    }
    while i < n {
        *y.add(i) += a * *x.add(i);
        i += 1;
    }
}

/// `Σ x[i]²`.
///
/// # Safety
/// AVX2+FMA CPU; `x` valid for `n` reads.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn sum_sq(x: *const f32, n: usize) -> f32 {
    dot(x, x, n)
}

/// `out[i] = x[i]·s·w[i]`.
///
/// # Safety
/// AVX2+FMA CPU; `out` valid for `n` writes, `x` and `w` for `n` reads (`out`
/// may equal `x`).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn scale_mul(out: *mut f32, x: *const f32, s: f32, w: *const f32, n: usize) {
    let sv = _mm256_set1_ps(s);
    let mut i = 0;
    while i + 8 <= n {
        let v = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x.add(i)), sv), _mm256_loadu_ps(w.add(i)));
        _mm256_storeu_ps(out.add(i), v);
        i += 8;
    }
    while i < n {
        *out.add(i) = *x.add(i) * s * *w.add(i);
        i += 1;
    }
}

/// `x[i] = e^(x[i] − max)`, returning `Σ x[i]` afterwards.
///
/// # Safety
/// AVX2+FMA CPU; `x` valid for `n` reads and writes.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn exp_sub_sum(x: *mut f32, max: f32, n: usize) -> f32 {
    let mv = _mm256_set1_ps(max);
    let mut acc = _mm256_setzero_ps();
    let mut i = 0;
    while i + 8 <= n {
        let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x.add(i)), mv));
        _mm256_storeu_ps(x.add(i), e);
        acc = _mm256_add_ps(acc, e);
        i += 8;
    }
    let mut s = hsum_ps(acc);
    if i < n {
        let mut tmp = [f32::NEG_INFINITY; 8];
        std::ptr::copy_nonoverlapping(x.add(i), tmp.as_mut_ptr(), n - i);
        let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(tmp.as_ptr()), mv));
        _mm256_storeu_ps(tmp.as_mut_ptr(), e);
        std::ptr::copy_nonoverlapping(tmp.as_ptr(), x.add(i), n - i);
        s += tmp[..n - i].iter().sum::<f32>();
    }
    s
}

/// `g[i] = gelu_tanh(g[i])·u[i]`, written as `v · σ(2t)`, `t = √(2/π)·(v + 0.044715·v³)`:
/// `½·v·(1 + tanh t)` is exactly `v / (1 + e^(−2t))`, which needs one `exp`
/// and no cancellation near `t = 0`.
///
/// # Safety
/// AVX2+FMA CPU; `g` valid for `n` reads and writes, `u` for `n` reads.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn gelu_tanh_mul(g: *mut f32, u: *const f32, n: usize) {
    let one = _mm256_set1_ps(1.0);
    let c = _mm256_set1_ps(-2.0 * crate::ops::SQRT_2_OVER_PI);
    let k = _mm256_set1_ps(0.044715);
    let mut i = 0;
    while i + 8 <= n {
        let v = _mm256_loadu_ps(g.add(i));
        // −2t = c·(v + k·v³) = c·v·(1 + k·v²)
        let arg = _mm256_mul_ps(_mm256_mul_ps(c, v), _mm256_fmadd_ps(_mm256_mul_ps(k, v), v, one));
        let s = _mm256_div_ps(v, _mm256_add_ps(one, exp8(arg)));
        _mm256_storeu_ps(g.add(i), _mm256_mul_ps(s, _mm256_loadu_ps(u.add(i))));
        i += 8;
    }
    if i < n {
        crate::ops::gelu_tanh_mul_scalar(
            std::slice::from_raw_parts_mut(g.add(i), n - i),
            std::slice::from_raw_parts(u.add(i), n - i),
        );
    }
}

/// `g[i] = silu(g[i])·u[i]` with `silu(v) = v / (1 + e^−v)`.
///
/// # Safety
/// AVX2+FMA CPU; `g` valid for `n` reads and writes, `u` for `n` reads.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn silu_mul(g: *mut f32, u: *const f32, n: usize) {
    let one = _mm256_set1_ps(1.0);
    let zero = _mm256_setzero_ps();
    let mut i = 0;
    while i + 8 <= n {
        let v = _mm256_loadu_ps(g.add(i));
        let e = exp8(_mm256_sub_ps(zero, v));
        let s = _mm256_div_ps(v, _mm256_add_ps(one, e));
        _mm256_storeu_ps(g.add(i), _mm256_mul_ps(s, _mm256_loadu_ps(u.add(i))));
        i += 8;
    }
    while i < n {
        let v = *g.add(i);
        *g.add(i) = v / (1.0 + (-v).exp()) * *u.add(i);
        i += 1;
    }
}
