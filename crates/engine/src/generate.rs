//! The generation loop: chunked prefill, then decode one token at a time, sampling,
//! stop conditions (EOS ids, stop strings, length) and streamed UTF-8 text.

use crate::dist::{Cluster, StageRunner};
use crate::dist_batch::{BatchItem, PoolShape};
use crate::sampler::{Sampler, SamplingParams};
use crate::tokenizer::{StreamDecoder, Tokenizer};
use crate::EngineError;
use model::{AllReduce, KvCache, KvPool, LogitsMode, Model, NoComm, SeqKv, SeqStep, Workspace};
use std::time::Instant;

#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt_ids: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Generation stops when the text contains one of these; the text is cut before it.
    pub stop_strings: Vec<String>,
    /// Don't stop at EOS ids (benchmarks).
    pub ignore_eos: bool,
    /// Keep the logits of every prompt position (`--dump-logits`).
    pub want_prompt_logits: bool,
    /// Speculative decoding for this request (default: the scheduler's).
    pub draft: crate::draft::DraftChoice,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

#[derive(Debug, Clone)]
pub struct GenerateOutput {
    pub output_ids: Vec<u32>,
    pub text: String,
    pub finish_reason: FinishReason,
    /// Time to first token (prefill plus the first sample), ms.
    pub ttft_ms: f64,
    pub prefill_tok_s: f64,
    /// Tokens after the first, per second of decode time.
    pub decode_tok_s: f64,
    /// `prompt_len × vocab` when requested.
    pub prompt_logits: Option<Vec<f32>>,
    /// The stop string that ended generation, if one did.
    pub stop_string: Option<String>,
}

/// What a caller can do at each step of `Engine::generate_hooked`: mask logits
/// (constrained decoding), see each token, stop early, cancel. A server keeps one
/// per request; a batching scheduler can keep the same per sequence.
pub trait GenerateHooks {
    /// Whether `constrain` needs every logit (greedy decode otherwise fetches only
    /// the argmax, which sharded heads find without gathering the vocabulary).
    fn wants_logits(&self) -> bool {
        false
    }
    /// Masks `logits` (sets some to -inf) before each sample; `remaining` counts
    /// the tokens left, this one included.
    fn constrain(&mut self, _logits: &mut [f32], _remaining: usize) {}
    /// Each sampled token that is not EOS; returning false ends generation with
    /// finish reason `Stop` once its text is out.
    fn on_token(&mut self, _id: u32) -> bool {
        true
    }
    /// Text as soon as it is complete UTF-8 and cannot be the start of a stop string.
    fn on_text(&mut self, text: &str);
    /// Polled between steps; true abandons the request with `EngineError::Cancelled`.
    fn cancelled(&self) -> bool {
        false
    }
    /// After each prefill chunk: `done` of `total` prompt tokens are in the cache.
    /// A long prompt takes minutes on a few cores, so callers can show progress
    /// (a cluster runs the prompt as one pipelined step: 0 before it, total after).
    fn on_prefill(&mut self, _done: usize, _total: usize) {}
}

/// Hooks that do nothing (plain `prefill`).
struct NoHooks;

impl GenerateHooks for NoHooks {
    fn on_text(&mut self, _text: &str) {}
}

/// `generate`'s plain text callback as hooks.
struct TextOnly<'a>(&'a mut dyn FnMut(&str));

impl GenerateHooks for TextOnly<'_> {
    fn on_text(&mut self, text: &str) {
        (self.0)(text)
    }
}

/// A model shard plus what rank 0 needs to talk to it.
pub struct Engine {
    pub model: Model,
    pub tokenizer: Option<Tokenizer>,
    pub pool: kernels::ThreadPool,
    pub eos_ids: Vec<u32>,
    /// Prompt tokens per prefill step.
    pub prefill_chunk: usize,
    /// Set when this engine is rank 0 of a cluster.
    pub cluster: Option<Cluster>,
    ws: Workspace,
    logits: Vec<f32>,
    /// The block pool of batched serving ([`Engine::init_pool`]).
    pub(crate) paged: Option<KvPool>,
    batch_logits: Vec<Vec<f32>>,
    /// Item counts of the batched steps submitted and not yet collected.
    in_flight: std::collections::VecDeque<usize>,
    /// The prefix cache's disk tier (`serve --kv-disk`); set `model_path`
    /// before opening it.
    pub disk: crate::kv_disk::DiskSlot,
}

impl Engine {
    pub fn new(model: Model, tokenizer: Option<Tokenizer>, threads: usize) -> Engine {
        let mut eos_ids = model.config.eos_token_ids.clone();
        if let Some(e) = tokenizer.as_ref().and_then(|t| t.eos_id()) {
            if !eos_ids.contains(&e) {
                eos_ids.push(e);
            }
        }
        Engine {
            model,
            tokenizer,
            pool: kernels::ThreadPool::new(threads.max(1)),
            eos_ids,
            prefill_chunk: 512,
            cluster: None,
            ws: Workspace::default(),
            logits: Vec::new(),
            paged: None,
            batch_logits: Vec::new(),
            in_flight: Default::default(),
            disk: Default::default(),
        }
    }

    /// Allocates the KV block pool for batched serving, on every rank of a
    /// cluster: full and sliding-window block groups, and recurrent-state
    /// slots for a hybrid model.
    pub fn init_pool(&mut self, shape: PoolShape) -> Result<(), EngineError> {
        self.in_flight.clear();
        if let Some(r) = self.with_runner(|r| r.init_pool(shape)) {
            return r;
        }
        let mut pool = self.model.new_pool_windowed(shape.block, shape.n_blocks, shape.n_window_blocks);
        pool.states = self.model.state_pool(shape.n_slots);
        self.model.check_device_pool(&pool)?;
        self.paged = Some(pool);
        Ok(())
    }

    /// Bytes of this process's block pool ([`Engine::init_pool`]; its share
    /// of the model when distributed), `None` before one exists.
    pub fn pool_bytes(&self) -> Option<usize> {
        self.paged.as_ref().map(|p| p.bytes())
    }

    /// One forward step of a batch of paged sequences (locally or across the
    /// cluster). Returns each item's requested logits.
    pub fn step_batch(&mut self, items: &[BatchItem<'_>]) -> Result<&[Vec<f32>], EngineError> {
        self.submit_batch(items)?;
        self.collect_batch()
    }

    /// How many batched steps may be in flight at once ([`Engine::submit_batch`]
    /// before [`Engine::collect_batch`]): the pipeline's stage count, so that
    /// every stage has a micro-batch to work on; 1 in one process or a pure
    /// tensor split.
    pub fn max_in_flight(&self) -> usize {
        self.cluster.as_ref().map_or(1, |c| c.stages.max(1))
    }

    /// Starts a batched step. In one process (or with one pipeline stage) it
    /// runs now; in a pipeline it is sent on and runs while rank 0 prepares
    /// the next one. [`Engine::collect_batch`] returns the logits, oldest step
    /// first. At most [`Engine::max_in_flight`] steps may be outstanding.
    pub fn submit_batch(&mut self, items: &[BatchItem<'_>]) -> Result<(), EngineError> {
        if self.in_flight.len() >= self.max_in_flight() {
            return Err(EngineError::BadArgument(format!(
                "{} batched steps are already in flight (at most {})",
                self.in_flight.len(),
                self.max_in_flight()
            )));
        }
        if let Some(r) = self.with_runner(|r| r.submit_batch(items)) {
            r?;
            self.in_flight.push_back(items.len());
            return Ok(());
        }
        let kv = self.paged.as_mut().ok_or_else(|| EngineError::BadArgument("step_batch before init_pool".into()))?;
        crate::dist_batch::restore_states(kv, items.iter().map(|it| (it.state, it.restore)))?;
        if self.batch_logits.len() < items.len() {
            self.batch_logits.resize_with(items.len(), Vec::new);
        }
        let mut steps: Vec<SeqStep<'_>> = items
            .iter()
            .zip(self.batch_logits.iter_mut())
            .map(|(it, logits)| SeqStep {
                tokens: it.tokens,
                cache: SeqKv::Paged { table: it.table, start: it.start, state: it.state, window: it.window },
                mode: it.mode,
                prompt: it.prompt,
                logits,
            })
            .collect();
        // The power meter attributes this step's energy to its phase.
        let decode = items.iter().all(|it| it.tokens.len() == 1);
        let phase = if decode { crate::power::Phase::Decode } else { crate::power::Phase::Prefill };
        let n_tokens = items.iter().map(|it| it.tokens.len()).sum();
        let guard = (n_tokens > 0).then(|| crate::power::enter(phase, n_tokens));
        self.model.forward_paged(&self.pool, &mut self.ws, kv, &mut steps, &NoComm)?;
        drop(guard);
        drop(steps);
        crate::dist_batch::snapshot_states(kv, items.iter().map(|it| (it.state, it.snapshot)))?;
        self.in_flight.push_back(items.len());
        Ok(())
    }

    /// Finishes the oldest step of [`Engine::submit_batch`] and returns its
    /// items' requested logits.
    pub fn collect_batch(&mut self) -> Result<&[Vec<f32>], EngineError> {
        let n = self
            .in_flight
            .pop_front()
            .ok_or_else(|| EngineError::BadArgument("collect_batch with no step in flight".into()))?;
        if let Some(r) = self.with_runner(|r| r.collect_batch()) {
            r?;
        }
        Ok(&self.batch_logits[..n])
    }

    /// Batched steps sent and not yet collected: while there are any, the
    /// cluster's ranks are busy with them and must not be pinged.
    pub fn steps_in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Forgets the steps in flight (after the cluster was lost: the re-formed
    /// ranks hold none of them).
    pub fn forget_in_flight(&mut self) {
        self.in_flight.clear();
    }

    /// Runs `f` with a stage runner over this engine's buffers when this engine
    /// is rank 0 of a cluster (`None` in a single process).
    pub(crate) fn with_runner<R>(&mut self, f: impl FnOnce(&mut StageRunner<'_>) -> R) -> Option<R> {
        let cluster = self.cluster.as_ref()?;
        let mut runner = StageRunner {
            cluster,
            model: &self.model,
            pool: &self.pool,
            ws: &mut self.ws,
            paged: &mut self.paged,
            batch_logits: &mut self.batch_logits,
            disk: &mut self.disk,
            draft: &mut None,
        };
        Some(f(&mut runner))
    }

    pub fn context_length(&self) -> usize {
        self.model.config.max_position_embeddings
    }

    /// Runs one step of the current sequence through its contiguous cache, in
    /// this process (the reference the serving tests compare the scheduler
    /// with; a cluster generates only through `serving::Scheduler` and
    /// `OP_BATCH`). The requested logits land in `self.logits`.
    fn step(
        &mut self,
        cache: &mut KvCache,
        tokens: &[u32],
        (mode, prompt): (LogitsMode, bool),
        comm: &dyn AllReduce,
    ) -> Result<(), EngineError> {
        if self.cluster.is_some() {
            return Err(EngineError::BadArgument(
                "Engine::generate runs in one process; a cluster generates through serving::Scheduler".into(),
            ));
        }
        let mut steps = [SeqStep { tokens, cache: SeqKv::Own(cache), mode, prompt, logits: &mut self.logits }];
        self.model.forward(&self.pool, &mut self.ws, &mut steps, comm)?;
        Ok(())
    }

    /// Rank 0 of a cluster: checks that every rank answers (see
    /// [`StageRunner::ping`]); a single process always passes.
    pub fn ping_cluster(&mut self) -> Result<(), EngineError> {
        self.with_runner(|r| r.ping()).unwrap_or(Ok(()))
    }

    /// Tells the other ranks to exit (rank 0 of a cluster) and returns each rank's
    /// report (peak RSS, decode traffic), rank 0 first; a single process returns its own.
    pub fn shutdown(&mut self) -> Result<Vec<crate::dist::RankReport>, EngineError> {
        if let Some(cluster) = &self.cluster {
            let mut runner = StageRunner {
                cluster,
                model: &self.model,
                pool: &self.pool,
                ws: &mut self.ws,
                paged: &mut self.paged,
                batch_logits: &mut self.batch_logits,
                disk: &mut self.disk,
                draft: &mut None,
            };
            return runner.shutdown();
        }
        Ok(vec![crate::dist::RankReport {
            peak_rss_bytes: crate::dist::peak_rss_bytes().unwrap_or(0),
            ..Default::default()
        }])
    }

    /// Runs `tokens` through the model in chunks; returns the logits of the last
    /// token (and of every token if `all`).
    pub fn prefill(
        &mut self,
        cache: &mut KvCache,
        tokens: &[u32],
        all: bool,
        comm: &dyn AllReduce,
    ) -> Result<(Vec<f32>, Option<Vec<f32>>), EngineError> {
        self.prefill_checked(cache, tokens, all, comm, &mut NoHooks)
    }

    /// `prefill` that polls `hooks.cancelled` and reports `hooks.on_prefill`
    /// between chunks (a cluster runs the whole prompt as one pipelined step, so
    /// only before and after it).
    fn prefill_checked(
        &mut self,
        cache: &mut KvCache,
        tokens: &[u32],
        all: bool,
        comm: &dyn AllReduce,
        hooks: &mut dyn GenerateHooks,
    ) -> Result<(Vec<f32>, Option<Vec<f32>>), EngineError> {
        if hooks.cancelled() {
            return Err(EngineError::Cancelled);
        }
        let vocab = self.model.config.vocab_size;
        let total = tokens.len();
        if self.cluster.is_some() {
            let mode = if all { LogitsMode::All } else { LogitsMode::Last };
            hooks.on_prefill(0, total);
            self.step(cache, tokens, (mode, true), comm)?;
            hooks.on_prefill(total, total);
            let last = self.logits[self.logits.len() - vocab..].to_vec();
            return Ok((last, all.then(|| self.logits.clone())));
        }
        let mut all_logits = if all { Some(Vec::with_capacity(tokens.len() * vocab)) } else { None };
        let chunk = self.prefill_chunk.max(1);
        let n_chunks = tokens.len().div_ceil(chunk);
        for (ci, part) in tokens.chunks(chunk).enumerate() {
            if ci > 0 && hooks.cancelled() {
                return Err(EngineError::Cancelled);
            }
            let last = ci + 1 == n_chunks;
            let mode = if all {
                LogitsMode::All
            } else if last {
                LogitsMode::Last
            } else {
                LogitsMode::None
            };
            self.step(cache, part, (mode, true), comm)?;
            hooks.on_prefill((ci * chunk + part.len()).min(total), total);
            if let Some(a) = all_logits.as_mut() {
                a.extend_from_slice(&self.logits);
            }
        }
        let last = self.logits[self.logits.len() - vocab..].to_vec();
        Ok((last, all_logits))
    }

    /// Generates for one request. `on_text` receives text as soon as it is complete
    /// UTF-8 and cannot be the start of a stop string.
    pub fn generate(
        &mut self,
        req: &GenerateRequest,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<GenerateOutput, EngineError> {
        self.generate_with(req, on_text, &NoComm)
    }

    pub fn generate_with(
        &mut self,
        req: &GenerateRequest,
        on_text: &mut dyn FnMut(&str),
        comm: &dyn AllReduce,
    ) -> Result<GenerateOutput, EngineError> {
        self.generate_hooked(req, &mut TextOnly(on_text), comm)
    }

    /// Generates for one request with `hooks` consulted at every step.
    pub fn generate_hooked(
        &mut self,
        req: &GenerateRequest,
        hooks: &mut dyn GenerateHooks,
        comm: &dyn AllReduce,
    ) -> Result<GenerateOutput, EngineError> {
        req.sampling.validate().map_err(EngineError::BadArgument)?;
        let prompt = &req.prompt_ids;
        if prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        let vocab = self.model.config.vocab_size;
        if let Some(&id) = prompt.iter().find(|&&id| id as usize >= vocab) {
            return Err(EngineError::TokenOutOfRange { id, vocab });
        }
        let ctx = self.context_length();
        if prompt.len() + req.max_tokens > ctx {
            return Err(EngineError::PromptTooLong { prompt: prompt.len(), generate: req.max_tokens, ctx });
        }
        // Distributed runs keep the cache on each rank; this one only records capacity.
        let mut cache = if self.cluster.is_some() {
            KvCache::new(0, 0, prompt.len() + req.max_tokens)
        } else {
            self.model.new_cache(prompt.len() + req.max_tokens)
        };
        let mut sampler = Sampler::new(req.sampling.clone());
        let mut history = prompt.clone();
        let mut out_ids = Vec::with_capacity(req.max_tokens);
        let mut stream = TextStream::new(&req.stop_strings);
        let mut decoder = StreamDecoder::new();

        let t0 = Instant::now();
        let (mut logits, prompt_logits) =
            self.prefill_checked(&mut cache, prompt, req.want_prompt_logits, comm, hooks)?;
        let prefill_s = t0.elapsed().as_secs_f64();
        let mut ttft_ms = 0.0;
        let mut t_first = None;
        let mut finish = FinishReason::Length;
        let mut token_buf = [0u32; 1];
        // Greedy decoding without a penalty needs only the argmax, which sharded
        // heads find without gathering every logit.
        let greedy = req.sampling.temperature <= 0.0 && req.sampling.repetition_penalty == 1.0;
        let decode_mode = if greedy && !hooks.wants_logits() { LogitsMode::Argmax } else { LogitsMode::Last };
        while out_ids.len() < req.max_tokens {
            if hooks.cancelled() {
                return Err(EngineError::Cancelled);
            }
            hooks.constrain(&mut logits, req.max_tokens - out_ids.len());
            let id = sampler.sample(&mut logits, &history);
            if t_first.is_none() {
                ttft_ms = t0.elapsed().as_secs_f64() * 1e3;
                t_first = Some(Instant::now());
            }
            if !req.ignore_eos && self.eos_ids.contains(&id) {
                finish = FinishReason::Stop;
                break;
            }
            out_ids.push(id);
            history.push(id);
            let go_on = hooks.on_token(id);
            if let Some(tok) = &self.tokenizer {
                let piece = decoder.push(tok, id);
                if stream.push(&piece, &mut |t| hooks.on_text(t)) {
                    finish = FinishReason::Stop;
                    break;
                }
            }
            if !go_on {
                finish = FinishReason::Stop;
                break;
            }
            if out_ids.len() == req.max_tokens {
                break;
            }
            token_buf[0] = id;
            self.step(&mut cache, &token_buf, (decode_mode, false), comm)?;
            logits.copy_from_slice(&self.logits[..vocab]);
        }
        let decode_s = t_first.map_or(0.0, |t| t.elapsed().as_secs_f64());
        if stream.stopped.is_none() {
            let tail = decoder.finish();
            stream.push(&tail, &mut |t| hooks.on_text(t));
        }
        stream.flush(&mut |t| hooks.on_text(t));
        let decoded = out_ids.len().saturating_sub(1);
        Ok(GenerateOutput {
            output_ids: out_ids,
            text: stream.text,
            finish_reason: finish,
            ttft_ms,
            prefill_tok_s: prompt.len() as f64 / prefill_s.max(1e-9),
            decode_tok_s: if decoded > 0 { decoded as f64 / decode_s.max(1e-9) } else { 0.0 },
            prompt_logits,
            stop_string: stream.stopped_by.map(|i| req.stop_strings[i].clone()),
        })
    }
}

/// Accumulates generated text, holding back any tail that could begin a stop string.
pub(crate) struct TextStream {
    stops: Vec<String>,
    pub(crate) text: String,
    /// Bytes of `text` already given to the caller.
    emitted: usize,
    pub(crate) stopped: Option<usize>,
    /// Index in `stops` of the string that hit.
    pub(crate) stopped_by: Option<usize>,
}

impl TextStream {
    pub(crate) fn new(stops: &[String]) -> Self {
        TextStream { stops: stops.to_vec(), text: String::new(), emitted: 0, stopped: None, stopped_by: None }
    }

    /// Adds a piece; returns true when a stop string appeared (text is cut before it).
    pub(crate) fn push(&mut self, piece: &str, on_text: &mut dyn FnMut(&str)) -> bool {
        if self.stopped.is_some() {
            return true;
        }
        self.text.push_str(piece);
        let search_from = self.emitted.saturating_sub(self.stops.iter().map(|s| s.len()).max().unwrap_or(0));
        let search_from = (0..=search_from).rev().find(|&i| self.text.is_char_boundary(i)).unwrap_or(0);
        let hit = self
            .stops
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.is_empty())
            .filter_map(|(i, s)| self.text[search_from..].find(s.as_str()).map(|p| (p + search_from, i)))
            .min();
        if let Some((pos, which)) = hit {
            self.text.truncate(pos);
            self.stopped = Some(pos);
            self.stopped_by = Some(which);
            self.flush(on_text);
            return true;
        }
        // Hold back the longest suffix that is a prefix of some stop string.
        let mut safe = self.text.len();
        for s in &self.stops {
            for k in (1..s.len()).rev() {
                if self.text.len() >= k && s.is_char_boundary(k) && self.text.ends_with(&s[..k]) {
                    safe = safe.min(self.text.len() - k);
                    break;
                }
            }
        }
        if safe > self.emitted {
            on_text(&self.text[self.emitted..safe]);
            self.emitted = safe;
        }
        false
    }

    pub(crate) fn flush(&mut self, on_text: &mut dyn FnMut(&str)) {
        if self.text.len() > self.emitted {
            on_text(&self.text[self.emitted..]);
            self.emitted = self.text.len();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_string_across_pieces_is_cut_and_never_emitted() {
        let stops = vec!["STOP".to_string()];
        let mut s = TextStream::new(&stops);
        let mut got = String::new();
        {
            let mut cb = |t: &str| got.push_str(t);
            assert!(!s.push("hello S", &mut cb));
            assert!(!s.push("T", &mut cb));
            assert!(s.push("OP world", &mut cb));
        }
        assert_eq!(s.text, "hello ");
        assert_eq!(got, "hello ");
    }

    #[test]
    fn held_back_prefix_is_released_when_it_diverges() {
        let stops = vec!["</end>".to_string()];
        let mut s = TextStream::new(&stops);
        let mut got = String::new();
        s.push("a </", &mut |t: &str| got.push_str(t));
        assert_eq!(got, "a ");
        s.push("b>", &mut |t: &str| got.push_str(t));
        s.flush(&mut |t: &str| got.push_str(t));
        assert_eq!(got, "a </b>");
    }
}
