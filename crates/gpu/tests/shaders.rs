//! Every shader against its host reference (the `kernels` crate's scalar
//! code or a plain loop), per weight type and shape, block tails included.
//! Runs on whatever adapter the machine has; in CI that is Mesa's llvmpipe.
//! Without any adapter the tests say so and pass, except under `CI=true`,
//! where `.ci/run` installs one and a missing adapter is a failure.

use kernels::{ops, DType};
use rand::{Rng, SeedableRng};

mod common;
use common::{assert_close, encode, gpu, random};
use shardlm_gpu::{Act, AttnArgs, DeviceWeight, KvElem, Pass};

#[test]
fn matmul_every_type_and_tail() {
    let Some(gpu) = gpu() else { return };
    // Widths: a multiple of the workgroup, one that is not (floats), and
    // block multiples that leave the last round of 64 blocks partial.
    for dtype in shardlm_gpu::WEIGHT_TYPES {
        for &(rows, cols, t) in
            &[(37usize, 96usize, 3usize), (5, 288, 1), (130, 64 * 33, 2), (3, 70, 4), (9, 256 * 9, 2)]
        {
            if dtype.is_quantized() && cols % dtype.block_elems() != 0 {
                continue;
            }
            let w = random(rows * cols, rows as u64 * 7 + cols as u64);
            let x = random(t * cols, 99 + t as u64);
            let bias = random(rows, 5);
            let (bytes, held) = encode(dtype, &w, cols);
            for with_bias in [false, true] {
                let dw =
                    DeviceWeight::upload(&gpu, "w", dtype, (rows, cols), &bytes, with_bias.then_some(&bias[..]), 0.5)
                        .unwrap();
                // Offsets into both buffers, as a step's rows are.
                let xb = gpu.buffer("x", 7 + t * cols).unwrap();
                gpu.write_f32(&xb, 7, &x);
                let yb = gpu.buffer("y", 3 + t * rows).unwrap();
                let mut pass = Pass::new(&gpu);
                pass.matmul(&dw, &xb, 7, t, &yb, 3);
                pass.submit().unwrap();
                let got = gpu.read_f32(&yb, 3, t * rows).unwrap();
                // Accumulating adds the same again.
                let mut pass = Pass::new(&gpu);
                pass.matmul_add(&dw, &xb, 7, t, &yb, 3);
                pass.submit().unwrap();
                let twice = gpu.read_f32(&yb, 3, t * rows).unwrap();
                let doubled: Vec<f32> = got.iter().map(|v| 2.0 * v).collect();
                assert_close(&twice, &doubled, 1e-6, &format!("{dtype:?} {rows}×{cols} accumulated"));
                let mut want = vec![0f32; t * rows];
                for r in 0..t {
                    for n in 0..rows {
                        let dot: f64 = (0..cols).map(|k| held[n * cols + k] as f64 * x[r * cols + k] as f64).sum();
                        want[r * rows + n] = (dot * 0.5) as f32 + if with_bias { bias[n] } else { 0.0 };
                    }
                }
                assert_close(&got, &want, 2e-5, &format!("{dtype:?} {rows}×{cols} t={t} bias={with_bias}"));
            }
        }
    }
}

#[test]
fn rms_norm_out_of_place_and_per_head() {
    let Some(gpu) = gpu() else { return };
    for &(width, rows) in &[(64usize, 3usize), (576, 5), (100, 40_000)] {
        let x = random(width * rows, width as u64);
        let w = random(width, 3);
        let mut want = vec![0f32; x.len()];
        ops::rms_norm(&x, &w, 1e-6, width, &mut want);
        let (xb, wb, yb) =
            (gpu.buffer("x", x.len() + 2).unwrap(), gpu.buffer("w", width).unwrap(), gpu.buffer("y", x.len()).unwrap());
        gpu.write_f32(&xb, 2, &x);
        gpu.write_f32(&wb, 0, &w);
        let mut pass = Pass::new(&gpu);
        pass.rms_norm(&xb, 2, &wb, (width, rows, 1e-6), &yb, 0);
        // And in place on a copy.
        pass.copy(&xb, 2, &xb, 0, 0);
        pass.submit().unwrap();
        assert_close(&gpu.read_f32(&yb, 0, x.len()).unwrap(), &want, 1e-5, &format!("rms_norm {width}×{rows}"));
        let mut pass = Pass::new(&gpu);
        pass.rms_norm_inplace(&xb, 2, &wb, (width, rows, 1e-6));
        pass.submit().unwrap();
        assert_close(&gpu.read_f32(&xb, 2, x.len()).unwrap(), &want, 1e-5, &format!("in place {width}×{rows}"));
    }
}

#[test]
fn rope_both_styles_and_partial_rotation() {
    let Some(gpu) = gpu() else { return };
    for style in [ops::RopeStyle::Neox, ops::RopeStyle::Interleaved] {
        for &(t, heads, hd, half) in &[(3usize, 4usize, 64usize, 32usize), (2, 2, 128, 16), (5, 3, 256, 128)] {
            let x = random(t * heads * hd, hd as u64);
            let cos = random(t * half, 1);
            let sin = random(t * half, 2);
            let mut want = x.clone();
            for r in 0..t {
                let c = &cos[r * half..(r + 1) * half];
                let s = &sin[r * half..(r + 1) * half];
                ops::rope(&mut want[r * heads * hd..(r + 1) * heads * hd], hd, c, s, style);
            }
            let xb = gpu.buffer("x", x.len() + 1).unwrap();
            gpu.write_f32(&xb, 1, &x);
            let (cb, sb) = (gpu.buffer("cos", cos.len()).unwrap(), gpu.buffer("sin", sin.len()).unwrap());
            gpu.write_f32(&cb, 0, &cos);
            gpu.write_f32(&sb, 0, &sin);
            let mut pass = Pass::new(&gpu);
            pass.rope(&xb, 1, (t, heads, hd, half), &cb, &sb, style == ops::RopeStyle::Interleaved);
            pass.submit().unwrap();
            let got = gpu.read_f32(&xb, 1, x.len()).unwrap();
            assert_close(&got, &want, 1e-6, &format!("rope {style:?} t={t} heads={heads} hd={hd} half={half}"));
        }
    }
}

#[test]
fn activations_and_residual_add() {
    let Some(gpu) = gpu() else { return };
    // Token rows of gate‖up; 2^24 outputs go past 65535 workgroups of 256
    // (the grid spills into y) while 2^25 inputs still fit one binding.
    for &(t, width) in &[(1usize, 1usize), (3, 1000), (65536, 256)] {
        let n = t * width;
        let gu = random(2 * n, 1).iter().map(|v| v * 6.0).collect::<Vec<_>>();
        let (g, u): (Vec<f32>, Vec<f32>) = (
            (0..n).map(|i| gu[(i / width) * 2 * width + i % width]).collect(),
            (0..n).map(|i| gu[(i / width) * 2 * width + width + i % width]).collect(),
        );
        for act in [Act::Silu, Act::GeluTanh, Act::ClampedSwiglu { alpha: 1.702, limit: 2.5 }] {
            let mut want = g.clone();
            match act {
                Act::Silu => want.iter_mut().zip(&u).for_each(|(a, &b)| *a = *a / (1.0 + (-*a).exp()) * b),
                Act::GeluTanh => ops::gelu_tanh_mul_scalar(&mut want, &u),
                Act::ClampedSwiglu { alpha, limit } => ops::swiglu_clamped(&mut want, &u, alpha, limit),
            }
            let (gub, ob, ub) =
                (gpu.buffer("gu", 2 * n).unwrap(), gpu.buffer("out", n).unwrap(), gpu.buffer("u", n).unwrap());
            gpu.write_f32(&gub, 0, &gu);
            gpu.write_f32(&ub, 0, &u);
            let mut pass = Pass::new(&gpu);
            pass.act_mul(&gub, &ob, (t, width), act);
            pass.add(&ob, &ub, n);
            pass.submit().unwrap();
            want.iter_mut().zip(&u).for_each(|(a, b)| *a += b);
            assert_close(&gpu.read_f32(&ob, 0, n).unwrap(), &want, 1e-5, &format!("{act:?} then add, {t}×{width}"));
        }
    }
}

/// Two sequences in one step over a shuffled block table (plain, windowed,
/// with a sink per head; f32, f16, Q8_0 and Q4_0 pools): the first decodes
/// one token at position 70, the second runs a 5-token chunk from position
/// 9; keys and values go through `kv_store` first, as in a layer. A
/// quantized pool after the store holds the bytes the host's quantizers
/// write (`kernels::kv_quant`), so the disk tier moves blocks either way.
#[test]
fn paged_attention_gqa_with_windows() {
    let Some(gpu) = gpu() else { return };
    let (heads, kv_heads, block) = (4usize, 2usize, 16usize);
    for &hd in &[64usize, 80, 256, 576] {
        let sink = Some([0.5f32, -1.0, 3.0, 0.0]);
        let cases = [
            (None, None, KvElem::F32),
            (Some(7usize), None, KvElem::F32),
            (None, sink, KvElem::F32),
            (Some(7), sink, KvElem::F16),
            (Some(7), sink, KvElem::Q8_0),
            (None, None, KvElem::Q4_0),
        ];
        for (window, sinks, kv) in cases {
            let row = kv_heads * hd;
            if !kv.fits_row(row) {
                continue;
            }
            let n_blocks = 12;
            let tables: Vec<u32> = vec![5, 2, 9, 0, 11, 3, /* seq 2: */ 7, 1];
            let seqs = [(70usize, 1usize, 0usize), (9, 5, 6)]; // (start, len, table offset)
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(hd as u64);
            let mut kp = vec![0f32; n_blocks * block * row];
            let mut vp = vec![0f32; n_blocks * block * row];
            kp.iter_mut().chain(vp.iter_mut()).for_each(|v| *v = rng.gen_range(-1.0..1.0));
            let t: usize = seqs.iter().map(|s| s.1).sum();
            let q = random(t * heads * hd, 11);
            let (mut knew, mut vnew) = (random(t * row, 12), random(t * row, 13));
            // The pool holds the values rounded to its type: so does the reference.
            for v in [&mut kp, &mut vp, &mut knew, &mut vnew] {
                *v = held(kv, v);
            }
            let (mut tok, mut slots) = (vec![], vec![]);
            for &(start, len, ts) in &seqs {
                for i in 0..len {
                    let pos = start + i;
                    tok.extend([pos as u32, ts as u32]);
                    slots.push(tables[ts + pos / block] * block as u32 + (pos % block) as u32);
                }
            }
            // Host reference: store, then attend.
            let (mut kr, mut vr) = (kp.clone(), vp.clone());
            for (j, &s) in slots.iter().enumerate() {
                kr[s as usize * row..][..row].copy_from_slice(&knew[j * row..(j + 1) * row]);
                vr[s as usize * row..][..row].copy_from_slice(&vnew[j * row..(j + 1) * row]);
            }
            let scale = 1.0 / (hd as f32).sqrt();
            let mut want = vec![0f32; t * heads * hd];
            for j in 0..t {
                let (pos, ts) = (tok[2 * j] as usize, tok[2 * j + 1] as usize);
                let first = window.map_or(0, |w| (pos + 1).saturating_sub(w));
                for h in 0..heads {
                    let kvh = h / (heads / kv_heads);
                    let qr = &q[(j * heads + h) * hd..][..hd];
                    let at = |p: usize| (tables[ts + p / block] as usize * block + p % block) * row + kvh * hd;
                    let s: Vec<f64> = (first..=pos)
                        .map(|p| (0..hd).map(|d| qr[d] as f64 * kr[at(p) + d] as f64).sum::<f64>() * scale as f64)
                        .collect();
                    let sink = sinks.map(|s| s[h] as f64);
                    let m = s.iter().cloned().chain(sink).fold(f64::MIN, f64::max);
                    let e: Vec<f64> = s.iter().map(|v| (v - m).exp()).collect();
                    let sum: f64 = e.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - m).exp());
                    for d in 0..hd {
                        let v: f64 = (first..=pos).zip(&e).map(|(p, w)| w * vr[at(p) + d] as f64).sum();
                        want[(j * heads + h) * hd + d] = (v / sum) as f32;
                    }
                }
            }
            let up = |name: &str, v: &[f32]| {
                let b = gpu.buffer(name, v.len()).unwrap();
                gpu.write_f32(&b, 0, v);
                b
            };
            let pool = |name: &str, v: &[f32]| gpu.buffer_with(name, &words(&encoded(kv, v))).unwrap();
            let (kb, vb, qb) = (pool("k", &kp), pool("v", &vp), up("q", &q));
            let (knb, vnb) = (up("knew", &knew), up("vnew", &vnew));
            let (tokb, tabb, slotb) = (
                gpu.buffer_with("tok", &tok).unwrap(),
                gpu.buffer_with("tables", &tables).unwrap(),
                gpu.buffer_with("slots", &slots).unwrap(),
            );
            let out = gpu.buffer("out", t * heads * hd).unwrap();
            let args = AttnArgs { heads, kv_heads, head_dim: hd, block, scale, window, kv };
            let mut pass = Pass::new(&gpu);
            pass.kv_store(&knb, 0, (t, row, row), &slotb, &kb, kv);
            pass.kv_store(&vnb, 0, (t, row, row), &slotb, &vb, kv);
            let sinkb = sinks.map(|s| up("sinks", &s));
            pass.attention(&qb, (0, heads * hd), t, &args, (&kb, &vb), (&tokb, &tabb), sinkb.as_ref(), &out);
            pass.submit().unwrap();
            let got = gpu.read_f32(&out, 0, want.len()).unwrap();
            let what = format!("attention hd={hd} window={window:?} sinks={sinks:?} {}", kv.name());
            assert_close(&got, &want, 1e-5, &what);
            // The stored rows: the host encoder's bytes.
            let stored = gpu.read_f32(&kb, 0, kv.bytes_for(kr.len()) / 4).unwrap();
            assert_eq!(bytemuck::cast_slice::<f32, u8>(&stored), &encoded(kv, &kr)[..], "{what}: stored bytes");
        }
    }
}

#[test]
fn unsupported_types_and_wrong_sizes_are_refused_in_one_line() {
    let Some(gpu) = gpu() else { return };
    let e =
        DeviceWeight::upload(&gpu, "blk.0.ffn_down.weight", DType::IQ4_XS, (2, 256), &[0; 272], None, 1.0).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("tensor 'blk.0.ffn_down.weight' has type IQ4_XS, which the GPU backend cannot read yet"),
        "{e}"
    );
    let e = DeviceWeight::upload(&gpu, "w", DType::Q8_0, (2, 32), &[0; 40], None, 1.0).unwrap_err();
    assert!(e.to_string().contains("40 bytes for 2 × 32 Q8_0 (expected 68)"), "{e}");
}

/// A matrix larger than one binding is held in parts of whole rows, each
/// writing its columns of y (a 262k-row embedding on a 128 MiB binding
/// limit; here the limit is lowered to 4 KiB).
#[test]
fn a_matrix_past_the_binding_limit_goes_in_parts() {
    let Some(mut gpu) = gpu() else { return };
    let limit = gpu.info.max_binding_bytes;
    for dtype in [DType::F32, DType::Q8_0, DType::Q4_K] {
        gpu.info.max_binding_bytes = 4096;
        let (rows, cols, t) = (37usize, 512usize, 3usize);
        let w = random(rows * cols, 17);
        let x = random(t * cols, 18);
        let bias = random(rows, 19);
        let (bytes, held) = encode(dtype, &w, cols);
        let dw = DeviceWeight::upload(&gpu, "w", dtype, (rows, cols), &bytes, Some(&bias), 1.0).unwrap();
        gpu.info.max_binding_bytes = limit;
        let xb = gpu.buffer("x", t * cols).unwrap();
        gpu.write_f32(&xb, 0, &x);
        let yb = gpu.buffer("y", t * rows).unwrap();
        let mut pass = Pass::new(&gpu);
        pass.matmul(&dw, &xb, 0, t, &yb, 0);
        pass.submit().unwrap();
        let got = gpu.read_f32(&yb, 0, t * rows).unwrap();
        let want: Vec<f32> = (0..t * rows)
            .map(|i| {
                let (r, n) = (i / rows, i % rows);
                let dot: f64 = (0..cols).map(|k| held[n * cols + k] as f64 * x[r * cols + k] as f64).sum();
                dot as f32 + bias[n]
            })
            .collect();
        assert_close(&got, &want, 2e-5, &format!("{dtype:?} in parts"));
    }
}

/// The fused layout a layer uses: q‖k‖v side by side in each token row.
/// Per-head norms, one rope over q's and k's heads, the KV store and the
/// attention's queries all read that row in place, and equal the same ops
/// on separate contiguous q and k.
#[test]
fn strided_rows_equal_contiguous_ones() {
    let Some(gpu) = gpu() else { return };
    let (t, nh, nkv, hd, half) = (3usize, 4usize, 2usize, 64usize, 32usize);
    let (hq, hkv) = (nh * hd, nkv * hd);
    let w = hq + 2 * hkv;
    let qkv = random(t * w, 5);
    let norm_q = random(hd, 6);
    let norm_k = random(hd, 7);
    let (cos, sin) = (random(t * half, 8), random(t * half, 9));
    // Contiguous reference on the host.
    let mut q: Vec<f32> = (0..t).flat_map(|r| qkv[r * w..r * w + hq].to_vec()).collect();
    let mut k: Vec<f32> = (0..t).flat_map(|r| qkv[r * w + hq..r * w + hq + hkv].to_vec()).collect();
    let (mut qn, mut kn) = (vec![0f32; q.len()], vec![0f32; k.len()]);
    ops::rms_norm(&q, &norm_q, 1e-6, hd, &mut qn);
    ops::rms_norm(&k, &norm_k, 1e-6, hd, &mut kn);
    (q, k) = (qn, kn);
    for r in 0..t {
        let (c, s) = (&cos[r * half..(r + 1) * half], &sin[r * half..(r + 1) * half]);
        ops::rope(&mut q[r * hq..(r + 1) * hq], hd, c, s, ops::RopeStyle::Neox);
        ops::rope(&mut k[r * hkv..(r + 1) * hkv], hd, c, s, ops::RopeStyle::Neox);
    }
    let up = |name: &str, v: &[f32]| {
        let b = gpu.buffer(name, v.len()).unwrap();
        gpu.write_f32(&b, 0, v);
        b
    };
    let (xb, qnb, knb, cb, sb) =
        (up("qkv", &qkv), up("qn", &norm_q), up("kn", &norm_k), up("cos", &cos), up("sin", &sin));
    let kpool = gpu.buffer("kpool", t * hkv).unwrap();
    let slots = gpu.buffer_with("slots", &(0..t as u32).collect::<Vec<_>>()).unwrap();
    let mut pass = Pass::new(&gpu);
    pass.rms_norm_heads(&xb, 0, &qnb, (hd, nh, t, 1e-6), w);
    pass.rms_norm_heads(&xb, hq, &knb, (hd, nkv, t, 1e-6), w);
    pass.rope_rows(&xb, (0, w), (t, nh + nkv, hd, half), &cb, &sb, false);
    pass.kv_store(&xb, hq, (t, hkv, w), &slots, &kpool, KvElem::F32);
    pass.submit().unwrap();
    let got = gpu.read_f32(&xb, 0, t * w).unwrap();
    let got_q: Vec<f32> = (0..t).flat_map(|r| got[r * w..r * w + hq].to_vec()).collect();
    let got_k: Vec<f32> = (0..t).flat_map(|r| got[r * w + hq..r * w + hq + hkv].to_vec()).collect();
    assert_close(&got_q, &q, 1e-5, "q norm + rope in a q‖k‖v row");
    assert_close(&got_k, &k, 1e-5, "k norm + rope in a q‖k‖v row");
    assert_close(&gpu.read_f32(&kpool, 0, t * hkv).unwrap(), &k, 1e-5, "k stored from a q‖k‖v row");
    let got_v: Vec<f32> = (0..t).flat_map(|r| got[r * w + hq + hkv..(r + 1) * w].to_vec()).collect();
    let want_v: Vec<f32> = (0..t).flat_map(|r| qkv[r * w + hq + hkv..(r + 1) * w].to_vec()).collect();
    assert_eq!(got_v, want_v, "v untouched");
}

/// `v` as a pool of `kv` stores it, the host's way (rows of whole blocks).
fn encoded(kv: KvElem, v: &[f32]) -> Vec<u8> {
    use kernels::quant::{q4_0, q8_0};
    match kv {
        KvElem::F32 => bytemuck::cast_slice(v).to_vec(),
        KvElem::F16 => v.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect(),
        KvElem::Q8_0 => {
            let mut b = vec![<q8_0::BlockQ8_0 as bytemuck::Zeroable>::zeroed(); v.len() / 32];
            q8_0::quantize_activations(v, &mut b);
            bytemuck::cast_slice(&b).to_vec()
        }
        KvElem::Q4_0 => {
            let mut b = vec![<q4_0::BlockQ4_0 as bytemuck::Zeroable>::zeroed(); v.len() / 32];
            q4_0::quantize(v, &mut b);
            bytemuck::cast_slice(&b).to_vec()
        }
    }
}

/// The values a pool of `kv` holds for `v`.
fn held(kv: KvElem, v: &[f32]) -> Vec<f32> {
    let dtype = match kv {
        KvElem::F32 => return v.to_vec(),
        KvElem::F16 => return v.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect(),
        KvElem::Q8_0 => DType::Q8_0,
        KvElem::Q4_0 => DType::Q4_0,
    };
    let mut out = vec![0f32; v.len()];
    kernels::quant::dequantize_row(dtype, &encoded(kv, v), &mut out);
    out
}

/// Bytes as the 4-byte words a buffer takes.
fn words(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}
