//! Gemma 3 (HF `gemma3_text`, llama.cpp `gemma3`): sandwich RMSNorms (before
//! *and after* attention and the MLP, [`NormPlacement::Sandwich`]) whose HF
//! weights are stored as `w − 1` (llama.cpp's converter adds the one); per-head
//! q/k norms; GeGLU with tanh GELU; embeddings scaled by `√hidden`; attention
//! scaled by `query_pre_attn_scalar^-½`; a tied head. Most layers are windowed
//! (`layer_types` `sliding_attention`, or every layer but each
//! `sliding_window_pattern`-th, 6 by default) and rotate with their own base
//! (`rope_parameters.sliding_attention`, or the older `rope_local_base_freq`,
//! 10 000); full layers use `rope_parameters.full_attention` (formats reads
//! that as the global rope). Rope rotates halves, in HF and GGUF alike.
//!
//! A GGUF reads as this architecture: formats maps llama.cpp's norm names
//! and keys (`formats::gguf_gemma3`) into the HF ones.

use super::{ArchSpec, AttnExtras, LocalRope, NormPlacement, NormSpec};
use crate::moe::{text_config, ExpertAct};
use crate::ModelError;
use formats::{ModelConfig, RopeScaling, SourceFormat};
use serde_json::Value;

pub fn spec(cfg: &ModelConfig) -> Result<ArchSpec, ModelError> {
    let c = text_config(cfg);
    let arch = &cfg.arch;
    for k in ["final_logit_softcapping", "attn_logit_softcapping"] {
        if let Some(v) = c.get(k).filter(|v| !v.is_null()) {
            return Err(ModelError::Unsupported(format!("{arch}: {k} {v} (logit soft-capping is not implemented)")));
        }
    }
    if let Some(act) = c.get("hidden_activation").and_then(Value::as_str).filter(|a| *a != "gelu_pytorch_tanh") {
        return Err(ModelError::Unsupported(format!("{arch}: hidden_activation '{act}' (only gelu_pytorch_tanh)")));
    }
    let windowed = windowed_layers(c, cfg.n_layers, arch)?;
    let local = c.get("rope_parameters").and_then(|p| p.get("sliding_attention")).filter(|v| v.is_object());
    let local_theta = local
        .and_then(|p| p.get("rope_theta"))
        .or_else(|| c.get("rope_local_base_freq"))
        .and_then(Value::as_f64)
        .unwrap_or(10_000.0) as f32;
    if let Some(ty) = local.and_then(|p| p.get("rope_type")).and_then(Value::as_str).filter(|t| *t != "default") {
        return Err(ModelError::Unsupported(format!("{arch}: sliding-attention rope type '{ty}' (only default)")));
    }
    let scalar = c.get("query_pre_attn_scalar").and_then(Value::as_f64).unwrap_or(cfg.head_dim as f64);
    Ok(ArchSpec {
        qkv_bias: cfg.attention_bias,
        qk_norm: true,
        sliding_window: cfg.sliding_window,
        extras: Some(AttnExtras { windowed, sinks: false, o_bias: false }),
        norm: NormSpec { plus_one: cfg.source != SourceFormat::Gguf, placement: NormPlacement::Sandwich },
        mlp_act: ExpertAct::GeluTanh,
        embed_scale: (cfg.hidden_size as f32).sqrt(),
        attn_scale: Some((1.0 / scalar.sqrt()) as f32),
        local_rope: Some(LocalRope { theta: local_theta, scaling: RopeScaling::None }),
        ..ArchSpec::default()
    })
}

/// `windowed[l]`: layer `l` is a sliding-attention layer, from `layer_types`
/// or, without it, the period `sliding_window_pattern` (every `n`-th layer
/// full).
fn windowed_layers(c: &Value, n_layers: usize, arch: &str) -> Result<Vec<bool>, ModelError> {
    let Some(types) = c.get("layer_types").and_then(Value::as_array) else {
        let n = ["sliding_window_pattern", "_sliding_window_pattern"]
            .iter()
            .find_map(|k| c.get(*k).and_then(Value::as_u64))
            .unwrap_or(6)
            .max(1) as usize;
        return Ok((0..n_layers).map(|l| (l + 1) % n != 0).collect());
    };
    if types.len() != n_layers {
        return Err(ModelError::Config(format!(
            "{arch}: 'layer_types' lists {} layers, the model has {n_layers}",
            types.len()
        )));
    }
    types
        .iter()
        .enumerate()
        .map(|(l, t)| match t.as_str() {
            Some("sliding_attention") => Ok(true),
            Some("full_attention") => Ok(false),
            _ => Err(ModelError::Config(format!("{arch}: layer_types[{l}] is {t}, not sliding/full_attention"))),
        })
        .collect()
}
