//! The speculative-decoding flags shared by `run`, `bench` and `serve`.

use anyhow::{bail, Result};
use clap::Args;
use engine::draft::{DraftChoice, DraftParams};

#[derive(Args, Debug, Clone)]
pub struct DraftArgs {
    /// Speculative decoding: `ngram` drafts the next tokens by looking the
    /// last few up in the prompt and output (and a pool shared by requests),
    /// and checks them in one forward pass; `none` turns it off.
    #[arg(long, default_value = "none", value_parser = ["none", "ngram"])]
    pub draft: String,
    /// Most draft tokens per step (1..=16); the length adapts to the acceptance rate.
    #[arg(long, default_value_t = DraftParams::default().max)]
    pub draft_max: usize,
    /// Fewest draft tokens worth a verify step.
    #[arg(long, default_value_t = DraftParams::default().min)]
    pub draft_min: usize,
}

impl DraftArgs {
    /// The drafter asked for, checked; `None` for `--draft none`.
    pub fn params(&self) -> Result<Option<DraftParams>> {
        let p = DraftParams { max: self.draft_max, min: self.draft_min };
        match self.draft.as_str() {
            "none" => Ok(None),
            "ngram" => match p.validate() {
                Ok(()) => Ok(Some(p)),
                Err(e) => bail!("bad flag value: {e}"),
            },
            other => bail!("unknown --draft {other} (use ngram or none)"),
        }
    }

    /// A request's choice under these flags.
    pub fn choice(&self) -> Result<DraftChoice> {
        Ok(self.params()?.map_or(DraftChoice::Off, DraftChoice::On))
    }
}

/// The acceptance rate of `accepted` of `drafted` tokens (0 with none drafted).
pub fn acceptance(drafted: usize, accepted: usize) -> f64 {
    if drafted == 0 {
        0.0
    } else {
        accepted as f64 / drafted as f64
    }
}
