//! MXFP4, NVFP4 and FP8: dequantization of hand-made blocks against values
//! written out by hand from the specifications (FORMATS.md §1), refusal of NaN
//! scales, and quantize → dequantize error bounds.

mod common;

use common::*;
use rand::Rng;
use shardlm_kernels::quant::{self, nvfp4};
use shardlm_kernels::{DType, KernelError};

fn deq(dtype: DType, bytes: &[u8]) -> Vec<f32> {
    let n = bytes.len() / dtype.block_bytes() * dtype.block_elems();
    let mut out = vec![0f32; n];
    quant::dequantize_row(dtype, bytes, &mut out);
    out
}

fn p2(e: i32) -> f32 {
    2f32.powi(e)
}

#[test]
fn mxfp4_hand_blocks() {
    // Scale 2^(127−127) = 1. Byte j holds element j (low) and j+16 (high).
    let mut b = vec![127u8];
    b.extend([0x70, 0x81, 0xF7, 0x2A]); // (0 | 6), (0.5 | −0), (6 | −6), (−1 | 1)
    b.extend([0u8; 12]);
    let x = deq(DType::MXFP4, &b);
    assert_eq!(&x[0..4], &[0.0, 0.5, 6.0, -1.0]);
    assert_eq!(&x[16..20], &[6.0, 0.0, -6.0, 1.0]); // −0 decodes to a zero
                                                    // Tiny scale: 2^−127 (E8M0 0); the smallest E2M1 value 0.5 gives 2^−128.
    let mut t = vec![0u8, 0x01];
    t.extend([0u8; 15]);
    assert_eq!(deq(DType::MXFP4, &t)[0], p2(-128));
    // Huge scale: 2^127 (E8M0 254) times 1.0 (code 2).
    let mut h = vec![254u8, 0x02];
    h.extend([0u8; 15]);
    assert_eq!(deq(DType::MXFP4, &h)[0], p2(127));
    // NaN scale (0xFF) is refused with the block index.
    let mut bad = b.clone();
    bad.extend(&h);
    bad[17] = 0xFF;
    assert!(matches!(
        quant::validate(DType::MXFP4, &bad),
        Err(KernelError::BadScale { dtype: DType::MXFP4, block: 1 })
    ));
    assert!(quant::validate(DType::MXFP4, &b).is_ok());
}

#[test]
fn nvfp4_hand_blocks() {
    // Sub-block scales: 448 (largest E4M3, 0x7E), 2^−9 (smallest subnormal, 0x01),
    // 0 and 1.0 (0x38). In sub-block s, qs[8s+j] holds element 16s+j (low) and 16s+j+8 (high).
    let mut b = vec![0x7E, 0x01, 0x00, 0x38];
    let mut qs = [0u8; 32];
    qs[0] = 0xF7; // x[0] = 6·448, x[8] = −6·448
    qs[8] = 0x01; // x[16] = 0.5·2^−9
    qs[16] = 0x77; // scale 0: zeros
    qs[24] = 0x8B; // x[48] = −1.5, x[56] = −0
    qs[31] = 0x35; // x[55] = 3, x[63] = 1.5
    b.extend(qs);
    let x = deq(DType::NVFP4, &b);
    let mut want = [0f32; 64];
    want[0] = 2688.0;
    want[8] = -2688.0;
    want[16] = p2(-10);
    want[48] = -1.5;
    want[55] = 3.0;
    want[63] = 1.5;
    assert_eq!(x, want);
    for nan in [0x7F, 0xFF] {
        let mut bad = b.clone();
        bad[2] = nan;
        assert!(matches!(quant::validate(DType::NVFP4, &bad), Err(KernelError::BadScale { block: 0, .. })));
    }
    assert!(quant::validate(DType::NVFP4, &b).is_ok());
}

#[test]
fn fp8_hand_blocks() {
    let block = |d: f32, codes: &[u8]| {
        let mut b = d.to_le_bytes().to_vec();
        let mut q = [0u8; 64];
        q[..codes.len()].copy_from_slice(codes);
        b.extend(q);
        b
    };
    // 0, −0, 448 (0x7E), −448, smallest subnormal 2^−9 (0x01), smallest normal 2^−6 (0x08), 1.0 (0x38), 1.125.
    let x = deq(DType::FP8, &block(1.0, &[0x00, 0x80, 0x7E, 0xFE, 0x01, 0x08, 0x38, 0x39]));
    assert_eq!(&x[..8], &[0.0, 0.0, 448.0, -448.0, p2(-9), p2(-6), 1.0, 1.125]);
    assert!(x[1].is_sign_negative());
    // Tiny and huge block scales multiply exactly.
    assert_eq!(deq(DType::FP8, &block(p2(-120), &[0x01]))[0], p2(-129));
    assert_eq!(deq(DType::FP8, &block(p2(100), &[0x7E]))[0], 448.0 * p2(100));
    for bad in [block(f32::NAN, &[1]), block(f32::INFINITY, &[1]), block(1.0, &[0, 0x7F]), block(1.0, &[0xFF])] {
        assert!(matches!(
            quant::validate(DType::FP8, &bad),
            Err(KernelError::BadScale { dtype: DType::FP8, block: 0 })
        ));
    }
    assert!(quant::validate(DType::FP8, &block(1.0, &[0x7E, 0xFE])).is_ok());
}

/// E2M1 rounding: at most a quarter of the scale below 1·scale, a quarter of
/// the value above (half a step), plus what saturation at 6·scale cuts off.
fn fp4_bound(x: f32, s: f32) -> f32 {
    (0.25 * s).max(x.abs() * 0.25).max(x.abs() - 6.0 * s) * 1.0001
}

#[test]
fn low_bit_round_trips() {
    let mut rng = rng(31);
    for _ in 0..20 {
        let scale = 10f32.powi(rng.gen_range(-3..3));
        let mut x: Vec<f32> = (0..1024).map(|_| rng.gen_range(-1.0..1.0) * scale).collect();
        x[0..64].iter_mut().for_each(|v| *v = 0.0);
        x[100] = 20.0 * scale;
        let amax_t = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        // MXFP4: scale 2^(floor(log2 amax) − 2).
        let mut b = vec![0u8; DType::MXFP4.bytes_for(1024).unwrap()];
        quant::quantize_row(DType::MXFP4, &x, &mut b).unwrap();
        let y = deq(DType::MXFP4, &b);
        for (xb, yb) in x.chunks(32).zip(y.chunks(32)) {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            let s = if amax > 0.0 { p2(amax.log2().floor() as i32 - 2) } else { 0.0 };
            for (a, b) in xb.iter().zip(yb) {
                assert!((a - b).abs() <= fp4_bound(*a, s), "mxfp4 {a} → {b} (s {s})");
            }
        }
        // NVFP4 with the ModelOpt tensor scale amax/(6·448): block scales are E4M3-rounded (2^−4 relative).
        let g = amax_t / 2688.0;
        let mut nb = vec![nvfp4::BlockNvfp4 { d: [0; 4], qs: [0; 32] }; 16];
        nvfp4::quantize(&x, g, &mut nb);
        let mut y = vec![0f32; 1024];
        nvfp4::dequantize(&nb, &mut y);
        for (xb, yb) in x.chunks(16).zip(y.chunks(16)) {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            let s = amax / 6.0 * (1.0 + 1.0 / 16.0);
            for (a, b) in xb.iter().zip(yb) {
                let b = b * g;
                // Sub-blocks far below the tensor max get subnormal E4M3 scales: 2^−10·6·g absolute.
                assert!((a - b).abs() <= fp4_bound(*a, s) + 6.0 * g * p2(-10), "nvfp4 {a} → {b}");
            }
        }
        // FP8: d = amax/448 per 64 values; E4M3 keeps 3 mantissa bits (2^−4 relative), subnormals 2^−10·d.
        let mut b = vec![0u8; DType::FP8.bytes_for(1024).unwrap()];
        quant::quantize_row(DType::FP8, &x, &mut b).unwrap();
        let y = deq(DType::FP8, &b);
        for (xb, yb) in x.chunks(64).zip(y.chunks(64)) {
            let d = xb.iter().fold(0f32, |m, v| m.max(v.abs())) / 448.0;
            for (a, b) in xb.iter().zip(yb) {
                assert!((a - b).abs() <= a.abs() / 16.0 + d * p2(-10) + 1e-30, "fp8 {a} → {b}");
            }
        }
    }
}
