//! AVX2 + FMA + F16C kernels: activation quantizers (bit-identical to the
//! scalar ones) and dot products for the 32-element block formats and the float
//! formats. K-quant dots live in [`super::avx2_k`].
//!
//! Integer products use `maddubs` (u8 × i8 → i16 pairs) then `madd` with ones
//! (→ i32); signed × signed goes through the sign trick `|x| · sign(y, x)`.
//! No pair sum can saturate: |q| ≤ 31 for weight codes (127 for Q8_0, where
//! 2·127·127 < 2¹⁵) and |q8| ≤ 127.

use crate::quant::{q8_0::BlockQ8_0, q8_1::BlockQ8_1, F16Le};
use std::arch::x86_64::*;

/// f16 bits as f32 by `vcvtph2ps` (every SIMD level here has F16C). The
/// kernels' f16 scales come through here: `half`'s conversion checks for
/// F16C at run time, a branch and a spilled call path in every block
/// (removing it made the AVX2 Q3_K and Q2_K dots ~15% faster on Zen 3).
#[target_feature(enable = "f16c")]
#[inline]
pub(crate) unsafe fn f16_bits(bits: u16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

// ---------------------------------------------------------------- helpers

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn hmax_ps(v: __m256) -> f32 {
    let s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_max_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01));
    _mm_cvtsi128_si32(s)
}

#[inline(always)]
pub(crate) unsafe fn rd16(p: *const u8) -> u16 {
    (p as *const u16).read_unaligned()
}

/// Four halves (bits packed little-endian in a u64) → four floats.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn f16x4(bits: u64) -> __m128 {
    _mm_cvtph_ps(_mm_cvtsi64_si128(bits as i64))
}

/// `f16(a) · f16(b)` broadcast to 8 lanes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn scale_prod(a: u16, b: u16) -> __m256 {
    let v = f16x4(a as u64 | (b as u64) << 16);
    _mm256_broadcastss_ps(_mm_mul_ss(v, _mm_movehdup_ps(v)))
}

/// 16 bytes of packed nibbles → 32 bytes: low nibbles (elements 0..16) in the
/// low lane, high nibbles (elements 16..32) in the high lane.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn nibbles(p: *const u8) -> __m256i {
    let b = _mm_loadu_si128(p as *const __m128i);
    let v = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
    _mm256_and_si256(v, _mm256_set1_epi8(0x0F))
}

/// Byte `j` = 0xFF where bit `j` of `bits` is set, else 0.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn bits_to_bytes(bits: u32) -> __m256i {
    let v = _mm256_set1_epi32(bits as i32);
    let spread = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
    );
    let v = _mm256_shuffle_epi8(v, spread);
    let sel = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(v, sel), sel)
}

/// Σ of 4-byte groups of `u · s` (u unsigned, s signed) as 8 × i32.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn dot_u8i8(u: __m256i, s: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
}

/// Σ of 4-byte groups of `x · y` (both signed) as 8 × i32.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn dot_i8i8(x: __m256i, y: __m256i) -> __m256i {
    dot_u8i8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
}

#[inline(always)]
unsafe fn ld(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

// ------------------------------------------------------ 32-element formats

/// Q4_0 × Q8_0 (see [`DotFn`]).
///
/// # Safety
/// AVX2+FMA+F16C CPU; pointers as for [`DotFn`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q4_0(n: usize, w: *const u8, a: *const u8) -> f32 {
    let nb = n / 32;
    let mut acc = [_mm256_setzero_ps(); 2];
    let off = _mm256_set1_epi8(8);
    for i in 0..nb {
        let (x, y) = (w.add(i * 18), a.add(i * 34));
        super::avx512_rows16_k::prefetch_l2(x.wrapping_add(super::avx512_rows16_k::PREFETCH_AHEAD));
        let d = scale_prod(rd16(x), rd16(y));
        let qx = _mm256_sub_epi8(nibbles(x.add(2)), off);
        let p = dot_i8i8(qx, ld(y.add(2)));
        acc[i & 1] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[i & 1]);
    }
    hsum_ps(_mm256_add_ps(acc[0], acc[1]))
}

/// Q4_1 × Q8_1: `Σ d_x·d_y·Σ q·q8 + m_x·s_y`.
///
/// # Safety
/// AVX2+FMA+F16C CPU; pointers as for [`DotFn`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q4_1(n: usize, w: *const u8, a: *const u8) -> f32 {
    let nb = n / 32;
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut accm = _mm_setzero_ps();
    for i in 0..nb {
        let (x, y) = (w.add(i * 20), a.add(i * 36));
        super::avx512_rows16_k::prefetch_l2(x.wrapping_add(super::avx512_rows16_k::PREFETCH_AHEAD));
        // [d_x, m_x] and [d_y, s_y] → [d_x·d_y, m_x·s_y].
        let v = f16x4((x as *const u32).read_unaligned() as u64 | ((y as *const u32).read_unaligned() as u64) << 32);
        let prod = _mm_mul_ps(v, _mm_movehl_ps(v, v));
        accm = _mm_add_ps(accm, prod);
        let d = _mm256_broadcastss_ps(prod);
        let p = dot_u8i8(nibbles(x.add(4)), ld(y.add(4)));
        acc[i & 1] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[i & 1]);
    }
    hsum_ps(_mm256_add_ps(acc[0], acc[1])) + _mm_cvtss_f32(_mm_movehdup_ps(accm))
}

/// Q5_0 × Q8_0.
///
/// # Safety
/// AVX2+FMA+F16C CPU; pointers as for [`DotFn`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q5_0(n: usize, w: *const u8, a: *const u8) -> f32 {
    let nb = n / 32;
    let mut acc = [_mm256_setzero_ps(); 2];
    let hi = _mm256_set1_epi8(0xF0u8 as i8);
    for i in 0..nb {
        let (x, y) = (w.add(i * 22), a.add(i * 34));
        super::avx512_rows16_k::prefetch_l2(x.wrapping_add(super::avx512_rows16_k::PREFETCH_AHEAD));
        let d = scale_prod(rd16(x), rd16(y));
        let qh = (x.add(2) as *const u32).read_unaligned();
        // q − 16: the nibble with 0xF0 or-ed in where the 5th bit is clear.
        let qx = _mm256_or_si256(nibbles(x.add(6)), _mm256_andnot_si256(bits_to_bytes(qh), hi));
        let p = dot_i8i8(qx, ld(y.add(2)));
        acc[i & 1] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[i & 1]);
    }
    hsum_ps(_mm256_add_ps(acc[0], acc[1]))
}

/// Q5_1 × Q8_1.
///
/// # Safety
/// AVX2+FMA+F16C CPU; pointers as for [`DotFn`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q5_1(n: usize, w: *const u8, a: *const u8) -> f32 {
    let nb = n / 32;
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut accm = _mm_setzero_ps();
    let bit4 = _mm256_set1_epi8(0x10);
    for i in 0..nb {
        let (x, y) = (w.add(i * 24), a.add(i * 36));
        super::avx512_rows16_k::prefetch_l2(x.wrapping_add(super::avx512_rows16_k::PREFETCH_AHEAD));
        let v = f16x4((x as *const u32).read_unaligned() as u64 | ((y as *const u32).read_unaligned() as u64) << 32);
        let prod = _mm_mul_ps(v, _mm_movehl_ps(v, v));
        accm = _mm_add_ps(accm, prod);
        let d = _mm256_broadcastss_ps(prod);
        let qh = (x.add(4) as *const u32).read_unaligned();
        let qx = _mm256_or_si256(nibbles(x.add(8)), _mm256_and_si256(bits_to_bytes(qh), bit4));
        let p = dot_u8i8(qx, ld(y.add(4)));
        acc[i & 1] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[i & 1]);
    }
    hsum_ps(_mm256_add_ps(acc[0], acc[1])) + _mm_cvtss_f32(_mm_movehdup_ps(accm))
}

/// Q8_0 × Q8_0.
///
/// # Safety
/// AVX2+FMA+F16C CPU; pointers as for [`DotFn`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q8_0(n: usize, w: *const u8, a: *const u8) -> f32 {
    let nb = n / 32;
    let mut acc = [_mm256_setzero_ps(); 2];
    for i in 0..nb {
        let (x, y) = (w.add(i * 34), a.add(i * 34));
        super::avx512_rows16_k::prefetch_l2(x.wrapping_add(super::avx512_rows16_k::PREFETCH_AHEAD));
        let d = scale_prod(rd16(x), rd16(y));
        let p = dot_i8i8(ld(x.add(2)), ld(y.add(2)));
        acc[i & 1] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[i & 1]);
    }
    hsum_ps(_mm256_add_ps(acc[0], acc[1]))
}

// ------------------------------------------------------------ float weights

macro_rules! float_dot {
    ($name:ident, $width:expr, $load:ident, $scalar:path) => {
        /// Float weight × f32 activations (see [`DotFn`]).
        ///
        /// # Safety
        /// AVX2+FMA+F16C CPU; pointers as for [`DotFn`].
        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn $name(n: usize, w: *const u8, a: *const u8) -> f32 {
            let a = a as *const f32;
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut i = 0;
            while i + 32 <= n {
                for l in 0..$width / 2 {
                    super::avx2_rows::prefetch(w.wrapping_add((2 * n + i) * $width + 64 * l));
                }
                for k in 0..4 {
                    let wv = $load(w.add((i + 8 * k) * $width));
                    acc[k] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(a.add(i + 8 * k)), acc[k]);
                }
                i += 32;
            }
            while i + 8 <= n {
                acc[0] = _mm256_fmadd_ps($load(w.add(i * $width)), _mm256_loadu_ps(a.add(i)), acc[0]);
                i += 8;
            }
            let mut s = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
            if i < n {
                let rest = n - i;
                s += $scalar(
                    std::slice::from_raw_parts(w.add(i * $width), rest * $width),
                    std::slice::from_raw_parts(a.add(i), rest),
                );
            }
            s
        }
    };
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load_f32(p: *const u8) -> __m256 {
    _mm256_loadu_ps(p as *const f32)
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load_f16(p: *const u8) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load_bf16(p: *const u8) -> __m256 {
    let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
    _mm256_castsi256_ps(_mm256_slli_epi32(h, 16))
}

float_dot!(dot_f32, 4, load_f32, crate::quant::float::dot_f32);
float_dot!(dot_f16, 2, load_f16, crate::quant::float::dot_f16);
float_dot!(dot_bf16, 2, load_bf16, crate::quant::float::dot_bf16);

// ------------------------------------------------- activation quantization

/// Quantizes 32 floats with `x · id`, round-half-even, to i8 (in element order),
/// returning the bytes and their i32 sum lanes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn quantize32(v: [__m256; 4], id: f32) -> (__m256i, __m256i) {
    let mul = _mm256_set1_ps(id);
    let r = |x: __m256| _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(x, mul), _MM_FROUND_TO_NEAREST_INT));
    let (i0, i1, i2, i3) = (r(v[0]), r(v[1]), r(v[2]), r(v[3]));
    let sum = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
    // packs work per 128-bit lane; the permute restores element order.
    let p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    (p, sum)
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load32_amax(x: *const f32) -> ([__m256; 4], f32) {
    let v = [_mm256_loadu_ps(x), _mm256_loadu_ps(x.add(8)), _mm256_loadu_ps(x.add(16)), _mm256_loadu_ps(x.add(24))];
    let sign = _mm256_set1_ps(-0.0);
    let a = |x| _mm256_andnot_ps(sign, x);
    let m = _mm256_max_ps(_mm256_max_ps(a(v[0]), a(v[1])), _mm256_max_ps(a(v[2]), a(v[3])));
    (v, hmax_ps(m))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_q8_0_avx2(src: &[f32], dst: &mut [BlockQ8_0]) {
    for (xb, b) in src.chunks_exact(32).zip(dst.iter_mut()) {
        let (v, m) = load32_amax(xb.as_ptr());
        b.d = F16Le::from_f32(m / 127.0);
        let (q, _) = quantize32(v, if m != 0.0 { 127.0 / m } else { 0.0 });
        _mm256_storeu_si256(b.qs.as_mut_ptr() as *mut __m256i, q);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_q8_1_avx2(src: &[f32], dst: &mut [BlockQ8_1]) {
    for (xb, b) in src.chunks_exact(32).zip(dst.iter_mut()) {
        let (v, m) = load32_amax(xb.as_ptr());
        let d = m / 127.0;
        let (q, sum) = quantize32(v, if m != 0.0 { 127.0 / m } else { 0.0 });
        _mm256_storeu_si256(b.qs.as_mut_ptr() as *mut __m256i, q);
        b.d = F16Le::from_f32(d);
        b.s = F16Le::from_f32(d * hsum_epi32(sum) as f32);
    }
}

/// Q8_0 activation quantizer, bit-identical to
/// [`crate::quant::q8_0::quantize_activations`]. Only selected on AVX2 CPUs.
pub fn quantize_act_q8_0(src: &[f32], dst: &mut [u8]) {
    assert!(matches!(crate::isa::detected(), crate::isa::Isa::Avx2 | crate::isa::Isa::Avx512));
    assert_eq!(src.len() / 32 * 34, dst.len());
    // SAFETY: AVX2 support checked above.
    unsafe { quantize_q8_0_avx2(src, bytemuck::cast_slice_mut(dst)) }
}

/// Q8_1 activation quantizer, bit-identical to [`crate::quant::q8_1::quantize`].
pub fn quantize_act_q8_1(src: &[f32], dst: &mut [u8]) {
    assert!(matches!(crate::isa::detected(), crate::isa::Isa::Avx2 | crate::isa::Isa::Avx512));
    assert_eq!(src.len() / 32 * 36, dst.len());
    // SAFETY: AVX2 support checked above.
    unsafe { quantize_q8_1_avx2(src, bytemuck::cast_slice_mut(dst)) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_q8_k_avx2(src: &[f32], dst: &mut [crate::quant::q8_k::BlockQ8K]) {
    let sign = _mm256_set1_ps(-0.0);
    for (xb, b) in src.chunks_exact(256).zip(dst.iter_mut()) {
        let x = xb.as_ptr();
        let mut m = _mm256_setzero_ps();
        for c in 0..32 {
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x.add(8 * c))));
        }
        let amax = hmax_ps(m);
        if amax == 0.0 {
            b.d = 0.0;
            b.qs = [0; 256];
            b.bsums = [0; 16];
            continue;
        }
        // The first element of largest magnitude keeps its sign (as the scalar scan).
        let target = _mm256_set1_ps(amax);
        let mut max = amax;
        for c in 0..32 {
            let eq = _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x.add(8 * c))), target, _CMP_EQ_OQ);
            let bits = _mm256_movemask_ps(eq);
            if bits != 0 {
                max = xb[8 * c + bits.trailing_zeros() as usize];
                break;
            }
        }
        let iscale = -127.0 / max;
        let mul = _mm256_set1_ps(iscale);
        let r = |c: usize| {
            let v = _mm256_mul_ps(_mm256_loadu_ps(x.add(8 * c)), mul);
            _mm256_cvtps_epi32(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT))
        };
        let ones8 = _mm256_set1_epi8(1);
        let ones16 = _mm256_set1_epi16(1);
        for k in 0..8 {
            // 32 values → 32 bytes (saturating packs = min(127) here, |q| ≤ 127).
            let p = _mm256_packs_epi16(
                _mm256_packs_epi32(r(4 * k), r(4 * k + 1)),
                _mm256_packs_epi32(r(4 * k + 2), r(4 * k + 3)),
            );
            let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(b.qs.as_mut_ptr().add(32 * k) as *mut __m256i, p);
            // Sums of 16: lanes 0..4 of the i32 quads → group 2k, 4..8 → group 2k+1.
            let s = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, p), ones16);
            let s = _mm256_hadd_epi32(s, s);
            let s = _mm256_hadd_epi32(s, s);
            b.bsums[2 * k] = _mm256_extract_epi32(s, 0) as i16;
            b.bsums[2 * k + 1] = _mm256_extract_epi32(s, 4) as i16;
        }
        b.d = 1.0 / iscale;
    }
}

/// Q8_K activation quantizer, bit-identical to [`crate::quant::q8_k::quantize`].
pub fn quantize_act_q8_k(src: &[f32], dst: &mut [u8]) {
    assert!(matches!(crate::isa::detected(), crate::isa::Isa::Avx2 | crate::isa::Isa::Avx512));
    assert_eq!(src.len() / 256 * 292, dst.len());
    // SAFETY: AVX2 support checked above; `dst` is 4-aligned scratch (Q8_K contract).
    unsafe { quantize_q8_k_avx2(src, bytemuck::cast_slice_mut(dst)) }
}
