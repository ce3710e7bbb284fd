//! The engine side of the server: one thread owns the `Engine` and runs the
//! continuous-batching scheduler (`engine::serving`) over every admitted job.
//! Handlers talk to it only through `EngineHandle::submit`, which returns a
//! channel of `Event`s.
//!
//! A job is cancelled when its event receiver is dropped (the client went away):
//! the scheduler polls `cancelled()` before every step and frees its KV blocks.

use crate::guide::JsonGuide;
use crate::lazy_guide::{Lazy, LazyCalls};
use crate::metrics::Metrics;
use engine::generate::{Engine, FinishReason, GenerateHooks, GenerateRequest};
use engine::serving::{Scheduler, SchedulerConfig, SchedulerStats, SeqHooks, SeqOutcome, Submission};
use engine::EngineError;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

/// What the engine reports for a job, in order: `Text`*, then `Done` or `Error`.
#[derive(Debug)]
pub enum Event {
    Text(String),
    /// The lazy guide took hold of a call the model opened (sent before the
    /// text that holds the call's marker): that call can stream.
    Guided,
    Done(Finished),
    Error(String),
}

#[derive(Debug, Clone)]
pub struct Finished {
    pub finish: FinishReason,
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV came from the prefix cache instead of a prefill
    /// (reported as `cached_tokens` / `cache_read_input_tokens`).
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    /// The guide saw a complete JSON value (constrained decoding ended it).
    pub guide_complete: bool,
    /// The stop string that ended the output.
    pub stop_sequence: Option<String>,
}

/// One request for the engine.
pub struct Job {
    pub request: GenerateRequest,
    /// Constrained decoding (forced tool call, `json_schema`), if any.
    pub guide: Option<JsonGuide>,
    /// Guides the calls the model opens on its own (`tool_choice` auto).
    pub lazy: Option<LazyCalls>,
    events: mpsc::UnboundedSender<Event>,
    admitted: Instant,
    _active: ActiveGuard,
}

/// Counts a job in `shardlm_active_requests` from admission until the worker drops it.
struct ActiveGuard(Arc<Metrics>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Relaxed);
    }
}

#[derive(Clone)]
pub struct EngineHandle {
    tx: std::sync::mpsc::Sender<Job>,
    pub metrics: Arc<Metrics>,
}

impl EngineHandle {
    /// Whether the engine thread still takes jobs.
    pub fn is_alive(&self) -> bool {
        !self.metrics.engine_stopped.load(Relaxed)
    }

    /// Queues a job; its events arrive on the returned receiver. Dropping the
    /// receiver cancels the job.
    pub fn submit(
        &self,
        request: GenerateRequest,
        guide: Option<JsonGuide>,
        lazy: Option<LazyCalls>,
    ) -> Result<mpsc::UnboundedReceiver<Event>, String> {
        let (events, rx) = mpsc::unbounded_channel();
        self.metrics.active.fetch_add(1, Relaxed);
        self.metrics.requests_total.fetch_add(1, Relaxed);
        let job =
            Job { request, guide, lazy, events, admitted: Instant::now(), _active: ActiveGuard(self.metrics.clone()) };
        self.metrics.queue_depth.fetch_add(1, Relaxed);
        self.tx.send(job).map_err(|_| {
            self.metrics.queue_depth.fetch_sub(1, Relaxed);
            "the engine has stopped".to_string()
        })?;
        Ok(rx)
    }
}

/// The receiving end, run by `run_worker` on the engine's thread.
pub struct JobQueue(std::sync::mpsc::Receiver<Job>);

pub fn channel(metrics: Arc<Metrics>) -> (EngineHandle, JobQueue) {
    let (tx, rx) = std::sync::mpsc::channel();
    (EngineHandle { tx, metrics }, JobQueue(rx))
}

/// Turns a queued job into a scheduler submission whose hooks own its channel.
fn submission(job: Job, metrics: &Arc<Metrics>) -> Submission {
    let Job { request, guide, lazy, events, admitted, _active } = job;
    let prompt_tokens = request.prompt_ids.len();
    let hooks = JobHooks {
        events,
        guide,
        lazy,
        remaining: request.max_tokens,
        metrics: metrics.clone(),
        admitted,
        last_token: None,
        prompt_tokens,
        _active,
    };
    Submission { request, hooks: Box::new(hooks) }
}

/// Re-forms the cluster after a rank was lost: joins the world again (the
/// supervisor restarts the lost rank) and hands the engine its new cluster.
/// Errors are one line each; the worker retries. The first attempt after a
/// loss gets its cause (one line), the retries `None`.
pub type Reform<'a> = Box<dyn FnMut(&mut Engine, Option<&str>) -> Result<(), String> + 'a>;

/// How often an idle worker checks that every rank still answers, so a rank
/// lost between requests is replaced before the next one arrives (and, busy,
/// how often it asks between steps, for the ranks' power readings).
const PING_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Runs jobs through the batching scheduler until every `EngineHandle` is
/// gone and the last sequence has finished. With `reform`, a lost rank does
/// not end the requests: they are requeued with their output so far, the
/// cluster is re-formed, and they continue (see [`recover`]).
pub fn run_worker(
    engine: &mut Engine,
    queue: JobQueue,
    metrics: &Arc<Metrics>,
    (cfg, draft, drafter): (SchedulerConfig, Option<engine::draft::DraftParams>, Option<engine::draft::ModelDraft>),
    kv_disk: Option<engine::kv_disk::KvDiskConfig>,
    mut reform: Option<Reform<'_>>,
) -> Result<(), String> {
    struct Stopped<'a>(&'a Metrics);
    impl Drop for Stopped<'_> {
        fn drop(&mut self) {
            self.0.engine_stopped.store(true, Relaxed);
        }
    }
    let _stopped = Stopped(metrics);
    let mut sched = Scheduler::new(engine, cfg).map_err(|e| e.to_string())?;
    // A finished reply's blocks are made again as prompt rows when idle.
    sched.set_rewarm(true);
    sched.set_draft(draft).map_err(|e| e.to_string())?;
    // A draft model (`--draft-model`) in place of the n-gram lookup.
    sched.set_model_draft(drafter);
    if let Some(d) = kv_disk {
        let dir = d.dir.display().to_string();
        sched.enable_disk(engine, d).map_err(|e| format!("kv disk tier {dir}: {e}"))?;
    }
    publish(metrics, &sched.stats());
    tracing::info!("KV pool: {} bytes on this rank", sched.stats().pool_bytes);
    let distributed = engine.cluster.is_some();
    let mut open = true;
    let mut waiting = 0usize;
    let mut last_ping = Instant::now();
    loop {
        // Block for work when idle (probing the cluster now and then); otherwise
        // take whatever has arrived.
        if !sched.has_work() {
            match queue.0.recv_timeout(PING_EVERY) {
                Ok(job) => {
                    metrics.queue_depth.fetch_sub(1, Relaxed);
                    sched.submit(submission(job, metrics));
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    last_ping = Instant::now();
                    if distributed {
                        if let Err(e) = engine.ping_cluster() {
                            if !recover(engine, &mut sched, &queue, metrics, &mut reform, &e) {
                                return Ok(());
                            }
                        }
                    }
                    continue;
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return Ok(()),
            }
        }
        while open {
            match queue.0.try_recv() {
                Ok(job) => {
                    metrics.queue_depth.fetch_sub(1, Relaxed);
                    sched.submit(submission(job, metrics));
                }
                Err(std::sync::mpsc::TryRecvError::Empty) => break,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => open = false,
            }
        }
        if !open && !sched.has_work() {
            return Ok(());
        }
        // A panic in a step must not take the server down: its sequences fail.
        let stepped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sched.step(engine)));
        match stepped {
            Err(_) => {
                tracing::error!("a batched step panicked; failing its requests");
                sched.abort_all("internal error: generation panicked");
            }
            Ok(Err(e)) => {
                if !recover(engine, &mut sched, &queue, metrics, &mut reform, &e) {
                    return Ok(());
                }
            }
            Ok(Ok(())) => {
                // Busy for a while: ping between steps too (only with no step
                // in flight, when every rank waits for the next header), so
                // the ranks' power readings stay live (`GET /cluster`).
                if distributed && engine.steps_in_flight() == 0 && last_ping.elapsed() >= PING_EVERY {
                    last_ping = Instant::now();
                    if let Err(e) = engine.ping_cluster() {
                        if !recover(engine, &mut sched, &queue, metrics, &mut reform, &e) {
                            return Ok(());
                        }
                    }
                }
            }
        }
        let st = sched.stats();
        // Requests the scheduler holds but has not admitted still count as queued.
        metrics.queue_depth.fetch_add(st.waiting as i64 - waiting as i64, Relaxed);
        waiting = st.waiting;
        publish(metrics, &st);
    }
}

/// After the cluster failed under a step or a probe (`cause`): marks the
/// server degraded, requeues every request with its output so far, and
/// re-forms the cluster until it is back (retrying each second), taking new
/// requests into the queue meanwhile. Returns false when the server is shutting
/// down (every handle gone) before the cluster came back.
fn recover(
    engine: &mut Engine,
    sched: &mut Scheduler,
    queue: &JobQueue,
    metrics: &Arc<Metrics>,
    reform: &mut Option<Reform<'_>>,
    cause: &EngineError,
) -> bool {
    metrics.rank_losses.fetch_add(1, Relaxed);
    let why = format!("lost at {} UTC: {cause}", clock_utc());
    eprintln!("shardlm serve: degraded: {why}; re-forming the cluster");
    metrics.set_degraded(Some(why.clone()));
    metrics.lost_rank.store(peer_named(&cause.to_string()).map_or(-1, |r| r as i64), Relaxed);
    sched.requeue_all();
    let Some(reform) = reform.as_mut() else {
        sched.abort_all(&format!("the cluster failed and cannot be re-formed: {cause}"));
        return true;
    };
    let started = Instant::now();
    let mut first = Some(cause.to_string());
    loop {
        // Keep admitting (queued, not run) and notice a shutdown.
        loop {
            match queue.0.try_recv() {
                Ok(job) => {
                    metrics.queue_depth.fetch_sub(1, Relaxed);
                    sched.submit(submission(job, metrics));
                }
                Err(std::sync::mpsc::TryRecvError::Empty) => break,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    sched.abort_all("the server is shutting down");
                    return false;
                }
            }
        }
        let attempt =
            reform(engine, first.take().as_deref()).and_then(|()| sched.reinit_pool(engine).map_err(|e| e.to_string()));
        match attempt {
            Ok(()) => break,
            Err(e) => {
                eprintln!("shardlm serve: re-forming the cluster failed: {e}; retrying in 1 s");
                // `/health` says why it is still degraded (a re-plan refused, say).
                metrics.set_degraded(Some(format!("{why}; re-forming failed: {e}")));
                std::thread::sleep(std::time::Duration::from_secs(1));
            }
        }
    }
    metrics.cluster_reforms.fetch_add(1, Relaxed);
    metrics.set_degraded(None);
    metrics.lost_rank.store(-1, Relaxed);
    eprintln!(
        "shardlm serve: cluster re-formed after {:.1} s; resuming {} requests",
        started.elapsed().as_secs_f64(),
        sched.stats().waiting
    );
    true
}

/// The rank a comm error names (`… peer 1 at … is gone …`).
fn peer_named(msg: &str) -> Option<usize> {
    let rest = &msg[msg.find("peer ")? + 5..];
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

/// `HH:MM:SS` of now, UTC (for the one-line degraded reason).
fn clock_utc() -> String {
    let s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()) % 86_400;
    format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

fn publish(m: &Metrics, st: &SchedulerStats) {
    m.kv_blocks_total.store(st.blocks.total as i64, Relaxed);
    m.kv_blocks_used.store(st.blocks.used as i64, Relaxed);
    m.kv_blocks_cached.store(st.blocks.cached as i64, Relaxed);
    m.kv_blocks_free.store(st.blocks.free as i64, Relaxed);
    m.kv_block_size.store(st.block as i64, Relaxed);
    m.kv_window_blocks_total.store(st.window_blocks.total as i64, Relaxed);
    m.kv_window_blocks_used.store(st.window_blocks.used as i64, Relaxed);
    m.kv_window_blocks_cached.store(st.window_blocks.cached as i64, Relaxed);
    m.kv_window_blocks_free.store(st.window_blocks.free as i64, Relaxed);
    m.kv_pool_bytes.store(st.pool_bytes as i64, Relaxed);
    m.prefix_queries.store(st.prefix_queries, Relaxed);
    m.prefix_hits.store(st.prefix_hits, Relaxed);
    m.prefix_cached_tokens.store(st.prefix_cached_tokens, Relaxed);
    m.batch_size.store(st.batch_size as i64, Relaxed);
    m.preemptions.store(st.preemptions, Relaxed);
    m.spec_steps.store(st.spec_steps, Relaxed);
    m.spec_drafted.store(st.spec_drafted, Relaxed);
    m.spec_accepted.store(st.spec_accepted, Relaxed);
    if let Some(d) = &st.disk {
        let (written, read, corrupt) = engine::kv_disk::counters::get();
        m.prefix_disk_tokens.store(d.hit_tokens, Relaxed);
        m.kv_disk_blocks.store(d.blocks as i64, Relaxed);
        m.kv_disk_capacity_blocks.store(d.capacity as i64, Relaxed);
        m.kv_disk_blocks_written.store(d.blocks_written, Relaxed);
        m.kv_disk_blocks_loaded.store(d.blocks_loaded, Relaxed);
        m.kv_disk_load_failures.store(d.load_failures, Relaxed);
        m.kv_disk_bytes_written.store(written, Relaxed);
        m.kv_disk_bytes_read.store(read, Relaxed);
        m.kv_disk_corrupt_files.store(corrupt, Relaxed);
        m.kv_disk_load_us.store(d.load_us, Relaxed);
    }
}

/// One request's callbacks; it owns the request's event channel.
struct JobHooks {
    events: mpsc::UnboundedSender<Event>,
    guide: Option<JsonGuide>,
    lazy: Option<LazyCalls>,
    /// Tokens the request may still generate (for the lazy guide).
    remaining: usize,
    metrics: Arc<Metrics>,
    admitted: Instant,
    last_token: Option<Instant>,
    prompt_tokens: usize,
    _active: ActiveGuard,
}

impl SeqHooks for JobHooks {
    fn done(&mut self, result: Result<SeqOutcome, EngineError>) {
        let metrics = &self.metrics;
        metrics.request_duration.observe(self.admitted.elapsed().as_secs_f64());
        match result {
            Ok(out) => {
                metrics.prompt_tokens.fetch_add(self.prompt_tokens as u64, Relaxed);
                let _ = self.events.send(Event::Done(Finished {
                    finish: out.finish_reason,
                    prompt_tokens: out.prompt_tokens,
                    completion_tokens: out.output_ids.len(),
                    guide_complete: self.guide.as_ref().is_some_and(|g| g.is_complete()),
                    stop_sequence: out.stop_string,
                    cached_tokens: out.cached_tokens,
                }));
            }
            Err(EngineError::Cancelled) => {
                metrics.requests_cancelled.fetch_add(1, Relaxed);
            }
            Err(e) => {
                tracing::warn!("generation failed: {e}");
                metrics.requests_failed.fetch_add(1, Relaxed);
                let _ = self.events.send(Event::Error(e.to_string()));
            }
        }
    }
}

impl GenerateHooks for JobHooks {
    fn wants_logits(&self) -> bool {
        self.guide.is_some() || self.lazy.as_ref().is_some_and(LazyCalls::active)
    }

    fn constrain(&mut self, logits: &mut [f32], remaining: usize) {
        if let Some(g) = self.guide.as_mut() {
            g.mask(logits, remaining);
        } else if let Some(l) = self.lazy.as_ref() {
            l.mask(logits, remaining);
        }
    }

    fn on_token(&mut self, id: u32) -> bool {
        let now = Instant::now();
        match self.last_token {
            None => self.metrics.ttft.observe((now - self.admitted).as_secs_f64()),
            Some(t) => self.metrics.inter_token.observe((now - t).as_secs_f64()),
        }
        self.last_token = Some(now);
        self.metrics.generated_tokens.fetch_add(1, Relaxed);
        if let Some(g) = self.guide.as_mut() {
            return g.accept(id);
        }
        self.remaining = self.remaining.saturating_sub(1);
        if let Some(l) = self.lazy.as_mut() {
            if l.accept(id, self.remaining) == Lazy::Attached {
                let _ = self.events.send(Event::Guided);
            }
        }
        true
    }

    fn on_text(&mut self, text: &str) {
        let _ = self.events.send(Event::Text(text.to_string()));
    }

    fn cancelled(&self) -> bool {
        self.events.is_closed()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_lost_peer_is_read_from_the_error() {
        let m = "communication failed: peer 1 at shm:launch-7267-541214a06941 is gone: its process exited";
        assert_eq!(super::peer_named(m), Some(1));
        assert_eq!(super::peer_named("protocol error with peer 12 at 10.0.0.2:5"), Some(12));
        assert_eq!(super::peer_named("something else"), None);
    }
}
