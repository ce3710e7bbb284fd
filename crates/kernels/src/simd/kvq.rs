//! AVX2 and AVX-512 dequantizers of quantized KV cache rows
//! ([`crate::kv_quant`]): `n` rows of `d` values, row `j`'s blocks starting at
//! byte `src + j·stride`, into `dst[j·d ..]` (f32). Both compute `x = f32(q)·d`
//! per value exactly as the scalar `dequantize` does (one f32 multiply), so
//! results are bit-identical to scalar.
//!
//! Block layouts (GGUF): Q8_0 is `[d: f16 LE][qs: 32 × i8]` (34 bytes), Q4_0 is
//! `[d: f16 LE][qs: 16 × u8]` (18 bytes) with value `j` in the low nibble of
//! `qs[j]` and value `j + 16` in its high nibble, both offset by 8.

use std::arch::x86_64::*;

/// The block scale at `b` (f16 LE bits, any alignment) broadcast to 8 lanes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn scale8(b: *const u8) -> __m256 {
    let bits = std::ptr::read_unaligned(b as *const u16);
    _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// Q8_0 rows to f32 (AVX2).
///
/// # Safety
/// AVX2+F16C CPU; `d % 32 == 0`; each row's `d / 32` blocks readable at
/// `src + j·stride`; `dst` valid for `n·d` writes.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn widen_q8_0_avx2(src: *const u8, stride: usize, n: usize, d: usize, dst: *mut f32) {
    for j in 0..n {
        let (row, out) = (src.add(j * stride), dst.add(j * d));
        for b in 0..d / 32 {
            let (blk, o) = (row.add(b * 34), out.add(b * 32));
            let s = scale8(blk);
            for c in 0..4 {
                let q = _mm_loadl_epi64(blk.add(2 + 8 * c) as *const __m128i);
                let x = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
                _mm256_storeu_ps(o.add(8 * c), _mm256_mul_ps(x, s));
            }
        }
    }
}

/// Q4_0 rows to f32 (AVX2).
///
/// # Safety
/// As [`widen_q8_0_avx2`], with 18-byte blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn widen_q4_0_avx2(src: *const u8, stride: usize, n: usize, d: usize, dst: *mut f32) {
    let (mask, eight) = (_mm_set1_epi8(0x0F), _mm_set1_epi8(8));
    for j in 0..n {
        let (row, out) = (src.add(j * stride), dst.add(j * d));
        for b in 0..d / 32 {
            let (blk, o) = (row.add(b * 18), out.add(b * 32));
            let s = scale8(blk);
            let qs = _mm_loadu_si128(blk.add(2) as *const __m128i);
            // Codes 0..16 (low nibbles) and 16..32 (high nibbles), minus 8: i8.
            let lo = _mm_sub_epi8(_mm_and_si128(qs, mask), eight);
            let hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16::<4>(qs), mask), eight);
            for (c, q) in [lo, _mm_srli_si128::<8>(lo), hi, _mm_srli_si128::<8>(hi)].into_iter().enumerate() {
                let x = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
                _mm256_storeu_ps(o.add(8 * c), _mm256_mul_ps(x, s));
            }
        }
    }
}

/// The block scale at `b` broadcast to 16 lanes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn scale16(b: *const u8) -> __m512 {
    let bits = std::ptr::read_unaligned(b as *const u16);
    _mm512_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// Q8_0 rows to f32 (AVX-512: 16 codes per conversion).
///
/// # Safety
/// AVX-512 F/BW/VL CPU; otherwise as [`widen_q8_0_avx2`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn widen_q8_0_avx512(src: *const u8, stride: usize, n: usize, d: usize, dst: *mut f32) {
    for j in 0..n {
        let (row, out) = (src.add(j * stride), dst.add(j * d));
        for b in 0..d / 32 {
            let (blk, o) = (row.add(b * 34), out.add(b * 32));
            let s = scale16(blk);
            for c in 0..2 {
                let q = _mm_loadu_si128(blk.add(2 + 16 * c) as *const __m128i);
                let x = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
                _mm512_storeu_ps(o.add(16 * c), _mm512_mul_ps(x, s));
            }
        }
    }
}

/// Q4_0 rows to f32 (AVX-512).
///
/// # Safety
/// AVX-512 F/BW/VL CPU; otherwise as [`widen_q4_0_avx2`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn widen_q4_0_avx512(src: *const u8, stride: usize, n: usize, d: usize, dst: *mut f32) {
    let (mask, eight) = (_mm_set1_epi8(0x0F), _mm_set1_epi8(8));
    for j in 0..n {
        let (row, out) = (src.add(j * stride), dst.add(j * d));
        for b in 0..d / 32 {
            let (blk, o) = (row.add(b * 18), out.add(b * 32));
            let s = scale16(blk);
            let qs = _mm_loadu_si128(blk.add(2) as *const __m128i);
            let lo = _mm_sub_epi8(_mm_and_si128(qs, mask), eight);
            let hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16::<4>(qs), mask), eight);
            _mm512_storeu_ps(o, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo)), s));
            _mm512_storeu_ps(o.add(16), _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi)), s));
        }
    }
}

/// Prefetches `n` rows of `row_bytes` bytes (row `j` at `src + j·stride`) into L1.
///
/// # Safety
/// AVX2 CPU (prefetches never fault; addresses use wrapping arithmetic).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn prefetch_bytes(src: *const u8, stride: usize, n: usize, row_bytes: usize) {
    for j in 0..n {
        let row = src.wrapping_add(j * stride) as *const i8;
        let mut b = 0;
        while b < row_bytes {
            _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(b));
            b += 64;
        }
        // The last line when the row does not start on a line boundary.
        _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(row_bytes.saturating_sub(1)));
    }
}
