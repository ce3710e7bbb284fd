//! Multi-head latent attention (MLA: DeepSeek V2/V3, transformers'
//! `DeepseekV3Attention`), with the KV cache holding only the latent.
//!
//! ```text
//! x ─ q_a ─ RMSNorm ─ q_b ─┬ q_nope [heads × nope] ─ ·W_UK ─┐ q_lat [heads × r]
//!   (or one q_proj)        └ q_rope [heads × rope] ─ rope ──┤ ‖ q_rope
//! x ─ kv_a ─┬ c [r] ─ RMSNorm ──────────┐                   │
//!           └ k_rope [rope] ─ rope ─────┴─ cache row c ‖ k_rope
//!                                          attention: one KV head of width r + rope
//!                                          ─ out_lat [heads × r] ─ ·W_UVᵀ ─ [heads × v] ─ o ─ all-reduce
//! ```
//!
//! Widths: `r` = kv_lora_rank, `nope`/`rope` = qk_{nope,rope}_head_dim, `v` =
//! v_head_dim; `kv_b_proj` is `[heads·(nope + v), r]`, head `h`'s rows being
//! `W_UK_h` (`nope × r`) then `W_UV_h` (`v × r`).
//!
//! **Cache.** One row of `r + rope` values per position and layer (the
//! normalized latent, then the roped shared key) in a keys-only
//! [`crate::KvPool`]/[`crate::KvCache`]; no V rows, never per-head K or V.
//! Both the contiguous cache and the serving engine's paged pool hold it.
//!
//! **Absorption.** `q_nope·(W_UK_h c) = (W_UK_hᵀ q_nope)·c` and
//! `Σ a·(W_UV_h c) = W_UV_h (Σ a·c)`: each head's query is folded into latent
//! space (`q_lat`), attention runs as multi-query attention with the cache row
//! as the single key *and* value (the shared attention kernel, any cache
//! element type; the value's rope tail is computed and dropped), and each
//! head's latent output is lifted by `W_UV_h`. Past positions are never
//! expanded. This is the default for prefill and decode
//! ([`MlaMode::Absorbed`]); [`MlaMode::Expanded`] rebuilds per-head K and V
//! from the cache (transformers' order of operations), the reference the
//! absorbed path is tested against.
//!
//! `W_UK` and `W_UVᵀ` are held per local head in f32 (`W_UV` transposed so
//! both folds are row-axpys): `heads · r · (nope + v)` values, widened from
//! the file's type at load.
//! They come from HF's `kv_b_proj`, or from llama.cpp's split form in a
//! `deepseek2` GGUF: `attn_k_b` (`k_b_proj`, `[heads, r, nope]`: each
//! `W_UK_h` transposed) and `attn_v_b` (`v_b_proj`, `[heads, v, r]`).
//!
//! **Rope.** `rope_interleave` (DeepSeek's default): transformers rotates the
//! pairs `(x₂ᵢ, x₂ᵢ₊₁)` and writes them de-interleaved (evens, then odds). q
//! and k are permuted alike and only ever meet in a dot product, so rotating
//! the pairs in place ([`RopeStyle::Interleaved`]) gives the same scores.
//!
//! **Tensor parallelism.** Heads are split (q_b rows, W_UK/W_UV heads, o_proj
//! columns); q_a, kv_a and their norms are replicated, so every rank computes
//! and caches the whole latent: per-rank KV bytes per token and layer are
//! `(r + rope) · elem` whatever the rank count (the latent is shared by all
//! heads, like an MQA head). One all-reduce after o_proj, as for GQA.

use crate::decoder::LayerLoader;
use crate::kv_cache::{KvLayers, KvPool, KvType};
use crate::linear::Linear;
use crate::model::{AttendRows, SeqStep};
use crate::moe::{config_usize, text_config};
use crate::workspace::grow;
use crate::{slice, ModelError, SeqKv};
use formats::{ModelConfig, RopeScaling};
use kernels::attention::{attention_paged, AttnShape, KvElem, KvView};
use kernels::matmul::MatmulScratch;
use kernels::ops::{self, RopeStyle, SendPtr};
use kernels::ThreadPool;
use serde_json::Value;
use std::ops::Range;

/// The MLA widths of a config.
#[derive(Debug, Clone, PartialEq)]
pub struct MlaSpec {
    /// `q_lora_rank`; `None` (null in the config): one `q_proj`.
    pub q_lora: Option<usize>,
    /// `kv_lora_rank`: the cached latent's width.
    pub kv_lora: usize,
    pub nope: usize,
    pub rope: usize,
    pub v_dim: usize,
    /// Softmax scale: `qk_head_dim^-½`, times yarn's `mscale(factor, mscale_all_dim)²`.
    pub scale: f32,
}

impl MlaSpec {
    pub fn from_config(cfg: &ModelConfig) -> Result<MlaSpec, ModelError> {
        let bad = |m: String| ModelError::Config(format!("{}: {m}", cfg.arch));
        let q_lora = match text_config(cfg).get("q_lora_rank") {
            None | Some(Value::Null) => None,
            Some(v) => Some(
                v.as_u64()
                    .filter(|&v| v > 0)
                    .ok_or_else(|| bad("'q_lora_rank' must be a positive integer or null".into()))?
                    as usize,
            ),
        };
        let int = |k: &str| config_usize(cfg, &[k]);
        let (kv_lora, nope, rope, v_dim) =
            (int("kv_lora_rank")?, int("qk_nope_head_dim")?, int("qk_rope_head_dim")?, int("v_head_dim")?);
        if kv_lora == 0 || v_dim == 0 || rope == 0 || !rope.is_multiple_of(2) {
            return Err(bad(format!(
                "kv_lora_rank {kv_lora}, v_head_dim {v_dim} must be positive and qk_rope_head_dim {rope} positive and even"
            )));
        }
        if cfg.attention_bias {
            return Err(ModelError::Unsupported(format!("{}: attention_bias in latent attention", cfg.arch)));
        }
        let mut scale = 1.0 / ((nope + rope) as f32).sqrt();
        if let RopeScaling::Yarn { factor, mscale_all_dim: Some(m), .. } = cfg.rope_scaling {
            if m != 0.0 && factor > 1.0 {
                let ms = 0.1 * m * factor.ln() + 1.0;
                scale *= ms * ms;
            }
        }
        Ok(MlaSpec { q_lora, kv_lora, nope, rope, v_dim, scale })
    }

    /// Values of one cache row: the latent, then the rope key.
    pub fn cache_width(&self) -> usize {
        self.kv_lora + self.rope
    }

    fn qk(&self) -> usize {
        self.nope + self.rope
    }

    /// Whether the cache type can hold rows of [`MlaSpec::cache_width`]
    /// values (the quantized types need whole blocks of 32).
    pub fn check_kv_type(&self, ty: KvType) -> Result<(), ModelError> {
        let w = self.cache_width();
        if w.is_multiple_of(ty.block_values()) {
            return Ok(());
        }
        Err(ModelError::Unsupported(format!(
            "a {} KV cache needs the latent row (kv_lora_rank + qk_rope_head_dim = {w}) to be a multiple of {}; use --kv-type f16",
            ty.name(),
            ty.block_values()
        )))
    }
}

/// How attention meets the cached latents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MlaMode {
    /// Queries folded into latent space, outputs lifted after (module docs).
    #[default]
    Absorbed,
    /// Per-head K and V rebuilt from the cache for every step (the reference).
    Expanded,
}

/// One layer's latent attention (this rank's heads).
#[derive(Debug)]
pub struct Mla {
    pub spec: MlaSpec,
    /// Local heads.
    pub n_heads: usize,
    /// `q_a_proj` (`[q_lora, hidden]`, replicated) and `q_a_layernorm`.
    pub(crate) q_a: Option<(Linear, Vec<f32>)>,
    /// `q_b_proj` (`[heads·qk, q_lora]`) or `q_proj` (`[heads·qk, hidden]`), local heads' rows.
    pub(crate) q_b: Linear,
    /// `kv_a_proj_with_mqa`, `[r + rope, hidden]`, replicated.
    pub(crate) kv_a: Linear,
    pub(crate) kv_a_norm: Vec<f32>,
    /// `W_UK` of each local head: `heads × nope × r`.
    pub(crate) w_uk: Vec<f32>,
    /// `W_UVᵀ` of each local head: `heads × r × v`.
    pub(crate) w_uv_t: Vec<f32>,
    /// `o_proj`, `[hidden, heads·v]`, local heads' columns.
    pub o: Linear,
    pub(crate) eps: f32,
    pub mode: MlaMode,
}

/// Buffers of one MLA forward, reused across steps.
#[derive(Default)]
pub struct MlaScratch {
    qa: Vec<f32>,
    /// `T × heads × qk`.
    q: Vec<f32>,
    /// `T × (r + rope)`: the new cache rows.
    kv: Vec<f32>,
    /// `T × heads × (r + rope)`: absorbed queries, then latent outputs.
    q_lat: Vec<f32>,
    out_lat: Vec<f32>,
    /// `T × heads × v`: o_proj's input.
    attn: Vec<f32>,
    /// Expanded mode: cache rows widened, per-head K and V, scores.
    rows: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    p: Vec<f32>,
    matmul: MatmulScratch,
}

/// Per-token rope tables of a step: `T × rope/2` each.
pub struct RopeRows<'a> {
    pub cos: &'a [f32],
    pub sin: &'a [f32],
    pub style: RopeStyle,
}

impl Mla {
    /// Loads the latent attention of the layer `ld` points at, keeping the
    /// heads `heads` of `n_heads_total`.
    pub(crate) fn load(
        ld: &LayerLoader<'_>,
        spec: &MlaSpec,
        n_heads_total: usize,
        heads: Range<usize>,
        eps: f32,
        mode: MlaMode,
    ) -> Result<Mla, ModelError> {
        let (r, v, qk, w) = (spec.kv_lora, spec.v_dim, spec.qk(), spec.cache_width());
        let q_rows = heads.start * qk..heads.end * qk;
        let (q_a, q_b) = match spec.q_lora {
            Some(ql) => {
                let a = ld.col_par("self_attn.q_a_proj", ql, &(0..ql), false)?;
                let norm = ld.vector("self_attn.q_a_layernorm.weight", ql)?;
                let b = ld.weight("self_attn.q_b_proj.weight", &[n_heads_total * qk, ql])?;
                (Some((a, norm)), ld.col_par_of(b, &q_rows, None)?)
            }
            None => (None, ld.col_par("self_attn.q_proj", n_heads_total * qk, &q_rows, false)?),
        };
        let kv_a = ld.col_par("self_attn.kv_a_proj_with_mqa", w, &(0..w), false)?;
        let kv_a_norm = ld.vector("self_attn.kv_a_layernorm.weight", r)?;
        // llama.cpp's split `attn_k_b`/`attn_v_b` when there is no joint `kv_b_proj`.
        let split = ld.contains("self_attn.k_b_proj.weight") && !ld.contains("self_attn.kv_b_proj.weight");
        let (w_uk, w_uv_t) = match split {
            true => split_up_projection(ld, spec, n_heads_total, &heads)?,
            false => joint_up_projection(ld, spec, n_heads_total, &heads)?,
        };
        let o = ld.row_par("self_attn.o_proj", n_heads_total * v, &(heads.start * v..heads.end * v))?;
        Ok(Mla { spec: spec.clone(), n_heads: heads.len(), q_a, q_b, kv_a, kv_a_norm, w_uk, w_uv_t, o, eps, mode })
    }

    fn linears(&self) -> impl Iterator<Item = &Linear> {
        self.q_a.iter().map(|(l, _)| l).chain([&self.q_b, &self.kv_a, &self.o])
    }

    /// Weight bytes one decoded token reads: the projections and the f32
    /// `W_UK`/`W_UVᵀ` (the absorbed path reads all of them every step).
    pub fn weight_bytes(&self) -> usize {
        self.linears().map(Linear::weight_bytes).sum::<usize>() + 4 * (self.w_uk.len() + self.w_uv_t.len())
    }

    /// FLOPs of the projections and folds over `m` tokens (attention itself not included).
    pub fn flops(&self, m: usize) -> usize {
        self.linears().map(|l| l.flops(m)).sum::<usize>() + 2 * m * (self.w_uk.len() + self.w_uv_t.len())
    }

    /// Whether the weights are stored quantized (picks the default cache type).
    pub fn is_quantized(&self) -> bool {
        self.q_b.weight.dtype.is_quantized()
    }

    /// The block's projections over the normalized rows `xn` (`n × hidden`,
    /// all sequences concatenated): each head's query (`s.q`, rope tail
    /// roped) and each row's latent (`s.kv`: normalized latent ‖ roped
    /// shared key), for [`Mla::attend_rows`].
    pub(crate) fn project_rows(
        &self,
        pool: &ThreadPool,
        xn: &[f32],
        n: usize,
        rope: &RopeRows<'_>,
        s: &mut MlaScratch,
    ) {
        let sp = &self.spec;
        let (nh, r, rd, nope, qk, w) = (self.n_heads, sp.kv_lora, sp.rope, sp.nope, sp.qk(), sp.cache_width());
        grow(&mut s.q, n * nh * qk);
        grow(&mut s.kv, n * w);
        match &self.q_a {
            Some((q_a, norm)) => {
                let ql = q_a.out_features();
                grow(&mut s.qa, n * ql);
                Linear::forward_many(pool, &[q_a, &self.kv_a], xn, n, &mut [&mut s.qa, &mut s.kv], &mut s.matmul);
                ops::rms_norm_inplace(&mut s.qa[..n * ql], norm, self.eps, ql);
                self.q_b.forward(pool, &s.qa, n, &mut s.q, &mut s.matmul);
            }
            None => {
                Linear::forward_many(pool, &[&self.q_b, &self.kv_a], xn, n, &mut [&mut s.q, &mut s.kv], &mut s.matmul)
            }
        }
        let half = rd / 2;
        for t in 0..n {
            let (c, sn) = (&rope.cos[t * half..(t + 1) * half], &rope.sin[t * half..(t + 1) * half]);
            let row = &mut s.kv[t * w..(t + 1) * w];
            ops::rms_norm_inplace(&mut row[..r], &self.kv_a_norm, self.eps, r);
            ops::rope(&mut row[r..], rd, c, sn, rope.style);
            for h in 0..nh {
                ops::rope(&mut s.q[(t * nh + h) * qk + nope..(t * nh + h + 1) * qk], rd, c, sn, rope.style);
            }
        }
    }

    /// Stores every new position's latent row (from [`Mla::project_rows`])
    /// in layer `li` of its sequence's cache and runs the attention of the
    /// queries against the cache into `s.attn` (`n × heads × v_dim`).
    pub(crate) fn attend_rows(
        &self,
        pool: &ThreadPool,
        n: usize,
        seqs: &mut [SeqStep<'_>],
        mut paged: Option<&mut KvPool>,
        li: usize,
        s: &mut MlaScratch,
    ) {
        let sp = &self.spec;
        let (nh, qk, w, vd) = (self.n_heads, sp.qk(), sp.cache_width(), sp.v_dim);
        grow(&mut s.attn, n * nh * vd);
        if self.mode == MlaMode::Absorbed {
            grow(&mut s.q_lat, n * nh * w);
            grow(&mut s.out_lat, n * nh * w);
            self.absorb_queries(pool, &s.q, n, &mut s.q_lat);
        }
        let mut row = 0;
        for seq in seqs.iter_mut() {
            let (len, start) = (seq.tokens.len(), seq.cache.start());
            let rows = seq.attend_rows();
            let (kv, table): (&mut KvPool, &[u32]) = match &mut seq.cache {
                SeqKv::Own(c) => (&mut c.pool, &[0]),
                SeqKv::Paged { table, .. } => (paged.as_deref_mut().expect("checked by run_layers"), table),
            };
            let block = kv.block;
            let new = &s.kv[row * w..(row + len) * w];
            macro_rules! attend {
                ($l:expr) => {{
                    let cache = &mut $l[li].0;
                    store_rows(cache, block, table, new, w, start);
                    match self.mode {
                        MlaMode::Absorbed => self.attend_absorbed(
                            pool,
                            cache,
                            block,
                            table,
                            &s.q_lat[row * nh * w..(row + len) * nh * w],
                            (start, rows),
                            &mut s.out_lat[row * nh * w..(row + len) * nh * w],
                        ),
                        MlaMode::Expanded => {
                            let q = &s.q[row * nh * qk..(row + len) * nh * qk];
                            let o = &mut s.attn[row * nh * vd..(row + len) * nh * vd];
                            let e = Expanded { rows: &mut s.rows, k: &mut s.k, v: &mut s.v, p: &mut s.p };
                            self.attend_expanded(cache, block, table, q, start, o, e)
                        }
                    }
                }};
            }
            match &mut kv.layers {
                KvLayers::F16(l) => attend!(l),
                KvLayers::F32(l) => attend!(l),
                KvLayers::Q8_0(l) => attend!(l),
                KvLayers::Q4_0(l) => attend!(l),
            }
            row += len;
        }
        if self.mode == MlaMode::Absorbed {
            self.lift_values(pool, &s.out_lat, n, &mut s.attn);
        }
    }

    /// The output projection of `s.attn` into `out` (`n × hidden`, this
    /// rank's partial sum: the caller all-reduces).
    pub(crate) fn out_rows(&self, pool: &ThreadPool, n: usize, out: &mut [f32], s: &mut MlaScratch) {
        self.o.forward(pool, &s.attn, n, out, &mut s.matmul);
    }

    /// `q_lat[t, h] = W_UK_hᵀ · q_nope[t, h] ‖ q_rope[t, h]` for `n` tokens,
    /// heads spread over the pool's threads.
    fn absorb_queries(&self, pool: &ThreadPool, q: &[f32], n: usize, q_lat: &mut [f32]) {
        let sp = &self.spec;
        let (nh, r, nope, qk, w) = (self.n_heads, sp.kv_lora, sp.nope, sp.qk(), sp.cache_width());
        assert!(q.len() >= n * nh * qk);
        for_each_head_row(pool, q_lat, nh, n, w, |h, t, o| {
            let uk = &self.w_uk[h * nope * r..(h + 1) * nope * r];
            let qh = &q[(t * nh + h) * qk..(t * nh + h + 1) * qk];
            o[..r].fill(0.0);
            for (j, &a) in qh[..nope].iter().enumerate() {
                axpy(&mut o[..r], a, &uk[j * r..(j + 1) * r]);
            }
            o[r..].copy_from_slice(&qh[nope..]);
        });
    }

    /// `attn[t, h] = W_UV_h · out_lat[t, h][..r]`, heads spread over the pool's threads.
    fn lift_values(&self, pool: &ThreadPool, out_lat: &[f32], n: usize, attn: &mut [f32]) {
        let sp = &self.spec;
        let (nh, r, w, vd) = (self.n_heads, sp.kv_lora, sp.cache_width(), sp.v_dim);
        assert!(out_lat.len() >= n * nh * w);
        for_each_head_row(pool, attn, nh, n, vd, |h, t, o| {
            let uv = &self.w_uv_t[h * r * vd..(h + 1) * r * vd];
            o.fill(0.0);
            for (c, &a) in out_lat[(t * nh + h) * w..][..r].iter().enumerate() {
                axpy(o, a, &uv[c * vd..(c + 1) * vd]);
            }
        });
    }

    /// Multi-query attention of the absorbed queries (`len × heads × (r +
    /// rope)`) against the cache rows, each row serving as key and as value;
    /// `rows`: how the new rows attend ([`AttendRows`]).
    #[allow(clippy::too_many_arguments)]
    fn attend_absorbed<T: KvElem>(
        &self,
        pool: &ThreadPool,
        cache: &[T],
        block: usize,
        table: &[u32],
        q: &[f32],
        (start, rows): (usize, AttendRows),
        out: &mut [f32],
    ) {
        let w = self.spec.cache_width();
        let len = q.len() / (self.n_heads * w).max(1);
        if rows == AttendRows::Verify && len > 1 {
            let hw = self.n_heads * w;
            for i in 0..len {
                let (q, out) = (&q[i * hw..(i + 1) * hw], &mut out[i * hw..(i + 1) * hw]);
                self.attend_absorbed(pool, cache, block, table, q, (start + i, AttendRows::Step), out);
            }
            return;
        }
        let view = KvView { k: cache, v: cache, table, block };
        let shape = AttnShape {
            n_new: len,
            start_pos: start,
            n_heads: self.n_heads,
            n_kv_heads: 1,
            head_dim: w,
            window: None,
            scale: self.spec.scale,
            sinks: None,
            prefill: rows == AttendRows::Prompt,
        };
        attention_paged(pool, q, &view, &shape, out);
    }

    /// The reference: per head, K = `W_UK c ‖ k_rope` and V = `W_UV c` for
    /// every cached position, then plain causal softmax attention of the
    /// (un-absorbed) queries `q` (`len × heads × qk`) into `out` (`len × heads × v`).
    #[allow(clippy::too_many_arguments)]
    fn attend_expanded<T: KvElem>(
        &self,
        cache: &[T],
        block: usize,
        table: &[u32],
        q: &[f32],
        start: usize,
        out: &mut [f32],
        e: Expanded<'_>,
    ) {
        let sp = &self.spec;
        let (nh, r, nope, qk, w, vd) = (self.n_heads, sp.kv_lora, sp.nope, sp.qk(), sp.cache_width(), sp.v_dim);
        let len = q.len() / (nh * qk).max(1);
        let ctx = start + len;
        let stride = w / T::VALUES;
        let view = KvView { k: cache, v: cache, table, block };
        grow(e.rows, ctx * w);
        for p in 0..ctx {
            let (k, _) = view.row(p, stride);
            T::widen(false, k, stride, 1, 1, w, &mut e.rows[p * w..(p + 1) * w]);
        }
        grow(e.k, ctx * nope);
        grow(e.v, ctx * vd);
        grow(e.p, ctx);
        for h in 0..nh {
            let uk = &self.w_uk[h * nope * r..(h + 1) * nope * r];
            let uv = &self.w_uv_t[h * r * vd..(h + 1) * r * vd];
            for p in 0..ctx {
                let c = &e.rows[p * w..p * w + r];
                for j in 0..nope {
                    e.k[p * nope + j] = ops::dot(&uk[j * r..(j + 1) * r], c);
                }
                let v = &mut e.v[p * vd..(p + 1) * vd];
                v.fill(0.0);
                for (ci, &a) in c.iter().enumerate() {
                    axpy(v, a, &uv[ci * vd..(ci + 1) * vd]);
                }
            }
            for i in 0..len {
                let qh = &q[(i * nh + h) * qk..(i * nh + h + 1) * qk];
                let keys = start + i + 1;
                for p in 0..keys {
                    let nope_dot = ops::dot(&qh[..nope], &e.k[p * nope..(p + 1) * nope]);
                    let rope_dot = ops::dot(&qh[nope..], &e.rows[p * w + r..(p + 1) * w]);
                    e.p[p] = (nope_dot + rope_dot) * sp.scale;
                }
                ops::softmax(&mut e.p[..keys]);
                let o = &mut out[(i * nh + h) * vd..(i * nh + h + 1) * vd];
                o.fill(0.0);
                for p in 0..keys {
                    axpy(o, e.p[p], &e.v[p * vd..(p + 1) * vd]);
                }
            }
        }
    }
}

/// `W_UK` (`heads × nope × r`) and `W_UVᵀ` (`heads × r × v`) of the local
/// `heads` from HF's `kv_b_proj` `[heads·(nope + v), r]` (head `h`'s rows:
/// `W_UK_h` then `W_UV_h`), as safetensors and older GGUFs (`attn_kv_b`) hold it.
fn joint_up_projection(
    ld: &LayerLoader<'_>,
    spec: &MlaSpec,
    n_heads_total: usize,
    heads: &Range<usize>,
) -> Result<(Vec<f32>, Vec<f32>), ModelError> {
    let (r, nope, v) = (spec.kv_lora, spec.nope, spec.v_dim);
    let kv_b = ld.weight("self_attn.kv_b_proj.weight", &[n_heads_total * (nope + v), r])?;
    let (mut w_uk, mut w_uv_t) = (Vec::with_capacity(heads.len() * nope * r), vec![0f32; heads.len() * r * v]);
    for (i, head) in heads.clone().enumerate() {
        // This head's `(nope + v) × r` rows, dequantized.
        let rows = slice::rows(kv_b, head * (nope + v)..(head + 1) * (nope + v)).to_f32();
        w_uk.extend_from_slice(&rows[..nope * r]);
        for d in 0..v {
            for c in 0..r {
                w_uv_t[(i * r + c) * v + d] = rows[(nope + d) * r + c];
            }
        }
    }
    Ok((w_uk, w_uv_t))
}

/// [`joint_up_projection`] from llama.cpp's split form (`deepseek2` GGUFs
/// from its b11434 converter): `k_b_proj` (`attn_k_b`) `[heads, r, nope]`,
/// each head's `W_UK` transposed, and `v_b_proj` (`attn_v_b`) `[heads, v, r]`,
/// each head's `W_UV` as is.
fn split_up_projection(
    ld: &LayerLoader<'_>,
    spec: &MlaSpec,
    n_heads_total: usize,
    heads: &Range<usize>,
) -> Result<(Vec<f32>, Vec<f32>), ModelError> {
    let (r, nope, v) = (spec.kv_lora, spec.nope, spec.v_dim);
    let k_b = ld.weight("self_attn.k_b_proj.weight", &[n_heads_total, r, nope])?;
    let v_b = ld.weight("self_attn.v_b_proj.weight", &[n_heads_total, v, r])?;
    let (mut w_uk, mut w_uv_t) = (vec![0f32; heads.len() * nope * r], vec![0f32; heads.len() * r * v]);
    for (i, head) in heads.clone().enumerate() {
        // `W_UKᵀ` of this head, `r × nope`, back to `nope × r`.
        let uk_t = slice::rows(k_b, head..head + 1).to_f32();
        let uk = &mut w_uk[i * nope * r..(i + 1) * nope * r];
        for c in 0..r {
            for j in 0..nope {
                uk[j * r + c] = uk_t[c * nope + j];
            }
        }
        // `W_UV` of this head, `v × r`, to `W_UVᵀ` (`r × v`).
        let uv = slice::rows(v_b, head..head + 1).to_f32();
        let uv_t = &mut w_uv_t[i * r * v..(i + 1) * r * v];
        for d in 0..v {
            for c in 0..r {
                uv_t[c * v + d] = uv[d * r + c];
            }
        }
    }
    Ok((w_uk, w_uv_t))
}

/// The expanded path's buffers, borrowed from [`MlaScratch`].
struct Expanded<'a> {
    rows: &'a mut Vec<f32>,
    k: &'a mut Vec<f32>,
    v: &'a mut Vec<f32>,
    p: &'a mut Vec<f32>,
}

/// `y += a · x`.
fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    y.iter_mut().zip(x).for_each(|(y, x)| *y += a * x);
}

/// Stores rows of `w` values (`new`: `len × w`) at positions `start..` of a
/// keys-only cache (blocks of `block` rows, in `table` order).
fn store_rows<T: KvElem>(cache: &mut [T], block: usize, table: &[u32], new: &[f32], w: usize, start: usize) {
    let row = w / T::VALUES;
    let len = new.len() / w.max(1);
    let mut p = start;
    while p < start + len {
        let n = (block - p % block).min(start + len - p);
        let at = (table[p / block] as usize * block + p % block) * row;
        T::store(&new[(p - start) * w..(p - start + n) * w], &mut cache[at..at + n * row]);
        p += n;
    }
}

/// Runs `f(head, token, row)` for every row `(token, head)` of `out`
/// (`n × heads × width`), heads spread over the pool's threads: each thread
/// owns whole heads, so the rows it writes are its alone.
fn for_each_head_row(
    pool: &ThreadPool,
    out: &mut [f32],
    heads: usize,
    n: usize,
    width: usize,
    f: impl Fn(usize, usize, &mut [f32]) + Sync,
) {
    assert!(out.len() >= n * heads * width);
    let dst = SendPtr(out.as_mut_ptr());
    pool.run(|tid, nt| {
        let dst = &dst;
        for h in (tid..heads).step_by(nt) {
            for t in 0..n {
                // SAFETY: row (t, h) lies inside `out` (asserted above) and
                // head h belongs to this thread alone.
                let o = unsafe { std::slice::from_raw_parts_mut(dst.0.add((t * heads + h) * width), width) };
                f(h, t, o);
            }
        }
    });
}
