//! Sixteen weight rows in the sixteen vector lanes: one kernel for every
//! batch size `m` of a packed Q4_0 or Q8_0 weight at AVX-512 (IQ4_NL:
//! [`super::avx512_rows16_nl`], Q4_1, Q5_0 and Q5_1:
//! [`super::avx512_rows16_q5`], transposed at load).
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
//! equals [`crate::quant::q8_0::vec_dot_sequential`] (`acc = fma(d_w·d_a,
//! Σ w·y, acc)`; Q4_0's the same). Q8_0's signed weights meet `vpdpbusd`'s unsigned operand as
//! `w + 128` (one `xor`), and `128·Σy` comes back out of the integer sum.
//!
//! Layout read: the packed four-row groups of [`crate::packed`] (per block
//! pair, eight headers — the `d`s — then eight quant
//! runs, in the order `r0b0 r0b1 r1b0 r1b1 r2b0 r2b1 r3b0 r3b1`). Sixteen
//! rows are four consecutive groups; each block's quant bytes are transposed
//! in registers (lane shuffles per group, then 4 × 4 dword unpacks) so that
//! vector `t` holds the codes of values `4t..4t+4` of every row (Q4_0: the
//! low nibbles for `t < 4`, the high ones after): lane `4k + s` is row `k` of
//! group `s`.

use super::avx2::rd16;
use super::avx2_rows::prefetch;
use std::arch::x86_64::*;

/// A zero group for the missing groups of a 4-, 8- or 12-row tail (at least
/// one block pair of either format): zero scales, zero quants, so its lanes
/// compute 0 and are not stored.
static ZERO_PAIR: [u8; 8 * 34] = [0; 8 * 34];

/// How far ahead of the current block pair each group's stream is prefetched
/// (4 KiB: at 2 KiB one-row decode ran 10% slower than the four-row kernel,
/// at 4 KiB level with it; 1 thread, SmolLM2 shapes).
const PREFETCH_AHEAD: usize = 4096;

/// Activation rows per register tile.
const ACTS: usize = 4;

/// The formats (the `F` parameter below).
const Q8_0: u8 = 1;
const Q4_0: u8 = 2;

#[inline(always)]
unsafe fn rd32(p: *const u8) -> i32 {
    (p as *const i32).read_unaligned()
}

/// `rows` (a multiple of 4, taken sixteen at a time) packed Q8_0 rows × `m` Q8_0 activation rows
/// (see [`crate::quant::Rows16Fn`]): `y[j·y_stride + r] = row r · act j`.
///
/// Up to [`ACTS`] activation rows decode each block's sixteen rows in
/// registers as they go; more first decode all blocks once into a
/// thread-local scratch (640 bytes a block, in L1 or L2) that every tile of
/// activation rows then reads. The arithmetic is the same either way.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI CPU; `w` holds `rows / 4` consecutive packed groups of
/// `row_bytes` per row (`n` a multiple of 64); `a` holds `m` Q8_0 rows of `n`
/// values `a_stride` bytes apart; `y` valid for the writes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn rows16_q8_0(
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
    rows16::<Q8_0>(n, w, row_bytes, rows, a, a_stride, m, y, y_stride)
}

/// `rows` packed Q4_0 rows × `m` Q8_0 activation rows, as
/// [`rows16_q8_0`].
///
/// # Safety
/// As for [`rows16_q8_0`], with Q4_0 weights.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn rows16_q4_0(
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
    rows16::<Q4_0>(n, w, row_bytes, rows, a, a_stride, m, y, y_stride)
}

/// Every format (`F`: [`Q8_0`], [`Q4_0`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn rows16<const F: u8>(
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
    debug_assert!(rows.is_multiple_of(4) && n.is_multiple_of(64));
    let nb = n / 32;
    // Each activation block's offset term, `c·Σy` (Q4_0's codes are `w + 8`,
    // Q8_0's go in as `w + 128`).
    let c = if F == Q4_0 { 8 } else { 128 };
    with_block_offsets(a, a_stride, m, nb, c, |offsets| {
        let mut r = 0;
        while r < rows {
            let take = (rows - r).min(16);
            group::<F>(n, w.add(r * row_bytes), row_bytes, take, a, a_stride, m, y.add(r), y_stride, offsets);
            r += take;
        }
    });
}

/// Up to sixteen rows (one call of the lanes) × all `m` activation rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn group<const F: u8>(
    n: usize,
    w: *const u8,
    row_bytes: usize,
    rows: usize,
    a: *const u8,
    a_stride: usize,
    m: usize,
    y: *mut f32,
    y_stride: usize,
    offsets: &[i32],
) {
    let nb = n / 32;
    let src = Groups::new::<F>(w, row_bytes, rows);
    if m <= ACTS {
        let blocks = |i: usize| src.block::<F>(i);
        run_tile::<F>(m, nb, &blocks, a, a_stride, offsets, y, y_stride, rows);
        return;
    }
    SCRATCH.with(|cell| {
        let mut scratch = cell.borrow_mut();
        scratch.resize(nb, Block::zero());
        for (i, blk) in scratch.iter_mut().enumerate() {
            *blk = src.block::<F>(i);
        }
        let blocks = |i: usize| scratch[i];
        let mut j = 0;
        while j < m {
            let take = (m - j).min(ACTS);
            let offs = offsets.get(j * nb..).unwrap_or(&[]);
            run_tile::<F>(take, nb, &blocks, a.add(j * a_stride), a_stride, offs, y.add(j * y_stride), y_stride, rows);
            j += take;
        }
    });
}

/// Runs `f` on `c·Σy` of every Q8_0 activation block of a call (`m` rows of
/// `nb` blocks, `a_stride` bytes apart; index `j·nb + i`), computed once for
/// all its weight rows: what codes stored as `w + c` add to an integer sum.
/// `c = 0` (no offset) passes an empty slice.
///
/// # Safety
/// AVX-512 F/BW/VL CPU; `a` holds the `m` activation rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn with_block_offsets<R>(
    a: *const u8,
    a_stride: usize,
    m: usize,
    nb: usize,
    c: i32,
    f: impl FnOnce(&[i32]) -> R,
) -> R {
    OFFSETS.with(|cell| {
        let mut offsets = cell.borrow_mut();
        offsets.clear();
        if c != 0 {
            for j in 0..m {
                for i in 0..nb {
                    offsets.push(c * code_sum(a.add(j * a_stride + i * 34 + 2)));
                }
            }
        }
        f(&offsets)
    })
}

thread_local! {
    /// `c·Σy` of every activation block of the call (`m × nb`; [`with_block_offsets`]).
    static OFFSETS: std::cell::RefCell<Vec<i32>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Decoded blocks of the current sixteen rows (batches above [`ACTS`]).
    static SCRATCH: std::cell::RefCell<Vec<Block>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// One block of sixteen rows, decoded: lane `4k + s` is row `k` of group `s`.
#[derive(Clone, Copy)]
struct Block {
    /// `w[t]`: the codes of values `4t..4t+4` as unsigned bytes (Q4_0
    /// nibbles; Q8_0 codes + 128), to meet the activation bytes `4t..4t+4`.
    w: [__m512i; 8],
    /// The rows' scales `d`.
    dw: __m512,
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
    fn new<const F: u8>(w: *const u8, row_bytes: usize, rows: usize) -> Groups {
        let pair_bytes = match F {
            Q8_0 => 8 * 34,
            _ => 8 * 18,
        };
        let groups = rows / 4;
        let base =
            std::array::from_fn(|g| if g < groups { w.wrapping_add(g * 4 * row_bytes) } else { ZERO_PAIR.as_ptr() });
        let step = std::array::from_fn(|g| if g < groups { pair_bytes } else { 0 });
        Groups { base, step }
    }

    /// Block `i` of all sixteen rows, decoded (prefetching the four streams
    /// ahead at even blocks).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn block<const F: u8>(self, i: usize) -> Block {
        let (p, b) = (i / 2, i % 2);
        let x: [*const u8; 4] = std::array::from_fn(|g| self.base[g].add(p * self.step[g]));
        if b == 0 {
            for xg in x {
                for line in 0..if F == Q8_0 { 5 } else { 3 } {
                    prefetch(xg.wrapping_add(PREFETCH_AHEAD + 64 * line));
                }
            }
        }
        match F {
            Q8_0 => q8_0_block(x, b),
            _ => q4_0_block(x, b),
        }
    }
}

/// 4 × 4 dword transpose of four groups' `[r0 | r1 | r2 | r3]` vectors:
/// `out[t]` lane `4k + s` = dword `t` of row `k` of group `s`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn transpose(ga: __m512i, gb: __m512i, gc: __m512i, gd: __m512i) -> [__m512i; 4] {
    let lo_ab = _mm512_unpacklo_epi32(ga, gb);
    let hi_ab = _mm512_unpackhi_epi32(ga, gb);
    let lo_cd = _mm512_unpacklo_epi32(gc, gd);
    let hi_cd = _mm512_unpackhi_epi32(gc, gd);
    [
        _mm512_unpacklo_epi64(lo_ab, lo_cd),
        _mm512_unpackhi_epi64(lo_ab, lo_cd),
        _mm512_unpacklo_epi64(hi_ab, hi_cd),
        _mm512_unpackhi_epi64(hi_ab, hi_cd),
    ]
}

/// The sixteen rows' nibbles of block `b`, the group's quant runs starting
/// `quants` bytes into its pair (sixteen bytes a row and block, in the order
/// `r0b0 r0b1 r1b0 …`): low nibbles then high ones, as [`Block::w`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn nibbles(x: [*const u8; 4], quants: usize, b: usize) -> [__m512i; 8] {
    // Quant halves of group g: [r0b0 r0b1 r1b0 r1b1] and [r2b0 r2b1 r3b0 r3b1];
    // block b's four rows [r0 | r1 | r2 | r3].
    let q = |g: usize, h: usize| _mm512_loadu_si512(x[g].add(quants + 64 * h) as *const __m512i);
    let rows_of = |g: usize| {
        if b == 0 {
            _mm512_shuffle_i64x2::<0x88>(q(g, 0), q(g, 1))
        } else {
            _mm512_shuffle_i64x2::<0xDD>(q(g, 0), q(g, 1))
        }
    };
    let tv = transpose(rows_of(0), rows_of(1), rows_of(2), rows_of(3));
    let low = _mm512_set1_epi8(0x0F);
    let lo = tv.map(|v| _mm512_and_si512(v, low));
    let hi = tv.map(|v| _mm512_and_si512(_mm512_srli_epi16::<4>(v), low));
    [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]]
}

/// Q4_0 block `b` of the pair at `x` (144 bytes a group: eight 2-byte `d`,
/// eight 16-byte nibble runs); the codes stay unsigned, `8·Σy` comes out of
/// the sum.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn q4_0_block(x: [*const u8; 4], b: usize) -> Block {
    Block { w: nibbles(x, 16, b), dw: word_scales(x, b) }
}

/// The sixteen rows' f16 scales of block `b` from the groups' eight-word
/// headers (Q4_0, Q8_0).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn word_scales(x: [*const u8; 4], b: usize) -> __m512 {
    let words = |g: usize| _mm_loadu_si128(x[g] as *const __m128i);
    let heads = _mm512_inserti32x4::<3>(
        _mm512_inserti32x4::<2>(_mm512_inserti32x4::<1>(_mm512_castsi128_si512(words(0)), words(1)), words(2)),
        words(3),
    );
    let idx = _mm512_loadu_si512(HEAD_WORDS[b].as_ptr() as *const __m512i);
    _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(idx, heads)))
}

/// The header word of lane `4k + s` for block `b` (Q4_0, Q8_0): word `8s + 2k + b` of
/// the four groups' headers (the upper 16 entries are unused).
static HEAD_WORDS: [[u16; 32]; 2] = {
    let mut t = [[0u16; 32]; 2];
    let mut b = 0;
    while b < 2 {
        let mut lane = 0;
        while lane < 16 {
            t[b][lane] = (8 * (lane % 4) + 2 * (lane / 4) + b) as u16;
            lane += 1;
        }
        b += 1;
    }
    t
};

/// Q8_0 block `b` of the pair at `x` (272 bytes a group: eight 2-byte `d`,
/// then each row's two 32-byte runs).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn q8_0_block(x: [*const u8; 4], b: usize) -> Block {
    // Row r of group g, both blocks: [b0 0..16 | b0 16..32 | b1 0..16 | b1 16..32].
    let q = |g: usize, r: usize| _mm512_loadu_si512(x[g].add(16 + 64 * r) as *const __m512i);
    // Rows (r, r + 1) of block b: [r lo | r hi | r+1 lo | r+1 hi].
    let pair = |g: usize, r: usize| {
        if b == 0 {
            _mm512_shuffle_i64x2::<0x44>(q(g, r), q(g, r + 1))
        } else {
            _mm512_shuffle_i64x2::<0xEE>(q(g, r), q(g, r + 1))
        }
    };
    let halves = |g: usize| {
        let (p01, p23) = (pair(g, 0), pair(g, 2));
        (_mm512_shuffle_i64x2::<0x88>(p01, p23), _mm512_shuffle_i64x2::<0xDD>(p01, p23))
    };
    let (h0, h1, h2, h3) = (halves(0), halves(1), halves(2), halves(3));
    let lo = transpose(h0.0, h1.0, h2.0, h3.0);
    let hi = transpose(h0.1, h1.1, h2.1, h3.1);
    let flip = _mm512_set1_epi8(-128);
    let f = |v: __m512i| _mm512_xor_si512(v, flip);
    Block { w: [f(lo[0]), f(lo[1]), f(lo[2]), f(lo[3]), f(hi[0]), f(hi[1]), f(hi[2]), f(hi[3])], dw: word_scales(x, b) }
}

/// `m` (at most [`ACTS`]) activation rows against the sixteen row lanes,
/// block `i` from `blocks(i)`; stores the first `rows` lanes of each.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn run_tile<const F: u8>(
    m: usize,
    nb: usize,
    blocks: &impl Fn(usize) -> Block,
    a: *const u8,
    a_stride: usize,
    offsets: &[i32],
    y: *mut f32,
    y_stride: usize,
    rows: usize,
) {
    match m {
        1 => tile::<F, 1>(nb, blocks, a, a_stride, offsets, y, y_stride, rows),
        2 => tile::<F, 2>(nb, blocks, a, a_stride, offsets, y, y_stride, rows),
        3 => tile::<F, 3>(nb, blocks, a, a_stride, offsets, y, y_stride, rows),
        _ => tile::<F, ACTS>(nb, blocks, a, a_stride, offsets, y, y_stride, rows),
    }
}

/// `Σ y` of a Q8_0 block's 32 signed codes at `qs`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn code_sum(qs: *const u8) -> i32 {
    let v = _mm256_xor_si256(_mm256_loadu_si256(qs as *const __m256i), _mm256_set1_epi8(-128));
    let s4 = _mm256_sad_epu8(v, _mm256_setzero_si256());
    let s2 = _mm_add_epi64(_mm256_castsi256_si128(s4), _mm256_extracti128_si256::<1>(s4));
    _mm_cvtsi128_si32(_mm_add_epi64(s2, _mm_unpackhi_epi64(s2, s2))) - 32 * 128
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const F: u8, const J: usize>(
    nb: usize,
    blocks: &impl Fn(usize) -> Block,
    a: *const u8,
    a_stride: usize,
    offsets: &[i32],
    y: *mut f32,
    y_stride: usize,
    rows: usize,
) {
    // Q8_0 activation blocks: d (f16), then 32 codes.
    let (act_bytes, qs) = (34, 2);
    let mut acc = [_mm512_setzero_ps(); J];
    for i in 0..nb {
        let blk = blocks(i);
        for jj in 0..J {
            let yb = a.add(jj * a_stride + i * act_bytes);
            let yq = yb.add(qs);
            let mut sl = _mm512_setzero_si512();
            let mut sh = _mm512_setzero_si512();
            for t in 0..4 {
                sl = _mm512_dpbusd_epi32(sl, blk.w[t], _mm512_set1_epi32(rd32(yq.add(4 * t))));
                sh = _mm512_dpbusd_epi32(sh, blk.w[4 + t], _mm512_set1_epi32(rd32(yq.add(16 + 4 * t))));
            }
            // Q8_0's codes went in as w + 128, Q4_0's are q = w + 8.
            let isum =
                _mm512_sub_epi32(_mm512_add_epi32(sl, sh), _mm512_set1_epi32(*offsets.get_unchecked(jj * nb + i)));
            let ds = _mm_cvtph_ps(_mm_cvtsi32_si128(rd16(yb) as i32));
            let scale = _mm512_mul_ps(blk.dw, _mm512_broadcastss_ps(ds));
            acc[jj] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(isum), acc[jj]);
        }
    }
    // Lane 4k + s holds row 4s + k: back to row order, the first `rows` stored.
    let to_rows = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    let mask: __mmask16 = if rows >= 16 { 0xFFFF } else { (1u16 << rows) - 1 };
    for jj in 0..J {
        _mm512_mask_storeu_ps(y.add(jj * y_stride), mask, _mm512_permutexvar_ps(to_rows, acc[jj]));
    }
}
