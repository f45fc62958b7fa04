//! Kimi K3's chat format: XTML segments, as the release's `encoding_k3.py`
//! (`build_chat_segments`) renders a conversation and its tokenizer encodes it.
//!
//! K3 publishes no Jinja chat template: its prompt is a list of segments, each either a
//! structural marker (`<|open|>`, `<|close|>`, `<|sep|>`, `<|end_of_msg|>`: one special token
//! each) or text (tag names, attribute pieces, message bodies) encoded as ordinary text, so that
//! a special-token string inside user text never becomes a special token. A tag is
//! `<|open|>name key="value"...<|sep|>`, each of ` key`, `="`, the value (`&` and `"` escaped)
//! and `"` its own text segment; `<|close|>name<|sep|>` closes it. The order: the tools (a
//! system message of type `tool-declare` with their JSON, keys sorted, compact), the thinking
//! effort note (thinking mode with an effort: `low`, `high` or `max`; K3's tokenizer passes `max`
//! by default), the messages (user / system with an optional name; assistant with a `think`
//! channel in thinking mode, its `response` and its `tools` calls, each argument a tag with its
//! JSON type and value; tool results with the tool's name and 1-based index), the tool-choice and
//! response-format notes, and the opening of the assistant's turn (`think` in thinking mode,
//! else `response`). Tool results are put in the order of the calls they answer (by
//! `tool_call_id`) when every one of a run matches, as `normalize_xtml_tool_result_messages`
//! does. Images are not supported (coli's messages are text).
//!
//! The oracle is that file itself (vendored in tests/fixtures/oracle/kimi_k3/, with tiktoken
//! encoding each segment): tests/tests/chat_k3.rs.

use crate::error::{EngineError, Result};
use crate::text::ChatMessage;
use serde_json::Value as Json;

const OPEN: &str = "<|open|>";
const CLOSE: &str = "<|close|>";
const SEP: &str = "<|sep|>";
const END_OF_MSG: &str = "<|end_of_msg|>";

/// One piece of a rendered prompt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Its text.
    pub text: String,
    /// A structural marker: one special token (`allow_special` in the release's code); else
    /// ordinary text, special-token strings in it encoded as text.
    pub special: bool,
}

/// The rendering options of `build_chat_segments` coli passes.
#[derive(Clone, Debug, PartialEq)]
pub struct XtmlOptions {
    /// Thinking mode (the release's default): assistant turns carry a `think` channel and the
    /// generation prompt opens one.
    pub thinking: bool,
    /// `low`, `high` or `max` (K3's tokenizer passes `max` when none is given); None: no note.
    pub thinking_effort: Option<String>,
    /// `required` or `none` add a note; anything else none.
    pub tool_choice: Option<String>,
    /// `{"type": "json_object"}` or `{"type": "json_schema", "json_schema": {"schema": ...}}`
    /// add a note.
    pub response_format: Option<Json>,
}

impl Default for XtmlOptions {
    fn default() -> XtmlOptions {
        XtmlOptions {
            thinking: true,
            thinking_effort: Some("max".into()),
            tool_choice: None,
            response_format: None,
        }
    }
}

fn control(out: &mut Vec<Segment>, s: &str) {
    out.push(Segment {
        text: s.into(),
        special: true,
    });
}

fn text(out: &mut Vec<Segment>, s: &str) {
    if !s.is_empty() {
        out.push(Segment {
            text: s.into(),
            special: false,
        });
    }
}

fn open_tag(out: &mut Vec<Segment>, tag: &str, attrs: &[(&str, String)]) {
    control(out, OPEN);
    text(out, tag);
    for (k, v) in attrs {
        text(out, &format!(" {k}"));
        text(out, "=\"");
        text(out, &v.replace('&', "&amp;").replace('"', "&quot;"));
        text(out, "\"");
    }
    control(out, SEP);
}

fn close_tag(out: &mut Vec<Segment>, tag: &str) {
    control(out, CLOSE);
    text(out, tag);
    control(out, SEP);
}

fn system_note(out: &mut Vec<Segment>, kind: &str, body: &str) {
    open_tag(
        out,
        "message",
        &[("role", "system".into()), ("type", kind.into())],
    );
    text(out, py_strip(body));
    close_tag(out, "message");
    control(out, END_OF_MSG);
}

/// Python's `repr` of a float (what `json.dumps` writes): the shortest digits that round-trip,
/// fixed notation for decimal exponents -4 to 15 (with `.0` when integral), else `d.ddde+XX`
/// with a signed exponent of at least two digits.
fn py_float(x: f64) -> String {
    if x == 0.0 {
        return if x.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    // Rust's `{:e}` is the shortest round-trip digits too: `d.ddd` and the exponent.
    let s = format!("{:e}", x.abs());
    let (mant, exp) = s.split_once('e').expect("an exponent");
    let exp: i32 = exp.parse().expect("an integer exponent");
    let digits: String = mant.chars().filter(|&c| c != '.').collect();
    let out = if (-4..16).contains(&exp) {
        if exp >= 0 {
            let whole = exp as usize + 1;
            if digits.len() <= whole {
                format!("{digits}{}.0", "0".repeat(whole - digits.len()))
            } else {
                format!("{}.{}", &digits[..whole], &digits[whole..])
            }
        } else {
            format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
        }
    } else {
        let m = if digits.len() == 1 {
            digits
        } else {
            format!("{}.{}", &digits[..1], &digits[1..])
        };
        format!("{m}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs())
    };
    if x < 0.0 {
        format!("-{out}")
    } else {
        out
    }
}

/// Python's `str.strip()`: Unicode white space and the separators U+001C..U+001F.
fn py_strip(s: &str) -> &str {
    s.trim_matches(|c: char| c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c))
}

/// Python's `json.dumps(v, ensure_ascii=False, separators=(item, key))`: serde_json's string
/// escapes are Python's; floats as Python writes them ([`py_float`]); integers beyond 64 bits
/// (which serde_json reads as floats) are not Python's.
fn py_json(v: &Json, item: &str, key: &str) -> String {
    match v {
        Json::Object(m) => {
            let parts: Vec<String> = m
                .iter()
                .map(|(k, x)| format!("{}{key}{}", Json::from(k.clone()), py_json(x, item, key)))
                .collect();
            format!("{{{}}}", parts.join(item))
        }
        Json::Array(a) => {
            let parts: Vec<String> = a.iter().map(|x| py_json(x, item, key)).collect();
            format!("[{}]", parts.join(item))
        }
        Json::Number(n) if n.is_f64() => py_float(n.as_f64().expect("a float")),
        scalar => scalar.to_string(),
    }
}

fn compact(v: &Json) -> String {
    py_json(v, ",", ":")
}

fn tool_declare(out: &mut Vec<Segment>, tools: &Json) {
    let body = format!(
        "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n{}\n```",
        compact(tools)
    );
    open_tag(
        out,
        "message",
        &[("role", "system".into()), ("type", "tool-declare".into())],
    );
    text(out, &body);
    close_tag(out, "message");
    control(out, END_OF_MSG);
}

/// A call's function object (`call["function"]`, or the call itself).
fn function(call: &Json) -> &Json {
    call.get("function").unwrap_or(call)
}

fn json_type(v: &Json) -> &'static str {
    match v {
        Json::Bool(_) => "boolean",
        Json::Null => "null",
        Json::Number(_) => "number",
        Json::String(_) => "string",
        Json::Object(_) => "object",
        Json::Array(_) => "array",
    }
}

/// A tool call's arguments as `normalize_tool_arguments` reads them.
enum Args<'a> {
    /// An object (given, or parsed from a string).
    Object(std::borrow::Cow<'a, Json>),
    /// A string that is not JSON: rendered in a `json` block as it is.
    Block(&'a str),
    /// None, null or a blank string.
    None,
}

fn arguments(f: &Json) -> Result<Args<'_>> {
    let not_object =
        || EngineError::Template("Kimi K3 tool call arguments must be a JSON object".into());
    match f.get("arguments") {
        None | Some(Json::Null) => Ok(Args::None),
        Some(a @ Json::Object(_)) => Ok(Args::Object(std::borrow::Cow::Borrowed(a))),
        Some(Json::String(s)) if py_strip(s).is_empty() => Ok(Args::None),
        Some(Json::String(s)) => match serde_json::from_str::<Json>(s) {
            Ok(v) if v.is_object() => Ok(Args::Object(std::borrow::Cow::Owned(v))),
            Ok(_) => Err(not_object()),
            Err(_) => Ok(Args::Block(s)),
        },
        Some(_) => Err(not_object()),
    }
}

fn assistant(out: &mut Vec<Segment>, m: &ChatMessage, thinking: bool) -> Result<()> {
    if thinking {
        // coli's messages carry no reasoning: the channel is there, empty.
        open_tag(out, "think", &[]);
        close_tag(out, "think");
    }
    open_tag(out, "response", &[]);
    text(out, &m.content);
    close_tag(out, "response");
    if m.tool_calls.is_empty() {
        return Ok(());
    }
    open_tag(out, "tools", &[]);
    for (i, call) in m.tool_calls.iter().enumerate() {
        let f = function(call);
        let name = f.get("name").and_then(Json::as_str).ok_or_else(|| {
            EngineError::Template(format!("tool call {} has no function name", i + 1))
        })?;
        open_tag(
            out,
            "call",
            &[("tool", name.into()), ("index", (i + 1).to_string())],
        );
        match arguments(f)? {
            Args::Block(b) => {
                open_tag(out, "json", &[("type", "object".into())]);
                text(out, b);
                close_tag(out, "json");
            }
            Args::Object(a) => {
                for (k, v) in a.as_object().into_iter().flatten() {
                    open_tag(
                        out,
                        "argument",
                        &[("key", k.clone()), ("type", json_type(v).into())],
                    );
                    match v {
                        Json::String(s) => text(out, s),
                        other => text(out, &py_json(other, ", ", ": ")),
                    }
                    close_tag(out, "argument");
                }
            }
            Args::None => {}
        }
        close_tag(out, "call");
    }
    close_tag(out, "tools");
    Ok(())
}

/// The tool-result runs of `messages` in the order of the calls they answer, with the name of
/// the call each answers (`normalize_xtml_tool_result_messages`): a run of consecutive tool
/// messages is reordered only when every one's `tool_call_id` names a call of the assistant
/// message before it. Returns the messages, each with its resolved tool name (None: as given).
fn ordered(messages: &[ChatMessage]) -> Vec<(&ChatMessage, Option<String>)> {
    let mut out = Vec::with_capacity(messages.len());
    // call id -> (1-based position, function name), of the last assistant message.
    let mut calls: Vec<(String, usize, Option<String>)> = Vec::new();
    let mut i = 0;
    while i < messages.len() {
        let m = &messages[i];
        if m.role == "assistant" {
            calls.clear();
            for (p, c) in m.tool_calls.iter().enumerate() {
                // `call.get("id")`: an absent or null id is skipped.
                let Some(id) = c.get("id").filter(|v| !v.is_null()).map(|v| match v {
                    Json::String(s) => s.clone(),
                    other => other.to_string(),
                }) else {
                    continue;
                };
                if calls.iter().any(|(x, _, _)| *x == id) {
                    continue;
                }
                let name = function(c)
                    .get("name")
                    .and_then(Json::as_str)
                    .map(str::to_string);
                calls.push((id, p + 1, name));
            }
            out.push((m, None));
            i += 1;
            continue;
        }
        if m.role != "tool" {
            out.push((m, None));
            i += 1;
            continue;
        }
        let start = i;
        while i < messages.len() && messages[i].role == "tool" {
            i += 1;
        }
        let run = &messages[start..i];
        let matched: Option<Vec<(usize, usize, Option<String>)>> = run
            .iter()
            .enumerate()
            .map(|(off, t)| {
                let id = t.tool_call_id.as_deref()?;
                calls
                    .iter()
                    .find(|(x, _, _)| x == id)
                    .map(|(_, p, n)| (*p, off, n.clone()))
            })
            .collect();
        match matched {
            None => out.extend(run.iter().map(|t| (t, None))),
            Some(mut v) => {
                v.sort_by_key(|&(p, off, _)| (p, off));
                out.extend(v.into_iter().map(|(_, off, n)| (&run[off], n)));
            }
        }
    }
    out
}

/// The segments of `messages` (with `tools`, OpenAI-shaped, declared first) as
/// `build_chat_segments(messages, tools, add_generation_prompt=..., thinking=..., **kwargs)`.
///
/// # Errors
/// [`EngineError::Template`]: a thinking effort other than `low`, `high`, `max`; a tool message
/// whose tool cannot be named (no `name`, no call of that index before it); a tool call without
/// a function name or whose arguments are not a JSON object; a role other than system, user,
/// assistant and tool.
pub fn segments(
    messages: &[ChatMessage],
    tools: Option<&[Json]>,
    add_generation_prompt: bool,
    opts: &XtmlOptions,
) -> Result<Vec<Segment>> {
    let mut out = Vec::new();
    if let Some(t) = tools.filter(|t| !t.is_empty()) {
        tool_declare(
            &mut out,
            &coli_format::json_sorted_keys(&Json::Array(t.to_vec())),
        );
    }
    if opts.thinking {
        if let Some(e) = &opts.thinking_effort {
            if !matches!(e.as_str(), "low" | "high" | "max") {
                return Err(EngineError::Template(format!(
                    "Unsupported thinking_effort={e:?}; supported values are high, low, max"
                )));
            }
            system_note(
                &mut out,
                "thinking-effort",
                &format!(
                    "`thinking_effort` guides on how much to think in your thinking channel (not including the response channel), supported values include `low`, `medium`, `high`, and `max`.\nNow the system is invoked with `thinking_effort={e}`."
                ),
            );
        }
    }
    let mut calls: &[Json] = &[];
    let mut tool_index = 0usize;
    for (m, resolved) in ordered(messages) {
        match m.role.as_str() {
            "user" | "system" => {
                let mut attrs = vec![("role", m.role.clone())];
                if let Some(n) = m.name.as_ref().filter(|n| !n.is_empty()) {
                    attrs.push(("name", n.clone()));
                }
                open_tag(&mut out, "message", &attrs);
                text(&mut out, &m.content);
                close_tag(&mut out, "message");
                control(&mut out, END_OF_MSG);
            }
            "tool" => {
                tool_index += 1;
                let name = resolved
                    .or_else(|| m.name.clone())
                    .or_else(|| {
                        calls.get(tool_index - 1).and_then(|c| {
                            function(c)
                                .get("name")
                                .and_then(Json::as_str)
                                .map(str::to_string)
                        })
                    })
                    .ok_or_else(|| {
                        EngineError::Template(
                            "Kimi K3 tool messages need a resolvable tool name: carry `name`, or match a preceding assistant tool_call by order".into(),
                        )
                    })?;
                open_tag(
                    &mut out,
                    "message",
                    &[
                        ("role", "tool".into()),
                        ("tool", name),
                        ("index", tool_index.to_string()),
                    ],
                );
                text(&mut out, &m.content);
                close_tag(&mut out, "message");
                control(&mut out, END_OF_MSG);
            }
            "assistant" => {
                calls = &m.tool_calls;
                tool_index = 0;
                let mut attrs = vec![("role", "assistant".to_string())];
                if let Some(n) = m.name.as_ref().filter(|n| !n.is_empty()) {
                    attrs.push(("name", n.clone()));
                }
                open_tag(&mut out, "message", &attrs);
                assistant(&mut out, m, opts.thinking)?;
                close_tag(&mut out, "message");
                control(&mut out, END_OF_MSG);
            }
            other => {
                return Err(EngineError::Template(format!(
                    "a message of role {other:?}: Kimi K3's format has system, user, assistant and tool messages"
                )))
            }
        }
    }
    match opts.tool_choice.as_deref() {
        Some("required") => system_note(
            &mut out,
            "tool-choice",
            "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message.",
        ),
        Some("none") => system_note(
            &mut out,
            "tool-choice",
            "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any tools in the next message.",
        ),
        _ => {}
    }
    if let Some(rf) = &opts.response_format {
        let kind = rf.get("type").unwrap_or(rf).as_str();
        match kind {
            Some("json_object") => system_note(
                &mut out,
                "response-format",
                "The system is invoked with `response_format=json_object`.\nYour response must be raw JSON data without markdown code blocks (```json) or any additional formatting.",
            ),
            Some("json_schema") => {
                // `extract_response_schema`: json_schema.schema, else json_schema.json_schema,
                // else json_schema itself.
                let js = rf.get("json_schema").unwrap_or(&Json::Null);
                let schema = js
                    .get("schema")
                    .or_else(|| js.get("json_schema"))
                    .unwrap_or(js);
                system_note(
                    &mut out,
                    "response-format",
                    &format!(
                        "The system is invoked with `response_format=json_schema`.\nYour response must be raw JSON data without markdown code blocks (```json) or any additional formatting.\nThe JSON data must match the following schema:\n```json\n{}\n```",
                        compact(&coli_format::json_sorted_keys(schema))
                    ),
                );
            }
            _ => {}
        }
    }
    if add_generation_prompt {
        open_tag(&mut out, "message", &[("role", "assistant".into())]);
        open_tag(
            &mut out,
            if opts.thinking { "think" } else { "response" },
            &[],
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_python_repr() {
        // Python 3.11: repr(x) for each x (checked with python3).
        for (x, py) in [
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (1e20, "1e+20"),
            (1e15, "1000000000000000.0"),
            (123.0, "123.0"),
            (2.5, "2.5"),
            (0.1, "0.1"),
            (1e-4, "0.0001"),
            (1.5e-4, "0.00015"),
            (1e-5, "1e-05"),
            (1e-6, "1e-06"),
            (-2.5e-7, "-2.5e-07"),
            (1.2345678901234567e-300, "1.2345678901234568e-300"),
            (-0.0, "-0.0"),
            (0.0, "0.0"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
        ] {
            assert_eq!(py_float(x), py, "{x:e}");
        }
        let v: Json = serde_json::from_str(r#"{"a": [1, 2.0, 1e-06, "x"], "b": null}"#).unwrap();
        assert_eq!(
            py_json(&v, ", ", ": "),
            r#"{"a": [1, 2.0, 1e-06, "x"], "b": null}"#
        );
        assert_eq!(compact(&v), r#"{"a":[1,2.0,1e-06,"x"],"b":null}"#);
    }

    #[test]
    fn strip_as_python() {
        assert_eq!(py_strip("\u{1c} a \u{1f}\n"), "a");
        assert_eq!(py_strip("\u{a0}b\u{2003}"), "b");
    }
}
