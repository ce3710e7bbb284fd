//! The sampling thread: energy per interval, attributed to the phase the
//! process was in (prefill or decode steps, [`enter`]).

use super::{sysfs_root, PowerSources, SAMPLE_EVERY};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The window of [`PowerMeter::watts_recent`].
pub const RECENT: Duration = Duration::from_secs(1);

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
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
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
    /// The intervals of the last [`RECENT`]: (joules, seconds).
    recent: VecDeque<(f64, f64)>,
    total_j: f64,
    /// Joules since the start, through resets.
    lifetime_j: f64,
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
                kernels::affinity::unpin_current_thread();
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
                    g.lifetime_j += j;
                    g.last_w = Some(j / s.max(1e-9));
                    g.recent.push_back((j, s));
                    while g.recent.len() > 1 && g.recent.iter().map(|r| r.1).sum::<f64>() > RECENT.as_secs_f64() {
                        g.recent.pop_front();
                    }
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

    /// Mean watts over the last [`RECENT`] (`None` before the first interval):
    /// steadier than [`Self::watts`] for a page to show.
    pub fn watts_recent(&self) -> Option<f64> {
        let g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (j, s) = g.recent.iter().fold((0.0, 0.0), |(j, s), r| (j + r.0, s + r.1));
        (s > 0.0).then(|| j / s)
    }

    /// Joules measured since the meter started (not reset by [`Self::reset`]).
    pub fn joules_total(&self) -> f64 {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).lifetime_j
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
