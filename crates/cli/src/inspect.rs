//! `shardlm inspect M`: what a model file holds.

use crate::model_source;
use anyhow::Result;
use clap::Args;
use std::collections::BTreeMap;

#[derive(Args)]
pub struct InspectArgs {
    /// GGUF file, HF directory, or alias (default: smollm2-135m).
    model: Option<String>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    /// Also list every tensor: name, format, shape and bytes per weight.
    #[arg(long)]
    tensors: bool,
}

pub fn inspect(a: InspectArgs) -> Result<()> {
    let path = model_source::resolve(a.model.as_deref())?;
    let files = formats::open_model(&path)?;
    let cfg = &files.config;
    let mut by_type: BTreeMap<String, (usize, usize, usize)> = BTreeMap::new();
    let mut params = 0usize;
    for t in files.tensors.tensors.values() {
        let e = by_type.entry(t.dtype.name().to_string()).or_default();
        e.0 += 1;
        e.1 += t.numel();
        e.2 += t.bytes().len();
        params += t.numel();
    }
    let total_bytes: usize = by_type.values().map(|v| v.2).sum();
    let supported = model::Arch::from_name(&cfg.arch).is_some();
    // llama.cpp's form of llama3 rope scaling: a tensor of per-frequency divisors.
    let rope_freqs = files.tensors.tensors.contains_key("rope_freqs.weight");
    let rope_scaling = match &cfg.rope_scaling {
        formats::RopeScaling::None if rope_freqs => "rope_freqs.weight (per-frequency divisors)".to_string(),
        formats::RopeScaling::None => "none".to_string(),
        other => format!("{other:?}"),
    };
    if a.json {
        let types: serde_json::Map<String, serde_json::Value> = by_type
            .iter()
            .map(|(k, v)| {
                let bpw = v.2 as f64 / v.1.max(1) as f64;
                (k.clone(), serde_json::json!({"tensors": v.0, "params": v.1, "bytes": v.2, "bytes_per_weight": bpw}))
            })
            .collect();
        let out = serde_json::json!({
            "path": path.display().to_string(),
            "architecture": cfg.arch,
            "supported": supported,
            "parameters": params,
            "bytes": total_bytes,
            "bytes_per_weight": total_bytes as f64 / params.max(1) as f64,
            "tensor_types": types,
            "context_length": cfg.max_position_embeddings,
            "rope_theta": cfg.rope_theta,
            "rope_scaling": rope_scaling,
            "rope_freqs": rope_freqs,
            "layers": cfg.n_layers,
            "hidden_size": cfg.hidden_size,
            "heads": cfg.n_heads,
            "kv_heads": cfg.n_kv_heads,
            "head_dim": cfg.head_dim,
            "intermediate_size": cfg.intermediate_size,
            "vocab_size": cfg.vocab_size,
            "tied_embeddings": cfg.tie_word_embeddings,
            "chat_template": files.chat_template.is_some(),
            "tokenizer": !matches!(files.tokenizer, formats::TokenizerSource::None),
        });
        let mut out = out;
        if a.tensors {
            out["tensors"] = files
                .tensors
                .tensors
                .values()
                .map(|t| {
                    serde_json::json!({"name": t.name, "format": t.dtype.name(), "shape": t.shape,
                        "bytes_per_weight": t.bytes().len() as f64 / t.numel().max(1) as f64})
                })
                .collect();
        }
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!("model          {}", path.display());
    println!("architecture   {}{}", cfg.arch, if supported { "" } else { " (not supported)" });
    println!("parameters     {} ({:.1} M)", params, params as f64 / 1e6);
    println!(
        "weights        {:.1} MB ({:.3} bytes per weight)",
        total_bytes as f64 / 1e6,
        total_bytes as f64 / params.max(1) as f64
    );
    println!("context        {}", cfg.max_position_embeddings);
    println!("rope           theta {}, scaling {rope_scaling}", cfg.rope_theta);
    println!(
        "shape          {} layers, hidden {}, {} heads / {} kv heads × {}, ffn {}, vocab {}",
        cfg.n_layers, cfg.hidden_size, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.intermediate_size, cfg.vocab_size
    );
    println!("chat template  {}", if files.chat_template.is_some() { "yes" } else { "no" });
    println!("tensor types:");
    for (k, (n, p, b)) in &by_type {
        let bpw = *b as f64 / (*p).max(1) as f64;
        println!("  {k:<6} {n:>5} tensors {p:>13} params {:>10.2} MB {bpw:>7.4} bytes/weight", *b as f64 / 1e6);
    }
    if a.tensors {
        println!("tensors:");
        for t in files.tensors.tensors.values() {
            let bpw = t.bytes().len() as f64 / t.numel().max(1) as f64;
            let scale = if t.out_scale != 1.0 { format!(" (tensor scale {:e})", t.out_scale) } else { String::new() };
            println!(
                "  {:<48} {:<6} {:<16} {bpw:.4} bytes/weight{scale}",
                t.name,
                t.dtype.name(),
                format!("{:?}", t.shape)
            );
        }
    }
    Ok(())
}
