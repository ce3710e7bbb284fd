//! shardlm-server: the HTTP front of the engine. OpenAI (`/v1/chat/completions`,
//! `/v1/completions`, `/v1/responses`, `/v1/models`), Anthropic (`/v1/messages`,
//! `/v1/messages/count_tokens`), `/health` and `/metrics`.
//!
//! Shape of a request: handler → wire types → `chat::ChatRequest` (one
//! normalized form) → `prompt` (template, tools, guide) → `worker::EngineHandle::submit`
//! → the engine thread → `worker::Event`s → `chat::Generation` (tool-call
//! parsing into `Delta`s) → the handler's wire format (JSON or SSE).
//!
//! The engine thread runs `engine::serving::Scheduler`: continuous batching
//! over a paged KV pool, with a pipeline's micro-batches in flight.

mod anthropic;
pub mod chat;
mod cluster;
mod cluster_power;
pub mod error;
pub mod guide;
mod guide_schema;
mod http;
pub mod lazy_guide;
pub mod metrics;
mod openai;
mod prompt;
mod reasoning;
mod responses;
mod server;
pub mod state;
pub mod toolfmt;
pub mod tools;
mod web;
pub mod worker;

pub use guide_schema::{Schema, SchemaError};
pub use server::{router, serve, ServerError};
pub use state::ServerConfig;
pub use worker::Reform;
