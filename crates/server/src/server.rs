//! The router and `serve`: HTTP on a tokio runtime, the engine on the calling
//! thread (rank 0 of a cluster drives the other ranks from there).

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::state::{AppState, ServerConfig, SharedState};
use crate::tools::ToolFormat;
use crate::worker::{channel, run_worker};
use crate::{anthropic, cluster, http, openai, responses, web};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use engine::generate::Engine;
use engine::{ChatTemplate, Tokenizer};
use serde_json::json;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("this model has no tokenizer; the server needs one")]
    NoTokenizer,
    #[error(transparent)]
    Engine(#[from] engine::EngineError),
    #[error("the serving engine could not start: {0}")]
    EngineStart(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

pub fn router(state: SharedState) -> Router {
    let body_limit = state.cfg.body_limit;
    Router::new()
        .route("/", get(web::index))
        .route("/index.html", get(web::index))
        .route("/app.js", get(web::app_js))
        .route("/markdown.js", get(web::markdown_js))
        .route("/style.css", get(web::style_css))
        .route("/cluster", get(cluster::cluster))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(openai::models))
        .route("/v1/models/{id}", get(openai::model))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/responses", post(responses::responses))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(state.clone(), http::auth))
        .layer(axum::middleware::from_fn_with_state(state.clone(), http::declared_body_limit))
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(axum::middleware::from_fn_with_state(state.clone(), http::deadline))
        .with_state(state)
}

async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, format!("no route for {}", uri.path()))
        .in_dialect(http::dialect_of(uri.path()))
}

/// `ready` while the engine thread runs; each rank is driven in lockstep by rank 0,
/// so they share its state.
async fn health(State(state): State<SharedState>) -> (StatusCode, Json<serde_json::Value>) {
    let alive = state.engine.is_alive();
    let degraded = state.metrics.degraded();
    let ok = alive && degraded.is_none();
    let status = if ok { "ready" } else { "degraded" };
    let reason = match (&degraded, alive) {
        (Some(why), _) => Some(format!("degraded: {why}")),
        (None, false) => Some("degraded: the engine has stopped".to_string()),
        (None, true) => None,
    };
    // The current world: fewer ranks once the cluster re-planned without a lost one.
    let world = state.current_ranks().len();
    let ranks: Vec<_> = (0..world).map(|r| json!({"rank": r, "state": status})).collect();
    let code = if ok { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (
        code,
        Json(json!({
            "status": status, "reason": reason, "model": state.cfg.served_model_name, "context": state.cfg.context,
            "rank_losses": state.metrics.rank_losses.load(Relaxed),
            "cluster_reforms": state.metrics.cluster_reforms.load(Relaxed),
            "strategy": state.current_strategy(world), "ranks": ranks,
            "queue_depth": state.metrics.queue_depth.load(Relaxed), "active_requests": state.metrics.active.load(Relaxed),
        })),
    )
}

async fn metrics(State(state): State<SharedState>) -> ([(axum::http::HeaderName, &'static str); 1], String) {
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], state.metrics.render())
}

/// Serves until SIGINT/SIGTERM. Blocks the calling thread, which runs the engine.
pub fn serve(
    engine: &mut Engine,
    files: &formats::ModelFiles,
    cfg: ServerConfig,
    (sched, drafter): (engine::serving::SchedulerConfig, Option<engine::draft::ModelDraft>),
    reform: Option<crate::worker::Reform<'_>>,
) -> Result<(), ServerError> {
    let mut tokenizer = Tokenizer::from_source(&files.tokenizer)?.ok_or(ServerError::NoTokenizer)?;
    let template = match files.chat_template.as_deref() {
        Some(src) => Some(ChatTemplate::new(src, files.bos_token.as_deref(), files.eos_token.as_deref())?),
        None => None,
    };
    let tool_format = cfg.tool_format.unwrap_or_else(|| ToolFormat::detect(files.chat_template.as_deref()));
    // Call markup that is a control token must be streamed to the parser, by the
    // engine's decoder and in the guide's view of the vocabulary alike.
    for m in tool_format.printed_markers() {
        tokenizer.print_special(m);
        if let Some(t) = engine.tokenizer.as_mut() {
            t.print_special(m);
        }
    }
    let reasoning = files.chat_template.as_deref().is_some_and(|t| t.contains("<think>"));
    let vocab = Arc::new(AppState::build_vocab(&tokenizer, engine.model.config.vocab_size));
    let metrics = Arc::new(Metrics::default());
    // The pool's size before the first step stores it (`GET /cluster`, `/metrics`).
    metrics.kv_block_size.store(sched.block as i64, Relaxed);
    metrics.kv_blocks_total.store(sched.n_blocks as i64, Relaxed);
    metrics.kv_blocks_free.store(sched.n_blocks as i64, Relaxed);
    metrics.kv_window_blocks_total.store(sched.n_window_blocks as i64, Relaxed);
    metrics.kv_window_blocks_free.store(sched.n_window_blocks as i64, Relaxed);
    let (handle, queue) = channel(metrics.clone());
    let addr = format!("{}:{}", cfg.host, cfg.port);
    // Every rank's startup report (gathered by the CLI), or this process's own.
    let ranks = engine::rank_info::gathered()
        .unwrap_or_else(|| vec![engine::rank_info::RankInfo::here(&engine.model, engine.cluster.as_ref())]);
    // Start sampling power now, so `/cluster` has a reading at once.
    let _ = engine::power::global();
    let state_kv_disk = cfg.kv_disk.clone();
    let draft = cfg.draft;
    let state = Arc::new(AppState {
        cfg,
        tokenizer,
        template,
        tool_format,
        reasoning,
        vocab,
        engine: handle,
        metrics: metrics.clone(),
        bos_token: files.bos_token.clone(),
        started: crate::chat::unix_now(),
        ranks,
        rate: Default::default(),
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .on_thread_start(http_threads_yield_to_compute)
        .enable_all()
        .build()?;
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(&addr))
        .map_err(|source| ServerError::Bind { addr: addr.clone(), source })?;
    let local = listener.local_addr()?;
    eprintln!(
        "shardlm serve: listening on http://{local} (model {}, context {}, tools {:?})",
        state.cfg.served_model_name, state.cfg.context, state.tool_format
    );
    let app = router(state);
    let server = rt.spawn(async move { axum::serve(listener, app).with_graceful_shutdown(shutdown_signal()).await });
    // The router (and with it the queue's sender) drops when the server ends,
    // which ends the worker loop.
    let kv_disk = state_kv_disk;
    if let Err(e) = run_worker(engine, queue, &metrics, (sched, draft, drafter), kv_disk, reform) {
        // Nothing could ever answer: stop listening and say why.
        server.abort();
        rt.shutdown_timeout(std::time::Duration::from_secs(1));
        return Err(ServerError::EngineStart(e));
    }
    let result = rt.block_on(server);
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    match result {
        Ok(r) => r.map_err(ServerError::Io),
        Err(e) => Err(ServerError::Io(std::io::Error::other(e.to_string()))),
    }
}

/// The HTTP threads wake once per streamed token. On a machine whose every
/// core runs a compute thread, a woken thread of the normal class preempts
/// one in the middle of a step, and the step waits for it (one stream on 2
/// cores: steps 8.38 ms against `bench`'s 7.75). As `SCHED_BATCH` they never
/// preempt on wakeup: they run when a compute thread waits (the pool's
/// spin-wait yields) or at the next tick, so a token may leave up to a tick
/// later, and decoding keeps its pace. A failure (not Linux, not allowed)
/// leaves the default, as does `SHARDLM_HTTP_NORMAL_CLASS` (set: A/B runs).
fn http_threads_yield_to_compute() {
    // Spawned from the engine thread, which a pinned pool may have pinned.
    engine::affinity::unpin_current_thread();
    #[cfg(target_os = "linux")]
    if std::env::var_os("SHARDLM_HTTP_NORMAL_CLASS").is_some() {
        return;
    }
    #[cfg(target_os = "linux")]
    // SAFETY: sched_setscheduler on the calling thread (pid 0) with a valid
    // parameter struct; it changes nothing else.
    unsafe {
        let param = libc::sched_param { sched_priority: 0 };
        libc::sched_setscheduler(0, libc::SCHED_BATCH, &param);
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(t) => t,
            Err(_) => return ctrl_c.await.unwrap_or(()),
        };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    eprintln!("shardlm serve: shutting down");
}
