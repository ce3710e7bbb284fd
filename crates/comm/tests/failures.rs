//! Failure handling with real processes: a rank is killed (SIGKILL) in the
//! middle of a stream of all-reduces, and every survivor must fail within
//! 5 seconds with an error that names the dead rank, never hang.
//!
//! The test binary re-runs itself as the ranks: `rank_process` does nothing
//! unless `SHARDLM_TEST_ROLE` is set, in which case it joins the world from the
//! `SHARDLM_*` environment and all-reduces until an error, which it prints.

mod common;

use common::*;
use shardlm_comm::{Bootstrap, Group};
use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

const ROLE: &str = "SHARDLM_TEST_ROLE";

#[test]
fn rank_process() {
    if std::env::var(ROLE).is_err() {
        return;
    }
    let group = match Bootstrap::from_env(FINGERPRINT).and_then(|b| b.connect()) {
        Ok(g) => g,
        Err(e) => {
            println!("CONNECT-ERROR {e}");
            std::process::exit(2);
        }
    };
    println!("READY {}", group.rank());
    let start = Instant::now();
    let mut i = 0u64;
    // A slow rank (`SLOW`: this rank sleeps MS once, mid-stream) and a bounded run (`ITERS`).
    let env_num = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    let (slow_ms, iters) = (env_num("SHARDLM_TEST_SLOW_MS"), env_num("SHARDLM_TEST_ITERS"));
    let mut total = 0u64;
    loop {
        total += 1;
        if iters.is_some_and(|n| total > n) {
            println!("DONE");
            std::process::exit(0);
        }
        if let Some(ms) = slow_ms.filter(|_| total == 500) {
            std::thread::sleep(Duration::from_millis(ms));
        }
        // Never outlive a broken parent test.
        if start.elapsed() > Duration::from_secs(60) {
            std::process::exit(4);
        }
        let mut x = vec![1.0f32; 2048];
        if let Err(e) = group.all_reduce_sum_f32(&mut x) {
            println!("ERROR {e}");
            std::process::exit(3);
        }
        assert_eq!(x[0], group.size() as f32);
        i += 1;
        if i == 1000 {
            i = 0;
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

fn spawn_rank(env: &[(String, String)]) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "rank_process", "--nocapture", "--test-threads=1"])
        .env(ROLE, "1")
        .envs(env.iter().cloned())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn rank")
}

/// Reads lines from a child's stdout until one starts with `prefix`.
fn wait_line(reader: &mut BufReader<ChildStdout>, prefix: &str) -> String {
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line).unwrap() == 0 {
            panic!("rank exited before printing {prefix}");
        }
        // libtest prints "test rank_process ... " before our first line.
        if let Some(at) = line.find(prefix).or_else(|| line.find("CONNECT-ERROR")) {
            return line[at..].trim().to_string();
        }
    }
}

/// Kills every rank still running when the test ends, passed or not.
struct Ranks(Vec<(Child, BufReader<ChildStdout>)>);

impl Drop for Ranks {
    fn drop(&mut self) {
        for (c, _) in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// How rank 2 fails.
#[derive(Clone, Copy)]
enum Fate {
    /// SIGKILL: the process is gone.
    Killed,
    /// SIGSTOP: alive but silent; only the operation timeout can tell.
    Stopped,
}

fn kill_one_of_three(envs: Vec<Vec<(String, String)>>) {
    fail_one_of_three(envs, Fate::Killed)
}

fn fail_one_of_three(envs: Vec<Vec<(String, String)>>, fate: Fate) {
    let mut ranks = Ranks(Vec::new());
    let kids = &mut ranks.0;
    *kids = envs
        .iter()
        .map(|e| {
            let mut c = spawn_rank(e);
            let out = BufReader::new(c.stdout.take().unwrap());
            (c, out)
        })
        .collect();
    for (_, out) in kids.iter_mut() {
        let line = wait_line(out, "READY");
        assert!(line.starts_with("READY"), "{line}");
    }
    std::thread::sleep(Duration::from_millis(300));
    match fate {
        Fate::Killed => {
            kids[2].0.kill().unwrap();
            kids[2].0.wait().unwrap();
        }
        Fate::Stopped => {
            // SAFETY: signalling our own child by pid.
            assert_eq!(unsafe { libc::kill(kids[2].0.id() as i32, libc::SIGSTOP) }, 0);
        }
    }
    let killed = Instant::now();
    for (rank, (k, out)) in kids.iter_mut().take(2).enumerate() {
        let line = wait_line(out, "ERROR");
        let waited = killed.elapsed();
        let status = k.wait().unwrap();
        assert_eq!(status.code(), Some(3), "rank {rank}: {line}");
        assert!(waited < Duration::from_secs(5), "rank {rank} noticed after {waited:?}");
        assert!(line.contains("peer 2"), "rank {rank} must name the dead rank: {line}");
        eprintln!("rank {rank} after {waited:?}: {line}");
    }
}

#[test]
fn tcp_peer_killed_mid_collective() {
    kill_one_of_three(tcp_envs(&[]));
}

#[test]
fn shm_peer_killed_mid_collective() {
    let name = shm_name("kill");
    let envs = (0..3)
        .map(|r| {
            let mut e = shardlm_comm::bootstrap::launcher_env(r, &[], std::str::from_utf8(SECRET).unwrap());
            e.retain(|(k, _)| k != "SHARDLM_SIZE" && k != "SHARDLM_PEERS");
            e.push(("SHARDLM_SIZE".into(), "3".into()));
            e.push(("SHARDLM_SHM".into(), name.clone()));
            e
        })
        .collect();
    kill_one_of_three(envs);
}

fn tcp_envs(extra: &[(&str, &str)]) -> Vec<Vec<(String, String)>> {
    let addrs = free_addrs(3);
    (0..3)
        .map(|r| {
            let mut e = shardlm_comm::bootstrap::launcher_env(r, &addrs, std::str::from_utf8(SECRET).unwrap());
            e.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
            e
        })
        .collect()
}

#[test]
fn tcp_peer_stopped_hits_the_operation_timeout() {
    fail_one_of_three(tcp_envs(&[("SHARDLM_OP_TIMEOUT_MS", "1000")]), Fate::Stopped);
}

#[test]
fn tcp_peer_stopped_is_hung_by_its_silent_heartbeat() {
    // No operation timeout: only the beacon can tell a stopped rank.
    fail_one_of_three(tcp_envs(&[("SHARDLM_HANG_TIMEOUT_MS", "1000")]), Fate::Stopped);
}

#[test]
fn tcp_peer_busy_for_longer_than_the_hang_timeout_is_not_hung() {
    // Rank 2 computes (sleeps) for 3 s mid-stream; its beacon thread keeps beating.
    let mut envs = tcp_envs(&[("SHARDLM_HANG_TIMEOUT_MS", "1000"), ("SHARDLM_TEST_ITERS", "2000")]);
    envs[2].push(("SHARDLM_TEST_SLOW_MS".into(), "3000".into()));
    let mut ranks = Ranks(
        envs.iter()
            .map(|e| {
                let mut c = spawn_rank(e);
                let out = BufReader::new(c.stdout.take().unwrap());
                (c, out)
            })
            .collect(),
    );
    for (rank, (k, out)) in ranks.0.iter_mut().enumerate() {
        let line = wait_line(out, "READY");
        assert!(line.starts_with("READY"), "{line}");
        let line = wait_line(out, "DONE");
        assert_eq!(line, "DONE", "rank {rank}");
        assert!(k.wait().unwrap().success(), "rank {rank}");
    }
}

#[test]
fn local_peer_thread_gone() {
    let mut groups = Group::local(2);
    let g1 = groups.pop().unwrap();
    let g0 = groups.pop().unwrap();
    drop(g1);
    let err = g0.all_reduce_sum_f32(&mut [1.0]).unwrap_err();
    assert_eq!(err.to_string(), "peer 1 at local:1 is gone: its thread ended");
}
