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
    /// Where the layers compute: cpu, gpu (the first hardware GPU; a software
    /// one only if it is the only one) or gpu:N (adapter N). One value for
    /// every rank, or one per rank (`--device gpu,cpu`: rank 0 on the GPU,
    /// rank 1 on the CPU). A hostfile's `"device"` reaches its rank as
    /// SHARDLM_DEVICE, which this flag overrides.
    #[arg(long, env = "SHARDLM_DEVICE", value_delimiter = ',', default_value = "cpu", value_parser = model::Device::parse)]
    pub device: Vec<model::Device>,
}

impl DistArgs {
    /// The device of `rank` (rank 0 in one process).
    pub fn device_of(&self, rank: Option<usize>) -> Result<model::Device> {
        let r = rank.unwrap_or(0);
        match self.device.as_slice() {
            [] => Ok(model::Device::Cpu),
            [one] => Ok(*one),
            many => many.get(r).copied().ok_or_else(|| {
                anyhow::anyhow!(
                    "bad flag value: --device names {} devices, one per rank, but this is rank {r}",
                    many.len()
                )
            }),
        }
    }
}

fn parse_kv_type(s: &str) -> Result<model::KvType, String> {
    model::KvType::parse(s).ok_or_else(|| format!("'{s}' is not a KV cache type (f16, q8_0, q4_0 or f32)"))
}

/// Load options from the environment, with `--kv-type` over `SHARDLM_KV_TYPE`.
fn load_options(d: &DistArgs, quantize: Option<kernels::DType>, rank: Option<usize>) -> Result<model::LoadOptions> {
    let env = model::LoadOptions::from_env(quantize);
    let device = d.device_of(rank)?;
    Ok(model::LoadOptions { progress: load_progress(rank), kv_type: d.kv_type.or(env.kv_type), device, ..env })
}

/// Says which GPU a shard landed on, and warns when it is a software one.
fn report_device(m: &model::Model, rank: Option<usize>) {
    let Some(g) = &m.gpu else { return };
    let who = rank.map_or(String::new(), |r| format!("rank {r}: "));
    let a = g.adapter();
    eprintln!("{who}layers on the GPU {a} ({:.1} GB of weights)", g.weight_bytes() as f64 / 1e9);
    if a.software {
        eprintln!(
            "{who}warning: {} is a software GPU (it runs on the CPU): correct, but slower than --device cpu",
            a.name
        );
    }
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
/// any other rank serves steps until rank 0 shuts the world down, then returns `None`
/// (the rank `--draft-rank` names also runs the draft model for rank 0).
pub fn load_engine_dist(
    model: Option<&str>,
    threads: usize,
    explicit_threads: bool,
    quantize: Option<kernels::DType>,
    (d, draft): (&DistArgs, &crate::draft_args::DraftArgs),
) -> Result<Option<(Engine, formats::ModelFiles, String)>> {
    load_engine_dist_with(model, threads, explicit_threads, quantize, (d, draft), &|_| Ok(()))
}

/// `load_engine_dist` with the model's config adjusted before loading (`serve
/// --context --rope-scaling`); every rank applies the same change.
pub fn load_engine_dist_with(
    model: Option<&str>,
    threads: usize,
    explicit_threads: bool,
    quantize: Option<kernels::DType>,
    (d, draft): (&DistArgs, &crate::draft_args::DraftArgs),
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
    if d.device.len() > 1 && d.device.len() != world.size() {
        anyhow::bail!(
            "bad flag value: --device names {} devices, one per rank, for {} ranks",
            d.device.len(),
            world.size()
        );
    }
    if world.size() == 1 {
        let tokenizer = Tokenizer::from_source(&files.tokenizer)?;
        let opts = load_options(d, quantize, None)?;
        let m = model::Model::load(&files, &model::ShardSpec::full(files.config.n_layers), &opts)?;
        report_device(&m, None);
        return Ok(Some((Engine::new(m, tokenizer, threads), files, name)));
    }
    let weights = rank_weights(d, world.size(), std::env::var(crate::reform::ENV_SURVIVORS).ok().as_deref())?;
    // Ranks sharing this host share its cores unless --threads says otherwise.
    let threads = if explicit_threads { threads } else { (threads / ranks_on_this_host().max(1)).max(1) };
    let mut cluster = Cluster::new(world.with_wire(d.wire), strategy, !d.no_prefill_overlap)?;
    cluster.exact_tp = d.tp_exact;
    let block = mlp_block(&files, quantize);
    let opts = load_options(d, quantize, Some(cluster.rank()))?;
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
    report_device(&m, Some(cluster.rank()));
    // Every rank tells rank 0 where it runs and what it holds (`GET /cluster`),
    // and starts sampling its power (`bench` reports it at shutdown).
    let _ = engine::power::global();
    if let Some(all) = engine::rank_info::gather(&cluster, engine::rank_info::RankInfo::here(&m, Some(&cluster)))? {
        engine::rank_info::remember(all);
    }
    if cluster.rank() != 0 {
        let pool = kernels::ThreadPool::new(threads);
        let mut ws = model::Workspace::default();
        let mut drafter = draft.rank_drafter(cluster.rank(), &m, &files, threads);
        let mut runner = StageRunner {
            cluster: &cluster,
            model: &m,
            pool: &pool,
            ws: &mut ws,
            paged: &mut None,
            batch_logits: &mut Vec::new(),
            disk: &mut engine::kv_disk::DiskSlot::for_model(&path),
            draft: &mut drafter,
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
/// `world_env` overrides the world's variables once the cluster re-planned
/// onto fewer ranks ([`replan_onto`]). `/cluster` then lists the new world.
#[allow(clippy::too_many_arguments)] // the load's inputs, and the world's variables
pub fn rejoin_cluster(
    engine: &mut Engine,
    model: Option<&str>,
    threads: usize,
    explicit_threads: bool,
    quantize: Option<kernels::DType>,
    d: &DistArgs,
    adjust: &dyn Fn(&mut formats::ModelConfig) -> Result<()>,
    world_env: &[crate::reform::EnvChange],
) -> Result<()> {
    let strategy = Strategy::parse(&d.strategy, d.tp).map_err(|e| anyhow::anyhow!("bad flag value: {e}"))?;
    let path = model_source::resolve(model)?;
    let mut files = formats::open_model(&path)?;
    adjust(&mut files.config)?;
    // The old transport goes first: its listening port or segment is reused.
    engine.cluster = None;
    let get = |k: &str| world_var(world_env, k);
    let spin_set = get(comm::bootstrap::ENV_SPIN_US).is_some();
    let world = comm::bootstrap::Bootstrap::from_vars(get, fingerprint(&path, &files.config))
        .and_then(|b| b.with_default_spin(rank_spin(threads, explicit_threads), spin_set).connect())
        .context("re-joining the cluster")?;
    let weights = rank_weights(d, world.size(), world_var(world_env, crate::reform::ENV_SURVIVORS).as_deref())?;
    let mut cluster = Cluster::new(world.with_wire(d.wire), strategy, !d.no_prefill_overlap)?;
    cluster.exact_tp = d.tp_exact;
    let opts = load_options(d, quantize, Some(cluster.rank()))?;
    let kv_type = Some(engine.model.kv_type);
    let spec = cluster.shard_spec(&files, &weights, mlp_block(&files, quantize), kv_type)?;
    if spec != engine.model.shard {
        eprintln!("shardlm serve: the re-formed cluster splits the model anew; loading rank 0's new shard");
        engine.model = model::Model::load(&files, &spec, &opts)?;
    }
    // The restarted ranks send their startup report first, as at startup;
    // `/cluster` shows the world as it is now.
    if let Some(all) =
        engine::rank_info::gather(&cluster, engine::rank_info::RankInfo::here(&engine.model, Some(&cluster)))?
    {
        engine::rank_info::remember(all);
    }
    engine.cluster = Some(cluster);
    Ok(())
}

/// A world variable: as `over` (the variables of a re-formed world) sets or
/// removes it, else from our environment.
pub fn world_var(over: &[crate::reform::EnvChange], key: &str) -> Option<String> {
    match over.iter().rev().find(|(k, _)| k == key) {
        Some((_, v)) => v.clone(),
        None => std::env::var(key).ok(),
    }
}

/// One rank that would hold a share of the model in a re-planned world.
#[derive(Debug, Clone, PartialEq)]
pub struct Holder {
    pub host: String,
    /// Bytes of model and KV pool it holds now.
    pub held: u64,
    /// Its share of the model and KV pool after the re-plan (the split's weight).
    pub weight: f64,
    /// `MemAvailable` of its machine, bytes (0: unknown).
    pub available: u64,
}

/// The planner's memory check for a re-plan: `total` bytes (the model's file
/// bytes and the whole KV pool) shared among `holders` by weight must fit on
/// every machine, where what its ranks hold beyond what they hold now must
/// fit in its `MemAvailable` (ranks on one machine share it). Errs with the
/// first machine that cannot.
pub fn replan_fits(holders: &[Holder], total: u64) -> Result<(), String> {
    let sum: f64 = holders.iter().map(|h| h.weight).sum::<f64>().max(f64::MIN_POSITIVE);
    let mut hosts: Vec<&str> = holders.iter().map(|h| h.host.as_str()).collect();
    hosts.sort_unstable();
    hosts.dedup();
    for host in hosts {
        let on: Vec<&Holder> = holders.iter().filter(|h| h.host == host).collect();
        let need: u64 = on.iter().map(|h| ((total as f64 * h.weight / sum) as u64).saturating_sub(h.held)).sum();
        let avail = on.iter().map(|h| h.available).max().unwrap_or(0);
        if need > avail {
            return Err(format!(
                "{host} cannot hold its share: it needs {:.1} GB more, {:.1} GB is available",
                need as f64 / 1e9,
                avail as f64 / 1e9
            ));
        }
    }
    Ok(())
}

/// Rank 0 of a serving cluster whose rank `lost` does not come back, with
/// other survivors: re-plans the model onto all the survivors when their
/// machines can hold it ([`replan_fits`], from each rank's last report to
/// rank 0 and this machine's `MemAvailable` now), tells the supervisor to
/// retire `lost` and restart the others into the smaller world, and sets
/// `world_env` to that world's variables for [`rejoin_cluster`] (which
/// joins it: each survivor loads its new shard). Errs (the cluster stays
/// degraded, and says why) when they cannot, or without a supervisor.
#[allow(clippy::too_many_arguments)] // the load's inputs, as `rejoin_cluster` takes them
pub fn replan_onto(
    model: Option<&str>,
    d: &DistArgs,
    adjust: &dyn Fn(&mut formats::ModelConfig) -> Result<()>,
    pool_bytes: u64,
    world: usize,
    lost: usize,
    world_env: &mut Vec<crate::reform::EnvChange>,
) -> Result<Vec<usize>> {
    let keep: Vec<usize> = (0..world).filter(|&r| r != lost).collect();
    if lost == 0 || lost >= world || keep.len() < 2 {
        anyhow::bail!("rank {lost} is not a rank other than 0 of a world of {world} with other survivors");
    }
    let strategy = Strategy::parse(&d.strategy, d.tp).map_err(|e| anyhow::anyhow!("bad flag value: {e}"))?;
    if let Strategy::Hybrid { tp } | Strategy::Expert { tp: Some(tp) } = strategy {
        if !keep.len().is_multiple_of(tp) {
            anyhow::bail!("--tp {tp} does not divide the {} survivors", keep.len());
        }
    }
    let path = model_source::resolve(model)?;
    let mut files = formats::open_model(&path)?;
    adjust(&mut files.config)?;
    let file_bytes: u64 = files.tensors.tensors.values().map(|t| t.bytes().len() as u64).sum();
    let total = file_bytes + pool_bytes;
    let infos = engine::rank_info::gathered().unwrap_or_default();
    if infos.len() != world {
        anyhow::bail!("rank 0 has reports of {} ranks for a world of {world}", infos.len());
    }
    let weights = rank_weights(d, world, world_var(world_env, crate::reform::ENV_SURVIVORS).as_deref())?;
    let n_layers = files.config.n_layers.max(1) as f64;
    let tp_now = infos.iter().map(|r| r.tp_rank + 1).max().unwrap_or(1) as f64;
    let here = engine::rank_info::hostname();
    let holders: Vec<Holder> = keep
        .iter()
        .map(|&r| {
            let info = &infos[r];
            let share = (info.layers[1] - info.layers[0]) as f64 / n_layers / tp_now;
            let available = if info.host == here { mem_available().unwrap_or(0) } else { info.mem_available_bytes };
            Holder { host: info.host.clone(), held: (total as f64 * share) as u64, weight: weights[r], available }
        })
        .collect();
    replan_fits(&holders, total).map_err(|e| anyhow::anyhow!("the survivors cannot hold the model: {e}"))?;
    let get = |k: &str| world_var(world_env, k);
    let envs = crate::reform::shrunk_env(&get, &keep).map_err(|e| anyhow::anyhow!("re-forming the world: {e}"))?;
    let list: Vec<String> = keep.iter().map(|r| r.to_string()).collect();
    eprintln!(
        "shardlm serve: rank {lost} stays gone; re-planning the model onto the {} survivors (ranks {}), whose machines can hold it",
        keep.len(),
        list.join(", ")
    );
    if !crate::launch_restart::retire(&[lost]) {
        anyhow::bail!(
            "no supervisor to restart the survivors into a smaller world (started by `shardlm launch` or `--ranks`?)"
        );
    }
    world_env.extend(envs[0].iter().cloned());
    Ok(keep)
}

/// Rank 0 of a serving cluster whose lost rank does not come back: re-plans
/// the model onto this machine alone when it can hold it, and tells the
/// supervisor to retire the other ranks. The memory check: the weights this
/// rank does not hold yet (the model's file bytes beyond its shard's share)
/// and the whole model's KV pool (`pool_bytes`, as `--kv-cache-bytes` counts
/// the whole model's) beyond this rank's present pool must fit in
/// `MemAvailable`. Errs (the cluster stays degraded, and says why) when they
/// do not. With other survivors, see [`replan_onto`].
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
    let opts = load_options(d, quantize, None)?;
    engine.model = model::Model::load(&files, &model::ShardSpec::full(files.config.n_layers), &opts)?;
    engine::rank_info::remember(vec![engine::rank_info::RankInfo::here(&engine.model, None)]);
    crate::launch_restart::retire(&(1..world).collect::<Vec<_>>());
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

/// Every rank's weight in a world of `n`; `survivors` (`SHARDLM_SURVIVORS`)
/// picks them when the world was re-formed from a larger one.
fn rank_weights(d: &DistArgs, n: usize, survivors: Option<&str>) -> Result<Vec<f64>> {
    let from_env = std::env::var("SHARDLM_WEIGHTS")
        .ok()
        .map(|s| s.split(',').map(|x| x.trim().parse::<f64>()).collect::<std::result::Result<Vec<f64>, _>>());
    let w = match (&d.weights, from_env) {
        (Some(w), _) => w.clone(),
        (None, Some(Ok(w))) => w,
        (None, Some(Err(e))) => anyhow::bail!("SHARDLM_WEIGHTS: {e}"),
        (None, None) => vec![1.0; n],
    };
    let w = crate::reform::survivor_weights(w, n, survivors);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(host: &str, held: u64, available: u64) -> Holder {
        Holder { host: host.into(), held, weight: 1.0, available }
    }

    #[test]
    fn survivors_on_one_machine_share_its_memory() {
        // 300 bytes over two ranks that hold 100 each: each needs 50 more.
        assert!(replan_fits(&[holder("a", 100, 100), holder("a", 100, 100)], 300).is_ok());
        let err = replan_fits(&[holder("a", 100, 99), holder("a", 100, 99)], 300).unwrap_err();
        assert!(err.contains("a cannot hold its share"), "{err}");
        // On two machines each needs only its own 50.
        assert!(replan_fits(&[holder("a", 100, 50), holder("b", 100, 50)], 300).is_ok());
        assert!(replan_fits(&[holder("a", 100, 50), holder("b", 100, 49)], 300).unwrap_err().starts_with("b "));
    }

    #[test]
    fn a_survivor_that_holds_more_than_its_share_needs_nothing() {
        let heavy = Holder { weight: 1.0, ..holder("a", 250, 0) };
        let light = Holder { weight: 2.0, ..holder("b", 50, 150) };
        assert!(replan_fits(&[heavy, light], 300).is_ok());
    }
}
