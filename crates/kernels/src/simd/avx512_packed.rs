//! AVX-512 kernels over the packed four-row layout ([`crate::packed`]).
//!
//! They are the row kernels of [`super::avx512`] run through a [`PackedGroup`]
//! instead of the file layout: per block pair, the scales of all four rows come
//! in with one vector load (the packed header run is already in the lane order
//! the row kernels build by hand) and each row's quants for both blocks are
//! adjacent. The arithmetic is the same instruction for instruction, so a
//! packed weight gives bit-identical results to the same weight in the file
//! layout at this ISA level, as the AVX2 packed kernels do at theirs.

use super::avx2_rows::{prefetch, PREFETCH_ROWS};
use super::avx512::{q8act_rows, q8act_tile, store_tile, BlockPairs};
use crate::packed::PACK_ROWS;
use std::arch::x86_64::*;

/// Packed Q4_0 group × two Q8_0 activation rows (see [`TileFn`]).
///
/// # Safety
/// As for [`dot4_q4_0`], for both activation rows; `y` valid for the writes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn tile_q4_0(n: usize, w: *const u8, _s: usize, a: *const u8, a_stride: usize, y: *mut f32, ys: usize) {
    let r = q8act_tile::<4, 2, false, _>(n, PackedGroup { w, bb: 18, head: 2 }, [a, a.add(a_stride)]);
    store_tile(r, y, ys);
}

/// Packed Q8_0 group × two Q8_0 activation rows (see [`TileFn`]).
///
/// # Safety
/// As for [`tile_q4_0`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn tile_q8_0(n: usize, w: *const u8, _s: usize, a: *const u8, a_stride: usize, y: *mut f32, ys: usize) {
    let r = q8act_tile::<4, 2, true, _>(n, PackedGroup { w, bb: 34, head: 2 }, [a, a.add(a_stride)]);
    store_tile(r, y, ys);
}

/// How far ahead of the current block pair the stream is prefetched, in bytes
/// (the AVX2 packed kernels' distance, chosen there by A/B runs).
const PREFETCH_AHEAD: usize = 2048;

/// Where the four-row kernels of the low-bit float types (MXFP4, NVFP4),
/// which take whole blocks, find row `r`'s unit `k` (a block pair for MXFP4,
/// one block for NVFP4; `ub` bytes): at `w + r·row + k·step`.
/// In the file layout `row` is the row stride and `step` is `ub`; in the
/// packed layout ([`crate::packed`]) the four rows' units follow one another,
/// so `row` is `ub` and `step` is `4·ub`.
#[derive(Clone, Copy)]
pub(super) struct Units {
    w: *const u8,
    row: usize,
    step: usize,
    ub: usize,
    /// Prefetch distance in bytes.
    ahead: usize,
}

impl Units {
    /// Four rows `stride` bytes apart (prefetching [`PREFETCH_ROWS`] rows ahead
    /// in the same column, as the file-layout kernels do).
    #[inline(always)]
    pub fn file(w: *const u8, stride: usize, ub: usize) -> Units {
        Units { w, row: stride, step: ub, ub, ahead: PREFETCH_ROWS * stride }
    }

    /// One packed group (prefetching [`PREFETCH_AHEAD`] bytes along the stream).
    #[inline(always)]
    pub fn packed(w: *const u8, ub: usize) -> Units {
        Units { w, row: ub, step: PACK_ROWS * ub, ub, ahead: PREFETCH_AHEAD }
    }

    /// Start of row `r`'s unit `k`.
    #[inline(always)]
    pub fn at(self, r: usize, k: usize) -> *const u8 {
        self.w.wrapping_add(r * self.row + k * self.step)
    }

    /// Prefetches the unit `ahead` bytes after `x` (its first and last line).
    #[inline(always)]
    pub unsafe fn prefetch(self, x: *const u8) {
        prefetch(x.wrapping_add(self.ahead));
        prefetch(x.wrapping_add(self.ahead + self.ub - 1));
    }
}

/// One packed group of four rows: block pair `p` starts at `w + p·8·bb` with
/// the eight `head`-byte headers `[r0b0, r0b1, r1b0, …, r3b1]`, then the eight
/// quant runs in the same order.
#[derive(Clone, Copy)]
struct PackedGroup {
    w: *const u8,
    bb: usize,
    head: usize,
}

impl PackedGroup {
    #[inline(always)]
    fn pair(self, b: usize) -> *const u8 {
        self.w.wrapping_add(b / 2 * 2 * PACK_ROWS * self.bb)
    }
}

impl BlockPairs for PackedGroup {
    #[inline(always)]
    unsafe fn heads16<const R: usize>(self, b: usize, _pair: bool) -> __m128i {
        _mm_loadu_si128(self.pair(b) as *const __m128i)
    }

    #[inline(always)]
    unsafe fn heads32<const R: usize>(self, b: usize, _pair: bool) -> __m256i {
        _mm256_loadu_si256(self.pair(b) as *const __m256i)
    }

    #[inline(always)]
    unsafe fn quants(self, r: usize, b: usize, _pair: bool) -> (*const u8, *const u8) {
        let qb = self.bb - self.head;
        let q0 = self.pair(b).add(2 * PACK_ROWS * self.head + 2 * r * qb);
        (q0, q0.add(qb))
    }

    #[inline(always)]
    unsafe fn prefetch<const R: usize>(self, b: usize) {
        let p = self.pair(b).wrapping_add(PREFETCH_AHEAD);
        let mut off = 0;
        while off < 2 * PACK_ROWS * self.bb {
            prefetch(p.wrapping_add(off));
            off += 64;
        }
    }
}

/// Packed Q4_0 group × one Q8_0 activation row (see [`Dot4Fn`]).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI CPU; `w` a packed group of 4 rows of `n` elements
/// (`n` a multiple of 64), `a` the Q8_0 activations, `out` 4 writable floats.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot4_q4_0(n: usize, w: *const u8, _stride: usize, a: *const u8, out: *mut f32) {
    let r = q8act_rows::<4, false, _>(n, PackedGroup { w, bb: 18, head: 2 }, a);
    std::ptr::copy_nonoverlapping(r.as_ptr(), out, 4);
}

/// Packed Q8_0 group × one Q8_0 activation row (see [`Dot4Fn`]).
///
/// # Safety
/// As for [`dot4_q4_0`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot4_q8_0(n: usize, w: *const u8, _stride: usize, a: *const u8, out: *mut f32) {
    let r = q8act_rows::<4, true, _>(n, PackedGroup { w, bb: 34, head: 2 }, a);
    std::ptr::copy_nonoverlapping(r.as_ptr(), out, 4);
}
