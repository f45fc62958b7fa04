//! Speculative decoding: a decode pass feeds the sampled token plus up to k proposed (draft)
//! tokens, and one forward pass verifies them all; the experts of each layer are read once for
//! the k + 1 positions, so every accepted draft is a token whose expert bytes were free.
//!
//! - Drafts come from prompt lookup ([`ngram`]) or, for stores with a multi-token-prediction
//!   layer, from that layer ([`crate::models::mtp`]); [`Speculate`] chooses.
//! - **Verification emits exactly what plain decode would.** Every verified position is
//!   computed bit for bit as one-token decode computes it ([`crate::layers::Span::as_decode`]:
//!   matmul rows equal the matvec, MLA attends in the absorbed form per row). Row i's logits are
//!   sampled with the sequence's own sampler, in order, exactly as plain decode samples them;
//!   while the sample equals draft i the draft is accepted and the next row is sampled;
//!   the first sample that differs (or the sample after the last draft) is the next token, and
//!   the positions after it are rolled back in every cache.
//! - **With temperature / top-k / top-p this is speculative sampling** (Leviathan et al. 2023,
//!   "Fast Inference from Transformers via Speculative Decoding", alg. 1; Chen et al. 2023) for
//!   drafts proposed as single tokens (a one-hot draft distribution q, as vLLM treats n-gram and
//!   greedy MTP drafts): the draft d is accepted with probability min(1, p(d)/q(d)) = p(d), and a
//!   rejected position emits a token from norm(max(0, p - q)) = p without d, renormalized. The
//!   sample-and-compare rule above realizes exactly these probabilities with one uniform draw per
//!   emitted token, so the output is distributed as the model's and, for a given seed, equals
//!   the non-speculative output token for token.
//! - [`gate::DraftGate`] stops drafting while it does not pay on this machine.

pub mod gate;
pub mod ngram;

use crate::error::{EngineError, Result};
use crate::sampling::Sampler;
use std::fmt;
use std::str::FromStr;

/// Default `--draft-tokens`: drafts per decode pass (see engine/bench/README.md, "Speculative
/// decoding", for the measurement it comes from).
pub const DEFAULT_DRAFT_TOKENS: usize = 4;

/// Largest `--draft-tokens` accepted.
pub const MAX_DRAFT_TOKENS: usize = 32;

/// Where drafts come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Speculate {
    /// No drafts: one token per decode pass.
    Off,
    /// Prompt lookup ([`ngram`]).
    Ngram,
    /// The store's multi-token-prediction layer (an error where the store has none).
    Mtp,
    /// MTP where the store has it, else prompt lookup; the default.
    #[default]
    Auto,
}

impl Speculate {
    /// The mode that runs on a model with an MTP layer (`mtp_absence` None) or without one
    /// (`Some(why)`, [`crate::Engine::mtp_absence`]): `Auto` resolves to `Mtp` or `Ngram`.
    ///
    /// # Errors
    /// [`EngineError::Invalid`] for `Mtp` without an MTP layer, saying why.
    pub fn resolve(self, mtp_absence: Option<&str>) -> Result<Speculate> {
        Ok(match (self, mtp_absence) {
            (Speculate::Auto, None) => Speculate::Mtp,
            (Speculate::Auto, Some(_)) => Speculate::Ngram,
            (Speculate::Mtp, Some(why)) => {
                return Err(EngineError::Invalid(format!(
                    "--speculate mtp: {why}; use --speculate ngram or auto"
                )))
            }
            (m, _) => m,
        })
    }

    /// The name used on the command line and in statistics.
    pub fn name(self) -> &'static str {
        match self {
            Speculate::Off => "off",
            Speculate::Ngram => "ngram",
            Speculate::Mtp => "mtp",
            Speculate::Auto => "auto",
        }
    }
}

impl fmt::Display for Speculate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Speculate {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "off" => Ok(Speculate::Off),
            "ngram" => Ok(Speculate::Ngram),
            "mtp" => Ok(Speculate::Mtp),
            "auto" => Ok(Speculate::Auto),
            _ => Err(format!(
                "unknown speculation mode {s:?}: expected off, ngram, mtp or auto"
            )),
        }
    }
}

/// What a generation drafts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpeculationParams {
    /// The draft source.
    pub mode: Speculate,
    /// Drafts per decode pass at most (k).
    pub draft_tokens: usize,
    /// Prompt lookup: the longest n-gram matched.
    pub max_ngram: usize,
    /// Apply the [`gate::DraftGate`] (false: draft on every pass that has a proposal; for
    /// tests and measurements).
    pub gate: bool,
}

impl Default for SpeculationParams {
    fn default() -> Self {
        SpeculationParams {
            mode: Speculate::Auto,
            draft_tokens: DEFAULT_DRAFT_TOKENS,
            max_ngram: ngram::DEFAULT_MAX_NGRAM,
            gate: true,
        }
    }
}

impl SpeculationParams {
    /// No speculation.
    pub fn off() -> SpeculationParams {
        SpeculationParams {
            mode: Speculate::Off,
            ..Default::default()
        }
    }

    /// Checks ranges.
    ///
    /// # Errors
    /// [`EngineError::Invalid`] for `draft_tokens` above [`MAX_DRAFT_TOKENS`] or 0 with a mode
    /// other than off, or `max_ngram` 0.
    pub fn validate(&self) -> Result<()> {
        if self.mode != Speculate::Off
            && (self.draft_tokens == 0 || self.draft_tokens > MAX_DRAFT_TOKENS)
        {
            return Err(EngineError::Invalid(format!(
                "--draft-tokens must be in 1..={MAX_DRAFT_TOKENS}, got {}",
                self.draft_tokens
            )));
        }
        if self.max_ngram == 0 {
            return Err(EngineError::Invalid("the n-gram size must be >= 1".into()));
        }
        Ok(())
    }
}

/// Speculation counters of a generation (or a server's lifetime).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct SpeculationStats {
    /// Draft tokens proposed and verified.
    pub drafts_proposed: u64,
    /// Draft tokens accepted (emitted).
    pub drafts_accepted: u64,
    /// Decode passes that carried drafts.
    pub verify_passes: u64,
    /// Decode passes the draft gate kept without drafts although a proposal existed.
    pub gate_paused_passes: u64,
    /// Seconds spent proposing drafts (the MTP layer's steps; prompt lookup's search).
    pub draft_s: f64,
}

impl SpeculationStats {
    /// Accepted / proposed drafts (0 without drafts).
    pub fn acceptance_rate(&self) -> f64 {
        if self.drafts_proposed == 0 {
            0.0
        } else {
            self.drafts_accepted as f64 / self.drafts_proposed as f64
        }
    }

    /// Adds `o`'s counters.
    pub fn add(&mut self, o: &SpeculationStats) {
        self.drafts_proposed += o.drafts_proposed;
        self.drafts_accepted += o.drafts_accepted;
        self.verify_passes += o.verify_passes;
        self.gate_paused_passes += o.gate_paused_passes;
        self.draft_s += o.draft_s;
    }
}

/// The outcome of verifying drafts ([`accept`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// Drafts accepted (a prefix of the drafts).
    pub accepted: usize,
    /// The token after the accepted drafts: the replacement of the first rejected draft, or,
    /// when all were accepted, the token sampled from the last row. Not yet in the KV cache.
    pub next: u32,
}

/// Verifies `drafts` against the verify pass's logits `rows` (`rows[i]`, `[vocab]` f32: the
/// logits after the sampled token and drafts `0..i`; `rows.len() == drafts.len() + 1`): row
/// i is sampled with `sampler` exactly as plain decode samples it, and draft i is accepted
/// while the sample equals it. With temperature this is speculative sampling for single-token
/// drafts (see the module doc): draft d is accepted with probability p(d), a rejected position
/// yields a sample of p without d, renormalized.
///
/// # Panics
/// When `rows.len() != drafts.len() + 1`.
pub fn accept(sampler: &mut Sampler, rows: &[Vec<f32>], drafts: &[u32]) -> Verdict {
    assert_eq!(
        rows.len(),
        drafts.len() + 1,
        "one logits row per draft, plus one"
    );
    for (i, row) in rows.iter().enumerate() {
        let z = sampler.sample(row);
        if drafts.get(i) != Some(&z) {
            return Verdict {
                accepted: i,
                next: z,
            };
        }
    }
    unreachable!("the last row has no draft, so its sample ends the loop")
}
