//! Helpers shared by the CLI integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn fixture(name: &str) -> PathBuf {
    repo().join("tests/fixtures/tiny").join(name)
}

pub fn shardlm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shardlm")).args(args).output().expect("spawn shardlm")
}

/// [`shardlm`] with extra environment variables.
pub fn shardlm_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_shardlm"));
    c.args(args);
    env.iter().for_each(|(k, v)| {
        c.env(k, v);
    });
    c.output().expect("spawn shardlm")
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The cached SmolLM2 GGUF; `None` (test skipped) when absent outside CI.
pub fn smollm2() -> Option<PathBuf> {
    let cache = std::env::var_os("SHARDLM_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/shardlm"));
    let p = cache.join("smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.exists() {
        return Some(p);
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("SmolLM2 GGUF missing at {} (scripts/test.sh fetches it)", p.display());
    }
    eprintln!("skipping: {} not found", p.display());
    None
}

/// Copies a fixture directory so a test can damage it.
pub fn copy_fixture(name: &str, dst: &Path) -> PathBuf {
    let out = dst.join(name);
    std::fs::create_dir_all(&out).unwrap();
    for e in std::fs::read_dir(fixture(name)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), out.join(e.file_name())).unwrap();
    }
    out
}

pub fn edit_config(dir: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("config.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&p, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

/// The output ids of a `run --json` object.
pub fn output_ids(stdout: &[u8]) -> Vec<u64> {
    let j: serde_json::Value = serde_json::from_slice(stdout)
        .unwrap_or_else(|e| panic!("not one JSON object ({e}): {}", String::from_utf8_lossy(stdout)));
    j["output_ids"].as_array().expect("output_ids").iter().map(|v| v.as_u64().unwrap()).collect()
}

/// The `[prompt_len, vocab]` f32 logits a `--dump-logits` file holds, flat.
pub fn dumped_logits(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensor("logits").unwrap().data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

/// `shardlm run` greedy on one thread, `max_tokens` tokens past EOS, with
/// `prompt` flags and `extra`: (output ids, logits of every prompt position).
pub fn run_with_logits(model: &str, max_tokens: &str, prompt: &[&str], extra: &[&str]) -> (Vec<u64>, Vec<f32>) {
    let dir = tempfile::tempdir().unwrap();
    let dump = dir.path().join("logits.safetensors");
    let mut args =
        vec!["run", "--model", model, "--max-tokens", max_tokens, "--ignore-eos", "--json", "--threads", "1"];
    args.extend_from_slice(prompt);
    args.extend_from_slice(&["--dump-logits", dump.to_str().unwrap()]);
    args.extend_from_slice(extra);
    let o = shardlm(&args);
    assert!(o.status.success(), "{model} {extra:?} failed: {}", stderr(&o));
    (output_ids(&o.stdout), dumped_logits(&dump))
}

/// Largest absolute difference relative to the largest |a|.
pub fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = a.iter().fold(0f32, |m, v| m.max(v.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}
