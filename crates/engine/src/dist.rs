//! Running one request across a cluster of ranks (SPMD).
//!
//! World rank `r` sits in pipeline stage `r / tp` at tensor-parallel rank `r % tp`.
//! Data flows from the last stage (which embeds tokens) down to stage 0 (which
//! holds the final layers and the head), so rank 0 — the one with the tokenizer,
//! sampler and output — computes the logits, as in mlx-lm.
//!
//! Rank 0 drives every step. It sends a [`Header`] (plus token ids) to each rank
//! of the embedding stage; each stage then passes a header plus the residual
//! stream to the same tensor-parallel rank of the next stage. A prompt is sent
//! once and cut into chunks by the embedding stage, so stage `s` works on chunk
//! `c` while stage `s−1` works on chunk `c−1`: prefill is pipelined.

use crate::EngineError;
use comm::Group;
use model::plan::tp_slice;
use model::plan_split::pipeline_layers_balanced;
use model::{LogitsMode, Model, ShardSpec, Workspace};
use std::sync::atomic::{AtomicU64, Ordering};

/// How the model is split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    Pipeline,
    Tensor,
    /// Tensor parallel inside groups of `tp` ranks, pipeline across the groups.
    Hybrid {
        tp: usize,
    },
    /// Every rank of a group holds whole routed experts (balanced by the rank
    /// weights); attention, dense layers and shared experts split as in
    /// `Tensor`. Tokens are replicated in the group, so one all-reduce per MoE
    /// block combines the experts' outputs. `tp`: the group size, when the
    /// groups are pipeline stages (expert × pipeline, `--strategy expert --tp
    /// N`); `None` puts every rank in one group.
    Expert {
        tp: Option<usize>,
    },
}

impl Strategy {
    pub fn parse(s: &str, tp: Option<usize>) -> Result<Strategy, String> {
        match (s, tp) {
            ("pipeline", None) => Ok(Strategy::Pipeline),
            ("tensor", None) => Ok(Strategy::Tensor),
            ("expert", None) => Ok(Strategy::Expert { tp: None }),
            ("expert", Some(tp)) if tp >= 1 => Ok(Strategy::Expert { tp: Some(tp) }),
            ("hybrid", Some(tp)) if tp >= 1 => Ok(Strategy::Hybrid { tp }),
            ("hybrid", _) => Err("--strategy hybrid needs --tp N".into()),
            ("expert", Some(_)) => Err("--tp must be at least 1".into()),
            ("pipeline" | "tensor", Some(_)) => Err("--tp only applies to --strategy hybrid or expert".into()),
            (other, _) => Err(format!("unknown strategy '{other}' (pipeline, tensor, expert or hybrid)")),
        }
    }
}

/// This rank's place in the cluster.
pub struct Cluster {
    pub world: Group,
    /// The tensor-parallel group of this rank's stage.
    pub tp_group: Group,
    pub stages: usize,
    pub tp: usize,
    pub stage: usize,
    pub tp_rank: usize,
    /// Send a whole prompt at once so stages overlap (false: one chunk at a time).
    pub overlap_prefill: bool,
    /// Tensor parallelism that reproduces the single process bit for bit
    /// (see `model::plan::TpSlice::exact`).
    pub exact_tp: bool,
    /// `--strategy expert`: MoE blocks place whole experts on the ranks.
    pub expert: bool,
}

/// Routed experts per MoE layer, for `--strategy expert` (an error for a dense model).
fn n_experts(files: &formats::ModelFiles) -> Result<usize, EngineError> {
    let cfg = &files.config;
    let arch = model::Arch::from_name(&cfg.arch).ok_or_else(|| {
        model::ModelError::Unsupported(format!("--strategy expert: unknown architecture '{}'", cfg.arch))
    })?;
    match arch.spec(cfg)?.moe {
        Some(m) => Ok(m.n_experts),
        None => Err(model::ModelError::Unsupported(format!(
            "--strategy expert needs a mixture-of-experts model; {} is dense",
            cfg.arch
        ))
        .into()),
    }
}

/// What a rank reports to rank 0 when the cluster shuts down.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RankReport {
    /// High-water resident memory (`VmHWM`).
    pub peak_rss_bytes: u64,
    /// Bytes this rank sent to other ranks during one-token (decode) steps.
    pub decode_bytes_sent: u64,
    /// One-token steps this rank took part in.
    pub decode_steps: u64,
    /// Energy of this rank's prefill and decode steps (`crate::power`), where
    /// its host exposes power; `None` where it does not.
    pub power: Option<[crate::power::PhaseEnergy; 2]>,
}

/// Bytes of a `RankReport` on the wire: 3 counters, a flag, 2 × 4 power fields.
const REPORT_BYTES: usize = 8 * (3 + 1 + 8);

impl RankReport {
    fn here() -> RankReport {
        RankReport {
            peak_rss_bytes: peak_rss_bytes().unwrap_or(0),
            decode_bytes_sent: DECODE_BYTES.load(Ordering::Relaxed),
            decode_steps: DECODE_STEPS.load(Ordering::Relaxed),
            power: crate::power::global().ok().map(|m| m.phases()),
        }
    }

    fn to_bytes(self) -> [u8; REPORT_BYTES] {
        let mut w = vec![self.peak_rss_bytes, self.decode_bytes_sent, self.decode_steps, self.power.is_some() as u64];
        for p in self.power.unwrap_or_default() {
            w.extend([p.joules.to_bits(), p.seconds.to_bits(), p.peak_w.to_bits(), p.tokens]);
        }
        let mut b = [0u8; REPORT_BYTES];
        for (i, v) in w.into_iter().enumerate() {
            b[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    fn from_bytes(b: &[u8; REPORT_BYTES]) -> RankReport {
        let w = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
        let phase = |k: usize| crate::power::PhaseEnergy {
            joules: f64::from_bits(w(4 + 4 * k)),
            seconds: f64::from_bits(w(5 + 4 * k)),
            peak_w: f64::from_bits(w(6 + 4 * k)),
            tokens: w(7 + 4 * k),
        };
        let power = (w(3) != 0).then(|| [phase(0), phase(1)]);
        RankReport { peak_rss_bytes: w(0), decode_bytes_sent: w(1), decode_steps: w(2), power }
    }
}

/// This process's decode traffic (each rank is one process): bytes sent
/// during one-token steps, and how many such steps it ran.
static DECODE_BYTES: AtomicU64 = AtomicU64::new(0);
static DECODE_STEPS: AtomicU64 = AtomicU64::new(0);

/// Runs `f`, a step of `n_tokens` tokens (0: not counted), marking its power
/// phase; a decode step (`decode`: one new token per sequence) also counts
/// what this rank sends meanwhile, per token.
pub(crate) fn count_step<T>(decode: bool, n_tokens: usize, f: impl FnOnce() -> T) -> T {
    // The power meter attributes this step's energy to its phase.
    let phase = if decode { crate::power::Phase::Decode } else { crate::power::Phase::Prefill };
    let _phase = (n_tokens > 0).then(|| crate::power::enter(phase, n_tokens));
    if !decode || n_tokens == 0 {
        return f();
    }
    let before = comm::bytes_sent();
    let out = f();
    DECODE_BYTES.fetch_add(comm::bytes_sent() - before, Ordering::Relaxed);
    DECODE_STEPS.fetch_add(n_tokens as u64, Ordering::Relaxed);
    out
}

/// Runs `f` and counts what this rank sends meanwhile as decode traffic
/// (when `decode`), without counting a step: rank 0's half of a pipelined
/// batch (its sends; the step is counted when it comes back).
pub(crate) fn count_bytes<T>(decode: bool, f: impl FnOnce() -> T) -> T {
    if !decode {
        return f();
    }
    let before = comm::bytes_sent();
    let out = f();
    DECODE_BYTES.fetch_add(comm::bytes_sent() - before, Ordering::Relaxed);
    out
}

// Ops 1 and 2 were the contiguous-cache step protocol (`OP_STEP`/`OP_HIDDEN`)
// that `run` and `bench` used before issue 27; every path now sends
// `OP_BATCH`, and a rank that gets 1 or 2 says it is an unknown op.
/// Allocate the KV block pool (`n` blocks of `chunk` positions).
pub(crate) const OP_POOL: u32 = 3;
/// One batched step over paged sequences (see `dist_batch`).
pub(crate) const OP_BATCH: u32 = 4;
/// Liveness probe of an idle server: every rank answers rank 0 directly.
const OP_PING: u32 = 5;
/// Disk-tier operations of the prefix cache (`kv_disk`, see `dist_disk`).
pub(crate) const OP_DISK: u32 = 6;
/// A draft from the draft model on this rank (`--draft-rank`, see `draft::remote`).
pub(crate) const OP_DRAFT: u32 = 7;
const OP_SHUTDOWN: u32 = 9;
const PING_ACK: [u8; 4] = *b"pong";

/// The fixed-size message that precedes every step's payload.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Header {
    pub(crate) op: u32,
    /// Tokens in the payload.
    pub(crate) n: u32,
    /// 0 none, 1 last, 2 all (for a whole prompt: the mode of the final chunk).
    pub(crate) mode: u32,
    /// Tokens per chunk (steps sent to the embedding stage); for a batch, the
    /// length of its descriptor in u32s.
    pub(crate) chunk: u32,
    /// Non-zero: start a new sequence with a KV cache of this many positions.
    pub(crate) new_capacity: u32,
}

impl Header {
    fn to_bytes(self) -> [u8; 20] {
        let mut b = [0u8; 20];
        for (i, v) in [self.op, self.n, self.mode, self.chunk, self.new_capacity].into_iter().enumerate() {
            b[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes());
        }
        b
    }
    fn from_bytes(b: &[u8; 20]) -> Header {
        let w = |i: usize| u32::from_le_bytes(b[i * 4..i * 4 + 4].try_into().unwrap());
        Header { op: w(0), n: w(1), mode: w(2), chunk: w(3), new_capacity: w(4) }
    }
}

pub(crate) fn mode_code(m: LogitsMode) -> u32 {
    match m {
        LogitsMode::None => 0,
        LogitsMode::Last => 1,
        LogitsMode::All => 2,
        LogitsMode::Argmax => 3,
        LogitsMode::Verify => 4,
    }
}

pub(crate) fn mode_of(c: u32) -> LogitsMode {
    match c {
        1 => LogitsMode::Last,
        2 => LogitsMode::All,
        3 => LogitsMode::Argmax,
        4 => LogitsMode::Verify,
        _ => LogitsMode::None,
    }
}

pub(crate) fn comm_err(e: comm::CommError) -> EngineError {
    EngineError::Model(model::ModelError::Comm(e.to_string()))
}

impl Cluster {
    /// Arranges `world` for `strategy`.
    pub fn new(world: Group, strategy: Strategy, overlap_prefill: bool) -> Result<Cluster, EngineError> {
        let n = world.size();
        let tp = match strategy {
            Strategy::Pipeline => 1,
            Strategy::Tensor | Strategy::Expert { tp: None } => n,
            Strategy::Hybrid { tp } | Strategy::Expert { tp: Some(tp) } => tp,
        };
        if tp == 0 || !n.is_multiple_of(tp) {
            return Err(EngineError::BadArgument(format!("--tp {tp} does not divide {n} ranks")));
        }
        let (stage, tp_rank) = (world.rank() / tp, world.rank() % tp);
        let tp_group = if tp == n {
            world.split(0, tp_rank as u32).map_err(comm_err)?
        } else {
            world.split(stage as u32, tp_rank as u32).map_err(comm_err)?
        };
        let expert = matches!(strategy, Strategy::Expert { .. });
        Ok(Cluster { world, tp_group, stages: n / tp, tp, stage, tp_rank, overlap_prefill, exact_tp: false, expert })
    }

    pub fn rank(&self) -> usize {
        self.world.rank()
    }

    /// The shard this rank loads. `weights` (one per world rank) steer the split:
    /// stage weights are the sums over each stage's ranks.
    ///
    /// Layers are split so each stage's decode time (the weights it reads per
    /// token) follows its weight, as long as no stage then holds more than
    /// `model::plan_split::MEMORY_SLACK` × the fullest stage of the split by
    /// held bytes: every layer's weights plus what one sequence caches there
    /// at the model's context length (`kv_type`, f16 when `None`;
    /// `model::layer_memory`: a ring for windowed layers, the state for
    /// linear-attention ones), and the lm_head and tokenizer on the head
    /// stage.
    ///
    /// Why the KV cache counts: it is memory the stage must hold, and it is
    /// what makes layers cost more than the head at depth. Weights alone gave
    /// SmolLM2's head stage (lm_head 30 MB + tokenizer 19 MB, a layer 2.2 MB)
    /// 4 layers of 30, so the other stage did 26/30 of a long prompt's
    /// prefill; at its 8192 context (6.3 MB of f16 KV per layer) memory alone
    /// splits 12 / 18, and the time balance within the bound gives 10 / 20
    /// (the head stage's 4-sequence micro-batch 8.3 ms → 7.4 ms).
    pub fn shard_spec(
        &self,
        files: &formats::ModelFiles,
        weights: &[f64],
        block: usize,
        kv_type: Option<model::KvType>,
    ) -> Result<ShardSpec, EngineError> {
        let cfg = &files.config;
        let stage_w: Vec<f64> =
            (0..self.stages).map(|s| weights[s * self.tp..(s + 1) * self.tp].iter().sum()).collect();
        // Data-flow order: index 0 embeds. Stage p holds data-flow slot S−1−p.
        let flow_w: Vec<f64> = stage_w.iter().rev().copied().collect();
        // Each layer's own bytes: dense and MoE layers differ by an order of magnitude.
        let mut layer_bytes = vec![0f64; cfg.n_layers];
        for (name, t) in files.tensors.tensors.iter() {
            let layer = name.strip_prefix("model.layers.").and_then(|r| r.split('.').next()?.parse::<usize>().ok());
            if let Some(slot) = layer.and_then(|l| layer_bytes.get_mut(l)) {
                *slot += t.bytes().len() as f64;
            }
        }
        // Plus what one sequence keeps there at the full context: K/V rows
        // (a ring for sliding-window layers), or a linear-attention state.
        let kv_type = kv_type.unwrap_or(model::KvType::F16);
        let ctx = cfg.max_position_embeddings;
        let arch = model::Arch::from_name(&cfg.arch)
            .ok_or_else(|| model::ModelError::Unsupported(format!("unknown architecture '{}'", cfg.arch)))?;
        let cache = model::layer_memory::layer_cache_bytes(cfg, &arch.spec(cfg)?, kv_type, ctx);
        let held: Vec<f64> = layer_bytes.iter().zip(cache).map(|(b, c)| b + c).collect();
        let head = files.tensors.get("lm_head.weight").or_else(|_| files.tensors.get("model.embed_tokens.weight"));
        let head_read = head.map_or(0, |t| t.bytes().len()) as f64;
        // Rank 0 also holds the tokenizer (measured ~400 bytes per vocabulary entry).
        let head_held = head_read + (cfg.vocab_size * 384) as f64;
        // Decode time balanced within a memory bound (`model::plan_split`).
        let ranges = pipeline_layers_balanced(&layer_bytes, head_read, &held, head_held, &flow_w)
            .map_err(model::ModelError::from)?;
        let layers = ranges[self.stages - 1 - self.stage].clone();
        let tp = if self.tp > 1 {
            let w = &weights[self.stage * self.tp..(self.stage + 1) * self.tp];
            let slice =
                tp_slice(cfg.n_heads, cfg.n_kv_heads, cfg.intermediate_size, cfg.vocab_size, block, w, self.tp_rank)
                    .map_err(model::ModelError::from)?;
            let slice = if self.exact_tp { slice.exact(cfg.hidden_size, w, self.tp_rank) } else { slice };
            Some(if self.expert {
                slice.expert_parallel(n_experts(files)?).map_err(model::ModelError::from)?
            } else {
                slice
            })
        } else {
            None
        };
        Ok(ShardSpec { layers, has_embed: self.stage == self.stages - 1, has_head: self.stage == 0, tp })
    }

    pub(crate) fn embed_stage_ranks(&self) -> impl Iterator<Item = usize> + '_ {
        let base = (self.stages - 1) * self.tp;
        (base..base + self.tp).filter(move |&r| r != 0)
    }

    /// World rank this rank receives the residual stream from (stage + 1).
    pub(crate) fn upstream(&self) -> Option<usize> {
        (self.stage + 1 < self.stages).then(|| (self.stage + 1) * self.tp + self.tp_rank)
    }

    /// World rank this rank sends the residual stream to (stage − 1).
    pub(crate) fn downstream(&self) -> Option<usize> {
        (self.stage > 0).then(|| (self.stage - 1) * self.tp + self.tp_rank)
    }

    pub(crate) fn send_header(&self, to: usize, h: Header) -> Result<(), EngineError> {
        self.world.send(to, &h.to_bytes()).map_err(comm_err)
    }

    pub(crate) fn recv_header(&self, from: usize) -> Result<Header, EngineError> {
        let mut b = [0u8; 20];
        self.world.recv(from, &mut b).map_err(comm_err)?;
        Ok(Header::from_bytes(&b))
    }
}

/// Per-rank state for serving steps: the shard, its buffers and the current cache.
pub struct StageRunner<'a> {
    pub cluster: &'a Cluster,
    pub model: &'a Model,
    pub pool: &'a kernels::ThreadPool,
    pub ws: &'a mut Workspace,
    /// The paged KV pool of batched serving (`OP_POOL`), and each batched
    /// sequence's logits.
    pub paged: &'a mut Option<model::KvPool>,
    pub batch_logits: &'a mut Vec<Vec<f32>>,
    /// The prefix cache's disk tier on this rank (`OP_DISK`).
    pub disk: &'a mut crate::kv_disk::DiskSlot,
    /// The draft model this rank runs for rank 0 (`--draft-rank`, `OP_DRAFT`).
    pub draft: &'a mut Option<crate::draft::remote::RankDrafter>,
}

impl StageRunner<'_> {
    /// Handles one header (and its payload) arriving at this rank. Returns false on shutdown.
    fn handle(&mut self, h: Header, from: usize) -> Result<bool, EngineError> {
        let c = self.cluster;
        if h.op == OP_SHUTDOWN {
            // Rank 0 drives and never waits for a shutdown.
            if let Some(to) = c.downstream().filter(|&to| to != 0) {
                c.send_header(to, h)?;
            }
            // Report this rank's peak memory and decode traffic to rank 0 (`bench`).
            c.world.send(0, &RankReport::here().to_bytes()).map_err(comm_err)?;
            return Ok(false);
        }
        let n = h.n as usize;
        match h.op {
            OP_POOL => {
                if let Some(to) = c.downstream().filter(|&to| to != 0) {
                    c.send_header(to, h)?;
                }
                let mut pool = self.model.new_pool_windowed(h.chunk.max(1) as usize, n, h.new_capacity as usize);
                pool.states = self.model.state_pool(h.mode as usize);
                self.model.check_device_pool(&pool)?;
                *self.paged = Some(pool);
            }
            // Rank 0 counts its batches in `submit_batch` and `collect_batch`.
            OP_BATCH => self.handle_batch(h, from)?,
            OP_DISK => self.handle_disk(h, from)?,
            OP_DRAFT => {
                // Only rank 0 asks, and only ranks that read it directly answer.
                let mut history = vec![0u32; n];
                if n > 0 {
                    c.world.recv(from, bytemuck::cast_slice_mut(&mut history)).map_err(comm_err)?;
                }
                let keep = h.mode as usize;
                let reply = crate::draft::remote::answer(self.draft.as_mut(), (keep, &history), h.chunk as usize);
                c.world.send(0, bytemuck::cast_slice(&reply)).map_err(comm_err)?;
            }
            OP_PING => {
                if let Some(to) = c.downstream().filter(|&to| to != 0) {
                    c.send_header(to, h)?;
                }
                c.world.send(0, &PING_ACK).map_err(comm_err)?;
                // And this rank's latest power reading (`GET /cluster` shows it live).
                crate::power::live::send_reading(&c.world)?;
            }
            op => {
                return Err(EngineError::BadArgument(format!("rank {} got unknown op {op} from rank {from}", c.rank())))
            }
        }
        Ok(true)
    }

    /// The loop of every rank but 0: serve steps until shutdown.
    pub fn serve(&mut self) -> Result<(), EngineError> {
        let c = self.cluster;
        let source = c.upstream().unwrap_or(0);
        // Fault injection for the lost-peer test: die abruptly after N steps.
        let die_after: Option<usize> = std::env::var("SHARDLM_TEST_DIE_AFTER_STEPS").ok().and_then(|v| v.parse().ok());
        // And for the lost-cable test: after N steps, say so and sleep MS (`N:MS`).
        let pause_after: Option<(usize, u64)> = std::env::var("SHARDLM_TEST_PAUSE_AFTER_STEPS")
            .ok()
            .and_then(|v| v.split_once(':').and_then(|(n, ms)| Some((n.parse().ok()?, ms.parse().ok()?))));
        let mut steps = 0;
        loop {
            let h = c.recv_header(source)?;
            if !self.handle(h, source)? {
                return Ok(());
            }
            steps += 1;
            if die_after.is_some_and(|n| steps >= n) {
                std::process::abort();
            }
            if let Some((_, ms)) = pause_after.filter(|&(n, _)| steps == n) {
                eprintln!("test: pausing after {steps} steps");
                std::thread::sleep(std::time::Duration::from_millis(ms));
            }
        }
    }

    /// Rank 0: checks that every rank still answers (an idle server's probe,
    /// so a rank lost between requests is noticed before the next one), and
    /// keeps each rank's power reading that comes with its answer.
    pub fn ping(&mut self) -> Result<(), EngineError> {
        let h = Header { op: OP_PING, ..Default::default() };
        for r in self.cluster.embed_stage_ranks() {
            self.cluster.send_header(r, h)?;
        }
        for r in 1..self.cluster.world.size() {
            let mut b = [0u8; 4];
            self.cluster.world.recv(r, &mut b).map_err(comm_err)?;
            if b != PING_ACK {
                return Err(comm_err(comm::CommError::InvalidArgument(format!("rank {r} answered a ping with {b:?}"))));
            }
            crate::power::live::recv_reading(&self.cluster.world, r)?;
        }
        Ok(())
    }

    /// Rank 0: tells every rank to exit its loop; returns every rank's report
    /// (peak RSS, decode traffic), rank 0's first.
    pub fn shutdown(&mut self) -> Result<Vec<RankReport>, EngineError> {
        let h = Header { op: OP_SHUTDOWN, ..Default::default() };
        for r in self.cluster.embed_stage_ranks() {
            self.cluster.send_header(r, h)?;
        }
        let mut reports = vec![RankReport::here()];
        for r in 1..self.cluster.world.size() {
            let mut b = [0u8; REPORT_BYTES];
            self.cluster.world.recv(r, &mut b).map_err(comm_err)?;
            reports.push(RankReport::from_bytes(&b));
        }
        Ok(reports)
    }
}

/// A model identity all ranks must agree on (file name, size and shape).
pub fn fingerprint(path: &std::path::Path, cfg: &formats::ModelConfig) -> u64 {
    let len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let text = format!("{name}|{len}|{}|{}|{}|{}", cfg.arch, cfg.n_layers, cfg.hidden_size, cfg.vocab_size);
    // FNV-1a: stable across machines and builds.
    text.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100000001b3))
}

/// Peak resident memory of this process (`VmHWM` from /proc), in bytes.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
