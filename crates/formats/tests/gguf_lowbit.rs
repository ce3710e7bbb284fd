//! GGUF MXFP4 (type 39) and NVFP4 (type 40) tensors: loaded in place, llama.cpp's
//! per-tensor `.scale` tensors applied, NaN scales refused naming the tensor.

mod common;

use common::tiny_llama_writer;
use kernels::DType;
use shardlm_formats::open_model;

/// One NVFP4 block: scales 1.0 (0x38) and 2.0 (0x40) ×2; element 0 = 6, element 8 = −0.5, element 16 = 2·1.
fn nvfp4_block() -> Vec<u8> {
    let mut b = vec![0x38, 0x40, 0x38, 0x40];
    let mut qs = [0u8; 32];
    qs[0] = 0x97; // element 0: code 7 (6.0); element 8: code 9 (−0.5)
    qs[8] = 0x02; // element 16: code 2 (1.0) × scale 2.0
    b.extend(qs);
    b
}

/// One MXFP4 block with E8M0 `e`: element 0 = 1.5·2^(e−127).
fn mxfp4_block(e: u8) -> Vec<u8> {
    let mut b = vec![e, 0x03];
    b.extend([0u8; 15]);
    b
}

#[test]
fn mxfp4_and_nvfp4_with_tensor_scale() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = tiny_llama_writer();
    w.add_tensor("blk.0.extra_nv.weight", &[2, 64], DType::NVFP4, [nvfp4_block(), nvfp4_block()].concat());
    w.add_f32_tensor("blk.0.extra_nv.scale", &[1], &[0.5]);
    w.add_f32_tensor("blk.0.extra_nv.input_scale", &[1], &[3.0]);
    w.add_tensor("blk.0.extra_mx.weight", &[1, 32], DType::MXFP4, mxfp4_block(128));
    let p = dir.path().join("m.gguf");
    w.write_to(&p).unwrap();
    let m = open_model(&p).unwrap();
    let t = |suffix: &str| m.tensors.tensors.values().find(|t| t.name.ends_with(suffix)).unwrap().clone();
    let nv = t("extra_nv.weight");
    assert_eq!((nv.dtype, nv.out_scale, nv.shape.clone()), (DType::NVFP4, 0.5, vec![2, 64]));
    let x = nv.to_f32();
    assert_eq!((x[0], x[8], x[16], x[64]), (3.0, -0.25, 1.0, 3.0));
    let mx = t("extra_mx.weight");
    assert_eq!((mx.dtype, mx.out_scale), (DType::MXFP4, 1.0));
    assert_eq!(mx.to_f32()[0], 3.0);
    assert!(!m.tensors.tensors.keys().any(|k| k.contains("scale")));
}

#[test]
fn nan_scales_and_orphan_scales_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.gguf");
    let err = |w: &shardlm_formats::gguf_writer::GgufWriter| {
        w.write_to(&p).unwrap();
        open_model(&p).expect_err("must fail").to_string()
    };
    let mut w = tiny_llama_writer();
    w.add_tensor("blk.0.extra_mx.weight", &[1, 64], DType::MXFP4, [mxfp4_block(1), mxfp4_block(0xFF)].concat());
    let m = err(&w);
    assert!(m.contains("tensor 'blk.0.extra_mx.weight'") && m.contains("mxfp4 block 1") && m.contains("NaN"), "{m}");
    let mut bad = nvfp4_block();
    bad[2] = 0x7F;
    let mut w = tiny_llama_writer();
    w.add_tensor("blk.0.extra_nv.weight", &[1, 64], DType::NVFP4, bad);
    let m = err(&w);
    assert!(m.contains("tensor 'blk.0.extra_nv.weight'") && m.contains("NaN"), "{m}");
    let mut w = tiny_llama_writer();
    w.add_tensor("blk.0.extra_nv.weight", &[1, 64], DType::NVFP4, nvfp4_block());
    w.add_f32_tensor("blk.0.extra_nv.scale", &[1], &[f32::NAN]);
    let m = err(&w);
    assert!(m.contains("tensor 'blk.0.extra_nv.scale'") && m.contains("NaN"), "{m}");
    let mut w = tiny_llama_writer();
    w.add_f32_tensor("blk.0.nothing.scale", &[1], &[1.0]);
    let m = err(&w);
    assert!(m.contains("blk.0.nothing.weight") && m.contains("no such weight"), "{m}");
    assert!(!m.contains('\n'));
}
