//! GGUF tensor names → HF tensor names, so model code asks for one naming only.
//! e.g. `blk.3.attn_q.weight` → `model.layers.3.self_attn.q_proj.weight`.

/// Maps a GGUF tensor name to its HF name; unknown names pass through unchanged.
pub fn gguf_to_hf(name: &str) -> String {
    // Split off the `.weight` / `.bias` suffix (other suffixes are part of the stem).
    let (stem, suffix) = match name.rsplit_once('.') {
        Some((s, suf @ ("weight" | "bias"))) => (s, Some(suf)),
        _ => (name, None),
    };
    let mapped = match stem {
        "token_embd" => Some("model.embed_tokens".to_string()),
        "output_norm" => Some("model.norm".to_string()),
        "output" => Some("lm_head".to_string()),
        _ => map_block(stem),
    };
    match (mapped, suffix) {
        // Parameters, not layers: HF names them bare (gpt-oss's sinks,
        // DeepSeek's router bias `exp_probs_b.bias`).
        (Some(m), Some(_)) if bare_suffix(&m).is_some() => m,
        (Some(m), Some(suf)) => format!("{m}.{suf}"),
        (Some(m), None) => m,
        (None, _) => name.to_string(),
    }
}

/// `blk.N.<part>` → `model.layers.N.<hf part>`; `None` when not a known block tensor.
fn map_block(stem: &str) -> Option<String> {
    let rest = stem.strip_prefix("blk.")?;
    let (layer, part) = rest.split_once('.')?;
    if layer.is_empty() || !layer.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let hf = block_part(part)?;
    Some(format!("model.layers.{layer}.{hf}"))
}

/// GGUF block part → HF part (under `blk.N.` / `model.layers.N.`).
const BLOCK_PARTS: [(&str, &str); 30] = [
    ("attn_norm", "input_layernorm"),
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("attn_q_norm", "self_attn.q_norm"),
    ("attn_k_norm", "self_attn.k_norm"),
    ("ffn_norm", "post_attention_layernorm"),
    // gpt-oss: the norm before the MoE block, and the attention sinks.
    ("attn_post_norm", "post_attention_layernorm"),
    ("attn_sinks", "self_attn.sinks"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
    // Mixture of experts: router, stacked experts `[n_expert, out, in]`, shared expert.
    ("ffn_gate_inp", "mlp.gate"),
    ("ffn_gate_exps", "mlp.experts.gate_exps"),
    ("ffn_up_exps", "mlp.experts.up_exps"),
    ("ffn_down_exps", "mlp.experts.down_exps"),
    ("ffn_gate_shexp", "mlp.shared_expert.gate_proj"),
    ("ffn_up_shexp", "mlp.shared_expert.up_proj"),
    ("ffn_down_shexp", "mlp.shared_expert.down_proj"),
    ("ffn_gate_inp_shexp", "mlp.shared_expert_gate"),
    // deepseek2 (multi-head latent attention): the low-rank q projection
    // and its norm, the joint latent ‖ rope-key projection and its norm,
    // and the latent's up-projection, whole (`attn_kv_b`, older files) or
    // split per head (`attn_k_b` `[heads, r, nope]`, `attn_v_b`
    // `[heads, v, r]`); the router's selection bias. Shapes in
    // crate::gguf_deepseek2.
    ("attn_q_a", "self_attn.q_a_proj"),
    ("attn_q_a_norm", "self_attn.q_a_layernorm"),
    ("attn_q_b", "self_attn.q_b_proj"),
    ("attn_kv_a_mqa", "self_attn.kv_a_proj_with_mqa"),
    ("attn_kv_a_norm", "self_attn.kv_a_layernorm"),
    ("attn_kv_b", "self_attn.kv_b_proj"),
    ("attn_k_b", "self_attn.k_b_proj"),
    ("attn_v_b", "self_attn.v_b_proj"),
    ("exp_probs_b", "mlp.gate.e_score_correction_bias"),
];

fn block_part(part: &str) -> Option<&'static str> {
    BLOCK_PARTS.iter().find(|(g, _)| *g == part).map(|(_, h)| *h)
}

/// HF parameters named bare (no `.weight`/`.bias`), and the suffix GGUF gives them.
fn bare_suffix(hf: &str) -> Option<&'static str> {
    if hf.ends_with(".sinks") {
        Some("weight")
    } else if hf.ends_with(".e_score_correction_bias") {
        Some("bias")
    } else {
        None
    }
}

/// The GGUF name [`gguf_to_hf`] maps to `hf` (for error messages about GGUF
/// files); `None` when there is none or more than one (gpt-oss's
/// `attn_post_norm` and everyone's `ffn_norm` are both HF's
/// `post_attention_layernorm`).
pub fn hf_to_gguf(hf: &str) -> Option<String> {
    let (stem, suffix) = match bare_suffix(hf) {
        Some(suf) => (hf, suf),
        None => match hf.rsplit_once('.')? {
            (s, suf @ ("weight" | "bias")) => (s, suf),
            _ => return None,
        },
    };
    let top = [("model.embed_tokens", "token_embd"), ("model.norm", "output_norm"), ("lm_head", "output")];
    if let Some((_, g)) = top.iter().find(|(h, _)| *h == stem) {
        return Some(format!("{g}.{suffix}"));
    }
    let (layer, part) = stem.strip_prefix("model.layers.")?.split_once('.')?;
    let mut found = BLOCK_PARTS.iter().filter(|(_, h)| *h == part);
    match (found.next(), found.next()) {
        (Some((g, _)), None) => Some(format!("blk.{layer}.{g}.{suffix}")),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::{gguf_to_hf, hf_to_gguf};

    #[test]
    fn maps_known_names() {
        let cases = [
            ("token_embd.weight", "model.embed_tokens.weight"),
            ("output_norm.weight", "model.norm.weight"),
            ("output.weight", "lm_head.weight"),
            ("blk.0.attn_norm.weight", "model.layers.0.input_layernorm.weight"),
            ("blk.12.attn_q.weight", "model.layers.12.self_attn.q_proj.weight"),
            ("blk.1.attn_q.bias", "model.layers.1.self_attn.q_proj.bias"),
            ("blk.1.attn_k.weight", "model.layers.1.self_attn.k_proj.weight"),
            ("blk.1.attn_v.bias", "model.layers.1.self_attn.v_proj.bias"),
            ("blk.2.attn_output.weight", "model.layers.2.self_attn.o_proj.weight"),
            ("blk.2.attn_q_norm.weight", "model.layers.2.self_attn.q_norm.weight"),
            ("blk.2.attn_k_norm.weight", "model.layers.2.self_attn.k_norm.weight"),
            ("blk.3.ffn_norm.weight", "model.layers.3.post_attention_layernorm.weight"),
            ("blk.3.ffn_gate.weight", "model.layers.3.mlp.gate_proj.weight"),
            ("blk.3.ffn_up.weight", "model.layers.3.mlp.up_proj.weight"),
            ("blk.3.ffn_down.weight", "model.layers.3.mlp.down_proj.weight"),
            ("blk.4.ffn_gate_inp.weight", "model.layers.4.mlp.gate.weight"),
            ("blk.4.ffn_gate_exps.weight", "model.layers.4.mlp.experts.gate_exps.weight"),
            ("blk.4.ffn_up_exps.weight", "model.layers.4.mlp.experts.up_exps.weight"),
            ("blk.4.ffn_down_exps.weight", "model.layers.4.mlp.experts.down_exps.weight"),
            ("blk.4.ffn_gate_shexp.weight", "model.layers.4.mlp.shared_expert.gate_proj.weight"),
            ("blk.4.ffn_up_shexp.weight", "model.layers.4.mlp.shared_expert.up_proj.weight"),
            ("blk.4.ffn_down_shexp.weight", "model.layers.4.mlp.shared_expert.down_proj.weight"),
            ("blk.4.ffn_gate_inp_shexp.weight", "model.layers.4.mlp.shared_expert_gate.weight"),
            // gpt-oss: expert biases, the post-attention norm, bare sinks.
            ("blk.5.ffn_gate_exps.bias", "model.layers.5.mlp.experts.gate_exps.bias"),
            ("blk.5.attn_post_norm.weight", "model.layers.5.post_attention_layernorm.weight"),
            ("blk.5.attn_sinks.weight", "model.layers.5.self_attn.sinks"),
            // deepseek2: latent attention and the router's selection bias (bare).
            ("blk.1.attn_q_a.weight", "model.layers.1.self_attn.q_a_proj.weight"),
            ("blk.1.attn_q_a_norm.weight", "model.layers.1.self_attn.q_a_layernorm.weight"),
            ("blk.1.attn_q_b.weight", "model.layers.1.self_attn.q_b_proj.weight"),
            ("blk.1.attn_kv_a_mqa.weight", "model.layers.1.self_attn.kv_a_proj_with_mqa.weight"),
            ("blk.1.attn_kv_a_norm.weight", "model.layers.1.self_attn.kv_a_layernorm.weight"),
            ("blk.1.attn_kv_b.weight", "model.layers.1.self_attn.kv_b_proj.weight"),
            ("blk.1.attn_k_b.weight", "model.layers.1.self_attn.k_b_proj.weight"),
            ("blk.1.attn_v_b.weight", "model.layers.1.self_attn.v_b_proj.weight"),
            ("blk.1.exp_probs_b.bias", "model.layers.1.mlp.gate.e_score_correction_bias"),
        ];
        for (g, h) in cases {
            assert_eq!(gguf_to_hf(g), h, "{g}");
        }
    }

    #[test]
    fn unknown_names_pass_through() {
        for n in ["rope_freqs.weight", "blk.0.attn_qkv.weight", "blk.x.attn_q.weight", "blk..attn_q.weight", "foo", ""]
        {
            assert_eq!(gguf_to_hf(n), n);
        }
        // A known stem without a weight/bias suffix still maps.
        assert_eq!(gguf_to_hf("blk.0.attn_q"), "model.layers.0.self_attn.q_proj");
    }

    #[test]
    fn hf_names_map_back_when_unambiguous() {
        for g in [
            "token_embd.weight",
            "output.weight",
            "blk.0.attn_q_a.weight",
            "blk.2.attn_k_b.weight",
            "blk.1.exp_probs_b.bias",
            "blk.3.attn_sinks.weight",
            "blk.4.ffn_up_exps.weight",
            "blk.1.attn_q.bias",
        ] {
            assert_eq!(hf_to_gguf(&gguf_to_hf(g)).as_deref(), Some(g), "{g}");
        }
        // ffn_norm and attn_post_norm are both post_attention_layernorm.
        assert_eq!(hf_to_gguf("model.layers.0.post_attention_layernorm.weight"), None);
        assert_eq!(hf_to_gguf("model.layers.0.self_attn.made_up.weight"), None);
        assert_eq!(hf_to_gguf("model.layers.0.mlp.experts.gate_exps_scales"), None);
    }
}
