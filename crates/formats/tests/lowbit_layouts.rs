//! Low-bit safetensors layouts as the publishers write them (FORMATS.md §1):
//! each layout built by hand here, loaded, and compared value by value with an
//! independent decode (E2M1 table, E4M3 and E8M0 formulas written out below);
//! then the one-line errors for NaN scales, wrong shapes and missing companions.

mod common;

use common::write_safetensors;
use kernels::DType;
use shardlm_formats::hf::read_safetensors;
use shardlm_formats::FormatError;

const E2M1: [f32; 16] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];

fn e4m3(b: u8) -> f32 {
    let (s, e, m) = (if b & 0x80 != 0 { -1.0 } else { 1.0 }, ((b >> 3) & 15) as i32, (b & 7) as f32);
    s * if e == 0 { m * 2f32.powi(-9) } else { (1.0 + m / 8.0) * 2f32.powi(e - 7) }
}

/// A deterministic byte stream.
fn bytes(n: usize, seed: u32) -> Vec<u8> {
    (0..n as u32).map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed) >> 13) as u8).collect()
}

fn f32b(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn load(tensors: &[(&str, &str, &[usize], Vec<u8>)]) -> Result<Vec<shardlm_formats::WeightTensor>, FormatError> {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("model.safetensors");
    write_safetensors(&p, tensors);
    read_safetensors(&p)
}

fn one(tensors: &[(&str, &str, &[usize], Vec<u8>)], name: &str) -> shardlm_formats::WeightTensor {
    let ts = load(tensors).unwrap();
    ts.into_iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no {name}"))
}

fn err(tensors: &[(&str, &str, &[usize], Vec<u8>)]) -> String {
    load(tensors).expect_err("should fail").to_string()
}

/// Publisher FP4 packing: element k in byte k/2, low nibble first.
fn fp4(codes: &[u8], k: usize) -> f32 {
    E2M1[((codes[k / 2] >> (4 * (k % 2))) & 15) as usize]
}

/// Scale bytes that are valid E4M3 (no NaN code).
fn e4m3_scales(n: usize, seed: u32) -> Vec<u8> {
    bytes(n, seed).into_iter().map(|b| b % 0x7F).collect()
}

#[test]
fn nvfp4_modelopt_and_compressed_tensors() {
    let (n, k) = (3, 128);
    let codes = bytes(n * k / 2, 1);
    let scales = e4m3_scales(n * k / 16, 2);
    let want = |g: f32| -> Vec<f32> {
        (0..n * k).map(|i| fp4(&codes[(i / k) * k / 2..], i % k) * e4m3(scales[i / 16]) * g).collect()
    };
    // ModelOpt: weight_scale_2 multiplies.
    let w = one(
        &[
            ("l.weight", "U8", &[n, k / 2], codes.clone()),
            ("l.weight_scale", "F8_E4M3", &[n, k / 16], scales.clone()),
            ("l.weight_scale_2", "F32", &[], f32b(&[0.25])),
            ("l.input_scale", "F32", &[], f32b(&[0.5])),
        ],
        "l.weight",
    );
    assert_eq!((w.dtype, w.shape.clone(), w.out_scale), (DType::NVFP4, vec![n, k], 0.25));
    assert_eq!(w.to_f32(), want(0.25));
    // compressed-tensors: weight_global_scale divides.
    let w = one(
        &[
            ("l.weight_packed", "U8", &[n, k / 2], codes.clone()),
            ("l.weight_scale", "F8_E4M3", &[n, k / 16], scales.clone()),
            ("l.weight_global_scale", "F32", &[1], f32b(&[4.0])),
            ("l.input_global_scale", "F32", &[1], f32b(&[2.0])),
        ],
        "l.weight",
    );
    assert_eq!((w.dtype, w.out_scale), (DType::NVFP4, 0.25));
    assert_eq!(w.to_f32(), want(0.25));
}

#[test]
fn mxfp4_gpt_oss_and_compressed_tensors() {
    let (e, rows, k) = (2, 3, 64);
    let codes = bytes(e * rows * k / 2, 3);
    let scales: Vec<u8> = bytes(e * rows * k / 32, 4).into_iter().map(|b| 110 + b % 30).collect();
    let want: Vec<f32> = (0..e * rows * k)
        .map(|i| fp4(&codes[(i / k) * k / 2..], i % k) * 2f32.powi(scales[i / 32] as i32 - 127))
        .collect();
    let w = one(
        &[
            ("m.experts.down_proj_blocks", "U8", &[e, rows, k / 32, 16], codes.clone()),
            ("m.experts.down_proj_scales", "U8", &[e, rows, k / 32], scales.clone()),
        ],
        "m.experts.down_proj",
    );
    assert_eq!((w.dtype, w.shape.clone()), (DType::MXFP4, vec![e, rows, k]));
    assert_eq!(w.to_f32(), want);
    let w = one(
        &[("l.weight_packed", "U8", &[e * rows, k / 2], codes), ("l.weight_scale", "U8", &[e * rows, k / 32], scales)],
        "l.weight",
    );
    assert_eq!((w.dtype, w.shape.clone()), (DType::MXFP4, vec![e * rows, k]));
    assert_eq!(w.to_f32(), want);
}

#[test]
fn fp8_tensor_channel_and_block_scales() {
    let (n, k) = (130, 256);
    let q: Vec<u8> = bytes(n * k, 5).into_iter().map(|b| if b & 0x7F == 0x7F { 0x10 } else { b }).collect();
    let check = |scale_name: &str, shape: &[usize], s: Vec<f32>, at: &dyn Fn(usize, usize) -> f32| {
        let w = one(&[("l.weight", "F8_E4M3", &[n, k], q.clone()), (scale_name, "F32", shape, f32b(&s))], "l.weight");
        assert_eq!(w.dtype, DType::FP8);
        let got = w.to_f32();
        for r in 0..n {
            for c in 0..k {
                assert_eq!(got[r * k + c], e4m3(q[r * k + c]) * at(r, c), "{scale_name} {shape:?} at {r},{c}");
            }
        }
    };
    check("l.weight_scale", &[1], vec![0.5], &|_, _| 0.5);
    let ch: Vec<f32> = (0..n).map(|r| 0.01 * (r + 1) as f32).collect();
    check("l.weight_scale", &[n, 1], ch.clone(), &|r, _| ch[r]);
    // DeepSeek 128×128 blocks: ⌈130/128⌉ × 256/128 = 2 × 2 (the last row block is partial).
    let blk = vec![1.0, 2.0, 3.0, 4.0];
    check("l.weight_scale_inv", &[2, 2], blk.clone(), &|r, c| blk[(r / 128) * 2 + c / 128]);
}

#[test]
fn errors_name_the_tensor() {
    let (n, k) = (2, 64);
    let codes = bytes(n * k / 2, 1);
    let mut scales = e4m3_scales(n * k / 16, 2);
    // NaN block scale (E4M3 0x7F).
    scales[3] = 0x7F;
    let m = err(&[
        ("l.weight", "U8", &[n, k / 2], codes.clone()),
        ("l.weight_scale", "F8_E4M3", &[n, k / 16], scales.clone()),
        ("l.weight_scale_2", "F32", &[], f32b(&[1.0])),
    ]);
    assert!(m.contains("tensor 'l.weight'") && m.contains("NaN"), "{m}");
    // NaN global scale.
    scales[3] = 0x30;
    let m = err(&[
        ("l.weight", "U8", &[n, k / 2], codes.clone()),
        ("l.weight_scale", "F8_E4M3", &[n, k / 16], scales.clone()),
        ("l.weight_scale_2", "F32", &[], f32b(&[f32::NAN])),
    ]);
    assert!(m.contains("tensor 'l.weight_scale_2'") && m.contains("NaN"), "{m}");
    // Missing companion.
    let m = err(&[
        ("l.weight", "U8", &[n, k / 2], codes.clone()),
        ("l.weight_scale", "F8_E4M3", &[n, k / 16], scales.clone()),
    ]);
    assert!(m.contains("tensor 'l.weight'") && m.contains("missing companion tensor 'l.weight_scale_2'"), "{m}");
    let m = err(&[("l.weight", "F8_E4M3", &[n, k], vec![0; n * k])]);
    assert!(m.contains("missing companion tensor 'l.weight_scale'"), "{m}");
    // Wrong scale shape.
    let m = err(&[
        ("l.weight", "U8", &[n, k / 2], codes.clone()),
        ("l.weight_scale", "F8_E4M3", &[n, k / 32], scales[..n * k / 32].to_vec()),
        ("l.weight_scale_2", "F32", &[], f32b(&[1.0])),
    ]);
    assert!(m.contains("tensor 'l.weight'") && m.contains("expected F8_E4M3 [2, 4]"), "{m}");
    let m = err(&[("l.weight", "F8_E4M3", &[n, k], vec![0; n * k]), ("l.weight_scale", "F32", &[3], f32b(&[1.0; 3]))]);
    assert!(m.contains("tensor 'l.weight'") && m.contains("per channel"), "{m}");
    // FP8 scale NaN / Inf; MXFP4 E8M0 NaN.
    let m = err(&[
        ("l.weight", "F8_E4M3", &[n, k], vec![0; n * k]),
        ("l.weight_scale", "F32", &[1], f32b(&[f32::INFINITY])),
    ]);
    assert!(m.contains("tensor 'l.weight'") && m.contains("inf"), "{m}");
    let m = err(&[("x_blocks", "U8", &[1, 2, 16], vec![0; 32]), ("x_scales", "U8", &[1, 2], vec![127, 255])]);
    assert!(m.contains("tensor 'x'") && m.contains("NaN"), "{m}");
    // A scale without its weight.
    let m = err(&[("l.weight_scale_inv", "F32", &[1, 1], f32b(&[1.0]))]);
    assert!(m.contains("tensor 'l.weight_scale_inv'") && m.contains("without its weight"), "{m}");
    // One line each.
    assert!(!m.contains('\n'));
}

/// Widths that are not whole 64-value blocks (NVFP4 K = 48 and 288, FP8 K = 96
/// and 200) load as exact f32 values instead of being refused; `out_scale` is
/// kept (`to_f32` applies it). A NaN scale in the tail path is still refused.
#[test]
fn widths_not_a_multiple_of_64_load_as_f32() {
    for k in [48usize, 288] {
        let n = 3;
        let codes = bytes(n * k / 2, 7);
        let scales = e4m3_scales(n * k / 16, 8);
        let w = one(
            &[
                ("l.weight", "U8", &[n, k / 2], codes.clone()),
                ("l.weight_scale", "F8_E4M3", &[n, k / 16], scales.clone()),
                ("l.weight_scale_2", "F32", &[], f32b(&[0.25])),
            ],
            "l.weight",
        );
        assert_eq!((w.dtype, w.shape.clone(), w.out_scale), (DType::F32, vec![n, k], 0.25), "NVFP4 K = {k}");
        let want: Vec<f32> =
            (0..n * k).map(|i| fp4(&codes[(i / k) * k / 2..], i % k) * e4m3(scales[i / 16]) * 0.25).collect();
        assert_eq!(w.to_f32(), want, "NVFP4 K = {k}");
        let mut bad = scales.clone();
        bad[n * k / 16 - 1] = 0x7F;
        let m = err(&[
            ("l.weight", "U8", &[n, k / 2], codes),
            ("l.weight_scale", "F8_E4M3", &[n, k / 16], bad),
            ("l.weight_scale_2", "F32", &[], f32b(&[0.25])),
        ]);
        assert!(m.contains("tensor 'l.weight'") && m.contains("NaN"), "{m}");
    }
    for k in [96usize, 200] {
        let n = 5;
        let q: Vec<u8> = bytes(n * k, 9).into_iter().map(|b| if b & 0x7F == 0x7F { 0x10 } else { b }).collect();
        let ch: Vec<f32> = (0..n).map(|r| 0.5 + r as f32).collect();
        let w = one(
            &[("l.weight", "F8_E4M3", &[n, k], q.clone()), ("l.weight_scale", "F32", &[n, 1], f32b(&ch))],
            "l.weight",
        );
        assert_eq!((w.dtype, w.shape.clone()), (DType::F32, vec![n, k]), "FP8 K = {k}");
        let want: Vec<f32> = (0..n * k).map(|i| e4m3(q[i]) * ch[i / k]).collect();
        assert_eq!(w.to_f32(), want, "FP8 K = {k}");
        // 128×128 block scales over a partial last column block.
        let cb = k.div_ceil(128);
        let blk: Vec<f32> = (0..cb).map(|c| 1.0 + c as f32).collect();
        let w = one(
            &[("l.weight", "F8_E4M3", &[n, k], q.clone()), ("l.weight_scale_inv", "F32", &[1, cb], f32b(&blk))],
            "l.weight",
        );
        let want: Vec<f32> = (0..n * k).map(|i| e4m3(q[i]) * blk[(i % k) / 128]).collect();
        assert_eq!(w.to_f32(), want, "FP8 blocks K = {k}");
    }
}
