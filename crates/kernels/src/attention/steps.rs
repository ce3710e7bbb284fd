//! The block steps of a tile ([`super::run_tile`]), each dispatched to its
//! AVX-512, AVX2 or scalar version: widening cache rows, scores, the softmax
//! exp, rescaling, `o += P·V`, and the row-lane prefill block.

use super::{Lanes, KB, RMAX};
#[cfg(target_arch = "x86_64")]
use crate::simd::{avx2_attn, avx2_ops, avx512_attn, avx512_lanes};
use half::f16;

/// One key block of a row-lane tile (AVX-512 only: the caller checked the
/// level, `d % 16 == 0`, float keys): see [`crate::simd::avx512_lanes::block`].
/// `kb`: the widened keys, `n16 × d`; `vb`: the values, `n × d`; `b0`: the
/// block's first position; `masked`: some row does not see all of it.
#[allow(clippy::too_many_arguments)]
pub(super) fn lanes_block(
    lt: &mut Lanes,
    rp: usize,
    rows: usize,
    kb: &[f32],
    vb: &[f32],
    n: usize,
    n16: usize,
    d: usize,
    (b0, masked): (usize, bool),
    m: &mut [f32],
    l: &mut [f32],
    o: &mut [f32],
) {
    assert!(rp.is_multiple_of(16) && rp <= RMAX && rows <= rp && n >= 1 && n <= n16 && n16.is_multiple_of(4));
    assert!(d.is_multiple_of(16) && kb.len() >= n16 * d && vb.len() >= n * d && o.len() >= rows * d);
    assert!(lt.qt.len() >= d * rp && lt.st.len() >= n16 * rp && lt.ks.len() >= rp && lt.ke.len() >= rp);
    assert!(m.len() >= rp && l.len() >= rp && b0 + n <= i32::MAX as usize);
    #[cfg(target_arch = "x86_64")]
    {
        let keys = (lt.ks.as_ptr(), lt.ke.as_ptr(), b0 as i32, masked);
        let (qt, st) = (lt.qt.as_ptr(), lt.st.as_mut_ptr());
        // SAFETY: callers pass `lanes` only at the active AVX-512 level with
        // d % 16 == 0; bounds asserted above.
        unsafe {
            avx512_lanes::block(
                qt,
                rp,
                rows,
                kb.as_ptr(),
                vb.as_ptr(),
                n,
                n16,
                d,
                st,
                keys,
                m.as_mut_ptr(),
                l.as_mut_ptr(),
                o.as_mut_ptr(),
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (lt, rows, kb, vb, n16, masked, m, l, o);
        unreachable!("row-lane tiles are AVX-512 only");
    }
}

/// Widens `n` cache rows (row `j` at `src[j·stride..]`, `d` values) into `dst`
/// (`n_pad × d`, rows past `n` zeroed).
pub(super) fn widen(simd: bool, src: &[f16], stride: usize, n: usize, n_pad: usize, d: usize, dst: &mut [f32]) {
    assert!(n == 0 || src.len() >= (n - 1) * stride + d);
    assert!(dst.len() >= n_pad * d);
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: `simd` implies AVX2+F16C and d % 8 == 0; bounds asserted above.
        unsafe { avx2_attn::widen_rows(src.as_ptr() as *const u16, stride, n, n_pad, d, dst.as_mut_ptr()) };
        return;
    }
    let _ = simd;
    for j in 0..n {
        for (x, y) in dst[j * d..(j + 1) * d].iter_mut().zip(&src[j * stride..][..d]) {
            *x = y.to_f32();
        }
    }
    dst[n * d..n_pad * d].fill(0.0);
}

/// Asks for the next block's `n` cache rows (laid out as in [`widen`]) to be
/// brought into cache.
pub(super) fn prefetch(simd: bool, src: &[f16], stride: usize, n: usize, d: usize) {
    #[cfg(target_arch = "x86_64")]
    if simd && n > 0 && src.len() >= (n - 1) * stride + d {
        // SAFETY: `simd` implies AVX2; the rows lie inside `src` (checked).
        unsafe { avx2_attn::prefetch_rows(src.as_ptr() as *const u16, stride, n, d) };
    }
    let _ = (simd, src, stride, n, d);
}

/// `s[r·KB + j] = q[r] · k[j]` for `rows` rows and `n4` keys (a multiple of
/// 16 when `avx512` and `d % 16 == 0`, else of 4).
#[allow(clippy::too_many_arguments)]
pub(super) fn scores(simd: bool, avx512: bool, q: &[f32], rows: usize, k: &[f32], n4: usize, d: usize, s: &mut [f32]) {
    assert!(q.len() >= rows * d && k.len() >= n4 * d && n4 <= KB && s.len() >= rows * KB);
    #[cfg(target_arch = "x86_64")]
    if avx512 && d.is_multiple_of(16) && n4.is_multiple_of(16) {
        // SAFETY: `avx512` implies the AVX-512 level; d % 16 == 0; bounds asserted above.
        unsafe { avx512_attn::scores(q.as_ptr(), rows, k.as_ptr(), n4, d, s.as_mut_ptr(), KB) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: `simd` implies AVX2 and d % 8 == 0; bounds asserted above.
        unsafe { avx2_attn::scores(q.as_ptr(), rows, k.as_ptr(), n4, d, s.as_mut_ptr(), KB) };
        return;
    }
    let _ = (simd, avx512);
    for r in 0..rows {
        let qr = &q[r * d..(r + 1) * d];
        for j in 0..n4 {
            s[r * KB + j] = qr.iter().zip(&k[j * d..(j + 1) * d]).map(|(a, b)| a * b).sum();
        }
    }
}

/// `o[r] += Σ_j p[r·KB + j] · v[j]` for `rows` rows and `n` keys. AVX2 and
/// AVX-512 both do one FMA per key in key order for each output value, so they
/// give the same bits (scalar rounds the product first).
#[allow(clippy::too_many_arguments)]
pub(super) fn pv(simd: bool, avx512: bool, p: &[f32], rows: usize, v: &[f32], n: usize, d: usize, o: &mut [f32]) {
    assert!(p.len() >= rows * KB && n <= KB && v.len() >= n * d && o.len() >= rows * d);
    #[cfg(target_arch = "x86_64")]
    if avx512 && d.is_multiple_of(16) {
        // SAFETY: `avx512` implies the AVX-512 level; d % 16 == 0; bounds asserted above.
        unsafe { avx512_attn::pv(p.as_ptr(), KB, rows, v.as_ptr(), n, d, o.as_mut_ptr()) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: `simd` implies AVX2 and d % 8 == 0; bounds asserted above.
        unsafe { avx2_attn::pv(p.as_ptr(), KB, rows, v.as_ptr(), n, d, o.as_mut_ptr()) };
        return;
    }
    let _ = (simd, avx512);
    for r in 0..rows {
        let or = &mut o[r * d..(r + 1) * d];
        for j in 0..n {
            let w = p[r * KB + j];
            for (x, &y) in or.iter_mut().zip(&v[j * d..(j + 1) * d]) {
                *x += w * y;
            }
        }
    }
}

/// `x[i] = e^(x[i] − max)`, returning the sum. The SIMD versions are the
/// polynomial exp of [`avx2_ops::exp8`] / [`avx512_attn::exp16`] (relative
/// error < 2.5e-7 for `x − max ≥ −86`, exactly 0 below); scalar is `f32::exp`.
pub(super) fn exp_sub_sum(simd: bool, avx512: bool, x: &mut [f32], max: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if avx512 {
        // SAFETY: `avx512` implies the AVX-512 level is active.
        return unsafe { avx512_attn::exp_sub_sum(x.as_mut_ptr(), max, x.len()) };
    }
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: `simd` implies AVX2+FMA.
        return unsafe { avx2_ops::exp_sub_sum(x.as_mut_ptr(), max, x.len()) };
    }
    let _ = (simd, avx512);
    x.iter_mut().fold(0.0, |sum, v| {
        *v = (*v - max).exp();
        sum + *v
    })
}

/// `x[i] *= c`.
pub(super) fn scale(simd: bool, x: &mut [f32], c: f32) {
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: `simd` implies AVX2.
        unsafe { avx2_attn::scale(x.as_mut_ptr(), c, x.len()) };
        return;
    }
    let _ = simd;
    x.iter_mut().for_each(|v| *v *= c);
}
