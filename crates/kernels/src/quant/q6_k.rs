//! Q6_K: 256 values in 16 groups of 16, each with an i8 scale; 6-bit codes
//! offset by 32: `x = d·sc·(q − 32)`. Low 4 bits in `ql`, high 2 bits in `qh`.
//!
//! Each 128-value half `h` uses `ql[64h..]`, `qh[32h..]`, `scales[8h..]`; for
//! `l < 32`, `is = l/16`:
//! * `x[l]    = ql[l]&15    | (qh[l]&3)<<4`,      scale `sc[is]`
//! * `x[l+32] = ql[l+32]&15 | (qh[l]>>2&3)<<4`,   scale `sc[is+2]`
//! * `x[l+64] = ql[l]>>4    | (qh[l]>>4&3)<<4`,   scale `sc[is+4]`
//! * `x[l+96] = ql[l+32]>>4 | (qh[l]>>6)<<4`,     scale `sc[is+6]`

use super::q8_k::BlockQ8K;
use super::F16Le;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ6K {
    pub ql: [u8; 128],
    pub qh: [u8; 64],
    pub scales: [i8; 16],
    pub d: F16Le,
}
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);

impl BlockQ6K {
    pub const ELEMS: usize = 256;

    /// All 256 signed codes (`q − 32`, in −32..32) in element order.
    #[inline]
    pub fn codes(&self) -> [i8; 256] {
        let mut q = [0i8; 256];
        for h in 0..2 {
            let ql = &self.ql[64 * h..];
            let qh = &self.qh[32 * h..];
            let o = &mut q[128 * h..];
            for l in 0..32 {
                o[l] = ((ql[l] & 15) | ((qh[l] & 3) << 4)) as i8 - 32;
                o[l + 32] = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
                o[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
                o[l + 96] = ((ql[l + 32] >> 4) | ((qh[l] >> 6) << 4)) as i8 - 32;
            }
        }
        q
    }
}

pub fn dequantize(blocks: &[BlockQ6K], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 256);
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(256)) {
        let d = b.d.to_f32();
        for (g, (o, q)) in o.chunks_exact_mut(16).zip(b.codes().chunks_exact(16)).enumerate() {
            let s = d * b.scales[g] as f32;
            for (o, &q) in o.iter_mut().zip(q) {
                *o = s * q as f32;
            }
        }
    }
}

/// `Σ_b d·d_a·Σ_g sc_g·Σ (q−32)·q8` over the 16 groups of 16.
pub fn vec_dot(w: &[BlockQ6K], a: &[BlockQ8K]) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let q = x.codes();
        let mut sumi = 0i32;
        for g in 0..16 {
            let s: i32 = q[16 * g..16 * g + 16].iter().zip(&y.qs[16 * g..]).map(|(&p, &v)| p as i32 * v as i32).sum();
            sumi += x.scales[g] as i32 * s;
        }
        sum += x.d.to_f32() * y.d * sumi as f32;
    }
    sum
}

/// Quantizes `x` (a multiple of 256 values) to Q6_K blocks (llama.cpp's
/// reference scheme, no importance matrix).
///
/// Each group of 16 gets a signed scale from [`super::kq_fit::fit_symmetric`]
/// (codes −32..32). The 16 scales are stored as i8 multiples of the block's
/// f16 `d`, chosen so that the scale of largest magnitude is exactly −128
/// (the one i8 value without a positive twin). The codes are then recomputed
/// against the stored `d·sc`, so they fit what the dequantizer computes.
pub fn quantize(x: &[f32], out: &mut [BlockQ6K]) {
    use super::kq_fit::{code, fit_symmetric};
    assert_eq!(x.len(), out.len() * 256);
    for (xb, b) in x.chunks_exact(256).zip(out.iter_mut()) {
        let scales: [f32; 16] = std::array::from_fn(|g| fit_symmetric(&xb[16 * g..16 * g + 16], 32));
        let ext = scales.iter().fold(0f32, |m, &s| if s.abs() > m.abs() { s } else { m });
        *b = BlockQ6K::zeroed();
        if ext == 0.0 {
            continue;
        }
        b.d = F16Le::from_f32(ext / -128.0);
        let d = b.d.to_f32();
        let inv = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut q = [0u8; 256];
        for g in 0..16 {
            let sc = (scales[g] * inv).round().clamp(-128.0, 127.0) as i8;
            b.scales[g] = sc;
            let step = d * sc as f32;
            for (qi, &v) in q[16 * g..16 * g + 16].iter_mut().zip(&xb[16 * g..]) {
                *qi = (code(v, step, -32.0, 31.0, 0.0) + 32.0) as u8;
            }
        }
        pack(&q, b);
    }
}

/// Stores 256 codes (0..64, element order) into `ql`/`qh` (the layout in the
/// module comment, read back by [`BlockQ6K::codes`]).
fn pack(q: &[u8; 256], b: &mut BlockQ6K) {
    for h in 0..2 {
        let q = &q[128 * h..128 * h + 128];
        for l in 0..32 {
            let (q0, q1, q2, q3) = (q[l], q[l + 32], q[l + 64], q[l + 96]);
            b.ql[64 * h + l] = (q0 & 15) | ((q2 & 15) << 4);
            b.ql[64 * h + l + 32] = (q1 & 15) | ((q3 & 15) << 4);
            b.qh[32 * h + l] = (q0 >> 4) | ((q1 >> 4) << 2) | ((q2 >> 4) << 4) | ((q3 >> 4) << 6);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::kq_fit::test_data::{bytes, rms, uniform, weights_like};
    use super::*;

    #[test]
    fn packing_reads_back() {
        let q: [u8; 256] = std::array::from_fn(|i| ((i * 37 + 11) % 64) as u8);
        let mut b = BlockQ6K::zeroed();
        pack(&q, &mut b);
        let back = b.codes();
        assert!(q.iter().zip(&back).all(|(&a, &c)| a as i8 - 32 == c));
    }

    /// Round trip through the dequantizer. Uniform values in [−1, 1): the
    /// group's step is about amax/32 ≈ 1/32, a rounding error of step/√12 ≈
    /// 0.0090 rms; the i8 scales and f16 `d` add little, so the bound is
    /// 0.0100 (measured 0.0076). Weight-like values (std 0.02, outliers): at
    /// most 0.65 of Q5_K's error on the same values (one more bit halves the
    /// step; the x²-weighted fit spends some of it on the outliers; measured
    /// 0.58). Zero stays zero; encoding twice gives the same bytes.
    #[test]
    fn round_trip_error_and_determinism() {
        let mut z = [BlockQ6K::zeroed(); 1];
        quantize(&[0.0; 256], &mut z);
        let mut back = [1f32; 256];
        dequantize(&z, &mut back);
        assert!(back.iter().all(|&v| v == 0.0));
        let x = uniform(4096, 7);
        let mut b = vec![BlockQ6K::zeroed(); 16];
        quantize(&x, &mut b);
        let mut y = vec![0f32; 4096];
        dequantize(&b, &mut y);
        let e = rms(&x, &y);
        eprintln!("q6_k uniform rms {e:.5}");
        assert!(e <= 0.0100, "q6_k uniform rms {e}");
        let mut b2 = vec![BlockQ6K::zeroed(); 16];
        quantize(&x, &mut b2);
        assert_eq!(bytes(&b), bytes(&b2));

        let x = weights_like(4096, 5);
        quantize(&x, &mut b);
        dequantize(&b, &mut y);
        let e6 = rms(&x, &y);
        let mut b5 = vec![super::super::q5_k::BlockQ5K::zeroed(); 16];
        super::super::q5_k::quantize(&x, &mut b5);
        super::super::q5_k::dequantize(&b5, &mut y);
        let e5 = rms(&x, &y);
        eprintln!("weights-like rms: q6_k {e6:.3e}, q5_k {e5:.3e}");
        assert!(e6 <= 0.65 * e5, "q6_k {e6} vs q5_k {e5}");
    }
}
