//! The tokenizer and chat template of a GGUF, as the Hugging Face files coli's engine reads
//! (`tokenizer.json`, `tokenizer_config.json`, `chat_template.jinja`, `generation_config.json`),
//! from the `tokenizer.ggml.*` metadata.
//!
//! A GGUF's byte-level BPE (`tokenizer.ggml.model = "gpt2"`) is its token list, types and merges
//! plus a pre-tokenizer that llama.cpp selects by name (`tokenizer.ggml.pre`, its regexes in
//! `src/llama-vocab.cpp`); each name coli knows is written as the `tokenizers` pre-tokenizer
//! that splits the same way, as transformers' GGUF loader does
//! (`integrations/ggml.py`, `GGUFGPTConverter`). Control tokens (type 3) become special added
//! tokens, user-defined ones (type 4) plain added tokens. `tokenizer.ggml.model = "none"` (a
//! GGUF without a vocabulary) gives no tokenizer: the store then runs on token ids. Anything
//! else is refused, naming the key.

use super::file::{Gguf, Value};
use crate::byte_level::{byte_alphabet, pre_tokenizer, tokenizer_json};
use crate::error::{ConvertError, Result};
use serde_json::{json, Value as Json};

pub use crate::byte_level::PRE_TOKENIZERS;

fn kerr(g: &Gguf, what: impl Into<String>) -> ConvertError {
    ConvertError::Gguf {
        file: g.path().to_path_buf(),
        what: what.into(),
    }
}

fn strings<'a>(g: &'a Gguf, key: &str) -> Result<Vec<&'a str>> {
    g.get(key)
        .and_then(Value::as_array)
        .and_then(|a| a.iter().map(Value::as_str).collect::<Option<Vec<_>>>())
        .ok_or_else(|| {
            kerr(
                g,
                format!("metadata key {key} is missing or not an array of strings"),
            )
        })
}

/// The files of the GGUF's tokenizer and chat template, as (name, bytes); empty for a GGUF
/// without a vocabulary (`tokenizer.ggml.model = "none"` or absent).
///
/// # Errors
/// [`ConvertError::Gguf`] naming the key: a tokenizer model or pre-tokenizer coli does not
/// convert, token types or merges that disagree with the tokens, a token outside the byte-level
/// alphabet, a special token id out of range.
pub fn files(g: &Gguf, context_length: usize) -> Result<Vec<(String, Vec<u8>)>> {
    let model = g
        .get("tokenizer.ggml.model")
        .and_then(Value::as_str)
        .unwrap_or("none");
    if model == "none" {
        return Ok(Vec::new());
    }
    if model != "gpt2" {
        return Err(kerr(
            g,
            format!("tokenizer.ggml.model {model:?}: coli converts byte-level BPE tokenizers (\"gpt2\") from GGUF; SentencePiece (\"llama\") and others are not converted yet"),
        ));
    }
    let pre = g
        .get("tokenizer.ggml.pre")
        .and_then(Value::as_str)
        .unwrap_or("default");
    let (pre_tokenizer, ignore_merges) = pre_tokenizer(pre).ok_or_else(|| {
        kerr(
            g,
            format!(
                "tokenizer.ggml.pre {pre:?}: coli converts the pre-tokenizers {}",
                PRE_TOKENIZERS.join(", ")
            ),
        )
    })?;
    let tokens = strings(g, "tokenizer.ggml.tokens")?;
    let merges = strings(g, "tokenizer.ggml.merges")?;
    let types: Vec<i64> = match g.get("tokenizer.ggml.token_type").and_then(Value::as_array) {
        Some(a) => a
            .iter()
            .map(|v| match v {
                Value::Int(i) => Some(*i),
                Value::Uint(u) => Some(*u as i64),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| kerr(g, "tokenizer.ggml.token_type is not an array of integers"))?,
        None => vec![1; tokens.len()],
    };
    if types.len() != tokens.len() {
        return Err(kerr(
            g,
            format!(
                "tokenizer.ggml.token_type has {} entries for {} tokens",
                types.len(),
                tokens.len()
            ),
        ));
    }
    let alphabet = byte_alphabet();
    let mut added = Vec::new();
    let mut vocab = serde_json::Map::new();
    for (i, (&tok, &ty)) in tokens.iter().zip(&types).enumerate() {
        if ty == 3 || ty == 4 {
            added.push(json!({
                "id": i, "content": tok, "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": ty == 4, "special": ty == 3
            }));
        } else if !tok.chars().all(|c| alphabet.contains(&c)) {
            return Err(kerr(
                g,
                format!(
                    "tokenizer.ggml.tokens[{i}] {tok:?} is not made of byte-level BPE characters"
                ),
            ));
        }
        if vocab.insert(tok.to_string(), json!(i)).is_some() {
            return Err(kerr(
                g,
                format!("tokenizer.ggml.tokens[{i}] {tok:?} appears twice"),
            ));
        }
    }
    let mut merge_pairs = Vec::with_capacity(merges.len());
    for (i, m) in merges.iter().enumerate() {
        let Some((a, b)) = m.split_once(' ') else {
            return Err(kerr(
                g,
                format!("tokenizer.ggml.merges[{i}] {m:?} is not two tokens"),
            ));
        };
        merge_pairs.push(json!([a, b]));
    }
    let tokenizer = tokenizer_json(&added, &pre_tokenizer, ignore_merges, vocab, merge_pairs);
    let special = |key: &str| -> Result<Json> {
        match g.get(key).and_then(Value::as_u64) {
            None => Ok(Json::Null),
            Some(id) => tokens.get(id as usize).map(|t| json!(t)).ok_or_else(|| {
                kerr(
                    g,
                    format!(
                        "{key} {id} is not a token id (the vocabulary has {})",
                        tokens.len()
                    ),
                )
            }),
        }
    };
    let template = g.get("tokenizer.chat_template").and_then(Value::as_str);
    let mut config = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": special("tokenizer.ggml.bos_token_id")?,
        "eos_token": special("tokenizer.ggml.eos_token_id")?,
        "unk_token": special("tokenizer.ggml.unknown_token_id")?,
        "pad_token": special("tokenizer.ggml.padding_token_id")?,
        "add_bos_token": g.get("tokenizer.ggml.add_bos_token").is_some_and(|v| *v == Value::Bool(true)),
        "clean_up_tokenization_spaces": false,
        "model_max_length": context_length,
    });
    if let Some(t) = template {
        config["chat_template"] = json!(t);
    }
    let id = |key: &str| {
        g.get(key)
            .and_then(Value::as_u64)
            .map_or(Json::Null, Json::from)
    };
    let generation = json!({
        "bos_token_id": id("tokenizer.ggml.bos_token_id"),
        "eos_token_id": id("tokenizer.ggml.eos_token_id"),
    });
    let pretty = |v: &Json| serde_json::to_vec_pretty(v).expect("serializes");
    let mut out = vec![
        ("generation_config.json".to_string(), pretty(&generation)),
        ("tokenizer.json".to_string(), tokenizer),
        ("tokenizer_config.json".to_string(), pretty(&config)),
    ];
    if let Some(t) = template {
        out.push(("chat_template.jinja".to_string(), t.as_bytes().to_vec()));
    }
    Ok(out)
}
