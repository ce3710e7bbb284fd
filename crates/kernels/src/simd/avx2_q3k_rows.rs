//! AVX2 decode kernels of Q3_K in transposed code planes
//! ([`crate::packed::q3k_planes`]): a row-range kernel (every batch size
//! below the GEMM's) and a four-row one.
//!
//! Why: the planes kernel in file order spent per 32-value chunk a
//! `vpshufb` for its two sub-blocks' scale words, a `vpmaddwd` and an add
//! besides the product, ~78 µops a super-block-row, and this
//! two-vector-µops-a-cycle class of CPU (the AMD EPYC VMs) is bound by the
//! µops: 10–15 ns a super-block-row in L2, 61% of the memory bandwidth in a
//! Q3_K_M decode. In the transposed planes word lane `s` of every chunk is
//! sub-block `s`, so per block:
//! * the eight chunks' codes (`plane_codes`, 19 µops) meet the transposed
//!   activations in eight `vpmaddubsw` whose i16 pairs add up in place
//!   (`vpaddw`; |Σ| ≤ 8·2·7·128 < 2¹⁵);
//! * `4·bsum` of each sub-block comes off in i16 (the stored code is
//!   `u − 4`; |Σ (u − 4)·y| ≤ 16·4·128 = 2¹³), and one `vpmaddwd` against
//!   the 16 scale words gives the block's 8 i32 lanes;
//! * four blocks' sums reduce together and their float steps run in four
//!   lanes.
//!
//! * the sixteen scales come out of their bit string
//!   ([`super::avx2_q3k_recode::plane_scales`]) in four µops, where the
//!   file's split nibbles and top bits took about ten.
//!
//! About 48 µops a super-block-row: 7.0 ns in L2 (7.7 with the file's
//! scale bytes; 10–15 in file order). The
//! activation transpose (`to_lanes`, ~40 µops a block) runs once a call
//! for the row-range kernel.
//!
//! One row at a time, not four: the recoded rows lie in file order, so four
//! rows at once are four streams from memory, and in a Q3_K_M decode on the
//! EPYC VM four streams read 17.5 GB/s where one-stream kernels read 23–26
//! (`perf`); one row at a time decoded 35 tok/s against 33 (A/B, same
//! binary).
//!
//! Batches (`m > 1`, below the GEMM's 32 rows) decode each block once for
//! up to [`TILE`] activation rows (`row_tile`): the decode (codes and
//! scales, ~23 µops) was half of each row × activation block. At the 1.1B
//! shapes, `HIDDEN=2048 FFN=5632 KV=256 LAYERS=22 VOCAB=0 WDTYPE=Q3_K
//! PACKED=1 bench_matmul 2 M`, four alternating pairs on the Zen 3 VM: m = 4
//! / 8 / 16 ran 63.9 / 55.8 / 65.5 tok/s before and 91.6 / 116.2 / 104.6
//! after (1.54× / 1.97× / 1.64×); m = 1 is unchanged.
//!
//! Numerics: every integer sum is exact and the float step is the scalar
//! reference's (`d·d_a·isum` a block, added in block order), so each row
//! equals `quant::q3_k` of its file-layout row bit for bit.

use super::avx2_k::ld;
use super::avx2_q3k_recode::{plane_codes, plane_scales, to_lanes};
use super::avx2_rows::prefetch;
use super::avx512_lowk::{f16_at, sum1, sum4};
use super::avx512_rows16_k::PREFETCH_AHEAD;
use std::arch::x86_64::*;

/// Bytes of a Q3_K block.
const BLOCK: usize = 110;
/// Q8_K activation block: `d` (f32), 256 codes, 16 i16 sub-block sums.
const Q8K_QS: usize = 4;
const Q8K_BSUMS: usize = 260;
const Q8K_BYTES: usize = 292;

/// One Q8_K activation block in the planes' order.
#[derive(Clone, Copy)]
#[repr(C)]
struct Acts {
    /// Chunk `c`'s 32 codes: byte `l` is value `16·(l / 2) + 2c + l % 2`.
    q: [__m256i; 8],
    /// `4·Σ y` of each sub-block `s`, word `s`.
    bsum4: __m256i,
    d: f32,
}

thread_local! {
    /// One activation row's blocks, transposed (reused across calls).
    static ACTS: std::cell::RefCell<Vec<Acts>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The Q8_K block at `y` in the planes' order.
#[inline(always)]
unsafe fn transpose_acts(y: *const u8) -> Acts {
    let mut v = [_mm256_setzero_si256(); 8];
    for (c, vc) in v.iter_mut().enumerate() {
        *vc = ld(y.add(Q8K_QS + 32 * c));
    }
    Acts { q: to_lanes(&v), bsum4: _mm256_slli_epi16::<2>(ld(y.add(Q8K_BSUMS))), d: (y as *const f32).read_unaligned() }
}

/// One row's block at `x`, decoded: its eight chunks' codes and the
/// sixteen scale words.
#[derive(Clone, Copy)]
struct Decoded {
    u: [__m256i; 8],
    sc16: __m256i,
}

#[inline(always)]
unsafe fn decode(x: *const u8) -> Decoded {
    Decoded { sc16: plane_scales(x), u: plane_codes(ld(x), ld(x.add(32)), ld(x.add(64))) }
}

/// A decoded block against `t`: the exact `Σ_s sc_s·Σ (u − 4)·y` spread
/// over 8 lanes.
#[inline(always)]
unsafe fn decoded_sums(w: &Decoded, t: &Acts) -> __m256i {
    let mut p = _mm256_maddubs_epi16(w.u[0], t.q[0]);
    for c in 1..8 {
        p = _mm256_add_epi16(p, _mm256_maddubs_epi16(w.u[c], t.q[c]));
    }
    _mm256_madd_epi16(_mm256_sub_epi16(p, t.bsum4), w.sc16)
}

/// One row's block at `x` against `t`.
#[inline(always)]
unsafe fn block_sums(x: *const u8, t: &Acts) -> __m256i {
    decoded_sums(&decode(x), t)
}

/// `sum += (d·d_a)·isum` for four blocks in four lanes, then added in block
/// order: `one_row`'s float step, shared with the tile.
#[inline(always)]
unsafe fn step4(xb: &[*const u8; 4], t: &[Acts], isum: __m128i, sum: &mut f32) {
    let xd =
        _mm_setr_ps(f16_at(xb[0].add(108)), f16_at(xb[1].add(108)), f16_at(xb[2].add(108)), f16_at(xb[3].add(108)));
    let yd = _mm_setr_ps(t[0].d, t[1].d, t[2].d, t[3].d);
    let mut v = [0f32; 4];
    _mm_storeu_ps(v.as_mut_ptr(), _mm_mul_ps(_mm_mul_ps(xd, yd), _mm_cvtepi32_ps(isum)));
    for vb in v {
        *sum += vb;
    }
}

/// Most activation rows a tile serves from one decoded block.
const TILE: usize = 16;

/// One row at `x0` against `acts.len() / nb` (≤ [`TILE`]) transposed
/// activation rows, each block decoded once for all of them; `y[j·y_stride]`
/// gets act `j`'s dot, the same sums in the same order as [`one_row`], so
/// equal to it bit for bit.
#[inline(always)]
unsafe fn row_tile(x0: *const u8, acts: &[Acts], nb: usize, y: *mut f32, y_stride: usize) {
    let m = acts.len() / nb;
    debug_assert!(m <= TILE);
    let mut sums = [0f32; TILE];
    let mut part = [[_mm256_setzero_si256(); 4]; TILE];
    let mut i = 0;
    while i + 4 <= nb {
        let x = x0.add(i * BLOCK);
        for l in 0..7 {
            prefetch(x.wrapping_add(PREFETCH_AHEAD + 64 * l));
        }
        let xb = [x, x.add(BLOCK), x.add(2 * BLOCK), x.add(3 * BLOCK)];
        for (b, &xbb) in xb.iter().enumerate() {
            let w = decode(xbb);
            for j in 0..m {
                part[j][b] = decoded_sums(&w, &acts[j * nb + i + b]);
            }
        }
        for j in 0..m {
            let p = &part[j];
            step4(&xb, &acts[j * nb + i..j * nb + i + 4], sum4(p[0], p[1], p[2], p[3]), &mut sums[j]);
        }
        i += 4;
    }
    for b in i..nb {
        let x = x0.add(b * BLOCK);
        let w = decode(x);
        for j in 0..m {
            let t = &acts[j * nb + b];
            sums[j] += f16_at(x.add(108)) * t.d * sum1(decoded_sums(&w, t)) as f32;
        }
    }
    for (j, s) in sums[..m].iter().enumerate() {
        *y.add(j * y_stride) = *s;
    }
}

/// One row at `x0` against the transposed activation row `acts`: four
/// blocks' sums reduce together (`vphaddd`) and their float steps run in
/// four lanes, then add to the sum in block order, the scalar reference's
/// (`sum += d·d_a·isum`), so the result equals it bit for bit.
#[inline(always)]
unsafe fn one_row(x0: *const u8, acts: &[Acts]) -> f32 {
    let mut sum = 0f32;
    let nb = acts.len();
    let mut i = 0;
    while i + 4 <= nb {
        let x = x0.add(i * BLOCK);
        // The row's stream, seven lines of four blocks (440 bytes).
        for l in 0..7 {
            prefetch(x.wrapping_add(PREFETCH_AHEAD + 64 * l));
        }
        let t = &acts[i..i + 4];
        let xb = [x, x.add(BLOCK), x.add(2 * BLOCK), x.add(3 * BLOCK)];
        let isum = sum4(
            block_sums(xb[0], &t[0]),
            block_sums(xb[1], &t[1]),
            block_sums(xb[2], &t[2]),
            block_sums(xb[3], &t[3]),
        );
        step4(&xb, t, isum, &mut sum);
        i += 4;
    }
    for (t, b) in acts[i..].iter().zip(i..) {
        let x = x0.add(b * BLOCK);
        prefetch(x.wrapping_add(PREFETCH_AHEAD));
        prefetch(x.wrapping_add(PREFETCH_AHEAD + 64));
        sum += f16_at(x.add(108)) * t.d * sum1(block_sums(x, t)) as f32;
    }
    sum
}

/// `acts` filled with the `nb` blocks of each of the `m` Q8_K rows at `a`,
/// `a_stride` bytes apart.
#[inline(always)]
unsafe fn fill(acts: &mut Vec<Acts>, a: *const u8, a_stride: usize, m: usize, nb: usize) {
    acts.clear();
    for i in 0..m * nb {
        acts.push(transpose_acts(a.add(i / nb * a_stride + i % nb * Q8K_BYTES)));
    }
}

/// `rows` Q3_K rows in transposed planes, `row_bytes` apart, × `m` Q8_K
/// activation rows (see [`crate::quant::Rows16Fn`]): `y[j·y_stride + r] =
/// row r · act j`, each equal to `quant::q3_k`'s dot of the file-layout row.
///
/// # Safety
/// AVX2/FMA/F16C CPU; `w` holds `rows` recoded rows of `n / 256` blocks
/// (`n` a multiple of 256); `a` holds `m` Q8_K rows `a_stride` bytes apart;
/// `y` valid for the writes.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn rows_q3_k(
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
    let nb = n / 256;
    // Taken out of its cell for the call: no closure around kernel code (a
    // closure does not get this function's target features).
    let mut acts = ACTS.with(|c| std::mem::take(&mut *c.borrow_mut()));
    fill(&mut acts, a, a_stride, m, nb);
    // Row by row, every activation row against it while it is in L1: the
    // weights stream from memory once whatever the batch. Batches decode
    // each block once for up to `TILE` activation rows.
    for r in 0..rows {
        let x = w.add(r * row_bytes);
        if m == 1 {
            *y.add(r) = one_row(x, &acts);
            continue;
        }
        let mut j = 0;
        while j < m {
            let take = (m - j).min(TILE);
            row_tile(x, &acts[j * nb..(j + take) * nb], nb, y.add(j * y_stride + r), y_stride);
            j += take;
        }
    }
    ACTS.with(|c| *c.borrow_mut() = acts);
}

/// Four Q3_K rows in transposed planes, `stride` bytes apart (see
/// [`crate::quant::Dot4Fn`]); each equals the scalar dot of its file-layout
/// row bit for bit.
///
/// # Safety
/// As for [`crate::quant::Dot4Fn`]; AVX2/FMA/F16C CPU.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn planes_dot4_q3_k(n: usize, w: *const u8, stride: usize, a: *const u8, out: *mut f32) {
    let mut acts = ACTS.with(|c| std::mem::take(&mut *c.borrow_mut()));
    fill(&mut acts, a, 0, 1, n / 256);
    for r in 0..4 {
        *out.add(r) = one_row(w.add(r * stride), &acts);
    }
    ACTS.with(|c| *c.borrow_mut() = acts);
}
