//! What can go wrong on the device, in one line each.

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("no GPU adapter: {0}")]
    NoAdapter(String),
    #[error("GPU {index} does not exist: this machine has {count} ({names}; `shardlm devices` lists them)")]
    NoSuchAdapter { index: usize, count: usize, names: String },
    #[error("the GPU '{adapter}' lacks {feature}, which shardlm needs")]
    MissingFeature { adapter: String, feature: String },
    #[error("could not open the GPU '{adapter}': {detail}")]
    Device { adapter: String, detail: String },
    #[error("tensor '{name}' has type {dtype}, which the GPU backend cannot read yet (it reads {supported})")]
    UnsupportedType { name: String, dtype: String, supported: String },
    #[error("{what} needs {bytes} bytes in one buffer; the GPU '{adapter}' allows {limit}")]
    TooLarge { what: String, bytes: u64, limit: u64, adapter: String },
    #[error("{what} need {} of GPU memory; the GPU '{adapter}' has {} for them (use --device cpu, or split the model over more ranks)", size(*need), size(*have))]
    OutOfMemory { what: String, need: u64, have: u64, adapter: String },
    #[error("the GPU failed: {0}")]
    Failed(String),
}

/// `bytes` in GiB, or MiB below one GiB.
pub(crate) fn size(bytes: u64) -> String {
    match bytes >= 1 << 30 {
        true => format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64),
        false => format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64),
    }
}
