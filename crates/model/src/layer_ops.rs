//! The compute seam: the ops a decoder layer is written in ([`LayerOps`]),
//! and the one layer loop ([`run_decoder`]) that every backend runs.
//!
//! The loop holds what a layer *is*: the order of its norms, projections,
//! attention and feed-forward, where the residual adds go, what the sandwich
//! norms (Gemma 3) and the output gate (Qwen3-Next) change. A backend holds
//! how each op runs and where its buffers are: the CPU's (`model::cpu_layers`:
//! host rows in the [`crate::Workspace`], the thread pool's kernels, the host
//! KV pool) and the GPU's (`model::gpu_shard::layers`: device buffers, one
//! recorded pass per step, the device KV pool).
//!
//! The ops are named by their role in the layer, not as a bare
//! `matmul(w, x, y)`, because each backend's fastest form of a role differs
//! and the seam must not cost either one its fusions (the bar: the
//! CPU within 2% of the loop it replaced):
//! - the CPU quantizes the normalized rows once for q‖k‖v (and gate‖up) and
//!   keeps q, k and v in separate rows; the device writes one fused
//!   `q‖k‖v(‖gate)` row per token from one stacked matrix;
//! - the device adds the block's last matmul into the residual stream when
//!   nothing comes between ([`LayerOps::fuses_residual`]); the CPU adds after;
//! - the CPU's attention scores int8 keys against an int8 query and runs the
//!   sliding-window rings of its own caches; the device's reads its pool;
//! - exact tensor parallelism (column gathers) and the all-reduce of a
//!   block's partial sums happen inside the op that makes the block's output
//!   ([`LayerOps::attn_out`], [`LayerOps::down`], the block ops), so the
//!   device stages to the host only there.
//!
//! A mixture of experts is two ops: the routing, then the experts (routed
//! and shared, gathered and combined; the CPU runs one token's chosen
//! experts as one multi-weight product, the device groups a chunk's pairs
//! by expert). Latent attention is project → attend (absorbed: queries
//! folded into the latent space, values lifted out) → out; Gated DeltaNet
//! is project → recur (conv, delta rule and gated norm on the state slots,
//! the speculative way back) → out. Inside those ops each backend runs its
//! own kernels (the CPU's chunked delta rule, the device's recurrent one).
//!
//! Every op reads and writes the step's named buffers: the residual stream
//! `x` (`n × hidden`), its normalized copy `xn`, the attention block's q, k, v
//! and output rows, the feed-forward's gated activation, and the block output
//! `o` (`n × hidden`), where `n` is the step's rows.

use crate::decoder::{Attention, DecoderLayer, FeedForward, Gqa};
use crate::linear_attn::GatedDeltaNet;
use crate::mla::Mla;
use crate::moe::{Mlp, Moe};
use crate::ModelError;

/// Which of a layer's RMSNorm weights an op applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Norm {
    /// Before the attention block: `x → xn`.
    Attn,
    /// Before the feed-forward block: `x → xn`.
    Mlp,
    /// Sandwich norms on a block's output `o`, in place, before the residual add.
    PostAttn,
    PostFfn,
}

/// A backend's implementation of the layer ops, for one step.
pub(crate) trait LayerOps {
    /// Whether the block's last matmul adds its output into `x` itself
    /// (then no [`LayerOps::residual`] follows).
    fn fuses_residual(&self, layer: &DecoderLayer) -> bool;
    /// RMSNorm of `x` into `xn` ([`Norm::Attn`] or [`Norm::Mlp`]).
    fn input_norm(&mut self, li: usize, which: Norm) -> Result<(), ModelError>;
    /// q, k, v (and the output gate's input) of `xn`.
    fn qkv(&mut self, li: usize, g: &Gqa) -> Result<(), ModelError>;
    /// The q and k norms, per head or over the whole projection.
    fn qk_norm(&mut self, li: usize, g: &Gqa) -> Result<(), ModelError>;
    /// Rotary embedding of q and k at each row's position.
    fn rope_qk(&mut self, li: usize, g: &Gqa) -> Result<(), ModelError>;
    /// Stores k and v in the layer's KV (paged pool or own cache) and runs
    /// causal attention of q against it (windows, sinks, verify rows).
    fn attend(&mut self, li: usize, g: &Gqa) -> Result<(), ModelError>;
    /// The output gate: attention rows times `sigmoid(gate)`.
    fn output_gate(&mut self, li: usize, g: &Gqa) -> Result<(), ModelError>;
    /// The output projection, completed across the tensor group, into `o`
    /// (or added into `x` when `fused`).
    fn attn_out(&mut self, li: usize, g: &Gqa, fused: bool) -> Result<(), ModelError>;
    /// Latent attention's projections of `xn`: each head's query (its rope
    /// tail roped) and each row's latent (normalized) ‖ shared key (roped).
    fn latent_project(&mut self, li: usize, m: &Mla) -> Result<(), ModelError>;
    /// Stores the latents in the layer's KV and runs the absorbed attention
    /// (queries folded into the latent space, values lifted out of it; the
    /// CPU also runs the expanded reference, `SHARDLM_MLA=expanded`).
    fn latent_attend(&mut self, li: usize, m: &Mla) -> Result<(), ModelError>;
    /// Latent attention's output projection (as [`LayerOps::attn_out`]).
    fn latent_out(&mut self, li: usize, m: &Mla, fused: bool) -> Result<(), ModelError>;
    /// Gated DeltaNet's fused input projections of `xn` (q‖k‖v, z, b, a).
    fn delta_project(&mut self, li: usize, d: &GatedDeltaNet) -> Result<(), ModelError>;
    /// The recurrence: a speculative step's way back where asked, the causal
    /// conv with SiLU and the delta rule on each sequence's state slot
    /// (advancing it), the gated RMSNorm.
    fn delta_recur(&mut self, li: usize, d: &GatedDeltaNet) -> Result<(), ModelError>;
    /// Gated DeltaNet's output projection (as [`LayerOps::attn_out`]).
    fn delta_out(&mut self, li: usize, d: &GatedDeltaNet, fused: bool) -> Result<(), ModelError>;
    /// gate and up of `xn`, then the gated activation.
    fn gate_up_act(&mut self, li: usize, m: &Mlp) -> Result<(), ModelError>;
    /// The down projection of the gated activation, completed across the
    /// tensor group, into `o` (or added into `x` when `fused`).
    fn down(&mut self, li: usize, m: &Mlp, fused: bool) -> Result<(), ModelError>;
    /// A mixture of experts' router over `xn` and each token's top-k
    /// experts and weights (softmax, or grouped sigmoid with its bias).
    fn moe_route(&mut self, li: usize, m: &Moe) -> Result<(), ModelError>;
    /// The chosen experts this rank holds and the shared expert over `xn`,
    /// weighted and summed (as [`LayerOps::down`] ends).
    fn moe_experts(&mut self, li: usize, m: &Moe, fused: bool) -> Result<(), ModelError>;
    /// The optional sandwich norm of `o` in place, then `x += o`.
    fn residual(&mut self, li: usize, post_norm: Option<Norm>) -> Result<(), ModelError>;
    /// After a layer (the device starts on it while the host records the next).
    fn end_layer(&mut self, li: usize) -> Result<(), ModelError>;
}

/// Runs `layers` over the step's rows with `ops`; the residual stream holds
/// the result.
pub(crate) fn run_decoder<B: LayerOps>(layers: &[DecoderLayer], ops: &mut B) -> Result<(), ModelError> {
    for (li, layer) in layers.iter().enumerate() {
        let fused = ops.fuses_residual(layer);
        ops.input_norm(li, Norm::Attn)?;
        match &layer.attn {
            Attention::Gqa(g) => {
                ops.qkv(li, g)?;
                if g.q_norm.is_some() && g.k_norm.is_some() {
                    ops.qk_norm(li, g)?;
                }
                ops.rope_qk(li, g)?;
                ops.attend(li, g)?;
                if g.gate.is_some() {
                    ops.output_gate(li, g)?;
                }
                ops.attn_out(li, g, fused)?;
            }
            Attention::Mla(m) => {
                ops.latent_project(li, m)?;
                ops.latent_attend(li, m)?;
                ops.latent_out(li, m, fused)?;
            }
            Attention::Linear(d) => {
                ops.delta_project(li, d)?;
                ops.delta_recur(li, d)?;
                ops.delta_out(li, d, fused)?;
            }
        }
        if !fused {
            ops.residual(li, layer.post_attn_norm.as_ref().map(|_| Norm::PostAttn))?;
        }
        ops.input_norm(li, Norm::Mlp)?;
        match &layer.ffn {
            FeedForward::Dense(m) => {
                ops.gate_up_act(li, m)?;
                ops.down(li, m, fused)?;
            }
            FeedForward::Moe(m) => {
                ops.moe_route(li, m)?;
                ops.moe_experts(li, m, fused)?;
            }
        }
        if !fused {
            ops.residual(li, layer.post_ffn_norm.as_ref().map(|_| Norm::PostFfn))?;
        }
        ops.end_layer(li)?;
    }
    Ok(())
}
