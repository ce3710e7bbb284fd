//! Q3_K super-blocks recoded as three planes of whole 3-bit codes, once at
//! load, with the values of each 16-value sub-block transposed into one word
//! lane, for the AVX2 decode kernel (`simd::avx2_q3k_rows`).
//!
//! Why planes: in the file layout a Q3_K code is two bits of `qs` and one of
//! `hmask`, so every 32 values cost the AVX2 kernel a shift and a mask for
//! each part and an `or` (about 4.5 µops). In planes a code is at most a
//! shift and a mask, and the two codes split across planes five µops: 19
//! µops per 256 values instead of ~36.
//!
//! Why transposed: in the file order a 32-value chunk spans two sub-blocks,
//! so each chunk's `vpmaddubsw` pairs needed their own scale words (a
//! `vpshufb`), a `vpmaddwd` and an add: 4 µops per chunk besides the codes.
//! Here word lane `s` (bytes `2s, 2s + 1`) of every chunk holds two values
//! of sub-block `s`, so the eight chunks' `vpmaddubsw` pairs add up in i16
//! (|Σ| ≤ 8·2·7·128 < 2¹⁵) and one `vpmaddwd` against the 16 scale words
//! finishes the block: 2 µops per chunk. The activations take the same
//! transpose once a call (`simd::avx2_q3k_rows`).
//!
//! Layout (110 bytes, the file block's size; `u` = code + 4, in 0..7, of
//! value `16·(l / 2) + 2c + l % 2` at byte `l` of chunk `c`):
//!
//! ```text
//! 0    B0[32]     u0 | u1 << 3 | (u6 & 3) << 6
//! 32   B1[32]     u2 | u3 << 3 | (u7 & 3) << 6
//! 64   B2[32]     u4 | u5 << 3 | (u6 >> 2) << 6 | (u7 >> 2) << 7
//! 96   scales[12] sub-block s's six-bit scale code (the file's `sc + 32`)
//!                 at bits 6s..6s + 6 of the twelve bytes, little-endian
//! 108  d          unchanged
//! ```
//!
//! Why the scales as one bit string: in the file a scale's low four bits
//! and its top two lie in different bytes, and the AVX2 kernel spent about
//! ten µops a block joining them. Here each scale lies in one 16-bit window
//! (bytes `6s / 8`, `6s / 8 + 1`, at bit `6s % 8`), so a `vpshufb` lays the
//! windows over the word lanes, a `vpmullw` by `2^(10 − 6s % 8)` lifts each
//! scale to the top and a `vpsrlw` by 10 brings it down alone: three µops.
//!
//! In the file, value `128h + 32j + l` has bits `2j..2j + 2` of `qs[32h + l]`
//! (at 32) and bit `4h + j` of `hmask[l]` (at 0).

/// Bytes of a Q3_K super-block.
pub const BLOCK_BYTES: usize = 110;

/// The file's chunk `v / 32` and byte `v % 32` of value `v`, for the
/// value at byte `l` of chunk `c` here (`v = 16·(l / 2) + 2c + l % 2`).
fn file_place(c: usize, l: usize) -> (usize, usize) {
    let v = 16 * (l / 2) + 2 * c + l % 2;
    (v / 32, v % 32)
}

/// One file-layout block `src` as planes into `dst` (both [`BLOCK_BYTES`]).
pub fn encode(src: &[u8], dst: &mut [u8]) {
    let (src, dst) = (&src[..BLOCK_BYTES], &mut dst[..BLOCK_BYTES]);
    for l in 0..32 {
        let u: [u8; 8] = std::array::from_fn(|c| {
            let (fc, fl) = file_place(c, l);
            let (h, j) = (fc / 4, fc % 4);
            (src[32 + 32 * h + fl] >> (2 * j) & 3) | (src[fl] >> fc & 1) << 2
        });
        dst[l] = u[0] | u[1] << 3 | (u[6] & 3) << 6;
        dst[32 + l] = u[2] | u[3] << 3 | (u[7] & 3) << 6;
        dst[64 + l] = u[4] | u[5] << 3 | (u[6] >> 2) << 6 | (u[7] >> 2) << 7;
    }
    dst[96..108].copy_from_slice(&pack_scales(src[96..108].try_into().expect("12 scale bytes")));
    dst[108..].copy_from_slice(&src[108..]);
}

/// The sixteen six-bit scale codes of a file block's `scales[12]`: low four
/// bits of code `s` from byte `s % 8` (low nibble for `s < 8`, high
/// otherwise), top two from bits `2·(s / 4)` of byte `8 + s % 4`.
fn file_scale_codes(sc: &[u8; 12]) -> [u8; 16] {
    std::array::from_fn(|s| {
        let lo = if s < 8 { sc[s] & 15 } else { sc[s - 8] >> 4 };
        let hi = sc[8 + s % 4] >> (2 * (s / 4)) & 3;
        lo | hi << 4
    })
}

/// Sixteen six-bit codes as one bit string: code `s` at bits `6s..6s + 6`
/// of twelve little-endian bytes (the Q4_K/Q5_K lanes reuse it).
pub fn codes_to_bits(codes: &[u8; 16]) -> [u8; 12] {
    let bits = codes.iter().enumerate().fold(0u128, |acc, (s, &c)| acc | ((c & 63) as u128) << (6 * s));
    bits.to_le_bytes()[..12].try_into().expect("12 bytes")
}

/// The inverse of [`codes_to_bits`].
pub fn bits_to_codes(packed: &[u8; 12]) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..12].copy_from_slice(packed);
    let bits = u128::from_le_bytes(b);
    std::array::from_fn(|s| (bits >> (6 * s)) as u8 & 63)
}

/// A file block's `scales[12]` as the planes' bit string (code `s` at bits
/// `6s..6s + 6`).
pub fn pack_scales(sc: &[u8; 12]) -> [u8; 12] {
    codes_to_bits(&file_scale_codes(sc))
}

/// The inverse of [`pack_scales`].
pub fn unpack_scales(packed: &[u8; 12]) -> [u8; 12] {
    let mut sc = [0u8; 12];
    for (s, c) in bits_to_codes(packed).into_iter().enumerate() {
        sc[s % 8] |= if s < 8 { c & 15 } else { (c & 15) << 4 };
        sc[8 + s % 4] |= (c >> 4) << (2 * (s / 4));
    }
    sc
}

/// The inverse of [`encode`].
pub fn decode(src: &[u8], dst: &mut [u8]) {
    let (src, dst) = (&src[..BLOCK_BYTES], &mut dst[..BLOCK_BYTES]);
    dst[..96].fill(0);
    for l in 0..32 {
        let (b0, b1, b2) = (src[l], src[32 + l], src[64 + l]);
        let u = [
            b0 & 7,
            b0 >> 3 & 7,
            b1 & 7,
            b1 >> 3 & 7,
            b2 & 7,
            b2 >> 3 & 7,
            b0 >> 6 | (b2 >> 6 & 1) << 2,
            b1 >> 6 | (b2 >> 7) << 2,
        ];
        for (c, &uc) in u.iter().enumerate() {
            let (fc, fl) = file_place(c, l);
            let (h, j) = (fc / 4, fc % 4);
            dst[32 + 32 * h + fl] |= (uc & 3) << (2 * j);
            dst[fl] |= (uc >> 2) << fc;
        }
    }
    dst[96..108].copy_from_slice(&unpack_scales(src[96..108].try_into().expect("12 scale bytes")));
    dst[108..].copy_from_slice(&src[108..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_inverts_encode() {
        for round in 0..50u64 {
            let src = crate::packed::test_bytes(0x9E37_79B9_7F4A_7C15u64 ^ round, BLOCK_BYTES);
            let (mut enc, mut dec) = (vec![0u8; BLOCK_BYTES], vec![0u8; BLOCK_BYTES]);
            encode(&src, &mut enc);
            decode(&enc, &mut dec);
            assert_eq!(dec, src);
        }
    }
}
