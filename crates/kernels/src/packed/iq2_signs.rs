//! IQ2_XXS and IQ2_XS super-blocks with their signs recoded as the eight
//! sign masks of the AVX-512 VBMI decode kernels
//! ([`crate::simd::avx512_iq2_vbmi`]), once at load.
//!
//! Why: in the file, each grid entry's eight signs are a 7-bit index into
//! the even-parity sign table (`KSIGNS`), packed with the scales (IQ2_XXS) or
//! with the grid index (IQ2_XS). The kernels take two rows' 64 entries a
//! vector and one vector per value position `j` (`w_j` byte `p` = value `j`
//! of the entry at lane `p`), so they need mask `j` bit `p` = the sign of
//! that value: from the file a `vpmultishiftqb` or the byte split of the
//! index words, the parity (`vpopcntb`) and eight `vptestmb` a pair of
//! blocks, and IQ2_XS's two permutes splitting its words into index bytes
//! and high bytes. Recoded, the indices are one load, the masks plain words
//! (the eighth is the parity of the other seven) and the scales nibbles.
//!
//! Each block keeps its size (rows stay where they were; tensor-parallel
//! slices cut whole blocks as before):
//!
//! ```text
//! IQ2_XXS (66 bytes)                  IQ2_XS (74 bytes)
//! 0   d          f16, unchanged       0   d          f16, unchanged
//! 2   idx[32]    grid indices         2   idx[32]    grid index bits 0–7
//! 34  m0..m6     u32 each             34  hi         u32: bit e = index bit 8
//! 62  scales     u32, nibble l =      38  m0..m6     u32 each
//!                sub-block l's scale  66  scales[8]  unchanged
//! ```
//!
//! with bit `e` of `m_j` the sign of value `8e + j` (entry `e`, position
//! `j`), and `m7` = `m0 ^ … ^ m6` ([`mask7`]).

/// Bytes of an IQ2_XXS super-block.
pub const XXS_BYTES: usize = 66;
/// Bytes of an IQ2_XS super-block.
pub const XS_BYTES: usize = 74;

/// Offset of the recoded masks (`m0`) in each type's block.
pub const XXS_MASKS: usize = 34;
pub const XS_MASKS: usize = 38;

/// The eighth mask from the other seven: each entry's eight signs have even
/// parity.
#[inline(always)]
pub fn mask7(m: &[u32; 7]) -> u32 {
    m.iter().fold(0, |x, v| x ^ v)
}

/// The seven masks of 32 entries from their eight-sign bytes (`signs[e]` bit
/// `j` = the sign of value `8e + j`): per eight entries, bit `j` of each
/// byte gathered into one byte by a multiply (bit `8k` times bit `56 − 7k`
/// of the constant lands at `56 + k`; no two products meet below).
fn masks_of(signs: &[u8; 32]) -> [u32; 7] {
    let s: [u64; 4] = std::array::from_fn(|q| u64::from_le_bytes(signs[8 * q..8 * q + 8].try_into().expect("8")));
    std::array::from_fn(|j| {
        (0..4).fold(0u32, |m, q| {
            let bits = (s[q] >> j & 0x0101_0101_0101_0101).wrapping_mul(0x0102_0408_1020_4080) >> 56;
            m | (bits as u32) << (8 * q)
        })
    })
}

/// The eight-sign bytes of 32 entries back from the seven masks.
fn signs_of(m: &[u32; 7]) -> [u8; 32] {
    let m7 = mask7(m);
    std::array::from_fn(|e| (0..7).fold(((m7 >> e & 1) as u8) << 7, |s, j| s | ((m[j] >> e & 1) as u8) << j))
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}

fn put_masks(dst: &mut [u8], at: usize, m: &[u32; 7]) {
    for (j, v) in m.iter().enumerate() {
        dst[at + 4 * j..at + 4 * j + 4].copy_from_slice(&v.to_le_bytes());
    }
}

fn masks_at(src: &[u8], at: usize) -> [u32; 7] {
    std::array::from_fn(|j| u32_at(src, at + 4 * j))
}

/// The eight signs of a 7-bit `KSIGNS` index: the index and its parity bit.
fn ksign(idx: u32) -> u8 {
    let idx = idx & 0x7F;
    (idx | (idx.count_ones() & 1) << 7) as u8
}

/// One file-layout IQ2_XXS block `src` recoded into `dst` (both [`XXS_BYTES`]).
/// File: `d`, then per sub-block `l` four index bytes (entries `4l..4l + 4`)
/// and a word of four 7-bit sign indices and the scale (bits 28–31).
pub fn encode_xxs(src: &[u8], dst: &mut [u8]) {
    let (src, dst) = (&src[..XXS_BYTES], &mut dst[..XXS_BYTES]);
    dst[..2].copy_from_slice(&src[..2]);
    let mut signs = [0u8; 32];
    let mut scales = 0u32;
    for l in 0..8 {
        dst[2 + 4 * l..6 + 4 * l].copy_from_slice(&src[2 + 8 * l..6 + 8 * l]);
        let aux = u32_at(src, 6 + 8 * l);
        for k in 0..4 {
            signs[4 * l + k] = ksign(aux >> (7 * k));
        }
        scales |= (aux >> 28) << (4 * l);
    }
    put_masks(dst, XXS_MASKS, &masks_of(&signs));
    dst[62..66].copy_from_slice(&scales.to_le_bytes());
}

/// The inverse of [`encode_xxs`].
pub fn decode_xxs(src: &[u8], dst: &mut [u8]) {
    let (src, dst) = (&src[..XXS_BYTES], &mut dst[..XXS_BYTES]);
    dst[..2].copy_from_slice(&src[..2]);
    let signs = signs_of(&masks_at(src, XXS_MASKS));
    let scales = u32_at(src, 62);
    for l in 0..8 {
        dst[2 + 8 * l..6 + 8 * l].copy_from_slice(&src[2 + 4 * l..6 + 4 * l]);
        let aux =
            (0..4).fold((scales >> (4 * l) & 0xF) << 28, |a, k| a | u32::from(signs[4 * l + k] & 0x7F) << (7 * k));
        dst[6 + 8 * l..10 + 8 * l].copy_from_slice(&aux.to_le_bytes());
    }
}

/// One file-layout IQ2_XS block `src` recoded into `dst` (both [`XS_BYTES`]).
/// File: `d`, 32 words (bits 0–8 the grid index, 9–15 the sign index), the
/// sixteen 4-bit scales.
pub fn encode_xs(src: &[u8], dst: &mut [u8]) {
    let (src, dst) = (&src[..XS_BYTES], &mut dst[..XS_BYTES]);
    dst[..2].copy_from_slice(&src[..2]);
    let mut signs = [0u8; 32];
    let mut hi = 0u32;
    for e in 0..32 {
        let w = u16::from_le_bytes([src[2 + 2 * e], src[3 + 2 * e]]);
        dst[2 + e] = w as u8;
        hi |= u32::from(w >> 8 & 1) << e;
        signs[e] = ksign(u32::from(w >> 9));
    }
    dst[34..38].copy_from_slice(&hi.to_le_bytes());
    put_masks(dst, XS_MASKS, &masks_of(&signs));
    dst[66..74].copy_from_slice(&src[66..74]);
}

/// The inverse of [`encode_xs`].
pub fn decode_xs(src: &[u8], dst: &mut [u8]) {
    let (src, dst) = (&src[..XS_BYTES], &mut dst[..XS_BYTES]);
    dst[..2].copy_from_slice(&src[..2]);
    let signs = signs_of(&masks_at(src, XS_MASKS));
    let hi = u32_at(src, 34);
    for e in 0..32 {
        let w = u16::from(src[2 + e]) | ((hi >> e & 1) as u16) << 8 | u16::from(signs[e] & 0x7F) << 9;
        dst[2 + 2 * e..4 + 2 * e].copy_from_slice(&w.to_le_bytes());
    }
    dst[66..74].copy_from_slice(&src[66..74]);
}

#[cfg(test)]
mod tests {
    use super::*;

    // The round trip of both: `packed::tests::vector_recodings_equal_scalar`.

    /// The masks hold each value's sign as the scalar code reads it.
    #[test]
    fn masks_hold_the_signs() {
        use crate::quant::iq_grids::KSIGNS;
        let src = crate::packed::test_bytes(0x1234_5678, XXS_BYTES);
        let mut e = vec![0u8; XXS_BYTES];
        encode_xxs(&src, &mut e);
        let m = masks_at(&e, XXS_MASKS);
        let all: [u32; 8] = std::array::from_fn(|j| if j < 7 { m[j] } else { mask7(&m) });
        for v in 0..256 {
            let (l, k) = (v / 32, v % 32 / 8);
            let aux = u32_at(&src, 6 + 8 * l);
            let sign = KSIGNS[(aux >> (7 * k) & 0x7F) as usize] >> (v % 8) & 1;
            assert_eq!(all[v % 8] >> (v / 8) & 1, u32::from(sign), "value {v}");
        }
    }
}
