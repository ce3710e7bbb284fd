//! Ranks on separate "hosts": network namespaces made by scripts/netns/setup.sh,
//! each rank started by hand from the `SHARDLM_*` environment, talking TCP over a
//! veth cable. Rank 0's output must match the single-process run (pipeline
//! bit-identical, tensor within 1e-4 relative), and a rank with the wrong cluster
//! secret must be refused, with a clear line, on both sides. With two cables on
//! two subnets (nothing but the addresses), each connection must run over its
//! own cable and stripes follow the cables' speeds.
//!
//! Needs root and a kernel that allows `ip netns add` and veth devices; skipped
//! (with the reason) otherwise, e.g. in containers without CAP_SYS_ADMIN.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_shardlm");
const PORT: u16 = 7000;
const RUN_LIMIT: Duration = Duration::from_secs(180);

/// The variables that make a process a rank; cleared before setting ours so
/// that nothing from the test's own environment leaks in.
const WORLD_VARS: &[&str] = &[
    "SHARDLM_RANK",
    "SHARDLM_SIZE",
    "SHARDLM_PEERS",
    "SHARDLM_SECRET",
    "SHARDLM_SHM",
    "SHARDLM_CONNECTIONS",
    "SHARDLM_LINKS",
    "SHARDLM_CALIBRATE_BYTES",
    "SHARDLM_BIND",
    "SHARDLM_OP_TIMEOUT_MS",
    "SHARDLM_WEIGHTS",
    "SHARDLM_TEST_DIE_AFTER_STEPS",
    "SHARDLM_TEST_PAUSE_AFTER_STEPS",
];

/// Namespaces `{prefix}1..` made by setup.sh; torn down on drop, even when the test panics.
struct Hosts {
    prefix: String,
}

impl Hosts {
    /// Sets up `n` hosts joined by one cable each, or returns `None` (after saying
    /// why) when this machine can't make namespaces.
    fn new(tag: &str, n: usize) -> Option<Hosts> {
        Self::with(tag, n, &["--links", "1"])
    }

    /// Like [`Hosts::new`], with these options for setup.sh.
    fn with(tag: &str, n: usize, setup: &[&str]) -> Option<Hosts> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipping netns test: needs root for `ip netns`");
            return None;
        }
        let prefix = format!("shardlm-t{}{tag}-", std::process::id());
        if let Err(why) = probe(&prefix) {
            eprintln!("skipping netns test: this machine can't make network namespaces with veth cables: {why}");
            return None;
        }
        let hosts = Hosts { prefix };
        let o = Command::new("bash")
            .arg(script("setup.sh"))
            .args(["--prefix", &hosts.prefix])
            .args(setup)
            .arg(n.to_string())
            .output()
            .expect("run scripts/netns/setup.sh");
        assert!(o.status.success(), "setup.sh failed: {}{}", String::from_utf8_lossy(&o.stdout), stderr(&o));
        Some(hosts)
    }

    /// Namespace of host `i` (1-based; host i runs rank i-1).
    fn ns(&self, i: usize) -> String {
        format!("{}{i}", self.prefix)
    }

    fn world(&self, size: usize, connections: usize) -> World {
        let peers = (1..=size).map(|i| format!("10.77.0.{i}:{PORT}")).collect::<Vec<_>>().join(",");
        World { size, peers, connections, links: None }
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        let o = Command::new("bash").arg(script("teardown.sh")).args(["--prefix", &self.prefix, "--quiet"]).output();
        match o {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!("teardown.sh --prefix {} failed: {}", self.prefix, stderr(&o)),
            Err(e) => eprintln!("teardown.sh --prefix {}: {e}", self.prefix),
        }
        // Leave nothing behind, whatever the script did.
        if let Ok(o) = Command::new("ip").args(["netns", "list"]).output() {
            for line in String::from_utf8_lossy(&o.stdout).lines() {
                let name = line.split_whitespace().next().unwrap_or("");
                if name.starts_with(&self.prefix) {
                    let _ = Command::new("ip").args(["netns", "del", name]).status();
                }
            }
        }
    }
}

fn script(name: &str) -> PathBuf {
    repo().join("scripts/netns").join(name)
}

/// Can we add a namespace and a veth pair inside it? `Err` holds the refusal.
fn probe(prefix: &str) -> Result<(), String> {
    let ns = format!("{prefix}probe");
    let ip = |args: &[&str]| -> Result<(), String> {
        let o =
            Command::new("ip").args(args).output().map_err(|e| format!("`ip` not runnable ({e}); install iproute2"))?;
        if o.status.success() {
            Ok(())
        } else {
            Err(format!("`ip {}` said: {}", args.join(" "), stderr(&o).trim()))
        }
    };
    ip(&["netns", "add", &ns])?;
    let r = ip(&["-n", &ns, "link", "add", "pa", "type", "veth", "peer", "name", "pb"]);
    let _ = ip(&["netns", "del", &ns]);
    r
}

/// What every rank of a world is told besides its rank and secret.
struct World {
    size: usize,
    peers: String,
    /// TCP connections per peer (`--connections-per-peer` reaches only ranks a
    /// launcher starts); 0 leaves it to the ranks (one per cable).
    connections: usize,
    /// `SHARDLM_LINKS`, when set.
    links: Option<String>,
}

/// A rank process; killed on drop so that a failing test leaves nothing running.
struct Rank {
    child: Child,
    out: PathBuf,
    err: PathBuf,
}

struct Finished {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Rank {
    /// Starts `shardlm <args>` as `rank` of a world of `size` in namespace `ns`.
    fn start(dir: &Path, ns: &str, world: &World, rank: usize, secret: &str, args: &[&str]) -> Rank {
        Self::start_env(dir, ns, world, rank, secret, args, &[])
    }

    /// Like [`Rank::start`], with extra environment variables.
    fn start_env(
        dir: &Path,
        ns: &str,
        world: &World,
        rank: usize,
        secret: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Rank {
        let out = dir.join(format!("rank{rank}.out"));
        let err = dir.join(format!("rank{rank}.err"));
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns, BIN]).args(args);
        for v in WORLD_VARS {
            cmd.env_remove(v);
        }
        cmd.env("SHARDLM_RANK", rank.to_string())
            .env("SHARDLM_SIZE", world.size.to_string())
            .env("SHARDLM_PEERS", &world.peers)
            .env("SHARDLM_SECRET", secret)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap());
        if world.connections > 0 {
            cmd.env("SHARDLM_CONNECTIONS", world.connections.to_string());
        }
        if let Some(links) = &world.links {
            cmd.env("SHARDLM_LINKS", links);
        }
        cmd.envs(env.iter().copied());
        let child = cmd.spawn().expect("spawn ip netns exec");
        Rank { child, out, err }
    }

    /// Waits (at most [`RUN_LIMIT`]) for the rank to end.
    fn finish(mut self, what: &str) -> Finished {
        let start = Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if start.elapsed() > RUN_LIMIT {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("{what}: still running after {RUN_LIMIT:?}; stderr: {}", read(&self.err));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        Finished { status, stdout: read(&self.out), stderr: read(&self.err) }
    }
}

impl Drop for Rank {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

fn golden_ids(name: &str) -> String {
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture(name).join("golden.json")).unwrap()).unwrap();
    j["input_ids"].as_array().unwrap().iter().map(|v| v.to_string()).collect::<Vec<_>>().join(",")
}

fn run_args<'a>(model: &'a str, ids: &'a str, dump: &'a str, strategy: &'a str) -> Vec<&'a str> {
    vec![
        "run",
        "--model",
        model,
        "--prompt-ids",
        ids,
        "--max-tokens",
        "12",
        "--ignore-eos",
        "--json",
        "--threads",
        "1",
        "--strategy",
        strategy,
        "--dump-logits",
        dump,
    ]
}

/// Output ids from rank 0's JSON and the dumped prompt logits.
fn results(stdout: &str, dump: &Path) -> (Vec<u64>, Vec<f32>) {
    (common::output_ids(stdout.trim().as_bytes()), common::dumped_logits(dump))
}

#[test]
fn pipeline_and_tensor_across_namespaces_match_one_process() {
    let Some(hosts) = Hosts::new("m", 2) else { return };
    let dir = tempfile::tempdir().unwrap();
    let model = fixture("llama");
    let model = model.to_str().unwrap();
    let ids = golden_ids("llama");

    let want_dump = dir.path().join("single.safetensors");
    let mut single = Command::new(BIN);
    single.args(run_args(model, &ids, want_dump.to_str().unwrap(), "pipeline"));
    for v in WORLD_VARS {
        single.env_remove(v);
    }
    let o = single.output().expect("spawn shardlm");
    assert!(o.status.success(), "single process: {}", stderr(&o));
    let (want_ids, want) = results(&String::from_utf8_lossy(&o.stdout), &want_dump);

    for (strategy, conns) in [("pipeline", 1), ("tensor", 1), ("tensor", 2)] {
        let case = format!("{strategy}, {conns} connection(s) per peer");
        let world = hosts.world(2, conns);
        let dump = dir.path().join(format!("{strategy}{conns}.safetensors"));
        let args = run_args(model, &ids, dump.to_str().unwrap(), strategy);
        let r1 = Rank::start(dir.path(), &hosts.ns(2), &world, 1, "s3cret", &args);
        let r0 = Rank::start(dir.path(), &hosts.ns(1), &world, 0, "s3cret", &args);
        let f0 = r0.finish(&format!("rank 0 ({case})"));
        let f1 = r1.finish(&format!("rank 1 ({case})"));
        assert!(f0.status.success(), "{case}: rank 0 failed: {}", f0.stderr);
        assert!(f1.status.success(), "{case}: rank 1 failed: {}", f1.stderr);
        assert!(f1.stdout.trim().is_empty(), "{case}: rank 1 printed {:?}", f1.stdout);
        let (got_ids, got) = results(&f0.stdout, &dump);
        assert_eq!(got_ids, want_ids, "{case}: greedy output ids");
        if strategy == "pipeline" {
            assert!(got == want, "{case}: pipeline logits must be bit-identical (max rel {})", rel_diff(&want, &got));
        } else {
            let d = rel_diff(&want, &got);
            assert!(d <= 1e-4, "{case}: relative difference {d}");
        }
    }
}

#[test]
fn a_rank_with_the_wrong_secret_is_refused_on_both_sides() {
    let Some(hosts) = Hosts::new("s", 2) else { return };
    let dir = tempfile::tempdir().unwrap();
    let model = fixture("llama");
    let args = ["run", "--model", model.to_str().unwrap(), "--prompt-ids", "1,2,3", "--max-tokens", "2", "--json"];
    let world = hosts.world(2, 1);
    let start = Instant::now();
    let r1 = Rank::start(dir.path(), &hosts.ns(2), &world, 1, "the-wrong-one", &args);
    let r0 = Rank::start(dir.path(), &hosts.ns(1), &world, 0, "the-right-one", &args);
    let f0 = r0.finish("rank 0");
    let f1 = r1.finish("rank 1");
    assert!(start.elapsed() < Duration::from_secs(60), "refusal took {:?}", start.elapsed());
    for (f, who, other) in [(&f0, "rank 0", "peer 1 at 10.77.0.2:7000"), (&f1, "rank 1", "peer 0 at 10.77.0.1:7000")] {
        assert!(!f.status.success(), "{who} must fail; stdout {:?}", f.stdout);
        assert!(!f.stderr.contains("panicked"), "{who} panicked: {}", f.stderr);
        assert!(
            f.stderr.contains(&format!("{other} failed authentication (wrong cluster secret)")),
            "{who} must name the refused peer and the reason: {}",
            f.stderr
        );
        assert!(f.stdout.trim().is_empty(), "{who} printed {:?}", f.stdout);
    }
}

/// Bytes sent so far on device `dev` of namespace `ns` (sysfs counters).
fn tx_bytes(ns: &str, dev: &str) -> u64 {
    let o = Command::new("ip")
        .args(["netns", "exec", ns, "cat", &format!("/sys/class/net/{dev}/statistics/tx_bytes")])
        .output()
        .expect("run ip netns exec cat");
    assert!(o.status.success(), "reading {ns}/{dev} counters: {}", stderr(&o));
    String::from_utf8_lossy(&o.stdout).trim().parse().unwrap()
}

/// The percentage of stripes towards the peer in a `--verbose` cable line.
fn stripe_share(line: &str) -> f64 {
    let (_, rest) = line.split_once("to peer ").expect("to peer");
    let (_, rest) = rest.split_once('(').expect("share");
    rest.split_once('%').expect("%").0.parse().unwrap()
}

#[test]
fn two_cables_on_two_subnets_each_carry_their_connection() {
    // Cable 1 at 400 Mbit, cable 2 at 200 Mbit; only the cables' own addresses,
    // so a connection can only reach the peer's cable-k address over cable k.
    let setup = ["--links", "2", "--plain", "--rates", "400mbit,200mbit"];
    let Some(hosts) = Hosts::with("c", 2, &setup) else { return };
    let dir = tempfile::tempdir().unwrap();
    let model = fixture("llama");
    let model = model.to_str().unwrap();
    let ids = golden_ids("llama");
    let world = World {
        size: 2,
        peers: format!("10.78.18.1:{PORT},10.78.18.2:{PORT}"),
        connections: 0,
        links: Some("10.78.18.1,10.79.18.1;10.78.18.2,10.79.18.2".into()),
    };
    let (ns1, ns2) = (hosts.ns(1), hosts.ns(2));
    let before = [tx_bytes(&ns1, "l1h2"), tx_bytes(&ns1, "l2h2")];

    let mut single = Command::new(BIN);
    let single_dump = dir.path().join("single.safetensors");
    single.args(run_args(model, &ids, single_dump.to_str().unwrap(), "tensor"));
    for v in WORLD_VARS {
        single.env_remove(v);
    }
    let o = single.output().expect("spawn shardlm");
    assert!(o.status.success(), "single process: {}", stderr(&o));
    let (want_ids, _) = results(&String::from_utf8_lossy(&o.stdout), &single_dump);

    let dump = dir.path().join("cables.safetensors");
    let mut args = run_args(model, &ids, dump.to_str().unwrap(), "tensor");
    args.push("--verbose");
    let r1 = Rank::start(dir.path(), &ns2, &world, 1, "s3cret", &args);
    let r0 = Rank::start(dir.path(), &ns1, &world, 0, "s3cret", &args);
    let f0 = r0.finish("rank 0 (two cables)");
    let f1 = r1.finish("rank 1 (two cables)");
    assert!(f0.status.success(), "rank 0 failed: {}", f0.stderr);
    assert!(f1.status.success(), "rank 1 failed: {}", f1.stderr);
    let (got_ids, _) = results(&f0.stdout, &dump);
    assert_eq!(got_ids, want_ids, "greedy output ids over two cables");

    // Connection k runs between the two cable-k addresses: rank 1 dials rank
    // 0's port from its own cable address, rank 0 accepts it there.
    let lines1: Vec<&str> = f1.stderr.lines().filter(|l| l.contains("peer 0 connection")).collect();
    assert_eq!(lines1.len(), 2, "one --verbose line per connection: {}", f1.stderr);
    for (k, line) in lines1.iter().enumerate() {
        let (a, b) = (format!("10.{}.18.2:", 78 + k), format!("-> 10.{}.18.1:{PORT}", 78 + k));
        assert!(line.contains(&a) && line.contains(&b), "rank 1 connection {k}: {line}");
    }
    let lines: Vec<&str> = f0.stderr.lines().filter(|l| l.contains("peer 1 connection")).collect();
    assert_eq!(lines.len(), 2, "one --verbose line per connection: {}", f0.stderr);
    for (k, line) in lines.iter().enumerate() {
        let (a, b) = (format!("10.{}.18.1:{PORT}", 78 + k), format!("-> 10.{}.18.2:", 78 + k));
        assert!(line.contains(&a) && line.contains(&b), "rank 0 connection {k}: {line}");
    }
    // The faster cable carries the larger share of stripes (2:1 by the caps;
    // loose, as shared machines drift).
    let (fast, slow) = (stripe_share(lines[0]), stripe_share(lines[1]));
    assert!(fast > 55.0 && slow < 45.0, "shares {fast}% / {slow}%: {lines:?}");
    // And the bytes really went over both devices: at least the 2 MiB each
    // connection carries when the pair measures it.
    let sent = [tx_bytes(&ns1, "l1h2") - before[0], tx_bytes(&ns1, "l2h2") - before[1]];
    assert!(sent.iter().all(|&b| b >= 2 << 20), "bytes sent per cable: {sent:?}");
}

#[test]
fn a_run_survives_losing_a_cable() {
    let Some(hosts) = Hosts::with("l", 2, &["--links", "2", "--plain"]) else { return };
    let dir = tempfile::tempdir().unwrap();
    let model = fixture("llama");
    let model = model.to_str().unwrap();
    let ids = golden_ids("llama");
    let world = World {
        size: 2,
        peers: format!("10.78.18.1:{PORT},10.78.18.2:{PORT}"),
        connections: 0,
        links: Some("10.78.18.1,10.79.18.1;10.78.18.2,10.79.18.2".into()),
    };
    let (ns1, ns2) = (hosts.ns(1), hosts.ns(2));

    let mut single = Command::new(BIN);
    let single_dump = dir.path().join("single.safetensors");
    single.args(run_args(model, &ids, single_dump.to_str().unwrap(), "tensor"));
    for v in WORLD_VARS {
        single.env_remove(v);
    }
    let o = single.output().expect("spawn shardlm");
    assert!(o.status.success(), "single process: {}", stderr(&o));
    let (want_ids, _) = results(&String::from_utf8_lossy(&o.stdout), &single_dump);

    // Rank 1 stops for a while mid-generation; meanwhile the cable that
    // carries the small messages goes down, and stays down.
    let dump = dir.path().join("lost.safetensors");
    let mut args = run_args(model, &ids, dump.to_str().unwrap(), "tensor");
    args.push("--verbose");
    let pause = [("SHARDLM_TEST_PAUSE_AFTER_STEPS", "4:1000")];
    let r1 = Rank::start_env(dir.path(), &ns2, &world, 1, "s3cret", &args, &pause);
    let r0 = Rank::start(dir.path(), &ns1, &world, 0, "s3cret", &args);
    let start = Instant::now();
    while !read(&r1.err).contains("test: pausing") {
        assert!(start.elapsed() < Duration::from_secs(60), "rank 1 never paused: {}", read(&r1.err));
        std::thread::sleep(Duration::from_millis(10));
    }
    let report = read(&r0.err);
    let small = report
        .lines()
        .find(|l| l.contains("peer 1 connection") && l.contains("small messages"))
        .unwrap_or_else(|| panic!("no --verbose line for small messages: {report}"));
    let k: usize = small.split("connection ").nth(1).unwrap().split(':').next().unwrap().parse().unwrap();
    let dev = format!("l{}h2", k + 1);
    let o = Command::new("ip").args(["-n", &ns1, "link", "set", &dev, "down"]).output().unwrap();
    assert!(o.status.success(), "ip link set {dev} down: {}", stderr(&o));
    let down = Instant::now();

    let f0 = r0.finish("rank 0 (cable lost)");
    let f1 = r1.finish("rank 1 (cable lost)");
    let pause = down.elapsed();
    for f in [&f0, &f1] {
        f.stderr.lines().filter(|l| l.contains("lost its cable")).for_each(|l| eprintln!("{l}"));
    }
    eprintln!("{dev} down; the run ended {pause:?} later");
    assert!(f0.status.success(), "rank 0 failed: {}", f0.stderr);
    assert!(f1.status.success(), "rank 1 failed: {}", f1.stderr);
    let (got_ids, _) = results(&f0.stdout, &dump);
    assert_eq!(got_ids, want_ids, "output with a lost cable");
    // Noticed within the keep-alive time (2 s idle + 3 probes, or 5 s unacknowledged),
    // then continued at once; loose, as shared machines drift.
    assert!(pause < Duration::from_secs(20), "the run took {pause:?} after the cable went down");
    for (f, who) in [(&f0, "rank 0"), (&f1, "rank 1")] {
        let n = f.stderr.matches("lost its cable").count();
        assert_eq!(n, 1, "{who} must say once that a cable was lost: {}", f.stderr);
    }
}
