//! `shardlm run` and `inspect` end to end on the tiny fixtures and SmolLM2.

mod common;
use common::*;

fn json_of(o: &std::process::Output) -> serde_json::Value {
    assert!(o.status.success(), "failed: {}", stderr(o));
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("bad json ({e}): {}", String::from_utf8_lossy(&o.stdout)))
}

#[test]
fn prompt_ids_on_a_model_without_tokenizer() {
    let golden: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("qwen2").join("golden.json")).unwrap()).unwrap();
    let ids: Vec<String> = golden["input_ids"].as_array().unwrap().iter().map(|v| v.to_string()).collect();
    let n = golden["greedy_ids"].as_array().unwrap().len().to_string();
    let m = fixture("qwen2");
    let o = shardlm(&[
        "run",
        "--model",
        m.to_str().unwrap(),
        "--prompt-ids",
        &ids.join(","),
        "--max-tokens",
        &n,
        "--json",
        "--ignore-eos",
    ]);
    let j = json_of(&o);
    assert_eq!(j["output_ids"], golden["greedy_ids"]);
    assert_eq!(j["text"], "");
    assert_eq!(j["finish_reason"], "length");
    for k in ["model", "prompt_ids", "ttft_ms", "prefill_tok_s", "decode_tok_s"] {
        assert!(j.get(k).is_some(), "missing {k}");
    }
}

#[test]
fn dump_logits_matches_golden() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("logits.safetensors");
    let m = fixture("qwen3");
    let golden: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(m.join("golden.json")).unwrap()).unwrap();
    let ids: Vec<String> = golden["input_ids"].as_array().unwrap().iter().map(|v| v.to_string()).collect();
    let o = shardlm(&[
        "run",
        "--model",
        m.to_str().unwrap(),
        "--prompt-ids",
        &ids.join(","),
        "--max-tokens",
        "1",
        "--dump-logits",
        out.to_str().unwrap(),
        "--json",
    ]);
    json_of(&o);
    let bytes = std::fs::read(&out).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor("logits").unwrap();
    assert_eq!(t.dtype(), safetensors::Dtype::F32);
    assert_eq!(t.shape(), &[ids.len(), 1024]);
    let gbytes = std::fs::read(m.join("golden.safetensors")).unwrap();
    let g = safetensors::SafeTensors::deserialize(&gbytes).unwrap();
    let gl = g.tensor("logits").unwrap();
    let max = t
        .data()
        .chunks_exact(4)
        .zip(gl.data().chunks_exact(4))
        .map(|(a, b)| (f32::from_le_bytes(a.try_into().unwrap()) - f32::from_le_bytes(b.try_into().unwrap())).abs())
        .fold(0f32, f32::max);
    // The bound (float checkpoints get an f32 KV cache by default; see
    // crates/model/tests/goldens.rs for the f16 case).
    assert!(max <= 1e-3, "dumped logits differ from golden by {max}");
}

#[test]
fn inspect_reports_the_model() {
    let m = fixture("llama");
    let o = shardlm(&["inspect", m.to_str().unwrap(), "--json"]);
    let j = json_of(&o);
    assert_eq!(j["architecture"], "llama");
    assert_eq!(j["layers"], 3);
    assert_eq!(j["context_length"], 4096);
    assert_eq!(j["chat_template"], false);
    assert!(j["tensor_types"]["bf16"]["bytes"].as_u64().unwrap() > 0);
}

#[test]
fn smollm2_capital_of_france() {
    let Some(p) = smollm2() else { return };
    let o =
        shardlm(&["run", "--model", p.to_str().unwrap(), "The capital of France is", "--max-tokens", "4", "--json"]);
    let j = json_of(&o);
    assert!(j["text"].as_str().unwrap().starts_with(" Paris"), "got {:?}", j["text"]);
}

#[test]
fn smollm2_chat_streams_text_and_stops() {
    let Some(p) = smollm2() else { return };
    let o = shardlm(&["run", "--model", p.to_str().unwrap(), "--chat", "What is 2+2?", "--max-tokens", "64"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(!text.trim().is_empty());
    assert!(!text.contains("<|im_end|>"), "special tokens must not be printed: {text}");
    let o = shardlm(&["run", "--model", p.to_str().unwrap(), "--chat", "Count from 1 to 20.", "--stop", "5", "--json"]);
    let j = json_of(&o);
    assert_eq!(j["finish_reason"], "stop");
    assert!(!j["text"].as_str().unwrap().contains('5'));
}

#[test]
fn quantize_at_load_tracks_the_float_model() {
    let dir = tempfile::tempdir().unwrap();
    let m = fixture("llama");
    let golden: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(m.join("golden.json")).unwrap()).unwrap();
    let ids: Vec<String> = golden["input_ids"].as_array().unwrap().iter().map(|v| v.to_string()).collect();
    let out = dir.path().join("q.safetensors");
    let o = shardlm(&[
        "run",
        "--model",
        m.to_str().unwrap(),
        "--prompt-ids",
        &ids.join(","),
        "--max-tokens",
        "1",
        "--quantize",
        "q8_0",
        "--dump-logits",
        out.to_str().unwrap(),
        "--json",
    ]);
    json_of(&o);
    let bytes = std::fs::read(&out).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let got: Vec<f32> = st
        .tensor("logits")
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let gbytes = std::fs::read(m.join("golden.safetensors")).unwrap();
    let g = safetensors::SafeTensors::deserialize(&gbytes).unwrap();
    let want: Vec<f32> =
        g.tensor("logits").unwrap().data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    let max = got.iter().zip(&want).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    // Q8_0 weights and activations: ~4% of the logit range on these random weights.
    assert!(max < 0.3, "q8_0 logits differ from f32 by {max}");
}
