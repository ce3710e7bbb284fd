//! AVX2 dot products for the K-quants against Q8_K activations.
//!
//! Per 256-value block: integer sums per sub-block via `maddubs`, scaled by the
//! sub-block scales with `madd` (i16 × i16 → i32), one float FMA per block. The
//! minimum / offset terms use the activation `bsums`. The scales are decoded
//! once a block into a vector of words and laid over each sub-block's lanes
//! with one `vpshufb` (they were built from scalars, two broadcasts and an
//! insert per 32 values, and the mins from 16 inserts: in cache, 13.9 → 9.0
//! ns a Q4_K super-block, Q5_K 16.8 → 11.2, Q6_K 16.9 → 12.2 on the Xeon).
//!
//! These one-row kernels are the K-quants' decode path at AVX2 (their
//! weights stay in the file layout there). Each block prefetches the lines
//! [`PREFETCH_AHEAD`] (8 KiB) on into L2, as the sixteen-row kernels do:
//! two rows ahead into L1 (2.3–6.3 KiB at the 1.1B shapes) left the
//! hardware prefetchers behind. `bench_matmul 2 1 avx2` at the 1.1B shapes,
//! the two alternated pass by pass (Emerald Rapids VM): Q4_K 25.8–27.1 →
//! 28.0–28.5 GB/s, Q6_K 27.4 → 28.2, Q5_K 26.4 → 26.6.

use super::avx2::f16_bits as f16;
use super::avx2::{hsum_ps, rd16};
use super::avx512_rows16_k::{prefetch_l2, PREFETCH_AHEAD};
use crate::quant::q4_k::scales_mins;
use std::arch::x86_64::*;

const Q8K_QS: usize = 4;
const Q8K_BSUMS: usize = 260;
const Q8K_BYTES: usize = 292;

#[inline(always)]
pub(super) unsafe fn ld(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

/// The `vpshufb` control spreading word `j` of each 128-bit half over it.
#[inline(always)]
pub(super) unsafe fn word_ctrl(j: i8) -> __m256i {
    _mm256_set1_epi16(i16::from_le_bytes([2 * j as u8, 2 * j as u8 + 1]))
}

/// The `vpshufb` control laying word `j` (of eight, in both halves) over the
/// low half and word `j + 1` over the high half: a 32-value chunk's two
/// 16-value sub-block scales.
#[inline(always)]
pub(super) unsafe fn pair_ctrl(j: i8) -> __m256i {
    _mm256_set_m128i(_mm256_castsi256_si128(word_ctrl(j + 1)), _mm256_castsi256_si128(word_ctrl(j)))
}

/// Shared Q4_K/Q5_K body (`Q5` adds the 5th bits from `qh`).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dot_k4k5<const Q5: bool>(n: usize, w: *const u8, a: *const u8) -> f32 {
    let (bb, qs_off) = if Q5 { (176, 48) } else { (144, 16) };
    let nb = n / 256;
    let mut acc = _mm256_setzero_ps();
    let mut accm = _mm256_setzero_ps();
    let low = _mm256_set1_epi8(0x0F);
    let one = _mm256_set1_epi8(1);
    for i in 0..nb {
        let (x, y) = (w.add(i * bb), a.add(i * Q8K_BYTES));
        for l in 0..bb.div_ceil(64) {
            prefetch_l2(x.wrapping_add(PREFETCH_AHEAD + 64 * l));
        }
        let yd = (y as *const f32).read_unaligned();
        let d = _mm256_set1_ps(yd * f16(rd16(x)));
        let dmin = _mm256_set1_ps(yd * f16(rd16(x.add(2))));
        let (sc, mn) = scales_mins(&*(x.add(4) as *const [u8; 12]));
        // Scale words 0..7 in both halves (one `vpshufb` per sub-block
        // below), and the mins as word pairs `[m0, m0, m1, m1, ..]`: built
        // from scalars they cost ~30 µops a block.
        let scw = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(u64::from_le_bytes(sc) as i64)));
        let mn8 = _mm_cvtsi64_si128(u64::from_le_bytes(mn) as i64);
        let m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn8, mn8));
        // Mins: Σ_j m_j · (bsum[2j] + bsum[2j+1]).
        let bs = ld(y.add(Q8K_BSUMS));
        accm = _mm256_fmadd_ps(dmin, _mm256_cvtepi32_ps(_mm256_madd_epi16(bs, m16)), accm);
        let qh = if Q5 { ld(x.add(16)) } else { _mm256_setzero_si256() };
        let mut sumi = _mm256_setzero_si256();
        for c in 0..4 {
            let q = ld(x.add(qs_off + 32 * c));
            let mut q0 = _mm256_and_si256(q, low);
            let mut q1 = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
            if Q5 {
                let h0 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c as i32)), one);
                let h1 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c as i32 + 1)), one);
                q0 = _mm256_or_si256(q0, _mm256_slli_epi16(h0, 4));
                q1 = _mm256_or_si256(q1, _mm256_slli_epi16(h1, 4));
            }
            let p0 = _mm256_maddubs_epi16(q0, ld(y.add(Q8K_QS + 64 * c)));
            let p1 = _mm256_maddubs_epi16(q1, ld(y.add(Q8K_QS + 64 * c + 32)));
            let s0 = _mm256_shuffle_epi8(scw, word_ctrl(2 * c as i8));
            let s1 = _mm256_shuffle_epi8(scw, word_ctrl(2 * c as i8 + 1));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p0, s0));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p1, s1));
        }
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc) - hsum_ps(accm)
}

/// Q4_K × Q8_K (see [`crate::quant::DotFn`]).
///
/// # Safety
/// AVX2+FMA+F16C CPU; pointers as for [`crate::quant::DotFn`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q4_k(n: usize, w: *const u8, a: *const u8) -> f32 {
    dot_k4k5::<false>(n, w, a)
}

/// Q5_K × Q8_K.
///
/// # Safety
/// AVX2+FMA+F16C CPU; pointers as for [`crate::quant::DotFn`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q5_k(n: usize, w: *const u8, a: *const u8) -> f32 {
    dot_k4k5::<true>(n, w, a)
}

/// One Q6_K block decoded for [`q6k_sums`]: the eight 32-value chunks'
/// unsigned 6-bit codes, each chunk's two sub-block scales as word pairs
/// (low half, high half), and the sixteen scales as words.
#[derive(Clone, Copy)]
pub(super) struct Q6kBlock {
    q: [__m256i; 8],
    sc: [__m256i; 8],
    sc16: __m256i,
}

/// Bits `k..k + 2` of each `qh` byte as bits 4–5: a code's top two bits.
#[inline(always)]
unsafe fn q6k_high(qh: __m256i, k: i32, three: __m256i) -> __m256i {
    _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(k)), three), 4)
}

/// The Q6_K block at `x` decoded (file layout: `ql` at 0, `qh` at 128, the
/// i8 scales at 192, `d` at 208).
#[inline(always)]
pub(super) unsafe fn q6k_decode(x: *const u8) -> Q6kBlock {
    let low = _mm256_set1_epi8(0x0F);
    let three = _mm256_set1_epi8(3);
    let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(x.add(192) as *const __m128i));
    let mut blk = Q6kBlock { q: [_mm256_setzero_si256(); 8], sc: [_mm256_setzero_si256(); 8], sc16 };
    for h in 0..2 {
        // Words 8h..8h+8 in both halves; per 32 values one `vpshufb` lays
        // word 2k over the low half and 2k + 1 over the high one.
        let w = if h == 0 {
            _mm256_permute4x64_epi64::<0b01_00_01_00>(sc16)
        } else {
            _mm256_permute4x64_epi64::<0b11_10_11_10>(sc16)
        };
        let ql0 = ld(x.add(64 * h));
        let ql1 = ld(x.add(64 * h + 32));
        let qh = ld(x.add(128 + 32 * h));
        let q = [
            _mm256_or_si256(_mm256_and_si256(ql0, low), q6k_high(qh, 0, three)),
            _mm256_or_si256(_mm256_and_si256(ql1, low), q6k_high(qh, 2, three)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low), q6k_high(qh, 4, three)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low), q6k_high(qh, 6, three)),
        ];
        for (k, &qk) in q.iter().enumerate() {
            let pair = _mm256_or_si256(word_ctrl(2 * k as i8), _mm256_set_m128i(_mm_set1_epi8(2), _mm_setzero_si128()));
            blk.q[4 * h + k] = qk;
            blk.sc[4 * h + k] = _mm256_shuffle_epi8(w, pair);
        }
    }
    blk
}

/// A decoded block against the Q8_K block at `y`: the exact
/// `Σ_g sc_g·Σ q·q8 − 32·Σ_g sc_g·bsum_g` spread over 8 lanes.
#[inline(always)]
pub(super) unsafe fn q6k_sums(blk: &Q6kBlock, y: *const u8) -> __m256i {
    // Offset term: 32 · Σ_g sc_g · bsum_g.
    let off = _mm256_madd_epi16(blk.sc16, ld(y.add(Q8K_BSUMS)));
    let mut sumi = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(off, 5));
    for c in 0..8 {
        let p = _mm256_maddubs_epi16(blk.q[c], ld(y.add(Q8K_QS + 32 * c)));
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, blk.sc[c]));
    }
    sumi
}

/// `d·d_a` of the Q6_K block at `x` and the Q8_K block at `y`, in every lane.
#[inline(always)]
pub(super) unsafe fn q6k_scale(x: *const u8, y: *const u8) -> __m256 {
    _mm256_set1_ps((y as *const f32).read_unaligned() * f16(rd16(x.add(208))))
}

/// Q6_K × Q8_K: `Σ_g sc_g·Σ q·q8 − 32·Σ_g sc_g·bsum_g` with unsigned 6-bit `q`.
/// Each block's sum meets `d·d_a` in an FMA into eight float lanes
/// (`super::avx2_q6k_rows` repeats these steps for batches, bit for bit).
///
/// # Safety
/// AVX2+FMA+F16C CPU; pointers as for [`crate::quant::DotFn`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q6_k(n: usize, w: *const u8, a: *const u8) -> f32 {
    let nb = n / 256;
    let mut acc = _mm256_setzero_ps();
    for i in 0..nb {
        let (x, y) = (w.add(i * 210), a.add(i * Q8K_BYTES));
        for l in 0..4 {
            prefetch_l2(x.wrapping_add(PREFETCH_AHEAD + 64 * l));
        }
        let sumi = q6k_sums(&q6k_decode(x), y);
        acc = _mm256_fmadd_ps(q6k_scale(x, y), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc)
}
