//! AVX-512 VNNI and AVX2 integer score kernels of [`crate::kv_int_dot`]:
//! quantized query rows against Q8_0 / Q4_0 key blocks. All compute the exact
//! integer sum `I_b = Σ q·k` per 32-value block and then the same float steps
//! as the scalar reference (`f32(I_0)·(dq_0·dk_0)`, then FMAs), so the scores
//! are bit-identical to it.
//!
//! Key bytes: key `j`'s blocks start at `k + j·sb` (`sb`: bytes between
//! consecutive keys); block `b` at `+ b·34` (Q8_0: f16 scale, 32 i8 codes) or
//! `+ b·18` (Q4_0: f16 scale, 16 bytes of nibbles). Scores go to
//! `s[r·s_stride + j]`, only for `j < n`.
//!
//! AVX-512: 16 keys at a time. Each key block is transposed so that a register
//! holds the same 4 code bytes of 16 keys (one key per 32-bit lane); a
//! `vpdpbusd` against the query's 4 bytes broadcast then adds 4 products to
//! each key's lane, with no horizontal sums. `vpdpbusd` multiplies u8 by i8:
//! the key codes are made unsigned (Q8_0: `k + 128`, a flip of the sign bit;
//! Q4_0: the stored nibble, `k + 8`) and the accumulator starts at
//! `−128·Σq` (`−8·Σq`), the query block's precomputed code sum.
//! AVX2: 8 keys at a time, `maddubs` (u8 × i8 → pairs of i16) and `madd` with
//! ones (→ i32), one register per key, then a horizontal-add tree to 8 sums.
//! Q8_0 uses `|k|` × `q·sign(k)` (no saturation: `2·128·127 < 2^15`); Q4_0 the
//! nibble (`0..=15`) × `q`, corrected by `−8·Σq`.

use crate::kv_int_dot::QuantQuery;
use std::arch::x86_64::*;

/// Mask of the first `m` (≤ 16) lanes.
#[inline(always)]
fn lanes(m: usize) -> u16 {
    ((1u32 << m) - 1) as u16
}

/// Writes one block's contribution for row `r` (16 lanes at `out`):
/// `f32(acc)·(dq·dk)`, a product for the first block and an FMA onto the
/// stored partial score after it.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn emit16(acc: __m512i, dq: f32, dk: __m512, first: bool, out: *mut f32, mask: u16) {
    let t = _mm512_mul_ps(_mm512_set1_ps(dq), dk);
    let f = _mm512_cvtepi32_ps(acc);
    let v = if first { _mm512_mul_ps(f, t) } else { _mm512_fmadd_ps(f, t, _mm512_maskz_loadu_ps(mask, out)) };
    _mm512_mask_storeu_ps(out, mask, v);
}

/// The 16 keys' block scales (f16 at `blk + j·sb`) as f32; lanes outside `mask` are 0.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn scales16(blk: *const u8, offsets: __m512i, mask: u16) -> __m512 {
    // Each gathered dword is the scale and the first code byte; keep the low half.
    let bits = _mm512_mask_i32gather_epi32::<1>(_mm512_setzero_si512(), mask, offsets, blk as *const i32);
    _mm512_cvtph_ps(_mm512_cvtepi32_epi16(bits))
}

/// `j · sb` for lanes `j = 0..16`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn key_offsets(sb: usize) -> __m512i {
    let j = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    _mm512_mullo_epi32(j, _mm512_set1_epi32(sb as i32))
}

/// 8 code dwords of keys `lo` and `hi` (codes at `p + j·sb`) in the two
/// halves of a register; keys not in `mask` read as zeros (masked loads never fault).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn pair(p: *const u8, sb: usize, lo: usize, hi: usize, mask: u16) -> __m512i {
    let m = |j: usize| if (mask >> j) & 1 == 1 { 0xFF } else { 0 };
    let a = _mm256_maskz_loadu_epi32(m(lo), p.wrapping_add(lo * sb) as *const i32);
    let b = _mm256_maskz_loadu_epi32(m(hi), p.wrapping_add(hi * sb) as *const i32);
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b)
}

/// The 32 code bytes of 16 keys (at `p + j·sb`), sign bit flipped (`k + 128`
/// as u8) and transposed: `z[g]` lane `j` = bytes `4g..4g+4` of key `j`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn transpose_q8(p: *const u8, sb: usize, mask: u16) -> [__m512i; 8] {
    let flip = _mm512_set1_epi8(i8::MIN);
    // a[i] = [key i | key i+4] (i < 4), [key i+4 | key i+8] (i ≥ 4): 128-bit
    // lanes (key lo d0..3, key lo d4..7, key hi d0..3, key hi d4..7).
    let mut a = [_mm512_setzero_si512(); 8];
    for i in 0..4 {
        a[i] = _mm512_xor_si512(pair(p, sb, i, i + 4, mask), flip);
        a[i + 4] = _mm512_xor_si512(pair(p, sb, i + 8, i + 12, mask), flip);
    }
    let mut z = [_mm512_setzero_si512(); 8];
    // Within 128-bit lanes: a 4×4 transpose of each group of four registers,
    // so that x[g] lanes are (keys 0-3 dg, keys 0-3 d(g+4), keys 4-7 dg, keys 4-7 d(g+4)).
    for (half, out) in [(0, 0), (4, 1)] {
        let (a0, a1, a2, a3) = (a[half], a[half + 1], a[half + 2], a[half + 3]);
        let (l01, h01) = (_mm512_unpacklo_epi32(a0, a1), _mm512_unpackhi_epi32(a0, a1));
        let (l23, h23) = (_mm512_unpacklo_epi32(a2, a3), _mm512_unpackhi_epi32(a2, a3));
        let x = [
            _mm512_unpacklo_epi64(l01, l23),
            _mm512_unpackhi_epi64(l01, l23),
            _mm512_unpacklo_epi64(h01, h23),
            _mm512_unpackhi_epi64(h01, h23),
        ];
        // Park them in z: keys 0-7 in z[0..4], keys 8-15 in z[4..8] for now.
        for g in 0..4 {
            z[4 * out + g] = x[g];
        }
    }
    let mut t = [_mm512_setzero_si512(); 8];
    for g in 0..4 {
        let (x, y) = (z[g], z[4 + g]);
        // (x.0, x.2, y.0, y.2): dword g of keys 0..16; (x.1, x.3, y.1, y.3): dword g + 4.
        t[g] = _mm512_shuffle_i32x4::<0b10_00_10_00>(x, y);
        t[g + 4] = _mm512_shuffle_i32x4::<0b11_01_11_01>(x, y);
    }
    t
}

/// Q8_0 scores, AVX-512 VNNI (16 keys per step).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI CPU; `q.d % 32 == 0`; key `j < n`'s `q.d / 32` blocks
/// readable at `k + j·sb`; `s` valid for row `r < q.rows` at `r·s_stride + j`, `j < n`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn q8_0_scores_avx512(q: &QuantQuery, k: *const u8, sb: usize, n: usize, s: *mut f32, s_stride: usize) {
    let nb = q.blocks();
    let offsets = key_offsets(sb);
    let mut j0 = 0;
    while j0 < n {
        let mask = lanes((n - j0).min(16));
        let base = k.wrapping_add(j0 * sb);
        for b in 0..nb {
            let blk = base.wrapping_add(b * 34);
            let dk = scales16(blk, offsets, mask);
            let z = transpose_q8(blk.wrapping_add(2), sb, mask);
            for r in 0..q.rows {
                let qd = q.codes.as_ptr().add(r * q.d + b * 32) as *const i32;
                let mut acc = _mm512_set1_epi32(-128 * q.sums[r * nb + b]);
                for (g, zg) in z.iter().enumerate() {
                    acc = _mm512_dpbusd_epi32(acc, *zg, _mm512_set1_epi32(qd.add(g).read_unaligned()));
                }
                emit16(acc, q.scales[r * nb + b], dk, b == 0, s.add(r * s_stride + j0), mask);
            }
        }
        j0 += 16;
    }
}

/// The 16 bytes of nibbles of 16 keys (at `p + j·sb`), transposed: `z[g]` lane
/// `j` = bytes `4g..4g+4` of key `j` (low nibbles: values `4g..`, high: `16 + 4g..`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn transpose_q4(p: *const u8, sb: usize, mask: u16) -> [__m512i; 4] {
    let m = |j: usize| if (mask >> j) & 1 == 1 { 0xF } else { 0 };
    let load = |j: usize| _mm_maskz_loadu_epi32(m(j), p.wrapping_add(j * sb) as *const i32);
    // a[i] 128-bit lane L = key 4L + i.
    let mut a = [_mm512_setzero_si512(); 4];
    for (i, ai) in a.iter_mut().enumerate() {
        let v = _mm512_castsi128_si512(load(i));
        let v = _mm512_inserti32x4::<1>(v, load(4 + i));
        let v = _mm512_inserti32x4::<2>(v, load(8 + i));
        *ai = _mm512_inserti32x4::<3>(v, load(12 + i));
    }
    let (l01, h01) = (_mm512_unpacklo_epi32(a[0], a[1]), _mm512_unpackhi_epi32(a[0], a[1]));
    let (l23, h23) = (_mm512_unpacklo_epi32(a[2], a[3]), _mm512_unpackhi_epi32(a[2], a[3]));
    [
        _mm512_unpacklo_epi64(l01, l23),
        _mm512_unpackhi_epi64(l01, l23),
        _mm512_unpacklo_epi64(h01, h23),
        _mm512_unpackhi_epi64(h01, h23),
    ]
}

/// Q4_0 scores, AVX-512 VNNI (16 keys per step).
///
/// # Safety
/// As [`q8_0_scores_avx512`], with 18-byte blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn q4_0_scores_avx512(q: &QuantQuery, k: *const u8, sb: usize, n: usize, s: *mut f32, s_stride: usize) {
    let nb = q.blocks();
    let offsets = key_offsets(sb);
    let low = _mm512_set1_epi8(0x0F);
    let mut j0 = 0;
    while j0 < n {
        let mask = lanes((n - j0).min(16));
        let base = k.wrapping_add(j0 * sb);
        for b in 0..nb {
            let blk = base.wrapping_add(b * 18);
            let dk = scales16(blk, offsets, mask);
            let z = transpose_q4(blk.wrapping_add(2), sb, mask);
            let lo = z.map(|v| _mm512_and_si512(v, low));
            let hi = z.map(|v| _mm512_and_si512(_mm512_srli_epi16::<4>(v), low));
            for r in 0..q.rows {
                let qd = q.codes.as_ptr().add(r * q.d + b * 32) as *const i32;
                let mut acc = _mm512_set1_epi32(-8 * q.sums[r * nb + b]);
                for g in 0..4 {
                    acc = _mm512_dpbusd_epi32(acc, lo[g], _mm512_set1_epi32(qd.add(g).read_unaligned()));
                    acc = _mm512_dpbusd_epi32(acc, hi[g], _mm512_set1_epi32(qd.add(4 + g).read_unaligned()));
                }
                emit16(acc, q.scales[r * nb + b], dk, b == 0, s.add(r * s_stride + j0), mask);
            }
        }
        j0 += 16;
    }
}

/// Lane `j` = the sum of the 8 lanes of `v[j]`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn reduce8(v: &[__m256i; 8]) -> __m256i {
    let h0 = _mm256_hadd_epi32(v[0], v[1]);
    let h1 = _mm256_hadd_epi32(v[2], v[3]);
    let h2 = _mm256_hadd_epi32(v[4], v[5]);
    let h3 = _mm256_hadd_epi32(v[6], v[7]);
    // 128-bit lanes: (v0..v3 partial sums of elements 0-3 | of elements 4-7).
    let g0 = _mm256_hadd_epi32(h0, h1);
    let g1 = _mm256_hadd_epi32(h2, h3);
    _mm256_add_epi32(_mm256_permute2x128_si256::<0x20>(g0, g1), _mm256_permute2x128_si256::<0x31>(g0, g1))
}

/// The AVX2 counterpart of [`emit16`] for 8 keys (`m` of them valid).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn emit8(acc: __m256i, dq: f32, dk: __m256, first: bool, out: *mut f32, m: usize) {
    let t = _mm256_mul_ps(_mm256_set1_ps(dq), dk);
    let f = _mm256_cvtepi32_ps(acc);
    let keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(m as i32), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    let v = if first { _mm256_mul_ps(f, t) } else { _mm256_fmadd_ps(f, t, _mm256_maskload_ps(out, keep)) };
    _mm256_maskstore_ps(out, keep, v);
}

/// The block scales of keys `0..m` (f16 at `blk + j·sb`) as f32; the rest 0.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn scales8(blk: *const u8, sb: usize, m: usize) -> __m256 {
    let mut bits = [0u16; 8];
    for (j, x) in bits.iter_mut().enumerate().take(m) {
        *x = (blk.add(j * sb) as *const u16).read_unaligned();
    }
    _mm256_cvtph_ps(_mm_loadu_si128(bits.as_ptr() as *const __m128i))
}

/// Q8_0 scores, AVX2 (8 keys per step).
///
/// # Safety
/// AVX2+FMA+F16C CPU; otherwise as [`q8_0_scores_avx512`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q8_0_scores_avx2(q: &QuantQuery, k: *const u8, sb: usize, n: usize, s: *mut f32, s_stride: usize) {
    let nb = q.blocks();
    let ones = _mm256_set1_epi16(1);
    let mut j0 = 0;
    while j0 < n {
        let m = (n - j0).min(8);
        let base = k.add(j0 * sb);
        for b in 0..nb {
            let blk = base.add(b * 34);
            let dk = scales8(blk, sb, m);
            let mut kc = [_mm256_setzero_si256(); 8];
            for (j, x) in kc.iter_mut().enumerate().take(m) {
                *x = _mm256_loadu_si256(blk.add(j * sb + 2) as *const __m256i);
            }
            let ka = kc.map(|x| _mm256_abs_epi8(x));
            for r in 0..q.rows {
                let qv = _mm256_loadu_si256(q.codes.as_ptr().add(r * q.d + b * 32) as *const __m256i);
                let mut v = [_mm256_setzero_si256(); 8];
                for j in 0..8 {
                    // |k| · (q·sign k) = q·k, pairs summed in i16, then in i32.
                    v[j] = _mm256_madd_epi16(_mm256_maddubs_epi16(ka[j], _mm256_sign_epi8(qv, kc[j])), ones);
                }
                emit8(reduce8(&v), q.scales[r * nb + b], dk, b == 0, s.add(r * s_stride + j0), m);
            }
        }
        j0 += 8;
    }
}

/// Q4_0 scores, AVX2 (8 keys per step).
///
/// # Safety
/// As [`q8_0_scores_avx2`], with 18-byte blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q4_0_scores_avx2(q: &QuantQuery, k: *const u8, sb: usize, n: usize, s: *mut f32, s_stride: usize) {
    let nb = q.blocks();
    let ones = _mm256_set1_epi16(1);
    let low = _mm_set1_epi8(0x0F);
    let mut j0 = 0;
    while j0 < n {
        let m = (n - j0).min(8);
        let base = k.add(j0 * sb);
        for b in 0..nb {
            let blk = base.add(b * 18);
            let dk = scales8(blk, sb, m);
            // Nibbles as u8 codes 0..=15 in value order: (values 0..16 | values 16..32).
            let mut kc = [_mm256_setzero_si256(); 8];
            for (j, x) in kc.iter_mut().enumerate().take(m) {
                let raw = _mm_loadu_si128(blk.add(j * sb + 2) as *const __m128i);
                let (lo, hi) = (_mm_and_si128(raw, low), _mm_and_si128(_mm_srli_epi16::<4>(raw), low));
                *x = _mm256_set_m128i(hi, lo);
            }
            for r in 0..q.rows {
                let qv = _mm256_loadu_si256(q.codes.as_ptr().add(r * q.d + b * 32) as *const __m256i);
                let mut v = [_mm256_setzero_si256(); 8];
                for j in 0..8 {
                    v[j] = _mm256_madd_epi16(_mm256_maddubs_epi16(kc[j], qv), ones);
                }
                let acc = _mm256_add_epi32(reduce8(&v), _mm256_set1_epi32(-8 * q.sums[r * nb + b]));
                emit8(acc, q.scales[r * nb + b], dk, b == 0, s.add(r * s_stride + j0), m);
            }
        }
        j0 += 8;
    }
}
