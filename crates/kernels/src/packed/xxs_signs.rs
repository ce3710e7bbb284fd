//! IQ3_XXS super-blocks with their signs recoded as the four sign masks of
//! the AVX-512 VBMI decode kernel ([`crate::simd::avx512_iq3_vbmi`]), once at
//! load.
//!
//! Why: in the file, each eight values' signs are a 7-bit index into the
//! even-parity sign table (`KSIGNS`), four indices and a scale to a 32-bit
//! word. The kernel takes a block's 64 grid entries as four vectors, one per
//! magnitude (`w_j` byte `i` = magnitude `j` of entry `i`), so it needs mask
//! `j` bit `i` = the sign of value `4i + j`. From the file that took a
//! `vpmultishiftqb`, the parity lookups, a widening and four `vpshufbitqmb`
//! a block and row, all on the shuffle port the grid lookups already fill:
//! about a quarter of the kernel (8.1 → 5.9 ns a super-block-row in L2 with
//! the masks loaded instead). Recoded, three masks are `kmovq` loads, and the
//! fourth is rebuilt from half its bits by the parity rule in a few scalar
//! steps.
//!
//! The block keeps its 98 bytes (the file's size, so rows stay where they
//! were and tensor-parallel slices cut whole blocks as before): 224 sign
//! bits carry the information, since each group of eight has even parity.
//!
//! ```text
//! 0    d          f16, unchanged
//! 2    qs[64]     grid indices, unchanged
//! 66   m0, m1, m2 u64 each: bit i of m_j = the sign of value 4i + j
//! 90   m3 even    u32: bit g = bit 2g of m3 (the sign of value 8g + 3)
//! 94   scales     u32: nibble l = sub-block l's 4-bit scale
//! ```
//!
//! Bit `2g + 1` of `m3` (the sign of value `8g + 7`) is the parity of the
//! other seven signs of values `8g..8g + 8`: entries `2g` and `2g + 1`, bits
//! `2g` and `2g + 1` of each mask ([`mask3`]).

/// Bytes of an IQ3_XXS super-block.
pub const BLOCK_BYTES: usize = 98;
const AUX: usize = 66;
const M3_EVEN: usize = 90;
const SCALES: usize = 94;

/// Every fourth bit of `x` (bits 0, 4, … 60) packed into 16 bits.
const fn compact4(x: u64) -> u64 {
    let x = x & 0x1111_1111_1111_1111;
    let x = (x | x >> 3) & 0x0303_0303_0303_0303;
    let x = (x | x >> 6) & 0x000F_000F_000F_000F;
    let x = (x | x >> 12) & 0x0000_00FF_0000_00FF;
    (x | x >> 24) & 0xFFFF
}

/// The inverse of [`compact4`]: 16 bits to bits 0, 4, … 60.
const fn spread4(x: u64) -> u64 {
    let x = x & 0xFFFF;
    let x = (x | x << 24) & 0x0000_00FF_0000_00FF;
    let x = (x | x << 12) & 0x000F_000F_000F_000F;
    let x = (x | x << 6) & 0x0303_0303_0303_0303;
    (x | x << 3) & 0x1111_1111_1111_1111
}

/// The even bits of `x` packed into 32.
const fn compact2(x: u64) -> u64 {
    let x = x & 0x5555_5555_5555_5555;
    let x = (x | x >> 1) & 0x3333_3333_3333_3333;
    let x = (x | x >> 2) & 0x0F0F_0F0F_0F0F_0F0F;
    let x = (x | x >> 4) & 0x00FF_00FF_00FF_00FF;
    let x = (x | x >> 8) & 0x0000_FFFF_0000_FFFF;
    (x | x >> 16) & 0xFFFF_FFFF
}

/// The inverse of [`compact2`]: 32 bits to the even positions.
pub const fn spread2(x: u64) -> u64 {
    let x = x & 0xFFFF_FFFF;
    let x = (x | x << 16) & 0x0000_FFFF_0000_FFFF;
    let x = (x | x << 8) & 0x00FF_00FF_00FF_00FF;
    let x = (x | x << 4) & 0x0F0F_0F0F_0F0F_0F0F;
    let x = (x | x << 2) & 0x3333_3333_3333_3333;
    (x | x << 1) & 0x5555_5555_5555_5555
}

/// Mask 3 from masks 0–2 and its even bits spread to their places (`even`,
/// odd bits clear): each odd bit makes its eight values' signs even.
#[inline(always)]
pub fn mask3(m0: u64, m1: u64, m2: u64, even: u64) -> u64 {
    let x = m0 ^ m1 ^ m2 ^ even;
    even | ((x ^ x >> 1) & 0x5555_5555_5555_5555) << 1
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}

/// One file-layout block `src` recoded into `dst` (both [`BLOCK_BYTES`]).
pub fn encode(src: &[u8], dst: &mut [u8]) {
    let (src, dst) = (&src[..BLOCK_BYTES], &mut dst[..BLOCK_BYTES]);
    dst[..AUX].copy_from_slice(&src[..AUX]);
    // `s[q]` byte k: the signs of values 64q + 8k.. (group 8q + k), from
    // its 7-bit index and the parity bit.
    let mut s = [0u64; 4];
    let mut scales = 0u32;
    for l in 0..8 {
        let aux = u32_at(src, AUX + 4 * l);
        scales |= (aux >> 28) << (4 * l);
        for k in 0..4 {
            let idx = aux >> (7 * k) & 0x7F;
            let byte = idx | (idx.count_ones() & 1) << 7;
            let g = 4 * l + k;
            s[g / 8] |= u64::from(byte) << (8 * (g % 8));
        }
    }
    // Mask j bits 16q..16q + 16: every fourth bit of s[q] from bit j.
    let masks: [u64; 4] = std::array::from_fn(|j| (0..4).fold(0, |m, q| m | compact4(s[q] >> j) << (16 * q)));
    for (j, m) in masks[..3].iter().enumerate() {
        dst[AUX + 8 * j..AUX + 8 * j + 8].copy_from_slice(&m.to_le_bytes());
    }
    dst[M3_EVEN..M3_EVEN + 4].copy_from_slice(&(compact2(masks[3]) as u32).to_le_bytes());
    dst[SCALES..SCALES + 4].copy_from_slice(&scales.to_le_bytes());
}

/// The inverse of [`encode`]: a recoded block `src` back in the file layout.
pub fn decode(src: &[u8], dst: &mut [u8]) {
    let (src, dst) = (&src[..BLOCK_BYTES], &mut dst[..BLOCK_BYTES]);
    dst[..AUX].copy_from_slice(&src[..AUX]);
    let (m0, m1, m2) = (u64_at(src, AUX), u64_at(src, AUX + 8), u64_at(src, AUX + 16));
    let m3 = mask3(m0, m1, m2, spread2(u64::from(u32_at(src, M3_EVEN))));
    let scales = u32_at(src, SCALES);
    for q in 0..4 {
        let s = [m0, m1, m2, m3].iter().enumerate().fold(0u64, |s, (j, m)| s | spread4(m >> (16 * q)) << j);
        // Sub-blocks 2q and 2q + 1: four groups' indices (the parity bit
        // dropped) and the scale each.
        for h in 0..2 {
            let l = 2 * q + h;
            let mut aux = (scales >> (4 * l) & 0xF) << 28;
            for k in 0..4 {
                aux |= ((s >> (8 * (4 * h + k))) as u32 & 0x7F) << (7 * k);
            }
            dst[AUX + 4 * l..AUX + 4 * l + 4].copy_from_slice(&aux.to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bit_packing_round_trips() {
        for x in [0u64, u64::MAX, 0x0123_4567_89AB_CDEF, 0xF0F0_0F0F_1234_8765] {
            assert_eq!(compact4(spread4(x)), x & 0xFFFF);
            assert_eq!(compact2(spread2(x)), x & 0xFFFF_FFFF);
            assert_eq!(spread4(compact4(x)), x & 0x1111_1111_1111_1111);
        }
    }

    /// A file block whose sign indices are random (every block is valid:
    /// any 7-bit index has its parity bit). The round trip:
    /// `packed::tests::vector_recodings_equal_scalar`.
    #[test]
    fn masks_hold_the_signs() {
        for round in 0..50u64 {
            let src = crate::packed::test_bytes(0x9E37_79B9_7F4A_7C15u64 ^ round, BLOCK_BYTES);
            let mut enc = vec![0u8; BLOCK_BYTES];
            encode(&src, &mut enc);
            let (m0, m1, m2) = (u64_at(&enc, AUX), u64_at(&enc, AUX + 8), u64_at(&enc, AUX + 16));
            let masks = [m0, m1, m2, mask3(m0, m1, m2, spread2(u64::from(u32_at(&enc, M3_EVEN))))];
            let block: &crate::quant::iq3_xxs::BlockIq3Xxs = bytemuck::from_bytes(&src);
            for v in 0..256 {
                let aux = block.aux(v / 32);
                let idx = (aux >> (7 * (v % 32 / 8)) & 0x7F) as usize;
                let sign = crate::quant::iq_grids::KSIGNS[idx] >> (v % 8) & 1;
                assert_eq!(masks[v % 4] >> (v / 4) & 1, u64::from(sign), "value {v}");
            }
        }
    }
}
