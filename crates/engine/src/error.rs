use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Format(#[from] formats::FormatError),
    #[error(transparent)]
    Model(#[from] model::ModelError),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("{path}: cannot build tokenizer: {what}")]
    TokenizerBuild { path: PathBuf, what: String },
    #[error("chat template: {0}")]
    Template(String),
    #[error("this model has no tokenizer: pass --prompt-ids")]
    NoTokenizer,
    #[error("this model has no chat template")]
    NoChatTemplate,
    #[error("prompt of {prompt} tokens plus {generate} to generate exceeds the context length {ctx}")]
    PromptTooLong { prompt: usize, generate: usize, ctx: usize },
    #[error("empty prompt")]
    EmptyPrompt,
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    TokenOutOfRange { id: u32, vocab: usize },
    #[error("{0}")]
    BadArgument(String),
    /// `--draft-model`: the file does not load or cannot draft for the target.
    #[error("draft model {path}: {why}")]
    DraftModel { path: PathBuf, why: String },
    #[error("the request was cancelled")]
    Cancelled,
}

impl EngineError {
    /// The cluster broke under the step (a rank died, hung past its timeout or
    /// spoke nonsense): the request itself was fine and can be rerun once the
    /// cluster is re-formed.
    pub fn is_cluster_failure(&self) -> bool {
        matches!(self, EngineError::Model(model::ModelError::Comm(_)))
    }
}
