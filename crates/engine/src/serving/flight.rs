//! What the scheduler keeps about a step between sending it and collecting
//! it ([`Flight`]), and a planned step's items before they are sent
//! ([`PlanItem`]).

use super::blocks::BlockHash;
use super::seq::Seq;
use crate::dist_batch::BatchItem;
use model::LogitsMode;
use std::time::Instant;

/// One sequence's item in a step in flight.
#[derive(Debug, Clone, Copy)]
pub(super) struct FlightItem {
    pub(super) id: u64,
    /// Rows in the step (`1 + drafts` for a verify item).
    pub(super) n: usize,
    /// Whether its logits are every prompt position's (`want_prompt_logits`).
    pub(super) all: bool,
    /// Draft tokens checked by it (0: not a verify item); its `sub_len`
    /// counts only the first row, the rest are not in `history` yet.
    pub(super) drafts: usize,
}

impl FlightItem {
    /// Positions of `history` it sent.
    pub(super) fn sent(&self) -> usize {
        self.n - self.drafts
    }
}

/// A step in flight: which sequences it carries and what to do when it
/// comes back.
pub(super) struct Flight {
    /// In the step's item order.
    pub(super) items: Vec<FlightItem>,
    /// (sequence id, prefix hash, snapshot slot) to commit.
    pub(super) snaps: Vec<(u64, BlockHash, u32)>,
    /// (sequence id, snapshot slot) restored by this step: pinned until then.
    pub(super) restores: Vec<(u64, u32)>,
    pub(super) tokens: usize,
    pub(super) sent: Instant,
}

/// One sequence's share of a planned step, turned into a [`BatchItem`]
/// (which borrows the sequence) right before sending.
pub(super) struct PlanItem {
    pub(super) index: usize,
    pub(super) start: usize,
    pub(super) n: usize,
    pub(super) mode: LogitsMode,
    /// Every token is a prompt token ([`model::SeqStep::prompt`]).
    pub(super) prompt: bool,
    pub(super) restore: Option<u32>,
    pub(super) snapshot: Option<u32>,
    /// A verify item: its tokens are the sequence's prepared draft.
    pub(super) verify: bool,
}

impl PlanItem {
    pub(super) fn item<'a>(&self, running: &'a [Seq]) -> BatchItem<'a> {
        let s = &running[self.index];
        let tokens = match (self.verify, s.spec.as_ref()) {
            (true, Some(sp)) => &sp.tokens[..],
            _ => &s.history[self.start..self.start + self.n],
        };
        BatchItem {
            tokens,
            table: &s.blocks,
            start: self.start,
            mode: self.mode,
            prompt: self.prompt,
            state: s.slot,
            restore: self.restore,
            snapshot: self.snapshot,
            window: s.window.view(),
        }
    }
}
