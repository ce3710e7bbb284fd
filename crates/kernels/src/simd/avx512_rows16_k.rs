//! AVX-512 VNNI sixteen-row kernels for the K-quants in the transposed
//! layout of [`crate::packed::lanes16`]: lane `ℓ` of every vector is weight
//! row `ℓ`, so one kernel serves every batch size with no horizontal sums.
//!
//! Per super-block of sixteen rows and activation row (Q4_K):
//! * the codes: 32 vectors of four bytes per row; each gives its low nibbles
//!   (`& 0x0F`) and its high nibbles in place (`& 0xF0`, i.e. 16× the code),
//!   and two `vpdpbusd` against four activation bytes broadcast from memory;
//! * the sub-block scales: the three scale words of each row decode as the
//!   scalar code does, a word per lane (`quant::q4_k::scales_mins`); a
//!   `vpshufb` picks sub-block `j`'s scale into each lane's low byte and one
//!   `vpmulld` applies it to sixteen rows' sums (the low-nibble sums meet
//!   `16·sc`, so the total is `16 · Σ sc·S` and comes back with one shift);
//! * the mins: `(m_j, m_j)` word pairs meet Q8_K's `bsums` pairs in one
//!   `vpdpwssd` per sub-block.
//!
//! Numerics: the integer sums are exact and the float steps are the scalar
//! reference's (`quant::q4_k::vec_dot`: `(d_a·d)·Σsc·S − (d_a·dmin)·Σm·B`,
//! no FMA, super-blocks added in order), so every row equals the reference
//! bit for bit at every batch size, as the prefill GEMM does: a row's result
//! never depends on its batch.

use std::arch::x86_64::*;

/// How far ahead of the current super-block the stream is prefetched, into
/// L2 (`prefetcht1`, one line beside each line read). Without it this kernel
/// reads memory slower than the four-row one it replaces (the hardware
/// prefetchers fall behind a stream read this fast); `bench_matmul 2 1
/// avx512` at the 1.1B shapes out of cache, medians of 5 (AMD EPYC VM):
/// none 19.6 GB/s, `prefetcht0` 4 KiB 12.5 (1 thread), `prefetcht1` 8 KiB
/// **25.8**, 16 KiB 23.0, `prefetcht2` 8 KiB 25.8; the four-row kernel 19.7.
pub(super) const PREFETCH_AHEAD: usize = 8192;

#[inline(always)]
pub(super) fn prefetch_l2(p: *const u8) {
    // SAFETY: a prefetch is only a hint and never faults; SSE is baseline on x86-64.
    unsafe { _mm_prefetch::<_MM_HINT_T1>(p as *const i8) }
}

/// [`prefetch_l2`] in program order: an `asm!` block (which may touch
/// memory, as far as the compiler knows), where `_mm_prefetch` was hoisted
/// by LLVM to the top of a super-block, 36 prefetches in one burst ahead of
/// the block's 32 code loads. Spread among the loads it made one-thread
/// decode on an AMD EPYC Zen 5 VM (`bench -p 16 -g 64 --threads 1`, the 1.1B
/// files) faster for Q2_K (+18%), Q3_K_M (+10%), Q4_K_M (+8%) and Q6_K
/// (+5%), and slower for Q5_K_M (−37%) and IQ4_XS (−12%), which keep
/// `prefetch_l2`, as the AVX2 kernels do. (Q4_K, Q5_K and Q6_K have since
/// moved to the AVX2 row kernels at AVX-512; their sixteen-row kernels here
/// serve the tests and the scalar level's layout.)
#[inline(always)]
pub(super) fn prefetch_in_order(p: *const u8) {
    // SAFETY: a prefetch is only a hint and never faults (SSE is baseline on x86-64).
    unsafe { std::arch::asm!("prefetcht1 byte ptr [{p}]", p = in(reg) p, options(nostack, preserves_flags)) }
}

/// Activation rows per register tile.
pub(super) const ACTS: usize = 4;
/// Rows per group (the lanes).
pub(super) const ROWS: usize = 16;
/// Q8_K row layout: `d` (f32) at 0, 256 codes at 4, 16 `bsums` (i16) at 260.
pub(super) const Q8K_QS: usize = 4;
pub(super) const Q8K_BSUMS: usize = 260;
pub(super) const Q8K_BYTES: usize = 292;

#[inline(always)]
pub(super) unsafe fn ld(p: *const u8) -> __m512i {
    _mm512_loadu_si512(p as *const _)
}

/// Four bytes at `p` in every lane.
#[inline(always)]
pub(super) unsafe fn bcast4(p: *const u8) -> __m512i {
    _mm512_set1_epi32((p as *const i32).read_unaligned())
}

/// `vpshufb` controls: `pick[t]` moves byte `t` of each dword to its low
/// byte (zeroing the rest); `pair[t]` makes it the word pair `(b_t, b_t)`.
struct Picks {
    pick: [__m512i; 4],
    pair: [__m512i; 4],
}

#[inline(always)]
unsafe fn picks() -> Picks {
    let ctl = |t: i32, pair: bool| {
        let mut v = [0i32; 4];
        for (k, d) in v.iter_mut().enumerate() {
            let b = 4 * k as i32 + t;
            *d = if pair { b | (0x80 << 8) | (b << 16) | (0x80 << 24) } else { b | (0x8080_8000u32 as i32) };
        }
        _mm512_broadcast_i32x4(_mm_setr_epi32(v[0], v[1], v[2], v[3]))
    };
    Picks {
        pick: [ctl(0, false), ctl(1, false), ctl(2, false), ctl(3, false)],
        pair: [ctl(0, true), ctl(1, true), ctl(2, true), ctl(3, true)],
    }
}

/// The sixteen-row kernel of one type: groups of sixteen rows, tiles of up
/// to [`ACTS`] activation rows (`$tile::<J, S>`: `J` rows, `S` partial sums).
macro_rules! rows16_kernel {
    ($(#[$doc:meta])* $name:ident, $tile:ident) => {
        rows16_kernel!($(#[$doc])* $name, $tile, "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c");
    };
    ($(#[$doc:meta])* $name:ident, $tile:ident, $features:literal) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// A CPU with the target features below (AVX-512 F/BW/VL/VNNI at
        /// least); `w` holds `rows / 16` lanes16 groups of
        /// `row_bytes` per row (`n` a multiple of 256); `a` holds `m` Q8_K rows of
        /// `n` values `a_stride` bytes apart; `y` valid for the writes.
        #[target_feature(enable = $features)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn $name(
            n: usize,
            w: *const u8,
            row_bytes: usize,
            rows: usize,
            a: *const u8,
            a_stride: usize,
            m: usize,
            y: *mut f32,
            y_stride: usize,
        ) {
            debug_assert!(rows.is_multiple_of(ROWS) && n.is_multiple_of(256));
            let nb = n / 256;
            for g in 0..rows / ROWS {
                let gw = w.add(g * ROWS * row_bytes);
                let mut j = 0;
                while j < m {
                    let take = (m - j).min(ACTS);
                    let (aj, yj) = (a.add(j * a_stride), y.add(j * y_stride + g * ROWS));
                    match take {
                        1 => $tile::<1, 4>(nb, gw, aj, a_stride, yj, y_stride),
                        2 => $tile::<2, 2>(nb, gw, aj, a_stride, yj, y_stride),
                        3 => $tile::<3, 1>(nb, gw, aj, a_stride, yj, y_stride),
                        _ => $tile::<4, 1>(nb, gw, aj, a_stride, yj, y_stride),
                    }
                    j += take;
                }
            }
        }
    };
}

pub(super) use rows16_kernel;

rows16_kernel!(
    /// `rows` (a multiple of 16) Q4_K rows in the lanes16 layout × `m` Q8_K
    /// activation rows (see [`crate::quant::Rows16Fn`]): `y[j·y_stride + r] =
    /// row r · act j`, each equal to `quant::q4_k::vec_dot`.
    rows16_q4_k,
    tile_q4_k
);

rows16_kernel!(
    /// [`rows16_q4_k`] for Q5_K, each result equal to `quant::q5_k::vec_dot`.
    rows16_q5_k,
    tile_q5_k
);

rows16_kernel!(
    /// [`rows16_q4_k`] for Q2_K, each result equal to `quant::q2_k::vec_dot`.
    rows16_q2_k,
    tile_q2_k
);

/// `(d, dmin)` f16 pairs per lane (a lanes16 vector of a K-quant header) as
/// two float vectors.
#[inline(always)]
unsafe fn d_dmin(v: __m512i) -> (__m512, __m512) {
    (_mm512_cvtph_ps(_mm512_cvtepi32_epi16(v)), _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(v))))
}

/// `sum + ((d_a·d)·isum − (d_a·dmin)·summ)`, the scalar references' float
/// steps (no FMA), `d_a` the f32 at `act`.
#[inline(always)]
unsafe fn combine(sum: __m512, act: *const u8, d: __m512, dmin: __m512, isum: __m512i, summ: __m512i) -> __m512 {
    let yd = _mm512_set1_ps((act as *const f32).read_unaligned());
    let t1 = _mm512_mul_ps(_mm512_mul_ps(yd, d), _mm512_cvtepi32_ps(isum));
    let t2 = _mm512_mul_ps(_mm512_mul_ps(yd, dmin), _mm512_cvtepi32_ps(summ));
    _mm512_add_ps(sum, _mm512_sub_ps(t1, t2))
}

/// One group of sixteen Q2_K rows × `J` activation rows, with `S` partial
/// sums per 16-value group and row.
///
/// Lanes16 vectors of an 84-byte block: 0–3 the scale bytes (`sc | m << 4`
/// of groups `4v..4v+4`), 4 + 8h + u the codes `qs[32h + 4u..+4]`, 20 `(d,
/// dmin)`. Codes are masked in place (`q & 3 << 2jb`, i.e. `4^jb ·` code),
/// and group `g`'s scale meets it as `sc · 4^(3 − jb)`, so the total is
/// `64 · Σ sc·S` (one shift back; at most 64 · 16 · 15 · 3 · 127 · 16 < 2³¹).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn tile_q2_k<const J: usize, const S: usize>(
    nb: usize,
    w: *const u8,
    a: *const u8,
    a_stride: usize,
    y: *mut f32,
    y_stride: usize,
) {
    const BLOCK: usize = ROWS * 84;
    let low4 = _mm512_set1_epi8(0x0F);
    let p = picks();
    // Word pairs of bytes (0, 1) and (2, 3) of each dword: two groups' mins.
    let pair01 = _mm512_broadcast_i32x4(_mm_set1_epi32(0x8001_8000u32 as i32));
    let pair23 = _mm512_broadcast_i32x4(_mm_set1_epi32(0x8003_8002u32 as i32));
    let within = _mm512_broadcast_i32x4(_mm_setr_epi32(0, 0x0404_0404, 0x0808_0808, 0x0C0C_0C0C));
    let (pair01, pair23) = (_mm512_add_epi8(pair01, within), _mm512_add_epi8(pair23, within));
    let mut sums = [_mm512_setzero_ps(); J];
    for b in 0..nb {
        let x = w.add(b * BLOCK);
        let ahead = x.wrapping_add(PREFETCH_AHEAD);
        for l in 0..BLOCK / 64 {
            prefetch_in_order(ahead.wrapping_add(64 * l));
        }
        let act: [*const u8; J] = std::array::from_fn(|j| a.add(j * a_stride + b * Q8K_BYTES));
        let (d, dmin) = d_dmin(ld(x.add(20 * 64)));
        let sv: [__m512i; 4] = std::array::from_fn(|k| ld(x.add(64 * k)));
        let scv: [__m512i; 4] = std::array::from_fn(|k| _mm512_and_si512(sv[k], low4));
        let mut sumi = [_mm512_setzero_si512(); J];
        for h in 0..2 {
            let q: [__m512i; 8] = std::array::from_fn(|u| ld(x.add(256 + 512 * h + 64 * u)));
            for jb in 0..4 {
                let mask = _mm512_set1_epi8(3 << (2 * jb));
                // `S` partial sums per group and activation row (as in `tile_k45`).
                let mut parts = [[[_mm512_setzero_si512(); J]; S]; 2];
                for (u, qu) in q.iter().enumerate() {
                    let c = _mm512_and_si512(*qu, mask);
                    for j in 0..J {
                        let y0 = act[j].add(Q8K_QS + 128 * h + 32 * jb + 4 * u);
                        let p = &mut parts[u / 4][u % S][j];
                        *p = _mm512_dpbusd_epi32(*p, c, bcast4(y0));
                    }
                }
                let acc: [[__m512i; J]; 2] = std::array::from_fn(|g| {
                    std::array::from_fn(|j| (1..S).fold(parts[g][0][j], |t, k| _mm512_add_epi32(t, parts[g][k][j])))
                });
                let g0 = 8 * h + 2 * jb;
                let scale = |g: usize| {
                    let sc = _mm512_shuffle_epi8(scv[g / 4], p.pick[g % 4]);
                    _mm512_sllv_epi32(sc, _mm512_set1_epi32(2 * (3 - jb as i32)))
                };
                let (s0, s1) = (scale(g0), scale(g0 + 1));
                for j in 0..J {
                    let part = _mm512_add_epi32(_mm512_mullo_epi32(acc[0][j], s0), _mm512_mullo_epi32(acc[1][j], s1));
                    sumi[j] = _mm512_add_epi32(sumi[j], part);
                }
            }
        }
        // Mins: groups (2t, 2t + 1) are bytes 2(t mod 2), +1 of vector t / 2.
        let mut summ = [_mm512_setzero_si512(); J];
        let mv: [__m512i; 4] = std::array::from_fn(|k| _mm512_and_si512(_mm512_srli_epi16::<4>(sv[k]), low4));
        for t in 0..8 {
            let mp = _mm512_shuffle_epi8(mv[t / 2], if t % 2 == 0 { pair01 } else { pair23 });
            for j in 0..J {
                summ[j] = _mm512_dpwssd_epi32(summ[j], mp, bcast4(act[j].add(Q8K_BSUMS + 4 * t)));
            }
        }
        for j in 0..J {
            sums[j] = combine(sums[j], act[j], d, dmin, _mm512_srai_epi32::<6>(sumi[j]), summ[j]);
        }
    }
    for (j, s) in sums.iter().enumerate() {
        _mm512_storeu_ps(y.add(j * y_stride), *s);
    }
}

/// One group of sixteen Q4_K rows × `J` activation rows (see [`tile_k45`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn tile_q4_k<const J: usize, const S: usize>(
    nb: usize,
    w: *const u8,
    a: *const u8,
    a_stride: usize,
    y: *mut f32,
    y_stride: usize,
) {
    tile_k45::<J, S, false>(nb, w, a, a_stride, y, y_stride)
}

/// One group of sixteen Q5_K rows × `J` activation rows (see [`tile_k45`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn tile_q5_k<const J: usize, const S: usize>(
    nb: usize,
    w: *const u8,
    a: *const u8,
    a_stride: usize,
    y: *mut f32,
    y_stride: usize,
) {
    tile_k45::<J, S, true>(nb, w, a, a_stride, y, y_stride)
}

/// Bit `from` of every byte of `h` moved to bit 4, all other bits cleared
/// (16-bit shifts: after the mask each byte's bit 4 came from its own byte).
#[inline(always)]
unsafe fn bit4(h: __m512i, from: usize) -> __m512i {
    let s = match from {
        0 => _mm512_slli_epi16::<4>(h),
        1 => _mm512_slli_epi16::<3>(h),
        2 => _mm512_slli_epi16::<2>(h),
        3 => _mm512_slli_epi16::<1>(h),
        4 => h,
        5 => _mm512_srli_epi16::<1>(h),
        6 => _mm512_srli_epi16::<2>(h),
        _ => _mm512_srli_epi16::<3>(h),
    };
    _mm512_and_si512(s, _mm512_set1_epi8(0x10))
}

/// What [`k45_chunk`] reads of one block.
struct ChunkArgs<'a, const J: usize> {
    x: *const u8,
    ahead: *const u8,
    /// Byte offset of the codes (vector 4 or 12).
    codes: usize,
    act: [*const u8; J],
    /// The scale bytes of sub-blocks 0–3 and 4–7, a word per lane.
    sc: [__m512i; 2],
    p: &'a Picks,
    low4: __m512i,
    high4: __m512i,
}

/// Chunk `C` (values `64C..64C+64`: sub-blocks `2C`, `2C+1`) of a Q4_K/Q5_K
/// block: `sumi[j] += 16·sc₂c·S₂c + sc₂c₊₁·(16·S₂c₊₁)` (Q4_K, high nibbles in
/// place) or `sc₂c·S₂c + sc₂c₊₁·S₂c₊₁` (Q5_K). A const chunk, so the shifts
/// and the scale picks are immediate (a loop over chunks compiled to jump
/// tables and spills).
#[inline(always)]
unsafe fn k45_chunk<const J: usize, const S: usize, const Q5: bool, const C: usize>(
    k: &ChunkArgs<'_, J>,
    sumi: &mut [__m512i; J],
) {
    // `S` partial sums per activation row and half, so that at least eight
    // `vpdpbusd` chains are in flight; the codes are read in address order
    // (interleaving the chunks' streams defeated the hardware prefetcher).
    let mut lo_acc = [[_mm512_setzero_si512(); J]; S];
    let mut hi_acc = [[_mm512_setzero_si512(); J]; S];
    for v in 0..8 {
        if Q5 {
            prefetch_l2(k.ahead.wrapping_add(k.codes + 512 * C + 64 * v));
        } else {
            prefetch_in_order(k.ahead.wrapping_add(k.codes + 512 * C + 64 * v));
        }
        if Q5 && C == 0 {
            prefetch_l2(k.ahead.wrapping_add(256 + 64 * v));
        }
        let q = ld(k.x.add(k.codes + 512 * C + 64 * v));
        let (lo, hi) = if Q5 {
            // Fifth bits: bit 2C (low half) and 2C + 1 (high half) of qh.
            let h = ld(k.x.add(256 + 64 * v));
            let lo = _mm512_or_si512(_mm512_and_si512(q, k.low4), bit4(h, 2 * C));
            let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(q), k.low4);
            (lo, _mm512_or_si512(hi, bit4(h, 2 * C + 1)))
        } else {
            (_mm512_and_si512(q, k.low4), _mm512_and_si512(q, k.high4))
        };
        for j in 0..J {
            let y0 = k.act[j].add(Q8K_QS + 64 * C + 4 * v);
            lo_acc[v % S][j] = _mm512_dpbusd_epi32(lo_acc[v % S][j], lo, bcast4(y0));
            hi_acc[v % S][j] = _mm512_dpbusd_epi32(hi_acc[v % S][j], hi, bcast4(y0.add(32)));
        }
    }
    let src = k.sc[C / 2];
    let s_even = _mm512_shuffle_epi8(src, k.p.pick[(2 * C) % 4]);
    let s_even = if Q5 { s_even } else { _mm512_slli_epi32::<4>(s_even) };
    let s_odd = _mm512_shuffle_epi8(src, k.p.pick[(2 * C + 1) % 4]);
    for j in 0..J {
        let (mut lo, mut hi) = (lo_acc[0][j], hi_acc[0][j]);
        for t in 1..S {
            lo = _mm512_add_epi32(lo, lo_acc[t][j]);
            hi = _mm512_add_epi32(hi, hi_acc[t][j]);
        }
        let part = _mm512_add_epi32(_mm512_mullo_epi32(lo, s_even), _mm512_mullo_epi32(hi, s_odd));
        sumi[j] = _mm512_add_epi32(sumi[j], part);
    }
}

/// One group of sixteen Q4_K (`Q5 = false`) or Q5_K rows × `J` activation
/// rows, with `S` partial sums per row and nibble half.
///
/// Lanes16 vectors of a block: 0 `(d, dmin)`, 1–3 the scale words; Q4_K's
/// codes from vector 4 (chunk `c`: vectors `4 + 8c ..`), Q5_K's fifth bits
/// `qh` in vectors 4–11 and its codes from vector 12. Q4_K's high nibbles
/// stay in place (16× the code, meeting the low ones' `16·sc`, one shift
/// back); Q5_K's codes are built whole (nibble | fifth bit << 4).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn tile_k45<const J: usize, const S: usize, const Q5: bool>(
    nb: usize,
    w: *const u8,
    a: *const u8,
    a_stride: usize,
    y: *mut f32,
    y_stride: usize,
) {
    let block = ROWS * if Q5 { 176 } else { 144 };
    let codes = if Q5 { 768 } else { 256 };
    let low6 = _mm512_set1_epi8(0x3F);
    let low4 = _mm512_set1_epi8(0x0F);
    let high4 = _mm512_set1_epi8(0xF0u8 as i8);
    let top2 = _mm512_set1_epi8(0x03);
    let p = picks();
    let mut sums = [_mm512_setzero_ps(); J];
    for b in 0..nb {
        let x = w.add(b * block);
        let ahead = x.wrapping_add(PREFETCH_AHEAD);
        for l in 0..4 {
            if Q5 {
                prefetch_l2(ahead.wrapping_add(64 * l));
            } else {
                prefetch_in_order(ahead.wrapping_add(64 * l));
            }
        }
        let act: [*const u8; J] = std::array::from_fn(|j| a.add(j * a_stride + b * Q8K_BYTES));
        // Vector 0: (d, dmin) per lane; vectors 1..3: the scale words a, b, c.
        let (d, dmin) = d_dmin(ld(x));
        let (sa, sb, sc) = (ld(x.add(64)), ld(x.add(128)), ld(x.add(192)));
        let top = |v: __m512i| _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(v), top2));
        let sc_lo = _mm512_and_si512(sa, low6);
        let sc_hi = _mm512_or_si512(_mm512_and_si512(sc, low4), top(sa));
        let m_lo = _mm512_and_si512(sb, low6);
        let m_hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32::<4>(sc), low4), top(sb));
        let mut sumi = [_mm512_setzero_si512(); J];
        let k = ChunkArgs { x, ahead, codes, act, sc: [sc_lo, sc_hi], p: &p, low4, high4 };
        k45_chunk::<J, S, Q5, 0>(&k, &mut sumi);
        k45_chunk::<J, S, Q5, 1>(&k, &mut sumi);
        k45_chunk::<J, S, Q5, 2>(&k, &mut sumi);
        k45_chunk::<J, S, Q5, 3>(&k, &mut sumi);
        let mut summ = [_mm512_setzero_si512(); J];
        for t in 0..8 {
            let mp = _mm512_shuffle_epi8(if t < 4 { m_lo } else { m_hi }, p.pair[t % 4]);
            for j in 0..J {
                summ[j] = _mm512_dpwssd_epi32(summ[j], mp, bcast4(act[j].add(Q8K_BSUMS + 4 * t)));
            }
        }
        for j in 0..J {
            let isum = if Q5 { sumi[j] } else { _mm512_srai_epi32::<4>(sumi[j]) };
            sums[j] = combine(sums[j], act[j], d, dmin, isum, summ[j]);
        }
    }
    for (j, s) in sums.iter().enumerate() {
        _mm512_storeu_ps(y.add(j * y_stride), *s);
    }
}

/// `sum + (d·d_a)·isum`, the scalar references' float step for the types
/// with one scale per block (Q6_K, Q3_K, IQ4_XS), `d_a` the f32 at `act`.
#[inline(always)]
pub(super) unsafe fn scaled_add(sum: __m512, d: __m512, act: *const u8, isum: __m512i) -> __m512 {
    let yd = _mm512_set1_ps((act as *const f32).read_unaligned());
    _mm512_add_ps(sum, _mm512_mul_ps(_mm512_mul_ps(d, yd), _mm512_cvtepi32_ps(isum)))
}

/// `vpshufb` controls that put the signed scale bytes `(2t, 2t + 1)` of each
/// dword (`t` = 0, 1) in the high bytes of its two words, for `vpsraw 8`.
#[inline(always)]
pub(super) unsafe fn signed_pairs() -> [__m512i; 2] {
    let pair_hi = |b: i32| {
        let d = |k: i32| (4 * k + b) << 8 | 0x80 | (4 * k + b + 1) << 24 | 0x80 << 16;
        _mm512_broadcast_i32x4(_mm_setr_epi32(d(0), d(1), d(2), d(3)))
    };
    [pair_hi(0), pair_hi(2)]
}

/// `Σ_g sc_g · B_g` over a block's sixteen 16-value groups per lane and
/// activation row: `sv[k]` holds the signed scales of groups `4k..4k+4` as
/// bytes, Q8_K's `bsums` pair `u` meets the scales of groups `(2u, 2u + 1)`
/// (bytes `2(u mod 2)`, +1 of `sv[u / 2]`, sign-extended) in one `vpdpwssd`.
#[inline(always)]
pub(super) unsafe fn group_scale_sums<const J: usize>(
    sv: &[__m512i; 4],
    pairs: &[__m512i; 2],
    act: &[*const u8; J],
) -> [__m512i; J] {
    let mut corr = [_mm512_setzero_si512(); J];
    for u in 0..8 {
        let sp = _mm512_srai_epi16::<8>(_mm512_shuffle_epi8(sv[u / 2], pairs[u % 2]));
        for j in 0..J {
            corr[j] = _mm512_dpwssd_epi32(corr[j], sp, bcast4(act[j].add(Q8K_BSUMS + 4 * u)));
        }
    }
    corr
}

rows16_kernel!(
    /// [`rows16_q4_k`] for Q6_K, each result equal to `quant::q6_k::vec_dot`.
    rows16_q6_k,
    tile_q6_k
);

/// `vpshufb` control: byte `t` of each dword to its top byte (the rest zero),
/// so that an arithmetic shift right by 24 sign-extends it.
#[inline(always)]
unsafe fn top_byte(t: usize) -> __m512i {
    let d = |k: i32| (((4 * k + t as i32) << 24) as u32 | 0x0080_8080) as i32;
    _mm512_broadcast_i32x4(_mm_setr_epi32(d(0), d(1), d(2), d(3)))
}

/// One group of sixteen Q6_K rows × `J` activation rows, with `S` partial
/// sums per 16-value group and row.
///
/// Lanes16 vectors of a 210-byte block: 0–31 `ql` (`ql[4v..4v+4]`), 32–47
/// `qh`, 48–51 the sixteen i8 scales, then the sixteen rows' `d` (f16) as a
/// 32-byte tail. Half `h`, word `t` (`l = 4t..4t+4`): `A = ql[64h + l]`, `B =
/// ql[64h + 32 + l]`, `H = qh[32h + l]` give the unsigned codes of values
/// `128h + {0, 32, 64, 96} + l` (nibble | two bits of `H` << 4); a group's
/// `Σ q·a` meets its scale, and `32·Σ sc·B` (the codes' offset) comes back
/// out through Q8_K's `bsums` pairs.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn tile_q6_k<const J: usize, const S: usize>(
    nb: usize,
    w: *const u8,
    a: *const u8,
    a_stride: usize,
    y: *mut f32,
    y_stride: usize,
) {
    const BLOCK: usize = ROWS * 210;
    let low4 = _mm512_set1_epi8(0x0F);
    let bits45 = _mm512_set1_epi8(0x30);
    let tops = [top_byte(0), top_byte(1), top_byte(2), top_byte(3)];
    let pairs = signed_pairs();
    let mut sums = [_mm512_setzero_ps(); J];
    for b in 0..nb {
        let x = w.add(b * BLOCK);
        let ahead = x.wrapping_add(PREFETCH_AHEAD);
        for l in 48..BLOCK.div_ceil(64) {
            prefetch_in_order(ahead.wrapping_add(64 * l));
        }
        let act: [*const u8; J] = std::array::from_fn(|j| a.add(j * a_stride + b * Q8K_BYTES));
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(x.add(52 * 64) as *const __m256i));
        let sv: [__m512i; 4] = std::array::from_fn(|k| ld(x.add(64 * (48 + k))));
        let mut sumi = [_mm512_setzero_si512(); J];
        for h in 0..2 {
            for quarter in 0..2 {
                // Groups 8h + quarter + 2k (k = 0..4): words t = 4·quarter + tt.
                let mut parts = [[[_mm512_setzero_si512(); J]; S]; 4];
                for tt in 0..4 {
                    let t = 4 * quarter + tt;
                    for l in [16 * h + t, 16 * h + 8 + t, 32 + 8 * h + t] {
                        prefetch_in_order(ahead.wrapping_add(64 * l));
                    }
                    let va = ld(x.add(64 * (16 * h + t)));
                    let vb = ld(x.add(64 * (16 * h + 8 + t)));
                    let vh = ld(x.add(64 * (32 + 8 * h + t)));
                    let q = [
                        _mm512_or_si512(
                            _mm512_and_si512(va, low4),
                            _mm512_and_si512(_mm512_slli_epi16::<4>(vh), bits45),
                        ),
                        _mm512_or_si512(
                            _mm512_and_si512(vb, low4),
                            _mm512_and_si512(_mm512_slli_epi16::<2>(vh), bits45),
                        ),
                        _mm512_or_si512(
                            _mm512_and_si512(_mm512_srli_epi16::<4>(va), low4),
                            _mm512_and_si512(vh, bits45),
                        ),
                        _mm512_or_si512(
                            _mm512_and_si512(_mm512_srli_epi16::<4>(vb), low4),
                            _mm512_and_si512(_mm512_srli_epi16::<2>(vh), bits45),
                        ),
                    ];
                    for (k, qk) in q.iter().enumerate() {
                        for j in 0..J {
                            let y0 = act[j].add(Q8K_QS + 128 * h + 32 * k + 4 * t);
                            let p = &mut parts[k][tt % S][j];
                            *p = _mm512_dpbusd_epi32(*p, *qk, bcast4(y0));
                        }
                    }
                }
                for (k, part) in parts.iter().enumerate() {
                    let g = 8 * h + quarter + 2 * k;
                    let sc = _mm512_srai_epi32::<24>(_mm512_shuffle_epi8(sv[g / 4], tops[g % 4]));
                    for j in 0..J {
                        let acc = (1..S).fold(part[0][j], |t, k| _mm512_add_epi32(t, part[k][j]));
                        sumi[j] = _mm512_add_epi32(sumi[j], _mm512_mullo_epi32(acc, sc));
                    }
                }
            }
        }
        let corr = group_scale_sums(&sv, &pairs, &act);
        for j in 0..J {
            let isum = _mm512_sub_epi32(sumi[j], _mm512_slli_epi32::<5>(corr[j]));
            sums[j] = scaled_add(sums[j], d, act[j], isum);
        }
    }
    for (j, s) in sums.iter().enumerate() {
        _mm512_storeu_ps(y.add(j * y_stride), *s);
    }
}

/// A Q3_K lanes16 block's sixteen `d` (f16 tail at vector 27) and its
/// sixteen 6-bit scales − 32 as bytes (vector `k`, byte `b`: group `4k + b`
/// of the lane's row), decoded from the three scale words as
/// `quant::q3_k` does.
#[inline(always)]
pub(super) unsafe fn q3_k_scales(x: *const u8) -> (__m512, [__m512i; 4]) {
    let (low4, three) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(3));
    let d = _mm512_cvtph_ps(_mm256_loadu_si256(x.add(27 * 64) as *const __m256i));
    let (v24, v25, v26) = (ld(x.add(24 * 64)), ld(x.add(25 * 64)), ld(x.add(26 * 64)));
    let lows = [
        _mm512_and_si512(v24, low4),
        _mm512_and_si512(v25, low4),
        _mm512_and_si512(_mm512_srli_epi16::<4>(v24), low4),
        _mm512_and_si512(_mm512_srli_epi16::<4>(v25), low4),
    ];
    let highs = [v26, _mm512_srli_epi16::<2>(v26), _mm512_srli_epi16::<4>(v26), _mm512_srli_epi16::<6>(v26)];
    let sv = std::array::from_fn(|k| {
        let hi = _mm512_slli_epi16::<4>(_mm512_and_si512(highs[k], three));
        _mm512_sub_epi8(_mm512_or_si512(lows[k], hi), _mm512_set1_epi8(32))
    });
    (d, sv)
}

rows16_kernel!(
    /// [`rows16_q4_k`] for Q3_K, each result equal to `quant::q3_k::vec_dot`.
    rows16_q3_k,
    tile_q3_k
);

/// One group of sixteen Q3_K rows × `J` activation rows (`S` unused: each
/// sub-step already has four independent chains per row).
///
/// Lanes16 vectors of a 110-byte block: 0–7 `hmask`, 8–23 `qs`, 24–26 the
/// scale words, then the sixteen rows' `d` (f16) as a 32-byte tail. Value
/// `128h + 32j + l` has the low bits `(qs[32h + l] >> 2j) & 3` and the high
/// bit `hmask[l] >> (4h + j)`; its code is `lo + 4·hi − 4`. Both parts are
/// masked in place (`4^j · lo`, `2^(4h+j) · hi`, each fits a byte) and meet
/// the activations in their own `vpdpbusd`; shifting them to a common `64 ·
/// Σ (lo + 4·hi)·a` before the scale, the offset `−4·B` through the `bsums`
/// pairs and one shift back give the reference's integer sum exactly
/// (at most 64 · 16 · 32 · 7 · 127 · 16 < 2³¹).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn tile_q3_k<const J: usize, const S: usize>(
    nb: usize,
    w: *const u8,
    a: *const u8,
    a_stride: usize,
    y: *mut f32,
    y_stride: usize,
) {
    const BLOCK: usize = ROWS * 110;
    let tops = [top_byte(0), top_byte(1), top_byte(2), top_byte(3)];
    let pairs = signed_pairs();
    let mut sums = [_mm512_setzero_ps(); J];
    for b in 0..nb {
        let x = w.add(b * BLOCK);
        let ahead = x.wrapping_add(PREFETCH_AHEAD);
        for l in 0..8 {
            prefetch_in_order(ahead.wrapping_add(64 * l));
        }
        for l in 24..BLOCK.div_ceil(64) {
            prefetch_in_order(ahead.wrapping_add(64 * l));
        }
        let act: [*const u8; J] = std::array::from_fn(|j| a.add(j * a_stride + b * Q8K_BYTES));
        let (d, sv) = q3_k_scales(x);
        let mut sumi = [_mm512_setzero_si512(); J];
        for h in 0..2 {
            if h == 0 {
                for l in 8..24 {
                    prefetch_in_order(ahead.wrapping_add(64 * l));
                }
            }
            for jb in 0..4 {
                let lo_mask = _mm512_set1_epi8(3 << (2 * jb));
                let hi_mask = _mm512_set1_epi8((1u8 << (4 * h + jb)) as i8);
                // [half of t][row]: groups 8h + 2jb and 8h + 2jb + 1.
                let mut lo_acc = [[_mm512_setzero_si512(); J]; 2];
                let mut hi_acc = [[_mm512_setzero_si512(); J]; 2];
                for t in 0..8 {
                    let q = ld(x.add(64 * (8 + 8 * h + t)));
                    let m = ld(x.add(64 * t));
                    let (lo, hi) = (_mm512_and_si512(q, lo_mask), _mm512_and_si512(m, hi_mask));
                    for j in 0..J {
                        let ya = bcast4(act[j].add(Q8K_QS + 128 * h + 32 * jb + 4 * t));
                        lo_acc[t / 4][j] = _mm512_dpbusd_epi32(lo_acc[t / 4][j], lo, ya);
                        hi_acc[t / 4][j] = _mm512_dpbusd_epi32(hi_acc[t / 4][j], hi, ya);
                    }
                }
                // To 64·Σ(lo + 4·hi)·a: lo was 4^jb·lo, hi 2^(4h+jb)·hi.
                let lo_shift = _mm_cvtsi32_si128(6 - 2 * jb as i32);
                let hi_shift = _mm_cvtsi32_si128(8 - 4 * h as i32 - jb as i32);
                for half in 0..2 {
                    let g = 8 * h + 2 * jb + half;
                    let sc = _mm512_srai_epi32::<24>(_mm512_shuffle_epi8(sv[g / 4], tops[g % 4]));
                    for j in 0..J {
                        let comb = _mm512_add_epi32(
                            _mm512_sll_epi32(lo_acc[half][j], lo_shift),
                            _mm512_sll_epi32(hi_acc[half][j], hi_shift),
                        );
                        sumi[j] = _mm512_add_epi32(sumi[j], _mm512_mullo_epi32(comb, sc));
                    }
                }
            }
        }
        // 64 · 4 · Σ sc·B, the codes' offset.
        let corr = group_scale_sums(&sv, &pairs, &act);
        for j in 0..J {
            let isum = _mm512_srai_epi32::<6>(_mm512_sub_epi32(sumi[j], _mm512_slli_epi32::<8>(corr[j])));
            sums[j] = scaled_add(sums[j], d, act[j], isum);
        }
    }
    for (j, s) in sums.iter().enumerate() {
        _mm512_storeu_ps(y.add(j * y_stride), *s);
    }
}
