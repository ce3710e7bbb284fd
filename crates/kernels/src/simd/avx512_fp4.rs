//! AVX-512 (F/BW/VL/VNNI) four-row decode kernels and 4 × 2 prefill tiles for
//! MXFP4 and NVFP4 against Q8_0 activations, over the file layout.
//!
//! Same numerics as the one-row dots ([`super::avx512_fp`]): doubled E2M1 codes
//! (integers −12..12), integer sums per (sub-)block, one f32 FMA per lane group.
//! The difference is how signs are handled: instead of moving each code's sign
//! onto the activations (per row), the codes are looked up as `2·E2M1 + 12`
//! (unsigned 0..24) and `12·Σy` is subtracted once per activation block, shared
//! by every weight row: `Σ (q + 12)·y − 12·Σy = Σ q·y`, exact in i32. Per row and
//! block that leaves a load, a nibble split, one shuffle and one `vpdpbusd`.
//!
//! Each activation row goes through exactly the instructions of the four-row
//! decode kernel (the tile only shares the weight decode), so a row's result
//! does not depend on its batch, as for the Q4_0/Q8_0 tiles in [`super::avx512`].

use super::avx2::rd16;
use super::avx512::{reduce, store_tile, y2_nibble_order, BlockPairs, FileRows, ZERO_BLOCK};
use super::avx512_packed::Units;
use std::arch::x86_64::*;

/// `2·E2M1(code) + 12` by code (0..24, unsigned for `vpdpbusd`).
const E2M1_X2_PLUS12: [u8; 16] = [12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0];

/// The lookup table in every 128-bit lane.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn lut() -> __m512i {
    _mm512_broadcast_i32x4(_mm_loadu_si128(E2M1_X2_PLUS12.as_ptr() as *const __m128i))
}

/// `−12·Σy` per 4-byte group of `y` (the seed that undoes the +12 offset).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn offset_seed(y: __m512i) -> __m512i {
    let s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(12), y);
    _mm512_sub_epi32(_mm512_setzero_si512(), s)
}

// ----------------------------------------------------------------- MXFP4

/// E8M0 bytes (i32 lanes) → `2^(e−128)` (ggml's halved scale), as
/// [`crate::quant::minifloat::e8m0_half`]: `(e−1)<<23` for e ≥ 2, the
/// subnormals `0x200000<<e` for e < 2 (0xFF, NaN, is refused at load).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn e8m0_half8(e: __m256i) -> __m256 {
    let normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    let sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
    let small = _mm256_cmplt_epi32_mask(e, _mm256_set1_epi32(2));
    _mm256_castsi256_ps(_mm256_mask_blend_epi32(small, normal, sub))
}

/// `R` rows of MXFP4 × `A` Q8_0 rows, two 32-value blocks per step. The block
/// layout is Q4_0's (a 1-byte E8M0 head, then 16 bytes: element j low nibble,
/// j+16 high), so the weights load as `[lo₀, lo₁ | hi₀, hi₁]` and the
/// activations are put in that order once per block pair.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn mxfp4_tile<const R: usize, const A: usize>(n: usize, l: FileRows, a: [*const u8; A]) -> [[f32; 4]; A] {
    let nb = n / 32;
    let t = lut();
    let low = _mm256_set1_epi8(0x0F);
    let mut acc = [[_mm512_setzero_ps(); R]; A];
    let mut b = 0;
    while b < nb {
        let pair = b + 1 < nb;
        // Lanes 2r+k: scale of row r, block b+k (the u16 read takes E8M0 and a quant byte).
        let e = _mm256_and_si256(_mm256_cvtepu16_epi32(l.heads16::<R>(b, pair)), _mm256_set1_epi32(0xFF));
        let xs = e8m0_half8(e);
        let mut yv = [_mm512_setzero_si512(); A];
        let mut seed = [_mm512_setzero_si512(); A];
        let mut prod = [_mm512_setzero_ps(); A];
        for j in 0..A {
            let y0 = a[j].add(b * 34);
            let y1 = if pair { y0.add(34) } else { ZERO_BLOCK.as_ptr() };
            yv[j] = y2_nibble_order(y0.add(2), y1.add(2));
            seed[j] = offset_seed(yv[j]);
            let ys = _mm256_cvtph_ps(_mm_set1_epi32((rd16(y0) as u32 | (rd16(y1) as u32) << 16) as i32));
            prod[j] = _mm512_castps256_ps512(_mm256_mul_ps(xs, ys));
        }
        l.prefetch::<R>(b);
        for r in 0..R {
            let (q0, q1) = l.quants(r, b, pair);
            let v = _mm256_set_m128i(_mm_loadu_si128(q1 as *const __m128i), _mm_loadu_si128(q0 as *const __m128i));
            let nib = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_and_si256(v, low)),
                _mm256_and_si256(_mm256_srli_epi16(v, 4), low),
                1,
            );
            let q = _mm512_shuffle_epi8(t, nib);
            let k = 2 * r as i32;
            let idx = _mm512_setr_epi32(k, k, k, k, k + 1, k + 1, k + 1, k + 1, k, k, k, k, k + 1, k + 1, k + 1, k + 1);
            for j in 0..A {
                let p = _mm512_dpbusd_epi32(seed[j], q, yv[j]);
                acc[j][r] = _mm512_fmadd_ps(_mm512_permutexvar_ps(idx, prod[j]), _mm512_cvtepi32_ps(p), acc[j][r]);
            }
        }
        b += 2;
    }
    let mut outs = [[0f32; 4]; A];
    for j in 0..A {
        outs[j] = reduce(acc[j]);
    }
    outs
}

/// Four MXFP4 rows × one Q8_0 row (see [`Dot4Fn`]).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI CPU; pointers as for [`Dot4Fn`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot4_mxfp4(n: usize, w: *const u8, stride: usize, a: *const u8, out: *mut f32) {
    let r = mxfp4_tile::<4, 1>(n, FileRows::new::<4>(w, stride, n, 17, 1), [a]);
    std::ptr::copy_nonoverlapping(r[0].as_ptr(), out, 4);
}

/// Four MXFP4 rows × two Q8_0 rows (see [`TileFn`]).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI CPU; pointers as for [`TileFn`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn tile_mxfp4(n: usize, w: *const u8, stride: usize, a: *const u8, a_stride: usize, y: *mut f32, ys: usize) {
    let r = mxfp4_tile::<4, 2>(n, FileRows::new::<4>(w, stride, n, 17, 1), [a, a.add(a_stride)]);
    store_tile(r, y, ys);
}

// ----------------------------------------------------------------- NVFP4

/// `R` rows of NVFP4 × `A` Q8_0 rows, one 64-value block (two Q8_0 blocks) per step.
///
/// A block's 32 quant bytes split into `[lo | hi]` nibbles: byte `8s+j` holds
/// elements `16s+j` (low) and `16s+8+j` (high). In 8-element chunks `c₀..c₇` of
/// the activations that is `[c₀ c₂ c₄ c₆ | c₁ c₃ c₅ c₇]`, one 64-bit permute per
/// activation block; each pair of i32 lanes then belongs to one sub-block:
/// lane `l` to sub-block `(l/2) mod 4`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn nvfp4_tile<const R: usize, const A: usize>(n: usize, w: Units, a: [*const u8; A]) -> [[f32; 4]; A] {
    let nb = n / 64;
    let t = lut();
    let low = _mm256_set1_epi8(0x0F);
    let chunks = _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7);
    // Sub-block scale s ↔ lanes of the 16 i32 results.
    let sub = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 0, 0, 1, 1, 2, 2, 3, 3);
    let mut acc = [[_mm512_setzero_ps(); R]; A];
    for b in 0..nb {
        // The four UE4M3 scales of each row (lane 4r+s), as ggml's halved value:
        // (c & 0x7F) << 7 reads as f16 E4M3(c)·2⁻⁸, times 2⁷; 0x7F (NaN, refused
        // at load) reads as 0 like the scalar reference.
        let mut d = [0i32; 4];
        for (r, dr) in d.iter_mut().enumerate().take(R) {
            *dr = (w.at(r, b) as *const i32).read_unaligned();
        }
        let c = _mm256_cvtepu8_epi16(_mm_loadu_si128(d.as_ptr() as *const __m128i));
        let c = _mm256_and_si256(c, _mm256_set1_epi16(0x7F));
        let nan = _mm256_cmpeq_epi16_mask(c, _mm256_set1_epi16(0x7F));
        let h = _mm256_maskz_mov_epi16(!nan, _mm256_slli_epi16(c, 7));
        let xs = _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(128.0));
        let mut yv = [_mm512_setzero_si512(); A];
        let mut seed = [_mm512_setzero_si512(); A];
        let mut prod = [_mm512_setzero_ps(); A];
        for j in 0..A {
            let (y0, y1) = (a[j].add(2 * b * 34), a[j].add((2 * b + 1) * 34));
            let y = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256(y0.add(2) as *const __m256i)),
                _mm256_loadu_si256(y1.add(2) as *const __m256i),
                1,
            );
            yv[j] = _mm512_permutexvar_epi64(chunks, y);
            seed[j] = offset_seed(yv[j]);
            // Sub-blocks 0, 1 take d_y of the first Q8_0 block, 2, 3 the second.
            let (d0, d1) = (half::f16::from_bits(rd16(y0)).to_f32(), half::f16::from_bits(rd16(y1)).to_f32());
            let dy = _mm512_setr_ps(d0, d0, d1, d1, d0, d0, d1, d1, d0, d0, d1, d1, d0, d0, d1, d1);
            prod[j] = _mm512_mul_ps(xs, dy);
        }
        for r in 0..R {
            let x = w.at(r, b);
            w.prefetch(x);
            let v = _mm256_loadu_si256(x.add(4) as *const __m256i);
            let nib = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_and_si256(v, low)),
                _mm256_and_si256(_mm256_srli_epi16(v, 4), low),
                1,
            );
            let q = _mm512_shuffle_epi8(t, nib);
            let idx = _mm512_add_epi32(sub, _mm512_set1_epi32(4 * r as i32));
            for j in 0..A {
                let p = _mm512_dpbusd_epi32(seed[j], q, yv[j]);
                acc[j][r] = _mm512_fmadd_ps(_mm512_permutexvar_ps(idx, prod[j]), _mm512_cvtepi32_ps(p), acc[j][r]);
            }
        }
    }
    let mut outs = [[0f32; 4]; A];
    for j in 0..A {
        outs[j] = reduce(acc[j]);
    }
    outs
}

/// Four NVFP4 rows × one Q8_0 row (see [`Dot4Fn`]).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI CPU; pointers as for [`Dot4Fn`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot4_nvfp4(n: usize, w: *const u8, stride: usize, a: *const u8, out: *mut f32) {
    let r = nvfp4_tile::<4, 1>(n, Units::file(w, stride, 36), [a]);
    std::ptr::copy_nonoverlapping(r[0].as_ptr(), out, 4);
}

/// [`dot4_nvfp4`] over a packed group ([`crate::packed`], units of one block).
///
/// # Safety
/// As for [`dot4_nvfp4`], `w` a packed group of `n` columns.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot4_nvfp4_packed(n: usize, w: *const u8, _stride: usize, a: *const u8, out: *mut f32) {
    let r = nvfp4_tile::<4, 1>(n, Units::packed(w, 36), [a]);
    std::ptr::copy_nonoverlapping(r[0].as_ptr(), out, 4);
}

/// Four NVFP4 rows × two Q8_0 rows (see [`TileFn`]).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI CPU; pointers as for [`TileFn`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn tile_nvfp4(n: usize, w: *const u8, stride: usize, a: *const u8, a_stride: usize, y: *mut f32, ys: usize) {
    let r = nvfp4_tile::<4, 2>(n, Units::file(w, stride, 36), [a, a.add(a_stride)]);
    store_tile(r, y, ys);
}

/// [`tile_nvfp4`] over a packed group.
///
/// # Safety
/// As for [`tile_nvfp4`], `w` as for [`dot4_nvfp4_packed`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn tile_nvfp4_packed(
    n: usize,
    w: *const u8,
    _s: usize,
    a: *const u8,
    a_stride: usize,
    y: *mut f32,
    ys: usize,
) {
    let r = nvfp4_tile::<4, 2>(n, Units::packed(w, 36), [a, a.add(a_stride)]);
    store_tile(r, y, ys);
}
