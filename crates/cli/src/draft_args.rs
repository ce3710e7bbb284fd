//! The speculative-decoding flags shared by `run`, `bench` and `serve`.

use anyhow::{bail, Result};
use clap::Args;
use engine::draft::{DraftChoice, DraftParams, Drafter, ModelDrafter};
use engine::generate::Engine;
use std::path::PathBuf;

#[derive(Args, Debug, Clone)]
pub struct DraftArgs {
    /// Speculative decoding: `ngram` drafts the next tokens by looking the
    /// last few up in the prompt and output (and a pool shared by requests),
    /// `model` by decoding with `--draft-model`; either way one forward pass
    /// checks them. `none` turns it off. Default: `model` with
    /// `--draft-model`, else `none`.
    #[arg(long, value_parser = ["none", "ngram", "model"])]
    pub draft: Option<String>,
    /// A small model with the same tokenizer (GGUF or HF directory) that
    /// drafts for this one, in this process (rank 0 of a cluster).
    #[arg(long, value_name = "M")]
    pub draft_model: Option<PathBuf>,
    /// Most draft tokens per step (1..=16); the length adapts to the acceptance rate.
    #[arg(long, default_value_t = DraftParams::default().max)]
    pub draft_max: usize,
    /// Fewest draft tokens worth a verify step.
    #[arg(long, default_value_t = DraftParams::default().min)]
    pub draft_min: usize,
}

impl DraftArgs {
    /// `--draft`, or what it defaults to.
    fn kind(&self) -> &str {
        match (&self.draft, &self.draft_model) {
            (Some(d), _) => d,
            (None, Some(_)) => "model",
            (None, None) => "none",
        }
    }

    /// The drafter asked for, checked; `None` for `--draft none`.
    pub fn params(&self) -> Result<Option<DraftParams>> {
        let p = DraftParams { max: self.draft_max, min: self.draft_min };
        let on = match self.kind() {
            "none" => false,
            "ngram" => true,
            "model" if self.draft_model.is_none() => bail!("bad flag value: --draft model needs --draft-model M"),
            "model" => true,
            other => bail!("unknown --draft {other} (use ngram, model or none)"),
        };
        if self.draft_model.is_some() && self.kind() != "model" {
            bail!("bad flag value: --draft-model drafts with --draft model, not --draft {}", self.kind());
        }
        if !on {
            return Ok(None);
        }
        match p.validate() {
            Ok(()) => Ok(Some(p)),
            Err(e) => bail!("bad flag value: {e}"),
        }
    }

    /// The draft model's drafter for `target` (rank 0), keeping the KV of up
    /// to `slots` sequences; `None` without `--draft-model`.
    pub fn drafter(&self, target: &Engine, threads: usize, slots: usize) -> Result<Option<Box<dyn Drafter>>> {
        let Some(path) = &self.draft_model else { return Ok(None) };
        // An alias (`smollm2-135m`) is fetched like `--model`'s.
        let path = match path.to_str() {
            Some(name) => crate::model_source::resolve(Some(name))?,
            None => path.clone(),
        };
        let d = ModelDrafter::open(&path, target, threads, slots)?;
        Ok(Some(Box::new(d)))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn args(draft: Option<&str>, model: Option<&str>) -> DraftArgs {
        DraftArgs {
            draft: draft.map(str::to_string),
            draft_model: model.map(PathBuf::from),
            draft_max: DraftParams::default().max,
            draft_min: DraftParams::default().min,
        }
    }

    #[test]
    fn a_draft_model_implies_draft_model_and_needs_one() {
        assert!(args(None, None).params().unwrap().is_none());
        assert!(args(None, Some("d.gguf")).params().unwrap().is_some());
        assert!(args(Some("model"), Some("d.gguf")).params().unwrap().is_some());
        assert!(args(Some("ngram"), None).params().unwrap().is_some());
        let e = args(Some("model"), None).params().unwrap_err().to_string();
        assert!(e.contains("--draft-model"), "{e}");
        let e = args(Some("ngram"), Some("d.gguf")).params().unwrap_err().to_string();
        assert!(e.contains("--draft model"), "{e}");
    }
}
