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
/// Port of the first rank when some host is remote and `--port` is not given.
const DEFAULT_REMOTE_PORT: u16 = 47310;
/// Variables passed on to remote ranks when set here.
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
        if here[rank] && !a.ssh_local {
            let cmd = local_command(exe, &a.command, &world.env(rank, true));
            plan.push(Planned { rank, cmd, remote: None, script: None });
            continue;
        }
        let mut env = world.env(rank, false);
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

struct Rank {
    rank: usize,
    child: Child,
    host: Option<String>,
    /// Kept open while a remote rank runs; closing it stops the rank.
    stdin: Option<ChildStdin>,
    status: Option<ExitStatus>,
    tail: Option<Tail>,
    /// We signalled it (after another rank failed, or on Ctrl-C) before it exited.
    stopped: bool,
    started: Instant,
}

impl Rank {
    fn label(&self) -> String {
        match &self.host {
            Some(h) => format!("rank {} (pid {}, ssh {h})", self.rank, self.child.id()),
            None => format!("rank {} (pid {})", self.rank, self.child.id()),
        }
    }
}

static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNAL.store(sig, Ordering::SeqCst);
}

/// SIGINT, SIGTERM and SIGHUP only set a flag; the supervisor then stops the ranks.
fn catch_signals() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::sigaction(sig, &sa, std::ptr::null_mut());
            }
        }
    });
}

/// Starts every rank of `plan` and supervises them. With `restart` (a serving
/// world), a rank other than 0 that dies is started again (launch_restart).
fn run_world(mut plan: Vec<Planned>, verbose: bool, restart: bool) -> Result<i32> {
    catch_signals();
    let (tx, rx) = mpsc::channel();
    if let Some(p) = plan.iter_mut().find(|p| restart && p.rank == 0 && p.remote.is_none()) {
        crate::launch_restart::catch_hung_reports();
        p.cmd.env(crate::launch_restart::ENV_SUPERVISOR_PID, std::process::id().to_string());
    }
    let recipes: Vec<Recipe> =
        if restart { plan.iter().map(|p| Recipe::of(&p.cmd, &p.remote, &p.script)).collect() } else { Vec::new() };
    let mut ranks: Vec<Rank> = Vec::with_capacity(plan.len());
    let mut readers = Vec::new();
    for p in plan {
        match start(p, verbose, &tx, &mut readers) {
            Ok(r) => ranks.push(r),
            Err(e) => {
                signal_all(&mut ranks, libc::SIGKILL);
                for r in &mut ranks {
                    let _ = r.child.wait();
                }
                return Err(e);
            }
        }
    }
    let restarter = restart.then(|| Restarter {
        recipes,
        tx,
        counts: vec![0; ranks.len()],
        pending: Vec::new(),
        stops: StopWatch::default(),
        current: (0..ranks.len()).collect(),
        retired: vec![false; ranks.len()],
        rejoining: vec![false; ranks.len()],
    });
    supervise(ranks, rx, readers, verbose, restarter)
}

/// What the supervisor of a serving world needs to start lost ranks again.
struct Restarter {
    recipes: Vec<Recipe>,
    tx: mpsc::Sender<usize>,
    counts: Vec<u32>,
    pending: Vec<PendingRestart>,
    /// Local ranks seen stopped (SIGSTOP): killed after a grace, then restarted.
    stops: StopWatch,
    /// The ranks (as started) that make up the current world, in its order:
    /// fewer once rank 0 re-planned without some.
    current: Vec<usize>,
    /// Ranks (as started) that rank 0 retired: never restarted again.
    retired: Vec<bool>,
    /// Ranks (as started) stopped to join a re-formed world: restarted at once.
    rejoining: Vec<bool>,
}

impl Restarter {
    /// Rank 0 retired `mask` (ranks of the current world): they are stopped
    /// and not restarted, and when others survive besides rank 0, each of
    /// them is restarted into the smaller world they form (`crate::reform`).
    fn retire(&mut self, mask: u64, ranks: &[Rank]) {
        let n = self.current.len();
        let keep: Vec<usize> = (0..n).filter(|&r| r == 0 || r >= 64 || mask & (1 << r) == 0).collect();
        if keep.len() == n {
            return;
        }
        (0..n).filter(|r| !keep.contains(r)).for_each(|r| self.retired[self.current[r]] = true);
        let survivors: Vec<usize> = keep.iter().map(|&r| self.current[r]).collect();
        self.current = survivors.clone();
        if survivors.len() < 2 {
            return;
        }
        let get = |k: &str| self.recipes[0].env_var(k);
        let envs = match crate::reform::shrunk_env(&get, &keep) {
            Ok(e) => e,
            Err(e) => {
                eprintln!("error: re-forming the world of the survivors: {e}");
                return;
            }
        };
        for (&o, env) in survivors.iter().zip(&envs) {
            self.recipes[o].apply_env(env);
        }
        let list: Vec<String> = survivors.iter().map(|r| r.to_string()).collect();
        eprintln!(
            "note: rank 0 re-planned onto the survivors (ranks {} as started); restarting the others into a world of {}",
            list.join(", "),
            survivors.len()
        );
        for &o in &survivors[1..] {
            self.counts[o] = 0;
            match ranks.get(o) {
                Some(r) if r.status.is_none() => {
                    self.rejoining[o] = true;
                    // SAFETY: its status is not collected, so the pid still names our child.
                    unsafe { libc::kill(r.child.id() as libc::pid_t, libc::SIGKILL) };
                }
                _ if !self.pending.iter().any(|p| p.rank == o) => {
                    self.pending.push(PendingRestart { rank: o, at: Instant::now() });
                }
                _ => {}
            }
        }
    }
}

fn start(p: Planned, verbose: bool, tx: &mpsc::Sender<usize>, readers: &mut Vec<JoinHandle<()>>) -> Result<Rank> {
    let Planned { rank, mut cmd, remote, .. } = p;
    cmd.stdout(if rank == 0 || verbose { Stdio::piped() } else { Stdio::null() });
    cmd.stderr(Stdio::piped());
    let stdin = match (&remote, rank) {
        (Some(_), _) => Stdio::piped(),
        (None, 0) => Stdio::inherit(),
        (None, _) => Stdio::null(),
    };
    cmd.stdin(stdin);
    #[cfg(target_os = "linux")]
    {
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: only async-signal-safe calls (prctl, getppid, raise) between fork and exec.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::getppid() != parent {
                    libc::raise(libc::SIGKILL);
                }
                Ok(())
            })
        };
    }
    let what = match &remote {
        Some((host, _)) => format!("starting rank {rank} on {host} with {:?}", cmd.get_program()),
        None => format!("starting rank {rank} ({})", Path::new(cmd.get_program()).display()),
    };
    let mut child = cmd.spawn().context(what)?;
    let mut stdin = child.stdin.take();
    if let (Some(pipe), Some((_, line))) = (stdin.as_mut(), &remote) {
        // A rank that dies at once closes the pipe; its exit status tells why.
        let _ = pipe.write_all(line.as_bytes()).and_then(|_| pipe.flush());
    }
    let tail = (rank != 0 && !verbose).then(Tail::default);
    if let Some(out) = child.stdout.take() {
        readers.push(if rank == 0 { forward_raw(out, true) } else { forward_lines(out, rank, None) });
    }
    if let Some(err) = child.stderr.take() {
        readers.push(if rank == 0 { forward_raw(err, false) } else { forward_lines(err, rank, tail.clone()) });
    }
    notify_exit(child.id(), rank, tx.clone());
    let host = remote.map(|(h, _)| h);
    Ok(Rank { rank, child, host, stdin, status: None, tail, stopped: false, started: Instant::now() })
}

/// Tells `tx` when the child exits, without reaping it (the supervisor does).
fn notify_exit(pid: u32, rank: usize, tx: mpsc::Sender<usize>) {
    std::thread::spawn(move || {
        loop {
            // SAFETY: `info` is a valid out-parameter; WNOWAIT leaves the child to `Child::wait`.
            let r = unsafe {
                let mut info: libc::siginfo_t = std::mem::zeroed();
                libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, libc::WEXITED | libc::WNOWAIT)
            };
            if r == 0 || std::io::Error::last_os_error().kind() != ErrorKind::Interrupted {
                break;
            }
        }
        let _ = tx.send(rank);
    });
}

fn signal_all(ranks: &mut [Rank], sig: libc::c_int) {
    for r in ranks.iter_mut().filter(|r| r.status.is_none()) {
        r.stdin = None;
        r.stopped = true;
        // SAFETY: the child is not reaped yet, so its pid still names it.
        unsafe { libc::kill(r.child.id() as libc::pid_t, sig) };
    }
}

fn supervise(
    mut ranks: Vec<Rank>,
    rx: mpsc::Receiver<usize>,
    mut readers: Vec<JoinHandle<()>>,
    verbose: bool,
    mut restarter: Option<Restarter>,
) -> Result<i32> {
    let mut first_failure: Option<usize> = None;
    let mut interrupted: Option<i32> = None;
    let mut kill_at: Option<Instant> = None;
    let mut live = ranks.len();
    while live > 0 {
        let mut failed = None;
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(i) => {
                let r = &mut ranks[i];
                let status = r.child.wait().with_context(|| format!("waiting for rank {i}"))?;
                r.status = Some(status);
                r.stdin = None;
                live -= 1;
                failed = (!status.success()).then_some(i);
                let world_up = interrupted.is_none() && first_failure.is_none() && ranks[0].status.is_none();
                if restarter.as_ref().is_some_and(|rs| i != 0 && rs.retired[i]) {
                    // Rank 0 re-planned the model without it.
                    eprintln!("note: {} retired by rank 0 (the cluster re-planned without it)", ranks[i].label());
                    failed = None;
                } else if let Some(rs) = restarter.as_mut().filter(|rs| i != 0 && rs.rejoining[i]) {
                    // Stopped to join the smaller world of the survivors.
                    rs.rejoining[i] = false;
                    rs.pending
                        .push(PendingRestart { rank: i, at: Instant::now() + crate::launch_restart::RESTART_PAUSE });
                    failed = None;
                } else if let (Some(rs), Some(_), true) = (restarter.as_mut(), failed.filter(|&i| i != 0), world_up) {
                    // A rank that ran a while before it was lost starts a fresh
                    // count: the limit is on restarts in a row that fail fast.
                    if ranks[i].started.elapsed() >= STABLE_RUN {
                        rs.counts[i] = 0;
                    }
                    if rs.counts[i] >= MAX_RESTARTS {
                        // A host that stays gone: rank 0 keeps serving degraded,
                        // or re-plans onto the survivors (`serve --replan-after`).
                        eprintln!(
                            "note: giving up on {} after {MAX_RESTARTS} restarts; rank 0 serves degraded or re-plans without it",
                            ranks[i].label()
                        );
                        failed = None;
                    } else {
                        rs.counts[i] += 1;
                        let r = &ranks[i];
                        if let (false, Some(tail)) = (verbose, &r.tail) {
                            let lines = tail.lock().unwrap_or_else(|e| e.into_inner());
                            let shown: String = lines.iter().map(|l| format!("[rank {i}] {l}\n")).collect();
                            let _ = write_out(false, shown.as_bytes());
                        }
                        let pause = restart_pause(rs.counts[i]);
                        eprintln!(
                            "note: {} {}; restarting it in {:.1} s (restart {} in a row of at most {MAX_RESTARTS})",
                            r.label(),
                            describe(status, r.host.is_some()),
                            pause.as_secs_f64(),
                            rs.counts[i]
                        );
                        rs.pending.push(PendingRestart { rank: i, at: Instant::now() + pause });
                        failed = None;
                    }
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                // Every watcher is gone; collect whoever is left directly.
                for r in ranks.iter_mut().filter(|r| r.status.is_none()) {
                    r.status = Some(r.child.wait()?);
                }
                live = 0;
            }
        }
        if let Some(rs) = restarter.as_mut() {
            if ranks[0].status.is_some() {
                rs.pending.clear();
            } else {
                let mask = crate::launch_restart::take_retired();
                if mask != 0 {
                    rs.retire(mask, &ranks);
                }
            }
            let retired = rs.retired.clone();
            rs.pending.retain(|p| {
                let retired = retired[p.rank];
                if retired {
                    eprintln!("note: rank {} retired by rank 0 (the cluster re-planned without it)", p.rank);
                }
                !retired
            });
            // A retired rank still running (hung, or waiting for a world
            // that is gone) is stopped.
            for r in ranks.iter().filter(|r| r.rank != 0 && r.status.is_none()) {
                if rs.retired[r.rank] {
                    // SAFETY: its status is not collected, so the pid still names our child.
                    unsafe { libc::kill(r.child.id() as libc::pid_t, libc::SIGKILL) };
                }
            }
            if ranks[0].status.is_none() && interrupted.is_none() && first_failure.is_none() {
                let local: Vec<(usize, u32, String, bool)> = ranks
                    .iter()
                    .filter(|r| r.rank != 0 && r.status.is_none())
                    .map(|r| (r.rank, r.child.id(), r.label(), r.host.is_none()))
                    .collect();
                rs.stops.kill_overdue(&local);
            }
            while let Some(k) = rs.pending.iter().position(|p| p.at <= Instant::now()) {
                let i = rs.pending.swap_remove(k).rank;
                let recipe = &rs.recipes[i];
                let planned = Planned {
                    rank: i,
                    cmd: recipe.command(),
                    remote: recipe.remote.clone(),
                    script: recipe.script.clone(),
                };
                match start(planned, verbose, &rs.tx, &mut readers) {
                    Ok(r) => {
                        eprintln!("note: {} started again", r.label());
                        ranks[i] = r;
                        live += 1;
                    }
                    Err(e) => {
                        eprintln!("error: restarting rank {i}: {e:#}");
                        failed = failed.or(Some(i));
                    }
                }
            }
        }
        if interrupted.is_none() && first_failure.is_none() {
            // Checked first: a rank dying of the Ctrl-C that reached us too is not the failure to report.
            let sig = SIGNAL.load(Ordering::SeqCst);
            if sig != 0 {
                interrupted = Some(sig);
            } else {
                first_failure = failed;
            }
            if interrupted.is_some() || first_failure.is_some() {
                signal_all(&mut ranks, libc::SIGTERM);
                kill_at = Some(Instant::now() + KILL_GRACE);
            }
        }
        if kill_at.is_some_and(|t| Instant::now() >= t) {
            signal_all(&mut ranks, libc::SIGKILL);
            kill_at = None;
        }
    }
    // Let the output catch up (bounded: a grandchild may still hold a pipe).
    let deadline = Instant::now() + KILL_GRACE;
    while readers.iter().any(|h| !h.is_finished()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = std::io::stdout().flush();
    if let Some(sig) = interrupted {
        eprintln!("error: interrupted by signal {sig}; stopped all {} ranks", ranks.len());
        return Ok(128 + sig);
    }
    let Some(i) = first_failure else { return Ok(0) };
    let r = &ranks[i];
    let status = r.status.expect("reaped");
    if let (false, Some(tail)) = (verbose, &r.tail) {
        let lines = tail.lock().unwrap_or_else(|e| e.into_inner());
        let shown: String = lines.iter().map(|l| format!("[rank {i}] {l}\n")).collect();
        let _ = write_out(false, shown.as_bytes());
    }
    // Every other rank gets a line: the ones that ended on their own before we
    // stopped the rest (a peer that vanished first is often the real cause of
    // the failure reported), with their stderr tails, and the ones we stopped.
    for (j, other) in ranks.iter().enumerate().filter(|(j, _)| *j != i) {
        let Some(st) = other.status else {
            eprintln!("note: {} did not report an exit status", other.label());
            continue;
        };
        if let (false, false, Some(tail)) = (verbose, st.success() || other.stopped, &other.tail) {
            let lines = tail.lock().unwrap_or_else(|e| e.into_inner());
            let shown: String = lines.iter().map(|l| format!("[rank {j}] {l}\n")).collect();
            let _ = write_out(false, shown.as_bytes());
        }
        let how = describe(st, other.host.is_some());
        if other.stopped {
            eprintln!("note: {} was stopped by the launcher after rank {i} failed; it {how}", other.label());
        } else {
            eprintln!("note: {} had already {how}", other.label());
        }
    }
    eprintln!("error: {} {}", r.label(), describe(status, r.host.is_some()));
    Ok(status.code().filter(|&c| c != 0).unwrap_or(1))
}

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
