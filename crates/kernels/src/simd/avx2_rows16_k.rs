//! AVX2 sixteen-row kernels for the super-block types in the transposed
//! layout of [`crate::packed::lanes16`] (IQ4_XS, Q2_K): the 256-bit siblings of
//! [`super::avx512_rows16_k`] for CPUs without AVX-512. Lane `ℓ` of the low
//! vector is weight row `ℓ`, of the high one row `8 + ℓ` (the low and high
//! 32 bytes of each of the layout's 64-byte vectors).
//!
//! Why: the one-row AVX2 IQ4_XS kernel read 12 GB/s of weights a core in
//! cache and from memory alike (compute bound), and two threads decoded a
//! 1.1B IQ4_XS file at 56% of the bandwidth. With rows in the lanes each
//! `vpshufb` and product covers 64 values of eight rows, the sub-block scale
//! is a per-lane word pair, and the float step is one per eight rows and
//! super-block; there are no horizontal sums.
//!
//! Per super-block of sixteen rows (2176 bytes), half `h` and activation
//! row (IQ4_XS):
//! * vector 0 holds `(d, scales_h)` of each row, vector 1 `scales_l`; the
//!   sub-block scale `ls − 32` of each lane is built as the scalar code
//!   builds it and laid out as the word pair `(ls', ls')`;
//! * vector `2 + 4ib + u` holds codes `qs[16ib + 4u..+4]` of each row: low
//!   nibbles values `32ib + 4u..`, high nibbles `32ib + 16 + 4u..`. Without
//!   VNNI the product is `vpmaddubsw` (unsigned × signed into i16 pairs), so
//!   each nibble looks up `|K[q]|` and `K[q]` (two `vpshufb`) and the four
//!   activation bytes broadcast from memory take the weight's sign
//!   (`vpsignb`; no `K` is 0): pairs ≤ 2·127·127 < 2¹⁵;
//! * `vpmaddwd` against the scale pair widens and scales in one step, so
//!   each lane sums `Σ_ib ls'·Σ K·a` directly (≤ 2²⁷ in magnitude).
//!
//! IQ4_XS takes every batch size (above `ACTS` rows over super-blocks
//! decoded once a group: 1.3× the GEMM reading the packed rows back, at a
//! 1.1B layer's m = 256); Q2_K leaves batches of
//! [`super::avx2_gemm_k::MIN_M`] rows and more to the GEMM.
//!
//! With AVX-VNNI (the `_vnni` kernels) a product is one `vpdpbusd` (u8 × i8
//! into i32, no saturation), as at AVX-512: IQ4_XS looks up `K[q] + 128` once
//! and takes `128·Σ ls'·B` back out through Q8_K's `bsums`; Q2_K's codes are
//! masked in place (`4^jb ·` code) and meet `sc · 4^(3 − jb)`, so the total is
//! `64·Σ sc·S`. The scales then meet each sub-block's i32 sum in `vpmulld`.
//! The kernel bodies are `#[inline(always)]` generics over `V` (VNNI or
//! not), inlined into the `#[target_feature]` entry points; they hold no
//! closures around intrinsics (a closure does not get the entry point's
//! features, and its intrinsics would not inline).
//!
//! Numerics: the integer sums are exact and the float step is the scalar
//! reference's (`quant::iq4_xs::vec_dot`: `sum + (d·d_a)·isum`, no FMA,
//! super-blocks in order), so every row equals the reference bit for bit at
//! every batch size.

use super::avx2_k::ld;
use super::avx2_rows16_q2k::tile_q2_k_halves;
use super::avx512_rows16_k::{prefetch_l2, PREFETCH_AHEAD};
use std::arch::x86_64::*;

/// Rows per group (the lanes of two vectors).
const ROWS: usize = 16;
/// Activation rows per register tile.
const ACTS: usize = 2;
/// Q8_K row layout: `d` (f32) at 0, 256 codes at 4; 292 bytes a block.
pub(super) const Q8K_QS: usize = 4;
pub(super) const Q8K_BSUMS: usize = 260;
pub(super) const Q8K_BYTES: usize = 292;

/// Four bytes at `p` in every lane.
#[inline(always)]
pub(super) unsafe fn bcast4(p: *const u8) -> __m256i {
    _mm256_set1_epi32((p as *const i32).read_unaligned())
}

/// `|K[q]|`, `K[q]` and `K[q] + 128` for each IQ4 nibble `q`.
static IQ4_ABS: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut q = 0;
    while q < 16 {
        t[q] = crate::quant::iq4_nl::KVALUES[q].unsigned_abs();
        q += 1;
    }
    t
};
static IQ4_K: [i8; 16] = crate::quant::iq4_nl::KVALUES;
static IQ4_K128: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut q = 0;
    while q < 16 {
        t[q] = (crate::quant::iq4_nl::KVALUES[q] as u8) ^ 0x80;
        q += 1;
    }
    t
};

/// The IQ4 lookup tables in both halves: `(|K[q]|, K[q])`, or with `V`
/// `(K[q] + 128, unused)`.
#[inline(always)]
unsafe fn iq4_tables<const V: bool>() -> (__m256i, __m256i) {
    let (a, b) =
        if V { (IQ4_K128.as_ptr(), IQ4_K128.as_ptr()) } else { (IQ4_ABS.as_ptr(), IQ4_K.as_ptr() as *const u8) };
    (
        _mm256_broadcastsi128_si256(_mm_loadu_si128(a as *const __m128i)),
        _mm256_broadcastsi128_si256(_mm_loadu_si128(b as *const __m128i)),
    )
}

/// The `Rows16Fn` entry point `$name` (target features `$features`) that
/// runs `$tile::<J, $v>` over every sixteen-row group and tile of up to
/// `ACTS` activation rows.
macro_rules! rows16_avx2 {
    ($(#[$doc:meta])* $name:ident, $tile:ident, $features:literal, $v:literal) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// A CPU with the target features below; `w` holds `rows / 16`
        /// lanes16 groups of `row_bytes` per row (`n` a multiple of 256); `a`
        /// holds `m` Q8_K rows of `n` values `a_stride` bytes apart; `y` valid
        /// for the writes.
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
                        1 => $tile::<1, $v>(nb, gw, aj, a_stride, yj, y_stride),
                        _ => $tile::<ACTS, $v>(nb, gw, aj, a_stride, yj, y_stride),
                    }
                    j += take;
                }
            }
        }
    };
}

rows16_avx2!(
    /// `rows` (a multiple of 16) Q2_K rows in the lanes16 layout × `m` Q8_K
    /// activation rows (see [`crate::quant::Rows16Fn`]): `y[j·y_stride + r] =
    /// row r · act j`, each equal to `quant::q2_k::vec_dot`.
    rows16_q2_k,
    tile_q2_k_halves,
    "avx2,fma,f16c",
    false
);

rows16_avx2!(
    /// [`rows16_q2_k`] with AVX-VNNI.
    rows16_q2_k_vnni,
    tile_q2_k,
    "avx2,fma,f16c,avxvnni",
    true
);

/// `rows` (a multiple of 16) IQ4_XS rows in the lanes16 layout × `m` Q8_K
/// activation rows (see [`crate::quant::Rows16Fn`]): `y[j·y_stride + r] =
/// row r · act j`, each equal to `quant::iq4_xs::vec_dot`.
///
/// Up to `STREAM_MAX` activation rows stream the group in tiles of `ACTS`
/// rows, decoding each super-block as they go; more first decode the
/// group's super-blocks once (`XsBlock`, 8.6 KiB each, in L2) and run tiles
/// of `TILE_ACTS` rows over both halves at once. The arithmetic is the same
/// either way.
///
/// # Safety
/// AVX2/FMA/F16C CPU; `w` holds `rows / 16` lanes16 groups of `row_bytes`
/// per row (`n` a multiple of 256); `a` holds `m` Q8_K rows of `n` values
/// `a_stride` bytes apart; `y` valid for the writes.
#[target_feature(enable = "avx2,fma,f16c")]
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
    iq4_xs_body::<false>(n, w, row_bytes, rows, a, a_stride, m, y, y_stride)
}

/// [`rows16_iq4_xs`] with AVX-VNNI.
///
/// # Safety
/// As [`rows16_iq4_xs`], and the CPU has AVX-VNNI.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn rows16_iq4_xs_vnni(
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
    iq4_xs_body::<true>(n, w, row_bytes, rows, a, a_stride, m, y, y_stride)
}

/// The body of both IQ4_XS kernels.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn iq4_xs_body<const V: bool>(
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
    // Taken out of its cell for the call (no closure around the kernel code).
    let mut scratch = XS_SCRATCH.with(|c| std::mem::take(&mut *c.borrow_mut()));
    for g in 0..rows / ROWS {
        let gw = w.add(g * ROWS * row_bytes);
        let yg = y.add(g * ROWS);
        if m <= STREAM_MAX {
            let mut j = 0;
            while j < m {
                let take = (m - j).min(ACTS);
                let (aj, yj) = (a.add(j * a_stride), yg.add(j * y_stride));
                match take {
                    1 => tile_iq4_xs::<1, V>(nb, gw, aj, a_stride, yj, y_stride),
                    _ => tile_iq4_xs::<ACTS, V>(nb, gw, aj, a_stride, yj, y_stride),
                }
                j += take;
            }
            continue;
        }
        scratch.clear();
        for b in 0..nb {
            scratch.push(decode_iq4_xs::<V>(gw.add(b * ROWS * 136)));
        }
        // Both halves at once: each activation broadcast feeds two products.
        // With AVX-VNNI each row of a tile holds six accumulators, so its
        // tiles are two rows.
        let tile = if V { 2 } else { TILE_ACTS };
        let mut j = 0;
        while j < m {
            let take = (m - j).min(tile);
            let (aj, yj) = (a.add(j * a_stride), yg.add(j * y_stride));
            match take {
                1 => decoded_iq4_xs::<1, V>(&scratch, aj, a_stride, yj, y_stride),
                2 => decoded_iq4_xs::<2, V>(&scratch, aj, a_stride, yj, y_stride),
                3 => decoded_iq4_xs::<3, V>(&scratch, aj, a_stride, yj, y_stride),
                _ => decoded_iq4_xs::<TILE_ACTS, V>(&scratch, aj, a_stride, yj, y_stride),
            }
            j += take;
        }
    }
    XS_SCRATCH.with(|c| *c.borrow_mut() = scratch);
}

/// Activation rows per tile over decoded super-blocks (both halves).
const TILE_ACTS: usize = 4;

/// Most activation rows that stream the group in tiles of `ACTS` instead of
/// decoding its super-blocks once: a decoded super-block is 8.6 KiB (four
/// times the packed bytes), so at small batches reading it back cost more
/// than decoding again. `HIDDEN=2048 FFN=5632 KV=256 LAYERS=22 VOCAB=0
/// WDTYPE=IQ4_XS PACKED=1 bench_matmul 2 M` on the Zen 3 VM, three runs:
/// decoded once m = 4 ran 29–34 tok/s and m = 8 54–58, where m = 2 streamed
/// 54–64; m = 16 decoded once 63.
const STREAM_MAX: usize = 8;

thread_local! {
    /// The current group's IQ4_XS super-blocks, decoded once (batches above `ACTS`).
    static XS_SCRATCH: std::cell::RefCell<Vec<XsBlock>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// One IQ4_XS super-block of sixteen rows, decoded: per half `h`, `abs[h]` /
/// `sgn[h]` the looked-up `|K[q]|` / `K[q]` (with `V`: `K[q] + 128`, and
/// `sgn` unused) of vector `2·(4ib + u) + k` (`k` 0: low nibbles, 1: high),
/// `pair[h][ib]` the `(ls', ls')` words, `d[h]` the half's scales.
#[derive(Clone, Copy)]
struct XsBlock {
    abs: [[__m256i; 64]; 2],
    sgn: [[__m256i; 64]; 2],
    pair: [[__m256i; 8]; 2],
    d: [__m256; 2],
}

/// `(ls', ls')` word pairs of sub-block `ib` per lane, from the half's
/// `scales_l` and `scales_h` words: low four bits from byte ib / 2 (nibble
/// ib % 2), high two from bits 2ib, 2ib + 1, as the scalar code builds them.
#[inline(always)]
unsafe fn iq4_xs_pair(sl: __m256i, sh: __m256i, ib: usize) -> __m256i {
    let lo4 = _mm256_and_si256(_mm256_srlv_epi32(sl, _mm256_set1_epi32(4 * ib as i32)), _mm256_set1_epi32(15));
    let hi2 = _mm256_and_si256(_mm256_srlv_epi32(sh, _mm256_set1_epi32(2 * ib as i32)), _mm256_set1_epi32(3));
    let ls = _mm256_or_si256(lo4, _mm256_slli_epi32::<4>(hi2));
    _mm256_sub_epi16(_mm256_or_si256(ls, _mm256_slli_epi32::<16>(ls)), _mm256_set1_epi16(32))
}

/// The super-block of sixteen rows at `x`, decoded.
#[inline(always)]
unsafe fn decode_iq4_xs<const V: bool>(x: *const u8) -> XsBlock {
    let low4 = _mm256_set1_epi8(0x0F);
    let (abs_t, sgn_t) = iq4_tables::<V>();
    let mut blk: XsBlock = std::mem::zeroed();
    for h in 0..2 {
        let v0 = ld(x.add(32 * h));
        blk.d[h] = f16_pairs(v0).0;
        let (sh, sl) = (_mm256_srli_epi32::<16>(v0), ld(x.add(64 + 32 * h)));
        for ib in 0..8 {
            blk.pair[h][ib] = iq4_xs_pair(sl, sh, ib);
            for u in 0..4 {
                let q = ld(x.add(128 + 256 * ib + 64 * u + 32 * h));
                let lo = _mm256_and_si256(q, low4);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), low4);
                let k = 2 * (4 * ib + u);
                blk.abs[h][k] = _mm256_shuffle_epi8(abs_t, lo);
                blk.abs[h][k + 1] = _mm256_shuffle_epi8(abs_t, hi);
                if !V {
                    blk.sgn[h][k] = _mm256_shuffle_epi8(sgn_t, lo);
                    blk.sgn[h][k + 1] = _mm256_shuffle_epi8(sgn_t, hi);
                }
            }
        }
    }
    blk
}

/// `Σ w·y` of four values a lane, without VNNI: `|K|` meets the activations
/// signed by `K` in `vpmaddubsw`, and `vpmaddwd` against `pair` scales and
/// widens (the sub-block's scale already applied).
#[inline(always)]
unsafe fn iq4_signed(abs: __m256i, sgn: __m256i, yq: __m256i, pair: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(abs, _mm256_sign_epi8(yq, sgn)), pair)
}

/// The i32 sub-block sum `part` (of `(K + 128)·a`, AVX-VNNI) scaled by the
/// `(ls', ls')` pair into `sumi`, and `ls'·(B_2ib + B_2ib+1)` into `corr`
/// (`bs`: the sub-block's Q8_K `bsums` pair in every lane).
#[inline(always)]
unsafe fn iq4_xs_vnni_scale(sumi: &mut __m256i, corr: &mut __m256i, part: __m256i, pair: __m256i, bs: __m256i) {
    let ls = _mm256_srai_epi32::<16>(pair);
    *sumi = _mm256_add_epi32(*sumi, _mm256_mullo_epi32(part, ls));
    *corr = _mm256_add_epi32(*corr, _mm256_madd_epi16(pair, bs));
}

/// All sixteen rows of a group × `J` activation rows over its decoded
/// super-blocks (the same arithmetic as [`tile_iq4_xs`]): each activation
/// broadcast feeds both halves. (Tiles of one half, which broadcast every
/// activation twice, ran slower on the Zen 3 VM; see
/// [`super::avx2_rows16_nl`].)
#[inline(always)]
unsafe fn decoded_iq4_xs<const J: usize, const V: bool>(
    blocks: &[XsBlock],
    a: *const u8,
    a_stride: usize,
    y: *mut f32,
    y_stride: usize,
) {
    let mut sums = [[_mm256_setzero_ps(); 2]; J];
    for (b, blk) in blocks.iter().enumerate() {
        let act: [*const u8; J] = std::array::from_fn(|j| a.add(j * a_stride + b * Q8K_BYTES));
        let mut sumi = [[_mm256_setzero_si256(); 2]; J];
        let mut corr = [[_mm256_setzero_si256(); 2]; J];
        for ib in 0..8 {
            let mut part = [[_mm256_setzero_si256(); 2]; J];
            for u in 0..4 {
                let k = 2 * (4 * ib + u);
                for j in 0..J {
                    let y0 = act[j].add(Q8K_QS + 32 * ib + 4 * u);
                    let (yl, yh) = (bcast4(y0), bcast4(y0.add(16)));
                    for h in 0..2 {
                        let (la, ha) = (blk.abs[h][k], blk.abs[h][k + 1]);
                        if V {
                            part[j][h] = _mm256_dpbusd_avx_epi32(part[j][h], la, yl);
                            part[j][h] = _mm256_dpbusd_avx_epi32(part[j][h], ha, yh);
                        } else {
                            let pair = blk.pair[h][ib];
                            sumi[j][h] = _mm256_add_epi32(sumi[j][h], iq4_signed(la, blk.sgn[h][k], yl, pair));
                            sumi[j][h] = _mm256_add_epi32(sumi[j][h], iq4_signed(ha, blk.sgn[h][k + 1], yh, pair));
                        }
                    }
                }
            }
            if V {
                for j in 0..J {
                    let bs = bcast4(act[j].add(Q8K_BSUMS + 4 * ib));
                    for h in 0..2 {
                        iq4_xs_vnni_scale(&mut sumi[j][h], &mut corr[j][h], part[j][h], blk.pair[h][ib], bs);
                    }
                }
            }
        }
        for j in 0..J {
            let da = _mm256_set1_ps((act[j] as *const f32).read_unaligned());
            for h in 0..2 {
                let isum =
                    if V { _mm256_sub_epi32(sumi[j][h], _mm256_slli_epi32::<7>(corr[j][h])) } else { sumi[j][h] };
                sums[j][h] =
                    _mm256_add_ps(sums[j][h], _mm256_mul_ps(_mm256_mul_ps(blk.d[h], da), _mm256_cvtepi32_ps(isum)));
            }
        }
    }
    for (j, s) in sums.iter().enumerate() {
        _mm256_storeu_ps(y.add(j * y_stride), s[0]);
        _mm256_storeu_ps(y.add(j * y_stride + 8), s[1]);
    }
}

/// One group of sixteen IQ4_XS rows × `J` activation rows, decoding each
/// super-block as it goes.
#[inline(always)]
unsafe fn tile_iq4_xs<const J: usize, const V: bool>(
    nb: usize,
    w: *const u8,
    a: *const u8,
    a_stride: usize,
    y: *mut f32,
    y_stride: usize,
) {
    const BLOCK: usize = ROWS * 136;
    let low4 = _mm256_set1_epi8(0x0F);
    let (abs_t, sgn_t) = iq4_tables::<V>();
    let mut sums = [[_mm256_setzero_ps(); 2]; J];
    for b in 0..nb {
        let x = w.add(b * BLOCK);
        let ahead = x.wrapping_add(PREFETCH_AHEAD);
        prefetch_l2(ahead);
        prefetch_l2(ahead.wrapping_add(64));
        let act: [*const u8; J] = std::array::from_fn(|j| a.add(j * a_stride + b * Q8K_BYTES));
        for h in 0..2 {
            let v0 = ld(x.add(32 * h));
            // The eight rows' f16 `d` (low words of vector 0) as floats.
            let (d, _) = f16_pairs(v0);
            let (sh, sl) = (_mm256_srli_epi32::<16>(v0), ld(x.add(64 + 32 * h)));
            let mut sumi = [_mm256_setzero_si256(); J];
            let mut corr = [_mm256_setzero_si256(); J];
            for ib in 0..8 {
                let pair = iq4_xs_pair(sl, sh, ib);
                // Two chains per row (low and high nibbles): `vpdpbusd`'s latency.
                let mut part = [_mm256_setzero_si256(); J];
                let mut part_hi = [_mm256_setzero_si256(); J];
                for u in 0..4 {
                    let off = 128 + 256 * ib + 64 * u;
                    if h == 0 {
                        prefetch_l2(ahead.wrapping_add(off));
                    }
                    let q = ld(x.add(off + 32 * h));
                    let lo = _mm256_and_si256(q, low4);
                    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), low4);
                    let (la, ha) = (_mm256_shuffle_epi8(abs_t, lo), _mm256_shuffle_epi8(abs_t, hi));
                    if V {
                        for j in 0..J {
                            let y0 = act[j].add(Q8K_QS + 32 * ib + 4 * u);
                            part[j] = _mm256_dpbusd_avx_epi32(part[j], la, bcast4(y0));
                            part_hi[j] = _mm256_dpbusd_avx_epi32(part_hi[j], ha, bcast4(y0.add(16)));
                        }
                    } else {
                        let (lsg, hsg) = (_mm256_shuffle_epi8(sgn_t, lo), _mm256_shuffle_epi8(sgn_t, hi));
                        for j in 0..J {
                            let y0 = act[j].add(Q8K_QS + 32 * ib + 4 * u);
                            sumi[j] = _mm256_add_epi32(sumi[j], iq4_signed(la, lsg, bcast4(y0), pair));
                            sumi[j] = _mm256_add_epi32(sumi[j], iq4_signed(ha, hsg, bcast4(y0.add(16)), pair));
                        }
                    }
                }
                if V {
                    for j in 0..J {
                        let bs = bcast4(act[j].add(Q8K_BSUMS + 4 * ib));
                        let p = _mm256_add_epi32(part[j], part_hi[j]);
                        iq4_xs_vnni_scale(&mut sumi[j], &mut corr[j], p, pair, bs);
                    }
                }
            }
            for j in 0..J {
                let isum = if V { _mm256_sub_epi32(sumi[j], _mm256_slli_epi32::<7>(corr[j])) } else { sumi[j] };
                let da = _mm256_set1_ps((act[j] as *const f32).read_unaligned());
                let t = _mm256_mul_ps(_mm256_mul_ps(d, da), _mm256_cvtepi32_ps(isum));
                sums[j][h] = _mm256_add_ps(sums[j][h], t);
            }
        }
    }
    for (j, s) in sums.iter().enumerate() {
        _mm256_storeu_ps(y.add(j * y_stride), s[0]);
        _mm256_storeu_ps(y.add(j * y_stride + 8), s[1]);
    }
}

/// `vpshufb` control: byte `t` of each dword as the zero-extended word pair
/// `(b_t, b_t)`, or with `dword` as the zero-extended dword `b_t`.
#[inline(always)]
pub(super) unsafe fn byte_ctl(t: i32, dword: bool) -> __m256i {
    let b0 = |k: i32| 4 * k + t;
    let d = |k: i32| {
        if dword {
            b0(k) | (0x8080_8000u32 as i32)
        } else {
            b0(k) | (0x80 << 8) | (b0(k) << 16) | (0x80 << 24)
        }
    };
    _mm256_broadcastsi128_si256(_mm_setr_epi32(d(0), d(1), d(2), d(3)))
}

/// The f16 pairs `(lo, hi)` of each dword of `v` as two float vectors.
#[inline(always)]
pub(super) unsafe fn f16_pairs(v: __m256i) -> (__m256, __m256) {
    let lo = _mm256_packus_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)), _mm256_setzero_si256());
    let hi = _mm256_packus_epi32(_mm256_srli_epi32::<16>(v), _mm256_setzero_si256());
    (
        _mm256_cvtph_ps(_mm256_castsi256_si128(_mm256_permute4x64_epi64::<0b10_00>(lo))),
        _mm256_cvtph_ps(_mm256_castsi256_si128(_mm256_permute4x64_epi64::<0b10_00>(hi))),
    )
}

/// The Q2_K tiles' `vpshufb` controls laying bytes (0, 1) and (2, 3) of
/// each dword out as zero-extended word pairs: two groups' mins.
#[inline(always)]
pub(super) unsafe fn q2k_min_ctl() -> (__m256i, __m256i) {
    let within = _mm_setr_epi32(0, 0x0404_0404, 0x0808_0808, 0x0C0C_0C0C);
    let m01 = _mm256_broadcastsi128_si256(_mm_add_epi8(_mm_set1_epi32(0x8001_8000u32 as i32), within));
    let m23 = _mm256_broadcastsi128_si256(_mm_add_epi8(_mm_set1_epi32(0x8003_8002u32 as i32), within));
    (m01, m23)
}

/// Bits `2jb..2jb + 2` of every byte of `q` (the 16-bit shift's spill from
/// the neighbouring byte is masked off).
#[inline(always)]
unsafe fn plane(q: __m256i, jb: usize, three: __m256i) -> __m256i {
    let s = match jb {
        0 => q,
        1 => _mm256_srli_epi16::<2>(q),
        2 => _mm256_srli_epi16::<4>(q),
        _ => _mm256_srli_epi16::<6>(q),
    };
    _mm256_and_si256(s, three)
}

/// One group of sixteen Q2_K rows × `J` activation rows, one half at a
/// time: the AVX-VNNI kernel's tile (plain AVX2 runs
/// [`super::avx2_rows16_q2k::tile_q2_k_halves`]).
///
/// Lanes16 vectors of an 84-byte block: 0–3 the scale bytes (`sc | m << 4`
/// of groups `4v..4v+4`), 4 + 8h + u the codes `qs[32h + 4u..+4]` (value
/// `128h + 32jb + 4u + i` is bits `2jb..` of byte `i`), 20 `(d, dmin)`.
/// Without VNNI a 16-value group's four code vectors meet their activations
/// in `vpmaddubsw` (codes 0..3: pairs ≤ 762, four summed in i16 ≤ 3048), and
/// one `vpmaddwd` against the group's `(sc, sc)` word pairs scales and
/// widens them. With VNNI (`V`) the codes are masked in place (`4^jb ·`
/// code) into `vpdpbusd`, and the group's i32 sum meets `sc · 4^(3 − jb)` in
/// `vpmulld`: `64·Σ sc·S`, one shift back (at most 64 · 16 · 15 · 3 · 127 ·
/// 16 < 2³¹). Mins: `(m_2t, m_2t+1)` word pairs meet Q8_K's `bsums` pair `t`
/// in one `vpmaddwd`. The float step is `q2_k::combine`'s.
#[inline(always)]
unsafe fn tile_q2_k<const J: usize, const V: bool>(
    nb: usize,
    w: *const u8,
    a: *const u8,
    a_stride: usize,
    y: *mut f32,
    y_stride: usize,
) {
    const BLOCK: usize = ROWS * 84;
    let (low4, three) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(3));
    let pairs = [byte_ctl(0, V), byte_ctl(1, V), byte_ctl(2, V), byte_ctl(3, V)];
    let (m01, m23) = q2k_min_ctl();
    let mut sums = [[_mm256_setzero_ps(); 2]; J];
    for b in 0..nb {
        let x = w.add(b * BLOCK);
        let ahead = x.wrapping_add(PREFETCH_AHEAD);
        for l in 0..BLOCK / 64 {
            prefetch_l2(ahead.wrapping_add(64 * l));
        }
        let act: [*const u8; J] = std::array::from_fn(|j| a.add(j * a_stride + b * Q8K_BYTES));
        for r in 0..2 {
            let xr = x.add(32 * r);
            let (d, dmin) = f16_pairs(ld(xr.add(20 * 64)));
            let sv = [ld(xr), ld(xr.add(64)), ld(xr.add(128)), ld(xr.add(192))];
            let mut sumi = [_mm256_setzero_si256(); J];
            for h in 0..2 {
                for jb in 0..4 {
                    let mask = _mm256_set1_epi8((3u8 << (2 * jb)) as i8);
                    for gi in 0..2 {
                        let g = 8 * h + 2 * jb + gi;
                        let mut p = [_mm256_setzero_si256(); J];
                        for u in 4 * gi..4 * gi + 4 {
                            let q = ld(xr.add(64 * (4 + 8 * h + u)));
                            let c = if V { _mm256_and_si256(q, mask) } else { plane(q, jb, three) };
                            for j in 0..J {
                                let ya = bcast4(act[j].add(Q8K_QS + 128 * h + 32 * jb + 4 * u));
                                p[j] = if V {
                                    _mm256_dpbusd_avx_epi32(p[j], c, ya)
                                } else {
                                    _mm256_add_epi16(p[j], _mm256_maddubs_epi16(c, ya))
                                };
                            }
                        }
                        let sc = _mm256_shuffle_epi8(_mm256_and_si256(sv[g / 4], low4), pairs[g % 4]);
                        for j in 0..J {
                            let part = if V {
                                _mm256_mullo_epi32(p[j], _mm256_sllv_epi32(sc, _mm256_set1_epi32(2 * (3 - jb as i32))))
                            } else {
                                _mm256_madd_epi16(p[j], sc)
                            };
                            sumi[j] = _mm256_add_epi32(sumi[j], part);
                        }
                    }
                }
            }
            if V {
                for s in sumi.iter_mut() {
                    *s = _mm256_srai_epi32::<6>(*s);
                }
            }
            // Mins: groups (2t, 2t + 1) are bytes 2(t mod 2), +1 of vector t / 2.
            let mut summ = [_mm256_setzero_si256(); J];
            for t in 0..8 {
                let mv = _mm256_and_si256(_mm256_srli_epi16::<4>(sv[t / 2]), low4);
                let mp = _mm256_shuffle_epi8(mv, if t % 2 == 0 { m01 } else { m23 });
                for j in 0..J {
                    let bs = bcast4(act[j].add(Q8K_BSUMS + 4 * t));
                    summ[j] = _mm256_add_epi32(summ[j], _mm256_madd_epi16(mp, bs));
                }
            }
            for j in 0..J {
                let yd = _mm256_set1_ps((act[j] as *const f32).read_unaligned());
                let t1 = _mm256_mul_ps(_mm256_mul_ps(yd, d), _mm256_cvtepi32_ps(sumi[j]));
                let t2 = _mm256_mul_ps(_mm256_mul_ps(yd, dmin), _mm256_cvtepi32_ps(summ[j]));
                sums[j][r] = _mm256_add_ps(sums[j][r], _mm256_sub_ps(t1, t2));
            }
        }
    }
    for (j, s) in sums.iter().enumerate() {
        _mm256_storeu_ps(y.add(j * y_stride), s[0]);
        _mm256_storeu_ps(y.add(j * y_stride + 8), s[1]);
    }
}
