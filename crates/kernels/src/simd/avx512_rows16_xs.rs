//! AVX-512 VNNI sixteen-row kernel for IQ4_XS in the transposed layout of
//! [`crate::packed::lanes16`] (lane `ℓ` of every vector is weight row `ℓ`).
//!
//! Two paths, one arithmetic:
//! * up to [`STREAM_MAX`] activation rows, [`tile_iq4_xs`] streams the
//!   group's super-blocks and looks its codes up again for each tile of
//!   [`ACTS`] rows (decode: the memory-bound path);
//! * above it, each super-block of the group is looked up once
//!   ([`decode_block`]: 64 vectors of `K[q] + 128`, the eight sub-block
//!   scales and their word pairs, 5 KiB that stay in L1) and every tile of
//!   activation rows runs over it ([`super::avx512_rows16_dec`]) with nothing
//!   but loads, `vpdpbusd` and one `vpmulld` per sub-block. Streaming, the
//!   per-sub-block decode and
//!   scale work (about 30 vector ops shared by four rows) kept the ports
//!   busy beside the 32 products; decoded once, the products are most of
//!   the work (figures in that module's docs).
//!
//! Each nibble looks up `K[q] + 128` (one `vpshufb`, unsigned for
//! `vpdpbusd`); the `128·Σa` that adds comes back out through Q8_K's
//! `bsums`: `isum = Σ ls'·S − 128·Σ ls'·B`, `ls' = ls − 32`.
//!
//! Numerics: the integer sums are exact and the float step is the scalar
//! reference's (`quant::iq4_xs::vec_dot`: `sum + (d·d_a)·isum`, no FMA,
//! super-blocks in order, from `0.0`), so every row equals the reference bit
//! for bit at every batch size and on both paths.

use super::avx512_rows16_dec::{all_acts, DecodedBlock};
use super::avx512_rows16_k::{
    bcast4, ld, prefetch_l2, rows16_kernel, scaled_add, ACTS, PREFETCH_AHEAD, Q8K_BSUMS, Q8K_BYTES, Q8K_QS, ROWS,
};
use std::arch::x86_64::*;

/// Bytes of one IQ4_XS super-block of sixteen rows (136 a row).
const BLOCK: usize = ROWS * 136;

/// Most activation rows that stream the group (tiles of [`ACTS`]) instead
/// of decoding each super-block once: same bench as the module docs, Zen 5,
/// streamed / decoded once, tok/s: m = 16 540 / 455, m = 32 552 / 517,
/// m = 64 562 / 585, m = 128 572 / 624, m = 256 594 / 640.
const STREAM_MAX: usize = 48;

/// `rows` (a multiple of 16) IQ4_XS rows in the lanes16 layout × `m` Q8_K
/// activation rows (see [`crate::quant::Rows16Fn`]): `y[j·y_stride + r] =
/// row r · act j`, each equal to `quant::iq4_xs::vec_dot`.
///
/// # Safety
/// A CPU with AVX-512 F/BW/VL/VNNI; `w` holds `rows / 16` lanes16 groups of
/// `row_bytes` per row (`n` a multiple of 256); `a` holds `m` Q8_K rows of
/// `n` values `a_stride` bytes apart; `y` valid for the writes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn rows16_iq4_xs(
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
    if m <= STREAM_MAX {
        return stream_iq4_xs(n, w, row_bytes, rows, a, a_stride, m, y, y_stride);
    }
    debug_assert!(rows.is_multiple_of(ROWS) && n.is_multiple_of(256));
    let mut blk = DecodedBlock::zeroed();
    for g in 0..rows / ROWS {
        let gw = w.add(g * ROWS * row_bytes);
        for b in 0..n / 256 {
            decode_block(gw.add(b * BLOCK), &mut blk);
            all_acts::<8>(&blk, b == 0, a.add(b * Q8K_BYTES), a_stride, m, y.add(g * ROWS), y_stride);
        }
    }
}

rows16_kernel!(
    /// [`rows16_iq4_xs`] streaming the super-blocks (its batches of up to
    /// [`STREAM_MAX`] rows), in tiles of up to [`ACTS`] activation rows.
    stream_iq4_xs,
    tile_iq4_xs
);

/// The `vpshufb` table `K[q] + 128` in every 128-bit lane.
#[inline(always)]
unsafe fn k128_table() -> __m512i {
    let mut k128 = [0u8; 16];
    for (k, v) in k128.iter_mut().zip(crate::quant::iq4_nl::KVALUES) {
        *k = (v as i16 + 128) as u8;
    }
    _mm512_broadcast_i32x4(_mm_loadu_si128(k128.as_ptr() as *const __m128i))
}

/// `ls − 32` per lane of sub-block `ib` and the `(ls', ls')` word pair:
/// low four bits from `scales_l` (byte ib / 2, nibble ib % 2), high two
/// from `scales_h` (bits 2ib, 2ib + 1), as the scalar code builds them.
#[inline(always)]
unsafe fn sub_scale(sl: __m512i, sh: __m512i, ib: usize) -> (__m512i, __m512i) {
    let lo4 = _mm512_and_si512(_mm512_srlv_epi32(sl, _mm512_set1_epi32(4 * ib as i32)), _mm512_set1_epi32(15));
    let hi2 = _mm512_and_si512(_mm512_srlv_epi32(sh, _mm512_set1_epi32(2 * ib as i32)), _mm512_set1_epi32(3));
    let ls = _mm512_sub_epi32(_mm512_or_si512(lo4, _mm512_slli_epi32::<4>(hi2)), _mm512_set1_epi32(32));
    let pair = _mm512_or_si512(_mm512_and_si512(ls, _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32::<16>(ls));
    (ls, pair)
}

/// Decodes the super-block of sixteen rows at `x` into `blk`: code vector
/// `4ib + u` (values `32ib + 4u..` in its low nibbles, `32ib + 16 + 4u..` in
/// its high ones) gives `q[8ib + u]` and `q[8ib + 4 + u]`; `c[ib]` is
/// `(128·ls', 128·ls')` (the codes' offset against `bsums` pair `ib`).
#[inline(always)]
unsafe fn decode_block(x: *const u8, blk: &mut DecodedBlock) {
    let low4 = _mm512_set1_epi8(0x0F);
    let table = k128_table();
    let ahead = x.wrapping_add(PREFETCH_AHEAD);
    let v0 = ld(x);
    blk.d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v0));
    let (sh, sl) = (_mm512_srli_epi32::<16>(v0), ld(x.add(64)));
    for ib in 0..8 {
        let (ls, pair) = sub_scale(sl, sh, ib);
        (blk.sc[ib], blk.c[ib]) = (ls, _mm512_slli_epi16::<7>(pair));
        for u in 0..4 {
            let off = 128 + 256 * ib + 64 * u;
            prefetch_l2(ahead.wrapping_add(off));
            let q = ld(x.add(off));
            blk.q[8 * ib + u] = _mm512_shuffle_epi8(table, _mm512_and_si512(q, low4));
            blk.q[8 * ib + 4 + u] = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16::<4>(q), low4));
        }
    }
}

/// One group of sixteen IQ4_XS rows × `J` activation rows, streaming its
/// super-blocks, with `S` partial sums per sub-block and row.
///
/// Lanes16 vectors of a 136-byte block: 0 `(d, scales_h)`, 1 `scales_l`,
/// 2 + 4·ib + u the codes `qs[16ib + 4u..+4]` (low nibbles: values `32ib +
/// 4u..`, high: `32ib + 16 + 4u..`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn tile_iq4_xs<const J: usize, const S: usize>(
    nb: usize,
    w: *const u8,
    a: *const u8,
    a_stride: usize,
    y: *mut f32,
    y_stride: usize,
) {
    let low4 = _mm512_set1_epi8(0x0F);
    let table = k128_table();
    let mut sums = [_mm512_setzero_ps(); J];
    for b in 0..nb {
        let x = w.add(b * BLOCK);
        let ahead = x.wrapping_add(PREFETCH_AHEAD);
        prefetch_l2(ahead);
        prefetch_l2(ahead.wrapping_add(64));
        let act: [*const u8; J] = std::array::from_fn(|j| a.add(j * a_stride + b * Q8K_BYTES));
        let v0 = ld(x);
        let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v0));
        let (sh, sl) = (_mm512_srli_epi32::<16>(v0), ld(x.add(64)));
        let mut sumi = [_mm512_setzero_si512(); J];
        let mut corr = [_mm512_setzero_si512(); J];
        for ib in 0..8 {
            let mut parts = [[_mm512_setzero_si512(); J]; S];
            for u in 0..4 {
                let off = 128 + 256 * ib + 64 * u;
                prefetch_l2(ahead.wrapping_add(off));
                let q = ld(x.add(off));
                let lo = _mm512_shuffle_epi8(table, _mm512_and_si512(q, low4));
                let hi = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16::<4>(q), low4));
                for j in 0..J {
                    let y0 = act[j].add(Q8K_QS + 32 * ib + 4 * u);
                    let p = &mut parts[u % S][j];
                    *p = _mm512_dpbusd_epi32(*p, lo, bcast4(y0));
                    *p = _mm512_dpbusd_epi32(*p, hi, bcast4(y0.add(16)));
                }
            }
            let (ls, ls_pair) = sub_scale(sl, sh, ib);
            for j in 0..J {
                let acc = (1..S).fold(parts[0][j], |t, k| _mm512_add_epi32(t, parts[k][j]));
                sumi[j] = _mm512_add_epi32(sumi[j], _mm512_mullo_epi32(acc, ls));
                corr[j] = _mm512_dpwssd_epi32(corr[j], ls_pair, bcast4(act[j].add(Q8K_BSUMS + 4 * ib)));
            }
        }
        for j in 0..J {
            let isum = _mm512_sub_epi32(sumi[j], _mm512_slli_epi32::<7>(corr[j]));
            sums[j] = scaled_add(sums[j], d, act[j], isum);
        }
    }
    for (j, s) in sums.iter().enumerate() {
        _mm512_storeu_ps(y.add(j * y_stride), *s);
    }
}
