//! `shardlm bench` and `shardlm membw` end to end: the shape of their JSON, no timings.

mod common;
use common::*;

fn json_of(o: &std::process::Output) -> serde_json::Value {
    assert!(o.status.success(), "failed: {}", stderr(o));
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("bad json ({e}): {}", String::from_utf8_lossy(&o.stdout)))
}

fn positive(v: &serde_json::Value, key: &str) -> f64 {
    let x = v[key].as_f64().unwrap_or_else(|| panic!("{key} missing or not a number in {v}"));
    assert!(x.is_finite() && x > 0.0, "{key} = {x}");
    x
}

#[test]
fn bench_json_shape() {
    let m = fixture("llama");
    let o = shardlm(&["bench", "--model", m.to_str().unwrap(), "-p", "16", "-g", "8", "-n", "1", "--json"]);
    let j = json_of(&o);
    assert_eq!(j["prompt_tokens"], 16);
    assert_eq!(j["generation_tokens"], 8);
    assert!(j["model"].as_str().is_some_and(|s| s.ends_with("llama")), "{j}");
    assert!(j["threads"].as_u64().is_some_and(|t| t >= 1));
    assert!(j["weight_bytes_per_token"].as_u64().is_some_and(|b| b > 0));
    let trials = j["trials"].as_array().expect("trials array");
    assert_eq!(trials.len(), 1);
    for t in trials {
        for k in ["prompt_tps", "generation_tps", "ttft_s", "peak_rss_bytes", "total_s"] {
            positive(t, k);
        }
    }
    for k in ["prompt_tps", "generation_tps", "ttft_s", "peak_rss_bytes"] {
        positive(&j["avg"], k);
    }
    // Progress goes to stderr, so stdout held exactly the one object.
    assert!(stderr(&o).contains("trial 1/1"), "{}", stderr(&o));
}

/// Decode traffic on the wire, counted by the transport, against what each
/// strategy must send per token on the tiny qwen3_moe (hidden 128, 3 layers).
/// Every step is a batched step (`serve`'s protocol): a 20-byte header and a
/// 44-byte descriptor (one sequence: 11 u32s, its block table one block
/// long at these depths). A pipeline of 2 sends the step with one f32 hidden
/// row (512 bytes) one way and the step with the token id back; tensor and
/// expert parallelism send, per rank, one 512-byte all-reduce for the
/// embedding and two per layer (attention, feed-forward: one covers the
/// routed experts) and the 8-byte argmax pair, and rank 0 the step and token.
#[test]
fn bench_reports_decode_traffic_per_strategy() {
    let m = fixture("qwen3_moe");
    let bench = |strategy: &str| {
        let args = ["bench", "--model", m.to_str().unwrap(), "-p", "8", "-g", "4", "-n", "1", "--json", "--ranks", "2"];
        let mut all = args.to_vec();
        all.extend(["--strategy", strategy]);
        let j = json_of(&shardlm(&all));
        j["decode_wire_bytes_per_token"].as_f64().unwrap_or_else(|| panic!("{strategy}: no traffic in {j}"))
    };
    let step = 20 + 4 * 11;
    assert_eq!(bench("pipeline"), (step + 512 + step + 4) as f64);
    let per_rank = (1 + 2 * 3) * 512 + 8;
    for s in ["tensor", "expert"] {
        assert_eq!(bench(s), (2 * per_rank + step + 4) as f64, "{s}");
    }
}

#[test]
fn bench_text_output_and_trial_count() {
    let m = fixture("llama");
    let o = shardlm(&["bench", "--model", m.to_str().unwrap(), "-p", "4", "-g", "2", "-n", "2", "--threads", "1"]);
    assert!(o.status.success(), "failed: {}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("Trial 1:") && out.contains("Trial 2:") && out.contains("Averages:"), "{out}");
}

#[test]
fn bench_rejects_more_than_the_context() {
    let m = fixture("llama");
    let o = shardlm(&["bench", "--model", m.to_str().unwrap(), "-p", "4000", "-g", "200", "-n", "1"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("context length 4096"), "{}", stderr(&o));
}

#[test]
fn bench_fills_the_context_exactly() {
    // p + g == ctx must be accepted (the fixture's context is 4096).
    let m = fixture("llama");
    let o = shardlm(&["bench", "--model", m.to_str().unwrap(), "-p", "4094", "-g", "2", "-n", "1", "--json"]);
    let j = json_of(&o);
    assert_eq!(j["trials"].as_array().unwrap().len(), 1);
}

#[test]
fn membw_json_shape() {
    let o = shardlm(&["membw", "--size-mib", "16", "--threads", "1,2", "--reps", "2", "--json"]);
    let j = json_of(&o);
    assert_eq!(j["buffer_bytes"], 16u64 << 20);
    let r = j["results"].as_array().expect("results");
    assert_eq!(r.len(), 2);
    assert_eq!(r[0]["threads"], 1);
    assert_eq!(r[1]["threads"], 2);
    for x in r {
        positive(x, "best_gb_s");
    }
}
