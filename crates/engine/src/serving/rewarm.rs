//! Re-warming a finished reply's blocks for the prefix cache (`serve` only).
//!
//! The prefix cache registers only blocks of prompt positions
//! ([`super::seq::register_full_blocks`] says why: a generated token's KV
//! row is a decode step's, and reusing it would make a later prompt differ
//! from a cold run in the last bits). An agent's next turn contains the
//! reply, so without more it would prefill the reply again before its first
//! token. Instead, when a sequence finishes with full blocks past its
//! prompt, the scheduler keeps its history up to the last full block, and
//! when the server is idle (no request waits or runs; a request that comes
//! meanwhile makes it give way, [`Scheduler::yield_rewarm`]) it runs that
//! as a prompt of its own, with
//! `max_tokens = 0` and nobody listening: the prompt's blocks come from the
//! cache, the reply's are computed as prompt rows and registered (and, with
//! the disk tier, written through), exactly what a cold run of the next turn
//! computes. The work is the prefill the next turn would otherwise do, moved
//! to idle time; a server never idle simply does it in the next turn. A
//! re-warm that would need blocks a request needs is dropped (preempted,
//! never requeued), and it is not counted as a request or a prefix query.

use super::blocks::block_hashes;
use super::scheduler::{Scheduler, SeqHooks, SeqOutcome, Submission};
use super::seq::{release_seq, Seq};
use crate::draft::DraftChoice;
use crate::generate::{GenerateHooks, GenerateRequest};
use crate::sampler::SamplingParams;
use crate::EngineError;

/// Most replies kept for re-warming; older ones are dropped first.
const MAX_QUEUED: usize = 8;

/// A re-warming prompt's callbacks: nobody listens.
struct Unheard;

impl GenerateHooks for Unheard {
    fn on_text(&mut self, _text: &str) {}
}

impl SeqHooks for Unheard {
    fn done(&mut self, _result: Result<SeqOutcome, EngineError>) {}
}

impl Scheduler {
    /// Re-warm finished replies' blocks when idle (`serve` turns it on; a
    /// benchmark's timing must not include the extra prefill).
    pub fn set_rewarm(&mut self, on: bool) {
        self.rewarm_on = on && self.cfg.prefix_cache;
        if !self.rewarm_on {
            self.rewarm.clear();
        }
    }

    /// Called when `s` finished: keeps its history up to the last full
    /// block, when that reaches past the prompt's full blocks.
    pub(super) fn queue_rewarm(&mut self, s: &Seq) {
        let b = self.cfg.block;
        let full = s.history.len() / b * b;
        if !self.rewarm_on || s.req.want_prompt_logits || full <= s.req.prompt_ids.len() / b * b {
            return;
        }
        if self.rewarm.len() == MAX_QUEUED {
            self.rewarm.pop_front();
        }
        self.rewarm.push_back(s.history[..full].to_vec());
    }

    /// Submits the oldest kept reply when the server is idle (no request
    /// waits or runs), unless its blocks are all cached already.
    pub(super) fn admit_rewarm(&mut self) {
        let idle = |s: &Scheduler| s.waiting.is_empty() && s.running.iter().all(|r| r.rewarm);
        while idle(self) && self.running.len() < self.cfg.max_batch {
            let Some(tokens) = self.rewarm.pop_front() else { return };
            if self.blocks.has_all(&block_hashes(&tokens, self.cfg.block)) {
                continue;
            }
            // Only into room the pool has now (counting its cached prefix as
            // room too): it must never queue ahead of a request.
            if tokens.len().div_ceil(self.cfg.block) + 1 > self.blocks.available() {
                continue;
            }
            let request = GenerateRequest {
                prompt_ids: tokens,
                max_tokens: 0,
                sampling: SamplingParams::default(),
                stop_strings: Vec::new(),
                ignore_eos: true,
                want_prompt_logits: false,
                draft: DraftChoice::Off,
            };
            let queued = self.waiting.len();
            self.submit(Submission { request, hooks: Box::new(Unheard) });
            // Not a client's request: the prefix cache's counters skip it.
            if self.waiting.len() > queued {
                if let Some(s) = self.waiting.back_mut() {
                    s.cached_tokens = Some(0);
                    s.rewarm = true;
                }
            }
            return;
        }
    }

    /// A re-warm gives way to requests: while any request waits or runs, a
    /// re-warm with no step in flight gives its blocks back (the full ones it
    /// computed stay cached) and goes back to the front of the queue, to go
    /// on from there when the server is idle again. Its prefill chunks would
    /// otherwise ride in the requests' decode steps and slow every stream
    /// for as long as it runs; a next turn that arrives meanwhile computes
    /// the blocks it lacks in its own prefill, as it would without re-warming.
    pub(super) fn yield_rewarm(&mut self) {
        let busy = !self.waiting.is_empty() || self.running.iter().any(|s| !s.rewarm);
        if !busy || !self.running.iter().any(|s| s.rewarm && !s.busy()) {
            return;
        }
        let mut i = 0;
        while i < self.running.len() {
            if !self.running[i].rewarm || self.running[i].busy() {
                i += 1;
                continue;
            }
            let mut s = self.running.remove(i);
            release_seq(self.groups(), &mut s);
            if self.rewarm.len() == MAX_QUEUED {
                self.rewarm.pop_back();
            }
            self.rewarm.push_front(std::mem::take(&mut s.history));
            self.stats.rewarm_yields += 1;
        }
    }
}
