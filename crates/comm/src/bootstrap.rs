//! Joining a world from the environment a launcher sets.
//!
//! | variable | meaning |
//! |---|---|
//! | `SHARDLM_RANK` | this process's rank, `0..size` |
//! | `SHARDLM_SIZE` | number of ranks; unset or `1` means a single process |
//! | `SHARDLM_PEERS` | comma-separated `host:port` of every rank, in rank order (TCP) |
//! | `SHARDLM_SECRET` | the shared cluster secret (required when size > 1) |
//! | `SHARDLM_SHM` | optional: use the shared-memory transport with this segment name instead of TCP |
//! | `SHARDLM_CONNECTIONS` | optional: TCP connections per peer (default, or `0`: one per cable in common) |
//! | `SHARDLM_LINKS` | optional: every rank's cables, ranks separated by `;`, a rank's cables by `,` (e.g. `10.1.0.1,10.2.0.1;10.1.0.2,10.2.0.2`); see [`TcpConfig::links`] |
//! | `SHARDLM_CALIBRATE_BYTES` | optional: bytes per connection and direction to measure a pair's connections when it has several (default 2 MiB; `0`: equal stripes) |
//! | `SHARDLM_BIND` | optional: listen address if not our entry of `SHARDLM_PEERS` |
//! | `SHARDLM_OP_TIMEOUT_MS` | optional: fail an operation when a peer sends nothing for this long (default: wait; dead peers are detected anyway) |
//!
//! A process started by an MPI launcher (`mpirun`, `srun --mpi=pmix`) is
//! recognised by `OMPI_COMM_WORLD_SIZE`, `PMI_SIZE` or `PMIX_RANK` when
//! `SHARDLM_SIZE` is unset, and joins the MPI job's world
//! ([`Bootstrap::Mpi`]; needs the `mpi` cargo feature, else a one-line error).
//! An MPI launch of one process (size 1) is a single process.

use crate::error::{CommError, Result};
use crate::group::Group;
use crate::transport::shm::ShmConfig;
use crate::transport::tcp::TcpConfig;
use std::time::Duration;

pub const ENV_RANK: &str = "SHARDLM_RANK";
pub const ENV_SIZE: &str = "SHARDLM_SIZE";
pub const ENV_PEERS: &str = "SHARDLM_PEERS";
pub const ENV_SECRET: &str = "SHARDLM_SECRET";
pub const ENV_SHM: &str = "SHARDLM_SHM";
pub const ENV_CONNECTIONS: &str = "SHARDLM_CONNECTIONS";
pub const ENV_BIND: &str = "SHARDLM_BIND";
pub const ENV_LINKS: &str = "SHARDLM_LINKS";
pub const ENV_CALIBRATE_BYTES: &str = "SHARDLM_CALIBRATE_BYTES";
pub const ENV_OP_TIMEOUT_MS: &str = "SHARDLM_OP_TIMEOUT_MS";
/// TCP: a peer whose heartbeats stopped for this long is hung (0: no heartbeats;
/// default [`crate::transport::tcp::DEFAULT_HANG_TIMEOUT`]).
pub const ENV_HANG_TIMEOUT_MS: &str = "SHARDLM_HANG_TIMEOUT_MS";
/// Microseconds a rank busy-waits for a peer before it parks, over the
/// transports' default (200) and over what [`Group::from_env_spinning`]'s
/// caller chose. Longer spins shorten a pipeline's hand-offs when every rank
/// has a core of its own; they burn that core while waiting.
pub const ENV_SPIN_US: &str = "SHARDLM_SPIN_US";

/// What the environment asks for.
#[derive(Debug, Clone)]
pub enum Bootstrap {
    /// No distributed environment: a group of one.
    Single,
    Tcp(TcpConfig),
    Shm(ShmConfig),
    /// Started by an MPI launcher: join the job's world over MPI.
    Mpi(MpiLaunch),
}

/// How an MPI launch was recognised, and the model to check across ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpiLaunch {
    /// The variable that gave it away, as `NAME=value`.
    pub evidence: String,
    pub fingerprint: u64,
}

/// Recognises an MPI launcher's environment: `(evidence, world size if known)`.
fn detect_mpi(get: &impl Fn(&str) -> Option<String>) -> Option<(String, Option<usize>)> {
    for var in ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"] {
        if let Some(v) = get(var) {
            return Some((format!("{var}={v}"), v.trim().parse().ok()));
        }
    }
    get("PMIX_RANK").map(|v| (format!("PMIX_RANK={v}"), None))
}

impl Bootstrap {
    /// Reads the process environment.
    pub fn from_env(fingerprint: u64) -> Result<Bootstrap> {
        Self::from_vars(|k| std::env::var(k).ok(), fingerprint)
    }

    /// Reads variables through `get` (for tests and for launchers that stage them).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>, fingerprint: u64) -> Result<Bootstrap> {
        let number = |key: &str| -> Result<Option<usize>> {
            match get(key) {
                None => Ok(None),
                Some(v) => v
                    .trim()
                    .parse()
                    .map(Some)
                    .map_err(|_| CommError::Env(format!("{key}={v:?} is not a non-negative integer"))),
            }
        };
        if get(ENV_SIZE).is_none() {
            if let Some((evidence, size)) = detect_mpi(&get) {
                if size != Some(1) {
                    return Ok(Bootstrap::Mpi(MpiLaunch { evidence, fingerprint }));
                }
            }
        }
        let size = number(ENV_SIZE)?.unwrap_or(1);
        if size == 0 {
            return Err(CommError::Env(format!("{ENV_SIZE} must be at least 1")));
        }
        if size == 1 {
            return Ok(Bootstrap::Single);
        }
        let rank =
            number(ENV_RANK)?.ok_or_else(|| CommError::Env(format!("{ENV_SIZE}={size} but {ENV_RANK} is not set")))?;
        if rank >= size {
            return Err(CommError::Env(format!("{ENV_RANK}={rank} is not below {ENV_SIZE}={size}")));
        }
        let secret = get(ENV_SECRET).filter(|s| !s.is_empty()).ok_or_else(|| {
            CommError::Env(format!("{ENV_SECRET} is not set; every rank needs the same cluster secret"))
        })?;
        let op_timeout = number(ENV_OP_TIMEOUT_MS)?.map(|ms| std::time::Duration::from_millis(ms as u64));
        let spin = number(ENV_SPIN_US)?.map(|us| std::time::Duration::from_micros(us as u64));
        if let Some(name) = get(ENV_SHM).filter(|s| !s.is_empty()) {
            let mut cfg = ShmConfig::new(name, rank, size, secret, fingerprint);
            cfg.op_timeout = op_timeout;
            cfg.spin = spin.unwrap_or(cfg.spin);
            return Ok(Bootstrap::Shm(cfg));
        }
        let peers_var = get(ENV_PEERS).ok_or_else(|| CommError::Env(format!("{ENV_PEERS} is not set")))?;
        let peers: Vec<String> = peers_var.split(',').map(|p| p.trim().to_string()).collect();
        if peers.len() != size {
            return Err(CommError::Env(format!("{ENV_PEERS} lists {} addresses but {ENV_SIZE}={size}", peers.len())));
        }
        if let Some(bad) = peers
            .iter()
            .find(|p| p.rsplit_once(':').is_none_or(|(h, port)| h.is_empty() || port.parse::<u16>().is_err()))
        {
            return Err(CommError::Env(format!("{ENV_PEERS} entry {bad:?} is not host:port")));
        }
        let mut cfg = TcpConfig::new(rank, peers, secret, fingerprint);
        if let Some(n) = number(ENV_CONNECTIONS)? {
            cfg.connections_per_peer = n;
        }
        if let Some(v) = get(ENV_LINKS).filter(|s| !s.trim().is_empty()) {
            cfg.links = parse_links(&v, size)?;
        }
        if let Some(n) = number(ENV_CALIBRATE_BYTES)? {
            cfg.calibration_bytes = n;
        }
        cfg.bind = get(ENV_BIND).filter(|s| !s.is_empty());
        cfg.op_timeout = op_timeout;
        if let Some(ms) = number(ENV_HANG_TIMEOUT_MS)? {
            cfg.hang_timeout = (ms > 0).then(|| std::time::Duration::from_millis(ms as u64));
        }
        cfg.spin = spin.unwrap_or(cfg.spin);
        Ok(Bootstrap::Tcp(cfg))
    }

    /// Connects as asked.
    pub fn connect(&self) -> Result<Group> {
        match self {
            Bootstrap::Single => Ok(Group::single()),
            Bootstrap::Tcp(cfg) => Group::connect_tcp(cfg),
            Bootstrap::Shm(cfg) => Group::connect_shm(cfg),
            Bootstrap::Mpi(launch) => connect_mpi(launch),
        }
    }
}

#[cfg(feature = "mpi")]
fn connect_mpi(launch: &MpiLaunch) -> Result<Group> {
    Group::connect_mpi(launch.fingerprint)
}

#[cfg(not(feature = "mpi"))]
fn connect_mpi(launch: &MpiLaunch) -> Result<Group> {
    Err(CommError::Env(format!(
        "started by an MPI launcher ({}) but built without MPI support; rebuild with --features mpi",
        launch.evidence
    )))
}

/// Parses `SHARDLM_LINKS`: one entry per rank, separated by `;`, each a
/// comma-separated list of cable addresses (empty: that rank lists none).
pub fn parse_links(v: &str, size: usize) -> Result<Vec<Vec<String>>> {
    let links: Vec<Vec<String>> =
        v.split(';').map(|r| r.split(',').map(|c| c.trim().to_string()).filter(|c| !c.is_empty()).collect()).collect();
    if links.len() != size {
        return Err(CommError::Env(format!(
            "{ENV_LINKS} lists cables for {} ranks but {ENV_SIZE}={size}",
            links.len()
        )));
    }
    Ok(links)
}

/// `SHARDLM_LINKS` for these cables (see [`parse_links`]).
pub fn format_links(links: &[Vec<String>]) -> String {
    links.iter().map(|l| l.join(",")).collect::<Vec<_>>().join(";")
}

/// The variables a launcher sets for rank `rank` of a TCP world.
pub fn launcher_env(rank: usize, peers: &[String], secret: &str) -> Vec<(String, String)> {
    vec![
        (ENV_RANK.into(), rank.to_string()),
        (ENV_SIZE.into(), peers.len().to_string()),
        (ENV_PEERS.into(), peers.join(",")),
        (ENV_SECRET.into(), secret.into()),
    ]
}

impl Bootstrap {
    /// Sets the transports' busy-wait before parking, unless `SHARDLM_SPIN_US`
    /// (read by [`Bootstrap::from_vars`]) already chose one.
    pub fn with_default_spin(mut self, spin: Duration, env_set: bool) -> Bootstrap {
        if !env_set {
            match &mut self {
                Bootstrap::Shm(cfg) => cfg.spin = spin,
                Bootstrap::Tcp(cfg) => cfg.spin = spin,
                Bootstrap::Single | Bootstrap::Mpi(_) => {}
            }
        }
        self
    }
}

impl Group {
    /// Joins the world described by the `SHARDLM_*` environment (a group of one
    /// when none is set). `fingerprint` identifies the model all ranks serve.
    pub fn from_env(fingerprint: u64) -> Result<Group> {
        Bootstrap::from_env(fingerprint)?.connect()
    }

    /// [`Group::from_env`], with the transports spinning `spin` before they
    /// park unless `SHARDLM_SPIN_US` says otherwise. For ranks that each have
    /// cores of their own: a pipeline stage waits a whole stage per token, and
    /// on a VM a core that parked wakes slow (docs/CLUSTER.md).
    pub fn from_env_spinning(fingerprint: u64, spin: Duration) -> Result<Group> {
        let env_set = std::env::var_os(ENV_SPIN_US).is_some();
        Bootstrap::from_env(fingerprint)?.with_default_spin(spin, env_set).connect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn unset_means_single() {
        assert!(matches!(Bootstrap::from_vars(vars(&[]), 1).unwrap(), Bootstrap::Single));
    }

    #[test]
    fn tcp_from_launcher_env() {
        let peers = vec!["10.0.0.1:5000".to_string(), "10.0.0.2:5000".to_string()];
        let env = launcher_env(1, &peers, "s3");
        let map: HashMap<String, String> = env.into_iter().collect();
        let b = Bootstrap::from_vars(|k| map.get(k).cloned(), 9).unwrap();
        let Bootstrap::Tcp(cfg) = b else { panic!("expected tcp") };
        assert_eq!((cfg.rank, cfg.size, cfg.fingerprint), (1, 2, 9));
        assert_eq!(cfg.peers, peers);
        assert_eq!(cfg.secret, b"s3");
        assert_eq!((cfg.connections_per_peer, cfg.links.len()), (0, 0), "one connection per cable by default");
    }

    #[test]
    fn links_round_trip() {
        let links = vec![vec!["10.1.0.1".to_string(), "10.2.0.1".to_string()], vec![], vec!["h|fe80::1".to_string()]];
        assert_eq!(format_links(&links), "10.1.0.1,10.2.0.1;;h|fe80::1");
        assert_eq!(parse_links(&format_links(&links), 3).unwrap(), links);
    }

    #[test]
    fn errors_are_clear() {
        let e = Bootstrap::from_vars(vars(&[("SHARDLM_SIZE", "2"), ("SHARDLM_RANK", "0")]), 1).unwrap_err();
        assert_eq!(e.to_string(), "environment: SHARDLM_SECRET is not set; every rank needs the same cluster secret");
        let e = Bootstrap::from_vars(
            vars(&[("SHARDLM_SIZE", "2"), ("SHARDLM_RANK", "0"), ("SHARDLM_SECRET", "x"), ("SHARDLM_PEERS", "a:1,b")]),
            1,
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "environment: SHARDLM_PEERS entry \"b\" is not host:port");
        let e = Bootstrap::from_vars(
            vars(&[
                ("SHARDLM_SIZE", "2"),
                ("SHARDLM_RANK", "0"),
                ("SHARDLM_SECRET", "x"),
                ("SHARDLM_PEERS", "a:1,b:1"),
                ("SHARDLM_LINKS", "10.0.0.1"),
            ]),
            1,
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "environment: SHARDLM_LINKS lists cables for 1 ranks but SHARDLM_SIZE=2");
        let e = Bootstrap::from_vars(vars(&[("SHARDLM_SIZE", "two")]), 1).unwrap_err();
        assert!(e.to_string().contains("SHARDLM_SIZE=\"two\""));
    }

    #[test]
    fn mpi_launch_is_recognised() {
        let mpirun = [("OMPI_COMM_WORLD_SIZE", "2"), ("OMPI_COMM_WORLD_RANK", "1"), ("PMIX_RANK", "1")];
        let want = MpiLaunch { evidence: "OMPI_COMM_WORLD_SIZE=2".into(), fingerprint: 5 };
        assert!(matches!(Bootstrap::from_vars(vars(&mpirun), 5).unwrap(), Bootstrap::Mpi(l) if l == want));
        let b = Bootstrap::from_vars(vars(&[("PMIX_RANK", "0")]), 5).unwrap();
        assert!(matches!(b, Bootstrap::Mpi(l) if l.evidence == "PMIX_RANK=0"));
        // One process, or an explicit SHARDLM world, is not an MPI world.
        let one = [("OMPI_COMM_WORLD_SIZE", "1"), ("PMIX_RANK", "0")];
        assert!(matches!(Bootstrap::from_vars(vars(&one), 5).unwrap(), Bootstrap::Single));
        let explicit = [("OMPI_COMM_WORLD_SIZE", "2"), ("SHARDLM_SIZE", "1")];
        assert!(matches!(Bootstrap::from_vars(vars(&explicit), 5).unwrap(), Bootstrap::Single));
    }

    #[cfg(not(feature = "mpi"))]
    #[test]
    fn mpi_launch_without_the_feature_is_refused() {
        let b = Bootstrap::from_vars(vars(&[("OMPI_COMM_WORLD_SIZE", "3")]), 5).unwrap();
        assert_eq!(
            b.connect().unwrap_err().to_string(),
            "environment: started by an MPI launcher (OMPI_COMM_WORLD_SIZE=3) but built without MPI support; \
             rebuild with --features mpi"
        );
    }
}
