//! Constrained decoding: a grammar (llguidance's Lark dialect, with JSON schemas inline) turned
//! into a mask over the vocabulary at each step, so a sequence can only emit tokens that keep
//! its text a prefix of a sentence of the grammar. Used for forced tool calls
//! ([`crate::tool_calls::grammar`]) and JSON output (`response_format`).
//!
//! Why llguidance: it is a maintained Rust library (the engine behind OpenAI-compatible
//! structured output in vLLM, SGLang and llama.cpp), computes a mask in tens of microseconds from
//! a token trie (no per-vocabulary regex pass), takes Lark grammars with `%json` schemas inline
//! (what a tool call in an XML syntax needs: markup around schema-typed values), and supports
//! rollback, which speculative verification needs. outlines-core compiles a schema into an
//! automaton up front (slow for large schemas, no grammar beyond regular languages).
//!
//! The token trie comes from the store's `tokenizer.json` (llguidance's reader: byte-level BPE
//! and byte-fallback vocabularies); special tokens are matched only where a grammar names them
//! (`<[id]>`). A token the tokenizer does not define (an embedding row past the vocabulary) is
//! never allowed.

use crate::error::{EngineError, Result};
use crate::text::TextTokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use std::sync::Arc;

/// A [`TokenizerEnv`] over the store's tokenizer: the trie of token bytes and the tokenizer
/// itself for text llguidance needs tokenized.
struct StoreTokEnv {
    trie: TokTrie,
    tok: Arc<TextTokenizer>,
}

impl TokenizerEnv for StoreTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        self.tok
            .encode(&String::from_utf8_lossy(s), false)
            .unwrap_or_default()
    }
}

/// Compiles grammars for one tokenizer and vocabulary (shared by every request of a server).
pub struct Grammars {
    factory: ParserFactory,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Grammars({} tokens)",
            self.factory.tok_env().tok_trie().vocab_size()
        )
    }
}

impl Grammars {
    /// Grammars over `tok`'s tokens for a model of `vocab` logits (at least the tokenizer's
    /// size) whose end of sequence is `eos`.
    ///
    /// # Errors
    /// [`EngineError::Tokenizer`] when the tokenizer's vocabulary cannot be read as bytes (a
    /// decoder that is neither byte-level nor byte-fallback).
    pub fn new(tok: Arc<TextTokenizer>, vocab: usize, eos: u32) -> Result<Grammars> {
        let json: serde_json::Value = serde_json::from_slice(tok.json())
            .map_err(|e| EngineError::Tokenizer(format!("tokenizer.json: {e}")))?;
        let mut words = llguidance::token_bytes_from_tokenizer_json(&json).map_err(|e| {
            EngineError::Tokenizer(format!(
                "tokenizer.json: its tokens cannot be read as bytes for constrained decoding: {e}"
            ))
        })?;
        let n = words.len().max(vocab);
        words.resize(n, Vec::new());
        let info = TokRxInfo::new(n as u32, eos);
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(StoreTokEnv { trie, tok });
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| EngineError::Tokenizer(format!("constrained decoding: {e}")))?;
        factory.quiet();
        Ok(Grammars { factory })
    }

    /// Grammars over a vocabulary where token `b` is byte `b` (0..=255): for checking which
    /// texts a grammar accepts, whatever a tokenizer would make of them
    /// ([`Constraint::accepts_bytes`]).
    pub fn bytewise() -> Grammars {
        let env = llguidance::toktrie::ApproximateTokEnv::single_byte_env();
        let mut factory = ParserFactory::new_simple(&env).expect("the byte vocabulary has slices");
        factory.quiet();
        Grammars { factory }
    }

    /// The id of `text` when the vocabulary holds it as one special token (grammars match it
    /// as that token, not as text).
    pub fn special_token(&self, text: &str) -> Option<u32> {
        let trie = self.factory.tok_env().tok_trie();
        let id = trie.get_special_token(text)?;
        Some(id)
    }

    /// A constraint for one sequence following `lark` (llguidance's Lark dialect).
    ///
    /// # Errors
    /// The grammar library's message when the grammar (or a schema in it) does not compile.
    pub fn compile(&self, lark: &str) -> std::result::Result<Constraint, String> {
        let g = TopLevelGrammar::from_lark(lark.to_string());
        let parser = self.factory.create_parser(g).map_err(|e| e.to_string())?;
        let m = Matcher::new(Ok(parser));
        if let Some(e) = m.get_error() {
            return Err(e);
        }
        Ok(Constraint {
            matcher: m,
            param: "grammar",
        })
    }
}

/// One sequence's grammar state ([`Grammars::compile`]).
pub struct Constraint {
    matcher: Matcher,
    /// The request field the grammar comes from (named in errors).
    param: &'static str,
}

impl Clone for Constraint {
    fn clone(&self) -> Constraint {
        Constraint {
            matcher: self.matcher.deep_clone(),
            param: self.param,
        }
    }
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Constraint({})", self.param)
    }
}

impl Constraint {
    /// The constraint, its errors naming request field `param` (`tool_choice`,
    /// `response_format`).
    pub fn with_param(mut self, param: &'static str) -> Constraint {
        self.param = param;
        self
    }

    /// The request field the grammar comes from.
    pub fn param(&self) -> &'static str {
        self.param
    }

    /// An error of the grammar library at generation time, its message's first line.
    fn error(&self, e: impl std::fmt::Display) -> EngineError {
        let msg = e.to_string();
        let first = msg.lines().next().unwrap_or_default();
        let first: String = first.chars().take(300).collect();
        EngineError::Invalid(format!(
            "constrained decoding ({}): the grammar library failed: {first}",
            self.param
        ))
    }

    /// Sets every logit the grammar does not allow next to -inf (once the grammar is complete,
    /// only the end-of-sequence token is allowed).
    ///
    /// # Errors
    /// [`EngineError::Invalid`] when the grammar is in an error state.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<()> {
        let vob = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| self.error(e))?;
        for (i, l) in logits.iter_mut().enumerate() {
            if !vob.is_allowed(i as u32) {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    /// Advances past token `id` (one the mask allowed).
    ///
    /// # Errors
    /// [`EngineError::Invalid`] when the grammar does not allow `id`.
    pub fn consume(&mut self, id: u32) -> Result<()> {
        if self.matcher.is_stopped() {
            return Ok(());
        }
        if let Err(e) = self.matcher.consume_token(id) {
            return Err(self.error(e));
        }
        Ok(())
    }

    /// How many of `tokens`, from the start, the grammar allows in order (the drafts a
    /// speculative pass may verify), without advancing.
    pub fn valid_prefix(&mut self, tokens: &[u32]) -> usize {
        if self.matcher.is_stopped() {
            return 0;
        }
        self.matcher.validate_tokens(tokens).unwrap_or(0)
    }

    /// The masks of the positions of a verification pass: before `drafts[0]`, after
    /// `drafts[..1]`, ..., after all of them (`drafts.len() + 1` rows), applied to `rows`;
    /// the state is left as it was.
    ///
    /// # Errors
    /// As [`Constraint::mask`]; `drafts` must be a [`Constraint::valid_prefix`].
    pub fn mask_rows(&mut self, rows: &mut [Vec<f32>], drafts: &[u32]) -> Result<()> {
        let mut advanced = 0;
        let mut out = Ok(());
        let n = rows.len();
        for (i, row) in rows.iter_mut().enumerate() {
            if let Err(e) = self.mask(row) {
                out = Err(e);
                break;
            }
            // Once the grammar is complete the later rows allow only the end of sequence (what
            // `mask` gives a stopped grammar).
            if i < drafts.len() && i + 1 < n && !self.matcher.is_stopped() {
                if let Err(e) = self.matcher.consume_token(drafts[i]) {
                    out = Err(self.error(e));
                    break;
                }
                advanced += 1;
            }
        }
        if advanced > 0 {
            if let Err(e) = self.matcher.rollback(advanced) {
                return Err(self.error(e));
            }
        }
        out
    }

    /// A [`Grammars::bytewise`] constraint fed `text` byte by byte: whether every byte was
    /// allowed and the grammar accepts the whole.
    pub fn accepts_bytes(&mut self, text: &[u8]) -> bool {
        self.allowed_prefix(text) == text.len() && (self.is_done() || self.is_accepting())
    }

    /// A [`Grammars::bytewise`] constraint fed `text` byte by byte while the grammar allows
    /// them: how many it took.
    pub fn allowed_prefix(&mut self, text: &[u8]) -> usize {
        for (i, &b) in text.iter().enumerate() {
            let mut mask = vec![0.0f32; 256];
            if self.mask(&mut mask).is_err()
                || mask[b as usize] == f32::NEG_INFINITY
                || self.consume(u32::from(b)).is_err()
            {
                return i;
            }
        }
        text.len()
    }

    /// Whether the grammar is complete (only end of sequence may follow).
    pub fn is_done(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// Whether the text so far is a whole sentence of the grammar.
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }
}
