//! AVX-512 prefill tile step of [`crate::attention`] with the query rows in the
//! SIMD lanes: one key block against up to 64 query rows (4 registers of 16).
//!
//! Layouts (f32): `qt` is the tile's scaled queries transposed, `d × rp`
//! (`rp` = rows rounded up to 16, pad rows zero); `kb` the widened key block,
//! `n16 × d` row-major (pad keys zero); `st` the scores and then the
//! probabilities transposed, `n16 × rp` (key `j`'s 16-row groups side by side).
//!
//! - Scores `st[j][r] = Σ_c qt[c][r]·k[j][c]`: a register tile of 4 keys ×
//!   `RV` row vectors, per `c` one load per row vector and one broadcast per
//!   key, no horizontal sums (the per-row kernel needed a 16-key transpose tree
//!   per row and 16 keys).
//! - Online softmax across keys is then *vertical*: the block max, `e^(s − m)`
//!   and the row sums are lane-wise over the keys, 16 rows per instruction.
//! - `o += P·V` reads `P` transposed ([`super::avx512_attn::pv_strided`]).
//!
//! Every row's arithmetic is the same whatever the other lanes hold or how
//! many rows the tile has: each score is one FMA chain over `c = 0..d` in
//! order, the max, exps and sums are per lane in key order, masked keys become
//! `−∞` (exp 0, and a `+0` to the sum). So a prefill row's result never depends
//! on which tile (chunk) it ran in.

use super::avx512_attn::{exp16, pv_strided};
use std::arch::x86_64::*;

/// Keys per score step.
const JN: usize = 4;

/// `st[j0 + j][x·16 ..] = Σ_c qt[c][x·16 ..]·k[j0 + j][c]` for `j < 4`, `x < RV`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn scores_step<const RV: usize>(qt: *const f32, rp: usize, k: *const f32, d: usize, st: *mut f32) {
    let mut acc = [[_mm512_setzero_ps(); RV]; JN];
    for c in 0..d {
        let mut qv = [_mm512_setzero_ps(); RV];
        for (x, v) in qv.iter_mut().enumerate() {
            *v = _mm512_loadu_ps(qt.add(c * rp + 16 * x));
        }
        for (j, a) in acc.iter_mut().enumerate() {
            let kj = _mm512_set1_ps(*k.add(j * d + c));
            for (ax, &qx) in a.iter_mut().zip(&qv) {
                *ax = _mm512_fmadd_ps(qx, kj, *ax);
            }
        }
    }
    for (j, a) in acc.iter().enumerate() {
        for (x, v) in a.iter().enumerate() {
            _mm512_storeu_ps(st.add(j * rp + 16 * x), *v);
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn scores_rv<const RV: usize>(qt: *const f32, rp: usize, k: *const f32, n16: usize, d: usize, st: *mut f32) {
    let mut j = 0;
    while j < n16 {
        scores_step::<RV>(qt, rp, k.add(j * d), d, st.add(j * rp));
        j += JN;
    }
}

/// One key block of a row-lane tile: scores, mask, online softmax update of
/// `m`, `l` (per row, `rp` of them) and `o` (`rows × d`), and `o += P·V`.
/// Key `j` is cache position `b0 + j`; row `r` sees positions `ks[r] .. ke[r]`
/// (pad rows: an empty range). `masked`: some row does not see every key of
/// the block (else the per-key range test is skipped).
///
/// # Safety
/// AVX-512 F CPU; `rp % 16 == 0`, `rp ≤ 64`, `rows ≤ rp`, `1 ≤ n ≤ n16`,
/// `n16 % 4 == 0`, `d % 16 == 0`; `qt` valid for `d·rp` reads, `kb` for
/// `n16·d`, `vb` for `n·d`, `st` for `n16·rp` writes, `ks`/`ke`/`m`/`l` for
/// `rp`, `o` for `rows·d` reads and writes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn block(
    qt: *const f32,
    rp: usize,
    rows: usize,
    kb: *const f32,
    vb: *const f32,
    n: usize,
    n16: usize,
    d: usize,
    st: *mut f32,
    (ks, ke, b0, masked): (*const i32, *const i32, i32, bool),
    m: *mut f32,
    l: *mut f32,
    o: *mut f32,
) {
    match rp / 16 {
        1 => scores_rv::<1>(qt, rp, kb, n16, d, st),
        2 => scores_rv::<2>(qt, rp, kb, n16, d, st),
        3 => scores_rv::<3>(qt, rp, kb, n16, d, st),
        _ => scores_rv::<4>(qt, rp, kb, n16, d, st),
    }
    let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
    for x in 0..rp / 16 {
        let lane = |p: *mut f32, j: usize| p.add(j * rp + 16 * x);
        if masked {
            let (s, e) =
                (_mm512_loadu_si512(ks.add(16 * x) as *const _), _mm512_loadu_si512(ke.add(16 * x) as *const _));
            for j in 0..n {
                let pos = _mm512_set1_epi32(b0 + j as i32);
                let seen = _mm512_cmpge_epi32_mask(pos, s) & _mm512_cmplt_epi32_mask(pos, e);
                _mm512_storeu_ps(lane(st, j), _mm512_mask_mov_ps(ninf, seen, _mm512_loadu_ps(lane(st, j))));
            }
        }
        let mut bmax = ninf;
        for j in 0..n {
            bmax = _mm512_max_ps(bmax, _mm512_loadu_ps(lane(st, j)));
        }
        let m_old = _mm512_loadu_ps(m.add(16 * x));
        let m_new = _mm512_max_ps(m_old, bmax);
        // A row that has seen no key yet keeps m = −∞: subtract 0 there, so
        // its −∞ scores give e = 0 (not NaN) and its correction is 0.
        let none = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(m_new, ninf);
        let sub = _mm512_mask_mov_ps(m_new, none, _mm512_setzero_ps());
        let mut sum = _mm512_setzero_ps();
        for j in 0..n {
            let e = exp16(_mm512_sub_ps(_mm512_loadu_ps(lane(st, j)), sub));
            _mm512_storeu_ps(lane(st, j), e);
            sum = _mm512_add_ps(sum, e);
        }
        let corr = exp16(_mm512_sub_ps(m_old, sub));
        let lv = _mm512_loadu_ps(l.add(16 * x));
        _mm512_storeu_ps(l.add(16 * x), _mm512_fmadd_ps(lv, corr, sum));
        _mm512_storeu_ps(m.add(16 * x), m_new);
        // Rescale the outputs of the rows whose max moved.
        let mut moved = _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(corr, _mm512_set1_ps(1.0));
        let mut cs = [0f32; 16];
        _mm512_storeu_ps(cs.as_mut_ptr(), corr);
        while moved != 0 {
            let i = moved.trailing_zeros() as usize;
            moved &= moved - 1;
            let r = 16 * x + i;
            if r >= rows {
                break;
            }
            let (or, cv) = (o.add(r * d), _mm512_set1_ps(cs[i]));
            let mut c = 0;
            while c < d {
                _mm512_storeu_ps(or.add(c), _mm512_mul_ps(cv, _mm512_loadu_ps(or.add(c))));
                c += 16;
            }
        }
    }
    pv_strided(st, 1, rp, rows, vb, n, d, o);
}
