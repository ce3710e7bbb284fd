//! A persistent thread pool with spin-then-park barriers.
//!
//! Batch-1 decode runs ~10 ops per layer; a fork-join that wakes threads through the
//! OS per op costs more than the op. Workers stay alive and spin briefly on an epoch
//! counter before parking.
//!
//! Protocol of one [`ThreadPool::run`]:
//! 1. the caller (holding `run_lock`) stores a lifetime-erased pointer to the job,
//!    sets `remaining = n − 1` and bumps `epoch`; parked workers are woken only if
//!    some are parked (`sleepers > 0`), so the hot path makes no system call;
//! 2. every worker sees the new epoch, runs `job(index, n)`, decrements `remaining`;
//! 3. the caller runs `job(0, n)`, then runs itself every index no worker has
//!    claimed yet (a worker that is parked or descheduled does not hold the op
//!    up), then waits (spinning, then sleeping) until `remaining == 0`. Only then
//!    does `run` return, so the borrowed job outlives every use of the erased
//!    pointer.
//!
//! Claims are epoch stamps (`claims[t]` = the last epoch whose index `t` was
//! taken), set by compare-and-swap, so each index runs exactly once per `run`
//! and a worker that wakes late for an old epoch never touches a newer job.
//!
//! Pinning: where [`crate::affinity::plan`] says so (the binary allowed it and
//! the pool fills the process's CPUs), worker `i` pins itself to the plan's
//! CPU `i` when it starts, and a thread that calls [`ThreadPool::run`] pins
//! itself to CPU 0 of the plan on its first call (a per-thread check after
//! that).
//!
//! A `run` issued while another is in flight (from another thread, or nested
//! inside a job) does not wait for the pool: it runs all `n` indices itself, in
//! order, on the calling thread. That keeps the pool deadlock-free.

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

type Job = *const (dyn Fn(usize, usize) + Sync + 'static);

/// How long a worker (or a waiting caller) spins before sleeping.
fn spin_budget() -> Duration {
    static US: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    Duration::from_micros(
        *US.get_or_init(|| std::env::var("SHARDLM_SPIN_US").ok().and_then(|v| v.parse().ok()).unwrap_or(300)),
    )
}

struct Shared {
    n: usize,
    epoch: AtomicUsize,
    job: UnsafeCell<Option<Job>>,
    remaining: AtomicUsize,
    claims: Box<[AtomicUsize]>,
    panicked: AtomicBool,
    shutdown: AtomicBool,
    sleepers: AtomicUsize,
    wake_mx: Mutex<()>,
    wake_cv: Condvar,
    caller_sleeping: AtomicBool,
    done_mx: Mutex<()>,
    done_cv: Condvar,
}

// SAFETY: `job` is written only by the thread holding `run_lock` while no worker
// reads it (before the epoch bump / after `remaining` reached 0), and the pointee
// is `Sync`.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

fn lock(m: &Mutex<()>) -> MutexGuard<'_, ()> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Spins (with exponential pause) until `done()` or the budget runs out.
#[inline]
fn spin_until(mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    let budget = spin_budget();
    let mut i = 0u32;
    loop {
        if done() {
            return true;
        }
        i = i.wrapping_add(1);
        if i.is_multiple_of(64) {
            if start.elapsed() > budget {
                return false;
            }
            if i.is_multiple_of(4096) {
                // Oversubscribed machines: let the thread we wait for run.
                std::thread::yield_now();
            }
        }
        std::hint::spin_loop();
    }
}

/// Takes index `t` for epoch `e` unless someone already did.
#[inline]
fn claim(shared: &Shared, t: usize, e: usize) -> bool {
    let c = &shared.claims[t];
    let mut cur = c.load(SeqCst);
    while cur < e {
        match c.compare_exchange(cur, e, SeqCst, SeqCst) {
            Ok(_) => return true,
            Err(now) => cur = now,
        }
    }
    false
}

/// Runs index `t` of the current job and counts it done.
///
/// # Safety
/// `t` must have been claimed for the epoch whose job is stored.
unsafe fn execute(shared: &Shared, t: usize) {
    let job = (*shared.job.get()).expect("job set");
    if catch_unwind(AssertUnwindSafe(|| (*job)(t, shared.n))).is_err() {
        shared.panicked.store(true, SeqCst);
    }
    if shared.remaining.fetch_sub(1, SeqCst) == 1 && shared.caller_sleeping.load(SeqCst) {
        let _g = lock(&shared.done_mx);
        shared.done_cv.notify_one();
    }
}

fn worker(shared: Arc<Shared>, index: usize, cpu: Option<usize>) {
    if let Some(c) = cpu {
        crate::affinity::pin_current_thread(c);
    }
    let mut seen = 0usize;
    loop {
        if !spin_until(|| shared.epoch.load(SeqCst) != seen) {
            let mut g = lock(&shared.wake_mx);
            shared.sleepers.fetch_add(1, SeqCst);
            while shared.epoch.load(SeqCst) == seen {
                g = shared.wake_cv.wait(g).unwrap_or_else(|e| e.into_inner());
            }
            shared.sleepers.fetch_sub(1, SeqCst);
        }
        seen = shared.epoch.load(SeqCst);
        if shared.shutdown.load(SeqCst) {
            return;
        }
        if claim(&shared, index, seen) {
            // SAFETY: a successful claim for `seen` means that run is still in
            // progress (it cannot finish without this index), so its job is alive.
            unsafe { execute(&shared, index) };
        }
    }
}

/// Persistent worker pool. The calling thread takes part as thread 0.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    run_lock: Mutex<()>,
    /// Where a calling thread pins itself (see the module docs).
    caller_cpu: Option<usize>,
}

thread_local! {
    /// The CPU this thread pinned itself to as a pool's caller, plus one (0: none).
    static CALLER_PINNED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

impl ThreadPool {
    /// A pool of `n_threads` (≥ 1) threads in total, including the caller.
    pub fn new(n_threads: usize) -> Self {
        let n = n_threads.max(1);
        let shared = Arc::new(Shared {
            n,
            epoch: AtomicUsize::new(0),
            job: UnsafeCell::new(None),
            remaining: AtomicUsize::new(0),
            claims: (0..n).map(|_| AtomicUsize::new(0)).collect(),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            wake_mx: Mutex::new(()),
            wake_cv: Condvar::new(),
            caller_sleeping: AtomicBool::new(false),
            done_mx: Mutex::new(()),
            done_cv: Condvar::new(),
        });
        let cpus = crate::affinity::plan(n);
        let workers = (1..n)
            .map(|i| {
                let s = shared.clone();
                let cpu = cpus.as_ref().map(|c| c[i]);
                std::thread::Builder::new()
                    .name(format!("shardlm-worker-{i}"))
                    .spawn(move || worker(s, i, cpu))
                    .expect("spawn pool worker")
            })
            .collect();
        ThreadPool { shared, workers, run_lock: Mutex::new(()), caller_cpu: cpus.map(|c| c[0]) }
    }

    /// A pool sized to the machine's available parallelism.
    pub fn with_available_parallelism() -> Self {
        Self::new(std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
    }

    pub fn n_threads(&self) -> usize {
        self.shared.n
    }

    /// Runs `f(thread_index, n_threads)` once for every index and returns when all
    /// have finished. `f` must split its own work by `thread_index`. Indices
    /// normally run on different threads at once, but one whose worker is late
    /// is run by the caller after its own, so `f` must never wait for another
    /// index (no barriers inside `f`).
    pub fn run<F: Fn(usize, usize) + Sync>(&self, f: F) {
        let n = self.shared.n;
        if n == 1 {
            f(0, 1);
            return;
        }
        let guard = match self.run_lock.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => {
                // Busy (concurrent or nested run): do all the work here.
                for t in 0..n {
                    f(t, n);
                }
                return;
            }
        };
        if let Some(c) = self.caller_cpu {
            if CALLER_PINNED.get() != c + 1 {
                // Once per thread, whether or not the system allows it.
                CALLER_PINNED.set(c + 1);
                crate::affinity::pin_current_thread(c);
            }
        }
        let s = &*self.shared;
        let job: *const (dyn Fn(usize, usize) + Sync + '_) = &f;
        // SAFETY: only the lifetime is erased; we wait below until no worker can
        // touch the pointer any more, before `f` goes out of scope.
        unsafe { *s.job.get() = Some(std::mem::transmute::<*const (dyn Fn(usize, usize) + Sync + '_), Job>(job)) };
        s.remaining.store(n - 1, SeqCst);
        let e = s.epoch.fetch_add(1, SeqCst) + 1;
        if s.sleepers.load(SeqCst) > 0 {
            let _g = lock(&s.wake_mx);
            s.wake_cv.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| f(0, n)));
        for t in 1..n {
            if claim(s, t, e) {
                // SAFETY: claimed for the current epoch, whose job is `f`.
                unsafe { execute(s, t) };
            }
        }
        if !spin_until(|| s.remaining.load(SeqCst) == 0) {
            let mut g = lock(&s.done_mx);
            s.caller_sleeping.store(true, SeqCst);
            while s.remaining.load(SeqCst) != 0 {
                g = s.done_cv.wait(g).unwrap_or_else(|e| e.into_inner());
            }
            s.caller_sleeping.store(false, SeqCst);
        }
        // SAFETY: all workers are done with this job.
        unsafe { *s.job.get() = None };
        let worker_panicked = s.panicked.swap(false, SeqCst);
        drop(guard);
        if let Err(p) = mine {
            resume_unwind(p);
        }
        if worker_panicked {
            panic!("a shardlm thread-pool worker panicked");
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        let s = &*self.shared;
        s.shutdown.store(true, SeqCst);
        s.epoch.fetch_add(1, SeqCst);
        {
            let _g = lock(&s.wake_mx);
            s.wake_cv.notify_all();
        }
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool").field("n_threads", &self.shared.n).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_index_once() {
        for n in [1, 2, 3, 5] {
            let pool = ThreadPool::new(n);
            for _ in 0..200 {
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                pool.run(|t, nt| {
                    assert_eq!(nt, n);
                    hits[t].fetch_add(1, SeqCst);
                });
                assert!(hits.iter().all(|h| h.load(SeqCst) == 1));
            }
        }
    }
}
