//! AVX-512 VBMI + GFNI one-row decode dot for IQ3_XXS against Q8_K: the grid
//! looked up in registers instead of inserted entry by entry.
//!
//! Why: IQ3_XXS spends its decode time looking codes up. Its AVX2 kernel
//! (like llama.cpp's) inserts grid entries one by one and decoded a 1.1B
//! model at 2.7 GB/s of weights a core; a 16-entry `vpgatherdd` measured
//! level with that. A grid entry is four magnitudes, each one of 8 values
//! (`XXS_VALUES`), so two nibble tables say all four: `A[i] = r0 | r1 << 4`,
//! `B[i] = r2 | r3 << 4` with `r` a magnitude's rank (bit 3 set for the last,
//! see below), 256 bytes each, four `zmm` registers. For one super-block
//! (64 groups of four values):
//! * `vpermt2b` looks the 64 indices up in 128 table bytes at a time, index
//!   bit 7 (`vpmovb2m`) picks between the two halves with a byte blend:
//!   2 permutes + 1 blend a table;
//! * for each 64 values, one `vpermb` brings each pair of groups' `A`, `B`
//!   bytes into the words of a quadword (from one of two `vshufi64x2`
//!   halves); a 16-bit shift by 4 and an `or` put each nibble in its own
//!   byte, in element order; one `vgf2p8affineqb` maps rank to magnitude
//!   (`8r + 4`, and 62 for the last: an affine map over GF(2) once bit 3
//!   marks it), so only the permutes use port 5;
//! * the signs (7-bit even-parity indices, 32 a block) expand to a 256-bit
//!   mask in element order, which negates the activations (Q8_K codes are
//!   −127..127, so a negation never wraps);
//! * one `vpdpbusd` per 64 values, and the sub-block scale `2s + 1` added with
//!   one `vpdpwssd` against `(2s + 1, 0)` word pairs: a lane's sum of four
//!   products is at most 4·62·127 < 2¹⁵ in magnitude, so its low word is the
//!   whole signed sum.
//!
//! Measured (one row at a time over 512 × 2048 weights in L2, Emerald
//! Rapids): 56 cycles a super-block against the AVX2 kernel's 103. The same
//! scheme for IQ3_S (512 entries: 4 permutes + 3 blends a table) ran at 57
//! cycles against its gather kernel's 54 ([`super::avx512_iq`]), so IQ3_S
//! keeps the gathers: `vpermt2b` issues one every two cycles on this CPU, and
//! the sign masks, dots, scales and the block's reduction alone take ~27.
//!
//! Numerics: the block's integer sum is exact and the float steps are the
//! scalar `vec_dot`'s, so the kernel equals scalar bit for bit.

use super::avx2::rd16;
use super::avx2_lowk::{blk, finish, q8k};
use super::avx2_rows::prefetch_block;
use super::avx512_iq::{chunk, ksigns_vec};
use super::avx512_iq3s_vbmi::by_position;
use super::avx512_rows16_k::PREFETCH_AHEAD;
use super::avx512_rows16_q3k::bit_moves;
use crate::packed::xxs_signs;
use crate::quant::iq3_xxs;
use crate::quant::iq_grids::IQ3XXS_GRID;
use std::arch::x86_64::*;
use std::sync::OnceLock;

/// The IQ3_XXS grid's eight magnitudes, in the order of their 3-bit ranks.
const XXS_VALUES: [u8; 8] = [4, 12, 20, 28, 36, 44, 52, 62];

/// The two nibble tables (see the module doc), 64-byte aligned so each
/// register's worth loads in one go.
#[repr(C, align(64))]
struct Tables {
    a: [u8; 256],
    b: [u8; 256],
    /// [`super::avx512_iq3s_vbmi::by_position`]'s control for the grid's
    /// order: output byte `16j + t` = input byte `4t + j`.
    by_j: [u8; 64],
    /// `vpshufbitqmb` controls: byte `i` of `sign_ctl[j]` = `4(i mod 8) + j`.
    sign_ctl: [[u8; 64]; 4],
}

fn tables() -> &'static Tables {
    static T: OnceLock<Tables> = OnceLock::new();
    T.get_or_init(|| {
        let mut t = Tables { a: [0; 256], b: [0; 256], by_j: [0; 64], sign_ctl: [[0; 64]; 4] };
        // The rank `r` of a magnitude in `XXS_VALUES`, with bit 3 set for the
        // last (62, not 8·7 + 4: see `rank_to_mag`).
        let rank = |v: u8| {
            let r = XXS_VALUES.iter().position(|&x| x == v).expect("IQ3_XXS grid value in its list") as u8;
            r | u8::from(r == 7) << 3
        };
        for (i, g) in IQ3XXS_GRID.iter().enumerate() {
            let m = g.to_le_bytes().map(rank);
            t.a[i] = m[0] | m[1] << 4;
            t.b[i] = m[2] | m[3] << 4;
        }
        for j in 0..4 {
            for tt in 0..16 {
                t.by_j[16 * j + tt] = (4 * tt + j) as u8;
            }
            for i in 0..64 {
                t.sign_ctl[j][i] = (4 * (i % 8) + j) as u8;
            }
        }
        t
    })
}

#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn ld(p: *const u8) -> __m512i {
    _mm512_loadu_si512(p as *const _)
}

/// The `vpermb` controls that put groups `g = 16j + 2q` and `g + 1`'s `A`,
/// `B` bytes at the even bytes 0, 2, 4, 6 of quadword `q`, for `j` even
/// (`[0]`) and odd (`[1]`), reading the vector [`halves`] made of `A`, `B`
/// bytes `32(j / 2)..+32` (`A`'s at bytes 0–31, `B`'s at 32–63). The odd
/// bytes are zeroed by the permute's mask.
fn pair_controls() -> &'static [[u8; 64]; 2] {
    static C: OnceLock<[[u8; 64]; 2]> = OnceLock::new();
    C.get_or_init(|| {
        let mut c = [[0u8; 64]; 2];
        for (j, cj) in c.iter_mut().enumerate() {
            for q in 0..8 {
                let g = (16 * j + 2 * q) as u8;
                cj[8 * q..8 * q + 8].copy_from_slice(&[g, 0, 32 + g, 0, g + 1, 0, 33 + g, 0]);
            }
        }
        c
    })
}

/// `[A 0..32, B 0..32]` and `[A 32..64, B 32..64]`.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn halves(a: __m512i, b: __m512i) -> [__m512i; 2] {
    [_mm512_shuffle_i64x2::<0x44>(a, b), _mm512_shuffle_i64x2::<0xEE>(a, b)]
}

/// One super-block's four 64-value vectors from its lookups `a`, `b`, each
/// as a pair `(w, w << 4)` of 16-bit words `w = A` or `B` byte: in `w | w << 4`
/// byte `2k`'s low nibble is the byte's low nibble and byte `2k + 1`'s the
/// high one, so its low nibbles are the ranks in element order. A shift and
/// an `or` instead of `vpmultishiftqb` keep this step off port 5, which the
/// permutes already fill.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline]
unsafe fn spread(a: __m512i, b: __m512i, ctl: &[__m512i; 2]) -> [(__m512i, __m512i); 4] {
    let ab = halves(a, b);
    let mut out = [(_mm512_setzero_si512(), _mm512_setzero_si512()); 4];
    for (j, o) in out.iter_mut().enumerate() {
        let w = _mm512_maskz_permutexvar_epi8(0x5555_5555_5555_5555, ctl[j % 2], ab[j / 2]);
        *o = (w, _mm512_slli_epi16::<4>(w));
    }
    out
}

/// The scale word pairs of chunk `h` (64 values): `(ls[2h], 0)` on lanes
/// 0–7, `(ls[2h + 1], 0)` on lanes 8–15, from the block's eight `2s + 1`.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn scale_pairs(ls: __m256i, h: usize) -> __m512i {
    let k = 2 * h as i32;
    let ctl = _mm512_inserti64x4::<1>(_mm512_set1_epi32(k), _mm256_set1_epi32(k + 1));
    _mm512_permutexvar_epi32(ctl, _mm512_castsi256_si512(ls))
}

/// `N` registers of table bytes from `p`.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn regs<const N: usize>(p: *const u8) -> [__m512i; N] {
    let mut r = [_mm512_setzero_si512(); N];
    for (k, v) in r.iter_mut().enumerate() {
        *v = ld(p.add(64 * k));
    }
    r
}

/// 256-entry lookup: index bits 0–6 in the permutes, bit 7 (`k7`) through a blend.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline]
unsafe fn look256(tab: &[__m512i; 4], idx: __m512i, k7: u64) -> __m512i {
    let p0 = _mm512_permutex2var_epi8(tab[0], idx, tab[1]);
    let p1 = _mm512_permutex2var_epi8(tab[2], idx, tab[3]);
    _mm512_mask_blend_epi8(k7, p0, p1)
}

/// [`look256`] with the table read from memory at each lookup: the permute
/// overwrites its first table operand, so tables held in registers cost a
/// copy a lookup (and, with four rows in flight, spills).
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline]
pub(super) unsafe fn look256_mem(tab: &[u8; 256], idx: __m512i, k7: u64) -> __m512i {
    // Lanes with bit 7 clear take entries 0..128, then the others 128..256
    // from the same register: merge masking keeps their indices until then.
    // (Two `vpermt2b` and a byte blend ran 8% slower in the IQ3_S kernel.)
    let t = tab.as_ptr();
    let lo = _mm512_mask2_permutex2var_epi8(vld(t), idx, !k7, vld(t.add(64)));
    _mm512_mask2_permutex2var_epi8(vld(t.add(128)), lo, k7, vld(t.add(192)))
}

/// A volatile 64-byte load: kept in the loop, never hoisted to a register.
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn vld(p: *const u8) -> __m512i {
    std::ptr::read_volatile(p as *const __m512i)
}

/// The 256 sign bits of an IQ3_XXS block in element order, from its eight
/// `aux` words (four 7-bit [`crate::quant::iq_grids::KSIGNS`] indices each,
/// bits 0..28).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2")]
#[inline]
unsafe fn xxs_signs(aux: *const u8) -> [u64; 4] {
    std::mem::transmute::<__m256i, [u64; 4]>(xxs_sign_bits(aux))
}

/// As [`xxs_signs`], in a vector.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2")]
#[inline]
unsafe fn xxs_sign_bits(aux: *const u8) -> __m256i {
    // Quadword q holds words 2q, 2q + 1: their indices at bits 0, 7, 14, 21
    // and 32 + those; byte k of the result is the k-th index of 8 values.
    let fields = _mm256_multishift_epi64_epi8(
        _mm256_set1_epi64x(i64::from_le_bytes([0, 7, 14, 21, 32, 39, 46, 53])),
        _mm256_loadu_si256(aux as *const __m256i),
    );
    ksigns_vec(fields)
}

/// # Safety
/// As for [`crate::quant::DotFn`]; needs AVX-512 F/BW/VL/VNNI VBMI and GFNI.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c,gfni")]
pub unsafe fn dot_iq3_xxs(n: usize, w: *const u8, a: *const u8) -> f32 {
    let t = tables();
    let ta = regs::<4>(t.a.as_ptr());
    let tb = regs::<4>(t.b.as_ptr());
    let ctl = regs::<2>(pair_controls().as_ptr() as *const u8);
    // Rank nibble `r | [r = 7] << 3` to magnitude `8r + 4 + 2·[r = 7]`, an
    // affine map over GF(2) (the high nibble ignored).
    let rank_to_mag = _mm512_set1_epi64(bit_moves([None, Some(3), None, Some(0), Some(1), Some(2), None, None]));
    let mut sum = 0f32;
    for i in 0..n / 256 {
        let x: &iq3_xxs::BlockIq3Xxs = blk(w.add(i * 98));
        prefetch_block(w.add(i * 98), PREFETCH_AHEAD);
        let y = q8k(a, i);
        let idx = ld(x.qs.as_ptr());
        let k7 = _mm512_movepi8_mask(idx);
        let mags = spread(look256(&ta, idx, k7), look256(&tb, idx, k7), &ctl);
        let neg = xxs_signs(x.qs.as_ptr().add(64));
        // 2s + 1 from each aux word's top four bits.
        let s = _mm256_srli_epi32::<28>(_mm256_loadu_si256(x.qs.as_ptr().add(64) as *const __m256i));
        let ls = _mm256_or_si256(_mm256_add_epi32(s, s), _mm256_set1_epi32(1));
        let mut acc = _mm512_setzero_si512();
        for (h, (w, w4)) in mags.into_iter().enumerate() {
            let mag = _mm512_gf2p8affine_epi64_epi8::<4>(_mm512_or_si512(w, w4), rank_to_mag);
            acc = chunk(acc, mag, neg[h], y.qs.as_ptr().add(64 * h), scale_pairs(ls, h));
        }
        sum += x.d.to_f32() * y.d * _mm512_reduce_add_epi32(acc) as f32;
    }
    finish(sum, 0.25)
}

/// One IQ3_XXS block against activations in the grid's order (`y_j` byte `i`
/// = activation `4i + j`, [`super::avx512_iq3s_vbmi::by_position`] with
/// `by_j`): the
/// exact `Σ_g (2s_g + 1)·Σ code·q8` over 16 lanes. As IQ3_S's
/// ([`super::avx512_iq3s_vbmi`]), nothing goes back to element order: `w_j`
/// byte `i` is entry `i`'s magnitude `j` (the rank-to-magnitude map reads a
/// byte's low nibble only, so the high one needs a shift and no mask), the
/// sign masks come from the sign bits by `vpshufbitqmb`, and lane `d` of the
/// four `vpdpbusd` holds values `16d..16d + 16`, all of sub-block `d / 2`.
/// (IQ3_S's sign order, which makes its masks by one transpose and one
/// permute, ran 4% slower here: without a ninth index bit to pick, putting
/// the indices in that order costs more than the masks save.)
/// A lane's sum can reach 16·62·127 (over 2¹⁵), so the scale goes in with
/// one `vpmulld` (|sum·31| < 2³¹) instead of `vpdpwssd`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,gfni")]
#[inline]
unsafe fn block_by_position(x: *const u8, y: [__m512i; 4], k: &Dot4Consts) -> __m512i {
    let w = magnitudes(x, k);
    // Quadword L: the sign bits of values 32L..32L + 32.
    let signs = _mm512_cvtepu32_epi64(xxs_sign_bits(x.add(66)));
    let mut acc = _mm512_setzero_si512();
    for (j, (w, y)) in w.into_iter().zip(y).enumerate() {
        let neg = _mm512_bitshuffle_epi64_mask(signs, k.sign_ctl[j]);
        acc = _mm512_dpbusd_epi32(acc, w, _mm512_mask_sub_epi8(y, neg, _mm512_setzero_si512(), y));
    }
    // 2s + 1 of each aux word's top four bits, sub-block d / 2 on lane d.
    let s = _mm256_srli_epi32::<28>(_mm256_loadu_si256(x.add(66) as *const __m256i));
    let ls = _mm256_or_si256(_mm256_add_epi32(s, s), _mm256_set1_epi32(1));
    _mm512_mullo_epi32(acc, _mm512_permutexvar_epi32(k.pair_lanes, _mm512_castsi256_si512(ls)))
}

/// The four magnitude vectors of a block's 64 grid entries (`w_j` byte `i` =
/// magnitude `j` of entry `i`; the indices at `x + 2` in both layouts).
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,gfni")]
#[inline]
unsafe fn magnitudes(x: *const u8, k: &Dot4Consts) -> [__m512i; 4] {
    let idx = ld(x.add(2));
    let k7 = _mm512_movepi8_mask(idx);
    let a = look256_mem(&k.t.a, idx, k7);
    let b = look256_mem(&k.t.b, idx, k7);
    [
        _mm512_gf2p8affine_epi64_epi8::<4>(a, k.rank_to_mag),
        _mm512_gf2p8affine_epi64_epi8::<4>(_mm512_srli_epi16::<4>(a), k.rank_to_mag),
        _mm512_gf2p8affine_epi64_epi8::<4>(b, k.rank_to_mag),
        _mm512_gf2p8affine_epi64_epi8::<4>(_mm512_srli_epi16::<4>(b), k.rank_to_mag),
    ]
}

/// [`block_by_position`] for a block recoded at load
/// ([`crate::packed::xxs_signs`]): three sign masks are loads, the fourth
/// follows from the parity rule in a few scalar steps, and the eight scales
/// are one broadcast word (lane `d`'s nibble `d / 2` rotated into bits 1–4,
/// as IQ3_S's `scaled` does) instead of a shift per word and a permute.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,gfni,bmi2")]
#[inline]
unsafe fn block_recoded(x: *const u8, y: [__m512i; 4], k: &Dot4Consts) -> __m512i {
    let w = magnitudes(x, k);
    let m = x.add(66) as *const u64;
    let (m0, m1, m2) = (m.read_unaligned(), m.add(1).read_unaligned(), m.add(2).read_unaligned());
    let even = _pdep_u64((x.add(90) as *const u32).read_unaligned() as u64, 0x5555_5555_5555_5555);
    let neg = [m0, m1, m2, xxs_signs::mask3(m0, m1, m2, even)];
    let mut acc = _mm512_setzero_si512();
    for j in 0..4 {
        acc = _mm512_dpbusd_epi32(acc, w[j], _mm512_mask_sub_epi8(y[j], neg[j], _mm512_setzero_si512(), y[j]));
    }
    let s = _mm512_set1_epi32((x.add(94) as *const i32).read_unaligned());
    let ls = _mm512_ternarylogic_epi32::<0xEA>(
        _mm512_rorv_epi32(s, k.scale_shift),
        _mm512_set1_epi32(30),
        _mm512_set1_epi32(1),
    );
    _mm512_mullo_epi32(acc, ls)
}

/// [`crate::packed::xxs_signs::encode`] of one block in vector code: the
/// sign bits in element order as the file-layout kernel makes them, the four
/// masks by `vpshufbitqmb`, mask 3's even bits by `pext`. The byte loops
/// ran at under 1 GB/s and made loading an IQ3_XXS model several times
/// slower than copying it.
///
/// # Safety
/// AVX-512 F/BW/VL/VBMI/BITALG and BMI2; `src`, `dst`: 98 bytes each.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512bitalg,avx2,bmi2")]
pub unsafe fn encode_recoded(src: *const u8, dst: *mut u8) {
    let t = tables();
    std::ptr::copy_nonoverlapping(src, dst, 66);
    let aux = src.add(66);
    // Quadword L: the sign bits of values 32L..32L + 32.
    let signs = _mm512_cvtepu32_epi64(xxs_sign_bits(aux));
    let mut m = [0u64; 4];
    for (j, mj) in m.iter_mut().enumerate() {
        *mj = _mm512_bitshuffle_epi64_mask(signs, ld(t.sign_ctl[j].as_ptr()));
    }
    for (j, mj) in m[..3].iter().enumerate() {
        (dst.add(66 + 8 * j) as *mut u64).write_unaligned(*mj);
    }
    (dst.add(90) as *mut u32).write_unaligned(_pext_u64(m[3], 0x5555_5555_5555_5555) as u32);
    let mut scales = 0u32;
    for l in 0..8 {
        scales |= ((aux.add(4 * l) as *const u32).read_unaligned() >> 28) << (4 * l);
    }
    (dst.add(94) as *mut u32).write_unaligned(scales);
}

/// What the four-row kernel's blocks share.
struct Dot4Consts {
    t: &'static Tables,
    rank_to_mag: __m512i,
    by_j: __m512i,
    sign_ctl: [__m512i; 4],
    /// Lane `d`: `d / 2`.
    pair_lanes: __m512i,
    /// Lane `d`: the rotation `4·(d / 2) − 1` of the recoded scale word.
    scale_shift: __m512i,
}

/// Four IQ3_XXS rows `stride` bytes apart × one Q8_K row, the activations in
/// the grid's order once a block for all four; each row equals
/// [`dot_iq3_xxs`]'s.
///
/// # Safety
/// As for [`crate::quant::Dot4Fn`]; needs AVX-512 F/BW/VL/VNNI, VBMI, BITALG
/// and GFNI.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c,gfni,bmi2")]
pub unsafe fn dot4_iq3_xxs(n: usize, w: *const u8, stride: usize, a: *const u8, out: *mut f32) {
    run4::<false, false>(n, w, stride, a, std::ptr::null(), out)
}

/// [`dot4_iq3_xxs`] over rows recoded at load ([`crate::packed::xxs_signs`];
/// rows `stride` bytes apart as in the file); equals it bit for bit.
///
/// # Safety
/// As for [`crate::quant::Dot4Fn`]; needs AVX-512 F/BW/VL/VNNI, VBMI, BITALG,
/// GFNI and BMI2.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c,gfni,bmi2")]
pub unsafe fn packed_dot4_iq3_xxs(n: usize, w: *const u8, stride: usize, a: *const u8, out: *mut f32) {
    run4::<false, true>(n, w, stride, a, std::ptr::null(), out)
}

/// What the IQ3_XXS four-row kernels share: the tables and controls.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,gfni")]
#[inline]
unsafe fn dot4_consts() -> Dot4Consts {
    let t = tables();
    let sc = &t.sign_ctl;
    Dot4Consts {
        t,
        rank_to_mag: _mm512_set1_epi64(bit_moves([None, Some(3), None, Some(0), Some(1), Some(2), None, None])),
        by_j: ld(t.by_j.as_ptr()),
        sign_ctl: [ld(sc[0].as_ptr()), ld(sc[1].as_ptr()), ld(sc[2].as_ptr()), ld(sc[3].as_ptr())],
        pair_lanes: _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7),
        scale_shift: _mm512_setr_epi32(-1, -1, 3, 3, 7, 7, 11, 11, 15, 15, 19, 19, 23, 23, 27, 27),
    }
}

/// The four-row loop of [`dot4_iq3_xxs`] (`PRE` false: the activations put
/// in the grid's order block by block) and of the row kernel's step
/// (`PRE`: read from `pre`, one [`by_position`] a block); `RECODED`: the
/// rows recoded at load ([`block_recoded`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c,gfni,bmi2")]
#[inline]
unsafe fn run4<const PRE: bool, const RECODED: bool>(
    n: usize,
    w: *const u8,
    stride: usize,
    a: *const u8,
    pre: *const [__m512i; 4],
    out: *mut f32,
) {
    let k = dot4_consts();
    let mut sum = _mm_setzero_ps();
    for i in 0..n / 256 {
        let y = q8k(a, i);
        let ys = if PRE { *pre.add(i) } else { by_position(y.qs.as_ptr() as *const u8, k.by_j) };
        let x = [w.add(i * 98), w.add(stride + i * 98), w.add(2 * stride + i * 98), w.add(3 * stride + i * 98)];
        for x in x {
            prefetch_block(x, PREFETCH_AHEAD);
        }
        let b = if RECODED {
            [
                block_recoded(x[0], ys, &k),
                block_recoded(x[1], ys, &k),
                block_recoded(x[2], ys, &k),
                block_recoded(x[3], ys, &k),
            ]
        } else {
            [
                block_by_position(x[0], ys, &k),
                block_by_position(x[1], ys, &k),
                block_by_position(x[2], ys, &k),
                block_by_position(x[3], ys, &k),
            ]
        };
        let isum = _mm_cvtepi32_ps(super::avx512_iq3s_vbmi::sum4(b));
        let xd = super::avx2::f16x4(
            rd16(x[0]) as u64 | (rd16(x[1]) as u64) << 16 | (rd16(x[2]) as u64) << 32 | (rd16(x[3]) as u64) << 48,
        );
        // Lane r: row r's scalar expression, no fused multiply-add.
        sum = _mm_add_ps(sum, _mm_mul_ps(_mm_mul_ps(xd, _mm_set1_ps(y.d)), isum));
    }
    _mm_storeu_ps(out, _mm_mul_ps(sum, _mm_set1_ps(0.25)));
}

/// [`run4`] over prepared activations, not inlined: its registers are
/// allocated as [`dot4_iq3_xxs`]'s are.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c,gfni,bmi2")]
#[inline(never)]
unsafe fn group4(n: usize, w: *const u8, stride: usize, a: *const u8, pre: *const [__m512i; 4], out: *mut f32) {
    run4::<true, false>(n, w, stride, a, pre, out)
}

/// [`group4`] over recoded rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c,gfni,bmi2")]
#[inline(never)]
unsafe fn group4_recoded(n: usize, w: *const u8, stride: usize, a: *const u8, pre: *const [__m512i; 4], out: *mut f32) {
    run4::<true, true>(n, w, stride, a, pre, out)
}

super::prepared_rows::row_kernel!(
    /// Every four-row group of a file-layout IQ3_XXS weight against `m`
    /// activation rows, the activations put in the grid's order once a call
    /// instead of once per four rows; each output equals [`dot4_iq3_xxs`]'s.
    ///
    /// # Safety
    /// As for [`crate::quant::Rows16Fn`]; needs AVX-512 F/BW/VL/VNNI, VBMI, BITALG
    /// and GFNI.
    rows_iq3_xxs,
    prepare,
    group4
);

super::prepared_rows::row_kernel!(
    /// [`rows_iq3_xxs`] over a weight recoded at load
    /// ([`crate::packed::xxs_signs`]): the decode kernel where the CPU has
    /// BMI2 too; each output equals [`packed_dot4_iq3_xxs`]'s.
    ///
    /// # Safety
    /// As for [`crate::quant::Rows16Fn`]; needs AVX-512 F/BW/VL/VNNI, VBMI,
    /// BITALG, GFNI and BMI2.
    packed_rows_iq3_xxs,
    prepare,
    group4_recoded
);

/// One block's activations in the grid's order, for the row driver.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx2")]
unsafe fn prepare(qs: *const u8) -> [__m512i; 4] {
    by_position(qs, ld(tables().by_j.as_ptr()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{self, q8_k};

    /// The kernel equals the scalar dot bit for bit on random blocks (every
    /// grid index, sign and scale), where the CPU has VBMI and GFNI.
    #[test]
    fn vbmi_iq3_xxs_dot_equals_scalar() {
        if !(is_x86_feature_detected!("avx512vbmi")
            && is_x86_feature_detected!("avx512vnni")
            && is_x86_feature_detected!("gfni"))
        {
            eprintln!("skipped: no AVX-512 VBMI/VNNI or GFNI here");
            return;
        }
        let mut rng = super::super::XorShift(0x9E37_79B9_7F4A_7C15);
        let mut next = move || rng.next();
        for (bytes, scalar, vbmi) in
            [(98usize, quant::scalar::dot_fn(crate::DType::IQ3_XXS), dot_iq3_xxs as quant::DotFn)]
        {
            for nb in [1usize, 3, 8] {
                let n = 256 * nb;
                let mut w: Vec<u8> = (0..bytes * nb).map(|_| next() as u8).collect();
                for b in 0..nb {
                    // A finite scale: f16 0.0–1.0.
                    w[b * bytes..b * bytes + 2].copy_from_slice(&((next() % 0x3C00) as u16).to_le_bytes());
                }
                let x: Vec<f32> = (0..n).map(|_| (next() % 2001) as f32 / 1000.0 - 1.0).collect();
                let mut a = vec![<q8_k::BlockQ8K as bytemuck::Zeroable>::zeroed(); nb];
                q8_k::quantize(&x, &mut a);
                let ap = bytemuck::cast_slice::<_, u8>(&a).as_ptr();
                let (want, got) = unsafe { (scalar(n, w.as_ptr(), ap), vbmi(n, w.as_ptr(), ap)) };
                assert_eq!(got.to_bits(), want.to_bits(), "{bytes}-byte blocks × {nb}: {got} vs {want}");
                if !super::super::avx512_iq3s_vbmi::has_vbmi_bitalg() {
                    continue;
                }
                // The four-row kernel over this row and three more.
                let row = bytes * nb;
                let mut w4 = w.clone();
                for _ in 0..3 * row {
                    w4.push(next() as u8);
                }
                for b in nb..4 * nb {
                    w4[b * bytes..b * bytes + 2].copy_from_slice(&((next() % 0x3C00) as u16).to_le_bytes());
                }
                let mut four = [0f32; 4];
                unsafe { dot4_iq3_xxs(n, w4.as_ptr(), row, ap, four.as_mut_ptr()) };
                for (r, got4) in four.iter().enumerate() {
                    let want = unsafe { scalar(n, w4[r * row..].as_ptr(), ap) };
                    assert_eq!(got4.to_bits(), want.to_bits(), "four-row, row {r}, {nb} blocks: {got4} vs {want}");
                }
                // The row kernel: the same bits, the activations prepared once.
                let mut by_rows = [f32::NAN; 4];
                unsafe { rows_iq3_xxs(n, w4.as_ptr(), row, 4, ap, 0, 1, by_rows.as_mut_ptr(), 4) };
                assert_eq!(by_rows.map(f32::to_bits), four.map(f32::to_bits), "row kernel, {nb} blocks");
                // Recoded at load: the four-row and row kernels, the same bits.
                let pw = crate::packed::pack(crate::DType::IQ3_XXS, 4, n, &w4);
                let (mut packed, mut packed_rows) = ([0f32; 4], [f32::NAN; 4]);
                unsafe {
                    packed_dot4_iq3_xxs(n, pw.as_ptr(), row, ap, packed.as_mut_ptr());
                    packed_rows_iq3_xxs(n, pw.as_ptr(), row, 4, ap, 0, 1, packed_rows.as_mut_ptr(), 4);
                }
                assert_eq!(packed.map(f32::to_bits), four.map(f32::to_bits), "recoded four-row, {nb} blocks");
                assert_eq!(packed_rows.map(f32::to_bits), four.map(f32::to_bits), "recoded rows, {nb} blocks");
            }
        }
    }
}
