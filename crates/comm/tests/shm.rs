//! Shared-memory specifics: refusals, stale segments, messages larger than
//! the rings, and cleanup of /dev/shm.

mod common;

use common::*;
use shardlm_comm::{CommError, Group, ShmConfig};
use std::path::Path;
use std::time::Duration;

fn config(name: &str, rank: usize, size: usize) -> ShmConfig {
    let mut cfg = ShmConfig::new(name, rank, size, SECRET, FINGERPRINT);
    cfg.ring_bytes = 4096;
    cfg.connect_timeout = Duration::from_secs(5);
    cfg
}

fn pair(tweak: impl Fn(&mut ShmConfig) + Sync) -> Vec<Result<Group, CommError>> {
    let name = shm_name("pair");
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|rank| {
                let (name, tweak) = (&name, &tweak);
                s.spawn(move || {
                    let mut cfg = config(name, rank, 2);
                    if rank == 1 {
                        tweak(&mut cfg);
                    }
                    Group::connect_shm(&cfg)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn wrong_secret_is_refused_on_both_sides() {
    let r = pair(|c| c.secret = b"nope".to_vec());
    for (rank, res) in r.into_iter().enumerate() {
        let msg = res.unwrap_err().to_string();
        let other = 1 - rank;
        assert!(
            msg.starts_with(&format!("peer {other} at shm:test-pair-"))
                && msg.ends_with("failed authentication (wrong cluster secret)"),
            "rank {rank}: {msg}"
        );
    }
}

#[test]
fn wrong_version_is_refused_on_both_sides() {
    let (v, w) = (shardlm_comm::PROTOCOL_VERSION, shardlm_comm::PROTOCOL_VERSION + 1);
    let r = pair(|c| c.protocol_version = w);
    let m0 = r[0].as_ref().unwrap_err().to_string();
    let m1 = r[1].as_ref().unwrap_err().to_string();
    assert!(m0.ends_with(&format!("speaks protocol v{w}, we speak v{v}")), "{m0}");
    assert!(m1.ends_with(&format!("speaks protocol v{v}, we speak v{w}")), "{m1}");
}

#[test]
fn messages_larger_than_the_ring_stream_through() {
    let name = shm_name("big");
    std::thread::scope(|s| {
        for rank in 0..2 {
            let name = &name;
            s.spawn(move || {
                let g = Group::connect_shm(&config(name, rank, 2)).unwrap();
                // 4 KiB rings, 1 MiB messages in both directions at once.
                let mine = bytes_of(rank, 1 << 20);
                let mut got = vec![0u8; 1 << 20];
                g.send_recv(1 - rank, &mine, 1 - rank, &mut got).unwrap();
                assert_eq!(got, bytes_of(1 - rank, 1 << 20));
                let mut x = input(rank, 300_000);
                g.all_reduce_sum_f32(&mut x).unwrap();
                assert_eq!(x, expected_sum(2, 300_000));
            });
        }
    });
}

#[test]
fn stale_segment_is_replaced_and_file_is_removed() {
    let name = shm_name("stale");
    let path = Path::new("/dev/shm").join(format!("shardlm-{name}"));
    // A crashed run's leftovers: right size, marked ready, but nobody holds rank 0's lock.
    let cfg = config(&name, 1, 2);
    std::fs::write(&path, vec![0xffu8; 4096 + 4 * (512 + 4096)]).unwrap();
    let out = std::thread::scope(|s| {
        let late_rank0 = s.spawn(|| {
            std::thread::sleep(Duration::from_millis(200));
            Group::connect_shm(&config(&name, 0, 2))
        });
        let r1 = Group::connect_shm(&cfg);
        (late_rank0.join().unwrap(), r1)
    });
    let (g0, g1) = (out.0.unwrap(), out.1.unwrap());
    assert!(!path.exists(), "rank 0 removes the file once everyone is attached");
    std::thread::scope(|s| {
        s.spawn(|| g1.barrier().unwrap());
        g0.barrier().unwrap();
    });
}

#[test]
fn absent_rank_is_reported() {
    let name = shm_name("absent");
    let mut cfg = config(&name, 0, 3);
    cfg.connect_timeout = Duration::from_millis(300);
    let msg = Group::connect_shm(&cfg).unwrap_err().to_string();
    assert!(msg.contains("peer 1") && msg.contains("never joined"), "{msg}");
}

/// A peer that sends its last message and closes its group at once (a
/// rank's report at shutdown, then exit) is drained, never called lost: the
/// receiver decides "gone" only on a liveness reading taken before its last
/// look at the ring. The receiver parks at once (`spin` 0) so it checks
/// liveness as often as it can; the sender's timing varies per round.
#[test]
fn a_last_message_before_close_is_received() {
    for round in 0..200u64 {
        let name = shm_name("last");
        std::thread::scope(|s| {
            for rank in 0..2 {
                let name = &name;
                s.spawn(move || {
                    let mut cfg = config(name, rank, 2);
                    cfg.spin = Duration::ZERO;
                    let g = Group::connect_shm(&cfg).unwrap();
                    if rank == 1 {
                        std::thread::sleep(Duration::from_micros(round * 37 % 400));
                        g.send(0, &bytes_of(1, 64)).unwrap();
                        drop(g);
                    } else {
                        let mut got = vec![0u8; 64];
                        g.recv(1, &mut got).unwrap_or_else(|e| panic!("round {round}: {e}"));
                        assert_eq!(got, bytes_of(1, 64));
                    }
                });
            }
        });
    }
}
