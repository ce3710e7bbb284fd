//! Any bytes as the `model.safetensors` of an HF directory with a valid llama
//! config: loading the directory gives a model or a typed error.
#![no_main]
use libfuzzer_sys::fuzz_target;

const CONFIG: &str = r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
"intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1,
"vocab_size": 128, "rms_norm_eps": 1e-5, "max_position_embeddings": 256}"#;

fuzz_target!(|data: &[u8]| {
    let dir = std::env::temp_dir().join(format!("shardlm-fuzz-st-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    if std::fs::write(dir.join("config.json"), CONFIG).is_ok() && std::fs::write(dir.join("model.safetensors"), data).is_ok()
    {
        let _ = formats::open_model(&dir);
    }
});
