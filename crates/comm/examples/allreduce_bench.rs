//! All-reduce latency over real processes.
//!
//! ```text
//! cargo run --release -p shardlm-comm --example allreduce_bench -- \
//!     [--transports shm,tcp] [--ranks 2] [--iters 2000] \
//!     [--sizes 4096,8192,16384,1048576] [--wire f32|q8] [--conns 1] [--json]
//! ```
//!
//! This process is rank 0; it starts ranks 1.. as child processes of the same
//! executable, joined through the `SHARDLM_*` environment. Sizes are payload
//! bytes of `f32`. Each all-reduce is timed on rank 0 on its own, after a
//! barrier and a warm-up; the report gives percentiles in microseconds.
//!
//! With `--worker`, every rank is started by hand from the `SHARDLM_*`
//! environment (e.g. in network namespaces) and rank 0 prints the report.

use shardlm_comm::bootstrap::{launcher_env, ENV_CONNECTIONS, ENV_SHM, ENV_SIZE};
use shardlm_comm::{Bootstrap, Group, Wire};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const FINGERPRINT: u64 = 0xbe7c;

struct Args {
    transports: Vec<String>,
    ranks: usize,
    iters: usize,
    sizes: Vec<usize>,
    wire: Wire,
    conns: usize,
    json: bool,
    worker: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        transports: vec!["shm".into(), "tcp".into()],
        ranks: 2,
        iters: 2000,
        sizes: vec![4096, 8192, 16384, 1 << 20],
        wire: Wire::F32,
        conns: 1,
        json: false,
        worker: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--transports" => a.transports = value()?.split(',').map(str::to_string).collect(),
            "--ranks" => a.ranks = value()?.parse().map_err(|_| "--ranks: not a number")?,
            "--iters" => a.iters = value()?.parse().map_err(|_| "--iters: not a number")?,
            "--conns" => a.conns = value()?.parse().map_err(|_| "--conns: not a number")?,
            "--sizes" => {
                a.sizes = value()?
                    .split(',')
                    .map(|s| s.parse().map_err(|_| format!("--sizes: bad {s:?}")))
                    .collect::<Result<_, _>>()?
            }
            "--wire" => {
                a.wire = match value()?.as_str() {
                    "f32" => Wire::F32,
                    "q8" => Wire::Q8,
                    w => return Err(format!("--wire: {w:?} is not f32 or q8")),
                }
            }
            "--json" => a.json = true,
            "--worker" => a.worker = true,
            "--help" | "-h" => return Err("see the header of examples/allreduce_bench.rs".into()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if a.ranks < 2 {
        return Err("--ranks must be at least 2".into());
    }
    Ok(a)
}

fn iters_for(args: &Args, bytes: usize) -> usize {
    if bytes >= 256 << 10 {
        (args.iters / 10).max(50)
    } else {
        args.iters
    }
}

/// Runs the schedule; returns the per-iteration latencies of each size.
fn run(group: &Group, args: &Args) -> Result<Vec<Vec<Duration>>, shardlm_comm::CommError> {
    let mut out = Vec::new();
    for &bytes in &args.sizes {
        let n = iters_for(args, bytes);
        let mut x: Vec<f32> = (0..bytes / 4).map(|i| (i % 13) as f32).collect();
        for _ in 0..n / 10 + 5 {
            group.all_reduce_sum_f32_wire(&mut x, args.wire)?;
            x.iter_mut().for_each(|v| *v = 1.0);
        }
        group.barrier()?;
        let mut times = Vec::with_capacity(n);
        for _ in 0..n {
            let t = Instant::now();
            group.all_reduce_sum_f32_wire(&mut x, args.wire)?;
            times.push(t.elapsed());
        }
        group.barrier()?;
        out.push(times);
    }
    Ok(out)
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

fn main() {
    let mut args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("allreduce_bench: {e}");
            std::process::exit(2);
        }
    };
    if args.worker {
        let group = Bootstrap::from_env(FINGERPRINT).and_then(|b| b.connect()).unwrap_or_else(|e| {
            eprintln!("worker: {e}");
            std::process::exit(1)
        });
        args.ranks = group.size();
        match run(&group, &args) {
            Err(e) => {
                eprintln!("worker {}: {e}", group.rank());
                std::process::exit(1);
            }
            Ok(times) if group.rank() == 0 => {
                for line in group.transport().cable_report() {
                    eprintln!("{line}");
                }
                let conns = std::env::var(ENV_CONNECTIONS).unwrap_or_else(|_| "auto".into());
                report(&args, &conns, summarise(&args, "tcp", times))
            }
            Ok(_) => {}
        }
        return;
    }
    let mut results = Vec::new();
    for transport in &args.transports {
        let secret = format!("bench-{}-{}", std::process::id(), Instant::now().elapsed().as_nanos());
        let envs: Vec<Vec<(String, String)>> = match transport.as_str() {
            "tcp" => {
                let peers: Vec<String> = (0..args.ranks)
                    .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string())
                    .collect();
                (0..args.ranks)
                    .map(|r| {
                        let mut e = launcher_env(r, &peers, &secret);
                        e.push((ENV_CONNECTIONS.into(), args.conns.to_string()));
                        e
                    })
                    .collect()
            }
            "shm" => (0..args.ranks)
                .map(|r| {
                    let mut e = launcher_env(r, &[], &secret);
                    e.retain(|(k, _)| k != ENV_SIZE);
                    e.push((ENV_SIZE.into(), args.ranks.to_string()));
                    e.push((ENV_SHM.into(), format!("bench-{}", std::process::id())));
                    e
                })
                .collect(),
            other => {
                eprintln!("allreduce_bench: unknown transport {other:?} (shm or tcp)");
                std::process::exit(2);
            }
        };
        let mut kids: Vec<Child> = envs[1..]
            .iter()
            .map(|env| {
                Command::new(std::env::current_exe().unwrap())
                    .args(std::env::args().skip(1))
                    .arg("--worker")
                    .envs(env.iter().cloned())
                    .spawn()
                    .expect("spawn worker")
            })
            .collect();
        let vars: std::collections::HashMap<String, String> = envs[0].iter().cloned().collect();
        let group = Bootstrap::from_vars(|k| vars.get(k).cloned(), FINGERPRINT)
            .and_then(|b| b.connect())
            .unwrap_or_else(|e| panic!("rank 0 over {transport}: {e}"));
        let times = run(&group, &args).unwrap_or_else(|e| panic!("rank 0 over {transport}: {e}"));
        drop(group);
        for k in &mut kids {
            let _ = k.wait();
        }
        results.extend(summarise(&args, transport, times));
    }
    report(&args, &args.conns.to_string(), results);
}

/// Percentiles of each size's timings.
fn summarise(args: &Args, transport: &str, times: Vec<Vec<Duration>>) -> Vec<serde_json::Value> {
    let mut results = Vec::new();
    for (&bytes, mut t) in args.sizes.iter().zip(times) {
        t.sort();
        let mean = t.iter().map(Duration::as_secs_f64).sum::<f64>() / t.len() as f64 * 1e6;
        results.push(serde_json::json!({
            "transport": transport,
            "bytes": bytes,
            "iters": t.len(),
            "p10_us": pct(&t, 0.10),
            "median_us": pct(&t, 0.5),
            "p90_us": pct(&t, 0.9),
            "mean_us": mean,
            "bus_gbps": 2.0 * (args.ranks - 1) as f64 / args.ranks as f64 * bytes as f64 / pct(&t, 0.5) / 1e3,
        }));
    }
    results
}

fn report(args: &Args, conns: &str, results: Vec<serde_json::Value>) {
    let wire = format!("{:?}", args.wire).to_lowercase();
    if args.json {
        let doc = serde_json::json!({ "ranks": args.ranks, "wire": wire, "conns": conns, "results": results });
        println!("{doc}");
        return;
    }
    println!("all-reduce, {} ranks, wire {wire}", args.ranks);
    println!("{:<6} {:>9} {:>7} {:>9} {:>9} {:>9} {:>9}", "path", "bytes", "iters", "p10 µs", "median", "p90", "GB/s");
    for r in &results {
        println!(
            "{:<6} {:>9} {:>7} {:>9.2} {:>9.2} {:>9.2} {:>9.2}",
            r["transport"].as_str().unwrap(),
            r["bytes"].as_u64().unwrap(),
            r["iters"].as_u64().unwrap(),
            r["p10_us"].as_f64().unwrap(),
            r["median_us"].as_f64().unwrap(),
            r["p90_us"].as_f64().unwrap(),
            r["bus_gbps"].as_f64().unwrap()
        );
    }
}
