//! Two ranks in two network namespaces joined by two veth cables on two
//! subnets (scripts/netns/setup.sh --plain), one thread per rank moved into
//! its namespace with setns(2). A cable goes down while part of a striped
//! message is still on it and the rank that sent it has moved on to wait on
//! the other cable: the lost bytes must still arrive, over the other cable.
//!
//! Needs root and `ip`; skipped (with the reason) otherwise.

mod common;
use common::*;
use shardlm_comm::{Group, TcpTransport};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

const PORT: u16 = 7300;

struct Hosts(String);

impl Hosts {
    fn new(tag: &str, setup: &[&str]) -> Option<Hosts> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipping netns test: needs root for `ip netns`");
            return None;
        }
        let prefix = format!("shardlm-c{}{tag}-", std::process::id());
        let probe = format!("{prefix}probe");
        match Command::new("ip").args(["netns", "add", &probe]).output() {
            Err(e) => {
                eprintln!("skipping netns test: `ip` not runnable ({e})");
                return None;
            }
            Ok(o) if !o.status.success() => {
                eprintln!("skipping netns test: `ip netns add` refused: {}", String::from_utf8_lossy(&o.stderr).trim());
                return None;
            }
            Ok(_) => {
                let _ = Command::new("ip").args(["netns", "del", &probe]).status();
            }
        }
        let hosts = Hosts(prefix);
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/netns/setup.sh");
        let o = Command::new("bash").arg(script).args(["--prefix", &hosts.0]).args(setup).arg("2").output().unwrap();
        assert!(o.status.success(), "setup.sh: {}", String::from_utf8_lossy(&o.stderr));
        Some(hosts)
    }

    fn ns(&self, i: usize) -> String {
        format!("{}{i}", self.0)
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for i in 1..=2 {
            let _ = Command::new("ip").args(["netns", "del", &self.ns(i)]).status();
        }
    }
}

/// Moves the calling thread into namespace `ns`.
fn enter(ns: &str) {
    let f = std::fs::File::open(format!("/var/run/netns/{ns}")).unwrap();
    // SAFETY: a valid namespace fd; affects the calling thread only.
    assert_eq!(unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) }, 0, "setns {ns}");
}

#[test]
fn bytes_lost_with_a_cable_arrive_over_the_other() {
    lose_a_cable_under_a_stripe("s", None);
}

/// Rank 0 does not communicate at all for a while after sending: its
/// transport's watcher must take the new connection, before rank 1 gives up.
#[test]
fn a_silent_rank_still_takes_the_new_connection() {
    lose_a_cable_under_a_stripe("q", Some(Duration::from_secs(9)));
}

/// Rank 0 sends 1 MiB striped over both cables, then waits (on connection 0,
/// or first `silent` without any exchange) for rank 1's word that it arrived
/// intact; cable 2 goes down right after the send.
fn lose_a_cable_under_a_stripe(tag: &str, silent: Option<Duration>) {
    // Cable 2 is slow, so half of a 1 MiB stripe is still on it when it goes down.
    let Some(hosts) = Hosts::new(tag, &["--links", "2", "--plain", "--rates", "1gbit,20mbit"]) else { return };
    let peers = vec![format!("10.78.18.1:{PORT}"), format!("10.78.18.2:{PORT}")];
    let links = vec![
        vec!["10.78.18.1".to_string(), "10.79.18.1".to_string()],
        vec!["10.78.18.2".to_string(), "10.79.18.2".to_string()],
    ];
    let (sent_tx, sent_rx) = mpsc::channel::<()>();
    let (down_tx, down_rx) = mpsc::channel::<()>();
    let down_rx = std::sync::Mutex::new(down_rx);
    let big: Vec<u8> = (0..1 << 20).map(|i| (i * 7 + 3) as u8).collect();
    let start = Instant::now();
    let (r0, r1, down_at) = std::thread::scope(|s| {
        let rank = |r: usize, ns: String| {
            let (peers, links, big) = (&peers, &links, &big);
            let (sent_tx, down_rx) = (sent_tx.clone(), &down_rx);
            s.spawn(move || {
                enter(&ns);
                let l = std::net::TcpListener::bind(format!("0.0.0.0:{PORT}")).unwrap();
                let mut cfg = tcp_config(r, peers);
                cfg.links = links.clone();
                cfg.stripe_threshold = 4096;
                cfg.calibration_bytes = 0; // equal stripes; small messages on connection 0
                                           // Without the watcher, rank 1 would give up 5 + 3 s after the loss.
                cfg.resume_timeout = Duration::from_secs(3);
                let g = Group::new(Arc::new(TcpTransport::connect_with_listener(&cfg, l).expect("connect")));
                let mut x = vec![1.0f32; 16];
                g.all_reduce_sum_f32(&mut x).unwrap();
                if r == 0 {
                    g.send(1, big).unwrap();
                    sent_tx.send(()).unwrap();
                    if let Some(t) = silent {
                        std::thread::sleep(t);
                    }
                    // Now wait on connection 0 only: connection 1 is idle here.
                    let mut ack = [0u8; 1];
                    g.recv(1, &mut ack).unwrap();
                    ack[0]
                } else {
                    down_rx.lock().unwrap().recv().unwrap();
                    let down = Instant::now();
                    let mut got = vec![0u8; big.len()];
                    g.recv(0, &mut got).unwrap();
                    let ok = u8::from(got == *big);
                    eprintln!("rank 1 has the message {:?} after the cable went down", down.elapsed());
                    // Noticed within 5 s (keep-alive), continued at once: also
                    // when rank 0 is silent (else 9 s, when it speaks again).
                    assert!(down.elapsed() < Duration::from_secs(8), "rank 1 waited {:?}", down.elapsed());
                    g.send(0, &[ok]).unwrap();
                    ok
                }
            })
        };
        let h0 = rank(0, hosts.ns(1));
        let h1 = rank(1, hosts.ns(2));
        sent_rx.recv_timeout(Duration::from_secs(30)).expect("rank 0 sent");
        let o = Command::new("ip").args(["-n", &hosts.ns(1), "link", "set", "l2h2", "down"]).output().unwrap();
        assert!(o.status.success(), "link down: {}", String::from_utf8_lossy(&o.stderr));
        let down_at = Instant::now();
        down_tx.send(()).unwrap();
        (h0.join().unwrap(), h1.join().unwrap(), down_at)
    });
    assert_eq!((r0, r1), (1, 1), "rank 1 got the message intact, and rank 0 heard so");
    let pause = down_at.elapsed();
    assert!(pause < Duration::from_secs(20), "took {pause:?} after the cable went down");
    eprintln!("cable down; done {pause:?} later ({:?} in all)", start.elapsed());
}

#[test]
fn a_cable_down_at_start_is_stood_in_for() {
    let Some(hosts) = Hosts::new("d", &["--links", "2", "--plain"]) else { return };
    let o = Command::new("ip").args(["-n", &hosts.ns(1), "link", "set", "l2h2", "down"]).output().unwrap();
    assert!(o.status.success(), "link down: {}", String::from_utf8_lossy(&o.stderr));
    let peers = vec![format!("10.78.18.1:{PORT}"), format!("10.78.18.2:{PORT}")];
    let links = vec![
        vec!["10.78.18.1".to_string(), "10.79.18.1".to_string()],
        vec!["10.78.18.2".to_string(), "10.79.18.2".to_string()],
    ];
    let start = Instant::now();
    let out: Vec<(Vec<f32>, Vec<String>)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let (peers, links, ns) = (&peers, &links, hosts.ns(r + 1));
                s.spawn(move || {
                    enter(&ns);
                    let l = std::net::TcpListener::bind(format!("0.0.0.0:{PORT}")).unwrap();
                    let mut cfg = tcp_config(r, peers);
                    cfg.links = links.clone();
                    cfg.stripe_threshold = 4096;
                    let t = TcpTransport::connect_with_listener(&cfg, l).expect("connect with a cable down");
                    let remotes = t.cables(1 - r).iter().map(|c| c.remote.clone()).collect();
                    let g = Group::new(Arc::new(t));
                    let mut x = input(r, 300_000);
                    g.all_reduce_sum_f32(&mut x).unwrap();
                    (x, remotes)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, (x, remotes)) in out.iter().enumerate() {
        assert_eq!(*x, expected_sum(2, 300_000), "rank {r}");
        // Both connections run over cable 1.
        assert_eq!(remotes.len(), 2);
        assert!(remotes.iter().all(|a| a.starts_with("10.78.18.")), "rank {r}: {remotes:?}");
    }
    assert!(start.elapsed() < Duration::from_secs(15), "connecting took {:?}", start.elapsed());
}
