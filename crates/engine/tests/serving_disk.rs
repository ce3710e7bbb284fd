//! The prefix cache's disk tier on SmolLM2 Q4_1, one process: a prompt's
//! blocks written by one scheduler are loaded by the next (a restart: a fresh,
//! empty pool), the output equals a cold run bit for bit, damaged files are
//! recomputed, and the directory stays within its bound in LRU order.

mod common;
use common::serving::{request, Recorder, Seen};
use common::smollm2;
use model::{LoadOptions, Model, ShardSpec};
use shardlm_engine::generate::Engine;
use shardlm_engine::kv_disk::KvDiskConfig;
use shardlm_engine::serving::{Scheduler, SchedulerConfig, Submission};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

const BLOCK: usize = 32;

fn engine(path: &Path) -> (Engine, Vec<u32>) {
    let files = formats::open_model(path).unwrap();
    let m = Model::load(&files, &ShardSpec::full(files.config.n_layers), &LoadOptions::default()).unwrap();
    let tok = shardlm_engine::Tokenizer::from_source(&files.tokenizer).unwrap().unwrap();
    let text: String = (0..40).map(|i| format!("def f_{i}(x):\n    return x * {} + {i}\n", i % 5 + 2)).collect();
    let prompt = tok.encode(&format!("Review this module:\n{text}"), true).unwrap();
    let mut e = Engine::new(m, Some(tok), 2);
    e.prefill_chunk = 128;
    e.disk.model_path = Some(path.to_path_buf());
    (e, prompt)
}

fn config(n_blocks: usize) -> SchedulerConfig {
    SchedulerConfig { block: BLOCK, n_blocks, max_batch: 4, step_tokens: 128, prefix_cache: true, n_window_blocks: 0 }
}

/// A scheduler over a fresh pool (what a restarted server has), with the
/// disk tier at `dir` when given.
fn scheduler(e: &mut Engine, n_blocks: usize, dir: Option<(&Path, u64)>) -> Scheduler {
    let mut s = Scheduler::new(e, config(n_blocks)).unwrap();
    if let Some((dir, max_bytes)) = dir {
        s.enable_disk(e, KvDiskConfig { dir: dir.to_path_buf(), max_bytes }).unwrap();
    }
    s
}

fn run(s: &mut Scheduler, e: &mut Engine, prompt: &[u32], n: usize) -> (Seen, usize) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    s.submit(Submission { request: request(prompt.to_vec(), n), hooks: Box::new(Recorder(seen.clone())) });
    while s.has_work() {
        s.step(e).expect("step");
    }
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    let cached = seen.outcome.as_ref().unwrap().as_ref().unwrap().cached_tokens;
    (seen, cached)
}

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("shardlm-disk-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn block_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = walk(dir).into_iter().filter(|p| p.extension().is_some_and(|x| x == "kvb")).collect();
    v.sort();
    v
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn blocks_survive_a_restart_and_damage_is_recomputed() {
    let Some(path) = smollm2() else { return };
    let (mut e, prompt) = engine(&path);
    assert!(prompt.len() > 400, "prompt of {} tokens", prompt.len());
    let dir = tmp("restart");
    let n = 8;

    // The reference: a cold run with no disk tier.
    let (cold, c0) = run(&mut scheduler(&mut e, 64, None), &mut e, &prompt, n);
    assert_eq!(c0, 0);

    // First server: cold, writes its blocks through.
    let (first, c1) = run(&mut scheduler(&mut e, 64, Some((&dir, 1 << 30))), &mut e, &prompt, n);
    assert_eq!(c1, 0);
    assert_eq!(first.logits, cold.logits);

    // The next turn after a "restart": a fresh pool, the blocks come from disk.
    let mut turn2 = prompt.clone();
    turn2.extend(&first.tokens);
    turn2.extend(&prompt[1..20]);
    let (cold2, _) = run(&mut scheduler(&mut e, 64, None), &mut e, &turn2, n);
    let mut s = scheduler(&mut e, 64, Some((&dir, 1 << 30)));
    // (Opening the tier again waited for the writes.)
    assert_eq!(block_files(&dir).len(), (prompt.len() + n - 1) / BLOCK, "one file per full block");
    let (warm2, c2) = run(&mut s, &mut e, &turn2, n);
    assert!(c2 * 10 >= turn2.len() * 9, "{c2} of {} prompt tokens from disk", turn2.len());
    assert_eq!(warm2.logits, cold2.logits, "a prompt loaded from disk must match the cold run bit for bit");
    let st = s.stats().disk.unwrap();
    assert_eq!(st.hit_tokens as usize, c2);
    assert_eq!(st.load_failures, 0);
    drop(s);

    // Flip a byte in one block file and cut another short: both are found,
    // deleted and recomputed, and the output does not change.
    let files = block_files(&dir);
    let mut f = std::fs::read(&files[3]).unwrap();
    let mid = f.len() / 2;
    f[mid] ^= 0x40;
    std::fs::write(&files[3], &f).unwrap();
    let g = std::fs::read(&files[7]).unwrap();
    std::fs::write(&files[7], &g[..g.len() / 3]).unwrap();
    let mut s = scheduler(&mut e, 64, Some((&dir, 1 << 30)));
    let (again, c3) = run(&mut s, &mut e, &turn2, n);
    assert_eq!(again.logits, cold2.logits, "damaged files must not change the output");
    assert!(c3 < c2, "a damaged block is recomputed ({c3} cached)");
    assert_eq!(s.stats().disk.unwrap().load_failures, 2, "both damaged files are found in one pass");
    // The recomputed blocks are written again: the next run loads it all.
    drop(s);
    let (_, c4) = run(&mut scheduler(&mut e, 64, Some((&dir, 1 << 30))), &mut e, &turn2, n);
    assert!(c4 >= c2, "{c4} cached after the repair, {c2} before the damage");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ram_eviction_falls_back_to_disk_and_the_bound_holds_in_lru_order() {
    let Some(path) = smollm2() else { return };
    let (mut e, prompt) = engine(&path);
    let dir = tmp("bound");
    // A pool of 30 blocks: the second prompt evicts the first from RAM.
    let other: Vec<u32> = prompt.iter().rev().copied().collect();
    let mut s = scheduler(&mut e, 30, Some((&dir, 1 << 30)));
    let (a, _) = run(&mut s, &mut e, &prompt, 4);
    run(&mut s, &mut e, &other[..prompt.len().min(560)], 4);
    let (b, cached) = run(&mut s, &mut e, &prompt, 4);
    assert!(cached >= prompt.len() - BLOCK, "RAM lost it, the disk had it: {cached} cached");
    assert_eq!(a.logits, b.logits);
    assert!(s.stats().disk.unwrap().hit_tokens > 0);
    drop(s);

    // A bound of 5 block files: never more on disk, the newest kept.
    let file_bytes = std::fs::metadata(&block_files(&dir)[0]).unwrap().len();
    let small = tmp("small");
    let mut s = scheduler(&mut e, 64, Some((&small, 5 * file_bytes + 100)));
    run(&mut s, &mut e, &prompt[..6 * BLOCK + 1], 1);
    drop(s);
    e.disk.store.as_ref().unwrap().flush();
    assert_eq!(block_files(&small).len(), 5);
    let mut s = scheduler(&mut e, 64, Some((&small, 5 * file_bytes + 100)));
    // A prompt's later blocks go first (its earlier ones serve more
    // continuations): the first five are there.
    let (_, c) = run(&mut s, &mut e, &prompt[..6 * BLOCK + 1], 1);
    assert_eq!(c, 5 * BLOCK);
    drop(s);
    e.disk.store.as_ref().unwrap().flush();
    assert!(block_files(&small).len() <= 5);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&small);
}

/// Hybrid models (linear attention): the state snapshots go to disk beside
/// the blocks, and a restarted scheduler resumes from the deepest boundary
/// both reach, equal to the cold run bit for bit.
#[test]
fn hybrid_state_snapshots_survive_a_restart() {
    for name in ["qwen3_next", "qwen3_5"] {
        let dir_name = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny").join(name);
        let mut e = common::serving::fixture_engine(name, 64);
        e.disk.model_path = Some(dir_name);
        let mut cold = common::serving::fixture_engine(name, 64);
        let dir = tmp(&format!("hybrid-{name}"));
        let tokens = |n: u32, seed: u32| -> Vec<u32> {
            (0..n).map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed * 40_503) >> 7) % 1000 + 3).collect()
        };
        let turn1 = tokens(300, 1);
        let cfg = SchedulerConfig { step_tokens: 100, ..config(48) };
        let mut s = Scheduler::new(&mut e, cfg.clone()).unwrap();
        s.enable_disk(&mut e, KvDiskConfig { dir: dir.clone(), max_bytes: 1 << 30 }).unwrap();
        let (first, _) = run(&mut s, &mut e, &turn1, 6);
        drop(s);
        // The restart: a fresh pool and fresh state slots.
        let mut turn2 = turn1.clone();
        turn2.extend(&first.tokens);
        turn2.extend(tokens(40, 2));
        let mut s = Scheduler::new(&mut e, cfg).unwrap();
        s.enable_disk(&mut e, KvDiskConfig { dir: dir.clone(), max_bytes: 1 << 30 }).unwrap();
        let (warm, cached) = run(&mut s, &mut e, &turn2, 6);
        let reference = Arc::new(Mutex::new(Seen::default()));
        cold.generate_hooked(&request(turn2.clone(), 6), &mut Recorder(reference.clone()), &model::NoComm).unwrap();
        let reference = std::mem::take(&mut *reference.lock().unwrap());
        assert_eq!(warm.logits, reference.logits, "{name}: a resumed hybrid prompt must equal the cold run");
        // Turn 1 took its snapshot at its last boundary of 64 positions.
        assert_eq!(cached, (turn1.len() - 1) / 64 * 64, "{name}: cached tokens");
        assert!(s.stats().disk.unwrap().hit_tokens as usize == cached);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Two servers sharing one directory write the same names with the same
/// bytes (atomic renames), so neither breaks the other's files.
#[test]
fn two_servers_share_a_directory() {
    let Some(path) = smollm2() else { return };
    let (mut a, prompt) = engine(&path);
    let (mut b, _) = engine(&path);
    let dir = tmp("shared");
    let mut sa = scheduler(&mut a, 64, Some((&dir, 1 << 30)));
    let mut sb = scheduler(&mut b, 64, Some((&dir, 1 << 30)));
    // Interleaved: both compute and write the same prompt's blocks.
    let (ra, _) = run(&mut sa, &mut a, &prompt, 4);
    let (rb, _) = run(&mut sb, &mut b, &prompt, 4);
    assert_eq!(ra.logits, rb.logits);
    drop((sa, sb));
    // A third opening loads every block and gets the same output.
    let mut sc = scheduler(&mut a, 64, Some((&dir, 1 << 30)));
    let (rc, cached) = run(&mut sc, &mut a, &prompt, 4);
    assert!(cached >= prompt.len() - BLOCK);
    assert_eq!(rc.logits, ra.logits);
    assert_eq!(sc.stats().disk.unwrap().load_failures, 0);
    let _ = std::fs::remove_dir_all(&dir);
}
