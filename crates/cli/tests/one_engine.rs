//! One engine (issue 27): `bench` runs the server's path (the batching
//! scheduler over the paged pool), and it must generate what `run` does for
//! the same prompt, in one process and across a pipeline of 2 (whose
//! micro-batches and overlapping prompt chunks must not change a bit).
//! `serve`'s side is tests/server/test_serving.py's `test_serve_matches_run`.

mod common;
use common::{fixture, output_ids, shardlm, smollm2, stderr};
use serde_json::Value;

/// `bench`'s random prompt and the greedy tokens of its one trial.
fn bench_ids(model: &str, p: usize, g: usize, extra: &[&str]) -> (Vec<u64>, Vec<u64>) {
    let (p, g) = (p.to_string(), g.to_string());
    let mut args = vec!["bench", "--model", model, "-p", &p, "-g", &g, "-n", "1", "--warmup", "0", "--json"];
    args.extend_from_slice(extra);
    let o = shardlm(&args);
    assert!(o.status.success(), "bench {extra:?}: {}", stderr(&o));
    let j: Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    let ids = |v: &Value| v.as_array().expect("ids").iter().map(|x| x.as_u64().unwrap()).collect::<Vec<_>>();
    (ids(&j["prompt_ids"]), ids(&j["trials"][0]["output_ids"]))
}

fn run_ids(model: &str, prompt: &[u64], g: usize, extra: &[&str]) -> Vec<u64> {
    let ids = prompt.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",");
    let g = g.to_string();
    let mut args = vec!["run", "--model", model, "--prompt-ids", &ids, "--max-tokens", &g, "--ignore-eos", "--json"];
    args.extend_from_slice(extra);
    let o = shardlm(&args);
    assert!(o.status.success(), "run {extra:?}: {}", stderr(&o));
    output_ids(&o.stdout)
}

fn bench_equals_run(model: &str, p: usize, g: usize) {
    for split in [&["--threads", "2"][..], &["--ranks", "2", "--strategy", "pipeline", "--threads", "1"]] {
        let (prompt, bench) = bench_ids(model, p, g, split);
        assert_eq!(prompt.len(), p);
        assert_eq!(bench.len(), g, "{split:?}");
        let run = run_ids(model, &prompt, g, split);
        assert_eq!(bench, run, "{model} {split:?}: bench and run generate different tokens");
    }
}

#[test]
fn bench_generates_what_run_does_tiny_models() {
    // A prompt over two prefill steps (chunks of 512) so a pipeline has
    // chunks in flight at once.
    for name in ["llama", "qwen3_next", "gemma3"] {
        bench_equals_run(fixture(name).to_str().unwrap(), 700, 12);
    }
}

#[test]
fn bench_generates_what_run_does_smollm2() {
    let Some(m) = smollm2() else { return };
    bench_equals_run(m.to_str().unwrap(), 1100, 24);
}

/// A pipeline's micro-batches in flight (here a prompt's chunks of 128
/// overlapping across 2 and 3 stages) give every prompt position the logits
/// one process gives, bit for bit, and the same tokens after.
fn micro_batches_keep_logits(model: &str) {
    let ids: Vec<String> = (0..450).map(|i| ((i * 7919 + 13) % 1000 + 10).to_string()).collect();
    let ids = ids.join(",");
    let prompt = ["--prompt-ids", ids.as_str(), "--prefill-chunk", "128"];
    let (want_ids, want) = common::run_with_logits(model, "8", &prompt, &[]);
    assert_eq!(want.len() % 450, 0);
    for split in [&["--ranks", "2"][..], &["--ranks", "3", "--backend", "tcp"]] {
        let (got_ids, got) = common::run_with_logits(model, "8", &prompt, split);
        assert!(got == want, "{model} {split:?}: prompt logits differ from one process");
        assert_eq!(got_ids, want_ids, "{model} {split:?}");
    }
}

#[test]
fn pipeline_micro_batches_keep_every_logit_tiny() {
    micro_batches_keep_logits(fixture("llama").to_str().unwrap());
    micro_batches_keep_logits(fixture("qwen3_next").to_str().unwrap());
}

#[test]
fn pipeline_micro_batches_keep_every_logit_smollm2() {
    let Some(m) = smollm2() else { return };
    micro_batches_keep_logits(m.to_str().unwrap());
}
