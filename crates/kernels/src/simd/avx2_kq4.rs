//! AVX2 decode dots for Q2_K and Q3_K against Q8_K, one or four weight rows
//! × one activation row: the 256-bit siblings of [`super::avx512_lowk`], for
//! CPUs without AVX-512.
//!
//! Why: the first AVX2 kernels ([`super::avx2_lowk`]) built every 32-value
//! chunk's pair of sub-block scales from scalars (two `vpbroadcastw` and an
//! insert, ~5 µops on the shuffle port) and reduced each block's sums
//! horizontally on their own; a 1.1B Q2_K decoded at 3.8 GB/s of weights a
//! core (68 cycles a super-block), far below the bandwidth, and level with
//! llama.cpp's AVX2 build. Here:
//! * the 16 sub-block scales are decoded once a block into words (Q2_K:
//!   nibbles; Q3_K: [`super::avx512_lowk::q3k_scales`]); per 128 values one
//!   `vpermq` puts their 8 words in both halves, and per 32 values one
//!   `vpshufb` lays word `2j` over the low half and `2j + 1` over the high
//!   half (a 32-value chunk spans two 16-value sub-blocks);
//! * codes: Q2_K's 2-bit planes by shifting the 32 code bytes (`vpsrlw`
//!   by an immediate, then `& 3`); Q3_K adds its high bit from `hmask` the
//!   same way, as `u = low | high << 2` in 0..7 (the stored code is `u − 4`:
//!   the 4 comes off through the activations' 16-value sums once a block);
//! * `vpmaddubsw` (u8 code × i8 activation, pairs ≤ 2·7·127 < 2¹⁵) then
//!   `vpmaddwd` with the scale words, into 8 i32 lanes;
//! * four rows' block sums reduce together (`vphaddd`), and the float
//!   combination runs in four lanes, the scalar expression lane by lane.
//!
//! Numerics: every integer sum is exact and the float steps are the scalar
//! references' (`q2_k::combine`; `d·d_a·isum` for Q3_K), so both kernels
//! equal scalar bit for bit, and the four-row kernel equals the one-row one.

use super::avx2_k::{ld, pair_ctrl};
use super::avx2_rows::prefetch;
use super::avx512_lowk::{f16_at, q3k_scales, sum1, sum4};
use super::avx512_rows16_k::PREFETCH_AHEAD;
use std::arch::x86_64::*;

const Q8K_QS: usize = 4;
const Q8K_BSUMS: usize = 260;
const Q8K_BYTES: usize = 292;

/// Constants every block shares.
struct Consts {
    three: __m256i,
    four: __m256i,
    /// Per 32-value chunk `j` of 128 values: words `2j`, `2j + 1`.
    ctrl: [__m256i; 4],
}

#[inline(always)]
unsafe fn consts() -> Consts {
    Consts {
        three: _mm256_set1_epi8(3),
        four: _mm256_set1_epi8(4),
        ctrl: [pair_ctrl(0), pair_ctrl(2), pair_ctrl(4), pair_ctrl(6)],
    }
}

/// Words `8h..8h + 8` of the 16 scale words `sc16` in both halves.
#[inline(always)]
unsafe fn half_words<const H: i32>(sc16: __m256i) -> __m256i {
    if H == 0 {
        _mm256_permute4x64_epi64::<0b01_00_01_00>(sc16)
    } else {
        _mm256_permute4x64_epi64::<0b11_10_11_10>(sc16)
    }
}

/// `acc + Σ scale·Σ u·y` over one 32-value chunk: codes `u` (unsigned), the
/// chunk's activations at `y`, its scale words `s`.
#[inline(always)]
unsafe fn chunk(acc: __m256i, u: __m256i, y: *const u8, s: __m256i) -> __m256i {
    _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, ld(y)), s))
}

/// One Q2_K super-block (84 bytes: `scales[16] qs[64] d dmin`) against the
/// Q8_K block `y`: the exact `Σ_g sc_g·Σ q·y` and `Σ_g m_g·bsum_g`, each
/// spread over 8 lanes.
#[inline(always)]
unsafe fn q2k_sums(x: *const u8, y: *const u8, k: &Consts) -> (__m256i, __m256i) {
    let s = _mm_loadu_si128(x as *const __m128i);
    let nib = _mm_set1_epi8(0x0F);
    let sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(s, nib));
    let mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(s), nib));
    let msum = _mm256_madd_epi16(mn16, ld(y.add(Q8K_BSUMS)));
    let mut acc = _mm256_setzero_si256();
    // Values 128h + 32j + l are bits 2j..2j+2 of qs[32h + l].
    macro_rules! half {
        ($h:literal) => {{
            let w = half_words::<$h>(sc16);
            let qs = ld(x.add(16 + 32 * $h));
            let y = y.add(Q8K_QS + 128 * $h);
            let q1 = _mm256_srli_epi16::<2>(qs);
            let q2 = _mm256_srli_epi16::<4>(qs);
            let q3 = _mm256_srli_epi16::<6>(qs);
            acc = chunk(acc, _mm256_and_si256(qs, k.three), y, _mm256_shuffle_epi8(w, k.ctrl[0]));
            acc = chunk(acc, _mm256_and_si256(q1, k.three), y.add(32), _mm256_shuffle_epi8(w, k.ctrl[1]));
            acc = chunk(acc, _mm256_and_si256(q2, k.three), y.add(64), _mm256_shuffle_epi8(w, k.ctrl[2]));
            acc = chunk(acc, _mm256_and_si256(q3, k.three), y.add(96), _mm256_shuffle_epi8(w, k.ctrl[3]));
        }};
    }
    half!(0);
    half!(1);
    (acc, msum)
}

/// One Q3_K super-block (110 bytes: `hmask[32] qs[64] scales[12] d`) against
/// `y`: the exact `Σ_g sc_g·Σ q·y`, spread over 8 lanes.
#[inline(always)]
unsafe fn q3k_sums(x: *const u8, y: *const u8, k: &Consts) -> __m256i {
    let sc16 = q3k_scales(x.add(96));
    // Codes are u − 4: the 4 comes off through the activation sums.
    let off = _mm256_slli_epi32::<2>(_mm256_madd_epi16(sc16, ld(y.add(Q8K_BSUMS))));
    // Value 128h + 32j + l takes bit 4h + j of hmask[l], as bit 2 of u.
    let hm = ld(x);
    let mut acc = _mm256_setzero_si256();
    macro_rules! half {
        ($h:literal) => {{
            let w = half_words::<$h>(sc16);
            let qs = ld(x.add(32 + 32 * $h));
            let y = y.add(Q8K_QS + 128 * $h);
            macro_rules! step {
                ($j:literal) => {{
                    let lo = _mm256_and_si256(_mm256_srli_epi16::<{ 2 * $j }>(qs), k.three);
                    let hi = _mm256_and_si256(bit_to_2(hm, 4 * $h + $j), k.four);
                    acc = chunk(acc, _mm256_or_si256(lo, hi), y.add(32 * $j), _mm256_shuffle_epi8(w, k.ctrl[$j]));
                }};
            }
            step!(0);
            step!(1);
            step!(2);
            step!(3);
        }};
    }
    half!(0);
    half!(1);
    _mm256_sub_epi32(acc, off)
}

/// Bit `b` of every byte of `v` moved to bit 2 (other bits: garbage). The
/// 16-bit shifts never carry a byte's bit `b ≤ 7` out of its own byte on
/// the way (a left shift of ≤ 2 keeps the high byte's bits `≤ 1`, a right
/// shift takes the low byte's from itself); `b` is a constant after
/// inlining, so both are immediate shifts.
#[inline(always)]
unsafe fn bit_to_2(v: __m256i, b: i32) -> __m256i {
    if b >= 2 {
        _mm256_srl_epi16(v, _mm_cvtsi32_si128(b - 2))
    } else {
        _mm256_sll_epi16(v, _mm_cvtsi32_si128(2 - b))
    }
}

const fn block_bytes(q2k: bool) -> usize {
    if q2k {
        84
    } else {
        110
    }
}

/// Offset of `d` in a block (Q2_K's `dmin` follows it).
const fn d_offset(q2k: bool) -> usize {
    if q2k {
        80
    } else {
        108
    }
}

/// One row's block: the integer sum (8 lanes) and, for Q2_K, the mins' sum.
/// Prefetches the block [`PREFETCH_AHEAD`] bytes on (a row's blocks are
/// contiguous, and so are the rows of the file layout): without it the
/// one-row kernel waited on memory at 5.5 GB/s a core.
#[inline(always)]
unsafe fn block_sums<const Q2K: bool>(x: *const u8, y: *const u8, k: &Consts) -> (__m256i, __m256i) {
    prefetch(x.wrapping_add(PREFETCH_AHEAD));
    prefetch(x.wrapping_add(PREFETCH_AHEAD + 64));
    if Q2K {
        q2k_sums(x, y, k)
    } else {
        (q3k_sums(x, y, k), _mm256_setzero_si256())
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dot1<const Q2K: bool>(n: usize, w: *const u8, a: *const u8) -> f32 {
    let k = consts();
    let mut sum = 0f32;
    for i in 0..n / 256 {
        let (x, y) = (w.add(i * block_bytes(Q2K)), a.add(i * Q8K_BYTES));
        let yd = (y as *const f32).read_unaligned();
        let (isum, msum) = block_sums::<Q2K>(x, y, &k);
        let xd = f16_at(x.add(d_offset(Q2K)));
        // The scalar kernels' expressions (q2_k::combine; d·yd·isum).
        sum += if Q2K {
            let dmin = f16_at(x.add(d_offset(Q2K) + 2));
            (yd * xd) * sum1(isum) as f32 - (yd * dmin) * sum1(msum) as f32
        } else {
            xd * yd * sum1(isum) as f32
        };
    }
    sum
}

/// Four rows `stride` bytes apart.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dot4<const Q2K: bool>(n: usize, w: *const u8, stride: usize, a: *const u8, out: *mut f32) {
    let k = consts();
    let mut sum = _mm_setzero_ps();
    let d4 = |x: *const u8, o: usize| {
        _mm_setr_ps(
            f16_at(x.add(o)),
            f16_at(x.add(stride + o)),
            f16_at(x.add(2 * stride + o)),
            f16_at(x.add(3 * stride + o)),
        )
    };
    for i in 0..n / 256 {
        let (x, y) = (w.add(i * block_bytes(Q2K)), a.add(i * Q8K_BYTES));
        let yd = _mm_set1_ps((y as *const f32).read_unaligned());
        let (i0, m0) = block_sums::<Q2K>(x, y, &k);
        let (i1, m1) = block_sums::<Q2K>(x.add(stride), y, &k);
        let (i2, m2) = block_sums::<Q2K>(x.add(2 * stride), y, &k);
        let (i3, m3) = block_sums::<Q2K>(x.add(3 * stride), y, &k);
        let isum = _mm_cvtepi32_ps(sum4(i0, i1, i2, i3));
        let xd = d4(x, d_offset(Q2K));
        // Lane r: row r's scalar expression, no fused multiply-add.
        let block = if Q2K {
            let msum = _mm_cvtepi32_ps(sum4(m0, m1, m2, m3));
            let dmin = d4(x, d_offset(Q2K) + 2);
            _mm_sub_ps(_mm_mul_ps(_mm_mul_ps(yd, xd), isum), _mm_mul_ps(_mm_mul_ps(yd, dmin), msum))
        } else {
            _mm_mul_ps(_mm_mul_ps(xd, yd), isum)
        };
        sum = _mm_add_ps(sum, block);
    }
    _mm_storeu_ps(out, sum);
}

macro_rules! kernels {
    ($q2k:expr, $dot:ident, $dot4:ident, $name:literal) => {
        #[doc = concat!($name, " × Q8_K (see [`crate::quant::DotFn`]); equals scalar bit for bit.")]
        ///
        /// # Safety
        /// AVX2/FMA/F16C CPU; pointers as for [`crate::quant::DotFn`].
        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn $dot(n: usize, w: *const u8, a: *const u8) -> f32 {
            dot1::<$q2k>(n, w, a)
        }

        #[doc = concat!("Four ", $name, " rows × one Q8_K row; each equals the one-row kernel's.")]
        ///
        /// # Safety
        /// As for [`crate::quant::Dot4Fn`]; AVX2/FMA/F16C CPU.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn $dot4(n: usize, w: *const u8, stride: usize, a: *const u8, out: *mut f32) {
            dot4::<$q2k>(n, w, stride, a, out)
        }
    };
}

kernels!(true, dot_q2_k, dot4_q2_k, "Q2_K");
kernels!(false, dot_q3_k, dot4_q3_k, "Q3_K");
