//! Synthetic GGUF files: writer → reader round trip of metadata, tensors and config.

mod common;

use common::{ramp_f32, tiny_llama_writer};
use kernels::DType;
use shardlm_formats::gguf::{ggml_type_info, GgufFile, GgufValue, GgufValueType};
use shardlm_formats::gguf_writer::GgufWriter;
use shardlm_formats::{open_model, RopeScaling, SourceFormat, TokenizerSource};

#[test]
fn every_value_type_round_trips() {
    let nested = GgufValue::Array(
        GgufValueType::Array,
        vec![
            GgufValue::Array(GgufValueType::U16, vec![GgufValue::U16(1), GgufValue::U16(65535)]),
            GgufValue::Array(GgufValueType::String, vec![]),
            GgufValue::Array(GgufValueType::Bool, vec![GgufValue::Bool(true), GgufValue::Bool(false)]),
        ],
    );
    let values = vec![
        ("t.u8", GgufValue::U8(200)),
        ("t.i8", GgufValue::I8(-100)),
        ("t.u16", GgufValue::U16(60000)),
        ("t.i16", GgufValue::I16(-30000)),
        ("t.u32", GgufValue::U32(4_000_000_000)),
        ("t.i32", GgufValue::I32(-2_000_000_000)),
        ("t.f32", GgufValue::F32(1.5)),
        ("t.bool", GgufValue::Bool(true)),
        ("t.string", GgufValue::String("héllo ✓".into())),
        ("t.u64", GgufValue::U64(u64::MAX)),
        ("t.i64", GgufValue::I64(i64::MIN)),
        ("t.f64", GgufValue::F64(-2.25)),
        ("t.empty", GgufValue::Array(GgufValueType::F32, vec![])),
        ("t.nested", nested),
    ];
    let mut w = GgufWriter::new();
    for (k, v) in &values {
        w.add(k, v.clone());
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kv.gguf");
    w.write_to(&path).unwrap();
    let g = GgufFile::open(&path).unwrap();
    assert_eq!(g.version, 3);
    assert_eq!(g.metadata.len(), values.len());
    for (k, v) in &values {
        assert_eq!(g.get(k), Some(v), "{k}");
    }
    // Typed getters widen integers and floats.
    assert_eq!(g.get_u64("t.u8"), Some(200));
    assert_eq!(g.get_u64("t.i8"), None, "negative is not a u64");
    assert_eq!(g.get("t.i64").and_then(GgufValue::as_i64), Some(i64::MIN));
    assert_eq!(g.get_u64("t.u64"), Some(u64::MAX));
    assert_eq!(g.get_f64("t.f32"), Some(1.5));
    assert_eq!(g.get_f32("t.u32"), Some(4e9));
    assert_eq!(g.get_bool("t.bool"), Some(true));
    assert_eq!(g.get_str("t.string"), Some("héllo ✓"));
    assert_eq!(g.get_array("t.nested").map(<[_]>::len), Some(3));
    assert_eq!(g.get("t.nested").unwrap().to_json(), serde_json::json!([[1, 65535], [], [true, false]]));
    assert_eq!(g.get_str("missing"), None);
    assert!(g.tensors.is_empty());
}

#[test]
fn tensors_round_trip_with_custom_alignment_and_v2() {
    let mut w = GgufWriter::new();
    w.set_version(2).set_alignment(64).add_str("general.architecture", "test");
    let q8: Vec<u8> = (0..3 * 34).map(|i| i as u8).collect();
    w.add_tensor("a", &[3], DType::F32, ramp_f32(3));
    w.add_tensor("b", &[3, 32], DType::Q8_0, q8.clone());
    w.add_tensor("c", &[2, 1, 5], DType::F16, (0..20).collect());
    w.add_tensor_raw("mx", &[64], 39, vec![7; 34]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.gguf");
    w.write_to(&path).unwrap();

    let g = GgufFile::open(&path).unwrap();
    assert_eq!((g.version, g.alignment), (2, 64));
    assert_eq!(g.data_offset % 64, 0);
    let names: Vec<_> = g.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c", "mx"]);
    for t in &g.tensors {
        assert_eq!(t.offset % 64, 0, "{}", t.name);
    }
    let b = g.tensor("b").unwrap();
    assert_eq!((b.dims.clone(), b.shape(), b.dtype()), (vec![32, 3], vec![3, 32], Some(DType::Q8_0)));
    assert_eq!(g.tensor_bytes(b), &q8[..]);
    assert_eq!(g.tensor_bytes(g.tensor("a").unwrap()), &ramp_f32(3)[..]);
    let c = g.tensor("c").unwrap();
    assert_eq!((c.shape(), c.numel(), c.n_bytes), (vec![2, 1, 5], 10, 20));
    assert_eq!(g.tensor_bytes(c), &(0..20).collect::<Vec<u8>>()[..]);
    // MXFP4 (ggml type 39) is an engine dtype: 17 bytes per 32 values.
    let mx = g.tensor("mx").unwrap();
    assert_eq!((mx.type_name(), mx.dtype(), mx.n_bytes), ("MXFP4".to_string(), Some(DType::MXFP4), 34));
    assert_eq!(ggml_type_info(23).unwrap().name, "IQ4_XS");
    assert_eq!(ggml_type_info(10).unwrap().name, "Q2_K");
}

#[test]
fn tiny_llama_model_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    tiny_llama_writer().write_to(&path).unwrap();
    let m = open_model(&path).unwrap();
    let c = &m.config;
    assert_eq!(c.arch, "llama");
    assert_eq!(c.source, SourceFormat::Gguf);
    assert_eq!((c.n_layers, c.hidden_size, c.n_heads, c.n_kv_heads), (2, 8, 2, 1));
    assert_eq!((c.head_dim, c.rope_dim, c.intermediate_size, c.vocab_size), (4, 4, 16, 4));
    assert_eq!((c.rope_theta, c.rms_norm_eps, c.max_position_embeddings), (500000.0, 1e-5, 128));
    assert_eq!(c.rope_scaling, RopeScaling::None);
    assert!(c.tie_word_embeddings, "no output.weight");
    assert!(!c.attention_bias);
    assert_eq!(c.sliding_window, None);
    assert_eq!(c.bos_token_id, Some(0));
    assert_eq!(c.eos_token_ids, vec![1, 3]);
    assert_eq!(c.raw["general.name"], "tiny");
    assert_eq!(c.raw["llama.rope.freq_base"], 500000.0);
    assert_eq!(c.raw["tokenizer.ggml.tokens"], serde_json::json!(["<s>", "</s>", "a", "<eot>"]), "small arrays kept");

    let t = &m.tensors;
    let emb = t.get_shaped("model.embed_tokens.weight", &[4, 8]).unwrap();
    assert_eq!(emb.dtype, DType::F32);
    assert_eq!(emb.bytes(), &ramp_f32(32)[..]);
    assert_eq!(t.get("model.layers.1.self_attn.o_proj.weight").unwrap().bytes(), &ramp_f32(64)[..]);
    assert_eq!(t.get_shaped("model.layers.0.self_attn.k_proj.weight", &[4, 8]).unwrap().dtype, DType::BF16);
    let gate = t.get_shaped("model.layers.1.mlp.gate_proj.weight", &[16, 32]).unwrap();
    assert_eq!((gate.dtype, gate.bytes().len(), gate.bytes()[0]), (DType::Q8_0, 16 * 34, 1));
    t.get_shaped("model.layers.1.mlp.down_proj.weight", &[8, 16]).unwrap();
    t.get_shaped("model.layers.0.post_attention_layernorm.weight", &[8]).unwrap();
    t.get_shaped("model.norm.weight", &[8]).unwrap();
    assert_eq!(t.tensors.len(), 2 + 2 * 9);

    assert_eq!(m.chat_template.as_deref(), Some("{{ messages }}"));
    assert_eq!((m.bos_token.as_deref(), m.eos_token.as_deref()), (Some("<s>"), Some("</s>")));
    let TokenizerSource::Gguf(tok) = &m.tokenizer else { panic!("expected GGUF tokenizer") };
    assert_eq!((tok.model.as_str(), tok.pre.as_deref()), ("gpt2", Some("smollm")));
    assert_eq!(tok.tokens, ["<s>", "</s>", "a", "<eot>"]);
    assert_eq!(tok.token_types, [3, 3, 1, 3]);
    assert_eq!(tok.scores, [0.0, 0.0, -1.0, 0.0]);
    assert_eq!(tok.merges, ["a a"]);
    assert_eq!((tok.bos_id, tok.eos_id, tok.unk_id, tok.pad_id), (Some(0), Some(1), None, None));
    assert_eq!((tok.add_bos, tok.add_eos), (Some(true), None));
}

#[test]
fn qwen_moe_config_bias_untied_and_rope_scaling() {
    let mut w = GgufWriter::new();
    w.add_str("general.architecture", "qwen3moe")
        .add_u32("qwen3moe.block_count", 1)
        .add_u32("qwen3moe.embedding_length", 8)
        .add_u32("qwen3moe.expert_feed_forward_length", 4)
        .add_u32("qwen3moe.attention.head_count", 2)
        .add_u32("qwen3moe.attention.key_length", 16)
        .add_u32("qwen3moe.vocab_size", 6)
        .add_u32("qwen3moe.attention.sliding_window", 64)
        .add_str("qwen3moe.rope.scaling.type", "yarn")
        .add_f32("qwen3moe.rope.scaling.factor", 4.0)
        .add_u32("qwen3moe.rope.scaling.original_context_length", 32768);
    w.add_f32_tensor("output.weight", &[6, 8], &[0.0; 48]);
    w.add_f32_tensor("blk.0.attn_q.bias", &[32], &[0.0; 32]);
    w.add_f32_tensor("blk.0.ffn_gate_inp.weight", &[3, 8], &[0.0; 24]);
    w.add_f32_tensor("blk.0.ffn_up_exps.weight", &[3, 4, 8], &[0.0; 96]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("moe.gguf");
    w.write_to(&path).unwrap();
    let m = open_model(&path).unwrap();
    let c = &m.config;
    assert_eq!(c.arch, "qwen3_moe");
    assert_eq!((c.n_kv_heads, c.head_dim, c.rope_dim, c.intermediate_size), (2, 16, 16, 4));
    assert_eq!((c.vocab_size, c.rope_theta, c.sliding_window), (6, 10000.0, Some(64)));
    assert!(!c.tie_word_embeddings);
    assert!(c.attention_bias);
    assert!(matches!(
        c.rope_scaling,
        RopeScaling::Yarn { factor: 4.0, original_max_position_embeddings: 32768, beta_fast: 32.0, beta_slow: 1.0, .. }
    ));
    assert!(matches!(m.tokenizer, TokenizerSource::None));
    m.tensors.get_shaped("lm_head.weight", &[6, 8]).unwrap();
    m.tensors.get_shaped("model.layers.0.mlp.gate.weight", &[3, 8]).unwrap();
    m.tensors.get_shaped("model.layers.0.mlp.experts.up_exps.weight", &[3, 4, 8]).unwrap();
}

/// A sliding-window pattern written as an array or a period, and the
/// `layer_types` expected from it.
type PatternCase = (Option<Vec<i32>>, Option<u32>, [&'static str; 4]);

/// gpt-oss: the arch name, `layer_types` from llama.cpp's sliding-window
/// pattern (a per-layer array, or a period; default 2: even layers windowed),
/// and yarn without truncation (the model's definition).
#[test]
fn gpt_oss_layer_types_and_yarn() {
    let base = |w: &mut GgufWriter| {
        w.add_str("general.architecture", "gpt-oss")
            .add_u32("gpt-oss.block_count", 4)
            .add_u32("gpt-oss.embedding_length", 8)
            .add_u32("gpt-oss.expert_feed_forward_length", 4)
            .add_u32("gpt-oss.expert_count", 2)
            .add_u32("gpt-oss.attention.head_count", 2)
            .add_u32("gpt-oss.vocab_size", 6)
            .add_str("gpt-oss.rope.scaling.type", "yarn")
            .add_f32("gpt-oss.rope.scaling.factor", 32.0);
        w.add_f32_tensor("output.weight", &[6, 8], &[0.0; 48]);
    };
    let dir = tempfile::tempdir().unwrap();
    let cases: [PatternCase; 3] = [
        (None, None, ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]),
        (None, Some(4), ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]),
        (Some(vec![0, 1, 1, 0]), None, ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]),
    ];
    for (i, (array, period, want)) in cases.into_iter().enumerate() {
        let mut w = GgufWriter::new();
        base(&mut w);
        if let Some(a) = array {
            w.add_i32_array("gpt-oss.attention.sliding_window_pattern", &a);
        }
        if let Some(n) = period {
            w.add_u32("gpt-oss.attention.sliding_window_pattern", n);
        }
        let path = dir.path().join(format!("gpt-oss-{i}.gguf"));
        w.write_to(&path).unwrap();
        let c = open_model(&path).unwrap().config;
        assert_eq!(c.arch, "gpt_oss");
        assert_eq!(c.raw["layer_types"], serde_json::json!(want), "case {i}");
        assert!(matches!(c.rope_scaling, RopeScaling::Yarn { truncate: false, .. }));
    }
}

/// llama.cpp's `deepseek2` metadata as the HF `deepseek_v3` config keys
/// (formats::gguf_deepseek2): the MLA widths from the `_mla` keys (the plain
/// key/value lengths and head_count_kv = 1 describe llama.cpp's MQA view of
/// the latent cache), routing keys, yarn's mscale from the log multiplier;
/// missing required keys are one-line errors naming the key.
#[test]
fn deepseek2_keys_become_the_hf_config() {
    let write = |path: &std::path::Path, skip: &str, extra: &dyn Fn(&mut GgufWriter)| {
        let mut w = GgufWriter::new();
        w.add_str("general.architecture", "deepseek2");
        let ints = [
            ("block_count", 3),
            ("embedding_length", 16),
            ("feed_forward_length", 32),
            ("attention.head_count", 4),
            ("attention.head_count_kv", 1),
            ("attention.q_lora_rank", 12),
            ("attention.kv_lora_rank", 8),
            ("attention.key_length", 8 + 4),
            ("attention.value_length", 8),
            ("attention.key_length_mla", 6 + 4),
            ("attention.value_length_mla", 5),
            ("rope.dimension_count", 4),
            ("leading_dense_block_count", 1),
            ("expert_count", 8),
            ("expert_used_count", 2),
            ("expert_feed_forward_length", 6),
            ("expert_shared_count", 2),
            ("expert_group_count", 4),
            ("expert_group_used_count", 2),
            ("expert_gating_func", 2),
            ("vocab_size", 6),
        ];
        for (k, v) in ints.iter().filter(|(k, _)| *k != skip) {
            w.add_u32(&format!("deepseek2.{k}"), *v);
        }
        w.add_f32("deepseek2.expert_weights_scale", 2.5).add_bool("deepseek2.expert_weights_norm", true);
        w.add_f32_tensor("output.weight", &[6, 16], &[0.0; 96]);
        extra(&mut w);
        w.write_to(path).unwrap();
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ds2.gguf");
    write(&path, "", &|w| {
        w.add_str("deepseek2.rope.scaling.type", "yarn")
            .add_f32("deepseek2.rope.scaling.factor", 40.0)
            .add_u32("deepseek2.rope.scaling.original_context_length", 4096)
            .add_f32("deepseek2.rope.scaling.yarn_log_multiplier", 0.1);
    });
    let c = open_model(&path).unwrap().config;
    assert_eq!(c.arch, "deepseek_v3");
    assert_eq!((c.n_heads, c.n_kv_heads, c.head_dim, c.rope_dim, c.intermediate_size), (4, 4, 4, 4, 32));
    let want = serde_json::json!({
        "q_lora_rank": 12, "kv_lora_rank": 8, "qk_nope_head_dim": 6, "qk_rope_head_dim": 4, "v_head_dim": 5,
        "rope_interleave": true, "first_k_dense_replace": 1, "n_routed_experts": 8, "num_experts_per_tok": 2,
        "moe_intermediate_size": 6, "n_shared_experts": 2, "routed_scaling_factor": 2.5, "norm_topk_prob": true,
        "scoring_func": "sigmoid", "n_group": 4, "topk_group": 2,
    });
    for (k, v) in want.as_object().unwrap() {
        assert_eq!(&c.raw[k], v, "{k}");
    }
    match c.rope_scaling {
        RopeScaling::Yarn { factor, mscale, mscale_all_dim, truncate, .. } => {
            assert_eq!(factor, 40.0);
            assert!(truncate);
            assert!((mscale_all_dim.unwrap() - 1.0).abs() < 1e-6 && mscale == mscale_all_dim);
        }
        other => panic!("{other:?}"),
    }

    // Old files: no `_mla` keys, widths in key/value_length; no gating key
    // means softmax (llama.cpp's rule for DeepSeek V2 files); no q_lora_rank
    // and no attn_q_a: one q projection (null).
    let old = dir.path().join("ds2-old.gguf");
    let mut w = GgufWriter::new();
    w.add_str("general.architecture", "deepseek2");
    for (k, v) in [
        ("block_count", 1),
        ("embedding_length", 16),
        ("attention.head_count", 4),
        ("attention.kv_lora_rank", 8),
        ("attention.key_length", 10),
        ("attention.value_length", 5),
        ("rope.dimension_count", 4),
        ("expert_feed_forward_length", 6),
        ("expert_shared_count", 0),
        ("expert_count", 4),
        ("expert_used_count", 1),
        ("vocab_size", 6),
    ] {
        w.add_u32(&format!("deepseek2.{k}"), v);
    }
    w.write_to(&old).unwrap();
    let c = open_model(&old).unwrap().config;
    assert_eq!((c.raw["qk_nope_head_dim"].as_u64(), c.raw["v_head_dim"].as_u64()), (Some(6), Some(5)));
    assert_eq!(c.raw["q_lora_rank"], serde_json::Value::Null);
    assert_eq!(c.raw["scoring_func"], "softmax");
    assert_eq!(c.raw["norm_topk_prob"], false);
    assert_eq!(c.raw["routed_scaling_factor"], 1.0);

    for (skip, names) in [
        ("attention.kv_lora_rank", "deepseek2.attention.kv_lora_rank"),
        ("rope.dimension_count", "deepseek2.rope.dimension_count"),
        ("expert_shared_count", "deepseek2.expert_shared_count"),
        ("expert_count", "deepseek2.expert_count"),
        ("attention.q_lora_rank", "deepseek2.attention.q_lora_rank' (the file has attn_q_a"),
    ] {
        let p = dir.path().join(format!("ds2-no-{skip}.gguf"));
        write(&p, skip, &|w| {
            w.add_f32_tensor("blk.0.attn_q_a.weight", &[12, 16], &[0.0; 192]);
        });
        let err = open_model(&p).unwrap_err().to_string();
        assert!(err.contains(names) && !err.contains('\n'), "{skip}: {err}");
    }
}
