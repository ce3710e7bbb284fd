//! quantize → dequantize error bounds for the formats we produce.

mod common;

use common::*;
use rand::Rng;
use shardlm_kernels::quant::{self, q8_1, q8_k};
use shardlm_kernels::DType;

#[test]
fn q8_0_and_q4_0_round_trip() {
    let mut rng = rng(11);
    for _ in 0..50 {
        // (Scales below ~1e-2 make d an f16 subnormal, where the bound does not hold.)
        let scale = 10f32.powi(rng.gen_range(-1..3));
        let mut x: Vec<f32> = (0..256).map(|_| rng.gen_range(-1.0..1.0) * scale).collect();
        x[0..32].iter_mut().for_each(|v| *v = 0.0); // an all-zero block
        x[40] = 1e3 * scale; // an outlier
        for (dtype, steps) in [(DType::Q8_0, 127.0f32), (DType::Q4_0, 8.0)] {
            let mut b = vec![0u8; dtype.bytes_for(x.len()).unwrap()];
            quant::quantize_row(dtype, &x, &mut b).unwrap();
            let mut y = vec![0f32; x.len()];
            quant::dequantize_row(dtype, &b, &mut y);
            for (xb, yb) in x.chunks(32).zip(y.chunks(32)) {
                let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                // Half a step, except Q4_0 whose top code may clamp (one step);
                // plus f16 rounding of the scale.
                let step = amax / steps;
                let bound = if dtype == DType::Q4_0 { step } else { step / 2.0 } + amax * 1e-3;
                for (a, b) in xb.iter().zip(yb) {
                    assert!((a - b).abs() <= bound, "{dtype}: {a} → {b} (bound {bound})");
                }
            }
        }
    }
}

#[test]
fn activation_formats_round_trip() {
    let mut rng = rng(12);
    let x = random_acts(&mut rng, 1024);
    let mut b1 = vec![q8_1::BlockQ8_1 { d: Default::default(), s: Default::default(), qs: [0; 32] }; 32];
    q8_1::quantize(&x, &mut b1);
    let mut y = vec![0f32; 1024];
    q8_1::dequantize(&b1, &mut y);
    for (i, (xb, yb)) in x.chunks(32).zip(y.chunks(32)).enumerate() {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (a, b) in xb.iter().zip(yb) {
            assert!((a - b).abs() <= amax / 254.0 + amax * 1e-3);
        }
        let sum: i32 = b1[i].qs.iter().map(|&q| q as i32).sum();
        let s = b1[i].s.to_f32();
        assert!((s - amax / 127.0 * sum as f32).abs() <= s.abs() * 1e-3 + 1e-6);
    }
    let mut bk = vec![q8_k::BlockQ8K { d: 0.0, qs: [0; 256], bsums: [0; 16] }; 4];
    q8_k::quantize(&x, &mut bk);
    q8_k::dequantize(&bk, &mut y);
    for (k, (xb, yb)) in x.chunks(256).zip(y.chunks(256)).enumerate() {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (a, b) in xb.iter().zip(yb) {
            assert!((a - b).abs() <= amax / 254.0 * 1.0001);
        }
        for g in 0..16 {
            let s: i32 = bk[k].qs[16 * g..16 * g + 16].iter().map(|&q| q as i32).sum();
            assert_eq!(bk[k].bsums[g] as i32, s);
        }
    }
}
