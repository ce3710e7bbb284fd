//! The MPI transport across real processes (feature `mpi`).
//!
//! Each test launches this test binary under `mpirun` (2 or 3 ranks), running
//! only itself (`--exact`); inside `mpirun` the same test sees the launcher's
//! environment and plays its rank instead. Needs `mpirun` on the PATH (set
//! `SHARDLM_MPIRUN` to use another one).
#![cfg(feature = "mpi")]

mod common;

use common::*;
use shardlm_comm::bootstrap::Bootstrap;
use shardlm_comm::{chunk_range, CommError, Group, Tuning, Wire};
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Whether this process is a rank started by mpirun.
fn is_rank() -> bool {
    std::env::var_os("OMPI_COMM_WORLD_SIZE").is_some() || std::env::var_os("PMIX_RANK").is_some()
}

/// Runs test `name` of this binary as `n` MPI ranks with extra environment;
/// returns whether mpirun succeeded, and everything it printed.
fn mpirun(name: &str, n: usize, env: &[(&str, &str)]) -> (bool, String) {
    let launcher = std::env::var("SHARDLM_MPIRUN").unwrap_or_else(|_| "mpirun".into());
    let exe = std::env::current_exe().expect("test binary path");
    let mut cmd = Command::new(&launcher);
    cmd.args([
        "-np",
        &n.to_string(),
        "--allow-run-as-root",
        "--oversubscribe",
        "--mca",
        "btl",
        "tcp,self",
        "--mca",
        "btl_tcp_if_include",
        "lo",
    ])
    .arg(&exe)
    .args(["--exact", name, "--nocapture", "--test-threads=1"])
    .envs(env.iter().copied())
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot run {launcher:?} (install OpenMPI): {e}"));
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let deadline = Instant::now() + Duration::from_secs(240);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if Instant::now() > deadline {
            // SIGTERM lets mpirun take its ranks down with it.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            std::thread::sleep(Duration::from_secs(5));
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = format!("{}{}", out.join().unwrap(), err.join().unwrap());
    eprintln!("--- mpirun -np {n} {name} ---\n{text}--- end ---");
    assert!(status.is_some(), "mpirun -np {n} {name} timed out");
    (status.unwrap().success(), text)
}

/// Launches `name` on `n` ranks and expects every rank to finish `body`.
fn launch_or_run(name: &str, n: usize, body: fn(Group)) {
    if is_rank() {
        let b = Bootstrap::from_env(FINGERPRINT).expect("bootstrap");
        assert!(matches!(b, Bootstrap::Mpi(_)), "under mpirun, from_env must choose MPI: {b:?}");
        let g = Group::from_env(FINGERPRINT).expect("join the MPI world");
        let (r, size) = (g.rank(), g.size());
        body(g);
        println!("mpi-rank-ok {r}/{size}");
        return;
    }
    let (ok, text) = mpirun(name, n, &[]);
    assert!(ok, "mpirun -np {n} {name} failed");
    for r in 0..n {
        assert!(text.contains(&format!("mpi-rank-ok {r}/{n}")), "rank {r} of {n} did not finish");
    }
}

/// Every collective against exact expected values, on every algorithm path.
fn collectives(g: Group) {
    let (n, r) = (g.size(), g.rank());
    assert_eq!(n, std::env::var("OMPI_COMM_WORLD_SIZE").unwrap().parse::<usize>().unwrap());
    for p in (0..n).filter(|&p| p != r) {
        assert!(g.transport().peer_addr(p).starts_with("mpi:"), "{}", g.transport().peer_addr(p));
    }
    let tunings = [
        Tuning::default(),
        Tuning { small_bytes: 0, ..Tuning::default() },
        Tuning { direct_max_ranks: 1, ..Tuning::default() },
    ];
    let mut digest = Vec::new();
    for tuning in tunings {
        let g = g.clone().with_tuning(tuning);
        for len in [0, 1, 7, 5000, 100_003] {
            let mut x = input(r, len);
            g.all_reduce_sum_f32(&mut x).unwrap();
            assert_eq!(x, expected_sum(n, len), "all_reduce {tuning:?} len {len}");
        }
        for len in [5, 20_001] {
            let mut x = messy(r, len);
            g.all_reduce_sum_f32(&mut x).unwrap();
            digest.extend(x.iter().map(|v| v.to_bits()));
            let mut q = messy(r, len);
            g.all_reduce_sum_f32_wire(&mut q, Wire::Q8).unwrap();
            digest.extend(q.iter().map(|v| v.to_bits()));
        }
        for len in [1, 10, 50_003] {
            let mine = chunk_range(len, n, r);
            let mut out = vec![f32::NAN; mine.len()];
            g.reduce_scatter_sum_f32(&input(r, len), &mut out).unwrap();
            assert_eq!(out, expected_sum(n, len)[mine], "reduce_scatter {tuning:?} len {len}");
        }
        for len in [0, 5, 40_000] {
            let mut all = vec![0u8; n * len];
            g.all_gather(&bytes_of(r, len), &mut all).unwrap();
            let want: Vec<u8> = (0..n).flat_map(|k| bytes_of(k, len)).collect();
            assert_eq!(all, want, "all_gather {tuning:?} len {len}");
        }
        for root in 0..n {
            for len in [3, 100_000] {
                let mut buf = if r == root { bytes_of(root, len) } else { vec![0u8; len] };
                g.broadcast(root, &mut buf).unwrap();
                assert_eq!(buf, bytes_of(root, len), "broadcast {tuning:?} root {root} len {len}");
            }
        }
    }
    // All ranks must hold bit-identical order-sensitive sums.
    let mine: Vec<u8> = digest.iter().flat_map(|b| b.to_le_bytes()).collect();
    let mut all = vec![0u8; n * mine.len()];
    g.all_gather(&mine, &mut all).unwrap();
    for k in 0..n {
        assert!(all[k * mine.len()..(k + 1) * mine.len()] == mine[..], "rank {k} summed differently from rank {r}");
    }
    // Point to point: a token around the ring, and 3 MiB messages (MPI's
    // rendezvous protocol) both ways at once.
    let (right, left) = ((r + 1) % n, (r + n - 1) % n);
    let mut got = [0u8; 4];
    g.send_recv(right, &(r as u32).to_le_bytes(), left, &mut got).unwrap();
    assert_eq!(u32::from_le_bytes(got) as usize, left);
    if r == 0 {
        g.send(1, b"ping").unwrap();
        g.recv(n - 1, &mut got).unwrap();
        assert_eq!(&got, b"ping");
    } else {
        g.recv(r - 1, &mut got).unwrap();
        g.send((r + 1) % n, &got).unwrap();
    }
    let big = bytes_of(r, 3 << 20);
    let mut from_left = vec![0u8; 3 << 20];
    g.send_recv(right, &big, left, &mut from_left).unwrap();
    assert!(from_left == bytes_of(left, 3 << 20), "3 MiB from rank {left}");
    g.barrier().unwrap();
    let sub = g.split((r % 2) as u32, (n - r) as u32).unwrap();
    let members: Vec<usize> = (0..n).rev().filter(|k| k % 2 == r % 2).collect();
    assert_eq!((sub.size(), sub.rank()), (members.len(), members.iter().position(|&k| k == r).unwrap()));
    let mut x = vec![r as f32; 9];
    sub.all_reduce_sum_f32(&mut x).unwrap();
    assert_eq!(x, vec![members.iter().sum::<usize>() as f32; 9]);
    // Latency of a decode-sized all-reduce (4 KiB), for the log.
    let mut x = vec![1.0f32; 1024];
    g.barrier().unwrap();
    let t = Instant::now();
    for _ in 0..200 {
        g.all_reduce_sum_f32(&mut x).unwrap();
    }
    if r == 0 {
        println!("mpi all_reduce 4 KiB x{n}: {:.1} us", t.elapsed().as_secs_f64() * 1e6 / 200.0);
    }
    g.barrier().unwrap();
    // Exact lengths, last: an error is fatal to the transport. Ranks 1 and 2
    // expect 20 bytes and get 10. (A *longer* message, which MPI reports as
    // MPI_ERR_TRUNCATE, is not exercised: in two of five CI runs with 3 ranks
    // on 2 cores, OpenMPI's receive of it never completed. See the note in
    // transport/mpi.rs.)
    match r {
        0 => {
            for p in 1..n.min(3) {
                g.send(p, &[p as u8; 10]).unwrap();
            }
        }
        1 | 2 => {
            let mut buf = [0u8; 20];
            let e = g.recv(0, &mut buf).unwrap_err();
            assert!(matches!(e, CommError::Protocol { rank: 0, .. }), "{e}");
            assert!(e.to_string().contains("it sent 10 bytes where 20 were expected"), "{e}");
            assert_eq!(g.send(0, b"x").unwrap_err(), e, "a failed transport stays failed");
        }
        _ => {}
    }
}

#[test]
fn collectives_over_mpi_2_ranks() {
    launch_or_run("collectives_over_mpi_2_ranks", 2, collectives);
}

#[test]
fn collectives_over_mpi_3_ranks() {
    launch_or_run("collectives_over_mpi_3_ranks", 3, collectives);
}

#[test]
fn mismatched_models_are_refused() {
    const NAME: &str = "mismatched_models_are_refused";
    if is_rank() {
        let rank: usize = std::env::var("OMPI_COMM_WORLD_RANK").unwrap().parse().unwrap();
        let fp = if rank == 1 { 0xbad } else { FINGERPRINT };
        match Group::from_env(fp) {
            Ok(_) => println!("rank {rank} joined a mixed world"),
            Err(e) => {
                println!("rank {rank} refused: {e}");
                // Like the CLI: a failing rank exits non-zero (and so skips MPI_Finalize).
                std::process::exit(3);
            }
        }
        return;
    }
    let (ok, text) = mpirun(NAME, 2, &[]);
    assert!(!ok, "a mixed world must fail");
    assert!(!text.contains("joined a mixed world"), "{text}");
    assert!(text.contains("rank 0 refused: peer 1 at mpi:") && text.contains("has model fingerprint 0000000000000bad"));
    assert!(text.contains("rank 1 refused: peer 0 at mpi:"), "{text}");
}
