//! AVX-512 VNNI dot kernels for Q2_K, Q3_K and IQ4_XS against Q8_K (the other
//! low-bit types use the AVX2 kernels of [`super::avx2_lowk`] at this level).
//!
//! 64 values per step: `vpdpbusd` (u8 × i8, four products per i32 lane, no
//! saturation) gives one i32 per 4 values, so a group of 16 is 4 lanes and the
//! group scales multiply lane-wise (`mullo_epi32`). Signed codes are offset to
//! unsigned (`q + 4` for Q3_K, `K + 128` for IQ4_XS) and the offset times the
//! activation group sums (`bsums`) is subtracted. All sums are exact integers,
//! combined in the scalar `vec_dot`'s float order: bit-identical to scalar.

use crate::quant::iq4_nl::KVALUES;
use crate::quant::{iq4_xs, q2_k, q3_k, q8_k};
use std::arch::x86_64::*;

const Q8K: usize = std::mem::size_of::<q8_k::BlockQ8K>();

#[inline(always)]
unsafe fn q8k(a: *const u8, i: usize) -> &'static q8_k::BlockQ8K {
    &*(a.add(i * Q8K) as *const q8_k::BlockQ8K)
}

/// Each of 16 group values repeated over the 4 lanes of its 128-bit lane run:
/// `out[4g + l] = v[g]`, for the 4 groups starting at `g0`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn group_scales(v: &[i32; 16], g0: usize) -> __m512i {
    _mm512_setr_epi32(
        v[g0],
        v[g0],
        v[g0],
        v[g0],
        v[g0 + 1],
        v[g0 + 1],
        v[g0 + 1],
        v[g0 + 1],
        v[g0 + 2],
        v[g0 + 2],
        v[g0 + 2],
        v[g0 + 2],
        v[g0 + 3],
        v[g0 + 3],
        v[g0 + 3],
        v[g0 + 3],
    )
}

/// Two 32-value runs `lo`, `hi` (256-bit each) as one 512-bit vector.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
}

/// Bits `2j..2j+2` of each byte of `qs`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn crumbs(qs: __m256i, j: usize, three: __m256i) -> __m256i {
    _mm256_and_si256(_mm256_srl_epi16(qs, _mm_cvtsi32_si128(2 * j as i32)), three)
}

/// `Σ_g s_g·bsum_g` over the 16 groups.
#[inline(always)]
fn scaled_bsums(s: &[i32; 16], y: &q8_k::BlockQ8K) -> i32 {
    s.iter().zip(&y.bsums).map(|(&s, &b)| s * b as i32).sum()
}

/// # Safety
/// As for [`DotFn`]; needs AVX-512 F/BW/VL/VNNI.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_q2_k(n: usize, w: *const u8, a: *const u8) -> f32 {
    let three = _mm256_set1_epi8(3);
    let mut sum = 0f32;
    for i in 0..n / 256 {
        let x = &*(w.add(i * 84) as *const q2_k::BlockQ2K);
        let y = q8k(a, i);
        let sc: [i32; 16] = std::array::from_fn(|g| (x.scales[g] & 15) as i32);
        let mn: [i32; 16] = std::array::from_fn(|g| (x.scales[g] >> 4) as i32);
        let mut acc = _mm512_setzero_si512();
        for h in 0..2 {
            let qs = _mm256_loadu_si256(x.qs.as_ptr().add(32 * h) as *const __m256i);
            for jj in 0..2 {
                let q = join(crumbs(qs, 2 * jj, three), crumbs(qs, 2 * jj + 1, three));
                let e = 128 * h + 64 * jj;
                let q8 = _mm512_loadu_si512(y.qs.as_ptr().add(e) as *const _);
                let d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, q8);
                acc = _mm512_add_epi32(acc, _mm512_mullo_epi32(d, group_scales(&sc, e / 16)));
            }
        }
        sum += q2_k::combine(x, y, _mm512_reduce_add_epi32(acc), scaled_bsums(&mn, y));
    }
    sum
}

/// # Safety
/// As for [`DotFn`]; needs AVX-512 F/BW/VL/VNNI.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_q3_k(n: usize, w: *const u8, a: *const u8) -> f32 {
    let three = _mm256_set1_epi8(3);
    let one = _mm256_set1_epi8(1);
    let mut sum = 0f32;
    for i in 0..n / 256 {
        let x = &*(w.add(i * 110) as *const q3_k::BlockQ3K);
        let y = q8k(a, i);
        let sc8 = q3_k::scales(&x.scales);
        let sc: [i32; 16] = std::array::from_fn(|g| sc8[g] as i32);
        let hm = _mm256_loadu_si256(x.hmask.as_ptr() as *const __m256i);
        let mut acc = _mm512_setzero_si512();
        for h in 0..2 {
            let qs = _mm256_loadu_si256(x.qs.as_ptr().add(32 * h) as *const __m256i);
            // u = low | high << 2 in 0..8 (q = u − 4).
            let u = |j: usize| {
                let hb = _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128((4 * h + j) as i32)), one);
                _mm256_or_si256(crumbs(qs, j, three), _mm256_slli_epi16(hb, 2))
            };
            for jj in 0..2 {
                let q = join(u(2 * jj), u(2 * jj + 1));
                let e = 128 * h + 64 * jj;
                let q8 = _mm512_loadu_si512(y.qs.as_ptr().add(e) as *const _);
                let d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, q8);
                acc = _mm512_add_epi32(acc, _mm512_mullo_epi32(d, group_scales(&sc, e / 16)));
            }
        }
        let isum = _mm512_reduce_add_epi32(acc) - 4 * scaled_bsums(&sc, y);
        sum += x.d.to_f32() * y.d * isum as f32;
    }
    sum
}

/// # Safety
/// As for [`DotFn`]; needs AVX-512 F/BW/VL/VNNI.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_iq4_xs(n: usize, w: *const u8, a: *const u8) -> f32 {
    // The table offset by 128 (unsigned, 1..=241), in every 128-bit lane.
    let t: [u8; 16] = std::array::from_fn(|j| (KVALUES[j] as i16 + 128) as u8);
    let table = _mm512_broadcast_i32x4(_mm_loadu_si128(t.as_ptr() as *const __m128i));
    let m4 = _mm256_set1_epi8(0x0F);
    let mut sum = 0f32;
    for i in 0..n / 256 {
        let x = &*(w.add(i * 136) as *const iq4_xs::BlockIq4Xs);
        let y = q8k(a, i);
        let s8 = x.scales();
        // Scale per group of 16 (two groups per sub-block of 32).
        let sc: [i32; 16] = std::array::from_fn(|g| s8[g / 2] as i32);
        let mut acc = _mm512_setzero_si512();
        for p in 0..4 {
            // Sub-blocks 2p, 2p+1: 32 nibble bytes → [lo₀ | hi₀ | lo₁ | hi₁].
            let b = _mm256_loadu_si256(x.qs.as_ptr().add(32 * p) as *const __m256i);
            let lo = _mm256_and_si256(b, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), m4);
            let idx = _mm512_shuffle_i64x2(join(lo, hi), join(lo, hi), 0b11_01_10_00);
            let v = _mm512_shuffle_epi8(table, idx);
            let q8 = _mm512_loadu_si512(y.qs.as_ptr().add(64 * p) as *const _);
            let d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v, q8);
            acc = _mm512_add_epi32(acc, _mm512_mullo_epi32(d, group_scales(&sc, 4 * p)));
        }
        let isum = _mm512_reduce_add_epi32(acc) - 128 * scaled_bsums(&sc, y);
        sum += x.d.to_f32() * y.d * isum as f32;
    }
    sum
}
