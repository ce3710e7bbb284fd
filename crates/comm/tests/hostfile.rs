//! Hostfile parsing: both formats, and errors that name the file and problem.

use shardlm_comm::Hostfile;

#[test]
fn mlx_format() {
    let text = r#"[{"ssh": "mac1", "ips": ["192.168.1.2", "169.254.0.1"]}, {"ssh": "mac2", "ips": []}]"#;
    let h = Hostfile::parse(text, "hosts.json").unwrap();
    assert_eq!(h.len(), 2);
    assert_eq!(h.hosts[0].name, "mac1");
    assert_eq!(h.hosts[0].addr, "192.168.1.2");
    assert_eq!(h.hosts[0].links.len(), 2, "each of ips is one cable");
    assert_eq!(h.hosts[0].links[1].addrs, vec!["169.254.0.1"]);
    assert_eq!(h.cable_addresses(), vec![vec!["192.168.1.2".to_string(), "169.254.0.1".to_string()], vec![]]);
    assert_eq!(h.hosts[1].addr, "mac2", "without ips the ssh name is the address");
    assert_eq!(h.rank_addresses(5000), vec!["192.168.1.2:5000", "mac2:5000"]);
}

#[test]
fn our_format_round_trips() {
    let text = r#"{"hosts": [
        {"name": "a", "addr": "10.0.0.1", "usable_memory_gb": 48.5, "cores": 12,
         "links": [{"addrs": ["169.254.0.1"]}, {"addrs": ["169.254.1.1"]}]},
        {"name": "b", "addr": "10.0.0.2:6000"}
    ]}"#;
    let h = Hostfile::parse(text, "cluster.json").unwrap();
    assert_eq!(h.hosts[0].usable_memory_gb, Some(48.5));
    assert_eq!(h.hosts[0].cores, Some(12));
    assert_eq!(h.hosts[0].links.len(), 2);
    assert_eq!(h.hosts[1].links.len(), 0);
    assert_eq!(h.rank_addresses(5000), vec!["10.0.0.1:5000", "10.0.0.2:6000"]);
    assert_eq!(Hostfile::parse(&h.to_json(), "again").unwrap(), h);
}

#[test]
fn load_from_disk_and_errors_name_the_file() {
    let dir = std::env::temp_dir().join(format!("shardlm-hostfile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("hosts.json");
    std::fs::write(&path, r#"[{"ssh": "x"}]"#).unwrap();
    assert_eq!(Hostfile::load(&path).unwrap().hosts[0].name, "x");

    let missing = dir.join("missing.json");
    let e = Hostfile::load(&missing).unwrap_err().to_string();
    assert!(e.starts_with(&format!("hostfile {}: ", missing.display())), "{e}");

    std::fs::write(&path, "{\"hosts\": [").unwrap();
    let e = Hostfile::load(&path).unwrap_err().to_string();
    assert!(e.starts_with(&format!("hostfile {}: invalid JSON", path.display())), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn problems_are_named() {
    let cases = [
        (r#"{"hosts": []}"#, "lists no hosts"),
        (r#"[]"#, "lists no hosts"),
        (r#"42"#, "expected a list (MLX format) or an object"),
        (r#"[{"ips": ["1.2.3.4"]}]"#, "not an MLX hostfile"),
        (r#"{"hosts": [{"name": "a"}]}"#, "missing field `addr`"),
        (r#"{"hosts": [{"name": "a", "addr": "x", "memory": 3}]}"#, "unknown field `memory`"),
        (
            r#"{"hosts": [{"name": "a", "addr": "x"}, {"name": "a", "addr": "y"}]}"#,
            "host 1 (\"a\") has the same name as host 0",
        ),
        (r#"{"hosts": [{"name": "a", "addr": " "}]}"#, "host 0 (\"a\") has an empty address"),
        (r#"{"hosts": [{"name": "a", "addr": "x", "usable_memory_gb": -1}]}"#, "usable_memory_gb -1"),
        (r#"{"hosts": [{"name": "a", "addr": "x", "cores": 0}]}"#, "has 0 cores"),
        (r#"{"hosts": [{"name": "a", "addr": "x", "links": [{"addrs": []}]}]}"#, "link 0 has no address"),
        (
            r#"{"hosts": [{"name": "a", "addr": "x", "links": [{"addrs": ["10.0.0.1,10.0.0.2"]}]}]}"#,
            "link 0 address \"10.0.0.1,10.0.0.2\" contains one of",
        ),
    ];
    for (text, want) in cases {
        let e = Hostfile::parse(text, "h.json").unwrap_err().to_string();
        assert!(e.starts_with("hostfile h.json: ") && e.contains(want), "{text}: {e}");
    }
}
