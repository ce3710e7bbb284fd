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
