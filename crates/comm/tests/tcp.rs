//! TCP specifics: striping, ring topology, and refusals at the handshake.

mod common;

use common::*;
use shardlm_comm::{CommError, Group, TcpTransport, Topology, Wire};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[test]
fn striping_over_two_connections() {
    let out = run_tcp(
        3,
        |c| {
            c.connections_per_peer = 2;
            c.stripe_threshold = 4096;
        },
        |g| {
            let r = g.rank();
            // Large and odd-sized messages are cut in two stripes; small ones are not.
            for len in [10, 4095, 4096, 4097, 300_001] {
                let mut x = input(r, len);
                g.all_reduce_sum_f32(&mut x).unwrap();
                assert_eq!(x, expected_sum(3, len), "len {len}");
            }
            let big = bytes_of(r, 1 << 20);
            let mut got = vec![0u8; 1 << 20];
            g.send_recv((r + 1) % 3, &big, (r + 2) % 3, &mut got).unwrap();
            assert_eq!(got, bytes_of((r + 2) % 3, 1 << 20));
            let mut q = messy(r, 100_000);
            g.all_reduce_sum_f32_wire(&mut q, Wire::Q8).unwrap();
            q
        },
    );
    assert!(out.iter().all(|q| q == &out[0]), "ranks disagree");
}

#[test]
fn ring_topology_uses_ring_algorithms() {
    run_tcp(
        5,
        |c| c.topology = Topology::Ring,
        |g| {
            let (n, r) = (g.size(), g.rank());
            assert!(!g.transport().full_mesh());
            for len in [1, 8, 2048, 70_001] {
                let mut x = input(r, len);
                g.all_reduce_sum_f32(&mut x).unwrap();
                assert_eq!(x, expected_sum(n, len));
            }
            let mut all = vec![0u8; 5 * n];
            g.all_gather(&bytes_of(r, 5), &mut all).unwrap();
            assert_eq!(all, (0..n).flat_map(|k| bytes_of(k, 5)).collect::<Vec<_>>());
            let mut b = if r == 3 { b"hello".to_vec() } else { vec![0; 5] };
            g.broadcast(3, &mut b).unwrap();
            assert_eq!(b, b"hello");
            g.barrier().unwrap();
            // Non-neighbours are refused with a clear error, not a hang.
            if r == 0 {
                let err = g.send(2, b"x").unwrap_err();
                assert!(err.to_string().contains("no connection to rank 2"), "{err}");
            }
        },
    );
}

/// Runs a 2-rank bootstrap where rank 1 gets `tweak`; returns both results.
fn bootstrap_pair(tweak: impl Fn(&mut shardlm_comm::TcpConfig) + Sync) -> (Vec<String>, Vec<Result<(), CommError>>) {
    let (ls, addrs) = listeners(2);
    let results = std::thread::scope(|s| {
        let handles: Vec<_> = ls
            .into_iter()
            .enumerate()
            .map(|(rank, l)| {
                let (addrs, tweak) = (&addrs, &tweak);
                s.spawn(move || {
                    let mut cfg = tcp_config(rank, addrs);
                    cfg.connect_timeout = Duration::from_secs(5);
                    if rank == 1 {
                        tweak(&mut cfg);
                    }
                    TcpTransport::connect_with_listener(&cfg, l).map(|_| ())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    (addrs, results)
}

#[test]
fn wrong_secret_is_refused_on_both_sides() {
    let start = Instant::now();
    let (addrs, r) = bootstrap_pair(|c| c.secret = b"not-the-secret".to_vec());
    assert_eq!(
        r[0].as_ref().unwrap_err().to_string(),
        format!("peer 1 at {} failed authentication (wrong cluster secret)", addrs[1])
    );
    assert_eq!(
        r[1].as_ref().unwrap_err().to_string(),
        format!("peer 0 at {} failed authentication (wrong cluster secret)", addrs[0])
    );
    assert!(start.elapsed() < Duration::from_secs(3), "refusal must be prompt");
}

#[test]
fn wrong_version_is_refused_on_both_sides() {
    let (addrs, r) = bootstrap_pair(|c| c.protocol_version = 2);
    assert_eq!(
        r[0].as_ref().unwrap_err().to_string(),
        format!("peer 1 at {} speaks protocol v2, we speak v1", addrs[1])
    );
    assert_eq!(
        r[1].as_ref().unwrap_err().to_string(),
        format!("peer 0 at {} speaks protocol v1, we speak v2", addrs[0])
    );
}

#[test]
fn wrong_model_is_refused_on_both_sides() {
    let (_, r) = bootstrap_pair(|c| c.fingerprint = 42);
    for e in r {
        let e = e.unwrap_err();
        assert!(matches!(e, CommError::FingerprintMismatch { .. }), "{e}");
        assert!(e.to_string().contains("model fingerprint"), "{e}");
    }
}

#[test]
fn missing_peer_times_out_with_its_name() {
    let (ls, addrs) = listeners(2);
    drop(ls);
    let mut cfg = tcp_config(1, &addrs);
    cfg.connect_timeout = Duration::from_millis(500);
    let start = Instant::now();
    let err = Group::connect_tcp(&cfg).unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(3));
    let msg = err.to_string();
    assert!(msg.starts_with(&format!("could not connect to peer 0 at {}", addrs[0])), "{msg}");
}

#[test]
fn strangers_do_not_break_bootstrap() {
    let (mut ls, addrs) = listeners(2);
    let l1 = ls.pop().unwrap();
    let l0 = ls.pop().unwrap();
    // Something that is not a shardlm process connects to rank 0 first.
    let stranger = std::net::TcpStream::connect(&addrs[0]).unwrap();
    std::io::Write::write_all(&mut &stranger, b"GET / HTTP/1.1\r\n\r\n").unwrap();
    std::thread::scope(|s| {
        let a = s
            .spawn(|| TcpTransport::connect_with_listener(&tcp_config(0, &addrs), l0).map(|t| Group::new(Arc::new(t))));
        let b = s
            .spawn(|| TcpTransport::connect_with_listener(&tcp_config(1, &addrs), l1).map(|t| Group::new(Arc::new(t))));
        let (a, b) = (a.join().unwrap().unwrap(), b.join().unwrap().unwrap());
        let t = s.spawn(move || {
            let mut x = [1.0f32];
            b.all_reduce_sum_f32(&mut x).unwrap();
            x
        });
        let mut x = [2.0f32];
        a.all_reduce_sum_f32(&mut x).unwrap();
        assert_eq!(x, [3.0]);
        assert_eq!(t.join().unwrap(), [3.0]);
    });
}

#[test]
fn mismatched_collectives_are_a_protocol_error() {
    let out = run_tcp(
        2,
        |c| c.op_timeout = Some(Duration::from_secs(5)),
        |g| {
            let mut x = vec![1.0f32; if g.rank() == 0 { 4 } else { 5 }];
            g.all_reduce_sum_f32(&mut x).unwrap_err().to_string()
        },
    );
    for msg in out {
        assert!(msg.contains("bytes where") || msg.contains("aborted"), "{msg}");
    }
}
