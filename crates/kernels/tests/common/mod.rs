//! Shared test helpers: deterministic random weights (with edge values) and
//! activations.
#![allow(dead_code)]

use half::f16;
use rand::{Rng, SeedableRng};
use shardlm_kernels::DType;

pub type TestRng = rand::rngs::StdRng;

pub fn rng(seed: u64) -> TestRng {
    TestRng::seed_from_u64(seed)
}

fn f16_bytes(v: f32) -> [u8; 2] {
    f16::from_f32(v).to_bits().to_le_bytes()
}

/// Activations in ±4 with some zeros, exact-max ties and a few large values.
pub fn random_acts(rng: &mut TestRng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| match rng.gen_range(0..20) {
            0 => 0.0,
            1 => 4.0,
            2 => -4.0,
            3 if i % 7 == 0 => rng.gen_range(-60.0..60.0),
            _ => rng.gen_range(-4.0..4.0),
        })
        .collect()
}

/// Packs f32 values into `dtype` (float types only).
pub fn pack(dtype: DType, v: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; dtype.bytes_for(v.len()).unwrap()];
    shardlm_kernels::quant::quantize_row(dtype, v, &mut out).unwrap();
    out
}

/// A random scale: mostly ordinary, sometimes zero, negative or large.
fn scale(rng: &mut TestRng) -> [u8; 2] {
    match rng.gen_range(0..16) {
        0 => f16_bytes(0.0),
        1 => f16_bytes(-rng.gen_range(0.001..0.05)),
        2 => f16_bytes(rng.gen_range(1.0..4.0)),
        _ => f16_bytes(rng.gen_range(0.001..0.05)),
    }
}

/// `rows × cols` random weight bytes of `dtype`: random codes (including the
/// extreme codes) and random, sometimes zero or negative, scales.
pub fn random_weight(rng: &mut TestRng, dtype: DType, rows: usize, cols: usize) -> Vec<u8> {
    let n = rows * cols;
    let nb = n / dtype.block_elems();
    let mut bytes: Vec<u8> = (0..dtype.bytes_for(n).unwrap())
        .map(|_| match rng.gen_range(0..10) {
            0 => 0x00,
            1 => 0xff,
            2 => 0x80,
            _ => rng.gen(),
        })
        .collect();
    let bb = dtype.block_bytes();
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => {
            let v: Vec<f32> = (0..n)
                .map(|_| match rng.gen_range(0..12) {
                    0 => 0.0,
                    1 => -1.0,
                    _ => rng.gen_range(-1.0..1.0),
                })
                .collect();
            bytes = pack(dtype, &v);
        }
        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => {
            for b in 0..nb {
                bytes[b * bb..b * bb + 2].copy_from_slice(&scale(rng));
            }
        }
        DType::Q4_1 | DType::Q5_1 => {
            for b in 0..nb {
                bytes[b * bb..b * bb + 2].copy_from_slice(&scale(rng));
                let m = f16_bytes(rng.gen_range(-0.3..0.3));
                bytes[b * bb + 2..b * bb + 4].copy_from_slice(&m);
            }
        }
        DType::Q4_K | DType::Q5_K => {
            for b in 0..nb {
                bytes[b * bb..b * bb + 2].copy_from_slice(&scale(rng));
                let dmin = f16_bytes(rng.gen_range(-0.002..0.01));
                bytes[b * bb + 2..b * bb + 4].copy_from_slice(&dmin);
            }
        }
        DType::Q6_K => {
            for b in 0..nb {
                bytes[b * bb + 208..b * bb + 210].copy_from_slice(&scale(rng));
            }
        }
        DType::Q2_K => {
            for b in 0..nb {
                bytes[b * bb + 80..b * bb + 82].copy_from_slice(&scale(rng));
                let dmin = f16_bytes(rng.gen_range(-0.002..0.01));
                bytes[b * bb + 82..b * bb + 84].copy_from_slice(&dmin);
            }
        }
        DType::Q3_K => {
            for b in 0..nb {
                bytes[b * bb + 108..b * bb + 110].copy_from_slice(&scale(rng));
            }
        }
        DType::IQ1_M => {
            for b in 0..nb {
                set_iq1m_scale(&mut bytes[b * bb..(b + 1) * bb], u16::from_le_bytes(scale(rng)));
            }
        }
        DType::IQ2_XXS
        | DType::IQ2_XS
        | DType::IQ2_S
        | DType::IQ3_XXS
        | DType::IQ3_S
        | DType::IQ1_S
        | DType::IQ4_NL
        | DType::IQ4_XS => {
            for b in 0..nb {
                bytes[b * bb..b * bb + 2].copy_from_slice(&scale(rng));
            }
        }
        // Low-bit floats: valid scales (NaN scales are refused at load), from
        // tiny to large, some zero; FP8 codes without the NaN code.
        DType::MXFP4 => {
            for b in 0..nb {
                bytes[b * bb] = match rng.gen_range(0..8) {
                    0 => 0,
                    1 => 140,
                    _ => rng.gen_range(110..135),
                };
            }
        }
        DType::NVFP4 => {
            for b in 0..nb {
                for d in &mut bytes[b * bb..b * bb + 4] {
                    *d = rng.gen_range(0..0x7F);
                }
            }
        }
        DType::FP8 => {
            for b in 0..nb {
                let d: f32 = match rng.gen_range(0..8) {
                    0 => 0.0,
                    1 => -rng.gen_range(1e-4..1e-2),
                    _ => rng.gen_range(1e-4..1e-2),
                };
                bytes[b * bb..b * bb + 4].copy_from_slice(&d.to_le_bytes());
                for q in &mut bytes[b * bb + 4..(b + 1) * bb] {
                    if *q & 0x7F == 0x7F {
                        *q -= 1;
                    }
                }
            }
        }
    }
    bytes
}

/// IQ1_M keeps its f16 scale in the top nibbles of its four scale words
/// (bytes 49, 51, 53, 55 of the 56-byte block): nibble `i` of the f16 goes to word `i`.
pub fn set_iq1m_scale(blk: &mut [u8], bits: u16) {
    for i in 0..4 {
        let nib = ((bits >> (4 * i)) & 15) as u8;
        blk[49 + 2 * i] = (blk[49 + 2 * i] & 0x0F) | (nib << 4);
    }
}
