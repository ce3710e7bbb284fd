//! The batching scheduler on the sliding-window fixtures (Gemma 3: three
//! windowed layers and one full, window 8; gpt-oss: one of each, window 8)
//! with the window block group: every windowed layer keeps only the blocks
//! of its window, given back as they fall out of it.
//!
//! - A growing conversation much longer than the window, served through the
//!   paged pool with the prefix cache: logits at every sampled step equal,
//!   bit for bit, the same turns served by a pool whose windowed layers keep
//!   every position, and within 5e-5 (same tokens) each turn run cold and
//!   alone by `run`'s contiguous cache; the prefix cache reports its hits
//!   (`cached_tokens`), as deep as without the window group.
//! - Under KV pressure (preemption and recompute), every request's tokens
//!   equal its cold run's.
//! - The pool's bytes: far below every position of every layer.

mod common;
use common::serving::{fixture_engine, request, Recorder, Seen};
use shardlm_engine::generate::{Engine, GenerateHooks, GenerateRequest};
use shardlm_engine::serving::windows::window_blocks_for;
use shardlm_engine::serving::{Scheduler, SchedulerConfig, SeqHooks, SeqOutcome, Submission};
use shardlm_engine::EngineError;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// A fixture's engine (a name under tests/fixtures/tiny, or a directory).
fn engine(name: &str) -> Engine {
    fixture_engine(name, 16)
}

/// Pseudo-random token ids below 1000.
fn tokens(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed.wrapping_mul(40_503)) >> 7) % 990 + 3)
        .collect()
}

fn submit(s: &mut Scheduler, req: GenerateRequest) -> Arc<Mutex<Seen>> {
    let seen = Arc::new(Mutex::new(Seen::default()));
    s.submit(Submission { request: req, hooks: Box::new(Recorder(seen.clone())) });
    seen
}

fn drain(s: &mut Scheduler, e: &mut Engine) {
    let mut steps = 0;
    while s.has_work() {
        s.step(e).expect("step");
        steps += 1;
        assert!(steps < 100_000, "no progress");
    }
}

fn cold(e: &mut Engine, prompt: &[u32], n: usize) -> Seen {
    let seen = Arc::new(Mutex::new(Seen::default()));
    e.generate_hooked(&request(prompt.to_vec(), n), &mut Recorder(seen.clone()), &model::NoComm).unwrap();
    let s = std::mem::take(&mut *seen.lock().unwrap());
    s
}

fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs())).fold(0f32, f32::max)
}

/// Blocks of 4 positions (two per window of 8), steps of 20 tokens.
const BLOCK: usize = 4;
const STEP: usize = 20;

fn config(e: &Engine, n_blocks: usize, max_batch: usize, windows: bool) -> SchedulerConfig {
    let n_window_blocks = match windows {
        true => window_blocks_for(e.model.max_window(), e.context_length(), BLOCK, max_batch, STEP, true),
        false => 0,
    };
    SchedulerConfig { block: BLOCK, n_blocks, max_batch, step_tokens: STEP, prefix_cache: true, n_window_blocks }
}

fn conversation_matches_cold_runs(name: &str) {
    let mut reference = engine(name);
    let (mut served, mut unbounded) = (engine(name), engine(name));
    let window = served.model.max_window().expect("a windowed fixture");
    assert_eq!(window, 8);
    let cfg = config(&served, 160, 4, true);
    assert!(cfg.n_window_blocks > 0);
    let mut sched = Scheduler::new(&mut served, cfg.clone()).unwrap();
    // Every position in every layer, scheduled alike (prefix cache on).
    let unbounded_cfg = SchedulerConfig { n_window_blocks: 0, ..cfg.clone() };
    let mut full = Scheduler::new(&mut unbounded, unbounded_cfg).unwrap();
    // The window group holds a small fraction of what the full blocks would.
    let (bytes, unbounded_bytes) = (served.pool_bytes().unwrap(), unbounded.pool_bytes().unwrap());
    eprintln!("{name}: pool {bytes} bytes with the window group, {unbounded_bytes} without");
    assert!(bytes < unbounded_bytes, "{name}: the window group saves memory");

    let mut history = tokens(70, 1);
    let n_gen = 6;
    let mut prev_prompt = 0;
    for turn in 0..3 {
        let want = cold(&mut reference, &history, n_gen);
        let main = submit(&mut sched, request(history.clone(), n_gen));
        // A side request in the same batch, longer than the window too.
        let side = submit(&mut sched, request(tokens(30 + turn * 7, 9 + turn as u32), 4));
        drain(&mut sched, &mut served);
        let main_full = submit(&mut full, request(history.clone(), n_gen));
        drain(&mut full, &mut unbounded);
        let seen = std::mem::take(&mut *main.lock().unwrap());
        let out = seen.outcome.clone().unwrap().unwrap();
        assert!(matches!(side.lock().unwrap().outcome, Some(Ok(_))), "{name}: the side request failed");
        let seen_full = std::mem::take(&mut *main_full.lock().unwrap());

        assert_eq!(seen.tokens, want.tokens, "{name} turn {turn}: greedy tokens");
        let (d, d_full) = (max_diff(&seen.logits, &want.logits), max_diff(&seen.logits, &seen_full.logits));
        eprintln!(
            "{name} turn {turn}: {} prompt tokens, {} cached, max |Δlogit| {d:e} vs cold, {d_full:e} vs unbounded pool",
            history.len(),
            out.cached_tokens
        );
        // Bit for bit against the pool of every position (window blocks are
        // blocks of the same size, so attention sums its keys alike). The
        // cold contiguous run differs in the last bits: its rings are cut in
        // blocks of their own size (model's window_ring test), and these
        // float fixtures' prefill rows depend on how the prompt is chunked
        // (a resumed prompt is chunked from the resume point on).
        assert_eq!(d_full, 0.0, "{name} turn {turn}: logits must equal the unbounded pool's");
        assert!(d <= 5e-5, "{name} turn {turn}: logits differ from the cold contiguous run by {d}");
        if turn == 0 {
            assert_eq!(out.cached_tokens, 0);
        } else {
            // Every full block of the previous turn's prompt is cached, and
            // so is its window (its generated rows are decode rows, which the
            // prefix cache does not keep: `register_full_blocks`).
            assert_eq!(out.cached_tokens, prev_prompt / BLOCK * BLOCK, "{name} turn {turn}: cached tokens");
        }
        prev_prompt = history.len();
        history.extend_from_slice(&seen.tokens);
        history.extend(tokens(40, 100 + turn as u32));
    }
    let st = sched.stats();
    assert_eq!((st.blocks.used, st.window_blocks.used), (0, 0), "every block is released");
    assert_eq!(st.window_blocks.total, cfg.n_window_blocks);
    assert!(st.window_blocks.cached > 0, "released window blocks stay cached");
}

/// A fixture copy in the temp dir, removed when dropped (a failing test
/// too leaves nothing behind).
struct TempFixture(PathBuf);

impl Drop for TempFixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The mistral fixture with a window of 8 on every layer (Mistral 7B v0.1's
/// layout): the full group holds no bytes at all.
fn all_windowed_mistral() -> TempFixture {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny/mistral");
    let dir = std::env::temp_dir().join(format!("shardlm-window-mistral-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(src.join("model.safetensors"), dir.join("model.safetensors")).unwrap();
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    cfg["sliding_window"] = 8.into();
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    TempFixture(dir)
}

#[test]
fn every_layer_windowed_conversation_with_window_blocks_equals_cold_runs() {
    let fixture = all_windowed_mistral();
    conversation_matches_cold_runs(fixture.0.to_str().unwrap());
}

#[test]
fn gemma3_conversation_with_window_blocks_equals_cold_runs() {
    conversation_matches_cold_runs("gemma3");
}

#[test]
fn gpt_oss_conversation_with_window_blocks_equals_cold_runs() {
    conversation_matches_cold_runs("gpt_oss");
}

/// Six requests longer than the window in a pool too small for them all:
/// some wait, some are preempted and recomputed; every one's tokens equal its
/// cold run's, and everything is given back.
#[test]
fn window_blocks_survive_kv_pressure_and_preemption() {
    let mut reference = engine("gemma3");
    let mut served = engine("gemma3");
    // 20 blocks of 4: 80 positions for six requests of 30 + 16.
    let cfg = config(&served, 20, 6, true);
    let mut sched = Scheduler::new(&mut served, cfg).unwrap();
    // The same pressure on a pool whose windowed layers keep every position.
    let mut alone = engine("gemma3");
    let alone_cfg = config(&alone, 20, 6, false);
    let mut unbounded = Scheduler::new(&mut alone, alone_cfg).unwrap();
    let prompts: Vec<Vec<u32>> = (0..6).map(|i| tokens(30, 50 + i)).collect();
    let seqs: Vec<_> = prompts.iter().map(|p| submit(&mut sched, request(p.clone(), 16))).collect();
    let seqs_full: Vec<_> = prompts.iter().map(|p| submit(&mut unbounded, request(p.clone(), 16))).collect();
    drain(&mut sched, &mut served);
    drain(&mut unbounded, &mut alone);
    assert!(sched.stats().preemptions > 0, "the pool was under pressure");
    assert_eq!(sched.stats().preemptions, unbounded.stats().preemptions, "window blocks never preempt");
    for ((p, s), f) in prompts.iter().zip(seqs).zip(seqs_full) {
        let want = cold(&mut reference, p, 16);
        let (s, f) = (s.lock().unwrap(), f.lock().unwrap());
        assert_eq!(s.outcome.as_ref().unwrap().as_ref().unwrap().output_ids, want.tokens);
        assert_eq!(max_diff(&s.logits, &f.logits), 0.0, "equal to the pool of every position");
        assert!(max_diff(&s.logits, &want.logits) <= 5e-5);
    }
    let st = sched.stats();
    assert_eq!((st.blocks.used, st.window_blocks.used), (0, 0));
}

/// Too few window blocks for one sequence is refused at configuration.
#[test]
fn a_window_group_too_small_for_one_sequence_is_refused() {
    let mut e = engine("gemma3");
    let cfg = SchedulerConfig { n_window_blocks: 3, ..config(&e, 24, 2, true) };
    let err = Scheduler::new(&mut e, cfg).err().expect("refused");
    assert!(err.to_string().contains("window blocks"), "{err}");
}

/// A window group with room for one sequence's window (a small
/// `--kv-cache-bytes`): the others wait for it instead of failing, and each
/// computes what it computes alone.
#[test]
fn a_small_window_group_makes_sequences_wait() {
    let mut reference = engine("gemma3");
    let mut served = engine("gemma3");
    let one_row = window_blocks_for(served.model.max_window(), served.context_length(), BLOCK, 1, STEP, true);
    let cfg = SchedulerConfig { n_window_blocks: one_row, ..config(&served, 160, 4, true) };
    let mut sched = Scheduler::new(&mut served, cfg).unwrap();
    let mut alone = engine("gemma3");
    let alone_cfg = config(&alone, 160, 1, false);
    let mut unbounded = Scheduler::new(&mut alone, alone_cfg).unwrap();
    let prompts: Vec<Vec<u32>> = (0..4).map(|i| tokens(30, 70 + i)).collect();
    let seqs: Vec<_> = prompts.iter().map(|p| submit(&mut sched, request(p.clone(), 8))).collect();
    let mut most = 0;
    while sched.has_work() {
        sched.step(&mut served).expect("step");
        let st = sched.stats();
        assert!(st.window_blocks.used <= one_row);
        most = most.max(st.running);
    }
    assert_eq!(most, 1, "one sequence's window at a time");
    for (p, s) in prompts.iter().zip(seqs) {
        let f = submit(&mut unbounded, request(p.clone(), 8));
        drain(&mut unbounded, &mut alone);
        let want = cold(&mut reference, p, 8);
        let (s, f) = (s.lock().unwrap(), f.lock().unwrap());
        assert_eq!(s.outcome.as_ref().unwrap().as_ref().unwrap().output_ids, want.tokens);
        assert_eq!(max_diff(&s.logits, &f.logits), 0.0, "equal to the pool of every position");
    }
    assert_eq!(sched.stats().window_blocks.used, 0);
}

/// Hooks that record tokens and report a cancelled client once `cancel` is set.
struct Cancellable(Arc<Mutex<Seen>>, Arc<std::sync::atomic::AtomicBool>);

impl GenerateHooks for Cancellable {
    fn on_token(&mut self, id: u32) -> bool {
        self.0.lock().unwrap().tokens.push(id);
        true
    }
    fn on_text(&mut self, _text: &str) {}
    fn cancelled(&self) -> bool {
        self.1.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl SeqHooks for Cancellable {
    fn done(&mut self, result: Result<SeqOutcome, EngineError>) {
        self.0.lock().unwrap().outcome = Some(result.map_err(|e| e.to_string()));
    }
}

/// A cancelled sequence gives its window blocks and reservation back at once;
/// after a cluster re-form (`requeue_all`, `reinit_pool`) the others resume
/// by recompute and end with their cold run's tokens.
#[test]
fn cancel_and_requeue_give_window_blocks_back() {
    let mut reference = engine("gemma3");
    let mut served = engine("gemma3");
    let cfg = config(&served, 160, 2, true);
    let mut sched = Scheduler::new(&mut served, cfg).unwrap();
    let (pa, pb) = (tokens(50, 201), tokens(50, 202));
    let a = submit(&mut sched, request(pa.clone(), 12));
    let (seen_b, cancel) = (Arc::new(Mutex::new(Seen::default())), Arc::new(std::sync::atomic::AtomicBool::new(false)));
    let hooks = Box::new(Cancellable(seen_b.clone(), cancel.clone()));
    sched.submit(Submission { request: request(pb, 12), hooks });
    for _ in 0..5 {
        sched.step(&mut served).unwrap();
    }
    let before = sched.stats().window_blocks.used;
    assert_eq!(sched.stats().running, 2);
    cancel.store(true, std::sync::atomic::Ordering::Relaxed);
    sched.step(&mut served).unwrap();
    assert!(seen_b.lock().unwrap().outcome.as_ref().unwrap().as_ref().unwrap_err().contains("cancel"));
    assert_eq!(sched.stats().running, 1);
    assert!(sched.stats().window_blocks.used < before, "the cancelled sequence's window blocks are free");
    // The cluster is lost and re-formed: A is recomputed from its history.
    sched.requeue_all();
    assert_eq!(sched.stats().window_blocks.used, 0);
    sched.reinit_pool(&mut served).unwrap();
    drain(&mut sched, &mut served);
    let want = cold(&mut reference, &pa, 12);
    assert_eq!(a.lock().unwrap().outcome.as_ref().unwrap().as_ref().unwrap().output_ids, want.tokens);
    assert_eq!(sched.stats().window_blocks.used, 0);
}

/// Two prompts sharing a 40-token system prompt: the second resumes at its
/// end, whose window blocks left the first request's window long before it
/// finished (they stayed cached), and equals the pool of every position.
#[test]
fn a_shared_prefix_resumes_from_window_blocks_that_left_the_window() {
    let (mut served, mut unbounded) = (engine("gpt_oss"), engine("gpt_oss"));
    let cfg = config(&served, 160, 2, true);
    let mut sched = Scheduler::new(&mut served, cfg.clone()).unwrap();
    let mut full = Scheduler::new(&mut unbounded, SchedulerConfig { n_window_blocks: 0, ..cfg }).unwrap();
    let system = tokens(40, 301);
    for (i, user) in [tokens(45, 302), tokens(33, 303)].into_iter().enumerate() {
        let prompt: Vec<u32> = system.iter().chain(&user).copied().collect();
        let (a, b) = (submit(&mut sched, request(prompt.clone(), 5)), submit(&mut full, request(prompt, 5)));
        drain(&mut sched, &mut served);
        drain(&mut full, &mut unbounded);
        let (a, b) = (a.lock().unwrap(), b.lock().unwrap());
        let cached = a.outcome.as_ref().unwrap().as_ref().unwrap().cached_tokens;
        assert_eq!(cached, if i == 0 { 0 } else { 40 }, "request {i}: cached tokens");
        assert_eq!(max_diff(&a.logits, &b.logits), 0.0, "request {i}");
    }
}
