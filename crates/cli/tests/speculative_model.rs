//! Speculative decoding with a draft model (issue 28): `run --draft-model M`
//! generates exactly the greedy tokens `run` does without it, in one process
//! and in a pipeline of 2 (the draft model runs on rank 0), and `--json`
//! reports its drafted and accepted tokens; `bench --draft-model` compares
//! with plain runs. SmolLM2 re-quantized by `shardlm quantize`: Q4_0
//! drafting for Q8_0. A draft model with another vocabulary, or none at the
//! path, is refused in one line.

mod common;
use common::{copy_fixture, edit_config, fixture, shardlm, shardlm_env, smollm2, stderr};

/// A draft model as large as its target never pays, and the scheduler would
/// leave it unused: these tests are about its tokens, so drafting is free.
const FREE_DRAFTS: &[(&str, &str)] = &[("SHARDLM_DRAFT_COST", "0")];
use serde_json::Value;
use std::path::Path;

fn run_json(model: &str, prompt: &[&str], extra: &[&str]) -> Value {
    let mut args = vec!["run", "--model", model, "--max-tokens", "40", "--ignore-eos", "--json"];
    args.extend_from_slice(prompt);
    args.extend_from_slice(extra);
    let o = shardlm_env(&args, FREE_DRAFTS);
    assert!(o.status.success(), "run {extra:?}: {}", stderr(&o));
    serde_json::from_slice(&o.stdout).expect("one JSON object")
}

/// Greedy tokens with `draft` drafting for `model` equal those without, in
/// one process, in a pipeline of 2 and under tensor parallelism of 2 (the
/// draft model runs on rank 0 beside its shard); returns (drafted, accepted)
/// of each split.
fn same_tokens_with_draft_model(model: &str, draft: &str, prompt: &[&str]) -> Vec<(u64, u64)> {
    let splits: [&[&str]; 3] = [
        &["--threads", "2"],
        &["--ranks", "2", "--strategy", "pipeline", "--threads", "1"],
        &["--ranks", "2", "--strategy", "tensor", "--threads", "1"],
    ];
    let mut counts = Vec::new();
    for split in splits {
        let plain = run_json(model, prompt, split);
        let spec = run_json(model, prompt, &[split, &["--draft-model", draft, "--draft-max", "6"][..]].concat());
        assert_eq!(plain["drafted_tokens"], 0);
        let drafted = spec["drafted_tokens"].as_u64().unwrap();
        let accepted = spec["accepted_tokens"].as_u64().unwrap();
        eprintln!("{model} drafted by {draft} {split:?}: {accepted} of {drafted} draft tokens accepted");
        assert!(drafted > 0, "{split:?}: never speculated: {spec}");
        assert_eq!(spec["output_ids"], plain["output_ids"], "{split:?}: the draft model changed the tokens");
        counts.push((drafted, accepted));
    }
    counts
}

#[test]
fn a_draft_model_keeps_greedy_tokens_tiny() {
    let ids: Vec<String> = (0..60).map(|i| ((i * 37 + 11) % 1000 + 3).to_string()).collect();
    let ids = ids.join(",");
    let llama = fixture("llama");
    let llama = llama.to_str().unwrap();
    // The model drafting for itself: its drafts are what the target picks.
    for (drafted, accepted) in same_tokens_with_draft_model(llama, llama, &["--prompt-ids", &ids]) {
        assert!(accepted > 0 && accepted * 10 >= drafted * 9, "{accepted} of {drafted}");
    }
    let mistral = fixture("mistral");
    same_tokens_with_draft_model(llama, mistral.to_str().unwrap(), &["--prompt-ids", &ids]);
}

/// `--draft-rank`: the draft model on a rank of its own (the one that
/// embeds: rank 1 of a pipeline of 2 or under tensor parallelism of 2, rank
/// 2 of a pipeline of 3) drafts what it would on rank 0, and the greedy
/// tokens are those without speculation.
#[test]
fn a_draft_model_on_its_own_rank_keeps_greedy_tokens_tiny() {
    let ids: Vec<String> = (0..60).map(|i| ((i * 37 + 11) % 1000 + 3).to_string()).collect();
    let ids = ids.join(",");
    let llama = fixture("llama");
    let llama = llama.to_str().unwrap();
    let prompt = ["--prompt-ids", ids.as_str()];
    let splits: [(&[&str], &str); 3] = [
        (&["--ranks", "2", "--strategy", "pipeline", "--threads", "1"], "1"),
        (&["--ranks", "2", "--strategy", "tensor", "--threads", "1"], "1"),
        (&["--ranks", "3", "--strategy", "pipeline", "--threads", "1"], "2"),
    ];
    for (split, rank) in splits {
        let plain = run_json(llama, &prompt, split);
        let draft = ["--draft-model", llama, "--draft-max", "6", "--draft-rank", rank];
        let spec = run_json(llama, &prompt, &[split, &draft[..]].concat());
        let drafted = spec["drafted_tokens"].as_u64().unwrap();
        let accepted = spec["accepted_tokens"].as_u64().unwrap();
        eprintln!("draft rank {rank} {split:?}: {accepted} of {drafted} draft tokens accepted");
        assert!(accepted > 0 && accepted * 10 >= drafted * 9, "{split:?}: {accepted} of {drafted}");
        assert_eq!(spec["output_ids"], plain["output_ids"], "{split:?}: the draft rank changed the tokens");
    }
}

#[test]
fn a_draft_rank_that_cannot_draft_is_refused() {
    let llama = fixture("llama");
    let llama = llama.to_str().unwrap();
    let run = |extra: &[&str]| {
        let args = ["run", "--model", llama, "--prompt-ids", "5,6,7", "--max-tokens", "2", "--draft-model", llama];
        let o = shardlm(&[&args[..], extra].concat());
        assert!(!o.status.success(), "{extra:?} was accepted");
        stderr(&o)
    };
    // Not a rank of the cluster, a middle stage of a pipeline (it reads the
    // stage before it, not rank 0), and no cluster at all.
    let err = run(&["--ranks", "2", "--draft-rank", "5"]);
    assert!(err.contains("--draft-rank 5") && err.contains("reads rank 0"), "{err}");
    let err = run(&["--ranks", "3", "--threads", "1", "--draft-rank", "1"]);
    assert!(err.contains("--draft-rank 1") && err.contains("here: 2"), "{err}");
    let err = run(&["--draft-rank", "1"]);
    assert!(err.contains("needs a cluster"), "{err}");
}

/// `shardlm quantize src out --to ty`.
fn quantize(src: &Path, out: &Path, ty: &str) {
    let o = shardlm(&["quantize", src.to_str().unwrap(), out.to_str().unwrap(), "--to", ty]);
    assert!(o.status.success(), "quantize --to {ty}: {}", stderr(&o));
}

#[test]
fn q4_0_drafting_for_q8_0_keeps_greedy_tokens_smollm2() {
    let Some(m) = smollm2() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (target, draft) = (dir.path().join("smollm2-q8_0.gguf"), dir.path().join("smollm2-q4_0.gguf"));
    quantize(&m, &target, "q8_0");
    quantize(&m, &draft, "q4_0");
    let code: String = (0..6).map(|i| format!("def f{i}(x):\n    return x * {} + {i}\n\n", i % 4 + 2)).collect();
    let prompt = format!("Rename f3 to g3 in this code:\n{code}\nHere it is:\n");
    let counts =
        same_tokens_with_draft_model(target.to_str().unwrap(), draft.to_str().unwrap(), &["--prompt", &prompt]);
    for (drafted, accepted) in counts {
        assert!(accepted > 0, "{accepted} of {drafted}");
    }
}

#[test]
fn bench_compares_a_draft_model_with_plain_runs() {
    let m = fixture("llama");
    let m = m.to_str().unwrap();
    let args =
        ["bench", "--model", m, "-p", "48", "-g", "24", "-n", "2", "--warmup", "0", "--draft-model", m, "--json"];
    let o = shardlm_env(&args, FREE_DRAFTS);
    assert!(o.status.success(), "{}", stderr(&o));
    let j: Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    let s = &j["speculative"];
    assert_eq!(s["identical_output"], true, "{s}");
    assert!(s["drafted_tokens"].as_u64().unwrap() > 0, "{s}");
}

/// The one-line error of `run` with `--draft-model draft`.
fn refused(model: &str, draft: &str) -> String {
    let o = shardlm(&["run", "--model", model, "--prompt-ids", "5,6,7", "--max-tokens", "2", "--draft-model", draft]);
    assert!(!o.status.success(), "{draft} was accepted as a draft model for {model}");
    let err = stderr(&o);
    assert_eq!(err.trim().lines().count(), 1, "not one line: {err}");
    err
}

#[test]
fn draft_models_that_do_not_fit_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let other = copy_fixture("llama", tmp.path());
    edit_config(&other, |v| v["vocab_size"] = 2048.into());
    let llama = fixture("llama");
    let llama = llama.to_str().unwrap();
    let err = refused(llama, other.to_str().unwrap());
    assert!(err.contains("draft model") && err.contains("vocabulary has 2048 tokens"), "{err}");
    let missing = tmp.path().join("missing.gguf");
    let err = refused(llama, missing.to_str().unwrap());
    assert!(err.contains("draft model") && err.contains("missing.gguf"), "{err}");
    let o = shardlm(&["run", "--model", llama, "--prompt-ids", "5", "--draft", "model"]);
    assert!(!o.status.success() && stderr(&o).contains("--draft-model"), "{}", stderr(&o));
    if let Some(s) = smollm2() {
        // SmolLM2's tokenizer against a model without one (and 1024 tokens).
        let err = refused(s.to_str().unwrap(), llama);
        assert!(err.contains("not the target's vocabulary"), "{err}");
    }
}
