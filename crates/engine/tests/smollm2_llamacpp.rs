//! SmolLM2-135M Q4_1 against llama.cpp (tests/data/smollm2, made by
//! scripts/refs/make_llamacpp_refs.py) and against our own float64 reference
//! (scripts/refs/f64_reference.py), teacher-forced on llama.cpp's greedy output.
//!
//! Our numeric choice matches llama.cpp's: activations are quantized to 8 bits
//! (Q8_1 for Q4_1 weights, Q8_0 for the Q8_0 output layer).

mod common;
use common::smollm2;
use model::{LoadOptions, LogitsMode, Model, NoComm, SeqKv, SeqStep, ShardSpec, Workspace};
use serde_json::Value;
use shardlm_engine::generate::{Engine, GenerateRequest};
use std::path::PathBuf;

fn data(name: &str) -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/smollm2").join(name);
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn argmax(x: &[f32]) -> usize {
    let mut b = 0;
    for i in 0..x.len() {
        if x[i] > x[b] {
            b = i;
        }
    }
    b
}

/// Teacher-forced logits of every position of `tokens`.
fn all_logits(m: &Model, tokens: &[u32]) -> Vec<f32> {
    let pool = kernels::ThreadPool::new(2);
    let mut ws = Workspace::default();
    let mut cache = m.new_cache(tokens.len());
    let mut logits = Vec::new();
    let mut steps =
        [SeqStep { tokens, cache: SeqKv::Own(&mut cache), mode: LogitsMode::All, prompt: false, logits: &mut logits }];
    m.forward(&pool, &mut ws, &mut steps, &NoComm).unwrap();
    logits
}

#[test]
fn teacher_forced_against_llamacpp_and_f64() {
    let Some(path) = smollm2() else { return };
    let files = formats::open_model(&path).unwrap();
    let m = Model::load(&files, &ShardSpec::full(files.config.n_layers), &LoadOptions::default()).unwrap();
    let vocab = m.config.vocab_size;
    let refs = data("llamacpp_refs.json");
    let f64refs = data("f64_refs.json");
    let (mut confident, mut worst_top1, mut sq_f64, mut n_f64, mut worst_f64) = (0, 0f32, 0f64, 0, 0f32);
    for (case, fcase) in refs["cases"].as_array().unwrap().iter().zip(f64refs["cases"].as_array().unwrap()) {
        let name = case["name"].as_str().unwrap();
        let prompt = ids(&case["prompt_ids"]);
        let output = ids(&case["output_ids"]);
        let tokens: Vec<u32> = prompt.iter().chain(&output).copied().collect();
        let logits = all_logits(&m, &tokens);
        for (k, top2) in case["top2"].as_array().unwrap().iter().enumerate() {
            let pos = prompt.len() - 1 + k;
            let row = &logits[pos * vocab..(pos + 1) * vocab];
            let ours = argmax(row);
            let (l_id, l_logit, l_logit2) = (
                top2[0].as_u64().unwrap() as usize,
                top2[1].as_f64().unwrap() as f32,
                top2[3].as_f64().unwrap() as f32,
            );
            if l_logit - l_logit2 >= 1.0 {
                confident += 1;
                assert_eq!(ours, l_id, "{name} step {k}: llama.cpp is confident (gap {})", l_logit - l_logit2);
            }
            let d = (row[ours] - l_logit).abs();
            worst_top1 = worst_top1.max(d);
            assert!(d <= 1.5, "{name} step {k}: top-1 logit {} vs llama.cpp {l_logit}", row[ours]);
        }
        // Float64 reference: compare our logit of f64's top-1 token at every step.
        for (k, step) in fcase["steps"].as_array().unwrap().iter().enumerate() {
            let pos = prompt.len() - 1 + k;
            if pos >= tokens.len() {
                break;
            }
            let (fid, flogit) = (step[0][0].as_u64().unwrap() as usize, step[0][1].as_f64().unwrap() as f32);
            let d = logits[pos * vocab + fid] - flogit;
            sq_f64 += (d as f64).powi(2);
            n_f64 += 1;
            worst_f64 = worst_f64.max(d.abs());
        }
    }
    let rms_f64 = (sq_f64 / n_f64 as f64).sqrt();
    eprintln!(
        "checked {confident} confident positions; worst top-1 |Δ| vs llama.cpp {worst_top1:.3}; vs f64: rms {rms_f64:.3}, max {worst_f64:.3}"
    );
    assert!(confident > 250);
    // llama.cpp itself sits at rms 0.26 / max 1.14 from the f64 reference (8-bit
    // activations); ours must be of the same order.
    assert!(rms_f64 < 0.5 && worst_f64 < 2.0, "f64 reference: rms {rms_f64}, max {worst_f64}");
}

#[test]
fn free_running_greedy_matches_for_32_tokens() {
    let Some(path) = smollm2() else { return };
    let files = formats::open_model(&path).unwrap();
    let m = Model::load(&files, &ShardSpec::full(files.config.n_layers), &LoadOptions::default()).unwrap();
    let tok = shardlm_engine::Tokenizer::from_source(&files.tokenizer).unwrap();
    let mut engine = Engine::new(m, tok, 2);
    let refs = data("llamacpp_refs.json");
    let mut full = 0;
    let cases = refs["cases"].as_array().unwrap();
    for case in cases {
        let req = GenerateRequest {
            prompt_ids: ids(&case["prompt_ids"]),
            max_tokens: 32,
            sampling: Default::default(),
            stop_strings: vec![],
            ignore_eos: true,
            want_prompt_logits: false,
            draft: Default::default(),
        };
        let out = engine.generate(&req, &mut |_| {}).unwrap();
        let want = &ids(&case["output_ids"])[..32];
        let agree = out.output_ids.iter().zip(want).take_while(|(a, b)| a == b).count();
        eprintln!("{}: {agree}/32 tokens agree with llama.cpp", case["name"].as_str().unwrap());
        if agree == 32 {
            full += 1;
        }
        if case["name"] == "capital_france" {
            assert!(out.text.starts_with(" Paris"), "got {:?}", out.text);
        }
    }
    eprintln!("{full}/{} cases match llama.cpp for all 32 tokens", cases.len());
    // Reported, not a pass mark: near-ties (gap < 0.05) flip under any change of
    // summation order, llama.cpp's own batch vs incremental decode included.
    assert!(full >= 2, "only {full} cases match fully");
}

/// The packed weight layout (the default) and the file layout give bit-identical
/// logits where the packed kernels keep the same per-block accumulation order.
/// Checks prefill (tiles, all positions) and one decode step (four-row kernels).
/// Where packed Q4_1 runs the sixteen-row kernel instead (AVX-512: its own
/// order; AVX2: the scalar reference's; the same at every batch size, where
/// the file layout's AVX2 tile sums in its lanes), the two layouts agree as two ISA
/// levels do: the same greedy choices, logits within the int8 activation
/// rounding's amplification of a last-bit change (docs/ARCHITECTURE.md).
#[test]
fn packed_layout_matches_file_layout_bit_for_bit() {
    let Some(path) = smollm2() else { return };
    let files = formats::open_model(&path).unwrap();
    let spec = ShardSpec::full(files.config.n_layers);
    let packed = Model::load(&files, &spec, &LoadOptions::default()).unwrap();
    let file = Model::load(&files, &spec, &LoadOptions { keep_file_layout: true, ..Default::default() }).unwrap();
    let tokens: Vec<u32> = (0..37u32).map(|i| (i * 7919 + 13) % 49152).collect();
    let a = all_logits(&packed, &tokens);
    let b = all_logits(&file, &tokens);
    assert_eq!(a.len(), b.len());
    let rows16 = kernels::dispatch::kernels(kernels::DType::Q4_1, kernels::isa::active(), true).rows16.is_some();
    if rows16 {
        let vocab = a.len() / tokens.len();
        let rms = (a.iter().zip(&b).map(|(x, y)| ((x - y) as f64).powi(2)).sum::<f64>() / a.len() as f64).sqrt();
        let argmax = |v: &[f32]| v.iter().enumerate().fold(0, |m, (i, &x)| if x > v[m] { i } else { m });
        // The file layout's margin of its top token over the runner-up.
        let margin = |v: &[f32]| {
            let top = argmax(v);
            v[top] - v.iter().enumerate().filter(|&(i, _)| i != top).fold(f32::MIN, |m, (_, &x)| m.max(x))
        };
        let (mut same, mut clear, mut clear_same) = (0, 0, 0);
        for (x, y) in a.chunks(vocab).zip(b.chunks(vocab)) {
            let agree = argmax(x) == argmax(y);
            same += agree as usize;
            if margin(y) > 1.0 {
                clear += 1;
                clear_same += agree as usize;
            }
        }
        eprintln!(
            "sixteen-row kernel: rms |Δ logits| {rms:.3} against the file layout, top-1 same {same}/37, \
             {clear_same}/{clear} where the file layout's top token leads by more than 1.0"
        );
        // Measured: AVX-512 (2026-12-03) rms 0.21, 34 of 37; AVX2 Q4_1 in
        // sixteen-row lanes (2026-12-07) rms 0.25, 31 of 37. Random ids give
        // flat distributions: the flips are near ties, so every position with
        // a clear leader must agree.
        assert!(rms < 0.5 && same >= 30, "packed vs file layout: rms {rms}, top-1 same {same}/37");
        assert_eq!(clear_same, clear, "a clear top token changed between the layouts");
        return;
    }
    let differ = a.iter().zip(&b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
    assert_eq!(differ, 0, "{differ} of {} logits differ between packed and file layouts", a.len());
    let decode = |m: &Model| {
        let pool = kernels::ThreadPool::new(2);
        let mut ws = Workspace::default();
        let mut cache = m.new_cache(8);
        let mut logits = Vec::new();
        for &t in &tokens[..4] {
            let mut steps = [SeqStep {
                tokens: &[t],
                cache: SeqKv::Own(&mut cache),
                mode: LogitsMode::Last,
                prompt: false,
                logits: &mut logits,
            }];
            m.forward(&pool, &mut ws, &mut steps, &NoComm).unwrap();
        }
        logits
    };
    assert_eq!(decode(&packed), decode(&file), "decode logits differ between packed and file layouts");
}
