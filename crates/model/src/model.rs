//! A loaded model shard and its forward pass over a batch of sequences.

use crate::arch::ArchSpec;
use crate::decoder::{DecoderLayer, Gqa};
use crate::kv_cache::{KvPool, KvType, SeqKv};
use crate::layer_ops::run_decoder;
use crate::linear::Linear;
use crate::mla::MlaMode;
use crate::registry::Arch;
use crate::rope::Rope;
use crate::shard::{AllReduce, ShardSpec};
use crate::workspace::{grow, Workspace};
use crate::{slice, ModelError};
use formats::{ModelConfig, ModelFiles, WeightTensor};
use kernels::{DType, ThreadPool};

// The per-sequence memory a shard makes: KV caches (rings for windowed
// layers), linear-attention state slots, and what they cost.
#[path = "model_memory.rs"]
mod memory;
// The head: final norm and lm_head for the rows asked for, and on
// tensor-parallel ranks the vocab-parallel argmax and gather.
#[path = "model_vocab.rs"]
mod vocab;
// Exact tensor parallelism's column gathers.
#[path = "model_tp.rs"]
mod tp;
// The CPU's implementation of the layer ops.
#[path = "cpu_layers.rs"]
mod cpu_layers;
// The layers on a GPU (`--device gpu`).
#[path = "gpu_shard.rs"]
pub mod gpu_shard;
// A mixture-of-experts block on a GPU.
#[path = "gpu_moe.rs"]
mod gpu_moe;
// Latent attention on a GPU.
#[path = "gpu_mla.rs"]
mod gpu_mla;
// Gated DeltaNet and its state slots on a GPU.
#[path = "gpu_deltanet.rs"]
mod gpu_deltanet;
pub use memory::{ring_positions, window_blocks_per_seq};

#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Re-encode float weights at load (`--quantize q8_0|q4_0`).
    pub quantize: Option<DType>,
    /// Keep quantized weights in the file's row layout instead of repacking
    /// them for the decode kernels (`SHARDLM_PACK=0`; for A/B runs and tests).
    pub keep_file_layout: bool,
    /// KV cache element type; `None` picks f32 for float weights, f16 otherwise.
    pub kv_type: Option<KvType>,
    /// Told how loading goes (a bar in the CLI; repacking a model of hundreds
    /// of GB takes minutes).
    pub progress: LoadProgress,
    /// Latent attention: absorbed projections (default) or the expanded
    /// reference (`SHARDLM_MLA=expanded`).
    pub mla: MlaMode,
    /// Where the layers compute (`--device`); a GPU keeps the file layout.
    pub device: gpu_shard::Device,
}

/// A callback told `(steps done, steps in all)` while a shard loads; a step is
/// one layer, and one more for the embedding and head.
#[derive(Clone, Default)]
pub struct LoadProgress(Option<std::sync::Arc<dyn Fn(usize, usize) + Send + Sync>>);

impl LoadProgress {
    pub fn new(f: impl Fn(usize, usize) + Send + Sync + 'static) -> LoadProgress {
        LoadProgress(Some(std::sync::Arc::new(f)))
    }

    fn report(&self, done: usize, total: usize) {
        if let Some(f) = &self.0 {
            f(done, total);
        }
    }
}

impl std::fmt::Debug for LoadProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "LoadProgress(callback)" } else { "LoadProgress(none)" })
    }
}

impl LoadOptions {
    /// Options from the environment: `SHARDLM_PACK=0` sets `keep_file_layout`,
    /// `SHARDLM_KV_TYPE=f16|f32|q8_0|q4_0` the cache type (anything else: automatic).
    pub fn from_env(quantize: Option<DType>) -> LoadOptions {
        LoadOptions {
            quantize,
            keep_file_layout: std::env::var("SHARDLM_PACK").is_ok_and(|v| v == "0"),
            kv_type: std::env::var("SHARDLM_KV_TYPE").ok().and_then(|v| KvType::parse(&v)),
            progress: LoadProgress::default(),
            mla: match std::env::var("SHARDLM_MLA") {
                Ok(v) if v == "expanded" => MlaMode::Expanded,
                _ => MlaMode::Absorbed,
            },
            device: gpu_shard::Device::Cpu,
        }
    }
}

/// Which logits a sequence wants from a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitsMode {
    /// None (a prefill chunk that is not the last).
    None,
    /// The last token's logits only (generation).
    Last,
    /// Every token's logits (`--dump-logits`, teacher forcing).
    All,
    /// Only the last token's argmax matters (greedy decoding). The logits row is
    /// still vocab-sized, but under tensor parallelism only the winner is filled
    /// (others are −∞): ranks exchange (max, index) pairs instead of all logits.
    Argmax,
    /// Every token's logits, for checking a speculative draft: each row's
    /// attention runs as a one-token decode step at its position would, so
    /// row `i` equals, bit for bit, the logits of decoding the tokens one at a
    /// time (a multi-row prefill sums in another order). The matmuls are
    /// batch-invariant below their GEMM threshold (32 rows in the step).
    Verify,
}

/// One sequence's share of a forward step.
pub struct SeqStep<'a> {
    /// New tokens; they take positions `cache.start() ..`.
    pub tokens: &'a [u32],
    pub cache: SeqKv<'a>,
    pub mode: LogitsMode,
    /// The tokens are prompt tokens (a prefill chunk, however short). Their
    /// attention then never takes the one-row decode path, so a prompt row
    /// computes the same bits wherever the prompt was cut: a prefix-cache
    /// resume or a chunk boundary that leaves one row. `false`: one token is
    /// a decode step; several are a prefill chunk either way.
    pub prompt: bool,
    /// Filled with `rows × vocab` logits (rows = 0, 1 or `tokens.len()`).
    pub logits: &'a mut Vec<f32>,
}

/// How a sequence's new rows attend (see [`SeqStep::prompt`], [`LogitsMode::Verify`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AttendRows {
    /// A prefill chunk, even of one row.
    Prompt,
    /// One decode step (or, without `prompt`, a chunk of several).
    Step,
    /// Each row alone, as a decode step at its position.
    Verify,
}

impl SeqStep<'_> {
    pub(crate) fn attend_rows(&self) -> AttendRows {
        match (self.mode, self.prompt) {
            (LogitsMode::Verify, _) => AttendRows::Verify,
            (_, true) => AttendRows::Prompt,
            _ => AttendRows::Step,
        }
    }
}

#[derive(Debug)]
pub struct Model {
    pub config: ModelConfig,
    pub arch: Arch,
    pub spec: ArchSpec,
    pub shard: ShardSpec,
    embed: Option<WeightTensor>,
    layers: Vec<DecoderLayer>,
    final_norm: Option<Vec<f32>>,
    lm_head: Option<Linear>,
    rope: Rope,
    /// The windowed layers' rope when it differs ([`ArchSpec::local_rope`]).
    rope_local: Option<Rope>,
    local: LocalDims,
    /// Element type of the caches [`Model::new_cache`] makes.
    pub kv_type: KvType,
    /// The layers and head on a GPU (`--device gpu`); `None` on the CPU.
    pub gpu: Option<gpu_shard::GpuShard>,
}

/// The widths this shard computes (equal to the config's in a single process).
#[derive(Debug, Clone)]
struct LocalDims {
    n_heads: usize,
    n_kv_heads: usize,
    ffn: usize,
    vocab: std::ops::Range<usize>,
    /// Every tensor-parallel rank's vocab rows (empty without tensor parallelism).
    vocab_all: Vec<std::ops::Range<usize>>,
}

impl Model {
    /// Builds the shard `shard` of the model in `files`. Only the weights the shard
    /// owns are referenced, so only their pages are ever read.
    pub fn load(files: &ModelFiles, shard: &ShardSpec, opts: &LoadOptions) -> Result<Model, ModelError> {
        if let gpu_shard::Device::Gpu(index) = opts.device {
            // The device reads the file's layout; the CPU copy is not repacked.
            let cpu = LoadOptions { device: gpu_shard::Device::Cpu, keep_file_layout: true, ..opts.clone() };
            let gpu = shardlm_gpu::Gpu::open(index)?;
            let mut m = Model::load(files, shard, &cpu)?;
            m.gpu = Some(gpu_shard::GpuShard::upload(&m, gpu)?);
            return Ok(m);
        }
        // Repacked weights go to fresh huge-page chunks (never an earlier load's).
        kernels::hugepages::start_load();
        let mut cfg = files.config.clone();
        let arch = Arch::from_name(&cfg.arch).ok_or_else(|| ModelError::UnknownArchitecture {
            path: files.path.clone(),
            arch: cfg.arch.clone(),
            supported: Arch::supported().join(", "),
        })?;
        let spec = arch.spec(&cfg)?;
        if let Some(m) = &spec.mla {
            // Latent attention rotates only its qk_rope_head_dim dims.
            cfg.rope_dim = m.rope;
        }
        let store = &files.tensors;
        let (h, vocab) = (cfg.hidden_size, cfg.vocab_size);
        let embed_name = "model.embed_tokens.weight";
        let need_embed = shard.has_embed || (shard.has_head && cfg.tie_word_embeddings);
        let local = match &shard.tp {
            Some(tp) => LocalDims {
                n_heads: tp.q_heads.len(),
                n_kv_heads: tp.kv_heads.len(),
                ffn: tp.ffn.len(),
                vocab: tp.vocab.clone(),
                vocab_all: tp.vocab_all.clone(),
            },
            None => LocalDims {
                n_heads: cfg.n_heads,
                n_kv_heads: cfg.n_kv_heads,
                ffn: cfg.intermediate_size,
                vocab: 0..vocab,
                vocab_all: vec![],
            },
        };
        // Vocab-parallel: this rank's rows of the embedding (and of a tied lm_head).
        let mut embed_full = if need_embed {
            Some(slice::rows(store.get_shaped(embed_name, &[vocab, h])?, local.vocab.clone()))
        } else {
            None
        };
        let mut layers = Vec::with_capacity(shard.layers.len());
        let steps = shard.layers.len() + 1;
        opts.progress.report(0, steps);
        for l in shard.layers.clone() {
            layers.push(DecoderLayer::load(store, &cfg, &spec, l, shard.tp.as_ref(), opts)?);
            store.release_file_pages();
            opts.progress.report(layers.len(), steps);
        }
        let (final_norm, lm_head) = if shard.has_head {
            let norm = crate::decoder::norm_weight(store, "model.norm.weight", h, &spec)?;
            let norm = crate::linear_attn::center_norm(spec.linear_attn.as_ref(), norm);
            let w = if cfg.tie_word_embeddings && !store.contains("lm_head.weight") {
                // Tied: the head's (packed) copy also serves the embedding lookups,
                // so the table is held once.
                let w = crate::decoder::quantized(embed_full.take().expect("loaded above"), opts)?;
                embed_full = Some(w.clone());
                w
            } else {
                let w = slice::rows(store.get_shaped("lm_head.weight", &[vocab, h])?, local.vocab.clone());
                crate::decoder::quantized(w, opts)?
            };
            (Some(norm), Some(Linear::new(w, None)))
        } else {
            (None, None)
        };
        store.release_file_pages();
        let embed = if shard.has_embed { embed_full } else { None };
        let style = spec.rope_style;
        let mut rope = Rope::new(cfg.rope_theta, cfg.rope_dim, &cfg.rope_scaling, cfg.max_position_embeddings, style);
        // llama.cpp stores llama3-style scaling as per-frequency divisors.
        if let Ok(f) = store.get("rope_freqs.weight") {
            rope.apply_freq_divisors(&f.to_f32()).map_err(ModelError::Config)?;
        }
        let rope_local = spec
            .local_rope
            .as_ref()
            .map(|l| Rope::new(l.theta, cfg.rope_dim, &l.scaling, cfg.max_position_embeddings, style));
        // Float checkpoints compute in f32 end to end: keep their cache f32 too,
        // unless told otherwise; quantized ones use f16 as llama.cpp does.
        let float_weights = opts.quantize.is_none() && layers.iter().all(|l| !l.attn.is_quantized());
        let kv_type = opts.kv_type.unwrap_or(if float_weights { KvType::F32 } else { KvType::F16 });
        match &spec.mla {
            Some(m) => m.check_kv_type(kv_type)?,
            None => kv_type.check_head_dim(cfg.head_dim)?,
        }
        opts.progress.report(steps, steps);
        Ok(Model {
            config: cfg,
            arch,
            spec,
            shard: shard.clone(),
            embed,
            layers,
            final_norm,
            lm_head,
            rope,
            rope_local,
            local,
            kv_type,
            gpu: None,
        })
    }

    /// Runs one step for a batch of sequences: embed (first stage), the owned
    /// layers, and the head (last stage).
    pub fn forward(
        &self,
        pool: &ThreadPool,
        ws: &mut Workspace,
        seqs: &mut [SeqStep<'_>],
        comm: &dyn AllReduce,
    ) -> Result<(), ModelError> {
        self.embed_tokens(ws, seqs, comm)?;
        self.run_layers(pool, ws, seqs, None, comm)?;
        self.head(pool, ws, seqs, comm)
    }

    /// [`Model::forward`] for sequences whose KV lives in blocks of `kv`
    /// (`SeqKv::Paged`); sequences with their own cache may be mixed in.
    pub fn forward_paged(
        &self,
        pool: &ThreadPool,
        ws: &mut Workspace,
        kv: &mut KvPool,
        seqs: &mut [SeqStep<'_>],
        comm: &dyn AllReduce,
    ) -> Result<(), ModelError> {
        self.embed_tokens(ws, seqs, comm)?;
        self.run_layers(pool, ws, seqs, Some(kv), comm)?;
        self.head(pool, ws, seqs, comm)
    }

    /// Writes the embeddings of every sequence's tokens, concatenated, into `ws.x`.
    /// Vocab-parallel: each rank fills the rows it owns, an all-reduce completes them.
    pub fn embed_tokens(
        &self,
        ws: &mut Workspace,
        seqs: &[SeqStep<'_>],
        comm: &dyn AllReduce,
    ) -> Result<(), ModelError> {
        let Some(embed) = &self.embed else { return Ok(()) };
        let h = self.config.hidden_size;
        let t_total: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        grow(&mut ws.x, t_total * h);
        let row_bytes = embed.dtype.bytes_for(h).expect("hidden is a block multiple");
        let table = embed.mat();
        let mut packed_row = std::mem::take(&mut ws.embed_row);
        let owned = &self.local.vocab;
        for (t, &id) in seqs.iter().flat_map(|s| s.tokens.iter()).enumerate() {
            if id as usize >= self.config.vocab_size {
                return Err(ModelError::TokenOutOfRange { id, vocab: self.config.vocab_size });
            }
            let out = &mut ws.x[t * h..(t + 1) * h];
            if owned.contains(&(id as usize)) {
                let row = table.row(id as usize - owned.start, &mut packed_row);
                debug_assert_eq!(row.len(), row_bytes);
                kernels::quant::dequantize_row(embed.dtype, row, out);
                let scale = embed.out_scale * self.spec.embed_scale;
                if scale != 1.0 {
                    out.iter_mut().for_each(|v| *v *= scale);
                }
            } else {
                out.fill(0.0);
            }
        }
        ws.embed_row = packed_row;
        if self.shard.tp.is_some() {
            comm.all_reduce_sum(&mut ws.x[..t_total * h])?;
        }
        Ok(())
    }

    /// Runs the owned layers over `ws.x` and advances every sequence's cache:
    /// the step's checks and rope tables here, then the one layer loop
    /// (`layer_ops::run_decoder`) with the CPU's ops or the GPU's.
    pub fn run_layers(
        &self,
        pool: &ThreadPool,
        ws: &mut Workspace,
        seqs: &mut [SeqStep<'_>],
        mut paged: Option<&mut KvPool>,
        comm: &dyn AllReduce,
    ) -> Result<(), ModelError> {
        let cfg = &self.config;
        let t_total: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        for s in seqs.iter() {
            let needed = s.cache.start() + s.tokens.len();
            let capacity = match (&s.cache, paged.as_deref()) {
                (SeqKv::Own(c), _) => c.capacity,
                (SeqKv::Paged { table, .. }, Some(p)) => {
                    if let Some(&b) = table.iter().find(|&&b| b as usize >= p.n_blocks) {
                        return Err(ModelError::Unsupported(format!(
                            "KV block {b} is outside the pool of {} blocks",
                            p.n_blocks
                        )));
                    }
                    table.len() * p.block
                }
                (SeqKv::Paged { .. }, None) => {
                    return Err(ModelError::Unsupported("a paged sequence needs a KV pool".into()))
                }
            };
            if needed > capacity {
                return Err(ModelError::ContextOverflow { needed, capacity });
            }
            if let (SeqKv::Paged { window, start, .. }, Some(p)) = (&s.cache, paged.as_deref()) {
                if p.n_window_blocks > 0 {
                    self.check_window_blocks(p, window, *start, needed)?;
                }
            }
            if let SeqKv::Own(c) = &s.cache {
                let window = |l: usize| self.layers.get(l).and_then(|l| self.layer_window(l)).unwrap_or(0);
                if !c.ring_holds(window) {
                    return Err(ModelError::Unsupported(format!(
                        "the cache was cut back to {} positions, past what its sliding-window rings still hold \
                         (written up to {}); start the sequence again",
                        c.len, c.written
                    )));
                }
            }
        }
        let (h, hd, ffn) = (cfg.hidden_size, cfg.head_dim, self.local.ffn);
        let (hq, hkv) = (self.local.n_heads * hd, self.local.n_kv_heads * hd);
        let half = cfg.rope_dim / 2;
        for (buf, w) in [(&mut ws.x, h), (&mut ws.xn, h), (&mut ws.o, h), (&mut ws.q, hq), (&mut ws.attn, hq)] {
            grow(buf, t_total * w);
        }
        for (buf, w) in [(&mut ws.k, hkv), (&mut ws.v, hkv), (&mut ws.gate, ffn), (&mut ws.up, ffn)] {
            grow(buf, t_total * w);
        }
        grow(&mut ws.cos, t_total * half);
        grow(&mut ws.sin, t_total * half);
        let mut t = 0;
        for s in seqs.iter() {
            for i in 0..s.tokens.len() {
                let (c, sn) = (&mut ws.cos[t * half..(t + 1) * half], &mut ws.sin[t * half..(t + 1) * half]);
                self.rope.cos_sin(s.cache.start() + i, c, sn);
                t += 1;
            }
        }
        if let Some(rope) = &self.rope_local {
            grow(&mut ws.cos_local, t_total * half);
            grow(&mut ws.sin_local, t_total * half);
            let mut t = 0;
            for s in seqs.iter() {
                for i in 0..s.tokens.len() {
                    let at = t * half..(t + 1) * half;
                    rope.cos_sin(s.cache.start() + i, &mut ws.cos_local[at.clone()], &mut ws.sin_local[at]);
                    t += 1;
                }
            }
        }
        if let Some(g) = &self.gpu {
            return g.run_layers(self, ws, seqs, paged, comm);
        }
        if self.spec.linear_attn.is_some() {
            crate::linear_attn::begin_states(seqs, paged.as_deref_mut())?;
        }
        let mut cpu = cpu_layers::CpuLayers { m: self, pool, ws, seqs: &mut *seqs, paged, comm, n: t_total };
        run_decoder(&self.layers, &mut cpu)?;
        for s in seqs.iter_mut() {
            if let SeqKv::Own(c) = &mut s.cache {
                c.len += s.tokens.len();
                c.written = c.written.max(c.len);
            }
        }
        Ok(())
    }

    /// The whole-projection q/k RMSNorm ([`ArchSpec::qk_norm_whole`]) of the
    /// `n` rows in `ws.q` / `ws.k`: each row's mean square spans every head
    /// of the model, so under tensor parallelism each rank sums the squares of
    /// its heads and an all-reduce completes them. A KV head replicated on `c`
    /// ranks (more ranks than KV heads) adds `1/c` of its sum on each, so the
    /// total counts it once: per-head sums and holder counts travel together.
    pub(crate) fn whole_qk_norm(
        &self,
        ws: &mut Workspace,
        gqa: &Gqa,
        n: usize,
        comm: &dyn AllReduce,
    ) -> Result<(), ModelError> {
        let cfg = &self.config;
        let (hd, eps) = (cfg.head_dim, cfg.rms_norm_eps);
        let (nq, nkv) = (cfg.n_heads, cfg.n_kv_heads);
        let (qh, kvh) = match &self.shard.tp {
            Some(tp) => (tp.q_heads.clone(), tp.kv_heads.clone()),
            None => (0..nq, 0..nkv),
        };
        // Per row: nq + nkv per-head sums of squares, then nq + nkv holder counts.
        let width = 2 * (nq + nkv);
        let mut sums = vec![0f32; n * width];
        for t in 0..n {
            let row = &mut sums[t * width..(t + 1) * width];
            for (i, head) in qh.clone().enumerate() {
                let x = &ws.q[(t * qh.len() + i) * hd..][..hd];
                row[head] = x.iter().map(|v| v * v).sum();
                row[nq + nkv + head] = 1.0;
            }
            for (i, head) in kvh.clone().enumerate() {
                let x = &ws.k[(t * kvh.len() + i) * hd..][..hd];
                row[nq + head] = x.iter().map(|v| v * v).sum();
                row[2 * nq + nkv + head] = 1.0;
            }
        }
        comm.all_reduce_sum(&mut sums)?;
        let (qn, kn) = (gqa.q_norm.as_deref().expect("checked"), gqa.k_norm.as_deref().expect("checked"));
        for t in 0..n {
            let row = &sums[t * width..(t + 1) * width];
            let total = |r: std::ops::Range<usize>, c: usize| -> f32 {
                r.map(|i| if row[c + i] > 0.0 { row[i] / row[c + i] } else { 0.0 }).sum()
            };
            let q_inv = 1.0 / (total(0..nq, nq + nkv) / (nq * hd) as f32 + eps).sqrt();
            let k_inv = 1.0 / (total(nq..nq + nkv, nq + nkv) / (nkv * hd) as f32 + eps).sqrt();
            let (lq, lk) = (qh.len() * hd, kvh.len() * hd);
            for (v, w) in ws.q[t * lq..(t + 1) * lq].iter_mut().zip(qn) {
                *v *= q_inv * w;
            }
            for (v, w) in ws.k[t * lk..(t + 1) * lk].iter_mut().zip(kn) {
                *v *= k_inv * w;
            }
        }
        Ok(())
    }
}
