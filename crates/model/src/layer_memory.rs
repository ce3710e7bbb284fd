//! What one sequence keeps in each layer, by the layer's kind, for splitting a
//! pipeline by bytes (`engine::dist`) and for the planner (`shardlm plan`):
//! K/V rows of every position for full attention, of a ring
//! ([`crate::ring_positions`] of the window) for sliding-window layers, one
//! latent row per position for latent attention, and a fixed recurrent and
//! convolution state (f32, whatever the context) for linear attention.

use crate::arch::{ArchSpec, AttnKind};
use crate::KvType;
use formats::ModelConfig;

/// Values one position keeps in one attention layer holding `n_kv_heads` KV
/// heads (a tensor rank's share, or all): its K and V rows, or latent
/// attention's one latent ‖ rope-key row (the same on every tensor rank).
/// With [`kv_bytes_per_position`], the one formula behind the runtime pool
/// (`Model::kv_bytes_per_token`), `serve`'s KV budget, the pipeline split
/// ([`layer_cache_bytes`]) and the planner.
pub fn kv_values_per_position(spec: &ArchSpec, n_kv_heads: usize, head_dim: usize) -> usize {
    match &spec.mla {
        Some(m) => m.cache_width(),
        None => 2 * n_kv_heads * head_dim,
    }
}

/// [`kv_values_per_position`] in `kv_type`'s bytes (whole quantized blocks
/// per row: K and V are rows of their own).
pub fn kv_bytes_per_position(spec: &ArchSpec, n_kv_heads: usize, head_dim: usize, kv_type: KvType) -> usize {
    match &spec.mla {
        Some(m) => kv_type.bytes_for(m.cache_width()),
        None => 2 * kv_type.bytes_for(n_kv_heads * head_dim),
    }
}

/// Bytes of one sequence's cache in each layer at `ctx` positions of context.
pub fn layer_cache_bytes(cfg: &ModelConfig, spec: &ArchSpec, kv_type: KvType, ctx: usize) -> Vec<f64> {
    let row = kv_bytes_per_position(spec, cfg.n_kv_heads, cfg.head_dim, kv_type);
    (0..cfg.n_layers)
        .map(|l| match spec.attn_kind(l) {
            AttnKind::Linear(la) => (la.state_shape(la.k_heads).len() * 4) as f64,
            _ => {
                let positions = match spec.attention(l).window {
                    Some(w) => crate::ring_positions(w).min(ctx),
                    None => ctx,
                };
                (row * positions) as f64
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> ModelConfig {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny").join(name);
        formats::open_model(&dir).expect("fixture").config
    }

    #[test]
    fn linear_layers_hold_their_state_and_windowed_ones_a_ring() {
        let cfg = fixture("qwen3_next");
        let spec = crate::Arch::from_name(&cfg.arch).expect("arch").spec(&cfg).expect("spec");
        let b = layer_cache_bytes(&cfg, &spec, KvType::F16, 1000);
        let la = spec.linear_attn.as_ref().expect("hybrid");
        let state = (la.state_shape(la.k_heads).len() * 4) as f64;
        // Three linear layers, then full attention.
        assert_eq!(&b[..3], &[state, state, state]);
        assert_eq!(b[3], (2 * 2 * cfg.n_kv_heads * cfg.head_dim * 1000) as f64);
        // The state does not grow with the context; K/V rows do.
        let b2 = layer_cache_bytes(&cfg, &spec, KvType::F16, 2000);
        assert_eq!((b2[0], b2[3]), (b[0], 2.0 * b[3]));

        let cfg = fixture("gemma3");
        let spec = crate::Arch::from_name(&cfg.arch).expect("arch").spec(&cfg).expect("spec");
        let b = layer_cache_bytes(&cfg, &spec, KvType::F16, 100_000);
        let row = (2 * 2 * cfg.n_kv_heads * cfg.head_dim) as f64;
        for (l, bytes) in b.iter().enumerate() {
            match spec.attention(l).window {
                Some(w) => assert_eq!(*bytes, row * crate::ring_positions(w) as f64, "layer {l}"),
                None => assert_eq!(*bytes, row * 100_000.0, "layer {l}"),
            }
        }
    }
}
