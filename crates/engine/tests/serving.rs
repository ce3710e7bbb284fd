//! The batching scheduler against the plain generation loop on SmolLM2 Q4_1.
//! A request's logits at every sampled step, run cold and alone through its own
//! contiguous cache, are compared with the same request run through the paged
//! pool:
//! - cold, and again with its prompt served from the prefix cache: **bit for
//!   bit equal** (prefill rows never depend on their chunk: attention splits
//!   keys only in decode, and a prompt piece of one row is still a prefill row);
//! - batched with other requests: bit for bit equal at the AVX-512 level (its
//!   tile kernels give every activation row the one-row arithmetic); at the
//!   AVX2 and scalar levels within `LOGIT_BOUND`, greedy tokens identical.
//!
//! Why a bound below AVX-512: there a step of `m` sequences runs the matmuls
//! with the AVX2 two-row tile kernel, a lone decode with the four-row one; their
//! float sums differ in the last bit, and the 8-bit activation quantization
//! (as llama.cpp's) turns a last-bit change into a one-step rounding change of
//! an int8 activation now and then, which 30 layers carry to the logits.
//! Measured before the AVX-512 tiles existed: up to 0.9 on logits of magnitude
//! ~20 (top-1 unchanged here).

mod common;
use common::serving::{max_diff, request, submit, Recorder, Seen};
use common::smollm2;
use model::{LoadOptions, Model, ShardSpec};
use shardlm_engine::generate::Engine;
use shardlm_engine::serving::{Scheduler, SchedulerConfig};
use std::sync::{Arc, Mutex};

const LOGIT_BOUND: f32 = 1.5;

/// SmolLM2 loaded whole, with its tokenizer (`None` when it is not cached).
fn smollm2_model() -> Option<(Model, shardlm_engine::Tokenizer)> {
    let path = smollm2()?;
    let files = formats::open_model(&path).unwrap();
    let m = Model::load(&files, &ShardSpec::full(files.config.n_layers), &LoadOptions::default()).unwrap();
    let tok = shardlm_engine::Tokenizer::from_source(&files.tokenizer).unwrap().unwrap();
    Some((m, tok))
}

#[test]
fn scheduler_matches_cold_single_runs_with_prefix_cache_and_batching() {
    let Some((m, tok)) = smollm2_model() else { return };
    let text: String = (0..60).map(|i| format!("fn step_{i}(x: u32) -> u32 {{ x * {} + {i} }}\n", i % 7 + 2)).collect();
    let prompt = tok.encode(&format!("Explain this code:\n{text}"), true).unwrap();
    assert!(prompt.len() > 600, "prompt of {} tokens", prompt.len());
    let side_prompts: Vec<Vec<u32>> =
        (0..5).map(|i| tok.encode(&format!("Count to {}:", i + 3), true).unwrap()).collect();
    let mut engine = Engine::new(m, Some(tok), 2);
    engine.prefill_chunk = 256;
    let n_gen = 12;

    // Cold, alone, contiguous cache: the reference.
    let reference = Arc::new(Mutex::new(Seen::default()));
    engine.generate_hooked(&request(prompt.clone(), n_gen), &mut Recorder(reference.clone()), &model::NoComm).unwrap();
    let reference = std::mem::take(&mut *reference.lock().unwrap());

    let cfg = SchedulerConfig {
        block: 32,
        n_blocks: 128,
        max_batch: 8,
        step_tokens: 256,
        prefix_cache: true,
        n_window_blocks: 0,
    };
    let mut sched = Scheduler::new(&mut engine, cfg).unwrap();
    let run = |sched: &mut Scheduler, engine: &mut Engine, others: usize| {
        let main = submit(sched, request(prompt.clone(), n_gen));
        let side: Vec<_> = (0..others).map(|i| submit(sched, request(side_prompts[i].clone(), 5 + i))).collect();
        while sched.has_work() {
            sched.step(engine).expect("step");
        }
        for s in side {
            assert!(matches!(s.lock().unwrap().outcome, Some(Ok(_))), "a side request failed");
        }
        let seen = std::mem::take(&mut *main.lock().unwrap());
        seen
    };
    for (what, others) in [("cold, paged", 0), ("prefix-cached", 0), ("prefix-cached, batched with 5", 5)] {
        let seen = run(&mut sched, &mut engine, others);
        let out = seen.outcome.clone().unwrap().unwrap();
        let cached = out.cached_tokens;
        if what == "cold, paged" {
            assert_eq!(cached, 0);
        } else {
            assert!(cached >= prompt.len() - 32, "{what}: {cached} of {} prompt tokens cached", prompt.len());
        }
        let d = max_diff(&seen.logits, &reference.logits);
        eprintln!("{what}: max |Δlogit| {d:.2e} vs the cold contiguous run ({cached} tokens cached)");
        // Exact alone; exact batched too where the AVX-512 tiles run.
        if others == 0 || kernels::isa::active() == kernels::isa::Isa::Avx512 {
            assert_eq!(d, 0.0, "{what}: must match the cold run exactly");
        }
        assert!(d < LOGIT_BOUND, "{what}: logits differ by {d}");
        assert_eq!(seen.tokens, reference.tokens, "{what}: greedy tokens differ");
    }
    let st = sched.stats();
    assert_eq!(st.blocks.used, 0, "every block is released");
    assert_eq!(st.blocks.total, st.blocks.used + st.blocks.cached + st.blocks.free);
}

#[test]
fn scheduler_refuses_what_cannot_fit_and_survives_pressure() {
    let Some((m, tok)) = smollm2_model() else { return };
    let prompts: Vec<Vec<u32>> = (0..6).map(|i| tok.encode(&format!("Say {i} {i} {i}"), true).unwrap()).collect();
    let mut engine = Engine::new(m, Some(tok), 2);
    // 4 blocks of 16: 64 positions for everyone.
    let cfg = SchedulerConfig {
        block: 16,
        n_blocks: 4,
        max_batch: 8,
        step_tokens: 64,
        prefix_cache: true,
        n_window_blocks: 0,
    };
    let mut sched = Scheduler::new(&mut engine, cfg).unwrap();
    let too_big = submit(&mut sched, request(vec![1; 40], 40));
    assert!(too_big.lock().unwrap().outcome.as_ref().unwrap().as_ref().unwrap_err().contains("KV pool"));
    // Six requests of 20 + 20 positions each: they cannot all hold blocks at
    // once, so some wait or are preempted, and all finish.
    let seqs: Vec<_> = prompts.into_iter().map(|p| submit(&mut sched, request(p, 20))).collect();
    let mut steps = 0;
    while sched.has_work() {
        sched.step(&mut engine).expect("step");
        steps += 1;
        assert!(steps < 10_000, "no progress");
    }
    for s in seqs {
        let s = s.lock().unwrap();
        assert_eq!(s.outcome.as_ref().unwrap().as_ref().unwrap().output_ids.len(), 20);
    }
    assert_eq!(sched.stats().blocks.used, 0);
}

/// An agent's next turn contains the reply the server generated. The reply's
/// KV rows came from decode steps, which sum attention in another order than
/// a prompt chunk, so the prefix cache reuses only prompt rows: the next turn
/// equals a cold run bit for bit. With re-warming on (as `serve` runs), the
/// reply's blocks are made again as prompt rows while idle and then reused.
#[test]
fn a_next_turn_reuses_only_prompt_rows_and_equals_the_cold_run() {
    let Some((m, tok)) = smollm2_model() else { return };
    let text: String = (0..30).map(|i| format!("let v{i} = {} * x + {i};\n", i % 4 + 3)).collect();
    let prompt = tok.encode(&format!("Explain:\n{text}"), true).unwrap();
    let mut engine = Engine::new(m, Some(tok), 2);
    engine.prefill_chunk = 128;
    let cfg = SchedulerConfig {
        block: 32,
        n_blocks: 96,
        max_batch: 4,
        step_tokens: 128,
        prefix_cache: true,
        n_window_blocks: 0,
    };
    let drive = |sched: &mut Scheduler, engine: &mut Engine, p: &[u32], n: usize| {
        let seen = submit(sched, request(p.to_vec(), n));
        while sched.has_work() {
            sched.step(engine).expect("step");
        }
        let seen = std::mem::take(&mut *seen.lock().unwrap());
        let cached = seen.outcome.as_ref().unwrap().as_ref().unwrap().cached_tokens;
        (seen, cached)
    };
    for rewarm in [false, true] {
        let mut sched = Scheduler::new(&mut engine, cfg.clone()).unwrap();
        sched.set_rewarm(rewarm);
        // Turn 1 generates 70 tokens: two or more blocks of decode rows.
        let (first, _) = drive(&mut sched, &mut engine, &prompt, 70);
        let mut turn2 = prompt.clone();
        turn2.extend(&first.tokens);
        turn2.extend(&prompt[1..40]);
        let (warm, cached) = drive(&mut sched, &mut engine, &turn2, 8);
        let mut fresh = Scheduler::new(&mut engine, cfg.clone()).unwrap();
        let (cold, _) = drive(&mut fresh, &mut engine, &turn2, 8);
        let expect = if rewarm { (prompt.len() + 70) / 32 * 32 } else { prompt.len() / 32 * 32 };
        assert_eq!(cached, expect, "rewarm {rewarm}: cached tokens");
        assert_eq!(warm.logits, cold.logits, "rewarm {rewarm}: the next turn must equal the cold run bit for bit");
    }
}

/// A re-warm runs only while the server is idle: a request that arrives
/// while one runs decodes alone (the re-warm gives its blocks back and waits
/// at the front of its queue), and once idle again the re-warm finishes, so
/// the next turn still finds the whole reply cached.
#[test]
fn a_rewarm_gives_way_to_a_request_and_finishes_when_idle() {
    let Some((m, tok)) = smollm2_model() else { return };
    let text: String = (0..30).map(|i| format!("let v{i} = {} * x + {i};\n", i % 4 + 3)).collect();
    let prompt = tok.encode(&format!("Explain:\n{text}"), true).unwrap();
    let other = tok.encode("Write a haiku about the sea.", true).unwrap();
    let mut engine = Engine::new(m, Some(tok), 2);
    engine.prefill_chunk = 16;
    // Steps of 16 tokens: re-warming a 70-token reply takes several steps.
    let cfg = SchedulerConfig {
        block: 16,
        n_blocks: 128,
        max_batch: 4,
        step_tokens: 16,
        prefix_cache: true,
        n_window_blocks: 0,
    };
    let mut sched = Scheduler::new(&mut engine, cfg).unwrap();
    sched.set_rewarm(true);
    let first = submit(&mut sched, request(prompt.clone(), 70));
    while first.lock().unwrap().outcome.is_none() {
        sched.step(&mut engine).expect("step");
    }
    // The server is idle: the re-warm starts.
    sched.step(&mut engine).expect("step");
    assert_eq!(sched.stats().running, 1, "the re-warm runs");
    let b = submit(&mut sched, request(other, 24));
    while b.lock().unwrap().outcome.is_none() {
        sched.step(&mut engine).expect("step");
        assert!(sched.stats().running <= 1, "the re-warm runs beside the request");
    }
    assert_eq!(sched.stats().rewarm_yields, 1);
    while sched.has_work() {
        sched.step(&mut engine).expect("step");
    }
    let first = std::mem::take(&mut *first.lock().unwrap());
    let mut turn2 = prompt.clone();
    turn2.extend(&first.tokens);
    turn2.extend(&prompt[1..40]);
    let next = submit(&mut sched, request(turn2, 4));
    while sched.has_work() {
        sched.step(&mut engine).expect("step");
    }
    let cached = next.lock().unwrap().outcome.as_ref().unwrap().as_ref().unwrap().cached_tokens;
    assert_eq!(cached, (prompt.len() + 70) / 16 * 16, "the re-warm finished after the request");
}

/// A prompt of `k·32 + 1` tokens served again from the prefix cache resumes
/// with a piece of one row, and a chunk budget can leave a last chunk of one
/// row. Both are prompt rows: attention runs them as a prefill chunk (not as
/// a decode step), so every sampled step's logits equal the cold run's bit
/// for bit.
#[test]
fn a_one_row_prompt_piece_equals_the_cold_run() {
    let Some((m, tok)) = smollm2_model() else { return };
    let text: String = (0..120).map(|i| format!("item {i}: weight {} kg\n", i * 3 % 11 + 1)).collect();
    let mut prompt = tok.encode(&format!("Sum the weights:\n{text}"), true).unwrap();
    assert!(prompt.len() > 321, "prompt of {} tokens", prompt.len());
    prompt.truncate(321);
    let mut engine = Engine::new(m, Some(tok), 2);
    engine.prefill_chunk = 256;
    let reference = Arc::new(Mutex::new(Seen::default()));
    engine.generate_hooked(&request(prompt.clone(), 6), &mut Recorder(reference.clone()), &model::NoComm).unwrap();
    let reference = std::mem::take(&mut *reference.lock().unwrap());
    let cfg = |step_tokens| SchedulerConfig {
        block: 32,
        n_blocks: 32,
        max_batch: 2,
        step_tokens,
        prefix_cache: true,
        n_window_blocks: 0,
    };
    let run = |sched: &mut Scheduler, engine: &mut Engine| {
        let seen = submit(sched, request(prompt.clone(), 6));
        while sched.has_work() {
            sched.step(engine).expect("step");
        }
        let seen = std::mem::take(&mut *seen.lock().unwrap());
        let cached = seen.outcome.as_ref().unwrap().as_ref().unwrap().cached_tokens;
        (seen, cached)
    };
    let mut sched = Scheduler::new(&mut engine, cfg(256)).unwrap();
    let (cold, _) = run(&mut sched, &mut engine);
    let (warm, cached) = run(&mut sched, &mut engine);
    assert_eq!(cached, 320, "the rerun resumes one row before the prompt's end");
    // Chunks of 64 rows, the last of one.
    let mut chunked = Scheduler::new(&mut engine, cfg(64)).unwrap();
    let (split, _) = run(&mut chunked, &mut engine);
    for (what, got) in [("cold", &cold), ("one-row resume", &warm), ("one-row last chunk", &split)] {
        assert_eq!(got.logits, reference.logits, "{what}: logits must equal the contiguous run bit for bit");
    }
}
