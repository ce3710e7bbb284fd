//! What every handler shares: the configuration, tokenizer, chat template, the
//! engine's queue and the metrics.

use crate::guide::Vocab;
use crate::metrics::Metrics;
use crate::tools::ToolFormat;
use crate::worker::EngineHandle;
use engine::{ChatTemplate, Tokenizer};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub host: String,
    pub port: u16,
    pub api_key: Option<String>,
    /// The one model name `/v1/models` lists and responses carry.
    pub served_model_name: String,
    /// `max_tokens` when a request gives none (else the room left in the context).
    pub max_tokens_default: Option<usize>,
    /// Requests admitted at once (queued or running); more get 429.
    pub max_concurrency: usize,
    /// Context length in tokens (prompt plus output).
    pub context: usize,
    pub body_limit: usize,
    pub request_timeout: Duration,
    /// How long the cluster may stay degraded before new requests are refused
    /// (503 with `Retry-After`) instead of queued.
    pub degraded_wait: Duration,
    /// Interval of SSE keep-alive comments while nothing else is sent.
    pub sse_keepalive: Duration,
    /// Ranks in the world at startup (1 = single process); `/health` and
    /// `/cluster` show the current world ([`AppState::current_ranks`]).
    pub ranks: usize,
    /// How the model is split at startup (`/health`; see [`AppState::current_strategy`]).
    pub strategy: String,
    /// Keep finished prompts' KV blocks for reuse by later requests that share
    /// their prefix (`--prefix-cache on|off`).
    pub prefix_cache: bool,
    /// KV cache pool budget in bytes (`--kv-cache-bytes`); `None` = the engine's default.
    pub kv_cache_bytes: Option<u64>,
    /// `--tool-format`: the call syntax to parse; `None` = detected from the template.
    pub tool_format: Option<ToolFormat>,
    /// The prefix cache's disk tier (`--kv-disk`), when on.
    pub kv_disk: Option<engine::kv_disk::KvDiskConfig>,
    /// Speculative decoding for requests that do not choose (`--draft`).
    pub draft: Option<engine::draft::DraftParams>,
}

pub struct AppState {
    pub cfg: ServerConfig,
    pub tokenizer: Tokenizer,
    pub template: Option<ChatTemplate>,
    pub tool_format: ToolFormat,
    /// The template writes `<think>` reasoning.
    pub reasoning: bool,
    pub vocab: Arc<Vocab>,
    pub engine: EngineHandle,
    pub metrics: Arc<Metrics>,
    /// The template's BOS text, when it writes one itself.
    pub bos_token: Option<String>,
    /// Unix time the server started (`created` of the model).
    pub started: u64,
    /// Every rank's startup report, rank 0 first (`GET /cluster`), when the
    /// CLI gathered none (see [`AppState::current_ranks`]).
    pub ranks: Vec<engine::rank_info::RankInfo>,
    /// Tokens/s between `/cluster` calls.
    pub rate: crate::cluster::RateTracker,
}

pub type SharedState = Arc<AppState>;

impl AppState {
    /// Every rank of the world as it is now, rank 0 first: the reports rank 0
    /// gathered last (again after each re-forming of the cluster, which may
    /// have re-planned onto fewer ranks), else those the server started with.
    pub fn current_ranks(&self) -> Vec<engine::rank_info::RankInfo> {
        engine::rank_info::gathered().unwrap_or_else(|| self.ranks.clone())
    }

    /// How the model is split in a world of `ranks`: `single` once the
    /// cluster re-planned onto rank 0 alone.
    pub fn current_strategy(&self, ranks: usize) -> String {
        if ranks <= 1 {
            "single".into()
        } else {
            self.cfg.strategy.clone()
        }
    }

    /// The vocabulary as bytes per id, for the JSON guide.
    pub fn build_vocab(tokenizer: &Tokenizer, model_vocab: usize) -> Vocab {
        let n = model_vocab.max(tokenizer.vocab_size());
        let mut bytes = Vec::with_capacity(n);
        let mut special = Vec::with_capacity(n);
        for id in 0..n as u32 {
            if (id as usize) < tokenizer.vocab_size() {
                bytes.push(tokenizer.token_bytes(id));
                special.push(tokenizer.is_special(id));
            } else {
                bytes.push(Vec::new());
                special.push(true);
            }
        }
        Vocab { bytes, special }
    }
}
