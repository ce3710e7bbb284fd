//! Sixteen weight rows in the sixteen vector lanes: one kernel for every
//! batch size `m` of a packed Q4_1 weight at AVX-512.
//!
//! Why: the four-row kernels keep one row's 64 values across the lanes of a
//! vector, so every block pair of every (row, activation row) ends in a lane
//! permute, an int→float convert and an FMA beside its one `vpdpbusd`. For
//! batches of 2–64 rows (serving several streams, checking a speculative
//! draft, a prefill) that float tail is three quarters of the work, and the
//! lane GEMM that avoids it sums in another order, so it cannot take over
//! without breaking batch invariance. Here lane `ℓ` holds one weight row, its
//! integer block sums come from eight `vpdpbusd` against broadcast activation
//! words, and one FMA per block scales sixteen rows at once. A row's lane does
//! the same arithmetic whatever `m` and whichever rows share its vector, so a
//! batched step, a verified draft and a prefill chunk give each row the bits a
//! lone decode step gives it.
//!
//! The arithmetic of one (row, activation row), block by block in order,
//! equals [`crate::quant::q4_1::vec_dot_sequential`]:
//! `acc = fma(d_w·d_a, Σ q·y, acc)`, `accm = fma(m_w, s_a, accm)`, result
//! `acc + accm`.
//!
//! Layout read: the packed four-row groups of [`crate::packed`] (per block
//! pair, eight 4-byte `[d, m]` headers then eight 16-byte quant runs, in the
//! order `r0b0 r0b1 r1b0 r1b1 r2b0 r2b1 r3b0 r3b1`). Sixteen rows are four
//! consecutive groups; each block's 16 × 16 quant bytes are transposed in
//! registers (two lane shuffles per group, eight unpacks) so that vector `t`
//! holds bytes `4t..4t+4` of every row: lane `4k + s` is row `k` of group `s`.

use super::avx2_rows::prefetch;
use std::arch::x86_64::*;

/// Bytes of one block pair of one four-row group (8 × 4 header + 8 × 16 quants).
const PAIR_BYTES: usize = 160;

/// A zero group for the missing groups of a 4-, 8- or 12-row call: zero
/// scales, zero quants, so its lanes compute 0 and are not stored.
static ZERO_PAIR: [u8; PAIR_BYTES] = [0; PAIR_BYTES];

/// How far ahead of the current block pair each group's stream is prefetched
/// (4 KiB: at 2 KiB one-row decode ran 10% slower than the four-row kernel,
/// at 4 KiB level with it; 1 thread, SmolLM2 shapes).
const PREFETCH_AHEAD: usize = 4096;

/// Activation rows per register tile.
const ACTS: usize = 4;

#[inline(always)]
unsafe fn rd32(p: *const u8) -> i32 {
    (p as *const i32).read_unaligned()
}

/// Sixteen (or 4, 8, 12: `rows`) packed Q4_1 rows × `m` Q8_1 activation rows
/// (see [`crate::quant::Rows16Fn`]): `y[j·y_stride + r] = row r · act j`.
///
/// Up to [`ACTS`] activation rows decode each block's sixteen rows in
/// registers as they go; more first decode all blocks once into a
/// thread-local scratch (640 bytes a block, in L1 or L2) that every tile of
/// activation rows then reads. The arithmetic is the same either way.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI CPU; `w` holds `rows / 4` consecutive packed groups of
/// `row_bytes` per row (`n` a multiple of 64); `a` holds `m` Q8_1 rows of `n`
/// values `a_stride` bytes apart; `y` valid for the writes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn rows16_q4_1(
    n: usize,
    w: *const u8,
    row_bytes: usize,
    rows: usize,
    a: *const u8,
    a_stride: usize,
    m: usize,
    y: *mut f32,
    y_stride: usize,
) {
    debug_assert!(rows.is_multiple_of(4) && rows <= 16 && n.is_multiple_of(64));
    let src = Groups::new(w, row_bytes, rows);
    if m <= ACTS {
        let blocks = |i: usize| src.block(i);
        run_tile(m, n / 32, &blocks, a, a_stride, y, y_stride, rows);
        return;
    }
    SCRATCH.with(|cell| {
        let mut scratch = cell.borrow_mut();
        let nb = n / 32;
        scratch.resize(nb, Block::zero());
        for (i, blk) in scratch.iter_mut().enumerate() {
            *blk = src.block(i);
        }
        let blocks = |i: usize| scratch[i];
        let mut j = 0;
        while j < m {
            let take = (m - j).min(ACTS);
            run_tile(take, nb, &blocks, a.add(j * a_stride), a_stride, y.add(j * y_stride), y_stride, rows);
            j += take;
        }
    });
}

thread_local! {
    /// Decoded blocks of the current sixteen rows (batches above [`ACTS`]).
    static SCRATCH: std::cell::RefCell<Vec<Block>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// One block of sixteen rows, decoded: lane `4k + s` is row `k` of group `s`.
#[derive(Clone, Copy)]
struct Block {
    /// Low nibbles, bytes `4t..4t+4` (values `4t..4t+4` of the block).
    wl: [__m512i; 4],
    /// High nibbles (values `16+4t..16+4t+4`).
    wh: [__m512i; 4],
    /// The rows' scales `d` and offsets `m`.
    dw: __m512,
    mw: __m512,
}

impl Block {
    fn zero() -> Block {
        // SAFETY: all-zero bits are a valid value of every SIMD type here.
        unsafe { std::mem::zeroed() }
    }
}

/// The four packed groups of a call (missing ones read [`ZERO_PAIR`]).
#[derive(Clone, Copy)]
struct Groups {
    base: [*const u8; 4],
    step: [usize; 4],
}

impl Groups {
    fn new(w: *const u8, row_bytes: usize, rows: usize) -> Groups {
        let groups = rows / 4;
        let base =
            std::array::from_fn(|g| if g < groups { w.wrapping_add(g * 4 * row_bytes) } else { ZERO_PAIR.as_ptr() });
        let step = std::array::from_fn(|g| if g < groups { PAIR_BYTES } else { 0 });
        Groups { base, step }
    }

    /// Block `i` of all sixteen rows, decoded (prefetching the four streams
    /// ahead at even blocks).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn block(self, i: usize) -> Block {
        let (p, b) = (i / 2, i % 2);
        let x: [*const u8; 4] = std::array::from_fn(|g| self.base[g].add(p * self.step[g]));
        if b == 0 {
            for xg in x {
                prefetch(xg.wrapping_add(PREFETCH_AHEAD));
                prefetch(xg.wrapping_add(PREFETCH_AHEAD + 64));
                prefetch(xg.wrapping_add(PREFETCH_AHEAD + 128));
            }
        }
        // Quant halves of group g: [r0b0 r0b1 r1b0 r1b1] and [r2b0 r2b1 r3b0 r3b1]
        // (16 bytes each); block b's four rows [r0 | r1 | r2 | r3].
        let q = |g: usize, h: usize| _mm512_loadu_si512(x[g].add(32 + 64 * h) as *const __m512i);
        let rows_of = |g: usize| {
            if b == 0 {
                _mm512_shuffle_i64x2::<0x88>(q(g, 0), q(g, 1))
            } else {
                _mm512_shuffle_i64x2::<0xDD>(q(g, 0), q(g, 1))
            }
        };
        let (ga, gb, gc, gd) = (rows_of(0), rows_of(1), rows_of(2), rows_of(3));
        let lo_ab = _mm512_unpacklo_epi32(ga, gb);
        let hi_ab = _mm512_unpackhi_epi32(ga, gb);
        let lo_cd = _mm512_unpacklo_epi32(gc, gd);
        let hi_cd = _mm512_unpackhi_epi32(gc, gd);
        // tv[t]: quant bytes 4t..4t+4 of every row (lane 4k + s: group s, row k).
        let tv = [
            _mm512_unpacklo_epi64(lo_ab, lo_cd),
            _mm512_unpackhi_epi64(lo_ab, lo_cd),
            _mm512_unpacklo_epi64(hi_ab, hi_cd),
            _mm512_unpackhi_epi64(hi_ab, hi_cd),
        ];
        let low = _mm512_set1_epi8(0x0F);
        // Header dword of lane 4k + s for block b: group s (8 dwords each), row k.
        let idx = if b == 0 {
            _mm512_setr_epi32(0, 8, 16, 24, 2, 10, 18, 26, 4, 12, 20, 28, 6, 14, 22, 30)
        } else {
            _mm512_setr_epi32(1, 9, 17, 25, 3, 11, 19, 27, 5, 13, 21, 29, 7, 15, 23, 31)
        };
        let dm = _mm512_permutex2var_epi32(join(x[0], x[1]), idx, join(x[2], x[3]));
        Block {
            wl: tv.map(|v| _mm512_and_si512(v, low)),
            wh: tv.map(|v| _mm512_and_si512(_mm512_srli_epi16::<4>(v), low)),
            dw: _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm)),
            mw: _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(dm))),
        }
    }
}

/// `m` (at most [`ACTS`]) activation rows against the sixteen row lanes,
/// block `i` from `blocks(i)`; stores the first `rows` lanes of each.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn run_tile(
    m: usize,
    nb: usize,
    blocks: &impl Fn(usize) -> Block,
    a: *const u8,
    a_stride: usize,
    y: *mut f32,
    y_stride: usize,
    rows: usize,
) {
    match m {
        1 => tile::<1>(nb, blocks, a, a_stride, y, y_stride, rows),
        2 => tile::<2>(nb, blocks, a, a_stride, y, y_stride, rows),
        3 => tile::<3>(nb, blocks, a, a_stride, y, y_stride, rows),
        _ => tile::<ACTS>(nb, blocks, a, a_stride, y, y_stride, rows),
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn tile<const J: usize>(
    nb: usize,
    blocks: &impl Fn(usize) -> Block,
    a: *const u8,
    a_stride: usize,
    y: *mut f32,
    y_stride: usize,
    rows: usize,
) {
    let mut acc = [_mm512_setzero_ps(); J];
    let mut accm = [_mm512_setzero_ps(); J];
    for i in 0..nb {
        let blk = blocks(i);
        for jj in 0..J {
            // Q8_1 block: d, s (f16), then 32 values.
            let yb = a.add(jj * a_stride + i * 36);
            let ds = _mm_cvtph_ps(_mm_cvtsi32_si128(rd32(yb)));
            let mut sl = _mm512_setzero_si512();
            let mut sh = _mm512_setzero_si512();
            for t in 0..4 {
                sl = _mm512_dpbusd_epi32(sl, blk.wl[t], _mm512_set1_epi32(rd32(yb.add(4 + 4 * t))));
                sh = _mm512_dpbusd_epi32(sh, blk.wh[t], _mm512_set1_epi32(rd32(yb.add(20 + 4 * t))));
            }
            let sum = _mm512_cvtepi32_ps(_mm512_add_epi32(sl, sh));
            let scale = _mm512_mul_ps(blk.dw, _mm512_broadcastss_ps(ds));
            acc[jj] = _mm512_fmadd_ps(scale, sum, acc[jj]);
            accm[jj] = _mm512_fmadd_ps(blk.mw, _mm512_broadcastss_ps(_mm_movehdup_ps(ds)), accm[jj]);
        }
    }
    // Lane 4k + s holds row 4s + k: back to row order, the first `rows` stored.
    let to_rows = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    let mask: __mmask16 = if rows >= 16 { 0xFFFF } else { (1u16 << rows) - 1 };
    for jj in 0..J {
        let v = _mm512_permutexvar_ps(to_rows, _mm512_add_ps(acc[jj], accm[jj]));
        _mm512_mask_storeu_ps(y.add(jj * y_stride), mask, v);
    }
}

/// Two groups' 32-byte headers as one vector.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn join(a: *const u8, b: *const u8) -> __m512i {
    let lo = _mm256_loadu_si256(a as *const __m256i);
    let hi = _mm256_loadu_si256(b as *const __m256i);
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}
