//! Hugging Face model directories.

use crate::{FormatError, ModelFiles};
use std::path::Path;

/// Opens an HF directory (`config.json` + safetensors + tokenizer files).
pub fn open_dir(path: &Path) -> Result<ModelFiles, FormatError> {
    let _ = path;
    todo!("formats helper")
}
