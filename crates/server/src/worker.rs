//! The engine side of the server: one thread owns the `Engine` and runs jobs
//! one at a time in arrival order. Handlers talk to it only through
//! `EngineHandle::submit`, which returns a channel of `Event`s; a batching
//! scheduler can later take this thread's place behind the same interface.
//!
//! A job is cancelled when its event receiver is dropped (the client went away):
//! the engine polls `cancelled()` between steps and gives the thread back.

use crate::guide::JsonGuide;
use crate::metrics::Metrics;
use engine::generate::{Engine, FinishReason, GenerateHooks, GenerateRequest};
use engine::EngineError;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

/// What the engine reports for a job, in order: `Text`*, then `Done` or `Error`.
#[derive(Debug)]
pub enum Event {
    Text(String),
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
    ) -> Result<mpsc::UnboundedReceiver<Event>, String> {
        let (events, rx) = mpsc::unbounded_channel();
        self.metrics.active.fetch_add(1, Relaxed);
        self.metrics.requests_total.fetch_add(1, Relaxed);
        let job = Job { request, guide, events, admitted: Instant::now(), _active: ActiveGuard(self.metrics.clone()) };
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

/// Runs jobs until every `EngineHandle` is gone.
pub fn run_worker(engine: &mut Engine, queue: JobQueue, metrics: &Metrics) {
    struct Stopped<'a>(&'a Metrics);
    impl Drop for Stopped<'_> {
        fn drop(&mut self) {
            self.0.engine_stopped.store(true, Relaxed);
        }
    }
    let _stopped = Stopped(metrics);
    while let Ok(mut job) = queue.0.recv() {
        metrics.queue_depth.fetch_sub(1, Relaxed);
        if job.events.is_closed() {
            metrics.requests_cancelled.fetch_add(1, Relaxed);
            continue;
        }
        let mut hooks = JobHooks {
            events: &job.events,
            guide: job.guide.as_mut(),
            metrics,
            admitted: job.admitted,
            last_token: None,
        };
        // A panic in one request must not take the server down with it.
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            engine.generate_hooked(&job.request, &mut hooks, &model::NoComm)
        }))
        .unwrap_or_else(|_| Err(EngineError::BadArgument("internal error: generation panicked".into())));
        metrics.request_duration.observe(job.admitted.elapsed().as_secs_f64());
        let guide_complete = job.guide.as_ref().is_some_and(|g| g.is_complete());
        match result {
            Ok(out) => {
                metrics.prompt_tokens.fetch_add(job.request.prompt_ids.len() as u64, Relaxed);
                let _ = job.events.send(Event::Done(Finished {
                    finish: out.finish_reason,
                    prompt_tokens: job.request.prompt_ids.len(),
                    // This serial worker has no prefix cache: every prompt token is prefilled.
                    cached_tokens: 0,
                    completion_tokens: out.output_ids.len(),
                    guide_complete,
                    stop_sequence: out.stop_string,
                }));
            }
            Err(EngineError::Cancelled) => {
                metrics.requests_cancelled.fetch_add(1, Relaxed);
            }
            Err(e) => {
                tracing::warn!("generation failed: {e}");
                metrics.requests_failed.fetch_add(1, Relaxed);
                let _ = job.events.send(Event::Error(e.to_string()));
            }
        }
    }
}

struct JobHooks<'a> {
    events: &'a mpsc::UnboundedSender<Event>,
    guide: Option<&'a mut JsonGuide>,
    metrics: &'a Metrics,
    admitted: Instant,
    last_token: Option<Instant>,
}

impl GenerateHooks for JobHooks<'_> {
    fn wants_logits(&self) -> bool {
        self.guide.is_some()
    }

    fn constrain(&mut self, logits: &mut [f32], remaining: usize) {
        if let Some(g) = self.guide.as_deref_mut() {
            g.mask(logits, remaining);
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
        match self.guide.as_deref_mut() {
            Some(g) => g.accept(id),
            None => true,
        }
    }

    fn on_text(&mut self, text: &str) {
        let _ = self.events.send(Event::Text(text.to_string()));
    }

    fn cancelled(&self) -> bool {
        self.events.is_closed()
    }
}
