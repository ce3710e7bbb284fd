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
use crate::linear::{pack_for_decode, quantize_weight, Linear};
use crate::plan::TpSlice;
use crate::slice;
use crate::{LoadOptions, ModelError};
use formats::{ModelConfig, TensorStore, WeightTensor};
use std::ops::Range;

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

/// The weight as the kernels will read it: quantized at load if asked, then
/// packed for the decode kernels where the type has a packed layout.
pub(crate) fn quantized(w: WeightTensor, opts: &LoadOptions) -> Result<WeightTensor, ModelError> {
    let w = match opts.quantize {
        Some(target) => quantize_weight(w, target)?,
        None => w,
    };
    Ok(if opts.keep_file_layout { w } else { pack_for_decode(w) })
}

fn vector(store: &TensorStore, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
    Ok(store.get_shaped(name, &[len])?.to_f32())
}

impl DecoderLayer {
    /// Loads layer `layer`, keeping only the tensor-parallel slice `tp` (query heads
    /// and their KV heads, MLP columns) when given.
    pub fn load(
        store: &TensorStore,
        cfg: &ModelConfig,
        spec: &ArchSpec,
        layer: usize,
        tp: Option<&TpSlice>,
        opts: &LoadOptions,
    ) -> Result<DecoderLayer, ModelError> {
        let p = format!("model.layers.{layer}.");
        let (h, hd) = (cfg.hidden_size, cfg.head_dim);
        let (hq, hkv, ffn) = (cfg.n_heads * hd, cfg.n_kv_heads * hd, cfg.intermediate_size);
        let full = TpSlice {
            q_heads: 0..cfg.n_heads,
            kv_heads: 0..cfg.n_kv_heads,
            ffn: 0..ffn,
            vocab: 0..cfg.vocab_size,
            vocab_all: vec![],
            q_heads_all: vec![],
            ffn_all: vec![],
            exact: false,
            hidden: 0..h,
            hidden_all: vec![],
        };
        let tp = tp.unwrap_or(&full);
        let heads = |r: &Range<usize>| r.start * hd..r.end * hd;
        let (q_rows, kv_rows) = (heads(&tp.q_heads), heads(&tp.kv_heads));
        // "all-to-sharded": keep output rows; "sharded-to-all": keep input columns.
        let col_par = |name: &str, out: usize, rows: &Range<usize>, bias: bool| -> Result<Linear, ModelError> {
            let w = slice::rows(store.get_shaped(&format!("{p}{name}.weight"), &[out, h])?, rows.clone());
            let b =
                if bias { Some(vector(store, &format!("{p}{name}.bias"), out)?[rows.clone()].to_vec()) } else { None };
            Ok(Linear::new(quantized(w, opts)?, b))
        };
        let row_par = |name: &str, inp: usize, cols: &Range<usize>| -> Result<Linear, ModelError> {
            let full = store.get_shaped(&format!("{p}{name}.weight"), &[h, inp])?;
            // Exact mode keeps whole input rows and splits the output instead.
            let w = if tp.exact { slice::rows(full, tp.hidden.clone()) } else { slice::cols(full, cols.clone()) };
            Ok(Linear::new(quantized(w, opts)?, None))
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
            q: col_par("self_attn.q_proj", hq, &q_rows, spec.qkv_bias)?,
            k: col_par("self_attn.k_proj", hkv, &kv_rows, spec.qkv_bias)?,
            v: col_par("self_attn.v_proj", hkv, &kv_rows, spec.qkv_bias)?,
            o: row_par("self_attn.o_proj", hq, &q_rows)?,
            q_norm,
            k_norm,
            mlp_norm: vector(store, &format!("{p}post_attention_layernorm.weight"), h)?,
            gate: col_par("mlp.gate_proj", ffn, &tp.ffn, false)?,
            up: col_par("mlp.up_proj", ffn, &tp.ffn, false)?,
            down: row_par("mlp.down_proj", ffn, &tp.ffn)?,
        })
    }

    /// Weight bytes this layer reads per forward step.
    pub fn weight_bytes(&self) -> usize {
        [&self.q, &self.k, &self.v, &self.o, &self.gate, &self.up, &self.down].iter().map(|l| l.weight_bytes()).sum()
    }
}
