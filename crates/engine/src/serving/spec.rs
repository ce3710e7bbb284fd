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
//! A verify row is not free: on a CPU the matmuls of a few rows are compute
//! bound, and each draft row costs about [`ROW_COST`] of a decode step
//! (SmolLM2-135M, 2 threads: a 9-row verify item took 52 ms where a decode
//! step took 14). A draft model's drafting costs too: `c` decode steps per
//! token it decodes ([`Drafter::cost`]; the n-gram lookup's is 0), and it
//! decodes `k` tokens after feeding about one. So the draft length follows
//! the acceptance rate: with `α` the (decaying) rate at which checked draft
//! tokens were accepted, a draft of `k` yields `(1 − α^(k+1)) / (1 − α)`
//! tokens on average for a cost of `1 + ROW_COST·k + c·(k + 1)` steps
//! ([`step_cost`]), and `k` is the best of `min..=max` for that.
//! When the tokens per unit of cost (a moving average) fall below 1, plain
//! decoding would have been faster: speculation pauses for a number of the
//! sequence's decode steps that doubles each time (up to [`MAX_PAUSE`]), so
//! text the drafter cannot predict costs little. A draft shorter than `min`
//! is not sent.
//!
//! Hybrid models (recurrent states would need a rollback snapshot per
//! verify step) and sliding-window block groups (window blocks are sized
//! for one token past the computed KV) do not speculate: [`Scheduler::set_draft`]
//! says so and leaves it off.

use super::scheduler::Scheduler;
use super::seq::{register_full_blocks, Seq};
use crate::draft::{lookup, DraftChoice, DraftParams, Drafter, NgramPool};
use crate::generate::GenerateRequest;
use crate::tokenizer::Tokenizer;
use crate::EngineError;

/// A draft row's cost, in decode steps (measured, see the module notes).
pub const ROW_COST: f32 = 0.3;
/// Tokens per unit of cost (moving average) below which a sequence pauses.
pub const GAIN_FLOOR: f32 = 1.0;
/// Weight kept by the acceptance counts at each verify step.
const DECAY: f32 = 0.9;
/// First and longest pause, in the sequence's decode steps.
const FIRST_PAUSE: usize = 16;
pub const MAX_PAUSE: usize = 256;

/// A speculating sequence's drafter state.
#[derive(Debug, Clone)]
pub(super) struct SpecState {
    pub params: DraftParams,
    /// The drafter's cost per drafted token, in decode steps ([`Drafter::cost`]).
    pub draft_cost: f32,
    /// The next draft's length.
    pub k: usize,
    /// The next (or in-flight) verify item's tokens: the last sampled token,
    /// then the draft; empty when none is prepared.
    pub tokens: Vec<u32>,
    /// Moving average of the tokens each verify step yielded per unit of its cost.
    pub gain: f32,
    /// Decaying counts of draft tokens accepted and checked (a rejected
    /// token ends the check: the ones after it were not).
    pub hits: f32,
    pub checked: f32,
    /// Decode steps left without speculating, and the next pause's length.
    pub pause: usize,
    pub next_pause: usize,
    pub drafted: usize,
    pub accepted: usize,
}

impl SpecState {
    fn new(params: DraftParams, draft_cost: f32) -> SpecState {
        SpecState {
            params,
            draft_cost,
            k: best_len(PRIOR.0 / PRIOR.1, params, draft_cost),
            tokens: Vec::new(),
            gain: 1.5,
            hits: PRIOR.0,
            checked: PRIOR.1,
            pause: 0,
            next_pause: FIRST_PAUSE,
            drafted: 0,
            accepted: 0,
        }
    }

    /// After a verify step of `k` draft tokens of which `a` were accepted.
    fn adapt(&mut self, k: usize, a: usize) {
        self.drafted += k;
        self.accepted += a;
        let p = self.params;
        self.hits = DECAY * self.hits + a as f32;
        self.checked = DECAY * self.checked + (a + usize::from(a < k)) as f32;
        let yielded = (1 + a) as f32 / step_cost(k, self.draft_cost);
        self.gain = 0.8 * self.gain + 0.2 * yielded;
        if self.gain < GAIN_FLOOR {
            self.pause = self.next_pause;
            self.next_pause = (self.next_pause * 2).min(MAX_PAUSE);
            (self.gain, self.hits, self.checked) = (1.5, PRIOR.0, PRIOR.1);
        } else if yielded > 1.0 {
            self.next_pause = FIRST_PAUSE;
        }
        self.k = best_len(self.hits / self.checked.max(1e-6), p, self.draft_cost);
    }
}

/// The acceptance counts a sequence starts with (a rate of 0.8).
const PRIOR: (f32, f32) = (4.0, 5.0);

/// A verify step of `k` draft tokens, in decode steps, with a drafter that
/// costs `draft_cost` per token it decodes (see the module notes).
pub fn step_cost(k: usize, draft_cost: f32) -> f32 {
    let draft_cost = if draft_cost > 0.0 { draft_cost * (k + 1) as f32 } else { 0.0 };
    1.0 + ROW_COST * k as f32 + draft_cost
}

/// The draft length in `p.min..=p.max` that yields the most tokens per unit
/// of cost when each draft token is accepted with probability `alpha`.
pub fn best_len(alpha: f32, p: DraftParams, draft_cost: f32) -> usize {
    let alpha = alpha.clamp(0.0, 0.999);
    let rate = |k: usize| (1.0 - alpha.powi(k as i32 + 1)) / (1.0 - alpha) / step_cost(k, draft_cost);
    (p.min..=p.max).max_by(|&a, &b| rate(a).total_cmp(&rate(b)).then(b.cmp(&a))).unwrap_or(p.min)
}

impl Scheduler {
    /// Turns speculative decoding on (or off) for requests that leave it to
    /// the scheduler ([`DraftChoice::Default`]). Returns why it stays off
    /// for this model, if it does (then no request speculates).
    pub fn set_draft(&mut self, draft: Option<DraftParams>) -> Result<Option<&'static str>, EngineError> {
        if let Some(p) = &draft {
            p.validate().map_err(EngineError::BadArgument)?;
        }
        self.draft = draft;
        Ok(match self.spec_unsupported() {
            Some(why) if draft.is_some() => {
                tracing::warn!("speculative decoding is off: {why}");
                Some(why)
            }
            _ => None,
        })
    }

    /// Drafts with `drafter` instead of the n-gram lookup and pool (`None`:
    /// back to them).
    pub fn set_drafter(&mut self, drafter: Option<Box<dyn Drafter>>) {
        self.drafter = drafter;
    }

    /// Why this model does not speculate, if it does not.
    fn spec_unsupported(&self) -> Option<&'static str> {
        if self.states.is_some() {
            Some("this model's linear-attention states cannot roll back a rejected draft yet")
        } else if self.windows.is_some() {
            Some("sliding-window block groups hold one step past the computed KV (give windowed layers full blocks)")
        } else {
            None
        }
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
        if self.spec_unsupported().is_some() {
            return None;
        }
        self.ngram_pool.get_or_insert_with(NgramPool::new);
        Some(SpecState::new(params, self.drafter.as_ref().map_or(0.0, |d| d.cost())))
    }

    /// Prepares a draft for every speculating sequence that is ready to
    /// decode and has none: at most `k` tokens, at most one fewer than its
    /// tokens left, and as many as the blocks it has (or the free ones, one
    /// kept for the others' decode) can hold.
    pub(super) fn prepare_drafts(&mut self) {
        let b = self.cfg.block;
        for s in self.running.iter_mut() {
            let decoding = s.ready() == 1 && !s.busy() && s.history.len() > s.req.prompt_ids.len();
            let Some(sp) = s.spec.as_mut() else { continue };
            if !sp.tokens.is_empty() || !decoding {
                continue;
            }
            if sp.pause > 0 {
                sp.pause -= 1;
                continue;
            }
            let left = s.req.max_tokens.saturating_sub(s.out_ids.len());
            let k = sp.k.min(left.saturating_sub(1));
            if k < sp.params.min {
                continue;
            }
            let mut draft = match self.drafter.as_mut() {
                Some(d) => d.propose(&s.history, k),
                None => lookup(&s.history, k),
            };
            // Never more than asked, never a token the model cannot embed.
            let valid = draft.iter().take(k).take_while(|&&t| (t as usize) < self.vocab).count();
            draft.truncate(valid);
            if draft.is_empty() && self.drafter.is_none() {
                if let Some(pool) = &self.ngram_pool {
                    draft = pool.lookup(&s.history, k);
                }
            }
            // Positions `start ..= start + draft.len()` need blocks.
            let start = s.history.len() - 1;
            while s.blocks.len() * b < start + 1 + draft.len() && self.blocks.available() > 1 {
                s.blocks.push(self.blocks.allocate().expect("counted available blocks"));
            }
            draft.truncate((s.blocks.len() * b).saturating_sub(start + 1));
            if draft.len() < sp.params.min {
                continue;
            }
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
        assert!(best_len(0.8, p, 0.0) <= 4);
        assert!(best_len(0.97, p, 0.0) >= 8);
        assert_eq!(best_len(0.999, DraftParams { max: 6, min: 2 }, 0.0), 6);
        assert_eq!(best_len(0.0, DraftParams { max: 6, min: 2 }, 0.0), 2);
        // A costly drafter drafts less at the same acceptance rate.
        assert!(best_len(0.97, p, 0.5) < best_len(0.97, p, 0.0));
    }

    #[test]
    fn rejected_drafts_pause_speculation_and_accepted_ones_lengthen_it() {
        let mut s = SpecState::new(DraftParams { max: 16, min: 1 }, 0.0);
        for _ in 0..20 {
            let k = s.k;
            s.adapt(k, k);
        }
        assert!(s.k >= 8, "k {}", s.k);
        let mut rounds = 0;
        while s.pause == 0 {
            let k = s.k;
            s.adapt(k, 0);
            rounds += 1;
        }
        assert!(rounds <= 10, "{rounds} wasted verify steps before pausing");
        assert_eq!(s.pause, FIRST_PAUSE);
    }
}
