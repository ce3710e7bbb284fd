//! HTTP plumbing shared by the APIs: the JSON body extractor whose errors name
//! the field, API-key auth, and SSE responses fed by a task that stops (and so
//! cancels the generation) when the client goes away.

use crate::chat::{Delta, Generation};
use crate::error::{json_error, ApiError, Dialect};
use crate::state::SharedState;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use std::convert::Infallible;
use std::future::Future;
use subtle::ConstantTimeEq;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// Anthropic routes answer errors in Anthropic's shape.
pub fn dialect_of(path: &str) -> Dialect {
    if path.starts_with("/v1/messages") {
        Dialect::Anthropic
    } else {
        Dialect::OpenAi
    }
}

/// `Json` whose rejections are 400s in the route's dialect, naming the field.
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let dialect = dialect_of(req.uri().path());
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                return too_large(dialect);
            }
            ApiError::bad_request(None, format!("cannot read the request body: {e}")).in_dialect(dialect)
        })?;
        let de = &mut serde_json::Deserializer::from_slice(&bytes);
        let v = serde_path_to_error::deserialize(de).map_err(|e| json_error(e).in_dialect(dialect))?;
        Ok(ApiJson(v))
    }
}

fn too_large(dialect: Dialect) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "the request body is larger than the server's limit (--max-body-bytes)",
    )
    .in_dialect(dialect)
}

/// A request whose `Content-Length` exceeds `--max-body-bytes` gets 413 at
/// once, before any of its body is read (a client that declares 64 MiB and
/// sends nothing must not hold a connection until the timeout).
pub async fn declared_body_limit(State(state): State<SharedState>, req: Request, next: Next) -> Response {
    let declared = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > state.cfg.body_limit as u64) {
        return too_large(dialect_of(req.uri().path())).into_response();
    }
    next.run(req).await
}

/// `--request-timeout` bounds a request until its response starts (all of a
/// non-streamed one): past it, a 504 in the route's API format says so (a
/// stream, once started, is bounded by its stall timeout instead).
pub async fn deadline(State(state): State<SharedState>, req: Request, next: Next) -> Response {
    let (limit, dialect) = (state.cfg.request_timeout, dialect_of(req.uri().path()));
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(response) => response,
        Err(_) => ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "the request did not finish within {} s (--request-timeout) and was cancelled",
                limit.as_secs_f64()
            ),
        )
        .in_dialect(dialect)
        .into_response(),
    }
}

/// With `--api-key`, requires `Authorization: Bearer KEY` or `x-api-key: KEY`
/// (compared in constant time). `/health`, `/metrics` and the page's files stay open.
pub async fn auth(State(state): State<SharedState>, req: Request, next: Next) -> Response {
    let Some(key) = &state.cfg.api_key else { return next.run(req).await };
    let path = req.uri().path();
    if path == "/health" || path == "/metrics" || crate::web::is_page_path(path) {
        return next.run(req).await;
    }
    let headers = req.headers();
    let bearer = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")));
    let x_api_key = headers.get("x-api-key").and_then(|v| v.to_str().ok());
    let ok = [bearer, x_api_key]
        .into_iter()
        .flatten()
        .any(|given| bool::from(given.trim().as_bytes().ct_eq(key.as_bytes())));
    if ok {
        return next.run(req).await;
    }
    ApiError::new(StatusCode::UNAUTHORIZED, "missing or invalid API key (Authorization: Bearer or x-api-key)")
        .in_dialect(dialect_of(path))
        .into_response()
}

/// Sends SSE events for one response. `send` returns false once the client is gone.
pub struct SseSink {
    tx: mpsc::Sender<Result<Event, Infallible>>,
}

impl SseSink {
    pub async fn send(&self, e: Event) -> bool {
        self.tx.send(Ok(e)).await.is_ok()
    }

    /// `data: <json>` with no event name (OpenAI).
    pub async fn data(&self, v: &serde_json::Value) -> bool {
        self.send(Event::default().data(v.to_string())).await
    }

    /// `event: <name>` + `data: <json>` (Anthropic, Responses).
    pub async fn event(&self, name: &str, v: &serde_json::Value) -> bool {
        self.send(Event::default().event(name).data(v.to_string())).await
    }

    /// The next delta, or `None` when the client disconnected (dropping the
    /// generation then cancels it in the engine).
    pub async fn next(&self, g: &mut Generation) -> Option<Delta> {
        tokio::select! {
            d = g.next() => d,
            _ = self.tx.closed() => None,
        }
    }
}

/// An SSE response whose events `body` writes from its own task; keep-alive
/// comments go out while it is silent (long prefills).
pub fn sse<F, Fut>(state: &SharedState, body: F) -> Response
where
    F: FnOnce(SseSink) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(body(SseSink { tx }));
    Sse::new(ReceiverStream::new(rx))
        .keep_alive(KeepAlive::new().interval(state.cfg.sse_keepalive).text("keep-alive"))
        .into_response()
}
