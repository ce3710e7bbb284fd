//! One request through the batching scheduler, to its end: how `run` and
//! `bench` generate, so that they measure and print what `serve` does (the
//! paged pool, the batched step, a pipeline's micro-batches in flight).

use super::scheduler::{Scheduler, SchedulerConfig, SeqHooks, SeqOutcome, Submission};
use crate::generate::{Engine, GenerateHooks, GenerateRequest};
use crate::EngineError;
use std::sync::{Arc, Mutex};

/// The pool one sequence of `positions` positions needs: full blocks of
/// `block`, the window group a sliding-window model's rows need, no prefix
/// cache (every run starts cold), one batch row, prefill steps of `step`.
pub fn solo_config(engine: &Engine, positions: usize, block: usize, step: usize) -> SchedulerConfig {
    let window = engine.model.max_window();
    let ctx = engine.context_length();
    SchedulerConfig {
        block,
        n_blocks: positions.div_ceil(block) + 1,
        max_batch: 1,
        step_tokens: step.max(1),
        prefix_cache: false,
        n_window_blocks: super::windows::window_blocks_for(window, ctx, block, 1, step.max(1), false),
    }
}

/// The caller's hooks and, once the scheduler is done with the request, its outcome.
struct Slot<H> {
    hooks: H,
    outcome: Option<Result<SeqOutcome, EngineError>>,
}

/// [`SeqHooks`] over shared caller hooks (the scheduler owns its hooks; the
/// caller wants them back, with what they recorded).
struct Shared<H>(Arc<Mutex<Slot<H>>>);

impl<H: GenerateHooks> Shared<H> {
    fn with<R>(&self, f: impl FnOnce(&mut Slot<H>) -> R) -> R {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl<H: GenerateHooks> GenerateHooks for Shared<H> {
    fn wants_logits(&self) -> bool {
        self.with(|s| s.hooks.wants_logits())
    }
    fn constrain(&mut self, logits: &mut [f32], remaining: usize) {
        self.with(|s| s.hooks.constrain(logits, remaining))
    }
    fn on_token(&mut self, id: u32) -> bool {
        self.with(|s| s.hooks.on_token(id))
    }
    fn on_text(&mut self, text: &str) {
        self.with(|s| s.hooks.on_text(text))
    }
    fn cancelled(&self) -> bool {
        self.with(|s| s.hooks.cancelled())
    }
    fn on_prefill(&mut self, done: usize, total: usize) {
        self.with(|s| s.hooks.on_prefill(done, total))
    }
}

impl<H: GenerateHooks + Send> SeqHooks for Shared<H> {
    fn done(&mut self, result: Result<SeqOutcome, EngineError>) {
        self.with(|s| s.outcome = Some(result))
    }
}

/// Runs `req` alone through `sched` until it ends; returns its outcome and
/// the hooks back.
pub fn run_request<H: GenerateHooks + Send + 'static>(
    sched: &mut Scheduler,
    engine: &mut Engine,
    req: GenerateRequest,
    hooks: H,
) -> Result<(SeqOutcome, H), EngineError> {
    let slot = Arc::new(Mutex::new(Slot { hooks, outcome: None }));
    sched.submit(Submission { request: req, hooks: Box::new(Shared(slot.clone())) });
    while slot.lock().unwrap_or_else(|p| p.into_inner()).outcome.is_none() {
        if !sched.has_work() {
            return Err(EngineError::BadArgument("the scheduler dropped the request".into()));
        }
        sched.step(engine)?;
    }
    // Steps of other sequences may still be in flight; this one's are not.
    while sched.has_work() {
        sched.step(engine)?;
    }
    let slot = Arc::try_unwrap(slot)
        .map_err(|_| EngineError::BadArgument("the scheduler kept the request's hooks".into()))?
        .into_inner()
        .unwrap_or_else(|p| p.into_inner());
    let outcome = slot.outcome.expect("checked above")?;
    Ok((outcome, slot.hooks))
}
