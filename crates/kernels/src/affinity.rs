//! Pinning a [`ThreadPool`](crate::pool::ThreadPool)'s threads to CPUs, when
//! the pool fills the machine.
//!
//! Why: with one compute thread on every core, any other thread that wakes
//! (the server's HTTP threads once per streamed token, the client reading the
//! stream, a kernel worker) preempts a compute thread, and Linux's load
//! balancer then often *migrates* the preempted thread to the other core,
//! where a second compute thread spins at the pool's barrier: two compute
//! threads share one core until the spinner yields. One stream through
//! `serve` on 2 cores migrated its threads 182 times in 512 tokens (`bench`:
//! 18) and stepped 12% slower than `bench`; the same server with its two
//! compute threads pinned (`taskset` per thread) streamed 1.06× faster
//! (paired median of 10 alternating rounds). A pinned thread that is
//! preempted waits on its own core for the few microseconds the intruder
//! runs, and its caches stay warm.
//!
//! When: only where the binary allows it ([`allow_pinning`]: the CLI does,
//! library users and tests do not), for a pool of at least 2 threads that is
//! exactly as large as the process's allowed CPU set. A smaller pool (two
//! ranks of one thread on one machine, `--threads 2` on a 16-core box) is left
//! to the scheduler: pinning it would stack several processes' pools on the
//! same first CPUs. `SHARDLM_PIN=0` turns pinning off, `SHARDLM_PIN=1` pins
//! any pool of ≥ 2 threads that fits in the allowed set.
//!
//! Threads created by a pinned thread inherit its one-CPU mask; long-lived
//! helpers (the HTTP runtime, the disk writer) call [`unpin_current_thread`]
//! when they start.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::OnceLock;

static ALLOWED: AtomicBool = AtomicBool::new(false);

/// The process's CPU set before anything was pinned (read once, by the
/// first call to [`allow_pinning`] or [`plan`]).
fn original_cpus() -> &'static [usize] {
    static CPUS: OnceLock<Vec<usize>> = OnceLock::new();
    CPUS.get_or_init(os::current_cpus)
}

/// Lets pools pin their threads from now on (the binary calls this once at
/// start-up, before any pool exists). Reads `SHARDLM_PIN`.
pub fn allow_pinning() {
    let _ = original_cpus();
    ALLOWED.store(std::env::var("SHARDLM_PIN").map_or(true, |v| v != "0"), Relaxed);
}

/// The CPU for each of a pool's `n` threads (index 0: the caller), or `None`
/// when the pool is left to the scheduler (see the module docs).
pub fn plan(n: usize) -> Option<Vec<usize>> {
    if !ALLOWED.load(Relaxed) || n < 2 {
        return None;
    }
    let cpus = original_cpus();
    let forced = std::env::var("SHARDLM_PIN").is_ok_and(|v| v == "1");
    let fits = if forced { cpus.len() >= n } else { cpus.len() == n };
    fits.then(|| cpus[..n].to_vec())
}

/// Pins the calling thread to `cpu`; false where the system refuses (or is
/// not Linux), which leaves the thread as it was.
pub fn pin_current_thread(cpu: usize) -> bool {
    os::set_current(&[cpu])
}

/// Gives the calling thread the process's original CPU set back (a thread
/// spawned by a pinned one starts with its parent's single CPU).
pub fn unpin_current_thread() {
    let cpus = original_cpus();
    if !cpus.is_empty() {
        os::set_current(cpus);
    }
}

#[cfg(target_os = "linux")]
mod os {
    /// The calling thread's allowed CPUs, in order.
    pub fn current_cpus() -> Vec<usize> {
        // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity
        // writes at most size_of::<cpu_set_t>() bytes into it.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
                return Vec::new();
            }
            (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect()
        }
    }

    pub fn set_current(cpus: &[usize]) -> bool {
        // SAFETY: the set is built in place from CPU numbers below
        // CPU_SETSIZE and passed with its own size; pid 0 is this thread.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            for &c in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
                libc::CPU_SET(c, &mut set);
            }
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod os {
    pub fn current_cpus() -> Vec<usize> {
        Vec::new()
    }
    pub fn set_current(_: &[usize]) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_pinned_unless_the_binary_allows_it() {
        // Tests never call allow_pinning: every pool is left to the scheduler.
        assert_eq!(plan(original_cpus().len().max(2)), None);
        assert_eq!(plan(1), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_thread_pins_and_unpins() {
        let all = original_cpus().to_vec();
        std::thread::spawn(move || {
            assert!(pin_current_thread(all[0]));
            assert_eq!(os::current_cpus(), vec![all[0]]);
            unpin_current_thread();
            assert_eq!(os::current_cpus(), all);
        })
        .join()
        .unwrap();
    }
}
