//! A shard's layers on a GPU (`--device gpu`): the weights in device buffers
//! in their stored format, the paged KV pool on the device, and one
//! submission per step (see `shardlm_gpu`).
//!
//! The layers run through the one layer loop (`crate::layer_ops`), this
//! module's `layers` being the device's implementation of its ops; the
//! head is `GpuShard::head`. Around them the host computes what a step's
//! inputs need (token embeddings, rope tables, each row's position and
//! block table) and uploads them; the layers run on the device; the
//! residual stream comes back once per step (it is what a pipeline stage
//! sends on) and the logits once per step. The host
//! [`KvPool`] keeps the block bookkeeping (the scheduler's tables index the
//! device pool the same way); its rows are not written.
//!
//! Runs GQA with q/k norms, biases, sliding windows (with their own rope
//! and their own block group, as Gemma 3's) and sinks (gpt-oss); latent
//! attention (`gpu_mla`, DeepSeek); the dense gated MLP (SiLU, GELU,
//! clamped SwiGLU) or a mixture of experts (`gpu_moe`: softmax or
//! grouped-sigmoid routing, shared experts, expert parallelism); pre- and
//! sandwich RMSNorms; the weight types of `shardlm_gpu::WEIGHT_TYPES`.
//! Gated attention's output gate (Qwen3-Next, Qwen3.5) rides in the fused
//! projection row. Linear attention (Gated DeltaNet, `gpu_deltanet`) runs on
//! the device too, its conv and recurrent states in device slots that the
//! host pool's `states` is attached to. Whole-projection q/k norms under
//! tensor parallelism and quantized KV rows of an odd number of blocks are
//! refused at load.

use super::gpu_deltanet::{DeltaBufs, GpuDeltaNet, GpuStates};
use super::gpu_mla::{GpuMla, MlaBufs};
// The device KV pool: its making, memory check and block I/O.
#[path = "gpu_pool.rs"]
mod pool;
// The layer ops on the device, run by `layer_ops::run_decoder`.
#[path = "gpu_layers.rs"]
mod layers;
use super::gpu_moe::{GpuMoe, MoeBufs};
use crate::decoder::{Attention, DecoderLayer, FeedForward};
use crate::kv_cache::{KvPool, SeqKv};
use crate::layer_ops::run_decoder;
use crate::linear::Linear;
use crate::moe::ExpertAct;
use crate::{AllReduce, Model, ModelError, SeqStep, Workspace};
pub(crate) use pool::BlockData;
use shardlm_gpu::{Act, DeviceBuf, DeviceWeight, Gpu, KvElem, Pass};
use std::sync::{Arc, Mutex};

/// Where a shard computes (`--device cpu|gpu[:N]`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Device {
    #[default]
    Cpu,
    /// Adapter N, or the first hardware adapter.
    Gpu(Option<usize>),
}

impl Device {
    pub fn parse(s: &str) -> Result<Device, String> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "gpu" => Ok(Device::Gpu(None)),
            _ => match s.strip_prefix("gpu:").map(str::parse::<usize>) {
                Some(Ok(n)) => Ok(Device::Gpu(Some(n))),
                _ => Err(format!("'{s}' is not a device (cpu, gpu or gpu:N)")),
            },
        }
    }
}

impl From<shardlm_gpu::GpuError> for ModelError {
    fn from(e: shardlm_gpu::GpuError) -> ModelError {
        ModelError::Gpu(e.to_string())
    }
}

/// Projections of one input written side by side in each token row
/// (q‖k‖v, gate‖up): one stacked matrix when their types allow, else each
/// into its columns.
pub(crate) enum Proj {
    Stacked(DeviceWeight),
    Each(Vec<DeviceWeight>),
}

impl Proj {
    pub(crate) fn upload(gpu: &Gpu, name: &str, ls: &[&Linear]) -> Result<Proj, ModelError> {
        let parts = ls.iter().map(|l| stored(l)).collect::<Result<Vec<_>, _>>()?;
        Ok(match DeviceWeight::upload_stacked(gpu, name, &parts)? {
            Some(w) => Proj::Stacked(w),
            None => Proj::Each(ls.iter().map(|l| weight(gpu, l)).collect::<Result<_, _>>()?),
        })
    }

    /// Records `y[t, ..] = x[t, ..] · Wᵀ` for `n` rows (rows of `y`: all the
    /// projections' outputs side by side).
    pub(crate) fn record(&self, pass: &mut Pass<'_>, x: &DeviceBuf, n: usize, y: &DeviceBuf) {
        match self {
            Proj::Stacked(w) => pass.matmul(w, x, 0, n, y, 0),
            Proj::Each(ws) => {
                let stride = ws.iter().map(|w| w.rows).sum();
                let mut off = 0;
                for w in ws {
                    pass.matmul_cols(w, x, 0, n, y, (off, stride));
                    off += w.rows;
                }
            }
        }
    }

    pub(crate) fn bytes(&self) -> usize {
        match self {
            Proj::Stacked(w) => w.bytes(),
            Proj::Each(ws) => ws.iter().map(|w| w.bytes()).sum(),
        }
    }
}

struct GpuLayer {
    attn_norm: DeviceBuf,
    attn: Attn,
    /// Sandwich norms on the attention and MLP outputs (Gemma 3).
    post_norms: Option<(DeviceBuf, DeviceBuf)>,
    mlp_norm: DeviceBuf,
    ffn: Ffn,
}

struct GpuGqa {
    qkv: Proj,
    o: DeviceWeight,
    qk_norm: Option<(DeviceBuf, DeviceBuf)>,
    /// The q/k norms span the whole projection (MiniMax-M2), not one head.
    qk_norm_whole: bool,
    /// A per-head output gate rides in the projection row after v (Qwen3-Next, Qwen3.5).
    gated: bool,
    window: Option<usize>,
    /// A sink logit per query head (gpt-oss).
    sinks: Option<DeviceBuf>,
}

enum Attn {
    Gqa(Box<GpuGqa>),
    Mla(Box<GpuMla>),
    /// Linear attention (Gated DeltaNet), its states in [`GpuStates`].
    DeltaNet(Box<GpuDeltaNet>),
}

impl Attn {
    fn bytes(&self) -> usize {
        match self {
            Attn::Gqa(g) => g.qkv.bytes() + g.o.bytes(),
            Attn::Mla(m) => m.bytes(),
            Attn::DeltaNet(d) => d.bytes(),
        }
    }
}

enum Ffn {
    Dense { gate_up: Proj, down: DeviceWeight, act: Act },
    Moe(Box<GpuMoe>),
}

impl Ffn {
    fn bytes(&self) -> usize {
        match self {
            Ffn::Dense { gate_up, down, .. } => gate_up.bytes() + down.bytes(),
            Ffn::Moe(m) => m.bytes(),
        }
    }
}

/// Step buffers, sized for `rows` tokens.
struct Bufs {
    rows: usize,
    x: DeviceBuf,
    xn: DeviceBuf,
    /// Each token's q‖k‖v row (`hq + 2·hkv`).
    qkv: DeviceBuf,
    attn: DeviceBuf,
    o: DeviceBuf,
    /// Each token's gate‖up row (`2·ffn`), and the gated activation (`ffn`).
    gu: DeviceBuf,
    gate: DeviceBuf,
    cos: DeviceBuf,
    sin: DeviceBuf,
    /// The windowed layers' rope tables ([`crate::arch::LocalRope`]).
    cos_local: DeviceBuf,
    sin_local: DeviceBuf,
    /// Per row (position, table offset) and pool row: the full block group
    /// and the sliding-window group.
    tok: [DeviceBuf; 2],
    slots: [DeviceBuf; 2],
    moe: Option<MoeBufs>,
    mla: Option<MlaBufs>,
    delta: Option<DeltaBufs>,
}

/// The device KV pool, one K and one V buffer per layer, shaped as the host
/// pool it mirrors.
struct Kv {
    n_blocks: usize,
    n_window_blocks: usize,
    block: usize,
    k: Vec<DeviceBuf>,
    v: Vec<DeviceBuf>,
}

#[derive(Default)]
struct State {
    bufs: Option<Bufs>,
    kv: Option<Kv>,
    /// The block tables of the step's sequences, end to end: full group, window group.
    tables: [Option<DeviceBuf>; 2],
    head: Option<(usize, DeviceBuf, DeviceBuf)>,
    /// The linear layers' state slots, which the host pool's `states` is attached to.
    states: Option<Arc<GpuStates>>,
    /// Rows of the residual stream left on the device by the last
    /// `run_layers` on a shard with the head (0: read it from the host).
    x_rows: usize,
}

/// Device memory kept free beside the weights when they are checked: step
/// buffers and at least a small KV pool.
const STEP_RESERVE: u64 = 256 << 20;

pub struct GpuShard {
    gpu: Arc<Gpu>,
    /// What the device pool holds (`--kv-type`).
    kv: KvElem,
    layers: Vec<GpuLayer>,
    head: Option<(DeviceBuf, DeviceWeight)>,
    state: Mutex<State>,
}

impl std::fmt::Debug for GpuShard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GpuShard({}, {} layers)", self.gpu.info, self.layers.len())
    }
}

/// `l` as the device uploads it: type, shape, file-layout bytes, bias, scale.
pub(crate) fn stored(l: &Linear) -> Result<shardlm_gpu::StackPart<'_>, ModelError> {
    let w = &l.weight;
    if matches!(w.data, formats::TensorData::Packed(_)) {
        return Err(ModelError::Unsupported(format!("tensor '{}' was repacked for the CPU kernels", w.name)));
    }
    Ok((w.dtype, (l.out_features(), l.in_features()), w.bytes(), l.bias.as_deref(), w.out_scale))
}

pub(crate) fn weight(gpu: &Gpu, l: &Linear) -> Result<DeviceWeight, ModelError> {
    let (dtype, shape, bytes, bias, scale) = stored(l)?;
    Ok(DeviceWeight::upload(gpu, &l.weight.name, dtype, shape, bytes, bias, scale)?)
}

/// The device's form of an MLP's activation.
pub(crate) fn expert_act(a: ExpertAct) -> Result<Act, ModelError> {
    Ok(match a {
        ExpertAct::Silu => Act::Silu,
        ExpertAct::GeluTanh => Act::GeluTanh,
        ExpertAct::ClampedSwiglu { alpha, limit } => Act::ClampedSwiglu { alpha, limit },
    })
}

fn floats(gpu: &Gpu, what: &str, v: &[f32]) -> Result<DeviceBuf, ModelError> {
    Ok(gpu.buffer_with(what, bytemuck::cast_slice(v))?)
}

impl GpuShard {
    /// Checks that every layer of `model` is one the GPU backend runs, then
    /// uploads the weights. `model` was loaded in the file layout.
    pub fn upload(model: &Model, gpu: Gpu) -> Result<GpuShard, ModelError> {
        let refuse = |what: String| {
            ModelError::Unsupported(format!(
                "--device gpu: {what}, which the GPU backend does not run yet (use --device cpu)"
            ))
        };
        if model.shard.tp.as_ref().is_some_and(|t| t.exact) {
            return Err(refuse("--tp-exact (its column gathers)".into()));
        }
        // Refuse before uploading anything: the weights alone must fit, with
        // room for a modest KV pool and the step buffers.
        let need = Self::weight_bytes_of(model) as u64;
        gpu.check_fits(&format!("layers {:?}'s weights", model.shard.layers), need, STEP_RESERVE)?;
        let kv = match model.kv_type {
            crate::KvType::F32 => KvElem::F32,
            crate::KvType::F16 => KvElem::F16,
            crate::KvType::Q8_0 => KvElem::Q8_0,
            crate::KvType::Q4_0 => KvElem::Q4_0,
        };
        let gpu = Arc::new(gpu);
        let mut layers = Vec::with_capacity(model.layers.len());
        for (i, l) in model.layers.iter().enumerate() {
            let li = model.shard.layers.start + i;
            layers.push(Self::layer(&gpu, l, model.config.head_dim, model.shard.tp.is_some()).map_err(
                |e| match e {
                    ModelError::Unsupported(what) => refuse(format!("layer {li}: {what}")),
                    e => e,
                },
            )?);
        }
        let head = match (&model.final_norm, &model.lm_head) {
            (Some(n), Some(h)) => Some((floats(&gpu, "model.norm.weight", n)?, weight(&gpu, h)?)),
            _ => None,
        };
        gpu.check()?;
        let odd = layers.iter().find_map(|l| {
            let row = match &l.attn {
                Attn::Gqa(_) => model.local.n_kv_heads * model.config.head_dim,
                Attn::Mla(m) => m.width(),
                Attn::DeltaNet(_) => return None,
            };
            (!kv.fits_row(row)).then_some(row)
        });
        if let Some(row) = odd {
            let need = match kv {
                KvElem::F16 => "an even width",
                _ => "a multiple of 64 values (an even number of blocks, so rows start on a word)",
            };
            let what = format!("a {} KV cache with rows of {row} values (it needs {need}; --kv-type f32)", kv.name());
            return Err(refuse(what));
        }
        Ok(GpuShard { gpu, kv, layers, head, state: Mutex::new(State::default()) })
    }

    fn layer(gpu: &Gpu, l: &DecoderLayer, head_dim: usize, tp: bool) -> Result<GpuLayer, ModelError> {
        let attn = match &l.attn {
            Attention::Gqa(g) => Attn::Gqa(Box::new(Self::gqa(gpu, g, head_dim, tp)?)),
            Attention::Mla(m) => Attn::Mla(Box::new(GpuMla::upload(gpu, m)?)),
            Attention::Linear(d) => Attn::DeltaNet(Box::new(GpuDeltaNet::upload(gpu, d)?)),
        };
        let post_norms = match (&l.post_attn_norm, &l.post_ffn_norm) {
            (Some(a), Some(f)) => Some((floats(gpu, "post_attn_norm", a)?, floats(gpu, "post_ffn_norm", f)?)),
            (None, None) => None,
            _ => return Err(ModelError::Unsupported("a sandwich norm on one block only".into())),
        };
        let ffn = match &l.ffn {
            FeedForward::Dense(mlp) => Ffn::Dense {
                gate_up: Proj::upload(gpu, &mlp.gate.weight.name, &[&mlp.gate, &mlp.up])?,
                down: weight(gpu, &mlp.down)?,
                act: expert_act(mlp.act)?,
            },
            FeedForward::Moe(moe) => Ffn::Moe(Box::new(GpuMoe::upload(gpu, moe)?)),
        };
        Ok(GpuLayer {
            attn_norm: floats(gpu, "attn_norm", &l.attn_norm)?,
            attn,
            post_norms,
            mlp_norm: floats(gpu, "mlp_norm", &l.mlp_norm)?,
            ffn,
        })
    }

    fn gqa(gpu: &Gpu, g: &crate::decoder::Gqa, head_dim: usize, tp: bool) -> Result<GpuGqa, ModelError> {
        if g.qk_norm_whole && tp {
            // Each rank holds some heads: the mean square needs an all-reduce mid-layer.
            return Err(ModelError::Unsupported("whole-projection q/k norms under tensor parallelism".into()));
        }
        if head_dim > shardlm_gpu::MAX_HEAD_DIM {
            return Err(ModelError::Unsupported(format!(
                "head_dim {head_dim} (at most {})",
                shardlm_gpu::MAX_HEAD_DIM
            )));
        }
        let qk_norm = match (&g.q_norm, &g.k_norm) {
            (Some(q), Some(k)) => Some((floats(gpu, "q_norm", q)?, floats(gpu, "k_norm", k)?)),
            _ => None,
        };
        Ok(GpuGqa {
            qkv: match &g.gate {
                Some(gate) => Proj::upload(gpu, &g.q.weight.name, &[&g.q, &g.k, &g.v, gate])?,
                None => Proj::upload(gpu, &g.q.weight.name, &[&g.q, &g.k, &g.v])?,
            },
            gated: g.gate.is_some(),
            o: weight(gpu, &g.o)?,
            qk_norm,
            qk_norm_whole: g.qk_norm_whole,
            window: g.window,
            sinks: g.sinks.as_deref().map(|s| floats(gpu, "sinks", s)).transpose()?,
        })
    }

    /// Device bytes the shard's weights will take (every expert held; the
    /// latent folds in f32): what the upload is checked against.
    fn weight_bytes_of(model: &Model) -> usize {
        let layers: usize = model
            .layers
            .iter()
            .map(|l| {
                let ffn = match &l.ffn {
                    FeedForward::Dense(m) => m.bytes(),
                    FeedForward::Moe(m) => m.weight_bytes_total(),
                };
                l.attn.weight_bytes() + ffn
            })
            .sum();
        layers + model.lm_head.as_ref().map_or(0, Linear::weight_bytes)
    }

    /// The adapter, for logs.
    pub fn adapter(&self) -> &shardlm_gpu::AdapterReport {
        &self.gpu.info
    }

    /// Device bytes of the weights.
    pub fn weight_bytes(&self) -> usize {
        let l: usize = self.layers.iter().map(|l| l.attn.bytes() + l.ffn.bytes()).sum();
        l + self.head.as_ref().map_or(0, |(_, h)| h.bytes())
    }

    fn bufs(&self, m: &Model, rows: usize) -> Result<Bufs, ModelError> {
        let (cfg, g) = (&m.config, &*self.gpu);
        let (h, hd) = (cfg.hidden_size, cfg.head_dim);
        let (hq, hkv, ffn) = (m.local.n_heads * hd, m.local.n_kv_heads * hd, m.local.ffn);
        let half = cfg.rope_dim / 2;
        let gated = self.layers.iter().any(|l| matches!(&l.attn, Attn::Gqa(a) if a.gated));
        Ok(Bufs {
            rows,
            x: g.buffer("x", rows * h)?,
            xn: g.buffer("xn", rows * h)?,
            qkv: g.buffer("qkv", rows * (hq + 2 * hkv + if gated { hq } else { 0 }))?,
            attn: g.buffer("attn", rows * hq)?,
            o: g.buffer("o", rows * h)?,
            gu: g.buffer("gate_up", rows * 2 * ffn)?,
            gate: g.buffer("gate", rows * ffn)?,
            cos: g.buffer("cos", rows * half)?,
            sin: g.buffer("sin", rows * half)?,
            cos_local: g.buffer("cos_local", rows * half)?,
            sin_local: g.buffer("sin_local", rows * half)?,
            tok: [g.buffer("tok", rows * 2)?, g.buffer("tok_window", rows * 2)?],
            slots: [g.buffer("slots", rows)?, g.buffer("slots_window", rows)?],
            moe: GpuMoe::bufs(g, self.moe_layers(), rows, h)?,
            mla: GpuMla::bufs(g, self.mla_layers(), rows)?,
            delta: GpuDeltaNet::bufs(g, self.delta_layers(), rows)?,
        })
    }

    fn mla_layers(&self) -> impl Iterator<Item = &GpuMla> + Clone {
        self.layers.iter().filter_map(|l| match &l.attn {
            Attn::Mla(m) => Some(&**m),
            Attn::Gqa(_) | Attn::DeltaNet(_) => None,
        })
    }

    fn delta_layers(&self) -> impl Iterator<Item = &GpuDeltaNet> + Clone {
        self.layers.iter().filter_map(|l| match &l.attn {
            Attn::DeltaNet(d) => Some(&**d),
            Attn::Gqa(_) | Attn::Mla(_) => None,
        })
    }

    fn moe_layers(&self) -> impl Iterator<Item = &GpuMoe> + Clone {
        self.layers.iter().filter_map(|l| match &l.ffn {
            Ffn::Moe(m) => Some(&**m),
            Ffn::Dense { .. } => None,
        })
    }

    /// The owned layers over the `n` rows of `ws.x` (rope tables already in
    /// `ws.cos`/`ws.sin`), reading and writing the device KV pool that mirrors
    /// `paged`. `ws.x` holds the result.
    pub(crate) fn run_layers(
        &self,
        m: &Model,
        ws: &mut Workspace,
        seqs: &mut [SeqStep<'_>],
        mut paged: Option<&mut KvPool>,
        comm: &dyn AllReduce,
    ) -> Result<(), ModelError> {
        if m.spec.linear_attn.is_some() {
            crate::linear_attn::begin_states(seqs, paged.as_deref_mut())?;
        }
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        // Each sequence's part of the step of the linear layers.
        let mut delta_plan = Vec::new();
        if let Some(pool) = paged.as_deref_mut().filter(|p| p.states.is_some()) {
            self.attach_states(&mut st, pool, m.local.n_kv_heads * m.config.head_dim)?;
            let states = pool.states.as_mut().expect("filtered above");
            delta_plan = super::gpu_deltanet::plan_step(states, seqs)?;
        }
        let Some(pool) = paged.as_deref() else {
            return Err(ModelError::Unsupported("--device gpu runs paged sequences (the scheduler's) only".into()));
        };
        let cfg = &m.config;
        let (h, half) = (cfg.hidden_size, cfg.rope_dim / 2);
        let hkv = m.local.n_kv_heads * cfg.head_dim;
        let n: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        let gpu = &*self.gpu;
        if st.bufs.as_ref().is_none_or(|b| b.rows < n) {
            st.bufs = Some(self.bufs(m, n.next_power_of_two())?);
        }
        // Per layer: whether it reads the sliding-window block group.
        let win: Vec<bool> =
            (0..self.layers.len()).map(|li| pool.n_window_blocks > 0 && pool.is_window_layer(li)).collect();
        let block = pool.block;
        self.ensure_kv(&mut st, pool, hkv)?;
        // Per group: each row's (position, table offset) and pool row, and the
        // tables end to end (the window group's are its logical tables).
        let mut rows: [(Vec<u32>, Vec<u32>, Vec<u32>); 2] = Default::default();
        let mut logical = Vec::new();
        for s in seqs.iter() {
            let SeqKv::Paged { table, start, window, .. } = &s.cache else {
                return Err(ModelError::Unsupported("--device gpu runs paged sequences (the scheduler's) only".into()));
            };
            let len = s.tokens.len();
            if pool.n_window_blocks > 0 {
                window.logical_table(start + len, pool.block, &mut logical);
            }
            for (g, table) in [&table[..], &logical[..]].into_iter().enumerate() {
                if g == 1 && pool.n_window_blocks == 0 {
                    continue;
                }
                let (tok, slots, tables) = &mut rows[g];
                let off = tables.len() as u32;
                tables.extend_from_slice(table);
                for p in *start..start + len {
                    tok.extend([p as u32, off]);
                    slots.push(table[p / pool.block] * pool.block as u32 + (p % pool.block) as u32);
                }
            }
        }
        for (g, (_, _, tables)) in rows.iter().enumerate() {
            if st.tables[g].as_ref().is_none_or(|t| t.words() < tables.len()) {
                st.tables[g] = Some(gpu.buffer("tables", tables.len().next_power_of_two())?);
            }
        }
        let State { bufs, kv, tables: tb, states, .. } = &mut *st;
        let (b, kv) = (bufs.as_ref().expect("made above"), kv.as_ref().expect("made above"));
        let tb = [tb[0].as_ref().expect("made above"), tb[1].as_ref().expect("made above")];
        gpu.write_f32(&b.x, 0, &ws.x[..n * h]);
        gpu.write_f32(&b.cos, 0, &ws.cos[..n * half]);
        gpu.write_f32(&b.sin, 0, &ws.sin[..n * half]);
        if m.rope_local.is_some() {
            gpu.write_f32(&b.cos_local, 0, &ws.cos_local[..n * half]);
            gpu.write_f32(&b.sin_local, 0, &ws.sin_local[..n * half]);
        }
        if let Some(db) = &b.delta {
            let words: Vec<u32> = delta_plan.iter().flat_map(|q| [q.row as u32, q.len as u32, q.slot as u32]).collect();
            GpuDeltaNet::write_seqs(gpu, db, &words);
        }
        for (g, (tok, slots, tables)) in rows.iter().enumerate() {
            gpu.write_u32(&b.tok[g], 0, tok);
            gpu.write_u32(&b.slots[g], 0, slots);
            gpu.write_u32(tb[g], 0, tables);
        }
        let mut ops = layers::GpuLayers {
            shard: self,
            m,
            gpu,
            pass: Pass::new(gpu),
            b,
            kv,
            tables: tb,
            window_group: win,
            block,
            states: states.as_ref(),
            delta_plan: &delta_plan,
            comm,
            n,
        };
        run_decoder(&m.layers, &mut ops)?;
        ops.pass.submit()?;
        if m.shard.has_head {
            // The head reads its rows on the device; nothing sends `ws.x` on.
            st.x_rows = n;
        } else {
            let x = gpu.read_f32(&b.x, 0, n * h)?;
            ws.x[..n * h].copy_from_slice(&x);
            st.x_rows = 0;
        }
        Ok(())
    }

    /// Final norm and lm_head over the step's rows `picked` into `logits`
    /// (`rows × this rank's vocab rows`): from the residual stream the last
    /// `run_layers` left on the device, else from `input` (those rows, on the host).
    pub(crate) fn head(
        &self,
        m: &Model,
        picked: &[usize],
        input: &[f32],
        logits: &mut [f32],
    ) -> Result<(), ModelError> {
        let rows = picked.len();
        let Some((norm, lm_head)) = &self.head else { return Ok(()) };
        let (h, vocab, eps) = (m.config.hidden_size, lm_head.rows, m.config.rms_norm_eps);
        let gpu = &*self.gpu;
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.head.as_ref().is_none_or(|(r, _, _)| *r < rows) {
            let r = rows.next_power_of_two();
            st.head = Some((r, gpu.buffer("head_in", r * h)?, gpu.buffer("logits", r * vocab)?));
        }
        let on_device = std::mem::take(&mut st.x_rows);
        let (_, inp, out) = st.head.as_ref().expect("made above");
        let mut pass = Pass::new(gpu);
        match (&st.bufs, on_device) {
            (Some(b), n) if n > 0 && picked.iter().all(|&r| r < n) => {
                for (i, &r) in picked.iter().enumerate() {
                    pass.copy(&b.x, r * h, inp, i * h, h);
                }
            }
            _ => gpu.write_f32(inp, 0, &input[..rows * h]),
        }
        pass.rms_norm_inplace(inp, 0, norm, (h, rows, eps));
        pass.matmul(lm_head, inp, 0, rows, out, 0);
        pass.submit()?;
        logits[..rows * vocab].copy_from_slice(&gpu.read_f32(out, 0, rows * vocab)?);
        Ok(())
    }
}
