//! AVX-512 (BW) dot products for the K-quants against Q8_K activations: the
//! AVX2 scheme at twice the width. A 512-bit vector holds the 64 values of one
//! Q4_K/Q5_K chunk (two sub-blocks) or a quarter pair of a Q6_K half; the
//! per-16/32 scales multiply in through `vpmaddwd` with a permuted scale vector.

use super::avx2::{hsum_ps, rd16};
use crate::quant::q4_k::scales_mins;
use std::arch::x86_64::*;

const Q8K_QS: usize = 4;
const Q8K_BSUMS: usize = 260;
const Q8K_BYTES: usize = 292;

#[inline(always)]
unsafe fn ld256(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

#[inline(always)]
unsafe fn ld512(p: *const u8) -> __m512i {
    _mm512_loadu_si512(p as *const _)
}

#[inline(always)]
unsafe fn f16(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// `[lo | hi]` as one vector.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
}

/// Word index vector: 16 × `a` then 16 × `b`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn idx2(a: i16, b: i16) -> __m512i {
    join(_mm256_set1_epi16(a), _mm256_set1_epi16(b))
}

/// `R` Q4_K/Q5_K rows (`stride` bytes apart) × one Q8_K row. Each row gets
/// exactly the one-row arithmetic (the rows only share the activation loads
/// and interleave), so `R = 4` gives the same bits as `R = 1` row by row.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn rows_k4k5<const Q5: bool, const R: usize>(n: usize, w: *const u8, stride: usize, a: *const u8) -> [f32; R] {
    let (bb, qs_off) = if Q5 { (176, 48) } else { (144, 16) };
    let nb = n / 256;
    let mut acc = [_mm512_setzero_ps(); R];
    let mut accm = [_mm256_setzero_ps(); R];
    let low = _mm256_set1_epi8(0x0F);
    let one = _mm256_set1_epi8(1);
    for i in 0..nb {
        let y = a.add(i * Q8K_BYTES);
        let yd = (y as *const f32).read_unaligned();
        let bs = ld256(y.add(Q8K_BSUMS));
        let ys =
            [ld512(y.add(Q8K_QS)), ld512(y.add(Q8K_QS + 64)), ld512(y.add(Q8K_QS + 128)), ld512(y.add(Q8K_QS + 192))];
        for r in 0..R {
            let x = w.add(r * stride + i * bb);
            let d = _mm512_set1_ps(yd * f16(rd16(x)));
            let dmin = _mm256_set1_ps(yd * f16(rd16(x.add(2))));
            let (sc, mn) = scales_mins(&*(x.add(4) as *const [u8; 12]));
            // Words m0, m0, m1, m1, …: each min meets both 16-value bsums of its sub-block.
            let m8 = _mm_loadl_epi64(mn.as_ptr() as *const __m128i);
            let m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
            accm[r] = _mm256_fmadd_ps(dmin, _mm256_cvtepi32_ps(_mm256_madd_epi16(bs, m16)), accm[r]);
            let scw = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_loadl_epi64(sc.as_ptr() as *const __m128i)));
            let qh = if Q5 { ld256(x.add(16)) } else { _mm256_setzero_si256() };
            let mut sumi = _mm512_setzero_si512();
            for (c, &yc) in ys.iter().enumerate() {
                let q = ld256(x.add(qs_off + 32 * c));
                let mut lo = _mm256_and_si256(q, low);
                let mut hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
                if Q5 {
                    let h0 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c as i32)), one);
                    let h1 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c as i32 + 1)), one);
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16(h0, 4));
                    hi = _mm256_or_si256(hi, _mm256_slli_epi16(h1, 4));
                }
                let p = _mm512_maddubs_epi16(join(lo, hi), yc);
                let s = _mm512_permutexvar_epi16(idx2(2 * c as i16, 2 * c as i16 + 1), scw);
                sumi = _mm512_add_epi32(sumi, _mm512_madd_epi16(p, s));
            }
            acc[r] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi), acc[r]);
        }
    }
    std::array::from_fn(|r| _mm512_reduce_add_ps(acc[r]) - hsum_ps(accm[r]))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn dot_k4k5<const Q5: bool>(n: usize, w: *const u8, a: *const u8) -> f32 {
    rows_k4k5::<Q5, 1>(n, w, 0, a)[0]
}

/// Four Q4_K rows × one Q8_K row (see [`crate::quant::Dot4Fn`]); each row's
/// result equals [`dot_q4_k`]'s.
///
/// # Safety
/// AVX-512 F/BW/VL CPU; pointers as for [`crate::quant::Dot4Fn`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot4_q4_k(n: usize, w: *const u8, stride: usize, a: *const u8, out: *mut f32) {
    let r = rows_k4k5::<false, 4>(n, w, stride, a);
    std::ptr::copy_nonoverlapping(r.as_ptr(), out, 4);
}

/// Four Q5_K rows × one Q8_K row; each row's result equals [`dot_q5_k`]'s.
///
/// # Safety
/// As for [`dot4_q4_k`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot4_q5_k(n: usize, w: *const u8, stride: usize, a: *const u8, out: *mut f32) {
    let r = rows_k4k5::<true, 4>(n, w, stride, a);
    std::ptr::copy_nonoverlapping(r.as_ptr(), out, 4);
}

/// Q4_K × Q8_K (see [`crate::quant::DotFn`]).
///
/// # Safety
/// AVX-512 F/BW/VL CPU; pointers as for [`crate::quant::DotFn`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_q4_k(n: usize, w: *const u8, a: *const u8) -> f32 {
    dot_k4k5::<false>(n, w, a)
}

/// Q5_K × Q8_K.
///
/// # Safety
/// AVX-512 F/BW/VL CPU; pointers as for [`crate::quant::DotFn`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_q5_k(n: usize, w: *const u8, a: *const u8) -> f32 {
    dot_k4k5::<true>(n, w, a)
}

/// Q6_K × Q8_K.
///
/// # Safety
/// AVX-512 F/BW/VL CPU; pointers as for [`crate::quant::DotFn`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_q6_k(n: usize, w: *const u8, a: *const u8) -> f32 {
    let nb = n / 256;
    let mut acc = _mm512_setzero_ps();
    let low = _mm512_set1_epi8(0x0F);
    let three = _mm512_set1_epi8(3);
    for i in 0..nb {
        let (x, y) = (w.add(i * 210), a.add(i * Q8K_BYTES));
        let d = _mm512_set1_ps((y as *const f32).read_unaligned() * f16(rd16(x.add(208))));
        let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(x.add(192) as *const __m128i));
        // Offset term: 32 · Σ_g sc_g · bsum_g.
        let off = _mm256_madd_epi16(sc16, ld256(y.add(Q8K_BSUMS)));
        let mut sumi = _mm512_castsi256_si512(_mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(off, 5)));
        sumi = _mm512_inserti64x4(sumi, _mm256_setzero_si256(), 1);
        let scw = _mm512_castsi256_si512(sc16);
        for h in 0..2 {
            let ql = ld512(x.add(64 * h)); // [ql0 | ql1]
            let qh = ld256(x.add(128 + 32 * h));
            let zqh = join(qh, _mm256_srli_epi16(qh, 2)); // bits for quarters 0 | 1
            let ha = _mm512_slli_epi16(_mm512_and_si512(zqh, three), 4);
            let hb = _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(zqh, 4), three), 4);
            let qa = _mm512_or_si512(_mm512_and_si512(ql, low), ha); // values 0..64 of the half
            let qb = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low), hb); // 64..128
            let g = 8 * h as i16;
            for (k, q) in [qa, qb].into_iter().enumerate() {
                let p = _mm512_maddubs_epi16(q, ld512(y.add(Q8K_QS + 128 * h + 64 * k)));
                let b = g + 4 * k as i16;
                // Words 0..8 → group b, 8..16 → b+1, 16..24 → b+2, 24..32 → b+3.
                let idx = join(
                    _mm256_setr_epi16(b, b, b, b, b, b, b, b, b + 1, b + 1, b + 1, b + 1, b + 1, b + 1, b + 1, b + 1),
                    _mm256_setr_epi16(
                        b + 2,
                        b + 2,
                        b + 2,
                        b + 2,
                        b + 2,
                        b + 2,
                        b + 2,
                        b + 2,
                        b + 3,
                        b + 3,
                        b + 3,
                        b + 3,
                        b + 3,
                        b + 3,
                        b + 3,
                        b + 3,
                    ),
                );
                sumi = _mm512_add_epi32(sumi, _mm512_madd_epi16(p, _mm512_permutexvar_epi16(idx, scw)));
            }
        }
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi), acc);
    }
    _mm512_reduce_add_ps(acc)
}
