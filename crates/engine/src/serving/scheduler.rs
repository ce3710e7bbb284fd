//! Continuous batching over a paged KV pool.
//!
//! Each call to [`Scheduler::step`] runs one forward pass for a batch made of:
//! - one token of every running sequence that is decoding;
//! - prefill chunks of sequences still reading their prompt, oldest first,
//!   until the step holds `step_tokens` tokens.
//!
//! So the weights are read once per step for all decoding sequences, and a new
//! request's prefill joins between decode steps instead of stalling them for
//! its whole prompt.
//!
//! # Micro-batches in flight (pipelines)
//! A pipeline of S stages gets up to S steps in flight at once
//! ([`Engine::max_in_flight`]): the decoding sequences are shared out between
//! them, and a prompt's next chunk leaves before its previous one came back,
//! so every stage works on its own micro-batch, as vLLM's and SGLang's
//! pipeline schedulers do. Each rank runs the steps in the order they were
//! sent, so a step may use blocks or state slots that an earlier step in
//! flight still writes. A sequence counts `sub_len` positions sent beside
//! `kv_len` computed ([`super::seq`]); one process (S = 1) sends one step and
//! collects it at once, as before.
//!
//! # Sequence state
//! A sequence's `history` is its prompt plus every sampled token; `kv_len`
//! positions of it have KV in its blocks. It needs `history[kv_len..]` run: more
//! than one token is prefill, exactly one is a decode step (the last sampled
//! token); the step's logits are sampled when the run reaches the end.
//!
//! # Admission, memory and preemption
//! Waiting requests are admitted first come, first served while the batch has
//! room and the pool can hold the whole prompt (after the prefix cache took its
//! share). Decode allocates a block each time a sequence crosses a block
//! boundary; when none is left, the most recently admitted sequence is
//! preempted: its blocks are released (its full ones stay cached) and it waits
//! at the front of the queue to be recomputed, as in vLLM's recompute
//! preemption. A request that could not fit even alone is refused at submission.
//!
//! # Hybrid models (linear attention)
//! A sequence also holds a recurrent-state slot ([`StateSlots`]) while it
//! runs. Prefix reuse stops at the deepest cached block boundary that also
//! has a state snapshot; the sequence's first step restores it. Prefill
//! pieces end on multiples of the delta rule's chunk (so the chunked prefill
//! computes the same chunks however a prompt is split, and a cached run
//! equals the cold one bit for bit), and one piece ends at each prompt's last
//! snapshot boundary, where the state is snapshotted. Preemption and
//! cancellation give the slot back with the blocks (recompute, from the
//! deepest snapshot).
//!
//! # Sliding-window layers
//! With a window group ([`WindowGroup`], `n_window_blocks > 0`) a sequence
//! also holds window blocks for its windowed layers: reserved at admission
//! (it waits while the group lacks them), allocated before each step for the
//! positions it may write, given back after it as they fall out of the
//! window. Prefix reuse stops at the deepest block boundary whose window
//! blocks are cached too.

use super::blocks::{block_hashes, BlockHash, BlockManager, BlockStats};
use super::disk_tier::{DiskTier, DiskTierStats};

// The disk tier's admission and switch (`scheduler/disk.rs`).
mod disk;
// Re-forming after a lost cluster (`scheduler/recovery.rs`).
mod recovery;
use super::flight::{Flight, FlightItem, PlanItem};
use super::seq::{finish, hybrid_piece, register_full_blocks, release_seq, Groups, Seq};
use super::state_slots::StateSlots;
use super::windows::{SeqWindow, WindowGroup};
use crate::dist_batch::{BatchItem, PoolShape};
use crate::draft::{DraftParams, Drafter, NgramPool};
use crate::generate::{Engine, FinishReason, GenerateHooks, GenerateRequest, TextStream};
use crate::sampler::Sampler;
use crate::tokenizer::StreamDecoder;
use crate::EngineError;
use model::LogitsMode;
use std::collections::VecDeque;
use std::time::Instant;

#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Positions per KV block.
    pub block: usize,
    pub n_blocks: usize,
    /// Most sequences in one step.
    pub max_batch: usize,
    /// Most tokens in one step (decode tokens plus prefill chunks).
    pub step_tokens: usize,
    pub prefix_cache: bool,
    /// Blocks of the sliding-window group (0: windowed layers keep every
    /// position in the full blocks); [`super::windows::window_blocks_for`]
    /// sizes it.
    pub n_window_blocks: usize,
}

/// A sequence's outcome, given to [`SeqHooks::done`].
#[derive(Debug, Clone)]
pub struct SeqOutcome {
    pub output_ids: Vec<u32>,
    pub finish_reason: FinishReason,
    pub stop_string: Option<String>,
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV came from the prefix cache.
    pub cached_tokens: usize,
    /// `[prompt_len × vocab]` logits of every prompt position, when the
    /// request asked for them (`want_prompt_logits`: `run --dump-logits`).
    pub prompt_logits: Option<Vec<f32>>,
    /// Speculative decoding: draft tokens checked, and how many were accepted.
    pub drafted: usize,
    pub accepted: usize,
}

/// The per-request callbacks: [`GenerateHooks`] for every step, and `done` once.
pub trait SeqHooks: GenerateHooks + Send {
    fn done(&mut self, result: Result<SeqOutcome, EngineError>);
}

pub struct Submission {
    pub request: GenerateRequest,
    pub hooks: Box<dyn SeqHooks>,
}

/// Counters for `/metrics`.
#[derive(Debug, Clone, Copy, Default)]
pub struct SchedulerStats {
    pub blocks: BlockStats,
    pub block: usize,
    pub running: usize,
    pub waiting: usize,
    pub prefix_queries: u64,
    pub prefix_hits: u64,
    pub prefix_cached_tokens: u64,
    pub preemptions: u64,
    /// Re-warms that gave way to a request ([`super::rewarm`]).
    pub rewarm_yields: u64,
    /// Sequences in the last step.
    pub batch_size: usize,
    /// The sliding-window group's blocks (all zero without one).
    pub window_blocks: BlockStats,
    /// Bytes of this process's pool ([`Engine::pool_bytes`]).
    pub pool_bytes: usize,
    /// The disk tier's counters (`serve --kv-disk`), when it is on.
    pub disk: Option<DiskTierStats>,
    /// Speculative decoding: verify steps, draft tokens checked, accepted.
    pub spec_steps: u64,
    pub spec_drafted: u64,
    pub spec_accepted: u64,
}

pub struct Scheduler {
    pub(super) cfg: SchedulerConfig,
    pub(super) blocks: BlockManager,
    pub(super) waiting: VecDeque<Seq>,
    /// Finished replies to re-warm when idle ([`super::rewarm`]).
    pub(super) rewarm: VecDeque<Vec<u32>>,
    pub(super) rewarm_on: bool,
    /// In admission order (the last one is preempted first).
    pub(super) running: Vec<Seq>,
    pub(super) eos_ids: Vec<u32>,
    pub(super) vocab: usize,
    context: usize,
    pub(super) stats: SchedulerStats,
    /// Recurrent-state slots and snapshots (hybrid models only).
    pub(super) states: Option<StateSlots>,
    /// The sliding-window block group (windowed models, when configured).
    pub(super) windows: Option<WindowGroup>,
    /// Speculative decoding ([`super::spec`]): the default for requests, and
    /// the n-gram pool shared by them (made at the first speculating request).
    pub(super) draft: Option<DraftParams>,
    pub(super) ngram_pool: Option<NgramPool>,
    /// A drafter in place of the n-gram lookup ([`Scheduler::set_drafter`]).
    pub(super) drafter: Option<Box<dyn Drafter>>,
    /// The draft model on another rank ([`Scheduler::set_remote_drafter`]).
    pub(super) remote_drafter: Option<crate::draft::RemoteDrafter>,
    /// Whether a draft must be expected to pay to be sent ([`super::spec`]);
    /// off: every draft goes (tests, measurements).
    pub(super) draft_gate: bool,
    /// Steps sent and not yet collected, oldest first.
    pub(super) in_flight: VecDeque<Flight>,
    /// The next [`Seq::id`].
    next_id: u64,
    /// The prefix cache's disk tier ([`Scheduler::enable_disk`]).
    disk: Option<DiskTier>,
    /// A pipeline run with `--no-prefill-overlap`: a prompt's next chunk
    /// waits for the previous one to come back.
    no_overlap: bool,
}

impl Scheduler {
    /// Allocates the pool on the engine (every rank of its cluster).
    pub fn new(engine: &mut Engine, cfg: SchedulerConfig) -> Result<Scheduler, EngineError> {
        if cfg.block == 0 || cfg.n_blocks == 0 || cfg.max_batch == 0 || cfg.step_tokens == 0 {
            return Err(EngineError::BadArgument(format!("bad scheduler configuration {cfg:?}")));
        }
        // Hybrid models: a live state slot per batch row, and as many
        // snapshot slots for the prefix cache.
        let states = engine.model.spec.linear_attn.is_some().then(|| {
            let snaps = if cfg.prefix_cache { cfg.max_batch } else { 0 };
            StateSlots::new(cfg.max_batch, snaps, cfg.block)
        });
        let n_slots = states.as_ref().map_or(0, |s| s.idle_slots());
        let windows = window_group(engine, &cfg)?;
        let n_window_blocks = windows.as_ref().map_or(0, |w| w.n_blocks());
        engine.init_pool(PoolShape { block: cfg.block, n_blocks: cfg.n_blocks, n_window_blocks, n_slots })?;
        let pool_bytes = engine.pool_bytes().unwrap_or(0);
        Ok(Scheduler {
            states,
            windows,
            blocks: BlockManager::new(cfg.n_blocks, cfg.block, cfg.prefix_cache),
            waiting: VecDeque::new(),
            rewarm: VecDeque::new(),
            rewarm_on: false,
            running: Vec::new(),
            in_flight: VecDeque::new(),
            next_id: 0,
            disk: None,
            no_overlap: engine.cluster.as_ref().is_some_and(|c| !c.overlap_prefill),
            eos_ids: engine.eos_ids.clone(),
            vocab: engine.model.config.vocab_size,
            context: engine.context_length(),
            draft: None,
            ngram_pool: None,
            drafter: None,
            remote_drafter: None,
            // `SHARDLM_DRAFT_ALWAYS=1` sends every draft (tests of the verify
            // path through the binaries, as `set_draft_gate(false)`).
            draft_gate: std::env::var("SHARDLM_DRAFT_ALWAYS").map_or(true, |v| v != "1"),
            stats: SchedulerStats { block: cfg.block, pool_bytes, ..Default::default() },
            cfg,
        })
    }

    pub fn stats(&self) -> SchedulerStats {
        SchedulerStats {
            blocks: self.blocks.stats(),
            running: self.running.len(),
            waiting: self.waiting.len(),
            window_blocks: self.windows.as_ref().map(|w| w.stats()).unwrap_or_default(),
            disk: self.disk.as_ref().map(|d| d.stats),
            ..self.stats
        }
    }

    /// Whether any request is waiting or running.
    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty() || !self.in_flight.is_empty() || !self.rewarm.is_empty()
    }

    /// Queues a request, or refuses it at once (`done` with the error).
    pub fn submit(&mut self, sub: Submission) {
        let Submission { request: req, mut hooks } = sub;
        if let Err(e) = self.validate(&req) {
            hooks.done(Err(e));
            return;
        }
        let greedy = req.sampling.temperature <= 0.0 && req.sampling.repetition_penalty == 1.0;
        let spec = self.spec_for(&req);
        self.waiting.push_back(Seq {
            spec,
            id: 0,
            sub_len: 0,
            prompt_logits: Vec::new(),
            sampler: Sampler::new(req.sampling.clone()),
            history: req.prompt_ids.clone(),
            out_ids: Vec::new(),
            stream: TextStream::new(&req.stop_strings),
            decoder: StreamDecoder::new(),
            blocks: Vec::new(),
            kv_len: 0,
            hashes: Vec::new(),
            cached_tokens: None,
            greedy,
            finish: None,
            slot: None,
            restore: None,
            window: SeqWindow::default(),
            rewarm: false,
            req,
            hooks,
        });
    }

    fn validate(&self, req: &GenerateRequest) -> Result<(), EngineError> {
        req.sampling.validate().map_err(EngineError::BadArgument)?;
        Scheduler::validate_draft(req)?;
        let prompt = &req.prompt_ids;
        if prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        if let Some(&id) = prompt.iter().find(|&&id| id as usize >= self.vocab) {
            return Err(EngineError::TokenOutOfRange { id, vocab: self.vocab });
        }
        if prompt.len() + req.max_tokens > self.context {
            return Err(EngineError::PromptTooLong {
                prompt: prompt.len(),
                generate: req.max_tokens,
                ctx: self.context,
            });
        }
        let pool = self.cfg.n_blocks * self.cfg.block;
        if prompt.len() + req.max_tokens > pool {
            return Err(EngineError::BadArgument(format!(
                "the request needs {} KV positions (prompt {} + max_tokens {}) but the KV pool holds {pool} \
                 (raise --kv-cache-bytes)",
                prompt.len() + req.max_tokens,
                prompt.len(),
                req.max_tokens
            )));
        }
        Ok(())
    }

    pub(super) fn groups(&mut self) -> Groups<'_> {
        Groups { blocks: &mut self.blocks, states: &mut self.states, windows: &mut self.windows }
    }

    /// Fails every running and waiting sequence with `msg` and frees its blocks
    /// (after a step went wrong in a way that leaves their state unknown).
    pub fn abort_all(&mut self, msg: &str) {
        for mut s in std::mem::take(&mut self.running).into_iter().chain(std::mem::take(&mut self.waiting)) {
            release_seq(self.groups(), &mut s);
            s.hooks.done(Err(EngineError::BadArgument(msg.to_string())));
        }
    }

    /// Ends and removes every sequence whose client went away.
    fn drop_cancelled(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].hooks.cancelled() {
                let mut s = self.running.remove(i);
                release_seq(self.groups(), &mut s);
                s.hooks.done(Err(EngineError::Cancelled));
            } else {
                i += 1;
            }
        }
        let (keep, gone): (VecDeque<Seq>, VecDeque<Seq>) =
            std::mem::take(&mut self.waiting).into_iter().partition(|s| !s.hooks.cancelled());
        self.waiting = keep;
        for mut s in gone {
            s.hooks.done(Err(EngineError::Cancelled));
        }
    }

    /// Moves waiting sequences into the batch while there is room. Blocks of
    /// a prompt's prefix that RAM lost but the disk tier holds are loaded
    /// (with no step in flight: otherwise this asks for a drain and stops).
    fn admit(&mut self, engine: &mut Engine) -> Result<(), EngineError> {
        let b = self.cfg.block;
        if let Some(d) = self.disk.as_mut() {
            d.drain = false;
        }
        while self.running.len() < self.cfg.max_batch {
            let Some(mut s) = self.waiting.pop_front() else { break };
            // Reuse cached full blocks, leaving at least one token to run (its
            // logits start the output).
            let hashes = block_hashes(&s.history, b);
            // A request for every prompt position's logits computes them all.
            let reusable = if s.req.want_prompt_logits { 0 } else { (s.history.len() - 1) / b };
            let mut got = self.blocks.acquire_prefix(&hashes, reusable);
            // The disk tier may hold the prefix's next blocks (and a hybrid
            // model's state snapshots) that RAM lost.
            let disk = self.disk.as_ref();
            let disk_run = disk.map_or(0, |d| d.on_disk(&hashes[got.len()..reusable.max(got.len())]));
            // Hybrid: only as deep as the deepest state snapshot (in RAM or
            // on disk); windowed: as deep as the window blocks before it are
            // cached.
            let mut j = got.len() + disk_run;
            while j > 0 {
                let state_ok = self.states.as_ref().is_none_or(|st| {
                    (j * b).is_multiple_of(st.granularity)
                        && (st.has(hashes[j - 1]) || disk.is_some_and(|d| d.has_state(hashes[j - 1])))
                });
                if state_ok && self.windows.as_ref().is_none_or(|w| w.can_resume(&hashes, j)) {
                    break;
                }
                j -= 1;
            }
            let in_ram = got.len().min(j);
            self.blocks.release(&got[in_ram..]);
            got.truncate(in_ram);
            let on_disk = j - in_ram;
            let state_from_disk = j > 0 && self.states.as_ref().is_some_and(|st| !st.has(hashes[j - 1]));
            // A load needs every rank's answer: with steps in flight, drain first.
            if (on_disk > 0 || state_from_disk) && !self.in_flight.is_empty() {
                self.blocks.release(&got);
                self.waiting.push_front(s);
                if let Some(d) = self.disk.as_mut() {
                    d.drain = true;
                }
                break;
            }
            let needed = s.history.len().div_ceil(b) - got.len();
            // Keep one block in hand for the running sequences' decode.
            let headroom = usize::from(!self.running.is_empty());
            // Windowed: room in the window group for what it may hold at once.
            let len = s.req.prompt_ids.len() + s.req.max_tokens;
            let window_room = self.windows.as_mut().is_none_or(|w| w.reserve(&mut s.window, len));
            if self.blocks.available() < needed + headroom || !window_room {
                self.blocks.release(&got);
                if let Some(w) = self.windows.as_mut() {
                    w.release(&mut s.window);
                }
                self.waiting.push_front(s);
                break;
            }
            if let Some(w) = self.windows.as_mut() {
                w.acquire(&mut s.window, &hashes, got.len());
            }
            s.blocks = got;
            for _ in 0..needed {
                s.blocks.push(self.blocks.allocate().expect("counted available blocks"));
            }
            // Load what the disk holds into the first fresh blocks (and the
            // state snapshot into a snapshot slot); the prefix then reaches
            // as deep as every rank loaded and a state snapshot exists.
            let mut reused = in_ram;
            if on_disk > 0 || state_from_disk {
                match self.load_from_disk(engine, &mut s, &hashes, in_ram, j, state_from_disk) {
                    Ok(Some(r)) => reused = r,
                    Ok(None) => {
                        // The fallback needs blocks the pool does not have now.
                        release_seq(self.groups(), &mut s);
                        self.waiting.push_front(s);
                        break;
                    }
                    Err(e) => {
                        release_seq(self.groups(), &mut s);
                        self.waiting.push_front(s);
                        return Err(e);
                    }
                }
                if s.cached_tokens.is_none() {
                    if let Some(d) = self.disk.as_mut() {
                        d.stats.hit_tokens += (reused.saturating_sub(in_ram) * b) as u64;
                    }
                }
            }
            let restore = match self.states.as_mut() {
                Some(st) if reused > 0 => st.lookup(hashes[reused - 1]),
                _ => None,
            };
            if s.cached_tokens.is_none() {
                self.stats.prefix_queries += 1;
                self.stats.prefix_hits += u64::from(reused > 0);
                self.stats.prefix_cached_tokens += (reused * b) as u64;
                s.cached_tokens = Some(reused * b);
            }
            s.kv_len = reused * b;
            s.sub_len = s.kv_len;
            s.id = self.next_id;
            self.next_id += 1;
            s.hashes = hashes[..reused].to_vec();
            if let Some(st) = self.states.as_mut() {
                s.slot = Some(st.take_live().expect("a live slot per batch row"));
                if let Some(r) = restore {
                    st.pin(r);
                }
                s.restore = restore;
            }
            self.running.push(s);
        }
        Ok(())
    }

    /// Gives back the youngest running sequence's blocks and requeues it first.
    fn preempt_youngest(&mut self) {
        if let Some(mut s) = self.running.pop() {
            release_seq(self.groups(), &mut s);
            if s.rewarm {
                return; // nobody waits for it: not worth a recomputation
            }
            s.forget_kv();
            self.stats.preemptions += 1;
            self.waiting.push_front(s);
        }
    }

    /// Makes sure every decoding sequence has a block for its next position,
    /// preempting the youngest sequences when the pool runs dry.
    fn reserve_decode_blocks(&mut self) {
        let b = self.cfg.block;
        let mut i = 0;
        while i < self.running.len() {
            let s = &self.running[i];
            if s.blocks.len() * b > s.kv_len + s.pending() - 1 {
                i += 1;
                continue;
            }
            match self.blocks.allocate() {
                Some(blk) => {
                    self.running[i].blocks.push(blk);
                    i += 1;
                }
                // Preempting may remove sequence i itself (it is the youngest).
                None => self.preempt_youngest(),
            }
        }
    }

    /// Makes sure every running sequence has the window blocks for the
    /// positions its next step may write (preempting the youngest sequences
    /// should the group run dry, which the reservations rule out).
    fn reserve_window_blocks(&mut self) {
        let step = self.cfg.step_tokens;
        let mut i = 0;
        while i < self.running.len() {
            let Some(w) = self.windows.as_mut() else { return };
            let s = &mut self.running[i];
            let upto = s.sub_len + s.ready().min(step).min(s.step_cap());
            if w.grow(&mut s.window, upto) {
                i += 1;
            } else {
                self.preempt_youngest();
            }
        }
    }

    /// Runs one step: admits, batches, runs the model, samples. Errors of the
    /// step end the sequences in it and the scheduler stays usable, except a
    /// cluster failure ([`EngineError::is_cluster_failure`]): that is returned
    /// with every sequence kept, for the caller to re-form the cluster and
    /// [`Scheduler::requeue_all`].
    ///
    /// In a pipeline of S stages up to S steps are in flight
    /// ([`Engine::max_in_flight`]): this sends new micro-batches until S are
    /// out (or nothing is ready), then collects and samples the oldest. The
    /// decoding sequences are shared out between the free micro-batches, and a
    /// prompt's next chunk may leave before its previous one came back, so
    /// that one long prompt keeps every stage busy too.
    pub fn step(&mut self, engine: &mut Engine) -> Result<(), EngineError> {
        self.drop_cancelled();
        self.admit_rewarm();
        self.admit(engine)?;
        self.yield_rewarm();
        self.reserve_decode_blocks();
        self.reserve_window_blocks();
        self.prepare_drafts(engine);
        // Blocks that became cached go to disk before any step may reuse them.
        if let Some(d) = self.disk.as_mut() {
            d.sync(engine, &mut self.blocks)?;
        }
        let draining = self.disk.as_ref().is_some_and(|d| d.drain);
        let depth = if draining { 0 } else { engine.max_in_flight().max(1) };
        while self.in_flight.len() < depth {
            let Some((flight, items)) = self.plan(depth) else { break };
            let sent = {
                let items: Vec<BatchItem<'_>> = items.iter().map(|it| it.item(&self.running)).collect();
                self.stats.batch_size = items.len();
                engine.submit_batch(&items)
            };
            match sent {
                Ok(()) => self.in_flight.push_back(flight),
                Err(e) => {
                    let mut flight = flight;
                    self.unsend(&mut flight);
                    return self.fail_flight(flight, e);
                }
            }
        }
        let Some(flight) = self.in_flight.pop_front() else { return Ok(()) };
        let vocab = self.vocab;
        let result = engine.collect_batch().map(|l| {
            l.iter().zip(&flight.items).map(|(row, it)| {
                if it.all || it.drafts > 0 {
                    row.clone()
                } else {
                    row[..vocab.min(row.len())].to_vec()
                }
            })
        });
        let logits: Vec<Vec<f32>> = match result {
            Ok(l) => l.collect(),
            Err(e) => return self.fail_flight(flight, e),
        };
        // The restores ran: unpin them.
        if let Some(st) = self.states.as_mut() {
            flight.restores.iter().for_each(|&(_, r)| st.unpin(r));
            flight.snaps.iter().for_each(|&(_, h, slot)| st.commit(h, slot));
            if let Some(d) = self.disk.as_mut() {
                flight.snaps.iter().for_each(|&(_, h, slot)| d.note_snapshot(slot, h));
            }
        }
        tracing::debug!(
            "step: {} seqs, {} tokens, {:.2} ms",
            flight.items.len(),
            flight.tokens,
            flight.sent.elapsed().as_secs_f64() * 1e3
        );
        let tok = engine.tokenizer.as_ref();
        let mut finished = Vec::new();
        for (&FlightItem { id, n, all, drafts }, mut row) in flight.items.iter().zip(logits) {
            // Gone (cancelled, preempted, failed) since the step was sent.
            let Some(i) = self.running.iter().position(|s| s.id == id) else { continue };
            if drafts > 0 {
                if self.verify(i, &row, tok) {
                    finished.push(i);
                }
                continue;
            }
            let s = &mut self.running[i];
            if all {
                // Every position's logits: keep them, sample from the last.
                s.prompt_logits.extend_from_slice(&row);
                row = row.split_off(row.len().saturating_sub(self.vocab));
            }
            s.kv_len += n;
            register_full_blocks(&mut self.blocks, self.windows.as_mut(), s);
            let prompt = s.req.prompt_ids.len();
            if s.kv_len - n < prompt {
                s.hooks.on_prefill(s.kv_len.min(prompt), prompt);
            }
            if s.kv_len == s.history.len()
                && row.len() == self.vocab
                && self.running[i].sample(&mut row, tok, None, &self.eos_ids).0
            {
                finished.push(i);
            }
        }
        finished.sort_unstable_by(|a, b| b.cmp(a));
        let mut done = Vec::with_capacity(finished.len());
        for i in finished {
            let mut s = self.running.remove(i);
            release_seq(self.groups(), &mut s);
            self.feed_pool(&s);
            self.queue_rewarm(&s);
            done.push(s);
        }
        // A finished conversation's blocks leave for the disk before its
        // client hears it is done (who may restart the server right then).
        let synced = match self.disk.as_mut() {
            Some(d) => d.sync(engine, &mut self.blocks),
            None => Ok(()),
        };
        for mut s in done {
            let outcome = finish(&mut s);
            s.hooks.done(Ok(outcome));
        }
        synced
    }

    /// The next micro-batch, when anything is ready (`depth`: how many may be
    /// in flight). Marks its tokens sent.
    ///
    /// Decode tokens first, then prefill chunks oldest first up to
    /// `step_tokens`. A micro-batch takes at most a `depth`-th share of all
    /// decoding sequences (in flight or not), so that the micro-batches stay
    /// even: one that came back with more than its share leaves the rest to
    /// the next.
    fn plan(&mut self, depth: usize) -> Option<(Flight, Vec<PlanItem>)> {
        let decoding = self.running.iter().filter(|s| s.ready() == 1 || (s.busy() && s.pending() == 1)).count();
        let ready = self.running.iter().filter(|s| s.ready() == 1).count();
        let mut decode_left = ready.min(decoding.div_ceil(depth.max(1)));
        let mut budget = self.cfg.step_tokens.saturating_sub(decode_left);
        // Sliding-window groups size a sequence's window blocks for one step
        // beyond its computed KV: their prompts send one chunk at a time; so
        // do all prompts under `--no-prefill-overlap`.
        let one_chunk = self.windows.is_some() || self.no_overlap;
        let mut plan: Vec<(usize, usize)> = Vec::new(); // (running index, tokens)
        let mut snaps: Vec<(u64, BlockHash, u32)> = Vec::new(); // (seq id, prefix hash, slot)
        for (i, s) in self.running.iter().enumerate() {
            let n = match s.ready() {
                0 => continue,
                1 if decode_left > 0 => {
                    decode_left -= 1;
                    // A verify item: the last token and the draft.
                    let rows = s.spec.as_ref().map_or(1, |sp| sp.tokens.len().max(1));
                    budget = budget.saturating_sub(rows - 1);
                    rows
                }
                1 => continue,
                _ if one_chunk && s.busy() => continue,
                p if budget > 0 => {
                    let n = match self.states.as_mut() {
                        Some(st) => {
                            let (n, snap) = hybrid_piece(
                                st,
                                s,
                                p.min(budget).min(s.step_cap()),
                                self.cfg.block,
                                self.cfg.prefix_cache,
                            );
                            if let Some((h, slot)) = snap {
                                snaps.push((s.id, h, slot));
                            }
                            n
                        }
                        None => p.min(budget).min(s.step_cap()),
                    };
                    budget -= n;
                    n
                }
                _ => continue,
            };
            plan.push((i, n));
        }
        if plan.is_empty() {
            return None;
        }
        let mut flight = Flight { items: Vec::new(), snaps, restores: Vec::new(), tokens: 0, sent: Instant::now() };
        let mut items = Vec::with_capacity(plan.len());
        for (i, n) in plan {
            let s = &mut self.running[i];
            if s.ready() == 1 && n > 1 {
                // A verify item: it sends the last token (so `sub_len` moves
                // by one) and the draft behind it.
                flight.items.push(FlightItem { id: s.id, n, all: false, drafts: n - 1 });
                let (start, mode) = (s.sub_len, LogitsMode::Verify);
                items.push(PlanItem {
                    index: i,
                    start,
                    n,
                    mode,
                    prompt: false,
                    restore: None,
                    snapshot: None,
                    verify: true,
                });
                flight.tokens += n;
                s.sub_len += 1;
                continue;
            }
            let ends = s.sub_len + n == s.history.len();
            // `run --dump-logits`: every prompt position's logits.
            let prompt = s.sub_len + n <= s.req.prompt_ids.len();
            let all = s.req.want_prompt_logits && prompt;
            let mode = match ends {
                _ if all => LogitsMode::All,
                false => LogitsMode::None,
                true if s.greedy && !s.hooks.wants_logits() => LogitsMode::Argmax,
                true => LogitsMode::Last,
            };
            // A restore runs with the sequence's first step only; its pin is
            // dropped when that step comes back.
            let restore = s.restore.take();
            flight.restores.extend(restore.map(|r| (s.id, r)));
            let snapshot = flight.snaps.iter().find(|x| x.0 == s.id).map(|x| x.2);
            items.push(PlanItem { index: i, start: s.sub_len, n, mode, prompt, restore, snapshot, verify: false });
            flight.items.push(FlightItem { id: s.id, n, all, drafts: 0 });
            flight.tokens += n;
            s.sub_len += n;
        }
        Some((flight, items))
    }

    /// A micro-batch that was never sent: its sequences take its tokens back
    /// (and their restores, still pinned).
    fn unsend(&mut self, flight: &mut Flight) {
        for it in &flight.items {
            let id = it.id;
            if let Some(s) = self.running.iter_mut().find(|s| s.id == id) {
                s.sub_len -= it.sent();
                s.restore = flight.restores.iter().find(|r| r.0 == id).map(|r| r.1).or(s.restore);
            }
        }
        flight.restores.clear();
    }

    /// A step failed. A cluster failure is returned with every sequence
    /// kept (the caller re-forms the cluster and requeues them); any other
    /// error ends the sequences of that step.
    fn fail_flight(&mut self, flight: Flight, e: EngineError) -> Result<(), EngineError> {
        if let Some(st) = self.states.as_mut() {
            flight.snaps.iter().for_each(|&(_, _, slot)| st.release(slot));
            flight.restores.iter().for_each(|&(_, r)| st.unpin(r));
        }
        if e.is_cluster_failure() {
            return Err(e);
        }
        let msg = e.to_string();
        for it in &flight.items {
            if let Some(i) = self.running.iter().position(|s| s.id == it.id) {
                let mut s = self.running.remove(i);
                release_seq(self.groups(), &mut s);
                s.hooks.done(Err(EngineError::BadArgument(format!("the forward step failed: {msg}"))));
            }
        }
        Ok(())
    }
}

/// The window group `cfg` asks for, checked against the model's window.
fn window_group(engine: &Engine, cfg: &SchedulerConfig) -> Result<Option<WindowGroup>, EngineError> {
    let Some(w) = engine.model.max_window().filter(|_| cfg.n_window_blocks > 0) else { return Ok(None) };
    let g = WindowGroup::new(w, cfg.block, cfg.n_window_blocks, cfg.step_tokens, cfg.prefix_cache);
    if cfg.n_window_blocks < g.per_seq {
        return Err(EngineError::BadArgument(format!(
            "{} window blocks cannot hold one sequence's window of {w} positions in steps of {} tokens ({} blocks)",
            cfg.n_window_blocks, cfg.step_tokens, g.per_seq
        )));
    }
    Ok(Some(g))
}
