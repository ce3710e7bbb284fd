use super::*;

fn tree(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("shardlm-power-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write(p: &Path, s: &str) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, s).unwrap();
}

#[test]
fn wrap_is_counted_once_around_the_range() {
    assert_eq!(counter_delta_uj(100, 250, 1000), 150);
    assert_eq!(counter_delta_uj(900, 50, 1000), 150);
    assert_eq!(counter_delta_uj(7, 7, 1000), 0);
}

#[test]
fn rapl_packages_are_summed_and_subzones_skipped_across_a_wrap() {
    let root = tree("rapl");
    let pc = root.join("class/powercap");
    write(&pc.join("intel-rapl:0/energy_uj"), "999000\n");
    write(&pc.join("intel-rapl:0/max_energy_range_uj"), "1000000\n");
    write(&pc.join("intel-rapl:0/name"), "package-0\n");
    write(&pc.join("intel-rapl:0:0/energy_uj"), "5\n"); // core: part of package 0
    write(&pc.join("intel-rapl:1/energy_uj"), "10\n");
    write(&pc.join("intel-rapl:1/max_energy_range_uj"), "1000000\n");
    let mut s = PowerSources::discover(&root).unwrap();
    assert_eq!(s.names, vec!["rapl package-0", "rapl intel-rapl:1"]);
    write(&pc.join("intel-rapl:0/energy_uj"), "1000\n"); // wrapped: 1000 + 1000 µJ
    write(&pc.join("intel-rapl:0:0/energy_uj"), "900000\n");
    write(&pc.join("intel-rapl:1/energy_uj"), "510\n");
    assert_eq!(s.energy_since_last_uj(Duration::from_millis(20)), 2000 + 500);
    assert_eq!(s.energy_since_last_uj(Duration::from_millis(20)), 0);
    let _ = std::fs::remove_dir_all(root);
}

#[test]
fn hwmon_power_is_integrated_over_the_interval() {
    let root = tree("hwmon");
    let h = root.join("class/hwmon/hwmon0");
    write(&h.join("name"), "amdgpu\n");
    write(&h.join("power1_average"), "1\n"); // shadowed by power1_input
    write(&h.join("power1_input"), "50000000\n"); // 50 W
    write(&h.join("temp1_input"), "40000\n");
    let mut s = PowerSources::discover(&root).unwrap();
    assert_eq!(s.names, vec!["hwmon amdgpu power1"]);
    assert_eq!(s.energy_since_last_uj(Duration::from_millis(100)), 5_000_000);
    let _ = std::fs::remove_dir_all(root);
}

#[test]
fn no_sensor_says_why() {
    let root = tree("none");
    let e = PowerSources::discover(&root).unwrap_err();
    assert!(e.contains("no RAPL or hwmon power sensor"), "{e}");
    let _ = std::fs::remove_dir_all(root);
}

#[test]
fn unreadable_counter_says_permission_denied() {
    let root = tree("denied");
    let pc = root.join("class/powercap");
    write(&pc.join("intel-rapl:0/energy_uj"), "1\n");
    write(&pc.join("intel-rapl:0/max_energy_range_uj"), "1000\n");
    // What a non-root process gets from a root-only (0400) energy_uj.
    let refuse = |p: &Path| {
        if p.ends_with("energy_uj") {
            Err(std::io::Error::from(std::io::ErrorKind::PermissionDenied))
        } else {
            read_u64(p)
        }
    };
    let e = PowerSources::discover_with(&root, &refuse, Err("NVML not read here".into())).unwrap_err();
    assert!(e.contains("permission denied") && e.contains("intel-rapl:0") && e.contains("root-only"), "{e}");
    let _ = std::fs::remove_dir_all(root);
}

#[test]
fn meter_attributes_energy_to_the_phase() {
    let root = tree("meter");
    let h = root.join("class/hwmon/hwmon0");
    write(&h.join("power1_input"), "10000000\n"); // 10 W
    let m = PowerMeter::start(&root).unwrap();
    {
        let _g = enter(Phase::Decode, 3);
        std::thread::sleep(SAMPLE_EVERY * 6);
    }
    std::thread::sleep(SAMPLE_EVERY * 3);
    let [_, dec] = m.phases();
    assert!(dec.seconds > 0.0 && dec.tokens >= 3, "{dec:?}");
    let w = dec.mean_w().unwrap();
    assert!((w - 10.0).abs() < 0.5, "{w}");
    assert!((dec.peak_w - 10.0).abs() < 0.5);
    assert!(m.watts().is_some());
    drop(m);
    let _ = std::fs::remove_dir_all(root);
}

#[test]
fn nvml_absent_library_is_the_reason_beside_no_sensor() {
    let root = tree("nonvml");
    let lib = Ok("/nonexistent/libnvidia-ml.so.1".to_string());
    let e = PowerSources::discover_with(&root, &read_u64, lib).unwrap_err();
    assert!(e.contains("no RAPL or hwmon power sensor"), "{e}");
    if !cfg!(target_os = "macos") {
        assert!(e.contains("; NVML library /nonexistent/libnvidia-ml.so.1 not found ("), "{e}");
    }
    let _ = std::fs::remove_dir_all(root);
}

#[test]
fn a_test_tree_does_not_read_nvml() {
    assert!(nvml_lib(Path::new("/tmp/fake-sys")).is_err() || std::env::var_os("SHARDLM_NVML_LIB").is_some());
}

#[test]
fn recent_watts_and_lifetime_joules() {
    let root = tree("recent");
    let h = root.join("class/hwmon/hwmon0");
    write(&h.join("power1_input"), "5000000\n"); // 5 W
    let m = PowerMeter::start(&root).unwrap();
    std::thread::sleep(SAMPLE_EVERY * 8);
    let w = m.watts_recent().unwrap();
    assert!((w - 5.0).abs() < 0.3, "{w}");
    let j = m.joules_total();
    m.reset();
    assert!(j > 0.0 && m.joules_total() >= j, "the lifetime counter survives a reset");
    drop(m);
    let _ = std::fs::remove_dir_all(root);
}
