//! Speculative decoding in the batching scheduler (issue 28).
//!
//! - Greedy: a speculating request samples from the very logits (bit for bit
//!   at AVX-512) a plain one does, whatever its drafts: the n-gram drafter,
//!   drafts that are always right, always wrong, or right then wrong. The
//!   recorder keeps the logits of every sampled position, so a verify row
//!   that summed in another order than a decode step would show here.
//! - Rollback: after drafts that were all rejected, the sequence's later
//!   logits (every later step reads the KV rows the verify steps wrote) are
//!   those of a run that never speculated, and a longer prompt continuing it
//!   reuses the same cached prefix (the prompt's blocks: generated rows are
//!   not cached, see `serving::seq::register_full_blocks`) and continues the
//!   same.
//! - Sampling: the token drawn from a verify row against a fixed draft has
//!   the model's distribution (chi-square over a top-k of 8).

mod common;
use common::serving::{fixture_engine, fixture_model_on, request, Recorder, Seen};
use shardlm_engine::draft::{DraftChoice, DraftParams, Drafter};
use shardlm_engine::generate::{Engine, GenerateHooks, GenerateRequest};
use shardlm_engine::sampler::SamplingParams;
use shardlm_engine::serving::windows::window_blocks_for;
use shardlm_engine::serving::{Scheduler, SchedulerConfig, SeqHooks, SeqOutcome, Submission};
use shardlm_engine::EngineError;
use std::sync::{Arc, Mutex};

fn config() -> SchedulerConfig {
    SchedulerConfig { block: 16, n_blocks: 96, max_batch: 8, step_tokens: 64, prefix_cache: true, n_window_blocks: 0 }
}

/// How a test drafter derives its proposal from the reference continuation.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// What the plain run generated next: every draft token is accepted.
    Right,
    /// Each of those tokens plus one: every draft token is rejected.
    Wrong,
    /// The first right, the rest wrong.
    RightThenWrong,
}

/// Proposes from the plain run's output (`prompt` + `out`).
struct Oracle {
    prompt: usize,
    out: Vec<u32>,
    kind: Kind,
    vocab: u32,
}

impl Drafter for Oracle {
    fn propose(&mut self, history: &[u32], k: usize) -> Vec<u32> {
        let done = history.len() - self.prompt;
        let next = self.out.iter().skip(done).take(k).copied();
        next.enumerate()
            .map(|(i, t)| match (self.kind, i) {
                (Kind::Right, _) | (Kind::RightThenWrong, 0) => t,
                _ => (t + 1) % self.vocab,
            })
            .collect()
    }
}

fn submit(s: &mut Scheduler, req: GenerateRequest) -> Arc<Mutex<Seen>> {
    let seen = Arc::new(Mutex::new(Seen::default()));
    s.submit(Submission { request: req, hooks: Box::new(Recorder(seen.clone())) });
    seen
}

fn drain(s: &mut Scheduler, e: &mut Engine) {
    while s.has_work() {
        s.step(e).expect("step");
    }
}

/// Runs `prompt` for `n` tokens, then `prompt + output` (whose prefix comes
/// from the cache the first run filled) for 8 more; returns both recordings.
fn run_pair(sched: &mut Scheduler, e: &mut Engine, prompt: &[u32], n: usize, draft: DraftChoice) -> (Seen, Seen) {
    let first = submit(sched, GenerateRequest { draft, ..request(prompt.to_vec(), n) });
    drain(sched, e);
    let first = std::mem::take(&mut *first.lock().unwrap());
    let mut longer = prompt.to_vec();
    longer.extend(&first.tokens);
    let second = submit(sched, GenerateRequest { draft: DraftChoice::Off, ..request(longer, 8) });
    drain(sched, e);
    let second = std::mem::take(&mut *second.lock().unwrap());
    (first, second)
}

/// A prompt with repeats, so that the n-gram drafter finds matches.
fn repetitive_prompt(len: usize) -> Vec<u32> {
    let phrase: Vec<u32> = (0..23).map(|i| (i * 37 + 11) % 1000 + 3).collect();
    (0..len).map(|i| if i % 50 < 30 { phrase[i % 23] } else { (i as u32 * 7919) % 1000 + 5 }).collect()
}

/// [`config`] with a sliding-window block group sized for the model's window.
fn window_config(e: &Engine) -> SchedulerConfig {
    let c = config();
    let n_window_blocks =
        window_blocks_for(e.model.max_window(), e.context_length(), c.block, c.max_batch, c.step_tokens, true);
    assert!(n_window_blocks > 0, "the fixture's window saves nothing");
    SchedulerConfig { n_window_blocks, ..c }
}

fn greedy_equality(name: &str) {
    greedy_equality_with(name, |_| config());
}

fn greedy_equality_with(name: &str, config: impl Fn(&Engine) -> SchedulerConfig) {
    greedy_equality_of(name, fixture_engine(name, 64), config);
}

fn greedy_equality_of(name: &str, mut e: Engine, config: impl Fn(&Engine) -> SchedulerConfig) {
    let cfg = config(&e);
    let config = || cfg.clone();
    let hybrid = e.model.spec.linear_attn.is_some();
    let vocab = e.model.config.vocab_size as u32;
    let prompt = repetitive_prompt(150);
    let n = 40;
    let on = DraftChoice::On(DraftParams { max: 6, min: 1 });
    let mut plain = Scheduler::new(&mut e, config()).unwrap();
    let (want, want_after) = run_pair(&mut plain, &mut e, &prompt, n, DraftChoice::Off);
    assert_eq!(want.tokens.len(), n);
    assert_eq!(plain.stats().spec_drafted, 0);
    let drafters: [(&str, Option<Kind>); 4] = [
        ("n-gram", None),
        ("always right", Some(Kind::Right)),
        ("always wrong", Some(Kind::Wrong)),
        ("right then wrong", Some(Kind::RightThenWrong)),
    ];
    for (what, kind) in drafters {
        let mut sched = Scheduler::new(&mut e, config()).unwrap();
        // A random model's text repeats little: draft whatever is found.
        sched.set_draft_gate(false);
        if let Some(kind) = kind {
            let oracle = Oracle { prompt: prompt.len(), out: want.tokens.clone(), kind, vocab };
            sched.set_drafter(Some(Box::new(oracle)));
        }
        let (got, got_after) = run_pair(&mut sched, &mut e, &prompt, n, on);
        let st = sched.stats();
        let out: SeqOutcome = got.outcome.clone().unwrap().unwrap();
        eprintln!("{name} {what}: {} of {} draft tokens accepted", out.accepted, out.drafted);
        assert!(out.drafted > 0, "{name} {what}: never speculated");
        assert_eq!((st.spec_drafted, st.spec_accepted), (out.drafted as u64, out.accepted as u64));
        match kind {
            Some(Kind::Right) => assert_eq!(out.accepted, out.drafted, "{name}: right drafts rejected"),
            Some(Kind::Wrong) => assert_eq!(out.accepted, 0, "{name}: wrong drafts accepted"),
            _ => {}
        }
        assert_eq!(got.tokens, want.tokens, "{name} {what}: greedy tokens differ");
        assert!(got.logits == want.logits, "{name} {what}: logits differ from plain decode steps");
        // The longer prompt's prefix came from the cached prompt blocks of
        // both runs, and continues the same.
        let (a, b) = (got_after.outcome.clone().unwrap().unwrap(), want_after.outcome.clone().unwrap().unwrap());
        assert_eq!(a.cached_tokens, b.cached_tokens, "{name} {what}: cached different prefixes");
        // Whole blocks of 16; a hybrid resumes at its state snapshots (every 64).
        let granule = if hybrid { 64 } else { 16 };
        assert!(a.cached_tokens >= prompt.len() / granule * granule, "{name} {what}: {} cached", a.cached_tokens);
        assert!(got_after.logits == want_after.logits, "{name} {what}: KV after speculation differs");
        assert_eq!(st.blocks.used, 0, "{name} {what}: every block is released");
    }
}

#[test]
fn greedy_speculation_equals_plain_decoding_tiny() {
    // gpt_oss has attention sinks and windows over full blocks; qwen3 q/k
    // norms; deepseek_v3 latent attention (MLA) and experts; qwen3_moe experts.
    for name in ["llama", "qwen3", "mistral", "gpt_oss", "deepseek_v3", "qwen3_moe"] {
        greedy_equality(name);
    }
}

#[test]
fn greedy_speculation_equals_plain_decoding_hybrid() {
    // Linear-attention layers: a rejected draft's rows are taken back from
    // each layer's recurrent and conv states (replayed from the state before
    // the verify step), and the logits after it are those of plain decoding.
    for name in ["qwen3_next", "qwen3_5", "qwen3_5_moe"] {
        greedy_equality(name);
    }
}

/// The same on the GPU (`--device gpu`): a hybrid's linear layers keep
/// their way back on the device (the state before a verify step and its
/// projection rows) and replay the accepted rows there; attention layers
/// read the device KV rows the verify steps wrote. On Mesa's llvmpipe in CI.
#[test]
fn greedy_speculation_equals_plain_decoding_on_the_gpu() {
    for name in ["qwen3_5", "llama"] {
        let opts = model::LoadOptions { device: model::Device::Gpu(None), ..Default::default() };
        let Some(m) = fixture_model_on(name, &opts) else { return };
        let mut e = Engine::new(m, None, 2);
        e.prefill_chunk = 64;
        greedy_equality_of(name, e, |_| config());
    }
}

#[test]
fn greedy_speculation_equals_plain_decoding_window_group() {
    // Sliding-window layers on blocks of their own: a draft's positions get
    // window blocks before the verify step, and trimming after it keeps the
    // window of the accepted positions.
    for name in ["gemma3", "gpt_oss"] {
        greedy_equality_with(name, window_config);
    }
}

#[test]
fn greedy_speculation_equals_plain_decoding_smollm2() {
    let Some(path) = common::smollm2() else { return };
    let files = formats::open_model(&path).unwrap();
    let spec = model::ShardSpec::full(files.config.n_layers);
    let m = model::Model::load(&files, &spec, &model::LoadOptions::default()).unwrap();
    let tok = shardlm_engine::Tokenizer::from_source(&files.tokenizer).unwrap().unwrap();
    let text: String = (0..12).map(|i| format!("def f{i}(x):\n    return x * {} + {i}\n\n", i % 5 + 2)).collect();
    let prompt = tok.encode(&format!("Repeat this code exactly:\n{text}\nHere it is:\n"), true).unwrap();
    let mut e = Engine::new(m, Some(tok), 2);
    e.prefill_chunk = 128;
    let mut plain = Scheduler::new(&mut e, config()).unwrap();
    let (want, _) = run_pair(&mut plain, &mut e, &prompt, 60, DraftChoice::Off);
    let mut sched = Scheduler::new(&mut e, config()).unwrap();
    let (got, _) = run_pair(&mut sched, &mut e, &prompt, 60, DraftChoice::On(DraftParams::default()));
    let out = got.outcome.clone().unwrap().unwrap();
    eprintln!("smollm2 n-gram: {} of {} draft tokens accepted", out.accepted, out.drafted);
    assert!(out.accepted > 0);
    assert_eq!(got.tokens, want.tokens, "greedy tokens differ");
    assert!(got.logits == want.logits, "logits differ from plain decode steps");
}

/// Forces the first token, then records the logits of the second (drawn
/// from a verify row against the drafter's fixed token).
struct Fixed {
    first: u32,
    calls: usize,
    logits: Arc<Mutex<Option<Vec<f32>>>>,
    tokens: Arc<Mutex<Vec<u32>>>,
}

impl GenerateHooks for Fixed {
    fn wants_logits(&self) -> bool {
        true
    }
    fn constrain(&mut self, logits: &mut [f32], _remaining: usize) {
        self.calls += 1;
        if self.calls == 1 {
            for (i, l) in logits.iter_mut().enumerate() {
                if i as u32 != self.first {
                    *l = f32::NEG_INFINITY;
                }
            }
        } else if self.calls == 2 {
            *self.logits.lock().unwrap() = Some(logits.to_vec());
        }
    }
    fn on_token(&mut self, id: u32) -> bool {
        self.tokens.lock().unwrap().push(id);
        true
    }
    fn on_text(&mut self, _text: &str) {}
}

impl SeqHooks for Fixed {
    fn done(&mut self, result: Result<SeqOutcome, EngineError>) {
        result.expect("request");
    }
}

struct Always(u32);

impl Drafter for Always {
    fn propose(&mut self, _history: &[u32], k: usize) -> Vec<u32> {
        vec![self.0; k.min(1)]
    }
}

#[test]
fn speculative_sampling_keeps_the_distribution() {
    let mut e = fixture_engine("llama", 64);
    let prompt: Vec<u32> = (0..20).map(|i| (i * 53 + 7) % 1000 + 2).collect();
    let (top_k, temperature) = (8, 1.5);
    // The second token's top-k and its probabilities: one plain request.
    let probe = |sched: &mut Scheduler, seed: u64, draft: DraftChoice| {
        let (logits, tokens) = (Arc::new(Mutex::new(None)), Arc::new(Mutex::new(Vec::new())));
        let hooks = Fixed { first: 5, calls: 0, logits: logits.clone(), tokens: tokens.clone() };
        let sampling = SamplingParams { temperature, top_k, seed, ..Default::default() };
        let req = GenerateRequest { sampling, draft, ..request(prompt.clone(), 3) };
        sched.submit(Submission { request: req, hooks: Box::new(hooks) });
        (logits, tokens)
    };
    let mut sched = Scheduler::new(&mut e, config()).unwrap();
    let (l, _) = probe(&mut sched, 0, DraftChoice::Off);
    drain(&mut sched, &mut e);
    let row = l.lock().unwrap().clone().expect("second row");
    let mut order: Vec<(f32, u32)> = row.iter().enumerate().map(|(i, &v)| (v / temperature, i as u32)).collect();
    order.sort_by(|a, b| b.0.total_cmp(&a.0));
    order.truncate(top_k);
    let max = order[0].0;
    let z: f64 = order.iter().map(|c| ((c.0 - max) as f64).exp()).sum();
    let p: Vec<(u32, f64)> = order.iter().map(|c| (c.1, ((c.0 - max) as f64).exp() / z)).collect();
    // Draft the second most likely token: both accept and reject happen often.
    let draft_tok = p[1].0;
    sched.set_drafter(Some(Box::new(Always(draft_tok))));
    let on = DraftChoice::On(DraftParams { max: 1, min: 1 });
    let n = 3000;
    let mut counts = vec![0usize; top_k];
    let mut pending = Vec::new();
    for seed in 0..n {
        pending.push(probe(&mut sched, seed as u64 + 1, on));
        if pending.len() == 8 || seed + 1 == n {
            drain(&mut sched, &mut e);
            for (l, t) in pending.drain(..) {
                assert!(l.lock().unwrap().as_ref() == Some(&row), "the second row's logits changed");
                let second = t.lock().unwrap()[1];
                let at = p.iter().position(|c| c.0 == second).expect("a token of the top-k");
                counts[at] += 1;
            }
        }
    }
    let st = sched.stats();
    assert_eq!(st.spec_drafted, n as u64, "one draft token per request");
    let chi2: f64 = p.iter().zip(&counts).map(|(c, &o)| (o as f64 - n as f64 * c.1).powi(2) / (n as f64 * c.1)).sum();
    eprintln!("p {p:?}\ncounts {counts:?}\nchi2 {chi2:.2} (7 dof), accepted {} of {n}", st.spec_accepted);
    // 7 degrees of freedom: P(χ² > 24.3) = 0.001.
    assert!(chi2 < 24.3, "chi-square {chi2:.1}: the output distribution moved");
    let rate = st.spec_accepted as f64 / n as f64;
    assert!((rate - p[1].1).abs() < 0.05, "acceptance {rate:.3} vs p(draft) {:.3}", p[1].1);
}

#[test]
fn draft_bounds_are_checked() {
    let mut e = fixture_engine("llama", 64);
    let mut sched = Scheduler::new(&mut e, config()).unwrap();
    assert!(sched.set_draft(Some(DraftParams { max: 40, min: 1 })).is_err(), "draft-max over 16");
    assert!(sched.set_draft(Some(DraftParams::default())).is_ok());
}
