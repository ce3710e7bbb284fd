//! Dequantization of hand-written blocks against hand-computed values, plus
//! hand-checked quantization of the formats we produce.

#![allow(clippy::neg_multiply)] // the hand computations keep their factors visible

use shardlm_kernels::quant::{self, q8_0, q8_1, q8_k};
use shardlm_kernels::DType;

// f16 bit patterns used below.
const F16_0_125: [u8; 2] = 0x3000u16.to_le_bytes();
const F16_0_25: [u8; 2] = 0x3400u16.to_le_bytes();
const F16_0_5: [u8; 2] = 0x3800u16.to_le_bytes();
const F16_1: [u8; 2] = 0x3C00u16.to_le_bytes();
const F16_2: [u8; 2] = 0x4000u16.to_le_bytes();
const F16_M1: [u8; 2] = 0xBC00u16.to_le_bytes();

fn deq(dtype: DType, bytes: &[u8]) -> Vec<f32> {
    assert_eq!(bytes.len(), dtype.block_bytes());
    let mut out = vec![f32::NAN; dtype.block_elems()];
    quant::dequantize_row(dtype, bytes, &mut out);
    out
}

#[test]
fn q4_0_block() {
    let mut b = vec![0x88u8; 18]; // code 8 everywhere → 0
    b[0..2].copy_from_slice(&F16_0_5);
    b[2] = 0x1F; // x0 = (15−8)·0.5 = 3.5, x16 = (1−8)·0.5 = −3.5
    b[3] = 0x80; // x1 = (0−8)·0.5 = −4,  x17 = (8−8)·0.5 = 0
    let mut want = vec![0f32; 32];
    want[0] = 3.5;
    want[16] = -3.5;
    want[1] = -4.0;
    assert_eq!(deq(DType::Q4_0, &b), want);
}

#[test]
fn q4_1_block() {
    let mut b = vec![0u8; 20]; // code 0 → m = −1
    b[0..2].copy_from_slice(&F16_0_25);
    b[2..4].copy_from_slice(&F16_M1);
    b[4] = 0xF0; // x0 = 0·0.25 − 1 = −1, x16 = 15·0.25 − 1 = 2.75
    b[19] = 0x4A; // x15 = 10·0.25 − 1 = 1.5, x31 = 4·0.25 − 1 = 0
    let mut want = vec![-1f32; 32];
    want[16] = 2.75;
    want[15] = 1.5;
    want[31] = 0.0;
    assert_eq!(deq(DType::Q4_1, &b), want);
}

#[test]
fn q5_0_block() {
    let mut b = vec![0u8; 22]; // code 0 → −16
    b[0..2].copy_from_slice(&F16_1);
    b[2..6].copy_from_slice(&[0x01, 0x00, 0x01, 0x00]); // qh bits 0 and 16
    b[6] = 0x2F; // x0 = (15|16)−16 = 15, x16 = (2|16)−16 = 2
    b[7] = 0x3C; // x1 = 12−16 = −4, x17 = 3−16 = −13
    let mut want = vec![-16f32; 32];
    want[0] = 15.0;
    want[16] = 2.0;
    want[1] = -4.0;
    want[17] = -13.0;
    assert_eq!(deq(DType::Q5_0, &b), want);
}

#[test]
fn q5_1_block() {
    let mut b = vec![0u8; 24]; // code 0 → m = 1
    b[0..2].copy_from_slice(&F16_0_5);
    b[2..4].copy_from_slice(&F16_1);
    b[4..8].copy_from_slice(&[0x00, 0x00, 0x00, 0x80]); // qh bit 31 → element 31
    b[8 + 15] = 0x30; // x15 = 0·0.5 + 1 = 1, x31 = (3|16)·0.5 + 1 = 10.5
    b[8] = 0x01; // x0 = 1·0.5 + 1 = 1.5
    let mut want = vec![1f32; 32];
    want[31] = 10.5;
    want[0] = 1.5;
    assert_eq!(deq(DType::Q5_1, &b), want);
}

#[test]
fn q8_0_block() {
    let mut b = vec![0u8; 34];
    b[0..2].copy_from_slice(&F16_0_125);
    b[2] = 0x80; // −128 · 0.125 = −16
    b[3] = 0xFF; // −1 · 0.125
    b[33] = 0x7F; // 127 · 0.125 = 15.875
    let mut want = vec![0f32; 32];
    want[0] = -16.0;
    want[1] = -0.125;
    want[31] = 15.875;
    assert_eq!(deq(DType::Q8_0, &b), want);
}

#[test]
fn q4_k_block() {
    let mut b = vec![0u8; 144];
    b[0..2].copy_from_slice(&F16_1); // d
    b[2..4].copy_from_slice(&F16_0_5); // dmin
    let s = 4; // scales[12] start
    b[s] = 0x43; // sc0 = 3; top bits 01 → high bits of sc4
    b[s + 4] = 0x85; // m0 = 5; top bits 10 → high bits of m4
    b[s + 8] = 0x27; // sc4 = 7 | 1<<4 = 23, m4 = 2 | 2<<4 = 34
    let q = 16; // qs[128] start
    b[q] = 0xA9; // element 0: low 9 (sub-block 0); element 32: high 10 (sub-block 1: sc 0, m 0)
    b[q + 64] = 0x0C; // element 128: low 12 (sub-block 4); element 160: sub-block 5 → 0
    let mut want = vec![0f32; 256];
    // sub-block 0: 1·3·q − 0.5·5
    for v in &mut want[0..32] {
        *v = -2.5;
    }
    want[0] = 27.0 - 2.5;
    // sub-block 4: 1·23·q − 0.5·34
    for v in &mut want[128..160] {
        *v = -17.0;
    }
    want[128] = 276.0 - 17.0;
    assert_eq!(deq(DType::Q4_K, &b), want);
}

#[test]
fn q5_k_block() {
    let mut b = vec![0u8; 176];
    b[0..2].copy_from_slice(&F16_0_5); // d
    b[2..4].copy_from_slice(&F16_1); // dmin
    let s = 4;
    b[s + 1] = 2; // sc1 = 2
    b[s + 5] = 1; // m1 = 1
    b[s + 10] = 0x31; // sc6 = 1, m6 = 3
    let qh = 16; // qh[32]
    let qs = 48; // qs[128]
    b[qh + 3] = 0x02; // bit 1 → 5th bit of element 32+3 (chunk 0, high nibble)
    b[qs + 3] = 0x70; // element 35: 7 | 16 = 23
    b[qh] = 0x40; // bit 6 → 5th bit of element 192 (chunk 3, low nibble)
    b[qs + 96] = 0x05; // element 192: 5 | 16 = 21
    let mut want = vec![0f32; 256];
    for v in &mut want[32..64] {
        *v = -1.0; // 0.5·2·0 − 1·1
    }
    want[35] = 0.5 * 2.0 * 23.0 - 1.0;
    for v in &mut want[192..224] {
        *v = -3.0; // 0.5·1·0 − 1·3
    }
    want[192] = 0.5 * 21.0 - 3.0;
    assert_eq!(deq(DType::Q5_K, &b), want);
}

#[test]
fn q6_k_block() {
    let mut b = vec![0u8; 210]; // every code 0 → q − 32 = −32
    let (ql, qh, sc, d) = (0, 128, 192, 208);
    b[d..d + 2].copy_from_slice(&F16_2);
    b[sc] = 1; // group 0: elements 0..16
    b[sc + 2] = (-1i8) as u8; // group 2: elements 32..48
    b[sc + 13] = 3; // group 13: elements 208..224
    b[ql] = 0x21; // element 0 low = 1, element 64 low = 2
    b[qh] = 0xC9; // 0b11_00_10_01: element 0 hi 1, element 32 hi 2, element 64 hi 0, element 96 hi 3
    b[ql + 32] = 0x0F; // element 32 low = 15, element 96 low = 0
    b[ql + 64 + 20] = 0xF0; // half 1, l = 20: element 128+64+20 = 212 low = 15
    b[qh + 32 + 20] = 0x30; // its high bits = 3
    let mut want = vec![0f32; 256];
    for v in &mut want[0..16] {
        *v = 2.0 * 1.0 * -32.0;
    }
    want[0] = 2.0 * (17.0 - 32.0);
    for v in &mut want[32..48] {
        *v = 2.0 * -1.0 * -32.0;
    }
    want[32] = 2.0 * -1.0 * (47.0 - 32.0);
    for v in &mut want[208..224] {
        *v = 2.0 * 3.0 * -32.0;
    }
    want[212] = 2.0 * 3.0 * (63.0 - 32.0);
    assert_eq!(deq(DType::Q6_K, &b), want);
}

#[test]
fn float_rows() {
    let mut out = [0f32; 2];
    quant::dequantize_row(DType::F32, &[0, 0, 0x80, 0x3F, 0, 0, 0, 0xC0], &mut out);
    assert_eq!(out, [1.0, -2.0]);
    quant::dequantize_row(DType::F16, &[0x00, 0x3C, 0x00, 0xC1], &mut out);
    assert_eq!(out, [1.0, -2.5]);
    quant::dequantize_row(DType::BF16, &[0x80, 0x3F, 0x20, 0xC0], &mut out);
    assert_eq!(out, [1.0, -2.5]);
    // Unaligned source.
    let raw = [0u8, 0, 0, 0x80, 0x3F];
    let mut one = [0f32; 1];
    quant::dequantize_row(DType::F32, &raw[1..], &mut one);
    assert_eq!(one, [1.0]);
    let mut bytes = [0u8; 4];
    quant::quantize_row(DType::BF16, &[1.0, -2.5], &mut bytes).unwrap();
    assert_eq!(bytes, [0x80, 0x3F, 0x20, 0xC0]);
}

#[test]
fn q4_0_quantize_hand() {
    // max-magnitude value is −4 → d = −4/−8 = 0.5, id = 2.
    let mut x = [0f32; 32];
    x[0] = -4.0; // −8 + 8.5 = 0.5 → 0
    x[1] = 3.5; // 7 + 8.5 = 15.5 → 15
    x[2] = 3.9; // 7.8 + 8.5 = 16.3 → 16 → clamped to 15
    x[16] = 0.26; // 0.52 + 8.5 → 9
    x[17] = -0.3; // −0.6 + 8.5 → 7
    let mut b = [0u8; 18];
    quant::quantize_row(DType::Q4_0, &x, &mut b).unwrap();
    assert_eq!(&b[0..2], &F16_0_5);
    assert_eq!(b[2], 0x90); // lo 0, hi 9
    assert_eq!(b[3], 0x7F); // lo 15, hi 7
    assert_eq!(b[4], 0x8F); // lo 15, hi 8 (x = 0)
    assert_eq!(b[5], 0x88);
    // The I-quants below 4 bits need an importance matrix to write well: not written.
    assert!(quant::quantize_row(DType::IQ2_XXS, &[0.0; 256], &mut [0u8; 66]).is_err());
    assert!(quant::quantize_row(DType::Q4_K, &[0.0; 256], &mut [0u8; 144]).is_ok());
    assert!(quant::quantize_row(DType::Q6_K, &[0.0; 256], &mut [0u8; 210]).is_ok());
}

#[test]
fn q8_0_quantize_hand() {
    let mut x = [0f32; 32];
    x[0] = 2.54; // amax → d = 0.02, q = 127
    x[1] = -1.27; // −63.5 → weights: roundf → −64; activations: ties-even → −64
    x[2] = 0.03; // 1.5 → 2 (both rules)
    x[3] = 0.05; // 2.5 → weights 3 (away from zero), activations 2 (even)
    let mut w = [0u8; 34];
    quant::quantize_row(DType::Q8_0, &x, &mut w).unwrap();
    let wq: Vec<i8> = w[2..].iter().map(|&v| v as i8).collect();
    assert_eq!(&wq[..5], &[127, -64, 2, 3, 0]);
    // x·(127/amax) with exactly representable ties: use powers of two.
    let mut y = [0f32; 32];
    y[0] = 127.0; // amax → d = 1, scale 127/127 = 1
    y[1] = 2.5; // → 2 (ties to even)
    y[2] = -3.5; // → −4
    y[3] = 0.5; // → 0
    let mut a = [q8_0::BlockQ8_0 { d: Default::default(), qs: [0; 32] }];
    q8_0::quantize_activations(&y, &mut a);
    assert_eq!(&a[0].qs[..5], &[127, 2, -4, 0, 0]);
    assert_eq!(a[0].d.to_f32(), 1.0);
    let mut a1 = [q8_1::BlockQ8_1 { d: Default::default(), s: Default::default(), qs: [0; 32] }];
    q8_1::quantize(&y, &mut a1);
    assert_eq!(a1[0].qs, a[0].qs);
    assert_eq!(a1[0].s.to_f32(), 127.0 + 2.0 - 4.0);
}

#[test]
fn q8_k_quantize_hand() {
    let mut x = [0f32; 256];
    x[0] = 2.0; // max (positive) → iscale = −63.5, q = −127, d = −1/63.5
    x[1] = -1.0; // 63.5 → 64 (ties to even)
    x[2] = 0.5; // −31.75 → −32
    x[17] = -2.0; // 127
    let mut b = [q8_k::BlockQ8K { d: 0.0, qs: [0; 256], bsums: [0; 16] }];
    q8_k::quantize(&x, &mut b);
    assert_eq!(&b[0].qs[..3], &[-127, 64, -32]);
    assert_eq!(b[0].qs[17], 127);
    assert_eq!(b[0].d, 1.0 / -63.5);
    assert_eq!(b[0].bsums[0], -127 + 64 - 32);
    assert_eq!(b[0].bsums[1], 127);
    assert!(b[0].bsums[2..].iter().all(|&s| s == 0));
    q8_k::quantize(&[0.0; 256], &mut b);
    assert_eq!(b[0].d, 0.0);
}
