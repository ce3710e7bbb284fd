//! One sequence of the batching scheduler ([`super::Scheduler`]): its tokens,
//! its KV blocks and state slot, how far its KV is computed and how far it
//! has been sent, and what it gives back when it leaves.
//!
//! # Positions
//! `history` is the prompt plus every sampled token. `kv_len` positions of it
//! have KV in its blocks (steps that came back); `sub_len ≥ kv_len` have been
//! sent in steps (the rest of `sub_len − kv_len` is in flight, in a pipeline's
//! micro-batches). The next step may send `history[sub_len..]`: a decoding
//! sequence has one token to send once its last step came back and was
//! sampled, none while that step is in flight; a prompt may have several
//! chunks in flight at once.

use super::blocks::{block_hashes, chain_hash, BlockHash, BlockManager};
use super::scheduler::{SeqHooks, SeqOutcome};
use super::spec::SpecState;
use super::state_slots::StateSlots;
use super::windows::{SeqWindow, WindowGroup};
use crate::generate::{FinishReason, GenerateRequest, TextStream};
use crate::sampler::Sampler;
use crate::tokenizer::StreamDecoder;
use crate::tokenizer::Tokenizer;

pub(super) struct Seq {
    /// Names the sequence in the steps in flight; a fresh one at every
    /// admission, so a step sent before a preemption finds no one.
    pub id: u64,
    pub req: GenerateRequest,
    pub hooks: Box<dyn SeqHooks>,
    pub sampler: Sampler,
    pub history: Vec<u32>,
    pub out_ids: Vec<u32>,
    pub stream: TextStream,
    pub decoder: StreamDecoder,
    pub blocks: Vec<u32>,
    /// Positions of `history` whose KV is in `blocks`.
    pub kv_len: usize,
    /// Positions of `history` sent in steps (`≥ kv_len`).
    pub sub_len: usize,
    /// Chained hashes of the full blocks registered so far (prefix cache).
    pub hashes: Vec<BlockHash>,
    /// Prompt tokens served by the prefix cache at first admission.
    pub cached_tokens: Option<usize>,
    pub greedy: bool,
    /// Set when sampling ended the sequence.
    pub finish: Option<FinishReason>,
    /// Hybrid models: the recurrent-state slot, and a snapshot slot to
    /// restore it from at the next step.
    pub slot: Option<u32>,
    pub restore: Option<u32>,
    /// Its blocks in the sliding-window group.
    pub window: SeqWindow,
    /// Every prompt position's logits so far (`want_prompt_logits`).
    pub prompt_logits: Vec<f32>,
    /// Speculative decoding's state, when the sequence speculates.
    pub spec: Option<SpecState>,
    /// A finished reply re-warmed for the prefix cache ([`super::rewarm`]):
    /// nobody waits for it, so a preemption drops it.
    pub rewarm: bool,
}

/// What a scheduler hands out: full blocks, window blocks, state slots.
pub(super) struct Groups<'a> {
    pub blocks: &'a mut BlockManager,
    pub states: &'a mut Option<StateSlots>,
    pub windows: &'a mut Option<WindowGroup>,
}

/// Gives back what a sequence leaving the batch holds: its blocks (full ones
/// stay cached), its window blocks, and its state slot (a pending restore's
/// pin too). Steps still in flight with it write these blocks before any
/// later step can (every rank runs steps in order), so they may be handed out
/// again at once.
pub(super) fn release_seq(g: Groups<'_>, s: &mut Seq) {
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
    /// Tokens still to run through the model (sent or not).
    pub fn pending(&self) -> usize {
        self.history.len() - self.kv_len
    }

    /// Tokens a new step may send now.
    pub fn ready(&self) -> usize {
        self.history.len() - self.sub_len
    }

    /// Whether a step with this sequence is in flight.
    pub fn busy(&self) -> bool {
        self.sub_len > self.kv_len
    }

    /// Most tokens of this sequence one step may run. A prompt runs in chunks;
    /// tokens it generated run one per step even when they are recomputed
    /// (after a preemption or a lost rank), because decode and prefill sum in
    /// different orders: replaying them as decode steps rebuilds the very KV
    /// (and so the very next logits) the uninterrupted run had.
    pub fn step_cap(&self) -> usize {
        match self.req.prompt_ids.len().checked_sub(self.sub_len) {
            Some(left) if left > 0 => left,
            _ => 1,
        }
    }

    /// Samples the next token from `logits`, or checks `draft`
    /// against them ([`Sampler::sample_draft`]); returns (whether it is done
    /// (its `finish` is then set), whether the token is the draft). Mirrors
    /// `Engine::generate_hooked`.
    pub fn sample(
        &mut self,
        logits: &mut [f32],
        tok: Option<&Tokenizer>,
        draft: Option<u32>,
        eos_ids: &[u32],
    ) -> (bool, bool) {
        let s = self;
        let remaining = s.req.max_tokens - s.out_ids.len();
        if remaining == 0 {
            s.finish = Some(FinishReason::Length);
            return (true, false);
        }
        s.hooks.constrain(logits, remaining);
        let (id, took) = match draft {
            Some(d) => s.sampler.sample_draft(logits, &s.history, d),
            None => (s.sampler.sample(logits, &s.history), false),
        };
        if !s.req.ignore_eos && eos_ids.contains(&id) {
            s.finish = Some(FinishReason::Stop);
            return (true, took);
        }
        s.out_ids.push(id);
        s.history.push(id);
        let go_on = s.hooks.on_token(id);
        if let Some(tok) = tok {
            let piece = s.decoder.push(tok, id);
            let hooks = &mut s.hooks;
            if s.stream.push(&piece, &mut |t| hooks.on_text(t)) {
                s.finish = Some(FinishReason::Stop);
                return (true, took);
            }
        }
        if !go_on {
            s.finish = Some(FinishReason::Stop);
        } else if s.out_ids.len() == s.req.max_tokens {
            s.finish = Some(FinishReason::Length);
        }
        (s.finish.is_some(), took)
    }

    /// Back to no KV at all (preempted, or its cluster was lost).
    pub fn forget_kv(&mut self) {
        // The recomputation makes the prompt's logits again.
        self.prompt_logits.clear();
        self.hashes.clear();
        // A prepared draft was for the KV just dropped.
        if let Some(sp) = self.spec.as_mut() {
            sp.tokens.clear();
        }
        self.kv_len = 0;
        self.sub_len = 0;
    }
}

/// A hybrid model's prefill piece of sequence `s`, at most `n` tokens from
/// `s.sub_len`: it ends on a multiple of the delta rule's chunk (unless it
/// ends the prompt, or that would leave nothing), or at the prompt's last
/// snapshot boundary, which then gets a snapshot slot (with its prefix hash).
pub(super) fn hybrid_piece(
    st: &mut StateSlots,
    s: &Seq,
    n: usize,
    block: usize,
    cache: bool,
) -> (usize, Option<(BlockHash, u32)>) {
    let (start, len) = (s.sub_len, s.history.len());
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
///
/// Only blocks of prompt positions are registered. A generated token's KV
/// row comes from a decode step, whose attention sums in another order than
/// a prefill chunk's (it splits the keys between threads, and reads them in
/// place); a later prompt that contains the reply (an agent's next turn)
/// computes those positions as prompt rows when cold. Reusing the decode
/// rows would change its logits in the last bits, and a near-tie in greedy
/// decoding would then answer differently from a cold server. The reply's
/// blocks are made again as prompt rows when the server is idle
/// ([`super::rewarm`]).
pub(super) fn register_full_blocks(blocks: &mut BlockManager, mut windows: Option<&mut WindowGroup>, s: &mut Seq) {
    let b = blocks.block;
    let upto = s.kv_len.min(s.req.prompt_ids.len());
    while (s.hashes.len() + 1) * b <= upto && s.hashes.len() < s.blocks.len() {
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

/// Flushes the text and builds the outcome of a finished sequence.
pub(super) fn finish(s: &mut Seq) -> SeqOutcome {
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
        prompt_logits: s.req.want_prompt_logits.then(|| std::mem::take(&mut s.prompt_logits)),
        drafted: s.spec.as_ref().map_or(0, |sp| sp.drafted),
        accepted: s.spec.as_ref().map_or(0, |sp| sp.accepted),
    }
}
