//! Prometheus counters, gauges and histograms kept in atomics, rendered as the
//! text exposition format on `GET /metrics`.

use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

/// Upper bounds (seconds) shared by the latency histograms.
const LATENCY_BUCKETS: [f64; 14] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

pub struct Histogram {
    /// Cumulative counts are computed at render; these are per-bucket (+Inf last).
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    /// Sum in microseconds (integers keep it atomic).
    sum_us: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    fn new() -> Histogram {
        Histogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_us: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, seconds: f64) {
        let i = LATENCY_BUCKETS.iter().position(|&b| seconds <= b).unwrap_or(LATENCY_BUCKETS.len());
        self.buckets[i].fetch_add(1, Relaxed);
        self.sum_us.fetch_add((seconds.max(0.0) * 1e6) as u64, Relaxed);
        self.count.fetch_add(1, Relaxed);
    }

    fn render(&self, name: &str, help: &str, out: &mut String) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, b) in LATENCY_BUCKETS.iter().enumerate() {
            cumulative += self.buckets[i].load(Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cumulative}");
        }
        cumulative += self.buckets[LATENCY_BUCKETS.len()].load(Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
        let _ = writeln!(out, "{name}_sum {}", self.sum_us.load(Relaxed) as f64 / 1e6);
        let _ = writeln!(out, "{name}_count {}", self.count.load(Relaxed));
    }
}

fn counter(out: &mut String, name: &str, help: &str, v: u64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
}

fn gauge(out: &mut String, name: &str, help: &str, v: i64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
}

fn gauge_f(out: &mut String, name: &str, help: &str, v: f64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
}

/// Everything `/metrics` shows. One per server, shared by handlers and the worker.
pub struct Metrics {
    pub requests_total: AtomicU64,
    pub requests_failed: AtomicU64,
    pub requests_cancelled: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    /// Requests waiting for the engine.
    pub queue_depth: AtomicI64,
    /// Requests admitted and not yet finished (queued or generating).
    pub active: AtomicI64,
    pub ttft: Histogram,
    pub inter_token: Histogram,
    pub request_duration: Histogram,
    /// The engine thread has ended (`/health` reports degraded).
    pub engine_stopped: std::sync::atomic::AtomicBool,
    // The paged KV cache and the scheduler own the numbers below and store
    // them here; the server only renders them. Block counts are gauges
    // (`total = used + cached + free`), the prefix cache counters only grow.
    /// Blocks in the KV pool.
    pub kv_blocks_total: AtomicI64,
    /// Blocks referenced by running sequences.
    pub kv_blocks_used: AtomicI64,
    /// Unreferenced blocks kept for the prefix cache (evictable).
    pub kv_blocks_cached: AtomicI64,
    /// Blocks holding nothing.
    pub kv_blocks_free: AtomicI64,
    /// Tokens per KV block.
    pub kv_block_size: AtomicI64,
    /// The sliding-window layers' block group (all 0 without one), counted
    /// as the blocks above.
    pub kv_window_blocks_total: AtomicI64,
    pub kv_window_blocks_used: AtomicI64,
    pub kv_window_blocks_cached: AtomicI64,
    pub kv_window_blocks_free: AtomicI64,
    /// Bytes of rank 0's KV pool: full and window blocks, recurrent states.
    pub kv_pool_bytes: AtomicI64,
    /// Prompts looked up in the prefix cache.
    pub prefix_queries: AtomicU64,
    /// Lookups that matched at least one block.
    pub prefix_hits: AtomicU64,
    /// Prompt tokens served from the prefix cache instead of a prefill.
    pub prefix_cached_tokens: AtomicU64,
    /// The part of `prefix_cached_tokens` loaded from the disk tier.
    pub prefix_disk_tokens: AtomicU64,
    /// The disk tier (`--kv-disk`): blocks held and the bound, blocks
    /// written and loaded, loads some rank could not make, and rank 0's
    /// bytes written and read and unusable files found.
    pub kv_disk_blocks: AtomicI64,
    pub kv_disk_capacity_blocks: AtomicI64,
    pub kv_disk_blocks_written: AtomicU64,
    pub kv_disk_blocks_loaded: AtomicU64,
    pub kv_disk_load_failures: AtomicU64,
    pub kv_disk_bytes_written: AtomicU64,
    pub kv_disk_bytes_read: AtomicU64,
    pub kv_disk_corrupt_files: AtomicU64,
    pub kv_disk_load_us: AtomicU64,
    /// Sequences in the last forward step.
    pub batch_size: AtomicI64,
    /// Sequences evicted from the KV cache to make room (to be recomputed).
    pub preemptions: AtomicU64,
    /// Speculative decoding: verify steps, draft tokens checked and accepted.
    pub spec_steps: AtomicU64,
    pub spec_drafted: AtomicU64,
    pub spec_accepted: AtomicU64,
    /// Why the cluster is degraded ("rank 1 lost at 12:03:04: …"), while it is
    /// being re-formed; `None` when every rank serves.
    pub degraded: std::sync::Mutex<Option<String>>,
    /// Since when it has been degraded.
    pub degraded_since: std::sync::Mutex<Option<std::time::Instant>>,
    /// Times the cluster lost a rank, and times it was re-formed.
    pub rank_losses: AtomicU64,
    pub cluster_reforms: AtomicU64,
    /// The rank being replaced (−1: none), for `GET /cluster`.
    pub lost_rank: AtomicI64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests_total: AtomicU64::new(0),
            requests_failed: AtomicU64::new(0),
            requests_cancelled: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            generated_tokens: AtomicU64::new(0),
            queue_depth: AtomicI64::new(0),
            active: AtomicI64::new(0),
            ttft: Histogram::new(),
            inter_token: Histogram::new(),
            request_duration: Histogram::new(),
            engine_stopped: std::sync::atomic::AtomicBool::new(false),
            kv_blocks_total: AtomicI64::new(0),
            kv_blocks_used: AtomicI64::new(0),
            kv_blocks_cached: AtomicI64::new(0),
            kv_blocks_free: AtomicI64::new(0),
            kv_block_size: AtomicI64::new(0),
            kv_window_blocks_total: AtomicI64::new(0),
            kv_window_blocks_used: AtomicI64::new(0),
            kv_window_blocks_cached: AtomicI64::new(0),
            kv_window_blocks_free: AtomicI64::new(0),
            kv_pool_bytes: AtomicI64::new(0),
            prefix_queries: AtomicU64::new(0),
            prefix_hits: AtomicU64::new(0),
            prefix_cached_tokens: AtomicU64::new(0),
            prefix_disk_tokens: AtomicU64::new(0),
            kv_disk_blocks: AtomicI64::new(0),
            kv_disk_capacity_blocks: AtomicI64::new(0),
            kv_disk_blocks_written: AtomicU64::new(0),
            kv_disk_blocks_loaded: AtomicU64::new(0),
            kv_disk_load_failures: AtomicU64::new(0),
            kv_disk_bytes_written: AtomicU64::new(0),
            kv_disk_bytes_read: AtomicU64::new(0),
            kv_disk_corrupt_files: AtomicU64::new(0),
            kv_disk_load_us: AtomicU64::new(0),
            batch_size: AtomicI64::new(0),
            preemptions: AtomicU64::new(0),
            spec_steps: AtomicU64::new(0),
            spec_drafted: AtomicU64::new(0),
            spec_accepted: AtomicU64::new(0),
            degraded: std::sync::Mutex::new(None),
            degraded_since: std::sync::Mutex::new(None),
            rank_losses: AtomicU64::new(0),
            cluster_reforms: AtomicU64::new(0),
            lost_rank: AtomicI64::new(-1),
        }
    }
}

impl Metrics {
    /// The degraded reason, if any.
    pub fn degraded(&self) -> Option<String> {
        self.degraded.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn set_degraded(&self, why: Option<String>) {
        let mut since = self.degraded_since.lock().unwrap_or_else(|e| e.into_inner());
        *since = why.as_ref().map(|_| since.unwrap_or_else(std::time::Instant::now));
        *self.degraded.lock().unwrap_or_else(|e| e.into_inner()) = why;
    }

    /// How long the cluster has been degraded (`None`: it is not).
    pub fn degraded_for(&self) -> Option<std::time::Duration> {
        self.degraded_since.lock().unwrap_or_else(|e| e.into_inner()).map(|t| t.elapsed())
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        counter(&mut out, "shardlm_requests_total", "Generation requests admitted.", self.requests_total.load(Relaxed));
        counter(
            &mut out,
            "shardlm_requests_failed_total",
            "Requests that ended in an error.",
            self.requests_failed.load(Relaxed),
        );
        counter(
            &mut out,
            "shardlm_requests_cancelled_total",
            "Requests cancelled by a client disconnect.",
            self.requests_cancelled.load(Relaxed),
        );
        counter(&mut out, "shardlm_prompt_tokens_total", "Prompt tokens processed.", self.prompt_tokens.load(Relaxed));
        counter(
            &mut out,
            "shardlm_rank_losses_total",
            "Times the cluster lost a rank.",
            self.rank_losses.load(Relaxed),
        );
        counter(
            &mut out,
            "shardlm_cluster_reforms_total",
            "Times the cluster was re-formed after a loss.",
            self.cluster_reforms.load(Relaxed),
        );
        gauge(
            &mut out,
            "shardlm_degraded",
            "1 while a lost rank is being replaced.",
            i64::from(self.degraded().is_some()),
        );
        counter(&mut out, "shardlm_generation_tokens_total", "Tokens generated.", self.generated_tokens.load(Relaxed));
        gauge(&mut out, "shardlm_queue_depth", "Requests waiting for the engine.", self.queue_depth.load(Relaxed));
        gauge(&mut out, "shardlm_active_requests", "Requests queued or generating.", self.active.load(Relaxed));
        self.render_kv(&mut out);
        self.ttft.render("shardlm_time_to_first_token_seconds", "Time from admission to the first token.", &mut out);
        self.inter_token.render("shardlm_inter_token_latency_seconds", "Time between generated tokens.", &mut out);
        self.request_duration.render("shardlm_request_duration_seconds", "Time from admission to the end.", &mut out);
        out
    }

    /// The KV pool, prefix cache and batch numbers the engine stores.
    fn render_kv(&self, out: &mut String) {
        let g = |a: &AtomicI64| a.load(Relaxed);
        let c = |a: &AtomicU64| a.load(Relaxed);
        gauge(out, "shardlm_kv_blocks_total", "Blocks in the KV cache pool.", g(&self.kv_blocks_total));
        gauge(out, "shardlm_kv_blocks_used", "KV blocks referenced by running sequences.", g(&self.kv_blocks_used));
        gauge(
            out,
            "shardlm_kv_blocks_cached",
            "Unreferenced KV blocks kept for the prefix cache (evictable).",
            g(&self.kv_blocks_cached),
        );
        gauge(out, "shardlm_kv_blocks_free", "KV blocks holding nothing.", g(&self.kv_blocks_free));
        gauge(out, "shardlm_kv_block_size_tokens", "Tokens per KV block.", g(&self.kv_block_size));
        for (name, help, v) in [
            ("total", "Blocks of the sliding-window layers' group.", &self.kv_window_blocks_total),
            ("used", "Window blocks referenced by running sequences.", &self.kv_window_blocks_used),
            ("cached", "Unreferenced window blocks kept for the prefix cache.", &self.kv_window_blocks_cached),
            ("free", "Window blocks holding nothing.", &self.kv_window_blocks_free),
        ] {
            gauge(out, &format!("shardlm_kv_window_blocks_{name}"), help, g(v));
        }
        gauge(
            out,
            "shardlm_kv_pool_bytes",
            "Bytes of rank 0's KV pool (full and window blocks, recurrent states).",
            g(&self.kv_pool_bytes),
        );
        counter(
            out,
            "shardlm_prefix_cache_queries_total",
            "Prompts looked up in the prefix cache.",
            c(&self.prefix_queries),
        );
        counter(
            out,
            "shardlm_prefix_cache_hits_total",
            "Prefix cache lookups that matched at least one block.",
            c(&self.prefix_hits),
        );
        counter(
            out,
            "shardlm_prefix_cache_cached_tokens_total",
            "Prompt tokens served from the prefix cache instead of a prefill.",
            c(&self.prefix_cached_tokens),
        );
        let (cached, disk) = (c(&self.prefix_cached_tokens), c(&self.prefix_disk_tokens));
        counter(
            out,
            "shardlm_prefix_cache_ram_tokens_total",
            "Prompt tokens whose KV was still in RAM.",
            cached.saturating_sub(disk),
        );
        counter(out, "shardlm_prefix_cache_disk_tokens_total", "Prompt tokens whose KV was loaded from disk.", disk);
        gauge(out, "shardlm_kv_disk_blocks", "KV blocks in the disk tier.", g(&self.kv_disk_blocks));
        gauge(
            out,
            "shardlm_kv_disk_capacity_blocks",
            "The disk tier's bound, in blocks (--kv-disk-bytes over the largest rank's block file).",
            g(&self.kv_disk_capacity_blocks),
        );
        counter(
            out,
            "shardlm_kv_disk_blocks_written_total",
            "Blocks written to the disk tier.",
            c(&self.kv_disk_blocks_written),
        );
        counter(
            out,
            "shardlm_kv_disk_blocks_loaded_total",
            "Blocks loaded from the disk tier.",
            c(&self.kv_disk_blocks_loaded),
        );
        counter(
            out,
            "shardlm_kv_disk_load_failures_total",
            "Disk loads some rank could not make (missing, torn or corrupt file): recomputed.",
            c(&self.kv_disk_load_failures),
        );
        counter(
            out,
            "shardlm_kv_disk_bytes_written_total",
            "Bytes rank 0 wrote to the disk tier.",
            c(&self.kv_disk_bytes_written),
        );
        counter(
            out,
            "shardlm_kv_disk_bytes_read_total",
            "Bytes rank 0 read from the disk tier.",
            c(&self.kv_disk_bytes_read),
        );
        counter(
            out,
            "shardlm_kv_disk_corrupt_files_total",
            "Block files rank 0 found torn or corrupt (deleted and recomputed).",
            c(&self.kv_disk_corrupt_files),
        );
        counter(
            out,
            "shardlm_kv_disk_load_microseconds_total",
            "Time spent loading blocks from the disk tier (every rank's reads and the round trip).",
            c(&self.kv_disk_load_us),
        );
        gauge(out, "shardlm_batch_size", "Sequences in the last forward step.", g(&self.batch_size));
        counter(
            out,
            "shardlm_preemptions_total",
            "Sequences evicted from the KV cache to make room, to be recomputed.",
            c(&self.preemptions),
        );
        counter(
            out,
            "shardlm_spec_verify_steps_total",
            "Speculative decoding: verify items (a sequence's last token and its draft, checked in one pass).",
            c(&self.spec_steps),
        );
        counter(
            out,
            "shardlm_spec_draft_tokens_total",
            "Speculative decoding: draft tokens checked.",
            c(&self.spec_drafted),
        );
        counter(
            out,
            "shardlm_spec_accepted_tokens_total",
            "Speculative decoding: draft tokens accepted (each one a decode step saved).",
            c(&self.spec_accepted),
        );
        let (d, a) = (self.spec_drafted.load(Relaxed), self.spec_accepted.load(Relaxed));
        gauge_f(
            out,
            "shardlm_spec_acceptance_rate",
            "Speculative decoding: accepted over drafted tokens since start (0 before any draft).",
            if d == 0 { 0.0 } else { a as f64 / d as f64 },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let m = Metrics::default();
        m.ttft.observe(0.003);
        m.ttft.observe(0.2);
        m.ttft.observe(100.0);
        let text = m.render();
        assert!(text.contains("shardlm_time_to_first_token_seconds_bucket{le=\"0.005\"} 1"), "{text}");
        assert!(text.contains("shardlm_time_to_first_token_seconds_bucket{le=\"0.25\"} 2"));
        assert!(text.contains("shardlm_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3"));
        assert!(text.contains("shardlm_time_to_first_token_seconds_count 3"));
    }

    #[test]
    fn kv_and_prefix_cache_numbers_are_rendered_with_help_and_type() {
        let m = Metrics::default();
        m.kv_blocks_total.store(100, Relaxed);
        m.kv_blocks_used.store(7, Relaxed);
        m.prefix_cached_tokens.fetch_add(64, Relaxed);
        m.batch_size.store(8, Relaxed);
        let text = m.render();
        for (name, kind) in [
            ("shardlm_kv_blocks_total", "gauge"),
            ("shardlm_kv_blocks_used", "gauge"),
            ("shardlm_kv_blocks_cached", "gauge"),
            ("shardlm_kv_blocks_free", "gauge"),
            ("shardlm_kv_block_size_tokens", "gauge"),
            ("shardlm_kv_window_blocks_total", "gauge"),
            ("shardlm_kv_window_blocks_free", "gauge"),
            ("shardlm_kv_pool_bytes", "gauge"),
            ("shardlm_prefix_cache_queries_total", "counter"),
            ("shardlm_prefix_cache_hits_total", "counter"),
            ("shardlm_prefix_cache_cached_tokens_total", "counter"),
            ("shardlm_batch_size", "gauge"),
            ("shardlm_preemptions_total", "counter"),
            ("shardlm_spec_draft_tokens_total", "counter"),
            ("shardlm_spec_accepted_tokens_total", "counter"),
            ("shardlm_spec_acceptance_rate", "gauge"),
        ] {
            assert!(text.contains(&format!("# HELP {name} ")), "{name}");
            assert!(text.contains(&format!("# TYPE {name} {kind}\n")), "{name}");
        }
        assert!(text.contains("\nshardlm_kv_blocks_total 100\n"));
        assert!(text.contains("\nshardlm_kv_blocks_used 7\n"));
        assert!(text.contains("\nshardlm_prefix_cache_cached_tokens_total 64\n"));
        assert!(text.contains("\nshardlm_batch_size 8\n"));
    }
}
