//! The engine's error type.

use coli_store::StoreError;

/// Every error the engine reports. Each variant names the tensor, file, field or limit concerned.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The store reported an error while the engine did `what`.
    #[error("{what}: {error}")]
    Store {
        /// What the engine was doing (e.g. "reading dense tensor model.norm.weight").
        what: String,
        /// The store's error (in the message, not also a `source()`).
        error: StoreError,
    },
    /// The model config (`files/config.json`) or another model file has a missing or bad field.
    #[error("{file}: {what}")]
    Config {
        /// The file (e.g. `config.json`).
        file: String,
        /// What is wrong, with the expected and found values.
        what: String,
    },
    /// The model uses a feature this engine does not implement.
    #[error("unsupported model: {0}")]
    Unsupported(String),
    /// A dense tensor the architecture needs is not in the store.
    #[error("dense tensor {name} is missing from the store ({why})")]
    MissingTensor {
        /// Tensor name as in the checkpoint.
        name: String,
        /// Why the tensor is needed.
        why: String,
    },
    /// A tensor or expert has another shape than the config implies.
    #[error("{name}: shape {found:?}, expected {expected:?} from config.json")]
    Shape {
        /// Tensor or expert name.
        name: String,
        /// Shape implied by the config.
        expected: Vec<usize>,
        /// Shape in the store.
        found: Vec<usize>,
    },
    /// A token id is not below the vocabulary size.
    #[error("token id {id} is out of range: the vocabulary has {vocab} tokens, the largest id is {}", .vocab.saturating_sub(1))]
    TokenOutOfRange {
        /// The offending id.
        id: u32,
        /// `vocab_size` of the model.
        vocab: usize,
    },
    /// The KV cache would grow past the context limit.
    #[error("context overflow: {needed} tokens needed but the context holds {context}; raise --context or shorten the prompt")]
    ContextOverflow {
        /// Tokens the request needs in the KV cache.
        needed: usize,
        /// The context limit, tokens.
        context: usize,
    },
    /// Every sequence the engine planned KV memory for is in use.
    #[error("all {max} sequences the engine planned KV memory for are in use ({kv_bytes_per_sequence} bytes of KV cache each at the context limit); finish one first or raise the batch size (--max-batch) if memory allows (see coli plan)")]
    TooManySequences {
        /// The engine's `max_sequences`.
        max: usize,
        /// KV bytes of one sequence at the context limit.
        kv_bytes_per_sequence: u64,
    },
    /// The store has no usable tokenizer (`files/tokenizer.json`).
    #[error("the store has no tokenizer.json; pass token ids (--prompt-ids) instead of text")]
    NoTokenizer,
    /// The tokenizer failed to load, encode or decode.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The store has no chat template, or rendering it failed.
    #[error("chat template: {0}")]
    Template(String),
    /// Bad argument from the caller (sizes, sampling parameters, ...).
    #[error("{0}")]
    Invalid(String),
    /// The caller's stop check ended a prefill between layer groups
    /// ([`crate::Engine::prefill_sequence`]); the sequence was rolled back.
    #[error("the prefill was stopped (client gone or server shutting down)")]
    Stopped,
    /// The thread pool could not be built.
    #[error("cannot build a thread pool of {threads} threads: {msg}")]
    ThreadPool {
        /// Requested threads.
        threads: usize,
        /// rayon's message.
        msg: String,
    },
}

/// Shorthand used throughout the crate.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;

/// Wraps a store error with what the engine was doing.
pub(crate) fn store_err(what: impl Into<String>) -> impl FnOnce(StoreError) -> EngineError {
    let what = what.into();
    move |error| EngineError::Store { what, error }
}

impl From<coli_format::FormatError> for EngineError {
    /// A model spec error (config.json) keeps its file and message.
    fn from(e: coli_format::FormatError) -> EngineError {
        use coli_format::FormatError as F;
        match e {
            F::Config { file, what } | F::Format { file, what } => {
                EngineError::Config { file, what }
            }
            F::Unsupported(what) => EngineError::Unsupported(what),
            other @ F::NewerVersion { .. } => EngineError::Config {
                file: "config.json".into(),
                what: other.to_string(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error;

    /// A store error wrapped with what the engine did is shown once: in the message, not also
    /// as `source()`.
    #[test]
    fn store_errors_are_wrapped_once() {
        let e = store_err("reading dense tensor x")(StoreError::NotFound("dense tensor x".into()));
        assert_eq!(
            e.to_string(),
            "reading dense tensor x: not in store: dense tensor x"
        );
        assert!(e.source().is_none());
    }
}
