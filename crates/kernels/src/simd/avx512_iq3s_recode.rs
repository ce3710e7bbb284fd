//! IQ3_S blocks into and out of the sign order ([`crate::packed::sign_order`])
//! in vector code, where the CPU has what the recoded kernel needs (VBMI,
//! BITALG, GFNI: the only CPUs that pack IQ3_S).
//!
//! Why: the prefill GEMM reads recoded weights back in the file layout once
//! per call and block; the byte-table [`crate::packed::sign_order::decode`]
//! took ~5% of a pp512 there (8% slower prefill than the file layout). Here a
//! block is a `vpermb` of the indices, a `vpshufbitqmb` of their ninth bits,
//! and for the signs a byte permute and an 8 × 8 bit transpose per quadword
//! (`vgf2p8affineqb`), each way.

use super::avx512_iq3s_vbmi::{sign_masks, sign_order_consts};
use crate::packed::sign_order::{sigma, BLOCK_BYTES};
use std::arch::x86_64::*;
use std::sync::OnceLock;

const QS: usize = 2;
const QH: usize = 66;
const SIGNS: usize = 74;

/// Controls of the way back.
#[repr(C, align(64))]
struct Inverse {
    /// `vpermb` control: file entry `e` from lane `σ⁻¹(e)`.
    sigma_inv: [u8; 64],
    /// `vpermb` control taking the four masks to the transposed sign
    /// quadwords, each quadword's bytes reversed for the transpose back.
    masks_to_rows: [u8; 32],
}

fn inverse() -> &'static Inverse {
    static T: OnceLock<Inverse> = OnceLock::new();
    T.get_or_init(|| {
        let mut t = Inverse { sigma_inv: [0; 64], masks_to_rows: [0; 32] };
        for p in 0..64 {
            t.sigma_inv[sigma(p)] = p as u8;
        }
        // The forward permute put transposed byte 8q + 4h + j at mask byte
        // 8j + 2q + h; byte k of quadword q goes back reversed (7 − k).
        for q in 0..4 {
            for k in 0..8 {
                let (h, j) = ((7 - k) / 4, (7 - k) % 4);
                t.masks_to_rows[8 * q + k] = (8 * j + 2 * q + h) as u8;
            }
        }
        t
    })
}

/// [`crate::packed::sign_order::encode`] of one block.
///
/// # Safety
/// AVX-512 F/BW/VL/VBMI/BITALG and GFNI; `src`, `dst`: [`BLOCK_BYTES`] each.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512bitalg,avx2,gfni")]
pub unsafe fn encode(src: *const u8, dst: *mut u8) {
    let o = sign_order_consts();
    copy_kept(src, dst);
    let idx = _mm512_permutexvar_epi8(o.sigma, _mm512_loadu_si512(src.add(QS) as *const _));
    _mm512_storeu_si512(dst.add(QS) as *mut _, idx);
    let qh = (src.add(QH) as *const u64).read_unaligned();
    let k8 = _mm512_bitshuffle_epi64_mask(_mm512_set1_epi64(qh as i64), o.sigma);
    (dst.add(QH) as *mut u64).write_unaligned(k8);
    let masks = sign_masks(_mm256_loadu_si256(src.add(SIGNS) as *const __m256i), &o);
    for (j, m) in masks.iter().enumerate() {
        (dst.add(SIGNS + 8 * j) as *mut u64).write_unaligned(*m);
    }
}

/// [`crate::packed::sign_order::decode`] of one block.
///
/// # Safety
/// As for [`encode`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512bitalg,avx2,gfni")]
pub unsafe fn decode(src: *const u8, dst: *mut u8) {
    let t = inverse();
    let inv = _mm512_load_si512(t.sigma_inv.as_ptr() as *const _);
    copy_kept(src, dst);
    let qs = _mm512_permutexvar_epi8(inv, _mm512_loadu_si512(src.add(QS) as *const _));
    _mm512_storeu_si512(dst.add(QS) as *mut _, qs);
    let qh = (src.add(QH) as *const u64).read_unaligned();
    let k8 = _mm512_bitshuffle_epi64_mask(_mm512_set1_epi64(qh as i64), inv);
    (dst.add(QH) as *mut u64).write_unaligned(k8);
    // Transposed byte k of quadword q (reversed) = bits `k` of the eight
    // sign bytes; transposing again with the reversed one-hot bytes gives
    // the sign bytes back (byte c bit d = transposed byte d bit 7 − c).
    let ctl = _mm256_loadu_si256(t.masks_to_rows.as_ptr() as *const __m256i);
    let rows = _mm256_permutexvar_epi8(ctl, _mm256_loadu_si256(src.add(SIGNS) as *const __m256i));
    let one_hot_rev = _mm256_set1_epi64x(0x0102_0408_1020_4080);
    let signs = _mm256_gf2p8affine_epi64_epi8::<0>(one_hot_rev, rows);
    _mm256_storeu_si256(dst.add(SIGNS) as *mut __m256i, signs);
}

/// `d` and the scales, which keep their bytes.
#[inline(always)]
unsafe fn copy_kept(src: *const u8, dst: *mut u8) {
    std::ptr::copy_nonoverlapping(src, dst, QS);
    std::ptr::copy_nonoverlapping(src.add(SIGNS + 32), dst.add(SIGNS + 32), BLOCK_BYTES - SIGNS - 32);
}

#[cfg(test)]
mod tests {
    use crate::packed::sign_order;

    /// Both ways equal the byte-table code on random blocks.
    #[test]
    fn vector_recoding_equals_scalar() {
        if !super::super::avx512_iq3s_vbmi::has_vbmi_bitalg() {
            eprintln!("skipped: no AVX-512 VBMI/BITALG/GFNI here");
            return;
        }
        let mut rng = super::super::XorShift(0x1234_5678_9ABC_DEF1);
        for _ in 0..100 {
            let src: Vec<u8> = (0..sign_order::BLOCK_BYTES).map(|_| rng.next() as u8).collect();
            let (mut want, mut got) = (vec![0u8; 110], vec![0u8; 110]);
            sign_order::encode(&src, &mut want);
            unsafe { super::encode(src.as_ptr(), got.as_mut_ptr()) };
            assert_eq!(got, want, "encode");
            let (mut back_want, mut back) = (vec![0u8; 110], vec![0u8; 110]);
            sign_order::decode(&want, &mut back_want);
            unsafe { super::decode(want.as_ptr(), back.as_mut_ptr()) };
            assert_eq!(back, back_want, "decode");
            assert_eq!(back, src);
        }
    }
}
