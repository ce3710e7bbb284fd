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
//! Layout (the file block's size). Code vector `k` (0..8), byte `l`, is
//! value `4k + l % 4` of sub-block `l / 4`; chunk `c` holds vectors `2c`
//! and `2c + 1`:
//!
//! ```text
//! Q4_K
//! 0    d, dmin    unchanged
//! 4    scales[12] the six-bit codes as one bit string: scale j at bits
//!                 6j..6j + 6, min j at 6(8 + j).. (Q3_K's planes' form,
//!                 decoded by a `vpshufb`, a `vpmullw` and a `vpsrlw`)
//! 16   qs[128]    chunk c, byte l: vector 2c's code | vector 2c + 1's << 4
//! Q5_K
//! 0    d, dmin, scales as Q4_K's
//! 16   top[32]    byte l, bits 2c..2c + 2: the top two bits of vector
//!                 2c + 1's code at byte l
//! 48   q[128]     chunk c, byte l: vector 2c's whole code (5 bits) | the
//!                 low three bits of vector 2c + 1's << 5
//! ```
//!
//! Why Q5_K so: with the file's fifth bits in `qh` each code vector cost a
//! shift, a mask and an `or` on top of its nibble's one or two µops (nine
//! a chunk); here the even vector is one mask and the odd one five µops
//! (six a chunk, 24 µops a block instead of 36).
//!
//! In the file, value `p` of sub-block `j` is nibble `j % 2` of byte `p` of
//! chunk `j / 2` (and bit `j` of `qh[p]`): the lanes' rule with `(j, p)` in
//! place of `(k, l)`, so the codes' move is its own inverse (a transpose of
//! 8 × 8 four-byte groups), and Q4_K's nibbles keep the file's packing.

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

/// A block's 256 codes as eight vectors of 32 (vector `v`, byte `b`).
type Codes = [[u8; 32]; 8];

/// The file's codes: vector `j` is sub-block `j` (nibble `j % 2` of chunk
/// `j / 2`, Q5_K's fifth bit `j` of `qh`).
fn file_codes<const Q5: bool>(src: &[u8]) -> Codes {
    let qs = if Q5 { 48 } else { 16 };
    std::array::from_fn(|j| {
        std::array::from_fn(|p| {
            let nib = src[qs + 32 * (j / 2) + p] >> (4 * (j % 2)) & 15;
            if Q5 {
                nib | (src[16 + p] >> j & 1) << 4
            } else {
                nib
            }
        })
    })
}

/// [`file_codes`]' inverse: `codes` into `dst`'s code bytes.
fn put_file_codes<const Q5: bool>(codes: &Codes, dst: &mut [u8]) {
    let qs = if Q5 { 48 } else { 16 };
    for c in 0..4 {
        for p in 0..32 {
            dst[qs + 32 * c + p] = codes[2 * c][p] & 15 | (codes[2 * c + 1][p] & 15) << 4;
        }
    }
    if Q5 {
        for p in 0..32 {
            dst[16 + p] = (0..8).fold(0, |h, j| h | (codes[j][p] >> 4 & 1) << j);
        }
    }
}

/// The lanes' codes (vector `k`, as the module docs lay them out).
fn lane_codes<const Q5: bool>(src: &[u8]) -> Codes {
    if !Q5 {
        // The same nibble rule as the file's.
        return file_codes::<false>(src);
    }
    std::array::from_fn(|k| {
        std::array::from_fn(|l| {
            let a = src[48 + 32 * (k / 2) + l];
            if k % 2 == 0 {
                a & 31
            } else {
                a >> 5 | (src[16 + l] >> (k - 1) & 3) << 3
            }
        })
    })
}

/// [`lane_codes`]' inverse.
fn put_lane_codes<const Q5: bool>(codes: &Codes, dst: &mut [u8]) {
    if !Q5 {
        return put_file_codes::<false>(codes, dst);
    }
    for l in 0..32 {
        let mut top = 0;
        for c in 0..4 {
            let (lo, hi) = (codes[2 * c][l], codes[2 * c + 1][l]);
            dst[48 + 32 * c + l] = lo | (hi & 7) << 5;
            top |= (hi >> 3) << (2 * c);
        }
        dst[16 + l] = top;
    }
}

/// The transpose between the file's vectors and the lanes' (its own
/// inverse): byte `l` of vector `k` is byte `4k + l % 4` of vector `l / 4`.
fn transpose(v: &Codes) -> Codes {
    std::array::from_fn(|k| std::array::from_fn(|l| v[l / 4][4 * k + l % 4]))
}

fn encode<const Q5: bool>(src: &[u8], dst: &mut [u8]) {
    dst[..4].copy_from_slice(&src[..4]);
    dst[4..16].copy_from_slice(&scales_to_bits(src[4..16].try_into().expect("12 scale bytes")));
    put_lane_codes::<Q5>(&transpose(&file_codes::<Q5>(src)), dst);
}

fn decode<const Q5: bool>(src: &[u8], dst: &mut [u8]) {
    dst[..4].copy_from_slice(&src[..4]);
    dst[4..16].copy_from_slice(&bits_to_scales(src[4..16].try_into().expect("12 scale bytes")));
    put_file_codes::<Q5>(&transpose(&lane_codes::<Q5>(src)), dst);
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
    /// byte `l`: check two values against the file's order.
    #[test]
    fn values_land_in_their_lanes() {
        let mut src = vec![0u8; Q5K_BYTES];
        // Sub-block 5, value 9: file chunk 2, high nibble of byte 9, fifth
        // bit 5 of qh[9] (code 27). Sub-block 2, value 13: chunk 1, low
        // nibble of byte 13 (code 6).
        src[48 + 64 + 9] = 0xB0;
        src[16 + 9] = 1 << 5;
        src[48 + 32 + 13] = 0x06;
        let mut dst = vec![0u8; Q5K_BYTES];
        encode_q5k(&src, &mut dst);
        // Code 27 (0b11011): vector k = 9 / 4 = 2 (even: whole code in chunk
        // 1), byte l = 4·5 + 1 = 21.
        assert_eq!(dst[48 + 32 + 21], 27);
        // Code 6: vector 13 / 4 = 3 (odd: chunk 1's top three bits and its
        // top bits at 2..4 of top[l]), byte 4·2 + 1 = 9.
        assert_eq!(dst[48 + 32 + 9], 6 << 5);
        assert_eq!(dst[16..].iter().filter(|&&b| b != 0).count(), 2);
    }
}
