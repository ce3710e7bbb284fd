//! Restarting lost ranks of a serving world (`launch -- serve`, `serve --ranks N`).
//!
//! A server outlives its ranks: when a rank other than 0 dies (killed, out of
//! memory, a host rebooted), the supervisor starts it again from the same
//! recipe (command line, environment, secret), after a short pause, and rank 0
//! re-forms the cluster with it (`server::worker::recover`). Rank 0 holds the
//! HTTP server and the requests, so its own end still ends the world. Other
//! commands (`run`, `bench`) keep fail-stop: a lost rank fails the run.
//!
//! A rank that is stopped (SIGSTOP, a job-control stop: state `T`) holds its
//! connections open, so rank 0 would wait on it forever. The supervisor kills
//! a local rank that stays stopped for [`STOPPED_GRACE`], and it is then
//! restarted like any lost rank. Ranks on other hosts run under ssh, where
//! their state is not visible; over TCP, rank 0 notices a hung rank by its
//! silent heartbeats (`comm`'s beacon, whichever host it is on) and reports
//! it to the supervisor ([`report_hung`]), which kills it the same way.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// Restarts of one rank in a row (each failing within [`STABLE_RUN`]) before
/// the supervisor gives up on it and stops the world.
pub(crate) const MAX_RESTARTS: u32 = 20;
/// A rank that ran this long before it was lost starts a fresh count of
/// restarts: a server killed now and then over weeks is never given up on.
pub(crate) const STABLE_RUN: Duration = Duration::from_secs(30);
/// Pause between a rank's death and its first restart (lets its port and segment go).
pub(crate) const RESTART_PAUSE: Duration = Duration::from_millis(500);
/// Longest pause between restarts that keep failing (a host unreachable for a
/// while: ssh fails at once, and 20 restarts 0.5 s apart would give up in 10 s).
pub(crate) const MAX_RESTART_PAUSE: Duration = Duration::from_secs(5);

/// The pause before restart number `n` in a row (1-based): [`RESTART_PAUSE`],
/// doubling with each restart in a row, at most [`MAX_RESTART_PAUSE`]. Twenty
/// restarts in a row then span about 85 s.
pub(crate) fn restart_pause(n: u32) -> Duration {
    RESTART_PAUSE.saturating_mul(1 << n.saturating_sub(1).min(16)).min(MAX_RESTART_PAUSE)
}

/// Whether `command` (the subcommand and its arguments) keeps serving across
/// rank losses.
pub(crate) fn restarts_ranks(command: &[String]) -> bool {
    command.first().is_some_and(|c| c == "serve")
}

/// What it takes to start a rank again: a copy of its `Command` (which is not
/// `Clone`) and, for ssh ranks, the host and the line written to ssh's stdin.
pub(crate) struct Recipe {
    program: OsString,
    args: Vec<OsString>,
    envs: Vec<(OsString, Option<OsString>)>,
    cwd: Option<PathBuf>,
    pub(crate) remote: Option<(String, String)>,
    /// Remote ranks: their ssh command's parts (its arguments are made from them).
    pub(crate) script: Option<crate::launch::RemoteScript>,
}

impl Recipe {
    pub(crate) fn of(
        cmd: &Command,
        remote: &Option<(String, String)>,
        script: &Option<crate::launch::RemoteScript>,
    ) -> Recipe {
        Recipe {
            program: cmd.get_program().to_owned(),
            args: cmd.get_args().map(|a| a.to_owned()).collect(),
            envs: cmd.get_envs().map(|(k, v)| (k.to_owned(), v.map(|v| v.to_owned()))).collect(),
            cwd: cmd.get_current_dir().map(|d| d.to_owned()),
            remote: remote.clone(),
            script: script.clone(),
        }
    }

    /// The value the rank gets for variable `key` (set by its command, else
    /// inherited from ours; a remote rank's from its script).
    pub(crate) fn env_var(&self, key: &str) -> Option<String> {
        if let Some(s) = &self.script {
            return s.env.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
        }
        match self.envs.iter().find(|(k, _)| k == key) {
            Some((_, v)) => v.as_ref().map(|v| v.to_string_lossy().into_owned()),
            None => std::env::var(key).ok(),
        }
    }

    /// Sets (`Some`) or removes (`None`) the rank's variables `changes`.
    pub(crate) fn apply_env(&mut self, changes: &[crate::reform::EnvChange]) {
        for (k, v) in changes {
            let key = OsString::from(k);
            let value = v.as_ref().map(OsString::from);
            if let Some(s) = &mut self.script {
                // A remote rank's variables are in its script, not ssh's environment.
                s.env.retain(|(n, _)| n != k);
                if let Some(v) = v {
                    s.env.push((k.clone(), v.clone()));
                }
                continue;
            }
            match self.envs.iter_mut().find(|(n, _)| *n == key) {
                Some(slot) => slot.1 = value,
                None => self.envs.push((key, value)),
            }
        }
        if let Some(s) = &self.script {
            self.args = s.ssh_args().into_iter().map(OsString::from).collect();
        }
    }

    pub(crate) fn command(&self) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args);
        for (k, v) in &self.envs {
            match v {
                Some(v) => cmd.env(k, v),
                None => cmd.env_remove(k),
            };
        }
        if let Some(d) = &self.cwd {
            cmd.current_dir(d);
        }
        cmd
    }
}

/// How long a local rank of a serving world may stay stopped before the
/// supervisor kills it to restart it.
pub(crate) const STOPPED_GRACE: Duration = Duration::from_secs(5);
/// Interval between looks at the ranks' states.
const STOPPED_POLL: Duration = Duration::from_millis(500);

/// Whether process `pid` is stopped by a signal (`T` in `/proc/PID/stat`; not
/// `t`, a debugger's trace stop).
pub(crate) fn is_stopped(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // `PID (COMM) STATE …`: COMM may hold spaces and parentheses, STATE follows the last `) `.
    stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('T'))
}

/// Watches local ranks for the stopped state.
#[derive(Default)]
pub(crate) struct StopWatch {
    /// Rank → (its pid, when it was first seen stopped).
    since: Vec<(usize, u32, Instant)>,
    next: Option<Instant>,
    /// Rank → (its pid, when the supervisor first saw it running).
    first_seen: Vec<(usize, u32, Instant)>,
}

impl StopWatch {
    /// Of `ranks` (rank, pid), those stopped for longer than `grace`: each is
    /// given once, then forgotten.
    pub(crate) fn overdue(&mut self, ranks: &[(usize, u32)], grace: Duration) -> Vec<(usize, u32)> {
        let now = Instant::now();
        if self.next.is_some_and(|t| now < t) {
            return Vec::new();
        }
        self.next = Some(now + STOPPED_POLL);
        let stopped: Vec<(usize, u32)> = ranks.iter().copied().filter(|&(_, pid)| is_stopped(pid)).collect();
        self.since.retain(|(r, p, _)| stopped.contains(&(*r, *p)));
        for &(r, p) in &stopped {
            if !self.since.iter().any(|s| s.0 == r && s.1 == p) {
                self.since.push((r, p, now));
            }
        }
        let due: Vec<(usize, u32)> =
            self.since.iter().filter(|s| now.duration_since(s.2) >= grace).map(|s| (s.0, s.1)).collect();
        self.since.retain(|s| !due.contains(&(s.0, s.1)));
        due
    }
    /// Kills the ranks of `live` (rank, pid, label, whether local; unreaped
    /// children) that rank 0 reported hung, and the local ones stopped for
    /// [`STOPPED_GRACE`], so that the supervisor restarts them. (For a rank
    /// over ssh the pid is ssh's: its end hangs up the remote command.)
    pub(crate) fn kill_overdue(&mut self, live: &[(usize, u32, String, bool)]) {
        let now = Instant::now();
        self.first_seen.retain(|(r, p, _)| live.iter().any(|l| l.0 == *r && l.1 == *p));
        for l in live {
            if !self.first_seen.iter().any(|s| s.0 == l.0 && s.1 == l.1) {
                self.first_seen.push((l.0, l.1, now));
            }
        }
        let reported: Vec<usize> =
            (0..HUNG.len()).filter(|&r| HUNG[r].swap(false, std::sync::atomic::Ordering::SeqCst)).collect();
        for l in live {
            let reported = reported.contains(&l.0);
            let since = self.first_seen.iter().find(|s| s.0 == l.0 && s.1 == l.1).map_or(now, |s| s.2);
            if !reported || now.duration_since(since) < HUNG_REPORT_MIN_AGE {
                continue;
            }
            eprintln!("note: rank 0 reports {} hung (no heartbeat); killing it to restart it", l.2);
            // SAFETY: the caller's children are not reaped yet, so the pid still names this one.
            unsafe { libc::kill(l.1 as libc::pid_t, libc::SIGKILL) };
        }
        let local: Vec<&(usize, u32, String, bool)> = live.iter().filter(|l| l.3).collect();
        let ranks: Vec<(usize, u32)> = local.iter().map(|l| (l.0, l.1)).collect();
        for (i, pid) in self.overdue(&ranks, STOPPED_GRACE) {
            let label = local.iter().find(|l| l.0 == i).map_or("a rank", |l| l.2.as_str());
            eprintln!(
                "note: {label} has been stopped (SIGSTOP) for {} s; killing it to restart it",
                STOPPED_GRACE.as_secs()
            );
            // SAFETY: the caller's children are not reaped yet, so the pid still names this one.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        }
    }
}

/// Set by the supervisor on rank 0 of a serving world: its own pid, which
/// rank 0 signals to report a rank it found hung ([`report_hung`]).
pub(crate) const ENV_SUPERVISOR_PID: &str = "SHARDLM_SUPERVISOR_PID";
/// A rank reported hung is killed only if it has run this long, so that a
/// report about a rank restarted since does not kill its successor.
const HUNG_REPORT_MIN_AGE: Duration = Duration::from_secs(2);

/// Ranks that rank 0 reported hung (`SIGUSR1` with the rank as its value).
static HUNG: [std::sync::atomic::AtomicBool; 256] = [const { std::sync::atomic::AtomicBool::new(false) }; 256];

extern "C" {
    // glibc and musl both export it; the libc crate does not bind it on Linux.
    fn sigqueue(pid: libc::pid_t, sig: libc::c_int, value: libc::sigval) -> libc::c_int;
}

extern "C" fn on_hung_report(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo with SA_SIGINFO; only atomics are touched.
    unsafe {
        if !info.is_null() && (*info).si_code == libc::SI_QUEUE {
            let rank = (*info).si_value().sival_ptr as usize;
            if let Some(flag) = HUNG.get(rank) {
                flag.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
    }
}

/// Ranks of the current world that rank 0 retired (`SIGUSR2` with a mask of
/// them as its value, bit r for rank r): it re-planned the model onto the
/// others, so they are neither restarted nor a failure of the world. One
/// signal carries the whole set: a second `SIGUSR2` sent before the first is
/// taken would be lost.
static RETIRED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

extern "C" fn on_retire_report(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo with SA_SIGINFO; only atomics are touched.
    unsafe {
        if !info.is_null() && (*info).si_code == libc::SI_QUEUE {
            let mask = (*info).si_value().sival_ptr as u64;
            RETIRED.fetch_or(mask, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

/// The ranks of the current world (a mask, bit r for rank r) that rank 0
/// retired since the last call.
pub(crate) fn take_retired() -> u64 {
    RETIRED.swap(0, std::sync::atomic::Ordering::SeqCst)
}

/// Rank 0 of a serving world: sends the supervisor that started us (our
/// parent, `SHARDLM_SUPERVISOR_PID`) `sig` carrying `value`. False without one.
fn signal_supervisor(sig: libc::c_int, value: usize) -> bool {
    let Some(pid) = std::env::var(ENV_SUPERVISOR_PID).ok().and_then(|p| p.parse::<libc::pid_t>().ok()) else {
        return false;
    };
    // SAFETY: getppid has no preconditions; sigqueue gets a plain value.
    unsafe {
        let value = libc::sigval { sival_ptr: value as *mut libc::c_void };
        libc::getppid() == pid && sigqueue(pid, sig, value) == 0
    }
}

/// Rank 0 of a serving world that re-planned without `ranks` (of the current
/// world, below 64): tells the supervisor to stop restarting them, and to
/// restart every other rank into the smaller world (`crate::reform`). False
/// without a supervisor, or for a rank it cannot name.
pub(crate) fn retire(ranks: &[usize]) -> bool {
    if ranks.iter().any(|&r| r == 0 || r >= 64) {
        return false;
    }
    let mask = ranks.iter().fold(0u64, |m, &r| m | 1 << r);
    let sent = signal_supervisor(libc::SIGUSR2, mask as usize);
    if sent {
        let list: Vec<String> = ranks.iter().map(|r| r.to_string()).collect();
        eprintln!("shardlm serve: told the supervisor to retire rank {}", list.join(", "));
    }
    sent
}

/// The supervisor takes rank 0's reports of hung ranks (`SIGUSR1`) and of
/// retired ones (`SIGUSR2`).
pub(crate) fn catch_hung_reports() {
    // SAFETY: the handler only stores to atomics, which is async-signal-safe.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction =
            on_hung_report as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) as libc::sighandler_t;
        sa.sa_flags = libc::SA_RESTART | libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut());
        let mut sr: libc::sigaction = std::mem::zeroed();
        sr.sa_sigaction = on_retire_report as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)
            as libc::sighandler_t;
        sr.sa_flags = libc::SA_RESTART | libc::SA_SIGINFO;
        libc::sigemptyset(&mut sr.sa_mask);
        libc::sigaction(libc::SIGUSR2, &sr, std::ptr::null_mut());
    }
}

/// The rank a transport error calls hung (`… peer 1 at … is hung: no heartbeat …`).
pub(crate) fn hung_rank(cause: &str) -> Option<usize> {
    let before = &cause[..cause.find(" is hung")?];
    let rest = &before[before.rfind("peer ")? + 5..];
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

/// Rank 0 of a serving world: when `cause` (why the cluster failed) names a
/// hung rank, asks the supervisor that started us to kill it so it is
/// restarted: a hung process never exits by itself. Does nothing without a
/// supervisor (it must be our parent) or when no rank is hung.
pub(crate) fn report_hung(cause: &str) {
    let Some(rank) = hung_rank(cause) else { return };
    if signal_supervisor(libc::SIGUSR1, rank) {
        eprintln!("shardlm serve: asked the supervisor to restart hung rank {rank}");
    }
}

/// A lost rank waiting for its restart.
pub(crate) struct PendingRestart {
    pub(crate) rank: usize,
    pub(crate) at: Instant,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopped_process_is_seen_and_reported_after_the_grace() {
        let mut child = Command::new("sleep").arg("30").spawn().expect("sleep");
        let pid = child.id();
        let mut w = StopWatch::default();
        assert!(!is_stopped(pid));
        assert!(w.overdue(&[(1, pid)], Duration::ZERO).is_empty());
        // SAFETY: signals our own child.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGSTOP) };
        let t = Instant::now();
        while !is_stopped(pid) && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(is_stopped(pid));
        w.next = None;
        assert_eq!(w.overdue(&[(1, pid)], Duration::from_secs(60)), vec![]);
        w.next = None;
        assert_eq!(w.overdue(&[(1, pid)], Duration::ZERO), vec![(1, pid)]);
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn a_recipe_rebuilds_the_same_command() {
        let mut c = Command::new("/bin/echo");
        c.args(["a", "b c"]).env("SHARDLM_RANK", "1").env_remove("X").current_dir("/tmp");
        let r = Recipe::of(&c, &None, &None).command();
        assert_eq!(r.get_program(), "/bin/echo");
        assert_eq!(r.get_args().collect::<Vec<_>>(), ["a", "b c"]);
        assert_eq!(r.get_current_dir(), Some(std::path::Path::new("/tmp")));
        let envs: Vec<_> = r.get_envs().collect();
        assert!(envs.contains(&(std::ffi::OsStr::new("SHARDLM_RANK"), Some(std::ffi::OsStr::new("1")))));
        assert!(envs.contains(&(std::ffi::OsStr::new("X"), None)));
    }

    #[test]
    fn the_hung_rank_is_read_from_the_cause() {
        let cause = "comm: peer 1 at 127.0.0.1:5001 aborted: peer 2 at 127.0.0.1:5002 is hung: no heartbeat for 5.0s";
        assert_eq!(hung_rank(cause), Some(2));
        assert_eq!(hung_rank("peer 1 at x is gone: closed"), None);
        assert_eq!(hung_rank("peer 12 at h:1 is hung: no heartbeat"), Some(12));
    }

    #[test]
    fn restarts_in_a_row_back_off() {
        assert_eq!(restart_pause(1), RESTART_PAUSE);
        assert_eq!(restart_pause(2), RESTART_PAUSE * 2);
        assert_eq!(restart_pause(4), RESTART_PAUSE * 8);
        assert_eq!(restart_pause(5), MAX_RESTART_PAUSE);
        assert_eq!(restart_pause(u32::MAX), MAX_RESTART_PAUSE);
        let total: Duration = (1..=MAX_RESTARTS).map(restart_pause).sum();
        assert!(total > Duration::from_secs(60), "{total:?}");
    }

    #[test]
    fn only_serve_restarts() {
        assert!(restarts_ranks(&["serve".into(), "--port".into(), "1".into()]));
        assert!(!restarts_ranks(&["run".into()]));
        assert!(!restarts_ranks(&[]));
    }
}
