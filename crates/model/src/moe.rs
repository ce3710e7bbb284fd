//! The mixture-of-experts feed-forward block:
//!
//! ```text
//! x ─ router ─ softmax ─ top-k (─ renormalize) ─┐   (DeepSeek: sigmoid, grouped top-k, × scale)
//!   ├─ expert e over the tokens routed to e ────┴─ Σ weight · expert(x) ─┐
//!   └─ shared expert · sigmoid(shared_gate(x))  (qwen2_moe; no gate: DeepSeek) ┴─ all-reduce
//! ```
//!
//! Every expert is a SwiGLU MLP `down(silu(gate(x)) · up(x))` of width
//! `expert_ffn`. Execution groups tokens by expert: one matrix product per
//! *active* expert over its tokens, so prefill never runs one product per token
//! and decode reads only the chosen experts' weights. Under tensor parallelism
//! each expert (and the shared one) keeps a slice of its intermediate width, the
//! router and the shared gate are replicated (every rank routes alike), and one
//! all-reduce after the block sums routed and shared partial outputs together.

use crate::decoder::LayerLoader;
use crate::linear::Linear;
use crate::workspace::grow;
use crate::ModelError;
use formats::ModelConfig;
use kernels::matmul::MatmulScratch;
use kernels::{ops, ThreadPool};
use serde_json::Value;

/// What an architecture file says about its experts.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeSpec {
    pub n_experts: usize,
    /// Experts each token is routed to.
    pub top_k: usize,
    /// Intermediate width of one routed expert.
    pub expert_ffn: usize,
    /// Rescale the top-k routing probabilities to sum to one.
    pub norm_topk: bool,
    /// Width of the shared expert (always applied, behind a sigmoid gate).
    pub shared_ffn: Option<usize>,
    /// `sparse[l]`: layer `l` is a MoE layer (the others are dense).
    pub sparse: Vec<bool>,
    pub names: MoeNames,
    /// The experts' activation.
    pub act: ExpertAct,
    /// The router and every expert projection carry biases (gpt-oss).
    pub bias: bool,
    pub routing: Routing,
}

/// How router logits become expert weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Routing {
    /// Softmax over all experts, then the `top_k` largest (mixtral, qwen).
    Softmax,
    /// DeepSeek V3 (`noaux_tc`): sigmoid scores; the layer's
    /// `gate.e_score_correction_bias` is added for *choosing* only; experts
    /// form `n_group` equal groups, each scored by the sum of its two best
    /// biased scores, and only the `topk_group` best groups are eligible; the
    /// weights are the chosen experts' unbiased scores (renormalized when
    /// `norm_topk`), times `scale` (`routed_scaling_factor`).
    SigmoidGrouped { n_group: usize, topk_group: usize, scale: f32 },
}

/// How an expert combines its gate and up projections.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ExpertAct {
    /// `silu(gate) · up`.
    Silu,
    /// gpt-oss: `(clamp(up, ±limit) + 1) · g · sigmoid(alpha · g)`, `g = min(gate, limit)`.
    ClampedSwiglu { alpha: f32, limit: f32 },
    /// GeGLU, `gelu_tanh(gate) · up` (Gemma's `gelu_pytorch_tanh`).
    GeluTanh,
}

impl ExpertAct {
    /// `gate[i] = act(gate[i], up[i])`.
    pub fn apply(self, gate: &mut [f32], up: &[f32]) {
        match self {
            ExpertAct::Silu => ops::silu_mul(gate, up),
            ExpertAct::ClampedSwiglu { alpha, limit } => ops::swiglu_clamped(gate, up, alpha, limit),
            ExpertAct::GeluTanh => ops::gelu_tanh_mul(gate, up),
        }
    }
}

/// Tensor names under `model.layers.N.{block}.`.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeNames {
    /// "block_sparse_moe" (mixtral) or "mlp" (qwen*_moe).
    pub block: &'static str,
    /// The router, `[n_experts, hidden]`.
    pub router: &'static str,
    /// Projections of expert `E`, found at `experts.E.{name}.weight`:
    /// gate (`[ffn, hidden]`), up (`[ffn, hidden]`), down (`[hidden, ffn]`).
    pub gate: &'static str,
    pub up: &'static str,
    pub down: &'static str,
    /// The shared expert's module (`shared_expert`, DeepSeek's `shared_experts`)
    /// and its sigmoid gate, if it has one (qwen2_moe's `shared_expert_gate`).
    pub shared: &'static str,
    pub shared_gate: Option<&'static str>,
    /// Sigmoid routing's `e_score_correction_bias` (`[n_experts]`) under the
    /// block: the router's (`gate.…`, DeepSeek, GLM) or the block's own
    /// (MiniMax-M2).
    pub score_bias: &'static str,
}

/// The qwen*_moe names, also every GGUF's as formats maps llama.cpp's (the
/// shared expert, if any, is `shared_expert.*`, its gate `shared_expert_gate`).
pub const QWEN_NAMES: MoeNames = MoeNames {
    block: "mlp",
    router: "gate",
    gate: "gate_proj",
    up: "up_proj",
    down: "down_proj",
    shared: "shared_expert",
    shared_gate: Some("shared_expert_gate"),
    score_bias: "gate.e_score_correction_bias",
};

/// A config integer, or a one-line error naming the key.
pub fn config_usize(cfg: &ModelConfig, keys: &[&str]) -> Result<usize, ModelError> {
    let c = text_config(cfg);
    keys.iter()
        .find_map(|k| c.get(*k).and_then(Value::as_u64))
        .map(|v| v as usize)
        .ok_or_else(|| ModelError::Config(format!("{} config lacks an integer '{}'", cfg.arch, keys.join("' or '"))))
}

/// The object the language-model keys live in (multimodal configs nest it).
pub fn text_config(cfg: &ModelConfig) -> &Value {
    match cfg.raw.get("text_config") {
        Some(t) if t.is_object() && cfg.raw.get("hidden_size").is_none() => t,
        _ => &cfg.raw,
    }
}

/// Qwen's rule for which layers are sparse: not in `mlp_only_layers`, and every
/// `decoder_sparse_step`-th layer (counting from 1).
pub fn qwen_sparse_layers(cfg: &ModelConfig, n_experts: usize) -> Vec<bool> {
    let c = text_config(cfg);
    let step = c.get("decoder_sparse_step").and_then(Value::as_u64).unwrap_or(1).max(1) as usize;
    let dense: Vec<u64> = c
        .get("mlp_only_layers")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    (0..cfg.n_layers).map(|l| n_experts > 0 && !dense.contains(&(l as u64)) && (l + 1) % step == 0).collect()
}

/// Checks the numbers an architecture file gathered.
pub fn validate(spec: MoeSpec, arch: &str) -> Result<MoeSpec, ModelError> {
    if spec.top_k == 0 || spec.top_k > spec.n_experts {
        return Err(ModelError::Config(format!(
            "{arch}: {} experts per token out of {} experts",
            spec.top_k, spec.n_experts
        )));
    }
    if spec.expert_ffn == 0 || spec.shared_ffn == Some(0) {
        return Err(ModelError::Config(format!("{arch}: an expert of intermediate width 0")));
    }
    if let Routing::SigmoidGrouped { n_group, topk_group, .. } = spec.routing {
        if n_group == 0 || !spec.n_experts.is_multiple_of(n_group) || topk_group == 0 || topk_group > n_group {
            return Err(ModelError::Config(format!(
                "{arch}: n_group {n_group} must divide {} experts and topk_group {topk_group} be in 1..={n_group}",
                spec.n_experts
            )));
        }
        if topk_group * (spec.n_experts / n_group) < spec.top_k {
            return Err(ModelError::Config(format!(
                "{arch}: {topk_group} groups of {} experts hold fewer than {} experts per token",
                spec.n_experts / n_group,
                spec.top_k
            )));
        }
    }
    Ok(spec)
}

/// One SwiGLU MLP, `down(act(gate(x), up(x)))`: a dense layer's feed-forward,
/// a routed or a shared expert; possibly a tensor-parallel slice.
#[derive(Debug)]
pub struct Mlp {
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
    pub act: ExpertAct,
}

impl Mlp {
    pub fn bytes(&self) -> usize {
        [&self.gate, &self.up, &self.down].iter().map(|l| l.weight_bytes()).sum()
    }

    pub fn flops(&self, m: usize) -> usize {
        [&self.gate, &self.up, &self.down].iter().map(|l| l.flops(m)).sum()
    }

    /// `out (m × hidden) = down(silu(gate(x)) · up(x))` for `x`: `m × hidden`.
    pub fn forward(&self, pool: &ThreadPool, x: &[f32], m: usize, out: &mut [f32], s: &mut MoeScratch) {
        let f = self.gate.out_features();
        grow(&mut s.gate, m * f);
        grow(&mut s.up, m * f);
        Linear::forward_many(pool, &[&self.gate, &self.up], x, m, &mut [&mut s.gate, &mut s.up], &mut s.matmul);
        self.act.apply(&mut s.gate[..m * f], &s.up[..m * f]);
        self.down.forward(pool, &s.gate, m, out, &mut s.matmul);
    }
}

/// A loaded MoE block (this rank's slices of it).
#[derive(Debug)]
pub struct Moe {
    pub top_k: usize,
    pub norm_topk: bool,
    /// `[n_experts, hidden]`, replicated on every rank.
    pub router: Linear,
    /// The experts this rank holds: `first..first + experts.len()` (all of
    /// them, sliced, under tensor parallelism; whole ones under expert
    /// parallelism).
    pub first: usize,
    pub experts: Vec<Mlp>,
    pub shared: Option<Mlp>,
    /// `[1, hidden]`, replicated (none: the shared expert is added with weight 1).
    pub shared_gate: Option<Linear>,
    pub routing: Routing,
    /// DeepSeek's `e_score_correction_bias` (`[n_experts]`), for choosing only.
    pub score_bias: Option<Vec<f32>>,
}

/// Buffers of one MoE forward, reused across steps.
#[derive(Default)]
pub struct MoeScratch {
    /// `T × n_experts` router logits, then probabilities.
    probs: Vec<f32>,
    /// `(token, weight)` routed to each expert this step.
    routes: Vec<Vec<(u32, f32)>>,
    /// The routed tokens' inputs (`m × hidden`) and one expert's outputs.
    rows_in: Vec<f32>,
    rows_out: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    /// `T` shared-gate logits.
    shared_gate: Vec<f32>,
    /// Grouped routing: biased scores, group scores.
    biased: Vec<f32>,
    groups: Vec<(usize, f32)>,
    matmul: MatmulScratch,
}

impl Moe {
    /// Loads the MoE block of the layer `ld` points at, keeping this rank's
    /// slice of every expert's intermediate width.
    pub(crate) fn load(ld: &LayerLoader<'_>, spec: &MoeSpec) -> Result<Moe, ModelError> {
        let n = &spec.names;
        let b = n.block;
        // Expert parallelism: whole experts `held`; otherwise a slice of all.
        let (held, whole) = ld.held_experts(spec.n_experts);
        let routed_cols = |w: usize| if whole { Ok(0..w) } else { ld.part_of(w) };
        let expert = |prefix: &str, width: usize| -> Result<Mlp, ModelError> {
            let cols = routed_cols(width)?;
            Ok(Mlp {
                gate: ld.col_par(&format!("{prefix}.{}", n.gate), width, &cols, false)?,
                up: ld.col_par(&format!("{prefix}.{}", n.up), width, &cols, false)?,
                down: ld.row_par(&format!("{prefix}.{}", n.down), width, &cols)?,
                act: spec.act,
            })
        };
        // GGUF stacks every expert's projection in one `[n_experts, out, in]`
        // tensor (llama.cpp's `ffn_{gate,up,down}_exps`, mapped by formats).
        // With biases (gpt-oss), `…_exps.bias` `[n_experts, out]`.
        let stacked = |e: usize| -> Result<Mlp, ModelError> {
            let (h, w, ne) = (ld.hidden(), spec.expert_ffn, spec.n_experts);
            let cols = routed_cols(w)?;
            let bias = |name: &str, len: usize| match spec.bias {
                true => ld.row_values(&format!("{b}.experts.{name}.bias"), [ne, len], e).map(Some),
                false => Ok(None),
            };
            let part = |v: Option<Vec<f32>>| v.map(|v| v[cols.clone()].to_vec());
            let down = ld.row_par_of(&ld.stacked(&format!("{b}.experts.down_exps"), [ne, h, w], e)?, &cols)?;
            Ok(Mlp {
                gate: ld.col_par_of(
                    &ld.stacked(&format!("{b}.experts.gate_exps"), [ne, w, h], e)?,
                    &cols,
                    part(bias("gate_exps", w)?),
                )?,
                up: ld.col_par_of(
                    &ld.stacked(&format!("{b}.experts.up_exps"), [ne, w, h], e)?,
                    &cols,
                    part(bias("up_exps", w)?),
                )?,
                down: Linear { bias: bias("down_exps", h)?.and_then(|v| ld.row_bias(v, whole)), ..down },
                act: spec.act,
            })
        };
        let experts = if ld.contains(&format!("{b}.experts.gate_exps.weight")) {
            let experts: Vec<Mlp> = held.clone().map(stacked).collect::<Result<_, _>>()?;
            // Packing copies each expert and drops its pages of the mapping, but
            // the kernel's fault-around maps page-cache neighbours of every page
            // read, so pages of experts already copied come back while the next
            // one is read (0.15 GiB on the 2.6B MXFP4 benchmark model). Once every
            // held expert has its own copy, drop the stacked tensors' pages again.
            let owned = |l: &Linear| l.weight.is_packed();
            if experts.iter().all(|m| owned(&m.gate) && owned(&m.up) && owned(&m.down)) {
                for proj in ["gate_exps", "up_exps", "down_exps"] {
                    let t = ld.tensor(&format!("{b}.experts.{proj}.weight"))?;
                    t.data.release_range(0, t.bytes().len());
                }
            }
            experts
        } else if ld.contains(&format!("{b}.experts.gate_up_proj")) {
            let cols = routed_cols(spec.expert_ffn)?;
            held.clone().map(|e| crate::moe_fused::expert(ld, spec, e, &cols, whole)).collect::<Result<_, _>>()?
        } else {
            held.clone().map(|e| expert(&format!("{b}.experts.{e}"), spec.expert_ffn)).collect::<Result<_, _>>()?
        };
        let (shared, shared_gate) = match spec.shared_ffn {
            Some(w) => {
                let s = n.shared;
                let mlp = Mlp {
                    gate: ld.col_par(&format!("{b}.{s}.gate_proj"), w, &ld.part_of(w)?, false)?,
                    up: ld.col_par(&format!("{b}.{s}.up_proj"), w, &ld.part_of(w)?, false)?,
                    down: ld.row_par(&format!("{b}.{s}.down_proj"), w, &ld.part_of(w)?)?,
                    act: spec.act,
                };
                let gate = n.shared_gate.map(|g| ld.replicated(&format!("{b}.{g}"), 1, false)).transpose()?;
                (Some(mlp), gate)
            }
            None => (None, None),
        };
        let score_bias = match spec.routing {
            Routing::SigmoidGrouped { .. } => Some(ld.vector(&format!("{b}.{}", n.score_bias), spec.n_experts)?),
            Routing::Softmax => None,
        };
        Ok(Moe {
            top_k: spec.top_k,
            norm_topk: spec.norm_topk,
            router: ld.replicated(&format!("{b}.{}", n.router), spec.n_experts, spec.bias)?,
            first: held.start,
            experts,
            shared,
            shared_gate,
            routing: spec.routing,
            score_bias,
        })
    }

    /// Of the `top_k` experts a token uses, how many this rank holds on
    /// average (all `top_k` unless expert-parallel), as `top_k · held / n`.
    fn active_held(&self, per_expert: usize) -> usize {
        self.top_k * per_expert * self.experts.len() / self.router.out_features().max(1)
    }

    /// Weight bytes one decoded token reads: the router, `top_k` experts (all
    /// experts have the same size; expert-parallel: this rank's expected
    /// share of them) and the shared expert.
    pub fn weight_bytes_per_token(&self) -> usize {
        let one = self.experts.first().map_or(0, Mlp::bytes);
        let shared =
            self.shared.as_ref().map_or(0, Mlp::bytes) + self.shared_gate.as_ref().map_or(0, Linear::weight_bytes);
        self.router.weight_bytes() + self.active_held(one) + shared
    }

    /// Bytes of every expert this rank holds (memory, not traffic).
    pub fn weight_bytes_total(&self) -> usize {
        let shared =
            self.shared.as_ref().map_or(0, Mlp::bytes) + self.shared_gate.as_ref().map_or(0, Linear::weight_bytes);
        self.router.weight_bytes() + self.experts.iter().map(Mlp::bytes).sum::<usize>() + shared
    }

    /// FLOPs of a step over `m` tokens: each token passes the router, `top_k`
    /// experts and the shared expert.
    pub fn flops(&self, m: usize) -> usize {
        let one = self.experts.first().map_or(0, |e| e.flops(m));
        let shared =
            self.shared.as_ref().map_or(0, |e| e.flops(m)) + self.shared_gate.as_ref().map_or(0, |g| g.flops(m));
        self.router.flops(m) + self.active_held(one) + shared
    }

    /// The router over `x (T × hidden)` and each token's `top_k` experts
    /// and weights, kept in `s` for [`Moe::experts_rows`].
    pub fn route_rows(&self, pool: &ThreadPool, x: &[f32], t: usize, s: &mut MoeScratch) {
        let ne = self.router.out_features();
        grow(&mut s.probs, t * ne);
        self.router.forward(pool, x, t, &mut s.probs, &mut s.matmul);
        self.route(t, s);
    }

    /// The chosen experts this rank holds (routes from [`Moe::route_rows`])
    /// and the shared expert over `x`, weighted and summed into `out (T ×
    /// hidden)`: this rank's part of the block's output.
    pub fn experts_rows(&self, pool: &ThreadPool, x: &[f32], t: usize, out: &mut [f32], s: &mut MoeScratch) {
        let h = self.router.in_features();
        out[..t * h].fill(0.0);
        if t == 1 {
            self.forward_token(pool, x, out, s);
            s.routes.iter_mut().for_each(Vec::clear);
            return;
        }
        let mut routes = std::mem::take(&mut s.routes);
        for (expert, tokens) in self.experts.iter().zip(&routes[self.first..]) {
            let m = tokens.len();
            if m == 0 {
                continue;
            }
            // Gather the routed rows, run the expert once over all of them,
            // scatter-add its weighted outputs.
            grow(&mut s.rows_in, m * h);
            grow(&mut s.rows_out, m * h);
            for (i, &(tok, _)) in tokens.iter().enumerate() {
                s.rows_in[i * h..(i + 1) * h].copy_from_slice(&x[tok as usize * h..(tok as usize + 1) * h]);
            }
            let (rows_in, mut rows_out) = (std::mem::take(&mut s.rows_in), std::mem::take(&mut s.rows_out));
            expert.forward(pool, &rows_in, m, &mut rows_out, s);
            for (i, &(tok, w)) in tokens.iter().enumerate() {
                let dst = &mut out[tok as usize * h..(tok as usize + 1) * h];
                dst.iter_mut().zip(&rows_out[i * h..(i + 1) * h]).for_each(|(d, v)| *d += w * v);
            }
            (s.rows_in, s.rows_out) = (rows_in, rows_out);
        }
        routes.iter_mut().for_each(Vec::clear);
        s.routes = routes;
        if let Some(shared) = &self.shared {
            grow(&mut s.rows_out, t * h);
            grow(&mut s.shared_gate, t);
            let mut rows_out = std::mem::take(&mut s.rows_out);
            shared.forward(pool, x, t, &mut rows_out, s);
            match &self.shared_gate {
                Some(gate) => gate.forward(pool, x, t, &mut s.shared_gate, &mut s.matmul),
                // Ungated (DeepSeek): weight sigmoid(∞) = 1.
                None => s.shared_gate[..t].fill(f32::INFINITY),
            }
            for i in 0..t {
                let g = 1.0 / (1.0 + (-s.shared_gate[i]).exp());
                let dst = &mut out[i * h..(i + 1) * h];
                dst.iter_mut().zip(&rows_out[i * h..(i + 1) * h]).for_each(|(d, v)| *d += g * v);
            }
            s.rows_out = rows_out;
        }
    }

    /// Decode of one token (`x`: `1 × hidden`, routes already chosen): every
    /// chosen expert's gate and up projection, the shared expert's and its gate
    /// read the same input, so they run as one multi-weight product (one pool
    /// run over all their rows, the input quantized once) instead of two runs
    /// per expert; then every down projection, again as one pool run (each
    /// reading its own expert's activations). Only the chosen experts' weights
    /// are read. Sums in the order of [`Moe::experts_rows`]
    /// (experts by index, then the shared expert).
    fn forward_token(&self, pool: &ThreadPool, x: &[f32], out: &mut [f32], s: &mut MoeScratch) {
        let h = self.router.in_features();
        let mut mlps: Vec<(&Mlp, Option<f32>)> = s
            .routes
            .iter()
            .enumerate()
            .skip(self.first)
            .take(self.experts.len())
            .filter_map(|(e, r)| r.first().map(|&(_, w)| (&self.experts[e - self.first], Some(w))))
            .collect();
        if let Some(shared) = &self.shared {
            mlps.push((shared, None));
        }
        if mlps.is_empty() {
            // Expert-parallel: this rank holds none of the chosen experts.
            return;
        }
        let total: usize = mlps.iter().map(|(m, _)| m.gate.out_features()).sum();
        grow(&mut s.gate, total);
        grow(&mut s.up, total);
        grow(&mut s.shared_gate, 1);
        {
            let mut layers: Vec<&Linear> = Vec::with_capacity(2 * mlps.len() + 1);
            let mut outs: Vec<&mut [f32]> = Vec::with_capacity(2 * mlps.len() + 1);
            let (mut gates, mut ups) = (&mut s.gate[..total], &mut s.up[..total]);
            for (m, _) in &mlps {
                let f = m.gate.out_features();
                let (g, rest) = std::mem::take(&mut gates).split_at_mut(f);
                gates = rest;
                let (u, rest) = std::mem::take(&mut ups).split_at_mut(f);
                ups = rest;
                layers.extend([&m.gate, &m.up]);
                outs.extend([g, u]);
            }
            match (&self.shared, &self.shared_gate) {
                (Some(_), Some(gate)) => {
                    layers.push(gate);
                    outs.push(&mut s.shared_gate[..1]);
                }
                _ => s.shared_gate[0] = f32::INFINITY,
            }
            Linear::forward_many(pool, &layers, x, 1, &mut outs, &mut s.matmul);
        }
        let mut off = 0;
        for (m, _) in &mlps {
            let f = m.gate.out_features();
            m.act.apply(&mut s.gate[off..off + f], &s.up[off..off + f]);
            off += f;
        }
        // Every down projection in one pool run, each reading its own expert's
        // activations; `rows_out` holds their outputs, `h` each.
        grow(&mut s.rows_out, mlps.len() * h);
        {
            let downs: Vec<&Linear> = mlps.iter().map(|(m, _)| &m.down).collect();
            let mut ins: Vec<&[f32]> = Vec::with_capacity(mlps.len());
            let mut off = 0;
            for (m, _) in &mlps {
                let f = m.gate.out_features();
                ins.push(&s.gate[off..off + f]);
                off += f;
            }
            let mut outs: Vec<&mut [f32]> = s.rows_out[..mlps.len() * h].chunks_exact_mut(h).collect();
            Linear::forward_each(pool, &downs, &ins, 1, &mut outs, &mut s.matmul);
        }
        for ((_, weight), y) in mlps.iter().zip(s.rows_out.chunks_exact(h)) {
            let w = weight.unwrap_or_else(|| 1.0 / (1.0 + (-s.shared_gate[0]).exp()));
            out[..h].iter_mut().zip(y).for_each(|(d, v)| *d += w * v);
        }
    }

    /// Turns the router logits in `s.probs` into per-expert token lists.
    /// Softmax routing: softmax over all experts, the `top_k` largest (exact
    /// ties to the lower index), optionally renormalized to sum to one.
    /// Grouped sigmoid routing ([`Routing::SigmoidGrouped`]): chosen by the
    /// biased scores of the eligible groups, weighted by the unbiased ones.
    fn route(&self, t: usize, s: &mut MoeScratch) {
        let ne = self.router.out_features();
        s.routes.resize_with(ne, Vec::new);
        grow(&mut s.biased, ne);
        let mut chosen: Vec<(usize, f32)> = Vec::with_capacity(self.top_k);
        for tok in 0..t {
            let p = &mut s.probs[tok * ne..(tok + 1) * ne];
            let sel = &mut s.biased[..ne];
            let (eps, scale) = match self.routing {
                Routing::Softmax => {
                    let max = p.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                    let sum: f32 = p
                        .iter_mut()
                        .map(|v| {
                            *v = (*v - max).exp();
                            *v
                        })
                        .sum();
                    p.iter_mut().for_each(|v| *v /= sum);
                    sel.copy_from_slice(p);
                    (0.0, 1.0)
                }
                Routing::SigmoidGrouped { n_group, topk_group, scale } => {
                    let bias = self.score_bias.as_deref().unwrap_or(&[]);
                    for (e, (v, c)) in p.iter_mut().zip(sel.iter_mut()).enumerate() {
                        *v = 1.0 / (1.0 + (-*v).exp());
                        *c = *v + bias.get(e).copied().unwrap_or(0.0);
                    }
                    keep_best_groups(sel, n_group, topk_group, &mut s.groups);
                    // As transformers: the sum gets 1e-20 so it is never 0.
                    (1e-20, scale)
                }
            };
            chosen.clear();
            for _ in 0..self.top_k {
                let best = (0..ne)
                    .filter(|e| !chosen.iter().any(|c| c.0 == *e))
                    .fold(None, |b: Option<usize>, e| match b {
                        Some(b) if sel[b] >= sel[e] => Some(b),
                        _ => Some(e),
                    })
                    .expect("top_k ≤ n_experts");
                chosen.push((best, p[best]));
            }
            let norm = if self.norm_topk { chosen.iter().map(|c| c.1).sum::<f32>() + eps } else { 1.0 };
            for &(e, w) in &chosen {
                s.routes[e].push((tok as u32, w / norm * scale));
            }
        }
    }
}

/// Group-limited choice: `sel` (one token's biased scores) in `n_group` equal
/// groups, each scored by the sum of its two best values (its only value for
/// groups of one); all but the `topk_group` best groups (ties to the lower
/// group) are set to −∞ so no expert of theirs is chosen.
fn keep_best_groups(sel: &mut [f32], n_group: usize, topk_group: usize, groups: &mut Vec<(usize, f32)>) {
    if topk_group >= n_group {
        return;
    }
    let size = sel.len() / n_group;
    groups.clear();
    for g in 0..n_group {
        let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
        for &v in &sel[g * size..(g + 1) * size] {
            if v > a {
                (a, b) = (v, a);
            } else if v > b {
                b = v;
            }
        }
        groups.push((g, if size >= 2 { a + b } else { a }));
    }
    // Stable: equal scores keep the lower group first.
    groups.sort_by(|x, y| y.1.total_cmp(&x.1));
    for &(g, _) in &groups[topk_group..] {
        sel[g * size..(g + 1) * size].fill(f32::NEG_INFINITY);
    }
}

#[cfg(test)]
mod tests {
    use super::keep_best_groups;

    /// Groups are ranked by the sum of their two best scores, not by their
    /// best one: group 0 holds the best expert (0.95) yet loses to group 1
    /// (0.5 + 0.5); ties keep the lower group.
    #[test]
    fn groups_rank_by_their_two_best_scores() {
        let inf = f32::NEG_INFINITY;
        let mut g = Vec::new();
        let mut sel = vec![0.95, 0.0, 0.5, 0.5, 0.45, 0.45, 0.1, 0.1];
        keep_best_groups(&mut sel, 4, 1, &mut g);
        assert_eq!(sel, vec![inf, inf, 0.5, 0.5, inf, inf, inf, inf]);
        let mut sel = vec![0.5, 0.5, 0.2, 0.2, 0.6, 0.4, 0.3, 0.3];
        keep_best_groups(&mut sel, 4, 1, &mut g);
        assert_eq!(sel, vec![0.5, 0.5, inf, inf, inf, inf, inf, inf]);
        let mut sel = vec![0.1, 0.2, 0.7, 0.8, 0.4, 0.5, 1.0, 0.5];
        keep_best_groups(&mut sel, 4, 2, &mut g);
        assert_eq!(sel, vec![inf, inf, 0.7, 0.8, inf, inf, 1.0, 0.5]);
        // Every group kept: nothing masked.
        let mut sel = vec![0.1, 0.2, 0.3, 0.4];
        keep_best_groups(&mut sel, 2, 2, &mut g);
        assert_eq!(sel, vec![0.1, 0.2, 0.3, 0.4]);
    }
}
