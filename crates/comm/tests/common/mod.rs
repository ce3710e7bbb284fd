//! Helpers shared by the integration tests: real worlds over every transport.
#![allow(dead_code)]

use shardlm_comm::{Group, ShmConfig, TcpConfig, TcpTransport};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub const SECRET: &[u8] = b"test-cluster-secret";
pub const FINGERPRINT: u64 = 0x5eed_f00d;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Local,
    Tcp,
    Shm,
}

pub const KINDS: [Kind; 3] = [Kind::Local, Kind::Tcp, Kind::Shm];

/// Binds `n` loopback listeners on free ports.
pub fn listeners(n: usize) -> (Vec<TcpListener>, Vec<String>) {
    let ls: Vec<TcpListener> = (0..n).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let addrs = ls.iter().map(|l| l.local_addr().unwrap().to_string()).collect();
    (ls, addrs)
}

/// Free loopback ports for child processes (bound and released).
pub fn free_addrs(n: usize) -> Vec<String> {
    listeners(n).1
}

/// A fresh segment name, unique per process and call.
pub fn shm_name(tag: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!("test-{tag}-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

pub fn tcp_config(rank: usize, addrs: &[String]) -> TcpConfig {
    let mut cfg = TcpConfig::new(rank, addrs.to_vec(), SECRET, FINGERPRINT);
    cfg.connect_timeout = Duration::from_secs(20);
    cfg
}

/// Runs `f` on every rank of a fresh world of `n` ranks (one thread each) and
/// returns the results in rank order. `tweak` adjusts each TCP config.
pub fn run_tcp<T: Send>(n: usize, tweak: impl Fn(&mut TcpConfig) + Sync, f: impl Fn(Group) -> T + Sync) -> Vec<T> {
    let (ls, addrs) = listeners(n);
    std::thread::scope(|s| {
        let handles: Vec<_> = ls
            .into_iter()
            .enumerate()
            .map(|(rank, l)| {
                let (addrs, tweak, f) = (&addrs, &tweak, &f);
                s.spawn(move || {
                    let mut cfg = tcp_config(rank, addrs);
                    tweak(&mut cfg);
                    let t = TcpTransport::connect_with_listener(&cfg, l).expect("tcp connect");
                    f(Group::new(Arc::new(t)))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("rank panicked")).collect()
    })
}

pub fn run_shm<T: Send>(n: usize, f: impl Fn(Group) -> T + Sync) -> Vec<T> {
    let name = shm_name("w");
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let (name, f) = (&name, &f);
                s.spawn(move || {
                    let mut cfg = ShmConfig::new(name.clone(), rank, n, SECRET, FINGERPRINT);
                    cfg.ring_bytes = 64 << 10;
                    cfg.spin = Duration::from_micros(20);
                    f(Group::connect_shm(&cfg).expect("shm connect"))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("rank panicked")).collect()
    })
}

pub fn run_local<T: Send>(n: usize, f: impl Fn(Group) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let handles: Vec<_> = Group::local(n)
            .into_iter()
            .map(|g| {
                let f = &f;
                s.spawn(move || f(g))
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("rank panicked")).collect()
    })
}

pub fn run<T: Send>(kind: Kind, n: usize, f: impl Fn(Group) -> T + Sync) -> Vec<T> {
    match kind {
        Kind::Local => run_local(n, f),
        Kind::Tcp => run_tcp(n, |_| {}, f),
        Kind::Shm => run_shm(n, f),
    }
}

/// Rank `r`'s input: small multiples of 1/4, so sums are exact in any order.
pub fn input(rank: usize, len: usize) -> Vec<f32> {
    (0..len).map(|i| ((i * 7 + rank * 13) % 29) as f32 * 0.25 - 3.0).collect()
}

/// Inputs whose sums do depend on the order of addition.
pub fn messy(rank: usize, len: usize) -> Vec<f32> {
    (0..len).map(|i| ((i as f32 + 1.3) * (rank as f32 + 0.7)).sin() * 10f32.powi((i % 7) as i32 - 3)).collect()
}

pub fn expected_sum(n: usize, len: usize) -> Vec<f32> {
    let mut acc = vec![0.0f32; len];
    for r in 0..n {
        for (a, x) in acc.iter_mut().zip(input(r, len)) {
            *a += x;
        }
    }
    acc
}

/// Bytes unique to (rank, index).
pub fn bytes_of(rank: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 + rank * 7 + 1) as u8).collect()
}
