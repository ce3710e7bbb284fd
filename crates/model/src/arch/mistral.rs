//! Mistral: the llama layer plus an optional sliding attention window.

use super::ArchSpec;
use formats::ModelConfig;

pub fn spec(cfg: &ModelConfig) -> ArchSpec {
    ArchSpec { sliding_window: cfg.sliding_window, ..super::llama::spec(cfg) }
}
