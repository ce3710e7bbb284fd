//! shardlm-engine: tokenizer, chat template, sampler and the generation loop.

pub mod chat_template;
pub mod dist;
pub mod dist_batch;
mod dist_disk;
pub mod draft;
pub mod error;
pub mod generate;
pub mod kv_disk;
pub mod power;
pub mod rank_info;
pub mod sampler;
pub mod serving;
pub mod tokenizer;

pub use chat_template::ChatTemplate;
pub use error::EngineError;
/// Thread pinning (the server unpins its HTTP threads with it).
pub use kernels::affinity;
pub use tokenizer::{StreamDecoder, Tokenizer};
