//! AVX-512 VNNI prefill over super-blocks decoded once: sixteen weight rows
//! in the lanes ([`DecodedBlock`]), every activation row of the batch in
//! tiles against each block while it sits in L1.
//!
//! Why: a streaming sixteen-row kernel looks each super-block's codes up
//! again for every tile of four activation rows (about 30 vector ops per
//! sub-block beside its 32 products), and the GEMM of
//! [`super::avx512_gemm_k`] (activation rows in the lanes) copies the
//! activations transposed and every weight row decoded per call, then loads
//! a code broadcast or an activation vector for most products (7 loads per
//! 12 `vpdpbusd`). Here a block's codes (unsigned, in the vector lanes: byte
//! `4v + i` of lane `ℓ` is row `ℓ`'s value `4v + i`), its per-lane sub-block
//! scales and the `bsums` pairs' factors are made once per batch, and a tile
//! of [`TILE`] activation rows is one load per eight `vpdpbusd` (each
//! against four activation bytes broadcast from memory) and one `vpmulld`
//! per sub-block and row. IQ4_XS, `HIDDEN=2048 FFN=5632 KV=256 LAYERS=22
//! VOCAB=0 WDTYPE=IQ4_XS PACKED=1 bench_matmul 2 256` on an AMD EPYC Zen 5
//! VM: the GEMM 520 tok/s, the streaming kernel 590, decoded once 700.
//!
//! IQ4_XS decodes into it straight from its lanes16 layout
//! ([`super::avx512_rows16_xs`]). IQ3_S through the GEMM's decoder (codes in
//! element order, sixteen rows transposed in registers) ran level with the
//! GEMM (580 against 560–585 tok/s, `bench_matmul 2 256`, Zen 5): its
//! gathered decode, once per batch and row, cost what the tiles saved.
//!
//! The result per super-block is the GEMM's and the scalar reference's: `d_a·d·(Σ_j sc_j·S_j − Σ_t c_t·B_t)` with `S_j` sub-block `j`'s
//! `Σ q·a` over the unsigned codes, `B_t` Q8_K's `bsums` pair `t` and `c_t`
//! the word pair that takes the codes' offset back out. Integer sums are
//! exact and the float step is `sum + (d·d_a)·isum` (no FMA, super-blocks in
//! order from `0.0`), so every output equals the reference bit for bit.

use super::avx512_rows16_k::{bcast4, scaled_add, Q8K_BSUMS, Q8K_QS};
use std::arch::x86_64::*;

/// Activation rows per tile over a decoded super-block: each holds two
/// accumulators (the sub-block's products and the block's integer sum).
/// Twelve ran 1.5% faster on IQ4_XS at m = 256, within the noise.
const TILE: usize = 8;

/// One super-block of sixteen rows, decoded: `q[v]` the unsigned codes of
/// values `4v..4v + 4` of each row (lane), `sc[j]` sub-block `j`'s scale per
/// lane (`NS` sub-blocks of `256 / NS` values), `c[t]` the word pair that
/// meets Q8_K's `bsums` pair `t`, `d` the rows' scales.
#[repr(C, align(64))]
pub(super) struct DecodedBlock {
    pub q: [__m512i; 64],
    pub sc: [__m512i; 16],
    pub c: [__m512i; 8],
    pub d: __m512,
}

impl DecodedBlock {
    pub fn zeroed() -> Box<DecodedBlock> {
        // SAFETY: all-zero bits are valid vectors.
        Box::new(unsafe { std::mem::zeroed() })
    }
}

/// Every activation row (`m`, Q8_K rows `a_stride` apart, `a` at this
/// block's first byte of row 0) against one decoded block: adds each of the
/// group's sixteen outputs `(d·d_a)·isum` to `y` (rows `y_stride` apart), or
/// starts them from `0.0` when `first`.
#[inline(always)]
pub(super) unsafe fn all_acts<const NS: usize>(
    blk: &DecodedBlock,
    first: bool,
    a: *const u8,
    a_stride: usize,
    m: usize,
    y: *mut f32,
    y_stride: usize,
) {
    let mut j = 0;
    while m - j >= TILE {
        tile::<NS, TILE>(blk, first, a.add(j * a_stride), a_stride, y.add(j * y_stride), y_stride);
        j += TILE;
    }
    // The rest: one tile each of 4, 2 and 1 as needed.
    for t in [4, 2, 1] {
        if m - j >= t {
            let (aj, yj) = (a.add(j * a_stride), y.add(j * y_stride));
            match t {
                4 => tile::<NS, 4>(blk, first, aj, a_stride, yj, y_stride),
                2 => tile::<NS, 2>(blk, first, aj, a_stride, yj, y_stride),
                _ => tile::<NS, 1>(blk, first, aj, a_stride, yj, y_stride),
            }
            j += t;
        }
    }
}

/// All sixteen rows of a group × `J` activation rows over one decoded block.
#[inline(always)]
unsafe fn tile<const NS: usize, const J: usize>(
    blk: &DecodedBlock,
    first: bool,
    a: *const u8,
    a_stride: usize,
    y: *mut f32,
    y_stride: usize,
) {
    let per = 64 / NS;
    let act: [*const u8; J] = std::array::from_fn(|j| a.add(j * a_stride));
    let mut sumi = [_mm512_setzero_si512(); J];
    for s in 0..NS {
        let mut part = [_mm512_setzero_si512(); J];
        for v in per * s..per * (s + 1) {
            let w = blk.q[v];
            for j in 0..J {
                part[j] = _mm512_dpbusd_epi32(part[j], w, bcast4(act[j].add(Q8K_QS + 4 * v)));
            }
        }
        for j in 0..J {
            sumi[j] = _mm512_add_epi32(sumi[j], _mm512_mullo_epi32(part[j], blk.sc[s]));
        }
    }
    for j in 0..J {
        let mut msum = _mm512_setzero_si512();
        for t in 0..8 {
            msum = _mm512_dpwssd_epi32(msum, blk.c[t], bcast4(act[j].add(Q8K_BSUMS + 4 * t)));
        }
        let yj = y.add(j * y_stride);
        let sum = if first { _mm512_setzero_ps() } else { _mm512_loadu_ps(yj) };
        _mm512_storeu_ps(yj, scaled_add(sum, blk.d, act[j], _mm512_sub_epi32(sumi[j], msum)));
    }
}
