//! The page at `/` and `GET /cluster` of `shardlm serve` (one process and
//! `--ranks 2`), against the schema in docs/WEB.md; `bench`'s power report
//! (a fake sysfs tree, and the real "not readable") and `--plot`.

mod common;
use common::*;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A `shardlm serve` on a free port, killed on drop.
struct Serve {
    child: Child,
    addr: String,
}

impl Drop for Serve {
    fn drop(&mut self) {
        // SIGTERM lets `--ranks 2` stop its other rank too.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        for _ in 0..100 {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(extra: &[&str]) -> Option<Serve> {
    let model = smollm2()?;
    let mut child = Command::new(env!("CARGO_BIN_EXE_shardlm"))
        .args(["serve", "--model", model.to_str().unwrap(), "--port", "0", "--kv-cache-bytes", "8000000"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn shardlm serve");
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    let addr = loop {
        line.clear();
        if err.read_line(&mut line).unwrap() == 0 {
            panic!("serve exited before listening");
        }
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    // Keep draining stderr so the server never blocks on a full pipe.
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    Some(Serve { child, addr })
}

/// Status, content type and body of `GET path`.
fn get(addr: &str, path: &str, key: Option<&str>) -> (u16, String, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let auth = key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n").unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP response");
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let ctype = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-type:").map(|v| v.trim().to_string()))
        .unwrap_or_default();
    (status, ctype, body.to_string())
}

fn num(v: &Value, path: &str) -> f64 {
    let mut x = v;
    for k in path.split('.') {
        x = &x[k];
    }
    x.as_f64().unwrap_or_else(|| panic!("{path} is not a number in {v}"))
}

/// Every field docs/WEB.md promises, with its type.
fn check_cluster(j: &Value, world: usize) {
    assert_eq!(j["world_size"], world);
    assert!(j["model"].is_string() && j["strategy"].is_string() && j["status"] == "ready", "{j}");
    num(j, "context");
    let ranks = j["ranks"].as_array().expect("ranks");
    assert_eq!(ranks.len(), world);
    let mut layers_seen = 0;
    for (i, r) in ranks.iter().enumerate() {
        assert_eq!(r["rank"], i);
        assert!(r["host"].as_str().is_some_and(|h| !h.is_empty()));
        num(r, "pid");
        for k in ["stage", "stages", "tp_rank", "tp"] {
            num(&r["role"], k);
        }
        assert!(r["role"]["label"].is_string() && r["role"]["has_head"].is_boolean());
        let l = r["layers"].as_array().unwrap();
        layers_seen += l[1].as_u64().unwrap() - l[0].as_u64().unwrap();
        for k in ["weights_bytes", "kv_pool_bytes", "kv_used_bytes", "rss_bytes", "total_bytes"] {
            num(&r["memory"], k);
        }
        assert!(num(&r["memory"], "weights_bytes") > 0.0 && num(&r["memory"], "kv_pool_bytes") > 0.0);
        let p = &r["power"];
        assert!(p["readable"].is_boolean() && p["host"].is_string(), "{p}");
        if p["readable"] == false {
            assert!(p["reason"].as_str().is_some_and(|s| !s.is_empty()), "{p}");
        } else {
            assert!(p["sources"].is_array() && p["host_wide"] == true && p["counted_for_host"].is_boolean(), "{p}");
            for k in ["watts", "joules", "age_s", "prefill", "decode"] {
                assert!(p.get(k).is_some(), "power.{k} in {p}");
            }
            for ph in ["prefill", "decode"] {
                if !p[ph].is_null() {
                    for k in ["mean_w", "peak_w", "joules", "seconds", "tokens", "joules_per_token"] {
                        assert!(p[ph].get(k).is_some(), "power.{ph}.{k} in {p}");
                    }
                }
            }
        }
        assert_eq!(r["degraded"], false);
        assert!(r["links"].is_array());
    }
    assert_eq!(layers_seen, 30, "SmolLM2's 30 layers are held once");
    assert_eq!(ranks[0]["role"]["has_head"], true);
    let links = j["links"].as_array().unwrap();
    assert_eq!(links.len(), world * (world - 1) / 2);
    for l in links {
        assert!(l["transport"].is_string() && l["cables"].is_array() && l["from"].as_u64() < l["to"].as_u64());
    }
    for k in ["block_tokens", "blocks_total", "blocks_used", "blocks_cached", "blocks_free"] {
        num(&j["kv_pool"], k);
    }
    assert!(num(&j["kv_pool"], "blocks_total") > 0.0);
    assert!(j["prefix_cache"]["enabled"].is_boolean() && j["prefix_cache"].get("hit_rate").is_some());
    num(&j["prefix_cache"], "queries");
    for k in ["waiting", "active", "batch_size"] {
        num(&j["queue"], k);
    }
    for k in ["tokens_per_s", "generated_tokens_total", "prompt_tokens_total"] {
        num(&j["throughput"], k);
    }
    check_cluster_power(j, ranks);
}

/// The cluster's `power`: every host once, with its ranks; the total and the
/// phases only where some host is readable.
fn check_cluster_power(j: &Value, ranks: &[Value]) {
    let p = &j["power"];
    let hosts = p["hosts"].as_array().expect("power.hosts");
    let mut seen = 0;
    for h in hosts {
        assert!(h["host"].is_string() && h["readable"].is_boolean() && h.get("watts").is_some(), "{h}");
        let members = h["ranks"].as_array().unwrap();
        seen += members.len();
        for m in members {
            assert_eq!(ranks[m.as_u64().unwrap() as usize]["power"]["host"], h["host"]);
        }
        if h["readable"] == false {
            assert!(h["reason"].as_str().is_some_and(|s| !s.is_empty()), "{h}");
            assert!(h["watts"].is_null() && h["read_by_rank"].is_null(), "no invented number: {h}");
        }
    }
    assert_eq!(seen, ranks.len(), "each rank under one host");
    let any = hosts.iter().any(|h| h["readable"] == true);
    assert!(p.get("total_watts").is_some());
    for ph in ["prefill", "decode"] {
        assert_eq!(!p[ph].is_null(), any, "power.{ph}: {p}");
    }
}

fn page_and_cluster(extra: &[&str], world: usize) {
    let Some(s) = serve(extra) else { return };
    let (code, ctype, body) = get(&s.addr, "/", None);
    assert_eq!(code, 200);
    assert!(ctype.starts_with("text/html"), "{ctype}");
    for role in ["chat-input", "send"] {
        assert!(body.contains(&format!("data-role=\"{role}\"")), "{role}");
    }
    // Everything the page loads comes from this server.
    assert!(!body.contains("http://") && !body.contains("https://"), "the page loads nothing from the network");
    for (path, kind) in
        [("/app.js", "text/javascript"), ("/markdown.js", "text/javascript"), ("/style.css", "text/css")]
    {
        let (code, ctype, body) = get(&s.addr, path, None);
        assert_eq!((code, ctype.starts_with(kind)), (200, true), "{path}: {ctype}");
        assert!(!body.contains("https://cdn"), "{path}");
    }
    let (code, _, app) = get(&s.addr, "/app.js", None);
    assert_eq!(code, 200);
    for role in ["message-assistant", "rank"] {
        assert!(app.contains(&format!("\"{role}\"")), "app.js sets data-role {role}");
    }
    let (code, ctype, body) = get(&s.addr, "/cluster", None);
    assert_eq!(code, 200);
    assert!(ctype.starts_with("application/json"));
    check_cluster(&serde_json::from_str(&body).unwrap(), world);
}

#[test]
fn page_and_cluster_single_process() {
    page_and_cluster(&[], 1);
}

#[test]
fn page_and_cluster_two_ranks() {
    page_and_cluster(&["--ranks", "2"], 2);
}

#[test]
fn api_key_guards_cluster_but_not_the_page() {
    let Some(s) = serve(&["--api-key", "k-123"]) else { return };
    assert_eq!(get(&s.addr, "/", None).0, 200);
    assert_eq!(get(&s.addr, "/app.js", None).0, 200);
    assert_eq!(get(&s.addr, "/cluster", None).0, 401);
    let (code, _, body) = get(&s.addr, "/cluster", Some("k-123"));
    assert_eq!(code, 200);
    check_cluster(&serde_json::from_str(&body).unwrap(), 1);
}

fn bench_json(env: &[(&str, &str)], extra: &[&str]) -> Value {
    let m = fixture("llama");
    let mut args = vec!["bench", "--model", m.to_str().unwrap(), "-p", "64", "-g", "48", "-n", "1", "--json"];
    args.extend(extra);
    let o = Command::new(env!("CARGO_BIN_EXE_shardlm")).args(&args).envs(env.iter().copied()).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn bench_power_not_readable_says_why() {
    let dir = std::env::temp_dir().join(format!("shardlm-nosensor-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let j = bench_json(&[("SHARDLM_SYSFS_ROOT", dir.to_str().unwrap())], &[]);
    let p = &j["power"][0];
    assert_eq!(p["readable"], false);
    assert!(p["reason"].as_str().unwrap().contains("no RAPL or hwmon power sensor"), "{p}");
    assert!(p.get("prefill").is_none(), "no invented numbers");
    let _ = std::fs::remove_dir_all(dir);
}

/// A fake hwmon sensor reading a constant 20 W: both phases report it, per rank.
#[test]
fn bench_power_from_a_fake_sensor_and_the_plot() {
    let dir = std::env::temp_dir().join(format!("shardlm-fakesys-{}", std::process::id()));
    let h = dir.join("class/hwmon/hwmon0");
    std::fs::create_dir_all(&h).unwrap();
    std::fs::write(h.join("name"), "fake\n").unwrap();
    std::fs::write(h.join("power1_input"), "20000000\n").unwrap();
    let svg = dir.join("plot.svg");
    let root = dir.to_str().unwrap();
    for extra in [vec![], vec!["--ranks", "2"]] {
        let mut args = extra.clone();
        args.extend(["--plot", svg.to_str().unwrap()]);
        let j = bench_json(&[("SHARDLM_SYSFS_ROOT", root)], &args);
        let power = j["power"].as_array().unwrap();
        assert_eq!(power.len(), if extra.is_empty() { 1 } else { 2 });
        for p in power {
            assert_eq!(p["readable"], true, "{p}");
            assert_eq!(p["sources"][0], "hwmon fake power1");
            for phase in ["prefill", "decode"] {
                let e = &p[phase];
                // A phase shorter than one sampling interval has no mean; when sampled it is 20 W.
                if let Some(w) = e["mean_w"].as_f64() {
                    assert!((w - 20.0).abs() < 1.0, "{phase}: {e}");
                    assert!(num(e, "joules_per_token") > 0.0);
                }
                assert!(num(e, "tokens") > 0.0, "{phase}: {e}");
            }
        }
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(text.starts_with("<svg") && text.contains("context depth") && text.contains("rank 0"));
    }
    let _ = std::fs::remove_dir_all(dir);
}
