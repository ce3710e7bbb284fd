//! The running world of `shardlm launch` (a child module of `launch.rs`):
//! starting each rank, forwarding its output, and the supervisor loop that
//! restarts a failed rank (`--restart`), retires one rank 0 gave up on,
//! re-forms a smaller world after a re-plan onto the survivors, and stops
//! everyone when a rank fails for good.

use super::*;

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
pub(super) fn run_world(mut plan: Vec<Planned>, verbose: bool, restart: bool) -> Result<i32> {
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
        for o in (0..n).filter(|r| !keep.contains(r)).map(|r| self.current[r]) {
            self.retired[o] = true;
            // One already given up on (exited, no restart pending) gets no
            // exit or restart to report it at: say so now.
            if ranks[o].status.is_some() && !self.pending.iter().any(|p| p.rank == o) {
                eprintln!("note: {} retired by rank 0 (the cluster re-planned without it)", ranks[o].label());
            }
        }
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
    // When to stop the ranks still running after one failed (PEER_GRACE).
    let mut stop_at: Option<Instant> = None;
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
            if interrupted.is_some() {
                signal_all(&mut ranks, libc::SIGTERM);
                kill_at = Some(Instant::now() + KILL_GRACE);
            } else if first_failure.is_some() {
                // The others may be failing of the same cause: let them say so (PEER_GRACE).
                stop_at = Some(Instant::now() + PEER_GRACE);
            }
        }
        // (A Ctrl-C during that grace stops them at once.)
        if stop_at.is_some_and(|t| Instant::now() >= t || SIGNAL.load(Ordering::SeqCst) != 0) {
            signal_all(&mut ranks, libc::SIGTERM);
            kill_at = Some(Instant::now() + KILL_GRACE);
            stop_at = None;
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
