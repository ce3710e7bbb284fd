//! The tiny HF fixtures under tests/fixtures/tiny load with the right config.

use kernels::DType;
use shardlm_formats::{open_model, ModelFiles, RopeScaling, SourceFormat, TokenizerSource};
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny").join(name)
}

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
