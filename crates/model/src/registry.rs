//! The architecture registry: an exhaustive enum, so adding one makes the compiler
//! point at every place that must know about it.

use crate::arch::{self, ArchSpec};
use crate::ModelError;
use formats::ModelConfig;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    DeepseekV3,
    Gemma3,
    Glm4Moe,
    GptOss,
    Llama,
    MinimaxM2,
    Mistral,
    Mixtral,
    Qwen2,
    Qwen2Moe,
    Qwen3,
    Qwen3Moe,
    Qwen3Next,
    Qwen35,
    Qwen35Moe,
}

impl Arch {
    /// From HF `model_type` (GGUF architectures are mapped to these by formats).
    pub fn from_name(name: &str) -> Option<Arch> {
        Some(match name {
            "deepseek_v3" => Arch::DeepseekV3,
            "gemma3_text" | "gemma3" => Arch::Gemma3,
            "glm4_moe" => Arch::Glm4Moe,
            "minimax_m2" => Arch::MinimaxM2,
            "gpt_oss" => Arch::GptOss,
            "llama" => Arch::Llama,
            "mistral" => Arch::Mistral,
            "mixtral" => Arch::Mixtral,
            "qwen2" => Arch::Qwen2,
            "qwen2_moe" => Arch::Qwen2Moe,
            "qwen3" => Arch::Qwen3,
            "qwen3_moe" => Arch::Qwen3Moe,
            "qwen3_next" => Arch::Qwen3Next,
            "qwen3_5_text" | "qwen3_5" => Arch::Qwen35,
            "qwen3_5_moe_text" | "qwen3_5_moe" => Arch::Qwen35Moe,
            _ => return None,
        })
    }

    /// The layer knobs from the config; a MoE config missing a key it needs is
    /// an error naming the key.
    pub fn spec(self, cfg: &ModelConfig) -> Result<ArchSpec, ModelError> {
        Ok(match self {
            Arch::DeepseekV3 => arch::deepseek_v3::spec(cfg)?,
            Arch::Gemma3 => arch::gemma3::spec(cfg)?,
            Arch::Glm4Moe => arch::glm4_moe::spec(cfg)?,
            Arch::MinimaxM2 => arch::minimax_m2::spec(cfg)?,
            Arch::GptOss => arch::gpt_oss::spec(cfg)?,
            Arch::Llama => arch::llama::spec(cfg),
            Arch::Mistral => arch::mistral::spec(cfg),
            Arch::Mixtral => arch::mixtral::spec(cfg)?,
            Arch::Qwen2 => arch::qwen2::spec(cfg),
            Arch::Qwen2Moe => arch::qwen2_moe::spec(cfg)?,
            Arch::Qwen3 => arch::qwen3::spec(cfg),
            Arch::Qwen3Moe => arch::qwen3_moe::spec(cfg)?,
            Arch::Qwen3Next => arch::qwen3_next::spec(cfg)?,
            Arch::Qwen35 => arch::qwen3_5::spec(cfg)?,
            Arch::Qwen35Moe => arch::qwen3_5_moe::spec(cfg)?,
        })
    }

    pub fn supported() -> &'static [&'static str] {
        &[
            "deepseek_v3",
            "gemma3_text",
            "glm4_moe",
            "gpt_oss",
            "llama",
            "minimax_m2",
            "mistral",
            "mixtral",
            "qwen2",
            "qwen2_moe",
            "qwen3",
            "qwen3_moe",
            "qwen3_next",
            "qwen3_5_text",
            "qwen3_5_moe_text",
        ]
    }
}
