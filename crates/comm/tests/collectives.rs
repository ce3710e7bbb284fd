//! Every collective against straightforward expected values, for groups of
//! 1 to 4 ranks, over the in-process, TCP (loopback) and shared-memory
//! transports, on every algorithm path (direct, recursive doubling, ring).

mod common;

use common::*;
use shardlm_comm::{chunk_range, Group, Tuning, Wire};

/// Tunings that force each all-reduce path.
fn tunings() -> [(&'static str, Tuning); 3] {
    [
        ("default", Tuning::default()),
        ("ring", Tuning { small_bytes: 0, ..Tuning::default() }),
        ("doubling", Tuning { direct_max_ranks: 1, ..Tuning::default() }),
    ]
}

/// Runs every collective on `g`, asserting exact results; returns the
/// order-sensitive all-reduce results so the caller can compare ranks.
fn exercise(g: Group) -> Vec<Vec<f32>> {
    let (n, r) = (g.size(), g.rank());
    let mut digests = Vec::new();
    for (name, tuning) in tunings() {
        let g = g.clone().with_tuning(tuning);
        for len in [0, 1, 3, 7, 100, 5000, 20_001] {
            let mut x = input(r, len);
            g.all_reduce_sum_f32(&mut x).unwrap();
            assert_eq!(x, expected_sum(n, len), "all_reduce {name} len {len} n {n} rank {r}");
        }
        for len in [5, 20_001] {
            let mut x = messy(r, len);
            g.all_reduce_sum_f32(&mut x).unwrap();
            digests.push(x);
            // Values of similar magnitude (|x| <= 10): each quantisation errs by
            // at most amax/254, and a value is quantised at most n times.
            let wave =
                |k: usize| -> Vec<f32> { (0..len).map(|i| 10.0 * ((i * (k + 2)) as f32 * 0.37).sin()).collect() };
            let mut q = wave(r);
            g.all_reduce_sum_f32_wire(&mut q, Wire::Q8).unwrap();
            let exact: Vec<f32> = (0..n).map(wave).fold(vec![0.0; len], |mut a, v| {
                a.iter_mut().zip(v).for_each(|(a, v)| *a += v);
                a
            });
            let tol = (n * n) as f32 * 10.0 / 254.0 + 1e-4;
            for (i, (a, b)) in q.iter().zip(&exact).enumerate() {
                assert!((a - b).abs() <= tol, "q8 {name} len {len} [{i}]: {a} vs {b}");
            }
            digests.push(q);
        }
        // reduce-scatter with chunks that do not divide evenly
        for len in [1, 10, 50_003] {
            let sum = expected_sum(n, len);
            let mine = chunk_range(len, n, r);
            let mut out = vec![f32::NAN; mine.len()];
            g.reduce_scatter_sum_f32(&input(r, len), &mut out).unwrap();
            assert_eq!(out, sum[mine], "reduce_scatter {name} len {len}");
        }
        for len in [0, 5, 40_000] {
            let mut all = vec![0u8; n * len];
            g.all_gather(&bytes_of(r, len), &mut all).unwrap();
            let want: Vec<u8> = (0..n).flat_map(|k| bytes_of(k, len)).collect();
            assert_eq!(all, want, "all_gather {name} len {len}");
        }
    }
    for root in 0..n {
        for len in [3, 100_000] {
            let mut buf = if r == root { bytes_of(root, len) } else { vec![0u8; len] };
            g.broadcast(root, &mut buf).unwrap();
            assert_eq!(buf, bytes_of(root, len), "broadcast root {root} len {len}");
        }
    }
    let mut gathered = vec![0f32; 3 * n];
    g.all_gather_f32(&[r as f32; 3], &mut gathered).unwrap();
    assert_eq!(gathered, (0..n).flat_map(|k| [k as f32; 3]).collect::<Vec<_>>());
    if n > 1 {
        // Pass a token around the ring, both with send+recv and send_recv.
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
    }
    g.barrier().unwrap();
    // Split by parity, ordered by descending rank.
    let sub = g.split((r % 2) as u32, (n - r) as u32).unwrap();
    let members: Vec<usize> = (0..n).rev().filter(|k| k % 2 == r % 2).collect();
    assert_eq!(sub.size(), members.len());
    assert_eq!(sub.rank(), members.iter().position(|&k| k == r).unwrap());
    let mut x = vec![r as f32; 9];
    sub.all_reduce_sum_f32(&mut x).unwrap();
    assert_eq!(x, vec![members.iter().sum::<usize>() as f32; 9]);
    sub.barrier().unwrap();
    g.barrier().unwrap();
    digests
}

fn check(kind: Kind) {
    for n in 1..=4 {
        let digests = run(kind, n, exercise);
        for (r, d) in digests.iter().enumerate() {
            assert!(d == &digests[0], "{kind:?} n={n}: rank {r} got different bits than rank 0");
        }
    }
}

#[test]
fn collectives_local() {
    check(Kind::Local);
}

#[test]
fn collectives_tcp() {
    check(Kind::Tcp);
}

#[test]
fn collectives_shm() {
    check(Kind::Shm);
}

#[test]
fn single_group_is_a_no_op() {
    let g = Group::single();
    assert_eq!((g.rank(), g.size()), (0, 1));
    let mut x = vec![1.5f32, -2.0];
    g.all_reduce_sum_f32(&mut x).unwrap();
    g.all_reduce_sum_f32_wire(&mut x, Wire::Q8).unwrap();
    assert_eq!(x, vec![1.5, -2.0]);
    let mut b = *b"abc";
    g.broadcast(0, &mut b).unwrap();
    g.barrier().unwrap();
    assert_eq!(&b, b"abc");
    assert!(g.send(0, b"x").is_err(), "a group of one has nobody to send to");
}

#[test]
fn q8_group_default_wire() {
    let out = run_local(3, |g| {
        let g = g.with_wire(Wire::Q8);
        let mut x = messy(g.rank(), 300);
        g.all_reduce_sum_f32(&mut x).unwrap();
        x
    });
    assert!(out.iter().all(|x| x == &out[0]));
}
