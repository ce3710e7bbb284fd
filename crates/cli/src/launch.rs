//! `shardlm launch`: start every rank of a world and watch over them.
//!
//! ```text
//! shardlm launch --local 4 -- run --model m.gguf --prompt hi          # 4 ranks here (shm)
//! shardlm launch --hostfile hosts.json -- run --model m.gguf ...      # one rank per host (ssh)
//! ```
//!
//! Each rank is this executable running the command after `--`, with the
//! `SHARDLM_*` environment of [`comm::bootstrap`]. Rank 0's stdout becomes ours
//! byte for byte and its stderr is passed through; the other ranks' stdout is
//! dropped and their stderr kept back (the last lines are shown if the rank
//! fails) unless `--verbose`, which forwards both, prefixed `[rank i] `, to our
//! stderr. When a rank fails the others are stopped (SIGTERM, SIGKILL after
//! 2 s) and we exit with its status. Local ranks die with us (`PR_SET_PDEATHSIG`);
//! remote ranks are stopped by a watcher that sees their ssh session close.
//!
//! Remote ranks run `ssh -o BatchMode=yes HOST sh -c '…'`: the script changes to
//! our working directory, reads the cluster secret from its stdin (so it never
//! shows on a command line) and runs the same executable path as here (or
//! `--remote-exe`). Hosts whose address is this machine are started directly.

use crate::launch_output::{describe, forward_lines, forward_raw, write_out};
use crate::launch_restart::{
    restart_pause, restarts_ranks, PendingRestart, Recipe, StopWatch, MAX_RESTARTS, STABLE_RUN,
};
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use comm::bootstrap::{
    format_links, launcher_env, ENV_BIND, ENV_CONNECTIONS, ENV_LINKS, ENV_PEERS, ENV_RANK, ENV_SECRET, ENV_SHM,
    ENV_SIZE,
};
use comm::Hostfile;
use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{mpsc, Arc, Mutex, Once};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Lines of a quiet rank's stderr kept to show when it fails.
pub(crate) const TAIL_LINES: usize = 50;
/// Longest line kept or forwarded as one piece.
pub(crate) const MAX_LINE: u64 = 16 << 10;
/// Time between SIGTERM and SIGKILL when stopping ranks.
const KILL_GRACE: Duration = Duration::from_secs(2);
/// Time the other ranks get to end on their own after one fails, before they
/// are stopped. A rank that fails because a peer hung up is often first to
/// exit, while the peer (the real cause) is still between closing its links
/// and printing its error; stopping it at once would lose that line.
const PEER_GRACE: Duration = Duration::from_millis(1500);
/// Port of the first rank when some host is remote and `--port` is not given.
const DEFAULT_REMOTE_PORT: u16 = 47310;
/// Variables passed on to remote ranks when set here.
/// A rank's device from its hostfile entry (`--device` overrides it).
pub const ENV_DEVICE: &str = "SHARDLM_DEVICE";

const FORWARDED_VARS: [&str; 3] = ["SHARDLM_LOG", "SHARDLM_OP_TIMEOUT_MS", "RUST_BACKTRACE"];

/// How the ranks talk to each other.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Backend {
    /// Shared memory when every rank runs on this machine, TCP otherwise.
    #[default]
    Auto,
    /// TCP (with --connections-per-peer connections per pair of ranks).
    Tcp,
    /// Shared-memory rings (every rank on this machine).
    Shm,
}

#[derive(Args, Debug)]
pub struct LaunchArgs {
    /// Start N ranks on this machine.
    #[arg(long, value_name = "N", required_unless_present = "hostfile", conflicts_with = "hostfile",
          value_parser = clap::value_parser!(u64).range(1..=256))]
    local: Option<u64>,
    /// Start rank i on host i of this hostfile (MLX's JSON list or ours), over ssh.
    #[arg(long, value_name = "FILE")]
    hostfile: Option<PathBuf>,
    /// Transport between ranks.
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    backend: Backend,
    /// TCP connections per pair of ranks (default: one per cable the pair has
    /// in common in the hostfile's `links` / `ips`, else 1).
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u64).range(1..=64))]
    connections_per_peer: Option<u64>,
    /// Cluster secret (default: $SHARDLM_SECRET, else a fresh random one).
    #[arg(long)]
    secret: Option<String>,
    /// TCP port of rank 0; the k-th other rank on the same address gets port+k
    /// (default: free ports here, 47310 when some host is remote).
    #[arg(long)]
    port: Option<u16>,
    /// Path of shardlm on the remote hosts (default: the same path as here).
    #[arg(long, value_name = "PATH")]
    remote_exe: Option<String>,
    /// The ssh program.
    #[arg(long, value_name = "PROGRAM", default_value = "ssh")]
    ssh: String,
    /// Go through ssh even for hosts that are this machine (tests).
    #[arg(long, hide = true)]
    ssh_local: bool,
    /// Forward every rank's stdout and stderr to stderr, prefixed `[rank i] `.
    #[arg(long, short)]
    verbose: bool,
    /// The shardlm subcommand and arguments every rank runs.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<String>,
}

/// `shardlm launch`.
pub fn launch(a: LaunchArgs) -> Result<()> {
    let exe = std::env::current_exe().context("finding the shardlm executable")?;
    let secret = cluster_secret(a.secret.as_deref())?;
    let connections = a.connections_per_peer.unwrap_or(0) as usize;
    let plan = match (&a.hostfile, a.local) {
        (Some(path), _) => plan_hostfile(&a, path, &secret, &exe)?,
        (None, Some(n)) => plan_local(n as usize, a.backend, connections, a.port, &secret, &exe, &a.command)?,
        (None, None) => bail!("give --local N or --hostfile FILE"),
    };
    // Ranks on this machine share its model cache: fetch an aliased model once,
    // here, before they start (remote hosts fetch into their own caches).
    if a.ssh_local || plan.iter().any(|p| p.remote.is_none()) {
        crate::model_source::prefetch_for_command(&a.command)?;
    }
    exit_on_failure(run_world(plan, a.verbose, restarts_ranks(&a.command))?)
}

/// Starts `n` ranks of this executable on this machine, each running `args`
/// (a shardlm subcommand and its arguments), forwards their output as
/// `shardlm launch` does and waits for all of them. Returns the exit code to
/// end with: 0, or that of the first rank that failed (whose error line has
/// been printed). The secret comes from `SHARDLM_SECRET` or is made up.
///
/// Call it from the main thread: local ranks are killed when the thread
/// that started them exits (`PR_SET_PDEATHSIG`).
pub fn launch_local(n: usize, backend: Backend, connections: usize, args: &[String], verbose: bool) -> Result<i32> {
    let exe = std::env::current_exe().context("finding the shardlm executable")?;
    let secret = cluster_secret(None)?;
    crate::model_source::prefetch_for_command(args)?;
    run_world(plan_local(n, backend, connections, None, &secret, &exe, args)?, verbose, restarts_ranks(args))
}

/// For `--ranks N` on run/bench/serve: re-runs this process's own command
/// line, minus `--ranks N` / `--ranks=N`, as `n` ranks on this machine through
/// [`launch_local`]. Returns the exit code; a caller ends with
/// `std::process::exit(code)` when it is not 0. The ranks don't see `--ranks`,
/// so they join the world from their environment instead of relaunching.
pub fn relaunch_with_ranks(n: usize, backend: Backend, connections: usize, verbose: bool) -> Result<i32> {
    let args = std::env::args_os()
        .skip(1)
        .map(|a| a.into_string().map_err(|a| anyhow::anyhow!("argument {a:?} is not UTF-8")))
        .collect::<Result<Vec<String>>>()?;
    launch_local(n, backend, connections, &strip_flag(&args, "--ranks"), verbose)
}

/// `args` without `flag VALUE` and `flag=VALUE` (up to a `--`).
pub fn strip_flag(args: &[String], flag: &str) -> Vec<String> {
    let mut out = Vec::with_capacity(args.len());
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--" {
            out.push(a.clone());
            out.extend(it.cloned());
            break;
        }
        if a == flag {
            it.next();
        } else if !a.strip_prefix(flag).is_some_and(|rest| rest.starts_with('=')) {
            out.push(a.clone());
        }
    }
    out
}

pub(crate) fn exit_on_failure(code: i32) -> Result<()> {
    if code != 0 {
        let _ = std::io::stdout().flush();
        std::process::exit(code);
    }
    Ok(())
}

// ---------------------------------------------------------------- planning

/// One rank, ready to start.
struct Planned {
    rank: usize,
    cmd: Command,
    /// Remote ranks: the ssh host, and the line (secret) written to ssh's stdin.
    remote: Option<(String, String)>,
    /// Remote ranks: what their ssh command is made of.
    script: Option<RemoteScript>,
}

/// What a remote rank's ssh command is made of, so that the supervisor can
/// make it again with the variables of a re-formed world.
#[derive(Clone, Debug)]
pub(crate) struct RemoteScript {
    pub(crate) host: String,
    pub(crate) cwd: String,
    /// The rank's variables (the secret is not among them: it goes to stdin).
    pub(crate) env: Vec<(String, String)>,
    pub(crate) exe: String,
    pub(crate) args: Vec<String>,
}

impl RemoteScript {
    /// The arguments of ssh.
    pub(crate) fn ssh_args(&self) -> Vec<String> {
        let script = remote_script(&self.cwd, &self.env, &self.exe, &self.args);
        vec!["-o".into(), "BatchMode=yes".into(), self.host.clone(), format!("sh -c {}", quote(&script))]
    }
}

/// What every rank is told about the world.
struct World {
    peers: Vec<String>,
    shm: Option<String>,
    /// TCP connections per peer; 0: one per cable in common.
    connections: usize,
    /// Every rank's cables (empty: none listed).
    links: Vec<Vec<String>>,
    secret: String,
}

impl World {
    fn shm(n: usize, secret: &str) -> Result<World> {
        let name = Some(segment_name()?);
        Ok(World {
            peers: vec!["127.0.0.1:0".into(); n],
            shm: name,
            connections: 1,
            links: Vec::new(),
            secret: secret.into(),
        })
    }

    fn env(&self, rank: usize, with_secret: bool) -> Vec<(String, String)> {
        let mut env = launcher_env(rank, &self.peers, &self.secret);
        env.retain(|(k, _)| (with_secret || k != ENV_SECRET) && (self.shm.is_none() || k != ENV_PEERS));
        match &self.shm {
            Some(name) => env.push((ENV_SHM.into(), name.clone())),
            None => {
                if self.connections > 0 {
                    env.push((ENV_CONNECTIONS.into(), self.connections.to_string()));
                }
                if !self.links.is_empty() {
                    env.push((ENV_LINKS.into(), format_links(&self.links)));
                }
            }
        }
        env
    }
}

fn plan_local(
    n: usize,
    backend: Backend,
    connections: usize,
    port: Option<u16>,
    secret: &str,
    exe: &Path,
    args: &[String],
) -> Result<Vec<Planned>> {
    if n == 0 {
        bail!("a world needs at least one rank");
    }
    if args.is_empty() {
        bail!("no command to launch: give the shardlm subcommand after `--`");
    }
    let world = if backend == Backend::Tcp {
        let base = port.map_or_else(|| free_port_range(n), Ok)?;
        let peers = (0..n).map(|r| port_plus(base, r).map(|p| format!("127.0.0.1:{p}"))).collect::<Result<_>>()?;
        World { peers, shm: None, connections, links: Vec::new(), secret: secret.into() }
    } else {
        World::shm(n, secret)?
    };
    Ok((0..n)
        .map(|rank| Planned { rank, cmd: local_command(exe, args, &world.env(rank, true)), remote: None, script: None })
        .collect())
}

fn plan_hostfile(a: &LaunchArgs, path: &Path, secret: &str, exe: &Path) -> Result<Vec<Planned>> {
    let hf = Hostfile::load(path)?;
    let n = hf.len();
    let here: Vec<bool> = hf.hosts.iter().map(|h| is_this_machine(&h.addr)).collect();
    let all_here = here.iter().all(|&h| h);
    let shm = match a.backend {
        Backend::Auto => all_here,
        Backend::Tcp => false,
        Backend::Shm => {
            if let Some(i) = here.iter().position(|&h| !h) {
                bail!("the shm backend needs every rank on this machine, but host {i} ({}) is not", hf.hosts[i].name);
            }
            true
        }
    };
    let world = if shm {
        World::shm(n, secret)?
    } else {
        // Hosts sharing an address (several ranks on one machine) get consecutive ports.
        let offsets: Vec<usize> =
            (0..n).map(|i| hf.hosts[..i].iter().filter(|h| h.addr == hf.hosts[i].addr).count()).collect();
        let span = offsets.iter().max().map_or(1, |m| m + 1);
        let base = match a.port {
            Some(p) => p,
            None if all_here => free_port_range(span)?,
            None => DEFAULT_REMOTE_PORT,
        };
        let mut peers = Vec::with_capacity(n);
        for (i, &k) in offsets.iter().enumerate() {
            peers.push(hf.rank_addresses(port_plus(base, k)?).swap_remove(i));
        }
        if let Some((i, j)) = (0..n).flat_map(|i| (0..i).map(move |j| (i, j))).find(|&(i, j)| peers[i] == peers[j]) {
            bail!("hostfile {}: hosts {j} and {i} both use address {}", path.display(), peers[i]);
        }
        World {
            peers,
            shm: None,
            connections: a.connections_per_peer.unwrap_or(0) as usize,
            links: hf.cable_addresses(),
            secret: secret.into(),
        }
    };
    let cwd = std::env::current_dir().context("finding the working directory")?;
    let remote_exe = a.remote_exe.clone().unwrap_or_else(|| exe.display().to_string());
    let mut plan = Vec::with_capacity(n);
    for (rank, host) in hf.hosts.iter().enumerate() {
        // The host's device (`"device"` in the hostfile) reaches its rank as SHARDLM_DEVICE.
        let device = host.device.iter().map(|d| (ENV_DEVICE.to_string(), d.clone()));
        if here[rank] && !a.ssh_local {
            let mut env = world.env(rank, true);
            env.extend(device);
            let cmd = local_command(exe, &a.command, &env);
            plan.push(Planned { rank, cmd, remote: None, script: None });
            continue;
        }
        let mut env = world.env(rank, false);
        env.extend(device);
        env.extend(FORWARDED_VARS.iter().filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v))));
        let script = RemoteScript {
            host: host.name.clone(),
            cwd: cwd.display().to_string(),
            env,
            exe: remote_exe.clone(),
            args: a.command.clone(),
        };
        let mut cmd = Command::new(&a.ssh);
        cmd.args(script.ssh_args());
        let remote = Some((host.name.clone(), format!("{secret}\n")));
        plan.push(Planned { rank, cmd, remote, script: Some(script) });
    }
    Ok(plan)
}

fn local_command(exe: &Path, args: &[String], env: &[(String, String)]) -> Command {
    let mut cmd = Command::new(exe);
    cmd.args(args);
    for k in [ENV_RANK, ENV_SIZE, ENV_PEERS, ENV_SECRET, ENV_SHM, ENV_CONNECTIONS, ENV_BIND, ENV_LINKS] {
        cmd.env_remove(k);
    }
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    cmd
}

/// The POSIX sh script a remote rank runs: secret from the first stdin line,
/// the rank in the background, and a watcher that stops it (SIGTERM) once
/// stdin closes, i.e. when the launcher or its ssh session goes away.
fn remote_script(cwd: &str, env: &[(String, String)], exe: &str, args: &[String]) -> String {
    let mut run = String::from("env");
    for word in env.iter().map(|(k, v)| format!("{k}={v}")).chain([exe.to_string()]).chain(args.iter().cloned()) {
        run.push(' ');
        run.push_str(&quote(&word));
    }
    format!(
        "cd {cwd} || exit 127\n\
         IFS= read -r {ENV_SECRET} || exit 126\n\
         export {ENV_SECRET}\n\
         exec 3<&0\n\
         {run} </dev/null 3<&- &\n\
         c=$!\n\
         (cat <&3 >/dev/null 2>&1; kill -TERM $c 2>/dev/null) &\n\
         w=$!\n\
         exec 3<&-\n\
         wait $c\n\
         s=$?\n\
         kill $w 2>/dev/null\n\
         exit $s\n",
        cwd = quote(cwd)
    )
}

/// Single-quotes `s` for a POSIX shell.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// `--secret`, else `SHARDLM_SECRET`, else 32 random bytes in hex.
fn cluster_secret(given: Option<&str>) -> Result<String> {
    let secret = match given.map(String::from).or_else(|| std::env::var(ENV_SECRET).ok().filter(|s| !s.is_empty())) {
        Some(s) => s,
        None => random_bytes(32)?.iter().map(|b| format!("{b:02x}")).collect(),
    };
    if secret.is_empty() || secret.contains(['\n', '\r', '\0']) {
        bail!("the cluster secret must be one non-empty line");
    }
    Ok(secret)
}

fn random_bytes(n: usize) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .context("reading random bytes from /dev/urandom")?;
    Ok(buf)
}

fn segment_name() -> Result<String> {
    let tag: String = random_bytes(6)?.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("launch-{}-{tag}", std::process::id()))
}

fn port_plus(base: u16, k: usize) -> Result<u16> {
    u16::try_from(base as usize + k).with_context(|| format!("port {base}+{k} is past 65535"))
}

/// A base port such that `base..base+count` are free on loopback now. Tried
/// outside the kernel's ephemeral range first, so outgoing connections of
/// other programs don't take them before the ranks listen.
fn free_port_range(count: usize) -> Result<u16> {
    let (lo, hi) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(|v| v.parse::<usize>().ok());
            Some((it.next()??, it.next()??))
        })
        .unwrap_or((32768, 60999));
    let mut regions = Vec::new();
    if lo >= 10_000 + count {
        regions.push((10_000, lo - count));
    }
    if hi + 1 + count <= 65_535 {
        regions.push((hi + 1, 65_536 - count));
    }
    let noise = random_bytes(64 * 8)?;
    for chunk in noise.chunks_exact(8) {
        let Some(&(from, to)) = regions.get(chunk[0] as usize % regions.len().max(1)) else { break };
        let r = u64::from_le_bytes(chunk.try_into().expect("8 bytes")) as usize;
        let base = from + r % (to - from);
        if ports_free(base, count) {
            return Ok(base as u16);
        }
    }
    // Fall back on the kernel's choice of a first free port.
    for _ in 0..64 {
        let first = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port() as usize;
        if first + count <= 65_536 && ports_free(first, count) {
            return Ok(first as u16);
        }
    }
    bail!("found no {count} consecutive free TCP ports on 127.0.0.1; give --port")
}

fn ports_free(base: usize, count: usize) -> bool {
    let held: Vec<_> = (base..base + count).map_while(|p| TcpListener::bind(("127.0.0.1", p as u16)).ok()).collect();
    held.len() == count
}

/// Whether `addr` (IP or name, with or without port) is this machine.
fn is_this_machine(addr: &str) -> bool {
    let host = if let Ok(sa) = addr.parse::<SocketAddr>() {
        sa.ip().to_string()
    } else {
        match addr.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') && p.parse::<u16>().is_ok() => h.to_string(),
            _ => addr.trim_matches(['[', ']']).to_string(),
        }
    };
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        // Binding succeeds only for addresses of our own interfaces.
        return ip.is_loopback() || (!ip.is_unspecified() && UdpSocket::bind((ip, 0)).is_ok());
    }
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it on success.
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) } != 0 {
        return false;
    }
    let name = String::from_utf8_lossy(&buf[..buf.iter().position(|&b| b == 0).unwrap_or(0)]).into_owned();
    !name.is_empty() && (name.eq_ignore_ascii_case(&host) || name.split('.').next() == Some(&host))
}

// ---------------------------------------------------------------- running

pub(crate) type Tail = Arc<Mutex<VecDeque<String>>>;

// Starting the ranks and the supervisor loop (`launch_supervise.rs`).
#[path = "launch_supervise.rs"]
mod supervise;
use supervise::run_world;

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn ranks_flag_is_stripped_in_both_forms() {
        let args = strings(&["run", "--ranks", "4", "--model", "m", "--ranks=2", "--ranksx", "--", "--ranks", "1"]);
        assert_eq!(strip_flag(&args, "--ranks"), strings(&["run", "--model", "m", "--ranksx", "--", "--ranks", "1"]));
    }

    #[test]
    fn quoting_survives_quotes() {
        assert_eq!(quote("it's"), r"'it'\''s'");
        let out = Command::new("sh").args(["-c", &format!("printf %s {}", quote("a 'b' $c"))]).output().unwrap();
        assert_eq!(out.stdout, b"a 'b' $c");
    }

    #[test]
    fn this_machine() {
        assert!(is_this_machine("127.0.0.1"));
        assert!(is_this_machine("127.0.0.1:5000"));
        assert!(is_this_machine("localhost"));
        assert!(is_this_machine("[::1]:7"));
        assert!(!is_this_machine("192.0.2.1"));
        assert!(!is_this_machine("no-such-host.invalid"));
    }

    #[test]
    fn secret_is_random_hex() {
        let s = random_bytes(32).unwrap();
        assert_eq!(s.len(), 32);
        assert!(cluster_secret(Some("a\nb")).is_err());
        assert_eq!(cluster_secret(Some("x")).unwrap(), "x");
    }
}
