//! Mixture-of-experts execution: grouped prefill equals token-by-token decode,
//! decode costs only the active experts' bytes, and bad configs are one-line
//! errors naming the key or tensor.

use shardlm_model::{LoadOptions, LogitsMode, Model, ModelError, NoComm, SeqKv, SeqStep, ShardSpec, Workspace};
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny").join(name)
}

fn prompt(name: &str) -> Vec<u32> {
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture(name).join("golden.json")).unwrap()).unwrap();
    j["input_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect()
}

fn load(dir: &Path) -> Result<Model, ModelError> {
    let files = formats::open_model(dir)?;
    Model::load(&files, &ShardSpec::full(files.config.n_layers), &LoadOptions::default())
}

/// Prefill groups the prompt's tokens by expert (one product per active expert
/// over many rows); decode runs each token alone. Both give the same logits.
#[test]
fn grouped_prefill_equals_one_token_steps() {
    for name in ["mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss", "glm4_moe", "minimax_m2"] {
        let m = load(&fixture(name)).unwrap();
        let tokens = prompt(name);
        let pool = kernels::ThreadPool::new(2);
        let mut ws = Workspace::default();
        let (mut cache, mut prefill) = (m.new_cache(tokens.len()), Vec::new());
        let mut steps = [SeqStep {
            tokens: &tokens,
            cache: SeqKv::Own(&mut cache),
            mode: LogitsMode::All,
            prompt: false,
            logits: &mut prefill,
        }];
        m.forward(&pool, &mut ws, &mut steps, &NoComm).unwrap();
        let (mut cache, mut one, mut stepped) = (m.new_cache(tokens.len()), Vec::new(), Vec::new());
        for t in &tokens {
            let tok = [*t];
            let mut steps = [SeqStep {
                tokens: &tok,
                cache: SeqKv::Own(&mut cache),
                mode: LogitsMode::Last,
                prompt: false,
                logits: &mut one,
            }];
            m.forward(&pool, &mut ws, &mut steps, &NoComm).unwrap();
            stepped.extend_from_slice(&one);
        }
        let d = prefill.iter().zip(&stepped).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(d <= 1e-5, "{name}: prefill vs decode differ by {d}");
    }
}

/// A decode step's weight bytes are attention, router, `top_k` experts and the
/// shared expert, not every expert.
#[test]
fn decode_bytes_count_only_active_experts() {
    // bf16: 2 bytes a weight. mixtral: hidden 128, 8 heads of 16, 2 KV heads,
    // 8 experts of width 128, top-2, 2 layers, vocab 1024, untied head.
    let m = load(&fixture("mixtral")).unwrap();
    let attn = (128 * 128 + 2 * 32 * 128 + 128 * 128) * 2;
    let router = 8 * 128 * 2;
    let expert = 3 * 128 * 128 * 2;
    let head = 1024 * 128 * 2;
    assert_eq!(m.weight_bytes_per_token(), 2 * (attn + router + 2 * expert) + head);
    // qwen2_moe: 4 heads of 32, 2 KV heads (q/k/v biases, f32); 8 experts of
    // width 64, top-4; a 128-wide shared expert and its [1, 128] gate.
    let m = load(&fixture("qwen2_moe")).unwrap();
    let attn = (128 * 128 + 2 * 64 * 128 + 128 * 128) * 2 + (128 + 2 * 64) * 4;
    let moe = 8 * 128 * 2 + 4 * (3 * 64 * 128 * 2) + 3 * 128 * 128 * 2 + 128 * 2;
    assert_eq!(m.weight_bytes_per_token(), 2 * (attn + moe) + head);
    // gpt_oss: 8 heads of 32, 2 KV heads, q/k/v/o biases; a router with a bias;
    // 8 experts of width 128 (bf16, transposed at load), top-2, each with
    // gate/up/down biases.
    let m = load(&fixture("gpt_oss")).unwrap();
    let attn = (256 * 128 + 2 * 64 * 128 + 128 * 256) * 2 + (256 + 2 * 64 + 128) * 4;
    let router = 8 * 128 * 2 + 8 * 4;
    let expert = 3 * 128 * 128 * 2 + 3 * 128 * 4;
    assert_eq!(m.weight_bytes_per_token(), 2 * (attn + router + 2 * expert) + head);
}

/// Edits a parsed `config.json`.
type Edit = Box<dyn Fn(&mut serde_json::Value)>;

/// Copies a fixture with its config edited by `edit`.
fn edited(name: &str, tag: &str, edit: impl Fn(&mut serde_json::Value)) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("shardlm-moe-{}-{name}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = fixture(name);
    std::fs::copy(src.join("model.safetensors"), dir.join("model.safetensors")).unwrap();
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    dir
}

#[test]
fn bad_moe_configs_are_one_line_errors() {
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "mixtral",
            Box::new(|c| {
                c.as_object_mut().unwrap().remove("num_experts_per_tok");
            }),
            "model config: mixtral config lacks an integer 'num_experts_per_tok'",
        ),
        (
            "qwen3_moe",
            Box::new(|c| c["num_experts_per_tok"] = 9.into()),
            "model config: qwen3_moe: 9 experts per token out of 8 experts",
        ),
        (
            "mixtral",
            Box::new(|c| c["num_local_experts"] = 9.into()),
            "model.layers.0.block_sparse_moe.experts.8.w1.weight",
        ),
        (
            "gpt_oss",
            Box::new(|c| c["layer_types"] = serde_json::json!(["sliding_attention"])),
            "model config: gpt_oss: 'layer_types' lists 1 layers, the model has 2",
        ),
        (
            "gpt_oss",
            Box::new(|c| c["layer_types"][1] = "chunked_attention".into()),
            "model config: gpt_oss: layer_types[1] is \"chunked_attention\", not sliding/full_attention",
        ),
        (
            "gpt_oss",
            Box::new(|c| c["num_local_experts"] = 9.into()),
            "mlp.experts.gate_up_proj: shape [8, 128, 256], expected [9, 128, 256] (float [experts, in, out] layout)",
        ),
    ];
    for (i, (name, edit, want)) in cases.into_iter().enumerate() {
        let dir = edited(name, &i.to_string(), edit);
        let err = load(&dir).unwrap_err().to_string();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(err.contains(want), "{name}: {err}");
        assert!(!err.contains('\n'), "{err}");
    }
}
