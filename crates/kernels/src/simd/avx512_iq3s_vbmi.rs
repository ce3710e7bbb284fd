//! AVX-512 VBMI + BITALG decode dots for IQ3_S against Q8_K: the grid looked
//! up in registers, the activations in the grid's order instead of the
//! weights in element order.
//!
//! Why: the gather kernel ([`super::avx512_iq::dot_iq3_s`]) spends ~44 of its
//! ~54 cycles a super-block in four `vpgatherdd` (~11 cycles each here), and
//! a register-lookup version that put each looked-up nibble back in element
//! order ran level with it: the reordering, the four sub-block scale vectors
//! and four scale steps cost what the lookups saved. Here nothing is put back
//! in element order. An IQ3_S grid entry is four odd magnitudes `1..=15`,
//! `2r + 1` with a three-bit rank `r`, so twelve bits hold an entry: a byte
//! table `a` (ranks 0, 1 and r2's low two bits; 512 bytes, eight `zmm`) and
//! a nibble table `c` (r3 and r2's top bit; entries `i` and `i + 256` share
//! byte `i`, 256 bytes). For one super-block (64 entries):
//! * `a`'s 64 lookups: four `vpermt2b` (128 entries each, index bits 0–6,
//!   the tables read from L1 at each) and three byte blends (bit 7 from
//!   `vpmovb2m`, bit 8 from `qh` as a mask); `c`'s: two `vpermt2b`, a blend,
//!   and a masked `vgf2p8affineqb` that takes the high nibble where bit 8 is
//!   set. One `vgf2p8affineqb` per magnitude maps three rank bits to `2r + 1`
//!   (an affine map over GF(2)), giving four vectors `w_j` with byte `p` =
//!   magnitude `j` of the entry at lane `p`. Six `vpermt2b` (two cycles each
//!   on the shuffle port, which bounds this kernel) instead of the eight two
//!   nibble tables of the whole magnitudes took: 9.80 → 8.92 ns a
//!   super-block-row in L2 (1.10×);
//! * the entries are taken in the *sign order* ([`sign_order`]): one `vpermb`
//!   puts the 64 indices in it and one `vpshufbitqmb` their ninth bits (from
//!   `qh`), and the activations are laid out the same way once per
//!   super-block and four rows (`y_j` byte `p` = activation `4σ(p) + j`: one
//!   `vpermb` per 64 and a 4 × 4 transpose of 128-bit lanes);
//! * in that order an 8 × 8 bit transpose of each sign quadword
//!   (`vgf2p8affineqb`) and one byte permute give the four sign masks as
//!   whole bytes ([`sign_masks`]), which negate `y_j` (Q8_K codes are
//!   −127..127, so a negation never wraps);
//! * four `vpdpbusd` into one accumulator: lane `d` then holds the entries
//!   of lanes `4d..4d+4` for all four `j`, 16 values of one sub-block,
//!   `sb(d)` ([`SUB_BLOCK_OF_LANE`]), so one `vpdpwssd` against `(2s + 1, 0)`
//!   word pairs scales the whole block (a lane's sum is at most 16·15·127 <
//!   2¹⁵ in magnitude, so its low word is the whole signed sum).
//!
//! Measured (in L2, 256 × 2048, Emerald Rapids, medians of 9 alternating
//! runs): 9.97 ns a super-block-row against 10.74 with the grid's own order
//! and four `vpshufbitqmb` masks; holding the tables in registers instead
//! of reading them at each lookup cost copies and spills (12.8 ns).
//!
//! Numerics: the block's integer sum is exact and the float steps are the
//! scalar `vec_dot`'s (`d·d_a·isum` added block by block), so both kernels
//! equal scalar bit for bit, and the four-row kernel equals the one-row one.

use super::avx2_lowk::{blk, q8k};
use super::avx2_rows::prefetch_block;
use super::avx512_iq3_vbmi::look256_mem;
use super::avx512_rows16_k::PREFETCH_AHEAD;
use super::avx512_rows16_q3k::bit_moves;
use crate::quant::iq3_s;
use crate::quant::iq_grids::IQ3S_GRID;
use std::arch::x86_64::*;
use std::sync::OnceLock;

/// The two nibble tables, 64-byte aligned so each register's worth loads in
/// one go, and the permute controls.
#[repr(C, align(64))]
struct Tables {
    /// Entry `i`'s ranks `r_j = (g_j − 1) / 2` (three bits each): `r0 | r1 << 3
    /// | (r2 & 3) << 6`.
    a: [u8; 512],
    /// Nibble `r3 | (r2 >> 2) << 3` of entry `i` in the low half of byte `i`
    /// and of entry `i + 256` in its high half.
    c: [u8; 256],
    /// The entry at lane `p` in the sign order ([`sign_order`]): `σ(p)`.
    sigma: [u8; 64],
    /// `vpermb` control: output byte `16j + t` = input byte `4σ(t) + j`.
    by_sigma: [u8; 64],
    /// `vpermb` control taking the transposed sign bytes to the four masks.
    mask_ctl: [u8; 32],
}

/// The sign order of a super-block's 64 entries (see
/// [`crate::packed::sign_order::sigma`]): lane `p = 16q + 8h + i` holds entry
/// `σ(p) = 16q + 2(7 − i) + h`. In it, an 8 × 8 bit transpose of each sign
/// quadword (values `64q..64q + 64`, byte `k` bit `c` = value `64q + 8k + c`,
/// entry `16q + 2k + c / 4`, magnitude `c mod 4`) leaves in byte `4h + j` the
/// signs of magnitude `j` of lanes `16q + 8h..+8`, in lane order, so the masks
/// are whole bytes (see [`sign_masks`]).
use crate::packed::sign_order::sigma as sign_order;

fn tables() -> &'static Tables {
    static T: OnceLock<Tables> = OnceLock::new();
    T.get_or_init(|| {
        let mut t = Tables { a: [0; 512], c: [0; 256], sigma: [0; 64], by_sigma: [0; 64], mask_ctl: [0; 32] };
        for (i, g) in IQ3S_GRID.iter().enumerate() {
            let m = g.to_le_bytes();
            debug_assert!(m.iter().all(|&v| v < 16 && v % 2 == 1));
            let r = m.map(|v| v >> 1);
            t.a[i] = r[0] | r[1] << 3 | (r[2] & 3) << 6;
            t.c[i % 256] |= (r[3] | (r[2] >> 2) << 3) << (4 * (i / 256));
        }
        for j in 0..4 {
            for tt in 0..16 {
                // Applied to the k-th 64 activations: entry 16k + σ(t) =
                // σ(16k + t), as the sign order has it.
                t.by_sigma[16 * j + tt] = (4 * sign_order(tt) + j) as u8;
            }
            // Mask j, byte 2q + h = transposed quadword q, byte 4h + j.
            for q in 0..4 {
                for h in 0..2 {
                    t.mask_ctl[8 * j + 2 * q + h] = (8 * q + 4 * h + j) as u8;
                }
            }
        }
        for (p, s) in t.sigma.iter_mut().enumerate() {
            *s = sign_order(p) as u8;
        }
        t
    })
}

/// Whether this CPU has what the four-row register-lookup kernels need (IQ3_S,
/// IQ3_XXS, and the IQ2 types in [`super::avx512_iq2_vbmi`]): AVX-512 VBMI,
/// BITALG and GFNI (every CPU with BITALG has GFNI: Ice Lake on, Zen 4),
/// and BMI2 (all of those have it; IQ3_XXS's recoded signs use `pdep`).
/// `SHARDLM_VBMI=0`, `SHARDLM_GFNI=0` or `SHARDLM_BITALG=0` turns them off.
pub fn has_vbmi_bitalg() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        super::avx512_fp4_vbmi::has_vbmi()
            && super::avx512_rows16_q3k::has_gfni()
            && is_x86_feature_detected!("avx512bitalg")
            && is_x86_feature_detected!("bmi2")
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
    o: SignOrder,
    /// The `vgf2p8affineqb` matrix taking a byte's high nibble to its low one.
    high_nibble: __m512i,
    /// `vgf2p8affineqb` matrices taking the three rank bits at `a`'s bits
    /// 0–2, 3–5 and `c`'s 0–2 to magnitude bits 1–3 (the constant 1 sets
    /// bit 0: `2r + 1`); `rank2` takes `a`'s bits 6–7 to 1–2.
    rank: [__m512i; 3],
    rank2: __m512i,
    eight: __m512i,
    /// Lane `d`: the rotation of its sub-block's scale nibble, `4·sb(d) − 1`
    /// ([`SUB_BLOCK_OF_LANE`]).
    scale_shift: __m512i,
}

/// The sub-block of a block's 16 dot lanes in the sign order, `sb(d) =
/// 2(d / 4) + 1 − d mod 2`: lane `d`'s bytes `4d..4d + 4` hold entries
/// `16q + 8..16` for even `d` and `16q..16q + 8` for odd, `q = d / 4`.
pub(super) const SUB_BLOCK_OF_LANE: [i32; 16] = [1, 0, 1, 0, 3, 2, 3, 2, 5, 4, 5, 4, 7, 6, 7, 6];

/// The sign order's controls (see [`sign_order`]), for IQ3_S and IQ3_XXS.
pub(super) struct SignOrder {
    /// [`by_position`]'s control for the activations in the sign order.
    pub by_sigma: __m512i,
    /// `vpermb` control putting a block's indices in the sign order.
    pub sigma: __m512i,
    mask_ctl: __m256i,
    /// Each quadword's bytes `1 << b`: with a sign quadword as the matrix,
    /// `vgf2p8affineqb` transposes it (output byte `b` bit `i` = input byte
    /// `7 − i` bit `b`).
    one_hot: __m256i,
}

#[target_feature(enable = "avx512f,avx2")]
#[inline]
pub(super) unsafe fn sign_order_consts() -> SignOrder {
    let t = tables();
    SignOrder {
        by_sigma: ld(t.by_sigma.as_ptr()),
        sigma: ld(t.sigma.as_ptr()),
        mask_ctl: _mm256_loadu_si256(t.mask_ctl.as_ptr() as *const __m256i),
        one_hot: _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64),
    }
}

#[target_feature(enable = "avx512f,avx2")]
#[inline]
unsafe fn consts() -> Consts {
    let t = tables();
    Consts {
        t,
        o: sign_order_consts(),
        high_nibble: _mm512_set1_epi64(bit_moves([Some(4), Some(5), Some(6), Some(7), None, None, None, None])),
        rank: [0, 3, 0]
            .map(|b| _mm512_set1_epi64(bit_moves([None, Some(b), Some(b + 1), Some(b + 2), None, None, None, None]))),
        rank2: _mm512_set1_epi64(bit_moves([None, Some(6), Some(7), None, None, None, None, None])),
        eight: _mm512_set1_epi8(8),
        scale_shift: _mm512_sub_epi32(
            _mm512_slli_epi32::<2>(_mm512_loadu_si512(SUB_BLOCK_OF_LANE.as_ptr() as *const _)),
            _mm512_set1_epi32(1),
        ),
    }
}

/// The four sign masks of a block in the sign order from its 256 sign bits
/// in element order: mask `j` bit `p` = the sign of magnitude `j` of entry
/// `σ(p)`. One 8 × 8 bit transpose per sign quadword and one byte permute
/// make the masks' 32 bytes; they go to mask registers by extracts and
/// `kmovq`. (Four `vpshufbitqmb`, one a mask, and widening the sign dwords
/// to quadwords for them, ran 5–7% slower on the IQ3_S kernel; storing the
/// bytes and loading the masks with `kmovq k, m64` ran level with this, or
/// slower where a 32-byte store fed the four loads.)
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,gfni")]
#[inline]
pub(super) unsafe fn sign_masks(bits: __m256i, o: &SignOrder) -> [u64; 4] {
    let tr = _mm256_gf2p8affine_epi64_epi8::<0>(o.one_hot, bits);
    std::mem::transmute::<__m256i, [u64; 4]>(_mm256_permutexvar_epi8(o.mask_ctl, tr))
}

/// 512-entry lookup of the 64 indices `idx | k8 << 8` (`k7`: bit 7 of each).
/// The tables are read from memory at each lookup ([`vld`]): a permute
/// overwrites one of its operands, so tables held in registers would cost a
/// copy a lookup, and 16 of them do not fit beside the rest. Bit 7 costs no
/// blend: each table pair's `vpermi2b` writes only the lanes whose bit 7
/// picks it, merging into the index register, so the second pair still finds
/// its lanes' indices there (see [`look256_mem`]); bit 8 is one blend.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline]
pub(super) unsafe fn look512(t: &[u8; 512], idx: __m512i, k7: u64, k8: u64) -> __m512i {
    let lo = look256_mem(&*(t.as_ptr() as *const [u8; 256]), idx, k7);
    let hi = look256_mem(&*(t.as_ptr().add(256) as *const [u8; 256]), idx, k7);
    _mm512_mask_blend_epi8(k8, lo, hi)
}

/// The 256 activations of a Q8_K block in the sign order: `y_j` byte `p` =
/// activation `4σ(p) + j` (`by_sigma` from [`SignOrder`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline]
pub(super) unsafe fn by_position(qs: *const u8, by_sigma: __m512i) -> [__m512i; 4] {
    // Lane j (16 bytes) of `v[k]`: activations 64k + 4σ(t) + j, t = 0..16.
    // (No closures here: one would not inline, and lose the target features.)
    let v = [
        _mm512_permutexvar_epi8(by_sigma, ld(qs)),
        _mm512_permutexvar_epi8(by_sigma, ld(qs.add(64))),
        _mm512_permutexvar_epi8(by_sigma, ld(qs.add(128))),
        _mm512_permutexvar_epi8(by_sigma, ld(qs.add(192))),
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

/// One IQ3_S block against activations `y` (in the sign order, see
/// [`sign_order`]): the exact `Σ_g (2s_g + 1)·Σ code·q8`, spread over 16
/// lanes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,gfni")]
#[inline]
unsafe fn block(x: &iq3_s::BlockIq3S, y: [__m512i; 4], k: &Consts) -> __m512i {
    // The indices in the sign order, and their ninth bits picked to match.
    let idx = _mm512_permutexvar_epi8(k.o.sigma, ld(x.qs.as_ptr()));
    let k7 = _mm512_movepi8_mask(idx);
    let k8 = _mm512_bitshuffle_epi64_mask(_mm512_set1_epi64(u64::from_le_bytes(x.qh) as i64), k.o.sigma);
    let w = magnitudes(idx, k7, k8, k);
    let neg = sign_masks(_mm256_loadu_si256(x.signs.as_ptr() as *const __m256i), &k.o);
    let mut acc = _mm512_setzero_si512();
    for j in 0..4 {
        let ys = _mm512_mask_sub_epi8(y[j], neg[j], _mm512_setzero_si512(), y[j]);
        acc = _mm512_dpbusd_epi32(acc, w[j], ys);
    }
    scaled(acc, x.scales.as_ptr(), k)
}

/// The four magnitude vectors of 64 entries (`w_j` byte `p` = magnitude `j`
/// of the entry whose index is byte `p` of `idx`, ninth bits in `k8`).
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,gfni")]
#[inline]
unsafe fn magnitudes(idx: __m512i, k7: u64, k8: u64, k: &Consts) -> [__m512i; 4] {
    let t = k.t;
    // Twelve rank bits an entry: eight from `a` (four `vpermt2b`), four from
    // `c`'s nibbles (two, the ninth bit picking the nibble).
    let a = look512(&t.a, idx, k7, k8);
    let c = look256_mem(&t.c, idx, k7);
    ranks_to_magnitudes(a, c, k8, k)
}

/// The four magnitude vectors from the looked-up rank bytes `a` and nibble
/// pairs `c` (the high nibble where `k8` is set).
#[target_feature(enable = "avx512f,avx512bw,gfni")]
#[inline]
unsafe fn ranks_to_magnitudes(a: __m512i, c: __m512i, k8: u64, k: &Consts) -> [__m512i; 4] {
    let c = _mm512_mask_gf2p8affine_epi64_epi8::<0>(c, k8, c, k.high_nibble);
    // Ranks to magnitudes `2r + 1`, one `vgf2p8affineqb` each; r2's top bit
    // comes from `c`'s bit 3 (`a | c & 8`).
    let w2 = _mm512_gf2p8affine_epi64_epi8::<1>(a, k.rank2);
    [
        _mm512_gf2p8affine_epi64_epi8::<1>(a, k.rank[0]),
        _mm512_gf2p8affine_epi64_epi8::<1>(a, k.rank[1]),
        _mm512_ternarylogic_epi32::<0xF8>(w2, c, k.eight),
        _mm512_gf2p8affine_epi64_epi8::<1>(c, k.rank[2]),
    ]
}

/// `acc`'s lanes times their sub-block's `2s + 1` (the four scale bytes at
/// `scales`), as the word pairs `(2s + 1, 0)` of one `vpdpwssd`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
unsafe fn scaled(acc: __m512i, scales: *const u8, k: &Consts) -> __m512i {
    // Nibble `sb` rotated right by `4·sb − 1` lands in bits 1–4 (`sb = 0`
    // rotates left by one), so `2s + 1` is one bitwise select.
    let s = _mm512_set1_epi32((scales as *const i32).read_unaligned());
    let ls = _mm512_ternarylogic_epi32::<0xEA>(
        _mm512_rorv_epi32(s, k.scale_shift),
        _mm512_set1_epi32(30),
        _mm512_set1_epi32(1),
    );
    _mm512_dpwssd_epi32(_mm512_setzero_si512(), acc, ls)
}

/// [`block`] for a block recoded in the sign order at load
/// ([`crate::packed::sign_order`]): the indices are one load, their ninth
/// bits and the four sign masks `kmovq` loads from the block itself.
/// `ys`: the activations in the sign order and their negations
/// ([`Prepared`]), in registers or read from memory.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,gfni")]
#[inline]
unsafe fn block_recoded(x: *const u8, ys: &Prepared, k: &Consts) -> __m512i {
    let k7 = _mm512_movepi8_mask(ld(x.add(2)));
    let k8 = _load_mask64(x.add(66) as *const u64);
    let a = look512(&k.t.a, ld(x.add(2)), k7, k8);
    let c = look256_mem(&k.t.c, ld(x.add(2)), k7);
    let w = ranks_to_magnitudes(a, c, k8, k);
    let signs = x.add(74) as *const u64;
    let mut acc = _mm512_setzero_si512();
    for (j, &wj) in w.iter().enumerate() {
        let neg = _load_mask64(signs.add(j));
        acc = _mm512_dpbusd_epi32(acc, wj, _mm512_mask_blend_epi8(neg, ys.y[j], ys.neg[j]));
    }
    scaled(acc, x.add(106), k)
}

/// The lane sums of four 16-lane vectors, lane `r` from `v[r]`: 128-bit
/// lane pairs of two vectors at a time (`vshufi64x2`), then within lanes, 14
/// µops where folding each to 256 bits and three `vphaddd` took 19.
#[target_feature(enable = "avx512f,avx2")]
#[inline]
pub(super) unsafe fn sum4(v: [__m512i; 4]) -> __m128i {
    // Lanes [v0.0 + v0.2, v0.1 + v0.3, v1.0 + v1.2, v1.1 + v1.3], and v2, v3.
    // (No closure for the pairs: one would not inline, and lose the target
    // features.)
    let p01 = _mm512_add_epi32(_mm512_shuffle_i64x2::<0x44>(v[0], v[1]), _mm512_shuffle_i64x2::<0xEE>(v[0], v[1]));
    let p23 = _mm512_add_epi32(_mm512_shuffle_i64x2::<0x44>(v[2], v[3]), _mm512_shuffle_i64x2::<0xEE>(v[2], v[3]));
    // Lane r: four partial sums of v[r].
    let q = _mm512_add_epi32(_mm512_shuffle_i64x2::<0x88>(p01, p23), _mm512_shuffle_i64x2::<0xDD>(p01, p23));
    let q = _mm512_add_epi32(q, _mm512_shuffle_epi32::<0x4E>(q));
    let q = _mm512_add_epi32(q, _mm512_shuffle_epi32::<0xB1>(q));
    _mm512_castsi512_si128(_mm512_permutexvar_epi32(
        _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
        q,
    ))
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
        let ys = by_position(y.qs.as_ptr() as *const u8, k.o.by_sigma);
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
        let ys = by_position(y.qs.as_ptr() as *const u8, k.o.by_sigma);
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

/// [`dot4_iq3_s`] over rows recoded at load ([`crate::packed::sign_order`];
/// rows `stride` bytes apart as in the file); equals it bit for bit.
///
/// # Safety
/// As for [`crate::quant::Dot4Fn`]; needs AVX-512 F/BW/VL/VNNI, VBMI and BITALG.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c,gfni")]
pub unsafe fn packed_dot4_iq3_s(n: usize, w: *const u8, stride: usize, a: *const u8, out: *mut f32) {
    // The row kernel's step over this call's activations (the row kernel
    // prepares them once for all its groups instead).
    let mut pre: Vec<Prepared> = Vec::with_capacity(n / 256);
    for i in 0..n / 256 {
        pre.push(prepare(q8k(a, i).qs.as_ptr() as *const u8));
    }
    group4(n, w, stride, a, pre.as_ptr(), out)
}

/// One Q8_K block's activations in the sign order ([`by_position`]) and
/// their negations, as the recoded kernels read them: 512 bytes.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Prepared {
    y: [__m512i; 4],
    neg: [__m512i; 4],
}

impl Prepared {
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
    #[inline]
    unsafe fn new(qs: *const u8, k: &Consts) -> Prepared {
        let y = by_position(qs, k.o.by_sigma);
        let z = _mm512_setzero_si512();
        Prepared {
            y,
            neg: [
                _mm512_sub_epi8(z, y[0]),
                _mm512_sub_epi8(z, y[1]),
                _mm512_sub_epi8(z, y[2]),
                _mm512_sub_epi8(z, y[3]),
            ],
        }
    }
}

super::prepared_rows::row_kernel!(
    /// Every four-row group of a recoded weight (`rows` rows, `row_bytes` apart)
    /// against `m` activation rows: the decode kernel. The activations are put
    /// in the sign order once per call ([`Prepared`], `m` × 512 bytes a block),
    /// not once per four rows as in [`packed_dot4_iq3_s`]: that work was a tenth
    /// of the four-row kernel. Each group meets every activation row while its
    /// bytes are in L1. Each output equals [`packed_dot4_iq3_s`]'s bit for bit,
    /// so batches and thread counts never change a result.
    ///
    /// # Safety
    /// As for [`crate::quant::Rows16Fn`]; needs AVX-512 F/BW/VL/VNNI, VBMI and BITALG.
    packed_rows_iq3_s,
    prepare,
    group4
);

/// [`Prepared::new`] for the row driver.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx2")]
unsafe fn prepare(qs: *const u8) -> Prepared {
    Prepared::new(qs, &consts())
}

/// One four-row group against one prepared activation row (its blocks at
/// `p`, scales from the Q8_K row at `a`). Not inlined: in the caller's loops
/// the compiler ran out of mask registers and spilled the sign masks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,avx2,fma,f16c,gfni")]
#[inline(never)]
unsafe fn group4(n: usize, w: *const u8, stride: usize, a: *const u8, p: *const Prepared, out: *mut f32) {
    let k = &consts();
    let mut sum = _mm_setzero_ps();
    for i in 0..n / 256 {
        let x: [*const u8; 4] = std::array::from_fn(|r| w.add(r * stride + i * 110));
        for xr in x {
            prefetch_block(xr, PREFETCH_AHEAD);
        }
        let ys = &*p.add(i);
        let b = [
            block_recoded(x[0], ys, k),
            block_recoded(x[1], ys, k),
            block_recoded(x[2], ys, k),
            block_recoded(x[3], ys, k),
        ];
        let isum = _mm_cvtepi32_ps(sum4(b));
        let d: [u64; 4] = x.map(|xr| (xr as *const u16).read_unaligned() as u64);
        let xd = super::avx2::f16x4(d[0] | d[1] << 16 | d[2] << 32 | d[3] << 48);
        // Lane r: row r's term of the scalar sum, `d_r·yd·isum_r` (no fused
        // multiply-add).
        sum = _mm_add_ps(sum, _mm_mul_ps(_mm_mul_ps(xd, _mm_set1_ps(q8k(a, i).d)), isum));
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
        let mut rng = super::super::XorShift(0x9E37_79B9_7F4A_7C15);
        let mut next = move || rng.next();
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
            let pw = crate::packed::pack(crate::DType::IQ3_S, 4, n, &w);
            let mut packed = [0f32; 4];
            unsafe { packed_dot4_iq3_s(n, pw.as_ptr(), row, ap, packed.as_mut_ptr()) };
            assert_eq!(packed.map(f32::to_bits), four.map(f32::to_bits), "recoded rows, {nb} blocks");
            for (r, got4) in four.iter().enumerate() {
                let wr = w[r * row..].as_ptr();
                let (want, got) = unsafe { (scalar(n, wr, ap), dot_iq3_s(n, wr, ap)) };
                assert_eq!(got.to_bits(), want.to_bits(), "row {r}, {nb} blocks: {got} vs {want}");
                assert_eq!(got4.to_bits(), want.to_bits(), "four-row, row {r}, {nb} blocks: {got4} vs {want}");
            }
        }
    }
}
