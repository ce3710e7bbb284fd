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
