//! Power readings where the platform exposes them, never invented.
//!
//! Sources:
//! - Linux RAPL (`class/powercap/intel-rapl:N/energy_uj` under the sysfs
//!   root, AMD too): a µJ counter per CPU package that wraps at
//!   `max_energy_range_uj`. Only the top-level zones (`intel-rapl:N`, not
//!   `intel-rapl:N:M`) are summed: the sub-zones (core, uncore, dram) are
//!   parts of their package. Recent kernels make `energy_uj` root-only,
//!   which this reports as the reason.
//! - hwmon (`class/hwmon/hwmonN/power*_input` or `power*_average`, µW): an
//!   instantaneous reading, integrated over the sampling interval.
//! - NVML for NVIDIA GPUs ([`nvml`]: `libnvidia-ml.so.1`, loaded at run time).
//! - On macOS, IOReport's "Energy Model" channels ([`ioreport`], no sudo;
//!   written without a Mac to compile it on, see there).
//!
//! The sysfs root is `/sys`, or `SHARDLM_SYSFS_ROOT` for tests on a fake
//! tree; beside a fake tree NVML and IOReport are not read (so a test's
//! numbers are the tree's), unless `SHARDLM_NVML_LIB` names the library.
//!
//! A [`PowerMeter`] samples the sources every [`SAMPLE_EVERY`] on a thread of
//! its own and attributes each interval's energy to the phase the process was
//! in ([`enter`]: prefill or decode steps), so `bench` can report mean and peak
//! watts and joules per token for each phase. RAPL, hwmon and IOReport measure
//! the whole package or board, NVML the host's GPUs: ranks on one host read
//! the same machine. [`live`] carries the other ranks' readings to rank 0.

pub mod ioreport;
pub mod live;
mod meter;
pub mod nvml;
#[cfg(test)]
mod tests;

pub use meter::*;

use std::path::{Path, PathBuf};
use std::time::Duration;

/// Interval between samples of the meter's thread.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(20);

/// The sysfs root: `SHARDLM_SYSFS_ROOT` or `/sys`.
pub fn sysfs_root() -> PathBuf {
    std::env::var_os("SHARDLM_SYSFS_ROOT").map_or_else(|| PathBuf::from("/sys"), PathBuf::from)
}

/// The NVML library to load beside the sysfs tree `root`, or why none is:
/// `SHARDLM_NVML_LIB` when set (empty: off), else the driver's library
/// beside the real `/sys` only.
pub fn nvml_lib(root: &Path) -> Result<String, String> {
    match std::env::var("SHARDLM_NVML_LIB") {
        Ok(lib) if lib.is_empty() => Err("NVML off (SHARDLM_NVML_LIB is empty)".into()),
        Ok(lib) => Ok(lib),
        Err(_) if root != Path::new("/sys") => Err("NVML not read beside a test sysfs tree".into()),
        Err(_) => Ok(nvml::DEFAULT_LIB.into()),
    }
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
#[derive(Debug)]
pub struct PowerSources {
    rapl: Vec<RaplZone>,
    hwmon: Vec<HwmonSensor>,
    nvml: Option<nvml::Nvml>,
    #[cfg(target_os = "macos")]
    ioreport: Option<ioreport::IoReport>,
    /// Human-readable names of what is read ("rapl package-0", "hwmon amdgpu
    /// power1", "nvml GPU 0 NVIDIA H100 (energy counter)").
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
        Self::discover_with(root, &read_u64, nvml_lib(root))
    }

    /// `discover` with its file reader and NVML library given: tests run as
    /// root, whom file modes do not stop, so they pass a reader that refuses
    /// like a kernel does.
    fn discover_with(
        root: &Path,
        read_u64: &dyn Fn(&Path) -> std::io::Result<u64>,
        nvml_lib: Result<String, String>,
    ) -> Result<PowerSources, String> {
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
        let mut reasons = Vec::new();
        // NVIDIA's driver has not shipped for macOS in years.
        let nvml = match nvml_lib {
            _ if cfg!(target_os = "macos") => None,
            Ok(lib) => nvml::Nvml::open(&lib).map_err(|e| reasons.push(e.to_string())).ok(),
            Err(why) => {
                reasons.push(why);
                None
            }
        };
        names.extend(nvml.as_ref().map(|n| n.names()).unwrap_or_default());
        #[cfg(target_os = "macos")]
        let ioreport = if root == Path::new("/sys") {
            ioreport::IoReport::open().map_err(|e| reasons.push(format!("IOReport: {e}"))).ok()
        } else {
            reasons.push("IOReport not read beside a test sysfs tree".into());
            None
        };
        #[cfg(target_os = "macos")]
        if ioreport.is_some() {
            names.push(format!("ioreport {} (CPU, GPU, ANE, DRAM)", ioreport::GROUP));
        }
        if names.is_empty() {
            let sysfs = if !denied.is_empty() {
                format!("permission denied reading {} (RAPL is root-only on recent kernels)", denied.join(", "))
            } else {
                format!("no RAPL or hwmon power sensor under {}", root.display())
            };
            return Err(std::iter::once(sysfs).chain(reasons).collect::<Vec<_>>().join("; "));
        }
        Ok(PowerSources {
            rapl,
            hwmon,
            nvml,
            #[cfg(target_os = "macos")]
            ioreport,
            names,
        })
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
        if let Some(n) = &mut self.nvml {
            uj = uj.saturating_add(n.energy_since_last_uj(dt));
        }
        #[cfg(target_os = "macos")]
        if let Some(r) = &mut self.ioreport {
            uj = uj.saturating_add(r.energy_since_last_uj());
        }
        uj
    }
}
