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

use super::blocks::{block_hashes, chain_hash, BlockManager, BlockStats};
use super::state_slots::StateSlots;
use super::windows::{SeqWindow, WindowGroup};
use crate::dist_batch::{BatchItem, PoolShape};
use crate::generate::{Engine, FinishReason, GenerateHooks, GenerateRequest, TextStream};
use crate::sampler::Sampler;
use crate::tokenizer::{StreamDecoder, Tokenizer};
use crate::EngineError;
use model::LogitsMode;
use std::collections::VecDeque;

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
}

/// The per-request callbacks: [`GenerateHooks`] for every step, and `done` once.
pub trait SeqHooks: GenerateHooks + Send {
    fn done(&mut self, result: Result<SeqOutcome, EngineError>);
}

pub struct Submission {
    pub request: GenerateRequest,
    pub hooks: Box<dyn SeqHooks>,
}

struct Seq {
    req: GenerateRequest,
    hooks: Box<dyn SeqHooks>,
    sampler: Sampler,
    history: Vec<u32>,
    out_ids: Vec<u32>,
    stream: TextStream,
    decoder: StreamDecoder,
    blocks: Vec<u32>,
    /// Positions of `history` whose KV is in `blocks`.
    kv_len: usize,
    /// Chained hashes of the full blocks registered so far (prefix cache).
    hashes: Vec<u64>,
    /// Prompt tokens served by the prefix cache at first admission.
    cached_tokens: Option<usize>,
    greedy: bool,
    /// Set when sampling ended the sequence.
    finish: Option<FinishReason>,
    /// Hybrid models: the recurrent-state slot, and a snapshot slot to
    /// restore it from at the next step.
    slot: Option<u32>,
    restore: Option<u32>,
    /// Its blocks in the sliding-window group.
    window: SeqWindow,
}

/// What a scheduler hands out: full blocks, window blocks, state slots.
struct Groups<'a> {
    blocks: &'a mut BlockManager,
    states: &'a mut Option<StateSlots>,
    windows: &'a mut Option<WindowGroup>,
}

/// Gives back what a sequence leaving the batch holds: its blocks (full ones
/// stay cached), its window blocks, and its state slot (a pending restore's
/// pin too).
fn release_seq(g: Groups<'_>, s: &mut Seq) {
    let Groups { blocks, states, windows } = g;
    blocks.release(&s.blocks);
    s.blocks.clear();
    if let Some(w) = windows.as_mut() {
        w.release(&mut s.window);
    }
    if let Some(st) = states.as_mut() {
        if let Some(r) = s.restore.take() {
            st.unpin(r);
        }
        if let Some(slot) = s.slot.take() {
            st.release(slot);
        }
    }
}

impl Seq {
    /// Tokens still to run through the model.
    fn pending(&self) -> usize {
        self.history.len() - self.kv_len
    }

    /// Most tokens of this sequence one step may run. A prompt runs in chunks;
    /// tokens it generated run one per step even when they are recomputed
    /// (after a preemption or a lost rank), because decode and prefill sum in
    /// different orders: replaying them as decode steps rebuilds the very KV
    /// (and so the very next logits) the uninterrupted run had.
    fn step_cap(&self) -> usize {
        match self.req.prompt_ids.len().checked_sub(self.kv_len) {
            Some(left) if left > 0 => left,
            _ => 1,
        }
    }
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
    /// Sequences in the last step.
    pub batch_size: usize,
    /// The sliding-window group's blocks (all zero without one).
    pub window_blocks: BlockStats,
    /// Bytes of this process's pool ([`Engine::pool_bytes`]).
    pub pool_bytes: usize,
}

pub struct Scheduler {
    cfg: SchedulerConfig,
    blocks: BlockManager,
    waiting: VecDeque<Seq>,
    /// In admission order (the last one is preempted first).
    running: Vec<Seq>,
    eos_ids: Vec<u32>,
    vocab: usize,
    context: usize,
    stats: SchedulerStats,
    /// Recurrent-state slots and snapshots (hybrid models only).
    states: Option<StateSlots>,
    /// The sliding-window block group (windowed models, when configured).
    windows: Option<WindowGroup>,
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
            running: Vec::new(),
            eos_ids: engine.eos_ids.clone(),
            vocab: engine.model.config.vocab_size,
            context: engine.context_length(),
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
            ..self.stats
        }
    }

    /// Whether any request is waiting or running.
    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    /// Queues a request, or refuses it at once (`done` with the error).
    pub fn submit(&mut self, sub: Submission) {
        let Submission { request: req, mut hooks } = sub;
        if let Err(e) = self.validate(&req) {
            hooks.done(Err(e));
            return;
        }
        let greedy = req.sampling.temperature <= 0.0 && req.sampling.repetition_penalty == 1.0;
        self.waiting.push_back(Seq {
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
            req,
            hooks,
        });
    }

    fn validate(&self, req: &GenerateRequest) -> Result<(), EngineError> {
        req.sampling.validate().map_err(EngineError::BadArgument)?;
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
        if req.want_prompt_logits {
            return Err(EngineError::BadArgument("the batching scheduler does not return prompt logits".into()));
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

    fn groups(&mut self) -> Groups<'_> {
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

    /// Moves waiting sequences into the batch while there is room.
    fn admit(&mut self) {
        let b = self.cfg.block;
        while self.running.len() < self.cfg.max_batch {
            let Some(mut s) = self.waiting.pop_front() else { break };
            // Reuse cached full blocks, leaving at least one token to run (its
            // logits start the output).
            let hashes = block_hashes(&s.history, b);
            let reusable = (s.history.len() - 1) / b;
            let mut got = self.blocks.acquire_prefix(&hashes, reusable);
            // Hybrid: only as deep as the deepest state snapshot; windowed:
            // as deep as the window blocks before it are cached.
            let mut j = got.len();
            while j > 0 {
                let state_ok = self
                    .states
                    .as_ref()
                    .is_none_or(|st| (j * b).is_multiple_of(st.granularity) && st.has(hashes[j - 1]));
                if state_ok && self.windows.as_ref().is_none_or(|w| w.can_resume(&hashes, j)) {
                    break;
                }
                j -= 1;
            }
            self.blocks.release(&got[j..]);
            got.truncate(j);
            let restore = match self.states.as_mut() {
                Some(st) if j > 0 => st.lookup(hashes[j - 1]),
                _ => None,
            };
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
            if s.cached_tokens.is_none() {
                self.stats.prefix_queries += 1;
                self.stats.prefix_hits += u64::from(!got.is_empty());
                self.stats.prefix_cached_tokens += (got.len() * b) as u64;
                s.cached_tokens = Some(got.len() * b);
            }
            s.kv_len = got.len() * b;
            if let Some(w) = self.windows.as_mut() {
                w.acquire(&mut s.window, &hashes, got.len());
            }
            s.hashes = hashes[..got.len()].to_vec();
            s.blocks = got;
            for _ in 0..needed {
                s.blocks.push(self.blocks.allocate().expect("counted available blocks"));
            }
            if let Some(st) = self.states.as_mut() {
                s.slot = Some(st.take_live().expect("a live slot per batch row"));
                if let Some(r) = restore {
                    st.pin(r);
                }
                s.restore = restore;
            }
            self.running.push(s);
        }
    }

    /// Gives back the youngest running sequence's blocks and requeues it first.
    fn preempt_youngest(&mut self) {
        if let Some(mut s) = self.running.pop() {
            release_seq(self.groups(), &mut s);
            s.hashes.clear();
            s.kv_len = 0;
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
            let upto = s.kv_len + s.pending().min(step).min(s.step_cap());
            if w.grow(&mut s.window, upto) {
                i += 1;
            } else {
                self.preempt_youngest();
            }
        }
    }

    /// After the cluster was lost: every running sequence goes back to the
    /// front of the queue, in admission order, with its history (prompt and
    /// the tokens streamed so far) kept and its KV dropped, as preemption does;
    /// the prefix cache is emptied, since the re-formed ranks hold no KV.
    /// Call [`Scheduler::reinit_pool`] once the cluster is back.
    pub fn requeue_all(&mut self) {
        while !self.running.is_empty() {
            self.preempt_youngest();
        }
        self.blocks = BlockManager::new(self.cfg.n_blocks, self.cfg.block, self.cfg.prefix_cache);
        // The state snapshots went with the ranks' pools too.
        if self.states.is_some() {
            let snaps = if self.cfg.prefix_cache { self.cfg.max_batch } else { 0 };
            self.states = Some(StateSlots::new(self.cfg.max_batch, snaps, self.cfg.block));
        }
        if let Some(w) = &self.windows {
            let c = &self.cfg;
            self.windows = Some(WindowGroup::new(w.window, c.block, w.n_blocks(), c.step_tokens, c.prefix_cache));
        }
    }

    /// Allocates the pool again on every rank (a re-formed cluster).
    pub fn reinit_pool(&mut self, engine: &mut Engine) -> Result<(), EngineError> {
        let n_slots = self.states.as_ref().map_or(0, |s| s.idle_slots());
        let n_window_blocks = self.windows.as_ref().map_or(0, |w| w.n_blocks());
        engine.init_pool(PoolShape { block: self.cfg.block, n_blocks: self.cfg.n_blocks, n_window_blocks, n_slots })
    }

    /// Runs one step: admits, batches, runs the model, samples. Errors of the
    /// step end the sequences in it and the scheduler stays usable, except a
    /// cluster failure ([`EngineError::is_cluster_failure`]): that is returned
    /// with every sequence kept, for the caller to re-form the cluster and
    /// [`Scheduler::requeue_all`].
    pub fn step(&mut self, engine: &mut Engine) -> Result<(), EngineError> {
        self.drop_cancelled();
        self.admit();
        self.reserve_decode_blocks();
        self.reserve_window_blocks();
        if self.running.is_empty() {
            return Ok(());
        }
        // Decode tokens first, then prefill chunks oldest first.
        let mut budget = self.cfg.step_tokens.saturating_sub(self.running.iter().filter(|s| s.pending() == 1).count());
        let mut plan: Vec<(usize, usize)> = Vec::new(); // (running index, tokens)
        let mut snaps: Vec<(usize, u64, u32)> = Vec::new(); // (running index, prefix hash, slot)
        for (i, s) in self.running.iter().enumerate() {
            let n = match s.pending() {
                1 => 1,
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
                                snaps.push((i, h, slot));
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
        let snapshot_of = |i: usize| snaps.iter().find(|x| x.0 == i).map(|x| x.2);
        let items: Vec<BatchItem<'_>> = plan
            .iter()
            .map(|&(i, n)| {
                let s = &self.running[i];
                let ends = s.kv_len + n == s.history.len();
                let mode = match ends {
                    false => LogitsMode::None,
                    true if s.greedy && !s.hooks.wants_logits() => LogitsMode::Argmax,
                    true => LogitsMode::Last,
                };
                BatchItem {
                    tokens: &s.history[s.kv_len..s.kv_len + n],
                    table: &s.blocks,
                    start: s.kv_len,
                    mode,
                    state: s.slot,
                    restore: s.restore,
                    snapshot: snapshot_of(i),
                    window: s.window.view(),
                }
            })
            .collect();
        self.stats.batch_size = items.len();
        let t0 = std::time::Instant::now();
        let ntok: usize = items.iter().map(|i| i.tokens.len()).sum();
        let result = engine.step_batch(&items).map(|l| l.iter().map(|row| row[..self.vocab.min(row.len())].to_vec()));
        // The restores ran (or the step failed): unpin them either way.
        for &(i, _) in &plan {
            if let (Some(st), Some(r)) = (self.states.as_mut(), self.running[i].restore.take()) {
                st.unpin(r);
            }
        }
        let logits: Vec<Vec<f32>> = match result {
            Ok(l) => {
                if let Some(st) = self.states.as_mut() {
                    for &(_, h, slot) in &snaps {
                        st.commit(h, slot);
                    }
                }
                l.collect()
            }
            Err(e) if e.is_cluster_failure() => {
                if let Some(st) = self.states.as_mut() {
                    snaps.iter().for_each(|&(_, _, slot)| st.release(slot));
                }
                return Err(e);
            }
            Err(e) => {
                if let Some(st) = self.states.as_mut() {
                    snaps.iter().for_each(|&(_, _, slot)| st.release(slot));
                }
                let msg = e.to_string();
                let mut idx: Vec<usize> = plan.iter().map(|&(i, _)| i).collect();
                idx.sort_unstable_by(|a, b| b.cmp(a));
                for i in idx {
                    let mut s = self.running.remove(i);
                    release_seq(self.groups(), &mut s);
                    s.hooks.done(Err(EngineError::BadArgument(format!("the forward step failed: {msg}"))));
                }
                return Ok(());
            }
        };
        tracing::debug!("step: {} seqs, {ntok} tokens, {:.2} ms", plan.len(), t0.elapsed().as_secs_f64() * 1e3);
        let tok = engine.tokenizer.as_ref();
        let mut finished = Vec::new();
        for (&(i, n), mut row) in plan.iter().zip(logits) {
            let s = &mut self.running[i];
            s.kv_len += n;
            register_full_blocks(&mut self.blocks, self.windows.as_mut(), s);
            if s.kv_len == s.history.len() && row.len() == self.vocab && self.sample(i, &mut row, tok) {
                finished.push(i);
            }
        }
        finished.sort_unstable_by(|a, b| b.cmp(a));
        for i in finished {
            let mut s = self.running.remove(i);
            release_seq(self.groups(), &mut s);
            let outcome = finish(&mut s);
            s.hooks.done(Ok(outcome));
        }
        Ok(())
    }

    /// Samples sequence `i`'s next token from `logits`; true when it is done
    /// (its `finish` is then set). Mirrors `Engine::generate_hooked`.
    fn sample(&mut self, i: usize, logits: &mut [f32], tok: Option<&Tokenizer>) -> bool {
        let s = &mut self.running[i];
        let remaining = s.req.max_tokens - s.out_ids.len();
        if remaining == 0 {
            s.finish = Some(FinishReason::Length);
            return true;
        }
        s.hooks.constrain(logits, remaining);
        let id = s.sampler.sample(logits, &s.history);
        if !s.req.ignore_eos && self.eos_ids.contains(&id) {
            s.finish = Some(FinishReason::Stop);
            return true;
        }
        s.out_ids.push(id);
        s.history.push(id);
        let go_on = s.hooks.on_token(id);
        if let Some(tok) = tok {
            let piece = s.decoder.push(tok, id);
            let hooks = &mut s.hooks;
            if s.stream.push(&piece, &mut |t| hooks.on_text(t)) {
                s.finish = Some(FinishReason::Stop);
                return true;
            }
        }
        if !go_on {
            s.finish = Some(FinishReason::Stop);
        } else if s.out_ids.len() == s.req.max_tokens {
            s.finish = Some(FinishReason::Length);
        }
        s.finish.is_some()
    }
}

/// A hybrid model's prefill piece of sequence `s`, at most `n` tokens: it ends
/// on a multiple of the delta rule's chunk (unless it ends the prompt, or
/// that would leave nothing), or at the prompt's last snapshot boundary,
/// which then gets a snapshot slot (with its prefix hash).
fn hybrid_piece(st: &mut StateSlots, s: &Seq, n: usize, block: usize, cache: bool) -> (usize, Option<(u64, u32)>) {
    let (start, len) = (s.kv_len, s.history.len());
    let chunk = kernels::delta_rule::CHUNK;
    let snap_at = (len - 1) / st.granularity * st.granularity;
    let end = start + n;
    if cache && snap_at > start && end >= snap_at {
        let hash = block_hashes(&s.history[..snap_at], block).last().copied();
        let slot = hash.and_then(|h| st.reserve_snapshot(h).map(|slot| (h, slot)));
        return (snap_at - start, slot);
    }
    if end == len {
        return (n, None);
    }
    let aligned = end / chunk * chunk;
    (if aligned > start { aligned - start } else { n }, None)
}

/// Registers each block of `s` that has become full since the last call
/// (its window block under the same name), then gives back the window
/// blocks that fell out of the window.
fn register_full_blocks(blocks: &mut BlockManager, mut windows: Option<&mut WindowGroup>, s: &mut Seq) {
    let b = blocks.block;
    while (s.hashes.len() + 1) * b <= s.kv_len && s.hashes.len() < s.blocks.len() {
        let k = s.hashes.len();
        let parent = k.checked_sub(1).map_or(0, |p| s.hashes[p]);
        let h = chain_hash(parent, &s.history[k * b..(k + 1) * b]);
        blocks.register(s.blocks[k], h);
        if let Some(w) = windows.as_deref_mut() {
            w.register(&s.window, k, h);
        }
        s.hashes.push(h);
    }
    if let Some(w) = windows {
        w.trim(&mut s.window, s.kv_len);
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

/// Flushes the text and builds the outcome of a finished sequence.
fn finish(s: &mut Seq) -> SeqOutcome {
    let hooks = &mut s.hooks;
    if s.stream.stopped.is_none() {
        let tail = s.decoder.finish();
        s.stream.push(&tail, &mut |t| hooks.on_text(t));
    }
    s.stream.flush(&mut |t| hooks.on_text(t));
    let finish_reason = s.finish.unwrap_or(FinishReason::Length);
    SeqOutcome {
        output_ids: std::mem::take(&mut s.out_ids),
        finish_reason,
        stop_string: s.stream.stopped_by.map(|i| s.req.stop_strings[i].clone()),
        prompt_tokens: s.req.prompt_ids.len(),
        cached_tokens: s.cached_tokens.unwrap_or(0),
    }
}
