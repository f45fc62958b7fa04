//! One block of calls in each syntax ([`super::ToolSyntax`]) to structured calls.

use super::{ParsedCall, ToolSyntax, DSML};
use serde_json::{Map, Value as Json};
use std::collections::HashMap;

/// Which parameters of which tools the schemas type `string` (their XML values stay text).
#[derive(Clone, Debug, Default)]
pub struct ParamTypes {
    /// tool name -> parameter name -> whether its schema's `type` is `"string"`.
    types: HashMap<String, HashMap<String, bool>>,
}

impl ParamTypes {
    /// From OpenAI-shaped tools (`{"type": "function", "function": {"name", "parameters"}}`).
    pub fn from_tools(tools: &[Json]) -> ParamTypes {
        let mut types = HashMap::new();
        for t in tools {
            let f = t.get("function").unwrap_or(t);
            let Some(name) = f.get("name").and_then(Json::as_str) else {
                continue;
            };
            let props = f
                .get("parameters")
                .and_then(|p| p.get("properties"))
                .and_then(Json::as_object);
            let params = props
                .map(|p| {
                    p.iter()
                        .map(|(k, v)| {
                            (
                                k.clone(),
                                v.get("type").and_then(Json::as_str) == Some("string"),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            types.insert(name.to_string(), params);
        }
        ParamTypes { types }
    }

    fn is_string(&self, tool: &str, param: &str) -> Option<bool> {
        self.types.get(tool)?.get(param).copied()
    }
}

/// An XML value as JSON: text when the schema (or `forced`) says string, else JSON when it
/// parses, else text.
fn xml_value(types: &ParamTypes, tool: &str, key: &str, raw: &str, forced: Option<bool>) -> Json {
    let string = forced.or_else(|| types.is_string(tool, key));
    if string == Some(true) {
        return Json::String(raw.to_string());
    }
    serde_json::from_str::<Json>(raw).unwrap_or_else(|_| Json::String(raw.to_string()))
}

/// `text` between `open` and `close` after `from`: (inner, offset after close).
fn between<'a>(text: &'a str, from: usize, open: &str, close: &str) -> Option<(&'a str, usize)> {
    let s = from + text[from..].find(open)? + open.len();
    let e = s + text[s..].find(close)?;
    Some((&text[s..e], e + close.len()))
}

/// A JSON object's text, or None.
fn object_text(v: &Json) -> Option<String> {
    v.is_object().then(|| v.to_string())
}

/// Arguments given as JSON text (an object), compact.
fn json_args(raw: &str) -> Option<String> {
    object_text(&serde_json::from_str::<Json>(raw.trim()).ok()?)
}

/// The calls of one block (`block` from its opening marker through its closing one); None
/// when it does not parse (the caller passes it through as text).
pub fn parse_section(
    syntax: ToolSyntax,
    block: &str,
    types: &ParamTypes,
) -> Option<Vec<ParsedCall>> {
    let open = syntax.open();
    let close = syntax.close();
    let body = block
        .strip_prefix(open.as_str())?
        .strip_suffix(close.as_str())?;
    match syntax {
        ToolSyntax::Hermes => hermes(body).map(|c| vec![c]),
        ToolSyntax::QwenXml => qwen_xml(body, types),
        ToolSyntax::Glm => glm(body, types).map(|c| vec![c]),
        ToolSyntax::DeepSeek => token_calls(
            body,
            "<｜tool▁call▁begin｜>",
            "<｜tool▁sep｜>",
            "<｜tool▁call▁end｜>",
            |n| Some(n.trim().to_string()),
        ),
        ToolSyntax::Kimi => token_calls(
            body,
            "<|tool_call_begin|>",
            "<|tool_call_argument_begin|>",
            "<|tool_call_end|>",
            kimi_name,
        ),
        ToolSyntax::MiniMax => invokes(body, "", types),
        ToolSyntax::Dsml | ToolSyntax::DsmlV4 => invokes(body, DSML, types),
        // Harmony calls are routed by token (crate::harmony), not parsed from text.
        ToolSyntax::Harmony => None,
    }
}

/// `{"name": N, "arguments": {..}}` (arguments may also come as a JSON string or under
/// `parameters`).
fn hermes(body: &str) -> Option<ParsedCall> {
    let v: Json = serde_json::from_str(body.trim()).ok()?;
    let name = v.get("name")?.as_str()?.to_string();
    let args = match v.get("arguments").or_else(|| v.get("parameters")) {
        None | Some(Json::Null) => "{}".to_string(),
        Some(Json::String(s)) => json_args(s)?,
        Some(a) => object_text(a)?,
    };
    valid_name(&name).then_some(ParsedCall {
        name,
        arguments: args,
    })
}

/// A function name a call may carry: non-empty, no whitespace or markup.
fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 256
        && !n.contains(|c: char| c.is_whitespace() || c == '<' || c == '>')
}

/// One leading and one trailing newline of an XML value dropped (the templates put the value
/// on its own line).
fn strip_nl(s: &str) -> &str {
    let s = s.strip_prefix('\n').unwrap_or(s);
    s.strip_suffix('\n').unwrap_or(s)
}

/// `<function=N>` blocks of `<parameter=K>\nV\n</parameter>`.
fn qwen_xml(body: &str, types: &ParamTypes) -> Option<Vec<ParsedCall>> {
    let mut calls = Vec::new();
    let mut at = 0;
    while let Some(i) = body[at..].find("<function=") {
        let s = at + i + "<function=".len();
        let e = s + body[s..].find('>')?;
        let name = body[s..e].trim().to_string();
        let end = e + body[e..].find("</function>")?;
        let inner = &body[e + 1..end];
        let mut args = Map::new();
        let mut p = 0;
        while let Some(j) = inner[p..].find("<parameter=") {
            let ks = p + j + "<parameter=".len();
            let ke = ks + inner[ks..].find('>')?;
            let key = inner[ks..ke].trim().to_string();
            let ve = ke + inner[ke..].find("</parameter>")?;
            let raw = strip_nl(&inner[ke + 1..ve]);
            args.insert(key.clone(), xml_value(types, &name, &key, raw, None));
            p = ve + "</parameter>".len();
        }
        if !valid_name(&name) {
            return None;
        }
        calls.push(ParsedCall {
            name,
            arguments: Json::Object(args).to_string(),
        });
        at = end + "</function>".len();
    }
    (!calls.is_empty() && body[at..].trim().is_empty()).then_some(calls)
}

/// `N\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>...`.
fn glm(body: &str, types: &ParamTypes) -> Option<ParsedCall> {
    let name_end = body.find("<arg_key>").unwrap_or(body.len());
    let name = body[..name_end].trim().to_string();
    if !valid_name(&name) {
        return None;
    }
    let mut args = Map::new();
    let mut at = name_end;
    while let Some((key, after)) = between(body, at, "<arg_key>", "</arg_key>") {
        let (raw, next) = between(body, after, "<arg_value>", "</arg_value>")?;
        if !body[after..next].trim_start().starts_with("<arg_value>") {
            return None;
        }
        let key = key.trim().to_string();
        args.insert(key.clone(), xml_value(types, &name, &key, raw, None));
        at = next;
    }
    body[at..].trim().is_empty().then(|| ParsedCall {
        name,
        arguments: Json::Object(args).to_string(),
    })
}

/// Kimi-K2's call id `functions.N:I` to the name N.
fn kimi_name(id: &str) -> Option<String> {
    let id = id.trim();
    let id = id.strip_prefix("functions.").unwrap_or(id);
    let name = match id.rfind(':') {
        Some(c) if id[c + 1..].chars().all(|ch| ch.is_ascii_digit()) => &id[..c],
        _ => id,
    };
    Some(name.to_string())
}

/// Calls delimited by tokens: `begin NAME sep ARGS end`, repeated (DeepSeek-V3.1, Kimi-K2).
fn token_calls(
    body: &str,
    begin: &str,
    sep: &str,
    end: &str,
    name_of: fn(&str) -> Option<String>,
) -> Option<Vec<ParsedCall>> {
    let mut calls = Vec::new();
    let mut at = 0;
    loop {
        let rest = &body[at..];
        if rest.trim().is_empty() {
            break;
        }
        let s = rest.find(begin)?;
        if !rest[..s].trim().is_empty() {
            return None;
        }
        let (head, after) = between(body, at, begin, end)?;
        let (name, args) = head.split_once(sep)?;
        let name = name_of(name)?;
        if !valid_name(&name) {
            return None;
        }
        calls.push(ParsedCall {
            name,
            arguments: json_args(args)?,
        });
        at = after;
    }
    (!calls.is_empty()).then_some(calls)
}

/// `<PinvokeNAME name="N">` blocks of `<Pparameter name="K"[ string="..."]>V</Pparameter>`
/// (MiniMax-M2 with no prefix, DeepSeek-V3.2's DSML with `｜DSML｜`).
fn invokes(body: &str, prefix: &str, types: &ParamTypes) -> Option<Vec<ParsedCall>> {
    let inv_open = format!("<{prefix}invoke name=\"");
    let inv_close = format!("</{prefix}invoke>");
    let par_open = format!("<{prefix}parameter name=\"");
    let par_close = format!("</{prefix}parameter>");
    let mut calls = Vec::new();
    let mut at = 0;
    loop {
        let rest = &body[at..];
        let Some(i) = rest.find(&inv_open) else {
            if !rest.trim().is_empty() {
                return None;
            }
            break;
        };
        if !rest[..i].trim().is_empty() {
            return None;
        }
        let ns = at + i + inv_open.len();
        let ne = ns + body[ns..].find("\">")?;
        let name = body[ns..ne].to_string();
        if !valid_name(&name) {
            return None;
        }
        let end = ne + body[ne..].find(&inv_close)?;
        let inner = &body[ne + 2..end];
        let mut args = Map::new();
        let mut p = 0;
        while let Some(j) = inner[p..].find(&par_open) {
            let ks = p + j + par_open.len();
            let ke = ks + inner[ks..].find('"')?;
            let key = inner[ks..ke].to_string();
            let te = ke + inner[ke..].find('>')?;
            let attrs = &inner[ke + 1..te];
            let forced = if attrs.contains("string=\"true\"") {
                Some(true)
            } else if attrs.contains("string=\"false\"") {
                Some(false)
            } else {
                None
            };
            let ve = te + inner[te..].find(&par_close)?;
            let raw = &inner[te + 1..ve];
            let raw = if prefix.is_empty() {
                strip_nl(raw)
            } else {
                raw
            };
            args.insert(key.clone(), xml_value(types, &name, &key, raw, forced));
            p = ve + par_close.len();
        }
        if !inner[p..].trim().is_empty() {
            return None;
        }
        calls.push(ParsedCall {
            name,
            arguments: Json::Object(args).to_string(),
        });
        at = end + inv_close.len();
    }
    (!calls.is_empty()).then_some(calls)
}
