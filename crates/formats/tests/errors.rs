//! Every way a model file can be wrong yields an error naming what and where.

mod common;

use common::{fixture, llama_config, tiny_llama_writer, write_json, write_safetensors};
use kernels::DType;
use shardlm_formats::gguf::{open_file, GgufFile};
use shardlm_formats::gguf_writer::GgufWriter;
use shardlm_formats::{open_model, FormatError};
use std::path::Path;

fn err_of(path: &Path) -> String {
    match open_model(path) {
        Ok(_) => panic!("{} opened without error", path.display()),
        Err(e) => e.to_string(),
    }
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn assert_contains(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "message {msg:?} lacks {p:?}");
    }
}

#[test]
fn missing_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("nope.gguf");
    assert_eq!(err_of(&p), format!("{}: no such file or directory", p.display()));
    assert!(matches!(open_file(&p), Err(FormatError::NotFound { .. })));
}

#[test]
fn bad_magic_and_version() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "x.gguf", b"GGML\x03\0\0\0 and more bytes here");
    assert_eq!(err_of(&p), format!("{}: not a GGUF file (bad magic [71, 71, 77, 76])", p.display()));
    let mut w = GgufWriter::new();
    w.set_version(1);
    let p = write(dir.path(), "v1.gguf", &w.to_bytes());
    assert_eq!(err_of(&p), format!("{}: unsupported GGUF version 1 (supported: 2, 3)", p.display()));
    let p = write(dir.path(), "empty.gguf", b"");
    assert_contains(&err_of(&p), &["truncated or corrupt: header (magic): needs 4 bytes at offset 0"]);
}

/// Cutting a valid file at every byte gives a Corrupt error naming the section cut.
#[test]
fn truncated_anywhere() {
    let full = tiny_llama_writer().to_bytes();
    let dir = tempfile::tempdir().unwrap();
    let good = write(dir.path(), "good.gguf", &full);
    let g = GgufFile::open(&good).unwrap();
    // Section boundaries: the first tensor info starts with the first tensor's name.
    let first = b"token_embd.weight";
    let kv_end = full.windows(first.len()).position(|w| w == first).unwrap() - 8;
    let last = &g.tensors[g.tensors.len() - 1];
    let infos_end = full.windows(last.name.len()).rposition(|w| w == last.name.as_bytes()).unwrap()
        + last.name.len()
        + 4
        + 8 * last.dims.len()
        + 12;
    assert!(24 < kv_end && kv_end < infos_end && infos_end <= g.data_offset);

    for cut in 0..full.len() {
        let p = write(dir.path(), "cut.gguf", &full[..cut]);
        let e = open_model(&p).expect_err("truncated file opened");
        assert!(matches!(e, FormatError::Corrupt { .. }), "cut {cut}: {e}");
        let msg = e.to_string();
        let want = if cut < 24 {
            "header ("
        } else if cut < kv_end {
            "metadata "
        } else if cut < infos_end {
            "tensor info #"
        } else {
            "tensor data of '"
        };
        assert_contains(&msg, &[&p.display().to_string(), "truncated or corrupt: ", want]);
    }
    // Spot checks of full messages at one point in each section.
    let at = |cut: usize| {
        let p = write(dir.path(), "cut.gguf", &full[..cut]);
        err_of(&p)
    };
    assert_contains(&at(12), &["header (tensor count): needs 8 bytes at offset 8, but the file ends at 12"]);
    assert_contains(&at(kv_end - 2), &["metadata value #", "('tokenizer.chat_template')", "string length"]);
    assert_contains(&at(infos_end - 3), &["tensor info #19 ('blk.1.ffn_down.weight') offset: needs 8 bytes"]);
    assert_contains(
        &at(full.len() - 1),
        &["tensor data of 'blk.1.ffn_down.weight' (512 bytes", "extends past the end"],
    );
}

/// Absurd counts and lengths are rejected before anything is allocated.
#[test]
fn absurd_counts() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = GgufWriter::new();
    w.add_str("general.architecture", "llama").add_str_array("a", &["x", "y"]);
    w.add_f32_tensor("t", &[2], &[1.0, 2.0]);
    let good = w.to_bytes();
    let patch = |at: usize, v: u64| {
        let mut b = good.clone();
        b[at..at + 8].copy_from_slice(&v.to_le_bytes());
        write(dir.path(), "bad.gguf", &b)
    };
    assert_contains(&err_of(&patch(8, u64::MAX)), &["tensor info #", "the header claims 18446744073709551615 tensors"]);
    assert_contains(&err_of(&patch(16, 1 << 60)), &["header (metadata key/value count): count 1152921504606846976"]);
    assert_contains(&err_of(&patch(24, u64::MAX / 2)), &["metadata key #0: string length 9223372036854775807"]);
    // Array count of key "a": header, "general.architecture" KV (28 + 4 + 13), key "a" (9), type, elem type.
    let arr = 24 + 28 + 4 + 13 + 9 + 4 + 4;
    assert_contains(&err_of(&patch(arr, u64::MAX)), &["metadata value #1 ('a'): count 18446744073709551615"]);
    // Bad value type, bad bool, deep nesting and a huge n_dims.
    let mut b = good.clone();
    b[24 + 28..24 + 32].copy_from_slice(&99u32.to_le_bytes());
    let p = write(dir.path(), "bad.gguf", &b);
    assert_contains(&err_of(&p), &["metadata value #0 ('general.architecture'): unknown value type 99"]);
    let mut w = GgufWriter::new();
    let mut v = shardlm_formats::gguf::GgufValue::U8(1);
    for _ in 0..20 {
        v = shardlm_formats::gguf::GgufValue::Array(v.value_type(), vec![v]);
    }
    w.add("deep", v);
    let p = write(dir.path(), "deep.gguf", &w.to_bytes());
    assert_contains(&err_of(&p), &["metadata value #0 ('deep'): ", "arrays nested deeper than 8"]);
    let mut w = GgufWriter::new();
    w.add_tensor_raw("t", &[1, 1, 1, 1, 1], 0, vec![0; 4]);
    let p = write(dir.path(), "dims.gguf", &w.to_bytes());
    assert_contains(&err_of(&p), &["tensor info #0 ('t') n_dims: 5 dimensions (at most 4 allowed)"]);
    let mut w = GgufWriter::new();
    w.add_tensor_raw("q", &[33], 8, vec![0; 34]);
    let p = write(dir.path(), "rows.gguf", &w.to_bytes());
    assert_contains(&err_of(&p), &["tensor 'q' row length 33 is not a multiple of the Q8_0 block size 32"]);
}

/// Flipping bytes anywhere never panics.
#[test]
fn random_corruption_never_panics() {
    let full = tiny_llama_writer().to_bytes();
    let dir = tempfile::tempdir().unwrap();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..400 {
        let mut b = full.clone();
        for _ in 0..3 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let at = (seed % 1200) as usize % b.len();
            b[at] = (seed >> 32) as u8;
        }
        let p = write(dir.path(), "fuzz.gguf", &b);
        let _ = open_model(&p).map(|m| m.tensors.tensors.values().map(|t| t.bytes().len()).sum::<usize>());
    }
}

#[test]
fn unsupported_tensor_types() {
    let dir = tempfile::tempdir().unwrap();
    for (id, name) in [(34, "TQ1_0"), (35, "TQ2_0"), (28, "F64"), (77, "unknown ggml type 77")] {
        let mut w = tiny_llama_writer();
        w.add_tensor_raw("blk.0.attn_q.bias", &[256], id, vec![0; 256 * 8]);
        let p = write(dir.path(), "u.gguf", &w.to_bytes());
        let msg = err_of(&p);
        assert_eq!(msg, format!("{}: tensor 'blk.0.attn_q.bias' has unsupported type {name}", p.display()));
        // The raw view still opens files with known (sizable) types.
        assert_eq!(GgufFile::open(&p).is_ok(), id != 77, "{name}");
    }
}

#[test]
fn missing_and_misshapen_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "tiny.gguf", &tiny_llama_writer().to_bytes());
    let m = open_model(&p).unwrap();
    let e = m.tensors.get("lm_head.weight").unwrap_err().to_string();
    // A GGUF's missing tensor is also named as llama.cpp names it.
    assert_eq!(e, format!("{}: missing tensor 'lm_head.weight' (GGUF 'output.weight')", p.display()));
    let e = m.tensors.get_shaped("model.embed_tokens.weight", &[8, 4]).unwrap_err().to_string();
    assert_eq!(e, format!("{}: tensor 'model.embed_tokens.weight' has shape [4, 8], expected [8, 4]", p.display()));
    let m = open_model(&fixture("llama")).unwrap();
    let e = m.tensors.get("model.layers.9.mlp.up_proj.weight").unwrap_err().to_string();
    assert!(e.ends_with("model.safetensors: missing tensor 'model.layers.9.mlp.up_proj.weight'"), "{e}");
}

#[test]
fn gguf_config_errors() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = GgufWriter::new();
    w.add_u32("llama.block_count", 1);
    let p = write(dir.path(), "noarch.gguf", &w.to_bytes());
    assert_contains(&err_of(&p), &["bad config: missing metadata key 'general.architecture'"]);
    let mut w = tiny_llama_writer();
    w.add_str("general.architecture", "qwen2");
    let p = write(dir.path(), "q.gguf", &w.to_bytes());
    assert_contains(&err_of(&p), &["bad config: missing or invalid metadata key 'qwen2.block_count'"]);
    let mut w = tiny_llama_writer();
    w.add_u32("general.alignment", 3);
    let p = write(dir.path(), "a.gguf", &w.to_bytes());
    assert_contains(&err_of(&p), &["general.alignment must be a power-of-two u32, got U32(3)"]);
}

/// llama.cpp's hybrid linear-attention GGUFs: a missing or inconsistent
/// `ssm.*` key and a misshapen fused tensor are one-line errors naming them.
#[test]
fn hybrid_gguf_errors() {
    let dir = tempfile::tempdir().unwrap();
    let hybrid = |arch: &str, keys: &[(&str, u32)]| {
        let mut w = GgufWriter::new();
        w.add_str("general.architecture", arch);
        for (k, v) in [("block_count", 1), ("embedding_length", 8), ("feed_forward_length", 16)]
            .iter()
            .chain([("attention.head_count", 2)].iter())
            .chain(keys)
        {
            w.add_u32(&format!("{arch}.{k}"), *v);
        }
        w.add_f32_tensor("token_embd.weight", &[4, 8], &[0.0; 32]);
        w
    };
    let ssm = [("ssm.group_count", 2), ("ssm.time_step_rank", 4), ("ssm.state_size", 4), ("ssm.conv_kernel", 4)];
    let p = write(dir.path(), "a.gguf", &hybrid("qwen35", &ssm).to_bytes());
    assert_contains(&err_of(&p), &["bad config: missing or invalid metadata key 'qwen35.ssm.inner_size'"]);
    let odd = [ssm[0], ("ssm.time_step_rank", 3), ssm[2], ssm[3], ("ssm.inner_size", 12)];
    let p = write(dir.path(), "b.gguf", &hybrid("qwen35moe", &odd).to_bytes());
    assert_contains(&err_of(&p), &["3 value heads of total width 12 cannot be shared by 2 key heads"]);
    let mut w = hybrid("qwen3next", &[ssm[0], ssm[1], ssm[2], ssm[3], ("ssm.inner_size", 16)]);
    w.add_f32_tensor("blk.0.ssm_ba.weight", &[6, 8], &[0.0; 48]);
    let p = write(dir.path(), "c.gguf", &w.to_bytes());
    let e = err_of(&p);
    assert_contains(&e, &["tensor 'blk.0.ssm_ba.weight': expected 8 rows (2 × value heads), got [6, 8]"]);
    assert!(!e.contains('\n'), "{e}");
}

#[test]
fn hf_missing_files() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let e = err_of(d);
    assert_eq!(e, format!("{}: no such file or directory", d.join("config.json").display()));
    write_json(&d.join("config.json"), &llama_config(serde_json::json!({})));
    assert_eq!(err_of(d), format!("{}: no such file or directory", d.join("model.safetensors").display()));
    std::fs::write(d.join("config.json"), "{ not json").unwrap();
    assert_contains(&err_of(d), &["config.json: bad config: invalid JSON: "]);
    write_json(&d.join("config.json"), &serde_json::json!({"model_type": "llama"}));
    assert_contains(&err_of(d), &["config.json: bad config: missing or invalid 'hidden_size'"]);
    write_json(&d.join("config.json"), &llama_config(serde_json::json!({"num_key_value_heads": 3})));
    assert_contains(&err_of(d), &["bad config: 2 attention heads cannot be shared by 3 key/value heads"]);
    let cfg = llama_config(serde_json::json!({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}));
    write_json(&d.join("config.json"), &cfg);
    assert_contains(&err_of(d), &["bad config: unsupported rope type 'dynamic'"]);
}

fn st_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_json(&dir.path().join("config.json"), &llama_config(serde_json::json!({})));
    dir
}

#[test]
fn corrupt_safetensors() {
    let dir = st_dir();
    let st = dir.path().join("model.safetensors");
    let msg = |bytes: &[u8]| {
        std::fs::write(&st, bytes).unwrap();
        err_of(dir.path())
    };
    let prefix = format!("{}: truncated or corrupt: ", st.display());
    assert_eq!(msg(b"\x05\0\0"), format!("{prefix}safetensors header length: file is only 3 bytes"));
    assert_eq!(
        msg(b"\x40\0\0\0\0\0\0\0{}"),
        format!("{prefix}safetensors header: length 64 exceeds the 2 bytes after it")
    );
    assert!(msg(b"\x04\0\0\0\0\0\0\0{\"a\"").starts_with(&format!("{prefix}safetensors header: invalid JSON: ")));
    assert_eq!(msg(b"\x02\0\0\0\0\0\0\0[]"), format!("{prefix}safetensors header: not a JSON object"));
    let h = br#"{"w":{"dtype":"F32","shape":[2]}}"#;
    let mut b = (h.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(h);
    assert_eq!(msg(&b), format!("{prefix}safetensors header: tensor 'w': missing or invalid 'data_offsets'"));

    // Truncated data: cut the real llama fixture short.
    let real = std::fs::read(fixture("llama").join("model.safetensors")).unwrap();
    let m = msg(&real[..real.len() - 10]);
    assert!(m.starts_with(&prefix) && m.contains("lie outside the data section"), "{m}");

    // Byte length that does not match the shape.
    write_safetensors(&st, &[("w", "BF16", &[3, 2], vec![0; 10])]);
    assert_eq!(
        err_of(dir.path()),
        format!("{prefix}tensor 'w' has 10 bytes of data, but shape [3, 2] of BF16 needs 12")
    );
    write_safetensors(&st, &[("w", "F8_E4M3", &[4], vec![0; 4])]);
    assert_eq!(
        err_of(dir.path()),
        format!(
            "{}: tensor 'w': F8_E4M3 [4] is not part of a known low-bit layout (missing its scale tensor?)",
            st.display()
        )
    );
    write_safetensors(&st, &[("w", "I64", &[1], vec![0; 8])]);
    assert_eq!(err_of(dir.path()), format!("{}: tensor 'w' has unsupported type I64", st.display()));
    write_safetensors(&st, &[("w", "F32", &[2], vec![0; 8])]);
    let m = open_model(dir.path()).unwrap();
    assert_eq!(m.tensors.get("w").unwrap().dtype, DType::F32);
}

#[test]
fn sharded_index_errors() {
    let dir = st_dir();
    let d = dir.path();
    let index = serde_json::json!({"metadata": {}, "weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}});
    write_json(&d.join("model.safetensors.index.json"), &index);
    write_safetensors(&d.join("s1.safetensors"), &[("a", "F16", &[2], vec![0; 4])]);
    assert_eq!(err_of(d), format!("{}: no such file or directory", d.join("s2.safetensors").display()));
    write_safetensors(&d.join("s2.safetensors"), &[("c", "F16", &[2], vec![0; 4])]);
    assert_contains(
        &err_of(d),
        &["weight_map lists tensor 'b' in \"s2.safetensors\", but that file does not contain it"],
    );
    write_safetensors(&d.join("s2.safetensors"), &[("a", "F16", &[2], vec![0; 4]), ("b", "F16", &[1], vec![0; 2])]);
    assert_contains(&err_of(d), &["s2.safetensors: truncated or corrupt: tensor 'a' also appears in another shard"]);
}
