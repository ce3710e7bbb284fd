//! Speculative decoding across machines (issue 28): `run --draft ngram`
//! generates exactly the greedy tokens `run` does without it, in one
//! process, in a pipeline of 2 (the draft crosses both stages as one step)
//! and under tensor parallelism over 2 (each rank checks its shard of the
//! same rows), and `--json` reports the drafted and accepted tokens.

mod common;
use common::{fixture, shardlm, shardlm_env, smollm2, stderr};
use serde_json::Value;

fn run_json(model: &str, prompt: &[&str], extra: &[&str], env: &[(&str, &str)]) -> Value {
    let mut args = vec!["run", "--model", model, "--max-tokens", "48", "--ignore-eos", "--json"];
    args.extend_from_slice(prompt);
    args.extend_from_slice(extra);
    let o = shardlm_env(&args, env);
    assert!(o.status.success(), "run {extra:?}: {}", stderr(&o));
    serde_json::from_slice(&o.stdout).expect("one JSON object")
}

/// `env`: the processes' environment (`SHARDLM_DRAFT_ALWAYS=1` where a
/// random model's text repeats too little for drafts to pay).
fn same_tokens_with_and_without(model: &str, prompt: &[&str], env: &[(&str, &str)]) {
    let splits: [&[&str]; 3] = [
        &["--threads", "2"],
        &["--ranks", "2", "--strategy", "pipeline", "--threads", "1"],
        &["--ranks", "2", "--strategy", "tensor", "--threads", "1"],
    ];
    for split in splits {
        let plain = run_json(model, prompt, &[split, &["--draft", "none"][..]].concat(), env);
        let spec = run_json(model, prompt, &[split, &["--draft", "ngram", "--draft-max", "8"][..]].concat(), env);
        assert_eq!(plain["drafted_tokens"], 0);
        let drafted = spec["drafted_tokens"].as_u64().unwrap();
        let accepted = spec["accepted_tokens"].as_u64().unwrap();
        eprintln!("{model} {split:?}: {accepted} of {drafted} draft tokens accepted");
        assert!(drafted > 0 && accepted > 0, "{split:?}: {spec}");
        let rate = spec["acceptance_rate"].as_f64().unwrap();
        assert!((rate - accepted as f64 / drafted as f64).abs() < 1e-9);
        assert_eq!(spec["output_ids"], plain["output_ids"], "{model} {split:?}: speculation changed the tokens");
    }
}

#[test]
fn ngram_speculation_keeps_greedy_tokens_tiny() {
    // A prompt with repeats: the n-gram drafter finds matches in it.
    let ids: Vec<String> = (0..200).map(|i| ((i % 29) * 31 + 7).to_string()).collect();
    let ids = ids.join(",");
    same_tokens_with_and_without(fixture("llama").to_str().unwrap(), &["--prompt-ids", &ids], &[]);
}

#[test]
fn ngram_speculation_keeps_greedy_tokens_hybrid_and_windowed() {
    // qwen3_next: linear-attention states rolled back on every rank that
    // holds them; gemma3: sliding-window layers on `run`'s window blocks.
    // The prompt is a start, the model's own continuation of it, and the
    // start again: the model then says much of it again, and the n-gram
    // drafts are partly right (rollbacks of 1 + a rows, a > 0).
    let always = [("SHARDLM_DRAFT_ALWAYS", "1")];
    let start: Vec<String> = (0..40).map(|i| ((i % 29) * 31 + 7).to_string()).collect();
    for name in ["qwen3_next", "gemma3"] {
        let m = fixture(name);
        let m = m.to_str().unwrap();
        let first = run_json(m, &["--prompt-ids", &start.join(",")], &["--draft", "none"], &[]);
        let said: Vec<String> = first["output_ids"].as_array().unwrap().iter().map(|v| v.to_string()).collect();
        let ids = [&start[..], &said[..], &start[..]].concat().join(",");
        same_tokens_with_and_without(m, &["--prompt-ids", &ids], &always);
    }
}

#[test]
fn ngram_speculation_keeps_greedy_tokens_smollm2() {
    let Some(m) = smollm2() else { return };
    let code: String = (0..10).map(|i| format!("def f{i}(x):\n    return x * {} + {i}\n\n", i % 4 + 2)).collect();
    let prompt = format!("Repeat this code exactly:\n{code}\nHere it is:\n");
    same_tokens_with_and_without(m.to_str().unwrap(), &["--prompt", &prompt], &[]);
}

#[test]
fn bench_reports_the_speedup_and_identical_output() {
    let m = fixture("llama");
    let args = ["bench", "--model", m.to_str().unwrap(), "-p", "64", "-g", "32", "-n", "2", "--warmup", "0"];
    let o = shardlm(&[&args[..], &["--draft", "ngram", "--json"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let j: Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    let s = &j["speculative"];
    assert_eq!(s["identical_output"], true, "{s}");
    assert!(s["median_speedup"].as_f64().unwrap() > 0.0, "{s}");
    assert!(s["plain_generation_tps"].as_f64().unwrap() > 0.0, "{s}");
    for t in j["trials"].as_array().unwrap() {
        assert_eq!(t["plain"]["output_ids"], t["output_ids"]);
        assert!(t["speedup"].as_f64().is_some() && t["drafted_tokens"].as_u64().is_some());
    }
    // Without --draft: no plain twin, no speculative block.
    let o = shardlm(&[&args[..], &["--json"]].concat());
    let j: Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    assert!(j["speculative"].is_null() && j["trials"][0]["plain"].is_null());
}
