//! Q4_K and Q5_K super-blocks recoded once at load for the AVX2 decode
//! kernels (`simd::avx2_k45_rows`): every 32-bit lane of a code vector holds
//! four values of one sub-block, and the scales are one bit string.
//!
//! Why: in the file a code vector (32 bytes of low or high nibbles) is one
//! whole 32-value sub-block, so each of a block's eight `vpmaddubsw` needs
//! its own scale words: a `vpshufb`, a `vpmaddwd` and an add per vector,
//! about 58 µops a Q4_K super-block-row, and the AMD EPYC (Zen 3) VM issues
//! about two vector µops a cycle: 10.4 ns a block in L2, 13.8 GB/s a core,
//! near each core's share of the memory bandwidth, so a Q4_K_M decode read
//! 74–85% of it and Q5_K_M 67–75%. Here dword `d` of every vector is
//! sub-block `d`, so the eight products add up in i16 (Q4_K: |Σ| ≤
//! 8·2·15·128 < 2¹⁵; Q5_K adds four at a time) and one `vpmaddwd` against
//! the scale words `[sc0, sc0, sc1, sc1, …]` finishes the block.
//!
//! Layout (the file block's size; Q5_K's offsets in brackets). Vector `k`
//! (0..8) is the low (`k` even) or high nibbles of chunk `k / 2`; its byte
//! `l` is value `4k + l % 4` of sub-block `l / 4`:
//!
//! ```text
//! 0        d, dmin    unchanged
//! 4        scales[12] the six-bit codes as one bit string: scale j at bits
//!                     6j..6j + 6, min j at 6(8 + j).. (Q3_K's planes' form,
//!                     decoded by a `vpshufb`, a `vpmullw` and a `vpsrlw`)
//! [16      qh[32]     bit k of byte l: the fifth bit of vector k's byte l]
//! 16 [48]  qs[128]    chunk c, byte l: vector 2c's byte l | vector 2c + 1's << 4
//! ```
//!
//! In the file, value `p` of sub-block `j` is nibble `j % 2` of byte `p` of
//! chunk `j / 2` (and bit `j` of `qh[p]`): the same rule with `(j, p)` in
//! place of `(k, l)`, so the codes' recoding is its own inverse (a
//! transpose of 8 × 8 four-byte groups).

use crate::quant::q4_k::{pack_scales_mins, scales_mins};

/// Bytes of a Q4_K super-block.
pub const Q4K_BYTES: usize = 144;
/// Bytes of a Q5_K super-block.
pub const Q5K_BYTES: usize = 176;

/// The file's scales (`scales_mins` order) as the bit string.
pub(crate) fn scales_to_bits(sc: &[u8; 12]) -> [u8; 12] {
    let (s, m) = scales_mins(sc);
    let codes: [u8; 16] = std::array::from_fn(|c| if c < 8 { s[c] } else { m[c - 8] });
    super::q3k_planes::codes_to_bits(&codes)
}

/// The inverse of [`scales_to_bits`].
pub(crate) fn bits_to_scales(bits: &[u8; 12]) -> [u8; 12] {
    let codes = super::q3k_planes::bits_to_codes(bits);
    pack_scales_mins(codes[..8].try_into().expect("8"), codes[8..].try_into().expect("8"))
}

/// The codes (and fifth bits) of `src` moved by the transpose into `dst`;
/// `dst`'s code bytes are overwritten.
fn transpose_codes<const Q5: bool>(src: &[u8], dst: &mut [u8]) {
    let qs = if Q5 { 48 } else { 16 };
    dst[qs..qs + 128].fill(0);
    if Q5 {
        dst[16..48].fill(0);
    }
    for k in 0..8 {
        for l in 0..32 {
            let (j, p) = (l / 4, 4 * k + l % 4);
            let q = src[qs + 32 * (j / 2) + p] >> (4 * (j % 2)) & 15;
            dst[qs + 32 * (k / 2) + l] |= q << (4 * (k % 2));
            if Q5 {
                dst[16 + l] |= (src[16 + p] >> j & 1) << k;
            }
        }
    }
}

fn encode<const Q5: bool>(src: &[u8], dst: &mut [u8]) {
    dst[..4].copy_from_slice(&src[..4]);
    dst[4..16].copy_from_slice(&scales_to_bits(src[4..16].try_into().expect("12 scale bytes")));
    transpose_codes::<Q5>(src, dst);
}

fn decode<const Q5: bool>(src: &[u8], dst: &mut [u8]) {
    dst[..4].copy_from_slice(&src[..4]);
    dst[4..16].copy_from_slice(&bits_to_scales(src[4..16].try_into().expect("12 scale bytes")));
    transpose_codes::<Q5>(src, dst);
}

/// One file-layout Q4_K block `src` recoded into `dst` (both [`Q4K_BYTES`]).
pub fn encode_q4k(src: &[u8], dst: &mut [u8]) {
    encode::<false>(&src[..Q4K_BYTES], &mut dst[..Q4K_BYTES])
}

/// The inverse of [`encode_q4k`].
pub fn decode_q4k(src: &[u8], dst: &mut [u8]) {
    decode::<false>(&src[..Q4K_BYTES], &mut dst[..Q4K_BYTES])
}

/// One file-layout Q5_K block `src` recoded into `dst` (both [`Q5K_BYTES`]).
pub fn encode_q5k(src: &[u8], dst: &mut [u8]) {
    encode::<true>(&src[..Q5K_BYTES], &mut dst[..Q5K_BYTES])
}

/// The inverse of [`encode_q5k`].
pub fn decode_q5k(src: &[u8], dst: &mut [u8]) {
    decode::<true>(&src[..Q5K_BYTES], &mut dst[..Q5K_BYTES])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_inverts_encode() {
        for (bb, enc, dec) in [
            (Q4K_BYTES, encode_q4k as fn(&[u8], &mut [u8]), decode_q4k as fn(&[u8], &mut [u8])),
            (Q5K_BYTES, encode_q5k, decode_q5k),
        ] {
            for round in 0..50u64 {
                let src = crate::packed::test_bytes(0x2545_F491_4F6C_DD1Du64 ^ round, bb);
                let (mut e, mut d) = (vec![0u8; bb], vec![0u8; bb]);
                enc(&src, &mut e);
                dec(&e, &mut d);
                assert_eq!(d, src, "{bb}-byte blocks");
            }
        }
    }

    /// Recoded value `4k + l % 4` of sub-block `l / 4` sits at vector `k`,
    /// byte `l`: check one value against the file's dequantization order.
    #[test]
    fn values_land_in_their_lanes() {
        let mut src = vec![0u8; Q5K_BYTES];
        // Sub-block 5, value 9: file chunk 2, high nibble of byte 9; fifth
        // bit 5 of qh[9].
        src[48 + 64 + 9] = 0xB0;
        src[16 + 9] = 1 << 5;
        let mut dst = vec![0u8; Q5K_BYTES];
        encode_q5k(&src, &mut dst);
        // Vector k = 9 / 4 = 2 (chunk 1, low nibbles), byte l = 4·5 + 1 = 21.
        assert_eq!(dst[48 + 32 + 21], 0x0B);
        assert_eq!(dst[16 + 21], 1 << 2);
        assert_eq!(dst[48..].iter().filter(|&&b| b != 0).count(), 1);
    }
}
