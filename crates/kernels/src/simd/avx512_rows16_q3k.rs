//! The Q3_K sixteen-row kernel with GFNI: each value's 3-bit code built in
//! its byte before one `vpdpbusd`, where the plain kernel
//! ([`super::avx512_rows16_k::rows16_q3_k`]) multiplies the low two bits and
//! the high bit in two and shifts both sums to a common scale per group.
//!
//! Why: Q3_K decode was the slowest of the K-quants' sixteen-row kernels
//! (`bench_matmul 2 1` in cache on the Intel VM: 30 GB/s against 39–48 for
//! Q2_K, Q4_K, Q6_K, IQ4_XS), close enough to the memory's speed that Q3_K_M
//! and Q2_K files (mostly Q3_K tensors) decoded at 81% of the bandwidth.
//! `vgf2p8affineqb` moves any bits of a byte to any positions (an 8 × 8 bit
//! matrix per byte): one picks the two low bits of value group `jb` from a
//! `qs` byte into bits 0–1, one the high bit of group `(h, jb)` from an
//! `hmask` byte into bit 2, and an OR gives `lo + 4·hi` (0..7). Per four
//! values and row: two affines, an OR and one `vpdpbusd` instead of two ANDs
//! and two `vpdpbusd`; per group one `vpdpwssd` (the group's sum fits an
//! i16) instead of two shifts, an add, a `vpmulld` and an add.
//!
//! Numerics: integers throughout, then the reference's float step, so rows
//! equal `quant::q3_k::vec_dot` bit for bit as the plain kernel's do (tests
//! compare the two directly and both against the reference).

use super::avx512_rows16_k::{
    bcast4, group_scale_sums, ld, prefetch_in_order, q3_k_scales, rows16_kernel, scaled_add, signed_pairs, ACTS,
    PREFETCH_AHEAD, Q8K_BYTES, Q8K_QS, ROWS,
};
use std::arch::x86_64::*;

/// Whether this CPU has GFNI (and `SHARDLM_GFNI` is not `0`).
pub fn has_gfni() -> bool {
    static GFNI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *GFNI.get_or_init(|| {
        is_x86_feature_detected!("gfni") && std::env::var("SHARDLM_GFNI").map_or(true, |v| v.trim() != "0")
    })
}

/// The `vgf2p8affineqb` matrix that moves input bit `from[d]` of every byte
/// to output bit `d` (`None`: output bit `d` is zero). Output bit `d` is the
/// parity of the input ANDed with the matrix's byte `7 − d`.
pub(super) fn bit_moves(from: [Option<u32>; 8]) -> i64 {
    let mut m = 0u64;
    for (d, f) in from.iter().enumerate() {
        if let Some(s) = f {
            m |= (1u64 << s) << (8 * (7 - d));
        }
    }
    m as i64
}

rows16_kernel!(
    /// [`super::avx512_rows16_k::rows16_q4_k`] for Q3_K on a CPU with GFNI,
    /// each result equal to `quant::q3_k::vec_dot`.
    rows16_q3_k_gfni,
    tile_q3_k,
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,gfni"
);

/// One group of sixteen Q3_K rows × `J` activation rows (`S` unused). The
/// lanes16 vectors of a 110-byte block: 0–7 `hmask`, 8–23 `qs`, 24–26 the
/// scale words, then the sixteen rows' `d` as a 32-byte tail. Value `128h +
/// 32jb + l` has low bits `(qs[32h + l] >> 2jb) & 3` and high bit
/// `(hmask[l] >> (4h + jb)) & 1`; its code is `lo + 4·hi − 4`, the `−4`
/// coming back out through Q8_K's `bsums` pairs.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,gfni")]
#[inline]
unsafe fn tile_q3_k<const J: usize, const S: usize>(
    nb: usize,
    w: *const u8,
    a: *const u8,
    a_stride: usize,
    y: *mut f32,
    y_stride: usize,
) {
    const BLOCK: usize = ROWS * 110;
    // Byte t of each dword to the high byte of its low word (the rest zero):
    // `vpsraw 8` then gives the word pair (sc, 0).
    let scale_words: [__m512i; 4] = std::array::from_fn(|t| {
        let d = |k: i32| 0x8080_0080u32 as i32 | (4 * k + t as i32) << 8;
        _mm512_broadcast_i32x4(_mm_setr_epi32(d(0), d(1), d(2), d(3)))
    });
    let pairs = signed_pairs();
    // lo_pick[jb]: bits 2jb, 2jb + 1 → 0, 1; hi_pick[4h + jb]: bit 4h + jb → 2.
    let lo_pick: [__m512i; 4] = std::array::from_fn(|jb| {
        let b = 2 * jb as u32;
        _mm512_set1_epi64(bit_moves([Some(b), Some(b + 1), None, None, None, None, None, None]))
    });
    let hi_pick: [__m512i; 8] = std::array::from_fn(|k| {
        _mm512_set1_epi64(bit_moves([None, None, Some(k as u32), None, None, None, None, None]))
    });
    let mut sums = [_mm512_setzero_ps(); J];
    for b in 0..nb {
        let x = w.add(b * BLOCK);
        let ahead = x.wrapping_add(PREFETCH_AHEAD);
        for l in 0..BLOCK.div_ceil(64) {
            prefetch_in_order(ahead.wrapping_add(64 * l));
        }
        let act: [*const u8; J] = std::array::from_fn(|j| a.add(j * a_stride + b * Q8K_BYTES));
        let (d, sv) = q3_k_scales(x);
        let mut sumi = [_mm512_setzero_si512(); J];
        for h in 0..2 {
            for jb in 0..4 {
                // [half of t][row]: groups 8h + 2jb and 8h + 2jb + 1.
                let mut acc = [[_mm512_setzero_si512(); J]; 2];
                for t in 0..8 {
                    let lo = _mm512_gf2p8affine_epi64_epi8::<0>(ld(x.add(64 * (8 + 8 * h + t))), lo_pick[jb]);
                    let hi = _mm512_gf2p8affine_epi64_epi8::<0>(ld(x.add(64 * t)), hi_pick[4 * h + jb]);
                    let code = _mm512_or_si512(lo, hi);
                    for j in 0..J {
                        let ya = bcast4(act[j].add(Q8K_QS + 128 * h + 32 * jb + 4 * t));
                        acc[t / 4][j] = _mm512_dpbusd_epi32(acc[t / 4][j], code, ya);
                    }
                }
                // A group's sum fits an i16 (|Σ code·a| ≤ 16·7·128), so with
                // the scale as the word pair (sc, 0) one `vpdpwssd` adds
                // sc·sum exactly: one uop for `vpmulld` (two) and `vpaddd`.
                for (half, acc) in acc.iter().enumerate() {
                    let g = 8 * h + 2 * jb + half;
                    let sc = _mm512_srai_epi16::<8>(_mm512_shuffle_epi8(sv[g / 4], scale_words[g % 4]));
                    for j in 0..J {
                        sumi[j] = _mm512_dpwssd_epi32(sumi[j], acc[j], sc);
                    }
                }
            }
        }
        // The codes' offset: 4 · Σ sc·B.
        let corr = group_scale_sums(&sv, &pairs, &act);
        for j in 0..J {
            let isum = _mm512_sub_epi32(sumi[j], _mm512_slli_epi32::<2>(corr[j]));
            sums[j] = scaled_add(sums[j], d, act[j], isum);
        }
    }
    for (j, s) in sums.iter().enumerate() {
        _mm512_storeu_ps(y.add(j * y_stride), *s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The GFNI kernel equals the plain one bit for bit (the plain one is
    /// checked against the reference by `tests/matmul.rs` on CPUs without
    /// GFNI, this one there on CPUs with it).
    #[test]
    fn gfni_equals_plain() {
        if !crate::isa::Isa::Avx512.is_supported() || !has_gfni() {
            eprintln!("no AVX-512 with GFNI here: the kernel is not reachable");
            return;
        }
        if !crate::packed::is_lanes16(crate::DType::Q3_K) {
            eprintln!("Q3_K packs as code planes at the requested level (SHARDLM_ISA=avx2)");
            return;
        }
        let (rows, n) = (32usize, 768usize);
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let rb = 110 * n / 256;
        let mut w: Vec<u8> = (0..rows * rb).map(|_| next() as u8).collect();
        // Small f16 `d`s (bytes 108..110 of each block), so sums stay finite.
        for blk in w.chunks_exact_mut(110) {
            let d = half::f16::from_f32(0.01 + (blk[0] as f32) / 2560.0);
            blk[108..110].copy_from_slice(&d.to_le_bytes());
        }
        let pw = crate::packed::pack(crate::DType::Q3_K, rows, n, &w);
        let m = 5;
        // Q8_K rows (d, 256 codes, 16 bsums per block) built here rather than
        // by `quant::q8_k::quantize`, whose codes stop at −127: −128 is the
        // edge of the i16 bound on a group's sum that the kernel relies on.
        let mut act = vec![0u8; m * (n / 256) * Q8K_BYTES];
        for blk in act.chunks_exact_mut(Q8K_BYTES) {
            blk[..4].copy_from_slice(&0.02f32.to_le_bytes());
            let qs: Vec<i8> = (0..256).map(|_| next() as i8).collect();
            for (k, q) in qs.iter().enumerate() {
                blk[4 + k] = *q as u8;
            }
            for g in 0..16 {
                let s: i16 = qs[16 * g..16 * g + 16].iter().map(|&q| q as i16).sum();
                blk[260 + 2 * g..262 + 2 * g].copy_from_slice(&s.to_le_bytes());
            }
        }
        let stride = (n / 256) * Q8K_BYTES;
        let (mut plain, mut gfni) = (vec![f32::NAN; m * rows], vec![f32::NAN; m * rows]);
        // SAFETY: AVX-512 and GFNI checked above; shapes as the kernels need.
        unsafe {
            super::super::avx512_rows16_k::rows16_q3_k(
                n,
                pw.as_ptr(),
                rb,
                rows,
                act.as_ptr(),
                stride,
                m,
                plain.as_mut_ptr(),
                rows,
            );
            rows16_q3_k_gfni(n, pw.as_ptr(), rb, rows, act.as_ptr(), stride, m, gfni.as_mut_ptr(), rows);
        }
        assert!(plain.iter().all(|v| v.is_finite()));
        assert_eq!(
            plain.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            gfni.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }
}
