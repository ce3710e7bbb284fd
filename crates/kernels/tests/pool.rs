//! Thread-pool stress: many runs, several sizes, nested and concurrent runs,
//! panics, drop while idle.

use shardlm_kernels::ThreadPool;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

#[test]
fn many_runs_various_sizes() {
    for n in [1, 2, 3, 4, 8] {
        let pool = ThreadPool::new(n);
        assert_eq!(pool.n_threads(), n);
        let total = AtomicUsize::new(0);
        let runs = if n > 2 { 800 } else { 3000 };
        for r in 0..runs {
            let mut out = vec![0usize; n];
            let p = out.as_mut_ptr() as usize;
            pool.run(|t, nt| {
                assert_eq!(nt, n);
                // SAFETY: each index writes its own slot.
                unsafe { *(p as *mut usize).add(t) = t + r };
                total.fetch_add(1, SeqCst);
            });
            assert!(out.iter().enumerate().all(|(t, &v)| v == t + r));
            if r % 500 == 0 {
                // Let workers go to sleep, then wake them again.
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        }
        assert_eq!(total.load(SeqCst), runs * n);
    }
}

#[test]
fn nested_and_concurrent_runs_do_not_deadlock() {
    let pool = Arc::new(ThreadPool::new(3));
    let count = Arc::new(AtomicUsize::new(0));
    // Nested: the inner run falls back to running every index inline.
    pool.run(|_, _| {
        pool.run(|_, _| {
            count.fetch_add(1, SeqCst);
        });
    });
    assert_eq!(count.load(SeqCst), 9);
    // Concurrent callers from several threads.
    count.store(0, SeqCst);
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let (pool, count) = (pool.clone(), count.clone());
            std::thread::spawn(move || {
                for _ in 0..500 {
                    pool.run(|_, _| {
                        count.fetch_add(1, SeqCst);
                    });
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(count.load(SeqCst), 4 * 500 * 3);
}

#[test]
fn worker_panic_propagates_and_pool_survives() {
    let pool = ThreadPool::new(3);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        pool.run(|t, _| {
            if t == 2 {
                panic!("boom");
            }
        })
    }));
    assert!(r.is_err());
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        pool.run(|t, _| {
            if t == 0 {
                panic!("boom on caller");
            }
        })
    }));
    assert!(r.is_err());
    let c = AtomicUsize::new(0);
    pool.run(|_, _| {
        c.fetch_add(1, SeqCst);
    });
    assert_eq!(c.load(SeqCst), 3);
}

#[test]
fn create_and_drop_many() {
    for i in 0..50 {
        let pool = ThreadPool::new(1 + i % 4);
        if i % 2 == 0 {
            pool.run(|_, _| {});
        }
    }
}

#[test]
fn workers_take_part() {
    let pool = ThreadPool::new(3);
    let caller = std::thread::current().id();
    let mut helped = false;
    for _ in 0..20 {
        let other = AtomicUsize::new(0);
        pool.run(|t, _| {
            if t == 0 {
                // Give the workers time to claim their indices.
                std::thread::sleep(std::time::Duration::from_millis(5));
            } else if std::thread::current().id() != caller {
                other.fetch_add(1, SeqCst);
            }
        });
        if other.load(SeqCst) > 0 {
            helped = true;
            break;
        }
    }
    assert!(helped, "no index ever ran on a worker thread");
}
