//! `shardlm quantize` on the tiny fixtures (dense llama, qwen3; MoE mixtral,
//! qwen2_moe, qwen3_moe, gpt_oss, deepseek_v3 — its fp8 output is DeepSeek's own
//! 128×128 `weight_scale_inv` layout) to nvfp4, mxfp4 and fp8: the quantized checkpoint, loaded back, gives the same logits as the
//! same model run in f32 on its dequantized weights, within a bound set by the
//! activation quantization (the weights are identical in both runs):
//!
//! * fp8 multiplies f32 activations: only f32 rounding and summation order
//!   differ, so |Δ logits| ≤ 1e-3.
//! * nvfp4 and mxfp4 quantize activations to Q8_0 (as llama.cpp): each value moves
//!   by at most half a step, amax_block/254 (the kernels' matmul tests check
//!   this per-matmul bound exactly). As a rounding error it is uniform, std
//!   amax/(254·√3) ≈ 0.23% of the block's largest value, ≈ 0.6% of its rms
//!   (amax ≈ 2.5·rms for 32 values). The 7 matmuls of each of the 3 layers plus
//!   the head add ≈ 22 such errors, independent, so ≈ √22·0.6% ≈ 2.8% of the
//!   logits' rms; the largest of 10 × 1024 logits is within ≈ 4σ, ≈ 11% of the
//!   rms, under 5% of the largest |logit| (rms ≤ ½·max here). Measured: up to
//!   2.7% (mxfp4 on llama; printed by the test).
//!
//! Also checks that the written checkpoint carries the publishers' names and
//! `quantization_config`; gpt_oss's stacked experts in OpenAI's MXFP4 layout
//! (`_blocks`/`_scales`, `[E, out, in/32, …]`) under mxfp4.

mod common;
use common::{fixture, smollm2};
use model::{KvType, LoadOptions, LogitsMode, Model, NoComm, SeqKv, SeqStep, ShardSpec, Workspace};
use std::path::Path;
use std::process::Command;

fn logits(dir: &Path, ids: &[u32]) -> Vec<f32> {
    let files = formats::open_model(dir).unwrap();
    let opts = LoadOptions { kv_type: Some(KvType::F32), ..Default::default() };
    let m = Model::load(&files, &ShardSpec::full(files.config.n_layers), &opts).unwrap();
    let pool = kernels::ThreadPool::new(2);
    let mut ws = Workspace::default();
    let mut cache = m.new_cache(ids.len());
    let mut out = Vec::new();
    let mut steps = [SeqStep {
        tokens: ids,
        cache: SeqKv::Own(&mut cache),
        mode: LogitsMode::All,
        prompt: false,
        logits: &mut out,
    }];
    m.forward(&pool, &mut ws, &mut steps, &NoComm).unwrap();
    out
}

/// The quantized checkpoint with every tensor dequantized to f32 (same config, no quantization_config).
fn dequantized_copy(src: &Path, dst: &Path) {
    let files = formats::open_model(src).unwrap();
    let tensors = files.tensors.tensors.values().map(|t| {
        let mut values = t.to_f32();
        let mut shape = t.shape.clone();
        if t.dtype.is_quantized() && shape.len() == 3 {
            // gpt-oss MXFP4 experts are `[E, out, in]`; float ones `[E, in, out]`.
            let (e, n, k) = (shape[0], shape[1], shape[2]);
            let src = std::mem::take(&mut values);
            values = vec![0.0; src.len()];
            for x in 0..e {
                for o in 0..n {
                    for i in 0..k {
                        values[(x * k + i) * n + o] = src[(x * n + o) * k + i];
                    }
                }
            }
            shape = vec![e, k, n];
        }
        (t.name.clone(), shape, values)
    });
    write_f32_safetensors(tensors, dst);
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    cfg.as_object_mut().unwrap().remove("quantization_config");
    std::fs::write(dst.join("config.json"), cfg.to_string()).unwrap();
}

/// Writes `dst/model.safetensors` holding each `(name, shape, values)` as F32.
fn write_f32_safetensors(tensors: impl Iterator<Item = (String, Vec<usize>, Vec<f32>)>, dst: &Path) {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, shape, values) in tensors {
        let start = data.len();
        data.extend(values.iter().flat_map(|v| v.to_le_bytes()));
        header.insert(name, serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [start, data.len()]}));
    }
    let mut h = serde_json::to_vec(&serde_json::Value::Object(header)).unwrap();
    h.resize(h.len().next_multiple_of(8), b' ');
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(&data);
    std::fs::create_dir_all(dst).unwrap();
    std::fs::write(dst.join("model.safetensors"), out).unwrap();
}

#[test]
fn quantized_fixtures_match_f32_on_dequantized_weights() {
    let ids: Vec<u32> = vec![1, 17, 230, 5, 999, 64, 3, 512, 77, 300];
    let tmp = tempfile::tempdir().unwrap();
    let archs = ["llama", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss", "deepseek_v3"];
    // The hybrids (issue 24): their linear-attention projections quantize like any linear.
    let hybrids = ["qwen3_next", "qwen3_5", "qwen3_5_moe"];
    for arch in archs.into_iter().chain(hybrids) {
        for (to, names) in [
            ("nvfp4", ["q_proj.weight", "q_proj.weight_scale", "q_proj.weight_scale_2"]),
            ("mxfp4", ["q_proj.weight_packed", "q_proj.weight_scale", "q_proj.weight_packed"]),
            ("fp8", ["q_proj.weight", "q_proj.weight_scale_inv", "q_proj.weight"]),
        ] {
            let q = tmp.path().join(format!("{arch}-{to}"));
            let st = Command::new(env!("CARGO_BIN_EXE_shardlm"))
                .args(["quantize", fixture(arch).to_str().unwrap(), q.to_str().unwrap(), "--to", to])
                .status()
                .unwrap();
            assert!(st.success(), "{arch} {to}: quantize failed");
            let cfg: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(q.join("config.json")).unwrap()).unwrap();
            assert!(cfg["quantization_config"].is_object(), "{arch} {to}: quantization_config");
            let header = std::fs::read(q.join("model.safetensors")).unwrap();
            let n = u64::from_le_bytes(header[..8].try_into().unwrap()) as usize;
            let header = String::from_utf8_lossy(&header[8..8 + n]).to_string();
            for name in names {
                // deepseek_v3 has no q_proj (q_a/q_b, whose K = 48 is not a
                // whole block of any format: kept in bf16); its o_proj is.
                let name = if arch == "deepseek_v3" { name.replace("q_proj", "o_proj") } else { name.to_string() };
                // The hybrids' first full-attention layer is their fourth.
                let layer = if hybrids.contains(&arch) { 3 } else { 0 };
                assert!(header.contains(&format!("model.layers.{layer}.self_attn.{name}\"")), "{arch} {to}: no {name}");
            }
            if arch == "gpt_oss" {
                let experts = ["gate_up_proj_blocks", "gate_up_proj_scales", "down_proj_blocks", "down_proj_scales"];
                for name in experts {
                    let has = header.contains(&format!("model.layers.0.mlp.experts.{name}\""));
                    assert_eq!(has, to == "mxfp4", "{arch} {to}: {name}");
                }
            }
            let d = tmp.path().join(format!("{arch}-{to}-f32"));
            dequantized_copy(&q, &d);
            let (a, b) = (logits(&q, &ids), logits(&d, &ids));
            assert_eq!(a.len(), b.len());
            let top = b.iter().fold(0f32, |m, v| m.max(v.abs()));
            // The hybrids move ~10× more than llama under Q8_0 activations
            // (qwen3_5: up to 14% of the largest logit at nvfp4 and mxfp4, the
            // same at every ISA level, scalar included; fp8, with f32
            // activations, within 3e-5: the weights are read right). Their
            // recurrent state also carries a MoE routing flip to every later
            // position, so the MoE hybrids are held to position 0 below.
            let hybrid = hybrids.contains(&arch);
            let bound = match to {
                "fp8" => 1e-3,
                _ if hybrid => 0.2 * top,
                _ => 0.05 * top,
            };
            // Max |Δ| per prompt position (rows of 1024 logits).
            let per: Vec<f32> = a
                .chunks(1024)
                .zip(b.chunks(1024))
                .map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs()).fold(0f32, f32::max))
                .collect();
            let diff = per.iter().fold(0f32, |m, &v| m.max(v));
            eprintln!("{arch} {to}: max |Δ logits| = {diff:.2e} (max |logit| {top:.2}, bound {bound:.2e}) per position {per:.2?}");
            // Routing is discontinuous: a token whose router scores two experts
            // closer than the activation-quantization noise may pick the other
            // one. One such position is allowed in a MoE model (qwen3_moe mxfp4:
            // position 8 moves by 1.06, the others ≤ 0.13; gpt_oss mxfp4:
            // position 4 by 1.32, the others ≤ 0.09 — with attention left in
            // bf16, scripts/lowbit_interop.py sees ≤ 0.05 on the same tokens).
            // deepseek_v3 (top-4 of 16 chosen in groups, weights × 2.5) has
            // more such near-ties, and a flip also reaches later positions
            // through their attention to its latent: nvfp4 moves position 4
            // by 1.31 and position 6 by 0.23 (not analysed further), the
            // others ≤ 0.11. Two positions allowed.
            let allowed = match arch {
                _ if to == "fp8" => 0,
                "deepseek_v3" => 2,
                _ if hybrid => 0,
                a if a.contains("moe") || a == "mixtral" || a == "gpt_oss" => 1,
                _ => 0,
            };
            let per = if hybrid && to != "fp8" && arch != "qwen3_5" { &per[..1] } else { &per[..] };
            let over = per.iter().filter(|&&d| d > bound).count();
            assert!(over <= allowed, "{arch} {to}: {over} positions beyond {bound}: {per:?}");
        }
    }
}

#[test]
fn quantize_errors_are_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let (llama, gpt_oss) = (fixture("llama"), fixture("gpt_oss"));
    let out = tmp.path().join("o");
    let gguf = tmp.path().join("o.gguf");
    let cases: [(&Path, Vec<&str>, &str); 4] = [
        (&llama, vec!["--to", "fp8", gguf.to_str().unwrap()], "fp8 has no GGUF type"),
        (&llama, vec!["--to", "q3_x", out.to_str().unwrap()], "unknown target 'q3_x'"),
        (&llama, vec!["--to", "q8_0", out.to_str().unwrap()], "needs a name ending in .gguf"),
        (&gpt_oss, vec!["--to", "q8_0", gguf.to_str().unwrap()], "HF → GGUF supports llama, mistral, qwen2, qwen3"),
    ];
    for (input, args, want) in cases {
        let mut all = vec!["quantize", input.to_str().unwrap()];
        all.extend(&args[2..]);
        all.extend(&args[..2]);
        let o = Command::new(env!("CARGO_BIN_EXE_shardlm")).args(&all).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(want) && err.trim().lines().count() == 1, "{all:?}: {err}");
    }
}

/// A MoE GGUF (qwen3_moe, converted by llama.cpp's gguf package through
/// `scripts/hf_moe_to_gguf.py`) quantized by `shardlm quantize` to GGUF
/// nvfp4, mxfp4 and q8_0, stacked `ffn_*_exps` experts included: NVFP4 gives
/// each expert its own second-level scale (`ffn_*_exps.scale`, F32
/// `[n_expert]`, as llama.cpp loads it). Checked against the same model run in
/// f32 on its dequantized weights, with those scales applied here per expert,
/// within the bound derived at the top of this file.
#[test]
fn moe_gguf_quantized_with_per_expert_scales() {
    let ids: Vec<u32> = vec![1, 17, 230, 5, 999, 64, 3, 512, 77, 300];
    let tmp = tempfile::tempdir().unwrap();
    let f32_gguf = tmp.path().join("qwen3_moe-f32.gguf");
    let script = common::repo().join("scripts/hf_moe_to_gguf.py");
    let o = Command::new("python3").arg(&script).arg(fixture("qwen3_moe")).arg(&f32_gguf).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for to in ["nvfp4", "mxfp4", "q8_0"] {
        let q = tmp.path().join(format!("qwen3_moe-{to}.gguf"));
        let st = Command::new(env!("CARGO_BIN_EXE_shardlm"))
            .args(["quantize", f32_gguf.to_str().unwrap(), q.to_str().unwrap(), "--to", to])
            .status()
            .unwrap();
        assert!(st.success(), "{to}: quantize failed");
        let files = formats::open_model(&q).unwrap();
        let stacks = files.tensors.tensors.keys().filter(|n| n.ends_with("_exps.weight")).count();
        let scaled = files.tensors.tensors.keys().filter(|n| n.ends_with("_exps_scales")).count();
        assert_eq!(stacks, 6, "{to}: 2 sparse layers × 3 stacks");
        assert_eq!(scaled, if to == "nvfp4" { 6 } else { 0 }, "{to}: per-expert scales");
        // The reference: every tensor in f32, each expert times its own scale.
        let d = tmp.path().join(format!("qwen3_moe-{to}-f32"));
        dequantized_copy_applying_expert_scales(&files, &d, "qwen3_moe");
        let (a, b) = (logits(&q, &ids), logits(&d, &ids));
        let top = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let bound = 0.05 * top;
        let per: Vec<f32> = a
            .chunks(1024)
            .zip(b.chunks(1024))
            .map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs()).fold(0f32, f32::max))
            .collect();
        eprintln!("qwen3_moe GGUF {to}: per-position max |Δ logits| {per:.2?} (bound {bound:.2e})");
        // One router near-tie may flip, as in the safetensors test above.
        let over = per.iter().filter(|&&d| d > bound).count();
        assert!(over <= 1, "qwen3_moe GGUF {to}: {over} positions beyond {bound}: {per:?}");
    }
}

/// Writes `files` as an f32 safetensors checkpoint (config.json from the
/// `arch` fixture; not for `llama`-arch GGUFs, whose q/k rows are permuted), multiplying expert `e` of each stacked `X_exps.weight`
/// by `X_exps_scales[e]` and dropping the scale tensors.
fn dequantized_copy_applying_expert_scales(files: &formats::ModelFiles, dst: &Path, arch: &str) {
    let t = &files.tensors.tensors;
    let tensors = t.iter().filter(|(n, _)| !n.ends_with("_scales")).map(|(name, w)| {
        let mut v = w.to_f32();
        if let Some(s) = name.strip_suffix(".weight").and_then(|b| t.get(&format!("{b}_scales"))) {
            let s = s.to_f32();
            let per = v.len() / s.len();
            v.chunks_mut(per).zip(&s).for_each(|(e, k)| e.iter_mut().for_each(|x| *x *= k));
        }
        (name.clone(), w.shape.clone(), v)
    });
    write_f32_safetensors(tensors, dst);
    std::fs::copy(fixture(arch).join("config.json"), dst.join("config.json")).unwrap();
}

/// Q4_K output (GGUF, streamed) on SmolLM2: the rows of whole 256-value
/// blocks (the 30 `ffn_down` matrices, 1536 wide; hidden is 576 = 2.25
/// blocks, so the rest keep their Q4_1) are re-encoded from their Q4_1
/// values. Re-quantizing adds an error of the same size as Q4_1's own (16
/// levels on each 32 values' range, plus 6-bit sub-block scales) to a third
/// of the layer weights: the distance of one more 4-bit encoding of those
/// matrices. Measured: rms |Δ logits| 0.67 (the Q4_1 file against llama.cpp
/// running it differs by 0.26–0.30 rms, docs/LOWBIT.md; a q4_0 KV cache moves
/// SmolLM2 by 2.2), top-1 the same at 14 of 16 positions. Bounds: rms ≤ 1.0,
/// top-1 agreement ≥ 13 of 16.
#[test]
fn smollm2_to_q4_k_gguf() {
    let Some(src) = smollm2() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let q = tmp.path().join("smol-q4_k.gguf");
    let o = Command::new(env!("CARGO_BIN_EXE_shardlm"))
        .args(["quantize", src.to_str().unwrap(), q.to_str().unwrap(), "--to", "q4_k"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let files = formats::open_model(&q).unwrap();
    let q4k = files.tensors.tensors.values().filter(|t| t.dtype == kernels::DType::Q4_K).count();
    assert_eq!(q4k, 30, "one ffn_down per layer");
    let ids: Vec<u32> = vec![1, 504, 3458, 282, 4649, 314, 7042, 30, 378, 1789, 253, 1028, 436, 4537, 28, 2];
    let (a, b) = (logits(&q, &ids), logits(&src, &ids));
    let vocab = a.len() / ids.len();
    let rms = (a.iter().zip(&b).map(|(x, y)| ((x - y) as f64).powi(2)).sum::<f64>() / a.len() as f64).sqrt();
    let argmax = |v: &[f32]| v.iter().enumerate().fold(0, |m, (i, &x)| if x > v[m] { i } else { m });
    let same = a.chunks(vocab).zip(b.chunks(vocab)).filter(|(x, y)| argmax(x) == argmax(y)).count();
    eprintln!("SmolLM2 q4_k vs q4_1: rms |Δ logits| {rms:.3}, top-1 same at {same}/{}", ids.len());
    assert!(rms <= 1.0 && same >= 13, "rms {rms}, top-1 same {same}/{}", ids.len());
}

/// HF → GGUF of the MoE fixtures (qwen3_moe, qwen2_moe, mixtral): each
/// layer's experts stacked into `ffn_{gate,up,down}_exps` `[n_expert, out,
/// in]`, routers F32, qwen2_moe's shared expert and its gate. Q8_0 against the
/// HF checkpoint itself, within the dense test's bound below (5% of the
/// largest logit); NVFP4 (one second-level scale per expert) against the same
/// model run in f32 on its dequantized weights, within the NVFP4 GGUF test's
/// bound above (its 4-bit weights alone move these random models' logits by
/// up to half their size). One router near-tie may flip a position. The
/// prompt does not start with token 1: in the mixtral fixture that token's
/// layer-0 router logits are 0.312 and 0.297 for the second and third expert,
/// close enough for Q8_0 noise to swap them, and a swap at position 0 reaches
/// every later position through attention (with token 1 first, 9 of 10
/// positions move by up to 50%, and an F32 or Q8_0 embedding table instead of
/// the default F16 decides which way; llama.cpp's own converter,
/// `scripts/hf_moe_to_gguf.py --outtype q8_0`, happens to land on the HF side).
/// Measured with this prompt: every position within 4.5% for Q8_0, 1.7% for
/// NVFP4 against its dequantized weights.
#[test]
fn moe_hf_checkpoints_written_as_gguf_match() {
    let ids: Vec<u32> = vec![17, 230, 5, 999, 64, 3, 512, 77, 300, 1];
    let tmp = tempfile::tempdir().unwrap();
    for (arch, to) in [("qwen3_moe", "q8_0"), ("qwen2_moe", "q8_0"), ("mixtral", "q8_0"), ("qwen3_moe", "nvfp4")] {
        let q = tmp.path().join(format!("{arch}-{to}.gguf"));
        let o = Command::new(env!("CARGO_BIN_EXE_shardlm"))
            .args(["quantize", fixture(arch).to_str().unwrap(), q.to_str().unwrap(), "--to", to])
            .output()
            .unwrap();
        assert!(o.status.success(), "{arch} {to}: {}", String::from_utf8_lossy(&o.stderr));
        let files = formats::open_model(&q).unwrap();
        let t = &files.tensors.tensors;
        let stacks: Vec<&String> = t.keys().filter(|n| n.ends_with("_exps.weight")).collect();
        assert!(!stacks.is_empty() && stacks.len().is_multiple_of(3), "{arch} {to}: stacks {stacks:?}");
        let experts = files.config.raw["num_experts"].as_u64().unwrap() as usize;
        assert!(stacks.iter().all(|n| t[*n].shape[0] == experts), "{arch} {to}: [n_expert, out, in]");
        let scaled = t.keys().filter(|n| n.ends_with("_exps_scales")).count();
        assert_eq!(scaled, if to == "nvfp4" { stacks.len() } else { 0 }, "{arch} {to}: per-expert scales");
        let reference = if to == "nvfp4" {
            let d = tmp.path().join(format!("{arch}-{to}-f32"));
            dequantized_copy_applying_expert_scales(&files, &d, arch);
            d
        } else {
            fixture(arch)
        };
        let (a, b) = (logits(&q, &ids), logits(&reference, &ids));
        let vocab = a.len() / ids.len();
        let top = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let per: Vec<f32> = a
            .chunks(vocab)
            .zip(b.chunks(vocab))
            .map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs()).fold(0f32, f32::max))
            .collect();
        eprintln!("{arch} HF → GGUF {to}: per-position max |Δ logits| {per:.3?} of max |logit| {top:.2}");
        let over = per.iter().filter(|&&d| d > 0.05 * top).count();
        assert!(over <= 1, "{arch} {to}: {over} positions beyond {} ({per:?})", 0.05 * top);
    }
}

/// HF → GGUF: each tiny dense fixture written as a Q8_0 GGUF with llama.cpp's
/// names and metadata (llama's q/k rows permuted to adjacent rope pairs, as
/// llama.cpp's converter does) gives the HF checkpoint's logits within the
/// bound at the top of this file (Q8_0 weights and activations: each ≤ half a
/// step of amax/127 per 32 values, the same order as nvfp4's activation term).
#[test]
fn hf_checkpoints_written_as_gguf_match() {
    let ids: Vec<u32> = vec![1, 17, 230, 5, 999, 64, 3, 512, 77, 300];
    let tmp = tempfile::tempdir().unwrap();
    for arch in ["llama", "mistral", "qwen2", "qwen3"] {
        let q = tmp.path().join(format!("{arch}-q8_0.gguf"));
        let o = Command::new(env!("CARGO_BIN_EXE_shardlm"))
            .args(["quantize", fixture(arch).to_str().unwrap(), q.to_str().unwrap(), "--to", "q8_0"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{arch}: {}", String::from_utf8_lossy(&o.stderr));
        let files = formats::open_model(&q).unwrap();
        assert_eq!(files.config.source, formats::SourceFormat::Gguf);
        let (a, b) = (logits(&q, &ids), logits(&fixture(arch), &ids));
        let top = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = a.iter().zip(&b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        eprintln!("{arch} HF → GGUF q8_0: max |Δ logits| {d:.3} of max |logit| {top:.2}");
        assert!(d <= 0.05 * top, "{arch}: max |Δ| {d} > 5% of {top}");
    }
}

/// Gemma 3 HF → GGUF (`gemma3`: llama.cpp's norm names, the norms' `+ 1`,
/// the windowed layers as a bool array and their rope base): the Q8_0 file
/// decodes the same greedy tokens as the HF fixture (llama.cpp loads it and
/// agrees too, `scripts/hf-gguf-llamacpp.sh gemma3`).
#[test]
fn gemma3_hf_to_gguf_decodes_as_the_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let q = tmp.path().join("gemma3-q8_0.gguf");
    let st = Command::new(env!("CARGO_BIN_EXE_shardlm"))
        .args(["quantize", fixture("gemma3").to_str().unwrap(), q.to_str().unwrap(), "--to", "q8_0"])
        .output()
        .unwrap();
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    let greedy = |m: &Path| {
        let o = Command::new(env!("CARGO_BIN_EXE_shardlm"))
            .args(["run", "--model", m.to_str().unwrap(), "--prompt-ids", "17,230,5,999,64,3,512,77,300,1"])
            .args(["--max-tokens", "12", "--json"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["output_ids"].clone()
    };
    assert_eq!(greedy(&q), greedy(&fixture("gemma3")));
}

/// GLM-4.5 and MiniMax-M2 HF → GGUF (`glm4moe`, `minimax-m2`: stacked
/// experts, sigmoid routing keys, the selection bias as `exp_probs_b`, GLM's
/// shared expert and `post_attention_norm`) read back as the same
/// architecture, and their Q8_0 logits follow the checkpoint's (llama.cpp
/// b11434 loads both and decodes the same greedy tokens as shardlm on them,
/// `scripts/hf-gguf-llamacpp.sh glm4_moe minimax_m2`).
#[test]
fn glm4_moe_and_minimax_m2_hf_to_gguf_read_back() {
    let ids: Vec<u32> = vec![1, 17, 230, 5, 999, 64, 3, 512, 77, 300];
    let tmp = tempfile::tempdir().unwrap();
    for arch in ["glm4_moe", "minimax_m2"] {
        let q = tmp.path().join(format!("{arch}-q8_0.gguf"));
        let st = Command::new(env!("CARGO_BIN_EXE_shardlm"))
            .args(["quantize", fixture(arch).to_str().unwrap(), q.to_str().unwrap(), "--to", "q8_0"])
            .output()
            .unwrap();
        assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
        let logits = |p: &Path| {
            let files = formats::open_model(p).unwrap();
            assert_eq!(files.config.arch, arch);
            let m = Model::load(&files, &ShardSpec::full(files.config.n_layers), &LoadOptions::default()).unwrap();
            let mut cache = m.new_cache(ids.len());
            let (pool, mut ws, mut out) = (kernels::ThreadPool::new(1), Workspace::default(), Vec::new());
            let mut steps = [SeqStep {
                tokens: &ids,
                cache: SeqKv::Own(&mut cache),
                mode: LogitsMode::All,
                prompt: false,
                logits: &mut out,
            }];
            m.forward(&pool, &mut ws, &mut steps, &NoComm).unwrap();
            out
        };
        let (want, got) = (logits(&fixture(arch)), logits(&q));
        // Q8_0 of random tiny MoEs: 0.07 at the first position (measured);
        // later positions may route differently.
        let first = want.iter().zip(&got).take(1024).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(first < 0.2, "{arch}: first position max |Δ logits| {first}");
    }
}

/// `--to q5_0 | q5_1 | iq4_nl | iq4_xs` on SmolLM2 (width 576: IQ4_XS, like
/// Q4_K, applies only where rows are whole 256-value blocks, the ffn_down
/// tensors): the output loads, holds the target type, and its logits stay near
/// the Q4_1 source's. The 5-bit targets and IQ4_NL re-encode all 210 layer
/// weights (Q4_K above only the 30 ffn_down), so the bound is looser: measured
/// q5_0 rms 0.92, top-1 11 of 16; q5_1 rms 3.45, top-1 9 of 16 (the same with
/// scalar kernels; most of it at positions 0 and 3; the blocks of both equal
/// gguf-py's quantizers' on the first 20 tensors, and the weights' relative
/// error is 5% for both); iq4_nl rms 2.61, 13 of 16; iq4_xs (ffn_down only)
/// rms 1.60, 11 of 16. Bounds: about 1.3× the measured rms; top-1 one to
/// three less, since a change of summation order alone (another ISA level,
/// the sixteen-row Q4_1 kernel) moves SmolLM2's logits by rms ≈ 0.25 through
/// the activations' int8 rounding, enough to flip a near tie (iq4_xs 9 of 16
/// since 2026-12-03).
#[test]
fn smollm2_to_other_gguf_targets() {
    let Some(src) = smollm2() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let ids: Vec<u32> = vec![1, 504, 3458, 282, 4649, 314, 7042, 30, 378, 1789, 253, 1028, 436, 4537, 28, 2];
    let b = logits(&src, &ids);
    for (to, dtype, min_tensors, max_rms, min_same) in [
        ("q5_0", kernels::DType::Q5_0, 210, 1.2, 10),
        ("q5_1", kernels::DType::Q5_1, 210, 4.5, 8),
        ("iq4_nl", kernels::DType::IQ4_NL, 210, 3.4, 11),
        ("iq4_xs", kernels::DType::IQ4_XS, 30, 2.1, 8),
    ] {
        let q = tmp.path().join(format!("smol-{to}.gguf"));
        let o = Command::new(env!("CARGO_BIN_EXE_shardlm"))
            .args(["quantize", src.to_str().unwrap(), q.to_str().unwrap(), "--to", to])
            .output()
            .unwrap();
        assert!(o.status.success(), "{to}: {}", String::from_utf8_lossy(&o.stderr));
        let files = formats::open_model(&q).unwrap();
        let n = files.tensors.tensors.values().filter(|t| t.dtype == dtype).count();
        assert!(n >= min_tensors, "{to}: {n} tensors of {dtype}");
        let a = logits(&q, &ids);
        let vocab = a.len() / ids.len();
        let rms = (a.iter().zip(&b).map(|(x, y)| ((x - y) as f64).powi(2)).sum::<f64>() / a.len() as f64).sqrt();
        let argmax = |v: &[f32]| v.iter().enumerate().fold(0, |m, (i, &x)| if x > v[m] { i } else { m });
        let same = a.chunks(vocab).zip(b.chunks(vocab)).filter(|(x, y)| argmax(x) == argmax(y)).count();
        eprintln!(
            "SmolLM2 {to} vs q4_1: {n} {dtype} tensors, rms |Δ logits| {rms:.3}, top-1 same at {same}/{}",
            ids.len()
        );
        assert!(rms <= max_rms && same >= min_same, "{to}: rms {rms}, top-1 same {same}/{}", ids.len());
    }
}

/// The hybrid linear-attention fixtures HF → GGUF (`qwen3next`, `qwen35`,
/// `qwen35moe`: llama.cpp's `ssm_*`/`attn_qkv`/`attn_gate` tensors, Qwen3.5's
/// value heads in llama.cpp's tiled order, `ssm_a = −exp(A_log)`, norms
/// `1 + w`) read back as the same architecture and give the checkpoint's
/// logits: `--to f32` up to f32 rounding (measured ≤ 1.6e-5; bound 1e-3)
/// and `f16` (the bf16 values are exact in f16 unless tiny; ≤ 1.5e-5, bound
/// 1e-3), which pins down every name, split and reordering. Q8_0 (the same
/// layout, other bytes; its tensors equal gguf-py's Q8_0 of the same
/// checkpoint) moves these random models far more than the dense fixtures:
/// the Q8_0 activations alone (against the same model on its dequantized
/// weights) move a position by up to 3.0 of max |logit| ≈ 7.5, against the
/// checkpoint up to 4.7 (measured). A likely cause: at the first positions
/// the gated RMSNorm normalizes `β (q·k) v`, whose sign follows q·k, near 0
/// for some random heads. So Q8_0 is held to the top-1 token at 6 of the 10
/// positions or more (measured 7-9). llama.cpp b11434 loads the Q8_0
/// files and decodes the same greedy tokens as shardlm
/// (`scripts/hf-gguf-llamacpp.sh qwen3_next qwen3_5 qwen3_5_moe`).
#[test]
fn hybrid_hf_to_gguf_round_trips() {
    let ids: Vec<u32> = vec![17, 230, 5, 999, 64, 3, 512, 77, 300, 1];
    let tmp = tempfile::tempdir().unwrap();
    for (name, arch) in [("qwen3_next", "qwen3_next"), ("qwen3_5", "qwen3_5_text"), ("qwen3_5_moe", "qwen3_5_moe_text")]
    {
        let want = logits(&fixture(name), &ids);
        for to in ["f32", "f16", "q8_0"] {
            let q = tmp.path().join(format!("{name}-{to}.gguf"));
            let o = Command::new(env!("CARGO_BIN_EXE_shardlm"))
                .args(["quantize", fixture(name).to_str().unwrap(), q.to_str().unwrap(), "--to", to])
                .output()
                .unwrap();
            assert!(o.status.success(), "{name} {to}: {}", String::from_utf8_lossy(&o.stderr));
            assert_eq!(formats::open_model(&q).unwrap().config.arch, arch);
            let got = logits(&q, &ids);
            let vocab = got.len() / ids.len();
            let max = got.iter().zip(&want).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            let argmax = |x: &[f32]| (0..x.len()).fold(0, |b, i| if x[i] > x[b] { i } else { b });
            let same = got.chunks(vocab).zip(want.chunks(vocab)).filter(|(a, b)| argmax(a) == argmax(b)).count();
            eprintln!("{name} HF → GGUF {to}: max |Δ logits| {max:.2e}, top-1 the same at {same} of {}", ids.len());
            match to {
                "q8_0" => assert!(same >= 6, "{name} {to}: top-1 the same at only {same} positions"),
                _ => assert!(max <= 1e-3, "{name} {to}: max |Δ logits| {max}"),
            }
        }
    }
}

/// `--to q2_k | q3_k | q5_k | q6_k` and the mixes from the qwen3 fixture (HF →
/// GGUF; 3 layers, hidden 128, FFN 256): only `ffn_down` has rows of whole
/// 256-value blocks, so a plain K target writes those 3 in its type and the
/// other matrices in F16; a mix follows llama-quantize's recipe and falls
/// back to 32-value types for the 128-wide rows (q4_k_m: `ffn_down` Q6_K
/// only at layer 2, the last eighth of 3 layers, else Q4_K; `attn_v` Q6_K →
/// Q8_0 at layer 2, Q4_K → Q5_0 at 0 and 1; the rest Q5_0). These types are
/// llama-quantize b11434's for the same model, but for the tied embedding
/// (checked by hand for the three mixes; see docs/LOWBIT.md).
/// The logits follow the checkpoint's: the maximum |Δ| as a share of the
/// largest |logit| is held to about 1.5× the measured (printed) value.
/// llama.cpp b11434 loads all seven files and decodes them
/// (`TO=q6_k scripts/hf-gguf-llamacpp.sh "qwen3 mistral"`, docs/LOWBIT.md).
#[test]
fn k_quant_targets_from_hf() {
    use kernels::DType::*;
    let ids: Vec<u32> = vec![1, 17, 230, 5, 999, 64, 3, 512, 77, 300];
    let tmp = tempfile::tempdir().unwrap();
    let want = logits(&fixture("qwen3"), &ids);
    let top = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    for (to, down, max_share) in [
        // Measured shares: 0.024, 0.049, 0.165, 0.259, 0.157, 0.190, 0.147
        // (the mixes quantize every matrix, the plain targets only ffn_down).
        ("q6_k", [Q6_K, Q6_K, Q6_K], 0.04),
        ("q5_k", [Q5_K, Q5_K, Q5_K], 0.075),
        ("q3_k", [Q3_K, Q3_K, Q3_K], 0.25),
        ("q2_k", [Q2_K, Q2_K, Q2_K], 0.4),
        ("q4_k_m", [Q4_K, Q4_K, Q6_K], 0.25),
        ("q3_k_m", [Q4_K, Q4_K, Q4_K], 0.3),
        ("q5_k_m", [Q5_K, Q5_K, Q6_K], 0.22),
    ] {
        let q = tmp.path().join(format!("qwen3-{to}.gguf"));
        let o = Command::new(env!("CARGO_BIN_EXE_shardlm"))
            .args(["quantize", fixture("qwen3").to_str().unwrap(), q.to_str().unwrap(), "--to", to])
            .output()
            .unwrap();
        assert!(o.status.success(), "{to}: {}", String::from_utf8_lossy(&o.stderr));
        let g = formats::gguf::GgufFile::open(&q).unwrap();
        let types: std::collections::HashMap<&str, _> =
            g.tensors.iter().map(|t| (t.name.as_str(), t.dtype().unwrap())).collect();
        let t = |name: String| types[name.as_str()];
        let got: Vec<_> = (0..3).map(|l| t(format!("blk.{l}.ffn_down.weight"))).collect();
        assert_eq!(got, down, "{to}: ffn_down types");
        let q_proj = t("blk.1.attn_q.weight".into());
        let want_q = match to {
            "q4_k_m" => Q5_0,
            "q3_k_m" => Q4_0,
            "q5_k_m" => Q5_1,
            _ => F16,
        };
        assert_eq!(q_proj, want_q, "{to}: attn_q (128 wide)");
        if to == "q4_k_m" {
            let v: Vec<_> = (0..3).map(|l| t(format!("blk.{l}.attn_v.weight"))).collect();
            assert_eq!(v, [Q5_0, Q5_0, Q8_0], "q4_k_m: attn_v");
        }
        let got = logits(&q, &ids);
        let d = got.iter().zip(&want).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        eprintln!("qwen3 HF → GGUF {to}: max |Δ logits| {d:.3} = {:.3} of max |logit| {top:.2}", d / top);
        assert!(d <= max_share * top, "{to}: max |Δ| {d} > {max_share} of {top}");
    }
}

/// Widths that are not whole 256-value blocks never fail: `--to q6_k` on
/// SmolLM2 (width 576) writes only the 1536-wide `ffn_down` (30) as Q6_K and
/// leaves the rest in their Q4_1; q4_k_m there gives the same tensor types as
/// llama-quantize b11434's Q4_K_M of the same file (checked by hand: 14 Q6_K,
/// 16 Q4_K, 166 Q5_0, 15 Q8_0), and both stay near the source's logits
/// (measured rms 0.54 and 0.87; bound 1.0 for both).
#[test]
fn smollm2_to_k_quants() {
    let Some(src) = smollm2() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let ids: Vec<u32> = vec![1, 504, 3458, 282, 4649, 314, 7042, 30, 378, 1789, 253, 1028, 436, 4537, 28, 2];
    let b = logits(&src, &ids);
    for (to, counts, max_rms) in [
        ("q6_k", vec![(kernels::DType::Q6_K, 30), (kernels::DType::Q4_1, 180)], 1.0),
        (
            "q4_k_m",
            vec![
                (kernels::DType::Q6_K, 14),
                (kernels::DType::Q4_K, 16),
                (kernels::DType::Q5_0, 166),
                (kernels::DType::Q8_0, 15),
            ],
            1.0,
        ),
    ] {
        let q = tmp.path().join(format!("smol-{to}.gguf"));
        let o = Command::new(env!("CARGO_BIN_EXE_shardlm"))
            .args(["quantize", src.to_str().unwrap(), q.to_str().unwrap(), "--to", to])
            .output()
            .unwrap();
        assert!(o.status.success(), "{to}: {}", String::from_utf8_lossy(&o.stderr));
        let files = formats::open_model(&q).unwrap();
        for (dtype, n) in counts {
            let got = files.tensors.tensors.values().filter(|t| t.dtype == dtype).count();
            assert_eq!(got, n, "{to}: tensors of {dtype}");
        }
        let a = logits(&q, &ids);
        let rms = (a.iter().zip(&b).map(|(x, y)| ((x - y) as f64).powi(2)).sum::<f64>() / a.len() as f64).sqrt();
        eprintln!("SmolLM2 {to} vs q4_1: rms |Δ logits| {rms:.3}");
        assert!(rms <= max_rms, "{to}: rms {rms}");
    }
}
