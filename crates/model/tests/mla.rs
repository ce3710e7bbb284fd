//! Multi-head latent attention (deepseek_v3 fixture): the absorbed path equals
//! the expanded reference over prefill chunks and decode steps, the paged pool
//! equals the contiguous cache, the cost figures count latent rows and the
//! folded projections, and bad configs or cache types are one-line errors.

use shardlm_model::mla::MlaMode;
use shardlm_model::{KvType, LoadOptions, LogitsMode, Model, ModelError, NoComm, SeqKv, SeqStep, ShardSpec, Workspace};
use std::path::{Path, PathBuf};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny/deepseek_v3")
}

fn prompt() -> Vec<u32> {
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture().join("golden.json")).unwrap()).unwrap();
    j["input_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect()
}

fn load(dir: &Path, opts: &LoadOptions) -> Result<Model, ModelError> {
    let files = formats::open_model(dir)?;
    Model::load(&files, &ShardSpec::full(files.config.n_layers), opts)
}

fn argmax(x: &[f32]) -> u32 {
    (0..x.len()).fold(0, |b, i| if x[i] > x[b] { i } else { b }) as u32
}

/// Prefill in two chunks, then `decode` greedy steps: every logit row.
fn run(m: &Model, tokens: &[u32], decode: usize) -> Vec<f32> {
    let pool = kernels::ThreadPool::new(2);
    let mut ws = Workspace::default();
    let mut cache = m.new_cache(tokens.len() + decode);
    let (mut logits, mut all) = (Vec::new(), Vec::new());
    let split = tokens.len() / 3;
    for part in [&tokens[..split], &tokens[split..]] {
        let mut steps = [SeqStep {
            tokens: part,
            cache: SeqKv::Own(&mut cache),
            mode: LogitsMode::All,
            prompt: false,
            logits: &mut logits,
        }];
        m.forward(&pool, &mut ws, &mut steps, &NoComm).unwrap();
        all.extend_from_slice(&logits);
    }
    for _ in 0..decode {
        let tok = [argmax(&all[all.len() - m.config.vocab_size..])];
        let mut steps = [SeqStep {
            tokens: &tok,
            cache: SeqKv::Own(&mut cache),
            mode: LogitsMode::Last,
            prompt: false,
            logits: &mut logits,
        }];
        m.forward(&pool, &mut ws, &mut steps, &NoComm).unwrap();
        all.extend_from_slice(&logits);
    }
    all
}

/// Absorbed (queries folded into latent space, outputs lifted after) and
/// expanded (per-head K/V rebuilt from the cached latents) attention give the
/// same logits for prefill chunks and decode steps, with f32 and f16 caches.
#[test]
fn absorbed_equals_expanded() {
    let tokens = prompt();
    for kv_type in [KvType::F32, KvType::F16] {
        let opts = |mla| LoadOptions { kv_type: Some(kv_type), mla, ..Default::default() };
        let a = run(&load(&fixture(), &opts(MlaMode::Absorbed)).unwrap(), &tokens, 8);
        let e = run(&load(&fixture(), &opts(MlaMode::Expanded)).unwrap(), &tokens, 8);
        let scale = e.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = a.iter().zip(&e).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        eprintln!("{kv_type:?}: absorbed vs expanded max |Δ| = {d:.2e} (max |logit| {scale:.2})");
        // Both modes read the same cached values; they differ in association
        // (q·(W_UK c) against (W_UKᵀ q)·c) and so in f32 rounding. The scalar
        // score loop sums the 576-wide latent dot sequentially: worst case
        // ~n·ε ≈ 576 · 6e-8 ≈ 3.4e-5 relative (measured 2.3e-5 there with an
        // f16 cache, ≤ 1.1e-6 at AVX2/AVX-512).
        assert!(d <= 5e-5 * scale, "{kv_type:?}: absorbed vs expanded differ by {d}");
    }
}

/// The serving engine's paged pool (latent rows in blocks, an out-of-order
/// block table) computes what the contiguous cache does.
#[test]
fn paged_pool_equals_contiguous() {
    let m = load(&fixture(), &LoadOptions::default()).unwrap();
    let tokens = prompt();
    let want = run(&m, &tokens, 0);
    let pool = kernels::ThreadPool::new(2);
    let mut ws = Workspace::default();
    let mut kv = m.new_pool(16, 4);
    assert_eq!(kv.v_width, 0, "latent attention caches no V rows");
    let table = [3u32, 0];
    let (mut logits, mut got) = (Vec::new(), Vec::new());
    let split = 10;
    for (start, part) in [(0, &tokens[..split]), (split, &tokens[split..])] {
        let cache = SeqKv::Paged { table: &table, start, state: None, window: Default::default() };
        let mut steps = [SeqStep { tokens: part, cache, mode: LogitsMode::All, prompt: false, logits: &mut logits }];
        m.forward_paged(&pool, &mut ws, &mut kv, &mut steps, &NoComm).unwrap();
        got.extend_from_slice(&logits);
    }
    let d = got.iter().zip(&want).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(d <= 1e-5, "paged vs contiguous differ by {d}");
}

/// KV: one row of kv_lora_rank + qk_rope_head_dim = 48 values per layer and
/// position. Weights per decoded token: the projections, the f32 W_UK/W_UVᵀ,
/// the dense MLP (layer 0), router + 4 of 16 experts + the shared expert.
#[test]
fn cost_figures() {
    let m = load(&fixture(), &LoadOptions::default()).unwrap();
    assert_eq!(m.kv_bytes_per_token(), 3 * 48 * 4);
    assert_eq!(m.new_cache(10).bytes(), 3 * 48 * 4 * 10);
    let m16 = load(&fixture(), &LoadOptions { kv_type: Some(KvType::F16), ..Default::default() }).unwrap();
    assert_eq!(m16.kv_bytes_per_token(), 3 * 48 * 2);
    assert_eq!(m16.new_pool(32, 2).bytes(), 3 * 48 * 2 * 64);
    // bf16 projections: q_a [48,128], q_b [192,48], kv_a [48,128], o [128,128];
    // 4 heads × (32×32 W_UK + 32×32 W_UVᵀ) in f32.
    let attn = (48 * 128 + 192 * 48 + 48 * 128 + 128 * 128) * 2 + 4 * (32 * 32 + 32 * 32) * 4;
    let dense = 3 * 256 * 128 * 2;
    let moe = 16 * 128 * 2 + 4 * (3 * 64 * 128 * 2) + 3 * 64 * 128 * 2;
    assert_eq!(m.weight_bytes_per_token(), 3 * attn + dense + 2 * moe + 1024 * 128 * 2);
}

/// Copies the fixture with its config edited by `edit`.
fn edited(tag: &str, edit: impl Fn(&mut serde_json::Value)) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("shardlm-mla-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(fixture().join("model.safetensors"), dir.join("model.safetensors")).unwrap();
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture().join("config.json")).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    dir
}

#[test]
fn bad_inputs_are_one_line_errors() {
    type Edit = Box<dyn Fn(&mut serde_json::Value)>;
    let q8 = LoadOptions { kv_type: Some(KvType::Q8_0), ..Default::default() };
    let cases: Vec<(Edit, LoadOptions, &str)> = vec![
        (
            Box::new(|_| {}),
            q8,
            "a q8_0 KV cache needs the latent row (kv_lora_rank + qk_rope_head_dim = 48) to be a multiple of 32",
        ),
        // No q_lora_rank: a single q_proj, which this checkpoint lacks.
        (
            Box::new(|c| c["q_lora_rank"] = serde_json::Value::Null),
            LoadOptions::default(),
            "model.layers.0.self_attn.q_proj.weight",
        ),
        (
            Box::new(|c| c["kv_lora_rank"] = 64.into()),
            LoadOptions::default(),
            "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
        ),
        (
            Box::new(|c| {
                c.as_object_mut().unwrap().remove("kv_lora_rank");
            }),
            LoadOptions::default(),
            "deepseek_v3 config lacks an integer 'kv_lora_rank'",
        ),
        (Box::new(|c| c["n_group"] = 3.into()), LoadOptions::default(), "n_group 3 must divide 16 experts"),
        (Box::new(|c| c["scoring_func"] = "softmax".into()), LoadOptions::default(), "scoring_func 'softmax'"),
    ];
    for (i, (edit, opts, want)) in cases.into_iter().enumerate() {
        let dir = edited(&i.to_string(), edit);
        let err = load(&dir, &opts).unwrap_err().to_string();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(err.contains(want), "case {i}: {err}");
        assert!(!err.contains('\n'), "{err}");
    }
}

/// Two sequences in one step (their rows concatenated for the projections,
/// attention per sequence against its own latents) give what each gives alone,
/// in both modes.
#[test]
fn batched_sequences_equal_alone() {
    let a = prompt();
    let b: Vec<u32> = a.iter().rev().copied().take(9).collect();
    let pool = kernels::ThreadPool::new(2);
    for mla in [MlaMode::Absorbed, MlaMode::Expanded] {
        let m = load(&fixture(), &LoadOptions { mla, ..Default::default() }).unwrap();
        let alone = |tokens: &[u32]| {
            let (mut ws, mut cache, mut out) = (Workspace::default(), m.new_cache(tokens.len()), Vec::new());
            let mut steps = [SeqStep {
                tokens,
                cache: SeqKv::Own(&mut cache),
                mode: LogitsMode::All,
                prompt: false,
                logits: &mut out,
            }];
            m.forward(&pool, &mut ws, &mut steps, &NoComm).unwrap();
            out
        };
        let (want_a, want_b) = (alone(&a), alone(&b));
        let (mut ca, mut cb) = (m.new_cache(a.len()), m.new_cache(b.len()));
        let (mut la, mut lb) = (Vec::new(), Vec::new());
        let mut steps = [
            SeqStep { tokens: &a, cache: SeqKv::Own(&mut ca), mode: LogitsMode::All, prompt: false, logits: &mut la },
            SeqStep { tokens: &b, cache: SeqKv::Own(&mut cb), mode: LogitsMode::All, prompt: false, logits: &mut lb },
        ];
        m.forward(&pool, &mut Workspace::default(), &mut steps, &NoComm).unwrap();
        for (got, want) in [(&la, &want_a), (&lb, &want_b)] {
            let d = got.iter().zip(want.iter()).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            assert_eq!(got.len(), want.len());
            assert!(d <= 1e-5, "{mla:?}: batched vs alone differ by {d}");
        }
    }
}

/// Yarn scaling (DeepSeek V3's published config): the softmax scale is
/// `qk_head_dim^-½ · (0.1 · mscale_all_dim · ln factor + 1)²`, as
/// transformers' `yarn_apply_mscale`; the model loads and runs with it.
#[test]
fn yarn_scales_the_softmax() {
    let dir = edited("yarn", |c| {
        c["rope_scaling"] = serde_json::json!({
            "type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
            "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0
        });
    });
    let files = formats::open_model(&dir).unwrap();
    let spec = shardlm_model::Arch::from_name("deepseek_v3").unwrap().spec(&files.config).unwrap();
    let ms = 0.1f32 * 40f32.ln() + 1.0;
    let want = ms * ms / 48f32.sqrt();
    assert!((spec.mla.unwrap().scale - want).abs() <= 1e-6 * want);
    let m = load(&dir, &LoadOptions::default()).unwrap();
    let logits = run(&m, &prompt(), 2);
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(logits.iter().all(|v| v.is_finite()));
}
