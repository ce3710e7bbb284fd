//! Measuring the model itself on this machine (`--machines local` with the
//! model on disk): one rank's shard, as the engine would load it (its layers,
//! its tensor-parallel slice, the KV type, the thread count), runs a prompt
//! chunk and decode steps with the real `Model`, and the real attention kernel
//! is timed at the depths the workload reaches. Synthetic probes missed most of
//! a real step: pool hand-offs, norms and rope on small matrices, and split-K
//! decode attention over the cache, which is far slower than a matrix product
//! over the same bytes.

use super::cost::{Measured, Workload};
use anyhow::{anyhow, Context, Result};
use kernels::attention::{AttnShape, KvElem};
use kernels::ThreadPool;
use model::{KvLayers, KvType, LogitsMode, SeqKv, SeqStep};
use std::path::Path;
use std::time::{Duration, Instant};

/// Most weight bytes loaded for the measurement: per-layer figures from this
/// many layers are far past every cache level, and the plan stays quick on a
/// large model.
const MAX_LOAD_BYTES: f64 = 1.0e9;
/// Most prompt rows of the measured chunk (per-row cost is flat past this;
/// the attention part is scaled by its own fit).
const MAX_CHUNK_ROWS: usize = 256;
/// Deepest cache the attention kernel is timed at; deeper is extrapolated
/// linearly (decode and prefill attention are linear in the depth).
const MAX_PROBE_DEPTH: usize = 16384;
/// Decode steps timed: at least this many and [`DECODE_MIN_TIME`], at most
/// [`DECODE_MAX_STEPS`] (the median is kept). Sixteen steps (~0.1 s on
/// SmolLM2) gave medians 1.8× apart from one plan run to the next on a quiet
/// machine (2026-12-01); half a second of steps keeps them within a few %.
const DECODE_MIN_STEPS: usize = 32;
const DECODE_MAX_STEPS: usize = 512;
const DECODE_MIN_TIME: Duration = Duration::from_millis(600);
/// Most decode steps timed deep in the context (its cache is allocated for them).
const DEEP_MAX_STEPS: usize = 128;
/// Sequences in the timed batched decode step (`serve`'s default streams).
const BATCH: usize = 8;
/// Most bytes of KV cache the attention probe cycles through (see
/// [`attention_slopes`]).
const MAX_PROBE_KV_BYTES: f64 = 512e6;

/// The median of `xs` (0 for none).
fn median(mut xs: Vec<f64>) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Median seconds of `f` over at least `min_calls` calls and `min` of time,
/// after one warm-up call.
fn median_time(min: Duration, min_calls: usize, mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    let mut ts = Vec::new();
    while ts.len() < min_calls || start.elapsed() < min {
        let t = Instant::now();
        f();
        ts.push(t.elapsed().as_secs_f64());
    }
    median(ts)
}

/// Which shard to time, and how.
#[derive(Clone, Copy)]
pub struct ShardProbe<'a> {
    pub path: &'a Path,
    /// Tensor-parallel width (1: the whole width); rank 0's shard is timed.
    pub tp: usize,
    /// MoE blocks hold whole experts (`--strategy expert`).
    pub expert: bool,
    /// Threads of the rank.
    pub threads: usize,
    pub kv: KvType,
    pub w: &'a Workload,
}

/// Times `probe`'s shard in `copies` threads at once (each its own shard and
/// `threads`-thread pool, timed phases started together), keeping the slowest
/// copy's seconds: ranks that share a host share its caches and memory.
pub fn measure_shard(probe: &ShardProbe<'_>, copies: usize) -> Result<Measured> {
    if copies <= 1 {
        return measure_one(probe, None);
    }
    let sync = Rendezvous::new(copies);
    let results: Vec<Result<Measured>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..copies)
            .map(|_| {
                s.spawn(|| {
                    // A copy that fails or panics releases the others from
                    // every later rendezvous instead of leaving them waiting.
                    let _release = ReleaseOnDrop(&sync);
                    measure_one(probe, Some(&sync))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("a measuring thread panicked")))).collect()
    });
    let mut all = results.into_iter().collect::<Result<Vec<_>>>()?;
    let mut m = all.pop().context("no copies measured")?;
    for o in all {
        m.layer_decode_s = m.layer_decode_s.max(o.layer_decode_s);
        m.head_decode_s = m.head_decode_s.max(o.head_decode_s);
        m.layer_prefill_s = m.layer_prefill_s.max(o.layer_prefill_s);
        m.head_prefill_s = m.head_prefill_s.max(o.head_prefill_s);
        m.attn_s_per_key = m.attn_s_per_key.max(o.attn_s_per_key);
        m.attn_s_per_pair = m.attn_s_per_pair.max(o.attn_s_per_pair);
        m.layer_row_s = m.layer_row_s.max(o.layer_row_s);
        m.head_row_s = m.head_row_s.max(o.head_row_s);
    }
    Ok(m)
}

/// A barrier for the side-by-side copies that any of them can release for
/// good (`release`), so a copy that fails never leaves the others waiting.
struct Rendezvous {
    n: usize,
    /// (arrived in this round, round, released)
    state: std::sync::Mutex<(usize, u64, bool)>,
    turn: std::sync::Condvar,
}

impl Rendezvous {
    fn new(n: usize) -> Rendezvous {
        Rendezvous { n, state: std::sync::Mutex::new((0, 0, false)), turn: std::sync::Condvar::new() }
    }

    /// Waits for all `n` (or a release). False if released first.
    fn wait(&self) -> bool {
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if g.2 {
            return false;
        }
        g.0 += 1;
        if g.0 == self.n {
            g.0 = 0;
            g.1 += 1;
            self.turn.notify_all();
            return true;
        }
        let round = g.1;
        while g.1 == round && !g.2 {
            g = self.turn.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        // The round completing wins over a release that came after it.
        g.1 != round
    }

    fn release(&self) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).2 = true;
        self.turn.notify_all();
    }
}

/// Releases the rendezvous when a copy's thread ends, however it ends (the
/// others have passed every rendezvous by then if it succeeded).
struct ReleaseOnDrop<'a>(&'a Rendezvous);

impl Drop for ReleaseOnDrop<'_> {
    fn drop(&mut self) {
        self.0.release();
    }
}

/// Measures the shard rank 0 of a `tp`-wide tensor group (the busiest: it
/// holds the extra GQA group when the heads do not divide; `tp = 1`: the
/// whole width) at `threads` threads, for the workload `w`. Err if the model
/// cannot be loaded or split that way here. `sync`: copies measured side by
/// side wait there before each timed phase.
fn measure_one(probe: &ShardProbe<'_>, sync: Option<&Rendezvous>) -> Result<Measured> {
    let ShardProbe { path, tp, expert, threads, kv, w } = *probe;
    // Copies side by side start each timed phase together; a released
    // rendezvous (another copy failed) ends this one too.
    let together = || match sync {
        Some(r) if !r.wait() => Err(anyhow!("another copy of the shard failed")),
        _ => Ok(()),
    };
    let files = formats::open_model(path)?;
    let cfg = files.config.clone();
    let layer_bytes: f64 = files
        .tensors
        .tensors
        .iter()
        .filter(|(n, _)| n.starts_with("model.layers."))
        .map(|(_, t)| t.bytes().len() as f64)
        .sum::<f64>()
        / cfg.n_layers.max(1) as f64;
    let n_load = ((MAX_LOAD_BYTES * tp as f64 / layer_bytes.max(1.0)) as usize).clamp(1, cfg.n_layers.max(1));
    let slice = if tp > 1 {
        let block = crate::dist_args::mlp_block(&files, None);
        let s = model::plan::tp_slice(
            cfg.n_heads,
            cfg.n_kv_heads,
            cfg.intermediate_size,
            cfg.vocab_size,
            block,
            &vec![1.0; tp],
            0,
        )
        .map_err(|e| anyhow!("{e}"))?;
        Some(if expert {
            s.expert_parallel(super::shape::n_experts(&cfg.raw)).map_err(|e| anyhow!("{e}"))?
        } else {
            s
        })
    } else {
        None
    };
    let (q_heads, kv_heads) =
        slice.as_ref().map_or((cfg.n_heads, cfg.n_kv_heads), |s| (s.q_heads.len(), s.kv_heads.len()));
    let spec = model::ShardSpec { layers: 0..n_load, has_embed: true, has_head: true, tp: slice };
    let opts = model::LoadOptions { kv_type: Some(kv), ..model::LoadOptions::from_env(None) };
    let m = model::Model::load(&files, &spec, &opts).context("loading the model to measure it")?;
    let pool = ThreadPool::new(threads);
    let mut ws = model::Workspace::default();
    let rows = w.chunk.min(w.context).clamp(1, MAX_CHUNK_ROWS);
    let mut cache = m.new_cache(rows + DECODE_MAX_STEPS + 2);
    let mut logits = Vec::new();
    let vocab = cfg.vocab_size.max(2) as u32;
    let prompt: Vec<u32> = (0..rows as u32).map(|i| (i * 7919 + 13) % vocab).collect();
    // (seconds of embedding + layers, seconds of the head) of one step.
    let mut step = |tokens: &[u32], cache: &mut model::KvCache, mode: LogitsMode| -> Result<(f64, f64)> {
        let mut seqs = [SeqStep { tokens, cache: SeqKv::Own(cache), mode, prompt: false, logits: &mut logits }];
        let t0 = Instant::now();
        m.embed_tokens(&mut ws, &seqs, &model::NoComm)?;
        m.run_layers(&pool, &mut ws, &mut seqs, None, &model::NoComm)?;
        let t1 = Instant::now();
        m.head(&pool, &mut ws, &mut seqs, &model::NoComm)?;
        Ok(((t1 - t0).as_secs_f64(), t1.elapsed().as_secs_f64()))
    };
    // A few rows first: they fault the weights' pages in (every row reads
    // every weight) and start the pool; then the timed chunk.
    step(&prompt[..rows.min(8)], &mut cache, LogitsMode::Argmax)?;
    cache.truncate(0);
    together()?;
    let (chunk_layers_s, head_prefill_s) = step(&prompt, &mut cache, LogitsMode::Argmax)?;
    let mut dec = Vec::new();
    let mut head = Vec::new();
    together()?;
    let start = Instant::now();
    while dec.len() < DECODE_MAX_STEPS && (dec.len() < DECODE_MIN_STEPS || start.elapsed() < DECODE_MIN_TIME) {
        let i = dec.len() as u32;
        let (l, h) = step(&[(i * 31 + 7) % vocab], &mut cache, LogitsMode::Argmax)?;
        dec.push(l);
        head.push(h);
    }
    let steps = dec.len();
    let per_layer = |s: f64| s / n_load as f64;
    let layer_decode_at_rows = per_layer(median(dec));
    let head_decode_s = median(head);
    let depth_meas = rows + steps / 2;
    // Decode deep in the context: a second cache with `hi` positions filled
    // with synthetic rows, timed the same way. The slope between the two
    // depths is what a step pays per cached key, with the weights streaming
    // beside the KV as they do in a real step. (The attention kernel timed
    // alone over one layer's cache served it from L2/L3: decode at depth 2048
    // was predicted 25–45% too fast on SmolLM2, 2026-12-01.)
    let hi = w.context.min(MAX_PROBE_DEPTH).max(depth_meas + 256);
    let mut deep_cache = m.new_cache(hi + DEEP_MAX_STEPS + 1);
    fill_cache(&mut deep_cache);
    deep_cache.len = hi;
    together()?;
    let mut deep = Vec::new();
    let start = Instant::now();
    while deep.len() < DEEP_MAX_STEPS && (deep.len() < DECODE_MIN_STEPS || start.elapsed() < DECODE_MIN_TIME) {
        let i = deep.len() as u32;
        deep.push(step(&[(i * 37 + 11) % vocab], &mut deep_cache, LogitsMode::Argmax)?.0);
    }
    let depth_deep = hi + deep.len() / 2;
    drop(deep_cache);
    // A batched decode step, as `serve` runs many streams: BATCH sequences
    // of one token each against one sequence alone, both at depth 0 (the
    // caches are emptied before each step), alternating. The difference per
    // added sequence is its row: the narrow tile kernels, norms, activation
    // quantization and head row, which the weights' stream does not hide.
    let mut caches: Vec<model::KvCache> = (0..BATCH).map(|_| m.new_cache(4)).collect();
    let mut outs: Vec<Vec<f32>> = vec![Vec::new(); BATCH];
    let (mut one, mut many, mut head_one, mut head_many) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    together()?;
    let start = Instant::now();
    while one.len() < DECODE_MIN_STEPS || (one.len() < DECODE_MAX_STEPS / 4 && start.elapsed() < DECODE_MIN_TIME) {
        for k in [1, BATCH] {
            let toks: Vec<[u32; 1]> = (0..k).map(|j| [((one.len() * 31 + j * 17 + 5) as u32) % vocab]).collect();
            let mut seqs: Vec<SeqStep<'_>> = caches
                .iter_mut()
                .zip(outs.iter_mut())
                .zip(&toks)
                .map(|((c, l), t)| {
                    c.truncate(0);
                    SeqStep { tokens: t, cache: SeqKv::Own(c), mode: LogitsMode::Argmax, prompt: false, logits: l }
                })
                .collect();
            let t0 = Instant::now();
            m.embed_tokens(&mut ws, &seqs, &model::NoComm)?;
            m.run_layers(&pool, &mut ws, &mut seqs, None, &model::NoComm)?;
            let t1 = Instant::now();
            m.head(&pool, &mut ws, &mut seqs, &model::NoComm)?;
            let (l, h) = ((t1 - t0).as_secs_f64(), t1.elapsed().as_secs_f64());
            if k == 1 {
                one.push(l);
                head_one.push(h);
            } else {
                many.push(l);
                head_many.push(h);
            }
        }
    }
    drop(caches);
    let extra = (BATCH - 1) as f64;
    let layer_row_s = (per_layer(median(many)) - per_layer(median(one))).max(0.0) / extra;
    let head_row_s = (median(head_many) - median(head_one)).max(0.0) / extra;
    let per_key = ((per_layer(median(deep)) - layer_decode_at_rows) / (depth_deep - depth_meas) as f64).max(0.0);
    let layer_decode_s = (layer_decode_at_rows + per_key * (w.context as f64 - depth_meas as f64)).max(0.0);
    // The attention kernel at this shard's heads: seconds per (row, key) pair
    // of a prompt chunk.
    let sh = AttnShape {
        n_new: 1,
        start_pos: 0,
        n_heads: q_heads,
        n_kv_heads: kv_heads,
        head_dim: cfg.head_dim,
        window: None,
        sinks: None,
        prefill: false,
        scale: 1.0 / (cfg.head_dim as f32).sqrt(),
    };
    together()?;
    let per_pair = prefill_attention_slope(&pool, kv, &sh, rows, w.context, cfg.n_layers)?;
    // A chunk of r rows at start s through one layer: r·μ + per_pair·r·(s + (r+1)/2).
    let r0 = rows as f64;
    let mu = (per_layer(chunk_layers_s) - per_pair * r0 * (r0 + 1.0) / 2.0).max(0.0) / r0;
    let mut layer_prefill_s = 0.0;
    let mut start = 0;
    while start < w.context {
        let r = w.chunk.min(w.context - start) as f64;
        layer_prefill_s += r * mu + per_pair * r * (start as f64 + (r + 1.0) / 2.0);
        start += w.chunk.max(1);
    }
    Ok(Measured {
        tp,
        expert,
        layer_decode_s,
        head_decode_s,
        layer_prefill_s,
        head_prefill_s,
        attn_s_per_key: per_key,
        attn_s_per_pair: per_pair,
        layer_row_s,
        head_row_s,
    })
}

/// Seconds per (row, key) pair of a prompt chunk through one layer's
/// attention, from the real kernel: a chunk of `rows` at start 0 and deep in
/// the context (capped at [`MAX_PROBE_DEPTH`]).
///
/// A real prefill reads each of its `n_layers` layers' caches in turn, so a
/// layer's keys do not stay in a cache level between chunks; the probe cycles
/// through as many layers' caches as the model has (up to
/// [`MAX_PROBE_KV_BYTES`]), one per call.
fn prefill_attention_slope(
    pool: &ThreadPool,
    kv: KvType,
    sh: &AttnShape,
    rows: usize,
    context: usize,
    n_layers: usize,
) -> Result<f64> {
    let deep = context.saturating_sub(rows).min(MAX_PROBE_DEPTH).max(rows);
    let width = sh.n_kv_heads * sh.head_dim;
    let capacity = deep + rows + 1;
    let layer_bytes = model::KvCache::with_type(1, width, capacity, kv).bytes().max(1) as f64;
    let copies = ((MAX_PROBE_KV_BYTES / layer_bytes) as usize).clamp(1, n_layers.max(1));
    let mut cache = model::KvCache::with_type(copies, width, capacity, kv);
    match &mut cache.pool.layers {
        KvLayers::F16(l) => time_prefill_attention(pool, l, sh, rows, deep),
        KvLayers::F32(l) => time_prefill_attention(pool, l, sh, rows, deep),
        KvLayers::Q8_0(l) => time_prefill_attention(pool, l, sh, rows, deep),
        KvLayers::Q4_0(l) => time_prefill_attention(pool, l, sh, rows, deep),
    }
}

/// Every position of every layer of `cache` written with small values (so
/// its pages are real, and f16 holds no NaN), for decode timed at depth.
fn fill_cache(cache: &mut model::KvCache) {
    fn fill<T: KvElem>(layers: &mut [(Vec<T>, Vec<T>)]) {
        let vals: Vec<f32> = (0..64 * T::VALUES).map(|i| ((i * 7919 % 997) as f32 / 997.0 - 0.5) * 0.2).collect();
        for (k, v) in layers.iter_mut() {
            for part in k.chunks_mut(64).chain(v.chunks_mut(64)) {
                let n = part.len() * T::VALUES;
                T::store(&vals[..n], part);
            }
        }
    }
    match &mut cache.pool.layers {
        KvLayers::F16(l) => fill(l),
        KvLayers::F32(l) => fill(l),
        KvLayers::Q8_0(l) => fill(l),
        KvLayers::Q4_0(l) => fill(l),
    }
}

/// Times a prompt chunk of `rows` through the attention kernel over `layers`
/// (one layer's K and V each, a different layer each call), at start 0 and
/// at `deep`: seconds per (row, key) pair.
fn time_prefill_attention<T: KvElem>(
    pool: &ThreadPool,
    layers: &mut [(Vec<T>, Vec<T>)],
    sh: &AttnShape,
    rows: usize,
    deep: usize,
) -> Result<f64> {
    let stride = sh.stride::<T>();
    if stride == 0 || !sh.head_dim.is_multiple_of(T::VALUES) {
        return Err(anyhow!("attention: head_dim {} does not fit the KV type", sh.head_dim));
    }
    // Written, not left zeroed: untouched pages would all read one zero page.
    let width = sh.n_kv_heads * sh.head_dim;
    let vals: Vec<f32> = (0..width).map(|i| ((i * 7919 % 997) as f32 / 997.0 - 0.5) * 0.2).collect();
    for (k, v) in layers.iter_mut() {
        for (kr, vr) in k.chunks_exact_mut(stride).zip(v.chunks_exact_mut(stride)) {
            T::store(&vals, kr);
            T::store(&vals, vr);
        }
    }
    let layers = &*layers;
    let q: Vec<f32> = (0..rows.max(1) * sh.n_heads * sh.head_dim).map(|i| (i % 17) as f32 * 0.01).collect();
    let mut out = vec![0f32; q.len()];
    let mut next = 0;
    let mut time = |start_pos: usize| {
        let s = AttnShape { n_new: rows, start_pos, ..*sh };
        let n = rows * sh.n_heads * sh.head_dim;
        median_time(Duration::from_millis(100), 3, || {
            let (k, v) = &layers[next % layers.len()];
            next += 1;
            kernels::attention::attention(pool, &q[..n], k, v, &s, &mut out[..n])
        })
    };
    Ok(if deep > 0 { ((time(deep) - time(0)) / (rows * deep) as f64).max(0.0) } else { 0.0 })
}
