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
/// Decode steps timed (the median is kept).
const DECODE_STEPS: usize = 16;

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

/// Measures the shard rank 0 of a `tp`-wide tensor group (the busiest: it
/// holds the extra GQA group when the heads do not divide; `tp = 1`: the
/// whole width) at `threads` threads, for the workload `w`. `expert`: MoE
/// blocks hold whole experts (`--strategy expert`). Err if the model cannot
/// be loaded or split that way here.
pub fn measure_shard(
    path: &Path,
    tp: usize,
    expert: bool,
    threads: usize,
    kv: KvType,
    w: &Workload,
) -> Result<Measured> {
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
    let mut cache = m.new_cache(rows + DECODE_STEPS + 2);
    let mut logits = Vec::new();
    let vocab = cfg.vocab_size.max(2) as u32;
    let prompt: Vec<u32> = (0..rows as u32).map(|i| (i * 7919 + 13) % vocab).collect();
    // (seconds of embedding + layers, seconds of the head) of one step.
    let mut step = |tokens: &[u32], cache: &mut model::KvCache, mode: LogitsMode| -> Result<(f64, f64)> {
        let mut seqs = [SeqStep { tokens, cache: SeqKv::Own(cache), mode, logits: &mut logits }];
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
    let (chunk_layers_s, head_prefill_s) = step(&prompt, &mut cache, LogitsMode::Argmax)?;
    let mut dec = Vec::new();
    let mut head = Vec::new();
    for i in 0..DECODE_STEPS as u32 {
        let (l, h) = step(&[(i * 31 + 7) % vocab], &mut cache, LogitsMode::Argmax)?;
        dec.push(l);
        head.push(h);
    }
    let per_layer = |s: f64| s / n_load as f64;
    let layer_decode_at_rows = per_layer(median(dec));
    let head_decode_s = median(head);
    // The attention kernel at this shard's heads: seconds per key of a decode
    // step, and per (row, key) pair of a prompt chunk.
    let sh = AttnShape {
        n_new: 1,
        start_pos: 0,
        n_heads: q_heads,
        n_kv_heads: kv_heads,
        head_dim: cfg.head_dim,
        window: None,
        sinks: None,
        scale: 1.0 / (cfg.head_dim as f32).sqrt(),
    };
    let depth_meas = rows + DECODE_STEPS / 2;
    let (per_key, per_pair) = attention_slopes(&pool, kv, &sh, depth_meas, rows, w.context)?;
    let layer_decode_s = (layer_decode_at_rows + per_key * (w.context as f64 - depth_meas as f64)).max(0.0);
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
    })
}

/// (seconds per cached key of one decode step, seconds per (row, key) pair of
/// a prompt chunk) of one layer's attention, from the real kernel: decode at
/// `lo` and at the context, a chunk of `rows` at start 0 and deep in the
/// context (both capped at [`MAX_PROBE_DEPTH`]).
fn attention_slopes(
    pool: &ThreadPool,
    kv: KvType,
    sh: &AttnShape,
    lo: usize,
    rows: usize,
    context: usize,
) -> Result<(f64, f64)> {
    let hi = context.clamp(lo + 256, MAX_PROBE_DEPTH.max(lo + 256));
    let deep = context.saturating_sub(rows).min(MAX_PROBE_DEPTH).max(rows);
    let width = sh.n_kv_heads * sh.head_dim;
    let capacity = hi.max(deep + rows) + 1;
    let mut cache = model::KvCache::with_type(1, width, capacity, kv);
    match &mut cache.pool.layers {
        KvLayers::F16(l) => time_attention(pool, &mut l[0], sh, lo, hi, rows, deep),
        KvLayers::F32(l) => time_attention(pool, &mut l[0], sh, lo, hi, rows, deep),
        KvLayers::Q8_0(l) => time_attention(pool, &mut l[0], sh, lo, hi, rows, deep),
        KvLayers::Q4_0(l) => time_attention(pool, &mut l[0], sh, lo, hi, rows, deep),
    }
}

fn time_attention<T: KvElem>(
    pool: &ThreadPool,
    (k, v): &mut (Vec<T>, Vec<T>),
    sh: &AttnShape,
    lo: usize,
    hi: usize,
    rows: usize,
    deep: usize,
) -> Result<(f64, f64)> {
    let stride = sh.stride::<T>();
    if stride == 0 || !sh.head_dim.is_multiple_of(T::VALUES) {
        return Err(anyhow!("attention: head_dim {} does not fit the KV type", sh.head_dim));
    }
    // Written, not left zeroed: untouched pages would all read one zero page.
    let width = sh.n_kv_heads * sh.head_dim;
    let vals: Vec<f32> = (0..width).map(|i| ((i * 7919 % 997) as f32 / 997.0 - 0.5) * 0.2).collect();
    for (kr, vr) in k.chunks_exact_mut(stride).zip(v.chunks_exact_mut(stride)) {
        T::store(&vals, kr);
        T::store(&vals, vr);
    }
    let (k, v) = (&k[..], &v[..]);
    let q: Vec<f32> = (0..rows.max(1) * sh.n_heads * sh.head_dim).map(|i| (i % 17) as f32 * 0.01).collect();
    let mut out = vec![0f32; q.len()];
    let mut time = |n_new: usize, start_pos: usize, min: Duration, calls: usize| {
        let s = AttnShape { n_new, start_pos, ..*sh };
        let n = n_new * sh.n_heads * sh.head_dim;
        median_time(min, calls, || kernels::attention::attention(pool, &q[..n], k, v, &s, &mut out[..n]))
    };
    let short = Duration::from_millis(60);
    let per_key = ((time(1, hi, short, 20) - time(1, lo, short, 20)) / (hi - lo) as f64).max(0.0);
    let per_pair = if deep > 0 {
        let chunk = Duration::from_millis(100);
        ((time(rows, deep, chunk, 3) - time(rows, 0, chunk, 3)) / (rows * deep) as f64).max(0.0)
    } else {
        0.0
    };
    Ok((per_key, per_pair))
}
