//! `shardlm launch` with real processes, using the hidden `launch-probe`
//! rank program (joins the world, all-reduces the ranks, prints the sum).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_shardlm");

fn shardlm(args: &[&str]) -> Output {
    Command::new(EXE).args(args).env_remove("SHARDLM_SECRET").output().expect("spawn shardlm")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn sum_line(n: usize) -> String {
    format!("rank 0 of {n} sum {}\n", n * (n - 1) / 2)
}

fn assert_ok(o: &Output, n: usize) {
    assert!(o.status.success(), "failed ({:?}): {}", o.status, text(&o.stderr));
    assert_eq!(text(&o.stdout), sum_line(n), "stderr: {}", text(&o.stderr));
}

/// Pids the probes report on stderr (`probe rank R of N pid P joined`).
fn probe_pids(stderr: &str) -> Vec<u32> {
    stderr.lines().filter_map(|l| l.split(" pid ").nth(1)?.strip_suffix(" joined")?.parse().ok()).collect()
}

/// Whether `pid` is still a live (not zombie) process.
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')),
        Err(_) => false,
    }
}

fn assert_all_gone(pids: &[u32]) {
    let deadline = Instant::now() + Duration::from_secs(3);
    while pids.iter().any(|&p| alive(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left: Vec<u32> = pids.iter().copied().filter(|&p| alive(p)).collect();
    assert!(left.is_empty(), "rank processes left behind: {left:?}");
}

fn last_line(s: &str) -> &str {
    s.lines().last().unwrap_or("")
}

#[test]
fn local_worlds_sum_over_tcp_and_shm() {
    for (n, backend) in [(2, "tcp"), (3, "tcp"), (2, "shm"), (3, "shm"), (3, "auto")] {
        let o = shardlm(&["launch", "--local", &n.to_string(), "--backend", backend, "--", "launch-probe"]);
        assert_ok(&o, n);
        // Quiet ranks say nothing; rank 0's stderr comes through unprefixed.
        let err = text(&o.stderr);
        assert!(!err.contains("[rank"), "{backend}: {err}");
        assert!(err.contains(&format!("probe rank 0 of {n} pid")), "{backend}: {err}");
    }
}

#[test]
fn tcp_with_striping_and_a_fixed_secret() {
    let o = shardlm(&[
        "launch",
        "--local",
        "2",
        "--backend",
        "tcp",
        "--connections-per-peer",
        "3",
        "--secret",
        "s3cr3t",
        "--",
        "launch-probe",
    ]);
    assert_ok(&o, 2);
}

#[test]
fn verbose_forwards_every_rank_to_stderr() {
    let o = shardlm(&["launch", "--local", "3", "--verbose", "--", "launch-probe"]);
    assert_ok(&o, 3);
    let err = text(&o.stderr);
    for r in 1..3 {
        assert!(err.contains(&format!("[rank {r}] rank {r} of 3 sum 3\n")), "{err}");
        assert!(err.contains(&format!("[rank {r}] probe rank {r} of 3 pid")), "{err}");
    }
    assert_eq!(probe_pids(&err).len(), 3, "{err}");
}

#[test]
fn failing_rank_stops_the_world_and_is_named() {
    for backend in ["tcp", "shm"] {
        let t = Instant::now();
        let o = shardlm(&[
            "launch",
            "--local",
            "3",
            "--verbose",
            "--backend",
            backend,
            "--",
            "launch-probe",
            "--fail-rank",
            "2",
            "--sleep-rank",
            "0",
            "--sleep-rank",
            "1",
        ]);
        assert!(t.elapsed() < Duration::from_secs(5), "{backend}: took {:?}", t.elapsed());
        assert_eq!(o.status.code(), Some(3), "{backend}");
        let err = text(&o.stderr);
        let pids = probe_pids(&err);
        assert_eq!(pids.len(), 3, "{err}");
        let last = last_line(&err);
        assert!(last.starts_with("error: rank 2 (pid ") && last.ends_with(") exited with status 3"), "{err}");
        // Every other rank is accounted for, with how it ended.
        for r in [0, 1] {
            let line = err
                .lines()
                .find(|l| l.starts_with(&format!("note: rank {r} (pid ")))
                .unwrap_or_else(|| panic!("{err}"));
            assert!(line.contains("was stopped by the launcher after rank 2 failed; it "), "{line}");
        }
        assert_all_gone(&pids);
        // Rank 0's stdout still came through.
        assert_eq!(text(&o.stdout), sum_line(3));
    }
}

#[test]
fn a_quiet_failing_rank_shows_its_last_lines() {
    let o = shardlm(&["launch", "--local", "3", "--", "launch-probe", "--fail-rank", "1", "--sleep-rank", "2"]);
    assert_eq!(o.status.code(), Some(3));
    let err = text(&o.stderr);
    assert!(err.contains("[rank 1] probe rank 1 failing on purpose\n"), "{err}");
    assert!(!err.contains("[rank 2]"), "{err}");
    assert!(last_line(&err).starts_with("error: rank 1 (pid "), "{err}");
}

#[test]
fn a_killed_rank_is_named_with_its_signal() {
    let o = shardlm(&["launch", "--local", "3", "--", "launch-probe", "--signal-rank", "1", "--sleep-rank", "0"]);
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    let last = last_line(&err);
    assert!(last.starts_with("error: rank 1 (pid ") && last.contains("was killed by signal 9"), "{err}");
}

/// Starts a launcher of sleeping ranks and returns it with the ranks' pids.
fn sleeping_world(n: usize) -> (std::process::Child, Vec<u32>) {
    let mut args = vec!["launch".to_string(), "--local".into(), n.to_string(), "-v".into(), "--".into()];
    args.push("launch-probe".into());
    for r in 0..n {
        args.extend(["--sleep-rank".to_string(), r.to_string()]);
    }
    let mut child = Command::new(EXE).args(&args).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut pids = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while pids.len() < n {
        let line = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())).expect("ranks joined");
        pids.extend(probe_pids(&line));
    }
    (child, pids)
}

fn wait_for(child: &mut std::process::Child, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(Instant::now() < deadline, "launcher still running after {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sigterm_to_the_launcher_stops_the_ranks() {
    let (mut launcher, pids) = sleeping_world(3);
    assert!(pids.iter().all(|&p| alive(p)));
    Command::new("kill").args(["-TERM", &launcher.id().to_string()]).status().unwrap();
    let status = wait_for(&mut launcher, Duration::from_secs(5));
    assert_eq!(status.code(), Some(128 + 15));
    assert_all_gone(&pids);
}

#[test]
fn ranks_die_with_a_killed_launcher() {
    let (mut launcher, pids) = sleeping_world(2);
    launcher.kill().unwrap();
    launcher.wait().unwrap();
    assert_all_gone(&pids);
}

#[test]
fn ranks_flag_relaunches_through_the_launcher() {
    assert_ok(&shardlm(&["launch-probe", "--ranks", "3"]), 3);
    assert_ok(&shardlm(&["launch-probe", "--ranks=2", "--backend", "tcp"]), 2);
}

fn write(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    p
}

const OUR_HOSTFILE: &str = r#"{"hosts": [{"name": "a", "addr": "127.0.0.1"}, {"name": "b", "addr": "127.0.0.1"}]}"#;
const MLX_HOSTFILE: &str = r#"[{"ssh": "a", "ips": ["127.0.0.1"]}, {"ssh": "b", "ips": ["127.0.0.1"]},
    {"ssh": "c", "ips": ["127.0.0.1"]}]"#;

#[test]
fn hostfiles_of_this_machine_start_ranks_directly() {
    let dir = tempfile::tempdir().unwrap();
    let ours = write(dir.path(), "hosts.json", OUR_HOSTFILE);
    let mlx = write(dir.path(), "mlx.json", MLX_HOSTFILE);
    for (file, n) in [(&ours, 2), (&mlx, 3)] {
        for backend in ["auto", "tcp", "shm"] {
            let o =
                shardlm(&["launch", "--hostfile", file.to_str().unwrap(), "--backend", backend, "--", "launch-probe"]);
            assert_ok(&o, n);
        }
    }
}

#[test]
fn hostfile_cables_reach_the_ranks() {
    // Two "hosts" here, each with two cables (loopback addresses): connection
    // k of the pair runs between the two cable-k addresses, and there are two
    // connections without --connections-per-peer.
    let dir = tempfile::tempdir().unwrap();
    let hosts = write(
        dir.path(),
        "cables.json",
        r#"{"hosts": [
            {"name": "a", "addr": "127.0.0.1", "links": [{"addrs": ["127.0.0.1"]}, {"addrs": ["127.0.0.3"]}]},
            {"name": "b", "addr": "127.0.0.1", "links": [{"addrs": ["127.0.0.2"]}, {"addrs": ["127.0.0.4"]}]}
        ]}"#,
    );
    let o = shardlm(&["launch", "--hostfile", hosts.to_str().unwrap(), "--backend", "tcp", "--", "launch-probe"]);
    assert_ok(&o, 2);
    let err = text(&o.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("probe rank 0 peer 1 connection")).collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert!(lines[0].contains(": 127.0.0.1:") && lines[0].contains("-> 127.0.0.2:"), "{}", lines[0]);
    assert!(lines[1].contains(": 127.0.0.3:") && lines[1].contains("-> 127.0.0.4:"), "{}", lines[1]);
}

/// An `ssh` stand-in that runs the remote command here, as sshd would.
fn fake_ssh(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let log = dir.join("ssh-argv.log");
    let script = format!(
        "#!/bin/sh\nprintf '%s\\n' \"$@\" >> '{}'\nwhile [ \"$1\" = -o ]; do shift 2; done\nshift\nexec sh -c \"$*\"\n",
        log.display()
    );
    let p = write(dir, "fake-ssh", &script);
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

#[test]
fn hostfile_ranks_over_ssh() {
    let dir = tempfile::tempdir().unwrap();
    let ssh = fake_ssh(dir.path());
    let hosts = write(dir.path(), "mlx.json", MLX_HOSTFILE);
    let o = shardlm(&[
        "launch",
        "--hostfile",
        hosts.to_str().unwrap(),
        "--ssh",
        ssh.to_str().unwrap(),
        // Its own ports: the ssh tests run at once, and a world lingers a moment after a failure.
        "--port",
        "47330",
        "--ssh-local",
        "--remote-exe",
        EXE,
        "--secret",
        "topsecret123",
        "--verbose",
        "--",
        "launch-probe",
    ]);
    assert_ok(&o, 3);
    assert!(text(&o.stderr).contains("[rank 2] rank 2 of 3 sum 3"), "{}", text(&o.stderr));
    // Every rank went through ssh; the secret travels on stdin, never on a command line.
    let argv = std::fs::read_to_string(dir.path().join("ssh-argv.log")).unwrap();
    assert_eq!(argv.matches("BatchMode=yes").count(), 3, "{argv}");
    assert!(argv.contains("launch-probe") && !argv.contains("topsecret123"), "{argv}");
}

#[test]
fn a_failing_rank_over_ssh_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let ssh = fake_ssh(dir.path());
    let hosts = write(dir.path(), "hosts.json", OUR_HOSTFILE);
    let t = Instant::now();
    let o = shardlm(&[
        "launch",
        "--hostfile",
        hosts.to_str().unwrap(),
        "--ssh",
        ssh.to_str().unwrap(),
        // Its own ports: the ssh tests run at once, and a world lingers a moment after a failure.
        "--port",
        "47350",
        "--ssh-local",
        "--backend",
        "tcp",
        "-v",
        "--",
        "launch-probe",
        "--fail-rank",
        "1",
        "--sleep-rank",
        "0",
    ]);
    assert!(t.elapsed() < Duration::from_secs(5), "took {:?}", t.elapsed());
    assert_eq!(o.status.code(), Some(3));
    let err = text(&o.stderr);
    assert!(
        last_line(&err).starts_with("error: rank 1 (pid ") && err.contains(", ssh b) exited with status 3"),
        "{err}"
    );
    let pids = probe_pids(&err);
    assert_eq!(pids.len(), 2, "{err}");
    assert_all_gone(&pids);
}

#[test]
fn bad_hostfiles_give_one_line_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.json");
    let malformed = write(dir.path(), "bad.json", "{\"hosts\": [{\"name\": \"a\"");
    let empty = write(dir.path(), "empty.json", "[]");
    for file in [&missing, &malformed, &empty] {
        let o = shardlm(&["launch", "--hostfile", file.to_str().unwrap(), "--", "launch-probe"]);
        assert_eq!(o.status.code(), Some(1));
        let err = text(&o.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with("error: hostfile ") && err.contains(file.to_str().unwrap()), "{err}");
        assert!(o.stdout.is_empty());
    }
}

#[test]
fn launch_needs_a_world_and_a_command() {
    assert!(!shardlm(&["launch", "--", "launch-probe"]).status.success());
    assert!(!shardlm(&["launch", "--local", "2"]).status.success());
    let o = shardlm(&["launch", "--local", "2", "--hostfile", "x.json", "--", "launch-probe"]);
    assert!(!o.status.success());
}
