//! Distributed runs with real processes (launched through `--ranks`), against the
//! single-process run: pipeline bit-identical, tensor/hybrid within 1e-4 relative
//! on float weights with identical greedy output; SmolLM2 (8-bit activations, see
//! docs/ARCHITECTURE.md) pipeline bit-identical and tensor within llama.cpp-scale drift.

mod common;
use common::*;

fn golden_ids(name: &str) -> String {
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture(name).join("golden.json")).unwrap()).unwrap();
    j["input_ids"].as_array().unwrap().iter().map(|v| v.to_string()).collect::<Vec<_>>().join(",")
}

/// Runs `shardlm run` with `extra` flags; returns (output ids, logits of every prompt position).
fn run(model: &str, prompt: &[&str], extra: &[&str]) -> (Vec<u64>, Vec<f32>) {
    run_with_logits(model, "12", prompt, extra)
}

#[test]
fn tiny_models_pipeline_tensor_hybrid() {
    for name in ["llama", "qwen3"] {
        let m = fixture(name);
        let m = m.to_str().unwrap();
        let ids = golden_ids(name);
        let prompt = ["--prompt-ids", &ids];
        let (want_ids, want) = run(m, &prompt, &[]);
        let n_layers = if name == "llama" { 3 } else { 2 };
        let mut cases: Vec<Vec<&str>> = vec![
            vec!["--ranks", "2"],
            vec!["--ranks", "2", "--backend", "tcp", "--prefill-chunk", "5"],
            vec!["--ranks", "2", "--weights", "3,1", "--no-prefill-overlap", "--prefill-chunk", "7"],
        ];
        if n_layers >= 3 {
            cases.push(vec!["--ranks", "3", "--backend", "shm"]);
        }
        for c in &cases {
            let (got_ids, got) = run(m, &prompt, c);
            assert_eq!(got, want, "{name} {c:?}: pipeline logits must be bit-identical");
            assert_eq!(got_ids, want_ids, "{name} {c:?}");
        }
        for c in [
            vec!["--ranks", "2", "--strategy", "tensor"],
            vec!["--ranks", "4", "--strategy", "tensor", "--backend", "tcp"],
            vec!["--ranks", "2", "--strategy", "tensor", "--backend", "tcp", "--connections-per-peer", "2"],
            vec!["--ranks", "4", "--strategy", "hybrid", "--tp", "2"],
            vec!["--ranks", "4", "--strategy", "tensor", "--tp-exact"],
        ] {
            let (got_ids, got) = run(m, &prompt, &c);
            let d = rel_diff(&want, &got);
            assert!(d <= 1e-4, "{name} {c:?}: relative difference {d}");
            assert_eq!(got_ids, want_ids, "{name} {c:?}");
        }
    }
}

/// The mixture-of-experts fixtures: pipeline bit-identical; tensor (each expert's
/// width split, router replicated), expert (whole experts per rank) and hybrid
/// and expert × pipeline within 1e-4 relative, greedy identical. Exact tensor parallelism does not split MoE blocks: a one-line error.
#[test]
fn moe_models_pipeline_tensor_hybrid() {
    for name in ["mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss", "deepseek_v3"] {
        let m = fixture(name);
        let m = m.to_str().unwrap();
        let ids = golden_ids(name);
        let prompt = ["--prompt-ids", &ids];
        let (want_ids, want) = run(m, &prompt, &[]);
        let (got_ids, got) = run(m, &prompt, &["--ranks", "2", "--prefill-chunk", "5"]);
        assert_eq!(got, want, "{name}: pipeline logits must be bit-identical");
        assert_eq!(got_ids, want_ids, "{name} pipeline");
        for c in [
            vec!["--ranks", "2", "--strategy", "tensor"],
            vec!["--ranks", "4", "--strategy", "tensor", "--backend", "tcp"],
            vec!["--ranks", "4", "--strategy", "hybrid", "--tp", "2"],
            vec!["--ranks", "2", "--strategy", "expert"],
            vec!["--ranks", "4", "--strategy", "expert", "--backend", "tcp"],
            vec!["--ranks", "2", "--strategy", "expert", "--weights", "3,1", "--prefill-chunk", "7"],
            // Expert × pipeline: two stages of two expert-parallel ranks each.
            vec!["--ranks", "4", "--strategy", "expert", "--tp", "2"],
        ] {
            let (got_ids, got) = run(m, &prompt, &c);
            let d = rel_diff(&want, &got);
            assert!(d <= 1e-4, "{name} {c:?}: relative difference {d}");
            assert_eq!(got_ids, want_ids, "{name} {c:?}");
        }
    }
    let llama = fixture("llama");
    let o = shardlm(&[
        "run",
        "--model",
        llama.to_str().unwrap(),
        "--prompt-ids",
        "1,2,3",
        "--ranks",
        "2",
        "--strategy",
        "expert",
    ]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("--strategy expert needs a mixture-of-experts model; llama is dense"),
        "{}",
        stderr(&o)
    );
    let m = fixture("mixtral");
    let o = shardlm(&[
        "run",
        "--model",
        m.to_str().unwrap(),
        "--prompt-ids",
        "1,2,3",
        "--ranks",
        "2",
        "--strategy",
        "tensor",
        "--tp-exact",
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("exact tensor parallelism does not split MoE blocks yet"), "{}", stderr(&o));
}

#[test]
fn smollm2_pipeline_is_bit_identical_and_tensor_tracks_single() {
    let Some(p) = smollm2() else { return };
    let p = p.to_str().unwrap();
    let prompt = ["--prompt", "The capital of France is"];
    let (want_ids, want) = run(p, &prompt, &[]);
    for c in [vec!["--ranks", "2"], vec!["--ranks", "3", "--backend", "tcp", "--weights", "1,2,1"]] {
        let (got_ids, got) = run(p, &prompt, &c);
        assert_eq!(got, want, "{c:?}: pipeline logits must be bit-identical");
        assert_eq!(got_ids, want_ids);
    }
    // --tp-exact splits o/down by output rows after gathering their inputs: every
    // value is computed as in one process, so logits are bit-identical.
    for c in [
        vec!["--ranks", "2", "--strategy", "tensor", "--tp-exact"],
        vec!["--ranks", "4", "--strategy", "tensor", "--tp-exact", "--backend", "tcp"],
        vec!["--ranks", "4", "--strategy", "hybrid", "--tp", "2", "--tp-exact"],
    ] {
        let (got_ids, got) = run(p, &prompt, &c);
        assert_eq!(got, want, "{c:?}: exact tensor parallelism must be bit-identical");
        assert_eq!(got_ids, want_ids, "{c:?}");
    }
    // 8-bit activation quantization turns reassociated sums into different roundings,
    // so tensor parallelism on a Q4_1 model drifts like llama.cpp's batch vs incremental.
    // Measured at the last of the five prompt positions, ranks 2 / 4: 0.75 / 0.78
    // with AVX2's old four-row Q4_1 kernels, 0.89 / 1.69 with the sixteen-row lanes
    // (2026-12-07; the first three positions agree better, 0.00–0.31); the greedy
    // tokens are the same at every position in both.
    for c in [vec!["--ranks", "2", "--strategy", "tensor"], vec!["--ranks", "4", "--strategy", "tensor"]] {
        let (got_ids, got) = run(p, &prompt, &c);
        let d = got.iter().zip(&want).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(d < 2.0, "{c:?}: logits differ by {d}");
        assert_eq!(got_ids[..2], want_ids[..2], "{c:?}: \" Paris.\"");
    }
}

#[test]
fn a_killed_rank_stops_the_world_and_is_named() {
    let m = fixture("llama");
    let start = std::time::Instant::now();
    // Rank 1 is told (through the environment) to die after its first step.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_shardlm"))
        .args([
            "run",
            "--model",
            m.to_str().unwrap(),
            "--prompt-ids",
            "1,2,3",
            "--max-tokens",
            "2000",
            "--ignore-eos",
            "--ranks",
            "2",
        ])
        .env("SHARDLM_TEST_DIE_AFTER_STEPS", "3")
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(!o.status.success());
    assert!(start.elapsed().as_secs() < 20, "took {:?}", start.elapsed());
    assert!(err.contains("rank 1"), "names the lost rank: {err}");
}

fn peak_rss(args: &[&str]) -> Vec<(usize, u64)> {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_shardlm"))
        .args(args)
        .env("SHARDLM_REPORT_RSS", "1")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    stderr(&o)
        .lines()
        .filter_map(|l| {
            // "[rank 1] rank 1 peak_rss_bytes N" or "rank 0 peak_rss_bytes N"
            let w: Vec<&str> = l.split_whitespace().collect();
            let k = w.iter().position(|x| *x == "peak_rss_bytes")?;
            Some((w.get(k.checked_sub(1)?)?.parse().ok()?, w.get(k + 1)?.parse().ok()?))
        })
        .collect()
}

#[test]
fn pipeline_ranks_each_hold_about_their_share_of_the_single_process_peak() {
    let Some(p) = smollm2() else { return };
    let p = p.to_str().unwrap();
    let base = ["run", "--model", p, "Hello there", "--max-tokens", "16", "--threads", "1"];
    let single = peak_rss(&base)[0].1;
    let mut args = base.to_vec();
    args.extend_from_slice(&["--ranks", "2", "--verbose"]);
    let ranks = peak_rss(&args);
    assert_eq!(ranks.len(), 2, "{ranks:?}");
    for (rank, rss) in ranks {
        let share = rss as f64 / single as f64;
        eprintln!("rank {rank}: {rss} bytes = {:.0}% of the single process ({single})", share * 100.0);
        // The stages are balanced by what they hold at SmolLM2's full 8192
        // context: each layer 2.2 MB of weights + 6.3 MB of f16 KV, and rank 0
        // also the 30 MB lm_head and the tokenizer. So rank 0 has 12 of the 30
        // layers and the head, rank 1 the other 18. This run's KV is a few
        // pages, so weights and a fixed runtime part (binary, stacks, comm
        // buffers) make the peak: 68% and 44% of the single process (2026-12-01).
        // Mapping the other stage's layers as well would add ≥ 18 points.
        let limit = if rank == 0 { 0.74 } else { 0.52 };
        assert!(share <= limit, "rank {rank} peak {rss} is {:.0}% of {single}", share * 100.0);
    }
}

#[test]
fn bench_runs_distributed_and_reports_memory_per_rank() {
    let m = fixture("llama");
    let o = shardlm(&[
        "bench",
        "--model",
        m.to_str().unwrap(),
        "-p",
        "16",
        "-g",
        "8",
        "-n",
        "1",
        "--ranks",
        "2",
        "--strategy",
        "tensor",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["peak_rss_bytes_per_rank"].as_array().unwrap().len(), 2);
    assert!(j["avg"]["generation_tps"].as_f64().unwrap() > 0.0);
}
