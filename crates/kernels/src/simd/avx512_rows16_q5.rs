//! AVX-512 VNNI sixteen-row kernels of Q5_0, Q5_1 and Q4_1 in the transposed
//! layout of [`crate::packed::lanes16`], the one the AVX2 kernels
//! ([`super::avx2_rows16_q5`]) read: lane `ℓ` of every vector is weight row
//! `ℓ`, one kernel for every batch size, equal to the scalar reference bit
//! for bit.
//!
//! Why: at AVX-512 Q5_0 and Q5_1 had no kernel of their own. Their weights
//! stayed in the file layout, decode ran the AVX2 one-row dot (a float step
//! per block and row, a horizontal sum per row) and batches below the GEMM's
//! ran it once per activation row; Q5_0 is most of a "Q4_K_M" file whose
//! width is no multiple of 256 (SmolLM2's 576, Qwen2.5-0.5B's 896). Q4_1
//! (the default model) ran [`super::avx512_rows16`], which reads the
//! four-row head/quants groups and transposes every block in registers (lane
//! shuffles, 4 × 4 dword unpacks): more shuffle work than arithmetic. Read
//! pre-transposed, a block of sixteen rows is four code vectors (and Q5's
//! one vector of sliced fifth bits) and the scales, and one `vpdpbusd` a
//! code vector and activation row does the products.
//!
//! Layout of one block of sixteen rows (as the AVX2 kernels'):
//! * Q5 only, vector 0: each row's `qh`, bit-sliced (byte `k` of a row's
//!   word holds, at bit `i`, the fifth bit of value `4i + k`);
//! * four vectors: codes `4v..4v+4` of every row (low nibbles values
//!   `4v + k`, high nibbles `16 + 4v + k`);
//! * the scales: Q5_0 sixteen f16 `d`; Q5_1 sixteen `(d, m)` words; Q4_1 the
//!   sixteen `d`, then the sixteen `m`.
//!
//! The fifth bit of code vector `v`'s bytes is `(qh << (4 − v)) & 0x10` (low
//! nibbles) or `(qh >> v) & 0x10` (high): one shift and one `vpternlogd` a
//! vector.
//!
//! Numerics: the integer sums are exact (5-bit unsigned codes against signed
//! activations in `vpdpbusd`; Q5_0's `−16` comes out as `16·Σy` once per
//! block and activation row) and the float steps are the scalar references'
//! (`quant::q5_0::vec_dot`: `sum + isum·(d·d_a)`; `quant::q5_1::vec_dot` and
//! `quant::q4_1::vec_dot`: `sum + (isum·(d·d_a) + m·s_a)`; no FMA, blocks in
//! order), so each row equals the reference, and the AVX2 kernels, at every
//! batch size.

use super::avx2_rows16_q5::{
    act_geometry, act_scales, block_bytes, codes_start, has_min, has_qh, scales_start, Q4_1, Q5_0, Q5_1,
};
use std::arch::x86_64::*;

/// Rows per group (the lanes).
const ROWS: usize = 16;
/// Activation rows per register tile (decoding each block as it goes).
const ACTS: usize = 4;
/// Activation rows per tile over decoded blocks (larger batches).
const TILE_ACTS: usize = 6;
/// How far ahead the group's stream is prefetched into L2 (as the other
/// sixteen-row kernels, whose streams are the same shape).
const PREFETCH_AHEAD: usize = 8192;

thread_local! {
    /// The current group's blocks, decoded once (batches above [`ACTS`]).
    static SCRATCH: std::cell::RefCell<Vec<Block>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Per activation block of the call (`m × nb`): `d` as f32, then Q5_0's
    /// `16·Σy` or the Q8_1 `s` as f32 bits.
    static ACT: std::cell::RefCell<(Vec<f32>, Vec<i32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// One block of sixteen rows, decoded: `q[v]` the 5-bit (Q4_1: 4-bit) codes
/// of values `4v..4v+4` (v < 4) and `16+4(v−4)..` (v ≥ 4), `d` the scales,
/// `m` (Q5_1, Q4_1) the offsets.
#[derive(Clone, Copy)]
struct Block {
    q: [__m512i; 8],
    d: __m512,
    m: __m512,
}

/// Block `b` of the group at `w`, decoded (its stream prefetched ahead).
#[inline(always)]
unsafe fn decode<const K: u8>(w: *const u8, b: usize) -> Block {
    let x = w.add(b * block_bytes(K));
    let ahead = x.wrapping_add(PREFETCH_AHEAD);
    for l in 0..block_bytes(K).div_ceil(64) {
        _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(64 * l) as *const i8);
    }
    let low4 = _mm512_set1_epi8(0x0F);
    let mut q = [_mm512_setzero_si512(); 8];
    for v in 0..4 {
        let c = _mm512_loadu_si512(x.add(codes_start(K) + 64 * v) as *const _);
        q[v] = _mm512_and_si512(c, low4);
        q[v + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(c), low4);
    }
    if has_qh(K) {
        let qh = _mm512_loadu_si512(x as *const _);
        let bit4 = _mm512_set1_epi8(0x10);
        // Bit `v` (low nibbles) and bit `4 + v` (high) of each byte to bit 4;
        // `a | (b & c)` is one `vpternlogd` (0xF8).
        let low_bits = [
            _mm512_slli_epi16::<4>(qh),
            _mm512_slli_epi16::<3>(qh),
            _mm512_slli_epi16::<2>(qh),
            _mm512_slli_epi16::<1>(qh),
        ];
        let high_bits = [qh, _mm512_srli_epi16::<1>(qh), _mm512_srli_epi16::<2>(qh), _mm512_srli_epi16::<3>(qh)];
        for v in 0..4 {
            q[v] = _mm512_ternarylogic_epi32::<0xF8>(q[v], low_bits[v], bit4);
            q[v + 4] = _mm512_ternarylogic_epi32::<0xF8>(q[v + 4], high_bits[v], bit4);
        }
    }
    let (d, m) = scales::<K>(x);
    Block { q, d, m }
}

/// `(d, m)` of the sixteen rows of the group's block at `x` (Q5_0: `m` zero).
#[inline(always)]
unsafe fn scales<const K: u8>(x: *const u8) -> (__m512, __m512) {
    let at = x.add(scales_start(K));
    let half = |p: *const u8| _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i));
    if K == Q4_1 {
        // Split: the sixteen d's, then the sixteen m's.
        (half(at), half(at.add(32)))
    } else if has_min(K) {
        // Sixteen `(d, m)` words: the low halves are d, the high ones m.
        let s = _mm512_loadu_si512(at as *const _);
        (_mm512_cvtph_ps(_mm512_cvtepi32_epi16(s)), _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(s))))
    } else {
        (half(at), _mm512_setzero_ps())
    }
}

macro_rules! entry {
    ($(#[$doc:meta])* $name:ident, $k:expr) => {
        $(#[$doc])*
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn $name(
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
            rows16::<{ $k }>(n, w, row_bytes, rows, a, a_stride, m, y, y_stride)
        }
    };
}

entry!(
    /// `rows` (a multiple of 16) Q5_0 rows in the sliced lanes16 layout × `m`
    /// Q8_0 activation rows (see [`crate::quant::Rows16Fn`]): `y[j·y_stride +
    /// r] = row r · act j`, each equal to `quant::q5_0::vec_dot`.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL/VNNI CPU; `w` holds `rows / 16` groups of `row_bytes`
    /// per row (`n` a multiple of 32); `a` holds `m` Q8_0 rows of `n` values
    /// `a_stride` bytes apart; `y` valid for the writes.
    rows16_q5_0,
    Q5_0
);
entry!(
    /// `rows` Q5_1 rows in the sliced lanes16 layout × `m` Q8_1 activation
    /// rows, each equal to `quant::q5_1::vec_dot` (as [`rows16_q5_0`]).
    ///
    /// # Safety
    /// As [`rows16_q5_0`], with Q8_1 activations.
    rows16_q5_1,
    Q5_1
);
entry!(
    /// `rows` Q4_1 rows in the lanes16 layout (no `qh`, the `d`s then the
    /// `m`s) × `m` Q8_1 activation rows, each equal to `quant::q4_1::vec_dot`
    /// (as [`rows16_q5_0`]).
    ///
    /// # Safety
    /// As [`rows16_q5_0`], with Q8_1 activations.
    rows16_q4_1,
    Q4_1
);

/// The body of the three kernels.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn rows16<const K: u8>(
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
    // The thread's buffers are taken out of their cells for the call: no
    // closure around the kernel code (it would not get the target features).
    let mut scratch = SCRATCH.with(|c| std::mem::take(&mut *c.borrow_mut()));
    let (mut act_d, mut act_x) = ACT.with(|c| std::mem::take(&mut *c.borrow_mut()));
    act_scales::<K>(a, a_stride, m, nb, &mut act_d, &mut act_x);
    for g in 0..rows / ROWS {
        let gw = w.add(g * ROWS * row_bytes);
        let yg = y.add(g * ROWS);
        if m <= ACTS {
            match m {
                1 => tile::<1, K>(nb, gw, None, a, a_stride, &act_d, &act_x, yg, y_stride),
                2 => tile::<2, K>(nb, gw, None, a, a_stride, &act_d, &act_x, yg, y_stride),
                3 => tile::<3, K>(nb, gw, None, a, a_stride, &act_d, &act_x, yg, y_stride),
                _ => tile::<ACTS, K>(nb, gw, None, a, a_stride, &act_d, &act_x, yg, y_stride),
            }
            continue;
        }
        scratch.clear();
        for b in 0..nb {
            scratch.push(decode::<K>(gw, b));
        }
        let mut j = 0;
        while j < m {
            let take = (m - j).min(TILE_ACTS);
            let (aj, yj) = (a.add(j * a_stride), yg.add(j * y_stride));
            let (dj, xj) = (&act_d[j * nb..], &act_x[j * nb..]);
            let s = Some(&scratch[..]);
            match take {
                1 => tile::<1, K>(nb, gw, s, aj, a_stride, dj, xj, yj, y_stride),
                2 => tile::<2, K>(nb, gw, s, aj, a_stride, dj, xj, yj, y_stride),
                3 => tile::<3, K>(nb, gw, s, aj, a_stride, dj, xj, yj, y_stride),
                4 => tile::<4, K>(nb, gw, s, aj, a_stride, dj, xj, yj, y_stride),
                5 => tile::<5, K>(nb, gw, s, aj, a_stride, dj, xj, yj, y_stride),
                _ => tile::<TILE_ACTS, K>(nb, gw, s, aj, a_stride, dj, xj, yj, y_stride),
            }
            j += take;
        }
    }
    SCRATCH.with(|c| *c.borrow_mut() = scratch);
    ACT.with(|c| *c.borrow_mut() = (act_d, act_x));
}

/// One group of sixteen rows at `gw` × `J` activation rows: each block
/// decoded as it goes, or read from `decoded` (the group's blocks decoded
/// once, larger batches). `act_d`/`act_x` start at the tile's first row.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const J: usize, const K: u8>(
    nb: usize,
    gw: *const u8,
    decoded: Option<&[Block]>,
    a: *const u8,
    a_stride: usize,
    act_d: &[f32],
    act_x: &[i32],
    y: *mut f32,
    y_stride: usize,
) {
    let (ab, codes_at) = act_geometry(K);
    let mut sums = [_mm512_setzero_ps(); J];
    for b in 0..nb {
        let blk = match decoded {
            Some(blocks) => *blocks.get_unchecked(b),
            None => decode::<K>(gw, b),
        };
        // Low and high halves of the block in separate chains.
        let mut lo = [_mm512_setzero_si512(); J];
        let mut hi = [_mm512_setzero_si512(); J];
        for v in 0..4 {
            for j in 0..J {
                let yq = a.add(j * a_stride + b * ab + codes_at + 4 * v);
                lo[j] = _mm512_dpbusd_epi32(lo[j], blk.q[v], bcast4(yq));
                hi[j] = _mm512_dpbusd_epi32(hi[j], blk.q[v + 4], bcast4(yq.add(16)));
            }
        }
        for j in 0..J {
            let at = j * nb + b;
            let da = _mm512_set1_ps(*act_d.get_unchecked(at));
            let x = *act_x.get_unchecked(at);
            let isum = _mm512_add_epi32(lo[j], hi[j]);
            let dd = _mm512_mul_ps(blk.d, da);
            let step = if has_min(K) {
                let ms = _mm512_mul_ps(blk.m, _mm512_set1_ps(f32::from_bits(x as u32)));
                _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(isum), dd), ms)
            } else {
                _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(isum, _mm512_set1_epi32(x))), dd)
            };
            sums[j] = _mm512_add_ps(sums[j], step);
        }
    }
    for (j, s) in sums.iter().enumerate() {
        _mm512_storeu_ps(y.add(j * y_stride), *s);
    }
}

/// Four activation bytes at `p` in every lane.
#[inline(always)]
unsafe fn bcast4(p: *const u8) -> __m512i {
    _mm512_set1_epi32((p as *const i32).read_unaligned())
}
