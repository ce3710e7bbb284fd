//! Decode steps that read an f16 cache in place ([`super::KvElem::DIRECT`]):
//! the scores of a GQA group's query rows against a block of keys, and
//! `o += P·V` over a block of values, each cache row widened in registers
//! right before its FMAs (AVX-512: [`crate::simd::avx512_direct`]) instead of
//! into an f32 scratch block. The scalar loops are the reference the tests and
//! the start-up self-check compare the AVX-512 kernels with.
//!
//! Numerics: the scores sum in another order than [`super::scores`] (per key,
//! 16-lane partial sums over `d`, then a lane tree), so they differ from it in
//! the last bits; P·V does one FMA per output value and key in key order, the
//! same bits as the AVX-512 [`super::pv`] on the widened block.

use crate::isa::Isa;
use crate::quant::q8_0::BlockQ8_0;
#[cfg(target_arch = "x86_64")]
use crate::simd::avx512_direct;
use half::f16;

fn check(rows: usize, m: usize, m_stride: usize, cache: usize, stride: usize, n: usize, d: usize) {
    assert!(n <= m_stride || rows == 0, "direct attention: more keys than the row stride");
    assert!(rows == 0 || m >= (rows - 1) * m_stride + n, "direct attention: score/prob block too short");
    assert!(n == 0 || cache >= (n - 1) * stride + d, "direct attention: cache rows out of the slice");
}

/// `s[r·s_stride + j] = q[r] · k[j]` for `rows` query rows (`q`: `rows × d`)
/// and `n` keys, key `j` at `k[j·stride ..][.. d]`.
#[allow(clippy::too_many_arguments)]
pub fn scores(
    isa: Isa,
    q: &[f32],
    rows: usize,
    k: &[f16],
    stride: usize,
    n: usize,
    d: usize,
    s: &mut [f32],
    s_stride: usize,
) {
    check(rows, s.len(), s_stride, k.len(), stride, n, d);
    assert!(q.len() >= rows * d, "direct attention: q too short");
    if n == 0 || rows == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && d.is_multiple_of(16) {
        // SAFETY: the level is supported (callers pass `isa::active()` or a
        // level from `isa::available()`); d % 16 == 0; bounds checked above.
        unsafe {
            avx512_direct::scores_f16(
                q.as_ptr(),
                rows,
                k.as_ptr() as *const u16,
                stride,
                n,
                d,
                s.as_mut_ptr(),
                s_stride,
            )
        };
        return;
    }
    let _ = isa;
    for r in 0..rows {
        let qr = &q[r * d..(r + 1) * d];
        for j in 0..n {
            s[r * s_stride + j] = qr.iter().zip(&k[j * stride..][..d]).map(|(a, b)| a * b.to_f32()).sum();
        }
    }
}

/// `o[r] += Σ_{j<n} p[r·p_stride + j] · v[j]` for `rows` rows (`o`: `rows × d`),
/// value `j` at `v[j·stride ..][.. d]`.
#[allow(clippy::too_many_arguments)]
pub fn pv(
    isa: Isa,
    p: &[f32],
    p_stride: usize,
    rows: usize,
    v: &[f16],
    stride: usize,
    n: usize,
    d: usize,
    o: &mut [f32],
) {
    check(rows, p.len(), p_stride, v.len(), stride, n, d);
    assert!(o.len() >= rows * d, "direct attention: o too short");
    if n == 0 || rows == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && d.is_multiple_of(16) {
        // SAFETY: as in `scores`.
        unsafe {
            avx512_direct::pv_f16(p.as_ptr(), p_stride, rows, v.as_ptr() as *const u16, stride, n, d, o.as_mut_ptr())
        };
        return;
    }
    let _ = isa;
    for r in 0..rows {
        let or = &mut o[r * d..(r + 1) * d];
        for j in 0..n {
            let w = p[r * p_stride + j];
            for (x, y) in or.iter_mut().zip(&v[j * stride..][..d]) {
                *x = w.mul_add(y.to_f32(), *x);
            }
        }
    }
}

/// [`pv`] for a Q8_0 cache ([`KvElem::DIRECT_PV`](super::KvElem::DIRECT_PV)):
/// value `j` is the blocks `v[j·stride ..][.. d/32]`, each dequantized to
/// `q · scale` in registers (AVX-512) or in the scalar loop below, the same
/// product the widen makes, so both equal widening then [`super::pv`].
#[allow(clippy::too_many_arguments)]
pub fn pv_q8_0(
    isa: Isa,
    p: &[f32],
    p_stride: usize,
    rows: usize,
    v: &[BlockQ8_0],
    stride: usize,
    n: usize,
    d: usize,
    o: &mut [f32],
) {
    assert!(d.is_multiple_of(32), "direct attention: a Q8_0 row needs d % 32 == 0");
    check(rows, p.len(), p_stride, v.len(), stride, n, d / 32);
    assert!(o.len() >= rows * d, "direct attention: o too short");
    if n == 0 || rows == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 {
        // SAFETY: as in `scores`; d % 32 == 0 and bounds checked above
        // (34-byte blocks, `stride` of them between rows).
        unsafe {
            avx512_direct::pv_q8_0(
                p.as_ptr(),
                p_stride,
                rows,
                v.as_ptr() as *const u8,
                stride * 34,
                n,
                d,
                o.as_mut_ptr(),
            )
        };
        return;
    }
    let _ = isa;
    for r in 0..rows {
        let or = &mut o[r * d..(r + 1) * d];
        for j in 0..n {
            let w = p[r * p_stride + j];
            for (b, blk) in v[j * stride..][..d / 32].iter().enumerate() {
                let s = blk.d.to_f32();
                for (x, &q) in or[32 * b..32 * (b + 1)].iter_mut().zip(&blk.qs) {
                    *x = w.mul_add(q as f32 * s, *x);
                }
            }
        }
    }
}
