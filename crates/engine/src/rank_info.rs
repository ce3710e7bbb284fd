//! What each rank tells rank 0 once, at startup, for `GET /cluster`: its host,
//! its place in the split, the layers and memory it holds, its links as the
//! transport measured them, and whether it can read its power.
//!
//! Sent right after every rank has loaded its shard: each rank `r > 0` sends
//! an 8-byte little-endian length then that many bytes of JSON to rank 0,
//! which receives them in rank order ([`gather`]).

use crate::dist::{comm_err, Cluster};
use crate::EngineError;
use serde::{Deserialize, Serialize};

/// One measured connection of a link.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CableInfo {
    pub local: String,
    pub remote: String,
    /// Fastest round trip measured when connecting, µs (`None`: not measured).
    pub rtt_us: Option<f64>,
    /// Throughput measured with every cable busy, bytes/s (`None`: not measured).
    pub send_bytes_per_s: Option<f64>,
    pub recv_bytes_per_s: Option<f64>,
}

/// This rank's link to one peer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LinkInfo {
    pub peer: usize,
    /// "tcp", "shm", "mpi" or "local".
    pub transport: String,
    pub cables: Vec<CableInfo>,
}

/// One rank, as it describes itself at startup.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RankInfo {
    pub rank: usize,
    pub host: String,
    pub pid: u32,
    /// Pipeline stage (0 holds the head) and tensor rank in its stage.
    pub stage: usize,
    pub tp_rank: usize,
    /// Decoder layers held, `[start, end)`.
    pub layers: [usize; 2],
    pub has_embed: bool,
    pub has_head: bool,
    /// Routed experts held whole, `[start, end)` (expert parallelism only).
    pub experts: Option<[usize; 2]>,
    /// Bytes of the weights this rank holds (matmul weights and head; the
    /// embedding table is a lookup and not counted).
    pub weight_bytes: u64,
    /// KV cache bytes one position takes in this rank's layers.
    pub kv_bytes_per_token: u64,
    /// The part of `kv_bytes_per_token` in sliding-window layers (kept in the
    /// pool's window blocks when it has a window group).
    #[serde(default)]
    pub window_kv_bytes_per_token: u64,
    /// Resident memory after loading, bytes.
    pub rss_bytes: u64,
    /// The machine's memory (`MemTotal`), bytes; 0 where unknown.
    pub mem_total_bytes: u64,
    /// The machine's `MemAvailable` after loading, bytes; 0 where unknown
    /// (re-planning onto the survivors of a lost rank checks it).
    #[serde(default)]
    pub mem_available_bytes: u64,
    pub links: Vec<LinkInfo>,
    /// The power sources this rank reads, or why it reads none.
    pub power: Result<Vec<String>, String>,
}

/// This machine's name (`/proc/sys/kernel/hostname`, `HOSTNAME`, else "?").
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "?".into())
}

fn meminfo_bytes(field: &str) -> u64 {
    let Ok(s) = std::fs::read_to_string("/proc/meminfo") else { return 0 };
    s.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn rss_bytes() -> u64 {
    let Ok(s) = std::fs::read_to_string("/proc/self/status") else { return 0 };
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// The links of `world` as its transport knows them.
pub fn links_of(world: &comm::Group) -> Vec<LinkInfo> {
    let t = world.transport();
    let opt = |x: f64| (x > 0.0).then_some(x);
    (0..world.size())
        .filter(|&p| p != world.rank() && t.connected(p))
        .map(|peer| LinkInfo {
            peer,
            transport: t.kind().to_string(),
            cables: t
                .link_stats(peer)
                .into_iter()
                .map(|c| CableInfo {
                    local: c.local,
                    remote: c.remote,
                    rtt_us: opt(c.rtt_us),
                    send_bytes_per_s: opt(c.send_bps),
                    recv_bytes_per_s: opt(c.recv_bps),
                })
                .collect(),
        })
        .collect()
}

impl RankInfo {
    /// This process, holding `model` (the whole model when `cluster` is `None`).
    pub fn here(model: &model::Model, cluster: Option<&Cluster>) -> RankInfo {
        let shard = &model.shard;
        let power = crate::power::global().map(|m| m.sources.clone()).map_err(|e| e.to_string());
        RankInfo {
            rank: cluster.map_or(0, |c| c.rank()),
            host: hostname(),
            pid: std::process::id(),
            stage: cluster.map_or(0, |c| c.stage),
            tp_rank: cluster.map_or(0, |c| c.tp_rank),
            layers: [shard.layers.start, shard.layers.end],
            has_embed: shard.has_embed,
            has_head: shard.has_head,
            experts: shard.tp.as_ref().and_then(|t| t.experts.as_ref()).map(|e| [e.start, e.end]),
            weight_bytes: model.weight_bytes_per_token() as u64,
            kv_bytes_per_token: model.kv_bytes_per_token() as u64,
            window_kv_bytes_per_token: model.window_kv_bytes_per_token() as u64,
            rss_bytes: rss_bytes(),
            mem_total_bytes: meminfo_bytes("MemTotal:"),
            mem_available_bytes: meminfo_bytes("MemAvailable:"),
            links: cluster.map_or_else(Vec::new, |c| links_of(&c.world)),
            power,
        }
    }
}

/// Every rank's `RankInfo`, rank 0 first, on rank 0; `None` on the others
/// (which send theirs). Every rank of the world must call it once.
pub fn gather(cluster: &Cluster, mine: RankInfo) -> Result<Option<Vec<RankInfo>>, EngineError> {
    let w = &cluster.world;
    if w.rank() != 0 {
        let bytes = serde_json::to_vec(&mine).map_err(|e| EngineError::BadArgument(e.to_string()))?;
        w.send(0, &(bytes.len() as u64).to_le_bytes()).map_err(comm_err)?;
        w.send(0, &bytes).map_err(comm_err)?;
        return Ok(None);
    }
    let mut all = vec![mine];
    for r in 1..w.size() {
        let mut len = [0u8; 8];
        w.recv(r, &mut len).map_err(comm_err)?;
        let n = u64::from_le_bytes(len) as usize;
        if n > 1 << 20 {
            return Err(EngineError::BadArgument(format!("rank {r} sent a {n}-byte startup report")));
        }
        let mut buf = vec![0u8; n];
        w.recv(r, &mut buf).map_err(comm_err)?;
        let info: RankInfo = serde_json::from_slice(&buf)
            .map_err(|e| EngineError::BadArgument(format!("rank {r}'s startup report: {e}")))?;
        all.push(info);
    }
    Ok(Some(all))
}

static GATHERED: std::sync::Mutex<Option<Vec<RankInfo>>> = std::sync::Mutex::new(None);

/// Rank 0 keeps what [`gather`] collected for the server (`GET /cluster`):
/// at startup, and again each time the cluster re-forms (a re-planned world
/// may have fewer ranks, each holding a new shard).
pub fn remember(all: Vec<RankInfo>) {
    *GATHERED.lock().unwrap_or_else(|e| e.into_inner()) = Some(all);
}

/// What [`remember`] kept last: every rank of the current world, rank 0 first.
pub fn gathered() -> Option<Vec<RankInfo>> {
    GATHERED.lock().unwrap_or_else(|e| e.into_inner()).clone()
}
