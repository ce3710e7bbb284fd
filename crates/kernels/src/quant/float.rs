//! Float weights: F32, F16 and BF16 (little-endian, any alignment). Dot products
//! take f32 activations and accumulate in f32 (8 partial sums).

use half::{bf16, f16};

#[inline(always)]
fn f16_at(b: &[u8]) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
}

#[inline(always)]
fn bf16_at(b: &[u8]) -> f32 {
    f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16)
}

pub fn dequantize_f32(src: &[u8], dst: &mut [f32]) {
    for (o, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

pub fn dequantize_f16(src: &[u8], dst: &mut [f32]) {
    for (o, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *o = f16_at(b);
    }
}

pub fn dequantize_bf16(src: &[u8], dst: &mut [f32]) {
    for (o, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *o = bf16_at(b);
    }
}

pub fn quantize_f32(src: &[f32], dst: &mut [u8]) {
    for (v, o) in src.iter().zip(dst.chunks_exact_mut(4)) {
        o.copy_from_slice(&v.to_le_bytes());
    }
}

/// Round-to-nearest-even.
pub fn quantize_f16(src: &[f32], dst: &mut [u8]) {
    for (v, o) in src.iter().zip(dst.chunks_exact_mut(2)) {
        o.copy_from_slice(&f16::from_f32(*v).to_bits().to_le_bytes());
    }
}

/// Round-to-nearest-even (NaN stays NaN).
pub fn quantize_bf16(src: &[f32], dst: &mut [u8]) {
    for (v, o) in src.iter().zip(dst.chunks_exact_mut(2)) {
        o.copy_from_slice(&bf16::from_f32(*v).to_bits().to_le_bytes());
    }
}

#[inline(always)]
fn dot_with(w: &[u8], a: &[f32], width: usize, get: impl Fn(&[u8]) -> f32) -> f32 {
    let mut acc = [0f32; 8];
    let n = a.len();
    let full = n / 8 * 8;
    for (wc, ac) in w[..full * width].chunks_exact(8 * width).zip(a[..full].chunks_exact(8)) {
        for k in 0..8 {
            acc[k] += get(&wc[k * width..]) * ac[k];
        }
    }
    let mut tail = 0f32;
    for k in full..n {
        tail += get(&w[k * width..]) * a[k];
    }
    acc.iter().sum::<f32>() + tail
}

/// `Σ w·a` with `w` as little-endian f32 bytes.
pub fn dot_f32(w: &[u8], a: &[f32]) -> f32 {
    dot_with(w, a, 4, |b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// `Σ w·a` with `w` as little-endian f16 bytes.
pub fn dot_f16(w: &[u8], a: &[f32]) -> f32 {
    dot_with(w, a, 2, f16_at)
}

/// `Σ w·a` with `w` as little-endian bf16 bytes.
pub fn dot_bf16(w: &[u8], a: &[f32]) -> f32 {
    dot_with(w, a, 2, bf16_at)
}
