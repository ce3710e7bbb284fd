//! shardlm-formats: reading model files.
//!
//! * [`gguf`]: GGUF v3 (memory-mapped; tensor bytes are never copied or read until used).
//! * [`hf`]: Hugging Face directories: `config.json`, `model.safetensors` or a sharded
//!   `model.safetensors.index.json`, `tokenizer.json`, `tokenizer_config.json`,
//!   `generation_config.json`.
//! * [`config`]: the architecture-neutral [`ModelConfig`] both sources produce.
//! * [`names`]: GGUF tensor names mapped to the HF names the model code asks for.
//!
//! [`open_model`] is the one entry point: it sniffs the path and returns a [`ModelFiles`].

pub mod config;
pub mod error;
pub mod gguf;
mod gguf_deepseek2;
mod gguf_gemma3;
mod gguf_load;
mod gguf_qwen3next;
pub mod gguf_writer;
pub mod hf;
pub mod lowbit;
mod lowbit_repack;
pub mod names;
pub mod tensor;

pub use config::{ModelConfig, RopeScaling, SourceFormat};
pub use error::FormatError;
pub use tensor::{TensorData, TensorStore, WeightTensor};

use std::path::{Path, PathBuf};

/// Tokenizer data found beside (or inside) the weights.
#[derive(Debug, Clone)]
pub enum TokenizerSource {
    /// `tokenizer.ggml.*` metadata of a GGUF file.
    Gguf(GgufTokenizer),
    /// A `tokenizer.json` file (HF fast tokenizer).
    HfJson(PathBuf),
    /// The model has no tokenizer (e.g. tiny test fixtures); only token ids work.
    None,
}

/// The `tokenizer.ggml.*` keys of a GGUF file.
#[derive(Debug, Clone, Default)]
pub struct GgufTokenizer {
    /// `tokenizer.ggml.model`: "gpt2" (byte-level BPE) or "llama" (SentencePiece).
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer name ("smollm", "llama-bpe", "qwen2", ...).
    pub pre: Option<String>,
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type`: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
    pub token_types: Vec<i32>,
    pub scores: Vec<f32>,
    pub merges: Vec<String>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    pub unk_id: Option<u32>,
    pub pad_id: Option<u32>,
    pub add_bos: Option<bool>,
    pub add_eos: Option<bool>,
    pub add_space_prefix: Option<bool>,
}

/// Everything needed to build a model and talk to it.
#[derive(Debug)]
pub struct ModelFiles {
    /// The path the user gave (file or directory).
    pub path: PathBuf,
    pub config: ModelConfig,
    pub tensors: TensorStore,
    pub tokenizer: TokenizerSource,
    /// Jinja chat template (`tokenizer.chat_template` or `tokenizer_config.json`).
    pub chat_template: Option<String>,
    /// Special token strings the template may reference (`bos_token`, `eos_token`).
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
}

/// Opens a GGUF file or an HF model directory.
pub fn open_model(path: &Path) -> Result<ModelFiles, FormatError> {
    if !path.exists() {
        return Err(FormatError::NotFound { path: path.to_path_buf() });
    }
    if path.is_dir() {
        hf::open_dir(path)
    } else {
        gguf::open_file(path)
    }
}
