//! AVX-512 (F/BW/VL + VNNI) kernels for the formats that matter most at decode:
//! Q4_0, Q4_1, Q8_0 (one- and four-row), the float formats, and Q4_K/Q5_K/Q6_K
//! (in [`super::avx512_k`]). Other types fall back to the AVX2 kernels.
//!
//! The 32-element formats run two blocks per 512-bit vector and use VNNI
//! `vpdpbusd` (u8 × i8 → i32, four products per lane). Signed weights become
//! unsigned by an offset whose cost is paid once per activation block, shared by
//! all rows: `Σ (q + c)·y = Σ q·y + c·Σ y`, so we seed the accumulator with
//! `−c·Σy` (itself one `vpdpbusd` against the constant `c`).
//!
//! Nibble layout: a 4-bit block loads as `[lo₀, lo₁ | hi₀, hi₁]` (16 bytes each,
//! block 0 and 1), so the activations are permuted once per block pair to
//! `[y₀[0..16], y₁[0..16] | y₀[16..32], y₁[16..32]]` instead of shuffling every
//! weight row.

use super::avx2::rd16;
use super::avx2_rows::{hsum4, prefetch, PREFETCH_ROWS};
use crate::quant::{Dot4Fn, DotFn};
use crate::DType;
use std::arch::x86_64::*;

/// The AVX-512 dot for `dtype`, if there is one.
pub fn dot_fn(dtype: DType) -> Option<DotFn> {
    Some(match dtype {
        DType::F32 => dot_f32,
        DType::F16 => dot_f16,
        DType::BF16 => dot_bf16,
        DType::Q4_0 => dot_q4_0,
        DType::Q4_1 => dot_q4_1,
        DType::Q8_0 => dot_q8_0,
        DType::Q4_K => super::avx512_k::dot_q4_k,
        DType::Q5_K => super::avx512_k::dot_q5_k,
        DType::Q6_K => super::avx512_k::dot_q6_k,
        other => return super::avx512_lowk::dot_fn(other),
    })
}

/// The AVX-512 four-row dot for `dtype`, if there is one.
pub fn dot4_fn(dtype: DType) -> Option<Dot4Fn> {
    Some(match dtype {
        DType::Q4_0 => dot4_q4_0,
        DType::Q4_1 => dot4_q4_1,
        DType::Q8_0 => dot4_q8_0,
        _ => return None,
    })
}

/// Stand-in for the missing second activation block of an odd tail: all-zero
/// scales and values, so it contributes nothing.
pub(super) static ZERO_BLOCK: [u8; 64] = [0; 64];

#[inline(always)]
unsafe fn rd32(p: *const u8) -> i32 {
    (p as *const i32).read_unaligned()
}

#[inline(always)]
unsafe fn ld256(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

/// Two 32-byte runs as one vector `[a | b]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn ld2(a: *const u8, b: *const u8) -> __m512i {
    _mm512_inserti64x4(_mm512_castsi256_si512(ld256(a)), ld256(b), 1)
}

/// Two blocks of 16 nibble bytes → `[lo_a, lo_b | hi_a, hi_b]`, each nibble a byte.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn nib2(a: *const u8, b: *const u8) -> __m512i {
    let t = _mm256_set_m128i(_mm_loadu_si128(b as *const __m128i), _mm_loadu_si128(a as *const __m128i));
    let z = _mm512_inserti64x4(_mm512_castsi256_si512(t), _mm256_srli_epi16(t, 4), 1);
    _mm512_and_si512(z, _mm512_set1_epi8(0x0F))
}

/// Activations of two blocks in nibble order (see module docs).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn y2_nibble_order(a: *const u8, b: *const u8) -> __m512i {
    let y = ld2(a, b);
    _mm512_shuffle_i64x2(y, y, 0b11_01_10_00)
}

/// Horizontal sums of `R` (1 or 4) 512-bit accumulators.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn reduce<const R: usize>(acc: [__m512; R]) -> [f32; 4] {
    let half = |v: __m512| {
        _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)))
    };
    let mut out = [0f32; 4];
    if R == 4 {
        _mm_storeu_ps(out.as_mut_ptr(), hsum4([half(acc[0]), half(acc[1]), half(acc[2]), half(acc[3])]));
    } else {
        out[0] = _mm512_reduce_add_ps(acc[0]);
    }
    out
}

// ------------------------------------------------------- weight layouts

/// Where the kernels below find the weight bytes of block pair `(b, b + 1)`.
///
/// The row kernels are written once over this trait so that the file layout
/// and the packed four-row layout ([`crate::packed`]) run the very same
/// arithmetic on the very same values, and give bit-identical results: only
/// the addressing differs (scattered scalar reads against one vector load).
/// `pair` is false at an odd tail, where block `b + 1` does not exist (its
/// scales read as 0 and its quants alias block `b`'s).
pub(super) trait BlockPairs: Copy {
    /// Q4_0/Q8_0: the f16 scales `d` of rows `0..R`, as eight u16 lanes
    /// `[r0b0, r0b1, r1b0, r1b1, r2b0, r2b1, r3b0, r3b1]`, zero past `R`.
    unsafe fn heads16<const R: usize>(self, b: usize, pair: bool) -> __m128i;
    /// Q4_1: the `[d, m]` f16 pairs of rows `0..R`, as eight u32 lanes in the
    /// same order as [`BlockPairs::heads16`].
    unsafe fn heads32<const R: usize>(self, b: usize, pair: bool) -> __m256i;
    /// The quants of row `r` for blocks `b` and `b + 1`.
    unsafe fn quants(self, r: usize, b: usize, pair: bool) -> (*const u8, *const u8);
    /// Prefetches ahead of block pair `b` for `R` rows.
    unsafe fn prefetch<const R: usize>(self, b: usize);
}

/// Row-major blocks as the file stores them: row `r` at `w + r·stride`, block
/// `b` at `b·bb` in it, its quants after a `head`-byte header.
#[derive(Clone, Copy)]
pub(super) struct FileRows {
    pub w: *const u8,
    pub stride: usize,
    pub bb: usize,
    pub head: usize,
    /// Prefetch distance in bytes.
    pub ahead: usize,
}

impl FileRows {
    /// `R` (1 or 4) rows of `n` elements in blocks of `bb` bytes with a
    /// `head`-byte header. Four rows prefetch [`PREFETCH_ROWS`] rows ahead in the
    /// same column; one row prefetches two rows' worth ahead along itself.
    #[inline(always)]
    pub fn new<const R: usize>(w: *const u8, stride: usize, n: usize, bb: usize, head: usize) -> FileRows {
        let ahead = if R == 4 { PREFETCH_ROWS * stride } else { 2 * (n / 32) * bb };
        FileRows { w, stride, bb, head, ahead }
    }

    #[inline(always)]
    fn offsets(self, b: usize, pair: bool) -> (usize, usize) {
        (b * self.bb, if pair { (b + 1) * self.bb } else { b * self.bb })
    }
}

impl BlockPairs for FileRows {
    #[inline(always)]
    unsafe fn heads16<const R: usize>(self, b: usize, pair: bool) -> __m128i {
        let (o0, o1) = self.offsets(b, pair);
        let xr = |r: usize, o: usize| if r < R { rd16(self.w.add(r * self.stride + o)) as i16 } else { 0 };
        _mm_setr_epi16(xr(0, o0), xr(0, o1), xr(1, o0), xr(1, o1), xr(2, o0), xr(2, o1), xr(3, o0), xr(3, o1))
    }

    #[inline(always)]
    unsafe fn heads32<const R: usize>(self, b: usize, pair: bool) -> __m256i {
        let (o0, o1) = self.offsets(b, pair);
        let xr = |r: usize, o: usize| if r < R { rd32(self.w.add(r * self.stride + o)) } else { 0 };
        _mm256_setr_epi32(xr(0, o0), xr(0, o1), xr(1, o0), xr(1, o1), xr(2, o0), xr(2, o1), xr(3, o0), xr(3, o1))
    }

    #[inline(always)]
    unsafe fn quants(self, r: usize, b: usize, pair: bool) -> (*const u8, *const u8) {
        let (o0, o1) = self.offsets(b, pair);
        let x = self.w.add(r * self.stride + self.head);
        (x.add(o0), x.add(o1))
    }

    #[inline(always)]
    unsafe fn prefetch<const R: usize>(self, b: usize) {
        for r in 0..R {
            prefetch(self.w.wrapping_add(r * self.stride + b * self.bb + self.ahead));
        }
    }
}

// ----------------------------------------------------------------- Q4_1

/// `R` rows of Q4_1 × one Q8_1 row, with the weight bytes found through `L`
/// (the file layout, or a packed group: same loads, same arithmetic).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn q4_1_rows<const R: usize, L: BlockPairs>(n: usize, l: L, a: *const u8) -> [f32; 4] {
    q4_1_tile::<R, 1, L>(n, l, [a])[0]
}

/// `R` rows of Q4_1 × `A` Q8_1 rows. Each activation row goes through exactly
/// the instructions of the one-row case (the weight nibbles are only unpacked
/// once for all of them), so a row's result does not depend on how many rows
/// share its call: a batched decode step computes what a lone one does.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn q4_1_tile<const R: usize, const A: usize, L: BlockPairs>(
    n: usize,
    l: L,
    a: [*const u8; A],
) -> [[f32; 4]; A] {
    let nb = n / 32;
    let mut acc = [[_mm512_setzero_ps(); R]; A];
    let mut accm = [_mm512_setzero_ps(); A];
    let mut b = 0;
    while b < nb {
        let pair = b + 1 < nb;
        // Lanes 4r+2k / 4r+2k+1: d_x·d_y and m_x·s_y of row r, block k.
        let xs = _mm512_cvtph_ps(l.heads32::<R>(b, pair));
        let mut yv = [_mm512_setzero_si512(); A];
        let mut prod = [_mm512_setzero_ps(); A];
        for j in 0..A {
            let y0 = a[j].add(b * 36);
            let y1 = if pair { y0.add(36) } else { ZERO_BLOCK.as_ptr() };
            yv[j] = y2_nibble_order(y0.add(4), y1.add(4));
            let ys = _mm512_cvtph_ps(_mm256_set1_epi64x((rd32(y0) as u32 as i64) | ((rd32(y1) as i64) << 32)));
            prod[j] = _mm512_mul_ps(xs, ys);
            accm[j] = _mm512_add_ps(accm[j], prod[j]);
        }
        l.prefetch::<R>(b);
        for r in 0..R {
            let (q0, q1) = l.quants(r, b, pair);
            let q = nib2(q0, q1);
            let k = 4 * r as i32;
            let idx = _mm512_setr_epi32(k, k, k, k, k + 2, k + 2, k + 2, k + 2, k, k, k, k, k + 2, k + 2, k + 2, k + 2);
            for j in 0..A {
                let p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, yv[j]);
                acc[j][r] = _mm512_fmadd_ps(_mm512_permutexvar_ps(idx, prod[j]), _mm512_cvtepi32_ps(p), acc[j][r]);
            }
        }
        b += 2;
    }
    let mut outs = [[0f32; 4]; A];
    for j in 0..A {
        let mut out = reduce(acc[j]);
        let mut m = [0f32; 16];
        _mm512_storeu_ps(m.as_mut_ptr(), accm[j]);
        for r in 0..R {
            out[r] += m[4 * r + 1] + m[4 * r + 3];
        }
        outs[j] = out;
    }
    outs
}

/// Q4_1 × Q8_1 (see [`DotFn`]).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI CPU; pointers as for [`DotFn`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_q4_1(n: usize, w: *const u8, a: *const u8) -> f32 {
    q4_1_rows::<1, _>(n, FileRows::new::<1>(w, 0, n, 20, 4), a)[0]
}

/// Four Q4_1 rows × one Q8_1 row (see [`Dot4Fn`]).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI CPU; pointers as for [`Dot4Fn`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot4_q4_1(n: usize, w: *const u8, stride: usize, a: *const u8, out: *mut f32) {
    let r = q4_1_rows::<4, _>(n, FileRows::new::<4>(w, stride, n, 20, 4), a);
    std::ptr::copy_nonoverlapping(r.as_ptr(), out, 4);
}

// ------------------------------------------------------- Q4_0 and Q8_0

/// `R` rows of Q4_0 (`Q8 = false`) or Q8_0 (`Q8 = true`) × one Q8_0 row, with
/// the weight bytes found through `L` (file layout or packed group).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn q8act_rows<const R: usize, const Q8: bool, L: BlockPairs>(
    n: usize,
    l: L,
    a: *const u8,
) -> [f32; 4] {
    q8act_tile::<R, 1, Q8, L>(n, l, [a])[0]
}

/// `R` rows of Q4_0/Q8_0 × `A` Q8_0 rows, each activation row through exactly
/// the one-row instructions (see [`q4_1_tile`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn q8act_tile<const R: usize, const A: usize, const Q8: bool, L: BlockPairs>(
    n: usize,
    l: L,
    a: [*const u8; A],
) -> [[f32; 4]; A] {
    let nb = n / 32;
    let mut acc = [[_mm512_setzero_ps(); R]; A];
    // Q4_0: q − 8 = nibble − 8; Q8_0: q = (q ^ 0x80) − 128.
    let c = _mm512_set1_epi8(if Q8 { -128 } else { 8 });
    let flip = _mm512_set1_epi8(-128);
    let mut b = 0;
    while b < nb {
        let pair = b + 1 < nb;
        // Lanes 2r+k: d_x(r, k)·d_y(k).
        let xs = _mm256_cvtph_ps(l.heads16::<R>(b, pair));
        let mut yv = [_mm512_setzero_si512(); A];
        let mut seed = [_mm512_setzero_si512(); A];
        let mut prod = [_mm512_setzero_ps(); A];
        for j in 0..A {
            let y0 = a[j].add(b * 34);
            let y1 = if pair { y0.add(34) } else { ZERO_BLOCK.as_ptr() };
            yv[j] = if Q8 { ld2(y0.add(2), y1.add(2)) } else { y2_nibble_order(y0.add(2), y1.add(2)) };
            // −c·Σy per 4-byte group; c·y as u8·i8 (c = 128 reads as unsigned 0x80).
            seed[j] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), c, yv[j]));
            let ys = _mm256_cvtph_ps(_mm_set1_epi32((rd16(y0) as u32 | (rd16(y1) as u32) << 16) as i32));
            prod[j] = _mm512_castps256_ps512(_mm256_mul_ps(xs, ys));
        }
        l.prefetch::<R>(b);
        for r in 0..R {
            let (q0, q1) = l.quants(r, b, pair);
            let q = if Q8 { _mm512_xor_si512(ld2(q0, q1), flip) } else { nib2(q0, q1) };
            let k = 2 * r as i32;
            let idx = if Q8 {
                _mm512_setr_epi32(k, k, k, k, k, k, k, k, k + 1, k + 1, k + 1, k + 1, k + 1, k + 1, k + 1, k + 1)
            } else {
                _mm512_setr_epi32(k, k, k, k, k + 1, k + 1, k + 1, k + 1, k, k, k, k, k + 1, k + 1, k + 1, k + 1)
            };
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

/// Q4_0 × Q8_0 (see [`DotFn`]).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI CPU; pointers as for [`DotFn`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_q4_0(n: usize, w: *const u8, a: *const u8) -> f32 {
    q8act_rows::<1, false, _>(n, FileRows::new::<1>(w, 0, n, 18, 2), a)[0]
}

/// Q8_0 × Q8_0 (see [`DotFn`]).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI CPU; pointers as for [`DotFn`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_q8_0(n: usize, w: *const u8, a: *const u8) -> f32 {
    q8act_rows::<1, true, _>(n, FileRows::new::<1>(w, 0, n, 34, 2), a)[0]
}

/// Four Q4_0 rows × one Q8_0 row (see [`Dot4Fn`]).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI CPU; pointers as for [`Dot4Fn`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot4_q4_0(n: usize, w: *const u8, stride: usize, a: *const u8, out: *mut f32) {
    let r = q8act_rows::<4, false, _>(n, FileRows::new::<4>(w, stride, n, 18, 2), a);
    std::ptr::copy_nonoverlapping(r.as_ptr(), out, 4);
}

/// Four Q8_0 rows × one Q8_0 row (see [`Dot4Fn`]).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI CPU; pointers as for [`Dot4Fn`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot4_q8_0(n: usize, w: *const u8, stride: usize, a: *const u8, out: *mut f32) {
    let r = q8act_rows::<4, true, _>(n, FileRows::new::<4>(w, stride, n, 34, 2), a);
    std::ptr::copy_nonoverlapping(r.as_ptr(), out, 4);
}

// ------------------------------------------------------------ float weights

macro_rules! float_dot512 {
    ($name:ident, $width:expr, $load:ident, $loadm:ident) => {
        /// Float weight × f32 activations (see [`DotFn`]); masked tail, no scalar loop.
        ///
        /// # Safety
        /// AVX-512 F/BW/VL CPU; pointers as for [`DotFn`].
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        pub unsafe fn $name(n: usize, w: *const u8, a: *const u8) -> f32 {
            let a = a as *const f32;
            let mut acc = [_mm512_setzero_ps(); 4];
            let mut i = 0;
            while i + 64 <= n {
                for l in 0..$width {
                    prefetch(w.wrapping_add((2 * n + i) * $width + 64 * l));
                }
                for k in 0..4 {
                    let wv = $load(w.add((i + 16 * k) * $width));
                    acc[k] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(a.add(i + 16 * k)), acc[k]);
                }
                i += 64;
            }
            while i + 16 <= n {
                acc[0] = _mm512_fmadd_ps($load(w.add(i * $width)), _mm512_loadu_ps(a.add(i)), acc[0]);
                i += 16;
            }
            if i < n {
                let m: __mmask16 = ((1u32 << (n - i)) - 1) as u16;
                let wv = $loadm(m, w.add(i * $width));
                acc[1] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, a.add(i)), acc[1]);
            }
            _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])))
        }
    };
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn load_f32(p: *const u8) -> __m512 {
    _mm512_loadu_ps(p as *const f32)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn loadm_f32(m: __mmask16, p: *const u8) -> __m512 {
    _mm512_maskz_loadu_ps(m, p as *const f32)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn load_f16(p: *const u8) -> __m512 {
    _mm512_cvtph_ps(ld256(p))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn loadm_f16(m: __mmask16, p: *const u8) -> __m512 {
    _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p as *const i16))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn load_bf16(p: *const u8) -> __m512 {
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(ld256(p)), 16))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn loadm_bf16(m: __mmask16, p: *const u8) -> __m512 {
    let h = _mm256_maskz_loadu_epi16(m, p as *const i16);
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
}

float_dot512!(dot_f32, 4, load_f32, loadm_f32);
float_dot512!(dot_f16, 2, load_f16, loadm_f16);
float_dot512!(dot_bf16, 2, load_bf16, loadm_bf16);

// ------------------------------------------------------- tiles (file layout)

/// The tile kernel (4 weight rows × 2 activation rows) over the file layout
/// for `dtype`: each activation row gets the four-row kernel's exact
/// arithmetic, like the packed tiles ([`super::avx512_packed::tile_fn`]).
pub fn tile_fn(dtype: DType) -> Option<crate::quant::TileFn> {
    match dtype {
        DType::Q4_0 => Some(tile_q4_0),
        DType::Q4_1 => Some(tile_q4_1),
        DType::Q8_0 => Some(tile_q8_0),
        _ => None,
    }
}

/// Writes a tile's two rows of four outputs (`y`, `y + y_stride`).
#[inline(always)]
pub(super) unsafe fn store_tile(r: [[f32; 4]; 2], y: *mut f32, y_stride: usize) {
    std::ptr::copy_nonoverlapping(r[0].as_ptr(), y, 4);
    std::ptr::copy_nonoverlapping(r[1].as_ptr(), y.add(y_stride), 4);
}

/// Four Q4_0 rows × two Q8_0 rows (see [`crate::quant::TileFn`]).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI CPU; pointers as for [`crate::quant::TileFn`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn tile_q4_0(n: usize, w: *const u8, stride: usize, a: *const u8, a_stride: usize, y: *mut f32, ys: usize) {
    let r = q8act_tile::<4, 2, false, _>(n, FileRows::new::<4>(w, stride, n, 18, 2), [a, a.add(a_stride)]);
    store_tile(r, y, ys);
}

/// Four Q8_0 rows × two Q8_0 rows (see [`crate::quant::TileFn`]).
///
/// # Safety
/// As for [`tile_q4_0`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn tile_q8_0(n: usize, w: *const u8, stride: usize, a: *const u8, a_stride: usize, y: *mut f32, ys: usize) {
    let r = q8act_tile::<4, 2, true, _>(n, FileRows::new::<4>(w, stride, n, 34, 2), [a, a.add(a_stride)]);
    store_tile(r, y, ys);
}

/// Four Q4_1 rows × two Q8_1 rows (see [`crate::quant::TileFn`]).
///
/// # Safety
/// As for [`tile_q4_0`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn tile_q4_1(n: usize, w: *const u8, stride: usize, a: *const u8, a_stride: usize, y: *mut f32, ys: usize) {
    let r = q4_1_tile::<4, 2, _>(n, FileRows::new::<4>(w, stride, n, 20, 4), [a, a.add(a_stride)]);
    store_tile(r, y, ys);
}
