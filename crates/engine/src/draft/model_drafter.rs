//! Drafting with a small model (`--draft-model`): a model with the target's
//! vocabulary, in this process (rank 0, or the rank `--draft-rank` names,
//! [`super::remote`]), proposes the next `k` tokens by greedy
//! decoding; the scheduler's verify step checks them as it checks n-gram
//! drafts ([`crate::serving`]'s `spec` module), so the output is the
//! target's whatever the draft model says.
//!
//! # State
//! The scheduler has one drafter for all its sequences and calls
//! [`Drafter::propose`] with a sequence's whole history (prompt and accepted
//! tokens), not its id. The drafter keeps a few slots, each a KV cache and
//! the tokens whose KV it holds. A proposal picks a slot, truncates its
//! cache to the longest common prefix of those tokens and the history (the
//! rejected draft tokens' rows are dropped there), feeds the history's
//! tokens past it, then decodes `k` tokens greedily. Which slot a history
//! gets changes only the cost, never the draft: a slot holds no state but
//! the KV of its tokens.
//!
//! A slot's cache starts at [`MIN_CAPACITY`] positions and doubles in place
//! ([`model::KvCache::grow`]) as its history grows, up to the draft model's
//! context; a history past that gets no draft.
//!
//! A slot "belongs" to a sequence when the history continues what the slot
//! saw at its last proposal (only the draft region can differ), so
//! concurrent sequences keep their own slots; a new sequence takes a free
//! slot, else the one sharing the longest prefix, else the least recently
//! used one.
//!
//! # Limits
//! Draft models with sliding-window layers (their ring caches cannot be cut
//! back) or linear-attention layers (no rollback of a recurrent state) are
//! refused.

use super::Drafter;
use crate::generate::Engine;
use crate::sampler::argmax;
use crate::tokenizer::Tokenizer;
use crate::EngineError;
use model::{KvCache, NoComm};
use std::path::Path;

/// Smallest cache a slot allocates (positions); it doubles from there.
const MIN_CAPACITY: usize = 256;

/// One sequence's draft KV: `tokens[i]` is the input at position `i`.
struct Slot {
    cache: Option<KvCache>,
    tokens: Vec<u32>,
    /// The history's length at this slot's last proposal (see the module notes).
    base: usize,
    /// Proposal counter at the last use (least recently used is evicted).
    used: u64,
}

/// A draft model run greedily on rank 0 ([`ModelDrafter::open`]).
pub struct ModelDrafter {
    engine: Engine,
    slots: Vec<Slot>,
    clock: u64,
    /// A drafted token's cost in target decode steps ([`Drafter::cost`]).
    cost: f32,
    /// Whether a failure was logged already (once, not at every step).
    warned: bool,
}

/// Why `draft` cannot draft for `target`, if it cannot: model vocabularies
/// (embedding rows) and, where both have one, tokenizers must agree
/// (their sizes and the bytes of a spread of tokens).
pub fn vocab_mismatch(
    target_vocab: usize,
    target_tok: Option<&Tokenizer>,
    draft_vocab: usize,
    draft_tok: Option<&Tokenizer>,
) -> Option<String> {
    match (target_tok, draft_tok) {
        (Some(t), Some(d)) => {
            if t.vocab_size() != d.vocab_size() {
                return Some(format!("its tokenizer has {} tokens, the target's {}", d.vocab_size(), t.vocab_size()));
            }
            let n = t.vocab_size() as u32;
            // The first and last 16 tokens (specials live there) and 64 between.
            let spread = (0..16.min(n)).chain((0..64).map(|i| i * (n / 64).max(1))).chain(n.saturating_sub(16)..n);
            for id in spread.filter(|&id| id < n) {
                if t.token_bytes(id) != d.token_bytes(id) {
                    let show = |b: Vec<u8>| format!("{:?}", String::from_utf8_lossy(&b));
                    return Some(format!(
                        "token {id} is {} in its tokenizer, {} in the target's",
                        show(d.token_bytes(id)),
                        show(t.token_bytes(id))
                    ));
                }
            }
            None
        }
        (None, None) if target_vocab != draft_vocab => {
            Some(format!("its vocabulary has {draft_vocab} tokens, the target's {target_vocab}"))
        }
        (None, None) => None,
        (Some(_), None) => Some("it has no tokenizer to compare with the target's".into()),
        (None, Some(_)) => Some("the target has no tokenizer to compare with its".into()),
    }
}

impl ModelDrafter {
    /// Loads the draft model at `path` (GGUF or HF directory) to draft for
    /// `target`, with `threads` threads and up to `slots` sequences' KV kept
    /// at once (the scheduler's batch size). Refuses, naming the file, one
    /// that does not load, whose vocabulary differs from the target's, or
    /// whose cache cannot roll back.
    pub fn open(path: &Path, target: &Engine, threads: usize, slots: usize) -> Result<ModelDrafter, EngineError> {
        Self::open_for(path, &target.model, target.tokenizer.as_ref(), threads, slots)
    }

    /// [`ModelDrafter::open`] beside a target shard that has no engine of
    /// its own (a cluster rank running the draft model, `--draft-rank`).
    pub fn open_for(
        path: &Path,
        target_m: &model::Model,
        target_tok: Option<&Tokenizer>,
        threads: usize,
        slots: usize,
    ) -> Result<ModelDrafter, EngineError> {
        let refuse = |why: String| EngineError::DraftModel { path: path.to_path_buf(), why };
        let files = formats::open_model(path).map_err(|e| refuse(e.to_string()))?;
        let tok = Tokenizer::from_source(&files.tokenizer).map_err(|e| refuse(e.to_string()))?;
        // Before the weights load: a wrong file is refused at once.
        let target_vocab = target_m.config.vocab_size;
        if let Some(why) = vocab_mismatch(target_vocab, target_tok, files.config.vocab_size, tok.as_ref()) {
            return Err(refuse(format!("not the target's vocabulary: {why}")));
        }
        let shard = model::ShardSpec::full(files.config.n_layers);
        let m =
            model::Model::load(&files, &shard, &model::LoadOptions::default()).map_err(|e| refuse(e.to_string()))?;
        if m.state_pool(1).is_some() {
            return Err(refuse("its linear-attention states cannot roll back a rejected draft".into()));
        }
        if m.max_window().is_some() {
            return Err(refuse("its sliding-window caches cannot roll back a rejected draft".into()));
        }
        // Decoding reads every weight once per token: the weights read per
        // token, the draft's over the whole target's (rank 0 may hold a
        // pipeline stage's layers only), estimate the cost.
        let local_layers = target_m.shard.layers.len().max(1) as f32;
        let target_bytes = target_m.weight_bytes_per_token() as f32 * target_m.config.n_layers as f32 / local_layers;
        let estimate = m.weight_bytes_per_token() as f32 / target_bytes.max(1.0);
        // `SHARDLM_DRAFT_COST` replaces the estimate (0: draft at every step).
        let cost = std::env::var("SHARDLM_DRAFT_COST").ok().and_then(|v| v.parse::<f32>().ok()).unwrap_or(estimate);
        let mut engine = Engine::new(m, tok, threads);
        engine.prefill_chunk = 256;
        let slots = (0..slots.max(1)).map(|_| Slot { cache: None, tokens: Vec::new(), base: 0, used: 0 }).collect();
        tracing::info!("draft model {}: a drafted token costs {cost:.2} target decode steps", path.display());
        Ok(ModelDrafter { engine, slots, clock: 0, cost: cost.max(0.0), warned: false })
    }

    /// Sets the cost of a drafted token, in target decode steps, in place of
    /// the estimate from the weights (tests: 0 drafts at every step).
    pub fn set_cost(&mut self, cost: f32) {
        self.cost = cost.max(0.0);
    }

    /// The slot for `history` (see the module notes on ownership).
    fn pick(&self, history: &[u32]) -> usize {
        let lcp = |s: &Slot| common_prefix(&s.tokens, history);
        let owned = (0..self.slots.len())
            .filter(|&i| self.slots[i].used > 0 && lcp(&self.slots[i]) >= self.slots[i].base)
            .max_by_key(|&i| lcp(&self.slots[i]));
        if let Some(i) = owned {
            return i;
        }
        if let Some(free) = self.slots.iter().position(|s| s.used == 0) {
            return free;
        }
        (0..self.slots.len()).max_by_key(|&i| (lcp(&self.slots[i]), std::cmp::Reverse(self.slots[i].used))).unwrap_or(0)
    }

    /// Up to `k` greedy tokens after `history`, with slot `i`'s cache.
    fn draft(&mut self, i: usize, history: &[u32], k: usize) -> Result<Vec<u32>, EngineError> {
        let ctx = self.engine.context_length();
        // Positions written: the history, then the draft's first k − 1 tokens.
        let need = history.len() + k.saturating_sub(1);
        if history.is_empty() || k == 0 || need > ctx {
            return Ok(Vec::new());
        }
        let slot = &mut self.slots[i];
        // `need ≤ ctx` (checked above), so the capacity holds it.
        let capacity = need.next_power_of_two().max(MIN_CAPACITY).min(ctx);
        // Lengthened in place where it can be: the KV written so far stays valid.
        let fits = match slot.cache.as_mut() {
            Some(c) => c.capacity >= need || c.grow(capacity),
            None => false,
        };
        if !fits {
            slot.cache = Some(self.engine.model.new_cache(capacity));
            slot.tokens.clear();
        }
        let cache = slot.cache.as_mut().expect("allocated above");
        // Keep at least the last token to feed: its logits give the first draft token.
        let keep = common_prefix(&slot.tokens, history).min(history.len() - 1);
        cache.truncate(keep);
        slot.tokens.truncate(keep);
        let (mut logits, _) = self.engine.prefill(cache, &history[keep..], false, &NoComm)?;
        slot.tokens.extend_from_slice(&history[keep..]);
        let mut out = Vec::with_capacity(k);
        loop {
            let next = argmax(&logits);
            out.push(next);
            if out.len() == k {
                break;
            }
            (logits, _) = self.engine.prefill(cache, &[next], false, &NoComm)?;
            slot.tokens.push(next);
        }
        slot.base = history.len();
        Ok(out)
    }
}

impl Drafter for ModelDrafter {
    fn cost(&self) -> f32 {
        self.cost
    }

    fn propose(&mut self, history: &[u32], k: usize) -> Vec<u32> {
        self.clock += 1;
        let i = self.pick(history);
        self.slots[i].used = self.clock;
        match self.draft(i, history, k) {
            Ok(d) => d,
            Err(e) => {
                // The slot's cache may be half written: start it over next time.
                self.slots[i].tokens.clear();
                if !std::mem::replace(&mut self.warned, true) {
                    tracing::warn!("the draft model failed ({e}); the step goes without a draft");
                }
                Vec::new()
            }
        }
    }
}

/// How many leading tokens `a` and `b` share.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vocabularies_without_tokenizers_compare_by_size() {
        assert!(vocab_mismatch(1024, None, 1024, None).is_none());
        let why = vocab_mismatch(1024, None, 2048, None).expect("refused");
        assert!(why.contains("2048") && why.contains("1024"), "{why}");
    }

    #[test]
    fn common_prefix_and_argmax() {
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4, 5]), 2);
        assert_eq!(common_prefix(&[], &[1]), 0);
        assert_eq!(argmax(&[0.5, 2.0, 2.0, -1.0]), 1);
    }
}
