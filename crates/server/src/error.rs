//! Errors as clients expect them: OpenAI's `{"error": {"message", "type", "param",
//! "code"}}` or Anthropic's `{"type": "error", "error": {"type", "message"}}`,
//! chosen by the route that failed. Every 4xx names the offending field when
//! there is one.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Which wire shape an error takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    OpenAi,
    Anthropic,
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// The request field at fault (`max_tokens`, `messages[2].content`, ...).
    pub param: Option<String>,
    pub dialect: Dialect,
}

impl ApiError {
    pub fn bad_request(param: Option<&str>, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: param.map(str::to_string),
            dialect: Dialect::OpenAi,
        }
    }

    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into(), param: None, dialect: Dialect::OpenAi }
    }

    pub fn in_dialect(mut self, dialect: Dialect) -> ApiError {
        self.dialect = dialect;
        self
    }

    /// OpenAI's `type` for this status.
    fn openai_type(&self) -> &'static str {
        match self.status.as_u16() {
            400 | 404 | 413 | 422 => "invalid_request_error",
            401 | 403 => "authentication_error",
            429 => "rate_limit_error",
            503 => "server_overloaded",
            _ => "server_error",
        }
    }

    /// Anthropic's `error.type` for this status.
    fn anthropic_type(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 | 529 => "overloaded_error",
            s if s < 500 => "invalid_request_error",
            _ => "api_error",
        }
    }

    /// The JSON body (also used for errors inside an SSE stream).
    pub fn body(&self) -> serde_json::Value {
        match self.dialect {
            Dialect::OpenAi => json!({"error": {
                "message": self.message,
                "type": self.openai_type(),
                "param": self.param,
                "code": self.status.as_u16().to_string(),
            }}),
            Dialect::Anthropic => {
                let message = match &self.param {
                    Some(p) if !self.message.contains(p.as_str()) => format!("{p}: {}", self.message),
                    _ => self.message.clone(),
                };
                json!({"type": "error", "error": {"type": self.anthropic_type(), "message": message}})
            }
        }
    }
}

/// Seconds a 429 asks the client to wait. Both SDKs honour `Retry-After` in
/// their retry loop; a second is about one short request on a busy server.
pub const RETRY_AFTER_SECS: u64 = 1;
/// Seconds a 503 asks the client to wait: about what re-forming a cluster
/// takes once its lost rank is back.
pub const UNAVAILABLE_RETRY_AFTER_SECS: u64 = 5;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        // Every 429 leaves here, so each carries the header whatever raised it.
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            response.headers_mut().insert(axum::http::header::RETRY_AFTER, RETRY_AFTER_SECS.into());
        }
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(axum::http::header::RETRY_AFTER, UNAVAILABLE_RETRY_AFTER_SECS.into());
        }
        response
    }
}

/// Maps a JSON decoding failure to a 400 naming the field (`serde_path_to_error`
/// gives the path; serde's message gives the expected type).
pub fn json_error(e: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let path = e.path().to_string();
    let inner = e.into_inner();
    if inner.is_syntax() || inner.is_eof() {
        return ApiError::bad_request(None, format!("invalid JSON in the request body: {inner}"));
    }
    let param = if path == "." { None } else { Some(path.as_str()) };
    let msg = match param {
        Some(p) => format!("invalid value for '{p}': {inner}"),
        None => format!("invalid request body: {inner}"),
    };
    ApiError::bad_request(param, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct Req {
        max_tokens: Option<i64>,
    }

    fn decode(s: &str) -> Result<Req, ApiError> {
        let de = &mut serde_json::Deserializer::from_str(s);
        serde_path_to_error::deserialize(de).map_err(json_error)
    }

    #[test]
    fn wrong_type_names_the_field() {
        let e = decode(r#"{"max_tokens": "ten"}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        assert!(e.message.contains("max_tokens"), "{}", e.message);
    }

    #[test]
    fn too_many_requests_carries_retry_after() {
        for dialect in [Dialect::OpenAi, Dialect::Anthropic] {
            let r = ApiError::new(StatusCode::TOO_MANY_REQUESTS, "busy").in_dialect(dialect).into_response();
            assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
            assert_eq!(r.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("1"));
        }
        let r = ApiError::bad_request(None, "no").into_response();
        assert!(r.headers().get("retry-after").is_none());
    }

    #[test]
    fn syntax_error_is_invalid_json() {
        let e = decode(r#"{"max_tokens": "#).unwrap_err();
        assert!(e.message.starts_with("invalid JSON"), "{}", e.message);
        let anth = e.in_dialect(Dialect::Anthropic).body();
        assert_eq!(anth["type"], "error");
        assert_eq!(anth["error"]["type"], "invalid_request_error");
    }
}
