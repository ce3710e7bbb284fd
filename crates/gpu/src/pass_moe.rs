//! The ops of a mixture-of-experts block on the device: routing, the
//! experts' matmul over (token, slot) pairs, and the weighted combine.
//!
//! Routing stays on the device (no readback per layer): `moe_route` writes
//! each token's `top_k` expert ids and weights, `matmul_id` reads the id of
//! its pair to pick the expert's rows of a stacked matrix, and
//! `moe_combine` sums the pairs' rows back per token. With more pairs than
//! experts (prefill), `moe_group` sorts the pairs by expert and the matmul
//! runs a tile of an expert's rows for all its pairs in turn, reading the
//! expert's matrix once per step instead of once per routed token.

use crate::pass::{flat_grid, matmul_shape, matmul_source, row_grid, MATMUL_ID};

/// matmul_id.wgsl with its main: per pair, or grouped by expert.
fn matmul_id_main(grouped: bool) -> String {
    let main = match grouped {
        true => include_str!("shaders/matmul_id_grouped.wgsl"),
        false => include_str!("shaders/matmul_id_pairs.wgsl"),
    };
    MATMUL_ID.replace("//MAIN", main)
}
use crate::{DeviceBuf, DeviceWeight, Pass};

/// How router logits become expert weights ([`Pass::moe_route`]), as the
/// host's `moe::Routing`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RouteMode {
    /// Softmax over all experts, then the `top_k` largest.
    Softmax,
    /// Sigmoid scores, choice by score + bias within the `topk_group` best
    /// of `n_group` groups, weights × `scale`.
    SigmoidGrouped { n_group: usize, topk_group: usize, scale: f32 },
}

/// The pairs of a [`Pass::matmul_id`]: `t` tokens × `top_k` slots, their
/// expert ids in `ids` (none: pair p uses matrix p % top_k, a per-head
/// product), and this rank's experts `first ..`.
#[derive(Debug, Clone, Copy)]
pub struct Pairs<'a> {
    pub t: usize,
    pub top_k: usize,
    pub ids: Option<&'a DeviceBuf>,
    /// The global id of the weight's expert 0 (expert parallelism).
    pub first: usize,
    /// The pairs grouped by expert ([`Pass::moe_group`] of `ids` over this
    /// many experts): each expert's rows are then read once for all its
    /// pairs. `None`: one pass over an expert's rows per pair.
    pub group: Option<(&'a DeviceBuf, usize)>,
}

/// Words of [`Pass::moe_group`]'s output for `pairs` pairs of `ne` experts.
pub fn group_words(pairs: usize, ne: usize) -> usize {
    ne + 1 + pairs
}

impl Pass<'_> {
    /// Routes `t` tokens: `logits` (`t × ne`, becomes probabilities) →
    /// `ids`/`wts` (`t × top_k`); `sel` is `t × ne` scratch; `bias` the
    /// grouped mode's correction bias (`ne`).
    #[allow(clippy::too_many_arguments)]
    pub fn moe_route(
        &mut self,
        logits: &DeviceBuf,
        sel: &DeviceBuf,
        bias: Option<&DeviceBuf>,
        (t, ne, top_k, norm): (usize, usize, usize, bool),
        mode: RouteMode,
        ids: &DeviceBuf,
        wts: &DeviceBuf,
    ) {
        let (m, n_group, topk_group, scale) = match mode {
            RouteMode::Softmax => (0, 1, 1, 1.0f32),
            RouteMode::SigmoidGrouped { n_group, topk_group, scale } => (1, n_group, topk_group, scale),
        };
        let p = [t as u32, ne as u32, top_k as u32, m, norm as u32, n_group as u32, topk_group as u32, scale.to_bits()];
        let dummy = &self.gpu.dummy;
        let bias = bias.map_or(dummy, |b| &b.buf);
        let src = || include_str!("shaders/moe_route.wgsl").to_string();
        let bufs = [&logits.buf, &sel.buf, bias, &ids.buf, &wts.buf];
        self.dispatch("moe_route", src, &p, &bufs, [t.div_ceil(64) as u32, 1, 1]);
    }

    /// Groups the `pairs` routed pairs (their expert ids in `ids`, of `ne`
    /// experts) by expert into `group` ([`group_words`] words: each expert's
    /// first place, then the pairs in expert order), for [`Pairs::group`].
    pub fn moe_group(&mut self, ids: &DeviceBuf, (pairs, ne): (usize, usize), group: &DeviceBuf) {
        let p = [pairs as u32, ne as u32, 0, 0];
        let src = || include_str!("shaders/moe_group.wgsl").to_string();
        self.dispatch("moe_group", src, &p, &[&ids.buf, &group.buf], [1, 1, 1]);
    }

    /// The experts' product for every pair: `y[pair · y_stride + y_off ..]
    /// = x[row · x_stride ..] · W_eᵀ (+ bias_e)` for the experts `w` stacks
    /// ([`DeviceWeight::upload_experts`]), `row` the pair's token
    /// (`x_per_pair` false) or the pair itself. Pairs routed to experts `w`
    /// does not hold are skipped.
    pub fn matmul_id(
        &mut self,
        w: &DeviceWeight,
        (x, x_per_pair, x_stride): (&DeviceBuf, bool, usize),
        pairs: Pairs<'_>,
        y: &DeviceBuf,
        (y_off, y_stride): (usize, usize),
    ) {
        assert!(w.expert_rows > 0, "matmul_id needs a weight from upload_experts");
        let n = w.expert_rows;
        let count = pairs.t * pairs.top_k;
        let key = format!("matmul_id_{:?}", w.dtype);
        for part in &w.parts {
            let p = [
                n as u32,
                w.cols as u32,
                count as u32,
                part.bias.is_some() as u32,
                w.out_scale.to_bits(),
                0,
                y_off as u32,
                y_stride as u32,
                pairs.top_k as u32,
                x_per_pair as u32,
                (pairs.first + part.row0 / n) as u32,
                (part.rows / n) as u32,
                x_stride as u32,
                pairs.ids.is_none() as u32,
                pairs.group.map_or(0, |g| g.1) as u32,
                0,
            ];
            let dummy = &self.gpu.dummy;
            let w1 = part.w1.as_ref().map_or(dummy, |b| &b.buf);
            let bias = part.bias.as_ref().map_or(dummy, |b| &b.buf);
            let rows = matmul_shape(w.dtype).1;
            match pairs.group {
                // A workgroup per (row tile, expert of this part), looping over the expert's pairs.
                Some((group, _)) => {
                    let bufs = [&x.buf, &part.w0.buf, w1, bias, &y.buf, &group.buf];
                    let grid = row_grid(n.div_ceil(rows), part.rows / n);
                    let key = format!("{key}_grouped");
                    self.dispatch(&key, || matmul_source(&matmul_id_main(true), w.dtype), &p, &bufs, grid);
                }
                None => {
                    let ids = pairs.ids.map_or(dummy, |b| &b.buf);
                    let bufs = [&x.buf, &part.w0.buf, w1, bias, &y.buf, ids];
                    let src = || matmul_source(&matmul_id_main(false), w.dtype);
                    self.dispatch(&key, src, &p, &bufs, row_grid(n.div_ceil(rows), count));
                }
            }
        }
    }

    /// `y[y_off + t·h + c] (+)= Σ_j wts[t, j] · d[(t·top_k + j)·h + c]`
    /// over the pairs whose expert is in `first .. first + held`, plus
    /// `shared` (`t × h`) weighted by `sigmoid(shared_gate[t])` (or 1).
    #[allow(clippy::too_many_arguments)]
    pub fn moe_combine(
        &mut self,
        d: &DeviceBuf,
        (ids, wts): (&DeviceBuf, &DeviceBuf),
        (t, h, top_k): (usize, usize, usize),
        (first, held): (usize, usize),
        shared: Option<(&DeviceBuf, Option<&DeviceBuf>)>,
        (y, y_off, accumulate): (&DeviceBuf, usize, bool),
    ) {
        let flags =
            shared.is_some() as u32 | (shared.is_some_and(|s| s.1.is_some()) as u32) << 1 | (accumulate as u32) << 2;
        let p = [(t * h) as u32, h as u32, top_k as u32, first as u32, held as u32, flags, y_off as u32, 0];
        let dummy = &self.gpu.dummy;
        let s = shared.map_or(dummy, |s| &s.0.buf);
        let sg = shared.and_then(|s| s.1).map_or(dummy, |b| &b.buf);
        let src = || include_str!("shaders/moe_combine.wgsl").to_string();
        let bufs = [&d.buf, &ids.buf, &wts.buf, s, sg, &y.buf];
        self.dispatch("moe_combine", src, &p, &bufs, flat_grid(t * h));
    }
}
