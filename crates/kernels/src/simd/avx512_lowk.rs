//! AVX-512 (BW, VNNI) decode dot products for Q2_K, Q3_K and IQ4_XS against
//! Q8_K, one or four weight rows × one activation row (the other low-bit
//! types use the AVX2 kernels of [`super::avx2_lowk`] at this level).
//!
//! Per super-block and row the integer sum is exact, and the block's float
//! contribution is combined in the scalar `vec_dot`'s order, so every kernel
//! here equals scalar bit for bit, and the four-row kernels (file layout or
//! the packed one of [`crate::packed`], units of one super-block) equal the
//! one-row kernel row by row.
//!
//! How a 64-value chunk is computed:
//! * Q2_K/Q3_K: the 32 code bytes broadcast to both halves of a vector and
//!   shifted per half (`vpsrlvw`) give two 2-bit planes at once (Q3_K adds
//!   its high bit the same way from `hmask`); `vpmaddubsw` against the
//!   activations (pairs stay below 2¹⁵), then `vpdpwssd` with the 16-value
//!   group scales permuted into words (`vpermw`). Q3_K's codes are stored
//!   `q + 4` and Q2_K's mins meet the activations' 16-value sums once per block.
//! * IQ4_XS: nibbles pick from the codebook with `vpshufb`, offset by 128 to
//!   be unsigned (`vpdpbusd` takes u8 × i8 with no saturation), and the
//!   offset times the activation sums comes off once per block.
//! * The four rows' block sums are reduced together (`vphaddd`), and the
//!   float combination runs in four lanes, the scalar expression lane by lane.

use super::avx512_k::{bcast256, ld256, ld512, words2, words4};
use std::arch::x86_64::*;

const Q8K_QS: usize = 4;
const Q8K_BSUMS: usize = 260;
const Q8K_BYTES: usize = 292;

/// The f16 at `p` as f32 ([`super::avx2::f16_bits`]).
#[target_feature(enable = "f16c")]
#[inline]
pub(super) unsafe fn f16_at(p: *const u8) -> f32 {
    super::avx2::f16_bits((p as *const u16).read_unaligned())
}

/// A 16-lane i32 sum folded to 8 lanes.
#[inline(always)]
pub(super) unsafe fn fold(v: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1))
}

/// The lane sums of four 8-lane vectors: `[Σa, Σb, Σc, Σd]`.
#[inline(always)]
pub(super) unsafe fn sum4(a: __m256i, b: __m256i, c: __m256i, d: __m256i) -> __m128i {
    let abcd = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
    _mm_add_epi32(_mm256_castsi256_si128(abcd), _mm256_extracti128_si256(abcd, 1))
}

/// The lane sum of one 8-lane vector.
#[inline(always)]
pub(super) unsafe fn sum1(a: __m256i) -> i32 {
    let h = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    let h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0b01_00_11_10));
    _mm_cvtsi128_si32(_mm_add_epi32(h, _mm_shuffle_epi32(h, 0b10_11_00_01)))
}

/// Constants every block shares.
struct Consts {
    three: __m512i,
    one: __m512i,
    low4: __m512i,
    /// Group-scale word index per 64-value chunk `c`: groups `4c..4c+4`.
    group_idx: [__m512i; 4],
}

#[inline(always)]
unsafe fn consts() -> Consts {
    Consts {
        three: _mm512_set1_epi8(3),
        one: _mm512_set1_epi8(1),
        low4: _mm512_set1_epi8(0x0F),
        group_idx: [words4(0), words4(4), words4(8), words4(12)],
    }
}

/// One Q2_K super-block (84 bytes: `scales[16] qs[64] d dmin`) against the
/// Q8_K block `y`: the exact integer sums `Σ_g sc_g·Σ q·y` and `Σ_g m_g·bsum_g`,
/// each spread over 8 lanes.
#[inline(always)]
unsafe fn q2k_sums(x: *const u8, y: *const u8, k: &Consts) -> (__m256i, __m256i) {
    let s = _mm_loadu_si128(x as *const __m128i);
    let nib = _mm_set1_epi8(0x0F);
    let sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(s, nib));
    let mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), nib));
    let msum = _mm256_madd_epi16(mn16, ld256(y.add(Q8K_BSUMS)));
    let scw = _mm512_castsi256_si512(sc16);
    let mut acc = _mm512_setzero_si512();
    for h in 0..2 {
        // Values 128h + 32j + l are bits 2j..2j+2 of qs[32h + l].
        let qb = bcast256(x.add(16 + 32 * h));
        for jj in 0..2 {
            let sh = 4 * jj as i16;
            let q = _mm512_and_si512(_mm512_srlv_epi16(qb, words2(sh, sh + 2)), k.three);
            let p = _mm512_maddubs_epi16(q, ld512(y.add(Q8K_QS + 128 * h + 64 * jj)));
            acc = _mm512_dpwssd_epi32(acc, p, _mm512_permutexvar_epi16(k.group_idx[2 * h + jj], scw));
        }
    }
    (fold(acc), msum)
}

/// The 16 Q3_K group scales (`sc − 32`, from the 12 bytes at `s`) as words.
#[inline(always)]
pub(super) unsafe fn q3k_scales(s: *const u8) -> __m256i {
    // Low 4 bits: group g < 8 from byte g's low nibble, g ≥ 8 from byte g − 8's high one.
    let lo8 = _mm_loadl_epi64(s as *const __m128i);
    let nib = _mm_set1_epi8(0x0F);
    let lo = _mm_unpacklo_epi64(_mm_and_si128(lo8, nib), _mm_and_si128(_mm_srli_epi16(lo8, 4), nib));
    // High 2 bits: group g from bits 2·(g/4) of byte 8 + g % 4: the four
    // bytes in every dword, dword i shifted right by 2i (`vpsrlvd`), `& 3`.
    let t = _mm_set1_epi32((s.add(8) as *const i32).read_unaligned());
    let hi = _mm_and_si128(_mm_srlv_epi32(t, _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(3));
    let sc = _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32));
    _mm256_cvtepi8_epi16(sc)
}

/// One Q3_K super-block (110 bytes: `hmask[32] qs[64] scales[12] d`) against
/// `y`: the exact `Σ_g sc_g·Σ q·y`, spread over 8 lanes.
#[inline(always)]
unsafe fn q3k_sums(x: *const u8, y: *const u8, k: &Consts) -> __m256i {
    let sc16 = q3k_scales(x.add(96));
    // Codes are u − 4 with u = low 2 bits | hmask bit << 2: the 4 comes off
    // through the activation sums.
    let off = _mm256_slli_epi32(_mm256_madd_epi16(sc16, ld256(y.add(Q8K_BSUMS))), 2);
    let scw = _mm512_castsi256_si512(sc16);
    let hm = bcast256(x);
    let mut acc = _mm512_setzero_si512();
    for h in 0..2 {
        let qb = bcast256(x.add(32 + 32 * h));
        for jj in 0..2 {
            let sh = 4 * jj as i16;
            let lo = _mm512_and_si512(_mm512_srlv_epi16(qb, words2(sh, sh + 2)), k.three);
            // Value 128h + 32j + l takes bit 4h + j of hmask[l].
            let j0 = (4 * h + 2 * jj) as i16;
            let hb = _mm512_and_si512(_mm512_srlv_epi16(hm, words2(j0, j0 + 1)), k.one);
            let u = _mm512_or_si512(lo, _mm512_slli_epi16(hb, 2));
            let p = _mm512_maddubs_epi16(u, ld512(y.add(Q8K_QS + 128 * h + 64 * jj)));
            acc = _mm512_dpwssd_epi32(acc, p, _mm512_permutexvar_epi16(k.group_idx[2 * h + jj], scw));
        }
    }
    _mm256_sub_epi32(fold(acc), off)
}

/// The codebook offset by 128 (unsigned, 1..=241) in every 128-bit lane.
#[inline(always)]
unsafe fn iq4_table() -> __m512i {
    let t: [u8; 16] = std::array::from_fn(|j| (crate::quant::iq4_nl::KVALUES[j] as i16 + 128) as u8);
    _mm512_broadcast_i32x4(_mm_loadu_si128(t.as_ptr() as *const __m128i))
}

/// One IQ4_XS super-block (136 bytes: `d scales_h[2] scales_l[4] qs[128]`)
/// against `y`: the exact `Σ_ib sc_ib·Σ K[q]·y`, spread over 8 lanes.
#[inline(always)]
unsafe fn iq4xs_sums(x: *const u8, y: *const u8, k: &Consts, table: __m512i) -> __m256i {
    // Sub-block scales: low nibble from scales_l (two per byte), high 2 bits
    // from scales_h, minus 32.
    let l = (x.add(4) as *const u32).read_unaligned() as u64;
    let h = (x.add(2) as *const u16).read_unaligned() as u64;
    let s8 = _pdep_u64(l, 0x0F0F_0F0F_0F0F_0F0F) | _pdep_u64(h, 0x0303_0303_0303_0303) << 4;
    let sc = _mm_sub_epi8(_mm_cvtsi64_si128(s8 as i64), _mm_set1_epi8(32));
    // The +128 offset meets both 16-value sums of each sub-block.
    let sc16 = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(sc, sc));
    let off = _mm256_slli_epi32(_mm256_madd_epi16(sc16, ld256(y.add(Q8K_BSUMS))), 7);
    let sc32 = _mm512_castsi256_si512(_mm256_cvtepi8_epi32(sc));
    // Per 128-bit lane of a chunk: low nibbles, high nibbles of one sub-block.
    let nib_shift = _mm512_setr_epi64(
        0,
        0,
        0x0004_0004_0004_0004,
        0x0004_0004_0004_0004,
        0,
        0,
        0x0004_0004_0004_0004,
        0x0004_0004_0004_0004,
    );
    let mut acc = _mm512_setzero_si512();
    for p in 0..4 {
        // Sub-blocks 2p, 2p + 1 (16 bytes each) into lanes [B0 | B0 | B1 | B1].
        let b = _mm512_castsi256_si512(ld256(x.add(8 + 32 * p)));
        let b = _mm512_shuffle_i64x2(b, b, 0b01_01_00_00);
        let idx = _mm512_and_si512(_mm512_srlv_epi16(b, nib_shift), k.low4);
        let v = _mm512_shuffle_epi8(table, idx);
        let d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v, ld512(y.add(Q8K_QS + 64 * p)));
        let s = _mm512_permutexvar_epi32(
            _mm512_setr_epi32(
                2 * p as i32,
                2 * p as i32,
                2 * p as i32,
                2 * p as i32,
                2 * p as i32,
                2 * p as i32,
                2 * p as i32,
                2 * p as i32,
                2 * p as i32 + 1,
                2 * p as i32 + 1,
                2 * p as i32 + 1,
                2 * p as i32 + 1,
                2 * p as i32 + 1,
                2 * p as i32 + 1,
                2 * p as i32 + 1,
                2 * p as i32 + 1,
            ),
            sc32,
        );
        acc = _mm512_add_epi32(acc, _mm512_mullo_epi32(d, s));
    }
    _mm256_sub_epi32(fold(acc), off)
}

/// The K-quant types of this file.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Q2K,
    Q3K,
    Iq4Xs,
}

impl Kind {
    const fn block_bytes(self) -> usize {
        match self {
            Kind::Q2K => 84,
            Kind::Q3K => 110,
            Kind::Iq4Xs => 136,
        }
    }
}

/// One row's block: the integer sum (8 lanes) and, for Q2_K, the mins' sum.
#[inline(always)]
unsafe fn block_sums<const K: u8>(x: *const u8, y: *const u8, k: &Consts, table: __m512i) -> (__m256i, __m256i) {
    match K {
        0 => q2k_sums(x, y, k),
        1 => (q3k_sums(x, y, k), _mm256_setzero_si256()),
        _ => (iq4xs_sums(x, y, k, table), _mm256_setzero_si256()),
    }
}

const fn kind(k: u8) -> Kind {
    match k {
        0 => Kind::Q2K,
        1 => Kind::Q3K,
        _ => Kind::Iq4Xs,
    }
}

/// Offsets of `d` (and Q2_K's `dmin`) in a block.
const fn d_offset(k: Kind) -> usize {
    match k {
        Kind::Q2K => 80,
        Kind::Q3K => 108,
        Kind::Iq4Xs => 0,
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,bmi2")]
#[inline]
unsafe fn dot1<const K: u8>(n: usize, w: *const u8, a: *const u8) -> f32 {
    let kd = kind(K);
    let (k, table) = (consts(), iq4_table());
    let mut sum = 0f32;
    for i in 0..n / 256 {
        let (x, y) = (w.add(i * kd.block_bytes()), a.add(i * Q8K_BYTES));
        let yd = (y as *const f32).read_unaligned();
        let (isum, msum) = block_sums::<K>(x, y, &k, table);
        let xd = f16_at(x.add(d_offset(kd)));
        // The scalar kernels' expressions (q2_k::combine; d·yd·isum).
        sum += if kd == Kind::Q2K {
            let dmin = f16_at(x.add(d_offset(kd) + 2));
            (yd * xd) * sum1(isum) as f32 - (yd * dmin) * sum1(msum) as f32
        } else {
            xd * yd * sum1(isum) as f32
        };
    }
    sum
}

/// Four rows: `stride` bytes apart at a block, blocks `step` bytes apart.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,bmi2")]
#[inline]
unsafe fn dot4<const K: u8>(n: usize, w: *const u8, stride: usize, step: usize, a: *const u8, out: *mut f32) {
    let kd = kind(K);
    let (k, table) = (consts(), iq4_table());
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
        let (x, y) = (w.add(i * step), a.add(i * Q8K_BYTES));
        let yd = _mm_set1_ps((y as *const f32).read_unaligned());
        let (i0, m0) = block_sums::<K>(x, y, &k, table);
        let (i1, m1) = block_sums::<K>(x.add(stride), y, &k, table);
        let (i2, m2) = block_sums::<K>(x.add(2 * stride), y, &k, table);
        let (i3, m3) = block_sums::<K>(x.add(3 * stride), y, &k, table);
        let isum = _mm_cvtepi32_ps(sum4(i0, i1, i2, i3));
        let xd = d4(x, d_offset(kd));
        // Lane r: row r's scalar expression, no fused multiply-add.
        let block = if kd == Kind::Q2K {
            let msum = _mm_cvtepi32_ps(sum4(m0, m1, m2, m3));
            let dmin = d4(x, d_offset(kd) + 2);
            _mm_sub_ps(_mm_mul_ps(_mm_mul_ps(yd, xd), isum), _mm_mul_ps(_mm_mul_ps(yd, dmin), msum))
        } else {
            _mm_mul_ps(_mm_mul_ps(xd, yd), isum)
        };
        sum = _mm_add_ps(sum, block);
    }
    _mm_storeu_ps(out, sum);
}

macro_rules! kernels {
    ($k:expr, $bb:expr, $dot:ident, $dot4:ident, $name:literal) => {
        #[doc = concat!($name, " × Q8_K (see [`crate::quant::DotFn`]); equals scalar bit for bit.")]
        ///
        /// # Safety
        /// AVX-512 F/BW/VL/VNNI CPU; pointers as for [`crate::quant::DotFn`].
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,bmi2")]
        pub unsafe fn $dot(n: usize, w: *const u8, a: *const u8) -> f32 {
            dot1::<$k>(n, w, a)
        }

        #[doc = concat!("Four ", $name, " rows × one Q8_K row; each equals the one-row kernel's.")]
        ///
        /// # Safety
        /// As for [`crate::quant::Dot4Fn`]; AVX-512 F/BW/VL/VNNI.
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,bmi2")]
        pub unsafe fn $dot4(n: usize, w: *const u8, stride: usize, a: *const u8, out: *mut f32) {
            dot4::<$k>(n, w, stride, $bb, a, out)
        }
    };
}

kernels!(0, 84, dot_q2_k, dot4_q2_k, "Q2_K");
kernels!(1, 110, dot_q3_k, dot4_q3_k, "Q3_K");
kernels!(2, 136, dot_iq4_xs, dot4_iq4_xs, "IQ4_XS");
