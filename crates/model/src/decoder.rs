//! The common pre-norm decoder layer shared by the dense architectures:
//!
//! ```text
//! x ─ RMSNorm ─ q,k,v ─(q/k norm)─ rope ─ attention ─ o ─ all-reduce ─(+x)
//!   ─ RMSNorm ─ gate,up ─ silu·mul ─ down ─ all-reduce ─(+x)
//! ```
//!
//! Shapes (local to the shard): `T` tokens in the step, `hq = heads·head_dim`,
//! `hkv = kv_heads·head_dim`, `ffn` = intermediate size.

use crate::arch::ArchSpec;
use crate::linear::{quantize_weight, Linear};
use crate::{LoadOptions, ModelError};
use formats::{ModelConfig, TensorStore, WeightTensor};

#[derive(Debug)]
pub struct DecoderLayer {
    pub attn_norm: Vec<f32>,
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub mlp_norm: Vec<f32>,
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

fn weight(store: &TensorStore, name: &str, shape: &[usize], opts: &LoadOptions) -> Result<WeightTensor, ModelError> {
    let w = store.get_shaped(name, shape)?.clone();
    match opts.quantize {
        Some(target) => Ok(quantize_weight(w, target)?),
        None => Ok(w),
    }
}

fn vector(store: &TensorStore, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
    Ok(store.get_shaped(name, &[len])?.to_f32())
}

impl DecoderLayer {
    pub fn load(
        store: &TensorStore,
        cfg: &ModelConfig,
        spec: &ArchSpec,
        layer: usize,
        opts: &LoadOptions,
    ) -> Result<DecoderLayer, ModelError> {
        let p = format!("model.layers.{layer}.");
        let (h, hd) = (cfg.hidden_size, cfg.head_dim);
        let (hq, hkv, ffn) = (cfg.n_heads * hd, cfg.n_kv_heads * hd, cfg.intermediate_size);
        let lin = |name: &str, out: usize, inp: usize, bias: bool| -> Result<Linear, ModelError> {
            let w = weight(store, &format!("{p}{name}.weight"), &[out, inp], opts)?;
            let b = if bias { Some(vector(store, &format!("{p}{name}.bias"), out)?) } else { None };
            Ok(Linear::new(w, b))
        };
        let (q_norm, k_norm) = if spec.qk_norm {
            (
                Some(vector(store, &format!("{p}self_attn.q_norm.weight"), hd)?),
                Some(vector(store, &format!("{p}self_attn.k_norm.weight"), hd)?),
            )
        } else {
            (None, None)
        };
        Ok(DecoderLayer {
            attn_norm: vector(store, &format!("{p}input_layernorm.weight"), h)?,
            q: lin("self_attn.q_proj", hq, h, spec.qkv_bias)?,
            k: lin("self_attn.k_proj", hkv, h, spec.qkv_bias)?,
            v: lin("self_attn.v_proj", hkv, h, spec.qkv_bias)?,
            o: lin("self_attn.o_proj", h, hq, false)?,
            q_norm,
            k_norm,
            mlp_norm: vector(store, &format!("{p}post_attention_layernorm.weight"), h)?,
            gate: lin("mlp.gate_proj", ffn, h, false)?,
            up: lin("mlp.up_proj", ffn, h, false)?,
            down: lin("mlp.down_proj", h, ffn, false)?,
        })
    }

    /// Weight bytes this layer reads per forward step.
    pub fn weight_bytes(&self) -> usize {
        [&self.q, &self.k, &self.v, &self.o, &self.gate, &self.up, &self.down].iter().map(|l| l.weight_bytes()).sum()
    }
}
