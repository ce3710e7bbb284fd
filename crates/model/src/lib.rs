//! shardlm-model: layers, KV cache, one file per architecture, and the shard plan.
//!
//! A [`Model`] is always a *shard*: a range of layers and a tensor-parallel slice of
//! each ([`ShardSpec`]). A single process is the shard that owns everything, with a
//! size-1 group ([`NoComm`]), so there is one code path.

pub mod arch;
pub mod decoder;
pub mod kv_block_io;
pub mod kv_cache;
pub mod layer_memory;
mod layer_ops;
pub mod linear;
pub mod linear_attn;
pub mod mla;
pub mod model;
pub mod moe;
mod moe_fused;
pub mod plan;
pub mod plan_split;
pub mod registry;
pub mod rope;
pub mod shard;
pub mod slice;
pub mod state_cache;
pub mod workspace;

pub use kv_cache::{KvCache, KvLayers, KvPool, KvType, SeqKv, WindowBlocks};
pub use model::gpu_shard::Device;
pub use model::{ring_positions, window_blocks_per_seq, LoadOptions, LoadProgress, LogitsMode, Model, SeqStep};
pub use registry::Arch;
pub use shard::{AllReduce, NoComm, ShardSpec};
pub use state_cache::{StatePool, StateShape};
pub use workspace::Workspace;

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Format(#[from] formats::FormatError),
    #[error(transparent)]
    Kernel(#[from] kernels::KernelError),
    #[error("{path}: unknown architecture '{arch}' (supported: {supported})")]
    UnknownArchitecture { path: PathBuf, arch: String, supported: String },
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    TokenOutOfRange { id: u32, vocab: usize },
    #[error("context overflow: {needed} positions needed, the KV cache holds {capacity}")]
    ContextOverflow { needed: usize, capacity: usize },
    #[error(transparent)]
    Plan(#[from] plan::PlanError),
    #[error("model config: {0}")]
    Config(String),
    #[error("unsupported: {0}")]
    Unsupported(String),
    #[error("communication failed: {0}")]
    Comm(String),
    #[error("{0}")]
    Gpu(String),
}
