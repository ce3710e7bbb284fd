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
        // gpt-oss's sinks are a parameter, not a layer: HF names it bare.
        (Some(m), Some(_)) if m.ends_with(".sinks") => m,
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

fn block_part(part: &str) -> Option<&'static str> {
    Some(match part {
        "attn_norm" => "input_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "ffn_norm" => "post_attention_layernorm",
        // gpt-oss: the norm before the MoE block, and the attention sinks.
        "attn_post_norm" => "post_attention_layernorm",
        "attn_sinks" => "self_attn.sinks",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        // Mixture of experts: router, stacked experts `[n_expert, out, in]`, shared expert.
        "ffn_gate_inp" => "mlp.gate",
        "ffn_gate_exps" => "mlp.experts.gate_exps",
        "ffn_up_exps" => "mlp.experts.up_exps",
        "ffn_down_exps" => "mlp.experts.down_exps",
        "ffn_gate_shexp" => "mlp.shared_expert.gate_proj",
        "ffn_up_shexp" => "mlp.shared_expert.up_proj",
        "ffn_down_shexp" => "mlp.shared_expert.down_proj",
        "ffn_gate_inp_shexp" => "mlp.shared_expert_gate",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::gguf_to_hf;

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
}
