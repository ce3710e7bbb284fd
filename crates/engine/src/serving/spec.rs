//! Speculative decoding in the batching scheduler.
//!
//! A speculating sequence that is ready to decode gets a draft of up to `k`
//! tokens ([`crate::draft`]: n-gram lookup in its own history, then the
//! shared pool). Its next step sends its last sampled token and the draft as
//! ONE item of `1 + k` rows with [`LogitsMode::Verify`] (every row's logits,
//! each row's attention computed as a decode step would), in the same batch
//! as plain sequences and prefill chunks; in a pipeline the item crosses
//! every stage once, and under tensor parallelism every rank runs its shard
//! of the same rows.
//!
//! # Verification
//! Row `r`'s logits are the model's next-token distribution after the
//! draft's first `r` tokens. Rows are checked in order: row `r` samples (or,
//! greedy, takes the argmax) with the draft's token `r` as the proposal
//! ([`crate::sampler::Sampler::sample_draft`]); while the token that comes
//! out is the draft's, the next row is checked; the first other token (the
//! correction) or row `k`'s token (the bonus) ends the step. Each token goes
//! through the same path as a plain decode step's (constraints, EOS, stop
//! strings, streaming, `max_tokens`), so output, stream and stop strings
//! only ever see accepted tokens.
//!
//! # Rollback
//! A row's KV is valid when its input token was accepted: the last token and
//! the `a` accepted draft tokens, so `kv_len` advances by `1 + a` and the
//! prefix cache hashes full blocks only up to there. The rejected rows' KV
//! stays in the blocks past `kv_len`, unread (attention reads positions below
//! a step's own), and the next steps overwrite it. Extra blocks a draft
//! needed stay with the sequence for the positions it reaches next.
//!
//! # When it pays
//! A verify row is not free: on a CPU the matmuls of a few rows cost more
//! than one, and each draft row costs about [`ROW_COST`] of a decode step
//! (SmolLM2-135M, 2 threads, sixteen-row kernels: a 9-row verify item took
//! 22.5 ms where a one-row step took 11.8, 0.11 a row). A draft model's
//! drafting costs too: `c` decode steps per token it decodes
//! ([`Drafter::cost`]; the n-gram lookup's is 0), and it decodes `k` tokens
//! after feeding about one. With `α` the rate at which checked draft tokens
//! are accepted, a draft of `k` yields `(1 − α^(k+1)) / (1 − α)` tokens on
//! average for a cost of `1 + ROW_COST·k + c·(k + 1)` steps ([`step_cost`]),
//! and `k` is the best of `min..=max` for that.
//!
//! `α` depends on where a draft comes from: an 8-token suffix found again
//! in a file being quoted is almost always followed by the same text, a
//! 1-token match ("the", `.`) in prose almost never. So each sequence keeps
//! a decaying acceptance rate per [`Source`] (match length 1, 2, 3–4, 5+,
//! the shared pool, a draft model), and sends a draft only when its
//! source's expected tokens per unit of cost reach [`GAIN_FLOOR`]. A source
//! below it is tried again with the shortest draft every [`PROBE_EVERY`]
//! drafts it would have made, so a text that turns to quoting is noticed.
//! On prose, where short matches are all there is, speculation thereby
//! turns itself off, and costs a probe now and then.
//!
//! Hybrid models roll back their recurrent states too: each linear layer
//! keeps the state before a verify step and the rows' inputs, and replays
//! the accepted rows at the sequence's next step (`model::state_cache`,
//! "Taking back a verify step"). With a sliding-window block group, the
//! draft's positions get window blocks before the step, as the full ones
//! (a verify item is at most a step's tokens: inside the sequence's
//! window reservation).

use super::scheduler::Scheduler;
use super::seq::{register_full_blocks, Seq};
use crate::draft::{lookup_matched, DraftChoice, DraftParams, Drafter, ModelDraft, NgramPool};
use crate::generate::Engine;
use crate::generate::GenerateRequest;
use crate::tokenizer::Tokenizer;
use crate::EngineError;

/// A draft row's cost, in decode steps (measured, see the module notes;
/// rounded up: a pipeline stage of one thread pays more a row).
pub const ROW_COST: f32 = 0.15;
/// Tokens per unit of cost a source's drafts must be expected to yield
/// (plain decoding yields 1).
pub const GAIN_FLOOR: f32 = 1.05;
/// Weight kept by the acceptance counts at each verify step.
const DECAY: f32 = 0.9;
/// A source below the floor drafts (its shortest draft) once per this many
/// drafts it skipped.
pub const PROBE_EVERY: usize = 32;

/// Where a draft came from; each source's acceptance rate is learned apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The n-gram lookup's suffix match of 1, 2, 3–4 or 5 and more tokens.
    Match1,
    Match2,
    Match3To4,
    Match5Plus,
    /// The pool shared across requests.
    Pool,
    /// A draft model.
    Model,
}

impl Source {
    const COUNT: usize = 6;

    pub fn of_match(n: usize) -> Source {
        match n {
            0 | 1 => Source::Match1,
            2 => Source::Match2,
            3 | 4 => Source::Match3To4,
            _ => Source::Match5Plus,
        }
    }

    /// The (accepted, checked) counts a sequence starts with: a one-token
    /// match is a guess (0.2), a long one a quote (0.8).
    fn prior(self) -> (f32, f32) {
        match self {
            Source::Match1 => (0.4, 2.0),
            Source::Match2 => (1.0, 2.0),
            Source::Match3To4 | Source::Pool => (2.0, 3.0),
            Source::Match5Plus | Source::Model => (4.0, 5.0),
        }
    }
}

/// One source's decaying acceptance counts (a rejected token ends the
/// check: the ones after it were not checked), and the drafts skipped since
/// it last drafted.
#[derive(Debug, Clone, Copy)]
struct Rate {
    hits: f32,
    checked: f32,
    skipped: usize,
}

/// A speculating sequence's drafter state.
#[derive(Debug, Clone)]
pub(super) struct SpecState {
    pub params: DraftParams,
    /// The drafter's cost per drafted token, in decode steps ([`Drafter::cost`]).
    pub draft_cost: f32,
    /// The next (or in-flight) verify item's tokens: the last sampled token,
    /// then the draft; empty when none is prepared.
    pub tokens: Vec<u32>,
    /// Where the in-flight draft came from.
    pub source: Source,
    rates: [Rate; Source::COUNT],
    /// Whether drafts that are not expected to pay are skipped.
    pub gated: bool,
    pub drafted: usize,
    pub accepted: usize,
}

impl SpecState {
    fn new(params: DraftParams, draft_cost: f32) -> SpecState {
        let all = [Source::Match1, Source::Match2, Source::Match3To4, Source::Match5Plus, Source::Pool, Source::Model];
        SpecState {
            params,
            draft_cost,
            tokens: Vec::new(),
            source: Source::Match1,
            rates: all.map(|s| Rate { hits: s.prior().0, checked: s.prior().1, skipped: 0 }),
            gated: true,
            drafted: 0,
            accepted: 0,
        }
    }

    /// How many of at most `offered` tokens from `source` to draft: the
    /// best length for its acceptance rate when that pays, a probe of the
    /// shortest now and then when not, else 0.
    pub fn plan(&mut self, source: Source, offered: usize) -> usize {
        let p = self.params;
        if offered < p.min {
            return 0;
        }
        let r = &mut self.rates[source as usize];
        let alpha = r.hits / r.checked.max(1e-6);
        let bounds = DraftParams { min: p.min, max: p.max.min(offered) };
        let k = best_len(alpha, bounds, self.draft_cost);
        if !self.gated || expected_yield(alpha, k, self.draft_cost) >= GAIN_FLOOR {
            r.skipped = 0;
            return k;
        }
        r.skipped += 1;
        if r.skipped >= PROBE_EVERY {
            r.skipped = 0;
            return p.min;
        }
        0
    }

    /// After a verify step of `k` draft tokens of which `a` were accepted.
    fn adapt(&mut self, k: usize, a: usize) {
        self.drafted += k;
        self.accepted += a;
        let r = &mut self.rates[self.source as usize];
        r.hits = DECAY * r.hits + a as f32;
        r.checked = DECAY * r.checked + (a + usize::from(a < k)) as f32;
    }
}

/// A verify step of `k` draft tokens, in decode steps, with a drafter that
/// costs `draft_cost` per token it decodes (see the module notes).
pub fn step_cost(k: usize, draft_cost: f32) -> f32 {
    let draft_cost = if draft_cost > 0.0 { draft_cost * (k + 1) as f32 } else { 0.0 };
    1.0 + ROW_COST * k as f32 + draft_cost
}

/// Expected tokens per decode step's cost of a draft of `k` whose tokens are
/// each accepted with probability `alpha`.
pub fn expected_yield(alpha: f32, k: usize, draft_cost: f32) -> f32 {
    let alpha = alpha.clamp(0.0, 0.999);
    (1.0 - alpha.powi(k as i32 + 1)) / (1.0 - alpha) / step_cost(k, draft_cost)
}

/// The draft length in `p.min..=p.max` that yields the most tokens per unit
/// of cost when each draft token is accepted with probability `alpha`.
pub fn best_len(alpha: f32, p: DraftParams, draft_cost: f32) -> usize {
    let rate = |k: usize| expected_yield(alpha, k, draft_cost);
    (p.min..=p.max).max_by(|&a, &b| rate(a).total_cmp(&rate(b)).then(b.cmp(&a))).unwrap_or(p.min)
}

impl Scheduler {
    /// Turns speculative decoding on (or off) for requests that leave it to
    /// the scheduler ([`DraftChoice::Default`]).
    pub fn set_draft(&mut self, draft: Option<DraftParams>) -> Result<(), EngineError> {
        if let Some(p) = &draft {
            p.validate().map_err(EngineError::BadArgument)?;
        }
        self.draft = draft;
        Ok(())
    }

    /// Drafts with `drafter` instead of the n-gram lookup and pool (`None`:
    /// back to them).
    pub fn set_drafter(&mut self, drafter: Option<Box<dyn Drafter>>) {
        self.drafter = drafter;
    }

    /// Drafts with a draft model, here or on another rank (`--draft-rank`),
    /// instead of the n-gram lookup and pool (`None`: back to them).
    pub fn set_model_draft(&mut self, draft: Option<ModelDraft>) {
        (self.drafter, self.remote_drafter) = match draft {
            None => (None, None),
            Some(ModelDraft::Here(d)) => (Some(d), None),
            Some(ModelDraft::Rank(r)) => (None, Some(r)),
        };
    }

    /// Sends every draft, paying or not (`false`), or only those expected to
    /// pay (`true`, the default): for tests and measurements of the verify
    /// path itself.
    pub fn set_draft_gate(&mut self, gate: bool) {
        self.draft_gate = gate;
    }

    /// Checks a request's own draft bounds.
    pub(super) fn validate_draft(req: &GenerateRequest) -> Result<(), EngineError> {
        match req.draft {
            DraftChoice::On(p) => p.validate().map_err(EngineError::BadArgument),
            _ => Ok(()),
        }
    }

    /// A new sequence's drafter state, if it speculates.
    pub(super) fn spec_for(&mut self, req: &GenerateRequest) -> Option<SpecState> {
        let params = req.draft.resolve(self.draft)?;
        self.ngram_pool.get_or_insert_with(NgramPool::new);
        let cost = match (&self.drafter, &self.remote_drafter) {
            (Some(d), _) => d.cost(),
            (None, Some(r)) => r.cost(),
            (None, None) => 0.0,
        };
        let mut sp = SpecState::new(params, cost);
        sp.gated = self.draft_gate;
        Some(sp)
    }

    /// Prepares a draft for every speculating sequence that is ready to
    /// decode and has none: at most `k` tokens, at most one fewer than its
    /// tokens left, and as many as the blocks it has (or the free ones, one
    /// kept for the others' decode) can hold.
    pub(super) fn prepare_drafts(&mut self, engine: &mut Engine) {
        let b = self.cfg.block;
        // A draft rank is asked only with no step in flight (`draft::remote`).
        let remote_ready = self.in_flight.is_empty();
        for s in self.running.iter_mut() {
            let decoding = s.ready() == 1 && !s.busy() && s.history.len() > s.req.prompt_ids.len();
            let Some(sp) = s.spec.as_mut() else { continue };
            if !sp.tokens.is_empty() || !decoding {
                continue;
            }
            let left = s.req.max_tokens.saturating_sub(s.out_ids.len());
            let cap = sp.params.max.min(left.saturating_sub(1));
            if cap < sp.params.min {
                continue;
            }
            // A draft model's drafting costs: decide its length first. The
            // lookup is free: look first, then decide by how long a suffix
            // matched.
            let (mut draft, source) = match (self.drafter.as_mut(), self.remote_drafter.as_mut()) {
                (Some(d), _) => match sp.plan(Source::Model, cap) {
                    0 => continue,
                    k => (d.propose(&s.history, k), Source::Model),
                },
                (None, Some(r)) => match sp.plan(Source::Model, cap) {
                    k if k == 0 || !remote_ready => continue,
                    k => (r.propose(engine, &s.history, k), Source::Model),
                },
                (None, None) => match lookup_matched(&s.history, cap) {
                    (d, n) if !d.is_empty() => (d, Source::of_match(n)),
                    _ => match &self.ngram_pool {
                        Some(pool) => (pool.lookup(&s.history, cap), Source::Pool),
                        None => continue,
                    },
                },
            };
            // Never more than asked, never a token the model cannot embed.
            let valid = draft.iter().take(cap).take_while(|&&t| (t as usize) < self.vocab).count();
            draft.truncate(valid);
            if source != Source::Model {
                draft.truncate(sp.plan(source, draft.len()));
            }
            // Positions `start ..= start + draft.len()` need blocks, and
            // window blocks too (a verify item is at most a step's tokens:
            // within the sequence's reservation).
            let start = s.history.len() - 1;
            while s.blocks.len() * b < start + 1 + draft.len() && self.blocks.available() > 1 {
                s.blocks.push(self.blocks.allocate().expect("counted available blocks"));
            }
            draft.truncate((s.blocks.len() * b).saturating_sub(start + 1));
            if let Some(w) = self.windows.as_mut() {
                draft.truncate(self.cfg.step_tokens.saturating_sub(1));
                w.grow(&mut s.window, start + 1 + draft.len());
                draft.truncate(s.window.covered(b).saturating_sub(start + 1));
            }
            if draft.len() < sp.params.min {
                continue;
            }
            sp.source = source;
            sp.tokens.reserve(draft.len() + 1);
            sp.tokens.push(s.history[start]);
            sp.tokens.extend(draft);
        }
    }

    /// Checks sequence `i`'s draft against its verify item's logits (`rows`:
    /// `(1 + k) × vocab`); returns whether the sequence is done.
    pub(super) fn verify(&mut self, i: usize, rows: &[f32], tok: Option<&Tokenizer>) -> bool {
        let vocab = self.vocab;
        let Some(sp) = self.running[i].spec.as_mut() else { return false };
        let tokens = std::mem::take(&mut sp.tokens);
        let draft = tokens.get(1..).unwrap_or_default();
        let k = draft.len();
        let mut accepted = 0;
        let mut done = false;
        for r in 0..=k {
            let Some(row) = rows.get(r * vocab..(r + 1) * vocab) else { break };
            // Row r's input token (the last one, or accepted draft r − 1) is
            // in `history`: its KV is valid.
            let s = &mut self.running[i];
            s.kv_len += 1;
            register_full_blocks(&mut self.blocks, self.windows.as_mut(), s);
            let mut row = row.to_vec();
            let (end, took) = self.running[i].sample(&mut row, tok, draft.get(r).copied(), &self.eos_ids);
            if end {
                done = true;
                break;
            }
            if !took || r == k {
                break;
            }
            accepted += 1;
        }
        let s = &mut self.running[i];
        // No other step of this sequence is in flight.
        s.sub_len = s.kv_len;
        if let Some(sp) = s.spec.as_mut() {
            sp.adapt(k, accepted);
        }
        self.stats.spec_steps += 1;
        self.stats.spec_drafted += k as u64;
        self.stats.spec_accepted += accepted as u64;
        done
    }

    /// A finished speculating sequence's tokens join the shared n-gram pool.
    pub(super) fn feed_pool(&mut self, s: &Seq) {
        if let (Some(pool), Some(_)) = (self.ngram_pool.as_mut(), s.spec.as_ref()) {
            pool.feed(&s.history);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_draft_length_follows_the_acceptance_rate() {
        let p = DraftParams { max: 16, min: 1 };
        assert_eq!(best_len(0.3, p, 0.0), 1);
        assert!(best_len(0.8, p, 0.0) <= 6);
        assert!(best_len(0.97, p, 0.0) >= 8);
        assert_eq!(best_len(0.999, DraftParams { max: 6, min: 2 }, 0.0), 6);
        assert_eq!(best_len(0.0, DraftParams { max: 6, min: 2 }, 0.0), 2);
        // A costly drafter drafts less at the same acceptance rate.
        assert!(best_len(0.97, p, 0.5) < best_len(0.97, p, 0.0));
    }

    /// One verify step of a draft from `source`, `a` of its tokens accepted.
    fn step(s: &mut SpecState, source: Source, offered: usize, accept: impl Fn(usize) -> usize) -> usize {
        let k = s.plan(source, offered);
        if k > 0 {
            s.source = source;
            s.adapt(k, accept(k));
        }
        k
    }

    #[test]
    fn each_source_learns_its_own_rate() {
        let mut s = SpecState::new(DraftParams { max: 16, min: 1 }, 0.0);
        // A long match that keeps being right drafts long.
        for _ in 0..20 {
            step(&mut s, Source::Match5Plus, 16, |k| k);
        }
        assert!(s.plan(Source::Match5Plus, 16) >= 8);
        // A one-token match starts as a guess: not worth a row.
        assert_eq!(s.plan(Source::Match1, 8), 0);
        // Two-token matches that keep failing stop drafting, and are probed
        // with one token once per PROBE_EVERY offers; the long matches are
        // untouched.
        let mut drafted = Vec::new();
        for _ in 0..(3 * PROBE_EVERY) {
            drafted.push(step(&mut s, Source::Match2, 8, |_| 0));
        }
        let sent = drafted.iter().filter(|&&k| k > 0).count();
        assert!(sent <= 3 + 3, "{drafted:?}");
        assert!(drafted[drafted.len() - 2 * PROBE_EVERY..].iter().all(|&k| k <= 1), "{drafted:?}");
        assert!(s.plan(Source::Match5Plus, 16) >= 8);
        // Never more than offered, never fewer than the minimum.
        let mut s = SpecState::new(DraftParams { max: 6, min: 2 }, 0.0);
        assert_eq!(s.plan(Source::Match5Plus, 1), 0);
        assert!(s.plan(Source::Match5Plus, 3) <= 3);
    }

    #[test]
    fn a_costly_drafter_pays_only_at_high_acceptance() {
        let mut s = SpecState::new(DraftParams { max: 8, min: 1 }, 0.5);
        // At the prior (0.8) a drafter costing half a step per token loses.
        assert!(expected_yield(0.8, best_len(0.8, s.params, 0.5), 0.5) < GAIN_FLOOR);
        assert_eq!(s.plan(Source::Model, 8), 0);
        let mut cheap = SpecState::new(DraftParams { max: 8, min: 1 }, 0.05);
        assert!(cheap.plan(Source::Model, 8) >= 2);
        s.draft_cost = 0.05;
        assert!(s.plan(Source::Model, 8) >= 2);
    }
}
