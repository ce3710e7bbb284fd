//! `shardlm plan`: will this model fit on these machines, and which split will
//! be fastest? Predicts memory per rank, TTFT and decode speed for every
//! strategy and machine count, names the bottleneck and prints the command to
//! run. The cost model is in [`cost`]; docs/PLANNER.md has its equations.

mod calibrate;
mod cost;
mod hardware;
pub mod measure;
mod measure_gpu;
mod serve;
mod shape;
mod svg;

use anyhow::{bail, Context, Result};
use clap::Args;
use cost::{Prediction, Strategy, Workload};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct PlanArgs {
    /// GGUF file, HF directory, HF config.json, an alias, or `params:total=…,active=…,layers=…,hidden=…,heads=…`.
    #[arg(long, default_value = crate::model_source::DEFAULT_MODEL)]
    model: String,
    /// The machines: `local` (this CPU, measured here), `gpu` or `gpu:N` (this
    /// machine's GPU, measured here), presets such as `2xm3-ultra-512`,
    /// `4xh100`, `x86-2s`, `m4-max-128` (comma-separated for mixed sets), or a
    /// profile written by --calibrate.
    #[arg(long, default_value = "local")]
    machines: String,
    /// The link between machines: tb5-rdma, tb5-tcp, 10gbe, 25gbe, 100gbe, ib-ndr,
    /// nvlink, `2xtb5-rdma` for two cables per pair, or local-shm / local-tcp
    /// (measured here). Default: the profile's, local-shm for local machines, else 10gbe.
    #[arg(long)]
    links: Option<String>,
    /// Storage format to plan for (default: as the model is stored, bf16 for configs):
    /// f16, bf16, q8_0, fp8, q4_0, q4_1, q4_k, q6_k, nvfp4, mxfp4.
    #[arg(long)]
    quant: Option<String>,
    /// Context to plan for: the prompt length of the TTFT prediction and the depth decode runs at.
    #[arg(long, default_value_t = 4096)]
    context: usize,
    /// KV cache element type: f16, f32, q8_0, q4_0 (default: what the engine
    /// picks: f32 for float weights run as stored, else f16).
    #[arg(long, value_parser = parse_kv_type)]
    kv_type: Option<model::KvType>,
    /// Prompt tokens per prefill step (as run's --prefill-chunk).
    #[arg(long, default_value_t = 512)]
    prefill_chunk: usize,
    /// Concurrent streams of the `serve` prediction (aggregate decode tok/s
    /// at the context's depth).
    #[arg(long, default_value_t = 8)]
    streams: usize,
    /// Threads per rank for the local measurements (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Measure every host of this hostfile and the links between them with the
    /// real transport; write the profile to --out (for --machines PROFILE.json).
    #[arg(long, value_name = "HOSTFILE")]
    calibrate: Option<PathBuf>,
    /// Where --calibrate writes its profile.
    #[arg(long, default_value = "shardlm-profile.json")]
    out: PathBuf,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    json: bool,
    /// Write an SVG chart of predicted decode tok/s and TTFT against machine count.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
}

pub fn plan(a: PlanArgs) -> Result<()> {
    if let Some(hosts) = &a.calibrate {
        return calibrate(hosts, &a);
    }
    let shape = shape::load(&a.model, a.quant.as_deref())?;
    let threads = a.threads.unwrap_or_else(crate::run::default_threads);
    let (machines, profile_link) = hardware::parse_machines(&a.machines, threads, &shape.quant)?;
    let kv = a.kv_type.unwrap_or(if a.quant.is_none() && shape::is_float(&shape.quant) {
        model::KvType::F32
    } else {
        model::KvType::F16
    });
    let w = Workload {
        context: a.context.max(1),
        chunk: a.prefill_chunk.max(1),
        kv_elem: kv.bytes_for(32) as f64 / 32.0,
        streams: a.streams.max(1),
    };
    let link = match (&a.links, profile_link) {
        (Some(l), _) => hardware::parse_link(l)?,
        (None, Some(l)) => l,
        (None, None)
            if a.machines.split(',').all(|m| {
                let m = m.trim().trim_start_matches(|c: char| c.is_ascii_digit() || c == 'x');
                m == "local" || m == "gpu" || m.starts_with("gpu:")
            }) =>
        {
            hardware::parse_link("local-shm")?
        }
        (None, None) => hardware::parse_link("10gbe")?,
    };
    let co_located = link.name.starts_with("local-");
    let measured = measure_shards(&shape, &machines, a.quant.is_some(), threads, kv, &w, co_located);
    let preds = predictions(&shape, &machines, &link, &w, &measured);
    let best = recommend(&preds);
    if let Some(path) = &a.plot {
        std::fs::write(path, svg::chart(&shape.name, &preds)).with_context(|| format!("writing {}", path.display()))?;
    }
    let command = best.map(|p| command_line(&a.model, p, &machines));
    if a.json {
        let v = serde_json::json!({
            "model": {
                "name": shape.name, "quant": shape.quant, "layers": shape.layers, "hidden": shape.hidden,
                "total_bytes": shape.total_bytes(), "active_bytes_per_token": shape.active_bytes(),
                "kv_bytes_per_token": shape.kv_bytes_per_token(w.kv_elem), "kv_type": kv.name(),
                "state_bytes_per_sequence": shape.state_bytes_per_layer * shape.layers as f64,
                "experts": shape.experts,
                "active_experts": shape.active_experts,
            },
            "machines": machines, "measured": measured, "link": link, "context": w.context,
            "predictions": preds,
            "recommendation": best.map(|p| serde_json::json!({"strategy": p.strategy, "ranks": p.ranks, "tp": p.tp, "command": command})),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    print_tables(&shape, &machines, &link, &w, kv, &preds);
    match (best, command) {
        (Some(p), Some(cmd)) => {
            println!(
                "\nrecommended: {} on {} machine(s), ~{:.1} tok/s decode, TTFT {:.2} s",
                name(p),
                p.ranks,
                p.decode_tok_s,
                p.ttft_s
            );
            println!("  {cmd}");
        }
        _ => println!("\nno strategy fits: the model needs more memory than these machines have"),
    }
    Ok(())
}

fn parse_kv_type(s: &str) -> Result<model::KvType, String> {
    model::KvType::parse(s).ok_or_else(|| format!("unknown KV type '{s}' (f16, f32, q8_0, q4_0)"))
}

/// The shards the strategies would run on this machine, timed with the model
/// itself (`local` machines, a model on disk planned as stored): the whole
/// width and every tensor width that divides the machine count, whole
/// experts too for MoE models. A shard that cannot be loaded or split here is
/// left to the bandwidth and FLOP estimates.
///
/// `co_located`: the ranks share this host (`local-shm`/`local-tcp` links),
/// so a `tp`-wide shard is timed while `tp − 1` copies of it run beside it,
/// as the tensor ranks do: alone, a shard of SmolLM2 found the caches to
/// itself and was timed 1.8× faster than it decodes next to its peer
/// (2026-12-01); the slowest copy's times are kept.
fn measure_shards(
    shape: &shape::Shape,
    machines: &[hardware::Machine],
    requantized: bool,
    threads: usize,
    kv: model::KvType,
    w: &Workload,
    co_located: bool,
) -> Vec<cost::Measured> {
    let Some(path) = shape.path.as_deref() else { return vec![] };
    let locals = machines.iter().filter(|m| m.name.starts_with("local")).count();
    if requantized || locals == 0 {
        return vec![];
    }
    let mut out = Vec::new();
    for tp in 1..=machines.len() {
        for expert in [false, true] {
            if expert && (tp == 1 || shape.experts == 0) {
                continue;
            }
            let copies = if co_located { tp } else { 1 };
            let probe = calibrate::ShardProbe { path, tp, expert, threads, kv, w };
            match calibrate::measure_shard(&probe, copies) {
                Ok(m) => out.push(m),
                Err(e) => eprintln!("shardlm: not timing the {tp}-way shard here ({e}); estimating it"),
            }
        }
    }
    out
}

/// Every strategy on every machine count from 1 to all.
fn predictions(
    shape: &shape::Shape,
    machines: &[hardware::Machine],
    link: &hardware::Link,
    w: &Workload,
    measured: &[cost::Measured],
) -> Vec<Prediction> {
    let predict = |s, n, tp| cost::predict(shape, machines, link, s, n, tp, w, measured);
    let mut out = vec![predict(Strategy::Single, 1, 1)];
    for n in 2..=machines.len() {
        out.push(predict(Strategy::Pipeline, n, 1));
        out.push(predict(Strategy::Tensor, n, n));
        for tp in (2..n).filter(|tp| n % tp == 0) {
            out.push(predict(Strategy::Hybrid, n, tp));
        }
        if shape.experts > 0 {
            out.push(predict(Strategy::Expert, n, 1));
        }
    }
    out
}

/// The fastest decode among the plans that fit; on a tie (within 3%), fewer machines.
fn recommend(preds: &[Prediction]) -> Option<&Prediction> {
    let best = preds.iter().filter(|p| p.fits).map(|p| p.decode_tok_s).fold(0.0, f64::max);
    preds.iter().filter(|p| p.fits && p.decode_tok_s >= best * 0.97).min_by_key(|p| p.ranks)
}

fn name(p: &Prediction) -> String {
    match p.strategy {
        Strategy::Single => "single".into(),
        Strategy::Hybrid => format!("hybrid (tp {} × {} stages)", p.tp, p.ranks / p.tp),
        s => format!("{s:?}").to_lowercase(),
    }
}

/// The command that runs the recommendation.
fn command_line(model: &str, p: &Prediction, machines: &[hardware::Machine]) -> String {
    let model = if model.contains(' ') { format!("'{model}'") } else { model.to_string() };
    let mut run = format!("run --model {model}");
    // Measured GPUs (`--machines gpu`) run their ranks with --device gpu
    // (a hostfile says it per host with "device").
    let gpus = machines.iter().take(p.ranks).filter(|m| m.name.starts_with("gpu ")).count();
    if gpus > 0 && machines.len() == 1 {
        run.push_str(" --device gpu");
    }
    if p.ranks == 1 {
        return format!("shardlm {run} PROMPT");
    }
    let strategy = match p.strategy {
        Strategy::Hybrid => format!("hybrid --tp {}", p.tp),
        s => format!("{s:?}").to_lowercase(),
    };
    run.push_str(&format!(" --strategy {strategy} PROMPT"));
    if machines.len() > 1 && p.ranks > 1 {
        let devices = if gpus > 0 { "; \"device\": \"gpu\" for the GPU hosts" } else { "" };
        format!("shardlm launch --hostfile hosts.json -- {run}   # hosts.json: the first {} machines{devices}", p.ranks)
    } else {
        format!("shardlm {run} --ranks {}", p.ranks)
    }
}

fn gb(b: f64) -> String {
    if b.abs() >= 1e9 {
        format!("{:.1} GB", b / 1e9)
    } else {
        format!("{:.0} MB", b / 1e6)
    }
}

fn kb(b: f64) -> String {
    if b >= 1e6 {
        gb(b)
    } else {
        format!("{:.0} KB", b / 1e3)
    }
}

fn print_tables(
    shape: &shape::Shape,
    machines: &[hardware::Machine],
    link: &hardware::Link,
    w: &Workload,
    kv: model::KvType,
    preds: &[Prediction],
) {
    println!(
        "model   {}: {} layers, hidden {}, {}; {} of weights, {} read per token, KV {} per token ({})",
        shape.name,
        shape.layers,
        shape.hidden,
        shape.quant,
        gb(shape.total_bytes()),
        gb(shape.active_bytes()),
        kb(shape.kv_bytes_per_token(w.kv_elem)),
        kv.name(),
    );
    if shape.experts > 0 {
        println!("        {} experts, {} active per token", shape.experts, shape.active_experts);
    }
    if shape.state_bytes_per_layer > 0.0 {
        println!(
            "        linear-attention state {} per sequence, whatever the context",
            kb(shape.state_bytes_per_layer * shape.layers as f64)
        );
    }
    let m = &machines[0];
    println!(
        "machine {} × {}: {} memory, decode streams {:.1} GB/s, prefill {:.0} GFLOP/s",
        machines.len(),
        m.name,
        gb(m.mem_bytes),
        m.decode_bytes_per_s / 1e9,
        m.prefill_flops / 1e9
    );
    println!(
        "link    {}{}: {:.1} µs, {:.2} GB/s per cable{}; context {} tokens",
        link.name,
        if link.cables > 1 { format!(" ×{}", link.cables) } else { String::new() },
        link.latency_s * 1e6,
        link.bytes_per_s / 1e9,
        if link.handoff_s > 0.0 {
            format!(", +{:.0} µs to wake a parked rank", link.handoff_s * 1e6)
        } else {
            String::new()
        },
        w.context
    );
    println!(
        "\n{:<26} {:>3} {:>10} {:>10} {:>10} {:>6} {:>10} {:>9} {:>10} {:>11}  bottleneck (decode / prefill)",
        "strategy",
        "n",
        "weights",
        "KV",
        "total/rank",
        "fits",
        "margin",
        "TTFT s",
        "decode t/s",
        format!("serve {}× t/s", w.streams)
    );
    for p in preds {
        let r = (0..p.ranks).max_by(|&a, &b| p.total_bytes[a].total_cmp(&p.total_bytes[b])).unwrap_or(0);
        println!(
            "{:<26} {:>3} {:>10} {:>10} {:>10} {:>6} {:>10} {:>9} {:>10} {:>11}  {} / {}",
            name(p),
            p.ranks,
            gb(p.weights_bytes[r]),
            gb(p.kv_bytes[r]),
            gb(p.total_bytes[r]),
            if p.fits { "yes" } else { "no" },
            gb(p.margin_bytes),
            if p.fits { format!("{:.2}", p.ttft_s) } else { "-".into() },
            if p.fits { format!("{:.1}", p.decode_tok_s) } else { "-".into() },
            if p.fits { format!("{:.1}", p.serve_tok_s) } else { "-".into() },
            p.decode_bottleneck,
            p.prefill_bottleneck
        );
    }
}

/// `--calibrate HOSTFILE`: every host measures itself and the links, through
/// `shardlm launch --hostfile HOSTFILE -- plan-probe`; rank 0's profile is saved.
fn calibrate(hosts: &std::path::Path, a: &PlanArgs) -> Result<()> {
    let exe = std::env::current_exe().context("finding the shardlm executable")?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("launch").arg("--hostfile").arg(hosts).args(["--", "plan-probe"]);
    if let Some(t) = a.threads {
        cmd.args(["--threads", &t.to_string()]);
    }
    if let Some(q) = &a.quant {
        cmd.args(["--quant", q]);
    }
    eprintln!("shardlm: measuring every host of {} and the links between them ...", hosts.display());
    let out = cmd.stderr(std::process::Stdio::inherit()).output().context("starting the probe")?;
    if !out.status.success() {
        bail!("calibration failed ({})", out.status);
    }
    let profile: hardware::Profile = serde_json::from_slice(&out.stdout).context("reading the probe's profile")?;
    std::fs::write(&a.out, serde_json::to_string_pretty(&profile)?)
        .with_context(|| format!("writing {}", a.out.display()))?;
    for m in &profile.machines {
        eprintln!(
            "  {}: {:.1} GB/s decode, {:.0} GFLOP/s prefill, {:.0} GB free",
            m.name,
            m.decode_bytes_per_s / 1e9,
            m.prefill_flops / 1e9,
            m.mem_bytes / 1e9
        );
    }
    if let Some(l) = &profile.link {
        eprintln!(
            "  link: {:.1} µs, {:.2} GB/s, +{:.0} µs to wake a parked rank",
            l.latency_s * 1e6,
            l.bytes_per_s / 1e9,
            l.handoff_s * 1e6
        );
    }
    eprintln!("shardlm: wrote {} (use --machines {})", a.out.display(), a.out.display());
    Ok(())
}
