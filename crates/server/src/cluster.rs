//! `GET /cluster`: which rank holds what, its memory, links and power, and the
//! KV pool, prefix cache, queue and throughput, as one JSON object (the schema
//! is in docs/WEB.md). Static per-rank facts come from the ranks' startup
//! reports (`engine::rank_info`); the live numbers from `Metrics`, and power
//! from every rank's latest reading (`crate::cluster_power`).

use crate::state::SharedState;
use axum::extract::State;
use axum::Json;
use engine::rank_info::RankInfo;
use serde_json::{json, Value};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Mutex;
use std::time::Instant;

/// Generated-token counts between calls, for tokens/s.
#[derive(Default)]
pub struct RateTracker {
    last: Mutex<Option<(Instant, u64, f64)>>,
}

impl RateTracker {
    /// Tokens per second since the previous sample at least half a second ago.
    pub fn update(&self, total: u64) -> f64 {
        let mut g = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        match *g {
            None => {
                *g = Some((now, total, 0.0));
                0.0
            }
            Some((t, n, rate)) => {
                let dt = now.duration_since(t).as_secs_f64();
                if dt < 0.5 {
                    return rate;
                }
                let r = total.saturating_sub(n) as f64 / dt;
                *g = Some((now, total, r));
                r
            }
        }
    }
}

fn role_label(r: &RankInfo, stages: usize, tp: usize, strategy: &str) -> String {
    let mut parts = Vec::new();
    if stages > 1 {
        parts.push(format!("pipeline stage {} of {stages}", r.stage));
    }
    if tp > 1 {
        parts.push(format!("tensor rank {} of {tp}", r.tp_rank));
    }
    if let Some([a, b]) = r.experts {
        parts.push(format!("experts {a}..{b}"));
    }
    if parts.is_empty() {
        parts.push(if strategy == "single" { "whole model".into() } else { strategy.to_string() });
    }
    let ends: Vec<&str> =
        [(r.has_embed, "embedding"), (r.has_head, "head")].iter().filter_map(|&(h, n)| h.then_some(n)).collect();
    if !ends.is_empty() && stages > 1 {
        parts.push(format!("holds the {}", ends.join(" and ")));
    }
    parts.join(", ")
}

/// KV bytes of `blocks` full and `window` window blocks on rank `r`: the
/// windowed layers' rows live in the window group when there is one.
fn pool_bytes(r: &RankInfo, blocks: u64, window: u64, block: u64) -> u64 {
    let w = if window > 0 { r.window_kv_bytes_per_token.min(r.kv_bytes_per_token) } else { 0 };
    ((r.kv_bytes_per_token - w) * blocks + w * window) * block
}

/// The `/cluster` object for `ranks` and the live numbers in `state`.
pub fn cluster_json(state: &SharedState, ranks: &[RankInfo], tokens_per_s: f64) -> Value {
    let m = &state.metrics;
    let alive = state.engine.is_alive();
    let stages = ranks.iter().map(|r| r.stage + 1).max().unwrap_or(1);
    let tp = ranks.iter().map(|r| r.tp_rank + 1).max().unwrap_or(1);
    let strategy = state.current_strategy(ranks.len());
    let block = m.kv_block_size.load(Relaxed).max(0) as u64;
    let (total, used, cached, free) = (
        m.kv_blocks_total.load(Relaxed).max(0) as u64,
        m.kv_blocks_used.load(Relaxed).max(0) as u64,
        m.kv_blocks_cached.load(Relaxed).max(0) as u64,
        m.kv_blocks_free.load(Relaxed).max(0) as u64,
    );
    // The sliding-window layers' blocks, when the pool has a window group.
    let (w_total, w_used, w_cached) = (
        m.kv_window_blocks_total.load(Relaxed).max(0) as u64,
        m.kv_window_blocks_used.load(Relaxed).max(0) as u64,
        m.kv_window_blocks_cached.load(Relaxed).max(0) as u64,
    );
    let (rank_power, power) = crate::cluster_power::power_json(ranks, &crate::cluster_power::readings(ranks));
    let rank_rows: Vec<Value> = ranks
        .iter()
        .zip(rank_power)
        .map(|(r, power)| {
            json!({
                "rank": r.rank,
                "host": r.host,
                "pid": r.pid,
                "role": {
                    "stage": r.stage, "stages": stages, "tp_rank": r.tp_rank, "tp": tp,
                    "experts": r.experts, "has_embed": r.has_embed, "has_head": r.has_head,
                    "label": role_label(r, stages, tp, &strategy),
                },
                "layers": r.layers,
                "memory": {
                    "weights_bytes": r.weight_bytes,
                    "kv_pool_bytes": pool_bytes(r, total, w_total, block),
                    "kv_used_bytes": pool_bytes(r, used + cached, w_used + w_cached, block),
                    "rss_bytes": r.rss_bytes,
                    "total_bytes": r.mem_total_bytes,
                },
                "power": power,
                "degraded": !alive || m.lost_rank.load(Relaxed) == r.rank as i64,
                "links": r.links,
            })
        })
        .collect();
    // Each link once, as its lower rank measured it.
    let links: Vec<Value> = ranks
        .iter()
        .flat_map(|r| {
            r.links
                .iter()
                .filter(move |l| l.peer > r.rank)
                .map(move |l| json!({"from": r.rank, "to": l.peer, "transport": l.transport, "cables": l.cables}))
        })
        .collect();
    let (queries, hits) = (m.prefix_queries.load(Relaxed), m.prefix_hits.load(Relaxed));
    json!({
        "model": state.cfg.served_model_name,
        "strategy": strategy,
        "world_size": ranks.len(),
        "context": state.cfg.context,
        "status": if alive && m.degraded().is_none() { "ready" } else { "degraded" },
        "degraded_reason": m.degraded(),
        "ranks": rank_rows,
        "links": links,
        "kv_pool": {
            "block_tokens": block, "blocks_total": total, "blocks_used": used,
            "blocks_cached": cached, "blocks_free": free,
        },
        "prefix_cache": {
            "enabled": state.cfg.prefix_cache, "queries": queries, "hits": hits,
            "hit_rate": if queries > 0 { Some(hits as f64 / queries as f64) } else { None },
            "cached_tokens": m.prefix_cached_tokens.load(Relaxed),
        },
        "queue": {
            "waiting": m.queue_depth.load(Relaxed).max(0), "active": m.active.load(Relaxed).max(0),
            "batch_size": m.batch_size.load(Relaxed).max(0),
        },
        "power": power,
        "throughput": {
            "tokens_per_s": tokens_per_s,
            "generated_tokens_total": m.generated_tokens.load(Relaxed),
            "prompt_tokens_total": m.prompt_tokens.load(Relaxed),
        },
    })
}

pub async fn cluster(State(state): State<SharedState>) -> Json<Value> {
    let rate = state.rate.update(state.metrics.generated_tokens.load(Relaxed));
    Json(cluster_json(&state, &state.current_ranks(), rate))
}
