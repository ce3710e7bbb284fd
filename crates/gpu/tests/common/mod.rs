//! Helpers of the shader tests: the adapter, random data, tolerances and
//! host encodings of every weight type.
#![allow(dead_code)]

use kernels::DType;
use rand::{Rng, SeedableRng};
use shardlm_gpu::Gpu;

pub fn gpu() -> Option<Gpu> {
    match Gpu::open(None) {
        Ok(g) => Some(g),
        Err(e) if std::env::var("CI").is_ok_and(|v| v == "true") => panic!("CI has no GPU adapter: {e}"),
        Err(e) => {
            eprintln!("SKIPPED: {e}");
            None
        }
    }
}

pub fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
}

pub fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs() / w.abs().max(1.0);
        assert!(err <= tol, "{what}: element {i}: got {g}, want {w} (relative error {err:e} > {tol:e})");
    }
}

/// Encodes `w` (`rows × cols` f32) as `dtype` and returns the bytes and the
/// values the encoding holds (what the shader must multiply by).
pub fn encode(dtype: DType, w: &[f32], cols: usize) -> (Vec<u8>, Vec<f32>) {
    let row_bytes = dtype.bytes_for(cols).unwrap();
    let mut bytes = vec![0u8; row_bytes * (w.len() / cols)];
    let mut held = vec![0f32; w.len()];
    for ((src, dst), h) in w.chunks_exact(cols).zip(bytes.chunks_exact_mut(row_bytes)).zip(held.chunks_exact_mut(cols))
    {
        match dtype {
            DType::F32 => dst.copy_from_slice(bytemuck::cast_slice(src)),
            DType::F16 => {
                let v: Vec<half::f16> = src.iter().map(|&x| half::f16::from_f32(x)).collect();
                dst.copy_from_slice(bytemuck::cast_slice(&v));
            }
            DType::BF16 => {
                let v: Vec<half::bf16> = src.iter().map(|&x| half::bf16::from_f32(x)).collect();
                dst.copy_from_slice(bytemuck::cast_slice(&v));
            }
            DType::Q4_1 => q4_1_row(src, dst),
            DType::Q5_1 => q5_1_row(src, dst),
            _ => kernels::quant::quantize_row(dtype, src, dst).unwrap(),
        }
        kernels::quant::dequantize_row(dtype, dst, h);
    }
    (bytes, held)
}

/// Q4_1 blocks (the kernels crate reads them but does not write them):
/// f16 scale d = (max − min)/15, f16 min m, 16 bytes of nibbles (value i low,
/// value i + 16 high); value = d · q + m.
pub fn q4_1_row(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(32).zip(dst.chunks_exact_mut(20)) {
        let (lo, hi) = x.iter().fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
        let d = half::f16::from_f32((hi - lo) / 15.0);
        let m = half::f16::from_f32(lo);
        b[..2].copy_from_slice(&d.to_le_bytes());
        b[2..4].copy_from_slice(&m.to_le_bytes());
        let (df, mf) = (d.to_f32(), m.to_f32());
        let q = |v: f32| if df == 0.0 { 0 } else { ((v - mf) / df).round().clamp(0.0, 15.0) as u8 };
        for i in 0..16 {
            b[4 + i] = q(x[i]) | (q(x[i + 16]) << 4);
        }
    }
}

/// Q5_1 blocks (read, not written, by the kernels crate): f16 d = (max −
/// min)/31, f16 min, 32 high bits, 16 bytes of nibbles.
pub fn q5_1_row(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(32).zip(dst.chunks_exact_mut(24)) {
        let (lo, hi) = x.iter().fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
        let d = half::f16::from_f32((hi - lo) / 31.0);
        let m = half::f16::from_f32(lo);
        b[..2].copy_from_slice(&d.to_le_bytes());
        b[2..4].copy_from_slice(&m.to_le_bytes());
        let (df, mf) = (d.to_f32(), m.to_f32());
        let q: Vec<u32> =
            x.iter().map(|&v| if df == 0.0 { 0 } else { ((v - mf) / df).round().clamp(0.0, 31.0) as u32 }).collect();
        let qh = (0..32).fold(0u32, |h, i| h | ((q[i] >> 4) << i));
        b[4..8].copy_from_slice(&qh.to_le_bytes());
        for i in 0..16 {
            b[8 + i] = (q[i] & 15) as u8 | (((q[i + 16] & 15) as u8) << 4);
        }
    }
}
