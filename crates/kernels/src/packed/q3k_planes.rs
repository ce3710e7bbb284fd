//! Q3_K super-blocks recoded as three planes of whole 3-bit codes, once at
//! load, for the AVX2 decode kernel (`simd::avx2_kq4::planes_dot4_q3_k`).
//!
//! Why: in the file layout a Q3_K code is two bits of `qs` and one of
//! `hmask`, so every 32 values cost the AVX2 kernel a shift and a mask for
//! each part and an `or` (about 4.5 µops, as many as the products and the
//! scale around them). In planes a code is at most a shift and a mask, and
//! the two codes split across planes five µops: 19 µops per 256 values
//! instead of ~36. In L2 (`bench_kdot 256 2048`, plain AVX2) 8.6–9.1 →
//! 6.8–7.3 ns a super-block-row (1.27×). The AVX-512 level reads Q3_K in
//! sixteen-row lanes instead (`Packing::Lanes16`); which one a process packs
//! is the requested level's ([`crate::packed::layout`]).
//!
//! Layout (110 bytes, the file block's size; `u` = code + 4, in 0..7, of
//! value `32c + l`):
//!
//! ```text
//! 0    B0[32]     u0 | u1 << 3 | (u6 & 3) << 6
//! 32   B1[32]     u2 | u3 << 3 | (u7 & 3) << 6
//! 64   B2[32]     u4 | u5 << 3 | (u6 >> 2) << 6 | (u7 >> 2) << 7
//! 96   scales[12] unchanged
//! 108  d          unchanged
//! ```
//!
//! In the file, value `128h + 32j + l` has bits `2j..2j + 2` of `qs[32h + l]`
//! (at 32) and bit `4h + j` of `hmask[l]` (at 0): chunk `c = 4h + j`.

/// Bytes of a Q3_K super-block.
pub const BLOCK_BYTES: usize = 110;

/// One file-layout block `src` as planes into `dst` (both [`BLOCK_BYTES`]).
pub fn encode(src: &[u8], dst: &mut [u8]) {
    let (src, dst) = (&src[..BLOCK_BYTES], &mut dst[..BLOCK_BYTES]);
    for l in 0..32 {
        let u: [u8; 8] = std::array::from_fn(|c| {
            let (h, j) = (c / 4, c % 4);
            (src[32 + 32 * h + l] >> (2 * j) & 3) | (src[l] >> c & 1) << 2
        });
        dst[l] = u[0] | u[1] << 3 | (u[6] & 3) << 6;
        dst[32 + l] = u[2] | u[3] << 3 | (u[7] & 3) << 6;
        dst[64 + l] = u[4] | u[5] << 3 | (u[6] >> 2) << 6 | (u[7] >> 2) << 7;
    }
    dst[96..].copy_from_slice(&src[96..]);
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
            let (h, j) = (c / 4, c % 4);
            dst[32 + 32 * h + l] |= (uc & 3) << (2 * j);
            dst[l] |= (uc >> 2) << c;
        }
    }
    dst[96..].copy_from_slice(&src[96..]);
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
