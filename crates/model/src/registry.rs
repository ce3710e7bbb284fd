//! The architecture registry: an exhaustive enum, so adding one makes the compiler
//! point at every place that must know about it.

use crate::arch::{self, ArchSpec};
use formats::ModelConfig;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
}

impl Arch {
    /// From HF `model_type` (GGUF architectures are mapped to these by formats).
    pub fn from_name(name: &str) -> Option<Arch> {
        Some(match name {
            "llama" => Arch::Llama,
            "mistral" => Arch::Mistral,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            _ => return None,
        })
    }

    pub fn spec(self, cfg: &ModelConfig) -> ArchSpec {
        match self {
            Arch::Llama => arch::llama::spec(cfg),
            Arch::Mistral => arch::mistral::spec(cfg),
            Arch::Qwen2 => arch::qwen2::spec(cfg),
            Arch::Qwen3 => arch::qwen3::spec(cfg),
        }
    }

    pub fn supported() -> &'static [&'static str] {
        &["llama", "mistral", "qwen2", "qwen3"]
    }
}
