//! Each class of bad input gets one clear line on stderr and a non-zero exit —
//! never a panic or a hang.

mod common;
use common::*;

fn assert_fails_with(o: &std::process::Output, needle: &str) {
    let err = stderr(o);
    assert!(!o.status.success(), "expected failure, got success; stderr: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    assert!(err.contains(needle), "stderr lacks {needle:?}:\n{err}");
}

#[test]
fn missing_file() {
    let o = shardlm(&["run", "--model", "/nonexistent/model.gguf", "hi"]);
    assert_fails_with(&o, "/nonexistent/model.gguf: no such file or directory");
}

#[test]
fn truncated_gguf() {
    let Some(src) = smollm2() else { return };
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(src).unwrap();
    for (i, cut) in [20usize, 5_000, 2_000_000, bytes.len() - 1000].into_iter().enumerate() {
        let p = dir.path().join(format!("cut{i}.gguf"));
        std::fs::write(&p, &bytes[..cut]).unwrap();
        let o = shardlm(&["run", "--model", p.to_str().unwrap(), "hi"]);
        assert_fails_with(&o, "truncated or corrupt");
        assert!(stderr(&o).contains(&format!("cut{i}.gguf")), "names the file: {}", stderr(&o));
    }
}

#[test]
fn not_a_gguf() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("junk.gguf");
    std::fs::write(&p, b"this is not a model file at all").unwrap();
    let o = shardlm(&["run", "--model", p.to_str().unwrap(), "hi"]);
    assert_fails_with(&o, "not a GGUF file");
}

#[test]
fn truncated_safetensors() {
    let dir = tempfile::tempdir().unwrap();
    let m = copy_fixture("llama", dir.path());
    let st = m.join("model.safetensors");
    let bytes = std::fs::read(&st).unwrap();
    std::fs::write(&st, &bytes[..bytes.len() / 2]).unwrap();
    let o = shardlm(&["run", "--model", m.to_str().unwrap(), "--prompt-ids", "1,2,3"]);
    assert_fails_with(&o, "truncated or corrupt");
    assert!(stderr(&o).contains("model.safetensors"));
}

#[test]
fn corrupt_safetensors_header() {
    let dir = tempfile::tempdir().unwrap();
    let m = copy_fixture("llama", dir.path());
    let st = m.join("model.safetensors");
    let mut bytes = std::fs::read(&st).unwrap();
    bytes[10] = b'#';
    bytes[11] = b'{';
    std::fs::write(&st, &bytes).unwrap();
    let o = shardlm(&["run", "--model", m.to_str().unwrap(), "--prompt-ids", "1,2,3"]);
    assert_fails_with(&o, "model.safetensors");
}

#[test]
fn wrong_tensor_shape() {
    let dir = tempfile::tempdir().unwrap();
    let m = copy_fixture("llama", dir.path());
    edit_config(&m, |c| c["intermediate_size"] = 320.into());
    let o = shardlm(&["run", "--model", m.to_str().unwrap(), "--prompt-ids", "1,2,3"]);
    assert_fails_with(&o, "tensor 'model.layers.0.mlp.gate_proj.weight' has shape [384, 128], expected [320, 128]");
}

#[test]
fn missing_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let m = copy_fixture("llama", dir.path());
    edit_config(&m, |c| c["num_hidden_layers"] = 4.into());
    let o = shardlm(&["run", "--model", m.to_str().unwrap(), "--prompt-ids", "1,2,3"]);
    assert_fails_with(&o, "missing tensor 'model.layers.3.");
}

#[test]
fn unknown_architecture() {
    let dir = tempfile::tempdir().unwrap();
    let m = copy_fixture("llama", dir.path());
    edit_config(&m, |c| c["model_type"] = "frobnicator".into());
    let o = shardlm(&["run", "--model", m.to_str().unwrap(), "--prompt-ids", "1,2,3"]);
    assert_fails_with(&o, "unknown architecture 'frobnicator'");
}

/// A minimal GGUF with one tensor of type TQ2_0 (ggml type 35), which shardlm
/// does not compute (Q2_K was the example until it became supported).
fn gguf_with_tq2_0() -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(b"GGUF");
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes()); // tensors
    b.extend_from_slice(&1u64.to_le_bytes()); // kv
    let key = b"general.architecture";
    b.extend_from_slice(&(key.len() as u64).to_le_bytes());
    b.extend_from_slice(key);
    b.extend_from_slice(&8u32.to_le_bytes());
    b.extend_from_slice(&5u64.to_le_bytes());
    b.extend_from_slice(b"llama");
    let name = b"token_embd.weight";
    b.extend_from_slice(&(name.len() as u64).to_le_bytes());
    b.extend_from_slice(name);
    b.extend_from_slice(&2u32.to_le_bytes());
    b.extend_from_slice(&256u64.to_le_bytes());
    b.extend_from_slice(&4u64.to_le_bytes());
    b.extend_from_slice(&35u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    while b.len() % 32 != 0 {
        b.push(0);
    }
    b.extend(std::iter::repeat_n(0u8, 66 * 4));
    b
}

#[test]
fn unsupported_tensor_type() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("tq2_0.gguf");
    std::fs::write(&p, gguf_with_tq2_0()).unwrap();
    let o = shardlm(&["run", "--model", p.to_str().unwrap(), "hi"]);
    assert_fails_with(&o, "unsupported type");
    assert!(stderr(&o).contains("token_embd.weight"));
}

#[test]
fn prompt_longer_than_context() {
    let dir = tempfile::tempdir().unwrap();
    let m = copy_fixture("llama", dir.path());
    edit_config(&m, |c| c["max_position_embeddings"] = 8.into());
    let o = shardlm(&["run", "--model", m.to_str().unwrap(), "--prompt-ids", "1,2,3,4,5,6,7,8,9,10"]);
    assert_fails_with(&o, "exceeds the context length 8");
}

#[test]
fn bad_flag_values() {
    let m = fixture("llama");
    let m = m.to_str().unwrap();
    let o = shardlm(&["run", "--model", m, "--prompt-ids", "1,2", "--temperature=-1"]);
    assert_fails_with(&o, "temperature must be ≥ 0");
    let o = shardlm(&["run", "--model", m, "--prompt-ids", "1,2", "--top-p", "1.5"]);
    assert_fails_with(&o, "top-p must be in (0, 1]");
    let o = shardlm(&["run", "--model", m, "--prompt-ids", "1,2", "--threads", "0"]);
    assert_fails_with(&o, "--threads");
    let o = shardlm(&["run", "--model", m, "--prompt-ids", "1,x"]);
    assert_fails_with(&o, "--prompt-ids");
    let o = shardlm(&["run", "--model", m, "--prompt-ids", "1,2", "--quantize", "q3_k"]);
    assert_fails_with(&o, "not a load-time quantization");
    let o = shardlm(&["run", "--model", m, "--prompt-ids", "5000"]);
    assert_fails_with(&o, "token id 5000 is outside the vocabulary of 1024");
}
