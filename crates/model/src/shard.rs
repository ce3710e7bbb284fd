//! What part of a model one rank owns: a contiguous range of layers (pipeline
//! stage) and a slice of each layer's width (tensor-parallel rank).

use std::ops::Range;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardSpec {
    /// Layers this rank computes.
    pub layers: Range<usize>,
    /// Whether this rank embeds tokens (first pipeline stage).
    pub has_embed: bool,
    /// Whether this rank applies the final norm and lm_head (last pipeline stage).
    pub has_head: bool,
    /// Tensor-parallel rank and size within the stage.
    pub tp_rank: usize,
    pub tp_size: usize,
}

impl ShardSpec {
    /// The whole model in one process.
    pub fn full(n_layers: usize) -> ShardSpec {
        ShardSpec { layers: 0..n_layers, has_embed: true, has_head: true, tp_rank: 0, tp_size: 1 }
    }

    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }
}

/// The all-reduce a sharded layer needs after its "sharded-to-all" projections.
/// A single process uses [`NoComm`]; distributed runs pass their group.
pub trait AllReduce: Sync {
    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<(), crate::ModelError>;
}

/// The size-1 group: all-reduce is the identity.
pub struct NoComm;

impl AllReduce for NoComm {
    fn all_reduce_sum(&self, _buf: &mut [f32]) -> Result<(), crate::ModelError> {
        Ok(())
    }
}
