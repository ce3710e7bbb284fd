//! `shardlm serve`: the OpenAI, Anthropic and Responses APIs over HTTP. With
//! `--ranks N` rank 0 serves and the other ranks follow it in lockstep.

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use formats::{ModelConfig, RopeScaling};
use std::time::Duration;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum RopeScalingArg {
    Linear,
    Yarn,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// GGUF file, HF directory, or alias (default: smollm2-135m).
    #[arg(long)]
    model: Option<String>,
    /// Address to bind (loopback by default; use 0.0.0.0 to serve the network).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// TCP port to listen on.
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Require this key (`Authorization: Bearer KEY` or `x-api-key: KEY`). Also read
    /// from SHARDLM_API_KEY.
    #[arg(long, env = "SHARDLM_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Requests admitted at once, queued or running; more are answered 429.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..))]
    max_concurrency: u64,
    /// Bytes of KV cache for all requests together, across all ranks (default:
    /// room for twice the context). Requests wait for blocks when it is full.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    kv_cache_bytes: Option<u64>,
    /// Most requests decoded together in one step.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..))]
    max_batch: u64,
    /// Reuse the KV cache of earlier prompts that share a prefix with a new one.
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    prefix_cache: OnOff,
    /// Keep the prefix cache's full KV blocks in this directory too, so they
    /// survive restarts and RAM eviction (each rank uses the same path on its
    /// own host).
    #[arg(long, value_name = "DIR")]
    kv_disk: Option<std::path::PathBuf>,
    /// Bound on each rank's block files under --kv-disk (least recently used
    /// go first).
    #[arg(long, default_value_t = 20 << 30, value_parser = clap::value_parser!(u64).range(1..))]
    kv_disk_bytes: u64,
    /// A lost rank that has not rejoined after this many seconds is given up:
    /// rank 0 re-plans the model onto its own machine when it can hold it
    /// (the others are retired); otherwise it stays degraded and says why.
    #[arg(long, default_value_t = 30)]
    replan_after: u64,
    /// Context length in tokens (default: the model's). Beyond the model's own,
    /// use --rope-scaling.
    #[arg(long, value_parser = clap::value_parser!(u64).range(16..))]
    context: Option<u64>,
    /// Extend the context by rope scaling (as llama.cpp's --rope-scaling).
    #[arg(long, value_enum)]
    rope_scaling: Option<RopeScalingArg>,
    /// Rope scaling factor (default: --context ÷ the model's context).
    #[arg(long)]
    rope_factor: Option<f32>,
    /// The model name `/v1/models` lists and responses carry (default: the model's).
    #[arg(long)]
    served_model_name: Option<String>,
    /// `max_tokens` for requests that give none (default: the room left in the context).
    #[arg(long)]
    max_tokens_default: Option<usize>,
    /// Largest request body in bytes.
    #[arg(long, default_value_t = 16 << 20)]
    max_body_bytes: usize,
    /// Time limit of a non-streamed request, and the longest any request waits
    /// for its next token (a stalled cluster), seconds.
    #[arg(long, default_value_t = 600)]
    request_timeout: u64,
    /// While a lost rank is being replaced, new requests wait in the queue;
    /// once the cluster has been degraded this long, seconds, they are refused
    /// with 503 and `Retry-After`.
    #[arg(long, default_value_t = 30)]
    degraded_wait: u64,
    /// Interval of SSE keep-alive comments while a stream is silent, milliseconds.
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(10..))]
    sse_keepalive_ms: u64,
    /// Worker threads (default: all cores).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1024))]
    threads: Option<u64>,
    /// Prompt tokens per prefill step.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..))]
    prefill_chunk: u64,
    /// Re-encode float weights at load: q8_0 or q4_0.
    #[arg(long, value_parser = parse_quantize)]
    quantize: Option<kernels::DType>,
    /// The default for requests; a request may choose with `"draft"`.
    #[command(flatten)]
    draft: crate::draft_args::DraftArgs,
    #[command(flatten)]
    template: crate::template_args::TemplateArgs,
    #[command(flatten)]
    dist: crate::dist_args::DistArgs,
}

fn parse_quantize(s: &str) -> Result<kernels::DType, String> {
    match kernels::DType::parse(s) {
        Some(d @ (kernels::DType::Q8_0 | kernels::DType::Q4_0)) => Ok(d),
        _ => Err(format!("'{s}' is not a load-time quantization (use q8_0 or q4_0)")),
    }
}

/// Applies --context / --rope-scaling / --rope-factor to the model's config.
fn adjust_context(a: &ServeArgs, cfg: &mut ModelConfig) -> Result<()> {
    let native = cfg.max_position_embeddings;
    let wanted = a.context.map_or(native, |c| c as usize);
    let factor = match (a.rope_factor, a.rope_scaling) {
        (Some(f), _) if !(f.is_finite() && f >= 1.0) => bail!("bad flag value: --rope-factor must be ≥ 1, got {f}"),
        (Some(f), _) => f,
        (None, _) => (wanted as f32 / native as f32).max(1.0),
    };
    match a.rope_scaling {
        None if a.rope_factor.is_some() => bail!("bad flag value: --rope-factor needs --rope-scaling linear|yarn"),
        None => {
            if wanted > native {
                tracing::warn!("--context {wanted} exceeds the model's {native} without --rope-scaling");
            }
        }
        Some(RopeScalingArg::Linear) => cfg.rope_scaling = RopeScaling::Linear { factor },
        Some(RopeScalingArg::Yarn) => {
            cfg.rope_scaling = RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: native,
                beta_fast: 32.0,
                beta_slow: 1.0,
                attention_factor: None,
                mscale: None,
                mscale_all_dim: None,
                truncate: true,
            }
        }
    }
    cfg.max_position_embeddings = wanted;
    Ok(())
}

/// Window blocks (of [`KV_BLOCK`] positions in `window_layers` layers) out
/// of `bytes`: the share one sequence at the full context `ctx` takes, its
/// `per_seq` window blocks beside `ctx` positions of the full layers, so the
/// budget holds as many such sequences in either group.
fn window_share(
    bytes: usize,
    per_seq: usize,
    ctx: usize,
    window_layers: usize,
    full_layers: usize,
    per_layer: usize,
) -> usize {
    let block_bytes = (KV_BLOCK * window_layers * per_layer).max(1) as f64;
    let (win, full) = (per_seq as f64 * block_bytes, (ctx * full_layers * per_layer) as f64);
    (bytes as f64 * win / (win + full) / block_bytes) as usize
}

/// Positions per KV block: the attention kernel's key step, and fine enough
/// that a resent conversation reuses all but its last partial block.
pub(crate) const KV_BLOCK: usize = 32;

/// The KV pool and batch limits from the flags. `--kv-cache-bytes` counts the
/// whole model's KV (every layer, every KV head), so it means the same number
/// of tokens however the model is split.
fn scheduler_config(a: &ServeArgs, engine: &engine::generate::Engine) -> Result<engine::serving::SchedulerConfig> {
    let cfg = &engine.model.config;
    // Whole quantized blocks per K/V row for q8_0/q4_0 (a row is whole heads);
    // latent attention keeps one latent ‖ rope-key row per layer.
    let ty = engine.model.kv_type;
    let per_layer = model::layer_memory::kv_bytes_per_position(&engine.model.spec, cfg.n_kv_heads, cfg.head_dim, ty);
    // Hybrid models: only the attention layers keep KV; the linear-attention
    // layers hold a fixed state per sequence, in slots for every batch row
    // plus as many prefix-cache snapshots, taken off the budget first.
    let la = engine.model.spec.linear_attn.as_ref();
    let kv_layers = la.map_or(cfg.n_layers, |l| l.linear.iter().filter(|&&x| !x).count());
    let prefix_cache = a.prefix_cache == OnOff::On;
    let (max_batch, step) = (a.max_batch as usize, a.prefill_chunk as usize);
    let state_per_seq = la.map_or(0, |l| l.linear.iter().filter(|&&x| x).count() * l.state_shape(l.k_heads).len() * 4);
    let snapshots = if prefix_cache { max_batch } else { 0 };
    let state_bytes = state_per_seq * (max_batch + snapshots);
    // Sliding-window layers: a block group of their own (docs/ARCHITECTURE.md,
    // "Sliding-window layers in the paged pool"), taken off the budget after
    // the states; the rest is full-attention blocks.
    let window = engine.model.max_window();
    let ctx = engine.context_length();
    let windowed = (0..cfg.n_layers).filter(|&l| engine.model.spec.attention(l).window.is_some()).count();
    let rows = |n: usize| engine::serving::windows::window_blocks_for(window, ctx, KV_BLOCK, n, step, prefix_cache);
    let row_bytes = |blocks: usize| blocks * KV_BLOCK * windowed.min(kv_layers) * per_layer;
    let n_window_blocks = match a.kv_cache_bytes {
        _ if rows(1) == 0 => 0,
        // The disk tier keeps full blocks only: windowed layers use them too.
        _ if a.kv_disk.is_some() => 0,
        // Every batch row's window, beside twice the context in full blocks.
        None => rows(max_batch),
        // A budget too small for one row's window: no window group, the
        // windowed layers keep every position in the full blocks.
        Some(b) if (b as usize) < state_bytes + row_bytes(rows(1)) => 0,
        Some(b) => {
            let per_seq = model::window_blocks_per_seq(window.unwrap_or(1), KV_BLOCK, step);
            let (win, full) = (windowed.min(kv_layers), kv_layers - windowed.min(kv_layers));
            window_share(b as usize - state_bytes, per_seq, ctx, win, full, per_layer).clamp(rows(1), rows(max_batch))
        }
    };
    let window_layers = if n_window_blocks > 0 { windowed.min(kv_layers) } else { 0 };
    let full_layers = kv_layers - window_layers;
    let per_token = (full_layers * per_layer).max(1);
    let window_bytes = row_bytes(n_window_blocks);
    let tokens = match a.kv_cache_bytes {
        Some(b) if (b as usize) < state_bytes + window_bytes => anyhow::bail!(
            "--kv-cache-bytes {b} cannot hold the recurrent states: {} slots of {state_per_seq} bytes \
             ({} batch rows and {snapshots} prefix snapshots) take {state_bytes}",
            a.max_batch as usize + snapshots,
            a.max_batch
        ),
        // Every layer windowed: the full blocks hold no bytes, only positions.
        _ if full_layers == 0 => max_batch * engine.context_length(),
        Some(b) => (b as usize - state_bytes - window_bytes) / per_token,
        None => 2 * engine.context_length(),
    };
    if state_bytes > 0 {
        eprintln!(
            "shardlm serve: recurrent state {:.1} MiB per sequence, {:.1} MiB in all ({snapshots} prefix snapshots)",
            state_per_seq as f64 / (1 << 20) as f64,
            state_bytes as f64 / (1 << 20) as f64
        );
    }
    let n_blocks = tokens / KV_BLOCK;
    if n_blocks == 0 {
        anyhow::bail!(
            "--kv-cache-bytes {} holds no KV block: one block of {KV_BLOCK} tokens takes {} bytes",
            a.kv_cache_bytes.unwrap_or(0),
            per_token * KV_BLOCK
        );
    }
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    let full_bytes = n_blocks * KV_BLOCK * full_layers * per_layer;
    eprintln!(
        "shardlm serve: KV pool of {n_blocks} blocks × {KV_BLOCK} tokens ({:.1} MiB in all), batches of up to {}",
        mib(full_bytes + window_bytes),
        a.max_batch
    );
    if n_window_blocks > 0 {
        let per_seq = model::window_blocks_per_seq(window.unwrap_or(0), KV_BLOCK, step);
        eprintln!(
            "shardlm serve: {window_layers} sliding-window layers (window {}) keep their own {n_window_blocks} blocks \
             ({:.1} MiB, windows of {} long sequences at a time; the {full_layers} full layers {:.1} MiB): \
             a sequence at {ctx} tokens holds {:.1} MiB of KV (every position in every layer: {:.1} MiB)",
            window.unwrap_or(0),
            mib(window_bytes),
            (n_window_blocks / per_seq).min(max_batch),
            mib(full_bytes),
            mib(ctx * full_layers * per_layer + per_seq * KV_BLOCK * window_layers * per_layer),
            mib(ctx * kv_layers * per_layer)
        );
    }
    Ok(engine::serving::SchedulerConfig {
        block: KV_BLOCK,
        n_blocks,
        max_batch,
        step_tokens: step,
        prefix_cache,
        n_window_blocks,
    })
}

/// Fixes glibc's mmap threshold at 1 MiB (unless `MALLOC_MMAP_THRESHOLD_`
/// sets it): large blocks, the KV pool's above all, are then always mapped
/// afresh and given back when freed. Left dynamic, glibc raises the threshold
/// to the size of the largest mapped block freed, so the pool that re-forming
/// a cluster allocates again came from the heap, zeroed page by page, while
/// the old one's pages stayed resident: rank 0's RSS grew 3.6× over five
/// re-forms (SmolLM2, pipeline 2), against 4% over six with the fixed threshold.
fn fix_mmap_threshold() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
        // SAFETY: mallopt only changes the allocator's tuning; called before the model loads.
        unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20) };
    }
}

/// Gives the heap's free pages back to the system after a re-forming.
/// Re-joining opens the model files again (GGUF metadata, the tokenizer's
/// vocabulary and merges: a few MB in small blocks) while every request is
/// requeued; those blocks are freed, but among ones that live on, so glibc
/// cannot shrink the heap from its top and keeps the freed pages resident.
/// Under load (16 streams, rank 1 killed every 40 s) rank 0's main heap grew
/// 47.8 → 52.9 MB over five re-forms, while `malloc_stats` showed its bytes
/// in use flat (51.5 → 51.7 MB) and everything else in `smaps` (KV pool,
/// weights, shm) flat: freed, not leaked. With this, 49.5 → 50.9 MB.
/// `malloc_trim(0)` releases free pages anywhere in every arena
/// (`MADV_DONTNEED`), once per re-forming. The arenas are not the cause (the
/// two tokio workers' hold about 1 MB each), so their number is left alone.
fn release_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory to the system; no block in use moves.
    unsafe {
        libc::malloc_trim(0);
    }
}

pub fn serve(a: ServeArgs) -> Result<()> {
    fix_mmap_threshold();
    let template = a.template.read()?;
    let draft = a.draft.params()?;
    let threads = a.threads.map_or_else(crate::run::default_threads, |t| t as usize);
    let loaded = crate::dist_args::load_engine_dist_with(
        a.model.as_deref(),
        threads,
        a.threads.is_some(),
        a.quantize,
        (&a.dist, &a.draft),
        &|cfg| adjust_context(&a, cfg),
    )?;
    let Some((mut engine, mut files, model_name)) = loaded else {
        return Ok(()); // a rank other than 0 followed rank 0 until shutdown
    };
    if template.is_some() {
        files.chat_template = template;
    }
    engine.prefill_chunk = a.prefill_chunk as usize;
    let sched = scheduler_config(&a, &engine)?;
    // One slot of draft KV per sequence the scheduler runs at once.
    let drafter = a.draft.drafter(&mut engine, threads, sched.max_batch)?;
    let served = a.served_model_name.clone().unwrap_or_else(|| {
        std::path::Path::new(&model_name).file_stem().map_or(model_name.clone(), |s| s.to_string_lossy().into_owned())
    });
    let ranks = engine.cluster.as_ref().map_or(1, |c| c.world.size());
    let cfg = server::ServerConfig {
        host: a.host.clone(),
        port: a.port,
        api_key: a.api_key.clone().filter(|k| !k.is_empty()),
        served_model_name: served,
        max_tokens_default: a.max_tokens_default,
        max_concurrency: a.max_concurrency as usize,
        context: engine.context_length(),
        body_limit: a.max_body_bytes,
        request_timeout: Duration::from_secs(a.request_timeout),
        degraded_wait: Duration::from_secs(a.degraded_wait),
        sse_keepalive: Duration::from_millis(a.sse_keepalive_ms),
        ranks,
        strategy: if ranks > 1 { a.dist.strategy.clone() } else { "single".into() },
        prefix_cache: a.prefix_cache == OnOff::On,
        kv_cache_bytes: a.kv_cache_bytes,
        tool_format: a.template.tool_format,
        kv_disk: a.kv_disk.clone().map(|dir| engine::kv_disk::KvDiskConfig { dir, max_bytes: a.kv_disk_bytes }),
        draft,
    };
    if a.kv_disk.is_some() {
        if a.prefix_cache == OnOff::Off {
            bail!("bad flag value: --kv-disk needs --prefix-cache on");
        }
        engine.disk.model_path = Some(files.path.clone());
    }
    // A cluster re-forms after losing a rank (the launcher restarts it);
    // MPI worlds are fixed by mpirun and cannot.
    let replan_after = Duration::from_secs(a.replan_after);
    let whole_pool = (sched.n_blocks * sched.block) as u64
        * model::layer_memory::kv_bytes_per_position(
            &engine.model.spec,
            engine.model.config.n_kv_heads,
            engine.model.config.head_dim,
            engine.model.kv_type,
        ) as u64
        * engine.model.config.n_layers as u64;
    let stages = engine.cluster.as_ref().map_or(1, |c| c.stages);
    let reform: Option<server::Reform<'_>> = (ranks > 1 && !crate::dist_args::launched_by_mpi()).then(|| {
        let mut lost_since: Option<std::time::Instant> = None;
        let mut replan_refused = false;
        // The world as it is now: smaller, with variables of its own, once
        // re-planned onto the survivors of a lost rank.
        let (mut world, mut stages) = (ranks, stages);
        let mut world_env: Vec<crate::reform::EnvChange> = Vec::new();
        Box::new(move |engine: &mut engine::generate::Engine, cause: Option<&str>| {
            if cause.is_some() {
                lost_since = Some(std::time::Instant::now());
                replan_refused = false;
            }
            // A hung rank never exits: the supervisor must kill it before it restarts it.
            cause.into_iter().for_each(crate::launch_restart::report_hung);
            let adjust = |cfg: &mut ModelConfig| adjust_context(&a, cfg);
            let rejoin = |engine: &mut engine::generate::Engine, env: &[crate::reform::EnvChange]| {
                crate::dist_args::rejoin_cluster(
                    engine,
                    a.model.as_deref(),
                    threads,
                    a.threads.is_some(),
                    a.quantize,
                    &a.dist,
                    &adjust,
                    env,
                )
                .map_err(|e| format!("{e:#}"))
            };
            let rejoined = rejoin(engine, &world_env);
            // A rank that stays gone: re-plan onto the survivors if they can
            // hold the model (onto this machine alone when it is the only one).
            let overdue = lost_since.is_some_and(|t| t.elapsed() >= replan_after);
            let lost = rejoined.as_ref().err().and_then(|e| crate::reform::blamed_rank(e)).filter(|&r| r > 0 && r < world);
            let result = match (rejoined, lost) {
                (Err(e), Some(lost)) if overdue && !replan_refused && world > 2 => {
                    match crate::dist_args::replan_onto(
                        a.model.as_deref(),
                        &a.dist,
                        &adjust,
                        whole_pool,
                        world,
                        lost,
                        &mut world_env,
                    ) {
                        Ok(_) => {
                            // The smaller world gets its own time to form.
                            lost_since = Some(std::time::Instant::now());
                            rejoin(engine, &world_env)
                        }
                        Err(why) => {
                            replan_refused = true;
                            eprintln!("shardlm serve: cannot re-plan without rank {lost} ({why:#}); staying degraded");
                            Err(format!("{e}; and {why:#}"))
                        }
                    }
                }
                (Err(e), _) if overdue && !replan_refused => {
                    match crate::dist_args::replan_alone(
                        engine,
                        a.model.as_deref(),
                        a.quantize,
                        &a.dist,
                        &adjust,
                        whole_pool,
                        world,
                        stages,
                    ) {
                        Ok(()) => {
                            eprintln!(
                                "shardlm serve: the lost rank did not come back in {} s; re-planned the model onto this \
                                 machine alone",
                                replan_after.as_secs()
                            );
                            Ok(())
                        }
                        Err(why) => {
                            replan_refused = true;
                            eprintln!("shardlm serve: cannot re-plan without the lost rank ({why:#}); staying degraded");
                            Err(format!("{e}; and {why:#}"))
                        }
                    }
                }
                (other, _) => other,
            };
            if result.is_ok() {
                world = engine.cluster.as_ref().map_or(1, |c| c.world.size());
                stages = engine.cluster.as_ref().map_or(1, |c| c.stages);
            }
            release_freed_heap();
            result
        }) as server::Reform<'_>
    });
    let result = server::serve(&mut engine, &files, cfg, (sched, drafter), reform);
    // On SIGTERM from `launch` the other ranks get the signal too and may be gone
    // before rank 0 says goodbye: that is a normal stop, not a failure.
    if let Err(e) = engine.shutdown() {
        eprintln!("shardlm serve: stopping the other ranks: {e}");
    }
    result?;
    Ok(())
}
