//! Sharded forward passes inside one process (threads joined by the in-process
//! transport) against the single-process run: pipeline stages must give
//! bit-identical logits; tensor-parallel ranks within 1e-4 relative. Dense and
//! mixture-of-experts fixtures alike.

use shardlm_model::plan::{pipeline_layers, tp_slice};
use shardlm_model::{Arch, LoadOptions, LogitsMode, Model, NoComm, SeqKv, SeqStep, ShardSpec, Workspace};
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny").join(name)
}

fn prompt(name: &str) -> Vec<u32> {
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture(name).join("golden.json")).unwrap()).unwrap();
    j["input_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect()
}

fn single(files: &formats::ModelFiles, tokens: &[u32]) -> Vec<f32> {
    let m = Model::load(files, &ShardSpec::full(files.config.n_layers), &LoadOptions::default()).unwrap();
    let pool = kernels::ThreadPool::new(1);
    let (mut ws, mut cache, mut logits) = (Workspace::default(), m.new_cache(tokens.len()), Vec::new());
    let mut steps =
        [SeqStep { tokens, cache: SeqKv::Own(&mut cache), mode: LogitsMode::All, prompt: false, logits: &mut logits }];
    m.forward(&pool, &mut ws, &mut steps, &NoComm).unwrap();
    logits
}

fn pipeline(files: &formats::ModelFiles, tokens: &[u32], weights: &[f64]) -> Vec<f32> {
    let ranges = pipeline_layers(files.config.n_layers, weights).unwrap();
    let n = ranges.len();
    let stages: Vec<Model> = ranges
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let spec = ShardSpec { layers: r.clone(), has_embed: i == 0, has_head: i + 1 == n, tp: None };
            Model::load(files, &spec, &LoadOptions::default()).unwrap()
        })
        .collect();
    let pool = kernels::ThreadPool::new(1);
    let mut x = Vec::new();
    let mut logits = Vec::new();
    for m in &stages {
        let mut ws = Workspace::default();
        ws.x = x.clone();
        let mut cache = m.new_cache(tokens.len());
        let mut steps = [SeqStep {
            tokens,
            cache: SeqKv::Own(&mut cache),
            mode: LogitsMode::All,
            prompt: false,
            logits: &mut logits,
        }];
        m.forward(&pool, &mut ws, &mut steps, &NoComm).unwrap();
        x = ws.x;
    }
    logits
}

/// Tensor-parallel logits; intermediate widths (MLP, experts) cut in `block`s,
/// or, `expert`, whole routed experts placed on the ranks.
fn tensor(files: &formats::ModelFiles, tokens: &[u32], weights: &[f64], block: usize, expert: bool) -> Vec<f32> {
    tensor_decode(files, tokens, weights, block, expert, 0).0
}

/// [`tensor`], then `decode` greedy steps through every rank's cache: the
/// prompt's logits and the greedy tokens.
fn tensor_decode(
    files: &formats::ModelFiles,
    tokens: &[u32],
    weights: &[f64],
    block: usize,
    expert: bool,
    decode: usize,
) -> (Vec<f32>, Vec<u32>) {
    let groups = comm::Group::local(weights.len());
    let cfg = &files.config;
    std::thread::scope(|s| {
        let handles: Vec<_> = groups
            .into_iter()
            .enumerate()
            .map(|(rank, g)| {
                s.spawn(move || {
                    let tp = tp_slice(
                        cfg.n_heads,
                        cfg.n_kv_heads,
                        cfg.intermediate_size,
                        cfg.vocab_size,
                        block,
                        weights,
                        rank,
                    )
                    .unwrap();
                    let tp = if expert {
                        let moe = Arch::from_name(&cfg.arch).unwrap().spec(cfg).unwrap().moe.unwrap();
                        tp.expert_parallel(moe.n_experts).unwrap()
                    } else {
                        tp
                    };
                    let spec = ShardSpec { layers: 0..cfg.n_layers, has_embed: true, has_head: true, tp: Some(tp) };
                    let m = Model::load(files, &spec, &LoadOptions::default()).unwrap();
                    let pool = kernels::ThreadPool::new(1);
                    let mut ws = Workspace::default();
                    let (mut cache, mut logits) = (m.new_cache(tokens.len() + decode), Vec::new());
                    let mut steps = [SeqStep {
                        tokens,
                        cache: SeqKv::Own(&mut cache),
                        mode: LogitsMode::All,
                        prompt: false,
                        logits: &mut logits,
                    }];
                    m.forward(&pool, &mut ws, &mut steps, &g).unwrap();
                    let (prompt_logits, mut greedy, mut last) = (logits.clone(), vec![], logits);
                    for _ in 0..decode {
                        let v = cfg.vocab_size;
                        let tok = [argmax(&last[last.len() - v..])];
                        greedy.push(tok[0]);
                        let cache = SeqKv::Own(&mut cache);
                        let mut steps = [SeqStep {
                            tokens: &tok,
                            cache,
                            mode: LogitsMode::Argmax,
                            prompt: false,
                            logits: &mut last,
                        }];
                        m.forward(&pool, &mut ws, &mut steps, &g).unwrap();
                    }
                    (prompt_logits, greedy)
                })
            })
            .collect();
        let all: Vec<(Vec<f32>, Vec<u32>)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        for other in &all[1..] {
            assert_eq!(other, &all[0], "every tensor-parallel rank sees the same logits");
        }
        all.into_iter().next().unwrap()
    })
}

fn argmax(x: &[f32]) -> u32 {
    (0..x.len()).fold(0, |b, i| if x[i] > x[b] { i } else { b }) as u32
}

fn assert_close(name: &str, got: &[f32], want: &[f32], rel: f32) {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = got.iter().zip(want).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(d <= rel * scale, "{name}: max |Δ| {d} > {rel} × {scale}");
    eprintln!("{name}: max |Δ| / max |logit| = {:.1e}", d / scale);
}

/// Greedy choice at every position is the single process's.
fn assert_same_argmax(name: &str, got: &[f32], want: &[f32], vocab: usize) {
    let argmax = |r: &[f32]| (0..r.len()).fold(0, |b, i| if r[i] > r[b] { i } else { b });
    for (i, (g, w)) in got.chunks(vocab).zip(want.chunks(vocab)).enumerate() {
        assert_eq!(argmax(g), argmax(w), "{name}: greedy token at position {i}");
    }
}

#[test]
fn pipeline_is_bit_identical() {
    for name in [
        "llama",
        "qwen2",
        "qwen3",
        "mistral",
        "mixtral",
        "qwen2_moe",
        "qwen3_moe",
        "gpt_oss",
        "deepseek_v3",
        "gemma3",
        "glm4_moe",
        "minimax_m2",
    ] {
        let files = formats::open_model(&fixture(name)).unwrap();
        let tokens = prompt(name);
        let want = single(&files, &tokens);
        for w in [vec![1.0, 1.0], vec![1.0, 1.0, 1.0], vec![2.0, 1.0]] {
            if w.len() > files.config.n_layers {
                continue;
            }
            assert_eq!(pipeline(&files, &tokens, &w), want, "{name} pipeline {w:?}");
        }
    }
}

#[test]
fn tensor_parallel_matches_single() {
    for name in ["llama", "qwen2", "qwen3", "mistral", "gemma3"] {
        let files = formats::open_model(&fixture(name)).unwrap();
        let tokens = prompt(name);
        let want = single(&files, &tokens);
        for w in [vec![1.0; 2], vec![1.0; 4], vec![3.0, 1.0]] {
            let got = tensor(&files, &tokens, &w, 32, false);
            assert_close(&format!("{name} tp {w:?}"), &got, &want, 1e-4);
        }
    }
}

/// MoE blocks: every expert's (and the shared expert's) intermediate width cut
/// across ranks, the router replicated, one all-reduce per block. Blocks of 16
/// so the 64-wide qwen experts split four ways too. Expert parallelism: whole
/// routed experts per rank (attention, dense layers and the shared expert
/// tensor-parallel), the same one all-reduce. gpt_oss over 4 ranks has more
/// ranks than its 2 KV heads: each rank holds one KV head (replicated) and 2
/// of its query heads, with their sinks; row-parallel biases (o, down) are
/// added on rank 0 only. deepseek_v3: latent attention heads split, the
/// latent replicated; grouped sigmoid routing. minimax_m2: the
/// whole-projection q/k norm's sum of squares all-reduced (over 4 ranks, 2 KV
/// heads replicated: each counted once).
#[test]
fn tensor_parallel_moe_matches_single() {
    for name in ["mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss", "deepseek_v3", "glm4_moe", "minimax_m2"] {
        let files = formats::open_model(&fixture(name)).unwrap();
        let tokens = prompt(name);
        let want = single(&files, &tokens);
        for w in [vec![1.0; 2], vec![1.0; 4], vec![3.0, 1.0]] {
            let got = tensor(&files, &tokens, &w, 16, false);
            assert_close(&format!("{name} tp {w:?}"), &got, &want, 1e-4);
            assert_same_argmax(&format!("{name} tp {w:?}"), &got, &want, files.config.vocab_size);
            let got = tensor(&files, &tokens, &w, 16, true);
            assert_close(&format!("{name} expert {w:?}"), &got, &want, 1e-4);
            assert_same_argmax(&format!("{name} expert {w:?}"), &got, &want, files.config.vocab_size);
        }
    }
}

/// An expert too narrow for the ranks in whole blocks is a plan error naming
/// the width, not a panic.
#[test]
fn too_narrow_experts_are_refused() {
    let files = formats::open_model(&fixture("qwen3_moe")).unwrap();
    let cfg = &files.config;
    // 64-wide experts over 4 ranks in blocks of 32.
    let tp = tp_slice(cfg.n_heads, cfg.n_kv_heads, cfg.intermediate_size, cfg.vocab_size, 32, &[1.0; 4], 0).unwrap();
    let spec = ShardSpec { layers: 0..cfg.n_layers, has_embed: true, has_head: true, tp: Some(tp) };
    let err = Model::load(&files, &spec, &LoadOptions::default()).unwrap_err().to_string();
    assert_eq!(err, "cannot split an MLP of width 64 over 4 ranks in blocks of 32");
}

/// deepseek_v3 decoded greedily through sharded latent caches (tensor 2 and
/// 4, expert 2 and 4): the transformers continuation, as in one process.
#[test]
fn deepseek_v3_sharded_greedy_matches_golden() {
    deepseek_sharded_greedy(&formats::open_model(&fixture("deepseek_v3")).unwrap());
}

/// The same from the fixture written as llama.cpp's `deepseek2` GGUF by
/// `scripts/hf_moe_to_gguf.py` (the per-head `attn_k_b`/`attn_v_b` split by
/// rank). Needs python3 with numpy and gguf.
#[test]
fn deepseek2_gguf_sharded_greedy_matches_golden() {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/hf_moe_to_gguf.py");
    let path = std::env::temp_dir().join(format!("shardlm-sharded-deepseek2-{}.gguf", std::process::id()));
    let out =
        std::process::Command::new("python3").arg(&script).arg(fixture("deepseek_v3")).arg(&path).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let files = formats::open_model(&path).unwrap();
    assert!(files.tensors.contains("model.layers.0.self_attn.k_b_proj.weight"));
    deepseek_sharded_greedy(&files);
    std::fs::remove_file(&path).unwrap();
}

fn deepseek_sharded_greedy(files: &formats::ModelFiles) {
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("deepseek_v3").join("golden.json")).unwrap()).unwrap();
    let want: Vec<u32> = j["greedy_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let tokens = prompt("deepseek_v3");
    for w in [vec![1.0; 2], vec![1.0; 4]] {
        for expert in [false, true] {
            let (_, greedy) = tensor_decode(files, &tokens, &w, 16, expert, want.len());
            assert_eq!(greedy, want, "deepseek_v3 {} {w:?}", if expert { "expert" } else { "tensor" });
        }
    }
}

/// Hybrid linear attention (Qwen3-Next, Qwen3.5 dense and MoE): pipeline
/// stages bit-identical (each stage holds its own layers' recurrent states);
/// tensor 2 splits the Gated DeltaNet heads by key-head groups with their
/// value heads, conv channels, `A_log`, `dt_bias` (one all-reduce per block,
/// after `out_proj`), and the gated attention by heads; expert 2 for the MoE
/// ones. Prompt logits and 6 greedy steps through every rank's state.
#[test]
fn hybrid_linear_attention_sharded_matches_single() {
    for name in ["qwen3_next", "qwen3_5", "qwen3_5_moe"] {
        hybrid_sharded(name, &formats::open_model(&fixture(name)).unwrap());
    }
}

/// The same from llama.cpp's GGUF layout (`scripts/hf_hybrid_to_gguf.py`):
/// Qwen3.5's value heads are stored tiled (position `j·nk + k`), so a rank's
/// heads are strided rows of `attn_qkv`, `attn_gate`, `ssm_beta/alpha`, the
/// conv and strided columns of `ssm_out`. Needs python3 with numpy and gguf.
#[test]
fn hybrid_gguf_sharded_matches_single() {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/hf_hybrid_to_gguf.py");
    for name in ["qwen3_next", "qwen3_5", "qwen3_5_moe"] {
        let path = std::env::temp_dir().join(format!("shardlm-sharded-{name}-{}.gguf", std::process::id()));
        let out = std::process::Command::new("python3").arg(&script).arg(fixture(name)).arg(&path).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        hybrid_sharded(name, &formats::open_model(&path).unwrap());
        std::fs::remove_file(&path).unwrap();
    }
}

fn hybrid_sharded(name: &str, files: &formats::ModelFiles) {
    let tokens = prompt(name);
    let want = single(files, &tokens);
    for w in [vec![1.0, 1.0], vec![2.0, 1.0], vec![1.0, 1.0, 1.0]] {
        assert_eq!(pipeline(files, &tokens, &w), want, "{name} pipeline {w:?}");
    }
    let moe = name != "qwen3_5";
    for expert in [false, true].into_iter().filter(|&e| !e || moe) {
        let (got, greedy) = tensor_decode(files, &tokens, &[1.0, 1.0], 16, expert, 6);
        let what = format!("{name} {} 2", if expert { "expert" } else { "tensor" });
        assert_close(&what, &got, &want, 1e-4);
        assert_same_argmax(&what, &got, &want, files.config.vocab_size);
        let (_, single_greedy) = tensor_decode(files, &tokens, &[1.0], 16, false, 6);
        assert_eq!(greedy, single_greedy, "{what}: greedy decode through the sharded states");
    }
}
