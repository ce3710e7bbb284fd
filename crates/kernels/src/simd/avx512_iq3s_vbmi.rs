//! AVX-512 VBMI + BITALG decode dots for IQ3_S against Q8_K: the grid looked
//! up in registers, the activations in the grid's order instead of the
//! weights in element order.
//!
//! Why: the gather kernel ([`super::avx512_iq::dot_iq3_s`]) spends ~44 of its
//! ~54 cycles a super-block in four `vpgatherdd` (~11 cycles each here), and
//! a register-lookup version that put each looked-up nibble back in element
//! order ran level with it: the reordering, the four sub-block scale vectors
//! and four scale steps cost what the lookups saved. Here nothing is put back
//! in element order. An IQ3_S grid entry is four odd magnitudes `1..=15`, so
//! two nibble tables hold the grid: `A[i] = g0 | g1 << 4`, `B[i] = g2 | g3 << 4`
//! (512 bytes each, eight `zmm`). For one super-block (64 entries):
//! * each table's 64 lookups: four `vpermt2b` (128 entries each, index bits
//!   0–6) and three byte blends (bit 7 from `vpmovb2m`, bit 8 straight from
//!   `qh` as a mask); a nibble mask and a shift then give four vectors `w_j`
//!   with byte `i` = entry `i`'s magnitude `j`;
//! * the activations are laid out the same way once per super-block and
//!   four rows (`y_j` byte `i` = activation `4i + j`: one `vpermb` per 64
//!   and a 4 × 4 transpose of 128-bit lanes);
//! * value `4i + j`'s sign is bit `4i + j` of the 256 sign bits: with the sign
//!   dwords widened to quadwords, one `vpshufbitqmb` per `j` (byte `i` picks
//!   bit `4(i mod 8) + j` of quadword `i / 8`) makes the mask that negates
//!   `y_j` (Q8_K codes are −127..127, so a negation never wraps);
//! * four `vpdpbusd` into one accumulator: lane `d` then holds entries
//!   `4d..4d+4` of all four `j`, values `16d..16d+16`, all in sub-block
//!   `d / 2`, so one `vpdpwssd` against `(2s + 1, 0)` word pairs scales the
//!   whole block (a lane's sum is at most 16·15·127 < 2¹⁵ in magnitude, so its
//!   low word is the whole signed sum).
//!
//! Numerics: the block's integer sum is exact and the float steps are the
//! scalar `vec_dot`'s (`d·d_a·isum` added block by block), so both kernels
//! equal scalar bit for bit, and the four-row kernel equals the one-row one.

use super::avx2_lowk::{blk, q8k};
use super::avx2_rows::prefetch_block;
use super::avx512_iq3_vbmi::vld;
use super::avx512_lowk;
use super::avx512_rows16_k::PREFETCH_AHEAD;
use super::avx512_rows16_q3k::bit_moves;
use crate::quant::iq3_s;
use crate::quant::iq_grids::IQ3S_GRID;
use std::arch::x86_64::*;
use std::sync::OnceLock;

/// The two nibble tables, 64-byte aligned so each register's worth loads in
/// one go.
#[repr(C, align(64))]
struct Tables {
    a: [u8; 512],
    b: [u8; 512],
    /// `vpermb` control: output byte `16j + t` = input byte `4t + j`.
    by_j: [u8; 64],
    /// `vpshufbitqmb` controls: byte `i` of `sign_ctl[j]` = `4(i mod 8) + j`.
    sign_ctl: [[u8; 64]; 4],
}

fn tables() -> &'static Tables {
    static T: OnceLock<Tables> = OnceLock::new();
    T.get_or_init(|| {
        let mut t = Tables { a: [0; 512], b: [0; 512], by_j: [0; 64], sign_ctl: [[0; 64]; 4] };
        for (i, g) in IQ3S_GRID.iter().enumerate() {
            let m = g.to_le_bytes();
            debug_assert!(m.iter().all(|&v| v < 16));
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

/// Whether this CPU has what the grid-order kernels need: AVX-512 VBMI and
/// BITALG, and GFNI (IQ3_XXS's rank-to-magnitude step; every CPU with
/// BITALG has it: Ice Lake on, Zen 4). `SHARDLM_VBMI=0`, `SHARDLM_GFNI=0` or
/// `SHARDLM_BITALG=0` turns them off.
pub fn has_vbmi_bitalg() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        super::avx512_fp4_vbmi::has_vbmi()
            && super::avx512_rows16_q3k::has_gfni()
            && is_x86_feature_detected!("avx512bitalg")
            && std::env::var("SHARDLM_BITALG").map_or(true, |v| v.trim() != "0")
    })
}

#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn ld(p: *const u8) -> __m512i {
    _mm512_loadu_si512(p as *const _)
}

/// What every block shares: the tables stay in memory (L1) and are read as
/// the permutes' operands; in registers they and the rest would not fit in
/// 32 `zmm`, and the spills cost more than the loads.
struct Consts {
    t: &'static Tables,
    by_j: __m512i,
    low4: __m512i,
    /// The `vgf2p8affineqb` matrix taking a byte's high nibble to its low one.
    high_nibble: __m512i,
    /// Lane `d`: `4·(d / 2)`, the shift of sub-block `d / 2`'s scale nibble.
    scale_shift: __m512i,
}

#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn consts() -> Consts {
    let t = tables();
    Consts {
        t,
        by_j: ld(t.by_j.as_ptr()),
        low4: _mm512_set1_epi8(0x0F),
        high_nibble: _mm512_set1_epi64(bit_moves([Some(4), Some(5), Some(6), Some(7), None, None, None, None])),
        scale_shift: _mm512_setr_epi32(0, 0, 4, 4, 8, 8, 12, 12, 16, 16, 20, 20, 24, 24, 28, 28),
    }
}

/// The [`by_position`] control and the four sign-mask controls, for
/// IQ3_XXS's four-row kernel ([`super::avx512_iq3_vbmi::dot4_iq3_xxs`]).
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn order_controls() -> (__m512i, [__m512i; 4]) {
    let t = tables();
    let sc = &t.sign_ctl;
    (ld(t.by_j.as_ptr()), [ld(sc[0].as_ptr()), ld(sc[1].as_ptr()), ld(sc[2].as_ptr()), ld(sc[3].as_ptr())])
}

/// 512-entry lookup of the 64 indices `idx | k8 << 8` (`k7`: bit 7 of each).
/// The tables are read from memory at each lookup ([`vld`]): the permute
/// overwrites its first table operand, so tables held in registers would
/// cost a copy a lookup, and 16 of them do not fit beside the rest.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline]
unsafe fn look512(t: &[u8; 512], idx: __m512i, k7: u64, k8: u64) -> __m512i {
    let t = t.as_ptr();
    let p0 = _mm512_permutex2var_epi8(vld(t), idx, vld(t.add(64)));
    let p1 = _mm512_permutex2var_epi8(vld(t.add(128)), idx, vld(t.add(192)));
    let p2 = _mm512_permutex2var_epi8(vld(t.add(256)), idx, vld(t.add(320)));
    let p3 = _mm512_permutex2var_epi8(vld(t.add(384)), idx, vld(t.add(448)));
    let lo = _mm512_mask_blend_epi8(k7, p0, p1);
    let hi = _mm512_mask_blend_epi8(k7, p2, p3);
    _mm512_mask_blend_epi8(k8, lo, hi)
}

/// The 256 activations of a Q8_K block in the grid's order: `y_j` byte `i` =
/// activation `4i + j`.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline]
pub(super) unsafe fn by_position(qs: *const u8, by_j: __m512i) -> [__m512i; 4] {
    // Lane j (16 bytes) of `v[k]`: activations 64k + 4t + j, t = 0..16.
    // (No closures here: one would not inline, and lose the target features.)
    let v = [
        _mm512_permutexvar_epi8(by_j, ld(qs)),
        _mm512_permutexvar_epi8(by_j, ld(qs.add(64))),
        _mm512_permutexvar_epi8(by_j, ld(qs.add(128))),
        _mm512_permutexvar_epi8(by_j, ld(qs.add(192))),
    ];
    let t0 = _mm512_shuffle_i64x2::<0b01_00_01_00>(v[0], v[1]);
    let t1 = _mm512_shuffle_i64x2::<0b01_00_01_00>(v[2], v[3]);
    let t2 = _mm512_shuffle_i64x2::<0b11_10_11_10>(v[0], v[1]);
    let t3 = _mm512_shuffle_i64x2::<0b11_10_11_10>(v[2], v[3]);
    [
        _mm512_shuffle_i64x2::<0b10_00_10_00>(t0, t1),
        _mm512_shuffle_i64x2::<0b11_01_11_01>(t0, t1),
        _mm512_shuffle_i64x2::<0b10_00_10_00>(t2, t3),
        _mm512_shuffle_i64x2::<0b11_01_11_01>(t2, t3),
    ]
}

/// One IQ3_S block against activations `y` (in the grid's order): the exact
/// `Σ_g (2s_g + 1)·Σ code·q8`, spread over 16 lanes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,gfni")]
#[inline]
unsafe fn block(x: &iq3_s::BlockIq3S, y: [__m512i; 4], k: &Consts) -> __m512i {
    let idx = ld(x.qs.as_ptr());
    let k7 = _mm512_movepi8_mask(idx);
    let k8 = u64::from_le_bytes(x.qh);
    let t = k.t;
    let a = look512(&t.a, idx, k7, k8);
    let b = look512(&t.b, idx, k7, k8);
    // The high nibble by one `vgf2p8affineqb` (a shift and a mask in one).
    let w = [
        _mm512_and_si512(a, k.low4),
        _mm512_gf2p8affine_epi64_epi8::<0>(a, k.high_nibble),
        _mm512_and_si512(b, k.low4),
        _mm512_gf2p8affine_epi64_epi8::<0>(b, k.high_nibble),
    ];
    // Quadword L: the sign bits of values 32L..32L + 32.
    let signs = _mm512_cvtepu32_epi64(_mm256_loadu_si256(x.signs.as_ptr() as *const __m256i));
    let mut acc = _mm512_setzero_si512();
    for j in 0..4 {
        let neg = _mm512_bitshuffle_epi64_mask(signs, ld(t.sign_ctl[j].as_ptr()));
        let ys = _mm512_mask_sub_epi8(y[j], neg, _mm512_setzero_si512(), y[j]);
        acc = _mm512_dpbusd_epi32(acc, w[j], ys);
    }
    // Lane d's scale 2s + 1 of sub-block d / 2, as the word pair (2s + 1, 0).
    let s = _mm512_set1_epi32(u32::from_le_bytes(x.scales) as i32);
    let s = _mm512_and_si512(_mm512_srlv_epi32(s, k.scale_shift), _mm512_set1_epi32(15));
    let ls = _mm512_or_si512(_mm512_add_epi32(s, s), _mm512_set1_epi32(1));
    _mm512_dpwssd_epi32(_mm512_setzero_si512(), acc, ls)
}

/// The lane sums of four 16-lane vectors, lane `r` from `v[r]`.
#[target_feature(enable = "avx512f,avx2")]
#[inline]
pub(super) unsafe fn sum4(v: [__m512i; 4]) -> __m128i {
    avx512_lowk::sum4(
        avx512_lowk::fold(v[0]),
        avx512_lowk::fold(v[1]),
        avx512_lowk::fold(v[2]),
        avx512_lowk::fold(v[3]),
    )
}

/// # Safety
/// As for [`crate::quant::DotFn`]; needs AVX-512 F/BW/VL/VNNI, VBMI and BITALG.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c,gfni")]
pub unsafe fn dot_iq3_s(n: usize, w: *const u8, a: *const u8) -> f32 {
    let k = consts();
    let mut sum = 0f32;
    for i in 0..n / 256 {
        let x: &iq3_s::BlockIq3S = blk(w.add(i * 110));
        prefetch_block(w.add(i * 110), PREFETCH_AHEAD);
        let y = q8k(a, i);
        let ys = by_position(y.qs.as_ptr() as *const u8, k.by_j);
        let isum = _mm512_reduce_add_epi32(block(x, ys, &k));
        sum += x.d.to_f32() * y.d * isum as f32;
    }
    sum
}

/// Four rows `stride` bytes apart; each equals [`dot_iq3_s`] of its row.
///
/// # Safety
/// As for [`crate::quant::Dot4Fn`]; needs AVX-512 F/BW/VL/VNNI, VBMI and BITALG.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c,gfni")]
pub unsafe fn dot4_iq3_s(n: usize, w: *const u8, stride: usize, a: *const u8, out: *mut f32) {
    let k = consts();
    let mut sum = _mm_setzero_ps();
    for i in 0..n / 256 {
        let y = q8k(a, i);
        let ys = by_position(y.qs.as_ptr() as *const u8, k.by_j);
        // Each row's block PREFETCH_AHEAD bytes on (110 bytes: two lines).
        for r in 0..4 {
            prefetch_block(w.add(r * stride + i * 110), PREFETCH_AHEAD);
        }
        let x: [&iq3_s::BlockIq3S; 4] = [
            blk(w.add(i * 110)),
            blk(w.add(stride + i * 110)),
            blk(w.add(2 * stride + i * 110)),
            blk(w.add(3 * stride + i * 110)),
        ];
        let b = [block(x[0], ys, &k), block(x[1], ys, &k), block(x[2], ys, &k), block(x[3], ys, &k)];
        let isum = _mm_cvtepi32_ps(sum4(b));
        let (d0, d1, d2, d3) = (x[0].d.bits() as u64, x[1].d.bits() as u64, x[2].d.bits() as u64, x[3].d.bits() as u64);
        let xd = super::avx2::f16x4(d0 | d1 << 16 | d2 << 32 | d3 << 48);
        // Lane r: row r's scalar expression, no fused multiply-add.
        sum = _mm_add_ps(sum, _mm_mul_ps(_mm_mul_ps(xd, _mm_set1_ps(y.d)), isum));
    }
    _mm_storeu_ps(out, sum);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{self, q8_k};

    /// Both kernels equal the scalar dot bit for bit on random blocks (every
    /// grid index, sign and scale), where the CPU has VBMI and BITALG.
    #[test]
    fn vbmi_iq3_s_dots_equal_scalar() {
        if !(has_vbmi_bitalg() && is_x86_feature_detected!("avx512vnni")) {
            eprintln!("skipped: no AVX-512 VBMI/BITALG/VNNI here");
            return;
        }
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let scalar = quant::scalar::dot_fn(crate::DType::IQ3_S);
        for nb in [1usize, 3, 8] {
            let n = 256 * nb;
            let row = 110 * nb;
            let mut w: Vec<u8> = (0..4 * row).map(|_| next() as u8).collect();
            for b in 0..4 * nb {
                // A finite scale: f16 0.0–1.0.
                w[b * 110..b * 110 + 2].copy_from_slice(&((next() % 0x3C00) as u16).to_le_bytes());
            }
            let x: Vec<f32> = (0..n).map(|_| (next() % 2001) as f32 / 1000.0 - 1.0).collect();
            let mut a = vec![<q8_k::BlockQ8K as bytemuck::Zeroable>::zeroed(); nb];
            q8_k::quantize(&x, &mut a);
            let ap = bytemuck::cast_slice::<_, u8>(&a).as_ptr();
            let mut four = [0f32; 4];
            unsafe { dot4_iq3_s(n, w.as_ptr(), row, ap, four.as_mut_ptr()) };
            for (r, got4) in four.iter().enumerate() {
                let wr = w[r * row..].as_ptr();
                let (want, got) = unsafe { (scalar(n, wr, ap), dot_iq3_s(n, wr, ap)) };
                assert_eq!(got.to_bits(), want.to_bits(), "row {r}, {nb} blocks: {got} vs {want}");
                assert_eq!(got4.to_bits(), want.to_bits(), "four-row, row {r}, {nb} blocks: {got4} vs {want}");
            }
        }
    }
}
