//! A mixture-of-experts block on the GPU (see `shardlm_gpu`'s `pass_moe`):
//! the router and the routing on the device, every held expert's gate‖up
//! and down projections stacked into one matrix each, and a combine that
//! adds the weighted expert rows (and the shared expert's) to the residual.
//! Nothing comes back to the host in the block: routing never waits for a
//! readback.

use super::gpu_shard::{expert_act, stored, weight, Proj};
use crate::linear::Linear;
use crate::moe::{Moe, Routing};
use crate::ModelError;
use shardlm_gpu::{Act, DeviceBuf, DeviceWeight, Gpu, Pairs, Pass, RouteMode};

/// The experts' gate and up projections: one stacked matrix (expert e's
/// gate rows, then its up rows), or two when their types differ.
enum ExpertsGateUp {
    Stacked(DeviceWeight),
    Split(DeviceWeight, DeviceWeight),
}

struct Shared {
    gate_up: Proj,
    down: DeviceWeight,
    /// The sigmoid gate (`[1, hidden]`), if any (qwen2_moe).
    gate: Option<DeviceWeight>,
    ffn: usize,
}

pub(crate) struct GpuMoe {
    router: DeviceWeight,
    mode: RouteMode,
    score_bias: Option<DeviceBuf>,
    top_k: usize,
    norm_topk: bool,
    n_experts: usize,
    first: usize,
    held: usize,
    /// One expert's intermediate width (this rank's slice of it).
    ffn: usize,
    act: Act,
    gate_up: ExpertsGateUp,
    down: DeviceWeight,
    shared: Option<Shared>,
}

/// Step buffers of the MoE layers, shared by all of them.
pub(crate) struct MoeBufs {
    logits: DeviceBuf,
    sel: DeviceBuf,
    ids: DeviceBuf,
    wts: DeviceBuf,
    gu: DeviceBuf,
    act: DeviceBuf,
    down: DeviceBuf,
    shared_gu: DeviceBuf,
    shared_act: DeviceBuf,
    shared_out: DeviceBuf,
    shared_gate: DeviceBuf,
    /// The pairs grouped by expert (`shardlm_gpu::group_words`).
    group: DeviceBuf,
}

fn experts(gpu: &Gpu, name: &str, ls: &[Vec<&Linear>]) -> Result<Option<DeviceWeight>, ModelError> {
    let parts =
        ls.iter().map(|e| e.iter().map(|l| stored(l)).collect::<Result<Vec<_>, _>>()).collect::<Result<Vec<_>, _>>()?;
    Ok(DeviceWeight::upload_experts(gpu, name, &parts)?)
}

impl GpuMoe {
    pub(crate) fn upload(gpu: &Gpu, moe: &Moe) -> Result<GpuMoe, ModelError> {
        let Some(e0) = moe.experts.first() else {
            return Err(ModelError::Unsupported("a MoE block holding no experts".into()));
        };
        let name = |l: &Linear| l.weight.name.clone();
        let mixed = || ModelError::Unsupported(format!("experts of mixed types or widths ({})", name(&e0.down)));
        let gates: Vec<Vec<&Linear>> = moe.experts.iter().map(|m| vec![&m.gate, &m.up]).collect();
        let gate_up = match experts(gpu, &name(&e0.gate), &gates)? {
            Some(w) => ExpertsGateUp::Stacked(w),
            None => {
                let g: Vec<Vec<&Linear>> = moe.experts.iter().map(|m| vec![&m.gate]).collect();
                let u: Vec<Vec<&Linear>> = moe.experts.iter().map(|m| vec![&m.up]).collect();
                match (experts(gpu, &name(&e0.gate), &g)?, experts(gpu, &name(&e0.up), &u)?) {
                    (Some(g), Some(u)) => ExpertsGateUp::Split(g, u),
                    _ => return Err(mixed()),
                }
            }
        };
        let downs: Vec<Vec<&Linear>> = moe.experts.iter().map(|m| vec![&m.down]).collect();
        let down = experts(gpu, &name(&e0.down), &downs)?.ok_or_else(mixed)?;
        let (mode, score_bias) = match moe.routing {
            Routing::Softmax => (RouteMode::Softmax, None),
            Routing::SigmoidGrouped { n_group, topk_group, scale } => {
                if n_group > 32 {
                    return Err(ModelError::Unsupported(format!("{n_group} expert groups (at most 32)")));
                }
                let bias = moe.score_bias.as_deref().map(|b| gpu.buffer_with("score_bias", bytemuck::cast_slice(b)));
                (RouteMode::SigmoidGrouped { n_group, topk_group, scale }, bias.transpose()?)
            }
        };
        let shared = match &moe.shared {
            Some(s) => Some(Shared {
                gate_up: Proj::upload(gpu, &name(&s.gate), &[&s.gate, &s.up])?,
                down: weight(gpu, &s.down)?,
                gate: moe.shared_gate.as_ref().map(|g| weight(gpu, g)).transpose()?,
                ffn: s.gate.out_features(),
            }),
            None => None,
        };
        Ok(GpuMoe {
            router: weight(gpu, &moe.router)?,
            mode,
            score_bias,
            top_k: moe.top_k,
            norm_topk: moe.norm_topk,
            n_experts: moe.router.out_features(),
            first: moe.first,
            held: moe.experts.len(),
            ffn: e0.gate.out_features(),
            act: expert_act(e0.act)?,
            gate_up,
            down,
            shared,
        })
    }

    pub(crate) fn bytes(&self) -> usize {
        let gu = match &self.gate_up {
            ExpertsGateUp::Stacked(w) => w.bytes(),
            ExpertsGateUp::Split(g, u) => g.bytes() + u.bytes(),
        };
        let shared = self
            .shared
            .as_ref()
            .map_or(0, |s| s.gate_up.bytes() + s.down.bytes() + s.gate.as_ref().map_or(0, DeviceWeight::bytes));
        self.router.bytes() + gu + self.down.bytes() + shared
    }

    /// Step buffers for `rows` tokens and hidden width `h`, large enough for
    /// every layer in `layers`.
    pub(crate) fn bufs<'a>(
        gpu: &Gpu,
        layers: impl Iterator<Item = &'a GpuMoe> + Clone,
        rows: usize,
        h: usize,
    ) -> Result<Option<MoeBufs>, ModelError> {
        let max = |f: &dyn Fn(&GpuMoe) -> usize| layers.clone().map(f).max();
        let Some(ne) = max(&|m| m.n_experts) else { return Ok(None) };
        let pairs = rows * max(&|m| m.top_k).unwrap_or(1);
        let ffn = max(&|m| m.ffn).unwrap_or(1);
        let sffn = max(&|m| m.shared.as_ref().map_or(1, |s| s.ffn)).unwrap_or(1);
        Ok(Some(MoeBufs {
            logits: gpu.buffer("moe.logits", rows * ne)?,
            sel: gpu.buffer("moe.sel", rows * ne)?,
            ids: gpu.buffer("moe.ids", pairs)?,
            wts: gpu.buffer("moe.wts", pairs)?,
            gu: gpu.buffer("moe.gate_up", pairs * 2 * ffn)?,
            act: gpu.buffer("moe.act", pairs * ffn)?,
            down: gpu.buffer("moe.down", pairs * h)?,
            shared_gu: gpu.buffer("moe.shared_gate_up", rows * 2 * sffn)?,
            shared_act: gpu.buffer("moe.shared_act", rows * sffn)?,
            shared_out: gpu.buffer("moe.shared_out", rows * h)?,
            shared_gate: gpu.buffer("moe.shared_gate", rows)?,
            group: gpu.buffer("moe.group", shardlm_gpu::group_words(pairs, ne))?,
        }))
    }

    /// Records the block over `n` normalized rows `xn` (`n × h`): its
    /// output into `y` (added to it when `accumulate`, the residual add).
    /// Records the router over `xn`'s `n` rows and each token's `top_k`
    /// expert ids and weights (into `b.ids`, `b.wts`).
    pub(crate) fn record_route(&self, pass: &mut Pass<'_>, b: &MoeBufs, (xn, n): (&DeviceBuf, usize)) {
        pass.matmul(&self.router, xn, 0, n, &b.logits, 0);
        let shape = (n, self.n_experts, self.top_k, self.norm_topk);
        pass.moe_route(&b.logits, &b.sel, self.score_bias.as_ref(), shape, self.mode, &b.ids, &b.wts);
    }

    /// Records the routed experts (ids from [`GpuMoe::record_route`]) and
    /// the shared expert over `xn`, combined into `y` (added when `accumulate`).
    pub(crate) fn record_experts(
        &self,
        pass: &mut Pass<'_>,
        b: &MoeBufs,
        (xn, n, h): (&DeviceBuf, usize, usize),
        (y, accumulate): (&DeviceBuf, bool),
    ) {
        let (k, f) = (self.top_k, self.ffn);
        // More pairs than experts held (a prefill chunk): group them by
        // expert, so each expert's rows are read once for all its pairs.
        let group = (n * k > self.held).then(|| {
            pass.moe_group(&b.ids, (n * k, self.n_experts), &b.group);
            (&b.group, self.n_experts)
        });
        let pairs = Pairs { t: n, top_k: k, ids: Some(&b.ids), first: self.first, group };
        match &self.gate_up {
            ExpertsGateUp::Stacked(w) => pass.matmul_id(w, (xn, false, h), pairs, &b.gu, (0, 2 * f)),
            ExpertsGateUp::Split(g, u) => {
                pass.matmul_id(g, (xn, false, h), pairs, &b.gu, (0, 2 * f));
                pass.matmul_id(u, (xn, false, h), pairs, &b.gu, (f, 2 * f));
            }
        }
        pass.act_mul(&b.gu, &b.act, (n * k, f), self.act);
        pass.matmul_id(&self.down, (&b.act, true, f), pairs, &b.down, (0, h));
        let shared = self.shared.as_ref().map(|s| {
            s.gate_up.record(pass, xn, n, &b.shared_gu);
            pass.act_mul(&b.shared_gu, &b.shared_act, (n, s.ffn), self.act);
            pass.matmul(&s.down, &b.shared_act, 0, n, &b.shared_out, 0);
            if let Some(g) = &s.gate {
                pass.matmul(g, xn, 0, n, &b.shared_gate, 0);
            }
            (&b.shared_out, s.gate.as_ref().map(|_| &b.shared_gate))
        });
        pass.moe_combine(&b.down, (&b.ids, &b.wts), (n, h, k), (self.first, self.held), shared, (y, 0, accumulate));
    }
}
