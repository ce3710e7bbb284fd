//! One error type for every way a model file can be wrong. Each message names
//! the file (and tensor or key) so the user knows what and where.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("{path}: no such file or directory")]
    NotFound { path: PathBuf },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: not a GGUF file (bad magic {magic:?})")]
    BadMagic { path: PathBuf, magic: [u8; 4] },
    #[error("{path}: unsupported GGUF version {version} (supported: 2, 3)")]
    UnsupportedVersion { path: PathBuf, version: u32 },
    #[error("{path}: truncated or corrupt: {what}")]
    Corrupt { path: PathBuf, what: String },
    #[error("{path}: tensor '{tensor}' has unsupported type {type_name}")]
    UnsupportedTensorType { path: PathBuf, tensor: String, type_name: String },
    /// `gguf_name`: what a GGUF file would call it (llama.cpp's name), if known.
    #[error("{path}: missing tensor '{tensor}'{}", gguf_name.as_ref().map(|g| format!(" (GGUF '{g}')")).unwrap_or_default())]
    MissingTensor { path: PathBuf, tensor: String, gguf_name: Option<String> },
    #[error("{path}: tensor '{tensor}' has shape {got:?}, expected {expected:?}")]
    ShapeMismatch { path: PathBuf, tensor: String, expected: Vec<usize>, got: Vec<usize> },
    #[error("{path}: tensor '{tensor}': {what}")]
    BadTensor { path: PathBuf, tensor: String, what: String },
    #[error("{path}: bad config: {what}")]
    BadConfig { path: PathBuf, what: String },
    #[error("{path}: unknown architecture '{arch}'")]
    UnknownArchitecture { path: PathBuf, arch: String },
}
