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
use crate::error::{ConvertError, Result};
use serde_json::{json, Value as Json};

/// The split regex of llama.cpp's `LLAMA_VOCAB_PRE_TYPE_QWEN2` (Qwen2/Qwen3 tokenizers, whose
/// tokenizer.json writes it as a `Split` before a regex-free `ByteLevel`).
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GPT-2's split regex as llama.cpp writes it (`LLAMA_VOCAB_PRE_TYPE_GPT2`; the original's
/// last `|\s+` adds no split).
const GPT2_REGEX: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// The third split of `LLAMA_VOCAB_PRE_TYPE_DEEPSEEK3_LLM` (DeepSeek-V3's tokenizer.json; the
/// first two isolate runs of 1-3 digits and of CJK ideographs and kana).
const DEEPSEEK3_REGEX: &str = r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##;

/// `LLAMA_VOCAB_PRE_TYPE_CHATGLM4` (GLM-4.x, GLM-5: Llama 3's regex), as the tokenizer.json
/// original with its case-insensitive contractions.
const GLM4_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// `LLAMA_VOCAB_PRE_TYPE_GPT4O` (o200k: gpt-oss), the tokenizer.json original llama.cpp quotes
/// (its own copy rewrites the letter classes as lookaheads for its regex engine).
const GPT4O_REGEX: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Kimi-K2's split regex (its `tokenization_kimi.py`, quoted by llama.cpp's `unicode.cpp`, whose
/// hand-written `unicode_regex_split_custom_kimi_k2` runs it): runs of Han characters, then
/// o200k's letter words with Han excluded.
const KIMI_K2_REGEX: &str = r"[\p{Han}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The `tokenizer.ggml.pre` names coli converts.
pub const PRE_TOKENIZERS: &[&str] = &[
    "gpt-2",
    "default",
    "olmo",
    "smollm",
    "qwen2",
    "deepseek-v3",
    "glm4",
    "glm5",
    "gpt-4o",
    "kimi-k2",
];

/// The `tokenizers` pre-tokenizer that splits as llama.cpp's pre-tokenizer `pre` does (its
/// regexes in `src/llama-vocab.cpp` `llm_tokenizer_bpe`, applied one after another, each
/// isolating its matches), and whether llama.cpp sets `ignore_merges` for it (a piece that is a
/// token is taken whole). None for a name coli does not convert. Checked against llama.cpp on
/// one vocabulary under every name (`tests/tests/gguf_tokenizer.rs`).
fn pre_tokenizer(pre: &str) -> Option<(Json, bool)> {
    let split = |re: &str| json!({"type": "Split", "pattern": {"Regex": re}, "behavior": "Isolated", "invert": false});
    let splits = |res: &[&str]| {
        let mut v: Vec<Json> = res.iter().map(|r| split(r)).collect();
        v.push(json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}));
        json!({"type": "Sequence", "pretokenizers": v})
    };
    Some(match pre {
        "gpt-2" | "olmo" => (
            json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}),
            false,
        ),
        // LLAMA_VOCAB_PRE_TYPE_DEFAULT (an unnamed GGUF pre-tokenizer).
        "default" => (
            splits(&[
                r"[\p{P}\$\+<=>\^~\|]+",
                GPT2_REGEX,
                r"\p{N}+",
                "[0-9][0-9][0-9]",
            ]),
            false,
        ),
        "smollm" => (
            json!({
                "type": "Sequence",
                "pretokenizers": [
                    {"type": "Digits", "individual_digits": true},
                    {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
                ]
            }),
            false,
        ),
        "qwen2" => (splits(&[QWEN2_REGEX]), false),
        "deepseek-v3" => (
            splits(&[r"\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+", DEEPSEEK3_REGEX]),
            false,
        ),
        "glm4" | "glm5" => (splits(&[GLM4_REGEX]), true),
        "gpt-4o" => (splits(&[GPT4O_REGEX]), false),
        "kimi-k2" => (splits(&[KIMI_K2_REGEX]), false),
        _ => return None,
    })
}

fn kerr(g: &Gguf, what: impl Into<String>) -> ConvertError {
    ConvertError::Gguf {
        file: g.path().to_path_buf(),
        what: what.into(),
    }
}

/// GPT-2's byte-to-unicode alphabet (the 256 characters a byte-level BPE token is made of).
fn byte_alphabet() -> std::collections::HashSet<char> {
    let mut set = std::collections::HashSet::new();
    let mut n = 0u32;
    for b in 0u32..256 {
        let printable =
            (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        let c = if printable {
            b
        } else {
            n += 1;
            255 + n
        };
        set.insert(char::from_u32(c).expect("valid"));
    }
    set
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
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": ignore_merges, "vocab": vocab, "merges": merge_pairs
        }
    });
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
        (
            "tokenizer.json".to_string(),
            serde_json::to_vec(&tokenizer).expect("serializes"),
        ),
        ("tokenizer_config.json".to_string(), pretty(&config)),
    ];
    if let Some(t) = template {
        out.push(("chat_template.jinja".to_string(), t.as_bytes().to_vec()));
    }
    Ok(out)
}
