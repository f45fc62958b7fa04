//! Checkpoints whose tokenizer is tiktoken's: Kimi-K2, Kimi-Linear and Kimi K3 publish no
//! `tokenizer.json`, but `tiktoken.model` (one `base64(token bytes) rank` line per token, as
//! `tiktoken.load.load_tiktoken_bpe` reads it) and the Python class that tokenizer_config.json's
//! `auto_map.AutoTokenizer` names (`tokenization_kimi.TikTokenTokenizer`). That class builds
//! `tiktoken.Encoding(pat_str, mergeable_ranks, special_tokens)` and encodes with
//! `allowed_special="all"`. The converter writes the same tokenizer as the `tokenizer.json`
//! coli's engine reads, as transformers' `convert_slow_tokenizer.TikTokenConverter` does:
//!
//! - vocabulary: every rank's bytes in GPT-2's byte-level characters, id = rank;
//! - merges: every split of a token into two tokens, ordered by the token's rank, then the
//!   left part's, then the right part's (the merge tiktoken applies is the adjacent pair whose
//!   joined bytes have the lowest rank; listing every split lets the BPE make the same choice);
//! - `ignore_merges`: a pre-tokenized piece that is itself a token is taken whole (tiktoken looks
//!   a piece up before merging);
//! - pre-tokenizer: the class's `pat_str`, split as tiktoken splits it (Kimi's is llama.cpp's
//!   `kimi-k2`, `KIMI_K2_REGEX` in `byte_level.rs`);
//! - special tokens: the ids after the last rank (`num_reserved_special_tokens` of them in Kimi
//!   K3's class, that + 2 in Kimi-Linear's and Kimi-K2's first one), named by
//!   tokenizer_config.json's `added_tokens_decoder`, else `<|reserved_token_{id}|>`, all special
//!   (matched in text before the split, as `allowed_special="all"` does).
//!
//! The class is Python, which coli does not run: coli reads what it needs from the class's body
//! in the module (`num_reserved_special_tokens = N`, the range the special ids are numbered
//! over, and the `pat_str = "|".join([...])` of raw string literals, one per line) and converts
//! only a class whose split regex it knows and whose special-token rule is one of Kimi's, and
//! only special tokens tokenizer.json can hold with their ids (the `tokenizers` crate keys added
//! tokens by text: two ids of one name, or a special named as an ordinary token, are skipped). Anything else is reported and skipped: the store then runs on
//! token ids, as before. Checked against tiktoken itself on a real vocabulary
//! (`tests/tests/tiktoken_tokenizer.rs`). One difference is left: Kimi's `encode` cuts runs of
//! more than 25,000 whitespace or non-whitespace characters before splitting; coli does not.

use crate::byte_level::{byte_chars, pre_tokenizer, tokenizer_json, KIMI_K2_REGEX};
use crate::error::{ConvertError, Result};
use base64::Engine as _;
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::{json, Value as Json};
use std::collections::HashMap;
use std::path::Path;

/// The tiktoken ranks file's name in a checkpoint.
pub const TIKTOKEN_MODEL: &str = "tiktoken.model";

/// Split regexes coli converts: (the class's `pat_str`, joined; llama.cpp's name of the same
/// pre-tokenizer in [`crate::byte_level::pre_tokenizer`]).
const KNOWN_PATTERNS: &[(&str, &str)] = &[(KIMI_K2_REGEX, "kimi-k2")];

/// More special ids than any tokenizer has (Kimi's: 256 or 258): a class numbering more is
/// not converted.
const MAX_SPECIALS: usize = 1 << 16;

/// What became of a checkpoint's `tiktoken.model`.
#[derive(Debug)]
pub enum Tiktoken {
    /// `tokenizer.json` written; `note` says from what (for the conversion report).
    Converted {
        /// The tokenizer.json bytes.
        tokenizer_json: Vec<u8>,
        /// E.g. `tokenizer.json written from tiktoken.model (...)`.
        note: String,
    },
    /// Not converted: why, and that the store runs on token ids.
    Skipped(String),
}

fn config_err(file: &Path, what: impl Into<String>) -> ConvertError {
    ConvertError::Config {
        file: file.to_path_buf(),
        what: what.into(),
    }
}

/// The tokenizer of checkpoint `dir` when it has a `tiktoken.model` (None when it has not).
///
/// # Errors
/// [`ConvertError::Config`] naming the file and line: a tiktoken.model line that is not
/// `base64 rank`, a token or rank given twice, ranks that are not `0..n`, a vocabulary without
/// one of the 256 single bytes, a tiktoken.model that is not a file; a tokenizer_config.json
/// that is not JSON. A tokenizer class coli cannot read, or special tokens tokenizer.json
/// cannot hold with their ids, are not errors ([`Tiktoken::Skipped`]).
pub fn convert(dir: &Path) -> Result<Option<Tiktoken>> {
    let model_path = dir.join(TIKTOKEN_MODEL);
    if !model_path.exists() {
        return Ok(None);
    }
    if !model_path.is_file() {
        return Err(config_err(&model_path, "is not a file"));
    }
    let skip = |why: String| {
        Ok(Some(Tiktoken::Skipped(format!(
            "{TIKTOKEN_MODEL} not converted: {why}; the store runs on token ids"
        ))))
    };
    let cfg_path = dir.join("tokenizer_config.json");
    let cfg: Json = match std::fs::read(&cfg_path) {
        Ok(b) => serde_json::from_slice(&b)
            .map_err(|e| config_err(&cfg_path, format!("not valid JSON: {e}")))?,
        Err(_) => {
            return skip(
                "the checkpoint has no tokenizer_config.json to name its tokenizer class".into(),
            )
        }
    };
    let class = match cfg.pointer("/auto_map/AutoTokenizer") {
        Some(Json::Array(a)) => a.first().and_then(Json::as_str),
        Some(Json::String(s)) => Some(s.as_str()),
        _ => None,
    };
    // `module.Class`, or `repo--module.Class` (a class from another repository, as the Hub
    // writes it: its module is then looked for in this checkpoint too).
    let Some((module, class_name)) = class
        .map(|c| c.rsplit_once("--").map_or(c, |(_, c)| c))
        .and_then(|c| c.rsplit_once('.'))
    else {
        return skip(
            "tokenizer_config.json names no tokenizer class (auto_map.AutoTokenizer)".into(),
        );
    };
    let plain = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !plain(module) || !plain(class_name) {
        return skip(format!(
            "auto_map.AutoTokenizer {:?} is not a module and class name of this checkpoint",
            class.unwrap_or_default()
        ));
    }
    let module_file = format!("{module}.py");
    let source = match std::fs::read(dir.join(&module_file)) {
        Err(_) => {
            return skip(format!(
                "{module_file}, the tokenizer class tokenizer_config.json names, is not in the checkpoint"
            ))
        }
        Ok(b) => match String::from_utf8(b) {
            Ok(s) => s,
            Err(_) => return skip(format!("{module_file} is not UTF-8 text")),
        },
    };
    // What the class itself says: its body, from `class Name` to the next top-level line.
    let Some(source) = class_body(&source, class_name) else {
        return skip(format!("{module_file} has no class {class_name}"));
    };
    let source = source.as_str();
    let Some(pattern) = pat_str(source) else {
        return skip(format!(
            "{module_file} has no `pat_str = \"|\".join([...])` of raw strings coli can read"
        ));
    };
    let Some(&(_, pre_name)) = KNOWN_PATTERNS.iter().find(|(p, _)| *p == pattern) else {
        return skip(format!(
            "{module_file}'s split regex is not one coli converts (Kimi's tokenization_kimi.py)"
        ));
    };
    let Some(specials) = special_count(source).filter(|&n| n <= MAX_SPECIALS) else {
        return skip(format!(
            "{module_file} does not number its special tokens as Kimi's tokenization_kimi.py does"
        ));
    };
    let ranks = read_ranks(&model_path)?;
    let n = ranks.len();
    let by_bytes: HashMap<&[u8], u32> = (0..).zip(&ranks).map(|(r, b)| (b.as_slice(), r)).collect();
    let mut merges: Vec<(u32, u32)> = Vec::new();
    for tok in &ranks {
        let start = merges.len();
        for i in 1..tok.len() {
            if let (Some(&l), Some(&r)) = (by_bytes.get(&tok[..i]), by_bytes.get(&tok[i..])) {
                merges.push((l, r));
            }
        }
        merges[start..].sort_unstable();
    }
    let named = cfg.get("added_tokens_decoder").and_then(Json::as_object);
    let contents: Vec<String> = (n..n + specials)
        .map(|id| {
            named
                .and_then(|m| m.get(&id.to_string()))
                .and_then(|t| t.get("content"))
                .and_then(Json::as_str)
                .map_or_else(|| format!("<|reserved_token_{id}|>"), str::to_string)
        })
        .collect();
    // tokenizer.json keys a special token by its text: one text for two ids, or a special
    // text that is also an ordinary token, would give other ids than tiktoken's.
    let mut seen = std::collections::HashSet::new();
    for (id, c) in (n..).zip(&contents) {
        if !seen.insert(c.as_str()) {
            return skip(format!(
                "special token {id} is named {c:?}, as another one is (added_tokens_decoder)"
            ));
        }
        if by_bytes.contains_key(c.as_bytes()) {
            return skip(format!(
                "special token {id} is named {c:?}, which is also an ordinary token of {TIKTOKEN_MODEL}"
            ));
        }
    }
    drop(by_bytes);
    let added: Vec<Json> = (n..)
        .zip(contents)
        .map(|(id, content)| {
            json!({"id": id, "content": content, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let (pre, _) = pre_tokenizer(pre_name).expect("a known pattern names a known pre-tokenizer");
    let chars = byte_chars();
    let tokenizer_json = tokenizer_json(
        &added,
        &pre,
        true,
        Vocab {
            ranks: &ranks,
            chars: &chars,
        },
        Merges {
            ranks: &ranks,
            chars: &chars,
            pairs: &merges,
        },
    );
    Ok(Some(Tiktoken::Converted {
        tokenizer_json,
        note: format!(
            "tokenizer.json written from {TIKTOKEN_MODEL} ({n} ranks, {} merges, {} special tokens; {module_file}'s split regex, llama.cpp's {pre_name})",
            merges.len(),
            specials
        ),
    }))
}

/// A token's bytes as byte-level BPE characters.
fn text(chars: &[char; 256], b: &[u8]) -> String {
    b.iter().map(|&x| chars[x as usize]).collect()
}

/// The vocabulary, serialized as tokenizer.json's `model.vocab` map (token -> rank) without
/// being held as JSON.
struct Vocab<'a> {
    ranks: &'a [Vec<u8>],
    chars: &'a [char; 256],
}

impl Serialize for Vocab<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.ranks.len()))?;
        for (rank, tok) in self.ranks.iter().enumerate() {
            m.serialize_entry(&text(self.chars, tok), &rank)?;
        }
        m.end()
    }
}

/// The merges (pairs of ranks, in priority order), serialized as `model.merges`
/// (`[left, right]` token pairs).
struct Merges<'a> {
    ranks: &'a [Vec<u8>],
    chars: &'a [char; 256],
    pairs: &'a [(u32, u32)],
}

impl Serialize for Merges<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let mut q = s.serialize_seq(Some(self.pairs.len()))?;
        for &(l, r) in self.pairs {
            let pair = [
                text(self.chars, &self.ranks[l as usize]),
                text(self.chars, &self.ranks[r as usize]),
            ];
            q.serialize_element(&pair)?;
        }
        q.end()
    }
}

/// The ranks of a tiktoken.model, in rank order (index = rank).
fn read_ranks(path: &Path) -> Result<Vec<Vec<u8>>> {
    let bytes = std::fs::read(path).map_err(|e| ConvertError::io(path, e))?;
    let text = std::str::from_utf8(&bytes).map_err(|_| config_err(path, "not UTF-8 text"))?;
    let mut by_rank: Vec<Option<Vec<u8>>> = Vec::new();
    let mut seen: HashMap<Vec<u8>, usize> = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let lineno = i + 1;
        if line.is_empty() {
            continue;
        }
        let bad = |what: String| config_err(path, format!("line {lineno}: {what}"));
        // As tiktoken's `load_tiktoken_bpe`: two fields separated by whitespace.
        let mut fields = line.split_whitespace();
        let (Some(tok), Some(rank), None) = (fields.next(), fields.next(), fields.next()) else {
            if line.trim().is_empty() {
                continue;
            }
            let shown: String = line.chars().take(60).collect();
            return Err(bad(format!(
                "{shown:?}{} is not `base64 rank`",
                if shown.len() < line.len() { "..." } else { "" }
            )));
        };
        let tok = base64::engine::general_purpose::STANDARD
            .decode(tok)
            .map_err(|e| bad(format!("{tok:?} is not base64: {e}")))?;
        let rank: usize = rank
            .parse()
            .map_err(|_| bad(format!("rank {rank:?} is not a number")))?;
        if tok.is_empty() {
            return Err(bad("an empty token".into()));
        }
        if rank > text.len() {
            return Err(bad(format!(
                "rank {rank} is larger than the file has lines"
            )));
        }
        if by_rank.len() <= rank {
            by_rank.resize(rank + 1, None);
        }
        if by_rank[rank].is_some() {
            return Err(bad(format!("rank {rank} is given twice")));
        }
        if let Some(other) = seen.insert(tok.clone(), rank) {
            return Err(bad(format!(
                "the token of rank {rank} is also rank {other}"
            )));
        }
        by_rank[rank] = Some(tok);
    }
    if by_rank.is_empty() {
        return Err(config_err(path, "no ranks"));
    }
    // A byte-level BPE holds every byte as a token (tiktoken cannot encode text with one it
    // lacks).
    let singles: std::collections::HashSet<u8> =
        seen.keys().filter(|t| t.len() == 1).map(|t| t[0]).collect();
    if let Some(b) = (0..=255u8).find(|b| !singles.contains(b)) {
        return Err(config_err(
            path,
            format!("no token is the single byte 0x{b:02x}: a byte-level BPE holds all 256 (this file is damaged or not a tiktoken vocabulary)"),
        ));
    }
    let n = by_rank.len();
    by_rank
        .into_iter()
        .enumerate()
        .map(|(r, t)| {
            t.ok_or_else(|| {
                config_err(
                    path,
                    format!("rank {r} is missing (ranks must be 0..{n}: the special tokens are numbered after the last)"),
                )
            })
        })
        .collect()
}

/// The source of class `name` in a Python module: from its `class name` line to the next line
/// that starts at the first column (another top-level statement), or the end.
fn class_body(source: &str, name: &str) -> Option<String> {
    let mut lines = source.lines().skip_while(|l| {
        let Some(rest) = l.strip_prefix("class ") else {
            return true;
        };
        let ident: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        ident != name
    });
    let head = lines.next()?;
    let mut body = vec![head];
    body.extend(lines.take_while(|l| l.is_empty() || l.starts_with([' ', '\t', '#', ')', ']'])));
    Some(body.join("\n"))
}

/// `pat_str = "|".join([ r"""a""", r"""b""", ... ])`, one raw string per line, joined with `|`.
fn pat_str(source: &str) -> Option<String> {
    let mut lines = source.lines().skip_while(|l| {
        let t: String = l.split_whitespace().collect();
        !t.starts_with("pat_str=\"|\".join(")
    });
    lines.next()?;
    let mut parts = Vec::new();
    for line in lines {
        let t = line.trim();
        if t == "[" || t.is_empty() {
            continue;
        }
        if t.starts_with(']') || t.starts_with(')') {
            break;
        }
        let lit = t.strip_suffix(',').unwrap_or(t);
        let body = lit
            .strip_prefix("r\"\"\"")
            .and_then(|s| s.strip_suffix("\"\"\""))
            .or_else(|| lit.strip_prefix("r\"").and_then(|s| s.strip_suffix('"')))?;
        parts.push(body);
    }
    (!parts.is_empty()).then(|| parts.join("|"))
}

/// How many special ids follow the ranks: `num_reserved_special_tokens = N` and the range
/// the class numbers them over, `range(num_base_tokens, num_base_tokens +
/// self.num_reserved_special_tokens)` (Kimi K3's class, N ids) or `... + 2)` (Kimi-Linear's and
/// Kimi-K2's first class, N + 2), each named `special_tokens_mapping.get(i,
/// f"<|reserved_token_{i}|>")`. None for any other rule.
fn special_count(source: &str) -> Option<usize> {
    let n: usize = source.lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        (k.trim() == "num_reserved_special_tokens").then(|| v.trim().parse().ok())?
    })?;
    let compact: String = source.chars().filter(|c| !c.is_whitespace()).collect();
    if !compact.contains("special_tokens_mapping.get(i,f\"<|reserved_token_{i}|>\")") {
        return None;
    }
    let head = "range(num_base_tokens,num_base_tokens+self.num_reserved_special_tokens";
    let rest = &compact[compact.find(head)? + head.len()..];
    if rest.starts_with(")") || rest.starts_with(",)") {
        Some(n)
    } else if rest.starts_with("+2)") || rest.starts_with("+2,)") {
        Some(n + 2)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_pattern_and_the_reserved_count_from_the_module_source() {
        let src = "class T:\n    num_reserved_special_tokens = 256\n\n    pat_str = \"|\".join(\n        [\n            r\"\"\"a+\"\"\",\n            r\"\"\"\\s+\"\"\",\n        ]\n    )\n";
        assert_eq!(pat_str(src).as_deref(), Some("a+|\\s+"));
        assert_eq!(special_count(src), None, "no numbering rule");
        let rule = "        return {\n            special_tokens_mapping.get(i, f\"<|reserved_token_{i}|>\"): i\n            for i in range(\n                num_base_tokens, num_base_tokens + self.num_reserved_special_tokens + 2\n            )\n        }\n";
        let k2 = format!("{src}{rule}");
        assert_eq!(special_count(&k2), Some(258));
        assert_eq!(special_count(&k2.replace(" + 2\n", "\n")), Some(256));
        assert_eq!(special_count(&k2.replace(" + 2\n", " + 3\n")), None);
        assert_eq!(pat_str("pat_str = \"x\"\n"), None);
        // A line that is not a raw string literal (a variable, a call) is not guessed at.
        assert_eq!(
            pat_str("pat_str = \"|\".join(\n [\n  PIECE,\n ]\n)\n"),
            None
        );
    }
}
