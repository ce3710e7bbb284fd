//! What the SmolLM2 tests share: where the cached default model lives.

pub mod serving;

use std::path::PathBuf;

/// The cached SmolLM2-135M Q4_1 GGUF; `None` (the test skips) when it is
/// missing outside CI, a failure in CI (`.ci/run` fetches it first).
#[allow(dead_code)]
pub fn smollm2() -> Option<PathBuf> {
    let cache = std::env::var_os("SHARDLM_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/shardlm"));
    let p = cache.join("smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.exists() {
        return Some(p);
    }
    assert!(std::env::var("CI").map_or(true, |v| v != "true"), "SmolLM2 missing at {}", p.display());
    eprintln!("skipping: {} not found", p.display());
    None
}

/// The cached Gemma 3 270M Q4_K_M GGUF (the `gemma3-270m` alias); `None`
/// (the test skips) when missing outside CI, a failure in CI.
#[allow(dead_code)]
pub fn gemma3() -> Option<PathBuf> {
    let cache = std::env::var_os("SHARDLM_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/shardlm"));
    let p = cache.join("gemma3-270m/gemma-3-270m-q4_k_m.gguf");
    if p.exists() {
        return Some(p);
    }
    assert!(std::env::var("CI").map_or(true, |v| v != "true"), "Gemma 3 270M missing at {}", p.display());
    eprintln!("skipping: {} not found", p.display());
    None
}
