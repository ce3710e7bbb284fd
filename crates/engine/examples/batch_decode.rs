//! Aggregate decode rate of the batching scheduler against batch size, on a
//! GGUF (default: the cached SmolLM2): each batch size runs that many
//! `ignore_eos` requests of 8 prompt tokens to `--gen` tokens, and the rate
//! counts only steps in which every sequence decodes.
//!
//! `cargo run --release -p shardlm-engine --example batch_decode -- [GGUF] [threads] [gen]`

use shardlm_engine::generate::{Engine, GenerateHooks, GenerateRequest};
use shardlm_engine::serving::{Scheduler, SchedulerConfig, SeqHooks, SeqOutcome, Submission};
use shardlm_engine::EngineError;
use std::time::Instant;

struct Quiet;
impl GenerateHooks for Quiet {
    fn on_text(&mut self, _: &str) {}
}
impl SeqHooks for Quiet {
    fn done(&mut self, r: Result<SeqOutcome, EngineError>) {
        r.expect("request failed");
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).cloned().unwrap_or_else(|| {
        format!("{}/.cache/shardlm/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf", std::env::var("HOME").unwrap())
    });
    let threads: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(2);
    let gen: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(64);
    let files = formats::open_model(std::path::Path::new(&path)).expect("model");
    let m = model::Model::load(&files, &model::ShardSpec::full(files.config.n_layers), &Default::default()).unwrap();
    let mut engine = Engine::new(m, None, threads);
    let cfg = SchedulerConfig {
        block: 32,
        n_blocks: 1024,
        max_batch: 64,
        step_tokens: 512,
        prefix_cache: false,
        n_window_blocks: 0,
    };
    let mut sched = Scheduler::new(&mut engine, cfg).unwrap();
    let mut base = 0.0;
    for batch in [1usize, 2, 4, 8, 16, 32] {
        for i in 0..batch {
            let request = GenerateRequest {
                prompt_ids: (0..8).map(|t| 100 + (i * 8 + t) as u32).collect(),
                max_tokens: gen,
                sampling: Default::default(),
                stop_strings: Vec::new(),
                ignore_eos: true,
                want_prompt_logits: false,
                draft: Default::default(),
            };
            sched.submit(Submission { request, hooks: Box::new(Quiet) });
        }
        // Prefill (one step for all), then time the full decode steps.
        sched.step(&mut engine).expect("step");
        let (t, mut steps) = (Instant::now(), 0);
        while sched.stats().running == batch {
            sched.step(&mut engine).expect("step");
            steps += 1;
        }
        while sched.has_work() {
            sched.step(&mut engine).expect("step");
        }
        let rate = (steps * batch) as f64 / t.elapsed().as_secs_f64();
        if batch == 1 {
            base = rate;
        }
        println!(
            "batch {batch:3}: {rate:7.1} tok/s aggregate, {:6.2} ms/step, {:.2}× batch 1",
            1e3 * t.elapsed().as_secs_f64() / steps as f64,
            rate / base
        );
    }
}
