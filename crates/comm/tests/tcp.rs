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
    let (v, w) = (shardlm_comm::PROTOCOL_VERSION, shardlm_comm::PROTOCOL_VERSION + 1);
    let (addrs, r) = bootstrap_pair(|c| c.protocol_version = w);
    assert_eq!(
        r[0].as_ref().unwrap_err().to_string(),
        format!("peer 1 at {} speaks protocol v{w}, we speak v{v}", addrs[1])
    );
    assert_eq!(
        r[1].as_ref().unwrap_err().to_string(),
        format!("peer 0 at {} speaks protocol v{v}, we speak v{w}", addrs[0])
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

/// Two ranks on loopback, each with two "cables" (127.0.0.x addresses);
/// `tweak` adjusts each rank's config. Listeners are on every interface, as with real cables.
fn cable_pair<T: Send>(
    tweak: impl Fn(usize, &mut shardlm_comm::TcpConfig) + Sync,
    f: impl Fn(Result<Group, CommError>) -> T + Sync,
) -> Vec<T> {
    let ls: Vec<_> = (0..2).map(|_| std::net::TcpListener::bind("0.0.0.0:0").unwrap()).collect();
    let addrs: Vec<String> = ls.iter().map(|l| format!("127.0.0.1:{}", l.local_addr().unwrap().port())).collect();
    let links = vec![
        vec!["127.0.0.1".to_string(), "127.0.0.3".to_string()],
        vec!["127.0.0.2".to_string(), "127.0.0.4".to_string()],
    ];
    std::thread::scope(|s| {
        let handles: Vec<_> = ls
            .into_iter()
            .enumerate()
            .map(|(rank, l)| {
                let (addrs, links, tweak, f) = (&addrs, &links, &tweak, &f);
                s.spawn(move || {
                    let mut cfg = tcp_config(rank, addrs);
                    cfg.links = links.clone();
                    cfg.stripe_threshold = 4096;
                    cfg.calibration_bytes = 256 << 10;
                    tweak(rank, &mut cfg);
                    f(TcpTransport::connect_with_listener(&cfg, l).map(|t| Group::new(Arc::new(t))))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn each_connection_dials_its_own_cable() {
    let out = cable_pair(
        |_, _| {},
        |g| {
            let g = g.expect("connect over two cables");
            let t = g.transport();
            let peer = 1 - g.rank();
            let lines = t.cable_report();
            assert_eq!(lines.len(), 2, "one line per connection: {lines:?}");
            let r = g.rank();
            for len in [10, 5000, 300_001] {
                let mut x = input(r, len);
                g.all_reduce_sum_f32(&mut x).unwrap();
                assert_eq!(x, expected_sum(2, len), "len {len}");
            }
            let big = bytes_of(r, 1 << 20);
            let mut got = vec![0u8; 1 << 20];
            g.send_recv(peer, &big, peer, &mut got).unwrap();
            assert_eq!(got, bytes_of(peer, 1 << 20));
            lines
        },
    );
    // Connection k runs from our cable k to the peer's cable k: 127.0.0.1/.2, then .3/.4.
    for (rank, lines) in out.iter().enumerate() {
        let (a, b) = if rank == 0 { ("127.0.0.1", "127.0.0.2") } else { ("127.0.0.2", "127.0.0.1") };
        assert!(lines[0].contains(&format!("{a}:")) && lines[0].contains(&format!("-> {b}:")), "{lines:?}");
        let (a, b) = if rank == 0 { ("127.0.0.3", "127.0.0.4") } else { ("127.0.0.4", "127.0.0.3") };
        assert!(lines[1].contains(&format!("{a}:")) && lines[1].contains(&format!("-> {b}:")), "{lines:?}");
        assert!(lines.iter().any(|l| l.contains("small messages")), "{lines:?}");
    }
}

#[test]
fn different_connection_counts_are_refused() {
    let out = cable_pair(
        |r, c| {
            c.connections_per_peer = if r == 1 { 3 } else { 0 };
            c.connect_timeout = Duration::from_secs(2);
        },
        |g| g.map(|_| ()).unwrap_err().to_string(),
    );
    assert!(out[0].contains("it opens 3 connections to us, we expect 2"), "{}", out[0]);
}

#[test]
fn a_cable_address_not_on_this_host_is_named() {
    let out = cable_pair(
        |_, c| {
            c.links[1][1] = "192.0.2.7".into();
            c.connect_timeout = Duration::from_millis(800);
        },
        |g| g.map(|_| ()).unwrap_err().to_string(),
    );
    assert!(out[1].contains("from 192.0.2.7"), "{}", out[1]);
    assert!(out[1].contains("could not connect to peer 0 at 127.0.0.1:"), "{}", out[1]);
}
