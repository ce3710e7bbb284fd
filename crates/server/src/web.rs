//! The chat and cluster page at `/`: three files embedded in the binary
//! (crates/server/web/), no CDN, no network at run time, no build step.

use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::IntoResponse;

const INDEX_HTML: &str = include_str!("../web/index.html");
const APP_JS: &str = include_str!("../web/app.js");
const MARKDOWN_JS: &str = include_str!("../web/markdown.js");
const STYLE_CSS: &str = include_str!("../web/style.css");

fn file(kind: &'static str, body: &'static str) -> impl IntoResponse {
    ([(CONTENT_TYPE, kind), (CACHE_CONTROL, "no-cache")], body)
}

pub async fn index() -> impl IntoResponse {
    file("text/html; charset=utf-8", INDEX_HTML)
}

pub async fn app_js() -> impl IntoResponse {
    file("text/javascript; charset=utf-8", APP_JS)
}

pub async fn markdown_js() -> impl IntoResponse {
    file("text/javascript; charset=utf-8", MARKDOWN_JS)
}

pub async fn style_css() -> impl IntoResponse {
    file("text/css; charset=utf-8", STYLE_CSS)
}

/// Paths the page is made of: open without an API key (the page asks for it).
pub fn is_page_path(path: &str) -> bool {
    matches!(path, "/" | "/index.html" | "/app.js" | "/markdown.js" | "/style.css")
}
