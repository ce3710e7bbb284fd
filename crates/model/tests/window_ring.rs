//! Sliding-window layers keep only a ring of `ring_positions(window)`
//! positions in a contiguous cache: logits equal the unbounded cache's over a
//! sequence many windows long, fed in chunks shorter and longer than the
//! ring, the cache holds less, and cutting it back past what the rings still
//! hold is an error, not a wrong answer.

use shardlm_model::{KvCache, LoadOptions, LogitsMode, Model, NoComm, SeqKv, SeqStep, ShardSpec, Workspace};
use std::path::PathBuf;

fn load(name: &str) -> Model {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny").join(name);
    let files = formats::open_model(&dir).unwrap();
    Model::load(&files, &ShardSpec::full(files.config.n_layers), &LoadOptions::default()).unwrap()
}

/// Logits of every position, `tokens` fed in `chunks`.
fn run(m: &Model, cache: &mut KvCache, tokens: &[u32], chunks: &[usize]) -> Vec<f32> {
    let pool = kernels::ThreadPool::new(2);
    let mut ws = Workspace::default();
    let (mut all, mut logits, mut at) = (Vec::new(), Vec::new(), 0);
    for &c in chunks.iter().chain(std::iter::repeat(&7)) {
        if at >= tokens.len() {
            break;
        }
        let part = &tokens[at..(at + c).min(tokens.len())];
        let mut steps =
            [SeqStep { tokens: part, cache: SeqKv::Own(cache), mode: LogitsMode::All, logits: &mut logits }];
        m.forward(&pool, &mut ws, &mut steps, &NoComm).unwrap();
        all.extend_from_slice(&logits);
        at += part.len();
    }
    all
}

#[test]
fn ring_cache_logits_equal_the_unbounded_cache() {
    // gemma3: window 8 on 3 of 4 layers; gpt_oss: window 8 on every other layer.
    for name in ["gemma3", "gpt_oss"] {
        let m = load(name);
        let n = 90;
        let tokens: Vec<u32> = (0..n as u32).map(|i| (i * 7919 + 11) % m.config.vocab_size as u32).collect();
        let rings = m.rings();
        assert!(rings.iter().any(|&r| r > 0), "{name}: no windowed layer");
        let width = m.config.n_kv_heads * m.config.head_dim;
        for chunks in [vec![1], vec![5, 20, 1, 1, 13], vec![40, 3], vec![n]] {
            // The same steps over a cache of every position.
            let mut full = KvCache::with_type(m.config.n_layers, width, n, m.kv_type);
            let want = run(&m, &mut full, &tokens, &chunks);
            let mut ring = m.new_cache(n);
            assert!(ring.bytes() < full.bytes(), "{name}: the ring cache holds less");
            assert_eq!(ring.bytes(), m.kv_bytes_at(n), "{name}: kv_bytes_at is what new_cache allocates");
            let got = run(&m, &mut ring, &tokens, &chunks);
            let d = got.iter().zip(&want).fold(0f32, |a, (x, y)| a.max((x - y).abs()));
            // Not bit-equal: the attention kernel sums per cache block, and a
            // ring is cut in blocks of its own size (1.1e-5 measured).
            assert!(d <= 5e-5, "{name} chunks {chunks:?}: max |Δ logits| {d}");
        }
    }
}

#[test]
fn cutting_back_past_the_rings_is_an_error() {
    let m = load("gemma3");
    let tokens: Vec<u32> = (0..60u32).collect();
    let pool = kernels::ThreadPool::new(1);
    let mut ws = Workspace::default();
    let mut cache = m.new_cache(64);
    let mut logits = Vec::new();
    let mut steps =
        [SeqStep { tokens: &tokens, cache: SeqKv::Own(&mut cache), mode: LogitsMode::Last, logits: &mut logits }];
    m.forward(&pool, &mut ws, &mut steps, &NoComm).unwrap();
    // Back a few positions: the rings (16) still hold the window (8) before 57.
    cache.truncate(57);
    let mut steps = [SeqStep {
        tokens: &tokens[57..58],
        cache: SeqKv::Own(&mut cache),
        mode: LogitsMode::Last,
        logits: &mut logits,
    }];
    m.forward(&pool, &mut ws, &mut steps, &NoComm).unwrap();
    // Back to 20: positions 13..20 were overwritten long ago.
    cache.truncate(20);
    let mut steps = [SeqStep {
        tokens: &tokens[20..21],
        cache: SeqKv::Own(&mut cache),
        mode: LogitsMode::Last,
        logits: &mut logits,
    }];
    let err = m.forward(&pool, &mut ws, &mut steps, &NoComm).unwrap_err().to_string();
    assert!(err.contains("sliding-window rings"), "{err}");
    // Back to 0 always works.
    cache.truncate(0);
    let mut steps =
        [SeqStep { tokens: &tokens[..1], cache: SeqKv::Own(&mut cache), mode: LogitsMode::Last, logits: &mut logits }];
    m.forward(&pool, &mut ws, &mut steps, &NoComm).unwrap();
}
