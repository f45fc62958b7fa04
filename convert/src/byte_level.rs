//! Byte-level BPE as the `tokenizer.json` coli's engine reads (the `tokenizers` crate's
//! format): GPT-2's byte-to-character map, llama.cpp's pre-tokenizers by name as `tokenizers`
//! pre-tokenizers, and the document itself. Shared by the two tokenizer sources that carry no
//! tokenizer.json: a GGUF's vocabulary ([`crate::gguf::tokenizer`]) and tiktoken ranks
//! ([`crate::tiktoken`]).

use serde::Serialize;
use serde_json::{json, Value as Json};

/// GPT-2's byte-to-character map (`bytes_to_unicode` of GPT-2's encoder.py, as transformers and
/// tiktoken-based tokenizers use it): printable Latin-1 bytes stand for themselves, the other
/// 68 bytes for U+0100 onwards in byte order. A byte-level BPE token is written as the
/// characters of its bytes.
pub(crate) fn byte_chars() -> [char; 256] {
    let mut out = ['\0'; 256];
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
        out[b as usize] = char::from_u32(c).expect("below U+0200");
    }
    out
}

/// The 256 characters a byte-level BPE token is made of ([`byte_chars`]).
pub(crate) fn byte_alphabet() -> std::collections::HashSet<char> {
    byte_chars().into_iter().collect()
}

/// A byte-level BPE `tokenizer.json`, serialized: `added` tokens (objects as tokenizers writes
/// them), the pre-tokenizer, whether a pre-tokenized piece that is itself a token is taken
/// whole (`ignore_merges`: tiktoken does so, and llama.cpp for some vocabularies), `vocab` (a
/// map token -> id) and `merges` (a sequence of `[left, right]` pairs, highest priority
/// first), each serialized as it is written (a vocabulary of 160k tokens is never held as JSON
/// values). No normalizer; ByteLevel post-processor and decoder, so that decoding gives the
/// bytes back.
pub(crate) fn tokenizer_json<V: Serialize, M: Serialize>(
    added: &[Json],
    pre_tokenizer: &Json,
    ignore_merges: bool,
    vocab: V,
    merges: M,
) -> Vec<u8> {
    #[derive(Serialize)]
    struct Doc<'a, V, M> {
        version: &'static str,
        truncation: Option<()>,
        padding: Option<()>,
        added_tokens: &'a [Json],
        normalizer: Option<()>,
        pre_tokenizer: &'a Json,
        post_processor: Json,
        decoder: Json,
        model: Model<V, M>,
    }
    #[derive(Serialize)]
    struct Model<V, M> {
        #[serde(rename = "type")]
        kind: &'static str,
        dropout: Option<()>,
        unk_token: Option<()>,
        continuing_subword_prefix: Option<()>,
        end_of_word_suffix: Option<()>,
        fuse_unk: bool,
        byte_fallback: bool,
        ignore_merges: bool,
        vocab: V,
        merges: M,
    }
    let doc = Doc {
        version: "1.0",
        truncation: None,
        padding: None,
        added_tokens: added,
        normalizer: None,
        pre_tokenizer,
        post_processor: json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true}),
        decoder: json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true}),
        model: Model {
            kind: "BPE",
            dropout: None,
            unk_token: None,
            continuing_subword_prefix: None,
            end_of_word_suffix: None,
            fuse_unk: false,
            byte_fallback: false,
            ignore_merges,
            vocab,
            merges,
        },
    };
    serde_json::to_vec(&doc).expect("serializes")
}

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

/// `LLAMA_VOCAB_PRE_TYPE_QWEN35` (Qwen3.5 / Qwen3.6), the tokenizer.json original llama.cpp
/// quotes: qwen2's with combining marks (`\p{M}`) kept in letter runs.
const QWEN35_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// `LLAMA_VOCAB_PRE_TYPE_GPT4O` (o200k: gpt-oss), the tokenizer.json original llama.cpp quotes
/// (its own copy rewrites the letter classes as lookaheads for its regex engine).
const GPT4O_REGEX: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Kimi-K2's split regex (its `tokenization_kimi.py`, quoted by llama.cpp's `unicode.cpp`, whose
/// hand-written `unicode_regex_split_custom_kimi_k2` runs it): runs of Han characters, then
/// o200k's letter words with Han excluded.
pub(crate) const KIMI_K2_REGEX: &str = r"[\p{Han}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The `tokenizer.ggml.pre` names coli converts.
pub const PRE_TOKENIZERS: &[&str] = &[
    "gpt-2",
    "default",
    "olmo",
    "smollm",
    "qwen2",
    "qwen35",
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
pub(crate) fn pre_tokenizer(pre: &str) -> Option<(Json, bool)> {
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
        "qwen35" => (splits(&[QWEN35_REGEX]), false),
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
