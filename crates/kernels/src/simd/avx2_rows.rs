//! AVX2 four-row kernels: one activation row against four consecutive weight
//! rows. The activation block is loaded (and its scale converted) once for all
//! four rows, the four row sums are reduced together, and the caller pays one
//! indirect call per four outputs. This is the batch-1 decode path.

use super::avx2::{dot_u8i8, nibbles, rd16};
use std::arch::x86_64::*;

#[inline(always)]
unsafe fn ld(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

#[inline(always)]
unsafe fn rd32(p: *const u8) -> i32 {
    (p as *const i32).read_unaligned()
}

/// Horizontal sums of four vectors → `[Σa, Σb, Σc, Σd]`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn hsum4(acc: [__m256; 4]) -> __m128 {
    let t = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
    _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1))
}

/// Lane `r` of `v` broadcast to 8 lanes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn lane(v: __m256, r: i32) -> __m256 {
    _mm256_permutevar8x32_ps(v, _mm256_set1_epi32(r))
}

/// Software prefetch distance, in rows: the same position two row groups ahead.
/// (Single-thread decode is bound by DRAM latency; the hardware prefetcher alone
/// leaves the four interleaved row streams short of bandwidth.)
pub(crate) const PREFETCH_ROWS: usize = 8;

/// Prefetches the cache line at `p` (any address; prefetches never fault).
#[inline(always)]
pub(crate) fn prefetch(p: *const u8) {
    // SAFETY: a prefetch is only a hint and never faults; SSE is baseline on x86-64.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p as *const i8) }
}

/// Prefetches the two cache lines `ahead` bytes past a block at `x` (every
/// super-block of the one-row low-bit kernels is under 128 bytes, and the
/// next block's call covers any third line). Without it the one-row I-quant
/// kernels waited on memory: IQ3_S decoded a 1.1B file 1.2x slower.
#[inline(always)]
pub(crate) fn prefetch_block(x: *const u8, ahead: usize) {
    prefetch(x.wrapping_add(ahead));
    prefetch(x.wrapping_add(ahead + 64));
}

#[inline(always)]
unsafe fn ld128(p: *const u8) -> __m128i {
    _mm_loadu_si128(p as *const __m128i)
}

/// Two 16-byte runs as `[a | b]`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn join(a: *const u8, b: *const u8) -> __m256i {
    _mm256_inserti128_si256(_mm256_castsi128_si256(ld128(a)), ld128(b), 1)
}

/// Σ over 4-byte groups of `q·y` for two 4-bit blocks side by side: `q` holds the
/// packed nibbles of block b (low lane) and b+1 (high lane); `ylo`/`yhi` the
/// matching activation halves (elements 0..16 / 16..32 of each block).
/// Lanes 0..4 belong to block b, 4..8 to block b+1.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn pair_dot(q: __m256i, ylo: __m256i, yhi: __m256i) -> __m256i {
    let low = _mm256_set1_epi8(0x0F);
    let lo = _mm256_and_si256(q, low);
    let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
    // Each i16 sums 4 products of ≤ 15·127: no overflow.
    let p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, ylo), _mm256_maddubs_epi16(hi, yhi));
    _mm256_madd_epi16(p, _mm256_set1_epi16(1))
}

/// Scale index for row `r` of a pair: lanes 0..4 ← `k`, lanes 4..8 ← `k + step`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn pair_lanes(v: __m256, k: i32, step: i32) -> __m256 {
    let j = k + step;
    _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(k, k, k, k, j, j, j, j))
}

/// Four Q4_1 rows × one Q8_1 row (see [`Dot4Fn`]).
///
/// Blocks go two at a time: the nibbles of blocks b and b+1 of a row load into
/// one vector, so the unpacking runs once per 64 weights, and the activations
/// are regrouped (low halves / high halves) once for all four rows.
///
/// # Safety
/// AVX2+FMA+F16C CPU; pointers as for [`Dot4Fn`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot4_q4_1(n: usize, w: *const u8, stride: usize, a: *const u8, out: *mut f32) {
    let nb = n / 32;
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut accm = [_mm256_setzero_ps(); 2];
    let x = [w, w.add(stride), w.add(2 * stride), w.add(3 * stride)];
    let mut b = 0;
    while b + 2 <= nb {
        let (y0, y1) = (a.add(b * 36), a.add(b * 36 + 36));
        let ylo = join(y0.add(4), y1.add(4));
        let yhi = join(y0.add(20), y1.add(20));
        let (o0, o1) = (b * 20, b * 20 + 20);
        // [d_y, s_y] of both blocks, twice.
        let ys = _mm256_cvtph_ps(_mm_set1_epi64x((rd32(y0) as u32 as i64) | ((rd32(y1) as i64) << 32)));
        // Rows (0,1) and (2,3): [d, m] of block b then b+1, per row.
        let pa = _mm256_mul_ps(
            _mm256_cvtph_ps(_mm_setr_epi32(
                rd32(x[0].add(o0)),
                rd32(x[0].add(o1)),
                rd32(x[1].add(o0)),
                rd32(x[1].add(o1)),
            )),
            ys,
        );
        let pb = _mm256_mul_ps(
            _mm256_cvtph_ps(_mm_setr_epi32(
                rd32(x[2].add(o0)),
                rd32(x[2].add(o1)),
                rd32(x[3].add(o0)),
                rd32(x[3].add(o1)),
            )),
            ys,
        );
        accm[0] = _mm256_add_ps(accm[0], pa);
        accm[1] = _mm256_add_ps(accm[1], pb);
        for r in 0..4 {
            prefetch(x[r].wrapping_add(o0 + PREFETCH_ROWS * stride));
            let p = pair_dot(join(x[r].add(o0 + 4), x[r].add(o1 + 4)), ylo, yhi);
            let d = pair_lanes(if r < 2 { pa } else { pb }, 4 * (r as i32 & 1), 2);
            acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[r]);
        }
        b += 2;
    }
    // m·s terms: lanes 1, 3 (first row of each pair) and 5, 7 (second row).
    let sel = _mm256_setr_epi32(1, 5, 3, 7, 0, 0, 0, 0);
    let ma = _mm256_permutevar8x32_ps(accm[0], sel);
    let mb = _mm256_permutevar8x32_ps(accm[1], sel);
    // [m0, m1, m0', m1'] + [..] → rows 0, 1 then 2, 3.
    let m01 =
        _mm_add_ps(_mm256_castps256_ps128(ma), _mm_movehl_ps(_mm256_castps256_ps128(ma), _mm256_castps256_ps128(ma)));
    let m23 =
        _mm_add_ps(_mm256_castps256_ps128(mb), _mm_movehl_ps(_mm256_castps256_ps128(mb), _mm256_castps256_ps128(mb)));
    let mut m = _mm_movelh_ps(m01, m23);
    if b < nb {
        // Odd tail: one block, as in the one-row kernel.
        let y = a.add(b * 36);
        let yv = ld(y.add(4));
        let xo = b * 20;
        let xs = _mm256_cvtph_ps(_mm_setr_epi32(
            rd32(x[0].add(xo)),
            rd32(x[1].add(xo)),
            rd32(x[2].add(xo)),
            rd32(x[3].add(xo)),
        ));
        let prod = _mm256_mul_ps(xs, _mm256_cvtph_ps(_mm_set1_epi32(rd32(y))));
        for r in 0..4 {
            let p = dot_u8i8(nibbles(x[r].add(xo + 4)), yv);
            acc[r] = _mm256_fmadd_ps(lane(prod, 2 * r as i32), _mm256_cvtepi32_ps(p), acc[r]);
        }
        let ms = _mm256_permutevar8x32_ps(prod, _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7));
        m = _mm_add_ps(m, _mm256_castps256_ps128(ms));
    }
    _mm_storeu_ps(out, _mm_add_ps(hsum4(acc), m));
}

/// Four Q4_0 rows × one Q8_0 row, two blocks at a time as in [`dot4_q4_1`];
/// the −8 offset is applied as `−8·Σy`, computed once per block pair.
///
/// # Safety
/// AVX2+FMA+F16C CPU; pointers as for [`Dot4Fn`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot4_q4_0(n: usize, w: *const u8, stride: usize, a: *const u8, out: *mut f32) {
    let nb = n / 32;
    let mut acc = [_mm256_setzero_ps(); 4];
    let x = [w, w.add(stride), w.add(2 * stride), w.add(3 * stride)];
    let eight = _mm256_set1_epi8(8);
    let ones = _mm256_set1_epi16(1);
    let mut b = 0;
    while b + 2 <= nb {
        let (y0, y1) = (a.add(b * 34), a.add(b * 34 + 34));
        let ylo = join(y0.add(2), y1.add(2));
        let yhi = join(y0.add(18), y1.add(18));
        let s8 = _mm256_madd_epi16(
            _mm256_add_epi16(_mm256_maddubs_epi16(eight, ylo), _mm256_maddubs_epi16(eight, yhi)),
            ones,
        );
        let (o0, o1) = (b * 18, b * 18 + 18);
        let xs = _mm256_cvtph_ps(_mm_setr_epi16(
            rd16(x[0].add(o0)) as i16,
            rd16(x[0].add(o1)) as i16,
            rd16(x[1].add(o0)) as i16,
            rd16(x[1].add(o1)) as i16,
            rd16(x[2].add(o0)) as i16,
            rd16(x[2].add(o1)) as i16,
            rd16(x[3].add(o0)) as i16,
            rd16(x[3].add(o1)) as i16,
        ));
        let ys = _mm256_cvtph_ps(_mm_set1_epi32((rd16(y0) as u32 | (rd16(y1) as u32) << 16) as i32));
        let ds = _mm256_mul_ps(xs, ys);
        for r in 0..4 {
            prefetch(x[r].wrapping_add(o0 + PREFETCH_ROWS * stride));
            let p = _mm256_sub_epi32(pair_dot(join(x[r].add(o0 + 2), x[r].add(o1 + 2)), ylo, yhi), s8);
            acc[r] = _mm256_fmadd_ps(pair_lanes(ds, 2 * r as i32, 1), _mm256_cvtepi32_ps(p), acc[r]);
        }
        b += 2;
    }
    if b < nb {
        let y = a.add(b * 34);
        let yv = ld(y.add(2));
        let ya = _mm256_sign_epi8(yv, yv);
        let xo = b * 18;
        let xs = _mm_cvtph_ps(_mm_setr_epi16(
            rd16(x[0].add(xo)) as i16,
            rd16(x[1].add(xo)) as i16,
            rd16(x[2].add(xo)) as i16,
            rd16(x[3].add(xo)) as i16,
            0,
            0,
            0,
            0,
        ));
        let ds = _mm256_castps128_ps256(_mm_mul_ps(xs, _mm_cvtph_ps(_mm_set1_epi16(rd16(y) as i16))));
        for r in 0..4 {
            let q = _mm256_sub_epi8(nibbles(x[r].add(xo + 2)), eight);
            let p = dot_u8i8(ya, _mm256_sign_epi8(q, yv));
            acc[r] = _mm256_fmadd_ps(lane(ds, r as i32), _mm256_cvtepi32_ps(p), acc[r]);
        }
    }
    _mm_storeu_ps(out, hsum4(acc));
}

/// Four Q8_0 rows × one Q8_0 row.
///
/// # Safety
/// AVX2+FMA+F16C CPU; pointers as for [`Dot4Fn`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot4_q8_0(n: usize, w: *const u8, stride: usize, a: *const u8, out: *mut f32) {
    let nb = n / 32;
    let mut acc = [_mm256_setzero_ps(); 4];
    let x = [w, w.add(stride), w.add(2 * stride), w.add(3 * stride)];
    for b in 0..nb {
        let y = a.add(b * 34);
        let yv = ld(y.add(2));
        let xo = b * 34;
        let xs = _mm_cvtph_ps(_mm_setr_epi16(
            rd16(x[0].add(xo)) as i16,
            rd16(x[1].add(xo)) as i16,
            rd16(x[2].add(xo)) as i16,
            rd16(x[3].add(xo)) as i16,
            0,
            0,
            0,
            0,
        ));
        let ds = _mm256_castps128_ps256(_mm_mul_ps(xs, _mm_cvtph_ps(_mm_set1_epi16(rd16(y) as i16))));
        for r in 0..4 {
            prefetch(x[r].wrapping_add(xo + PREFETCH_ROWS * stride));
            // Weights may hold −128, so the sign trick keys on the weight side.
            let q = ld(x[r].add(xo + 2));
            let p = dot_u8i8(_mm256_sign_epi8(q, q), _mm256_sign_epi8(yv, q));
            acc[r] = _mm256_fmadd_ps(lane(ds, r as i32), _mm256_cvtepi32_ps(p), acc[r]);
        }
    }
    _mm_storeu_ps(out, hsum4(acc));
}
