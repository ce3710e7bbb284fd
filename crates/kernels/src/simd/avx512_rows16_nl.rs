//! AVX-512 VNNI sixteen-row kernel of IQ4_NL in the transposed layout of
//! [`crate::packed::lanes16`] (each block stored codes first, its `d` last):
//! lane `ℓ` of every vector is weight row `ℓ`, so one kernel serves every
//! batch size with no horizontal sums and no shuffles of the weights.
//!
//! Why: IQ4_NL used to be packed in Q4_0's four-row layout, and its
//! sixteen-row kernel transposed every block in registers (lane shuffles,
//! 4 × 4 dword unpacks, a permute of the scales) before its eight `vpdpbusd`:
//! more shuffle-port work than arithmetic, which left one-thread decode
//! compute bound on AMD Zen 4 (0.77× llama.cpp, 40% of the bandwidth).
//! Transposed at load, a block of sixteen rows is four code vectors and one
//! f16 vector of scales.
//!
//! Per block of sixteen rows (288 bytes) and activation row:
//! * vector `v` (0..4) holds codes `4v..4v+4` of every row; its low nibbles
//!   are values `4v..4v+4`, its high nibbles values `16+4v..`: each nibble
//!   looks up `K[q] + 128` (one `vpshufb`, unsigned for `vpdpbusd`) and meets
//!   four activation bytes broadcast from memory;
//! * `128·Σy` of the activation block (computed once per call) comes back out
//!   of the integer sum;
//! * the float step is the scalar reference's (`quant::iq4_nl::vec_dot`:
//!   `sum + (d_a·d)·isum`, no FMA, blocks in order), so every row equals the
//!   reference bit for bit at every batch size.

use super::avx512_rows16::with_block_offsets;
use std::arch::x86_64::*;

/// Rows per group (the lanes).
const ROWS: usize = 16;
/// Activation rows per register tile.
const ACTS: usize = 4;
/// One block of sixteen rows: four code vectors, then sixteen f16 `d`.
const BLOCK: usize = ROWS * 18;
/// Q8_0 activation block: an f16 `d`, then 32 codes.
const ACT_BYTES: usize = 34;
/// How far ahead the group's stream is prefetched into L2 (as the K-quants'
/// sixteen-row kernels, whose stream is the same shape).
const PREFETCH_AHEAD: usize = 8192;

/// `K[q] + 128` for each IQ4_NL nibble `q`.
static K128: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut q = 0;
    while q < 16 {
        t[q] = (crate::quant::iq4_nl::KVALUES[q] as u8) ^ 0x80;
        q += 1;
    }
    t
};

thread_local! {
    /// The current group's blocks, decoded once (batches above [`ACTS`]).
    static SCRATCH: std::cell::RefCell<Vec<Block>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// One block of sixteen rows, decoded: `lo[v]`/`hi[v]` the looked-up
/// `K[q] + 128` of values `4v..4v+4` and `16+4v..`, `d` the rows' scales.
#[derive(Clone, Copy)]
struct Block {
    lo: [__m512i; 4],
    hi: [__m512i; 4],
    d: __m512,
}

/// Block `b` of the group at `w`, decoded (its stream prefetched ahead).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn decode(w: *const u8, b: usize) -> Block {
    let x = w.add(b * BLOCK);
    let ahead = x.wrapping_add(PREFETCH_AHEAD);
    for l in 0..BLOCK.div_ceil(64) {
        _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(64 * l) as *const i8);
    }
    let low4 = _mm512_set1_epi8(0x0F);
    let table = _mm512_broadcast_i32x4(_mm_loadu_si128(K128.as_ptr() as *const __m128i));
    let q: [__m512i; 4] = std::array::from_fn(|v| _mm512_loadu_si512(x.add(64 * v) as *const _));
    Block {
        lo: q.map(|q| _mm512_shuffle_epi8(table, _mm512_and_si512(q, low4))),
        hi: q.map(|q| _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16::<4>(q), low4))),
        d: _mm512_cvtph_ps(_mm256_loadu_si256(x.add(4 * 64) as *const __m256i)),
    }
}

#[inline(always)]
unsafe fn bcast4(p: *const u8) -> __m512i {
    _mm512_set1_epi32((p as *const i32).read_unaligned())
}

/// `rows` (a multiple of 16) IQ4_NL rows in the lanes16 layout × `m` Q8_0
/// activation rows (see [`crate::quant::Rows16Fn`]): `y[j·y_stride + r] =
/// row r · act j`, each equal to `quant::iq4_nl::vec_dot`.
///
/// Up to [`ACTS`] activation rows decode each block as they go; more first
/// decode the group's blocks once into a thread-local scratch (576 bytes a
/// block, in L1 or L2) that every tile of activation rows then reads. The
/// arithmetic is the same either way.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI CPU; `w` holds `rows / 16` lanes16 groups of
/// `row_bytes` per row (`n` a multiple of 32); `a` holds `m` Q8_0 rows of `n`
/// values `a_stride` bytes apart; `y` valid for the writes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn rows16_iq4_nl(
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
    debug_assert!(rows.is_multiple_of(ROWS) && n.is_multiple_of(32));
    let nb = n / 32;
    with_block_offsets(a, a_stride, m, nb, 128, |offsets| {
        for g in 0..rows / ROWS {
            let gw = w.add(g * ROWS * row_bytes);
            let yg = y.add(g * ROWS);
            if m <= ACTS {
                let blocks = |b: usize| decode(gw, b);
                run_tile(m, nb, &blocks, a, a_stride, offsets, yg, y_stride);
                continue;
            }
            SCRATCH.with(|cell| {
                let mut scratch = cell.borrow_mut();
                scratch.clear();
                scratch.extend((0..nb).map(|b| decode(gw, b)));
                let blocks = |b: usize| *scratch.get_unchecked(b);
                let mut j = 0;
                while j < m {
                    let take = (m - j).min(ACTS);
                    let (aj, oj) = (a.add(j * a_stride), &offsets[j * nb..]);
                    run_tile(take, nb, &blocks, aj, a_stride, oj, yg.add(j * y_stride), y_stride);
                    j += take;
                }
            });
        }
    });
}

/// [`tile`] for `m` (1..=[`ACTS`]) activation rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn run_tile(
    m: usize,
    nb: usize,
    blocks: &impl Fn(usize) -> Block,
    a: *const u8,
    a_stride: usize,
    offsets: &[i32],
    y: *mut f32,
    y_stride: usize,
) {
    match m {
        1 => tile::<1>(nb, blocks, a, a_stride, offsets, y, y_stride),
        2 => tile::<2>(nb, blocks, a, a_stride, offsets, y, y_stride),
        3 => tile::<3>(nb, blocks, a, a_stride, offsets, y, y_stride),
        _ => tile::<ACTS>(nb, blocks, a, a_stride, offsets, y, y_stride),
    }
}

/// One group of sixteen rows × `J` activation rows; `offsets[j·nb + b]` is
/// `128·Σy` of activation row `j`'s block `b`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn tile<const J: usize>(
    nb: usize,
    blocks: &impl Fn(usize) -> Block,
    a: *const u8,
    a_stride: usize,
    offsets: &[i32],
    y: *mut f32,
    y_stride: usize,
) {
    let mut sums = [_mm512_setzero_ps(); J];
    for b in 0..nb {
        let blk = blocks(b);
        // Low and high nibbles in separate chains: eight independent sums at J = 4.
        let mut lo_acc = [_mm512_setzero_si512(); J];
        let mut hi_acc = [_mm512_setzero_si512(); J];
        for v in 0..4 {
            for j in 0..J {
                let yq = a.add(j * a_stride + b * ACT_BYTES + 2 + 4 * v);
                lo_acc[j] = _mm512_dpbusd_epi32(lo_acc[j], blk.lo[v], bcast4(yq));
                hi_acc[j] = _mm512_dpbusd_epi32(hi_acc[j], blk.hi[v], bcast4(yq.add(16)));
            }
        }
        for j in 0..J {
            let yb = a.add(j * a_stride + b * ACT_BYTES);
            let off = _mm512_set1_epi32(*offsets.get_unchecked(j * nb + b));
            let isum = _mm512_sub_epi32(_mm512_add_epi32(lo_acc[j], hi_acc[j]), off);
            let da = _mm_cvtph_ps(_mm_cvtsi32_si128((yb as *const u16).read_unaligned() as i32));
            let t = _mm512_mul_ps(_mm512_mul_ps(blk.d, _mm512_broadcastss_ps(da)), _mm512_cvtepi32_ps(isum));
            sums[j] = _mm512_add_ps(sums[j], t);
        }
    }
    for (j, s) in sums.iter().enumerate() {
        _mm512_storeu_ps(y.add(j * y_stride), *s);
    }
}
