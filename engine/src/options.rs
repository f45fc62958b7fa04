//! [`EngineOptions`]: what a caller chooses when it builds an [`crate::Engine`] (budget,
//! pinning, prefetch, usage file, context, threads, prefill batch), with their defaults and
//! their validation.

use crate::error::{EngineError, Result};
use crate::placement::{DEFAULT_PIN_SHARE, DEFAULT_PREFETCH_MIN_USE};
use std::path::PathBuf;

/// `prefill_batch` value that lets the engine choose the prefill chunk from the memory plan
/// ([`crate::placement::budget::prefill_chunk`]); the default.
pub const PREFILL_BATCH_AUTO: usize = 0;

/// Default context cap when `--context` is not given: `min(max_position_embeddings, 4096)`
/// (`ModelSpec::default_context`, which every plan shares).
pub use coli_format::spec::DEFAULT_CONTEXT_CAP;

/// Options for [`crate::Engine::new`].
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Expert cache capacity in bytes, pinned set included (None: [`crate::placement::default_ram_budget`],
    /// from the available memory; `Some(u64::MAX)`: unbounded).
    pub ram_budget: Option<u64>,
    /// Pin the hottest experts of the usage history at start (`--no-pin` turns it off).
    pub pin: bool,
    /// Share of the budget the pinned set may take, 0..=1 (`--pin-share`).
    pub pin_share: f64,
    /// When the budget holds every expert record of the store, read them all at start and pin
    /// them, so that decode never reads (`--no-preload` turns it off;
    /// [`crate::placement::Placement::preloaded`] tells whether it happened).
    pub preload: bool,
    /// Router lookahead prefetch (`--no-prefetch` turns it off).
    pub prefetch: bool,
    /// The usage-history file read at start (for pinning) and merged into as the engine runs
    /// (None: no history is read or written; the CLI passes
    /// [`crate::usage::default_usage_path`] or `--usage FILE`).
    pub usage: Option<PathBuf>,
    /// Maximum tokens in the KV cache (None: `min(max_position_embeddings, 4096)`).
    pub context: Option<usize>,
    /// Worker threads of the engine's pool (None: rayon's default, one per CPU).
    pub threads: Option<usize>,
    /// Tokens per prefill batch; [`PREFILL_BATCH_AUTO`] (0, the default): as many as the
    /// memory plan allows ([`crate::Engine::prefill_batch`] tells the choice).
    pub prefill_batch: usize,
    /// Lookahead prefetch is skipped while the share of prefetched experts that demand requests
    /// use stays below this (0..=1; 0: never skipped; see [`crate::placement::PrefetchGate`]).
    pub prefetch_min_use: f64,
    /// Sequences whose KV caches (each up to `context` tokens) may be held at once: the
    /// engine's own sequence (while it holds tokens) plus those of
    /// [`crate::Engine::new_sequence`] (>= 1). The default expert budget leaves room for all
    /// of them; the engine refuses a sequence past this count.
    pub max_sequences: usize,
    /// Bytes of KV states the caller keeps in RAM beside the engine's sequences, in a
    /// [`crate::prefix_cache::PrefixCache`] (`--kv-cache-budget`). None: one sequence's KV cache
    /// at `context` ([`crate::Engine::kv_cache_budget`] tells the choice). The default expert
    /// budget leaves room for it.
    pub kv_cache_budget: Option<u64>,
    /// Prefill a prompt of several chunks chunk by chunk through all layers (the order before
    /// the layer-major prefill; `--token-major-prefill`): the same bits, more expert reads and
    /// MLA expansions; for comparison (docs/ENGINE.md, "Long prompts").
    pub token_major_prefill: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            ram_budget: None,
            pin: true,
            pin_share: DEFAULT_PIN_SHARE,
            preload: true,
            prefetch: true,
            usage: None,
            context: None,
            threads: None,
            prefill_batch: PREFILL_BATCH_AUTO,
            prefetch_min_use: DEFAULT_PREFETCH_MIN_USE,
            max_sequences: 1,
            kv_cache_budget: Some(0),
            token_major_prefill: false,
        }
    }
}

impl EngineOptions {
    /// Checks the options that do not depend on the model: an explicit `context` and
    /// `max_sequences` at least 1, `pin_share` and `prefetch_min_use` within 0..=1.
    ///
    /// # Errors
    /// [`EngineError::Invalid`] naming the option and the value found.
    pub fn validate(&self) -> Result<()> {
        if self.context == Some(0) {
            return Err(EngineError::Invalid(
                "the context must be at least 1".into(),
            ));
        }
        if self.max_sequences == 0 {
            return Err(EngineError::Invalid(
                "the maximum number of sequences (batch size) must be at least 1".into(),
            ));
        }
        if !(0.0..=1.0).contains(&self.prefetch_min_use) {
            return Err(EngineError::Invalid(format!(
                "prefetch minimum use must be between 0 and 1, found {}",
                self.prefetch_min_use
            )));
        }
        if !(0.0..=1.0).contains(&self.pin_share) {
            return Err(EngineError::Invalid(format!(
                "pin share {} must be between 0 and 1",
                self.pin_share
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_option_out_of_range() {
        assert!(EngineOptions::default().validate().is_ok());
        let bad = |o: EngineOptions| o.validate().unwrap_err().to_string();
        let d = EngineOptions::default;
        assert!(bad(EngineOptions {
            context: Some(0),
            ..d()
        })
        .contains("context"));
        assert!(bad(EngineOptions {
            pin_share: 1.5,
            ..d()
        })
        .contains("pin share 1.5"));
        let e = bad(EngineOptions {
            prefetch_min_use: -0.1,
            ..d()
        });
        assert!(
            e.contains("prefetch minimum use") && e.contains("-0.1"),
            "{e}"
        );
    }
}
