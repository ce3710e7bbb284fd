//! llama.cpp's hybrid linear-attention GGUFs — `qwen3next` (Qwen3-Next),
//! `qwen35` (Qwen3.5 dense) and `qwen35moe` (Qwen3.5 MoE) — read as the HF
//! config keys and tensor names `model::linear_attn` and the decoder ask for.
//! The reference is llama.cpp b11434: its converter (`conversion/qwen.py`:
//! `Qwen3NextModel`, `_LinearAttentionVReorderBase`, `Qwen3_5TextModel`,
//! `Qwen3_5MoeTextModel`) and loaders (`src/models/qwen3next.cpp`,
//! `qwen35.cpp`, `qwen35moe.cpp`).
//!
//! Metadata (`<arch>.` prefix) → HF key:
//!
//! | GGUF key                      | HF key |
//! |-------------------------------|--------|
//! | `ssm.group_count`             | `linear_num_key_heads` (nk) |
//! | `ssm.time_step_rank`          | `linear_num_value_heads` (nv) |
//! | `ssm.state_size`              | `linear_key_head_dim` (dk; llama.cpp also takes it as dv) |
//! | `ssm.inner_size`              | `nv · linear_value_head_dim` |
//! | `ssm.conv_kernel`             | `linear_conv_kernel_dim` |
//! | `attention.recurrent_layers`  | `layer_types` (bool per layer: `linear_attention`) |
//! | `full_attention_interval`     | without the array: every n-th layer full (default 4) |
//! | `rope.dimension_count`        | `partial_rotary_factor · head_dim` (the generic reader's `rope_dim`) |
//! | `rope.dimension_sections`     | Qwen3.5's M-RoPE sections: text positions are equal in every section, so plain rope; not read |
//!
//! llama.cpp's graphs always renormalize the top-k expert weights for these
//! archs (`build_moe_ffn(…, norm_w = true, …)`), so `norm_topk_prob` is true.
//!
//! Tensors (`blk.N.`; shapes HF-ordered `[rows, cols]`; C = 2·nk·dk + nv·dv):
//!
//! | GGUF                      | HF (`model.layers.N.`)                     |
//! |---------------------------|--------------------------------------------|
//! | `attn_qkv` `[C, hidden]`  | `linear_attn.in_proj_qkv` (all q, all k, all v) |
//! | `attn_gate` `[nv·dv, hidden]` | `linear_attn.in_proj_z` |
//! | `ssm_in` `[nk·(2dk + 2r·dv), hidden]` | older qwen3next files: Qwen3-Next's fused `in_proj_qkvz` (grouped per key head), split here into the two above |
//! | `ssm_ba` `[2nv, hidden]`  | qwen3next: `in_proj_ba`, grouped `[b r \| a r]` per key head; split into `in_proj_b`, `in_proj_a` |
//! | `ssm_beta`, `ssm_alpha` `[nv, hidden]` | qwen35: `in_proj_b`, `in_proj_a` |
//! | `ssm_conv1d` `[C, K]`     | `linear_attn.conv1d` `[C, 1, K]` |
//! | `ssm_a` `[nv]`            | `linear_attn.ssm_a`: the converter stores `−exp(A_log)`, which the model uses as is |
//! | `ssm_dt.bias` `[nv]`      | `linear_attn.dt_bias` |
//! | `ssm_norm` `[dv]`         | `linear_attn.norm.weight` (plain `w`; every other norm holds `1 + w`) |
//! | `ssm_out` `[hidden, nv·dv]` | `linear_attn.out_proj` |
//! | `post_attention_norm`     | `post_attention_layernorm` (the pre-MLP norm) |
//! | `attn_q` `[heads·2·hd, hidden]` | `self_attn.q_proj`, per head `[q ‖ gate]` as in HF |
//!
//! **Value-head order.** HF groups the value heads by key head (head
//! `k·r + j` is the j-th of key head k, r = nv/nk). For qwen35/qwen35moe the
//! converter reorders every value-head axis (the v rows of `attn_qkv` and of
//! the conv, `attn_gate`, `ssm_beta/alpha`, `ssm_a`, `ssm_dt`, the columns
//! of `ssm_out`) to the tiled order (position `j·nk + k`), which ggml
//! broadcasts. The weights are left as stored: the config says
//! `linear_value_heads_tiled` (shardlm's own key) and the model pairs value
//! position p with key head `p mod nk`. qwen3next files keep HF's order.

use crate::gguf::{GgufFile, GgufValue};
use crate::{FormatError, ModelConfig, TensorData, TensorStore, WeightTensor};
use serde_json::{Map, Value};
use std::ops::Range;
use std::sync::Arc;

/// Whether `arch` (GGUF `general.architecture`) is one of the hybrids.
pub(crate) fn is_hybrid(arch: &str) -> bool {
    matches!(arch, "qwen3next" | "qwen35" | "qwen35moe")
}

/// Writes the HF keys of the module table into `raw`.
pub(crate) fn hybrid_keys(
    g: &GgufFile,
    arch: &str,
    n_layers: usize,
    raw: &mut Map<String, Value>,
) -> Result<(), FormatError> {
    let key = |k: &str| format!("{arch}.{k}");
    let int = |k: &str| g.get(&key(k)).and_then(GgufValue::as_usize);
    let bad = |what: String| FormatError::BadConfig { path: g.path.clone(), what };
    let req = |k: &str, why: &str| {
        int(k).filter(|&v| v > 0).ok_or_else(|| bad(format!("missing or invalid metadata key '{}' ({why})", key(k))))
    };
    let nk = req("ssm.group_count", "the linear-attention key heads")?;
    let nv = req("ssm.time_step_rank", "the linear-attention value heads")?;
    let dk = req("ssm.state_size", "the key head width")?;
    let inner = req("ssm.inner_size", "value heads × value head width")?;
    let kernel = req("ssm.conv_kernel", "the conv kernel width")?;
    if !nv.is_multiple_of(nk) || !inner.is_multiple_of(nv) {
        return Err(bad(format!(
            "{nv} value heads of total width {inner} cannot be shared by {nk} key heads ('{}', '{}', '{}')",
            key("ssm.time_step_rank"),
            key("ssm.inner_size"),
            key("ssm.group_count")
        )));
    }
    let linear: Vec<bool> = match g.get(&key("attention.recurrent_layers")) {
        Some(GgufValue::Array(_, items)) => {
            items.iter().map(|v| matches!(v, GgufValue::Bool(true)) || v.as_usize().is_some_and(|x| x != 0)).collect()
        }
        _ => {
            let every = int("full_attention_interval").unwrap_or(4).max(1);
            (0..n_layers).map(|l| (l + 1) % every != 0).collect()
        }
    };
    // MTP layers (counted in block_count) come after the trunk and are full attention.
    if linear.len() < n_layers {
        return Err(bad(format!(
            "'{}' has {} entries for {n_layers} layers",
            key("attention.recurrent_layers"),
            linear.len()
        )));
    }
    let types = linear[..n_layers].iter().map(|&l| Value::from(if l { "linear_attention" } else { "full_attention" }));
    let mut set = |k: &str, v: Value| {
        raw.insert(k.to_string(), v);
    };
    set("layer_types", Value::Array(types.collect()));
    set("linear_num_key_heads", nk.into());
    set("linear_num_value_heads", nv.into());
    set("linear_key_head_dim", dk.into());
    set("linear_value_head_dim", (inner / nv).into());
    set("linear_conv_kernel_dim", kernel.into());
    set("linear_value_heads_tiled", (arch != "qwen3next").into());
    if int("expert_count").is_some_and(|n| n > 0) {
        set("norm_topk_prob", g.get_bool(&key("expert_weights_norm")).unwrap_or(true).into());
    }
    Ok(())
}

/// The linear-attention dimensions, read back from the keys [`hybrid_keys`] wrote.
struct Dims {
    nk: usize,
    nv: usize,
    dk: usize,
    dv: usize,
}

/// Renames (and where needed splits or reshapes) the hybrid tensors of
/// every layer to the HF names (see the module table).
pub(crate) fn hybrid_tensors(store: &mut TensorStore, cfg: &ModelConfig) -> Result<(), FormatError> {
    let get = |k: &str| cfg.raw.get(k).and_then(Value::as_u64).map(|v| v as usize).unwrap_or(0);
    let d = Dims {
        nk: get("linear_num_key_heads"),
        nv: get("linear_num_value_heads"),
        dk: get("linear_key_head_dim"),
        dv: get("linear_value_head_dim"),
    };
    let path = store.path.clone();
    let old = std::mem::take(&mut store.tensors);
    for (name, w) in old {
        let Some((layer, part)) = name.strip_prefix("blk.").and_then(|r| r.split_once('.')) else {
            insert(store, name, w)?;
            continue;
        };
        let hf = |p: &str| format!("model.layers.{layer}.{p}");
        let bad = |what: String| FormatError::BadTensor { path: path.clone(), tensor: name.clone(), what };
        match part {
            "attn_qkv.weight" => insert(store, hf("linear_attn.in_proj_qkv.weight"), w)?,
            "attn_gate.weight" => insert(store, hf("linear_attn.in_proj_z.weight"), w)?,
            "ssm_beta.weight" => insert(store, hf("linear_attn.in_proj_b.weight"), w)?,
            "ssm_alpha.weight" => insert(store, hf("linear_attn.in_proj_a.weight"), w)?,
            "ssm_norm.weight" => insert(store, hf("linear_attn.norm.weight"), w)?,
            "ssm_out.weight" => insert(store, hf("linear_attn.out_proj.weight"), w)?,
            "ssm_dt.bias" => insert(store, hf("linear_attn.dt_bias"), w)?,
            "ssm_a" => insert(store, hf("linear_attn.ssm_a"), w)?,
            "post_attention_norm.weight" => insert(store, hf("post_attention_layernorm.weight"), w)?,
            "ssm_conv1d.weight" => {
                // `[C, K]` → HF's `[C, 1, K]` (same bytes).
                let [c, k] = w.shape[..] else {
                    return Err(bad(format!("expected [channels, kernel], got {:?}", w.shape)));
                };
                insert(store, hf("linear_attn.conv1d.weight"), WeightTensor { shape: vec![c, 1, k], ..w })?;
            }
            "ssm_ba.weight" => {
                // Per key head k: rows [b of its r value heads | a of them].
                let r = d.nv / d.nk.max(1);
                if w.shape.first() != Some(&(2 * d.nv)) {
                    return Err(bad(format!("expected {} rows (2 × value heads), got {:?}", 2 * d.nv, w.shape)));
                }
                let b: Vec<_> = (0..d.nk).map(|k| 2 * r * k..2 * r * k + r).collect();
                let a: Vec<_> = (0..d.nk).map(|k| 2 * r * k + r..2 * r * (k + 1)).collect();
                insert(store, hf("linear_attn.in_proj_b.weight"), rows(&w, &b, hf("linear_attn.in_proj_b.weight")))?;
                insert(store, hf("linear_attn.in_proj_a.weight"), rows(&w, &a, hf("linear_attn.in_proj_a.weight")))?;
            }
            "ssm_in.weight" => {
                // Older qwen3next files: HF's in_proj_qkvz, per key head
                // `[q dk | k dk | v r·dv | z r·dv]`.
                let (r, dk) = (d.nv / d.nk.max(1), d.dk);
                let g = 2 * dk + 2 * r * d.dv;
                if w.shape.first() != Some(&(d.nk * g)) {
                    return Err(bad(format!("expected {} rows (fused q, k, v, z), got {:?}", d.nk * g, w.shape)));
                }
                let part =
                    |off: usize, len: usize| (0..d.nk).map(|k| k * g + off..k * g + off + len).collect::<Vec<_>>();
                let qkv = [part(0, dk), part(dk, dk), part(2 * dk, r * d.dv)].concat();
                let z = part(2 * dk + r * d.dv, r * d.dv);
                insert(
                    store,
                    hf("linear_attn.in_proj_qkv.weight"),
                    rows(&w, &qkv, hf("linear_attn.in_proj_qkv.weight")),
                )?;
                insert(store, hf("linear_attn.in_proj_z.weight"), rows(&w, &z, hf("linear_attn.in_proj_z.weight")))?;
            }
            _ => insert(store, name, w)?,
        }
    }
    Ok(())
}

fn insert(store: &mut TensorStore, name: String, w: WeightTensor) -> Result<(), FormatError> {
    let w = WeightTensor { name: name.clone(), ..w };
    if store.tensors.insert(name.clone(), w).is_some() {
        return Err(FormatError::Corrupt {
            path: store.path.clone(),
            what: format!("two tensors map to the same name '{name}'"),
        });
    }
    Ok(())
}

/// Rows `ranges` of a 2-D weight, concatenated into an owned tensor named
/// `name` (GGUF rows are whole blocks of any type).
fn rows(w: &WeightTensor, ranges: &[Range<usize>], name: String) -> WeightTensor {
    let cols: usize = w.shape[1..].iter().product();
    let row_bytes = w.dtype.bytes_for(cols).unwrap_or(0);
    let src = w.row_major();
    let mut out = Vec::with_capacity(ranges.iter().map(|r| r.len()).sum::<usize>() * row_bytes);
    for r in ranges {
        out.extend_from_slice(&src[r.start * row_bytes..r.end * row_bytes]);
    }
    let mut shape = w.shape.clone();
    shape[0] = ranges.iter().map(|r| r.len()).sum();
    WeightTensor::new(name, w.dtype, shape, TensorData::Owned(Arc::new(out)))
}
