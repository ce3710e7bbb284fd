//! AVX-512 VBMI + BITALG + GFNI four-row decode dots for IQ2_XXS, IQ2_XS and
//! IQ2_S against Q8_K: the grid looked up in registers, two rows to a vector, the
//! activations in the grid's order.
//!
//! Why: the one-row kernel ([`super::avx512_iq::dot_iq2_xxs`]) gathers each
//! super-block's 32 grid rows (eight values each) with four 8-lane quadword
//! gathers, ~14 ns a super-block-row here (4.6 GB/s of weights a core). An
//! IQ2_XXS grid value is one of three magnitudes (8, 25, 43), so its rank
//! fits two bits and two 256-byte tables hold the grid: `A[i]` the ranks of
//! values 0–3 of entry `i`, `B[i]` of values 4–7. A super-block has 32
//! entries, so one vector holds the entries of two rows (lanes `0..32` row
//! `r`, `32..64` row `r + 1`). For each pair of rows and super-block:
//! * one `vpermt2b` collects the two rows' 64 grid indices, one `vpermt2d`
//!   their 16 `aux` words (four 7-bit sign indices and a 4-bit scale each);
//! * each table's 64 lookups: two `vpermt2b` and one byte blend on index
//!   bit 7; per value position `j` one `vgf2p8affineqb` takes the two rank
//!   bits to the magnitude (`8`, `25`, `43` are an affine map of the rank
//!   bits over GF(2), below), giving `w_j` with byte `p` = value `j` of the
//!   entry at lane `p`;
//! * the sign bytes: one `vpmultishiftqb` spreads the 7-bit indices to bytes,
//!   `vpopcntb` adds the parity bit; `vptestmb` gives the mask of position
//!   `j`, which negates `y_j` (Q8_K codes are −127..127: no wrap);
//! * the activations in the grid's order once a super-block for all four
//!   rows: `y_j` lane `e` = activation `8e + j`, the same in both halves;
//! * eight `vpdpbusd` into one accumulator: lane `d` holds the four entries
//!   of one `aux` word (sub-block `d mod 8` of row `d / 8`), so one `vpmulld`
//!   by the `aux` words' `2s + 1` scales the block (a lane's sum is at most
//!   4·8·43·127 < 2¹⁸, times 31 < 2³¹).
//!
//! IQ2_XS the same way, with a 512-entry grid (four `vpermt2b` and three
//! blends a table; index bit 8 and the sign index from the words' high
//! bytes) and a scale per 16 values, as IQ2_S below. IQ2_S the same way,
//! with its differences: a 1024-entry grid (eight
//! `vpermt2b` and seven blends a table, index bits 8 and 9 from `qh` by two
//! `vpshufbitqmb`), sign bytes stored as they are, and a scale per 16 values
//! (two entries), so values `j` and `j + 1` meet in one `vpmaddubsw` word sum
//! (at most 2·2·43·127 < 2¹⁵) and one `vpdpwssd` by the group scales adds
//! it.
//!
//! Measured (in L2, 256 × 2048, Emerald Rapids): IQ2_XXS 7.7–8.4 ns a
//! super-block-row against the gathering one-row kernel's 13.2–14.3.
//!
//! Where the loader packs (VBMI, BITALG, GFNI), IQ2_XXS and IQ2_XS are
//! recoded at load ([`crate::packed::iq2_signs`]): the signs as the eight
//! masks (words, the eighth by parity), the indices one load, IQ2_XXS's
//! scales as nibbles rotated into place per lane; the `packed_` kernels read
//! that layout and equal the file-layout ones bit for bit.
//!
//! Numerics: the block's integer sum is exact and the float steps are the
//! scalar `vec_dot`'s (`d·d_a·isum` added block by block, `0.125·sum` last),
//! so each row equals the scalar dot bit for bit.

use super::avx2::{f16x4, rd16};
use super::avx2_lowk::q8k;
use super::avx2_rows::prefetch_block;
use super::avx512_iq3_vbmi::{look256_mem, vld};
use super::avx512_iq3s_vbmi::look512;
use super::avx512_lowk;
use super::avx512_rows16_k::PREFETCH_AHEAD;
use crate::packed::iq2_signs::{XS_MASKS, XXS_MASKS};
use crate::quant::iq_grids::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID};
use std::arch::x86_64::*;
use std::sync::OnceLock;

/// Bytes of an IQ2_XXS super-block: `d`, then per sub-block a quadword of
/// four grid indices and an `aux` word.
const BLOCK: usize = 66;

#[repr(C, align(64))]
struct Tables {
    /// Ranks (0, 1, 2 for 8, 25, 43) of values 0–3 of each grid entry, two
    /// bits each.
    a: [u8; 256],
    /// The same for values 4–7.
    b: [u8; 256],
    /// `vpermt2b` control: lane `p` = grid index `p mod 32` of row `p / 32`
    /// (byte `8(p / 4 mod 8) + p mod 4` of the block past `d`, the second
    /// source for `p ≥ 32`).
    idx: [u8; 64],
    /// `vpermb` control: output byte `8j + t` = input byte `8t + j`.
    by_j: [u8; 64],
    /// `vgf2p8affineqb` matrices: rank bits `2(j mod 4)`, `+1` to magnitude.
    rank_to_mag: [u64; 4],
}

/// The rank of an IQ2 grid magnitude (IQ2_XXS and IQ2_S share 8, 25, 43).
fn rank(v: u8) -> u8 {
    match v {
        8 => 0,
        25 => 1,
        43 => 2,
        _ => unreachable!("IQ2 grid value {v}"),
    }
}

/// A grid's two rank tables: `a[i]` the ranks of entry `i`'s values 0–3,
/// `b[i]` of values 4–7, two bits each.
fn rank_tables(grid: &[u64], a: &mut [u8], b: &mut [u8]) {
    for (i, g) in grid.iter().enumerate() {
        let r = g.to_le_bytes().map(rank);
        a[i] = r[0] | r[1] << 2 | r[2] << 4 | r[3] << 6;
        b[i] = r[4] | r[5] << 2 | r[6] << 4 | r[7] << 6;
    }
}

fn tables() -> &'static Tables {
    static T: OnceLock<Tables> = OnceLock::new();
    T.get_or_init(|| {
        let mut t = Tables { a: [0; 256], b: [0; 256], idx: [0; 64], by_j: [0; 64], rank_to_mag: [0; 4] };
        rank_tables(&IQ2XXS_GRID, &mut t.a, &mut t.b);
        for p in 0..64 {
            t.idx[p] = (8 * (p / 4 % 8) + p % 4 + 64 * (p / 32)) as u8;
        }
        for j in 0..8 {
            for tt in 0..8 {
                t.by_j[8 * j + tt] = (8 * tt + j) as u8;
            }
        }
        // Magnitude bits from rank bits r0 (lo) and r1 (hi), the constant 8
        // (bit 3) from the immediate: bit 0 = r0 ⊕ r1 (never both),
        // bit 1 = r1, bit 4 = r0, bit 5 = r1: 8, 25, 43 for ranks 0, 1, 2.
        // Output bit d is the parity of the input masked by byte 7 − d.
        for (j, m) in t.rank_to_mag.iter_mut().enumerate() {
            let (lo, hi) = (1u64 << (2 * j), 1u64 << (2 * j + 1));
            let row = |d: usize, bits: u64| bits << (8 * (7 - d));
            *m = row(0, lo | hi) | row(1, hi) | row(4, lo) | row(5, hi);
        }
        t
    })
}

#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn ld(p: *const u8) -> __m512i {
    _mm512_loadu_si512(p as *const _)
}

#[target_feature(enable = "avx")]
#[inline]
unsafe fn ld256(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

/// What every pair of rows shares.
struct Consts {
    t: &'static Tables,
    idx: __m512i,
    rank_to_mag: [__m512i; 4],
    /// `vpmultishiftqb` control: byte `k` of a quadword (two `aux` words)
    /// from bit `7k` (`k < 4`) or `32 + 7(k − 4)`.
    sign_fields: __m512i,
    /// Lane `d`: the rotation `4·(d mod 8) − 1` of a recoded IQ2_XXS scale
    /// word ([`pair_xxs_recoded`]).
    scale_shift: __m512i,
}

/// The 256 activations of a Q8_K block in the grid's order, each 32 bytes
/// twice: `y[j]` lane `e` (and `32 + e`) = activation `8e + j`.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline]
unsafe fn by_position(qs: *const u8, by_j: __m512i) -> [__m512i; 8] {
    // Quadword j of v[c]: value j of entries 8c..8c + 8.
    let v = [
        _mm512_permutexvar_epi8(by_j, ld(qs)),
        _mm512_permutexvar_epi8(by_j, ld(qs.add(64))),
        _mm512_permutexvar_epi8(by_j, ld(qs.add(128))),
        _mm512_permutexvar_epi8(by_j, ld(qs.add(192))),
    ];
    let lo = _mm512_setr_epi64(0, 8, 1, 9, 2, 10, 3, 11);
    let hi = _mm512_setr_epi64(4, 12, 5, 13, 6, 14, 7, 15);
    // p01[0] quadwords 2j, 2j + 1: v0.j, v1.j for j < 4; p01[1] for j ≥ 4.
    let p01 = [_mm512_permutex2var_epi64(v[0], lo, v[1]), _mm512_permutex2var_epi64(v[0], hi, v[1])];
    let p23 = [_mm512_permutex2var_epi64(v[2], lo, v[3]), _mm512_permutex2var_epi64(v[2], hi, v[3])];
    let c0 = _mm512_setr_epi64(0, 1, 8, 9, 0, 1, 8, 9);
    let c1 = _mm512_setr_epi64(2, 3, 10, 11, 2, 3, 10, 11);
    let c2 = _mm512_setr_epi64(4, 5, 12, 13, 4, 5, 12, 13);
    let c3 = _mm512_setr_epi64(6, 7, 14, 15, 6, 7, 14, 15);
    [
        _mm512_permutex2var_epi64(p01[0], c0, p23[0]),
        _mm512_permutex2var_epi64(p01[0], c1, p23[0]),
        _mm512_permutex2var_epi64(p01[0], c2, p23[0]),
        _mm512_permutex2var_epi64(p01[0], c3, p23[0]),
        _mm512_permutex2var_epi64(p01[1], c0, p23[1]),
        _mm512_permutex2var_epi64(p01[1], c1, p23[1]),
        _mm512_permutex2var_epi64(p01[1], c2, p23[1]),
        _mm512_permutex2var_epi64(p01[1], c3, p23[1]),
    ]
}

/// Two rows' blocks (`x0`, `x1`: their bytes past `d`) against `y`: lane
/// `d` = row `d / 8`'s exact `(2s + 1)·Σ code·q8` of sub-block `d mod 8`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,gfni")]
#[inline]
unsafe fn pair(x0: *const u8, x1: *const u8, y: &[__m512i; 8], k: &Consts) -> __m512i {
    let (v0, v1) = (ld(x0), ld(x1));
    let idx = _mm512_permutex2var_epi8(v0, k.idx, v1);
    let aux =
        _mm512_permutex2var_epi32(v0, _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31), v1);
    let k7 = _mm512_movepi8_mask(idx);
    let a = look256_mem(&k.t.a, idx, k7);
    let b = look256_mem(&k.t.b, idx, k7);
    let signs = ksign_bytes(_mm512_multishift_epi64_epi8(k.sign_fields, aux));
    // Two accumulators (values 0–3, 4–7): two chains of four `vpdpbusd`.
    let mut acc = [_mm512_setzero_si512(); 2];
    for j in 0..8 {
        let ranks = if j < 4 { a } else { b };
        let w = _mm512_gf2p8affine_epi64_epi8::<0x08>(ranks, k.rank_to_mag[j % 4]);
        let neg = _mm512_test_epi8_mask(signs, _mm512_set1_epi8(1 << j));
        let ys = _mm512_mask_sub_epi8(y[j], neg, _mm512_setzero_si512(), y[j]);
        acc[j / 4] = _mm512_dpbusd_epi32(acc[j / 4], w, ys);
    }
    let ls = _mm512_srli_epi32::<28>(aux);
    let ls = _mm512_or_si512(_mm512_add_epi32(ls, ls), _mm512_set1_epi32(1));
    _mm512_mullo_epi32(_mm512_add_epi32(acc[0], acc[1]), ls)
}

/// Four IQ2_XXS rows `stride` bytes apart × one Q8_K row; each equals the
/// scalar dot ([`crate::quant::iq2_xxs::vec_dot`]) bit for bit.
///
/// # Safety
/// As for [`crate::quant::Dot4Fn`]; needs AVX-512 F/BW/VL/VNNI, VBMI, BITALG
/// and GFNI.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c,gfni")]
pub unsafe fn dot4_iq2_xxs(n: usize, w: *const u8, stride: usize, a: *const u8, out: *mut f32) {
    dot4::<XXS, false>(n, w, stride, a, out)
}

super::prepared_rows::row_kernel!(
    /// The row kernel over [`dot4_iq2_xxs`]'s four-row groups, the activations
    /// put in the grid's order once a call ([`super::prepared_rows`]); each
    /// output equals [`dot4_iq2_xxs`]'s bit for bit.
    ///
    /// # Safety
    /// As for [`crate::quant::Rows16Fn`]; needs AVX-512 F/BW/VL/VNNI, VBMI, BITALG and GFNI.
    rows_iq2_xxs,
    prepare,
    group4::<XXS, false>
);

/// [`dot4_iq2_xxs`] over rows recoded at load ([`crate::packed::iq2_signs`];
/// rows `stride` bytes apart as in the file); equals it bit for bit.
///
/// # Safety
/// As for [`dot4_iq2_xxs`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c,gfni")]
pub unsafe fn packed_dot4_iq2_xxs(n: usize, w: *const u8, stride: usize, a: *const u8, out: *mut f32) {
    dot4::<XXS, true>(n, w, stride, a, out)
}

super::prepared_rows::row_kernel!(
    /// [`rows_iq2_xxs`] over rows recoded at load: the decode kernel.
    ///
    /// # Safety
    /// As for [`rows_iq2_xxs`].
    packed_rows_iq2_xxs,
    prepare,
    group4::<XXS, true>
);

/// Which IQ2 type [`dot4`] runs.
const XXS: u8 = 0;
const S: u8 = 1;
const XS: u8 = 2;

/// The four-row loop over super-blocks, two rows to a [`pair`] (or
/// [`pair_s`], [`pair_xs`]) and the float steps of the scalar dot.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c,gfni")]
#[inline]
unsafe fn dot4<const KIND: u8, const RECODED: bool>(
    n: usize,
    w: *const u8,
    stride: usize,
    a: *const u8,
    out: *mut f32,
) {
    run4::<KIND, false, RECODED>(n, w, stride, a, std::ptr::null(), out)
}

/// [`dot4`] over activations already in the grid's order ([`by_position`]
/// of each block at `pre`): the row kernel's four-row step. Not inlined, so
/// its registers are allocated as [`dot4`]'s are.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c,gfni")]
#[inline(never)]
unsafe fn group4<const KIND: u8, const RECODED: bool>(
    n: usize,
    w: *const u8,
    stride: usize,
    a: *const u8,
    pre: *const Prepared,
    out: *mut f32,
) {
    run4::<KIND, true, RECODED>(n, w, stride, a, pre, out)
}

/// One Q8_K block's activations in the grid's order ([`by_position`]).
type Prepared = [__m512i; 8];

/// One block's activations in the grid's order, for the row driver.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx2")]
unsafe fn prepare(qs: *const u8) -> Prepared {
    by_position(qs, ld(consts().t.by_j.as_ptr()))
}

/// The four-row loop: [`dot4`] (`PRE` false: the activations put in the
/// grid's order block by block) or [`group4`] (read from `pre`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c,gfni")]
#[inline]
unsafe fn run4<const KIND: u8, const PRE: bool, const RECODED: bool>(
    n: usize,
    w: *const u8,
    stride: usize,
    a: *const u8,
    pre: *const Prepared,
    out: *mut f32,
) {
    let bytes = match KIND {
        XXS => BLOCK,
        S => BLOCK_S,
        _ => BLOCK_XS,
    };
    let k = consts();
    let (ts, tx) = (tables_s(), tables_xs());
    let by_j = ld(k.t.by_j.as_ptr());
    let mut sum = _mm_setzero_ps();
    for i in 0..n / 256 {
        let yb = q8k(a, i);
        let y = if PRE { *pre.add(i) } else { by_position(yb.qs.as_ptr() as *const u8, by_j) };
        let x =
            [w.add(i * bytes), w.add(stride + i * bytes), w.add(2 * stride + i * bytes), w.add(3 * stride + i * bytes)];
        for x in x {
            prefetch_block(x, PREFETCH_AHEAD);
        }
        // Each row's bytes past `d`.
        let (x0, x1, x2, x3) = (x[0].add(2), x[1].add(2), x[2].add(2), x[3].add(2));
        let (p01, p23) = match (KIND, RECODED) {
            (XXS, false) => (pair(x0, x1, &y, &k), pair(x2, x3, &y, &k)),
            (XXS, true) => (pair_xxs_recoded(x0, x1, &y, &k), pair_xxs_recoded(x2, x3, &y, &k)),
            (S, _) => (pair_s(x0, x1, &y, &k, ts), pair_s(x2, x3, &y, &k, ts)),
            (_, false) => (pair_xs(x0, x1, &y, &k, tx), pair_xs(x2, x3, &y, &k, tx)),
            (_, true) => (pair_xs_recoded(x0, x1, &y, &k, tx), pair_xs_recoded(x2, x3, &y, &k, tx)),
        };
        sum = add_block(sum, p01, p23, x, yb.d);
    }
    _mm_storeu_ps(out, _mm_mul_ps(_mm_set1_ps(0.125), sum));
}

#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn consts() -> Consts {
    let t = tables();
    // (No closures around intrinsics: one would not inline.)
    let m = t.rank_to_mag.map(|v| v as i64);
    Consts {
        t,
        idx: ld(t.idx.as_ptr()),
        rank_to_mag: [
            _mm512_set1_epi64(m[0]),
            _mm512_set1_epi64(m[1]),
            _mm512_set1_epi64(m[2]),
            _mm512_set1_epi64(m[3]),
        ],
        sign_fields: _mm512_set1_epi64(i64::from_le_bytes([0, 7, 14, 21, 32, 39, 46, 53])),
        scale_shift: _mm512_setr_epi32(-1, 3, 7, 11, 15, 19, 23, 27, -1, 3, 7, 11, 15, 19, 23, 27),
    }
}

/// `sum + (d_r·d_a)·isum_r` per row `r` (the scalar expression, no fused
/// multiply-add), `isum` the lane sums of the two pairs' halves.
#[target_feature(enable = "avx512f,avx2,f16c")]
#[inline]
unsafe fn add_block(sum: __m128, p01: __m512i, p23: __m512i, x: [*const u8; 4], d_a: f32) -> __m128 {
    let isum = _mm_cvtepi32_ps(avx512_lowk::sum4(
        _mm512_castsi512_si256(p01),
        _mm512_extracti64x4_epi64::<1>(p01),
        _mm512_castsi512_si256(p23),
        _mm512_extracti64x4_epi64::<1>(p23),
    ));
    let xd =
        f16x4(rd16(x[0]) as u64 | (rd16(x[1]) as u64) << 16 | (rd16(x[2]) as u64) << 32 | (rd16(x[3]) as u64) << 48);
    _mm_add_ps(sum, _mm_mul_ps(_mm_mul_ps(xd, _mm_set1_ps(d_a)), isum))
}

// ---------------------------------------------------------------- IQ2_S

/// Bytes of an IQ2_S super-block: `d`, 32 index bytes, 32 sign bytes, `qh`
/// (two high index bits an entry), 16 four-bit scales.
const BLOCK_S: usize = 82;

/// IQ2_S's rank tables (1024 entries: [`Tables::a`], [`Tables::b`] as for
/// IQ2_XXS) and its `qh` bit controls.
#[repr(C, align(64))]
struct TablesS {
    a: [u8; 1024],
    b: [u8; 1024],
    /// `vpshufbitqmb` controls: lane `p` = bit `2(e mod 4) + 8(e / 4)` (and
    /// `+ 1`) of its row's `qh`, `e = p mod 32`: index bits 8 and 9.
    bit8: [u8; 64],
    bit9: [u8; 64],
}

fn tables_s() -> &'static TablesS {
    static T: OnceLock<TablesS> = OnceLock::new();
    T.get_or_init(|| {
        let mut t = TablesS { a: [0; 1024], b: [0; 1024], bit8: [0; 64], bit9: [0; 64] };
        rank_tables(&IQ2S_GRID, &mut t.a, &mut t.b);
        for p in 0..64 {
            let e = p % 32;
            t.bit8[p] = (8 * (e / 4) + 2 * (e % 4)) as u8;
            t.bit9[p] = t.bit8[p] + 1;
        }
        t
    })
}

/// 1024-entry lookup of 64 indices: bits 0–6 in the permutes, bit 7 (`k7`),
/// 8 (`k8`) and 9 (`k9`) through byte blends.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline]
unsafe fn look1024(t: &[u8; 1024], idx: __m512i, k7: u64, k8: u64, k9: u64) -> __m512i {
    let t = t.as_ptr();
    let p0 = _mm512_permutex2var_epi8(vld(t), idx, vld(t.add(64)));
    let p1 = _mm512_permutex2var_epi8(vld(t.add(128)), idx, vld(t.add(192)));
    let p2 = _mm512_permutex2var_epi8(vld(t.add(256)), idx, vld(t.add(320)));
    let p3 = _mm512_permutex2var_epi8(vld(t.add(384)), idx, vld(t.add(448)));
    let p4 = _mm512_permutex2var_epi8(vld(t.add(512)), idx, vld(t.add(576)));
    let p5 = _mm512_permutex2var_epi8(vld(t.add(640)), idx, vld(t.add(704)));
    let p6 = _mm512_permutex2var_epi8(vld(t.add(768)), idx, vld(t.add(832)));
    let p7 = _mm512_permutex2var_epi8(vld(t.add(896)), idx, vld(t.add(960)));
    let q0 = _mm512_mask_blend_epi8(k8, _mm512_mask_blend_epi8(k7, p0, p1), _mm512_mask_blend_epi8(k7, p2, p3));
    let q1 = _mm512_mask_blend_epi8(k8, _mm512_mask_blend_epi8(k7, p4, p5), _mm512_mask_blend_epi8(k7, p6, p7));
    _mm512_mask_blend_epi8(k9, q0, q1)
}

/// Two rows' IQ2_S blocks (`x0`, `x1`: their bytes past `d`) against `y`:
/// lane `d` = row `d / 8`'s exact `Σ (2s + 1)·Σ code·q8` over its values
/// `32(d mod 8)..+32` (two scale groups of 16).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,gfni,avx2")]
#[inline]
unsafe fn pair_s(x0: *const u8, x1: *const u8, y: &[__m512i; 8], k: &Consts, t: &TablesS) -> __m512i {
    let idx = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(ld256(x0)), ld256(x1));
    let signs = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(ld256(x0.add(32))), ld256(x1.add(32)));
    let qh = _mm512_inserti64x4::<1>(
        _mm512_set1_epi64((x0.add(64) as *const i64).read_unaligned()),
        _mm256_set1_epi64x((x1.add(64) as *const i64).read_unaligned()),
    );
    let k7 = _mm512_movepi8_mask(idx);
    let k8 = _mm512_bitshuffle_epi64_mask(qh, ld(t.bit8.as_ptr()));
    let k9 = _mm512_bitshuffle_epi64_mask(qh, ld(t.bit9.as_ptr()));
    let a = look1024(&t.a, idx, k7, k8, k9);
    let b = look1024(&t.b, idx, k7, k8, k9);
    sum16(a, b, sign_masks(signs), scale_words(x0.add(72), x1.add(72)), y, k)
}

/// Sign bytes from 7-bit `KSIGNS` indices (bit 7 of each byte ignored): the
/// index and its parity bit (`KSIGNS[i] = i | parity(i) << 7`).
#[target_feature(enable = "avx512f,avx512bw,avx512bitalg")]
#[inline]
unsafe fn ksign_bytes(idx: __m512i) -> __m512i {
    let low7 = _mm512_and_si512(idx, _mm512_set1_epi8(0x7F));
    let parity = _mm512_and_si512(_mm512_popcnt_epi8(low7), _mm512_set1_epi8(1));
    _mm512_or_si512(low7, _mm512_slli_epi16::<7>(parity))
}

/// The `2s + 1` of two rows' 16 four-bit scales (eight bytes at `s0`, `s1`;
/// group `g` in byte `g / 2`, high nibble for odd `g`) as words: word `w` =
/// row `w / 16`, group `w mod 16`, whose values are those of lanes `2w`,
/// `2w + 1`.
#[target_feature(enable = "avx512f,avx512bw,avx2")]
#[inline]
unsafe fn scale_words(s0: *const u8, s1: *const u8) -> __m512i {
    let sc = _mm_set_epi64x((s1 as *const i64).read_unaligned(), (s0 as *const i64).read_unaligned());
    let low = _mm_set1_epi8(0x0F);
    let (lo, hi) = (_mm_and_si128(sc, low), _mm_and_si128(_mm_srli_epi16::<4>(sc), low));
    let g = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
    _mm512_cvtepu8_epi16(_mm256_or_si256(_mm256_add_epi8(g, g), _mm256_set1_epi8(1)))
}

/// Mask `j` bit `p`: bit `j` of sign byte `p`.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn sign_masks(signs: __m512i) -> [u64; 8] {
    // (No closure: one would not inline, and lose the target features.)
    [
        _mm512_test_epi8_mask(signs, _mm512_set1_epi8(1)),
        _mm512_test_epi8_mask(signs, _mm512_set1_epi8(2)),
        _mm512_test_epi8_mask(signs, _mm512_set1_epi8(4)),
        _mm512_test_epi8_mask(signs, _mm512_set1_epi8(8)),
        _mm512_test_epi8_mask(signs, _mm512_set1_epi8(16)),
        _mm512_test_epi8_mask(signs, _mm512_set1_epi8(32)),
        _mm512_test_epi8_mask(signs, _mm512_set1_epi8(64)),
        _mm512_test_epi8_mask(signs, _mm512_set1_epi8(-128)),
    ]
}

/// Two rows' recoded sign masks ([`crate::packed::iq2_signs`], seven words
/// at `m0`, `m1`): mask `j` = row 0's word `j` in bits 0–31, row 1's above;
/// the eighth by parity.
#[inline(always)]
unsafe fn recoded_masks(m0: *const u8, m1: *const u8) -> [u64; 8] {
    let mut m = [0u64; 8];
    for j in 0..7 {
        let (a, b) = ((m0.add(4 * j) as *const u32).read_unaligned(), (m1.add(4 * j) as *const u32).read_unaligned());
        m[j] = u64::from(a) | u64::from(b) << 32;
        m[7] ^= m[j];
    }
    m
}

/// Two rows' 32 index bytes each (at `x0`, `x1`) as one vector.
#[target_feature(enable = "avx512f,avx2")]
#[inline]
unsafe fn two_rows(x0: *const u8, x1: *const u8) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(ld256(x0)), ld256(x1))
}

/// [`pair`] over two recoded IQ2_XXS blocks (bytes past `d`): the indices one
/// load, the masks words, and each row's eight scale nibbles one broadcast
/// rotated per lane (lane `d`: nibble `d mod 8` into bits 1–4, as IQ3_S's
/// `scaled` does).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,gfni,avx2")]
#[inline]
unsafe fn pair_xxs_recoded(x0: *const u8, x1: *const u8, y: &[__m512i; 8], k: &Consts) -> __m512i {
    let idx = two_rows(x0, x1);
    let k7 = _mm512_movepi8_mask(idx);
    let a = look256_mem(&k.t.a, idx, k7);
    let b = look256_mem(&k.t.b, idx, k7);
    let m = XXS_MASKS - 2;
    let neg = recoded_masks(x0.add(m), x1.add(m));
    let mut acc = [_mm512_setzero_si512(); 2];
    for j in 0..8 {
        let ranks = if j < 4 { a } else { b };
        let w = _mm512_gf2p8affine_epi64_epi8::<0x08>(ranks, k.rank_to_mag[j % 4]);
        let ys = _mm512_mask_sub_epi8(y[j], neg[j], _mm512_setzero_si512(), y[j]);
        acc[j / 4] = _mm512_dpbusd_epi32(acc[j / 4], w, ys);
    }
    let s = _mm512_inserti64x4::<1>(
        _mm512_set1_epi32((x0.add(60) as *const i32).read_unaligned()),
        _mm256_set1_epi32((x1.add(60) as *const i32).read_unaligned()),
    );
    let ls = _mm512_ternarylogic_epi32::<0xEA>(
        _mm512_rorv_epi32(s, k.scale_shift),
        _mm512_set1_epi32(30),
        _mm512_set1_epi32(1),
    );
    _mm512_mullo_epi32(_mm512_add_epi32(acc[0], acc[1]), ls)
}

/// [`pair_xs`] over two recoded IQ2_XS blocks (bytes past `d`): the index
/// bytes one load, their ninth bits and the sign masks words.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,gfni,avx2")]
#[inline]
unsafe fn pair_xs_recoded(x0: *const u8, x1: *const u8, y: &[__m512i; 8], k: &Consts, t: &TablesXs) -> __m512i {
    let idx = two_rows(x0, x1);
    let k7 = _mm512_movepi8_mask(idx);
    let k8 = u64::from((x0.add(32) as *const u32).read_unaligned())
        | u64::from((x1.add(32) as *const u32).read_unaligned()) << 32;
    let a = look512(&t.a, idx, k7, k8);
    let b = look512(&t.b, idx, k7, k8);
    let m = XS_MASKS - 2;
    sum16(a, b, recoded_masks(x0.add(m), x1.add(m)), scale_words(x0.add(64), x1.add(64)), y, k)
}

/// `Σ (2s + 1)·Σ code·q8` of two rows whose scales cover 16 values (IQ2_S,
/// IQ2_XS), from their rank bytes `a`, `b`, sign bytes and scale words:
/// values `j` and `j + 1` meet in one `vpmaddubsw` word sum (at most
/// 2·2·43·127 < 2¹⁵), one `vpdpwssd` by the scales adds it. Lane `d` = row
/// `d / 8`, values `32(d mod 8)..+32`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,gfni")]
#[inline]
unsafe fn sum16(a: __m512i, b: __m512i, neg: [u64; 8], ls: __m512i, y: &[__m512i; 8], k: &Consts) -> __m512i {
    let mut acc = _mm512_setzero_si512();
    for jj in 0..4 {
        let mut s = _mm512_setzero_si512();
        for j in [2 * jj, 2 * jj + 1] {
            let ranks = if j < 4 { a } else { b };
            let w = _mm512_gf2p8affine_epi64_epi8::<0x08>(ranks, k.rank_to_mag[j % 4]);
            let ys = _mm512_mask_sub_epi8(y[j], neg[j], _mm512_setzero_si512(), y[j]);
            s = _mm512_add_epi16(s, _mm512_maddubs_epi16(w, ys));
        }
        acc = _mm512_dpwssd_epi32(acc, s, ls);
    }
    acc
}

/// Four IQ2_S rows `stride` bytes apart × one Q8_K row; each equals the
/// scalar dot ([`crate::quant::iq2_s::vec_dot`]) bit for bit.
///
/// # Safety
/// As for [`crate::quant::Dot4Fn`]; needs AVX-512 F/BW/VL/VNNI, VBMI, BITALG
/// and GFNI.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c,gfni")]
pub unsafe fn dot4_iq2_s(n: usize, w: *const u8, stride: usize, a: *const u8, out: *mut f32) {
    dot4::<S, false>(n, w, stride, a, out)
}

super::prepared_rows::row_kernel!(
    /// The row kernel over [`dot4_iq2_s`]'s four-row groups (see [`rows_iq2_xxs`]).
    ///
    /// # Safety
    /// As for [`crate::quant::Rows16Fn`]; needs AVX-512 F/BW/VL/VNNI, VBMI, BITALG and GFNI.
    rows_iq2_s,
    prepare,
    group4::<S, false>
);

// ---------------------------------------------------------------- IQ2_XS

/// Bytes of an IQ2_XS super-block: `d`, 32 words (a 9-bit grid index and a
/// 7-bit `KSIGNS` index each), 16 four-bit scales.
const BLOCK_XS: usize = 74;

/// IQ2_XS's rank tables (512 entries) and the byte controls that split two
/// rows' words into low bytes and high bytes.
#[repr(C, align(64))]
struct TablesXs {
    a: [u8; 512],
    b: [u8; 512],
    /// `vpermt2b` controls: lane `p` = the low (high) byte of word `p mod 32`
    /// of row `p / 32`.
    low: [u8; 64],
    high: [u8; 64],
}

fn tables_xs() -> &'static TablesXs {
    static T: OnceLock<TablesXs> = OnceLock::new();
    T.get_or_init(|| {
        let mut t = TablesXs { a: [0; 512], b: [0; 512], low: [0; 64], high: [0; 64] };
        rank_tables(&IQ2XS_GRID, &mut t.a, &mut t.b);
        for p in 0..64 {
            t.low[p] = (2 * (p % 32) + 64 * (p / 32)) as u8;
            t.high[p] = t.low[p] + 1;
        }
        t
    })
}

/// Two rows' IQ2_XS blocks (`x0`, `x1`: their bytes past `d`) against `y`,
/// lanes as [`pair_s`]'s.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,gfni,avx2")]
#[inline]
unsafe fn pair_xs(x0: *const u8, x1: *const u8, y: &[__m512i; 8], k: &Consts, t: &TablesXs) -> __m512i {
    let (v0, v1) = (ld(x0), ld(x1));
    let idx = _mm512_permutex2var_epi8(v0, ld(t.low.as_ptr()), v1);
    let high = _mm512_permutex2var_epi8(v0, ld(t.high.as_ptr()), v1);
    let k7 = _mm512_movepi8_mask(idx);
    let k8 = _mm512_test_epi8_mask(high, _mm512_set1_epi8(1));
    let a = look512(&t.a, idx, k7, k8);
    let b = look512(&t.b, idx, k7, k8);
    // The sign index is the high byte's bits 1–7 (a 16-bit shift brings in
    // the next byte's bit 0 at bit 7, which `ksign_bytes` ignores).
    let signs = ksign_bytes(_mm512_srli_epi16::<1>(high));
    sum16(a, b, sign_masks(signs), scale_words(x0.add(64), x1.add(64)), y, k)
}

/// Four IQ2_XS rows `stride` bytes apart × one Q8_K row; each equals the
/// scalar dot ([`crate::quant::iq2_xs::vec_dot`]) bit for bit.
///
/// # Safety
/// As for [`crate::quant::Dot4Fn`]; needs AVX-512 F/BW/VL/VNNI, VBMI, BITALG
/// and GFNI.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c,gfni")]
pub unsafe fn dot4_iq2_xs(n: usize, w: *const u8, stride: usize, a: *const u8, out: *mut f32) {
    dot4::<XS, false>(n, w, stride, a, out)
}

super::prepared_rows::row_kernel!(
    /// The row kernel over [`dot4_iq2_xs`]'s four-row groups (see [`rows_iq2_xxs`]).
    ///
    /// # Safety
    /// As for [`crate::quant::Rows16Fn`]; needs AVX-512 F/BW/VL/VNNI, VBMI, BITALG and GFNI.
    rows_iq2_xs,
    prepare,
    group4::<XS, false>
);

/// [`dot4_iq2_xs`] over rows recoded at load ([`crate::packed::iq2_signs`]);
/// equals it bit for bit.
///
/// # Safety
/// As for [`dot4_iq2_xs`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c,gfni")]
pub unsafe fn packed_dot4_iq2_xs(n: usize, w: *const u8, stride: usize, a: *const u8, out: *mut f32) {
    dot4::<XS, true>(n, w, stride, a, out)
}

super::prepared_rows::row_kernel!(
    /// [`rows_iq2_xs`] over rows recoded at load: the decode kernel.
    ///
    /// # Safety
    /// As for [`rows_iq2_xs`].
    packed_rows_iq2_xs,
    prepare,
    group4::<XS, true>
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{self, q8_k};

    /// Each row equals the scalar dot bit for bit on random blocks (every
    /// grid index, sign and scale), where the CPU has what the kernels need.
    #[test]
    fn vbmi_iq2_dot4_equals_scalar() {
        if !(super::super::avx512_iq3s_vbmi::has_vbmi_bitalg() && is_x86_feature_detected!("avx512vnni")) {
            eprintln!("skipped: no AVX-512 VBMI/BITALG/GFNI/VNNI here");
            return;
        }
        let mut rng = super::super::XorShift(0x2545_F491_4F6C_DD1D);
        let kernels: [(crate::DType, usize, quant::Dot4Fn, quant::Rows16Fn); 3] = [
            (crate::DType::IQ2_XXS, BLOCK, dot4_iq2_xxs, rows_iq2_xxs),
            (crate::DType::IQ2_S, BLOCK_S, dot4_iq2_s, rows_iq2_s),
            (crate::DType::IQ2_XS, BLOCK_XS, dot4_iq2_xs, rows_iq2_xs),
        ];
        for (dtype, bytes, dot4, rows) in kernels {
            let scalar = quant::scalar::dot_fn(dtype);
            for nb in [1usize, 3, 8] {
                let (n, row) = (256 * nb, bytes * nb);
                let mut w = Vec::with_capacity(4 * row);
                for _ in 0..4 * row {
                    w.push(rng.next() as u8);
                }
                for b in 0..4 * nb {
                    // A finite scale: f16 0.0–1.0.
                    let d = (rng.next() % 0x3C00) as u16;
                    w[b * bytes..b * bytes + 2].copy_from_slice(&d.to_le_bytes());
                }
                let x: Vec<f32> = (0..n).map(|i| ((i * 7919 + nb) % 2001) as f32 / 1000.0 - 1.0).collect();
                let mut a = vec![<q8_k::BlockQ8K as bytemuck::Zeroable>::zeroed(); nb];
                q8_k::quantize(&x, &mut a);
                let ap = bytemuck::cast_slice::<_, u8>(&a).as_ptr();
                let mut four = [0f32; 4];
                unsafe { dot4(n, w.as_ptr(), row, ap, four.as_mut_ptr()) };
                for (r, got) in four.iter().enumerate() {
                    let want = unsafe { scalar(n, w[r * row..].as_ptr(), ap) };
                    assert_eq!(got.to_bits(), want.to_bits(), "{dtype} row {r}, {nb} blocks: {got} vs {want}");
                }
                // The row kernel: the same bits, the activations prepared once.
                let mut by_rows = [f32::NAN; 4];
                unsafe { rows(n, w.as_ptr(), row, 4, ap, 0, 1, by_rows.as_mut_ptr(), 4) };
                assert_eq!(by_rows.map(f32::to_bits), four.map(f32::to_bits), "{dtype} row kernel, {nb} blocks");
                // Recoded at load (IQ2_XXS, IQ2_XS): the same bits.
                let packed: Option<(quant::Dot4Fn, quant::Rows16Fn)> = match dtype {
                    crate::DType::IQ2_XXS => Some((packed_dot4_iq2_xxs, packed_rows_iq2_xxs)),
                    crate::DType::IQ2_XS => Some((packed_dot4_iq2_xs, packed_rows_iq2_xs)),
                    _ => None,
                };
                if let Some((pdot4, prows)) = packed {
                    let pw = crate::packed::pack(dtype, 4, n, &w);
                    let (mut p4, mut pr) = ([0f32; 4], [f32::NAN; 4]);
                    unsafe {
                        pdot4(n, pw.as_ptr(), row, ap, p4.as_mut_ptr());
                        prows(n, pw.as_ptr(), row, 4, ap, 0, 1, pr.as_mut_ptr(), 4);
                    }
                    assert_eq!(p4.map(f32::to_bits), four.map(f32::to_bits), "{dtype} recoded four-row, {nb} blocks");
                    assert_eq!(pr.map(f32::to_bits), four.map(f32::to_bits), "{dtype} recoded rows, {nb} blocks");
                }
            }
        }
    }
}
