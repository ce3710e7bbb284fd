//! Scratch buffers for one forward step, grown on demand and then reused, so
//! decode does not allocate.

use kernels::matmul::MatmulScratch;

#[derive(Default)]
pub struct Workspace {
    /// Residual stream, `T × hidden`. Pipeline stages pass this between ranks.
    pub x: Vec<f32>,
    pub(crate) xn: Vec<f32>,
    pub(crate) q: Vec<f32>,
    pub(crate) k: Vec<f32>,
    pub(crate) v: Vec<f32>,
    pub(crate) attn: Vec<f32>,
    pub(crate) o: Vec<f32>,
    pub(crate) gate: Vec<f32>,
    pub(crate) up: Vec<f32>,
    pub(crate) cos: Vec<f32>,
    pub(crate) sin: Vec<f32>,
    /// The windowed layers' rope table when it differs ([`crate::arch::LocalRope`]).
    pub(crate) cos_local: Vec<f32>,
    pub(crate) sin_local: Vec<f32>,
    /// The block table of a sliding-window layer's ring (one block, named once
    /// per `ring` positions).
    pub(crate) ring_table: Vec<u32>,
    pub(crate) head_in: Vec<f32>,
    pub(crate) logits: Vec<f32>,
    pub(crate) local_logits: Vec<f32>,
    pub(crate) gather: Vec<f32>,
    /// Exact tensor parallelism: gathered full inputs and this rank's output part.
    pub(crate) full_in: Vec<f32>,
    pub(crate) part: Vec<f32>,
    pub(crate) padded: Vec<f32>,
    pub(crate) scratch: MatmulScratch,
    /// One embedding row unpacked from a packed (tied) table.
    pub(crate) embed_row: Vec<u8>,
    /// Routing and expert buffers of MoE layers.
    pub(crate) moe: crate::moe::MoeScratch,
    /// Buffers of latent-attention layers.
    pub(crate) mla: crate::mla::MlaScratch,
    /// Buffers of linear-attention layers and the gated attention's gate.
    pub(crate) linear: crate::linear_attn::LinearAttnScratch,
}

pub(crate) fn grow(v: &mut Vec<f32>, len: usize) {
    if v.len() < len {
        v.resize(len, 0.0);
    }
}
