//! The tokenizer and chat template of a GGUF, as the Hugging Face files coli's engine reads
//! (`tokenizer.json`, `tokenizer_config.json`, `chat_template.jinja`, `generation_config.json`),
//! from the `tokenizer.ggml.*` metadata.
//!
//! A GGUF's byte-level BPE (`tokenizer.ggml.model = "gpt2"`) is its token list, types and merges
//! plus a pre-tokenizer that llama.cpp selects by name (`tokenizer.ggml.pre`, its regexes in
//! `src/llama-vocab.cpp`); each name coli knows is written as the `tokenizers` pre-tokenizer
//! that splits the same way, as transformers' GGUF loader does
//! (`integrations/ggml.py`, `GGUFGPTConverter`). Control tokens (type 3) become special added
//! tokens, user-defined ones (type 4) plain added tokens.
//!
//! A SentencePiece vocabulary (`tokenizer.ggml.model = "llama"`: Llama 2, Mixtral) is its pieces
//! and their scores, which llama.cpp merges greedily, the adjacent pair whose merged piece
//! scores highest first (`llm_tokenizer_spm_session` in `src/llama-vocab.cpp`), falling back to
//! the `<0xXX>` byte pieces for what no piece covers. Written as the `tokenizers` BPE that
//! transformers' GGUF loader builds for it (`integrations/gguf/gguf_tokenizer_mapping.py`,
//! `sentencepiece_tokenizer`): merges recovered from the scores (every split of a piece into two
//! pieces, ranked by the piece's score, then the lengths of the halves; transformers'
//! `generate_merges`), byte fallback, and llama.cpp's space handling, a `▁` before the text
//! (`tokenizer.ggml.add_space_prefix`, default true) and every space written `▁`, as a
//! normalizer (llama.cpp prefixes the text however it starts: `"  hi"` is `▁▁▁hi`, which
//! transformers' `Metaspace` writes `▁▁hi`). BOS is added by the post-processor when
//! `tokenizer.ggml.add_bos_token` says so (default true for these vocabularies, as in llama.cpp).
//!
//! `tokenizer.ggml.model = "none"` (a GGUF without a vocabulary) gives no tokenizer: the store
//! then runs on token ids. Anything else is refused, naming the key.

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
    let flag = |key: &str, default: bool| match g.get(key) {
        None => Ok(default),
        Some(v) => v
            .as_bool()
            .ok_or_else(|| kerr(g, format!("{key} is not a bool"))),
    };
    // llama.cpp adds BOS to a SentencePiece vocabulary that does not say otherwise.
    let add_bos = flag("tokenizer.ggml.add_bos_token", model == "llama")?;
    let (tokenizer, tokens) = match model {
        "gpt2" => byte_level(g)?,
        "llama" => sentencepiece(
            g,
            add_bos,
            flag("tokenizer.ggml.add_eos_token", false)?,
            flag("tokenizer.ggml.add_space_prefix", true)?,
        )?,
        _ => {
            return Err(kerr(
                g,
                format!("tokenizer.ggml.model {model:?}: coli converts byte-level BPE (\"gpt2\") and SentencePiece (\"llama\") tokenizers from GGUF"),
            ))
        }
    };
    let special = |key: &str| -> Result<Json> {
        let id = g.get(key).and_then(Value::as_u64);
        match id.or_else(|| (model == "llama").then(|| spm_default_id(key)).flatten()) {
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
        "add_bos_token": add_bos,
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

/// The token types (`tokenizer.ggml.token_type`, one per token; all normal when absent).
fn token_types(g: &Gguf, n: usize) -> Result<Vec<i64>> {
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
        None => vec![1; n],
    };
    if types.len() != n {
        return Err(kerr(
            g,
            format!(
                "tokenizer.ggml.token_type has {} entries for {n} tokens",
                types.len()
            ),
        ));
    }
    Ok(types)
}

/// The `tokenizer.json` of a byte-level BPE vocabulary (`tokenizer.ggml.model = "gpt2"`), and
/// its tokens.
fn byte_level(g: &Gguf) -> Result<(Vec<u8>, Vec<&str>)> {
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
    let types = token_types(g, tokens.len())?;
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
    Ok((
        tokenizer_json(&added, &pre_tokenizer, ignore_merges, vocab, merge_pairs),
        tokens,
    ))
}

/// The `tokenizer.json` of a SentencePiece vocabulary (`tokenizer.ggml.model = "llama"`; the
/// module's documentation says how it is built), its post-processor adding BOS and EOS as
/// `add_bos` and `add_eos` say, a `▁` put before the text when `add_space_prefix`; and its
/// tokens.
fn sentencepiece(
    g: &Gguf,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
) -> Result<(Vec<u8>, Vec<&str>)> {
    let tokens = strings(g, "tokenizer.ggml.tokens")?;
    let types = token_types(g, tokens.len())?;
    let scores: Vec<f32> = g
        .get("tokenizer.ggml.scores")
        .and_then(Value::as_array)
        .and_then(|a| {
            a.iter()
                .map(|v| v.as_f64().map(|x| x as f32))
                .collect::<Option<Vec<_>>>()
        })
        .ok_or_else(|| kerr(g, "metadata key tokenizer.ggml.scores is missing or not an array of numbers (a SentencePiece vocabulary needs its scores)"))?;
    if scores.len() != tokens.len() {
        return Err(kerr(
            g,
            format!(
                "tokenizer.ggml.scores has {} entries for {} tokens",
                scores.len(),
                tokens.len()
            ),
        ));
    }
    if let Some(i) = scores.iter().position(|s| !s.is_finite()) {
        return Err(kerr(
            g,
            format!("tokenizer.ggml.scores[{i}] is {}", scores[i]),
        ));
    }
    let mut vocab = std::collections::HashMap::with_capacity(tokens.len());
    let mut added = Vec::new();
    for (i, (&tok, &ty)) in tokens.iter().zip(&types).enumerate() {
        if vocab.insert(tok, i).is_some() {
            return Err(kerr(
                g,
                format!("tokenizer.ggml.tokens[{i}] {tok:?} appears twice"),
            ));
        }
        // Unknown (2), control (3) and user-defined (4) tokens are matched whole, never
        // normalized (transformers' `add_gguf_special_tokens` and `LlamaTokenizer`'s `<unk>`;
        // llama.cpp splits them out of text when it parses special tokens).
        if (2..=4).contains(&ty) {
            added.push(json!({
                "id": i, "content": tok, "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": false, "special": ty != 4
            }));
        }
    }
    let token_of = |key: &str| -> Result<Option<(u64, &str)>> {
        match g
            .get(key)
            .and_then(Value::as_u64)
            .or_else(|| spm_default_id(key))
        {
            None => Ok(None),
            Some(id) => match tokens.get(id as usize) {
                Some(&t) => Ok(Some((id, t))),
                None => Err(kerr(
                    g,
                    format!(
                        "{key} {id} is not a token id (the vocabulary has {})",
                        tokens.len()
                    ),
                )),
            },
        }
    };
    let unk = token_of("tokenizer.ggml.unknown_token_id")?.map(|(_, t)| t);
    // BOS / EOS around the text, as llama.cpp's `add_bos` / `add_eos` (and a pair's second
    // text as the first).
    let required = |on: bool, key: &str| -> Result<Option<(u64, &str)>> {
        if !on {
            return Ok(None);
        }
        token_of(key)?.map(Some).ok_or_else(|| {
            kerr(
                g,
                format!("the tokenizer adds {key} to every text, but the key is missing"),
            )
        })
    };
    let bos = required(add_bos, "tokenizer.ggml.bos_token_id")?;
    let eos = required(add_eos, "tokenizer.ggml.eos_token_id")?;
    let special = |&(_, t): &(u64, &str)| json!({"SpecialToken": {"id": t, "type_id": 0}});
    let text = |s: &str| json!({"Sequence": {"id": s, "type_id": 0}});
    let wrapped = |s: &str| -> Vec<Json> {
        bos.iter()
            .map(special)
            .chain([text(s)])
            .chain(eos.iter().map(special))
            .collect()
    };
    let single = wrapped("A");
    let pair: Vec<Json> = single.iter().cloned().chain(wrapped("B")).collect();
    let wrap: Vec<(u64, &str)> = bos.into_iter().chain(eos).collect();
    let special_tokens: serde_json::Map<String, Json> = wrap
        .iter()
        .map(|&(id, t)| (t.to_string(), json!({"id": t, "ids": [id], "tokens": [t]})))
        .collect();
    let post_processor = if wrap.is_empty() {
        Json::Null
    } else {
        json!({"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": special_tokens})
    };
    // The merges a score-ranked vocabulary implies: per piece (in id order) its splits into two
    // pieces of the vocabulary, ordered by the halves' ids; then all of them by the piece's
    // score, the left half's length and the right half's (in characters), highest first, ties
    // in that order (a stable sort, as Python's).
    let mut merges: Vec<(&str, &str, f32, usize, usize)> = Vec::new();
    for (&tok, &score) in tokens.iter().zip(&scores) {
        let start = merges.len();
        for (at, _) in tok.char_indices().skip(1) {
            let (l, r) = tok.split_at(at);
            if let (Some(_), Some(_)) = (vocab.get(l), vocab.get(r)) {
                merges.push((l, r, score, l.chars().count(), r.chars().count()));
            }
        }
        merges[start..].sort_by_key(|m| (vocab[m.0], vocab[m.1]));
    }
    // Scores are finite (checked): `partial_cmp` orders them as Python does (-0.0 == 0.0).
    merges.sort_by(|a, b| {
        b.2.partial_cmp(&a.2)
            .expect("finite scores")
            .then(b.3.cmp(&a.3))
            .then(b.4.cmp(&a.4))
    });
    let merges: Vec<[&str; 2]> = merges.iter().map(|m| [m.0, m.1]).collect();
    let mut normalizers = Vec::new();
    if add_space_prefix {
        normalizers.push(json!({"type": "Prepend", "prepend": "\u{2581}"}));
    }
    normalizers.push(json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"}));
    let mut decoders = vec![
        json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if add_space_prefix {
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    let vocab: std::collections::BTreeMap<usize, &str> =
        vocab.into_iter().map(|(t, i)| (i, t)).collect();
    let vocab: serde_json::Map<String, Json> = vocab
        .into_iter()
        .map(|(i, t)| (t.to_string(), json!(i)))
        .collect();
    let doc = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": normalizers},
        "pre_tokenizer": null,
        "post_processor": post_processor,
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
            "ignore_merges": false, "vocab": vocab, "merges": merges
        }
    });
    Ok((serde_json::to_vec(&doc).expect("serializes"), tokens))
}

/// The special-token id llama.cpp's SentencePiece loader assumes when the file gives none
/// (`llama-vocab.cpp`: BOS 1, EOS 2, UNK 0, as Llama 2's vocabulary has them).
fn spm_default_id(key: &str) -> Option<u64> {
    match key {
        "tokenizer.ggml.bos_token_id" => Some(1),
        "tokenizer.ggml.eos_token_id" => Some(2),
        "tokenizer.ggml.unknown_token_id" => Some(0),
        _ => None,
    }
}
