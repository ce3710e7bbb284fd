//! Helpers shared by the integration tests: tiny GGUF models and safetensors files.
#![allow(dead_code)]

use kernels::DType;
use shardlm_formats::gguf_writer::GgufWriter;
use std::path::{Path, PathBuf};

pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny").join(name)
}

/// `0.0, 1.0, 2.0, ...` as little-endian f32 bytes.
pub fn ramp_f32(n: usize) -> Vec<u8> {
    (0..n).flat_map(|i| (i as f32).to_le_bytes()).collect()
}

/// A complete tiny llama-style GGUF: 2 layers, hidden 8, 2 heads, 1 kv head,
/// ffn 16, vocab 4, a gpt2 tokenizer and a chat template.
pub fn tiny_llama_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.add_str("general.architecture", "llama")
        .add_str("general.name", "tiny")
        .add_u32("llama.block_count", 2)
        .add_u32("llama.embedding_length", 8)
        .add_u32("llama.feed_forward_length", 16)
        .add_u32("llama.attention.head_count", 2)
        .add_u32("llama.attention.head_count_kv", 1)
        .add_f32("llama.rope.freq_base", 500000.0)
        .add_u32("llama.rope.dimension_count", 4)
        .add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5)
        .add_u32("llama.context_length", 128)
        .add_str("tokenizer.ggml.model", "gpt2")
        .add_str("tokenizer.ggml.pre", "smollm")
        .add_str_array("tokenizer.ggml.tokens", &["<s>", "</s>", "a", "<eot>"])
        .add_i32_array("tokenizer.ggml.token_type", &[3, 3, 1, 3])
        .add_f32_array("tokenizer.ggml.scores", &[0.0, 0.0, -1.0, 0.0])
        .add_str_array("tokenizer.ggml.merges", &["a a"])
        .add_u32("tokenizer.ggml.bos_token_id", 0)
        .add_u32("tokenizer.ggml.eos_token_id", 1)
        .add_u32("tokenizer.ggml.eot_token_id", 3)
        .add_bool("tokenizer.ggml.add_bos_token", true)
        .add_str("tokenizer.chat_template", "{{ messages }}");
    w.add_f32_tensor("token_embd.weight", &[4, 8], &(0..32).map(|i| i as f32).collect::<Vec<_>>());
    w.add_f32_tensor("output_norm.weight", &[8], &[1.0; 8]);
    for l in 0..2 {
        let b = format!("blk.{l}");
        w.add_f32_tensor(&format!("{b}.attn_norm.weight"), &[8], &[1.0; 8]);
        w.add_tensor(&format!("{b}.attn_q.weight"), &[8, 8], DType::F16, vec![0; 128]);
        w.add_tensor(&format!("{b}.attn_k.weight"), &[4, 8], DType::BF16, vec![0; 64]);
        w.add_tensor(&format!("{b}.attn_v.weight"), &[4, 8], DType::F16, vec![0; 64]);
        w.add_tensor(&format!("{b}.attn_output.weight"), &[8, 8], DType::F32, ramp_f32(64));
        w.add_f32_tensor(&format!("{b}.ffn_norm.weight"), &[8], &[1.0; 8]);
        // Q8_0 needs rows that are whole 32-element blocks.
        w.add_tensor(&format!("{b}.ffn_gate.weight"), &[16, 32], DType::Q8_0, vec![1; 16 * 34]);
        w.add_tensor(&format!("{b}.ffn_up.weight"), &[16, 32], DType::Q8_0, vec![2; 16 * 34]);
        w.add_tensor(&format!("{b}.ffn_down.weight"), &[8, 16], DType::F32, ramp_f32(128));
    }
    w
}

/// Writes a safetensors file: `(name, dtype, shape, bytes)`, data in the given order.
pub fn write_safetensors(path: &Path, tensors: &[(&str, &str, &[usize], Vec<u8>)]) {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        let start = data.len();
        data.extend_from_slice(bytes);
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    let mut h = serde_json::to_vec(&serde_json::Value::Object(header)).unwrap();
    h.resize(h.len().next_multiple_of(8), b' ');
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(&data);
    std::fs::write(path, out).unwrap();
}

/// A minimal llama `config.json` (hidden 8, 1 layer, 2 heads, vocab 4) with `extra` merged in.
pub fn llama_config(extra: serde_json::Value) -> serde_json::Value {
    let mut c = serde_json::json!({
        "model_type": "llama",
        "hidden_size": 8,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 16,
        "vocab_size": 4,
        "eos_token_id": 2,
    });
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    c
}

pub fn write_json(path: &Path, v: &serde_json::Value) {
    std::fs::write(path, serde_json::to_string_pretty(v).unwrap()).unwrap();
}
