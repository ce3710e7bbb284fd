//! The speculative-decoding flags shared by `run`, `bench` and `serve`.

use anyhow::{bail, Context, Result};
use clap::Args;
use engine::draft::remote::RankDrafter;
use engine::draft::{vocab_mismatch, DraftChoice, DraftParams, ModelDraft, ModelDrafter, RemoteDrafter};
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
    /// Run `--draft-model` on rank R of the cluster instead of rank 0: a rank
    /// that reads rank 0's commands directly (any rank under tensor
    /// parallelism; in a pipeline a rank of the last stage, which embeds).
    #[arg(long, value_name = "R", requires = "draft_model")]
    pub draft_rank: Option<usize>,
}

/// Sequences' draft KV a draft rank keeps (allocated as they come).
const RANK_SLOTS: usize = 16;

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

    /// The draft model's path, an alias (`smollm2-135m`) fetched like `--model`'s.
    fn draft_path(&self) -> Result<Option<PathBuf>> {
        let Some(path) = &self.draft_model else { return Ok(None) };
        Ok(Some(match path.to_str() {
            Some(name) => crate::model_source::resolve(Some(name))?,
            None => path.clone(),
        }))
    }

    /// Rank 0: the draft model's drafter for `target`, keeping the KV of up
    /// to `slots` sequences, or (`--draft-rank R`) the link to rank R, which
    /// loaded it (checked here: its vocabulary against the target's, and
    /// that R can answer); `None` without `--draft-model`.
    pub fn drafter(&self, target: &mut Engine, threads: usize, slots: usize) -> Result<Option<ModelDraft>> {
        let Some(path) = self.draft_path()? else { return Ok(None) };
        match self.draft_rank.filter(|&r| r != 0) {
            None => Ok(Some(ModelDraft::Here(Box::new(ModelDrafter::open(&path, target, threads, slots)?)))),
            Some(rank) => {
                let files = formats::open_model(&path).with_context(|| format!("draft model {}", path.display()))?;
                let tok = engine::Tokenizer::from_source(&files.tokenizer)?;
                let target_vocab = target.model.config.vocab_size;
                let tt = target.tokenizer.as_ref();
                if let Some(why) = vocab_mismatch(target_vocab, tt, files.config.vocab_size, tok.as_ref()) {
                    bail!("draft model {}: not the target's vocabulary: {why}", path.display());
                }
                Ok(Some(ModelDraft::Rank(RemoteDrafter::connect(target, rank)?)))
            }
        }
    }

    /// Rank `rank` of a cluster (not 0): the draft model it runs for rank 0
    /// (`--draft-rank`), beside its shard `m`. A draft model that does not
    /// load is reported here and leaves the rank without one (rank 0 then
    /// refuses the run, naming this rank): the shard keeps serving.
    pub fn rank_drafter(
        &self,
        rank: usize,
        m: &model::Model,
        files: &formats::ModelFiles,
        threads: usize,
    ) -> Option<RankDrafter> {
        if self.draft_rank != Some(rank) || rank == 0 {
            return None;
        }
        let opened = self.draft_path().map_err(|e| e.to_string()).and_then(|p| {
            let p = p.ok_or_else(|| "no --draft-model".to_string())?;
            let tok = engine::Tokenizer::from_source(&files.tokenizer).map_err(|e| e.to_string())?;
            ModelDrafter::open_for(&p, m, tok.as_ref(), threads, RANK_SLOTS).map_err(|e| e.to_string())
        });
        match opened {
            Ok(d) => Some(RankDrafter::new(d)),
            Err(e) => {
                eprintln!("rank {rank}: --draft-rank: {e}");
                None
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn args(draft: Option<&str>, model: Option<&str>) -> DraftArgs {
        DraftArgs {
            draft: draft.map(str::to_string),
            draft_model: model.map(PathBuf::from),
            draft_max: DraftParams::default().max,
            draft_min: DraftParams::default().min,
            draft_rank: None,
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
