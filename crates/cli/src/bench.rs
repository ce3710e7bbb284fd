//! `shardlm bench`: prompt and generation throughput with the semantics of
//! `mlx_lm.benchmark`. A seeded random-token prompt of `-p` tokens is prefilled,
//! then `-g` tokens are generated greedily at batch 1 with EOS ignored. One warm-up
//! trial runs first, then `-n` measured trials; each prints prompt tok/s, generation
//! tok/s, time to first token, the peak RSS so far and the wall time, then the
//! averages.
//!
//! Long prompts (8K to 64K tokens) take minutes on a few cores, so prefill
//! progress goes to stderr, and the peak RSS is predicted before the first trial
//! (resident after load + KV cache + prefill workspace) to be checked against
//! the measured one: memory must stay bounded by what the context needs.

use crate::bench_power;
use crate::run::default_threads;
use anyhow::{bail, Context, Result};
use clap::Args;
use engine::draft::DraftChoice;
use engine::generate::{Engine, GenerateHooks, GenerateRequest};
use engine::sampler::SamplingParams;
use engine::serving::Scheduler;
use std::path::Path;
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// GGUF file, HF directory, or alias (default: smollm2-135m).
    #[arg(long)]
    model: Option<String>,
    /// Prompt length in tokens (random ids, uniform over the vocabulary).
    #[arg(short = 'p', long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..))]
    prompt_tokens: u64,
    /// Tokens to generate per trial (EOS is ignored).
    #[arg(short = 'g', long, default_value_t = 128, value_parser = clap::value_parser!(u64).range(1..))]
    generation_tokens: u64,
    /// Measured trials (after the warm-up trials).
    #[arg(short = 'n', long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    num_trials: u64,
    /// Unmeasured warm-up trials before the first measured one.
    #[arg(long, default_value_t = 1)]
    warmup: u64,
    /// Worker threads (default: all cores).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1024))]
    threads: Option<u64>,
    /// Prompt tokens per prefill step.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..))]
    prefill_chunk: u64,
    /// Seed of the random prompt.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print one JSON object on stdout instead of text.
    #[arg(long)]
    json: bool,
    /// Write an SVG of tok/s over context depth and the per-phase power (last trial).
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<std::path::PathBuf>,
    /// Seconds between prefill progress lines on stderr (0: after every chunk).
    #[arg(long, default_value_t = 2.0)]
    progress_secs: f64,
    /// Prompt from this text file (tokenized) instead of random ids.
    #[arg(long, value_name = "FILE")]
    prompt_file: Option<std::path::PathBuf>,
    /// With --draft: each trial also runs without speculation (alternating
    /// which goes first); the report gives the speedup and whether the
    /// outputs are identical.
    #[command(flatten)]
    draft: crate::draft_args::DraftArgs,
    #[command(flatten)]
    dist: crate::dist_args::DistArgs,
}

/// One measured trial.
#[derive(Debug, Clone)]
struct Trial {
    prompt_tps: f64,
    generation_tps: f64,
    ttft_s: f64,
    peak_rss_bytes: u64,
    total_s: f64,
    /// The greedy tokens it generated (the same as `run --prompt-ids` and
    /// `serve` give for this prompt: tests compare them).
    output_ids: Vec<u32>,
    /// Speculative decoding (with --draft): draft tokens checked and
    /// accepted, and the same trial without speculation.
    drafted: usize,
    accepted: usize,
    plain: Option<Box<Trial>>,
}

impl Trial {
    fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "prompt_tps": self.prompt_tps,
            "generation_tps": self.generation_tps,
            "ttft_s": self.ttft_s,
            "peak_rss_bytes": self.peak_rss_bytes,
            "total_s": self.total_s,
            "output_ids": self.output_ids,
            "drafted_tokens": self.drafted,
            "accepted_tokens": self.accepted,
            "acceptance_rate": crate::draft_args::acceptance(self.drafted, self.accepted),
            "plain": self.plain.as_ref().map(|p| p.to_json()),
            "speedup": self.speedup(),
        })
    }

    /// Decode tok/s against the same trial without speculation.
    fn speedup(&self) -> Option<f64> {
        self.plain.as_ref().map(|p| self.generation_tps / p.generation_tps.max(1e-9))
    }
}

/// SplitMix64: a small, seedable generator for the prompt ids (no statistical
/// demands beyond "spread over the vocabulary").
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (multiply-shift; the bias is far below anything measurable here).
    fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

/// `n` token ids drawn uniformly from `0..vocab`.
fn random_prompt(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = SplitMix64(seed);
    (0..n).map(|_| rng.below(vocab as u64) as u32).collect()
}

/// The process's resident-set high-water mark (`VmHWM`), in bytes; 0 where unknown.
pub fn peak_rss_bytes() -> u64 {
    status_bytes("VmHWM:")
}

/// A `/proc/self/status` size field (`VmHWM:`, `VmRSS:`), in bytes; 0 where unknown.
fn status_bytes(field: &str) -> u64 {
    let Ok(s) = std::fs::read_to_string("/proc/self/status") else { return 0 };
    s.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Bytes of the model files at `path`: a file's length, or the weight files of a directory.
fn model_file_bytes(path: &Path) -> u64 {
    if path.is_file() {
        return path.metadata().map_or(0, |m| m.len());
    }
    let Ok(rd) = std::fs::read_dir(path) else { return 0 };
    rd.filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors" || x == "gguf"))
        .filter_map(|p| p.metadata().ok().map(|m| m.len()))
        .sum()
}

/// Bytes of the scratch one prefill chunk of `chunk` tokens needs: the f32
/// activation buffers of `model::Workspace` (residual, norm, q, k, v, attention
/// output, projection output, gate, up, cos/sin), the quantized copy of the
/// widest matmul input, and three vocabulary-long logit rows (the head's, the
/// engine's, the sampler's copy). The attention kernel's scratch is per thread
/// and a few hundred KiB, left out.
fn workspace_bytes(cfg: &formats::ModelConfig, chunk: usize) -> u64 {
    let hq = cfg.n_heads * cfg.head_dim;
    let hkv = cfg.n_kv_heads * cfg.head_dim;
    let per_token = 3 * cfg.hidden_size + 2 * hq + 2 * hkv + 2 * cfg.intermediate_size + cfg.rope_dim;
    let act_q = chunk * cfg.intermediate_size.max(cfg.hidden_size).max(hq) * 9 / 8;
    (4 * chunk * per_token + act_q + 3 * 4 * cfg.vocab_size) as u64
}

/// Prefill progress on stderr with the rate so far, a line every `every` (and
/// only once the prefill has run that long, so short prompts stay quiet).
/// Also keeps when each prefill chunk and each token finished (the plot's
/// tok/s over depth). The engine's steps mark their own power phases
/// (`engine::power::enter`), in one process as in a cluster.
struct BenchHooks {
    every: Duration,
    start: Instant,
    last: Option<Instant>,
    prefill_marks: Vec<(usize, Instant)>,
    token_times: Vec<Instant>,
}

impl BenchHooks {
    fn new(every: Duration) -> BenchHooks {
        BenchHooks { every, start: Instant::now(), last: None, prefill_marks: Vec::new(), token_times: Vec::new() }
    }
}

impl GenerateHooks for BenchHooks {
    fn on_text(&mut self, _text: &str) {}

    fn on_token(&mut self, _id: u32) -> bool {
        self.token_times.push(Instant::now());
        true
    }

    fn on_prefill(&mut self, done: usize, total: usize) {
        let now = Instant::now();
        self.prefill_marks.push((done, now));
        let since = now.duration_since(self.last.unwrap_or(self.start));
        // The last chunk is reported only when earlier ones were, to close the sequence.
        if since < self.every && !(done == total && self.last.is_some()) {
            return;
        }
        self.last = Some(now);
        let secs = now.duration_since(self.start).as_secs_f64();
        eprintln!(
            "prefill {done}/{total} tokens ({:.0}%), {:.1} tok/s, {secs:.1} s",
            100.0 * done as f64 / total.max(1) as f64,
            done as f64 / secs.max(1e-9)
        );
    }
}

/// Prefill and decode tok/s over context depth, from one trial's marks:
/// prefill per chunk, decode over windows of 16 tokens.
fn depth_curves(h: &BenchHooks, t0: Instant, p: usize) -> (bench_power::Curve, bench_power::Curve) {
    let mut prefill = Vec::new();
    let (mut done0, mut at0) = (0usize, t0);
    for &(done, at) in &h.prefill_marks {
        let dt = at.duration_since(at0).as_secs_f64();
        if done > done0 && dt > 0.0 {
            prefill.push((done as f64, (done - done0) as f64 / dt));
            (done0, at0) = (done, at);
        }
    }
    let mut decode = Vec::new();
    let t = &h.token_times;
    let step = 16.min(t.len().saturating_sub(1)).max(1);
    let mut i = 0;
    while i + step < t.len() {
        let dt = t[i + step].duration_since(t[i]).as_secs_f64();
        if dt > 0.0 {
            decode.push(((p + i + step) as f64, step as f64 / dt));
        }
        i += step;
    }
    (prefill, decode)
}

/// Runs one trial: prefill the prompt, generate `g` tokens.
fn trial(sched: &mut Scheduler, engine: &mut Engine, prompt: &[u32], g: usize, progress: Duration) -> Result<Trial> {
    trial_curves(sched, engine, prompt, g, progress, DraftChoice::Default).map(|(t, _)| t)
}

/// A trial with speculation (`draft`), and the same without it, in the
/// order `plain_first` says (benchmarks alternate it).
fn spec_trial(
    sched: &mut Scheduler,
    engine: &mut Engine,
    prompt: &[u32],
    g: usize,
    progress: Duration,
    plain_first: bool,
) -> Result<(Trial, (bench_power::Curve, bench_power::Curve))> {
    let plain = |sched: &mut Scheduler, engine: &mut Engine| {
        trial_curves(sched, engine, prompt, g, progress, DraftChoice::Off).map(|(t, _)| t)
    };
    let first = if plain_first { Some(plain(sched, engine)?) } else { None };
    let (mut t, c) = trial_curves(sched, engine, prompt, g, progress, DraftChoice::Default)?;
    let p = match first {
        Some(p) => p,
        None => plain(sched, engine)?,
    };
    t.plain = Some(Box::new(p));
    Ok((t, c))
}

/// `trial`, with its tok/s over depth for the plot. The request goes
/// through the batching scheduler, as `serve` runs it (the paged pool, a
/// pipeline's prompt chunks in flight at once).
fn trial_curves(
    sched: &mut Scheduler,
    engine: &mut Engine,
    prompt: &[u32],
    g: usize,
    progress: Duration,
    draft: DraftChoice,
) -> Result<(Trial, (bench_power::Curve, bench_power::Curve))> {
    let req = GenerateRequest {
        prompt_ids: prompt.to_vec(),
        max_tokens: g,
        sampling: SamplingParams { temperature: 0.0, ..SamplingParams::default() },
        stop_strings: Vec::new(),
        ignore_eos: true,
        want_prompt_logits: false,
        draft,
    };
    let t0 = Instant::now();
    let hooks = BenchHooks::new(progress);
    let (out, hooks) = engine::serving::solo::run_request(sched, engine, req, hooks)?;
    let total_s = t0.elapsed().as_secs_f64();
    let curves = depth_curves(&hooks, t0, prompt.len());
    if out.output_ids.len() != g {
        bail!("generated {} tokens instead of {g}", out.output_ids.len());
    }
    let times = &hooks.token_times;
    let ttft_s = times.first().map_or(total_s, |t| t.duration_since(t0).as_secs_f64());
    // (g − 1) tokens over the time from the first token to the last.
    let decode_s = match (times.first(), times.last()) {
        (Some(a), Some(b)) if times.len() > 1 => b.duration_since(*a).as_secs_f64(),
        _ => 0.0,
    };
    let t = Trial {
        prompt_tps: prompt.len() as f64 / ttft_s.max(1e-9),
        generation_tps: if decode_s > 0.0 { (times.len() - 1) as f64 / decode_s } else { 0.0 },
        ttft_s,
        peak_rss_bytes: peak_rss_bytes(),
        total_s,
        output_ids: out.output_ids,
        drafted: out.drafted,
        accepted: out.accepted,
        plain: None,
    };
    Ok((t, curves))
}

fn mean(xs: impl Iterator<Item = f64>) -> f64 {
    let v: Vec<f64> = xs.collect();
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

pub fn bench(a: BenchArgs) -> Result<()> {
    let threads = a.threads.map_or_else(default_threads, |t| t as usize);
    if !(a.progress_secs.is_finite() && a.progress_secs >= 0.0) {
        bail!("--progress-secs must be a number of seconds, 0 or more (got {})", a.progress_secs);
    }
    let progress = Duration::from_secs_f64(a.progress_secs);
    let (p, g, n) = (a.prompt_tokens as usize, a.generation_tokens as usize, a.num_trials as usize);
    let t_load = Instant::now();
    let Some((mut engine, files, model_name)) = crate::dist_args::load_engine_dist(
        a.model.as_deref(),
        threads,
        a.threads.is_some(),
        None,
        (&a.dist, &a.draft),
    )?
    else {
        return Ok(()); // a rank other than 0 served its part
    };
    let load_s = t_load.elapsed().as_secs_f64();
    engine.prefill_chunk = a.prefill_chunk as usize;
    let ctx = engine.context_length();
    // `--prompt-file` sets the prompt's length instead of -p.
    let prompt = match &a.prompt_file {
        None => random_prompt(p, engine.model.config.vocab_size, a.seed),
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            let tok = engine.tokenizer.as_ref().context("this model has no tokenizer: --prompt-file needs one")?;
            let ids = tok.encode(&text, true)?;
            if ids.is_empty() || ids.len() + g > ctx {
                bail!("--prompt-file gives {} tokens; with -g {g} that must fit the context {ctx}", ids.len());
            }
            ids
        }
    };
    let p = prompt.len();
    if p + g > ctx {
        bail!("-p {p} plus -g {g} is {} tokens, more than the context length {ctx}", p + g);
    }
    let cfg = engine.model.config.clone();
    let cfg = &cfg;
    let vocab = cfg.vocab_size;
    // What the generate loop allocates: K and V for every layer, p + g positions
    // (this process's layers and KV heads: rank 0's share in a cluster).
    let kv_type = engine.model.kv_type;
    let kv_cache_bytes = (engine.model.kv_bytes_per_token() * (p + g)) as u64;
    let weight_bytes_per_token = engine.model.weight_bytes_per_token() as u64;
    let file_bytes = model_file_bytes(&files.path);
    let rss_after_load = peak_rss_bytes();
    // Predicted before any trial runs: what is resident once loaded (weights,
    // tokenizer, runtime), plus the KV cache, plus one prefill chunk's scratch;
    // or loading's own high-water mark (its transient buffers) where that is higher.
    let resident = status_bytes("VmRSS:");
    let ws_bytes = workspace_bytes(cfg, engine.prefill_chunk.min(p));
    let predicted_rss = (resident + kv_cache_bytes + ws_bytes).max(rss_after_load);
    // One sequence's pool, in the server's blocks: every trial runs the
    // server's path (and starts cold: no prefix cache).
    let solo = engine::serving::solo::solo_config(&engine, p + g, crate::serve::KV_BLOCK, engine.prefill_chunk);
    let mut sched = Scheduler::new(&mut engine, solo).context("allocating the KV pool")?;
    let speculate = a.draft.params()?.is_some();
    sched.set_draft(a.draft.params()?)?;
    sched.set_model_draft(a.draft.drafter(&mut engine, threads, 1)?);

    if !a.json {
        println!(
            "model {model_name}: {} layers, hidden {}, vocab {vocab}; {threads} threads; \
             weights read per token {:.3} GiB; loaded in {load_s:.2} s",
            cfg.n_layers,
            cfg.hidden_size,
            gib(weight_bytes_per_token)
        );
        println!("prompt {p} tokens, generation {g} tokens, {n} trials after {} warm-up", a.warmup);
        println!(
            "predicted peak_memory={:.3} GiB (resident after load {:.3} GiB + KV cache {:.3} GiB {} \
             + workspace {:.3} GiB; loading peaked at {:.3} GiB)",
            gib(predicted_rss),
            gib(resident),
            gib(kv_cache_bytes),
            kv_type.name(),
            gib(ws_bytes),
            gib(rss_after_load)
        );
    }
    for w in 0..a.warmup {
        eprintln!("warm-up {}/{} ...", w + 1, a.warmup);
        trial(&mut sched, &mut engine, &prompt, g, progress).context("warm-up trial")?;
    }
    // Power from here on (the warm-up is not in rank 0's figures).
    if let Ok(m) = engine::power::global() {
        m.reset();
    }
    let mut trials = Vec::with_capacity(n);
    let mut curves = (Vec::new(), Vec::new());
    for i in 0..n {
        eprintln!("trial {}/{n} ...", i + 1);
        let (t, c) = match speculate {
            true => spec_trial(&mut sched, &mut engine, &prompt, g, progress, i % 2 == 1),
            false => trial_curves(&mut sched, &mut engine, &prompt, g, progress, DraftChoice::Default),
        }
        .with_context(|| format!("trial {}", i + 1))?;
        curves = c;
        if !a.json {
            println!(
                "Trial {}: prompt_tps={:.3}, generation_tps={:.3}, ttft={:.3} s, peak_memory={:.3} GiB, total={:.3} s",
                i + 1,
                t.prompt_tps,
                t.generation_tps,
                t.ttft_s,
                gib(t.peak_rss_bytes),
                t.total_s
            );
            if let (Some(plain), Some(x)) = (&t.plain, t.speedup()) {
                println!(
                    "  speculative: {} of {} draft tokens accepted ({:.0}%); without: generation_tps={:.3}; \
                     speedup {x:.2}x; identical output: {}",
                    t.accepted,
                    t.drafted,
                    100.0 * crate::draft_args::acceptance(t.drafted, t.accepted),
                    plain.generation_tps,
                    plain.output_ids == t.output_ids
                );
            }
        }
        trials.push(t);
    }
    let avg_prompt = mean(trials.iter().map(|t| t.prompt_tps));
    let avg_gen = mean(trials.iter().map(|t| t.generation_tps));
    let avg_ttft = mean(trials.iter().map(|t| t.ttft_s));
    let avg_rss = mean(trials.iter().map(|t| t.peak_rss_bytes as f64)) as u64;
    let (drafted, accepted) = trials.iter().fold((0, 0), |(d, a), t| (d + t.drafted, a + t.accepted));
    let speculative = speculate.then(|| {
        let mut x: Vec<f64> = trials.iter().filter_map(|t| t.speedup()).collect();
        x.sort_by(f64::total_cmp);
        serde_json::json!({
            "drafted_tokens": drafted,
            "accepted_tokens": accepted,
            "acceptance_rate": crate::draft_args::acceptance(drafted, accepted),
            "plain_generation_tps": mean(trials.iter().filter_map(|t| t.plain.as_ref().map(|p| p.generation_tps))),
            "median_speedup": x.get(x.len() / 2).copied().unwrap_or(0.0),
            "identical_output": trials.iter().all(|t| t.plain.as_ref().is_none_or(|p| p.output_ids == t.output_ids)),
        })
    });
    // Every rank's high-water mark (rank 0 first); one entry in a single process.
    let reports = engine.shutdown()?;
    let power = bench_power::collect(&reports);
    if let Some(path) = &a.plot {
        let title = format!("{model_name}: -p {p} -g {g}, {threads} threads, {} rank(s)", reports.len());
        std::fs::write(path, bench_power::plot_svg(&title, &curves.0, &curves.1, &power))
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("plot written to {}", path.display());
    }
    let per_rank_rss: Vec<u64> = reports.iter().map(|r| r.peak_rss_bytes).collect();
    // Bytes all ranks sent per decoded token (rank 0 takes part in every step).
    let decode_steps = reports[0].decode_steps;
    let wire_per_token = (decode_steps > 0)
        .then(|| reports.iter().map(|r| r.decode_bytes_sent).sum::<u64>() as f64 / decode_steps as f64);
    if a.json {
        let j = serde_json::json!({
            "model": model_name,
            "threads": threads,
            "prompt_tokens": p,
            "generation_tokens": g,
            "prefill_chunk": engine.prefill_chunk,
            "weight_bytes_per_token": weight_bytes_per_token,
            "model_file_bytes": file_bytes,
            "kv_cache_bytes": kv_cache_bytes,
            "kv_type": kv_type.name(),
            "rss_after_load_bytes": rss_after_load,
            "resident_after_load_bytes": resident,
            "workspace_bytes": ws_bytes,
            "predicted_peak_rss_bytes": predicted_rss,
            "load_s": load_s,
            "prompt_ids": prompt,
            "trials": trials.iter().map(|t| t.to_json()).collect::<Vec<_>>(),
            "avg": {
                "prompt_tps": avg_prompt,
                "generation_tps": avg_gen,
                "ttft_s": avg_ttft,
                "peak_rss_bytes": avg_rss,
            },
            "peak_rss_bytes_per_rank": per_rank_rss,
            "decode_wire_bytes_per_token": wire_per_token,
            "decode_wire_bytes_per_token_per_rank": reports
                .iter()
                .map(|r| r.decode_bytes_sent as f64 / decode_steps.max(1) as f64)
                .collect::<Vec<_>>(),
            "power": bench_power::to_json(&power),
            "speculative": speculative,
        });
        println!("{j}");
    } else {
        println!(
            "Averages: prompt_tps={avg_prompt:.3}, generation_tps={avg_gen:.3}, ttft={avg_ttft:.3} s, \
             peak_memory={:.3} GiB (model files {:.3} GiB + {} KV cache {:.3} GiB)",
            gib(avg_rss),
            gib(file_bytes),
            kv_type.name(),
            gib(kv_cache_bytes)
        );
        // The high-water mark of the whole run (the averages hide nothing here:
        // it only grows), against the prediction printed before the trials.
        let peak = trials.iter().map(|t| t.peak_rss_bytes).max().unwrap_or(0);
        println!(
            "Peak memory {:.3} GiB vs predicted {:.3} GiB ({:+.1}%)",
            gib(peak),
            gib(predicted_rss),
            100.0 * (peak as f64 / predicted_rss.max(1) as f64 - 1.0)
        );
        if per_rank_rss.len() > 1 {
            let list: Vec<String> = per_rank_rss.iter().map(|b| format!("{:.3}", gib(*b))).collect();
            println!("Peak memory per rank (GiB): {}", list.join(", "));
        }
        if let (true, Some(w)) = (per_rank_rss.len() > 1, wire_per_token) {
            println!("Decode traffic: {w:.0} bytes sent per token by all ranks together");
        }
        if let Some(s) = &speculative {
            println!(
                "Speculative: acceptance {:.0}%, median speedup {:.2}x over {:.3} tok/s without, identical output: {}",
                100.0 * s["acceptance_rate"].as_f64().unwrap_or(0.0),
                s["median_speedup"].as_f64().unwrap_or(0.0),
                s["plain_generation_tps"].as_f64().unwrap_or(0.0),
                s["identical_output"]
            );
        }
        for line in bench_power::lines(&power) {
            println!("{line}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_is_seeded_and_in_range() {
        let a = random_prompt(1000, 49152, 7);
        assert_eq!(a, random_prompt(1000, 49152, 7));
        assert_ne!(a, random_prompt(1000, 49152, 8));
        assert!(a.iter().all(|&t| (t as usize) < 49152));
        // Spread: both halves of the vocabulary occur.
        assert!(a.iter().any(|&t| t < 24576) && a.iter().any(|&t| t >= 24576));
    }

    #[test]
    fn peak_rss_is_readable_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(peak_rss_bytes() > 0);
        }
    }
}
