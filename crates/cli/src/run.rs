//! `shardlm run`: one prompt in, text out (streamed, or one JSON object).

use anyhow::{bail, Context, Result};
use clap::Args;
use engine::generate::{Engine, GenerateRequest};
use engine::sampler::SamplingParams;
use engine::ChatTemplate;
use std::io::Write;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Prompt text (or use --prompt / --prompt-ids).
    prompt_pos: Option<String>,
    /// GGUF file, HF directory, or alias (default: smollm2-135m).
    #[arg(long)]
    model: Option<String>,
    /// Prompt text, as a flag (instead of the positional PROMPT).
    #[arg(long, conflicts_with = "prompt_pos")]
    prompt: Option<String>,
    /// Comma-separated token ids (for models without a tokenizer).
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["prompt_pos", "prompt"])]
    prompt_ids: Option<Vec<u32>>,
    /// Wrap the prompt in the model's chat template as a user message.
    #[arg(long)]
    chat: bool,
    /// System message (with --chat).
    #[arg(long)]
    system: Option<String>,
    /// Most tokens to generate (fewer when the context fills up or a stop hits).
    #[arg(long, default_value_t = 256)]
    max_tokens: usize,
    /// Sampling temperature; 0 is greedy (always the most likely token).
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Sample among the K most likely tokens only; 0 turns it off.
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Nucleus sampling: the smallest set of tokens whose probability reaches P; 1 turns it off.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Drop tokens less likely than P times the most likely one; 0 turns it off.
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    /// Penalty on tokens already in the prompt or output (above 1 discourages repeats); 1 turns it off.
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f32,
    /// Random seed for sampling (the same seed gives the same output).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Stop when the output contains this text (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Don't stop at end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Worker threads (default: all cores).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1024))]
    threads: Option<u64>,
    /// Prompt tokens per prefill step.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..))]
    prefill_chunk: u64,
    /// Re-encode float weights at load: q8_0 or q4_0.
    #[arg(long, value_parser = parse_quantize)]
    quantize: Option<kernels::DType>,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    json: bool,
    /// Write the logits of every prompt position to this safetensors file.
    #[arg(long)]
    dump_logits: Option<PathBuf>,
    #[command(flatten)]
    draft: crate::draft_args::DraftArgs,
    #[command(flatten)]
    template: crate::template_args::TemplateArgs,
    #[command(flatten)]
    dist: crate::dist_args::DistArgs,
}

fn parse_quantize(s: &str) -> Result<kernels::DType, String> {
    match kernels::DType::parse(s) {
        Some(d @ (kernels::DType::Q8_0 | kernels::DType::Q4_0)) => Ok(d),
        _ => Err(format!("'{s}' is not a load-time quantization (use q8_0 or q4_0)")),
    }
}

pub fn default_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

pub fn run(a: RunArgs) -> Result<()> {
    let sampling = SamplingParams {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        repetition_penalty: a.repetition_penalty,
        seed: a.seed,
    };
    sampling.validate().map_err(|e| anyhow::anyhow!("bad flag value: {e}"))?;
    a.draft.params()?;
    let template = a.template.read()?;
    let threads = a.threads.map_or_else(default_threads, |t| t as usize);
    let Some((mut engine, mut files, model_name)) = crate::dist_args::load_engine_dist(
        a.model.as_deref(),
        threads,
        a.threads.is_some(),
        a.quantize,
        (&a.dist, &a.draft),
    )?
    else {
        return Ok(()); // a rank other than 0 served its part
    };
    if template.is_some() {
        files.chat_template = template;
    }
    let result = run_on(&a, &mut engine, &files, &model_name, sampling, threads);
    let stopped = engine.shutdown();
    result?;
    stopped?;
    Ok(())
}

fn run_on(
    a: &RunArgs,
    engine: &mut Engine,
    files: &formats::ModelFiles,
    model_name: &str,
    sampling: SamplingParams,
    threads: usize,
) -> Result<()> {
    engine.prefill_chunk = a.prefill_chunk as usize;
    // Before the prompt is read: a draft model that cannot draft is refused at once.
    let drafter = a.draft.drafter(engine, threads, 1)?;

    let prompt_ids = match (&a.prompt_ids, a.prompt.as_ref().or(a.prompt_pos.as_ref())) {
        (Some(ids), _) => {
            if a.chat {
                bail!("--chat needs a text prompt, not --prompt-ids");
            }
            ids.clone()
        }
        (None, Some(text)) => {
            let tok = engine.tokenizer.as_ref().context("this model has no tokenizer: pass --prompt-ids")?;
            if a.chat {
                let src = files.chat_template.as_deref().context("this model has no chat template (drop --chat)")?;
                let tpl = ChatTemplate::new(src, files.bos_token.as_deref(), files.eos_token.as_deref())?;
                let mut msgs = Vec::new();
                if let Some(s) = &a.system {
                    msgs.push(serde_json::json!({"role": "system", "content": s}));
                }
                msgs.push(serde_json::json!({"role": "user", "content": text}));
                let rendered = tpl.render(&serde_json::Value::Array(msgs), None, true, None)?;
                let has_bos = files.bos_token.as_deref().is_some_and(|b| !b.is_empty() && rendered.starts_with(b));
                tok.encode(&rendered, !has_bos)?
            } else {
                tok.encode(text, true)?
            }
        }
        (None, None) => bail!("no prompt: give PROMPT, --prompt TEXT or --prompt-ids 1,2,3"),
    };
    if prompt_ids.is_empty() {
        bail!("the prompt is empty after tokenization");
    }
    let ctx = engine.context_length();
    if prompt_ids.len() >= ctx {
        bail!("prompt of {} tokens exceeds the context length {ctx}", prompt_ids.len());
    }
    let max_tokens = a.max_tokens.min(ctx - prompt_ids.len());
    let req = GenerateRequest {
        prompt_ids: prompt_ids.clone(),
        max_tokens,
        sampling,
        stop_strings: a.stop.clone(),
        ignore_eos: a.ignore_eos,
        want_prompt_logits: a.dump_logits.is_some(),
        draft: a.draft.choice()?,
    };
    // Through the batching scheduler, as `serve` runs a request: one engine.
    let solo = engine::serving::solo::solo_config(
        engine,
        prompt_ids.len() + max_tokens,
        crate::serve::KV_BLOCK,
        engine.prefill_chunk,
    );
    let mut sched = engine::serving::Scheduler::new(engine, solo).context("allocating the KV pool")?;
    sched.set_draft(a.draft.params()?)?;
    sched.set_model_draft(drafter);
    let hooks = RunHooks { stream: !a.json, text: String::new(), token_times: Vec::new() };
    let t0 = std::time::Instant::now();
    let (done, hooks) = engine::serving::solo::run_request(&mut sched, engine, req, hooks)?;
    let out = RunOutcome::new(done, hooks, t0, prompt_ids.len());
    if let (Some(path), Some(logits)) = (&a.dump_logits, &out.prompt_logits) {
        write_logits(path, logits, prompt_ids.len(), engine.model.config.vocab_size)?;
    }
    let parsed = a.template.tool_format.map(|f| parse_output(f, &out.text));
    if a.json {
        let mut j = serde_json::json!({
            "model": model_name,
            "prompt_ids": prompt_ids,
            "output_ids": out.output_ids,
            "text": out.text,
            "finish_reason": out.finish_reason.as_str(),
            "ttft_ms": out.ttft_ms,
            "prefill_tok_s": out.prefill_tok_s,
            "decode_tok_s": out.decode_tok_s,
            "drafted_tokens": out.drafted,
            "accepted_tokens": out.accepted,
            "acceptance_rate": crate::draft_args::acceptance(out.drafted, out.accepted),
        });
        if let Some((text, reasoning, calls)) = parsed {
            j["content"] = text.into();
            j["reasoning"] = reasoning.into();
            j["tool_calls"] = calls.into();
        }
        println!("{j}");
    } else {
        println!();
        if let Some((_, reasoning, calls)) = &parsed {
            if !reasoning.is_empty() {
                eprintln!("[reasoning: {reasoning}]");
            }
            for c in calls {
                eprintln!("[tool call {} {}]", c["name"], c["arguments"]);
            }
        }
        eprintln!(
            "[{} prompt tokens, {} generated, ttft {:.1} ms, prefill {:.1} tok/s, decode {:.1} tok/s, finish: {}]",
            prompt_ids.len(),
            out.output_ids.len(),
            out.ttft_ms,
            out.prefill_tok_s,
            out.decode_tok_s,
            out.finish_reason.as_str()
        );
        if out.drafted > 0 {
            eprintln!(
                "[speculative: {} of {} draft tokens accepted ({:.0}%)]",
                out.accepted,
                out.drafted,
                100.0 * crate::draft_args::acceptance(out.drafted, out.accepted)
            );
        }
    }
    Ok(())
}

/// The output read with `--tool-format`'s parser: (text, reasoning, calls as
/// `{"name", "arguments"}`); a call that does not parse stays text.
fn parse_output(format: server::tools::ToolFormat, text: &str) -> (String, String, Vec<serde_json::Value>) {
    use server::toolfmt::{Piece, Tools};
    let mut s = server::tools::ToolSplitter::new(format, Tools::any(), "");
    let mut pieces = Vec::new();
    s.push(text, &mut pieces);
    s.finish(&mut pieces);
    let (mut content, mut reasoning, mut calls) = (String::new(), String::new(), Vec::new());
    let mut args = String::new();
    for p in pieces {
        match p {
            Piece::Text(t) => content.push_str(&t),
            Piece::Reasoning(r) => reasoning.push_str(&r),
            Piece::CallStart { name } => {
                calls.push(serde_json::json!({"name": name}));
                args.clear();
            }
            Piece::CallArgs(a) => args.push_str(&a),
            Piece::CallEnd { valid: true, .. } => {
                if let Some(c) = calls.last_mut() {
                    c["arguments"] = serde_json::from_str(&args).unwrap_or_default();
                }
            }
            Piece::CallEnd { valid: false, raw } => {
                calls.pop();
                content.push_str(&raw);
            }
        }
    }
    (content, reasoning, calls)
}

/// Writes `logits` (`rows × vocab`, f32) as the single tensor `logits` of a safetensors file.
pub fn write_logits(path: &PathBuf, logits: &[f32], rows: usize, vocab: usize) -> Result<()> {
    let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
    let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![rows, vocab], &bytes)?;
    let data = safetensors::serialize([("logits", view)], None)?;
    std::fs::write(path, data).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// `run`'s hooks: streams the text to stdout (unless `--json`), keeps it, and
/// times the tokens.
struct RunHooks {
    stream: bool,
    text: String,
    token_times: Vec<std::time::Instant>,
}

impl engine::generate::GenerateHooks for RunHooks {
    fn on_token(&mut self, _id: u32) -> bool {
        self.token_times.push(std::time::Instant::now());
        true
    }

    fn on_text(&mut self, t: &str) {
        if self.stream {
            let mut stdout = std::io::stdout();
            let _ = stdout.write_all(t.as_bytes());
            let _ = stdout.flush();
        }
        self.text.push_str(t);
    }
}

/// What `run` prints about a finished request.
struct RunOutcome {
    output_ids: Vec<u32>,
    text: String,
    finish_reason: engine::generate::FinishReason,
    prompt_logits: Option<Vec<f32>>,
    ttft_ms: f64,
    prefill_tok_s: f64,
    decode_tok_s: f64,
    drafted: usize,
    accepted: usize,
}

impl RunOutcome {
    fn new(
        done: engine::serving::SeqOutcome,
        hooks: RunHooks,
        t0: std::time::Instant,
        prompt_len: usize,
    ) -> RunOutcome {
        let times = &hooks.token_times;
        let ttft_s = times.first().map_or_else(|| t0.elapsed().as_secs_f64(), |t| t.duration_since(t0).as_secs_f64());
        let decode_s = match (times.first(), times.last()) {
            (Some(a), Some(b)) if times.len() > 1 => b.duration_since(*a).as_secs_f64(),
            _ => 0.0,
        };
        RunOutcome {
            drafted: done.drafted,
            accepted: done.accepted,
            output_ids: done.output_ids,
            text: hooks.text,
            finish_reason: done.finish_reason,
            prompt_logits: done.prompt_logits,
            ttft_ms: ttft_s * 1e3,
            prefill_tok_s: prompt_len as f64 / ttft_s.max(1e-9),
            decode_tok_s: if decode_s > 0.0 { (times.len() - 1) as f64 / decode_s } else { 0.0 },
        }
    }
}
