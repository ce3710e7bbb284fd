//! AVX-512 BF16 kernels for FP8 E4M3 weights (64-value blocks, `{f32 d; u8 q[64]}`)
//! against f32 activations: one-row dot, four-row decode dot and 4 × 2 prefill tile.
//!
//! Why: the exact kernels of [`super::avx512_fp`] turn every 32 weights into f16
//! bits, widen them with two `vcvtph2ps` (two uops each) and run two f32 FMAs,
//! about four times the instructions per weight of Q8_0's `vpdpbusd`, so FP8
//! decode was compute-bound at one thread. Here `vdpbf16ps` does 32 products
//! and sums them into 16 f32 lanes in one instruction, and the weights reach
//! bf16 through byte lookups:
//!
//! * **Weights.** A code's magnitude (its low seven bits) indexes two 128-entry
//!   byte tables, the low and high bytes of the exact bf16 value of `E4M3(c)`
//!   (bf16 has E4M3's exponent range and more mantissa, so every code, the
//!   subnormals and ±0 included, is exact). One `vpermi2b` per table looks up
//!   all 64 codes of a block (it reads the low seven index bits, so the sign
//!   bit needs no mask), one `vpternlogd` ORs the sign into the high bytes, and
//!   `vpunpck{l,h}bw` pair the bytes into words. Per block and row that is one
//!   load, five shuffle/logic uops, two `vdpbf16ps` and one FMA by the scale.
//! * **Activations.** Rounded to bf16 (`vcvtne2ps2bf16`, nearest even) once per
//!   block and shared by the four weight rows (and, in the tile, the weight
//!   decode is shared by both activation rows). The unpacks leave the weights
//!   in the order `[0..8, 16..24, 32..40, 48..56]` and `[8..16, 24..32, …]`
//!   (within 128-bit lanes), so the converted activations are put in that
//!   order with two 128-bit lane shuffles.
//!
//! # Error bound
//! The weights are exact; each activation `a` becomes `a'` with
//! `|a' − a| ≤ 2⁻⁸·|a|` (bf16 keeps 8 significant bits, round to nearest), or
//! `|a'| = 0` for `|a| < 2⁻¹²⁶` (these instructions treat denormals as zero).
//! Products of two bf16 values are exact in f32; the sums are f32 as in the
//! scalar reference [`crate::quant::fp8::vec_dot`], in another order. So, with
//! `w` the dequantized weights and `u = 2⁻²⁴`,
//!
//! ```text
//! |dot − reference| ≤ (2⁻⁸ + 2·γ(n+2)·(1 + 2⁻⁸))·Σ|w·a| + 2⁻¹²⁶·(Σ|w| + 128·Σ_blocks|d|),
//! γ(k) = k·u / (1 − k·u)
//! ```
//!
//! (`γ(n+2)·Σ|w·a|` bounds the f32 rounding of any summation order of the `n`
//! products and the scaling, once for each side; the last term covers the
//! denormals `vdpbf16ps` flushes: activations below 2⁻¹²⁶, and up to 64
//! products and 64 partial sums per block before the scale). For a 2048-wide row
//! that is 2⁻⁸ + 2.4·10⁻⁴ ≈ 0.41% of Σ|w·a|; the activation rounding is an
//! unbiased relative error, so the typical error is far below the bound.
//! [`crate::quant::fp8::bf16_dot_bound`] computes it; the tests hold every
//! kernel here to it. (Q8_0 activations, for comparison, move by up to
//! `amax/254` per value, ≈ 1% of a typical value.)
//!
//! Requires AVX-512 BF16 and VBMI (`vpermt2b`). **Not dispatched by default**
//! ([`has_bf16`]: `SHARDLM_BF16=1` opts in): on the Xeon (AVX-512 BF16, VBMI,
//! FP16, no AMX) they were written on they run no faster than the exact
//! kernels of [`super::avx512_fp`], which stay the default. Measured (docs/LOWBIT.md,
//! "FP8 compute"): four rows × 2048 in L1, bf16 ≈ exact ≈ 2× Q8_0's time; with
//! the activations pre-converted and a shift-only weight conversion (both
//! tried) still the same, so neither conversion is the limit: `vdpbf16ps` is
//! (an 8-chain probe: about 3 FMAs' time each, against 1.3 for `vpdpbusd`),
//! and two of them per 64 weights and row already cost what Q8_0's whole
//! block does.

use super::avx2_rows::{prefetch, PREFETCH_ROWS};
use super::avx512::{reduce, store_tile};
use std::arch::x86_64::*;

/// Bits of the bf16 value of E4M3 code `c` (sign bit ignored): normals
/// `2^(e−7)·(1 + m/8)` have bf16 exponent field `e + 120` and mantissa `m << 4`;
/// subnormals `m·2⁻⁹` are normalised by hand. (0x7F, NaN, never reaches a kernel.)
const fn e4m3_bf16_bits(c: u8) -> u16 {
    let e = ((c >> 3) & 0xF) as u16;
    let m = (c & 7) as u16;
    if e != 0 {
        return ((e + 120) << 7) | (m << 4);
    }
    if m == 0 {
        return 0;
    }
    // m·2⁻⁹ with leading bit p: 2^(p−9)·(m / 2^p).
    let p = if m >= 4 {
        2
    } else if m >= 2 {
        1
    } else {
        0
    };
    ((127 - 9 + p) << 7) | ((m - (1 << p)) << (7 - p))
}

/// Byte `hi` (0: low, 1: high) of [`e4m3_bf16_bits`] for codes 0..128.
const fn byte_table(hi: bool) -> [u8; 128] {
    let mut t = [0u8; 128];
    let mut c = 0;
    while c < 128 {
        let b = e4m3_bf16_bits(c as u8);
        t[c] = if hi { (b >> 8) as u8 } else { b as u8 };
        c += 1;
    }
    t
}

static BF16_LO: [u8; 128] = byte_table(false);
static BF16_HI: [u8; 128] = byte_table(true);

/// Whether the bf16 kernels are dispatched: only on request (`SHARDLM_BF16=1`)
/// and where the CPU has AVX-512 BF16 and VBMI ([`super::avx512_fp4_vbmi::has_vbmi`],
/// so `SHARDLM_VBMI=0` turns them off too). Off by default: on the machine they
/// were written on they measured no faster than the exact kernels (module docs),
/// and they round the activations. Cached.
pub fn has_bf16() -> bool {
    static BF16: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *BF16.get_or_init(|| {
        std::env::var("SHARDLM_BF16").is_ok_and(|v| v.trim() == "1")
            && super::avx512_fp4_vbmi::has_vbmi()
            && is_x86_feature_detected!("avx512bf16")
    })
}

/// The four lookup tables: low bytes for codes 0..64 and 64..128, high bytes likewise.
#[derive(Clone, Copy)]
struct Tables {
    lo: [__m512i; 2],
    hi: [__m512i; 2],
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bf16,avx2,fma,f16c")]
#[inline]
unsafe fn tables() -> Tables {
    let (lo, hi) = (BF16_LO.as_ptr() as *const __m512i, BF16_HI.as_ptr() as *const __m512i);
    Tables {
        lo: [_mm512_loadu_si512(lo as *const _), _mm512_loadu_si512(lo.add(1) as *const _)],
        hi: [_mm512_loadu_si512(hi as *const _), _mm512_loadu_si512(hi.add(1) as *const _)],
    }
}

/// 64 E4M3 codes → two vectors of 32 bf16, in the lane order of the module docs.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bf16,avx2,fma,f16c")]
#[inline]
unsafe fn weights_bf16(z: __m512i, t: &Tables) -> [__m512bh; 2] {
    let lo = _mm512_permutex2var_epi8(t.lo[0], z, t.lo[1]);
    let hi = _mm512_permutex2var_epi8(t.hi[0], z, t.hi[1]);
    // hi | (z & 0x80): 0xF0 | (0xCC & 0xAA).
    let hi = _mm512_ternarylogic_epi32::<0xF8>(hi, z, _mm512_set1_epi8(i8::MIN));
    [
        std::mem::transmute::<__m512i, __m512bh>(_mm512_unpacklo_epi8(lo, hi)),
        std::mem::transmute::<__m512i, __m512bh>(_mm512_unpackhi_epi8(lo, hi)),
    ]
}

/// 64 f32 activations → bf16 (nearest even) in the order of [`weights_bf16`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bf16,avx2,fma,f16c")]
#[inline]
unsafe fn acts_bf16(a: *const f32) -> [__m512bh; 2] {
    // Words 0..32 = elements 0..32 (the second operand fills the low half).
    let c0 = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(a.add(16)), _mm512_loadu_ps(a));
    let c1 = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(a.add(48)), _mm512_loadu_ps(a.add(32)));
    let (c0, c1) = (std::mem::transmute::<__m512bh, __m512i>(c0), std::mem::transmute::<__m512bh, __m512i>(c1));
    // 128-bit lanes [c0.0, c0.2, c1.0, c1.2] and [c0.1, c0.3, c1.1, c1.3].
    [
        std::mem::transmute::<__m512i, __m512bh>(_mm512_shuffle_i64x2::<0b10_00_10_00>(c0, c1)),
        std::mem::transmute::<__m512i, __m512bh>(_mm512_shuffle_i64x2::<0b11_01_11_01>(c0, c1)),
    ]
}

/// `R` (1 or 4) FP8 rows at `w + r·stride` × `A` f32 activation rows, one
/// 64-value block per step. Every (row, activation row) pair runs the same
/// instructions whatever `R` and `A` are, so results are batch invariant.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bf16,avx2,fma,f16c")]
#[inline]
unsafe fn fp8_tile<const R: usize, const A: usize>(
    n: usize,
    w: *const u8,
    stride: usize,
    a: [*const f32; A],
) -> [[f32; 4]; A] {
    let nb = n / 64;
    // Prefetch distance: PREFETCH_ROWS rows down for the four-row kernels (as
    // the other ones), two rows ahead along a lone row.
    let ahead = if R == 1 { 2 * nb * 68 } else { PREFETCH_ROWS * stride };
    let t = tables();
    let mut acc = [[_mm512_setzero_ps(); R]; A];
    for b in 0..nb {
        let mut av = [[std::mem::transmute::<__m512, __m512bh>(_mm512_setzero_ps()); 2]; A];
        for j in 0..A {
            av[j] = acts_bf16(a[j].add(64 * b));
        }
        for r in 0..R {
            let x = w.add(r * stride + 68 * b);
            prefetch(x.wrapping_add(ahead));
            prefetch(x.wrapping_add(ahead + 64));
            let q = weights_bf16(_mm512_loadu_si512(x.add(4) as *const _), &t);
            let d = _mm512_set1_ps((x as *const f32).read_unaligned());
            for j in 0..A {
                let s = _mm512_dpbf16_ps(_mm512_setzero_ps(), q[0], av[j][0]);
                let s = _mm512_dpbf16_ps(s, q[1], av[j][1]);
                acc[j][r] = _mm512_fmadd_ps(s, d, acc[j][r]);
            }
        }
    }
    let mut outs = [[0f32; 4]; A];
    for j in 0..A {
        outs[j] = reduce(acc[j]);
    }
    outs
}

/// FP8 × f32 activations, one row (see [`crate::quant::DotFn`]).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, VBMI and BF16 CPU; pointers as for [`crate::quant::DotFn`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bf16,avx2,fma,f16c")]
pub unsafe fn dot_fp8(n: usize, w: *const u8, a: *const u8) -> f32 {
    fp8_tile::<1, 1>(n, w, 0, [a as *const f32])[0][0]
}

/// Four FP8 rows × one f32 activation row (see [`crate::quant::Dot4Fn`]).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, VBMI and BF16 CPU; pointers as for [`crate::quant::Dot4Fn`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bf16,avx2,fma,f16c")]
pub unsafe fn dot4_fp8(n: usize, w: *const u8, stride: usize, a: *const u8, out: *mut f32) {
    let r = fp8_tile::<4, 1>(n, w, stride, [a as *const f32]);
    std::ptr::copy_nonoverlapping(r[0].as_ptr(), out, 4);
}

/// Four FP8 rows × two f32 activation rows (see [`crate::quant::TileFn`]).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, VBMI and BF16 CPU; pointers as for [`crate::quant::TileFn`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bf16,avx2,fma,f16c")]
pub unsafe fn tile_fp8(n: usize, w: *const u8, stride: usize, a: *const u8, a_stride: usize, y: *mut f32, ys: usize) {
    let r = fp8_tile::<4, 2>(n, w, stride, [a as *const f32, a.add(a_stride) as *const f32]);
    store_tile(r, y, ys);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::minifloat::e4m3_to_f32;

    #[test]
    fn table_is_exact_bf16_of_every_code() {
        for c in 0u8..0x7F {
            let bits = (BF16_HI[c as usize] as u32) << 24 | (BF16_LO[c as usize] as u32) << 16;
            assert_eq!(f32::from_bits(bits), e4m3_to_f32(c), "code {c:#04x}");
        }
    }
}
