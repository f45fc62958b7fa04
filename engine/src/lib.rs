//! # coli-engine: MoE inference over a coli block store
//!
//! [`Engine`] runs Mixtral, Qwen3-MoE, OLMoE, DeepSeek-V3 / Kimi-K2 and GLM-5 models whose
//! weights live in a
//! [`coli_store::Store`]: dense tensors are borrowed from the store's memory map, routed experts
//! are fetched on demand into a byte-bounded LRU [`cache::ExpertCache`]. Activations and the KV
//! cache are f32; all matrix products go through `coli_kernels`, whose results do not depend on
//! the thread count, so outputs are bit-identical for any `--threads`, cache size or I/O mode.
//!
//! Layout: the model spec (config.json and the tensor list) comes from `coli_format::spec`;
//! [`weights`] (the one loading API), [`layers`] (shared blocks), [`models`] (one file per
//! family), [`engine`] (the forward pass: prefill/decode/generate), [`options`] (what a caller
//! chooses), [`cache`] (the expert cache: LRU, reads in flight, counters), [`placement`]
//! (budget, pinning, prefetch gate), [`prefetch`] (router lookahead), [`usage`] (the usage
//! history file), [`sampling`], [`sequence`] (one sequence's KV cache), [`prefix_cache`] (KV states kept by prefix, in RAM and on disk), [`speculative`] (drafts, verification, the draft gate), [`text`] (tokenizer, chat template, streaming decoder),
//! [`parse_size`] (byte sizes), [`trace`] (the routing trace). See `docs/ENGINE.md`.

#![forbid(unsafe_code)]

pub mod cache;
pub mod constrain;
pub mod engine;
mod error;
pub mod expert_map;
pub mod harmony;
pub mod layers;
pub mod models;
pub mod options;
pub mod placement;
pub mod prefetch;
pub mod prefill;
pub mod prefix_cache;
pub mod sampling;
pub mod sequence;
pub mod speculative;
pub mod text;
pub mod tool_calls;
pub mod trace;
pub mod usage;
pub mod weights;
pub mod xtml;

pub use cache::{CacheStats, ExpertCache, LruCache, Residency};
pub use coli_format::spec::{Family, ModelSpec};
pub use engine::{
    BatchItem, Engine, GenerateParams, Generation, GenerationStats, Logits, StopReason,
};
pub use error::{EngineError, Result};
pub use harmony::{HarmonyParser, HarmonyTokens, Routed};
pub use options::EngineOptions;
pub use placement::Placement;
pub use sampling::{Sampler, SamplingParams};
pub use sequence::{KvState, Sequence};
/// Parses a byte size (`coli_format::size::parse_size`: bytes, K/M/G/T = KiB/MiB/..., KB/MB/GB).
///
/// # Errors
/// [`EngineError::Invalid`] with the parser's message.
pub fn parse_size(s: &str) -> Result<u64> {
    coli_format::parse_size(s).map_err(EngineError::Invalid)
}
pub use speculative::{Speculate, SpeculationParams, SpeculationStats};
pub use text::{
    builtin_chat_template, ChatMessage, ChatTemplate, StreamDecoder, TextTokenizer,
    DEEPSEEK_V32_CHAT_TEMPLATE,
};
