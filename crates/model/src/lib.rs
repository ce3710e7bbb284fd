//! shardlm-model: layers, KV cache, architectures and the shard plan.

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Format(#[from] formats::FormatError),
}
