//! Quantized KV caches (q8_0, q4_0) on the tiny fixtures whose head_dim is a
//! multiple of 32, against the same model with an f16 cache: logits of a
//! 192-token prompt (prefilled in chunks of 64, so later chunks attend to
//! quantized keys of earlier ones) and of 16 teacher-forced decode steps.
//! Bounds on rms |Δ logit| and on top-1 agreement (max |Δ| is printed; the
//! MoE fixtures' routing flips make it jumpy); the figures are in
//! docs/LONGCTX.md. These random-weight models have near-flat logits (rms ≈ 1
//! over the vocabulary), so top-1 is fragile here; SmolLM2 gives the figures
//! that matter (crates/engine/tests/smollm2_kv_quant.rs). Fixtures with head_dim 16 must refuse a quantized cache
//! with an error.

use shardlm_model::{KvType, LoadOptions, LogitsMode, Model, NoComm, SeqKv, SeqStep, ShardSpec, Workspace};
use std::path::PathBuf;

fn load(name: &str, kv_type: KvType) -> Result<Model, shardlm_model::ModelError> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny").join(name);
    let files = formats::open_model(&path).unwrap();
    let opts = LoadOptions { kv_type: Some(kv_type), ..Default::default() };
    Model::load(&files, &ShardSpec::full(files.config.n_layers), &opts)
}

/// Logit rows: every prompt position (chunks of 64), then one per decode step
/// fed `forced` (the f16 run's greedy tokens, so every type sees the same input).
fn logits(m: &Model, prompt: &[u32], forced: &[u32]) -> Vec<Vec<f32>> {
    let pool = kernels::ThreadPool::new(2);
    let mut ws = Workspace::default();
    let mut cache = m.new_cache(prompt.len() + forced.len());
    let (mut out, mut logits) = (Vec::new(), Vec::new());
    let vocab = m.config.vocab_size;
    for part in prompt.chunks(64) {
        let mut steps = [SeqStep {
            tokens: part,
            cache: SeqKv::Own(&mut cache),
            mode: LogitsMode::All,
            prompt: false,
            logits: &mut logits,
        }];
        m.forward(&pool, &mut ws, &mut steps, &NoComm).unwrap();
        out.extend(logits.chunks_exact(vocab).map(|r| r.to_vec()));
    }
    for &t in forced {
        let tok = [t];
        let mut steps = [SeqStep {
            tokens: &tok,
            cache: SeqKv::Own(&mut cache),
            mode: LogitsMode::Last,
            prompt: false,
            logits: &mut logits,
        }];
        m.forward(&pool, &mut ws, &mut steps, &NoComm).unwrap();
        out.push(logits.clone());
    }
    out
}

fn argmax(x: &[f32]) -> usize {
    (0..x.len()).fold(0, |b, i| if x[i] > x[b] { i } else { b })
}

/// Error of `got` against `want`, over all rows.
struct Error {
    max: f32,
    rms: f64,
    /// Fraction of rows with the same argmax.
    top1: f64,
    /// RMS of `want` itself (the logits' scale).
    scale: f64,
}

fn compare(got: &[Vec<f32>], want: &[Vec<f32>]) -> Error {
    let (mut max, mut sq, mut wsq, mut n, mut same) = (0f32, 0f64, 0f64, 0usize, 0usize);
    for (g, w) in got.iter().zip(want) {
        for (a, b) in g.iter().zip(w) {
            max = max.max((a - b).abs());
            sq += ((a - b) as f64).powi(2);
            wsq += (*b as f64).powi(2);
        }
        n += w.len();
        same += (argmax(g) == argmax(w)) as usize;
    }
    Error { max, rms: (sq / n as f64).sqrt(), top1: same as f64 / want.len() as f64, scale: (wsq / n as f64).sqrt() }
}

#[test]
fn quantized_kv_error_against_f16() {
    // Deterministic token ids spread over the vocabulary.
    let prompt: Vec<u32> = (0..192u32).map(|i| i.wrapping_mul(2_654_435_761) >> 8).collect();
    for name in ["qwen2", "qwen3", "qwen2_moe", "qwen3_moe"] {
        let f16 = load(name, KvType::F16).unwrap();
        let vocab = f16.config.vocab_size as u32;
        let prompt: Vec<u32> = prompt.iter().map(|t| t % vocab).collect();
        let base = logits(&f16, &prompt, &[]);
        // The f16 run's greedy continuation, fed to every type.
        let mut forced = vec![argmax(base.last().unwrap()) as u32];
        let mut want = logits(&f16, &prompt, &forced);
        while forced.len() < 16 {
            forced.push(argmax(want.last().unwrap()) as u32);
            want = logits(&f16, &prompt, &forced);
        }
        for (ty, rms_bound, top1_bound) in
            [(KvType::F32, 2e-3, 0.99), (KvType::Q8_0, 0.12, 0.9), (KvType::Q4_0, 0.4, 0.5)]
        {
            let m = load(name, ty).unwrap();
            assert_eq!(m.kv_type, ty);
            let e = compare(&logits(&m, &prompt, &forced), &want);
            eprintln!(
                "{name} {}: |Δ logit| vs f16 max {:.2e} rms {:.2e} (logits rms {:.2}), top-1 agreement {:.1}%",
                ty.name(),
                e.max,
                e.rms,
                e.scale,
                100.0 * e.top1
            );
            assert!(e.rms <= rms_bound, "{name} {}: rms |Δ logit| = {}", ty.name(), e.rms);
            assert!(e.top1 >= top1_bound, "{name} {}: top-1 agreement {}", ty.name(), e.top1);
        }
    }
}

#[test]
fn quantized_kv_needs_head_dim_multiple_of_32() {
    for name in ["llama", "mistral"] {
        for ty in [KvType::Q8_0, KvType::Q4_0] {
            let err = load(name, ty).err().unwrap_or_else(|| panic!("{name}: {ty:?} with head_dim 16 loaded"));
            assert!(err.to_string().contains("multiple of 32"), "{name}: {err}");
        }
        assert!(load(name, KvType::F16).is_ok());
    }
}
