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
        let mut steps = [SeqStep {
            tokens: part,
            cache: SeqKv::Own(cache),
            mode: LogitsMode::All,
            prompt: false,
            logits: &mut logits,
        }];
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
    let mut steps = [SeqStep {
        tokens: &tokens,
        cache: SeqKv::Own(&mut cache),
        mode: LogitsMode::Last,
        prompt: false,
        logits: &mut logits,
    }];
    m.forward(&pool, &mut ws, &mut steps, &NoComm).unwrap();
    // Back a few positions: the rings (16) still hold the window (8) before 57.
    cache.truncate(57);
    let mut steps = [SeqStep {
        tokens: &tokens[57..58],
        cache: SeqKv::Own(&mut cache),
        mode: LogitsMode::Last,
        prompt: false,
        logits: &mut logits,
    }];
    m.forward(&pool, &mut ws, &mut steps, &NoComm).unwrap();
    // Back to 20: positions 13..20 were overwritten long ago.
    cache.truncate(20);
    let mut steps = [SeqStep {
        tokens: &tokens[20..21],
        cache: SeqKv::Own(&mut cache),
        mode: LogitsMode::Last,
        prompt: false,
        logits: &mut logits,
    }];
    let err = m.forward(&pool, &mut ws, &mut steps, &NoComm).unwrap_err().to_string();
    assert!(err.contains("sliding-window rings"), "{err}");
    // Back to 0 always works.
    cache.truncate(0);
    let mut steps = [SeqStep {
        tokens: &tokens[..1],
        cache: SeqKv::Own(&mut cache),
        mode: LogitsMode::Last,
        prompt: false,
        logits: &mut logits,
    }];
    m.forward(&pool, &mut ws, &mut steps, &NoComm).unwrap();
}

/// The paged pool's window group: windowed layers in blocks of their own, a
/// sequence holding only the blocks its window reads (the others handed to
/// someone else and overwritten): logits equal, bit for bit, a pool whose
/// windowed layers keep every position; a window table that misses what a
/// step reads is an error.
#[test]
fn window_blocks_in_the_paged_pool_equal_every_position() {
    use shardlm_model::{KvType, WindowBlocks};
    for (name, kv_type) in [("gemma3", None), ("gpt_oss", None), ("gemma3", Some(KvType::Q8_0))] {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny").join(name);
        let files = formats::open_model(&dir).unwrap();
        let opts = LoadOptions { kv_type, ..Default::default() };
        let m = Model::load(&files, &ShardSpec::full(files.config.n_layers), &opts).unwrap();
        let pool = kernels::ThreadPool::new(2);
        let mut ws = Workspace::default();
        let (block, n) = (4usize, 60usize);
        let tokens: Vec<u32> = (0..n as u32).map(|i| (i * 7919 + 11) % m.config.vocab_size as u32).collect();
        let table: Vec<u32> = (0..n.div_ceil(block) as u32).collect();
        let mut full = m.new_pool(block, table.len());
        let mut win = m.new_pool_windowed(block, table.len(), 8);
        assert!(win.bytes() < full.bytes(), "{name}: the window group holds less");
        // Window 8: a step of up to 5 tokens at `at` reads from at − 7 on; keep
        // the blocks from there on, in a ring of 8 ids that wraps (so blocks
        // that left the window are written again).
        let (mut got, mut want) = (Vec::new(), Vec::new());
        let mut at = 0usize;
        while at < n {
            let len = 5.min(n - at);
            let first = (at + 1).saturating_sub(8) / block;
            let ids: Vec<u32> = (first..(at + len).div_ceil(block)).map(|i| (i % 8) as u32).collect();
            for (kv, out, window) in [
                (&mut full, &mut want, WindowBlocks::default()),
                (&mut win, &mut got, WindowBlocks { first, blocks: &ids }),
            ] {
                let mut logits = Vec::new();
                let cache = SeqKv::Paged { table: &table, start: at, state: None, window };
                let mut steps = [SeqStep {
                    tokens: &tokens[at..at + len],
                    cache,
                    mode: LogitsMode::All,
                    prompt: false,
                    logits: &mut logits,
                }];
                m.forward_paged(&pool, &mut ws, kv, &mut steps, &NoComm).unwrap();
                out.extend_from_slice(&logits);
            }
            at += len;
        }
        assert_eq!(got, want, "{name}: window blocks change no logit");
        // A window table starting after what the step reads.
        let mut logits = Vec::new();
        let ids = [0u32];
        let cache =
            SeqKv::Paged { table: &table, start: 20, state: None, window: WindowBlocks { first: 5, blocks: &ids } };
        let mut steps =
            [SeqStep { tokens: &tokens[20..21], cache, mode: LogitsMode::Last, prompt: false, logits: &mut logits }];
        let err = m.forward_paged(&pool, &mut ws, &mut win, &mut steps, &NoComm).unwrap_err().to_string();
        assert!(err.contains("window blocks hold"), "{err}");
    }
}
