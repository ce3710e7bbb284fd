//! AVX2 dot kernels for IQ4_NL/IQ4_XS and the lattice I-quants, against Q8_K
//! (IQ4_NL: Q8_0) activations (Q2_K and Q3_K: [`super::avx2_kq4`]).
//!
//! Every kernel computes each block's integer sums exactly (the same integers
//! the scalar reference sums) and combines them with the same float expression
//! as the scalar `vec_dot`, so the results are bit-identical to scalar.
//!
//! Products: `maddubs` (u8 × i8 → i16 pairs) with unsigned magnitudes (grid
//! values ≤ 62) against sign-adjusted activations
//! (`sign_epi8(q8, ±1)`), then `madd` with the i16 sub-block scales (→ i32).
//! No pair sum saturates: 2·62·127 < 2¹⁵, and IQ4's `|K| ≤ 127` gives
//! 2·127·127 < 2¹⁵.

use super::avx2::{hsum_epi32, rd16};
use super::avx2_k::{pair_ctrl, word_ctrl};
use super::avx2_rows::prefetch_block;
use super::avx512_rows16_k::PREFETCH_AHEAD;
use super::iq1_tables::{iq1m_codes_plus_nine, iq1s_grid_plus_one};
use crate::quant::iq_grids::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS};
use crate::quant::{iq1_m, iq1_s, iq2_s, iq2_xs, iq3_s, iq3_xxs, iq4_nl, iq4_xs, q8_0, q8_k};
use std::arch::x86_64::*;

/// `SIGN_BYTES[s]`: 8 bytes, byte `j` = −1 if bit `j` of `s` is set, else +1.
static SIGN_BYTES: [u64; 256] = sign_bytes();

const fn sign_bytes() -> [u64; 256] {
    let mut t = [0u64; 256];
    let mut s = 0;
    while s < 256 {
        let mut j = 0;
        while j < 8 {
            let b: u64 = if (s >> j) & 1 != 0 { 0xFF } else { 0x01 };
            t[s] |= b << (8 * j);
            j += 1;
        }
        s += 1;
    }
    t
}

#[inline(always)]
fn ksign(idx7: u32) -> i64 {
    SIGN_BYTES[KSIGNS[(idx7 & 127) as usize] as usize] as i64
}

#[inline(always)]
unsafe fn ld(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

#[inline(always)]
pub(super) unsafe fn blk<'a, T>(p: *const u8) -> &'a T {
    &*(p as *const T)
}

/// i16 scale `lo` on the low 128-bit lane (values 0..16 of a run of 32), `hi` on the high one.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn scale_pair(lo: i32, hi: i32) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(hi as i16), _mm_set1_epi16(lo as i16))
}

/// `Σ` over 32 values of `mag·(q8·sign)`, pairs scaled by `scales` (i16),
/// as 8 i32 partial sums.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dot32(mag: __m256i, signs: __m256i, q8: __m256i, scales: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(mag, _mm256_sign_epi8(q8, signs)), scales)
}

const Q8K: usize = std::mem::size_of::<q8_k::BlockQ8K>();

#[inline(always)]
pub(super) unsafe fn q8k(a: *const u8, i: usize) -> &'static q8_k::BlockQ8K {
    &*(a.add(i * Q8K) as *const q8_k::BlockQ8K)
}

// ---------------------------------------------------------------- IQ4

/// The 32 table values of 16 nibble bytes at `qs` (low nibbles first).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn iq4_values(qs: *const u8, table: __m256i) -> __m256i {
    let b = _mm_loadu_si128(qs as *const __m128i);
    let m = _mm_set1_epi8(0x0F);
    let idx = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m));
    _mm256_shuffle_epi8(table, idx)
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn iq4_table() -> __m256i {
    let t = _mm_loadu_si128(iq4_nl::KVALUES.as_ptr() as *const __m128i);
    _mm256_set_m128i(t, t)
}

/// # Safety
/// As for [`DotFn`]; needs AVX2, FMA, F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_iq4_nl(n: usize, w: *const u8, a: *const u8) -> f32 {
    let table = iq4_table();
    let ones = _mm256_set1_epi16(1);
    let nb = n / 32;
    let mut sum = 0f32;
    // Eight blocks a step: their sums reduce together and their float
    // products `d_a·d·isum` run in eight lanes (the scalar expression lane by
    // lane), then add to `sum` in block order; one block's own `hsum` and two
    // scalar f16 conversions had left this kernel at 4.6 GB/s a core.
    let mut i = 0;
    while i + 8 <= nb {
        let x0 = w.add(i * 18);
        for l in 0..3 {
            super::avx2_rows::prefetch(x0.wrapping_add(PREFETCH_AHEAD + 64 * l));
        }
        let sums: [__m256i; 8] = std::array::from_fn(|k| {
            let x: &iq4_nl::BlockIq4Nl = blk(x0.add(18 * k));
            let y: &q8_0::BlockQ8_0 = blk(a.add((i + k) * 34));
            let v = iq4_values(x.qs.as_ptr(), table);
            dot32(_mm256_abs_epi8(v), v, ld(y.qs.as_ptr() as *const u8), ones)
        });
        let f16s = |base: *const u8, stride: usize| {
            let h: [u16; 8] = std::array::from_fn(|k| rd16(base.add(stride * k)));
            _mm256_cvtph_ps(_mm_loadu_si128(h.as_ptr() as *const __m128i))
        };
        let (xd, yd) = (f16s(x0, 18), f16s(a.add(i * 34), 34));
        let p = _mm256_mul_ps(_mm256_mul_ps(yd, xd), _mm256_cvtepi32_ps(hsum8(&sums)));
        let p: [f32; 8] = std::mem::transmute(p);
        for v in p {
            sum += v;
        }
        i += 8;
    }
    for i in i..nb {
        let x: &iq4_nl::BlockIq4Nl = blk(w.add(i * 18));
        let y: &q8_0::BlockQ8_0 = blk(a.add(i * 34));
        let v = iq4_values(x.qs.as_ptr(), table);
        let q8 = ld(y.qs.as_ptr() as *const u8);
        let sumi = hsum_epi32(dot32(_mm256_abs_epi8(v), v, q8, ones));
        sum += y.d.to_f32() * super::avx2::f16_bits(u16::from_le_bytes(x.d.0)) * sumi as f32;
    }
    sum
}

/// The lane sums of eight 8-lane vectors, in order: `[Σs0, .., Σs7]`.
#[inline(always)]
unsafe fn hsum8(s: &[__m256i; 8]) -> __m256i {
    let a01 = _mm256_hadd_epi32(s[0], s[1]);
    let a23 = _mm256_hadd_epi32(s[2], s[3]);
    let a45 = _mm256_hadd_epi32(s[4], s[5]);
    let a67 = _mm256_hadd_epi32(s[6], s[7]);
    // Per half: [Σs0, Σs1, Σs2, Σs3] of that half's lanes.
    let b0 = _mm256_hadd_epi32(a01, a23);
    let b1 = _mm256_hadd_epi32(a45, a67);
    _mm256_add_epi32(_mm256_permute2x128_si256::<0x20>(b0, b1), _mm256_permute2x128_si256::<0x31>(b0, b1))
}

/// # Safety
/// As for [`DotFn`]; needs AVX2, FMA, F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_iq4_xs(n: usize, w: *const u8, a: *const u8) -> f32 {
    let table = iq4_table();
    let low = _mm256_set1_epi8(0x0F);
    let mut sum = 0f32;
    for i in 0..n / 256 {
        let x: &iq4_xs::BlockIq4Xs = blk(w.add(i * 136));
        for l in 0..3 {
            super::avx2_rows::prefetch((x as *const _ as *const u8).wrapping_add(PREFETCH_AHEAD + 64 * l));
        }
        let y = q8k(a, i);
        // The eight sub-block scales as words in both halves.
        let sc = _mm_sub_epi8(_mm_cvtsi64_si128(iq4_xs_scales(x) as i64), _mm_set1_epi8(32));
        let scw = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(sc));
        let mut acc = _mm256_setzero_si256();
        for p in 0..4 {
            // Sub-blocks 2p, 2p + 1: the low nibbles of their 16 bytes are
            // values 0..16, the high ones 16..32, so each vector of table
            // values holds half of each, and the activations are loaded to
            // match (`[y_2p | y_2p+1]` halves) instead of moving the weights.
            let b = ld(x.qs.as_ptr().add(32 * p));
            let v_lo = _mm256_shuffle_epi8(table, _mm256_and_si256(b, low));
            let v_hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16::<4>(b), low));
            let yp = y.qs.as_ptr().add(64 * p) as *const __m128i;
            let y_lo = _mm256_loadu2_m128i(yp.add(2), yp);
            let y_hi = _mm256_loadu2_m128i(yp.add(3), yp.add(1));
            // Word 2p over the low half, 2p + 1 over the high one.
            let s = _mm256_shuffle_epi8(scw, pair_ctrl(2 * p as i8));
            acc = _mm256_add_epi32(acc, dot32(_mm256_abs_epi8(v_lo), v_lo, y_lo, s));
            acc = _mm256_add_epi32(acc, dot32(_mm256_abs_epi8(v_hi), v_hi, y_hi, s));
        }
        sum += super::avx2::f16_bits(u16::from_le_bytes(x.d.0)) * y.d * hsum_epi32(acc) as f32;
    }
    sum
}

/// An IQ4_XS block's eight 6-bit scales (before the −32), a byte each: the
/// low nibbles of `scales_l` and 2-bit fields of `scales_h` spread to bytes
/// with shifts and masks (as [`iq4_xs::BlockIq4Xs::scales`]).
#[inline(always)]
fn iq4_xs_scales(x: &iq4_xs::BlockIq4Xs) -> u64 {
    let l = u32::from_le_bytes(x.scales_l) as u64;
    let l = (l | l << 16) & 0x0000_FFFF_0000_FFFF;
    let l = (l | l << 8) & 0x00FF_00FF_00FF_00FF;
    let l = (l | l << 4) & 0x0F0F_0F0F_0F0F_0F0F;
    let h = u16::from_le_bytes(x.scales_h) as u64;
    let h = (h | h << 24) & 0x0000_00FF_0000_00FF;
    let h = (h | h << 12) & 0x000F_000F_000F_000F;
    let h = (h | h << 6) & 0x0303_0303_0303_0303;
    l | h << 4
}

// ---------------------------------------------------------------- IQ2 / IQ3

/// Shared tail of the IQ2/IQ3 kernels: `Σ_b (d·d_a)·isum`, times `post`.
#[inline(always)]
pub(super) fn finish(sum: f32, post: f32) -> f32 {
    if post == 1.0 {
        sum
    } else {
        post * sum
    }
}

/// A sub-block's 32 sign bits (its four KSIGNS bytes, [`ksigns_dwords`] of
/// the 7-bit fields at 0, 7, 14, 21 of each lane's `aux` word), lane `ib`.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn ksigns_words(aux: __m256i) -> __m256i {
    let m7 = _mm256_set1_epi32(127);
    let s0 = ksigns_dwords(_mm256_and_si256(aux, m7));
    let s1 = ksigns_dwords(_mm256_and_si256(_mm256_srli_epi32::<7>(aux), m7));
    let s2 = ksigns_dwords(_mm256_and_si256(_mm256_srli_epi32::<14>(aux), m7));
    let s3 = ksigns_dwords(_mm256_and_si256(_mm256_srli_epi32::<21>(aux), m7));
    _mm256_or_si256(
        _mm256_or_si256(s0, _mm256_slli_epi32::<8>(s1)),
        _mm256_or_si256(_mm256_slli_epi32::<16>(s2), _mm256_slli_epi32::<24>(s3)),
    )
}

/// Byte masks of the 32 sign bits in lane `ib` of `signs` ([`ksigns_words`]):
/// byte `j` all ones where bit `j` is set.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn sign_masks_of(signs: __m256i, ib: i32) -> __m256i {
    super::gemm_lowk::sign_mask32_of(_mm256_permutevar8x32_epi32(signs, _mm256_set1_epi32(ib)))
}

/// # Safety
/// As for [`DotFn`]; needs AVX2, FMA, F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_iq2_xxs(n: usize, w: *const u8, a: *const u8) -> f32 {
    // Scalar grid rows and sign patterns (`SIGN_BYTES`): [`dot_iq3_xxs`]'s
    // gathers and vector signs measured 20.0 ns a super-block-row here
    // against 16.9 (four rows a step: one narrow gather of four qwords).
    let mut sum = 0f32;
    for i in 0..n / 256 {
        let xp = w.add(i * 66);
        prefetch_block(xp, PREFETCH_AHEAD);
        let d = super::avx2::f16_bits(rd16(xp));
        let y = q8k(a, i);
        let mut acc = _mm256_setzero_si256();
        for ib in 0..8 {
            let q = xp.add(2 + 8 * ib);
            let aux = (q.add(4) as *const u32).read_unaligned();
            let g = |l: usize| IQ2XXS_GRID[*q.add(l) as usize] as i64;
            let mag = _mm256_set_epi64x(g(3), g(2), g(1), g(0));
            let signs = _mm256_set_epi64x(ksign(aux >> 21), ksign(aux >> 14), ksign(aux >> 7), ksign(aux));
            let ls = (2 * (aux >> 28) + 1) as i16;
            let q8 = ld(y.qs.as_ptr().add(32 * ib) as *const u8);
            acc = _mm256_add_epi32(acc, dot32(mag, signs, q8, _mm256_set1_epi16(ls)));
        }
        sum += d * y.d * hsum_epi32(acc) as f32;
    }
    finish(sum, 0.125)
}

/// Byte masks of eight KSIGNS-coded sign bytes: dword `k` of `s7` holds a
/// 7-bit KSIGNS index (the byte is that and its parity in bit 7); the result
/// has byte `8k + j` all ones where bit `j` of sign byte `k` is set, for
/// `k` in `ks` order (four dwords picked by `pick`, two per 128-bit lane).
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn ksign_masks(signs: __m256i, pick: __m256i) -> __m256i {
    let v = _mm256_permutevar8x32_epi32(signs, pick);
    // Each lane: dword 0's byte 0 to bytes 0–7, dword 1's to 8–15.
    let spread = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4, 0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4,
    );
    let bit = _mm256_set1_epi64x(i64::from_le_bytes([1, 2, 4, 8, 16, 32, 64, 128]));
    _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(v, spread), bit), bit)
}

/// The sign bytes of eight 7-bit KSIGNS indices in dwords: the index and its
/// parity in bit 7 (the even-parity sign table, computed).
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn ksigns_dwords(s7: __m256i) -> __m256i {
    let p = _mm256_xor_si256(s7, _mm256_srli_epi32::<4>(s7));
    let p = _mm256_xor_si256(p, _mm256_srli_epi32::<2>(p));
    let p = _mm256_xor_si256(p, _mm256_srli_epi32::<1>(p));
    _mm256_or_si256(s7, _mm256_slli_epi32::<7>(_mm256_and_si256(p, _mm256_set1_epi32(1))))
}

/// `2s + 1` of IQ2 groups of 16 `8h..8h + 8` from the eight scale bytes as
/// dwords (`b`): group `g` is nibble `g mod 2` of byte `g/2`.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn nibble_scales8(b: __m256i, h: i32) -> __m256i {
    let k = 4 * h;
    let v = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(k, k, k + 1, k + 1, k + 2, k + 2, k + 3, k + 3));
    let v = _mm256_srlv_epi32(_mm256_slli_epi32::<1>(v), _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4));
    _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(30)), _mm256_set1_epi32(1))
}

/// # Safety
/// As for [`DotFn`]; needs AVX2, FMA, F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_iq2_xs(n: usize, w: *const u8, a: *const u8) -> f32 {
    dot_iq2_xs_body::<false>(n, w, a)
}

/// [`dot_iq2_xs`]'s body; with `LOADS` its lookups take broadcast loads
/// ([`super::avx2_grid_loads`]).
#[inline(always)]
pub(super) unsafe fn dot_iq2_xs_body<const LOADS: bool>(n: usize, w: *const u8, a: *const u8) -> f32 {
    // 64 values a step: their eight index words widened at once, grid rows
    // gathered (four a `vpgatherdq`), the KSIGNS bytes computed (parity) and
    // spread to byte masks; scales for the block once. (The first version
    // read each group's grid row and sign byte in scalar code: 29 ns a
    // super-block-row.)
    let grid = IQ2XS_GRID.as_ptr() as *const i64;
    let nb = n / 256;
    // One index buffer, each step's stored just before its lookups: built a
    // block ahead, as IQ1_S's and IQ3_S's are, it ran 36.7 ns against 35.3
    // (the words are read again for the signs).
    let mut ixb = Ix32::default();
    let mut sum = 0f32;
    for i in 0..nb {
        let x: &iq2_xs::BlockIq2Xs = blk(w.add(i * 74));
        prefetch_block(w.add(i * 74), PREFETCH_AHEAD);
        let y = q8k(a, i);
        let sb = _mm256_cvtepu8_epi32(_mm_loadl_epi64(x.scales.as_ptr() as *const __m128i));
        let ls = [nibble_scales8(sb, 0), nibble_scales8(sb, 1)];
        let mut acc = _mm256_setzero_si256();
        for p in 0..steps::<LOADS>(4) {
            let wd = _mm256_cvtepu16_epi32(_mm_loadu_si128(x.qs.as_ptr().add(16 * p) as *const __m128i));
            let iv = _mm256_and_si256(wd, _mm256_set1_epi32(511));
            if LOADS {
                ixb.set(p, iv);
            }
            let mag = rows8::<LOADS>(grid, &ixb, p, iv);
            let signs = ksigns_dwords(_mm256_srli_epi32::<9>(wd));
            let neg = [
                ksign_masks(signs, _mm256_setr_epi32(0, 1, 0, 1, 2, 3, 2, 3)),
                ksign_masks(signs, _mm256_setr_epi32(4, 5, 4, 5, 6, 7, 6, 7)),
            ];
            for c in 0..2 {
                // Sub-block 2p + c: groups of 16 g = 4p + 2c and g + 1.
                let g = 4 * p + 2 * c;
                let k = (g % 8) as i32;
                let ctl = _mm256_setr_epi32(k, k, k, k, k + 1, k + 1, k + 1, k + 1);
                let l = word_pairs(_mm256_permutevar8x32_epi32(ls[g / 8], ctl));
                let q8 = _mm256_loadu_si256(y.qs.as_ptr().add(64 * p + 32 * c) as *const __m256i);
                let ys = _mm256_sub_epi8(_mm256_xor_si256(q8, neg[c]), neg[c]);
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(mag[c], ys), l));
            }
        }
        sum += super::avx2::f16_bits(u16::from_le_bytes(x.d.0)) * y.d * hsum_epi32(acc) as f32;
    }
    finish(sum, 0.125)
}

/// # Safety
/// As for [`DotFn`]; needs AVX2, FMA, F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_iq2_s(n: usize, w: *const u8, a: *const u8) -> f32 {
    let mut sum = 0f32;
    for i in 0..n / 256 {
        let x: &iq2_s::BlockIq2S = blk(w.add(i * 82));
        prefetch_block(w.add(i * 82), PREFETCH_AHEAD);
        let y = q8k(a, i);
        let mut acc = _mm256_setzero_si256();
        for ib in 0..8 {
            let gs = |l: usize| x.group(4 * ib + l);
            let g = |l: usize| IQ2S_GRID[gs(l).0] as i64;
            let s = |l: usize| SIGN_BYTES[gs(l).1 as usize] as i64;
            let mag = _mm256_set_epi64x(g(3), g(2), g(1), g(0));
            let signs = _mm256_set_epi64x(s(3), s(2), s(1), s(0));
            let sc = scale_pair(2 * x.scale(2 * ib) as i32 + 1, 2 * x.scale(2 * ib + 1) as i32 + 1);
            let q8 = ld(y.qs.as_ptr().add(32 * ib) as *const u8);
            acc = _mm256_add_epi32(acc, dot32(mag, signs, q8, sc));
        }
        sum += super::avx2::f16_bits(u16::from_le_bytes(x.d.0)) * y.d * hsum_epi32(acc) as f32;
    }
    finish(sum, 0.125)
}

/// # Safety
/// As for [`DotFn`]; needs AVX2, FMA, F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_iq3_xxs(n: usize, w: *const u8, a: *const u8) -> f32 {
    dot_iq3_xxs_body::<false>(n, w, a)
}

/// [`dot_iq3_xxs`]'s body; with `LOADS` its lookups take broadcast loads
/// ([`super::avx2_grid_loads`]).
#[inline(always)]
pub(super) unsafe fn dot_iq3_xxs_body<const LOADS: bool>(n: usize, w: *const u8, a: *const u8) -> f32 {
    // 32 values a step: eight grid entries gathered (`vpgatherdd`); the
    // block's 32 KSIGNS bytes computed at once from its eight `aux` words
    // (parity in vectors) and each step's four spread to byte masks; the
    // scales `2s + 1` (aux bits 28–31) once a block. (The first version read
    // grid entries and sign bytes in scalar code: 25.3 ns a super-block-row.)
    let grid = IQ3XXS_GRID.as_ptr() as *const i32;
    let mut sum = 0f32;
    for i in 0..n / 256 {
        let x: &iq3_xxs::BlockIq3Xxs = blk(w.add(i * 98));
        prefetch_block(w.add(i * 98), PREFETCH_AHEAD);
        let y = q8k(a, i);
        // Sub-block ib's aux word on lane ib: four 7-bit KSIGNS indices, the scale.
        let aux = _mm256_loadu_si256(x.qs.as_ptr().add(64) as *const __m256i);
        let signs = ksigns_words(aux);
        let ls =
            word_pairs(_mm256_or_si256(_mm256_slli_epi32::<1>(_mm256_srli_epi32::<28>(aux)), _mm256_set1_epi32(1)));
        let mut acc = _mm256_setzero_si256();
        for ib in 0..steps::<LOADS>(8) {
            let mag = if LOADS {
                super::avx2_grid_loads::iq3_xxs_entries(x.qs.as_ptr().add(8 * ib))
            } else {
                let iv = _mm256_cvtepu8_epi32(_mm_loadl_epi64(x.qs.as_ptr().add(8 * ib) as *const __m128i));
                _mm256_i32gather_epi32::<4>(grid, iv)
            };
            let sel = _mm256_set1_epi32(ib as i32);
            let neg = sign_masks_of(signs, ib as i32);
            let q8 = _mm256_loadu_si256(y.qs.as_ptr().add(32 * ib) as *const __m256i);
            let ys = _mm256_sub_epi8(_mm256_xor_si256(q8, neg), neg);
            let l = _mm256_permutevar8x32_epi32(ls, sel);
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(mag, ys), l));
        }
        sum += super::avx2::f16_bits(u16::from_le_bytes(x.d.0)) * y.d * hsum_epi32(acc) as f32;
    }
    finish(sum, 0.25)
}

/// An IQ3_S block's eight scales `2s + 1` (nibbles of `scales`) as words
/// 0..7 in both 128-bit halves.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn iq3_s_scale_words(scales: [u8; 4]) -> __m256i {
    let s4 = u32::from_le_bytes(scales) as u64;
    let s4 = (s4 | s4 << 16) & 0x0000_FFFF_0000_FFFF;
    let s4 = (s4 | s4 << 8) & 0x00FF_00FF_00FF_00FF;
    let s4 = (s4 | s4 << 4) & 0x0F0F_0F0F_0F0F_0F0F;
    let ls = _mm_add_epi8(_mm_add_epi8(_mm_cvtsi64_si128(s4 as i64), _mm_cvtsi64_si128(s4 as i64)), _mm_set1_epi8(1));
    _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(ls))
}

/// # Safety
/// As for [`DotFn`]; needs AVX2, FMA, F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_iq3_s(n: usize, w: *const u8, a: *const u8) -> f32 {
    dot_iq3_s_body::<false>(n, w, a)
}

/// [`dot_iq3_s`]'s body; with `LOADS` the block's 64 indices are built and
/// stored once and its entries take broadcast loads
/// ([`super::avx2_grid_loads`]).
#[inline(always)]
pub(super) unsafe fn dot_iq3_s_body<const LOADS: bool>(n: usize, w: *const u8, a: *const u8) -> f32 {
    // 32 values a step: their eight grid entries gathered (`vpgatherdd`),
    // the sign bits expanded to a byte mask that negates the activations, the
    // scale word laid over the lanes by `vpshufb`. (The first version built
    // the entries, the signs and the scale from scalars: ~40 µops per 32
    // values, 2.5 GB/s a core.)
    let grid = IQ3S_GRID.as_ptr() as *const i32;
    let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let one = _mm256_set1_epi32(1);
    // With `LOADS`, two index buffers: block i + 1's indices are built and
    // stored before block i's lookups read block i's, so those reads find
    // their stores long done.
    let mut idx = [super::avx2_grid_loads::Iq3sIndices::default(), super::avx2_grid_loads::Iq3sIndices::default()];
    let nb = n / 256;
    if LOADS && nb > 0 {
        idx[0].build(blk(w));
    }
    let mut sum = 0f32;
    for i in 0..nb {
        let x: &iq3_s::BlockIq3S = blk(w.add(i * 110));
        for l in 0..2 {
            super::avx2_rows::prefetch((x as *const _ as *const u8).wrapping_add(PREFETCH_AHEAD + 64 * l));
        }
        let y = q8k(a, i);
        let scw = iq3_s_scale_words(x.scales);
        if LOADS && i + 1 < nb {
            idx[(i + 1) % 2].build(blk(w.add((i + 1) * 110)));
        }
        let idx = &idx[i % 2];
        let mut acc = _mm256_setzero_si256();
        for ib in 0..steps::<LOADS>(8) {
            let (mag, ctl) = if LOADS {
                (idx.entries(ib), super::avx2_grid_loads::word_ctrl_at(ib))
            } else {
                // Group k of sub-block ib: qs[8ib + k] | bit k of qh[ib] << 8.
                let lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64(x.qs.as_ptr().add(8 * ib) as *const __m128i));
                let hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(x.qh[ib] as i32), lanes), one);
                let iv = _mm256_or_si256(lo, _mm256_slli_epi32::<8>(hi));
                (_mm256_i32gather_epi32::<4>(grid, iv), word_ctrl(ib as i8))
            };
            let sg = u32::from_le_bytes(x.signs[4 * ib..4 * ib + 4].try_into().expect("4 sign bytes"));
            let neg = super::gemm_lowk::sign_mask32(sg);
            // Q8_K codes are −127..127: negating never wraps.
            let q8 = ld(y.qs.as_ptr().add(32 * ib) as *const u8);
            let ys = _mm256_sub_epi8(_mm256_xor_si256(q8, neg), neg);
            let w = _mm256_shuffle_epi8(scw, ctl);
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(mag, ys), w));
        }
        sum += super::avx2::f16_bits(u16::from_le_bytes(x.d.0)) * y.d * hsum_epi32(acc) as f32;
    }
    sum
}

// ---------------------------------------------------------------- IQ1

/// An IQ1_S block's eight `qh` words as dwords and their `2s + 1`
/// (`(qh >> 11 & 14) | 1`), sub-block `ib` on lane `ib`.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn iq1_s_words(x: &iq1_s::BlockIq1S) -> (__m256i, __m256i) {
    let qh = _mm256_cvtepu16_epi32(_mm_loadu_si128(x.qh.as_ptr() as *const __m128i));
    let ls =
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32::<11>(qh), _mm256_set1_epi32(14)), _mm256_set1_epi32(1));
    (qh, ls)
}

/// The per-sub-block terms of an IQ1_S block beside `8·Σ ls·Σ (grid+1)·q8`
/// (the grid rows plus one, [`iq1s_grid_plus_one`]):
/// `ls·(±1 − 8)·(bsums[2ib] + bsums[2ib + 1])` on lane `ib` — the shift
/// `δ = ±1/8` times 8 (the reference's `sumi1`), less 8 times the `+1`. So
/// the lanes' total is `8·s + sumi1`, whose eighth is the reference's
/// `s + δ·sumi1` exactly (rounding commutes with the power-of-two scale; the
/// total is at most 8·8·15·32·2·127 in magnitude, exact in 32 bits).
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn iq1_s_terms(qh: __m256i, ls: __m256i, y: &q8_k::BlockQ8K) -> __m256i {
    // Bit 15 of the word: the shift's sign.
    let minus = _mm256_srai_epi32::<31>(_mm256_slli_epi32::<16>(qh));
    let signed = _mm256_sub_epi32(_mm256_xor_si256(ls, minus), minus);
    let pairs = _mm256_madd_epi16(_mm256_loadu_si256(y.bsums.as_ptr() as *const __m256i), _mm256_set1_epi16(1));
    _mm256_mullo_epi32(_mm256_sub_epi32(signed, _mm256_slli_epi32::<3>(ls)), pairs)
}

/// Dwords `v` as i16 pairs `(v, v)`: `vpmaddwd` scales both words of a lane.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn word_pairs(v: __m256i) -> __m256i {
    _mm256_or_si256(v, _mm256_slli_epi32::<16>(v))
}

/// A kernel's step count `n`, opaque to LLVM for the `LOADS` bodies: their
/// loops unrolled, it hoists every step's asm lookups to the top and spills
/// them (see [`super::avx2_grid_loads`]).
#[inline(always)]
fn steps<const LOADS: bool>(n: usize) -> usize {
    if LOADS {
        std::hint::black_box(n)
    } else {
        n
    }
}

/// A block's 32 grid indices, eight a step, stored for the broadcast-load
/// lookups. The kernels keep two: block `i + 1`'s are stored before block
/// `i`'s lookups read block `i`'s, so no lookup waits on a store just made
/// (the same change took IQ3_S's dot from 33.6 to 27.5 ns a
/// super-block-row; see [`super::avx2_grid_loads`]).
#[repr(C, align(32))]
#[derive(Default)]
pub(super) struct Ix32([u32; 32]);

impl Ix32 {
    /// Step `p`'s index vector (a plain store, no closure: the callers'
    /// intrinsics must inline into the `#[target_feature]` entry points).
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn set(&mut self, p: usize, iv: __m256i) {
        _mm256_store_si256(self.0.as_mut_ptr().add(8 * p) as *mut __m256i, iv);
    }
}

/// Eight 8-byte rows `table[iv[k]]` of step `p`: gathered (`vpgatherdq`,
/// four a gather), or with `LOADS` by broadcast loads from the indices
/// stored in `ix` (then `iv` is unused, and its code dead).
#[inline(always)]
unsafe fn rows8<const LOADS: bool>(table: *const i64, ix: &Ix32, p: usize, iv: __m256i) -> [__m256i; 2] {
    if LOADS {
        let rows4 = super::avx2_grid_loads::rows4_u32;
        [rows4(ix.0.as_ptr().add(8 * p), table), rows4(ix.0.as_ptr().add(8 * p + 4), table)]
    } else {
        [
            _mm256_i32gather_epi64::<8>(table, _mm256_castsi256_si128(iv)),
            _mm256_i32gather_epi64::<8>(table, _mm256_extracti128_si256::<1>(iv)),
        ]
    }
}

/// IQ1_S step `p`'s eleven-bit indices (groups 8p..8p + 8, sub-blocks 2p and
/// 2p + 1): lane t takes word 2p + t/4 of `qh`, whose bits 3(t mod 4).. move
/// to 8–10, over its `qs` byte.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn iq1_s_iv(x: &iq1_s::BlockIq1S, qh: __m256i, p: usize) -> __m256i {
    let lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64(x.qs.as_ptr().add(8 * p) as *const __m128i));
    let (s0, s1) = (2 * p as i32, 2 * p as i32 + 1);
    let wd = _mm256_permutevar8x32_epi32(qh, _mm256_setr_epi32(s0, s0, s0, s0, s1, s1, s1, s1));
    let hi = _mm256_sllv_epi32(wd, _mm256_setr_epi32(8, 5, 2, 0, 8, 5, 2, 0));
    let hi = _mm256_blend_epi32::<0x88>(hi, _mm256_srli_epi32::<1>(wd));
    _mm256_or_si256(_mm256_and_si256(hi, _mm256_set1_epi32(0x700)), lo)
}

/// IQ1_M step `p`'s twelve-bit indices (groups 8p..8p + 8): lane t takes qh
/// byte 4p + t/2, its low nibble for even t, high for odd, moved to bits
/// 8–11, over its `qs` byte.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn iq1_m_iv(x: &iq1_m::BlockIq1M, p: usize) -> __m256i {
    let lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64(x.qs.as_ptr().add(8 * p) as *const __m128i));
    let qb = _mm256_cvtepu8_epi32(_mm_cvtsi32_si128((x.qh.as_ptr().add(4 * p) as *const i32).read_unaligned()));
    let nib = _mm256_permutevar8x32_epi32(qb, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
    let nib = _mm256_sllv_epi32(nib, _mm256_setr_epi32(8, 4, 8, 4, 8, 4, 8, 4));
    _mm256_or_si256(_mm256_and_si256(nib, _mm256_set1_epi32(0xF00)), lo)
}

/// `acc + Σ row·q8` over 32 values with unsigned rows (bytes at most 18, so
/// `vpmaddubsw` never saturates: 2·18·127), pairs scaled by the i16 pairs `ls`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn dot32_unsigned(acc: __m256i, row: __m256i, q8: *const u8, ls: __m256i) -> __m256i {
    let q8 = _mm256_loadu_si256(q8 as *const __m256i);
    _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(row, q8), ls))
}

/// # Safety
/// As for [`DotFn`]; needs AVX2, FMA, F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_iq1_s(n: usize, w: *const u8, a: *const u8) -> f32 {
    dot_iq1_s_body::<false>(n, w, a)
}

/// [`dot_iq1_s`]'s body; with `LOADS` its lookups take broadcast loads
/// ([`super::avx2_grid_loads`]).
#[inline(always)]
pub(super) unsafe fn dot_iq1_s_body<const LOADS: bool>(n: usize, w: *const u8, a: *const u8) -> f32 {
    // Grid rows plus one gathered (`vpgatherdq`, four rows of 8 a gather), their
    // 11-bit indices built eight at a time; `Σ ls·Σ (grid+1)·q8` and the terms
    // of [`iq1_s_terms`] in one reduction. (The first version inserted grid
    // rows from scalar lookups and applied ternary signs: 17.1 ns a
    // super-block-row.)
    let grid = iq1s_grid_plus_one().as_ptr() as *const i64;
    let nb = n / 256;
    let mut ix = [Ix32::default(), Ix32::default()];
    if LOADS && nb > 0 {
        let x: &iq1_s::BlockIq1S = blk(w);
        for p in 0..4 {
            ix[0].set(p, iq1_s_iv(x, iq1_s_words(x).0, p));
        }
    }
    let mut sum = 0f32;
    for i in 0..nb {
        let x: &iq1_s::BlockIq1S = blk(w.add(i * 50));
        prefetch_block(w.add(i * 50), PREFETCH_AHEAD);
        if LOADS && i + 1 < nb {
            let xn: &iq1_s::BlockIq1S = blk(w.add((i + 1) * 50));
            let qhn = iq1_s_words(xn).0;
            for p in 0..4 {
                ix[(i + 1) % 2].set(p, iq1_s_iv(xn, qhn, p));
            }
        }
        let ixb = &ix[i % 2];
        let y = q8k(a, i);
        let (qh, ls) = iq1_s_words(x);
        let lsw = word_pairs(ls);
        let mut acc = _mm256_setzero_si256();
        for p in 0..steps::<LOADS>(4) {
            let (s0, s1) = (2 * p as i32, 2 * p as i32 + 1);
            let [g0, g1] = rows8::<LOADS>(grid, ixb, p, iq1_s_iv(x, qh, p));
            let l0 = _mm256_permutevar8x32_epi32(lsw, _mm256_set1_epi32(s0));
            let l1 = _mm256_permutevar8x32_epi32(lsw, _mm256_set1_epi32(s1));
            acc = dot32_unsigned(acc, g0, y.qs.as_ptr().add(64 * p) as *const u8, l0);
            acc = dot32_unsigned(acc, g1, y.qs.as_ptr().add(64 * p + 32) as *const u8, l1);
        }
        let t = hsum_epi32(_mm256_add_epi32(_mm256_slli_epi32::<3>(acc), iq1_s_terms(qh, ls, y)));
        sum += super::avx2::f16_bits(u16::from_le_bytes(x.d.0)) * y.d * (t as f32 * iq1_s::DELTA);
    }
    sum
}

/// `2s + 1` of IQ1_M groups of 16 `8h..8h + 8` (`h` = 0, 1), group `8h + j`
/// on lane `j`, from the four scale words as dwords: word `g/4`, bits
/// `3(g mod 4)..`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn iq1_m_scales8(words: __m256i, h: i32) -> __m256i {
    let (a, b) = (2 * h, 2 * h + 1);
    let wd = _mm256_permutevar8x32_epi32(words, _mm256_setr_epi32(a, a, a, a, b, b, b, b));
    let s = _mm256_srlv_epi32(_mm256_slli_epi32::<1>(wd), _mm256_setr_epi32(0, 3, 6, 9, 0, 3, 6, 9));
    _mm256_or_si256(_mm256_and_si256(s, _mm256_set1_epi32(14)), _mm256_set1_epi32(1))
}

/// # Safety
/// As for [`DotFn`]; needs AVX2, FMA, F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_iq1_m(n: usize, w: *const u8, a: *const u8) -> f32 {
    dot_iq1_m_body::<false>(n, w, a)
}

/// [`dot_iq1_m`]'s body; with `LOADS` its lookups take broadcast loads
/// ([`super::avx2_grid_loads`]).
#[inline(always)]
pub(super) unsafe fn dot_iq1_m_body<const LOADS: bool>(n: usize, w: *const u8, a: *const u8) -> f32 {
    // Codes `8·grid ± 1` plus 9 gathered by 12-bit index (the shift's sign
    // folded into the lookup, [`iq1m_codes_plus_nine`]), eight indices built
    // at a time. `Σ ls·Σ code·q8 = 8·sumi1 + sumi2` (the `+9` taken back
    // out as `9·Σ ls·bsums`), whose eighth is the reference's
    // `sumi1 + δ·sumi2` exactly (at most 24 significant bits). (The previous
    // version built signed codes from plain grid rows: 24.7 ns a
    // super-block-row.)
    let table = iq1m_codes_plus_nine().as_ptr() as *const i64;
    let nb = n / 256;
    let mut ix = [Ix32::default(), Ix32::default()];
    if LOADS && nb > 0 {
        for p in 0..4 {
            ix[0].set(p, iq1_m_iv(blk(w), p));
        }
    }
    let mut sum = 0f32;
    for i in 0..nb {
        let x: &iq1_m::BlockIq1M = blk(w.add(i * 56));
        prefetch_block(w.add(i * 56), PREFETCH_AHEAD);
        if LOADS && i + 1 < nb {
            for p in 0..4 {
                ix[(i + 1) % 2].set(p, iq1_m_iv(blk(w.add((i + 1) * 56)), p));
            }
        }
        let ixb = &ix[i % 2];
        let y = q8k(a, i);
        let words = _mm256_cvtepu16_epi32(_mm_loadl_epi64(x.scales.as_ptr() as *const __m128i));
        let ls = [iq1_m_scales8(words, 0), iq1_m_scales8(words, 1)];
        let mut acc = _mm256_setzero_si256();
        for p in 0..steps::<LOADS>(4) {
            let code = rows8::<LOADS>(table, ixb, p, iq1_m_iv(x, p));
            // Sub-block 2p + c: groups of 16 g = 4p + 2c and g + 1 (values
            // 0–15 and 16–31).
            for (c, &cc) in code.iter().enumerate() {
                let g = 4 * p + 2 * c;
                let k = (g % 8) as i32;
                let ctl = _mm256_setr_epi32(k, k, k, k, k + 1, k + 1, k + 1, k + 1);
                let l = word_pairs(_mm256_permutevar8x32_epi32(ls[g / 8], ctl));
                acc = dot32_unsigned(acc, cc, y.qs.as_ptr().add(64 * p + 32 * c) as *const u8, l);
            }
        }
        // Less the +9: 9·Σ ls·bsums (packs interleaves 128-bit lanes; the
        // permute puts groups 0..16 back in order).
        let lsw = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(ls[0], ls[1]));
        let nine = _mm256_madd_epi16(_mm256_loadu_si256(y.bsums.as_ptr() as *const __m256i), lsw);
        let t = hsum_epi32(_mm256_sub_epi32(acc, _mm256_mullo_epi32(nine, _mm256_set1_epi32(9))));
        sum += x.d() * y.d * (t as f32 * iq1_s::DELTA);
    }
    sum
}
