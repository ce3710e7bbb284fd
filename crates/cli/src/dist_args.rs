//! Flags shared by `run`, `bench` and `serve` for distributed runs, and loading
//! this rank's shard. With `--ranks N` (and no rank environment yet) the command
//! relaunches itself as N local ranks; each rank then joins the world from the
//! `SHARDLM_*` environment the launcher sets.

use crate::launch::{relaunch_with_ranks, Backend};
use crate::model_source;
use crate::progress::load_progress;
use anyhow::{Context, Result};
use clap::Args;
use engine::dist::{fingerprint, Cluster, StageRunner, Strategy};
use engine::generate::Engine;
use engine::Tokenizer;
use std::time::Duration;

#[derive(Args, Debug, Clone)]
pub struct DistArgs {
    /// Run as N ranks on this machine (shorthand for `shardlm launch --local N -- …`).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub ranks: Option<u64>,
    /// How to split the model: pipeline (by depth), tensor (by width), expert
    /// (whole MoE experts per rank) or hybrid.
    #[arg(long, default_value = "pipeline")]
    pub strategy: String,
    /// Group size for --strategy hybrid (tensor-parallel groups) or expert
    /// (expert-parallel groups, one per pipeline stage).
    #[arg(long)]
    pub tp: Option<usize>,
    /// Transport between ranks: auto (shm on one host, else tcp), tcp or shm.
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    pub backend: Backend,
    /// TCP connections per peer; large messages are striped across them
    /// (default: one per cable in common, see SHARDLM_LINKS; 1 on one machine).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=16))]
    pub connections_per_peer: Option<u64>,
    /// Relative weight of each rank (e.g. usable memory) for layer and width splits.
    #[arg(long, value_delimiter = ',')]
    pub weights: Option<Vec<f64>>,
    /// Send prompt chunks one at a time through the pipeline (no stage overlap).
    #[arg(long)]
    pub no_prefill_overlap: bool,
    /// Activation encoding on the wire for all-reduces: f32 (exact) or q8 (int8 with
    /// an f16 scale per 32 values, about 4× fewer bytes).
    #[arg(long, default_value = "f32", value_parser = parse_wire)]
    pub wire: comm::Wire,
    /// Tensor parallelism that gives bit-identical results to one process (o and
    /// down split by output rows after all-gathering their inputs; 4 all-gathers
    /// per layer instead of 2 all-reduces).
    #[arg(long)]
    pub tp_exact: bool,
    /// Let ranks other than 0 print.
    #[arg(long)]
    pub verbose: bool,
    /// KV cache type: f16, q8_0 or q4_0 (GGUF blocks of 32 with an f16 scale, as
    /// llama.cpp's --cache-type-k/v), or f32. Default: f32 for float checkpoints,
    /// f16 otherwise (or SHARDLM_KV_TYPE).
    #[arg(long, value_parser = parse_kv_type)]
    pub kv_type: Option<model::KvType>,
}

fn parse_kv_type(s: &str) -> Result<model::KvType, String> {
    model::KvType::parse(s).ok_or_else(|| format!("'{s}' is not a KV cache type (f16, q8_0, q4_0 or f32)"))
}

/// Load options from the environment, with `--kv-type` over `SHARDLM_KV_TYPE`.
fn load_options(d: &DistArgs, quantize: Option<kernels::DType>, rank: Option<usize>) -> model::LoadOptions {
    let env = model::LoadOptions::from_env(quantize);
    model::LoadOptions { progress: load_progress(rank), kv_type: d.kv_type.or(env.kv_type), ..env }
}

fn parse_wire(s: &str) -> Result<comm::Wire, String> {
    match s {
        "f32" => Ok(comm::Wire::F32),
        "q8" => Ok(comm::Wire::Q8),
        _ => Err(format!("'{s}' is not a wire encoding (f32 or q8)")),
    }
}

/// If `--ranks N` asks for a world that doesn't exist yet, starts it and exits
/// with its status. Returns otherwise.
pub fn relaunch_if_asked(d: &DistArgs) -> Result<()> {
    if let Some(n) = d.ranks {
        if std::env::var_os(comm::bootstrap::ENV_SIZE).is_none() && n > 1 {
            let conns = d.connections_per_peer.unwrap_or(0) as usize;
            let code = relaunch_with_ranks(n as usize, d.backend, conns, d.verbose)?;
            let _ = std::io::Write::flush(&mut std::io::stdout());
            std::process::exit(code);
        }
    }
    Ok(())
}

/// Loads this rank's shard. Rank 0 (or a single process) gets its engine back;
/// any other rank serves steps until rank 0 shuts the world down, then returns `None`.
pub fn load_engine_dist(
    model: Option<&str>,
    threads: usize,
    explicit_threads: bool,
    quantize: Option<kernels::DType>,
    d: &DistArgs,
) -> Result<Option<(Engine, formats::ModelFiles, String)>> {
    load_engine_dist_with(model, threads, explicit_threads, quantize, d, &|_| Ok(()))
}

/// `load_engine_dist` with the model's config adjusted before loading (`serve
/// --context --rope-scaling`); every rank applies the same change.
pub fn load_engine_dist_with(
    model: Option<&str>,
    threads: usize,
    explicit_threads: bool,
    quantize: Option<kernels::DType>,
    d: &DistArgs,
    adjust: &dyn Fn(&mut formats::ModelConfig) -> Result<()>,
) -> Result<Option<(Engine, formats::ModelFiles, String)>> {
    let strategy = Strategy::parse(&d.strategy, d.tp).map_err(|e| anyhow::anyhow!("bad flag value: {e}"))?;
    // Before any rank exists: an alias is fetched here, once, not by every rank.
    let path = model_source::resolve(model)?;
    relaunch_if_asked(d)?;
    let mut files = formats::open_model(&path)?;
    adjust(&mut files.config)?;
    let name = model.unwrap_or(model_source::DEFAULT_MODEL).to_string();
    let world = comm::Group::from_env_spinning(fingerprint(&path, &files.config), rank_spin(threads, explicit_threads))
        .context("joining the cluster")?;
    if d.verbose {
        for line in world.transport().cable_report() {
            eprintln!("rank {}: {line}", world.rank());
        }
    }
    if world.size() == 1 {
        let tokenizer = Tokenizer::from_source(&files.tokenizer)?;
        let opts = load_options(d, quantize, None);
        let m = model::Model::load(&files, &model::ShardSpec::full(files.config.n_layers), &opts)?;
        return Ok(Some((Engine::new(m, tokenizer, threads), files, name)));
    }
    let weights = rank_weights(d, world.size())?;
    // Ranks sharing this host share its cores unless --threads says otherwise.
    let threads = if explicit_threads { threads } else { (threads / ranks_on_this_host().max(1)).max(1) };
    let mut cluster = Cluster::new(world.with_wire(d.wire), strategy, !d.no_prefill_overlap)?;
    cluster.exact_tp = d.tp_exact;
    let block = mlp_block(&files, quantize);
    let opts = load_options(d, quantize, Some(cluster.rank()));
    // The KV type the model will use (model::Model::load's rule: float
    // checkpoints keep an f32 cache), so the split counts its bytes.
    let float_ckpt = quantize.is_none()
        && files
            .tensors
            .get("model.layers.0.self_attn.q_proj.weight")
            .is_ok_and(|t| matches!(t.dtype, kernels::DType::F32 | kernels::DType::F16 | kernels::DType::BF16));
    let kv_type = opts.kv_type.or(float_ckpt.then_some(model::KvType::F32));
    let spec = cluster.shard_spec(&files, &weights, block, kv_type)?;
    let m = model::Model::load(&files, &spec, &opts)?;
    // Every rank tells rank 0 where it runs and what it holds (`GET /cluster`),
    // and starts sampling its power (`bench` reports it at shutdown).
    let _ = engine::power::global();
    if let Some(all) = engine::rank_info::gather(&cluster, engine::rank_info::RankInfo::here(&m, Some(&cluster)))? {
        engine::rank_info::remember(all);
    }
    if cluster.rank() != 0 {
        let pool = kernels::ThreadPool::new(threads);
        let mut ws = model::Workspace::default();
        let mut runner = StageRunner {
            cluster: &cluster,
            model: &m,
            pool: &pool,
            ws: &mut ws,
            paged: &mut None,
            batch_logits: &mut Vec::new(),
            disk: &mut engine::kv_disk::DiskSlot::for_model(&path),
        };
        runner.serve()?;
        return Ok(None);
    }
    let tokenizer = Tokenizer::from_source(&files.tokenizer)?;
    let mut engine = Engine::new(m, tokenizer, threads);
    engine.cluster = Some(cluster);
    Ok(Some((engine, files, name)))
}

/// Rank 0 of a serving cluster that lost a rank: drops the broken cluster,
/// joins the world again from the same environment (the supervisor has
/// restarted the lost rank, which loads its shard again), and gives `engine`
/// the new cluster. Rank 0 keeps its loaded shard when the split comes out the
/// same (the same world and weights always give the same split); otherwise it
/// loads its new one. The caller re-allocates the KV pool on every rank.
pub fn rejoin_cluster(
    engine: &mut Engine,
    model: Option<&str>,
    threads: usize,
    explicit_threads: bool,
    quantize: Option<kernels::DType>,
    d: &DistArgs,
    adjust: &dyn Fn(&mut formats::ModelConfig) -> Result<()>,
) -> Result<()> {
    let strategy = Strategy::parse(&d.strategy, d.tp).map_err(|e| anyhow::anyhow!("bad flag value: {e}"))?;
    let path = model_source::resolve(model)?;
    let mut files = formats::open_model(&path)?;
    adjust(&mut files.config)?;
    // The old transport goes first: its listening port or segment is reused.
    engine.cluster = None;
    let world = comm::Group::from_env_spinning(fingerprint(&path, &files.config), rank_spin(threads, explicit_threads))
        .context("re-joining the cluster")?;
    let weights = rank_weights(d, world.size())?;
    let mut cluster = Cluster::new(world.with_wire(d.wire), strategy, !d.no_prefill_overlap)?;
    cluster.exact_tp = d.tp_exact;
    let opts = load_options(d, quantize, Some(cluster.rank()));
    let kv_type = Some(engine.model.kv_type);
    let spec = cluster.shard_spec(&files, &weights, mlp_block(&files, quantize), kv_type)?;
    if spec != engine.model.shard {
        eprintln!("shardlm serve: the re-formed cluster splits the model anew; loading rank 0's new shard");
        engine.model = model::Model::load(&files, &spec, &opts)?;
    }
    // The restarted ranks send their startup report first, as at startup.
    engine::rank_info::gather(&cluster, engine::rank_info::RankInfo::here(&engine.model, Some(&cluster)))?;
    engine.cluster = Some(cluster);
    Ok(())
}

/// Rank 0 of a serving cluster whose lost rank does not come back: re-plans
/// the model onto this machine alone when it can hold it, and tells the
/// supervisor to retire the other ranks. The memory check: the weights this
/// rank does not hold yet (the model's file bytes beyond its shard's share)
/// and the whole model's KV pool (`pool_bytes`, as `--kv-cache-bytes` counts
/// the whole model's) beyond this rank's present pool must fit in
/// `MemAvailable`. Errs (the cluster stays degraded, and says why) when they
/// do not. Re-forming a smaller world among several survivors is not done.
#[allow(clippy::too_many_arguments)] // the load's inputs, as `rejoin_cluster` takes them
pub fn replan_alone(
    engine: &mut Engine,
    model: Option<&str>,
    quantize: Option<kernels::DType>,
    d: &DistArgs,
    adjust: &dyn Fn(&mut formats::ModelConfig) -> Result<()>,
    pool_bytes: u64,
    world: usize,
    stages: usize,
) -> Result<()> {
    let path = model_source::resolve(model)?;
    let mut files = formats::open_model(&path)?;
    adjust(&mut files.config)?;
    let file_bytes: u64 = files.tensors.tensors.values().map(|t| t.bytes().len() as u64).sum();
    // (The failed re-join already dropped the cluster: its shape comes from the caller.)
    let layers = engine.model.shard.layers.len() as f64 / files.config.n_layers.max(1) as f64;
    let tp = (world / stages.max(1)).max(1) as f64;
    let held = (file_bytes as f64 * layers / tp) as u64;
    let have_pool = engine.pool_bytes().unwrap_or(0) as u64;
    let need = file_bytes.saturating_sub(held) + pool_bytes.saturating_sub(have_pool);
    let avail = mem_available().unwrap_or(0);
    if need > avail {
        anyhow::bail!(
            "this machine alone cannot hold the model: it needs {:.1} GB more, {:.1} GB is available",
            need as f64 / 1e9,
            avail as f64 / 1e9
        );
    }
    engine.cluster = None;
    let opts = load_options(d, quantize, None);
    engine.model = model::Model::load(&files, &model::ShardSpec::full(files.config.n_layers), &opts)?;
    (1..world).for_each(crate::launch_restart::retire);
    Ok(())
}

/// `MemAvailable` from /proc/meminfo, bytes.
fn mem_available() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

/// How long a rank's transport spins before it parks. Ranks that each have
/// cores of their own (ranks here × threads each ≤ cores) wait for their peers
/// spinning, 10 ms, rather than parking after 200 µs: a pipeline stage waits a
/// whole stage every token, and a parked core wakes slow (2-stage SmolLM2
/// decode 4% faster on a 2-core VM). Oversubscribed hosts keep the short spin.
pub fn rank_spin(threads: usize, explicit_threads: bool) -> Duration {
    let here = ranks_on_this_host().max(1);
    let each = if explicit_threads { threads } else { (threads / here).max(1) };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if here * each <= cores {
        Duration::from_millis(10)
    } else {
        Duration::from_micros(200)
    }
}

/// How many ranks of the world run on this machine (from the launcher's environment).
fn ranks_on_this_host() -> usize {
    let size: usize = std::env::var(comm::bootstrap::ENV_SIZE).ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    if std::env::var_os(comm::bootstrap::ENV_SHM).is_some() {
        return size;
    }
    let rank: usize = std::env::var(comm::bootstrap::ENV_RANK).ok().and_then(|s| s.parse().ok()).unwrap_or(0);
    let peers = std::env::var(comm::bootstrap::ENV_PEERS).unwrap_or_default();
    let hosts: Vec<&str> = peers.split(',').map(|p| p.rsplit_once(':').map_or(p, |(h, _)| h)).collect();
    match hosts.get(rank) {
        Some(me) => hosts.iter().filter(|h| h == &me).count(),
        None => 1,
    }
}

fn rank_weights(d: &DistArgs, n: usize) -> Result<Vec<f64>> {
    let from_env = std::env::var("SHARDLM_WEIGHTS")
        .ok()
        .map(|s| s.split(',').map(|x| x.trim().parse::<f64>()).collect::<std::result::Result<Vec<f64>, _>>());
    let w = match (&d.weights, from_env) {
        (Some(w), _) => w.clone(),
        (None, Some(Ok(w))) => w,
        (None, Some(Err(e))) => anyhow::bail!("SHARDLM_WEIGHTS: {e}"),
        (None, None) => vec![1.0; n],
    };
    if w.len() != n || w.iter().any(|x| !x.is_finite() || *x <= 0.0) {
        anyhow::bail!("bad flag value: --weights needs {n} positive numbers, got {w:?}");
    }
    Ok(w)
}

/// MLP columns are split in whole blocks of the down projection's storage type.
/// The quant block the intermediate widths are cut in: the coarsest of every
/// down projection's (dense MLPs, routed and shared experts: `down_proj`, or
/// mixtral's `w2`, gpt-oss's stacked `experts.down_proj`), whose input
/// columns tensor parallelism splits.
pub(crate) fn mlp_block(files: &formats::ModelFiles, quantize: Option<kernels::DType>) -> usize {
    let stored = files
        .tensors
        .tensors
        .iter()
        .filter(|(name, _)| {
            name.ends_with("down_proj.weight") || name.ends_with(".w2.weight") || name.ends_with("experts.down_proj")
        })
        .map(|(_, t)| t.dtype.block_elems())
        .max()
        .unwrap_or(1);
    stored.max(quantize.map_or(1, |q| q.block_elems()))
}

pub use engine::dist::peak_rss_bytes;

/// With `SHARDLM_REPORT_RSS=1`, each rank prints its peak RSS on stderr at exit
/// (used by the memory test; other ranks' stderr shows with `--verbose`).
pub fn report_rss() {
    if std::env::var_os("SHARDLM_REPORT_RSS").is_some() {
        let rank = std::env::var(comm::bootstrap::ENV_RANK).unwrap_or_else(|_| "0".into());
        eprintln!("rank {rank} peak_rss_bytes {}", peak_rss_bytes().unwrap_or(0));
    }
}

/// Whether this process was started by an MPI launcher (its world cannot be
/// re-formed by us).
pub fn launched_by_mpi() -> bool {
    std::env::var_os(comm::bootstrap::ENV_SIZE).is_none()
        && ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"].iter().any(|v| std::env::var_os(v).is_some())
}
