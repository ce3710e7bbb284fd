//! What the serving tests share: a recorder of each sequence's logits
//! (before each sample), tokens and outcome, the request they submit, and a
//! tiny fixture's engine.
#![allow(dead_code)] // each test binary uses its own part

use model::{LoadOptions, Model, ShardSpec};
use shardlm_engine::generate::{Engine, GenerateHooks, GenerateRequest};
use shardlm_engine::serving::{Scheduler, SeqHooks, SeqOutcome, Submission};
use shardlm_engine::EngineError;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

#[derive(Default)]
pub struct Seen {
    pub logits: Vec<Vec<f32>>,
    pub tokens: Vec<u32>,
    pub outcome: Option<Result<SeqOutcome, String>>,
}

#[derive(Clone)]
pub struct Recorder(pub Arc<Mutex<Seen>>);

impl GenerateHooks for Recorder {
    fn wants_logits(&self) -> bool {
        true
    }
    fn constrain(&mut self, logits: &mut [f32], _remaining: usize) {
        self.0.lock().unwrap().logits.push(logits.to_vec());
    }
    fn on_token(&mut self, id: u32) -> bool {
        self.0.lock().unwrap().tokens.push(id);
        true
    }
    fn on_text(&mut self, _text: &str) {}
}

impl SeqHooks for Recorder {
    fn done(&mut self, result: Result<SeqOutcome, EngineError>) {
        self.0.lock().unwrap().outcome = Some(result.map_err(|e| e.to_string()));
    }
}

pub fn request(prompt: Vec<u32>, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        prompt_ids: prompt,
        max_tokens,
        sampling: Default::default(),
        stop_strings: Vec::new(),
        ignore_eos: true,
        want_prompt_logits: false,
        draft: Default::default(),
    }
}

/// The engine of tiny fixture `name` (or a directory), one process, 2
/// threads, prompts in chunks of `prefill_chunk`.
pub fn fixture_engine(name: &str, prefill_chunk: usize) -> Engine {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny").join(name);
    let files = formats::open_model(&path).unwrap();
    let m = Model::load(&files, &ShardSpec::full(files.config.n_layers), &LoadOptions::default()).unwrap();
    let mut e = Engine::new(m, None, 2);
    e.prefill_chunk = prefill_chunk;
    e
}

/// Tiny fixture `name` loaded with `opts` (a `--device gpu` one, say);
/// `None`, with a note, where the machine has no GPU adapter (not under
/// `CI=true`, whose machine must have Mesa's).
pub fn fixture_model_on(name: &str, opts: &LoadOptions) -> Option<Model> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny").join(name);
    let files = formats::open_model(&path).unwrap();
    match Model::load(&files, &ShardSpec::full(files.config.n_layers), opts) {
        Ok(m) => Some(m),
        Err(e) if e.to_string().starts_with("no GPU adapter") && std::env::var("CI").as_deref() != Ok("true") => {
            eprintln!("SKIPPED: {e}");
            None
        }
        Err(e) => panic!("{name}: {e}"),
    }
}

/// Submits `req` with a recorder; the record fills as the scheduler steps.
pub fn submit(s: &mut Scheduler, req: GenerateRequest) -> Arc<Mutex<Seen>> {
    let seen = Arc::new(Mutex::new(Seen::default()));
    s.submit(Submission { request: req, hooks: Box::new(Recorder(seen.clone())) });
    seen
}

/// The largest |Δ| between two runs' logits, step by step.
pub fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs())).fold(0f32, f32::max)
}
