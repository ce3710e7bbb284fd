//! AVX-512 VBMI variants of the MXFP4 four-row decode kernel and 4 × 2 prefill
//! tile of [`super::avx512_fp4`]: same numerics (doubled E2M1 codes looked up as
//! `2·E2M1 + 12`, `−12·Σy` seeds, integer sums per block, one f32 FMA per block
//! and row), fewer instructions per weight row.
//!
//! Why it is faster: per block pair and row the file-layout kernel loads two
//! 16-byte quant runs and joins them, splits nibbles with two `and`s, a shift and
//! a 256-bit insert, looks the codes up with `vpshufb`, and gathers the eight
//! E8M0 scales of the four rows with scalar loads and inserts (about 15 port-5
//! uops per pair of blocks). Here one masked 34-byte load takes a row's block
//! pair (`[e₀, q₀[16], e₁, q₁[16]]`), a `vpermb` lays it out as
//! `[q₀ | q₀ | q₁ | q₁]`, a masked shift moves the high nibbles down in lanes 1
//! and 3, and a second `vpermb` looks up the codes (it reads only the low six
//! index bits, so the nibble above needs no mask). The scales come out of the
//! same four registers with two byte permutes. The result is in element order
//! (`[lo₀ hi₀ | lo₁ hi₁]` = elements 0..32 of each block), so the Q8_0
//! activations need no reordering either.
//!
//! The tile gives each activation row exactly the four-row kernel's
//! instructions, so rows stay batch invariant.

use super::avx2::rd16;
use super::avx2_rows::{prefetch, PREFETCH_ROWS};
use super::avx512::{reduce, store_tile, ZERO_BLOCK};
use super::avx512_packed::Units;
use std::arch::x86_64::*;

/// `2·E2M1(code) + 12` by code, repeated over 64 bytes: `vpermb` indexes with
/// the low six bits, so bits 4 and 5 of a byte (the other nibble) are ignored.
static E2M1_X2_PLUS12_X4: [u8; 64] = {
    const T: [u8; 16] = [12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0];
    let mut t = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        t[i] = T[i % 16];
        i += 1;
    }
    t
};

/// `vpermb` indices from a block pair `[e₀, q₀[16], e₁, q₁[16]]` to
/// `[q₀ | q₀ | q₁ | q₁]` (one 16-byte run per 128-bit lane).
static PAIR_TO_LANES: [u8; 64] = {
    let mut t = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        let lane = i / 16;
        t[i] = if lane < 2 { 1 + (i % 16) } else { 18 + (i % 16) } as u8;
        i += 1;
    }
    t
};

/// `vpermt2b` indices that collect the E8M0 bytes of two rows' block pairs
/// (`z_a` = table 1, `z_b` = table 2) into dwords `[a e₀, a e₁, b e₀, b e₁]`,
/// for dwords 0..4 (`[0]`) or 4..8 (`[1]`); the other bytes are masked off.
static SCALES_TO_DWORDS: [[u8; 64]; 2] = {
    let mut t = [[0u8; 64]; 2];
    let src = [0u8, 17, 64, 64 + 17];
    let mut k = 0;
    while k < 4 {
        t[0][4 * k] = src[k];
        t[1][16 + 4 * k] = src[k];
        k += 1;
    }
    t
};

/// The bytes of dwords 0..4 (`[0]`) and 4..8 (`[1]`) that [`SCALES_TO_DWORDS`] fills.
const SCALE_BYTES: [u64; 2] = [0x1111, 0x1111 << 16];

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
#[inline]
unsafe fn ld512(p: *const u8) -> __m512i {
    _mm512_loadu_si512(p as *const _)
}

/// Four MXFP4 rows (at `w + r·stride`) × `A` Q8_0 rows, two 32-value blocks per
/// step (see the module docs). Odd tails load one block and pair it with
/// [`ZERO_BLOCK`] activations.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
#[inline]
unsafe fn mxfp4_tile<const A: usize>(n: usize, w: Units, a: [*const u8; A]) -> [[f32; 4]; A] {
    const R: usize = 4;
    let nb = n / 32;
    let lut = ld512(E2M1_X2_PLUS12_X4.as_ptr());
    let lanes = ld512(PAIR_TO_LANES.as_ptr());
    let scale_idx = [ld512(SCALES_TO_DWORDS[0].as_ptr()), ld512(SCALES_TO_DWORDS[1].as_ptr())];
    let twelve = _mm512_set1_epi8(12);
    let mut acc = [[_mm512_setzero_ps(); R]; A];
    let mut b = 0;
    while b < nb {
        let pair = b + 1 < nb;
        let bytes: __mmask64 = if pair { (1 << 34) - 1 } else { (1 << 17) - 1 };
        let mut z = [_mm512_setzero_si512(); R];
        for (r, zr) in z.iter_mut().enumerate() {
            let x = w.at(r, b / 2);
            w.prefetch(x);
            *zr = _mm512_maskz_loadu_epi8(bytes, x as *const i8);
        }
        // Dword 2r+k: E8M0 of row r, block b+k (a missing second block reads 0).
        let e = _mm512_or_si512(
            _mm512_maskz_permutex2var_epi8(SCALE_BYTES[0], z[0], scale_idx[0], z[1]),
            _mm512_maskz_permutex2var_epi8(SCALE_BYTES[1], z[2], scale_idx[1], z[3]),
        );
        // e − 128 as f32: `scalef` by it gives d_y·2^(e−128) with one rounding,
        // as the scalar `e8m0_half(e)·d_y` (subnormal scales included).
        let ef = _mm512_sub_ps(_mm512_cvtepi32_ps(e), _mm512_set1_ps(128.0));
        let mut yv = [_mm512_setzero_si512(); A];
        let mut seed = [_mm512_setzero_si512(); A];
        let mut prod = [_mm512_setzero_ps(); A];
        for j in 0..A {
            let y0 = a[j].add(b * 34);
            let y1 = if pair { y0.add(34) } else { ZERO_BLOCK.as_ptr() };
            yv[j] = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256(y0.add(2) as *const __m256i)),
                _mm256_loadu_si256(y1.add(2) as *const __m256i),
                1,
            );
            seed[j] =
                _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), twelve, yv[j]));
            // Lanes 2r+k: d_y of block b+k.
            let ys = _mm256_cvtph_ps(_mm_set1_epi32((rd16(y0) as u32 | (rd16(y1) as u32) << 16) as i32));
            prod[j] = _mm512_scalef_ps(_mm512_castps256_ps512(ys), ef);
        }
        for r in 0..R {
            let g = _mm512_permutexvar_epi8(lanes, z[r]);
            let g = _mm512_mask_srli_epi16(g, 0xFF00_FF00, g, 4);
            let q = _mm512_permutexvar_epi8(g, lut);
            // Lanes 0..8 take block b's scale, 8..16 block b+1's.
            let k = 2 * r as i32;
            let idx = _mm512_setr_epi32(k, k, k, k, k, k, k, k, k + 1, k + 1, k + 1, k + 1, k + 1, k + 1, k + 1, k + 1);
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

/// Four MXFP4 rows × one Q8_0 row (see [`crate::quant::Dot4Fn`]).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI and VBMI CPU; pointers as for [`crate::quant::Dot4Fn`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
pub unsafe fn dot4_mxfp4(n: usize, w: *const u8, stride: usize, a: *const u8, out: *mut f32) {
    let r = mxfp4_tile::<1>(n, Units::file(w, stride, 34), [a]);
    std::ptr::copy_nonoverlapping(r[0].as_ptr(), out, 4);
}

/// [`dot4_mxfp4`] over a packed group ([`crate::packed`], units of a block pair).
///
/// # Safety
/// As for [`dot4_mxfp4`], `w` a packed group of `n` (a multiple of 64) columns.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
pub unsafe fn dot4_mxfp4_packed(n: usize, w: *const u8, _stride: usize, a: *const u8, out: *mut f32) {
    let r = mxfp4_tile::<1>(n, Units::packed(w, 34), [a]);
    std::ptr::copy_nonoverlapping(r[0].as_ptr(), out, 4);
}

/// Four MXFP4 rows × two Q8_0 rows (see [`crate::quant::TileFn`]).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI and VBMI CPU; pointers as for [`crate::quant::TileFn`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
pub unsafe fn tile_mxfp4(n: usize, w: *const u8, stride: usize, a: *const u8, a_stride: usize, y: *mut f32, ys: usize) {
    let r = mxfp4_tile::<2>(n, Units::file(w, stride, 34), [a, a.add(a_stride)]);
    store_tile(r, y, ys);
}

/// [`tile_mxfp4`] over a packed group.
///
/// # Safety
/// As for [`tile_mxfp4`], `w` as for [`dot4_mxfp4_packed`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
pub unsafe fn tile_mxfp4_packed(
    n: usize,
    w: *const u8,
    _s: usize,
    a: *const u8,
    a_stride: usize,
    y: *mut f32,
    ys: usize,
) {
    let r = mxfp4_tile::<2>(n, Units::packed(w, 34), [a, a.add(a_stride)]);
    store_tile(r, y, ys);
}

// ----------------------------------------------------------------- NVFP4

/// `vpermb` indices from an NVFP4 block (`d[4]`, then `qs[32]` with byte
/// `8s+j` = elements `16s+j` (low) and `16s+8+j` (high)) to element order:
/// element `e = 16s + t` reads byte `4 + 8s + t mod 8` (the high nibble for
/// `t ≥ 8`, moved down by the masked shift).
static NVFP4_TO_ELEMENTS: [u8; 64] = {
    let mut t = [0u8; 64];
    let mut e = 0;
    while e < 64 {
        t[e] = (4 + 8 * (e / 16) + e % 8) as u8;
        e += 1;
    }
    t
};

/// `vpermt2b` indices that put the four UE4M3 scale bytes of two rows (`z_a`,
/// `z_b`) in the low byte of 16-bit lanes `4r+s` (`[0]`: rows 0, 1 in lanes
/// 0..8; `[1]`: rows 2, 3 in lanes 8..16).
static NVFP4_SCALES_TO_WORDS: [[u8; 64]; 2] = {
    let mut t = [[0u8; 64]; 2];
    let mut k = 0;
    while k < 8 {
        let src = (64 * (k / 4) + k % 4) as u8;
        t[0][2 * k] = src;
        t[1][16 + 2 * k] = src;
        k += 1;
    }
    t
};

/// The bytes [`NVFP4_SCALES_TO_WORDS`] fills.
const NVFP4_SCALE_BYTES: [u64; 2] = [0x5555, 0x5555 << 16];

/// Four NVFP4 rows × `A` Q8_0 rows, one 64-value block (two Q8_0 blocks) per
/// step, quants in element order (so the activations load as they are) and
/// 128-bit lane `s` of the integer sums = sub-block `s`.
///
/// Not dispatched: tested against scalar, but end-to-end NVFP4 prefill measured
/// no faster (slower in 3 of 4 same-binary A/B runs under load) than
/// [`super::avx512_fp4`]'s kernels, which dispatch still picks (docs/LOWBIT.md).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
#[inline]
unsafe fn nvfp4_tile<const A: usize>(n: usize, w: *const u8, stride: usize, a: [*const u8; A]) -> [[f32; 4]; A] {
    const R: usize = 4;
    let nb = n / 64;
    let lut = ld512(E2M1_X2_PLUS12_X4.as_ptr());
    let order = ld512(NVFP4_TO_ELEMENTS.as_ptr());
    let scale_idx = [ld512(NVFP4_SCALES_TO_WORDS[0].as_ptr()), ld512(NVFP4_SCALES_TO_WORDS[1].as_ptr())];
    let twelve = _mm512_set1_epi8(12);
    let mut acc = [[_mm512_setzero_ps(); R]; A];
    for b in 0..nb {
        let mut z = [_mm512_setzero_si512(); R];
        for (r, zr) in z.iter_mut().enumerate() {
            let x = w.add(r * stride + b * 36);
            prefetch(x.wrapping_add(PREFETCH_ROWS * stride));
            *zr = _mm512_maskz_loadu_epi8((1 << 36) - 1, x as *const i8);
        }
        // The 16 scales (lane 4r+s) as ggml's halved value: (c & 0x7F) << 7
        // reads as f16 E4M3(c)·2⁻⁸, times 2⁷; 0x7F (NaN, refused at load) reads
        // as 0 like the scalar reference.
        let c = _mm512_or_si512(
            _mm512_maskz_permutex2var_epi8(NVFP4_SCALE_BYTES[0], z[0], scale_idx[0], z[1]),
            _mm512_maskz_permutex2var_epi8(NVFP4_SCALE_BYTES[1], z[2], scale_idx[1], z[3]),
        );
        let c = _mm256_and_si256(_mm512_castsi512_si256(c), _mm256_set1_epi16(0x7F));
        let nan = _mm256_cmpeq_epi16_mask(c, _mm256_set1_epi16(0x7F));
        let h = _mm256_maskz_mov_epi16(!nan, _mm256_slli_epi16(c, 7));
        let xs = _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(128.0));
        let mut yv = [_mm512_setzero_si512(); A];
        let mut seed = [_mm512_setzero_si512(); A];
        let mut prod = [_mm512_setzero_ps(); A];
        for j in 0..A {
            let (y0, y1) = (a[j].add(2 * b * 34), a[j].add((2 * b + 1) * 34));
            yv[j] = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256(y0.add(2) as *const __m256i)),
                _mm256_loadu_si256(y1.add(2) as *const __m256i),
                1,
            );
            seed[j] =
                _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), twelve, yv[j]));
            // Sub-blocks 0, 1 take d_y of the first Q8_0 block, 2, 3 the second.
            let (d0, d1) = (half::f16::from_bits(rd16(y0)).to_f32(), half::f16::from_bits(rd16(y1)).to_f32());
            let dy = _mm512_setr_ps(d0, d0, d1, d1, d0, d0, d1, d1, d0, d0, d1, d1, d0, d0, d1, d1);
            prod[j] = _mm512_mul_ps(xs, dy);
        }
        for r in 0..R {
            let g = _mm512_permutexvar_epi8(order, z[r]);
            let g = _mm512_mask_srli_epi16(g, 0xF0F0_F0F0, g, 4);
            let q = _mm512_permutexvar_epi8(g, lut);
            // 128-bit lane s takes scale 4r+s.
            let k = 4 * r as i32;
            let idx = _mm512_setr_epi32(
                k,
                k,
                k,
                k,
                k + 1,
                k + 1,
                k + 1,
                k + 1,
                k + 2,
                k + 2,
                k + 2,
                k + 2,
                k + 3,
                k + 3,
                k + 3,
                k + 3,
            );
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

/// Four NVFP4 rows × one Q8_0 row (see [`crate::quant::Dot4Fn`]).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI and VBMI CPU; pointers as for [`crate::quant::Dot4Fn`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
pub unsafe fn dot4_nvfp4(n: usize, w: *const u8, stride: usize, a: *const u8, out: *mut f32) {
    let r = nvfp4_tile::<1>(n, w, stride, [a]);
    std::ptr::copy_nonoverlapping(r[0].as_ptr(), out, 4);
}

/// Four NVFP4 rows × two Q8_0 rows (see [`crate::quant::TileFn`]).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI and VBMI CPU; pointers as for [`crate::quant::TileFn`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
pub unsafe fn tile_nvfp4(n: usize, w: *const u8, stride: usize, a: *const u8, a_stride: usize, y: *mut f32, ys: usize) {
    let r = nvfp4_tile::<2>(n, w, stride, [a, a.add(a_stride)]);
    store_tile(r, y, ys);
}

/// Whether the CPU has AVX-512 VBMI (`vpermb`, `vpermt2b`). The AVX-512 level
/// does not require it (Cascade Lake has VNNI without it), so the kernels here
/// are picked at dispatch, with [`super::avx512_fp4`]'s as the fallback.
/// `SHARDLM_VBMI=0` turns them off (to test and time the fallback). Cached.
pub fn has_vbmi() -> bool {
    static VBMI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *VBMI.get_or_init(|| {
        is_x86_feature_detected!("avx512vbmi") && std::env::var("SHARDLM_VBMI").map_or(true, |v| v.trim() != "0")
    })
}
