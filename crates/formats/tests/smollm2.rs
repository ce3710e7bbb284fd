//! Loads the real SmolLM2-135M-Instruct Q4_1 GGUF if it is in the cache.

use kernels::DType;
use shardlm_formats::gguf::GgufFile;
use shardlm_formats::{open_model, SourceFormat, TokenizerSource};
use std::path::PathBuf;

fn smollm2_path() -> Option<PathBuf> {
    let cache = match std::env::var_os("SHARDLM_CACHE") {
        Some(c) => PathBuf::from(c),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".cache/shardlm"),
    };
    let path = cache.join("smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf");
    if path.is_file() {
        return Some(path);
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{} is missing (required when CI=true)", path.display());
    }
    eprintln!("skipping: {} not found", path.display());
    None
}

#[test]
fn smollm2_gguf_loads() {
    let Some(path) = smollm2_path() else { return };
    let m = open_model(&path).unwrap();
    let c = &m.config;
    assert_eq!(c.arch, "llama");
    assert_eq!(c.source, SourceFormat::Gguf);
    assert_eq!(c.n_layers, 30);
    assert_eq!(c.hidden_size, 576);
    assert_eq!(c.n_heads, 9);
    assert_eq!(c.n_kv_heads, 3);
    assert_eq!(c.head_dim, 64);
    assert_eq!(c.rope_dim, 64);
    assert_eq!(c.intermediate_size, 1536);
    assert_eq!(c.vocab_size, 49152);
    assert_eq!(c.rope_theta, 100000.0);
    assert!(c.tie_word_embeddings);
    assert!(!c.attention_bias);
    assert!(!c.eos_token_ids.is_empty());
    assert!(c.raw.get("general.architecture").is_some());
    assert!(c.raw.get("tokenizer.ggml.tokens").is_none(), "big arrays stay out of raw");

    assert_eq!(m.tensors.tensors.len(), 272);
    let emb = m.tensors.get_shaped("model.embed_tokens.weight", &[49152, 576]).unwrap();
    assert_eq!(emb.dtype, DType::Q8_0);
    assert_eq!(emb.bytes().len(), 49152 * 576 / 32 * 34);
    assert!(!m.tensors.contains("lm_head.weight"));
    let q = m.tensors.get("model.layers.0.self_attn.q_proj.weight").unwrap();
    assert_eq!(q.shape, vec![576, 576]);
    let k = m.tensors.get("model.layers.29.self_attn.k_proj.weight").unwrap();
    assert_eq!(k.shape, vec![192, 576]);
    let down = m.tensors.get("model.layers.0.mlp.down_proj.weight").unwrap();
    assert_eq!(down.shape, vec![576, 1536]);
    let norm = m.tensors.get("model.norm.weight").unwrap();
    assert_eq!((norm.dtype, norm.shape.clone()), (DType::F32, vec![576]));

    assert!(m.chat_template.as_deref().is_some_and(|t| t.contains("im_start")));
    let TokenizerSource::Gguf(tok) = &m.tokenizer else { panic!("expected a GGUF tokenizer") };
    assert_eq!(tok.model, "gpt2");
    assert_eq!(tok.tokens.len(), 49152);
    assert!(!tok.merges.is_empty());
    assert_eq!(m.eos_token.as_deref(), tok.eos_id.map(|i| tok.tokens[i as usize].as_str()));
    assert!(m.bos_token.is_some());
}

#[test]
fn smollm2_gguf_file_view() {
    let Some(path) = smollm2_path() else { return };
    let g = GgufFile::open(&path).unwrap();
    assert_eq!(g.version, 3);
    assert_eq!(g.architecture(), Some("llama"));
    assert_eq!(g.alignment, 32);
    assert_eq!(g.data_offset % 32, 0);
    assert_eq!(g.tensors.len(), 272);
    let t = g.tensor("token_embd.weight").unwrap();
    assert_eq!(t.dims, vec![576, 49152]);
    assert_eq!(t.shape(), vec![49152, 576]);
    assert_eq!(t.type_name(), "Q8_0");
    assert_eq!(g.get_usize("llama.context_length"), Some(8192));
    assert_eq!(g.get_array("tokenizer.ggml.tokens").map(|a| a.len()), Some(49152));
}
