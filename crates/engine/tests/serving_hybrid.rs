//! The batching scheduler on the hybrid linear-attention fixtures (Qwen3.5
//! dense, Qwen3-Next MoE): a growing conversation served through the paged
//! pool with the prefix cache — KV blocks plus recurrent-state snapshots —
//! against each turn run cold and alone through a contiguous cache. Logits
//! at every sampled step are equal bit for bit (prefill pieces end on
//! multiples of the delta rule's chunk, so every chunk is computed alike),
//! and `cached_tokens` shows the reuse.

mod common;
use common::serving::{fixture_engine, request, Recorder, Seen};
use shardlm_engine::generate::Engine;
use shardlm_engine::serving::{Scheduler, SchedulerConfig, Submission};
use std::sync::{Arc, Mutex};

/// A fixture's engine (a name under tests/fixtures/tiny, or a directory).
fn engine(name: &str) -> Engine {
    fixture_engine(name, 64)
}

/// Pseudo-random token ids below 1024.
fn tokens(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed.wrapping_mul(40_503)) >> 7) % 1000 + 3)
        .collect()
}

fn conversation_matches_cold_runs(name: &str) {
    let mut cold = engine(name);
    let mut served = engine(name);
    // Blocks of 32 (the attention kernel's key step, as serve's). Steps of 100 tokens: not a multiple of the chunk, so the scheduler's
    // alignment of prefill pieces is exercised.
    let cfg = SchedulerConfig {
        block: 32,
        n_blocks: 48,
        max_batch: 4,
        step_tokens: 100,
        prefix_cache: true,
        n_window_blocks: 0,
    };
    let mut sched = Scheduler::new(&mut served, cfg).unwrap();
    let mut history = tokens(150, 1);
    let n_gen = 6;
    for turn in 0..3 {
        let reference = Arc::new(Mutex::new(Seen::default()));
        cold.generate_hooked(&request(history.clone(), n_gen), &mut Recorder(reference.clone()), &model::NoComm)
            .unwrap();
        let reference = std::mem::take(&mut *reference.lock().unwrap());
        let seen = Arc::new(Mutex::new(Seen::default()));
        sched.submit(Submission { request: request(history.clone(), n_gen), hooks: Box::new(Recorder(seen.clone())) });
        // A side request in the same batch.
        let side = Arc::new(Mutex::new(Seen::default()));
        let side_req = request(tokens(40 + turn * 7, 9 + turn as u32), 4);
        sched.submit(Submission { request: side_req, hooks: Box::new(Recorder(side.clone())) });
        while sched.has_work() {
            sched.step(&mut served).expect("step");
        }
        let seen = std::mem::take(&mut *seen.lock().unwrap());
        let out = seen.outcome.clone().unwrap().unwrap();
        assert!(matches!(side.lock().unwrap().outcome, Some(Ok(_))), "{name}: the side request failed");

        assert_eq!(seen.tokens, reference.tokens, "{name} turn {turn}: greedy tokens");
        let d = seen
            .logits
            .iter()
            .zip(&reference.logits)
            .flat_map(|(a, b)| a.iter().zip(b).map(|(x, y)| (x - y).abs()))
            .fold(0f32, f32::max);
        eprintln!(
            "{name} turn {turn}: {} prompt tokens, {} cached, max |Δlogit| {d:e}",
            history.len(),
            out.cached_tokens
        );
        assert_eq!(d, 0.0, "{name} turn {turn}: logits must equal the cold run's");
        if turn == 0 {
            assert_eq!(out.cached_tokens, 0);
        } else {
            // Resumed from the previous prompt's last snapshot boundary (a multiple of 64).
            let prev = history.len() - n_gen - 90;
            assert_eq!(out.cached_tokens, (prev - 1) / 64 * 64, "{name} turn {turn}: cached tokens");
        }
        history.extend_from_slice(&seen.tokens);
        history.extend(tokens(90, 100 + turn as u32));
    }
    assert_eq!(sched.stats().blocks.used, 0, "every block is released");
}

#[test]
fn qwen3_5_conversation_with_prefix_cache_equals_cold_runs() {
    conversation_matches_cold_runs("qwen3_5");
}

#[test]
fn qwen3_next_conversation_with_prefix_cache_equals_cold_runs() {
    conversation_matches_cold_runs("qwen3_next");
}
