//! The cost model: memory per rank, predicted TTFT and decode speed, and the
//! bottleneck, for each way of splitting a model over `n` machines. The
//! equations and their assumptions are in docs/PLANNER.md.

use super::hardware::{Link, Machine};
use super::shape::Shape;
use serde::Serialize;

/// How the model is split.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    Single,
    Pipeline,
    Tensor,
    /// `tp` ranks per stage, `n / tp` stages.
    Hybrid,
    Expert,
}

/// The prediction for one strategy on `ranks` machines.
#[derive(Debug, Clone, Serialize)]
pub struct Prediction {
    pub strategy: Strategy,
    pub ranks: usize,
    /// Tensor-parallel width (hybrid).
    pub tp: usize,
    /// Bytes per rank: weights, KV cache at the context, activations and runtime.
    pub weights_bytes: Vec<f64>,
    pub kv_bytes: Vec<f64>,
    pub work_bytes: Vec<f64>,
    pub runtime_bytes: Vec<f64>,
    pub total_bytes: Vec<f64>,
    /// Smallest free memory over the ranks (negative: does not fit).
    pub margin_bytes: f64,
    pub fits: bool,
    pub ttft_s: f64,
    pub decode_tok_s: f64,
    pub decode_bottleneck: &'static str,
    pub prefill_bottleneck: &'static str,
    /// Bytes each rank sends per decoded token.
    pub wire_bytes_per_token: f64,
    /// `serve` with this many concurrent streams decoding at the context's
    /// depth: their aggregate tok/s (`super::serve`).
    pub serve_streams: usize,
    pub serve_tok_s: f64,
}

/// What the user plans to run.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    /// Prompt tokens (TTFT) and the depth decode runs at.
    pub context: usize,
    /// Prompt tokens per prefill step.
    pub chunk: usize,
    /// Bytes per cached K/V value (f16: 2, f32: 4, q8_0: 34/32, q4_0: 18/32).
    pub kv_elem: f64,
    /// Concurrent streams of the `serve` prediction.
    pub streams: usize,
}

/// Seconds measured on this machine by running rank 0's shard of the model
/// itself at the workload's context, chunk and KV type (`local` machines with
/// the model on disk; `super::calibrate`). Communication is not included.
#[derive(Debug, Clone, Serialize)]
pub struct Measured {
    /// Tensor-parallel width of the shard (1: the whole width).
    pub tp: usize,
    /// MoE blocks hold whole experts (`--strategy expert`).
    pub expert: bool,
    /// One layer of a decode step at depth `context`, attention included.
    pub layer_decode_s: f64,
    /// Final norm, head and argmax of one decode step.
    pub head_decode_s: f64,
    /// One layer over the whole prompt, every chunk.
    pub layer_prefill_s: f64,
    /// The head on the prompt's last token.
    pub head_prefill_s: f64,
    /// The attention kernel's slopes in one layer: seconds per cached key of
    /// a decode step, and per (row, key) pair of a prompt chunk.
    pub attn_s_per_key: f64,
    pub attn_s_per_pair: f64,
    /// What each sequence beyond the first adds to a batched decode step:
    /// per layer, and in the head (`serve`'s many streams; measured at a
    /// shallow depth, so without the attention the KV terms add).
    pub layer_row_s: f64,
    pub head_row_s: f64,
}

/// Runtime memory that is not weights, KV or activations: the binary and its
/// libraries, thread stacks, allocator slack (~10.0 MB for shardlm on Linux:
/// most of the 11.2–13.0 MB peak RSS of a tiny fixture run; 8.7 MB before
/// speculative decoding, the disk tier, NVML and the TCP beacon joined the
/// binary, 7.5 MB before the I-quant grids, the web page and the power
/// sampler), the tokenizer on rank 0
/// (~250 bytes per vocabulary entry, measured on SmolLM2's 49152), and, for
/// weights repacked at load (Q4_0, Q4_1, Q8_0: `kernels::packed`), ~10 MB:
/// the huge-page arena's part-filled pages and what the allocator keeps
/// from load (SmolLM2 at p = 512: 4.5–15.3 MB over the other terms across
/// single, pipeline 2 and tensor 2). It was 20 MB while the loader's
/// released file pages came back through large folios (ext4 on Linux 6.16+
/// maps a whole folio on one fault; `TensorStore::release_file_pages`).
fn runtime_bytes(shape: &Shape, rank0: bool) -> f64 {
    let packed = matches!(shape.quant.as_str(), "q4_0" | "q4_1" | "q8_0");
    10.0e6 + if rank0 { shape.vocab as f64 * 250.0 } else { 0.0 } + if packed { 10e6 } else { 0.0 }
}

/// Share of the attention weights and KV cache tensor rank `j` of `tp` holds:
/// whole GQA groups are dealt out (the first ranks get one more when they
/// don't divide), one KV head each when ranks outnumber them.
fn attn_share(shape: &Shape, j: usize, tp: usize) -> f64 {
    if tp <= 1 || shape.kv_heads == 0 {
        return 1.0;
    }
    if shape.kv_heads < tp {
        return 1.0 / shape.kv_heads as f64;
    }
    let groups = shape.kv_heads / tp + usize::from(j < shape.kv_heads % tp);
    groups as f64 / shape.kv_heads as f64
}

/// The scratch of one prompt chunk (`model::Workspace`): per token in f32 the
/// residual, its norm and the projection output (3h), q and the attention
/// output, k and v, gate and up (the dense MLP or one expert, whichever is
/// wider), rope's cos/sin; the 8-bit copy of the widest matmul input; and
/// three vocabulary-long logit rows (head, engine, sampler). As bench's
/// `workspace_bytes`, with the widths a tensor rank holds.
fn work_bytes(shape: &Shape, chunk: usize, tp: usize) -> f64 {
    let h = shape.hidden as f64;
    let t = tp as f64;
    let hq = (shape.heads * shape.head_dim) as f64 / t;
    let hkv = (shape.kv_heads * shape.head_dim) as f64 / t;
    let ffn =
        (shape.dense_bytes.max(shape.expert_bytes / shape.experts.max(1) as f64) * 8.0 / shape.bits() / (3.0 * h))
            .max(h)
            / t;
    let per_token = 4.0 * (3.0 * h + 2.0 * hq + 2.0 * hkv + 2.0 * ffn + shape.head_dim as f64);
    let act_q = ffn.max(h).max(hq) * 9.0 / 8.0;
    chunk as f64 * (per_token + act_q) + 12.0 * shape.vocab as f64
}

/// Resident bytes of an untied embedding table read through the file map:
/// each looked-up row maps the 64 KiB around it (the kernel's fault-around,
/// `fault_around_bytes`, when the page cache holds them), so `n` random
/// tokens touch `1 − exp(−n · 64 KiB / table)` of it (SmolLM2's 30 MB table
/// after 528 random tokens: 20.6 MB measured, 20.5 predicted).
fn embed_resident(table: f64, tokens: usize) -> f64 {
    if table <= 0.0 {
        return 0.0;
    }
    table * (1.0 - (-(tokens as f64) * 65536.0 / table).exp())
}

/// Layers per pipeline stage (stage 0 holds the head), as the engine splits
/// them: decode time balanced within a memory bound, the head and tokenizer on stage 0
/// (`model::plan_split::pipeline_layers_balanced`, the very function the engine uses).
/// The engine counts each layer's KV cache at the model's context length
/// (`engine::dist::Cluster::shard_spec`); a model given by its parameters has
/// no context of its own, so the plan's is used.
fn stage_layers(shape: &Shape, stages: usize, w: &Workload) -> Vec<usize> {
    let head = shape.head_read_bytes() + shape.vocab as f64 * 384.0;
    let flow = vec![1.0; stages];
    let ctx = shape.max_context.unwrap_or(w.context) as f64;
    // Each layer: its weights, its K/V rows at the context (a ring when
    // windowed) and its share of the linear-attention state, as the engine
    // counts them (`model::layer_memory`).
    let row = shape.kv_elems_per_layer as f64 * w.kv_elem;
    let layers: Vec<f64> = (0..shape.layers)
        .map(|l| shape.layer_bytes() + row * shape.kv_positions(l..l + 1, ctx) + shape.state_bytes_per_layer)
        .collect();
    let read = vec![shape.layer_bytes(); shape.layers];
    match model::plan_split::pipeline_layers_balanced(&read, shape.head_read_bytes(), &layers, head, &flow) {
        Ok(ranges) => (0..stages).map(|s| ranges[stages - 1 - s].len()).collect(),
        Err(_) => (0..stages).map(|i| shape.layers / stages + usize::from(i < shape.layers % stages)).collect(),
    }
}

fn fit(p: &mut Prediction, machines: &[Machine]) {
    p.total_bytes =
        (0..p.ranks).map(|r| p.weights_bytes[r] + p.kv_bytes[r] + p.work_bytes[r] + p.runtime_bytes[r]).collect();
    p.margin_bytes = (0..p.ranks).map(|r| machines[r].mem_bytes - p.total_bytes[r]).fold(f64::INFINITY, f64::min);
    p.fits = p.margin_bytes >= 0.0;
}

/// Decode time of a set of layers (and maybe the head) on one machine,
/// `share` of each weight (1/tp), at depth `depth`: (seconds, bound by memory?).
fn stage_decode(
    shape: &Shape,
    m: &Machine,
    layers: usize,
    head: bool,
    share: f64,
    depth: f64,
    w: &Workload,
) -> (f64, bool) {
    let split = shape.layer_active_bytes() - shape.attn_replicated_bytes;
    let bytes = (layers as f64 * split + if head { shape.head_read_bytes() } else { 0.0 }) * share
        + layers as f64 * shape.attn_replicated_bytes;
    let mem = bytes / m.decode_bytes_per_s + stage_kv_read(shape, m, layers, share, depth, w);
    let attn = shape.decode_attn_flops(depth) * layers as f64 / shape.layers as f64 * share / m.attn_flops;
    (mem.max(attn) + layers as f64 * m.layer_overhead_s, mem >= attn)
}

/// Seconds one sequence's KV (and linear-attention state) takes to read on a
/// stage of `layers` layers at depth `depth`.
fn stage_kv_read(shape: &Shape, m: &Machine, layers: usize, share: f64, depth: f64, w: &Workload) -> f64 {
    let kv = (layers * shape.kv_elems_per_layer) as f64
        * w.kv_elem
        * shape.kv_positions_per_layer(depth)
        * shape.kv_share(share);
    // A linear-attention state is read and written back once per token.
    let state = 2.0 * layers as f64 * shape.state_bytes_per_layer * share;
    (kv + state) / m.decode_bytes_per_s
}

/// Seconds of matmul compute one activation row costs on a stage (the
/// per-row part of a batched decode step, `super::serve`): the stage's share
/// of `2 · params` FLOPs at the machine's prefill rate.
fn stage_row(shape: &Shape, m: &Machine, layers: usize, head: bool, share: f64) -> f64 {
    let c = 1024.0;
    let attn = 2.0 * c * c * (shape.heads * shape.head_dim * shape.layers) as f64;
    let head_f = 2.0 * (shape.vocab * shape.hidden) as f64;
    let per_layer = (shape.prefill_flops(c) - attn - head_f) / c / shape.layers as f64;
    (layers as f64 * per_layer + if head { head_f } else { 0.0 }) * share / m.prefill_flops
}

/// Prefill of `c` tokens over some layers: compute, or the weights streamed
/// once per chunk if that is slower.
fn stage_prefill(shape: &Shape, m: &Machine, layers: usize, head: bool, share: f64, w: &Workload) -> (f64, bool) {
    let c = w.context as f64;
    let frac = layers as f64 / shape.layers as f64;
    let all = shape.prefill_flops(c);
    let attn = 2.0 * c * c * (shape.heads * shape.head_dim * shape.layers) as f64;
    let head_f = if head { 2.0 * (shape.vocab * shape.hidden) as f64 } else { 0.0 };
    let matmul = (all - attn - 2.0 * (shape.vocab * shape.hidden) as f64) * frac + head_f;
    let compute = (matmul / m.prefill_flops + attn * frac / m.attn_flops) * share;
    let chunks = (c / w.chunk as f64).ceil().max(1.0);
    let stream = chunks * layers as f64 * shape.layer_bytes() * share / m.decode_bytes_per_s;
    (compute.max(stream), compute >= stream)
}

/// Predicts `strategy` on the first `n` machines over `link`. `measured`:
/// shards timed on this machine, used for its `local` machines.
#[allow(clippy::too_many_arguments)]
pub fn predict(
    shape: &Shape,
    machines: &[Machine],
    link: &Link,
    strategy: Strategy,
    n: usize,
    tp: usize,
    w: &Workload,
    measured: &[Measured],
) -> Prediction {
    if strategy == Strategy::Expert {
        return predict_expert(shape, machines, link, n, w, measured);
    }
    predict_split(shape, machines, link, strategy, n, tp, w, measured, false)
}

/// Expert parallelism as the engine runs it (docs/ARCHITECTURE.md):
/// attention, dense layers and shared experts tensor-parallel, whole routed
/// experts per rank, and the same one all-reduce per block as tensor
/// parallelism. So memory and communication are tensor's; decode differs in
/// who reads the chosen experts: the busiest rank holds more than k/n of them
/// (one standard deviation above the mean of a binomial draw).
fn predict_expert(
    shape: &Shape,
    machines: &[Machine],
    link: &Link,
    n: usize,
    w: &Workload,
    measured: &[Measured],
) -> Prediction {
    let mut p = predict_split(shape, machines, link, Strategy::Tensor, n, n, w, measured, true);
    p.strategy = Strategy::Expert;
    p.tp = 1;
    if shape.experts > 0 && shape.active_experts > 0 && n > 1 {
        let k = shape.active_experts as f64;
        let q = 1.0 / n as f64;
        let busiest = ((k * q + (k * q * (1.0 - q)).sqrt()) / k).min(1.0);
        let active = shape.layers as f64 * shape.expert_bytes * k / shape.experts as f64;
        let extra = active * (busiest - q) / machines[0].decode_bytes_per_s;
        p.decode_tok_s = 1.0 / (1.0 / p.decode_tok_s + extra);
    }
    p
}

/// [`predict`] for every strategy but expert (`expert`: the tensor split with
/// whole experts per rank, whose measured shard differs).
#[allow(clippy::too_many_arguments)]
fn predict_split(
    shape: &Shape,
    machines: &[Machine],
    link: &Link,
    strategy: Strategy,
    n: usize,
    tp: usize,
    w: &Workload,
    measured: &[Measured],
    expert: bool,
) -> Prediction {
    let ms = &machines[..n];
    let depth = w.context as f64;
    let act = 4.0 * shape.hidden as f64; // one token's residual, f32
    let (stages, tp) = match strategy {
        Strategy::Single => (1, 1),
        Strategy::Pipeline => (n, 1),
        Strategy::Tensor => (1, n),
        Strategy::Hybrid => (n / tp.max(1), tp.max(1)),
        Strategy::Expert => (1, 1),
    };
    let share = 1.0 / tp as f64;
    let layers = stage_layers(shape, stages, w);
    let mut p = Prediction {
        strategy,
        ranks: n,
        tp,
        weights_bytes: vec![0.0; n],
        kv_bytes: vec![0.0; n],
        work_bytes: vec![0.0; n],
        runtime_bytes: (0..n).map(|r| runtime_bytes(shape, r == 0)).collect(),
        total_bytes: vec![],
        margin_bytes: 0.0,
        fits: false,
        ttft_s: 0.0,
        decode_tok_s: 0.0,
        decode_bottleneck: "memory bandwidth",
        prefill_bottleneck: "compute",
        wire_bytes_per_token: 0.0,
        serve_streams: w.streams,
        serve_tok_s: 0.0,
    };
    // Per stage, for the serving prediction: its slowest rank's batch-1
    // decode, one sequence's KV read, and prefill per prompt token.
    let mut serve_stages: Vec<super::serve::StageCost> = Vec::with_capacity(stages);
    let kv_position = shape.kv_elems_per_layer as f64 * w.kv_elem;
    // Stage s holds layers[s]; the last stage (data-flow order) also the head;
    // the first the embedding. Ranks r = s·tp + j.
    let mut dec_total = 0.0;
    let mut dec_mem_bound = true;
    let mut pf_stage_max: f64 = 0.0;
    let mut pf_total = 0.0;
    #[allow(clippy::needless_range_loop)] // `s` also names the stage's ranks
    for s in 0..stages {
        let head = s == 0;
        let embed = s == stages - 1;
        let mut stage_dec: f64 = 0.0;
        let mut stage_pf: f64 = 0.0;
        let mut stage_kv: f64 = 0.0;
        let mut stage_row_s: f64 = 0.0;
        // Whether every rank of the stage timed its batched rows (they add to
        // the weights' time); otherwise estimated rows overlap it.
        let mut stage_rows_add = true;
        for j in 0..tp {
            let r = s * tp + j;
            let a_share = attn_share(shape, j, tp);
            let split_attn = shape.attn_bytes - shape.attn_replicated_bytes;
            let mut wb = layers[s] as f64
                * (shape.attn_replicated_bytes
                    + split_attn * a_share
                    + (shape.layer_bytes() - shape.attn_bytes) * share);
            if head {
                wb += shape.head_read_bytes() * share;
            }
            if embed && !(head && shape.head_reads_embed) {
                // An untied table is read in place: on this machine only the
                // looked-up rows' pages count (a preset counts it whole).
                wb += if !shape.head_reads_embed && ms[r].name.starts_with("local") {
                    embed_resident(shape.embed_bytes * share, w.context.min(shape.vocab) / tp)
                } else {
                    shape.embed_bytes * share
                };
            }
            // Tensor parallelism copies its slice of the matrices split by input
            // columns (o, down) into memory of its own (counted above) and
            // gives the file pages it read back (`model::slice::cols`). A tied
            // embedding is the head's copy of the rank's vocabulary rows, which
            // the lookups read too (counted above with the head).
            p.weights_bytes[r] = wb;
            // Stage s holds layers from the sum of the later stages' on
            // (data-flow order: the last stage embeds, layers 0..).
            let first: usize = layers[s + 1..].iter().sum();
            let positions = shape.kv_positions(first..first + layers[s], depth);
            p.kv_bytes[r] = positions * kv_position * shape.kv_share(a_share)
                + layers[s] as f64 * shape.state_bytes_per_layer * share;
            // Tensor groups all-reduce every layer through the transport's
            // buffers (shm rings, socket buffers): ~1.5 MB per peer, measured.
            p.work_bytes[r] = work_bytes(shape, w.chunk.min(w.context), tp) + 1.5e6 * (tp - 1) as f64;
            let (mut d, mut mem) = stage_decode(shape, &ms[r], layers[s], head, share, depth, w);
            let mut pf = stage_prefill(shape, &ms[r], layers[s], head, share, w).0;
            let mut kv1 = stage_kv_read(shape, &ms[r], layers[s], share, depth, w);
            let mut row = stage_row(shape, &ms[r], layers[s], head, share);
            // This machine, with the model's own shard timed on it: the
            // measured seconds replace the bandwidth and FLOP estimates (which
            // still name the bottleneck: memory if streaming explains half).
            let timed = measured.iter().find(|m| m.tp == tp && m.expert == expert);
            if let Some(t) = timed.filter(|_| ms[r].name.starts_with("local")) {
                let stream = (d - layers[s] as f64 * ms[r].layer_overhead_s).max(0.0);
                d = layers[s] as f64 * t.layer_decode_s + if head { t.head_decode_s } else { 0.0 };
                mem = stream >= 0.5 * d;
                pf = layers[s] as f64 * t.layer_prefill_s + if head { t.head_prefill_s } else { 0.0 };
                kv1 = layers[s] as f64 * t.attn_s_per_key * depth;
                // The timed prefill's cost per prompt row: real rows carry
                // the norms, activation quantization and thread joins a FLOP
                // rate leaves out (the GEMM probe ran 1.6× the real rate).
                row = pf / w.context.max(1) as f64;
                // Measured batched rows replace it when the probe timed them.
                if t.layer_row_s > 0.0 {
                    row = layers[s] as f64 * t.layer_row_s + if head { t.head_row_s } else { 0.0 };
                } else {
                    stage_rows_add = false;
                }
            } else {
                stage_rows_add = false;
            }
            stage_row_s = stage_row_s.max(row);
            stage_kv = stage_kv.max(kv1);
            if d > stage_dec {
                stage_dec = d;
                dec_mem_bound = mem;
            }
            stage_pf = stage_pf.max(pf);
        }
        dec_total += stage_dec;
        serve_stages.push(super::serve::StageCost {
            decode_1: stage_dec,
            kv_1: stage_kv.min(stage_dec),
            row: stage_row_s,
            rows_add: stage_rows_add,
        });
        pf_stage_max = pf_stage_max.max(stage_pf);
        pf_total += stage_pf;
    }
    // Communication per token: tensor groups all-reduce twice per layer, once
    // for the vocab-parallel embedding's lookup (on the embedding stage) and
    // once for the head's argmax; stages pass one residual on.
    let tp_comm = if tp > 1 {
        (shape.layers as f64 * 2.0 + 1.0) * link.all_reduce(act, tp) + link.all_reduce(8.0, tp)
    } else {
        0.0
    };
    // A stage waits a whole stage's compute for its input, so it has parked:
    // each hand-off pays the wake-up too.
    let pp_comm = if stages > 1 { stages as f64 * (link.send(act) + link.handoff_s) } else { 0.0 };
    let t = dec_total + tp_comm + pp_comm;
    p.decode_tok_s = 1.0 / t;
    let comm = tp_comm + pp_comm;
    p.decode_bottleneck = if comm > dec_total {
        link_kind(link, act)
    } else if dec_mem_bound {
        "memory bandwidth"
    } else {
        "compute"
    };
    // Serving: a tensor group all-reduces each step's rows; a pipeline's
    // micro-batch passes every hop of the ring.
    p.serve_tok_s = super::serve::aggregate_tok_s(&serve_stages, w.streams, |m| {
        let rows = act * m as f64;
        (if tp > 1 {
            (shape.layers as f64 * 2.0 + 1.0) * link.all_reduce(rows, tp) + link.all_reduce(8.0, tp)
        } else {
            0.0
        }) + if stages > 1 { stages as f64 * (link.send(rows) + link.handoff_s) } else { 0.0 }
    });
    p.wire_bytes_per_token = if tp > 1 { shape.layers as f64 * 2.0 * act * (tp - 1) as f64 } else { 0.0 }
        + if stages > 1 { act } else { 0.0 };
    // Prefill: pipeline stages overlap chunk by chunk; tensor groups all-reduce
    // each chunk's activations twice a layer.
    let c = w.context as f64;
    let chunks = (c / w.chunk as f64).ceil().max(1.0);
    // Stages overlap chunk by chunk: the first chunk passes every stage in
    // turn (the fill), the other K − 1 follow at the slowest stage's pace.
    // One chunk is no overlap at all: the sum of the stages.
    let pf_compute = pf_total / chunks + pf_stage_max * (chunks - 1.0) / chunks;
    let pf_comm =
        if tp > 1 { (shape.layers as f64 * 2.0 + 1.0) * chunks * link.all_reduce(act * c / chunks, tp) } else { 0.0 }
            + if stages > 1 { (stages - 1) as f64 * chunks * link.send(act * c / chunks) } else { 0.0 };
    p.ttft_s = pf_compute + pf_comm;
    p.prefill_bottleneck = if pf_comm > pf_compute { "link bandwidth" } else { "compute" };
    fit(&mut p, ms);
    p
}

/// Which side of the link dominates a message of `bytes`.
fn link_kind(link: &Link, bytes: f64) -> &'static str {
    if link.latency_s > bytes / link.bytes_per_s {
        "link latency"
    } else {
        "link bandwidth"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::hardware::{link_preset, machine_preset};
    use crate::plan::shape::from_config;

    /// Per-rank KV bytes at `tp` tensor ranks (one stage) of the HF config `v`.
    fn kv_per_rank(v: &serde_json::Value, tp: usize) -> Vec<f64> {
        let shape = from_config(v, "test", Some("bf16")).unwrap();
        let machines = vec![machine_preset("h200").unwrap(); tp];
        let link = link_preset("nvlink").unwrap();
        let w = Workload { context: 4096, chunk: 512, kv_elem: 2.0, streams: 8 };
        let strategy = if tp == 1 { Strategy::Single } else { Strategy::Tensor };
        predict(&shape, &machines, &link, strategy, tp, tp, &w, &[]).kv_bytes
    }

    /// MLA's q_a and kv_a down-projections are replicated on every tensor
    /// rank (model::mla): a rank's weights are those bytes whole plus its
    /// share of everything else.
    #[test]
    fn mla_down_projections_are_replicated_across_tensor_ranks() {
        let mla = serde_json::json!({"hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128,
            "num_key_value_heads": 128, "vocab_size": 129280, "intermediate_size": 18432,
            "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
            "v_head_dim": 128});
        let shape = from_config(&mla, "test", Some("bf16")).unwrap();
        assert_eq!(shape.attn_replicated_bytes, 7168.0 * (1536.0 + 512.0 + 64.0) * 2.0);
        let weights = |tp: usize| {
            let machines = vec![machine_preset("h200").unwrap(); tp];
            let w = Workload { context: 4096, chunk: 512, kv_elem: 2.0, streams: 8 };
            let strategy = if tp == 1 { Strategy::Single } else { Strategy::Tensor };
            predict(&shape, &machines, &link_preset("nvlink").unwrap(), strategy, tp, tp, &w, &[]).weights_bytes
        };
        let (one, four) = (weights(1)[0], weights(4)[0]);
        let repl = 61.0 * shape.attn_replicated_bytes;
        assert!(((four - repl) - (one - repl) / 4.0).abs() < 1.0, "tp4 {four} vs tp1 {one}");
    }

    /// MLA caches one latent row per position that every tensor rank holds
    /// whole (model::mla): the per-rank cache does not shrink with the
    /// tensor-parallel degree. GQA's K/V heads are dealt out, so it does.
    #[test]
    fn mla_latent_cache_is_replicated_across_tensor_ranks() {
        let mla = serde_json::json!({"hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128,
            "num_key_value_heads": 128, "vocab_size": 129280, "intermediate_size": 18432,
            "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
            "v_head_dim": 128, "n_routed_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 2048,
            "n_shared_experts": 1, "first_k_dense_replace": 3});
        let one = kv_per_rank(&mla, 1)[0];
        assert_eq!(one, 61.0 * (512.0 + 64.0) * 2.0 * 4096.0);
        for tp in [2, 4, 8] {
            assert_eq!(kv_per_rank(&mla, tp), vec![one; tp], "tp {tp}");
        }
        let gqa = serde_json::json!({"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 8, "vocab_size": 128256, "intermediate_size": 14336});
        let one = kv_per_rank(&gqa, 1)[0];
        assert_eq!(kv_per_rank(&gqa, 4), vec![one / 4.0; 4]);
    }
}
