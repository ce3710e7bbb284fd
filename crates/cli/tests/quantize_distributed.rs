//! Low-bit checkpoints written by `shardlm quantize` (tiny llama and qwen3 in
//! nvfp4, mxfp4, fp8) run distributed: pipeline 2 gives bit-identical logits and
//! tensor 2 the same greedy output as one process (logits within 1e-3 relative:
//! the row-parallel sums only change float summation order; every shard boundary
//! falls on a block boundary, so each rank quantizes its activations identically).

mod common;
use common::*;

/// Runs `shardlm run` on token ids; returns (output ids, logits of every prompt position).
fn run(model: &str, extra: &[&str]) -> (Vec<u64>, Vec<f32>) {
    run_with_logits(model, "8", &["--prompt-ids", "1,17,230,5,999,64,3,512"], extra)
}

#[test]
fn quantized_tiny_models_pipeline_and_tensor_2() {
    let tmp = tempfile::tempdir().unwrap();
    for name in ["llama", "qwen3"] {
        for to in ["nvfp4", "mxfp4", "fp8"] {
            let q = tmp.path().join(format!("{name}-{to}"));
            let o = shardlm(&["quantize", fixture(name).to_str().unwrap(), q.to_str().unwrap(), "--to", to]);
            assert!(o.status.success(), "{name} {to}: {}", stderr(&o));
            let m = q.to_str().unwrap();
            let (want_ids, want) = run(m, &[]);
            let (ids, got) = run(m, &["--ranks", "2"]);
            assert_eq!(got, want, "{name} {to}: pipeline 2 logits must be bit-identical");
            assert_eq!(ids, want_ids, "{name} {to}: pipeline 2");
            let (ids, got) = run(m, &["--ranks", "2", "--strategy", "tensor"]);
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = want.iter().zip(&got).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale;
            assert!(d <= 1e-3, "{name} {to}: tensor 2 relative logits difference {d}");
            assert_eq!(ids, want_ids, "{name} {to}: tensor 2 greedy output");
        }
    }
}
