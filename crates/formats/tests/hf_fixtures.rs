//! HF directories: the tiny fixtures under tests/fixtures/tiny, and synthetic
//! directories exercising config variants, sharding and tokenizer files.

mod common;

use common::{fixture, llama_config, write_json, write_safetensors};
use kernels::DType;
use serde_json::json;
use shardlm_formats::{open_model, ModelFiles, RopeScaling, SourceFormat, TokenizerSource};
use std::path::Path;

fn load(name: &str) -> ModelFiles {
    open_model(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Every tensor is BF16, lies in the file, and has the byte length its shape needs.
fn check_tensors(m: &ModelFiles) {
    let c = &m.config;
    for (name, t) in &m.tensors.tensors {
        assert_eq!(&t.name, name);
        assert_eq!(t.dtype, DType::BF16, "{name}");
        assert_eq!(t.bytes().len(), t.numel() * 2, "{name}");
    }
    m.tensors.get_shaped("model.embed_tokens.weight", &[c.vocab_size, c.hidden_size]).unwrap();
    for l in 0..c.n_layers {
        let p = format!("model.layers.{l}");
        m.tensors
            .get_shaped(&format!("{p}.self_attn.q_proj.weight"), &[c.n_heads * c.head_dim, c.hidden_size])
            .unwrap();
        m.tensors
            .get_shaped(&format!("{p}.self_attn.k_proj.weight"), &[c.n_kv_heads * c.head_dim, c.hidden_size])
            .unwrap();
        m.tensors.get_shaped(&format!("{p}.mlp.down_proj.weight"), &[c.hidden_size, c.intermediate_size]).unwrap();
        m.tensors.get_shaped(&format!("{p}.input_layernorm.weight"), &[c.hidden_size]).unwrap();
    }
    assert_eq!(m.tensors.contains("lm_head.weight"), !c.tie_word_embeddings);
    assert!(!m.tensors.contains("golden"), "golden.safetensors must not be loaded");
    assert!(matches!(m.tokenizer, TokenizerSource::None));
    assert_eq!(c.source, SourceFormat::Safetensors);
    assert_eq!(c.bos_token_id, Some(1));
    assert_eq!(c.eos_token_ids, vec![2]);
    assert_eq!(c.rms_norm_eps, 1e-6);
    assert_eq!(c.max_position_embeddings, 4096);
}

#[test]
fn llama_fixture() {
    let m = load("llama");
    let c = &m.config;
    assert_eq!(c.arch, "llama");
    assert_eq!((c.n_layers, c.hidden_size, c.n_heads, c.n_kv_heads, c.head_dim), (3, 128, 8, 2, 16));
    assert_eq!((c.intermediate_size, c.vocab_size), (384, 1024));
    assert_eq!(c.rope_theta, 500000.0);
    assert_eq!(
        c.rope_scaling,
        RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 256
        }
    );
    assert!(!c.tie_word_embeddings);
    assert!(!c.attention_bias);
    assert_eq!(c.sliding_window, None);
    assert_eq!(c.raw["model_type"], "llama");
    check_tensors(&m);
}

#[test]
fn qwen2_fixture() {
    let m = load("qwen2");
    let c = &m.config;
    assert_eq!(c.arch, "qwen2");
    assert_eq!((c.n_layers, c.hidden_size, c.n_heads, c.n_kv_heads, c.head_dim), (2, 128, 4, 2, 32));
    assert_eq!(c.rope_theta, 1e6);
    assert_eq!(c.rope_scaling, RopeScaling::None);
    assert!(c.tie_word_embeddings);
    assert!(c.attention_bias, "qwen2 has q/k/v biases");
    assert_eq!(c.sliding_window, None);
    m.tensors.get_shaped("model.layers.0.self_attn.q_proj.bias", &[128]).unwrap();
    m.tensors.get_shaped("model.layers.1.self_attn.k_proj.bias", &[64]).unwrap();
    check_tensors(&m);
}

#[test]
fn qwen3_fixture() {
    let m = load("qwen3");
    let c = &m.config;
    assert_eq!(c.arch, "qwen3");
    assert_eq!((c.n_layers, c.hidden_size, c.n_heads, c.n_kv_heads), (3, 128, 4, 2));
    assert_eq!(c.head_dim, 32);
    assert_eq!(c.rope_dim, 32);
    assert_eq!(c.rope_theta, 1e6);
    assert!(c.tie_word_embeddings);
    assert!(!c.attention_bias);
    m.tensors.get_shaped("model.layers.2.self_attn.q_norm.weight", &[32]).unwrap();
    m.tensors.get_shaped("model.layers.2.self_attn.k_norm.weight", &[32]).unwrap();
    check_tensors(&m);
}

#[test]
fn mistral_fixture() {
    let m = load("mistral");
    let c = &m.config;
    assert_eq!(c.arch, "mistral");
    assert_eq!((c.n_layers, c.hidden_size, c.n_heads, c.n_kv_heads, c.head_dim), (2, 128, 8, 4, 16));
    assert_eq!(c.rope_theta, 1e6);
    assert_eq!(c.rope_scaling, RopeScaling::None);
    assert!(!c.tie_word_embeddings);
    assert_eq!(c.sliding_window, None, "sliding_window is null");
    check_tensors(&m);
}

/// A directory with `config.json` = llama_config(extra) and a one-tensor model.safetensors.
fn synth(extra: serde_json::Value) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_json(&dir.path().join("config.json"), &llama_config(extra));
    write_safetensors(&dir.path().join("model.safetensors"), &[("w", "F32", &[2], vec![0; 8])]);
    dir
}

fn config_of(dir: &Path) -> shardlm_formats::ModelConfig {
    open_model(dir).unwrap().config
}

#[test]
fn config_defaults() {
    let dir = synth(json!({}));
    let c = config_of(dir.path());
    assert_eq!((c.n_kv_heads, c.head_dim, c.rope_dim), (2, 4, 4), "kv heads = heads, head_dim = hidden/heads");
    assert_eq!((c.rope_theta, c.rope_scaling.clone()), (10000.0, RopeScaling::None));
    assert!(!c.tie_word_embeddings);
    assert!(!c.attention_bias);
    assert_eq!((c.sliding_window, c.bos_token_id, c.eos_token_ids.clone()), (None, None, vec![2]));
}

#[test]
fn rope_variants() {
    let cases = [
        (json!({"rope_scaling": {"type": "linear", "factor": 2.0}}), RopeScaling::Linear { factor: 2.0 }),
        (
            json!({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 32.0,
                "low_freq_factor": 2.0, "high_freq_factor": 8.0, "original_max_position_embeddings": 8192}}),
            RopeScaling::Llama3 {
                factor: 32.0,
                low_freq_factor: 2.0,
                high_freq_factor: 8.0,
                original_max_position_embeddings: 8192,
            },
        ),
        (
            json!({"max_position_embeddings": 131072, "rope_scaling": {"type": "yarn", "factor": 4.0,
                "original_max_position_embeddings": 32768, "mscale": 0.707, "attention_factor": 1.1}}),
            RopeScaling::Yarn {
                factor: 4.0,
                original_max_position_embeddings: 32768,
                beta_fast: 32.0,
                beta_slow: 1.0,
                attention_factor: Some(1.1),
                mscale: Some(0.707),
                mscale_all_dim: None,
                truncate: true,
            },
        ),
        (json!({"rope_scaling": null, "rope_theta": 7.0}), RopeScaling::None),
    ];
    for (extra, want) in cases {
        let dir = synth(extra.clone());
        let c = config_of(dir.path());
        assert_eq!(c.rope_scaling, want, "{extra}");
        if extra.get("rope_parameters").is_some() {
            assert_eq!(c.rope_theta, 5e5);
        }
        if extra.get("rope_theta").is_some() {
            assert_eq!(c.rope_theta, 7.0);
        }
    }
}

#[test]
fn config_keys_and_generation_config() {
    let dir = synth(json!({"model_type": "mistral", "num_key_value_heads": 1, "head_dim": 6,
        "tie_word_embeddings": true, "attention_bias": true, "sliding_window": 4096, "bos_token_id": 1,
        "partial_rotary_factor": 0.5}));
    let c = config_of(dir.path());
    assert_eq!((c.arch.as_str(), c.n_kv_heads, c.head_dim, c.rope_dim), ("mistral", 1, 6, 3));
    assert!(c.tie_word_embeddings && c.attention_bias);
    assert_eq!((c.sliding_window, c.bos_token_id), (Some(4096), Some(1)));
    // use_sliding_window: false disables the window.
    let dir = synth(json!({"model_type": "qwen2", "sliding_window": 4096, "use_sliding_window": false}));
    let c = config_of(dir.path());
    assert_eq!(c.sliding_window, None);
    assert!(c.attention_bias, "qwen2 always has q/k/v biases");
    // generation_config.json wins for eos (list form) and bos.
    write_json(&dir.path().join("generation_config.json"), &json!({"bos_token_id": 5, "eos_token_id": [7, 8]}));
    let c = config_of(dir.path());
    assert_eq!((c.bos_token_id, c.eos_token_ids), (Some(5), vec![7, 8]));
}

#[test]
fn tokenizer_files() {
    let dir = synth(json!({}));
    let d = dir.path();
    std::fs::write(d.join("tokenizer.json"), "{}").unwrap();
    write_json(
        &d.join("tokenizer_config.json"),
        &json!({
            "bos_token": {"content": "<s>", "lstrip": false},
            "eos_token": "</s>",
            "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}],
        }),
    );
    let m = open_model(d).unwrap();
    assert!(matches!(&m.tokenizer, TokenizerSource::HfJson(p) if p == &d.join("tokenizer.json")));
    assert_eq!((m.bos_token.as_deref(), m.eos_token.as_deref()), (Some("<s>"), Some("</s>")));
    assert_eq!(m.chat_template.as_deref(), Some("D"));
    write_json(&d.join("tokenizer_config.json"), &json!({"chat_template": "S"}));
    assert_eq!(open_model(d).unwrap().chat_template.as_deref(), Some("S"));
    // No template in tokenizer_config.json: chat_template.jinja beside it.
    write_json(&d.join("tokenizer_config.json"), &json!({}));
    std::fs::write(d.join("chat_template.jinja"), "J").unwrap();
    let m = open_model(d).unwrap();
    assert_eq!((m.chat_template.as_deref(), m.bos_token), (Some("J"), None));
}

#[test]
fn sharded_weights() {
    let dir = synth(json!({}));
    let d = dir.path();
    std::fs::remove_file(d.join("model.safetensors")).unwrap();
    let index = json!({"weight_map": {"a": "s-1.safetensors", "b": "s-2.safetensors", "c": "s-2.safetensors"}});
    write_json(&d.join("model.safetensors.index.json"), &index);
    let a: Vec<u8> = (0..8).collect();
    write_safetensors(&d.join("s-1.safetensors"), &[("a", "F16", &[2, 2], a.clone())]);
    write_safetensors(
        &d.join("s-2.safetensors"),
        &[("b", "BF16", &[3], vec![1; 6]), ("c", "F32", &[1, 1], vec![2; 4])],
    );
    let m = open_model(d).unwrap();
    assert_eq!(m.tensors.tensors.len(), 3);
    let ta = m.tensors.get_shaped("a", &[2, 2]).unwrap();
    assert_eq!((ta.dtype, ta.bytes()), (DType::F16, &a[..]));
    assert_eq!(m.tensors.get_shaped("b", &[3]).unwrap().bytes(), &[1; 6]);
    assert_eq!(m.tensors.get_shaped("c", &[1, 1]).unwrap().dtype, DType::F32);
}
