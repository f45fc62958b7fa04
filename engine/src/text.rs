//! Text: the store's tokenizer (`tokenizer.json` through the `tokenizers` crate), the chat
//! template (rendered with minijinja configured like transformers' `apply_chat_template`), and a
//! streaming decoder that never emits a UTF-8 character split across tokens.

use crate::error::{store_err, EngineError, Result};
use coli_store::Store;
use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error as JinjaError, ErrorKind};
use serde_json::Value as Json;

/// One chat message, as transformers' chat templates read it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text.
    pub content: String,
    /// An assistant's tool calls, each `{"id", "type": "function", "function": {"name",
    /// "arguments"}}` with the arguments a JSON object (as transformers documents them for
    /// templates; absent from the rendered message when empty).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<Json>,
    /// A `tool` message: the id of the call it answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A `tool` message: the name of the function that produced it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    /// A message with `role` and `content`.
    pub fn new(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
        }
    }
}

/// The special-token names transformers passes to chat templates (`SPECIAL_TOKENS_ATTRIBUTES`).
const SPECIAL_TOKEN_NAMES: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// A chat template with the special-token strings it may refer to.
#[derive(Clone, Debug)]
pub struct ChatTemplate {
    /// Jinja source (empty for [`ChatTemplate::xtml`]).
    pub source: String,
    /// `(name, content)` of the named special tokens of tokenizer_config.json.
    pub special_tokens: Vec<(String, String)>,
    /// Kimi K3's XTML format ([`crate::xtml`]) instead of Jinja: rendered as segments, each
    /// marker one special token and every text segment ordinary text.
    pub xtml: bool,
}

/// transformers' `tojson` filter: `json.dumps(x, ensure_ascii=False, indent=indent,
/// separators=separators, sort_keys=sort_keys)` (Python's separators and escapes).
fn tojson_filter(value: Value, kwargs: Kwargs) -> std::result::Result<Value, JinjaError> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let (item, key) = match separators {
        Some(s) if s.len() == 2 => (s[0].clone(), s[1].clone()),
        _ => (
            if indent.is_some() { "," } else { ", " }.to_string(),
            ": ".to_string(),
        ),
    };
    let opts = PyJson {
        indent,
        sort_keys: sort_keys.unwrap_or(false),
        ascii: ensure_ascii.unwrap_or(false),
        item,
        key,
    };
    let mut out = String::new();
    opts.write(&value, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

/// The byte offset in `s` of its longest tail that is a proper prefix of `tag`: text from there
/// on may still become `tag` as more streams in, so a streaming splitter holds it back.
pub fn hold_from(s: &str, tag: &str) -> usize {
    s.char_indices()
        .map(|(i, _)| i)
        .find(|&i| tag.starts_with(&s[i..]) && s.len() - i < tag.len())
        .unwrap_or(s.len())
}

/// Jinja2's `iterable` test (`iter(value)` succeeds): strings, lists, mappings and iterators, but
/// not none or undefined (minijinja's own test says yes to none, which breaks templates such as
/// Qwen3-Coder's `tools is iterable and tools | length > 0` when no tools are given).
fn iterable_test(value: Value) -> bool {
    use minijinja::value::ValueKind;
    matches!(
        value.kind(),
        ValueKind::String
            | ValueKind::Bytes
            | ValueKind::Seq
            | ValueKind::Map
            | ValueKind::Iterable
    )
}

struct PyJson {
    indent: Option<usize>,
    sort_keys: bool,
    ascii: bool,
    item: String,
    key: String,
}

impl PyJson {
    fn write_str(&self, s: &str, out: &mut String) {
        out.push('"');
        for ch in s.chars() {
            match ch {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{08}' => out.push_str("\\b"),
                '\u{0c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ascii && (c as u32) > 0x7e) => {
                    let mut buf = [0u16; 2];
                    for u in c.encode_utf16(&mut buf) {
                        out.push_str(&format!("\\u{u:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }

    fn newline(&self, depth: usize, out: &mut String) {
        if let Some(n) = self.indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    }

    fn write(
        &self,
        v: &Value,
        depth: usize,
        out: &mut String,
    ) -> std::result::Result<(), JinjaError> {
        use minijinja::value::ValueKind;
        if depth > MAX_VALUE_DEPTH {
            // Python's json raises "Circular reference detected" for a cycle.
            return Err(too_deep());
        }
        match v.kind() {
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number => {
                if v.is_integer() {
                    out.push_str(&v.to_string());
                } else {
                    let f = f64::try_from(v.clone())?;
                    if f.is_finite() {
                        out.push_str(&format!("{f:?}"));
                    } else if f.is_nan() {
                        out.push_str("NaN");
                    } else {
                        out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
                    }
                }
            }
            ValueKind::String => self.write_str(v.as_str().unwrap_or_default(), out),
            ValueKind::Map => {
                let mut keys: Vec<Value> = v.try_iter()?.collect();
                if keys.is_empty() {
                    out.push_str("{}");
                    return Ok(());
                }
                if self.sort_keys {
                    keys.sort_by_key(|k| k.to_string());
                }
                out.push('{');
                for (i, k) in keys.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item);
                    }
                    self.newline(depth + 1, out);
                    self.write_str(&k.to_string(), out);
                    out.push_str(&self.key);
                    self.write(&v.get_item(k)?, depth + 1, out)?;
                }
                self.newline(depth, out);
                out.push('}');
            }
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                if items.is_empty() {
                    out.push_str("[]");
                    return Ok(());
                }
                out.push('[');
                for (i, x) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item);
                    }
                    self.newline(depth + 1, out);
                    self.write(x, depth + 1, out)?;
                }
                self.newline(depth, out);
                out.push(']');
            }
            _ => self.write_str(&v.to_string(), out),
        }
        Ok(())
    }
}

fn raise_exception(msg: String) -> std::result::Result<Value, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
}

/// transformers' `strftime_now(format)` (`datetime.now().strftime(format)`): the local time
/// now, formatted with strftime specifiers (chrono's, a superset of the common Python ones;
/// gpt-oss's template writes `Current date: {strftime_now("%Y-%m-%d")}`).
fn strftime_now(format: String) -> std::result::Result<Value, JinjaError> {
    use chrono::format::{Item, StrftimeItems};
    let items: Vec<Item<'_>> = StrftimeItems::new(&format).collect();
    if items.iter().any(|i| matches!(i, Item::Error)) {
        return Err(JinjaError::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: {format:?} is not a strftime format"),
        ));
    }
    let now = chrono::Local::now();
    Ok(Value::from(
        now.format_with_items(items.into_iter()).to_string(),
    ))
}

/// Deepest nesting of maps and lists a template may print or serialize. A template can make
/// a value that contains itself (`{% set ns.x = ns %}`); minijinja 2.24 prints such a value by
/// recursing without end, a stack overflow that aborts the process (found by
/// tests/tests/fuzz_parsers.rs), so coli checks the depth first.
const MAX_VALUE_DEPTH: usize = 64;

fn too_deep() -> JinjaError {
    JinjaError::new(
        minijinja::ErrorKind::InvalidOperation,
        format!("a value nested more than {MAX_VALUE_DEPTH} levels deep (does it contain itself?)"),
    )
}

/// Whether `v` nests maps or lists more than `MAX_VALUE_DEPTH - depth` levels below it.
fn nested_too_deep(v: &Value, depth: usize) -> bool {
    use minijinja::value::ValueKind;
    if depth > MAX_VALUE_DEPTH {
        return true;
    }
    match v.kind() {
        ValueKind::Map => v.try_iter().is_ok_and(|keys| {
            keys.into_iter()
                .any(|k| v.get_item(&k).is_ok_and(|x| nested_too_deep(&x, depth + 1)))
        }),
        ValueKind::Seq => v
            .try_iter()
            .is_ok_and(|mut items| items.any(|x| nested_too_deep(&x, depth + 1))),
        _ => false,
    }
}

/// minijinja's default output formatter, after [`nested_too_deep`] for maps and lists.
fn bounded_formatter(
    out: &mut minijinja::Output,
    state: &minijinja::State,
    v: &Value,
) -> std::result::Result<(), JinjaError> {
    use minijinja::value::ValueKind;
    if matches!(v.kind(), ValueKind::Map | ValueKind::Seq) && nested_too_deep(v, 0) {
        return Err(too_deep());
    }
    minijinja::escape_formatter(out, state, v)
}

/// A template error with the template line it points at. Not minijinja's alternate (`{:#}`)
/// form: its source excerpt underflows on some spans of damaged templates (minijinja 2.24
/// `debug.rs`, `end_col - start_col`), a panic in a checked build and a huge allocation in a
/// release one (found by tests/tests/fuzz_parsers.rs).
fn template_error(e: &minijinja::Error, source: &str) -> EngineError {
    let mut msg = e.to_string();
    if let Some(text) = e.line().and_then(|l| source.lines().nth(l.checked_sub(1)?)) {
        let text = text.trim();
        let cut = (0..=text.len().min(160))
            .rev()
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(0);
        msg.push_str(&format!(
            ": `{}`{}",
            &text[..cut],
            if cut < text.len() { "..." } else { "" }
        ));
    }
    EngineError::Template(msg)
}

/// Kimi K3's segments of a conversation with the options its tokenizer passes by default
/// (thinking, effort `max`).
fn xtml_segments(
    messages: &[ChatMessage],
    tools: Option<&[Json]>,
    add_generation_prompt: bool,
) -> Result<Vec<crate::xtml::Segment>> {
    crate::xtml::segments(
        messages,
        tools,
        add_generation_prompt,
        &crate::xtml::XtmlOptions::default(),
    )
}

impl ChatTemplate {
    /// Kimi K3's chat format ([`crate::xtml`], the release's `encoding_k3.py`), which K3 ships
    /// instead of a Jinja template.
    pub fn xtml() -> ChatTemplate {
        ChatTemplate {
            source: String::new(),
            special_tokens: Vec::new(),
            xtml: true,
        }
    }

    /// Renders `messages` as transformers' `apply_chat_template(messages, tokenize=False,
    /// add_generation_prompt=...)`: Jinja with `trim_blocks` and `lstrip_blocks`, the
    /// `raise_exception` and `strftime_now` functions, Python string methods (pycompat), the Python-style `tojson`
    /// filter, the named special tokens as variables, `tools` and `documents` set to none.
    ///
    /// # Errors
    /// [`EngineError::Template`] for a syntax error or a `raise_exception` call.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_with_tools(messages, add_generation_prompt, None)
    }

    /// Whether the template renders tool definitions itself (its source reads `tools`; XTML
    /// does).
    pub fn has_tools_branch(&self) -> bool {
        self.xtml || self.source.contains("tools")
    }

    /// Whether the template renders assistant tool calls itself (its source reads
    /// `tool_calls`; XTML does).
    pub fn reads_tool_calls(&self) -> bool {
        self.xtml || self.source.contains("tool_calls")
    }

    /// [`ChatTemplate::render`] with `tools` (OpenAI-shaped tool objects, `{"type":
    /// "function", "function": {"name", "description", "parameters"}}`) passed as
    /// `apply_chat_template(..., tools=tools)` passes them; None renders them as none.
    ///
    /// # Errors
    /// As [`ChatTemplate::render`].
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        tools: Option<&[Json]>,
    ) -> Result<String> {
        if self.xtml {
            let segs = xtml_segments(messages, tools, add_generation_prompt)?;
            return Ok(segs.into_iter().map(|s| s.text).collect());
        }
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson_filter);
        env.add_test("iterable", iterable_test);
        env.set_formatter(bounded_formatter);
        let tmpl = env
            .template_from_str(&self.source)
            .map_err(|e| template_error(&e, &self.source))?;
        let mut ctx: std::collections::BTreeMap<String, Value> = std::collections::BTreeMap::new();
        for (k, v) in &self.special_tokens {
            ctx.insert(k.clone(), Value::from(v.clone()));
        }
        ctx.insert("messages".into(), Value::from_serialize(messages));
        ctx.insert(
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt),
        );
        ctx.insert(
            "tools".into(),
            match tools {
                Some(t) if !t.is_empty() => Value::from_serialize(t),
                _ => Value::from(()),
            },
        );
        ctx.insert("documents".into(), Value::from(()));
        tmpl.render(Value::from(ctx))
            .map_err(|e| template_error(&e, &self.source))
    }
}

/// The store's tokenizer and chat template.
pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    /// `inner` with special tokens encoded as text ([`TextTokenizer::encode_segments`]), made
    /// on first use.
    plain: std::sync::OnceLock<tokenizers::Tokenizer>,
    /// tokenizer.json as read (the token bytes for constrained decoding, [`crate::constrain`]).
    json: Vec<u8>,
    /// The chat template, when the store has one.
    pub chat_template: Option<ChatTemplate>,
}

fn special_token_content(v: &Json) -> Option<String> {
    match v {
        Json::String(s) => Some(s.clone()),
        Json::Object(m) => m.get("content").and_then(Json::as_str).map(str::to_string),
        _ => None,
    }
}

/// llama.cpp's Jinja port of DeepSeek-V3.2's prompt encoder (`models/templates/
/// deepseek-ai-DeepSeek-V3.2.jinja`, as vendored by the llama-cpp-python 0.3.36 sdist on PyPI;
/// MIT license). The release publishes its encoder as Python code (`encoding/encoding_dsv32.py`)
/// and no chat template; tests/tests/engine_chat_template.rs checks that this renders as
/// transformers renders it.
pub const DEEPSEEK_V32_CHAT_TEMPLATE: &str = include_str!("templates/deepseek-v3.2.jinja");

/// The chat template coli uses for a store of `family` whose checkpoint ships none: DeepSeek-V3.2
/// ([`DEEPSEEK_V32_CHAT_TEMPLATE`]); `None` for every other family (their releases ship one).
pub fn builtin_chat_template(family: &str) -> Option<&'static str> {
    (family == "deepseek_v32").then_some(DEEPSEEK_V32_CHAT_TEMPLATE)
}

impl TextTokenizer {
    /// Builds a tokenizer from `tokenizer.json` bytes and, optionally, `tokenizer_config.json`
    /// and `chat_template.jinja` contents (the .jinja file wins over the config's
    /// `chat_template`, as in transformers 5).
    ///
    /// # Errors
    /// [`EngineError::Tokenizer`] when tokenizer.json does not parse; [`EngineError::Config`] for
    /// a tokenizer_config.json that is not JSON.
    pub fn from_parts(
        tokenizer_json: &[u8],
        tokenizer_config: Option<&[u8]>,
        jinja: Option<&str>,
    ) -> Result<TextTokenizer> {
        Self::build(tokenizer_json, tokenizer_config, jinja, None)
    }

    /// [`TextTokenizer::from_parts`] with a template to use when neither the .jinja file nor
    /// the config has one (the family's built-in one).
    fn build(
        tokenizer_json: &[u8],
        tokenizer_config: Option<&[u8]>,
        jinja: Option<&str>,
        fallback: Option<&str>,
    ) -> Result<TextTokenizer> {
        let inner = tokenizers::Tokenizer::from_bytes(tokenizer_json)
            .map_err(|e| EngineError::Tokenizer(format!("tokenizer.json: {e}")))?;
        let cfg: Json = match tokenizer_config {
            Some(b) => serde_json::from_slice(b).map_err(|e| EngineError::Config {
                file: "tokenizer_config.json".into(),
                what: format!("not valid JSON: {e}"),
            })?,
            None => Json::Null,
        };
        let special_tokens = SPECIAL_TOKEN_NAMES
            .iter()
            .filter_map(|n| {
                cfg.get(*n)
                    .and_then(special_token_content)
                    .map(|c| (n.to_string(), c))
            })
            .collect();
        let from_cfg = match cfg.get("chat_template") {
            Some(Json::String(s)) => Some(s.clone()),
            Some(Json::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
                .and_then(|t| t.get("template").and_then(Json::as_str))
                .map(str::to_string),
            _ => None,
        };
        let source = jinja
            .map(str::to_string)
            .or(from_cfg)
            .or(fallback.map(str::to_string));
        Ok(TextTokenizer {
            inner,
            json: tokenizer_json.to_vec(),
            plain: std::sync::OnceLock::new(),
            chat_template: source.map(|source| ChatTemplate {
                source,
                special_tokens,
                xtml: false,
            }),
        })
    }

    /// Loads the tokenizer of `store` (`files/tokenizer.json`, `tokenizer_config.json`,
    /// `chat_template.jinja`); `Ok(None)` when the store has no tokenizer.json. A store without
    /// a chat template gets its family's built-in one where there is one
    /// ([`builtin_chat_template`]: DeepSeek-V3.2), and a Kimi K3 store K3's own format
    /// ([`ChatTemplate::xtml`]).
    ///
    /// # Errors
    /// Store read errors, unparsable files.
    pub fn from_store(store: &Store) -> Result<Option<TextTokenizer>> {
        let read = |name: &str| {
            store
                .file(name)
                .map_err(store_err(format!("reading {name}")))
        };
        let Some(tok) = read("tokenizer.json")? else {
            return Ok(None);
        };
        let cfg = read("tokenizer_config.json")?;
        let jinja = read("chat_template.jinja")?
            .map(|b| {
                String::from_utf8(b)
                    .map_err(|_| EngineError::Template("chat_template.jinja is not UTF-8".into()))
            })
            .transpose()?;
        let family = &store.manifest().family;
        let builtin = builtin_chat_template(family);
        let mut t = Self::build(&tok, cfg.as_deref(), jinja.as_deref(), builtin)?;
        let k3 = store.manifest().config["model_type"].as_str() == Some("kimi_k3");
        if t.chat_template.is_none() && k3 {
            // K3 ships its chat format as Python (`encoding_k3.py`), no template (its store's
            // family is its language model's, `kimi_linear`: the config says K3).
            t.chat_template = Some(ChatTemplate::xtml());
        }
        Ok(Some(t))
    }

    /// Token ids of rendered segments ([`crate::xtml::Segment`]), each encoded on its own as
    /// K3's tokenizer does: a marker is the one special token of its text
    /// (`encode(text, allowed_special="all")`), every other segment ordinary text in which
    /// special-token strings are text (`encode(text, disallowed_special=())`).
    ///
    /// # Errors
    /// [`EngineError::Tokenizer`]: a marker the vocabulary has no token for.
    pub fn encode_segments(&self, segments: &[crate::xtml::Segment]) -> Result<Vec<u32>> {
        let plain = self.plain.get_or_init(|| {
            let mut t = self.inner.clone();
            t.set_encode_special_tokens(true);
            t
        });
        let mut ids = Vec::new();
        for s in segments {
            if s.special {
                ids.push(self.inner.token_to_id(&s.text).ok_or_else(|| {
                    EngineError::Tokenizer(format!(
                        "the vocabulary has no token {:?}, which Kimi K3's chat format needs",
                        s.text
                    ))
                })?);
            } else {
                let enc = plain
                    .encode(s.text.as_str(), false)
                    .map_err(|e| EngineError::Tokenizer(e.to_string()))?;
                ids.extend_from_slice(enc.get_ids());
            }
        }
        Ok(ids)
    }

    /// Token ids of `text`; `add_special_tokens` applies the tokenizer's post-processor (e.g. BOS),
    /// as transformers' `tokenizer(text)`.
    ///
    /// # Errors
    /// [`EngineError::Tokenizer`].
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(|e| EngineError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids`.
    ///
    /// # Errors
    /// [`EngineError::Tokenizer`] (e.g. an id outside the vocabulary).
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| EngineError::Tokenizer(e.to_string()))
    }

    /// The id of token `token` (added and special tokens included), or `None` when the
    /// vocabulary has no such token.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// tokenizer.json's bytes.
    pub fn json(&self) -> &[u8] {
        &self.json
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Renders `messages` with the chat template and tokenizes the result without adding special
    /// tokens (as transformers' `apply_chat_template(tokenize=True)`).
    ///
    /// # Errors
    /// [`EngineError::Template`] when the store has no chat template or rendering fails.
    pub fn chat_ids(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<(String, Vec<u32>)> {
        self.chat_ids_with_tools(messages, add_generation_prompt, None)
    }

    /// [`TextTokenizer::chat_ids`] with `tools` ([`ChatTemplate::render_with_tools`]).
    ///
    /// # Errors
    /// As [`TextTokenizer::chat_ids`].
    pub fn chat_ids_with_tools(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        tools: Option<&[Json]>,
    ) -> Result<(String, Vec<u32>)> {
        let t = self.chat_template.as_ref().ok_or_else(|| {
            EngineError::Template(
                "the store has no chat template (tokenizer_config.json or chat_template.jinja)"
                    .into(),
            )
        })?;
        if t.xtml {
            let segs = xtml_segments(messages, tools, add_generation_prompt)?;
            let ids = self.encode_segments(&segs)?;
            return Ok((segs.into_iter().map(|s| s.text).collect(), ids));
        }
        let text = t.render_with_tools(messages, add_generation_prompt, tools)?;
        let ids = self.encode(&text, false)?;
        Ok((text, ids))
    }
}

/// Incremental detokenizer for streaming: decodes all ids so far and releases the new suffix
/// only when it does not end in U+FFFD (an incomplete UTF-8 sequence), so a character split
/// across tokens is printed whole.
#[derive(Default)]
pub struct StreamDecoder {
    ids: Vec<u32>,
    printed: usize,
}

impl StreamDecoder {
    /// An empty decoder.
    pub fn new() -> StreamDecoder {
        StreamDecoder::default()
    }

    fn release(&mut self, text: &str, final_flush: bool) -> String {
        if text.len() <= self.printed || !text.is_char_boundary(self.printed) {
            return String::new();
        }
        if !final_flush && text.ends_with('\u{FFFD}') {
            return String::new();
        }
        let s = text[self.printed..].to_string();
        self.printed = text.len();
        s
    }

    /// Adds `id`; returns the text that became complete (possibly empty).
    ///
    /// # Errors
    /// [`EngineError::Tokenizer`].
    pub fn push(&mut self, tok: &TextTokenizer, id: u32) -> Result<String> {
        self.ids.push(id);
        let text = tok.decode(&self.ids, true)?;
        Ok(self.release(&text, false))
    }

    /// Returns whatever is still held back (at the end of generation).
    ///
    /// # Errors
    /// [`EngineError::Tokenizer`].
    pub fn finish(&mut self, tok: &TextTokenizer) -> Result<String> {
        let text = tok.decode(&self.ids, true)?;
        Ok(self.release(&text, true))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// GPT-2's bytes_to_unicode: the printable stand-in character of each byte.
    fn byte_char(b: u8) -> char {
        let printable = |c: u32| {
            (33..=126).contains(&c) || (161..=172).contains(&c) || (174..=255).contains(&c)
        };
        if printable(b as u32) {
            return char::from_u32(b as u32).unwrap();
        }
        let mut n = 0;
        for c in 0..256u32 {
            if !printable(c) {
                if c == b as u32 {
                    return char::from_u32(256 + n).unwrap();
                }
                n += 1;
            }
        }
        unreachable!()
    }

    /// A byte-level BPE tokenizer whose token i is byte i (no merges).
    fn byte_tokenizer() -> TextTokenizer {
        byte_tokenizer_with(&[])
    }

    /// [`byte_tokenizer`] plus special tokens `special[k]` with ids `256 + k`.
    pub(crate) fn byte_tokenizer_with(special: &[&str]) -> TextTokenizer {
        let vocab: serde_json::Map<String, Json> = (0..=255u8)
            .map(|b| (byte_char(b).to_string(), Json::from(b as u32)))
            .collect();
        let added: Vec<Json> = special
            .iter()
            .enumerate()
            .map(|(k, t)| {
                serde_json::json!({"id": 256 + k, "content": t, "single_word": false,
                    "lstrip": false, "rstrip": false, "normalized": false, "special": true})
            })
            .collect();
        let json = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
            "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                      "vocab": vocab, "merges": []}
        });
        TextTokenizer::from_parts(json.to_string().as_bytes(), None, None).unwrap()
    }

    /// A value that contains itself (a damaged template's `{% set ns.x = ns %}`) printed or
    /// serialized is an error, not an endless recursion (found by the fuzzing in
    /// tests/tests/fuzz_parsers.rs); deep but finite values still print.
    #[test]
    fn a_value_that_contains_itself_is_an_error() {
        let t = |source: &str| ChatTemplate {
            source: source.into(),
            special_tokens: vec![],
            xtml: false,
        };
        let msgs = [ChatMessage::new("user", "hi")];
        for s in [
            "{% set ns = namespace(x=1) %}{% set ns.x = ns %}{{ ns.x }}",
            "{% set ns = namespace(x=1) %}{% set ns.x = ns %}{{ ns | tojson }}",
            "{% set ns = namespace(x=[]) %}{% set ns.x = [ns] %}{{ ns.x }}",
        ] {
            let e = t(s).render(&msgs, true).unwrap_err().to_string();
            assert!(e.contains("contain itself"), "{s}: {e}");
        }
        let ok =
            t("{% set ns = namespace(x={'a': [1, {'b': 2}]}) %}{{ ns.x }} {{ ns.x | tojson }}")
                .render(&msgs, true)
                .unwrap();
        assert_eq!(ok, r#"{"a": [1, {"b": 2}]} {"a": [1, {"b": 2}]}"#);
    }

    /// A damaged template whose error span ends before it starts (8 bytes cut from
    /// DeepSeek-V3.1's template at byte 424, found by the fuzzing in
    /// tests/tests/fuzz_parsers.rs) is an error naming the line, not a panic in the error's
    /// formatting.
    #[test]
    fn a_damaged_template_is_an_error_naming_its_line() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/chat_templates/deepseek-v3.1.jinja");
        let b = std::fs::read(path).unwrap();
        let mut d = b[..424].to_vec();
        d.extend_from_slice(&b[432..]);
        let t = ChatTemplate {
            source: String::from_utf8(d).unwrap(),
            special_tokens: vec![],
            xtml: false,
        };
        let e = t
            .render(&[ChatMessage::new("user", "hi")], true)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(":12)") && e.contains("`{%- for in messages -%}`"),
            "{e}"
        );
    }

    /// A template that recurses without end (a damaged base case), or nests deeply, is an
    /// error, never a stack overflow, even on a thread with a small stack (minijinja's
    /// recursion limit, with its `stacker` feature growing the stack where the limit's depth
    /// needs more). Found by tests/tests/fuzz_parsers.rs on damaged release templates.
    #[test]
    fn runaway_recursion_is_an_error_not_a_crash() {
        let h = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(|| {
                let t = |source: &str| ChatTemplate {
                    source: source.into(),
                    special_tokens: vec![],
                    xtml: false,
                };
                let msgs = [ChatMessage::new("user", "hi")];
                let r = t("{% macro m(x) %}{{ m(x) }}{% endmacro %}{{ m(1) }}").render(&msgs, true);
                assert!(r.is_err(), "{r:?}");
                let deep = format!("{{{{ {}1{} }}}}", "(".repeat(140), ")".repeat(140));
                let _ = t(&deep).render(&msgs, true);
                let r = t("{% for m in messages %}{% include 'self' %}{% endfor %}")
                    .render(&msgs, true);
                assert!(r.is_err());
            })
            .unwrap();
        h.join().expect("no stack overflow");
    }

    #[test]
    fn strftime_now_formats_the_current_date() {
        let t = ChatTemplate {
            source: "Current date: {{ strftime_now(\"%Y-%m-%d\") }}".into(),
            special_tokens: vec![],
            xtml: false,
        };
        let before = std::time::SystemTime::now();
        let out = t.render(&[], false).unwrap();
        let date = out.strip_prefix("Current date: ").expect(&out);
        let parts: Vec<u32> = date.split('-').map(|p| p.parse().expect(date)).collect();
        assert_eq!(parts.len(), 3, "{date}");
        assert!(date.len() == 10 && (1..=12).contains(&parts[1]) && (1..=31).contains(&parts[2]));
        // The year agrees with the clock (within a day of a year boundary either way).
        let secs = before
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let year = 1970.0 + secs as f64 / (365.2425 * 86400.0);
        assert!((parts[0] as f64 - year).abs() < 1.01, "{date} vs {year}");
        let bad = ChatTemplate {
            source: "{{ strftime_now(\"%Q\") }}".into(),
            special_tokens: vec![],
            xtml: false,
        };
        let e = bad.render(&[], false).unwrap_err().to_string();
        assert!(e.contains("not a strftime format"), "{e}");
    }

    #[test]
    fn streaming_never_splits_a_character() {
        let tok = byte_tokenizer();
        let text = "héllo → 世界 🎉!";
        let ids = tok.encode(text, false).unwrap();
        assert_eq!(ids.len(), text.len(), "one token per byte");
        let mut d = StreamDecoder::new();
        let mut out = String::new();
        let mut pieces = 0;
        for &id in &ids {
            let s = d.push(&tok, id).unwrap();
            assert!(!s.contains('\u{FFFD}'), "emitted a broken character: {s:?}");
            if !s.is_empty() {
                pieces += 1;
            }
            out.push_str(&s);
        }
        out.push_str(&d.finish(&tok).unwrap());
        assert_eq!(out, text);
        assert_eq!(pieces, text.chars().count());
    }

    #[test]
    fn streaming_flushes_a_truncated_character_at_the_end() {
        let tok = byte_tokenizer();
        let mut d = StreamDecoder::new();
        assert_eq!(d.push(&tok, b'a' as u32).unwrap(), "a");
        assert_eq!(d.push(&tok, 0xE4).unwrap(), "");
        assert_eq!(d.finish(&tok).unwrap(), "\u{FFFD}");
    }

    #[test]
    fn template_like_transformers() {
        let t = ChatTemplate {
            source: "{% for m in messages %}\n  {% if m['role'] == 'bad' %}{{ raise_exception('bad role') }}{% endif %}\n{{ bos_token + m['role'] | upper }}:{{ m['content'].strip() }}|{{ m | tojson }}\n{% endfor %}{% if add_generation_prompt %}A:{% endif %}".into(),
            special_tokens: vec![("bos_token".into(), "<s>".into())],
            xtml: false,
        };
        let s = t
            .render(&[ChatMessage::new("user", " hi é ")], true)
            .unwrap();
        assert_eq!(
            s,
            "<s>USER:hi é|{\"role\": \"user\", \"content\": \" hi é \"}\nA:"
        );
        let e = t
            .render(&[ChatMessage::new("bad", "x")], false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("bad role"), "{e}");
    }

    #[test]
    fn py_json_indent_and_escapes() {
        let v = Value::from_serialize(
            serde_json::json!({"b": {}, "a": [1, 2.5, "x\n\"y\"", null, true]}),
        );
        let o = PyJson {
            indent: Some(2),
            sort_keys: true,
            ascii: false,
            item: ",".into(),
            key: ": ".into(),
        };
        let mut s = String::new();
        o.write(&v, 0, &mut s).unwrap();
        assert_eq!(s, "{\n  \"a\": [\n    1,\n    2.5,\n    \"x\\n\\\"y\\\"\",\n    null,\n    true\n  ],\n  \"b\": {}\n}");
    }
}
