//! Drafters for speculative decoding: what proposes the next tokens that a
//! verify step then checks in one pass ([`crate::serving`]'s `spec` module).

pub mod model_drafter;
pub mod ngram;
pub mod remote;

pub use model_drafter::{vocab_mismatch, ModelDrafter};
pub use ngram::{lookup, lookup_matched, NgramPool};
pub use remote::RemoteDrafter;

/// A drafter in place of the n-gram lookup ([`crate::serving::Scheduler::set_drafter`]):
/// tests drive verification with it (drafts that are all right, all wrong,
/// or anything between); [`ModelDrafter`] drafts with a small model.
pub trait Drafter: Send {
    /// Up to `k` tokens to follow `history` (the prompt and every accepted token).
    fn propose(&mut self, history: &[u32], k: usize) -> Vec<u32>;

    /// What drafting one token costs, in decode steps of the target model
    /// (0 for a lookup; about the weight ratio for a draft model): the
    /// scheduler's draft length and pausing weigh it ([`crate::serving`]'s
    /// `spec` module).
    fn cost(&self) -> f32 {
        0.0
    }
}

/// Where a draft model runs: in this process ([`ModelDrafter`], or any
/// [`Drafter`]), or on another rank of the cluster ([`RemoteDrafter`],
/// `--draft-rank`).
pub enum ModelDraft {
    Here(Box<dyn Drafter>),
    Rank(RemoteDrafter),
}

/// How a sequence speculates: an n-gram (prompt lookup) drafter proposing
/// between `min` and `max` tokens per step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DraftParams {
    /// Most draft tokens per verify step.
    pub max: usize,
    /// Fewer proposed tokens than this: a plain decode step instead.
    pub min: usize,
}

/// Most draft tokens per step: a verify item of `1 + max` rows must stay
/// below the matmuls' GEMM threshold (32 rows) to compute exactly like decode.
pub const MAX_DRAFT: usize = 16;

impl Default for DraftParams {
    fn default() -> Self {
        DraftParams { max: 8, min: 1 }
    }
}

impl DraftParams {
    /// Checks the bounds; the message names the bad one.
    pub fn validate(&self) -> Result<(), String> {
        if self.max == 0 || self.max > MAX_DRAFT {
            return Err(format!("draft-max must be in 1..={MAX_DRAFT}, got {}", self.max));
        }
        if self.min == 0 || self.min > self.max {
            return Err(format!("draft-min must be in 1..=draft-max ({}), got {}", self.max, self.min));
        }
        Ok(())
    }
}

/// A request's choice: the scheduler's default (`--draft` of `serve`), off,
/// or on with these bounds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DraftChoice {
    #[default]
    Default,
    Off,
    On(DraftParams),
}

impl DraftChoice {
    /// What a request gets, given the scheduler's default.
    pub fn resolve(self, default: Option<DraftParams>) -> Option<DraftParams> {
        match self {
            DraftChoice::Default => default,
            DraftChoice::Off => None,
            DraftChoice::On(p) => Some(p),
        }
    }
}
