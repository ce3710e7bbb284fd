//! Q4_K: 256 values in 8 sub-blocks of 32. Each sub-block has a 6-bit scale and
//! a 6-bit min (packed in `scales[12]`, see [`scale_min`]); `x = d·sc·q − dmin·m`.
//!
//! Element order: chunk `c` (0..4) covers elements `64c..64c+64` from
//! `qs[32c..32c+32]`; element `64c+l` is the low nibble of `qs[32c+l]` (sub-block
//! `2c`), element `64c+32+l` the high nibble (sub-block `2c+1`).

use super::q8_k::BlockQ8K;
use super::F16Le;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ4K {
    pub d: F16Le,
    pub dmin: F16Le,
    pub scales: [u8; 12],
    pub qs: [u8; 128],
}
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);

impl BlockQ4K {
    pub const ELEMS: usize = 256;
}

/// Scale and min of sub-block `j` (0..8) from the 12 packed bytes (ggml's
/// `get_scale_min_k4`).
#[inline(always)]
pub fn scale_min(j: usize, s: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        ((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
    }
}

/// All 8 (scale, min) pairs, decoded a word at a time (same result as
/// [`scale_min`] for each `j`).
#[inline]
pub fn scales_mins(s: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    const LOW6: u32 = 0x3F3F_3F3F;
    const LOW4: u32 = 0x0F0F_0F0F;
    const TOP2: u32 = 0x0303_0303;
    let a = u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    let b = u32::from_le_bytes([s[4], s[5], s[6], s[7]]);
    let c = u32::from_le_bytes([s[8], s[9], s[10], s[11]]);
    let sc_hi = (c & LOW4) | (((a >> 6) & TOP2) << 4);
    let m_hi = ((c >> 4) & LOW4) | (((b >> 6) & TOP2) << 4);
    let sc = (a & LOW6) as u64 | (sc_hi as u64) << 32;
    let m = (b & LOW6) as u64 | (m_hi as u64) << 32;
    (sc.to_le_bytes(), m.to_le_bytes())
}

pub fn dequantize(blocks: &[BlockQ4K], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 256);
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(256)) {
        let (d, dmin) = (b.d.to_f32(), b.dmin.to_f32());
        for c in 0..4 {
            let (sc0, m0) = scale_min(2 * c, &b.scales);
            let (sc1, m1) = scale_min(2 * c + 1, &b.scales);
            let (d0, mm0) = (d * sc0 as f32, dmin * m0 as f32);
            let (d1, mm1) = (d * sc1 as f32, dmin * m1 as f32);
            for l in 0..32 {
                let q = b.qs[32 * c + l];
                o[64 * c + l] = d0 * (q & 15) as f32 - mm0;
                o[64 * c + 32 + l] = d1 * (q >> 4) as f32 - mm1;
            }
        }
    }
}

/// `Σ_b d_a·(d·Σ_j sc_j·Σ q·q8 − dmin·Σ_j m_j·bsum_j)` with the sub-block sums of
/// the activations taken from `bsums` (pairs of 16-value sums).
pub fn vec_dot(w: &[BlockQ4K], a: &[BlockQ8K]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let (sc, m) = scales_mins(&x.scales);
        let mut sumi = 0i32;
        let mut summ = 0i32;
        for c in 0..4 {
            let (mut s0, mut s1) = (0i32, 0i32);
            for l in 0..32 {
                let q = x.qs[32 * c + l];
                s0 += (q & 15) as i32 * y.qs[64 * c + l] as i32;
                s1 += (q >> 4) as i32 * y.qs[64 * c + 32 + l] as i32;
            }
            sumi += sc[2 * c] as i32 * s0 + sc[2 * c + 1] as i32 * s1;
        }
        for j in 0..8 {
            summ += m[j] as i32 * (y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32);
        }
        sum += y.d * x.d.to_f32() * sumi as f32 - y.d * x.dmin.to_f32() * summ as f32;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_decode_matches_bytewise() {
        let mut s = [0u8; 12];
        let mut x = 0x1234_5678_9abc_def1u64;
        for _ in 0..1000 {
            for v in s.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *v = x as u8;
            }
            let (sc, m) = scales_mins(&s);
            for j in 0..8 {
                assert_eq!((sc[j], m[j]), scale_min(j, &s));
            }
        }
    }
}
