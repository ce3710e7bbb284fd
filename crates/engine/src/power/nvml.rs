//! NVML: the energy of NVIDIA GPUs, read through `libnvidia-ml.so.1`, which the
//! NVIDIA driver installs. The library is loaded at run time (`dlopen`), so the
//! binary neither links against it nor needs it: where there is no driver the
//! reason says "NVML library … not found".
//!
//! Per GPU, `nvmlDeviceGetTotalEnergyConsumption` (mJ since the driver loaded,
//! Volta and later) is preferred; a GPU without it is read with
//! `nvmlDeviceGetPowerUsage` (mW, a moving average the driver keeps), which
//! is integrated over the sampling interval like a hwmon sensor.

use libloading::Library;
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr};
use std::time::Duration;

/// What the driver installs (the unversioned `libnvidia-ml.so` comes with
/// the development package only).
pub const DEFAULT_LIB: &str = "libnvidia-ml.so.1";

type NvmlReturn = c_int;
type Device = *mut c_void;
const NVML_SUCCESS: NvmlReturn = 0;
/// `NVML_DEVICE_NAME_V2_BUFFER_SIZE`.
const NAME_BYTES: usize = 96;

type InitFn = unsafe extern "C" fn() -> NvmlReturn;
type ShutdownFn = unsafe extern "C" fn() -> NvmlReturn;
type ErrorStringFn = unsafe extern "C" fn(NvmlReturn) -> *const c_char;
type CountFn = unsafe extern "C" fn(*mut c_uint) -> NvmlReturn;
type HandleFn = unsafe extern "C" fn(c_uint, *mut Device) -> NvmlReturn;
type NameFn = unsafe extern "C" fn(Device, *mut c_char, c_uint) -> NvmlReturn;
type EnergyFn = unsafe extern "C" fn(Device, *mut c_ulonglong) -> NvmlReturn;
type PowerFn = unsafe extern "C" fn(Device, *mut c_uint) -> NvmlReturn;

/// Why NVML gives no reading.
#[derive(Debug, thiserror::Error)]
pub enum NvmlError {
    #[error("NVML library {lib} not found ({why})")]
    LibraryNotFound { lib: String, why: String },
    #[error("NVML library {lib} has no {symbol} ({why})")]
    MissingSymbol { lib: String, symbol: &'static str, why: String },
    #[error("NVML {call} failed: {message} (code {code})")]
    Call { call: &'static str, code: i32, message: String },
    #[error("NVML found no devices")]
    NoDevices,
    #[error("no NVML device reports energy or power ({0})")]
    NoReading(String),
}

/// How a GPU is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuCounter {
    /// The total-energy counter (mJ), as last read.
    Energy { last_mj: u64 },
    /// Instantaneous power, integrated over each interval.
    Power,
}

/// One reading of a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuReading {
    EnergyMj(u64),
    PowerMw(u32),
}

/// µJ for one interval of `dt` ending with `reading`; updates the counter.
/// A total-energy counter that went backwards (the driver reloaded) counts
/// nothing and restarts from the new value.
pub fn interval_uj(counter: &mut GpuCounter, reading: GpuReading, dt: Duration) -> u64 {
    match (counter, reading) {
        (GpuCounter::Energy { last_mj }, GpuReading::EnergyMj(now)) => {
            let delta = now.saturating_sub(*last_mj);
            *last_mj = now;
            delta.saturating_mul(1000)
        }
        // mW × 1000 = µW; µW × s = µJ.
        (GpuCounter::Power, GpuReading::PowerMw(mw)) => (mw as f64 * 1e3 * dt.as_secs_f64()) as u64,
        // A reading of the other kind than the GPU was set up for: not counted.
        _ => 0,
    }
}

struct Gpu {
    handle: Device,
    name: String,
    counter: GpuCounter,
}

/// The NVML functions read per sample. The pointers stay valid while the
/// `Library` they came from is loaded ([`Nvml`] owns both).
#[derive(Clone, Copy)]
struct Api {
    shutdown: ShutdownFn,
    error_string: ErrorStringFn,
    energy: EnergyFn,
    power: PowerFn,
}

/// NVML, initialised, with the GPUs that give a reading.
pub struct Nvml {
    api: Api,
    gpus: Vec<Gpu>,
    /// Last: dropped after `Drop::drop` shut NVML down.
    _lib: Library,
}

// SAFETY: NVML's functions are thread-safe and its device handles are
// process-wide; `Nvml` is used by one thread at a time (the meter's).
unsafe impl Send for Nvml {}

impl std::fmt::Debug for Nvml {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nvml").field("gpus", &self.names()).finish()
    }
}

/// `name` from `lib`, as the C signature `T`.
///
/// # Safety
/// `T` must be the function pointer type NVML documents for `name`.
unsafe fn symbol<T: Copy>(lib: &Library, lib_name: &str, name: &'static str) -> Result<T, NvmlError> {
    // SAFETY: the caller gives the documented signature.
    let s = unsafe { lib.get::<T>(name.as_bytes()) };
    s.map(|s| *s).map_err(|e| NvmlError::MissingSymbol { lib: lib_name.to_string(), symbol: name, why: e.to_string() })
}

impl Nvml {
    /// Loads `lib` (a name the dynamic loader resolves, or a path), starts
    /// NVML and finds the GPUs that report energy or power.
    pub fn open(lib: &str) -> Result<Nvml, NvmlError> {
        // SAFETY: loading runs the library's initialisers; NVML's are benign.
        let library = unsafe { Library::new(lib) }
            .map_err(|e| NvmlError::LibraryNotFound { lib: lib.to_string(), why: e.to_string() })?;
        // SAFETY: each type is the C prototype in nvml.h for its symbol.
        let (init, api, count, handle_at, name_of) = unsafe {
            let init: InitFn = symbol(&library, lib, "nvmlInit_v2")?;
            let api = Api {
                shutdown: symbol(&library, lib, "nvmlShutdown")?,
                error_string: symbol(&library, lib, "nvmlErrorString")?,
                energy: symbol(&library, lib, "nvmlDeviceGetTotalEnergyConsumption")?,
                power: symbol(&library, lib, "nvmlDeviceGetPowerUsage")?,
            };
            let count: CountFn = symbol(&library, lib, "nvmlDeviceGetCount_v2")?;
            let handle_at: HandleFn = symbol(&library, lib, "nvmlDeviceGetHandleByIndex_v2")?;
            let name_of: NameFn = symbol(&library, lib, "nvmlDeviceGetName")?;
            (init, api, count, handle_at, name_of)
        };
        // SAFETY: no arguments; NVML counts its initialisations.
        let rc = unsafe { init() };
        if rc != NVML_SUCCESS {
            return Err(call_err(&api, "nvmlInit_v2", rc));
        }
        // From here `Drop` shuts NVML down on every path out.
        let mut nvml = Nvml { api, gpus: Vec::new(), _lib: library };
        let mut n: c_uint = 0;
        // SAFETY: `n` is a valid out-pointer.
        let rc = unsafe { count(&mut n) };
        if rc != NVML_SUCCESS {
            return Err(call_err(&api, "nvmlDeviceGetCount_v2", rc));
        }
        if n == 0 {
            return Err(NvmlError::NoDevices);
        }
        let mut unreadable = Vec::new();
        for i in 0..n {
            let mut handle: Device = std::ptr::null_mut();
            // SAFETY: `handle` is a valid out-pointer; `i` < the device count.
            let rc = unsafe { handle_at(i, &mut handle) };
            if rc != NVML_SUCCESS {
                unreadable.push(format!("GPU {i}: {}", call_err(&api, "nvmlDeviceGetHandleByIndex_v2", rc)));
                continue;
            }
            let mut buf = [0 as c_char; NAME_BYTES];
            // SAFETY: `buf` holds NAME_BYTES bytes; NVML writes a NUL-terminated name.
            let named = unsafe { name_of(handle, buf.as_mut_ptr(), NAME_BYTES as c_uint) } == NVML_SUCCESS;
            let model = if named {
                // SAFETY: NVML terminated it (and the buffer ends in the zeroes it started with).
                unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
            } else {
                "NVIDIA GPU".to_string()
            };
            let name = format!("GPU {i} {model}");
            let counter = match nvml.read(handle, true) {
                Ok(GpuReading::EnergyMj(mj)) => GpuCounter::Energy { last_mj: mj },
                _ => match nvml.read(handle, false) {
                    Ok(_) => GpuCounter::Power,
                    Err(e) => {
                        unreadable.push(format!("{name}: {e}"));
                        continue;
                    }
                },
            };
            nvml.gpus.push(Gpu { handle, name, counter });
        }
        if nvml.gpus.is_empty() {
            return Err(NvmlError::NoReading(unreadable.join("; ")));
        }
        Ok(nvml)
    }

    /// One reading of `gpu`: its energy counter, or its power.
    fn read(&self, gpu: Device, energy: bool) -> Result<GpuReading, NvmlError> {
        if energy {
            let mut mj: c_ulonglong = 0;
            // SAFETY: a handle NVML gave, a valid out-pointer.
            let rc = unsafe { (self.api.energy)(gpu, &mut mj) };
            return if rc == NVML_SUCCESS {
                Ok(GpuReading::EnergyMj(mj))
            } else {
                Err(call_err(&self.api, "nvmlDeviceGetTotalEnergyConsumption", rc))
            };
        }
        let mut mw: c_uint = 0;
        // SAFETY: as above.
        let rc = unsafe { (self.api.power)(gpu, &mut mw) };
        if rc == NVML_SUCCESS {
            Ok(GpuReading::PowerMw(mw))
        } else {
            Err(call_err(&self.api, "nvmlDeviceGetPowerUsage", rc))
        }
    }

    /// "nvml GPU 0 NVIDIA H100 (energy counter)", one per GPU read.
    pub fn names(&self) -> Vec<String> {
        self.gpus
            .iter()
            .map(|g| {
                let how = match g.counter {
                    GpuCounter::Energy { .. } => "energy counter",
                    GpuCounter::Power => "power, integrated",
                };
                format!("nvml {} ({how})", g.name)
            })
            .collect()
    }

    /// Energy of every GPU since the last call (µJ); a failed read counts nothing.
    pub fn energy_since_last_uj(&mut self, dt: Duration) -> u64 {
        let mut uj = 0u64;
        for i in 0..self.gpus.len() {
            let g = &self.gpus[i];
            let energy = matches!(g.counter, GpuCounter::Energy { .. });
            if let Ok(r) = self.read(g.handle, energy) {
                uj = uj.saturating_add(interval_uj(&mut self.gpus[i].counter, r, dt));
            }
        }
        uj
    }
}

fn call_err(api: &Api, call: &'static str, rc: NvmlReturn) -> NvmlError {
    // SAFETY: nvmlErrorString accepts any code and returns a static string (or null).
    let p = unsafe { (api.error_string)(rc) };
    let message = if p.is_null() {
        "unknown error".to_string()
    } else {
        // SAFETY: a NUL-terminated static string from NVML.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    };
    NvmlError::Call { call, code: rc, message }
}

impl Drop for Nvml {
    fn drop(&mut self) {
        // SAFETY: balances the successful nvmlInit_v2 of `open`.
        unsafe { (self.api.shutdown)() };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn energy_counter_counts_its_delta_in_microjoules() {
        let mut c = GpuCounter::Energy { last_mj: 1_000 };
        let dt = Duration::from_millis(20);
        assert_eq!(interval_uj(&mut c, GpuReading::EnergyMj(1_250), dt), 250_000);
        assert_eq!(c, GpuCounter::Energy { last_mj: 1_250 });
        assert_eq!(interval_uj(&mut c, GpuReading::EnergyMj(1_250), dt), 0);
        // The driver reloaded: the counter restarts lower; nothing is invented.
        assert_eq!(interval_uj(&mut c, GpuReading::EnergyMj(7), dt), 0);
        assert_eq!(interval_uj(&mut c, GpuReading::EnergyMj(10), dt), 3_000);
    }

    #[test]
    fn power_is_integrated_over_the_interval() {
        let mut c = GpuCounter::Power;
        // 300 W for 20 ms = 6 J.
        assert_eq!(interval_uj(&mut c, GpuReading::PowerMw(300_000), Duration::from_millis(20)), 6_000_000);
        assert_eq!(interval_uj(&mut c, GpuReading::EnergyMj(5), Duration::from_millis(20)), 0);
    }

    #[test]
    fn an_absent_library_is_named_as_not_found() {
        let e = Nvml::open("/nonexistent/libnvidia-ml.so.1").unwrap_err();
        assert!(matches!(e, NvmlError::LibraryNotFound { .. }), "{e:?}");
        let s = e.to_string();
        assert!(s.starts_with("NVML library /nonexistent/libnvidia-ml.so.1 not found ("), "{s}");
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn a_library_without_nvml_says_which_symbol_is_missing() {
        let e = Nvml::open("libc.so.6").unwrap_err();
        assert!(matches!(e, NvmlError::MissingSymbol { symbol: "nvmlInit_v2", .. }), "{e:?}");
    }
}
