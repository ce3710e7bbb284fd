//! IQ3_S super-blocks recoded in the *sign order* of the AVX-512 VBMI decode
//! kernel ([`crate::simd::avx512_iq3s_vbmi`]), once at load.
//!
//! Why: that kernel takes a block's 64 grid entries in the order [`sigma`]
//! (lane `p` holds entry `σ(p)`), where its sign masks come out as whole
//! bytes. Recoding each block in the file layout costs it, per block and row,
//! a `vpermb` of the indices, a `vpshufbitqmb` of their ninth bits, a bit
//! transpose of the signs and the permute and extracts that turn them into
//! four mask registers: about six µops on the shuffle port, which bounds the
//! kernel (its six `vpermt2b` lookups take twelve cycles there). Recoded, the
//! indices are one load and the ninth bits and the four sign masks are
//! `kmovq k, m64` loads straight from the weights: 1.17× in L2.
//!
//! The recoded block has the file block's size and field offsets (110 bytes):
//!
//! ```text
//! 0    d          f16, unchanged
//! 2    qs'[64]    qs'[p] = qs[σ(p)]
//! 66   qh'        u64, bit p = bit σ(p) of qh
//! 74   mask[4]    u64 each, bit p of mask j = sign of value 4σ(p) + j
//! 106  scales[4]  unchanged
//! ```
//!
//! Rows stay where they were, so any row range is a valid recoded matrix and
//! a tensor-parallel slice cuts whole blocks as before. [`decode`] (the
//! inverse) serves the prefill GEMM and the scalar kernels, which read the
//! file layout; it runs on byte tables, ~100 simple steps a block.

/// Bytes of an IQ3_S super-block.
pub const BLOCK_BYTES: usize = 110;
const QS: usize = 2;
const QH: usize = 66;
const SIGNS: usize = 74;

/// The sign order: lane `p = 16q + 8h + i` holds entry `16q + 2(7 − i) + h`.
/// In it an 8 × 8 bit transpose of each sign quadword (values `64q..64q + 64`)
/// leaves the signs of magnitude `j` of lanes `16q + 8h..+8` in one byte.
pub const fn sigma(p: usize) -> usize {
    let (q, h, i) = (p / 16, p / 8 % 2, p % 8);
    16 * q + 2 * (7 - i) + h
}

/// `SPREAD[h][b]`: the bits of byte `b` (lanes `i` of half `h` of a 16-lane
/// group) at the positions `4·(2(7 − i) + h)` of their values' first
/// magnitude in a sign quadword (add `j` for magnitude `j`).
static SPREAD: [[u64; 256]; 2] = spread_tables(4);

/// `QH_SPREAD[h][b]`: the same for ninth bits, at entry positions `2(7 − i) + h`.
static QH_SPREAD: [[u64; 256]; 2] = spread_tables(1);

/// Bit `i` of byte `b` at bit `step·(2(7 − i) + h)`, for both halves `h`.
const fn spread_tables(step: usize) -> [[u64; 256]; 2] {
    let mut t = [[0u64; 256]; 2];
    let mut h = 0;
    while h < 2 {
        let mut b = 0;
        while b < 256 {
            let mut i = 0;
            while i < 8 {
                if b >> i & 1 == 1 {
                    t[h][b] |= 1 << (step * (2 * (7 - i) + h));
                }
                i += 1;
            }
            b += 1;
        }
        h += 1;
    }
    t
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}

/// One file-layout block `src` recoded into `dst` (both [`BLOCK_BYTES`]).
pub fn encode(src: &[u8], dst: &mut [u8]) {
    let (src, dst) = (&src[..BLOCK_BYTES], &mut dst[..BLOCK_BYTES]);
    dst[..QS].copy_from_slice(&src[..QS]);
    dst[SIGNS + 32..].copy_from_slice(&src[SIGNS + 32..]);
    let qh = u64_at(src, QH);
    let mut qh2 = 0u64;
    let mut masks = [0u64; 4];
    for p in 0..64 {
        let e = sigma(p);
        dst[QS + p] = src[QS + e];
        qh2 |= (qh >> e & 1) << p;
        for (j, m) in masks.iter_mut().enumerate() {
            let v = 4 * e + j;
            *m |= u64::from(src[SIGNS + v / 8] >> (v % 8) & 1) << p;
        }
    }
    dst[QH..QH + 8].copy_from_slice(&qh2.to_le_bytes());
    for (j, m) in masks.iter().enumerate() {
        dst[SIGNS + 8 * j..SIGNS + 8 * j + 8].copy_from_slice(&m.to_le_bytes());
    }
}

/// The inverse of [`encode`]: a recoded block `src` back in the file layout.
pub fn decode(src: &[u8], dst: &mut [u8]) {
    let (src, dst) = (&src[..BLOCK_BYTES], &mut dst[..BLOCK_BYTES]);
    dst[..QS].copy_from_slice(&src[..QS]);
    dst[SIGNS + 32..].copy_from_slice(&src[SIGNS + 32..]);
    for p in 0..64 {
        dst[QS + sigma(p)] = src[QS + p];
    }
    let qh2 = src[QH..QH + 8].to_vec();
    let mut qh = [0u8; 8];
    let masks: [u64; 4] = std::array::from_fn(|j| u64_at(src, SIGNS + 8 * j));
    for q in 0..4 {
        // Lanes 16q..16q + 16: their two bytes in each recoded field.
        let w = QH_SPREAD[0][qh2[2 * q] as usize] | QH_SPREAD[1][qh2[2 * q + 1] as usize];
        qh[2 * q..2 * q + 2].copy_from_slice(&(w as u16).to_le_bytes());
        let mut f = 0u64;
        for (j, m) in masks.iter().enumerate() {
            let b = (m >> (16 * q)) as usize;
            f |= (SPREAD[0][b & 0xFF] | SPREAD[1][b >> 8 & 0xFF]) << j;
        }
        dst[SIGNS + 8 * q..SIGNS + 8 * q + 8].copy_from_slice(&f.to_le_bytes());
    }
    dst[QH..QH + 8].copy_from_slice(&qh);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sigma_is_a_permutation_within_sixteen_entries() {
        let mut seen = [false; 64];
        for p in 0..64 {
            assert_eq!(sigma(p) / 16, p / 16);
            seen[sigma(p)] = true;
        }
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn decode_inverts_encode() {
        for round in 0..50u64 {
            let src = crate::packed::test_bytes(0x2545_F491_4F6C_DD1Du64 ^ round, BLOCK_BYTES);
            let (mut enc, mut dec) = (vec![0u8; BLOCK_BYTES], vec![0u8; BLOCK_BYTES]);
            encode(&src, &mut enc);
            decode(&enc, &mut dec);
            assert_eq!(dec, src);
            // The masks hold the signs where the kernel reads them.
            for p in 0..64 {
                for j in 0..4 {
                    let v = 4 * sigma(p) + j;
                    let m = u64_at(&enc, SIGNS + 8 * j);
                    assert_eq!(m >> p & 1, u64::from(src[SIGNS + v / 8] >> (v % 8) & 1));
                }
            }
        }
    }
}
