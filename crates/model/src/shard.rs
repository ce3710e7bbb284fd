//! What part of a model one rank owns: a contiguous range of layers (pipeline
//! stage) and a slice of each layer's width (tensor-parallel rank).

use crate::plan::TpSlice;
use std::ops::Range;

#[derive(Debug, Clone, PartialEq)]
pub struct ShardSpec {
    /// Layers this rank computes.
    pub layers: Range<usize>,
    /// Whether this rank embeds tokens (first pipeline stage).
    pub has_embed: bool,
    /// Whether this rank applies the final norm and lm_head (last pipeline stage).
    pub has_head: bool,
    /// The tensor-parallel slice; `None` owns the full width.
    pub tp: Option<TpSlice>,
}

impl ShardSpec {
    /// The whole model in one process.
    pub fn full(n_layers: usize) -> ShardSpec {
        ShardSpec { layers: 0..n_layers, has_embed: true, has_head: true, tp: None }
    }

    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }
}

/// The collectives a tensor-parallel shard needs within its group: an all-reduce
/// after each "sharded-to-all" projection and an all-gather of vocab-parallel
/// logits. A single process uses [`NoComm`].
pub trait AllReduce: Sync {
    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<(), crate::ModelError>;
    /// `recv` = every rank's `send` (all the same length), in rank order.
    fn all_gather(&self, send: &[f32], recv: &mut [f32]) -> Result<(), crate::ModelError>;
    fn size(&self) -> usize;
}

/// The size-1 group: all-reduce is the identity.
pub struct NoComm;

impl AllReduce for NoComm {
    fn all_reduce_sum(&self, _buf: &mut [f32]) -> Result<(), crate::ModelError> {
        Ok(())
    }
    fn all_gather(&self, send: &[f32], recv: &mut [f32]) -> Result<(), crate::ModelError> {
        recv[..send.len()].copy_from_slice(send);
        Ok(())
    }
    fn size(&self) -> usize {
        1
    }
}

impl AllReduce for comm::Group {
    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<(), crate::ModelError> {
        self.all_reduce_sum_f32(buf).map_err(|e| crate::ModelError::Comm(e.to_string()))
    }
    fn all_gather(&self, send: &[f32], recv: &mut [f32]) -> Result<(), crate::ModelError> {
        self.all_gather_f32(send, recv).map_err(|e| crate::ModelError::Comm(e.to_string()))
    }
    fn size(&self) -> usize {
        comm::Group::size(self)
    }
}
