//! Gemma 3 270M (window 512 on 15 of its 18 layers) served through the paged
//! pool with the window group, as `serve` runs it (blocks of 32): a
//! two-turn conversation, each prompt several windows long, equals bit for
//! bit the same turns served by a pool whose windowed layers keep every
//! position, and the second turn resumes from the prefix cache as deep.
//! (Not compared with a cold `run`: this Q4_K_M model's prefill logits move
//! by up to ~1.8 with how a prompt is chunked even with an unbounded cache,
//! so only equal schedules compare exactly.)

mod common;
use common::gemma3;
use common::serving::{request, Recorder, Seen};
use model::{LoadOptions, Model, ShardSpec};
use shardlm_engine::generate::Engine;
use shardlm_engine::serving::windows::window_blocks_for;
use shardlm_engine::serving::{Scheduler, SchedulerConfig, Submission};
use std::sync::{Arc, Mutex};

fn serve_one(s: &mut Scheduler, e: &mut Engine, prompt: &[u32], n: usize) -> Seen {
    let seen = Arc::new(Mutex::new(Seen::default()));
    s.submit(Submission { request: request(prompt.to_vec(), n), hooks: Box::new(Recorder(seen.clone())) });
    while s.has_work() {
        s.step(e).expect("step");
    }
    let out = std::mem::take(&mut *seen.lock().unwrap());
    out
}

#[test]
fn gemma3_270m_conversation_with_window_blocks_equals_every_position() {
    let Some(path) = gemma3() else { return };
    let files = formats::open_model(&path).unwrap();
    let load = || {
        let m = Model::load(&files, &ShardSpec::full(files.config.n_layers), &LoadOptions::default()).unwrap();
        let mut e = Engine::new(m, None, 2);
        e.prefill_chunk = 256;
        e
    };
    let (mut windowed, mut unbounded) = (load(), load());
    assert_eq!(windowed.model.max_window(), Some(512));
    let (block, step, ctx) = (32, 256, windowed.context_length());
    let n_window_blocks = window_blocks_for(windowed.model.max_window(), ctx, block, 2, step, true);
    let cfg =
        SchedulerConfig { block, n_blocks: 96, max_batch: 2, step_tokens: step, prefix_cache: true, n_window_blocks };
    let mut a = Scheduler::new(&mut windowed, cfg.clone()).unwrap();
    let mut b = Scheduler::new(&mut unbounded, SchedulerConfig { n_window_blocks: 0, ..cfg }).unwrap();
    let (wb, ub) = (windowed.pool_bytes().unwrap(), unbounded.pool_bytes().unwrap());
    eprintln!("pool: {wb} bytes with the window group, {ub} without");
    assert!(wb < ub);
    let mut history: Vec<u32> = (0..1300u32).map(|i| 1000 + (i.wrapping_mul(2_654_435_761) >> 9) % 20_000).collect();
    let n_gen = 8;
    for turn in 0..2 {
        let got = serve_one(&mut a, &mut windowed, &history, n_gen);
        let want = serve_one(&mut b, &mut unbounded, &history, n_gen);
        let (cached, cached_full) = (
            got.outcome.as_ref().unwrap().as_ref().unwrap().cached_tokens,
            want.outcome.as_ref().unwrap().as_ref().unwrap().cached_tokens,
        );
        let d = got
            .logits
            .iter()
            .zip(&want.logits)
            .flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs()))
            .fold(0f32, f32::max);
        eprintln!("turn {turn}: {} prompt tokens, {cached} cached, max |Δlogit| {d:e}", history.len());
        assert_eq!(d, 0.0, "turn {turn}: the window group changes no logit");
        assert_eq!(cached, cached_full, "turn {turn}: the prefix cache resumes as deep");
        if turn > 0 {
            assert!(cached >= history.len() - 300, "turn {turn}: {cached} cached");
        }
        assert_eq!(got.tokens, want.tokens);
        history.extend_from_slice(&got.tokens);
        history.extend((0..250u32).map(|i| 2000 + i * 7 % 5000));
    }
    assert_eq!(a.stats().window_blocks.used, 0);
}
