//! Speculative decoding with a draft model (issue 28, `--draft-model`).
//!
//! - Greedy: with a model drafting, every sequence's tokens and logits are
//!   those of plain decoding, several sequences at once through one drafter
//!   (its slots keep each sequence's draft KV apart).
//! - A model drafting for itself proposes what the target then picks: nearly
//!   every draft token is accepted. Slots mixed up between sequences would
//!   draft another sequence's continuation and be rejected.
//! - Refusals: a draft model whose vocabulary differs, one that does not
//!   load, and ones whose caches cannot roll back (sliding windows).

mod common;
use common::serving::{fixture_engine, request, Recorder, Seen};
use shardlm_engine::draft::{DraftChoice, DraftParams, ModelDrafter};
use shardlm_engine::generate::Engine;
use shardlm_engine::serving::{Scheduler, SchedulerConfig, SeqOutcome, Submission};
use shardlm_engine::EngineError;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

fn config() -> SchedulerConfig {
    SchedulerConfig { block: 16, n_blocks: 128, max_batch: 4, step_tokens: 64, prefix_cache: false, n_window_blocks: 0 }
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny").join(name)
}

/// Runs `prompts` at once for `n` tokens each; returns each one's recording.
fn run_all(sched: &mut Scheduler, e: &mut Engine, prompts: &[Vec<u32>], n: usize, draft: DraftChoice) -> Vec<Seen> {
    let seen: Vec<Arc<Mutex<Seen>>> = prompts
        .iter()
        .map(|p| {
            let seen = Arc::new(Mutex::new(Seen::default()));
            let req = shardlm_engine::generate::GenerateRequest { draft, ..request(p.clone(), n) };
            sched.submit(Submission { request: req, hooks: Box::new(Recorder(seen.clone())) });
            seen
        })
        .collect();
    while sched.has_work() {
        sched.step(e).expect("step");
    }
    seen.into_iter().map(|s| std::mem::take(&mut *s.lock().unwrap())).collect()
}

/// Checks that drafting with `drafter` keeps every sequence's greedy tokens
/// and logits; returns the (drafted, accepted) totals.
fn same_as_plain(e: &mut Engine, drafter: ModelDrafter, prompts: &[Vec<u32>], n: usize) -> (usize, usize) {
    let mut plain = Scheduler::new(e, config()).unwrap();
    let want = run_all(&mut plain, e, prompts, n, DraftChoice::Off);
    let mut sched = Scheduler::new(e, config()).unwrap();
    sched.set_drafter(Some(Box::new(drafter)));
    let got = run_all(&mut sched, e, prompts, n, DraftChoice::On(DraftParams { max: 6, min: 1 }));
    let (mut drafted, mut accepted) = (0, 0);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let out: SeqOutcome = g.outcome.clone().unwrap().unwrap();
        assert_eq!(g.tokens.len(), n, "sequence {i}");
        assert_eq!(g.tokens, w.tokens, "sequence {i}: greedy tokens differ with the draft model");
        assert!(g.logits == w.logits, "sequence {i}: logits differ from plain decode steps");
        drafted += out.drafted;
        accepted += out.accepted;
    }
    let st = sched.stats();
    assert_eq!((st.spec_drafted, st.spec_accepted), (drafted as u64, accepted as u64));
    assert_eq!(st.blocks.used, 0, "every block is released");
    (drafted, accepted)
}

fn prompts(count: usize, len: usize) -> Vec<Vec<u32>> {
    (0..count).map(|s| (0..len).map(|i| ((i * 37 + s * 101 + 11) % 1000 + 3) as u32).collect()).collect()
}

#[test]
fn a_model_drafting_for_itself_keeps_greedy_tokens_across_sequences() {
    // A slot per sequence, then fewer slots than sequences (taken over and re-synced).
    for slots in [4, 2] {
        let mut e = fixture_engine("llama", 64);
        let mut drafter = ModelDrafter::open(&fixture("llama"), &e, 2, slots).unwrap();
        // Free drafting: a verify step at every decode step, no pauses.
        drafter.set_cost(0.0);
        let (drafted, accepted) = same_as_plain(&mut e, drafter, &prompts(4, 70), 40);
        eprintln!("llama for itself, 4 sequences, {slots} slots: {accepted} of {drafted} draft tokens accepted");
        assert!(drafted >= 4 * 20, "{drafted} drafted: speculation paused");
        // The same weights: only summation order (a chunked prefill in the
        // draft, decode steps in the target) could flip a near tie.
        assert!(accepted as f64 >= 0.9 * drafted as f64, "{accepted} of {drafted}: draft state mixed up?");
    }
}

#[test]
fn a_costly_drafter_pauses_speculation() {
    let mut e = fixture_engine("llama", 64);
    // Drafting with the target itself costs a decode step per token: even
    // with every token accepted, plain decoding is faster.
    let drafter = ModelDrafter::open(&fixture("llama"), &e, 2, 1).unwrap();
    let (drafted, _) = same_as_plain(&mut e, drafter, &prompts(1, 40), 60);
    assert!(drafted > 0 && drafted < 30, "{drafted} drafted in 60 tokens");
}

#[test]
fn another_model_drafting_keeps_greedy_tokens() {
    let mut e = fixture_engine("llama", 64);
    let mut drafter = ModelDrafter::open(&fixture("mistral"), &e, 2, 2).unwrap();
    // As large as the target: drafting would not pay; these tokens are the test.
    drafter.set_cost(0.0);
    // Two slots for three sequences: slots are taken over and re-synced.
    let (drafted, accepted) = same_as_plain(&mut e, drafter, &prompts(3, 50), 30);
    eprintln!("mistral for llama: {accepted} of {drafted} draft tokens accepted");
    assert!(drafted > 0, "never speculated");
}

#[test]
fn smollm2_drafting_for_itself_keeps_greedy_tokens() {
    let Some(path) = common::smollm2() else { return };
    let files = formats::open_model(&path).unwrap();
    let spec = model::ShardSpec::full(files.config.n_layers);
    let m = model::Model::load(&files, &spec, &model::LoadOptions::default()).unwrap();
    let tok = shardlm_engine::Tokenizer::from_source(&files.tokenizer).unwrap().unwrap();
    let texts = ["def add(a, b):\n    return a + b\n\nRewrite add as sub:\n", "The capital of France is"];
    let prompts: Vec<Vec<u32>> = texts.iter().map(|t| tok.encode(t, true).unwrap()).collect();
    let mut e = Engine::new(m, Some(tok), 2);
    e.prefill_chunk = 64;
    let mut drafter = ModelDrafter::open(&path, &e, 2, 2).unwrap();
    drafter.set_cost(0.0);
    let (drafted, accepted) = same_as_plain(&mut e, drafter, &prompts, 24);
    eprintln!("smollm2 for itself: {accepted} of {drafted} draft tokens accepted");
    assert!(accepted > 0, "{accepted} of {drafted}");
}

/// A copy of fixture `name` with `edit` applied to its config.
fn edited_fixture(name: &str, tag: &str, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("shardlm-draft-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in std::fs::read_dir(fixture(name)).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), dir.join(f.file_name())).unwrap();
    }
    let cfg = dir.join("config.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&cfg, v.to_string()).unwrap();
    dir
}

fn refusal(path: &std::path::Path, e: &Engine) -> String {
    match ModelDrafter::open(path, e, 1, 1) {
        Err(err @ EngineError::DraftModel { .. }) => err.to_string(),
        Err(other) => panic!("not a draft-model error: {other}"),
        Ok(_) => panic!("{} was accepted as a draft model", path.display()),
    }
}

#[test]
fn draft_models_that_cannot_draft_are_refused() {
    let e = fixture_engine("llama", 64);
    let other_vocab = edited_fixture("llama", "vocab", |v| v["vocab_size"] = 2048.into());
    let why = refusal(&other_vocab, &e);
    assert!(why.contains("vocabulary") && why.contains("2048") && !why.contains('\n'), "{why}");
    std::fs::remove_dir_all(&other_vocab).ok();
    let missing = fixture("no_such_model");
    let why = refusal(&missing, &e);
    assert!(why.contains("no_such_model") && !why.contains('\n'), "{why}");
    // gpt_oss has sliding-window layers.
    let why = refusal(&fixture("gpt_oss"), &e);
    assert!(why.contains("sliding-window"), "{why}");
}

#[test]
fn a_tokenizer_that_differs_is_refused() {
    let Some(path) = common::smollm2() else { return };
    // SmolLM2 (49152 tokens, a tokenizer) as the target, the tiny llama (1024, none) as the draft.
    let files = formats::open_model(&path).unwrap();
    let spec = model::ShardSpec::full(files.config.n_layers);
    let m = model::Model::load(&files, &spec, &model::LoadOptions::default()).unwrap();
    let tok = shardlm_engine::Tokenizer::from_source(&files.tokenizer).unwrap();
    let e = Engine::new(m, tok, 1);
    let why = refusal(&fixture("llama"), &e);
    assert!(why.contains("vocabulary") && why.contains("tokenizer"), "{why}");
}

#[test]
fn a_grown_cache_keeps_its_positions() {
    // A draft slot's cache doubles in place: decoding on after growing gives
    // the logits of a cache that was large from the start.
    let mut e = fixture_engine("llama", 64);
    let prompt: Vec<u32> = (0..12).map(|i| (i * 53 + 7) % 1000 + 2).collect();
    let mut small = e.model.new_cache(16);
    let mut large = e.model.new_cache(64);
    e.prefill(&mut small, &prompt, false, &model::NoComm).unwrap();
    e.prefill(&mut large, &prompt, false, &model::NoComm).unwrap();
    assert!(small.grow(64) && small.capacity == 64);
    assert!(!small.grow(32), "shrinking is refused");
    for t in 0..20u32 {
        let (a, _) = e.prefill(&mut small, &[t * 31 + 5], false, &model::NoComm).unwrap();
        let (b, _) = e.prefill(&mut large, &[t * 31 + 5], false, &model::NoComm).unwrap();
        assert!(a == b, "step {t}: logits differ after growing");
    }
}
