//! Power readings where the platform exposes them, never invented.
//!
//! Sources, all read from sysfs under a root (`/sys`, or `SHARDLM_SYSFS_ROOT`
//! for tests on a fake tree):
//! - Linux RAPL (`class/powercap/intel-rapl:N/energy_uj`, AMD too): a µJ
//!   counter per CPU package that wraps at `max_energy_range_uj`. Only the
//!   top-level zones (`intel-rapl:N`, not `intel-rapl:N:M`) are summed: the
//!   sub-zones (core, uncore, dram) are parts of their package. Recent kernels
//!   make `energy_uj` root-only, which this reports as the reason.
//! - hwmon (`class/hwmon/hwmonN/power*_input` or `power*_average`, µW): an
//!   instantaneous reading, integrated over the sampling interval.
//! - NVML (NVIDIA GPUs) and macOS IOReport are not read yet: they are named in
//!   the reason when nothing else is readable.
//!
//! A [`PowerMeter`] samples the sources every [`SAMPLE_EVERY`] on a thread of
//! its own and attributes each interval's energy to the phase the process was
//! in ([`enter`]: prefill or decode steps), so `bench` can report mean and peak
//! watts and joules per token for each phase. RAPL and hwmon measure the whole
//! package or board: ranks on one host read the same machine.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Interval between samples of the meter's thread.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(20);

/// The sysfs root: `SHARDLM_SYSFS_ROOT` or `/sys`.
pub fn sysfs_root() -> PathBuf {
    std::env::var_os("SHARDLM_SYSFS_ROOT").map_or_else(|| PathBuf::from("/sys"), PathBuf::from)
}

/// One RAPL package counter.
#[derive(Debug, Clone)]
struct RaplZone {
    energy: PathBuf,
    /// The counter wraps to 0 after this many µJ.
    max_range_uj: u64,
    last_uj: u64,
}

/// A hwmon power sensor in µW.
#[derive(Debug, Clone)]
struct HwmonSensor {
    path: PathBuf,
}

/// The readable power sources of this machine.
#[derive(Debug, Clone)]
pub struct PowerSources {
    rapl: Vec<RaplZone>,
    hwmon: Vec<HwmonSensor>,
    /// Human-readable names of what is read ("rapl package-0", "hwmon amdgpu power1").
    pub names: Vec<String>,
}

fn read_u64(p: &Path) -> std::io::Result<u64> {
    let s = std::fs::read_to_string(p)?;
    s.trim()
        .parse::<u64>()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{}: {e}", p.display())))
}

fn sorted_entries(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> =
        std::fs::read_dir(dir).map_or_else(|_| Vec::new(), |rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect());
    v.sort();
    v
}

/// µJ consumed between two readings of a counter that wraps at `max_range_uj`.
pub fn counter_delta_uj(before: u64, after: u64, max_range_uj: u64) -> u64 {
    if after >= before {
        after - before
    } else {
        // Wrapped once (sampled far more often than a wrap takes: minutes).
        max_range_uj.saturating_sub(before) + after
    }
}

impl PowerSources {
    /// What is readable under `root` (a sysfs tree), or why nothing is.
    pub fn discover(root: &Path) -> Result<PowerSources, String> {
        Self::discover_with(root, &read_u64)
    }

    /// `discover` with its file reader given: tests run as root, whom file
    /// modes do not stop, so they pass a reader that refuses like a kernel does.
    fn discover_with(root: &Path, read_u64: &dyn Fn(&Path) -> std::io::Result<u64>) -> Result<PowerSources, String> {
        let mut rapl = Vec::new();
        let mut names = Vec::new();
        let mut denied = Vec::new();
        for dir in sorted_entries(&root.join("class/powercap")) {
            let file = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            // Top-level zones only: "intel-rapl:0", not "intel-rapl:0:1" (a part of it).
            let Some(rest) = file.strip_prefix("intel-rapl:") else { continue };
            if rest.contains(':') {
                continue;
            }
            let energy = dir.join("energy_uj");
            match read_u64(&energy) {
                Ok(now) => {
                    let max_range_uj = read_u64(&dir.join("max_energy_range_uj")).unwrap_or(u64::MAX);
                    let label =
                        std::fs::read_to_string(dir.join("name")).map_or(file.clone(), |s| s.trim().to_string());
                    names.push(format!("rapl {label}"));
                    rapl.push(RaplZone { energy, max_range_uj, last_uj: now });
                }
                Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => denied.push(file),
                Err(_) => {}
            }
        }
        let mut hwmon = Vec::new();
        for dir in sorted_entries(&root.join("class/hwmon")) {
            let chip =
                std::fs::read_to_string(dir.join("name")).map_or_else(|_| "?".to_string(), |s| s.trim().to_string());
            for f in sorted_entries(&dir) {
                let n = f.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                let is_power = n.starts_with("power") && (n.ends_with("_input") || n.ends_with("_average"));
                if !is_power {
                    continue;
                }
                // One reading per sensor: prefer `_input` when both exist.
                let stem = n.trim_end_matches("_input").trim_end_matches("_average").to_string();
                if n.ends_with("_average") && dir.join(format!("{stem}_input")).exists() {
                    continue;
                }
                match read_u64(&f) {
                    Ok(_) => {
                        names.push(format!("hwmon {chip} {stem}"));
                        hwmon.push(HwmonSensor { path: f });
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                        denied.push(format!("hwmon {chip} {stem}"))
                    }
                    Err(_) => {}
                }
            }
        }
        if rapl.is_empty() && hwmon.is_empty() {
            return Err(if !denied.is_empty() {
                format!("permission denied reading {} (RAPL is root-only on recent kernels)", denied.join(", "))
            } else if cfg!(target_os = "macos") {
                "IOReport is not read yet".to_string()
            } else {
                format!("no RAPL or hwmon power sensor under {} (NVML is not read yet)", root.display())
            });
        }
        Ok(PowerSources { rapl, hwmon, names })
    }

    /// Energy since the last call (µJ), given `dt` since then for the
    /// instantaneous sensors. A counter that cannot be read counts nothing.
    pub fn energy_since_last_uj(&mut self, dt: Duration) -> u64 {
        let mut uj = 0u64;
        for z in &mut self.rapl {
            if let Ok(now) = read_u64(&z.energy) {
                uj += counter_delta_uj(z.last_uj, now, z.max_range_uj);
                z.last_uj = now;
            }
        }
        for s in &self.hwmon {
            if let Ok(uw) = read_u64(&s.path) {
                uj += (uw as f64 * dt.as_secs_f64()) as u64;
            }
        }
        uj
    }
}

/// What the process is doing, for attributing energy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    Idle = 0,
    Prefill = 1,
    Decode = 2,
}

static PHASE: AtomicU8 = AtomicU8::new(0);
/// Phases entered since the meter's last sample (bit per phase).
static TOUCHED: AtomicU8 = AtomicU8::new(0);
/// Tokens run per phase (prefill, decode) by this process.
static TOKENS: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// Marks the process as in `phase` (with `tokens` run) until the guard drops.
pub fn enter(phase: Phase, tokens: usize) -> PhaseGuard {
    PHASE.store(phase as u8, Relaxed);
    TOUCHED.fetch_or(1 << phase as u8, Relaxed);
    if phase != Phase::Idle {
        TOKENS[phase as usize - 1].fetch_add(tokens as u64, Relaxed);
    }
    PhaseGuard
}

pub struct PhaseGuard;

impl Drop for PhaseGuard {
    fn drop(&mut self) {
        PHASE.store(Phase::Idle as u8, Relaxed);
    }
}

/// Energy attributed to one phase.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PhaseEnergy {
    pub joules: f64,
    pub seconds: f64,
    /// Highest power of one sampling interval, watts.
    pub peak_w: f64,
    /// Tokens this process ran in the phase.
    pub tokens: u64,
}

impl PhaseEnergy {
    pub fn mean_w(&self) -> Option<f64> {
        (self.seconds > 0.0).then(|| self.joules / self.seconds)
    }
    pub fn joules_per_token(&self) -> Option<f64> {
        (self.tokens > 0 && self.seconds > 0.0).then(|| self.joules / self.tokens as f64)
    }
}

#[derive(Debug, Default)]
struct MeterState {
    phases: [PhaseEnergy; 2],
    /// Watts over the last interval and when it was taken.
    last_w: Option<f64>,
    total_j: f64,
    tokens_at_start: [u64; 2],
}

/// Samples the sources on a thread until dropped.
pub struct PowerMeter {
    state: Arc<Mutex<MeterState>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    pub sources: Vec<String>,
}

impl PowerMeter {
    /// Starts sampling what `PowerSources::discover(root)` finds, or says why not.
    pub fn start(root: &Path) -> Result<PowerMeter, String> {
        let mut src = PowerSources::discover(root)?;
        let state = Arc::new(Mutex::new(MeterState { tokens_at_start: tokens_now(), ..Default::default() }));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let names = src.names.clone();
        let (st, sp) = (state.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("power-meter".into())
            .spawn(move || {
                let mut last = Instant::now();
                TOUCHED.store(0, Relaxed);
                while !sp.load(Relaxed) {
                    std::thread::sleep(SAMPLE_EVERY);
                    let now = Instant::now();
                    let dt = now - last;
                    last = now;
                    let uj = src.energy_since_last_uj(dt);
                    let touched = TOUCHED.swap(0, Relaxed);
                    let cur = PHASE.load(Relaxed);
                    // The phase now, else one entered during the interval (decode first).
                    let phase = if cur != 0 {
                        cur
                    } else if touched & 4 != 0 {
                        2
                    } else if touched & 2 != 0 {
                        1
                    } else {
                        0
                    };
                    let (j, s) = (uj as f64 * 1e-6, dt.as_secs_f64());
                    let mut g = st.lock().unwrap_or_else(|e| e.into_inner());
                    g.total_j += j;
                    g.last_w = Some(j / s.max(1e-9));
                    if phase != 0 {
                        let p = &mut g.phases[phase as usize - 1];
                        p.joules += j;
                        p.seconds += s;
                        p.peak_w = p.peak_w.max(j / s.max(1e-9));
                    }
                }
            })
            .map_err(|e| format!("cannot start the power sampling thread: {e}"))?;
        Ok(PowerMeter { state, stop, thread: Some(thread), sources: names })
    }

    /// Starts a meter on the real sysfs root (`SHARDLM_SYSFS_ROOT` or `/sys`).
    pub fn start_default() -> Result<PowerMeter, String> {
        Self::start(&sysfs_root())
    }

    /// Watts over the last sampling interval (`None` before the first).
    pub fn watts(&self) -> Option<f64> {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).last_w
    }

    /// Energy per phase since the start or the last `reset` (prefill, decode).
    pub fn phases(&self) -> [PhaseEnergy; 2] {
        let g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = tokens_now();
        let mut out = g.phases;
        for (i, p) in out.iter_mut().enumerate() {
            p.tokens = now[i] - g.tokens_at_start[i];
        }
        out
    }

    /// Forgets what was measured (after warm-up).
    pub fn reset(&self) {
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        g.phases = Default::default();
        g.total_j = 0.0;
        g.tokens_at_start = tokens_now();
    }
}

/// The process's meter on the real sysfs root, started on first use (it
/// samples until the process exits), or why power is not readable here.
pub fn global() -> Result<&'static PowerMeter, &'static str> {
    static METER: std::sync::OnceLock<Result<PowerMeter, String>> = std::sync::OnceLock::new();
    METER.get_or_init(PowerMeter::start_default).as_ref().map_err(|e| e.as_str())
}

fn tokens_now() -> [u64; 2] {
    [TOKENS[0].load(Relaxed), TOKENS[1].load(Relaxed)]
}

impl Drop for PowerMeter {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
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
        let e = PowerSources::discover_with(&root, &refuse).unwrap_err();
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
}
